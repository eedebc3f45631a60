//! [`ThreadComm`]: `P` ranks as threads of one process, the embedded default transport.
//!
//! Every rank has a mailbox of per-(context, source, tag) FIFO queues behind a mutex and a
//! condition variable. A send copies the bytes into the destination's queue and returns; a
//! receive waits on its own mailbox, up to a timeout, and stops early when another rank has
//! failed, so no test can hang. Sub-communicators from [`Communicator::split`] get a fresh
//! context id from a registry shared by the whole world, so their traffic never mixes.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::shm::{HeapRegions, SharedSegment};
use super::{
    check_rank, check_transport_tag, copy_into, exchange_color_keys, split_members, Communicator,
    Tag, TAG_BARRIER, TAG_SPLIT,
};
use crate::{Error, Result};

/// Options of a thread world.
#[derive(Debug, Clone, Copy)]
pub struct ThreadConfig {
    /// How long a receive waits before it returns [`Error::Timeout`].
    pub timeout: Duration,
    /// Threads standing for one node: world rank `r` reports node `r / n`
    /// ([`Communicator::node`]), so hierarchical algorithms can be run as if on
    /// `P / n` machines. `None`: every thread reports the same node (one process is one
    /// machine).
    pub ranks_per_node: Option<usize>,
}

impl Default for ThreadConfig {
    /// A 60-second receive timeout, or `COLLECTIVES_TIMEOUT_S` seconds when that is set.
    fn default() -> Self {
        let secs = std::env::var("COLLECTIVES_TIMEOUT_S")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(60.0);
        ThreadConfig {
            timeout: Duration::from_secs_f64(secs),
            ranks_per_node: None,
        }
    }
}

impl ThreadConfig {
    /// A configuration with the given receive timeout.
    pub fn with_timeout(timeout: Duration) -> Self {
        ThreadConfig {
            timeout,
            ranks_per_node: None,
        }
    }

    /// The same configuration with `n` threads per emulated node (see
    /// [`ThreadConfig::ranks_per_node`]).
    pub fn with_ranks_per_node(self, n: usize) -> Self {
        ThreadConfig {
            ranks_per_node: Some(n),
            ..self
        }
    }
}

type QueueKey = (u64, usize, Tag);

#[derive(Default)]
struct Mailbox {
    queues: Mutex<HashMap<QueueKey, VecDeque<Vec<u8>>>>,
    arrived: Condvar,
    /// Messages pushed so far: a receiver spins on it (without the lock) before it sleeps.
    pushes: AtomicU64,
    /// Receivers asleep on `arrived` (changed under the lock): a push wakes them only
    /// when there are any, since a wake-up is a system call even with no one to wake.
    sleepers: AtomicUsize,
    /// Message buffers this rank sends from, handed back by the receivers that copied
    /// them out. A buffer allocated on one thread and freed on another makes the two
    /// threads contend for the allocator's arena: small collectives became bimodal (3 or
    /// 15 µs for the same call).
    spare: Mutex<Vec<Vec<u8>>>,
}

/// Most buffers a rank keeps for sending.
const SPARE_KEEP: usize = 16;

/// Most bytes of buffers a rank keeps for sending; a buffer that would exceed it goes
/// back to the allocator.
const SPARE_MAX_BYTES: usize = 64 << 20;

/// How long a receive polls for its message before it sleeps on the condition variable,
/// when the ranks do not outnumber the cores. Waking a sleeping thread costs tens of µs
/// on a VM, more than a small collective's whole step, and made small-message round trips
/// bimodal (2 or 30 µs); the poll yields the core between checks.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

const NO_FAILURE: usize = usize::MAX;

struct World {
    mailboxes: Vec<Mailbox>,
    /// World rank of the first rank that failed, or `NO_FAILURE`.
    failed: AtomicUsize,
    /// (parent context, split sequence number, colour) → context id.
    contexts: Mutex<HashMap<(u64, u64, u32), u64>>,
    timeout: Duration,
    ranks_per_node: Option<usize>,
    /// How long a receive polls before it sleeps: [`SPIN_BEFORE_SLEEP`] when every rank
    /// can have a core, none when the ranks outnumber the cores (a polling receiver would
    /// take the core its sender needs).
    spin: Duration,
}

impl World {
    fn lock(&self, world_rank: usize) -> MutexGuard<'_, HashMap<QueueKey, VecDeque<Vec<u8>>>> {
        // A poisoned lock only means another rank panicked while holding it; the queues
        // themselves are always in a consistent state, so carry on.
        self.mailboxes[world_rank]
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn mark_failed(&self, world_rank: usize) {
        let _ = self.failed.compare_exchange(
            NO_FAILURE,
            world_rank,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        for (r, mb) in self.mailboxes.iter().enumerate() {
            drop(self.lock(r));
            mb.arrived.notify_all();
        }
    }

    fn context_for(&self, parent: u64, seq: u64, color: u32) -> u64 {
        let mut map = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        let next = map.len() as u64 + 1;
        *map.entry((parent, seq, color)).or_insert(next)
    }
}

/// One rank of an in-process world. Created by [`ThreadComm::world`] or handed to the
/// closure of [`ThreadComm::run`].
pub struct ThreadComm {
    world: Arc<World>,
    context: u64,
    /// This communicator's rank → world rank.
    members: Arc<Vec<usize>>,
    rank: usize,
    splits: std::cell::Cell<u64>,
    /// The world's shared-memory segment (the world communicator only; splits have none).
    shared: Option<SharedSegment>,
}

/// Why [`ThreadComm::run`] failed: the first rank that returned an error or panicked.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E: std::fmt::Debug + std::fmt::Display> {
    /// A rank's closure returned an error.
    #[error("rank {rank} failed: {error}")]
    Failed {
        /// The rank.
        rank: usize,
        /// Its error.
        error: E,
    },
    /// A rank's closure panicked.
    #[error("rank {rank} panicked: {message}")]
    Panicked {
        /// The rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// The world could not be created (for example zero ranks).
    #[error("cannot start: {0}")]
    Setup(Error),
}

impl ThreadComm {
    /// Creates the `size` ranks of a new world. Usually [`ThreadComm::run`] is handier.
    pub fn world(size: usize, config: ThreadConfig) -> Result<Vec<ThreadComm>> {
        if size == 0 {
            return Err(Error::InvalidArgument(
                "a world needs at least one rank".into(),
            ));
        }
        if let Some(n) = config.ranks_per_node {
            if n == 0 || size % n != 0 {
                return Err(Error::InvalidArgument(format!(
                    "{n} threads per node do not divide the world of {size}"
                )));
            }
        }
        let world = Arc::new(World {
            mailboxes: (0..size).map(|_| Mailbox::default()).collect(),
            failed: AtomicUsize::new(NO_FAILURE),
            contexts: Mutex::new(HashMap::new()),
            timeout: config.timeout,
            ranks_per_node: config.ranks_per_node,
            spin: match std::thread::available_parallelism() {
                Ok(cores) if size <= cores.get() => SPIN_BEFORE_SLEEP,
                _ => Duration::ZERO,
            },
        });
        let members = Arc::new((0..size).collect::<Vec<_>>());
        // A world that stands for several nodes has no memory all its ranks share.
        let one_node = config.ranks_per_node.is_none_or(|n| n == size);
        let regions = one_node.then(|| HeapRegions::new(size)).flatten();
        let single_copy = super::peer_memory::wanted();
        Ok((0..size)
            .map(|rank| ThreadComm {
                shared: regions.as_ref().map(|mem| {
                    let w = world.clone();
                    let failed = Box::new(move || {
                        let f = w.failed.load(Ordering::SeqCst);
                        (f != NO_FAILURE).then_some(f)
                    });
                    // SAFETY: every rank of this world gets a view of the same regions,
                    // one per rank, each REGION_BYTES long, zeroed and page-aligned, kept
                    // alive by the Arc each view holds.
                    let mut segment = unsafe {
                        SharedSegment::new(
                            (0..size).map(|r| mem.region(r)).collect(),
                            rank,
                            config.timeout,
                            Some(failed),
                            Box::new(mem.clone()),
                        )
                    };
                    // One process, one environment: every rank decides alike.
                    if single_copy {
                        segment.set_same_process();
                    }
                    segment
                }),
                world: world.clone(),
                context: 0,
                members: members.clone(),
                rank,
                splits: std::cell::Cell::new(0),
            })
            .collect())
    }

    /// Runs `f` on every rank of a new `size`-rank world (default configuration) and returns
    /// the per-rank results in rank order, or the first failure.
    pub fn run<T, E, F>(size: usize, f: F) -> std::result::Result<Vec<T>, RunError<E>>
    where
        T: Send,
        E: Send + std::fmt::Debug + std::fmt::Display,
        F: Fn(ThreadComm) -> std::result::Result<T, E> + Sync,
    {
        Self::run_with(size, ThreadConfig::default(), f)
    }

    /// [`run`](Self::run) with an explicit configuration.
    pub fn run_with<T, E, F>(
        size: usize,
        config: ThreadConfig,
        f: F,
    ) -> std::result::Result<Vec<T>, RunError<E>>
    where
        T: Send,
        E: Send + std::fmt::Debug + std::fmt::Display,
        F: Fn(ThreadComm) -> std::result::Result<T, E> + Sync,
    {
        let (outcomes, first) = Self::run_inner(size, config, f).map_err(RunError::Setup)?;
        let mut values = Vec::with_capacity(outcomes.len());
        let mut first_err = None;
        for (rank, o) in outcomes.into_iter().enumerate() {
            match o {
                Outcome::Ok(v) => values.push(v),
                Outcome::Err(error) => {
                    if first_err.is_none() || first == Some(rank) {
                        first_err = Some(RunError::Failed { rank, error });
                    }
                }
                Outcome::Panic(message) => {
                    if first_err.is_none() || first == Some(rank) {
                        first_err = Some(RunError::Panicked { rank, message });
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(values),
        }
    }

    /// Runs `f` on every rank and returns every rank's own result, errors included, so a
    /// test can check that each rank reports a problem itself. A panic becomes
    /// `Err(Error::PeerFailed)`-style propagation to the others and is re-raised here.
    pub fn run_all<T, E, F>(
        size: usize,
        config: ThreadConfig,
        f: F,
    ) -> Result<Vec<std::result::Result<T, E>>>
    where
        T: Send,
        E: Send,
        F: Fn(ThreadComm) -> std::result::Result<T, E> + Sync,
    {
        let (outcomes, _) = Self::run_inner(size, config, f)?;
        Ok(outcomes
            .into_iter()
            .enumerate()
            .map(|(rank, o)| match o {
                Outcome::Ok(v) => Ok(v),
                Outcome::Err(e) => Err(e),
                Outcome::Panic(m) => panic!("rank {rank} panicked: {m}"),
            })
            .collect())
    }

    fn run_inner<T, E, F>(size: usize, config: ThreadConfig, f: F) -> Result<Outcomes<T, E>>
    where
        T: Send,
        E: Send,
        F: Fn(ThreadComm) -> std::result::Result<T, E> + Sync,
    {
        let comms = Self::world(size, config)?;
        let world = comms[0].world.clone();
        let f = &f;
        let outcomes = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    let world = world.clone();
                    std::thread::Builder::new()
                        .name(format!("rank-{}", comm.rank))
                        .spawn_scoped(s, move || {
                            let rank = comm.rank;
                            let out = catch_unwind(AssertUnwindSafe(|| f(comm)));
                            match out {
                                Ok(Ok(v)) => Outcome::Ok(v),
                                Ok(Err(e)) => {
                                    world.mark_failed(rank);
                                    Outcome::Err(e)
                                }
                                Err(p) => {
                                    world.mark_failed(rank);
                                    Outcome::Panic(panic_message(&p))
                                }
                            }
                        })
                        .expect("spawning a rank thread")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|p| Outcome::Panic(panic_message(&p)))
                })
                .collect::<Vec<_>>()
        });
        let failed = world.failed.load(Ordering::SeqCst);
        Ok((outcomes, (failed != NO_FAILURE).then_some(failed)))
    }

    /// The world rank behind this communicator's rank `r`.
    pub fn world_rank_of(&self, r: usize) -> usize {
        self.members[r]
    }

    /// Marks this rank as failed, so that every rank waiting on a message stops promptly.
    pub fn abort(&self) {
        self.world.mark_failed(self.members[self.rank]);
    }

    /// An empty buffer of at least `len` bytes' capacity for a message this rank sends:
    /// the smallest spare one that holds it (see `Mailbox::spare`), else the largest spare
    /// one, grown. A small message does not carry off a large buffer, which a `recv` would
    /// hand to its caller.
    fn spare_buffer(&self, len: usize) -> Vec<u8> {
        let me = &self.world.mailboxes[self.members[self.rank]];
        let mut spare = me.spare.lock().unwrap_or_else(|e| e.into_inner());
        let fits = (0..spare.len())
            .filter(|&i| spare[i].capacity() >= len)
            .min_by_key(|&i| spare[i].capacity());
        let pick = fits.or_else(|| (0..spare.len()).max_by_key(|&i| spare[i].capacity()));
        let mut buf = pick.map(|i| spare.swap_remove(i)).unwrap_or_default();
        drop(spare);
        buf.clear();
        buf.reserve(len);
        buf
    }

    /// Hands a received message's buffer back to the rank `src` (of this communicator)
    /// that sent it, for its next send.
    fn give_back(&self, src: usize, msg: Vec<u8>) {
        if msg.capacity() == 0 {
            return;
        }
        let Some(&world) = self.members.get(src) else {
            return;
        };
        let mut spare = self.world.mailboxes[world]
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let kept: usize = spare.iter().map(Vec::capacity).sum();
        if spare.len() < SPARE_KEEP && kept + msg.capacity() <= SPARE_MAX_BYTES {
            spare.push(msg);
        }
    }

    fn push(&self, dest: usize, tag: Tag, data: Vec<u8>) -> Result<()> {
        check_rank(dest, self.members.len())?;
        let dest_world = self.members[dest];
        let mut q = self.world.lock(dest_world);
        q.entry((self.context, self.rank, tag))
            .or_default()
            .push_back(data);
        let mailbox = &self.world.mailboxes[dest_world];
        mailbox.pushes.fetch_add(1, Ordering::Release);
        // Read under the lock: a receiver counts itself in before it releases the lock
        // to sleep, so one that is about to sleep is seen here.
        let wake = mailbox.sleepers.load(Ordering::Relaxed) > 0;
        drop(q);
        if wake {
            mailbox.arrived.notify_all();
        }
        Ok(())
    }

    fn pop(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        check_rank(src, self.members.len())?;
        let me_world = self.members[self.rank];
        let mailbox = &self.world.mailboxes[me_world];
        let key = (self.context, src, tag);
        let start = Instant::now();
        let mut q = self.world.lock(me_world);
        loop {
            if let Some(queue) = q.get_mut(&key) {
                if let Some(msg) = queue.pop_front() {
                    if queue.is_empty() {
                        q.remove(&key);
                    }
                    return Ok(msg);
                }
            }
            let failed = self.world.failed.load(Ordering::SeqCst);
            if failed != NO_FAILURE && failed != me_world {
                return Err(Error::PeerFailed {
                    rank: self.rank,
                    failed,
                });
            }
            let waited = start.elapsed();
            if waited >= self.world.timeout {
                return Err(Error::Timeout {
                    rank: self.rank,
                    src,
                    tag,
                    waited,
                });
            }
            if waited < self.world.spin {
                // Poll without the lock until something arrives in this mailbox (for any
                // sender) or the spin time is up, then look again.
                let seen = mailbox.pushes.load(Ordering::Acquire);
                drop(q);
                let mut polls = 0u32;
                while mailbox.pushes.load(Ordering::Acquire) == seen
                    && start.elapsed() < self.world.spin
                {
                    polls += 1;
                    if polls % 16 == 0 {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                q = self.world.lock(me_world);
                continue;
            }
            mailbox.sleepers.fetch_add(1, Ordering::Relaxed);
            let (guard, _) = mailbox
                .arrived
                .wait_timeout(q, self.world.timeout - waited)
                .unwrap_or_else(|e| e.into_inner());
            mailbox.sleepers.fetch_sub(1, Ordering::Relaxed);
            q = guard;
        }
    }
}

/// Every rank's outcome, and the world rank that failed first, if any.
type Outcomes<T, E> = (Vec<Outcome<T, E>>, Option<usize>);

enum Outcome<T, E> {
    Ok(T),
    Err(E),
    Panic(String),
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".into()
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn send(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        check_transport_tag(tag)?;
        let mut buf = self.spare_buffer(data.len());
        buf.extend_from_slice(data);
        self.push(dest, tag, buf)
    }

    fn recv(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        check_transport_tag(tag)?;
        self.pop(src, tag)
    }

    fn recv_into(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        check_transport_tag(tag)?;
        let msg = self.pop(src, tag)?;
        let n = copy_into(self.rank, src, tag, &msg, buf);
        self.give_back(src, msg);
        n
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
        self.send(dest, st, data)?;
        self.recv_into(src, rt, buf)
    }

    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Communicator>> {
        let all = exchange_color_keys(
            self,
            color,
            key,
            |r, b| self.push(r, TAG_SPLIT, b.to_vec()),
            |r| self.pop(r, TAG_SPLIT),
        )?;
        let members = split_members(&all, color);
        let seq = self.splits.get();
        self.splits.set(seq + 1);
        let context = self.world.context_for(self.context, seq, color);
        let rank = members
            .iter()
            .position(|&r| r == self.rank)
            .expect("a rank is a member of its own colour");
        let world_members = members.iter().map(|&r| self.members[r]).collect();
        Ok(Box::new(ThreadComm {
            world: self.world.clone(),
            context,
            members: Arc::new(world_members),
            rank,
            splits: std::cell::Cell::new(0),
            shared: None,
        }))
    }

    fn barrier(&self) -> Result<()> {
        dissemination_barrier(self.rank, self.size(), |to, from| {
            self.push(to, TAG_BARRIER, Vec::new())?;
            self.pop(from, TAG_BARRIER).map(|_| ())
        })
    }

    fn backend(&self) -> String {
        "thread".into()
    }

    fn node(&self) -> Option<u64> {
        let world = self.members[self.rank];
        Some(self.world.ranks_per_node.map_or(0, |n| world / n.max(1)) as u64)
    }

    fn shared_segment(&self) -> Option<&SharedSegment> {
        self.shared.as_ref()
    }
}

/// The dissemination barrier: in round `i` rank `r` signals `r + 2^i` and waits for
/// `r − 2^i` (mod P); after ⌈log2 P⌉ rounds everyone has heard from everyone.
pub(crate) fn dissemination_barrier(
    rank: usize,
    size: usize,
    mut signal_and_wait: impl FnMut(usize, usize) -> Result<()>,
) -> Result<()> {
    let mut gap = 1;
    while gap < size {
        signal_and_wait((rank + gap) % size, (rank + size - gap) % size)?;
        gap *= 2;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::CommExt;

    fn quick() -> ThreadConfig {
        ThreadConfig::with_timeout(Duration::from_secs(10))
    }

    #[test]
    fn every_pair_exchanges_0_1_and_1mib_bytes() {
        for p in [1, 2, 3, 5] {
            let sizes = [0usize, 1, 1 << 20];
            ThreadComm::run_with(p, quick(), |c| -> Result<()> {
                let me = c.rank();
                for (t, &n) in sizes.iter().enumerate() {
                    for peer in 0..c.size() {
                        let msg: Vec<u8> = (0..n).map(|i| (i + me * 7 + peer) as u8).collect();
                        c.send(peer, t as Tag, &msg)?;
                    }
                    for peer in 0..c.size() {
                        let got = c.recv(peer, t as Tag)?;
                        let want: Vec<u8> = (0..n).map(|i| (i + peer * 7 + me) as u8).collect();
                        assert_eq!(got, want, "rank {me} from {peer}, {n} bytes");
                    }
                }
                Ok(())
            })
            .unwrap();
        }
    }

    #[test]
    fn missing_message_times_out_within_the_timeout() {
        let timeout = Duration::from_millis(200);
        let start = Instant::now();
        let res = ThreadComm::run_all(2, ThreadConfig::with_timeout(timeout), |c| {
            if c.rank() == 0 {
                c.recv(1, 7).map(|_| ())
            } else {
                Ok(())
            }
        })
        .unwrap();
        let elapsed = start.elapsed();
        match &res[0] {
            Err(Error::Timeout {
                rank: 0,
                src: 1,
                tag: 7,
                waited,
            }) => {
                assert!(*waited >= timeout)
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(elapsed < timeout * 10, "took {elapsed:?}");
    }

    #[test]
    fn a_failing_rank_stops_the_others_promptly() {
        let start = Instant::now();
        let err = ThreadComm::run_with(
            4,
            ThreadConfig::with_timeout(Duration::from_secs(30)),
            |c| {
                if c.rank() == 2 {
                    return Err(Error::InvalidArgument("rank 2 gives up".into()));
                }
                c.recv(2, 0).map(|_| ())
            },
        )
        .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(matches!(err, RunError::Failed { rank: 2, .. }), "{err}");
    }

    #[test]
    fn a_panicking_rank_is_reported() {
        let err = ThreadComm::run_with(3, quick(), |c| -> Result<()> {
            if c.rank() == 1 {
                panic!("boom");
            }
            c.recv(1, 0).map(|_| ())
        })
        .unwrap_err();
        assert!(matches!(err, RunError::Panicked { rank: 1, .. }), "{err}");
    }

    #[test]
    fn bad_ranks_and_tags_are_typed_errors() {
        ThreadComm::run_with(2, quick(), |c| -> Result<()> {
            assert!(matches!(
                c.send(2, 0, &[]),
                Err(Error::InvalidRank { rank: 2, size: 2 })
            ));
            assert!(matches!(c.recv(5, 0), Err(Error::InvalidRank { .. })));
            assert!(matches!(
                c.send(0, TAG_BARRIER, &[]),
                Err(Error::ReservedTag { .. })
            ));
            let peer = 1 - c.rank();
            c.send(peer, 1, &[1, 2, 3, 4, 5])?;
            let mut small = [0u8; 4];
            assert!(matches!(
                c.recv_into(peer, 1, &mut small),
                Err(Error::MessageTooLarge {
                    len: 5,
                    capacity: 4,
                    ..
                })
            ));
            c.send_slice(peer, 2, &[1u8, 2, 3])?;
            assert!(matches!(
                c.recv_vec::<f32>(peer, 2),
                Err(Error::MisalignedMessage { .. })
            ));
            Ok(())
        })
        .unwrap();
        assert!(matches!(
            ThreadComm::world(0, quick()),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn messages_are_matched_by_tag_and_fifo_per_tag() {
        ThreadComm::run_with(2, quick(), |c| -> Result<()> {
            if c.rank() == 0 {
                c.send_slice(1, 5, &[1.0f32])?;
                c.send_slice(1, 6, &[2.0f32])?;
                c.send_slice(1, 5, &[3.0f32])?;
            } else {
                assert_eq!(c.recv_vec::<f32>(0, 6)?, vec![2.0]);
                assert_eq!(c.recv_vec::<f32>(0, 5)?, vec![1.0]);
                assert_eq!(c.recv_vec::<f32>(0, 5)?, vec![3.0]);
            }
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn split_orders_by_key_and_isolates_traffic() {
        let out = ThreadComm::run_with(6, quick(), |c| -> Result<(usize, usize, Vec<u32>)> {
            let color = (c.rank() % 2) as u32;
            let key = (10 - c.rank()) as u32; // reverse order inside each colour
            let sub = c.split(color, key)?;
            // Everyone sends its world rank to every member of its sub-communicator.
            for peer in 0..sub.size() {
                sub.send_slice(peer, 0, &[c.rank() as u32])?;
            }
            let mut seen = Vec::new();
            for peer in 0..sub.size() {
                seen.extend(sub.recv_vec::<u32>(peer, 0)?);
            }
            sub.barrier()?;
            c.barrier()?;
            Ok((sub.rank(), sub.size(), seen))
        })
        .unwrap();
        assert_eq!(out[0], (2, 3, vec![4, 2, 0]));
        assert_eq!(out[5], (0, 3, vec![5, 3, 1]));
    }

    #[test]
    fn barrier_works_at_odd_sizes() {
        for p in [1, 2, 3, 7] {
            ThreadComm::run_with(p, quick(), |c| -> Result<()> {
                for _ in 0..3 {
                    c.barrier()?;
                }
                Ok(())
            })
            .unwrap();
        }
    }
}
