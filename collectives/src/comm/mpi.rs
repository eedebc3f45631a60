//! [`MpiComm`]: the [`Communicator`] contract over a real MPI world (rsmpi), one rank per
//! process started by `mpirun`. This is how the project runs on a cluster.
//!
//! - `send` is buffered, as the contract requires: the bytes are copied and sent with an
//!   immediate send that completes in the background; completed sends are reaped on every
//!   later call and all are waited for before the communicator is dropped.
//! - `sendrecv` sends straight from the caller's buffer (no copy) while it receives.
//! - Receives probe for the matching message first (`MPI_Improbe`), so messages of any
//!   length (including empty) arrive into a buffer of the right size, a fixed buffer that is
//!   too small is a typed error instead of `MPI_ERR_TRUNCATE`, and a peer that never answers
//!   ends in [`Error::Timeout`] instead of a hang.
//! - The world communicator is duplicated, so our traffic never matches the application's.
//!
//! # Faults
//!
//! A rank that exits, is killed or stalls leaves its peers waiting: each of them ends its
//! receive with [`Error::Timeout`] after the timeout. An error like that is fatal to the job
//! (the ranks have left the collective at different points), and `MPI_Finalize` would wait
//! for the stalled rank forever, so a program must not return normally from it: it prints
//! the error and ends every process with [`MpiComm::abort_on_fatal`] (`MPI_Abort`, non-zero
//! exit). A panic that unwinds through the last communicator aborts the job the same way
//! instead of finalising.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Message, Source};
use mpi::request::{Request, StaticScope};
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use mpi::Threading;

use super::shm::SharedSegment;
use super::watchdog::{LibraryCall, Watchdog};
use super::{check_rank, check_transport_tag, copy_into, Communicator, LibraryCollectives, Tag};
use crate::{Error, Result};

/// Exit code of the job when a send can never complete after a failed receive.
const STUCK_SEND_EXIT: i32 = 70;
/// Exit code of the job when buffered sends are still pending as a communicator drops.
const STUCK_DROP_EXIT: i32 = 71;
/// Exit code of the job when a panic unwinds through the last communicator.
const PANIC_EXIT: i32 = 72;

/// How long a send from the caller's buffer may still take after the receive beside it
/// failed: long enough for a healthy peer's eager or rendezvous transfer, short enough that
/// the failing rank ends soon after its typed error.
const SEND_GRACE: Duration = Duration::from_secs(1);

/// Failed polls of a request before each further poll also yields the core: a message
/// that is due soon is not delayed by a system call, a late one does not starve a rank
/// that shares the core.
const SPINS_BEFORE_YIELD: u64 = 2_000;

/// Sleep between tests of [`Communicator::barrier_idle`]'s `MPI_Ibarrier`: short against
/// the long waits it is for, long enough that a waiting rank uses next to no CPU.
const IDLE_POLL: Duration = Duration::from_micros(200);

/// Keeps MPI initialised while any communicator lives; finalises when the last one drops,
/// or aborts the job when that drop is part of a panic (finalising would wait for peers
/// that may never arrive).
struct UniverseGuard(Option<Universe>);

impl Drop for UniverseGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            abort_world(
                None,
                &"a panic unwound through the MPI communicator",
                PANIC_EXIT,
            );
        }
        drop(self.0.take());
    }
}
// SAFETY: the universe is only dropped (MPI_Finalize) once, by the last owner; it is never
// otherwise touched after initialisation.
unsafe impl Send for UniverseGuard {}
unsafe impl Sync for UniverseGuard {}

/// A buffered send in flight: the request and the heap copy it reads from.
struct PendingSend {
    request: Request<'static, [u8], StaticScope>,
    buffer: *mut [u8],
}

impl PendingSend {
    /// Frees a send's copy once the request reading it has completed.
    fn free(buffer: *mut [u8]) {
        // SAFETY: `buffer` came from `Box::into_raw` in `send`, and the request that read it
        // has completed, so nothing refers to it any more.
        drop(unsafe { Box::from_raw(buffer) });
    }
}

/// One rank of an MPI communicator. See the module docs.
pub struct MpiComm {
    comm: SimpleCommunicator,
    pending: RefCell<Vec<PendingSend>>,
    /// The send copy of a library all-reduce (without a known `MPI_IN_PLACE`) or the block of
    /// a library reduce-scatter, kept between calls so that a large one does not fault
    /// fresh pages in every time.
    library_scratch: RefCell<Vec<f32>>,
    /// Ends the job when a blocking library call (a library collective, the barrier) has
    /// not returned within the timeout; started by the first such call.
    watchdog: std::cell::OnceCell<Watchdog>,
    rank: usize,
    size: usize,
    timeout: Duration,
    threading: Threading,
    /// This process's node ([`Communicator::node`]): the lowest world rank of its
    /// shared-memory group, found once on the world and kept by every split.
    node: u64,
    /// The world's shared-memory segment when every rank runs on one node (the world
    /// communicator only; splits have none).
    shared: Option<SharedSegment>,
    _universe: Arc<UniverseGuard>,
}

// SAFETY: MPI is initialised with `MPI_THREAD_MULTIPLE` where the library provides it, and an
// `MpiComm` is used by one thread at a time (it is `Send`, not `Sync`).
unsafe impl Send for MpiComm {}

impl MpiComm {
    /// Initialises MPI (once per process) and returns the world, duplicated for our own use.
    /// The receive timeout is `COLLECTIVES_TIMEOUT_S` seconds (default 60).
    pub fn world() -> Result<MpiComm> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| {
                Error::Mpi(
                    "MPI is already initialised in this process: call MpiComm::world() once and \
                     use split() for more communicators"
                        .into(),
                )
            })?;
        let comm = universe.world().duplicate();
        let timeout = super::thread::ThreadConfig::default().timeout;
        let node = world_node(&comm)?;
        let shared = shared_segment_of(&comm, timeout);
        let mut world = Self::wrap(
            comm,
            threading,
            timeout,
            node,
            Arc::new(UniverseGuard(Some(universe))),
        );
        world.shared = shared;
        Ok(world)
    }

    fn wrap(
        comm: SimpleCommunicator,
        threading: Threading,
        timeout: Duration,
        node: u64,
        universe: Arc<UniverseGuard>,
    ) -> MpiComm {
        MpiComm {
            node,
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            comm,
            pending: RefCell::new(Vec::new()),
            library_scratch: RefCell::new(Vec::new()),
            watchdog: std::cell::OnceCell::new(),
            timeout,
            threading,
            shared: None,
            _universe: universe,
        }
    }

    /// [`Communicator::split`] as an `MpiComm`, without a shared segment (splits are
    /// cheap: hierarchical algorithms split per call).
    fn split_mpi(&self, color: u32, key: u32) -> Result<MpiComm> {
        let c = i32::try_from(color)
            .map_err(|_| Error::InvalidArgument(format!("split colour {color} exceeds i32")))?;
        let k = i32::try_from(key)
            .map_err(|_| Error::InvalidArgument(format!("split key {key} exceeds i32")))?;
        self.progress();
        let sub = self
            .comm
            .split_by_color_with_key(Color::with_value(c), k)
            .ok_or_else(|| Error::Mpi("MPI_Comm_split returned no communicator".into()))?;
        Ok(Self::wrap(
            sub,
            self.threading,
            self.timeout,
            self.node,
            self._universe.clone(),
        ))
    }

    /// [`Communicator::split`] into an `MpiComm` that gets a shared segment of its own
    /// when all its ranks run on one node, as the world does (the shared-memory
    /// algorithms and the automatic choice's use of them need one; a plain split has
    /// none). For long-lived communicators, such as one per training run: it maps
    /// [`REGION_BYTES`](super::shm::REGION_BYTES) per rank and probes the ranks, a
    /// collective call over the new communicator.
    pub fn split_with_segment(&self, color: u32, key: u32) -> Result<MpiComm> {
        let mut sub = self.split_mpi(color, key)?;
        sub.shared = shared_segment_of(&sub.comm, sub.timeout);
        Ok(sub)
    }

    /// Sets how long a receive (or a shared-memory wait) waits before it returns
    /// [`Error::Timeout`].
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        if let Some(s) = &mut self.shared {
            s.set_timeout(timeout);
        }
        if let Some(w) = self.watchdog.get() {
            w.set_timeout(timeout);
        }
    }

    /// Runs a blocking call into the MPI library under the [`Watchdog`]: past the timeout,
    /// the job ends with [`LIBRARY_STALL_EXIT`](super::watchdog::LIBRARY_STALL_EXIT)
    /// instead of hanging on a peer that stalled or left.
    fn watched<T>(&self, which: LibraryCall, call: impl FnOnce() -> T) -> T {
        let (rank, size) = (self.rank, self.size);
        self.watchdog
            .get_or_init(|| {
                Watchdog::start(
                    self.timeout,
                    Box::new(move |msg: &str| {
                        abort_world(
                            Some((rank, size)),
                            &format_args!("rank {rank} waited: {msg}"),
                            super::watchdog::LIBRARY_STALL_EXIT,
                        )
                    }),
                )
            })
            .guard(which, call)
    }

    /// The underlying rsmpi communicator, for calling the MPI library's own collectives
    /// (for example `MPI_Allreduce` as a baseline in the same run).
    pub fn raw(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// The thread support level the MPI library provided.
    pub fn threading(&self) -> Threading {
        self.threading
    }

    /// Aborts the whole MPI job with `code` (all processes end).
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }

    /// Ends the whole job after a fatal error on this rank: prints `rank R/P: fatal: ERROR`
    /// to stderr and calls `MPI_Abort` with `code` (1 when `code` is 0, so the job's exit
    /// status always shows the failure). Use it instead of returning the error: a rank that
    /// returns finalises MPI, which waits for peers that may have stalled.
    pub fn abort_on_fatal(&self, error: &dyn std::fmt::Display, code: i32) -> ! {
        abort_world(Some((self.rank, self.size)), error, code)
    }

    fn check_len(len: usize) -> Result<()> {
        if len > i32::MAX as usize {
            Err(Error::InvalidArgument(format!(
                "an MPI message of {len} bytes exceeds the {} bytes one message can carry",
                i32::MAX
            )))
        } else {
            Ok(())
        }
    }

    /// Reaps completed buffered sends.
    fn progress(&self) {
        let mut pending = self.pending.borrow_mut();
        if pending.is_empty() {
            return;
        }
        let mut still = Vec::with_capacity(pending.len());
        for p in pending.drain(..) {
            let PendingSend { request, buffer } = p;
            match request.test() {
                Ok(_) => PendingSend::free(buffer),
                Err(request) => still.push(PendingSend { request, buffer }),
            }
        }
        *pending = still;
    }

    /// Calls `attempt` until it yields, spinning then yielding the core, and reaping
    /// buffered sends now and then; [`Error::Timeout`] once the timeout has passed. The one
    /// polling loop of every receive, so all of them time out alike.
    fn poll_until<T>(
        &self,
        src: usize,
        tag: Tag,
        mut attempt: impl FnMut() -> Option<T>,
    ) -> Result<T> {
        // The clock starts at the first check, 64 attempts in: a message that is already
        // there (the common case of a small collective's step) costs no clock read.
        let mut start: Option<Instant> = None;
        let mut spins: u64 = 0;
        loop {
            if let Some(t) = attempt() {
                return Ok(t);
            }
            spins += 1;
            if spins % 64 == 0 {
                self.progress();
                let waited = start.get_or_insert_with(Instant::now).elapsed();
                if waited >= self.timeout {
                    return Err(Error::Timeout {
                        rank: self.rank,
                        src,
                        tag,
                        waited,
                    });
                }
            }
            if spins > SPINS_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    }

    /// Waits for the matching message's envelope, polling so that a timeout is possible.
    fn probe(&self, src: usize, tag: Tag) -> Result<(Message, usize)> {
        let process = self.comm.process_at_rank(src as i32);
        self.poll_until(src, tag, || {
            process
                .immediate_matched_probe_with_tag(tag as i32)
                .map(|(msg, status)| {
                    let count = status.count(u8::equivalent_datatype());
                    (msg, count.max(0) as usize)
                })
        })
    }

    fn recv_vec_raw(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        let (msg, len) = self.probe(src, tag)?;
        let mut buf = vec![0u8; len];
        msg.matched_receive_into(&mut buf[..]);
        Ok(buf)
    }

    /// Receives into `buf` through a receive posted before the message is looked for
    /// (`MPI_Irecv`, see [`Self::poll_posted`]). A message longer than `buf` is
    /// `MPI_ERR_TRUNCATE`, which ends the job: only agreed lengths come here (see
    /// `Communicator::recv_agreed_into`).
    fn recv_posted_raw(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        mpi::request::scope(|scope| {
            let request = self
                .comm
                .process_at_rank(src as i32)
                .immediate_receive_into_with_tag(scope, buf, tag as i32);
            self.poll_posted(request, src, tag)
        })
    }

    /// Waits for a posted receive, polling with `MPI_Test` so that a timeout is possible:
    /// the message lands in the caller's buffer directly, with no probe and no copy out of
    /// the unexpected-message queue. On a timeout the receive is cancelled (or, if the
    /// message won the race, completed). Returns the bytes received.
    fn poll_posted<'a, S: mpi::request::Scope<'a>>(
        &self,
        request: Request<'a, [u8], S>,
        src: usize,
        tag: Tag,
    ) -> Result<usize> {
        let bytes = |status: mpi::point_to_point::Status| {
            status.count(u8::equivalent_datatype()).max(0) as usize
        };
        let mut pending = Some(request);
        let polled = self.poll_until(src, tag, || match pending.take()?.test() {
            Ok(status) => Some(bytes(status)),
            Err(r) => {
                pending = Some(r);
                None
            }
        });
        match (polled, pending) {
            (Err(timeout), Some(request)) => {
                request.cancel();
                match bytes(request.wait()) {
                    // The message arrived between the last test and the cancel (rsmpi does
                    // not expose `MPI_Test_cancelled`; a cancelled receive counts 0, so an
                    // empty message in that window is reported as the timeout it nearly was).
                    0 => Err(timeout),
                    n => Ok(n),
                }
            }
            (polled, _) => polled,
        }
    }

    /// The checks of a send-receive: both peers and tags, and the message length.
    fn check_pair(&self, dest: usize, st: Tag, src: usize, rt: Tag, len: usize) -> Result<()> {
        self.checks(dest, st)?;
        self.checks(src, rt)?;
        Self::check_len(len)
    }

    fn recv_into_raw(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        let (msg, len) = self.probe(src, tag)?;
        if len > buf.len() {
            // Take the message off the queue so the stream stays consistent, then report.
            let mut sink = vec![0u8; len];
            msg.matched_receive_into(&mut sink[..]);
            return copy_into(self.rank, src, tag, &sink, buf);
        }
        msg.matched_receive_into(&mut buf[..len]);
        Ok(len)
    }

    fn checks(&self, peer: usize, tag: Tag) -> Result<()> {
        check_transport_tag(tag)?;
        check_rank(peer, self.size)
    }

    /// Runs `receive` while `data` goes to `dest` from the caller's buffer, then waits for
    /// the send. MPI cannot withdraw a send that reads a buffer the caller is about to get
    /// back, so a send that does not complete ends the job (never a hang): the timeout
    /// plus [`SEND_GRACE`] after it started when the receive succeeded (a stalled peer that
    /// never takes a rendezvous-sized message; the grace lets peers blocked in receives
    /// report their own timeouts first), or [`SEND_GRACE`] after a failed receive, whose
    /// typed error is then what the job reports.
    fn with_send<R>(
        &self,
        dest: usize,
        tag: Tag,
        data: &[u8],
        receive: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        mpi::request::scope(|scope| {
            let started = Instant::now();
            let mut request = Some(
                self.comm
                    .process_at_rank(dest as i32)
                    .immediate_send_with_tag(scope, data, tag as i32),
            );
            let out = receive();
            // Read the clock only for a send still in flight after the receive (an eager
            // send has usually completed by then).
            let mut received: Option<Instant> = None;
            let mut spins: u64 = 0;
            while let Some(r) = request.take() {
                match r.test() {
                    Ok(_) => {}
                    Err(r) => {
                        let received = *received.get_or_insert_with(Instant::now);
                        match &out {
                            Err(e) if received.elapsed() > SEND_GRACE.min(self.timeout) => self
                                .abort_on_fatal(
                                    &format_args!(
                                        "{e} (and the send to rank {dest} with tag {tag} \
                                         beside it never completed)"
                                    ),
                                    STUCK_SEND_EXIT,
                                ),
                            Ok(_) if started.elapsed() > self.timeout + SEND_GRACE => self
                                .abort_on_fatal(
                                    &format_args!(
                                        "rank {} waited {:?} for rank {dest} to take a message \
                                     with tag {tag}",
                                        self.rank,
                                        started.elapsed()
                                    ),
                                    STUCK_SEND_EXIT,
                                ),
                            _ => {}
                        }
                        request = Some(r);
                        // Spin first, as the receive loop does: a yield is a system call.
                        spins += 1;
                        if spins > SPINS_BEFORE_YIELD {
                            std::thread::yield_now();
                        }
                    }
                }
            }
            out
        })
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        let start = Instant::now();
        let (rank, size, timeout) = (self.rank, self.size, self.timeout);
        for p in self.pending.get_mut().drain(..) {
            let PendingSend { request, buffer } = p;
            let mut request = Some(request);
            while let Some(r) = request.take() {
                match r.test() {
                    Ok(_) => PendingSend::free(buffer),
                    Err(r) => {
                        if start.elapsed() > timeout {
                            abort_world(
                                Some((rank, size)),
                                &format_args!("buffered sends never received after {timeout:?}"),
                                STUCK_DROP_EXIT,
                            );
                        }
                        request = Some(r);
                        std::thread::yield_now();
                    }
                }
            }
        }
    }
}

/// Environment variable that makes every block of `n` world ranks report one node, to run
/// hierarchical algorithms on one host as if on `P / n` machines (for tests and
/// demonstrations; without it the node is the shared-memory group).
pub const RANKS_PER_NODE_ENV: &str = "COLLECTIVES_RANKS_PER_NODE";

/// The node of this process: its shared-memory group (`MPI_Comm_split_type` with
/// `MPI_COMM_TYPE_SHARED`) named by the group's lowest world rank, or the block of
/// [`RANKS_PER_NODE_ENV`] ranks when that is set.
fn world_node(world: &SimpleCommunicator) -> Result<u64> {
    let rank = world.rank();
    if let Ok(v) = std::env::var(RANKS_PER_NODE_ENV) {
        let n = v
            .trim()
            .parse::<i32>()
            .ok()
            .filter(|&n| n > 0 && world.size() % n == 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{RANKS_PER_NODE_ENV}={v:?} must be a positive divisor of the {} ranks",
                    world.size()
                ))
            })?;
        return Ok((rank / n) as u64);
    }
    let shared = world.split_shared(rank);
    let mut lowest = rank;
    shared.all_reduce_into(&rank, &mut lowest, SystemOperation::min());
    Ok(lowest as u64)
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.checks(dest, tag)?;
        Self::check_len(data.len())?;
        self.progress();
        let buffer: *mut [u8] = Box::into_raw(data.to_vec().into_boxed_slice());
        // SAFETY: the copy lives until `free` after the request completes.
        let data: &'static [u8] = unsafe { &*buffer };
        let request = self
            .comm
            .process_at_rank(dest as i32)
            .immediate_send_with_tag(StaticScope, data, tag as i32);
        self.pending
            .borrow_mut()
            .push(PendingSend { request, buffer });
        Ok(())
    }

    fn recv(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        self.checks(src, tag)?;
        self.recv_vec_raw(src, tag)
    }

    fn recv_into(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        self.checks(src, tag)?;
        self.recv_into_raw(src, tag, buf)
    }

    fn sendrecv(&self, dest: usize, st: Tag, data: &[u8], src: usize, rt: Tag) -> Result<Vec<u8>> {
        self.check_pair(dest, st, src, rt, data.len())?;
        self.with_send(dest, st, data, || self.recv_vec_raw(src, rt))
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
        self.check_pair(dest, st, src, rt, data.len())?;
        self.with_send(dest, st, data, || self.recv_into_raw(src, rt, buf))
    }

    fn recv_agreed_into(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        self.checks(src, tag)?;
        Self::check_len(buf.len())?;
        self.progress();
        self.recv_posted_raw(src, tag, buf)
    }

    fn sendrecv_agreed_into(
        &self,
        dest: usize,
        st: Tag,
        data: &[u8],
        src: usize,
        rt: Tag,
        buf: &mut [u8],
    ) -> Result<usize> {
        self.check_pair(dest, st, src, rt, data.len())?;
        Self::check_len(buf.len())?;
        // The receive is posted before the send, so that the peer's message, which is
        // usually on its way already, finds it (as `MPI_Sendrecv` does).
        mpi::request::scope(|scope| {
            let request = self
                .comm
                .process_at_rank(src as i32)
                .immediate_receive_into_with_tag(scope, buf, rt as i32);
            self.with_send(dest, st, data, || self.poll_posted(request, src, rt))
        })
    }

    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Communicator>> {
        Ok(Box::new(self.split_mpi(color, key)?))
    }

    fn barrier(&self) -> Result<()> {
        self.progress();
        self.watched(LibraryCall::Barrier, || self.comm.barrier());
        Ok(())
    }

    fn barrier_idle(&self) -> Result<()> {
        self.progress();
        // MPI_Barrier polls (a core at 100 % per waiting rank); an MPI_Ibarrier tested every
        // IDLE_POLL sleeps in between. The watchdog ends the job past the timeout, as for
        // the blocking barrier.
        self.watched(LibraryCall::Barrier, || {
            let mut request = self.comm.immediate_barrier();
            loop {
                match request.test() {
                    Ok(_) => return,
                    Err(r) => request = r,
                }
                std::thread::sleep(IDLE_POLL);
            }
        });
        Ok(())
    }

    fn node(&self) -> Option<u64> {
        Some(self.node)
    }

    fn backend(&self) -> String {
        "mpi".into()
    }

    fn library(&self) -> Option<&dyn LibraryCollectives> {
        Some(self)
    }

    fn shared_segment(&self) -> Option<&SharedSegment> {
        self.shared.as_ref()
    }
}

/// Set to `0` on every rank to run without the shared segment (the `SharedMemory`
/// algorithms then refuse with a typed error and the choosers leave them out).
pub const SHARED_MEMORY_ENV: &str = "COLLECTIVES_SHARED_MEMORY";

/// Whether every rank of `node` says yes (`MPI_Allreduce` of the minimum), so that all
/// take the same branch.
fn all_agree(node: &SimpleCommunicator, yes: bool) -> bool {
    let mut all = 0i32;
    node.all_reduce_into(&i32::from(yes), &mut all, SystemOperation::min());
    all == 1
}

/// The shared segment of `comm` when all its ranks run on one node: a POSIX
/// shared-memory object ([`SharedMapping`]) of [`REGION_BYTES`](super::shm::REGION_BYTES)
/// per rank, which rank 0 creates and names to the others, and removes once every rank
/// has mapped it (the memory goes with the last mapping, even when a process dies). Each
/// rank allocates its own region's pages, so they sit on its NUMA node.
/// `None` on every rank alike when the ranks span several nodes, when any rank has
/// [`SHARED_MEMORY_ENV`] set to `0`, or when any rank cannot create, open or map it.
fn shared_segment_of(comm: &SimpleCommunicator, timeout: Duration) -> Option<SharedSegment> {
    use super::shm::{SharedMapping, REGION_BYTES};
    use std::sync::atomic::{AtomicU64, Ordering};
    /// Segments this process created, so that every name is new.
    static CREATED: AtomicU64 = AtomicU64::new(0);
    let node = comm.split_shared(0);
    // Every rank sees the same node size, and with it all, the same order.
    if node.size() != comm.size() || node.rank() != comm.rank() {
        return None;
    }
    let wanted = std::env::var(SHARED_MEMORY_ENV).map_or(true, |v| v.trim() != "0");
    if !all_agree(&node, wanted) {
        return None;
    }
    let len = REGION_BYTES.checked_mul(node.size() as usize)?;
    let mut name = [0u8; 64];
    let mut mapping = None;
    if node.rank() == 0 {
        let id = format!(
            "/collectives-{}-{}",
            std::process::id(),
            CREATED.fetch_add(1, Ordering::Relaxed)
        );
        name[..id.len()].copy_from_slice(id.as_bytes());
        mapping = SharedMapping::create(&id, len).ok();
    }
    node.process_at_rank(0).broadcast_into(&mut name[..]);
    if !all_agree(&node, node.rank() != 0 || mapping.is_some()) {
        return None;
    }
    let id = String::from_utf8_lossy(&name)
        .trim_end_matches('\0')
        .to_string();
    if node.rank() != 0 {
        mapping = SharedMapping::open(&id, len).ok();
    }
    // Each rank allocates its own region's pages (on its own NUMA node).
    let rank = node.rank() as usize;
    let mapping = mapping.filter(|m| m.reserve(rank * REGION_BYTES, REGION_BYTES).is_ok());
    let mapped = all_agree(&node, mapping.is_some());
    if node.rank() == 0 {
        // Every rank has opened it, or failed to, by now.
        SharedMapping::unlink(&id);
    }
    let mapping = mapping.filter(|_| mapped)?;
    let base = mapping.as_ptr();
    // SAFETY: one region per rank of `comm` (its node group, in the same order), each
    // REGION_BYTES long inside the mapping, zeroed (a new object reads as zeros), mapped
    // until `mapping` drops with the segment.
    let mut segment = unsafe {
        SharedSegment::new(
            (0..node.size() as usize)
                .map(|r| base.add(r * REGION_BYTES))
                .collect(),
            comm.rank() as usize,
            timeout,
            None,
            Box::new(mapping),
        )
    };
    segment.set_progress(Box::new(library_progress));
    // Single-copy reads of the peers' buffers where the kernel allows them to every rank
    // (`all_agree` is also the barrier between publishing and probing).
    segment.publish_identity();
    if all_agree(&node, super::peer_memory::wanted())
        && all_agree(&node, segment.probe_cross_memory_attach())
    {
        segment.set_cross_memory_attach();
    }
    Some(segment)
}

/// One turn of the MPI library's progress engine, for a rank that waits on the shared
/// segment (see [`TransportProgress`](super::shm::TransportProgress)): `MPI_Iprobe` for
/// any message, which looks at nothing it finds but advances every send and receive in
/// flight, the library's own included.
fn library_progress() {
    let mut found = 0;
    // SAFETY: MPI is initialised while any segment lives (the segment drops with its
    // communicator, before the universe); the world communicator is valid, and the
    // status is ignored.
    unsafe {
        mpi::ffi::MPI_Iprobe(
            mpi::ffi::RSMPI_ANY_SOURCE,
            mpi::ffi::RSMPI_ANY_TAG,
            mpi::ffi::RSMPI_COMM_WORLD,
            &mut found,
            mpi::ffi::RSMPI_STATUS_IGNORE,
        );
    }
}

/// `MPI_IN_PLACE` of the MPI library this process runs on, where it is known: rsmpi does
/// not export it (a C macro), and without it a library all-reduce copies its buffer first
/// (a memory pass as long as the buffer, several per cent of the call at 4 KiB and at
/// 64 MiB alike). Open MPI defines it as `(void *) 1` in every release; other libraries
/// (MPICH: `(void *) -1`) keep the copy rather than rely on a guess.
fn in_place() -> Option<*const std::ffi::c_void> {
    static OPEN_MPI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let open_mpi = *OPEN_MPI.get_or_init(|| {
        mpi::environment::library_version().is_ok_and(|v| v.starts_with("Open MPI"))
    });
    open_mpi.then_some(std::ptr::without_provenance(1))
}

/// `MPI_Allreduce(MPI_IN_PLACE, buf, MPI_FLOAT, MPI_SUM)` on `comm`: the bare library
/// call, without this transport's checks and watchdog (the bench's `mpi_native` baseline
/// times it; [`LibraryCollectives::allreduce_f32`] runs it under the watchdog). `Ok(false)`,
/// nothing called, where the library's `MPI_IN_PLACE` is not known; a typed error for a
/// buffer longer than one MPI call carries.
pub fn allreduce_in_place_raw(comm: &SimpleCommunicator, buf: &mut [f32]) -> Result<bool> {
    use mpi::raw::AsRaw as _;
    MpiComm::check_len(buf.len())?;
    let Some(in_place) = in_place() else {
        return Ok(false);
    };
    // SAFETY: `in_place` is this library's `MPI_IN_PLACE`; `buf` holds `buf.len()` floats
    // (at most `i32::MAX`, checked above), summed in place; the datatype, operation and
    // communicator handles are valid while `comm` lives.
    unsafe {
        mpi::ffi::MPI_Allreduce(
            in_place,
            buf.as_mut_ptr().cast(),
            buf.len() as i32,
            mpi::ffi::RSMPI_FLOAT,
            mpi::ffi::RSMPI_SUM,
            comm.as_raw(),
        );
    }
    Ok(true)
}

/// Per-rank `int`s of one library call: on the stack up to 16 ranks, so that a call
/// allocates nothing for them.
type MpiInts = smallvec::SmallVec<[i32; 16]>;

/// `counts` as the `int` counts and displacements MPI takes, or a typed error when one
/// (or the total) exceeds `i32::MAX`.
fn mpi_counts(counts: &[usize]) -> Result<(MpiInts, MpiInts)> {
    let too_big = || {
        Error::InvalidArgument(format!(
            "MPI counts {counts:?} exceed the {} one call can carry",
            i32::MAX
        ))
    };
    let mut displs = MpiInts::with_capacity(counts.len());
    let mut out = MpiInts::with_capacity(counts.len());
    let mut total = 0i32;
    for &c in counts {
        let c = i32::try_from(c).map_err(|_| too_big())?;
        displs.push(total);
        total = total.checked_add(c).ok_or_else(too_big)?;
        out.push(c);
    }
    Ok((out, displs))
}

/// The MPI library's own collectives. Blocking: MPI cannot withdraw from a blocking
/// collective, so a peer that never enters one is not a typed timeout; like
/// [`Communicator::barrier`], each runs under a watchdog thread, which ends the job once the
/// call has not returned within the timeout. The argument check of the dense collectives,
/// on by default, runs first over point-to-point messages with the transport's timeout
/// (a typed error there).
impl LibraryCollectives for MpiComm {
    fn allreduce_f32(&self, buf: &mut [f32]) -> Result<()> {
        Self::check_len(buf.len())?;
        self.progress();
        if self.watched(LibraryCall::Allreduce, || {
            allreduce_in_place_raw(&self.comm, buf)
        })? {
            return Ok(());
        }
        let mut send = self.library_scratch.borrow_mut();
        send.clear();
        send.extend_from_slice(buf);
        self.watched(LibraryCall::Allreduce, || {
            self.comm
                .all_reduce_into(&send[..], buf, SystemOperation::sum())
        });
        Ok(())
    }

    fn allgatherv_bytes(&self, mine: &[u8], out: &mut [u8], counts: &[usize]) -> Result<()> {
        if counts.len() != self.size || counts.get(self.rank) != Some(&mine.len()) {
            return Err(Error::InvalidArgument(format!(
                "library all-gather: counts {counts:?} for {} ranks, own block {} bytes",
                self.size,
                mine.len()
            )));
        }
        if counts.iter().all(|&n| n == mine.len())
            && Some(out.len()) == mine.len().checked_mul(self.size)
        {
            // Equal blocks (the common case): no count arrays to build.
            return self.allgather_bytes(mine, out);
        }
        // The total bounds every count and displacement.
        Self::check_len(out.len())?;
        self.progress();
        let (c, displs) = mpi_counts(counts)?;
        let mut parts = mpi::datatype::PartitionMut::new(out, &c[..], &displs[..]);
        self.watched(LibraryCall::Allgather, || {
            self.comm.all_gather_varcount_into(mine, &mut parts)
        });
        Ok(())
    }

    fn allgather_bytes(&self, mine: &[u8], out: &mut [u8]) -> Result<()> {
        if Some(out.len()) != mine.len().checked_mul(self.size) {
            return Err(Error::InvalidArgument(format!(
                "library all-gather: output of {} bytes for {} ranks of {} bytes",
                out.len(),
                self.size,
                mine.len()
            )));
        }
        Self::check_len(out.len())?;
        self.progress();
        // Whole 4-byte words go as MPI_FLOAT (measured a little faster than MPI_BYTE or
        // MPI_UINT32_T at 16 KiB).
        self.watched(LibraryCall::Allgather, || {
            match (
                bytemuck::try_cast_slice::<u8, f32>(mine),
                bytemuck::try_cast_slice_mut::<u8, f32>(out),
            ) {
                (Ok(m), Ok(o)) => self.comm.all_gather_into(m, o),
                _ => self.comm.all_gather_into(mine, out),
            }
        });
        Ok(())
    }

    fn reduce_scatter_f32(&self, buf: &mut [f32], counts: &[usize]) -> Result<()> {
        use mpi::raw::AsRaw as _;
        Self::check_len(buf.len())?;
        let total = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
        if counts.len() != self.size || total != Some(buf.len()) {
            return Err(Error::InvalidArgument(format!(
                "library reduce-scatter: counts {counts:?} for {} ranks and {} elements",
                self.size,
                buf.len()
            )));
        }
        let (c, displs) = mpi_counts(counts)?;
        self.progress();
        let mut block = self.library_scratch.borrow_mut();
        block.clear();
        block.resize(counts[self.rank], 0.0);
        // SAFETY: `buf` holds the `c` elements of every rank's block, `block` this rank's
        // `c[rank]`, the counts array has one `int` per rank, and the datatype, operation
        // and communicator handles are valid while `self` lives.
        self.watched(LibraryCall::ReduceScatter, || unsafe {
            mpi::ffi::MPI_Reduce_scatter(
                buf.as_ptr().cast(),
                block.as_mut_ptr().cast(),
                c.as_ptr(),
                mpi::ffi::RSMPI_FLOAT,
                mpi::ffi::RSMPI_SUM,
                self.comm.as_raw(),
            );
        });
        let at = displs[self.rank] as usize;
        buf[at..at + block.len()].copy_from_slice(&block);
        Ok(())
    }
}

/// Prints a fatal error and ends every process of the job with `MPI_Abort` on the world
/// communicator, if MPI is running in this process; returns only when it is not (never
/// initialised, or already finalised), so that callers can fall back to a plain exit.
///
/// For a program's last line of defence (for example its `main` after a subcommand
/// failed); where a communicator is at hand, [`MpiComm::abort_on_fatal`] says which rank.
pub fn abort_if_running(error: &dyn std::fmt::Display, code: i32) {
    if mpi::environment::is_initialized() && !mpi::environment::is_finalized() {
        abort_world(None, error, code);
    }
}

/// The one fatal path: message, flush, `MPI_Abort(MPI_COMM_WORLD, code)`.
fn abort_world(rank: Option<(usize, usize)>, error: &dyn std::fmt::Display, code: i32) -> ! {
    use std::io::Write as _;
    let code = if code == 0 { 1 } else { code };
    let who = match rank {
        Some((r, p)) => format!("rank {r}/{p}"),
        None => format!("process {}", std::process::id()),
    };
    // One write of the whole line: stderr is unbuffered, so `writeln!` would issue one
    // write per piece, and the lines of ranks failing at the same moment would interleave
    // mid-line in the launcher's output.
    let line = format!("{who}: fatal: {error}; ending the MPI job (MPI_Abort {code})\n");
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(line.as_bytes());
    let _ = err.flush();
    let _ = std::io::stdout().flush();
    // SAFETY: MPI is initialised and not finalised (every caller holds a communicator or
    // checked), and MPI_Abort may be called from any thread at any time.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
    }
    // MPI_Abort does not return; should an implementation ever do so, still end here.
    std::process::exit(code)
}
