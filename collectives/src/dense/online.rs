//! [`OnlineChoice`]: the automatic choice of a dense collective that follows the machine
//! while it runs.
//!
//! Why: a calibration ranks the algorithms once, and the machine moves under it. On a
//! 2-vCPU VM the host placed the two vCPUs close or apart for seconds to minutes at a
//! time (a flag round trip of 0.1 µs or 0.5 µs); a calibration taken while they sat apart
//! ranked MPI's all-gather first at 16 KiB–1 MiB, and minutes later, with the vCPUs close,
//! the shared-memory algorithm ran 1.5–2.3× faster there.
//!
//! How: per operation and size, two candidates, the calibrated choice
//! ([`choose_allreduce_for`] and its siblings) and a runner-up: the shared-memory algorithm
//! and the transport library's own collective against each other; against one of ours,
//! whichever of those two the calibration prices lower; and the best message-passing
//! algorithm of ours where the other is missing. Every call is timed.
//! Most calls run the candidate in use; a burst of [`EXPLORE_BURST`] calls in every
//! [`EXPLORE_EVERY`] runs the other (in every [`EXPLORE_CLOSE`] while their times are within
//! [`CLOSE`], and in every [`EXPLORE_EARLY`] for the first [`LEARNING_AGREEMENTS`]
//! agreements); the first [`SETTLE_CALLS`] calls after a change of candidate are not
//! counted. Every few calls the ranks agree on the two median times with one all-reduce of
//! two floats, and switch when the other candidate
//! was [`SWITCH_MARGIN`] faster. The schedule depends on the call count alone and the
//! decision on the all-reduced figures, so every rank runs the same algorithm in every
//! call.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

use crate::dense::{
    allgather, allreduce, choose_allgather, choose_allgather_for, choose_allreduce,
    choose_allreduce_for, choose_reduce_scatter, choose_reduce_scatter_for, reduce_scatter,
    AllgatherAlgo, AllreduceAlgo, DenseOptions, Predictor, ReduceScatterAlgo, WireType,
};
use crate::{Communicator, Result};

/// Calls in a row that run the candidate not in use when it is tried.
pub const EXPLORE_BURST: u64 = 4;

/// Calls after a change of candidate that are run but not counted: the first calls of one
/// algorithm after another find its buffers cold. At P = 2, an all-gather of 128 KiB per
/// rank took 25–27 µs in the two calls after a switch and 14–15 µs after that, and two-call
/// bursts ranked the slower candidate first.
pub const SETTLE_CALLS: u32 = 2;

/// Once both candidates have a figure, a burst in this many calls runs the candidate not
/// in use, so that a change in the machine shows (at most 1/32 of the calls pay for a
/// worse candidate).
pub const EXPLORE_EVERY: u64 = 128;

/// While the agreed times are within [`CLOSE`] of each other, a burst in this many calls
/// runs the candidate not in use: the other may well be the faster one, and trying it
/// costs little when it is not (at most 1/8 of the calls, each at most 25 % slower).
pub const EXPLORE_CLOSE: u64 = 32;

/// Agreed times closer than this factor count as close ([`EXPLORE_CLOSE`]).
pub const CLOSE: f64 = 1.25;

/// For the first [`LEARNING_AGREEMENTS`] agreements, a burst in this many calls runs the
/// other candidate (half the calls).
pub const EXPLORE_EARLY: u64 = 2 * EXPLORE_BURST;

/// Agreements with both candidates sampled half the time: one window of a few calls each
/// on a machine shared by more ranks than cores picked the slower candidate now and then.
pub const LEARNING_AGREEMENTS: u32 = 2;

/// How much faster the other candidate's agreed time must be before the choice switches:
/// two timings of the very same call scatter by a few per cent.
pub const SWITCH_MARGIN: f64 = 0.03;

/// Bytes of calls between two agreements: small calls agree every many calls, so that the
/// agreement (an all-reduce of 8 bytes) stays a few per cent of their time; bounded by
/// [`AGREE_CALLS`].
const AGREE_BYTES: usize = 1 << 20;

/// Fewest and most calls between two agreements (the fewest: one learning cycle, which
/// counts two calls of each candidate).
const AGREE_CALLS: (u64, u64) = (EXPLORE_EARLY, 64);

/// The state of one (operation, size): its two candidates and what the ranks agreed on.
#[derive(Debug, Clone)]
struct Candidates<A> {
    /// The calibrated choice, then the runner-up (`None`: nothing to compare with).
    algos: (A, Option<A>),
    /// Which of the two is in use (0 or 1).
    current: usize,
    /// Calls so far (the same count on every rank).
    calls: u64,
    /// The candidate of the last call, and how many calls in a row it has run.
    last: (usize, u32),
    /// Seconds of each call of each candidate on this rank since the last agreement.
    local: [Vec<f64>; 2],
    /// Agreed seconds per call of each candidate (a running mean over agreements).
    agreed: [Option<f64>; 2],
    /// Agreements so far.
    agreements: u32,
    /// Calls between agreements.
    agree_every: u64,
}

/// Calls of `bytes` between two agreements.
fn agree_every(bytes: usize) -> u64 {
    ((AGREE_BYTES / bytes.max(1)) as u64).clamp(AGREE_CALLS.0, AGREE_CALLS.1)
}

impl<A: Copy> Candidates<A> {
    fn new(choice: A, runner_up: Option<A>, bytes: usize) -> Self {
        let agree_every = agree_every(bytes);
        Candidates {
            algos: (choice, runner_up),
            current: 0,
            calls: 0,
            last: (0, 0),
            local: [Vec::new(), Vec::new()],
            agreed: [None; 2],
            agreements: 0,
            agree_every,
        }
    }

    /// The candidate (0 or 1) that the next call runs.
    fn next(&self) -> usize {
        if self.algos.1.is_none() {
            return 0;
        }
        let every = match self.agreed {
            _ if self.agreements < LEARNING_AGREEMENTS => EXPLORE_EARLY,
            [Some(a), Some(b)] if a.max(b) < CLOSE * a.min(b) => EXPLORE_CLOSE,
            _ => EXPLORE_EVERY,
        };
        if self.calls % every >= every - EXPLORE_BURST {
            1 - self.current
        } else {
            self.current
        }
    }

    fn algo(&self, i: usize) -> A {
        match (i, self.algos.1) {
            (1, Some(a)) => a,
            _ => self.algos.0,
        }
    }

    /// Records a call of candidate `i` that took `secs` on this rank (counted once it has
    /// run [`SETTLE_CALLS`] calls in a row); `true` when the ranks agree now (after this
    /// call).
    fn record(&mut self, i: usize, secs: f64) -> bool {
        if self.algos.1.is_none() {
            // Nothing to compare with: keep no samples (they would pile up unread).
            return false;
        }
        self.last = if self.last.0 == i {
            (i, self.last.1 + 1)
        } else {
            (i, 1)
        };
        if self.last.1 > SETTLE_CALLS {
            self.local[i].push(secs);
        }
        self.calls += 1;
        self.calls % self.agree_every == 0
    }

    /// This rank's median seconds per call of each candidate since the last agreement
    /// (the median: a preempted call must not decide; 0 for a candidate without calls,
    /// the same on every rank, as the schedule is).
    fn local_medians(&self) -> [f32; 2] {
        [0, 1].map(|i| cost_model::median(&self.local[i]) as f32)
    }

    /// Takes the all-reduced sums of the ranks' medians and decides which candidate to use.
    fn agree(&mut self, sums: [f32; 2]) {
        for ((agreed, local), sum) in self.agreed.iter_mut().zip(&self.local).zip(sums) {
            if !local.is_empty() {
                let t = sum as f64;
                *agreed = Some(agreed.map_or(t, |old| 0.5 * (old + t)));
            }
        }
        self.local.iter_mut().for_each(Vec::clear);
        self.agreements += 1;
        let other = 1 - self.current;
        if let (Some(now), Some(alt)) = (self.agreed[self.current], self.agreed[other]) {
            if alt < now * (1.0 - SWITCH_MARGIN) {
                self.current = other;
            }
        }
    }
}

/// The automatic choice of the dense collectives, re-ranked from the calls' own timings
/// (see the module docs). Keep one per communicator and call it in the same order on
/// every rank, as the collectives themselves. It keeps one small state per distinct size
/// (a training loop's sizes repeat).
///
/// ```
/// use collectives::dense::{DenseOptions, OnlineChoice};
/// use collectives::{Communicator, ThreadComm};
/// let out = ThreadComm::run(3, |comm| -> collectives::Result<Vec<f32>> {
///     let mut online = OnlineChoice::new();
///     let mut buf = vec![1.0f32; 1000];
///     for _ in 0..10 {
///         buf.fill(1.0);
///         online.allreduce(&comm, &mut buf, None, &DenseOptions::default())?;
///     }
///     Ok(buf)
/// })
/// .unwrap();
/// assert!(out.iter().all(|b| b.iter().all(|&x| x == 3.0)));
/// ```
#[derive(Debug, Clone, Default)]
pub struct OnlineChoice {
    allreduce: HashMap<(usize, WireType), Candidates<AllreduceAlgo>>,
    allgather: HashMap<usize, Candidates<AllgatherAlgo>>,
    reduce_scatter: HashMap<(usize, WireType), Candidates<ReduceScatterAlgo>>,
}

impl OnlineChoice {
    /// No figures yet: each size starts from the calibrated choice at its first call.
    pub fn new() -> Self {
        Self::default()
    }

    /// [`allreduce`] of `buf` with the algorithm in use for its size, starting from
    /// [`choose_allreduce_for`]`(comm, bytes, calibration)`.
    pub fn allreduce<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        buf: &mut [f32],
        calibration: Option<&dyn Predictor>,
        opts: &DenseOptions,
    ) -> Result<()> {
        let bytes = 4 * buf.len();
        let state = self.allreduce.entry((bytes, opts.wire)).or_insert_with(|| {
            candidates(
                comm,
                opts.wire,
                [AllreduceAlgo::Library, AllreduceAlgo::SharedMemory],
                || choose_allreduce_for(comm, bytes, calibration),
                || choose_allreduce(comm.size(), bytes, calibration),
                |a| calibration?.allreduce_s(&a, comm.size(), bytes),
                bytes,
            )
        });
        timed(comm, state, |a| allreduce(comm, buf, a, opts))
    }

    /// [`allgather`] of `mine` into `out` with the algorithm in use for its size, starting
    /// from [`choose_allgather_for`].
    pub fn allgather<C: Communicator + ?Sized, T: bytemuck::Pod>(
        &mut self,
        comm: &C,
        mine: &[T],
        out: &mut [T],
        calibration: Option<&dyn Predictor>,
        opts: &DenseOptions,
    ) -> Result<()> {
        let bytes = std::mem::size_of_val(mine);
        let state = self.allgather.entry(bytes).or_insert_with(|| {
            candidates(
                comm,
                WireType::F32,
                [AllgatherAlgo::Library, AllgatherAlgo::SharedMemory],
                || choose_allgather_for(comm, bytes, calibration),
                || choose_allgather(comm.size(), bytes, calibration),
                |a| calibration?.allgather_s(&a, comm.size(), bytes),
                bytes,
            )
        });
        timed(comm, state, |a| allgather(comm, mine, out, a, opts))
    }

    /// [`reduce_scatter`] of `buf` with the algorithm in use for its size, starting from
    /// [`choose_reduce_scatter_for`]; returns this rank's reduced block.
    pub fn reduce_scatter<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        buf: &mut [f32],
        calibration: Option<&dyn Predictor>,
        opts: &DenseOptions,
    ) -> Result<Range<usize>> {
        let bytes = 4 * buf.len();
        let state = self
            .reduce_scatter
            .entry((bytes, opts.wire))
            .or_insert_with(|| {
                candidates(
                    comm,
                    opts.wire,
                    [ReduceScatterAlgo::Library, ReduceScatterAlgo::SharedMemory],
                    || choose_reduce_scatter_for(comm, bytes, calibration),
                    || choose_reduce_scatter(comm.size(), bytes, calibration),
                    |a| calibration?.reduce_scatter_s(&a, comm.size(), bytes),
                    bytes,
                )
            });
        timed(comm, state, |a| reduce_scatter(comm, buf, a, opts))
    }

    /// Calls of a collective that moves `bytes` before it explores only now and then (the
    /// first [`LEARNING_AGREEMENTS`] agreements): a benchmark of the steady state runs
    /// these first.
    pub fn learning_calls(bytes: usize) -> u64 {
        agree_every(bytes) * LEARNING_AGREEMENTS as u64
    }

    /// The all-reduce algorithm in use for `bytes` with `f32` on the wire (`None` before
    /// its first call).
    pub fn allreduce_in_use(&self, bytes: usize) -> Option<AllreduceAlgo> {
        let key = (bytes, WireType::F32);
        self.allreduce.get(&key).map(|c| c.algo(c.current))
    }

    /// The all-gather algorithm in use for `bytes` contributed per rank.
    pub fn allgather_in_use(&self, bytes: usize) -> Option<AllgatherAlgo> {
        self.allgather.get(&bytes).map(|c| c.algo(c.current))
    }

    /// The reduce-scatter algorithm in use for a `bytes` buffer with `f32` on the wire.
    pub fn reduce_scatter_in_use(&self, bytes: usize) -> Option<ReduceScatterAlgo> {
        let key = (bytes, WireType::F32);
        self.reduce_scatter.get(&key).map(|c| c.algo(c.current))
    }
}

/// The candidates of one (operation, size): `choice_for()` (the calibrated choice among
/// ours and `library`, `shared`) and its runner-up; with a narrow wire type, which only our
/// message-passing algorithms carry, `ours()` alone. `predict` prices a candidate from the
/// calibration (`None` without one).
fn candidates<C: Communicator + ?Sized, A: Copy + PartialEq>(
    comm: &C,
    wire: WireType,
    pair: [A; 2],
    choice_for: impl FnOnce() -> A,
    ours: impl FnOnce() -> A,
    predict: impl Fn(A) -> Option<f64>,
    bytes: usize,
) -> Candidates<A> {
    if wire != WireType::F32 {
        return Candidates::new(ours(), None, bytes);
    }
    let choice = choice_for();
    let has = (comm.library().is_some(), comm.shared_segment().is_some());
    let runner_up = runner_up_of(choice, pair, has, ours, predict);
    Candidates::new(choice, runner_up, bytes)
}

/// The candidate to compare `choice` with, given which of `library` and `shared` the
/// communicator has (`has`): the shared-memory algorithm against the library and the library
/// against the shared-memory algorithm; against one of ours, whichever of the two the
/// calibration prices lower (the library when it prices neither); else the best
/// message-passing algorithm of ours (`ours`); `None` when there is nothing else. Why the
/// pricing: at P = 4 on two cores a calibration picked recursive halving for a 1 MiB
/// reduce-scatter with the shared-memory algorithm second; compared only with MPI's call,
/// the choice ended 0.92× MPI where the shared-memory algorithm ran 1.26×.
fn runner_up_of<A: Copy + PartialEq>(
    choice: A,
    [library, shared]: [A; 2],
    (has_library, has_segment): (bool, bool),
    ours: impl FnOnce() -> A,
    predict: impl Fn(A) -> Option<f64>,
) -> Option<A> {
    let other = if choice == library {
        if has_segment {
            shared
        } else {
            ours()
        }
    } else if choice == shared {
        if has_library {
            library
        } else {
            ours()
        }
    } else if has_library && has_segment {
        match (predict(library), predict(shared)) {
            (Some(l), Some(s)) if s < l => shared,
            _ => library,
        }
    } else if has_library {
        library
    } else if has_segment {
        shared
    } else {
        return None;
    };
    (other != choice).then_some(other)
}

/// Runs `call` with the candidate the schedule names, times it, and agrees with the other
/// ranks when it is time to.
fn timed<C: Communicator + ?Sized, A: Copy, R>(
    comm: &C,
    state: &mut Candidates<A>,
    call: impl FnOnce(A) -> Result<R>,
) -> Result<R> {
    if state.algos.1.is_none() {
        return call(state.algos.0);
    }
    let i = state.next();
    let start = Instant::now();
    let out = call(state.algo(i))?;
    if state.record(i, start.elapsed().as_secs_f64()) {
        let mut sums = state.local_medians();
        let algo = choose_allreduce_for(comm, sums.len() * 4, None);
        allreduce(comm, &mut sums, algo, &DenseOptions::default().unchecked())?;
        state.agree(sums);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadComm;

    /// Drives the schedule with synthetic times: candidate 1 takes `t1(call)` seconds,
    /// candidate 0 one millisecond; returns the candidate in use after each agreement.
    fn drive(calls: u64, t1: impl Fn(u64) -> f64) -> Vec<usize> {
        let mut c = Candidates::new(0u8, Some(1u8), 64 << 10);
        let mut in_use = Vec::new();
        for n in 0..calls {
            let i = c.next();
            let t = if i == 0 { 1e-3 } else { t1(n) };
            if c.record(i, t) {
                let m = c.local_medians();
                c.agree(m);
                in_use.push(c.current);
            }
        }
        in_use
    }

    #[test]
    fn switches_to_the_faster_candidate_and_back_when_the_machine_changes() {
        // Candidate 1 twice as fast for the first 400 calls, then three times slower.
        let in_use = drive(1200, |n| if n < 400 { 0.5e-3 } else { 3e-3 });
        assert_eq!(in_use[0], 1, "the first agreement already has both figures");
        assert_eq!(OnlineChoice::learning_calls(64 << 10), 32);
        assert!(in_use[..20].iter().all(|&c| c == 1));
        assert_eq!(
            *in_use.last().unwrap(),
            0,
            "back once candidate 1 slowed down"
        );
    }

    #[test]
    fn the_runner_up_of_ours_is_the_cheaper_of_library_and_segment() {
        // Candidates: 0 = library, 1 = shared memory, 2 and 3 = ours.
        let (pair, ours) = ([0u8, 1u8], || 3u8);
        let price = |l: f64, s: f64| move |a: u8| [Some(l), Some(s), None, None][a as usize];
        let none = |_: u8| None;
        let both = (true, true);
        assert_eq!(runner_up_of(2, pair, both, ours, price(2.0, 1.0)), Some(1));
        assert_eq!(runner_up_of(2, pair, both, ours, price(1.0, 2.0)), Some(0));
        assert_eq!(runner_up_of(2, pair, both, ours, none), Some(0));
        // Only one of the two there: that one, whatever the prices.
        assert_eq!(
            runner_up_of(2, pair, (false, true), ours, price(1.0, 2.0)),
            Some(1)
        );
        assert_eq!(
            runner_up_of(2, pair, (true, false), ours, price(2.0, 1.0)),
            Some(0)
        );
        // The library and the segment are each other's runner-up; ours where one is missing.
        assert_eq!(runner_up_of(0, pair, both, ours, none), Some(1));
        assert_eq!(runner_up_of(1, pair, both, ours, none), Some(0));
        assert_eq!(runner_up_of(0, pair, (true, false), ours, none), Some(3));
        assert_eq!(runner_up_of(2, pair, (false, false), ours, none), None);
    }

    #[test]
    fn keeps_the_choice_within_the_margin_and_explores_rarely() {
        // 2 % faster is within the margin: no switch.
        assert!(drive(2000, |_| 0.98e-3).iter().all(|&c| c == 0));
        // Once both have figures, a burst in EXPLORE_EVERY runs the other candidate.
        let mut c = Candidates::new(0u8, Some(1u8), 64 << 10);
        c.agreed = [Some(1.0), Some(2.0)];
        c.agreements = LEARNING_AGREEMENTS;
        let other = (0..EXPLORE_EVERY * 10).filter(|_| {
            let i = c.next();
            c.calls += 1;
            i == 1
        });
        assert_eq!(other.count() as u64, 10 * EXPLORE_BURST);
        // Close figures: a burst in EXPLORE_CLOSE.
        c.agreed = [Some(1.0), Some(1.2)];
        let other = (0..EXPLORE_CLOSE * 10).filter(|_| {
            let i = c.next();
            c.calls += 1;
            i == 1
        });
        assert_eq!(other.count() as u64, 10 * EXPLORE_BURST);
    }

    #[test]
    fn without_a_runner_up_it_never_explores_nor_agrees() {
        let mut c = Candidates::new(7u8, None, 4);
        for _ in 0..1000 {
            assert_eq!(c.next(), 0);
            assert!(!c.record(0, 1e-6));
        }
        assert!(c.local.iter().all(Vec::is_empty), "no samples kept");
    }

    #[test]
    fn a_narrow_wire_type_runs_our_message_passing_algorithms_only() {
        let out = ThreadComm::run(3, |comm| -> Result<_> {
            let mut online = OnlineChoice::new();
            let opts = DenseOptions::with_wire(WireType::Bf16);
            for _ in 0..40 {
                let mut buf = vec![1.0f32; 5000];
                online.allreduce(&comm, &mut buf, None, &opts)?;
                assert!(buf.iter().all(|&x| x == 3.0));
                let mut buf = vec![1.0f32; 5000];
                let mine = online.reduce_scatter(&comm, &mut buf, None, &opts)?;
                assert!(buf[mine].iter().all(|&x| x == 3.0));
            }
            let ar = &online.allreduce[&(20_000, WireType::Bf16)];
            let rs = &online.reduce_scatter[&(20_000, WireType::Bf16)];
            Ok((ar.algos, rs.algos))
        })
        .unwrap();
        let (ar, rs) = out[0];
        assert!(ar.1.is_none() && ar.0 != AllreduceAlgo::SharedMemory);
        assert!(rs.1.is_none() && rs.0 != ReduceScatterAlgo::SharedMemory);
    }

    fn both_agreed<A>(c: &Candidates<A>) -> bool {
        c.agreed.iter().all(Option::is_some)
    }

    #[test]
    fn every_rank_runs_the_same_algorithm_and_the_sums_are_right() {
        for p in [2, 3, 5] {
            let out = ThreadComm::run(p, |comm| -> Result<_> {
                let mut online = OnlineChoice::new();
                let opts = DenseOptions::default();
                let mut seen = Vec::new();
                for round in 0..200 {
                    let n = [10, 3000, 70_000][round % 3];
                    let mut buf = vec![comm.rank() as f32 + 1.0; n];
                    online.allreduce(&comm, &mut buf, None, &opts)?;
                    let want = (p * (p + 1) / 2) as f32;
                    assert!(buf.iter().all(|&x| x == want), "p {p} n {n}");
                    let mine = vec![comm.rank() as u32; n / 10 + 1];
                    let mut all = vec![0u32; mine.len() * p];
                    online.allgather(&comm, &mine, &mut all, None, &opts)?;
                    assert!(all
                        .chunks(mine.len())
                        .enumerate()
                        .all(|(r, c)| c.iter().all(|&x| x == r as u32)));
                    let mut buf = vec![1.0f32; n];
                    let mine = online.reduce_scatter(&comm, &mut buf, None, &opts)?;
                    assert!(buf[mine].iter().all(|&x| x == p as f32));
                    seen.push((
                        online.allreduce_in_use(4 * n),
                        online.allgather_in_use(4 * (n / 10 + 1)),
                        online.reduce_scatter_in_use(4 * n),
                    ));
                }
                // Not vacuous: both candidates ran and were agreed on at every size.
                assert!(online.allreduce.values().all(both_agreed), "p {p}");
                assert!(online.allgather.values().all(both_agreed), "p {p}");
                assert!(online.reduce_scatter.values().all(both_agreed), "p {p}");
                Ok(seen)
            })
            .unwrap();
            assert!(out.iter().all(|s| s == &out[0]), "p {p}: ranks disagree");
            assert!(out[0].iter().all(|s| s.0.is_some()));
        }
    }
}
