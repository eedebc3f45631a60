//! The runtime's measured iteration times over a real-time SimComm of the paper's 1 GbE
//! preset (P = 4) rank the schemes as the timeline predicts, each within 25 %.
//!
//! This is a wall-clock measurement, so it is not part of the default test run (speed and
//! timing belong in benchmarks, and a loaded CI machine disturbs it): run it with
//! `cargo test -p pipeline --test runtime_vs_timeline -- --ignored` on a quiet machine, or
//! `cargo xtask train --check-timeline`, which prints the same comparison in release mode.
//! It gets up to three attempts; each attempt's numbers are printed.

use pipeline::check::{runtime_vs_timeline, same_ranking, CheckConfig, CheckRow};

fn ok(rows: &[CheckRow]) -> bool {
    // Pairs predicted more than 10 % apart must be measured in the same order (the xtask
    // check uses 5 % in release builds; the dev profile on a loaded machine needs more).
    rows.iter().all(|r| r.rel_error.abs() <= 0.25) && same_ranking(rows, 0.10)
}

#[test]
#[ignore = "wall-clock timing: run on a quiet machine with --ignored, or `cargo xtask train --check-timeline`"]
fn runtime_matches_the_timeline_on_emulated_1gbe() {
    let mut last = Vec::new();
    for attempt in 1..=3 {
        let rows = runtime_vs_timeline(&CheckConfig {
            iterations: 5,
            ..CheckConfig::default()
        })
        .unwrap();
        for r in &rows {
            eprintln!(
                "attempt {attempt}: {:<16} groups {:>2} predicted {:.2} ms measured {:.2} ms ({:+.1}%)",
                r.scheme,
                r.groups,
                r.predicted_s * 1e3,
                r.measured_s * 1e3,
                r.rel_error * 100.0
            );
        }
        if ok(&rows) {
            return;
        }
        last = rows;
    }
    panic!("runtime disagrees with the timeline: {last:?}");
}
