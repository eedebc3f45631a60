//! The crate's one error type: transport failures and algorithm misuse alike.

use std::time::Duration;

/// Everything that can go wrong in a transport or a collective algorithm.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A peer rank outside `0..size`.
    #[error("rank {rank} is outside 0..{size}")]
    InvalidRank {
        /// The rank asked for.
        rank: usize,
        /// The communicator's size.
        size: usize,
    },
    /// A tag in the range the transports reserve for themselves.
    #[error("tag {tag} collides with the reserved range; user tags are 0..={max}")]
    ReservedTag {
        /// The tag used.
        tag: u32,
        /// The largest user tag.
        max: u32,
    },
    /// A message longer than the fixed receive buffer given for it.
    #[error("rank {rank}: message from rank {src} with tag {tag} has {len} bytes, buffer holds {capacity}")]
    MessageTooLarge {
        /// The receiving rank.
        rank: usize,
        /// The sender.
        src: usize,
        /// The tag.
        tag: u32,
        /// The message's length in bytes.
        len: usize,
        /// The buffer's length in bytes.
        capacity: usize,
    },
    /// A message whose byte length is not a multiple of the element size it is read as.
    #[error("rank {rank}: message from rank {src} with tag {tag} has {len} bytes, not a multiple of {elem}")]
    MisalignedMessage {
        /// The receiving rank.
        rank: usize,
        /// The sender.
        src: usize,
        /// The tag.
        tag: u32,
        /// The message's length in bytes.
        len: usize,
        /// The element size.
        elem: usize,
    },
    /// A receive that waited past the transport's timeout.
    #[error("rank {rank} waited {waited:?} for a message from rank {src} with tag {tag}")]
    Timeout {
        /// The receiving rank.
        rank: usize,
        /// The rank it waited for.
        src: usize,
        /// The tag it waited for.
        tag: u32,
        /// How long it waited.
        waited: Duration,
    },
    /// Another rank failed (returned an error or panicked), so this one stopped waiting.
    #[error("rank {rank} stopped: rank {failed} failed")]
    PeerFailed {
        /// The rank that stopped.
        rank: usize,
        /// The rank that failed first.
        failed: usize,
    },
    /// Ranks disagree on something that must be equal everywhere (lengths, options).
    #[error("ranks disagree on {what}: {detail}")]
    Mismatch {
        /// What differs (for example "buffer length").
        what: &'static str,
        /// The values seen, by rank.
        detail: String,
    },
    /// An argument or option outside its domain (the message says which and why).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A topology that does not fit the communicator.
    #[error("topology: {0}")]
    Topology(String),
    /// A shared-memory operation the operating system refused (a single-copy read of a
    /// peer's buffer, for one).
    #[error("shared memory: {0}")]
    SharedMemory(String),
    /// An error from the MPI library or its wrapper.
    #[error("mpi: {0}")]
    Mpi(String),
    /// An error from NCCL or the CUDA driver under it (feature `nccl`), or a missing GPU.
    #[error("nccl: {0}")]
    Nccl(String),
    /// An error from the sparsification layer.
    #[error(transparent)]
    Sparsify(#[from] sparsify::Error),
    /// An error from the cost model.
    #[error("cost model: {0}")]
    CostModel(String),
}

impl From<cost_model::Error> for Error {
    fn from(e: cost_model::Error) -> Self {
        match e {
            // A plan rejecting a caller's argument is the caller's invalid argument.
            cost_model::Error::InvalidArgument(m) => Error::InvalidArgument(m),
            e => Error::CostModel(e.to_string()),
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
