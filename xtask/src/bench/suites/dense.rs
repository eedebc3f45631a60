//! `allreduce`, `allgather` and `reduce_scatter`: every dense algorithm at every message
//! size, time and bus bandwidth (nccl-tests convention), plus `auto`, the automatic choice
//! (`OnlineChoice`: the calibration's pick, re-ranked from its own calls as it runs);
//! under MPI also `mpi_native`, the MPI library's own collective, and `mpi_native_again`,
//! the same call on its own buffers: an A/A control whose ratio to `mpi_native` shows how
//! far two measurements of one function differ in this run. At each size the cases are
//! timed interleaved, repetition by repetition, so a change in the machine's load affects
//! every case alike, and the ratios to `mpi_native` are taken repetition by repetition.

use std::cell::RefCell;
use std::rc::Rc;

use collectives::dense::{
    allgather, allreduce, reduce_scatter, AllgatherAlgo, AllreduceAlgo, DenseOptions, OnlineChoice,
    ReduceScatterAlgo,
};
use collectives::Communicator;
use indicatif::ProgressBar;

use super::super::plot::{self, Series};
use super::super::report::{bytes as fmt_bytes, table};
use super::super::timing::{paired_ratio, world_rounds_interleaved};
use super::j;
use crate::bench::{BoxErr, Ctx, Headline, SuiteOutput};
use cost_model::median;

/// Which collective.
#[derive(Clone, Copy, PartialEq)]
pub enum Op {
    Allreduce,
    Allgather,
    ReduceScatter,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Allgather => "allgather",
            Op::ReduceScatter => "reduce_scatter",
        }
    }

    /// nccl-tests bus bandwidth factor: allreduce 2(P−1)/P, allgather and reduce-scatter
    /// (P−1)/P.
    fn bus_factor(self, p: usize) -> f64 {
        let p = p as f64;
        match self {
            Op::Allreduce => 2.0 * (p - 1.0) / p,
            Op::Allgather | Op::ReduceScatter => (p - 1.0) / p,
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

/// Rounds at `bytes`: [`collectives::calibrate::reps_for`], at least 21. With 5, the
/// median at 16 and 64 MiB moved by 25 % between two rows of the same algorithm on a
/// shared 2-core machine; with 11, the A/A control (MPI's call against itself) still came
/// out at 0.80× at 64 MiB, P = 2, and the automatic choice, which learns from its own
/// timed calls too, had few of them there.
fn reps(bytes: usize, quick: bool) -> usize {
    if quick {
        3.max(((4usize << 20) / bytes.max(1)).min(20))
    } else {
        collectives::calibrate::reps_for(bytes, 21)
    }
}

/// The row of the automatic choice (`choose_allreduce` / `choose_allgather` per size).
const AUTO: &str = "auto";

/// The calibration the automatic choice uses: `--calibration` (an error unless it was taken
/// on this transport at this P), else `calibration.json` in the working directory when it
/// matches, else none (the chooser's built-in rules).
fn calibration(ctx: &Ctx, p: usize) -> Result<Option<cost_model::Calibration>, BoxErr> {
    if let Some(path) = &ctx.calibration {
        return Ok(Some(load_calibration(path, p, ctx.backend())?));
    }
    Ok(cost_model::Calibration::load("calibration.json")
        .ok()
        .filter(|c| c.ranks == p && c.backend == ctx.backend()))
}

/// The calibration at `path`, or why it cannot rank this run's algorithms: unreadable, or
/// taken at another P or on another transport than `p` ranks of `backend`.
pub(crate) fn load_calibration(
    path: &std::path::Path,
    p: usize,
    backend: &str,
) -> Result<cost_model::Calibration, BoxErr> {
    let c = cost_model::Calibration::load(path)?;
    if c.ranks != p || c.backend != backend {
        return Err(format!(
            "--calibration {} was taken on {} ranks of `{}`, but this run has {p} ranks of \
             `{backend}`: calibrate at this P (`cargo xtask calibrate`, under mpirun for MPI)",
            path.display(),
            c.ranks,
            c.backend,
        )
        .into());
    }
    Ok(c)
}

/// One algorithm of the suite's collective.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Algo {
    Allreduce(AllreduceAlgo),
    Allgather(AllgatherAlgo),
    ReduceScatter(ReduceScatterAlgo),
}

/// A row of the table: a named algorithm, or the automatic choice (`None`).
type Case = (String, Option<Algo>);

/// Our algorithms of `op`, then `shared_memory` (when `shared`: the world has a shared
/// segment), then `library` (our entry point to the MPI library's collective, when
/// `library`: what the automatic choice runs when it picks the library), then `auto`.
fn algos(op: Op, p: usize, shared: bool, library: bool) -> Vec<Case> {
    let mut v: Vec<Case> = match op {
        Op::Allreduce => AllreduceAlgo::all(p)
            .into_iter()
            .map(|a| (a.name().to_string(), Some(Algo::Allreduce(a))))
            .collect(),
        Op::Allgather => AllgatherAlgo::ALL
            .iter()
            .map(|a| (a.name().to_string(), Some(Algo::Allgather(*a))))
            .collect(),
        Op::ReduceScatter => ReduceScatterAlgo::ALL
            .iter()
            .map(|a| (a.name().to_string(), Some(Algo::ReduceScatter(*a))))
            .collect(),
    };
    if shared {
        let shm = match op {
            Op::Allreduce => Algo::Allreduce(AllreduceAlgo::SharedMemory),
            Op::Allgather => Algo::Allgather(AllgatherAlgo::SharedMemory),
            Op::ReduceScatter => Algo::ReduceScatter(ReduceScatterAlgo::SharedMemory),
        };
        v.push((algo_name(&shm), Some(shm)));
    }
    if library {
        let lib = match op {
            Op::Allreduce => Algo::Allreduce(AllreduceAlgo::Library),
            Op::Allgather => Algo::Allgather(AllgatherAlgo::Library),
            Op::ReduceScatter => Algo::ReduceScatter(ReduceScatterAlgo::Library),
        };
        v.push((LIBRARY.to_string(), Some(lib)));
    }
    v.push((AUTO.to_string(), None));
    v
}

/// The row of the `Library` algorithm.
const LIBRARY: &str = "library";

/// The MPI library's collective, and the same call again (the A/A control).
const NATIVE: &str = "mpi_native";
const NATIVE_AGAIN: &str = "mpi_native_again";

/// Per (case, bytes): seconds per call in every repetition.
type Times = Vec<(String, usize, Vec<f64>)>;

/// Elements of the suite's buffer at `bytes` on `p` ranks: a multiple of P, so that every
/// rank's block (all-gather contribution, reduce-scatter result) is the same size for our
/// algorithms and the MPI library's alike.
fn elems(bytes: usize, p: usize) -> usize {
    ((bytes / 4) / p).max(1) * p
}

pub fn run(ctx: &Ctx, pb: &ProgressBar, op: Op) -> Result<Option<SuiteOutput>, BoxErr> {
    let sizes = sizes(ctx.quick);
    let p = ctx.world_size();
    #[cfg(feature = "mpi")]
    let (library, shared) = match &ctx.mpi {
        Some(c) => (true, c.shared_segment().is_some()),
        None => (false, true),
    };
    // A thread world of the bench is one node: its ranks share a segment.
    #[cfg(not(feature = "mpi"))]
    let (library, shared) = (false, true);
    let list = algos(op, p, shared, library);
    let cal = calibration(ctx, p)?;
    pb.set_length((sizes.len() * list.len()) as u64);
    let quick = ctx.quick;
    #[cfg(feature = "mpi")]
    let times = match &ctx.mpi {
        Some(c) => {
            let t = measure(c, op, &sizes, &list, cal.as_ref(), quick, pb, Some(c))?;
            (c.rank() == 0).then_some(t)
        }
        None => {
            ctx.on_world(|comm| measure(comm, op, &sizes, &list, cal.as_ref(), quick, pb, None))?
        }
    };
    #[cfg(not(feature = "mpi"))]
    let times = ctx.on_world(|comm| measure(comm, op, &sizes, &list, cal.as_ref(), quick, pb))?;
    let Some((times, chosen)) = times else {
        return Ok(None);
    };
    Ok(Some(report(
        ctx,
        op,
        p,
        &sizes,
        &times,
        &chosen,
        cal.is_some(),
    )?))
}

/// The MPI world, when the suite runs under mpirun: its own collective is timed beside ours.
#[cfg(feature = "mpi")]
type Native<'a> = Option<&'a collectives::MpiComm>;

/// A timed case: its row name and the closure that runs the collective once.
type Runner<'a> = (String, Box<dyn FnMut() -> Result<(), BoxErr> + 'a>);

#[allow(clippy::too_many_arguments)]
fn measure(
    comm: &dyn Communicator,
    op: Op,
    sizes: &[usize],
    list: &[Case],
    cal: Option<&cost_model::Calibration>,
    quick: bool,
    pb: &ProgressBar,
    #[cfg(feature = "mpi")] native: Native,
) -> Result<(Times, Vec<(usize, String)>), BoxErr> {
    let p = comm.size();
    let predictor = cal.map(|c| c as &dyn collectives::dense::Predictor);
    // The 2D torus runs on the transport's own nodes (MPI's shared-memory groups; one
    // node for threads), not on a guessed layout: resolved once (a collective call).
    let torus = if list
        .iter()
        .any(|(_, a)| matches!(a, Some(Algo::Allreduce(AllreduceAlgo::Torus2d { .. }))))
    {
        Algo::Allreduce(collectives::comm::nodes::torus2d(comm)?)
    } else {
        Algo::Allreduce(AllreduceAlgo::Ring)
    };
    let mut out = Vec::new();
    let mut chosen = Vec::new();
    for &bytes in sizes {
        if comm.rank() == 0 {
            pb.set_message(fmt_bytes(bytes as f64));
        }
        let n = elems(bytes, p);
        let mut runners: Vec<Runner> = Vec::new();
        // The automatic choice: what a caller gets without naming an algorithm, the online
        // choice, starting from the calibration's pick and re-ranked from its own calls.
        let online = Rc::new(RefCell::new(OnlineChoice::new()));
        for (name, algo) in list {
            let runner = match algo {
                None => online_runner(comm, op, n, predictor, Rc::clone(&online)),
                Some(Algo::Allreduce(AllreduceAlgo::Torus2d { .. })) => runner(comm, torus, n),
                Some(a) => runner(comm, *a, n),
            };
            runners.push((name.clone(), runner));
        }
        #[cfg(feature = "mpi")]
        if let Some(c) = native {
            runners.push((NATIVE.into(), native_runner(c, op, n)));
            runners.push((NATIVE_AGAIN.into(), native_runner(c, op, n)));
        }
        // The online choice's first calls run both candidates half the time, up to the
        // ranks' first agreements on their times, then explore less and less while the
        // choice stays (`OnlineChoice::learning_calls`): untimed, as a training loop's
        // first steps,
        // so that `auto` is timed in its steady state (which still runs the other candidate
        // now and then). Each after a barrier, as the timed calls below: at P = 2 the
        // shared-memory all-gather of 256 KiB ran 1.5× faster than MPI's call started from a
        // barrier, and as fast back to back, so calls back to back taught the choice
        // another ranking than the one it was timed on.
        // The bytes the online choice keys this size by (per rank for the all-gather).
        let key = match op {
            Op::Allgather => 4 * (n / p),
            Op::Allreduce | Op::ReduceScatter => 4 * n,
        };
        for (_, f) in runners.iter_mut().filter(|(name, _)| name == AUTO) {
            for _ in 0..OnlineChoice::learning_calls(key) {
                comm.barrier()?;
                f()?;
            }
        }
        let reps = reps(bytes, quick);
        let mut fs: Vec<&mut (dyn FnMut() -> Result<(), BoxErr> + '_)> =
            runners.iter_mut().map(|(_, f)| f.as_mut()).collect();
        let calls = collectives::calibrate::calls_per_timing(bytes);
        let t = world_rounds_interleaved(comm, reps, calls, &mut fs)?;
        for ((name, _), t) in runners.iter().zip(t) {
            out.push((name.clone(), bytes, t));
        }
        if list.iter().any(|(_, a)| a.is_none()) {
            let online = online.borrow();
            let in_use = match op {
                Op::Allreduce => online.allreduce_in_use(key).map(|a| a.name()),
                Op::Allgather => online.allgather_in_use(key).map(|a| a.name()),
                Op::ReduceScatter => online.reduce_scatter_in_use(key).map(|a| a.name()),
            };
            chosen.push((bytes, in_use.unwrap_or("none").to_string()));
        }
        if comm.rank() == 0 {
            pb.inc(list.len() as u64);
        }
    }
    Ok((out, chosen))
}

fn algo_name(a: &Algo) -> String {
    match a {
        Algo::Allreduce(a) => a.name().to_string(),
        Algo::Allgather(a) => a.name().to_string(),
        Algo::ReduceScatter(a) => a.name().to_string(),
    }
}

/// A buffer of `n` floats that starts on a page boundary. Every case's buffers are placed
/// alike, so two cases differ by what they run and not by where the allocator put their
/// buffers: with malloc's placement, two cases making the very same MPI call (the `library`
/// and `auto` rows at 64 KiB, P = 4) measured 22 % apart in one run, and an A/A pair of
/// `MPI_Reduce_scatter_block` 0.54× at 256 KiB–16 MiB in another.
struct Paged {
    v: Vec<f32>,
    off: usize,
    n: usize,
}

impl Paged {
    const PAGE_FLOATS: usize = 4096 / std::mem::size_of::<f32>();

    fn new(value: f32, n: usize) -> Self {
        let v = vec![value; n + Self::PAGE_FLOATS];
        let off = (v.as_ptr() as usize).next_multiple_of(4096) - v.as_ptr() as usize;
        Paged {
            v,
            off: off / std::mem::size_of::<f32>(),
            n,
        }
    }

    fn get(&self) -> &[f32] {
        &self.v[self.off..self.off + self.n]
    }

    fn get_mut(&mut self) -> &mut [f32] {
        &mut self.v[self.off..self.off + self.n]
    }
}

/// One of our collectives on a buffer of `n` elements (all-gather: `n / P` per rank).
fn runner<'a>(
    comm: &'a dyn Communicator,
    algo: Algo,
    n: usize,
) -> Box<dyn FnMut() -> Result<(), BoxErr> + 'a> {
    let p = comm.size();
    let opts = DenseOptions::default().unchecked();
    match algo {
        Algo::Allreduce(a) => {
            let mut buf = Paged::new(1.0 + comm.rank() as f32, n);
            Box::new(move || Ok(allreduce(comm, buf.get_mut(), a, &opts)?))
        }
        Algo::Allgather(a) => {
            let mine = Paged::new(comm.rank() as f32, n / p);
            let mut all = Paged::new(0.0, n);
            Box::new(move || Ok(allgather(comm, mine.get(), all.get_mut(), a, &opts)?))
        }
        Algo::ReduceScatter(a) => {
            let mut buf = Paged::new(1.0 + comm.rank() as f32, n);
            Box::new(move || {
                reduce_scatter(comm, buf.get_mut(), a, &opts)?;
                Ok(())
            })
        }
    }
}

/// The automatic choice ([`OnlineChoice`], shared with the caller, who reads what it ended
/// on) on a buffer of `n` elements, as [`runner`].
fn online_runner<'a>(
    comm: &'a dyn Communicator,
    op: Op,
    n: usize,
    predictor: Option<&'a dyn collectives::dense::Predictor>,
    online: Rc<RefCell<OnlineChoice>>,
) -> Box<dyn FnMut() -> Result<(), BoxErr> + 'a> {
    let p = comm.size();
    let opts = DenseOptions::default().unchecked();
    match op {
        Op::Allreduce => {
            let mut buf = Paged::new(1.0 + comm.rank() as f32, n);
            Box::new(move || {
                Ok(online
                    .borrow_mut()
                    .allreduce(comm, buf.get_mut(), predictor, &opts)?)
            })
        }
        Op::Allgather => {
            let mine = Paged::new(comm.rank() as f32, n / p);
            let mut all = Paged::new(0.0, n);
            Box::new(move || {
                Ok(online.borrow_mut().allgather(
                    comm,
                    mine.get(),
                    all.get_mut(),
                    predictor,
                    &opts,
                )?)
            })
        }
        Op::ReduceScatter => {
            let mut buf = Paged::new(1.0 + comm.rank() as f32, n);
            Box::new(move || {
                online
                    .borrow_mut()
                    .reduce_scatter(comm, buf.get_mut(), predictor, &opts)?;
                Ok(())
            })
        }
    }
}

/// The MPI library's own collective on the same buffer sizes.
#[cfg(feature = "mpi")]
fn native_runner(
    c: &collectives::MpiComm,
    op: Op,
    n: usize,
) -> Box<dyn FnMut() -> Result<(), BoxErr> + '_> {
    use mpi::collective::{CommunicatorCollectives, SystemOperation};
    let raw = c.raw();
    let p = c.size();
    match op {
        // In place, as PyTorch's MPI process group and Horovod call it on a gradient buffer
        // (and as our `library` algorithm does): with separate buffers the library reads one
        // more buffer per call, and the baseline would look slower than a framework's.
        // Separate buffers only where the library's `MPI_IN_PLACE` is not known.
        Op::Allreduce => {
            let mut buf = Paged::new(1.0, n);
            let mut recv = Paged::new(0.0, n);
            Box::new(move || {
                if !collectives::comm::mpi::allreduce_in_place_raw(raw, buf.get_mut())? {
                    raw.all_reduce_into(buf.get(), recv.get_mut(), SystemOperation::sum());
                }
                Ok(())
            })
        }
        Op::Allgather => {
            let send = Paged::new(1.0, n / p);
            let mut recv = Paged::new(0.0, n);
            Box::new(move || {
                raw.all_gather_into(send.get(), recv.get_mut());
                Ok(())
            })
        }
        Op::ReduceScatter => {
            let send = Paged::new(1.0, n);
            let mut recv = Paged::new(0.0, n / p);
            Box::new(move || {
                raw.reduce_scatter_block_into(send.get(), recv.get_mut(), SystemOperation::sum());
                Ok(())
            })
        }
    }
}

fn report(
    ctx: &Ctx,
    op: Op,
    p: usize,
    sizes: &[usize],
    times: &Times,
    chosen: &[(usize, String)],
    calibrated: bool,
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
        let t = median(t);
        out.record(suite, case, &params, "time_s", t, "s");
        out.record(suite, case, &params, "busbw_gbs", busbw(*bytes, t), "GB/s");
    }
    let rounds = |case: &str, bytes: usize| {
        times
            .iter()
            .find(|(c, b, _)| c == case && *b == bytes)
            .map(|x| x.2.as_slice())
    };
    let get = |case: &str, bytes: usize| rounds(case, bytes).map(median);
    // `case`'s bus bandwidth over the MPI library's, repetition by repetition.
    let to_native = |case: &str, bytes: usize| {
        rounds(NATIVE, bytes)
            .zip(rounds(case, bytes))
            .map(|(n, c)| paired_ratio(n, c))
    };
    let mut rows = Vec::new();
    // (auto / mpi_native, bytes) per size.
    let mut auto_ratios: Vec<(f64, usize)> = Vec::new();
    // The A/A ratios: two calls of the same MPI function, so their spread is this run's
    // noise.
    let mut aa_ratios: Vec<f64> = Vec::new();
    let mut library_picks = 0;
    for &bytes in sizes {
        let mut row = vec![fmt_bytes(bytes as f64)];
        for c in &cases {
            row.push(
                get(c, bytes)
                    .map(|t| format!("{:.2}", busbw(bytes, t)))
                    .unwrap_or_default(),
            );
        }
        // Best of ours in hindsight (a named algorithm) and its ratio to the MPI library's.
        let best = cases
            .iter()
            .filter(|c| ![NATIVE, NATIVE_AGAIN, LIBRARY, AUTO].contains(&c.as_str()))
            .filter_map(|c| get(c, bytes).map(|t| (c.clone(), t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((bc, _)) = &best {
            row.push(bc.clone());
            row.push(to_native(bc, bytes).map_or("–".into(), |r| format!("{r:.2}")));
        }
        row.push(
            chosen
                .iter()
                .find(|(b, _)| *b == bytes)
                .map_or(String::new(), |(_, a)| a.clone()),
        );
        let auto_ratio = to_native(AUTO, bytes);
        row.push(auto_ratio.map_or("–".into(), |r| format!("{r:.2}")));
        let aa = to_native(NATIVE_AGAIN, bytes);
        row.push(aa.map_or("–".into(), |r| format!("{r:.2}")));
        aa_ratios.extend(aa);
        library_picks += usize::from(chosen.iter().any(|(b, a)| *b == bytes && a == "library"));
        auto_ratios.extend(auto_ratio.map(|r| (r, bytes)));
        rows.push(row);
    }
    let worst_auto = auto_ratios
        .iter()
        .copied()
        .reduce(|w, x| if x.0 < w.0 { x } else { w });
    if let Some((r, bytes)) = worst_auto {
        out.headlines.push(Headline {
            source: "this project's goal (not a paper claim)".into(),
            claim: format!(
                "{suite} with the automatic choice reaches ≥ 1.0× the MPI library's bus bandwidth at every size, P = {p}"
            ),
            ours: format!(
                "worst ratio {r:.2}× at {} ({} calibration); below 1.0 at {} of {} sizes; the \
                 choice is the MPI library itself at {library_picks}{}",
                fmt_bytes(bytes as f64),
                if calibrated { "with the" } else { "without a" },
                auto_ratios.iter().filter(|x| x.0 < 1.0).count(),
                sizes.len(),
                match aa_ratios.iter().copied().reduce(f64::min) {
                    Some(lo) => format!(
                        "; the A/A control (MPI's call against itself, same rounds) spans \
                         {lo:.2}–{:.2}×, and {} sizes fall below its low end",
                        aa_ratios.iter().copied().fold(lo, f64::max),
                        auto_ratios.iter().filter(|x| x.0 < lo).count(),
                    ),
                    None => String::new(),
                }
            ),
            reproduced: Some(r >= 1.0),
        });
    }
    let mut header: Vec<&str> = vec!["bytes"];
    header.extend(cases.iter().map(|s| s.as_str()));
    header.extend([
        "best (ours)",
        "best / mpi_native busbw",
        "auto picks",
        "auto / mpi_native busbw",
        "A/A: mpi_native_again / mpi_native busbw",
    ]);
    let series: Vec<Series> = cases
        .iter()
        .filter(|c| *c != NATIVE_AGAIN)
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
            last[n - 5],
            if last[n - 4] != "–" {
                format!(", at {}× the bus bandwidth of MPI's own", last[n - 4])
            } else {
                String::new()
            }
        ));
    }
    let native_note = if cases.iter().any(|c| c == NATIVE) {
        "`mpi_native` is the MPI library's own collective, measured in the same run; \
         `mpi_native_again` is the same call on its own buffers, an A/A control. The ratios \
         to `mpi_native` are medians of the per-repetition ratios (each repetition times all \
         cases in turn); the A/A column shows how far two measurements of one function \
         differ in this run."
    } else {
        "Run `cargo xtask bench --mpi -n P` to measure the MPI library's own collective (`mpi_native`) beside ours."
    };
    out.markdown = format!(
        "Bus bandwidth in GB/s (nccl-tests convention: {}) of every {suite} algorithm at P = {p} \
         on the `{}` transport; median of several runs, each the slowest rank's time, the \
         cases timed interleaved at each size. For allgather, `bytes` is the gathered total; \
         for reduce_scatter, the reduced buffer. `auto` is the automatic choice, \
         `OnlineChoice`: it starts from the pick {}, and re-ranks that pick, the \
         library's collective, the shared-memory algorithm and the best of ours from the \
         timings of its own calls, agreed across ranks, running the others in turn in \
         bursts of {} calls (each a burst in {} × m calls for m others, in {} × m while its \
         time is within {}× of the one in use, in {} × m up to the ranks' {}th agreement; \
         past that, each agreement that keeps the one in use doubles these intervals, up \
         to {}×) and leaving the first {} calls after each change uncounted. It is timed after \
         those first agreements and the doublings (its calls up to them untimed, as a \
         training loop's first steps); its \
         time includes the later bursts and the agreements. `auto picks` names what it used \
         at the end. {native_note}\n\n{}\n![{suite}]({plot_name})\n",
        match op {
            Op::Allreduce => "bytes × 2(P−1)/P / time",
            Op::Allgather | Op::ReduceScatter => "bytes × (P−1)/P / time",
        },
        ctx.backend(),
        if calibrated {
            format!(
                "of the calibration's fits, the MPI library's own collective among the \
                 candidates under mpirun, ours picked only when predicted {:.0} % faster",
                collectives::dense::LIBRARY_MARGIN * 100.0
            )
        } else {
            "of the chooser's built-in rules (no calibration of this transport at this P)".into()
        },
        collectives::dense::EXPLORE_BURST,
        collectives::dense::EXPLORE_EVERY,
        collectives::dense::EXPLORE_CLOSE,
        collectives::dense::CLOSE,
        collectives::dense::EXPLORE_EARLY,
        collectives::dense::LEARNING_AGREEMENTS,
        collectives::dense::EXPLORE_LONGEST / collectives::dense::EXPLORE_CLOSE,
        collectives::dense::SETTLE_CALLS,
        table(&header, &rows)
    );
    Ok(out)
}

#[cfg(test)]
mod calibration_tests {
    use super::load_calibration;

    /// A valid calibration taken on 4 ranks of `thread`, written to a file of its own.
    fn written_calibration() -> std::path::PathBuf {
        use cost_model::{fit_linear, Calibration, Link, Sample, Topology};
        let s: Vec<Sample> = [1e3, 1e6]
            .iter()
            .map(|&n| Sample::new(n, 2e-6 + 1e-10 * n))
            .collect();
        let cal = Calibration {
            schema: cost_model::calibration::SCHEMA,
            backend: "thread".into(),
            ranks: 4,
            topology: Topology::flat(4, Link::new(2e-6, 1e-10)).unwrap(),
            pingpong: fit_linear(&s).unwrap(),
            pingpong_piecewise: None,
            reduction: None,
            reduction_piecewise: None,
            collectives: vec![],
            topk: vec![],
        };
        let path = std::env::temp_dir().join(format!("xtask-cal-{}.json", std::process::id()));
        std::fs::write(&path, cal.to_json()).unwrap();
        path
    }

    /// A calibration ranks a run's algorithms only at its own P and transport; anything
    /// else, or a file that cannot be read, is a typed error that names the path.
    #[test]
    fn a_calibration_is_refused_at_another_p_transport_or_path() {
        let seed = written_calibration();
        let c = load_calibration(&seed, 4, "thread").expect("the calibration matches");
        assert_eq!((c.ranks, c.backend.as_str()), (4, "thread"));
        for (p, backend) in [(3, "thread"), (4, "mpi")] {
            let e = load_calibration(&seed, p, backend).unwrap_err().to_string();
            assert!(e.contains("was taken on 4 ranks of `thread`"), "{e}");
            assert!(
                e.contains(&format!("this run has {p} ranks of `{backend}`")),
                "{e}"
            );
        }
        let missing = seed.with_file_name("no-such-calibration.json");
        std::fs::remove_file(&seed).unwrap();
        let e = load_calibration(&missing, 4, "thread")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no-such-calibration.json") && e.contains("cannot read"),
            "{e}"
        );
    }
}
