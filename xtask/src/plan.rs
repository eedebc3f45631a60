//! `cargo xtask plan`: the merge plan of a layer profile as JSON (OMGS-SGD
//! (Shi et al., INFOCOM 2020) §IV).

use std::time::Instant;

use pipeline::timeline::{CalibratedCosts, NoSparsify};
use pipeline::{
    predict, zoo, DenseCosts, LayerProfile, MergePlan, OmgsCosts, Planner, StepCosts, Timeline,
};

use crate::CliResult;

/// The workload and costs `cargo xtask plan` and `cargo xtask simulate` share.
#[derive(clap::Args, Debug)]
pub struct Workload {
    /// Layer profile JSON (JSON format of `pipeline::LayerProfile`).
    #[arg(long, conflicts_with = "model")]
    pub profile: Option<std::path::PathBuf>,
    /// A built-in profile: vgg16, resnet50, inception_v4, lstm_ptb, bert_base (`simulate`
    /// without one: every zoo model).
    #[arg(long)]
    pub model: Option<String>,
    /// Cost preset: omgs-1gbe (sparse, OMGS-SGD (Shi et al., INFOCOM 2020)) or
    /// omgs-1gbe-dense (MG-WFBP constants).
    #[arg(long, default_value = "omgs-1gbe", conflicts_with = "calibration")]
    pub preset: String,
    /// A calibration JSON from `cargo xtask calibrate` instead of a preset.
    #[arg(long)]
    pub calibration: Option<std::path::PathBuf>,
    /// Density for a calibration's all-gather cost.
    #[arg(long, default_value_t = 0.001)]
    pub density: f64,
    /// Number of workers P.
    #[arg(long, default_value_t = 16)]
    pub ranks: usize,
}

/// Options of `cargo xtask plan`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Workload and costs.
    #[command(flatten)]
    pub workload: Workload,
    /// Planner: lags, topk, `threshold[:N]`, omgs, exact (default), mgwfbp, exhaustive.
    #[arg(long, default_value = "exact")]
    pub planner: Planner,
}

/// The profile named by `--profile` or `--model`.
pub fn load_profile(
    profile: &Option<std::path::PathBuf>,
    model: &Option<String>,
) -> Result<LayerProfile, Box<dyn std::error::Error>> {
    match (profile, model) {
        (Some(p), _) => Ok(LayerProfile::load(p)?),
        (None, Some(m)) => Ok(zoo::profile(m)?),
        (None, None) => Err("give --profile FILE or --model NAME".into()),
    }
}

/// The costs named by `--preset` or `--calibration`.
pub fn load_costs(
    preset: &str,
    calibration: &Option<std::path::PathBuf>,
    density: f64,
    ranks: usize,
) -> Result<Box<dyn StepCosts>, Box<dyn std::error::Error>> {
    if let Some(path) = calibration {
        let cal = cost_model::Calibration::load(path)?;
        return Ok(Box::new(CalibratedCosts::from_calibration(&cal, density)?));
    }
    match preset {
        "omgs-1gbe" | "omgs" => Ok(Box::new(OmgsCosts::preset(ranks)?)),
        "omgs-1gbe-dense" | "mgwfbp" => Ok(Box::new(NoSparsify(DenseCosts::preset(ranks)?))),
        other => Err(format!("unknown preset `{other}` (omgs-1gbe, omgs-1gbe-dense)").into()),
    }
}

/// JSON summary of a plan and its predicted timeline.
pub fn plan_json(
    profile: &LayerProfile,
    planner: Planner,
    plan: &MergePlan,
    t: &Timeline,
    planning_ms: f64,
) -> serde_json::Value {
    serde_json::json!({
        "model": profile.model(),
        "layers": profile.len(),
        "planner": planner.to_string(),
        "num_groups": plan.num_groups(),
        "groups": plan.groups(),
        "predicted_iteration_s": t.iteration_s,
        "non_overlapped_comm_s": t.non_overlapped_comm_s,
        "sparsify_s": t.total_sparsify_s(),
        "comm_s": t.total_comm_s(),
        "planning_ms": planning_ms,
    })
}

/// Runs `cargo xtask plan`.
pub fn run(args: Args) -> CliResult {
    let w = &args.workload;
    let profile = load_profile(&w.profile, &w.model)?;
    let costs = load_costs(&w.preset, &w.calibration, w.density, w.ranks)?;
    let planner = args.planner;
    let t0 = Instant::now();
    let plan = planner.plan(&profile, &&*costs)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let t = predict(&profile, &plan, &&*costs)?;
    let mut v = plan_json(&profile, planner, &plan, &t, ms);
    v["ranks"] = w.ranks.into();
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
