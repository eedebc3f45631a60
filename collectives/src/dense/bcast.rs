//! Broadcast (binomial tree, scatter + all-gather, linear pipeline) and reduce (binomial tree,
//! linear pipeline, bidirectional exchange). The tree is Linear Pipelining's MST; the pipeline is Linear Pipelining
//! (Wang et al.) §3 (Fig. 2a, 2b); scatter + all-gather is van de Geijn's long-message broadcast
//! (Thakur, Rabenseifner & Gropp 2005, §3.2).

use bytemuck::Pod;

use cost_model::plan::dense as plan;

use crate::dense::exec::{run_bytes, run_wire};
use crate::dense::util::check_call;
use crate::dense::wire::{by_wire, WireElem};
use crate::dense::{DenseOptions, Op};
use crate::{Communicator, Error, Result};

/// Broadcast algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BroadcastAlgo {
    /// Binomial tree (MST): ⌈log2 P⌉ steps of the whole message.
    Binomial,
    /// Binomial scatter of P blocks, then a ring all-gather (van de Geijn).
    ScatterAllgather,
    /// Chain from the root in blocks of `block_bytes` bytes (Linear Pipelining (Wang et al.)
    /// Fig. 2a).
    LinearPipeline {
        /// Pipeline block size b in bytes (> 0).
        block_bytes: usize,
    },
}

impl BroadcastAlgo {
    /// Short name: `binomial`, `scatter_allgather`, `lp`.
    pub fn name(&self) -> &'static str {
        match self {
            BroadcastAlgo::Binomial => "binomial",
            BroadcastAlgo::ScatterAllgather => "scatter_allgather",
            BroadcastAlgo::LinearPipeline { .. } => "lp",
        }
    }

    fn code(&self) -> (u64, u64) {
        match self {
            BroadcastAlgo::Binomial => (1, 0),
            BroadcastAlgo::ScatterAllgather => (2, 0),
            BroadcastAlgo::LinearPipeline { block_bytes } => (3, *block_bytes as u64),
        }
    }
}

/// Reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceAlgo {
    /// Binomial tree (MST).
    Binomial,
    /// Chain ending at the root in blocks of `block_bytes` wire bytes (Linear Pipelining
    /// (Wang et al.) Fig. 2b).
    LinearPipeline {
        /// Pipeline block size b in bytes on the wire (≥ one element).
        block_bytes: usize,
    },
    /// Bidirectional exchange: BE reduce-scatter, then a gather of the blocks to the root
    /// (Linear Pipelining (Wang et al.) Table 1 "BE", after Chan et al. 2007).
    BidirectionalExchange,
}

impl ReduceAlgo {
    /// Short name: `binomial`, `lp`, `be`.
    pub fn name(&self) -> &'static str {
        match self {
            ReduceAlgo::Binomial => "binomial",
            ReduceAlgo::LinearPipeline { .. } => "lp",
            ReduceAlgo::BidirectionalExchange => "be",
        }
    }

    /// The reduce algorithm the cost model calls `algo` (`binomial`, `lp` with pipeline
    /// blocks of `block_bytes`, `be`); an algorithm that has no reduce is a typed error.
    pub fn from_algorithm(algo: cost_model::Algorithm, block_bytes: usize) -> Result<Self> {
        use cost_model::Algorithm as A;
        Ok(match algo {
            A::Binomial => ReduceAlgo::Binomial,
            A::Lp => ReduceAlgo::LinearPipeline { block_bytes },
            A::Be => ReduceAlgo::BidirectionalExchange,
            a => {
                return Err(Error::InvalidArgument(format!(
                    "reduce has no {} algorithm",
                    a.name()
                )))
            }
        })
    }

    fn code(&self) -> (u64, u64) {
        match self {
            ReduceAlgo::Binomial => (1, 0),
            ReduceAlgo::LinearPipeline { block_bytes } => (2, *block_bytes as u64),
            ReduceAlgo::BidirectionalExchange => (3, 0),
        }
    }
}

fn check_root(root: usize, p: usize) -> Result<()> {
    if root < p {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "root {root} is outside 0..{p}"
        )))
    }
}

/// Pipeline block size in elements of `elem` bytes; 0 or less than one element is an error.
pub(crate) fn lp_block_elems(block_bytes: usize, elem: usize) -> Result<usize> {
    if block_bytes < elem.max(1) {
        Err(Error::InvalidArgument(format!(
            "linear pipeline block size {block_bytes} bytes is smaller than one {elem}-byte element"
        )))
    } else {
        Ok(block_bytes / elem.max(1))
    }
}

/// Copies the root's `buf` to every rank.
pub fn broadcast<C: Communicator + ?Sized, T: Pod>(
    comm: &C,
    buf: &mut [T],
    root: usize,
    algo: BroadcastAlgo,
    opts: &DenseOptions,
) -> Result<()> {
    check_call(comm, opts, Op::Broadcast, buf.len(), algo.code(), root)?;
    check_root(root, comm.size())?;
    let elem = std::mem::size_of::<T>().max(1);
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
    let (p, r, n) = (comm.size(), comm.rank(), bytes.len());
    let steps = match algo {
        BroadcastAlgo::Binomial => plan::broadcast_binomial(n, p, r, root),
        BroadcastAlgo::ScatterAllgather => plan::bcast_scatter_allgather(n, p, r, root),
        BroadcastAlgo::LinearPipeline { block_bytes } => {
            // Whole elements per block, so no element straddles two messages.
            let b = lp_block_elems(block_bytes, elem)? * elem;
            plan::bcast_lp(n, p, r, root, b)
        }
    };
    run_bytes(comm, bytes, &steps)
}

/// Sums every rank's `buf` into the root's `buf`. Other ranks' buffers hold partial sums
/// afterwards (they are the algorithm's scratch).
pub fn reduce<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [f32],
    root: usize,
    algo: ReduceAlgo,
    opts: &DenseOptions,
) -> Result<()> {
    check_call(comm, opts, Op::Reduce, buf.len(), algo.code(), root)?;
    check_root(root, comm.size())?;
    by_wire!(opts.wire, reduce_w::<C, W>(comm, buf, root, algo))
}

fn reduce_w<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    root: usize,
    algo: ReduceAlgo,
) -> Result<()> {
    let (p, r, n) = (comm.size(), comm.rank(), buf.len());
    let steps = match algo {
        ReduceAlgo::Binomial => plan::reduce_binomial_to(n, p, r, root),
        ReduceAlgo::LinearPipeline { block_bytes } => {
            let be = lp_block_elems(block_bytes, std::mem::size_of::<W>())?;
            plan::reduce_lp(n, p, r, root, be)
        }
        ReduceAlgo::BidirectionalExchange => plan::reduce_be(n, p, r, root),
    };
    run_wire::<C, W>(comm, buf, &steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_algorithms_by_cost_model_name() {
        for &a in cost_model::Collective::Reduce.algorithms() {
            let r = ReduceAlgo::from_algorithm(a, 64).unwrap();
            assert_eq!(r.name(), a.name());
        }
        assert!(matches!(
            ReduceAlgo::from_algorithm(cost_model::Algorithm::Ring, 64),
            Err(Error::InvalidArgument(_))
        ));
    }
}
