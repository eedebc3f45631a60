//! # cost-model
//!
//! Predicts what communication and sparsification cost on a cluster, so that planners can
//! choose layer merges and algorithms without running them: the α-β(-γ) models of the
//! collectives, fitted by least squares from measurements; the top-k cost model
//! `t = γ·ρ·d·log d` of OMGS-SGD (paper 000, Eq. 10-11, §V-B); closed-form costs of every
//! algorithm (paper 003 Table 1, paper 004 Table 1, paper 001 Eq. 3 and 7-10 for
//! hierarchical clusters); presets with the papers' published constants.
//!
//! This crate depends on nothing else of the workspace.
//!
//! ```
//! use cost_model::{Link, Topology};
//! let one_gbe = Link::from_gbit(50e-6, 1.0);
//! let cluster = Topology::flat(16, one_gbe).unwrap();
//! assert_eq!(cluster.ranks(), 16);
//! assert!(cluster.link(0, 1).time(1 << 20) > 8e-3);
//! ```
#![deny(missing_docs)]

pub mod algorithm;
pub mod calibration;
pub mod dense;
mod error;
pub mod fit;
pub mod models;
pub mod presets;
pub mod schedule;
pub mod topology;

pub use algorithm::{Algorithm, Collective};
pub use calibration::Calibration;
pub use error::{Error, Result};
pub use fit::{FitQuality, Fitted, Sample};
pub use models::{LinearModel, ReductionModel, SparseAllgatherModel, TopkModel};
pub use topology::{Link, Topology};
