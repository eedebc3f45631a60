//! The local-disk level of Fig. 5 (MSTopK/HiTopKComm, Shi et al., MLSys 2021, §4.1): raw
//! sample bytes copied from the slow source on first read, kept across runs ("multiple runs
//! for hyper-parameter tuning").
//!
//! Layout: `root/<namespace>/<index >> 12 as hex>/<index>.dce`, each file one entry in the
//! format of [`crate::entry`] (magic, version, key hash, length, payload and header CRC-32).
//!
//! Crash safety: an entry is written to a hidden temporary name in the same directory,
//! flushed to stable storage (`fsync`, unless [`Durability::NoSync`]) and only then renamed
//! into place, so the final name never refers to a partial file, whether the writer is killed
//! (SIGKILL) or the machine loses power. Every read checks the whole entry; one that fails
//! (a file damaged on disk, an old format, a copy under another sample's name) is deleted and
//! fetched again, never served. Temporary files of killed writers are removed at the next
//! open once they are older than a few minutes.
//!
//! Sharing: several processes may use one directory. Concurrent writers of one key each
//! rename their own complete file (the last one wins; both are valid), readers open either the
//! old or the new file, and an entry evicted while another process reads it stays readable
//! through the open handle (or is a miss). Hits refresh the file's modification time, which is
//! the least-recently-used clock shared by all processes; when the directory grows past its
//! limit the oldest entries are deleted (each process rescans the directory after writing 5% of
//! the limit, so with several writers the limit holds to within about 5% per process). Any
//! write failure (a full disk) turns the level off with a warning instead of failing the
//! training.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::entry::{self, KeyHash};
use crate::error::{Error, Result};
use crate::stats::{add, Stats};

pub use crate::entry::HEADER_LEN;

const EXT: &str = "dce";
/// After eviction the directory is brought down to this fraction of its limit, so that
/// eviction (a directory scan) runs once per many inserts rather than on every one.
const LOW_WATERMARK: f64 = 0.9;
/// Rescan the directory after this process wrote `max_bytes / RESCAN_FRACTION` bytes.
const RESCAN_FRACTION: u64 = 20;
/// Temporary files older than this are leftovers of a crashed writer and are removed.
const STALE_TMP: Duration = Duration::from_secs(600);
/// A hit refreshes an entry's modification time only when it is older than this: the LRU
/// order needs no finer clock, and most hits then cost no extra system calls.
const LRU_RESOLUTION: Duration = Duration::from_secs(1);

/// Whether an entry is flushed to stable storage before it is renamed into place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `fsync` the entry before the rename and the directory after it: a power loss leaves
    /// either no entry or a whole one. Costs one device flush per entry written.
    #[default]
    Fsync,
    /// No flush. A killed process still never leaves a partial entry under its final name
    /// (the kernel keeps the written pages); after a power loss an entry may be torn, which
    /// its checksum catches on the next read (it is then fetched again).
    NoSync,
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// An intact entry.
    Hit(Vec<u8>),
    /// No entry (or the level is off).
    Miss,
    /// An entry that failed its checks; it has been removed.
    Corrupt,
}

/// A size-limited, checksummed, multi-process-safe directory of raw samples.
#[derive(Debug)]
pub struct DiskCache {
    root: PathBuf,
    dir: PathBuf,
    namespace: String,
    durability: Durability,
    max_bytes: u64,
    approx_bytes: AtomicU64,
    written_since_scan: AtomicU64,
    disabled: AtomicBool,
    evict_lock: Mutex<()>,
    tmp_counter: AtomicU64,
    stats: Arc<Stats>,
}

/// The directory name for a data set: CRC-32 of its fingerprint, so that caches of different
/// data sets can share one root.
pub fn namespace_for(fingerprint: &str) -> String {
    format!("ds-{:08x}", crc32fast::hash(fingerprint.as_bytes()))
}

impl DiskCache {
    /// Opens (creating) the cache for data set `namespace` under `root`, with at most
    /// `max_bytes` in all of `root` (every namespace counts). If the directory cannot be
    /// created the level starts switched off (with a warning), like a full disk.
    pub fn open(root: impl AsRef<Path>, namespace: &str, max_bytes: u64) -> Result<Self> {
        Self::open_with(
            root,
            namespace,
            max_bytes,
            Durability::default(),
            Arc::new(Stats::default()),
        )
    }

    /// [`DiskCache::open`] with a durability mode and the counters to update.
    pub fn open_with(
        root: impl AsRef<Path>,
        namespace: &str,
        max_bytes: u64,
        durability: Durability,
        stats: Arc<Stats>,
    ) -> Result<Self> {
        if namespace.is_empty() || namespace.contains(['/', '\\']) || namespace.starts_with('.') {
            return Err(Error::Config(format!(
                "disk-cache namespace {namespace:?} must be a plain directory name"
            )));
        }
        let root = root.as_ref().to_path_buf();
        let dir = root.join(namespace);
        let cache = Self {
            root,
            dir,
            namespace: namespace.to_string(),
            durability,
            max_bytes,
            approx_bytes: AtomicU64::new(0),
            written_since_scan: AtomicU64::new(0),
            disabled: AtomicBool::new(false),
            evict_lock: Mutex::new(()),
            tmp_counter: AtomicU64::new(0),
            stats,
        };
        if let Err(e) = std::fs::create_dir_all(&cache.dir) {
            cache.disable(&cache.dir, &e);
            return Ok(cache);
        }
        let (total, _) = cache.scan(true);
        cache.approx_bytes.store(total, Relaxed);
        Ok(cache)
    }

    /// The directory of this data set's entries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key stored in (and checked against) the header of sample `index`'s entry.
    pub fn key(&self, index: usize) -> KeyHash {
        KeyHash::of(&self.namespace, index as u64)
    }

    /// The file that holds (or would hold) sample `index`; tests corrupt it on purpose.
    pub fn entry_path(&self, index: usize) -> PathBuf {
        self.dir
            .join(format!("{:04x}", index >> 12))
            .join(format!("{index}.{EXT}"))
    }

    /// False once a write failed; the cache then serves from memory and the source only.
    pub fn is_enabled(&self) -> bool {
        !self.disabled.load(Relaxed)
    }

    /// The size limit in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes of all entries under the root now (a directory scan).
    pub fn total_bytes(&self) -> u64 {
        self.scan(false).0
    }

    fn disable(&self, path: &Path, e: &std::io::Error) {
        add(&self.stats.disk_write_failures, 1);
        if !self.disabled.swap(true, Relaxed) {
            tracing::warn!(
                path = %path.display(),
                error = %e,
                "disk cache write failed (disk full?); continuing with memory and source only"
            );
        }
    }

    /// Looks sample `index` up, checking header, length, key and checksums.
    pub fn get(&self, index: usize) -> Lookup {
        if !self.is_enabled() {
            return Lookup::Miss;
        }
        let path = self.entry_path(index);
        let Some((bytes, mtime)) = self.read_bounded(&path) else {
            return Lookup::Miss;
        };
        match entry::decode_for(&bytes, self.key(index)) {
            Ok(payload) => {
                // Refresh the shared LRU clock, at most once per `LRU_RESOLUTION` per entry
                // (re-opening for write costs more than the read on a hot entry); failure only
                // makes eviction less precise.
                let stale = mtime
                    .and_then(|m| m.elapsed().ok())
                    .is_none_or(|age| age > LRU_RESOLUTION);
                if stale {
                    if let Ok(f) = File::options().write(true).open(&path) {
                        let _ = f.set_modified(SystemTime::now());
                    }
                }
                Lookup::Hit(payload.to_vec())
            }
            Err(why) => self.discard(index, &path, &why.to_string()),
        }
    }

    /// The bytes of `path`, or `None` when it does not exist (or vanished). A file larger than
    /// the cache limit cannot be an entry this cache wrote; it is read no further than the
    /// limit, so a stray huge file costs no unbounded allocation (it then fails its checks).
    /// Also returns the file's modification time.
    fn read_bounded(&self, path: &Path) -> Option<(Vec<u8>, Option<SystemTime>)> {
        let f = File::open(path).ok()?;
        let meta = f.metadata().ok();
        let mtime = meta.as_ref().and_then(|m| m.modified().ok());
        let cap = meta
            .map_or(0, |m| m.len())
            .min(self.max_bytes.saturating_add(1));
        let mut bytes = Vec::with_capacity(usize::try_from(cap).unwrap_or(0));
        f.take(self.max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .ok()?;
        Some((bytes, mtime))
    }

    fn discard(&self, index: usize, path: &Path, why: &str) -> Lookup {
        tracing::debug!(index, path = %path.display(), why, "bad disk-cache entry, refetching");
        // Another process may have replaced it with a good entry meanwhile; removing that
        // costs one refetch, never a wrong answer.
        let _ = std::fs::remove_file(path);
        Lookup::Corrupt
    }

    /// Stores sample `index`. Never fails: an error switches the level off with a warning.
    pub fn put(&self, index: usize, payload: &[u8]) {
        if !self.is_enabled() {
            return;
        }
        let entry_len = (HEADER_LEN + payload.len()) as u64;
        if entry_len > self.max_bytes {
            return; // can never fit; keep it out rather than evict everything
        }
        let path = self.entry_path(index);
        let Some(parent) = path.parent() else { return };
        if let Err(e) = std::fs::create_dir_all(parent) {
            self.disable(parent, &e);
            return;
        }
        let tmp = parent.join(format!(
            ".{index}.{EXT}.tmp.{}.{}",
            std::process::id(),
            self.tmp_counter.fetch_add(1, Relaxed)
        ));
        let result = (|| -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&entry::header(self.key(index), payload))?;
            f.write_all(payload)?;
            if self.durability == Durability::Fsync {
                f.sync_all()?;
            }
            drop(f);
            std::fs::rename(&tmp, &path)?;
            if self.durability == Durability::Fsync {
                // Persist the rename itself; not every platform can open a directory.
                if let Ok(d) = File::open(parent) {
                    let _ = d.sync_all();
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            if e.kind() == std::io::ErrorKind::NotFound && parent.is_dir() {
                // Another process swept our temporary file (or the entry's directory) away
                // mid-write; this entry is skipped, the level stays on.
                return;
            }
            self.disable(&path, &e);
            return;
        }
        add(&self.stats.disk_writes, 1);
        add(&self.stats.disk_bytes_written, entry_len);
        let now = self.approx_bytes.fetch_add(entry_len, Relaxed) + entry_len;
        let mine = self.written_since_scan.fetch_add(entry_len, Relaxed) + entry_len;
        // Other processes write too: rescan after writing a twentieth of the limit, so that
        // the directory overshoots by at most ~5% per process.
        if now > self.max_bytes || mine > self.max_bytes / RESCAN_FRACTION {
            self.evict();
        }
    }

    /// Deletes least-recently-used entries (oldest modification time first, across all
    /// namespaces and processes) until the root is under the low watermark.
    pub fn evict(&self) {
        let _guard = self
            .evict_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.written_since_scan.store(0, Relaxed);
        let (mut total, mut entries) = self.scan(false);
        if total > self.max_bytes {
            let target = (self.max_bytes as f64 * LOW_WATERMARK) as u64;
            entries.sort_by_key(|e| e.1);
            for (path, _, size) in entries {
                if total <= target {
                    break;
                }
                match std::fs::remove_file(&path) {
                    Ok(()) => add(&self.stats.disk_evictions, 1),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(_) => continue,
                }
                total = total.saturating_sub(size);
            }
        }
        self.approx_bytes.store(total, Relaxed);
    }

    /// Walks the root: total entry bytes and (path, mtime, size) of every entry. With
    /// `clean`, also removes stale temporary files left by crashed writers.
    fn scan(&self, clean: bool) -> (u64, Vec<(PathBuf, SystemTime, u64)>) {
        let mut out = Vec::new();
        let mut total = 0u64;
        let mut stack = vec![(self.root.clone(), 0u8)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in rd.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                let path = entry.path();
                if meta.is_dir() {
                    if depth < 2 {
                        stack.push((path, depth + 1));
                    }
                    continue;
                }
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') {
                    if clean && name.contains(".tmp.") {
                        let old = meta
                            .modified()
                            .ok()
                            .and_then(|m| m.elapsed().ok())
                            .is_some_and(|age| age > STALE_TMP);
                        if old {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                    continue;
                }
                if path.extension().is_some_and(|e| e == EXT) {
                    let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    total += meta.len();
                    out.push((path, mtime, meta.len()));
                }
            }
        }
        (total, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_and_detect_corruption() {
        let t = tempfile::tempdir().unwrap();
        let d = DiskCache::open(t.path(), "ns", 1 << 20).unwrap();
        assert_eq!(d.get(5), Lookup::Miss);
        d.put(5, b"hello");
        assert_eq!(d.get(5), Lookup::Hit(b"hello".to_vec()));
        // flip a payload byte
        let p = d.entry_path(5);
        let mut b = std::fs::read(&p).unwrap();
        b[HEADER_LEN] ^= 0xff;
        std::fs::write(&p, &b).unwrap();
        assert_eq!(d.get(5), Lookup::Corrupt);
        assert!(!p.exists());
        // truncate
        d.put(5, b"hello");
        let b = std::fs::read(&p).unwrap();
        std::fs::write(&p, &b[..b.len() - 1]).unwrap();
        assert_eq!(d.get(5), Lookup::Corrupt);
        // an entry copied under another index's name is rejected
        d.put(6, b"six");
        std::fs::copy(d.entry_path(6), d.entry_path(7)).unwrap();
        assert_eq!(d.get(7), Lookup::Corrupt);
    }

    #[test]
    fn evicts_least_recently_used() {
        let t = tempfile::tempdir().unwrap();
        let entry = (HEADER_LEN + 100) as u64;
        let d = DiskCache::open(t.path(), "ns", entry * 10).unwrap();
        let old = SystemTime::now() - Duration::from_secs(1000);
        for i in 0..10 {
            d.put(i, &[i as u8; 100]);
            // distinct, increasing ages independent of the file system's clock granularity
            let f = File::options().write(true).open(d.entry_path(i)).unwrap();
            f.set_modified(old + Duration::from_secs(i as u64)).unwrap();
        }
        assert!(matches!(d.get(0), Lookup::Hit(_))); // 0 becomes the most recent
        d.put(10, &[10u8; 100]);
        assert!(d.total_bytes() <= entry * 10);
        assert!(matches!(d.get(0), Lookup::Hit(_)));
        assert_eq!(d.get(1), Lookup::Miss);
        assert!(matches!(d.get(10), Lookup::Hit(_)));
        assert!(matches!(d.get(9), Lookup::Hit(_)));
        // reopening sees the same entries (reuse across runs)
        let d2 = DiskCache::open(t.path(), "ns", entry * 10).unwrap();
        assert!(matches!(d2.get(10), Lookup::Hit(_)));
    }

    #[test]
    fn write_failure_disables_instead_of_failing() {
        let t = tempfile::tempdir().unwrap();
        let d = DiskCache::open(t.path(), "ns", 1 << 20).unwrap();
        // Make the entry's parent directory impossible to create: a file in its place.
        let parent = d.entry_path(3).parent().unwrap().to_path_buf();
        std::fs::write(&parent, b"x").unwrap();
        d.put(3, b"abc");
        assert!(!d.is_enabled());
        assert_eq!(d.get(3), Lookup::Miss);
    }

    #[test]
    fn stray_old_and_misplaced_files_are_never_served() {
        let t = tempfile::tempdir().unwrap();
        let d = DiskCache::open(t.path(), "ns", 4096).unwrap();
        let p = d.entry_path(1);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // A file far larger than the limit: read no further than the limit, then rejected.
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        assert_eq!(d.get(1), Lookup::Corrupt);
        // An entry of the earlier 24-byte `DCE1` format.
        let mut old = b"DCE1".to_vec();
        old.extend_from_slice(&crc32fast::hash(b"abc").to_le_bytes());
        old.extend_from_slice(&3u64.to_le_bytes());
        old.extend_from_slice(&1u64.to_le_bytes());
        old.extend_from_slice(b"abc");
        std::fs::write(&p, old).unwrap();
        assert_eq!(d.get(1), Lookup::Corrupt);
        // A valid entry of another data set under this one's name.
        let other = DiskCache::open(t.path(), "other", 4096).unwrap();
        other.put(1, b"xyz");
        std::fs::copy(other.entry_path(1), &p).unwrap();
        assert_eq!(d.get(1), Lookup::Corrupt);
        assert_eq!(other.get(1), Lookup::Hit(b"xyz".to_vec()));
    }

    #[test]
    fn no_sync_mode_writes_the_same_entries() {
        let t = tempfile::tempdir().unwrap();
        let stats = Arc::new(Stats::default());
        let d = DiskCache::open_with(t.path(), "ns", 1 << 20, Durability::NoSync, stats).unwrap();
        d.put(2, b"fast");
        let synced = DiskCache::open(t.path(), "ns", 1 << 20).unwrap();
        assert_eq!(synced.get(2), Lookup::Hit(b"fast".to_vec()));
    }

    #[test]
    fn rejects_bad_namespace() {
        let t = tempfile::tempdir().unwrap();
        assert!(DiskCache::open(t.path(), "../x", 10).is_err());
        assert!(DiskCache::open(t.path(), "", 10).is_err());
    }
}
