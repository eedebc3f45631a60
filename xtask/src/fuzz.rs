//! `cargo xtask fuzz`: builds the fuzz targets in `fuzz/` (one per wire decoder and JSON
//! reader, all calling the harness that `integration-tests/tests/decoders_fuzz.rs` runs as
//! proptest properties) with libFuzzer's coverage instrumentation, and runs each for
//! `--seconds` from its checked-in seeds. Works on a stable toolchain: it passes the
//! instrumentation flags that `cargo fuzz run -s none` would, so cargo-fuzz is optional.
//!
//! A crash stops the run with the input saved under `fuzz/artifacts/TARGET/`; once fixed,
//! copy it to `fuzz/regressions/TARGET/`, which `cargo test` replays.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::CliResult;

/// Every fuzz target: the `[[bin]]` names of `fuzz/Cargo.toml`, which is their one list
/// (that crate is outside the workspace, so it is read as text).
fn fuzz_targets(fuzz: &Path) -> Result<Vec<String>, String> {
    let manifest = fuzz.join("Cargo.toml");
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let mut targets = Vec::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if let Some(name) = line.strip_prefix("name = ").filter(|_| in_bin) {
            targets.push(name.trim_matches('"').to_string());
        }
    }
    if targets.is_empty() {
        return Err(format!("no [[bin]] targets in {}", manifest.display()));
    }
    Ok(targets)
}

/// libFuzzer's instrumentation, as cargo-fuzz sets it without a sanitizer, plus the debug
/// assertions and overflow checks that turn silent wrong answers into crashes.
const RUSTFLAGS: &str = "-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing -Cdebug-assertions -Coverflow-checks";

/// Options of `cargo xtask fuzz`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Targets to run (default: all): sparse_grad, dense_wire, sparse_wire, sim_header,
    /// pto_trailer, profile_json, calibration_json.
    #[arg(long = "target", num_args = 1..)]
    targets: Vec<String>,
    /// Memory limit of one fuzzing process, in MiB (libFuzzer's `-rss_limit_mb`).
    #[arg(long, default_value_t = 2048)]
    rss_limit_mb: u64,
}

/// Runs `cargo xtask fuzz`.
pub fn run(args: Args) -> CliResult {
    if args.seconds == 0 {
        return Err("--seconds must be at least 1".into());
    }
    let fuzz = crate::ci::workspace_root().join("fuzz");
    let known = fuzz_targets(&fuzz)?;
    for t in &args.targets {
        if !known.contains(t) {
            return Err(format!("unknown fuzz target {t:?}; known: {}", known.join(", ")).into());
        }
    }
    let targets: Vec<&str> = if args.targets.is_empty() {
        known.iter().map(String::as_str).collect()
    } else {
        args.targets.iter().map(String::as_str).collect()
    };
    let host = host_triple()?;
    eprintln!("building the fuzz targets with coverage instrumentation ...");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "--bins",
            "--target",
            &host,
            "--target-dir",
        ])
        .arg(fuzz.join("target"))
        .current_dir(&fuzz)
        .env("RUSTFLAGS", RUSTFLAGS)
        .status()?;
    if !status.success() {
        return Err("building the fuzz targets failed".into());
    }
    for t in targets {
        run_target(&fuzz, &host, t, &args)?;
    }
    Ok(())
}

/// Runs one target for `args.seconds` from its corpus and seeds.
fn run_target(fuzz: &Path, host: &str, target: &str, args: &Args) -> CliResult {
    let exe = fuzz.join("target").join(host).join("release").join(target);
    let corpus = fuzz.join("corpus").join(target);
    let seeds = fuzz.join("seeds").join(target);
    let artifacts = fuzz.join("artifacts").join(target);
    std::fs::create_dir_all(&corpus)?;
    std::fs::create_dir_all(&artifacts)?;
    println!("== fuzz {target} for {} s", args.seconds);
    let start = Instant::now();
    let mut cmd = Command::new(&exe);
    cmd.arg(&corpus);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    let status = cmd
        .arg(format!("-max_total_time={}", args.seconds))
        .arg(format!("-rss_limit_mb={}", args.rss_limit_mb))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .status()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    if status.success() {
        println!(
            "== fuzz {target}: no crash in {:.0} s",
            start.elapsed().as_secs_f64()
        );
        Ok(())
    } else {
        Err(format!(
            "fuzz {target} found a crash ({status}); the input is in {}",
            artifacts.display()
        )
        .into())
    }
}

/// The host's target triple, from `rustc -vV`.
fn host_triple() -> Result<String, Box<dyn std::error::Error>> {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or_else(|| "cannot find the host triple in `rustc -vV`".into())
}
