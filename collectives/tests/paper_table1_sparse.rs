//! SparDL (Zhao et al.) Table 1, typed from the paper (module [`paper`]), against what
//! `SimComm` measures when the algorithms run: each rank's calls and bytes from its
//! message trace, and the critical path from the simulated clock under a latency-only link
//! (α = 1, β = 0: the clock counts α terms) and a bandwidth-only link (α = 0, one unit per
//! 4-byte word: the clock counts β terms). This is independent of the cost model's replay
//! and of `cost_model::sparse`'s closed forms; `closed_forms_sparse.rs` is the second check
//! (the replay equals SimComm call by call).
//!
//! Units as in the paper (§2): `α` per transmission round, `β` per word received, a sparse
//! entry is two words (index and value), `k` the entries of the sparse result, `log` base 2.
//! Where the paper writes `log P` we use `⌈log2 P⌉` only where the row is for any P.
//!
//! Which P. Table 1 gives the rows of medium and low flexibility (TopkA, gTopk, Ok-Topk)
//! "only ... when the number of workers is a power-of-two" (§1), so those rows are checked
//! at P = 2, 4, 8, 16; SparDL's rows (high flexibility) at every P = 2 … 17. Beyond the
//! paper, TopkA and Ok-Topk are also pinned at the other P to our exact counts.
//!
//! Findings. gTopk's `4(log P)kβ` is the critical path (the root receives `2k log P` words
//! and sends as many), not what any one rank receives. Ok-Topk's latency measures
//! `2(P − 1) + 2 log P`: Table 1's `2(P + log P)` counts `P` rounds for each of its two
//! phases of direct exchanges, which take `P − 1` (no rank exchanges with itself); a
//! region re-balancing step adds `log P`. Its bandwidth lies in Table 1's range on the
//! steps between threshold re-estimations when the reused thresholds keep the selections
//! at `k` and the regions hold enough entries (`k/P = 64`) for the re-balanced regions to
//! stay balanced; with `k/P = 8` random fluctuations of the regions already push single
//! steps a few words above `6k(P − 1)/P` (seen at P = 4 and 16). A re-estimation step
//! all-gathers every reduced entry and is above the range (the paper amortises it over
//! `τ` steps), which is asserted too. On i.i.d. gradients the mean over the steady state of
//! the error feedback (steps 97 … 127) is in the range, while single steps exceed it by up
//! to about 10% (printed with `--nocapture`).

use collectives::sparse::{build, Sag, SparseAlgo, StepStats};
use collectives::{ClockMode, Communicator, SimComm, SimStats, ThreadComm, Traced};
use cost_model::{Link, Topology};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// SparDL (Zhao et al.) Table 1, as printed: `(latency in α, bandwidth in words)`.
mod paper {
    /// `log2 P` (exact on powers of two).
    pub fn log(p: usize) -> f64 {
        (p as f64).log2()
    }

    /// `⌈log2 P⌉`.
    pub fn clog(p: usize) -> f64 {
        (p as f64).log2().ceil()
    }

    /// TopkA: `(log P)α`, `2(P − 1)kβ`.
    pub fn topka(p: usize, k: f64) -> (f64, f64) {
        (log(p), 2.0 * (p as f64 - 1.0) * k)
    }

    /// gTopk: `2 log P α`, `4(log P)kβ`.
    pub fn gtopk(p: usize, k: f64) -> (f64, f64) {
        (2.0 * log(p), 4.0 * log(p) * k)
    }

    /// Ok-Topk: `2(P + log P)α`, `[2k(P − 1)/P, 6k(P − 1)/P]β`.
    pub fn oktopk(p: usize, k: f64) -> (f64, (f64, f64)) {
        let pf = p as f64;
        (
            2.0 * (pf + log(p)),
            (2.0 * k * (pf - 1.0) / pf, 6.0 * k * (pf - 1.0) / pf),
        )
    }

    /// SparDL (no SAG): `2⌈log P⌉α`, `4k(P − 1)/P β`.
    pub fn spardl(p: usize, k: f64) -> (f64, f64) {
        let pf = p as f64;
        (2.0 * clog(p), 4.0 * k * (pf - 1.0) / pf)
    }

    /// SparDL (R-SAG) with `d` teams: `(2⌈log(P/d)⌉ + log d)α`, `2k((2P − 2d)/P + (d/P)
    /// log d)β`.
    pub fn spardl_rsag(p: usize, d: usize, k: f64) -> (f64, f64) {
        let (pf, df) = (p as f64, d as f64);
        (
            2.0 * clog(p / d) + log(d),
            2.0 * k * ((2.0 * pf - 2.0 * df) / pf + df / pf * log(d)),
        )
    }
}

/// What one rank's trace shows for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Calls {
    /// Calls (send, receive or send-receive): SimComm's rounds.
    rounds: u64,
    /// Words received and sent (4 bytes each).
    words_recv: f64,
    words_sent: f64,
}

impl Calls {
    fn of(trace: &[Traced]) -> Self {
        let (mut recv, mut sent) = (0usize, 0usize);
        for t in trace {
            match *t {
                Traced::Send { bytes, .. } => sent += bytes,
                Traced::Recv { bytes, .. } => recv += bytes,
                Traced::SendRecv {
                    sent: s,
                    received: r,
                    ..
                } => {
                    sent += s;
                    recv += r;
                }
            }
        }
        Calls {
            rounds: trace.len() as u64,
            words_recv: recv as f64 / 4.0,
            words_sent: sent as f64 / 4.0,
        }
    }
}

/// One step as measured: every rank's calls and stats, and the critical path in α terms
/// and in words.
#[derive(Debug, Clone)]
struct Step {
    calls: Vec<Calls>,
    stats: Vec<StepStats>,
    latency_path: f64,
    words_path: f64,
}

/// A gradient generator: `(rank, step, d) → gradient`.
type Gen = dyn Fn(usize, usize, usize) -> Vec<f32> + Sync;

/// Independent uniform entries on every rank and step.
fn iid(rank: usize, step: usize, d: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(((rank as u64) << 32) ^ (step as u64 + 99));
    (0..d).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// `k` non-zero entries per step at indices shared by every rank (drawn anew each step),
/// magnitudes in [1, 2) with per-rank values and signs: the regime in which Ok-Topk's
/// reused thresholds keep its selections at `k`, which Table 1's range presumes.
fn shared_support(k: usize) -> impl Fn(usize, usize, usize) -> Vec<f32> + Sync {
    move |rank, step, d| {
        let mut common = ChaCha8Rng::seed_from_u64(7 + step as u64);
        let mut own = ChaCha8Rng::seed_from_u64(((rank as u64) << 32) ^ step as u64);
        let mut g = vec![0.0f32; d];
        let mut placed = 0;
        while placed < k {
            let i = common.gen_range(0..d);
            if g[i] == 0.0 {
                let sign = if own.gen_bool(0.5) { 1.0 } else { -1.0 };
                g[i] = sign * own.gen_range(1.0f32..2.0);
                placed += 1;
            }
        }
        g
    }
}

/// Runs `steps` steps of `algo` on SimComm with `link`; per step, per rank: the trace, the
/// SimComm stats and the algorithm's stats.
fn run(
    algo: SparseAlgo,
    (p, d, density): (usize, usize, f64),
    steps: usize,
    link: Link,
    grad: &Gen,
) -> Vec<Vec<(Vec<Traced>, SimStats, StepStats)>> {
    ThreadComm::run(p, |comm| -> collectives::Result<Vec<_>> {
        let sim = SimComm::new(comm, Topology::flat(p, link)?, ClockMode::Logical)?;
        let mut alg = build(algo, &sim, d, density)?;
        let mut out = Vec::new();
        for s in 0..steps {
            let g = grad(sim.rank(), s, d);
            sim.barrier()?;
            sim.reset();
            sim.record_trace();
            let (_, st) = alg.step(&sim, &g)?;
            out.push((sim.take_trace(), sim.stats(), st));
        }
        Ok(out)
    })
    .unwrap()
}

/// [`run`] under the latency-only and the bandwidth-only link (the traffic is the same) on
/// i.i.d. gradients.
fn measure(algo: SparseAlgo, p: usize, d: usize, density: f64, steps: usize) -> Vec<Step> {
    measure_on(algo, (p, d, density), steps, &iid)
}

/// [`measure`] on the gradients of `grad`.
fn measure_on(
    algo: SparseAlgo,
    (p, d, density): (usize, usize, f64),
    steps: usize,
    grad: &Gen,
) -> Vec<Step> {
    let lat = run(algo, (p, d, density), steps, Link::new(1.0, 0.0), grad);
    let bw = run(algo, (p, d, density), steps, Link::new(0.0, 0.25), grad);
    (0..steps)
        .map(|s| {
            let calls: Vec<Calls> = lat.iter().map(|r| Calls::of(&r[s].0)).collect();
            for (r, (b, c)) in bw.iter().zip(&calls).enumerate() {
                assert_eq!(Calls::of(&b[s].0), *c, "{algo} P={p} rank {r} step {s}");
                // The algorithm's own counters agree with SimComm's.
                let (sim, st) = (&lat[r][s].1, &lat[r][s].2);
                assert_eq!(
                    (
                        sim.rounds,
                        sim.bytes_sent,
                        sim.bytes_recv,
                        sim.messages_sent
                    ),
                    (st.rounds, st.bytes_sent, st.bytes_recv, st.messages),
                    "{algo} P={p} rank {r} step {s}"
                );
                assert_eq!(sim.rounds, c.rounds);
                assert_eq!(sim.bytes_recv as f64, 4.0 * c.words_recv);
            }
            let max = |v: &Vec<Vec<(Vec<Traced>, SimStats, StepStats)>>| {
                v.iter().map(|r| r[s].1.clock_s).fold(0.0, f64::max)
            };
            Step {
                calls,
                stats: lat.iter().map(|r| r[s].2).collect(),
                latency_path: max(&lat),
                words_path: max(&bw),
            }
        })
        .collect()
}

fn powers_of_two() -> impl Iterator<Item = usize> {
    [2usize, 4, 8, 16].into_iter()
}

fn algo(name: &str) -> SparseAlgo {
    name.parse().unwrap()
}

#[test]
fn topka_row() {
    for p in 2..=17usize {
        let (d, density) = (200 * p + 3, 0.02);
        let k = (density * d as f64).ceil();
        let (lat, words) = paper::topka(p, k);
        for st in measure(algo("topka"), p, d, density, 2) {
            for (r, c) in st.calls.iter().enumerate() {
                // Bruck's all-gather: ⌈log P⌉ rounds for any P; the paper's row at 2^n.
                assert_eq!(c.rounds as f64, paper::clog(p), "P={p} rank {r}");
                assert_eq!(c.words_recv, words, "P={p} rank {r}");
            }
            if p.is_power_of_two() {
                assert_eq!(st.latency_path, lat, "P={p}");
                assert_eq!(st.words_path, words, "P={p}");
            }
        }
    }
}

#[test]
fn gtopk_row() {
    for p in powers_of_two() {
        let (d, density) = (200 * p + 3, 0.02);
        let k = (density * d as f64).ceil();
        let (lat, words) = paper::gtopk(p, k);
        for st in measure(algo("gtopk"), p, d, density, 2) {
            // The root: log P receives and log P sends of k entries.
            let root = st.calls[0];
            assert_eq!(root.rounds as f64, lat, "P={p}");
            assert_eq!(root.words_recv + root.words_sent, words, "P={p}");
            assert_eq!(root.words_recv, words / 2.0, "P={p}");
            assert_eq!(st.latency_path, lat, "P={p}");
            assert_eq!(st.words_path, words, "P={p}");
        }
    }
}

#[test]
fn spardl_row() {
    for p in 2..=17usize {
        // k = P·k_b entries in the result, k_b per block of ⌈d/P⌉.
        let (d, density) = (300 * p + 7, 0.05);
        let kb = (d.div_ceil(p) as f64 * density).floor();
        let k = kb * p as f64;
        let (lat, words) = paper::spardl(p, k);
        for st in measure(algo("spardl"), p, d, density, 2) {
            for (r, c) in st.calls.iter().enumerate() {
                assert_eq!(c.rounds as f64, lat, "P={p} rank {r}");
                assert!(
                    (c.words_recv - words).abs() < 1e-9,
                    "P={p} rank {r}: {c:?} vs {words}"
                );
                assert_eq!(c.words_sent, c.words_recv, "P={p} rank {r}");
            }
            assert_eq!(st.latency_path, lat, "P={p}");
            assert!((st.words_path - words).abs() < 1e-9, "P={p}");
        }
    }
}

#[test]
fn spardl_rsag_row() {
    for p in 2..=17usize {
        for teams in [2usize, 4, 8]
            .into_iter()
            .filter(|t| p % t == 0 && p / t >= 2)
        {
            let m = p / teams;
            let (d, density) = (300 * p + 7, 0.05);
            let kb = (d.div_ceil(m) as f64 * density).floor();
            // The result holds k_b entries per block of ⌈d/m⌉: k = m·k_b.
            let k = kb * m as f64;
            let (lat, words) = paper::spardl_rsag(p, teams, k);
            let rsag = SparseAlgo::SparDl {
                sag: Sag::Recursive,
                teams: Some(teams),
                selector: None,
            };
            for st in measure(rsag, p, d, density, 2) {
                for (r, c) in st.calls.iter().enumerate() {
                    assert_eq!(c.rounds as f64, lat, "P={p} d={teams} rank {r}");
                    assert!(
                        (c.words_recv - words).abs() < 1e-9,
                        "P={p} d={teams} rank {r}"
                    );
                }
                assert_eq!(st.latency_path, lat);
                assert!((st.words_path - words).abs() < 1e-9);
            }
        }
    }
}

/// Ok-Topk with its defaults (τ = 32, re-balancing every 64 steps): step 0 re-estimates
/// and re-balances, steps 1 … 7 reuse the thresholds and the regions. Latency at every P;
/// bandwidth at powers of two, on gradients whose reused thresholds keep the selections at
/// `k` ([`shared_support`]), the regime Table 1's range describes.
#[test]
fn oktopk_row() {
    const STEPS: usize = 8;
    for p in 2..=17usize {
        // k/P = 64 entries per region: the regions' random fluctuations (±√64) stay well
        // inside the slack of the range.
        let (d, density) = (3200 * p, 0.02);
        let k = (density * d as f64).ceil();
        let (lat, (lo, hi)) = paper::oktopk(p, k);
        let exact = |rebalance: bool| {
            let l = paper::clog(p);
            2.0 * (p as f64 - 1.0) + 2.0 * l + if rebalance { l } else { 0.0 }
        };
        let gen = shared_support(k as usize);
        let steps = measure_on(algo("oktopk"), (p, d, density), STEPS, &gen);
        for (s, st) in steps.iter().enumerate() {
            for (r, c) in st.calls.iter().enumerate() {
                assert_eq!(c.rounds as f64, exact(s == 0), "P={p} step {s} rank {r}");
                if p.is_power_of_two() && s > 0 {
                    // Table 1 counts P for each phase of P − 1 direct exchanges.
                    assert_eq!(c.rounds as f64, lat - 2.0, "P={p} step {s} rank {r}");
                }
            }
            assert_eq!(st.latency_path, exact(s == 0), "P={p} step {s}");
            // Not vacuous: the update holds about k entries.
            let nnz = st.stats[0].nnz as f64;
            assert!(
                nnz >= k / 2.0 && nnz <= 2.0 * k,
                "P={p} step {s}: nnz {nnz}, k {k}"
            );
            if s == 0 || !p.is_power_of_two() {
                continue;
            }
            // The entry counts (one word from each peer before the reduce-scatter and one
            // per region before the all-gather) are not in Table 1; the entries are.
            let counts = 2.0 * (p as f64 - 1.0);
            for (r, c) in st.calls.iter().enumerate() {
                let w = c.words_recv - counts;
                assert!(
                    (lo..=hi).contains(&w),
                    "P={p} step {s} rank {r}: {w} words outside [{lo}, {hi}]"
                );
            }
            // And the critical path (the busiest receiver of the reduce-scatter need not be
            // that of the all-gather).
            let w = st.words_path - counts;
            assert!(
                (lo..=hi).contains(&w),
                "P={p} step {s}: critical path {w} words outside [{lo}, {hi}]"
            );
        }
    }
}

/// The re-estimation step all-gathers every reduced entry: on i.i.d. gradients, where the
/// ranks' selections barely overlap, that is far above Table 1's range (the paper
/// amortises it over τ steps).
#[test]
fn oktopk_reestimation_step_is_above_the_range() {
    for p in [4usize, 8, 16] {
        let (d, density) = (400 * p, 0.02);
        let k = (density * d as f64).ceil();
        let (_, (_, hi)) = paper::oktopk(p, k);
        let st = &measure(algo("oktopk"), p, d, density, 1)[0];
        let w = st.calls[0].words_recv;
        assert!(
            w > hi,
            "P={p}: re-estimation step moved {w} words, range ends at {hi}"
        );
    }
}

/// Ok-Topk on i.i.d. gradients, in the steady state of its error feedback (the third
/// re-estimation cycle, steps 97 … 127): the mean words per worker and step lie in Table 1's
/// range. Single steps can exceed it (the reused thresholds drift between re-estimations;
/// printed with `--nocapture`).
#[test]
fn oktopk_iid_steady_state_mean_is_in_the_range() {
    for p in [2usize, 4, 8, 16] {
        let (d, density) = (400 * p, 0.02);
        let k = (density * d as f64).ceil();
        let (_, (lo, hi)) = paper::oktopk(p, k);
        let counts = 2.0 * (p as f64 - 1.0);
        let steps = measure(algo("oktopk"), p, d, density, 128);
        let tail: Vec<f64> = steps[97..]
            .iter()
            .flat_map(|s| s.calls.iter().map(|c| c.words_recv - counts))
            .collect();
        let mean = tail.iter().sum::<f64>() / tail.len() as f64;
        let max = tail.iter().copied().fold(0.0, f64::max);
        eprintln!("Ok-Topk i.i.d. P={p} k={k}: range [{lo}, {hi}] words; steps 97..128 mean {mean:.0}, max {max:.0}");
        assert!(
            (lo..=hi).contains(&mean),
            "P={p}: mean {mean} outside [{lo}, {hi}]"
        );
    }
}

#[test]
fn single_rank_sends_nothing() {
    for a in SparseAlgo::ALL {
        for st in measure(a, 1, 50, 0.1, 2) {
            assert_eq!(st.calls[0].rounds, 0, "{a}");
            assert_eq!(st.stats[0].bytes_sent, 0, "{a}");
        }
    }
}
