//! A source slowed down like a networked file system, for benches only: every request waits a
//! fixed latency and all requests share one link of fixed bandwidth. It measures the cache
//! against an assumed NFS, not a real one; the real comparisons use [`super::http`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::source::Source;

/// Wraps a source to behave like a networked file system: every request waits `latency`,
/// and all requests share one link of `bandwidth` bytes per second, so concurrent readers
/// overlap their latencies but not their transfers.
///
/// It makes the first epoch as slow as an assumed NFS mount on any machine.
#[derive(Debug)]
pub struct ThrottledSource<S> {
    inner: S,
    bytes_per_s: f64,
    latency: Duration,
    link_free_at: Mutex<Instant>,
}

impl<S: Source> ThrottledSource<S> {
    /// `bandwidth_bytes_per_s` ≤ 0 or non-finite means unlimited bandwidth.
    pub fn new(inner: S, bandwidth_bytes_per_s: f64, latency: Duration) -> Self {
        Self {
            inner,
            bytes_per_s: bandwidth_bytes_per_s,
            latency,
            link_free_at: Mutex::new(Instant::now()),
        }
    }

    /// The wrapped source.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: Source> Source for ThrottledSource<S> {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn read(&self, index: usize) -> Result<Vec<u8>> {
        let asked = Instant::now();
        let data = self.inner.read(index)?;
        let transfer = if self.bytes_per_s.is_finite() && self.bytes_per_s > 0.0 {
            Duration::from_secs_f64(data.len() as f64 / self.bytes_per_s)
        } else {
            Duration::ZERO
        };
        // The request reaches the server after `latency`; the transfer then queues on the
        // shared link behind the transfers already booked.
        let done = {
            let mut free = self
                .link_free_at
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let start = (*free).max(asked + self.latency);
            *free = start + transfer;
            *free
        };
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
        }
        Ok(data)
    }

    fn name(&self, index: usize) -> String {
        self.inner.name(index)
    }

    fn label(&self, index: usize, raw: &[u8]) -> Option<u32> {
        self.inner.label(index, raw)
    }

    fn fingerprint(&self) -> String {
        self.inner.fingerprint()
    }
}
