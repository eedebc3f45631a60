//! Clusters with the papers' published constants, so that planners and simulations can be
//! run for hardware we do not have. Every constant cites where it comes from.

use serde::{Deserialize, Serialize};

use crate::models::{LinearModel, SparseAllgatherModel, TopkModel};
use crate::{Error, Link, Result, Topology};

/// Top-k coefficient of the OMGS cluster: `t_s(x) = 2.18896957e-10 · x · log2 x` seconds for `x`
/// elements (OMGS-SGD (Shi et al., INFOCOM 2020) Eq. 10 and §V-B, γ·ρ folded for ρ = 0.001;
/// constant from the authors' code; the paper rounds it to γ = 2.2·10⁻¹⁰, P102-100 GPU).
pub const OMGS_TOPK_GAMMA_RHO: f64 = 2.18896957e-10;

/// Density the OMGS constants were measured at (OMGS-SGD (Shi et al., INFOCOM 2020) §V-B:
/// ρ = 0.001).
pub const OMGS_DENSITY: f64 = 0.001;

/// Dense all-reduce α of MG-WFBP as the OMGS authors' code carries it, seconds.
pub const MGWFBP_ALPHA_S: f64 = 9.618801111215886e-08;

/// Dense all-reduce β of MG-WFBP as the OMGS authors' code carries it,
/// seconds per byte.
pub const MGWFBP_BETA_S: f64 = 3.89407453e-13;

/// Sparse all-gather `(P, a, b)` of the OMGS 1 GbE cluster: `t(x) = (a + b·x·P·4)·2` (OMGS-SGD
/// (Shi et al., INFOCOM 2020) Eq. 11 and Fig. 2(b); constants from the authors'
/// code).
pub const OMGS_ALLGATHER: [(usize, f64, f64); 4] = [
    (2, 1.6e-3, 1.0e-8),
    (4, 2.7e-3, 1.3e-8),
    (8, 4.0e-3, 1.5e-8),
    (16, 1.1e-2, 1.7e-8),
];

/// The OMGS-SGD evaluation cluster: 16 nodes with one P102-100 GPU each on 1 GbE
/// (OMGS-SGD (Shi et al., INFOCOM 2020) §V-A/B), with the constants of the authors' code.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OmgsPreset {
    /// Number of workers P (2, 4, 8 or 16: the sizes the authors measured).
    pub ranks: usize,
    /// Top-k selection time `2.18896957e-10 · x · log2 x` (OMGS-SGD (Shi et al., INFOCOM 2020)
    /// Eq. 10).
    pub topk: TopkModel,
    /// All-gather of a sparse group, `(a + b·x·P·4)·2` (OMGS-SGD (Shi et al., INFOCOM 2020)
    /// Eq. 11).
    pub sparse_allgather: SparseAllgatherModel,
    /// Dense all-reduce `α + β·n` with MG-WFBP's α, β as the authors' code carries them
    /// (`n` in bytes). These constants imply far more bandwidth than 1 GbE, so they are
    /// not a model of this cluster's wire: use them only where the OMGS code does (the
    /// MG-WFBP dense baseline).
    pub dense: LinearModel,
    /// Density ρ the top-k model is valid at (0.001).
    pub density: f64,
}

/// The OMGS 1 GbE cluster for `p ∈ {2, 4, 8, 16}` workers (OMGS-SGD (Shi et al., INFOCOM 2020)).
/// Other worker counts were not measured by the authors and are an [`Error::InvalidArgument`]
/// rather than a guess.
pub fn omgs_1gbe(p: usize) -> Result<OmgsPreset> {
    let &(_, a, b) = OMGS_ALLGATHER
        .iter()
        .find(|(q, _, _)| *q == p)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the OMGS 1 GbE preset exists for P = 2, 4, 8, 16 only (the authors' \
             measurements), not P = {p}"
            ))
        })?;
    Ok(OmgsPreset {
        ranks: p,
        topk: TopkModel::Omgs {
            gamma_rho: OMGS_TOPK_GAMMA_RHO,
        },
        sparse_allgather: SparseAllgatherModel {
            ranks: p,
            a_s: a,
            b_s_per_byte: b,
        },
        dense: LinearModel::new(MGWFBP_ALPHA_S, MGWFBP_BETA_S),
        density: OMGS_DENSITY,
    })
}

/// The density OMGS-SGD (Shi et al., INFOCOM 2020) §V-C trains each model at: ρ = 0.005 for
/// the LSTM on PTB, ρ = 0.001 for the CNNs (and for any other model).
pub fn omgs_density(model: &str) -> f64 {
    match model {
        "lstm_ptb" | "lstm" => 0.005,
        _ => OMGS_DENSITY,
    }
}

impl OmgsPreset {
    /// The same cluster at density `rho`: Eq. 10's top-k time `γ·ρ·x·log2 x` scales with ρ
    /// (the published constant is `γ·ρ` at ρ = 0.001), and so does what a group sends.
    pub fn at_density(self, rho: f64) -> Result<Self> {
        if !(rho.is_finite() && rho > 0.0 && rho <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "density {rho} outside (0, 1]"
            )));
        }
        Ok(OmgsPreset {
            topk: TopkModel::Omgs {
                gamma_rho: OMGS_TOPK_GAMMA_RHO * rho / OMGS_DENSITY,
            },
            density: rho,
            ..self
        })
    }

    /// The cluster at the density OMGS-SGD trains `model` with ([`omgs_density`]).
    pub fn for_model(self, model: &str) -> Result<Self> {
        self.at_density(omgs_density(model))
    }

    /// A flat topology of `P` ranks whose one link is the all-gather's `a` and `b`
    /// (per-message start-up and per-byte time), for running algorithms on `SimComm`
    /// against this cluster. An approximation: `a` is the start-up of a whole all-gather.
    pub fn topology(&self) -> Result<Topology> {
        Topology::flat(
            self.ranks,
            Link::new(
                self.sparse_allgather.a_s,
                self.sparse_allgather.b_s_per_byte,
            ),
        )
    }
}

impl OmgsPreset {
    /// A flat topology on which a ring all-gather (`P − 1` rounds of `8·x` bytes: index and
    /// value per selected element) takes exactly Eq. 11's `(a + b·x·P·4)·2`: per message
    /// `α = 2a/(P − 1)` and per byte `β = b·P/(P − 1)`. Running the runtime's ring all-gather
    /// over `SimComm` on it in real time reproduces the authors' fitted network.
    pub fn ring_allgather_topology(&self) -> Result<Topology> {
        let p = self.ranks;
        if p < 2 {
            return Err(Error::InvalidArgument(
                "a ring all-gather needs at least 2 ranks".into(),
            ));
        }
        let m = (p - 1) as f64;
        let a = self.sparse_allgather.a_s;
        let b = self.sparse_allgather.b_s_per_byte;
        Topology::flat(p, Link::new(2.0 * a / m, b * p as f64 / m))
    }
}

/// Per-message latency of 1 Gbit/s Ethernet with TCP, seconds. Chosen, not published: paper
/// 000 publishes only whole-collective fits (see [`OMGS_ALLGATHER`]); 50 µs is a typical
/// one-way small-message latency of MPI over TCP on GbE.
pub const ETHERNET_1GBE_ALPHA_S: f64 = 50e-6;

/// OMGS-SGD's cluster as physical links: `nodes` machines, one GPU each, joined by 1 Gbit/s
/// Ethernet with [`ETHERNET_1GBE_ALPHA_S`] per message. Use it to run real algorithms on
/// `SimComm`: unlike [`OmgsPreset::topology`], α here is one message's start-up, not a whole
/// all-gather's.
pub fn ethernet_1gbe(nodes: usize) -> Result<Topology> {
    let link = Link::from_gbit(ETHERNET_1GBE_ALPHA_S, 1.0);
    Topology::new(nodes, 1, link, link)
}

/// Intra-node latency for V100 GPUs joined by NVLink, seconds. Chosen, not published:
/// MSTopK/HiTopKComm (Shi et al., MLSys 2021) gives no α; 5 µs is NCCL's typical intra-node
/// small-message latency.
pub const NVLINK_ALPHA_S: f64 = 5e-6;

/// Intra-node NVLink bandwidth, Gbit/s. Chosen: 2 NVLink-2 links of 25 GB/s between a pair
/// of V100s in a DGX-1-style hybrid cube mesh, 50 GB/s = 400 Gbit/s per direction.
pub const NVLINK_GBIT: f64 = 400.0;

/// Inter-node latency of a cloud 25 GbE VPC, seconds. Chosen, not published: 50 µs is a
/// typical TCP round-trip half on a virtual private connection.
pub const CLOUD_25GBE_ALPHA_S: f64 = 50e-6;

/// Inter-node bandwidth, Gbit/s (MSTopK/HiTopKComm (Shi et al., MLSys 2021) §5: 16 nodes on 25 Gbps
/// Ethernet).
pub const CLOUD_25GBE_GBIT: f64 = 25.0;

/// Reduction cost γ of a V100 summing f32 (seconds per byte): ~900 GB/s HBM2 read twice
/// and written once, so about 3 bytes of traffic per byte reduced. Chosen, not published.
pub const V100_GAMMA_S_PER_BYTE: f64 = 3.0 / 900e9;

/// MSTopK/HiTopKComm's cluster: 16 nodes × 8 V100 GPUs with NVLink inside a node and 25 GbE between
/// nodes (Shi et al., MLSys 2021, §2.2 and §5, Table 1). The paper publishes no
/// α or β; the link constants are the documented choices [`NVLINK_ALPHA_S`], [`NVLINK_GBIT`],
/// [`CLOUD_25GBE_ALPHA_S`], [`CLOUD_25GBE_GBIT`] and [`V100_GAMMA_S_PER_BYTE`].
pub fn cloud_16x8_25gbe() -> Topology {
    cloud_25gbe(16, 8)
}

/// A cluster like MSTopK/HiTopKComm's at another size, `nodes × gpus_per_node`, with the link
/// constants of [`cloud_16x8_25gbe`] (for scaling studies).
pub fn cloud_25gbe(nodes: usize, gpus_per_node: usize) -> Topology {
    Topology {
        nodes,
        ranks_per_node: gpus_per_node,
        intra: Link::from_gbit(NVLINK_ALPHA_S, NVLINK_GBIT),
        inter: Link::from_gbit(CLOUD_25GBE_ALPHA_S, CLOUD_25GBE_GBIT),
        gamma_s_per_byte: V100_GAMMA_S_PER_BYTE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omgs_constants_as_published() {
        let p = omgs_1gbe(16).unwrap();
        let x = 1usize << 20;
        let want = 2.18896957e-10 * x as f64 * 20.0;
        assert!((p.topk.time(x) - want).abs() <= 1e-15 * want);
        let ag = (1.1e-2 + 1.7e-8 * x as f64 * 16.0 * 4.0) * 2.0;
        assert!((p.sparse_allgather.time(x) - ag).abs() <= 1e-12 * ag);
        assert!((p.sparse_allgather.as_linear().time(x) - ag).abs() <= 1e-12 * ag);
        assert_eq!(p.dense.alpha_s, 9.618801111215886e-08);
        assert_eq!(p.dense.beta_s, 3.89407453e-13);
        for q in [2, 4, 8, 16] {
            assert_eq!(omgs_1gbe(q).unwrap().topology().unwrap().ranks(), q);
        }
    }

    #[test]
    fn a_ring_all_gather_on_the_ring_topology_takes_eq_11s_time() {
        let p = omgs_1gbe(16).unwrap();
        let t = p.ring_allgather_topology().unwrap();
        let x = 25_000usize;
        let ring = 15.0 * t.inter.time(8 * x);
        let eq11 = p.sparse_allgather.time(x);
        assert!((ring - eq11).abs() <= 1e-9 * eq11, "{ring} vs {eq11}");
    }

    #[test]
    fn the_lstm_preset_runs_at_its_own_density() {
        let p = omgs_1gbe(16).unwrap();
        let l = p.for_model("lstm_ptb").unwrap();
        assert_eq!(l.density, 0.005);
        let x = 1usize << 16;
        assert!((l.topk.time(x) / p.topk.time(x) - 5.0).abs() < 1e-12);
        assert_eq!(p.for_model("resnet50").unwrap(), p);
        assert!(p.at_density(0.0).is_err());
    }

    #[test]
    fn omgs_unmeasured_p_is_a_typed_error() {
        for q in [0, 1, 3, 32] {
            assert!(matches!(omgs_1gbe(q), Err(Error::InvalidArgument(_))));
        }
    }

    #[test]
    fn cloud_cluster_is_valid() {
        let t = cloud_16x8_25gbe();
        t.validate().unwrap();
        assert_eq!(t.ranks(), 128);
        assert!(t.inter.time(1 << 20) > 10.0 * t.intra.time(1 << 20));
    }
}
