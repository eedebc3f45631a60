//! Dense all-reduce and all-gather algorithms over ThreadComm (P = 4). For the comparison
//! against the MPI library, see `examples/dense_bench.rs` under `mpirun`.

use std::time::{Duration, Instant};

use collectives::dense::{allgather, allreduce, AllgatherAlgo, AllreduceAlgo, DenseOptions};
use collectives::{Communicator, ThreadComm};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const P: usize = 4;

/// Slowest rank's time for `iters` calls, all ranks running inside one ThreadComm world.
fn run(iters: u64, f: impl Fn(&ThreadComm) -> collectives::Result<()> + Sync) -> Duration {
    ThreadComm::run(P, |c| -> collectives::Result<Duration> {
        f(&c)?;
        c.barrier()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            f(&c)?;
        }
        Ok(t0.elapsed())
    })
    .expect("benchmark world")
    .into_iter()
    .max()
    .unwrap_or_default()
}

fn bench_allreduce(c: &mut Criterion) {
    let mut g = c.benchmark_group("dense_allreduce_p4");
    g.sample_size(10);
    for bytes in [64usize << 10, 1 << 20] {
        g.throughput(Throughput::Bytes(bytes as u64));
        for algo in AllreduceAlgo::all(P) {
            g.bench_with_input(BenchmarkId::new(algo.name(), bytes), &bytes, |b, &bytes| {
                b.iter_custom(|iters| {
                    run(iters, |c| {
                        let mut buf = vec![1f32; bytes / 4];
                        allreduce(c, &mut buf, algo, &DenseOptions::default().unchecked())
                    })
                })
            });
        }
    }
    g.finish();
}

fn bench_allgather(c: &mut Criterion) {
    let mut g = c.benchmark_group("dense_allgather_p4");
    g.sample_size(10);
    let bytes = 1usize << 20;
    g.throughput(Throughput::Bytes(bytes as u64));
    for algo in AllgatherAlgo::ALL {
        g.bench_function(BenchmarkId::new(algo.name(), bytes), |b| {
            b.iter_custom(|iters| {
                run(iters, |c| {
                    let mine = vec![1f32; bytes / 4 / P];
                    let mut out = vec![0f32; bytes / 4];
                    allgather(
                        c,
                        &mine,
                        &mut out,
                        algo,
                        &DenseOptions::default().unchecked(),
                    )
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_allreduce, bench_allgather);
criterion_main!(benches);
