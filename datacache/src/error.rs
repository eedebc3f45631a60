//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the cache, the sources and the loader.
///
/// Errors about one sample name it (index and the source's name for it) so that a user can
/// find the bad file; the loader can skip such samples when asked
/// ([`crate::LoaderConfig::skip_errors`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A sample index past the end of the data set.
    #[error("sample index {index} is out of range for a data set of {len} samples")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// Number of samples in the data set.
        len: usize,
    },
    /// The source could not deliver a sample (missing file, read error).
    #[error("cannot read sample {index} ({name}): {source}")]
    Read {
        /// Index of the sample.
        index: usize,
        /// The source's name for it (a path, or file and record).
        name: String,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The decode function rejected a sample's bytes.
    #[error("cannot decode sample {index} ({name}): {reason}")]
    Decode {
        /// Index of the sample.
        index: usize,
        /// The source's name for it.
        name: String,
        /// What the decoder said.
        reason: String,
    },
    /// A remote object store could not deliver a sample, after retrying what was worth
    /// retrying.
    #[error("cannot read sample {index} ({name}) after {attempts} attempt(s): {source}")]
    Remote {
        /// Index of the sample.
        index: usize,
        /// The source's name for it (store and object key).
        name: String,
        /// Requests made (0 when none could be sent).
        attempts: u32,
        /// Why the last attempt failed.
        #[source]
        source: crate::remote::RemoteError,
    },
    /// A remote data set could not be listed or opened.
    #[error("cannot open remote data set {url}: {source}")]
    Store {
        /// The store and prefix.
        url: String,
        /// Why.
        #[source]
        source: crate::remote::RemoteError,
    },
    /// A URL or object key this build cannot open (malformed, an unknown scheme, or a
    /// scheme whose cargo feature is off).
    #[error("cannot open {url}: {reason}")]
    Url {
        /// The URL or key.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A data-set file is not in the format it claims (bad magic, wrong length).
    #[error("bad data-set file {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An I/O error on a path that is not one sample (opening a directory, a cache root).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value that cannot work (zero batch size, rank ≥ world size).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A saved loader state that does not fit this loader (position past the shard end).
    #[error("invalid loader state: {0}")]
    State(String),
    /// A background prefetch worker died (panicked) before delivering its batch.
    #[error("prefetch worker failed: {0}")]
    Worker(String),
}

impl Error {
    /// The sample index this error is about, if it is about one sample.
    pub fn sample_index(&self) -> Option<usize> {
        match self {
            Error::IndexOutOfRange { index, .. }
            | Error::Read { index, .. }
            | Error::Remote { index, .. }
            | Error::Decode { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// Short alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
