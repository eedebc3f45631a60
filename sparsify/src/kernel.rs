//! The CPU hot path shared by every selector: sampled threshold estimation, the fused
//! accumulate-compare-emit pass, read-only filter passes and exact selection among
//! candidates.
//!
//! Magnitudes are compared as integers: for a finite `f32`, `bits & 0x7fff_ffff` read as an
//! `i32` orders exactly like `|x|`, and every NaN or infinity maps above every finite
//! value. A threshold never exceeds [`INF_BITS`], so every non-finite value lands among
//! the candidates, which is how a NaN or infinity is found within the same pass at no cost.

use crate::spare::Spare;
use crate::{order, Error, Result};

/// Bit pattern of `+inf`; magnitudes at or above it are non-finite.
pub(crate) const INF_BITS: i32 = 0x7f80_0000;

/// Elements per unrolled block of the hot loops.
const BLOCK: usize = 16;

/// Magnitude of `x` as an order-preserving integer.
#[inline(always)]
pub(crate) fn abs_bits(x: f32) -> i32 {
    (x.to_bits() & 0x7fff_ffff) as i32
}

/// Candidates emitted by a pass, in increasing index order, plus the reusable buffers of
/// the parallel pieces that produced them.
#[derive(Debug, Default, Clone)]
pub(crate) struct Cand {
    pub idx: Vec<u32>,
    pub val: Vec<f32>,
    /// One candidate list per parallel piece (kept so a call allocates nothing in steady
    /// state).
    parts: Vec<Cand>,
    /// Per-[`CHUNK`] sums of `|x|` of a statistics pass.
    sums: Vec<f64>,
    /// Per-[`CHUNK`] [`moments_chunk`] of a [`fused_moments_split`] pass.
    moms: Vec<Moments>,
    /// After a [`fused_split`] pass over several pieces: how many of `parts` hold its
    /// candidates (0: they are in `idx`/`val`), and the input length each piece covers.
    split: usize,
    piece: usize,
    /// Buffers of recycled results, for the next result ([`Cand::take`] and the
    /// selections).
    pub spare: Spare,
    /// Whether the last batch of an [`EmitForm::Adaptive`] pass into this list used the
    /// branch-free form: the next pass starts from it.
    branch_free: bool,
    /// Whether the last batch of an [`EmitForm::Adaptive`] pass into this list chose the
    /// dense form for the next: the next pass starts from it.
    dense: bool,
    /// Whether the last branch-free batch of a pass into this list was dense enough in
    /// candidates to write sixteen indices per group unconditionally: the next starts from
    /// it.
    sixteen: bool,
    /// After a pass that zeroes its candidates (`ZERO`): the smallest magnitude bits it
    /// zeroed; the candidates below it kept their value in the residual (see
    /// [`fused_split`]).
    pub(crate) zeroed_from: i32,
    /// The strided sample the next fused pass into this list takes as it goes
    /// ([`Cand::sample_next_pass`]), and the one it took.
    sampling: Option<(usize, usize)>,
    sample: Sampler,
}

/// A strided sample taken by a fused pass as it goes: the magnitude bits of the
/// accumulated vector at `start + j·stride`, read batch by batch right after the pass wrote
/// them (still in the first-level cache). Reading them after the pass, a line of the piece
/// each, took 8 µs a piece at 2^20 and 76 µs at 2^22 (DGC's 1 % sample, pieces of 1 MiB and
/// 4 MiB on the 2-core VM): the pass had moved most of the piece out of the core's caches.
#[derive(Debug, Default, Clone)]
struct Sampler {
    /// Next position to sample (absolute), and the stride; 0: not sampling.
    next: usize,
    stride: usize,
    out: Vec<i32>,
}

impl Sampler {
    /// Starts a sample `(start, stride)` of a pass over the input from `base` (the first
    /// position at or past it), or stops sampling.
    fn begin(&mut self, base: usize, at: Option<(usize, usize)>) {
        self.out.clear();
        (self.next, self.stride) = match at {
            Some((start, stride)) if stride > 0 => {
                let ahead = base.saturating_sub(start).div_ceil(stride) * stride;
                (start + ahead, stride)
            }
            _ => (0, 0),
        };
    }
}

/// How the AVX-512 passes emit their candidates ([`set_emit_form`]). Every form emits the
/// same list; they differ in the branch taken per 64-element group.
///
/// The branch ("does the group hold a hit?") costs nothing when it is predicted and about
/// 15 cycles when it is not. At ρ = 0.001 about 1 group in 12 holds a hit and the branch
/// mostly predicts "no hit"; at ρ = 0.01 about half do and it is a coin toss on fresh
/// data. On the same input timed again and again the predictor learns the outcomes: a bench that reused
/// two gradients hid this cost at 2^14–2^18, which a fresh gradient per call shows (exact
/// top-k at 2^16, ρ = 0.01: 20.5 µs with the branch, 13.2 µs without, the floor 5.8 µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmitForm {
    /// Per batch of blocks (up to 128), the branch-free form when more than one in 64 of
    /// the last batch's groups held a hit (one in 4 for data from beyond a core's cache),
    /// else the branch; a candidate list starts from the form its last pass ended in. The
    /// default.
    #[default]
    Adaptive,
    /// Test each group and skip those without a hit.
    Branchy,
    /// Write each group's first two hits unconditionally, in one store (a slot without a
    /// hit is overwritten by the next write), and loop only past them.
    BranchFree,
    /// Compress each block's hits into the lists in the register (AVX-512 `vpcompressd`),
    /// with no branch on their number: the form for many hits (the AVX2 build, whose
    /// compression is a loop, emits branch-free instead).
    Dense,
}

/// The form every later pass of this process emits in (a diagnostic: the default,
/// [`EmitForm::Adaptive`], is the fastest measured; the others let a bench compare).
pub fn set_emit_form(form: EmitForm) {
    EMIT_FORM.store(form as u8, std::sync::atomic::Ordering::Relaxed);
}

/// The form set by [`set_emit_form`].
pub fn emit_form() -> EmitForm {
    match EMIT_FORM.load(std::sync::atomic::Ordering::Relaxed) {
        1 => EmitForm::Branchy,
        2 => EmitForm::BranchFree,
        3 => EmitForm::Dense,
        _ => EmitForm::Adaptive,
    }
}

static EMIT_FORM: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl Cand {
    pub fn clear(&mut self) {
        self.idx.clear();
        self.val.clear();
        self.split = 0;
    }
    /// Number of candidates, in `idx` or in the pieces of a split pass.
    pub fn len(&self) -> usize {
        if self.split > 0 {
            self.parts[..self.split].iter().map(|p| p.idx.len()).sum()
        } else {
            self.idx.len()
        }
    }
    /// Asks the next [`fused_split`] pass into this list to take the strided sample
    /// `(start, stride)` of the accumulated vector as it goes ([`Cand::sample_lists`]).
    pub fn sample_next_pass(&mut self, at: (usize, usize)) {
        self.sampling = Some(at);
    }

    /// The sample the last pass took, one part per list of [`Cand::lists`], in order; the
    /// magnitude bits of the accumulated vector (a position the pass zeroed read from its
    /// candidate).
    pub fn sample_lists(&self) -> impl Iterator<Item = &[i32]> {
        self.lists().0.iter().map(|l| &l.sample.out[..])
    }

    /// Takes the sample's positions below `base + to` from the range of the accumulated
    /// vector at `src` (its first element is position `base`); a zero is looked up among
    /// the candidates from list position `from` on (those of the range, which a zeroing
    /// pass zeroed). No-op when not sampling.
    ///
    /// # Safety
    /// `src` holds the range's elements up to `to`.
    #[inline]
    pub(crate) unsafe fn sample_upto(
        &mut self,
        src: *const f32,
        base: usize,
        to: usize,
        from: usize,
    ) {
        let Cand {
            sample, idx, val, ..
        } = self;
        if sample.stride == 0 {
            return;
        }
        while sample.next < base + to {
            // SAFETY: `base <= next < base + to`, within the range (the caller's promise).
            let m = abs_bits(unsafe { *src.add(sample.next - base) });
            let m = if m == 0 {
                match idx[from..].binary_search(&(sample.next as u32)) {
                    Ok(j) => abs_bits(val[from + j]),
                    Err(_) => 0,
                }
            } else {
                m
            };
            sample.out.push(m);
            sample.next += sample.stride;
        }
    }

    /// Joins the pieces of a split pass into the one list when they hold fewer than `max`
    /// candidates in all: selecting among a few thousand costs less in serial than a
    /// second hand-off to the pool.
    pub fn join_if_fewer(&mut self, max: usize) {
        if self.split == 0 || self.len() >= max {
            return;
        }
        let parts = std::mem::take(&mut self.parts);
        self.idx.clear();
        self.val.clear();
        for p in &parts[..self.split] {
            self.idx.extend_from_slice(&p.idx);
            self.val.extend_from_slice(&p.val);
        }
        self.parts = parts;
        self.split = 0;
    }

    /// Keeps the candidates of magnitude bits at or above `t`, joined into one list in
    /// index order (the pieces of a split pass included), in the buffers `into`; returns
    /// the buffers of the list replaced. Appends to `fixes` the candidates whose magnitude
    /// bits lie in `band.0`, with their value when `band.1` holds, else zero (DGC's
    /// residual writes after a pass that zeroed from another threshold). One vectorised
    /// scan of each piece's list: joining, then picking the band, then keeping, took three
    /// (18, 26 and 12 µs of a DGC step at 2^20, ρ = 0.01, on 16 700 candidates).
    pub fn keep_from(
        &mut self,
        t: i32,
        band: ((i32, i32), bool),
        into: (Vec<u32>, Vec<f32>),
        fixes: &mut (Vec<u32>, Vec<f32>),
    ) -> (Vec<u32>, Vec<f32>) {
        let mut kept = into;
        kept.0.clear();
        kept.1.clear();
        for l in self.lists().0 {
            keep_and_fix(&l.idx, &l.val, t, band, &mut kept, fixes);
        }
        self.split = 0;
        (
            std::mem::replace(&mut self.idx, kept.0),
            std::mem::replace(&mut self.val, kept.1),
        )
    }

    /// The candidate lists in index order, and the input length each covers (the `i`-th
    /// list holds indices of `i·piece .. (i+1)·piece`): the pieces of a split pass, or
    /// this one list covering everything.
    pub fn lists(&self) -> (&[Cand], usize) {
        if self.split > 0 {
            (&self.parts[..self.split], self.piece)
        } else {
            (std::slice::from_ref(self), usize::MAX)
        }
    }
    /// Moves the lists out (the piece buffers stay for the next call); the spare buffers,
    /// if any, become the candidate lists of the next pass.
    pub fn take(&mut self) -> (Vec<u32>, Vec<f32>) {
        let (idx, val) = self.spare.lists(0);
        (
            std::mem::replace(&mut self.idx, idx),
            std::mem::replace(&mut self.val, val),
        )
    }
}

/// What a pass saw besides its candidates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PassOut {
    /// More candidates than `cap` passed the threshold; the list is truncated.
    pub overflow: bool,
    /// First non-finite value (index, value), found in index order.
    pub non_finite: Option<(usize, f32)>,
    /// Sum of `|x|` in the order of [`abs_sum`] (statistics passes only).
    pub abs_sum: f64,
    /// Largest magnitude bits seen (statistics passes only): exact when some element
    /// reached the pass's threshold (it is then a candidate); otherwise some value below
    /// the threshold, since the vector builds take the maximum from the candidates.
    pub max_bits: i32,
}

impl PassOut {
    pub(crate) fn new() -> Self {
        PassOut {
            overflow: false,
            non_finite: None,
            abs_sum: 0.0,
            max_bits: 0,
        }
    }

    /// Folds the pass over the next range of the input into this one.
    pub(crate) fn merge(&mut self, o: &PassOut) {
        self.overflow |= o.overflow;
        if self.non_finite.is_none() {
            self.non_finite = o.non_finite;
        }
        self.abs_sum += o.abs_sum;
        self.max_bits = self.max_bits.max(o.max_bits);
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

/// Per-block statistics: lane `j` of `lanes` adds the block's `j`-th magnitude in f32
/// (one vector add per block, no dependency between blocks but the lane's own); see
/// [`abs_sum`] for the reference order.
#[inline(always)]
fn block_stats(bits: &[i32; BLOCK], lanes: &mut [f32; BLOCK], mxv: &mut [i32; BLOCK]) {
    for j in 0..BLOCK {
        lanes[j] += f32::from_bits(bits[j] as u32);
        mxv[j] = mxv[j].max(bits[j]);
    }
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

/// Makes room for a whole block at the end of both lists, growing geometrically.
#[inline(always)]
fn reserve_block(cand: &mut Cand, len: usize) {
    if cand.idx.capacity() - len < BLOCK || cand.val.capacity() - len < BLOCK {
        cand.idx.reserve(BLOCK.max(len));
        cand.val.reserve(BLOCK.max(len));
    }
}

#[cfg(target_arch = "x86_64")]
mod wide;

/// Emits the entries of one block whose magnitude bits reach `t`, in index order. The
/// common case (all finite, room for a whole block under `cap`) is branch-free: every
/// entry is written at the end of the lists and the length advances by the comparison's
/// outcome, so a block with hits costs no mispredicted branch per candidate.
#[inline(never)]
fn emit_block(
    vals: &[f32; BLOCK],
    bits: &[i32; BLOCK],
    off: usize,
    t: i32,
    cap: usize,
    cand: &mut Cand,
    out: &mut PassOut,
) {
    let len = cand.idx.len();
    let mx = bits.iter().copied().fold(0, i32::max);
    if mx >= INF_BITS || len + BLOCK > cap {
        for j in 0..BLOCK {
            if bits[j] >= t {
                emit(vals[j], bits[j], off + j, cap, cand, out);
            }
        }
        return;
    }
    reserve_block(cand, len);
    let pi = cand.idx.as_mut_ptr();
    let pv = cand.val.as_mut_ptr();
    let mut m = len;
    for j in 0..BLOCK {
        // SAFETY: `m < len + BLOCK <= capacity` of both vectors (ensured just above), so
        // the writes stay inside their allocations.
        unsafe {
            pi.add(m).write((off + j) as u32);
            pv.add(m).write(vals[j]);
        }
        m += usize::from(bits[j] >= t);
    }
    // SAFETY: positions `len..m` of both vectors were initialised just above (each
    // iteration writes position `m` before `m` can advance past it), within capacity.
    unsafe {
        cand.idx.set_len(m);
        cand.val.set_len(m);
    }
}

/// The fused error-feedback pass over `r` and `g` (same length, checked by the caller):
/// `r[i] += g[i]`, and every `i` with `|r[i]| >= t` is appended to `cand` with index
/// `base + i` (at most `cap` entries in `cand` in all). With `STATS`, also sums `|r[i]|`
/// (in the order of [`abs_sum`]) and tracks the largest magnitude. One read of `r` and
/// `g`, one write of `r`. The hit test of a block is an OR of comparisons (a mask test),
/// not a horizontal max, which would bound the loop on the shuffle port for cached data.
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
    let mut lanes = [0.0f32; BLOCK];
    let mut mx = 0i32;
    let mut mxv = [0i32; BLOCK];
    let n = r.len().min(g.len());
    let (r, g) = (&mut r[..n], &g[..n]);
    let mut rc = r.chunks_exact_mut(BLOCK);
    let mut gc = g.chunks_exact(BLOCK);
    let mut off = base;
    for (rb, gb) in (&mut rc).zip(&mut gc) {
        let rb: &mut [f32; BLOCK] = rb.try_into().expect("block");
        let gb: &[f32; BLOCK] = gb.try_into().expect("block");
        let mut bits = [0i32; BLOCK];
        let mut hit = 0u32;
        for j in 0..BLOCK {
            let a = rb[j] + gb[j];
            rb[j] = a;
            let ab = abs_bits(a);
            bits[j] = ab;
            hit |= u32::from(ab >= t);
        }
        if STATS {
            block_stats(&bits, &mut lanes, &mut mxv);
        }
        if hit != 0 {
            emit_block(rb, &bits, off, t, cap, cand, &mut out);
        }
        off += BLOCK;
    }
    let mut sum = f64::from(tree16(&lanes));
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
            sum += f64::from(f32::from_bits(ab as u32));
            mx = mx.max(ab);
        }
        if ab >= t {
            emit(a, ab, off + j, cap, cand, &mut out);
        }
    }
    out.abs_sum = sum;
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
    let mut lanes = [0.0f32; BLOCK];
    let mut mx = 0i32;
    let mut mxv = [0i32; BLOCK];
    let mut xc = x.chunks_exact(BLOCK);
    let mut off = base;
    for xb in &mut xc {
        let xb: &[f32; BLOCK] = xb.try_into().expect("block");
        let mut bits = [0i32; BLOCK];
        let mut hit = 0u32;
        for j in 0..BLOCK {
            let ab = abs_bits(xb[j]);
            bits[j] = ab;
            hit |= u32::from(ab >= t);
        }
        if STATS {
            block_stats(&bits, &mut lanes, &mut mxv);
        }
        if hit != 0 {
            emit_block(xb, &bits, off, t, cap, cand, &mut out);
        }
        off += BLOCK;
    }
    let mut sum = f64::from(tree16(&lanes));
    for (j, &a) in xc.remainder().iter().enumerate() {
        let ab = abs_bits(a);
        if STATS {
            sum += f64::from(f32::from_bits(ab as u32));
            mx = mx.max(ab);
        }
        if ab >= t {
            emit(a, ab, off + j, cap, cand, &mut out);
        }
    }
    out.abs_sum = sum;
    out.max_bits = mx.max(mxv.iter().copied().max().unwrap_or(0));
    out
}

/// `r[i] += g[i]`: the streaming floor of a fused pass.
#[inline(always)]
fn add_body(r: &mut [f32], g: &[f32]) {
    for (a, b) in r.iter_mut().zip(g) {
        *a += *b;
    }
}

/// Elements of one span of [`add_max_body`]: [`BLOCK`] lane groups of [`BLOCK`] elements.
pub(crate) const GROUP_SPAN: usize = BLOCK * BLOCK;

/// `r[i] += g[i]`, and for each span of [`GROUP_SPAN`] elements the [`BLOCK`] lane-wise
/// maxima of the accumulated magnitude bits: `maxes[s·16 + j]` is the largest
/// `abs_bits(r[s·256 + b·16 + j])` over the span's blocks `b`. Each lane is a group of 16
/// elements; the maxima cost one vector `max` per block (no horizontal reduction), and a
/// lane of the last span that holds no element gets `-1`. `maxes` has
/// `n.div_ceil(GROUP_SPAN) · BLOCK` entries. Returns the largest of them (`-1` when empty)
/// and, with `STATS`, the sum of the accumulated `|r[i]|` in the order of [`abs_sum`].
#[inline(always)]
fn add_max_body<const STATS: bool>(r: &mut [f32], g: &[f32], maxes: &mut [i32]) -> (i32, f64) {
    let n = r.len().min(g.len());
    let (r, g) = (&mut r[..n], &g[..n]);
    let mut rc = r.chunks_exact_mut(BLOCK);
    let mut gc = g.chunks_exact(BLOCK);
    let mut m = [0i32; BLOCK];
    let mut top = [-1i32; BLOCK];
    // `abs_sum`'s order: per chunk, f32 lanes over its blocks folded by a tree, chunks in
    // order.
    let mut total = 0.0f64;
    let mut lanes = [0.0f32; BLOCK];
    // One block at a time with the span boundary as a branch: written as a loop over the
    // 16 blocks of a span, it vectorises across blocks with gathers instead.
    for (b, (rb, gb)) in (&mut rc).zip(&mut gc).enumerate() {
        let rb: &mut [f32; BLOCK] = rb.try_into().expect("block");
        let gb: &[f32; BLOCK] = gb.try_into().expect("block");
        for j in 0..BLOCK {
            let a = rb[j] + gb[j];
            rb[j] = a;
            m[j] = m[j].max(abs_bits(a));
        }
        if STATS {
            for j in 0..BLOCK {
                lanes[j] += rb[j].abs();
            }
            if b % (CHUNK / BLOCK) == CHUNK / BLOCK - 1 {
                total += f64::from(tree16(&lanes));
                lanes = [0.0; BLOCK];
            }
        }
        if b % BLOCK == BLOCK - 1 {
            let at = b / BLOCK * BLOCK;
            maxes[at..at + BLOCK].copy_from_slice(&m);
            for j in 0..BLOCK {
                top[j] = top[j].max(m[j]);
            }
            m = [0; BLOCK];
        }
    }
    // The blocks of the last, partial chunk (none when `n` is a whole number of chunks);
    // its tail follows.
    let chunk = f64::from(tree16(&lanes));
    let (r, g) = (rc.into_remainder(), gc.remainder());
    total += add_max_end::<STATS>(r, g, n, m, maxes, &mut top, chunk);
    (top.iter().copied().fold(-1, i32::max), total)
}

/// The end of [`add_max_body`] (and of its AVX-512 build) after the whole blocks: adds the
/// elements past them (`r`, `g`: fewer than [`BLOCK`], of `n` in all) into the last,
/// partial span's lane maxima `m`, whose lanes that got no element become `-1`, writes
/// them and raises `top`. Returns what the last, partial chunk adds to the `|x|` sum
/// (`chunk`, the sum of its whole blocks, plus the tail's magnitudes), 0 without one.
#[inline(always)]
fn add_max_end<const STATS: bool>(
    r: &mut [f32],
    g: &[f32],
    n: usize,
    mut m: [i32; BLOCK],
    maxes: &mut [i32],
    top: &mut [i32; BLOCK],
    mut chunk: f64,
) -> f64 {
    let blocks = n / BLOCK;
    if !blocks.is_multiple_of(BLOCK) || !n.is_multiple_of(BLOCK) {
        let full = blocks % BLOCK;
        let tail = n % BLOCK;
        for (j, mj) in m.iter_mut().enumerate() {
            if full == 0 && j >= tail {
                *mj = -1;
            }
        }
        for (j, (a, b)) in r.iter_mut().zip(g).enumerate() {
            let v = *a + *b;
            *a = v;
            m[j] = m[j].max(abs_bits(v));
            if STATS {
                chunk += f64::from(v.abs());
            }
        }
        let at = blocks / BLOCK * BLOCK;
        maxes[at..at + BLOCK].copy_from_slice(&m);
        for j in 0..BLOCK {
            top[j] = top[j].max(m[j]);
        }
    }
    if STATS && !n.is_multiple_of(CHUNK) {
        chunk
    } else {
        0.0
    }
}

/// Number of entries of `x` at or above `t` (vectorises to a compare and a subtract).
#[inline(always)]
fn count_ge_body(x: &[i32], t: i32) -> usize {
    x.iter().fold(0u32, |a, &v| a + u32::from(v >= t)) as usize
}

/// How many of `vals` have magnitude bits at or above `t` (vectorises to a mask, a compare
/// and a subtract per register of values).
#[inline(always)]
fn count_vals_ge_body(vals: &[f32], t: i32) -> usize {
    vals.iter()
        .fold(0u32, |a, v| a + u32::from(abs_bits(*v) >= t)) as usize
}

/// Appends to `out` the magnitude bits of `vals` that lie in `lo..=hi`, in order. Sixteen
/// at a time: one test without a branch per element (a compare per register), and the
/// rare run that holds one picked out element by element.
#[inline(always)]
fn magnitudes_in_body(vals: &[f32], (lo, hi): (i32, i32), out: &mut Vec<i32>) {
    let inside = |v: &f32| (lo..=hi).contains(&abs_bits(*v));
    let mut runs = vals.chunks_exact(16);
    for run in &mut runs {
        if run.iter().fold(false, |any, v| any | inside(v)) {
            out.extend(run.iter().filter(|v| inside(v)).map(|v| abs_bits(*v)));
        }
    }
    let rest = runs.remainder().iter().filter(|v| inside(v));
    out.extend(rest.map(|v| abs_bits(*v)));
}

/// The histogram bucket of magnitude bits `m` over `t` (those below `t` count as `t`),
/// `shift` bits a bucket, the last one (`last`) open-ended.
#[inline(always)]
pub(crate) fn bucket_of(m: i32, (t, shift): (i32, u32), last: usize) -> usize {
    ((m.wrapping_sub(t).max(0) as u32 >> shift) as usize).min(last)
}

/// Adds to `hist` the count of `vals` per bucket ([`bucket_of`], the last one
/// `hist.len() - 1`). Sixty-four at a time: their buckets computed first (vectorised),
/// then counted one by one.
#[inline(always)]
fn histogram_body(vals: &[f32], at_t: (i32, u32), hist: &mut [u32]) {
    let Some(last) = hist.len().checked_sub(1) else {
        return;
    };
    let mut at = [0u32; 64];
    for run in vals.chunks(64) {
        for (a, v) in at.iter_mut().zip(run) {
            *a = bucket_of(abs_bits(*v), at_t, last) as u32;
        }
        for &j in &at[..run.len()] {
            hist[j as usize] += 1;
        }
    }
}

/// The hot loops compiled for one instruction set (the bodies are `inline(always)`, so
/// each build vectorises for its own registers).
macro_rules! isa_build {
    ($m:ident, $feat:literal) => {
        #[cfg(target_arch = "x86_64")]
        mod $m {
            use super::*;

            #[target_feature(enable = $feat)]
            pub(super) fn add(r: &mut [f32], g: &[f32]) {
                add_body(r, g)
            }

            /// [`add_body`] with a prefetch of both slices [`PREFETCH_AHEAD`] elements
            /// ahead, one per 64-byte line of each (as the fused passes that prefetch).
            #[target_feature(enable = $feat)]
            pub(super) fn add_far(r: &mut [f32], g: &[f32]) {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                let n = r.len().min(g.len());
                let (pr, pg) = (r.as_ptr(), g.as_ptr());
                let whole = n / GROUP_SPAN * GROUP_SPAN;
                for ((rc, gc), at) in r[..whole]
                    .chunks_exact_mut(GROUP_SPAN)
                    .zip(g[..whole].chunks_exact(GROUP_SPAN))
                    .zip((0..whole).step_by(GROUP_SPAN))
                {
                    for line in (0..GROUP_SPAN).step_by(BLOCK) {
                        let ahead = at + line + PREFETCH_AHEAD;
                        // A hint, never a fault: past the slices' end it touches nothing.
                        _mm_prefetch::<_MM_HINT_T0>(pr.wrapping_add(ahead).cast());
                        _mm_prefetch::<_MM_HINT_T0>(pg.wrapping_add(ahead).cast());
                    }
                    add_body(rc, gc);
                }
                add_body(&mut r[whole..n], &g[whole..n]);
            }

            /// [`moments_body`] with this build's vectors (the compiler keeps each sum's 32
            /// lanes in registers: two with AVX-512, four with AVX2).
            #[target_feature(enable = $feat)]
            pub(super) fn moments(x: &[f32]) -> (f64, f64) {
                moments_body(x)
            }

            #[target_feature(enable = $feat)]
            pub(super) fn count_ge(x: &[i32], t: i32) -> usize {
                count_ge_body(x, t)
            }

            #[target_feature(enable = $feat)]
            pub(super) fn count_vals_ge(vals: &[f32], t: i32) -> usize {
                count_vals_ge_body(vals, t)
            }

            #[target_feature(enable = $feat)]
            pub(super) fn histogram(vals: &[f32], at: (i32, u32), hist: &mut [u32]) {
                histogram_body(vals, at, hist)
            }
        }
    };
}
isa_build!(avx2, "avx2,popcnt,bmi1,bmi2,lzcnt");
isa_build!(avx512, "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt");

/// The widest instruction set this CPU has among those the hot loops are built for. Each
/// tier includes the scalar bit instructions that every CPU with its vectors has
/// (`popcnt`, `bmi1`, `bmi2`, `lzcnt`): without them a mask's `count_ones` compiled to a
/// table lookup in vector registers (an order statistic's compaction round over 229
/// magnitudes took 181 cycles, 87 with `popcnt`).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
    Base,
}

/// The tier of this CPU, detected once: every dispatch site asks, several per step, and the
/// detection tests seven features.
#[inline]
pub(crate) fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(detect_isa)
}

/// Whether the CPU has AVX-512 VBMI2 (with [`Isa::Avx512`]): the fused pass then writes
/// dense groups' indices by byte compression ([`wide`]'s `emit_sixteen`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn vbmi2() -> bool {
    static VBMI2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VBMI2.get_or_init(|| std::is_x86_feature_detected!("avx512vbmi2"))
}

fn detect_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        let bits = std::is_x86_feature_detected!("popcnt")
            && std::is_x86_feature_detected!("bmi1")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("lzcnt");
        if bits
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
        {
            return Isa::Avx512;
        }
        if bits && std::is_x86_feature_detected!("avx2") {
            return Isa::Avx2;
        }
    }
    Isa::Base
}

/// Calls `$f` from the widest build this CPU supports.
macro_rules! dispatch {
    ($f:ident $(::<$c:ident>)? ($($a:expr),*), $body:expr) => {{
        match isa() {
            // SAFETY: `isa()` checked at run time that the CPU has these features.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { avx512::$f$(::<$c>)?($($a),*) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2::$f$(::<$c>)?($($a),*) },
            _ => $body,
        }
    }};
}

/// [`fused_body`] on one range, from the widest build; then, while the range is still in
/// cache, writes [`moments_chunk`] of the accumulated range to `mom` when given, and with
/// `ZERO` zeroes in `r` the candidates this range added. `emit`: how the AVX-512 build
/// emits ([`EmitForm`]).
#[inline]
#[allow(clippy::too_many_arguments)]
fn fused_one<const STATS: bool, const ZERO: bool>(
    emit: EmitForm,
    (prefetch, far): (bool, bool),
    r: &mut [f32],
    g: &[f32],
    base: usize,
    (t, zero_from): (i32, i32),
    cap: usize,
    cand: &mut Cand,
    (mom, sums): (Option<&mut Moments>, Option<&mut [f64]>),
) -> PassOut {
    // With `ZERO` nothing is dropped at `cap`: every zeroed entry stays restorable.
    let cap = if ZERO { usize::MAX } else { cap };
    let tz = (t, zero_from);
    // With `mom`, the pass takes the moments of the accumulated range (one chunk) before
    // zeroing any of it: from the registers, and from the first-level cache for the
    // groups' blocks, before their values are read back and zeroed. Taking them after the
    // pass, with the candidates zeroed after that one scattered write each, cost 8 % of
    // a Gaussian-k step's samples at 2^20, ρ = 0.01.
    fused_any::<STATS, ZERO>(
        emit,
        (prefetch, far),
        r,
        g,
        base,
        tz,
        cap,
        cand,
        (sums, mom),
    )
}

/// Zeroes in `r` (which starts at index `base`) the candidates `idx`/`val` from magnitude
/// bits `zero_from` up ([`zeroed_from`]).
fn zero_candidates(r: &mut [f32], base: usize, idx: &[u32], val: &[f32], zero_from: i32) {
    for (&i, &v) in idx.iter().zip(val) {
        r[i as usize - base] = zeroed_from(v, zero_from);
    }
}

/// What a zeroing pass leaves in the residual for candidate value `v`: zero from magnitude
/// bits `zero_from` up, else `v`. Branch-free (a select compiled to a branch, which
/// mispredicts where `zero_from` splits the candidates): `v` masked by all ones or none.
#[inline(always)]
fn zeroed_from(v: f32, zero_from: i32) -> f32 {
    let keep = u32::from(abs_bits(v) < zero_from).wrapping_neg();
    f32::from_bits(v.to_bits() & keep)
}

/// [`fused_body`] on one range, from the widest build; `prefetch`: the vector builds
/// prefetch [`PREFETCH_AHEAD`] elements ahead (see there). With `ZERO`, the candidates with
/// magnitude bits from `zero_from` up are zeroed in `r`: by the vector builds as they read
/// each batch's values back (still in the first-level cache), by the portable one after.
/// `chunk_sums` (vector builds only, with `STATS`): the range spans whole chunks from its
/// start, and the pass writes each chunk's `|x|` sum there (see [`serial_chunks`]).
#[inline]
#[allow(clippy::too_many_arguments)]
fn fused_any<const STATS: bool, const ZERO: bool>(
    emit: EmitForm,
    (prefetch, far): (bool, bool),
    r: &mut [f32],
    g: &[f32],
    base: usize,
    tz: (i32, i32),
    cap: usize,
    cand: &mut Cand,
    (chunk_sums, mom): (Option<&mut [f64]>, Option<&mut Moments>),
) -> PassOut {
    let sums = (chunk_sums, mom);
    match isa() {
        // SAFETY: `isa()` checked at run time that the CPU has AVX-512 F/BW/VL, and
        // `vbmi2()` that it has VBMI2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if prefetch && vbmi2() => unsafe {
            wide::avx512v::fused::<STATS, true, ZERO>((emit, far), r, g, base, tz, cap, cand, sums)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if vbmi2() => unsafe {
            wide::avx512v::fused::<STATS, false, ZERO>((emit, far), r, g, base, tz, cap, cand, sums)
        },
        // SAFETY: `isa()` checked at run time that the CPU has AVX-512 F/BW/VL.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if prefetch => unsafe {
            wide::avx512::fused::<STATS, true, ZERO>((emit, far), r, g, base, tz, cap, cand, sums)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            wide::avx512::fused::<STATS, false, ZERO>((emit, far), r, g, base, tz, cap, cand, sums)
        },
        // SAFETY: `isa()` checked at run time that the CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if prefetch => unsafe {
            wide::avx2::fused::<STATS, true, ZERO>((emit, far), r, g, base, tz, cap, cand, sums)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe {
            wide::avx2::fused::<STATS, false, ZERO>((emit, far), r, g, base, tz, cap, cand, sums)
        },
        _ => {
            debug_assert!(sums.0.is_none(), "the portable body sums one chunk a call");
            let before = cand.len();
            let out = fused_body::<STATS>(r, g, base, tz.0, cap, cand);
            if let Some(m) = sums.1 {
                *m = moments_chunk(r);
            }
            if ZERO {
                zero_candidates(r, base, &cand.idx[before..], &cand.val[before..], tz.1);
            }
            // SAFETY: `r` holds the whole range.
            unsafe { cand.sample_upto(r.as_ptr(), base, r.len(), before) };
            out
        }
    }
}

/// Puts the recorded values of `cand` back into `residual` (undoing a `ZERO` pass).
pub(crate) fn restore(residual: &mut [f32], cand: &Cand) {
    for (&i, &v) in cand.idx.iter().zip(&cand.val) {
        residual[i as usize] = v;
    }
}

/// [`scan_body`] on one range, from the widest build.
#[inline]
pub(crate) fn scan_one<const STATS: bool>(
    x: &[f32],
    base: usize,
    t: i32,
    cap: usize,
    cand: &mut Cand,
) -> PassOut {
    match isa() {
        // SAFETY: `isa()` checked at run time that the CPU has AVX-512 F/BW/VL, and
        // `vbmi2()` that it has VBMI2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if vbmi2() => unsafe { wide::avx512v::scan::<STATS>(x, base, t, cap, cand) },
        // SAFETY: `isa()` checked at run time that the CPU has AVX-512 F/BW/VL.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { wide::avx512::scan::<STATS>(x, base, t, cap, cand) },
        // SAFETY: `isa()` checked at run time that the CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { wide::avx2::scan::<STATS>(x, base, t, cap, cand) },
        _ => scan_body::<STATS>(x, base, t, cap, cand),
    }
}

/// [`add_max_body`] from the widest build.
#[inline]
pub(crate) fn add_max_one<const STATS: bool>(
    r: &mut [f32],
    g: &[f32],
    maxes: &mut [i32],
) -> (i32, f64) {
    match isa() {
        // SAFETY: `isa()` checked at run time that the CPU has AVX-512 F/BW/VL, and
        // `vbmi2()` that it has VBMI2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if vbmi2() => unsafe { wide::avx512v::add_max::<STATS>(r, g, maxes) },
        // SAFETY: `isa()` checked at run time that the CPU has AVX-512 F/BW/VL.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { wide::avx512::add_max::<STATS>(r, g, maxes) },
        // SAFETY: `isa()` checked at run time that the CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { wide::avx2::add_max::<STATS>(r, g, maxes) },
        _ => add_max_body::<STATS>(r, g, maxes),
    }
}

/// [`count_ge_body`] from the widest build.
#[inline]
pub(crate) fn count_ge(x: &[i32], t: i32) -> usize {
    dispatch!(count_ge(x, t), count_ge_body(x, t))
}

/// [`count_vals_ge_body`] from the widest build.
#[inline]
pub(crate) fn count_vals_ge(vals: &[f32], t: i32) -> usize {
    dispatch!(count_vals_ge(vals, t), count_vals_ge_body(vals, t))
}

/// [`magnitudes_in_body`] from the widest build: the magnitude bits of `vals` in
/// `lo..=hi` appended to `out`. The portable build tested four values per instruction:
/// picking one histogram bucket's members out of 11 400 candidates took 8 µs on the
/// 2-core AVX-512 VM (exact top-k at 2^20, ρ = 0.01, on 2 threads).
#[inline]
pub(crate) fn magnitudes_in(vals: &[f32], range: (i32, i32), out: &mut Vec<i32>) {
    match isa() {
        // SAFETY: `isa()` checked at run time that the CPU has AVX-512F.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { band::avx512(vals, range, out) },
        // SAFETY: as above, AVX2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { band::avx2(vals, range, out) },
        _ => magnitudes_in_body(vals, range, out),
    }
}

/// [`histogram_body`] from the widest build: `hist[j]` gains the count of `vals` whose
/// magnitude bits are in bucket `j` ([`bucket_of`]).
#[inline]
pub(crate) fn histogram(vals: &[f32], (t, shift): (i32, u32), hist: &mut [u32]) {
    dispatch!(
        histogram(vals, (t, shift), hist),
        histogram_body(vals, (t, shift), hist)
    )
}

/// [`add_body`] from the widest build.
#[inline]
pub(crate) fn add_one(r: &mut [f32], g: &[f32]) {
    dispatch!(add(r, g), add_body(r, g))
}

/// [`moments_body`] from the widest build: the sum and sum of squares, in f64, of one
/// chunk or of a short `x` (a sample).
#[inline]
pub(crate) fn moments_chunk(x: &[f32]) -> Moments {
    dispatch!(moments(x), moments_body(x))
}

/// Elements per statistics chunk: a statistics pass sums `|x|` per chunk and adds the
/// chunk sums in index order, so the sum does not depend on how the pass was split among
/// threads (a multiple of [`BLOCK`]).
pub(crate) const CHUNK: usize = 1 << 12;

/// Passes over fewer elements run on the calling thread: below this, waking a second
/// thread costs about as much as it saves. Measured on the 2-core VM (fastest of 1001
/// error-feedback steps, ρ = 0.01, one thread against two): at 2^18 `stream` 24.8 against
/// 21.4 µs but exact top-k 37.6 against 38.6 µs; at 2^19 `stream` 51.6 against 54.0 µs and
/// exact 71.6 against 82.8 µs; at 2^20 two threads win (`stream` 129 against 190 µs). A
/// worker that has gone to sleep takes about 20 µs to wake there, which a pass of 2^18
/// elements (about 20 µs) cannot pay back.
pub(crate) const PAR_MIN: usize = 1 << 20;

/// Shortest piece of a parallel pass.
const PIECE_MIN: usize = 1 << 16;

/// Passes over this many elements or more prefetch ([`PREFETCH_AHEAD`]): their data
/// comes from beyond a core's cache.
const PREFETCH_MIN: usize = PAR_MIN;

/// How far ahead, in elements, a fused pass over data beyond the cache prefetches `r`
/// and `g` (one hint per 64-byte line of each). Why: the pass's compare and emission
/// keep fewer loads in flight than the plain `r += g` loop, and out of cache it ran
/// 1.2–1.3× that loop's time even with no candidate at all. On the 2-core Zen 3 VM at
/// 2^24, ρ = 0.01 (the threshold selector against `stream`, interleaved, caches flushed
/// between calls): 1.21–1.30× without, 1.07–1.15× at 1024–2048 ahead; prefetching the
/// plain loop the same way left it as fast as before; in cache (2^14–2^16) it slowed
/// the pass by 5–20 %, hence [`PREFETCH_MIN`].
///
/// Where the CPU has AVX-512, only the passes that also take the moments of each chunk
/// (Gaussian-k's) prefetch ([`prefetches`]).
pub(crate) const PREFETCH_AHEAD: usize = 2048;

/// Whether a pass over `n` elements prefetches ([`PREFETCH_AHEAD`]): the fused passes and
/// the floor alike ([`add_far_one`]); `moments`: the pass also takes the moments of each
/// chunk right after it.
///
/// Not on an AMD CPU with AVX-512 (Zen 4 and later) unless `moments`: on an AMD EPYC
/// (Zen 4, 2 threads) the hints cost more than they bring. Same process, cases
/// interleaved, 41 rounds, ratio to `stream` without / with them at ρ = 0.01: with no
/// candidate at all 1.00–1.02× / 1.08–1.25× (2^22–2^26); exact 1.14–1.36× / 1.26–1.44×,
/// MSTopK 1.17–1.35× / 1.32–1.50× (most pairs; a few the other way, within the noise). A
/// lean loop with the same loads, stores, compares and emission but no hint ran at
/// `stream`'s speed at 2^24, and 1.10–1.16× with the hints. Gaussian-k's pass, which
/// stops after each chunk to take its moments, ran faster with them in every pair
/// (1.93–2.81× / 2.11–3.03× at 2^22–2^26).
///
/// On an Intel Xeon with AVX-512 (the 2-core VM, 2 threads) they help every pass: the
/// step against the floor on the same residual (both without hints, then the selectors
/// with them), median over 101 rounds (31 at 2^24): at ρ = 0.01 the hard threshold
/// 1.32× → 1.06× (2^20), 1.40× → 1.13× (2^22), 1.37× → 1.10× (2^24); exact top-k 1.46× →
/// 1.17×, 1.53× → 1.18×, 1.45× → 1.14×; MSTopK 1.47× → 1.20×, 1.50× → 1.27×, 1.49× →
/// 1.21×; at ρ = 0.001 every one of them from 1.12–1.30× to 0.86–1.09×. Timed per piece
/// at 2^20 (exact, ρ = 0.01) a piece's pass took 100–137 µs without the hints and 80–100
/// µs with them, against the floor's 75–95 µs. The floor's own pass ran 5–10 % faster
/// with them too (2^22: 926 → 843 µs, 2^24: 5.18 → 4.94 ms), so it prefetches alike.
fn prefetches(n: usize, moments: bool) -> bool {
    n >= PREFETCH_MIN && (moments || prefetch_helps())
}

/// Whether this CPU's passes over data beyond its cache run faster with software
/// prefetches ([`prefetches`]): all but AMD's Zen 4 (family 19h) with AVX-512. Detected
/// once.
///
/// Zen 5 (family 1Ah, the 2-core AVX-512 EPYC VM) gains from them, unlike Zen 4. Hints
/// on against off (both builds emitting alike), step against the floor on the same
/// residual, each round after an untimed pass over that case's data, three alternations
/// of 201 rounds, ρ = 0.01: at 2^22 exact top-k 1.26–1.29× → 1.21–1.23×, MSTopK
/// 1.30–1.37× → 1.20–1.24×, the threshold selector 1.22–1.25× → 1.14–1.15×; at 2^20 and
/// 2^24 level to slightly ahead.
fn prefetch_helps() -> bool {
    static HELPS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HELPS.get_or_init(|| isa() != Isa::Avx512 || amd_family() != Some(0x19))
}

/// Whether an adaptive pass over data beyond a core's cache switches to the dense form
/// from [`wide`]'s `DENSE_ABOVE_STREAMED`, rather than its in-cache switch: all CPUs but
/// AMD's. On the Zen 5 the dense form lost to the branch-free one there, with the
/// prefetches or without: exact top-k at ρ = 0.01, 2^20 1.60–1.76× the floor against
/// 2.07–2.19×, 2^22 1.14–1.16× against 1.67–1.82× (with them; 1.24–1.27× against
/// 1.56–1.64× at 2^20 without).
pub(crate) fn dense_when_far() -> bool {
    static DENSE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DENSE.get_or_init(|| amd_family().is_none())
}

/// The CPU family (`cpuid` leaf 1, base plus extended family) when the CPU is AMD's.
fn amd_family() -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if amd() {
        // Leaf 1 exists on every x86-64 CPU.
        let eax = std::arch::x86_64::__cpuid(1).eax;
        let base = (eax >> 8) & 0xf;
        return Some(if base == 0xf {
            base + ((eax >> 20) & 0xff)
        } else {
            base
        });
    }
    None
}

/// Whether the CPU is AMD's (`cpuid` leaf 0 vendor "AuthenticAMD").
fn amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 0 exists on every x86-64 CPU.
        let id = std::arch::x86_64::__cpuid(0);
        // "Auth" "enti" "cAMD" in EBX, EDX, ECX.
        id.ebx == 0x6874_7541 && id.edx == 0x6974_6e65 && id.ecx == 0x444d_4163
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `r[i] += g[i]` over one piece of a pass over `n` elements in all: prefetching like the
/// fused passes over the same `n` ([`prefetches`]), so that the floor they are measured
/// against is the fastest streaming pass, not one that leaves the hints out.
pub(crate) fn add_far_one(r: &mut [f32], g: &[f32], n: usize) {
    if prefetches(n, false) {
        dispatch!(add_far(r, g), add_body(r, g))
    } else {
        add_one(r, g)
    }
}

/// Number of parallel pieces for a pass over `n` elements: 1 (serial) below [`PAR_MIN`] or
/// on a one-thread pool, else two per thread (so work stealing evens out a busy core), each
/// at least [`PIECE_MIN`] long.
pub(crate) fn pieces(n: usize) -> usize {
    // The length first: asking rayon for the pool's size costs a thread-local lookup,
    // which a short pass (most of them) need not pay.
    if n < PAR_MIN {
        return 1;
    }
    let threads = rayon::current_num_threads();
    if threads < 2 {
        1
    } else {
        (2 * threads).min(n / PIECE_MIN).max(1)
    }
}

/// Runs `f(i, &mut pieces[i])` for every piece on the rayon pool, each exactly once, the
/// calling thread included: every thread takes the next piece not yet taken until none is
/// left, and the caller then spins until the last one taken is done.
///
/// Why not a parallel iterator: its join put the caller to sleep when the other thread
/// finished last, and waking it took longer than the wait. On the 2-core Intel VM at 2^20
/// (four pieces, two threads; each piece timed from the call's start, medians of 401
/// rounds) the pool's second thread started 15–32 µs late (woken by the call), so it ended
/// last, and the call returned 25–74 µs after the last piece had ended: the floor's
/// `r += g` took 200–240 µs of which its pieces 140–180, exact top-k's pass 250 of which
/// 190. Here a thread woken late takes fewer pieces, and the caller's wait is at most what
/// is left of one piece, spent spinning.
///
/// A panic in `f` still counts its piece as done (so the caller's spin ends) and is
/// propagated by the scope.
pub(crate) fn run_pieces<T: Send>(pieces: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
    /// Longest spin before yielding: a few pieces of the smallest split pass.
    const SPIN: std::time::Duration = std::time::Duration::from_micros(200);
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    /// Counts a piece as done when dropped, unwinding included.
    struct Done<'a>(&'a AtomicUsize);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Release);
        }
    }
    let count = pieces.len();
    PHASE.fetch_add(1, Ordering::Relaxed);
    // Each piece behind a lock of its own, to hand it to another thread: every index is
    // taken by exactly one thread, so no lock is ever contended.
    let cells: smallvec::SmallVec<[Mutex<&mut T>; 16]> =
        pieces.iter_mut().map(Mutex::new).collect();
    let (next, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let take = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= count {
            break;
        }
        let _done = Done(&done);
        let mut piece = cells[i].lock().unwrap_or_else(|e| e.into_inner());
        f(i, &mut piece);
    };
    let helpers = rayon::current_num_threads().min(count).saturating_sub(1);
    rayon::scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| take());
        }
        take();
        // Every piece is taken; spin while another thread finishes its last one (a helper
        // that never started finds nothing left, and the scope runs it here at once). Past
        // `SPIN`, yield instead: on an oversubscribed machine (more ranks than cores) the
        // thread waited for may need this core.
        let start = std::time::Instant::now();
        while done.load(Ordering::Acquire) < count {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    });
    linger(helpers);
}

/// Counts the calls of [`run_pieces`]: a helper left awake by [`linger`] lets go when the
/// next call starts.
static PHASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Keeps `helpers` workers of the current pool awake for up to [`LINGER`] after a
/// parallel pass (each yields its core in a loop, as rayon's own idle loop does before it
/// sleeps), so that a pass that follows soon, such as the write after a split
/// selection's serial search for the k-th magnitude, hands its pieces to a running
/// thread. Asleep, the worker cost that pass a wake-up: the hand-off (0.9 µs on the
/// caller) and a late start of its pieces (exact top-k at 2^20, ρ = 0.01: the write's
/// pieces began 1.7–2.7 µs after the call, their four runs 2.3 µs each). On the 2-core
/// AVX-512 Xeon (timing program, fresh gradients, pool woken before each run, builds
/// alternating, median ratio to the floor per launch), without / with: exact top-k at
/// 2^20, ρ = 0.01 1.15–1.21× / 1.14–1.19× (six pairs) and 1.15–1.22× / 1.14–1.15× (four);
/// MSTopK 1.14–1.24× / 1.15–1.19×; at 2^24 exact 1.05–1.06× / 1.04–1.05×, MSTopK
/// 1.07–1.08× / 1.05–1.07×. A busy pool loses at most [`LINGER`] of one worker's time.
fn linger(helpers: usize) {
    use std::sync::atomic::Ordering;
    let phase = PHASE.load(Ordering::Relaxed);
    for _ in 0..helpers {
        rayon::spawn(move || {
            #[cfg(test)]
            tests::LINGERED.fetch_add(1, Ordering::Relaxed);
            let start = std::time::Instant::now();
            while PHASE.load(Ordering::Relaxed) == phase && start.elapsed() < LINGER {
                std::thread::yield_now();
            }
        });
    }
}

/// How long [`linger`] keeps a worker awake: a few of the serial steps between a
/// selection's passes (5 µs for exact top-k's at 2^20, ρ = 0.01).
const LINGER: std::time::Duration = std::time::Duration::from_micros(30);

/// Length of each of `np` pieces over `n` elements: a multiple of [`CHUNK`].
fn piece_len(n: usize, np: usize) -> usize {
    n.div_ceil(np).div_ceil(CHUNK).max(1) * CHUNK
}

/// One serial range of a pass: chunk by chunk when `split`, else in one go. With `STATS`,
/// each chunk's `|x|` sum goes to `sums` and the result folds them in order: in one call
/// where `one` folds them itself when handed `sums` (`folds`: the vector builds' fused
/// pass), else one call per chunk.
///
/// Why one call: a call per chunk cost MSTopK's step 0.06–0.07× `stream` at 2^14 on a
/// 2-core AVX-512 Intel VM (ρ = 0.01, fresh gradients, median ratio to `stream`, three
/// launches of each build in turn: 2.30–2.33× per chunk, 2.23–2.26× in one call) and
/// about 0.03× at 2^16 (2.03–2.05× against 1.98–2.04×).
fn serial_chunks<const STATS: bool>(
    n: usize,
    sums: &mut [f64],
    (split, folds): (bool, bool),
    mut one: impl FnMut(usize, usize, Option<&mut [f64]>) -> PassOut,
) -> PassOut {
    if !split && (!STATS || folds) {
        return one(0, n, STATS.then_some(sums));
    }
    let mut out = PassOut::new();
    // `sums` has one slot per chunk of this range.
    for (c, s) in sums.iter_mut().enumerate() {
        let lo = c * CHUNK;
        let o = one(lo, (lo + CHUNK).min(n), None);
        if STATS {
            *s = o.abs_sum;
        }
        out.merge(&o);
    }
    out
}

/// Appends the pieces' candidates to `cand` in order (at most `room` of them) and merges
/// their flags; the `|x|` sum is refolded from the per-chunk sums in index order, exactly
/// as the serial pass folds it.
///
/// With `keep_all` every piece's candidates are kept even past `room` (the overflow is
/// still flagged): a zeroing pass zeroed all of them in the residual, and the caller
/// restores them from the list.
fn gather(cand: &mut Cand, outs: &[PassOut], room: usize, keep_all: bool) -> PassOut {
    let (out, total) = merge_pieces(cand, outs, room);
    let mut left = if keep_all { usize::MAX } else { room };
    cand.idx.reserve_exact(total.min(left));
    cand.val.reserve_exact(total.min(left));
    let parts = std::mem::take(&mut cand.parts);
    for part in &parts[..outs.len()] {
        let m = part.len().min(left);
        cand.idx.extend_from_slice(&part.idx[..m]);
        cand.val.extend_from_slice(&part.val[..m]);
        left -= m;
    }
    cand.parts = parts;
    out
}

/// The flags of the pieces' passes merged in order, the overflow of their candidates
/// (more than `room` in all) and the `|x|` sum refolded from the per-chunk sums in index
/// order; also returns the number of candidates.
fn merge_pieces(cand: &Cand, outs: &[PassOut], room: usize) -> (PassOut, usize) {
    let mut out = PassOut::new();
    let mut total = 0usize;
    for (o, part) in outs.iter().zip(&cand.parts) {
        out.merge(o);
        total += part.len();
    }
    out.overflow |= total > room;
    out.abs_sum = cand.sums.iter().fold(0.0, |a, b| a + b);
    (out, total)
}

/// The fused error-feedback pass (see [`fused_body`]) over `r` and `g`, appending to
/// `cand` (at most `cap` entries in all). Split into chunked pieces over the rayon pool for
/// large inputs; the candidates, flags and statistics equal the serial pass's exactly.
///
/// With `ZERO`, every candidate the list records is also zeroed in `r` while it is still in
/// cache (by the vector builds as they read each batch's values back; by the portable one
/// after each chunk), the list holding its value: a threshold selector's
/// candidates are its selection, so this saves the scattered second write of the residual.
/// Past `cap` the list keeps everything (flagging the overflow) so that [`restore`] can
/// put every zeroed value back.
pub(crate) fn fused_pass<const STATS: bool, const ZERO: bool>(
    r: &mut [f32],
    g: &[f32],
    base: usize,
    t: i32,
    cap: usize,
    cand: &mut Cand,
) -> PassOut {
    let post = None::<(_, fn(&Cand, &mut ()))>;
    fused_impl::<STATS, ZERO, false, ()>(r, g, base, (t, 0), cap, cand, post)
}

/// [`fused_pass`] from index 0 into an empty `cand` that, when split over several pieces,
/// leaves each piece's candidates in its own list ([`Cand::lists`]) instead of gathering
/// them into one, and runs `post` on each list with its scratch (`post[i]` for the `i`-th
/// list) in the piece's own task, while its candidates are still in cache (`post` runs
/// only on the pieces of a split pass, never on the one list of a serial one): the selection
/// among them then runs per piece too ([`crate::split`]). Each piece keeps at most `cap`
/// candidates (all of them with `ZERO`); the overflow flag is that of the whole.
///
/// With `ZERO`, the pass zeroes in `r` only the candidates with magnitude bits
/// `>= zero_from` (every one for `zero_from <= t`), and records it in the lists
/// ([`Cand::zeroed_from`]). Why: the selection then zeroes the ones it takes below it and
/// puts back the ones it drops above it, scattered writes into a residual that has left
/// the cache; with `zero_from` at the last call's k-th magnitude those are only the
/// candidates between the last and this k-th magnitude, not every one it drops.
pub(crate) fn fused_split<const STATS: bool, const ZERO: bool, P: Send + Default>(
    r: &mut [f32],
    g: &[f32],
    (t, zero_from): (i32, i32),
    cap: usize,
    cand: &mut Cand,
    post: (&mut Vec<P>, impl Fn(&Cand, &mut P) + Sync + Send),
) -> PassOut {
    cand.clear();
    fused_impl::<STATS, ZERO, false, P>(r, g, 0, (t, zero_from), cap, cand, Some(post))
}

/// [`fused_split`] with `ZERO` that also returns the sum and sum of squares of the
/// accumulated vector exactly as [`moments`] computes them (per [`CHUNK`], each chunk while
/// it is in cache and before its candidates are zeroed): the statistics and the candidates
/// of a Gaussian-k step in one pass. Zeroes only the candidates from `zero_from` up, as
/// [`fused_split`] does.
pub(crate) fn fused_moments_split(
    r: &mut [f32],
    g: &[f32],
    (t, zero_from): (i32, i32),
    cand: &mut Cand,
) -> (PassOut, (f64, f64)) {
    cand.clear();
    // Nothing to run per piece: a list of `()` allocates nothing.
    let post = (&mut Vec::new(), |_: &Cand, _: &mut ()| {});
    let tz = (t, zero_from);
    let out = fused_impl::<false, true, true, ()>(r, g, 0, tz, usize::MAX, cand, Some(post));
    let (s, q) = cand
        .moms
        .iter()
        .fold((0.0f64, 0.0f64), |(s, q), m| (s + m.0, q + m.1));
    (out, (s, q))
}

/// What a split pass runs on each piece's list after the pass: its scratch per piece and
/// the function.
type Post<'a, P, F> = Option<(&'a mut Vec<P>, F)>;

fn fused_impl<const STATS: bool, const ZERO: bool, const MOM: bool, P: Send + Default>(
    r: &mut [f32],
    g: &[f32],
    base: usize,
    (t, zero_from): (i32, i32),
    cap: usize,
    cand: &mut Cand,
    post: Post<'_, P, impl Fn(&Cand, &mut P) + Sync + Send>,
) -> PassOut {
    let t = t.min(INF_BITS);
    let tz = (t, zero_from);
    cand.zeroed_from = zero_from;
    let sampling = cand.sampling.take();
    let n = r.len().min(g.len());
    let (r, g) = (&mut r[..n], &g[..n]);
    let emit = emit_form();
    // Whether to prefetch, and whether the data comes from beyond a core's cache.
    let far = (prefetches(n, MOM), n >= PREFETCH_MIN);
    let mut sums = std::mem::take(&mut cand.sums);
    sums.clear();
    sums.resize(n.div_ceil(CHUNK), 0.0);
    let mut moms = std::mem::take(&mut cand.moms);
    moms.resize(n.div_ceil(CHUNK), (0.0, 0.0));
    // Chunk by chunk where something runs on each chunk while it is in cache: the moments,
    // or the zeroing of the portable build (the vector builds zero as they go). A pass in
    // one go is faster: exact top-k at 2^14, ρ = 0.01, took 2.70× `stream` chunked against
    // 2.55× in one go on the 2-core Zen 3 VM (6 alternated launches).
    let chunked = MOM || (ZERO && isa() == Isa::Base);
    // The vector builds fold the chunks' `|x|` sums within one call ([`serial_chunks`]).
    let folds = isa() != Isa::Base;
    let np = pieces(n);
    if np == 1 {
        cand.sample.begin(base, sampling);
        let before = cand.len();
        let mut out = serial_chunks::<STATS>(n, &mut sums, (chunked, folds), |lo, hi, s| {
            let m = moms.get_mut(lo / CHUNK).filter(|_| MOM);
            fused_one::<STATS, ZERO>(
                emit,
                far,
                &mut r[lo..hi],
                &g[lo..hi],
                base + lo,
                tz,
                cap,
                cand,
                (m, s),
            )
        });
        out.overflow |= cand.len() - before > cap.saturating_sub(before);
        cand.sums = sums;
        cand.moms = moms;
        cand.sample.stride = 0;
        return out;
    }
    let len = piece_len(n, np);
    let room = cap.saturating_sub(cand.len());
    let count = n.div_ceil(len);
    if cand.parts.len() < count {
        cand.parts.resize_with(count, Cand::default);
    }
    let per = len / CHUNK;
    let split = post.is_some();
    let (ps, f) = match post {
        Some((ps, f)) => (Some(ps), Some(f)),
        None => (None, None),
    };
    // Without `post`, `P` is `()`: a list of them allocates nothing.
    let mut none: Vec<P> = Vec::new();
    let ps = ps.unwrap_or(&mut none);
    if ps.len() < count {
        ps.resize_with(count, P::default);
    }
    let mut work: smallvec::SmallVec<[_; 16]> = r
        .chunks_mut(len)
        .zip(g.chunks(len))
        .zip(cand.parts.iter_mut())
        .zip(sums.chunks_mut(per))
        .zip(moms.chunks_mut(per))
        .zip(ps.iter_mut())
        .map(|(((((rp, gp), part), sp), mp), p)| (rp, gp, part, sp, mp, p, PassOut::new()))
        .collect();
    run_pieces(&mut work, |i, (rp, gp, part, sp, mp, p, out)| {
        part.clear();
        part.zeroed_from = zero_from;
        let b = base + i * len;
        part.sample.begin(b, sampling);
        *out = serial_chunks::<STATS>(rp.len(), sp, (chunked, folds), |lo, hi, s| {
            let m = mp.get_mut(lo / CHUNK).filter(|_| MOM);
            let (rc, gc) = (&mut rp[lo..hi], &gp[lo..hi]);
            fused_one::<STATS, ZERO>(emit, far, rc, gc, b + lo, tz, room, part, (m, s))
        });
        part.sample.stride = 0;
        if let Some(f) = &f {
            f(part, p);
        }
    });
    let outs: smallvec::SmallVec<[PassOut; 16]> = work.iter().map(|w| w.6).collect();
    drop(work);
    cand.sums = sums;
    cand.moms = moms;
    if split {
        (cand.split, cand.piece) = (count, len);
        return merge_pieces(cand, &outs, room).0;
    }
    gather(cand, &outs, room, ZERO)
}

/// Read-only filter pass over `x`, parallel like [`fused_pass`].
pub(crate) fn scan_pass<const STATS: bool>(
    x: &[f32],
    base: usize,
    t: i32,
    cap: usize,
    cand: &mut Cand,
) -> PassOut {
    let t = t.min(INF_BITS);
    let n = x.len();
    let mut sums = std::mem::take(&mut cand.sums);
    sums.clear();
    sums.resize(n.div_ceil(CHUNK), 0.0);
    let np = pieces(n);
    if np == 1 {
        let out = serial_chunks::<STATS>(n, &mut sums, (false, false), |lo, hi, _| {
            scan_one::<STATS>(&x[lo..hi], base + lo, t, cap, cand)
        });
        cand.sums = sums;
        return out;
    }
    use rayon::prelude::*;
    let len = piece_len(n, np);
    let room = cap.saturating_sub(cand.len());
    let count = n.div_ceil(len);
    if cand.parts.len() < count {
        cand.parts.resize_with(count, Cand::default);
    }
    let per = len / CHUNK;
    let outs: Vec<PassOut> = x
        .par_chunks(len)
        .zip(cand.parts.par_iter_mut())
        .zip(sums.par_chunks_mut(per))
        .enumerate()
        .map(|(i, ((xp, part), sp))| {
            part.clear();
            let b = base + i * len;
            serial_chunks::<STATS>(xp.len(), sp, (false, false), |lo, hi, _| {
                scan_one::<STATS>(&xp[lo..hi], b + lo, t, room, part)
            })
        })
        .collect();
    cand.sums = sums;
    gather(cand, &outs, room, false)
}

/// Lists shorter than this are zeroed on the calling thread by [`zero_at`].
const PAR_ZERO: usize = 1 << 15;

/// Zeroes `residual[i]` for every `i` of the increasing list `idx` (out-of-range indices
/// are skipped), in parallel pieces of the residual for long lists.
pub(crate) fn zero_at(residual: &mut [f32], idx: &[u32]) {
    let np = if idx.len() < PAR_ZERO {
        1
    } else {
        pieces(residual.len())
    };
    if np == 1 {
        for &i in idx {
            if let Some(r) = residual.get_mut(i as usize) {
                *r = 0.0;
            }
        }
        return;
    }
    use rayon::prelude::*;
    let len = piece_len(residual.len(), np);
    residual
        .par_chunks_mut(len)
        .enumerate()
        .for_each(|(p, rp)| {
            let lo = (p * len) as u64;
            let a = idx.partition_point(|&i| u64::from(i) < lo);
            let b = idx.partition_point(|&i| u64::from(i) < lo + rp.len() as u64);
            for &i in &idx[a..b] {
                rp[(u64::from(i) - lo) as usize] = 0.0;
            }
        });
}

/// Sample layout: runs of `RUN` contiguous elements at a regular stride, so a sample
/// touches few cache lines per element read.
const RUN: usize = 16;

/// Number of sample elements to read for a top-`k` estimate over `d`, or `None` when the
/// input is too small for sampling to pay (then filter with threshold 0).
///
/// A sample of `n` puts about `z·sqrt(k·d/n) + d/n` more candidates than `k` above its threshold
/// (see [`threshold_from_sample`]). Each sample element costs a gather and a selection step, each
/// surplus candidate an emit and a selection step; the total is smallest near `n ≈ c·(k·d)^(1/3)`
/// (`c = 4` measured best here), far below a fixed hit count (`n ∝ d/k`), which made the sample the
/// largest cost of a call at low densities.
pub(crate) fn sample_size(d: usize, k: usize) -> Option<usize> {
    if d < 1 << 12 || k == 0 {
        return None;
    }
    let n = 4.0 * (k as f64 * d as f64).cbrt();
    Some((n as usize).clamp(RUN * 16, d / 8) / RUN * RUN)
}

/// Positions of the sample runs: `runs` starts at a regular stride over `d`.
fn run_starts(d: usize, n: usize) -> impl Iterator<Item = usize> + Clone {
    runs_of(d, n, RUN)
}

/// Starts of the runs of `len` contiguous elements (about `n` in all) at a regular stride
/// over `d`.
fn runs_of(d: usize, n: usize, len: usize) -> impl Iterator<Item = usize> + Clone {
    let runs = (n / len).max(1);
    let stride = (d / runs).max(len);
    (0..runs)
        .map(move |b| b * stride)
        .filter(move |&s| s + len <= d)
}

/// Calls `f` with the pieces of [`RUN`] elements of `r` and `g` at the sample positions of
/// runs of `lines` pieces each ([`runs_of`]), in order.
///
/// The runs lie a stride of `d / runs` apart, beyond what the hardware prefetchers follow,
/// so each run would wait for its lines in turn: the lines of the run
/// [`SAMPLE_AHEAD`] runs on are requested first.
fn sample_runs(
    (r, g): (&[f32], &[f32]),
    n: usize,
    lines: usize,
    mut f: impl FnMut(&[f32; RUN], &[f32; RUN]),
) {
    let d = r.len().min(g.len());
    let starts = runs_of(d, n, lines * RUN);
    let mut ahead = starts.clone().skip(SAMPLE_AHEAD);
    for s in starts {
        if let Some(a) = ahead.next() {
            for l in 0..lines {
                hint::<READ>(r[a + l * RUN..].as_ptr());
                hint::<READ>(g[a + l * RUN..].as_ptr());
            }
        }
        for p in (s..s + lines * RUN).step_by(RUN) {
            f(
                r[p..p + RUN].try_into().expect("run"),
                g[p..p + RUN].try_into().expect("run"),
            );
        }
    }
}

/// How many runs ahead [`sample_runs`] requests its lines.
const SAMPLE_AHEAD: usize = 16;

/// [`hint`] for reading, into every cache level (`_MM_HINT_T0`).
const READ: i32 = 3;
/// [`hint`] for writing (`_MM_HINT_ET0`: `prefetchw`, a no-op on CPUs without it).
const WRITE: i32 = 7;

/// A prefetch of the line at `p` ([`READ`] or [`WRITE`]): a hint, never a fault.
#[inline(always)]
fn hint<const HINT: i32>(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints; SSE is in every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<HINT>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Writes `x[i] = v` for every `(i, v)` of `writes`, asking for each line a few writes
/// ahead. Why: the stores commit in order, each waiting for its line; where the lines were
/// last written by another core (a split pass's pieces) that wait is a round trip each.
/// DGC's fix-ups after a pass that sampled (about 900 at 2^20, ρ = 0.01) took 96 µs one
/// store after another.
pub(crate) fn write_at(x: &mut [f32], (idx, val): (&[u32], &[f32])) {
    const AHEAD: usize = 16;
    for (j, (&i, &v)) in idx.iter().zip(val).enumerate() {
        if let Some(&a) = idx.get(j + AHEAD) {
            hint::<WRITE>(x.as_ptr().wrapping_add(a as usize));
        }
        x[i as usize] = v;
    }
}

/// Magnitude bits of `r[i] + g[i]` at the sample positions (nothing is written).
pub(crate) fn sample_acc(r: &[f32], g: &[f32], n: usize, out: &mut Vec<i32>) {
    out.clear();
    sample_runs((r, g), n, 1, |a, b| {
        // A whole run at once (fixed length, so it vectorises; one push per element did
        // not).
        let mut m = [0i32; RUN];
        for j in 0..RUN {
            m[j] = abs_bits(a[j] + b[j]);
        }
        out.extend_from_slice(&m);
    });
}

/// Magnitude bits of `r[i] + g[i]` (of `r[i]` alone when `g` is `None`) at `start`,
/// `start + stride`, … below the length, into `out`.
///
/// Each sample is a line of its own once the stride passes 16, and at DGC's stride of 96
/// a page of its own every ten samples: on the 2-core VM (4 KiB pages) DGC's 1 % sample
/// took 110–120 µs of a step at 2^20, a plain strided loop as long. Neither prefetching
/// 32 samples ahead nor two threads (a worker woken for it) made it faster there.
pub(crate) fn sample_strided(
    r: &[f32],
    g: Option<&[f32]>,
    (start, stride): (usize, usize),
    out: &mut Vec<i32>,
) {
    out.clear();
    let d = g.map_or(r.len(), |g| r.len().min(g.len()));
    let stride = stride.max(1);
    if start >= d {
        return;
    }
    out.reserve((d - start).div_ceil(stride));
    match g {
        Some(g) => out.extend((start..d).step_by(stride).map(|i| abs_bits(r[i] + g[i]))),
        None => out.extend((start..d).step_by(stride).map(|i| abs_bits(r[i]))),
    }
}

/// Values of `r[i] + g[i]` at about `n` positions in runs of `lines` lines (nothing is
/// written).
pub(crate) fn sample_vals(r: &[f32], g: &[f32], n: usize, lines: usize, out: &mut Vec<f32>) {
    out.clear();
    sample_runs((r, g), n, lines, |a, b| {
        let mut m = [0f32; RUN];
        for j in 0..RUN {
            m[j] = a[j] + b[j];
        }
        out.extend_from_slice(&m);
    });
}

/// Magnitude bits of `x[i]` at the sample positions.
pub(crate) fn sample_x(x: &[f32], n: usize, out: &mut Vec<i32>) {
    out.clear();
    for s in run_starts(x.len(), n) {
        out.extend(x[s..s + RUN].iter().map(|v| abs_bits(*v)));
    }
}

/// Samples of at least this many elements are gathered and selected in two halves in
/// parallel (on a pool of several threads).
const PAR_SAMPLE: usize = 1 << 15;

/// [`sample_acc`] with `n` and [`threshold_from_sample`] on it: (threshold, sample
/// length). A large sample is gathered in two halves in parallel, each keeping its `m`
/// largest, and the threshold is the `m`-th largest of those: the same value as from the
/// whole sample.
pub(crate) fn sampled_threshold(
    r: &[f32],
    g: &[f32],
    n: usize,
    k: usize,
    z: f64,
    bufs: (&mut Vec<i32>, &mut Vec<i32>),
) -> (i32, usize) {
    let d = r.len().min(g.len());
    let (a, b) = bufs;
    if n < PAR_SAMPLE || pieces(d) == 1 {
        sample_acc(r, g, n, a);
        let len = a.len();
        return (threshold_from_sample(a, d, k, z), len);
    }
    let runs = run_starts(d, n).count();
    let len = runs * RUN;
    let Some(m) = sample_rank(len, d, k, z) else {
        return (0, len);
    };
    let half = |skip: usize, take: usize, out: &mut Vec<i32>| {
        out.clear();
        for s in run_starts(d, n).skip(skip).take(take) {
            out.extend(
                r[s..s + RUN]
                    .iter()
                    .zip(&g[s..s + RUN])
                    .map(|(x, y)| abs_bits(*x + *y)),
            );
        }
        if out.len() > m {
            // Everything at or above the half's `m`-th largest holds the union's `m`
            // largest (ties at it may add a few, which leaves the union's `m`-th as it is).
            let kth = order::kth_largest(out, m);
            out.retain(|&x| x >= kth);
        }
    };
    let h = runs / 2;
    rayon::join(|| half(0, h, a), || half(h, runs - h, b));
    a.extend_from_slice(b);
    (order::kth_largest(a, m).min(INF_BITS), len)
}

/// The rank from the top, `k·n/d + z·sqrt(k·n/d) + 1`, of the threshold
/// [`threshold_from_sample`] takes from a sample of `n`; `None` when it is not below `n`.
fn sample_rank(n: usize, d: usize, k: usize, z: f64) -> Option<usize> {
    if n == 0 || d == 0 {
        return None;
    }
    let hits = k as f64 * n as f64 / d as f64;
    let m = (hits + z * hits.sqrt() + 1.0).ceil() as usize;
    (m < n).then_some(m)
}

/// A threshold that, with high probability, keeps at least `k` of `d` elements while
/// keeping few more: the sample's order statistic `k·n/d + z·sqrt(k·n/d) + 1` from the top.
pub(crate) fn threshold_from_sample(sample: &mut [i32], d: usize, k: usize, z: f64) -> i32 {
    let n = sample.len();
    let Some(m) = sample_rank(n, d, k, z) else {
        return 0;
    };
    order::kth_largest(sample, m).min(INF_BITS)
}

/// Cap on the candidates of a pass whose threshold came from [`threshold_from_sample`]
/// with a sample of `n` and margin `z`: four times the expected count (so only a badly
/// misjudged sample overflows), and never below `3k` or `k + 4096`.
pub(crate) fn candidate_cap(d: usize, k: usize, n: usize, z: f64) -> usize {
    let hits = k as f64 * n as f64 / d as f64;
    let m = (hits + z * hits.sqrt() + 1.0).ceil();
    let expect = (d as f64 * m / n.max(1) as f64) as usize;
    expect
        .saturating_mul(4)
        .max(k.saturating_mul(3))
        .max(k + 4096)
}

/// The exactly `k` best candidates (largest magnitude, the lower index on ties), kept in
/// index order. Requires `k <= cand.len()`. Selects on the 32-bit magnitudes and then takes
/// the first ties in index order, which is the same set as selecting on
/// (magnitude, −index) keys at half the memory traffic.
/// The result goes into the candidates' spare buffers ([`Cand::spare`]) where they fit.
pub(crate) fn select_k_of(cand: &mut Cand, k: usize, scratch: &mut Vec<i32>) -> Kept {
    let n = cand.len();
    if k >= n {
        let (mut idx, mut val) = cand.spare.lists(n);
        idx.extend_from_slice(&cand.idx);
        val.extend_from_slice(&cand.val);
        let min = val.iter().map(|v| abs_bits(*v)).min().unwrap_or(0);
        return (idx, val, min);
    }
    if k == 0 {
        return (Vec::new(), Vec::new(), 0);
    }
    let kth = kth_magnitude(&cand.val, k, scratch);
    keep_k_from(cand, kth, k)
}

/// [`select_k_of`] given a guess `near` of where the `k`-th magnitude lies
/// ([`order::kth_largest_near`]); the same selection.
pub(crate) fn select_k_near(
    cand: &mut Cand,
    k: usize,
    scratch: &mut Vec<i32>,
    near: Option<(i32, i32)>,
) -> Kept {
    let Some(near) = near.filter(|_| 0 < k && k < cand.len()) else {
        return select_k_of(cand, k, scratch);
    };
    scratch.clear();
    scratch.extend(cand.val.iter().map(|v| abs_bits(*v)));
    let kth = order::kth_largest_near(scratch, k, near);
    keep_k_from(cand, kth, k)
}

/// The `k` candidates kept at the `k`-th magnitude `kth`: all above it, then its ties in
/// index order ([`keep_top`]), into the candidates' spare buffers; `kth` is the smallest
/// of them.
fn keep_k_from(cand: &mut Cand, kth: i32, k: usize) -> Kept {
    let out = cand.spare.lists(cand.len() + BLOCK);
    let (idx, val) = keep_top(&cand.idx, &cand.val, kth, k, out);
    (idx, val, kth)
}

/// A selection: the kept indices and values, in index order, and the smallest kept
/// magnitude as bits (0 when none is kept), which the result reports as its threshold.
/// Known to the selection, it saves a pass over the values to find it again (at 2^16,
/// ρ = 0.01 that pass took 0.15 µs of a 5.2 µs step).
pub(crate) type Kept = (Vec<u32>, Vec<f32>, i32);

/// The exact top `k` (`0 < k < r.len()`) of `r += g`, for a tensor too short to sample
/// ([`sample_size`]): the sum first, then [`exact_by_kth`]. Nothing is zeroed; `r` keeps
/// the sum, also when a non-finite entry is reported.
///
/// Why: filtering from threshold 0 listed every element and then selected among all of
/// them; on the 2-core Zen 3 VM at 2^11 elements, ρ = 0.05, a step took 11.2–11.5 µs
/// (about 40× `stream`), most of it in listing 2048 candidates; this way 4.5–4.8 µs
/// (2^10: 6.0 → 2.5 µs; 2^8: 1.8 → 0.9 µs).
pub(crate) fn exact_small(
    r: &mut [f32],
    g: &[f32],
    k: usize,
    cand: &mut Cand,
    scratch: &mut Vec<i32>,
) -> Result<Kept> {
    add_one(r, g);
    exact_by_kth(r, k, cand, scratch)
}

/// The exact top `k` (`0 < k < x.len()`) of `x` without a threshold to start from: the
/// `k`-th magnitude among all of them, then one read-only pass that lists only the entries
/// at or above it.
fn exact_by_kth(x: &[f32], k: usize, cand: &mut Cand, scratch: &mut Vec<i32>) -> Result<Kept> {
    let kth = kth_magnitude(x, k, scratch);
    cand.clear();
    // A non-finite entry's magnitude is at least `INF_BITS`, so at or above `kth` unless
    // `k` larger ones are non-finite too: the pass reports the first one either way.
    scan_pass::<false>(x, 0, kth, usize::MAX, cand).check()?;
    Ok(keep_k_from(cand, kth, k))
}

/// The `m`-th largest magnitude bits of `x` (`1 <= m <= x.len()`), through `scratch`.
pub(crate) fn kth_magnitude(x: &[f32], m: usize, scratch: &mut Vec<i32>) -> i32 {
    scratch.clear();
    scratch.extend(x.iter().map(|v| abs_bits(*v)));
    order::kth_largest(scratch, m)
}

/// Appends to `kept` the entries of `idx`/`val` of magnitude bits at or above `t`, and to
/// `fixes` those in `lo..=hi`, with their value when `restore`, else zero; both in order.
/// The whole blocks with AVX-512 ([`avx512_keep::keep_and_fix`]), the rest one by one.
pub(crate) fn keep_and_fix(
    idx: &[u32],
    val: &[f32],
    t: i32,
    ((lo, hi), restore): ((i32, i32), bool),
    kept: &mut (Vec<u32>, Vec<f32>),
    fixes: &mut (Vec<u32>, Vec<f32>),
) {
    let n = idx.len().min(val.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 {
        for v in [&mut kept.0, &mut fixes.0] {
            v.reserve(n + BLOCK);
        }
        for v in [&mut kept.1, &mut fixes.1] {
            v.reserve(n + BLOCK);
        }
        // SAFETY: AVX-512 checked by `isa`; every list has room for `n + BLOCK` more.
        done = unsafe { avx512_keep::keep_and_fix(idx, val, t, ((lo, hi), restore), kept, fixes) };
    }
    for (&i, &v) in idx[done..n].iter().zip(&val[done..n]) {
        let m = abs_bits(v);
        if m >= t {
            kept.0.push(i);
            kept.1.push(v);
        }
        if (lo..=hi).contains(&m) {
            fixes.0.push(i);
            fixes.1.push(if restore { v } else { 0.0 });
        }
    }
}

/// Keeps, in index order, the entries of magnitude at or above `kth`, then, while more than
/// `k` are kept, drops the last ties at `kth`: the entries above it and the first ties in
/// index order, `k` of them when at least `k` reach `kth` and fewer than `k` pass it.
/// Written into the buffers of `out` (cleared first).
///
/// Why one pass at or above, then the ties: counting the entries above `kth` first (to know
/// how many ties to take) read the list twice, and magnitudes of real gradients seldom tie
/// at the k-th, so the second step rarely runs.
pub(crate) fn keep_top(
    idx: &[u32],
    val: &[f32],
    kth: i32,
    k: usize,
    (mut out_i, mut out_v): (Vec<u32>, Vec<f32>),
) -> (Vec<u32>, Vec<f32>) {
    let n = idx.len().min(val.len());
    // Room for every entry plus a whole vector's store past the last.
    out_i.clear();
    out_v.clear();
    out_i.reserve(n + BLOCK);
    out_v.reserve(n + BLOCK);
    let (pi, pv) = (out_i.as_mut_ptr(), out_v.as_mut_ptr());
    let (mut len, mut done) = (0usize, 0usize);
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: AVX-512 checked by `isa`; both outputs have room for `n + BLOCK`.
        Isa::Avx512 => {
            (len, done) = unsafe { avx512_keep::keep_at_or_above(idx, val, kth, pi, pv) }
        }
        // SAFETY: AVX2 checked by `isa`; as above.
        Isa::Avx2 => (len, done) = unsafe { avx2_keep::keep_at_or_above(idx, val, kth, pi, pv) },
        Isa::Base => {}
    }
    // The rest (all of it without SIMD), branch-free: every entry is written at the
    // end of the lists and the length advances only for a kept one, which for a kept
    // fraction near one half is several times faster than a branch per entry.
    for (&i, &v) in idx[done..n].iter().zip(&val[done..n]) {
        // SAFETY: `len <= n`, within the capacity of both lists.
        unsafe {
            pi.add(len).write(i);
            pv.add(len).write(v);
        }
        len += usize::from(abs_bits(v) >= kth);
    }
    // SAFETY: every position below `len <= n` was written (the entry kept there).
    unsafe {
        out_i.set_len(len);
        out_v.set_len(len);
    }
    if len > k {
        drop_last_ties(&mut out_i, &mut out_v, kth, len - k);
    }
    (out_i, out_v)
}

/// Removes the last `excess` entries at magnitude `kth` from the lists, keeping the order
/// of the rest (all of them when there are fewer).
fn drop_last_ties(idx: &mut Vec<u32>, val: &mut Vec<f32>, kth: i32, excess: usize) {
    let ties = val.iter().filter(|v| abs_bits(**v) == kth).count();
    let mut keep_ties = ties.saturating_sub(excess);
    let mut w = 0;
    for r in 0..val.len() {
        let m = abs_bits(val[r]);
        let tie = m == kth;
        if m > kth || (tie && keep_ties > 0) {
            keep_ties -= usize::from(tie);
            idx[w] = idx[r];
            val[w] = val[r];
            w += 1;
        }
    }
    idx.truncate(w);
    val.truncate(w);
}

/// [`keep_top`]'s whole blocks with AVX-512: a mask of the kept lanes, compressed into
/// the outputs sixteen at a time.
#[cfg(target_arch = "x86_64")]
mod avx512_keep {
    use super::BLOCK;
    use std::arch::x86_64::*;

    /// Keeps from the whole blocks of `idx`/`val` the entries of magnitude at or above
    /// `kth`; returns (entries written, entries read).
    ///
    /// # Safety
    /// AVX-512F; `pi` and `pv` valid for `idx.len() + BLOCK` writes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn keep_at_or_above(
        idx: &[u32],
        val: &[f32],
        kth: i32,
        pi: *mut u32,
        pv: *mut f32,
    ) -> (usize, usize) {
        let n = idx.len().min(val.len());
        let whole = n / BLOCK * BLOCK;
        let (vk, abs) = (_mm512_set1_epi32(kth), _mm512_set1_epi32(0x7fff_ffff));
        let mut len = 0usize;
        let mut at = 0;
        while at < whole {
            // SAFETY: `at + BLOCK <= n` reads; `len <= at`, so the stores end within
            // `n + BLOCK`.
            unsafe {
                let vi = _mm512_loadu_si512(idx.as_ptr().add(at).cast());
                let vv = _mm512_loadu_si512(val.as_ptr().add(at).cast());
                let keep = _mm512_cmpge_epi32_mask(_mm512_and_si512(vv, abs), vk);
                _mm512_storeu_si512(pi.add(len).cast(), _mm512_maskz_compress_epi32(keep, vi));
                _mm512_storeu_si512(pv.add(len).cast(), _mm512_maskz_compress_epi32(keep, vv));
                len += keep.count_ones() as usize;
            }
            at += BLOCK;
        }
        (len, at)
    }

    /// [`super::keep_and_fix`]'s whole blocks: each block's kept lanes and band lanes
    /// compressed to the ends of their lists, with no branch on their number. Returns the
    /// entries read.
    ///
    /// # Safety
    /// AVX-512F; every list has room for `idx.len() + BLOCK` more.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn keep_and_fix(
        idx: &[u32],
        val: &[f32],
        t: i32,
        ((lo, hi), restore): ((i32, i32), bool),
        kept: &mut (Vec<u32>, Vec<f32>),
        fixes: &mut (Vec<u32>, Vec<f32>),
    ) -> usize {
        let n = idx.len().min(val.len());
        let whole = n / BLOCK * BLOCK;
        let abs = _mm512_set1_epi32(0x7fff_ffff);
        let (vt, vlo, vhi) = (
            _mm512_set1_epi32(t),
            _mm512_set1_epi32(lo),
            _mm512_set1_epi32(hi),
        );
        // The fixes' values: the entries' own, or zero (all bits cleared).
        let keep_val = _mm512_set1_epi32(if restore { -1 } else { 0 });
        let (ki, kv) = (kept.0.as_mut_ptr(), kept.1.as_mut_ptr());
        let (fi, fv) = (fixes.0.as_mut_ptr(), fixes.1.as_mut_ptr());
        let (mut kl, mut fl) = (kept.0.len(), fixes.0.len());
        let mut at = 0;
        while at < whole {
            // SAFETY: `at + BLOCK <= n` reads; each list grows by at most `BLOCK` a block
            // from its length before, within the `n + BLOCK` reserved.
            unsafe {
                let vi = _mm512_loadu_si512(idx.as_ptr().add(at).cast());
                let vv = _mm512_loadu_si512(val.as_ptr().add(at).cast());
                let m = _mm512_and_si512(vv, abs);
                let keep = _mm512_cmpge_epi32_mask(m, vt);
                let fix = _mm512_cmpge_epi32_mask(m, vlo) & _mm512_cmple_epi32_mask(m, vhi);
                _mm512_storeu_si512(ki.add(kl).cast(), _mm512_maskz_compress_epi32(keep, vi));
                _mm512_storeu_si512(kv.add(kl).cast(), _mm512_maskz_compress_epi32(keep, vv));
                kl += keep.count_ones() as usize;
                let fval = _mm512_and_si512(vv, keep_val);
                _mm512_storeu_si512(fi.add(fl).cast(), _mm512_maskz_compress_epi32(fix, vi));
                _mm512_storeu_si512(fv.add(fl).cast(), _mm512_maskz_compress_epi32(fix, fval));
                fl += fix.count_ones() as usize;
            }
            at += BLOCK;
        }
        // SAFETY: the entries below the new lengths are the old ones and those stored.
        unsafe {
            kept.0.set_len(kl);
            kept.1.set_len(kl);
            fixes.0.set_len(fl);
            fixes.1.set_len(fl);
        }
        at
    }
}

/// [`magnitudes_in`] with AVX-512: each block's lanes in the band compressed to the end of
/// the output, with no branch on their number. The portable body's skip of blocks without
/// a member only pays where members are rare (one histogram bucket's); a guessed band
/// ([`crate::split::prepare_near`]) holds one candidate in ten or more, which put a member
/// in most blocks: a piece of 11 500 candidates took 20 µs that way against 1 µs this way.
/// AVX2 has no compress instruction: its build is the portable body's.
#[cfg(target_arch = "x86_64")]
mod band {
    use super::BLOCK;
    use std::arch::x86_64::*;

    /// [`super::magnitudes_in_body`] compiled for AVX2.
    ///
    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn avx2(vals: &[f32], band: (i32, i32), out: &mut Vec<i32>) {
        super::magnitudes_in_body(vals, band, out)
    }

    /// Appends to `out` the magnitude bits of `vals` in `lo..=hi`, in order.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn avx512(vals: &[f32], (lo, hi): (i32, i32), out: &mut Vec<i32>) {
        let n = vals.len();
        let whole = n / BLOCK * BLOCK;
        // A whole block's store past the last member needs room for `BLOCK` more.
        out.reserve(n + BLOCK);
        let (vlo, vhi) = (_mm512_set1_epi32(lo), _mm512_set1_epi32(hi));
        let abs = _mm512_set1_epi32(0x7fff_ffff);
        let (base, mut len) = (out.as_mut_ptr(), out.len());
        let mut at = 0;
        while at < whole {
            // SAFETY: `at + BLOCK <= n` reads; `len` grows by at most `BLOCK` a block from
            // the length before, so every store ends within the `n + BLOCK` reserved.
            unsafe {
                let m = _mm512_and_si512(_mm512_loadu_si512(vals.as_ptr().add(at).cast()), abs);
                let keep = _mm512_cmpge_epi32_mask(m, vlo) & _mm512_cmple_epi32_mask(m, vhi);
                _mm512_storeu_si512(base.add(len).cast(), _mm512_maskz_compress_epi32(keep, m));
                len += keep.count_ones() as usize;
            }
            at += BLOCK;
        }
        // SAFETY: the first `len` entries are initialised (the old ones and those stored).
        unsafe { out.set_len(len) };
        let rest = vals[whole..].iter().map(|v| super::abs_bits(*v));
        out.extend(rest.filter(|m| (lo..=hi).contains(m)));
    }
}

/// [`keep_top`]'s whole groups of eight with AVX2: the kept lanes of each are moved to
/// the front by one permutation ([`order::avx2::pack`]) and stored whole, the length
/// advancing by their count. The scalar loop carries the length from one entry to the
/// next (about 3 ns an entry on an AMD EPYC: 2.4 µs of exact top-k's 23 µs at 2^16,
/// ρ = 0.01).
#[cfg(target_arch = "x86_64")]
mod avx2_keep {
    use crate::order::avx2::{gt_mask, pack};
    use std::arch::x86_64::*;

    /// As `avx512_keep::keep_at_or_above`, eight at a time.
    ///
    /// # Safety
    /// AVX2; `pi` and `pv` valid for `idx.len() + 16` writes.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn keep_at_or_above(
        idx: &[u32],
        val: &[f32],
        kth: i32,
        pi: *mut u32,
        pv: *mut f32,
    ) -> (usize, usize) {
        let n = idx.len().min(val.len());
        let whole = n / 8 * 8;
        // Magnitudes are never negative: `m >= kth` is `m > kth - 1` (or every one, for a
        // `kth` of `i32::MIN`).
        let below = _mm256_set1_epi32(kth.saturating_sub(1));
        let abs = _mm256_set1_epi32(0x7fff_ffff);
        let mut len = 0usize;
        let mut at = 0;
        while at < whole {
            // SAFETY: `at + 8 <= n` reads; `len <= at`, so the stores end within `n + 8`.
            unsafe {
                let vi = _mm256_loadu_si256(idx.as_ptr().add(at).cast());
                let vv = _mm256_loadu_si256(val.as_ptr().add(at).cast());
                let keep = gt_mask(_mm256_and_si256(vv, abs), below);
                _mm256_storeu_si256(pi.add(len).cast(), pack(vi, keep));
                _mm256_storeu_si256(pv.add(len).cast(), pack(vv, keep));
                len += keep.count_ones() as usize;
            }
            at += 8;
        }
        (len, at)
    }
}

/// Exact top-`k` of an already accumulated vector `x` (read only), using a sampled
/// threshold with fallbacks.
pub(crate) fn exact_readonly(
    x: &[f32],
    k: usize,
    cand: &mut Cand,
    sample: &mut Vec<i32>,
    scratch: &mut Vec<i32>,
) -> Result<Kept> {
    let d = x.len();
    let k = k.min(d);
    if 0 < k && k < d && sample_size(d, k).is_none() {
        return exact_by_kth(x, k, cand, scratch);
    }
    // Attempt 1: sampled threshold with a wide margin; attempt 2: threshold 0 (all).
    let mut attempts: Vec<(i32, usize)> = Vec::with_capacity(2);
    if k > 0 {
        if let Some(n) = sample_size(d, k) {
            // A larger sample and a wider margin than the fused pass's first try.
            let n = (4 * n).min(d / 2);
            sample_x(x, n, sample);
            let t = threshold_from_sample(sample, d, k, 6.0);
            if t > 0 {
                attempts.push((t, candidate_cap(d, k, sample.len(), 6.0)));
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

/// Sum and sum of squares of a chunk (f64).
type Moments = (f64, f64);

/// Lanes of [`moments_body`]'s sums.
const MOMENT_LANES: usize = 32;

/// Sum and sum of squares of one chunk: per lane in f32, the lanes then added in f64 in a
/// fixed order ([`fold_lanes`]).
///
/// Lane `j` takes the elements `32i + j` (at most 128 of a [`CHUNK`]): enough independent
/// chains that the additions do not wait on each other, few enough that both sums stay in
/// registers, and the same lanes in every build, so the same bits. In f32 a chunk's sums
/// carry a relative error of at most about 128 · 2^-24 ≈ 8e-6 of the sum of magnitudes,
/// far below what moves a Gaussian threshold; they cost 3 vector operations per 16
/// elements against about 10 in f64 (the conversions, twice the additions and
/// multiplications). A Gaussian-k step at 2^16, ρ = 0.01 spent 6.5 of its 42 µs here in
/// f64. Where an f32 sum or square overflows (values beyond about 1.8e19), the chunk is
/// summed in f64 instead ([`moments_f64`]): the result is finite exactly when every value
/// is.
#[inline(always)]
fn moments_body(x: &[f32]) -> (f64, f64) {
    let (mut s, mut q) = ([0.0f32; MOMENT_LANES], [0.0f32; MOMENT_LANES]);
    let mut ch = x.chunks_exact(MOMENT_LANES);
    for c in &mut ch {
        for j in 0..MOMENT_LANES {
            s[j] += c[j];
            q[j] += c[j] * c[j];
        }
    }
    for (j, &a) in ch.remainder().iter().enumerate() {
        s[j] += a;
        q[j] += a * a;
    }
    let (s, q) = (fold_lanes(&s), fold_lanes(&q));
    if s.is_finite() && q.is_finite() {
        (s, q)
    } else {
        moments_f64(x)
    }
}

/// The lanes of [`moments_body`] added in f64 in a fixed order.
#[inline(always)]
fn fold_lanes(l: &[f32; MOMENT_LANES]) -> f64 {
    let mut t = [0.0f64; 8];
    for (j, v) in l.iter().enumerate() {
        t[j % 8] += f64::from(*v);
    }
    combine_lanes(&t)
}

/// Sum and sum of squares in f64, in order: where [`moments_body`]'s f32 lanes overflow.
#[cold]
fn moments_f64(x: &[f32]) -> (f64, f64) {
    x.iter().fold((0.0, 0.0), |(s, q), &v| {
        let v = f64::from(v);
        (s + v, q + v * v)
    })
}

/// Folds per-chunk moments in index order; a non-finite value is an error naming the first.
/// (The sums are finite exactly when every value is: an `f32` squared cannot overflow an
/// `f64`, nor can 2^32 of them summed.)
fn fold_moments(x: &[f32], parts: impl Iterator<Item = Moments>) -> Result<(f64, f64)> {
    let (mut s, mut q) = (0.0f64, 0.0f64);
    for (a, b) in parts {
        s += a;
        q += b;
    }
    if !(s.is_finite() && q.is_finite()) {
        if let Some(index) = x.iter().position(|v| !v.is_finite()) {
            return Err(Error::NonFinite {
                index,
                value: x[index],
            });
        }
    }
    Ok((s, q))
}

/// Sum and sum of squares of `x` in f64, per [`CHUNK`] and the chunk totals added in order
/// (so the result does not depend on the thread count); parallel for large inputs.
pub(crate) fn moments(x: &[f32]) -> Result<(f64, f64)> {
    if pieces(x.len()) == 1 {
        return fold_moments(x, x.chunks(CHUNK).map(moments_chunk));
    }
    use rayon::prelude::*;
    let per: Vec<_> = x.par_chunks(CHUNK).map(moments_chunk).collect();
    fold_moments(x, per.into_iter())
}

/// `r += g` fused with [`moments`] of the result: each chunk is summed while it is still
/// in L1.
pub(crate) fn fused_moments(r: &mut [f32], g: &[f32]) -> Result<(f64, f64)> {
    let n = r.len().min(g.len());
    let (r, g) = (&mut r[..n], &g[..n]);
    let acc = |rc: &mut [f32], gc: &[f32]| {
        add_one(rc, gc);
        moments_chunk(rc)
    };
    if pieces(n) == 1 {
        let per: Vec<_> = r
            .chunks_mut(CHUNK)
            .zip(g.chunks(CHUNK))
            .map(|(rc, gc)| acc(rc, gc))
            .collect();
        return fold_moments(r, per.into_iter());
    }
    use rayon::prelude::*;
    let per: Vec<_> = r
        .par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .map(|(rc, gc)| acc(rc, gc))
        .collect();
    fold_moments(r, per.into_iter())
}

/// Sum of `|x|` in exactly the order the statistics passes use, whatever their split:
/// per [`CHUNK`] from index 0, lane `j` of 16 f32 lanes adds element `j` of each whole block
/// of 16 in order, the lanes are folded by [`tree16`] into f64, the chunk's tail is added
/// element by element, and the chunk sums are added in order. (Per-lane sums cost one
/// vector add per block; a per-block f64 sum was one chain of dependent additions that
/// made the statistics pass 2× the plain one.)
pub(crate) fn abs_sum(x: &[f32]) -> f64 {
    let mut total = 0.0f64;
    for chunk in x.chunks(CHUNK) {
        let mut lanes = [0.0f32; BLOCK];
        let mut ch = chunk.chunks_exact(BLOCK);
        for c in &mut ch {
            for j in 0..BLOCK {
                lanes[j] += c[j].abs();
            }
        }
        let mut l = f64::from(tree16(&lanes));
        for v in ch.remainder() {
            l += f64::from(v.abs());
        }
        total += l;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_match_fused_pass() {
        // Within one chunk, over several (with a tail), and split over the pool.
        for n in [
            1003,
            2 * CHUNK,
            2 * CHUNK + 5,
            3 * CHUNK + 37,
            2 * PAR_MIN + CHUNK + 5,
        ] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
                .collect();
            // The largest magnitude is exact when some element reaches the threshold, and
            // below the threshold otherwise (`PassOut::max_bits`).
            // Caps that end batches early and send blocks through the capped path, in the
            // vector builds' one call over several chunks as much as in a chunk's.
            let ts = [INF_BITS, abs_bits(18.4), 0];
            for (t, cap) in ts
                .iter()
                .flat_map(|&t| [(t, usize::MAX), (t, 100 * BLOCK + 7), (t, 3)])
            {
                let mut r = vec![0.25f32; g.len()];
                let mut c = Cand::default();
                let out = fused_pass::<true, false>(&mut r, &g, 0, t, cap, &mut c);
                let mx = r.iter().map(|v| abs_bits(*v)).max().unwrap();
                let out2 = scan_pass::<true>(&r, 0, t, cap, &mut c);
                for o in [out, out2] {
                    let what = format!("n {n} t {t} cap {cap}");
                    assert_eq!(o.abs_sum.to_bits(), abs_sum(&r).to_bits(), "{what}");
                    if mx >= t {
                        assert_eq!(o.max_bits, mx, "n {n} t {t}");
                    } else {
                        assert!(o.max_bits <= mx && o.max_bits < t, "n {n} t {t}");
                    }
                }
            }
            let mut r = vec![0.25f32; g.len()];
            let mut c = Cand::default();
            let out = fused_pass::<true, false>(&mut r, &g, 0, INF_BITS, usize::MAX, &mut c);
            // Close to an f64 sum in index order: the f32 lanes lose a few ulps per chunk.
            let naive: f64 = r.iter().map(|v| f64::from(v.abs())).sum();
            assert!((naive - out.abs_sum).abs() <= 1e-5 * naive, "n {n}");
        }
    }

    #[test]
    fn keep_top_takes_the_first_ties_in_index_order() {
        // Few distinct magnitudes, both signs, so ties span several blocks and the tail.
        for n in [5usize, 16, 47, 300, 1001] {
            let idx: Vec<u32> = (0..n as u32).map(|i| 3 * i + 1).collect();
            let val: Vec<f32> = (0..n)
                .map(|i| ((i * 7 % 5) as f32) * if i % 3 == 0 { -1.0 } else { 1.0 })
                .collect();
            for kth in [0.0f32, 1.0, 2.0, 4.0] {
                let kb = abs_bits(kth);
                let gt = val.iter().filter(|v| abs_bits(**v) > kb).count();
                let eq = val.iter().filter(|v| abs_bits(**v) == kb).count();
                for ties in [0, 1, eq / 2, eq] {
                    let k = gt + ties;
                    let mut left = ties;
                    let want: Vec<(u32, f32)> = idx
                        .iter()
                        .zip(&val)
                        .filter(|(_, v)| {
                            let m = abs_bits(**v);
                            let tie = m == kb && left > 0;
                            left -= usize::from(tie);
                            m > kb || tie
                        })
                        .map(|(i, v)| (*i, *v))
                        .collect();
                    let (gi, gv) = keep_top(&idx, &val, kb, k, Default::default());
                    let got: Vec<(u32, f32)> = gi.into_iter().zip(gv).collect();
                    assert_eq!(got, want, "n {n} kth {kth} ties {ties}");
                    assert!(eq == 0 || ties == 0 || got.iter().any(|p| abs_bits(p.1) == kb));
                }
            }
        }
    }

    /// The portable bodies (the AVX2 and baseline builds) sum `|x|` in the reference order
    /// too: checked on one chunk and on a partial one with a tail, at the baseline ISA.
    #[test]
    fn portable_bodies_sum_in_the_reference_order() {
        for n in [CHUNK, 1003] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 31 % 97) as f32 - 48.0) * 0.21)
                .collect();
            let mut r = vec![0.5f32; n];
            let mut c = Cand::default();
            let f = fused_body::<true>(&mut r, &g, 0, INF_BITS, usize::MAX, &mut c);
            assert_eq!(f.abs_sum.to_bits(), abs_sum(&r).to_bits(), "n {n}");
            let s = scan_body::<true>(&r, 0, INF_BITS, usize::MAX, &mut c);
            assert_eq!(s.abs_sum.to_bits(), abs_sum(&r).to_bits(), "n {n}");
        }
    }

    #[test]
    fn add_max_builds_agree_bitwise() {
        // Whole spans and chunks, a partial span, a partial chunk, a tail.
        for n in [
            5usize,
            256,
            4096,
            4096 + 256 + 7,
            3 * CHUNK + 100,
            5 * CHUNK,
        ] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.013)
                .collect();
            let r0: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1).collect();
            let spans = n.div_ceil(GROUP_SPAN) * BLOCK;
            let (mut r1, mut r2) = (r0.clone(), r0.clone());
            let (mut m1, mut m2) = (vec![-1; spans], vec![-1; spans]);
            let a = add_max_body::<true>(&mut r1, &g, &mut m1);
            let b = add_max_one::<true>(&mut r2, &g, &mut m2);
            assert_eq!((a.0, a.1.to_bits()), (b.0, b.1.to_bits()), "n {n}");
            assert_eq!(m1, m2, "n {n}");
            assert_eq!(bits_of(&r1), bits_of(&r2), "n {n}");
            assert_eq!(a.1.to_bits(), abs_sum(&r1).to_bits(), "n {n}");
        }
    }

    /// Helpers that [`linger`] kept awake, in every test of this process.
    pub(super) static LINGERED: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// After a parallel pass a helper stays awake ([`linger`]), and lets go: the pool
    /// still runs work of its own on every thread, and another pass at once.
    #[test]
    fn a_lingering_helper_lets_go() {
        use std::sync::atomic::Ordering;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let before = LINGERED.load(Ordering::Relaxed);
        for _ in 0..20 {
            let mut runs = vec![0u32; 4];
            pool.install(|| {
                run_pieces(&mut runs, |_, r| *r += 1);
                run_pieces(&mut runs, |_, r| *r += 1);
            });
            assert_eq!(runs, vec![2; 4]);
            // Every thread runs this only once it is free: a helper that never let go
            // would hang here.
            assert_eq!(pool.broadcast(|_| 1).iter().sum::<i32>(), 2);
        }
        // Not vacuous: helpers did linger (this pool's; other tests only add to it).
        assert!(LINGERED.load(Ordering::Relaxed) >= before + 20);
    }

    /// [`run_pieces`] runs every piece exactly once, on a pool of one thread and of
    /// several, with fewer pieces than threads and more.
    #[test]
    fn every_piece_runs_once() {
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for count in [0usize, 1, 2, 5, 33] {
                let mut runs = vec![(usize::MAX, 0usize); count];
                pool.install(|| run_pieces(&mut runs, |i, r| *r = (i, r.1 + 1)));
                let want: Vec<(usize, usize)> = (0..count).map(|i| (i, 1)).collect();
                assert_eq!(runs, want, "{threads} threads, {count} pieces");
            }
        }
    }

    /// A piece that panics reaches the caller as a panic, on whichever thread it ran,
    /// and the other pieces still run: the caller's wait for them ends.
    #[test]
    fn a_panicking_piece_panics_the_caller() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for bad in [0usize, 3, 7] {
            let mut ran = vec![false; 8];
            let got = pool.install(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_pieces(&mut ran, |i, r| {
                        *r = true;
                        assert_ne!(i, bad, "piece {i} fails");
                    })
                }))
            });
            assert!(got.is_err(), "piece {bad}'s panic was lost");
            assert!(ran[bad], "piece {bad} never ran");
        }
    }

    /// Every build of the prefetching add (`add_far`) this CPU has writes what the plain
    /// loop writes, over whole spans, a partial span and a tail, and leaves everything past
    /// the slice alone (the hints run [`PREFETCH_AHEAD`] past its end). So does
    /// [`add_far_one`] asked for as over a pass long enough to prefetch.
    #[test]
    fn the_prefetching_add_matches_the_plain_one() {
        type Add = fn(&mut [f32], &[f32]);
        let mut builds: Vec<(&str, Add)> =
            vec![("add_far_one", |r, g| add_far_one(r, g, PREFETCH_MIN))];
        #[cfg(target_arch = "x86_64")]
        {
            if isa() != Isa::Base {
                // SAFETY: only called when the CPU has AVX2 (checked just above).
                builds.push(("avx2", |r, g| unsafe { avx2::add_far(r, g) }));
            }
            if isa() == Isa::Avx512 {
                // SAFETY: only called when the CPU has AVX-512 (checked just above).
                builds.push(("avx512", |r, g| unsafe { avx512::add_far(r, g) }));
            }
        }
        for n in [0usize, 9, GROUP_SPAN, 3 * GROUP_SPAN + 17, 5 * CHUNK + 100] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.013)
                .collect();
            let r0: Vec<f32> = (0..n + 8).map(|i| (i % 7) as f32 * 0.1).collect();
            let mut want = r0.clone();
            add_body(&mut want[..n], &g);
            for (name, add) in &builds {
                let mut got = r0.clone();
                add(&mut got[..n], &g);
                assert_eq!(bits_of(&got), bits_of(&want), "{name}, n {n}");
            }
            assert!(
                n < GROUP_SPAN || bits_of(&want) != bits_of(&r0),
                "n {n}: nothing added"
            );
        }
    }

    /// `n` values of both signs at random scales over 2^±30 from the xorshift state `seed`:
    /// sums of them round differently when a lane, the order or the folding changes.
    fn random_scales(seed: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                let h = *seed;
                let mag = (1.0 + (h >> 40) as f32 / (1u64 << 24) as f32)
                    * 2f32.powi((h % 61) as i32 - 30);
                if h >> 63 == 1 {
                    -mag
                } else {
                    mag
                }
            })
            .collect()
    }

    /// The widest build's band picks and histogram equal the portable bodies, and the
    /// keep-and-fix scan equals direct filters (every length mod 16, bands that hold none,
    /// some and all of the values, appended to lists that are not empty), and the
    /// histogram equals a count per bucket.
    #[test]
    fn band_pick_and_histogram_match_the_portable_bodies() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let (mut picked, mut some) = (0, 0);
        for n in [0, 1, 15, 16, 17, 100, 1000, 4099] {
            let vals = random_scales(&mut seed, n);
            let mut bits: Vec<i32> = vals.iter().map(|v| abs_bits(*v)).collect();
            bits.sort_unstable();
            let at = |q: usize| bits.get(q * n / 4).copied().unwrap_or(1);
            for band in [(0, i32::MAX), (at(1), at(3)), (at(2), at(2)), (i32::MAX, 0)] {
                let (mut got, mut want) = (vec![-7], vec![-7]);
                magnitudes_in(&vals, band, &mut got);
                magnitudes_in_body(&vals, band, &mut want);
                let direct = vals.iter().map(|v| abs_bits(*v));
                let direct: Vec<i32> = direct.filter(|m| (band.0..=band.1).contains(m)).collect();
                assert_eq!(got, want, "n {n} band {band:?}");
                assert_eq!(got[1..], direct[..], "n {n} band {band:?}");
                let idx: Vec<u32> = (0..n as u32).map(|i| i * 3 + 1).collect();
                for (t, restore) in [(band.0, true), (at(3), false)] {
                    let (mut kept, mut fixes) = ((vec![7], vec![7.0]), (vec![7], vec![7.0]));
                    keep_and_fix(&idx, &vals, t, (band, restore), &mut kept, &mut fixes);
                    let entries = idx.iter().copied().zip(vals.iter().copied());
                    let want_kept: Vec<(u32, f32)> =
                        entries.clone().filter(|e| abs_bits(e.1) >= t).collect();
                    let want_fixes: Vec<(u32, f32)> = entries
                        .filter(|e| (band.0..=band.1).contains(&abs_bits(e.1)))
                        .map(|(i, v)| (i, if restore { v } else { 0.0 }))
                        .collect();
                    let pairs = |l: &(Vec<u32>, Vec<f32>)| -> Vec<(u32, f32)> {
                        l.0[1..]
                            .iter()
                            .copied()
                            .zip(l.1[1..].iter().copied())
                            .collect()
                    };
                    assert_eq!(pairs(&kept), want_kept, "n {n} band {band:?} t {t}");
                    assert_eq!(pairs(&fixes), want_fixes, "n {n} band {band:?} t {t}");
                    assert_eq!((kept.0[0], fixes.0[0]), (7, 7), "appended, not cleared");
                    picked += fixes.0.len() - 1;
                    some += usize::from(fixes.0.len() > 1 && fixes.0.len() <= n);
                }
            }
            let t = at(1);
            for (shift, buckets) in [(23 - 6, 64), (23 - 11, 2048), (0, 5)] {
                let (mut got, mut want) = (vec![1u32; buckets], vec![1u32; buckets]);
                histogram(&vals, (t, shift), &mut got);
                for m in &bits {
                    let above = (m.wrapping_sub(t).max(0) as u32 >> shift) as usize;
                    want[above.min(buckets - 1)] += 1;
                }
                assert_eq!(got, want, "n {n} shift {shift}");
            }
        }
        assert!(picked > 0 && some > 0, "no band held a value");
    }

    #[test]
    fn moments_builds_agree_bitwise() {
        // Whole groups of 32 and partial ones, values of both signs at random scales over
        // 2^±30, many draws of the short ones: the sums then round differently when a
        // lane, the order or the folding changes (builds that swapped two lanes of any one
        // register failed this).
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let sizes = [0usize, 7, 16, 33, 100, CHUNK, CHUNK + 13];
        for (draw, n) in sizes.iter().flat_map(|&n| (0..50).map(move |d| (d, n))) {
            let x = random_scales(&mut seed, n);
            let (s, q) = moments_body(&x);
            let (s2, q2) = moments_chunk(&x);
            assert_eq!(
                (s.to_bits(), q.to_bits()),
                (s2.to_bits(), q2.to_bits()),
                "n {n} draw {draw}"
            );
            // The AVX2 build too, where this CPU dispatches to AVX-512.
            #[cfg(target_arch = "x86_64")]
            if isa() == Isa::Avx512 {
                // SAFETY: an AVX-512 CPU has every feature of the AVX2 build.
                let (s3, q3) = unsafe { avx2::moments(&x) };
                assert_eq!((s.to_bits(), q.to_bits()), (s3.to_bits(), q3.to_bits()));
            }
            // f32 lanes of at most 129 values: within 129 · 2^-24 of the magnitudes' sum.
            let direct: f64 = x.iter().map(|&v| f64::from(v)).sum();
            let scale: f64 = x.iter().map(|&v| f64::from(v).abs()).sum();
            assert!((s - direct).abs() <= 1e-5 * scale.max(1e-300), "n {n}");
            let squares: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            assert!((q - squares).abs() <= 1e-5 * squares.max(1e-300), "n {n}");
        }
        // Squares beyond f32's range: the chunk is summed in f64, finite and close.
        let x = vec![3e20f32, -3e20, 1.0];
        let (s, q) = moments_chunk(&x);
        assert_eq!(s, 1.0);
        assert!((q / (2.0 * f64::from(3e20f32).powi(2)) - 1.0).abs() < 1e-12);
        // A non-finite value is reported with its index, a finite one is not.
        let mut x = vec![1.0f32; 3 * CHUNK];
        assert!(moments(&x).is_ok());
        x[CHUNK + 5] = f32::NAN;
        assert!(matches!(moments(&x), Err(Error::NonFinite { index, .. }) if index == CHUNK + 5));
        x[CHUNK + 5] = f32::MAX;
        assert!(moments(&x).is_ok());
        x[7] = f32::NEG_INFINITY;
        assert!(matches!(
            moments(&x),
            Err(Error::NonFinite { index: 7, .. })
        ));
    }

    /// A pass that takes the moments of its range (Gaussian-k's, one chunk) gives exactly
    /// [`moments_chunk`] of the accumulated range, before its zeroing: every emission
    /// form, with and without zeroing, hit rates from none to all, ranges with a partial
    /// last block and an odd number of blocks, values at random scales over 2^±30 (where a
    /// lane added out of order rounds differently).
    #[test]
    fn moments_in_the_pass_equal_the_chunk_moments() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut compared = 0;
        for n in [CHUNK, CHUNK - 5, 16 * 7 + 9, 48, 33, 5] {
            let (r0, g) = (random_scales(&mut seed, n), random_scales(&mut seed, n));
            let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
            let want = moments_chunk(&acc);
            for t in [INF_BITS, abs_bits(1e6), abs_bits(1e-3), 0] {
                for emit in [EmitForm::Branchy, EmitForm::BranchFree, EmitForm::Dense] {
                    for zero in [false, true] {
                        let (mut r, mut c, mut m) = (r0.clone(), Cand::default(), (0.0, 0.0));
                        let tz = (t, t);
                        let cap = usize::MAX;
                        let sums = (None, Some(&mut m));
                        // The zeroing pass prefetches, as over data beyond the cache.
                        let far = (zero, zero);
                        if zero {
                            fused_any::<false, true>(
                                emit, far, &mut r, &g, 3, tz, cap, &mut c, sums,
                            );
                        } else {
                            fused_any::<false, false>(
                                emit, far, &mut r, &g, 3, tz, cap, &mut c, sums,
                            );
                        }
                        assert_eq!(
                            (m.0.to_bits(), m.1.to_bits()),
                            (want.0.to_bits(), want.1.to_bits()),
                            "n {n} t {t} {emit:?} zero {zero}"
                        );
                        compared += usize::from(!c.idx.is_empty());
                        // The AVX2 build too, where this CPU dispatches to AVX-512.
                        #[cfg(target_arch = "x86_64")]
                        if isa() == Isa::Avx512 {
                            let (mut r, mut c, mut m) = (r0.clone(), Cand::default(), (0.0, 0.0));
                            let sums = (None, Some(&mut m));
                            // SAFETY: an AVX-512 CPU has every feature of the AVX2 build.
                            unsafe {
                                wide::avx2::fused::<false, false, true>(
                                    (emit, false),
                                    &mut r,
                                    &g,
                                    3,
                                    tz,
                                    cap,
                                    &mut c,
                                    sums,
                                )
                            };
                            assert_eq!(
                                (m.0.to_bits(), m.1.to_bits()),
                                (want.0.to_bits(), want.1.to_bits())
                            );
                        }
                    }
                }
            }
        }
        assert!(compared > 50, "passes with candidates: {compared}");
    }

    /// The sample a pass takes as it goes ([`Cand::sample_next_pass`]) equals a strided
    /// read of the accumulated vector: every emission form and both vector builds, with
    /// and without zeroing (a zeroed position read from its candidate), hit rates from none
    /// to all, ranges with a partial last block, strides shorter and longer than a batch,
    /// starts before and inside the range.
    #[test]
    fn the_sample_taken_in_the_pass_equals_a_strided_read() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let (mut zeroed, mut taken) = (0, 0);
        for n in [3 * CHUNK + 5, 16 * 7 + 9, 5] {
            let (r0, g) = (random_scales(&mut seed, n), random_scales(&mut seed, n));
            let base = 1000;
            let acc: Vec<u32> = r0.iter().zip(&g).map(|(a, b)| (a + b).to_bits()).collect();
            for t in [INF_BITS, abs_bits(1e3), abs_bits(1e-3), 0] {
                for (start, stride) in [(0, 1), (7, 96), (base + 5, 3000), (base + n, 5)] {
                    let want: Vec<i32> = (start..base + n)
                        .step_by(stride)
                        .filter(|&i| i >= base)
                        .map(|i| (acc[i - base] & 0x7fff_ffff) as i32)
                        .collect();
                    // The pass with and without zeroing (the zeroing one prefetching), from
                    // the widest build and (where this CPU dispatches to AVX-512) the AVX2
                    // build.
                    type Pass = fn(EmitForm, &mut [f32], &[f32], usize, (i32, i32), &mut Cand);
                    /// The pass of the widest build, or with `AVX2` of the AVX2 build.
                    fn pass<const ZERO: bool, const AVX2: bool>(
                        e: EmitForm,
                        r: &mut [f32],
                        g: &[f32],
                        b: usize,
                        tz: (i32, i32),
                        c: &mut Cand,
                    ) {
                        let sums = (None, None);
                        #[cfg(target_arch = "x86_64")]
                        if AVX2 {
                            let m = usize::MAX;
                            // SAFETY: only listed below where the CPU has AVX-512, which has
                            // every feature of the AVX2 build.
                            unsafe {
                                wide::avx2::fused::<false, true, ZERO>(
                                    (e, true),
                                    r,
                                    g,
                                    b,
                                    tz,
                                    m,
                                    c,
                                    sums,
                                )
                            };
                            return;
                        }
                        fused_any::<false, ZERO>(e, (ZERO, ZERO), r, g, b, tz, usize::MAX, c, sums);
                    }
                    let mut passes: Vec<(&str, bool, Pass)> = vec![
                        ("widest", false, pass::<false, false>),
                        ("widest", true, pass::<true, false>),
                    ];
                    #[cfg(target_arch = "x86_64")]
                    if isa() == Isa::Avx512 {
                        passes.push(("AVX2", false, pass::<false, true>));
                        passes.push(("AVX2", true, pass::<true, true>));
                    }
                    let mut forms = vec![];
                    for emit in [EmitForm::Branchy, EmitForm::BranchFree, EmitForm::Dense] {
                        for &(build, zero, pass) in &passes {
                            let (mut r, mut c) = (r0.clone(), Cand::default());
                            c.sample.begin(base, Some((start, stride)));
                            pass(emit, &mut r, &g, base, (t, t), &mut c);
                            if zero {
                                zeroed += r.iter().filter(|v| **v == 0.0).count();
                            }
                            forms.push((format!("{build} {emit:?} zero {zero}"), c.sample.out));
                        }
                    }
                    for (form, got) in forms {
                        assert_eq!(got, want, "n {n} t {t} at {start}/{stride} {form}");
                        taken += got.len();
                    }
                }
            }
        }
        assert!(
            zeroed > 0 && taken > 1000,
            "{zeroed} zeroed, {taken} sampled"
        );
    }

    fn bits_of(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every emission form of the AVX-512 pass ([`EmitForm`]) emits the same: candidates,
    /// order, cap and overflow, statistics, non-finite reporting and the accumulated vector,
    /// at hit rates from none to all, and the adaptive one from either starting form.
    #[test]
    fn emission_forms_agree() {
        let mut compared = 0;
        for n in [63usize, 64 * 64 + 17, 3 * CHUNK + 5] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01)
                .collect();
            // Hit rates about 0, 1, 10 and 100 % (|g| spreads evenly below 5.06).
            for t in [INF_BITS, abs_bits(5.01), abs_bits(4.55), 0] {
                // `100 * BLOCK + 7`: a first batch shorter than the longest, sized to fit
                // under `cap`, and capped blocks after it.
                for cap in [usize::MAX, 100 * BLOCK + 7, n / 20, 3] {
                    for bad in [None, Some(n / 2)] {
                        let mut r0: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.001).collect();
                        if let Some(b) = bad {
                            r0[b] = f32::NAN;
                        }
                        let run = |emit: EmitForm, start: (bool, bool, bool), prefetch: bool| {
                            let mut r = r0.clone();
                            let mut c = Cand {
                                branch_free: start.0,
                                dense: start.1,
                                sixteen: start.2,
                                ..Cand::default()
                            };
                            let o = fused_any::<true, false>(
                                emit,
                                (prefetch, prefetch),
                                &mut r,
                                &g,
                                5,
                                (t, t),
                                cap,
                                &mut c,
                                (None, None),
                            );
                            // The largest magnitude is exact when one reached `t`, and
                            // only below `t` otherwise (`PassOut::max_bits`).
                            let mx = if o.max_bits >= t {
                                Some(o.max_bits)
                            } else {
                                None
                            };
                            let stats = (o.overflow, o.abs_sum.to_bits(), mx);
                            let nf = o.non_finite.map(|(i, v)| (i, v.to_bits()));
                            (bits_of(&r), c.idx, bits_of(&c.val), stats, nf)
                        };
                        let a = run(EmitForm::Branchy, (false, false, false), false);
                        // The prefetching pass (data beyond the cache) switches to the dense
                        // form at a lower hit rate: at about 1 % here, where the other does
                        // not. A branch-free pass that starts writing sixteen indices a group
                        // (`sixteen`, with VBMI2) meets groups of more than four and sixteen
                        // hits at 10 % and 100 %.
                        for (emit, start, prefetch) in [
                            (EmitForm::BranchFree, (false, false, false), false),
                            (EmitForm::BranchFree, (false, false, true), false),
                            (EmitForm::Dense, (false, false, false), false),
                            (EmitForm::Adaptive, (false, false, false), false),
                            (EmitForm::Adaptive, (true, false, false), false),
                            (EmitForm::Adaptive, (true, false, true), false),
                            (EmitForm::Adaptive, (true, true, false), false),
                            (EmitForm::Adaptive, (false, false, false), true),
                            (EmitForm::Adaptive, (true, false, false), true),
                        ] {
                            let b = run(emit, start, prefetch);
                            assert_eq!(
                                a, b,
                                "{emit:?} from {start:?} prefetch {prefetch} n {n} t {t} cap {cap}"
                            );
                        }
                        compared += usize::from(!a.1.is_empty());
                    }
                }
            }
        }
        assert!(compared > 20, "most cases emit candidates: {compared}");
    }

    /// The statistics pass of the vector build `name` ("avx2", "avx512" or "avx512v", with or
    /// without prefetching) over `r` and `g` from index `base`, with threshold and zeroing
    /// bound `tz`: one call for the six instantiations the tests compare.
    ///
    /// # Safety
    /// The CPU has that instruction set.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn wide_fused<const ZERO: bool>(
        (name, prefetch): (&str, bool),
        emit: EmitForm,
        r: &mut [f32],
        g: &[f32],
        (base, tz): (usize, (i32, i32)),
        cap: usize,
        c: &mut Cand,
        sums: Option<&mut [f64]>,
    ) -> PassOut {
        // SAFETY: as the caller ensures.
        unsafe {
            let sums = (sums, None);
            match (name, prefetch) {
                ("avx2", false) => wide::avx2::fused::<true, false, ZERO>(
                    (emit, false),
                    r,
                    g,
                    base,
                    tz,
                    cap,
                    c,
                    sums,
                ),
                ("avx2", true) => wide::avx2::fused::<true, true, ZERO>(
                    (emit, true),
                    r,
                    g,
                    base,
                    tz,
                    cap,
                    c,
                    sums,
                ),
                ("avx512", false) => wide::avx512::fused::<true, false, ZERO>(
                    (emit, false),
                    r,
                    g,
                    base,
                    tz,
                    cap,
                    c,
                    sums,
                ),
                ("avx512", true) => wide::avx512::fused::<true, true, ZERO>(
                    (emit, true),
                    r,
                    g,
                    base,
                    tz,
                    cap,
                    c,
                    sums,
                ),
                ("avx512v", false) => wide::avx512v::fused::<true, false, ZERO>(
                    (emit, false),
                    r,
                    g,
                    base,
                    tz,
                    cap,
                    c,
                    sums,
                ),
                ("avx512v", true) => wide::avx512v::fused::<true, true, ZERO>(
                    (emit, true),
                    r,
                    g,
                    base,
                    tz,
                    cap,
                    c,
                    sums,
                ),
                (other, _) => panic!("no build named {other}"),
            }
        }
    }

    /// With per-chunk sums, one vector pass over several chunks ([`serial_chunks`]'s one
    /// call) writes each chunk's `|x|` sum in [`abs_sum`]'s order, returns their fold, and
    /// emits the same candidates as a pass without them, in every instruction set this CPU
    /// has: whole chunks, a partial last one, and a tail that starts a chunk of its own;
    /// caps that end batches early.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn wide_passes_fold_each_chunk_in_the_reference_order() {
        let isas = [
            ("avx2", isa() != Isa::Base),
            ("avx512", isa() == Isa::Avx512),
            ("avx512v", isa() == Isa::Avx512 && vbmi2()),
        ];
        let mut checked = 0;
        for (name, has) in isas {
            if !has {
                continue;
            }
            for n in [2 * CHUNK, 2 * CHUNK + 5, 3 * CHUNK + 37, CHUNK - 3] {
                let g: Vec<f32> = (0..n)
                    .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01)
                    .collect();
                for t in [INF_BITS, abs_bits(4.55), 0] {
                    for cap in [usize::MAX, 100 * BLOCK + 7, 3] {
                        let run = |with_sums: bool| {
                            let mut r: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.001).collect();
                            let mut c = Cand::default();
                            let mut sums = vec![0.0f64; n.div_ceil(CHUNK)];
                            let s = with_sums.then_some(&mut sums[..]);
                            let emit = EmitForm::Adaptive;
                            let tz = (t, t);
                            // SAFETY: the CPU has the instruction set (`has`).
                            let o = unsafe {
                                let how = (name, false);
                                wide_fused::<false>(how, emit, &mut r, &g, (0, tz), cap, &mut c, s)
                            };
                            (r, c, o, sums)
                        };
                        let (r, c, o, sums) = run(true);
                        let what = format!("{name} n {n} t {t} cap {cap}");
                        assert_eq!(o.abs_sum.to_bits(), abs_sum(&r).to_bits(), "{what}");
                        for (k, chunk) in r.chunks(CHUNK).enumerate() {
                            assert_eq!(
                                sums[k].to_bits(),
                                abs_sum(chunk).to_bits(),
                                "{what} chunk {k}"
                            );
                        }
                        let (_, c0, o0, _) = run(false);
                        // The largest magnitude is only exact once some element reached `t`.
                        if !c0.idx.is_empty() {
                            assert_eq!(o.max_bits, o0.max_bits, "{what}");
                        }
                        assert_eq!(o.overflow, o0.overflow, "{what}");
                        assert_eq!(
                            (c.idx, bits_of(&c.val)),
                            (c0.idx, bits_of(&c0.val)),
                            "{what}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked >= 36 || isa() == Isa::Base, "{checked}");
    }

    /// The vector passes of every instruction set this CPU has ([`wide`]) equal the
    /// portable bodies bit for bit: candidates, order, cap and overflow, statistics,
    /// non-finite reporting and the accumulated vector, fused and read-only, at hit rates
    /// from none to all, in every emission form.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn wide_passes_equal_the_portable_bodies() {
        type Pass = (
            Vec<u32>,
            Vec<u32>,
            Vec<u32>,
            (bool, u64, i32),
            Option<(usize, u32)>,
        );
        let seen = |r: &[f32], c: Cand, o: PassOut| -> Pass {
            let stats = (o.overflow, o.abs_sum.to_bits(), o.max_bits);
            let nf = o.non_finite.map(|(i, v)| (i, v.to_bits()));
            (bits_of(r), c.idx, bits_of(&c.val), stats, nf)
        };
        // The vector passes' largest magnitude is exact when some element reaches `t`, and
        // only below `t` otherwise (`PassOut::max_bits`): compared as such.
        let max_as_known = |mut got: Pass, want: &Pass, t: i32| -> Pass {
            if want.3 .2 < t {
                assert!(
                    got.3 .2 <= want.3 .2 && got.3 .2 < t,
                    "max {} t {t}",
                    got.3 .2
                );
                got.3 .2 = want.3 .2;
            }
            got
        };
        let isas: Vec<(&str, bool)> = vec![
            ("avx2", isa() != Isa::Base),
            ("avx512", isa() == Isa::Avx512),
            ("avx512v", isa() == Isa::Avx512 && vbmi2()),
        ];
        let (mut compared, mut emitted, mut zeroed) = (0, 0, 0);
        for n in [15usize, 63, 64 * 64 + 17, 3 * CHUNK + 5] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01)
                .collect();
            for t in [INF_BITS, abs_bits(5.01), abs_bits(4.55), 0, i32::MIN] {
                // `100 * BLOCK + 7`: a first batch shorter than the longest, sized to fit
                // under `cap`, and capped blocks after it.
                for cap in [usize::MAX, 100 * BLOCK + 7, n / 20, 3] {
                    // A NaN in a group of four blocks, in the last block of the pass (a
                    // batch's trailing block for n = 64·64 + 17), and in the trailing
                    // blocks of the batch sized to fit under `100 * BLOCK + 7`.
                    let bads = [Some(n / 2), Some(n - 10), Some(1540)];
                    let bads = bads.into_iter().filter(|b| b.is_some_and(|b| b < n));
                    for bad in std::iter::once(None).chain(bads) {
                        let mut r0: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.001).collect();
                        if let Some(b) = bad {
                            r0[b] = f32::NAN;
                        }
                        let (mut r, mut c) = (r0.clone(), Cand::default());
                        let o = fused_body::<true>(&mut r, &g, 5, t, cap, &mut c);
                        // A zeroing pass: the same, with the candidates from 4.8 up zeroed
                        // (every one from `t` up for the highest `t`).
                        let zero_from = abs_bits(4.8).min(t);
                        let mut rz = r.clone();
                        zero_candidates(&mut rz, 5, &c.idx, &c.val, zero_from);
                        let want_zeroed = seen(&rz, c.clone(), o);
                        let want = seen(&r, c, o);
                        let mut c = Cand::default();
                        let o = scan_body::<true>(&r0, 5, t, cap, &mut c);
                        let want_scan = seen(&r0, c, o);
                        for &(name, has) in isas.iter().filter(|i| i.1) {
                            let forms = [
                                EmitForm::Branchy,
                                EmitForm::BranchFree,
                                EmitForm::Dense,
                                EmitForm::Adaptive,
                            ];
                            for (emit, prefetch) in
                                forms.into_iter().flat_map(|e| [(e, false), (e, true)])
                            {
                                let (mut r, mut c) = (r0.clone(), Cand::default());
                                let mut c2 = Cand::default();
                                // SAFETY: the CPU has the instruction set (`has`).
                                let (o, o2) = unsafe {
                                    assert!(has);
                                    let (rr, cc) = (&mut r, &mut c);
                                    let o = wide_fused::<false>(
                                        (name, prefetch),
                                        emit,
                                        rr,
                                        &g,
                                        (5, (t, t)),
                                        cap,
                                        cc,
                                        None,
                                    );
                                    let o2 = match name {
                                        "avx2" => wide::avx2::scan::<true>(&r0, 5, t, cap, &mut c2),
                                        "avx512" => {
                                            wide::avx512::scan::<true>(&r0, 5, t, cap, &mut c2)
                                        }
                                        "avx512v" => {
                                            wide::avx512v::scan::<true>(&r0, 5, t, cap, &mut c2)
                                        }
                                        other => panic!("no build named {other}"),
                                    };
                                    (o, o2)
                                };
                                let what = format!("{name} {emit:?} prefetch {prefetch} n {n} t {t} cap {cap} {bad:?}");
                                let got = max_as_known(seen(&r, c, o), &want, t);
                                assert_eq!(got, want, "fused {what}");
                                let got = max_as_known(seen(&r0, c2, o2), &want_scan, t);
                                assert_eq!(got, want_scan, "scan {what}");
                                compared += 1;
                                if cap != usize::MAX {
                                    // A zeroing pass is never capped (see `fused_one`).
                                    continue;
                                }
                                let (mut r, mut c) = (r0.clone(), Cand::default());
                                let tz = (t, zero_from);
                                // SAFETY: as above.
                                let o = unsafe {
                                    let (rr, cc) = (&mut r, &mut c);
                                    wide_fused::<true>(
                                        (name, prefetch),
                                        emit,
                                        rr,
                                        &g,
                                        (5, tz),
                                        cap,
                                        cc,
                                        None,
                                    )
                                };
                                let got = max_as_known(seen(&r, c, o), &want_zeroed, t);
                                assert_eq!(got, want_zeroed, "zeroing {what}");
                                zeroed += 1;
                            }
                        }
                        emitted += usize::from(!want.1.is_empty());
                    }
                }
            }
        }
        if isas.iter().any(|i| i.1) {
            assert!(compared > 100, "compared {compared}");
            assert!(zeroed > 40, "zeroing passes compared {zeroed}");
        }
        assert!(emitted > 40, "most cases emit candidates: {emitted}");
    }

    /// An adaptive pass ends in the branch-free form where most groups hold a hit, and
    /// in the branchy one where none do, whatever form it started from; with AVX-512 it
    /// ends dense where many elements are hits, and not where few are.
    #[test]
    fn adaptive_form_follows_the_hit_rate() {
        if isa() == Isa::Base {
            return;
        }
        let g: Vec<f32> = (0..4 * CHUNK).map(|i| 1.0 + (i % 101) as f32).collect();
        let avx512 = isa() == Isa::Avx512;
        // Hit rates 100 %, 2 of 101 (a hit in most groups, fewer than one element in 32)
        // and none.
        let cases = [
            (0, true, avx512),
            (abs_bits(100.5), true, false),
            (INF_BITS, false, false),
        ];
        for (t, want, want_dense) in cases {
            for start in [(false, false), (true, false), (true, true)] {
                let mut r = vec![0.0f32; g.len()];
                let mut c = Cand {
                    branch_free: start.0,
                    dense: start.1,
                    ..Cand::default()
                };
                fused_any::<false, false>(
                    EmitForm::Adaptive,
                    (false, false),
                    &mut r,
                    &g,
                    0,
                    (t, t),
                    usize::MAX,
                    &mut c,
                    (None, None),
                );
                assert_eq!(c.branch_free, want, "t {t} from {start:?}");
                assert_eq!(c.dense, want_dense, "t {t} from {start:?}");
            }
        }
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
