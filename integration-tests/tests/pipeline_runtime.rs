//! The pipeline runtime (`pipeline::Reducer`, OMGS-SGD (Shi et al., INFOCOM 2020) Algorithm 2)
//! driven layer by layer from a fake backward pass, with a merge plan from a planner on a small
//! profile, over `ThreadComm`, for the dense ring all-reduce, the built-in TopK all-gather scheme
//! and a `collectives::sparse` algorithm (SparDL) as the group exchange.
//!
//! Checked: the averaged gradients are bit-identical on every rank; dense (and every
//! scheme at density 1) equals the dense average; the TopK all-gather scheme at density
//! < 1 equals an independent single-process reference that applies error feedback and
//! exact top-k per merged group (so a wrong group layout or offset shows up); SparDL's
//! output conserves mass over iterations within each group's support.

// (iteration, layer) index pairs address several parallel arrays at once.
#![allow(clippy::needless_range_loop)]

use collectives::sparse::{Sag, SparseAlgo};
use collectives::Communicator;
use integration_tests::{assert_close, bits, grad, mean_f64, run_ranks, split, AnyResult};
use pipeline::schemes::CollectiveScheme;
use pipeline::{
    DenseAllreduce, LayerProfile, MergePlan, Planner, Scheme, SimpleCosts, TopkAllgather,
};
use sparsify::{ErrorFeedback, ExactTopK};

/// Layer sizes (forward order) and per-layer backward times of a small fake model.
const SIZES: [usize; 7] = [30, 5, 64, 8, 40, 3, 12];
const BACKWARD_S: [f64; 7] = [2e-3, 1e-4, 3e-3, 1e-4, 2e-3, 1e-4, 1e-3];
const ITERS: usize = 3;
const SEED: u64 = 77;

/// A plan from the exact planner under costs where merging pays (a large startup α), so
/// the plan has merged groups; falls back to a threshold plan if the planner chose
/// layer-wise, so the test always exercises multi-layer groups.
fn plan() -> MergePlan {
    let layers = SIZES
        .iter()
        .zip(BACKWARD_S)
        .enumerate()
        .map(|(i, (&numel, b))| pipeline::Layer {
            name: format!("layer{i}"),
            numel,
            backward_s: b,
        })
        .collect();
    let profile = LayerProfile::new("fake", 1e-3, layers).expect("valid profile");
    let costs = SimpleCosts {
        gamma: 1e-7,
        alpha: 1.5e-3,
        beta: 1e-6,
    };
    let plan = Planner::Exact.plan(&profile, &costs).expect("plan");
    plan.check_layers(SIZES.len())
        .expect("plan fits the layers");
    let plan = if plan.num_groups() < SIZES.len() && plan.num_groups() > 1 {
        plan
    } else {
        Planner::Threshold(60)
            .plan(&profile, &costs)
            .expect("threshold plan")
    };
    assert!(plan.num_groups() > 1 && plan.num_groups() < SIZES.len());
    plan
}

fn layer_grad(rank: usize, iter: usize, layer: usize) -> Vec<f32> {
    grad(SIZES[layer], rank, iter * 100 + layer, SEED)
}

/// Runs `ITERS` iterations of a fake backward (layers L−1 … 0) on every rank; returns
/// `[rank][iter][layer]` averaged gradients.
fn drive(p: usize, plan: &MergePlan, scheme: &(dyn Scheme + Sync)) -> Vec<Vec<Vec<Vec<f32>>>> {
    run_ranks(p, |comm| -> AnyResult<Vec<Vec<Vec<f32>>>> {
        let r = comm.rank();
        let mut red = pipeline::Reducer::new(comm, &SIZES, plan.clone(), scheme)?;
        let mut out = Vec::new();
        for it in 0..ITERS {
            red.begin()?;
            red.forward_done()?;
            for l in (0..SIZES.len()).rev() {
                red.ready(l, &layer_grad(r, it, l))?;
            }
            out.push(red.finish()?);
            let t = red.last_timeline().ok_or("no timeline recorded")?;
            if t.groups.len() != plan.num_groups() {
                return Err(format!(
                    "timeline has {} groups, plan {}",
                    t.groups.len(),
                    plan.num_groups()
                )
                .into());
            }
        }
        drop(red.shutdown()?);
        Ok(out)
    })
}

fn assert_identical_across_ranks(outs: &[Vec<Vec<Vec<f32>>>], what: &str) {
    for (r, o) in outs.iter().enumerate() {
        for (it, layers) in o.iter().enumerate() {
            for (l, g) in layers.iter().enumerate() {
                assert_eq!(g.len(), SIZES[l], "{what}: rank {r} layer {l} length");
                assert_eq!(
                    bits(g),
                    bits(&outs[0][it][l]),
                    "{what}: rank {r}, iteration {it}, layer {l} differs"
                );
            }
        }
    }
}

fn assert_dense_average(p: usize, outs: &[Vec<Vec<Vec<f32>>>], what: &str) {
    for it in 0..ITERS {
        for l in 0..SIZES.len() {
            let all: Vec<Vec<f32>> = (0..p).map(|r| layer_grad(r, it, l)).collect();
            assert_close(
                &outs[0][it][l],
                &mean_f64(&all),
                1e-5,
                1e-6,
                &format!("{what}: iteration {it} layer {l} vs dense average"),
            );
        }
    }
}

#[test]
fn dense_scheme_averages_over_a_planned_merge() {
    let plan = plan();
    for p in [3, 4] {
        let outs = drive(p, &plan, &DenseAllreduce);
        let what = format!("dense P={p} plan {:?}", plan.groups());
        assert_identical_across_ranks(&outs, &what);
        assert_dense_average(p, &outs, &what);
    }
}

/// SparDL with its default options.
const SPARDL: SparseAlgo = SparseAlgo::SparDl {
    sag: Sag::None,
    teams: None,
    selector: None,
};

#[test]
fn sparse_schemes_at_density_one_equal_the_dense_average() {
    let plan = plan();
    let topk = TopkAllgather { density: 1.0 };
    let spardl = CollectiveScheme {
        algo: SPARDL,
        density: 1.0,
    };
    let schemes: [(&str, &(dyn Scheme + Sync)); 2] =
        [("topk-allgather", &topk), ("spardl", &spardl)];
    for p in [3, 4] {
        for (name, scheme) in schemes {
            let outs = drive(p, &plan, scheme);
            let what = format!("{name} ρ=1 P={p}");
            assert_identical_across_ranks(&outs, &what);
            assert_dense_average(p, &outs, &what);
        }
    }
}

/// Independent reference of the TopK all-gather scheme: per group (layers concatenated in
/// forward order), per rank error feedback + exact top-⌈ρ·n⌉, summed over ranks / P.
fn topk_scheme_reference(p: usize, plan: &MergePlan, density: f64) -> Vec<Vec<Vec<f64>>> {
    let mut fbs: Vec<Vec<ErrorFeedback>> = (0..p)
        .map(|_| {
            (0..plan.num_groups())
                .map(|g| ErrorFeedback::new(plan.range(g).map(|l| SIZES[l]).sum()))
                .collect()
        })
        .collect();
    let mut sel = ExactTopK::new();
    (0..ITERS)
        .map(|it| {
            let mut layers = vec![Vec::new(); SIZES.len()];
            for g in 0..plan.num_groups() {
                let range = plan.range(g);
                let n: usize = range.clone().map(|l| SIZES[l]).sum();
                let k = ((density * n as f64).ceil() as usize).clamp(1, n);
                let mut sum = vec![0.0f64; n];
                for (r, fb) in fbs.iter_mut().enumerate() {
                    let buf: Vec<f32> = range.clone().flat_map(|l| layer_grad(r, it, l)).collect();
                    let (sg, _) = fb[g].step(&mut sel, &buf, k).expect("reference top-k");
                    for (&i, &v) in sg.indices().iter().zip(sg.values()) {
                        sum[i as usize] += f64::from(v);
                    }
                }
                let mut at = 0;
                for l in range {
                    layers[l] = sum[at..at + SIZES[l]]
                        .iter()
                        .map(|s| s / p as f64)
                        .collect();
                    at += SIZES[l];
                }
            }
            layers
        })
        .collect()
}

#[test]
fn topk_allgather_scheme_matches_a_per_group_reference() {
    let plan = plan();
    let density = 0.15;
    for p in [3, 4] {
        let outs = drive(p, &plan, &TopkAllgather { density });
        let what = format!("topk-allgather ρ={density} P={p} plan {:?}", plan.groups());
        assert_identical_across_ranks(&outs, &what);
        let want = topk_scheme_reference(p, &plan, density);
        for it in 0..ITERS {
            for l in 0..SIZES.len() {
                assert_close(
                    &outs[0][it][l],
                    &want[it][l],
                    1e-5,
                    1e-6,
                    &format!("{what}: iteration {it} layer {l}"),
                );
            }
        }
    }
}

/// `collectives::sparse` SparDL run directly, one instance per merged group; rank 0's
/// `[iter][layer]` result.
fn spardl_direct(p: usize, plan: &MergePlan, density: f64) -> Vec<Vec<Vec<f32>>> {
    let outs = run_ranks(p, |comm| -> AnyResult<Vec<Vec<Vec<f32>>>> {
        let r = comm.rank();
        let groups = plan.num_groups();
        let mut algs = Vec::new();
        for g in 0..groups {
            let n: usize = plan.range(g).map(|l| SIZES[l]).sum();
            algs.push(collectives::sparse::build(SPARDL, &comm, n, density)?);
        }
        let mut out = Vec::new();
        for it in 0..ITERS {
            let mut layers = vec![Vec::new(); SIZES.len()];
            for g in (0..groups).rev() {
                let range = plan.range(g);
                let buf: Vec<f32> = range.clone().flat_map(|l| layer_grad(r, it, l)).collect();
                let (u, _) = algs[g].step(&comm, &buf)?;
                let sizes: Vec<usize> = range.clone().map(|l| SIZES[l]).collect();
                for (l, v) in range.zip(split(&u.to_dense(), &sizes)) {
                    layers[l] = v;
                }
            }
            out.push(layers);
        }
        Ok(out)
    });
    outs.into_iter().next().unwrap_or_default()
}

#[test]
fn spardl_scheme_agrees_across_ranks_and_stays_sparse() {
    let plan = plan();
    let scheme = CollectiveScheme {
        algo: SPARDL,
        density: 0.1,
    };
    for p in [3, 4] {
        let outs = drive(p, &plan, &scheme);
        let what = format!("spardl ρ=0.1 P={p}");
        assert_identical_across_ranks(&outs, &what);
        for it in 0..ITERS {
            let flat: Vec<f32> = outs[0][it].iter().flatten().copied().collect();
            let nnz = flat.iter().filter(|&&x| x != 0.0).count();
            assert!(
                nnz > 0 && nnz < flat.len() / 2,
                "{what}: iteration {it} has {nnz} non-zeros of {}",
                flat.len()
            );
        }
        // The runtime adds nothing and loses nothing: the same algorithm run directly on
        // each group's concatenated buffer (groups in backward order, as the
        // communication thread runs them) gives bit-identical gradients.
        let direct = spardl_direct(p, &plan, 0.1);
        for it in 0..ITERS {
            for l in 0..SIZES.len() {
                assert_eq!(
                    outs[0][it][l], direct[it][l],
                    "{what}: iteration {it} layer {l}: runtime vs direct collectives::sparse"
                );
            }
        }
    }
}
