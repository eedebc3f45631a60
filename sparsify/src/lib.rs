//! # sparsify
//!
//! Top-k gradient sparsification for data-parallel training: selectors that pick the `k`
//! entries of largest magnitude (exact, MSTopK of paper 001 §3.1 Algorithm 1, DGC sampling,
//! hard threshold, ExDyna's scaled threshold of paper 002 §IV-C/D, Gaussian-k), fused with
//! error feedback (residual memory) so the hot path makes one pass over memory, and
//! [`SparseGrad`], the coordinate-form sparse gradient every sparse collective exchanges.
//! The cost of top-k selection is what paper 000 §II-E models.
//!
//! ```
//! use sparsify::SparseGrad;
//! let g = SparseGrad::<f32>::from_dense(&[0.0, 3.0, 0.0, -1.0]).unwrap();
//! assert_eq!(g.indices(), &[1, 3]);
//! let wire = g.encode();
//! assert_eq!(SparseGrad::<f32>::decode(&wire).unwrap(), g);
//! ```
#![deny(missing_docs)]

mod error;
pub mod selector;
pub mod sparse;
mod value;

pub use error::{Error, Result};
pub use selector::{SelectInfo, Selector};
pub use sparse::SparseGrad;
pub use value::Value;

/// Checks that a residual and a gradient have the same length.
pub(crate) fn check_same_len(residual: usize, grad: usize) -> Result<()> {
    if residual == grad {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            what: "residual",
            got: residual,
            expected: grad,
        })
    }
}
