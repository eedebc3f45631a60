//! A communicator wrapper that counts the payload bytes this rank sends, so training can
//! report bytes per rank on any transport (sub-communicators from `split` share the count).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use collectives::{Communicator, Result, Tag};

/// Counts bytes sent through it; see the module docs.
pub struct CountingComm<C: Communicator> {
    inner: C,
    sent: Arc<AtomicU64>,
}

impl<C: Communicator> CountingComm<C> {
    /// Wraps `inner`; returns the wrapper and a handle to its byte count.
    pub fn new(inner: C) -> (Self, Arc<AtomicU64>) {
        let sent = Arc::new(AtomicU64::new(0));
        (
            CountingComm {
                inner,
                sent: sent.clone(),
            },
            sent,
        )
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// Unwraps.
    pub fn into_inner(self) -> C {
        self.inner
    }

    fn count(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl<C: Communicator> Communicator for CountingComm<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn send(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.count(data.len());
        self.inner.send(dest, tag, data)
    }
    fn recv(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        self.inner.recv(src, tag)
    }
    fn recv_into(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        self.inner.recv_into(src, tag, buf)
    }
    fn sendrecv(&self, dest: usize, st: Tag, data: &[u8], src: usize, rt: Tag) -> Result<Vec<u8>> {
        self.count(data.len());
        self.inner.sendrecv(dest, st, data, src, rt)
    }
    fn sendrecv_into(
        &self,
        dest: usize,
        st: Tag,
        data: &[u8],
        src: usize,
        rt: Tag,
        buf: &mut [u8],
    ) -> Result<usize> {
        self.count(data.len());
        self.inner.sendrecv_into(dest, st, data, src, rt, buf)
    }
    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Communicator>> {
        let sub = self.inner.split(color, key)?;
        Ok(Box::new(CountingComm {
            inner: sub,
            sent: self.sent.clone(),
        }))
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn backend(&self) -> String {
        format!("counting({})", self.inner.backend())
    }
}
