//! Selection among the candidates of a pass that are still split by parallel piece
//! ([`Cand::lists`]), run per piece on the rayon pool: the exact `k`-th magnitude from a
//! histogram of the candidates' magnitudes that each piece builds right after its pass
//! (each piece then picks the one bucket that holds it out of its list, and only that
//! bucket is selected in serial), and the result built by every
//! piece writing its share straight into it and finishing its own range of the residual
//! (zeroing what it selected, or putting back what the pass zeroed and it did not select).
//!
//! The serial parts are the histogram merge and the few candidates of one bucket, so the
//! steps after the pass shrink with the threads instead of staying serial (gathering the
//! pieces' lists, selecting among all candidates, zeroing, building the result). Every
//! result equals the serial selection's bit for bit: the same set in the same order. The
//! one list of a serial pass is selected among directly (no histogram).

use std::mem::MaybeUninit;

use crate::kernel::{self, abs_bits, Cand};
use crate::order;
use crate::spare::Spare;

/// Below this many candidates in all, the lists of a split pass that takes every
/// candidate ([`take_all`]) are joined in serial ([`Cand::join_if_fewer`]); exact top-k
/// and MSTopK join theirs below [`SPLIT_CAND`].
pub(crate) const PAR_CAND: usize = 1 << 15;

/// Below this many candidates in all, the lists of a split pass that did not zero its
/// candidates are joined and selected among in serial; from it on they stay apart
/// ([`kth_of_lists`]) and the result is written by the pieces in parallel.
pub(crate) const SPLIT_CAND: usize = 1 << 13;

/// From this `k` on, a pass split over a pool zeroes its candidates while they are in
/// the core's first-level cache (and builds each piece's histogram right after), and
/// the selection puts back the few it does not take; below it, the selection zeroes
/// the `k` it takes afterwards, in a residual that has left the caches. Since a zeroing
/// pass zeroes in the loop that reads its candidates back (`kernel::wide`), that costs
/// less than `k` scattered writes from here: on the 2-core AVX2 VM, at 2^20, ρ = 0.01
/// (`k` = 10 485; the step on a 2-thread pool, median ratio to `stream` over 1000
/// rounds, 6 launches alternating both builds), exact top-k 1.27–1.39× → 1.16–1.23× and
/// MSTopK 1.36–1.53× → 1.22–1.30× against 2^15 before; at 2^24, ρ = 0.001, 1.10× →
/// 1.03×. At 2^22, ρ = 0.001 (`k` = 4 194, below this), zeroing in the pass was 3–5 %
/// slower.
pub(crate) const ZERO_K: usize = 1 << 13;

// A zeroing pass holds at least `k >= ZERO_K` candidates, so its lists are never joined
// (`join_if_fewer(SPLIT_CAND)`) and each piece settles its own part of the residual.
const _: () = assert!(ZERO_K >= SPLIT_CAND);

/// Most buckets of a histogram (a power of two): they span one binade above the
/// threshold.
const MAX_BUCKETS_LOG: u32 = 11;

/// The fused pass of exact top-k and MSTopK (`STATS`: MSTopK's statistics) from threshold
/// `t` with candidate cap `cap`, for `k` entries. Split over a pool for large `k`
/// ([`ZERO_K`]), the pass zeroes every candidate while it is in cache and each piece
/// builds its histogram right after, and the selection puts back the few it does not take
/// (fewer scattered writes into a residual that has left the cache); in one serial pass, or
/// for small `k`, the selection zeroes what it takes. Returns the pass and whether it zeroed.
///
/// `zero_from`: where the zeroing pass starts zeroing (see [`crate::kernel::fused_split`]);
/// the selectors pass the last call's k-th magnitude when they start warm. `near`: a guess
/// of where the boundary magnitude lies; the pieces then [`prepare_near`] instead of
/// building histograms.
///
/// `serial_zeroes`: a serial pass zeroes too, for a selection that settles the residual
/// per candidate from the lists ([`select_ms`], MSTopK's) rather than after selecting
/// ([`crate::kernel::select_k_near`], exact top-k's serial path, which would put every
/// candidate back first). The `k` scattered writes into a residual in the second-level
/// cache after the pass cost more than zeroing in the pass and putting back the few not
/// taken: on the 2-core AVX-512 Xeon (fresh gradients, ρ = 0.01, five alternations of
/// 1500 rounds, median ratio to the floor) MSTopK at 2^16 went from 2.02–2.11× to
/// 1.94–2.01× (again: 1.97–2.02× to 1.95–1.99×), level at 2^14, 2^18 and ρ = 0.001. Exact
/// top-k with it: 1.83–1.90× → 1.99–2.05× at 2^16.
pub(crate) fn fused_pass<const STATS: bool>(
    residual: &mut [f32],
    grad: &[f32],
    (t, zero_from, cap, k): (i32, i32, usize, usize),
    (near, serial_zeroes): (Option<(i32, i32)>, bool),
    cand: &mut Cand,
    pieces: &mut Vec<Piece>,
) -> (crate::kernel::PassOut, bool) {
    let np = crate::kernel::pieces(residual.len());
    let zero = if np > 1 { k >= ZERO_K } else { serial_zeroes };
    #[cfg(test)]
    if zero && np == 1 {
        tests::SERIAL_ZEROED.with(|c| c.set(c.get() + 1));
    }
    let b = Buckets::new(t, k);
    let post = (pieces, move |l: &Cand, p: &mut Piece| match (zero, near) {
        (false, _) => {}
        (true, Some(band)) => prepare_near(l, p, band),
        (true, None) => prepare(l, p, b),
    });
    let out = if zero {
        crate::kernel::fused_split::<STATS, true, _>(
            residual,
            grad,
            (t, zero_from),
            cap,
            cand,
            post,
        )
    } else {
        crate::kernel::fused_split::<STATS, false, _>(residual, grad, (t, t), cap, cand, post)
    };
    (out, zero)
}

/// Scratch of one piece, kept between calls.
#[derive(Debug, Default, Clone)]
pub(crate) struct Piece {
    /// Candidates per bucket ([`prepare`]; empty after [`prepare_near`]).
    hist: Vec<u32>,
    /// The piece's candidate magnitudes in `band`, in list order: set by [`prepare_near`]
    /// from a guess, or by [`boundary`] to one bucket of the histogram.
    members: Vec<i32>,
    band: Option<(i32, i32)>,
    /// The piece's candidates above `band` (set with it).
    above: usize,
    /// Candidates the piece keeps for sure, and its range of ranks among the ranked ones.
    sure: usize,
    ranked: (usize, usize),
    /// Candidates the piece writes.
    count: usize,
    /// Smallest magnitude the piece writes.
    min_bits: i32,
    /// The piece's candidates at or above each threshold [`count_ge`] counted.
    ge: Vec<usize>,
}

impl Piece {
    /// Number of the piece's candidates (list `l`) with magnitude `>= x`: from the count
    /// above its band and the members when `x` falls in the band, else by counting.
    fn count_ge(&self, l: &Cand, b: &Buckets, x: i32) -> usize {
        if x <= b.t {
            return l.val.len();
        }
        match self.band {
            Some((lo, hi)) if (lo..=hi).contains(&x) => {
                self.above + self.members.iter().filter(|&&m| m >= x).count()
            }
            _ => kernel::count_vals_ge(&l.val, x),
        }
    }
}

/// Scratch of a split selection: one [`Piece`] per list plus the merged histogram.
#[derive(Debug, Default, Clone)]
pub(crate) struct Work {
    pub(crate) pieces: Vec<Piece>,
    /// Magnitudes of the boundary band of every piece, in piece order.
    members: Vec<i32>,
}

/// The histogram layout over magnitudes `>= t`: bucket `(m - t) >> shift`, the last one
/// open-ended. About eight candidates a bucket for `k` of them, at least 64 and at most
/// 2^11 buckets, which span one binade above `t` (where the `k`-th magnitude lies unless
/// the sample was far off; then the last bucket is large, and selecting in it is slower,
/// never wrong).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buckets {
    t: i32,
    shift: u32,
    n: usize,
}

impl Buckets {
    /// The layout for candidates `>= t` of a selection of about `k`.
    pub(crate) fn new(t: i32, k: usize) -> Self {
        let log = (k / 8).max(64).next_power_of_two().trailing_zeros();
        let log = log.min(MAX_BUCKETS_LOG);
        Buckets {
            t,
            shift: 23 - log,
            n: 1 << log,
        }
    }

    /// Bucket of magnitude bits `m` ([`kernel::bucket_of`], as [`prepare`] counts them).
    #[cfg(test)]
    pub(crate) fn of(&self, m: i32) -> usize {
        kernel::bucket_of(m, (self.t, self.shift), self.n - 1)
    }

    /// The magnitude bits (never negative) `lo..=hi` that fall in bucket `j`
    /// ([`Self::of`]): the first bucket reaches down to 0, the last one up to `i32::MAX`.
    pub(crate) fn range(&self, j: usize) -> (i32, i32) {
        let at = |j: usize| i64::from(self.t) + ((j as i64) << self.shift);
        let lo = if j == 0 { 0 } else { at(j) };
        let hi = if j + 1 >= self.n {
            i64::from(i32::MAX)
        } else {
            at(j + 1) - 1
        };
        let clamp = |x: i64| x.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
        (clamp(lo), clamp(hi))
    }
}

/// Histograms one list's magnitudes: what a piece computes right after its pass
/// ([`crate::kernel::fused_split`]), while its candidates are in cache. No counting sort
/// by bucket: [`boundary`] picks the one bucket it needs out of the lists instead. The
/// sort's scattered writes (one cursor per bucket, 2^11 of them) were about two thirds of
/// this function's samples at 2^24, ρ = 0.01.
pub(crate) fn prepare(l: &Cand, p: &mut Piece, b: Buckets) {
    // No bucket's members are held until `boundary` picks them.
    p.band = None;
    p.hist.clear();
    p.hist.resize(b.n, 0);
    kernel::histogram(&l.val, (b.t, b.shift), &mut p.hist);
}

/// What a piece computes right after its pass instead of [`prepare`] when the selector
/// has a guess `lo..=hi` of where the boundary magnitude lies (a warm call's
/// [`crate::warm::WarmStart::kth_range`]): the count above the guess and the magnitudes
/// inside it, two vectorised scans of the list. When the guess holds the boundary,
/// [`boundary`] needs neither a histogram (about one scattered increment per candidate,
/// 3.3 µs of a piece of 2^18 elements at ρ = 0.01) nor a second round on the pool to pick
/// the boundary bucket out of the lists; when it misses, it histograms then.
pub(crate) fn prepare_near(l: &Cand, p: &mut Piece, (lo, hi): (i32, i32)) {
    p.hist.clear();
    p.band = Some((lo, hi));
    p.above = kernel::count_vals_ge(&l.val, hi.saturating_add(1));
    p.members.clear();
    kernel::magnitudes_in(&l.val, (lo, hi), &mut p.members);
}

/// Runs `f` on every list with its scratch: in parallel over several, inline for one (no
/// hand-off to the pool).
fn each<T: Send>(lists: &[Cand], work: &mut [T], f: impl Fn(usize, &Cand, &mut T) + Sync + Send) {
    if lists.len() == 1 {
        f(0, &lists[0], &mut work[0]);
    } else {
        // As the pass's pieces ([`crate::kernel::run_pieces`]): no join that puts the
        // calling thread to sleep while the other finishes.
        crate::kernel::run_pieces(&mut work[..lists.len()], |i, w| f(i, &lists[i], w));
    }
}

/// The magnitude band that holds the one where the count from the top first reaches
/// `k + strict` (`strict` 0: at least `k`, 1: more than `k`) over the [`prepare`]d or
/// [`prepare_near`]d pieces, and the count above the band; collects the band's
/// magnitudes: each piece's in its `members`, all of them in `w.members`. The band is the
/// pieces' guess when it holds that magnitude, else one bucket of their merged histograms
/// (each piece picks its members out of its list in parallel).
fn boundary(
    lists: &[Cand],
    b: &Buckets,
    k: usize,
    strict: usize,
    w: &mut Work,
) -> ((i32, i32), usize) {
    let np = lists.len();
    let want = k + strict;
    let guess = w.pieces[0].band;
    if guess.is_some() && w.pieces[..np].iter().all(|p| p.band == guess) {
        let above: usize = w.pieces[..np].iter().map(|p| p.above).sum();
        let inside: usize = w.pieces[..np].iter().map(|p| p.members.len()).sum();
        if let Some(band) = guess.filter(|_| above < want && above + inside >= want) {
            w.members.clear();
            for p in &w.pieces[..np] {
                w.members.extend_from_slice(&p.members);
            }
            return (band, above);
        }
    }
    if w.pieces[..np]
        .iter()
        .any(|p| p.band.is_some() || p.hist.len() != b.n)
    {
        // The guess missed (or there was none): histogram the lists now.
        each(lists, &mut w.pieces[..np], |_, l, p| prepare(l, p, *b));
    }
    let pieces = &w.pieces[..np];
    // From the bottom, merging the pieces' counts bucket by bucket only as far as needed:
    // a warm or sampled threshold lies just below the `k`-th magnitude, so its bucket is
    // among the first of up to 2^11 (merging whole histograms written on other cores, and
    // scanning them from the top, took 3 µs of a 280 µs step at 2^20, ρ = 0.01).
    let total: usize = lists.iter().map(|l| l.val.len()).sum();
    let (mut kb, mut above) = (0, total);
    if want == 0 {
        // Nothing to reach: the top bucket, with nothing above it.
        (kb, above) = (b.n - 1, 0);
    } else if total >= want {
        for j in 0..b.n {
            above -= pieces.iter().map(|p| p.hist[j] as usize).sum::<usize>();
            if above < want {
                kb = j;
                break;
            }
        }
    }
    let band = b.range(kb);
    each(lists, &mut w.pieces[..np], |_, l, p| {
        p.band = Some(band);
        p.above = l.val.len() - p.hist[..=kb].iter().map(|&c| c as usize).sum::<usize>();
        p.members.clear();
        p.members.reserve(p.hist[kb] as usize);
        kernel::magnitudes_in(&l.val, band, &mut p.members);
    });
    w.members.clear();
    for p in &w.pieces[..np] {
        w.members.extend_from_slice(&p.members);
    }
    (band, above)
}

/// Exact top-`k` (largest magnitude, the lower index on ties) among the candidates of
/// `cand`, all of magnitude `>= b.t` and, when `prepared`, [`prepare`]d with layout `b`,
/// for `0 < k <= cand.len()`: the selected (indices, values) in index order and the `k`-th
/// magnitude's bits. See [`write`] for the residual.
pub(crate) fn select_k(
    cand: &mut Cand,
    (b, prepared): (&Buckets, bool),
    k: usize,
    residual: Residual<'_>,
    w: &mut Work,
) -> (Vec<u32>, Vec<f32>, i32) {
    with_spare(cand, |cand, spare| {
        select_k_in(cand, (b, prepared), k, residual, w, spare)
    })
}

/// [`select_k`] with the result written into `spare`'s buffers where they fit.
fn select_k_in(
    cand: &Cand,
    (b, prepared): (&Buckets, bool),
    k: usize,
    residual: Residual<'_>,
    w: &mut Work,
    spare: &mut Spare,
) -> (Vec<u32>, Vec<f32>, i32) {
    let (lists, piece) = cand.lists();
    let np = lists.len();
    w.pieces.resize_with(np, Piece::default);
    if k == cand.len() {
        // Everything: no selection to make.
        for (p, l) in w.pieces.iter_mut().zip(lists) {
            (p.sure, p.ranked, p.count) = (l.idx.len(), (0, 0), l.idx.len());
        }
        let (idx, val) = write(lists, piece, residual, w, Class::ALL, spare);
        let min = w.pieces[..np].iter().map(|p| p.min_bits).min();
        return (idx, val, min.unwrap_or(0));
    }
    let kth = if np == 1 {
        // One list (a serial pass, not prepared): select among all its magnitudes.
        let kth = crate::kernel::kth_magnitude(&cand.val, k, &mut w.members);
        let gt = cand
            .val
            .iter()
            .map(|v| usize::from(abs_bits(*v) > kth))
            .sum::<usize>();
        let p = &mut w.pieces[0];
        (p.sure, p.ranked, p.count) = (0, (0, k - gt), k);
        kth
    } else if prepared {
        kth_of_prepared(lists, b, k, w)
    } else {
        kth_of_lists(lists, k, w)
    };
    let class = Class::above_then_ties(kth);
    let (idx, val) = write(lists, piece, residual, w, class, spare);
    (idx, val, kth)
}

/// The `k`-th magnitude over `np` [`prepare`]d pieces, with each piece's share of the
/// selection set (`sure`, `ranked`, `count`): ties at it go to the lowest indices, that is
/// in piece order.
fn kth_of_prepared(lists: &[Cand], b: &Buckets, k: usize, w: &mut Work) -> i32 {
    let np = lists.len();
    let (_, above) = boundary(lists, b, k, 0, w);
    let need = k - above;
    let kth = order::kth_largest(&mut w.members, need);
    let (mut ties, mut taken) = (need, 0);
    for p in &mut w.pieces[..np] {
        let gt = p.members.iter().filter(|&&m| m > kth).count();
        let eq = p.members.iter().filter(|&&m| m == kth).count();
        p.sure = p.above + gt;
        ties -= gt;
        p.ranked = (0, eq);
    }
    // `ties` is now the count of the k-th magnitude still to take, lowest pieces first.
    for p in &mut w.pieces[..np] {
        let take = p.ranked.1.min(ties - taken);
        taken += take;
        p.ranked = (0, take);
        p.count = p.sure + take;
    }
    kth
}

/// The `k`-th magnitude over the lists of a split pass that were not [`prepare`]d (`k`
/// below [`ZERO_K`]), selected in serial among all of their magnitudes, with
/// each piece's share set as [`kth_of_prepared`] does. The lists stay apart, so that
/// [`write`] builds the result and finishes the residual piece by piece in parallel:
/// joined, the serial copy and the serial zeroing of the taken entries (in a residual that
/// had left the core's caches) cost about a fifth of the floor at 2^20, ρ = 0.01.
fn kth_of_lists(lists: &[Cand], k: usize, w: &mut Work) -> i32 {
    w.members.clear();
    for l in lists {
        w.members.extend(l.val.iter().map(|v| abs_bits(*v)));
    }
    let kth = order::kth_largest(&mut w.members, k);
    let mut ties = k;
    for (p, l) in w.pieces.iter_mut().zip(lists) {
        let (gt, eq) = l.val.iter().fold((0, 0), |(gt, eq), v| {
            let m = abs_bits(*v);
            (gt + usize::from(m > kth), eq + usize::from(m == kth))
        });
        p.sure = gt;
        p.ranked = (0, eq);
        ties -= gt;
    }
    // `ties` is now the count of the k-th magnitude still to take, lowest pieces first.
    for p in &mut w.pieces[..lists.len()] {
        let take = p.ranked.1.min(ties);
        ties -= take;
        p.ranked = (0, take);
        p.count = p.sure + take;
    }
    kth
}

/// Runs `f` on the candidates with their spare buffers taken out (so that the result can
/// be written into them while the lists are read), and puts back what `f` left of them.
fn with_spare<R>(cand: &mut Cand, f: impl FnOnce(&Cand, &mut Spare) -> R) -> R {
    let mut spare = std::mem::take(&mut cand.spare);
    let r = f(cand, &mut spare);
    cand.spare = spare;
    r
}

/// The residual a selection finishes: none (a read-only selection), one whose selected
/// entries are to be zeroed, or one whose candidates the pass already zeroed from
/// [`Cand::zeroed_from`] up (the ones not selected among those get their values back, and
/// the ones selected below it are zeroed).
pub(crate) enum Residual<'a> {
    None,
    Zero(&'a mut [f32]),
    Restore(&'a mut [f32]),
}

impl<'a> Residual<'a> {
    /// The range of the first `len` entries, and the rest.
    fn split(self, len: usize) -> (Residual<'a>, Residual<'a>) {
        match self {
            Residual::None => (Residual::None, Residual::None),
            Residual::Zero(r) => {
                let (a, b) = r.split_at_mut(len.min(r.len()));
                (Residual::Zero(a), Residual::Zero(b))
            }
            Residual::Restore(r) => {
                let (a, b) = r.split_at_mut(len.min(r.len()));
                (Residual::Restore(a), Residual::Restore(b))
            }
        }
    }
}

/// Puts back the values of every candidate of `cand` into `residual` (undoing a zeroing
/// pass, e.g. before a fallback re-reads the accumulated vector).
pub(crate) fn restore(residual: &mut [f32], cand: &Cand) {
    for l in cand.lists().0 {
        for (&i, &v) in l.idx.iter().zip(&l.val) {
            residual[i as usize] = v;
        }
    }
}

/// Builds the result: every piece writes, in index order, its candidates that `class`
/// marks sure plus those it marks ranked whose rank among the piece's ranked ones lies in
/// its `ranked` range, into its share of the lists (`count` entries), and finishes its
/// range of the residual (zeroes what it wrote, or restores what it did not). Also
/// records each piece's smallest magnitude written. The lists are `spare`'s buffers where
/// they fit.
fn write(
    lists: &[Cand],
    piece: usize,
    residual: Residual<'_>,
    w: &mut Work,
    class: Class,
    spare: &mut Spare,
) -> (Vec<u32>, Vec<f32>) {
    let pieces = &mut w.pieces[..lists.len()];
    let total: usize = pieces.iter().map(|p| p.count).sum();
    let (mut idx, mut val) = spare.lists(total);
    {
        // On the stack for up to eight pieces: a call allocates nothing in steady state.
        let mut outs: smallvec::SmallVec<[Out; 8]> = smallvec::SmallVec::new();
        let (mut ri, mut rv) = (
            &mut idx.spare_capacity_mut()[..total],
            &mut val.spare_capacity_mut()[..total],
        );
        let mut res = residual;
        for p in pieces.iter_mut() {
            let (a, b) = std::mem::take(&mut ri).split_at_mut(p.count);
            let (c, d) = std::mem::take(&mut rv).split_at_mut(p.count);
            (ri, rv) = (b, d);
            let (mine, rest) = std::mem::replace(&mut res, Residual::None).split(piece);
            res = rest;
            outs.push(Out {
                idx: a,
                val: c,
                residual: mine,
                piece: p,
            });
        }
        each(lists, &mut outs, |i, l, o| {
            let lo = i.saturating_mul(piece);
            let count = o.idx.len();
            let (at, min) = write_piece(l, class, o, lo);
            assert_eq!(at, o.idx.len(), "a piece wrote other than its share");
            o.piece.min_bits = min;
            if let Residual::Zero(r) = &mut o.residual {
                for x in &o.idx[..at.min(count)] {
                    // SAFETY: the first `at` entries were written just above.
                    r[unsafe { x.assume_init() } as usize - lo] = 0.0;
                }
            }
        });
    }
    // SAFETY: each piece wrote exactly its `count` entries of its share (asserted above),
    // and the shares tile `0..total`.
    unsafe {
        idx.set_len(total);
        val.set_len(total);
    }
    (idx, val)
}

/// Shares of [`write`] from this many entries prefetch their output four lines ahead (the
/// AVX-512 loop; the AVX2 one, unmeasured with it, does not):
/// the result's lists, recycled from a call made before other work, are most likely out of
/// the cache, and a store to a line that is not there waits for it. On the 2-core Zen 5 at
/// 2^20, ρ = 0.01 (a share of about 2,600), eight cases in turn, alternating builds: exact
/// top-k 1.60–1.73× → 1.57–1.67×, MSTopK 1.65–1.70× → 1.60–1.64×.
const WRITE_AHEAD_MIN: usize = 1024;

/// How [`write`] classes a candidate by its magnitude bits `m`: kept for sure when
/// `m > gt`, ranked when `band.0 <= m <= band.1` (the two never overlap).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Class {
    gt: i32,
    band: (i32, i32),
}

impl Class {
    /// Every candidate, for sure (magnitude bits are never negative).
    const ALL: Class = Class {
        gt: -1,
        band: (1, 0),
    };

    /// Above the `k`-th magnitude for sure, ranked at it.
    fn above_then_ties(kth: i32) -> Class {
        Class {
            gt: kth,
            band: (kth, kth),
        }
    }

    /// At or above `t1` for sure, ranked in `t2..t1` (MSTopK's two bands).
    fn bands(t1: i32, t2: i32) -> Class {
        Class {
            gt: t1.saturating_sub(1),
            band: (t2, t1.saturating_sub(1)),
        }
    }

    /// At or above `x` for sure, nothing ranked.
    fn at_or_above(x: i32) -> Class {
        Class {
            gt: x.saturating_sub(1),
            band: (1, 0),
        }
    }

    /// (sure, ranked) for magnitude bits `m`.
    #[inline(always)]
    fn of(self, m: i32) -> (bool, bool) {
        (m > self.gt, m >= self.band.0 && m <= self.band.1)
    }
}

/// One piece's part of [`write`]: its kept candidates into its share, its residual range
/// finished (for `Restore`; `Zero` is done by the caller). Whole blocks go sixteen at a
/// time with AVX-512 while a full vector store fits in the share; the rest one by one.
/// Returns (entries written, smallest magnitude written).
fn write_piece(l: &Cand, class: Class, o: &mut Out<'_>, lo: usize) -> (usize, i32) {
    let (start, end) = o.piece.ranked;
    let count = o.idx.len();
    let (mut at, mut rank, mut min, mut done) = (0usize, 0usize, i32::MAX, 0usize);
    #[cfg(target_arch = "x86_64")]
    if crate::kernel::isa() == crate::kernel::Isa::Avx512 {
        // SAFETY: AVX-512F checked just above.
        (at, rank, min, done) = unsafe { avx512_write::blocks(l, class, o, lo) };
    } else if crate::kernel::isa() != crate::kernel::Isa::Base {
        // SAFETY: AVX2 checked just above.
        (at, rank, min, done) = unsafe { avx2_write::blocks(l, class, o, lo) };
    }
    for (&j, &v) in l.idx[done..].iter().zip(&l.val[done..]) {
        let m = abs_bits(v);
        let (sure, ranked) = class.of(m);
        let keep = sure | (ranked & (rank >= start) & (rank < end));
        rank += usize::from(ranked);
        // Branch-free: every entry is written at `at`, which advances only past a kept
        // one (a later kept entry overwrites a dropped one; once all `count` are written,
        // only dropped ones are left).
        if at < count {
            o.idx[at].write(j);
            o.val[at].write(v);
        }
        at += usize::from(keep);
        min = if keep { min.min(m) } else { min };
        // The residual's kind first: a `Zero` one (the serial passes) adds no branch on
        // `keep`, which is unpredictable.
        if let Residual::Restore(r) = &mut o.residual {
            if keep != (m >= l.zeroed_from) {
                r[j as usize - lo] = if keep { 0.0 } else { v };
            }
        }
    }
    (at, min)
}

#[cfg(target_arch = "x86_64")]
mod avx512_write {
    use super::{ranked_lanes, Class, Out};
    use crate::kernel::Cand;
    use std::arch::x86_64::*;

    /// [`super::write_piece`]'s whole blocks, while `at + 16` fits the share. Returns
    /// (entries written, ranked entries seen, smallest magnitude written, entries read).
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn blocks(
        l: &Cand,
        class: Class,
        o: &mut Out<'_>,
        lo: usize,
    ) -> (usize, usize, i32, usize) {
        let (start, end) = o.piece.ranked;
        let n = l.idx.len().min(l.val.len());
        let count = o.idx.len();
        let abs = _mm512_set1_epi32(0x7fff_ffff);
        let (gt, b0, b1) = (
            _mm512_set1_epi32(class.gt),
            _mm512_set1_epi32(class.band.0),
            _mm512_set1_epi32(class.band.1),
        );
        let mut vmin = _mm512_set1_epi32(i32::MAX);
        let zf = _mm512_set1_epi32(l.zeroed_from);
        let (mut at, mut rank, mut i) = (0usize, 0usize, 0usize);
        let (pi, pv) = (
            o.idx.as_mut_ptr().cast::<u32>(),
            o.val.as_mut_ptr().cast::<f32>(),
        );
        let ahead = count >= super::WRITE_AHEAD_MIN;
        while i + 16 <= n && at + 16 <= count {
            // SAFETY: `i + 16 <= n` reads; `at + 16 <= count` writes within the share.
            unsafe {
                if ahead {
                    let (pa, va) = (pi.wrapping_add(at + 64), pv.wrapping_add(at + 64));
                    _mm_prefetch::<_MM_HINT_T0>(pa.cast_const().cast());
                    _mm_prefetch::<_MM_HINT_T0>(va.cast_const().cast());
                }
                let vi = _mm512_loadu_si512(l.idx.as_ptr().add(i).cast());
                let vv = _mm512_loadu_si512(l.val.as_ptr().add(i).cast());
                let m = _mm512_and_si512(vv, abs);
                let sure = _mm512_cmpgt_epi32_mask(m, gt);
                let band = _mm512_cmpge_epi32_mask(m, b0) & _mm512_cmple_epi32_mask(m, b1);
                let nb = band.count_ones() as usize;
                let ranked = ranked_lanes(u32::from(band), rank, (start, end)) as u16;
                rank += nb;
                let keep = sure | ranked;
                _mm512_storeu_si512(pi.add(at).cast(), _mm512_maskz_compress_epi32(keep, vi));
                _mm512_storeu_si512(pv.add(at).cast(), _mm512_maskz_compress_epi32(keep, vv));
                at += keep.count_ones() as usize;
                vmin = _mm512_mask_min_epi32(vmin, keep, vmin, m);
                let zeroed = _mm512_cmpge_epi32_mask(m, zf);
                super::settle(o, l, i, u32::from(keep ^ zeroed), lo);
            }
            i += 16;
        }
        (at, rank, _mm512_reduce_min_epi32(vmin), i)
    }
}

/// [`write_piece`]'s whole groups of eight with AVX2: the kept lanes moved to the front
/// by one permutation ([`crate::order::avx2::pack`]). The scalar loop's branch on whether
/// to put an entry back was a coin toss for the entries near the k-th magnitude.
#[cfg(target_arch = "x86_64")]
mod avx2_write {
    use super::{ranked_lanes, Class, Out};
    use crate::kernel::Cand;
    use crate::order::avx2::{gt_mask, pack};
    use std::arch::x86_64::*;

    /// As `avx512_write::blocks`, eight at a time, while `at + 8` fits the share.
    ///
    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn blocks(
        l: &Cand,
        class: Class,
        o: &mut Out<'_>,
        lo: usize,
    ) -> (usize, usize, i32, usize) {
        let n = l.idx.len().min(l.val.len());
        let count = o.idx.len();
        let abs = _mm256_set1_epi32(0x7fff_ffff);
        // `m >= band.0` is `m > band.0 - 1`; magnitudes are never negative, so a band
        // from 0 or below starts at -1 without overflow.
        let (gt, b0, b1) = (
            _mm256_set1_epi32(class.gt),
            _mm256_set1_epi32(class.band.0.max(0) - 1),
            _mm256_set1_epi32(class.band.1),
        );
        let lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        // `m >= zeroed_from` as `m > zeroed_from - 1`, as for the band.
        let zf = _mm256_set1_epi32(l.zeroed_from.max(0) - 1);
        let mut vmin = _mm256_set1_epi32(i32::MAX);
        let (mut at, mut rank, mut i) = (0usize, 0usize, 0usize);
        let (pi, pv) = (
            o.idx.as_mut_ptr().cast::<u32>(),
            o.val.as_mut_ptr().cast::<f32>(),
        );
        while i + 8 <= n && at + 8 <= count {
            // SAFETY: `i + 8 <= n` reads; `at + 8 <= count` writes within the share.
            unsafe {
                let vi = _mm256_loadu_si256(l.idx.as_ptr().add(i).cast());
                let vv = _mm256_loadu_si256(l.val.as_ptr().add(i).cast());
                let m = _mm256_and_si256(vv, abs);
                let sure = gt_mask(m, gt);
                let band = gt_mask(m, b0) & !gt_mask(m, b1);
                let keep = sure | ranked_lanes(band, rank, o.piece.ranked);
                rank += band.count_ones() as usize;
                _mm256_storeu_si256(pi.add(at).cast(), pack(vi, keep));
                _mm256_storeu_si256(pv.add(at).cast(), pack(vv, keep));
                at += keep.count_ones() as usize;
                // The kept lanes' magnitudes into the minimum, the others as `i32::MAX`.
                let kv = _mm256_set1_epi32(keep as i32);
                let kv = _mm256_cmpeq_epi32(_mm256_and_si256(kv, lane_bits), lane_bits);
                vmin =
                    _mm256_min_epi32(vmin, _mm256_blendv_epi8(_mm256_set1_epi32(i32::MAX), m, kv));
                super::settle(o, l, i, (keep ^ gt_mask(m, zf)) & 0xff, lo);
            }
            i += 8;
        }
        let mut lanes = [0i32; 8];
        // SAFETY: `lanes` has room for eight.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), vmin) };
        (at, rank, lanes.into_iter().fold(i32::MAX, i32::min), i)
    }
}

/// With a `Restore` residual, settles the candidates of `l` at `i + lane` for each lane
/// set in `wrong` (those whose residual entry a SIMD group of [`write_piece`] must
/// change: kept but not zeroed by the pass, or zeroed but not kept): zeroes the first and
/// puts the value of the second back.
#[inline(always)]
fn settle(o: &mut Out<'_>, l: &Cand, i: usize, mut wrong: u32, lo: usize) {
    if let Residual::Restore(r) = &mut o.residual {
        while wrong != 0 {
            let lane = wrong.trailing_zeros() as usize;
            let v = l.val[i + lane];
            let zeroed = abs_bits(v) >= l.zeroed_from;
            r[l.idx[i + lane] as usize - lo] = if zeroed { v } else { 0.0 };
            wrong &= wrong - 1;
        }
    }
}

/// The lanes of `band` (a lane mask of ranked candidates, the first of them ranked `rank`
/// among its piece's) whose rank falls in `start..end`.
#[inline(always)]
fn ranked_lanes(band: u32, rank: usize, (start, end): (usize, usize)) -> u32 {
    let nb = band.count_ones() as usize;
    if nb == 0 || rank >= end || rank + nb <= start {
        0
    } else if rank >= start && rank + nb <= end {
        band
    } else {
        // The group straddles the ranked range: lane by lane.
        let (mut bits, mut r, mut keep) = (band, rank, 0u32);
        while bits != 0 {
            let lane = bits & bits.wrapping_neg();
            if r >= start && r < end {
                keep |= lane;
            }
            r += 1;
            bits &= bits - 1;
        }
        keep
    }
}

/// One piece's share of the result and of the residual.
struct Out<'a> {
    idx: &'a mut [MaybeUninit<u32>],
    val: &'a mut [MaybeUninit<f32>],
    residual: Residual<'a>,
    piece: &'a mut Piece,
}

/// How MSTopK's search ended, as [`select_ms`] needs it.
pub(crate) struct MsPick {
    /// `thres1` and `thres2` of Algorithm 1 as magnitude bits.
    pub t1: i32,
    pub t2: i32,
}

/// MSTopK's boundary band over the [`prepare`]d or [`prepare_near`]d candidates of a split
/// pass: one with at most `k` candidates above it and more than `k` from it on. Returns
/// it (magnitude bits `lo..=hi`) and the count above it, and [`Work::members_mut`] holds
/// its magnitudes; for the one list of a serial pass, `None`, and the members are all its
/// magnitudes.
pub(crate) fn ms_boundary(
    cand: &Cand,
    b: &Buckets,
    k: usize,
    w: &mut Work,
) -> Option<((i32, i32), usize)> {
    let np = cand.lists().0.len();
    if np == 1 {
        // One list (a serial pass, not prepared): the search partitions all of it.
        w.members.clear();
        w.members.extend(cand.val.iter().map(|v| abs_bits(*v)));
        return None;
    }
    Some(boundary(cand.lists().0, b, k, 1, w))
}

/// Counts of `|x| >= t1` and of `t2 <= |x| < t1` (MSTopK's `iota1`, `iota2`) over the
/// [`prepare`]d candidates, from each piece's histogram and one bucket of it.
pub(crate) fn ms_counts(cand: &Cand, b: &Buckets, p: &MsPick, w: &mut Work) -> (usize, usize) {
    let np = cand.lists().0.len();
    w.pieces.resize_with(np, Piece::default);
    let (mut a, mut c) = (0, 0);
    for (q, l) in w.pieces[..np].iter_mut().zip(cand.lists().0) {
        let (ge1, ge2) = if np == 1 {
            // One list: count it at both thresholds in the widest build (the loop here,
            // compiled for the baseline's four lanes, took 0.2 µs of MSTopK's step at
            // 2^16, ρ = 0.01, for 800 candidates).
            let count = |t| crate::kernel::count_vals_ge(&cand.val, t);
            (count(p.t1), count(p.t2))
        } else {
            (q.count_ge(l, b, p.t1), q.count_ge(l, b, p.t2))
        };
        let ge2 = ge2.max(ge1);
        q.sure = ge1;
        q.ranked = (0, ge2 - ge1);
        a += ge1;
        c += ge2 - ge1;
    }
    (a, c)
}

/// MSTopK's output from the candidates (after [`ms_counts`]): every `|x| >= t1` plus the
/// entries of rank `start..end` among `t2 <= |x| < t1` in index order. See [`write`] for
/// the residual. Returns the lists and the smallest magnitude selected.
pub(crate) fn select_ms(
    cand: &mut Cand,
    p: &MsPick,
    start: usize,
    end: usize,
    residual: Residual<'_>,
    w: &mut Work,
) -> (Vec<u32>, Vec<f32>, i32) {
    with_spare(cand, |cand, spare| {
        select_ms_in(cand, p, (start, end), residual, w, spare)
    })
}

/// [`select_ms`] with the result written into `spare`'s buffers where they fit.
fn select_ms_in(
    cand: &Cand,
    p: &MsPick,
    (start, end): (usize, usize),
    residual: Residual<'_>,
    w: &mut Work,
    spare: &mut Spare,
) -> (Vec<u32>, Vec<f32>, i32) {
    let (lists, piece) = cand.lists();
    let mut before = 0usize;
    for q in &mut w.pieces[..lists.len()] {
        let n2 = q.ranked.1;
        let lo = start.clamp(before, before + n2) - before;
        let hi = end.clamp(before, before + n2) - before;
        before += n2;
        q.ranked = (lo, hi);
        q.count = q.sure + (hi - lo);
    }
    let (t1, t2) = (p.t1, p.t2);
    let (idx, val) = write(lists, piece, residual, w, Class::bands(t1, t2), spare);
    let min = w.pieces[..lists.len()]
        .iter()
        .map(|q| q.min_bits)
        .min()
        .unwrap_or(i32::MAX);
    (idx, val, min)
}

/// Counts the candidates at or above `t` (each piece counts its own list, in parallel)
/// and returns the total; each piece keeps its count, the `i`-th since `fresh`
/// ([`select_ge`] selects at one of them).
///
/// One threshold a call: a Gaussian-k step counts at most three, each chosen from the
/// last count. Counting all seven it may visit at once, eight compares per candidate,
/// took 122 µs of a step at 2^22, ρ = 0.01 (250 000 candidates).
pub(crate) fn count_ge(cand: &Cand, t: i32, fresh: bool, w: &mut Work) -> usize {
    let lists = cand.lists().0;
    w.pieces.resize_with(lists.len(), Piece::default);
    each(lists, &mut w.pieces[..lists.len()], |_, l, p| {
        if fresh {
            p.ge.clear();
        }
        p.ge.push(kernel::count_vals_ge(&l.val, t));
    });
    w.pieces[..lists.len()]
        .iter()
        .map(|p| p.ge.last().copied().unwrap_or(0))
        .sum()
}

/// Every candidate of magnitude `>= x`, in index order, where `x` is the `i`-th threshold
/// [`count_ge`] counted; see [`write`] for the residual.
pub(crate) fn select_ge(
    cand: &mut Cand,
    i: usize,
    x: i32,
    residual: Residual<'_>,
    w: &mut Work,
) -> (Vec<u32>, Vec<f32>) {
    with_spare(cand, |cand, spare| {
        let (lists, piece) = cand.lists();
        for q in &mut w.pieces[..lists.len()] {
            q.sure = q.ge[i];
            (q.ranked, q.count) = ((0, 0), q.sure);
        }
        write(lists, piece, residual, w, Class::at_or_above(x), spare)
    })
}

/// All the candidates, in index order: the one list of a serial pass as it is, the
/// pieces of a split pass joined in serial when few, else copied into one result in
/// parallel.
pub(crate) fn take_all(cand: &mut Cand, w: &mut Work) -> (Vec<u32>, Vec<f32>) {
    cand.join_if_fewer(PAR_CAND);
    if cand.lists().0.len() == 1 {
        return cand.take();
    }
    with_spare(cand, |cand, spare| {
        let (lists, piece) = cand.lists();
        w.pieces.resize_with(lists.len(), Piece::default);
        for (p, l) in w.pieces.iter_mut().zip(lists) {
            (p.sure, p.ranked, p.count) = (l.idx.len(), (0, 0), l.idx.len());
        }
        write(lists, piece, Residual::None, w, Class::ALL, spare)
    })
}

impl Work {
    /// The boundary bucket's magnitudes (see [`ms_boundary`]), for the search to partition.
    pub(crate) fn members_mut(&mut self) -> &mut [i32] {
        &mut self.members
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// Serial passes of [`fused_pass`] that zeroed their candidates on this thread.
        pub(crate) static SERIAL_ZEROED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Two lists of 3000 candidates each, magnitudes in [1, 3) (one binade and a bit more),
    /// both signs, and all their magnitudes.
    fn two_lists() -> (Vec<Cand>, Vec<i32>) {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut lists = vec![Cand::default(), Cand::default()];
        for l in &mut lists {
            for i in 0..3000u32 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let m = 1.0 + (s >> 40) as f32 / (1u64 << 23) as f32;
                l.idx.push(i);
                l.val.push(if s & 1 == 0 { m } else { -m });
            }
        }
        let all = lists
            .iter()
            .flat_map(|l| l.val.iter().map(|v| abs_bits(*v)))
            .collect();
        (lists, all)
    }

    /// Pieces [`prepare_near`]d from a guessed band answer [`boundary`] from the guess when
    /// it holds the boundary magnitude and from the histogram when it does not (too high,
    /// too low); either way the band holds it, the count above it is right, the members
    /// are the band's magnitudes, and [`Piece::count_ge`] counts right.
    #[test]
    fn a_guessed_band_answers_or_falls_back_to_the_histogram() {
        let (lists, all) = two_lists();
        let t = 1.0f32.to_bits() as i32;
        let mut sorted = all.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let (mut hits, mut misses) = (0, 0);
        for (k, strict) in [(1000, 0), (1000, 1), (4000, 1), (1, 0)] {
            let want = k + strict;
            let kth = sorted[want - 1];
            let guesses = [
                (kth - 5000, kth + 5000),
                (kth, kth),
                (kth + 1, kth + 9000),
                (kth - 9000, kth - 1),
            ];
            for guess in guesses {
                let b = Buckets::new(t, k);
                let mut w = Work::default();
                w.pieces.resize_with(lists.len(), Piece::default);
                for (l, p) in lists.iter().zip(&mut w.pieces) {
                    prepare_near(l, p, guess);
                }
                let (band, above) = boundary(&lists, &b, k, strict, &mut w);
                if (guess.0..=guess.1).contains(&kth) {
                    assert_eq!(band, guess, "k {k}: a guess that holds it is kept");
                    hits += 1;
                } else {
                    assert_eq!(band, b.range(b.of(band.0)), "k {k}: a bucket after a miss");
                    misses += 1;
                }
                assert!((band.0..=band.1).contains(&kth), "k {k} guess {guess:?}");
                let direct_above = all.iter().filter(|&&m| m > band.1).count();
                assert_eq!(above, direct_above, "k {k} guess {guess:?}");
                let mut members = w.members.clone();
                members.sort_unstable();
                let mut direct: Vec<i32> = all
                    .iter()
                    .copied()
                    .filter(|m| (band.0..=band.1).contains(m))
                    .collect();
                direct.sort_unstable();
                assert_eq!(members, direct, "k {k} guess {guess:?}");
                for x in [
                    t + 1,
                    band.0,
                    kth,
                    band.1,
                    band.1.saturating_add(1),
                    sorted[0],
                ] {
                    for (l, p) in lists.iter().zip(&w.pieces) {
                        let direct = l.val.iter().filter(|v| abs_bits(**v) >= x).count();
                        assert_eq!(p.count_ge(l, &b, x), direct, "x = {x}");
                    }
                }
            }
        }
        assert!(hits > 0 && misses > 0, "hits {hits}, misses {misses}");
    }

    /// [`boundary`] picks exactly the boundary bucket's magnitudes out of each list, and
    /// [`Piece::count_ge`] counts right both inside that bucket (from the histogram and
    /// the members) and outside it (by counting the list).
    #[test]
    fn boundary_members_and_counts_match_a_direct_count() {
        let (lists, all) = two_lists();
        let t = 1.0f32.to_bits() as i32;
        let k = 1000;
        let b = Buckets::new(t, k);
        let mut w = Work::default();
        w.pieces.resize_with(lists.len(), Piece::default);
        for (l, p) in lists.iter().zip(&mut w.pieces) {
            prepare(l, p, b);
        }
        // The bucket against a count from the top, for several `k` and both `strict`.
        for (kk, strict) in [(1, 0), (1, 1), (999, 1), (3000, 0), (5999, 1), (6000, 0)] {
            for (l, p) in lists.iter().zip(&mut w.pieces) {
                prepare(l, p, b);
            }
            let (band, above) = boundary(&lists, &b, kk, strict, &mut w);
            let kb = b.of(band.0);
            assert_eq!(band, b.range(kb));
            let from = |j: usize| all.iter().filter(|&&m| b.of(m) >= j).count();
            assert!(
                from(kb + 1) < kk + strict && from(kb) >= kk + strict,
                "k {kk}"
            );
            assert_eq!(above, from(kb + 1), "k {kk}");
        }
        for (l, p) in lists.iter().zip(&mut w.pieces) {
            prepare(l, p, b);
        }
        let (band, above) = boundary(&lists, &b, k, 0, &mut w);
        let kb = b.of(band.0);
        let direct_above = all.iter().filter(|&&m| b.of(m) > kb).count();
        let mut direct_members: Vec<i32> = all.iter().copied().filter(|&m| b.of(m) == kb).collect();
        assert_eq!(above, direct_above);
        assert!(above < k && above + direct_members.len() >= k);
        let mut members = w.members.clone();
        members.sort_unstable();
        direct_members.sort_unstable();
        assert_eq!(members, direct_members);
        // Each bucket's range holds exactly the bits of that bucket, at its edges too.
        for j in [0, 1, kb, b.n - 2, b.n - 1] {
            let (lo, hi) = b.range(j);
            for m in [lo, hi, t - 1, t, t + 1, i32::MAX, 0] {
                assert_eq!((lo..=hi).contains(&m), b.of(m) == j, "bucket {j}, bits {m}");
            }
            assert_eq!(b.of(lo), j);
            assert_eq!(b.of(hi), j);
        }
        // Thresholds inside the boundary bucket and in buckets on both sides of it.
        let (mut inside, mut outside) = (0, 0);
        let mut xs: Vec<i32> = direct_members.clone();
        xs.extend([t, t + 1, all[7], all[70], all[700], all[4000], i32::MAX]);
        for x in xs {
            if x > t && b.of(x) == kb {
                inside += 1;
            } else if x > t {
                outside += 1;
            }
            for (l, p) in lists.iter().zip(&w.pieces) {
                let direct = l.val.iter().filter(|v| abs_bits(**v) >= x).count();
                assert_eq!(p.count_ge(l, &b, x), direct, "x = {x}");
            }
        }
        // Both ways of counting were exercised.
        assert!(
            inside > 0 && outside > 0,
            "inside {inside}, outside {outside}"
        );
    }
}
