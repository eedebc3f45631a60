//! # collectives
//!
//! Transports and collective algorithms for data-parallel training.
//!
//! - [`Communicator`]: the transport contract (tagged, buffered byte messages, split,
//!   barrier) with backends [`ThreadComm`] (ranks as threads, the embedded default),
//!   `MpiComm` (feature `mpi`, one rank per process under `mpirun`) and [`SimComm`] (wraps
//!   any transport and accounts for time, rounds and bytes on a modelled cluster).
//! - Dense collectives (allreduce, allgather, reduce-scatter, broadcast, reduce) with the
//!   classic algorithms and the linear pipeline of Linear Pipelining (Wang et al.).
//! - Sparse allreduce of top-k gradients: TopkA, TopkDSA, gTopk, CLT-k, SparDL (Zhao et al.),
//!   HiTopKComm (Shi et al., MLSys 2021, §3.2), ExDyna (Yoon & Oh, CCGrid 2024).
//!
//! ```
//! use collectives::{CommExt, Communicator, ThreadComm};
//! let sums = ThreadComm::run(3, |comm| -> collectives::Result<f32> {
//!     let right = (comm.rank() + 1) % comm.size();
//!     let left = (comm.rank() + comm.size() - 1) % comm.size();
//!     let got: Vec<f32> = comm.sendrecv_vec(right, 0, &[comm.rank() as f32], left, 0)?;
//!     Ok(got[0])
//! })
//! .unwrap();
//! assert_eq!(sums, vec![2.0, 0.0, 1.0]);
//! ```
#![deny(missing_docs)]

pub mod calibrate;
pub mod comm;
pub mod dense;
mod error;
pub mod sparse;

pub use comm::sim::{prediction_mismatch, ClockMode, SimComm, SimStats, Traced};
pub use comm::tap::{Counts, Meter, Metered, Tap, Tapped};
pub use comm::thread::{RunError, ThreadComm, ThreadConfig};
pub use comm::{CommExt, Communicator, LibraryCollectives, Tag, MAX_USER_TAG};
pub use dense::{
    allgather, allgatherv, allreduce, broadcast, reduce, reduce_scatter, AllgatherAlgo,
    AllreduceAlgo, BroadcastAlgo, DenseOptions, Gathered, ReduceAlgo, ReduceScatterAlgo, WireType,
};
pub use error::{Error, Result};
pub use sparse::{SparseAlgo, SparseAllreduce, StepStats};

#[cfg(feature = "mpi")]
pub use comm::mpi::MpiComm;

#[cfg(feature = "nccl")]
pub use comm::nccl::NcclComm;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
