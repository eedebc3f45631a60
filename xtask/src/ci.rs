//! `cargo xtask ci`: everything CI checks, in the order a developer wants to see failures.
//!
//! 1. `cargo fmt --all -- --check`
//! 2. `cargo clippy --workspace --all-targets -- -D warnings`, then the same once more for
//!    `sparsify` and `collectives` with their `cuda`, `nccl` and `mpi` features on (GPU code
//!    must build without a GPU)
//! 3. `cargo test --workspace`, then the `cuda` tests of `sparsify` (NVRTC compiles the
//!    kernels where libnvrtc is found; the GPU bodies skip without a device)
//! 4. when `mpirun` is on the PATH: every `mpi_*` test binary built with `--features mpi`,
//!    run under `mpirun -n P --allow-run-as-root --oversubscribe` for P in {1, 2, 3, 4, 6},
//!    and `mpi_sparse` once more on 2 emulated nodes × 2 ranks;
//!    then `mpi_faults`, which starts its own short mpirun jobs (one rank exits, is killed
//!    or stops mid-collective at P = 3 and 4) and checks that each ends within the receive
//!    timeout plus 10 s with a typed error on every survivor.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::CliResult;

/// Options of `cargo xtask ci`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Skip the formatting check.
    #[arg(long)]
    skip_fmt: bool,
    /// Skip clippy.
    #[arg(long)]
    skip_clippy: bool,
    /// Skip `cargo test --workspace`.
    #[arg(long)]
    skip_tests: bool,
    /// Skip the MPI tests even when mpirun is present.
    #[arg(long)]
    skip_mpi: bool,
    /// Rank counts for the MPI tests.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,6")]
    ranks: Vec<usize>,
    /// Seconds one mpirun may take before it is killed and counted as a failure.
    #[arg(long, default_value_t = 300)]
    mpi_timeout_s: u64,
}

/// Packages with an `mpi` feature whose `mpi_*` test binaries run under mpirun.
const MPI_PACKAGES: &[&str] = &["collectives"];

/// The packages linted with their optional features on (their GPU features, and
/// [`MPI_FEATURES`] where mpirun exists).
const FEATURE_PACKAGES: &[&str] = &["sparsify", "collectives"];

/// The MPI features linted where mpirun exists.
const MPI_FEATURES: &[&str] = &["collectives/mpi"];

/// The MPI test binary that also runs on two emulated nodes (HiTopKComm's node structure).
const NODES_TEST: &str = "mpi_sparse";

/// The MPI test binary that launches its own mpirun jobs (fault injection) instead of
/// being run under one.
const MPI_FAULTS: &str = "mpi_faults";

/// Rank counts and receive timeout (seconds) of the fault jobs.
const FAULT_RANKS: &str = "3,4";
const FAULT_TIMEOUT_S: &str = "5";

/// Runs `cargo xtask ci`.
pub fn run(args: Args) -> CliResult {
    let root = workspace_root();
    let start = Instant::now();
    if !args.skip_fmt {
        step("cargo fmt --all -- --check", || {
            cargo(&root, &["fmt", "--all", "--", "--check"])
        })?;
    }
    if !args.skip_clippy {
        // (label, what to lint): the workspace, then the crates with optional features,
        // all of them on at once (the GPU code must build without a GPU; the MPI feature
        // where mpirun exists). One run instead of one per feature: each run checked the
        // crates and their dependencies again (2 min 39 s in three runs on the 2-core VM,
        // 1 min 45 s in one).
        let mut features = vec!["sparsify/cuda", "collectives/nccl"];
        if mpirun().is_some() {
            features.extend(MPI_FEATURES);
        }
        let features = features.join(",");
        let mut feature_lint = vec!["--features", &features];
        for pkg in FEATURE_PACKAGES {
            feature_lint.extend(["-p", pkg]);
        }
        let lints: Vec<(String, Vec<&str>)> = vec![
            ("clippy (default features)".into(), vec!["--workspace"]),
            (
                format!("clippy ({features}: GPU code builds without a GPU)"),
                feature_lint,
            ),
        ];
        for (label, target) in lints {
            let mut a = vec!["clippy"];
            a.extend(target);
            a.extend(["--all-targets", "--", "-D", "warnings"]);
            step(&label, || cargo(&root, &a))?;
        }
    }
    if !args.skip_tests {
        step("cargo test --workspace", || {
            cargo(&root, &["test", "--workspace"])
        })?;
        // The CUDA tests: the kernels compile with NVRTC when libnvrtc is found (no GPU
        // needed), and the GPU bodies run when a device is present; otherwise they skip.
        step("sparsify CUDA tests (skip without NVRTC / GPU)", || {
            cargo(
                &root,
                &[
                    "test",
                    "-p",
                    "sparsify",
                    "--features",
                    "cuda",
                    "--lib",
                    "cuda",
                    "--",
                    "--nocapture",
                ],
            )
        })?;
    }
    if args.skip_mpi {
        println!("== MPI tests skipped (--skip-mpi)");
    } else if let Some(mpirun) = mpirun() {
        run_mpi_tests(&root, &mpirun, &args)?;
    } else {
        println!(
            "== MPI tests skipped: `mpirun` is not on the PATH. Install Open MPI to run them \
             (Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin libclang-dev)."
        );
    }
    println!("== ci passed in {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}

fn run_mpi_tests(root: &Path, mpirun: &Path, args: &Args) -> CliResult {
    for pkg in MPI_PACKAGES {
        let binaries = build_mpi_tests(root, pkg)?;
        if binaries.is_empty() {
            return Err(format!("no mpi_* test binaries found in {pkg}").into());
        }
        for (name, exe) in binaries.iter().filter(|(n, _)| n != MPI_FAULTS) {
            let mut jobs: Vec<(usize, Option<usize>)> =
                args.ranks.iter().map(|&p| (p, None)).collect();
            if name == NODES_TEST {
                // Two emulated nodes of two ranks: the hierarchical algorithms on the node
                // structure MPI reports (COLLECTIVES_RANKS_PER_NODE).
                jobs.push((4, Some(2)));
            }
            for (p, ranks_per_node) in jobs {
                let label = match ranks_per_node {
                    Some(n) => format!("mpirun -n {p} {name} ({} nodes × {n})", p / n),
                    None => format!("mpirun -n {p} {name}"),
                };
                println!("== {label}");
                let mut cmd = Command::new(mpirun);
                cmd.args([
                    "--allow-run-as-root",
                    "--oversubscribe",
                    "-n",
                    &p.to_string(),
                ]);
                cmd.args(mpi_mca_args());
                if let Some(n) = ranks_per_node {
                    cmd.args(["-x", &format!("COLLECTIVES_RANKS_PER_NODE={n}")]);
                }
                cmd.arg(exe).current_dir(root);
                let t = Instant::now();
                let status = run_with_timeout(cmd, Duration::from_secs(args.mpi_timeout_s))?;
                match status {
                    Some(s) if s.success() => {
                        println!("== {label}: passed in {:.1} s", t.elapsed().as_secs_f64())
                    }
                    Some(s) => return Err(format!("{label} failed ({s})").into()),
                    None => {
                        return Err(
                            format!("{label} timed out after {} s", args.mpi_timeout_s).into()
                        )
                    }
                }
            }
        }
        if let Some((_, exe)) = binaries.iter().find(|(n, _)| n == MPI_FAULTS) {
            run_fault_jobs(root, exe, args)?;
        }
    }
    Ok(())
}

/// Runs the fault-injection driver, which starts and times its own mpirun jobs.
fn run_fault_jobs(root: &Path, exe: &Path, args: &Args) -> CliResult {
    let label = format!("{MPI_FAULTS} (P = {FAULT_RANKS}, timeout {FAULT_TIMEOUT_S} s)");
    println!("== {label}");
    let mut cmd = Command::new(exe);
    cmd.args(["--ranks", FAULT_RANKS, "--timeout-s", FAULT_TIMEOUT_S])
        .current_dir(root);
    let t = Instant::now();
    match run_with_timeout(cmd, Duration::from_secs(args.mpi_timeout_s))? {
        Some(s) if s.success() => {
            println!("== {label}: passed in {:.1} s", t.elapsed().as_secs_f64());
            Ok(())
        }
        Some(s) => Err(format!("{label} failed ({s})").into()),
        None => Err(format!("{label} timed out after {} s", args.mpi_timeout_s).into()),
    }
}

/// Options that make Open MPI work inside containers: no cross-memory-attach single copy
/// (often blocked by ptrace restrictions) and TCP only over loopback when oversubscribed.
fn mpi_mca_args() -> Vec<String> {
    ["--mca", "btl_vader_single_copy_mechanism", "none"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Builds the package's tests with `--features mpi` and returns the `mpi_*` executables.
fn build_mpi_tests(
    root: &Path,
    pkg: &str,
) -> Result<Vec<(String, PathBuf)>, Box<dyn std::error::Error>> {
    println!("== building {pkg} MPI tests (--features mpi)");
    let out = Command::new(cargo_bin())
        .args([
            "test",
            "-p",
            pkg,
            "--features",
            "mpi",
            "--no-run",
            "--message-format=json",
        ])
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("building {pkg} with --features mpi failed").into());
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" {
            continue;
        }
        let name = v["target"]["name"].as_str().unwrap_or_default();
        let is_test = v["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|x| x == "test"));
        if let (true, true, Some(exe)) =
            (is_test, name.starts_with("mpi_"), v["executable"].as_str())
        {
            found.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    found.sort();
    Ok(found)
}

fn run_with_timeout(
    mut cmd: Command,
    timeout: Duration,
) -> Result<Option<std::process::ExitStatus>, Box<dyn std::error::Error>> {
    let mut child = cmd.spawn()?;
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs one check and says how long it took, so that a slow CI shows where its time went.
fn step(name: &str, run: impl FnOnce() -> std::io::Result<std::process::ExitStatus>) -> CliResult {
    let t = Instant::now();
    match run() {
        Ok(s) if s.success() => {
            println!("== {name}: passed in {:.0} s", t.elapsed().as_secs_f64());
            Ok(())
        }
        Ok(s) => Err(format!("{name} failed ({s})").into()),
        Err(e) => Err(format!("{name} could not start: {e}").into()),
    }
}

fn cargo(root: &Path, args: &[&str]) -> std::io::Result<std::process::ExitStatus> {
    println!("== cargo {}", args.join(" "));
    Command::new(cargo_bin())
        .args(args)
        .current_dir(root)
        .status()
}

fn cargo_bin() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// `mpirun` on the PATH, if any.
pub fn mpirun() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
}

/// Whether the `mpi` feature can build here: `mpirun` and the `mpicc` wrapper (through
/// which rsmpi finds the headers and libraries) are both on the PATH.
pub fn mpi_toolchain_present() -> bool {
    mpirun().is_some()
        && std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("mpicc").is_file()))
}

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}
