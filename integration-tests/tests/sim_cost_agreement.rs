//! `collectives`' simulated cluster and `cost_model`'s predictions agree end to end: whole
//! steps of SparDL (plain and R-SAG), ExDyna and Ok-Topk, and a dense ring all-reduce, run on
//! `SimComm` over `ThreadComm` with two-level topologies (block placement, fast intra-node
//! and slow inter-node links); every rank's simulated time, rounds, messages and bytes
//! equal `cost_model::replay_sparse` / `cost_model::predict_dense`.
//!
//! The construction-time agreement exchange is not part of a step: each step starts after
//! a barrier and `SimComm::reset`. Several consecutive steps are replayed (SparDL's
//! traffic does not depend on the data; ExDyna's selected counts come from `StepStats`,
//! Ok-Topk's per-region counts from `OkTopk::last_sent` and `last_gathered`).

use collectives::sparse::{build, OkTopk, SparseAlgo, SparseAllreduce};
use collectives::{
    allreduce, AllreduceAlgo, ClockMode, Communicator, DenseOptions, SimComm, SimStats,
};
use cost_model::{
    predict_dense, replay_sparse, Algorithm, Collective, DenseCase, Link, Observed, Prediction,
    Topology,
};
use integration_tests::{grad, mean_f64, run_ranks, AnyResult};

const STEPS: usize = 3;

fn intra() -> Link {
    Link::new(3e-6, 2e-11)
}

fn inter() -> Link {
    Link::new(5e-5, 8e-9)
}

fn topologies() -> Vec<Topology> {
    vec![
        Topology::new(2, 2, intra(), inter()).expect("2 × 2"),
        Topology::new(3, 2, intra(), inter()).expect("3 × 2"),
        Topology::new(2, 3, intra(), inter()).expect("2 × 3"),
    ]
}

fn assert_matches(seen: &[SimStats], pred: &Prediction, what: &str) {
    if let Some(m) = collectives::prediction_mismatch(pred, seen) {
        panic!("{what}: {m}");
    }
    assert!(pred.time_s > 0.0, "{what}: nothing was timed");
}

/// The algorithm called `name` with default options.
fn a(name: &str) -> SparseAlgo {
    name.parse().unwrap()
}

/// What one rank saw in one step: the simulated stats, `StepStats::selected`, and for
/// Ok-Topk the entries it sent to each region and each region's entries in the all-gather.
type Seen = (SimStats, usize, Vec<usize>, Vec<usize>);

/// Per step, per rank: what [`Seen`] holds.
fn run_sparse(topo: Topology, algo: SparseAlgo, d: usize, density: f64) -> Vec<Vec<Seen>> {
    let p = topo.ranks();
    run_ranks(p, move |c| -> AnyResult<Vec<Seen>> {
        let sim = SimComm::new(c, topo, ClockMode::Logical)?;
        let mut ok = match algo {
            SparseAlgo::OkTopk { tau, rebalance } => {
                Some(OkTopk::new(&sim, d, density, tau, rebalance)?)
            }
            _ => None,
        };
        let mut any = match ok {
            Some(_) => None,
            None => Some(build(algo, &sim, d, density)?),
        };
        let mut out = Vec::new();
        for s in 0..STEPS {
            let g = grad(d, sim.rank(), s, 11);
            sim.barrier()?;
            sim.reset();
            let alg: &mut dyn SparseAllreduce = match (&mut ok, &mut any) {
                (Some(a), _) => a,
                (None, Some(a)) => a.as_mut(),
                (None, None) => unreachable!("one of the two is built"),
            };
            let (_u, st) = alg.step(&sim, &g)?;
            let (sent, regions) = ok.as_ref().map_or((Vec::new(), Vec::new()), |a| {
                (a.last_sent().to_vec(), a.last_gathered().to_vec())
            });
            out.push((sim.stats(), st.selected, sent, regions));
        }
        Ok(out)
    })
}

fn check_sparse(sparse: SparseAlgo, d: usize, density: f64) {
    let name = sparse.name();
    for topo in topologies() {
        let p = topo.ranks();
        let runs = run_sparse(topo, sparse, d, density);
        for s in 0..STEPS {
            let seen: Vec<SimStats> = runs.iter().map(|r| r[s].0).collect();
            let observed = match sparse.cost_algorithm() {
                Algorithm::Exdyna => Observed::ExDyna {
                    selected: runs.iter().map(|r| r[s].1).collect(),
                },
                Algorithm::Oktopk => Observed::OkTopk {
                    sent: runs.iter().map(|r| r[s].2.clone()).collect(),
                    gathered: runs[0][s].3.clone(),
                },
                _ => Observed::Worst,
            };
            let step = sparse.replay_step(d, density, s as u64, observed);
            let pred = replay_sparse(&step, &topo).expect("replay");
            assert_matches(
                &seen,
                &pred,
                &format!(
                    "{name} d={d} ρ={density} P={p} ({} per node) step {s}",
                    topo.ranks_per_node
                ),
            );
        }
    }
}

#[test]
fn spardl_step_time_equals_the_replay() {
    check_sparse(a("spardl"), 1000, 0.02);
    check_sparse(a("spardl"), 333, 0.1);
}

#[test]
fn spardl_rsag_step_time_equals_the_replay() {
    check_sparse(a("spardl_rsag"), 1000, 0.02);
}

#[test]
fn exdyna_step_time_equals_the_replay() {
    // The paper's cold start: on random gradients of this size it selects far more than
    // k, so the union's all-reduce is large.
    check_sparse(a("exdyna"), 1000, 0.02);
}

/// ExDyna's fast mode (`SparseAlgo::ExDyna { warm_start: true }`): on its warm steps each
/// rank's threshold travels with the count all-gather (4 bytes more per block); the replay
/// must count it. These steps are all warm ones; `collectives/tests/sparse_exdyna.rs`
/// replays the whole warm phase and the steps after it.
#[test]
fn exdyna_warm_start_step_time_equals_the_replay() {
    check_sparse(SparseAlgo::ExDyna { warm_start: true }, 1000, 0.02);
}

/// Ok-Topk with periods short enough that three steps re-estimate, re-balance and reuse.
#[test]
fn oktopk_step_time_equals_the_replay() {
    check_sparse(a("oktopk"), 1000, 0.02);
    check_sparse(
        SparseAlgo::OkTopk {
            tau: 2,
            rebalance: 3,
        },
        1000,
        0.05,
    );
}

#[test]
fn dense_ring_allreduce_time_equals_the_prediction() {
    for topo in topologies() {
        let p = topo.ranks();
        for n in [1usize, 7, 1000, 4099] {
            let outs = run_ranks(p, move |c| -> AnyResult<(SimStats, Vec<f32>)> {
                let sim = SimComm::new(c, topo, ClockMode::Logical)?;
                let mut buf = grad(n, sim.rank(), 0, 3);
                sim.barrier()?;
                sim.reset();
                allreduce(
                    &sim,
                    &mut buf,
                    AllreduceAlgo::Ring,
                    &DenseOptions::default().unchecked(),
                )?;
                Ok((sim.stats(), buf))
            });
            // The data really moved: the sum of every rank's vector, bit-identical everywhere.
            let all: Vec<Vec<f32>> = (0..p).map(|r| grad(n, r, 0, 3)).collect();
            let mean = mean_f64(&all);
            for (r, (_, b)) in outs.iter().enumerate() {
                assert_eq!(b, &outs[0].1, "ring P={p} n={n}: rank {r} differs");
                for (i, (&x, &m)) in b.iter().zip(&mean).enumerate() {
                    let want = m * p as f64;
                    assert!(
                        (f64::from(x) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "ring P={p} n={n}: entry {i} is {x}, expected {want}"
                    );
                }
            }
            let seen: Vec<SimStats> = outs.iter().map(|o| o.0).collect();
            let pred = predict_dense(
                &DenseCase::new(Collective::Allreduce, Algorithm::Ring, n),
                &topo,
            )
            .expect("prediction");
            assert_matches(
                &seen,
                &pred,
                &format!(
                    "ring allreduce n={n} P={p} ({} per node)",
                    topo.ranks_per_node
                ),
            );
        }
    }
}
