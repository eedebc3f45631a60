//! `cargo xtask`: the project's command line.
//!
//! - `bench`: the main job, a full benchmark report (also under `mpirun`).
//! - `calibrate`: fit α, β, γ on this machine or cluster and save a calibration JSON.
//! - `plan`: print a merge plan for a layer profile.
//! - `simulate`: every planner side by side for a profile, with Gantt charts.
//! - `train`: data-parallel training of a built-in model with a chosen scheme.
//! - `ci`: formatting, lints, tests, and the MPI tests under `mpirun`.
//! - `fuzz`: run the decoders' fuzz targets for a while each.

use clap::{Parser, Subcommand};

mod bench;
mod calibrate;
mod ci;
mod fuzz;
mod launcher;
mod plan;
mod simulate;
mod train;

/// The error every subcommand returns: a message for the user.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Sparse data-parallel training toolkit: bench, calibrate, plan, simulate, train, ci"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the benchmark suites and write report.json, report.md and plots.
    Bench(bench::Args),
    /// Measure α, β (and γ for top-k) on this machine or cluster and save a calibration.
    Calibrate(calibrate::Args),
    /// Print the merge plan of a layer profile as JSON.
    Plan(plan::Args),
    /// Compare every planner on a profile, with Gantt charts.
    Simulate(simulate::Args),
    /// Train a built-in model data-parallel with a chosen scheme.
    Train(Box<train::Args>),
    /// Format check, clippy, tests, and MPI tests under mpirun.
    Ci(ci::Args),
    /// Run the fuzz targets of the wire decoders and JSON readers for a while each.
    Fuzz(fuzz::Args),
    /// Print `yes` or `no`: whether this host lets a process read another's memory
    /// (cross-memory attach, which Open MPI's single copy needs). The probe that `bench
    /// --mpi` runs before it starts mpirun, for scripts that start mpirun themselves
    /// (`scripts/cpu_host_run.sh`).
    #[command(hide = true)]
    CrossMemoryAttach,
}

fn main() {
    // First, while this is the only thread: an MPI rank takes its share of the node's cores
    // (sets `RAYON_NUM_THREADS` unless the user did).
    collectives::comm::launcher::share_cores_among_ranks();
    let cli = Cli::parse();
    let launcher = collectives::comm::launcher::mpi_launcher();
    // Under an MPI launcher only the subcommands that join the MPI world may run; the
    // others would run once per rank, each writing the same outputs.
    if let Some(launcher) = &launcher {
        let joins = match &cli.command {
            Command::Bench(_) => true,
            Command::Calibrate(a) => a.mpi,
            Command::Train(a) => a.mpi || a.mpi_child,
            _ => false,
        };
        if !joins {
            eprintln!(
                "error: {}",
                launcher::refuse_under_launcher("this xtask subcommand", launcher.clone())
            );
            std::process::exit(2);
        }
    }
    // In an MPI rank this thread runs the selectors, the model and the training loop: as a
    // worker of the global pool it starts each parallel pass itself instead of waking a
    // worker for it. Without MPI the ranks are threads of their own, which the joined
    // thread would not help (`sparsify::join_global_pool`), so the pool stays as it is.
    // Its size is `RAYON_NUM_THREADS`: the rank's share of the cores, or the user's choice.
    if launcher.is_some() {
        if let Err(e) = sparsify::join_global_pool(None) {
            eprintln!("warning: {e}");
        }
    }
    let result = match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Train(a) => train::run(*a),
        Command::Ci(a) => ci::run(a),
        Command::Fuzz(a) => fuzz::run(a),
        Command::CrossMemoryAttach => {
            let yes = collectives::comm::peer_memory::can_read_other_processes();
            println!("{}", if yes { "yes" } else { "no" });
            Ok(())
        }
    };
    if let Err(e) = result {
        // A subcommand that failed while MPI still runs ends the whole job: exiting this
        // rank alone would leave the others waiting for it.
        #[cfg(feature = "mpi")]
        collectives::comm::mpi::abort_if_running(&e, 1);
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
