//! Names of the algorithms the cost model prices, shared by dense and sparse predictions,
//! the chooser and the calibration JSON.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// Every collective algorithm of `collectives`, dense and sparse. The short lower-case
/// names ([`Algorithm::name`]) are what JSON files and command lines use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Ring (reduce-scatter + all-gather for all-reduce).
    Ring,
    /// Recursive doubling (recursive halving for reduce-scatter), fold-in for other P.
    RecursiveDoubling,
    /// Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather.
    Rabenseifner,
    /// Bruck all-gather.
    Bruck,
    /// Binomial tree (Linear Pipelining's MST); all-reduce = reduce + broadcast.
    Binomial,
    /// Linear pipeline with a block size (Linear Pipelining (Wang et al.)).
    Lp,
    /// Bidirectional exchange (Linear Pipelining (Wang et al.) Table 1 "BE").
    Be,
    /// 2D torus / hierarchical all-reduce (MSTopK/HiTopKComm (Shi et al., MLSys 2021) §5.3).
    Torus2d,
    /// Broadcast by binomial scatter + ring all-gather.
    ScatterAllgather,
    /// Sparse: all-gather of every rank's top-k (SparDL (Zhao et al.) Table 1 "TopkA").
    Topka,
    /// Sparse: TopkDSA (SparDL (Zhao et al.) Table 1).
    Topkdsa,
    /// Sparse: global top-k tree (gTopk, SparDL (Zhao et al.) Table 1).
    Gtopk,
    /// Sparse: CLT-k, one leader's indices (SparDL (Zhao et al.) Table 1).
    Cltk,
    /// Sparse: SparDL, Spar-Reduce-Scatter + Spar-All-Gather (SparDL (Zhao et al.)).
    Spardl,
    /// Sparse: SparDL with the R-SAG all-gather (SparDL (Zhao et al.)).
    SpardlRsag,
    /// Sparse: SparDL with the B-SAG all-gather (SparDL (Zhao et al.) Alg. 2).
    SpardlBsag,
    /// Sparse: hierarchical top-k communication (MSTopK/HiTopKComm (Shi et al., MLSys 2021) Alg. 2,
    /// Eq. 7-10).
    Hitopk,
    /// Sparse: ExDyna (Yoon & Oh, CCGrid 2024).
    Exdyna,
    /// Sparse: Ok-Topk (Li & Hoefler, PPoPP'22), balanced split reduce-scatter of
    /// threshold-selected values and an all-gather of the global selection (SparDL (Zhao
    /// et al.) Table 1 "Ok-Topk").
    Oktopk,
    /// Dense: the collective of the library under the transport (`MPI_Allreduce`,
    /// `MPI_Allgather`, `MPI_Reduce_scatter`), whatever algorithm it picks inside. It has
    /// no schedule to predict from: only a calibration that measured it prices it.
    Library,
    /// Dense: through memory all ranks of one machine share (`collectives`'s
    /// `SharedMemory` all-reduce, all-gather and reduce-scatter). Its cost is memory
    /// traffic and flag exchanges, not link constants: only a calibration that measured it
    /// prices it.
    SharedMemory,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 21] = [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::Rabenseifner,
        Algorithm::Bruck,
        Algorithm::Binomial,
        Algorithm::Lp,
        Algorithm::Be,
        Algorithm::Torus2d,
        Algorithm::ScatterAllgather,
        Algorithm::Topka,
        Algorithm::Topkdsa,
        Algorithm::Gtopk,
        Algorithm::Cltk,
        Algorithm::Spardl,
        Algorithm::SpardlRsag,
        Algorithm::SpardlBsag,
        Algorithm::Hitopk,
        Algorithm::Exdyna,
        Algorithm::Oktopk,
        Algorithm::Library,
        Algorithm::SharedMemory,
    ];

    /// The short lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::Rabenseifner => "rabenseifner",
            Algorithm::Bruck => "bruck",
            Algorithm::Binomial => "binomial",
            Algorithm::Lp => "lp",
            Algorithm::Be => "be",
            Algorithm::Torus2d => "torus2d",
            Algorithm::ScatterAllgather => "scatter_allgather",
            Algorithm::Topka => "topka",
            Algorithm::Topkdsa => "topkdsa",
            Algorithm::Gtopk => "gtopk",
            Algorithm::Cltk => "cltk",
            Algorithm::Spardl => "spardl",
            Algorithm::SpardlRsag => "spardl_rsag",
            Algorithm::SpardlBsag => "spardl_bsag",
            Algorithm::Hitopk => "hitopk",
            Algorithm::Exdyna => "exdyna",
            Algorithm::Oktopk => "oktopk",
            Algorithm::Library => "library",
            Algorithm::SharedMemory => "shared_memory",
        }
    }

    /// Whether this is a sparse (top-k) algorithm.
    pub fn is_sparse(self) -> bool {
        matches!(
            self,
            Algorithm::Topka
                | Algorithm::Topkdsa
                | Algorithm::Gtopk
                | Algorithm::Cltk
                | Algorithm::Spardl
                | Algorithm::SpardlRsag
                | Algorithm::SpardlBsag
                | Algorithm::Hitopk
                | Algorithm::Exdyna
                | Algorithm::Oktopk
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| Error::InvalidArgument(format!("unknown algorithm {s:?}")))
    }
}

/// The dense collective operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// Sum over all ranks, result everywhere.
    Allreduce,
    /// Every rank's block everywhere.
    Allgather,
    /// Sum, each rank keeping one block.
    ReduceScatter,
    /// The root's buffer everywhere.
    Broadcast,
    /// Sum at the root.
    Reduce,
}

impl Collective {
    /// The short lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Allreduce => "allreduce",
            Collective::Allgather => "allgather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
        }
    }

    /// The algorithms `collectives` implements for this operation.
    pub fn algorithms(self) -> &'static [Algorithm] {
        use Algorithm::*;
        match self {
            Collective::Allreduce => &[
                Ring,
                RecursiveDoubling,
                Rabenseifner,
                Be,
                Binomial,
                Lp,
                Torus2d,
            ],
            Collective::Allgather => &[Ring, RecursiveDoubling, Bruck],
            Collective::ReduceScatter => &[Ring, RecursiveDoubling],
            Collective::Broadcast => &[Binomial, ScatterAllgather, Lp],
            Collective::Reduce => &[Binomial, Lp, Be],
        }
    }

    /// Whether a calibration may hold a fit of `algo` for this operation: one of
    /// [`Collective::algorithms`], or [`Algorithm::Library`] and [`Algorithm::SharedMemory`]
    /// for the three operations they offer (all-reduce, all-gather, reduce-scatter).
    pub fn fits_algorithm(self, algo: Algorithm) -> bool {
        self.algorithms().contains(&algo)
            || (matches!(algo, Algorithm::Library | Algorithm::SharedMemory)
                && matches!(
                    self,
                    Collective::Allreduce | Collective::Allgather | Collective::ReduceScatter
                ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
            assert_eq!(
                serde_json::to_string(&a).unwrap(),
                format!("\"{}\"", a.name())
            );
        }
        assert!("nope".parse::<Algorithm>().is_err());
    }
}
