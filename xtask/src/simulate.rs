//! `cargo xtask simulate`: every planner side by side on a profile, with Gantt charts.

use std::time::Instant;

use pipeline::gantt::write_gantt;
use pipeline::{predict, zoo, Planner};

use crate::plan::{load_costs, load_profile, Workload};
use crate::CliResult;

/// Options of `cargo xtask simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Workload and costs.
    #[command(flatten)]
    pub workload: Workload,
    /// Directory for the Gantt SVGs and summary.json.
    #[arg(long, default_value = "target/simulate")]
    pub out: std::path::PathBuf,
}

/// Runs `cargo xtask simulate`.
pub fn run(args: Args) -> CliResult {
    let w = &args.workload;
    let profiles = if w.profile.is_some() || w.model.is_some() {
        vec![load_profile(&w.profile, &w.model)?]
    } else {
        zoo::MODELS
            .iter()
            .map(|m| zoo::profile(m))
            .collect::<Result<Vec<_>, _>>()?
    };
    let costs = load_costs(&w.preset, &w.calibration, w.density, w.ranks)?;
    std::fs::create_dir_all(&args.out)?;
    let mut summary = Vec::new();
    println!(
        "{:<14} {:<11} {:>6} {:>10} {:>10} {:>10} {:>11}",
        "model", "planner", "groups", "iter (s)", "t_c^no (s)", "vs best", "plan (ms)"
    );
    for profile in &profiles {
        let mut rows = Vec::new();
        for planner in Planner::ALL {
            // Planning time: best of 5 (the planners are deterministic).
            let mut ms = f64::INFINITY;
            let mut plan = None;
            for _ in 0..5 {
                let t0 = Instant::now();
                plan = Some(planner.plan(profile, &&*costs)?);
                ms = ms.min(t0.elapsed().as_secs_f64() * 1e3);
            }
            let plan = plan.ok_or("no plan")?;
            let t = predict(profile, &plan, &&*costs)?;
            let svg = args.out.join(format!(
                "{}_{}.svg",
                profile.model(),
                planner.to_string().replace(':', "_")
            ));
            write_gantt(
                &t,
                &format!(
                    "{} — {} ({} groups, {:.3} s)",
                    profile.model(),
                    planner,
                    plan.num_groups(),
                    t.iteration_s
                ),
                &svg,
            )?;
            rows.push((planner, plan, t, ms, svg));
        }
        let best = rows
            .iter()
            .map(|r| r.2.iteration_s)
            .fold(f64::INFINITY, f64::min);
        for (planner, plan, t, ms, svg) in &rows {
            println!(
                "{:<14} {:<11} {:>6} {:>10.4} {:>10.4} {:>9.3}x {:>11.2}",
                profile.model(),
                planner.to_string(),
                plan.num_groups(),
                t.iteration_s,
                t.non_overlapped_comm_s,
                t.iteration_s / best,
                ms
            );
            let mut v = crate::plan::plan_json(profile, *planner, plan, t, *ms);
            v["gantt"] = svg.display().to_string().into();
            v["ranks"] = w.ranks.into();
            summary.push(v);
        }
    }
    let path = args.out.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary)?)?;
    println!("Gantt charts and {} written", path.display());
    Ok(())
}
