//! [`SparseAlgo`]: which sparse allreduce to build, each variant with the options that
//! algorithm takes. Names are parsed only at the edges ([`std::str::FromStr`],
//! [`std::fmt::Display`]); library code matches on the enum.

use std::fmt;
use std::str::FromStr;

use cost_model::plan::sparse::{OKTOPK_REBALANCE, OKTOPK_TAU};
use cost_model::{Algorithm, Observed, SparseStep};
use sparsify::SelectorKind;

use super::Sag;
use crate::Error;

/// A sparse allreduce and its options. `selector: None` is the algorithm's own default
/// (exact top-k; MSTopK for HiTopKComm, as MSTopK/HiTopKComm (Shi et al., MLSys 2021)
/// §3.2 pairs them); the algorithms need a selector with an exact count, so only
/// [`SelectorKind::Exact`] and [`SelectorKind::MsTopK`] are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseAlgo {
    /// TopkA: all-gather of every rank's local top-k ([`super::TopkA`]).
    TopkA {
        /// Local selector.
        selector: Option<SelectorKind>,
    },
    /// TopkDSA: dynamic sparse reduce-scatter + all-gather ([`super::TopkDsa`]).
    TopkDsa {
        /// Local selector.
        selector: Option<SelectorKind>,
    },
    /// gTopk: binomial tree of top-k merges ([`super::GTopk`]).
    GTopk {
        /// Local selector.
        selector: Option<SelectorKind>,
    },
    /// CLT-k: one leader's indices per step ([`super::CltK`]).
    CltK {
        /// The leader's selector.
        selector: Option<SelectorKind>,
    },
    /// SparDL (Zhao et al.) with a Spar-All-Gather variant ([`super::SparDl`]).
    SparDl {
        /// Which Spar-All-Gather.
        sag: Sag,
        /// Number of teams `d` for R-SAG (a power of two dividing P) and B-SAG (any divisor
        /// of P). `None`: `cost_model::plan::sparse::SagKind::default_teams` (2 for R-SAG
        /// when P is even and at least 4, else 1; for B-SAG the smallest prime factor of P
        /// that leaves teams of two or more ranks, else 1, so that a prime P keeps SRS).
        teams: Option<usize>,
        /// Block selector.
        selector: Option<SelectorKind>,
    },
    /// HiTopKComm (Shi et al., MLSys 2021), Algorithm 2 ([`super::HiTopK`]).
    HiTopK {
        /// GPUs per node `n` (must divide P). `None`: the transport's node structure
        /// ([`crate::comm::nodes::ranks_per_node`]: MPI's shared-memory groups, the
        /// simulated topology, a thread world's option).
        ranks_per_node: Option<usize>,
        /// Send values as `f16` (§5.3 uses FP16 on the wire; on by default, as the paper).
        f16_wire: bool,
        /// Selector of the node slice (MSTopK by default).
        selector: Option<SelectorKind>,
    },
    /// ExDyna (Yoon & Oh, CCGrid 2024) ([`super::ExDyna`]).
    ExDyna {
        /// Fast convergence, not in the paper (off: the paper's Algorithm 5 alone, which
        /// from its start `1/(2√k)` selects far more than `k` for hundreds of steps): the
        /// first `ExDyna::WARM_STEPS` steps select with the partitions' exact top-k
        /// thresholds, and outside Algorithm 5's band `[k/β, β·k]` the threshold step
        /// doubles while the count stays on one side (up to 5%) and halves when it
        /// crosses; see [`super::ExDyna`].
        warm_start: bool,
    },
    /// Ok-Topk (Li & Hoefler, PPoPP'22) ([`super::OkTopk`]): threshold selection, balanced
    /// split reduce-scatter, global selection, all-gather. Its selection is its own
    /// (thresholds, with an exact top-k every `tau` steps).
    OkTopk {
        /// Threshold re-estimation period τ in steps, at least 1 (the authors' code: 32).
        tau: u32,
        /// Region re-balancing period in steps, at least 1 (the authors' code: 64).
        rebalance: u32,
    },
}

impl SparseAlgo {
    /// Every algorithm with its default options, in report order.
    pub const ALL: [SparseAlgo; 10] = [
        SparseAlgo::TopkA { selector: None },
        SparseAlgo::TopkDsa { selector: None },
        SparseAlgo::GTopk { selector: None },
        SparseAlgo::CltK { selector: None },
        SparseAlgo::SparDl {
            sag: Sag::None,
            teams: None,
            selector: None,
        },
        SparseAlgo::SparDl {
            sag: Sag::Recursive,
            teams: None,
            selector: None,
        },
        SparseAlgo::SparDl {
            sag: Sag::Bruck,
            teams: None,
            selector: None,
        },
        SparseAlgo::HiTopK {
            ranks_per_node: None,
            f16_wire: true,
            selector: None,
        },
        SparseAlgo::ExDyna { warm_start: false },
        SparseAlgo::OkTopk {
            tau: OKTOPK_TAU,
            rebalance: OKTOPK_REBALANCE,
        },
    ];

    /// Short lower-case name, the cost model's (`topka`, `topkdsa`, `gtopk`, `cltk`,
    /// `spardl`, `spardl_rsag`, `spardl_bsag`, `hitopk`, `exdyna`, `oktopk`).
    pub fn name(&self) -> &'static str {
        self.cost_algorithm().name()
    }

    /// The local selector option (`None` for ExDyna and Ok-Topk, whose selection is their
    /// own).
    pub fn selector(&self) -> Option<SelectorKind> {
        match *self {
            SparseAlgo::TopkA { selector }
            | SparseAlgo::TopkDsa { selector }
            | SparseAlgo::GTopk { selector }
            | SparseAlgo::CltK { selector }
            | SparseAlgo::SparDl { selector, .. }
            | SparseAlgo::HiTopK { selector, .. } => selector,
            SparseAlgo::ExDyna { .. } | SparseAlgo::OkTopk { .. } => None,
        }
    }

    /// The same algorithm with `selector` (no change for ExDyna and Ok-Topk).
    pub fn with_selector(mut self, kind: SelectorKind) -> Self {
        match &mut self {
            SparseAlgo::TopkA { selector }
            | SparseAlgo::TopkDsa { selector }
            | SparseAlgo::GTopk { selector }
            | SparseAlgo::CltK { selector }
            | SparseAlgo::SparDl { selector, .. }
            | SparseAlgo::HiTopK { selector, .. } => *selector = Some(kind),
            SparseAlgo::ExDyna { .. } | SparseAlgo::OkTopk { .. } => {}
        }
        self
    }

    /// SparDL's team count option (`None` elsewhere or when left to the default).
    pub fn teams(&self) -> Option<usize> {
        match *self {
            SparseAlgo::SparDl { teams, .. } => teams,
            _ => None,
        }
    }

    /// HiTopKComm's ranks per node option (`None` elsewhere or when left to the default).
    pub fn ranks_per_node(&self) -> Option<usize> {
        match *self {
            SparseAlgo::HiTopK { ranks_per_node, .. } => ranks_per_node,
            _ => None,
        }
    }

    /// HiTopKComm's `f16` wire option (`false` elsewhere).
    pub fn f16_wire(&self) -> bool {
        matches!(self, SparseAlgo::HiTopK { f16_wire: true, .. })
    }

    /// ExDyna's fast-convergence option (`false` elsewhere).
    pub fn warm_start(&self) -> bool {
        matches!(self, SparseAlgo::ExDyna { warm_start: true })
    }

    /// Ok-Topk's periods `(tau, rebalance)` (`None` elsewhere).
    pub fn oktopk_periods(&self) -> Option<(u32, u32)> {
        match *self {
            SparseAlgo::OkTopk { tau, rebalance } => Some((tau, rebalance)),
            _ => None,
        }
    }

    /// The cost model's name for this algorithm (its options aside).
    pub fn cost_algorithm(&self) -> Algorithm {
        match *self {
            SparseAlgo::TopkA { .. } => Algorithm::Topka,
            SparseAlgo::TopkDsa { .. } => Algorithm::Topkdsa,
            SparseAlgo::GTopk { .. } => Algorithm::Gtopk,
            SparseAlgo::CltK { .. } => Algorithm::Cltk,
            SparseAlgo::SparDl { sag: Sag::None, .. } => Algorithm::Spardl,
            SparseAlgo::SparDl {
                sag: Sag::Recursive,
                ..
            } => Algorithm::SpardlRsag,
            SparseAlgo::SparDl {
                sag: Sag::Bruck, ..
            } => Algorithm::SpardlBsag,
            SparseAlgo::HiTopK { .. } => Algorithm::Hitopk,
            SparseAlgo::ExDyna { .. } => Algorithm::Exdyna,
            SparseAlgo::OkTopk { .. } => Algorithm::Oktopk,
        }
    }

    /// The cost model's replay of step `step` of this algorithm with its options, for
    /// `observed` counts (the replay `cost_model::replay_sparse` prices and
    /// `cost_model::sparse_replay::sparse_schedule` lays out).
    pub fn replay_step(&self, d: usize, density: f64, step: u64, observed: Observed) -> SparseStep {
        let (oktopk_tau, oktopk_rebalance) = self
            .oktopk_periods()
            .unwrap_or((OKTOPK_TAU, OKTOPK_REBALANCE));
        SparseStep {
            oktopk_tau,
            oktopk_rebalance,
            teams: self.teams(),
            ranks_per_node: self.ranks_per_node(),
            f16_wire: self.f16_wire(),
            step,
            exdyna_warm_start: self.warm_start(),
            observed,
            ..SparseStep::new(self.cost_algorithm(), d, density)
        }
    }

    /// Position in [`SparseAlgo::ALL`] plus one: the algorithm's word in the agreement check.
    pub(crate) fn code(&self) -> u64 {
        let name = self.name();
        SparseAlgo::ALL
            .iter()
            .position(|a| a.name() == name)
            .map_or(0, |i| i as u64 + 1)
    }
}

impl fmt::Display for SparseAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SparseAlgo {
    type Err = Error;
    /// The algorithm called `s`, with default options.
    fn from_str(s: &str) -> Result<Self, Error> {
        let known = SparseAlgo::ALL.map(|a| a.name());
        let unknown = || {
            format!(
                "unknown sparse allreduce {s:?}; known: {}",
                known.join(", ")
            )
        };
        let i = known.iter().position(|n| *n == s);
        i.map(|i| SparseAlgo::ALL[i])
            .ok_or_else(|| Error::InvalidArgument(unknown()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_codes_differ() {
        for (i, a) in SparseAlgo::ALL.iter().enumerate() {
            assert_eq!(a.name().parse::<SparseAlgo>().unwrap(), *a);
            assert_eq!(a.to_string(), a.name());
            assert_eq!(a.code(), i as u64 + 1);
        }
        assert!("nope".parse::<SparseAlgo>().is_err());
        let a = SparseAlgo::ALL[0].with_selector(SelectorKind::MsTopK);
        assert_eq!(a.selector(), Some(SelectorKind::MsTopK));
    }
}
