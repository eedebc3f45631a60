//! Fuzz target `sparse_wire`: see `fuzz_harness::run`.
#![no_main]

#[allow(dead_code)] // each target uses one entry point of the shared harness
#[path = "../../integration-tests/tests/fuzz_harness/mod.rs"]
mod fuzz_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fuzz_harness::run("sparse_wire", data);
});
