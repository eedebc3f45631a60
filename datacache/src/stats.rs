//! Counters for every level of the cache: hits and misses, bytes read from the source, time
//! spent reading, decoding and waiting. Shared by all workers, so lock-free atomics.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Live counters; read them with [`Stats::snapshot`].
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) memory_hits: AtomicU64,
    pub(crate) memory_misses: AtomicU64,
    pub(crate) disk_hits: AtomicU64,
    pub(crate) disk_misses: AtomicU64,
    pub(crate) disk_corrupt: AtomicU64,
    pub(crate) disk_writes: AtomicU64,
    pub(crate) disk_bytes_written: AtomicU64,
    pub(crate) disk_write_failures: AtomicU64,
    pub(crate) disk_evictions: AtomicU64,
    pub(crate) source_reads: AtomicU64,
    pub(crate) source_bytes: AtomicU64,
    pub(crate) source_errors: AtomicU64,
    pub(crate) decodes: AtomicU64,
    pub(crate) decode_errors: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) source_ns: AtomicU64,
    pub(crate) decode_ns: AtomicU64,
    pub(crate) wait_ns: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Relaxed);
}

pub(crate) fn add_time(c: &AtomicU64, d: Duration) {
    c.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
}

impl Stats {
    /// A consistent-enough copy of all counters (each read atomically, not all at once).
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |c: &AtomicU64| c.load(Relaxed);
        let s = |c: &AtomicU64| c.load(Relaxed) as f64 * 1e-9;
        StatsSnapshot {
            memory_hits: g(&self.memory_hits),
            memory_misses: g(&self.memory_misses),
            disk_hits: g(&self.disk_hits),
            disk_misses: g(&self.disk_misses),
            disk_corrupt: g(&self.disk_corrupt),
            disk_writes: g(&self.disk_writes),
            disk_bytes_written: g(&self.disk_bytes_written),
            disk_write_failures: g(&self.disk_write_failures),
            disk_evictions: g(&self.disk_evictions),
            source_reads: g(&self.source_reads),
            source_bytes: g(&self.source_bytes),
            source_errors: g(&self.source_errors),
            decodes: g(&self.decodes),
            decode_errors: g(&self.decode_errors),
            skipped: g(&self.skipped),
            source_time_s: s(&self.source_ns),
            decode_time_s: s(&self.decode_ns),
            wait_time_s: s(&self.wait_ns),
        }
    }
}

/// A copy of the counters at one moment; subtract two with [`StatsSnapshot::since`] to get
/// the figures of one epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// Samples found decoded in memory.
    pub memory_hits: u64,
    /// Samples not in memory (or memory level off).
    pub memory_misses: u64,
    /// Raw samples found intact in the disk cache.
    pub disk_hits: u64,
    /// Raw samples not on disk (absent, corrupt, or disk level off).
    pub disk_misses: u64,
    /// Disk entries whose checksum, length or header failed; they were fetched again.
    pub disk_corrupt: u64,
    /// Entries written to the disk cache.
    pub disk_writes: u64,
    /// Bytes written to the disk cache (headers included).
    pub disk_bytes_written: u64,
    /// Disk writes that failed (full disk…); the disk level turns itself off at the first.
    pub disk_write_failures: u64,
    /// Entries the disk level evicted to stay under its size limit.
    pub disk_evictions: u64,
    /// Requests to the source (the slow level).
    pub source_reads: u64,
    /// Bytes read from the source.
    pub source_bytes: u64,
    /// Source requests that failed.
    pub source_errors: u64,
    /// Samples decoded.
    pub decodes: u64,
    /// Samples the decoder rejected.
    pub decode_errors: u64,
    /// Samples the loader skipped because of an error (with `skip_errors`).
    pub skipped: u64,
    /// Seconds spent in source reads, summed over threads.
    pub source_time_s: f64,
    /// Seconds spent decoding, summed over threads.
    pub decode_time_s: f64,
    /// Seconds the consumer of the loader waited for a batch (reading not hidden by compute).
    pub wait_time_s: f64,
}

impl StatsSnapshot {
    /// The counts accumulated since `earlier` (saturating at zero).
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            memory_hits: self.memory_hits.saturating_sub(earlier.memory_hits),
            memory_misses: self.memory_misses.saturating_sub(earlier.memory_misses),
            disk_hits: self.disk_hits.saturating_sub(earlier.disk_hits),
            disk_misses: self.disk_misses.saturating_sub(earlier.disk_misses),
            disk_corrupt: self.disk_corrupt.saturating_sub(earlier.disk_corrupt),
            disk_writes: self.disk_writes.saturating_sub(earlier.disk_writes),
            disk_bytes_written: self
                .disk_bytes_written
                .saturating_sub(earlier.disk_bytes_written),
            disk_write_failures: self
                .disk_write_failures
                .saturating_sub(earlier.disk_write_failures),
            disk_evictions: self.disk_evictions.saturating_sub(earlier.disk_evictions),
            source_reads: self.source_reads.saturating_sub(earlier.source_reads),
            source_bytes: self.source_bytes.saturating_sub(earlier.source_bytes),
            source_errors: self.source_errors.saturating_sub(earlier.source_errors),
            decodes: self.decodes.saturating_sub(earlier.decodes),
            decode_errors: self.decode_errors.saturating_sub(earlier.decode_errors),
            skipped: self.skipped.saturating_sub(earlier.skipped),
            source_time_s: (self.source_time_s - earlier.source_time_s).max(0.0),
            decode_time_s: (self.decode_time_s - earlier.decode_time_s).max(0.0),
            wait_time_s: (self.wait_time_s - earlier.wait_time_s).max(0.0),
        }
    }
}
