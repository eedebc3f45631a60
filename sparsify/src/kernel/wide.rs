//! The fused and read-only passes written with vector intrinsics, once, for every
//! instruction set that has a [`Wide`] register type: AVX-512 (one `zmm` per 16-element
//! block) and AVX2 (two `ymm`), and AVX-512 again with VBMI2 (`avx512v`, whose dense
//! groups' indices come from one byte compression). Each block's hit test is a mask
//! compare; a group of four blocks shares one branch (or none, [`EmitForm`]), and its hits'
//! indices are written by a loop over the set bits of the group's 64-bit mask, so a
//! candidate costs no mispredicted branch of its own (which, for data in cache, cost more
//! than the pass itself at ρ = 0.01); their values are read after each batch of blocks. Non-finite
//! values (candidates at any threshold) are looked for among the candidates after the
//! loop, and located after it. Same candidates, order, cap handling, statistics (the `|x|`
//! sum in the order of [`abs_sum`]) and non-finite reporting as [`fused_body`] /
//! [`scan_body`]; blocks that would cross `cap` go through [`emit_block`].
//!
//! Why AVX2 too: the portable bodies, auto-vectorised for AVX2, test one 16-element block
//! per branch and call [`emit_block`] for every block with a hit; on an AVX2-only CPU
//! (AMD EPYC, 2 threads) that left the threshold selector at 1.57× the floor at 2^20,
//! ρ = 0.01 (`docs/results/topk.md`).
#![cfg(target_arch = "x86_64")]

use super::*;
use std::arch::x86_64::*;

/// Writes [`zeroed_from`]`(v, zero_from)` at `p + rel` (a zeroing pass's candidate).
///
/// # Safety
/// `p + rel` is valid for a write.
#[inline(always)]
unsafe fn zero_at_from(p: *mut f32, rel: usize, v: f32, zero_from: i32) {
    // SAFETY: as the caller ensures.
    unsafe { p.add(rel).write(zeroed_from(v, zero_from)) }
}

/// The first non-finite value of `x` (index from `base`, value); `x[0]` if none.
fn first_non_finite(x: &[f32], base: usize) -> (usize, f32) {
    let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
    (base + i, x[i])
}

/// Sixteen 32-bit lanes (one [`BLOCK`]) in the registers of one instruction set, read as
/// `f32` or as `i32` bits as each operation needs. Every method is `unsafe`: it may only
/// run inside a function with that instruction set enabled (where it is inlined).
pub(super) trait Wide: Copy {
    /// Sixteen values from `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// Stores the sixteen lanes at `p`.
    unsafe fn store(self, p: *mut f32);
    /// Lane-wise `f32` sum.
    unsafe fn add_f32(self, o: Self) -> Self;
    /// Lane-wise `f32` product.
    unsafe fn mul_f32(self, o: Self) -> Self;
    /// The magnitude bits ([`abs_bits`]) of each lane.
    unsafe fn abs(self) -> Self;
    /// The operand of [`Self::ge_mask`] that tests against threshold bits `t`.
    unsafe fn bound(t: i32) -> Self;
    /// Bit `j` set where lane `j` (magnitude bits, so never negative) is at least the
    /// threshold that `bound` ([`Self::bound`]) stands for.
    unsafe fn ge_mask(self, bound: Self) -> u16;
    /// [`Self::ge_mask`] of four blocks, block `j` in bits `16 j ..`.
    #[inline(always)]
    unsafe fn group_mask(b: &[Self; 4], bound: Self) -> u64 {
        // SAFETY: the caller's features, as for every method.
        unsafe {
            u64::from(b[0].ge_mask(bound))
                | u64::from(b[1].ge_mask(bound)) << 16
                | u64::from(b[2].ge_mask(bound)) << 32
                | u64::from(b[3].ge_mask(bound)) << 48
        }
    }
    /// Whether any lane of the four blocks passes ([`Self::group_mask`]` != 0`).
    #[inline(always)]
    unsafe fn any_ge(b: &[Self; 4], bound: Self) -> bool {
        // SAFETY: the caller's features, as for every method.
        unsafe { Self::group_mask(b, bound) != 0 }
    }
    /// `v` in every lane.
    unsafe fn splat_i32(v: i32) -> Self;
    /// All lanes zero.
    unsafe fn zero() -> Self;
    /// Lane-wise `i32` maximum.
    unsafe fn max_i32(self, o: Self) -> Self;
    /// [`tree16`] of the lanes as `f32`: halves, then quarters, then `(b0 + b2) + (b1 + b3)`.
    unsafe fn tree16(self) -> f32;
    /// The largest lane as `i32`.
    unsafe fn reduce_max_i32(self) -> i32;
    /// Writes the lanes set in `m` (indices `off + j`, values `a[j]`) packed at `pi` and
    /// `pv`, each with room for 16.
    unsafe fn compress(m: u16, a: Self, off: usize, pi: *mut u32, pv: *mut f32);
    /// Whether [`Self::compress`] is a few instructions without a branch (AVX-512's
    /// `vpcompressd`), so that the dense form ([`EmitForm::Dense`]) pays.
    const COMPRESSES: bool;
    /// Lane-wise `i32` maximum with `o` in the lanes set in `m`; the others keep `self`.
    unsafe fn max_i32_masked(self, m: u16, o: Self) -> Self;
    /// Writes zero to the lanes of the block at `p` set in `m`.
    unsafe fn zero_masked(p: *mut f32, m: u16);
    /// Stores `self` to `p` with the lanes of `m` zeroed: one store where
    /// [`Wide::store`] then [`Wide::zero_masked`] would make two.
    unsafe fn store_zeroing(self, p: *mut f32, m: u16);
}

/// An AVX-512 register.
#[derive(Clone, Copy)]
pub(super) struct Zmm(__m512);

impl Wide for Zmm {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller enabled AVX-512F and `p` has 16 readable values.
        Zmm(unsafe { _mm512_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: as in `load`, for 16 writable values.
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn add_f32(self, o: Self) -> Self {
        // SAFETY: register-only, AVX-512F enabled by the caller.
        Zmm(unsafe { _mm512_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    unsafe fn mul_f32(self, o: Self) -> Self {
        // SAFETY: register-only, AVX-512F enabled by the caller.
        Zmm(unsafe { _mm512_mul_ps(self.0, o.0) })
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        // SAFETY: as in `add_f32`.
        unsafe {
            let m = _mm512_set1_epi32(0x7fff_ffff);
            Zmm(_mm512_castsi512_ps(_mm512_and_si512(
                _mm512_castps_si512(self.0),
                m,
            )))
        }
    }
    #[inline(always)]
    unsafe fn bound(t: i32) -> Self {
        // SAFETY: as in `add_f32`.
        unsafe { Self::splat_i32(t) }
    }
    /// The four compare masks joined in the mask registers (`kunpckwd` twice, then
    /// `kunpckdq`), one move to a general register after: joined there, it took two more
    /// moves and four shifts and ORs per group. On the 2-core Zen 5 (timing program,
    /// three alternations, ratio to the floor; together with dropping `group`'s `& 63`,
    /// which alone gave about half of it): exact top-k at 2^16, ρ = 0.001 1.93–2.10× →
    /// 1.88–1.94×, ρ = 0.01 2.64–2.67× → 2.47–2.50×; the threshold selector 1.94–1.96× →
    /// 1.72–1.77× and 2.11–2.28× → 2.06–2.11×; at 2^14 exact 1.75–1.77× → 1.64–1.73×
    /// (ρ = 0.001) and 2.46–2.51× → 2.35–2.40× (ρ = 0.01). MSTopK level, except at 2^18,
    /// ρ = 0.001: 1.27–1.28× → 1.33–1.34×. Beyond the cache, level: the `topk` suite at
    /// 2^22 alone, ρ = 0.01, read exact 1.08–1.13× (old) / 1.20–1.23× (new) with the old
    /// build launched first in three pairs, and 1.10–1.12× / 1.08–1.18× with the new one
    /// first in three more: the launch's turn, not the build.
    #[inline(always)]
    unsafe fn group_mask(b: &[Self; 4], bound: Self) -> u64 {
        // SAFETY: AVX-512F/BW enabled by the caller.
        unsafe {
            let (m0, m1) = (b[0].ge_mask(bound), b[1].ge_mask(bound));
            let (m2, m3) = (b[2].ge_mask(bound), b[3].ge_mask(bound));
            let lo = _mm512_kunpackw(u32::from(m1), u32::from(m0));
            let hi = _mm512_kunpackw(u32::from(m3), u32::from(m2));
            _mm512_kunpackd(u64::from(hi), u64::from(lo))
        }
    }
    #[inline(always)]
    unsafe fn ge_mask(self, t: Self) -> u16 {
        // SAFETY: as in `add_f32`.
        unsafe { _mm512_cmpge_epi32_mask(_mm512_castps_si512(self.0), _mm512_castps_si512(t.0)) }
    }
    #[inline(always)]
    unsafe fn splat_i32(v: i32) -> Self {
        // SAFETY: as in `add_f32`.
        Zmm(unsafe { _mm512_castsi512_ps(_mm512_set1_epi32(v)) })
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: as in `add_f32`.
        Zmm(unsafe { _mm512_setzero_ps() })
    }
    #[inline(always)]
    unsafe fn max_i32(self, o: Self) -> Self {
        // SAFETY: as in `add_f32`.
        unsafe {
            let m = _mm512_max_epi32(_mm512_castps_si512(self.0), _mm512_castps_si512(o.0));
            Zmm(_mm512_castsi512_ps(m))
        }
    }
    #[inline(always)]
    unsafe fn tree16(self) -> f32 {
        // SAFETY: register-only AVX-512F/SSE operations, enabled by the caller.
        unsafe {
            let v = self.0;
            let a = _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            );
            tree8(a)
        }
    }
    #[inline(always)]
    unsafe fn reduce_max_i32(self) -> i32 {
        // SAFETY: as in `add_f32`.
        unsafe { _mm512_reduce_max_epi32(_mm512_castps_si512(self.0)) }
    }
    #[inline(always)]
    unsafe fn compress(m: u16, a: Self, off: usize, pi: *mut u32, pv: *mut f32) {
        // SAFETY: AVX-512F enabled by the caller; both lists have room for 16.
        unsafe {
            let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            let idx = _mm512_add_epi32(_mm512_set1_epi32(off as u32 as i32), lanes);
            _mm512_storeu_si512(pi.cast(), _mm512_maskz_compress_epi32(m, idx));
            _mm512_storeu_ps(pv, _mm512_maskz_compress_ps(m, a.0));
        }
    }
    const COMPRESSES: bool = true;
    #[inline(always)]
    unsafe fn max_i32_masked(self, m: u16, o: Self) -> Self {
        // SAFETY: as in `add_f32`.
        unsafe {
            let (a, b) = (_mm512_castps_si512(self.0), _mm512_castps_si512(o.0));
            Zmm(_mm512_castsi512_ps(_mm512_mask_max_epi32(a, m, a, b)))
        }
    }
    #[inline(always)]
    unsafe fn zero_masked(p: *mut f32, m: u16) {
        // SAFETY: AVX-512F enabled by the caller; `p` has 16 writable values.
        unsafe { _mm512_mask_storeu_ps(p, m, _mm512_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn store_zeroing(self, p: *mut f32, m: u16) {
        // SAFETY: AVX-512F enabled by the caller; `p` has 16 writable values.
        unsafe { _mm512_storeu_ps(p, _mm512_maskz_mov_ps(!m, self.0)) }
    }
}

/// The last steps of [`Wide::tree16`] on the sum of the two halves: quarters, then
/// `(b0 + b2) + (b1 + b3)`.
#[inline(always)]
unsafe fn tree8(a: __m256) -> f32 {
    // SAFETY: register-only AVX/SSE operations, enabled by the callers.
    unsafe {
        let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
        _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps::<1>(c, c)))
    }
}

/// Two AVX2 registers: lanes 0–7 and 8–15.
#[derive(Clone, Copy)]
pub(super) struct Ymm2([__m256; 2]);

impl Ymm2 {
    /// Both halves as `i32`.
    #[inline(always)]
    unsafe fn ints(self) -> [__m256i; 2] {
        // SAFETY: register-only casts, AVX enabled by the caller.
        unsafe {
            [
                _mm256_castps_si256(self.0[0]),
                _mm256_castps_si256(self.0[1]),
            ]
        }
    }
    #[inline(always)]
    unsafe fn of_ints(v: [__m256i; 2]) -> Self {
        // SAFETY: as in `ints`.
        Ymm2(unsafe { [_mm256_castsi256_ps(v[0]), _mm256_castsi256_ps(v[1])] })
    }
}

impl Wide for Ymm2 {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller enabled AVX2 and `p` has 16 readable values.
        unsafe { Ymm2([_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: as in `load`, for 16 writable values.
        unsafe {
            _mm256_storeu_ps(p, self.0[0]);
            _mm256_storeu_ps(p.add(8), self.0[1]);
        }
    }
    #[inline(always)]
    unsafe fn add_f32(self, o: Self) -> Self {
        // SAFETY: register-only, AVX2 enabled by the caller.
        unsafe {
            Ymm2([
                _mm256_add_ps(self.0[0], o.0[0]),
                _mm256_add_ps(self.0[1], o.0[1]),
            ])
        }
    }
    #[inline(always)]
    unsafe fn mul_f32(self, o: Self) -> Self {
        // SAFETY: register-only, AVX2 enabled by the caller.
        unsafe {
            Ymm2([
                _mm256_mul_ps(self.0[0], o.0[0]),
                _mm256_mul_ps(self.0[1], o.0[1]),
            ])
        }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        // SAFETY: as in `add_f32`.
        unsafe {
            let m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
            Ymm2([_mm256_and_ps(self.0[0], m), _mm256_and_ps(self.0[1], m)])
        }
    }
    /// `max(t, 0) - 1` in every lane: magnitude bits are never negative, so `x >= t` is
    /// `x > max(t, 0) - 1`, one signed compare that cannot overflow (AVX2 has no `>=`,
    /// and `!(t > x)` cost LLVM two instructions per compare).
    #[inline(always)]
    unsafe fn bound(t: i32) -> Self {
        // SAFETY: as in `add_f32`.
        unsafe { Self::splat_i32(t.max(0) - 1) }
    }
    #[inline(always)]
    unsafe fn ge_mask(self, bound: Self) -> u16 {
        // SAFETY: as in `add_f32`.
        unsafe {
            let (x, b) = (self.ints(), bound.ints());
            let lo = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(x[0], b[0])));
            let hi = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(x[1], b[1])));
            (lo as u16) | ((hi as u16) << 8)
        }
    }
    /// One compare of the lanes' maximum: a third of [`Self::group_mask`]'s instructions,
    /// for the branchy form's test of a group that mostly holds no hit.
    #[inline(always)]
    unsafe fn any_ge(b: &[Self; 4], bound: Self) -> bool {
        // SAFETY: as in `add_f32`.
        unsafe {
            let [b0, b1, b2, b3] = [b[0].ints(), b[1].ints(), b[2].ints(), b[3].ints()];
            let m01 = _mm256_max_epi32(
                _mm256_max_epi32(b0[0], b0[1]),
                _mm256_max_epi32(b1[0], b1[1]),
            );
            let m23 = _mm256_max_epi32(
                _mm256_max_epi32(b2[0], b2[1]),
                _mm256_max_epi32(b3[0], b3[1]),
            );
            let gt = _mm256_cmpgt_epi32(_mm256_max_epi32(m01, m23), bound.ints()[0]);
            _mm256_testz_si256(gt, gt) == 0
        }
    }
    /// The eight compares packed to bytes (two saturating packs, then one permutation that
    /// undoes their interleaving of the 128-bit halves), one byte mask per 32 lanes.
    #[inline(always)]
    unsafe fn group_mask(b: &[Self; 4], bound: Self) -> u64 {
        // SAFETY: as in `add_f32`.
        // No closures: they are not inlined into AVX2 code (each intrinsic became a call).
        unsafe {
            let t = bound.ints()[0];
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let [b0, b1, b2, b3] = [b[0].ints(), b[1].ints(), b[2].ints(), b[3].ints()];
            let p0 = _mm256_packs_epi32(_mm256_cmpgt_epi32(b0[0], t), _mm256_cmpgt_epi32(b0[1], t));
            let p1 = _mm256_packs_epi32(_mm256_cmpgt_epi32(b1[0], t), _mm256_cmpgt_epi32(b1[1], t));
            let p2 = _mm256_packs_epi32(_mm256_cmpgt_epi32(b2[0], t), _mm256_cmpgt_epi32(b2[1], t));
            let p3 = _mm256_packs_epi32(_mm256_cmpgt_epi32(b3[0], t), _mm256_cmpgt_epi32(b3[1], t));
            let lo = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p0, p1), order);
            let hi = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p2, p3), order);
            let lo = _mm256_movemask_epi8(lo) as u32;
            let hi = _mm256_movemask_epi8(hi) as u32;
            u64::from(lo) | u64::from(hi) << 32
        }
    }
    #[inline(always)]
    unsafe fn splat_i32(v: i32) -> Self {
        // SAFETY: as in `add_f32`.
        unsafe { Ymm2::of_ints([_mm256_set1_epi32(v); 2]) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: as in `add_f32`.
        unsafe { Ymm2([_mm256_setzero_ps(); 2]) }
    }
    #[inline(always)]
    unsafe fn max_i32(self, o: Self) -> Self {
        // SAFETY: as in `add_f32`.
        unsafe {
            let (a, b) = (self.ints(), o.ints());
            Ymm2::of_ints([_mm256_max_epi32(a[0], b[0]), _mm256_max_epi32(a[1], b[1])])
        }
    }
    #[inline(always)]
    unsafe fn tree16(self) -> f32 {
        // SAFETY: as in `add_f32`.
        unsafe { tree8(_mm256_add_ps(self.0[0], self.0[1])) }
    }
    #[inline(always)]
    unsafe fn reduce_max_i32(self) -> i32 {
        let mut l = [0i32; 16];
        // SAFETY: `l` has room for 16 lanes; AVX2 enabled by the caller.
        unsafe { self.store(l.as_mut_ptr().cast()) };
        l.into_iter().fold(i32::MIN, i32::max)
    }
    #[inline(always)]
    unsafe fn compress(m: u16, a: Self, off: usize, pi: *mut u32, pv: *mut f32) {
        let mut v = [0.0f32; 16];
        // SAFETY: `v` has room for 16; both lists have room for 16 and the loop writes
        // one entry per set bit of `m`.
        unsafe {
            a.store(v.as_mut_ptr());
            let (mut m, mut n) = (m, 0);
            while m != 0 {
                let j = m.trailing_zeros() as usize;
                pi.add(n).write((off + j) as u32);
                pv.add(n).write(v[j]);
                n += 1;
                m &= m - 1;
            }
        }
    }
    const COMPRESSES: bool = false;
    #[inline(always)]
    unsafe fn max_i32_masked(self, m: u16, o: Self) -> Self {
        let (mut a, mut b) = ([0i32; 16], [0i32; 16]);
        // SAFETY: both arrays have room for 16 lanes; AVX2 enabled by the caller.
        unsafe {
            self.store(a.as_mut_ptr().cast());
            o.store(b.as_mut_ptr().cast());
            for j in (0..16).filter(|j| m >> j & 1 == 1) {
                a[j] = a[j].max(b[j]);
            }
            Self::load(a.as_ptr().cast())
        }
    }
    #[inline(always)]
    unsafe fn zero_masked(p: *mut f32, m: u16) {
        for j in (0..16).filter(|j| m >> j & 1 == 1) {
            // SAFETY: the caller's block at `p` has 16 writable values.
            unsafe { p.add(j).write(0.0) };
        }
    }
    #[inline(always)]
    unsafe fn store_zeroing(self, p: *mut f32, m: u16) {
        // SAFETY: as in `zero_masked`.
        unsafe {
            self.store(p);
            Self::zero_masked(p, m);
        }
    }
}

/// The passes of one instruction set: module `$m`, its functions compiled with `$feat`
/// enabled, its blocks in registers of type `$w` ([`Wide`]).
macro_rules! wide_passes {
    ($m:ident, $feat:literal, $w:ty, $vbmi2:literal) => {
        pub(super) mod $m {
            use super::*;

            /// This instruction set's 16-lane register.
            type W = $w;

            /// Whether this build has AVX-512 VBMI2 ([`emit_sixteen`]).
            const VBMI2: bool = $vbmi2;

            /// Running state of one pass.
            struct State {
                out: PassOut,
                /// Lanes of some block that held a non-finite value.
                nf: u64,
                sum: f64,
                /// Per-lane f32 sums of the whole blocks' magnitudes ([`abs_sum`]'s order).
                lanes: W,
                /// Per-lane maxima of the blocks outside the groups (capped and trailing
                /// blocks), with `STATS`.
                mx: W,
                /// Largest magnitude bits among the candidates the batches read back.
                top: i32,
            }

            /// Elements per group: the four blocks that one hit mask covers ([`group`]).
            const GROUP: usize = 4 * BLOCK;

            /// Blocks per batch near `cap`: the lists get room for a whole batch at once, so
            /// the loop keeps their length and pointers in registers (a length stored and
            /// reloaded per block puts a store-forwarding round trip on the loop's critical
            /// path). A batch that would not fit under `cap` even if every element passed
            /// goes through [`capped_block`] instead.
            const BATCH: usize = 64;

            /// Most blocks per batch: as many as fit under `cap`, up to this, since each
            /// batch costs a call and the lists' bookkeeping. On an AVX-512 Zen 4 at 2^14,
            /// ρ = 0.01 (fresh gradients, both builds alternating, 8 launches each, median
            /// ratio to `stream`): threshold 2.44× → 2.29×, MSTopK 3.48× → 3.29×, exact
            /// 3.17× → 3.12× for 128 against 64. Up to 1024 helped the threshold selector a
            /// little more (2.24×) but cost MSTopK (3.72×).
            const MAX_BATCH: usize = 128;

            /// An adaptive pass emits the next batch in the dense form ([`EmitForm::Dense`])
            /// where this batch had at least one hit per this many elements (4 %). The hard
            /// threshold at 2^16 on the 2-core AVX-512 Xeon (`--example emit_forms`, 400
            /// rounds, ratio to the floor), branch-free against dense: 1.08× / 1.78× at 1 %
            /// density, 1.73× / 1.85× at 2 %, 1.86× / 1.98× at 3 %, 3.36× / 1.99× at 5 %;
            /// at 2^20 level up to 3 %, 1.20× / 1.06× at 5 %.
            ///
            /// With [`VBMI2`] one hit per 12 elements (8 %): its branch-free groups write
            /// sixteen indices with no branch ([`emit_sixteen`]), and hold their own up to
            /// there. On the 2-core Xeon (Granite Rapids) at 2^16, the threshold selector
            /// at densities 2 / 5 / 10 / 20 %, branch-free against dense: 1.30× / 1.95×,
            /// 1.56× / 1.89×, 1.94× / 1.78×, 2.79× / 1.75×; Gaussian-k at ρ = 0.01 (6 %
            /// candidates) 2.17× / 2.59×.
            const DENSE_ABOVE: usize = if VBMI2 { 12 } else { 25 };

            /// [`DENSE_ABOVE`] for a pass over data from beyond a core's cache (from
            /// `PREFETCH_MIN` elements) on a CPU other than AMD's
            /// ([`dense_when_far`](crate::kernel::dense_when_far)): one hit per 128
            /// elements (0.8 %), so that ρ = 0.01 emits dense and ρ = 0.001 does not. There, waiting on memory, the
            /// dense form's fixed work per block costs less than the branch-free form's
            /// mispredicted loops. On the 2-core AVX-512 Xeon (fresh gradients, ρ = 0.01,
            /// the timing program of `examples/emit_forms.rs`'s kind, six alternations of
            /// 400 rounds, ratio to the floor; adaptive against dense throughout) MSTopK
            /// at 2^20 1.27–1.31× / 1.22–1.24× (one pair level), exact 1.25–1.30× /
            /// 1.23–1.26×, DGC 1.32–1.43× / 1.36–1.41×; at ρ = 0.001 adaptive was ahead
            /// (MSTopK 1.17–1.19× / 1.20–1.29×), and in the cache (2^16) far ahead (2.02–2.04×
            /// / 2.82–2.84×).
            const DENSE_ABOVE_STREAMED: usize = 128;

            /// An adaptive pass emits the next batch branch-free
            /// ([`EmitForm::BranchFree`]) where more than one group in this many held a hit
            /// in this batch, and with a branch per group ([`EmitForm::Branchy`]) otherwise.
            /// At ρ = 0.001 about one group in 12 holds a hit: its branch mispredicts on
            /// fresh data often enough to cost more than the branch-free group's fixed work
            /// in the cache. On the 2-core AVX-512 Zen 5 (timing program: the suite's step on
            /// a fresh gradient, the floor on the same residual, three alternations of 2001
            /// rounds, median ratio to the floor) one in 64 against one in 4 before: exact
            /// top-k at 2^14, ρ = 0.001 2.20–2.28× / 1.90–1.93×, MSTopK 2.75–2.86× /
            /// 2.33–2.41×; at 2^16 exact 1.69–1.76× / 1.64–1.69×, MSTopK 2.12–2.21× /
            /// 1.88–1.97×; at 2^18 MSTopK 1.46–1.48× / 1.31–1.33×; ρ = 0.01 level.
            const FREE_ABOVE: usize = 64;

            /// A branch-free batch of a build with [`VBMI2`] writes up to sixteen indices
            /// per group with no branch ([`emit_sixteen`]), not two, where the last batch had
            /// at least one candidate per this many elements (0.8 %: ρ = 0.01 writes
            /// sixteen, ρ = 0.001 two). On the Zen 5 (timing program as for the batched
            /// groups, two against four, when this form wrote four with no branch): exact top-k at 2^14, ρ = 0.01 2.50–2.54× / 2.22–2.25×, MSTopK
            /// 2.95–3.09× / 2.68–2.72×; at 2^16 exact 2.11–2.17× / 1.97–2.09×, MSTopK
            /// 2.22–2.50× / 2.10–2.16×. Four written by scalar code (eight bit scans and
            /// shifts) took ρ = 0.01 as far but cost ρ = 0.001 about 4 % at 2^14.
            const SIXTEEN_ABOVE: usize = 128;

            /// [`FREE_ABOVE`] for a pass over data from beyond a core's cache (from
            /// `PREFETCH_MIN` elements, whether or not it prefetches): one group in 4. Waiting on memory, the branch's misses cost less
            /// than the branch-free group's work: on the Zen 5 at 2^22, ρ = 0.001, one in 64
            /// took MSTopK from 0.87–0.89× to 0.98–1.01× the floor and exact top-k from
            /// 0.84–0.87× to 0.89–0.92× (same program, 201 rounds).
            const FREE_ABOVE_FAR: usize = 4;

            /// How far past the end of the candidate lists a batch of a pass over data from
            /// beyond a core's cache prefetches them, in entries: the lines the next batch
            /// most likely writes (ρ = 0.01 emits about 20 per batch). A pass that follows
            /// other work finds its lists out of the cache too, and a store to a line that
            /// is not there waits for it. On the 2-core Zen 5 at 2^20, ρ = 0.01, eight cases
            /// in turn (their residuals alone fill the 32 MiB third-level cache), the step
            /// against the floor on its warmed data, six alternations of the two builds:
            /// exact top-k 1.70–1.87× → 1.50–1.70×, MSTopK 1.70–1.86× → 1.54–1.71×, the
            /// threshold selector 1.51–1.76× → 1.41–1.60×. In the cache (2^14) it cost 2–4 %,
            /// so only the passes over data from beyond the cache take it.
            const LIST_AHEAD: [usize; 2] = [BLOCK, 2 * BLOCK];

            /// Where an adaptive pass switches forms ([`DENSE_ABOVE`], [`FREE_ABOVE`] or
            /// their values for data beyond the cache).
            #[derive(Clone, Copy)]
            struct Switches {
                dense_above: usize,
                free_above: usize,
                /// Whether the pass's data comes from beyond a core's cache, and with it
                /// most likely its candidate lists (see [`LIST_AHEAD`]).
                far: bool,
            }

            impl Switches {
                /// The switches of a pass over data from beyond a core's cache (`far`) or
                /// not. The dense form's switch moves with `far` only where
                /// [`dense_when_far`](crate::kernel::dense_when_far) says so.
                fn new(far: bool) -> Self {
                    Switches {
                        dense_above: if far && crate::kernel::dense_when_far() {
                            DENSE_ABOVE_STREAMED
                        } else {
                            DENSE_ABOVE
                        },
                        free_above: if far { FREE_ABOVE_FAR } else { FREE_ABOVE },
                        far,
                    }
                }
            }

            /// Per-lane moments of a one-chunk pass: [`moments_body`]'s 32 lanes, two
            /// registers a sum (the block at element `j` of the chunk goes to the first or
            /// the second by `j / 16`'s parity).
            pub(crate) struct MomLanes {
                s: [W; 2],
                q: [W; 2],
            }

            impl MomLanes {
                #[inline(always)]
                unsafe fn zero() -> Self {
                    // SAFETY: register-only; the caller's features.
                    unsafe {
                        MomLanes {
                            s: [W::zero(); 2],
                            q: [W::zero(); 2],
                        }
                    }
                }

                /// Adds the block `a` at element `j` of the chunk (a multiple of 16), as
                /// [`moments_body`] adds it: the value, then its square (no fused
                /// multiply-add).
                #[inline(always)]
                unsafe fn add(&mut self, j: usize, a: W) {
                    // SAFETY: the caller's features.
                    unsafe { Self::add_to(j, a, (&mut self.s, &mut self.q)) }
                }

                /// A pair of sums reordered between (even, odd) block positions and (the
                /// block at element `j`, the next): the swap is its own inverse.
                #[inline(always)]
                fn from_parity(j: usize, p: [W; 2]) -> [W; 2] {
                    if j & BLOCK == 0 {
                        p
                    } else {
                        [p[1], p[0]]
                    }
                }

                /// [`Self::add`] into sums held apart from the struct, in locals of the loop
                /// that adds them ([`groups`]), so that they need not live at the caller's
                /// struct, whose address the pass hands on.
                #[inline(always)]
                unsafe fn add_to(j: usize, a: W, (s, q): (&mut [W; 2], &mut [W; 2])) {
                    // SAFETY: register-only; the caller's features.
                    unsafe {
                        let sq = a.mul_f32(a);
                        if j & BLOCK == 0 {
                            s[0] = s[0].add_f32(a);
                            q[0] = q[0].add_f32(sq);
                        } else {
                            s[1] = s[1].add_f32(a);
                            q[1] = q[1].add_f32(sq);
                        }
                    }
                }

                /// Adds the blocks of `src` from `from` to `to` (whole blocks).
                #[inline(always)]
                unsafe fn add_range(&mut self, src: *const f32, from: usize, to: usize) {
                    // SAFETY: the caller's features; `src` holds `from..to`.
                    unsafe {
                        for j in (from..to).step_by(BLOCK) {
                            self.add(j, W::load(src.add(j)));
                        }
                    }
                }

                /// The 32 lanes of each sum, in order.
                #[inline(always)]
                unsafe fn lanes(&self) -> ([f32; 32], [f32; 32]) {
                    let (mut s, mut q) = ([0.0f32; 32], [0.0f32; 32]);
                    // SAFETY: each store writes 16 lanes into an array of 32.
                    unsafe {
                        for h in 0..2 {
                            self.s[h].store(s.as_mut_ptr().add(BLOCK * h));
                            self.q[h].store(q.as_mut_ptr().add(BLOCK * h));
                        }
                    }
                    (s, q)
                }
            }

            /// The per-block state that stays in registers during a batch.
            struct Batch {
                pi: *mut u32,
                pv: *mut f32,
                len: usize,
            }

            /// One block of a batch (room already ensured): `a` holds its values, `off` the
            /// index of its first one.
            #[inline(always)]
            unsafe fn block<const STATS: bool>(
                a: W,
                off: usize,
                tv: W,
                w: &mut Batch,
                st: &mut State,
            ) {
                // SAFETY (whole body): the caller runs on a CPU with this module's features
                // and reserved room for 16 more entries at `w.len` in both lists.
                unsafe {
                    let bits = a.abs();
                    let m = bits.ge_mask(tv);
                    if STATS {
                        st.lanes = st.lanes.add_f32(bits);
                        st.mx = st.mx.max_i32(bits);
                    }
                    if m == 0 {
                        return;
                    }
                    W::compress(m, a, off, w.pi.add(w.len), w.pv.add(w.len));
                    w.len += m.count_ones() as usize;
                }
            }

            /// Four blocks of a batch (room already ensured): `a` holds their values and `off`
            /// is the index of the first. One hit test covers all 64 elements, and the hits'
            /// indices are written by a loop over the set bits (their values are read after
            /// the batch, in [`blocks`]). A branch-free form (`UNCOND` two or sixteen,
            /// [`EmitForm`]) drops the test: with two, the first two hits' indices are
            /// written unconditionally, in one 8-byte store (a slot without a hit is
            /// overwritten by the next write, the length advancing only past real ones), and
            /// only a group with more loops (at ρ = 0.01, about 1 in 30); with sixteen
            /// ([`emit_sixteen`]), a loop only past sixteen. Returns whether the group held a
            /// hit.
            ///
            /// Why two, in one store: on an AVX-512 CPU (before the AVX2 build existed), and
            /// again on a Zen 4, three separate writes took the threshold selector at 2^14,
            /// ρ = 0.01 from 1.89× `stream` to 2.02–2.23×, and one was no faster than two.
            /// One store instead of two separate writes (fresh gradients, builds alternating
            /// over 4–8 launches, median ratio to `stream` at ρ = 0.01; threshold, exact,
            /// MSTopK):
            /// - Zen 4, AVX-512: 2^14 2.27× → 2.11×, 3.02× → 2.88×, 3.37× → 3.17×; 2^16
            ///   1.71× → 1.57×, 1.99× → 1.88×, 2.08× → 1.92×; level at 2^20.
            /// - Zen 3, AVX2, against its former single write (which, while each write also
            ///   read its value back, had beaten two separate ones: 2^14 4.5–5.1 µs →
            ///   4.1–4.3 µs): 2^14 2.11× → 1.95×, 2.74× → 2.58×, 3.48× → 3.21×; 2^16 2.00× →
            ///   1.89×, 2.25× → 2.08×, 2.74× → 2.50×; 2^18 1.80× → 1.53×, 1.99× → 1.74×,
            ///   2.26× → 1.93×; level at 2^20 and at 2^14, ρ = 0.001. Again with the final
            ///   code (6 and 4 launches): 2^14 2.03× → 1.92×, 2.63× → 2.52×, 3.32× → 3.19×;
            ///   2^16 1.98× → 1.91×, 2.23× → 2.15×, 2.67× → 2.72×.
            #[inline(always)]
            unsafe fn group<const STATS: bool, const UNCOND: usize>(
                a: [W; 4],
                off: usize,
                tv: W,
                w: &mut Batch,
                st: &mut State,
            ) -> bool {
                // SAFETY (whole body): the caller runs on a CPU with this module's
                // features, and room for 64 more entries at `w.len` is reserved (every
                // write lands below `w.len + 64`).
                unsafe {
                    let bits = magnitudes::<STATS>(a, st);
                    if UNCOND == 0 && !W::any_ge(&bits, tv) {
                        return false;
                    }
                    emit_mask::<UNCOND>(W::group_mask(&bits, tv), off, w)
                }
            }

            /// The magnitudes of a group's four blocks, added to the pass's lanes with
            /// `STATS`.
            #[inline(always)]
            unsafe fn magnitudes<const STATS: bool>(a: [W; 4], st: &mut State) -> [W; 4] {
                // SAFETY: register-only; the caller's features.
                unsafe {
                    // Not `a.map(..)`: its closure is not inlined into this instruction set's code.
                    let bits = [a[0].abs(), a[1].abs(), a[2].abs(), a[3].abs()];
                    if STATS {
                        // No running maximum here: the largest magnitude is a candidate
                        // whenever one reaches `t`, and the loop that reads the candidates'
                        // values back takes it (`State::top`). That saves a vector `max`
                        // per 8 or 16 elements in the hottest loop of MSTopK's pass.
                        for b in &bits {
                            st.lanes = st.lanes.add_f32(*b);
                        }
                    }
                    bits
                }
            }

            /// Writes the indices of the set bits of a group's hit mask `mm` (the group's
            /// first element at index `off`) to the batch's list; returns whether there was
            /// one. `UNCOND` says how many are written with no branch: none (a loop over the
            /// set bits), two (in one 8-byte store, [`group`]) or, with [`VBMI2`], up to
            /// sixteen ([`emit_sixteen`]).
            #[inline(always)]
            unsafe fn emit_mask<const UNCOND: usize>(
                mut mm: u64,
                off: usize,
                w: &mut Batch,
            ) -> bool {
                // SAFETY (whole body): room for 64 more entries at `w.len` is reserved (every
                // write lands below `w.len + 64`); `emit_sixteen` only with VBMI2.
                unsafe {
                    let hit = mm != 0;
                    let mut len = w.len;
                    if UNCOND == 16 && VBMI2 {
                        w.len = len + emit_sixteen(mm, off, w.pi.add(len));
                        return hit;
                    }
                    if UNCOND > 0 {
                        // Little-endian: the first hit's index lands at `len`, the second's at
                        // `len + 1`. An empty mask's 64 makes an index that no one reads: its
                        // slot lies at or past the new length, and the next write overwrites it.
                        let j1 = mm.trailing_zeros();
                        let m2 = mm & mm.wrapping_sub(1);
                        let j2 = m2.trailing_zeros();
                        let at = |j: u32| u64::from((off + j as usize) as u32);
                        w.pi.add(len)
                            .cast::<u64>()
                            .write_unaligned(at(j1) | at(j2) << 32);
                        len += usize::from(mm != 0) + usize::from(m2 != 0);
                        mm = m2 & m2.wrapping_sub(1);
                    }
                    while mm != 0 {
                        let j = mm.trailing_zeros() as usize;
                        w.pi.add(len).write((off + j) as u32);
                        len += 1;
                        mm &= mm - 1;
                    }
                    w.len = len;
                    hit
                }
            }

            /// One block near `cap`: entry by entry through [`emit_block`].
            #[inline(always)]
            unsafe fn capped_block<const STATS: bool>(
                a: W,
                off: usize,
                t: i32,
                cap: usize,
                cand: &mut Cand,
                st: &mut State,
            ) {
                // SAFETY: register operations and stores into local arrays; this module's
                // features are enabled.
                unsafe {
                    let bits = a.abs();
                    if STATS {
                        st.lanes = st.lanes.add_f32(bits);
                        st.mx = st.mx.max_i32(bits);
                    }
                    st.nf |= u64::from(bits.ge_mask(W::bound(INF_BITS)));
                    // Once over `cap` the list is final: a hit only confirms the overflow.
                    if st.out.overflow {
                        return;
                    }
                    if bits.ge_mask(W::bound(t)) != 0 {
                        let mut v = [0.0f32; BLOCK];
                        let mut b = [0i32; BLOCK];
                        a.store(v.as_mut_ptr());
                        bits.store(b.as_mut_ptr().cast());
                        emit_block(&v, &b, off, t, cap, cand, &mut st.out);
                    }
                }
            }

            /// The groups of one batch, `i` up to `end`, in one form ([`group`]); returns how
            /// many held a hit. With `MOM` each block also goes into `mom`'s lanes from the
            /// register (Gaussian-k's pass: reading the batch back from the first-level
            /// cache for them took its pass at 2^16, ρ = 0.001, from 10.6 to 12.6 µs).
            ///
            /// A function of its own per form, so that each keeps the pass's state in
            /// registers: a run-time test of the form inside one loop made the branchy form
            /// spill its accumulators (MSTopK at 2^14, ρ = 0.01: 1.67× the floor against
            /// 2.14×), and both loops inlined into one function cost the branch-free form
            /// 10–25 %. Called through [`groups_apart`], which keeps it so.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn groups<const STATS: bool, const UNCOND: usize, const MOM: bool>(
                i: &mut usize,
                end: usize,
                base: usize,
                tv: W,
                w: &mut Batch,
                (st, mom): (&mut State, &mut MomLanes),
                load: &mut impl FnMut(usize, bool) -> W,
            ) -> u32 {
                let mut hits = 0u32;
                // A local copy: through the reference, the index went to the stack and back
                // every group, a store-forwarding round trip on the loop's only chain.
                let mut j = *i;
                // The moments' sums too ([`MomLanes::add_to`]).
                let (mut s, mut q) = (mom.s, mom.q);
                // SAFETY: as in `blocks`, whose batch reserved room for all of these groups.
                unsafe {
                    if UNCOND > 0 {
                        // The hit masks of four groups first, then their indices: a
                        // mispredicted loop over one group's hits then no longer throws
                        // away the loads of the groups after it. On the 2-core AVX-512
                        // Zen 5 (timing program: the suite's step on a fresh gradient,
                        // three alternations of 2001 rounds, median ratio to the floor),
                        // one group at a time against four: MSTopK at 2^14, ρ = 0.01
                        // 3.17–3.18× / 2.89–3.02×, ρ = 0.001 2.33–2.67× / 2.10–2.15×; at
                        // 2^16, ρ = 0.001 2.06–2.08× / 1.68–1.74×; at 2^18, ρ = 0.01
                        // 1.55–1.61× / 1.44–1.48×; the threshold selector a little ahead,
                        // exact top-k level. Eight at a time lost in a stand-alone loop.
                        while j + 4 * GROUP <= end {
                            let mut masks = [0u64; 4];
                            for (g, m) in masks.iter_mut().enumerate() {
                                let a = load_group::<MOM>(j + g * GROUP, (&mut s, &mut q), load);
                                *m = W::group_mask(&magnitudes::<STATS>(a, st), tv);
                            }
                            for (g, &m) in masks.iter().enumerate() {
                                hits += u32::from(emit_mask::<UNCOND>(m, base + j + g * GROUP, w));
                            }
                            j += 4 * GROUP;
                        }
                    }
                    while j + GROUP <= end {
                        let a = load_group::<MOM>(j, (&mut s, &mut q), load);
                        hits += u32::from(group::<STATS, UNCOND>(a, base + j, tv, w, st));
                        j += GROUP;
                    }
                }
                *i = j;
                (mom.s, mom.q) = (s, q);
                hits
            }

            /// [`groups`] as a call of its own, whatever the inliner would do: rustc (1.95)
            /// drops `#[inline(never)]` from a function with `#[target_feature]` (its LLVM
            /// function has no `noinline`), and LLVM took every form's loop into the pass,
            /// where the threshold and the group's constants were reloaded from the stack. This
            /// wrapper has no target feature, so it keeps its `noinline` and cannot take
            /// `groups` inline either. On the 2-core Zen 5 (timing program: the suite's step on a
            /// fresh gradient after the untimed warm pass, three alternations, median ratio to
            /// the floor), inlined against apart: exact top-k at 2^14, ρ = 0.01 2.02–2.09× /
            /// 1.94–2.03×, at 2^16 2.22× / 2.04–2.06×, at 2^18 1.37–1.39× / 1.31–1.32×;
            /// MSTopK at 2^16 2.52–2.57× / 2.34–2.35×; the threshold selector at 2^16,
            /// ρ = 0.001 1.84–1.85× / 1.73–1.77×; at 2^20 level.
            #[inline(never)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn groups_apart<const STATS: bool, const UNCOND: usize, const MOM: bool>(
                i: &mut usize,
                end: usize,
                base: usize,
                tv: W,
                w: &mut Batch,
                (st, mom): (&mut State, &mut MomLanes),
                load: &mut impl FnMut(usize, bool) -> W,
            ) -> u32 {
                // SAFETY: the caller's (this module's features, the batch's room).
                unsafe { groups::<STATS, UNCOND, MOM>(i, end, base, tv, w, (st, mom), load) }
            }

            /// The four blocks of the group at `at`, accumulated (and stored) by `load`;
            /// with `MOM` each also goes into the moments' sums `mom` from the register
            /// ([`MomLanes::add_to`]).
            #[inline(always)]
            unsafe fn load_group<const MOM: bool>(
                at: usize,
                mom: (&mut [W; 2], &mut [W; 2]),
                load: &mut impl FnMut(usize, bool) -> W,
            ) -> [W; 4] {
                // SAFETY: the caller's features; `load` reads whole blocks below the batch's
                // end.
                unsafe {
                    let a = [
                        load(at, true),
                        load(at + BLOCK, true),
                        load(at + 2 * BLOCK, true),
                        load(at + 3 * BLOCK, true),
                    ];
                    if MOM {
                        for (b, &v) in a.iter().enumerate() {
                            MomLanes::add_to(at + b * BLOCK, v, (&mut *mom.0, &mut *mom.1));
                        }
                    }
                    a
                }
            }

            /// The blocks of one batch, `i` up to `end`, in the dense form
            /// ([`EmitForm::Dense`]): each block's hits are compressed into both lists in
            /// the register, with no branch on how many there are, and with `ZERO` those
            /// from `tzv`'s bits up ([`Wide::bound`]) are zeroed in `src`.
            /// Returns the largest magnitude bits among the hits (0 if none).
            ///
            /// Without `STATS` the block goes to `src` once, its hits already zeroed
            /// ([`Wide::store_zeroing`]), instead of stored by `load` and then zeroed by a
            /// masked store. On the 2-core AVX-512 Xeon at ρ = 0.01 (timing program, fresh
            /// gradients, pool woken before each run, old and new builds alternating, median
            /// ratio to the floor per launch) exact top-k at 2^20 went from 1.21–1.27× to
            /// 1.11–1.24× (ten pairs; medians 1.23× / 1.20×) and at 2^24 from 1.08–1.09× to
            /// 1.05–1.08×; MSTopK, which also sums the magnitudes, ran slower with it (2^24:
            /// 1.07–1.08× / 1.08–1.13×), so it keeps the two stores.
            ///
            /// Left to the inliner (it takes it into the pass): called through a wrapper that
            /// keeps it a call, as [`groups_apart`] does for the groups, Gaussian-k's step at
            /// 2^16, ρ = 0.01 read 5.9–6.1× the floor against 5.6–6.1× (the other selectors
            /// level), so it stays.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn dense<const STATS: bool, const ZERO: bool, const MOM: bool>(
                i: &mut usize,
                end: usize,
                base: usize,
                (tv, tzv): (W, W),
                w: &mut Batch,
                (st, mom): (&mut State, &mut MomLanes),
                src: *mut f32,
                load: &mut impl FnMut(usize, bool) -> W,
            ) -> i32 {
                let (mut j, mut len) = (*i, w.len);
                // Local copies of the running sums, and for the moments, the sums of the
                // block at `j` (`cur`) and of the next one: each block adds to `cur` and the
                // two swap, so the parity of `j` ([`MomLanes::add`]) costs no branch in the
                // loop. With the branch (and with the sums behind the references, or in
                // local copies alike) the four moment sums went to the stack and back
                // every block, a store-forwarding round trip on the loop's chains:
                // Gaussian-k's step at ρ = 0.01, dense form, took 2.87× the floor at 2^16
                // and 3.41× at 2^14, against 2.60× and 3.14× with the swap (2-core Xeon,
                // Granite Rapids, `--example emit_forms`).
                let mut lanes = st.lanes;
                let [s, q] = [mom.s, mom.q].map(|p| MomLanes::from_parity(j, p));
                let ([mut s_cur, mut s_next], [mut q_cur, mut q_next]) = (s, q);
                // Whether the block is stored here, zeroed, rather than by `load`.
                let one_store = ZERO && !STATS;
                // SAFETY: as in `blocks`, whose batch reserved room for all of these blocks
                // and one more (each compression stores 16 lanes); `src` holds every block
                // below `end`.
                unsafe {
                    let mut top = W::zero();
                    while j < end {
                        let a = load(j, !one_store);
                        if MOM {
                            let sq = a.mul_f32(a);
                            (s_cur, s_next) = (s_next, s_cur.add_f32(a));
                            (q_cur, q_next) = (q_next, q_cur.add_f32(sq));
                        }
                        let bits = a.abs();
                        if STATS {
                            lanes = lanes.add_f32(bits);
                        }
                        let m = bits.ge_mask(tv);
                        W::compress(m, a, base + j, w.pi.add(len), w.pv.add(len));
                        len += m.count_ones() as usize;
                        top = top.max_i32_masked(m, bits);
                        if one_store {
                            a.store_zeroing(src.add(j), m & bits.ge_mask(tzv));
                        } else if ZERO {
                            W::zero_masked(src.add(j), m & bits.ge_mask(tzv));
                        }
                        j += BLOCK;
                    }
                    *i = j;
                    w.len = len;
                    st.lanes = lanes;
                    [mom.s, mom.q] =
                        [[s_cur, s_next], [q_cur, q_next]].map(|p| MomLanes::from_parity(j, p));
                    top.reduce_max_i32()
                }
            }

            /// Runs the whole blocks of a pass over `n` elements: `load(i, store)` gives the
            /// values of the block at `i` (and, with `store`, writes the accumulated ones back
            /// in a fused pass), emitting in the form `emit` asks for. An adaptive pass picks
            /// the form per batch from the share of the last batch's groups that held a hit,
            /// starting from the form the list's last pass ended in.
            ///
            /// With `STATS` and `chunk_sums`, the pass spans whole [`CHUNK`]s from its start
            /// and writes the `|x|` sum of each chunk that its whole blocks complete to
            /// `chunk_sums` (batches stop at chunk ends); `st.sum` is left with the lanes of a
            /// last, partial chunk, which the tail continues. Without `chunk_sums` every lane
            /// folds into `st.sum` once at the end (a pass over one chunk).
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn blocks<const STATS: bool, const ZERO: bool>(
                n: usize,
                base: usize,
                (t, zero_from): (i32, i32),
                cap: usize,
                cand: &mut Cand,
                st: &mut State,
                src: *mut f32,
                (emit, switch): (EmitForm, Switches),
                mut chunk_sums: Option<&mut [f64]>,
                mut mom: Option<&mut MomLanes>,
                mut load: impl FnMut(usize, bool) -> W,
            ) {
                let whole = n / BLOCK * BLOCK;
                let mut free = match emit {
                    EmitForm::Branchy => false,
                    EmitForm::BranchFree | EmitForm::Dense => true,
                    EmitForm::Adaptive => cand.branch_free,
                };
                let mut sixteen = cand.sixteen;
                let mut dense_now = W::COMPRESSES
                    && match emit {
                        EmitForm::Dense => true,
                        EmitForm::Adaptive => cand.dense,
                        _ => false,
                    };
                // SAFETY (whole body): this module's features are enabled by the callers;
                // `block` writes at most 16 entries per block, and each batch reserved room
                // for all of its blocks.
                unsafe {
                    let tv = W::bound(t);
                    let per_chunk = STATS && chunk_sums.is_some();
                    let mut i = 0;
                    while i < whole {
                        if per_chunk && i > 0 && i % CHUNK == 0 {
                            if let Some(sums) = chunk_sums.as_deref_mut() {
                                sums[i / CHUNK - 1] = f64::from(st.lanes.tree16());
                            }
                            st.lanes = W::zero();
                        }
                        let len = cand.idx.len();
                        // With per-chunk sums a batch ends at its chunk's end at the latest.
                        let lim = if per_chunk {
                            whole.min((i / CHUNK + 1) * CHUNK)
                        } else {
                            whole
                        };
                        let left = (lim - i) / BLOCK;
                        // Blocks that fit under `cap` with a block's room to spare.
                        let fit = (cap.saturating_sub(len) / BLOCK).saturating_sub(1);
                        if fit < left.min(BATCH) || t > INF_BITS {
                            let end = i + left.min(BATCH) * BLOCK;
                            let from = i;
                            while i < end {
                                capped_block::<STATS>(load(i, true), base + i, t, cap, cand, st);
                                i += BLOCK;
                            }
                            if let Some(m) = mom.as_deref_mut() {
                                m.add_range(src, from, end);
                            }
                            if ZERO {
                                for (&j, &v) in cand.idx[len..].iter().zip(&cand.val[len..]) {
                                    zero_at_from(src, j as usize - base, v, zero_from);
                                }
                            }
                            cand.sample_upto(src, base, end, len);
                            continue;
                        }
                        let end = i + left.min(MAX_BATCH).min(fit) * BLOCK;
                        let room = (end - i) + BLOCK;
                        cand.idx.reserve(room);
                        cand.val.reserve(room);
                        let mut w = Batch {
                            pi: cand.idx.as_mut_ptr(),
                            pv: cand.val.as_mut_ptr(),
                            len,
                        };
                        if switch.far {
                            for ahead in LIST_AHEAD {
                                let (pi, pv) = (
                                    w.pi.wrapping_add(len + ahead),
                                    w.pv.wrapping_add(len + ahead),
                                );
                                _mm_prefetch::<_MM_HINT_T0>(pi.cast_const().cast());
                                _mm_prefetch::<_MM_HINT_T0>(pv.cast_const().cast());
                            }
                        }
                        let at = i;
                        if dense_now {
                            let tzv = W::bound(zero_from.max(t));
                            let tvs = (tv, tzv);
                            let top = match mom.as_deref_mut() {
                                Some(m) => dense::<STATS, ZERO, true>(
                                    &mut i,
                                    end,
                                    base,
                                    tvs,
                                    &mut w,
                                    (st, m),
                                    src,
                                    &mut load,
                                ),
                                None => dense::<STATS, ZERO, false>(
                                    &mut i,
                                    end,
                                    base,
                                    tvs,
                                    &mut w,
                                    (st, &mut MomLanes::zero()),
                                    src,
                                    &mut load,
                                ),
                            };
                            if emit == EmitForm::Adaptive {
                                dense_now = (w.len - len) * switch.dense_above >= i - at;
                                free = true;
                            }
                            st.nf |= u64::from(top >= INF_BITS);
                            st.top = st.top.max(top);
                            cand.idx.set_len(w.len);
                            cand.val.set_len(w.len);
                            cand.sample_upto(src, base, i, len);
                            continue;
                        }
                        let (n0, l, wb) = (&mut i, &mut load, &mut w);
                        // Gaussian-k's pass (with `mom`) has every form: at its 6 % of
                        // candidates the groups of sixteen ([`emit_sixteen`]) beat the dense
                        // form.
                        let nm = &mut MomLanes::zero();
                        let hits = match (free, sixteen && VBMI2, mom.as_deref_mut()) {
                            (false, _, Some(m)) => {
                                groups_apart::<STATS, 0, true>(n0, end, base, tv, wb, (st, m), l)
                            }
                            (true, false, Some(m)) => {
                                groups_apart::<STATS, 2, true>(n0, end, base, tv, wb, (st, m), l)
                            }
                            (true, true, Some(m)) => {
                                groups_apart::<STATS, 16, true>(n0, end, base, tv, wb, (st, m), l)
                            }
                            (false, _, None) => {
                                groups_apart::<STATS, 0, false>(n0, end, base, tv, wb, (st, nm), l)
                            }
                            (true, false, None) => {
                                groups_apart::<STATS, 2, false>(n0, end, base, tv, wb, (st, nm), l)
                            }
                            (true, true, None) => {
                                groups_apart::<STATS, 16, false>(n0, end, base, tv, wb, (st, nm), l)
                            }
                        };
                        if emit == EmitForm::Adaptive {
                            free = switch.free_above * hits as usize * 4 * BLOCK > i - at;
                        }
                        sixteen = (w.len - len) * SIXTEEN_ABOVE >= i - at;
                        // Whether the next batch is dense: decided once this batch's hits
                        // are all in the list, below.
                        let decide_dense = emit == EmitForm::Adaptive && W::COMPRESSES;
                        // The groups wrote indices only: their values are read here, once
                        // the batch's stores have left the store queue. A value read right
                        // after its block's vector store waited for it: on an AVX-512 Zen 4
                        // at 2^14, ρ = 0.01, reading here took the threshold selector from
                        // 2.14–2.24× `stream` to 1.91–2.00×, exact from 2.69–2.82× to
                        // 2.49–2.67×. Each index is one the groups just wrote, of a whole
                        // block below `whole <= n`, so `src` holds it.
                        //
                        // The same loop finds a non-finite value among them: one passes
                        // every threshold up to `INF_BITS` (a higher one took the capped
                        // path, which checks every block), so it is a candidate, and
                        // looking here, not at every block, keeps the check off the pass.
                        //
                        // With `ZERO`, it also zeroes them (those from `zero_from` up) while
                        // their lines are in the core's first-level cache.
                        let mut top = 0i32;
                        for n in len..w.len {
                            let rel = *w.pi.add(n) as usize - base;
                            let v = *src.add(rel);
                            w.pv.add(n).write(v);
                            top = top.max(abs_bits(v));
                            if ZERO {
                                zero_at_from(src, rel, v, zero_from);
                            }
                        }
                        let grouped = w.len;
                        while i < end {
                            let a = load(i, true);
                            if let Some(m) = mom.as_deref_mut() {
                                m.add(i, a);
                            }
                            block::<STATS>(a, base + i, tv, &mut w, st);
                            i += BLOCK;
                        }
                        for n in grouped..w.len {
                            let v = *w.pv.add(n);
                            top = top.max(abs_bits(v));
                            if ZERO {
                                zero_at_from(src, *w.pi.add(n) as usize - base, v, zero_from);
                            }
                        }
                        st.nf |= u64::from(top >= INF_BITS);
                        st.top = st.top.max(top);
                        cand.idx.set_len(w.len);
                        cand.val.set_len(w.len);
                        // The batch's sample, its lines still in the first-level cache.
                        cand.sample_upto(src, base, i, len);
                        if decide_dense {
                            dense_now = (w.len - len) * switch.dense_above >= i - at;
                        }
                    }
                    if emit == EmitForm::Adaptive {
                        cand.branch_free = free;
                        cand.dense = dense_now;
                    }
                    cand.sixteen = sixteen;
                    if STATS {
                        // The lanes folded once per chunk, before the tail's elements (as
                        // [`abs_sum`]). A last chunk that the whole blocks complete goes to
                        // its slot, and the tail (if any) starts a chunk of its own.
                        let sum = f64::from(st.lanes.tree16());
                        st.lanes = W::zero();
                        match chunk_sums {
                            Some(sums) if whole > 0 && whole % CHUNK == 0 => {
                                sums[whole / CHUNK - 1] = sum;
                            }
                            _ => st.sum += sum,
                        }
                    }
                }
            }

            /// The scalar tail of a pass (fewer than 16 elements), continuing its statistics.
            #[inline(always)]
            fn tail<const STATS: bool>(
                x: &[f32],
                off: usize,
                t: i32,
                cap: usize,
                cand: &mut Cand,
                st: &mut State,
            ) -> i32 {
                let mut mx = 0i32;
                for (j, &a) in x.iter().enumerate() {
                    let ab = abs_bits(a);
                    if STATS {
                        st.sum += f64::from(f32::from_bits(ab as u32));
                        mx = mx.max(ab);
                    }
                    if ab >= t {
                        emit(a, ab, off + j, cap, cand, &mut st.out);
                    }
                }
                mx
            }

            /// Closes a pass; `first_non_finite` finds the first non-finite value it saw
            /// (index, value), called only when it saw one.
            #[inline(always)]
            unsafe fn finish<const STATS: bool>(
                st: State,
                tail_mx: i32,
                first_non_finite: impl FnOnce() -> (usize, f32),
            ) -> PassOut {
                let mut out = st.out;
                if st.nf != 0 || out.non_finite.is_some() {
                    out.non_finite = Some(first_non_finite());
                }
                if STATS {
                    out.abs_sum = st.sum;
                    // Exact when some element reached `t` (see `group`); below `t` otherwise.
                    // SAFETY: register-only reduction, its features enabled by the callers.
                    let mx = unsafe { st.mx.reduce_max_i32() };
                    out.max_bits = mx.max(tail_mx).max(st.top);
                }
                out
            }

            fn state() -> State {
                State {
                    out: PassOut::new(),
                    nf: 0,
                    sum: 0.0,
                    // SAFETY: register-only, only reached from the enabled passes.
                    lanes: unsafe { W::zero() },
                    // SAFETY: as above.
                    mx: unsafe { W::zero() },
                    top: 0,
                }
            }

            /// [`fused_body`] in this module's registers, emitting as `emit` asks. With
            /// `ZERO`, every candidate with magnitude bits from `zero_from` up is also
            /// zeroed in `r` (its value stays in the list).
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            pub(crate) fn fused<const STATS: bool, const PREFETCH: bool, const ZERO: bool>(
                (emit, far): (EmitForm, bool),
                r: &mut [f32],
                g: &[f32],
                base: usize,
                (t, zero_from): (i32, i32),
                cap: usize,
                cand: &mut Cand,
                (mut chunk_sums, mom): (Option<&mut [f64]>, Option<&mut Moments>),
            ) -> PassOut {
                let n = r.len().min(g.len());
                let whole = n / BLOCK * BLOCK;
                let mut st = state();
                // SAFETY: register-only; this module's features are enabled here.
                let mut lanes = mom.is_some().then(|| unsafe { MomLanes::zero() });
                let (pr, pg) = (r.as_mut_ptr(), g.as_ptr());
                // One block at `i`, accumulated and stored (`blocks` passes whole blocks below
                // `whole <= n`, within both slices). It holds the two pointers themselves
                // (`move`): holding references to them, the loop of [`groups_apart`] reloaded
                // them after every store, which might have changed them for all it knew.
                let load = move |i: usize, store: bool| {
                    // SAFETY: as just said; this module's features are enabled here.
                    unsafe {
                        if PREFETCH {
                            // A hint, never a fault: past the slices' end it touches nothing.
                            let (rp, gp) = (
                                pr.wrapping_add(i + PREFETCH_AHEAD),
                                pg.wrapping_add(i + PREFETCH_AHEAD),
                            );
                            _mm_prefetch::<_MM_HINT_T0>(rp.cast_const().cast());
                            _mm_prefetch::<_MM_HINT_T0>(gp.cast());
                        }
                        let a = W::load(pr.add(i)).add_f32(W::load(pg.add(i)));
                        if store {
                            a.store(pr.add(i));
                        }
                        a
                    }
                };
                let tz = (t, zero_from);
                let first = cand.len();
                // SAFETY: `blocks` loads only whole blocks below `whole <= n`, within both
                // slices, and zeroes only candidates among them.
                unsafe {
                    let sums = chunk_sums.as_deref_mut();
                    let m = lanes.as_mut();
                    let form = (emit, Switches::new(far));
                    blocks::<STATS, ZERO>(n, base, tz, cap, cand, &mut st, pr, form, sums, m, load);
                }
                for (rv, gv) in r[whole..n].iter_mut().zip(&g[whole..n]) {
                    *rv += *gv;
                }
                if let (Some(m), Some(l)) = (mom, &lanes) {
                    // The tail into the lanes after the last whole block's, as
                    // `moments_body`'s remainder (the range is one chunk at most).
                    // SAFETY: this module's features are enabled here.
                    let (mut s, mut q) = unsafe { l.lanes() };
                    for (j, &a) in r[whole..n].iter().enumerate() {
                        let at = whole % (2 * BLOCK) + j;
                        s[at] += a;
                        q[at] += a * a;
                    }
                    *m = (fold_lanes(&s), fold_lanes(&q));
                }
                let before = cand.len();
                let mx = tail::<STATS>(&r[whole..n], base + whole, t, cap, cand, &mut st);
                if let (true, Some(sums)) = (STATS, chunk_sums) {
                    // The last chunk, when partial, is `st.sum`; the pass's sum folds the
                    // chunks' in order, as `serial_chunks` does.
                    if n % CHUNK != 0 {
                        sums[n / CHUNK] = st.sum;
                    }
                    st.sum = sums.iter().fold(0.0, |a, b| a + b);
                }
                if ZERO {
                    let (idx, val) = (&cand.idx[before..], &cand.val[before..]);
                    zero_candidates(&mut r[..n], base, idx, val, zero_from);
                }
                // SAFETY: `r` holds the range's `n` elements.
                unsafe { cand.sample_upto(r.as_ptr(), base, n, before) };
                let (idx, val) = (&cand.idx[first..], &cand.val[first..]);
                let r = &r[..n];
                // SAFETY: this module's features are enabled here.
                unsafe {
                    finish::<STATS>(st, mx, || {
                        // A zeroing pass is uncapped (see `fused_one`), so every non-finite
                        // value is a candidate, and the residual no longer holds the zeroed
                        // ones.
                        match val.iter().position(|v| !v.is_finite()) {
                            Some(at) if ZERO => (idx[at] as usize, val[at]),
                            _ => first_non_finite(r, base),
                        }
                    })
                }
            }

            /// [`add_max_body`] in this module's registers, in the same order (so the same
            /// maxima and bits of the sum): one vector add, `max` and (with `STATS`) lane
            /// sum per block. The portable body compiles to 128-bit vectors even where
            /// wider ones are enabled, up to four times the instructions.
            #[target_feature(enable = $feat)]
            pub(crate) fn add_max<const STATS: bool>(
                r: &mut [f32],
                g: &[f32],
                maxes: &mut [i32],
            ) -> (i32, f64) {
                let n = r.len().min(g.len());
                let blocks = n / BLOCK;
                let (pr, pg) = (r.as_mut_ptr(), g.as_ptr());
                // SAFETY (whole block): this module's features are enabled here; loads and
                // stores stay below `blocks * BLOCK <= n`, and `maxes` (checked by slicing)
                // has a span's entries.
                unsafe {
                    let mut m = W::zero();
                    let mut top = W::splat_i32(-1);
                    let mut lanes = W::zero();
                    let mut total = 0.0f64;
                    // One block at `i`: accumulated, stored, into the span's maxima and the lanes.
                    let block = |i: usize, m: &mut W, lanes: &mut W| {
                        let a = W::load(pr.add(i)).add_f32(W::load(pg.add(i)));
                        a.store(pr.add(i));
                        let bits = a.abs();
                        *m = m.max_i32(bits);
                        if STATS {
                            *lanes = lanes.add_f32(bits);
                        }
                    };
                    // Whole spans: sixteen blocks without a test between them.
                    let spans = blocks / BLOCK;
                    for s in 0..spans {
                        for j in 0..BLOCK {
                            block((s * BLOCK + j) * BLOCK, &mut m, &mut lanes);
                        }
                        let at = s * BLOCK;
                        m.store(maxes[at..at + BLOCK].as_mut_ptr().cast());
                        top = top.max_i32(m);
                        m = W::zero();
                        if STATS && s % (CHUNK / GROUP_SPAN) == CHUNK / GROUP_SPAN - 1 {
                            total += f64::from(lanes.tree16());
                            lanes = W::zero();
                        }
                    }
                    // The whole blocks of the last, partial span (a chunk is a whole number of
                    // spans, so none of them ends one).
                    for b in spans * BLOCK..blocks {
                        block(b * BLOCK, &mut m, &mut lanes);
                    }
                    // The last, partial chunk and span, as in the portable body.
                    let (mut mm, mut tops) = ([0i32; BLOCK], [0i32; BLOCK]);
                    m.store(mm.as_mut_ptr().cast());
                    top.store(tops.as_mut_ptr().cast());
                    let chunk = f64::from(lanes.tree16());
                    let lo = blocks * BLOCK;
                    let (r, g) = (&mut r[lo..n], &g[lo..n]);
                    total += add_max_end::<STATS>(r, g, n, mm, maxes, &mut tops, chunk);
                    let top = W::load(tops.as_ptr().cast());
                    (top.reduce_max_i32().max(-1), total)
                }
            }

            /// [`scan_body`] in this module's registers.
            #[target_feature(enable = $feat)]
            pub(crate) fn scan<const STATS: bool>(
                x: &[f32],
                base: usize,
                t: i32,
                cap: usize,
                cand: &mut Cand,
            ) -> PassOut {
                let n = x.len();
                let whole = n / BLOCK * BLOCK;
                let mut st = state();
                let px = x.as_ptr();
                // SAFETY: `blocks` loads only whole blocks below `whole <= n`, within the
                // slice; without `ZERO` it writes nothing through the pointer.
                unsafe {
                    let src = px.cast_mut();
                    let tz = (t, INF_BITS);
                    blocks::<STATS, false>(
                        n,
                        base,
                        tz,
                        cap,
                        cand,
                        &mut st,
                        src,
                        (emit_form(), Switches::new(false)),
                        None,
                        None,
                        |i, _| W::load(px.add(i)),
                    );
                }
                let mx = tail::<STATS>(&x[whole..], base + whole, t, cap, cand, &mut st);
                // SAFETY: this module's features are enabled here.
                unsafe { finish::<STATS>(st, mx, || first_non_finite(x, base)) }
            }
        }
    };
}

wide_passes!(
    avx512,
    "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt",
    Zmm,
    false
);
wide_passes!(
    avx512v,
    "avx512f,avx512bw,avx512vl,avx512vbmi2,popcnt,bmi1,bmi2,lzcnt",
    Zmm,
    true
);
wide_passes!(avx2, "avx2,popcnt,bmi1,bmi2,lzcnt", Ymm2, false);

/// The byte `j` at byte `j` of a register: what [`emit_sixteen`] compresses.
const BYTE_IOTA: [u8; 64] = {
    let mut a = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        a[j] = j as u8;
        j += 1;
    }
    a
};

/// Writes the indices (`off` + bit position) of the set bits of a group's hit mask `mm`
/// to `pi` in order, with no branch for up to sixteen: one byte compression (VBMI2) puts
/// the set bits' positions in its low bytes, whose first sixteen are widened and stored
/// at once (64 bytes). Returns how many it wrote. `pi` has room for 64 entries.
///
/// Sixteen, not four with a branch to sixteen: at 6 % density (Gaussian-k's pass on the
/// suite's gradient, about four hits a group) that branch went either way, and on the
/// 2-core AVX-512 Xeon (Granite Rapids; `--example emit_forms -- 16 0.01 gaussiank 2000`,
/// branch-free form) the step took 2.96× the floor against 2.17× (2^14: 3.44× / 2.70×).
/// At ρ = 0.01 (about one hit a group) exact top-k, MSTopK and the threshold selector
/// stayed level at 2^14–2^18 (two alternations, within 0.07×).
///
/// # Safety
/// AVX-512 F/BW/VBMI2, inlined into a function that enables them; room at `pi`.
#[inline(always)]
unsafe fn emit_sixteen(mm: u64, off: usize, pi: *mut u32) -> usize {
    // SAFETY: the caller's features and room.
    unsafe {
        let iota = _mm512_loadu_si512(BYTE_IOTA.as_ptr().cast());
        let low = _mm512_castsi512_si128(_mm512_maskz_compress_epi8(mm, iota));
        let base = off as i32;
        let n = mm.count_ones() as usize;
        let sixteen = _mm512_add_epi32(_mm512_cvtepu8_epi32(low), _mm512_set1_epi32(base));
        _mm512_storeu_si512(pi.cast(), sixteen);
        if n > 16 {
            let mut rest = mm;
            for _ in 0..16 {
                rest &= rest - 1;
            }
            let mut at = 16;
            while rest != 0 {
                pi.add(at)
                    .write((off + rest.trailing_zeros() as usize) as u32);
                at += 1;
                rest &= rest - 1;
            }
        }
        n
    }
}
