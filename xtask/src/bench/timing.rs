//! Timing helpers: medians over repetitions, synchronised across ranks.

use std::time::Instant;

use collectives::Communicator;

use super::BoxErr;

/// Median over repetitions of the slowest rank's time of `f`: each repetition starts after
/// a barrier and the rank times are max-reduced, so every rank returns the same figure.
pub fn world_time(
    comm: &dyn Communicator,
    reps: usize,
    mut f: impl FnMut() -> Result<(), BoxErr>,
) -> Result<f64, BoxErr> {
    comm.barrier()?;
    f()?;
    let mut t = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        comm.barrier()?;
        let s = Instant::now();
        f()?;
        let mine = s.elapsed().as_secs_f64();
        t.push(max_over_ranks(comm, mine)?);
    }
    Ok(median(&mut t))
}

/// [`world_time`] of several cases at once, interleaved: every repetition runs each case
/// `calls` times back to back, in turn, so a change in the machine's load during the
/// measurement falls on all of them alike, and a call of a few µs is not timed alone
/// against the ranks' skew leaving the barrier (the OSU benchmarks' loop); the order of the
/// cases rotates from one repetition to the next. Returns each case's median seconds per
/// call, in the order given.
pub fn world_times_interleaved(
    comm: &dyn Communicator,
    reps: usize,
    calls: usize,
    cases: &mut [&mut (dyn FnMut() -> Result<(), BoxErr> + '_)],
) -> Result<Vec<f64>, BoxErr> {
    let calls = calls.max(1);
    for f in cases.iter_mut() {
        comm.barrier()?;
        f()?;
    }
    let n = cases.len();
    let mut t = vec![Vec::with_capacity(reps.max(1)); n];
    for rep in 0..reps.max(1) {
        // Each repetition starts at the next case, so no case always runs first (right
        // after the rank-time reduction) or right after the same neighbour.
        for c in (0..n).map(|i| (i + rep) % n) {
            comm.barrier()?;
            let s = Instant::now();
            for _ in 0..calls {
                cases[c]()?;
            }
            let mine = s.elapsed().as_secs_f64() / calls as f64;
            t[c].push(max_over_ranks(comm, mine)?);
        }
    }
    Ok(t.iter_mut().map(|t| median(t)).collect())
}

/// The largest `x` over all ranks (every rank gets it).
pub fn max_over_ranks(comm: &dyn Communicator, x: f64) -> Result<f64, BoxErr> {
    let all = collectives::dense::allgatherv(comm, &[x], collectives::dense::AllgatherAlgo::Bruck)?;
    Ok(all.data.iter().copied().fold(f64::MIN, f64::max))
}

fn median(t: &mut [f64]) -> f64 {
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}
