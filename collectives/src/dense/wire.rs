//! Wire element types: what travels between ranks. Sums are always accumulated in `f32`;
//! `f16`/`bf16` halve the bytes on the wire (MSTopK/HiTopKComm (Shi et al., MLSys 2021) §4 uses
//! FP16 communication).

use bytemuck::Pod;
use half::{bf16, f16};

use cost_model::plan::Combine;

use crate::{Communicator, Error, Result, Tag};

/// The element type sent on the wire by the reducing collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WireType {
    /// Full precision (no conversion, no extra copies).
    #[default]
    F32,
    /// IEEE half precision on the wire, `f32` accumulation.
    F16,
    /// bfloat16 on the wire, `f32` accumulation.
    Bf16,
}

impl WireType {
    /// Bytes per element on the wire.
    pub fn size(self) -> usize {
        match self {
            WireType::F32 => 4,
            WireType::F16 | WireType::Bf16 => 2,
        }
    }

    /// Short name (`f32`, `f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            WireType::F32 => "f32",
            WireType::F16 => "f16",
            WireType::Bf16 => "bf16",
        }
    }

    pub(crate) fn code(self) -> u64 {
        match self {
            WireType::F32 => 0,
            WireType::F16 => 1,
            WireType::Bf16 => 2,
        }
    }
}

/// An element type that can carry `f32` partial sums on the wire.
pub(crate) trait WireElem: Pod + Send + Sync {
    /// True for `f32` itself: no conversion, no scratch copies.
    const IS_F32: bool;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;

    /// Rounds `buf` in place to what the wire can carry, so a rank that keeps a value it
    /// computed holds the same bits as the ranks that receive it.
    fn round_in_place(buf: &mut [f32]) {
        if !Self::IS_F32 {
            for x in buf {
                *x = Self::from_f32(*x).to_f32();
            }
        }
    }
}

impl WireElem for f32 {
    const IS_F32: bool = true;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

/// The half-width wire types: conversions by the `half` crate.
macro_rules! half_wire {
    ($($t:ty),*) => {$(
        impl WireElem for $t {
            const IS_F32: bool = false;
            #[inline(always)]
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            #[inline(always)]
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
        }
    )*};
}
half_wire!(f16, bf16);

/// Calls `f::<C, W>(args)` with `W` the element type of the [`WireType`] `wire`.
macro_rules! by_wire {
    ($wire:expr, $f:ident::<$c:ty, W>($($arg:expr),* $(,)?)) => {
        match $wire {
            $crate::dense::WireType::F32 => $f::<$c, f32>($($arg),*),
            $crate::dense::WireType::F16 => $f::<$c, half::f16>($($arg),*),
            $crate::dense::WireType::Bf16 => $f::<$c, half::bf16>($($arg),*),
        }
    };
}
pub(crate) use by_wire;

thread_local! {
    /// Scratch storage kept on this thread between collective calls, so a call neither
    /// allocates nor faults in fresh pages for its receive buffers (MPI libraries keep
    /// their fragment buffers the same way). At most [`POOL_KEEP`] buffers are kept.
    static POOL: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Buffers the per-thread pool keeps (a call uses at most two).
const POOL_KEEP: usize = 2;

/// Storage of at least `n` `f32`s from this thread's pool (contents unspecified).
fn take_storage(n: usize) -> Vec<f32> {
    let mut v = POOL
        .with(|p| {
            let mut p = p.borrow_mut();
            // The largest kept buffer: the one least likely to need growing.
            let i = (0..p.len()).max_by_key(|&i| p[i].len())?;
            Some(p.swap_remove(i))
        })
        .unwrap_or_default();
    if v.len() < n {
        v.resize(n, 0.0);
    }
    v
}

/// Returns storage to this thread's pool (dropped when the pool is full).
fn give_storage(v: Vec<f32>) {
    if v.is_empty() {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOL_KEEP {
            p.push(v);
        } else if let Some(small) = p.iter_mut().min_by_key(|b| b.len()) {
            if small.len() < v.len() {
                *small = v;
            }
        }
    });
}

/// Runs `f` on `n` bytes of this thread's pooled scratch (contents unspecified), which
/// goes back to the pool afterwards: a call that needs a whole-message work copy (Bruck's
/// rotated all-gather) neither allocates nor faults in fresh pages for it.
pub(crate) fn with_byte_scratch<R>(n: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let mut store = take_storage(n.div_ceil(4));
    let r = f(&mut bytemuck::cast_slice_mut::<f32, u8>(&mut store)[..n]);
    give_storage(store);
    r
}

/// `n` elements of `W` viewed in `f32` storage (grown if needed).
fn wire_view<W: WireElem>(store: &mut Vec<f32>, n: usize) -> &mut [W] {
    let words = (n * std::mem::size_of::<W>()).div_ceil(4);
    if store.len() < words {
        store.resize(words, 0.0);
    }
    &mut bytemuck::cast_slice_mut::<f32, W>(&mut store[..words])[..n]
}

/// Send and receive scratch for one collective call (no per-step allocation; the storage
/// comes from and goes back to a per-thread pool, so repeated calls reuse it).
pub(crate) struct Scratch<W> {
    /// Encoded outgoing message (half-width wires only).
    send: Vec<f32>,
    /// Incoming message: `f32` when the wire is `f32`, else `W` viewed in this storage.
    recv: Vec<f32>,
    wire: std::marker::PhantomData<W>,
}

impl<W> Drop for Scratch<W> {
    fn drop(&mut self) {
        give_storage(std::mem::take(&mut self.send));
        give_storage(std::mem::take(&mut self.recv));
    }
}

impl<W: WireElem> Scratch<W> {
    /// Scratch for messages of up to `max_elems` elements.
    pub(crate) fn new(max_elems: usize) -> Self {
        let words = (max_elems * std::mem::size_of::<W>()).div_ceil(4);
        Scratch {
            send: if W::IS_F32 {
                Vec::new()
            } else {
                take_storage(words)
            },
            recv: take_storage(words),
            wire: std::marker::PhantomData,
        }
    }

    fn encode<'a>(send: &'a mut Vec<f32>, data: &'a [f32]) -> &'a [u8] {
        if W::IS_F32 {
            bytemuck::cast_slice(data)
        } else {
            let out = wire_view::<W>(send, data.len());
            for (w, &x) in out.iter_mut().zip(data) {
                *w = W::from_f32(x);
            }
            bytemuck::cast_slice(out)
        }
    }

    /// Sends `data` (encoded) to `dest`.
    pub(crate) fn send<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        dest: usize,
        tag: Tag,
        data: &[f32],
    ) -> Result<()> {
        let bytes = Self::encode(&mut self.send, data);
        comm.send(dest, tag, bytes)
    }

    /// Receives exactly `out.len()` elements from `src` and combines them into `out`; with
    /// `send = Some((dest, data))` it sends `data` to `dest` in the same round (both
    /// messages carry `tag`). A copy on an `f32` wire lands in `out` directly.
    pub(crate) fn exchange<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        send: Option<(usize, &[f32])>,
        src: usize,
        tag: Tag,
        out: &mut [f32],
        combine: Combine,
    ) -> Result<()> {
        if W::IS_F32 && combine == Combine::Copy {
            let n = match send {
                Some((dest, data)) => {
                    let data = bytemuck::cast_slice(data);
                    agreed_exchange(comm, Some((dest, data)), src, tag, out)?
                }
                None => agreed_exchange(comm, None, src, tag, out)?,
            };
            return expect_len(comm, src, tag, n, out.len());
        }
        self.exchange_into_scratch(comm, send, src, tag, out.len())?;
        self.combine_received(out, combine);
        Ok(())
    }

    /// [`Self::exchange`] of `buf` with `dest` and `src` where the sent and the received
    /// range are the same (recursive doubling): the message arrives in the scratch first.
    pub(crate) fn exchange_in_place<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        dest: usize,
        src: usize,
        tag: Tag,
        buf: &mut [f32],
        combine: Combine,
    ) -> Result<()> {
        self.exchange_into_scratch(comm, Some((dest, buf)), src, tag, buf.len())?;
        self.combine_received(buf, combine);
        Ok(())
    }

    /// [`Self::exchange`]'s transfer into the scratch that [`Self::combine_received`] reads
    /// (`recv`, as `f32` or as the wire type): exactly `n` elements from `src`.
    fn exchange_into_scratch<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        send: Option<(usize, &[f32])>,
        src: usize,
        tag: Tag,
        n: usize,
    ) -> Result<()> {
        let got = match (send, W::IS_F32) {
            (None, true) => agreed_exchange(comm, None, src, tag, &mut self.recv[..n])?,
            (None, false) => {
                agreed_exchange(comm, None, src, tag, wire_view::<W>(&mut self.recv, n))?
            }
            (Some((dest, data)), true) => {
                let data = bytemuck::cast_slice(data);
                agreed_exchange(comm, Some((dest, data)), src, tag, &mut self.recv[..n])?
            }
            (Some((dest, data)), false) => {
                let bytes = Self::encode(&mut self.send, data);
                let out = wire_view::<W>(&mut self.recv, n);
                agreed_exchange(comm, Some((dest, bytes)), src, tag, out)?
            }
        };
        expect_len(comm, src, tag, got, n)
    }

    /// Combines the `out.len()` elements just received into the scratch into `out`: a
    /// copy, or a sum in the operand order `lower_first` fixes.
    fn combine_received(&mut self, out: &mut [f32], combine: Combine) {
        let n = out.len();
        match (combine, W::IS_F32) {
            (Combine::Copy, true) => out.copy_from_slice(&self.recv[..n]),
            (Combine::Copy, false) => decode_copy(out, wire_view::<W>(&mut self.recv, n)),
            (Combine::Sum { lower_first }, true) => add_ordered(out, &self.recv[..n], lower_first),
            (Combine::Sum { lower_first }, false) => {
                add_ordered(out, wire_view::<W>(&mut self.recv, n), lower_first)
            }
        }
    }
}

/// Receives `out.len()` elements from `src` (after sending `send = (dest, bytes)` in the
/// same round, if any) through the transport's agreed-length receive; returns the whole
/// elements received ([`expect_len`] reports a short message).
fn agreed_exchange<C: Communicator + ?Sized, V: Pod>(
    comm: &C,
    send: Option<(usize, &[u8])>,
    src: usize,
    tag: Tag,
    out: &mut [V],
) -> Result<usize> {
    let buf = bytemuck::cast_slice_mut(out);
    let n = match send {
        Some((dest, data)) => comm.sendrecv_agreed_into(dest, tag, data, src, tag, buf)?,
        None => comm.recv_agreed_into(src, tag, buf)?,
    };
    Ok(n / std::mem::size_of::<V>())
}

/// A message of the wrong length means the ranks disagree on the call.
pub(crate) fn expect_len<C: Communicator + ?Sized>(
    comm: &C,
    src: usize,
    tag: Tag,
    got: usize,
    want: usize,
) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Mismatch {
            what: "message length",
            detail: format!(
                "rank {} expected {want} items from rank {src} (tag {tag}), got {got}",
                comm.rank()
            ),
        })
    }
}

/// `out[i] += x[i]` (or `out[i] = x[i] + out[i]` when `lower_first`: the operand order is
/// fixed; IEEE addition is commutative, so both are bitwise the same, the order is kept
/// explicit to document it). Plain loops the compiler vectorises.
#[inline]
#[allow(clippy::assign_op_pattern)]
fn add_ordered<V: WireElem>(out: &mut [f32], x: &[V], lower_first: bool) {
    if lower_first {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v.to_f32() + *o;
        }
    } else {
        for (o, &v) in out.iter_mut().zip(x) {
            *o += v.to_f32();
        }
    }
}

#[inline]
fn decode_copy<W: WireElem>(out: &mut [f32], x: &[W]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}
