//! Dense collectives under ThreadComm: every algorithm equals a sequential f64 reference
//! within f32 rounding, all ranks are bit-identical, for P in 1..=17 and small random
//! lengths; bad input gives the same typed error on every rank.

#[path = "support/dense_ref.rs"]
mod dense_ref;

use collectives::dense::{
    allgather, allgatherv, allreduce, allreduce_hier, block_range, broadcast, reduce,
    reduce_scatter, AllgatherAlgo, AllreduceAlgo, BroadcastAlgo, DenseOptions, HierComm,
    ReduceAlgo, ReduceScatterAlgo, WireType,
};
use collectives::{Communicator, Error, ThreadComm, ThreadConfig};
use dense_ref::{input, reference};
use proptest::prelude::*;
use std::time::Duration;

/// Unit roundoff of the wire type (f32 accumulation adds 2^-24 per step on top).
fn eps(w: WireType) -> f64 {
    match w {
        WireType::F32 => 2f64.powi(-24),
        WireType::F16 => 2f64.powi(-11),
        WireType::Bf16 => 2f64.powi(-8),
    }
}

fn close(got: &[f32], sum: &[f64], mag: &[f64], p: usize, w: WireType) -> Result<(), String> {
    if got.len() != sum.len() {
        return Err(format!("length {} vs {}", got.len(), sum.len()));
    }
    // Each of the ≤ 2P + 2 roundings (adds, wire conversions) errs by eps · (partial ≤ Σ|x|).
    let k = (2 * p + 2) as f64;
    for i in 0..got.len() {
        let tol = k * (eps(w) + 2f64.powi(-24)) * mag[i] + 1e-30;
        if (got[i] as f64 - sum[i]).abs() > tol {
            return Err(format!(
                "elem {i}: got {} want {} (tol {tol})",
                got[i], sum[i]
            ));
        }
    }
    Ok(())
}

fn cfg() -> ThreadConfig {
    ThreadConfig::with_timeout(Duration::from_secs(20))
}

fn all_algos(p: usize) -> Vec<AllreduceAlgo> {
    let mut v = vec![
        AllreduceAlgo::Ring,
        AllreduceAlgo::RecursiveDoubling,
        AllreduceAlgo::Rabenseifner,
        AllreduceAlgo::BidirectionalExchange,
        AllreduceAlgo::Binomial,
        AllreduceAlgo::LinearPipeline { block_bytes: 12 },
        AllreduceAlgo::LinearPipeline {
            block_bytes: 1 << 16,
        },
    ];
    for rpn in 1..=p {
        if p % rpn == 0 {
            v.push(AllreduceAlgo::Torus2d {
                ranks_per_node: rpn,
            });
        }
    }
    v
}

/// Runs every all-reduce algorithm with `wire` on P ranks; checks the reference and bits.
fn check_allreduce(p: usize, n: usize, seed: u64, wire: WireType) -> Result<(), String> {
    let algos = all_algos(p);
    let opts = DenseOptions::with_wire(wire);
    let algos2 = algos.clone();
    let out = ThreadComm::run_with(
        p,
        cfg(),
        move |comm| -> collectives::Result<Vec<Vec<f32>>> {
            let comm = &comm;
            let mut res = Vec::new();
            for a in &algos2 {
                let mut buf = input(seed, comm.rank(), n);
                allreduce(comm, &mut buf, *a, &opts)?;
                res.push(buf);
            }
            Ok(res)
        },
    )
    .map_err(|e| format!("p={p} n={n}: {e}"))?;
    let (sum, mag) = reference(seed, p, n);
    for (ai, a) in algos.iter().enumerate() {
        let bits0: Vec<u32> = out[0][ai].iter().map(|x| x.to_bits()).collect();
        for (r, rank_out) in out.iter().enumerate() {
            close(&rank_out[ai], &sum, &mag, p, wire)
                .map_err(|e| format!("{a:?} p={p} n={n} rank {r} {wire:?}: {e}"))?;
            let bits: Vec<u32> = rank_out[ai].iter().map(|x| x.to_bits()).collect();
            if bits != bits0 {
                return Err(format!(
                    "{a:?} p={p} n={n} {wire:?}: rank {r} differs from rank 0"
                ));
            }
        }
    }
    Ok(())
}

/// Every other collective on P ranks: all-gather (fixed and variable), reduce-scatter,
/// broadcast from each root, reduce to each root.
fn check_others(p: usize, n: usize, seed: u64) -> Result<(), String> {
    let out = ThreadComm::run_with(p, cfg(), move |comm| -> collectives::Result<Vec<String>> {
        let comm = &comm;
        let r = comm.rank();
        let o = DenseOptions::default();
        let mut errs = Vec::new();
        let mine = input(seed, r, n);
        // Equal-count all-gather.
        for a in AllgatherAlgo::ALL {
            let mut out = vec![0f32; n * p];
            allgather(comm, &mine, &mut out, a, &o)?;
            for q in 0..p {
                if out[q * n..(q + 1) * n] != input(seed, q, n)[..] {
                    errs.push(format!("allgather {a:?} block {q}"));
                }
            }
            // Variable counts: rank q gives (n + q) % 5 elements (some zero).
            let cnt = |q: usize| (n + 3 * q) % 5;
            let g = allgatherv(comm, &input(seed, r, cnt(r)), a)?;
            for q in 0..p {
                if g.part(q) != &input(seed, q, cnt(q))[..] {
                    errs.push(format!("allgatherv {a:?} part {q}"));
                }
            }
        }
        let (sum, mag) = reference(seed, p, n);
        for a in ReduceScatterAlgo::ALL {
            let mut buf = mine.clone();
            let range = reduce_scatter(comm, &mut buf, a, &o)?;
            if range != block_range(n, p, r) {
                errs.push(format!("reduce_scatter {a:?} range {range:?}"));
            }
            if let Err(e) = close(
                &buf[range.clone()],
                &sum[range.clone()],
                &mag[range],
                p,
                WireType::F32,
            ) {
                errs.push(format!("reduce_scatter {a:?}: {e}"));
            }
        }
        for root in 0..p {
            for a in [
                BroadcastAlgo::Binomial,
                BroadcastAlgo::ScatterAllgather,
                BroadcastAlgo::LinearPipeline { block_bytes: 8 },
            ] {
                let mut buf = if r == root {
                    input(seed, root, n)
                } else {
                    vec![0f32; n]
                };
                broadcast(comm, &mut buf, root, a, &o)?;
                if buf != input(seed, root, n) {
                    errs.push(format!("broadcast {a:?} root {root}"));
                }
            }
            for a in [
                ReduceAlgo::Binomial,
                ReduceAlgo::LinearPipeline { block_bytes: 8 },
                ReduceAlgo::BidirectionalExchange,
            ] {
                let mut buf = mine.clone();
                reduce(comm, &mut buf, root, a, &o)?;
                if r == root {
                    if let Err(e) = close(&buf, &sum, &mag, p, WireType::F32) {
                        errs.push(format!("reduce {a:?} root {root}: {e}"));
                    }
                }
            }
        }
        Ok(errs)
    })
    .map_err(|e| format!("p={p} n={n}: {e}"))?;
    let errs: Vec<String> = out.into_iter().flatten().collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("p={p} n={n}: {errs:?}"))
    }
}

#[test]
fn allreduce_every_p_edge_lengths() {
    for p in 1usize..=17 {
        for n in [0, 1, p.saturating_sub(1), p + 1, 2 * p + 3] {
            check_allreduce(p, n, 7 + p as u64, WireType::F32).unwrap();
        }
    }
}

#[test]
fn allreduce_half_wire_every_p() {
    for p in 1usize..=17 {
        for w in [WireType::F16, WireType::Bf16] {
            check_allreduce(p, 2 * p + 1, 11, w).unwrap();
        }
    }
}

#[test]
fn other_collectives_every_p() {
    for p in 1usize..=17 {
        for n in [0, p + 2] {
            check_others(p, n, 3 + p as u64).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn allreduce_random(p in 1usize..=17, n in 0usize..60, seed in any::<u64>(), w in 0usize..3) {
        let wire = [WireType::F32, WireType::F16, WireType::Bf16][w];
        prop_assert_eq!(check_allreduce(p, n, seed, wire), Ok(()));
    }

    #[test]
    fn others_random(p in 1usize..=12, n in 0usize..40, seed in any::<u64>()) {
        prop_assert_eq!(check_others(p, n, seed), Ok(()));
    }
}

/// Every rank's own result, for "same typed error on every rank". The inner result is
/// passed through as a value so that ThreadComm does not cut the other ranks short when
/// one returns first (its abort-on-failure rule); each rank must find the error itself.
fn each_rank<T: Send + 'static>(
    p: usize,
    f: impl Fn(&dyn Communicator) -> collectives::Result<T> + Send + Sync + 'static,
) -> Vec<collectives::Result<T>> {
    ThreadComm::run_all(p, cfg(), move |c| Ok::<_, std::convert::Infallible>(f(&c)))
        .unwrap()
        .into_iter()
        .map(|r| match r {
            Ok(inner) => inner,
            Err(never) => match never {},
        })
        .collect()
}

/// Asserts that every rank's result is an error that `want` accepts.
fn assert_every_rank<T: std::fmt::Debug>(
    res: &[collectives::Result<T>],
    want: impl Fn(&Error) -> bool,
) {
    assert!(res.iter().all(|r| r.as_ref().is_err_and(&want)), "{res:?}");
}

#[test]
fn mismatched_lengths_fail_on_every_rank() {
    for algo in all_algos(4) {
        let res = each_rank(4, move |c| {
            let mut buf = vec![1f32; 10 + (c.rank() == 2) as usize];
            allreduce(c, &mut buf, algo, &DenseOptions::default())
        });
        for r in res {
            assert!(matches!(r, Err(Error::Mismatch { .. })), "{algo:?}: {r:?}");
        }
    }
    let res = each_rank(3, |c| {
        let mine = vec![1u32; 2 + c.rank()];
        let mut out = vec![0u32; 3 * mine.len()];
        allgather(
            c,
            &mine,
            &mut out,
            AllgatherAlgo::Ring,
            &DenseOptions::default(),
        )
    });
    assert_every_rank(&res, |e| matches!(e, Error::Mismatch { .. }));
    let res = each_rank(5, |c| {
        let algo = if c.rank() == 0 {
            AllreduceAlgo::Ring
        } else {
            AllreduceAlgo::Rabenseifner
        };
        allreduce(c, &mut [1.0; 4], algo, &DenseOptions::default())
    });
    assert_every_rank(&res, |e| {
        matches!(
            e,
            Error::Mismatch {
                what: "algorithm",
                ..
            }
        )
    });
}

#[test]
fn bad_parameters_fail_on_every_rank() {
    let allreduce_on = |p, algo| {
        each_rank(p, move |c| {
            allreduce(c, &mut [1.0; 4], algo, &DenseOptions::default())
        })
    };
    let res = allreduce_on(3, AllreduceAlgo::LinearPipeline { block_bytes: 0 });
    assert_every_rank(&res, |e| matches!(e, Error::InvalidArgument(_)));
    let res = allreduce_on(6, AllreduceAlgo::Torus2d { ranks_per_node: 4 });
    assert_every_rank(
        &res,
        |e| matches!(e, Error::Topology(m) if m.contains("does not divide")),
    );
    let res = each_rank(2, |c| {
        broadcast(
            c,
            &mut [1u8; 4],
            0,
            BroadcastAlgo::LinearPipeline { block_bytes: 0 },
            &DenseOptions::default(),
        )
    });
    assert_every_rank(&res, |e| matches!(e, Error::InvalidArgument(_)));
    let res = each_rank(2, |c| {
        reduce(
            c,
            &mut [1.0; 4],
            5,
            ReduceAlgo::Binomial,
            &DenseOptions::default(),
        )
    });
    assert_every_rank(&res, |e| matches!(e, Error::InvalidArgument(_)));
}

#[test]
fn hier_comm_is_reusable() {
    let out = ThreadComm::run(6, |c| -> collectives::Result<Vec<f32>> {
        let c = &c;
        let h = HierComm::new(c, 3)?;
        let mut buf = vec![c.rank() as f32; 7];
        allreduce_hier(&h, &mut buf, &DenseOptions::default())?;
        allreduce_hier(&h, &mut buf, &DenseOptions::default())?;
        Ok(buf)
    })
    .unwrap();
    assert!(out.iter().all(|b| b == &vec![90.0; 7]));
}
