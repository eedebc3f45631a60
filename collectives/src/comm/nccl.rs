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
//! Code that needs a GPU calls [`NcclComm::probe`] first: `CudaContext::new` panics when
//! libcuda is missing, and the probe returns a typed error instead.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use cudarc::nccl::{Comm, Id, NcclType, ReduceOp};

use crate::{Communicator, Error, Result};

/// Length in bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
const ID_BYTES: usize = 128;

/// Tag used on the private host communicator (nobody else uses that communicator).
const TAG_SETUP: u32 = 0;
/// Tag of the per-collective argument agreement.
const TAG_CHECK: u32 = 1;

/// Operation codes exchanged by the argument agreement.
#[derive(Clone, Copy)]
enum Op {
    Allreduce = 1,
    Allgather = 2,
    Broadcast = 3,
    ReduceScatter = 4,
}

/// Names of the words exchanged by the argument agreement, for [`Error::Mismatch`].
const FIELDS: [&str; 4] = ["operation", "element type", "buffer length", "root"];

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
        if !self.checked {
            return match local {
                Some(msg) => Err(Error::InvalidArgument(msg)),
                None => Ok(()),
            };
        }
        let words = [op as u64, type_tag::<T>(), len as u64, root as u64];
        let mut mine = Vec::with_capacity(32 + 64);
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
        if let Some((r, m)) = all.iter().enumerate().find(|(_, m)| m.len() > 32) {
            return Err(Error::InvalidArgument(format!(
                "rank {r}: {}",
                String::from_utf8_lossy(&m[32..])
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
        self.agree::<T>(Op::Allreduce, buf.len(), 0, local)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.comm
            .all_reduce_in_place(buf, &ReduceOp::Sum)
            .map_err(|e| nccl_err("ncclAllReduce", e))?;
        Ok(())
    }

    /// Concatenates every rank's `send` (same length `n` everywhere) into `recv`, which
    /// must hold `n * size` elements: rank r's block lands at `r * n`.
    pub fn allgather<T: NcclType + DeviceRepr>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
    ) -> Result<()> {
        let n = send.len();
        let local = self
            .wrong_device("send buffer", send)
            .or_else(|| self.wrong_device("receive buffer", recv))
            .or_else(|| {
                let want = n.checked_mul(self.size());
                (want != Some(recv.len())).then(|| {
                    format!(
                        "allgather receive buffer holds {} elements, needs {n} x {} ranks",
                        recv.len(),
                        self.size()
                    )
                })
            });
        self.agree::<T>(Op::Allgather, n, 0, local)?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        self.comm
            .all_gather(send, recv)
            .map_err(|e| nccl_err("ncclAllGather", e))?;
        Ok(())
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
        self.agree::<T>(Op::Broadcast, buf.len(), root, local)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // root < size <= i32::MAX was checked above and at bootstrap.
        let root = i32::try_from(root).map_err(|_| Error::InvalidRank {
            rank: root,
            size: self.size(),
        })?;
        self.comm
            .broadcast_in_place(buf, root)
            .map_err(|e| nccl_err("ncclBroadcast", e))?;
        Ok(())
    }

    /// Sums every rank's `send` (`n * size` elements, the same everywhere) and leaves block
    /// `rank` of the sum (elements `rank * n .. (rank + 1) * n`) in `recv` (`n` elements).
    pub fn reduce_scatter<T: NcclType + DeviceRepr>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
    ) -> Result<()> {
        let n = recv.len();
        let local = self
            .wrong_device("send buffer", send)
            .or_else(|| self.wrong_device("receive buffer", recv))
            .or_else(|| {
                let want = n.checked_mul(self.size());
                (want != Some(send.len())).then(|| {
                    format!(
                        "reduce-scatter send buffer holds {} elements, needs {n} x {} ranks",
                        send.len(),
                        self.size()
                    )
                })
            });
        self.agree::<T>(Op::ReduceScatter, n, 0, local)?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        self.comm
            .reduce_scatter(send, recv, &ReduceOp::Sum)
            .map_err(|e| nccl_err("ncclReduceScatter", e))?;
        Ok(())
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
}
