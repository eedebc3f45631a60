//! `cargo xtask calibrate`.

use crate::CliResult;

/// Options of `cargo xtask calibrate`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `cargo xtask calibrate`.
pub fn run(_args: Args) -> CliResult {
    Err("`cargo xtask calibrate` is not implemented yet".into())
}
