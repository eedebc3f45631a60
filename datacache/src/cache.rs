//! The two cache levels of Fig. 5 (MSTopK/HiTopKComm, Shi et al., MLSys 2021, §4.1) in front of a source: decoded samples in
//! a byte-bounded in-memory key-value store keyed by sample index (moka), raw bytes on local
//! disk ([`DiskCache`]), and the slow source behind both.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::decode::{Decoder, Tensor};
use crate::disk::{namespace_for, DiskCache, Durability, Lookup};
use crate::error::{Error, Result};
use crate::source::Source;
use crate::stats::{add, add_time, Stats, StatsSnapshot};

/// One decoded sample, as kept in memory and handed out in batches.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its index in the data set.
    pub index: usize,
    /// Its class label, when the source has labels.
    pub label: Option<u32>,
    /// The decoded, pre-processed tensor.
    pub tensor: Tensor,
}

impl Sample {
    fn weight(&self) -> u32 {
        u32::try_from(self.tensor.nbytes() + std::mem::size_of::<Self>()).unwrap_or(u32::MAX)
    }
}

/// Builds a [`DataCache`]; both levels are off until configured.
pub struct DataCacheBuilder {
    source: Arc<dyn Source>,
    decoder: Arc<dyn Decoder>,
    disk: Option<(PathBuf, u64)>,
    namespace: Option<String>,
    durability: Durability,
    memory_bytes: u64,
}

impl DataCacheBuilder {
    /// Keep raw samples in `dir` (created if needed; may be shared by processes and runs),
    /// at most `max_bytes` there.
    pub fn disk(mut self, dir: impl AsRef<Path>, max_bytes: u64) -> Self {
        self.disk = Some((dir.as_ref().to_path_buf(), max_bytes));
        self
    }

    /// Overrides the disk namespace (default: derived from [`Source::fingerprint`]).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Whether disk entries are flushed before they are renamed into place (default
    /// [`Durability::Fsync`]; see [`crate::disk`]).
    pub fn disk_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Keep decoded samples in memory, at most about `max_bytes` (0 turns the level off).
    pub fn memory(mut self, max_bytes: u64) -> Self {
        self.memory_bytes = max_bytes;
        self
    }

    /// Opens the disk level and builds the cache.
    pub fn build(self) -> Result<DataCache> {
        let stats = Arc::new(Stats::default());
        let disk = match self.disk {
            None => None,
            Some((dir, max)) => {
                let ns = self
                    .namespace
                    .unwrap_or_else(|| namespace_for(&self.source.fingerprint()));
                Some(DiskCache::open_with(
                    dir,
                    &ns,
                    max,
                    self.durability,
                    stats.clone(),
                )?)
            }
        };
        let memory = (self.memory_bytes > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(self.memory_bytes)
                .weigher(|_k: &usize, v: &Arc<Sample>| v.weight())
                .build()
        });
        Ok(DataCache {
            source: self.source,
            decoder: self.decoder,
            disk,
            memory,
            stats,
        })
    }
}

/// Memory → disk → source lookup of decoded samples. Cheap to share (`Arc<DataCache>`)
/// between the prefetch workers; every method takes `&self`.
pub struct DataCache {
    source: Arc<dyn Source>,
    decoder: Arc<dyn Decoder>,
    disk: Option<DiskCache>,
    memory: Option<moka::sync::Cache<usize, Arc<Sample>>>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for DataCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataCache")
            .field("len", &self.len())
            .field("disk", &self.disk)
            .field("memory", &self.memory.is_some())
            .finish_non_exhaustive()
    }
}

impl DataCache {
    /// Starts a builder over `source`, decoding with `decoder`.
    pub fn builder(
        source: impl Source + 'static,
        decoder: impl Decoder + 'static,
    ) -> DataCacheBuilder {
        Self::builder_arc(Arc::new(source), Arc::new(decoder))
    }

    /// Like [`DataCache::builder`] with already shared source and decoder.
    pub fn builder_arc(source: Arc<dyn Source>, decoder: Arc<dyn Decoder>) -> DataCacheBuilder {
        DataCacheBuilder {
            source,
            decoder,
            disk: None,
            namespace: None,
            durability: Durability::default(),
            memory_bytes: 0,
        }
    }

    /// Number of samples in the data set.
    pub fn len(&self) -> usize {
        self.source.len()
    }

    /// True when the data set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The source behind the cache.
    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    /// The disk level, if configured.
    pub fn disk(&self) -> Option<&DiskCache> {
        self.disk.as_ref()
    }

    /// The counters so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub(crate) fn stats_ref(&self) -> &Stats {
        &self.stats
    }

    /// Drops every decoded sample from memory (as a new process would start).
    pub fn clear_memory(&self) {
        if let Some(m) = &self.memory {
            m.invalidate_all();
            m.run_pending_tasks();
        }
    }

    /// Decoded samples in memory now and their weight in bytes.
    pub fn memory_usage(&self) -> (u64, u64) {
        match &self.memory {
            Some(m) => {
                m.run_pending_tasks();
                (m.entry_count(), m.weighted_size())
            }
            None => (0, 0),
        }
    }

    fn check(&self, index: usize) -> Result<()> {
        let len = self.len();
        if index >= len {
            return Err(Error::IndexOutOfRange { index, len });
        }
        Ok(())
    }

    /// The raw bytes of sample `index`: from disk when there is an intact entry, otherwise
    /// from the source (then written to disk).
    pub fn get_raw(&self, index: usize) -> Result<Vec<u8>> {
        self.check(index)?;
        if let Some(disk) = &self.disk {
            match disk.get(index) {
                Lookup::Hit(b) => {
                    add(&self.stats.disk_hits, 1);
                    return Ok(b);
                }
                Lookup::Corrupt => {
                    add(&self.stats.disk_corrupt, 1);
                    add(&self.stats.disk_misses, 1);
                }
                Lookup::Miss => add(&self.stats.disk_misses, 1),
            }
        } else {
            add(&self.stats.disk_misses, 1);
        }
        let t = Instant::now();
        let read = self.source.read(index);
        add_time(&self.stats.source_ns, t.elapsed());
        add(&self.stats.source_reads, 1);
        let raw = read.inspect_err(|_| add(&self.stats.source_errors, 1))?;
        add(&self.stats.source_bytes, raw.len() as u64);
        if let Some(disk) = &self.disk {
            disk.put(index, &raw);
        }
        Ok(raw)
    }

    /// The decoded sample `index`, from memory when present, otherwise raw bytes through
    /// [`DataCache::get_raw`], decoded and kept in memory.
    pub fn get(&self, index: usize) -> Result<Arc<Sample>> {
        self.check(index)?;
        if let Some(m) = &self.memory {
            if let Some(s) = m.get(&index) {
                add(&self.stats.memory_hits, 1);
                return Ok(s);
            }
        }
        add(&self.stats.memory_misses, 1);
        let raw = self.get_raw(index)?;
        let t = Instant::now();
        let decoded = self.decoder.decode(&raw);
        add_time(&self.stats.decode_ns, t.elapsed());
        add(&self.stats.decodes, 1);
        let tensor = decoded.map_err(|reason| {
            add(&self.stats.decode_errors, 1);
            Error::Decode {
                index,
                name: self.source.name(index),
                reason,
            }
        })?;
        let sample = Arc::new(Sample {
            index,
            label: self.source.label(index, &raw),
            tensor,
        });
        if let Some(m) = &self.memory {
            m.insert(index, sample.clone());
        }
        Ok(sample)
    }
}
