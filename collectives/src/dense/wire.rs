//! Wire element types: what travels between ranks. Sums are always accumulated in `f32`;
//! `f16`/`bf16` halve the bytes on the wire (MSTopK/HiTopKComm (Shi et al., MLSys 2021) §4 uses
//! FP16 communication).

use bytemuck::Pod;
use half::{bf16, f16};

use crate::{CommExt, Communicator, Error, Result, Tag};

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

/// Reusable send and receive scratch for one collective call (no per-step allocation).
pub(crate) struct Scratch<W> {
    send: Vec<W>,
    recv: Vec<W>,
    /// `f32` receive space for the reducing steps when the wire is `f32`.
    recv32: Vec<f32>,
}

impl<W: WireElem> Scratch<W> {
    /// Scratch for messages of up to `max_elems` elements.
    pub(crate) fn new(max_elems: usize) -> Self {
        if W::IS_F32 {
            Scratch {
                send: Vec::new(),
                recv: Vec::new(),
                recv32: vec![0.0; max_elems],
            }
        } else {
            Scratch {
                send: vec![W::from_f32(0.0); max_elems],
                recv: vec![W::from_f32(0.0); max_elems],
                recv32: Vec::new(),
            }
        }
    }

    fn encode<'a>(send: &'a mut Vec<W>, data: &'a [f32]) -> &'a [u8] {
        if W::IS_F32 {
            bytemuck::cast_slice(data)
        } else {
            if send.len() < data.len() {
                send.resize(data.len(), W::from_f32(0.0));
            }
            for (w, &x) in send.iter_mut().zip(data) {
                *w = W::from_f32(x);
            }
            bytemuck::cast_slice(&send[..data.len()])
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

    /// Receives exactly `out.len()` elements from `src` and stores them in `out`.
    pub(crate) fn recv_copy<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        src: usize,
        tag: Tag,
        out: &mut [f32],
    ) -> Result<()> {
        if W::IS_F32 {
            let n = comm.recv_slice_into(src, tag, out)?;
            expect_len(comm, src, tag, n, out.len())
        } else {
            self.recv_scratch(comm, src, tag, out.len())?;
            decode_copy(out, &self.recv[..out.len()]);
            Ok(())
        }
    }

    /// Receives exactly `out.len()` elements from `src` and adds them; `lower_first` as in
    /// [`Self::sendrecv_add`].
    pub(crate) fn recv_add<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        src: usize,
        tag: Tag,
        out: &mut [f32],
        lower_first: bool,
    ) -> Result<()> {
        self.recv_scratch(comm, src, tag, out.len())?;
        self.add_received(out, lower_first);
        Ok(())
    }

    /// One round: send `data` to `dest` and receive `out.len()` elements from `src` into
    /// `out` (copy).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sendrecv_copy<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        dest: usize,
        stag: Tag,
        data: &[f32],
        src: usize,
        rtag: Tag,
        out: &mut [f32],
    ) -> Result<()> {
        if W::IS_F32 {
            let n = comm.sendrecv_slice_into(dest, stag, data, src, rtag, out)?;
            expect_len(comm, src, rtag, n, out.len())
        } else {
            self.sendrecv_scratch(comm, dest, stag, data, src, rtag, out.len())?;
            decode_copy(out, &self.recv[..out.len()]);
            Ok(())
        }
    }

    /// One round: send `buf` to `dest`, receive as many elements from `src` and add them
    /// into `buf` (recursive doubling); `lower_first` as in [`Self::sendrecv_add`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sendrecv_add_inplace<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        dest: usize,
        stag: Tag,
        src: usize,
        rtag: Tag,
        buf: &mut [f32],
        lower_first: bool,
    ) -> Result<()> {
        self.sendrecv_scratch(comm, dest, stag, buf, src, rtag, buf.len())?;
        self.add_received(buf, lower_first);
        Ok(())
    }

    /// One round: send `data` to `dest`, receive `out.len()` elements from `src`, and
    /// combine. `lower_first` says whether the received values come from the lower-ranked
    /// operand: the sum is then `recv + out`, else `out + recv` (operands in a fixed order).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sendrecv_add<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        dest: usize,
        stag: Tag,
        data: &[f32],
        src: usize,
        rtag: Tag,
        out: &mut [f32],
        lower_first: bool,
    ) -> Result<()> {
        self.sendrecv_scratch(comm, dest, stag, data, src, rtag, out.len())?;
        self.add_received(out, lower_first);
        Ok(())
    }

    /// Receives exactly `n` elements from `src` into the scratch [`Self::add_received`]
    /// reads (`recv32` when the wire is `f32`, else `recv`).
    fn recv_scratch<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        src: usize,
        tag: Tag,
        n: usize,
    ) -> Result<()> {
        let got = if W::IS_F32 {
            comm.recv_slice_into(src, tag, &mut self.recv32[..n])?
        } else {
            comm.recv_slice_into(src, tag, &mut self.recv[..n])?
        };
        expect_len(comm, src, tag, got, n)
    }

    /// One round: sends `data` (encoded) to `dest` and receives exactly `n` elements from
    /// `src` into the scratch, as [`Self::recv_scratch`].
    #[allow(clippy::too_many_arguments)]
    fn sendrecv_scratch<C: Communicator + ?Sized>(
        &mut self,
        comm: &C,
        dest: usize,
        stag: Tag,
        data: &[f32],
        src: usize,
        rtag: Tag,
        n: usize,
    ) -> Result<()> {
        let got = if W::IS_F32 {
            comm.sendrecv_slice_into(dest, stag, data, src, rtag, &mut self.recv32[..n])?
        } else {
            let bytes = Self::encode(&mut self.send, data);
            let got = comm.sendrecv_into(
                dest,
                stag,
                bytes,
                src,
                rtag,
                bytemuck::cast_slice_mut(&mut self.recv[..n]),
            )?;
            got / std::mem::size_of::<W>()
        };
        expect_len(comm, src, rtag, got, n)
    }

    /// Adds the `out.len()` elements just received into the scratch into `out`, in the
    /// operand order `lower_first` fixes.
    fn add_received(&self, out: &mut [f32], lower_first: bool) {
        let n = out.len();
        if W::IS_F32 {
            add_ordered(out, &self.recv32[..n], lower_first);
        } else {
            add_ordered(out, &self.recv[..n], lower_first);
        }
    }
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
