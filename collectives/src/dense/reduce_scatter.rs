//! Reduce-scatter (sum): ring and recursive halving (Thakur, Rabenseifner & Gropp 2005,
//! §4), executing the plans of `cost_model::plan::dense`.

use std::ops::Range;

use cost_model::plan::dense as plan;

use crate::dense::exec::run_wire;
use crate::dense::library::library_of;
use crate::dense::shared_memory::{self, segment_of};
use crate::dense::util::{block_range, check_call};
use crate::dense::wire::{by_wire, WireElem};
use crate::dense::{DenseOptions, Op};
use crate::{Communicator, Error, Result};

/// Reduce-scatter algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReduceScatterAlgo {
    /// P − 1 neighbour steps of n/P elements.
    #[default]
    Ring,
    /// log2 P halving exchanges (partner distance P/2, P/4, …); other P fold in first.
    RecursiveHalving,
    /// The transport library's own reduce-scatter (`MPI_Reduce_scatter` with the blocks
    /// of [`block_range`]), for transports that have one ([`Communicator::library`]);
    /// `f32` on the wire only. Not in [`ReduceScatterAlgo::ALL`]:
    /// [`choose_reduce_scatter_for`](crate::dense::choose_reduce_scatter_for) ranks it
    /// beside ours when a calibration measured it.
    Library,
    /// Through memory all ranks share ([`crate::dense::shared_memory`]), for communicators
    /// on one machine that have a segment ([`Communicator::shared_segment`]); `f32` only.
    /// Not in [`ReduceScatterAlgo::ALL`]: the chooser ranks it when the communicator has a
    /// segment and a calibration measured it.
    SharedMemory,
}

impl ReduceScatterAlgo {
    /// Every algorithm.
    pub const ALL: [ReduceScatterAlgo; 2] =
        [ReduceScatterAlgo::Ring, ReduceScatterAlgo::RecursiveHalving];

    /// Short name: `ring`, `recursive_halving`, `library`, `shared_memory`.
    pub fn name(&self) -> &'static str {
        match self {
            ReduceScatterAlgo::Ring => "ring",
            ReduceScatterAlgo::RecursiveHalving => "recursive_halving",
            ReduceScatterAlgo::Library => "library",
            ReduceScatterAlgo::SharedMemory => "shared_memory",
        }
    }

    fn code(&self) -> u64 {
        match self {
            ReduceScatterAlgo::Ring => 1,
            ReduceScatterAlgo::RecursiveHalving => 2,
            ReduceScatterAlgo::Library => 3,
            ReduceScatterAlgo::SharedMemory => 4,
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
    check_call(
        comm,
        opts,
        Op::ReduceScatter,
        buf.len(),
        (algo.code(), 0),
        0,
    )?;
    if matches!(
        algo,
        ReduceScatterAlgo::Library | ReduceScatterAlgo::SharedMemory
    ) {
        let (n, p) = (buf.len(), comm.size());
        let mine = if algo == ReduceScatterAlgo::Library {
            let counts: smallvec::SmallVec<[usize; 16]> =
                (0..p).map(|r| block_range(n, p, r).len()).collect();
            library_of(comm, "reduce_scatter", opts.wire)?.reduce_scatter_f32(buf, &counts)?;
            block_range(n, p, comm.rank())
        } else {
            shared_memory::reduce_scatter(segment_of(comm, "reduce_scatter", opts.wire)?, buf)?
        };
        // The ring's reduce-scatter: all but this rank's block.
        comm.record_collective(4 * (n - mine.len()), 4 * (n - mine.len()));
        return Ok(mine);
    }
    by_wire!(opts.wire, reduce_scatter_w::<C, W>(comm, buf, algo))
}

fn reduce_scatter_w<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    algo: ReduceScatterAlgo,
) -> Result<Range<usize>> {
    let (p, r, n) = (comm.size(), comm.rank(), buf.len());
    let steps = match algo {
        ReduceScatterAlgo::Ring => plan::reduce_scatter_ring(n, p, r),
        ReduceScatterAlgo::RecursiveHalving => plan::reduce_scatter_halving(n, p, r),
        ReduceScatterAlgo::Library | ReduceScatterAlgo::SharedMemory => {
            return Err(Error::InvalidArgument(
                "the library and shared-memory reduce-scatters are dispatched before".into(),
            ))
        }
    };
    run_wire::<C, W>(comm, buf, &steps)?;
    Ok(block_range(n, p, r))
}
