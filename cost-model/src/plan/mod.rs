//! Message plans: each collective's schedule written once, as pure data.
//!
//! A plan is one rank's program: the sends, receives and send-receives it performs, in
//! order, with the peer, the tag and the part of its buffer each message carries. The
//! executors in `collectives` run these plans over a real transport, and
//! [`crate::dense::predict_dense`] / [`crate::sparse_replay::replay_sparse`] turn the same
//! plans into a [`crate::Schedule`] for the clock model, so the two cannot drift apart.
//! Sizes that depend on the data (sparse counts) are inputs of the sparse plans.
//!
//! - [`dense`]: every dense algorithm (all-reduce, all-gather, reduce-scatter, broadcast,
//!   reduce), with ranges in the units of the caller's buffer (elements or bytes);
//! - [`sparse`]: the round structure of the sparse algorithms (Bruck all-gather over a
//!   group, SparDL's Spar-Reduce-Scatter partners, team and block sizes) and the
//!   all-reduce chooser the sparse algorithms use for their dense phases.

use std::ops::Range;

use crate::schedule::{Op, Schedule};

pub mod dense;
pub mod sparse;

/// How a received message is combined with the buffer range it lands in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Overwrite the range with the message.
    Copy,
    /// Add the message to the range. `lower_first`: the message comes from the operand
    /// of the lower rank, so the sum is written `recv + own` (the operand order is fixed
    /// so that ranks computing the same sum get the same bits).
    Sum {
        /// Whether the received operand is the lower-ranked one.
        lower_first: bool,
    },
}

impl Combine {
    /// A sum with the received operand second.
    pub const ADD: Combine = Combine::Sum { lower_first: false };

    /// Whether the message is added (reduction work for the γ term).
    pub fn reduces(self) -> bool {
        matches!(self, Combine::Sum { .. })
    }
}

/// One step of a rank's plan. Ranges index the rank's buffer in the plan's unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send `range` to rank `to`.
    Send {
        /// Destination rank.
        to: usize,
        /// Message tag.
        tag: u32,
        /// Part of the buffer sent.
        range: Range<usize>,
    },
    /// Receive exactly `range.len()` units from `from` into `range`.
    Recv {
        /// Source rank.
        from: usize,
        /// Message tag.
        tag: u32,
        /// Where the message lands.
        range: Range<usize>,
        /// Copy or add.
        combine: Combine,
    },
    /// Send `send` to `to` and receive `recv` from `from` in one round (same tag both
    /// ways). `send == recv` is an in-place exchange of one range.
    SendRecv {
        /// Destination rank.
        to: usize,
        /// Part of the buffer sent.
        send: Range<usize>,
        /// Source rank.
        from: usize,
        /// Where the message lands.
        recv: Range<usize>,
        /// Message tag.
        tag: u32,
        /// Copy or add.
        combine: Combine,
    },
    /// No message: round `range` to the wire element type, so that a rank keeping a value
    /// it computed holds the bits the receivers decode.
    Round {
        /// The range to round.
        range: Range<usize>,
    },
}

impl Step {
    /// The exchange of the butterfly algorithms: send `send` to `partner` and receive
    /// `recv` from the same partner in one round.
    pub fn swap(
        partner: usize,
        send: Range<usize>,
        recv: Range<usize>,
        tag: u32,
        combine: Combine,
    ) -> Step {
        Step::SendRecv {
            to: partner,
            send,
            from: partner,
            recv,
            tag,
            combine,
        }
    }

    /// Units this step sends (0 for a receive or a rounding).
    pub fn sent(&self) -> usize {
        match self {
            Step::Send { range, .. } => range.len(),
            Step::SendRecv { send, .. } => send.len(),
            _ => 0,
        }
    }

    /// Units this step receives.
    pub fn received(&self) -> usize {
        match self {
            Step::Recv { range, .. } => range.len(),
            Step::SendRecv { recv, .. } => recv.len(),
            _ => 0,
        }
    }

    /// The same step with every rank renamed by `map` and every range shifted by `offset`.
    pub fn relocated(&self, map: &dyn Fn(usize) -> usize, offset: usize) -> Step {
        let sh = |r: &Range<usize>| r.start + offset..r.end + offset;
        match self {
            Step::Send { to, tag, range } => Step::Send {
                to: map(*to),
                tag: *tag,
                range: sh(range),
            },
            Step::Recv {
                from,
                tag,
                range,
                combine,
            } => Step::Recv {
                from: map(*from),
                tag: *tag,
                range: sh(range),
                combine: *combine,
            },
            Step::SendRecv {
                to,
                send,
                from,
                recv,
                tag,
                combine,
            } => Step::SendRecv {
                to: map(*to),
                send: sh(send),
                from: map(*from),
                recv: sh(recv),
                tag: *tag,
                combine: *combine,
            },
            Step::Round { range } => Step::Round { range: sh(range) },
        }
    }
}

/// Largest message of a plan, in units (the scratch an executor needs).
pub fn max_message(steps: &[Step]) -> usize {
    steps
        .iter()
        .map(|s| s.sent().max(s.received()))
        .max()
        .unwrap_or(0)
}

/// Appends rank `rank`'s plan to `schedule`, `unit_bytes` bytes per unit.
pub fn push_schedule(schedule: &mut Schedule, rank: usize, steps: &[Step], unit_bytes: usize) {
    for st in steps {
        let op = match st {
            Step::Send { to, tag, range } => Op::Send {
                to: *to,
                tag: *tag,
                bytes: range.len() * unit_bytes,
            },
            Step::Recv {
                from, tag, combine, ..
            } => Op::Recv {
                from: *from,
                tag: *tag,
                reduce: combine.reduces(),
            },
            Step::SendRecv {
                to,
                send,
                from,
                tag,
                combine,
                ..
            } => Op::SendRecv {
                to: *to,
                send_tag: *tag,
                bytes: send.len() * unit_bytes,
                from: *from,
                recv_tag: *tag,
                reduce: combine.reduces(),
            },
            Step::Round { .. } => continue,
        };
        schedule.ops[rank].push(op);
    }
}

/// Start of block `i` when `n` items are split into `parts` nearly equal blocks (the first
/// `n mod parts` blocks get one more).
#[inline]
pub fn block_start(n: usize, parts: usize, i: usize) -> usize {
    if parts == 0 {
        return 0;
    }
    i * (n / parts) + i.min(n % parts)
}

/// Range of block `i` of `n` items split into `parts` nearly equal blocks.
#[inline]
pub fn block_range(n: usize, parts: usize, i: usize) -> Range<usize> {
    block_start(n, parts, i)..block_start(n, parts, i + 1)
}

/// The `parts + 1` bounds of `n` items split into `parts` blocks, shifted by `offset`.
pub fn bounds(n: usize, parts: usize, offset: usize) -> Vec<usize> {
    (0..=parts)
        .map(|i| offset + block_start(n, parts, i))
        .collect()
}

/// `⌈log2 p⌉` for `p ≥ 1` (0 for `p ≤ 1`).
pub fn ceil_log2(p: usize) -> u32 {
    if p <= 1 {
        0
    } else {
        usize::BITS - (p - 1).leading_zeros()
    }
}

/// The standard fold-in of non-power-of-two rank counts (Thakur, Rabenseifner & Gropp
/// 2005, §4): with `p2` the largest power of two ≤ `p` and `rem = p − p2`, ranks
/// `0..2·rem` pair up (even → odd), the even ones sit out, and the remaining `p2` ranks
/// get virtual ranks `0..p2`. Virtual rank `v` stands for the contiguous original ranks
/// `orig_lo(v)..orig_lo(v + 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fold {
    /// Largest power of two ≤ P.
    pub p2: usize,
    /// `P − p2`: the number of folded-out ranks.
    pub rem: usize,
}

impl Fold {
    /// The fold of `p` ranks.
    pub fn new(p: usize) -> Self {
        let p2 = if p == 0 {
            0
        } else {
            1usize << (usize::BITS - 1 - p.leading_zeros())
        };
        Fold { p2, rem: p - p2 }
    }

    /// The virtual rank of `r`, or `None` for an even rank folded into `r + 1`.
    pub fn virt(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem {
            (r % 2 == 1).then_some(r / 2)
        } else {
            Some(r - self.rem)
        }
    }

    /// The original rank that acts for virtual rank `v`.
    pub fn actor(&self, v: usize) -> usize {
        if v < self.rem {
            2 * v + 1
        } else {
            v + self.rem
        }
    }

    /// First original rank that virtual rank `v` stands for (`orig_lo(p2) = p`).
    pub fn orig_lo(&self, v: usize) -> usize {
        if v < self.rem {
            2 * v
        } else {
            v + self.rem
        }
    }

    /// Whether original rank `r` takes in a folded-out partner (`r − 1`).
    pub fn takes_in(&self, r: usize) -> bool {
        r < 2 * self.rem && r % 2 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_log2_values() {
        assert_eq!(
            (1..=9).map(ceil_log2).collect::<Vec<_>>(),
            vec![0, 1, 2, 2, 3, 3, 3, 3, 4]
        );
    }

    #[test]
    fn fold_covers_every_rank_once() {
        for p in 1..=33 {
            let f = Fold::new(p);
            assert!(f.p2.is_power_of_two() && f.p2 <= p && 2 * f.p2 > p);
            let mut seen = vec![0; p];
            for v in 0..f.p2 {
                let end = if v + 1 == f.p2 { p } else { f.orig_lo(v + 1) };
                for c in &mut seen[f.orig_lo(v)..end] {
                    *c += 1;
                }
                assert_eq!(f.virt(f.actor(v)), Some(v));
            }
            assert!(seen.iter().all(|&c| c == 1), "P={p}");
        }
    }
}
