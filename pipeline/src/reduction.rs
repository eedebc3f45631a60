//! The training schemes, typed for the command line, and the one place that turns a
//! scheme into the runtime's pieces: the reduction [`Scheme`], the merge planner and the
//! costs the planner and the timeline use.
//!
//! - `dense`: all-reduce per MG-WFBP group, the algorithm chosen by size per group (ring
//!   on an emulated link, which the runtime's costs price).
//! - `topk`, `lags`, `mgs`, `omgs`: top-k with error feedback and a sparse all-gather,
//!   merged into one group, layer-wise, by threshold, or by the planner (OMGS-SGD (Shi et
//!   al., INFOCOM 2020)).
//! - every sparse all-reduce of `collectives::sparse` (SparDL (Zhao et al.), ExDyna (Yoon
//!   & Oh, CCGrid 2024), HiTopKComm, gTop-k, ...), one group each.
//! - `bsp1`, `bsp2`, `bsp3`: BSP-SGD of Linear Pipelining (Wang et al.), Algorithms 1-3:
//!   LP reduce of the gradients to the root (per layer, overlapping backward; or after
//!   backward), the root's update and an LP broadcast of the weights (per stage,
//!   overlapping the next forward; or before it) ([`crate::bsp`]); or LP all-reduce.
//! - `switch`: MSTopK with HiTopKComm for the first epochs, then the dense 2D torus
//!   all-reduce (MSTopK/HiTopKComm (Shi et al., MLSys 2021), §5.6).

use collectives::dense::AllreduceAlgo;
use collectives::sparse::{Sag, SelectorKind, SparseAlgo};
use cost_model::{Link, Topology};
use serde::{Deserialize, Serialize};

use crate::check::RuntimeCosts;
use crate::plan::{MergePlan, Planner, DEFAULT_THRESHOLD};
use crate::schemes::{
    CollectiveScheme, Compress, DenseAllreduce, DenseExchange, Exchange, GroupPair, Identity,
    OnlineDenseExchange, Scheme, TopkAllgather, TopkCompress,
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
    /// Ok-Topk (Li & Hoefler, PPoPP 2022).
    Oktopk,
    /// MSTopK + HiTopKComm, then dense 2D torus (MLSys 2021 §5.6).
    Switch,
    /// BSP-SGD of Linear Pipelining (Wang et al.), Algorithm 1: per layer, an LP reduce to
    /// the root overlapping backward; the root updates; the weights' LP broadcast, stage by
    /// stage, overlaps the next forward.
    Bsp1,
    /// BSP-SGD Algorithm 2: after backward, one LP reduce; the root updates; one LP
    /// broadcast of the weights before the next forward.
    Bsp2,
    /// BSP-SGD Algorithm 3: after backward, one LP all-reduce; every rank updates; the
    /// root's weights broadcast every 5 iterations.
    Bsp3,
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
    /// The `collectives::sparse` algorithm (default options), for the schemes that are one.
    pub fn collective(&self) -> Option<SparseAlgo> {
        let spardl = |sag| SparseAlgo::SparDl {
            sag,
            teams: None,
            selector: None,
        };
        Some(match self {
            SchemeKind::Topka => SparseAlgo::TopkA { selector: None },
            SchemeKind::Topkdsa => SparseAlgo::TopkDsa { selector: None },
            SchemeKind::Gtopk => SparseAlgo::GTopk { selector: None },
            SchemeKind::Cltk => SparseAlgo::CltK { selector: None },
            SchemeKind::Spardl => spardl(Sag::None),
            SchemeKind::SpardlRsag => spardl(Sag::Recursive),
            SchemeKind::SpardlBsag => spardl(Sag::Bruck),
            SchemeKind::Hitopk => SparseAlgo::HiTopK {
                ranks_per_node: None,
                f16_wire: true,
                selector: None,
            },
            SchemeKind::Exdyna => SparseAlgo::ExDyna { warm_start: false },
            SchemeKind::Oktopk => SparseAlgo::OkTopk {
                tau: cost_model::plan::sparse::OKTOPK_TAU,
                rebalance: cost_model::plan::sparse::OKTOPK_REBALANCE,
            },
            _ => return None,
        })
    }

    /// How BSP-SGD updates the weights (`None` for the other schemes: every rank applies
    /// the averaged gradients).
    pub fn bsp_update(&self) -> Option<BspUpdate> {
        match self {
            SchemeKind::Bsp1 => Some(BspUpdate::RootOverlapped),
            SchemeKind::Bsp2 => Some(BspUpdate::RootBlocking),
            SchemeKind::Bsp3 => Some(BspUpdate::ReplicatedSync),
            _ => None,
        }
    }

    /// The planner this scheme uses by default.
    pub fn default_planner(&self) -> Planner {
        match self {
            SchemeKind::Dense => Planner::MgWfbp,
            SchemeKind::Lags => Planner::Lags,
            SchemeKind::Mgs => Planner::Threshold(DEFAULT_THRESHOLD),
            SchemeKind::Omgs => Planner::default(),
            SchemeKind::Bsp1 => Planner::Lags,
            _ => Planner::TopK,
        }
    }
}

/// The weight update of BSP-SGD (Linear Pipelining (Wang et al.), §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BspUpdate {
    /// Algorithm 1: the root updates; the broadcast overlaps the next forward per stage.
    RootOverlapped,
    /// Algorithm 2: the root updates; the whole broadcast ends before the next forward.
    RootBlocking,
    /// Algorithm 3: every rank updates; the root's weights are broadcast every
    /// [`crate::bsp::BSP3_SYNC_EVERY`] iterations.
    ReplicatedSync,
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
    matches!(
        cfg.scheme,
        SchemeKind::Dense | SchemeKind::Bsp1 | SchemeKind::Bsp2 | SchemeKind::Bsp3
    ) || (cfg.scheme == SchemeKind::Switch && epoch >= cfg.switch_epochs)
}

/// Pipeline block of the LP collectives when the link is unknown: 64 KiB, the paper's
/// setting.
const LP_BLOCK: usize = 64 << 10;

/// The LP block for `op` on a group of `numel` `f32` over `ranks`: Linear Pipelining
/// (Wang et al.)'s optimal `b` for the emulated link when there is one
/// ([`cost_model::dense::lp_optimal_block_bytes`]), else [`LP_BLOCK`].
pub(crate) fn lp_block(
    op: cost_model::Collective,
    numel: usize,
    ranks: usize,
    link: Option<Link>,
) -> usize {
    link.and_then(|l| {
        cost_model::dense::lp_optimal_block_bytes(op, 4 * numel, 4, ranks, l, 0.0).ok()
    })
    .unwrap_or(LP_BLOCK)
}

/// BSP-SGD's gradient reduce (Linear Pipelining (Wang et al.), Algorithm 1 line 9 per
/// layer, Algorithm 2 line 2 for the whole model): an LP reduce to rank 0, which returns
/// the average. Other ranks return their own gradient unchanged: they apply no update,
/// the root's weights reach them by broadcast ([`crate::bsp`]).
struct LpReduce {
    /// Block of the reduce, bytes.
    block_bytes: usize,
}

impl Exchange for LpReduce {
    fn exchange(
        &mut self,
        comm: &dyn collectives::Communicator,
        ctx: crate::schemes::ExchangeCtx,
        payload: crate::schemes::Payload,
    ) -> Result<Vec<f32>> {
        use collectives::dense::{reduce, DenseOptions, ReduceAlgo};
        let mut data = match payload {
            crate::schemes::Payload::Dense(d) => d,
            crate::schemes::Payload::Sparse(s) => s.to_dense(),
        };
        crate::schemes::agree(comm, ctx)?;
        let block_bytes = self.block_bytes;
        reduce(
            comm,
            &mut data,
            0,
            ReduceAlgo::LinearPipeline { block_bytes },
            &DenseOptions::default().unchecked(),
        )?;
        if comm.rank() == 0 {
            let inv = 1.0 / comm.size() as f32;
            data.iter_mut().for_each(|v| *v *= inv);
        }
        Ok(data)
    }
}

/// A scheme that sends every group uncompressed through the exchange `make(numel, ranks)`
/// builds: the dense phases' schemes.
struct Uncompressed<F> {
    name: String,
    make: F,
}

impl<F: Fn(usize, usize) -> Box<dyn Exchange> + Send + Sync> Scheme for Uncompressed<F> {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn group(&self, _index: usize, numel: usize, ranks: usize) -> Result<GroupPair> {
        Ok((Box::new(Identity), (self.make)(numel, ranks)))
    }
}

/// [`Uncompressed`] boxed as a scheme.
fn uncompressed(
    name: impl Into<String>,
    make: impl Fn(usize, usize) -> Box<dyn Exchange> + Send + Sync + 'static,
) -> Box<dyn Scheme> {
    Box::new(Uncompressed {
        name: name.into(),
        make,
    })
}

/// How the dense scheme picks its all-reduce algorithm per group (the automatic choice;
/// `cargo xtask train --dense-choice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
pub enum DenseChoice {
    /// Once, on the group's first exchange, from the calibration's fits (or the built-in
    /// rule without one), kept for the run.
    #[default]
    Calibrated,
    /// `collectives::dense::OnlineChoice`: starts from the same pick and re-ranks it
    /// against the library's, the shared-memory and our best algorithm from the timings of
    /// the run's own exchanges, agreed across ranks. Its timings include the backward pass
    /// the exchanges overlap.
    Online,
}

/// How a [`ResolvedExchange`] picks its all-reduce from the group's communicator.
type Resolve = Box<dyn FnMut(&dyn collectives::Communicator) -> Result<AllreduceAlgo> + Send>;

/// A dense all-reduce whose algorithm depends on the group's communicator, resolved on
/// the group's first exchange (every rank resolves alike: the same transport, size and
/// inputs) and kept for the next ones.
struct ResolvedExchange {
    resolve: Resolve,
    resolved: Option<DenseExchange>,
}

impl ResolvedExchange {
    fn boxed(resolve: Resolve) -> Box<dyn Exchange> {
        Box::new(ResolvedExchange {
            resolve,
            resolved: None,
        })
    }
}

impl Exchange for ResolvedExchange {
    fn exchange(
        &mut self,
        comm: &dyn collectives::Communicator,
        ctx: crate::schemes::ExchangeCtx,
        payload: crate::schemes::Payload,
    ) -> Result<Vec<f32>> {
        let inner = match &mut self.resolved {
            Some(x) => x,
            None => self.resolved.insert(DenseExchange {
                algo: (self.resolve)(comm)?,
            }),
        };
        inner.exchange(comm, ctx, payload)
    }
}

/// The dense all-reduce of a group by the automatic choice: with a calibration taken on
/// this transport at this P, `collectives::dense::choose_allreduce_for` ranks every
/// algorithm by its fits (MPI's own call and, on one node, the shared-memory algorithm
/// included); without one, the built-in rule (`choose_allreduce`), which leaves the
/// shared-memory algorithm out. The exchange overlaps the backward pass, and the
/// shared-memory waits poll: on 2 cores, 2 ranks, ResNet-20, they took the backward pass's
/// cores (non-overlapped communication 7–25 ms per iteration against 4–7 ms), so only a
/// calibration that measured it ahead brings it in.
fn chosen_allreduce(
    comm: &dyn collectives::Communicator,
    bytes: usize,
    calibration: Option<&cost_model::Calibration>,
) -> AllreduceAlgo {
    let algo = match calibration.filter(|c| c.backend == comm.backend() && c.ranks == comm.size()) {
        Some(c) => collectives::dense::choose_allreduce_for(comm, bytes, Some(c)),
        None => collectives::dense::choose_allreduce(comm.size(), bytes, None),
    };
    tracing::debug!(bytes, algo = algo.name(), "dense all-reduce chosen");
    algo
}

/// The calibration at `path`.
fn load_calibration(path: &std::path::Path) -> Result<cost_model::Calibration> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| Error::Json(format!("{}: {e}", path.display())))
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

/// The cost model's name of the `collectives::sparse` algorithm that `cfg`'s sparse phase
/// runs (`None` for the top-k all-gather schemes).
fn sparse_algorithm(cfg: &TrainConfig) -> Option<cost_model::Algorithm> {
    match cfg.scheme {
        SchemeKind::Switch => Some(cost_model::Algorithm::Hitopk),
        s => s.collective().map(|a| a.cost_algorithm()),
    }
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
    let link = topology.map(|t| t.inter);
    let scheme: Box<dyn Scheme> = if dense {
        if matches!(cfg.scheme, SchemeKind::Bsp1 | SchemeKind::Bsp2) {
            // BSP-SGD Algorithms 1 and 2's exchange.
            uncompressed("bsp-lp-reduce", move |numel, ranks| {
                Box::new(LpReduce {
                    block_bytes: lp_block(cost_model::Collective::Reduce, numel, ranks, link),
                })
            })
        } else if cfg.scheme == SchemeKind::Bsp3 {
            uncompressed("bsp-lp-allreduce", move |numel, ranks| {
                let block_bytes = lp_block(cost_model::Collective::Allreduce, numel, ranks, link);
                Box::new(DenseExchange {
                    algo: AllreduceAlgo::LinearPipeline { block_bytes },
                })
            })
        } else if cfg.scheme == SchemeKind::Dense && topology.is_none() {
            // The automatic choice per group size (`collectives::dense::choose_allreduce_for`
            // on the group's communicator, ranked by the calibration when one is given). On
            // an emulated link the ring is what the runtime costs price.
            let calibration = match &cfg.calibration {
                Some(path) => Some(std::sync::Arc::new(load_calibration(path)?)),
                None => None,
            };
            match cfg.dense_choice {
                DenseChoice::Calibrated => uncompressed("dense-chosen", move |numel, _| {
                    let calibration = calibration.clone();
                    ResolvedExchange::boxed(Box::new(move |comm| {
                        Ok(chosen_allreduce(comm, 4 * numel, calibration.as_deref()))
                    }))
                }),
                DenseChoice::Online => uncompressed("dense-online", move |_, _| {
                    Box::new(OnlineDenseExchange {
                        online: Default::default(),
                        calibration: calibration.clone(),
                    })
                }),
            }
        } else if cfg.scheme == SchemeKind::Switch {
            uncompressed("dense-torus2d", |_, _| {
                // The 2D torus on the transport's nodes (a collective call).
                ResolvedExchange::boxed(Box::new(|comm| {
                    Ok(collectives::comm::nodes::torus2d(comm)?)
                }))
            })
        } else {
            Box::new(DenseAllreduce)
        }
    } else if cfg.scheme == SchemeKind::Switch {
        Box::new(CollectiveScheme {
            algo: SparseAlgo::HiTopK {
                ranks_per_node: None,
                f16_wire: true,
                selector: Some(SelectorKind::MsTopK),
            },
            density: cfg.density,
        })
    } else if let Some(algo) = cfg.scheme.collective() {
        Box::new(CollectiveScheme {
            algo,
            density: cfg.density,
        })
    } else {
        Box::new(TopkAllgather {
            density: cfg.density,
        })
    };
    let planner = if matches!(
        cfg.scheme,
        SchemeKind::Bsp1 | SchemeKind::Bsp2 | SchemeKind::Bsp3
    ) {
        cfg.scheme.default_planner()
    } else if dense {
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
        let runtime = RuntimeCosts {
            link: topo.inter,
            ranks: p,
            density: (!dense).then_some(cfg.density),
            algorithm: if dense { None } else { sparse_algorithm(cfg) },
            sparsify_a: a,
            sparsify_b: b,
            host_a: 0.0,
            host_b: 0.0,
        };
        if matches!(cfg.scheme, SchemeKind::Bsp1 | SchemeKind::Bsp2) {
            // The gradients' LP reduce to the root (the weights' broadcast is not in it).
            Box::new(crate::check::LpReduceCosts { base: runtime })
        } else {
            Box::new(runtime)
        }
    } else if let (Some(path), false) = (&cfg.calibration, dense) {
        Box::new(CalibratedCosts::from_calibration(
            &load_calibration(path)?,
            cfg.density,
        )?)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schemes::ExchangeCtx;
    use collectives::{Communicator, ThreadComm};

    #[test]
    fn dense_and_bsp_exchanges_all_average() {
        for kind in [
            SchemeKind::Dense,
            SchemeKind::Bsp1,
            SchemeKind::Bsp2,
            SchemeKind::Bsp3,
        ] {
            let cfg = TrainConfig {
                scheme: kind,
                ranks: 3,
                ..TrainConfig::default()
            };
            let n = 40_000; // more than one 64 KiB pipeline block
            let out = ThreadComm::run(3, |comm| -> Result<Vec<f32>> {
                let (scheme, _, _) = for_epoch(&cfg, 0, 3, &[n], None)?;
                let (mut c, mut e) = scheme.group(0, n, 3)?;
                let r = comm.rank() as f32;
                let grad: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + r).collect();
                let ctx = ExchangeCtx {
                    iteration: 0,
                    group: 0,
                    numel: n,
                };
                let p = c.compress(grad)?;
                e.exchange(&comm, ctx, p)
            })
            .unwrap();
            // BSP-SGD Algorithms 1 and 2 average on the root only.
            let averaged = if kind
                .bsp_update()
                .is_some_and(|u| u != BspUpdate::ReplicatedSync)
            {
                &out[..1]
            } else {
                &out[..]
            };
            for o in averaged {
                assert_eq!(o, &out[0], "{kind}: ranks differ");
                for (i, v) in o.iter().enumerate() {
                    assert!((v - ((i % 7) as f32 + 1.0)).abs() < 1e-4, "{kind}: {i} {v}");
                }
            }
        }
    }

    #[test]
    fn schemes_parse_by_their_command_line_names() {
        for s in ["dense", "omgs", "spardl_rsag", "exdyna", "switch", "bsp1"] {
            assert_eq!(s.parse::<SchemeKind>().unwrap().to_string(), s);
        }
        assert!("sgd".parse::<SchemeKind>().is_err());
        assert_eq!(
            SchemeKind::SpardlBsag.collective().map(|a| a.name()),
            Some("spardl_bsag")
        );
    }
}
