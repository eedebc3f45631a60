//! The round structure of the sparse all-reduces, written once: `collectives::sparse`
//! executes these rounds with the step's real entries, and
//! [`crate::sparse_replay::sparse_schedule`] prices them with the step's entry counts.
//!
//! The data-independent parts live here (partners, which blocks a round carries, team and
//! block sizes, the dense all-reduce chosen for a payload); the entry counts that depend
//! on the data are the replay's inputs ([`crate::Observed`]).

use super::ceil_log2;
use crate::{Algorithm, Error, Result};

/// Bytes of one sparse entry on the wire (u32 index + f32 value).
pub const ENTRY_BYTES: usize = 8;
/// Bytes of the length header before each block of a framed Bruck all-gather (one whose
/// block sizes the receivers do not know).
pub const FRAME_BYTES: usize = 4;
/// Payload below which [`default_allreduce`] picks recursive doubling (Open MPI's tuned
/// component switches from recursive doubling to Rabenseifner at 8 KiB for 4-7 ranks).
pub const SMALL_ALLREDUCE_BYTES: usize = 8 << 10;

/// Entries each rank selects: `k = clamp(⌈ρ·d⌉, 1, d)`.
pub fn k_of(d: usize, density: f64) -> usize {
    ((density * d as f64).ceil() as usize).clamp(1, d.max(1))
}

/// The dense all-reduce used without a calibrated predictor for `bytes` on `p` ranks:
/// recursive doubling for small payloads (latency-bound), Rabenseifner for larger ones on
/// powers of two, ring otherwise.
pub fn default_allreduce(p: usize, bytes: usize) -> Algorithm {
    if p <= 1 || bytes < SMALL_ALLREDUCE_BYTES {
        Algorithm::RecursiveDoubling
    } else if p.is_power_of_two() {
        Algorithm::Rabenseifner
    } else {
        Algorithm::Ring
    }
}

/// The direct exchanges of TopkDSA's split reduce-scatter for rank `r`: in round `s` (1 ≤
/// s < P) send to `r + s`, receive from `r − s`.
pub fn direct_exchanges(p: usize, r: usize) -> impl Iterator<Item = (usize, usize)> {
    (1..p).map(move |s| ((r + s) % p, (r + p - s) % p))
}

/// Which Spar-All-Gather SparDL (Zhao et al.) runs between its teams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SagKind {
    /// One team: Spar-Reduce-Scatter then a Bruck all-gather.
    None,
    /// R-SAG: recursive doubling between a power-of-two number of teams (§3.3 1).
    Recursive,
    /// B-SAG: Bruck all-gather between any number of teams dividing P (§3.3 2, Alg. 2).
    Bruck,
}

impl SagKind {
    /// The team count when none is asked for: 1 without SAG; for R-SAG 2 when P is even
    /// and at least 4, else 1; for B-SAG the smallest prime factor `f` of P when `P/f ≥ 2`,
    /// else 1. Every default leaves at least two ranks per team (or one team) so that the
    /// Spar-Reduce-Scatter, SparDL's answer to gradient accumulation, still runs: for a
    /// prime P the only divisors are 1 and P, and P teams of one rank would skip it.
    pub fn default_teams(self, p: usize) -> usize {
        match self {
            SagKind::None => 1,
            SagKind::Recursive => {
                if p % 2 == 0 && p >= 4 {
                    2
                } else {
                    1
                }
            }
            SagKind::Bruck => (2..p).find(|f| p % f == 0 && p / f >= 2).unwrap_or(1),
        }
    }
}

/// SparDL's partition: `teams` teams of `m = P / teams` consecutive ranks; `d` is split
/// into `m` blocks of `chunk = ⌈d/m⌉` (padded to `chunk · m`), and every block message
/// carries `k_block = ⌊chunk · ρ⌋` entries (from the authors' code), at least one: where
/// `⌊chunk · ρ⌋ = 0` the authors' code would move nothing at all, so a block then carries
/// its single largest entry (as every other algorithm selects `k = max(1, ⌈ρ·d⌉)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpardlLayout {
    /// Number of teams.
    pub teams: usize,
    /// Ranks per team.
    pub m: usize,
    /// Elements per block.
    pub chunk: usize,
    /// Entries per block message.
    pub k_block: usize,
}

impl SpardlLayout {
    /// The layout for `p` ranks; `teams = None` takes [`SagKind::default_teams`]. Errors
    /// when the teams do not divide P, or R-SAG gets a team count that is not a power of
    /// two.
    pub fn new(
        sag: SagKind,
        teams: Option<usize>,
        p: usize,
        d: usize,
        density: f64,
    ) -> Result<Self> {
        let teams = match sag {
            SagKind::None => 1,
            _ => teams.unwrap_or_else(|| sag.default_teams(p)),
        };
        if teams == 0 || p % teams != 0 {
            return Err(Error::InvalidArgument(format!(
                "SparDL: {teams} teams do not divide P = {p}"
            )));
        }
        if sag == SagKind::Recursive && !teams.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "SparDL R-SAG needs a power-of-two team count, got {teams} (use B-SAG)"
            )));
        }
        let m = p / teams;
        let chunk = d.div_ceil(m.max(1));
        let k_block = ((chunk as f64 * density).floor() as usize).clamp(1, chunk.max(1));
        Ok(SpardlLayout {
            teams,
            m,
            chunk,
            k_block,
        })
    }

    /// B-SAG's `h` for a step (SparDL (Zhao et al.), Algorithm 2, as implemented): `k_block`
    /// at full density (every index overlaps), else `round(h)` clamped to `[1, k_block]`.
    pub fn bsag_h(&self, h: f64) -> usize {
        if self.k_block == self.chunk {
            self.k_block
        } else {
            (h.round() as usize).clamp(1, self.k_block)
        }
    }

    /// World rank of team position `q` in team `t`.
    pub fn rank(&self, t: usize, q: usize) -> usize {
        t * self.m + q
    }

    /// The R-SAG partners of the rank at (`t`, `q`): recursive doubling over the teams.
    pub fn rsag_partners(&self, t: usize, q: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.teams.trailing_zeros()).map(move |s| self.rank(t ^ (1usize << s), q))
    }
}

/// One round of SparDL's Spar-Reduce-Scatter for team position `q` of `m`: send the
/// `count` blocks `(q + gap + j) mod m` (each top-k'd just before it is sent) to position
/// `q + gap`, and receive from `q − gap` the same number of blocks `(q + j) mod m`, to be
/// added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrsRound {
    /// Team position sent to.
    pub to: usize,
    /// Team position received from.
    pub from: usize,
    /// The distance `gap`; the first block sent is `(q + gap) mod m`.
    pub gap: usize,
    /// Blocks per message.
    pub count: usize,
}

/// Spar-Reduce-Scatter with the non-recursive partner structure for any team size `m`
/// (SparDL (Zhao et al.) §3.1): `⌈log2 m⌉` rounds, bag sizes `[2^i for i < rounds − 1] +
/// [m − 2^(rounds−1)]` reversed, `gap = m − sizes[0]` halved after each round.
pub fn srs_rounds(m: usize, q: usize) -> Vec<SrsRound> {
    if m <= 1 {
        return Vec::new();
    }
    let rounds = ceil_log2(m);
    let mut sizes: Vec<usize> = (0..rounds - 1).map(|i| 1usize << i).collect();
    sizes.push(m - (1usize << (rounds - 1)));
    sizes.reverse();
    let mut gap = m - sizes[0];
    sizes
        .into_iter()
        .map(|count| {
            let r = SrsRound {
                to: (q + gap) % m,
                from: (q + m - gap) % m,
                gap,
                count,
            };
            gap /= 2;
            r
        })
        .collect()
}

/// Ok-Topk's default period of the threshold re-estimation `τ` (Li & Hoefler, PPoPP'22; the
/// authors' code re-derives the local and the global threshold every 32 steps).
pub const OKTOPK_TAU: u32 = 32;
/// Ok-Topk's default period of the region re-balancing (the authors' code: every 64 steps).
pub const OKTOPK_REBALANCE: u32 = 64;
/// Bytes of one count on Ok-Topk's wire (u32).
pub const COUNT_BYTES: usize = 4;

/// What step `t` of Ok-Topk does besides its reduce-scatter and all-gather.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OktopkStep {
    /// `t mod τ = 0`: the local threshold is re-derived by an exact top-k, and the global
    /// selection is the exact top-k of every reduced entry (all of which are all-gathered),
    /// which also re-derives the global threshold.
    pub reestimate: bool,
    /// `t mod τ' = 0`: the region boundaries are re-balanced from this step's selections.
    pub rebalance: bool,
}

impl OktopkStep {
    /// Step `t` with re-estimation period `tau` and re-balancing period `rebalance` (both
    /// at least 1; 0 is read as 1).
    pub fn at(t: u64, tau: u32, rebalance: u32) -> Self {
        OktopkStep {
            reestimate: t % u64::from(tau.max(1)) == 0,
            rebalance: t % u64::from(rebalance.max(1)) == 0,
        }
    }

    /// The phases of this step, in order.
    pub fn phases(self) -> Vec<OktopkPhase> {
        let mut v = Vec::with_capacity(5);
        if self.rebalance {
            v.push(OktopkPhase::Boundaries);
        }
        v.extend([
            OktopkPhase::Counts,
            OktopkPhase::Reduce,
            OktopkPhase::GatherCounts,
            OktopkPhase::Gather,
        ]);
        v
    }
}

/// One phase of an Ok-Topk step (Li & Hoefler, PPoPP'22, §3; the round structure of the
/// authors' code). Direct phases take the `P − 1` rounds of [`direct_exchanges`]; the
/// all-gathers are Bruck's (`⌈log2 P⌉` rounds) with block sizes every receiver knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OktopkPhase {
    /// Re-balancing: all-gather every rank's `P − 1` proposed region boundaries (the
    /// indices that split its own selection into `P` equal counts, [`COUNT_BYTES`] each);
    /// the new boundaries are their means.
    Boundaries,
    /// The counts of the reduce-scatter: rank `r` tells rank `j` how many of its selected
    /// entries lie in region `j` (one [`COUNT_BYTES`] word per direct exchange).
    Counts,
    /// Split reduce-scatter: those entries, straight to the region's owner.
    Reduce,
    /// All-gather of each owner's count of globally selected entries.
    GatherCounts,
    /// All-gather of the globally selected entries of every region.
    Gather,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srs_rounds_deliver_every_block_once() {
        // Each position must receive contributions for its own block from all m − 1 others:
        // summed over rounds, the blocks received for block q total m − 1 senders.
        for m in 1..=17 {
            let rounds = srs_rounds(m, 0);
            assert_eq!(rounds.len(), ceil_log2(m) as usize);
            let sent: usize = rounds.iter().map(|r| r.count).sum();
            assert_eq!(sent, m.saturating_sub(1), "m={m}");
        }
    }

    #[test]
    fn layout_errors() {
        assert!(SpardlLayout::new(SagKind::Recursive, Some(3), 6, 60, 0.1).is_err());
        assert!(SpardlLayout::new(SagKind::Bruck, Some(4), 6, 60, 0.1).is_err());
        let l = SpardlLayout::new(SagKind::Bruck, None, 9, 90, 0.1).unwrap();
        assert_eq!((l.teams, l.m, l.chunk, l.k_block), (3, 3, 30, 3));
        // ⌊⌈d/m⌉·ρ⌋ = ⌊10 · 0.01⌋ = 0: one entry per block, never an empty message.
        let l = SpardlLayout::new(SagKind::None, None, 6, 60, 0.01).unwrap();
        assert_eq!((l.chunk, l.k_block), (10, 1));
    }

    #[test]
    fn default_teams_keep_the_spar_reduce_scatter() {
        for p in 1..=64usize {
            for sag in [SagKind::None, SagKind::Recursive, SagKind::Bruck] {
                let t = sag.default_teams(p);
                assert!(p % t == 0, "{sag:?} P={p}: {t}");
                assert!(t == 1 || p / t >= 2, "{sag:?} P={p}: {t} teams of one");
                assert!(SpardlLayout::new(sag, None, p, 10 * p, 0.1).is_ok());
            }
        }
        // Prime P: one team (all of SRS), not P teams of one rank.
        assert_eq!(SagKind::Bruck.default_teams(7), 1);
        assert_eq!(SagKind::Bruck.default_teams(9), 3);
        assert_eq!(SagKind::Recursive.default_teams(2), 1);
        assert_eq!(SagKind::Recursive.default_teams(6), 2);
    }

    #[test]
    fn oktopk_phases_follow_the_periods() {
        let s = |t| OktopkStep::at(t, 4, 8);
        assert_eq!(s(0).phases().len(), 5);
        assert_eq!(s(0).phases()[0], OktopkPhase::Boundaries);
        assert!(s(4).reestimate && !s(4).rebalance);
        assert!(!s(5).reestimate && !s(5).rebalance);
        assert_eq!(s(5).phases().len(), 4);
        assert!(s(16).reestimate && s(16).rebalance);
        assert!(OktopkStep::at(3, 0, 0).reestimate);
    }
}
