//! [`ExactTopK`]: exactly `min(k, d)` entries of largest magnitude, ties broken by the
//! lower index, in one fused pass over memory in the common case.
//!
//! Algorithm: estimate a threshold from a strided sample (computed on the fly from
//! `residual + grad` when fused), make one pass that accumulates, compares and emits the
//! few candidates above it (zeroing them in the residual while they are in cache),
//! then select exactly among the candidates and put back the few not selected; on a pool,
//! the candidates stay per piece and the selection runs per piece too (see the `split`
//! module). When the sample misjudged (fewer than `k` candidates, or far too many), fall back to a read-only pass
//! over the accumulated vector with a safer threshold. Called again on a tensor of the same
//! shape, the fused step starts warm: from just below the previous call's k-th magnitude,
//! with no sample (see the `warm` module). The cost model of top-k selection
//! this speeds up is OMGS-SGD's (Shi et al., INFOCOM 2020) §II-E, Eq. 10.

use crate::kernel::{self, abs_bits, Cand, INF_BITS};
use crate::warm::WarmStart;
use crate::{grouped, split, Result, SelectInfo, Selection, Selector, SparseGrad};

/// Margin of the sampled threshold, in standard deviations of the sample's hit count:
/// the pass misses the k-th magnitude (and falls back to a second pass) about once in a
/// few hundred calls.
pub(crate) const SAMPLE_Z: f64 = 3.0;

/// Exact top-k by magnitude (ties: lower index first).
#[derive(Debug, Default, Clone)]
pub struct ExactTopK {
    cand: Cand,
    sample: Vec<i32>,
    /// The second half of a sample gathered in parallel.
    sample2: Vec<i32>,
    scratch: Vec<i32>,
    /// Group maxima of the small-tensor path ([`grouped`]).
    maxes: Vec<i32>,
    work: split::Work,
    warm: WarmStart,
}

impl ExactTopK {
    /// A new selector (it keeps scratch buffers and the last k-th magnitude between calls).
    pub fn new() -> Self {
        Self::default()
    }

    /// Turns the warm start of the fused step on (the default) or off. Off, every call
    /// estimates its threshold from a sample (or, on small tensors, from group maxima);
    /// the selection is the same either way.
    pub fn set_warm_start(&mut self, on: bool) {
        self.warm.set_enabled(on);
    }

    /// [`Self::set_warm_start`] as a builder: `ExactTopK::new().with_warm_start(false)`.
    pub fn with_warm_start(mut self, on: bool) -> Self {
        self.set_warm_start(on);
        self
    }
}

/// Builds the result and its info from selected (index, value) lists.
pub(crate) fn finish(idx: Vec<u32>, val: Vec<f32>, d: usize) -> (SparseGrad<f32>, SelectInfo) {
    let min = val.iter().map(|v| abs_bits(*v)).min().unwrap_or(0);
    finish_bits(idx, val, d, min)
}

/// [`finish`] when the smallest selected magnitude (`min_bits`, as bits) is already known.
pub(crate) fn finish_bits(
    idx: Vec<u32>,
    val: Vec<f32>,
    d: usize,
    min_bits: i32,
) -> (SparseGrad<f32>, SelectInfo) {
    let selected = idx.len();
    let info = SelectInfo {
        threshold: if selected == 0 {
            0.0
        } else {
            f32::from_bits(min_bits as u32)
        },
        selected,
    };
    (SparseGrad::from_parts_unchecked(idx, val, d), info)
}

/// Checks that `d` is addressable with `u32` indices.
pub(crate) fn check_dense_len(d: usize) -> Result<()> {
    if d as u64 > u64::from(u32::MAX) + 1 {
        Err(crate::Error::TooLong(d))
    } else {
        Ok(())
    }
}

/// Zeroes the selected entries (an increasing index list) of the residual.
pub(crate) fn zero_selected(residual: &mut [f32], idx: &[u32]) {
    kernel::zero_at(residual, idx);
}

impl ExactTopK {
    /// The fused error-feedback selection (see the module docs); `residual` ends up holding
    /// `residual + grad` with the selected entries zeroed.
    fn fused(&mut self, residual: &mut [f32], grad: &[f32], k: usize) -> Selection {
        let d = residual.len();
        let k = k.min(d);
        let warm = if 0 < k && k < d {
            self.warm.threshold(d, k)
        } else {
            None
        };
        if warm.is_none() && grouped::applies(d, k) {
            let (_, out) =
                grouped::fused::<false>(residual, grad, k, &mut self.maxes, &mut self.cand);
            out.check()?;
            let (idx, val, min) = kernel::select_k_of(&mut self.cand, k, &mut self.scratch);
            zero_selected(residual, &idx);
            return Ok(finish_bits(idx, val, d, min));
        }
        if warm.is_none() && 0 < k && k < d && kernel::sample_size(d, k).is_none() {
            let (idx, val, min) =
                kernel::exact_small(residual, grad, k, &mut self.cand, &mut self.scratch)?;
            zero_selected(residual, &idx);
            return Ok(finish_bits(idx, val, d, min));
        }
        let (t, cap) = if let Some(t) = warm {
            (t, WarmStart::cap(d, k))
        } else if k == 0 {
            (INF_BITS, usize::MAX)
        } else if k == d {
            (0, usize::MAX)
        } else if let Some(n) = kernel::sample_size(d, k) {
            let bufs = (&mut self.sample, &mut self.sample2);
            let (t, len) = kernel::sampled_threshold(residual, grad, n, k, SAMPLE_Z, bufs);
            (t, kernel::candidate_cap(d, k, len, SAMPLE_Z))
        } else {
            (0, usize::MAX)
        };
        let zero_from = self.warm.zero_from(warm, t);
        let near = self.warm.kth_range(warm);
        let (out, zero) = split::fused_pass::<false>(
            residual,
            grad,
            (t, zero_from, cap, k),
            (near, false),
            &mut self.cand,
            &mut self.work.pieces,
        );
        self.warm.judge(warm, out.overflow, self.cand.len(), k);
        if out.overflow || out.non_finite.is_some() || self.cand.len() < k {
            if zero {
                split::restore(residual, &self.cand);
            }
            out.check()?;
        }
        if k == 0 {
            return Ok(finish(Vec::new(), Vec::new(), d));
        }
        if out.overflow || self.cand.len() < k {
            let (idx, val, min) = kernel::exact_readonly(
                residual,
                k,
                &mut self.cand,
                &mut self.sample,
                &mut self.scratch,
            )?;
            zero_selected(residual, &idx);
            return Ok(finish_bits(idx, val, d, min));
        }
        // After a zeroing pass (`k >= ZERO_K >= SPLIT_CAND`) there are at least `k`
        // candidates, so they stay apart.
        self.cand.join_if_fewer(split::SPLIT_CAND);
        if self.cand.lists().0.len() == 1 {
            // One list: select in serial, then zero what was taken (or, after a zeroing
            // pass, put back what was not).
            let (idx, val, min) = kernel::select_k_near(&mut self.cand, k, &mut self.scratch, near);
            if zero {
                split::restore(residual, &self.cand);
            }
            zero_selected(residual, &idx);
            return Ok(finish_bits(idx, val, d, min));
        }
        let res = if zero {
            split::Residual::Restore(residual)
        } else {
            split::Residual::Zero(residual)
        };
        let (idx, val, kth) = split::select_k(
            &mut self.cand,
            (&split::Buckets::new(t, k), zero),
            k,
            res,
            &mut self.work,
        );
        Ok(finish_bits(idx, val, d, kth))
    }
}

impl Selector for ExactTopK {
    fn name(&self) -> &'static str {
        "exact"
    }

    fn exact_count(&self) -> bool {
        true
    }

    fn select(&mut self, x: &[f32], k: usize) -> Selection {
        check_dense_len(x.len())?;
        let (idx, val, min) =
            kernel::exact_readonly(x, k, &mut self.cand, &mut self.sample, &mut self.scratch)?;
        Ok(finish_bits(idx, val, x.len(), min))
    }

    fn select_fused(&mut self, residual: &mut [f32], grad: &[f32], k: usize) -> Selection {
        crate::check_fused(residual, grad)?;
        let (sg, info) = self.fused(residual, grad, k)?;
        let kth = info.threshold.to_bits() as i32;
        self.warm.learn(residual.len(), k.min(residual.len()), kth);
        Ok((sg, info))
    }

    fn warm_starts(&self) -> Option<(u64, u64)> {
        Some(self.warm.tally())
    }

    fn recycle(&mut self, used: SparseGrad<f32>) {
        self.cand.spare.keep(used);
    }
}

/// Sort-based reference: the `k` largest by (magnitude desc, index asc), in index order.
pub fn reference_topk(x: &[f32], k: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..x.len() as u32).collect();
    order.sort_by(|&a, &b| {
        x[b as usize]
            .abs()
            .total_cmp(&x[a as usize].abs())
            .then(a.cmp(&b))
    });
    order.truncate(k.min(x.len()));
    order.sort_unstable();
    order
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Error, ErrorFeedback};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Whether the selection `sg` added back into `residual` gives `acc` bit for bit (error
    /// feedback loses nothing).
    pub(crate) fn gives_back(sg: &crate::SparseGrad<f32>, residual: &[f32], acc: &[f32]) -> bool {
        let mut back = residual.to_vec();
        sg.scatter_add_into(&mut back).unwrap();
        back.iter()
            .zip(acc)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    }

    /// Test vectors: `kind` 0 = normal-ish, 1 = few distinct values (ties), 2 = sorted ramp
    /// (adversarial for strided samples), 3 = mostly zeros.
    pub(crate) fn gen_vec(seed: u64, d: usize, kind: u8) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..d)
            .map(|i| match kind % 4 {
                0 => {
                    let u: f32 = rng.gen_range(-1.0..1.0);
                    u * u * u * 3.0
                }
                1 => rng.gen_range(-4i32..=4) as f32 * 0.5,
                2 => i as f32 * 1e-3 - 1.0,
                _ => {
                    if rng.gen_bool(0.02) {
                        rng.gen_range(-1.0..1.0)
                    } else {
                        0.0
                    }
                }
            })
            .collect()
    }

    pub(crate) fn vec_strategy() -> impl Strategy<Value = (Vec<f32>, usize)> {
        (any::<u64>(), 0usize..12_000, 0u8..4, 0.0f64..1.05).prop_map(|(s, d, kind, frac)| {
            let d = if s % 3 == 0 { d % 300 } else { d };
            let k = ((d as f64) * frac * frac * frac) as usize;
            (gen_vec(s, d, kind), k)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn exact_equals_sort_reference((x, k) in vec_strategy()) {
            let mut sel = ExactTopK::new();
            let (sg, info) = sel.select(&x, k).unwrap();
            let want = reference_topk(&x, k);
            prop_assert_eq!(sg.indices(), &want[..]);
            prop_assert_eq!(info.selected, k.min(x.len()));
            for (&i, &v) in sg.indices().iter().zip(sg.values()) {
                prop_assert_eq!(v.to_bits(), x[i as usize].to_bits());
            }
        }

        #[test]
        fn fused_exact_equals_reference_and_conserves_mass(
            (g, k) in vec_strategy(), rseed in any::<u64>()
        ) {
            let r0 = gen_vec(rseed, g.len(), 0);
            let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
            let mut ef = ErrorFeedback::from_residual(r0);
            let mut sel = ExactTopK::new();
            let (sg, _) = ef.step(&mut sel, &g, k).unwrap();
            prop_assert_eq!(sg.indices(), &reference_topk(&acc, k)[..]);
            let mut back = ef.residual().to_vec();
            sg.scatter_add_into(&mut back).unwrap();
            for (a, b) in back.iter().zip(&acc) {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
        }
    }

    /// Every path reports the smallest selected magnitude as its threshold, which the warm
    /// start learns the next call's threshold from: the group maxima, a short tensor, the
    /// sampled pass, the warm pass with one list, a warm miss's fallback (the gradient
    /// halved at the fourth call) and the read-only selection.
    #[test]
    fn reports_the_smallest_selected_magnitude() {
        let check = |sg: &crate::SparseGrad<f32>, info: crate::SelectInfo, what: &str| {
            let min = sg.values().iter().map(|v| abs_bits(*v)).min();
            assert_eq!(info.threshold.to_bits() as i32, min.unwrap_or(0), "{what}");
            assert_eq!(info.selected, sg.nnz(), "{what}");
        };
        for (d, k) in [
            (300, 3),
            (300, 20),
            (5000, 50),
            (1 << 14, 163),
            (40_000, 400),
        ] {
            let mut sel = ExactTopK::new();
            for step in 0..6u64 {
                let scale = if step == 3 { 0.5 } else { 1.0 };
                let g: Vec<f32> = gen_vec(step, d, 0).iter().map(|x| x * scale).collect();
                let mut ef = ErrorFeedback::new(d);
                let (sg, info) = ef.step(&mut sel, &g, k).unwrap();
                assert_eq!(
                    sg.indices(),
                    &reference_topk(&g, k)[..],
                    "d {d} step {step}"
                );
                check(&sg, info, &format!("fused, d {d} step {step}"));
                let (sg, info) = sel.select(&g, k).unwrap();
                check(&sg, info, &format!("read-only, d {d} step {step}"));
            }
            let (calls, missed) = sel.warm_starts().unwrap();
            if d >= 4096 {
                assert!(
                    calls >= 3 && missed >= 1,
                    "d {d}: {calls} warm, {missed} missed"
                );
            }
        }
    }

    /// A pool of two threads, so that passes over 2^20 elements or more are split.
    fn two_threads() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
    }

    #[test]
    fn split_pass_selects_from_lists_kept_apart() {
        // A pass split over two threads with more candidates than `SPLIT_CAND` but
        // fewer than `PAR_CAND`: the lists stay apart and each piece writes its share.
        // With `k` below `ZERO_K`, the selection is made among all their magnitudes
        // (`split::kth_of_lists`) and each piece zeroes its entries; from `ZERO_K`, the
        // pass zeroed its candidates and built its histogram, and each piece puts back
        // what it does not take. Magnitudes on a grid of 1/256, so the k-th magnitude is
        // shared by many entries across both pieces (ties go to the lower index), warm
        // and cold calls alike.
        const { assert!(7_000 < split::ZERO_K && 12_000 >= split::ZERO_K) };
        const { assert!(12_000 < split::PAR_CAND) };
        for k in [7_000, 12_000] {
            two_threads().install(|| kept_apart(k));
        }
    }

    /// [`split_pass_selects_from_lists_kept_apart`] for one `k`.
    fn kept_apart(k: usize) {
        let d = (1 << 20) + 17;
        let mut sel = ExactTopK::new();
        let mut ef = ErrorFeedback::new(d);
        let mut apart = 0;
        for step in 0..4u64 {
            let g: Vec<f32> = gen_vec(step, d, 0)
                .iter()
                .map(|x| (x * 256.0).round() / 256.0)
                .collect();
            let acc: Vec<f32> = ef.residual().iter().zip(&g).map(|(a, b)| a + b).collect();
            let (sg, _) = ef.step(&mut sel, &g, k).unwrap();
            let n = sel.cand.len();
            apart += usize::from(sel.cand.lists().0.len() > 1 && n < split::PAR_CAND);
            assert_eq!(
                sg.indices(),
                &reference_topk(&acc, k)[..],
                "k {k} step {step}"
            );
            let mut back = ef.residual().to_vec();
            sg.scatter_add_into(&mut back).unwrap();
            for (a, b) in back.iter().zip(&acc) {
                assert_eq!(a.to_bits(), b.to_bits(), "step {step}");
            }
            let kth = sg.values().iter().map(|v| v.abs()).fold(f32::MAX, f32::min);
            let tied = acc.iter().filter(|v| v.abs() == kth).count();
            assert!(
                tied > 2,
                "step {step}: {tied} entries at the k-th magnitude"
            );
            sel.recycle(sg);
        }
        assert!(
            apart >= 2,
            "k {k}: the lists stayed apart, fewer than PAR_CAND, in {apart} of 4 steps"
        );
    }

    /// Warm calls on a pool with `k` from `ZERO_K` on (with fewer and more candidates
    /// than `PAR_CAND`): the pass zeroes from the last k-th magnitude up, and the
    /// selection zeroes what it takes below it (the k-th magnitude fell) and puts back
    /// what it drops above it (it rose). Both selectors against their
    /// references, the residual bit for bit, with the k-th magnitude moving both ways.
    #[test]
    fn warm_zeroing_pass_settles_both_sides_of_the_last_kth() {
        for k in [12_000, 40_000] {
            two_threads().install(|| zeroing_pass_settles(k));
        }
    }

    /// [`warm_zeroing_pass_settles_both_sides_of_the_last_kth`] for one `k`.
    fn zeroing_pass_settles(k: usize) {
        use crate::mstopk::reference_mstopk;
        use crate::MsTopK;
        let d = (1 << 20) + 17;
        assert!(k >= split::ZERO_K);
        let base = gen_vec(1, d, 0);
        let (mut exact, mut ms) = (ExactTopK::new(), MsTopK::with_seed(3));
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (mut below, mut above, mut last) = (0usize, 0usize, [0i32; 2]);
        // The k-th magnitude moves both ways between calls; with fewer candidates the
        // warm start's margin is narrower, and the moves too, so that no call misses.
        let scales = if k < split::PAR_CAND {
            [1.0f32, 1.0, 1.002, 0.9985, 1.0015, 0.999]
        } else {
            [1.0f32, 1.0, 1.004, 0.996, 1.003, 0.998]
        };
        for (step, scale) in scales.iter().enumerate() {
            let g: Vec<f32> = base.iter().map(|x| x * scale).collect();
            let mags: Vec<i32> = g.iter().map(|v| abs_bits(*v)).collect();
            for (which, sel) in [&mut exact as &mut dyn Selector, &mut ms]
                .into_iter()
                .enumerate()
            {
                let mut ef = ErrorFeedback::new(d);
                let (sg, _) = ef.step(sel, &g, k).unwrap();
                let want = if which == 0 {
                    reference_topk(&g, k)
                } else {
                    reference_mstopk(&g, k, crate::mstopk::DEFAULT_ROUNDS, &mut rng)
                };
                assert_eq!(sg.indices(), &want[..], "selector {which} step {step}");
                let mut back = ef.residual().to_vec();
                sg.scatter_add_into(&mut back).unwrap();
                assert!(back.iter().zip(&g).all(|(a, b)| a.to_bits() == b.to_bits()));
                let kth = sg.values().iter().map(|v| abs_bits(*v)).min().unwrap();
                if step > 0 {
                    // Taken below the last k-th magnitude, or dropped at or above it.
                    let (lo, hi) = (kth.min(last[which]), kth.max(last[which]));
                    let n = mags.iter().filter(|&&m| m >= lo && m < hi).count();
                    *(if kth < last[which] {
                        &mut below
                    } else {
                        &mut above
                    }) += n;
                }
                last[which] = kth;
                sel.recycle(sg);
            }
            assert!(
                exact.cand.lists().0.len() > 1,
                "k {k} step {step}: not split"
            );
        }
        assert!(below > 100 && above > 100, "below {below}, above {above}");
        for (calls, missed) in [exact.warm_starts(), ms.warm_starts()].map(Option::unwrap) {
            assert!(
                calls >= 5 && missed == 0,
                "k {k}: {calls} warm calls, {missed} missed"
            );
        }
    }

    #[test]
    fn bad_input() {
        let mut sel = ExactTopK::new();
        let (sg, _) = sel.select(&[], 5).unwrap();
        assert_eq!(sg.nnz(), 0);
        let (sg, _) = sel.select(&[1.0, -2.0], 0).unwrap();
        assert_eq!(sg.nnz(), 0);
        let (sg, _) = sel.select(&[1.0, -2.0], 9).unwrap();
        assert_eq!(sg.indices(), &[0, 1]);
        let mut x = gen_vec(1, 50_000, 0);
        x[31_337] = f32::NAN;
        x[40_000] = f32::INFINITY;
        for k in [0, 1, 50, 50_000] {
            assert!(matches!(
                sel.select(&x, k),
                Err(Error::NonFinite { index: 31_337, .. })
            ));
            let mut r = vec![0.0; x.len()];
            assert!(matches!(
                sel.select_fused(&mut r, &x, k),
                Err(Error::NonFinite { index: 31_337, .. })
            ));
        }
        let mut ef = ErrorFeedback::new(3);
        assert!(matches!(
            ef.step(&mut sel, &[1.0; 4], 1),
            Err(Error::LengthMismatch { .. })
        ));
        let mut r = vec![0.0; 3];
        assert!(matches!(
            sel.select_fused(&mut r, &[1.0; 4], 1),
            Err(Error::LengthMismatch { .. })
        ));
    }

    /// Checks a selector on tensors too short to sample, with more selected than the
    /// group-maxima path takes (`grouped::applies(d, k + extra)` false): against
    /// `reference` for every kind of input, `d` from 5 to 4095 and `k` up to `d - 1`, with
    /// the mass conserved bit for bit and the read-only selection equal to the fused one;
    /// and the first non-finite entry reported, fused and read-only, even when two NaNs
    /// put the k-th magnitude above infinity. Fails unless all 60 cases are on that path.
    pub(crate) fn check_short_tensors(
        new: impl Fn() -> Box<dyn Selector>,
        reference: impl Fn(&[f32], usize) -> Vec<u32>,
        extra: usize,
    ) {
        let mut taken = 0;
        for kind in 0..4u8 {
            for d in [5, 100, 1000, 4095] {
                for k in [d / 64 + 1, d / 10, d / 2, d - 1] {
                    let g = gen_vec(u64::from(kind) * 7 + d as u64, d, kind);
                    let r0 = gen_vec(11, d, 0);
                    let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
                    let short =
                        kernel::sample_size(d, k).is_none() && !grouped::applies(d, k + extra);
                    taken += usize::from(short && 0 < k && k < d);
                    let mut r = r0.clone();
                    let (sg, _) = new().select_fused(&mut r, &g, k).unwrap();
                    assert_eq!(sg.indices(), &reference(&acc, k)[..], "{kind} {d} {k}");
                    sg.scatter_add_into(&mut r).unwrap();
                    assert!(r.iter().zip(&acc).all(|(a, b)| a.to_bits() == b.to_bits()));
                    let (read, _) = new().select(&acc, k).unwrap();
                    assert_eq!(read, sg, "read-only: {kind} {d} {k}");
                }
            }
        }
        assert!(taken >= 60, "only {taken} cases took the path");
        let mut g = gen_vec(2, 100, 0);
        (g[5], g[10], g[20]) = (f32::INFINITY, f32::NAN, f32::NAN);
        for k in [1, 2, 3, 50] {
            let mut r = vec![0.0; 100];
            let fused = new().select_fused(&mut r, &g, k);
            let read = new().select(&g, k);
            for err in [fused, read] {
                assert!(
                    matches!(err, Err(Error::NonFinite { index: 5, .. })),
                    "k {k}"
                );
            }
            assert!(r[1].to_bits() == g[1].to_bits() && r[10].is_nan());
        }
    }

    /// [`check_short_tensors`] on the exact selector ([`kernel::exact_small`]).
    #[test]
    fn short_tensors_select_from_the_kth_magnitude() {
        check_short_tensors(|| Box::new(ExactTopK::new()), reference_topk, 0);
    }

    #[test]
    fn sampled_path_and_fallbacks() {
        // Large enough to sample; ties everywhere force the overflow fallback.
        for kind in 0..4 {
            let x = gen_vec(7 + u64::from(kind), 200_000, kind);
            for k in [1, 7, 200, 2_000, 20_000, 150_000] {
                let mut sel = ExactTopK::new();
                let (sg, _) = sel.select(&x, k).unwrap();
                assert_eq!(
                    sg.indices(),
                    &reference_topk(&x, k)[..],
                    "kind {kind} k {k}"
                );
                let mut r = vec![0.0; x.len()];
                let (sg2, _) = sel.select_fused(&mut r, &x, k).unwrap();
                assert_eq!(sg2, sg);
            }
        }
        let flat = vec![0.5f32; 100_000];
        let (sg, _) = ExactTopK::new().select(&flat, 1000).unwrap();
        assert_eq!(sg.indices(), &(0..1000).collect::<Vec<u32>>()[..]);
    }
}
