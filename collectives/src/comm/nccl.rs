//! [`NcclComm`]: NVIDIA NCCL collectives on GPU buffers (feature `nccl`, through cudarc).
//!
//! NCCL is collective-only and works on device memory, so `NcclComm` does **not** implement
//! the byte-message [`Communicator`] trait. Instead it is bootstrapped *from* any
//! communicator: rank 0 creates the NCCL unique id and sends its 128 bytes to every rank
//! over the host transport. That works with [`crate::ThreadComm`] (one process driving
//! several GPUs, one thread per rank) and with `MpiComm` (one process per GPU).
//!
//! Every collective first agrees over a private split of the host communicator on the
//! operation, the element type, the lengths and the root, and on whether every rank's
//! arguments are valid; a disagreement is a typed error on every rank instead of an NCCL
//! hang. [`NcclComm::set_checked`] turns that host round off for hot loops.
//!
//! Point-to-point: [`NcclComm::send_recv`] issues any set of `ncclSend`/`ncclRecv` inside
//! one NCCL group (so a ring step or an all-to-all cannot deadlock), after the ranks agree
//! that every send has a matching receive of the same length. On top of it and of grouped
//! `ncclReduce`, [`NcclComm::reduce_scatter_v`] and [`NcclComm::allgather_v`] take uneven
//! blocks (`block_range(d, P, i)`), the two intra-node steps HiTopKComm (Shi et al., MLSys
//! 2021, Algorithm 2) runs on NCCL, so they can run on device buffers.
//!
//! Code that needs a GPU calls [`NcclComm::probe`] first: `CudaContext::new` panics when
//! libcuda is missing, and the probe returns a typed error instead.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr, DeviceSlice,
};
use cudarc::nccl::{result as nccl_result, Comm, Id, NcclType, ReduceOp};

use crate::{Communicator, Error, Result};

/// Length in bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
const ID_BYTES: usize = 128;

/// Tag used on the private host communicator (nobody else uses that communicator).
const TAG_SETUP: u32 = 0;
/// Tag of the per-collective argument agreement.
const TAG_CHECK: u32 = 1;
/// Tag of the point-to-point agreement.
const TAG_P2P: u32 = 2;

/// Operation codes exchanged by the argument agreement.
#[derive(Clone, Copy)]
enum Op {
    Allreduce = 1,
    Allgather = 2,
    Broadcast = 3,
    ReduceScatter = 4,
    ReduceScatterV = 5,
    AllgatherV = 6,
}

/// Names of the words exchanged by the argument agreement, for [`Error::Mismatch`].
const FIELDS: [&str; 5] = [
    "operation",
    "element type",
    "buffer length",
    "root",
    "block sizes",
];

/// Bytes of the agreement's fixed part (one u64 per field).
const AGREE_BYTES: usize = 8 * FIELDS.len();

/// FNV-1a over `words`: a fingerprint of the block sizes, compared across ranks.
fn fingerprint(words: &[usize]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &w| {
        (h ^ w as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Offsets of consecutive blocks of the given sizes.
fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut off = Vec::with_capacity(counts.len() + 1);
    let mut at = 0usize;
    off.push(0);
    for &c in counts {
        at = at.saturating_add(c);
        off.push(at);
    }
    off
}

/// A point-to-point operation as the agreement sees it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Send = 0,
    Recv = 1,
}

/// An NCCL communicator bound to one GPU, with collectives on device buffers.
///
/// Not a [`Communicator`]: NCCL has no tagged byte messages. Construct one per rank with
/// [`NcclComm::new`] (device `rank % device count`) or [`NcclComm::with_device`].
/// Not `Send`: use it on the thread that created it.
pub struct NcclComm {
    /// Declared first so it is dropped (aborted) before the stream and host communicator.
    comm: Comm,
    stream: Arc<CudaStream>,
    host: Box<dyn Communicator>,
    checked: bool,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("ordinal", &self.ordinal())
            .field("checked", &self.checked)
            .finish()
    }
}

fn driver_err(what: &str, e: cudarc::driver::DriverError) -> Error {
    Error::Nccl(format!("{what}: {e}"))
}

/// The outcome of enqueueing the NCCL call `what`.
fn enqueued(
    what: &str,
    r: std::result::Result<nccl_result::NcclStatus, nccl_result::NcclError>,
) -> Result<()> {
    r.map(drop).map_err(|e| nccl_err(what, e))
}

fn nccl_err(what: &str, e: cudarc::nccl::result::NcclError) -> Error {
    // NcclError's Debug prints only "NcclError"; the inner ncclResult_t names the cause.
    Error::Nccl(format!("{what}: {:?}", e.0))
}

/// A stable (per binary) fingerprint of `T`, so ranks calling with different element
/// types are told apart.
fn type_tag<T>() -> u64 {
    // FNV-1a over the type name.
    std::any::type_name::<T>()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

/// Sends `mine` to every other rank and receives theirs (buffered sends: cannot deadlock).
fn exchange(host: &dyn Communicator, tag: u32, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    let (rank, p) = (host.rank(), host.size());
    for dest in (0..p).filter(|&d| d != rank) {
        host.send(dest, tag, mine)?;
    }
    (0..p)
        .map(|src| {
            if src == rank {
                Ok(mine.to_vec())
            } else {
                host.recv(src, tag)
            }
        })
        .collect()
}

/// Every rank learns every rank's local error (empty = fine); returns this rank's error,
/// or the first other rank's, so all ranks fail together.
fn agree_ok(host: &dyn Communicator, tag: u32, local: Option<String>, what: &str) -> Result<()> {
    let mine = local.clone().unwrap_or_default();
    let all = exchange(host, tag, mine.as_bytes())?;
    if let Some(msg) = local {
        return Err(Error::Nccl(format!("rank {}: {what}: {msg}", host.rank())));
    }
    match all.iter().enumerate().find(|(_, m)| !m.is_empty()) {
        Some((r, m)) => Err(Error::Nccl(format!(
            "rank {r}: {what}: {}",
            String::from_utf8_lossy(m)
        ))),
        None => Ok(()),
    }
}

impl NcclComm {
    /// Checks that libcuda and libnccl can be loaded and returns the number of CUDA
    /// devices. Never panics; call it before anything that touches the GPU.
    pub fn probe() -> Result<usize> {
        // SAFETY: only tries to dlopen the libraries; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Nccl("libcuda not found".into()));
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err(Error::Nccl("libnccl not found".into()));
        }
        let n = CudaContext::device_count().map_err(|e| driver_err("device count", e))?;
        let n = usize::try_from(n).unwrap_or(0);
        if n == 0 {
            return Err(Error::Nccl("no CUDA device".into()));
        }
        Ok(n)
    }

    /// Bootstraps over `host` on device `host.rank() % device count` (right for one process
    /// driving all local GPUs, or one process per GPU on a single node). Collective over
    /// `host`; every rank fails with a typed error if any rank cannot set up its device or
    /// rank 0 cannot create the NCCL id.
    pub fn new<C: Communicator + ?Sized>(host: &C) -> Result<Self> {
        Self::bootstrap(host, None)
    }

    /// Like [`NcclComm::new`] on the given device ordinal (for example the node-local rank
    /// when several processes per node run under MPI). Two ranks of one NCCL communicator
    /// must not use the same device.
    pub fn with_device<C: Communicator + ?Sized>(host: &C, ordinal: usize) -> Result<Self> {
        Self::bootstrap(host, Some(ordinal))
    }

    fn bootstrap<C: Communicator + ?Sized>(host: &C, ordinal: Option<usize>) -> Result<Self> {
        let rank = host.rank();
        let key = u32::try_from(rank)
            .map_err(|_| Error::InvalidArgument(format!("rank {rank} does not fit u32")))?;
        if i32::try_from(host.size()).is_err() {
            return Err(Error::InvalidArgument(format!(
                "NCCL communicators hold at most {} ranks, got {}",
                i32::MAX,
                host.size()
            )));
        }
        // A private duplicate: our setup and check messages never meet the user's traffic.
        let private = host.split(0, key)?;

        // 1. Every rank sets up its device; all learn whether everyone succeeded.
        let local = Self::open_device(rank, ordinal);
        let err = local.as_ref().err().map(|e| match e {
            Error::Nccl(m) => m.clone(),
            other => other.to_string(),
        });
        agree_ok(&*private, TAG_SETUP, err, "device setup")?;
        let stream = local?;

        // 2. Rank 0 creates the unique id and sends it (or its failure) to everyone.
        let id = if rank == 0 {
            let id = Id::new().map_err(|e| nccl_err("ncclGetUniqueId", e));
            let mut msg = Vec::with_capacity(1 + ID_BYTES);
            match &id {
                Ok(id) => {
                    msg.push(1u8);
                    msg.extend_from_slice(bytemuck::cast_slice(&id.internal()[..]));
                }
                Err(e) => {
                    msg.push(0u8);
                    msg.extend_from_slice(e.to_string().as_bytes());
                }
            }
            for dest in 1..private.size() {
                private.send(dest, TAG_SETUP, &msg)?;
            }
            id?
        } else {
            let msg = private.recv(0, TAG_SETUP)?;
            match msg.split_first() {
                Some((1, bytes)) if bytes.len() == ID_BYTES => {
                    let mut internal = [0 as std::ffi::c_char; ID_BYTES];
                    internal.copy_from_slice(bytemuck::cast_slice(bytes));
                    Id::uninit(internal)
                }
                Some((0, why)) => {
                    return Err(Error::Nccl(format!(
                        "rank 0 could not create the NCCL id: {}",
                        String::from_utf8_lossy(why)
                    )))
                }
                _ => {
                    return Err(Error::Nccl(format!(
                        "malformed NCCL id message of {} bytes from rank 0",
                        msg.len()
                    )))
                }
            }
        };

        // 3. The collective init (ncclCommInitRank uses the thread's current device).
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| driver_err("bind context", e))?;
        let comm = Comm::from_rank(stream.clone(), rank, private.size(), id)
            .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        Ok(Self {
            comm,
            stream,
            host: private,
            checked: true,
        })
    }

    /// Opens device `ordinal` (default `rank % count`) and a stream on it, without panics.
    fn open_device(rank: usize, ordinal: Option<usize>) -> Result<Arc<CudaStream>> {
        let count = Self::probe()?;
        let ordinal = ordinal.unwrap_or(rank % count);
        if ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "device ordinal {ordinal} but only {count} CUDA devices"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_err("CudaContext::new", e))?;
        ctx.new_stream().map_err(|e| driver_err("new stream", e))
    }

    /// This rank's index in the NCCL communicator (the host communicator's rank).
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.comm.world_size()
    }

    /// The CUDA device ordinal this rank uses.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// The stream every collective is enqueued on; allocate and copy buffers on it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether collectives agree on their arguments over the host first (default `true`).
    pub fn checked(&self) -> bool {
        self.checked
    }

    /// Turns the per-collective host agreement on or off. Off saves one host all-to-all per
    /// call, but then ranks disagreeing on lengths or roots make NCCL hang or misbehave.
    /// Must be set the same on every rank.
    pub fn set_checked(&mut self, checked: bool) {
        self.checked = checked;
    }

    /// Waits until every collective enqueued so far has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_err("synchronize", e))
    }

    /// Validates locally, then (when checked) agrees with every rank on the call; every
    /// rank returns the same error on any disagreement or any invalid argument.
    fn agree<T>(&self, op: Op, len: usize, root: usize, local: Option<String>) -> Result<()> {
        self.agree_blocks::<T>(op, len, root, 0, local)
    }

    /// [`agree`](Self::agree) with a fingerprint of per-rank block sizes.
    fn agree_blocks<T>(
        &self,
        op: Op,
        len: usize,
        root: usize,
        blocks: u64,
        local: Option<String>,
    ) -> Result<()> {
        if !self.checked {
            return match local {
                Some(msg) => Err(Error::InvalidArgument(msg)),
                None => Ok(()),
            };
        }
        let words = [op as u64, type_tag::<T>(), len as u64, root as u64, blocks];
        let mut mine = Vec::with_capacity(AGREE_BYTES + 64);
        for w in words {
            mine.extend_from_slice(&w.to_le_bytes());
        }
        if let Some(msg) = &local {
            mine.extend_from_slice(msg.as_bytes());
        }
        let all = exchange(&*self.host, TAG_CHECK, &mine)?;
        if let Some(msg) = local {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {msg}",
                self.rank()
            )));
        }
        let word = |m: &[u8], f: usize| -> u64 {
            let mut b = [0u8; 8];
            if let Some(s) = m.get(f * 8..f * 8 + 8) {
                b.copy_from_slice(s);
            }
            u64::from_le_bytes(b)
        };
        if let Some((r, m)) = all.iter().enumerate().find(|(_, m)| m.len() > AGREE_BYTES) {
            return Err(Error::InvalidArgument(format!(
                "rank {r}: {}",
                String::from_utf8_lossy(&m[AGREE_BYTES..])
            )));
        }
        for (f, what) in FIELDS.iter().enumerate() {
            if all.iter().any(|m| word(m, f) != word(&all[0], f)) {
                let detail = all
                    .iter()
                    .enumerate()
                    .map(|(r, m)| format!("rank {r}: {}", word(m, f)))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(Error::Mismatch { what, detail });
            }
        }
        Ok(())
    }

    /// `Some(message)` when `buf` lives on another device than this communicator.
    fn wrong_device<T>(&self, name: &str, buf: &CudaSlice<T>) -> Option<String> {
        (buf.ordinal() != self.ordinal()).then(|| {
            format!(
                "{name} is on device {} but this NcclComm uses device {}",
                buf.ordinal(),
                self.ordinal()
            )
        })
    }

    /// `Some(message)` when `send` or `recv` lives on another device, else what `lengths`
    /// finds wrong with the buffer lengths.
    fn buffers_problem<T>(
        &self,
        send: &CudaSlice<T>,
        recv: &CudaSlice<T>,
        lengths: impl FnOnce() -> Option<String>,
    ) -> Option<String> {
        self.wrong_device("send buffer", send)
            .or_else(|| self.wrong_device("receive buffer", recv))
            .or_else(lengths)
    }

    /// `Some(message)` when the buffer `what` (`len` elements) does not hold `n` elements
    /// per rank.
    fn per_rank_problem(&self, what: &str, len: usize, n: usize) -> Option<String> {
        (n.checked_mul(self.size()) != Some(len)).then(|| {
            format!(
                "{what} holds {len} elements, needs {n} x {} ranks",
                self.size()
            )
        })
    }

    /// `Some(message)` when the buffer `what` (`len` elements) is not this rank's block of
    /// `counts`.
    fn own_block_problem(&self, what: &str, len: usize, counts: &[usize]) -> Option<String> {
        let me = self.rank();
        (counts.get(me) != Some(&len)).then(|| {
            format!(
                "{what} holds {len} elements, block {me} has {:?}",
                counts.get(me)
            )
        })
    }

    /// Agrees on a collective of `n` elements (see [`agree`](Self::agree)), then, unless it
    /// is empty, binds this rank's device and enqueues `call`.
    fn launch<T>(
        &self,
        op: Op,
        n: usize,
        root: usize,
        local: Option<String>,
        call: impl FnOnce(&Comm) -> Result<()>,
    ) -> Result<()> {
        self.agree::<T>(op, n, root, local)?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        call(&self.comm)
    }

    fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| driver_err("bind context", e))
    }

    /// In-place sum over all ranks of `buf` (same length everywhere). Enqueued on
    /// [`stream`](Self::stream); call [`synchronize`](Self::synchronize) or copy back on
    /// that stream to observe the result.
    pub fn allreduce_sum<T: NcclType + DeviceRepr>(&self, buf: &mut CudaSlice<T>) -> Result<()> {
        let local = self.wrong_device("buffer", buf);
        self.launch::<T>(Op::Allreduce, buf.len(), 0, local, |comm| {
            enqueued(
                "ncclAllReduce",
                comm.all_reduce_in_place(buf, &ReduceOp::Sum),
            )
        })
    }

    /// Concatenates every rank's `send` (same length `n` everywhere) into `recv`, which
    /// must hold `n * size` elements: rank r's block lands at `r * n`.
    pub fn allgather<T: NcclType + DeviceRepr>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
    ) -> Result<()> {
        let n = send.len();
        let local = self.buffers_problem(send, recv, || {
            self.per_rank_problem("allgather receive buffer", recv.len(), n)
        });
        self.launch::<T>(Op::Allgather, n, 0, local, |comm| {
            enqueued("ncclAllGather", comm.all_gather(send, recv))
        })
    }

    /// Copies `root`'s `buf` into every rank's `buf` (same length everywhere).
    pub fn broadcast<T: NcclType + DeviceRepr>(
        &self,
        buf: &mut CudaSlice<T>,
        root: usize,
    ) -> Result<()> {
        let local = self.wrong_device("buffer", buf).or_else(|| {
            (root >= self.size()).then(|| format!("root {root} is outside 0..{}", self.size()))
        });
        self.launch::<T>(Op::Broadcast, buf.len(), root, local, |comm| {
            // root < size <= i32::MAX was checked above and at bootstrap.
            let root = i32::try_from(root).map_err(|_| Error::InvalidRank {
                rank: root,
                size: self.size(),
            })?;
            enqueued("ncclBroadcast", comm.broadcast_in_place(buf, root))
        })
    }

    /// Sums every rank's `send` (`n * size` elements, the same everywhere) and leaves block
    /// `rank` of the sum (elements `rank * n .. (rank + 1) * n`) in `recv` (`n` elements).
    pub fn reduce_scatter<T: NcclType + DeviceRepr>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
    ) -> Result<()> {
        let n = recv.len();
        let local = self.buffers_problem(send, recv, || {
            self.per_rank_problem("reduce-scatter send buffer", send.len(), n)
        });
        self.launch::<T>(Op::ReduceScatter, n, 0, local, |comm| {
            enqueued(
                "ncclReduceScatter",
                comm.reduce_scatter(send, recv, &ReduceOp::Sum),
            )
        })
    }

    /// Convenience for host data: copies `buf` to the device, sums it over all ranks with
    /// [`allreduce_sum`](Self::allreduce_sum), copies it back and waits.
    pub fn allreduce_sum_host<T: NcclType + DeviceRepr>(&self, buf: &mut [T]) -> Result<()> {
        if buf.is_empty() {
            // Still collective: the other ranks must learn that this one has nothing.
            return self.agree::<T>(Op::Allreduce, 0, 0, None);
        }
        self.bind()?;
        let mut dev = self
            .stream
            .clone_htod(&*buf)
            .map_err(|e| driver_err("copy to device", e))?;
        self.allreduce_sum(&mut dev)?;
        self.stream
            .memcpy_dtoh(&dev, buf)
            .map_err(|e| driver_err("copy to host", e))?;
        self.synchronize()
    }

    /// `Some(message)` when `peer` is not a rank of this communicator.
    fn bad_peer(&self, what: &str, peer: usize) -> Option<String> {
        (peer >= self.size()).then(|| format!("{what} peer {peer} is outside 0..{}", self.size()))
    }

    /// Every rank learns every rank's point-to-point list and checks the whole matrix the
    /// same way: rank i's sends to j must be, in order, the lengths of j's receives from i.
    fn agree_p2p<T>(&self, ops: &[(Dir, usize, usize)], local: Option<String>) -> Result<()> {
        if !self.checked {
            return match local {
                Some(msg) => Err(Error::InvalidArgument(msg)),
                None => Ok(()),
            };
        }
        let mut mine: Vec<u8> = Vec::with_capacity(16 + 24 * ops.len());
        let mut push = |w: u64| mine.extend_from_slice(&w.to_le_bytes());
        push(type_tag::<T>());
        push(ops.len() as u64);
        for &(dir, peer, len) in ops {
            push(dir as u64);
            push(peer as u64);
            push(len as u64);
        }
        if let Some(msg) = &local {
            mine.extend_from_slice(msg.as_bytes());
        }
        let all = exchange(&*self.host, TAG_P2P, &mine)?;
        if let Some(msg) = local {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {msg}",
                self.rank()
            )));
        }
        let p = self.size();
        let mut tags = Vec::with_capacity(p);
        // lists[(from, to)] = lengths sent from `from` to `to`; recvs[(to, from)] likewise.
        let mut sends = vec![Vec::new(); p * p];
        let mut recvs = vec![Vec::new(); p * p];
        for (r, m) in all.iter().enumerate() {
            let word = |i: usize| -> Option<u64> {
                m.get(i * 8..i * 8 + 8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            };
            let (Some(tag), Some(n)) = (word(0), word(1)) else {
                return Err(Error::Nccl(format!("rank {r}: malformed p2p agreement")));
            };
            let n = n as usize;
            let end = 16 + 24 * n;
            if m.len() > end {
                return Err(Error::InvalidArgument(format!(
                    "rank {r}: {}",
                    String::from_utf8_lossy(&m[end..])
                )));
            }
            tags.push(tag);
            for i in 0..n {
                let (Some(dir), Some(peer), Some(len)) =
                    (word(2 + 3 * i), word(3 + 3 * i), word(4 + 3 * i))
                else {
                    return Err(Error::Nccl(format!("rank {r}: malformed p2p agreement")));
                };
                let peer = peer as usize % p;
                if dir == Dir::Send as u64 {
                    sends[r * p + peer].push(len);
                } else {
                    recvs[peer * p + r].push(len);
                }
            }
        }
        if tags.iter().any(|&t| t != tags[0]) {
            return Err(Error::Mismatch {
                what: "element type",
                detail: format!("type tags by rank: {tags:?}"),
            });
        }
        for from in 0..p {
            for to in 0..p {
                let (s, r) = (&sends[from * p + to], &recvs[from * p + to]);
                if s != r {
                    return Err(Error::Mismatch {
                        what: "point-to-point lengths",
                        detail: format!(
                            "rank {from} sends {s:?} to rank {to}, which receives {r:?} from it"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Point-to-point on device buffers: every `(peer, view)` of `sends` goes to `peer` with
    /// `ncclSend`, every `(peer, view)` of `recvs` is filled from `peer` with `ncclRecv`,
    /// all inside one NCCL group, so any pattern (a ring step, an all-to-all, a send to
    /// oneself) completes without deadlock. Between one pair of ranks, sends and receives
    /// match in order. Collective over all ranks (a rank with nothing to do passes empty
    /// lists): when checked, every rank returns the same [`Error::Mismatch`] if a send has
    /// no receive of the same length, and the same [`Error::InvalidArgument`] if any rank
    /// names a bad peer or a buffer on another device. Enqueued on [`stream`](Self::stream).
    pub fn send_recv<T: NcclType + DeviceRepr>(
        &self,
        sends: &[(usize, CudaView<'_, T>)],
        recvs: &mut [(usize, CudaViewMut<'_, T>)],
    ) -> Result<()> {
        let mut ops = Vec::with_capacity(sends.len() + recvs.len());
        let mut local = None;
        for (peer, v) in sends {
            ops.push((Dir::Send, *peer, v.len()));
            local = local
                .or_else(|| self.bad_peer("send", *peer))
                .or_else(|| self.wrong_view("send buffer", v.stream().context().ordinal()));
        }
        for (peer, v) in recvs.iter() {
            ops.push((Dir::Recv, *peer, v.len()));
            local = local
                .or_else(|| self.bad_peer("receive", *peer))
                .or_else(|| self.wrong_view("receive buffer", v.stream().context().ordinal()));
        }
        self.agree_p2p::<T>(&ops, local)?;
        if ops.iter().all(|o| o.2 == 0) {
            return Ok(());
        }
        self.bind()?;
        self.grouped(|comm| {
            for (peer, v) in sends.iter().filter(|(_, v)| !v.is_empty()) {
                comm.send(v, *peer as i32)
                    .map_err(|e| nccl_err("ncclSend", e))?;
            }
            for (peer, v) in recvs.iter_mut().filter(|(_, v)| !v.is_empty()) {
                comm.recv(v, *peer as i32)
                    .map_err(|e| nccl_err("ncclRecv", e))?;
            }
            Ok(())
        })
    }

    /// Runs `body` between `ncclGroupStart` and `ncclGroupEnd`; the group is closed even
    /// when `body` fails, and the first error wins.
    fn grouped(&self, body: impl FnOnce(&Comm) -> Result<()>) -> Result<()> {
        nccl_result::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let out = body(&self.comm);
        let end = nccl_result::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        out.and(end.map(|_| ()))
    }

    /// `Some(message)` when a view lives on another device than this communicator.
    fn wrong_view(&self, name: &str, ordinal: usize) -> Option<String> {
        (ordinal != self.ordinal()).then(|| {
            format!(
                "{name} is on device {ordinal} but this NcclComm uses device {}",
                self.ordinal()
            )
        })
    }

    /// Checks `counts` (one block size per rank, summing to `total`) locally.
    fn check_counts(&self, counts: &[usize], total: usize, what: &str) -> Option<String> {
        if counts.len() != self.size() {
            return Some(format!(
                "{what}: {} block sizes for {} ranks",
                counts.len(),
                self.size()
            ));
        }
        let sum = offsets(counts)[counts.len()];
        (sum != total).then(|| format!("{what}: block sizes sum to {sum}, buffer holds {total}"))
    }

    /// Reduce-scatter with uneven blocks: sums every rank's `send` (the same length
    /// everywhere, cut into consecutive blocks of `counts[i]` elements) and leaves block
    /// `rank` of the sum in `recv` (`counts[rank]` elements). One `ncclReduce` per block,
    /// rooted at its owner, inside one group: NCCL's own device reduction, no host copy.
    pub fn reduce_scatter_v<T: NcclType + DeviceRepr>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        counts: &[usize],
    ) -> Result<()> {
        let me = self.rank();
        let local = self.buffers_problem(send, recv, || {
            self.check_counts(counts, send.len(), "reduce_scatter_v")
                .or_else(|| {
                    self.own_block_problem("reduce_scatter_v receive buffer", recv.len(), counts)
                })
        });
        self.agree_blocks::<T>(
            Op::ReduceScatterV,
            send.len(),
            0,
            fingerprint(counts),
            local,
        )?;
        if send.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let off = offsets(counts);
        self.grouped(|comm| {
            for (j, w) in off.windows(2).enumerate().filter(|(_, w)| w[1] > w[0]) {
                let block = send.slice(w[0]..w[1]);
                let root = j as i32;
                let out = if j == me { Some(&mut *recv) } else { None };
                comm.reduce(&block, out, &ReduceOp::Sum, root)
                    .map_err(|e| nccl_err("ncclReduce", e))?;
            }
            Ok(())
        })
    }

    /// All-gather with uneven blocks: rank i's `send` (`counts[i]` elements) lands at
    /// offset `counts[..i].sum()` of every rank's `recv` (`counts.sum()` elements). Built
    /// on [`send_recv`](Self::send_recv): each rank sends its block to every rank
    /// (itself included) in one group.
    pub fn allgather_v<T: NcclType + DeviceRepr>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        counts: &[usize],
    ) -> Result<()> {
        let local = self.buffers_problem(send, recv, || {
            self.check_counts(counts, recv.len(), "allgather_v")
                .or_else(|| self.own_block_problem("allgather_v send buffer", send.len(), counts))
        });
        self.agree_blocks::<T>(Op::AllgatherV, recv.len(), 0, fingerprint(counts), local)?;
        let mut ops: Vec<(Dir, usize, usize)> = (0..self.size())
            .map(|j| (Dir::Send, j, send.len()))
            .collect();
        ops.extend(counts.iter().enumerate().map(|(j, &c)| (Dir::Recv, j, c)));
        self.agree_p2p::<T>(&ops, None)?;
        if recv.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.grouped(|comm| {
            if !send.is_empty() {
                for j in 0..self.size() {
                    comm.send(send, j as i32)
                        .map_err(|e| nccl_err("ncclSend", e))?;
                }
            }
            recv_blocks(comm, &mut recv.as_view_mut(), counts, 0)
        })
    }
}

/// Enqueues one `ncclRecv` per non-empty block of `view` (block `j` from rank `j`),
/// splitting the view recursively so each receive borrows only its own block.
fn recv_blocks<T: NcclType>(
    comm: &Comm,
    view: &mut CudaViewMut<'_, T>,
    counts: &[usize],
    first: usize,
) -> Result<()> {
    let Some((&c, rest)) = counts.split_first() else {
        return Ok(());
    };
    let (mut head, mut tail) = view.split_at_mut(c);
    if c > 0 {
        comm.recv(&mut head, first as i32)
            .map_err(|e| nccl_err("ncclRecv", e))?;
    }
    recv_blocks(comm, &mut tail, rest, first + 1)
}
