//! # datacache
//!
//! A multi-level training-data cache (DataCache of MSTopK/HiTopKComm, Shi et al., MLSys 2021,
//! §4.1, Fig. 5): samples come from a slow remote store on the first epoch, are kept raw on
//! local disk and decoded in memory, split across ranks, and read ahead of compute by
//! background workers.
//!
//! - [`source`]: local data sets ([`FolderSource`], [`Cifar10Source`], [`MnistSource`]).
//! - [`remote`]: data sets in an object store (S3, GCS, Azure, HTTP, local files, memory)
//!   through `object_store`, with deadlines and retries ([`ObjectStoreSource`]).
//! - [`disk`]: raw bytes on local disk, checksummed, crash-safe (temporary file, `fsync`,
//!   rename), LRU-bounded, shared safely by several processes and kept across runs.
//! - [`entry`]: the on-disk entry format and its allocation-free decoder (the fuzz target).
//! - [`cache`]: [`DataCache`], memory (decoded, byte-bounded, keyed by sample index) → disk
//!   → source.
//! - [`shard`] and [`order`]: which samples a rank owns and the per-epoch order, a pure
//!   function of `(seed, epoch)`.
//! - [`loader`]: batches with prefetch workers, resumable from a [`LoaderState`], with a
//!   progress hook.
//! - [`stats`]: hits, misses, bytes and times per level.
//! - [`tokens`]: token-id files for language models, read as windows, and the
//!   Penn Treebank batching of contiguous streams.
//! - `bench_support` (cargo feature `bench` only, not part of the API): the measurement
//!   behind `cargo xtask bench` (suite `datacache`).
//!
//! ```
//! use std::sync::Arc;
//! use datacache::{DataCache, Loader, LoaderConfig, ShardMode, ShardPlan, U8Decoder, VecSource};
//!
//! # fn main() -> datacache::Result<()> {
//! let dir = std::env::temp_dir().join(format!("datacache-doc-{}", std::process::id()));
//! let samples = (0..10u8).map(|i| (vec![i; 4], Some(u32::from(i % 2)))).collect();
//! let cache = Arc::new(
//!     DataCache::builder(VecSource::new("doc", samples), U8Decoder::new(vec![2, 2]))
//!         .disk(&dir, 1 << 20)   // raw bytes on local disk
//!         .memory(1 << 20)       // decoded tensors in memory
//!         .build()?,
//! );
//! // Rank 1 of 2 reads its half, shuffled by (seed, epoch), 3 samples per batch.
//! let plan = ShardPlan::new(cache.len(), 2, 1, ShardMode::Contiguous)?;
//! let cfg = LoaderConfig { batch_size: 3, seed: 7, ..LoaderConfig::default() };
//! let loader = Loader::new(cache.clone(), plan, cfg)?;
//! let mut seen = Vec::new();
//! for batch in loader.epoch(0) {
//!     seen.extend(batch?.indices());
//! }
//! seen.sort();
//! assert_eq!(seen, vec![5, 6, 7, 8, 9]);
//! assert_eq!(cache.stats().source_reads, 5);
//! for batch in loader.epoch(1) {
//!     batch?;
//! }
//! assert_eq!(cache.stats().memory_hits, 5); // epoch 2 never touches disk or source
//! # let _ = std::fs::remove_dir_all(&dir);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

#[cfg(feature = "bench")]
pub mod bench_support;
pub mod cache;
pub mod decode;
pub mod disk;
pub mod entry;
pub mod error;
pub mod formats;
pub mod loader;
pub mod order;
pub mod remote;
pub mod shard;
pub mod source;
pub mod stats;
pub mod tokens;

pub use cache::{DataCache, DataCacheBuilder, Sample};
pub use decode::{Channels, Cifar10Decoder, Decoder, ImageDecoder, Tensor, U8Decoder};
pub use disk::{DiskCache, Durability, Lookup};
pub use error::{Error, Result};
pub use loader::{Batch, EpochIter, Loader, LoaderConfig, LoaderState, Progress, ProgressHook};
pub use remote::{ObjectStoreSource, RemoteConfig, RemoteError};
pub use shard::{ShardMode, ShardPlan};
pub use source::{Cifar10Source, FolderSource, MnistSource, Source, VecSource};
pub use stats::{Stats, StatsSnapshot};
pub use tokens::{stream_batches, TokenDecoder, TokenSource};
