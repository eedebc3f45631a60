//! Plans of the dense collectives, one function per algorithm, for one rank.
//!
//! Algorithms follow Thakur, Rabenseifner & Gropp, "Optimization of Collective
//! Communication Operations in MPICH" (2005) for ring, recursive doubling / halving,
//! Rabenseifner and Bruck; Chan et al. (2007), as cited by Linear Pipelining (Wang et al.),
//! for bidirectional exchange (BE); Linear Pipelining (Wang et al.) §3 for the linear
//! pipeline (LP) and the binomial tree (their MST); MSTopK/HiTopKComm (Shi et al., MLSys
//! 2021) §5.3 for the 2D-torus all-reduce. Non-powers of two use the [`Fold`].
//!
//! Units: the all-reduce, reduce-scatter and reduce plans index `f32` elements (the wire
//! type decides the bytes); the all-gather and broadcast plans index bytes.

use std::ops::Range;

use super::{bounds, ceil_log2, Combine, Fold, Step};

/// The tags of the dense collectives: the fixed range `0x6000..=0x603F`, one tag per
/// phase, so messages of different phases never match each other.
pub mod tags {
    /// First tag of the range.
    pub const FIRST: u32 = 0x6000;
    /// Last tag of the range.
    pub const LAST: u32 = 0x603F;
    /// The argument-agreement exchange.
    pub const CHECK: u32 = 0x6000;
    /// The count exchange of a variable all-gather.
    pub const COUNTS: u32 = 0x6004;
    /// All-gather; also the next two (fold-in, fold-out).
    pub const ALLGATHER: u32 = 0x6008;
    /// Reduce-scatter phase of an all-reduce.
    pub const RS: u32 = 0x6010;
    /// All-gather phase of an all-reduce.
    pub const AG: u32 = 0x6011;
    /// Fold-in of an all-reduce.
    pub const FOLD_IN: u32 = 0x6012;
    /// Fold-out of an all-reduce.
    pub const FOLD_OUT: u32 = 0x6013;
    /// Recursive-doubling all-reduce exchanges.
    pub const RD: u32 = 0x6014;
    /// Linear-pipeline reduce chain.
    pub const LP_REDUCE: u32 = 0x6018;
    /// Linear-pipeline broadcast chain.
    pub const LP_BCAST: u32 = 0x6019;
    /// Binomial reduce.
    pub const TREE_REDUCE: u32 = 0x601A;
    /// Binomial broadcast.
    pub const TREE_BCAST: u32 = 0x601B;
    /// Binomial scatter of the scatter + all-gather broadcast.
    pub const SCATTER: u32 = 0x601C;
    /// Ring all-gather of the scatter + all-gather broadcast.
    pub const BCAST_AG: u32 = 0x601D;
    /// Stand-alone reduce-scatter.
    pub const RS_ALONE: u32 = 0x6020;
    /// Fold-in of a stand-alone reduce-scatter.
    pub const RS_FOLD_IN: u32 = 0x6021;
    /// Fold-out of a stand-alone reduce-scatter.
    pub const RS_FOLD_OUT: u32 = 0x6022;
    /// Gather phase of the bidirectional-exchange reduce.
    pub const BE_GATHER: u32 = 0x6023;
}

/// A sub-communicator view: index in the group → rank.
pub type Map<'a> = &'a dyn Fn(usize) -> usize;

fn id(i: usize) -> usize {
    i
}

fn rng(b: &[usize], lo: usize, hi: usize) -> Range<usize> {
    b[lo]..b[hi]
}

/// One ring pass over blocks `b[i]..b[i+1]`, `i` in `0..p`, combining what arrives as
/// `combine` says. At step `s` member `me` sends block `me − s − lag` to the right and
/// receives block `me − s − lag − 1` from the left, where a reducing pass (reduce-scatter)
/// runs one block behind a copying one (all-gather): `lag` is 1 for a sum, 0 for a copy.
fn ring(
    out: &mut Vec<Step>,
    b: &[usize],
    me: usize,
    p: usize,
    map: Map,
    tag: u32,
    combine: Combine,
) {
    let lag = usize::from(combine.reduces());
    let (right, left) = (map((me + 1) % p), map((me + p - 1) % p));
    for s in 0..p.saturating_sub(1) {
        let sb = (me + 2 * p - s - lag) % p;
        let rb = (me + 2 * p - s - lag - 1) % p;
        out.push(Step::SendRecv {
            to: right,
            send: rng(b, sb, sb + 1),
            from: left,
            recv: rng(b, rb, rb + 1),
            tag,
            combine,
        });
    }
}

/// Ring reduce-scatter over blocks `b[i]..b[i+1]`, `i` in `0..p`: at step `s` member
/// `me` sends block `me − s − 1` to the right and adds block `me − s − 2` from the left,
/// so after P − 1 steps block `me` holds the full sum.
pub fn ring_rs(out: &mut Vec<Step>, b: &[usize], me: usize, p: usize, map: Map, tag: u32) {
    ring(out, b, me, p, map, tag, Combine::ADD);
}

/// Ring all-gather over blocks `b[i]..b[i+1]` where member `me` holds block `me`.
pub fn ring_ag(out: &mut Vec<Step>, b: &[usize], me: usize, p: usize, map: Map, tag: u32) {
    ring(out, b, me, p, map, tag, Combine::Copy);
}

/// Ring all-reduce of `range` among members `0..p` (reduce-scatter, round own block,
/// all-gather); nothing for `p ≤ 1`.
pub fn ring_allreduce_in(out: &mut Vec<Step>, range: Range<usize>, me: usize, p: usize, map: Map) {
    if p <= 1 {
        return;
    }
    let b = bounds(range.len(), p, range.start);
    ring_rs(out, &b, me, p, map, tags::RS);
    out.push(Step::Round {
        range: rng(&b, me, me + 1),
    });
    ring_ag(out, &b, me, p, map, tags::AG);
}

/// Recursive halving of the virtual blocks `vb` with the partner distances `masks`: each
/// step keeps the half of the current range on this rank's side, sends the other half
/// and adds the partner's. Returns the first virtual block of the range kept.
fn halve(
    out: &mut Vec<Step>,
    vb: &[usize],
    fold: Fold,
    v: usize,
    tag: u32,
    masks: impl Iterator<Item = usize>,
) -> usize {
    let (mut lo, mut hi) = (0, fold.p2);
    for mask in masks {
        let pv = v ^ mask;
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if v & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let partner = fold.actor(pv);
        out.push(Step::swap(
            partner,
            rng(vb, give.0, give.1),
            rng(vb, keep.0, keep.1),
            tag,
            Combine::Sum {
                lower_first: pv < v,
            },
        ));
        (lo, hi) = keep;
    }
    lo
}

/// Recursive-halving reduce-scatter among the acting ranks (Rabenseifner's first phase):
/// partner distance p2/2, …, 1; virtual rank `v` ends holding virtual block `v`.
pub fn halving_rs(out: &mut Vec<Step>, vb: &[usize], fold: Fold, v: usize, tag: u32) {
    let masks = std::iter::successors(Some(fold.p2 / 2), |&m| Some(m / 2)).take_while(|&m| m >= 1);
    halve(out, vb, fold, v, tag, masks);
}

/// Recursive-doubling all-gather after [`halving_rs`] (partner distance 1, …, p2/2).
pub fn doubling_ag(out: &mut Vec<Step>, vb: &[usize], fold: Fold, v: usize, tag: u32) {
    let mut mask = 1;
    while mask < fold.p2 {
        let pv = v ^ mask;
        let lo = v & !(mask - 1);
        let plo = pv & !(mask - 1);
        let partner = fold.actor(pv);
        out.push(Step::swap(
            partner,
            rng(vb, lo, lo + mask),
            rng(vb, plo, plo + mask),
            tag,
            Combine::Copy,
        ));
        mask <<= 1;
    }
}

/// Bidirectional-exchange reduce-scatter (Chan et al. 2007): recursive halving with the
/// partner distance doubling (1, …, p2/2), so the nearest partners move the largest
/// halves. Virtual rank `v` ends holding virtual block `bitreverse(v)`; returns it.
pub fn be_rs(out: &mut Vec<Step>, vb: &[usize], fold: Fold, v: usize, tag: u32) -> usize {
    let masks = std::iter::successors(Some(1), |&m| Some(m << 1)).take_while(|&m| m < fold.p2);
    halve(out, vb, fold, v, tag, masks)
}

/// The all-gather that undoes [`be_rs`]: partner distance p2/2, …, 1; the held block range
/// doubles towards the side the partner's bit says.
pub fn be_ag(out: &mut Vec<Step>, vb: &[usize], fold: Fold, v: usize, own: usize, tag: u32) {
    let (mut lo, mut hi) = (own, own + 1);
    let mut mask = fold.p2 / 2;
    while mask >= 1 {
        let s = hi - lo;
        let (plo, phi) = if v & mask == 0 {
            (hi, hi + s)
        } else {
            (lo - s, lo)
        };
        let partner = fold.actor(v ^ mask);
        out.push(Step::swap(
            partner,
            rng(vb, lo, hi),
            rng(vb, plo, phi),
            tag,
            Combine::Copy,
        ));
        lo = lo.min(plo);
        hi = hi.max(phi);
        mask /= 2;
    }
}

/// The bounds of the virtual blocks of a [`Fold`] over the rank blocks `b[i]..b[i+1]`:
/// virtual rank `v` holds the blocks of the original ranks it stands for.
fn virtual_bounds(b: &[usize], fold: Fold) -> Vec<usize> {
    let p = b.len() - 1;
    (0..=fold.p2)
        .map(|v| b[if v == fold.p2 { p } else { fold.orig_lo(v) }])
        .collect()
}

/// The messages of a [`Fold`]: the extra even rank `e` sends `given(e)` to `e + 1` with
/// `tag_in`, which combines it into the same range as `combine` says; after the acting
/// ranks' part, `e + 1` sends `returned(e)` back with `tag_out`.
struct FoldMsgs<G, R> {
    tag_in: u32,
    tag_out: u32,
    combine: Combine,
    given: G,
    returned: R,
}

/// Runs `body` on the acting ranks (virtual rank, fold) between the fold-in and the
/// fold-out that `msgs` describe.
fn folded_with<G, R>(
    out: &mut Vec<Step>,
    p: usize,
    r: usize,
    msgs: FoldMsgs<G, R>,
    body: impl FnOnce(&mut Vec<Step>, usize, Fold),
) where
    G: Fn(usize) -> Range<usize>,
    R: Fn(usize) -> Range<usize>,
{
    let fold = Fold::new(p);
    match fold.virt(r) {
        None => {
            out.push(Step::Send {
                to: r + 1,
                tag: msgs.tag_in,
                range: (msgs.given)(r),
            });
            out.push(Step::Recv {
                from: r + 1,
                tag: msgs.tag_out,
                range: (msgs.returned)(r),
                combine: Combine::Copy,
            });
        }
        Some(v) => {
            let extra = fold.takes_in(r);
            if extra {
                out.push(Step::Recv {
                    from: r - 1,
                    tag: msgs.tag_in,
                    range: (msgs.given)(r - 1),
                    combine: msgs.combine,
                });
            }
            body(out, v, fold);
            if extra {
                out.push(Step::Send {
                    to: r - 1,
                    tag: msgs.tag_out,
                    range: (msgs.returned)(r - 1),
                });
            }
        }
    }
}

/// Runs `body` on the acting ranks after the fold-in of an all-reduce of `n` units (even
/// rank 2i sends its vector to 2i + 1, which adds it), then sends the result back out.
fn folded(
    out: &mut Vec<Step>,
    n: usize,
    p: usize,
    r: usize,
    body: impl FnOnce(&mut Vec<Step>, usize, Fold),
) {
    let msgs = FoldMsgs {
        tag_in: tags::FOLD_IN,
        tag_out: tags::FOLD_OUT,
        combine: Combine::ADD,
        given: |_| 0..n,
        returned: |_| 0..n,
    };
    folded_with(out, p, r, msgs, body);
}

/// Ring all-reduce of `n` elements.
pub fn allreduce_ring(n: usize, p: usize, r: usize) -> Vec<Step> {
    let mut out = Vec::new();
    ring_allreduce_in(&mut out, 0..n, r, p, &id);
    out
}

/// Recursive-doubling all-reduce: log2 P2 exchanges of the whole vector, both operands
/// rounded to the wire type first, so both partners compute the same bits.
pub fn allreduce_recursive_doubling(n: usize, p: usize, r: usize) -> Vec<Step> {
    let mut out = Vec::new();
    if p > 1 {
        folded(&mut out, n, p, r, |out, v, fold| {
            let mut mask = 1;
            while mask < fold.p2 {
                let pv = v ^ mask;
                let partner = fold.actor(pv);
                out.push(Step::Round { range: 0..n });
                out.push(Step::swap(
                    partner,
                    0..n,
                    0..n,
                    tags::RD,
                    Combine::Sum {
                        lower_first: pv < v,
                    },
                ));
                mask <<= 1;
            }
            out.push(Step::Round { range: 0..n });
        });
    }
    out
}

/// Rabenseifner's all-reduce (recursive-halving reduce-scatter, recursive-doubling
/// all-gather), or with `bidirectional` the BE variant (Chan et al. 2007).
pub fn allreduce_halving(n: usize, p: usize, r: usize, bidirectional: bool) -> Vec<Step> {
    let mut out = Vec::new();
    if p > 1 {
        let vb = bounds(n, Fold::new(p).p2, 0);
        folded(&mut out, n, p, r, |out, v, fold| {
            let own = if bidirectional {
                be_rs(out, &vb, fold, v, tags::RS)
            } else {
                halving_rs(out, &vb, fold, v, tags::RS);
                v
            };
            out.push(Step::Round {
                range: rng(&vb, own, own + 1),
            });
            if bidirectional {
                be_ag(out, &vb, fold, v, own, tags::AG);
            } else {
                doubling_ag(out, &vb, fold, v, tags::AG);
            }
        });
    }
    out
}

/// MPICH's binomial tree over relative ranks `0..p` (root 0): the parent of `rel` (`rel`
/// minus its lowest set bit; `None` at the root) and its children `rel + 2^k` for every
/// `2^k` below that bit, nearest first.
fn binomial(rel: usize, p: usize) -> (Option<usize>, Vec<usize>) {
    let mut children = Vec::new();
    let mut mask = 1;
    while mask < p {
        if rel & mask != 0 {
            return (Some(rel - mask), children);
        }
        if rel + mask < p {
            children.push(rel + mask);
        }
        mask <<= 1;
    }
    (None, children)
}

/// Binomial-tree reduce of `range` to `root` (their MST): a rank adds what each child
/// sends, nearest first, then sends its partial sum to its parent.
pub fn reduce_binomial(
    out: &mut Vec<Step>,
    range: Range<usize>,
    p: usize,
    r: usize,
    root: usize,
    tag: u32,
) {
    let (parent, children) = binomial((r + p - root) % p, p);
    let abs = |x: usize| (x + root) % p;
    for c in children {
        out.push(Step::Recv {
            from: abs(c),
            tag,
            range: range.clone(),
            combine: Combine::ADD,
        });
    }
    if let Some(up) = parent {
        out.push(Step::Send {
            to: abs(up),
            tag,
            range,
        });
    }
}

/// Binomial-tree broadcast of `range` from `root` (MPICH's order: receive from the parent,
/// then send to the children at decreasing distance).
pub fn bcast_binomial(
    out: &mut Vec<Step>,
    range: Range<usize>,
    p: usize,
    r: usize,
    root: usize,
    tag: u32,
) {
    let (parent, children) = binomial((r + p - root) % p, p);
    let abs = |x: usize| (x + root) % p;
    if let Some(up) = parent {
        out.push(Step::Recv {
            from: abs(up),
            tag,
            range: range.clone(),
            combine: Combine::Copy,
        });
    }
    for &c in children.iter().rev() {
        out.push(Step::Send {
            to: abs(c),
            tag,
            range: range.clone(),
        });
    }
}

/// Binomial all-reduce: reduce to rank 0, which rounds the sum to the wire type, then a
/// binomial broadcast.
pub fn allreduce_binomial(n: usize, p: usize, r: usize) -> Vec<Step> {
    let mut out = Vec::new();
    reduce_binomial(&mut out, 0..n, p, r, 0, tags::TREE_REDUCE);
    if r == 0 {
        out.push(Step::Round { range: 0..n });
    }
    bcast_binomial(&mut out, 0..n, p, r, 0, tags::TREE_BCAST);
    out
}

/// Pipeline blocks of `be` units covering `0..n` (the last one shorter).
fn chunks(n: usize, be: usize) -> impl Iterator<Item = Range<usize>> {
    (0..n.div_ceil(be.max(1))).map(move |j| j * be..((j + 1) * be).min(n))
}

/// Linear-pipeline all-reduce (Linear Pipelining (Wang et al.), Fig. 2c): ranks 0 → … →
/// P − 1 reduce each block of `be` elements along the chain; rank P − 1 rounds the sum and
/// the block flows back. Rank r forwards the returning block j while reducing block
/// j + 2(P − 1 − r), the lag after which that block comes back, so both directions stay
/// busy.
pub fn allreduce_lp(n: usize, p: usize, r: usize, be: usize) -> Vec<Step> {
    let mut out = Vec::new();
    if p <= 1 || be == 0 {
        return out;
    }
    let nb = n.div_ceil(be);
    let lag = 2 * (p - 1 - r);
    let block = |j: usize| j * be..((j + 1) * be).min(n);
    for step in 0..nb + lag {
        if step < nb {
            if r > 0 {
                out.push(Step::Recv {
                    from: r - 1,
                    tag: tags::LP_REDUCE,
                    range: block(step),
                    combine: Combine::ADD,
                });
            }
            if r + 1 < p {
                out.push(Step::Send {
                    to: r + 1,
                    tag: tags::LP_REDUCE,
                    range: block(step),
                });
            } else {
                out.push(Step::Round { range: block(step) });
                out.push(Step::Send {
                    to: r - 1,
                    tag: tags::LP_BCAST,
                    range: block(step),
                });
            }
        }
        if r + 1 < p && step >= lag {
            out.push(Step::Recv {
                from: r + 1,
                tag: tags::LP_BCAST,
                range: block(step - lag),
                combine: Combine::Copy,
            });
            if r > 0 {
                out.push(Step::Send {
                    to: r - 1,
                    tag: tags::LP_BCAST,
                    range: block(step - lag),
                });
            }
        }
    }
    out
}

/// The three phases of the 2D-torus all-reduce (MSTopK/HiTopKComm (Shi et al., MLSys
/// 2021) §5.3) for the rank at `local` on `node`: ring reduce-scatter inside the node
/// (peers are local indices), ring all-reduce of the own slice across the nodes (peers are
/// node indices; ranges already inside the slice), ring all-gather inside the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorusPlan {
    /// Reduce-scatter in the node.
    pub intra_rs: Vec<Step>,
    /// All-reduce of the slice across nodes, then the rounding of the slice.
    pub inter: Vec<Step>,
    /// All-gather in the node.
    pub intra_ag: Vec<Step>,
}

/// The 2D-torus plan of `n` elements on `nodes × q` ranks (see [`TorusPlan`]).
pub fn allreduce_torus(n: usize, q: usize, nodes: usize, node: usize, local: usize) -> TorusPlan {
    let b = bounds(n, q, 0);
    let mut intra_rs = Vec::new();
    ring_rs(&mut intra_rs, &b, local, q, &id, tags::RS);
    let slice = rng(&b, local, local + 1);
    let mut inter = Vec::new();
    ring_allreduce_in(&mut inter, slice.clone(), node, nodes, &id);
    inter.push(Step::Round { range: slice });
    let mut intra_ag = Vec::new();
    ring_ag(&mut intra_ag, &b, local, q, &id, tags::AG);
    TorusPlan {
        intra_rs,
        inter,
        intra_ag,
    }
}

impl TorusPlan {
    /// The plan in world ranks (rank = node · q + local).
    pub fn world(&self, q: usize, node: usize, local: usize) -> Vec<Step> {
        let intra = move |i: usize| node * q + i;
        let inter = move |i: usize| i * q + local;
        let mut out: Vec<Step> = self
            .intra_rs
            .iter()
            .map(|s| s.relocated(&intra, 0))
            .collect();
        out.extend(self.inter.iter().map(|s| s.relocated(&inter, 0)));
        out.extend(self.intra_ag.iter().map(|s| s.relocated(&intra, 0)));
        out
    }
}

/// Ring reduce-scatter of `n` elements: rank r keeps block r of `n` in P blocks.
pub fn reduce_scatter_ring(n: usize, p: usize, r: usize) -> Vec<Step> {
    let mut out = Vec::new();
    ring_rs(&mut out, &bounds(n, p, 0), r, p, &id, tags::RS_ALONE);
    out
}

/// Recursive-halving reduce-scatter of `n` elements with the fold-in: virtual rank v owns
/// the blocks of the original ranks it stands for; the folded-out rank gets its block back
/// from its partner.
pub fn reduce_scatter_halving(n: usize, p: usize, r: usize) -> Vec<Step> {
    let mut out = Vec::new();
    if p <= 1 {
        return out;
    }
    let pb = bounds(n, p, 0);
    let vb = virtual_bounds(&pb, Fold::new(p));
    let msgs = FoldMsgs {
        tag_in: tags::RS_FOLD_IN,
        tag_out: tags::RS_FOLD_OUT,
        combine: Combine::ADD,
        given: |_| 0..n,
        returned: |e| rng(&pb, e, e + 1),
    };
    folded_with(&mut out, p, r, msgs, |out, v, fold| {
        halving_rs(out, &vb, fold, v, tags::RS_ALONE)
    });
    out
}

/// Ring all-gather of byte blocks `displs[i]..displs[i+1]` (rank r holds block r).
pub fn allgather_ring(displs: &[usize], r: usize, tag: u32) -> Vec<Step> {
    let mut out = Vec::new();
    ring_ag(&mut out, displs, r, displs.len() - 1, &id, tag);
    out
}

/// Recursive-doubling all-gather of byte blocks with the fold-in (tags `tag` for the
/// exchanges, `tag + 1` fold-in, `tag + 2` fold-out): extra even ranks hand their block
/// to their odd partner, the acting ranks double their contiguous holdings each step, and
/// the odd partners send the full result back.
pub fn allgather_recursive_doubling(displs: &[usize], r: usize, tag: u32) -> Vec<Step> {
    let p = displs.len() - 1;
    let total = displs[p];
    let mut out = Vec::new();
    if p <= 1 {
        return out;
    }
    let msgs = FoldMsgs {
        tag_in: tag + 1,
        tag_out: tag + 2,
        combine: Combine::Copy,
        given: |e| rng(displs, e, e + 1),
        returned: |_| 0..total,
    };
    let vb = virtual_bounds(displs, Fold::new(p));
    folded_with(&mut out, p, r, msgs, |out, v, fold| {
        doubling_ag(out, &vb, fold, v, tag)
    });
    out
}

/// One round of Bruck's all-gather over a group of `n` members, for member `me`: send the
/// first `count` blocks held (positions `0..count` in the order own, own + 1, …) to
/// position `me − gap`, receive as many from `me + gap` into positions `gap..gap + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BruckRound {
    /// Group position sent to.
    pub to: usize,
    /// Group position received from.
    pub from: usize,
    /// `2^round`: where the received blocks go.
    pub gap: usize,
    /// Blocks sent and received, `min(gap, n − gap)`.
    pub count: usize,
}

/// Bruck's all-gather (Bruck et al. 1997; SparDL (Zhao et al.) §2, Fig. 2b): `⌈log2 n⌉`
/// rounds for any `n`. The block held at position `i` is member `(me + i) mod n`'s.
pub fn bruck_rounds(n: usize, me: usize) -> Vec<BruckRound> {
    (0..ceil_log2(n))
        .map(|k| {
            let gap = 1usize << k;
            BruckRound {
                to: (me + n - gap) % n,
                from: (me + gap) % n,
                gap,
                count: gap.min(n - gap),
            }
        })
        .collect()
}

/// Bruck's all-gather of byte blocks (`displs` in rank order) as a plan over the rotated
/// buffer in which rank r's own block comes first and block `(r + i) mod P` at
/// `rot[i]..rot[i+1]`; returns `rot` and the steps. The executor un-rotates at the end.
pub fn allgather_bruck(displs: &[usize], r: usize, tag: u32) -> (Vec<usize>, Vec<Step>) {
    let p = displs.len() - 1;
    let mut rot = Vec::with_capacity(p + 1);
    let mut acc = 0;
    rot.push(0);
    for i in 0..p {
        let b = (r + i) % p;
        acc += displs[b + 1] - displs[b];
        rot.push(acc);
    }
    let steps = bruck_rounds(p, r)
        .into_iter()
        .map(|br| Step::SendRecv {
            to: br.to,
            send: rng(&rot, 0, br.count),
            from: br.from,
            recv: rng(&rot, br.gap, br.gap + br.count),
            tag,
            combine: Combine::Copy,
        })
        .collect();
    (rot, steps)
}

/// Scatter (binomial) of P byte blocks of `n` in relative-rank order from `root`, then a
/// ring all-gather (van de Geijn's long-message broadcast; Thakur, Rabenseifner & Gropp
/// 2005, §3.2).
pub fn bcast_scatter_allgather(n: usize, p: usize, r: usize, root: usize) -> Vec<Step> {
    let mut out = Vec::new();
    if p <= 1 {
        return out;
    }
    let rel = (r + p - root) % p;
    let abs = move |x: usize| (x + root) % p;
    let displs = bounds(n, p, 0);
    let span = |a: usize, b: usize| displs[a]..displs[b.min(p)];
    // The binomial scatter: each rank receives the blocks of its subtree and passes on
    // each child's part (the subtree of `c` spans blocks `c..2c − rel`).
    let (parent, children) = binomial(rel, p);
    if let Some(up) = parent {
        out.push(Step::Recv {
            from: abs(up),
            tag: tags::SCATTER,
            range: span(rel, 2 * rel - up),
            combine: Combine::Copy,
        });
    }
    for &c in children.iter().rev() {
        out.push(Step::Send {
            to: abs(c),
            tag: tags::SCATTER,
            range: span(c, 2 * c - rel),
        });
    }
    ring_ag(&mut out, &displs, rel, p, &abs, tags::BCAST_AG);
    out
}

/// Linear-pipeline broadcast (Linear Pipelining (Wang et al.), Fig. 2a): relative ranks
/// form a chain from the root; each block of `b` units is received from the predecessor
/// and forwarded.
pub fn bcast_lp(n: usize, p: usize, r: usize, root: usize, b: usize) -> Vec<Step> {
    let mut out = Vec::new();
    if p <= 1 || b == 0 {
        return out;
    }
    let rel = (r + p - root) % p;
    let prev = (rel + p - 1 + root) % p;
    let next = (rel + 1 + root) % p;
    for c in chunks(n, b) {
        if rel > 0 {
            out.push(Step::Recv {
                from: prev,
                tag: tags::LP_BCAST,
                range: c.clone(),
                combine: Combine::Copy,
            });
        }
        if rel + 1 < p {
            out.push(Step::Send {
                to: next,
                tag: tags::LP_BCAST,
                range: c,
            });
        }
    }
    out
}

/// Linear-pipeline reduce (Linear Pipelining (Wang et al.), Fig. 2b): chain position i is
/// rank root + 1 + i, the root last; each block of `be` elements is received, added to the
/// own block and forwarded.
pub fn reduce_lp(n: usize, p: usize, r: usize, root: usize, be: usize) -> Vec<Step> {
    let mut out = Vec::new();
    if p <= 1 || be == 0 {
        return out;
    }
    let pos = (r + p - root - 1) % p;
    let rank_at = |i: usize| (root + 1 + i) % p;
    for c in chunks(n, be) {
        if pos > 0 {
            out.push(Step::Recv {
                from: rank_at(pos - 1),
                tag: tags::LP_REDUCE,
                range: c.clone(),
                combine: Combine::ADD,
            });
        }
        if pos + 1 < p {
            out.push(Step::Send {
                to: rank_at(pos + 1),
                tag: tags::LP_REDUCE,
                range: c,
            });
        }
    }
    out
}

/// Bidirectional-exchange reduce of `n` elements to `root` (Linear Pipelining (Wang et
/// al.) §3.2 and Table 1 "BE": "a reduce-scatter plus a gather", after Chan et al. 2007):
/// the BE reduce-scatter of [`be_rs`] among the acting ranks, then a gather of the reduced
/// blocks to the root along the pairs of [`be_ag`] (partner distance p2/2, …, 1), where the
/// upper partner sends its range and drops out, so the ranges double towards the root.
/// Ranks are numbered from the root so that the root acts for virtual rank 0 (for P not a
/// power of two, the [`Fold`]'s extra ranks first send their whole vector to their partner
/// and then sit out). Powers of two: `2 log2 P` messages, `2(P−1)/P·n` elements and
/// `(P−1)/P·n` reduced elements on the root's path, the table's cost.
pub fn reduce_be(n: usize, p: usize, r: usize, root: usize) -> Vec<Step> {
    let mut out = Vec::new();
    if p <= 1 {
        return out;
    }
    let fold = Fold::new(p);
    // The root is the actor of virtual rank 0: relative rank 1 when rank 0 folds out.
    let shift = fold.actor(0);
    let rel = (r + p + shift - root) % p;
    let abs = move |x: usize| (x + root + p - shift) % p;
    let vb = bounds(n, fold.p2, 0);
    let mut body = Vec::new();
    match fold.virt(rel) {
        None => body.push(Step::Send {
            to: rel + 1,
            tag: tags::RS_FOLD_IN,
            range: 0..n,
        }),
        Some(v) => {
            if fold.takes_in(rel) {
                body.push(Step::Recv {
                    from: rel - 1,
                    tag: tags::RS_FOLD_IN,
                    range: 0..n,
                    combine: Combine::ADD,
                });
            }
            let own = be_rs(&mut body, &vb, fold, v, tags::RS_ALONE);
            let (lo, mut hi) = (own, own + 1);
            let mut mask = fold.p2 / 2;
            while mask >= 1 && v < 2 * mask {
                let s = hi - lo;
                let partner = fold.actor(v ^ mask);
                if v & mask != 0 {
                    body.push(Step::Send {
                        to: partner,
                        tag: tags::BE_GATHER,
                        range: rng(&vb, lo, hi),
                    });
                    break;
                }
                // As in [`be_ag`], the lower partner's range grows upwards.
                body.push(Step::Recv {
                    from: partner,
                    tag: tags::BE_GATHER,
                    range: rng(&vb, hi, hi + s),
                    combine: Combine::Copy,
                });
                hi += s;
                mask /= 2;
            }
        }
    }
    out.extend(body.iter().map(|s| s.relocated(&abs, 0)));
    out
}

/// Binomial broadcast of `n` units from `root`.
pub fn broadcast_binomial(n: usize, p: usize, r: usize, root: usize) -> Vec<Step> {
    let mut out = Vec::new();
    bcast_binomial(&mut out, 0..n, p, r, root, tags::TREE_BCAST);
    out
}

/// Binomial reduce of `n` elements to `root`.
pub fn reduce_binomial_to(n: usize, p: usize, r: usize, root: usize) -> Vec<Step> {
    let mut out = Vec::new();
    reduce_binomial(&mut out, 0..n, p, r, root, tags::TREE_REDUCE);
    out
}
