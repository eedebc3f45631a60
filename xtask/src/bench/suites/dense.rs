//! `allreduce` and `allgather`: every dense algorithm at every message size, time and bus
//! bandwidth (nccl-tests convention); under MPI also `mpi_native`, the MPI library's own
//! collective, in the same run.

use collectives::dense::{allgather, allreduce, AllgatherAlgo, AllreduceAlgo, DenseOptions};
use collectives::Communicator;
use indicatif::ProgressBar;

use super::super::plot::{self, Series};
use super::super::report::{bytes as fmt_bytes, table};
use super::super::timing::world_time;
use super::j;
use crate::bench::{BoxErr, Ctx, Headline, SuiteOutput};

/// Which collective.
#[derive(Clone, Copy, PartialEq)]
pub enum Op {
    Allreduce,
    Allgather,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Allgather => "allgather",
        }
    }

    /// nccl-tests bus bandwidth factor: allreduce 2(P−1)/P, allgather (P−1)/P.
    fn bus_factor(self, p: usize) -> f64 {
        let p = p as f64;
        match self {
            Op::Allreduce => 2.0 * (p - 1.0) / p,
            Op::Allgather => (p - 1.0) / p,
        }
    }
}

fn sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![4 << 10, 64 << 10, 1 << 20, 4 << 20]
    } else {
        (0..8).map(|i| (4usize << 10) << (2 * i)).collect() // 4 KiB .. 64 MiB
    }
}

fn reps(bytes: usize, quick: bool) -> usize {
    let base = if quick { 3 } else { 5 };
    base.max(((4usize << 20) / bytes.max(1)).min(if quick { 20 } else { 50 }))
}

/// The row of the automatic choice (`choose_allreduce` / `choose_allgather` per size).
const AUTO: &str = "auto";

/// The calibration the automatic choice uses: `calibration.json` in the working directory
/// (from `cargo xtask calibrate`) when it was taken at this P, else none (the chooser's
/// built-in rules).
fn calibration(p: usize) -> Option<cost_model::Calibration> {
    cost_model::Calibration::load("calibration.json")
        .ok()
        .filter(|c| c.ranks == p)
}

fn algos(op: Op, p: usize) -> Vec<(String, Option<AllreduceAlgo>, Option<AllgatherAlgo>)> {
    let mut v: Vec<(String, Option<AllreduceAlgo>, Option<AllgatherAlgo>)> = match op {
        Op::Allreduce => AllreduceAlgo::all(p)
            .into_iter()
            .map(|a| (a.name().to_string(), Some(a), None))
            .collect(),
        Op::Allgather => AllgatherAlgo::ALL
            .iter()
            .map(|a| (a.name().to_string(), None, Some(*a)))
            .collect(),
    };
    v.push((AUTO.to_string(), None, None));
    v
}

/// Per (case, bytes): seconds.
type Times = Vec<(String, usize, f64)>;

pub fn run(ctx: &Ctx, pb: &ProgressBar, op: Op) -> Result<Option<SuiteOutput>, BoxErr> {
    let sizes = sizes(ctx.quick);
    let p = ctx.world_size();
    let list = algos(op, p);
    pb.set_length((sizes.len() * (list.len() + 1)) as u64);
    let quick = ctx.quick;
    let times = ctx.on_world(|comm| measure(comm, op, &sizes, &list, quick, pb))?;
    #[allow(unused_mut)]
    let mut times = match times {
        Some(t) => t,
        None => {
            #[cfg(feature = "mpi")]
            native(ctx, op, &sizes, quick)?;
            return Ok(None);
        }
    };
    #[cfg(feature = "mpi")]
    times.extend(native(ctx, op, &sizes, quick)?);
    pb.inc(sizes.len() as u64);
    Ok(Some(report(ctx, op, p, &sizes, &times)?))
}

fn measure(
    comm: &dyn Communicator,
    op: Op,
    sizes: &[usize],
    list: &[(String, Option<AllreduceAlgo>, Option<AllgatherAlgo>)],
    quick: bool,
    pb: &ProgressBar,
) -> Result<Times, BoxErr> {
    let p = comm.size();
    let opts = DenseOptions::default().unchecked();
    let cal = calibration(p);
    let predictor = cal
        .as_ref()
        .map(|c| c as &dyn collectives::dense::Predictor);
    let mut out = Vec::new();
    for (name, ar, ag) in list {
        for &bytes in sizes {
            if comm.rank() == 0 {
                pb.set_message(format!("{name} {}", fmt_bytes(bytes as f64)));
            }
            // The automatic choice: what a caller gets without naming an algorithm.
            let (ar, ag) = match (ar, ag, op) {
                (None, None, Op::Allreduce) => (
                    Some(collectives::dense::choose_allreduce(p, bytes, predictor)),
                    None,
                ),
                (None, None, Op::Allgather) => (
                    None,
                    Some(collectives::dense::choose_allgather(
                        p,
                        (bytes / p).max(4),
                        predictor,
                    )),
                ),
                // The 2D torus runs on the transport's own nodes (MPI's shared-memory
                // groups; one node for threads), not on a guessed layout.
                (Some(AllreduceAlgo::Torus2d { .. }), _, _) => {
                    (Some(collectives::comm::nodes::torus2d(comm)?), None)
                }
                other => (*other.0, *other.1),
            };
            let t = match (&ar, &ag) {
                (Some(a), _) => {
                    let mut buf = vec![1.0f32 + comm.rank() as f32; bytes / 4];
                    world_time(comm, reps(bytes, quick), || {
                        allreduce(comm, &mut buf, *a, &opts)?;
                        Ok(())
                    })?
                }
                (_, Some(a)) => {
                    let per = (bytes / 4 / p).max(1);
                    let mine = vec![comm.rank() as f32; per];
                    let mut all = vec![0.0f32; per * p];
                    world_time(comm, reps(bytes, quick), || {
                        allgather(comm, &mine, &mut all, *a, &opts)?;
                        Ok(())
                    })?
                }
                _ => continue,
            };
            out.push((name.clone(), bytes, t));
            if comm.rank() == 0 {
                pb.inc(1);
            }
        }
    }
    Ok(out)
}

/// The MPI library's own collective at the same sizes, on every rank (rank 0 keeps times).
#[cfg(feature = "mpi")]
fn native(ctx: &Ctx, op: Op, sizes: &[usize], quick: bool) -> Result<Times, BoxErr> {
    use mpi::collective::{CommunicatorCollectives, SystemOperation};
    let Some(c) = &ctx.mpi else { return Ok(vec![]) };
    let raw = c.raw();
    let p = c.size();
    let mut out = Vec::new();
    for &bytes in sizes {
        let t = match op {
            Op::Allreduce => {
                let send = vec![1.0f32; bytes / 4];
                let mut recv = vec![0.0f32; bytes / 4];
                world_time(c, reps(bytes, quick), || {
                    raw.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
                    Ok(())
                })?
            }
            Op::Allgather => {
                let per = (bytes / 4 / p).max(1);
                let send = vec![1.0f32; per];
                let mut recv = vec![0.0f32; per * p];
                world_time(c, reps(bytes, quick), || {
                    raw.all_gather_into(&send[..], &mut recv[..]);
                    Ok(())
                })?
            }
        };
        out.push(("mpi_native".to_string(), bytes, t));
    }
    Ok(out)
}

fn report(
    ctx: &Ctx,
    op: Op,
    p: usize,
    sizes: &[usize],
    times: &Times,
) -> Result<SuiteOutput, BoxErr> {
    let suite = op.name();
    let mut out = SuiteOutput::default();
    let mut cases: Vec<String> = Vec::new();
    for (c, _, _) in times {
        if !cases.contains(c) {
            cases.push(c.clone());
        }
    }
    let busbw = |bytes: usize, t: f64| bytes as f64 * op.bus_factor(p) / t / 1e9;
    for (case, bytes, t) in times {
        let params = [
            ("ranks", j(p)),
            ("bytes", j(bytes)),
            ("backend", j(ctx.backend())),
        ];
        out.record(suite, case, &params, "time_s", *t, "s");
        out.record(suite, case, &params, "busbw_gbs", busbw(*bytes, *t), "GB/s");
    }
    let get = |case: &str, bytes: usize| {
        times
            .iter()
            .find(|(c, b, _)| c == case && *b == bytes)
            .map(|x| x.2)
    };
    let mut rows = Vec::new();
    let mut worst_auto: Option<(f64, usize)> = None;
    for &bytes in sizes {
        let mut row = vec![fmt_bytes(bytes as f64)];
        for c in &cases {
            row.push(
                get(c, bytes)
                    .map(|t| format!("{:.2}", busbw(bytes, t)))
                    .unwrap_or_default(),
            );
        }
        // Best of ours and its ratio to the MPI library's own collective.
        let best = cases
            .iter()
            .filter(|c| *c != "mpi_native")
            .filter_map(|c| get(c, bytes).map(|t| (c.clone(), t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((bc, bt)) = &best {
            row.push(bc.clone());
            row.push(match get("mpi_native", bytes) {
                Some(nt) => format!("{:.2}", nt / bt),
                None => "–".into(),
            });
        }
        let auto_ratio = get("mpi_native", bytes)
            .zip(get(AUTO, bytes))
            .map(|(n, a)| n / a);
        row.push(auto_ratio.map_or("–".into(), |r| format!("{r:.2}")));
        if let Some(r) = auto_ratio {
            worst_auto = Some(worst_auto.map_or(
                (r, bytes),
                |w: (f64, usize)| if r < w.0 { (r, bytes) } else { w },
            ));
        }
        rows.push(row);
    }
    if let Some((r, bytes)) = worst_auto {
        out.headlines.push(Headline {
            source: "this project's goal (not a paper claim)".into(),
            claim: format!(
                "{suite} with the automatic choice reaches ≥ 1.0× the MPI library's bus bandwidth at every size, P = {p}"
            ),
            ours: format!(
                "worst ratio {r:.2}× at {} ({} calibration)",
                fmt_bytes(bytes as f64),
                if calibration(p).is_some() { "with the" } else { "without a" }
            ),
            reproduced: Some(r >= 1.0),
        });
    }
    let mut header: Vec<&str> = vec!["bytes"];
    header.extend(cases.iter().map(|s| s.as_str()));
    header.extend([
        "best (ours)",
        "best / mpi_native busbw",
        "auto / mpi_native busbw",
    ]);
    let series: Vec<Series> = cases
        .iter()
        .map(|c| Series {
            label: c.clone(),
            points: sizes
                .iter()
                .filter_map(|&b| get(c, b).map(|t| (b as f64, busbw(b, t))))
                .collect(),
        })
        .collect();
    let plot_name = format!("{suite}_busbw.svg");
    plot::lines(
        &ctx.out.join(&plot_name),
        &format!("{suite}, P = {p} ({})", ctx.backend()),
        "message bytes",
        "bus bandwidth (GB/s)",
        true,
        false,
        &series,
    )
    .map_err(|e| -> BoxErr { e.to_string().into() })?;
    let big: Vec<&Vec<String>> = rows
        .iter()
        .zip(sizes)
        .filter(|(_, &b)| b >= 1 << 20)
        .map(|(r, _)| r)
        .collect();
    if let Some(last) = big.last() {
        let n = last.len();
        out.findings.push(format!(
            "{suite} at P = {p} on {}: fastest of ours at {} is {}{}",
            ctx.backend(),
            last[0],
            last[n - 2],
            if last[n - 1] != "–" {
                format!(", at {}× the bus bandwidth of MPI's own", last[n - 1])
            } else {
                String::new()
            }
        ));
    }
    let native_note = if cases.iter().any(|c| c == "mpi_native") {
        "`mpi_native` is the MPI library's own collective, measured in the same run."
    } else {
        "Run `cargo xtask bench --mpi -n P` to measure the MPI library's own collective (`mpi_native`) beside ours."
    };
    out.markdown = format!(
        "Bus bandwidth in GB/s (nccl-tests convention: {}) of every {suite} algorithm at P = {p} \
         on the `{}` transport; median of several runs, each the slowest rank's time. For \
         allgather, `bytes` is the gathered total. {native_note}\n\n{}\n![{suite}]({plot_name})\n",
        match op {
            Op::Allreduce => "bytes × 2(P−1)/P / time",
            Op::Allgather => "bytes × (P−1)/P / time",
        },
        ctx.backend(),
        table(&header, &rows)
    );
    Ok(out)
}
