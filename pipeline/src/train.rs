//! Data-parallel training of the built-in models with any scheme (BSP-SGD, paper 004
//! Algorithms 1-3; OMGS-SGD, paper 000 Algorithm 2): every rank runs forward and a
//! layer-wise backward whose hooks feed a [`Reducer`]; the averaged gradients drive SGD
//! with momentum and weight decay, linear LR warm-up and optional density warm-up.
//!
//! Schemes: `dense` (ring all-reduce, MG-WFBP merge), `topk` (TopK-SGD, one group),
//! `lags` (layer-wise), `mgs` (threshold 8192), `omgs` (the optimal plan), and the
//! `collectives` sparse all-reduces `spardl`, `exdyna`, `hitopk` (and any other of
//! `collectives::sparse::SparseAlgo`), one group each.

use std::str::FromStr;
use std::time::Instant;

use collectives::sparse::SparseAlgo;
use collectives::{ClockMode, Communicator, SimComm, ThreadComm, ThreadConfig};
use cost_model::Topology;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::data::{synthetic, Dataset};
use crate::models::{softmax_xent, Mlp, Model, SmallCnn};
use crate::plan::{MergePlan, Planner};
use crate::profile::LayerProfile;
use crate::runtime::Reducer;
use crate::schemes::{CollectiveScheme, DenseAllreduce, Scheme, TopkAllgather};
use crate::timeline::{DenseCosts, OmgsCosts, SimpleCosts, StepCosts};
use crate::{Error, Result};

/// A training scheme (how gradients are merged, compressed and communicated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SchemeKind {
    /// Dense SGD: ring all-reduce per MG-WFBP group.
    Dense,
    /// TopK-SGD: one group, top-k with error feedback, all-gather.
    TopK,
    /// LAGS-SGD: layer-wise groups.
    Lags,
    /// MGS-SGD: threshold-merged groups (8192).
    Mgs,
    /// OMGS-SGD: the optimal plan of the timeline model.
    Omgs,
    /// A `collectives::sparse` algorithm with default options (`spardl`, `exdyna`, `hitopk`,
    /// ...; by name in JSON).
    Collective(#[serde(with = "algo_name")] SparseAlgo),
}

/// A [`SparseAlgo`] in JSON: its name (default options).
mod algo_name {
    use collectives::sparse::SparseAlgo;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(a: &SparseAlgo, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(a.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SparseAlgo, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl FromStr for SchemeKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "dense" => SchemeKind::Dense,
            "topk" => SchemeKind::TopK,
            "lags" => SchemeKind::Lags,
            "mgs" => SchemeKind::Mgs,
            "omgs" => SchemeKind::Omgs,
            other => SchemeKind::Collective(other.parse().map_err(|_| {
                let known: Vec<&str> = SparseAlgo::ALL.iter().map(|a| a.name()).collect();
                Error::InvalidArgument(format!(
                    "unknown scheme `{other}`; known: dense, topk, lags, mgs, omgs, {}",
                    known.join(", ")
                ))
            })?),
        })
    }
}

impl std::fmt::Display for SchemeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemeKind::Dense => write!(f, "dense"),
            SchemeKind::TopK => write!(f, "topk"),
            SchemeKind::Lags => write!(f, "lags"),
            SchemeKind::Mgs => write!(f, "mgs"),
            SchemeKind::Omgs => write!(f, "omgs"),
            SchemeKind::Collective(n) => write!(f, "{n}"),
        }
    }
}

impl SchemeKind {
    /// The planner this scheme uses by default.
    pub fn default_planner(&self) -> Planner {
        match self {
            SchemeKind::Dense => Planner::MgWfbp,
            SchemeKind::TopK | SchemeKind::Collective(_) => Planner::TopK,
            SchemeKind::Lags => Planner::Lags,
            SchemeKind::Mgs => Planner::Threshold(crate::plan::DEFAULT_THRESHOLD),
            SchemeKind::Omgs => Planner::Exact,
        }
    }

    /// The reduction scheme at `density`.
    pub fn scheme(&self, density: f64) -> Box<dyn Scheme> {
        match self {
            SchemeKind::Dense => Box::new(DenseAllreduce),
            SchemeKind::Collective(algo) => Box::new(CollectiveScheme {
                algo: *algo,
                density,
            }),
            _ => Box::new(TopkAllgather { density }),
        }
    }

    /// True for the dense scheme.
    pub fn is_dense(&self) -> bool {
        matches!(self, SchemeKind::Dense)
    }
}

/// Which built-in model to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModelKind {
    /// MLP `dim → 128 → 128 → classes`.
    Mlp,
    /// [`SmallCnn`] on `1 × √dim × √dim` inputs.
    Cnn,
}

impl FromStr for ModelKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mlp" => Ok(ModelKind::Mlp),
            "cnn" => Ok(ModelKind::Cnn),
            o => Err(Error::InvalidArgument(format!(
                "unknown model `{o}` (mlp or cnn)"
            ))),
        }
    }
}

impl ModelKind {
    /// A fresh model for `dim` inputs and `classes`, initialised from `seed`.
    pub fn build(&self, dim: usize, classes: usize, seed: u64) -> Result<Box<dyn Model>> {
        Ok(match self {
            ModelKind::Mlp => Box::new(Mlp::new(&[dim, 128, 128, classes], seed)?),
            ModelKind::Cnn => {
                let side = (dim as f64).sqrt().round() as usize;
                if side * side != dim {
                    return Err(Error::InvalidArgument(format!(
                        "CNN needs a square input, got {dim} features"
                    )));
                }
                Box::new(SmallCnn::new(1, side, classes, seed)?)
            }
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

/// Everything a training run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Reduction scheme.
    pub scheme: SchemeKind,
    /// Merge planner (`None`: the scheme's default).
    pub planner: Option<Planner>,
    /// Model.
    pub model: ModelKind,
    /// Ranks P.
    pub ranks: usize,
    /// Density ρ of the sparse schemes.
    pub density: f64,
    /// Epochs.
    pub epochs: usize,
    /// Samples per rank per iteration.
    pub batch: usize,
    /// Learning rate after warm-up.
    pub lr: f32,
    /// Momentum (0.9, PAPERS.md).
    pub momentum: f32,
    /// Weight decay (1e-4, PAPERS.md).
    pub weight_decay: f32,
    /// Linear LR warm-up length in epochs (fractional allowed).
    pub warmup_epochs: f64,
    /// Density warm-up: the DGC schedule 25%, 6.25%, 1.5625%, ... down to ρ, one step per epoch.
    pub density_warmup: bool,
    /// Seed for data order and initialisation.
    pub seed: u64,
    /// Transport.
    pub transport: Transport,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            scheme: SchemeKind::Omgs,
            planner: None,
            model: ModelKind::Mlp,
            ranks: 4,
            density: 0.01,
            epochs: 10,
            batch: 32,
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
            warmup_epochs: 1.0,
            density_warmup: false,
            seed: 1,
            transport: Transport::Thread,
        }
    }
}

/// One epoch's numbers (rank 0's loss and training accuracy; test accuracy of the model,
/// which is identical on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// Epoch (from 1).
    pub epoch: usize,
    /// Mean training loss.
    pub loss: f32,
    /// Training accuracy, %.
    pub train_acc: f64,
    /// Test accuracy, %.
    pub test_acc: f64,
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

/// What a run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    /// Scheme name.
    pub scheme: String,
    /// Planner used.
    pub planner: String,
    /// Model name.
    pub model: String,
    /// Ranks.
    pub ranks: usize,
    /// Density.
    pub density: f64,
    /// The plan's groups (layer indices, forward order).
    pub groups: Vec<Vec<usize>>,
    /// Per-epoch numbers.
    pub epochs: Vec<EpochStats>,
    /// Final test accuracy, %.
    pub test_acc: f64,
    /// Training wall time (evaluation excluded), seconds.
    pub time_s: f64,
    /// Payload bytes each rank sent, averaged over ranks.
    pub bytes_per_rank: f64,
    /// Mean measured iteration time of the reducer (begin → finish), seconds.
    pub mean_iteration_s: f64,
}

/// Costs used to plan for `ranks`: the OMGS 1 GbE preset where it exists (P = 2, 4, 8,
/// 16), otherwise a 1 GbE-like α-β with the preset's top-k model.
pub fn planning_costs(ranks: usize, dense: bool) -> Box<dyn StepCosts + Send + Sync> {
    if dense {
        match DenseCosts::preset(ranks.clamp(2, 16).next_power_of_two().min(16)) {
            Ok(c) => Box::new(c),
            Err(_) => Box::new(SimpleCosts {
                gamma: 0.0,
                alpha: 1e-4,
                beta: 3.2e-8,
            }),
        }
    } else {
        match OmgsCosts::preset(ranks) {
            Ok(c) => Box::new(c),
            Err(_) => Box::new(SimpleCosts {
                gamma: cost_model::presets::OMGS_TOPK_GAMMA_RHO,
                alpha: 5e-3,
                beta: 8e-8 * ranks as f64 * cost_model::presets::OMGS_DENSITY,
            }),
        }
    }
}

/// The profile (FLOP-based backward times at the paper's device speed) and the plan.
pub fn plan_for(
    cfg: &TrainConfig,
    model: &dyn Model,
) -> Result<(LayerProfile, MergePlan, Planner)> {
    let profile = model.profile(cfg.batch, crate::zoo::DEVICE_FLOPS)?;
    let planner = cfg.planner.unwrap_or_else(|| cfg.scheme.default_planner());
    let costs = planning_costs(cfg.ranks, cfg.scheme.is_dense());
    let plan = planner.plan(&profile, &&*costs)?;
    Ok((profile, plan, planner))
}

fn density_at(cfg: &TrainConfig, epoch: usize) -> f64 {
    if !cfg.density_warmup {
        return cfg.density;
    }
    // DGC warm-up: 25%, 6.25%, 1.5625%, ... then ρ.
    (0.25f64 * 0.25f64.powi(epoch as i32)).max(cfg.density)
}

fn validate(cfg: &TrainConfig, train: &dyn Dataset, test: &dyn Dataset) -> Result<()> {
    if cfg.ranks == 0 || cfg.batch == 0 || cfg.epochs == 0 {
        return Err(Error::InvalidArgument(
            "ranks, batch and epochs must be positive".into(),
        ));
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
    if train.len() / cfg.ranks < cfg.batch {
        return Err(Error::InvalidArgument(format!(
            "{} training samples over {} ranks do not fill one batch of {}",
            train.len(),
            cfg.ranks,
            cfg.batch
        )));
    }
    if test.is_empty() || train.input_dim() != test.input_dim() || train.classes() != test.classes()
    {
        return Err(Error::InvalidArgument(
            "train and test sets disagree or test is empty".into(),
        ));
    }
    Ok(())
}

/// Test accuracy, %.
pub fn evaluate(model: &mut dyn Model, data: &dyn Dataset) -> Result<f64> {
    let dim = data.input_dim();
    let mut correct = 0;
    let chunk = 256;
    let mut x = vec![0.0; chunk * dim];
    let mut y = vec![0usize; chunk];
    let mut i = 0;
    while i < data.len() {
        let b = chunk.min(data.len() - i);
        for j in 0..b {
            y[j] = data.sample(i + j, &mut x[j * dim..(j + 1) * dim])?;
        }
        let logits = model.forward(&x[..b * dim], b)?;
        correct += softmax_xent(&logits, &y[..b], model.classes())?.1;
        i += b;
    }
    Ok(100.0 * correct as f64 / data.len() as f64)
}

struct RankOut {
    epochs: Vec<EpochStats>,
    time_s: f64,
    bytes: u64,
    mean_iter_s: f64,
}

fn run_rank<C: Communicator + 'static>(
    comm: C,
    cfg: &TrainConfig,
    train: &dyn Dataset,
    test: &dyn Dataset,
    plan: &MergePlan,
    progress: Option<&(dyn Fn(TrainEvent) + Sync)>,
) -> Result<RankOut> {
    let rank = comm.rank();
    let p = comm.size();
    let counting = collectives::Metered::metered(comm);
    let meter = counting.tap().clone();
    let mut model = cfg
        .model
        .build(train.input_dim(), train.classes(), cfg.seed)?;
    let sizes = model.param_sizes();
    let scheme = cfg.scheme.scheme(cfg.density);
    let mut reducer = Reducer::new(counting, &sizes, plan.clone(), &*scheme)?;
    let mut velocity: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let shard: Vec<usize> = (rank..train.len()).step_by(p).collect();
    let iters = train.len() / p / cfg.batch;
    let dim = train.input_dim();
    let mut x = vec![0.0; cfg.batch * dim];
    let mut y = vec![0usize; cfg.batch];
    let mut epochs = Vec::new();
    let mut train_time = 0.0;
    let mut iter_sum = 0.0;
    let mut iter_count = 0usize;
    let warmup_iters = cfg.warmup_epochs * iters as f64;
    let mut step = 0usize;
    for epoch in 0..cfg.epochs {
        let t_epoch = Instant::now();
        reducer.set_density(density_at(cfg, epoch))?;
        let mut order = shard.clone();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
            cfg.seed ^ ((epoch as u64 + 1) * 0x9E37_79B9) ^ rank as u64,
        );
        order.shuffle(&mut rng);
        let (mut loss_sum, mut correct) = (0.0f32, 0usize);
        for it in 0..iters {
            for j in 0..cfg.batch {
                y[j] = train.sample(order[it * cfg.batch + j], &mut x[j * dim..(j + 1) * dim])?;
            }
            reducer.begin()?;
            let logits = model.forward(&x, cfg.batch)?;
            let (loss, c, dl) = softmax_xent(&logits, &y, model.classes())?;
            loss_sum += loss;
            correct += c;
            reducer.forward_done()?;
            model.backward(&dl, &mut |t, g| reducer.ready(t, g))?;
            let grads = reducer.finish()?;
            if let Some(t) = reducer.last_timeline() {
                iter_sum += t.iteration_s;
                iter_count += 1;
            }
            let lr = if warmup_iters > 0.0 {
                cfg.lr * ((step + 1) as f64 / warmup_iters).min(1.0) as f32
            } else {
                cfg.lr
            };
            step += 1;
            for ((w, g), v) in model.params_mut().iter_mut().zip(&grads).zip(&mut velocity) {
                for ((wi, gi), vi) in w.iter_mut().zip(g).zip(v.iter_mut()) {
                    *vi = cfg.momentum * *vi + gi + cfg.weight_decay * *wi;
                    *wi -= lr * *vi;
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
        }
        train_time += t_epoch.elapsed().as_secs_f64();
        if rank == 0 {
            let stats = EpochStats {
                epoch: epoch + 1,
                loss: loss_sum / iters.max(1) as f32,
                train_acc: 100.0 * correct as f64 / (iters * cfg.batch).max(1) as f64,
                test_acc: evaluate(&mut *model, test)?,
                elapsed_s: train_time,
            };
            if let Some(f) = progress {
                f(TrainEvent::Epoch(stats));
            }
            epochs.push(stats);
        }
    }
    drop(reducer.shutdown()?);
    Ok(RankOut {
        epochs,
        time_s: train_time,
        bytes: meter.counts().bytes_sent,
        mean_iter_s: iter_sum / iter_count.max(1) as f64,
    })
}

/// Trains `cfg.model` on `train` with `cfg.ranks` thread ranks; evaluates on `test` each
/// epoch. `progress` is called by rank 0.
pub fn train(
    cfg: &TrainConfig,
    train: &dyn Dataset,
    test: &dyn Dataset,
    progress: Option<&(dyn Fn(TrainEvent) + Sync)>,
) -> Result<TrainReport> {
    validate(cfg, train, test)?;
    let probe = cfg
        .model
        .build(train.input_dim(), train.classes(), cfg.seed)?;
    let (_, plan, planner) = plan_for(cfg, &*probe)?;
    let model_name = probe.name();
    drop(probe);
    let outs = ThreadComm::run_with(
        cfg.ranks,
        ThreadConfig::default(),
        |comm| -> Result<RankOut> {
            match cfg.transport {
                Transport::Thread => run_rank(comm, cfg, train, test, &plan, progress),
                Transport::Sim(topo, mode) => {
                    let sim = SimComm::new(comm, topo, mode)?;
                    run_rank(sim, cfg, train, test, &plan, progress)
                }
            }
        },
    )
    .map_err(|e| match e {
        collectives::RunError::Failed { error, .. } => error,
        other => Error::CommThread(other.to_string()),
    })?;
    let first = outs
        .first()
        .ok_or_else(|| Error::InvalidArgument("no ranks".into()))?;
    let bytes_per_rank = outs.iter().map(|o| o.bytes as f64).sum::<f64>() / outs.len() as f64;
    Ok(TrainReport {
        scheme: cfg.scheme.to_string(),
        planner: planner.to_string(),
        model: model_name,
        ranks: cfg.ranks,
        density: cfg.density,
        groups: plan.groups(),
        epochs: first.epochs.clone(),
        test_acc: first.epochs.last().map(|e| e.test_acc).unwrap_or(0.0),
        time_s: outs.iter().map(|o| o.time_s).fold(0.0, f64::max),
        bytes_per_rank,
        mean_iteration_s: first.mean_iter_s,
    })
}

/// Samples of the generated task used by [`train_suite`] and `cargo xtask train`.
pub const SUITE_TRAIN_SAMPLES: usize = 8192;
/// Test samples of the generated task.
pub const SUITE_TEST_SAMPLES: usize = 2048;

/// The generated classification task (64 features, 10 classes) of the train suite.
pub fn suite_data(seed: u64) -> Result<(crate::data::InMemory, crate::data::InMemory)> {
    synthetic(SUITE_TRAIN_SAMPLES, SUITE_TEST_SAMPLES, 64, 10, seed)
}

/// What the bench's `train` suite records.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SuiteResult {
    /// Final test accuracy, %.
    pub test_acc: f64,
    /// Training wall time, seconds.
    pub time_s: f64,
    /// Payload bytes sent per rank.
    pub bytes_per_rank: f64,
}

/// For the bench's `train` suite: trains the MLP on the generated task with `scheme`
/// (dense, topk, lags, mgs, omgs, spardl, exdyna, hitopk, ...) on `ranks` thread ranks for
/// `epochs` at density 0.01.
pub fn train_suite(scheme: &str, ranks: usize, epochs: usize) -> Result<SuiteResult> {
    let (tr, te) = suite_data(7)?;
    let cfg = TrainConfig {
        scheme: scheme.parse()?,
        ranks,
        epochs,
        ..TrainConfig::default()
    };
    let r = train(&cfg, &tr, &te, None)?;
    Ok(SuiteResult {
        test_acc: r.test_acc,
        time_s: r.time_s,
        bytes_per_rank: r.bytes_per_rank,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_runs_learn_and_agree() {
        let (tr, te) = synthetic(1024, 256, 16, 4, 5).unwrap();
        for scheme in ["dense", "omgs"] {
            let cfg = TrainConfig {
                scheme: scheme.parse().unwrap(),
                ranks: 2,
                epochs: 2,
                batch: 16,
                lr: 0.05,
                density: 0.05,
                ..TrainConfig::default()
            };
            let r = train(&cfg, &tr, &te, None).unwrap();
            assert_eq!(r.epochs.len(), 2);
            assert!(r.test_acc > 40.0, "{scheme}: {}", r.test_acc);
            assert!(r.bytes_per_rank > 0.0);
        }
    }

    #[test]
    fn bad_configs_are_errors() {
        let (tr, te) = synthetic(64, 16, 4, 2, 5).unwrap();
        let cfg = TrainConfig {
            ranks: 4,
            batch: 32,
            ..TrainConfig::default()
        };
        assert!(matches!(
            train(&cfg, &tr, &te, None),
            Err(Error::InvalidArgument(_))
        ));
        assert!("sgd".parse::<SchemeKind>().is_err());
        assert_eq!(
            "spardl".parse::<SchemeKind>().unwrap(),
            SchemeKind::Collective("spardl".parse().unwrap())
        );
    }
}
