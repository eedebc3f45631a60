//! The cluster a cost is predicted for: `nodes × ranks_per_node` ranks, with one α-β link model
//! inside a node and one between nodes (MSTopK/HiTopKComm (Shi et al., MLSys 2021) Eq. 3 and 7-10
//! distinguish the two).
//!
//! Rank `r` lives on node `r / ranks_per_node` (block placement, as `mpirun --map-by core`
//! and one process per GPU give).

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Latency and inverse bandwidth of one kind of link (the Hockney α-β model).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// Start-up time of one message, seconds.
    pub alpha_s: f64,
    /// Transfer time per byte, seconds (1 / bandwidth).
    pub beta_s_per_byte: f64,
}

impl Link {
    /// A link from latency α in seconds and transfer time β in seconds per byte.
    pub const fn new(alpha_s: f64, beta_s_per_byte: f64) -> Self {
        Link {
            alpha_s,
            beta_s_per_byte,
        }
    }

    /// A link from latency in seconds and bandwidth in gigabits per second.
    pub fn from_gbit(alpha_s: f64, gbit_per_s: f64) -> Self {
        Link {
            alpha_s,
            beta_s_per_byte: 8.0 / (gbit_per_s * 1e9),
        }
    }

    /// Time to move one message of `bytes` bytes over this link: `α + β·bytes`.
    pub fn time(&self, bytes: usize) -> f64 {
        self.alpha_s + self.beta_s_per_byte * bytes as f64
    }

    fn validate(&self, which: &str) -> Result<()> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if ok(self.alpha_s) && ok(self.beta_s_per_byte) {
            Ok(())
        } else {
            Err(Error::InvalidTopology(format!(
                "{which} link has α = {} s, β = {} s/byte; both must be finite and ≥ 0",
                self.alpha_s, self.beta_s_per_byte
            )))
        }
    }
}

/// A cluster: `nodes × ranks_per_node` ranks, intra- and inter-node links, and the
/// reduction cost γ (seconds per byte of `f32` summed).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Number of nodes (machines).
    pub nodes: usize,
    /// Ranks (GPUs, processes) on each node.
    pub ranks_per_node: usize,
    /// Link between two ranks on the same node (NVLink, PCIe, shared memory).
    pub intra: Link,
    /// Link between two ranks on different nodes (Ethernet, InfiniBand).
    pub inter: Link,
    /// Reduction cost, seconds per byte reduced (γ of Linear Pipelining (Wang et al.) Table 1).
    #[serde(default)]
    pub gamma_s_per_byte: f64,
}

impl Topology {
    /// A flat cluster of `ranks` ranks, one per node, all joined by `link`.
    pub fn flat(ranks: usize, link: Link) -> Result<Self> {
        Topology::new(ranks, 1, link, link)
    }

    /// A cluster of `nodes × ranks_per_node` ranks; validates every field.
    pub fn new(nodes: usize, ranks_per_node: usize, intra: Link, inter: Link) -> Result<Self> {
        let t = Topology {
            nodes,
            ranks_per_node,
            intra,
            inter,
            gamma_s_per_byte: 0.0,
        };
        t.validate()?;
        Ok(t)
    }

    /// The same topology with reduction cost γ (seconds per byte).
    pub fn with_gamma(mut self, gamma_s_per_byte: f64) -> Result<Self> {
        self.gamma_s_per_byte = gamma_s_per_byte;
        self.validate()?;
        Ok(self)
    }

    /// Checks that counts are positive and every constant is finite and non-negative.
    pub fn validate(&self) -> Result<()> {
        if self.nodes == 0 || self.ranks_per_node == 0 {
            return Err(Error::InvalidTopology(format!(
                "{} nodes × {} ranks per node: both must be at least 1",
                self.nodes, self.ranks_per_node
            )));
        }
        self.intra.validate("intra-node")?;
        self.inter.validate("inter-node")?;
        if !(self.gamma_s_per_byte.is_finite() && self.gamma_s_per_byte >= 0.0) {
            return Err(Error::InvalidTopology(format!(
                "γ = {} s/byte must be finite and ≥ 0",
                self.gamma_s_per_byte
            )));
        }
        Ok(())
    }

    /// Total number of ranks, `nodes × ranks_per_node`.
    pub fn ranks(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    /// Checks that this topology describes exactly `p` ranks.
    pub fn check_ranks(&self, p: usize) -> Result<()> {
        if self.ranks() == p {
            Ok(())
        } else {
            Err(Error::TopologyMismatch {
                nodes: self.nodes,
                ranks_per_node: self.ranks_per_node,
                ranks: p,
            })
        }
    }

    /// The node that world rank `rank` lives on.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    /// The link a message from world rank `a` to world rank `b` crosses.
    pub fn link(&self, a: usize, b: usize) -> &Link {
        if self.node_of(a) == self.node_of(b) {
            &self.intra
        } else {
            &self.inter
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_follow_block_placement() {
        let t = Topology::new(
            2,
            4,
            Link::from_gbit(1e-6, 100.0),
            Link::from_gbit(5e-5, 1.0),
        )
        .unwrap();
        assert_eq!(t.ranks(), 8);
        assert_eq!(t.link(0, 3), &t.intra);
        assert_eq!(t.link(3, 4), &t.inter);
        assert!((t.inter.time(125_000_000) - (5e-5 + 1.0)).abs() < 1e-12);
    }

    #[test]
    fn bad_topologies_are_typed_errors() {
        let l = Link::from_gbit(1e-6, 10.0);
        assert!(matches!(
            Topology::new(0, 4, l, l),
            Err(Error::InvalidTopology(_))
        ));
        let bad = Link::new(f64::NAN, 0.0);
        assert!(Topology::new(1, 1, bad, l).is_err());
        let t = Topology::flat(4, l).unwrap();
        assert!(matches!(
            t.check_ranks(5),
            Err(Error::TopologyMismatch { .. })
        ));
    }

    #[test]
    fn json_round_trip() {
        let t = Topology::flat(3, Link::from_gbit(1e-5, 1.0)).unwrap();
        let s = serde_json::to_string(&t).unwrap();
        let back: Topology = serde_json::from_str(&s).unwrap();
        assert_eq!(t, back);
    }
}
