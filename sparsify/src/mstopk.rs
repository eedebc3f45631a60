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
//! pass over the accumulated vector counts and emits). On a pool the candidates stay per
//! piece: a histogram of their magnitudes answers every round whose threshold falls
//! outside the one bucket where the count crosses `k`, and each piece writes its share of
//! the result. Called again on a tensor of the same shape, the fused step takes `t_low`
//! from just below the previous call's smallest selected magnitude instead of a sample
//! (the `warm` module); the output is the same.
//!
//! Two details Algorithm 1 leaves open are fixed here: when no round ever counted
//! `1 ≤ nnz ≤ k`, `thres1` stays "unset" and selects nothing (the literal `thres1 = 0`
//! would select every element); and the random offset is drawn from a seeded ChaCha8
//! stream, once per call with `0 < k < d`, so runs are reproducible.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::exact::{check_dense_len, finish, finish_bits, zero_selected, SAMPLE_Z};
use crate::kernel::{self, abs_bits, Cand, PassOut, INF_BITS};
use crate::warm::WarmStart;
use crate::{grouped, order, split, Result, Selection, Selector, SparseGrad};

/// Most magnitudes left to search ([`MsTopK`]'s `search`) that are searched by counting
/// each round; more are searched by one rank selection.
const RANK_MIN: usize = 4096;

/// Default number of binary-search rounds (MSTopK §3.1 benchmarks N = 30).
pub const DEFAULT_ROUNDS: usize = 30;

/// MSTopK selector (exactly `min(k, d)` entries).
#[derive(Debug, Clone)]
pub struct MsTopK {
    rounds: usize,
    rng: ChaCha8Rng,
    cand: Cand,
    sample: Vec<i32>,
    /// The second half of a sample gathered in parallel.
    sample2: Vec<i32>,
    /// Group maxima of the small-tensor path (`grouped`).
    maxes: Vec<i32>,
    /// Scratch of the selection among the candidates, per parallel piece.
    work: split::Work,
    warm: WarmStart,
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

/// `mean|x|` of a statistics pass over `d` elements (Algorithm 1 line 2; `max|x|`, line 3,
/// is the pass's [`PassOut::max_bits`] when it found a candidate).
fn mean_abs(out: &PassOut, d: usize) -> f64 {
    out.abs_sum / d as f64
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
            sample2: Vec::new(),
            maxes: Vec::new(),
            work: split::Work::default(),
            warm: WarmStart::default(),
        }
    }

    /// Turns the warm start of the fused step on (the default) or off (every call takes
    /// `t_low` from a sample or group maxima); the selection is the same either way.
    pub fn set_warm_start(&mut self, on: bool) {
        self.warm.set_enabled(on);
    }

    /// [`Self::set_warm_start`] as a builder: `MsTopK::with_seed(1).with_warm_start(false)`.
    pub fn with_warm_start(mut self, on: bool) -> Self {
        self.set_warm_start(on);
        self
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

    /// Algorithm 1's N rounds on the candidates (`|x| ≥ t_low`, more than `k` of them, the
    /// largest magnitude `max_bits`), by counting ([`Self::search_by_counts`]) where few
    /// magnitudes are left to search, by one rank selection ([`Self::search_by_rank`])
    /// where many are. On fresh gradients (MSTopK at ρ = 0.01, an AVX-512 machine, a
    /// measuring helper that was not kept): at 2^14 (about 220 magnitudes) counting took
    /// 2.08× the floor against 2.42× by rank; at 2^20 (about 14 000) rank took 0.96–1.00×
    /// against 1.11–1.50×.
    ///
    /// Given a guess `near` of where the (k+1)-th magnitude lies (a warm call's, see
    /// [`WarmStart::kth_range`]), one list is searched by rank too: that magnitude is
    /// selected among the few in the guessed range ([`order::kth_largest_near`]), and the
    /// rounds end in a few steps ([`rounds_by_jump`]). On the 2-core AVX-512 Xeon (fresh
    /// gradients, median ratio to `stream` over six launches of a timing program outside
    /// the repo), MSTopK at 2^14: 2.30× → 2.19× at ρ = 0.01 and 2.14× → 2.00× at ρ = 0.001;
    /// at 2^16 2.03× → 1.99× and 1.71× → 1.70×.
    fn search(
        &mut self,
        t_low: i32,
        (mean, u, max_bits): (f64, f64, i32),
        k: usize,
        near: Option<(i32, i32)>,
    ) -> Bounds {
        let buckets = split::Buckets::new(t_low, k);
        let bound = split::ms_boundary(&self.cand, &buckets, k, &mut self.work);
        let stats = (mean, u, max_bits);
        if self.work.members_mut().len() > RANK_MIN {
            self.search_by_rank(bound, stats, k, None)
        } else if bound.is_none() && near.is_some() {
            self.search_by_rank(bound, stats, k, near)
        } else {
            self.search_by_counts(t_low, bound, stats, k)
        }
    }

    /// [`Self::search`] answering each count from the candidates. The band of magnitudes
    /// where the count crosses `k` ([`split::ms_boundary`]: the warm call's guess, or one
    /// bucket of a histogram) decides every round whose threshold falls outside it; only
    /// rounds inside it count the band's few magnitudes. The round thresholds only narrow
    /// (they are monotone in `ratio`), so each such round partitions just the magnitudes
    /// still between the bounds: those above the upper bound are counted once and dropped,
    /// those below the lower one never count again. The decisions are exactly those of
    /// Algorithm 1's counts.
    fn search_by_counts(
        &mut self,
        t_low: i32,
        bound: Option<((i32, i32), usize)>,
        (mean, u, max_bits): (f64, f64, i32),
        k: usize,
    ) -> Bounds {
        let (mut l, mut r) = (0.0f64, 1.0f64);
        let mut b = Bounds {
            t1: i32::MAX,
            t2: 0,
        };
        let ((lo, hi), mut above) = bound.unwrap_or(((1, 0), 0));
        let mut live = self.work.members_mut();
        // The thresholds grow with `ratio` unless rounding put the mean above the maximum
        // (all magnitudes nearly equal); then every round counts all the band.
        let narrows = u >= mean;
        // Once few are live, the later rounds test a mask over them instead.
        let mut few: Option<Few> = None;
        // The thresholds at `l` and `r`. Rounding to f32 keeps them monotone in `ratio`, so
        // once both bounds came from rounds and their thresholds are adjacent floats, every
        // later round repeats one of those two rounds (same threshold, same count, same
        // decision): the bounds are final. That happens after about 24 rounds.
        let (mut t_l, mut t_r) = (
            abs_bits(round_threshold(mean, u, l)),
            abs_bits(round_threshold(mean, u, r)),
        );
        for _ in 0..self.rounds {
            let ratio = l + (r - l) / 2.0;
            let tb = abs_bits(round_threshold(mean, u, ratio));
            // (count ≤ k, count > 0)
            let (fits, some) = if tb < t_low {
                (false, true)
            } else if bound.is_some() && !(lo..=hi).contains(&tb) {
                // Above the boundary band at most k pass, below it more than k.
                (tb > hi, tb <= max_bits)
            } else if !narrows {
                let nnz = above + kernel::count_ge(live, tb);
                (nnz <= k, nnz > 0)
            } else if let Some(f) = &mut few {
                let hi = f.at_or_above(tb);
                let nnz = above + hi.count_ones() as usize;
                if nnz <= k {
                    above = nnz;
                    f.live &= !hi;
                } else {
                    f.live = hi;
                }
                (nnz <= k, nnz > 0)
            } else {
                // Count the live magnitudes `>= tb`, then keep only the side later
                // rounds can still count.
                let hi = kernel::count_ge(live, tb);
                let nnz = above + hi;
                let rest = std::mem::take(&mut live);
                live = if nnz <= k {
                    // Later thresholds are at most `tb`: those above count from now on.
                    above = nnz;
                    let n = if hi == 0 {
                        rest.len()
                    } else {
                        order::retain(rest, tb, false)
                    };
                    &mut rest[..n]
                } else {
                    // Later thresholds are at least `tb`: those below never count again.
                    let n = if hi == rest.len() {
                        hi
                    } else {
                        order::retain(rest, tb, true)
                    };
                    &mut rest[..n]
                };
                few = Few::of(live);
                (nnz <= k, nnz > 0)
            };
            if fits {
                r = ratio;
                if some {
                    b.t1 = tb;
                }
                t_r = tb;
            } else {
                l = ratio;
                b.t2 = tb;
                t_l = tb;
            }
            if narrows && l > 0.0 && r < 1.0 && t_r - t_l <= 1 {
                break;
            }
        }
        b
    }

    /// [`Self::search`] by rank: a round's count `|x| ≥ thres` is at most `k` exactly
    /// when `thres` lies above the (k+1)-th largest magnitude, and it is positive exactly
    /// when `thres` is at most the largest: one selection of that magnitude
    /// ([`order::kth_largest`], among the boundary bucket's magnitudes of a split pass,
    /// [`split::ms_boundary`]) answers every round, where counting each round's candidates
    /// cost a pass over those still between the bounds. The decisions are exactly those of
    /// Algorithm 1's counts.
    fn search_by_rank(
        &mut self,
        bound: Option<((i32, i32), usize)>,
        (mean, u, max_bits): (f64, f64, i32),
        k: usize,
        near: Option<(i32, i32)>,
    ) -> Bounds {
        let above = bound.map_or(0, |(_, above)| above);
        let (members, rank) = (self.work.members_mut(), k + 1 - above);
        let kth1 = match near {
            Some(near) => order::kth_largest_near(members, rank, near),
            None => order::kth_largest(members, rank),
        };
        let stats = (mean, u, max_bits);
        rounds_by_jump(kth1, stats, self.rounds)
            .unwrap_or_else(|| rounds_by_rank(kth1, stats, self.rounds))
    }

    /// Lines 25-28 of Algorithm 1 once the search ended at `b`, given the candidates above
    /// `t_low` of the accumulated vector `x`: from the candidates per piece (zeroing the
    /// selection in `x` when it is a residual), or by a serial pass over `x` when `b.t2 <
    /// t_low` (the tie band reaches below the candidates). Returns the selection and the
    /// smallest magnitude in it.
    fn pick(&mut self, x: Buf<'_>, t_low: i32, b: Bounds, k: usize) -> (Vec<u32>, Vec<f32>, i32) {
        let bands = split::MsPick { t1: b.t1, t2: b.t2 };
        let buckets = split::Buckets::new(t_low, k);
        let (k1, len2) = split::ms_counts(&self.cand, &buckets, &bands, &mut self.work);
        let need = k - k1;
        let in2 = |ab: i32| ab >= b.t2 && ab < b.t1;
        let from_cand = b.t2 >= t_low;
        let mut x = x;
        if !from_cand {
            // The tie band reaches below the candidates: read the accumulated vector whole.
            if let Buf::Residual(r, zeroed) = &mut x {
                if *zeroed {
                    split::restore(r, &self.cand);
                    *zeroed = false;
                }
            }
        }
        let len2 = if from_cand {
            len2
        } else {
            x.get().iter().filter(|v| in2(abs_bits(**v))).count()
        };
        let start = self.rng.gen_range(0..=len2.saturating_sub(need));
        let end = start + need;
        if from_cand {
            let res = match x {
                Buf::Read(_) => split::Residual::None,
                Buf::Residual(r, true) => split::Residual::Restore(r),
                Buf::Residual(r, false) => split::Residual::Zero(r),
            };
            return split::select_ms(&mut self.cand, &bands, start, end, res, &mut self.work);
        }
        let (mut idx, mut val) = self.cand.spare.lists(k);
        let mut rank = 0usize;
        let mut min = i32::MAX;
        for (i, &v) in x.get().iter().enumerate() {
            let ab = abs_bits(v);
            let keep = ab >= b.t1 || (in2(ab) && rank >= start && rank < end);
            rank += usize::from(in2(ab));
            if keep {
                idx.push(i as u32);
                val.push(v);
                min = min.min(ab);
            }
        }
        if let Buf::Residual(r, _) = x {
            zero_selected(r, &idx);
        }
        (idx, val, min)
    }

    /// Sample size and the cap on candidates, for `0 < k < d`.
    fn plan(d: usize, k: usize) -> Option<(usize, usize)> {
        kernel::sample_size(d, k).map(|n| (n, kernel::candidate_cap(d, k, n, SAMPLE_Z)))
    }

    /// Selection from an accumulated `x` whose stats are known and whose candidates in
    /// `self.cand` (above `t_low`, maybe truncated) came from one pass. Returns the
    /// selection and the smallest magnitude in it.
    fn complete(
        &mut self,
        mut x: Buf<'_>,
        mut t_low: i32,
        out: PassOut,
        k: usize,
        near: Option<(i32, i32)>,
    ) -> Result<(Vec<u32>, Vec<f32>, i32)> {
        let misjudged = out.overflow || self.cand.len() <= k;
        // Only the pieces of a pass that zeroed its candidates were prepared for a split
        // selection.
        let prepared = matches!(&x, Buf::Residual(_, true));
        if let Buf::Residual(r, zeroed) = &mut x {
            if *zeroed && (misjudged || out.non_finite.is_some()) {
                // The accumulated vector whole again, for the error or the fallback.
                split::restore(r, &self.cand);
                *zeroed = false;
            }
        }
        out.check()?;
        let acc = x.get();
        let d = acc.len();
        let mean = mean_abs(&out, d);
        let mut max_bits = out.max_bits;
        if misjudged {
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
            // The pass's maximum is exact only when it found a candidate
            // ([`PassOut::max_bits`]); the list filtered again holds the largest element.
            let (lists, _) = self.cand.lists();
            let top = lists
                .iter()
                .flat_map(|l| &l.val)
                .map(|v| abs_bits(*v))
                .max();
            max_bits = max_bits.max(top.unwrap_or(0));
        }
        let u = f64::from(f32::from_bits(max_bits as u32));
        self.cand.join_if_fewer(if prepared {
            split::SPLIT_CAND
        } else {
            usize::MAX
        });
        let b = self.search(t_low, (mean, u, max_bits), k, near);
        Ok(self.pick(x, t_low, b, k))
    }
}

/// Algorithm 1's `rounds` rounds given the (k+1)-th largest magnitude `kth1` (bits): a
/// round's count is at most `k` exactly when its threshold lies above `kth1`, and positive
/// exactly when it is at most the largest, `max_bits` ([`MsTopK::search_by_rank`]).
fn rounds_by_rank(kth1: i32, (mean, u, max_bits): (f64, f64, i32), rounds: usize) -> Bounds {
    let (mut l, mut r) = (0.0f64, 1.0f64);
    let mut b = Bounds {
        t1: i32::MAX,
        t2: 0,
    };
    for _ in 0..rounds {
        let ratio = l + (r - l) / 2.0;
        let tb = abs_bits(round_threshold(mean, u, ratio));
        if tb > kth1 {
            // At most k at or above `tb`; some when `tb` does not pass the largest.
            r = ratio;
            if tb <= max_bits {
                b.t1 = tb;
            }
        } else {
            l = ratio;
            b.t2 = tb;
        }
    }
    b
}

/// Most rounds [`rounds_by_jump`] takes: every ratio the bisection visits is then an exact
/// `f64` (`j / 2^rounds` with `j < 2^50`).
const JUMP_MAX_ROUNDS: usize = 50;

/// [`rounds_by_rank`]'s result in a few threshold evaluations instead of `rounds`, each of
/// which waited for the last (a chain of about 30 cycles a round, with a branch that
/// mispredicts half the time).
///
/// Why it is the same: with `u >= mean` the threshold is monotone in `ratio`, so the
/// decision `threshold > kth1` is false up to some point of the grid `j / 2^rounds` and
/// true after it, and the bisection ends on the two grid points either side of that point
/// (`0` and `1` when it never moved a bound). The first grid point past it is estimated
/// from where the threshold rounds to the next `f32` above `kth1`, and moved until the
/// decisions at it and the point below it show it is the one. `None` (the caller then runs
/// the rounds) when the threshold is not known to be monotone, or the estimate is far off
/// (thresholds so close together that `f64` rounding blurs the grid).
fn rounds_by_jump(
    kth1: i32,
    (mean, u, max_bits): (f64, f64, i32),
    rounds: usize,
) -> Option<Bounds> {
    let span = u - mean;
    let wide = span > 0.0 && mean.is_finite();
    if rounds == 0 || rounds > JUMP_MAX_ROUNDS || !wide {
        return None;
    }
    let top = 1u64 << rounds;
    let tb = |j: u64| abs_bits(round_threshold(mean, u, j as f64 / top as f64));
    // The decision at grid point `j`; never made at 0 and `top`, which the bisection only
    // approaches.
    let passes = |j: u64| j >= top || (j > 0 && tb(j) > kth1);
    // A threshold passes `kth1` once it rounds to the next `f32` up: from about halfway.
    let (v, next) = (f32::from_bits(kth1 as u32), f32::from_bits(kth1 as u32 + 1));
    let half = (f64::from(v) + f64::from(next)) / 2.0;
    let est = ((half - mean) / span * top as f64).ceil();
    let mut j = if est.is_nan() {
        0
    } else {
        est.clamp(0.0, top as f64) as u64
    };
    for _ in 0..8 {
        if !passes(j) {
            j += 1;
        } else if j > 0 && passes(j - 1) {
            j -= 1;
        } else {
            // `j` is the first grid point that passes (at least 1: 0 never does).
            let (l, r) = (j - 1, j);
            let t2 = if l > 0 { tb(l) } else { 0 };
            let t1 = Some(r)
                .filter(|&r| r < top)
                .map(tb)
                .filter(|&t| t <= max_bits)
                .unwrap_or(i32::MAX);
            return Some(Bounds { t1, t2 });
        }
    }
    None
}

/// At most 16 live magnitudes of the search as a mask over a fixed array: the last rounds,
/// which count a handful each, test them all at once instead of partitioning a slice.
#[derive(Debug, Clone, Copy)]
struct Few {
    /// The magnitudes, padded with -1 (below every threshold).
    m: [i32; 16],
    /// Which of them are still live.
    live: u16,
}

impl Few {
    /// `live` as a mask when it holds at most 16 magnitudes.
    fn of(live: &[i32]) -> Option<Few> {
        if live.len() > 16 {
            return None;
        }
        let mut m = [-1; 16];
        m[..live.len()].copy_from_slice(live);
        Some(Few {
            m,
            live: ((1u32 << live.len()) - 1) as u16,
        })
    }

    /// The live magnitudes `>= t` (for `t >= 0`), as a mask.
    #[inline]
    fn at_or_above(&self, t: i32) -> u16 {
        let mut hit = 0u16;
        for (j, &m) in self.m.iter().enumerate() {
            hit |= u16::from(m >= t) << j;
        }
        hit & self.live
    }
}

/// The vector MSTopK selects from: read-only, or the residual of a fused step (whose
/// selected entries end up zeroed), with whether the pass zeroed all the candidates.
enum Buf<'a> {
    Read(&'a [f32]),
    Residual(&'a mut [f32], bool),
}

impl Buf<'_> {
    fn get(&self) -> &[f32] {
        match self {
            Buf::Read(x) => x,
            Buf::Residual(r, _) => r,
        }
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
            // Too short to sample: from the (k+1)-th magnitude, as the fused step does.
            None => (
                kernel::kth_magnitude(x, k + 1, &mut self.sample),
                usize::MAX,
            ),
        };
        let out = kernel::scan_pass::<true>(x, 0, t, cap, &mut self.cand);
        let (idx, val, min) = self.complete(Buf::Read(x), t, out, k, None)?;
        Ok(finish_bits(idx, val, d, min))
    }

    fn select_fused(&mut self, residual: &mut [f32], grad: &[f32], k: usize) -> Selection {
        crate::check_fused(residual, grad)?;
        let d = residual.len();
        let k = k.min(d);
        self.cand.clear();
        if k == 0 || k == d {
            let t = if k == 0 { INF_BITS } else { 0 };
            kernel::fused_pass::<false, false>(residual, grad, 0, t, usize::MAX, &mut self.cand)
                .check()?;
            let (idx, val) = self.cand.take();
            zero_selected(residual, &idx);
            return Ok(finish(idx, val, d));
        }
        let warm = self.warm.threshold(d, k);
        if warm.is_none() && grouped::applies(d, k + 1) {
            // Candidates above a threshold with more than `k` elements past it, no sample.
            // Measured at 2^14: 14 % faster than the sampled pass at ρ = 0.01; at ρ = 0.001,
            // since the group-max pass has its AVX-512 build, 2.77 → 2.43 µs (2^13: 1.98 →
            // 1.45 µs; 2^15: level).
            let (t, out) =
                grouped::fused::<true>(residual, grad, k + 1, &mut self.maxes, &mut self.cand);
            let (idx, val, min) = self.complete(Buf::Residual(residual, false), t, out, k, None)?;
            self.warm.learn(d, k, min);
            return Ok(finish_bits(idx, val, d, min));
        }
        if warm.is_none() && kernel::sample_size(d, k).is_none() {
            // Too short to sample, too many selected for the group maxima: the candidates
            // are the entries at or above the (k+1)-th magnitude, found among all of them
            // (more than `k`, as the rounds below `t` need). Listing every entry instead
            // took 13.4 µs a step at 2^11, ρ = 0.05 on the 2-core Zen 3 VM.
            kernel::add_one(residual, grad);
            let t = kernel::kth_magnitude(residual, k + 1, &mut self.sample);
            self.cand.clear();
            let out = kernel::scan_pass::<true>(residual, 0, t, usize::MAX, &mut self.cand);
            let (idx, val, min) = self.complete(Buf::Residual(residual, false), t, out, k, None)?;
            self.warm.learn(d, k, min);
            return Ok(finish_bits(idx, val, d, min));
        }
        let (t, cap) = match (warm, kernel::sample_size(d, k)) {
            (Some(t), _) => (t, WarmStart::cap(d, k)),
            (None, Some(n)) => {
                let bufs = (&mut self.sample, &mut self.sample2);
                let (t, len) = kernel::sampled_threshold(residual, grad, n, k, SAMPLE_Z, bufs);
                (t, kernel::candidate_cap(d, k, len, SAMPLE_Z))
            }
            (None, None) => (0, usize::MAX),
        };
        let zero_from = self.warm.zero_from(warm, t);
        let near = self.warm.kth_range(warm);
        let (out, zero) = split::fused_pass::<true>(
            residual,
            grad,
            (t, zero_from, cap, k),
            (near, true),
            &mut self.cand,
            &mut self.work.pieces,
        );
        // The rounds below `t_low` need more than `k` candidates.
        self.warm.judge(warm, out.overflow, self.cand.len(), k + 1);
        let (idx, val, min) = self.complete(Buf::Residual(residual, zero), t, out, k, near)?;
        self.warm.learn(d, k, min);
        Ok(finish_bits(idx, val, d, min))
    }

    fn recycle(&mut self, used: SparseGrad<f32>) {
        self.cand.spare.keep(used);
    }

    fn warm_starts(&self) -> Option<(u64, u64)> {
        Some(self.warm.tally())
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
    use crate::exact::tests::{gen_vec, gives_back, vec_strategy};
    use crate::{Error, ErrorFeedback};
    use proptest::prelude::*;
    use rand::Rng;

    /// [`rounds_by_jump`] ends where [`rounds_by_rank`]'s rounds end, whenever it answers:
    /// for `kth1` on a round's threshold, one bit either side of it, and anywhere, with
    /// the largest magnitude at, above and below the thresholds, for 0 to 60 rounds and
    /// spans from wide down to a few `f32` steps (and none). It answers every case with a
    /// wide span and 1 to 50 rounds.
    #[test]
    fn jumping_to_the_last_rounds_ends_as_the_rounds_do() {
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        let (mut answered, mut cases) = (0usize, 0usize);
        for _ in 0..20_000 {
            let mean = rng.gen_range(0.01f64..3.0);
            let span = match rng.gen_range(0..4) {
                0 => rng.gen_range(0.0..1e-6) * mean,
                1 => 0.0,
                _ => rng.gen_range(0.0..5.0) * mean,
            };
            let u = mean + span;
            let rounds = rng.gen_range(0..=60);
            let ratio = rng.gen_range(0.0..1.0);
            let on = abs_bits(round_threshold(mean, u, ratio));
            let kth1 = match rng.gen_range(0..4) {
                0 => on,
                1 => on - 1,
                2 => on + 1,
                _ => abs_bits(rng.gen_range(0.0..(u as f32) * 1.2 + 0.1)),
            }
            .max(0);
            let max_bits = match rng.gen_range(0..3) {
                0 => abs_bits(u as f32),
                1 => kth1.saturating_add(rng.gen_range(0..1000)),
                _ => abs_bits(round_threshold(mean, u, rng.gen_range(0.0..1.0))),
            };
            let stats = (mean, u, max_bits);
            let want = rounds_by_rank(kth1, stats, rounds);
            // Cases it should answer: a wide span and 1 to 50 rounds.
            let ordinary = span > 1e-3 * mean && (1..=JUMP_MAX_ROUNDS).contains(&rounds);
            cases += usize::from(ordinary);
            if let Some(got) = rounds_by_jump(kth1, stats, rounds) {
                answered += usize::from(ordinary);
                assert_eq!(
                    (got.t1, got.t2),
                    (want.t1, want.t2),
                    "kth1 {kth1}, mean {mean}, u {u}, max {max_bits}, {rounds} rounds"
                );
            }
        }
        assert!(cases > 8_000 && answered == cases, "{answered} of {cases}");
    }

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

    /// A warm pass that finds no candidate at all (the k-th magnitude fell a hundredfold
    /// since the last call) knows no exact `max|x|` ([`PassOut::max_bits`]): the fallback
    /// takes it from the list it filters again, and selects as a cold call does.
    #[test]
    fn a_warm_pass_without_candidates_selects_as_a_cold_one() {
        let (d, k) = (1 << 14, 100);
        let big: Vec<f32> = gen_vec(1, d, 0).iter().map(|v| v * 100.0).collect();
        for seed in 0..4 {
            let small = gen_vec(2 + seed, d, 0);
            let run = |warm: bool| {
                let mut sel = MsTopK::with_seed(seed);
                ErrorFeedback::new(d).step(&mut sel, &big, k).unwrap();
                if !warm {
                    sel.set_warm_start(false);
                }
                let mut ef = ErrorFeedback::new(d);
                let (sg, info) = ef.step(&mut sel, &small, k).unwrap();
                let residual: Vec<u32> = ef.residual().iter().map(|v| v.to_bits()).collect();
                (sg, info.threshold.to_bits(), residual, sel.warm_starts())
            };
            let (warm, cold) = (run(true), run(false));
            assert_eq!(warm.3, Some((1, 1)), "one warm call, and it missed");
            assert_eq!(warm.0.indices(), cold.0.indices(), "seed {seed}");
            assert_eq!(warm.1, cold.1, "seed {seed}: the selection's threshold");
            assert!(warm.2 == cold.2, "seed {seed}: the residuals differ");
        }
    }

    /// The candidates from the (k+1)-th magnitude of a tensor too short to sample give
    /// Algorithm 1's selection ([`crate::exact::tests::check_short_tensors`]).
    #[test]
    fn short_tensors_take_candidates_from_the_kth_magnitude() {
        crate::exact::tests::check_short_tensors(
            || Box::new(MsTopK::with_seed(4)),
            |x, k| {
                let mut rng = ChaCha8Rng::seed_from_u64(4);
                reference_mstopk(x, k, DEFAULT_ROUNDS, &mut rng)
            },
            1,
        );
    }

    /// The search answered from the (k+1)-th largest magnitude decides every round as
    /// Algorithm 1's counts do, down to single floats: on magnitudes that sit on adjacent
    /// floats (where the rounds end among the data and the tie band's random run picks
    /// among equal magnitudes) and with more rounds than float resolution needs.
    #[test]
    fn search_matches_algorithm_1_at_float_resolution() {
        let (mut cases, mut seeded) = (0, 0);
        // Kind 4: half zeros, the rest on 16 adjacent floats (and a few far above), so the
        // last rounds' thresholds fall among the data and every ulp of the bounds counts.
        let ulps = |s: u64, d: usize| -> Vec<f32> {
            let mut rng = ChaCha8Rng::seed_from_u64(s);
            (0..d)
                .map(|i| {
                    let m = if i % 97 == 0 {
                        rng.gen_range(2.0f32..3.0)
                    } else if i % 2 == 0 {
                        // Zeros keep the mean below the cluster.
                        0.0
                    } else {
                        f32::from_bits(0x3f80_0000 + rng.gen_range(0..16u32))
                    };
                    if rng.gen::<bool>() {
                        m
                    } else {
                        -m
                    }
                })
                .collect()
        };
        // Kind 5: half zeros, the rest 1.0 but every 16th the next float up, the maximum:
        // for k between their counts, the search only fits at the maximum itself, after
        // its lower bound has reached the float just below.
        let top = |d: usize| -> Vec<f32> {
            (0..d)
                .map(|i| match (i % 2, i % 32) {
                    (0, _) => 0.0,
                    (_, 1) => f32::from_bits(0x3f80_0001),
                    _ => 1.0,
                })
                .collect()
        };
        for kind in 0..6 {
            for (s, d) in [(1u64, 3_000usize), (2, 20_000), (3, 70_000)] {
                let seed = s * 7 + u64::from(kind);
                let x = if kind < 4 {
                    gen_vec(seed, d, kind)
                } else if kind == 4 {
                    ulps(seed, d)
                } else {
                    top(d)
                };
                for k in [1, 10, d / 100, d / 20, d / 10, d / 2] {
                    for rounds in [30, 64] {
                        let mut sel = MsTopK::new(rounds, s);
                        let (a, _) = sel.select(&x, k).unwrap();
                        let mut rng = ChaCha8Rng::seed_from_u64(s);
                        let want = reference_mstopk(&x, k, rounds, &mut rng);
                        assert_eq!(a.indices(), &want[..], "kind {kind} d {d} k {k}");
                        if kind >= 4 {
                            // Another seed draws another run from the tie band.
                            let (b, _) = MsTopK::new(rounds, s + 1).select(&x, k).unwrap();
                            cases += 1;
                            seeded += usize::from(a != b);
                        }
                    }
                }
            }
        }
        assert!(
            seeded * 2 > cases,
            "the tie band mattered in {seeded} of {cases}"
        );
    }

    /// Error-feedback steps on a tensor under the parallel cut-off, warm after the first:
    /// the serial pass zeroes its candidates and the selection puts back the ones it does
    /// not take ([`split::fused_pass`]'s `serial_zeroes`). Each step equals Algorithm 1 on
    /// the accumulated vector, and the selection plus the new residual give it back bit
    /// for bit; ties (kind 1) and both densities, with most steps warm.
    #[test]
    fn warm_serial_steps_match_algorithm_1_and_conserve() {
        let mut warm = 0;
        let zeroed_before = split::tests::SERIAL_ZEROED.with(|c| c.get());
        for kind in 0..4u8 {
            for (d, k) in [(1usize << 16, 655), (50_000, 50), (1 << 13, 82)] {
                let mut sel = MsTopK::with_seed(7);
                let mut rng = ChaCha8Rng::seed_from_u64(7);
                let mut ef = ErrorFeedback::new(d);
                for step in 0..6u64 {
                    let g = gen_vec(100 * u64::from(kind) + step, d, kind);
                    let acc: Vec<f32> = ef.residual().iter().zip(&g).map(|(a, b)| a + b).collect();
                    let (sg, _) = ef.step(&mut sel, &g, k).unwrap();
                    let want = reference_mstopk(&acc, k, DEFAULT_ROUNDS, &mut rng);
                    assert_eq!(sg.indices(), &want[..], "kind {kind} d {d} step {step}");
                    let same = gives_back(&sg, ef.residual(), &acc);
                    assert!(same, "kind {kind} d {d} step {step}: not conserved");
                    sel.recycle(sg);
                }
                warm += sel.warm_starts().unwrap().0;
            }
        }
        // Five steps of each of the twelve runs could start warm.
        assert!(warm >= 40, "{warm} warm calls of 60");
        let zeroed = split::tests::SERIAL_ZEROED.with(|c| c.get()) - zeroed_before;
        assert!(zeroed >= 40, "{zeroed} serial passes zeroed");
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
