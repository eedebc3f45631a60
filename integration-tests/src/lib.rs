//! End-to-end tests across the workspace crates live in `tests/`; this library holds the
//! helpers they share.
#![deny(missing_docs)]
