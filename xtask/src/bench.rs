//! `cargo xtask bench`.

use crate::CliResult;

/// Options of `cargo xtask bench`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `cargo xtask bench`.
pub fn run(_args: Args) -> CliResult {
    Err("`cargo xtask bench` is not implemented yet".into())
}
