//! Every selector with error feedback fused, against the memory floor (`stream`:
//! `sparsify::accumulate`, `r[i] += g[i]` on the same threads as the selectors) and a naive exact
//! top-k (`naive`: accumulate, `select_nth_unstable_by` on a copy of `|x|`, gather, zero). The
//! residual is reset (untimed) before every iteration so each one sees the same input.
//!
//! `CARGO_TARGET_DIR=/work/tgt/sparsify cargo bench -p sparsify --bench selectors -- '2\^26.*0.001'`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use sparsify::{ExDyna, ExactTopK, HardThreshold, Selector, SelectorKind};

/// Heavy-tailed test gradient (u³, u uniform in [-1, 1]) from a xorshift stream.
fn gradient(d: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..d)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            u * u * u
        })
        .collect()
}

/// Times `f` over `iters` runs, resetting the residual to zero before each (untimed).
fn timed(iters: u64, r: &mut [f32], mut f: impl FnMut(&mut [f32])) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        r.fill(0.0);
        let t = Instant::now();
        f(r);
        total += t.elapsed();
    }
    total
}

fn naive(r: &mut [f32], g: &[f32], k: usize) -> usize {
    for (a, b) in r.iter_mut().zip(g) {
        *a += *b;
    }
    let mut a: Vec<f32> = r.iter().map(|v| v.abs()).collect();
    if k == 0 || k > a.len() {
        return 0;
    }
    let pos = a.len() - k;
    let (_, t, _) = a.select_nth_unstable_by(pos, |x, y| x.partial_cmp(y).expect("finite"));
    let t = *t;
    let mut idx = Vec::with_capacity(k);
    let mut val = Vec::with_capacity(k);
    for (i, v) in r.iter().enumerate() {
        if v.abs() >= t && idx.len() < k {
            idx.push(i as u32);
            val.push(*v);
        }
    }
    for &i in &idx {
        r[i as usize] = 0.0;
    }
    black_box(&val);
    idx.len()
}

fn bench(c: &mut Criterion) {
    // Small tensors too (a model's biases and norms, selected layer by layer), at the
    // densities of a warm-up schedule as well: their cost is mostly per call.
    let sizes = [
        (8u32, [0.01f64, 0.05]),
        (11, [0.01, 0.05]),
        (20, [0.001, 0.01]),
        (24, [0.001, 0.01]),
        (26, [0.001, 0.01]),
    ];
    for (log, densities) in sizes {
        let d = 1usize << log;
        let g = gradient(d);
        let mut r = vec![0.0f32; d];
        for density in densities {
            let k = (((d as f64) * density) as usize).max(1);
            // Threshold selectors get the true k-th magnitude, so they select about k.
            let kth = ExactTopK::new().select(&g, k).expect("finite").1.threshold;
            let mut group = c.benchmark_group(format!("d=2^{log}/density={density}"));
            group
                .sample_size(10)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(match log {
                    26.. => 6,
                    20.. => 2,
                    _ => 1,
                }));
            group.bench_function("stream", |b| {
                b.iter_custom(|n| {
                    timed(n, &mut r, |r| {
                        // Same threads and serial cut-off as the selectors' passes.
                        sparsify::accumulate(r, &g).expect("same length");
                        black_box(&r[0]);
                    })
                })
            });
            group.bench_function("naive", |b| {
                b.iter_custom(|n| {
                    timed(n, &mut r, |r| {
                        black_box(naive(r, &g, k));
                    })
                })
            });
            for kind in SelectorKind::ALL {
                let name = kind.name();
                let mut sel: Box<dyn Selector> = match kind {
                    SelectorKind::Threshold => Box::new(HardThreshold::new(kth).expect("finite")),
                    SelectorKind::ExDyna => {
                        let mut e = ExDyna::new();
                        e.set_threshold(kth);
                        Box::new(e)
                    }
                    _ => kind.build(42),
                };
                group.bench_function(name, |b| {
                    b.iter_custom(|n| {
                        timed(n, &mut r, |r| {
                            let out = sel.select_fused(r, &g, k).expect("finite");
                            black_box(out);
                        })
                    })
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
