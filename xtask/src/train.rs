//! `cargo xtask train`: data-parallel training of a candle model (ResNet-20, VGG-16-BN, or
//! the 2-layer LSTM language model) on real data through `datacache` (the shipped digits by
//! default, CIFAR-10 with `--data DIR`, or generated CIFAR-10-format files; for `--model
//! lstm` the shipped King James Gospels token files, or `--text DIR`), one run per scheme;
//! writes loss and test accuracy (perplexity for the language model) per epoch
//! (train.json, train.svg), the measured iteration breakdown next
//! to the timeline's prediction, and each scheme's Chrome trace (trace_SCHEME.json).
//! `--mpi -n P` relaunches itself under mpirun (MpiComm); threads are the default.
//! `--check-timeline` is the runtime-versus-prediction check over a real-time SimComm.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use pipeline::candle_models::LstmShape;
use pipeline::check::{
    runtime_vs_timeline, same_ranking, CheckConfig, LAYER_WISE, ONE_GROUP, PLANNED,
};
use pipeline::data::{digits_dir, kjv_dir, CacheOptions, DataSpec, Dataset, ImageData, TextData};
use pipeline::optimizer::OptimizerKind;
use pipeline::train::{
    CheckpointConfig, LrSchedule, ModelKind, TrainConfig, TrainEvent, TrainReport, Transport,
};
use pipeline::{DenseChoice, Planner, SchemeKind};
use plotters::prelude::*;

use crate::CliResult;

/// How ranks talk.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportArg {
    /// Threads at memory speed.
    Thread,
    /// SimComm on the OMGS 1 GbE preset, logical clock (accounting only).
    Sim,
    /// SimComm on the 1 GbE preset in real time (every message takes its modelled time).
    SimRealtime,
}

/// Options of `cargo xtask train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Schemes, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "dense,omgs")]
    pub scheme: Vec<SchemeKind>,
    /// Ranks P (threads).
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// Density of the sparse schemes.
    #[arg(long, default_value_t = 0.01)]
    pub density: f64,
    /// Epochs.
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Samples per rank per iteration (token streams per rank for --model lstm).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.1)]
    pub lr: f32,
    /// LR warm-up, epochs.
    #[arg(long, default_value_t = 1.0)]
    pub warmup_epochs: f64,
    /// Learning rate after warm-up: cosine decay to zero, or constant.
    #[arg(long, value_enum, default_value = "cosine")]
    pub lr_schedule: LrSchedule,
    /// Model.
    #[arg(long, value_enum, default_value = "resnet20")]
    pub model: ModelKind,
    /// Optimizer.
    #[arg(long, value_enum, default_value = "sgd")]
    pub optimizer: OptimizerKind,
    /// The CIFAR-10 binary release folder (data_batch_1.bin ... test_batch.bin). Default:
    /// the real digits shipped in data/digits.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// MNIST IDX folder instead of the shipped digits.
    #[arg(long, conflicts_with = "data")]
    pub idx: Option<PathBuf>,
    /// Generate this many CIFAR-10-format training samples (throughput runs).
    #[arg(long, conflicts_with_all = ["data", "idx"])]
    pub generated: Option<usize>,
    /// Options of --model lstm (boxed: the command enum stays small).
    #[command(flatten)]
    pub lm: Box<LmArgs>,
    /// Disk level of the data cache (raw bytes kept across runs).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Transport.
    #[arg(long, value_enum, default_value = "thread")]
    pub transport: TransportArg,
    /// Merge planner (default: the scheme's own).
    #[arg(long)]
    pub planner: Option<String>,
    /// Calibration JSON (from `cargo xtask calibrate`) for the planning costs and the
    /// dense scheme's automatic choice.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// How the dense scheme picks its all-reduce per group: once from the calibration, or
    /// online (re-ranked from the run's own exchanges).
    #[arg(long, value_enum, default_value = "calibrated")]
    pub dense_choice: DenseChoice,
    /// Iterations profiled before planning.
    #[arg(long, default_value_t = 4)]
    pub profile_iters: usize,
    /// Epochs of HiTopKComm before the switch to the dense torus (scheme `switch`).
    #[arg(long, default_value_t = 1)]
    pub switch_epochs: usize,
    /// Check after every step that the parameters are bit-identical on every rank.
    #[arg(long)]
    pub check_params: bool,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output directory.
    #[arg(long, default_value = "target/train")]
    pub out: PathBuf,
    /// Write checkpoints into DIR/SCHEME/ (one file per checkpoint, written by rank 0,
    /// atomically; the newest two are kept).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Write a checkpoint every N steps (0: only when --stop-after-steps stops the run).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: usize,
    /// Continue each scheme from its newest intact checkpoint in --checkpoint-dir; one of
    /// another P or configuration is an error.
    #[arg(long, requires = "checkpoint_dir")]
    pub resume: bool,
    /// Stop after N steps in all (those before a resume included), writing a checkpoint
    /// first with --checkpoint-dir.
    #[arg(long)]
    pub stop_after_steps: Option<usize>,
    /// Print the parameter hash after every step (to compare a resumed run with an
    /// uninterrupted one).
    #[arg(long)]
    pub print_step_hashes: bool,
    /// Run under mpirun with MpiComm (rebuilds xtask with the `mpi` feature).
    #[arg(long)]
    pub mpi: bool,
    /// MPI processes with --mpi.
    #[arg(short = 'n', long = "np", default_value_t = 4)]
    pub np: usize,
    /// Internal: set when this process was started by mpirun.
    #[arg(long, hide = true)]
    pub mpi_child: bool,
    /// Instead of training: measure the runtime over a real-time SimComm of the 1 GbE
    /// preset and compare each scheme with the timeline's prediction.
    #[arg(long)]
    pub check_timeline: bool,
    /// Iterations per scheme for --check-timeline.
    #[arg(long, default_value_t = 8)]
    pub check_iterations: usize,
    /// Hidden width of the MLP that --check-timeline trains.
    #[arg(long, default_value_t = 1024)]
    pub check_hidden: usize,
}

/// Options of the language model (`--model lstm`).
#[derive(clap::Args, Debug)]
pub struct LmArgs {
    /// Token files (train.tok, valid.tok, test.tok, vocab.txt) for --model lstm. Default: the King
    /// James Gospels shipped in data/kjv-gospels.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Truncated-BPTT length of --model lstm (tokens per stream per iteration).
    #[arg(long, default_value_t = 35)]
    pub bptt: usize,
    /// Embedding width of --model lstm.
    #[arg(long, default_value_t = LstmShape::SMALL.embed)]
    pub lstm_embed: usize,
    /// Hidden units of each LSTM layer of --model lstm.
    #[arg(long, default_value_t = LstmShape::SMALL.hidden)]
    pub lstm_hidden: usize,
    /// Vocabulary of --model lstm (default: the token files'; another is an error).
    #[arg(long)]
    pub vocab: Option<usize>,
}

fn transport(t: TransportArg, ranks: usize) -> Result<Transport, Box<dyn std::error::Error>> {
    let topo = || -> Result<cost_model::Topology, Box<dyn std::error::Error>> {
        Ok(match cost_model::presets::omgs_1gbe(ranks) {
            Ok(p) => p.topology()?,
            Err(_) => cost_model::Topology::flat(ranks, cost_model::Link::from_gbit(50e-6, 1.0))?,
        })
    };
    Ok(match t {
        TransportArg::Thread => Transport::Thread,
        TransportArg::Sim => Transport::Sim(topo()?, collectives::ClockMode::Logical),
        TransportArg::SimRealtime => Transport::Sim(topo()?, collectives::ClockMode::RealTime),
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
    // Language models plot test perplexity where classifiers plot test accuracy.
    let ppl = !reports.is_empty() && reports.iter().all(|r| r.test_ppl.is_some());
    let metric = |e: &pipeline::train::EpochStats| match (ppl, e.test_ppl) {
        (true, Some(p)) => p,
        _ => e.test_acc,
    };
    let top = if ppl {
        reports
            .iter()
            .flat_map(|r| r.epochs.iter().map(metric))
            .fold(1.0, f64::max)
            * 1.05
    } else {
        100.0
    };
    let mut acc = ChartBuilder::on(&left)
        .caption(
            if ppl {
                "test perplexity"
            } else {
                "test accuracy (%)"
            },
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(1.0..epochs.max(2.0), 0.0..top)?;
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
            r.epochs.iter().map(|e| (e.epoch as f64, metric(e))),
            c.stroke_width(2),
        ))?
        .label(headline(r))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c));
        loss.draw_series(LineSeries::new(
            r.epochs.iter().map(|e| (e.epoch as f64, e.loss as f64)),
            c.stroke_width(2),
        ))?;
    }
    acc.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(if ppl {
            SeriesLabelPosition::UpperRight
        } else {
            SeriesLabelPosition::LowerRight
        })
        .draw()?;
    root.present()?;
    Ok(())
}

/// A run's final test number: perplexity for a language model, else accuracy.
fn headline(r: &TrainReport) -> String {
    match r.test_ppl {
        Some(p) => format!("{} (ppl {p:.1})", r.scheme),
        None => format!("{} ({:.1}%)", r.scheme, r.test_acc),
    }
}

/// One epoch's line for the progress bar.
fn epoch_line(s: &pipeline::train::EpochStats) -> String {
    match s.test_ppl {
        Some(p) => format!(
            "epoch {} loss {:.3} valid ppl {} test loss {:.3} ppl {p:.1}",
            s.epoch,
            s.loss,
            s.valid_ppl.map_or("-".into(), |v| format!("{v:.1}")),
            s.test_loss
        ),
        None => format!(
            "epoch {} loss {:.3} test {:.1}%",
            s.epoch, s.loss, s.test_acc
        ),
    }
}

fn check(args: &Args) -> CliResult {
    let cfg = CheckConfig {
        ranks: args.ranks,
        density: args.density,
        iterations: args.check_iterations,
        hidden: args.check_hidden,
        ..CheckConfig::default()
    };
    eprintln!(
        "runtime vs timeline over a real-time SimComm of the OMGS 1 GbE preset at P = {} ...",
        cfg.ranks
    );
    let rows = runtime_vs_timeline(&cfg)?;
    println!(
        "{:<18} {:>6} {:>14} {:>13} {:>9} {:>8} {:>22} {:>21}",
        "scheme",
        "groups",
        "predicted (ms)",
        "median (ms)",
        "mean (ms)",
        "error",
        "non-overlapped pred.",
        "non-overlapped meas."
    );
    for r in &rows {
        println!(
            "{:<18} {:>6} {:>14.2} {:>13.2} {:>9.2} {:>+7.1}% {:>19.2} ms {:>18.2} ms",
            r.scheme,
            r.groups,
            r.predicted_s * 1e3,
            r.measured_s * 1e3,
            r.measured_mean_s * 1e3,
            r.rel_error * 100.0,
            r.predicted_non_overlapped_s * 1e3,
            r.measured_non_overlapped_s * 1e3
        );
    }
    println!();
    println!(
        "{:<18} {:>17} {:>17} {:>17} {:>17}   (predicted / measured, ms)",
        "parts", "forward", "backward", "selection", "communication"
    );
    for r in &rows {
        let (p, m) = (&r.predicted_parts, &r.measured_parts);
        let pair = |a: f64, b: f64| format!("{:>8.2}/{:<8.2}", a * 1e3, b * 1e3);
        println!(
            "{:<18} {:>17} {:>17} {:>17} {:>17}",
            r.scheme,
            pair(p.forward_s, m.forward_s),
            pair(p.backward_s, m.backward_s),
            pair(p.sparsify_s, m.sparsify_s),
            pair(p.comm_s, m.comm_s)
        );
    }
    for r in rows.iter().filter(|r| r.param_bcast_s > 0.0) {
        println!(
            "{}: the weights' LP broadcast took {:.2} ms per iteration, forward waited {:.2} ms for it: {:.0}% overlapped forward",
            r.scheme,
            r.param_bcast_s * 1e3,
            r.param_wait_s * 1e3,
            100.0 * (1.0 - r.param_wait_s / r.param_bcast_s).max(0.0)
        );
    }
    let tolerance = 0.15;
    let within = rows.iter().all(|r| r.rel_error.abs() <= tolerance);
    // Only pairs the prediction separates by more than its own tolerance can be required
    // to come out in the same order.
    let ranked = same_ranking(&rows, tolerance);
    let exposed = |name: &str| {
        rows.iter()
            .find(|r| r.scheme == name)
            .map(|r| r.measured_non_overlapped_s)
    };
    let merge_wins = match (exposed(PLANNED), exposed(ONE_GROUP), exposed(LAYER_WISE)) {
        (Some(p), Some(o), Some(l)) => p < o && p < l,
        _ => false,
    };
    println!(
        "all within {:.0}%: {within}; same ranking (pairs predicted more than {:.0}% apart): \
         {ranked}; planned merge exposes less communication than one group and than \
         layer-wise: {merge_wins}",
        tolerance * 100.0,
        tolerance * 100.0
    );
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(
        args.out.join("timeline_check.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    if within && ranked && merge_wins {
        Ok(())
    } else {
        Err("the runtime disagrees with the timeline".into())
    }
}

/// The configuration of one scheme's run.
fn config(
    args: &Args,
    data: &dyn Dataset,
    scheme: SchemeKind,
    ranks: usize,
) -> Result<TrainConfig, Box<dyn std::error::Error>> {
    let lstm = LstmShape {
        vocab: args.lm.vocab.or(data.vocab()).unwrap_or(0),
        embed: args.lm.lstm_embed,
        hidden: args.lm.lstm_hidden,
    };
    Ok(TrainConfig {
        scheme,
        planner: args
            .planner
            .as_deref()
            .map(str::parse::<Planner>)
            .transpose()?,
        model: args.model,
        lstm,
        ranks,
        density: args.density,
        epochs: args.epochs,
        batch: args.batch,
        lr: args.lr,
        warmup_epochs: args.warmup_epochs,
        lr_schedule: args.lr_schedule,
        optimizer: args.optimizer,
        profile_iters: args.profile_iters,
        switch_epochs: args.switch_epochs,
        check_params: args.check_params,
        calibration: args.calibration.clone(),
        dense_choice: args.dense_choice,
        seed: args.seed,
        transport: transport(args.transport, ranks)?,
        checkpoint: CheckpointConfig {
            dir: args
                .checkpoint_dir
                .as_ref()
                .map(|d| d.join(scheme.to_string())),
            every: args.checkpoint_every,
            resume: args.resume,
        },
        stop_after_steps: args.stop_after_steps,
        ..TrainConfig::default()
    })
}

fn data(args: &Args) -> Result<Box<dyn Dataset>, Box<dyn std::error::Error>> {
    let opts = CacheOptions {
        disk: args.cache_dir.clone(),
        memory_bytes: 0,
    };
    if args.model == ModelKind::Lstm || args.lm.text.is_some() {
        let dir = args.lm.text.clone().unwrap_or_else(kjv_dir);
        return Ok(Box::new(TextData::open(&dir, args.lm.bptt, &opts)?));
    }
    let spec = match (&args.data, &args.idx, args.generated) {
        (Some(d), _, _) => DataSpec::Cifar10(d.clone()),
        (_, Some(d), _) => DataSpec::Idx(d.clone()),
        (_, _, Some(n)) => DataSpec::GeneratedCifar10 {
            dir: args.out.join("generated-cifar10"),
            train: n,
            test: (n / 5).max(10),
        },
        _ => DataSpec::Idx(digits_dir()),
    };
    Ok(Box::new(ImageData::open(&spec, &opts)?))
}

fn print_report(r: &TrainReport, step_hashes: bool) {
    let b = &r.breakdown;
    for s in &r.skipped_checkpoints {
        eprintln!("warning: skipped a damaged checkpoint: {s}");
    }
    if step_hashes {
        for (i, h) in r.step_param_hashes.iter().enumerate() {
            println!(
                "{:<8} step {} param hash {h:016x}",
                r.scheme,
                r.first_step + i + 1
            );
        }
    }
    println!(
        "{:<8} steps {}..={}{}{}",
        r.scheme,
        r.first_step + 1,
        r.steps,
        match &r.resumed_from {
            Some(p) => format!(
                " (resumed after step {} from {})",
                r.first_step,
                p.display()
            ),
            None => String::new(),
        },
        r.last_checkpoint
            .as_ref()
            .map(|p| format!("; last checkpoint {}", p.display()))
            .unwrap_or_default()
    );
    println!(
        "{:<8} {}  time {:.1} s  bytes/rank {:.3e}  groups {}  planner {}  params checked on every rank after {} steps (final hash {:016x})",
        r.scheme,
        match r.test_ppl {
            Some(p) => format!(
                "valid perplexity {}  test perplexity {p:.2} (next-token accuracy {:.2}%)",
                r.epochs
                    .last()
                    .and_then(|e| e.valid_ppl)
                    .map_or("-".into(), |v| format!("{v:.2}")),
                r.test_acc
            ),
            None => format!("test {:.2}%", r.test_acc),
        },
        r.time_s,
        r.bytes_per_rank,
        r.groups.len(),
        r.planner,
        r.params_checked_steps,
        r.final_param_hash
    );
    println!(
        "         per iteration (ms): forward {:.2}  backward {:.2}  selection {:.2}  comm {:.2}  non-overlapped comm {:.2} (predicted {:.2})  iteration {:.2} (predicted {:.2}, {:+.1}%)  optimizer {:.2}",
        b.forward_s * 1e3,
        b.backward_s * 1e3,
        b.selection_s * 1e3,
        b.comm_s * 1e3,
        b.non_overlapped_comm_s * 1e3,
        b.predicted_non_overlapped_s * 1e3,
        b.iteration_s * 1e3,
        b.predicted_iteration_s * 1e3,
        (b.iteration_s / b.predicted_iteration_s - 1.0) * 100.0,
        b.optimizer_s * 1e3
    );
    if let Some((warm, missed)) = r.warm_starts {
        println!(
            "         top-k selections started warm (from the last iteration's threshold): {warm}, of which {missed} missed and fell back ({:.1}%)",
            100.0 * missed as f64 / warm.max(1) as f64
        );
    }
    if b.param_bcast_s > 0.0 {
        println!(
            "         weights' LP broadcast (ms): {:.2}, waited for {:.2} of it (bsp1: inside forward)",
            b.param_bcast_s * 1e3,
            b.param_wait_s * 1e3
        );
    }
}

/// Writes train.json, train.svg and one trace per scheme.
fn write_outputs(args: &Args, reports: &[TrainReport]) -> CliResult {
    std::fs::create_dir_all(&args.out)?;
    for r in reports {
        pipeline::trace::write(&args.out.join(format!("trace_{}.json", r.scheme)), &r.trace)?;
    }
    let json = args.out.join("train.json");
    std::fs::write(&json, serde_json::to_string_pretty(reports)?)?;
    let svg = args.out.join("train.svg");
    plot(reports, &svg)?;
    println!(
        "wrote {}, {} and trace_<scheme>.json in {}",
        json.display(),
        svg.display(),
        args.out.display()
    );
    Ok(())
}

/// Runs `cargo xtask train`.
pub fn run(args: Args) -> CliResult {
    if args.check_timeline {
        return check(&args);
    }
    if args.mpi && !args.mpi_child {
        let mut child: Vec<std::ffi::OsString> = vec!["train".into(), "--mpi-child".into()];
        child.extend(std::env::args_os().skip(2));
        return crate::bench::mpirun_xtask(args.np, None, &child);
    }
    if args.mpi_child {
        return run_mpi(&args);
    }
    let data = data(&args)?;
    let mut reports = Vec::new();
    for &scheme in &args.scheme {
        let cfg = config(&args, &*data, scheme, args.ranks)?;
        let iters = data.iters_per_epoch(args.ranks, args.batch) as u64;
        let bar = ProgressBar::new(iters * args.epochs as u64);
        bar.set_style(
            ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(scheme.to_string());
        let on_event = |e: TrainEvent| match e {
            TrainEvent::Iteration { .. } => bar.inc(1),
            TrainEvent::Epoch(s) => bar.set_message(epoch_line(&s)),
        };
        let report = pipeline::train(&cfg, &*data, Some(&on_event))?;
        bar.finish();
        print_report(&report, args.print_step_hashes);
        reports.push(report);
    }
    write_outputs(&args, &reports)
}

/// One process of an mpirun job: the world is `MpiComm`; rank 0 reports.
#[cfg(feature = "mpi")]
fn run_mpi(args: &Args) -> CliResult {
    use collectives::Communicator;
    let data = data(args)?;
    let world = collectives::MpiComm::world()?;
    let rank = world.rank();
    let mut reports = Vec::new();
    for &scheme in &args.scheme {
        // A communicator per scheme (no message of one run meets the next), with a
        // shared segment of its own for the dense automatic choice.
        let comm = world.split_with_segment(0, rank as u32)?;
        let cfg = config(args, &*data, scheme, comm.size())?;
        let cfg = TrainConfig {
            transport: Transport::Thread,
            ..cfg
        };
        let report = pipeline::train::run_rank(comm, &cfg, &*data, None, None)?;
        if rank == 0 {
            print_report(&report, args.print_step_hashes);
            reports.push(report);
        }
    }
    if !reports.is_empty() {
        write_outputs(args, &reports)?;
    }
    Ok(())
}

/// Without the `mpi` feature there is no MPI world to join.
#[cfg(not(feature = "mpi"))]
fn run_mpi(_args: &Args) -> CliResult {
    Err("this xtask was built without the `mpi` feature".into())
}
