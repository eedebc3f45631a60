//! `cargo xtask bench`: the main job. Runs the suites, writes `report.json` (the format of
//! `docs/ARCHITECTURE.md`), `report.md` (one section per suite, with the papers' numbers beside
//! ours) and SVG plots into the output directory.
//!
//! On one machine the communicating suites run on `ThreadComm` with `--ranks P` ranks;
//! `--mpi -n P [--hostfile F]` rebuilds this tool with the `mpi` feature and relaunches it
//! under `mpirun`, where the communicating suites run on `MpiComm` (with the MPI library's own
//! collective measured in the same run) and the local suites on rank 0. Started by an MPI
//! launcher directly (`mpirun -n P xtask bench`), it joins the MPI world as if relaunched,
//! or, built without the `mpi` feature, refuses instead of running P thread benches that
//! would all write one report. A rank whose suite fails under MPI prints the error and
//! ends the whole job (`MPI_Abort`): returning would finalise MPI, which waits for peers
//! that may have stalled.

use std::path::{Path, PathBuf};
use std::time::Instant;

use collectives::Communicator;
use indicatif::{ProgressBar, ProgressStyle};

use crate::CliResult;

mod plot;
mod report;
mod suites;
mod timing;

pub use report::{Headline, Record, SuiteOutput};

/// Errors that cross rank threads.
pub type BoxErr = Box<dyn std::error::Error + Send + Sync>;

/// Every suite, in report order.
pub const SUITES: [&str; 11] = [
    "topk",
    "allreduce",
    "allgather",
    "reduce_scatter",
    "sparse",
    "simulate",
    "plan",
    "train",
    "lars",
    "datacache",
    "gpu",
];

fn known_suites() -> &'static [&'static str] {
    &SUITES
}

/// Options of `cargo xtask bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// A short run (under 3 minutes on 2 cores): fewer sizes and repetitions.
    #[arg(long)]
    quick: bool,
    /// Output directory (default: target/bench-report in the workspace).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Suites to run (default: all): topk, allreduce, allgather, reduce_scatter, sparse,
    /// simulate, plan, train, lars, datacache, gpu (needs the `cuda` feature and a device;
    /// skipped otherwise).
    #[arg(long = "suite", num_args = 1..)]
    suites: Vec<String>,
    /// Ranks of the communicating suites on the thread transport.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Run under mpirun (rebuilds xtask with the `mpi` feature and relaunches itself).
    #[arg(long)]
    mpi: bool,
    /// Number of MPI processes with --mpi.
    #[arg(short = 'n', long = "np", default_value_t = 4)]
    np: usize,
    /// Hostfile passed to mpirun with --mpi.
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// Calibration (`cargo xtask calibrate`) that the automatic choice of the allreduce,
    /// allgather and reduce_scatter suites ranks algorithms by; it must have been taken on
    /// the same transport at the same P. Default: `calibration.json` in the working
    /// directory when it matches, else the chooser's built-in rules.
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Tensor sizes of the topk suite, as powers of two from 4 to 26 (`--topk-sizes 20 22`
    /// times 2^20 and 2^22 elements). Default: 14 16 … 26 (14 17 20 22 with `--quick`).
    /// Above 2^26 the suite's vectors (a residual per case, 1 GiB each at 2^28) would not
    /// fit a machine like the 24 GiB development VM, and an allocation failure aborts.
    #[arg(long = "topk-sizes", num_args = 1.., value_parser = clap::value_parser!(u32).range(4..=26))]
    topk_sizes: Vec<u32>,
    /// Internal: set when this process was started by mpirun.
    #[arg(long, hide = true)]
    mpi_child: bool,
}

/// What every suite can see.
pub struct Ctx {
    /// Quick run.
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// Ranks of the communicating suites.
    pub ranks: usize,
    /// The MPI world when running under mpirun.
    #[cfg(feature = "mpi")]
    pub mpi: Option<collectives::MpiComm>,
    /// `--calibration`, when given.
    pub calibration: Option<PathBuf>,
    /// `--topk-sizes` as powers of two; empty for the suite's default.
    pub topk_sizes: Vec<u32>,
}

impl Ctx {
    /// The transport name for the report.
    pub fn backend(&self) -> &'static str {
        #[cfg(feature = "mpi")]
        if self.mpi.is_some() {
            return "mpi";
        }
        "thread"
    }

    /// This process's rank (0 unless under MPI).
    pub fn rank(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(c) = &self.mpi {
            return c.rank();
        }
        0
    }

    /// Runs `body` on every rank of the suite's world: `ThreadComm` with `ranks` threads, or
    /// the MPI world. Returns rank 0's result (other MPI ranks get `None`).
    pub fn on_world<T: Send>(
        &self,
        body: impl Fn(&dyn Communicator) -> Result<T, BoxErr> + Sync,
    ) -> Result<Option<T>, BoxErr> {
        #[cfg(feature = "mpi")]
        if let Some(c) = &self.mpi {
            let out = body(c)?;
            return Ok((c.rank() == 0).then_some(out));
        }
        let mut all = collectives::ThreadComm::run(self.ranks, |c| body(&c))
            .map_err(|e| -> BoxErr { e.to_string().into() })?;
        Ok(Some(all.swap_remove(0)))
    }
}

/// Runs `cargo xtask bench`.
pub fn run(mut args: Args) -> CliResult {
    // Everything a user can get wrong is checked before any long work starts.
    let suites = select_suites(&args.suites)?;
    if args.ranks == 0 {
        return Err("--ranks must be at least 1".into());
    }
    if let Some(launcher) = collectives::comm::launcher::mpi_launcher() {
        if !cfg!(feature = "mpi") {
            let (var, value) = launcher;
            return Err(format!(
                "`xtask bench` was started by an MPI launcher ({var}={value}), but this xtask \
                 was built without the `mpi` feature: it cannot join the MPI world, and every \
                 rank would run its own thread bench and write the same report. Run \
                 `cargo xtask bench --mpi -n P`, which builds xtask with MPI and starts \
                 mpirun itself."
            )
            .into());
        }
        // Started by mpirun by hand: take part in the MPI world, as a relaunched child does.
        args.mpi_child = true;
    }
    if cfg!(debug_assertions) && !args.mpi_child && std::env::var_os("XTASK_BENCH_DEBUG").is_none()
    {
        // Timings from a debug build mean nothing: rebuild and run this tool optimised.
        return rerun_in_release();
    }
    if args.mpi && !args.mpi_child {
        return relaunch_under_mpirun(&args);
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| crate::ci::workspace_root().join("target/bench-report"));
    check_writable(&out)?;
    let ctx = make_ctx(&args, out)?;
    let result = run_suites(&ctx, &suites);
    #[cfg(feature = "mpi")]
    if let (Err(e), Some(comm)) = (&result, &ctx.mpi) {
        comm.abort_on_fatal(e, 1);
    }
    result
}

/// Runs the suites on the context's world; rank 0 writes the report.
fn run_suites(ctx: &Ctx, suites: &[String]) -> CliResult {
    let leader = ctx.rank() == 0;
    let start = Instant::now();
    let mut sections = Vec::new();
    for name in suites {
        let pb = if leader {
            progress(name)
        } else {
            ProgressBar::hidden()
        };
        let t = Instant::now();
        let result = suites::run(name, ctx, &pb);
        pb.finish_and_clear();
        match result {
            Ok(Some(out)) => {
                if leader {
                    eprintln!(
                        "{name}: {} records in {:.1} s",
                        out.records.len(),
                        t.elapsed().as_secs_f64()
                    );
                }
                sections.push((name.to_string(), out));
            }
            Ok(None) => {}
            Err(e) => return Err(format!("suite {name} failed: {e}").into()),
        }
    }
    if !leader {
        return Ok(());
    }
    let machine = report::Machine {
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        backend: ctx.backend().into(),
        ranks: ctx.world_size(),
        pool_threads: sparsify::threads(),
        quick: ctx.quick,
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
    };
    let records: Vec<Record> = sections
        .iter()
        .flat_map(|(_, o)| o.records.clone())
        .collect();
    let rep = report::Report {
        schema: 1,
        machine: machine.clone(),
        records,
    };
    report::validate(&rep, &suites.iter().map(|s| s.as_str()).collect::<Vec<_>>())?;
    report::write_json(&rep, &ctx.out)?;
    let command = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    report::write_markdown(
        &ctx.out,
        &machine,
        &format!("cargo xtask {command}"),
        start.elapsed().as_secs_f64(),
        &sections,
    )?;
    println!(
        "wrote {} records to {} and {} in {:.0} s",
        rep.records.len(),
        ctx.out.join("report.json").display(),
        ctx.out.join("report.md").display(),
        start.elapsed().as_secs_f64()
    );
    for (_, o) in &sections {
        for f in &o.findings {
            println!("- {f}");
        }
    }
    Ok(())
}

impl Ctx {
    /// Ranks of the communicating suites' world.
    pub fn world_size(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(c) = &self.mpi {
            return c.size();
        }
        self.ranks
    }
}

fn make_ctx(args: &Args, out: PathBuf) -> Result<Ctx, Box<dyn std::error::Error>> {
    #[cfg(feature = "mpi")]
    {
        let mpi = if args.mpi_child {
            Some(collectives::MpiComm::world()?)
        } else {
            None
        };
        Ok(Ctx {
            quick: args.quick,
            out,
            ranks: args.ranks,
            mpi,
            calibration: args.calibration.clone(),
            topk_sizes: args.topk_sizes.clone(),
        })
    }
    #[cfg(not(feature = "mpi"))]
    {
        if args.mpi_child {
            return Err("this xtask was built without the `mpi` feature".into());
        }
        Ok(Ctx {
            quick: args.quick,
            out,
            ranks: args.ranks,
            calibration: args.calibration.clone(),
            topk_sizes: args.topk_sizes.clone(),
        })
    }
}

fn select_suites(asked: &[String]) -> Result<Vec<String>, String> {
    if asked.is_empty() {
        return Ok(known_suites().iter().map(|s| s.to_string()).collect());
    }
    let mut out = Vec::new();
    for s in asked {
        if !known_suites().contains(&s.as_str()) {
            return Err(format!(
                "unknown suite {s:?}; known suites: {}",
                known_suites().join(", ")
            ));
        }
        if !out.contains(s) {
            out.push(s.clone());
        }
    }
    Ok(out)
}

fn check_writable(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create output directory {}: {e}", dir.display()))?;
    let probe = dir.join(".write-probe");
    std::fs::write(&probe, b"ok")
        .map_err(|e| format!("cannot write into output directory {}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

fn progress(name: &str) -> ProgressBar {
    let pb = ProgressBar::new(1);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(name.to_string());
    pb
}

/// Runs the same command line again from a release build of xtask (or of the profile
/// [`BUILD_PROFILE`] names).
fn rerun_in_release() -> CliResult {
    // With an MPI toolchain here, build the binary that `bench --mpi` and `train --mpi` run
    // too: a second feature set would recompile `collectives` and everything above it.
    let with_mpi = crate::ci::mpi_toolchain_present();
    let exe = match build_release_xtask(with_mpi) {
        Ok(exe) => exe,
        Err(e) if with_mpi => {
            eprintln!("{e}; building without the `mpi` feature instead ...");
            build_release_xtask(false)?
        }
        Err(e) => return Err(e),
    };
    // In the caller's directory (inherited), as `cargo run` started it: relative paths keep
    // their meaning.
    // The rebuilt binary runs as it is, whatever its profile: one with debug assertions
    // (`dev`, or a custom profile inheriting it) must not rebuild and rerun itself in turn.
    let status = std::process::Command::new(exe)
        .env("XTASK_BENCH_DEBUG", "1")
        .args(std::env::args_os().skip(1))
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the release run exited with {status}").into())
    }
}

/// Environment variable naming the Cargo profile that `bench` and `--mpi` runs rebuild
/// xtask in (default `release`). CI's smoke runs set `dev`: they check that the jobs run,
/// not how fast, and the test build has compiled most of a `dev` xtask already (a
/// release build took 7 of CI's 35 minutes on the 2-core VM).
pub const BUILD_PROFILE: &str = "XTASK_BUILD_PROFILE";

/// The profile [`BUILD_PROFILE`] names, `release` when unset or empty.
fn build_profile() -> String {
    std::env::var(BUILD_PROFILE)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "release".into())
}

/// Builds xtask in release mode (or [`BUILD_PROFILE`]'s), with the `mpi` feature when
/// `with_mpi`, and with `cuda` when this binary has it; returns the executable's path.
fn build_release_xtask(with_mpi: bool) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let root = crate::ci::workspace_root();
    let mut features = Vec::new();
    if with_mpi {
        features.push("mpi");
    }
    if cfg!(feature = "cuda") {
        features.push("cuda");
    }
    let what = if features.is_empty() {
        String::new()
    } else {
        format!(" --features {}", features.join(","))
    };
    let profile = build_profile();
    if profile == "release" {
        eprintln!("building xtask in release mode{what} for meaningful timings ...");
    } else {
        eprintln!("building xtask in the `{profile}` profile{what} ({BUILD_PROFILE}) ...");
    }
    let mut cmd =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--profile", &profile, "-q", "-p", "xtask"]);
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    if !cmd.current_dir(&root).status()?.success() {
        return Err(format!("building xtask{what} ({profile}) failed").into());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join(profile_dir(&profile)).join("xtask"))
}

/// The folder under the target directory where Cargo writes a profile's output: `debug` for
/// `dev` and `test`, `release` for `release` and `bench`, the name for a custom profile.
fn profile_dir(profile: &str) -> &str {
    match profile {
        "dev" | "test" => "debug",
        "release" | "bench" => "release",
        custom => custom,
    }
}

/// Builds xtask with the `mpi` feature (release) and runs it under mpirun.
fn relaunch_under_mpirun(args: &Args) -> CliResult {
    let root = crate::ci::workspace_root();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| root.join("target/bench-report"));
    check_writable(&out)?;
    let mut child: Vec<std::ffi::OsString> = vec![
        "bench".into(),
        "--mpi-child".into(),
        "--out".into(),
        out.into(),
    ];
    if args.quick {
        child.push("--quick".into());
    }
    if let Some(c) = &args.calibration {
        // Refused here, once, rather than by every rank after mpirun has started them.
        suites::load_calibration(c, args.np, "mpi").map_err(|e| e.to_string())?;
        child.push("--calibration".into());
        child.push(c.into());
    }
    if !args.topk_sizes.is_empty() {
        child.push("--topk-sizes".into());
        child.extend(args.topk_sizes.iter().map(|e| e.to_string().into()));
    }
    if !args.suites.is_empty() {
        child.push("--suite".into());
        child.extend(args.suites.iter().map(Into::into));
    }
    mpirun_xtask(args.np, args.hostfile.as_deref(), &child)
}

/// Builds xtask with the `mpi` feature (release) and runs `xtask <child_args>` as `np`
/// processes under mpirun (shared by `bench --mpi` and `train --mpi`).
pub fn mpirun_xtask(
    np: usize,
    hostfile: Option<&Path>,
    child_args: &[std::ffi::OsString],
) -> CliResult {
    let mpirun = crate::ci::mpirun().ok_or(
        "--mpi needs `mpirun` on the PATH: install an MPI library (Debian/Ubuntu: \
         apt-get install libopenmpi-dev openmpi-bin libclang-dev)",
    )?;
    if np == 0 {
        return Err("-n must be at least 1".into());
    }
    if let Some(h) = hostfile {
        if !h.is_file() {
            return Err(format!("hostfile {} does not exist", h.display()).into());
        }
    }
    let exe = build_release_xtask(true)?;
    let mut cmd = std::process::Command::new(mpirun);
    cmd.args(["-n", &np.to_string(), "--oversubscribe"]);
    if is_root() {
        cmd.arg("--allow-run-as-root");
    }
    if let Some(h) = hostfile {
        cmd.arg("--hostfile").arg(h);
    }
    // Open MPI's single copy (cross-memory attach) where the kernel allows it, so that
    // the library is measured at its best; where ptrace restrictions forbid it (common
    // in containers) the job would fail without this. The probe runs on this host only.
    if !collectives::comm::peer_memory::can_read_other_processes() {
        eprintln!("cross-memory attach is not allowed here: Open MPI runs without its single copy");
        cmd.args(["--mca", "btl_vader_single_copy_mechanism", "none"]);
    }
    cmd.arg(exe).args(child_args);
    // The ranks start in the caller's directory (inherited, not the workspace root), so
    // that the relative paths among `child_args` (and `calibration.json`, the default
    // calibration) mean what they mean without `--mpi`.
    let status = cmd.status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("mpirun exited with {status}").into())
    }
}

fn is_root() -> bool {
    std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false)
}

#[cfg(test)]
mod profile_tests {
    use super::profile_dir;

    /// Where Cargo writes each profile's output: `test` and `bench` share `debug` and
    /// `release`, a custom profile gets its own folder.
    #[test]
    fn rebuilt_xtask_is_looked_for_where_cargo_writes_it() {
        let dirs: Vec<&str> = ["dev", "test", "release", "bench", "ci-smoke"]
            .into_iter()
            .map(profile_dir)
            .collect();
        assert_eq!(dirs, ["debug", "debug", "release", "release", "ci-smoke"]);
    }
}
