//! The transport contract, [`Communicator`], and its backends.
//!
//! A communicator is a group of `size` ranks that exchange variable-length byte messages
//! matched by (source, tag), in order per (source, tag) like MPI. **Sends are buffered**:
//! `send` returns once the data is copied out and never waits for the receiver, so any
//! pattern of sends followed by receives is deadlock-free on every backend.

use bytemuck::Pod;

use crate::{Error, Result};

pub mod launcher;
pub mod nodes;
pub mod peer_memory;
pub mod shm;
pub mod sim;
pub mod tap;
pub mod thread;
/// Used by the MPI transport only; built always so its unit test runs without MPI.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
mod watchdog;

#[cfg(feature = "mpi")]
pub mod mpi;

#[cfg(feature = "nccl")]
pub mod nccl;

/// A message tag. User code uses `0..=MAX_USER_TAG`; the rest is reserved for transports.
pub type Tag = u32;

/// Largest tag available to user code and algorithms. Tags above it, up to 32767 (the
/// smallest `MPI_TAG_UB` the MPI standard allows), are reserved for the transports.
pub const MAX_USER_TAG: Tag = 0x6FFE;

/// The one tag above [`MAX_USER_TAG`] that base transports accept: wrapping communicators
/// (such as [`sim::SimComm`]) use it for their own traffic over the transport they wrap.
pub(crate) const WRAPPER_TAG: Tag = MAX_USER_TAG + 1;

/// Reserved tag used by the transports' own barrier.
pub(crate) const TAG_BARRIER: Tag = 0x7F00;
/// Reserved tag used by the transports' own split.
pub(crate) const TAG_SPLIT: Tag = 0x7F01;

/// A group of ranks exchanging tagged byte messages. See the module docs for the ordering
/// and buffering guarantees every backend gives.
pub trait Communicator: Send {
    /// This rank's index, `0..size`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn size(&self) -> usize;

    /// Sends `data` to `dest` with `tag`. Buffered: returns without waiting for the receiver.
    fn send(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()>;

    /// Receives the next message from `src` with `tag`, of any length (including 0).
    fn recv(&self, src: usize, tag: Tag) -> Result<Vec<u8>>;

    /// Receives the next message from `src` with `tag` into `buf`; returns its length.
    /// A message longer than `buf` is [`Error::MessageTooLarge`].
    fn recv_into(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        let msg = self.recv(src, tag)?;
        copy_into(self.rank(), src, tag, &msg, buf)
    }

    /// Sends to `dest` and receives from `src` as one step (a "round").
    fn sendrecv(&self, dest: usize, st: Tag, data: &[u8], src: usize, rt: Tag) -> Result<Vec<u8>> {
        self.send(dest, st, data)?;
        self.recv(src, rt)
    }

    /// Like [`sendrecv`](Self::sendrecv), receiving into a fixed buffer; returns the length.
    /// The default copies what [`sendrecv`](Self::sendrecv) returned.
    fn sendrecv_into(
        &self,
        dest: usize,
        st: Tag,
        data: &[u8],
        src: usize,
        rt: Tag,
        buf: &mut [u8],
    ) -> Result<usize> {
        let msg = self.sendrecv(dest, st, data, src, rt)?;
        copy_into(self.rank(), src, rt, &msg, buf)
    }

    /// [`recv_into`](Self::recv_into) of a message whose length the ranks have agreed on
    /// (the steps of a dense collective's plan): a transport may post the receive before
    /// the message arrives (MPI: `MPI_Irecv`, no probe and no unexpected-message copy).
    /// A shorter message still returns its length; a **longer** one may end the job
    /// (MPI reports `MPI_ERR_TRUNCATE`) instead of returning
    /// [`crate::Error::MessageTooLarge`], which is why only agreed
    /// lengths come here. The default is [`recv_into`](Self::recv_into).
    fn recv_agreed_into(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        self.recv_into(src, tag, buf)
    }

    /// [`sendrecv_into`](Self::sendrecv_into) with the receive of
    /// [`recv_agreed_into`](Self::recv_agreed_into). The default is
    /// [`sendrecv_into`](Self::sendrecv_into).
    fn sendrecv_agreed_into(
        &self,
        dest: usize,
        st: Tag,
        data: &[u8],
        src: usize,
        rt: Tag,
        buf: &mut [u8],
    ) -> Result<usize> {
        self.sendrecv_into(dest, st, data, src, rt, buf)
    }

    /// Splits into sub-communicators: ranks with the same `color` form one, ordered by
    /// (`key`, rank in this communicator), as `MPI_Comm_split`. Collective over all ranks.
    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Communicator>>;

    /// Waits until every rank has entered the barrier.
    fn barrier(&self) -> Result<()>;

    /// [`barrier`](Self::barrier) for a wait expected to be long (ranks waiting while one
    /// works alone, as in a calibration's local sweeps): a transport whose barrier polls
    /// may sleep between polls instead, leaving the cores to the rank at work. The default
    /// is `barrier`.
    fn barrier_idle(&self) -> Result<()> {
        self.barrier()
    }

    /// Short name of the backend (`"thread"`, `"mpi"`, `"sim(thread)"`).
    fn backend(&self) -> String;

    /// Which machine (shared-memory node) this rank runs on: ranks with the same id share
    /// one, so hierarchical algorithms (HiTopKComm, the 2D torus) can take their node
    /// structure from the transport instead of a guess. `None`: the transport does not know
    /// (see [`nodes::ranks_per_node`] for how callers resolve it).
    fn node(&self) -> Option<u64> {
        None
    }

    /// The collectives of the library under this transport (MPI's own), when it has them:
    /// what the `Library` algorithm of the dense collectives calls, so that the automatic
    /// choice can rank the library beside our algorithms. `None` (the default) for
    /// transports whose traffic must go through `send` and `recv`: threads, the simulator
    /// (it times what passes through it) and the tap (it counts it).
    fn library(&self) -> Option<&dyn LibraryCollectives> {
        None
    }

    /// Memory every rank of this communicator reads and writes directly, when they all
    /// run on one machine and the transport set it up (the world communicators of the
    /// thread and MPI transports): what the `SharedMemory` algorithm of the dense
    /// collectives moves data through. `None` (the default) for transports whose traffic
    /// must go through `send` and `recv` (the simulator, the tap) and for groups that
    /// span machines.
    fn shared_segment(&self) -> Option<&shm::SharedSegment> {
        None
    }

    /// Reports a collective that moved data past `send` and `recv` (the library's own, or
    /// the shared segment's): `sent` and `received` bytes per rank, those of the ring
    /// algorithm that moves the same data. A no-op except for taps that count traffic
    /// ([`tap::Tap::sees_collectives`]).
    fn record_collective(&self, _sent: usize, _received: usize) {}
}

/// A transport library's own dense collectives, blocking and collective over all ranks of
/// the communicator. The callers in [`crate::dense`] have checked the shapes (and, with
/// [`crate::dense::DenseOptions::check`], that the ranks agree on them); an implementation returns a typed error for what its library cannot take (MPI:
/// counts above `i32::MAX`).
pub trait LibraryCollectives {
    /// Sums `buf` over all ranks in place.
    fn allreduce_f32(&self, buf: &mut [f32]) -> Result<()>;

    /// Every rank's block into `out` in rank order: rank r contributes `counts[r]` bytes
    /// (this rank's block is `mine`), and `out` holds their sum.
    fn allgatherv_bytes(&self, mine: &[u8], out: &mut [u8], counts: &[usize]) -> Result<()>;

    /// [`allgatherv_bytes`](Self::allgatherv_bytes) with every rank's block the length of
    /// `mine` (`out` holds P of them).
    fn allgather_bytes(&self, mine: &[u8], out: &mut [u8]) -> Result<()>;

    /// Sums `buf` over all ranks and leaves this rank's block of the sum in its place in
    /// `buf`: rank r's block is the `counts[r]` elements after the blocks of the ranks
    /// before it. The rest of `buf` is left as it was.
    fn reduce_scatter_f32(&self, buf: &mut [f32], counts: &[usize]) -> Result<()>;
}

/// `impl Communicator` for a type that only hands every call to the communicator `$inner`
/// (an expression of `$s`, the `&self`).
macro_rules! forward_communicator {
    (impl[$($g:tt)*] $t:ty, |$s:ident| $inner:expr) => {
        impl<$($g)*> $crate::Communicator for $t {
            fn rank(&self) -> usize {
                let $s = self;
                $inner.rank()
            }
            fn size(&self) -> usize {
                let $s = self;
                $inner.size()
            }
            fn send(&self, dest: usize, tag: $crate::Tag, data: &[u8]) -> $crate::Result<()> {
                let $s = self;
                $inner.send(dest, tag, data)
            }
            fn recv(&self, src: usize, tag: $crate::Tag) -> $crate::Result<Vec<u8>> {
                let $s = self;
                $inner.recv(src, tag)
            }
            fn recv_into(&self, src: usize, tag: $crate::Tag, buf: &mut [u8]) -> $crate::Result<usize> {
                let $s = self;
                $inner.recv_into(src, tag, buf)
            }
            fn sendrecv(
                &self,
                d: usize,
                st: $crate::Tag,
                data: &[u8],
                s: usize,
                rt: $crate::Tag,
            ) -> $crate::Result<Vec<u8>> {
                let $s = self;
                $inner.sendrecv(d, st, data, s, rt)
            }
            fn sendrecv_into(
                &self,
                d: usize,
                st: $crate::Tag,
                data: &[u8],
                s: usize,
                rt: $crate::Tag,
                buf: &mut [u8],
            ) -> $crate::Result<usize> {
                let $s = self;
                $inner.sendrecv_into(d, st, data, s, rt, buf)
            }
            fn recv_agreed_into(
                &self,
                src: usize,
                tag: $crate::Tag,
                buf: &mut [u8],
            ) -> $crate::Result<usize> {
                let $s = self;
                $inner.recv_agreed_into(src, tag, buf)
            }
            fn sendrecv_agreed_into(
                &self,
                d: usize,
                st: $crate::Tag,
                data: &[u8],
                s: usize,
                rt: $crate::Tag,
                buf: &mut [u8],
            ) -> $crate::Result<usize> {
                let $s = self;
                $inner.sendrecv_agreed_into(d, st, data, s, rt, buf)
            }
            fn split(&self, color: u32, key: u32) -> $crate::Result<Box<dyn $crate::Communicator>> {
                let $s = self;
                $inner.split(color, key)
            }
            fn barrier(&self) -> $crate::Result<()> {
                let $s = self;
                $inner.barrier()
            }
            fn barrier_idle(&self) -> $crate::Result<()> {
                let $s = self;
                $inner.barrier_idle()
            }
            fn backend(&self) -> String {
                let $s = self;
                $inner.backend()
            }
            fn node(&self) -> Option<u64> {
                let $s = self;
                $inner.node()
            }
            fn library(&self) -> Option<&dyn $crate::comm::LibraryCollectives> {
                let $s = self;
                $inner.library()
            }
            fn shared_segment(&self) -> Option<&$crate::comm::shm::SharedSegment> {
                let $s = self;
                $inner.shared_segment()
            }
            fn record_collective(&self, sent: usize, received: usize) {
                let $s = self;
                $inner.record_collective(sent, received)
            }
        }
    };
}
pub(crate) use forward_communicator;

forward_communicator!(impl[C: Communicator + ?Sized] Box<C>, |s| (**s));

/// Typed helpers over any communicator, through `bytemuck` (`f32`, `u32`, `f16`, `bf16`, ...).
pub trait CommExt: Communicator {
    /// Sends a slice of plain-old-data values.
    fn send_slice<T: Pod>(&self, dest: usize, tag: Tag, data: &[T]) -> Result<()> {
        self.send(dest, tag, bytemuck::cast_slice(data))
    }

    /// Receives a message as a vector of `T`; its length must be a multiple of `T`'s size.
    fn recv_vec<T: Pod>(&self, src: usize, tag: Tag) -> Result<Vec<T>> {
        let msg = self.recv(src, tag)?;
        bytes_to_vec(self.rank(), src, tag, &msg)
    }

    /// Receives into a typed buffer; returns the number of elements received.
    fn recv_slice_into<T: Pod>(&self, src: usize, tag: Tag, buf: &mut [T]) -> Result<usize> {
        let n = self.recv_into(src, tag, bytemuck::cast_slice_mut(buf))?;
        elems(self.rank(), src, tag, n, std::mem::size_of::<T>())
    }

    /// Send-receive of typed slices, receiving a vector of any length.
    fn sendrecv_vec<T: Pod>(
        &self,
        dest: usize,
        st: Tag,
        data: &[T],
        src: usize,
        rt: Tag,
    ) -> Result<Vec<T>> {
        let msg = self.sendrecv(dest, st, bytemuck::cast_slice(data), src, rt)?;
        bytes_to_vec(self.rank(), src, rt, &msg)
    }

    /// Send-receive of typed slices into a fixed buffer; returns elements received.
    fn sendrecv_slice_into<T: Pod>(
        &self,
        dest: usize,
        st: Tag,
        data: &[T],
        src: usize,
        rt: Tag,
        buf: &mut [T],
    ) -> Result<usize> {
        let n = self.sendrecv_into(
            dest,
            st,
            bytemuck::cast_slice(data),
            src,
            rt,
            bytemuck::cast_slice_mut(buf),
        )?;
        elems(self.rank(), src, rt, n, std::mem::size_of::<T>())
    }
}

impl<C: Communicator + ?Sized> CommExt for C {}

/// Checks a user tag: in range and not reserved.
pub fn check_tag(tag: Tag) -> Result<()> {
    if tag <= MAX_USER_TAG {
        Ok(())
    } else {
        Err(Error::ReservedTag {
            tag,
            max: MAX_USER_TAG,
        })
    }
}

/// Checks a tag at a base transport: user tags plus the wrapper tag.
pub(crate) fn check_transport_tag(tag: Tag) -> Result<()> {
    if tag == WRAPPER_TAG {
        Ok(())
    } else {
        check_tag(tag)
    }
}

/// Checks a peer rank against the communicator size.
pub fn check_rank(rank: usize, size: usize) -> Result<()> {
    if rank < size {
        Ok(())
    } else {
        Err(Error::InvalidRank { rank, size })
    }
}

/// Copies a received message into a fixed buffer, or reports it does not fit.
pub(crate) fn copy_into(
    rank: usize,
    src: usize,
    tag: Tag,
    msg: &[u8],
    buf: &mut [u8],
) -> Result<usize> {
    if msg.len() > buf.len() {
        return Err(Error::MessageTooLarge {
            rank,
            src,
            tag,
            len: msg.len(),
            capacity: buf.len(),
        });
    }
    buf[..msg.len()].copy_from_slice(msg);
    Ok(msg.len())
}

fn elems(rank: usize, src: usize, tag: Tag, bytes: usize, elem: usize) -> Result<usize> {
    if elem == 0 || bytes % elem != 0 {
        return Err(Error::MisalignedMessage {
            rank,
            src,
            tag,
            len: bytes,
            elem,
        });
    }
    Ok(bytes / elem)
}

fn bytes_to_vec<T: Pod>(rank: usize, src: usize, tag: Tag, msg: &[u8]) -> Result<Vec<T>> {
    elems(rank, src, tag, msg.len(), std::mem::size_of::<T>())?;
    Ok(bytemuck::pod_collect_to_vec(msg))
}

/// Members of a split, as `MPI_Comm_split` orders them: for each rank of the parent, its
/// (color, key); returns the parent ranks that share `color`, sorted by (key, parent rank).
pub(crate) fn split_members(all: &[(u32, u32)], color: u32) -> Vec<usize> {
    let mut members: Vec<usize> = (0..all.len()).filter(|&r| all[r].0 == color).collect();
    members.sort_by_key(|&r| (all[r].1, r));
    members
}

/// Exchanges every rank's (color, key) over reserved tags: each rank sends its pair to
/// every other rank, so the result is the same everywhere.
pub(crate) fn exchange_color_keys<C: Communicator + ?Sized>(
    comm: &C,
    color: u32,
    key: u32,
    send_raw: impl Fn(usize, &[u8]) -> Result<()>,
    recv_raw: impl Fn(usize) -> Result<Vec<u8>>,
) -> Result<Vec<(u32, u32)>> {
    let me = comm.rank();
    let mut mine = [0u8; 8];
    mine[..4].copy_from_slice(&color.to_le_bytes());
    mine[4..].copy_from_slice(&key.to_le_bytes());
    for r in 0..comm.size() {
        if r != me {
            send_raw(r, &mine)?;
        }
    }
    let mut all = vec![(0u32, 0u32); comm.size()];
    all[me] = (color, key);
    for (r, slot) in all.iter_mut().enumerate() {
        if r != me {
            let m = recv_raw(r)?;
            if m.len() != 8 {
                return Err(Error::InvalidArgument(format!(
                    "split message from rank {r} has {} bytes",
                    m.len()
                )));
            }
            *slot = (
                u32::from_le_bytes(m[..4].try_into().expect("4 bytes")),
                u32::from_le_bytes(m[4..].try_into().expect("4 bytes")),
            );
        }
    }
    Ok(all)
}
