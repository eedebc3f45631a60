//! Under `SimComm`, SparDL, TopkA and gTopk move exactly the rounds and bytes of SparDL
//! (Zhao et al.) Table 1 for every P in 2..=17, and the algorithms' own counters agree with
//! SimComm's.

use collectives::sparse::{build, SparseAlgo, StepStats};
use collectives::{ClockMode, Communicator, SimComm, SimStats, ThreadComm};
use cost_model::{Link, Topology};

fn ceil_log2(p: usize) -> u64 {
    if p <= 1 {
        0
    } else {
        (usize::BITS - (p - 1).leading_zeros()) as u64
    }
}

/// Runs two steps of `name` under SimComm and returns, per rank, SimComm's counters for
/// the second step and the algorithm's own stats.
fn second_step(name: &'static str, p: usize, d: usize, density: f64) -> Vec<(SimStats, StepStats)> {
    ThreadComm::run(p, |comm| -> collectives::Result<(SimStats, StepStats)> {
        let topo = Topology::flat(p, Link::from_gbit(1e-5, 10.0))?;
        let sim = SimComm::new(comm, topo, ClockMode::Logical)?;
        let mut alg = build(name.parse()?, &sim, d, density)?;
        let grad = |s: usize| -> Vec<f32> {
            (0..d)
                .map(|i| ((i * 7919 + sim.rank() * 104729 + s * 13) % 1000) as f32 / 1000.0 + 0.001)
                .collect()
        };
        alg.step(&sim, &grad(0))?;
        let before = sim.stats();
        let (_, st) = alg.step(&sim, &grad(1))?;
        Ok((sim.stats().since(&before), st))
    })
    .unwrap()
}

/// [`second_step`] of an exact top-k algorithm (TopkA, gTopk) at `p` ranks on
/// `d = 200P + 3` elements at density 0.02, with each rank's `k = ⌈ρd⌉`.
fn exact_k_step(name: &'static str, p: usize) -> (u64, Vec<(SimStats, StepStats)>) {
    let d = 200 * p + 3;
    let density = 0.02;
    let k = (density * d as f64).ceil() as u64;
    (k, second_step(name, p, d, density))
}

fn own_counts_match(sim: &SimStats, st: &StepStats) {
    assert_eq!(sim.rounds, st.rounds);
    assert_eq!(sim.bytes_sent, st.bytes_sent);
    assert_eq!(sim.bytes_recv, st.bytes_recv);
    assert_eq!(sim.messages_sent, st.messages);
}

#[test]
fn spardl_matches_table1() {
    for p in 2..=17usize {
        let d = 300 * p + 7;
        let density = 0.05;
        let chunk = d.div_ceil(p) as u64;
        let kb = (chunk as f64 * density).floor() as u64;
        let k = kb * p as u64;
        for (r, (sim, st)) in second_step("spardl", p, d, density).iter().enumerate() {
            own_counts_match(sim, st);
            // Latency 2⌈log P⌉α (Table 1, Eq. 3).
            assert_eq!(sim.rounds, 2 * ceil_log2(p), "P={p} rank {r}");
            // Bandwidth 4k(P−1)/P numbers of 4 bytes (indices and values) received.
            assert_eq!(
                sim.bytes_recv * p as u64,
                4 * k * (p as u64 - 1) * 4,
                "P={p} rank {r}"
            );
            assert_eq!(sim.bytes_sent, sim.bytes_recv, "P={p} rank {r}");
            assert_eq!(st.entries_recv * p as u64, 2 * k * (p as u64 - 1));
        }
    }
}

#[test]
fn topka_matches_table1() {
    for p in 2..=17usize {
        let (k, all) = exact_k_step("topka", p);
        for (r, (sim, st)) in all.iter().enumerate() {
            own_counts_match(sim, st);
            // (log P)α with Bruck for any P; 2(P − 1)k numbers.
            assert_eq!(sim.rounds, ceil_log2(p), "P={p} rank {r}");
            assert_eq!(sim.bytes_recv, 2 * (p as u64 - 1) * k * 4, "P={p} rank {r}");
            assert_eq!(st.entries_recv, (p as u64 - 1) * k);
        }
    }
}

#[test]
fn gtopk_matches_table1() {
    for p in 2..=17usize {
        let (k, all) = exact_k_step("gtopk", p);
        for (sim, st) in &all {
            own_counts_match(sim, st);
            assert!(sim.rounds <= 2 * ceil_log2(p));
        }
        // The root is the critical path: 2 log P rounds and 4k log P numbers in and out.
        let (root, _) = &all[0];
        assert_eq!(root.rounds, 2 * ceil_log2(p), "P={p}");
        assert_eq!(
            root.bytes_recv + root.bytes_sent,
            4 * k * ceil_log2(p) * 4,
            "P={p}"
        );
    }
}

#[test]
fn single_rank_sends_nothing() {
    for name in SparseAlgo::ALL.map(|a| a.name()) {
        for (sim, st) in second_step(name, 1, 50, 0.1) {
            assert_eq!(sim.rounds, 0, "{name}");
            assert_eq!(st.bytes_sent, 0, "{name}");
        }
    }
}
