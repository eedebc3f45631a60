//! Properties of the sparse allreduce algorithms under `ThreadComm`: bit-identical updates
//! on every rank, no gradient mass lost (or, for gTopk, exactly the reported mass lost),
//! density 1 equals the dense average, bad input is a typed error on every rank.
#![allow(clippy::needless_range_loop)]

use collectives::sparse::{build, Sag, SparseAlgo, StepStats};
use collectives::{Communicator, Error, ThreadComm, ThreadConfig};
use proptest::prelude::*;
use sparsify::SparseGrad;

#[path = "support/grads.rs"]
mod grads;

/// One rank's record of one step.
#[derive(Clone)]
struct Rec {
    grad: Vec<f32>,
    before: Vec<f32>,
    after: Vec<f32>,
    update: SparseGrad<f32>,
    stats: StepStats,
}

fn grad_for(seed: u64, rank: usize, step: usize, d: usize, zero: bool) -> Vec<f32> {
    if zero {
        return vec![0.0; d];
    }
    grads::structured(seed, rank, step, d, 7)
}

#[allow(clippy::too_many_arguments)]
fn run(
    name: &'static str,
    p: usize,
    d: usize,
    density: f64,
    algo: SparseAlgo,
    steps: usize,
    seed: u64,
    zero: bool,
) -> Vec<Vec<Rec>> {
    ThreadComm::run(p, |comm| -> collectives::Result<Vec<Rec>> {
        let mut alg = build(algo, &comm, d, density)?;
        let mut out = Vec::new();
        for s in 0..steps {
            let grad = grad_for(seed, comm.rank(), s, d, zero);
            let before = alg.residual().to_vec();
            let (update, stats) = alg.step(&comm, &grad)?;
            out.push(Rec {
                grad,
                before,
                after: alg.residual().to_vec(),
                update,
                stats,
            });
        }
        Ok(out)
    })
    .unwrap_or_else(|e| panic!("{name} P={p} d={d} density={density}: {e}"))
}

fn bits(u: &SparseGrad<f32>) -> (Vec<u32>, Vec<u32>) {
    (
        u.indices().to_vec(),
        u.values().iter().map(|v| v.to_bits()).collect(),
    )
}

/// Checks identical updates and mass conservation; returns the per-step mass gap.
fn check(name: &str, recs: &[Vec<Rec>], conserving: bool) {
    let p = recs.len();
    let steps = recs[0].len();
    for s in 0..steps {
        let u0 = &recs[0][s].update;
        for (r, rr) in recs.iter().enumerate() {
            assert_eq!(
                bits(&rr[s].update),
                bits(u0),
                "{name}: rank {r} step {s} differs from rank 0"
            );
        }
        let d = u0.len();
        let upd = u0.to_dense();
        let mut gap_sum = 0.0f64;
        let mut scale = 0.0f64;
        let mut worst = 0.0f64;
        for i in 0..d {
            let mut lhs = 0.0f64;
            let mut rhs = p as f64 * upd[i] as f64;
            let mut mag = rhs.abs();
            for rr in recs {
                let x = &rr[s];
                lhs += x.grad[i] as f64 + x.before[i] as f64;
                rhs += x.after[i] as f64;
                mag += (x.grad[i] as f64).abs()
                    + (x.before[i] as f64).abs()
                    + (x.after[i] as f64).abs();
            }
            gap_sum += lhs - rhs;
            scale += mag;
            if conserving {
                let tol = 1e-5 * mag + 1e-6;
                worst = worst.max((lhs - rhs).abs() - tol);
                assert!(
                    (lhs - rhs).abs() <= tol,
                    "{name}: P={p} step {s} index {i}: inputs+residuals {lhs} vs P·update+residuals {rhs}"
                );
            }
        }
        let reported: f64 = recs.iter().map(|rr| rr[s].stats.mass_dropped).sum();
        assert!(
            (gap_sum - reported).abs() <= 1e-5 * scale + 1e-5,
            "{name}: P={p} step {s}: lost mass {gap_sum}, reported {reported}"
        );
        for rr in recs {
            let st = &rr[s].stats;
            assert_eq!(st.nnz, u0.nnz());
        }
    }
}

/// Non-vacuity: every step `s` with `exact(s)` of a run on non-zero gradients moved
/// something. For Ok-Topk those are the steps whose selection was an exact top-k: between
/// re-estimations it reuses its global threshold, which may pass nothing in a step (the
/// mass then waits in the residuals, as in the authors' code).
fn assert_moves(name: &str, recs: &[Vec<Rec>], exact: impl Fn(usize) -> bool) {
    for (s, r) in recs[0].iter().enumerate().filter(|(s, _)| exact(*s)) {
        assert!(
            r.update.nnz() > 0,
            "{name}: P={} step {s}: empty update from non-zero gradients",
            recs.len()
        );
    }
}

/// The algorithm `name` with options that fit P (teams dividing P, one node or two).
fn opts_for(name: &str, p: usize) -> SparseAlgo {
    let mut a: SparseAlgo = name.parse().unwrap();
    match &mut a {
        SparseAlgo::HiTopK { ranks_per_node, .. } if p % 2 == 0 => *ranks_per_node = Some(p / 2),
        SparseAlgo::SparDl {
            sag: Sag::Bruck,
            teams,
            ..
        } if p % 3 == 0 && p > 3 => *teams = Some(3),
        SparseAlgo::SparDl {
            sag: Sag::Recursive,
            teams,
            ..
        } if p % 4 == 0 => *teams = Some(4),
        _ => {}
    }
    a
}

fn available() -> Vec<&'static str> {
    SparseAlgo::ALL.iter().map(|a| a.name()).collect()
}

/// The algorithm `name` with default options.
fn algo(name: &str) -> SparseAlgo {
    name.parse().unwrap()
}

fn conserving(name: &str) -> bool {
    name != "gtopk"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn identical_and_mass_conserving(p in 1usize..=17, extra in 0usize..200, dens_i in 0usize..4, seed in any::<u64>()) {
        let d = p + extra + 8 * p;
        let density = [0.05, 0.1, 0.3, 0.01][dens_i];
        for name in available() {
            let recs = run(name, p, d, density, opts_for(name, p), 3, seed, false);
            check(name, &recs, conserving(name));
            assert_moves(name, &recs, |s| name != "oktopk" || s == 0);
        }
        // Ok-Topk with short periods: re-estimation and re-balancing in every combination.
        for (tau, rebalance) in [(1u32, 2u32), (2, 1), (2, 3)] {
            let ok = SparseAlgo::OkTopk { tau, rebalance };
            let recs = run("oktopk", p, d, density, ok, 4, seed, false);
            check("oktopk", &recs, true);
            assert_moves("oktopk", &recs, |s| s as u32 % tau == 0);
        }
    }
}

#[test]
fn every_algorithm_at_small_fixed_sizes() {
    for p in [1, 2, 3, 4, 5, 6, 7, 8, 9, 12] {
        for name in available() {
            let recs = run(name, p, 40 * p + 3, 0.1, opts_for(name, p), 3, 7, false);
            check(name, &recs, conserving(name));
            assert_moves(name, &recs, |s| name != "oktopk" || s == 0);
        }
    }
}

#[test]
fn density_one_equals_dense_average() {
    for p in [1, 2, 3, 5, 6, 8] {
        let d = 13 * p + 5;
        for name in available() {
            // The f32 wire: with density 1 the update is the exact dense average (the f16
            // wire's rounding is checked in `hitopk_f16_wire_is_identical_on_every_rank`).
            let mut o = opts_for(name, p);
            if let SparseAlgo::HiTopK { f16_wire, .. } = &mut o {
                *f16_wire = false;
            }
            let recs = run(name, p, d, 1.0, o, 2, 11, false);
            check(name, &recs, true);
            for s in 0..2 {
                let upd = recs[0][s].update.to_dense();
                for i in 0..d {
                    let avg: f64 = recs
                        .iter()
                        .map(|r| r[s].grad[i] as f64 + r[s].before[i] as f64)
                        .sum::<f64>()
                        / p as f64;
                    assert!(
                        (upd[i] as f64 - avg).abs() <= 1e-5 * (1.0 + avg.abs()),
                        "{name}: P={p} step {s} index {i}: {} vs dense average {avg}",
                        upd[i]
                    );
                }
                assert!(
                    recs.iter()
                        .all(|r| r[s].after.iter().all(|&x| x.abs() < 1e-5)),
                    "{name}: residual left at density 1"
                );
            }
        }
    }
}

#[test]
fn all_zero_gradient_gives_empty_update() {
    for p in [1, 3, 4] {
        for name in available() {
            let recs = run(name, p, 50 * p, 0.1, opts_for(name, p), 2, 3, true);
            for r in &recs {
                for x in r {
                    assert_eq!(x.update.nnz(), 0, "{name} P={p}");
                }
            }
        }
    }
}

#[test]
fn gtopk_reports_dropped_mass() {
    // Heavily overlapping top-k sets with different magnitudes make merges drop entries.
    let recs = run("gtopk", 8, 400, 0.05, algo("gtopk"), 3, 5, false);
    check("gtopk", &recs, false);
    let total: f64 = recs.iter().map(|r| r[0].stats.mass_dropped.abs()).sum();
    assert!(total > 0.0, "expected gTopk to drop some mass");
}

fn run_all_errors(
    p: usize,
    f: impl Fn(&dyn Communicator) -> collectives::Result<()> + Sync,
) -> Vec<collectives::Result<()>> {
    ThreadComm::run_all(
        p,
        ThreadConfig::with_timeout(std::time::Duration::from_secs(20)),
        |comm| f(&comm),
    )
    .unwrap()
}

#[test]
fn bad_input_is_an_error_on_every_rank() {
    // Different d on one rank.
    for name in available() {
        let res = run_all_errors(4, |comm| {
            let d = if comm.rank() == 2 { 101 } else { 100 };
            build(algo(name), comm, d, 0.1).map(|_| ())
        });
        assert!(
            res.iter().all(|r| matches!(r, Err(Error::Mismatch { .. }))),
            "{name}: {res:?}"
        );
    }
    // Different density on one rank.
    let res = run_all_errors(3, |comm| {
        let dens = if comm.rank() == 0 { 0.2 } else { 0.1 };
        build(algo("spardl"), comm, 100, dens).map(|_| ())
    });
    assert!(
        res.iter().all(|r| matches!(r, Err(Error::Mismatch { .. }))),
        "{res:?}"
    );
    // Density outside (0, 1], d < P: the same InvalidArgument everywhere.
    for (name, d, dens) in [
        ("topka", 100, 0.0),
        ("exdyna", 100, 1.5),
        ("gtopk", 100, f64::NAN),
        ("spardl", 3, 0.1),
    ] {
        let res = run_all_errors(4, |comm| build(algo(name), comm, d, dens).map(|_| ()));
        assert!(
            res.iter()
                .all(|r| matches!(r, Err(Error::InvalidArgument(_)))),
            "{name} {d} {dens}: {res:?}"
        );
    }
    // Teams that do not divide P, R-SAG teams not a power of two, nodes not dividing P.
    let bad = [
        SparseAlgo::SparDl {
            sag: Sag::Bruck,
            teams: Some(4),
            selector: None,
        },
        SparseAlgo::SparDl {
            sag: Sag::Recursive,
            teams: Some(3),
            selector: None,
        },
        SparseAlgo::HiTopK {
            ranks_per_node: Some(4),
            f16_wire: false,
            selector: None,
        },
        SparseAlgo::OkTopk {
            tau: 0,
            rebalance: 64,
        },
        SparseAlgo::OkTopk {
            tau: 32,
            rebalance: 0,
        },
    ];
    for o in bad {
        let name = o.name();
        let res = run_all_errors(6, |comm| build(o, comm, 100, 0.1).map(|_| ()));
        assert!(
            res.iter()
                .all(|r| matches!(r, Err(Error::InvalidArgument(_)))),
            "{name}: {res:?}"
        );
    }
    // Different Ok-Topk periods on one rank.
    let res = run_all_errors(4, |comm| {
        let tau = if comm.rank() == 3 { 16 } else { 32 };
        let ok = SparseAlgo::OkTopk { tau, rebalance: 64 };
        build(ok, comm, 100, 0.1).map(|_| ())
    });
    assert!(
        res.iter().all(|r| matches!(r, Err(Error::Mismatch { .. }))),
        "{res:?}"
    );
    // A different algorithm on one rank.
    let res = run_all_errors(3, |comm| {
        let name = if comm.rank() == 1 { "topka" } else { "gtopk" };
        build(algo(name), comm, 100, 0.1).map(|_| ())
    });
    assert!(
        res.iter().all(|r| matches!(r, Err(Error::Mismatch { .. }))),
        "{res:?}"
    );
}

#[test]
fn hitopk_f16_wire_is_identical_on_every_rank() {
    let o = SparseAlgo::HiTopK {
        ranks_per_node: Some(2),
        f16_wire: true,
        selector: None,
    };
    let recs = run("hitopk", 6, 600, 0.05, o, 3, 9, false);
    // Identical on every rank, and the mass balances index by index: the rounding of the
    // partial sums each rank sent stays in its residual.
    check("hitopk", &recs, true);
    for s in 0..3 {
        assert!(recs[0][s].update.nnz() > 0);
    }
    // Not vacuous: the wire did round, and that rounding sits outside the slices
    // (rank 0 owns slice 0 of its node, elements 0..300).
    let rounded = recs[0][2].after[300..]
        .iter()
        .filter(|&&x| x != 0.0)
        .count();
    assert!(rounded > 0, "the f16 wire never rounded anything");
}

#[test]
fn bsag_adjusts_h_within_its_bounds() {
    use collectives::sparse::{SparDl, SparseAllreduce};
    let hs = ThreadComm::run(6, |comm| -> collectives::Result<Vec<(f64, usize, usize)>> {
        let mut alg = SparDl::new(&comm, 1200, 0.05, Sag::Bruck, Some(3), None)?;
        let mut out = Vec::new();
        for s in 0..12 {
            let g = grad_for(4, comm.rank(), s, 1200, false);
            alg.step(&comm, &g)?;
            out.push((alg.h(), alg.last_gathered(), alg.k_block()));
        }
        Ok(out)
    })
    .unwrap();
    let (h0, _, l) = hs[0][0];
    assert!(hs[0].iter().any(|&(h, _, _)| h != h0), "h never moved");
    for rank in &hs {
        for &(h, n, kb) in rank {
            assert!(h >= kb as f64 / 3.0 - 1e-9 && h <= kb as f64 + 1e-9);
            assert!(n >= 1);
        }
    }
    // Ranks at the same team position agree on h (they see the same N_t).
    assert_eq!(hs[0], hs[2]);
    assert_eq!(hs[0], hs[4]);
    assert!(l > 0);
}

#[test]
fn topkdsa_turns_dense_when_blocks_fill_in() {
    use collectives::sparse::{SparseAllreduce, TopkDsa};
    let dense = ThreadComm::run(4, |comm| -> collectives::Result<usize> {
        let mut alg = TopkDsa::new(&comm, 400, 0.4, None)?;
        let g = grad_for(1, comm.rank(), 0, 400, false);
        alg.step(&comm, &g)?;
        Ok(alg.dense_blocks())
    })
    .unwrap();
    assert!(dense.iter().all(|&n| n > 0), "{dense:?}");
}
