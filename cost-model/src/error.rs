//! The crate's one error type.

/// Everything that can go wrong in fitting, predicting or reading a cost model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A topology with a zero count or a negative or non-finite constant.
    #[error("invalid topology: {0}")]
    InvalidTopology(String),
    /// A topology that does not describe the number of ranks it is used with.
    #[error(
        "topology of {nodes} nodes × {ranks_per_node} ranks per node does not match {ranks} ranks"
    )]
    TopologyMismatch {
        /// Nodes in the topology.
        nodes: usize,
        /// Ranks per node in the topology.
        ranks_per_node: usize,
        /// The number of ranks it was used with.
        ranks: usize,
    },
    /// An argument outside its domain (the message says which and why).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Samples that cannot determine a fit (too few distinct sizes, bad times).
    #[error("cannot fit: {0}")]
    Fit(String),
    /// A JSON file that could not be read or parsed.
    #[error("{path}: {message}")]
    Json {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
