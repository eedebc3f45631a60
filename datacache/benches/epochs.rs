//! `cargo bench -p datacache --bench epochs`: a throttled "NFS" source (50 MB/s, 2 ms per
//! request) of generated samples with a decode cost, read uncached, through the cache in
//! epochs 1 and 2, by a new run over the warm disk, and with a simulated compute step with and
//! without prefetching. Prints a Markdown table and checks the paper's claims (§4.1, Fig. 9:
//! I/O time reduced more than 10×; reading overlapped with compute).
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
    let checks = [
        ("epoch 2 ≥ 10× epoch 1", report.epoch2_over_epoch1 >= 10.0),
        (
            "epoch 2 ≥ 10× uncached",
            report.epoch2_over_uncached >= 10.0,
        ),
        (
            "prefetch overlaps ≥ 70% of reading with compute",
            report.prefetch_overlap >= 0.7,
        ),
    ];
    for (name, ok) in checks {
        println!("{}: {name}", if ok { "ok" } else { "FAILED" });
    }
}
