//! `cargo xtask plan`.

use crate::CliResult;

/// Options of `cargo xtask plan`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `cargo xtask plan`.
pub fn run(_args: Args) -> CliResult {
    Err("`cargo xtask plan` is not implemented yet".into())
}
