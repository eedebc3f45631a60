//! Checks the runtime against the timeline: runs the built-in model data-parallel over
//! `SimComm` in real-time mode (every message takes its modelled α + β·n of the paper's
//! 1 GbE cluster), with backward times emulated per layer, and compares each scheme's
//! measured iteration time with the prediction of [`crate::predict`] for the same plan.
//!
//! The prediction's inputs are measured the way OMGS-SGD (Shi et al., INFOCOM 2020) does it:
//! per-layer backward and forward times by the per-hook timestamp method in a profiling run, the
//! top-k time as a linear fit of the measured compression spans, and the communication from the
//! link's α and β and the exchanges' message pattern (ring all-gather: `P − 1` rounds; a Bruck
//! all-gather of the agreement headers, `⌈log2 P⌉` rounds, then ring all-reduce: `2(P − 1)`
//! rounds).
//!
//! BSP-SGD Algorithm 1 of Linear Pipelining (Wang et al.) is checked too: per-layer LP
//! reduces to the root during backward, and the weights' per-stage LP broadcast during the
//! next forward, each stage's forward waiting for its own parameters ([`crate::bsp`]). Its
//! prediction replays that pipeline: stage `s`'s weights are everywhere at
//! `ready(s) = Σ_{j ≤ s} T_bcast(j)` (the LP broadcast schedule of
//! `cost_model::predict_dense`, stages one after another on the broadcast thread), its
//! forward ends at `f(s) = max(f(s − 1), ready(s)) + fwd(s)`, and the timeline of the
//! backward and the reduces starts from `f(S − 1)`.

use collectives::{ClockMode, Communicator, SimComm, ThreadComm, ThreadConfig};
use cost_model::plan::ceil_log2;
use cost_model::{Link, Topology};
use serde::{Deserialize, Serialize};

use crate::plan::{MergePlan, Planner};
use crate::profile::{average_backward, LayerProfile};
use crate::runtime::Reducer;
use crate::schemes::{
    selected_count, CollectiveScheme, DenseAllreduce, Scheme, TopkAllgather, HEADER_BYTES,
};
use crate::staged::{self, Stages};
use crate::timeline::{predict, StepCosts, Timeline};
use crate::{Error, Result};
use collectives::sparse::SparseAlgo;

/// Costs of the runtime's own exchanges over a link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RuntimeCosts {
    /// Link α and β.
    pub link: Link,
    /// Ranks P.
    pub ranks: usize,
    /// Density (sparse), or `None` for the dense ring all-reduce.
    pub density: Option<f64>,
    /// The `collectives::sparse` algorithm that exchanges each group, selecting inside the
    /// exchange on the communication thread; `None`: the runtime's top-k all-gather
    /// (selection on the compute thread).
    pub algorithm: Option<cost_model::Algorithm>,
    /// Compression time `a + b·numel` (fitted), seconds.
    pub sparsify_a: f64,
    /// Compression time per element.
    pub sparsify_b: f64,
}

impl StepCosts for RuntimeCosts {
    fn sparsify_s(&self, numel: usize) -> f64 {
        if self.algorithm.is_some() {
            return 0.0;
        }
        self.select_s(numel)
    }
    fn comm_s(&self, numel: usize) -> f64 {
        let p = self.ranks;
        if p <= 1 {
            return 0.0;
        }
        if let (Some(rho), Some(algo)) = (self.density, self.algorithm) {
            return self.agree_s() + self.select_s(numel) + self.collective_s(algo, numel, rho);
        }
        let rounds = (p - 1) as f64;
        match self.density {
            // Ring all-gather of the exchange header + the SparseGrad encoding (16-byte
            // header, index and value per selected entry); exact top-k sends the same
            // count everywhere, so no count exchange.
            Some(rho) => {
                let bytes = HEADER_BYTES + sparsify::sparse::HEADER_BYTES;
                rounds * self.link.time(bytes + 8 * selected_count(numel, rho))
            }
            // The agreement round, then a ring all-reduce: 2(P − 1) steps of one f32 block
            // of about n/P.
            None => self.agree_s() + 2.0 * rounds * self.link.time(4 * numel.div_ceil(p)),
        }
    }
    fn comm_alpha_s(&self) -> f64 {
        if let (Some(rho), Some(algo)) = (self.density, self.algorithm) {
            return self.agree_s() + self.collective_s(algo, 1, rho);
        }
        let p = self.ranks;
        let rounds = match self.density {
            Some(_) => p.saturating_sub(1),
            None => 2 * p.saturating_sub(1) + ceil_log2(p) as usize,
        };
        self.link.alpha_s * rounds as f64
    }
}

impl RuntimeCosts {
    /// The fitted top-k time of `numel` elements.
    fn select_s(&self, numel: usize) -> f64 {
        (self.sparsify_a + self.sparsify_b * numel as f64).max(0.0)
    }

    /// One step of `algo` on a flat topology of this link, by replaying its message
    /// schedule (`cost_model::sparse_replay`, exact for `SimComm`). The data-dependent
    /// counts take their worst case, except ExDyna's: its threshold aims at `k` entries
    /// in all, so each rank is expected to select `⌈k/P⌉`. Infinite where the replay
    /// rejects the case (the density check refuses such plans first).
    fn collective_s(&self, algo: cost_model::Algorithm, numel: usize, rho: f64) -> f64 {
        use cost_model::sparse_replay::{replay_sparse, Observed, SparseStep};
        let p = self.ranks;
        let mut step = SparseStep::new(algo, numel, rho);
        if algo == cost_model::Algorithm::Exdyna {
            let each = step.k().div_ceil(p).max(1);
            step = step.with_observed(Observed::ExDyna {
                selected: vec![each; p],
            });
        }
        Topology::flat(p, self.link)
            .and_then(|t| replay_sparse(&step, &t))
            .map(|pr| pr.time_s)
            .unwrap_or(f64::INFINITY)
    }

    /// The agreement round before a dense exchange ([`crate::schemes::agree`]): a Bruck
    /// all-gather of one header per rank, round `s` moving `min(2^s, P − 2^s)` headers.
    pub(crate) fn agree_s(&self) -> f64 {
        let p = self.ranks;
        (0..ceil_log2(p) as usize)
            .map(|s| {
                self.link
                    .time(HEADER_BYTES * (1usize << s).min(p - (1 << s)))
            })
            .sum()
    }
}

/// Settings of the check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckConfig {
    /// Ranks P (the preset exists for 2, 4, 8, 16).
    pub ranks: usize,
    /// Density of the sparse schemes.
    pub density: f64,
    /// Samples per rank per iteration.
    pub batch: usize,
    /// Total emulated backward time of the model, seconds.
    pub backward_s: f64,
    /// Iterations measured per scheme (after 2 warm-up iterations).
    pub iterations: usize,
    /// Width of the checked MLP's hidden layers.
    pub hidden: usize,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            ranks: 4,
            density: 0.01,
            batch: 16,
            backward_s: 0.03,
            iterations: 8,
            hidden: 1024,
        }
    }
}

/// Costs of BSP-SGD's gradient exchange on a flat topology: the agreement round, then an
/// LP reduce to the root in the block the scheme picks for the link
/// (`cost_model::predict_dense`'s schedule, exact under the `SimComm` clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LpReduceCosts {
    /// The agreement round's costs (its link and ranks).
    pub base: RuntimeCosts,
}

impl LpReduceCosts {
    /// An LP `op` of `numel` `f32` from root 0, with the scheme's block.
    pub fn lp_s(&self, op: cost_model::Collective, numel: usize) -> f64 {
        let p = self.base.ranks;
        if p <= 1 || numel == 0 {
            return 0.0;
        }
        let block = crate::reduction::lp_block(op, numel, p, Some(self.base.link));
        let case = cost_model::DenseCase::new(op, cost_model::Algorithm::Lp, numel)
            .with_block_bytes(block);
        Topology::flat(p, self.base.link)
            .and_then(|t| cost_model::predict_dense(&case, &t))
            .map(|pr| pr.time_s)
            .unwrap_or(f64::INFINITY)
    }

    /// The end of a forward whose stage `s` (forward time `fwd[s]`, `sizes[s]` weights)
    /// waits for its weights' LP broadcast, stages broadcast one after another from the
    /// forward's start.
    pub fn overlapped_forward_s(&self, fwd: &[f64], sizes: &[usize]) -> f64 {
        let (mut ready, mut end) = (0.0, 0.0f64);
        for (f, &n) in fwd.iter().zip(sizes) {
            ready += self.lp_s(cost_model::Collective::Broadcast, n);
            end = end.max(ready) + f;
        }
        end
    }
}

impl StepCosts for LpReduceCosts {
    fn sparsify_s(&self, _numel: usize) -> f64 {
        0.0
    }
    fn comm_s(&self, numel: usize) -> f64 {
        self.base.agree_s() + self.lp_s(cost_model::Collective::Reduce, numel)
    }
    fn comm_alpha_s(&self) -> f64 {
        self.base.agree_s() + self.base.link.alpha_s * self.base.ranks.saturating_sub(1) as f64
    }
}

/// One scheme's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckRow {
    /// Scheme (planner) name.
    pub scheme: String,
    /// Groups in its plan.
    pub groups: usize,
    /// Predicted iteration time, seconds.
    pub predicted_s: f64,
    /// Measured mean iteration time, seconds.
    pub measured_s: f64,
    /// `measured / predicted − 1`.
    pub rel_error: f64,
    /// Predicted communication left after backward ends, seconds.
    pub predicted_non_overlapped_s: f64,
    /// Measured mean communication left after backward ends, seconds.
    pub measured_non_overlapped_s: f64,
    /// BSP-SGD Algorithm 1: measured mean forward time spent waiting for the weights'
    /// broadcast, seconds (0 for the other schemes).
    #[serde(default)]
    pub param_wait_s: f64,
    /// BSP-SGD Algorithm 1: measured mean broadcast time of the weights (stages summed),
    /// seconds; `param_bcast_s − param_wait_s` of it overlapped forward.
    #[serde(default)]
    pub param_bcast_s: f64,
}

/// The row of BSP-SGD Algorithm 1.
pub const BSP1: &str = "bsp1 (lp, lags)";

/// The rows' labels for the plan comparison: the default planner's merge, one group, and
/// one group per layer, all under the same top-k all-gather.
pub const PLANNED: &str = "omgs (exact)";
/// One merged group (TopK-SGD's plan).
pub const ONE_GROUP: &str = "one group (topk)";
/// One group per layer (LAGS-SGD's plan).
pub const LAYER_WISE: &str = "layer-wise (lags)";

/// The checked model: a candle MLP 64 → h → h → h → 10, one stage per linear layer. Two
/// large layers in the middle give the merge something to decide: merged into one group
/// their communication cannot overlap anything, layer by layer it pays α per tensor.
fn mlp(hidden: usize) -> Result<Stages> {
    let dims = [
        (64, hidden),
        (hidden, hidden),
        (hidden, hidden),
        (hidden, 10),
    ];
    let mut m = Stages::new("mlp", 3);
    for (i, (a, b)) in dims.into_iter().enumerate() {
        m.push(&format!("fc{i}"), move |vb| {
            let l = candle_nn::linear(a, b, vb)?;
            Ok(candle_nn::func_t(move |x, _| {
                let y = candle_core::Module::forward(&l, x)?;
                if i + 1 < dims.len() {
                    y.relu()
                } else {
                    Ok(y)
                }
            }))
        })?;
    }
    Ok(m)
}

/// Weights per stage of the MLP.
fn stage_sizes(model: &Stages) -> Vec<usize> {
    use crate::staged::Staged;
    (0..model.num_stages())
        .map(|s| {
            model
                .stage_params(s)
                .iter()
                .map(|(_, v)| v.as_tensor().elem_count())
                .sum()
        })
        .collect()
}

/// The forward time `total` split over stages in proportion to their weights (the MLP's
/// FLOPs).
fn stage_forward_s(total: f64, sizes: &[usize]) -> Vec<f64> {
    let all = sizes.iter().sum::<usize>().max(1) as f64;
    sizes.iter().map(|&n| total * n as f64 / all).collect()
}

/// Its profile with FLOP-proportional backward times (`4·batch` FLOPs per weight).
fn mlp_profile(batch: usize, hidden: usize) -> Result<LayerProfile> {
    let sizes = staged::layer_sizes(&mlp(hidden)?);
    let bw: Vec<f64> = sizes.iter().map(|&n| 4.0 * (batch * n) as f64).collect();
    LayerProfile::from_sizes("mlp", &sizes)?.with_backward_times(bw.iter().sum::<f64>() / 2.0, &bw)
}

fn sleep_s(t: f64) {
    if t > 0.0 && t.is_finite() {
        std::thread::sleep(std::time::Duration::from_secs_f64(t));
    }
}

/// Runs `iterations` (+2 warm-up) iterations with `scheme` and `plan` and returns rank 0's
/// measured timelines (warm-up excluded).
fn run(
    cfg: &CheckConfig,
    topo: Topology,
    emu: &LayerProfile,
    plan: &MergePlan,
    scheme: &dyn Scheme,
    bsp1: bool,
) -> Result<Vec<(Timeline, f64, f64)>> {
    let outs = ThreadComm::run_with(
        cfg.ranks,
        ThreadConfig::default(),
        |comm| -> Result<Vec<(Timeline, f64, f64)>> {
            let sim = SimComm::new(comm, topo, ClockMode::RealTime)?;
            let rank = sim.rank();
            // Emulated device: the real candle gradients, plus the profile's forward and
            // per-layer backward times as sleeps before each hook fires.
            let model = mlp(cfg.hidden)?;
            let stage_sizes = stage_sizes(&model);
            let stage_fwd = stage_forward_s(emu.forward_s(), &stage_sizes);
            // BSP-SGD Algorithm 1's weight broadcast (the values do not matter here).
            let mut bcast = if bsp1 {
                let blocks = stage_sizes
                    .iter()
                    .map(|&n| {
                        crate::reduction::lp_block(
                            cost_model::Collective::Broadcast,
                            n.max(1),
                            cfg.ranks,
                            Some(topo.inter),
                        )
                    })
                    .collect();
                Some(crate::bsp::ParamBroadcast::new(
                    sim.split(1, rank as u32)?,
                    stage_sizes.clone(),
                    blocks,
                    std::time::Instant::now(),
                )?)
            } else {
                None
            };
            let mut reducer =
                Reducer::new(sim, &staged::layer_sizes(&model), plan.clone(), scheme)?;
            let bw: Vec<f64> = emu.layers().iter().map(|l| l.backward_s).collect();
            let x: Vec<f32> = (0..cfg.batch * 64)
                .map(|i| ((i * 7 + rank * 13) % 17) as f32 / 17.0 - 0.5)
                .collect();
            let x = candle_core::Tensor::from_vec(x, (cfg.batch, 64), &candle_core::Device::Cpu)?;
            let y: Vec<u32> = (0..cfg.batch).map(|i| ((i + rank) % 10) as u32).collect();
            let y = candle_core::Tensor::from_vec(y, cfg.batch, &candle_core::Device::Cpu)?;
            let mut out = Vec::new();
            for it in 0..cfg.iterations + 2 {
                reducer.begin()?;
                let (mut wait_s, mut bcast_s) = (0.0, 0.0);
                let fwd = match bcast.as_mut() {
                    Some(b) => staged::forward_train_with(&model, &x, &mut |s| {
                        if b.in_flight() {
                            let (_, span, waited) = b.wait(s)?;
                            wait_s += waited;
                            bcast_s += span.len();
                        }
                        sleep_s(stage_fwd[s]);
                        Ok(())
                    })?,
                    None => {
                        let f = staged::forward_train(&model, &x)?;
                        sleep_s(emu.forward_s());
                        f
                    }
                };
                let loss = staged::Staged::loss(&model, fwd.logits(), &y)?;
                reducer.forward_done()?;
                staged::backward_staged(&model, &fwd, &loss, &mut |l, g| {
                    sleep_s(bw.get(l).copied().unwrap_or(0.0));
                    reducer.ready(l, g)
                })?;
                reducer.finish()?;
                if let Some(b) = bcast.as_mut() {
                    // The root's update is not emulated; its weights go out as they are.
                    let stages = (0..stage_sizes.len())
                        .map(|s| staged::get_stage_params(&model, s))
                        .collect::<Result<Vec<_>>>()?;
                    b.launch(stages)?;
                }
                if it >= 2 {
                    if let Some(t) = reducer.last_timeline() {
                        out.push((t.clone(), wait_s, bcast_s));
                    }
                }
            }
            drop(reducer.shutdown()?);
            if let Some(mut b) = bcast {
                while let Some(s) = b.next_stage() {
                    b.wait(s)?;
                }
                b.shutdown()?;
            }
            Ok(out)
        },
    );
    crate::error::rank0(outs)
}

fn fit_line(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.len() < 2 {
        return (points.first().map(|p| p.1).unwrap_or(0.0), 0.0);
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
    ((my - b * mx).max(0.0), b)
}

/// Runs the check: profiles the model (layer-wise plan), then for dense (MG-WFBP plan),
/// TopK-SGD (one group), LAGS-SGD (layer-wise), MGS-SGD and OMGS-SGD (the default planner)
/// under the top-k all-gather, and SparDL and ExDyna under the default planner, predicts and
/// measures the iteration time and the communication left after backward.
pub fn runtime_vs_timeline(cfg: &CheckConfig) -> Result<Vec<CheckRow>> {
    if cfg.hidden == 0 || cfg.batch == 0 || cfg.iterations == 0 {
        return Err(Error::InvalidArgument(format!(
            "the timeline check needs hidden, batch and iterations ≥ 1 (got {}, {}, {})",
            cfg.hidden, cfg.batch, cfg.iterations
        )));
    }
    let preset = cost_model::presets::omgs_1gbe(cfg.ranks)?;
    let topo = preset.topology()?;
    let link = topo.inter;
    // Emulated device: the MLP's FLOP profile scaled to `backward_s` in total.
    let flop_profile = mlp_profile(cfg.batch, cfg.hidden)?;
    let emu = flop_profile.scaled(cfg.backward_s / flop_profile.total_backward_s())?;
    let l_count = emu.len();
    let sparse = TopkAllgather {
        density: cfg.density,
    };
    // Profiling run (OMGS-SGD's per-hook method).
    let prof: Vec<Timeline> = run(
        cfg,
        topo,
        &emu,
        &MergePlan::layerwise(l_count),
        &sparse,
        false,
    )?
    .into_iter()
    .map(|r| r.0)
    .collect();
    let samples: Vec<Vec<f64>> = prof
        .iter()
        .map(|t| t.backward.iter().map(|s| s.len()).collect())
        .collect();
    let bw = average_backward(&samples, 0)?;
    let fwd = prof.iter().map(|t| t.forward.len()).sum::<f64>() / prof.len().max(1) as f64;
    let measured = emu.with_backward_times(fwd, &bw)?;
    let points: Vec<(f64, f64)> = prof
        .iter()
        .flat_map(|t| t.groups.iter().map(|g| (g.numel as f64, g.sparsify.len())))
        .collect();
    let (sa, sb) = fit_line(&points);
    let sparse_costs = RuntimeCosts {
        link,
        ranks: cfg.ranks,
        density: Some(cfg.density),
        algorithm: None,
        sparsify_a: sa,
        sparsify_b: sb,
    };
    let dense_costs = RuntimeCosts {
        density: None,
        algorithm: None,
        sparsify_a: 0.0,
        sparsify_b: 0.0,
        ..sparse_costs
    };
    let collective = |algo: SparseAlgo, costs_algo| {
        (
            CollectiveScheme {
                algo,
                density: cfg.density,
            },
            RuntimeCosts {
                algorithm: Some(costs_algo),
                ..sparse_costs
            },
        )
    };
    let spardl = collective(
        SparseAlgo::SparDl {
            sag: collectives::sparse::Sag::None,
            teams: None,
            selector: None,
        },
        cost_model::Algorithm::Spardl,
    );
    let exdyna = collective(
        SparseAlgo::ExDyna { warm_start: false },
        cost_model::Algorithm::Exdyna,
    );
    let rows_spec: [(&str, Planner, &dyn Scheme, &RuntimeCosts); 7] = [
        (
            "dense (mgwfbp)",
            Planner::MgWfbp,
            &DenseAllreduce,
            &dense_costs,
        ),
        (ONE_GROUP, Planner::TopK, &sparse, &sparse_costs),
        (LAYER_WISE, Planner::Lags, &sparse, &sparse_costs),
        (
            "mgs (threshold)",
            Planner::Threshold(crate::plan::DEFAULT_THRESHOLD),
            &sparse,
            &sparse_costs,
        ),
        (PLANNED, Planner::Exact, &sparse, &sparse_costs),
        ("spardl (exact)", Planner::Exact, &spardl.0, &spardl.1),
        ("exdyna (exact)", Planner::Exact, &exdyna.0, &exdyna.1),
    ];
    let mut rows = Vec::new();
    for (name, planner, scheme, costs) in rows_spec {
        let plan = planner.plan(&measured, costs)?;
        let predicted = predict(&measured, &plan, costs)?;
        let tl = run(cfg, topo, &emu, &plan, scheme, false)?;
        rows.push(row(name, &plan, &predicted, &tl));
    }
    // BSP-SGD Algorithm 1: layer-wise LP reduces, the weights' broadcast overlapping the
    // next forward.
    let bsp_cfg = crate::train::TrainConfig {
        scheme: crate::SchemeKind::Bsp1,
        ranks: cfg.ranks,
        ..crate::train::TrainConfig::default()
    };
    let sizes = staged::layer_sizes(&mlp(cfg.hidden)?);
    let (bsp_scheme, _, _) =
        crate::reduction::for_epoch(&bsp_cfg, 0, cfg.ranks, &sizes, Some(&topo))?;
    let lp = LpReduceCosts { base: dense_costs };
    let model = mlp(cfg.hidden)?;
    let st = stage_sizes(&model);
    let fwd = lp.overlapped_forward_s(&stage_forward_s(measured.forward_s(), &st), &st);
    let bw: Vec<f64> = measured.layers().iter().map(|l| l.backward_s).collect();
    let bsp_profile = measured.with_backward_times(fwd, &bw)?;
    let plan = Planner::Lags.plan(&bsp_profile, &lp)?;
    let predicted = predict(&bsp_profile, &plan, &lp)?;
    let tl = run(cfg, topo, &emu, &plan, &*bsp_scheme, true)?;
    rows.push(row(BSP1, &plan, &predicted, &tl));
    Ok(rows)
}

/// A row from the prediction and rank 0's measured iterations.
fn row(
    name: &str,
    plan: &MergePlan,
    predicted: &Timeline,
    tl: &[(Timeline, f64, f64)],
) -> CheckRow {
    let n = tl.len().max(1) as f64;
    let mean = |f: &dyn Fn(&(Timeline, f64, f64)) -> f64| tl.iter().map(f).sum::<f64>() / n;
    let m = mean(&|t| t.0.iteration_s);
    CheckRow {
        scheme: name.to_string(),
        groups: plan.num_groups(),
        predicted_s: predicted.iteration_s,
        measured_s: m,
        rel_error: m / predicted.iteration_s - 1.0,
        predicted_non_overlapped_s: predicted.non_overlapped_comm_s,
        measured_non_overlapped_s: mean(&|t| t.0.non_overlapped_comm_s),
        param_wait_s: mean(&|t| t.1),
        param_bcast_s: mean(&|t| t.2),
    }
}

/// True when the measured times order the schemes as the predictions do, for every pair
/// whose predictions differ by more than `margin` (relative).
pub fn same_ranking(rows: &[CheckRow], margin: f64) -> bool {
    rows.iter().all(|a| {
        rows.iter()
            .all(|b| a.predicted_s * (1.0 + margin) >= b.predicted_s || a.measured_s < b.measured_s)
    })
}
