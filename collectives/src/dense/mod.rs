//! Dense collectives: all-reduce, all-gather (equal and variable counts), reduce-scatter,
//! broadcast and reduce, each with a choice of algorithm.
//!
//! Algorithms follow Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
//! Operations in MPICH" (2005) for ring, recursive doubling / halving, Rabenseifner and Bruck; Chan
//! et al. (2007) as cited by Linear Pipelining (Wang et al.) for bidirectional exchange (BE);
//! Linear Pipelining (Wang et al.) §3 for the linear pipeline (LP) and the minimum spanning tree
//! (MST, binomial); MSTopK/HiTopKComm (Shi et al., MLSys 2021) §5.3 for the 2D-torus / hierarchical
//! all-reduce.
//!
//! Guarantees:
//! - Any P ≥ 1 (non-powers of two use the standard fold-in of the extra ranks) and any
//!   length, including 0 and lengths not divisible by P.
//! - Sums are accumulated in `f32`; [`WireType`] puts `f16`/`bf16` on the wire instead.
//! - Every rank ends an all-reduce with bit-identical results: each element's final value
//!   is computed once and copied, or computed by both partners from the same operands
//!   (recursive doubling rounds both operands to the wire type first).
//! - With [`DenseOptions::check`] (the default) every rank first compares length,
//!   algorithm, parameters, wire type and root, and all return the same
//!   [`Error::Mismatch`](crate::Error::Mismatch) on disagreement instead of hanging.
//!
//! Tags: this module uses the fixed range [`tags::FIRST`]`..=`[`tags::LAST`]
//! (`0x6000..=0x603F`); other code on the same communicator should avoid it.
//!
//! ```
//! use collectives::dense::{allreduce, AllreduceAlgo, DenseOptions};
//! use collectives::{Communicator, ThreadComm};
//! let out = ThreadComm::run(3, |comm| -> collectives::Result<Vec<f32>> {
//!     let mut buf = vec![comm.rank() as f32 + 1.0; 5];
//!     allreduce(&comm, &mut buf, AllreduceAlgo::Ring, &DenseOptions::default())?;
//!     Ok(buf)
//! })
//! .unwrap();
//! assert!(out.iter().all(|b| b == &vec![6.0; 5]));
//! ```

mod allgather;
mod allreduce;
mod bcast;
mod chooser;
mod exec;
mod library;
mod online;
mod reduce_scatter;
pub mod shared_memory;
pub(crate) mod util;
mod wire;

pub use allgather::{allgather, allgatherv, allgatherv_known, AllgatherAlgo, Gathered};
pub use allreduce::{allreduce, allreduce_hier, AllreduceAlgo, HierComm};
pub use bcast::{broadcast, reduce, BroadcastAlgo, ReduceAlgo};
pub use chooser::{
    choose_allgather, choose_allgather_for, choose_allreduce, choose_allreduce_for,
    choose_reduce_scatter, choose_reduce_scatter_for, Predictor, LIBRARY_MARGIN,
};
pub use online::{
    OnlineChoice, CLOSE, EXPLORE_BURST, EXPLORE_CLOSE, EXPLORE_EARLY, EXPLORE_EVERY,
    EXPLORE_LONGEST, LEARNING_AGREEMENTS, SAMPLE_ALL_BYTES, SAMPLE_EVERY, SETTLE_CALLS,
    SWITCH_MARGIN,
};
pub use reduce_scatter::{reduce_scatter, ReduceScatterAlgo};
pub use util::{block_range, block_start};
pub use wire::WireType;

/// Options shared by the dense collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseOptions {
    /// Element type on the wire for the reducing collectives (sums stay in `f32`).
    pub wire: WireType,
    /// Compare length, algorithm, parameters and wire type across ranks first (a Bruck all-gather
    /// of 48 bytes per rank, ⌈log2 P⌉ rounds). On by default; turn off on a hot path whose
    /// arguments are known to agree.
    pub check: bool,
}

impl Default for DenseOptions {
    fn default() -> Self {
        DenseOptions {
            wire: WireType::F32,
            check: true,
        }
    }
}

impl DenseOptions {
    /// Default options with another wire type.
    pub fn with_wire(wire: WireType) -> Self {
        DenseOptions {
            wire,
            ..Self::default()
        }
    }

    /// These options without the agreement check (hot path, SimComm accounting). The caller
    /// then promises that every rank makes the same call: a rank that receives a shorter
    /// message still reports [`Error::Mismatch`](crate::Error::Mismatch), but under MPI a
    /// longer one ends the job (`MPI_ERR_TRUNCATE`), because the plans' receives are posted
    /// ahead of the messages (see `Communicator::recv_agreed_into`).
    pub fn unchecked(self) -> Self {
        DenseOptions {
            check: false,
            ..self
        }
    }
}

/// Operation codes for the agreement check.
#[derive(Debug, Clone, Copy)]
#[repr(u64)]
pub(crate) enum Op {
    Allreduce = 1,
    Allgather = 2,
    ReduceScatter = 3,
    Broadcast = 4,
    Reduce = 5,
}

/// The fixed tag range of the dense collectives (each phase has its own tag, so messages
/// of different phases never match each other); defined beside the plans that use them.
pub use cost_model::plan::dense::tags;
