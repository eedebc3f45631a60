//! # lars-pto
//!
//! LARS and LAMB layer-wise adaptive optimizers, and the parallel tensor operator (PTO) of
//! MSTopK/HiTopKComm (Shi et al., MLSys 2021) §4.2, Eq. 11-14, that splits
//! their per-layer work across ranks and all-gathers the small results.
//!
//! After gradient aggregation every rank holds the same gradients and weights, so a
//! per-layer computation whose inputs are identical everywhere (norms, trust ratios) can be
//! done once in total instead of once per rank: [`Pto`] gives each rank a contiguous range
//! of layers balanced by element count, runs the per-layer function there, and all-gathers
//! the outputs. [`Lars`], [`Lamb`] and [`clip_grad_norm`] use it; the result is bit-identical
//! to computing every layer locally ([`Mode::Local`]).
//!
//! ```
//! use collectives::ThreadComm;
//! use lars_pto::{Lars, LarsConfig, LayerSpec};
//!
//! let layers = vec![LayerSpec::new("conv.weight", 6), LayerSpec::new("conv.bias", 2)];
//! let out = ThreadComm::run(2, |comm| -> lars_pto::Result<Vec<f64>> {
//!     let mut opt = Lars::new(&comm, LarsConfig::default(), &layers)?;
//!     let mut w = vec![vec![0.5f32; 6], vec![0.1f32; 2]];
//!     let g = vec![vec![0.01f32; 6], vec![0.02f32; 2]];
//!     let coeffs = opt.step(&comm, &mut w, &g, 0.1)?;
//!     Ok(coeffs.iter().map(|c| c.trust_ratio).collect())
//! })
//! .unwrap();
//! assert_eq!(out[0], out[1]); // identical on every rank
//! assert_eq!(out[0][1], 1.0); // the bias is on the skip list
//! ```
#![deny(missing_docs)]

/// The accessors that [`Lars`] and [`Lamb`] share: both hold their exempt layers in
/// `excluded` and their operator in `pto`.
macro_rules! operator_accessors {
    () => {
        /// Which layers are exempt from the layer-wise scaling and from weight decay.
        pub fn excluded(&self) -> &[bool] {
            &self.excluded
        }

        /// The operator (its layer ranges, its mode).
        pub fn pto(&self) -> &Pto {
            &self.pto
        }

        /// Computes with the operator ([`Mode::Parallel`]) or every layer on every rank.
        pub fn set_mode(&mut self, mode: Mode) {
            self.pto.set_mode(mode);
        }

        /// Sets how the operator all-gathers (see [`Pto::set_exchange`]).
        pub fn set_exchange(&mut self, exchange: Exchange) -> Result<()> {
            self.pto.set_exchange(exchange)
        }
    };
}

pub mod bench_support;
mod clip;
mod error;
mod fingerprint;
mod gather;
pub mod kernels;
mod lamb;
mod lars;
mod layers;
pub mod partition;
mod pto;

#[cfg(test)]
mod tests;

pub use clip::{clip_grad_norm, grad_norm_info, ClipInfo};
/// The all-gather algorithms [`Exchange::Allgatherv`] can use.
pub use collectives::dense::AllgatherAlgo;
pub use error::{Error, Param, Quantity, Result, Status, Tensor};
pub use fingerprint::Fingerprint;
pub use lamb::{lamb_coeff, Lamb, LambCoeff, LambConfig};
pub use lars::{lars_coeff, Lars, LarsCoeff, LarsConfig};
pub use layers::{LayerSpec, SkipList};
pub use partition::balanced_ranges;
pub use pto::{Exchange, Mode, Pto, DEFAULT_TAG};
