//! `sparse`: every sparse allreduce at two densities, next to the best dense allreduce:
//! time per step, bytes per rank, rounds, actual density and dropped mass.

use collectives::dense::{allreduce, AllreduceAlgo, DenseOptions};
use collectives::sparse::{build, SparseAlgo};
use collectives::Communicator;
use indicatif::ProgressBar;

use super::super::plot;
use super::super::report::{bytes as fmt_bytes, secs, table};
use super::super::timing::{max_over_ranks, world_time};
use super::{gradient, j};
use crate::bench::{BoxErr, Ctx, SuiteOutput};

const SUITE: &str = "sparse";

/// (case, density, time, bytes sent per rank (max), rounds (max), density actual, mass dropped)
type Row = (String, f64, f64, f64, f64, f64, f64);

pub fn run(ctx: &Ctx, pb: &ProgressBar) -> Result<Option<SuiteOutput>, BoxErr> {
    let d: usize = if ctx.quick { 1 << 20 } else { 1 << 22 };
    let densities = [0.01, 0.001];
    let steps = if ctx.quick { 3 } else { 5 };
    pb.set_length((densities.len() * SparseAlgo::ALL.len() + 1) as u64);
    let rows = ctx.on_world(|comm| measure(comm, d, &densities, steps, pb))?;
    let Some(rows) = rows else { return Ok(None) };
    let p = ctx.world_size();
    let mut out = SuiteOutput::default();
    let mut table_rows = Vec::new();
    for (case, density, t, b, r, da, md) in &rows {
        let params = [
            ("ranks", j(p)),
            ("d", j(d)),
            ("density", j(density)),
            ("backend", j(ctx.backend())),
        ];
        out.record(SUITE, case, &params, "time_s", *t, "s");
        out.record(SUITE, case, &params, "bytes_per_rank", *b, "B");
        out.record(SUITE, case, &params, "rounds", *r, "");
        out.record(SUITE, case, &params, "density_actual", *da, "");
        out.record(SUITE, case, &params, "mass_dropped", *md, "");
        table_rows.push(vec![
            case.clone(),
            density.to_string(),
            secs(*t),
            fmt_bytes(*b),
            format!("{r:.0}"),
            format!("{da:.5}"),
            format!("{md:.3e}"),
        ]);
    }
    for &density in &densities {
        let best = rows
            .iter()
            .filter(|r| r.1 == density && r.0 != "dense")
            .min_by(|a, b| a.2.total_cmp(&b.2));
        let dense = rows.iter().find(|r| r.0 == "dense").map(|r| r.2);
        if let (Some(b), Some(dt)) = (best, dense) {
            out.findings.push(format!(
                "sparse allreduce at P = {p}, d = 2^{}, density {density}: fastest is {} ({}), {:.1}× the dense ring allreduce ({})",
                d.trailing_zeros(),
                b.0,
                secs(b.2),
                dt / b.2,
                secs(dt)
            ));
        }
    }
    let bars: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.1 == densities[0] || r.0 == "dense")
        .map(|r| (r.0.clone(), r.3))
        .collect();
    let plot_name = "sparse_bytes.svg";
    plot::bars(
        &ctx.out.join(plot_name),
        &format!("bytes sent per rank per step, density {}", densities[0]),
        "bytes",
        &bars,
    )
    .map_err(|e| -> BoxErr { e.to_string().into() })?;
    out.markdown = format!(
        "One step of every sparse allreduce (error feedback, selection, communication, residual \
         update) at P = {p}, d = 2^{} on `{}`, median over {steps} steps of the slowest rank, \
         with the largest per-rank bytes and rounds, the actual density of the aggregated \
         update, and the gradient mass a step discarded for good (gTopk only, by design). \
         `dense` is the ring allreduce of the full gradient (its time is measured; its bytes and rounds are the ring's closed form, 2(P−1)/P · 4d bytes and 2(P−1) rounds). ExDyna starts from a threshold taken from its first gradient (`exdyna_warm_start`), since the paper's start value needs hundreds of steps to converge. SparDL (Zhao et al.) Table 1 gives SparDL \
         2⌈log2 P⌉ rounds; TopkA moves (P−1)·k entries per rank.\n\n{}\n![bytes]({plot_name})\n",
        d.trailing_zeros(),
        ctx.backend(),
        table(&["case", "density", "time", "bytes/rank", "rounds", "density actual", "mass dropped"], &table_rows)
    );
    Ok(Some(out))
}

fn measure(
    comm: &dyn Communicator,
    d: usize,
    densities: &[f64],
    steps: usize,
    pb: &ProgressBar,
) -> Result<Vec<Row>, BoxErr> {
    let mut rows = Vec::new();
    let grads: Vec<Vec<f32>> = (0..steps + 1)
        .map(|s| gradient(d, (comm.rank() * 1000 + s) as u64))
        .collect();
    for &density in densities {
        for algo in SparseAlgo::ALL {
            let name = algo.name();
            if comm.rank() == 0 {
                pb.set_message(format!("{name} ρ={density}"));
            }
            let algo = match algo {
                SparseAlgo::ExDyna { .. } => SparseAlgo::ExDyna { warm_start: true },
                a => a,
            };
            let mut algo = match build(algo, comm, d, density) {
                Ok(a) => a,
                // An option that does not fit P (R-SAG with an odd P) is skipped, not fatal.
                Err(collectives::Error::InvalidArgument(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut i = 0;
            let mut last = Default::default();
            let t = world_time(comm, steps, || {
                let (_, st) = algo.step(comm, &grads[i % grads.len()])?;
                i += 1;
                last = st;
                Ok(())
            })?;
            let st: collectives::StepStats = last;
            rows.push((
                name.to_string(),
                density,
                t,
                max_over_ranks(comm, st.bytes_sent as f64)?,
                max_over_ranks(comm, st.rounds as f64)?,
                st.density,
                max_over_ranks(comm, st.mass_dropped.abs())?,
            ));
            if comm.rank() == 0 {
                pb.inc(1);
            }
        }
    }
    let mut buf = grads[0].clone();
    let opts = DenseOptions::default().unchecked();
    let t = world_time(comm, steps, || {
        allreduce(comm, &mut buf, AllreduceAlgo::Ring, &opts)?;
        Ok(())
    })?;
    rows.push((
        "dense".into(),
        1.0,
        t,
        (2 * (comm.size() - 1) * d * 4 / comm.size()) as f64,
        (2 * (comm.size() - 1)) as f64,
        1.0,
        0.0,
    ));
    if comm.rank() == 0 {
        pb.inc(1);
    }
    Ok(rows)
}
