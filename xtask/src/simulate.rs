//! `cargo xtask simulate`.

use crate::CliResult;

/// Options of `cargo xtask simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `cargo xtask simulate`.
pub fn run(_args: Args) -> CliResult {
    Err("`cargo xtask simulate` is not implemented yet".into())
}
