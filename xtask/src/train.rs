//! `cargo xtask train`: data-parallel training of a built-in model on the generated
//! classification task, with loss and accuracy per epoch to JSON and an SVG plot; and
//! `--check-timeline`, the runtime-versus-prediction check over a real-time SimComm.

use indicatif::{ProgressBar, ProgressStyle};
use pipeline::check::{runtime_vs_timeline, same_ranking, CheckConfig};
use pipeline::data::Dataset;
use pipeline::train::{
    suite_data, train, ModelKind, TrainConfig, TrainEvent, TrainReport, Transport,
};
use pipeline::{Planner, SchemeKind};
use plotters::prelude::*;

use crate::CliResult;

/// Options of `cargo xtask train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Schemes, comma-separated: dense, topk, lags, mgs, omgs, spardl, exdyna, hitopk.
    #[arg(long, default_value = "dense,omgs")]
    pub scheme: String,
    /// Ranks P.
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// Density of the sparse schemes.
    #[arg(long, default_value_t = 0.01)]
    pub density: f64,
    /// Epochs.
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Samples per rank per iteration.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.05)]
    pub lr: f32,
    /// Model: mlp or cnn.
    #[arg(long, default_value = "mlp")]
    pub model: String,
    /// Transport: thread, sim (logical clock, 1 GbE preset) or sim-realtime.
    #[arg(long, default_value = "thread")]
    pub transport: String,
    /// Merge planner (default: the scheme's own).
    #[arg(long)]
    pub planner: Option<String>,
    /// DGC-style density warm-up.
    #[arg(long)]
    pub density_warmup: bool,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output directory for train.json and train.svg.
    #[arg(long, default_value = "target/train")]
    pub out: std::path::PathBuf,
    /// Instead of training: measure the runtime over a real-time SimComm of the 1 GbE
    /// preset and compare each scheme with the timeline's prediction.
    #[arg(long)]
    pub check_timeline: bool,
    /// Iterations per scheme for --check-timeline.
    #[arg(long, default_value_t = 8)]
    pub check_iterations: usize,
}

fn transport(name: &str, ranks: usize) -> Result<Transport, Box<dyn std::error::Error>> {
    let topo = || -> Result<cost_model::Topology, Box<dyn std::error::Error>> {
        Ok(match cost_model::presets::omgs_1gbe(ranks) {
            Ok(p) => p.topology()?,
            Err(_) => cost_model::Topology::flat(ranks, cost_model::Link::from_gbit(50e-6, 1.0))?,
        })
    };
    Ok(match name {
        "thread" => Transport::Thread,
        "sim" => Transport::Sim(topo()?, collectives::ClockMode::Logical),
        "sim-realtime" => Transport::Sim(topo()?, collectives::ClockMode::RealTime),
        o => return Err(format!("unknown transport `{o}` (thread, sim, sim-realtime)").into()),
    })
}

fn plot(reports: &[TrainReport], path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(450);
    let epochs = reports.iter().map(|r| r.epochs.len()).max().unwrap_or(1) as f64;
    let max_loss = reports
        .iter()
        .flat_map(|r| r.epochs.iter().map(|e| e.loss as f64))
        .fold(0.0, f64::max)
        .max(1e-3);
    let colors = [
        BLUE,
        RED,
        GREEN,
        MAGENTA,
        CYAN,
        BLACK,
        RGBColor(255, 128, 0),
        RGBColor(128, 0, 255),
    ];
    let mut acc = ChartBuilder::on(&left)
        .caption("test accuracy (%)", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(1.0..epochs.max(2.0), 0.0..100.0)?;
    acc.configure_mesh().x_desc("epoch").draw()?;
    let mut loss = ChartBuilder::on(&right)
        .caption("training loss", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(1.0..epochs.max(2.0), 0.0..max_loss * 1.05)?;
    loss.configure_mesh().x_desc("epoch").draw()?;
    for (i, r) in reports.iter().enumerate() {
        let c = colors[i % colors.len()];
        acc.draw_series(LineSeries::new(
            r.epochs.iter().map(|e| (e.epoch as f64, e.test_acc)),
            c.stroke_width(2),
        ))?
        .label(format!("{} ({:.1}%)", r.scheme, r.test_acc))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c));
        loss.draw_series(LineSeries::new(
            r.epochs.iter().map(|e| (e.epoch as f64, e.loss as f64)),
            c.stroke_width(2),
        ))?;
    }
    acc.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

fn check(args: &Args) -> CliResult {
    let cfg = CheckConfig {
        ranks: args.ranks,
        density: args.density,
        iterations: args.check_iterations,
        ..CheckConfig::default()
    };
    eprintln!(
        "runtime vs timeline over a real-time SimComm of the OMGS 1 GbE preset at P = {} ...",
        cfg.ranks
    );
    let rows = runtime_vs_timeline(&cfg)?;
    println!(
        "{:<16} {:>6} {:>14} {:>13} {:>8}",
        "scheme", "groups", "predicted (ms)", "measured (ms)", "error"
    );
    for r in &rows {
        println!(
            "{:<16} {:>6} {:>14.2} {:>13.2} {:>+7.1}%",
            r.scheme,
            r.groups,
            r.predicted_s * 1e3,
            r.measured_s * 1e3,
            r.rel_error * 100.0
        );
    }
    let within = rows.iter().all(|r| r.rel_error.abs() <= 0.25);
    let ranked = same_ranking(&rows, 0.05);
    println!("all within 25%: {within}; same ranking (predictions 5% apart): {ranked}");
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(
        args.out.join("timeline_check.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    if within && ranked {
        Ok(())
    } else {
        Err("the runtime disagrees with the timeline".into())
    }
}

/// Runs `cargo xtask train`.
pub fn run(args: Args) -> CliResult {
    if args.check_timeline {
        return check(&args);
    }
    let (tr, te) = suite_data(args.seed)?;
    let model: ModelKind = args.model.parse()?;
    let planner: Option<Planner> = args.planner.as_deref().map(str::parse).transpose()?;
    let mut reports = Vec::new();
    for scheme in args
        .scheme
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let cfg = TrainConfig {
            scheme: scheme.parse::<SchemeKind>()?,
            planner,
            model,
            ranks: args.ranks,
            density: args.density,
            epochs: args.epochs,
            batch: args.batch,
            lr: args.lr,
            density_warmup: args.density_warmup,
            seed: args.seed,
            transport: transport(&args.transport, args.ranks)?,
            ..TrainConfig::default()
        };
        let iters = (tr.len() / args.ranks / args.batch) as u64;
        let bar = ProgressBar::new(iters * args.epochs as u64);
        bar.set_style(
            ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(scheme.to_string());
        let on_event = |e: TrainEvent| match e {
            TrainEvent::Iteration { .. } => bar.inc(1),
            TrainEvent::Epoch(s) => bar.set_message(format!(
                "epoch {} loss {:.3} test {:.1}%",
                s.epoch, s.loss, s.test_acc
            )),
        };
        let report = train(&cfg, &tr, &te, Some(&on_event))?;
        bar.finish();
        println!(
            "{:<8} test accuracy {:.2}%  time {:.2} s  bytes/rank {:.3e}  groups {}  mean iteration {:.2} ms",
            report.scheme,
            report.test_acc,
            report.time_s,
            report.bytes_per_rank,
            report.groups.len(),
            report.mean_iteration_s * 1e3
        );
        reports.push(report);
    }
    std::fs::create_dir_all(&args.out)?;
    let json = args.out.join("train.json");
    std::fs::write(&json, serde_json::to_string_pretty(&reports)?)?;
    let svg = args.out.join("train.svg");
    plot(&reports, &svg)?;
    println!("wrote {} and {}", json.display(), svg.display());
    Ok(())
}
