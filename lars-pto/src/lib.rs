//! # lars-pto
//!
//! LARS and LAMB layer-wise adaptive optimizers, and the parallel tensor operator (PTO) of
//! paper 001 §4.2 (Eq. 11-14) that splits their per-layer work across ranks and
//! all-gathers the small results.
#![deny(missing_docs)]
