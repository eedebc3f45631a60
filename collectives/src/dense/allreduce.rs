//! All-reduce (sum of `f32`) with seven algorithms; every rank ends with the same bits.

use half::{bf16, f16};

use crate::dense::bcast::{bcast_binomial, lp_block_elems, reduce_binomial};
use crate::dense::reduce_scatter::{be_ag, be_rs, doubling_ag, halving_rs, ring_ag, ring_rs};
use crate::dense::util::{agree, block_start, Fold};
use crate::dense::wire::{Scratch, WireElem};
use crate::dense::{tags, DenseOptions, Op, WireType};
use crate::{Communicator, Error, Result};

/// All-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AllreduceAlgo {
    /// Ring reduce-scatter + ring all-gather: 2(P − 1) steps of n/P (bandwidth-optimal).
    #[default]
    Ring,
    /// log2 P exchanges of the whole vector (latency-optimal); other P fold in.
    RecursiveDoubling,
    /// Recursive-halving reduce-scatter + recursive-doubling all-gather (Rabenseifner).
    Rabenseifner,
    /// Bidirectional exchange (paper 004 Table 1 "BE", after Chan et al. 2007): the same
    /// reduce-scatter + all-gather costs as Rabenseifner, with partner distance doubling
    /// in the reduce-scatter (nearest partners move the largest halves).
    BidirectionalExchange,
    /// Binomial-tree reduce to rank 0 + binomial broadcast (paper 004's MST).
    Binomial,
    /// Linear pipeline (paper 004 Fig. 2c): chain reduce towards rank P − 1, pipelined
    /// broadcast back, in blocks of `block_bytes` wire bytes.
    LinearPipeline {
        /// Pipeline block size b in bytes on the wire (≥ one element).
        block_bytes: usize,
    },
    /// 2D torus / hierarchical (paper 001 §5.3): intra-node reduce-scatter, inter-node
    /// ring all-reduce of each slice, intra-node all-gather; rank r is on node
    /// r / ranks_per_node.
    Torus2d {
        /// Ranks per node; must divide P.
        ranks_per_node: usize,
    },
}

impl AllreduceAlgo {
    /// One instance of every algorithm (LP with 64 KiB blocks, torus with 2 ranks per node
    /// when P is even, else 1), for tests and benchmarks.
    pub fn all(p: usize) -> Vec<AllreduceAlgo> {
        vec![
            AllreduceAlgo::Ring,
            AllreduceAlgo::RecursiveDoubling,
            AllreduceAlgo::Rabenseifner,
            AllreduceAlgo::BidirectionalExchange,
            AllreduceAlgo::Binomial,
            AllreduceAlgo::LinearPipeline {
                block_bytes: 64 << 10,
            },
            AllreduceAlgo::Torus2d {
                ranks_per_node: if p % 2 == 0 { 2 } else { 1 },
            },
        ]
    }

    /// Short name: `ring`, `recursive_doubling`, `rabenseifner`, `be`, `binomial`, `lp`,
    /// `torus2d`.
    pub fn name(&self) -> &'static str {
        match self {
            AllreduceAlgo::Ring => "ring",
            AllreduceAlgo::RecursiveDoubling => "recursive_doubling",
            AllreduceAlgo::Rabenseifner => "rabenseifner",
            AllreduceAlgo::BidirectionalExchange => "be",
            AllreduceAlgo::Binomial => "binomial",
            AllreduceAlgo::LinearPipeline { .. } => "lp",
            AllreduceAlgo::Torus2d { .. } => "torus2d",
        }
    }

    fn code(&self) -> (u64, u64) {
        match self {
            AllreduceAlgo::Ring => (1, 0),
            AllreduceAlgo::RecursiveDoubling => (2, 0),
            AllreduceAlgo::Rabenseifner => (3, 0),
            AllreduceAlgo::BidirectionalExchange => (4, 0),
            AllreduceAlgo::Binomial => (5, 0),
            AllreduceAlgo::LinearPipeline { block_bytes } => (6, *block_bytes as u64),
            AllreduceAlgo::Torus2d { ranks_per_node } => (7, *ranks_per_node as u64),
        }
    }

    /// Checks the parameters against P and the wire type (same answer on every rank).
    fn validate(&self, p: usize, wire: WireType) -> Result<()> {
        match *self {
            AllreduceAlgo::LinearPipeline { block_bytes } => {
                lp_block_elems(block_bytes, wire.size()).map(|_| ())
            }
            AllreduceAlgo::Torus2d { ranks_per_node } => check_topology(p, ranks_per_node),
            _ => Ok(()),
        }
    }
}

fn check_topology(p: usize, rpn: usize) -> Result<()> {
    if rpn == 0 || p % rpn != 0 {
        Err(Error::Topology(format!(
            "2D torus: {rpn} ranks per node does not divide {p} ranks"
        )))
    } else {
        Ok(())
    }
}

/// Sums `buf` over all ranks in place; every rank ends with the same bits.
pub fn allreduce<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [f32],
    algo: AllreduceAlgo,
    opts: &DenseOptions,
) -> Result<()> {
    let (code, param) = algo.code();
    if opts.check {
        agree(
            comm,
            [
                Op::Allreduce as u64,
                buf.len() as u64,
                code,
                param,
                opts.wire.code(),
                0,
            ],
        )?;
    }
    let p = comm.size();
    algo.validate(p, opts.wire)?;
    if p == 1 {
        return Ok(());
    }
    if let AllreduceAlgo::Torus2d { ranks_per_node } = algo {
        let hier = HierComm::new(comm, ranks_per_node)?;
        return allreduce_hier(&hier, buf, &opts.unchecked());
    }
    match opts.wire {
        WireType::F32 => allreduce_w::<C, f32>(comm, buf, algo),
        WireType::F16 => allreduce_w::<C, f16>(comm, buf, algo),
        WireType::Bf16 => allreduce_w::<C, bf16>(comm, buf, algo),
    }
}

fn allreduce_w<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    algo: AllreduceAlgo,
) -> Result<()> {
    let p = comm.size();
    let r = comm.rank();
    let n = buf.len();
    match algo {
        AllreduceAlgo::Ring => {
            let mut sc = Scratch::<W>::new(n.div_ceil(p));
            ring_allreduce(comm, buf, r, p, &|i| i, &mut sc)
        }
        AllreduceAlgo::RecursiveDoubling => folded::<C, W>(comm, buf, n, |v, fold, buf, sc| {
            let mut mask = 1;
            while mask < fold.p2 {
                let pv = v ^ mask;
                let partner = fold.actor(pv);
                // Both partners add the same two wire-rounded operands, lower rank first.
                W::round_in_place(buf);
                sc.sendrecv_add_inplace(comm, partner, tags::RD, partner, tags::RD, buf, pv < v)?;
                mask <<= 1;
            }
            W::round_in_place(buf);
            Ok(())
        }),
        AllreduceAlgo::Rabenseifner => {
            let fold = Fold::new(p);
            let vb: Vec<usize> = (0..=fold.p2).map(|i| block_start(n, fold.p2, i)).collect();
            folded::<C, W>(comm, buf, first_half(&vb), |v, fold, buf, sc| {
                halving_rs(comm, buf, &vb, fold, v, sc, tags::RS)?;
                W::round_in_place(&mut buf[vb[v]..vb[v + 1]]);
                doubling_ag(comm, buf, &vb, fold, v, sc, tags::AG)
            })
        }
        AllreduceAlgo::BidirectionalExchange => {
            let fold = Fold::new(p);
            let vb: Vec<usize> = (0..=fold.p2).map(|i| block_start(n, fold.p2, i)).collect();
            folded::<C, W>(comm, buf, first_half(&vb), |v, fold, buf, sc| {
                let own = be_rs(comm, buf, &vb, fold, v, sc, tags::RS)?;
                W::round_in_place(&mut buf[vb[own]..vb[own + 1]]);
                be_ag(comm, buf, &vb, fold, v, own, sc, tags::AG)
            })
        }
        AllreduceAlgo::Binomial => {
            let mut sc = Scratch::<W>::new(n);
            reduce_binomial(comm, buf, 0, &mut sc, tags::TREE_REDUCE)?;
            bcast_f32::<C, W>(comm, buf, 0, &|c, b| {
                bcast_binomial(c, b, 0, tags::TREE_BCAST)
            })
        }
        AllreduceAlgo::LinearPipeline { block_bytes } => {
            let be = lp_block_elems(block_bytes, std::mem::size_of::<W>())?;
            let mut sc = Scratch::<W>::new(be.min(n));
            lp_allreduce(comm, buf, be, &mut sc)
        }
        AllreduceAlgo::Torus2d { .. } => Err(Error::InvalidArgument(
            "torus2d is dispatched before".into(),
        )),
    }
}

/// Largest half a recursive-halving step receives (its first step's kept half).
fn first_half(vb: &[usize]) -> usize {
    let p2 = vb.len() - 1;
    let n = vb[p2];
    let mid = vb[p2 / 2];
    mid.max(n - mid)
}

/// Ring all-reduce among virtual ranks `0..p` (mapped to communicator ranks by `abs`).
fn ring_allreduce<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    me: usize,
    p: usize,
    abs: &dyn Fn(usize) -> usize,
    sc: &mut Scratch<W>,
) -> Result<()> {
    if p <= 1 {
        return Ok(());
    }
    let n = buf.len();
    let bounds: Vec<usize> = (0..=p).map(|i| block_start(n, p, i)).collect();
    ring_rs(comm, buf, &bounds, me, p, abs, sc, tags::RS)?;
    W::round_in_place(&mut buf[bounds[me]..bounds[me + 1]]);
    ring_ag(comm, buf, &bounds, me, p, abs, sc, tags::AG)
}

/// Runs `body` on the P2 acting ranks after folding the extra ranks in (even rank 2i
/// sends its vector to 2i + 1, which adds it), then sends the result back out.
fn folded<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    scratch_elems: usize,
    body: impl FnOnce(usize, Fold, &mut [f32], &mut Scratch<W>) -> Result<()>,
) -> Result<()> {
    let p = comm.size();
    let r = comm.rank();
    let fold = Fold::new(p);
    let n = buf.len();
    match fold.virt(r) {
        None => {
            let mut sc = Scratch::<W>::new(n);
            sc.send(comm, r + 1, tags::FOLD_IN, buf)?;
            sc.recv_copy(comm, r + 1, tags::FOLD_OUT, buf)
        }
        Some(v) => {
            let extra = r < 2 * fold.rem;
            let mut sc = Scratch::<W>::new(if extra {
                n
            } else {
                scratch_elems.max(n.min(1))
            });
            if extra {
                sc.recv_add(comm, r - 1, tags::FOLD_IN, buf)?;
            }
            body(v, fold, buf, &mut sc)?;
            if extra {
                sc.send(comm, r - 1, tags::FOLD_OUT, buf)?;
            }
            Ok(())
        }
    }
}

/// Broadcast of an `f32` vector through the wire type: the root rounds its own copy so it
/// keeps the bits the others decode.
fn bcast_f32<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    root: usize,
    bcast: &dyn Fn(&C, &mut [u8]) -> Result<()>,
) -> Result<()> {
    if W::IS_F32 {
        return bcast(comm, bytemuck::cast_slice_mut(buf));
    }
    let mut wire: Vec<W> = if comm.rank() == root {
        buf.iter().map(|&x| W::from_f32(x)).collect()
    } else {
        vec![W::from_f32(0.0); buf.len()]
    };
    bcast(comm, bytemuck::cast_slice_mut(&mut wire))?;
    for (o, w) in buf.iter_mut().zip(&wire) {
        *o = w.to_f32();
    }
    Ok(())
}

/// Linear-pipeline all-reduce (paper 004 Fig. 2c): ranks 0 → 1 → … → P − 1 reduce each
/// block along the chain; rank P − 1 holds the sum and the block flows back P − 1 → … → 0.
/// Rank r forwards the returning block j while reducing block j + 2(P − 1 − r), the lag
/// after which that block comes back, so both directions stay busy.
fn lp_allreduce<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    be: usize,
    sc: &mut Scratch<W>,
) -> Result<()> {
    let p = comm.size();
    let r = comm.rank();
    let n = buf.len();
    let nb = n.div_ceil(be);
    let lag = 2 * (p - 1 - r);
    let block = |j: usize| j * be..((j + 1) * be).min(n);
    for step in 0..nb + lag {
        if step < nb {
            let blk = &mut buf[block(step)];
            if r > 0 {
                sc.recv_add(comm, r - 1, tags::LP_REDUCE, blk)?;
            }
            if r + 1 < p {
                sc.send(comm, r + 1, tags::LP_REDUCE, blk)?;
            } else {
                W::round_in_place(blk);
                sc.send(comm, r - 1, tags::LP_BCAST, blk)?;
            }
        }
        if r + 1 < p && step >= lag {
            let blk = &mut buf[block(step - lag)];
            sc.recv_copy(comm, r + 1, tags::LP_BCAST, blk)?;
            if r > 0 {
                sc.send(comm, r - 1, tags::LP_BCAST, blk)?;
            }
        }
    }
    Ok(())
}

/// The two sub-communicators of a hierarchical all-reduce, split once and reused.
pub struct HierComm {
    intra: Box<dyn Communicator>,
    inter: Box<dyn Communicator>,
    ranks_per_node: usize,
}

impl HierComm {
    /// Splits `comm` by node (color = rank / ranks_per_node) and by local index
    /// (color = rank % ranks_per_node). Collective; `ranks_per_node` must divide P.
    pub fn new<C: Communicator + ?Sized>(comm: &C, ranks_per_node: usize) -> Result<Self> {
        check_topology(comm.size(), ranks_per_node)?;
        let r = comm.rank();
        let color = |x: usize| {
            u32::try_from(x)
                .map_err(|_| Error::Topology(format!("split color {x} does not fit in u32")))
        };
        let key = color(r)?;
        let intra = comm.split(color(r / ranks_per_node)?, key)?;
        let inter = comm.split(color(r % ranks_per_node)?, key)?;
        Ok(HierComm {
            intra,
            inter,
            ranks_per_node,
        })
    }

    /// Ranks per node.
    pub fn ranks_per_node(&self) -> usize {
        self.ranks_per_node
    }

    /// The communicator of this rank's node.
    pub fn intra(&self) -> &dyn Communicator {
        &*self.intra
    }

    /// The communicator of the ranks with this rank's local index, one per node.
    pub fn inter(&self) -> &dyn Communicator {
        &*self.inter
    }
}

/// 2D-torus all-reduce over split communicators (paper 001 §5.3): ring reduce-scatter in
/// the node, ring all-reduce of this rank's slice across nodes, ring all-gather in the
/// node. Options are checked on the node communicator and then the cross-node one.
pub fn allreduce_hier(hier: &HierComm, buf: &mut [f32], opts: &DenseOptions) -> Result<()> {
    if opts.check {
        let words = [
            Op::Allreduce as u64,
            buf.len() as u64,
            7,
            hier.ranks_per_node as u64,
            opts.wire.code(),
            0,
        ];
        agree(hier.intra(), words)?;
        agree(hier.inter(), words)?;
    }
    match opts.wire {
        WireType::F32 => hier_w::<f32>(hier, buf),
        WireType::F16 => hier_w::<f16>(hier, buf),
        WireType::Bf16 => hier_w::<bf16>(hier, buf),
    }
}

fn hier_w<W: WireElem>(hier: &HierComm, buf: &mut [f32]) -> Result<()> {
    let intra = hier.intra();
    let inter = hier.inter();
    let q = intra.size();
    let me = intra.rank();
    let n = buf.len();
    let bounds: Vec<usize> = (0..=q).map(|i| block_start(n, q, i)).collect();
    let mut sc = Scratch::<W>::new(n.div_ceil(q));
    ring_rs(intra, buf, &bounds, me, q, &|i| i, &mut sc, tags::RS)?;
    let slice = &mut buf[bounds[me]..bounds[me + 1]];
    let m = inter.size();
    let mut sc2 = Scratch::<W>::new(slice.len().div_ceil(m.max(1)));
    ring_allreduce(inter, slice, inter.rank(), m, &|i| i, &mut sc2)?;
    W::round_in_place(slice);
    ring_ag(intra, buf, &bounds, me, q, &|i| i, &mut sc, tags::AG)
}
