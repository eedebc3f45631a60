//! [`SharedSegment`]: memory that every rank of a communicator reads and writes directly,
//! when all of them run on one machine (threads of one process, or MPI processes of one
//! node through a POSIX shared-memory object, `SharedMapping`).
//!
//! The `SharedMemory` dense collectives ([`crate::dense::shared_memory`]) move data through
//! it with plain loads and stores and synchronise with one flag per rank, instead of
//! passing messages: a small all-reduce is one copy in, one flag exchange and one
//! reduction, where a message-passing library makes log₂ P round trips through its
//! transport's queues.
//!
//! Layout: one region per rank, a header (the rank's sequence flag and the count of ranks
//! sleeping on it, on its own page) and
//! two slots of [`SLOT_BYTES`]. A rank only writes its own region. Each synchronisation
//! (`SharedSegment::sync`) publishes the rank's next sequence number and waits until every
//! rank has published it, so that what was written before is visible after. Successive
//! rounds alternate between the two slots: a rank rewrites a slot only after every rank has
//! passed the next round's synchronisation, by which time all of them are done reading it.
//!
//! Writes into a slot (`SharedSegment::put`) use plain stores while they are fast, and
//! non-temporal stores while they are measured slow: see [`TIMED_PUT_BYTES`].

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::peer_memory::{self, PeerMemory};
use crate::{Error, Result};

/// Bytes of each of a rank's two slots: the most one round of a shared-memory collective
/// moves per rank (larger buffers go in several rounds).
pub const SLOT_BYTES: usize = 1 << 20;

/// Bytes before a region's slots: the sequence flag and its sleepers' count, alone on
/// their page so that polling never contends with data, and what the rank publishes for
/// single-copy reads ([`BUFFER_AT`], [`PID_AT`], [`REGION_AT`]).
const HEADER_BYTES: usize = 4096;

/// Header offset of the address (in its own process) and length of the buffer a rank lets
/// its peers read in the current call (two `u64`, on their own cache line).
const BUFFER_AT: usize = 128;

/// Header offset of the rank's process id (an `i32`), for cross-memory attach.
const PID_AT: usize = 192;

/// Header offset of the address of the rank's own region in its process (a `u64`): the
/// probe reads the peer's [`PID_AT`] there through the kernel.
const REGION_AT: usize = 200;

/// Bytes of one rank's region (header and two slots); a multiple of the page size.
pub const REGION_BYTES: usize = HEADER_BYTES + 2 * SLOT_BYTES;

/// The reserved tag a [`Error::Timeout`] of a shared-memory wait names.
pub const TAG_SHARED_MEMORY: u32 = 0x7F02;

/// Polls of a peer's flag before a wait starts yielding the core between polls, when
/// every rank of the node can have a core of its own: a peer due within tens of
/// microseconds is caught without a system call.
const SPINS_OWN_CORE: u32 = 4_000;

/// The same when ranks outnumber the node's cores: the peer waited for may need this
/// very core, so the wait hands it over almost at once (a yield lets a rank on the same
/// core run without waking a sleeping core, which a futex wake-up in a VM costs tens of
/// microseconds for).
const SPINS_SHARED_CORE: u32 = 20;

/// How long a wait polls (spinning, then yielding) before it sleeps in the kernel on the
/// peer's flag (a futex, woken by the peer's publish): waits longer than this are a rank
/// working alone while the others wait, and those should leave the cores to it.
const POLL_FOR: Duration = Duration::from_millis(1);

/// Longest single sleep of a wait, after which it checks for a failed peer and its
/// timeout (and polls again, should a wake-up have been missed).
const SLEEP_SLICE: Duration = Duration::from_millis(2);

/// While a wait spins, it drives the transport's progress ([`TransportProgress`]) once in
/// this many polls: often enough that a peer waiting inside the library for this rank's
/// message is served within microseconds, rarely enough that the spin stays a few loads.
const SPINS_PER_PROGRESS: u32 = 256;

/// Smallest write into a slot that is timed, and that goes with non-temporal stores while
/// plain ones are slow (see `SharedSegment::put`). From 16 KiB down to 4 KiB, the 16 KiB
/// all-gather at P = 2 (8 KiB per rank) went from 1.4–1.8 to 4.2–4.4 GB/s while the host
/// kept the vCPUs apart, and stayed at 4–7 GB/s while it kept them close; two clock reads
/// are a few per cent of a 4 KiB write.
pub const TIMED_PUT_BYTES: usize = 4 << 10;

/// A plain write into a slot slower than this (bytes per second) counts as slow. On a
/// 2-vCPU VM plain writes into slots ran at 6–22 GB/s while the host kept the two vCPUs
/// close (a 0.1 µs flag round trip), and at 2.2–2.5 GB/s while it placed them apart
/// (0.5 µs): each store first takes the line back from the peer's cache, which read it in
/// an earlier round. Non-temporal stores skip that read and ran at 10–27 GB/s in both.
const SLOW_PUT_BYTES_PER_S: f64 = 4e9;

/// Timed writes in a row that must be slow before the rank switches to non-temporal
/// stores: one slow write can be a preemption.
const SLOW_PUTS_TO_STREAM: u32 = 2;

/// While streaming, a plain write probes whether plain stores have become fast again:
/// first after this many timed writes (a false start, such as the first rounds on cold
/// buffers, ends soon), then after twice as many each time a probe is slow, up to
/// [`PROBE_AT_MOST`].
const PROBE_FIRST: u32 = 8;

/// The longest gap between probes: in the slow placement a probe costs about 1 % of the
/// rounds' time at this gap.
const PROBE_AT_MOST: u32 = 128;

/// How this rank writes its slots: plain stores (the reader then takes the lines from this
/// core's cache, the fast way while the cores are close), or non-temporal stores while
/// plain ones are measured slow (the reader then takes them from memory). Each rank
/// decides alone: the bytes written are the same either way.
struct StorePolicy {
    streaming: Cell<bool>,
    /// Slow plain writes in a row.
    slow: Cell<u32>,
    /// Timed writes since the last probe (while streaming).
    since_probe: Cell<u32>,
    /// Timed writes between probes now.
    probe_gap: Cell<u32>,
}

impl Default for StorePolicy {
    fn default() -> Self {
        StorePolicy {
            streaming: Cell::new(false),
            slow: Cell::new(0),
            since_probe: Cell::new(0),
            probe_gap: Cell::new(PROBE_FIRST),
        }
    }
}

impl StorePolicy {
    /// Whether the next timed write uses non-temporal stores (false: plain, and timed).
    fn stream_next(&self) -> bool {
        if !self.streaming.get() {
            return false;
        }
        let n = self.since_probe.get() + 1;
        if n < self.probe_gap.get() {
            self.since_probe.set(n);
            return true;
        }
        self.since_probe.set(0);
        false
    }

    /// A plain write of `bytes` took `secs`.
    fn observe(&self, bytes: usize, secs: f64) {
        if (bytes as f64) >= SLOW_PUT_BYTES_PER_S * secs {
            self.slow.set(0);
            self.streaming.set(false);
            self.since_probe.set(0);
            self.probe_gap.set(PROBE_FIRST);
            return;
        }
        let slow = self.slow.get() + 1;
        self.slow.set(slow);
        if self.streaming.get() {
            // A slow probe: wait longer before the next one.
            self.probe_gap
                .set((self.probe_gap.get() * 2).min(PROBE_AT_MOST));
        } else if slow >= SLOW_PUTS_TO_STREAM {
            self.streaming.set(true);
        }
    }
}

/// Tells a waiting rank that a peer has failed (its rank), so that it stops early.
pub type PeerFailure = Box<dyn Fn() -> Option<usize> + Send>;

/// Moves the transport's own traffic on while a rank waits on a peer's flag. Why: an MPI
/// library advances a message only inside its calls. A buffered send whose later pieces
/// wait for the receiver (a rendezvous without single copy), or the last send of a
/// library collective that returned early on this rank, stays where it is while this
/// rank polls shared memory; a peer that waits inside the library for exactly that
/// message never reaches the flag this rank waits for, and both time out. (Reproduced at
/// P = 2 with Open MPI's `btl_vader_single_copy_mechanism none`: a rank that sent 8 MiB
/// and then waited on the segment timed out with the receiver still in its receive.)
pub(crate) type TransportProgress = Box<dyn Fn() + Send>;

/// One rank's view of a shared segment. See the module docs.
pub struct SharedSegment {
    /// Start of every rank's region, in rank order (this process's addresses).
    regions: Vec<*mut u8>,
    rank: usize,
    /// The last sequence number this rank published.
    published: Cell<u32>,
    /// Rounds started, whose parity picks the slot.
    rounds: Cell<u64>,
    timeout: Duration,
    failed: Option<PeerFailure>,
    /// Called while a wait lasts (see [`TransportProgress`]); `None` for transports
    /// whose sends need no help from the sender (threads).
    progress: Option<TransportProgress>,
    /// Polls before a wait sleeps ([`SPINS_OWN_CORE`] or [`SPINS_SHARED_CORE`]).
    spins: u32,
    /// Plain or non-temporal writes into this rank's slots.
    stores: StorePolicy,
    /// How this rank reads its peers' published buffers, if it can.
    peers: PeerMemory,
    /// Keeps the memory mapped (and frees it on drop).
    _memory: Box<dyn Send>,
}

// SAFETY: the raw pointers address memory kept alive by `_memory`, which moves with the
// segment; a segment is used by one thread at a time (it is not `Sync`).
unsafe impl Send for SharedSegment {}

impl std::fmt::Debug for SharedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSegment")
            .field("rank", &self.rank)
            .field("size", &self.regions.len())
            .field("published", &self.published.get())
            .finish()
    }
}

impl SharedSegment {
    /// Rank `rank`'s view of a segment whose regions start at `regions` (one per rank,
    /// each [`REGION_BYTES`] long, page-aligned, zeroed before any rank's first use),
    /// kept alive by `memory`.
    ///
    /// # Safety
    /// Every pointer must address [`REGION_BYTES`] bytes that stay valid while `memory`
    /// lives, that every rank of the group maps, and that nothing but the segments of
    /// this group (one per rank) touches.
    pub(crate) unsafe fn new(
        regions: Vec<*mut u8>,
        rank: usize,
        timeout: Duration,
        failed: Option<PeerFailure>,
        memory: Box<dyn Send>,
    ) -> Self {
        let spins = if regions.len() > online_cores() {
            SPINS_SHARED_CORE
        } else {
            SPINS_OWN_CORE
        };
        // Fault in this rank's slots now (zeros over zeros: nothing has written them yet,
        // and no peer ever does). Left to the first rounds, the faults made those writes
        // look slow (0.9–2.1 GB/s) and switched every new segment to non-temporal stores.
        let own = regions[rank];
        for at in (HEADER_BYTES..REGION_BYTES).step_by(4096) {
            // SAFETY: inside this rank's region (the caller's contract), in its slots, which
            // only this rank writes and no peer reads before this rank's first sync.
            unsafe { std::ptr::write_volatile(own.add(at), 0u8) };
        }
        SharedSegment {
            regions,
            rank,
            published: Cell::new(0),
            rounds: Cell::new(0),
            timeout,
            failed,
            progress: None,
            spins,
            stores: StorePolicy::default(),
            peers: PeerMemory::Slots,
            _memory: memory,
        }
    }

    /// Number of ranks sharing the segment.
    pub fn size(&self) -> usize {
        self.regions.len()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Sets how long a wait for a peer lasts before it is an [`Error::Timeout`].
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sets what a wait calls to move the transport's own traffic on
    /// ([`TransportProgress`]).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn set_progress(&mut self, progress: TransportProgress) {
        self.progress = Some(progress);
    }

    /// Runs the transport's progress, if it has one.
    fn drive_progress(&self) {
        if let Some(progress) = &self.progress {
            progress();
        }
    }

    /// Lets the ranks read each other's buffers through plain pointers: they are threads
    /// of one process. Every rank's view must get the same setting.
    pub(crate) fn set_same_process(&mut self) {
        self.peers = PeerMemory::SameProcess;
    }

    /// Whether every rank can have a core of its own (ranks do not outnumber the
    /// machine's online cores); the same answer on every rank.
    pub(crate) fn own_cores(&self) -> bool {
        self.spins == SPINS_OWN_CORE
    }

    /// Whether this rank reads its peers' published buffers (`SharedSegment::read_peer`); the
    /// same answer on every rank.
    pub fn reads_peers(&self) -> bool {
        self.peers.reads_peers()
    }

    /// Step 1 of the cross-memory-attach probe: writes this rank's pid and the address of
    /// its region where peers find them. Every rank must publish before any probes.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn publish_identity(&self) {
        let own = self.regions[self.rank];
        // SAFETY: this rank's header, which only it writes, aligned for both words; peers
        // read them only after the caller's barrier.
        unsafe {
            std::ptr::write_volatile(own.add(PID_AT) as *mut i32, std::process::id() as i32);
            std::ptr::write_volatile(own.add(REGION_AT) as *mut u64, own as u64);
        }
    }

    /// Step 2: whether `process_vm_readv` reads every peer's pid out of its own process
    /// (the kernel allows cross-memory attach between these processes). Needs every
    /// rank's [`Self::publish_identity`] before it (a barrier); the caller agrees the
    /// answers across ranks and passes the common one to [`Self::set_cross_memory_attach`].
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn probe_cross_memory_attach(&self) -> bool {
        (0..self.size()).filter(|&r| r != self.rank).all(|r| {
            let (pid, region) = self.identity(r);
            let mut seen = [0u8; 4];
            // SAFETY: the kernel checks the remote range; `seen` is ours.
            let read = unsafe { peer_memory::read_process(pid, region + PID_AT as u64, &mut seen) };
            read.is_ok() && i32::from_ne_bytes(seen) == pid
        })
    }

    /// Step 3: every rank reads its peers' buffers with cross-memory attach from now on.
    /// Every rank must call it, or none.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn set_cross_memory_attach(&mut self) {
        let pids = (0..self.size()).map(|r| self.identity(r).0).collect();
        self.peers = PeerMemory::CrossMemoryAttach(pids);
    }

    /// Rank `r`'s published pid and region address.
    fn identity(&self, r: usize) -> (i32, u64) {
        let at = self.regions[r];
        // SAFETY: rank r's header, written by `publish_identity` before the caller's
        // barrier and never again.
        unsafe {
            (
                std::ptr::read_volatile(at.add(PID_AT) as *const i32),
                std::ptr::read_volatile(at.add(REGION_AT) as *const u64),
            )
        }
    }

    /// Publishes the buffer this rank's peers read in this call (its address and length);
    /// they see it after the next [`Self::sync`], and it must stay unchanged until every
    /// rank has passed the sync after their reads.
    pub(crate) fn publish_buffer(&self, buf: &[u8]) {
        let (addr, len) = self.buffer_words(self.rank);
        addr.store(buf.as_ptr() as u64, Ordering::Relaxed);
        len.store(buf.len() as u64, Ordering::Relaxed);
    }

    /// Copies `dst.len()` bytes from byte `at` of the buffer rank `r` published before
    /// the last [`Self::sync`], in one copy ([`PeerMemory`]). An [`Error::Mismatch`] when
    /// that buffer is shorter (the ranks disagree on the counts), an
    /// [`Error::SharedMemory`] when the kernel refuses the read.
    ///
    /// # Safety
    /// Rank `r` must have published a buffer before the last sync, and must not change or
    /// free it before every rank's next sync.
    pub(crate) unsafe fn read_peer(&self, r: usize, at: usize, dst: &mut [u8]) -> Result<()> {
        let (addr, len) = self.buffer_words(r);
        let (addr, len) = (addr.load(Ordering::Relaxed), len.load(Ordering::Relaxed));
        if (at as u64).saturating_add(dst.len() as u64) > len {
            return Err(Error::Mismatch {
                what: "all-gather block length",
                detail: format!(
                    "rank {r} shared {len} bytes, rank {} reads {} from byte {at}",
                    self.rank,
                    dst.len()
                ),
            });
        }
        // SAFETY: in bounds of rank r's published buffer (checked above), which the
        // caller's contract keeps valid and unchanged.
        unsafe { self.peers.read(r, addr + at as u64, dst) }.map_err(|e| {
            Error::SharedMemory(format!(
                "rank {} could not read rank {r}'s buffer ({} bytes): {e}",
                self.rank,
                dst.len()
            ))
        })
    }

    /// Rank `r`'s published buffer address and length.
    fn buffer_words(&self, r: usize) -> (&AtomicU64, &AtomicU64) {
        // SAFETY: inside the header of every region, 8-byte aligned, only ever accessed
        // atomically; their ordering comes from the flags' synchronisation.
        unsafe {
            (
                &*(self.regions[r].add(BUFFER_AT) as *const AtomicU64),
                &*(self.regions[r].add(BUFFER_AT + 8) as *const AtomicU64),
            )
        }
    }

    /// Rank `r`'s sequence flag: the last sequence number it published (wrapping).
    fn flag(&self, r: usize) -> &AtomicU32 {
        // SAFETY: the header of every region is valid for the segment's life, aligned
        // (the region is page-aligned) and only ever accessed atomically.
        unsafe { &*(self.regions[r] as *const AtomicU32) }
    }

    /// How many ranks sleep on rank `r`'s flag: its publish wakes them only when some do.
    fn sleepers(&self, r: usize) -> &AtomicU32 {
        // SAFETY: as for `flag`, 64 bytes further on (its own cache line).
        unsafe { &*(self.regions[r].add(64) as *const AtomicU32) }
    }

    /// Starts a round: which of the two slots it uses.
    pub(crate) fn next_round(&self) -> usize {
        let r = self.rounds.get();
        self.rounds.set(r + 1);
        (r % 2) as usize
    }

    /// Rank `r`'s slot `which` (0 or 1), [`SLOT_BYTES`] long.
    pub(crate) fn slot(&self, r: usize, which: usize) -> *mut u8 {
        debug_assert!(which < 2);
        // SAFETY: the offset stays inside rank r's region.
        unsafe { self.regions[r].add(HEADER_BYTES + which * SLOT_BYTES) }
    }

    /// Copies `data` into this rank's slot `which` at byte `at`. A write of at least
    /// [`TIMED_PUT_BYTES`] is timed, and after slow plain writes (the host placed the
    /// cores apart: [`SLOW_PUT_BYTES_PER_S`]) goes with non-temporal stores, probing plain
    /// ones again now and then. The caller must not write the range while a peer may read
    /// it (between a round's synchronisation and the next round's on the same slot).
    pub(crate) fn put(&self, which: usize, at: usize, data: &[u8]) {
        if data.len() < TIMED_PUT_BYTES {
            return self.write_own(which, at, data, false);
        }
        if self.stores.stream_next() {
            return self.write_own(which, at, data, true);
        }
        let start = Instant::now();
        self.write_own(which, at, data, false);
        self.stores
            .observe(data.len(), start.elapsed().as_secs_f64());
    }

    /// Makes this rank write with non-temporal stores, as after slow plain writes (tests
    /// of that path, which a machine whose cores stay close never takes).
    #[cfg(test)]
    pub(crate) fn force_streaming(&self) {
        self.stores.streaming.set(true);
    }

    /// Whether this rank now writes its slots with non-temporal stores (see [`Self::put`]).
    pub(crate) fn streams(&self) -> bool {
        self.stores.streaming.get()
    }

    /// `data` into this rank's slot `which` at byte `at` with non-temporal stores, untimed:
    /// for pieces of a round written one by one while [`Self::streams`].
    pub(crate) fn put_streaming(&self, which: usize, at: usize, data: &[u8]) {
        self.write_own(which, at, data, true);
    }

    /// `data` into this rank's slot `which` at byte `at`, with non-temporal stores when
    /// `streaming`.
    fn write_own(&self, which: usize, at: usize, data: &[u8], streaming: bool) {
        assert!(at + data.len() <= SLOT_BYTES, "a round overflows its slot");
        let dst = self.slot(self.rank, which).wrapping_add(at);
        // SAFETY: this rank's own slot, in bounds (checked above); the caller does not
        // write a range a peer may be reading.
        unsafe {
            if streaming {
                copy_streaming(dst, data)
            } else {
                copy_vectors(dst, data)
            }
        }
    }

    /// Publishes this rank's next sequence number and waits until every rank has
    /// published it: everything any rank wrote before its `sync` is visible to all after
    /// theirs. A typed [`Error::Timeout`] when a peer does not arrive within the timeout,
    /// [`Error::PeerFailed`] when the transport knows it failed.
    pub(crate) fn sync(&self) -> Result<()> {
        let seq = self.published.get().wrapping_add(1);
        self.published.set(seq);
        // Sequentially consistent with the sleepers' count (and theirs with the flag), so
        // that either this rank sees a sleeper and wakes it, or the sleeper sees the flag.
        self.flag(self.rank).store(seq, Ordering::SeqCst);
        if self.sleepers(self.rank).load(Ordering::SeqCst) > 0 {
            futex::wake_all(self.flag(self.rank));
        }
        // Read the clock only once a wait outlasts its spins: a call of a few µs spent
        // 7 % of its samples (perf) in `clock_gettime` when every sync read it.
        let mut start = None;
        for r in (0..self.size()).filter(|&r| r != self.rank) {
            self.wait_for(r, seq, &mut start)?;
        }
        Ok(())
    }

    /// Waits until rank `r` has published `seq` (flags wrap; peers are never more than a
    /// few rounds apart). `start`: when this synchronisation's first wait ran out of spins
    /// (set here if none has yet), from which the polling and the timeout count.
    fn wait_for(&self, r: usize, seq: u32, start: &mut Option<Instant>) -> Result<()> {
        let flag = self.flag(r);
        let reached = |v: u32| v.wrapping_sub(seq) as i32 >= 0;
        for spin in 1..=self.spins {
            if reached(flag.load(Ordering::Acquire)) {
                return Ok(());
            }
            if spin % SPINS_PER_PROGRESS == 0 {
                self.drive_progress();
            }
            std::hint::spin_loop();
        }
        let start = *start.get_or_insert_with(Instant::now);
        while start.elapsed() < POLL_FOR {
            if reached(flag.load(Ordering::Acquire)) {
                return Ok(());
            }
            self.drive_progress();
            std::thread::yield_now();
        }
        let sleepers = self.sleepers(r);
        sleepers.fetch_add(1, Ordering::SeqCst);
        let out = loop {
            let v = flag.load(Ordering::SeqCst);
            if reached(v) {
                break Ok(());
            }
            if let Some(failed) = self.failed.as_ref().and_then(|f| f()) {
                break Err(Error::PeerFailed {
                    rank: self.rank,
                    failed,
                });
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                break Err(Error::Timeout {
                    rank: self.rank,
                    src: r,
                    tag: TAG_SHARED_MEMORY,
                    waited,
                });
            }
            self.drive_progress();
            futex::wait(flag, v, SLEEP_SLICE);
        };
        sleepers.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

/// Copies below this many bytes go through `copy_from_slice`: glibc's `memcpy` copies
/// them with vector moves too, and switches to `rep movsb` only from a few KiB (4 KiB on
/// an AVX2 machine).
const VECTOR_COPY_BYTES: usize = 1 << 10;

/// `dst = src` for the copies into and out of the slots. Why not `copy_from_slice`: from a
/// few KiB glibc's `memcpy` copies with `rep movsb`, which on this project's 2-vCPU AMD
/// EPYC (Zen 3) VM ran slow whenever source and destination sat at different offsets in a
/// 64-byte line, as a slot (page-aligned) and a `Vec` of the caller's (16 bytes past a
/// page for a large `malloc`) do. The shared-memory all-reduce of 256 KiB at P = 2 took
/// 161 µs on such a buffer and 20 µs with `rep movsb` turned off
/// (`GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold`), and 31 against 20 µs on a
/// page-aligned one.
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    // SAFETY: `dst` is valid for its length, equal to `src`'s; a `&mut` and a `&` slice
    // do not overlap.
    unsafe { copy_vectors(dst.as_mut_ptr(), src) }
}

/// [`copy`] with non-temporal stores: for a destination too large to stay in the cache,
/// whose lines a plain store would first read from memory.
pub(crate) fn copy_streaming_to(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    // SAFETY: as in `copy`.
    unsafe { copy_streaming(dst.as_mut_ptr(), src) }
}

/// [`copy`] of `f32` slices.
pub(crate) fn copy_f32(dst: &mut [f32], src: &[f32]) {
    copy(bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src));
}

/// `dst[..src.len()] = src` with 16-byte vector loads and stores (SSE2, every x86-64
/// CPU), four per step: the 64-byte stride keeps LLVM from turning the loop back into a
/// `memcpy` call (see [`copy`]).
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
unsafe fn copy_vectors(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= VECTOR_COPY_BYTES {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_store_si128};
        // SAFETY: the caller's contract; `copy_in_parts` hands over whole 64-byte blocks
        // whose stores are 16-byte aligned.
        unsafe {
            copy_in_parts(dst, src, 64, |s, d| {
                let (s, d) = (s as *const __m128i, d as *mut __m128i);
                let v = [
                    _mm_loadu_si128(s),
                    _mm_loadu_si128(s.add(1)),
                    _mm_loadu_si128(s.add(2)),
                    _mm_loadu_si128(s.add(3)),
                ];
                _mm_store_si128(d, v[0]);
                _mm_store_si128(d.add(1), v[1]);
                _mm_store_si128(d.add(2), v[2]);
                _mm_store_si128(d.add(3), v[3]);
            })
        };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
}

/// `dst[..src.len()] = src` with non-temporal stores (SSE2, every x86-64 CPU) for the
/// 16-byte aligned middle, fenced so that the data is visible before the next flag store;
/// a plain copy elsewhere.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
unsafe fn copy_streaming(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // SAFETY: the caller's contract; the stream stores are to 16-byte aligned
        // addresses.
        unsafe {
            copy_in_parts(dst, src, 16, |s, d| {
                _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i))
            });
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    }
}

/// `dst[..src.len()] = src` in three parts: a plain copy up to the first 16-byte aligned
/// byte of `dst`, `block(from, to)` for each whole block of `step` bytes after it (`to`
/// 16-byte aligned), and a plain copy of the rest.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`; `block` must
/// read and write only its `step` bytes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn copy_in_parts(
    dst: *mut u8,
    src: &[u8],
    step: usize,
    mut block: impl FnMut(*const u8, *mut u8),
) {
    let len = src.len();
    let head = dst.align_offset(16).min(len);
    let end = head + (len - head) / step * step;
    // SAFETY: every access is inside `src` / `dst` (the caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
        let mut i = head;
        while i < end {
            block(src.as_ptr().add(i), dst.add(i));
            i += step;
        }
        std::ptr::copy_nonoverlapping(src.as_ptr().add(end), dst.add(end), len - end);
    }
}

/// Cores of this machine that are online (not this process's affinity: MPI launchers bind
/// each rank to one core).
fn online_cores() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        if n > 0 {
            return n as usize;
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Sleeping on a flag shared between processes until it changes.
mod futex {
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    /// Sleeps while `flag` holds `seen`, at most `limit` (spurious returns are fine: the
    /// caller polls again).
    #[cfg(target_os = "linux")]
    pub(super) fn wait(flag: &AtomicU32, seen: u32, limit: Duration) {
        let ts = libc::timespec {
            tv_sec: limit.as_secs() as libc::time_t,
            tv_nsec: limit.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on a valid, aligned 32-bit word (shared, hence not the
        // private variant) with a relative timeout; it only reads the word.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                flag.as_ptr(),
                libc::FUTEX_WAIT,
                seen,
                &ts as *const libc::timespec,
            );
        }
    }

    /// Wakes every rank sleeping on `flag`.
    #[cfg(target_os = "linux")]
    pub(super) fn wake_all(flag: &AtomicU32) {
        // SAFETY: FUTEX_WAKE on a valid, aligned 32-bit word.
        unsafe {
            libc::syscall(libc::SYS_futex, flag.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
        }
    }

    /// Elsewhere: yield and poll again.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn wait(_: &AtomicU32, _: u32, _: Duration) {
        std::thread::yield_now();
    }

    /// Elsewhere: nothing sleeps in the kernel.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn wake_all(_: &AtomicU32) {}
}

/// A POSIX shared-memory object (`shm_open`, on Linux a tmpfs file under `/dev/shm`)
/// mapped into this process: the memory of the regions of a group of processes on one
/// machine. Not `MPI_Win_allocate_shared`: Open MPI backs that window with a file in its
/// session directory, under `/tmp`, and where `/tmp` is a disk file system the kernel's
/// write-back of the dirty pages every few seconds makes each next write to a page fault
/// again; a shared-memory all-gather then ran at 1.7 GB/s instead of 6–13 GB/s, in bursts.
#[cfg(feature = "mpi")]
pub(crate) struct SharedMapping {
    ptr: *mut u8,
    len: usize,
    /// The object's descriptor, kept to reserve pages ([`SharedMapping::reserve`]).
    fd: libc::c_int,
}

// SAFETY: a plain mapping and descriptor, released once, by their owner.
#[cfg(feature = "mpi")]
unsafe impl Send for SharedMapping {}

#[cfg(feature = "mpi")]
impl SharedMapping {
    /// Creates the object `name` (`/` and a name without another `/`), `len` bytes of
    /// zeros, and maps it. The object exists until [`SharedMapping::unlink`], so that the
    /// other processes can open it.
    pub(crate) fn create(name: &str, len: usize) -> std::io::Result<SharedMapping> {
        let cname = std::ffi::CString::new(name)?;
        // SAFETY: a valid C string; the flags create a new object readable by this user.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor this function owns; the length fits an off_t.
        let sized = if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        };
        let mapped = sized.and_then(|()| Self::map(fd, len));
        if mapped.is_err() {
            // SAFETY: the descriptor is this function's to close (`map` failed).
            unsafe { libc::close(fd) };
            Self::unlink(name);
        }
        mapped
    }

    /// Maps the object `name` that another process created, `len` bytes.
    pub(crate) fn open(name: &str, len: usize) -> std::io::Result<SharedMapping> {
        let cname = std::ffi::CString::new(name)?;
        // SAFETY: a valid C string; opens an existing object.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mapped = Self::map(fd, len);
        if mapped.is_err() {
            // SAFETY: the descriptor is this function's to close (`map` failed).
            unsafe { libc::close(fd) };
        }
        mapped
    }

    /// Maps `len` bytes of `fd` shared; the mapping owns `fd` from then on.
    fn map(fd: libc::c_int, len: usize) -> std::io::Result<SharedMapping> {
        // SAFETY: a fresh mapping of an open descriptor; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedMapping {
            ptr: ptr.cast(),
            len,
            fd,
        })
    }

    /// Allocates the pages of bytes `offset..offset + len` now, by the calling process:
    /// a full `/dev/shm` is an error here rather than a `SIGBUS` at a later write, and
    /// each rank reserving its own region puts its pages on its own NUMA node.
    pub(crate) fn reserve(&self, offset: usize, len: usize) -> std::io::Result<()> {
        // SAFETY: an open descriptor of this mapping's object; the range lies inside it.
        match unsafe { libc::posix_fallocate(self.fd, offset as libc::off_t, len as libc::off_t) } {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    }

    /// Removes the name `name` (the memory lives on while some process maps it).
    pub(crate) fn unlink(name: &str) {
        if let Ok(cname) = std::ffi::CString::new(name) {
            // SAFETY: a valid C string.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
        }
    }

    /// Start of the mapping (page-aligned).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

#[cfg(feature = "mpi")]
impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping and descriptor made in `map`, released once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
            libc::close(self.fd);
        }
    }
}

/// Page-aligned, zeroed heap memory for the regions of an in-process group (threads).
pub(crate) struct HeapRegions {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: plain heap memory, freed once by the last owner.
unsafe impl Send for HeapRegions {}
unsafe impl Sync for HeapRegions {}

impl HeapRegions {
    /// Regions for `ranks` ranks, or `None` when the allocation fails or overflows.
    pub(crate) fn new(ranks: usize) -> Option<std::sync::Arc<HeapRegions>> {
        let bytes = REGION_BYTES.checked_mul(ranks.max(1))?;
        let layout = std::alloc::Layout::from_size_align(bytes, 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then(|| std::sync::Arc::new(HeapRegions { ptr, layout }))
    }

    /// Start of rank `r`'s region.
    pub(crate) fn region(&self, r: usize) -> *mut u8 {
        // SAFETY: callers ask for ranks of the group the memory was sized for.
        unsafe { self.ptr.add(r * REGION_BYTES) }
    }
}

impl Drop for HeapRegions {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copy_matches_a_plain_copy_at_every_alignment() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8).collect();
        for offset in 0..17 {
            for len in [0, 1, 15, 16, 17, 31, 64, 100, 283] {
                let mut dst = vec![0xAAu8; 320];
                // SAFETY: offset + len ≤ 300 < 320 bytes of `dst`, distinct from `src`.
                unsafe { copy_streaming(dst.as_mut_ptr().add(offset), &src[..len]) };
                assert_eq!(&dst[offset..offset + len], &src[..len], "{offset} {len}");
                assert!(dst[..offset].iter().all(|&b| b == 0xAA));
                assert!(dst[offset + len..].iter().all(|&b| b == 0xAA));
            }
        }
    }

    #[test]
    fn vector_copy_matches_a_plain_copy_at_every_alignment() {
        let n = 3 * VECTOR_COPY_BYTES;
        let src: Vec<u8> = (0..n as u32 + 64).map(|i| (i * 37 % 251) as u8).collect();
        let lens = [
            0,
            1,
            63,
            VECTOR_COPY_BYTES - 1,
            VECTOR_COPY_BYTES,
            VECTOR_COPY_BYTES + 17,
        ];
        for (from, to) in (0..17).flat_map(|f| [(f, 0), (0, f), (f, 16 - f.min(16))]) {
            for len in lens.into_iter().chain([n - 5, n]) {
                let mut dst = vec![0xAAu8; n + 64];
                copy(&mut dst[to..to + len], &src[from..from + len]);
                assert_eq!(
                    &dst[to..to + len],
                    &src[from..from + len],
                    "{from} {to} {len}"
                );
                assert!(dst[..to].iter().all(|&b| b == 0xAA));
                assert!(dst[to + len..].iter().all(|&b| b == 0xAA));
            }
        }
        let mut out = vec![0f32; 1000];
        let src: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        copy_f32(&mut out, &src);
        assert_eq!(out, src);
    }

    #[test]
    fn slow_plain_writes_switch_to_streaming_and_a_fast_probe_switches_back() {
        let policy = StorePolicy::default();
        let (bytes, fast, slow) = (1 << 20, 1e-5, 1e-3);
        assert!(!policy.stream_next());
        // One slow write (a preemption) is not enough.
        policy.observe(bytes, slow);
        assert!(!policy.stream_next());
        policy.observe(bytes, fast);
        policy.observe(bytes, slow);
        assert!(!policy.stream_next());
        policy.observe(bytes, slow);
        // Streaming now, with a plain probe after PROBE_FIRST timed writes, then after
        // twice as many for every slow probe, up to PROBE_AT_MOST.
        let mut gaps = Vec::new();
        for _ in 0..7 {
            let streamed = (0..).take_while(|_| policy.stream_next()).count() as u32;
            gaps.push(streamed + 1);
            policy.observe(bytes, slow);
        }
        assert_eq!(gaps, [8, 16, 32, 64, 128, 128, 128]);
        assert_eq!(PROBE_FIRST, 8);
        assert_eq!(PROBE_AT_MOST, 128);
        // A slow probe keeps it streaming; a fast one ends it.
        policy.observe(bytes, slow);
        assert!(policy.stream_next());
        policy.observe(bytes, fast);
        assert!(!policy.stream_next());
    }
}
