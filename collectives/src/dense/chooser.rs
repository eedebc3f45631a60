//! Picks an algorithm from (P, bytes). A simple rule for now; a [`Predictor`] (the cost
//! model, fitted to a machine) can rank the candidates by predicted time instead.
//!
//! `choose_*` ranks our algorithms; `choose_*_for` takes the communicator and also ranks
//! the transport library's own collective (the `Library` algorithm) when the transport has
//! one, so that with a calibration that measured it the choice never falls behind the
//! library. A predictor prices `Library` only from a measurement: there is no schedule of
//! what the library does inside.

use crate::dense::{AllgatherAlgo, AllreduceAlgo, ReduceScatterAlgo};
use crate::Communicator;

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

/// [`choose_allreduce`] for `comm`'s size, with the transport library's all-reduce
/// ([`AllreduceAlgo::Library`]) among the candidates when `comm` has one and the predictor
/// prices it: ours is chosen only when predicted [`LIBRARY_MARGIN`] faster than the
/// library. Ours include [`AllreduceAlgo::SharedMemory`] when `comm` has a shared segment.
/// Without a predictor (or one that prices none of them) this is
/// [`AllreduceAlgo::SharedMemory`] where `comm` has a segment, else [`choose_allreduce`].
pub fn choose_allreduce_for<C: Communicator + ?Sized>(
    comm: &C,
    bytes: usize,
    calibration: Option<&dyn Predictor>,
) -> AllreduceAlgo {
    let p = comm.size();
    let (library, shared) = (AllreduceAlgo::Library, AllreduceAlgo::SharedMemory);
    choose_for(
        comm,
        AllreduceAlgo::all(p),
        [library, shared],
        calibration,
        |pred, a| pred.allreduce_s(a, p, bytes),
    )
    .unwrap_or_else(|| choose_allreduce(p, bytes, None))
}

/// [`choose_allgather`] for `comm`'s size, with [`AllgatherAlgo::Library`] and
/// [`AllgatherAlgo::SharedMemory`] among the candidates as in [`choose_allreduce_for`].
pub fn choose_allgather_for<C: Communicator + ?Sized>(
    comm: &C,
    bytes: usize,
    calibration: Option<&dyn Predictor>,
) -> AllgatherAlgo {
    let p = comm.size();
    let (library, shared) = (AllgatherAlgo::Library, AllgatherAlgo::SharedMemory);
    choose_for(
        comm,
        AllgatherAlgo::ALL,
        [library, shared],
        calibration,
        |pred, a| pred.allgather_s(a, p, bytes),
    )
    .unwrap_or_else(|| choose_allgather(p, bytes, None))
}

/// [`choose_reduce_scatter`] for `comm`'s size, with [`ReduceScatterAlgo::Library`] and
/// [`ReduceScatterAlgo::SharedMemory`] among the candidates as in [`choose_allreduce_for`].
pub fn choose_reduce_scatter_for<C: Communicator + ?Sized>(
    comm: &C,
    bytes: usize,
    calibration: Option<&dyn Predictor>,
) -> ReduceScatterAlgo {
    let p = comm.size();
    let (library, shared) = (ReduceScatterAlgo::Library, ReduceScatterAlgo::SharedMemory);
    choose_for(
        comm,
        ReduceScatterAlgo::ALL,
        [library, shared],
        calibration,
        |pred, a| pred.reduce_scatter_s(a, p, bytes),
    )
    .unwrap_or_else(|| choose_reduce_scatter(p, bytes, None))
}

/// The choice among `ours` (plus the shared-memory algorithm when `comm` has a segment)
/// and the library's algorithm (when `comm` has one), by the predictor's `time`. Without
/// a predictor, or one that prices none of them, the shared-memory algorithm where `comm`
/// has a segment: on one node it beat MPI's own call and every message-passing algorithm
/// here at most sizes from 4 KiB to 64 MiB at P = 2, 3 and 4, and lost only at some large
/// sizes in some runs (`docs/results/shared-memory-2core.md`), while the built-in rules
/// know only links.
/// `None` otherwise (the caller's built-in rule).
fn choose_for<C: Communicator + ?Sized, A: Copy>(
    comm: &C,
    ours: impl IntoIterator<Item = A>,
    [library, shared]: [A; 2],
    calibration: Option<&dyn Predictor>,
    time: impl Fn(&dyn Predictor, &A) -> Option<f64>,
) -> Option<A> {
    let library = comm.library().map(|_| library);
    let shared = comm.shared_segment().map(|_| shared);
    calibration
        .and_then(|pred| {
            ours_or_library(ours.into_iter().chain(shared), library, |a| time(pred, a))
        })
        .or(shared)
}

/// How much faster than the library one of our algorithms must be predicted before the
/// choice leaves the library: a calibration's medians scatter by a few per cent on a
/// shared machine, and within that scatter the library (the caller's baseline) is the
/// safer pick.
pub const LIBRARY_MARGIN: f64 = 0.05;

/// The fastest of `ours` by `time`, unless `library` is priced and that one is not
/// predicted [`LIBRARY_MARGIN`] faster than it; `None` when nothing is priced.
fn ours_or_library<A>(
    ours: impl IntoIterator<Item = A>,
    library: Option<A>,
    time: impl Fn(&A) -> Option<f64>,
) -> Option<A> {
    let priced = |a: &A| time(a).filter(|t| t.is_finite());
    let lib = library.and_then(|l| priced(&l).map(|t| (l, t)));
    let best = fastest(ours, priced).and_then(|a| priced(&a).map(|t| (a, t)));
    match (best, lib) {
        (Some((a, t)), Some((l, tl))) => Some(if t < tl * (1.0 - LIBRARY_MARGIN) {
            a
        } else {
            l
        }),
        (Some((a, _)), None) => Some(a),
        (None, Some((l, _))) => Some(l),
        (None, None) => None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::{allgather, allreduce, reduce_scatter, DenseOptions};
    use crate::{Error, ThreadComm};

    /// Prices every all-reduce at 10 µs except ring (`ring_s`) and the library (`lib_s`).
    struct Fixed {
        ring_s: f64,
        lib_s: Option<f64>,
    }

    impl Predictor for Fixed {
        fn allreduce_s(&self, a: &AllreduceAlgo, _: usize, _: usize) -> Option<f64> {
            match a {
                AllreduceAlgo::Ring => Some(self.ring_s),
                AllreduceAlgo::Library => self.lib_s,
                _ => Some(10e-6),
            }
        }
        fn allgather_s(&self, a: &AllgatherAlgo, _: usize, _: usize) -> Option<f64> {
            self.allreduce_s(
                &match a {
                    AllgatherAlgo::Ring => AllreduceAlgo::Ring,
                    AllgatherAlgo::Library => AllreduceAlgo::Library,
                    _ => AllreduceAlgo::Binomial,
                },
                0,
                0,
            )
        }
        fn reduce_scatter_s(&self, a: &ReduceScatterAlgo, _: usize, _: usize) -> Option<f64> {
            self.allreduce_s(
                &match a {
                    ReduceScatterAlgo::Ring => AllreduceAlgo::Ring,
                    ReduceScatterAlgo::Library => AllreduceAlgo::Library,
                    _ => AllreduceAlgo::Binomial,
                },
                0,
                0,
            )
        }
    }

    #[test]
    fn ours_must_beat_the_library_by_the_margin() {
        let pick = |ring_s: f64, lib_s: Option<f64>| {
            let f = Fixed { ring_s, lib_s };
            let all = (
                AllreduceAlgo::all(4),
                AllgatherAlgo::ALL,
                ReduceScatterAlgo::ALL,
            );
            let lib = |t: Option<f64>| t.map(|_| ());
            (
                ours_or_library(all.0, lib(lib_s).map(|_| AllreduceAlgo::Library), |a| {
                    f.allreduce_s(a, 4, 1)
                }),
                ours_or_library(all.1, lib(lib_s).map(|_| AllgatherAlgo::Library), |a| {
                    f.allgather_s(a, 4, 1)
                }),
                ours_or_library(all.2, lib(lib_s).map(|_| ReduceScatterAlgo::Library), |a| {
                    f.reduce_scatter_s(a, 4, 1)
                }),
            )
        };
        let ours = (
            Some(AllreduceAlgo::Ring),
            Some(AllgatherAlgo::Ring),
            Some(ReduceScatterAlgo::Ring),
        );
        let library = (
            Some(AllreduceAlgo::Library),
            Some(AllgatherAlgo::Library),
            Some(ReduceScatterAlgo::Library),
        );
        // Ring 10 % faster than the library: ours.
        assert_eq!(pick(0.9e-6, Some(1e-6)), ours);
        // Ring 2 % faster, inside the margin: the library.
        assert_eq!(pick(0.98e-6, Some(1e-6)), library);
        // The library slower than all of ours, or not priced: ours.
        assert_eq!(pick(0.9e-6, Some(20e-6)), ours);
        assert_eq!(pick(0.9e-6, None), ours);
        // Only the library priced.
        let only = ours_or_library([AllreduceAlgo::Ring], Some(AllreduceAlgo::Library), |a| {
            (*a == AllreduceAlgo::Library).then_some(1.0)
        });
        assert_eq!(only, Some(AllreduceAlgo::Library));
    }

    /// Without a calibration a one-node communicator gets the shared-memory algorithm, and
    /// one without a segment the built-in rule.
    #[test]
    fn without_a_calibration_one_node_gets_shared_memory() {
        use crate::comm::thread::ThreadConfig;
        let pick = |config: ThreadConfig| {
            ThreadComm::run_with(4, config, |comm| -> crate::Result<_> {
                Ok((
                    choose_allreduce_for(&comm, 1 << 20, None),
                    choose_allgather_for(&comm, 1 << 20, None),
                    choose_reduce_scatter_for(&comm, 1 << 20, None),
                ))
            })
            .unwrap()
        };
        for chosen in pick(ThreadConfig::default()) {
            assert_eq!(
                chosen,
                (
                    AllreduceAlgo::SharedMemory,
                    AllgatherAlgo::SharedMemory,
                    ReduceScatterAlgo::SharedMemory
                )
            );
        }
        for chosen in pick(ThreadConfig::default().with_ranks_per_node(2)) {
            assert_eq!(
                chosen,
                (
                    choose_allreduce(4, 1 << 20, None),
                    choose_allgather(4, 1 << 20, None),
                    choose_reduce_scatter(4, 1 << 20, None)
                )
            );
            assert_ne!(chosen.0, AllreduceAlgo::SharedMemory);
        }
    }

    #[test]
    fn threads_never_get_the_library_and_refuse_it_on_every_rank() {
        let f = Fixed {
            ring_s: 1.0,
            lib_s: Some(1e-9),
        };
        let out = ThreadComm::run(3, |comm| -> crate::Result<_> {
            let chosen = (
                choose_allreduce_for(&comm, 1 << 10, Some(&f)),
                choose_allgather_for(&comm, 1 << 10, Some(&f)),
                choose_reduce_scatter_for(&comm, 1 << 10, Some(&f)),
            );
            let opts = DenseOptions::default();
            let mut buf = vec![1.0f32; 6];
            let ar = allreduce(&comm, &mut buf, AllreduceAlgo::Library, &opts);
            let mut all = vec![0.0f32; 6];
            let ag = allgather(&comm, &buf[..2], &mut all, AllgatherAlgo::Library, &opts);
            let rs = reduce_scatter(&comm, &mut buf, ReduceScatterAlgo::Library, &opts);
            Ok((chosen, [ar.err(), ag.err(), rs.map(|_| ()).err()]))
        })
        .unwrap();
        for (chosen, errors) in out {
            assert_ne!(chosen.0, AllreduceAlgo::Library);
            assert_ne!(chosen.1, AllgatherAlgo::Library);
            assert_ne!(chosen.2, ReduceScatterAlgo::Library);
            for e in errors {
                assert!(
                    matches!(&e, Some(Error::InvalidArgument(m)) if m.contains("thread has none")),
                    "{e:?}"
                );
            }
        }
    }
}
