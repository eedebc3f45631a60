//! Picks an algorithm from (P, bytes). A simple rule for now; a [`Predictor`] (the cost
//! model, fitted to a machine) can rank the candidates by predicted time instead.

use crate::dense::{AllgatherAlgo, AllreduceAlgo, ReduceScatterAlgo};

/// Predicted time of a collective, from a calibrated cost model. Implemented outside this
/// crate (for example by a wrapper over `cost_model`); returning `None` for an algorithm
/// it cannot price leaves that algorithm out.
pub trait Predictor {
    /// Predicted seconds of an all-reduce of `bytes` on `p` ranks.
    fn allreduce_s(&self, algo: &AllreduceAlgo, p: usize, bytes: usize) -> Option<f64>;
    /// Predicted seconds of an all-gather where each rank contributes `bytes`.
    fn allgather_s(&self, algo: &AllgatherAlgo, p: usize, bytes: usize) -> Option<f64>;
    /// Predicted seconds of a reduce-scatter of a `bytes` buffer on `p` ranks.
    fn reduce_scatter_s(&self, algo: &ReduceScatterAlgo, p: usize, bytes: usize) -> Option<f64>;
}

/// Below this many bytes latency dominates (the rule of
/// `cost_model::plan::sparse::default_allreduce`).
const SMALL: usize = cost_model::plan::sparse::SMALL_ALLREDUCE_BYTES;

/// The all-reduce algorithm for `p` ranks and `bytes` bytes. With a predictor, the
/// candidate with the smallest predicted time (ties: the earlier candidate); without, or
/// when it prices none: recursive doubling for small messages, Rabenseifner for larger
/// ones on powers of two, ring otherwise.
pub fn choose_allreduce(
    p: usize,
    bytes: usize,
    calibration: Option<&dyn Predictor>,
) -> AllreduceAlgo {
    if let Some(a) = calibration
        .and_then(|pred| fastest(AllreduceAlgo::all(p), |a| pred.allreduce_s(a, p, bytes)))
    {
        return a;
    }
    match cost_model::plan::sparse::default_allreduce(p, bytes) {
        cost_model::Algorithm::Rabenseifner => AllreduceAlgo::Rabenseifner,
        cost_model::Algorithm::Ring => AllreduceAlgo::Ring,
        _ => AllreduceAlgo::RecursiveDoubling,
    }
}

/// The all-gather algorithm for `p` ranks each contributing `bytes`: by predictor as in
/// [`choose_allreduce`], else Bruck for small totals, recursive doubling for larger ones
/// on powers of two, ring otherwise.
pub fn choose_allgather(
    p: usize,
    bytes: usize,
    calibration: Option<&dyn Predictor>,
) -> AllgatherAlgo {
    if let Some(a) =
        calibration.and_then(|pred| fastest(AllgatherAlgo::ALL, |a| pred.allgather_s(a, p, bytes)))
    {
        return a;
    }
    let total = bytes.saturating_mul(p);
    if total < SMALL {
        AllgatherAlgo::Bruck
    } else if p.is_power_of_two() && total < (512 << 10) {
        AllgatherAlgo::RecursiveDoubling
    } else {
        AllgatherAlgo::Ring
    }
}

/// The reduce-scatter algorithm for `p` ranks and a `bytes` buffer: by predictor as in
/// [`choose_allreduce`], else recursive halving for small buffers on powers of two (log2 P
/// rounds), ring otherwise.
pub fn choose_reduce_scatter(
    p: usize,
    bytes: usize,
    calibration: Option<&dyn Predictor>,
) -> ReduceScatterAlgo {
    if let Some(a) = calibration.and_then(|pred| {
        fastest(ReduceScatterAlgo::ALL, |a| {
            pred.reduce_scatter_s(a, p, bytes)
        })
    }) {
        return a;
    }
    if p.is_power_of_two() && bytes < (512 << 10) {
        ReduceScatterAlgo::RecursiveHalving
    } else {
        ReduceScatterAlgo::Ring
    }
}

/// The candidate with the smallest finite predicted time (ties: the earlier one); `None`
/// when none is priced.
fn fastest<A>(
    candidates: impl IntoIterator<Item = A>,
    time: impl Fn(&A) -> Option<f64>,
) -> Option<A> {
    candidates
        .into_iter()
        .filter_map(|a| time(&a).filter(|t| t.is_finite()).map(|t| (a, t)))
        .fold(None::<(A, f64)>, |best, (a, t)| match best {
            Some((_, bt)) if bt <= t => best,
            _ => Some((a, t)),
        })
        .map(|(a, _)| a)
}
