//! Small helpers shared by the dense algorithms: block partitions, disjoint borrows,
//! the power-of-two fold-in map, and the cross-rank agreement check.

use std::ops::Range;

use crate::dense::allgather::{gather_core, AllgatherAlgo};
use crate::dense::tags;
use crate::{Communicator, Error, Result};

/// Start of block `i` when `n` items are split into `parts` nearly equal blocks (the first
/// `n % parts` blocks get one more). The cost model replays the same split, so it owns it.
pub use cost_model::dense::block_start;

/// Range of block `i` of `n` items split into `parts` nearly equal blocks.
#[inline]
pub fn block_range(n: usize, parts: usize, i: usize) -> Range<usize> {
    block_start(n, parts, i)..block_start(n, parts, i + 1)
}

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

/// The standard fold-in of non-power-of-two rank counts (Thakur, Rabenseifner & Gropp
/// 2005, §4): with `p2` the largest power of two ≤ `p` and `rem = p − p2`, ranks
/// `0..2·rem` pair up (even → odd), the even ones sit out, and the remaining `p2` ranks
/// get virtual ranks `0..p2`. Virtual rank `v` stands for the contiguous original ranks
/// `orig_lo(v)..orig_lo(v + 1)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fold {
    pub p2: usize,
    pub rem: usize,
}

impl Fold {
    pub(crate) fn new(p: usize) -> Self {
        let p2 = if p == 0 {
            0
        } else {
            1usize << (usize::BITS - 1 - p.leading_zeros())
        };
        Fold { p2, rem: p - p2 }
    }

    /// The virtual rank of `r`, or `None` for an even rank folded into `r + 1`.
    pub(crate) fn virt(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem {
            if r % 2 == 0 {
                None
            } else {
                Some(r / 2)
            }
        } else {
            Some(r - self.rem)
        }
    }

    /// The original rank that acts for virtual rank `v`.
    pub(crate) fn actor(&self, v: usize) -> usize {
        if v < self.rem {
            2 * v + 1
        } else {
            v + self.rem
        }
    }

    /// First original rank that virtual rank `v` stands for (`orig_lo(p2) = p`).
    pub(crate) fn orig_lo(&self, v: usize) -> usize {
        if v < self.rem {
            2 * v
        } else {
            v + self.rem
        }
    }
}

/// `ceil(log2(p))` for `p ≥ 1`.
pub(crate) fn ceil_log2(p: usize) -> u32 {
    if p <= 1 {
        0
    } else {
        usize::BITS - (p - 1).leading_zeros()
    }
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
