//! [`MsTopK`]: the approximate top-k operator of MSTopK/HiTopKComm (Shi et al., MLSys
//! 2021) §3.1, Algorithm 1, computed
//! with few passes over memory.
//!
//! Algorithm 1 runs `N` binary-search rounds on `ratio ∈ [0, 1]` with
//! `thres = mean|x| + ratio·(max|x| − mean|x|)` (line 9), counting `|x| ≥ thres` each round
//! (line 10): a count `≤ k` moves the right bound and records `thres1`, a count `> k` moves
//! the left bound and records `thres2`. The output is every `|x| ≥ thres1` plus a
//! contiguous run of `k − k1` indices of `thres2 ≤ |x| < thres1` starting at a random
//! offset (lines 25-28), exactly `k` entries. The paper benchmarks `N = 30`.
//!
//! Same output, fewer passes: one fused pass accumulates, sums `|x|`, tracks the maximum
//! and emits the candidates above a threshold `t_low` estimated from a sample to lie a
//! little below the k-th magnitude. Every round whose threshold is `≥ t_low` is counted
//! exactly among the candidates; every round below `t_low` has more than `k` elements
//! above it (all the candidates), so its decision is known without counting. The final
//! selection comes from the candidates too, unless `thres2 < t_low` (then a read-only
//! pass over the accumulated vector counts and emits).
//!
//! Two details Algorithm 1 leaves open are fixed here: when no round ever counted
//! `1 ≤ nnz ≤ k`, `thres1` stays "unset" and selects nothing (the literal `thres1 = 0`
//! would select every element); and the random offset is drawn from a seeded ChaCha8
//! stream, once per call with `0 < k < d`, so runs are reproducible.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::exact::{check_dense_len, finish, zero_selected, SAMPLE_Z};
use crate::kernel::{self, abs_bits, Cand, PassOut, INF_BITS};
use crate::{Result, Selection, Selector};

/// Default number of binary-search rounds (MSTopK §3.1 benchmarks N = 30).
pub const DEFAULT_ROUNDS: usize = 30;

/// MSTopK selector (exactly `min(k, d)` entries).
#[derive(Debug, Clone)]
pub struct MsTopK {
    rounds: usize,
    rng: ChaCha8Rng,
    cand: Cand,
    sample: Vec<i32>,
    /// Candidate magnitudes the binary search partitions.
    work: Vec<i32>,
}

impl Default for MsTopK {
    fn default() -> Self {
        Self::new(DEFAULT_ROUNDS, 0)
    }
}

/// Where the binary search ended.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// Threshold of the last round with `1 ≤ nnz ≤ k`, as magnitude bits (`i32::MAX`: unset).
    t1: i32,
    /// Threshold of the last round with `nnz > k` (0: unset, selects from everything).
    t2: i32,
}

/// `mean|x|` and `max|x|` of a statistics pass over `d` elements (Algorithm 1 lines 2-3).
fn mean_max(out: &PassOut, d: usize) -> (f64, f64) {
    let u = f64::from(f32::from_bits(out.max_bits as u32));
    (out.abs_sum / d as f64, u)
}

/// Threshold of one round, Algorithm 1 line 9, computed in f64 and rounded to f32.
#[inline]
fn round_threshold(mean: f64, u: f64, ratio: f64) -> f32 {
    (mean + ratio * (u - mean)) as f32
}

impl MsTopK {
    /// MSTopK with `rounds` binary-search rounds (`N` of Algorithm 1) and an RNG seed for
    /// the tie-filling offset.
    pub fn new(rounds: usize, seed: u64) -> Self {
        MsTopK {
            rounds,
            rng: ChaCha8Rng::seed_from_u64(seed),
            cand: Cand::default(),
            sample: Vec::new(),
            work: Vec::new(),
        }
    }

    /// MSTopK with the paper's default `N = 30` and the given seed.
    pub fn with_seed(seed: u64) -> Self {
        Self::new(DEFAULT_ROUNDS, seed)
    }

    /// Number of binary-search rounds.
    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// Restarts the offset stream from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.rng = ChaCha8Rng::seed_from_u64(seed);
    }

    /// Runs the N rounds answering each count from the candidates (`|x| ≥ t_low`, more
    /// than `k` of them). The round thresholds only narrow (they are monotone in `ratio`),
    /// so each round partitions just the candidates still between the bounds: those above
    /// the upper bound are counted once and dropped, those below the lower one never count
    /// again. The N rounds cost about two passes over the candidates instead of N, with
    /// exactly the counts of Algorithm 1.
    fn search(&mut self, t_low: i32, mean: f64, u: f64, k: usize) -> Bounds {
        let (mut l, mut r) = (0.0f64, 1.0f64);
        let mut b = Bounds {
            t1: i32::MAX,
            t2: 0,
        };
        let work = &mut self.work;
        work.clear();
        work.extend(self.cand.val.iter().map(|v| abs_bits(*v)));
        // Candidates at or above every threshold still to come.
        let mut above = 0usize;
        let mut live = &mut work[..];
        // The thresholds grow with `ratio` unless rounding put the mean above the maximum
        // (all magnitudes nearly equal); then every round counts all the candidates.
        let narrows = u >= mean;
        for _ in 0..self.rounds {
            let ratio = l + (r - l) / 2.0;
            let tb = abs_bits(round_threshold(mean, u, ratio));
            let nnz = if tb < t_low {
                usize::MAX
            } else if !narrows {
                live.iter().filter(|&&m| m >= tb).count()
            } else {
                // Move the live magnitudes `>= tb` to the front, branch-free: every
                // element is swapped to the boundary, which advances only past a hit.
                let mut hi = 0;
                for j in 0..live.len() {
                    let v = live[j];
                    live.swap(hi, j);
                    hi += usize::from(v >= tb);
                }
                let nnz = above + hi;
                let rest = std::mem::take(&mut live);
                live = if nnz <= k {
                    // Later thresholds are at most `tb`: the front counts from now on.
                    above = nnz;
                    &mut rest[hi..]
                } else {
                    // Later thresholds are at least `tb`: the back never counts again.
                    &mut rest[..hi]
                };
                nnz
            };
            if nnz <= k {
                r = ratio;
                if nnz > 0 {
                    b.t1 = tb;
                }
            } else {
                l = ratio;
                b.t2 = tb;
            }
        }
        b
    }

    /// Finishes Algorithm 1 (lines 25-28) given the candidates above `t_low` of the
    /// accumulated vector `acc`, its mean and max magnitude.
    fn finish_from(
        &mut self,
        acc: &[f32],
        t_low: i32,
        mean: f64,
        u: f64,
        k: usize,
    ) -> (Vec<u32>, Vec<f32>) {
        let b = self.search(t_low, mean, u, k);
        self.pick(acc, t_low, b, k)
    }

    /// Lines 25-28 of Algorithm 1 once the search ended at `b`: reads `acc` only when
    /// `b.t2 < t_low` (the tie band reaches below the candidates).
    fn pick(&mut self, acc: &[f32], t_low: i32, b: Bounds, k: usize) -> (Vec<u32>, Vec<f32>) {
        let k1 = self
            .cand
            .val
            .iter()
            .filter(|v| abs_bits(**v) >= b.t1)
            .count();
        let need = k - k1;
        let in2 = |ab: i32| ab >= b.t2 && ab < b.t1;
        let from_cand = b.t2 >= t_low;
        let len2 = if from_cand {
            self.cand.val.iter().filter(|v| in2(abs_bits(**v))).count()
        } else {
            acc.iter().filter(|v| in2(abs_bits(**v))).count()
        };
        let start = self.rng.gen_range(0..=len2.saturating_sub(need));
        let end = start + need;
        if from_cand {
            // Branch-free over the candidates: every one is written at the end of the lists
            // and the length advances only for the picked ones.
            let picks = self.cand.idx.iter().zip(&self.cand.val).map(|(&i, &v)| {
                let ab = abs_bits(v);
                let in1 = ab >= b.t1;
                let in2 = !in1 & (ab >= b.t2);
                (i, v, in1, in2)
            });
            return kernel::compact(k, picks, start, end);
        }
        let mut idx = Vec::with_capacity(k);
        let mut val = Vec::with_capacity(k);
        let mut rank = 0usize;
        for (i, &v) in acc.iter().enumerate() {
            let ab = abs_bits(v);
            if ab >= b.t1 {
                idx.push(i as u32);
                val.push(v);
            } else if ab >= b.t2 {
                if rank >= start && rank < end {
                    idx.push(i as u32);
                    val.push(v);
                }
                rank += 1;
            }
        }
        (idx, val)
    }

    /// Sample size and the cap on candidates, for `0 < k < d`.
    fn plan(d: usize, k: usize) -> Option<(usize, usize)> {
        kernel::sample_size(d, k).map(|n| (n, kernel::candidate_cap(d, k, n, SAMPLE_Z)))
    }

    /// Selection from an accumulated `acc` whose stats are known and whose candidates in
    /// `self.cand` (above `t_low`, maybe truncated) came from one pass.
    fn complete(
        &mut self,
        acc: &[f32],
        mut t_low: i32,
        out: PassOut,
        k: usize,
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        out.check()?;
        let d = acc.len();
        let (mean, u) = mean_max(&out, d);
        if out.overflow || self.cand.len() <= k {
            // The sample misjudged: re-filter the accumulated vector with a safer
            // threshold, and as a last resort keep everything.
            let mut tries = Vec::new();
            if let Some(n) = kernel::sample_size(d, k) {
                let n = (4 * n).min(d / 2);
                kernel::sample_x(acc, n, &mut self.sample);
                let cap = kernel::candidate_cap(d, k, self.sample.len(), 8.0);
                let t = kernel::threshold_from_sample(&mut self.sample, d, k, 8.0);
                if t > 0 && t < t_low {
                    tries.push((t, cap));
                }
            }
            tries.push((0, usize::MAX));
            for (t, cap) in tries {
                self.cand.clear();
                let o = kernel::scan_pass::<false>(acc, 0, t, cap, &mut self.cand);
                o.check()?;
                if !o.overflow && self.cand.len() > k {
                    t_low = t;
                    break;
                }
            }
        }
        Ok(self.finish_from(acc, t_low, mean, u, k))
    }
}

impl Selector for MsTopK {
    fn name(&self) -> &'static str {
        "mstopk"
    }

    fn exact_count(&self) -> bool {
        true
    }

    fn select(&mut self, x: &[f32], k: usize) -> Selection {
        check_dense_len(x.len())?;
        let d = x.len();
        let k = k.min(d);
        self.cand.clear();
        if k == 0 || k == d {
            let t = if k == 0 { INF_BITS } else { 0 };
            kernel::scan_pass::<false>(x, 0, t, usize::MAX, &mut self.cand).check()?;
            let (idx, val) = self.cand.take();
            return Ok(finish(idx, val, d));
        }
        let (t, cap) = match Self::plan(d, k) {
            Some((n, cap)) => {
                kernel::sample_x(x, n, &mut self.sample);
                (
                    kernel::threshold_from_sample(&mut self.sample, d, k, SAMPLE_Z),
                    cap,
                )
            }
            None => (0, usize::MAX),
        };
        let out = kernel::scan_pass::<true>(x, 0, t, cap, &mut self.cand);
        let (idx, val) = self.complete(x, t, out, k)?;
        Ok(finish(idx, val, d))
    }

    fn select_fused(&mut self, residual: &mut [f32], grad: &[f32], k: usize) -> Selection {
        crate::check_fused(residual, grad)?;
        let d = residual.len();
        let k = k.min(d);
        self.cand.clear();
        let (idx, val) = if k == 0 || k == d {
            let t = if k == 0 { INF_BITS } else { 0 };
            kernel::fused_pass::<false, false>(residual, grad, 0, t, usize::MAX, &mut self.cand)
                .check()?;
            self.cand.take()
        } else {
            let (t, cap) = match Self::plan(d, k) {
                Some((n, cap)) => {
                    kernel::sample_acc(residual, grad, n, &mut self.sample);
                    (
                        kernel::threshold_from_sample(&mut self.sample, d, k, SAMPLE_Z),
                        cap,
                    )
                }
                None => (0, usize::MAX),
            };
            let out = kernel::fused_pass::<true, false>(residual, grad, 0, t, cap, &mut self.cand);
            self.complete(residual, t, out, k)?
        };
        zero_selected(residual, &idx);
        Ok(finish(idx, val, d))
    }
}

/// Literal Algorithm 1 of MSTopK (N full counting passes), the reference the fast
/// path is tested against. Draws the offset from `rng` exactly like [`MsTopK`].
/// Returns the selected indices in increasing order. Non-finite input is not checked.
pub fn reference_mstopk(x: &[f32], k: usize, rounds: usize, rng: &mut ChaCha8Rng) -> Vec<u32> {
    let d = x.len();
    let k = k.min(d);
    if k == 0 {
        return Vec::new();
    }
    if k == d {
        return (0..d as u32).collect();
    }
    let a: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let mean = kernel::abs_sum(x) / d as f64;
    let u = f64::from(a.iter().copied().fold(0.0f32, f32::max));
    let (mut l, mut r) = (0.0f64, 1.0f64);
    let (mut k1, mut k2) = (0usize, d);
    let (mut thres1, mut thres2) = (f32::INFINITY, 0.0f32);
    for _ in 0..rounds {
        let ratio = l + (r - l) / 2.0;
        let thres = round_threshold(mean, u, ratio);
        let nnz = a.iter().filter(|&&v| v >= thres).count();
        if nnz <= k {
            r = ratio;
            if nnz > k1 {
                k1 = nnz;
                thres1 = thres;
            }
        } else {
            l = ratio;
            if nnz < k2 {
                k2 = nnz;
                thres2 = thres;
            }
        }
    }
    let iota1: Vec<u32> = (0..d as u32).filter(|&i| a[i as usize] >= thres1).collect();
    let iota2: Vec<u32> = (0..d as u32)
        .filter(|&i| a[i as usize] < thres1 && a[i as usize] >= thres2)
        .collect();
    let need = k - k1;
    let start = rng.gen_range(0..=iota2.len().saturating_sub(need));
    let mut out = iota1;
    out.extend_from_slice(&iota2[start..(start + need).min(iota2.len())]);
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::tests::{gen_vec, vec_strategy};
    use crate::{Error, ErrorFeedback};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        #[test]
        fn fast_path_equals_literal_algorithm_1(
            (x, k) in vec_strategy(), seed in any::<u64>(), rounds in 0usize..40
        ) {
            let mut sel = MsTopK::new(rounds, seed);
            let (sg, info) = sel.select(&x, k).unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let want = reference_mstopk(&x, k, rounds, &mut rng);
            prop_assert_eq!(sg.indices(), &want[..]);
            prop_assert_eq!(info.selected, k.min(x.len()));
            // Fused from a zero residual gives the same selection.
            let mut ef = ErrorFeedback::new(x.len());
            let mut sel2 = MsTopK::new(rounds, seed);
            let (sg2, _) = ef.step(&mut sel2, &x, k).unwrap();
            prop_assert_eq!(&sg2, &sg);
            let mut back = ef.residual().to_vec();
            sg2.scatter_add_into(&mut back).unwrap();
            prop_assert_eq!(back, x);
        }
    }

    #[test]
    fn large_inputs_match_reference_and_are_reproducible() {
        for kind in 0..4 {
            let x = gen_vec(11 + u64::from(kind), 150_000, kind);
            for k in [1, 150, 1_500, 15_000, 100_000] {
                let mut sel = MsTopK::with_seed(5);
                let (a, _) = sel.select(&x, k).unwrap();
                let (b, _) = sel.select(&x, k).unwrap();
                let mut rng = ChaCha8Rng::seed_from_u64(5);
                assert_eq!(a.indices(), &reference_mstopk(&x, k, 30, &mut rng)[..]);
                assert_eq!(b.indices(), &reference_mstopk(&x, k, 30, &mut rng)[..]);
                assert_eq!(a.nnz(), k);
            }
        }
    }

    #[test]
    fn bad_input() {
        let mut sel = MsTopK::default();
        assert_eq!(sel.select(&[], 3).unwrap().0.nnz(), 0);
        assert_eq!(sel.select(&[1.0, 2.0], 0).unwrap().0.nnz(), 0);
        assert_eq!(sel.select(&[1.0, 2.0], 5).unwrap().0.nnz(), 2);
        let mut x = vec![1.0f32; 10_000];
        x[9_000] = f32::NEG_INFINITY;
        assert!(matches!(
            sel.select(&x, 10),
            Err(Error::NonFinite { index: 9_000, .. })
        ));
        let mut r = vec![0.0; 10_000];
        assert!(matches!(
            sel.select_fused(&mut r, &x, 10),
            Err(Error::NonFinite { index: 9_000, .. })
        ));
    }
}
