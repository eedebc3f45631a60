//! Calibration on a live communicator: a ping-pong sweep for the link's α and β, sweeps of the
//! collectives (time against bytes, fitted by `cost_model::fit` as one line and as a piecewise α-β
//! model with one line per size regime), a local reduction sweep for γ (one line and one per size
//! regime) and a top-k timing sweep fitted per size regime (`a_i + b_i·d`: the fixed cost per call
//! dominates small tensors, which OMGS-SGD's `γρ·d·log d`
//! (Shi et al., INFOCOM 2020, §V-B: d ∈ [1K, 1M], ρ = 0.001) has no term for). The result is a
//! [`cost_model::Calibration`] that the planner and the dense chooser read; [`Calibration`]
//! implements [`crate::dense::Predictor`] here.
//!
//! Timing: every measurement is `barrier; start; op; barrier; stop` on every rank and the
//! sample is rank 0's median over the repeats, so one slow repeat on a shared machine does
//! not skew the fit. Top-k and reduction sweeps run on rank 0 while the others wait.

use std::time::Instant;

use cost_model::dense::{predict_dense, DenseCase};
use cost_model::fit::{
    fit_linear, fit_piecewise, fit_reduction, fit_reduction_piecewise, fit_topk_piecewise, Fitted,
    Sample,
};
use cost_model::{Algorithm, Calibration, Collective, CollectiveFit, Link, TopkFit, Topology};
use sparsify::{ErrorFeedback, Selector};

use crate::dense::{
    allgather, allreduce, reduce_scatter, AllgatherAlgo, AllreduceAlgo, BroadcastAlgo,
    DenseOptions, Predictor, ReduceScatterAlgo,
};
use crate::{Communicator, Error, Result};

/// Tag of the ping-pong messages.
const PING: crate::Tag = 0x6F00;

/// What to sweep.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// Message sizes in bytes for the ping-pong and the collective sweeps.
    pub sizes: Vec<usize>,
    /// Repeats per size (the median is kept).
    pub reps: usize,
    /// All-reduce algorithms to sweep.
    pub allreduce: Vec<AllreduceAlgo>,
    /// All-gather algorithms to sweep (bytes = each rank's contribution).
    pub allgather: Vec<AllgatherAlgo>,
    /// Reduce-scatter algorithms to sweep (bytes = the whole buffer).
    pub reduce_scatter: Vec<ReduceScatterAlgo>,
    /// Tensor sizes (elements) for the top-k sweep; empty skips it.
    pub topk_sizes: Vec<usize>,
    /// Density of the top-k sweep.
    pub density: f64,
    /// Also sweep the transport library's own all-reduce, all-gather and reduce-scatter
    /// (the `Library` algorithms) when the communicator has them (MPI), so that the
    /// automatic choice (`choose_allreduce_for`, ...) can rank the library beside ours.
    pub library: bool,
    /// Also sweep the `SharedMemory` algorithms when the communicator has a shared segment
    /// (all ranks on one machine), so that the automatic choice can rank them.
    pub shared_memory: bool,
}

impl Default for CalibrateOptions {
    /// 1 KiB … 16 MiB in ×4 steps, 5 repeats, every algorithm the automatic choice ranks
    /// ([`sweepable_allreduce`], every all-gather and reduce-scatter), top-k over 1K … 16M
    /// elements in ×√2 steps at ρ = 0.001 (the density of OMGS-SGD (Shi et al., INFOCOM
    /// 2020) §V-B, whose merged groups reach 10^7 elements; ×√2 steps so that each size
    /// regime, including the one-octave steps where exact selection changes method, has
    /// several sizes). The sweep ended at 1M until 2026-11-29: from 2^20 the selectors run
    /// on the pool, so 2^20 was the only size of that regime and could not get a line of
    /// its own; on a 16-core host at P = 3 (5 threads a rank) the exact fit then missed by
    /// 22 %.
    fn default() -> Self {
        CalibrateOptions {
            sizes: (0..8).map(|i| 1024usize << (2 * i)).collect(),
            reps: 5,
            allreduce: sweepable_allreduce(),
            allgather: AllgatherAlgo::ALL.to_vec(),
            reduce_scatter: ReduceScatterAlgo::ALL.to_vec(),
            // ×√2 steps, rounded to whole blocks of 16 elements.
            topk_sizes: (20..=48)
                .map(|h| ((2f64.powf(f64::from(h) / 2.0) / 16.0).round() as usize) * 16)
                .collect(),
            density: 0.001,
            library: true,
            shared_memory: true,
        }
    }
}

impl CalibrateOptions {
    /// What [`calibrate`] and [`validate`] sweep on `comm`: these options, plus the
    /// `SharedMemory` algorithm of each swept operation when
    /// [`CalibrateOptions::shared_memory`] is set and `comm` has a shared segment, and the
    /// `Library` algorithm when [`CalibrateOptions::library`] is set and `comm` has library
    /// collectives. Every rank gets the same lists (the
    /// transport is the same on every rank).
    pub fn for_comm<C: Communicator + ?Sized>(&self, comm: &C) -> CalibrateOptions {
        let mut o = self.clone();
        /// Adds `a` to a sweep that is not empty (an operation left out stays out).
        fn add<A: PartialEq>(v: &mut Vec<A>, a: A) {
            if !v.is_empty() && !v.contains(&a) {
                v.push(a);
            }
        }
        if self.shared_memory && comm.shared_segment().is_some() {
            add(&mut o.allreduce, AllreduceAlgo::SharedMemory);
            add(&mut o.allgather, AllgatherAlgo::SharedMemory);
            add(&mut o.reduce_scatter, ReduceScatterAlgo::SharedMemory);
        }
        if self.library && comm.library().is_some() {
            add(&mut o.allreduce, AllreduceAlgo::Library);
            add(&mut o.allgather, AllgatherAlgo::Library);
            add(&mut o.reduce_scatter, ReduceScatterAlgo::Library);
        }
        o
    }
}

/// The all-reduce algorithms a calibration sweeps: every one of [`AllreduceAlgo::all`]
/// except the 2D torus, whose layout comes from the transport's nodes and not from one
/// fixed parameter (it is priced by its schedule instead).
pub fn sweepable_allreduce() -> Vec<AllreduceAlgo> {
    AllreduceAlgo::all(2)
        .into_iter()
        .filter(|a| !matches!(a, AllreduceAlgo::Torus2d { .. }))
        .collect()
}

/// Times `op` `reps` times between barriers and returns the median seconds (each rank its
/// own; they agree to within a barrier).
pub fn time_op<C: Communicator + ?Sized>(
    comm: &C,
    reps: usize,
    mut op: impl FnMut() -> Result<()>,
) -> Result<f64> {
    // One untimed warm-up run (page faults of fresh buffers, thread wake-ups).
    comm.barrier()?;
    op()?;
    let mut t = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        comm.barrier()?;
        let start = Instant::now();
        op()?;
        comm.barrier()?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(cost_model::median(&t))
}

/// Bytes a ping-pong timing moves at least (short messages repeat the round trip).
const PINGPONG_TIMED_BYTES: usize = 64 << 10;

/// Most round trips in one ping-pong timing.
const PINGPONG_MAX_TRIPS: usize = 32;

/// Calls per timing of a collective that moves `bytes`: short ones run several times
/// between the barriers (as the OSU benchmarks do), so that the barrier and the clock do
/// not dominate an operation of a few µs. Depends on the size alone, so all ranks agree.
pub fn calls_per_timing(bytes: usize) -> usize {
    (PINGPONG_TIMED_BYTES / bytes.max(1)).clamp(1, PINGPONG_MAX_TRIPS)
}

/// The order of `n` cases in round `round` of a measurement in turns: a permutation drawn
/// afresh for every round from a seed that `round` fixes, so every rank runs the same
/// order. No case always runs first (right after a barrier or a reduction of the times)
/// or right after the same neighbour, whose traffic leaves the caches in a state of its
/// own: rotating the order kept every case's neighbour, and the bench's automatic choice,
/// always timed right after the library's call, measured up to 1.3× slower than the very
/// same algorithm's own row.
pub fn turn_order(n: usize, round: usize) -> Vec<usize> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(round as u64));
    order
}

/// One-way time between ranks 0 and 1 (half the round trip) for each size; every rank
/// returns the samples, meaningful on rank 0. Needs P ≥ 2.
///
/// Short messages make several round trips per timing ([`calls_per_timing`], as the OSU
/// latency test does), so that the barrier around each timing and the clock's resolution
/// do not dominate a round trip of a few µs. Each size takes [`reps_for`] timings, the
/// sizes timed in turns (a round times each once, in a fresh [`turn_order`]):
/// timed one size after another, a change in the machine's state during the sweep (on
/// threads, where the scheduler happened to put the two ranks) moved one stretch of sizes
/// by 2–3× and left a step no fit should follow. Medians per size.
pub fn pingpong<C: Communicator + ?Sized>(
    comm: &C,
    sizes: &[usize],
    reps: usize,
) -> Result<Vec<Sample>> {
    if comm.size() < 2 {
        return Err(Error::InvalidArgument(
            "a ping-pong needs at least 2 ranks".into(),
        ));
    }
    let msgs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    // Depend on the size alone, so all ranks agree on them.
    let trips: Vec<usize> = sizes.iter().map(|&n| calls_per_timing(n)).collect();
    let rounds: Vec<usize> = sizes.iter().map(|&n| reps_for(n, reps)).collect();
    let round_trips = |i: usize| -> Result<()> {
        for _ in 0..trips[i] {
            match comm.rank() {
                0 => {
                    comm.send(1, PING, &msgs[i])?;
                    comm.recv(1, PING)?;
                }
                1 => {
                    let m = comm.recv(0, PING)?;
                    comm.send(0, PING, &m)?;
                }
                _ => {}
            }
        }
        Ok(())
    };
    // Every size once untimed: the first round trips of a run pay for waking threads and
    // cores from idle (tens of µs on threads), and fresh buffers for their page faults.
    for i in 0..sizes.len() {
        comm.barrier()?;
        round_trips(i)?;
    }
    let n = sizes.len();
    let mut t: Vec<Vec<f64>> = rounds.iter().map(|&r| Vec::with_capacity(r)).collect();
    for rep in 0..rounds.iter().copied().max().unwrap_or(0) {
        for i in turn_order(n, rep) {
            if rep >= rounds[i] {
                continue;
            }
            comm.barrier()?;
            let start = Instant::now();
            round_trips(i)?;
            comm.barrier()?;
            t[i].push(start.elapsed().as_secs_f64());
        }
    }
    Ok(sizes
        .iter()
        .zip(&t)
        .zip(&trips)
        .map(|((&n, t), &trips)| Sample::new(n as f64, cost_model::median(t) / (2 * trips) as f64))
        .collect())
}

/// Times an all-reduce of `bytes` (f32) with `algo`: median seconds per call (see
/// [`reps_for`] and [`calls_per_timing`]).
pub fn time_allreduce<C: Communicator + ?Sized>(
    comm: &C,
    algo: AllreduceAlgo,
    bytes: usize,
    reps: usize,
) -> Result<f64> {
    Swept::Allreduce(algo).time(comm, bytes, reps)
}

/// Times an all-gather where each rank contributes `bytes` bytes.
pub fn time_allgather<C: Communicator + ?Sized>(
    comm: &C,
    algo: AllgatherAlgo,
    bytes: usize,
    reps: usize,
) -> Result<f64> {
    Swept::Allgather(algo).time(comm, bytes, reps)
}

/// Times a reduce-scatter of a `bytes` buffer (f32).
pub fn time_reduce_scatter<C: Communicator + ?Sized>(
    comm: &C,
    algo: ReduceScatterAlgo,
    bytes: usize,
    reps: usize,
) -> Result<f64> {
    Swept::ReduceScatter(algo).time(comm, bytes, reps)
}

/// Shortest timed interval of the local sweeps: operations faster than this are repeated
/// inside one timing, so timer resolution and one-off interruptions do not dominate.
const MIN_TIMED_S: f64 = 200e-6;

/// Untimed runs before each timing of [`time_local_in_turns`]: two, because the top-k
/// sweep's runs alternate between two gradient draws. With one, the first timed run read
/// the draw the warm-up had not touched, from memory, so a size timed one run at a time
/// (large ones) measured a cold gradient and one timed several runs at a time mostly warm
/// ones, and which of the two a size got hung on a single untimed measurement: on an Intel
/// 2-core VM, exact top-k at 92,688 elements came out at 150 µs in one sweep and 25 µs
/// in the next, and the top-k fit missed by 18–39 %.
const WARM_RUNS: usize = 2;

/// Median over `reps` timings of `op` (after a warm-up), each timing running `op` as many
/// times as it takes to last [`MIN_TIMED_S`]; seconds per run of `op`.
fn time_local(reps: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    let t = time_local_in_turns(&mut [()], reps, |_| {}, |_| op())?;
    Ok(cost_model::median(&t[0]).max(1e-9))
}

/// Seconds per run of `op` on each of `states`: `reps` timings each, each lasting at
/// least [`MIN_TIMED_S`], taken in turns (a round times every state once, in a fresh
/// [`turn_order`]) so that a change in the machine's load falls on all of them alike
/// instead of bending one stretch of a sweep. Before each timing, untimed: [`WARM_RUNS`]
/// runs (the previous state's runs evicted this one's buffers; a cold run timed alone, as
/// for the large sizes, against many warm ones, as for the small, bent the curve where the
/// buffers stop fitting in the last-level cache), then `reset`, so that every timing starts
/// from the same state.
fn time_local_in_turns<S>(
    states: &mut [S],
    reps: usize,
    mut reset: impl FnMut(&mut S),
    mut op: impl FnMut(&mut S) -> Result<()>,
) -> Result<Vec<Vec<f64>>> {
    let n = states.len();
    let mut inner = Vec::with_capacity(n);
    for st in states.iter_mut() {
        // The first runs warm caches and pages; the next says how long one run takes.
        for _ in 0..WARM_RUNS {
            op(st)?;
        }
        reset(st);
        let s = Instant::now();
        op(st)?;
        let once = s.elapsed().as_secs_f64().max(1e-9);
        inner.push(((MIN_TIMED_S / once).ceil() as usize).clamp(1, 1 << 16));
    }
    let reps = reps.max(1);
    let mut t = vec![Vec::with_capacity(reps); n];
    for rep in 0..reps {
        for i in turn_order(n, rep) {
            let st = &mut states[i];
            for _ in 0..WARM_RUNS {
                op(st)?;
            }
            reset(st);
            let s = Instant::now();
            for _ in 0..inner[i] {
                op(st)?;
            }
            t[i].push(s.elapsed().as_secs_f64() / inner[i] as f64);
        }
    }
    Ok(t)
}

/// Local `f32` summation time against bytes (γ of Linear Pipelining (Wang et al.), Table 1).
pub fn reduction_sweep(sizes: &[usize], reps: usize) -> Vec<Sample> {
    sizes
        .iter()
        .map(|&n| {
            let x = vec![1.0f32; n / 4];
            let mut acc = vec![0.5f32; n / 4];
            let t = time_local(reps, || {
                for (a, b) in acc.iter_mut().zip(&x) {
                    *a += *b;
                }
                std::hint::black_box(&mut acc);
                Ok(())
            })
            .unwrap_or(f64::NAN);
            Sample::new(n as f64, t)
        })
        .collect()
}

/// A deterministic pseudo-random gradient of `d` elements (xorshift), magnitudes spread
/// out; `seed` makes the ranks' gradients differ.
fn sweep_gradient(d: usize, seed: u64) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0xA24B_AED4_963E_E407);
    (0..d)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// Fewest timings per size of [`topk_sweep`].
const TOPK_MIN_REPS: usize = 21;

/// Top-k selection time of each selector that `make` builds against tensor size
/// (elements) at `density`: one error-feedback step (`r += g`, select, zero the selected
/// entries of `r`), the call a training step makes. Medians of at least 21 timings (`reps`
/// when more), every (selector, size) pair timed in turns (`time_local_in_turns`); one
/// sample list per selector. The sizes that the fit misses by more than its target
/// (`topk_outliers`) are timed again, up to `RETIME_ROUNDS` times, the new timings
/// pooled with the first ones. Each pair has a selector of its own, as each group of a
/// training step does, and its calls alternate between two gradient draws. `calibrate`
/// builds them with the warm start off ([`sparsify::ExactTopK::set_warm_start`]): the
/// residual reset between timings, a pattern no training run has, kept a warm selector in
/// its transient, slower than cold at 14 and 16 of the 17 default sizes that start warm
/// (two runs). The cold step is what a new group's first step costs; after a run's first
/// steps the warm one was faster, or level within the noise (`docs/results/topk.md`).
pub fn topk_sweep(
    make: &[&dyn Fn() -> Box<dyn Selector>],
    sizes: &[usize],
    density: f64,
    reps: usize,
) -> Result<Vec<Vec<Sample>>> {
    // A top-k step takes 1 µs to 1 ms; a median of few timings left the fixed-cost regime's
    // samples scattered by more than the fit's goal on a shared 2-core machine, and timing
    // one size after another let a load that came and went bend one stretch of the curve.
    let reps = reps.max(TOPK_MIN_REPS);
    let grads: Vec<[Vec<f32>; 2]> = sizes
        .iter()
        .map(|&d| [sweep_gradient(d, 0), sweep_gradient(d, 1)])
        .collect();
    let ks: Vec<usize> = sizes
        .iter()
        .map(|&d| ((d as f64 * density).round() as usize).max(1))
        .collect();
    let n = sizes.len();
    if n == 0 {
        return Ok(vec![Vec::new(); make.len()]);
    }
    // (selector, size, its calls so far, residual): every timing starts from a zero
    // residual, the state of the bench's top-k suite and of the composite validation; a
    // residual carried over thousands of steps of one fixed gradient is a state no
    // training reaches.
    let mut states: Vec<TopkState> = make
        .iter()
        .flat_map(|m| (0..n).map(move |j| (m(), j, 0, ErrorFeedback::new(sizes[j]))))
        .collect();
    let time = |states: &mut [&mut TopkState]| {
        time_local_in_turns(
            states,
            reps,
            |st| st.3.reset(),
            |st| {
                let (sel, j, calls, ef) = &mut **st;
                let g = &grads[*j][*calls % 2];
                *calls += 1;
                let (sg, _) = ef.step(sel.as_mut(), g, ks[*j])?;
                std::hint::black_box(sg.nnz());
                // Recycled as the sparse algorithms do, so the fit is the hot path's cost.
                sel.recycle(sg);
                Ok(())
            },
        )
    };
    let mut t = time(&mut states.iter_mut().collect::<Vec<_>>())?;
    for _ in 0..RETIME_ROUNDS {
        let samples = topk_samples(sizes, &t);
        let again: Vec<usize> = samples
            .iter()
            .enumerate()
            .flat_map(|(s, list)| topk_outliers(list).into_iter().map(move |j| s * n + j))
            .collect();
        if again.is_empty() {
            break;
        }
        let mut sub: Vec<_> = states
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| again.contains(i))
            .map(|(_, st)| st)
            .collect();
        for (&i, more) in again.iter().zip(time(&mut sub)?) {
            t[i].extend(more);
        }
    }
    Ok(topk_samples(sizes, &t))
}

/// One (selector, size) pair of [`topk_sweep`]: its selector, the size's index, its calls
/// so far and its residual.
type TopkState = (Box<dyn Selector>, usize, usize, ErrorFeedback);

/// One sample list per selector from the timings of [`topk_sweep`]'s (selector, size)
/// pairs, selector-major: the median of each pair's timings.
fn topk_samples(sizes: &[usize], t: &[Vec<f64>]) -> Vec<Vec<Sample>> {
    t.chunks(sizes.len().max(1))
        .map(|t| {
            sizes
                .iter()
                .zip(t)
                .map(|(&d, t)| Sample::new(d as f64, cost_model::median(t).max(1e-9)))
                .collect()
        })
        .collect()
}

/// Indices of the samples that the top-k fit ([`fit_topk_piecewise`]) misses by more than
/// [`cost_model::fit::PIECEWISE_TARGET_REL`]: the sizes [`topk_sweep`] times again, as
/// [`retime_outliers`] does for the collectives. On a quiet 2-core machine 60 sweeps of
/// the default sizes fitted within 10.8 %; one taken under `mpirun -n 3`, with two more
/// ranks on the two cores, missed by 16.1 %.
fn topk_outliers(samples: &[Sample]) -> Vec<usize> {
    let Ok(fit) = fit_topk_piecewise(samples) else {
        return Vec::new();
    };
    missed(samples, |d| fit.model.time(d as usize)).collect()
}

/// Indices of the samples that `predict` misses by more than
/// [`cost_model::fit::PIECEWISE_TARGET_REL`] of the measured time.
fn missed<'a>(
    samples: &'a [Sample],
    predict: impl Fn(f64) -> f64 + 'a,
) -> impl Iterator<Item = usize> + 'a {
    samples.iter().enumerate().filter_map(move |(j, s)| {
        let rel = ((predict(s.size) - s.time_s) / s.time_s).abs();
        (rel > cost_model::fit::PIECEWISE_TARGET_REL).then_some(j)
    })
}

/// One dense algorithm that [`CalibrateOptions`] sweeps: what [`calibrate`] times and fits
/// and [`validate`] compares with the prediction.
#[derive(Debug, Clone, Copy)]
enum Swept {
    Allreduce(AllreduceAlgo),
    Allgather(AllgatherAlgo),
    ReduceScatter(ReduceScatterAlgo),
}

impl Swept {
    /// Every swept algorithm of `opts`, the all-reduces first.
    fn all(opts: &CalibrateOptions) -> impl Iterator<Item = Swept> + '_ {
        let ar = opts.allreduce.iter().copied().map(Swept::Allreduce);
        let rs = opts
            .reduce_scatter
            .iter()
            .copied()
            .map(Swept::ReduceScatter);
        ar.chain(opts.allgather.iter().copied().map(Swept::Allgather))
            .chain(rs)
    }

    fn op(self) -> Collective {
        match self {
            Swept::Allreduce(_) => Collective::Allreduce,
            Swept::Allgather(_) => Collective::Allgather,
            Swept::ReduceScatter(_) => Collective::ReduceScatter,
        }
    }

    /// The pipeline block size, for the algorithms that take one.
    fn block_bytes(self) -> Option<usize> {
        match self {
            Swept::Allreduce(AllreduceAlgo::LinearPipeline { block_bytes }) => Some(block_bytes),
            _ => None,
        }
    }

    /// The cost model's name of the algorithm.
    fn name(self) -> Algorithm {
        match self {
            Swept::Allreduce(a) => allreduce_name(&a),
            Swept::Allgather(a) => allgather_name(&a),
            Swept::ReduceScatter(a) => reduce_scatter_name(&a),
        }
    }

    /// Bytes one call moves, which sets its [`calls_per_timing`] (an all-gather's output).
    fn moved(self, p: usize, bytes: usize) -> usize {
        match self {
            Swept::Allgather(_) => bytes * p,
            Swept::Allreduce(_) | Swept::ReduceScatter(_) => bytes,
        }
    }

    /// Runs `calls` calls for `bytes` on the front of the sweep's shared buffers.
    fn run<C: Communicator + ?Sized>(
        self,
        comm: &C,
        bufs: &mut SweepBufs,
        bytes: usize,
        calls: usize,
    ) -> Result<()> {
        let opts = DenseOptions::default().unchecked();
        let p = comm.size();
        for _ in 0..calls {
            match self {
                Swept::Allreduce(a) => allreduce(comm, &mut bufs.floats[..bytes / 4], a, &opts)?,
                Swept::Allgather(a) => allgather(
                    comm,
                    &bufs.mine[..bytes],
                    &mut bufs.out[..bytes * p],
                    a,
                    &opts,
                )?,
                Swept::ReduceScatter(a) => {
                    reduce_scatter(comm, &mut bufs.floats[..bytes / 4], a, &opts)?;
                }
            }
        }
        Ok(())
    }

    /// Measured seconds per call for `bytes`, alone (the sweep's timing of one algorithm).
    fn time<C: Communicator + ?Sized>(self, comm: &C, bytes: usize, reps: usize) -> Result<f64> {
        Ok(cost_model::median(
            &time_swept_in_turns(comm, &[self], &[bytes], reps)?[0][0],
        ))
    }

    /// The calibration's prediction (see [`Predictor`]).
    fn predict(self, cal: &Calibration, p: usize, bytes: usize) -> Option<f64> {
        match self {
            Swept::Allreduce(a) => cal.allreduce_s(&a, p, bytes),
            Swept::Allgather(a) => cal.allgather_s(&a, p, bytes),
            Swept::ReduceScatter(a) => cal.reduce_scatter_s(&a, p, bytes),
        }
    }
}

/// The buffers of the collective sweep, sized for its largest size and shared by every
/// swept algorithm and size (one runs at a time, on the front of them), so the sweep holds
/// the memory of one algorithm at one size.
struct SweepBufs {
    /// An all-reduce's or a reduce-scatter's buffer (summed in place).
    floats: Vec<f32>,
    /// An all-gather's own block and output.
    mine: Vec<u8>,
    out: Vec<u8>,
}

impl SweepBufs {
    fn new(algos: &[Swept], p: usize, rank: usize, bytes: usize) -> SweepBufs {
        let any = |f: fn(&Swept) -> bool| algos.iter().any(f);
        let gathers = any(|a| matches!(a, Swept::Allgather(_)));
        let sums = any(|a| !matches!(a, Swept::Allgather(_)));
        SweepBufs {
            floats: if sums {
                vec![1.0; bytes / 4]
            } else {
                Vec::new()
            },
            mine: if gathers {
                vec![rank as u8; bytes]
            } else {
                Vec::new()
            },
            out: if gathers {
                vec![0; bytes * p]
            } else {
                Vec::new()
            },
        }
    }
}

/// Rounds of a collective sweep at `bytes`: at least `reps`, and more for small sizes,
/// where a round costs microseconds and a median of a handful on a shared machine moves by
/// more than the margins the chooser decides on (up to 200, while the rounds move at most
/// 16 MiB in all).
pub fn reps_for(bytes: usize, reps: usize) -> usize {
    reps.max(((16usize << 20) / bytes.max(1)).min(200)).max(1)
}

/// Seconds per call of every algorithm of `algos` at every size of `sizes` (bytes),
/// `[size][algorithm]`, measured in turns: rounds in which each
/// size still short of its [`reps_for`] timings, and at it each algorithm, runs its
/// [`calls_per_timing`] calls between barriers, the sizes and the algorithms at each size
/// in a fresh [`turn_order`] every round. Every timing follows one untimed call at its size, so that its
/// buffers come from cache as when one size is timed after another. A change in the
/// machine's load then falls on all sizes and algorithms alike: the chooser, which compares
/// algorithms, compares like with like (timed one algorithm after another, a load that came
/// and went made a slower algorithm look faster), and the fits, which follow sizes, follow
/// no step that a load left in one stretch of them. Every timing, per rank (the sweep
/// keeps their medians). The buffers are the largest size's, smaller sizes use their front.
fn time_swept_in_turns<C: Communicator + ?Sized>(
    comm: &C,
    algos: &[Swept],
    sizes: &[usize],
    reps: usize,
) -> Result<Vec<Vec<Vec<f64>>>> {
    let p = comm.size();
    let most = sizes.iter().copied().max().unwrap_or(0);
    let mut bufs = SweepBufs::new(algos, p, comm.rank(), most);
    let calls = |a: &Swept, bytes: usize| calls_per_timing(a.moved(p, bytes));
    let (na, ns) = (algos.len(), sizes.len());
    let rounds: Vec<usize> = sizes.iter().map(|&b| reps_for(b, reps)).collect();
    let mut t: Vec<Vec<Vec<f64>>> = rounds
        .iter()
        .map(|&r| vec![Vec::with_capacity(r); na])
        .collect();
    for rep in 0..rounds.iter().copied().max().unwrap_or(0) {
        for j in turn_order(ns, rep) {
            if rep >= rounds[j] {
                continue;
            }
            let bytes = sizes[j];
            for i in turn_order(na, rep * ns + j) {
                let c = calls(&algos[i], bytes);
                // Untimed: another size or algorithm ran last and may have evicted this
                // one's buffers (and the first call of a run faults its pages in).
                algos[i].run(comm, &mut bufs, bytes, 1)?;
                comm.barrier()?;
                let start = Instant::now();
                algos[i].run(comm, &mut bufs, bytes, c)?;
                comm.barrier()?;
                t[j][i].push(start.elapsed().as_secs_f64() / c as f64);
            }
        }
    }
    Ok(t)
}

/// Rounds of [`retime_outliers`] at most.
const RETIME_ROUNDS: usize = 2;

/// Times again, in turns as before, the sizes at which some algorithm's piecewise fit of
/// the medians of `t` (`[size][algorithm]`, as [`time_swept_in_turns`] returns) misses by
/// more than the fit's own target ([`cost_model::fit::PIECEWISE_TARGET_REL`]), adding the
/// new timings to the old ones, for up to [`RETIME_ROUNDS`] rounds. On a shared machine a
/// load that came while one size was timed can leave that size off every trend (a P = 2
/// sweep once timed the 8 MiB shared-memory reduce-scatter at 4.8 ms and 16 MiB at
/// 2.5 ms): more timings there, pooled with the first ones, settle its median. Rank 0
/// decides which sizes, from its own timings, and tells the others. Returns how many
/// sizes were timed again in all.
fn retime_outliers<C: Communicator + ?Sized>(
    comm: &C,
    algos: &[Swept],
    sizes: &[usize],
    reps: usize,
    t: &mut [Vec<Vec<f64>>],
) -> Result<usize> {
    let mut retimed = 0;
    for _ in 0..RETIME_ROUNDS {
        let mut mask = vec![0u64; sizes.len().div_ceil(64).max(1)];
        if comm.rank() == 0 {
            mask = outlier_sizes(sizes, t, algos.len());
        }
        let opts = DenseOptions::default().unchecked();
        crate::dense::broadcast(comm, &mut mask, 0, BroadcastAlgo::Binomial, &opts)?;
        let at: Vec<usize> = (0..sizes.len())
            .filter(|&j| mask[j / 64] >> (j % 64) & 1 == 1)
            .collect();
        if at.is_empty() {
            break;
        }
        let sub: Vec<usize> = at.iter().map(|&j| sizes[j]).collect();
        let more = time_swept_in_turns(comm, algos, &sub, reps)?;
        for (&j, m) in at.iter().zip(more) {
            for (old, new) in t[j].iter_mut().zip(m) {
                old.extend(new);
            }
        }
        retimed += at.len();
    }
    Ok(retimed)
}

/// The sizes (bit `j % 64` of word `j / 64` for `sizes[j]`; at least one word) at which
/// the piecewise fit of some algorithm's medians misses by more than
/// [`cost_model::fit::PIECEWISE_TARGET_REL`].
fn outlier_sizes(sizes: &[usize], t: &[Vec<Vec<f64>>], algos: usize) -> Vec<u64> {
    let mut mask = vec![0u64; sizes.len().div_ceil(64).max(1)];
    for a in 0..algos {
        let samples: Vec<Sample> = sizes
            .iter()
            .zip(t)
            .map(|(&n, t)| Sample::new(n as f64, cost_model::median(&t[a])))
            .collect();
        let Ok(fit) = fit_piecewise(&samples, cost_model::calibration::MAX_SEGMENTS) else {
            continue;
        };
        for j in missed(&samples, |n| fit.model.time_f(n)) {
            mask[j / 64] |= 1 << (j % 64);
        }
    }
    mask
}

/// Progress reports of [`calibrate`]: `(stage, done, total)`.
pub type Progress<'a> = &'a mut dyn FnMut(&str, usize, usize);

/// Runs every sweep on `comm` and fits the models. Collective on all ranks; every rank
/// returns a calibration, rank 0's is the one to save. P must be at least 2.
pub fn calibrate<C: Communicator + ?Sized>(
    comm: &C,
    opts: &CalibrateOptions,
    progress: Progress,
) -> Result<Calibration> {
    Ok(calibrate_with_retimes(comm, opts, progress)?.0)
}

/// [`calibrate`], also returning for each collective how many of its sizes were timed
/// again because some fit missed them (see `retime_outliers`).
pub fn calibrate_with_retimes<C: Communicator + ?Sized>(
    comm: &C,
    opts: &CalibrateOptions,
    progress: Progress,
) -> Result<(Calibration, Vec<(Collective, usize)>)> {
    let opts = &opts.for_comm(comm);
    let p = comm.size();
    let swept = opts.allreduce.len() + opts.allgather.len() + opts.reduce_scatter.len();
    let total = opts.sizes.len() * (1 + swept) + 2;
    let mut done = 0;
    let mut tick = |stage: &str, done: &mut usize| {
        *done += 1;
        progress(stage, *done, total);
    };
    let pp = pingpong(comm, &opts.sizes, opts.reps)?;
    for _ in &opts.sizes {
        tick("ping-pong", &mut done);
    }
    let pingpong = fit_linear(&pp)?;
    let pingpong_piecewise = Some(fit_piecewise(&pp, cost_model::calibration::MAX_SEGMENTS)?);
    let link = Link::new(
        pingpong.model.alpha_s.max(0.0),
        pingpong.model.beta_s.max(0.0),
    );
    let mut collectives = Vec::new();
    // All sizes and algorithms of one collective are timed in turns (the algorithms are
    // what the chooser compares, the sizes what the fits follow), one collective after
    // another.
    let swept: Vec<Swept> = Swept::all(opts).collect();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); swept.len()];
    let mut retimed = Vec::new();
    for op in [
        Collective::Allreduce,
        Collective::Allgather,
        Collective::ReduceScatter,
    ] {
        let at: Vec<usize> = (0..swept.len()).filter(|&i| swept[i].op() == op).collect();
        if at.is_empty() {
            continue;
        }
        let algos: Vec<Swept> = at.iter().map(|&i| swept[i]).collect();
        let mut t = time_swept_in_turns(comm, &algos, &opts.sizes, opts.reps)?;
        retimed.push((
            op,
            retime_outliers(comm, &algos, &opts.sizes, opts.reps, &mut t)?,
        ));
        for (&n, t) in opts.sizes.iter().zip(t) {
            for (&i, t) in at.iter().zip(t) {
                samples[i].push(Sample::new(n as f64, cost_model::median(&t)));
                tick(op.name(), &mut done);
            }
        }
    }
    for (algo, s) in swept.into_iter().zip(samples) {
        let fit = CollectiveFit::from_samples(algo.op(), algo.name(), s)?;
        collectives.push(match algo.block_bytes() {
            Some(b) => fit.with_block_bytes(b),
            None => fit,
        });
    }
    // Local sweeps on rank 0 only; the others wait at an idle barrier (one that polls takes
    // a core from the sweep's threads: at P = 2 on 2 cores, half of them).
    let mut reduction = None;
    let mut reduction_piecewise = None;
    let mut topk = Vec::new();
    if comm.rank() == 0 {
        let red = reduction_sweep(&opts.sizes, opts.reps);
        reduction = Some(fit_reduction(&red, 0.0)?);
        reduction_piecewise = Some(fit_reduction_piecewise(&red)?);
        tick("reduction", &mut done);
        if !opts.topk_sizes.is_empty() {
            let swept = topk_sweep(
                &[
                    &|| Box::new(sparsify::ExactTopK::new().with_warm_start(false)),
                    &|| Box::new(sparsify::MsTopK::with_seed(1).with_warm_start(false)),
                ],
                &opts.topk_sizes,
                opts.density,
                opts.reps,
            )?;
            for (name, s) in ["exact", "mstopk"].into_iter().zip(swept) {
                topk.push(TopkFit {
                    selector: name.into(),
                    density: opts.density,
                    fit: fit_topk_piecewise(&s)?,
                });
            }
        }
        tick("top-k", &mut done);
    }
    comm.barrier_idle()?;
    let gamma = reduction.map(|r: Fitted<_>| r.model.gamma_s).unwrap_or(0.0);
    let topology = Topology::flat(p, link)?.with_gamma(gamma)?;
    let cal = Calibration {
        schema: cost_model::calibration::SCHEMA,
        backend: comm.backend(),
        ranks: p,
        topology,
        pingpong,
        pingpong_piecewise,
        reduction,
        reduction_piecewise,
        collectives,
        topk,
    };
    Ok((cal, retimed))
}

/// The cost model's name of an all-reduce algorithm.
pub fn allreduce_name(a: &AllreduceAlgo) -> Algorithm {
    match a {
        AllreduceAlgo::Ring => Algorithm::Ring,
        AllreduceAlgo::RecursiveDoubling => Algorithm::RecursiveDoubling,
        AllreduceAlgo::Rabenseifner => Algorithm::Rabenseifner,
        AllreduceAlgo::BidirectionalExchange => Algorithm::Be,
        AllreduceAlgo::Binomial => Algorithm::Binomial,
        AllreduceAlgo::LinearPipeline { .. } => Algorithm::Lp,
        AllreduceAlgo::Torus2d { .. } => Algorithm::Torus2d,
        AllreduceAlgo::Library => Algorithm::Library,
        AllreduceAlgo::SharedMemory => Algorithm::SharedMemory,
    }
}

/// The cost model's name of an all-gather algorithm.
pub fn allgather_name(a: &AllgatherAlgo) -> Algorithm {
    match a {
        AllgatherAlgo::Ring => Algorithm::Ring,
        AllgatherAlgo::RecursiveDoubling => Algorithm::RecursiveDoubling,
        AllgatherAlgo::Bruck => Algorithm::Bruck,
        AllgatherAlgo::Library => Algorithm::Library,
        AllgatherAlgo::SharedMemory => Algorithm::SharedMemory,
    }
}

/// The cost model's name of a reduce-scatter algorithm (recursive halving is the
/// reduce-scatter half of recursive doubling).
pub fn reduce_scatter_name(a: &ReduceScatterAlgo) -> Algorithm {
    match a {
        ReduceScatterAlgo::Ring => Algorithm::Ring,
        ReduceScatterAlgo::RecursiveHalving => Algorithm::RecursiveDoubling,
        ReduceScatterAlgo::Library => Algorithm::Library,
        ReduceScatterAlgo::SharedMemory => Algorithm::SharedMemory,
    }
}

/// The calibration's topology for `p` ranks, `ranks_per_node` per node (flat links).
fn topo_for(cal: &Calibration, p: usize, ranks_per_node: usize) -> Option<Topology> {
    let l = cal.topology.inter;
    let rpn = ranks_per_node.max(1);
    if p % rpn != 0 {
        return None;
    }
    Topology::new(p / rpn, rpn, cal.topology.intra, l)
        .and_then(|t| t.with_gamma(cal.topology.gamma_s_per_byte))
        .ok()
}

/// What a calibration says of one collective at P ranks: with measured fits for the
/// operation at the calibrated P, only those (their measured medians inside the sweep, the
/// piecewise fit outside it: two algorithms within the fit's error of each other are ranked
/// by what was measured, not by the smoothing) (an algorithm that was not swept, or LP swept
/// with another block size, is left out: a schedule prediction next to measured times
/// would compare a model with the machine); otherwise the exact schedule on the calibrated
/// links. This is what `choose_allreduce(p, bytes, Some(&calibration))` ranks by.
fn measured_or_schedule(
    cal: &Calibration,
    op: Collective,
    name: Algorithm,
    block: Option<usize>,
    p: usize,
    bytes: usize,
    schedule: impl FnOnce(&Calibration) -> Option<f64>,
) -> Option<f64> {
    if p == cal.ranks && cal.has_fits(op) {
        return cal
            .collectives
            .iter()
            .find(|c| c.op == op && c.algo == name && (block.is_none() || c.block_bytes == block))
            .map(|c| c.measured_time(bytes));
    }
    schedule(cal)
}

impl Predictor for Calibration {
    fn allreduce_s(&self, algo: &AllreduceAlgo, p: usize, bytes: usize) -> Option<f64> {
        let name = allreduce_name(algo);
        let (rpn, block) = match *algo {
            AllreduceAlgo::Torus2d { ranks_per_node } => (ranks_per_node, 64 << 10),
            AllreduceAlgo::LinearPipeline { block_bytes } => (1, block_bytes),
            _ => (1, 64 << 10),
        };
        let lp_block = matches!(algo, AllreduceAlgo::LinearPipeline { .. }).then_some(block);
        let op = Collective::Allreduce;
        measured_or_schedule(self, op, name, lp_block, p, bytes, |cal| {
            let topo = topo_for(cal, p, rpn)?;
            let case = DenseCase::new(op, name, bytes / 4).with_block_bytes(block);
            predict_dense(&case, &topo).ok().map(|p| p.time_s)
        })
    }

    fn allgather_s(&self, algo: &AllgatherAlgo, p: usize, bytes: usize) -> Option<f64> {
        let name = allgather_name(algo);
        let op = Collective::Allgather;
        measured_or_schedule(self, op, name, None, p, bytes, |cal| {
            let topo = topo_for(cal, p, 1)?;
            let case = DenseCase::new(op, name, bytes).with_elem_bytes(1);
            predict_dense(&case, &topo).ok().map(|p| p.time_s)
        })
    }

    fn reduce_scatter_s(&self, algo: &ReduceScatterAlgo, p: usize, bytes: usize) -> Option<f64> {
        let name = reduce_scatter_name(algo);
        let op = Collective::ReduceScatter;
        measured_or_schedule(self, op, name, None, p, bytes, |cal| {
            let topo = topo_for(cal, p, 1)?;
            let case = DenseCase::new(op, name, bytes / 4);
            predict_dense(&case, &topo).ok().map(|p| p.time_s)
        })
    }
}

/// A line of the validation table: predicted against measured right after calibrating.
#[derive(Debug, Clone, PartialEq)]
pub struct Validation {
    /// `"allreduce"` or `"allgather"`.
    pub op: &'static str,
    /// Algorithm name.
    pub algo: Algorithm,
    /// Bytes (buffer for all-reduce, per rank for all-gather).
    pub bytes: usize,
    /// Predicted seconds (the calibration's prediction: the piecewise α-β fit, or the
    /// schedule on the calibrated links for an algorithm that was not swept).
    pub predicted_s: f64,
    /// Predicted seconds of the fitted line `α + β·bytes` alone.
    pub line_s: f64,
    /// Measured seconds (median of the repeats).
    pub measured_s: f64,
}

impl Validation {
    /// `|predicted − measured| / measured`.
    pub fn rel_error(&self) -> f64 {
        (self.predicted_s - self.measured_s).abs() / self.measured_s
    }
}

/// Measures every swept all-reduce and all-gather at each of `sizes` and pairs the time
/// with the calibration's prediction. Collective.
pub fn validate<C: Communicator + ?Sized>(
    comm: &C,
    cal: &Calibration,
    opts: &CalibrateOptions,
    sizes: &[usize],
) -> Result<Vec<Validation>> {
    let opts = &opts.for_comm(comm);
    let p = comm.size();
    let mut out = Vec::new();
    for &n in sizes {
        for algo in Swept::all(opts) {
            let measured_s = algo.time(comm, n, opts.reps)?;
            out.push(Validation {
                op: algo.op().name(),
                algo: algo.name(),
                bytes: n,
                predicted_s: algo.predict(cal, p, n).unwrap_or(f64::NAN),
                line_s: cal
                    .collective_fit(algo.op(), algo.name())
                    .map_or(f64::NAN, |c| c.fit.model.time(n)),
                measured_s,
            });
        }
    }
    Ok(out)
}

/// The planner's cost of one sparse step, predicted against measured: every rank runs one
/// exact top-k error-feedback step on its own gradient of `d` elements and the ranks
/// all-gather the selected values and indices (8 bytes per entry, ring), the step that
/// OMGS-SGD's merged groups make. The prediction is the calibrated top-k model plus the
/// all-gather fit for `8·k` bytes per rank, the two terms a calibrated planner adds
/// (`sparsify_s + comm_s`).
#[derive(Debug, Clone, PartialEq)]
pub struct CompositeValidation {
    /// Tensor size, elements.
    pub d: usize,
    /// Selected entries per rank.
    pub k: usize,
    /// Predicted top-k seconds.
    pub topk_s: f64,
    /// Predicted all-gather seconds.
    pub comm_s: f64,
    /// Measured seconds of the whole step (median of the repeats, slowest rank).
    pub measured_s: f64,
}

impl CompositeValidation {
    /// Predicted seconds of the whole step.
    pub fn predicted_s(&self) -> f64 {
        self.topk_s + self.comm_s
    }

    /// `|predicted − measured| / measured`.
    pub fn rel_error(&self) -> f64 {
        (self.predicted_s() - self.measured_s).abs() / self.measured_s
    }
}

/// Measures the sparse step of [`CompositeValidation`] at each of `sizes` (elements) at
/// `density`. Collective; needs an all-gather fit. The top-k fit lives on rank 0 only
/// (the local sweeps run there), so other ranks get a NaN top-k prediction.
pub fn validate_composite<C: Communicator + ?Sized>(
    comm: &C,
    cal: &Calibration,
    sizes: &[usize],
    density: f64,
    reps: usize,
) -> Result<Vec<CompositeValidation>> {
    let topk = cal.topk_model("exact");
    let ag = cal
        .collectives
        .iter()
        .find(|c| c.op == Collective::Allgather)
        .ok_or_else(|| {
            Error::InvalidArgument("the calibration has no all-gather fit to validate".into())
        })?;
    let algo = match ag.algo {
        Algorithm::RecursiveDoubling => AllgatherAlgo::RecursiveDoubling,
        Algorithm::Bruck => AllgatherAlgo::Bruck,
        _ => AllgatherAlgo::Ring,
    };
    let p = comm.size();
    let opts = DenseOptions::default().unchecked();
    let mut out = Vec::new();
    for &d in sizes {
        let k = ((d as f64 * density).round() as usize).clamp(1, d.max(1));
        let g = sweep_gradient(d, comm.rank() as u64 + 1);
        let mut ef = ErrorFeedback::new(d);
        // Cold, as the top-k fit it validates (see `topk_sweep`).
        let mut sel = sparsify::ExactTopK::new().with_warm_start(false);
        let mut mine = vec![0u8; 8 * k];
        let mut all = vec![0u8; 8 * k * p];
        let measured_s = time_op(comm, reps, || {
            let (sg, _) = ef.step(&mut sel, &g, k)?;
            for (j, (&i, &v)) in sg.indices().iter().zip(sg.values()).enumerate() {
                mine[8 * j..8 * j + 4].copy_from_slice(&i.to_le_bytes());
                mine[8 * j + 4..8 * j + 8].copy_from_slice(&v.to_le_bytes());
            }
            sel.recycle(sg);
            allgather(comm, &mine, &mut all, algo, &opts)
        })?;
        out.push(CompositeValidation {
            d,
            k,
            topk_s: topk.map_or(f64::NAN, |m| m.time(d)),
            comm_s: ag.time(8 * k),
            measured_s,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every round's order is a permutation, the same for the same round (so on every
    /// rank), and a case's predecessor changes between rounds.
    #[test]
    fn turn_order_is_a_fresh_permutation_per_round() {
        let n = 9;
        let rounds: Vec<Vec<usize>> = (0..20).map(|r| turn_order(n, r)).collect();
        for (r, order) in rounds.iter().enumerate() {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            assert_eq!(*order, turn_order(n, r));
        }
        let before = |order: &[usize], c: usize| {
            let at = order.iter().position(|&x| x == c).unwrap();
            (at > 0).then(|| order[at - 1])
        };
        let predecessors: std::collections::HashSet<_> =
            rounds.iter().map(|o| before(o, 4)).collect();
        assert!(predecessors.len() > 3, "{predecessors:?}");
        assert!(turn_order(0, 3).is_empty() && turn_order(1, 3) == vec![0]);
    }
    use crate::ThreadComm;

    /// A size off the trend of one algorithm is flagged (the P = 2 sweep's case: 8 MiB
    /// slower than 16 MiB), a clean sweep flags nothing.
    #[test]
    fn outlier_sizes_flag_the_size_off_the_trend() {
        let sizes: Vec<usize> = (10..=24).map(|e| 1usize << e).collect();
        let clean = |n: usize| vec![2e-6 + 1e-10 * n as f64; 5];
        let mut t: Vec<Vec<Vec<f64>>> = sizes.iter().map(|&n| vec![clean(n), clean(n)]).collect();
        assert_eq!(outlier_sizes(&sizes, &t, 2), vec![0]);
        let at = sizes.len() - 2;
        t[at][1] = vec![3.0 * t[at][1][0]; 5];
        let mask = outlier_sizes(&sizes, &t, 2);
        assert_ne!(mask[0] & 1 << at, 0, "{mask:?}");
        // Past 64 sizes, the second word: a sawtooth from size 56 on, which no six
        // segments follow.
        let many: Vec<usize> = (1..=70).map(|j| j << 14).collect();
        let mut t: Vec<Vec<Vec<f64>>> = many.iter().map(|&n| vec![clean(n)]).collect();
        assert_eq!(outlier_sizes(&many, &t, 1), vec![0, 0]);
        for j in (56..70).step_by(2) {
            t[j][0] = vec![3.0 * t[j][0][0]; 5];
        }
        let mask = outlier_sizes(&many, &t, 1);
        assert_ne!(mask[1], 0, "{mask:?}");
        assert_eq!(mask[1] >> 6, 0, "no bit past the 70 sizes: {mask:?}");
    }

    /// Every rank times again the sizes rank 0 flags, even a rank whose own timings are
    /// clean, and only those: the calls stay matched across ranks.
    #[test]
    fn retime_follows_rank_zero_on_every_rank() {
        let sizes: Vec<usize> = (10..=17).map(|e| 1usize << e).collect();
        let algos = [Swept::Allgather(AllgatherAlgo::Ring)];
        let counts = ThreadComm::run(3, |c| -> Result<(usize, Vec<usize>)> {
            let mut t: Vec<Vec<Vec<f64>>> = sizes
                .iter()
                .map(|&n| vec![vec![2e-6 + 1e-10 * n as f64; 3]])
                .collect();
            let at = sizes.len() - 2;
            if c.rank() == 0 {
                t[at][0] = vec![1.0; 3];
            }
            let retimed = retime_outliers(&c, &algos, &sizes, 3, &mut t)?;
            Ok((retimed, t.iter().map(|t| t[0].len()).collect()))
        })
        .unwrap();
        let at = sizes.len() - 2;
        for (retimed, lens) in &counts {
            assert!(*retimed >= 1, "{counts:?}");
            assert!(lens[at] > 3, "{counts:?}");
            let again: usize = lens.iter().filter(|&&l| l > 3).count();
            assert!(again <= *retimed, "{counts:?}");
            assert_eq!(lens, &counts[0].1, "every rank timed the same sizes");
        }
    }

    #[test]
    fn calibrate_small_sweep_on_threads() {
        let opts = CalibrateOptions {
            sizes: vec![1 << 10, 1 << 14, 1 << 18],
            reps: 3,
            topk_sizes: vec![1 << 10, 1 << 14],
            ..Default::default()
        };
        let swept = opts.allreduce.len() + opts.allgather.len() + opts.reduce_scatter.len();
        assert_eq!(
            swept,
            6 + 3 + 2,
            "every algorithm the chooser ranks is swept"
        );
        // A thread world is one machine: the shared-memory algorithms join the sweep.
        let swept = swept + 3;
        let cals = ThreadComm::run(3, |c| -> Result<Calibration> {
            assert!(c.shared_segment().is_some());
            let cal = calibrate(&c, &opts, &mut |_, _, _| {})?;
            let v = validate(&c, &cal, &opts, &[1 << 14])?;
            assert_eq!(v.len(), swept);
            let cv = validate_composite(&c, &cal, &[1 << 14], 0.01, 2)?;
            assert_eq!(cv.len(), 1);
            assert_eq!(cv[0].k, 164);
            assert!(cv[0].measured_s > 0.0 && cv[0].comm_s > 0.0);
            // The top-k fit lives on rank 0 only: elsewhere its prediction is NaN.
            if c.rank() == 0 {
                assert!(cv[0].predicted_s() > 0.0);
            } else {
                assert!(cv[0].topk_s.is_nan());
            }
            Ok(cal)
        })
        .unwrap();
        let cal = &cals[0];
        assert_eq!(cal.ranks, 3);
        assert_eq!(cal.collectives.len(), swept);
        assert!(cal.pingpong_piecewise.is_some());
        // Three sizes are too few to split: the piecewise fit is the line.
        for c in &cal.collectives {
            let pw = c.piecewise.as_ref().unwrap();
            assert_eq!(pw.model.segments.len(), 1);
            assert_eq!(pw.model.segments[0].model, c.fit.model);
        }
        assert_eq!(cal.topk.len(), 2);
        assert!(cal.topk_model("exact").is_some());
        assert!(cal.reduction_piecewise.is_some());
        let back = Calibration::from_json(&cal.to_json(), "mem").unwrap();
        assert_eq!(&back, cal);
        // The chooser accepts it and prices every algorithm.
        let a = crate::dense::choose_allreduce(3, 1 << 20, Some(cal as &dyn Predictor));
        assert!(AllreduceAlgo::all(3).contains(&a));
        // At the calibrated P only measured fits are ranked: the torus (not swept) and LP
        // with a block size other than the swept one are left out; at another P the
        // schedule on the calibrated links prices them.
        let torus = AllreduceAlgo::Torus2d { ranks_per_node: 1 };
        assert_eq!(cal.allreduce_s(&torus, 3, 1 << 20), None);
        let lp = |b| AllreduceAlgo::LinearPipeline { block_bytes: b };
        assert!(cal.allreduce_s(&lp(64 << 10), 3, 1 << 20).is_some());
        assert_eq!(cal.allreduce_s(&lp(16 << 10), 3, 1 << 20), None);
        assert!(cal.allreduce_s(&torus, 4, 1 << 20).is_some());
        for algo in ReduceScatterAlgo::ALL {
            assert!(cal.reduce_scatter_s(&algo, 3, 1 << 16).unwrap() > 0.0);
        }
        let rs = crate::dense::choose_reduce_scatter(3, 1 << 16, Some(cal as &dyn Predictor));
        assert!(ReduceScatterAlgo::ALL.contains(&rs));
    }

    #[test]
    fn pingpong_needs_two_ranks() {
        let r = ThreadComm::run(1, |c| pingpong(&c, &[8], 1));
        assert!(r.is_err());
    }

    #[test]
    fn topk_sweep_gives_one_list_per_selector_even_without_sizes() {
        let exact = || -> Box<dyn Selector> { Box::new(sparsify::ExactTopK::new()) };
        let ms = || -> Box<dyn Selector> { Box::new(sparsify::MsTopK::with_seed(1)) };
        let none = topk_sweep(&[&exact, &ms], &[], 0.01, 1).unwrap();
        assert_eq!(none, vec![Vec::<Sample>::new(); 2]);
        // An empty tensor (k clamps to 0) and a small one: every pair timed, in size order.
        let some = topk_sweep(&[&exact, &ms], &[0, 5000], 0.01, 1).unwrap();
        assert_eq!(some.len(), 2);
        for s in &some {
            assert_eq!(s.iter().map(|x| x.size).collect::<Vec<_>>(), [0.0, 5000.0]);
            assert!(s.iter().all(|x| x.time_s > 0.0 && x.time_s.is_finite()));
        }
    }
}
