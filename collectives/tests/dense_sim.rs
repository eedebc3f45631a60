//! Under SimComm, the measured rounds and bytes per rank (and, on a flat α-β network, the simulated
//! time) of the dense algorithms equal their closed forms: Thakur, Rabenseifner & Gropp (2005) for
//! ring, recursive doubling, Rabenseifner and Bruck; Linear Pipelining (Wang et al.) Table 1 for
//! LP, MST and BE.

use collectives::dense::{
    allgather, allreduce, broadcast, AllgatherAlgo, AllreduceAlgo, BroadcastAlgo, DenseOptions,
};
use collectives::{ClockMode, Communicator, SimComm, SimStats, ThreadComm};
use cost_model::{Link, Topology};

const ALPHA: f64 = 1e-5;
const BETA: f64 = 1e-9;

fn link() -> Link {
    Link::new(ALPHA, BETA)
}

/// Runs `f` on P simulated ranks of a flat network; returns every rank's stats.
fn sim(p: usize, f: impl Fn(&dyn Communicator) -> collectives::Result<()> + Sync) -> Vec<SimStats> {
    ThreadComm::run(p, |c| -> collectives::Result<SimStats> {
        let s = SimComm::new(c, Topology::flat(p, link()).unwrap(), ClockMode::Logical)?;
        f(&s)?;
        Ok(s.stats())
    })
    .unwrap()
}

fn log2(p: usize) -> u64 {
    p.trailing_zeros() as u64
}

fn ar(p: usize, n: usize, algo: AllreduceAlgo) -> Vec<SimStats> {
    sim(p, move |c| {
        let mut buf = vec![1f32; n];
        allreduce(c, &mut buf, algo, &DenseOptions::default().unchecked())
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
}

#[test]
fn ring_allreduce_is_2p_minus_2_steps_of_n_over_p() {
    for p in [2usize, 3, 4, 5, 8] {
        let n = 24 * p;
        let bytes = 4 * n as u64;
        for s in ar(p, n, AllreduceAlgo::Ring) {
            assert_eq!(s.rounds, 2 * (p as u64 - 1), "p={p}");
            // Thakur et al. §4: 2(p−1)α + 2(p−1)/p·nβ.
            assert_eq!(s.bytes_sent, 2 * (p as u64 - 1) * bytes / p as u64);
            assert_eq!(s.bytes_recv, s.bytes_sent);
            let t = 2.0 * (p as f64 - 1.0) * (ALPHA + BETA * bytes as f64 / p as f64);
            assert!(close(s.clock_s, t), "p={p}: {} vs {t}", s.clock_s);
        }
    }
}

#[test]
fn recursive_doubling_is_log_p_exchanges_of_n() {
    for p in [2usize, 4, 8, 16] {
        let n = 40;
        for s in ar(p, n, AllreduceAlgo::RecursiveDoubling) {
            assert_eq!(s.rounds, log2(p));
            assert_eq!(s.bytes_sent, log2(p) * 4 * n as u64);
            let t = log2(p) as f64 * (ALPHA + BETA * 4.0 * n as f64);
            assert!(close(s.clock_s, t));
        }
    }
    // Non-powers of two: the fold-in adds one step before and one after (Thakur §4).
    for p in [3usize, 5, 6, 7, 12] {
        let n = 40;
        let p2 = 1usize << (usize::BITS - 1 - p.leading_zeros());
        let rem = p - p2;
        for (r, s) in ar(p, n, AllreduceAlgo::RecursiveDoubling)
            .into_iter()
            .enumerate()
        {
            let nb = 4 * n as u64;
            let (rounds, sent) = if r < 2 * rem && r % 2 == 0 {
                (2, nb)
            } else if r < 2 * rem {
                (log2(p2) + 2, (log2(p2) + 1) * nb)
            } else {
                (log2(p2), log2(p2) * nb)
            };
            assert_eq!((s.rounds, s.bytes_sent), (rounds, sent), "p={p} r={r}");
        }
    }
}

#[test]
fn rabenseifner_and_be_match_table1_be_row() {
    for algo in [
        AllreduceAlgo::Rabenseifner,
        AllreduceAlgo::BidirectionalExchange,
    ] {
        for p in [2usize, 4, 8, 16] {
            let n = 16 * p;
            let bytes = 4.0 * n as f64;
            for s in ar(p, n, algo) {
                assert_eq!(s.rounds, 2 * log2(p), "{algo:?} p={p}");
                assert_eq!(s.bytes_sent, 2 * (p as u64 - 1) * 4 * n as u64 / p as u64);
                // Linear Pipelining (Wang et al.) Table 1, BE allreduce with γ = 0:
                // 2·log p·α + 2·(p−1)/p·n·β.
                let t =
                    2.0 * log2(p) as f64 * ALPHA + 2.0 * (p as f64 - 1.0) / p as f64 * bytes * BETA;
                assert!(close(s.clock_s, t), "{algo:?} p={p}: {} vs {t}", s.clock_s);
            }
        }
        // Non-powers of two: the fold adds n to the odd extras' traffic and two rounds.
        for p in [3usize, 6, 7] {
            let p2 = 1usize << (usize::BITS - 1 - p.leading_zeros());
            let rem = p - p2;
            let n = 16 * p2;
            let nb = 4 * n as u64;
            for (r, s) in ar(p, n, algo).into_iter().enumerate() {
                let core = 2 * (p2 as u64 - 1) * nb / p2 as u64;
                let (rounds, sent) = if r < 2 * rem && r % 2 == 0 {
                    (2, nb)
                } else if r < 2 * rem {
                    (2 * log2(p2) + 2, core + nb)
                } else {
                    (2 * log2(p2), core)
                };
                assert_eq!(
                    (s.rounds, s.bytes_sent),
                    (rounds, sent),
                    "{algo:?} p={p} r={r}"
                );
            }
        }
    }
}

#[test]
fn binomial_allreduce_matches_table1_mst_row() {
    for p in [2usize, 4, 8] {
        let n = 50;
        let bytes = 4.0 * n as f64;
        let stats = ar(p, n, AllreduceAlgo::Binomial);
        // Root: log p receives then log p sends of the whole vector.
        assert_eq!(stats[0].rounds, 2 * log2(p));
        assert_eq!(stats[0].bytes_sent, log2(p) * 4 * n as u64);
        // Linear Pipelining (Wang et al.) Table 1, MST allreduce with γ = 0: log p·(2α + 2nβ).
        let t = log2(p) as f64 * (2.0 * ALPHA + 2.0 * bytes * BETA);
        let worst = stats.iter().map(|s| s.clock_s).fold(0.0, f64::max);
        assert!(close(worst, t), "p={p}: {worst} vs {t}");
    }
}

/// Linear Pipelining (Wang et al.) Table 1, LP allreduce with γ = 0: 2(p − 1 + n/b)α + (bp − b +
/// n)·2β.
fn table1_lp_allreduce(p: usize, n_bytes: f64, b: f64) -> f64 {
    let pf = p as f64;
    2.0 * (pf - 1.0 + n_bytes / b) * ALPHA + (b * pf - b + n_bytes) * 2.0 * BETA
}

#[test]
fn linear_pipeline_matches_table1_lp_row() {
    for p in [2usize, 3, 4, 6] {
        let b = 256usize;
        let nblocks = 12usize;
        let n = nblocks * b / 4;
        let stats = ar(p, n, AllreduceAlgo::LinearPipeline { block_bytes: b });
        let nb = nblocks as u64;
        for (r, s) in stats.iter().enumerate() {
            // Ends of the chain: one block in and one out per block; the middle: two each.
            let (rounds, sent) = if r == 0 || r == p - 1 {
                (2 * nb, 4 * n as u64)
            } else {
                (4 * nb, 8 * n as u64)
            };
            assert_eq!((s.rounds, s.bytes_sent), (rounds, sent), "p={p} r={r}");
        }
        // A rank sends one block at a time. On P = 2 the two directions use different senders: n/b
        // + 1 steps of α + βb. For P ≥ 3 the middle ranks send both ways: 2·n/b + 2P − 5 steps,
        // which is the 9 steps Linear Pipelining (Wang et al.) Fig. 2c shows for 4 blocks on 3
        // GPUs; Table 1's 2(p − 1 + n/b) rounds the fill up and is an upper bound.
        let worst = stats.iter().map(|s| s.clock_s).fold(0.0, f64::max);
        let step = ALPHA + BETA * b as f64;
        let steps = if p == 2 {
            nblocks + 1
        } else {
            2 * nblocks + 2 * p - 5
        } as f64;
        let t1 = table1_lp_allreduce(p, 4.0 * n as f64, b as f64);
        assert!(worst <= t1 * (1.0 + 1e-9), "p={p}: {worst} > Table 1 {t1}");
        assert!(
            close(worst, steps * step),
            "p={p}: {worst} vs {steps} steps = {}",
            steps * step
        );
    }
}

#[test]
fn lp_broadcast_matches_table1() {
    for p in [2usize, 3, 5] {
        let b = 128usize;
        let nblocks = 10usize;
        let n = b * nblocks;
        let stats = sim(p, move |c| {
            let mut buf = vec![7u8; n];
            broadcast(
                c,
                &mut buf,
                0,
                BroadcastAlgo::LinearPipeline { block_bytes: b },
                &DenseOptions::default().unchecked(),
            )
        });
        let worst = stats.iter().map(|s| s.clock_s).fold(0.0, f64::max);
        // Linear Pipelining (Wang et al.) Table 1: (p − 1 + n/b)α + (b(p − 1) + n)β; the exact
        // schedule is one step shorter (p − 2 + n/b steps of α + βb).
        let t1 = (p as f64 - 1.0 + nblocks as f64) * ALPHA
            + (b as f64 * (p as f64 - 1.0) + n as f64) * BETA;
        let exact = (p + nblocks - 2) as f64 * (ALPHA + BETA * b as f64);
        assert!(close(worst, exact), "p={p}: {worst} vs {exact}");
        assert!(worst <= t1);
        assert_eq!(stats[0].bytes_sent, n as u64);
    }
}

#[test]
fn bruck_and_ring_allgather_closed_forms() {
    for p in [2usize, 3, 5, 7, 8, 13] {
        let m = 10usize;
        for algo in [AllgatherAlgo::Bruck, AllgatherAlgo::Ring] {
            let stats = sim(p, move |c| {
                let mine = vec![c.rank() as u32; m];
                let mut out = vec![0u32; m * c.size()];
                allgather(
                    c,
                    &mine,
                    &mut out,
                    algo,
                    &DenseOptions::default().unchecked(),
                )
            });
            let rounds = match algo {
                AllgatherAlgo::Bruck => (usize::BITS - (p - 1).leading_zeros()) as u64,
                _ => p as u64 - 1,
            };
            for s in &stats {
                assert_eq!(s.rounds, rounds, "{algo:?} p={p}");
                assert_eq!(s.bytes_sent, ((p - 1) * m * 4) as u64);
                assert_eq!(s.bytes_recv, ((p - 1) * m * 4) as u64);
            }
        }
    }
}

#[test]
fn recursive_doubling_allgather_closed_form() {
    for p in [2usize, 4, 8, 16] {
        let m = 6usize;
        let stats = sim(p, move |c| {
            let mine = vec![1u32; m];
            let mut out = vec![0u32; m * c.size()];
            allgather(
                c,
                &mine,
                &mut out,
                AllgatherAlgo::RecursiveDoubling,
                &DenseOptions::default().unchecked(),
            )
        });
        for s in stats {
            assert_eq!(s.rounds, log2(p));
            assert_eq!(s.bytes_sent, ((p - 1) * m * 4) as u64);
            // Thakur et al. §3.1: log p·α + (p−1)/p·nβ with n the total.
            let t = log2(p) as f64 * ALPHA + ((p - 1) * m * 4) as f64 * BETA;
            assert!(close(s.clock_s, t));
        }
    }
}
