//! The warm start against a cold selector along a training-like run: a fresh gradient
//! every step (uniform, xorshift), error feedback never reset, exact top-k with the warm
//! start on and off on the same gradients, the two steps timed in alternating order.
//!
//! ```text
//! cargo run --release -p sparsify --example warm_vs_cold -- LOG2_D DENSITY STEPS
//! cargo run --release -p sparsify --example warm_vs_cold -- 18 0.001 2000
//! ```
//!
//! Prints the median step time of each over the first tenth of the steps (the residual
//! still grows there) and over the rest, and the warm selector's warm calls and misses.

use std::time::Instant;

use sparsify::{ErrorFeedback, ExactTopK, Selector};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let (Ok(log2_d), Ok(density), Ok(steps)) = (
        arg(1, "18").parse::<u32>(),
        arg(2, "0.001").parse::<f64>(),
        arg(3, "2000").parse::<usize>(),
    ) else {
        eprintln!("usage: warm_vs_cold LOG2_D DENSITY STEPS");
        std::process::exit(2);
    };
    let valid = (10..=28).contains(&log2_d) && density > 0.0 && density < 1.0 && steps >= 20;
    if !valid {
        eprintln!("need 10 <= LOG2_D <= 28, 0 < DENSITY < 1 and STEPS >= 20");
        std::process::exit(2);
    }
    let d = 1usize << log2_d;
    let k = ((d as f64 * density) as usize).max(1);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut grad = vec![0f32; d];
    let mut warm = ExactTopK::new();
    let mut cold = ExactTopK::new().with_warm_start(false);
    let (mut ef_warm, mut ef_cold) = (ErrorFeedback::new(d), ErrorFeedback::new(d));
    let (mut t_warm, mut t_cold) = (Vec::new(), Vec::new());
    for step in 0..steps {
        for x in grad.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *x = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        }
        for warm_now in [step % 2 == 0, step % 2 == 1] {
            let (sel, ef, times) = if warm_now {
                (&mut warm, &mut ef_warm, &mut t_warm)
            } else {
                (&mut cold, &mut ef_cold, &mut t_cold)
            };
            let t = Instant::now();
            let (sg, _) = ef.step(sel, &grad, k).expect("finite gradient");
            times.push(t.elapsed().as_secs_f64());
            sel.recycle(sg);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] * 1e6
    };
    let cut = steps / 10;
    for (name, r) in [("first tenth", 0..cut), ("the rest", cut..steps)] {
        println!(
            "{name}: median warm {:.2} µs, cold {:.2} µs",
            median(&t_warm[r.clone()]),
            median(&t_cold[r])
        );
    }
    let (calls, missed) = warm.warm_starts().unwrap_or((0, 0));
    println!("warm calls {calls}, missed {missed} (d = 2^{log2_d}, k = {k}, {steps} steps)");
}
