//! The command line's answer to a process that an MPI launcher started: which subcommands
//! may run there (the launcher's variables and each rank's share of the cores are
//! [`collectives::comm::launcher`]'s).

/// Why a process started by an MPI launcher refuses to run `what`.
pub fn refuse_under_launcher(what: &str, (var, value): (&str, String)) -> String {
    format!(
        "`{what}` was started by an MPI launcher ({var}={value}), where every rank would run \
         it independently and write the same outputs. Use `cargo xtask bench --mpi -n P`, \
         `cargo xtask train --mpi -n P` or `cargo xtask calibrate --mpi` (built with \
         `--features mpi`) for MPI runs, and run everything else without mpirun."
    )
}
