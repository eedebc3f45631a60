//! # cost-model
//!
//! Predicts what communication and sparsification cost on a cluster, so that planners can
//! choose layer merges and algorithms without running them: the α-β(-γ) models of the
//! collectives, fitted by least squares from measurements; the top-k cost model
//! `t = γ·ρ·d·log d` of OMGS-SGD (Shi et al., INFOCOM 2020), Eq. 10-11 and §V-B;
//! predicted time, rounds and bytes of every algorithm (exact schedules of the dense ones
//! and, given the step's data-dependent entry counts, of the sparse ones: SparDL
//! (Zhao et al.) Table 1, Linear Pipelining (Wang et al.) Table 1, and MSTopK/HiTopKComm
//! (Shi et al., MLSys 2021) Eq. 3 and 7-10 for hierarchical clusters); presets with the
//! papers' published constants; the calibration JSON and an algorithm ranking.
//!
//! This crate depends on nothing else of the workspace.
//!
//! ```
//! use cost_model::{Link, Topology};
//! let one_gbe = Link::from_gbit(50e-6, 1.0);
//! let cluster = Topology::flat(16, one_gbe).unwrap();
//! assert_eq!(cluster.ranks(), 16);
//! assert!(cluster.link(0, 1).time(1 << 20) > 8e-3);
//!
//! // The 1 GbE cluster of OMGS-SGD (Shi et al., INFOCOM 2020) with the authors' constants.
//! let omgs = cost_model::presets::omgs_1gbe(16).unwrap();
//! assert!(omgs.topk.time(1 << 20) > 0.0 && omgs.sparse_allgather.time(1 << 10) > 0.0);
//!
//! // Rank the all-reduce algorithms for 64 MiB on this cluster, fastest first.
//! let ranked = cost_model::rank_dense(cost_model::Collective::Allreduce, 64 << 20, &cluster, 64 << 10).unwrap();
//! assert_eq!(ranked.len(), 7);
//! ```
#![deny(missing_docs)]

pub mod algorithm;
pub mod calibration;
pub mod dense;
mod error;
pub mod fit;
pub mod models;
pub mod plan;
pub mod presets;
pub mod schedule;
pub mod sparse;
pub mod sparse_replay;
pub mod topology;

pub use algorithm::{Algorithm, Collective};
pub use calibration::{rank_dense, rank_dense_calibrated, Calibration, CollectiveFit, TopkFit};
pub use dense::{predict_dense, DenseCase};
pub use error::{Error, Result};
pub use fit::{
    fit_linear, fit_reduction, fit_topk_linear, fit_topk_omgs, median, FitQuality, Fitted, Sample,
};
pub use models::{LinearModel, ReductionModel, SparseAllgatherModel, TopkModel};
pub use schedule::{Prediction, RankCost, Schedule};
pub use sparse::{predict_sparse, rank_sparse, SparseCase, SparseCost};
pub use sparse_replay::{replay_sparse, Observed, SparseStep};
pub use topology::{Link, Topology};
