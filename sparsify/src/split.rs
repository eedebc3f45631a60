//! Selection among the candidates of a pass that are still split by parallel piece
//! ([`Cand::lists`]), run per piece on the rayon pool: the exact `k`-th magnitude by a
//! histogram of the candidates' magnitudes (only the one bucket that holds it is selected
//! in serial), and the final list built by every piece writing its share straight into the
//! result, zeroing the selected entries of its own range of the residual as it goes.
//!
//! The serial parts are the histogram merge and the few candidates of one bucket, so the
//! steps after the pass shrink with the threads instead of staying serial (gathering the
//! pieces' lists, selecting among all candidates, zeroing, building the result). Every
//! result equals the serial selection's bit for bit: the same set in the same order.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::kernel::{abs_bits, Cand};

/// Buckets per binade of magnitude above the pass's threshold (a power of two).
const PER_BINADE_LOG: u32 = 11;

/// Scratch of one piece, kept between calls.
#[derive(Debug, Default, Clone)]
pub(crate) struct Piece {
    hist: Vec<u32>,
    /// Magnitudes of the piece's candidates in the boundary bucket.
    members: Vec<i32>,
    /// Candidates the piece keeps for sure, and its range of ranks among the ranked ones.
    sure: usize,
    ranked: (usize, usize),
    /// Candidates the piece writes and where its share of the result starts.
    count: usize,
    /// Smallest magnitude the piece writes.
    min_bits: i32,
}

/// Scratch of a split selection: one [`Piece`] per list plus the merged histogram.
#[derive(Debug, Default, Clone)]
pub(crate) struct Work {
    pieces: Vec<Piece>,
    hist: Vec<u32>,
    /// Magnitudes of the boundary bucket of every piece, in piece order.
    members: Vec<i32>,
}

/// The histogram layout over magnitudes `>= t`: bucket `(m - t) >> shift`, the last one
/// open-ended. About eight candidates a bucket, at least 64 and at most 2^11 buckets, which
/// span one binade above `t` (where the `k`-th magnitude lies unless the sample was far off;
/// then the last bucket is large, and selecting in it is slower, never wrong).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buckets {
    t: i32,
    shift: u32,
    n: usize,
}

impl Buckets {
    fn new(t: i32, total: usize) -> Self {
        let log = (total / 8).max(64).next_power_of_two().trailing_zeros();
        let log = log.min(PER_BINADE_LOG);
        Buckets {
            t,
            shift: 23 - log,
            n: 1 << log,
        }
    }

    #[inline(always)]
    fn of(&self, m: i32) -> usize {
        ((m.wrapping_sub(self.t).max(0) as u32 >> self.shift) as usize).min(self.n - 1)
    }
}

/// Runs `f` on every list with its scratch: in parallel over several, inline for one (no
/// hand-off to the pool).
fn each<T: Send>(
    lists: &[Cand],
    work: &mut [T],
    f: impl Fn(usize, &Cand, &mut T) + Sync + Send,
) {
    if lists.len() == 1 {
        f(0, &lists[0], &mut work[0]);
    } else {
        lists
            .par_iter()
            .zip(work.par_iter_mut())
            .enumerate()
            .for_each(|(i, (l, w))| f(i, l, w));
    }
}

/// Histograms every list's magnitudes (all `>= t`) and merges them; returns the layout.
fn histogram(lists: &[Cand], t: i32, w: &mut Work) -> Buckets {
    let total: usize = lists.iter().map(|l| l.idx.len()).sum();
    let b = Buckets::new(t, total);
    w.pieces.resize_with(lists.len(), Piece::default);
    let pieces = &mut w.pieces[..lists.len()];
    each(lists, pieces, |_, l, p| {
        p.hist.clear();
        p.hist.resize(b.n, 0);
        for v in &l.val {
            p.hist[b.of(abs_bits(*v))] += 1;
        }
    });
    w.hist.clear();
    w.hist.resize(b.n, 0);
    for p in pieces.iter() {
        for (a, c) in w.hist.iter_mut().zip(&p.hist) {
            *a += c;
        }
    }
    b
}

/// Collects the magnitudes of bucket `kb` of every list (per piece and, in piece order,
/// into `w.members`), and each piece's count of candidates in buckets above `kb`.
fn boundary(lists: &[Cand], b: Buckets, kb: usize, w: &mut Work) {
    let pieces = &mut w.pieces[..lists.len()];
    each(lists, pieces, |_, l, p| {
        p.members.clear();
        p.members.extend(
            l.val
                .iter()
                .map(|v| abs_bits(*v))
                .filter(|&m| b.of(m) == kb),
        );
        p.sure = p.hist[kb + 1..].iter().map(|&c| c as usize).sum();
    });
    w.members.clear();
    for p in pieces.iter() {
        w.members.extend_from_slice(&p.members);
    }
}

/// Exact top-`k` (largest magnitude, the lower index on ties) among the candidates of
/// `cand`, all of magnitude `>= t`, for `0 < k <= cand.len()`: the selected (indices,
/// values) in index order and the `k`-th magnitude's bits. With a residual, zeroes the
/// selected entries of it.
pub(crate) fn select_k(
    cand: &Cand,
    t: i32,
    k: usize,
    residual: Option<&mut [f32]>,
    w: &mut Work,
) -> (Vec<u32>, Vec<f32>, i32) {
    let (lists, piece) = cand.lists();
    if k == cand.len() {
        // Everything: no selection to make.
        w.pieces.resize_with(lists.len(), Piece::default);
        for (p, l) in w.pieces.iter_mut().zip(lists) {
            (p.sure, p.ranked, p.count) = (l.idx.len(), (0, 0), l.idx.len());
        }
        let (idx, val) = write(lists, piece, residual, w, |_| (true, false));
        let min = w.pieces[..lists.len()].iter().map(|p| p.min_bits).min();
        return (idx, val, min.unwrap_or(0));
    }
    let b = histogram(lists, t, w);
    // The boundary bucket `kb`: fewer than `k` candidates above it, at least `k` from it.
    let (mut kb, mut above) = (0, 0usize);
    for (j, &c) in w.hist.iter().enumerate().rev() {
        if above + c as usize >= k {
            kb = j;
            break;
        }
        above += c as usize;
    }
    boundary(lists, b, kb, w);
    let need = k - above;
    let n = w.members.len();
    let (_, kth, _) = w.members.select_nth_unstable(n - need);
    let kth = *kth;
    // Ties at the k-th magnitude go to the lowest indices: in piece order.
    let gt_all = w.members.iter().filter(|&&m| m > kth).count();
    let mut ties = need - gt_all;
    for p in &mut w.pieces[..lists.len()] {
        let gt = p.members.iter().filter(|&&m| m > kth).count();
        let eq = p.members.iter().filter(|&&m| m == kth).count();
        let take = eq.min(ties);
        ties -= take;
        p.sure += gt;
        p.ranked = (0, take);
        p.count = p.sure + take;
    }
    let (idx, val) = write(lists, piece, residual, w, |m| (m > kth, m == kth));
    (idx, val, kth)
}

/// Builds the result: every piece writes, in index order, its candidates that `class`
/// marks sure plus those it marks ranked whose rank among the piece's ranked ones lies in
/// its `ranked` range, into its share of the lists (`count` entries), and zeroes them in
/// its range of the residual. Also records each piece's smallest magnitude written.
fn write(
    lists: &[Cand],
    piece: usize,
    residual: Option<&mut [f32]>,
    w: &mut Work,
    class: impl Fn(i32) -> (bool, bool) + Sync + Send,
) -> (Vec<u32>, Vec<f32>) {
    let pieces = &mut w.pieces[..lists.len()];
    let total: usize = pieces.iter().map(|p| p.count).sum();
    let mut idx: Vec<u32> = Vec::with_capacity(total);
    let mut val: Vec<f32> = Vec::with_capacity(total);
    {
        let mut outs: Vec<Out> = Vec::with_capacity(pieces.len());
        let (mut ri, mut rv) = (
            &mut idx.spare_capacity_mut()[..total],
            &mut val.spare_capacity_mut()[..total],
        );
        let mut res = residual;
        for (i, p) in pieces.iter_mut().enumerate() {
            let (a, b) = std::mem::take(&mut ri).split_at_mut(p.count);
            let (c, d) = std::mem::take(&mut rv).split_at_mut(p.count);
            (ri, rv) = (b, d);
            let r = res.take().map(|r| {
                let len = piece.min(r.len());
                let (mine, rest) = r.split_at_mut(len);
                if i + 1 < lists.len() {
                    res = Some(rest);
                }
                mine
            });
            outs.push(Out {
                idx: a,
                val: c,
                residual: r,
                piece: p,
            });
        }
        each(lists, &mut outs, |i, l, o| {
            let lo = i.saturating_mul(piece);
            let (start, end) = o.piece.ranked;
            let (mut at, mut rank, mut min) = (0usize, 0usize, i32::MAX);
            for (&j, &v) in l.idx.iter().zip(&l.val) {
                let m = abs_bits(v);
                let (sure, ranked) = class(m);
                let keep = sure || (ranked && rank >= start && rank < end);
                rank += usize::from(ranked);
                if keep {
                    o.idx[at].write(j);
                    o.val[at].write(v);
                    at += 1;
                    min = min.min(m);
                }
            }
            debug_assert_eq!(at, o.idx.len());
            o.piece.min_bits = min;
            if let Some(r) = o.residual.as_deref_mut() {
                for x in &o.idx[..at] {
                    // SAFETY: the first `at` entries were written just above.
                    r[unsafe { x.assume_init() } as usize - lo] = 0.0;
                }
            }
        });
    }
    // SAFETY: each piece wrote exactly its `count` entries of its share, and the shares
    // tile `0..total` (checked in debug builds above).
    unsafe {
        idx.set_len(total);
        val.set_len(total);
    }
    (idx, val)
}

/// One piece's share of the result and of the residual.
struct Out<'a> {
    idx: &'a mut [MaybeUninit<u32>],
    val: &'a mut [MaybeUninit<f32>],
    residual: Option<&'a mut [f32]>,
    piece: &'a mut Piece,
}

/// How MSTopK's search ended, as [`select_ms`] needs it.
pub(crate) struct MsPick {
    /// `thres1` and `thres2` of Algorithm 1 as magnitude bits.
    pub t1: i32,
    pub t2: i32,
}

/// Per-piece counts of `|x| >= t1` and of `t2 <= |x| < t1` (MSTopK's `iota1`, `iota2`).
pub(crate) fn ms_counts(cand: &Cand, p: &MsPick, w: &mut Work) -> (usize, usize) {
    let (lists, _) = cand.lists();
    w.pieces.resize_with(lists.len(), Piece::default);
    let (t1, t2) = (p.t1, p.t2);
    each(lists, &mut w.pieces[..lists.len()], |_, l, q| {
        let (mut a, mut b) = (0usize, 0usize);
        for v in &l.val {
            let m = abs_bits(*v);
            a += usize::from(m >= t1);
            b += usize::from(m >= t2 && m < t1);
        }
        q.sure = a;
        q.ranked = (0, b);
    });
    w.pieces[..lists.len()]
        .iter()
        .fold((0, 0), |(a, b), q| (a + q.sure, b + q.ranked.1))
}

/// MSTopK's output from the candidates (after [`ms_counts`]): every `|x| >= t1` plus the
/// entries of rank `start..end` among `t2 <= |x| < t1` in index order; zeroes them in the
/// residual when given. Returns the lists and the smallest magnitude selected.
pub(crate) fn select_ms(
    cand: &Cand,
    p: &MsPick,
    start: usize,
    end: usize,
    residual: Option<&mut [f32]>,
    w: &mut Work,
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
    let (idx, val) = write(lists, piece, residual, w, |m| (m >= t1, m >= t2 && m < t1));
    let min = w.pieces[..lists.len()]
        .iter()
        .map(|q| q.min_bits)
        .min()
        .unwrap_or(i32::MAX);
    (idx, val, min)
}

/// Magnitudes of the boundary bucket for MSTopK's search: the bucket `kb` with at most
/// `k` candidates above it and more than `k` from it on. Returns the layout, `kb` and the
/// count above it; `w.members` holds the bucket's magnitudes.
pub(crate) fn ms_boundary(cand: &Cand, t: i32, k: usize, w: &mut Work) -> (Buckets, usize, usize) {
    let (lists, _) = cand.lists();
    let b = histogram(lists, t, w);
    let (mut kb, mut above) = (0, 0usize);
    for (j, &c) in w.hist.iter().enumerate().rev() {
        if above + c as usize > k {
            kb = j;
            break;
        }
        above += c as usize;
    }
    boundary(lists, b, kb, w);
    (b, kb, above)
}

impl Buckets {
    /// Bucket of a threshold's bits (`>= t`).
    pub(crate) fn bucket(&self, m: i32) -> usize {
        self.of(m)
    }
}

impl Work {
    /// The boundary bucket's magnitudes (see [`ms_boundary`]), for the search to partition.
    pub(crate) fn members_mut(&mut self) -> &mut [i32] {
        &mut self.members
    }
}
