//! Times every dense all-reduce and all-gather algorithm against the MPI library's own
//! `MPI_Allreduce` / `MPI_Allgather` in the same run, printing time and bus bandwidth
//! (nccl-tests convention: all-reduce busbw = bytes·2(P−1)/P / time, all-gather busbw =
//! bytes·(P−1)/P / time, bytes = the full vector) and ours / MPI.
//!
//! ```text
//! cargo build --release -p collectives --features mpi --example dense_bench
//! mpirun --allow-run-as-root --oversubscribe -n 4 target/release/examples/dense_bench
//! ```
//! Without the `mpi` feature it runs on `ThreadComm` (no native column):
//! `cargo run --release -p collectives --example dense_bench -- --threads 4`.
//! Options: `--min BYTES` (default 4096), `--max BYTES` (default 64 MiB), `--only NAME`
//! (an algorithm name), `--threads P` (ThreadComm only).

use std::time::Instant;

use collectives::dense::{
    allgather, allreduce, allreduce_hier, choose_allreduce, AllgatherAlgo, AllreduceAlgo,
    DenseOptions, HierComm,
};
use collectives::{Communicator, Result};

/// The MPI library's own collectives, as the baseline.
trait Native {
    fn allreduce(&self, send: &[f32], recv: &mut [f32]);
    fn allgather(&self, send: &[f32], recv: &mut [f32]);
    fn barrier(&self);
}

#[cfg(feature = "mpi")]
mod native {
    use mpi::collective::{CommunicatorCollectives, SystemOperation};
    use mpi::topology::SimpleCommunicator;

    pub struct Mpi<'a>(pub &'a SimpleCommunicator);

    impl super::Native for Mpi<'_> {
        fn allreduce(&self, send: &[f32], recv: &mut [f32]) {
            self.0.all_reduce_into(send, recv, SystemOperation::sum());
        }
        fn allgather(&self, send: &[f32], recv: &mut [f32]) {
            self.0.all_gather_into(send, recv);
        }
        fn barrier(&self) {
            self.0.barrier();
        }
    }
}

struct Args {
    min: usize,
    max: usize,
    only: Option<String>,
    #[cfg_attr(feature = "mpi", allow(dead_code))]
    threads: usize,
}

fn args() -> Args {
    let mut a = Args {
        min: 4 << 10,
        max: 64 << 20,
        only: None,
        threads: 4,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < v.len() {
        match v[i].as_str() {
            "--min" => a.min = v[i + 1].parse().unwrap_or(a.min),
            "--max" => a.max = v[i + 1].parse().unwrap_or(a.max),
            "--only" => a.only = Some(v[i + 1].clone()),
            "--threads" => a.threads = v[i + 1].parse().unwrap_or(a.threads),
            _ => {}
        }
        i += 2;
    }
    a
}

/// Seconds per iteration of `f`: the best of three timed runs of `iters` calls (after one
/// warm-up call) on each rank, then the slowest rank. Best-of-3 damps a shared machine's
/// noise for both columns alike.
fn time<C: Communicator + ?Sized>(
    comm: &C,
    iters: usize,
    barrier: &dyn Fn(),
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        barrier();
        let t0 = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        best = best.min(t0.elapsed().as_secs_f64() / iters as f64);
    }
    let mut all = vec![0f64; comm.size()];
    allgather(
        comm,
        &[best],
        &mut all,
        AllgatherAlgo::Bruck,
        &DenseOptions::default(),
    )?;
    Ok(all.into_iter().fold(0.0, f64::max))
}

fn bench<C: Communicator + ?Sized>(comm: &C, native: Option<&dyn Native>, a: &Args) -> Result<()> {
    let p = comm.size();
    let r0 = comm.rank() == 0;
    let barrier = || match native {
        Some(n) => n.barrier(),
        None => {
            let _ = comm.barrier();
        }
    };
    let opts = DenseOptions::default().unchecked();
    let mut algos = AllreduceAlgo::all(p);
    for x in algos.iter_mut() {
        if let AllreduceAlgo::Torus2d { .. } = x {
            *x = AllreduceAlgo::Torus2d {
                ranks_per_node: if p % 2 == 0 { 2 } else { 1 },
            };
        }
    }
    // The 2D torus splits its communicators once, as a training loop would.
    let hier = HierComm::new(comm, if p % 2 == 0 { 2 } else { 1 })?;
    let want = |name: &str| a.only.as_deref().is_none_or(|o| o == name);
    if r0 {
        println!(
            "# backend={} P={p}; bytes = whole vector; busbw in GB/s (1e9 B/s)",
            comm.backend()
        );
        println!(
            "{:<10} {:<19} {:>10} {:>12} {:>10} {:>12} {:>10} {:>7}",
            "op", "algo", "bytes", "ours_us", "ours_bw", "mpi_us", "mpi_bw", "ratio"
        );
    }
    let mut bytes = a.min.max(4 * p);
    while bytes <= a.max {
        let n = bytes / 4;
        let iters = ((64usize << 20) / bytes).clamp(2, 20);
        let mut buf = vec![1f32; n];
        let mut out = vec![0f32; n];
        let ar_bw = |t: f64| bytes as f64 * 2.0 * (p as f64 - 1.0) / p as f64 / t / 1e9;
        let mpi_ar = match native {
            Some(nat) => {
                let send = vec![1f32; n];
                Some(time(comm, iters, &barrier, || {
                    nat.allreduce(&send, &mut out);
                    Ok(())
                })?)
            }
            None => None,
        };
        for algo in &algos {
            if !want(algo.name()) {
                continue;
            }
            let t = match algo {
                AllreduceAlgo::Torus2d { .. } => time(comm, iters, &barrier, || {
                    allreduce_hier(&hier, &mut buf, &opts)
                })?,
                _ => time(comm, iters, &barrier, || {
                    allreduce(comm, &mut buf, *algo, &opts)
                })?,
            };
            if r0 {
                row(
                    "allreduce",
                    algo.name(),
                    bytes,
                    t,
                    ar_bw(t),
                    mpi_ar.map(|m| (m, ar_bw(m))),
                );
            }
        }
        if want("auto") {
            // The chooser's pick for (P, bytes), named in the row.
            let algo = choose_allreduce(p, bytes, None);
            let t = time(comm, iters, &barrier, || {
                allreduce(comm, &mut buf, algo, &opts)
            })?;
            if r0 {
                let name = format!("auto={}", algo.name());
                row(
                    "allreduce",
                    &name,
                    bytes,
                    t,
                    ar_bw(t),
                    mpi_ar.map(|m| (m, ar_bw(m))),
                );
            }
        }
        // All-gather: each rank contributes bytes / P.
        let m = n / p;
        let total = m * p * 4;
        let ag_bw = |t: f64| total as f64 * (p as f64 - 1.0) / p as f64 / t / 1e9;
        let mine = vec![1f32; m];
        let mut all = vec![0f32; m * p];
        let mpi_ag = match native {
            Some(nat) => Some(time(comm, iters, &barrier, || {
                nat.allgather(&mine, &mut all);
                Ok(())
            })?),
            None => None,
        };
        for algo in AllgatherAlgo::ALL {
            if !want(algo.name()) {
                continue;
            }
            let t = time(comm, iters, &barrier, || {
                allgather(comm, &mine, &mut all, algo, &opts)
            })?;
            if r0 {
                row(
                    "allgather",
                    algo.name(),
                    total,
                    t,
                    ag_bw(t),
                    mpi_ag.map(|m| (m, ag_bw(m))),
                );
            }
        }
        bytes *= 4;
    }
    Ok(())
}

fn row(op: &str, algo: &str, bytes: usize, t: f64, bw: f64, mpi: Option<(f64, f64)>) {
    match mpi {
        Some((mt, mbw)) => println!(
            "{op:<10} {algo:<19} {bytes:>10} {:>12.1} {bw:>10.3} {:>12.1} {mbw:>10.3} {:>7.2}",
            t * 1e6,
            mt * 1e6,
            bw / mbw
        ),
        None => println!(
            "{op:<10} {algo:<19} {bytes:>10} {:>12.1} {bw:>10.3} {:>12} {:>10} {:>7}",
            t * 1e6,
            "-",
            "-",
            "-"
        ),
    }
}

#[cfg(feature = "mpi")]
fn main() {
    let a = args();
    let comm = collectives::MpiComm::world().expect("MPI init");
    let nat = native::Mpi(comm.raw());
    if let Err(e) = bench(&comm, Some(&nat), &a) {
        eprintln!("rank {}: {e}", comm.rank());
        comm.abort(1);
    }
}

#[cfg(not(feature = "mpi"))]
fn main() {
    let a = args();
    let p = a.threads.max(1);
    if let Err(e) = collectives::ThreadComm::run(p, |comm| bench(&comm, None, &a)) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
