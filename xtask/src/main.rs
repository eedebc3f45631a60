//! `cargo xtask`: the project's command line.
//!
//! - `bench`: the main job, a full benchmark report (also under `mpirun`).
//! - `calibrate`: fit α, β, γ on this machine or cluster and save a calibration JSON.
//! - `plan`: print a merge plan for a layer profile.
//! - `simulate`: every planner side by side for a profile, with Gantt charts.
//! - `train`: data-parallel training of a built-in model with a chosen scheme.
//! - `ci`: formatting, lints, tests, and the MPI tests under `mpirun`.

use clap::{Parser, Subcommand};

mod bench;
mod calibrate;
mod ci;
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
    Train(train::Args),
    /// Format check, clippy, tests, and MPI tests under mpirun.
    Ci(ci::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Train(a) => train::run(a),
        Command::Ci(a) => ci::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
