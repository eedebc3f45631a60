//! The planner's prediction against a measured runtime iteration, on any transport: what
//! `cargo xtask calibrate` prints after fitting, so that a calibration is judged by the
//! iteration it is meant to plan, not only by its own sweep.
//!
//! On every rank: the check's MLP ([`crate::check`]) computes real candle gradients (real
//! compute, on this host, inside the timed iteration), hands them to the [`Reducer`] layer by
//! layer, and the [`TopkAllgather`] scheme (exact top-k with error feedback, the sparse
//! all-gather) reduces them over the caller's communicator. A layer-wise profiling run gives
//! the slowest rank's per-layer times (OMGS-SGD (Shi et al., INFOCOM 2020)'s per-hook method);
//! the default planner merges with the calibration's costs
//! ([`crate::timeline::CalibratedCosts`]: the top-k fit and the all-gather fit); the
//! timeline predicts; and the planned merge runs and is timed.

use collectives::Communicator;
use serde::{Deserialize, Serialize};

use crate::check::Parts;
use crate::plan::{MergePlan, Planner};
use crate::runtime::Reducer;
use crate::schemes::TopkAllgather;
use crate::staged;
use crate::timeline::{predict, CalibratedCosts, Timeline};
use crate::{Error, Result};

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IterationCheck {
    /// Width of the MLP's hidden layers (64 → h → h → h → 10).
    pub hidden: usize,
    /// Samples per rank per iteration.
    pub batch: usize,
    /// Density of the top-k.
    pub density: f64,
    /// Profiled iterations (the first is warm-up); ≥ 2.
    pub profile_iters: usize,
    /// Timed iterations of the planned merge (after one warm-up); ≥ 1.
    pub iterations: usize,
}

impl Default for IterationCheck {
    fn default() -> Self {
        IterationCheck {
            hidden: 1024,
            batch: 16,
            density: 0.01,
            profile_iters: 6,
            iterations: 10,
        }
    }
}

/// The prediction beside the measurement (rank 0's timelines, medians over iterations).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationValidation {
    /// Ranks.
    pub ranks: usize,
    /// Elements of the model.
    pub numel: usize,
    /// Groups of the default planner's merge.
    pub groups: usize,
    /// Predicted iteration time, seconds.
    pub predicted_s: f64,
    /// Measured median iteration time, seconds.
    pub measured_s: f64,
    /// Predicted communication left after backward, seconds.
    pub predicted_non_overlapped_s: f64,
    /// Measured median communication left after backward, seconds.
    pub measured_non_overlapped_s: f64,
    /// The prediction's parts.
    pub predicted_parts: Parts,
    /// The measured parts (medians).
    pub measured_parts: Parts,
    /// The plan's exchanges timed alone, seconds: per group a barrier, then the exchange
    /// (median over as many repetitions as timed iterations), summed, the slowest rank's.
    /// What the prediction's communication part describes: inside an iteration a group's
    /// exchange also waits for the slowest rank to hand its group over, and shares the
    /// cores with backward.
    pub comm_alone_s: f64,
}

impl IterationValidation {
    /// `|predicted − measured| / measured`.
    pub fn rel_error(&self) -> f64 {
        (self.predicted_s - self.measured_s).abs() / self.measured_s
    }
}

/// Runs `iterations` real iterations of `plan` on `comm` (after `warmup` untimed ones) and
/// returns the reducer's timelines and the communicator.
fn iterate(
    comm: Box<dyn Communicator>,
    model: &staged::Stages,
    (x, y): (&candle_core::Tensor, &candle_core::Tensor),
    plan: &MergePlan,
    scheme: &TopkAllgather,
    (warmup, iterations): (usize, usize),
) -> Result<(Vec<Timeline>, Box<dyn Communicator>)> {
    let mut reducer = Reducer::new(comm, &staged::layer_sizes(model), plan.clone(), scheme)?;
    let mut out = Vec::with_capacity(iterations);
    for it in 0..warmup + iterations {
        reducer.begin()?;
        let f = staged::forward_train(model, x)?;
        let loss = staged::Staged::loss(model, f.logits(), y)?;
        reducer.forward_done()?;
        staged::backward_staged(model, &f, &loss, &mut |l, g| reducer.ready(l, g))?;
        reducer.finish()?;
        if it >= warmup {
            if let Some(t) = reducer.last_timeline() {
                out.push(t.clone());
            }
        }
    }
    Ok((out, reducer.shutdown()?))
}

/// Rank 0's calibration on every rank (the local sweeps, top-k and reduction, are only in
/// rank 0's), so that every rank prices alike and fails alike.
fn rank0_calibration<C: Communicator + ?Sized>(
    comm: &C,
    cal: &cost_model::Calibration,
) -> Result<cost_model::Calibration> {
    use collectives::dense::{self, BroadcastAlgo, DenseOptions};
    let opts = DenseOptions::default();
    let mut text = if comm.rank() == 0 {
        serde_json::to_vec(cal).map_err(|e| Error::Json(e.to_string()))?
    } else {
        Vec::new()
    };
    let mut len = [text.len() as u64];
    dense::broadcast(comm, &mut len, 0, BroadcastAlgo::Binomial, &opts)?;
    text.resize(len[0] as usize, 0);
    dense::broadcast(comm, &mut text, 0, BroadcastAlgo::Binomial, &opts)?;
    serde_json::from_slice(&text).map_err(|e| Error::Json(e.to_string()))
}

/// Profiles, plans with `cal`'s costs, predicts and measures one runtime iteration on
/// `comm` (collective: every rank calls it; rank 0's `cal` is the one used).
pub fn calibrated_iteration<C: Communicator + ?Sized>(
    comm: &C,
    cal: &cost_model::Calibration,
    cfg: &IterationCheck,
) -> Result<IterationValidation> {
    if cfg.hidden == 0 || cfg.batch == 0 || cfg.profile_iters < 2 || cfg.iterations == 0 {
        return Err(Error::InvalidArgument(format!(
            "the iteration check needs hidden, batch, iterations ≥ 1 and profile_iters ≥ 2 \
             (got {}, {}, {}, {})",
            cfg.hidden, cfg.batch, cfg.iterations, cfg.profile_iters
        )));
    }
    let cal = &rank0_calibration(comm, cal)?;
    if cal.ranks != comm.size() {
        return Err(Error::InvalidArgument(format!(
            "the calibration is of {} ranks, this world has {}",
            cal.ranks,
            comm.size()
        )));
    }
    let costs = CalibratedCosts::from_calibration(cal, cfg.density)?;
    let scheme = TopkAllgather {
        density: cfg.density,
    };
    let rank = comm.rank();
    let model = crate::check::mlp(cfg.hidden)?;
    let sizes = staged::layer_sizes(&model);
    let dev = candle_core::Device::Cpu;
    let x: Vec<f32> = (0..cfg.batch * 64)
        .map(|i| ((i * 7 + rank * 13) % 17) as f32 / 17.0 - 0.5)
        .collect();
    let x = candle_core::Tensor::from_vec(x, (cfg.batch, 64), &dev)?;
    let y: Vec<u32> = (0..cfg.batch).map(|i| ((i + rank) % 10) as u32).collect();
    let y = candle_core::Tensor::from_vec(y, cfg.batch, &dev)?;
    let ctrl = comm.split(0, rank as u32)?;
    let red = comm.split(0, rank as u32)?;
    // Profile layer by layer, then plan on the slowest rank's times, the same on every rank.
    let layerwise = MergePlan::layerwise(sizes.len());
    let (samples, red) = iterate(
        red,
        &model,
        (&x, &y),
        &layerwise,
        &scheme,
        (0, cfg.profile_iters),
    )?;
    let times = crate::train::shared_backward_times(&*ctrl, &samples)?;
    let profile = crate::train::profile_for(&model, &times)?;
    let plan = crate::train::shared_plan(&*ctrl, &Planner::default().plan(&profile, &costs)?)?;
    let predicted = predict(&profile, &plan, &costs)?;
    let (tl, red) = iterate(red, &model, (&x, &y), &plan, &scheme, (1, cfg.iterations))?;
    let comm_alone_s = exchanges_alone(&*red, &*ctrl, (&plan, &sizes), &scheme, cfg.iterations)?;
    let median =
        |f: &dyn Fn(&Timeline) -> f64| cost_model::median(&tl.iter().map(f).collect::<Vec<_>>());
    Ok(IterationValidation {
        ranks: comm.size(),
        numel: sizes.iter().sum(),
        groups: plan.num_groups(),
        predicted_s: predicted.iteration_s,
        measured_s: median(&|t| t.iteration_s),
        predicted_non_overlapped_s: predicted.non_overlapped_comm_s,
        measured_non_overlapped_s: median(&|t| t.non_overlapped_comm_s),
        predicted_parts: Parts::of(&predicted),
        measured_parts: Parts::median_of(tl.iter()),
        comm_alone_s,
    })
}

/// The exchanges of `plan` (layer sizes `sizes`) timed alone on `comm`, as the calibration
/// times a collective: per group, its compressor's payload of a gradient, exchanged right
/// after a barrier with no compute running, `reps` times after one warm-up; the median per
/// group, summed over the groups; the slowest rank's sum, on every rank (agreed over
/// `ctrl`).
fn exchanges_alone(
    comm: &dyn Communicator,
    ctrl: &dyn Communicator,
    (plan, sizes): (&MergePlan, &[usize]),
    scheme: &TopkAllgather,
    reps: usize,
) -> Result<f64> {
    use crate::schemes::{ExchangeCtx, Scheme};
    let rank = comm.rank();
    let mut total = 0.0;
    for (g, layers) in plan.groups().iter().enumerate() {
        let numel: usize = layers.iter().map(|&l| sizes[l]).sum();
        let (mut compress, mut exchange) = scheme.group(g, numel, comm.size())?;
        let grad: Vec<f32> = (0..numel)
            .map(|i| ((i * 7919 + rank * 13) % 1009) as f32 / 1009.0 - 0.5)
            .collect();
        let mut times = Vec::with_capacity(reps);
        for rep in 0..=reps.max(1) {
            let payload = compress.compress(grad.clone())?;
            comm.barrier()?;
            let start = std::time::Instant::now();
            let ctx = ExchangeCtx {
                iteration: rep as u64,
                group: g as u32,
                numel,
            };
            std::hint::black_box(exchange.exchange(comm, ctx, payload)?);
            if rep > 0 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        total += cost_model::median(&times);
    }
    let mut all = vec![0.0f64; ctrl.size()];
    collectives::dense::allgather(
        ctrl,
        &[total],
        &mut all,
        collectives::dense::AllgatherAlgo::Ring,
        &collectives::dense::DenseOptions::default(),
    )?;
    Ok(all.into_iter().fold(0.0, f64::max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectives::calibrate::{calibrate, CalibrateOptions};
    use collectives::dense::AllgatherAlgo;
    use collectives::ThreadComm;

    #[test]
    fn runs_on_threads_and_refuses_bad_input() {
        let out = ThreadComm::run(2, |comm| -> Result<_> {
            // A small calibration of this world: the ring all-gather and exact top-k.
            let opts = CalibrateOptions {
                sizes: vec![1 << 10, 1 << 12, 1 << 14, 1 << 16],
                reps: 1,
                allreduce: vec![],
                allgather: vec![AllgatherAlgo::Ring],
                reduce_scatter: vec![],
                topk_sizes: vec![1 << 10, 1 << 12, 1 << 14],
                density: 0.01,
                library: true,
                shared_memory: true,
            };
            let cal = calibrate(&comm, &opts, &mut |_: &str, _: usize, _: usize| {})?;
            let bad = calibrated_iteration(
                &comm,
                &cal,
                &IterationCheck {
                    profile_iters: 1,
                    ..IterationCheck::default()
                },
            );
            assert!(matches!(bad, Err(Error::InvalidArgument(_))));
            let mut other = cal.clone();
            other.ranks = 3;
            let wrong_world = calibrated_iteration(&comm, &other, &IterationCheck::default());
            assert!(matches!(wrong_world, Err(Error::InvalidArgument(_))));
            calibrated_iteration(
                &comm,
                &cal,
                &IterationCheck {
                    hidden: 32,
                    profile_iters: 2,
                    iterations: 2,
                    ..IterationCheck::default()
                },
            )
        })
        .unwrap();
        let v = &out[0];
        assert_eq!(
            (v.ranks, v.numel),
            (2, 64 * 32 + 32 + 2 * (32 * 32 + 32) + 32 * 10 + 10)
        );
        assert!(v.groups >= 1 && v.predicted_s > 0.0 && v.measured_s > 0.0);
        assert!(v.comm_alone_s > 0.0 && v.comm_alone_s == out[1].comm_alone_s);
        assert_eq!(out[0].groups, out[1].groups);
    }
}
