//! Reduce-scatter (sum): ring and recursive halving, plus the cores the all-reduce
//! algorithms build on (Thakur, Rabenseifner & Gropp 2005, §4).

use std::ops::Range;

use half::{bf16, f16};

use crate::dense::util::{agree, block_range, block_start, pair_mut, Fold};
use crate::dense::wire::{Scratch, WireElem};
use crate::dense::{tags, DenseOptions, Op, WireType};
use crate::{Communicator, Result, Tag};

/// Reduce-scatter algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReduceScatterAlgo {
    /// P − 1 neighbour steps of n/P elements.
    #[default]
    Ring,
    /// log2 P halving exchanges (partner distance P/2, P/4, …); other P fold in first.
    RecursiveHalving,
}

impl ReduceScatterAlgo {
    /// Every algorithm.
    pub const ALL: [ReduceScatterAlgo; 2] =
        [ReduceScatterAlgo::Ring, ReduceScatterAlgo::RecursiveHalving];

    /// Short name: `ring`, `recursive_halving`.
    pub fn name(&self) -> &'static str {
        match self {
            ReduceScatterAlgo::Ring => "ring",
            ReduceScatterAlgo::RecursiveHalving => "recursive_halving",
        }
    }

    fn code(&self) -> u64 {
        match self {
            ReduceScatterAlgo::Ring => 1,
            ReduceScatterAlgo::RecursiveHalving => 2,
        }
    }
}

/// Sums `buf` across ranks and leaves in this rank's block, [`block_range`]`(n, P, rank)`,
/// the fully reduced values; returns that range. The rest of `buf` is used as scratch.
pub fn reduce_scatter<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [f32],
    algo: ReduceScatterAlgo,
    opts: &DenseOptions,
) -> Result<Range<usize>> {
    if opts.check {
        agree(
            comm,
            [
                Op::ReduceScatter as u64,
                buf.len() as u64,
                algo.code(),
                0,
                opts.wire.code(),
                0,
            ],
        )?;
    }
    match opts.wire {
        WireType::F32 => reduce_scatter_w::<C, f32>(comm, buf, algo),
        WireType::F16 => reduce_scatter_w::<C, f16>(comm, buf, algo),
        WireType::Bf16 => reduce_scatter_w::<C, bf16>(comm, buf, algo),
    }
}

fn reduce_scatter_w<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    algo: ReduceScatterAlgo,
) -> Result<Range<usize>> {
    let p = comm.size();
    let r = comm.rank();
    let n = buf.len();
    let mine = block_range(n, p, r);
    if p == 1 {
        return Ok(mine);
    }
    match algo {
        ReduceScatterAlgo::Ring => {
            let bounds: Vec<usize> = (0..=p).map(|i| block_start(n, p, i)).collect();
            let mut sc = Scratch::<W>::new(n.div_ceil(p));
            ring_rs(comm, buf, &bounds, r, p, &|i| i, &mut sc, tags::RS_ALONE)?;
        }
        ReduceScatterAlgo::RecursiveHalving => {
            let fold = Fold::new(p);
            // Virtual rank v owns the blocks of the original ranks it stands for.
            let vb: Vec<usize> = (0..=fold.p2)
                .map(|v| block_start(n, p, fold.orig_lo(v)))
                .collect();
            let mut sc = Scratch::<W>::new(n);
            match fold.virt(r) {
                None => {
                    sc.send(comm, r + 1, tags::RS_FOLD_IN, buf)?;
                    sc.recv_copy(comm, r + 1, tags::RS_FOLD_OUT, &mut buf[mine.clone()])?;
                }
                Some(v) => {
                    if r < 2 * fold.rem {
                        sc.recv_add(comm, r - 1, tags::RS_FOLD_IN, buf)?;
                    }
                    halving_rs(comm, buf, &vb, fold, v, &mut sc, tags::RS_ALONE)?;
                    if r < 2 * fold.rem {
                        let theirs = block_range(n, p, r - 1);
                        sc.send(comm, r - 1, tags::RS_FOLD_OUT, &buf[theirs])?;
                    }
                }
            }
        }
    }
    Ok(mine)
}

/// Ring reduce-scatter over the blocks `bounds[i]..bounds[i+1]`, `i` in `0..p`: at step
/// `s` virtual rank `me` sends block `me − s − 1` to the right and adds block `me − s − 2`
/// from the left, so after P − 1 steps block `me` holds the full sum. `abs` maps virtual
/// indices to communicator ranks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ring_rs<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    bounds: &[usize],
    me: usize,
    p: usize,
    abs: &dyn Fn(usize) -> usize,
    sc: &mut Scratch<W>,
    tag: Tag,
) -> Result<()> {
    let right = abs((me + 1) % p);
    let left = abs((me + p - 1) % p);
    for s in 0..p.saturating_sub(1) {
        let sb = (me + 2 * p - s - 1) % p;
        let rb = (me + 2 * p - s - 2) % p;
        let (send, recv) = pair_mut(buf, bounds[sb]..bounds[sb + 1], bounds[rb]..bounds[rb + 1]);
        sc.sendrecv_add(comm, right, tag, send, left, tag, recv, false)?;
    }
    Ok(())
}

/// Ring all-gather of `f32` blocks (through the wire type) after [`ring_rs`]: virtual rank
/// `me` holds block `me`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ring_ag<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    bounds: &[usize],
    me: usize,
    p: usize,
    abs: &dyn Fn(usize) -> usize,
    sc: &mut Scratch<W>,
    tag: Tag,
) -> Result<()> {
    let right = abs((me + 1) % p);
    let left = abs((me + p - 1) % p);
    for s in 0..p.saturating_sub(1) {
        let sb = (me + p - s) % p;
        let rb = (me + 2 * p - s - 1) % p;
        let (send, recv) = pair_mut(buf, bounds[sb]..bounds[sb + 1], bounds[rb]..bounds[rb + 1]);
        sc.sendrecv_copy(comm, right, tag, send, left, tag, recv)?;
    }
    Ok(())
}

/// Recursive-halving reduce-scatter among the `fold.p2` acting ranks (Rabenseifner's
/// first phase): partner distance p2/2, p2/4, …, 1; each step keeps the half of the
/// current virtual-block range on this rank's side and sends the other half. Virtual
/// block `v` is `vb[v]..vb[v+1]`; at the end virtual rank `v` holds block `v` reduced.
pub(crate) fn halving_rs<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    vb: &[usize],
    fold: Fold,
    v: usize,
    sc: &mut Scratch<W>,
    tag: Tag,
) -> Result<()> {
    let masks = std::iter::successors(Some(fold.p2 / 2), |&m| Some(m / 2)).take_while(|&m| m >= 1);
    halve(comm, buf, vb, fold, v, sc, tag, masks).map(|_| ())
}

/// Recursive-doubling all-gather among the acting ranks after [`halving_rs`] (partner
/// distance 1, 2, …, p2/2): the held range doubles each step.
pub(crate) fn doubling_ag<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    vb: &[usize],
    fold: Fold,
    v: usize,
    sc: &mut Scratch<W>,
    tag: Tag,
) -> Result<()> {
    let mut mask = 1;
    while mask < fold.p2 {
        let pv = v ^ mask;
        let lo = v & !(mask - 1);
        let plo = pv & !(mask - 1);
        let (send, recv) = pair_mut(buf, vb[lo]..vb[lo + mask], vb[plo]..vb[plo + mask]);
        let partner = fold.actor(pv);
        sc.sendrecv_copy(comm, partner, tag, send, partner, tag, recv)?;
        mask <<= 1;
    }
    Ok(())
}

/// Bidirectional-exchange reduce-scatter (Chan et al. 2007, cited by paper 004 §3.2):
/// recursive halving of the vector with the partner distance DOUBLING (1, 2, …, p2/2),
/// so the nearest partners exchange the largest halves. Virtual rank `v` ends holding
/// virtual block `bitreverse(v)`; returns that block's index.
pub(crate) fn be_rs<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    vb: &[usize],
    fold: Fold,
    v: usize,
    sc: &mut Scratch<W>,
    tag: Tag,
) -> Result<usize> {
    let masks = std::iter::successors(Some(1), |&m| Some(m << 1)).take_while(|&m| m < fold.p2);
    halve(comm, buf, vb, fold, v, sc, tag, masks)
}

/// Recursive halving of the virtual blocks `0..fold.p2` with the partner distances
/// `masks` (each a distinct power of two below `fold.p2`): each step keeps the half of
/// the current range on this rank's side, sends the other half and adds the partner's.
/// Returns the first virtual block of the range kept at the end.
#[allow(clippy::too_many_arguments)]
fn halve<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    vb: &[usize],
    fold: Fold,
    v: usize,
    sc: &mut Scratch<W>,
    tag: Tag,
    masks: impl Iterator<Item = usize>,
) -> Result<usize> {
    let (mut lo, mut hi) = (0, fold.p2);
    for mask in masks {
        let pv = v ^ mask;
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if v & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let (send, recv) = pair_mut(buf, vb[give.0]..vb[give.1], vb[keep.0]..vb[keep.1]);
        let partner = fold.actor(pv);
        sc.sendrecv_add(comm, partner, tag, send, partner, tag, recv, pv < v)?;
        (lo, hi) = keep;
    }
    Ok(lo)
}

#[allow(clippy::too_many_arguments)]
/// The all-gather that undoes [`be_rs`]: partner distance p2/2, …, 1; the held block range
/// doubles towards the side the partner's bit says.
pub(crate) fn be_ag<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    vb: &[usize],
    fold: Fold,
    v: usize,
    own: usize,
    sc: &mut Scratch<W>,
    tag: Tag,
) -> Result<()> {
    let (mut lo, mut hi) = (own, own + 1);
    let mut mask = fold.p2 / 2;
    while mask >= 1 {
        let pv = v ^ mask;
        let s = hi - lo;
        let (plo, phi) = if v & mask == 0 {
            (hi, hi + s)
        } else {
            (lo - s, lo)
        };
        let (send, recv) = pair_mut(buf, vb[lo]..vb[hi], vb[plo]..vb[phi]);
        let partner = fold.actor(pv);
        sc.sendrecv_copy(comm, partner, tag, send, partner, tag, recv)?;
        lo = lo.min(plo);
        hi = hi.max(phi);
        mask /= 2;
    }
    Ok(())
}
