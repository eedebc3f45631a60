//! Data-parallel training of a candle model with any scheme: every rank reads its shard
//! through `datacache`, runs forward, then a stage-by-stage backward whose stages hand
//! their gradients to the [`Reducer`] as soon as they are ready (wait-free backpropagation,
//! OMGS-SGD (Shi et al., INFOCOM 2020), Algorithm 2); the averaged gradients drive one
//! [`Optimizer`](optimizer::Optimizer) (SGD, or LARS/LAMB with PTO). Under BSP-SGD
//! Algorithms 1 and 2 of Linear Pipelining (Wang et al.) only the root steps and its
//! weights reach the other ranks by LP broadcast ([`crate::bsp`]); under Algorithm 1 that
//! broadcast overlaps the next forward, each stage waiting for its own weights, and the
//! parameter check of a step runs once they have arrived. Data comes through a
//! [`Dataset`] (images or token streams).
//! A model that carries state from batch to batch (the LSTM's truncated BPTT:
//! [`Staged::reset_state`]) starts every epoch from zeros; rank 0 reports the test and,
//! where the data has one, the validation metrics after every epoch.
//!
//! **Profile, then plan** (as OMGS-SGD does): the first `profile_iters` iterations run as
//! dense SGD with one group, so backward is not disturbed by communication; their per-layer
//! backward times (per-hook timestamps) form the [`LayerProfile`], rank 0's times are
//! broadcast so every rank plans the same, and the scheme's planner plans the merge under
//! the cost model: the emulated link's own costs on `SimComm`, a calibration file, or the
//! OMGS 1 GbE preset. The report carries the plan and its predicted iteration time next to
//! the measured breakdown.
//!
//! Ranks check that they agree before training (model layers, initial weights,
//! configuration) and, with `check_params`, that the parameters are bit-identical after
//! every step; a disagreement is [`Error::RankMismatch`] on every rank.

use std::time::Instant;

use collectives::dense::{self, AllgatherAlgo, BroadcastAlgo, DenseOptions};
use collectives::{ClockMode, Communicator, SimComm, ThreadComm, ThreadConfig};
use cost_model::Topology;
use serde::{Deserialize, Serialize};

use crate::bsp::ParamBroadcast;
use crate::candle_models::LstmShape;
use crate::checkpoint::{self, Header, RankPart, Replicated};
use crate::data::{Dataset, ImageData};
use crate::optimizer::{self, OptimizerKind};
use crate::plan::{MergePlan, Planner};
use crate::profile::{slowest_rank_times, LayerProfile, RankSample};
use crate::reduction::{self, BspUpdate, SchemeKind};
use crate::runtime::{add_warm_starts, Reducer};
use crate::staged::{self, Staged};
use crate::timeline::{predict, Timeline};
use crate::trace::{self, TraceEvent};
use crate::{Error, Result};

/// How the learning rate moves after the linear warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum LrSchedule {
    /// Constant.
    Constant,
    /// Cosine decay to zero at the last iteration (SGDR, Loshchilov & Hutter, without
    /// restarts): the last epochs settle, so final accuracies compare the schemes rather
    /// than where a constant rate's noise leaves each of them.
    Cosine,
}

/// The learning rate of step `step` (from 0) of `total`: linear warm-up over
/// `warmup_iters`, then `cfg.lr_schedule`.
fn learning_rate(cfg: &TrainConfig, step: usize, total: usize, warmup_iters: f64) -> f32 {
    let s = (step + 1) as f64;
    if s < warmup_iters {
        return cfg.lr * (s / warmup_iters) as f32;
    }
    match cfg.lr_schedule {
        LrSchedule::Constant => cfg.lr,
        LrSchedule::Cosine => {
            let span = (total as f64 - warmup_iters).max(1.0);
            let t = ((s - warmup_iters.max(0.0)) / span).clamp(0.0, 1.0);
            cfg.lr * (0.5 * (1.0 + (std::f64::consts::PI * t).cos())) as f32
        }
    }
}

/// Which built-in model to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum ModelKind {
    /// ResNet-20 (any square input side ≥ 4).
    Resnet20,
    /// VGG-16 with batch norm (input side a multiple of 32).
    Vgg16Bn,
    /// The 2-layer LSTM language model (token files).
    Lstm,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::Resnet20 => "resnet20",
            ModelKind::Vgg16Bn => "vgg16_bn",
            ModelKind::Lstm => "lstm",
        })
    }
}

/// How ranks talk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transport {
    /// Threads of this process at memory speed.
    Thread,
    /// Threads through `SimComm` on `topology`: logical (accounting only) or real time
    /// (every message takes its modelled time, emulating the cluster).
    Sim(Topology, ClockMode),
}

/// Where and when a run writes checkpoints, and whether it resumes from one (see
/// [`crate::checkpoint`]). Checkpoints start once the profile's plan is in place.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CheckpointConfig {
    /// The directory (`None`: no checkpoints).
    pub dir: Option<std::path::PathBuf>,
    /// Write one every this many steps (0: only when the run stops early).
    pub every: usize,
    /// Continue from the newest intact checkpoint in `dir` (an error if there is none).
    pub resume: bool,
}

/// Everything a training run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Reduction scheme.
    pub scheme: SchemeKind,
    /// Merge planner (`None`: the scheme's default).
    pub planner: Option<Planner>,
    /// An explicit merge plan (groups of layer indices), checked against the model.
    pub groups: Option<Vec<Vec<usize>>>,
    /// Model.
    pub model: ModelKind,
    /// The language model's shape ([`ModelKind::Lstm`]); its vocabulary must be the
    /// token files'.
    pub lstm: LstmShape,
    /// Ranks P (threads; under MPI the world size must equal it).
    pub ranks: usize,
    /// Density ρ of the sparse schemes.
    pub density: f64,
    /// Epochs.
    pub epochs: usize,
    /// Samples per rank per iteration.
    pub batch: usize,
    /// Learning rate after warm-up.
    pub lr: f32,
    /// Momentum (0.9).
    pub momentum: f32,
    /// Weight decay (1e-4).
    pub weight_decay: f32,
    /// Linear LR warm-up length in epochs (fractional allowed).
    pub warmup_epochs: f64,
    /// The learning rate after warm-up.
    pub lr_schedule: LrSchedule,
    /// Optimizer.
    pub optimizer: OptimizerKind,
    /// Iterations at the start profiled (dense, one group) before planning; ≥ 2.
    pub profile_iters: usize,
    /// Epochs of MSTopK + HiTopKComm before the switch to the dense 2D torus
    /// ([`SchemeKind::Switch`]).
    pub switch_epochs: usize,
    /// Check after every step that the parameters are bit-identical on every rank.
    pub check_params: bool,
    /// A calibration JSON for the planning costs (else the link's or the preset's), and
    /// the automatic choice's starting pick.
    pub calibration: Option<std::path::PathBuf>,
    /// How the dense scheme picks its all-reduce per group (on an emulated link the ring
    /// is what the runtime costs price, whatever this says).
    pub dense_choice: crate::reduction::DenseChoice,
    /// Iterations of rank 0 recorded in the Chrome trace.
    pub trace_iters: usize,
    /// Seed for data order and initialisation.
    pub seed: u64,
    /// Transport.
    pub transport: Transport,
    /// Checkpoints (not part of the configuration fingerprint: they do not change the
    /// numbers).
    pub checkpoint: CheckpointConfig,
    /// Stop after this many steps in all (those before a resume included), writing a
    /// checkpoint first when `checkpoint.dir` is set: a run cut short on purpose.
    pub stop_after_steps: Option<usize>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            scheme: SchemeKind::Omgs,
            planner: None,
            groups: None,
            model: ModelKind::Resnet20,
            lstm: LstmShape::SMALL,
            ranks: 4,
            density: 0.01,
            epochs: 10,
            batch: 32,
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 1e-4,
            warmup_epochs: 1.0,
            lr_schedule: LrSchedule::Cosine,
            optimizer: OptimizerKind::Sgd,
            profile_iters: 4,
            switch_epochs: 1,
            check_params: false,
            calibration: None,
            dense_choice: Default::default(),
            trace_iters: 20,
            seed: 1,
            transport: Transport::Thread,
            checkpoint: CheckpointConfig::default(),
            stop_after_steps: None,
        }
    }
}

/// One epoch's numbers (rank 0's loss and training accuracy; its test and validation
/// metrics).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// Epoch (from 1).
    pub epoch: usize,
    /// Mean training loss.
    pub loss: f32,
    /// Training accuracy, %.
    pub train_acc: f64,
    /// Test accuracy, % (next-token accuracy for a language model).
    pub test_acc: f64,
    /// Mean test cross entropy, nats.
    #[serde(default)]
    pub test_loss: f64,
    /// Test perplexity (`exp(test_loss)`) of a language model; `None` for a classifier.
    #[serde(default)]
    pub test_ppl: Option<f64>,
    /// Mean validation cross entropy, nats; `None` for data without a validation split
    /// ([`Dataset::validation`]).
    #[serde(default)]
    pub valid_loss: Option<f64>,
    /// Validation perplexity (`exp(valid_loss)`) of a language model.
    #[serde(default)]
    pub valid_ppl: Option<f64>,
    /// Training time so far (evaluation excluded), seconds.
    pub elapsed_s: f64,
}

/// Progress reported by rank 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TrainEvent {
    /// An iteration finished.
    Iteration {
        /// Epoch (from 1).
        epoch: usize,
        /// Iteration within the epoch (from 1).
        iter: usize,
        /// Iterations per epoch.
        of: usize,
    },
    /// An epoch finished.
    Epoch(EpochStats),
}

/// Mean per-iteration times of rank 0 after planning (the first iteration of each reducer
/// excluded), beside the timeline's prediction for the plan.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Breakdown {
    /// Forward, seconds.
    pub forward_s: f64,
    /// Backward (sum of the per-layer spans), seconds.
    pub backward_s: f64,
    /// Selection / compression on the compute thread, seconds.
    pub selection_s: f64,
    /// Communication (sum of the groups' spans on the communication thread), seconds.
    pub comm_s: f64,
    /// Communication not hidden behind compute, seconds.
    pub non_overlapped_comm_s: f64,
    /// Forward start to the last group's arrival, seconds.
    pub iteration_s: f64,
    /// The optimizer step (and parameter write-back), seconds.
    pub optimizer_s: f64,
    /// BSP-SGD: forward time spent waiting for the weights' broadcast, seconds (inside
    /// `forward_s`).
    #[serde(default)]
    pub param_wait_s: f64,
    /// BSP-SGD: the weights' broadcast spans (per stage, summed), seconds; under
    /// Algorithm 1 `param_bcast_s − param_wait_s` of it overlapped forward.
    #[serde(default)]
    pub param_bcast_s: f64,
    /// The timeline's predicted iteration time for the plan.
    pub predicted_iteration_s: f64,
    /// The timeline's predicted non-overlapped communication.
    pub predicted_non_overlapped_s: f64,
    /// Iterations averaged.
    pub samples: usize,
}

/// What a run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    /// Scheme name.
    pub scheme: String,
    /// Planner used.
    pub planner: String,
    /// Model name.
    pub model: String,
    /// Data set name.
    pub data: String,
    /// Optimizer.
    pub optimizer: String,
    /// Transport backend.
    pub backend: String,
    /// Ranks.
    pub ranks: usize,
    /// Density.
    pub density: f64,
    /// The plan's groups (layer indices, forward order).
    pub groups: Vec<Vec<usize>>,
    /// Measured per-layer backward times of the profile, seconds (forward order).
    pub profile_backward_s: Vec<f64>,
    /// Per-epoch numbers.
    pub epochs: Vec<EpochStats>,
    /// Final test accuracy, %.
    pub test_acc: f64,
    /// Final test perplexity of a language model (`None` for a classifier).
    #[serde(default)]
    pub test_ppl: Option<f64>,
    /// Training wall time (evaluation excluded), seconds.
    pub time_s: f64,
    /// Payload bytes each rank sent in gradient exchanges, averaged over ranks.
    pub bytes_per_rank: f64,
    /// Measured and predicted iteration times.
    pub breakdown: Breakdown,
    /// Steps whose parameters were checked bit-identical on every rank.
    pub params_checked_steps: usize,
    /// This rank's top-k selections that started from the previous iteration's threshold, and
    /// how many of those missed and fell back (`None`: no selector of the scheme starts
    /// warm). See [`sparsify::Selector::warm_starts`].
    #[serde(default)]
    pub warm_starts: Option<(u64, u64)>,
    /// FNV-1a hash of the final parameters' bit patterns (the value compared across ranks
    /// after every step with `check_params`), to compare runs, e.g. threads against MPI.
    pub final_param_hash: u64,
    /// Steps restored from a checkpoint (0 for a fresh run).
    #[serde(default)]
    pub first_step: usize,
    /// Steps done at the end (all of them, those before a resume included).
    #[serde(default)]
    pub steps: usize,
    /// The parameter hash after each step this run took (steps `first_step + 1` on), to
    /// compare a resumed run with an uninterrupted one step by step.
    #[serde(default)]
    pub step_param_hashes: Vec<u64>,
    /// The last checkpoint written, if any.
    #[serde(default)]
    pub last_checkpoint: Option<std::path::PathBuf>,
    /// The checkpoint this run resumed from, if any.
    #[serde(default)]
    pub resumed_from: Option<std::path::PathBuf>,
    /// Newer checkpoints skipped as damaged when resuming, with why (rank 0's report).
    #[serde(default)]
    pub skipped_checkpoints: Vec<String>,
    /// Rank 0's measured timeline as Chrome trace events.
    #[serde(skip)]
    pub trace: Vec<TraceEvent>,
    /// The final parameters (one vector per layer, forward order), to compare runs in
    /// memory; not written to JSON.
    #[serde(skip)]
    pub final_params: Vec<Vec<f32>>,
}

fn validate(cfg: &TrainConfig, data: &dyn Dataset, world: usize) -> Result<()> {
    if cfg.ranks == 0 || cfg.batch == 0 || cfg.epochs == 0 {
        return Err(Error::InvalidArgument(format!(
            "ranks ({}), batch ({}) and epochs ({}) must be positive",
            cfg.ranks, cfg.batch, cfg.epochs
        )));
    }
    if world != cfg.ranks {
        return Err(Error::InvalidArgument(format!(
            "configured for {} ranks, the communicator has {world}",
            cfg.ranks
        )));
    }
    if !(cfg.density.is_finite() && cfg.density > 0.0 && cfg.density <= 1.0) {
        return Err(Error::InvalidArgument(format!(
            "density {} outside (0, 1]",
            cfg.density
        )));
    }
    if !(cfg.lr.is_finite() && cfg.lr > 0.0 && cfg.warmup_epochs.is_finite())
        || cfg.warmup_epochs < 0.0
    {
        return Err(Error::InvalidArgument(
            "learning rate must be positive and warm-up ≥ 0".into(),
        ));
    }
    if matches!(cfg.scheme, SchemeKind::Bsp1 | SchemeKind::Bsp2)
        && cfg.optimizer != OptimizerKind::Sgd
    {
        return Err(Error::InvalidArgument(format!(
            "{}: the root alone applies BSP-SGD's update, but {} splits its step across the ranks (PTO)",
            cfg.scheme, cfg.optimizer
        )));
    }
    if cfg.profile_iters < 2 {
        return Err(Error::InvalidArgument(
            "profile_iters must be ≥ 2 (the first is warm-up)".into(),
        ));
    }
    let iters = data.iters_per_epoch(cfg.ranks, cfg.batch);
    if iters == 0 {
        return Err(Error::InvalidArgument(format!(
            "the training set of `{}` over {} ranks does not fill one batch of {}",
            data.name(),
            cfg.ranks,
            cfg.batch
        )));
    }
    if iters * cfg.epochs <= cfg.profile_iters {
        return Err(Error::InvalidArgument(format!(
            "{} iterations in all leave none after the {}-iteration profile",
            iters * cfg.epochs,
            cfg.profile_iters
        )));
    }
    let ck = &cfg.checkpoint;
    if ck.dir.is_none() && (ck.resume || ck.every > 0) {
        return Err(Error::InvalidArgument(
            "checkpoints (every, resume) need a checkpoint directory".into(),
        ));
    }
    match cfg.stop_after_steps {
        Some(0) => Err(Error::InvalidArgument("stop after 0 steps".into())),
        Some(s) if ck.dir.is_some() && s < cfg.profile_iters => {
            Err(Error::InvalidArgument(format!(
                "a checkpoint at step {s} would fall in the {}-step profile; stop at {} or later",
                cfg.profile_iters, cfg.profile_iters
            )))
        }
        _ => Ok(()),
    }
}

/// FNV-1a over the bit patterns of every value.
fn hash_params(values: &[Vec<f32>]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in values {
        for x in v {
            h = (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3);
        }
        h = (h ^ v.len() as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Checks that every rank holds the same parameters after step `step`, by their
/// [`hash_params`] (see [`agree_u64`]).
fn agree_params(comm: &dyn Communicator, hash: u64, step: usize) -> Result<()> {
    agree_u64(comm, hash, &format!("the parameters after step {step}"))
}

/// All-gathers `value`; any rank whose value differs is [`Error::RankMismatch`] on every
/// rank (every rank sees every value).
fn agree_u64(comm: &dyn Communicator, value: u64, what: &str) -> Result<()> {
    let mut all = vec![0u64; comm.size()];
    dense::allgather(
        comm,
        &[value],
        &mut all,
        AllgatherAlgo::Bruck,
        &DenseOptions::default(),
    )?;
    if let Some(peer) = all.iter().position(|&v| v != all[0]) {
        // Every rank sees the mismatch. Leave only once every rank has finished the
        // all-gather (a fail-fast transport would otherwise end a slower peer's receive
        // with `PeerFailed`); the barrier's own outcome changes nothing about the answer.
        let _ = comm.barrier();
        return Err(Error::RankMismatch {
            rank: comm.rank(),
            peer,
            what: what.into(),
        });
    }
    Ok(())
}

/// What every rank must agree on: the configuration (transport aside) and the layers.
fn config_fingerprint(cfg: &TrainConfig, layers: &[(String, Vec<usize>)]) -> u64 {
    let text = format!(
        "{:?}|{:?}|{:?}|{}|{:?}|{}|{}|{}|{}|{}|{}|{}|{:?}|{}|{}|{}|{:?}|{}|{:?}|{:?}",
        cfg.scheme,
        cfg.planner,
        cfg.groups,
        cfg.model,
        cfg.lstm,
        cfg.ranks,
        cfg.density,
        cfg.epochs,
        cfg.batch,
        cfg.lr,
        cfg.momentum,
        cfg.weight_decay,
        cfg.optimizer,
        cfg.profile_iters,
        cfg.switch_epochs,
        cfg.seed,
        layers,
        cfg.warmup_epochs,
        cfg.lr_schedule,
        cfg.dense_choice
    );
    let bytes: Vec<Vec<f32>> = vec![text.bytes().map(f32::from).collect()];
    hash_params(&bytes)
}

/// Per-rank result.
struct RankOut {
    report: TrainReport,
}

/// One iteration's BSP-SGD weight broadcast: forward time spent waiting for parameters
/// and the stages' broadcast spans.
#[derive(Debug, Clone, Copy, Default)]
struct BspTimes {
    wait_s: f64,
    bcast_s: f64,
}

impl BspTimes {
    /// Counts one stage's [`ParamBroadcast::wait`] result and installs its values.
    fn add(
        &mut self,
        (values, span, waited): (Vec<f32>, crate::timeline::Span, f64),
        install: impl FnOnce(&[f32]) -> Result<()>,
    ) -> Result<()> {
        self.wait_s += waited;
        self.bcast_s += span.len();
        install(&values)
    }
}

/// The layers of each stage (forward order, contiguous).
fn stage_layer_ranges(model: &dyn Staged) -> Vec<std::ops::Range<usize>> {
    let mut start = 0;
    (0..model.num_stages())
        .map(|s| {
            let r = start..start + model.stage_params(s).len();
            start = r.end;
            r
        })
        .collect()
}

/// Each stage's weights concatenated, for the broadcast.
fn stage_values(weights: &[Vec<f32>], stages: &[std::ops::Range<usize>]) -> Vec<Vec<f32>> {
    stages.iter().map(|r| weights[r.clone()].concat()).collect()
}

/// Writes a stage's broadcast values into the host weights and the model's variables.
fn install_stage(
    model: &dyn Staged,
    stage: usize,
    values: &[f32],
    weights: &mut [Vec<f32>],
    stages: &[std::ops::Range<usize>],
) -> Result<()> {
    let mut off = 0;
    for (l, (name, var)) in stages[stage].clone().zip(model.stage_params(stage)) {
        let n = weights[l].len();
        let chunk = values.get(off..off + n).ok_or(Error::GradientLength {
            layer: l,
            got: values.len(),
            expected: off + n,
        })?;
        weights[l].copy_from_slice(chunk);
        let dims = var.as_tensor().dims().to_vec();
        var.set(&candle_core::Tensor::from_slice(
            chunk,
            dims.as_slice(),
            &model.device(),
        )?)
        .map_err(|e| Error::Model(format!("setting `{name}`: {e}")))?;
        off += n;
    }
    Ok(())
}

/// Waits for the rest of the broadcast in flight and installs it.
fn drain(
    b: &mut ParamBroadcast,
    model: &dyn Staged,
    weights: &mut [Vec<f32>],
    stages: &[std::ops::Range<usize>],
    times: &mut BspTimes,
) -> Result<()> {
    while let Some(s) = b.next_stage() {
        times.add(b.wait(s)?, |v| install_stage(model, s, v, weights, stages))?;
    }
    Ok(())
}

struct Accum {
    sum: Breakdown,
}

impl Accum {
    fn add(&mut self, t: &Timeline, opt_s: f64, bsp: &BspTimes) {
        let s = &mut self.sum;
        s.param_wait_s += bsp.wait_s;
        s.param_bcast_s += bsp.bcast_s;
        s.forward_s += t.forward.len();
        s.backward_s += t.backward.iter().map(|b| b.len()).sum::<f64>();
        s.selection_s += t.total_sparsify_s();
        s.comm_s += t.total_comm_s();
        s.non_overlapped_comm_s += t.non_overlapped_comm_s;
        s.iteration_s += t.iteration_s;
        s.optimizer_s += opt_s;
        s.samples += 1;
    }
    fn mean(&self, predicted: &Timeline) -> Breakdown {
        let n = self.sum.samples.max(1) as f64;
        let s = &self.sum;
        Breakdown {
            forward_s: s.forward_s / n,
            backward_s: s.backward_s / n,
            selection_s: s.selection_s / n,
            comm_s: s.comm_s / n,
            non_overlapped_comm_s: s.non_overlapped_comm_s / n,
            iteration_s: s.iteration_s / n,
            optimizer_s: s.optimizer_s / n,
            param_wait_s: s.param_wait_s / n,
            param_bcast_s: s.param_bcast_s / n,
            predicted_iteration_s: predicted.iteration_s,
            predicted_non_overlapped_s: predicted.non_overlapped_comm_s,
            samples: s.samples,
        }
    }
}

/// Trains on one rank of `comm` (threads, `SimComm` or `MpiComm`): the whole job of one
/// rank. Rank 0's report holds the epochs; every rank returns the same plan, bytes and
/// agreement results. `topology` is the emulated network when `comm` is a `SimComm` (its
/// link prices the plan).
pub fn run_rank<C: Communicator + 'static>(
    comm: C,
    cfg: &TrainConfig,
    data: &dyn Dataset,
    topology: Option<&Topology>,
    progress: Option<&(dyn Fn(TrainEvent) + Sync)>,
) -> Result<TrainReport> {
    validate(cfg, data, comm.size())?;
    let rank = comm.rank();
    let p = comm.size();
    let backend = comm.backend();
    let model = data.build_model(cfg.model, cfg.lstm, cfg.seed)?;
    let layers = staged::layers(&*model);
    let sizes = staged::layer_sizes(&*model);
    let l_count = sizes.len();
    // A second communicator for the optimizer and the agreement checks: the reducer's
    // moves into its communication thread.
    let ctrl = comm.split(0, rank as u32)?;
    let fingerprint = config_fingerprint(cfg, &layers);
    agree_u64(&*ctrl, fingerprint, "the model or the configuration")?;
    let mut weights = staged::get_params(&*model)?;
    agree_u64(&*ctrl, hash_params(&weights), "the initial parameters")?;
    let named: Vec<(String, usize)> = layers
        .iter()
        .zip(&sizes)
        .map(|((n, _), &k)| (n.clone(), k))
        .collect();
    let mut opt = optimizer::build(
        cfg.optimizer,
        &*ctrl,
        &named,
        cfg.momentum,
        cfg.weight_decay,
    )?;
    let mut pending_check: Option<usize> = None;
    let loader = data.loader(p, rank, cfg.batch, cfg.seed)?;
    let iters = data.iters_per_epoch(p, cfg.batch);
    // Targets per batch (samples, or streams × bptt tokens), for the training accuracy.
    let mut targets = cfg.batch;
    // The library's collectives and the shared segment stay available to the automatic
    // choice, counted as the bytes the ring would move.
    let counting = collectives::Metered::metered_with_collectives(comm);
    let meter = counting.tap().clone();
    // BSP-SGD's weight broadcast, on its own communicator and thread (metered with the
    // reducer's: a split shares the meter).
    let stage_layers = stage_layer_ranges(&*model);
    let mut bcast = match cfg.scheme.bsp_update() {
        Some(_) => {
            let link = topology.map(|t| t.inter);
            let stage_sizes: Vec<usize> = stage_layers
                .iter()
                .map(|r| sizes[r.clone()].iter().sum())
                .collect();
            let blocks = stage_sizes
                .iter()
                .map(|&n| reduction::lp_block(cost_model::Collective::Broadcast, n.max(1), p, link))
                .collect();
            Some(ParamBroadcast::new(
                counting.split(1, rank as u32)?,
                stage_sizes,
                blocks,
                Instant::now(),
            )?)
        }
        None => None,
    };
    let mut phase = Phase::Profile(Vec::new());
    let mut predicted: Option<Timeline> = None;
    let mut profile_bw = Vec::new();
    let mut accum = Accum {
        sum: Breakdown::default(),
    };
    let mut trace_events = Vec::new();
    let mut saved = Replicated::default();
    let mut resumed_loader = None;
    let mut bytes_before = 0u64;
    let mut resumed_from = None;
    let mut skipped_checkpoints = Vec::new();
    let (mut reducer, mut current) = match &cfg.checkpoint.dir {
        Some(dir) if cfg.checkpoint.resume => {
            let r = checkpoint::load(&*ctrl, dir, fingerprint)?;
            let local = resume_rank(counting, cfg, &*model, &mut *opt, &r, &sizes, topology);
            let (reducer, pred, in_use) = checkpoint::agree_ok(&*ctrl, local)?;
            weights = r.replicated.weights.clone();
            predicted = Some(pred);
            phase = Phase::Planned(());
            profile_bw = r.replicated.profile_bw.clone();
            resumed_loader = Some(r.mine.loader);
            bytes_before = r.mine.bytes_sent;
            resumed_from = Some(r.path);
            skipped_checkpoints = r.skipped;
            saved = r.replicated;
            (reducer, in_use)
        }
        // Profiling phase: dense, one group.
        _ => (
            Reducer::new(
                counting,
                &sizes,
                MergePlan::single(l_count),
                &*reduction::profiling_scheme(),
            )?,
            InUse {
                plan: MergePlan::single(l_count),
                planner: "profile".into(),
                epoch: 0,
            },
        ),
    };
    let first_step = saved.step as usize;
    let mut step = first_step;
    let mut epochs = std::mem::take(&mut saved.epochs);
    let mut checked = saved.checked as usize;
    let mut train_time = saved.train_time_s;
    let mut step_hashes = Vec::new();
    let mut last_checkpoint = None;
    let mut stopped = false;
    let warmup_iters = cfg.warmup_epochs * iters as f64;
    let mut since_rebuild = 0usize;
    let t_run = Instant::now();
    // This rank's warm-started selections and misses, over every reducer of the run.
    let mut warm = None;
    let start_epoch = saved.epoch as usize;
    for epoch in start_epoch..cfg.epochs {
        let resuming = epoch == start_epoch && resumed_loader.is_some();
        let first_it = if resuming { saved.iter as usize } else { 0 };
        // The MLSys 2021 §5.6 switch: sparse for the first epochs, then dense.
        if first_it == 0 && matches!(phase, Phase::Planned(_)) && reduction::switches_at(cfg, epoch)
        {
            warm = add_warm_starts(warm, reducer.warm_starts());
            let (r, t, in_use) = rebuild(
                reducer,
                cfg,
                epoch,
                &sizes,
                profile_for(&*model, &profile_bw)?,
                topology,
                &predicted,
            )?;
            (reducer, predicted, current, since_rebuild) = (r, Some(t), in_use, 0);
        }
        // Truncated BPTT: every epoch's streams start from a zero state (a resumed epoch
        // continues from the checkpoint's).
        if first_it == 0 {
            model.reset_state(true)?;
        }
        let t_epoch = Instant::now();
        let (mut loss_sum, mut right) = if resuming {
            (saved.loss_sum as f32, saved.right as usize)
        } else {
            (0.0f32, 0usize)
        };
        let mut batches = match resumed_loader.take() {
            Some(state) if resuming && first_it < iters => {
                if state.epoch != epoch as u64 || state.position != first_it * cfg.batch {
                    return Err(checkpoint::CheckpointError::State(format!(
                        "rank {rank}: loader at epoch {} sample {}, the step at epoch {epoch} \
                         iteration {first_it}",
                        state.epoch, state.position
                    ))
                    .into());
                }
                loader.resume(&state)?
            }
            _ => loader.epoch(epoch as u64),
        };
        for it in first_it..iters {
            let (x, y) = batches.next().ok_or_else(|| {
                Error::Data(format!("rank {rank}: epoch {epoch} ran out of batches"))
            })??;
            targets = y.elem_count();
            let t_start = t_run.elapsed().as_secs_f64();
            // BSP-SGD's root update applies once the plan (and its LP reduce) is in place.
            let rooted = matches!(phase, Phase::Planned(()));
            reducer.begin()?;
            // BSP-SGD Algorithm 1: each stage's forward waits for its own parameters only.
            let mut bsp_times = BspTimes::default();
            let fwd = match bcast.as_mut().filter(|b| b.in_flight()) {
                Some(b) => staged::forward_train_with(&*model, &x, &mut |s| {
                    bsp_times.add(b.wait(s)?, |v| {
                        install_stage(&*model, s, v, &mut weights, &stage_layers)
                    })
                })?,
                None => staged::forward_train(&*model, &x)?,
            };
            if let Some(k) = pending_check.take() {
                agree_params(&*ctrl, hash_params(&weights), k)?;
                checked += 1;
            }
            let loss = model.loss(fwd.logits(), &y)?;
            reducer.forward_done()?;
            staged::backward_staged(&*model, &fwd, &loss, &mut |l, g| reducer.ready(l, g))?;
            let grads = reducer.finish()?;
            loss_sum += loss.to_scalar::<f32>()?;
            right += staged::correct(fwd.logits(), &y)?;
            let t_opt = Instant::now();
            let lr = learning_rate(cfg, step, iters * cfg.epochs, warmup_iters);
            step += 1;
            since_rebuild += 1;
            match (cfg.scheme.bsp_update(), &mut bcast, rooted) {
                (Some(update), Some(b), true) if update != BspUpdate::ReplicatedSync => {
                    // Algorithms 1 and 2: the root alone updates, then broadcasts.
                    if rank == 0 {
                        opt.step(&*ctrl, &mut weights, &grads, lr)?;
                        staged::set_params(&*model, &weights)?;
                    }
                    b.launch(stage_values(&weights, &stage_layers))?;
                    if update == BspUpdate::RootBlocking {
                        drain(b, &*model, &mut weights, &stage_layers, &mut bsp_times)?;
                    }
                }
                (Some(BspUpdate::ReplicatedSync), Some(b), true) => {
                    // Algorithm 3: every rank updates; the root's weights every 5 steps.
                    opt.step(&*ctrl, &mut weights, &grads, lr)?;
                    staged::set_params(&*model, &weights)?;
                    if step % crate::bsp::BSP3_SYNC_EVERY == 0 {
                        b.launch(stage_values(&weights, &stage_layers))?;
                        drain(b, &*model, &mut weights, &stage_layers, &mut bsp_times)?;
                    }
                }
                _ => {
                    opt.step(&*ctrl, &mut weights, &grads, lr)?;
                    staged::set_params(&*model, &weights)?;
                }
            }
            let opt_s = t_opt.elapsed().as_secs_f64();
            // Under Algorithm 1 other ranks have this step's weights only once the next
            // forward has received them: their check waits until then.
            let in_flight = bcast.as_ref().is_some_and(|b| b.in_flight());
            let hash = hash_params(&weights);
            step_hashes.push(hash);
            if cfg.check_params {
                if in_flight {
                    pending_check = Some(step);
                } else {
                    agree_params(&*ctrl, hash, step)?;
                    checked += 1;
                }
            }
            let tl = reducer
                .last_timeline()
                .cloned()
                .ok_or_else(|| Error::CommThread("no timeline recorded".into()))?;
            if rank == 0 && trace_events.len() < cfg.trace_iters * (l_count + 8) {
                trace_events.extend(trace::iteration_events(rank, step, t_start, &tl, opt_s));
            }
            match &mut phase {
                Phase::Profile(samples) => {
                    samples.push(tl);
                    if samples.len() == cfg.profile_iters {
                        let samples = std::mem::take(samples);
                        profile_bw = shared_backward_times(&*ctrl, &samples)?;
                        let profile = profile_for(&*model, &profile_bw)?;
                        warm = add_warm_starts(warm, reducer.warm_starts());
                        let (r, t, in_use) =
                            rebuild(reducer, cfg, epoch, &sizes, profile, topology, &None)?;
                        (reducer, predicted, current, since_rebuild) = (r, Some(t), in_use, 0);
                        phase = Phase::Planned(());
                    }
                }
                Phase::Planned(()) => {
                    if since_rebuild > 1 {
                        accum.add(&tl, opt_s, &bsp_times);
                    }
                }
            }
            if rank == 0 {
                if let Some(f) = progress {
                    f(TrainEvent::Iteration {
                        epoch: epoch + 1,
                        iter: it + 1,
                        of: iters,
                    });
                }
            }
            let stop = cfg.stop_after_steps == Some(step);
            let every = cfg.checkpoint.every;
            if let (Some(dir), Phase::Planned(())) = (&cfg.checkpoint.dir, &phase) {
                if stop || (every > 0 && step % every == 0) {
                    if let Some(b) = bcast.as_mut().filter(|b| b.in_flight()) {
                        drain(
                            b,
                            &*model,
                            &mut weights,
                            &stage_layers,
                            &mut BspTimes::default(),
                        )?;
                    }
                    let replicated = Replicated {
                        step: step as u64,
                        epoch: epoch as u64,
                        iter: (it + 1) as u64,
                        reducer_epoch: current.epoch as u64,
                        plan_starts: current.plan.starts().iter().map(|&s| s as u64).collect(),
                        planner: current.planner.clone(),
                        profile_bw: profile_bw.clone(),
                        weights: weights.clone(),
                        optimizer: opt.save_state(),
                        epochs: epochs.clone(),
                        train_time_s: train_time + t_epoch.elapsed().as_secs_f64(),
                        loss_sum: f64::from(loss_sum),
                        right: right as u64,
                        checked: checked as u64,
                    };
                    let mine = reducer.save_state().and_then(|state| {
                        Ok(RankPart {
                            loader: batches.state(),
                            reducer: state,
                            buffers: staged::get_buffers(&*model)?,
                            carried: staged::get_carried(&*model)?,
                            bytes_sent: bytes_before + meter.counts().bytes_sent,
                        })
                    });
                    let mine = checkpoint::agree_ok(&*ctrl, mine)?;
                    let header = Header {
                        ranks: p,
                        fingerprint,
                        step: step as u64,
                    };
                    last_checkpoint =
                        Some(checkpoint::save(&*ctrl, dir, header, &replicated, &mine)?);
                }
            }
            if stop {
                stopped = true;
                break;
            }
        }
        drop(batches);
        train_time += t_epoch.elapsed().as_secs_f64();
        if stopped {
            break;
        }
        if rank == 0 {
            let eval = data.evaluate(&*model)?;
            let valid = data.validation(&*model)?;
            let stats = EpochStats {
                epoch: epoch + 1,
                loss: loss_sum / iters as f32,
                train_acc: 100.0 * right as f64 / (iters * targets) as f64,
                test_acc: eval.accuracy,
                test_loss: eval.loss,
                test_ppl: eval.perplexity,
                valid_loss: valid.map(|v| v.loss),
                valid_ppl: valid.and_then(|v| v.perplexity),
                elapsed_s: train_time,
            };
            if let Some(f) = progress {
                f(TrainEvent::Epoch(stats));
            }
            epochs.push(stats);
        }
    }
    warm = add_warm_starts(warm, reducer.warm_starts());
    drop(reducer.shutdown()?);
    if let Some(mut b) = bcast {
        if b.in_flight() {
            drain(
                &mut b,
                &*model,
                &mut weights,
                &stage_layers,
                &mut BspTimes::default(),
            )?;
        }
        b.shutdown()?;
    }
    if let Some(k) = pending_check.take() {
        agree_params(&*ctrl, hash_params(&weights), k)?;
        checked += 1;
    }
    // Bytes per rank, averaged over ranks.
    let mine = (bytes_before + meter.counts().bytes_sent) as f64;
    let mut all = vec![0.0f64; p];
    dense::allgather(
        &*ctrl,
        &[mine],
        &mut all,
        AllgatherAlgo::Bruck,
        &DenseOptions::default(),
    )?;
    let predicted = predicted.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{} iterations do not finish the {}-iteration profile",
            iters * cfg.epochs,
            cfg.profile_iters
        ))
    })?;
    Ok(TrainReport {
        scheme: cfg.scheme.to_string(),
        planner: current.planner,
        model: model.name(),
        data: data.name(),
        optimizer: opt.name(),
        backend,
        ranks: p,
        density: cfg.density,
        groups: current.plan.groups(),
        profile_backward_s: profile_bw,
        test_acc: epochs.last().map(|e| e.test_acc).unwrap_or(0.0),
        test_ppl: epochs.last().and_then(|e| e.test_ppl),
        epochs,
        time_s: train_time,
        bytes_per_rank: all.iter().sum::<f64>() / p as f64,
        breakdown: accum.mean(&match (cfg.scheme, topology) {
            // Algorithm 1's forward waits for the weights' broadcast, which the profile
            // (taken before the root updates) does not contain.
            (SchemeKind::Bsp1, Some(topo)) => {
                let stage_sizes: Vec<usize> = stage_layers
                    .iter()
                    .map(|r| sizes[r.clone()].iter().sum())
                    .collect();
                crate::bsp::predict_with_broadcast(&predicted, &stage_sizes, topo.inter, p)
            }
            _ => predicted,
        }),
        params_checked_steps: checked,
        warm_starts: warm,
        final_param_hash: hash_params(&weights),
        final_params: weights,
        first_step,
        steps: step,
        step_param_hashes: step_hashes,
        last_checkpoint,
        resumed_from,
        skipped_checkpoints,
        trace: trace_events,
    })
}

/// This rank's side of a resume: the replicated state (weights, optimizer) into the model
/// and optimizer, this rank's batch-norm statistics and carried state (its streams' LSTM
/// state) into the model, and the reducer of the saved plan and epoch with this rank's
/// residuals and sparse-algorithm state. Local; the caller agrees on the outcome.
fn resume_rank<C: Communicator + 'static>(
    comm: C,
    cfg: &TrainConfig,
    model: &dyn Staged,
    opt: &mut dyn optimizer::Optimizer,
    r: &checkpoint::Restored,
    sizes: &[usize],
    topology: Option<&Topology>,
) -> Result<Rebuilt<C>> {
    let s = &r.replicated;
    staged::set_params(model, &s.weights)?;
    staged::set_buffers(model, &r.mine.buffers)?;
    staged::set_carried(model, &r.mine.carried)?;
    opt.restore_state(&s.optimizer)?;
    let starts = s.plan_starts.iter().map(|&x| x as usize).collect();
    let plan = MergePlan::from_starts(sizes.len(), starts)?;
    let profile = profile_for(model, &s.profile_bw)?;
    let (mut reducer, predicted, in_use) = build_reducer(
        comm,
        cfg,
        s.reducer_epoch as usize,
        sizes,
        profile,
        topology,
        Some(plan),
    )?;
    reducer.restore_state(&r.mine.reducer)?;
    let planner = s.planner.clone();
    Ok((reducer, predicted, InUse { planner, ..in_use }))
}

enum Phase {
    Profile(Vec<Timeline>),
    Planned(()),
}

/// The per-layer backward times and the forward time that the slowest rank imposes
/// ([`slowest_rank_times`], first profiled iteration skipped as warm-up), from every rank's
/// measurements: all-gathered, so every rank computes the same profile and plans the same.
pub(crate) fn shared_backward_times(
    ctrl: &dyn Communicator,
    samples: &[Timeline],
) -> Result<Vec<f64>> {
    // Per iteration: forward, then the per-layer backward times.
    let mine: Vec<f64> = samples
        .iter()
        .flat_map(|t| std::iter::once(t.forward.len()).chain(t.backward.iter().map(|s| s.len())))
        .collect();
    let mut all = vec![0.0f64; mine.len() * ctrl.size()];
    dense::allgather(
        ctrl,
        &mine,
        &mut all,
        AllgatherAlgo::Ring,
        &DenseOptions::default(),
    )?;
    let per_iter = mine.len() / samples.len().max(1);
    let ranks: Vec<Vec<RankSample>> = all
        .chunks(mine.len().max(1))
        .map(|rank| {
            rank.chunks(per_iter.max(1))
                .map(|it| RankSample {
                    forward_s: it[0],
                    backward_s: it[1..].to_vec(),
                })
                .collect()
        })
        .collect();
    let (fwd, mut bw) = slowest_rank_times(&ranks, 1)?;
    bw.push(fwd);
    Ok(bw)
}

/// The profile from measured backward times (`times` = per-layer times then forward).
pub(crate) fn profile_for(model: &dyn Staged, times: &[f64]) -> Result<LayerProfile> {
    let sizes = staged::layer_sizes(model);
    let Some((&fwd, bw)) = times.split_last() else {
        return Err(Error::InvalidArgument("no profile yet".into()));
    };
    LayerProfile::from_sizes(model.name(), &sizes)?.with_backward_times(fwd, bw)
}

/// Rank 0's plan on every rank: the costs include times measured on each rank (the top-k
/// fit), so plans computed locally could differ, and ranks must merge alike.
pub(crate) fn shared_plan(comm: &dyn Communicator, plan: &MergePlan) -> Result<MergePlan> {
    let l = plan.num_layers();
    let mut starts = vec![u64::MAX; l];
    for (i, &s) in plan.starts().iter().enumerate() {
        starts[i] = s as u64;
    }
    dense::broadcast(
        comm,
        &mut starts,
        0,
        BroadcastAlgo::Binomial,
        &DenseOptions::default(),
    )?;
    let starts: Vec<usize> = starts
        .into_iter()
        .take_while(|&s| s != u64::MAX)
        .map(|s| s as usize)
        .collect();
    MergePlan::from_starts(l, starts)
}

/// The merge in use: its plan, the planner's name, and the epoch its scheme was built for
/// (the §5.6 switch changes the scheme).
struct InUse {
    plan: MergePlan,
    planner: String,
    epoch: usize,
}

/// A reducer, its predicted timeline, and its merge.
type Rebuilt<C> = (Reducer<C>, Timeline, InUse);

/// Shuts `reducer` down and builds the reducer of `cfg`'s scheme at `epoch` with its plan.
fn rebuild<C: Communicator + 'static>(
    reducer: Reducer<C>,
    cfg: &TrainConfig,
    epoch: usize,
    sizes: &[usize],
    profile: LayerProfile,
    topology: Option<&Topology>,
    _previous: &Option<Timeline>,
) -> Result<Rebuilt<C>> {
    let comm = reducer.shutdown()?;
    build_reducer(comm, cfg, epoch, sizes, profile, topology, None)
}

/// The reducer of `cfg`'s scheme at `epoch` over `comm`, with `fixed` as its plan (a
/// resumed run's) or else the given groups or the planner's plan, and its prediction.
fn build_reducer<C: Communicator + 'static>(
    comm: C,
    cfg: &TrainConfig,
    epoch: usize,
    sizes: &[usize],
    profile: LayerProfile,
    topology: Option<&Topology>,
    fixed: Option<MergePlan>,
) -> Result<Rebuilt<C>> {
    let (scheme, planner, costs) = reduction::for_epoch(cfg, epoch, comm.size(), sizes, topology)?;
    let plan = match (fixed, &cfg.groups) {
        (Some(plan), _) => plan,
        (None, Some(g)) => MergePlan::from_groups(sizes.len(), g).map_err(|e| {
            Error::InvalidPlan(format!(
                "the plan does not fit the model's {} layers: {e}",
                sizes.len()
            ))
        })?,
        (None, None) => shared_plan(&comm, &planner.plan(&profile, &&*costs)?)?,
    };
    reduction::check_density(cfg, epoch, &plan, sizes)?;
    let predicted = predict(&profile, &plan, &&*costs)?;
    let r = Reducer::new(comm, sizes, plan.clone(), &*scheme)?;
    let planner = if cfg.groups.is_some() {
        "given".to_string()
    } else {
        planner.to_string()
    };
    Ok((
        r,
        predicted,
        InUse {
            plan,
            planner,
            epoch,
        },
    ))
}

/// Trains with `cfg.ranks` thread ranks (over `SimComm` for [`Transport::Sim`]); rank 0's
/// report, with the trace.
pub fn train(
    cfg: &TrainConfig,
    data: &dyn Dataset,
    progress: Option<&(dyn Fn(TrainEvent) + Sync)>,
) -> Result<TrainReport> {
    validate(cfg, data, cfg.ranks)?;
    let outs = ThreadComm::run_with(cfg.ranks, ThreadConfig::default(), |comm| {
        match cfg.transport {
            Transport::Thread => run_rank(comm, cfg, data, None, progress),
            Transport::Sim(topo, mode) => {
                let sim = SimComm::new(comm, topo, mode)?;
                run_rank(sim, cfg, data, Some(&topo), progress)
            }
        }
        .map(|report| RankOut { report })
    });
    crate::error::rank0(outs).map(|o| o.report)
}

/// The rank-0 numbers the bench's `train` suite records.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SuiteResult {
    /// Final test accuracy, %.
    pub test_acc: f64,
    /// Training wall time, seconds.
    pub time_s: f64,
    /// Payload bytes sent per rank.
    pub bytes_per_rank: f64,
    /// Mean measured iteration time, seconds.
    pub iteration_s: f64,
    /// Its prediction, seconds.
    pub predicted_s: f64,
}

/// For the bench's `train` suite: ResNet-20 on the shipped digits with `scheme` on `ranks`
/// thread ranks for `epochs` at density 0.01.
pub fn train_suite(scheme: SchemeKind, ranks: usize, epochs: usize) -> Result<SuiteResult> {
    let data = ImageData::digits(&crate::data::digits_dir(), &Default::default())?;
    let cfg = TrainConfig {
        scheme,
        ranks,
        epochs,
        ..TrainConfig::default()
    };
    let r = train(&cfg, &data, None)?;
    Ok(SuiteResult {
        test_acc: r.test_acc,
        time_s: r.time_s,
        bytes_per_rank: r.bytes_per_rank,
        iteration_s: r.breakdown.iteration_s,
        predicted_s: r.breakdown.predicted_iteration_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{digits_dir, CacheOptions};

    fn digits() -> ImageData {
        ImageData::digits(&digits_dir(), &CacheOptions::default()).unwrap()
    }

    #[test]
    fn a_short_run_learns_and_keeps_ranks_identical() {
        let data = digits();
        let cfg = TrainConfig {
            scheme: SchemeKind::Omgs,
            ranks: 2,
            epochs: 1,
            batch: 64,
            density: 0.05,
            check_params: true,
            profile_iters: 2,
            ..TrainConfig::default()
        };
        let r = train(&cfg, &data, None).unwrap();
        assert_eq!(r.epochs.len(), 1);
        assert_eq!(r.params_checked_steps, 1437 / 2 / 64);
        assert!(r.test_acc > 20.0, "{}", r.test_acc);
        assert!(r.bytes_per_rank > 0.0);
        assert!(r.breakdown.samples > 0);
        assert!(!r.trace.is_empty());
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let data = digits();
        let base = TrainConfig {
            ranks: 2,
            epochs: 1,
            batch: 64,
            ..TrainConfig::default()
        };
        for cfg in [
            TrainConfig {
                ranks: 0,
                ..base.clone()
            },
            TrainConfig {
                density: 0.0,
                ..base.clone()
            },
            TrainConfig {
                density: 1.5,
                ..base.clone()
            },
            TrainConfig {
                batch: 5000,
                ..base.clone()
            },
        ] {
            assert!(
                matches!(train(&cfg, &data, None), Err(Error::InvalidArgument(_))),
                "{cfg:?}"
            );
        }
        let cfg = TrainConfig {
            groups: Some(vec![vec![0, 1]]),
            ..base.clone()
        };
        assert!(matches!(
            train(&cfg, &data, None),
            Err(Error::InvalidPlan(_))
        ));
        // A density that selects nothing from a group of a collective algorithm.
        let cfg = TrainConfig {
            scheme: SchemeKind::Spardl,
            density: 1e-7,
            ..base.clone()
        };
        assert!(matches!(
            train(&cfg, &data, None),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn the_learning_rate_warms_up_then_decays_to_zero() {
        let cfg = TrainConfig {
            lr: 0.1,
            ..TrainConfig::default()
        };
        let total = 100;
        let lrs: Vec<f32> = (0..total)
            .map(|s| learning_rate(&cfg, s, total, 10.0))
            .collect();
        assert!((lrs[0] - 0.01).abs() < 1e-6, "{}", lrs[0]);
        assert!((lrs[9] - 0.1).abs() < 1e-6, "{}", lrs[9]);
        assert!(lrs[9..].windows(2).all(|w| w[1] <= w[0]), "{lrs:?}");
        assert!(lrs[total - 1].abs() < 1e-6, "{}", lrs[total - 1]);
        let constant = TrainConfig {
            lr_schedule: LrSchedule::Constant,
            ..cfg
        };
        assert_eq!(learning_rate(&constant, total - 1, total, 10.0), 0.1);
        assert_eq!(learning_rate(&constant, 0, total, 0.0), 0.1);
    }

    #[test]
    fn the_parameter_check_fails_on_every_rank_when_one_bit_differs() {
        let base = vec![vec![0.5f32, -1.25, 3.0], vec![7.0]];
        let mut flipped = base.clone();
        flipped[0][1] = f32::from_bits(flipped[0][1].to_bits() ^ 1);
        assert_ne!(hash_params(&base), hash_params(&flipped));
        // The same values split differently are different parameters.
        assert_ne!(
            hash_params(&base),
            hash_params(&[vec![0.5, -1.25], vec![3.0, 7.0]])
        );
        let res = ThreadComm::run_all(3, ThreadConfig::default(), |comm| {
            let w = if comm.rank() == 2 { &flipped } else { &base };
            agree_u64(&comm, hash_params(w), "the parameters after step 1")
        })
        .unwrap();
        for r in &res {
            assert!(
                matches!(r, Err(Error::RankMismatch { peer: 2, .. })),
                "{r:?}"
            );
        }
        let same = ThreadComm::run_all(3, ThreadConfig::default(), |comm| {
            agree_u64(&comm, hash_params(&base), "the parameters after step 1")
        })
        .unwrap();
        assert!(same.iter().all(|r| r.is_ok()));
    }

    #[test]
    fn a_rank_with_another_configuration_is_reported_on_every_rank() {
        let data = digits();
        let res = ThreadComm::run_all(
            2,
            ThreadConfig::with_timeout(std::time::Duration::from_secs(5)),
            |comm| {
                let cfg = TrainConfig {
                    ranks: 2,
                    epochs: 1,
                    batch: 64,
                    lr: if comm.rank() == 1 { 0.2 } else { 0.1 },
                    ..TrainConfig::default()
                };
                run_rank(comm, &cfg, &data, None, None)
            },
        )
        .unwrap();
        for r in res {
            assert!(matches!(r, Err(Error::RankMismatch { .. })), "{r:?}");
        }
    }
}
