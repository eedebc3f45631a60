//! # sparsify
//!
//! Top-k gradient sparsification for data-parallel training: selectors that pick the `k`
//! entries of largest magnitude (exact; MSTopK, MSTopK/HiTopKComm (Shi et al., MLSys 2021) §3.1,
//! Algorithm 1; DGC sampling; hard threshold; the scaled threshold of ExDyna (Yoon & Oh,
//! CCGrid 2024) §IV-C/D; Gaussian-k), fused with
//! error feedback (residual memory) so the hot path makes one pass over memory, and
//! [`SparseGrad`], the coordinate-form sparse gradient every sparse collective exchanges.
//! The cost of top-k selection is what OMGS-SGD (Shi et al., INFOCOM 2020) §II-E models.
//!
//! ```
//! use sparsify::SparseGrad;
//! let g = SparseGrad::<f32>::from_dense(&[0.0, 3.0, 0.0, -1.0]).unwrap();
//! assert_eq!(g.indices(), &[1, 3]);
//! let wire = g.encode();
//! assert_eq!(SparseGrad::<f32>::decode(&wire).unwrap(), g);
//! ```
#![deny(missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
pub mod exact;
pub mod feedback;
mod grouped;
mod kernel;
pub mod kind;
pub mod mstopk;
mod order;
pub mod selector;
mod spare;
pub mod sparse;
mod split;
pub mod threshold;
mod value;
mod warm;

pub use error::{Error, Result};
pub use exact::ExactTopK;
pub use feedback::{accumulate, ErrorFeedback};
pub use kernel::{emit_form, set_emit_form, EmitForm};
pub use kind::SelectorKind;
pub use mstopk::MsTopK;
pub use selector::{SelectInfo, Selection, Selector};
pub use sparse::SparseGrad;
pub use threshold::{DgcSampling, ExDyna, GaussianK, HardThreshold};
pub use value::Value;

/// Inputs of at least this many elements are split over the pool's threads by the CPU
/// selectors and [`accumulate`]; shorter ones run on the calling thread alone.
pub const PARALLEL_MIN_LEN: usize = kernel::PAR_MIN;

/// Threads the CPU selectors split a large pass over: those of the current rayon pool
/// (the global one unless the caller installed another).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// Builds the global rayon pool with the calling thread as one of its `threads` (the
/// number of cores when `None`), so that the selectors' parallel passes start on the caller
/// at once and the other workers steal from it.
///
/// Called from a thread outside the pool, each parallel pass is injected into the pool and
/// the caller sleeps until the workers woken for it finish. After a serial phase the
/// workers are asleep, and on this project's 2-core VM 58–60 of 100 such passes ran on one
/// worker alone, at about twice the time; from a thread that joined, none did (the
/// `pool_wakeup` example measures both; running the work inside `ThreadPool::install`
/// does the same for one closure).
///
/// Work that other threads hand to the pool then runs on the other workers only, as the
/// joined thread takes jobs only while it is inside a rayon call itself. So join only
/// where this thread does the parallel work: with two ranks as threads of one process
/// on two cores, each handing its model and selections to the pool, a training step took
/// 238–253 ms instead of 147–154 ms. `xtask` joins only in MPI ranks.
///
/// Call it once, before any parallel work, from the thread that runs the training loop;
/// it fails if the global pool already exists.
pub fn join_global_pool(threads: Option<usize>) -> Result<()> {
    let mut builder = rayon::ThreadPoolBuilder::new().use_current_thread();
    if let Some(n) = threads {
        if n == 0 {
            return Err(Error::InvalidArgument("a pool of 0 threads".into()));
        }
        builder = builder.num_threads(n);
    }
    builder
        .build_global()
        .map_err(|e| Error::InvalidArgument(format!("the global rayon pool: {e}")))
}

/// The checks of a fused selection: residual and gradient of the same length, within the
/// `u32` index range.
pub(crate) fn check_fused(residual: &[f32], grad: &[f32]) -> Result<()> {
    check_same_len(residual.len(), grad.len())?;
    exact::check_dense_len(residual.len())
}

/// Checks that a residual and a gradient have the same length.
pub(crate) fn check_same_len(residual: usize, grad: usize) -> Result<()> {
    if residual == grad {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            what: "residual",
            got: residual,
            expected: grad,
        })
    }
}

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::tests::{gen_vec, vec_strategy};
    use proptest::prelude::*;
    use rand::SeedableRng;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Every selector, plain and fused: valid SparseGrad, values taken from the
        /// accumulated vector, exact count where promised, mass conserved exactly.
        #[test]
        fn every_selector_is_valid_and_conserves_mass(
            (g, k) in vec_strategy(), seed in any::<u64>()
        ) {
            let r0 = gen_vec(seed, g.len(), 3);
            let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
            for kind in SelectorKind::ALL {
                let name = kind.name();
                let mut sel = kind.build(seed);
                let (sg, info) = sel.select(&acc, k).unwrap();
                sparse::validate_indices(sg.indices(), acc.len()).unwrap();
                prop_assert_eq!(sg.len(), acc.len());
                prop_assert_eq!(info.selected, sg.nnz());
                for (&i, &v) in sg.indices().iter().zip(sg.values()) {
                    prop_assert_eq!(v.to_bits(), acc[i as usize].to_bits());
                }
                if sel.exact_count() {
                    prop_assert_eq!(sg.nnz(), k.min(acc.len()));
                }
                let mut fresh = kind.build(seed);
                let mut ef = ErrorFeedback::from_residual(r0.clone());
                let (fs, _) = ef.step(fresh.as_mut(), &g, k).unwrap();
                prop_assert_eq!(&fs, &sg, "{} fused differs from plain", name);
                let mut back = ef.residual().to_vec();
                fs.scatter_add_into(&mut back).unwrap();
                for (a, b) in back.iter().zip(&acc) {
                    prop_assert_eq!(a.to_bits(), b.to_bits());
                }
            }
        }
    }

    /// Runs `f` on a rayon pool of `threads` threads.
    fn on_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(f)
    }

    /// One fused step and one read-only selection of every selector on a pool of
    /// `threads`: (name, indices, value bits, residual bits after the step).
    type Run = Vec<(&'static str, Vec<u32>, Vec<u32>, Vec<u32>)>;
    fn run_all(threads: usize, r0: &[f32], g: &[f32], k: usize, seed: u64) -> Run {
        on_pool(threads, || {
            if threads > 1 {
                assert!(kernel::pieces(g.len()) > 1, "parallel path not taken");
            } else {
                assert_eq!(kernel::pieces(g.len()), 1);
            }
            let mut out = Vec::new();
            for kind in SelectorKind::ALL {
                let name = kind.name();
                let mut ef = ErrorFeedback::from_residual(r0.to_vec());
                let mut sel = kind.build(seed);
                let (sg, _) = ef.step(sel.as_mut(), g, k).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                out.push((
                    name,
                    sg.indices().to_vec(),
                    bits(sg.values()),
                    bits(ef.residual()),
                ));
                let (sg, _) = kind.build(seed).select(g, k).unwrap();
                out.push((name, sg.indices().to_vec(), bits(sg.values()), vec![]));
            }
            out
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]

        /// The parallel passes (several pieces on a 4-thread pool) give bit for bit the
        /// serial result (a 1-thread pool): indices, values and the residual, for every
        /// selector, plain and fused, on inputs long enough to be split.
        #[test]
        fn parallel_equals_serial(
            seed in any::<u64>(),
            len in kernel::PAR_MIN..5 * kernel::PAR_MIN,
            kind in 0u8..4,
            density in prop_oneof![Just(0.0001), Just(0.001), Just(0.01), Just(0.2)],
        ) {
            let g = gen_vec(seed, len, kind);
            let r0 = gen_vec(seed ^ 0x5eed, len, 0);
            let k = ((len as f64 * density) as usize).max(1);
            let serial = run_all(1, &r0, &g, k, seed);
            let parallel = run_all(4, &r0, &g, k, seed);
            // Not vacuous: the exact-count selectors picked k entries in every run.
            for run in serial.iter().filter(|s| matches!(s.0, "exact" | "mstopk")) {
                prop_assert_eq!(run.1.len(), k, "{}", run.0);
            }
            prop_assert_eq!(serial, parallel);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]

        /// The fused steps split over a pool (per-piece candidate lists, the selection
        /// made per piece) equal the references on the accumulated vector: the sort for
        /// exact top-k, the literal Algorithm 1 for MSTopK; and the selected values plus
        /// the new residual give back the accumulated vector bit for bit.
        #[test]
        fn parallel_fused_matches_the_references(
            seed in any::<u64>(),
            len in kernel::PAR_MIN..4 * kernel::PAR_MIN,
            kind in 0u8..4,
            density in prop_oneof![Just(0.001), Just(0.01), Just(0.2)],
        ) {
            let g = gen_vec(seed, len, kind);
            let r0 = gen_vec(seed ^ 0xacc, len, 0);
            let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
            let k = ((len as f64 * density) as usize).max(1);
            let (ex, ms, res) = on_pool(4, || {
                assert!(kernel::pieces(len) > 1, "parallel path not taken");
                let mut ef = ErrorFeedback::from_residual(r0.clone());
                let (ex, _) = ef.step(&mut ExactTopK::new(), &g, k).unwrap();
                let mut ef2 = ErrorFeedback::from_residual(r0.clone());
                let (ms, _) = ef2.step(&mut MsTopK::with_seed(seed), &g, k).unwrap();
                (ex, ms, [ef.into_residual(), ef2.into_residual()])
            });
            prop_assert_eq!(ex.nnz(), k);
            prop_assert_eq!(ex.indices(), &exact::reference_topk(&acc, k)[..]);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let want = mstopk::reference_mstopk(&acc, k, mstopk::DEFAULT_ROUNDS, &mut rng);
            prop_assert_eq!(ms.nnz(), k);
            prop_assert_eq!(ms.indices(), &want[..]);
            for (sg, r) in [(&ex, &res[0]), (&ms, &res[1])] {
                let mut back = r.clone();
                sg.scatter_add_into(&mut back).unwrap();
                for (a, b) in back.iter().zip(&acc) {
                    prop_assert_eq!(a.to_bits(), b.to_bits());
                }
            }
        }
    }

    /// Large `k` on a pool takes the per-piece selection (histogram, boundary bucket,
    /// per-piece writes and restores): exact and MSTopK still equal their references,
    /// ties included (kind 1), and conserve the accumulated vector bit for bit.
    #[test]
    fn split_selection_matches_the_references() {
        let d = 3 * kernel::PAR_MIN + 4_099;
        for kind in 0..4u8 {
            let g = gen_vec(60 + u64::from(kind), d, kind);
            let r0 = gen_vec(61, d, 0);
            let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
            for k in [split::PAR_CAND, d / 5] {
                let (ex, ms, res) = on_pool(4, || {
                    assert!(
                        kernel::pieces(d) > 1 && k >= split::ZERO_K,
                        "zeroing split path"
                    );
                    let mut e1 = ErrorFeedback::from_residual(r0.clone());
                    let (ex, _) = e1.step(&mut ExactTopK::new(), &g, k).unwrap();
                    let mut e2 = ErrorFeedback::from_residual(r0.clone());
                    let (ms, _) = e2.step(&mut MsTopK::with_seed(9), &g, k).unwrap();
                    (ex, ms, [e1.into_residual(), e2.into_residual()])
                });
                assert_eq!(
                    ex.indices(),
                    &exact::reference_topk(&acc, k)[..],
                    "{kind} {k}"
                );
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
                let want = mstopk::reference_mstopk(&acc, k, mstopk::DEFAULT_ROUNDS, &mut rng);
                assert_eq!(ms.indices(), &want[..], "{kind} {k}");
                for (sg, r) in [(&ex, &res[0]), (&ms, &res[1])] {
                    let mut back = r.clone();
                    sg.scatter_add_into(&mut back).unwrap();
                    assert!(back
                        .iter()
                        .zip(&acc)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
            }
        }
    }

    #[test]
    fn parallel_exact_matches_the_sort_reference() {
        let d = 3 * kernel::PAR_MIN + 123;
        for kind in 0..4 {
            let g = gen_vec(40 + u64::from(kind), d, kind);
            for k in [1, 97, d / 1000, d / 100, d / 3] {
                let (sg, _) = on_pool(4, || ExactTopK::new().select(&g, k).unwrap());
                assert_eq!(
                    sg.indices(),
                    &exact::reference_topk(&g, k)[..],
                    "{kind} {k}"
                );
            }
        }
    }

    /// MSTopK split over a pool selects as the literal Algorithm 1, read-only and fused,
    /// with the pieces' candidates joined (`k` = d / 1000, d / 100) and kept per piece
    /// with a histogram each (d / 30, a zeroing pass); the fused step's residual plus the
    /// selection is the input.
    #[test]
    fn parallel_mstopk_matches_algorithm_1() {
        let d = 3 * kernel::PAR_MIN + 123;
        for kind in 0..2 {
            let g = gen_vec(50 + u64::from(kind), d, kind);
            for k in [d / 1000, d / 100, d / 30] {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
                let want = mstopk::reference_mstopk(&g, k, 30, &mut rng);
                let (read, fused, residual) = on_pool(4, || {
                    assert!(kernel::pieces(d) > 1, "parallel path not taken");
                    let (read, _) = MsTopK::with_seed(7).select(&g, k).unwrap();
                    let mut ef = ErrorFeedback::new(d);
                    let (fused, _) = ef.step(&mut MsTopK::with_seed(7), &g, k).unwrap();
                    (read, fused, ef.residual().to_vec())
                });
                assert_eq!(read.indices(), &want[..], "{kind} {k}");
                assert_eq!(fused, read, "{kind} {k}");
                let mut back = residual;
                fused.scatter_add_into(&mut back).unwrap();
                assert_eq!(back, g, "{kind} {k}");
            }
        }
    }

    #[test]
    fn parallel_reports_the_first_non_finite() {
        let d = 4 * kernel::PAR_MIN;
        let mut x = gen_vec(9, d, 0);
        x[3 * kernel::PAR_MIN + 5] = f32::INFINITY;
        let first = 2 * kernel::PAR_MIN + 7;
        x[first] = f32::NAN;
        on_pool(4, || {
            for kind in SelectorKind::ALL {
                let name = kind.name();
                let mut sel = kind.build(1);
                let e = sel.select(&x, d / 100);
                assert!(
                    matches!(e, Err(Error::NonFinite { index, .. }) if index == first),
                    "{name}"
                );
                let mut ef = ErrorFeedback::new(d);
                let e = ef.step(sel.as_mut(), &x, d / 100);
                assert!(
                    matches!(e, Err(Error::NonFinite { index, .. }) if index == first),
                    "{name}"
                );
            }
        });
    }

    /// A fused step that meets a non-finite value leaves the accumulated vector in the
    /// residual, every entry (the zeroing passes put their candidates back), serial and
    /// split over a pool.
    #[test]
    fn non_finite_leaves_the_accumulated_residual() {
        for (threads, d) in [(1, 20_000), (4, 4 * kernel::PAR_MIN)] {
            let r0 = gen_vec(21, d, 0);
            let mut g = gen_vec(22, d, 0);
            g[d - 3] = f32::NAN;
            let acc: Vec<u32> = r0.iter().zip(&g).map(|(a, b)| (a + b).to_bits()).collect();
            on_pool(threads, || {
                for kind in SelectorKind::ALL {
                    for k in [0, d / 1000, d / 100, d] {
                        let mut ef = ErrorFeedback::from_residual(r0.clone());
                        let mut sel = kind.build(3);
                        let e = ef.step(sel.as_mut(), &g, k);
                        assert!(matches!(e, Err(Error::NonFinite { .. })), "{kind} {k}");
                        let got: Vec<u32> = ef.residual().iter().map(|v| v.to_bits()).collect();
                        assert!(got == acc, "{kind} k {k} threads {threads}");
                    }
                }
            });
        }
    }

    #[test]
    fn every_selector_handles_bad_input() {
        for kind in SelectorKind::ALL {
            let name = kind.name();
            let mut sel = kind.build(1);
            assert_eq!(sel.select(&[], 4).unwrap().0.nnz(), 0, "{name}");
            assert_eq!(sel.select(&[1.0, -2.0], 0).unwrap().0.nnz(), 0, "{name}");
            let mut x = gen_vec(3, 5_000, 0);
            x[4_321] = f32::NAN;
            assert!(
                matches!(
                    sel.select(&x, 50),
                    Err(Error::NonFinite { index: 4_321, .. })
                ),
                "{name}"
            );
            let mut ef = ErrorFeedback::new(5_000);
            let mut sel = kind.build(1);
            assert!(
                matches!(
                    ef.step(sel.as_mut(), &x, 50),
                    Err(Error::NonFinite { index: 4_321, .. })
                ),
                "{name}"
            );
            assert!(matches!(
                ef.step(sel.as_mut(), &x[..10], 5),
                Err(Error::LengthMismatch { .. })
            ));
        }
    }

    /// Handing results back with [`Selector::recycle`] changes nothing but where the next
    /// result is written: every selector, serial and split over a pool, over a run of
    /// steps whose `k` shrinks and grows (so recycled buffers both fit and do not), gives
    /// the same results and residuals bit for bit as one that drops its results. Not
    /// vacuous: every selector wrote a later result into a recycled buffer.
    #[test]
    fn recycled_results_change_nothing_and_are_reused() {
        for (threads, d) in [(1, 20_000), (4, 3 * kernel::PAR_MIN + 123)] {
            on_pool(threads, || {
                let base = (d / 100).max(1);
                let ks = [base, base / 2, 3 * base, base, base];
                for kind in SelectorKind::ALL {
                    let (mut a, mut b) = (kind.build(9), kind.build(9));
                    let (mut fa, mut fb) = (ErrorFeedback::new(d), ErrorFeedback::new(d));
                    let mut recycled = Vec::new();
                    let mut reused = false;
                    for (step, &k) in ks.iter().enumerate() {
                        let g = exact::tests::gen_vec(step as u64, d, 0);
                        let (ra, _) = fa.step(a.as_mut(), &g, k).unwrap();
                        let (rb, _) = fb.step(b.as_mut(), &g, k).unwrap();
                        assert_eq!(ra, rb, "{kind} step {step}");
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(fa.residual()), bits(fb.residual()), "{kind}");
                        reused |= recycled.contains(&ra.indices().as_ptr());
                        recycled.push(ra.indices().as_ptr());
                        a.recycle(ra);
                    }
                    assert!(reused, "{kind} on {threads} threads never reused a buffer");
                }
            });
        }
    }
}
