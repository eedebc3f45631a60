//! Checks the runtime against the timeline: runs the built-in model data-parallel over
//! `SimComm` in real-time mode (every message takes its modelled α + β·n of the paper's
//! 1 GbE cluster), with forward and backward times emulated per layer, and compares each
//! scheme's measured iteration time with the prediction of [`crate::predict`] for the same
//! plan.
//!
//! **The emulated device.** Each iteration's real candle gradients are computed before its
//! timed part; the timed part sleeps the device's forward and per-layer backward times and
//! hands each layer's gradient to the [`Reducer`] at its ready time. On a GPU the compute
//! does not take the host's cores from the communication threads; computing on the CPU
//! inside the timed part would (on a 2-core host it doubled the backward at random). The
//! ranks start each timed iteration together (a barrier), as after a synchronous step.
//!
//! **The prediction's inputs** are measured the way OMGS-SGD (Shi et al., INFOCOM 2020)
//! does it, in a profiling run with one group per layer:
//! - per-layer forward and backward times by the per-hook timestamp method, on every rank,
//!   combined into the slowest rank's ready times ([`slowest_rank_times`]): a collective
//!   waits for its last rank;
//! - the top-k time as a linear fit of the measured compression spans;
//! - the communication from the link's α and β and the exchange's message pattern (ring
//!   all-gather: `P − 1` rounds; a Bruck all-gather of the agreement headers, `⌈log2 P⌉`
//!   rounds, then ring all-reduce: `2(P − 1)` rounds; the sparse collectives' replayed
//!   schedules), plus the exchange's host time (copies, decoding, the dense result) as a line
//!   in the group size, fitted to the measured communication spans minus the modelled ones
//!   in a layer-wise profiling run of that scheme.
//!
//! The merged plans are then predicted before they run, for group sizes the profiling run did
//! not have. One exception: a data-dependent exchange (ExDyna's threshold picks its count) is
//! predicted from the traffic its steps reported ([`crate::Traffic`]), the medians per group
//! over the measured iterations. Measured times are medians over iterations (the mean is kept
//! beside), so that one iteration delayed by another process does not decide a verdict.
//!
//! BSP-SGD Algorithm 1 of Linear Pipelining (Wang et al.) is checked too: per-layer LP
//! reduces to the root during backward, and the weights' per-stage LP broadcast during the
//! next forward, each stage's forward waiting for its own parameters ([`crate::bsp`]). Its
//! prediction replays that pipeline: the stages' LP broadcast schedules (those of
//! `cost_model::dense`) run one after another on every rank's broadcast thread and are
//! replayed rank by rank, giving `ready_r(s)`, when rank `r` holds stage `s` (the root
//! moves on to the next stage while the chain still forwards the last one, so the stages
//! overlap); rank `r`'s forward ends at `f_r(s) = max(f_r(s − 1), ready_r(s)) + fwd(s)`,
//! and the timeline of the backward and the reduces starts from the latest rank's
//! `f_r(S − 1)`.

use collectives::{ClockMode, Communicator, SimComm, ThreadComm, ThreadConfig};
use cost_model::plan::ceil_log2;
use cost_model::{Link, Topology};
use serde::{Deserialize, Serialize};

use crate::plan::{MergePlan, Planner};
use crate::profile::{slowest_rank_times, LayerProfile, RankSample};
use crate::runtime::Reducer;
use crate::schemes::{
    selected_count, CollectiveScheme, DenseAllreduce, Scheme, TopkAllgather, HEADER_BYTES,
};
use crate::staged::{self, Stages};
use crate::timeline::{predict, StepCosts, Timeline, Traffic};
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
    /// Host time of one exchange beyond the link's (copies, encoding and decoding, building
    /// the dense result), `host_a + host_b·numel` seconds: fitted from a profiling run of
    /// the scheme; 0 where it was not measured.
    #[serde(default)]
    pub host_a: f64,
    /// Host time per element of one exchange.
    #[serde(default)]
    pub host_b: f64,
}

impl StepCosts for RuntimeCosts {
    fn sparsify_s(&self, numel: usize) -> f64 {
        if self.algorithm.is_some() {
            return 0.0;
        }
        self.select_s(numel)
    }
    fn comm_s(&self, numel: usize) -> f64 {
        if self.ranks <= 1 {
            return 0.0;
        }
        self.modelled_s(numel) + self.host_s(numel)
    }
    fn comm_alpha_s(&self) -> f64 {
        self.host_a + self.modelled_alpha_s()
    }
}

impl RuntimeCosts {
    /// [`StepCosts::comm_s`] for an exchange that sent `traffic`: a data-dependent
    /// algorithm's replay takes the counts it selected (`density · numel` in all, the
    /// largest `padding` times the mean) instead of its expected ones.
    pub fn observed_comm_s(&self, numel: usize, traffic: Option<Traffic>) -> f64 {
        let (Some(t), Some(algo), Some(rho)) = (traffic, self.algorithm, self.density) else {
            return self.comm_s(numel);
        };
        if self.ranks <= 1 {
            return 0.0;
        }
        let p = self.ranks;
        let total = (t.density * numel as f64).round().max(0.0) as usize;
        let max = ((t.padding * total as f64 / p as f64).round() as usize).min(total);
        let rest = (total - max).div_ceil((p - 1).max(1));
        let mut selected = vec![rest; p];
        selected[0] = max;
        self.agree_s()
            + self.select_s(numel)
            + self.collective_observed_s(algo, numel, rho, Some(selected))
            + self.host_s(numel)
    }

    /// The fitted host time of one exchange of `numel` elements.
    fn host_s(&self, numel: usize) -> f64 {
        self.host_a + self.host_b * numel as f64
    }

    /// The exchange's modelled time: its message schedule on the link, plus the selection
    /// where the exchange selects on the communication thread.
    fn modelled_s(&self, numel: usize) -> f64 {
        let p = self.ranks;
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

    fn modelled_alpha_s(&self) -> f64 {
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
        self.collective_observed_s(algo, numel, rho, None)
    }

    /// [`Self::collective_s`] with ExDyna's per-rank counts given (`selected`).
    fn collective_observed_s(
        &self,
        algo: cost_model::Algorithm,
        numel: usize,
        rho: f64,
        selected: Option<Vec<usize>>,
    ) -> f64 {
        use cost_model::sparse_replay::{replay_sparse, Observed, SparseStep};
        let p = self.ranks;
        let mut step = SparseStep::new(algo, numel, rho);
        if algo == cost_model::Algorithm::Exdyna {
            let each = step.k().div_ceil(p).max(1);
            step = step.with_observed(Observed::ExDyna {
                selected: selected.unwrap_or_else(|| vec![each; p]),
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
    /// forward's start on each rank's broadcast thread: the latest rank's end, since the
    /// collectives of backward wait for it.
    pub fn overlapped_forward_s(&self, fwd: &[f64], sizes: &[usize]) -> f64 {
        self.broadcast_ready_s(sizes)
            .iter()
            .map(|ready| {
                fwd.iter()
                    .zip(ready)
                    .fold(0.0f64, |end, (f, &r)| end.max(r) + f)
            })
            .fold(0.0, f64::max)
    }

    /// `ready[r][s]`: when rank `r` holds stage `s`'s weights, the stages' LP broadcasts
    /// from rank 0 replayed one after another on every rank (each stage's message schedule
    /// of `cost_model::dense`, appended per rank to one [`cost_model::Schedule`]). A rank
    /// starts a stage as soon as it has passed on the previous one, so the root runs ahead
    /// while the chain still forwards: consecutive stages overlap, and a stage costs the
    /// chain's `P − 2` fill steps once, not once per stage.
    pub fn broadcast_ready_s(&self, sizes: &[usize]) -> Vec<Vec<f64>> {
        let p = self.base.ranks;
        let mut ready = vec![vec![0.0; sizes.len()]; p.max(1)];
        if p <= 1 {
            return ready;
        }
        let replayed = (|| -> cost_model::Result<()> {
            let topo = Topology::flat(p, self.base.link)?;
            let mut all = cost_model::Schedule::new(p);
            for (s, &n) in sizes.iter().enumerate() {
                if n > 0 {
                    let op = cost_model::Collective::Broadcast;
                    let block = crate::reduction::lp_block(op, n, p, Some(self.base.link));
                    let case = cost_model::DenseCase::new(op, cost_model::Algorithm::Lp, n)
                        .with_block_bytes(block);
                    let stage = cost_model::dense::dense_schedule(&case, p, topo.ranks_per_node)?;
                    for (mine, theirs) in all.ops.iter_mut().zip(stage.ops) {
                        mine.extend(theirs);
                    }
                }
                let done = all.evaluate(&topo)?;
                for (r, c) in done.per_rank.iter().enumerate() {
                    ready[r][s] = c.time_s;
                }
            }
            Ok(())
        })();
        if replayed.is_err() {
            ready.iter_mut().for_each(|r| r.fill(f64::INFINITY));
        }
        ready
    }
}

impl StepCosts for LpReduceCosts {
    fn sparsify_s(&self, _numel: usize) -> f64 {
        0.0
    }
    fn comm_s(&self, numel: usize) -> f64 {
        self.base.agree_s()
            + self.lp_s(cost_model::Collective::Reduce, numel)
            + self.base.host_s(numel)
    }
    fn comm_alpha_s(&self) -> f64 {
        self.base.agree_s()
            + self.base.host_a
            + self.base.link.alpha_s * self.base.ranks.saturating_sub(1) as f64
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
    /// Measured median iteration time, seconds.
    pub measured_s: f64,
    /// Measured mean iteration time, seconds.
    #[serde(default)]
    pub measured_mean_s: f64,
    /// `measured / predicted − 1`.
    pub rel_error: f64,
    /// Predicted communication left after backward ends, seconds.
    pub predicted_non_overlapped_s: f64,
    /// Measured median communication left after backward ends, seconds.
    pub measured_non_overlapped_s: f64,
    /// BSP-SGD Algorithm 1: measured median forward time spent waiting for the weights'
    /// broadcast, seconds (0 for the other schemes).
    #[serde(default)]
    pub param_wait_s: f64,
    /// BSP-SGD Algorithm 1: measured median broadcast time of the weights (stages summed),
    /// seconds; `param_bcast_s − param_wait_s` of it overlapped forward.
    #[serde(default)]
    pub param_bcast_s: f64,
    /// The prediction's parts.
    #[serde(default)]
    pub predicted_parts: Parts,
    /// The measured parts (medians over the measured iterations).
    #[serde(default)]
    pub measured_parts: Parts,
}

/// An iteration's time by part, seconds, to see which part a prediction misses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Parts {
    /// Forward.
    pub forward_s: f64,
    /// Backward (sum of the per-layer spans).
    pub backward_s: f64,
    /// Selection on the compute thread (sum of the groups' spans).
    pub sparsify_s: f64,
    /// Communication (sum of the groups' spans on the communication thread).
    pub comm_s: f64,
}

impl Parts {
    /// The parts of one timeline.
    pub fn of(t: &Timeline) -> Self {
        Parts {
            forward_s: t.forward.len(),
            backward_s: t.backward.iter().map(|s| s.len()).sum(),
            sparsify_s: t.total_sparsify_s(),
            comm_s: t.total_comm_s(),
        }
    }

    /// The medians of each part over `timelines`.
    pub fn median_of<'a>(timelines: impl Iterator<Item = &'a Timeline> + Clone) -> Self {
        let median = |f: fn(&Parts) -> f64| {
            cost_model::median(
                &timelines
                    .clone()
                    .map(|t| f(&Parts::of(t)))
                    .collect::<Vec<_>>(),
            )
        };
        Parts {
            forward_s: median(|p| p.forward_s),
            backward_s: median(|p| p.backward_s),
            sparsify_s: median(|p| p.sparsify_s),
            comm_s: median(|p| p.comm_s),
        }
    }
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
pub(crate) fn mlp(hidden: usize) -> Result<Stages> {
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
pub(crate) fn stage_forward_s(total: f64, sizes: &[usize]) -> Vec<f64> {
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

/// Runs `iterations` (+2 warm-up) iterations with `scheme` and `plan` and returns every
/// rank's measured timelines (warm-up excluded), rank 0 first.
fn run_all(
    cfg: &CheckConfig,
    topo: Topology,
    emu: &LayerProfile,
    plan: &MergePlan,
    scheme: &dyn Scheme,
    bsp1: bool,
) -> Result<Vec<Vec<(Timeline, f64, f64)>>> {
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
            let sync = sim.split(2, rank as u32)?;
            let mut reducer =
                Reducer::new(sim, &staged::layer_sizes(&model), plan.clone(), scheme)?;
            let bw: Vec<f64> = emu.layers().iter().map(|l| l.backward_s).collect();
            let x: Vec<f32> = (0..cfg.batch * 64)
                .map(|i| ((i * 7 + rank * 13) % 17) as f32 / 17.0 - 0.5)
                .collect();
            let x = candle_core::Tensor::from_vec(x, (cfg.batch, 64), &candle_core::Device::Cpu)?;
            let y: Vec<u32> = (0..cfg.batch).map(|i| ((i + rank) % 10) as u32).collect();
            let y = candle_core::Tensor::from_vec(y, cfg.batch, &candle_core::Device::Cpu)?;
            // The real gradients of one iteration, computed outside the timed part: on this
            // host the candle compute would contend for the cores with the communication
            // threads, which a GPU's compute does not; the timed part replays the emulated
            // device's times and hands these gradients over at each layer's ready time.
            let real_grads = || -> Result<Vec<(usize, Vec<f32>)>> {
                let f = staged::forward_train(&model, &x)?;
                let loss = staged::Staged::loss(&model, f.logits(), &y)?;
                let mut grads = Vec::new();
                staged::backward_staged(&model, &f, &loss, &mut |l, g| {
                    grads.push((l, g.to_vec()));
                    Ok(())
                })?;
                Ok(grads)
            };
            let mut out = Vec::new();
            let mut grads = real_grads()?;
            let mut weights = None;
            for it in 0..cfg.iterations + 2 {
                // Every rank starts its timed iteration together, as after a synchronous
                // step; the weights' broadcast starts with it.
                sync.barrier()?;
                if let (Some(b), Some(w)) = (bcast.as_mut(), weights.take()) {
                    b.launch(w)?;
                }
                reducer.begin()?;
                let (mut wait_s, mut bcast_s) = (0.0, 0.0);
                match bcast.as_mut() {
                    Some(b) => {
                        for (s, &f) in stage_fwd.iter().enumerate() {
                            if b.in_flight() {
                                let (_, span, waited) = b.wait(s)?;
                                wait_s += waited;
                                bcast_s += span.len();
                            }
                            sleep_s(f);
                        }
                    }
                    None => sleep_s(emu.forward_s()),
                }
                reducer.forward_done()?;
                for (l, g) in &grads {
                    sleep_s(bw.get(*l).copied().unwrap_or(0.0));
                    reducer.ready(*l, g)?;
                }
                reducer.finish()?;
                if it >= 2 {
                    if let Some(t) = reducer.last_timeline() {
                        out.push((t.clone(), wait_s, bcast_s));
                    }
                }
                grads = real_grads()?;
                if bcast.is_some() {
                    // The root's update is not emulated; its weights go out as they are.
                    weights = Some(
                        (0..stage_sizes.len())
                            .map(|s| staged::get_stage_params(&model, s))
                            .collect::<Result<Vec<_>>>()?,
                    );
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
    crate::error::all_ranks(outs)
}

/// Rank 0's timelines of a [`run_all`]: the rows compare rank 0's measurement, as a user
/// timing their job would.
fn rank0_of(all: Vec<Vec<(Timeline, f64, f64)>>) -> Result<Vec<(Timeline, f64, f64)>> {
    all.into_iter()
        .next()
        .ok_or_else(|| Error::InvalidArgument("no ranks".into()))
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

/// The host time of `costs`'s exchanges: a line `a + b·numel` through the measured
/// communication spans minus their modelled times, over the groups of `timelines`
/// (a layer-wise profiling run spans the model's tensor sizes). The line goes through the
/// median of each group size, so that a few exchanges delayed by another process on the
/// host do not tilt it.
fn host_cost_fit<'a>(
    modelled_s: impl Fn(&crate::timeline::GroupTiming) -> f64,
    timelines: impl IntoIterator<Item = &'a Timeline>,
) -> (f64, f64) {
    let mut points: Vec<(usize, f64)> = timelines
        .into_iter()
        .flat_map(|t| t.groups.iter())
        .map(|g| (g.numel, g.comm.len() - modelled_s(g)))
        .collect();
    points.sort_by_key(|p| p.0);
    let medians: Vec<(f64, f64)> = points
        .chunk_by(|a, b| a.0 == b.0)
        .map(|same| {
            let v: Vec<f64> = same.iter().map(|p| p.1).collect();
            (same[0].0 as f64, cost_model::median(&v))
        })
        .collect();
    fit_line(&medians)
}

/// [`RuntimeCosts`] with the traffic a data-dependent exchange was measured to send, per
/// group size (the median over the measured iterations).
struct ObservedCosts<'a> {
    base: &'a RuntimeCosts,
    traffic: Vec<(usize, Traffic)>,
}

impl ObservedCosts<'_> {
    /// The medians of `timelines`' traffic per group size; `None` when no group reported
    /// any (the traffic followed from the sizes).
    fn from_run<'a>(
        base: &'a RuntimeCosts,
        timelines: &[(Timeline, f64, f64)],
    ) -> Option<ObservedCosts<'a>> {
        let mut sizes: Vec<usize> = timelines
            .iter()
            .flat_map(|t| t.0.groups.iter())
            .filter(|g| g.traffic.is_some())
            .map(|g| g.numel)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        let traffic: Vec<(usize, Traffic)> = sizes
            .into_iter()
            .map(|n| {
                let of = |f: &dyn Fn(&Traffic) -> f64| {
                    let v: Vec<f64> = timelines
                        .iter()
                        .flat_map(|t| t.0.groups.iter())
                        .filter(|g| g.numel == n)
                        .filter_map(|g| g.traffic.as_ref().map(f))
                        .collect();
                    cost_model::median(&v)
                };
                let t = Traffic {
                    density: of(&|t| t.density),
                    padding: of(&|t| t.padding),
                };
                (n, t)
            })
            .collect();
        (!traffic.is_empty()).then_some(ObservedCosts { base, traffic })
    }
}

impl StepCosts for ObservedCosts<'_> {
    fn sparsify_s(&self, numel: usize) -> f64 {
        self.base.sparsify_s(numel)
    }
    fn comm_s(&self, numel: usize) -> f64 {
        let t = self.traffic.iter().find(|(n, _)| *n == numel).map(|x| x.1);
        self.base.observed_comm_s(numel, t)
    }
    fn comm_alpha_s(&self) -> f64 {
        self.base.comm_alpha_s()
    }
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
    // Profiling run (OMGS-SGD's per-hook method), on every rank: the slowest rank's ready
    // times are what the collectives wait for.
    let per_rank = run_all(
        cfg,
        topo,
        &emu,
        &MergePlan::layerwise(l_count),
        &sparse,
        false,
    )?;
    let samples: Vec<Vec<RankSample>> = per_rank
        .iter()
        .map(|r| {
            r.iter()
                .map(|(t, _, _)| RankSample {
                    forward_s: t.forward.len(),
                    backward_s: t.backward.iter().map(|s| s.len()).collect(),
                })
                .collect()
        })
        .collect();
    let (fwd, bw) = slowest_rank_times(&samples, 0)?;
    let measured = emu.with_backward_times(fwd, &bw)?;
    let prof: Vec<&Timeline> = per_rank
        .iter()
        .flat_map(|r| r.iter().map(|x| &x.0))
        .collect();
    let points: Vec<(f64, f64)> = prof
        .iter()
        .flat_map(|t| t.groups.iter().map(|g| (g.numel as f64, g.sparsify.len())))
        .collect();
    let (sa, sb) = fit_line(&points);
    let unfitted = RuntimeCosts {
        link,
        ranks: cfg.ranks,
        density: Some(cfg.density),
        algorithm: None,
        sparsify_a: sa,
        sparsify_b: sb,
        host_a: 0.0,
        host_b: 0.0,
    };
    // Rank 0's spans, as every row measures rank 0 (a span includes waiting for the peers).
    let (host_a, host_b) = host_cost_fit(
        |g| unfitted.comm_s(g.numel),
        per_rank.first().into_iter().flatten().map(|x| &x.0),
    );
    let sparse_costs = RuntimeCosts {
        host_a,
        host_b,
        ..unfitted
    };
    // Every other exchange's host time, from a layer-wise profiling run of its own.
    let layerwise = MergePlan::layerwise(l_count);
    let fitted = |costs: RuntimeCosts, scheme: &dyn Scheme| -> Result<RuntimeCosts> {
        let tl = rank0_of(run_all(cfg, topo, &emu, &layerwise, scheme, false)?)?;
        let (host_a, host_b) = host_cost_fit(
            |g| costs.observed_comm_s(g.numel, g.traffic),
            tl.iter().map(|t| &t.0),
        );
        Ok(RuntimeCosts {
            host_a,
            host_b,
            ..costs
        })
    };
    let dense_costs = fitted(
        RuntimeCosts {
            density: None,
            algorithm: None,
            sparsify_a: 0.0,
            sparsify_b: 0.0,
            ..unfitted
        },
        &DenseAllreduce,
    )?;
    let collective = |algo: SparseAlgo, costs_algo| -> Result<(CollectiveScheme, RuntimeCosts)> {
        let scheme = CollectiveScheme {
            algo,
            density: cfg.density,
        };
        let costs = RuntimeCosts {
            algorithm: Some(costs_algo),
            ..unfitted
        };
        let costs = fitted(costs, &scheme)?;
        Ok((scheme, costs))
    };
    let spardl = collective(
        SparseAlgo::SparDl {
            sag: collectives::sparse::Sag::None,
            teams: None,
            selector: None,
        },
        cost_model::Algorithm::Spardl,
    )?;
    let exdyna = collective(
        // The fast mode: from the paper's start ExDyna's count drifts for hundreds of
        // steps, longer than this check runs; its traffic is still data-dependent and its
        // row is predicted from the counts it chose.
        SparseAlgo::ExDyna { warm_start: true },
        cost_model::Algorithm::Exdyna,
    )?;
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
        let tl = rank0_of(run_all(cfg, topo, &emu, &plan, scheme, false)?)?;
        // A data-dependent exchange is predicted from the traffic it chose (its steps'
        // counts), everything else from the sizes alone, before the run.
        let predicted = match ObservedCosts::from_run(costs, &tl) {
            Some(observed) => predict(&measured, &plan, &observed)?,
            None => predict(&measured, &plan, costs)?,
        };
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
    let lp = LpReduceCosts {
        base: RuntimeCosts {
            host_a: 0.0,
            host_b: 0.0,
            ..dense_costs
        },
    };
    let lp_host = host_cost_fit(
        |g| lp.comm_s(g.numel),
        rank0_of(run_all(cfg, topo, &emu, &layerwise, &*bsp_scheme, false)?)?
            .iter()
            .map(|t| &t.0),
    );
    let lp = LpReduceCosts {
        base: RuntimeCosts {
            host_a: lp_host.0,
            host_b: lp_host.1,
            ..dense_costs
        },
    };
    let model = mlp(cfg.hidden)?;
    let st = stage_sizes(&model);
    let plan = Planner::Lags.plan(&measured, &lp)?;
    let predicted =
        crate::bsp::predict_with_broadcast(&predict(&measured, &plan, &lp)?, &st, link, cfg.ranks);
    let tl = rank0_of(run_all(cfg, topo, &emu, &plan, &*bsp_scheme, true)?)?;
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
    // Medians: one iteration that another process on the host delays should not decide
    // the verdict; the mean is kept beside it.
    let median = |f: &dyn Fn(&(Timeline, f64, f64)) -> f64| {
        cost_model::median(&tl.iter().map(f).collect::<Vec<_>>())
    };
    let m = median(&|t| t.0.iteration_s);
    CheckRow {
        scheme: name.to_string(),
        groups: plan.num_groups(),
        predicted_s: predicted.iteration_s,
        measured_s: m,
        measured_mean_s: mean(&|t| t.0.iteration_s),
        rel_error: m / predicted.iteration_s - 1.0,
        predicted_non_overlapped_s: predicted.non_overlapped_comm_s,
        measured_non_overlapped_s: median(&|t| t.0.non_overlapped_comm_s),
        param_wait_s: median(&|t| t.1),
        param_bcast_s: median(&|t| t.2),
        predicted_parts: Parts::of(predicted),
        measured_parts: Parts::median_of(tl.iter().map(|t| &t.0)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Span;

    fn exdyna_costs(p: usize) -> RuntimeCosts {
        RuntimeCosts {
            link: cost_model::presets::omgs_1gbe(p)
                .unwrap()
                .topology()
                .unwrap()
                .inter,
            ranks: p,
            density: Some(0.01),
            algorithm: Some(cost_model::Algorithm::Exdyna),
            sparsify_a: 0.0,
            sparsify_b: 0.0,
            host_a: 1e-3,
            host_b: 1e-9,
        }
    }

    #[test]
    fn consecutive_lp_broadcasts_overlap_along_the_chain() {
        use cost_model::Collective::Broadcast;
        let lp = LpReduceCosts {
            base: exdyna_costs(4),
        };
        let (a, b) = (1 << 20, 1 << 18);
        // One stage: the last rank of the chain holds it when the collective ends.
        let one = lp.broadcast_ready_s(&[a]);
        assert!((one[3][0] - lp.lp_s(Broadcast, a)).abs() < 1e-12 * one[3][0]);
        assert!(one[0][0] < one[3][0], "the root is done first: {one:?}");
        // Two stages: the root starts the second as soon as it has sent the first, so the
        // last rank holds both before two whole broadcasts one after another would end.
        let two = lp.broadcast_ready_s(&[a, b]);
        let serial = lp.lp_s(Broadcast, a) + lp.lp_s(Broadcast, b);
        assert!(
            two[3][1] < serial && two[3][1] > lp.lp_s(Broadcast, a),
            "{two:?}"
        );
        assert!(two.iter().all(|r| r[0] <= r[1]), "{two:?}");
        // The forward of the slowest rank waits for its own stages.
        let fwd = [1e-3, 1e-3];
        let end = lp.overlapped_forward_s(&fwd, &[a, b]);
        assert!((end - (two[3][1].max(two[3][0] + 1e-3) + 1e-3)).abs() < 1e-12);
        // One rank: nothing to wait for.
        let solo = LpReduceCosts {
            base: RuntimeCosts {
                ranks: 1,
                ..exdyna_costs(2)
            },
        };
        assert_eq!(solo.broadcast_ready_s(&[a, b]), vec![vec![0.0, 0.0]]);
    }

    #[test]
    fn observed_traffic_prices_what_exdyna_sent() {
        let (c, n) = (exdyna_costs(4), 1 << 20);
        let expected = c.comm_s(n);
        let at = |density, padding| c.observed_comm_s(n, Some(Traffic { density, padding }));
        // The expected count, balanced, is the prediction without traffic (within rounding).
        let same = at(0.01, 1.0);
        assert!(
            (same - expected).abs() <= 1e-3 * expected,
            "{same} vs {expected}"
        );
        // More entries, or one rank padding the all-gather, cost more; fewer cost less.
        assert!(at(0.03, 1.0) > same && at(0.01, 2.0) > same && at(0.001, 1.0) < same);
        // Both include the fitted host time.
        assert!(same > c.host_s(n));
        // No traffic, or an algorithm with no data-dependent count: the plain prediction.
        assert_eq!(c.observed_comm_s(n, None), expected);
        let dense = RuntimeCosts {
            algorithm: None,
            density: None,
            ..c
        };
        let t = Some(Traffic {
            density: 0.5,
            padding: 3.0,
        });
        assert_eq!(dense.observed_comm_s(n, t), dense.comm_s(n));
    }

    #[test]
    fn host_fit_recovers_a_known_line() {
        let c = exdyna_costs(2);
        let group = |numel: usize| crate::timeline::GroupTiming {
            layers: vec![0],
            numel,
            sparsify: Span::default(),
            comm: Span {
                start: 0.0,
                end: 2e-3 + 3e-9 * numel as f64,
            },
            traffic: None,
        };
        let t = Timeline {
            forward: Span::default(),
            backward: vec![],
            groups: vec![group(1000), group(100_000), group(1_000_000)],
            iteration_s: 0.0,
            compute_end_s: 0.0,
            non_overlapped_comm_s: 0.0,
        };
        // Modelled part: half the intercept; the fit is the rest.
        let (a, b) = host_cost_fit(|_| 1e-3, [&t]);
        assert!(
            (a - 1e-3).abs() < 1e-9 && (b - 3e-9).abs() < 1e-15,
            "{a} {b}"
        );
        // Measured below the model everywhere: no negative host time.
        let (a, b) = host_cost_fit(|g| c.comm_s(g.numel) + 1.0, [&t]);
        assert_eq!((a, b), (0.0, 0.0));
        // One iteration's largest exchange delayed tenfold (another process took the
        // core): the medians per size keep the line; a least-squares line through every
        // point would have tilted by the outlier.
        let mut slow = t.clone();
        slow.groups[2].comm.end *= 10.0;
        let (a, b) = host_cost_fit(|_| 1e-3, [&t, &t, &slow]);
        assert!(
            (a - 1e-3).abs() < 1e-9 && (b - 3e-9).abs() < 1e-15,
            "{a} {b}"
        );
    }
}
