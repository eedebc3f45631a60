//! [`Tapped`]: the one wrapper for code that watches a communicator's traffic, and
//! [`Meter`], the tap that counts it. The sparse algorithms meter each step with it (so
//! their stats exist on every transport), training meters bytes per rank with it, and the
//! fault-injection tests fail the n-th send with their own tap. Counts follow `SimComm`'s
//! rules: a send, a receive and a send-receive pair are one round each.

use std::ops::Add;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Communicator, Tag};
use crate::Result;

/// What a [`Tapped`] communicator reports to, around each operation.
pub trait Tap: Send {
    /// Before a message leaves (a send, or the send half of a send-receive); an error
    /// stops the operation.
    fn before_send(&self) -> Result<()> {
        Ok(())
    }

    /// After an operation completed: the bytes it sent, if it sent, and received, if it
    /// received.
    fn after(&self, _sent: Option<usize>, _received: Option<usize>) {}

    /// Whether the tapped communicator offers the transport's library collectives and
    /// shared segment, which move data past `send` and `recv`: such a collective is then
    /// reported to [`Tap::after`] once, as the bytes the ring algorithm would move
    /// ([`Communicator::record_collective`]). `false` (the default) hides them, so that
    /// every byte passes the tap message by message (fault injection, round counts).
    fn sees_collectives(&self) -> bool {
        false
    }

    /// The tap of a sub-communicator from `split`; `None` leaves it untapped.
    fn split(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
}

/// A communicator whose traffic a [`Tap`] sees. Everything else is the inner one's.
pub struct Tapped<C, T> {
    inner: C,
    tap: T,
}

impl<C, T> Tapped<C, T> {
    /// Wraps `inner`.
    pub fn new(inner: C, tap: T) -> Self {
        Tapped { inner, tap }
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// The tap.
    pub fn tap(&self) -> &T {
        &self.tap
    }

    /// Unwraps.
    pub fn into_inner(self) -> C {
        self.inner
    }
}

impl<C: Communicator, T: Tap + 'static> Communicator for Tapped<C, T> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn send(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.tap.before_send()?;
        self.inner.send(dest, tag, data)?;
        self.tap.after(Some(data.len()), None);
        Ok(())
    }
    fn recv(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        let m = self.inner.recv(src, tag)?;
        self.tap.after(None, Some(m.len()));
        Ok(m)
    }
    fn recv_into(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        let n = self.inner.recv_into(src, tag, buf)?;
        self.tap.after(None, Some(n));
        Ok(n)
    }
    fn sendrecv(&self, d: usize, st: Tag, data: &[u8], s: usize, rt: Tag) -> Result<Vec<u8>> {
        self.tap.before_send()?;
        let m = self.inner.sendrecv(d, st, data, s, rt)?;
        self.tap.after(Some(data.len()), Some(m.len()));
        Ok(m)
    }
    fn sendrecv_into(
        &self,
        d: usize,
        st: Tag,
        data: &[u8],
        s: usize,
        rt: Tag,
        buf: &mut [u8],
    ) -> Result<usize> {
        self.tap.before_send()?;
        let n = self.inner.sendrecv_into(d, st, data, s, rt, buf)?;
        self.tap.after(Some(data.len()), Some(n));
        Ok(n)
    }
    fn node(&self) -> Option<u64> {
        self.inner.node()
    }
    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Communicator>> {
        let sub = self.inner.split(color, key)?;
        Ok(match self.tap.split() {
            Some(tap) => Box::new(Tapped { inner: sub, tap }),
            None => sub,
        })
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn backend(&self) -> String {
        self.inner.backend()
    }
    fn library(&self) -> Option<&dyn super::LibraryCollectives> {
        self.tap
            .sees_collectives()
            .then(|| self.inner.library())
            .flatten()
    }
    fn shared_segment(&self) -> Option<&super::shm::SharedSegment> {
        self.tap
            .sees_collectives()
            .then(|| self.inner.shared_segment())
            .flatten()
    }
    fn record_collective(&self, sent: usize, received: usize) {
        // A collective that moved nothing (P = 1) is no round.
        if self.tap.sees_collectives() && (sent, received) != (0, 0) {
            self.tap.after(Some(sent), Some(received));
        }
    }
}

/// Traffic counters, as [`Meter::counts`] reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Messages sent.
    pub messages: u64,
    /// Rounds: one per send, receive or send-receive pair.
    pub rounds: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Payload bytes received.
    pub bytes_recv: u64,
    /// Items the caller reported received with [`Meter::add_items`] (the sparse
    /// algorithms count sparse entries there).
    pub items_recv: u64,
}

impl Add for Counts {
    type Output = Counts;
    fn add(self, o: Counts) -> Counts {
        Counts {
            messages: self.messages + o.messages,
            rounds: self.rounds + o.rounds,
            bytes_sent: self.bytes_sent + o.bytes_sent,
            bytes_recv: self.bytes_recv + o.bytes_recv,
            items_recv: self.items_recv + o.items_recv,
        }
    }
}

/// The counting tap, shared with the sub-communicators of `split`.
#[derive(Debug, Default)]
pub struct Meter {
    /// Whether library and shared-memory collectives pass, counted whole
    /// ([`Tap::sees_collectives`]).
    collectives: bool,
    messages: AtomicU64,
    rounds: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_recv: AtomicU64,
    items_recv: AtomicU64,
}

impl Meter {
    /// The counts so far.
    pub fn counts(&self) -> Counts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            messages: get(&self.messages),
            rounds: get(&self.rounds),
            bytes_sent: get(&self.bytes_sent),
            bytes_recv: get(&self.bytes_recv),
            items_recv: get(&self.items_recv),
        }
    }

    /// Adds `n` received items (what an item is, the caller says).
    pub fn add_items(&self, n: usize) {
        self.items_recv.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl Tap for Arc<Meter> {
    fn after(&self, sent: Option<usize>, received: Option<usize>) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = sent {
            self.messages.fetch_add(1, Ordering::Relaxed);
            self.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        if let Some(n) = received {
            self.bytes_recv.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    fn sees_collectives(&self) -> bool {
        self.collectives
    }

    fn split(&self) -> Option<Self> {
        Some(self.clone())
    }
}

/// A communicator with a [`Meter`].
pub type Metered<C> = Tapped<C, Arc<Meter>>;

impl<C> Tapped<C, Arc<Meter>> {
    /// Meters `inner` from zero, message by message: the library's collectives and the
    /// shared segment are hidden, so the dense automatic choice ranks only algorithms that
    /// send.
    pub fn metered(inner: C) -> Self {
        Tapped::new(inner, Arc::default())
    }

    /// Meters `inner` from zero, with its library collectives and shared segment
    /// available: each such collective counts as one round and one message of the bytes
    /// the ring algorithm would move (what training reports per rank), so that the
    /// automatic choice can pick them.
    pub fn metered_with_collectives(inner: C) -> Self {
        Tapped::new(
            inner,
            Arc::new(Meter {
                collectives: true,
                ..Meter::default()
            }),
        )
    }

    /// The counts so far (this communicator and those split from it).
    pub fn counts(&self) -> Counts {
        self.tap.counts()
    }

    /// Adds `n` received items to the counts.
    pub fn add_items(&self, n: usize) {
        self.tap.add_items(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadComm;

    #[test]
    fn meter_counts_rounds_and_bytes_like_simcomm() {
        let counts = ThreadComm::run(2, |c| -> Result<Counts> {
            let m = Metered::metered(c);
            let peer = 1 - m.rank();
            m.send(peer, 1, &[0; 5])?;
            m.recv(peer, 1)?;
            m.sendrecv(peer, 2, &[0; 3], peer, 2)?;
            let sub = m.split(0, m.rank() as u32)?;
            sub.send(1 - sub.rank(), 3, &[0; 7])?;
            sub.recv(1 - sub.rank(), 3)?;
            m.add_items(4);
            Ok(m.counts())
        })
        .unwrap();
        let want = Counts {
            messages: 3,
            rounds: 5,
            bytes_sent: 15,
            bytes_recv: 15,
            items_recv: 4,
        };
        assert_eq!(counts, vec![want, want]);
    }

    /// The plain meter hides the shared segment (every byte passes it message by message);
    /// the one with collectives offers it and counts each shared-memory collective once,
    /// as the ring's bytes.
    #[test]
    fn a_meter_with_collectives_offers_the_segment_and_counts_ring_bytes() {
        use crate::dense::{allreduce, AllreduceAlgo, DenseOptions};
        let counts = ThreadComm::run(3, |c| -> Result<(bool, Counts, Counts)> {
            let plain = Metered::metered(c);
            let hidden = plain.shared_segment().is_none() && plain.library().is_none();
            let refused = allreduce(
                &plain,
                &mut [1.0; 9],
                AllreduceAlgo::SharedMemory,
                &DenseOptions::default(),
            );
            assert!(refused.is_err());
            let whole = Metered::metered_with_collectives(plain.into_inner());
            let mut buf = vec![1.0f32; 9];
            let opts = DenseOptions::default().unchecked();
            allreduce(&whole, &mut buf, AllreduceAlgo::SharedMemory, &opts)?;
            assert_eq!(buf, vec![3.0; 9]);
            let shm = whole.counts();
            allreduce(&whole, &mut buf, AllreduceAlgo::Ring, &opts)?;
            Ok((hidden, shm, whole.counts()))
        })
        .unwrap();
        let alone = ThreadComm::run(1, |c| -> Result<Counts> {
            let whole = Metered::metered_with_collectives(c);
            let opts = DenseOptions::default();
            allreduce(&whole, &mut [1.0; 9], AllreduceAlgo::SharedMemory, &opts)?;
            Ok(whole.counts())
        })
        .unwrap();
        assert_eq!(alone, vec![Counts::default()], "P = 1 moves nothing");
        for (hidden, shm, both) in counts {
            assert!(hidden);
            // 9 floats on 3 ranks: 6 of them twice, 4 bytes each.
            assert_eq!((shm.bytes_sent, shm.bytes_recv, shm.rounds), (48, 48, 1));
            // The ring itself sends as many bytes.
            assert_eq!(both.bytes_sent - shm.bytes_sent, 48);
        }
    }
}
