//! The benchmark suites. Each returns its records, its Markdown section and its findings;
//! under MPI, ranks other than 0 return `None` after taking part.

use indicatif::ProgressBar;

use super::{BoxErr, Ctx, SuiteOutput};

mod datacache;
mod dense;
mod gpu;
mod lars;
mod plan;
mod simulate;
mod sparse;
mod topk;
mod train;

pub(crate) use dense::load_calibration;

/// Runs the suite called `name`.
pub fn run(name: &str, ctx: &Ctx, pb: &ProgressBar) -> Result<Option<SuiteOutput>, BoxErr> {
    // Under MPI only the communicating suites need every rank.
    let everyone = matches!(
        name,
        "allreduce" | "allgather" | "reduce_scatter" | "sparse"
    );
    if !everyone && ctx.rank() != 0 {
        return Ok(None);
    }
    match name {
        "topk" => topk::run(ctx, pb).map(Some),
        "allreduce" => dense::run(ctx, pb, dense::Op::Allreduce),
        "allgather" => dense::run(ctx, pb, dense::Op::Allgather),
        "reduce_scatter" => dense::run(ctx, pb, dense::Op::ReduceScatter),
        "sparse" => sparse::run(ctx, pb),
        "simulate" => simulate::run(ctx, pb).map(Some),
        "plan" => plan::run(ctx, pb).map(Some),
        "train" => train::run(ctx, pb).map(Some),
        "lars" => lars::run(ctx, pb).map(Some),
        "datacache" => datacache::run(ctx, pb).map(Some),
        "gpu" => gpu::run(ctx, pb).map(Some),
        other => Err(format!("unknown suite {other}").into()),
    }
}

/// A deterministic pseudo-random gradient: roughly normal values, different per seed.
pub fn gradient(d: usize, seed: u64) -> Vec<f32> {
    let mut g = vec![0.0; d];
    fill_gradient(&mut g, seed);
    g
}

/// Overwrites `g` with the draw `seed` of [`gradient`].
pub fn fill_gradient(g: &mut [f32], seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for v in g {
        // Sum of four uniforms: cheap and bell-shaped.
        let mut acc = 0.0f32;
        for _ in 0..4 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            acc += (s >> 40) as f32 / (1u64 << 24) as f32;
        }
        *v = acc - 2.0;
    }
}

/// `serde_json` value helper.
pub fn j<T: serde::Serialize>(v: T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}
