//! The cost model's replay of each sparse all-reduce (`cost_model::replay_sparse`) equals
//! what `SimComm` measures when the real algorithm runs: per rank, the rounds, messages,
//! bytes sent and received, and the simulated clock (up to float rounding), for every
//! algorithm, P in {1, 2, 3, 4, 5, 6, 8, 16}, several d and densities, consecutive steps,
//! on flat and two-level topologies.
//!
//! The data-dependent counts the replay needs come from the run itself: the ranks'
//! `StepStats::selected` (HiTopKComm, ExDyna), the update's support per block (TopkDSA,
//! HiTopKComm; the gradients are positive, so no sum is exactly zero), SparDL's `h()` and
//! `last_gathered()` per team position (B-SAG), Ok-Topk's `last_sent()` and
//! `last_gathered()`, and for TopkDSA each rank's own selection, recomputed with
//! the same error feedback and exact top-k the algorithm uses.
//!
//! And call by call: every rank's message trace equals the schedule the replay builds from
//! the plans (`cost_model::plan`), for every algorithm at P = 1 … 17.

#[path = "support/trace.rs"]
mod trace;

use collectives::sparse::{build, OkTopk, Sag, SelectorKind, SparDl, SparseAlgo, SparseAllreduce};
use collectives::{ClockMode, Communicator, SimComm, SimStats, ThreadComm, Traced};
use cost_model::dense::block_start;
use cost_model::plan::sparse::SagKind;
use cost_model::sparse_replay::sparse_schedule;
use cost_model::{
    predict_sparse, replay_sparse, Algorithm, Link, Observed, Prediction, SparseCase, SparseStep,
    Topology,
};
use sparsify::{ErrorFeedback, ExactTopK};

const STEPS: usize = 2;

fn inter() -> Link {
    Link::new(5e-5, 8e-9)
}

fn intra() -> Link {
    Link::new(3e-6, 2e-11)
}

/// The algorithm called `name` with default options.
fn a(name: &str) -> SparseAlgo {
    name.parse().unwrap()
}

/// HiTopKComm with `n` ranks per node.
fn hitopk(n: usize) -> SparseAlgo {
    SparseAlgo::HiTopK {
        ranks_per_node: Some(n),
        f16_wire: false,
        selector: None,
    }
}

/// Positive, distinct-ish values, different per rank and step.
fn grad(d: usize, rank: usize, step: usize) -> Vec<f32> {
    (0..d)
        .map(|i| ((i * 7919 + rank * 104_729 + step * 13) % 1000) as f32 / 1000.0 + 0.001)
        .collect()
}

/// What one rank saw in one step.
#[derive(Debug, Clone, Default)]
struct Seen {
    sim: SimStats,
    trace: Vec<Traced>,
    selected: usize,
    support: Vec<u32>,
    /// TopkDSA: this rank's selected entries per block of d split in P.
    per_block: Vec<usize>,
    /// B-SAG: h before the step and the entries after the sum between teams.
    h: f64,
    gathered: usize,
    /// Ok-Topk: entries sent to each region, and each region's entries in the all-gather.
    sent: Vec<usize>,
    regions: Vec<usize>,
}

enum Alg {
    Any(Box<dyn SparseAllreduce>),
    Bsag(SparDl),
    Ok(OkTopk),
}

/// Runs `STEPS` steps of `name` over SimComm<ThreadComm>, resetting SimComm's counters and
/// clocks (after a barrier) before each step. Returns `[rank][step]`.
fn measure(topo: &Topology, algo: SparseAlgo, d: usize, density: f64) -> Vec<Vec<Seen>> {
    measure_steps(topo, algo, d, density, STEPS)
}

/// [`measure`] over `steps` steps.
fn measure_steps(
    topo: &Topology,
    algo: SparseAlgo,
    d: usize,
    density: f64,
    steps: usize,
) -> Vec<Vec<Seen>> {
    let name = algo.name();
    let p = topo.ranks();
    let topo = *topo;
    ThreadComm::run(p, move |c| -> collectives::Result<Vec<Seen>> {
        let sim = SimComm::new(c, topo, ClockMode::Logical)?;
        let r = sim.rank();
        let mut alg = match algo {
            SparseAlgo::SparDl {
                sag: Sag::Bruck,
                teams,
                selector,
            } => Alg::Bsag(SparDl::new(&sim, d, density, Sag::Bruck, teams, selector)?),
            SparseAlgo::OkTopk { tau, rebalance } => {
                Alg::Ok(OkTopk::new(&sim, d, density, tau, rebalance)?)
            }
            _ => Alg::Any(build(algo, &sim, d, density)?),
        };
        // TopkDSA's selections, recomputed as the algorithm makes them.
        let k = ((density * d as f64).ceil() as usize).clamp(1, d);
        let mut fb = ErrorFeedback::new(d);
        let mut sel = ExactTopK::new();
        let mut out = Vec::new();
        for s in 0..steps {
            let g = grad(d, r, s);
            let mut seen = Seen::default();
            if name == "topkdsa" {
                let (sg, _) = fb.step(&mut sel, &g, k)?;
                seen.per_block = (0..p)
                    .map(|j| {
                        let (a, b) = (block_start(d, p, j), block_start(d, p, j + 1));
                        sg.indices()
                            .iter()
                            .filter(|&&i| (a..b).contains(&(i as usize)))
                            .count()
                    })
                    .collect();
            }
            sim.barrier()?;
            sim.reset();
            sim.record_trace();
            let (update, st) = match &mut alg {
                Alg::Any(a) => a.step(&sim, &g)?,
                Alg::Bsag(a) => {
                    seen.h = a.h();
                    let res = a.step(&sim, &g)?;
                    seen.gathered = a.last_gathered();
                    res
                }
                Alg::Ok(a) => {
                    let res = a.step(&sim, &g)?;
                    seen.sent = a.last_sent().to_vec();
                    seen.regions = a.last_gathered().to_vec();
                    res
                }
            };
            seen.sim = sim.stats();
            seen.trace = sim.take_trace();
            seen.selected = st.selected;
            seen.support = update.indices().to_vec();
            out.push(seen);
        }
        Ok(out)
    })
    .unwrap()
}

/// The counts of step `s` that the replay of `algo` needs, from what the ranks saw.
fn observed(
    algo: Algorithm,
    seen: &[Vec<Seen>],
    s: usize,
    d: usize,
    n: usize,
    m: usize,
) -> Observed {
    let p = seen.len();
    let support_in = |parts: usize, j: usize| {
        let (a, b) = (block_start(d, parts, j), block_start(d, parts, j + 1));
        seen[0][s]
            .support
            .iter()
            .filter(|&&i| (a..b).contains(&(i as usize)))
            .count()
    };
    match algo {
        Algorithm::Topkdsa => Observed::TopkDsa {
            sent: seen.iter().map(|r| r[s].per_block.clone()).collect(),
            reduced: (0..p).map(|j| support_in(p, j)).collect(),
        },
        Algorithm::SpardlBsag => Observed::Bsag {
            h: (0..m).map(|q| seen[q][s].h).collect(),
            gathered: (0..m).map(|q| seen[q][s].gathered).collect(),
        },
        Algorithm::Hitopk => Observed::HiTopK {
            selected: seen.iter().map(|r| r[s].selected).collect(),
            summed: (0..n).map(|j| support_in(n, j)).collect(),
        },
        Algorithm::Exdyna => Observed::ExDyna {
            selected: seen.iter().map(|r| r[s].selected).collect(),
        },
        Algorithm::Oktopk => Observed::OkTopk {
            sent: seen.iter().map(|r| r[s].sent.clone()).collect(),
            gathered: seen[0][s].regions.clone(),
        },
        _ => Observed::Worst,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-15
}

fn assert_equal(what: &str, pred: &Prediction, got: &[SimStats]) {
    if let Some(m) = collectives::prediction_mismatch(pred, got) {
        panic!("{what}: {m}");
    }
}

/// Runs `name` on `topo` and checks the replay of every step; returns the steps checked.
fn check(topo: &Topology, sparse: SparseAlgo, d: usize, density: f64) -> usize {
    let p = topo.ranks();
    let name = sparse.name();
    let algo = sparse.cost_algorithm();
    let n = sparse.ranks_per_node().unwrap_or(p);
    let seen = measure(topo, sparse, d, density);
    // B-SAG team size: P / teams (with the algorithm's default team count).
    let teams = sparse
        .teams()
        .unwrap_or_else(|| SagKind::Bruck.default_teams(p));
    let m = p / teams;
    for s in 0..STEPS {
        let step = SparseStep {
            ranks_per_node: Some(n),
            ..sparse.replay_step(d, density, s as u64, observed(algo, &seen, s, d, n, m))
        };
        let what = format!(
            "{name} P={p} ({}×{}) d={d} ρ={density} n={n} f16={} step {s}",
            topo.nodes,
            topo.ranks_per_node,
            sparse.f16_wire()
        );
        let pred = replay_sparse(&step, topo).unwrap_or_else(|e| panic!("{what}: {e}"));
        let got: Vec<SimStats> = seen.iter().map(|r| r[s].sim).collect();
        assert_equal(&what, &pred, &got);
        let plan = sparse_schedule(&step, p, topo.ranks_per_node)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let traces: Vec<Vec<Traced>> = seen.iter().map(|r| r[s].trace.clone()).collect();
        trace::assert_trace(&what, &plan, &traces);
        if p > 1 {
            assert!(
                pred.rounds > 0 && pred.time_s > 0.0,
                "{what}: nothing moved"
            );
        }
    }
    STEPS
}

const FLAT: [&str; 9] = [
    "topka",
    "topkdsa",
    "gtopk",
    "cltk",
    "spardl",
    "spardl_rsag",
    "spardl_bsag",
    "exdyna",
    "oktopk",
];

#[test]
fn flat_algorithms_replay_exactly() {
    let mut checked = 0;
    for p in [1usize, 2, 3, 4, 5, 6, 8] {
        let topo = Topology::flat(p, inter()).unwrap();
        for (d, density) in [(240usize, 0.1), (1001, 0.05), (1001, 0.3)] {
            for name in FLAT {
                checked += check(&topo, a(name), d, density);
            }
        }
    }
    assert!(checked >= 7 * 3 * 8 * STEPS, "{checked}");
}

#[test]
fn sixteen_ranks_and_large_dense_phases() {
    let topo = Topology::flat(16, inter()).unwrap();
    for name in FLAT {
        check(&topo, a(name), 1600, 0.05);
    }
    // k = 2048: CLT-k's and ExDyna's all-reduces leave recursive doubling (8 KiB and up)
    // for Rabenseifner (P = 4, 8) or the ring (P = 3, 6).
    for p in [3usize, 4, 6, 8] {
        let topo = Topology::flat(p, inter()).unwrap();
        check(&topo, a("cltk"), 8192, 0.25);
        check(&topo, a("exdyna"), 8192, 0.5);
    }
}

/// Ok-Topk with short periods, so that two steps cover every combination of threshold
/// re-estimation and region re-balancing.
#[test]
fn oktopk_periods() {
    for p in [2usize, 3, 4, 5, 8] {
        let topo = Topology::flat(p, inter()).unwrap();
        for (tau, rebalance) in [(1u32, 2u32), (2, 1), (3, 3)] {
            let ok = SparseAlgo::OkTopk { tau, rebalance };
            check(&topo, ok, 1001, 0.05);
        }
    }
}

/// B-SAG's `h` moves separately at each team position (each adjusts from its own `N_t`):
/// the replay takes one `h` per position and equals SimComm, where taking rank 0's `h` for
/// every position would not. The gradient makes the positions differ: the first half of
/// `d` (position 0's block) is the same on every rank, so the teams' top-h coincide and `h`
/// grows; the second half is per-rank, so they are disjoint and `h` shrinks.
#[test]
fn bsag_replay_keeps_h_per_team_position() {
    const STEPS: usize = 8;
    let (p, teams, d, density) = (6usize, 3usize, 1200usize, 0.05);
    let m = p / teams;
    let topo = Topology::flat(p, inter()).unwrap();
    let seen = ThreadComm::run(p, |c| -> collectives::Result<Vec<(SimStats, f64, usize)>> {
        let sim = SimComm::new(c, topo, ClockMode::Logical)?;
        let mut alg = SparDl::new(&sim, d, density, Sag::Bruck, Some(teams), None)?;
        let r = sim.rank();
        let mut out = Vec::new();
        for s in 0..STEPS {
            let g: Vec<f32> = (0..d)
                .map(|i| {
                    let who = if i < d / 2 { 0 } else { r * 104_729 };
                    ((i * 7919 + who + s * 13) % 1000) as f32 / 1000.0 + 0.001
                })
                .collect();
            sim.barrier()?;
            sim.reset();
            let h = alg.h();
            alg.step(&sim, &g)?;
            out.push((sim.stats(), h, alg.last_gathered()));
        }
        Ok(out)
    })
    .unwrap();
    let bsag = SparseAlgo::SparDl {
        sag: Sag::Bruck,
        teams: Some(teams),
        selector: None,
    };
    let mut differ = 0;
    for s in 0..STEPS {
        let h: Vec<f64> = (0..m).map(|q| seen[q][s].1).collect();
        let gathered: Vec<usize> = (0..m).map(|q| seen[q][s].2).collect();
        let got: Vec<SimStats> = seen.iter().map(|r| r[s].0).collect();
        let replay = |h: Vec<f64>| {
            let obs = Observed::Bsag {
                h,
                gathered: gathered.clone(),
            };
            replay_sparse(&bsag.replay_step(d, density, s as u64, obs), &topo).unwrap()
        };
        assert_equal(&format!("B-SAG step {s}"), &replay(h.clone()), &got);
        if h.iter().any(|&x| x.round() != h[0].round()) {
            differ += 1;
            assert!(
                collectives::prediction_mismatch(&replay(vec![h[0]; m]), &got).is_some(),
                "step {s}: rank 0's h for every position matched too ({h:?})"
            );
        }
    }
    assert!(differ > 0, "h never differed between team positions");
}

#[test]
fn spardl_team_counts() {
    for (p, teams) in [(4usize, 4usize), (8, 2), (8, 4), (6, 2), (6, 3)] {
        let topo = Topology::flat(p, inter()).unwrap();
        let spardl = |sag| SparseAlgo::SparDl {
            sag,
            teams: Some(teams),
            selector: None,
        };
        if teams.is_power_of_two() {
            check(&topo, spardl(Sag::Recursive), 960, 0.1);
        }
        check(&topo, spardl(Sag::Bruck), 960, 0.1);
        // Full density: B-SAG's h = k_b (the worst case of Table 1).
        check(&topo, spardl(Sag::Bruck), 96, 1.0);
    }
}

#[test]
fn hierarchical_topologies() {
    for (nodes, rpn) in [
        (1usize, 1usize),
        (1, 4),
        (2, 2),
        (3, 2),
        (2, 3),
        (4, 2),
        (2, 4),
        (4, 4),
    ] {
        let topo = Topology::new(nodes, rpn, intra(), inter()).unwrap();
        for (d, density) in [(240usize, 0.1), (1001, 0.05)] {
            for f16_wire in [false, true] {
                for selector in [None, Some(SelectorKind::Exact)] {
                    let hitopk = SparseAlgo::HiTopK {
                        ranks_per_node: Some(rpn),
                        f16_wire,
                        selector,
                    };
                    check(&topo, hitopk, d, density);
                }
            }
            // HiTopKComm with another node size than the topology's (n = 1 and n = P).
            let p = topo.ranks();
            for n in [1, p] {
                check(&topo, hitopk(n), d, density);
            }
        }
        // The flat algorithms see intra- and inter-node links too.
        if nodes * rpn >= 4 {
            for name in FLAT {
                check(&topo, a(name), 1001, 0.05);
            }
        }
    }
}

/// SparDL (Zhao et al.) Table 1 against SimComm directly, where the inputs hit its assumptions:
/// TopkA for any P, gTopk on powers of two, SparDL with `k = P·k_b` (d = 64·P, ρ = 1/8).
#[test]
fn table_1_equals_simcomm_where_it_applies() {
    for p in [2usize, 3, 4, 5, 8] {
        let topo = Topology::flat(p, inter()).unwrap();
        let mut cases = vec![("topka", 1000, 0.02), ("spardl", 64 * p, 0.125)];
        if p.is_power_of_two() {
            cases.push(("gtopk", 1000, 0.02));
        }
        for (name, d, density) in cases {
            let seen = measure(&topo, a(name), d, density);
            let case = SparseCase {
                algo: a(name).cost_algorithm(),
                d,
                density,
                teams: None,
            };
            let want = predict_sparse(&case, &topo).unwrap().time_s;
            for s in 0..STEPS {
                let max = seen.iter().map(|r| r[s].sim.clock_s).fold(0.0, f64::max);
                assert!(close(max, want), "{name} P={p} step {s}: {max} vs {want}");
            }
        }
    }
}

#[test]
fn every_sparse_trace_equals_its_plan_for_p_1_to_17() {
    let mut checked = 0;
    for p in 1usize..=17 {
        let topo = Topology::flat(p, inter()).unwrap();
        for name in FLAT {
            checked += check(&topo, a(name), 1003, 0.05);
        }
        // HiTopKComm on every node size that divides P.
        for n in (1..=p).filter(|n| p % n == 0) {
            let topo = Topology::new(p / n, n, intra(), inter()).unwrap();
            checked += check(&topo, hitopk(n), 1003, 0.05);
        }
    }
    assert!(checked >= 17 * 9 * STEPS, "{checked}");
}
