//! Deterministic test gradients shared by the sparse property tests.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A gradient for `rank` at `step`: every `period`-th index is ten times larger on every
/// rank (so the ranks' selections overlap), the rest is per-rank noise (so they differ).
pub fn structured(seed: u64, rank: usize, step: usize, d: usize, period: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((rank as u64) << 32) ^ ((step as u64) << 48));
    (0..d)
        .map(|i| {
            let base = if i % period == 0 { 1.0 } else { 0.1 };
            base * rng.gen_range(-1.0f32..1.0)
        })
        .collect()
}
