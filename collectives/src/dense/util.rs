//! Small helpers shared by the dense algorithms: block partitions (owned by the plans),
//! disjoint borrows, and the cross-rank agreement check.

use std::ops::Range;

use crate::dense::allgather::{gather_core, AllgatherAlgo};
use crate::dense::tags;
use crate::{Communicator, Error, Result, Tag};

pub use cost_model::plan::{block_range, block_start};

/// Borrows `a` immutably and `b` mutably from one slice; the ranges must not overlap
/// (every caller passes distinct blocks of one partition).
#[inline]
pub(crate) fn pair_mut<T>(buf: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    if a.end <= b.start {
        let (x, y) = buf.split_at_mut(b.start);
        (&x[a], &mut y[..b.end - b.start])
    } else {
        debug_assert!(b.end <= a.start, "overlapping ranges {a:?} {b:?}");
        let (x, y) = buf.split_at_mut(a.start);
        (&y[..a.end - a.start], &mut x[b])
    }
}

/// With `opts.check`, [`agree`] on the call: operation, length, algorithm code and
/// parameter, wire type (for the reducing operations) and root; nothing otherwise.
pub(crate) fn check_call<C: Communicator + ?Sized>(
    comm: &C,
    opts: &crate::dense::DenseOptions,
    op: crate::dense::Op,
    len: usize,
    (code, param): (u64, u64),
    root: usize,
) -> Result<()> {
    use crate::dense::Op;
    if !opts.check {
        return Ok(());
    }
    let wire = match op {
        Op::Allgather | Op::Broadcast => 0,
        Op::Allreduce | Op::ReduceScatter | Op::Reduce => opts.wire.code(),
    };
    agree(
        comm,
        [op as u64, len as u64, code, param, wire, root as u64],
    )
}

/// Field names of the agreement words, for the error message.
const FIELDS: [&str; 6] = [
    "operation",
    "buffer length",
    "algorithm",
    "algorithm parameter",
    "wire type",
    "root",
];

/// Every rank's `words`, in rank order: one Bruck all-gather of `8·N` bytes per rank
/// (`⌈log2 P⌉` rounds whatever the values, so it cannot hang on a disagreement).
pub(crate) fn gather_words<C: Communicator + ?Sized, const N: usize>(
    comm: &C,
    words: [u64; N],
    tag: Tag,
) -> Result<Vec<[u64; N]>> {
    let p = comm.size();
    let mine: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut all = vec![0u8; 8 * N * p];
    gather_core(
        comm,
        &mine,
        &mut all,
        &vec![8 * N; p],
        AllgatherAlgo::Bruck,
        tag,
    )?;
    Ok(all
        .chunks_exact(8 * N)
        .map(|rank| {
            std::array::from_fn(|f| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&rank[8 * f..8 * f + 8]);
                u64::from_le_bytes(b)
            })
        })
        .collect())
}

/// Checks that every rank called the same collective with the same length, algorithm,
/// parameters, wire type and root: one Bruck all-gather of six words per rank (⌈log2 P⌉
/// rounds, the same on every rank whatever the arguments). Every rank then holds the same
/// table and returns the same [`Error::Mismatch`] on disagreement; none hangs.
pub(crate) fn agree<C: Communicator + ?Sized>(comm: &C, words: [u64; 6]) -> Result<()> {
    let p = comm.size();
    if p <= 1 {
        return Ok(());
    }
    let all = gather_words(comm, words, tags::CHECK)?;
    let get = |r: usize, f: usize| all[r][f];
    for (f, what) in FIELDS.iter().enumerate() {
        if (1..p).any(|r| get(r, f) != get(0, f)) {
            let detail = (0..p)
                .map(|r| format!("rank {r}: {}", get(r, f)))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Error::Mismatch { what, detail });
        }
    }
    Ok(())
}
