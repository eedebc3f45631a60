//! `cargo bench -p datacache --features bench --bench epochs`: 96×96 PNG images served over
//! loopback HTTP through `object_store`, read uncached, through the cache in epochs 1 and 2,
//! by a new run over the warm disk, from the local-file store, from an emulated NFS, and end
//! to end with a simulated compute step. Prints a Markdown table and the paper's claims
//! (MSTopK/HiTopKComm, Shi et al., MLSys 2021, §5.4, Fig. 9) beside ours.
//!
//! Options (after `--`): `--samples N`, `--json PATH`.

use datacache::bench_support::{run, BenchConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut cfg = BenchConfig::default();
    let mut json = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--samples" => {
                if let Some(n) = args.get(i + 1).and_then(|s| s.parse().ok()) {
                    cfg.samples = n;
                    i += 1;
                }
            }
            "--json" => {
                json = args.get(i + 1).cloned();
                i += 1;
            }
            _ => {} // `cargo bench` passes `--bench`; ignore what we do not know
        }
        i += 1;
    }
    eprintln!("config: {cfg:?}");
    let report = match run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::exit(1);
        }
    };
    println!("{}", report.table());
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("cannot write {path}: {e}");
        }
    }
}
