//! The crate's one error type.

/// Everything that can go wrong in selecting, encoding or decoding sparse gradients.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A NaN or infinite value in the input, found at `index`.
    #[error("non-finite value {value} at index {index}")]
    NonFinite {
        /// Position of the first non-finite value found.
        index: usize,
        /// The value (NaN or ±inf).
        value: f32,
    },
    /// Two buffers that must have the same length do not.
    #[error("length mismatch: {what} has {got} elements, expected {expected}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length it must have.
        expected: usize,
    },
    /// Indices not strictly increasing or out of the dense range.
    #[error("invalid sparse indices: {0}")]
    InvalidIndices(String),
    /// A wire message that does not decode (truncated, wrong tag, bad lengths).
    #[error("malformed sparse message: {0}")]
    Decode(String),
    /// A dense length beyond what `u32` indices address.
    #[error("dense length {0} exceeds the u32 index range")]
    TooLong(usize),
    /// An option outside its domain.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A CUDA failure or a missing GPU.
    #[error("cuda: {0}")]
    Cuda(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
