//! What the MPI test binaries share: starting the world, a check that is an error instead
//! of a panic (so every rank reports), and the `ok:` / `FAILED:` report lines that
//! `cargo xtask ci` reads.
#![allow(dead_code)]

use collectives::{Communicator, Error, MpiComm, Result};

/// The MPI world; exits with status 2 when MPI cannot start.
pub fn world() -> MpiComm {
    MpiComm::world().unwrap_or_else(|e| {
        eprintln!("cannot start MPI: {e}");
        std::process::exit(2);
    })
}

/// `Ok` when `ok`, else an error naming `what`.
pub fn check(ok: bool, what: impl std::fmt::Display) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("check failed: {what}")))
    }
}

/// A reporter for this rank: on rank 0 a passed check prints `ok: <binary> P=<p> <name>`;
/// a failed one prints `FAILED:` with the rank and ends the process with status 1.
pub fn reporter(binary: &'static str, comm: &dyn Communicator) -> impl Fn(&str, Result<()>) {
    let (p, rank) = (comm.size(), comm.rank());
    move |name, r| match r {
        Ok(()) => {
            if rank == 0 {
                println!("ok: {binary} P={p} {name}");
            }
        }
        Err(e) => {
            eprintln!("FAILED: {binary} P={p} rank {rank} {name}: {e}");
            std::process::exit(1);
        }
    }
}
