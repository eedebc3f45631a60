//! The `SharedMemory` algorithm of each dense collective: all ranks on one machine move
//! data through a [`SharedSegment`] with loads and stores, synchronising with one flag per
//! rank, instead of passing messages.
//!
//! Why: within a node, a message-passing library copies every message through its
//! transport's queues and pays a hand-shake per message, so a small all-reduce costs
//! log₂ P round trips. Here every round is one copy into the rank's slot, one flag
//! exchange (`SharedSegment::sync`) and a reduction (or copy) straight from the peers'
//! slots, the way intra-node collectives of NCCL, Gloo or DeepSpeed's shared-memory
//! all-reduce work.
//!
//! - **All-reduce**: rounds of up to [`ALLREDUCE_ROUND_BYTES`] per rank. A round of at
//!   most [`DIRECT_BYTES`] is reduced whole by every rank (one flag exchange). In a larger
//!   one every rank puts only the blocks the others own, reduces the 1/P block it owns, and
//!   copies the other reduced blocks out of their owners' slots after a second exchange.
//! - **All-gather**: each round copies a piece of every rank's block out of the peers'
//!   slots (variable counts alike).
//! - **Reduce-scatter**: each round puts a piece of every rank's block in a sub-slot, and
//!   each rank reduces its own block's piece from every peer.
//!
//! Every element of a sum is added in rank order by one rank (or by every rank in the same
//! order), so all ranks end with the same bits.
//!
//! Each rank writes its slot with plain stores, or with non-temporal ones while plain
//! stores run slow (`SharedSegment::put`): on a VM whose host places the vCPUs far
//! apart, a plain store first takes the line back from the peer's cache, and the 16 MiB
//! all-reduce at P = 2 fell from 6–9 GB/s to 1.6–2.2 GB/s; with the switch it kept
//! 5–7 GB/s there.

use std::ops::Range;

use crate::comm::shm::{copy, copy_f32, copy_streaming_to, SharedSegment, SLOT_BYTES};
use crate::dense::util::block_range;
use crate::dense::WireType;
use crate::{Communicator, Error, Result};

/// Largest all-reduce round (bytes) that every rank reduces whole: below it, one flag
/// exchange and P reads of a buffer that is in cache beat the two exchanges of a round
/// in which every rank reduces only its own block.
pub const DIRECT_BYTES: usize = 32 << 10;

/// Largest all-reduce round (bytes per rank), half a slot. On a 2-core EPYC VM with
/// 512 KiB of L2 per core, two rounds of 512 KiB at P = 2 took 68 µs where one of 1 MiB
/// took 122 µs: a 1 MiB round's block, slot and peer's slot overflow the L2, and two
/// rounds let one rank's copy-in overlap the other's copy-out.
pub const ALLREDUCE_ROUND_BYTES: usize = SLOT_BYTES / 2;

/// The shared segment of `comm`, or a typed error: the transport has none (the ranks span
/// machines, or the transport passes messages only), or the wire type is not `f32` (the
/// segment sums `f32`; narrower wire types are for links). Every rank gets the same answer.
pub(crate) fn segment_of<'c, C: Communicator + ?Sized>(
    comm: &'c C,
    op: &str,
    wire: WireType,
) -> Result<&'c SharedSegment> {
    if wire != WireType::F32 {
        return Err(Error::InvalidArgument(format!(
            "{op}: the shared-memory algorithm sums f32; wire type {} is for links, use \
             one of the message-passing algorithms",
            wire.name()
        )));
    }
    comm.shared_segment().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{op}: the shared-memory algorithm needs ranks on one machine with a shared \
             segment; this {} communicator has none",
            comm.backend()
        ))
    })
}

/// `len` floats of rank `r`'s slot `which`, from float `at`.
///
/// # Safety
/// `at + len` floats must fit in a slot, and no rank may write that range while the slice
/// lives (the round's synchronisation orders it).
unsafe fn slot_f32(seg: &SharedSegment, r: usize, which: usize, at: usize, len: usize) -> &[f32] {
    debug_assert!((at + len) * 4 <= SLOT_BYTES);
    // SAFETY: in bounds of the slot (the caller's contract), and not written meanwhile.
    unsafe { std::slice::from_raw_parts((seg.slot(r, which) as *const f32).add(at), len) }
}

/// `out[i] = Σ_r slot_r[at + i]`, added in rank order.
///
/// # Safety
/// As [`slot_f32`] for every rank.
unsafe fn sum_slots(seg: &SharedSegment, which: usize, at: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract, for every rank.
    copy_f32(out, unsafe { slot_f32(seg, 0, which, at, out.len()) });
    for r in 1..seg.size() {
        // SAFETY: as above.
        let theirs = unsafe { slot_f32(seg, r, which, at, out.len()) };
        for (o, v) in out.iter_mut().zip(theirs) {
            *o += *v;
        }
    }
}

/// Sums `buf` over the ranks of `seg` in place.
pub(crate) fn allreduce(seg: &SharedSegment, buf: &mut [f32]) -> Result<()> {
    if seg.size() == 1 {
        return Ok(());
    }
    for chunk in buf.chunks_mut(ALLREDUCE_ROUND_BYTES / 4) {
        let which = seg.next_round();
        if chunk.len() * 4 > DIRECT_BYTES {
            owner_reduce_round(seg, which, chunk)?;
            continue;
        }
        seg.put(which, 0, bytemuck::cast_slice(chunk));
        seg.sync()?;
        // SAFETY: every slot holds this round's floats; none is written before the next
        // round's synchronisation.
        unsafe { sum_slots(seg, which, 0, chunk) };
    }
    Ok(())
}

/// Floats of a block that [`owner_reduce_round`] sums at once: the running sum stays in
/// the L1 cache while every rank's piece is added to it.
const PIECE_FLOATS: usize = 4096;

/// `sum[i] = Σ_r part(r)[i]`, added in rank order (P ≥ 2), the order every rank and
/// every algorithm here adds in.
fn sum_in_rank_order<'a>(sum: &mut [f32], p: usize, part: impl Fn(usize) -> &'a [f32]) {
    for ((s, a), b) in sum.iter_mut().zip(part(0)).zip(part(1)) {
        *s = a + b;
    }
    for r in 2..p {
        for (s, v) in sum.iter_mut().zip(part(r)) {
            *s += *v;
        }
    }
}

/// One all-reduce round in which every rank reduces the 1/P block it owns: each rank puts
/// only the blocks the others own in its slot, sums its own block (its own values straight
/// from `chunk`, the peers' from their slots) piece by piece into `chunk` and into the same
/// place of its slot, and after a second flag exchange copies the other reduced blocks out
/// of their owners' slots. Per element that is 4 memory passes (the whole-round reduction
/// makes 5: it copies every element in and reads every slot whole).
fn owner_reduce_round(seg: &SharedSegment, which: usize, chunk: &mut [f32]) -> Result<()> {
    let (p, me, n) = (seg.size(), seg.rank(), chunk.len());
    for r in (0..p).filter(|&r| r != me) {
        let block = block_range(n, p, r);
        seg.put(which, block.start * 4, bytemuck::cast_slice(&chunk[block]));
    }
    seg.sync()?;
    let mine = block_range(n, p, me);
    // Plain stores sum straight into the slot; non-temporal ones sum a piece in `acc` and
    // stream it out.
    let streams = seg.streams();
    let acc_len = if streams {
        PIECE_FLOATS.min(mine.len())
    } else {
        0
    };
    let mut acc = vec![0f32; acc_len];
    let sum_at = seg.slot(me, which) as *mut f32;
    for start in mine.clone().step_by(PIECE_FLOATS) {
        let piece = start..(start + PIECE_FLOATS).min(mine.end);
        let len = piece.len();
        let sum = if streams {
            &mut acc[..len]
        } else {
            // SAFETY: this rank's block of its own slot, which no peer reads before the
            // second synchronisation (nor has it been written this round); in bounds as
            // `n` floats fit a slot.
            unsafe { std::slice::from_raw_parts_mut(sum_at.add(start), len) }
        };
        {
            let own = &chunk[piece.clone()];
            // SAFETY: rank r's copy of this block, put before the first synchronisation
            // and not rewritten before the next round's.
            let part = |r: usize| {
                if r == me {
                    own
                } else {
                    unsafe { slot_f32(seg, r, which, start, len) }
                }
            };
            sum_in_rank_order(sum, p, part);
        }
        copy_f32(&mut chunk[piece], sum);
        if streams {
            // The same place of this rank's slot as above.
            seg.put_streaming(which, start * 4, bytemuck::cast_slice(sum));
        }
    }
    seg.sync()?;
    for r in (0..p).filter(|&r| r != me) {
        let theirs = block_range(n, p, r);
        // SAFETY: rank r's reduced block, written before the second synchronisation.
        let src = unsafe { slot_f32(seg, r, which, theirs.start, theirs.len()) };
        copy_f32(&mut chunk[theirs], src);
    }
    Ok(())
}

/// Bytes per rank of an all-gather round when the longest block is `longest` bytes: a
/// slot, except that a block from [`PIPELINE_BYTES`] up to two slots goes in two rounds, so
/// that one rank's copy-out overlaps the other's copy-in. At P = 2 on a 2-core VM a
/// 512 KiB block took 1.4× longer in one round than in two.
fn allgather_round_bytes(longest: usize) -> usize {
    if longest >= PIPELINE_BYTES {
        SLOT_BYTES.min(longest.div_ceil(2).next_multiple_of(64))
    } else {
        SLOT_BYTES
    }
}

/// Smallest all-gather block that goes in at least two rounds (see
/// [`allgather_round_bytes`]); below it a second flag exchange costs more than the overlap
/// saves.
const PIPELINE_BYTES: usize = 256 << 10;

/// Every rank's block into `out`: rank r's block is `out[displs[r]..displs[r + 1]]`, and
/// this rank's is `mine`. The caller checked that the counts add up.
pub(crate) fn allgatherv(
    seg: &SharedSegment,
    mine: &[u8],
    out: &mut [u8],
    displs: &[usize],
) -> Result<()> {
    let (p, me, total) = (seg.size(), seg.rank(), out.len());
    copy_out(&mut out[displs[me]..displs[me + 1]], mine, total);
    let longest = (0..p).map(|r| displs[r + 1] - displs[r]).max().unwrap_or(0);
    if p == 1 {
        return Ok(());
    }
    let single_copy = seg.reads_peers() && seg.own_cores();
    if single_copy && (SINGLE_COPY_BYTES..SLOTS_AGAIN_BYTES).contains(&longest) {
        allgatherv_single_copy(seg, mine, out, displs)
    } else {
        allgatherv_through_slots(seg, mine, out, displs, longest)
    }
}

/// The all-gather through the slots: each round copies a piece of every block into its
/// owner's slot and out of it. `longest`: the longest block.
fn allgatherv_through_slots(
    seg: &SharedSegment,
    mine: &[u8],
    out: &mut [u8],
    displs: &[usize],
    longest: usize,
) -> Result<()> {
    let (p, me) = (seg.size(), seg.rank());
    let total = out.len();
    let round = allgather_round_bytes(longest);
    for from in (0..longest).step_by(round) {
        let which = seg.next_round();
        let piece = |r: usize| {
            let len = displs[r + 1] - displs[r];
            from.min(len)..(from + round).min(len)
        };
        seg.put(which, 0, &mine[piece(me)]);
        seg.sync()?;
        for r in (0..p).filter(|&r| r != me) {
            let Range { start, end } = piece(r);
            // SAFETY: rank r's piece of this round, written before the synchronisation
            // and not rewritten before the next one.
            let src =
                unsafe { std::slice::from_raw_parts(seg.slot(r, which) as *const u8, end - start) };
            copy_out(&mut out[displs[r] + start..displs[r] + end], src, total);
        }
    }
    Ok(())
}

/// Smallest all-gather output (bytes, all blocks) written with non-temporal stores: past
/// it the output does not stay in the cache, and a plain store first reads each line from
/// memory. Slots at P = 2 on the 2-vCPU EPYC VM (32 MiB L3), all-gather time with plain /
/// non-temporal stores into the output, medians of 11 alternated timings, two launches:
/// 1 MiB 67–70 / 113–148 µs, 4 MiB 366–410 / 489–503 µs, 16 MiB 3.70–4.03 / 3.28–3.45 ms,
/// 64 MiB 16.1–16.7 / 13.3–13.8 ms (MPI's call: 15.9–16.2 ms).
pub const STREAM_OUT_BYTES: usize = 16 << 20;

/// `dst = src` for a block of an all-gather output of `out_bytes` in all: non-temporal
/// stores from [`STREAM_OUT_BYTES`], plain vector moves below.
fn copy_out(dst: &mut [u8], src: &[u8], out_bytes: usize) {
    if out_bytes >= STREAM_OUT_BYTES {
        copy_streaming_to(dst, src);
    } else {
        copy(dst, src);
    }
}

/// Smallest all-gather block (bytes, the longest of any rank) that each rank reads
/// straight from its peers' buffers when the segment allows it
/// ([`SharedSegment::reads_peers`]), up to [`SLOTS_AGAIN_BYTES`]: one copy per block and
/// two flag exchanges, where the slots take two copies and one exchange per round.
///
/// Measured at P = 2 between processes: MPI's time over ours, median of 150–300 pairs of
/// calls alternated within one launch (each after a barrier), two launches each, single
/// copy on and off (`COLLECTIVES_SINGLE_COPY`):
///
/// | block | slots | single copy |
/// | --- | --- | --- |
/// | 8 KiB | 3.13–3.34 | 1.15–1.23 |
/// | 16 KiB | 1.51–2.56 | 1.14 |
/// | 32 KiB | 1.06–1.88 | 1.08–1.10 |
/// | 64 KiB | 0.81–0.82 | 1.08–1.09 |
/// | 128 KiB | 0.84–0.87 | 1.05–1.07 |
/// | 256 KiB | 0.86–0.90 | 1.02 |
/// | 512 KiB | 1.29 | 1.01–1.02 |
/// | 1 MiB | 1.32–1.34 | 1.01 |
///
/// A read through the kernel costs about 3 µs however small (the system call, the page
/// pinning and the second exchange), and from 512 KiB the slots' two pipelined rounds
/// overlap one rank's copy-in with the other's copy-out, which the kernel's copy cannot.
///
/// Only where every rank has a core of its own (`SharedSegment::own_cores`): with 3 and
/// 4 ranks on the 2 cores the second exchange waits for a rank to be scheduled again, and
/// the 256 KiB all-gather took 41 µs against the slots' 15 µs (P = 3) and 83 against 43
/// (P = 4).
///
/// From 32 KiB since 2026-11-27 (it was 64 KiB). In `cargo xtask bench --mpi -n 2` the
/// slots' all-gather of 64 KiB (32 KiB blocks) ran at 0.75–0.93× MPI's bus bandwidth in
/// four runs of five, and the automatic choice fell back to MPI's call at 0.95–0.97×;
/// three launches of 301 alternated calls, each after a barrier, timed the single copy at
/// 8.4–9.7 µs, MPI's call at 10.4–11.8 µs and the slots at 7.6–11.5 µs: the single copy
/// is the one that stays ahead.
pub const SINGLE_COPY_BYTES: usize = 32 << 10;

/// Smallest all-gather block that goes through the slots again (see
/// [`SINGLE_COPY_BYTES`]).
pub const SLOTS_AGAIN_BYTES: usize = 512 << 10;

/// The all-gather in one copy per block: every rank publishes the address of `mine`, and
/// after a flag exchange copies each peer's block straight out of the peer's buffer
/// (through the kernel between processes); a second exchange keeps every `mine` alive and
/// unchanged until all ranks are done reading it. A refused read is this rank's typed
/// error, returned after the second exchange, so that no peer waits for it in vain.
fn allgatherv_single_copy(
    seg: &SharedSegment,
    mine: &[u8],
    out: &mut [u8],
    displs: &[usize],
) -> Result<()> {
    let me = seg.rank();
    seg.publish_buffer(mine);
    seg.sync()?;
    let mut refused = None;
    for r in (0..seg.size()).filter(|&r| r != me) {
        let block = &mut out[displs[r]..displs[r + 1]];
        if block.is_empty() {
            continue;
        }
        // SAFETY: rank r published its `mine` before the sync above (`read_peer` checks its
        // length), and keeps it borrowed and unchanged until it passes the sync below,
        // which waits for this rank.
        if let Err(e) = unsafe { seg.read_peer(r, 0, block) } {
            refused.get_or_insert(e);
        }
    }
    seg.sync()?;
    refused.map_or(Ok(()), Err)
}

/// Sums `buf` over the ranks and leaves this rank's block, [`block_range`]`(n, P, rank)`,
/// reduced in place; returns that range. The rest of `buf` is left as it was.
pub(crate) fn reduce_scatter(seg: &SharedSegment, buf: &mut [f32]) -> Result<Range<usize>> {
    let (p, me, n) = (seg.size(), seg.rank(), buf.len());
    let mine = block_range(n, p, me);
    if p == 1 {
        return Ok(mine);
    }
    // Each slot holds P sub-slots of `sub` floats: sub-slot r carries a piece of block r.
    let sub = (SLOT_BYTES / 4 / p).max(1);
    let longest = n.div_ceil(p);
    // Scratch of at most a piece, kept per thread and grown once: a fixed
    // `[f32; PIECE_FLOATS]` on the stack zeroed 16 KiB on every call, more than a 4 KiB
    // reduce-scatter moves, and a fresh buffer would allocate on every call.
    thread_local! {
        static ACC: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    ACC.with_borrow_mut(|acc| -> Result<()> {
        let need = PIECE_FLOATS.min(longest);
        if acc.len() < need {
            acc.resize(need, 0.0);
        }
        for from in (0..longest).step_by(sub) {
            let which = seg.next_round();
            let piece = |r: usize| {
                let b = block_range(n, p, r);
                b.start + from.min(b.len())..b.start + (from + sub).min(b.len())
            };
            // This rank's own piece stays in `buf`: no peer reads it.
            for r in (0..p).filter(|&r| r != me) {
                seg.put(which, r * sub * 4, bytemuck::cast_slice(&buf[piece(r)]));
            }
            seg.sync()?;
            let here = piece(me);
            // SAFETY: sub-slot `me` of every other rank holds this round's piece of this
            // rank's block, written before the synchronisation and not rewritten before the
            // next.
            unsafe { sum_into_own(seg, which, me * sub, &mut buf[here], acc) };
        }
        Ok(())
    })?;
    Ok(mine)
}

/// `own[i] = Σ_r part_r[i]` in rank order, where this rank's part is `own` itself and
/// rank r's the floats of its slot `which` from float `at`: the sum of
/// [`sum_slots`] without this rank's copy into its slot. Piece by piece through `acc`
/// (at least `min(PIECE_FLOATS, own.len())` long), which stays in the L1 cache.
///
/// # Safety
/// As [`slot_f32`] for every other rank, `own.len()` floats from `at`.
unsafe fn sum_into_own(
    seg: &SharedSegment,
    which: usize,
    at: usize,
    own: &mut [f32],
    acc: &mut [f32],
) {
    let (p, me) = (seg.size(), seg.rank());
    for start in (0..own.len()).step_by(PIECE_FLOATS) {
        let len = PIECE_FLOATS.min(own.len() - start);
        let mine = &mut own[start..start + len];
        {
            let own_piece = &*mine;
            // SAFETY: the caller's contract, for every rank but this one.
            let part = |r: usize| {
                if r == me {
                    own_piece
                } else {
                    unsafe { slot_f32(seg, r, which, at + start, len) }
                }
            };
            sum_in_rank_order(&mut acc[..len], p, part);
        }
        mine.copy_from_slice(&acc[..len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::{
        allgather, allgatherv, allreduce as dense_allreduce, reduce_scatter as dense_rs,
        AllgatherAlgo, AllreduceAlgo, DenseOptions, ReduceScatterAlgo,
    };
    use crate::ThreadComm;

    /// Rank r's input: values whose sums differ in rounding with the order of addition.
    fn input(r: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.1 + r as f32 * 1e-3)
            .collect()
    }

    /// Sizes across the direct path, the split path and several rounds.
    const SIZES: [usize; 7] = [0, 1, 5, 1000, 8193, 300_000, 600_001];

    #[test]
    fn allreduce_matches_ring_sums_and_agrees_bitwise() {
        for p in [1, 2, 3, 5] {
            let out = ThreadComm::run(p, |comm| -> Result<Vec<Vec<f32>>> {
                let opts = DenseOptions::default();
                let mut all = Vec::new();
                for n in SIZES {
                    let mut buf = input(comm.rank(), n);
                    dense_allreduce(&comm, &mut buf, AllreduceAlgo::SharedMemory, &opts)?;
                    all.push(buf);
                }
                Ok(all)
            })
            .unwrap();
            for (i, n) in SIZES.into_iter().enumerate() {
                let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, n)).collect();
                let want: Vec<f32> = (0..n)
                    .map(|j| inputs.iter().map(|x| x[j] as f64).sum::<f64>() as f32)
                    .collect();
                for rank in 0..p {
                    assert_eq!(out[rank][i].len(), n);
                    for (a, b) in out[rank][i].iter().zip(&want) {
                        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "p {p} n {n}");
                    }
                    // Bit-identical on every rank.
                    assert_eq!(
                        bytemuck::cast_slice::<f32, u32>(&out[rank][i]),
                        bytemuck::cast_slice::<f32, u32>(&out[0][i]),
                        "p {p} n {n} rank {rank}"
                    );
                }
            }
        }
    }

    #[test]
    fn non_temporal_stores_give_the_same_bits_as_plain_ones() {
        // Every collective, with no rank, some ranks and every rank writing its slots with
        // non-temporal stores (each rank picks alone, after slow plain writes).
        let run = |p: usize, streams: fn(usize) -> bool| {
            ThreadComm::run(p, move |comm| -> Result<Vec<Vec<f32>>> {
                let seg = shared(&comm)?;
                if streams(comm.rank()) {
                    seg.force_streaming();
                }
                let opts = DenseOptions::default();
                let mut out = Vec::new();
                for n in [8193, 300_000, 600_001] {
                    let mut buf = input(comm.rank(), n);
                    dense_allreduce(&comm, &mut buf, AllreduceAlgo::SharedMemory, &opts)?;
                    out.push(buf);
                    let mine = input(comm.rank(), n / p);
                    let mut got = vec![0f32; n / p * p];
                    allgather(&comm, &mine, &mut got, AllgatherAlgo::SharedMemory, &opts)?;
                    out.push(got);
                    let mut buf = input(comm.rank(), n);
                    dense_rs(&comm, &mut buf, ReduceScatterAlgo::SharedMemory, &opts)?;
                    out.push(buf);
                }
                Ok(out)
            })
            .unwrap()
        };
        for p in [2, 3] {
            let plain = run(p, |_| false);
            let bits = |v: &Vec<Vec<Vec<f32>>>| -> Vec<Vec<Vec<u32>>> {
                v.iter()
                    .map(|r| {
                        r.iter()
                            .map(|x| x.iter().map(|f| f.to_bits()).collect())
                            .collect()
                    })
                    .collect()
            };
            assert_eq!(bits(&run(p, |r| r % 2 == 1)), bits(&plain), "p {p}");
            assert_eq!(bits(&run(p, |_| true)), bits(&plain), "p {p}");
        }
    }

    #[test]
    fn allgather_and_allgatherv_match_ring() {
        for p in [2, 3, 4, 7] {
            ThreadComm::run(p, |comm| -> Result<()> {
                let opts = DenseOptions::default();
                for n in [0usize, 3, 70_000, 300_001] {
                    let mine = input(comm.rank(), n);
                    let mut got = vec![0.0f32; n * p];
                    let mut want = got.clone();
                    allgather(&comm, &mine, &mut got, AllgatherAlgo::SharedMemory, &opts)?;
                    allgather(&comm, &mine, &mut want, AllgatherAlgo::Ring, &opts)?;
                    assert_eq!(got, want, "p {p} n {n}");
                    // Variable counts, one rank with nothing, one longer than a slot.
                    let len = match comm.rank() {
                        0 => 0,
                        1 => n + SLOT_BYTES / 4 + 3,
                        r => n / r,
                    };
                    let mine = input(comm.rank(), len);
                    let got = allgatherv(&comm, &mine, AllgatherAlgo::SharedMemory)?;
                    let want = allgatherv(&comm, &mine, AllgatherAlgo::Ring)?;
                    assert_eq!(got, want, "p {p} n {n} (v)");
                }
                Ok(())
            })
            .unwrap();
        }
    }

    #[test]
    fn an_allgather_past_the_streaming_size_matches_ring() {
        for p in [2, 3] {
            ThreadComm::run(p, |comm| -> Result<()> {
                let opts = DenseOptions::default();
                let n = STREAM_OUT_BYTES / 4 / p + 5;
                let mine = input(comm.rank(), n);
                let mut got = vec![0.0f32; n * p];
                let mut want = got.clone();
                allgather(&comm, &mine, &mut got, AllgatherAlgo::SharedMemory, &opts)?;
                allgather(&comm, &mine, &mut want, AllgatherAlgo::Ring, &opts)?;
                assert!(4 * got.len() >= STREAM_OUT_BYTES);
                assert!(got == want, "p {p}");
                Ok(())
            })
            .unwrap();
        }
    }

    /// The single-copy all-gather gives the bytes of the one through the slots, with empty
    /// and uneven blocks, and a peer whose block is shorter than the counts say is a typed
    /// error on the rank that reads it, not a read past its buffer.
    #[test]
    fn single_copy_matches_the_slots_and_refuses_a_short_peer() {
        for p in [2, 3, 5] {
            ThreadComm::run(p, |comm| -> Result<()> {
                let seg = comm.shared_segment().expect("threads share a segment");
                assert!(seg.reads_peers(), "threads read each other's buffers");
                let me = comm.rank();
                let counts: Vec<usize> = (0..p).map(|r| [40_000, 0, 70_001][r % 3]).collect();
                let mut displs = vec![0];
                for c in &counts {
                    displs.push(displs.last().unwrap() + c);
                }
                let mine: Vec<u8> = (0..counts[me]).map(|i| (i * 7 + me) as u8).collect();
                let mut slots = vec![0u8; displs[p]];
                let mut single = vec![1u8; displs[p]];
                // The caller puts this rank's own block in place.
                slots[displs[me]..displs[me + 1]].copy_from_slice(&mine);
                single[displs[me]..displs[me + 1]].copy_from_slice(&mine);
                allgatherv_through_slots(seg, &mine, &mut slots, &displs, 70_001)?;
                allgatherv_single_copy(seg, &mine, &mut single, &displs)?;
                assert_eq!(single, slots, "p {p}");
                // Rank 0 believes rank 1's block is longer than the one rank 1 shares.
                let mut wrong = displs.clone();
                if me == 0 {
                    wrong[2] += 5;
                    wrong[3..].iter_mut().for_each(|d| *d += 5);
                }
                let mut out = vec![0u8; *wrong.last().unwrap()];
                let got = allgatherv_single_copy(seg, &mine, &mut out, &wrong);
                if me == 0 {
                    assert!(matches!(got, Err(Error::Mismatch { .. })), "{got:?}");
                } else {
                    got?;
                }
                Ok(())
            })
            .unwrap();
        }
    }

    #[test]
    fn reduce_scatter_leaves_each_block_reduced_and_the_rest_untouched() {
        for p in [1, 2, 3, 6] {
            let out = ThreadComm::run(p, |comm| -> Result<Vec<(Vec<f32>, Range<usize>)>> {
                let mut all = Vec::new();
                for n in SIZES {
                    let mut buf = input(comm.rank(), n);
                    let range = dense_rs(
                        &comm,
                        &mut buf,
                        ReduceScatterAlgo::SharedMemory,
                        &DenseOptions::default(),
                    )?;
                    all.push((buf, range));
                }
                Ok(all)
            })
            .unwrap();
            for (i, n) in SIZES.into_iter().enumerate() {
                let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, n)).collect();
                for (rank, rows) in out.iter().enumerate() {
                    let (buf, range) = &rows[i];
                    assert_eq!(*range, block_range(n, p, rank));
                    let own = &inputs[rank];
                    for j in 0..n {
                        if range.contains(&j) {
                            // Added in rank order, as every other algorithm here.
                            let want = inputs[1..].iter().fold(inputs[0][j], |a, x| a + x[j]);
                            assert_eq!(buf[j].to_bits(), want.to_bits(), "p {p} n {n} j {j}");
                        } else {
                            assert_eq!(buf[j].to_bits(), own[j].to_bits(), "p {p} n {n}");
                        }
                    }
                }
            }
        }
    }

    /// A peer that never arrives is a typed error, not a hang: a timeout when it is late,
    /// `PeerFailed` as soon as the transport knows it failed.
    #[test]
    fn a_missing_peer_is_a_timeout_or_peer_failed() {
        use crate::comm::shm::TAG_SHARED_MEMORY;
        use crate::comm::thread::ThreadConfig;
        use std::time::{Duration, Instant};
        let (timeout, start) = (Duration::from_millis(200), Instant::now());
        let config = ThreadConfig::with_timeout(timeout);
        let res = ThreadComm::run_all(2, config, |c| {
            shared(&c)?.sync()?;
            match c.rank() {
                0 => allreduce(shared(&c)?, &mut [1.0f32; 100]),
                // Arrives at the first synchronisation only.
                _ => {
                    std::thread::sleep(timeout * 4);
                    Ok(())
                }
            }
        })
        .unwrap();
        match &res[0] {
            Err(Error::Timeout {
                rank: 0,
                src: 1,
                tag,
                waited,
            }) => assert!(*tag == TAG_SHARED_MEMORY && *waited >= timeout),
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(start.elapsed() < timeout * 20);
        let res = ThreadComm::run_all(
            3,
            ThreadConfig::with_timeout(Duration::from_secs(30)),
            |c| {
                if c.rank() == 2 {
                    return Err(Error::InvalidArgument("rank 2 gives up".into()));
                }
                let mut buf = vec![1.0f32; 100];
                allreduce(shared(&c)?, &mut buf)
            },
        )
        .unwrap();
        for r in &res[..2] {
            assert!(
                matches!(r, Err(Error::PeerFailed { failed: 2, .. })),
                "{r:?}"
            );
        }
    }

    fn shared(c: &ThreadComm) -> Result<&SharedSegment> {
        segment_of(c, "test", WireType::F32)
    }

    #[test]
    fn refused_with_a_typed_error_where_there_is_no_segment_or_a_narrow_wire() {
        use crate::comm::thread::ThreadConfig;
        // A world standing for two nodes of two ranks has no shared segment.
        let two_nodes = ThreadConfig::default().with_ranks_per_node(2);
        let out = ThreadComm::run_with(4, two_nodes, |comm| -> Result<_> {
            let mut buf = vec![1.0f32; 8];
            let opts = DenseOptions::default();
            let ar = dense_allreduce(&comm, &mut buf, AllreduceAlgo::SharedMemory, &opts);
            let split = comm.split(0, 0)?;
            let on_split = dense_rs(&*split, &mut buf, ReduceScatterAlgo::SharedMemory, &opts);
            Ok((ar.err(), on_split.err()))
        })
        .unwrap();
        for (ar, split) in out {
            assert!(matches!(&ar, Some(Error::InvalidArgument(m)) if m.contains("has none")));
            assert!(matches!(&split, Some(Error::InvalidArgument(m)) if m.contains("has none")));
        }
        let out = ThreadComm::run(2, |comm| -> Result<_> {
            let mut buf = vec![1.0f32; 8];
            let narrow = DenseOptions {
                wire: WireType::Bf16,
                ..DenseOptions::default()
            };
            Ok(dense_allreduce(&comm, &mut buf, AllreduceAlgo::SharedMemory, &narrow).err())
        })
        .unwrap();
        for e in out {
            assert!(matches!(&e, Some(Error::InvalidArgument(m)) if m.contains("bf16")));
        }
    }
}
