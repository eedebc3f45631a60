//! Broadcast (binomial tree, scatter + all-gather, linear pipeline) and reduce (binomial
//! tree, linear pipeline). The tree is paper 004's MST; the pipeline is paper 004 §3
//! (Fig. 2a, 2b); scatter + all-gather is van de Geijn's long-message broadcast (Thakur,
//! Rabenseifner & Gropp 2005, §3.2).

use bytemuck::Pod;
use half::{bf16, f16};

use crate::dense::allgather::ring_blocks;
use crate::dense::util::{agree, block_start};
use crate::dense::wire::{expect_len, Scratch, WireElem};
use crate::dense::{tags, DenseOptions, Op, WireType};
use crate::{Communicator, Error, Result, Tag};

/// Broadcast algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BroadcastAlgo {
    /// Binomial tree (MST): ⌈log2 P⌉ steps of the whole message.
    Binomial,
    /// Binomial scatter of P blocks, then a ring all-gather (van de Geijn).
    ScatterAllgather,
    /// Chain from the root in blocks of `block_bytes` bytes (paper 004 Fig. 2a).
    LinearPipeline {
        /// Pipeline block size b in bytes (> 0).
        block_bytes: usize,
    },
}

impl BroadcastAlgo {
    /// Short name: `binomial`, `scatter_allgather`, `lp`.
    pub fn name(&self) -> &'static str {
        match self {
            BroadcastAlgo::Binomial => "binomial",
            BroadcastAlgo::ScatterAllgather => "scatter_allgather",
            BroadcastAlgo::LinearPipeline { .. } => "lp",
        }
    }

    fn code(&self) -> (u64, u64) {
        match self {
            BroadcastAlgo::Binomial => (1, 0),
            BroadcastAlgo::ScatterAllgather => (2, 0),
            BroadcastAlgo::LinearPipeline { block_bytes } => (3, *block_bytes as u64),
        }
    }
}

/// Reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceAlgo {
    /// Binomial tree (MST).
    Binomial,
    /// Chain ending at the root in blocks of `block_bytes` wire bytes (paper 004 Fig. 2b).
    LinearPipeline {
        /// Pipeline block size b in bytes on the wire (≥ one element).
        block_bytes: usize,
    },
}

impl ReduceAlgo {
    /// Short name: `binomial`, `lp`.
    pub fn name(&self) -> &'static str {
        match self {
            ReduceAlgo::Binomial => "binomial",
            ReduceAlgo::LinearPipeline { .. } => "lp",
        }
    }

    fn code(&self) -> (u64, u64) {
        match self {
            ReduceAlgo::Binomial => (1, 0),
            ReduceAlgo::LinearPipeline { block_bytes } => (2, *block_bytes as u64),
        }
    }
}

fn check_root(root: usize, p: usize) -> Result<()> {
    if root < p {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "root {root} is outside 0..{p}"
        )))
    }
}

/// Pipeline block size in elements of `elem` bytes; 0 or less than one element is an error.
pub(crate) fn lp_block_elems(block_bytes: usize, elem: usize) -> Result<usize> {
    if block_bytes < elem.max(1) {
        Err(Error::InvalidArgument(format!(
            "linear pipeline block size {block_bytes} bytes is smaller than one {elem}-byte element"
        )))
    } else {
        Ok(block_bytes / elem.max(1))
    }
}

/// Copies the root's `buf` to every rank.
pub fn broadcast<C: Communicator + ?Sized, T: Pod>(
    comm: &C,
    buf: &mut [T],
    root: usize,
    algo: BroadcastAlgo,
    opts: &DenseOptions,
) -> Result<()> {
    let (code, param) = algo.code();
    if opts.check {
        agree(
            comm,
            [
                Op::Broadcast as u64,
                buf.len() as u64,
                code,
                param,
                0,
                root as u64,
            ],
        )?;
    }
    check_root(root, comm.size())?;
    let elem = std::mem::size_of::<T>().max(1);
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
    match algo {
        BroadcastAlgo::Binomial => bcast_binomial(comm, bytes, root, tags::TREE_BCAST),
        BroadcastAlgo::ScatterAllgather => bcast_scatter_allgather(comm, bytes, root),
        BroadcastAlgo::LinearPipeline { block_bytes } => {
            // Whole elements per block, so no element straddles two messages.
            let b = lp_block_elems(block_bytes, elem)? * elem;
            bcast_lp(comm, bytes, root, b, tags::LP_BCAST)
        }
    }
}

/// Sums every rank's `buf` into the root's `buf`. Other ranks' buffers hold partial sums
/// afterwards (they are the algorithm's scratch).
pub fn reduce<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [f32],
    root: usize,
    algo: ReduceAlgo,
    opts: &DenseOptions,
) -> Result<()> {
    let (code, param) = algo.code();
    if opts.check {
        agree(
            comm,
            [
                Op::Reduce as u64,
                buf.len() as u64,
                code,
                param,
                opts.wire.code(),
                root as u64,
            ],
        )?;
    }
    check_root(root, comm.size())?;
    match opts.wire {
        WireType::F32 => reduce_w::<C, f32>(comm, buf, root, algo),
        WireType::F16 => reduce_w::<C, f16>(comm, buf, root, algo),
        WireType::Bf16 => reduce_w::<C, bf16>(comm, buf, root, algo),
    }
}

fn reduce_w<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    root: usize,
    algo: ReduceAlgo,
) -> Result<()> {
    match algo {
        ReduceAlgo::Binomial => {
            let mut sc = Scratch::<W>::new(buf.len());
            reduce_binomial(comm, buf, root, &mut sc, tags::TREE_REDUCE)
        }
        ReduceAlgo::LinearPipeline { block_bytes } => {
            let be = lp_block_elems(block_bytes, std::mem::size_of::<W>())?;
            let mut sc = Scratch::<W>::new(be.min(buf.len()));
            reduce_lp(comm, buf, root, be, &mut sc, tags::LP_REDUCE)
        }
    }
}

/// Binomial-tree reduce to `root` (MST): in step k a rank whose relative rank has bit k
/// set sends its partial sum to relative rank − 2^k and stops; the others add what
/// relative rank + 2^k sends.
pub(crate) fn reduce_binomial<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    root: usize,
    sc: &mut Scratch<W>,
    tag: Tag,
) -> Result<()> {
    let p = comm.size();
    let rel = (comm.rank() + p - root) % p;
    let abs = |x: usize| (x + root) % p;
    let mut mask = 1;
    while mask < p {
        if rel & mask != 0 {
            sc.send(comm, abs(rel - mask), tag, buf)?;
            break;
        } else if rel + mask < p {
            sc.recv_add(comm, abs(rel + mask), tag, buf)?;
        }
        mask <<= 1;
    }
    Ok(())
}

/// Binomial-tree broadcast of bytes from `root` (MPICH's order: receive from the parent,
/// then send to children at decreasing distance).
pub(crate) fn bcast_binomial<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [u8],
    root: usize,
    tag: Tag,
) -> Result<()> {
    let p = comm.size();
    let rel = (comm.rank() + p - root) % p;
    let abs = |x: usize| (x + root) % p;
    let mut mask = 1;
    while mask < p {
        if rel & mask != 0 {
            let src = abs(rel - mask);
            let n = comm.recv_into(src, tag, buf)?;
            expect_len(comm, src, tag, n, buf.len())?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if rel + mask < p {
            comm.send(abs(rel + mask), tag, buf)?;
        }
        mask >>= 1;
    }
    Ok(())
}

/// Scatter (binomial) of P byte blocks in relative-rank order, then a ring all-gather.
fn bcast_scatter_allgather<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [u8],
    root: usize,
) -> Result<()> {
    let p = comm.size();
    if p == 1 {
        return Ok(());
    }
    let n = buf.len();
    let rel = (comm.rank() + p - root) % p;
    let abs = move |x: usize| (x + root) % p;
    let displs: Vec<usize> = (0..=p).map(|i| block_start(n, p, i)).collect();
    let span = |a: usize, b: usize| displs[a]..displs[b.min(p)];
    let mut mask = 1;
    while mask < p {
        if rel & mask != 0 {
            let src = abs(rel - mask);
            let range = span(rel, rel + mask);
            let want = range.len();
            let n = comm.recv_into(src, tags::SCATTER, &mut buf[range])?;
            expect_len(comm, src, tags::SCATTER, n, want)?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if rel + mask < p {
            comm.send(
                abs(rel + mask),
                tags::SCATTER,
                &buf[span(rel + mask, rel + 2 * mask)],
            )?;
        }
        mask >>= 1;
    }
    ring_blocks(comm, buf, &displs, rel, p, &abs, tags::BCAST_AG)
}

/// Linear-pipeline broadcast (paper 004 Fig. 2a): relative ranks form a chain from the
/// root; each block of `b` bytes is received from the predecessor and forwarded.
pub(crate) fn bcast_lp<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [u8],
    root: usize,
    b: usize,
    tag: Tag,
) -> Result<()> {
    let p = comm.size();
    if p == 1 || b == 0 {
        return Ok(());
    }
    let rel = (comm.rank() + p - root) % p;
    let prev = (rel + p - 1 + root) % p;
    let next = (rel + 1 + root) % p;
    for chunk in buf.chunks_mut(b) {
        if rel > 0 {
            let want = chunk.len();
            let n = comm.recv_into(prev, tag, chunk)?;
            expect_len(comm, prev, tag, n, want)?;
        }
        if rel + 1 < p {
            comm.send(next, tag, chunk)?;
        }
    }
    Ok(())
}

/// Linear-pipeline reduce (paper 004 Fig. 2b): chain position i is rank root + 1 + i, the
/// root last; each block of `be` elements is received, added to the own block, forwarded.
pub(crate) fn reduce_lp<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    root: usize,
    be: usize,
    sc: &mut Scratch<W>,
    tag: Tag,
) -> Result<()> {
    let p = comm.size();
    if p == 1 || be == 0 {
        return Ok(());
    }
    let pos = (comm.rank() + p - root - 1) % p;
    let rank_at = |i: usize| (root + 1 + i) % p;
    for chunk in buf.chunks_mut(be) {
        if pos > 0 {
            sc.recv_add(comm, rank_at(pos - 1), tag, chunk)?;
        }
        if pos + 1 < p {
            sc.send(comm, rank_at(pos + 1), tag, chunk)?;
        }
    }
    Ok(())
}
