//! Timing helpers: medians over repetitions, synchronised across ranks.

use std::time::Instant;

use collectives::Communicator;
use cost_model::median;

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
    Ok(median(&t))
}

/// [`world_time`] of several cases at once, interleaved: every repetition runs each case
/// `calls` times back to back, in turn, so a change in the machine's load during the
/// measurement falls on all of them alike, and a call of a few µs is not timed alone
/// against the ranks' skew leaving the barrier (the OSU benchmarks' loop), in a fresh order
/// every repetition ([`collectives::calibrate::turn_order`]). Each timing follows one untimed call of
/// its case, so its buffers are as warm as in a loop of calls of one case (OSU's and
/// nccl-tests' loops, and `calibrate`'s sweep, whose fits rank the algorithms of the
/// automatic choice): without it, a multi-MiB case ran after the other cases had pushed its
/// buffers out of the cache, and algorithms that reuse a buffer lost more than others, so
/// the bench and the calibration ranked them differently. Returns each case's seconds per call in
/// every repetition (`[case][repetition]`, the cases in the order given), so that two cases
/// can be compared repetition by repetition ([`paired_ratio`]) as well as by [`median`].
pub fn world_rounds_interleaved(
    comm: &dyn Communicator,
    reps: usize,
    calls: usize,
    cases: &mut [&mut (dyn FnMut() -> Result<(), BoxErr> + '_)],
) -> Result<Vec<Vec<f64>>, BoxErr> {
    let calls = calls.max(1);
    let n = cases.len();
    let mut t = vec![Vec::with_capacity(reps.max(1)); n];
    for rep in 0..reps.max(1) {
        for c in collectives::calibrate::turn_order(n, rep) {
            comm.barrier()?;
            cases[c]()?;
            comm.barrier()?;
            let s = Instant::now();
            for _ in 0..calls {
                cases[c]()?;
            }
            let mine = s.elapsed().as_secs_f64() / calls as f64;
            t[c].push(max_over_ranks(comm, mine)?);
        }
    }
    Ok(t)
}

/// The largest `x` over all ranks (every rank gets it).
pub fn max_over_ranks(comm: &dyn Communicator, x: f64) -> Result<f64, BoxErr> {
    let all = collectives::dense::allgatherv(comm, &[x], collectives::dense::AllgatherAlgo::Bruck)?;
    Ok(all.data.iter().copied().fold(f64::MIN, f64::max))
}

/// `a / b` compared repetition by repetition: the median of `a[i] / b[i]` over the
/// repetitions both have. Two cases timed in the same rounds share each round's load, so
/// this ratio is steadier than the ratio of their medians when the load moves between
/// rounds (an oversubscribed machine).
pub fn paired_ratio(a: &[f64], b: &[f64]) -> f64 {
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    median(&r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_ratio_follows_the_rounds() {
        // `a` takes twice `b` in four rounds of five, but the load moved between rounds,
        // so the ratio of the medians says the opposite.
        let b = [0.1, 0.1, 0.4, 0.4, 0.4];
        let a = [0.2, 0.2, 0.2, 0.8, 0.8];
        assert!((paired_ratio(&a, &b) - 2.0).abs() < 1e-12);
        assert!((median(&a) / median(&b) - 0.5).abs() < 1e-12);
        assert_eq!(paired_ratio(&[], &[]), 0.0);
    }
}
