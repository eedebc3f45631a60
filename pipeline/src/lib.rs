//! # pipeline
//!
//! Composes the workspace into a data-parallel training step: layer profiles, merge
//! planners (LAGS layer-wise, TopK-SGD single group, MGS threshold, OMGS optimal merge of
//! paper 000 Algorithm 1, MG-WFBP for dense), the iteration timeline of paper 000
//! (Eq. 2-9, 17), and the runtime that a framework drives from its backward hooks
//! (paper 000 Algorithm 2; paper 004 BSP-SGD Algorithms 1-3; paper 001 §4).
#![deny(missing_docs)]
