//! `cargo xtask train`.

use crate::CliResult;

/// Options of `cargo xtask train`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `cargo xtask train`.
pub fn run(_args: Args) -> CliResult {
    Err("`cargo xtask train` is not implemented yet".into())
}
