//! Faults under MPI: one rank exits, is killed with SIGKILL, stops itself with SIGSTOP or
//! panics in the middle of a dense or a sparse allreduce. Every survivor must end with a typed
//! timeout within its receive timeout, print it and end the whole job with `MPI_Abort`, so
//! that the job ends within the timeout plus 10 s instead of hanging on the stopped rank.
//!
//! The same faults strike before the MPI library's own all-reduce (`AllreduceAlgo::Library`,
//! unchecked, so the survivors enter `MPI_Allreduce` at once): a blocking call that cannot be
//! timed out from inside, so each survivor's watchdog must end the job within the timeout.
//!
//! Started without an MPI launcher this binary is the driver: for P in `--ranks` (default
//! 3, 4), every fault and both collectives, it runs `mpirun -n P` on itself with
//! `COLLECTIVES_TIMEOUT_S` = `--timeout-s` (default 5), times the whole job and checks what
//! every survivor printed. Under the launcher (`collectives::comm::launcher::mpi_launcher`)
//! it is one rank of one scenario, named by `worker FAULT COLLECTIVE`.
//!
//! For a process that exits or is killed, Open MPI's launcher by default ends the job by
//! itself at once (before any survivor's timeout); the driver runs those scenarios twice,
//! with that default and with `--enable-recovery` (the job goes on without the lost rank),
//! where the survivors must find the loss on their own. (Open MPI 4.1's `mpirun` then exits
//! 0 even after `MPI_Abort`, so in that mode only the survivors' reports are checked.)

#[allow(dead_code)] // each fault test uses a part of it
mod fault_inject;

#[path = "support/mpi.rs"]
mod mpi;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use collectives::{allreduce, AllreduceAlgo, Communicator, DenseOptions, Error};
use fault_inject::{fault_at, run_until_fault, Collective, FAULTY_RANK};

/// How a survivor's report line starts; the driver looks for it.
const REPORT: &str = "FAULT-TEST";

/// How long a survivor waits between printing its error and aborting, so that every
/// survivor's report reaches the driver before the first `MPI_Abort` ends the job (the
/// survivors time out within milliseconds of each other).
const REPORT_GRACE: Duration = Duration::from_secs(1);

/// Slack the whole job gets beyond the receive timeout, as the issue asks.
const SLACK: Duration = Duration::from_secs(10);

/// The faults one rank suffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `exit(3)` without `MPI_Finalize`.
    Exit,
    /// SIGKILL to itself.
    Kill,
    /// SIGSTOP to itself: alive but silent until the job ends.
    Stop,
    /// A panic: unwinding drops the communicator, which ends the job with `MPI_Abort`
    /// instead of finalising.
    Panic,
}

impl Fault {
    const ALL: [Fault; 4] = [Fault::Exit, Fault::Kill, Fault::Stop, Fault::Panic];

    fn name(self) -> &'static str {
        match self {
            Fault::Exit => "exit",
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::Panic => "panic",
        }
    }

    fn parse(s: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == s)
    }

    /// Runs the fault on this process.
    fn strike(self) -> Error {
        let signal = match self {
            Fault::Exit => std::process::exit(3),
            Fault::Kill => "-KILL",
            Fault::Stop => "-STOP",
            Fault::Panic => panic!("rank {FAULTY_RANK}: injected panic"),
        };
        let pid = std::process::id().to_string();
        let _ = std::io::stdout().flush();
        match Command::new("kill").args([signal, &pid]).status() {
            Ok(s) if s.success() => {}
            other => {
                eprintln!("rank {FAULTY_RANK}: cannot send {signal} to itself: {other:?}");
                std::process::exit(4);
            }
        }
        // SIGKILL never returns; SIGSTOP returns only if someone resumes the process.
        Error::InvalidArgument(format!("resumed after {signal}"))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if collectives::comm::launcher::mpi_launcher().is_some() {
        worker(&args);
    } else if let Err(e) = driver(&args) {
        eprintln!("FAILED: mpi_faults: {e}");
        std::process::exit(1);
    }
}

/// The worker's name for the library all-reduce scenario.
const LIBRARY: &str = "library";

/// One rank of one scenario.
fn worker(args: &[String]) -> ! {
    if let (Some(fault), Some(LIBRARY)) = (
        args.get(1).and_then(|s| Fault::parse(s)),
        args.get(2).map(String::as_str),
    ) {
        library_worker(fault);
    }
    let (Some(fault), Some(coll)) = (
        args.get(1).and_then(|s| Fault::parse(s)),
        args.get(2).and_then(|s| Collective::parse(s)),
    ) else {
        eprintln!("usage under mpirun: mpi_faults worker exit|kill|stop|panic dense|sparse");
        std::process::exit(2);
    };
    let comm = mpi::world();
    let rank = comm.rank();
    let comm = fault_at(comm, Box::new(move || fault.strike()));
    match run_until_fault(&comm, coll) {
        Ok(()) => {
            println!("{REPORT} rank={rank} completed");
            // A survivor must never finish a collective its peer left: end the job too.
            comm.inner()
                .abort_on_fatal(&"completed a collective a peer left", 5);
        }
        Err(e) => {
            println!("{REPORT} rank={rank} error={e:?}");
            let _ = std::io::stdout().flush();
            std::thread::sleep(REPORT_GRACE);
            comm.inner().abort_on_fatal(&e, 3);
        }
    }
}

/// One rank of a library scenario: one library all-reduce, then the fault on
/// [`FAULTY_RANK`] while the others enter the next one.
fn library_worker(fault: Fault) -> ! {
    let comm = mpi::world();
    let rank = comm.rank();
    let opts = DenseOptions::default().unchecked();
    let mut buf = vec![1.0f32; 4096];
    let mut outcome = allreduce(&comm, &mut buf, AllreduceAlgo::Library, &opts);
    if outcome.is_ok() {
        if rank == FAULTY_RANK {
            let _ = fault.strike();
            // The faulty rank never enters the call. A stopped one is resumed when the job is
            // torn down (the launcher sends SIGCONT before it kills), and entering then would
            // let a survivor still blocked in the call complete it.
            std::process::exit(4);
        }
        outcome = allreduce(&comm, &mut buf, AllreduceAlgo::Library, &opts);
    }
    match outcome {
        Ok(()) => {
            println!("{REPORT} rank={rank} completed");
            comm.abort_on_fatal(&"completed a collective a peer left", 5);
        }
        Err(e) => {
            println!("{REPORT} rank={rank} error={e:?}");
            let _ = std::io::stdout().flush();
            std::thread::sleep(REPORT_GRACE);
            comm.abort_on_fatal(&e, 3);
        }
    }
}

/// Options of the driver.
struct Opts {
    ranks: Vec<usize>,
    timeout: Duration,
}

fn parse_opts(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        ranks: vec![3, 4],
        timeout: Duration::from_secs(5),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--ranks" => {
                o.ranks = value()?
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--ranks {s}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--timeout-s" => {
                let s: u64 = value()?.parse().map_err(|e| format!("--timeout-s: {e}"))?;
                o.timeout = Duration::from_secs(s.max(1));
            }
            // Options libtest-style runners pass (`cargo test`): nothing to do with them.
            other if other.starts_with("--") => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.ranks.iter().any(|&p| p <= FAULTY_RANK) {
        return Err(format!("every P must exceed the faulty rank {FAULTY_RANK}"));
    }
    Ok(o)
}

fn driver(args: &[String]) -> Result<(), String> {
    let opts = parse_opts(args)?;
    check_the_checker()?;
    let Some(mpirun) = find_mpirun() else {
        println!("skipped: mpi_faults needs `mpirun` on the PATH");
        return Ok(());
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut failures = Vec::new();
    for &p in &opts.ranks {
        for fault in Fault::ALL {
            for coll in Collective::ALL.map(Some).into_iter().chain([None]) {
                // Exit and SIGKILL: Open MPI's default (the launcher ends the job) and
                // recovery mode (the survivors must notice by themselves). In recovery mode
                // a survivor inside `MPI_Allreduce` meets the library's own error handler,
                // not ours, so the library scenarios run without it.
                let modes: &[bool] = match (fault, coll) {
                    (Fault::Stop | Fault::Panic, _) | (_, None) => &[false],
                    (Fault::Exit | Fault::Kill, Some(_)) => &[false, true],
                };
                for &recovery in modes {
                    let s = Scenario {
                        p,
                        fault,
                        coll,
                        recovery,
                    };
                    match s.run(&mpirun, &exe, opts.timeout) {
                        Ok(line) => println!("ok: {line}"),
                        Err(e) => {
                            println!("FAILED: {} {e}", s.label());
                            failures.push(s.label());
                        }
                    }
                }
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} scenarios failed: {failures:?}", failures.len()))
    }
}

struct Scenario {
    p: usize,
    fault: Fault,
    /// The collective; `None`: the MPI library's all-reduce.
    coll: Option<Collective>,
    recovery: bool,
}

impl Scenario {
    fn coll_name(&self) -> &'static str {
        self.coll.map_or(LIBRARY, Collective::name)
    }

    fn label(&self) -> String {
        format!(
            "P={} {} {}{}",
            self.p,
            self.fault.name(),
            self.coll_name(),
            if self.recovery { " (recovery)" } else { "" }
        )
    }

    /// Runs the job and checks it; returns the line to print.
    fn run(
        &self,
        mpirun: &std::path::Path,
        exe: &std::path::Path,
        timeout: Duration,
    ) -> Result<String, String> {
        let mut cmd = Command::new(mpirun);
        cmd.args(["--allow-run-as-root", "--oversubscribe", "-n"])
            .arg(self.p.to_string())
            .args(["--mca", "btl_vader_single_copy_mechanism", "none"]);
        if self.recovery {
            cmd.arg("--enable-recovery");
        }
        cmd.arg(exe)
            .args(["worker", self.fault.name(), self.coll_name()])
            .env("COLLECTIVES_TIMEOUT_S", timeout.as_secs().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start mpirun: {e}"))?;
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        // Kill a hung job well past the limit, so that a failure never hangs CI.
        let hard = timeout + SLACK * 3;
        let status: Option<ExitStatus> = loop {
            if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
                break Some(s);
            }
            if start.elapsed() > hard {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = start.elapsed();
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        let context = || format!("\n--- stdout\n{stdout}--- stderr\n{stderr}");
        let Some(status) = status else {
            return Err(format!("hung: killed after {elapsed:.1?}{}", context()));
        };
        // Open MPI 4.1 with `--enable-recovery` exits 0 even after MPI_Abort; there the
        // survivors' reports below are what shows the job ended on the fault.
        if status.success() && !self.recovery {
            return Err(format!("the job exited 0 after a fault{}", context()));
        }
        if elapsed > timeout + SLACK {
            return Err(format!(
                "took {elapsed:.1?}, more than the timeout {timeout:?} + {SLACK:?}{}",
                context()
            ));
        }
        let reports = self
            .check_survivors(&stdout, &stderr)
            .map_err(|e| e + &context())?;
        Ok(format!(
            "{}: job ended in {:.2} s ({status}), {reports}",
            self.label(),
            elapsed.as_secs_f64()
        ))
    }

    /// What every survivor said. Each must report a typed timeout, except that a survivor
    /// can be ended by another survivor's `MPI_Abort` before its own timeout runs out, and
    /// that the launcher ends the whole job at once for an exit or SIGKILL without
    /// recovery. At least one survivor must report whenever the launcher did not end the
    /// job itself.
    ///
    /// A survivor's abort shows in two places: the `rank R/P: fatal: …; ending the MPI job`
    /// line it prints itself just before `MPI_Abort`, and Open MPI's "MPI_ABORT was invoked
    /// on rank R" banner. The banner alone is not enough: when two ranks abort at once Open
    /// MPI 4.1 can lose it ("ORTE_ERROR_LOG: Data unpack would read past end of buffer" in
    /// `show_help.c`), which once failed CI on a survivor cut off by a peer's abort.
    fn check_survivors(&self, stdout: &str, stderr: &str) -> Result<String, String> {
        let mut timed_out = Vec::new();
        let mut cut_off = Vec::new();
        let aborted_by_survivor = (0..self.p).filter(|&r| r != FAULTY_RANK).any(|r| {
            stderr.contains(&format!("MPI_ABORT was invoked on rank {r} in"))
                || stderr.lines().any(|l| {
                    l.starts_with(&format!("rank {r}/{}: fatal: ", self.p))
                        && l.contains("ending the MPI job (MPI_Abort")
                })
        });
        for r in (0..self.p).filter(|&r| r != FAULTY_RANK) {
            let prefix = format!("{REPORT} rank={r} ");
            let line = stdout.lines().find(|l| l.starts_with(&prefix));
            // A survivor whose send beside a failed receive never completed, or whose send
            // a stalled peer never took, is ended by the transport itself, which prints the
            // same typed error.
            let lib = format!("rank {r}/{}: fatal: rank {r} waited", self.p);
            match line {
                Some(l) if l.contains("error=Timeout {") => timed_out.push(r),
                Some(l) => return Err(format!("rank {r} reported the wrong outcome: {l}")),
                None if stderr.contains(&lib) => timed_out.push(r),
                None if self.launcher_ends_job() => {}
                None if aborted_by_survivor => cut_off.push(r),
                None => return Err(format!("survivor rank {r} reported nothing")),
            }
        }
        if timed_out.is_empty() && !self.launcher_ends_job() {
            return Err("no survivor reported a typed timeout".into());
        }
        Ok(format!(
            "survivors with a typed timeout: {timed_out:?} of {}{}",
            self.p - 1,
            if cut_off.is_empty() {
                String::new()
            } else {
                format!(", ended by a peer's MPI_Abort first: {cut_off:?}")
            }
        ))
    }

    /// Whether the job ends before any survivor's timeout: the launcher ends it when a rank
    /// exits or is killed (without recovery); a panicking rank aborts it itself.
    fn launcher_ends_job(&self) -> bool {
        match self.fault {
            Fault::Exit | Fault::Kill => !self.recovery,
            Fault::Panic => true,
            Fault::Stop => false,
        }
    }
}

/// [`Scenario::check_survivors`] on the outputs of a job that once failed CI: at P = 4 a
/// stopped rank 1, rank 2 timed out and aborted, rank 0's send timed out and aborted, and
/// rank 3, cut off by those aborts, printed nothing while Open MPI lost its abort banner.
/// That must pass (rank 3 cut off), and the same job without any abort line (so no sign
/// that a survivor ended it) must fail.
fn check_the_checker() -> Result<(), String> {
    let s = Scenario {
        p: 4,
        fault: Fault::Stop,
        coll: Some(Collective::Dense),
        recovery: false,
    };
    let stdout = "FAULT-TEST rank=2 error=Timeout { rank: 2, src: 1, tag: 24592, waited: 5.0s }\n\
                  FAULT-TEST rank=1 error=InvalidArgument(\"resumed after -STOP\")\n";
    let stderr = "rank 0/4: fatal: rank 0 waited 6.0s for rank 1 to take a message with tag \
                  24592; ending the MPI job (MPI_Abort 70)\n\
                  [vm:1] ORTE_ERROR_LOG: Data unpack would read past end of buffer in file \
                  ../../../orte/util/show_help.c at line 501\n\
                  rank 2/4: fatal: rank 2 waited 5.0s for a message from rank 1 with tag \
                  24592; ending the MPI job (MPI_Abort 3)\n";
    match s.check_survivors(stdout, stderr) {
        Ok(r) if r.contains("[3]") => {}
        other => return Err(format!("check_survivors on a cut-off rank: {other:?}")),
    }
    let silent = "rank 0/4: nothing fatal here\n";
    match s.check_survivors(stdout, silent) {
        Err(e) if e.contains("reported nothing") => Ok(()),
        other => Err(format!("check_survivors on a silent rank: {other:?}")),
    }
}

/// Reads a child's pipe to the end on a thread.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = pipe {
            for line in BufReader::new(p).lines().map_while(Result::ok) {
                s.push_str(&line);
                s.push('\n');
            }
        }
        s
    })
}

fn find_mpirun() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
}
