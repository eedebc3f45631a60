//! The cost model's predictions equal what `SimComm` measures when the real algorithms run:
//! per rank, the rounds, bytes sent and received, and the simulated clock (up to float
//! rounding), for every dense algorithm, several P (powers of two and not), sizes that do
//! and do not divide, on flat and two-level topologies; and call by call, every rank's
//! message trace equals the plan it executes (`cost_model::plan::dense`), for every
//! algorithm at P = 1 … 17.

#[path = "support/trace.rs"]
mod trace;

use collectives::dense::{
    allgather, allreduce, broadcast, reduce, reduce_scatter, AllgatherAlgo, AllreduceAlgo,
    BroadcastAlgo, DenseOptions, ReduceAlgo, ReduceScatterAlgo,
};
use collectives::{ClockMode, Communicator, SimComm, SimStats, ThreadComm, Traced};
use cost_model::dense::{closed_form, dense_schedule, predict_dense, DenseCase};
use cost_model::{Algorithm, Collective, Link, Prediction, Topology};

const BLOCK: usize = 1024;

fn topologies(p: usize) -> Vec<Topology> {
    let inter = Link::new(5e-5, 8e-9);
    let intra = Link::new(3e-6, 2e-11);
    let mut t = vec![Topology::flat(p, inter).unwrap()];
    if p % 2 == 0 && p > 2 {
        t.push(Topology::new(p / 2, 2, intra, inter).unwrap());
    }
    if p % 3 == 0 && p > 3 {
        t.push(Topology::new(p / 3, 3, intra, inter).unwrap());
    }
    t
}

/// Runs one collective on SimComm over ThreadComm and returns each rank's stats.
fn measure(topo: &Topology, op: Collective, algo: Algorithm, n: usize) -> Vec<SimStats> {
    measure_traced(topo, op, algo, n).0
}

/// As [`measure`], with every rank's message trace.
fn measure_traced(
    topo: &Topology,
    op: Collective,
    algo: Algorithm,
    n: usize,
) -> (Vec<SimStats>, Vec<Vec<Traced>>) {
    let p = topo.ranks();
    let topo = *topo;
    let opts = DenseOptions::default().unchecked();
    let out = ThreadComm::run(
        p,
        move |c| -> collectives::Result<(SimStats, Vec<Traced>)> {
            let sim = SimComm::new(c, topo, ClockMode::Logical)?;
            sim.record_trace();
            let r = sim.rank();
            let mut buf: Vec<f32> = (0..n).map(|i| (i + r) as f32).collect();
            match op {
                Collective::Allreduce => {
                    let a = match algo {
                        Algorithm::Ring => AllreduceAlgo::Ring,
                        Algorithm::RecursiveDoubling => AllreduceAlgo::RecursiveDoubling,
                        Algorithm::Rabenseifner => AllreduceAlgo::Rabenseifner,
                        Algorithm::Be => AllreduceAlgo::BidirectionalExchange,
                        Algorithm::Binomial => AllreduceAlgo::Binomial,
                        Algorithm::Lp => AllreduceAlgo::LinearPipeline { block_bytes: BLOCK },
                        Algorithm::Torus2d => AllreduceAlgo::Torus2d {
                            ranks_per_node: topo.ranks_per_node,
                        },
                        _ => unreachable!(),
                    };
                    allreduce(&sim, &mut buf, a, &opts)?;
                }
                Collective::Allgather => {
                    let a = match algo {
                        Algorithm::Ring => AllgatherAlgo::Ring,
                        Algorithm::RecursiveDoubling => AllgatherAlgo::RecursiveDoubling,
                        _ => AllgatherAlgo::Bruck,
                    };
                    let mut out = vec![0f32; n * p];
                    allgather(&sim, &buf, &mut out, a, &opts)?;
                }
                Collective::ReduceScatter => {
                    let a = match algo {
                        Algorithm::Ring => ReduceScatterAlgo::Ring,
                        _ => ReduceScatterAlgo::RecursiveHalving,
                    };
                    reduce_scatter(&sim, &mut buf, a, &opts)?;
                }
                Collective::Broadcast => {
                    let a = match algo {
                        Algorithm::Binomial => BroadcastAlgo::Binomial,
                        Algorithm::ScatterAllgather => BroadcastAlgo::ScatterAllgather,
                        _ => BroadcastAlgo::LinearPipeline { block_bytes: BLOCK },
                    };
                    broadcast(&sim, &mut buf, p - 1, a, &opts)?;
                }
                Collective::Reduce => {
                    let a = ReduceAlgo::from_algorithm(algo, BLOCK)?;
                    reduce(&sim, &mut buf, p - 1, a, &opts)?;
                }
            }
            Ok((sim.stats(), sim.take_trace()))
        },
    )
    .unwrap();
    out.into_iter().unzip()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-15
}

fn assert_equal(what: &str, pred: &Prediction, got: &[SimStats]) {
    if let Some(m) = collectives::prediction_mismatch(pred, got) {
        panic!("{what}: {m}");
    }
}

/// Calls `check(topology, case, what)` for every dense operation and algorithm, at each
/// P of `ps`, on each of [`topologies`] for it and at each length of `ns` (root P − 1,
/// [`BLOCK`]-byte pipeline blocks); `what` names the case in failure messages.
fn each_dense_case(
    ps: impl IntoIterator<Item = usize>,
    ns: &[usize],
    mut check: impl FnMut(&Topology, &DenseCase, &str),
) {
    let ops = [
        Collective::Allreduce,
        Collective::Allgather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
    ];
    for p in ps {
        for topo in topologies(p) {
            for &n in ns {
                for op in ops {
                    for &algo in op.algorithms() {
                        let case = DenseCase::new(op, algo, n)
                            .with_block_bytes(BLOCK)
                            .with_root(p - 1);
                        let what = format!(
                            "{} {} P={p} ({}×{}) n={n}",
                            op.name(),
                            algo.name(),
                            topo.nodes,
                            topo.ranks_per_node
                        );
                        check(&topo, &case, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn dense_predictions_equal_simcomm() {
    let mut cases = 0;
    let mut closed = 0;
    each_dense_case(
        [2usize, 3, 4, 5, 6, 8],
        &[1, 7, 600, 1000],
        |topo, case, what| {
            let pred = predict_dense(case, topo).unwrap();
            let got = measure(topo, case.op, case.algo, case.elems);
            assert_equal(what, &pred, &got);
            cases += 1;
            if topo.ranks_per_node == 1 {
                if let Some(t) = closed_form(case, topo.ranks(), topo.inter, 0.0) {
                    let max = got.iter().map(|s| s.clock_s).fold(0.0, f64::max);
                    assert!(close(t, max), "{what}: closed form {t}, simulated {max}");
                    closed += 1;
                }
            }
        },
    );
    assert!(
        cases > 300 && closed > 60,
        "{cases} cases, {closed} closed forms"
    );
}

#[test]
fn every_dense_trace_equals_its_plan() {
    let mut calls = 0;
    each_dense_case(1usize..=17, &[0, 5, 1000], |topo, case, what| {
        let plan = dense_schedule(case, topo.ranks(), topo.ranks_per_node).unwrap();
        let (_, got) = measure_traced(topo, case.op, case.algo, case.elems);
        trace::assert_trace(what, &plan, &got);
        calls += got.iter().map(Vec::len).sum::<usize>();
    });
    assert!(calls > 50_000, "only {calls} calls compared");
}
