//! How often a parallel pass started after a serial phase runs on one worker alone, called
//! from outside the global rayon pool (`outside`) or from a thread that joined it with
//! [`sparsify::join_global_pool`] (`joined`), or inside `ThreadPool::install` (`installed`).
//! Run each in its own process:
//!
//! ```text
//! cargo run --release -p sparsify --example pool_wakeup -- outside
//! cargo run --release -p sparsify --example pool_wakeup -- joined
//! cargo run --release -p sparsify --example pool_wakeup -- installed
//! ```
use rayon::prelude::*;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "outside".into());
    match mode.as_str() {
        "joined" => sparsify::join_global_pool(None)?,
        "installed" => {
            let pool = rayon::ThreadPoolBuilder::new().build()?;
            return pool.install(|| run(&mode));
        }
        "outside" => {}
        _ => return Err(format!("mode {mode}: expected outside, joined or installed").into()),
    }
    run(&mode)
}

/// Times the passes; `mode` only labels the output.
fn run(mode: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let n = 1 << 22;
    let g = vec![1.0f32; n];
    let mut r = vec![0.0f32; n];
    // The serial phase between two passes: long enough for the workers to fall asleep.
    let mut other = vec![0.0f32; 16 << 20];
    let (calls, mut one_worker, mut times) = (100, 0, Vec::new());
    let pieces = 2 * sparsify::threads();
    for _ in 0..calls {
        other.iter_mut().for_each(|x| *x += 1.0);
        std::hint::black_box(&other);
        let t = Instant::now();
        let workers: Vec<Option<usize>> = r
            .par_chunks_mut(n / pieces)
            .zip(g.par_chunks(n / pieces))
            .map(|(rp, gp)| {
                rp.iter_mut().zip(gp).for_each(|(x, y)| *x += *y);
                rayon::current_thread_index()
            })
            .collect();
        times.push(t.elapsed().as_secs_f64());
        one_worker += usize::from(workers.iter().all(|w| *w == workers[0]));
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{mode}: {one_worker} of {calls} passes ran on one worker; pass time median {:.0} µs, fastest {:.0} µs ({} threads)",
        times[calls / 2] * 1e6,
        times[0] * 1e6,
        sparsify::threads()
    );
    Ok(())
}
