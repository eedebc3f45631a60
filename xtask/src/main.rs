//! `cargo xtask`: the project's command line.
fn main() {}
