//! # pipeline
//!
//! Composes the workspace into a data-parallel training step: layer profiles, merge planners (LAGS
//! layer-wise, TopK-SGD single group, MGS threshold, the optimal merge of OMGS-SGD (Shi et al.,
//! INFOCOM 2020) Algorithm 1, MG-WFBP for dense, an exact planner), the iteration timeline of
//! OMGS-SGD Eq. 2-9 and 17, and the runtime that a framework drives from its backward hooks
//! (OMGS-SGD Algorithm 2; BSP-SGD Algorithms 1-3 of Linear Pipelining (Wang et al.), whose
//! root-only update and per-stage weight broadcast live in [`bsp`];
//! MSTopK/HiTopKComm (Shi et al., MLSys 2021) §4).
//!
//! ```
//! use pipeline::{predict, zoo, OmgsCosts, Planner};
//! let profile = zoo::profile("resnet50").unwrap();
//! let costs = OmgsCosts::preset(16).unwrap();
//! let plan = Planner::default().plan(&profile, &costs).unwrap();
//! let topk = Planner::TopK.plan(&profile, &costs).unwrap();
//! let t = predict(&profile, &plan, &costs).unwrap();
//! assert!(t.iteration_s <= predict(&profile, &topk, &costs).unwrap().iteration_s);
//! ```
#![deny(missing_docs)]

pub mod bsp;
pub mod candle_models;
pub mod check;
pub mod checkpoint;
pub mod data;
pub mod emulated;
mod error;
pub mod gantt;
pub mod optimizer;
pub mod plan;
pub mod profile;
pub mod reduction;
pub mod runtime;
pub mod schemes;
pub mod staged;
pub mod timeline;
pub mod trace;
pub mod train;
pub mod validate;
pub mod zoo;

pub use error::{Error, Result};
pub use plan::{MergePlan, Planner};
pub use profile::{Layer, LayerProfile};
pub use reduction::{DenseChoice, SchemeKind};
pub use runtime::Reducer;
pub use schemes::{
    CollectiveScheme, DenseAllreduce, OnlineDenseExchange, Scheme, SelectorAllgather, TopkAllgather,
};
pub use timeline::{
    predict, DenseCosts, OmgsCosts, SimpleCosts, Span, StepCosts, Timeline, Traffic,
};
pub use train::{train, train_suite, SuiteResult, TrainConfig, TrainReport};
