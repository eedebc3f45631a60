//! Order statistics of magnitude bits: the `m`-th largest of a list, the step every
//! selector takes on its sample (to set a threshold) and on its candidates (to cut exactly
//! `k`).
//!
//! `select_nth_unstable` (introselect) spends most of its time on mispredicted branches:
//! 1.2 µs per thousand elements here. With AVX-512 or AVX2 this instead keeps, in each
//! round, only the elements between two pivots read off a small sorted sample around the
//! wanted rank, compacted without a branch (16 at a time by `vpcompressd`, or 8 at a time
//! by a permutation looked up from their mask), so the list shrinks several times over per
//! round: about three times faster from a thousand elements up with AVX-512 (measured on
//! the candidates of a fused pass; see `docs/results/topk.md`).

use crate::kernel::{isa, Isa};
use std::cell::RefCell;

/// Lists of at most this many elements are finished with `select_nth_unstable`, or bit by
/// bit with AVX-512 (`avx512::kth_by_bits`).
const SMALL: usize = 64;

/// With AVX-512, the sampled rounds of lists longer than [`HISTOGRAM_MAX`] are finished
/// with `select_nth_unstable` once a list is this short: each round's sample, sort and
/// pivots cost more than they save on a list this short. On an AVX-512 Zen 4, exact top-k
/// at 2^14, ρ = 0.01 (about 230 candidates; fresh gradients, builds alternating over 8
/// launches, median ratio to `stream`): 3.09× with rounds down to [`SMALL`], 2.57× with
/// this as the limit below which a list skipped the rounds (MSTopK 3.48× → 3.22×).
const AVX512_SMALL: usize = 320;

/// Most elements [`kth_largest_near`] selects among bit by bit (`avx512::kth_by_bits`) once
/// they are in the guessed range.
const BITS_MAX: usize = 512;

/// Lists of at most this many elements are selected among by one histogram round with
/// AVX2 ([`avx2::kth_by_histogram`]) instead of the sampled rounds, on every CPU with AVX2
/// (AVX-512 ones included). A fused pass at 2^14–2^16 elements, ρ = 0.01, leaves a few
/// hundred candidates; on the AVX2 EPYC VM the 164th largest of 213 magnitudes took 300 ns
/// against 540 ns by rounds, of 800 about 1.1 µs against 1.2–1.5 µs, and of 3000, 3.5 µs
/// against 3.1 µs. On an AVX-512 Intel Xeon (2 cores), where lists up to 320 had gone to
/// `select_nth_unstable` and longer ones to the AVX-512 rounds, exact top-k with error
/// feedback at ρ = 0.01 (fresh gradients, median ratio to `stream`, 3 launches each):
/// 1.88–1.93× → 1.78–1.81× at 2^14, 1.95–1.98× → 1.86–1.89× at 2^16; level at ρ = 0.001.
const HISTOGRAM_MAX: usize = 1024;

/// The `m`-th largest element of `v` (`1 <= m <= v.len()`, duplicates counted, so the same
/// value as `v.select_nth_unstable(v.len() - m)`). Leaves `v` in an unspecified order and
/// possibly overwritten with other elements of `v`.
///
/// # Panics
/// If `m` is 0 or above `v.len()`.
pub(crate) fn kth_largest(v: &mut [i32], m: usize) -> i32 {
    assert!(
        (1..=v.len()).contains(&m),
        "rank {m} of {} elements",
        v.len()
    );
    #[cfg(target_arch = "x86_64")]
    if v.len() > SMALL && isa() != Isa::Base {
        if v.len() <= HISTOGRAM_MAX {
            return SPARE.with(|spare| {
                let mut spare = spare.borrow_mut();
                if spare.len() < v.len() {
                    spare.resize(v.len(), 0);
                }
                // SAFETY: the CPU has AVX2 (checked just above); `spare` holds `v.len()`
                // and is not `v`.
                unsafe { avx2::kth_by_histogram(v, m, spare.as_mut_ptr()) }
            });
        }
        if isa() == Isa::Avx512 {
            // SAFETY: the CPU has AVX-512F/BW (checked just above).
            return unsafe { avx512::kth_largest(v, m) };
        }
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2::kth_largest(v, m) };
    }
    // Short lists with AVX-512: bit by bit, where `select_nth_unstable` mispredicts. Exact
    // top-k with error feedback at 2^14, ρ = 0.001 (about 30 candidates; fresh gradients,
    // median ratio to `stream`, three launches each): 1.96–1.99× → 1.84–1.87×; MSTopK
    // 2.17× → 2.04–2.06×.
    if v.len() > 1 {
        let (lo, hi) = v
            .iter()
            .fold((i32::MAX, i32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        if let Some(kth) = by_bits(v, m, (lo, hi)) {
            return kth;
        }
    }
    by_introselect(v, m)
}

/// The `m`-th largest of `v`, all of whose elements lie in `lo..=hi`, bit by bit
/// (`avx512::kth_by_bits`); `None` without AVX-512 or for a span of `2^30` or more.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn by_bits(v: &[i32], m: usize, (lo, hi): (i32, i32)) -> Option<i32> {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && (hi.wrapping_sub(lo) as u32) < 1 << 30 {
        // SAFETY: the CPU has AVX-512 (checked just above); the caller keeps every element
        // in `lo..=hi`.
        return Some(unsafe { avx512::kth_by_bits(v, m, (lo, hi)) });
    }
    None
}

/// [`kth_largest`] given a guess `lo..=hi` of where the `m`-th largest lies (a selector's
/// last k-th magnitude and how far it moves between calls): one compaction round counts
/// the elements above `hi` and keeps those in the range, and when the rank falls among the
/// kept, only they are selected among. A wrong guess costs that round, never a wrong
/// answer: the whole list is selected among as without one.
///
/// With AVX-512, up to [`BITS_MAX`] kept elements are selected among bit by bit
/// (`avx512::kth_by_bits`), without a branch on the data.
///
/// Why: the one-round histogram of [`kth_largest`] spends about 1.3 cycles per element on
/// its scalar counts (timed inside it on the 2-core AVX-512 Xeon: 320 of 540 cycles for
/// the 164th of 229 magnitudes), the compaction about a tenth of that, so a range that
/// holds a third of the list or less selects faster. Timed alone there on fresh lists
/// (a guess ±150 000 bits around the answer, a test that was not kept): 519 against 870
/// cycles for 229 magnitudes, 1085 against 2541 for 800. Exact top-k with error feedback
/// at ρ = 0.01 (fresh gradients, median ratio to `stream` over six launches, before the
/// bit-by-bit selection): 2.00× → 1.96× at 2^14, 1.83× → 1.79× at 2^16.
///
/// # Panics
/// If `m` is 0 or above `v.len()`.
pub(crate) fn kth_largest_near(v: &mut [i32], m: usize, (lo, hi): (i32, i32)) -> i32 {
    assert!(
        (1..=v.len()).contains(&m),
        "rank {m} of {} elements",
        v.len()
    );
    #[cfg(target_arch = "x86_64")]
    if v.len() > SMALL && lo <= hi && isa() != Isa::Base {
        let n = v.len();
        let wide = isa() == Isa::Avx512;
        let inside = SPARE.with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < n {
                spare.resize(n, 0);
            }
            let (src, dst) = (v.as_ptr(), spare.as_mut_ptr());
            // SAFETY: the CPU has the features of the round called (checked above); `src`
            // holds `n`, `dst` has room for `n`, and they do not overlap.
            let (above, kept) = unsafe {
                if wide {
                    avx512::round(src, n, dst, lo, hi)
                } else {
                    avx2::round(src, n, dst, lo, hi)
                }
            };
            if !(above < m && m <= above + kept) {
                return Guess::Missed;
            }
            if kept <= BITS_MAX {
                // The kept elements lie in `lo..=hi`.
                if let Some(kth) = by_bits(&spare[..kept], m - above, (lo, hi)) {
                    return Guess::Found(kth);
                }
            }
            v[..kept].copy_from_slice(&spare[..kept]);
            Guess::Among(kept, m - above)
        });
        match inside {
            Guess::Found(kth) => return kth,
            Guess::Among(kept, rank) => return kth_largest(&mut v[..kept], rank),
            Guess::Missed => {}
        }
    }
    kth_largest(v, m)
}

/// How the guess of [`kth_largest_near`] went.
#[cfg(target_arch = "x86_64")]
enum Guess {
    /// The rank lay in the range, and this is the element.
    Found(i32),
    /// The rank lay in the range: the first `.0` elements of the list are those in it,
    /// and the element is the `.1`-th largest of them.
    Among(usize, usize),
    /// The rank lay outside the range.
    Missed,
}

/// The reference (and the path without AVX-512): `select_nth_unstable`.
fn by_introselect(v: &mut [i32], m: usize) -> i32 {
    let n = v.len();
    *v.select_nth_unstable(n - m).1
}

/// Two pivots `(lo, hi)` around the `m`-th largest of `n` elements, read off the sorted
/// `sample` of them: the sample ranks `2` standard deviations either side of where the
/// wanted rank falls in it (`i32::MIN` / `i32::MAX` past its ends). A wrong guess costs
/// one more round, never a wrong answer.
fn pivots(sample: &[i32], n: usize, m: usize) -> (i32, i32) {
    let s = sample.len() as f64;
    let p = m as f64 / n as f64;
    let at = p * s;
    let spread = 2.0 * (s * p * (1.0 - p)).sqrt() + 1.0;
    // Ranks from the top, 1-based.
    let (upper, lower) = ((at - spread).floor(), (at + spread).ceil());
    let hi = if upper < 1.0 {
        i32::MAX
    } else {
        sample[sample.len() - upper as usize]
    };
    let lo = if lower > s {
        i32::MIN
    } else {
        sample[sample.len() - lower as usize]
    };
    (lo, hi)
}

/// Keeps at the front of `v`, in any order, its elements `>= t` (`at_or_above`) or those
/// `< t`; returns how many. The rest of `v` is left unspecified. A selector's search
/// narrows its live candidates this way once per round.
pub(crate) fn retain(v: &mut [i32], t: i32, at_or_above: bool) -> usize {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 {
        // SAFETY: the CPU has AVX-512F (checked just above).
        return unsafe { avx512::retain(v, t, at_or_above) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa() != Isa::Base {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2::retain(v, t, at_or_above) };
    }
    retain_from(v, 0, 0, t, at_or_above)
}

/// [`retain`] from position `from` on, `kept` elements already kept at the front (`kept
/// <= from`): the portable loop, and the SIMD builds' tail.
fn retain_from(v: &mut [i32], from: usize, mut kept: usize, t: i32, at_or_above: bool) -> usize {
    for j in from..v.len() {
        let x = v[j];
        v[kept] = x;
        kept += usize::from((x >= t) == at_or_above);
    }
    kept
}

/// The last elements of a compaction round (see the AVX-512 `round`), `i..n`, one by one
/// and without a branch, continuing its counts (above `hi`, kept in `lo..=hi`).
///
/// # Safety
/// `src` valid for `n` reads, `dst` for `n` writes, not overlapping; `kept <= i`.
unsafe fn round_rest(
    src: *const i32,
    (mut i, n): (usize, usize),
    dst: *mut i32,
    (lo, hi): (i32, i32),
    (mut above, mut kept): (usize, usize),
) -> (usize, usize) {
    while i < n {
        // SAFETY: `i < n` and `kept <= i`.
        unsafe {
            let x = *src.add(i);
            above += usize::from(x > hi);
            *dst.add(kept) = x;
            kept += usize::from(x >= lo && x <= hi);
        }
        i += 1;
    }
    (above, kept)
}

thread_local! {
    /// The other buffer of the rounds (each reads one and writes the other, so a round
    /// whose pivots missed can be rerun on intact data). Grows to the largest list seen.
    static SPARE: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// One round: counts the elements of `src[..n]` above `hi`, and writes those in
    /// `lo..=hi` to the front of `dst`. Returns (count above, count written).
    ///
    /// # Safety
    /// AVX-512F/BW; `src` valid for `n` reads, `dst` for `n` writes, not overlapping.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn round(
        src: *const i32,
        n: usize,
        dst: *mut i32,
        lo: i32,
        hi: i32,
    ) -> (usize, usize) {
        let (vlo, vhi) = (_mm512_set1_epi32(lo), _mm512_set1_epi32(hi));
        let (mut above, mut kept) = (0usize, 0usize);
        let whole = n / 16 * 16;
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 16 <= n` reads; `kept <= i`, so the 16 stored at `kept` end at or
            // below `i + 16 <= n`.
            unsafe {
                let x = _mm512_loadu_si512(src.add(i).cast());
                let gt = _mm512_cmpgt_epi32_mask(x, vhi);
                let keep = _mm512_cmpge_epi32_mask(x, vlo) & !gt;
                above += gt.count_ones() as usize;
                _mm512_storeu_si512(dst.add(kept).cast(), _mm512_maskz_compress_epi32(keep, x));
                kept += keep.count_ones() as usize;
            }
            i += 16;
        }
        // SAFETY: as this function's contract, and `kept <= i`.
        unsafe { round_rest(src, (i, n), dst, (lo, hi), (above, kept)) }
    }

    /// The `m`-th largest of `v` (`1 <= m <= v.len()`), all of whose elements lie in
    /// `lo..=hi` with `hi - lo < 2^30`, two bits at a time from the top: the largest `t`
    /// with at least `m` elements at or above it is the answer, and each step counts, over
    /// the whole list in vectors, the elements at or above the three values the next two
    /// bits can give `t`. No branch depends on the data, where `select_nth_unstable`
    /// mispredicts about half of its comparisons on fresh inputs.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn kth_by_bits(v: &[i32], m: usize, (lo, hi): (i32, i32)) -> i32 {
        let n = v.len();
        let span = hi.wrapping_sub(lo) as u32;
        debug_assert!(span < 1 << 30 && (1..=n).contains(&m));
        let base = _mm512_set1_epi32(lo);
        let whole = n / 16 * 16;
        let tail = ((1u32 << (n - whole)) - 1) as u16;
        // An even number of bits that covers the span.
        let bits = (32 - span.leading_zeros()).next_multiple_of(2);
        let mut t = 0u32;
        for b in (0..bits).step_by(2).rev() {
            let c = [t | 1 << b, t | 2 << b, t | 3 << b];
            let vc = c.map(|c| _mm512_set1_epi32(c as i32));
            let mut counts = [0u32; 3];
            let mut add = |x: __m512i, lanes: u16| {
                let x = _mm512_sub_epi32(x, base);
                for (n, &vc) in counts.iter_mut().zip(&vc) {
                    *n += _mm512_mask_cmpge_epu32_mask(lanes, x, vc).count_ones();
                }
            };
            let mut i = 0;
            while i < whole {
                // SAFETY: `i + 16 <= n` reads.
                add(
                    unsafe { _mm512_loadu_si512(v.as_ptr().add(i).cast()) },
                    u16::MAX,
                );
                i += 16;
            }
            if tail != 0 {
                // SAFETY: the masked load reads only the `n - whole` elements left.
                add(
                    unsafe { _mm512_maskz_loadu_epi32(tail, v.as_ptr().add(whole)) },
                    tail,
                );
            }
            // The counts fall with the value, so the number of them that reach `m` is the
            // next two bits (the largest of the three values that keeps `m`, or none).
            // Added, not branched on: a branch here mispredicted on fresh inputs.
            let m = m as u32;
            let two = counts.iter().map(|&n| u32::from(n >= m)).sum::<u32>();
            t |= two << b;
        }
        lo.wrapping_add(t as i32)
    }

    /// [`super::retain`]: sixteen at a time, compacted in place (the store at the kept
    /// count never passes the block just read).
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn retain(v: &mut [i32], t: i32, at_or_above: bool) -> usize {
        let n = v.len();
        let whole = n / 16 * 16;
        let p = v.as_mut_ptr();
        let vt = _mm512_set1_epi32(t);
        let flip: u16 = if at_or_above { 0 } else { u16::MAX };
        let mut kept = 0usize;
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 16 <= n` reads; `kept <= i`, so the 16 stored end at or below
            // `i + 16`, within the block already loaded.
            unsafe {
                let x = _mm512_loadu_si512(p.add(i).cast());
                let keep = _mm512_cmpge_epi32_mask(x, vt) ^ flip;
                _mm512_storeu_si512(p.add(kept).cast(), _mm512_maskz_compress_epi32(keep, x));
                kept += keep.count_ones() as usize;
            }
            i += 16;
        }
        retain_from(v, whole, kept, t, at_or_above)
    }

    /// [`super::kth_largest`] by rounds of two-pivot compaction ([`by_rounds`]).
    ///
    /// # Safety
    /// AVX-512F/BW; `1 <= m <= v.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn kth_largest(v: &mut [i32], m: usize) -> i32 {
        // SAFETY: AVX-512 is enabled here; `by_rounds` passes valid, disjoint buffers.
        by_rounds(v, m, AVX512_SMALL, |src, n, dst, lo, hi| unsafe {
            round(src, n, dst, lo, hi)
        })
    }
}

/// [`kth_largest`] by rounds: each keeps only the elements between two pivots read off a
/// small sorted sample around the wanted rank, written by `round(src, n, dst, lo, hi)`
/// (which counts those above `hi` and writes those in `lo..=hi` to the front of `dst`),
/// alternating between `v` and a spare buffer, until at most `small` are left for
/// `select_nth_unstable`. `inline(always)`, so that each instruction set's caller inlines
/// its own `round`.
#[inline(always)]
fn by_rounds(
    v: &mut [i32],
    m: usize,
    small: usize,
    round: impl Fn(*const i32, usize, *mut i32, i32, i32) -> (usize, usize),
) -> i32 {
    SPARE.with(|spare| {
        let mut spare = spare.borrow_mut();
        let len = v.len();
        if spare.len() < len {
            spare.resize(len, 0);
        }
        // Both buffers hold `len`; every round keeps fewer than it reads.
        let bufs = [v.as_mut_ptr(), spare.as_mut_ptr()];
        let (mut live, mut n, mut m) = (0usize, len, m);
        loop {
            // SAFETY: `bufs[live]` holds `n` live elements.
            let src = unsafe { std::slice::from_raw_parts_mut(bufs[live], n) };
            if n <= small {
                return by_introselect(src, m);
            }
            let take = (2 * n.isqrt()).clamp(16, 256);
            let mut sample = [0i32; 256];
            let stride = n / take;
            for (j, s) in sample[..take].iter_mut().enumerate() {
                *s = src[j * stride + stride / 2];
            }
            let sample = &mut sample[..take];
            sample.sort_unstable();
            let (mut lo, mut hi) = pivots(sample, n, m);
            // `dst` is the other buffer, of `len >= n`.
            let dst = bufs[1 - live];
            let run = |lo, hi| round(src.as_ptr(), n, dst, lo, hi);
            let (mut above, mut kept) = run(lo, hi);
            if above >= m {
                // The rank lies above `hi`: keep everything above it.
                (lo, hi) = (hi + 1, i32::MAX);
                (above, kept) = run(lo, hi);
            } else if above + kept < m {
                // It lies below `lo`: keep everything below it.
                (lo, hi) = (i32::MIN, lo - 1);
                (above, kept) = run(lo, hi);
            }
            m -= above;
            if lo == hi {
                return lo;
            }
            if kept == n {
                // No progress (the pivots span everything, e.g. few distinct values).
                // SAFETY: `dst` holds the `kept` elements just written.
                let rest = unsafe { std::slice::from_raw_parts_mut(dst, kept) };
                return by_introselect(rest, m);
            }
            n = kept;
            live = 1 - live;
        }
    })
}

/// The AVX2 builds of the rounds: AVX2 has no compress instruction, so eight lanes are
/// packed by one permutation looked up from their mask ([`PACK`]).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// For each 8-bit mask, the lanes it sets in increasing order, 3 bits each.
    const fn pack_table() -> [u32; 256] {
        let mut t = [0u32; 256];
        let mut m = 0;
        while m < 256 {
            let (mut j, mut n, mut e) = (0, 0, 0u32);
            while j < 8 {
                if (m >> j) & 1 == 1 {
                    e |= (j as u32) << (3 * n);
                    n += 1;
                }
                j += 1;
            }
            t[m] = e;
            m += 1;
        }
        t
    }

    /// [`pack_table`], built at compile time.
    static PACK: [u32; 256] = pack_table();

    /// The lanes of `x` set in `mask` (8 bits), moved to the front in order (the other
    /// lanes follow in some order).
    ///
    /// # Safety
    /// AVX2, enabled by the caller (this is inlined into it).
    #[inline(always)]
    pub(crate) unsafe fn pack(x: __m256i, mask: u32) -> __m256i {
        // SAFETY: register-only AVX2, enabled by the callers; `mask < 256`.
        unsafe {
            let e = _mm256_set1_epi32(*PACK.get_unchecked(mask as usize) as i32);
            let shifts = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
            let idx = _mm256_and_si256(_mm256_srlv_epi32(e, shifts), _mm256_set1_epi32(7));
            _mm256_permutevar8x32_epi32(x, idx)
        }
    }

    /// The lanes of `a > b`, as an 8-bit mask.
    ///
    /// # Safety
    /// AVX2, enabled by the caller (this is inlined into it).
    #[inline(always)]
    pub(crate) unsafe fn gt_mask(a: __m256i, b: __m256i) -> u32 {
        // SAFETY: register-only AVX2, enabled by the callers.
        unsafe { _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b))) as u32 }
    }

    /// The AVX2 `round` of [`by_rounds`] (see the AVX-512 one), eight at a time.
    ///
    /// # Safety
    /// AVX2; `src` valid for `n` reads, `dst` for `n` writes, not overlapping.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn round(
        src: *const i32,
        n: usize,
        dst: *mut i32,
        lo: i32,
        hi: i32,
    ) -> (usize, usize) {
        let (vlo, vhi) = (_mm256_set1_epi32(lo), _mm256_set1_epi32(hi));
        let (mut above, mut kept) = (0usize, 0usize);
        let whole = n / 8 * 8;
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 8 <= n` reads; `kept <= i`, so the 8 stored at `kept` end at or
            // below `i + 8 <= n`.
            unsafe {
                let x = _mm256_loadu_si256(src.add(i).cast());
                let gt = gt_mask(x, vhi);
                let keep = !(gt | gt_mask(vlo, x)) & 0xff;
                above += gt.count_ones() as usize;
                _mm256_storeu_si256(dst.add(kept).cast(), pack(x, keep));
                kept += keep.count_ones() as usize;
            }
            i += 8;
        }
        // SAFETY: as this function's contract, and `kept <= i`.
        unsafe { round_rest(src, (i, n), dst, (lo, hi), (above, kept)) }
    }

    /// [`super::retain`], eight at a time, compacted in place (the store at the kept
    /// count never passes the block just read).
    ///
    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn retain(v: &mut [i32], t: i32, at_or_above: bool) -> usize {
        let n = v.len();
        let whole = n / 8 * 8;
        let p = v.as_mut_ptr();
        let vt = _mm256_set1_epi32(t);
        // `x >= t` is `!(t > x)`.
        let flip: u32 = if at_or_above { 0xff } else { 0 };
        let mut kept = 0usize;
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 8 <= n` reads; `kept <= i`, so the 8 stored end at or below
            // `i + 8`, within the block already loaded.
            unsafe {
                let x = _mm256_loadu_si256(p.add(i).cast());
                let keep = gt_mask(vt, x) ^ flip;
                _mm256_storeu_si256(p.add(kept).cast(), pack(x, keep));
                kept += keep.count_ones() as usize;
            }
            i += 8;
        }
        retain_from(v, whole, kept, t, at_or_above)
    }

    /// [`super::kth_largest`] of a short list by one histogram round: the span of `v`
    /// in 64 buckets (counted in two interleaved histograms, so that runs of one bucket
    /// do not chain their increments), the one that holds the rank found from the top, and
    /// its members compacted by [`round`] into `dst` and selected among.
    ///
    /// # Safety
    /// AVX2; `1 <= m <= v.len()`, `dst` valid for `v.len()` writes and not overlapping `v`.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn kth_by_histogram(v: &[i32], m: usize, dst: *mut i32) -> i32 {
        let n = v.len();
        let (mut lo, mut hi) = (_mm256_set1_epi32(i32::MAX), _mm256_set1_epi32(i32::MIN));
        let mut blocks = v.chunks_exact(8);
        for b in &mut blocks {
            // SAFETY: `b` holds 8 elements.
            let x = unsafe { _mm256_loadu_si256(b.as_ptr().cast()) };
            lo = _mm256_min_epi32(lo, x);
            hi = _mm256_max_epi32(hi, x);
        }
        let (mut l, mut h) = ([0i32; 8], [0i32; 8]);
        // SAFETY: both arrays hold 8 lanes.
        unsafe {
            _mm256_storeu_si256(l.as_mut_ptr().cast(), lo);
            _mm256_storeu_si256(h.as_mut_ptr().cast(), hi);
        }
        let rest = blocks.remainder();
        let mn = l.iter().chain(rest).copied().min().unwrap_or(i32::MAX);
        let mx = h.iter().chain(rest).copied().max().unwrap_or(i32::MIN);
        if mn == mx {
            return mn;
        }
        let span = (i64::from(mx) - i64::from(mn)) as u64;
        let shift = (64 - span.leading_zeros()).saturating_sub(6);
        // Below 64 for every element: `(x - mn) >> shift <= span >> shift < 64`.
        let bucket = |x: i32| ((i64::from(x) - i64::from(mn)) as u64 >> shift) as usize & 63;
        let mut hist = [[0u32; 64]; 2];
        let mut pairs = v.chunks_exact(2);
        for p in &mut pairs {
            hist[0][bucket(p[0])] += 1;
            hist[1][bucket(p[1])] += 1;
        }
        for &x in pairs.remainder() {
            hist[0][bucket(x)] += 1;
        }
        // The bucket that holds the rank, and the count above it, counted from the end
        // nearer to the rank: the candidates of a fused pass crowd the lowest buckets and
        // their k-th magnitude lies among them, which the count from the top reached
        // only after most of the 64 (a serial chain of adds that ended in a mispredicted
        // branch).
        let count = |b: usize| (hist[0][b] + hist[1][b]) as usize;
        let (b, above) = if 2 * m <= n {
            // From the top: where the count first reaches `m` (bucket 0 at the latest:
            // all `n >= m` elements are counted by then).
            let (mut b, mut above) = (63usize, 0usize);
            while b > 0 && above + count(b) < m {
                above += count(b);
                b -= 1;
            }
            (b, above)
        } else {
            // From the bottom: where the count first reaches rank `n - m + 1` from below
            // (bucket 63 at the latest).
            let (mut b, mut below) = (0usize, 0usize);
            while b < 63 && below + count(b) < n - m + 1 {
                below += count(b);
                b += 1;
            }
            (b, n - below - count(b))
        };
        let blo = (i64::from(mn) + ((b as i64) << shift)) as i32;
        let bhi = (i64::from(mn) + ((b as i64 + 1) << shift) - 1).min(i64::from(mx)) as i32;
        // SAFETY: `dst` has room for `n` and does not overlap `v`.
        let (_, kept) = unsafe { round(v.as_ptr(), n, dst, blo, bhi) };
        // SAFETY: `round` wrote `kept` elements at `dst`.
        let members = unsafe { std::slice::from_raw_parts_mut(dst, kept) };
        by_introselect(members, m - above)
    }

    /// [`super::kth_largest`] by rounds of two-pivot compaction ([`by_rounds`]).
    ///
    /// # Safety
    /// AVX2; `1 <= m <= v.len()`.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn kth_largest(v: &mut [i32], m: usize) -> i32 {
        // SAFETY: AVX2 is enabled here; `by_rounds` passes valid, disjoint buffers.
        by_rounds(v, m, SMALL, |src, n, dst, lo, hi| unsafe {
            round(src, n, dst, lo, hi)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(v: &[i32], m: usize) -> i32 {
        let mut s = v.to_vec();
        s.sort_unstable_by(|a, b| b.cmp(a));
        s[m - 1]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Any list and rank, with few distinct values (ties) or many.
        #[test]
        fn matches_sorting(
            v in prop::collection::vec(any::<i32>(), 1..3000),
            distinct in prop::sample::select(vec![3i32, 97, i32::MAX]),
            pick in any::<prop::sample::Index>(),
        ) {
            let v: Vec<i32> = v.iter().map(|x| x % distinct).collect();
            let m = pick.index(v.len()) + 1;
            prop_assert_eq!(kth_largest(&mut v.clone(), m), reference(&v, m));
        }

        /// Lists short enough to be selected among bit by bit (with AVX-512), their spans
        /// from one value to past 2^30 (which `select_nth_unstable` takes), negative values
        /// and ties included.
        #[test]
        fn short_lists_match_sorting(
            v in prop::collection::vec(any::<i32>(), 1..=SMALL),
            spread in prop::sample::select(vec![1i32, 5, 1 << 20, (1 << 30) - 1, i32::MAX]),
            offset in -1_000_000i32..1_000_000,
            pick in any::<prop::sample::Index>(),
        ) {
            let v: Vec<i32> = v.iter().map(|x| (x % spread).saturating_add(offset)).collect();
            let m = pick.index(v.len()) + 1;
            prop_assert_eq!(kth_largest(&mut v.clone(), m), reference(&v, m));
        }
    }

    /// The guessed range of [`kth_largest_near`] around the true value, off to either side,
    /// empty or inverted: the answer is the same as without a guess. Both outcomes of the
    /// guess (the rank inside the kept range, and outside it) occur for every list length.
    #[test]
    fn a_guess_right_or_wrong_gives_the_same_rank() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut next = move || rng.gen::<u64>();
        for n in [1usize, 64, 65, 200, 1024, 1025, 5000] {
            let (mut inside, mut outside) = (0, 0);
            for trial in 0..60 {
                // Ties in half the trials.
                let modulus = if trial % 2 == 0 { 50 } else { 1 << 30 };
                let v: Vec<i32> = (0..n).map(|_| (next() % modulus) as i32).collect();
                let m = (next() as usize % n) + 1;
                let want = reference(&v, m);
                let w = (next() % 40) as i32 - 8;
                let shift = (next() % 60) as i32 - 30;
                let (lo, hi) = if trial % 10 == 0 {
                    // A range too wide to select among bit by bit.
                    (want.saturating_sub(1 << 30), want.saturating_add(1 << 30))
                } else {
                    (want + shift - w, want + shift + w)
                };
                let got = kth_largest_near(&mut v.clone(), m, (lo, hi));
                assert_eq!(got, want, "n {n}, m {m}, range {lo}..={hi}");
                if n > SMALL && lo <= want && want <= hi {
                    inside += 1;
                } else if n > SMALL {
                    outside += 1;
                }
            }
            if n > SMALL {
                assert!(
                    inside > 5 && outside > 5,
                    "n {n}: {inside} inside, {outside} outside"
                );
            }
        }
    }

    /// Lists whose sampled positions hold only the largest (or only the smallest) values,
    /// so the pivots miss the rank and the round reruns above `hi` (or below `lo`).
    #[test]
    fn pivots_that_miss_are_recovered() {
        for n in [65usize, 1000, 4099, 70_000] {
            let take = (2 * n.isqrt()).clamp(16, 256);
            let stride = n / take;
            for sampled in [1_000_000, -1_000_000] {
                let v: Vec<i32> = (0..n)
                    .map(|i| {
                        if i % stride == stride / 2 {
                            sampled + i as i32
                        } else {
                            (i as i32 * 7919) % 10_007
                        }
                    })
                    .collect();
                for m in [1, 2, n / 3, n / 2, n - 1, n] {
                    assert_eq!(
                        kth_largest(&mut v.clone(), m),
                        reference(&v, m),
                        "n {n} m {m}"
                    );
                }
            }
        }
    }

    #[test]
    fn retain_keeps_exactly_one_side() {
        for n in [0usize, 5, 16, 33, 1000] {
            let v: Vec<i32> = (0..n as i32).map(|i| (i * 7919) % 101 - 50).collect();
            for t in [-51, -3, 0, 17, 51] {
                for side in [true, false] {
                    let mut w = v.clone();
                    let kept = retain(&mut w, t, side);
                    let mut got = w[..kept].to_vec();
                    let mut want: Vec<i32> =
                        v.iter().copied().filter(|&x| (x >= t) == side).collect();
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want, "n {n} t {t} side {side}");
                }
            }
        }
    }

    #[test]
    fn all_equal_and_extremes() {
        for n in [1, 64, 65, 1000] {
            let v = vec![5; n];
            assert_eq!(kth_largest(&mut v.clone(), n), 5);
            let v: Vec<i32> = (0..n)
                .map(|i| if i % 2 == 0 { i32::MIN } else { i32::MAX })
                .collect();
            for m in [1, n.div_ceil(2), n] {
                assert_eq!(
                    kth_largest(&mut v.clone(), m),
                    reference(&v, m),
                    "n {n} m {m}"
                );
            }
        }
    }
}
