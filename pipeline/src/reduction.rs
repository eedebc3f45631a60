//! The training schemes, typed for the command line, and the one place that turns a
//! scheme into the runtime's pieces: the reduction [`Scheme`], the merge planner and the
//! costs the planner and the timeline use.
//!
//! - `dense`: all-reduce per MG-WFBP group (ring; BSP-SGD of Linear Pipelining (Wang et
//!   al.), Algorithm 3, with the reduce overlapping backward).
//! - `topk`, `lags`, `mgs`, `omgs`: top-k with error feedback and a sparse all-gather,
//!   merged into one group, layer-wise, by threshold, or by the planner (OMGS-SGD (Shi et
//!   al., INFOCOM 2020)).
//! - every sparse all-reduce of `collectives::sparse` (SparDL (Zhao et al.), ExDyna (Yoon
//!   & Oh, CCGrid 2024), HiTopKComm, gTop-k, ...), one group each.
//! - `switch`: MSTopK with HiTopKComm for the first epochs, then the dense 2D torus
//!   all-reduce (MSTopK/HiTopKComm (Shi et al., MLSys 2021), §5.6).

use collectives::dense::AllreduceAlgo;
use collectives::sparse::{SelectorKind, SparseOptions};
use cost_model::Topology;
use serde::{Deserialize, Serialize};

use crate::check::RuntimeCosts;
use crate::plan::{MergePlan, Planner, DEFAULT_THRESHOLD};
use crate::schemes::{
    CollectiveScheme, Compress, DenseAllreduce, DenseExchange, Exchange, Identity, Scheme,
    TopkAllgather, TopkCompress,
};
use crate::timeline::{CalibratedCosts, DenseCosts, OmgsCosts, StepCosts};
use crate::train::TrainConfig;
use crate::{Error, Result};

/// A training scheme (how gradients are merged, compressed and communicated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
pub enum SchemeKind {
    /// Dense all-reduce per MG-WFBP group.
    Dense,
    /// TopK-SGD: one group, top-k with error feedback, all-gather.
    Topk,
    /// LAGS-SGD: layer-wise groups.
    Lags,
    /// MGS-SGD: threshold-merged groups.
    Mgs,
    /// OMGS-SGD: the planned merge.
    Omgs,
    /// TopkA (`collectives::sparse`).
    Topka,
    /// TopkDSA.
    Topkdsa,
    /// gTop-k.
    Gtopk,
    /// CLT-k.
    Cltk,
    /// SparDL (Zhao et al.).
    Spardl,
    /// SparDL with R-SAG.
    #[value(name = "spardl_rsag")]
    SpardlRsag,
    /// SparDL with B-SAG.
    #[value(name = "spardl_bsag")]
    SpardlBsag,
    /// HiTopKComm (Shi et al., MLSys 2021).
    Hitopk,
    /// ExDyna (Yoon & Oh, CCGrid 2024).
    Exdyna,
    /// MSTopK + HiTopKComm, then dense 2D torus (MLSys 2021 §5.6).
    Switch,
}

impl std::fmt::Display for SchemeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use clap::ValueEnum;
        match self.to_possible_value() {
            Some(v) => f.write_str(v.get_name()),
            None => write!(f, "{self:?}"),
        }
    }
}

impl std::str::FromStr for SchemeKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        <Self as clap::ValueEnum>::from_str(s, false)
            .map_err(|_| Error::InvalidArgument(format!("unknown scheme `{s}`")))
    }
}

impl SchemeKind {
    /// The `collectives::sparse` algorithm name, for the schemes that are one.
    pub fn collective(&self) -> Option<&'static str> {
        Some(match self {
            SchemeKind::Topka => "topka",
            SchemeKind::Topkdsa => "topkdsa",
            SchemeKind::Gtopk => "gtopk",
            SchemeKind::Cltk => "cltk",
            SchemeKind::Spardl => "spardl",
            SchemeKind::SpardlRsag => "spardl_rsag",
            SchemeKind::SpardlBsag => "spardl_bsag",
            SchemeKind::Hitopk => "hitopk",
            SchemeKind::Exdyna => "exdyna",
            _ => return None,
        })
    }

    /// The planner this scheme uses by default.
    pub fn default_planner(&self) -> Planner {
        match self {
            SchemeKind::Dense => Planner::MgWfbp,
            SchemeKind::Lags => Planner::Lags,
            SchemeKind::Mgs => Planner::Threshold(DEFAULT_THRESHOLD),
            SchemeKind::Omgs => Planner::default(),
            _ => Planner::TopK,
        }
    }
}

/// The scheme the profiling iterations run: dense, one group, so that backward is timed
/// undisturbed.
pub fn profiling_scheme() -> Box<dyn Scheme> {
    Box::new(DenseAllreduce)
}

/// True when `cfg`'s scheme changes at the start of `epoch` (the §5.6 switch).
pub fn switches_at(cfg: &TrainConfig, epoch: usize) -> bool {
    cfg.scheme == SchemeKind::Switch && epoch == cfg.switch_epochs && epoch > 0
}

fn dense_phase(cfg: &TrainConfig, epoch: usize) -> bool {
    cfg.scheme == SchemeKind::Dense
        || (cfg.scheme == SchemeKind::Switch && epoch >= cfg.switch_epochs)
}

/// Dense all-reduce with a fixed algorithm (the 2D torus of the §5.6 switch).
struct DenseAlgo(AllreduceAlgo);

impl Scheme for DenseAlgo {
    fn name(&self) -> String {
        format!("dense-{}", self.0.name())
    }
    fn group(
        &self,
        _index: usize,
        _numel: usize,
        _ranks: usize,
    ) -> Result<(Box<dyn Compress>, Box<dyn Exchange>)> {
        Ok((Box::new(Identity), Box::new(DenseExchange { algo: self.0 })))
    }
}

/// The 2D torus's ranks per node for `p` ranks: the largest divisor ≤ √p.
fn torus_rows(p: usize) -> usize {
    (1..=p)
        .filter(|d| p % d == 0 && d * d <= p)
        .max()
        .unwrap_or(1)
}

/// Compression time `a + b·n` of the top-k compressor on this machine: a two-point fit
/// (the smallest and the total layer size, best of three runs each).
fn measure_topk(sizes: &[usize], density: f64) -> Result<(f64, f64)> {
    let small = sizes.iter().copied().min().unwrap_or(1).max(1);
    let large = sizes.iter().sum::<usize>().max(small + 1);
    let time = |n: usize| -> Result<f64> {
        let mut c = TopkCompress::new(n, density);
        let grad: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1009) as f32 - 504.0).collect();
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            c.compress(grad.clone())?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let (ts, tl) = (time(small)?, time(large)?);
    let b = ((tl - ts) / (large - small) as f64).max(0.0);
    Ok(((ts - b * small as f64).max(0.0), b))
}

/// A cost model behind a box.
pub type BoxedCosts = Box<dyn StepCosts + Send + Sync>;

/// The scheme, planner and costs of `cfg` at `epoch` for `p` ranks. Costs: the emulated
/// link's own (the runtime's exchanges priced by its α, β, with top-k timed here) when a
/// topology is given; else a calibration file; else the OMGS 1 GbE preset.
pub fn for_epoch(
    cfg: &TrainConfig,
    epoch: usize,
    p: usize,
    sizes: &[usize],
    topology: Option<&Topology>,
) -> Result<(Box<dyn Scheme>, Planner, BoxedCosts)> {
    let dense = dense_phase(cfg, epoch);
    let scheme: Box<dyn Scheme> = if dense {
        if cfg.scheme == SchemeKind::Switch {
            Box::new(DenseAlgo(AllreduceAlgo::Torus2d {
                ranks_per_node: torus_rows(p),
            }))
        } else {
            Box::new(DenseAllreduce)
        }
    } else if cfg.scheme == SchemeKind::Switch {
        Box::new(CollectiveScheme {
            name: "hitopk".into(),
            density: cfg.density,
            opts: SparseOptions {
                selector: SelectorKind::MsTopK,
                ..SparseOptions::default()
            },
        })
    } else if let Some(name) = cfg.scheme.collective() {
        Box::new(CollectiveScheme {
            name: name.into(),
            density: cfg.density,
            opts: SparseOptions::default(),
        })
    } else {
        Box::new(TopkAllgather {
            density: cfg.density,
        })
    };
    let planner = if dense {
        Planner::MgWfbp
    } else {
        cfg.planner.unwrap_or_else(|| cfg.scheme.default_planner())
    };
    let costs: BoxedCosts = if let Some(topo) = topology {
        let (a, b) = if dense {
            (0.0, 0.0)
        } else {
            measure_topk(sizes, cfg.density)?
        };
        Box::new(RuntimeCosts {
            link: topo.inter,
            ranks: p,
            density: (!dense).then_some(cfg.density),
            sparsify_a: a,
            sparsify_b: b,
        })
    } else if let (Some(path), false) = (&cfg.calibration, dense) {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        let cal: cost_model::Calibration = serde_json::from_str(&text)
            .map_err(|e| Error::Json(format!("{}: {e}", path.display())))?;
        Box::new(CalibratedCosts::from_calibration(&cal, cfg.density)?)
    } else if dense {
        Box::new(DenseCosts::preset(
            p.clamp(2, 16).next_power_of_two().min(16),
        )?)
    } else {
        Box::new(OmgsCosts::preset(
            p.clamp(2, 16).next_power_of_two().min(16),
        )?)
    };
    Ok((scheme, planner, costs))
}

/// A density that selects nothing from a group is an error for the `collectives::sparse`
/// algorithms (the top-k all-gather schemes select at least one entry per group).
pub fn check_density(
    cfg: &TrainConfig,
    epoch: usize,
    plan: &MergePlan,
    sizes: &[usize],
) -> Result<()> {
    if dense_phase(cfg, epoch)
        || !(cfg.scheme.collective().is_some() || cfg.scheme == SchemeKind::Switch)
    {
        return Ok(());
    }
    let p = cfg.ranks.max(1) as f64;
    for g in 0..plan.num_groups() {
        let n: usize = plan.range(g).map(|l| sizes[l]).sum();
        // The partitioned algorithms select k/P per rank: require one entry per rank.
        if cfg.density * n as f64 / p < 1.0 {
            return Err(Error::InvalidArgument(format!(
                "density {} selects nothing from group {g} of {n} elements on {} ranks",
                cfg.density, cfg.ranks
            )));
        }
    }
    Ok(())
}
