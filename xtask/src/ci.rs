//! `cargo xtask ci`.

use crate::CliResult;

/// Options of `cargo xtask ci`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `cargo xtask ci`.
pub fn run(_args: Args) -> CliResult {
    Err("`cargo xtask ci` is not implemented yet".into())
}
