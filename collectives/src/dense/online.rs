//! [`OnlineChoice`]: the automatic choice of a dense collective that follows the machine
//! while it runs.
//!
//! Why: a calibration ranks the algorithms once, and the machine moves under it. On a
//! 2-vCPU VM the host placed the two vCPUs close or apart for seconds to minutes at a
//! time (a flag round trip of 0.1 µs or 0.5 µs); a calibration taken while they sat apart
//! ranked MPI's all-gather first at 16 KiB–1 MiB, and minutes later, with the vCPUs close,
//! the shared-memory algorithm ran 1.5–2.3× faster there.
//!
//! How: per operation and size, the candidates are the calibrated choice ([`choose_allreduce_for`]
//! and its siblings) and, where the communicator has them, the transport library's own collective,
//! the shared-memory algorithm and the best message-passing algorithm of ours. Its calls are timed
//! (below [`SAMPLE_ALL_BYTES`], past learning, one in [`SAMPLE_EVERY`] of the candidate in use).
//! Most calls run the candidate in use; the last [`EXPLORE_BURST`] calls of every window run one of
//! the others, in turn. A window is [`EXPLORE_EARLY`] calls for the first [`LEARNING_AGREEMENTS`]
//! agreements and [`EXPLORE_CLOSE`] after; from the first agreement on, a candidate whose time is
//! not within [`CLOSE`] of the one in use takes only one turn in [`EXPLORE_EVERY`]` /
//! EXPLORE_CLOSE`. Each agreement that keeps the candidate in use doubles the window, up to
//! [`EXPLORE_LONGEST`]; a switch, or a move of the time in use by [`CLOSE`], starts it over. The
//! first [`SETTLE_CALLS`] calls after a change of candidate are not counted. Every few calls the
//! ranks agree on the median times with one all-reduce of a float per candidate, and switch to the
//! fastest when it was [`SWITCH_MARGIN`] faster than the one in use. The schedule depends on the
//! call count alone and the decision on the all-reduced figures, so every rank runs the same
//! algorithm in every call.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

use crate::dense::{
    allgather, allreduce, choose_allgather, choose_allgather_for, choose_allreduce,
    choose_allreduce_for, choose_reduce_scatter, choose_reduce_scatter_for, reduce_scatter,
    AllgatherAlgo, AllreduceAlgo, DenseOptions, Predictor, ReduceScatterAlgo, WireType,
};
use crate::{Communicator, Result};

/// Calls in a row that run a candidate not in use when it is tried.
pub const EXPLORE_BURST: u64 = 4;

/// Calls after a change of candidate that are run but not counted: the first calls of one
/// algorithm after another find its buffers cold. At P = 2, an all-gather of 128 KiB per
/// rank took 25–27 µs in the two calls after a switch and 14–15 µs after that, and two-call
/// bursts ranked the slower candidate first.
pub const SETTLE_CALLS: u32 = 2;

/// After learning, a candidate whose time is far from the one in use runs a burst once in
/// this many calls per candidate not in use, so that a change in the machine shows (at most
/// 1/32 of the calls pay for a worse candidate).
pub const EXPLORE_EVERY: u64 = 128;

/// After learning, the calls fall in windows of this many, each ending in a burst of a
/// candidate not in use. One whose agreed time is within [`CLOSE`] of the one in use
/// takes every turn: it may well be the faster one, and trying it costs little when it is
/// not (at most 1/8 of the calls, each at most 25 % slower).
pub const EXPLORE_CLOSE: u64 = 32;

/// Longest window after learning: each agreement that keeps the candidate in use doubles
/// the window from [`EXPLORE_CLOSE`] up to this. Why: with the window fixed at 32 calls,
/// the bursts of the others cost the choice 3–9 % against its own pick's row at P = 2
/// (`cargo xtask bench --mpi -n 2`, the shared-memory all-reduce 1.7× ahead of the
/// others) and up to 16 % where a close candidate took every turn; past the longest window
/// a close candidate runs 1/64 of the calls, a far one 1/256.
pub const EXPLORE_LONGEST: u64 = 8 * EXPLORE_CLOSE;

/// Agreements past learning that keep the candidate in use before the window reaches
/// [`EXPLORE_LONGEST`].
const DOUBLINGS: u32 = (EXPLORE_LONGEST / EXPLORE_CLOSE).ilog2();

/// Agreed times closer than this factor count as close ([`EXPLORE_CLOSE`]).
pub const CLOSE: f64 = 1.25;

/// For the first [`LEARNING_AGREEMENTS`] agreements, the calls fall in windows of this
/// many, each ending in a burst of a candidate not in use (half the calls).
pub const EXPLORE_EARLY: u64 = 2 * EXPLORE_BURST;

/// Agreements with the other candidates sampled half the time: one window of a few calls each
/// on a machine shared by more ranks than cores picked the slower candidate now and then.
pub const LEARNING_AGREEMENTS: u32 = 2;

/// How much faster the fastest candidate's agreed time must be before the choice switches:
/// two timings of the very same call scatter by a few per cent.
pub const SWITCH_MARGIN: f64 = 0.03;

/// Bytes of calls between two agreements: small calls agree every many calls, so that the
/// agreement (an all-reduce of a few floats) stays a few per cent of their time; bounded
/// by [`AGREE_CALLS`].
const AGREE_BYTES: usize = 1 << 20;

/// Fewest and most calls between two agreements. The fewest is one learning window per
/// other candidate (each runs a burst, two calls of it counted), and the count is rounded
/// up to a whole number of those, so that the first agreement has every candidate's figure
/// (later ones may lack a far candidate's, which keeps its agreed time).
const AGREE_CALLS: (u64, u64) = (EXPLORE_EARLY, 64);

/// Past learning and below [`SAMPLE_ALL_BYTES`], the candidate in use is timed once in this
/// many calls. Why: under `mpirun -n 2` on the 2-vCPU VM, a 4 KiB all-reduce through the
/// online choice took 0.15–0.25 µs more than the shared-memory algorithm called directly
/// (1.14 µs), and reading the clock twice per call was the largest part of that in a
/// profile; timing a quarter of the calls left 0.1–0.17 µs. A call of 4 KiB agrees every
/// 64 calls, so a quarter of them still gives 16 timings.
pub const SAMPLE_EVERY: u64 = 4;

/// Calls of this many bytes or more time every call: a call takes 10 µs or more there,
/// the clock 1 % or less, and they agree every 16 calls or fewer.
pub const SAMPLE_ALL_BYTES: usize = 64 << 10;

/// Most candidates besides the one in use: the calibrated choice is compared with the
/// library's collective, the shared-memory algorithm and the best message-passing
/// algorithm of ours, whichever of them differ from it.
const MAX_OTHERS: usize = 3;

/// The state of one (operation, size): its candidates and what the ranks agreed on.
#[derive(Debug, Clone)]
struct Candidates<A> {
    /// The calibrated choice first, then the others (none: nothing to compare with).
    algos: Vec<A>,
    /// Which candidate is in use.
    current: usize,
    /// Calls so far (the same count on every rank).
    calls: u64,
    /// The candidate of the last call, and how many calls in a row it has run.
    last: (usize, u32),
    /// Seconds of each call of each candidate on this rank since the last agreement.
    local: Vec<Vec<f64>>,
    /// Agreed seconds per call of each candidate (a running mean over agreements).
    agreed: Vec<Option<f64>>,
    /// Agreements so far.
    agreements: u32,
    /// Agreements past learning since the candidate in use last changed: the window is
    /// [`EXPLORE_CLOSE`] doubled this many times, up to [`EXPLORE_LONGEST`].
    kept: u32,
    /// Calls between agreements.
    agree_every: u64,
    /// The candidate in use is timed once in this many calls ([`Candidates::times`]).
    sample_every: u64,
}

/// Calls of `bytes` between two agreements with `others` candidates besides the one in use.
fn agree_every(bytes: usize, others: usize) -> u64 {
    let cycle = EXPLORE_EARLY * others.max(1) as u64;
    let every = ((AGREE_BYTES / bytes.max(1)) as u64).clamp(AGREE_CALLS.0, AGREE_CALLS.1);
    every.max(cycle).div_ceil(cycle) * cycle
}

impl<A: Copy> Candidates<A> {
    /// `algos`: the calibrated choice first, then the others (distinct, in any order).
    fn new(algos: Vec<A>, bytes: usize) -> Self {
        let n = algos.len();
        Candidates {
            agree_every: agree_every(bytes, n.saturating_sub(1)),
            sample_every: if bytes < SAMPLE_ALL_BYTES {
                SAMPLE_EVERY
            } else {
                1
            },
            algos,
            current: 0,
            calls: 0,
            last: (0, 0),
            local: vec![Vec::new(); n],
            agreed: vec![None; n],
            agreements: 0,
            kept: 0,
        }
    }

    /// Calls per window: [`EXPLORE_EARLY`] while learning, then [`EXPLORE_CLOSE`] doubled
    /// for every agreement that kept the candidate in use, up to [`EXPLORE_LONGEST`].
    fn window(&self) -> u64 {
        if self.agreements < LEARNING_AGREEMENTS {
            EXPLORE_EARLY
        } else {
            EXPLORE_CLOSE << self.kept.min(DOUBLINGS)
        }
    }

    /// The candidate that the next call runs. The calls fall in windows
    /// ([`Candidates::window`]); the last
    /// [`EXPLORE_BURST`] calls of a window go to the others in turn. One whose agreed time
    /// is not within [`CLOSE`] of the one in use takes only every
    /// `EXPLORE_EVERY / EXPLORE_CLOSE`-th of its turns, from the first agreement on: in a
    /// training step most groups are small and learn for many calls, and with every turn
    /// taken while learning, the ResNet-20 step under `mpirun -n 2` took 13 % longer (one
    /// launch).
    fn next(&self) -> usize {
        let others = self.algos.len() as u64 - 1;
        if others == 0 {
            return 0;
        }
        let window = self.window();
        if self.calls % window < window - EXPLORE_BURST {
            return self.current;
        }
        let slot = self.calls / window;
        let j = (slot % others) as usize;
        let other = if j >= self.current { j + 1 } else { j };
        let close = match (self.agreed[self.current], self.agreed[other]) {
            (Some(a), Some(b)) => a.max(b) < CLOSE * a.min(b),
            _ => true,
        };
        let turn = slot / others;
        if close || turn % (EXPLORE_EVERY / EXPLORE_CLOSE) == 0 {
            other
        } else {
            self.current
        }
    }

    /// Whether the call about to run candidate `i` is timed: every call while learning
    /// (the one in use runs two counted calls per window then) and of a candidate not in
    /// use; past learning, of the one in use every [`SAMPLE_EVERY`]-th call below
    /// [`SAMPLE_ALL_BYTES`] (every call from there).
    fn times(&self, i: usize) -> bool {
        i != self.current
            || self.agreements < LEARNING_AGREEMENTS
            || self.calls % self.sample_every == 0
    }

    /// Records a call of candidate `i` that took `secs` on this rank (`None`: not timed;
    /// counted once it has run [`SETTLE_CALLS`] calls in a row); `true` when the ranks
    /// agree now (after this call).
    fn record(&mut self, i: usize, secs: Option<f64>) -> bool {
        if self.algos.len() == 1 {
            // Nothing to compare with: keep no samples (they would pile up unread).
            return false;
        }
        self.last = if self.last.0 == i {
            (i, self.last.1 + 1)
        } else {
            (i, 1)
        };
        if let (true, Some(secs)) = (self.last.1 > SETTLE_CALLS, secs) {
            self.local[i].push(secs);
        }
        self.calls += 1;
        self.calls % self.agree_every == 0
    }

    /// This rank's median seconds per call of each candidate since the last agreement
    /// (the median: a preempted call must not decide; 0 for a candidate without calls,
    /// the same on every rank, as the schedule is).
    fn local_medians(&self) -> Vec<f32> {
        self.local
            .iter()
            .map(|l| cost_model::median(l) as f32)
            .collect()
    }

    /// Takes the all-reduced sums of the ranks' medians and moves to the fastest
    /// candidate when it was [`SWITCH_MARGIN`] faster than the one in use; past learning,
    /// keeping the one in use lengthens the window ([`Candidates::window`]); a switch, or
    /// a move of the agreed time in use by [`CLOSE`] or more, starts it over.
    fn agree(&mut self, sums: &[f32]) {
        let before = self.agreed[self.current];
        for ((agreed, local), &sum) in self.agreed.iter_mut().zip(&self.local).zip(sums) {
            if !local.is_empty() {
                let t = sum as f64;
                *agreed = Some(agreed.map_or(t, |old| 0.5 * (old + t)));
            }
        }
        self.local.iter_mut().for_each(Vec::clear);
        self.agreements += 1;
        let fastest = (0..self.algos.len())
            .filter_map(|i| Some((i, self.agreed[i]?)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let (Some(now), Some((i, t))) = (self.agreed[self.current], fastest) {
            if t < now * (1.0 - SWITCH_MARGIN) {
                self.current = i;
                self.kept = 0;
                return;
            }
        }
        // The time in use moved by more than CLOSE: the machine changed, and the others'
        // agreed times, from before, may no longer rank them; explore often again.
        let moved = match (before, self.agreed[self.current]) {
            (Some(a), Some(b)) => a.max(b) >= CLOSE * a.min(b),
            _ => false,
        };
        if moved {
            self.kept = 0;
        } else if self.agreements > LEARNING_AGREEMENTS {
            self.kept = self.kept.saturating_add(1);
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
                    bytes,
                )
            });
        timed(comm, state, |a| reduce_scatter(comm, buf, a, opts))
    }

    /// Calls of a collective that moves `bytes` before it explores at its slowest rate
    /// when the candidate in use stays the fastest (the first [`LEARNING_AGREEMENTS`]
    /// agreements, then the ones that lengthen the window up to [`EXPLORE_LONGEST`]), with
    /// the most candidates a size can have (fewer candidates agree in fewer calls): a
    /// benchmark of the steady state runs these first.
    pub fn learning_calls(bytes: usize) -> u64 {
        agree_every(bytes, MAX_OTHERS) * u64::from(LEARNING_AGREEMENTS + DOUBLINGS)
    }

    /// The all-reduce algorithm in use for `bytes` with `f32` on the wire (`None` before
    /// its first call).
    pub fn allreduce_in_use(&self, bytes: usize) -> Option<AllreduceAlgo> {
        let key = (bytes, WireType::F32);
        self.allreduce.get(&key).map(|c| c.algos[c.current])
    }

    /// The all-gather algorithm in use for `bytes` contributed per rank.
    pub fn allgather_in_use(&self, bytes: usize) -> Option<AllgatherAlgo> {
        self.allgather.get(&bytes).map(|c| c.algos[c.current])
    }

    /// The reduce-scatter algorithm in use for a `bytes` buffer with `f32` on the wire.
    pub fn reduce_scatter_in_use(&self, bytes: usize) -> Option<ReduceScatterAlgo> {
        let key = (bytes, WireType::F32);
        self.reduce_scatter.get(&key).map(|c| c.algos[c.current])
    }
}

/// The candidates of one (operation, size): `choice_for()` (the calibrated choice among
/// ours and `library`, `shared`) first, then [`others_of`] it; with a narrow wire type,
/// which only our message-passing algorithms carry, `ours()` alone.
fn candidates<C: Communicator + ?Sized, A: Copy + PartialEq>(
    comm: &C,
    wire: WireType,
    pair: [A; 2],
    choice_for: impl FnOnce() -> A,
    ours: impl FnOnce() -> A,
    bytes: usize,
) -> Candidates<A> {
    if wire != WireType::F32 {
        return Candidates::new(vec![ours()], bytes);
    }
    let choice = choice_for();
    let has = (comm.library().is_some(), comm.shared_segment().is_some());
    Candidates::new(others_of(choice, pair, has, ours()), bytes)
}

/// `choice` first, then what it is compared with: the library's collective and the
/// shared-memory algorithm where the communicator has them (`has`), and the best
/// message-passing algorithm of ours (`ours`), each once and none equal to `choice`. Why
/// all of them and not the calibration's runner-up alone: the calibration is taken once
/// and can be wrong by a wide margin on a shared machine. At P = 4 on two cores one priced
/// ring first for an all-gather of 1 MiB per rank, MPI's call second and the
/// shared-memory algorithm last; the choice, compared only with MPI's call, ended on ring
/// at 0.78× MPI while the shared-memory algorithm ran 2.5×.
fn others_of<A: Copy + PartialEq>(
    choice: A,
    [library, shared]: [A; 2],
    (has_library, has_segment): (bool, bool),
    ours: A,
) -> Vec<A> {
    let mut algos = vec![choice];
    let offered = [(library, has_library), (shared, has_segment), (ours, true)];
    for (a, has) in offered {
        if has && !algos.contains(&a) {
            algos.push(a);
        }
    }
    algos
}

/// Runs `call` with the candidate the schedule names, times it, and agrees with the other
/// ranks when it is time to.
fn timed<C: Communicator + ?Sized, A: Copy, R>(
    comm: &C,
    state: &mut Candidates<A>,
    call: impl FnOnce(A) -> Result<R>,
) -> Result<R> {
    if state.algos.len() == 1 {
        return call(state.algos[0]);
    }
    let i = state.next();
    let start = state.times(i).then(Instant::now);
    let out = call(state.algos[i])?;
    if state.record(i, start.map(|s| s.elapsed().as_secs_f64())) {
        let mut sums = state.local_medians();
        let algo = choose_allreduce_for(comm, sums.len() * 4, None);
        allreduce(comm, &mut sums, algo, &DenseOptions::default().unchecked())?;
        state.agree(&sums);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadComm;

    /// Drives the schedule of `n` candidates with synthetic times: candidate 0 takes one
    /// millisecond, candidate `i > 0` takes `t(i, call)` seconds; returns the candidate in
    /// use after each agreement.
    fn drive_n(n: u8, calls: u64, t: impl Fn(u8, u64) -> f64) -> Vec<usize> {
        let mut c = Candidates::new((0..n).collect(), 64 << 10);
        let mut in_use = Vec::new();
        for call in 0..calls {
            let i = c.next();
            let secs = if i == 0 { 1e-3 } else { t(i as u8, call) };
            if c.record(i, c.times(i).then_some(secs)) {
                let m = c.local_medians();
                c.agree(&m);
                in_use.push(c.current);
            }
        }
        in_use
    }

    /// [`drive_n`] with two candidates, the second taking `t1(call)` seconds.
    fn drive(calls: u64, t1: impl Fn(u64) -> f64) -> Vec<usize> {
        drive_n(2, calls, |_, call| t1(call))
    }

    #[test]
    fn switches_to_the_faster_candidate_and_back_when_the_machine_changes() {
        // Candidate 1 twice as fast for the first 400 calls, then three times slower.
        let in_use = drive(1200, |n| if n < 400 { 0.5e-3 } else { 3e-3 });
        assert_eq!(in_use[0], 1, "the first agreement already has both figures");
        assert_eq!(agree_every(64 << 10, 1) * LEARNING_AGREEMENTS as u64, 32);
        assert!(in_use[..20].iter().all(|&c| c == 1));
        assert_eq!(
            *in_use.last().unwrap(),
            0,
            "back once candidate 1 slowed down"
        );
    }

    #[test]
    fn finds_the_fastest_of_several_whatever_the_calibration_ranked_first() {
        // The calibration's choice (0) is the slowest; the last candidate is the fastest,
        // the middle one in between: the choice ends on the last one from the first
        // agreement on, and moves to the middle one when the last one slows down.
        let in_use = drive_n(3, 2000, |i, call| match i {
            1 => 0.8e-3,
            _ if call < 800 => 0.4e-3,
            _ => 2e-3,
        });
        assert_eq!(
            in_use[0], 2,
            "every candidate has a figure at the first agreement"
        );
        assert!(in_use[..40].iter().all(|&c| c == 2));
        assert_eq!(*in_use.last().unwrap(), 1);
        // Four candidates: all of them learn within `learning_calls`.
        let mut c = Candidates::new(vec![0u8, 1, 2, 3], 64 << 10);
        for call in 0..OnlineChoice::learning_calls(64 << 10) {
            let i = c.next();
            if c.record(i, Some(1e-3 * (4 - i) as f64)) {
                let m = c.local_medians();
                c.agree(&m);
            }
            assert!(call + 1 < c.agree_every * 2 || c.agreements >= LEARNING_AGREEMENTS);
        }
        assert!(c.agreed.iter().all(Option::is_some) && c.current == 3);
    }

    #[test]
    fn a_far_candidate_explores_less_from_the_first_agreement_on() {
        // Learning, after one agreement: candidate 1 close, candidate 2 three times slower.
        let mut c = Candidates::new(vec![0u8, 1, 2], 64 << 10);
        c.agreed = vec![Some(1.0), Some(1.1), Some(3.0)];
        c.agreements = 1;
        let calls = 2 * EXPLORE_EARLY * 16;
        let runs = explored(&mut c, calls);
        assert_eq!(
            runs[1],
            16 * EXPLORE_BURST,
            "the close one takes every turn"
        );
        assert_eq!(runs[2], 4 * EXPLORE_BURST, "the far one every fourth");
        // Before the first agreement, every candidate takes every turn.
        let mut c = Candidates::new(vec![0u8, 1, 2], 64 << 10);
        assert_eq!(explored(&mut c, calls)[1..], [16 * EXPLORE_BURST; 2]);
    }

    #[test]
    fn the_others_are_the_library_the_segment_and_ours_each_once() {
        // Candidates: 0 = library, 1 = shared memory, 2 and 3 = ours.
        let pair = [0u8, 1u8];
        let both = (true, true);
        assert_eq!(others_of(2, pair, both, 2), vec![2, 0, 1]);
        assert_eq!(others_of(2, pair, both, 3), vec![2, 0, 1, 3]);
        assert_eq!(others_of(0, pair, both, 3), vec![0, 1, 3]);
        assert_eq!(others_of(1, pair, both, 3), vec![1, 0, 3]);
        // Only what the communicator has.
        assert_eq!(others_of(2, pair, (false, true), 2), vec![2, 1]);
        assert_eq!(others_of(2, pair, (true, false), 2), vec![2, 0]);
        assert_eq!(others_of(0, pair, (true, false), 3), vec![0, 3]);
        assert_eq!(others_of(2, pair, (false, false), 2), vec![2]);
    }

    /// Calls of each candidate in `calls` calls of the schedule past learning.
    fn explored(c: &mut Candidates<u8>, calls: u64) -> Vec<u64> {
        let mut runs = vec![0; c.algos.len()];
        for _ in 0..calls {
            runs[c.next()] += 1;
            c.calls += 1;
        }
        runs
    }

    #[test]
    fn keeps_the_choice_within_the_margin_and_explores_rarely() {
        // 2 % faster is within the margin: no switch.
        assert!(drive(2000, |_| 0.98e-3).iter().all(|&c| c == 0));
        // Past learning, a far candidate runs a burst in EXPLORE_EVERY calls.
        let mut c = Candidates::new(vec![0u8, 1u8], 64 << 10);
        c.agreed = vec![Some(1.0), Some(2.0)];
        c.agreements = LEARNING_AGREEMENTS;
        let runs = explored(&mut c, EXPLORE_EVERY * 10);
        assert_eq!(runs[1], 10 * EXPLORE_BURST);
        // Close figures: a burst in EXPLORE_CLOSE.
        c.agreed = vec![Some(1.0), Some(1.2)];
        assert_eq!(explored(&mut c, EXPLORE_CLOSE * 10)[1], 10 * EXPLORE_BURST);
        // Three candidates, one close and one far: the close one takes every turn (one
        // window in two), the far one every fourth turn.
        let mut c = Candidates::new(vec![0u8, 1, 2], 64 << 10);
        c.agreed = vec![Some(1.0), Some(1.2), Some(3.0)];
        c.agreements = LEARNING_AGREEMENTS;
        let runs = explored(&mut c, EXPLORE_EVERY * 2 * 10);
        assert_eq!(
            runs[1],
            EXPLORE_EVERY * 2 * 10 / (2 * EXPLORE_CLOSE) * EXPLORE_BURST
        );
        assert_eq!(runs[2], 10 * EXPLORE_BURST);
    }

    #[test]
    fn the_window_lengthens_while_the_choice_stays_and_starts_over_when_it_moves() {
        // Candidate 0 in use at 1 ms; candidate 1 close (1.1 ms), then candidate 0 slows
        // to 2 ms from call 3000 on and candidate 1 takes over.
        let mut c = Candidates::new(vec![0u8, 1], 64 << 10);
        let (mut windows, mut runs_of_1) = (Vec::new(), 0);
        for call in 0..6000u64 {
            let i = c.next();
            if (2048..2048 + 3 * EXPLORE_LONGEST).contains(&call) && i == 1 {
                runs_of_1 += 1;
            }
            let slow = if call < 3000 { 1e-3 } else { 2e-3 };
            let secs = [slow, 1.1e-3][i];
            if c.record(i, Some(secs)) {
                let m = c.local_medians();
                c.agree(&m);
                windows.push((call, c.window(), c.current));
            }
        }
        let longest = windows.iter().find(|w| w.1 == EXPLORE_LONGEST).unwrap();
        assert!(
            longest.0 < OnlineChoice::learning_calls(64 << 10),
            "{longest:?}"
        );
        assert!(windows.iter().filter(|w| w.0 < 3000).all(|w| w.2 == 0));
        // Past the ramp, the close candidate runs one burst per longest window.
        assert_eq!(runs_of_1, 3 * EXPLORE_BURST);
        // Candidate 0 slowed: the window started over and the choice moved to 1.
        let after = windows.iter().find(|w| w.0 >= 3000 && w.2 == 1).unwrap();
        assert!(windows
            .iter()
            .any(|w| (3000..=after.0).contains(&w.0) && w.1 == EXPLORE_CLOSE));
        assert!(after.0 < 3000 + 4 * EXPLORE_LONGEST, "{after:?}");
        assert_eq!(windows.last().unwrap().2, 1);
        // The time in use doubles while the other stays slower: no switch, but the window
        // starts over.
        let mut c = Candidates::new(vec![0u8, 1], 64 << 10);
        let mut windows = Vec::new();
        for call in 0..3000u64 {
            let i = c.next();
            let secs = [if call < 2000 { 1e-3 } else { 2e-3 }, 3e-3][i];
            if c.record(i, Some(secs)) {
                let m = c.local_medians();
                c.agree(&m);
                windows.push((call, c.window(), c.current));
            }
        }
        assert!(windows.iter().all(|w| w.2 == 0));
        let at = |call: u64| windows.iter().rev().find(|w| w.0 < call).unwrap().1;
        assert_eq!(at(2000), EXPLORE_LONGEST);
        assert!(windows
            .iter()
            .any(|w| (2000..2200).contains(&w.0) && w.1 == EXPLORE_CLOSE));
    }

    #[test]
    fn small_calls_time_a_quarter_of_the_calls_in_use_and_still_find_the_fastest() {
        // 4 KiB: candidate 2 fastest; every call of the others is timed, a quarter of
        // the calls in use.
        let mut c = Candidates::new(vec![0u8, 1, 2], 4 << 10);
        let (mut timed_in_use, mut in_use, mut timed_other) = (0, 0, 0);
        for call in 0..20_000u64 {
            let i = c.next();
            let timed = c.times(i);
            if i == c.current && call >= 10_000 {
                in_use += 1;
                timed_in_use += u32::from(timed);
            } else if i != c.current {
                assert!(timed);
                timed_other += 1;
            }
            let secs = [3e-6, 2e-6, 1e-6][i];
            if c.record(i, timed.then_some(secs)) {
                let m = c.local_medians();
                c.agree(&m);
            }
        }
        assert_eq!(c.current, 2);
        assert!(timed_other > 0);
        let share = f64::from(timed_in_use) / f64::from(in_use);
        assert!((share - 1.0 / SAMPLE_EVERY as f64).abs() < 0.02, "{share}");
        // From 64 KiB every call is timed.
        let c = Candidates::new(vec![0u8, 1], SAMPLE_ALL_BYTES);
        assert!((0..4).all(|_| c.times(0)));
    }

    #[test]
    fn with_one_candidate_it_never_explores_nor_agrees() {
        let mut c = Candidates::new(vec![7u8], 4);
        for _ in 0..1000 {
            assert_eq!(c.next(), 0);
            assert!(!c.record(0, Some(1e-6)));
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
            Ok((ar.algos.clone(), rs.algos.clone()))
        })
        .unwrap();
        let (ar, rs) = &out[0];
        assert!(ar.len() == 1 && ar[0] != AllreduceAlgo::SharedMemory);
        assert!(rs.len() == 1 && rs[0] != ReduceScatterAlgo::SharedMemory);
    }

    fn all_agreed<A>(c: &Candidates<A>) -> bool {
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
                // Not vacuous: every candidate ran and was agreed on at every size.
                assert!(online.allreduce.values().all(all_agreed), "p {p}");
                assert!(online.allgather.values().all(all_agreed), "p {p}");
                assert!(online.reduce_scatter.values().all(all_agreed), "p {p}");
                Ok(seen)
            })
            .unwrap();
            assert!(out.iter().all(|s| s == &out[0]), "p {p}: ranks disagree");
            assert!(out[0].iter().all(|s| s.0.is_some()));
        }
    }
}
