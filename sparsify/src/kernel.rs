//! The CPU hot path shared by every selector: sampled threshold estimation, the fused
//! accumulate-compare-emit pass, read-only filter passes and exact selection among
//! candidates.
//!
//! Magnitudes are compared as integers: for a finite `f32`, `bits & 0x7fff_ffff` read as an
//! `i32` orders exactly like `|x|`, and every NaN or infinity maps above every finite
//! value. A threshold never exceeds [`INF_BITS`], so every non-finite value lands among
//! the candidates, which is how a NaN or infinity is found within the same pass at no cost.

use crate::{Error, Result};

/// Bit pattern of `+inf`; magnitudes at or above it are non-finite.
pub(crate) const INF_BITS: i32 = 0x7f80_0000;

/// Elements per unrolled block of the hot loops.
const BLOCK: usize = 16;

/// Magnitude of `x` as an order-preserving integer.
#[inline(always)]
pub(crate) fn abs_bits(x: f32) -> i32 {
    (x.to_bits() & 0x7fff_ffff) as i32
}

/// Selection key: larger is better; magnitude first, then the lower index wins ties.
#[inline(always)]
pub(crate) fn key(abs: i32, idx: u32) -> u64 {
    ((abs as u64) << 32) | u64::from(u32::MAX - idx)
}

/// Candidates emitted by a pass, in increasing index order.
#[derive(Debug, Default, Clone)]
pub(crate) struct Cand {
    pub idx: Vec<u32>,
    pub val: Vec<f32>,
}

impl Cand {
    pub fn clear(&mut self) {
        self.idx.clear();
        self.val.clear();
    }
    pub fn len(&self) -> usize {
        self.idx.len()
    }
}

/// What a pass saw besides its candidates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PassOut {
    /// More candidates than `cap` passed the threshold; the list is truncated.
    pub overflow: bool,
    /// First non-finite value (index, value), found in index order.
    pub non_finite: Option<(usize, f32)>,
    /// Sums of `|x|` for [`combine_lanes`] (see [`abs_lanes`] for the order), stats only.
    pub lanes: [f64; 8],
    /// Largest magnitude bits seen (stats only).
    pub max_bits: i32,
}

impl PassOut {
    fn new() -> Self {
        PassOut {
            overflow: false,
            non_finite: None,
            lanes: [0.0; 8],
            max_bits: 0,
        }
    }

    /// Turns a recorded non-finite value into the typed error.
    pub fn check(&self) -> Result<()> {
        match self.non_finite {
            Some((index, value)) => Err(Error::NonFinite { index, value }),
            None => Ok(()),
        }
    }
}

/// Combines the 8 lane sums in a fixed order, so every code path gets the same mean.
#[inline]
pub(crate) fn combine_lanes(l: &[f64; 8]) -> f64 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// Per-block statistics: the block's magnitudes are summed in f32 as a fixed tree
/// (pairs `j, j+8`, then `j, j+4`, `j, j+2`, `j, j+1`) and the block sum is added to
/// lane 0 in f64; see [`abs_lanes`] for the reference order. Vectorises well.
#[inline(always)]
fn block_stats(bits: &[i32; BLOCK], lanes: &mut [f64; 8], mxv: &mut [i32; BLOCK]) {
    let mut v = [0.0f32; BLOCK];
    for j in 0..BLOCK {
        v[j] = f32::from_bits(bits[j] as u32);
        mxv[j] = mxv[j].max(bits[j]);
    }
    lanes[0] += f64::from(tree16(&v));
}

/// Sum of 16 values in a fixed tree order.
#[inline(always)]
fn tree16(v: &[f32; BLOCK]) -> f32 {
    let mut a = [0.0f32; 8];
    for j in 0..8 {
        a[j] = v[j] + v[j + 8];
    }
    let mut b = [0.0f32; 4];
    for j in 0..4 {
        b[j] = a[j] + a[j + 4];
    }
    (b[0] + b[2]) + (b[1] + b[3])
}

#[inline(always)]
fn emit(a: f32, ab: i32, i: usize, cap: usize, cand: &mut Cand, out: &mut PassOut) {
    if ab >= INF_BITS && out.non_finite.is_none() {
        out.non_finite = Some((i, a));
    }
    if cand.idx.len() < cap {
        cand.idx.push(i as u32);
        cand.val.push(a);
    } else {
        out.overflow = true;
    }
}

/// The fused error-feedback pass over `r` and `g` (same length, checked by the caller):
/// `r[i] += g[i]`, and every `i` with `|r[i]| >= t` is appended to `cand` with index
/// `base + i` (at most `cap` of them). With `STATS`, also sums `|r[i]|` per lane and
/// tracks the largest magnitude. One read of `r` and `g`, one write of `r`.
#[inline(always)]
fn fused_body<const STATS: bool>(
    r: &mut [f32],
    g: &[f32],
    base: usize,
    t: i32,
    cap: usize,
    cand: &mut Cand,
) -> PassOut {
    let mut out = PassOut::new();
    let mut lanes = [0.0f64; 8];
    let mut mx = 0i32;
    let mut mxv = [0i32; BLOCK];
    let n = r.len().min(g.len());
    let (r, g) = (&mut r[..n], &g[..n]);
    let mut rc = r.chunks_exact_mut(BLOCK);
    let mut gc = g.chunks_exact(BLOCK);
    let mut off = base;
    for (rb, gb) in (&mut rc).zip(&mut gc) {
        let mut bits = [0i32; BLOCK];
        let mut hit = false;
        for j in 0..BLOCK {
            let a = rb[j] + gb[j];
            rb[j] = a;
            let ab = abs_bits(a);
            bits[j] = ab;
            hit |= ab >= t;
        }
        if STATS {
            block_stats(&bits, &mut lanes, &mut mxv);
        }
        if hit {
            for j in 0..BLOCK {
                if bits[j] >= t {
                    emit(rb[j], bits[j], off + j, cap, cand, &mut out);
                }
            }
        }
        off += BLOCK;
    }
    for (j, (rv, gv)) in rc
        .into_remainder()
        .iter_mut()
        .zip(gc.remainder())
        .enumerate()
    {
        let a = *rv + *gv;
        *rv = a;
        let ab = abs_bits(a);
        if STATS {
            lanes[0] += f64::from(f32::from_bits(ab as u32));
            mx = mx.max(ab);
        }
        if ab >= t {
            emit(a, ab, off + j, cap, cand, &mut out);
        }
    }
    out.lanes = lanes;
    out.max_bits = mx.max(mxv.iter().copied().max().unwrap_or(0));
    out
}

/// Read-only counterpart of [`fused_body`]: filters `x` against `t`.
#[inline(always)]
fn scan_body<const STATS: bool>(
    x: &[f32],
    base: usize,
    t: i32,
    cap: usize,
    cand: &mut Cand,
) -> PassOut {
    let mut out = PassOut::new();
    let mut lanes = [0.0f64; 8];
    let mut mx = 0i32;
    let mut mxv = [0i32; BLOCK];
    let mut xc = x.chunks_exact(BLOCK);
    let mut off = base;
    for xb in &mut xc {
        let mut bits = [0i32; BLOCK];
        let mut hit = false;
        for j in 0..BLOCK {
            let ab = abs_bits(xb[j]);
            bits[j] = ab;
            hit |= ab >= t;
        }
        if STATS {
            block_stats(&bits, &mut lanes, &mut mxv);
        }
        if hit {
            for j in 0..BLOCK {
                if bits[j] >= t {
                    emit(xb[j], bits[j], off + j, cap, cand, &mut out);
                }
            }
        }
        off += BLOCK;
    }
    for (j, &a) in xc.remainder().iter().enumerate() {
        let ab = abs_bits(a);
        if STATS {
            lanes[0] += f64::from(f32::from_bits(ab as u32));
            mx = mx.max(ab);
        }
        if ab >= t {
            emit(a, ab, off + j, cap, cand, &mut out);
        }
    }
    out.lanes = lanes;
    out.max_bits = mx.max(mxv.iter().copied().max().unwrap_or(0));
    out
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    #[target_feature(enable = "avx2")]
    pub(super) fn fused<const STATS: bool>(
        r: &mut [f32],
        g: &[f32],
        base: usize,
        t: i32,
        cap: usize,
        cand: &mut Cand,
    ) -> PassOut {
        fused_body::<STATS>(r, g, base, t, cap, cand)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn scan<const STATS: bool>(
        x: &[f32],
        base: usize,
        t: i32,
        cap: usize,
        cand: &mut Cand,
    ) -> PassOut {
        scan_body::<STATS>(x, base, t, cap, cand)
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Fused pass (see [`fused_body`]), dispatched to an AVX2 build when the CPU has it.
pub(crate) fn fused_pass<const STATS: bool>(
    r: &mut [f32],
    g: &[f32],
    base: usize,
    t: i32,
    cap: usize,
    cand: &mut Cand,
) -> PassOut {
    let t = t.min(INF_BITS);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time just above).
        return unsafe { avx2::fused::<STATS>(r, g, base, t, cap, cand) };
    }
    fused_body::<STATS>(r, g, base, t, cap, cand)
}

/// Read-only filter pass over `x`, dispatched like [`fused_pass`].
pub(crate) fn scan_pass<const STATS: bool>(
    x: &[f32],
    base: usize,
    t: i32,
    cap: usize,
    cand: &mut Cand,
) -> PassOut {
    let t = t.min(INF_BITS);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time just above).
        return unsafe { avx2::scan::<STATS>(x, base, t, cap, cand) };
    }
    scan_body::<STATS>(x, base, t, cap, cand)
}

/// Sample layout: runs of `RUN` contiguous elements at a regular stride, so a sample
/// touches few cache lines per element read.
const RUN: usize = 16;

/// Expected number of sample elements above the k-th value; sets the sampling rate.
const SAMPLE_HITS: usize = 256;

/// Number of sample elements to read for a top-`k` estimate over `d` (about
/// [`SAMPLE_HITS`] expected above the k-th value, at most an eighth of the input), or
/// `None` when the input is too small for sampling to pay: then filter with threshold 0.
pub(crate) fn sample_size(d: usize, k: usize) -> Option<usize> {
    if d < 1 << 12 || k == 0 {
        return None;
    }
    let want = SAMPLE_HITS.saturating_mul(d) / k;
    Some(want.max(RUN * 64).min(d / 8) / RUN * RUN)
}

/// Positions of the sample runs: `runs` starts at a regular stride over `d`.
fn run_starts(d: usize, n: usize) -> impl Iterator<Item = usize> {
    let runs = (n / RUN).max(1);
    let stride = (d / runs).max(RUN);
    (0..runs)
        .map(move |b| b * stride)
        .filter(move |&s| s + RUN <= d)
}

/// Magnitude bits of `r[i] + g[i]` at the sample positions (nothing is written).
pub(crate) fn sample_acc(r: &[f32], g: &[f32], n: usize, out: &mut Vec<i32>) {
    out.clear();
    let d = r.len().min(g.len());
    for s in run_starts(d, n) {
        for (a, b) in r[s..s + RUN].iter().zip(&g[s..s + RUN]) {
            out.push(abs_bits(*a + *b));
        }
    }
}

/// Magnitude bits of `x[i]` at the sample positions.
pub(crate) fn sample_x(x: &[f32], n: usize, out: &mut Vec<i32>) {
    out.clear();
    for s in run_starts(x.len(), n) {
        out.extend(x[s..s + RUN].iter().map(|v| abs_bits(*v)));
    }
}

/// A threshold that, with high probability, keeps at least `k` of `d` elements while
/// keeping few more: the sample's order statistic `k·n/d + z·sqrt(k·n/d) + 1` from the top.
pub(crate) fn threshold_from_sample(sample: &mut [i32], d: usize, k: usize, z: f64) -> i32 {
    let n = sample.len();
    if n == 0 || d == 0 {
        return 0;
    }
    let hits = k as f64 * n as f64 / d as f64;
    let m = (hits + z * hits.sqrt() + 1.0).ceil() as usize;
    if m >= n {
        return 0;
    }
    // m-th largest = position n - m in ascending order.
    let pos = n - m;
    let (_, v, _) = sample.select_nth_unstable(pos);
    (*v).min(INF_BITS)
}

/// The exactly `k` best candidates (by [`key`]), kept in index order. Requires
/// `k <= cand.len()`.
pub(crate) fn select_k_of(cand: &Cand, k: usize, scratch: &mut Vec<u64>) -> (Vec<u32>, Vec<f32>) {
    let n = cand.len();
    if k >= n {
        return (cand.idx.clone(), cand.val.clone());
    }
    if k == 0 {
        return (Vec::new(), Vec::new());
    }
    scratch.clear();
    scratch.extend(
        cand.idx
            .iter()
            .zip(&cand.val)
            .map(|(&i, &v)| key(abs_bits(v), i)),
    );
    let (_, kth, _) = scratch.select_nth_unstable(n - k);
    let kth = *kth;
    let mut idx = Vec::with_capacity(k);
    let mut val = Vec::with_capacity(k);
    for (&i, &v) in cand.idx.iter().zip(&cand.val) {
        if key(abs_bits(v), i) >= kth {
            idx.push(i);
            val.push(v);
        }
    }
    (idx, val)
}

/// Exact top-`k` of an already accumulated vector `x` (read only), using a sampled
/// threshold with fallbacks. Returns (indices, values, threshold bits used).
pub(crate) fn exact_readonly(
    x: &[f32],
    k: usize,
    cand: &mut Cand,
    sample: &mut Vec<i32>,
    scratch: &mut Vec<u64>,
) -> Result<(Vec<u32>, Vec<f32>)> {
    let d = x.len();
    let k = k.min(d);
    // Attempt 1: sampled threshold with a wide margin; attempt 2: threshold 0 (all).
    let mut attempts: Vec<(i32, usize)> = Vec::with_capacity(2);
    if k > 0 {
        if let Some(n) = sample_size(d, k) {
            sample_x(x, n, sample);
            let t = threshold_from_sample(sample, d, k, 6.0);
            if t > 0 {
                attempts.push((t, k.saturating_mul(4).max(k + 4096)));
            }
        }
    }
    attempts.push((if k == 0 { INF_BITS } else { 0 }, usize::MAX));
    for (t, cap) in attempts {
        cand.clear();
        let out = scan_pass::<false>(x, 0, t, cap, cand);
        out.check()?;
        if out.overflow || cand.len() < k {
            continue;
        }
        return Ok(select_k_of(cand, k, scratch));
    }
    // Threshold 0 keeps every element, so the last attempt always returns.
    Err(Error::InvalidArgument(
        "exact selection failed to converge".into(),
    ))
}

/// Sum of `|x|` in exactly the order the stats passes use: blocks of 16 from index 0, each
/// summed in f32 by [`tree16`] and added in f64, then the tail element by element.
/// Returned as lanes for [`combine_lanes`] (everything is in lane 0).
pub(crate) fn abs_lanes(x: &[f32]) -> [f64; 8] {
    let mut l = [0.0f64; 8];
    let mut ch = x.chunks_exact(BLOCK);
    for c in &mut ch {
        let mut v = [0.0f32; BLOCK];
        for j in 0..BLOCK {
            v[j] = c[j].abs();
        }
        l[0] += f64::from(tree16(&v));
    }
    for v in ch.remainder() {
        l[0] += f64::from(v.abs());
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_match_fused_pass() {
        let g: Vec<f32> = (0..1003)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
            .collect();
        let mut r = vec![0.25f32; g.len()];
        let mut c = Cand::default();
        let out = fused_pass::<true>(&mut r, &g, 0, INF_BITS, usize::MAX, &mut c);
        assert_eq!(out.lanes, abs_lanes(&r));
        let mx = r.iter().map(|v| abs_bits(*v)).max().unwrap();
        assert_eq!(out.max_bits, mx);
        let out2 = scan_pass::<true>(&r, 0, INF_BITS, usize::MAX, &mut c);
        assert_eq!(out2.lanes, out.lanes);
    }

    #[test]
    fn non_finite_is_found_first_in_index_order() {
        let mut x = vec![1.0f32; 100];
        x[70] = f32::NAN;
        x[40] = f32::NEG_INFINITY;
        let mut c = Cand::default();
        let out = scan_pass::<false>(&x, 0, 0x7fff_ffff, 1, &mut c);
        assert_eq!(out.non_finite.map(|p| p.0), Some(40));
    }
}
