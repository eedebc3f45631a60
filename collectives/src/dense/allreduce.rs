//! All-reduce (sum of `f32`) with seven algorithms; every rank ends with the same bits.

use half::{bf16, f16};

use cost_model::plan::dense as plan;

use crate::dense::bcast::lp_block_elems;
use crate::dense::exec::run_wire;
use crate::dense::library::library_of;
use crate::dense::shared_memory::{self, segment_of};
use crate::dense::util::{agree, check_call};
use crate::dense::wire::{by_wire, WireElem};
use crate::dense::{DenseOptions, Op, WireType};
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
    /// Bidirectional exchange (Linear Pipelining (Wang et al.) Table 1 "BE", after Chan et al.
    /// 2007): the same reduce-scatter + all-gather costs as Rabenseifner, with partner distance
    /// doubling in the reduce-scatter (nearest partners move the largest halves).
    BidirectionalExchange,
    /// Binomial-tree reduce to rank 0 + binomial broadcast (Linear Pipelining's MST).
    Binomial,
    /// Linear pipeline (Linear Pipelining (Wang et al.) Fig. 2c): chain reduce towards rank P − 1,
    /// pipelined broadcast back, in blocks of `block_bytes` wire bytes.
    LinearPipeline {
        /// Pipeline block size b in bytes on the wire (≥ one element).
        block_bytes: usize,
    },
    /// 2D torus / hierarchical (MSTopK/HiTopKComm (Shi et al., MLSys 2021) §5.3): intra-node
    /// reduce-scatter, inter-node ring all-reduce of each slice, intra-node all-gather; rank r is
    /// on node r / ranks_per_node.
    Torus2d {
        /// Ranks per node; must divide P.
        ranks_per_node: usize,
    },
    /// The transport library's own all-reduce (`MPI_Allreduce`), for transports that have
    /// one ([`Communicator::library`]); `f32` on the wire only. Not in
    /// [`AllreduceAlgo::all`]: [`choose_allreduce_for`](crate::dense::choose_allreduce_for)
    /// ranks it beside ours when a calibration measured it.
    Library,
    /// Through memory all ranks share ([`crate::dense::shared_memory`]), for communicators
    /// on one machine that have a segment ([`Communicator::shared_segment`]); `f32` only.
    /// Not in [`AllreduceAlgo::all`]: [`choose_allreduce_for`](crate::dense::choose_allreduce_for)
    /// ranks it when the communicator has a segment and a calibration measured it.
    SharedMemory,
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
    /// `torus2d`, `library`, `shared_memory`.
    pub fn name(&self) -> &'static str {
        match self {
            AllreduceAlgo::Ring => "ring",
            AllreduceAlgo::RecursiveDoubling => "recursive_doubling",
            AllreduceAlgo::Rabenseifner => "rabenseifner",
            AllreduceAlgo::BidirectionalExchange => "be",
            AllreduceAlgo::Binomial => "binomial",
            AllreduceAlgo::LinearPipeline { .. } => "lp",
            AllreduceAlgo::Torus2d { .. } => "torus2d",
            AllreduceAlgo::Library => "library",
            AllreduceAlgo::SharedMemory => "shared_memory",
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
            AllreduceAlgo::Library => (8, 0),
            AllreduceAlgo::SharedMemory => (9, 0),
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
    check_call(comm, opts, Op::Allreduce, buf.len(), algo.code(), 0)?;
    let p = comm.size();
    algo.validate(p, opts.wire)?;
    if matches!(algo, AllreduceAlgo::Library | AllreduceAlgo::SharedMemory) {
        if algo == AllreduceAlgo::Library {
            library_of(comm, "allreduce", opts.wire)?.allreduce_f32(buf)?;
        } else {
            shared_memory::allreduce(segment_of(comm, "allreduce", opts.wire)?, buf)?;
        }
        // The ring's reduce-scatter and all-gather: all but this rank's block, twice.
        let moved =
            2 * 4 * (buf.len() - crate::dense::util::block_range(buf.len(), p, comm.rank()).len());
        comm.record_collective(moved, moved);
        return Ok(());
    }
    if p == 1 {
        return Ok(());
    }
    if let AllreduceAlgo::Torus2d { ranks_per_node } = algo {
        let hier = HierComm::new(comm, ranks_per_node)?;
        return allreduce_hier(&hier, buf, &opts.unchecked());
    }
    by_wire!(opts.wire, allreduce_w::<C, W>(comm, buf, algo))
}

fn allreduce_w<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    algo: AllreduceAlgo,
) -> Result<()> {
    let (p, r, n) = (comm.size(), comm.rank(), buf.len());
    let steps = match algo {
        AllreduceAlgo::Ring => plan::allreduce_ring(n, p, r),
        AllreduceAlgo::RecursiveDoubling => plan::allreduce_recursive_doubling(n, p, r),
        AllreduceAlgo::Rabenseifner => plan::allreduce_halving(n, p, r, false),
        AllreduceAlgo::BidirectionalExchange => plan::allreduce_halving(n, p, r, true),
        AllreduceAlgo::Binomial => plan::allreduce_binomial(n, p, r),
        AllreduceAlgo::LinearPipeline { block_bytes } => {
            let be = lp_block_elems(block_bytes, std::mem::size_of::<W>())?;
            plan::allreduce_lp(n, p, r, be)
        }
        AllreduceAlgo::Torus2d { .. } | AllreduceAlgo::Library | AllreduceAlgo::SharedMemory => {
            return Err(Error::InvalidArgument(format!(
                "{} is dispatched before",
                algo.name()
            )))
        }
    };
    run_wire::<C, W>(comm, buf, &steps)
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

/// 2D-torus all-reduce over split communicators (MSTopK/HiTopKComm (Shi et al., MLSys 2021) §5.3):
/// ring reduce-scatter in the node, ring all-reduce of this rank's slice across nodes, ring
/// all-gather in the node. Options are checked on the node communicator and then the cross-node
/// one.
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
    let (intra, inter) = (hier.intra(), hier.inter());
    let t = plan::allreduce_torus(
        buf.len(),
        intra.size(),
        inter.size(),
        inter.rank(),
        intra.rank(),
    );
    run_wire::<_, W>(intra, buf, &t.intra_rs)?;
    run_wire::<_, W>(inter, buf, &t.inter)?;
    run_wire::<_, W>(intra, buf, &t.intra_ag)
}
