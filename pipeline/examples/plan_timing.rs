//! Times every planner on every zoo profile (the OMGS 1 GbE preset at P = 16). With
//! `--starts`, also prints each plan's group starts (to compare planner versions).
use pipeline::{predict, zoo, OmgsCosts, Planner};
use std::time::Instant;

fn main() {
    let c = OmgsCosts::preset(16).expect("preset");
    let show_starts = std::env::args().any(|a| a == "--starts");
    for name in zoo::MODELS {
        let p = zoo::profile(name).expect("zoo");
        for planner in Planner::ALL {
            let t0 = Instant::now();
            let plan = planner.plan(&p, &c).expect("plan");
            let dt = t0.elapsed().as_secs_f64();
            let it = predict(&p, &plan, &c).expect("predict").iteration_s;
            println!(
                "{name:14} {planner:10} groups {:4} iter {:.9} s  planned in {:.2} ms",
                plan.num_groups(),
                it,
                dt * 1e3
            );
            if show_starts {
                println!("    starts {:?}", plan.starts());
            }
        }
    }
}
