//! [`SharedSegment`]: memory that every rank of a communicator reads and writes directly,
//! when all of them run on one machine (threads of one process, or MPI processes of one
//! node through `MPI_Win_allocate_shared`).
//!
//! The `SharedMemory` dense collectives ([`crate::dense::shared_memory`]) move data through
//! it with plain loads and stores and synchronise with one flag per rank, instead of
//! passing messages: a small all-reduce is one copy in, one flag exchange and one
//! reduction, where a message-passing library makes log₂ P round trips through its
//! transport's queues.
//!
//! Layout: one region per rank, a header (the rank's sequence flag, on its own page) and
//! two slots of [`SLOT_BYTES`]. A rank only writes its own region. Each synchronisation
//! ([`SharedSegment::sync`]) publishes the rank's next sequence number and waits until every
//! rank has published it, so that what was written before is visible after. Successive
//! rounds alternate between the two slots: a rank rewrites a slot only after every rank has
//! passed the next round's synchronisation, by which time all of them are done reading it.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Bytes of each of a rank's two slots: the most one round of a shared-memory collective
/// moves per rank (larger buffers go in several rounds).
pub const SLOT_BYTES: usize = 1 << 20;

/// Bytes before a region's slots: the sequence flag, alone on its page so that polling it
/// never contends with data.
const HEADER_BYTES: usize = 4096;

/// Bytes of one rank's region (header and two slots); a multiple of the page size.
pub const REGION_BYTES: usize = HEADER_BYTES + 2 * SLOT_BYTES;

/// The reserved tag a [`Error::Timeout`] of a shared-memory wait names.
pub const TAG_SHARED_MEMORY: u32 = 0x7F02;

/// Failed polls of a peer's flag before each further poll also yields the core, so that a
/// rank sharing its core with the one it waits for lets it run.
const SPINS_BEFORE_YIELD: u32 = 200;

/// How long a wait yields between polls before it sleeps between them instead: yielding
/// hands the core only to threads ready to run, and when many ranks wait on few cores the
/// one they wait for still gets a small share.
const YIELD_FOR: Duration = Duration::from_millis(1);

/// Sleep between polls of a wait longer than [`YIELD_FOR`].
const POLL_SLEEP: Duration = Duration::from_micros(20);

/// Tells a waiting rank that a peer has failed (its rank), so that it stops early.
pub type PeerFailure = Box<dyn Fn() -> Option<usize> + Send>;

/// One rank's view of a shared segment. See the module docs.
pub struct SharedSegment {
    /// Start of every rank's region, in rank order (this process's addresses).
    regions: Vec<*mut u8>,
    rank: usize,
    /// The last sequence number this rank published.
    published: Cell<u64>,
    /// Rounds started, whose parity picks the slot.
    rounds: Cell<u64>,
    timeout: Duration,
    failed: Option<PeerFailure>,
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
        SharedSegment {
            regions,
            rank,
            published: Cell::new(0),
            rounds: Cell::new(0),
            timeout,
            failed,
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

    fn flag(&self, r: usize) -> &AtomicU64 {
        // SAFETY: the header of every region is valid for the segment's life, 8-aligned
        // (the region is page-aligned) and only ever accessed atomically.
        unsafe { &*(self.regions[r] as *const AtomicU64) }
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

    /// Publishes this rank's next sequence number and waits until every rank has
    /// published it: everything any rank wrote before its `sync` is visible to all after
    /// theirs. A typed [`Error::Timeout`] when a peer does not arrive within the timeout,
    /// [`Error::PeerFailed`] when the transport knows it failed.
    pub(crate) fn sync(&self) -> Result<()> {
        let seq = self.published.get() + 1;
        self.published.set(seq);
        self.flag(self.rank).store(seq, Ordering::Release);
        let start = Instant::now();
        for r in 0..self.size() {
            let mut spins = 0u32;
            while self.flag(r).load(Ordering::Acquire) < seq {
                spins += 1;
                if spins < SPINS_BEFORE_YIELD {
                    std::hint::spin_loop();
                    continue;
                }
                if start.elapsed() < YIELD_FOR {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(POLL_SLEEP);
                }
                if spins % 64 == 0 {
                    if let Some(failed) = self.failed.as_ref().and_then(|f| f()) {
                        return Err(Error::PeerFailed {
                            rank: self.rank,
                            failed,
                        });
                    }
                    let waited = start.elapsed();
                    if waited >= self.timeout {
                        return Err(Error::Timeout {
                            rank: self.rank,
                            src: r,
                            tag: TAG_SHARED_MEMORY,
                            waited,
                        });
                    }
                }
            }
        }
        Ok(())
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
