//! Small helpers shared by the dense algorithms: block partitions (owned by the plans),
//! disjoint borrows, and the cross-rank agreement check.

use std::ops::Range;

use crate::dense::allgather::{gather_core, AllgatherAlgo};
use crate::dense::tags;
use crate::{Communicator, Error, Result};

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

/// Checks that every rank called the same collective with the same length, algorithm,
/// parameters, wire type and root: one Bruck all-gather of six words per rank (⌈log2 P⌉
/// rounds, the same on every rank whatever the arguments). Every rank then holds the same
/// table and returns the same [`Error::Mismatch`] on disagreement; none hangs.
pub(crate) fn agree<C: Communicator + ?Sized>(comm: &C, words: [u64; 6]) -> Result<()> {
    let p = comm.size();
    if p <= 1 {
        return Ok(());
    }
    let mut mine = [0u8; 48];
    for (i, w) in words.iter().enumerate() {
        mine[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let mut all = vec![0u8; 48 * p];
    gather_core(
        comm,
        &mine,
        &mut all,
        &vec![48; p],
        AllgatherAlgo::Bruck,
        tags::CHECK,
    )?;
    let get = |r: usize, f: usize| -> u64 {
        let o = r * 48 + f * 8;
        let mut b = [0u8; 8];
        b.copy_from_slice(&all[o..o + 8]);
        u64::from_le_bytes(b)
    };
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
