//! End-to-end tests across the workspace crates live in `tests/`; this library holds the
//! helpers they share: deterministic gradient generators, rank runners with a timeout,
//! single-process reference computations (dense averages, an independent TopkA with error
//! feedback, the update implied by mass conservation) and comparisons with tolerances.
//!
//! ```
//! use integration_tests::{grad, mean_f64};
//! let g0 = grad(8, 0, 0, 1);
//! let g1 = grad(8, 1, 0, 1);
//! assert_ne!(g0, g1);
//! let m = mean_f64(&[g0.clone(), g1.clone()]);
//! assert!((m[3] - (g0[3] as f64 + g1[3] as f64) / 2.0).abs() < 1e-12);
//! ```
#![deny(missing_docs)]

use std::time::Duration;

use collectives::{ThreadComm, ThreadConfig};
use sparsify::{ErrorFeedback, ExactTopK};

/// Any error of any crate, so one rank closure can use `?` on all of them.
pub type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// Result with [`AnyError`].
pub type AnyResult<T> = Result<T, AnyError>;

/// Receive timeout of the rank threads in these tests: a bug shows up as a typed timeout
/// within seconds instead of the transport's 60 s default (or a hang).
pub const RANK_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `f` on `p` thread ranks with [`RANK_TIMEOUT`] and returns every rank's value in
/// rank order; panics with the failing rank's error (the test fails with a clear message).
pub fn run_ranks<T, F>(p: usize, f: F) -> Vec<T>
where
    T: Send,
    F: Fn(ThreadComm) -> AnyResult<T> + Sync,
{
    match ThreadComm::run_with(p, ThreadConfig::with_timeout(RANK_TIMEOUT), f) {
        Ok(v) => v,
        Err(e) => panic!("P = {p}: {e}"),
    }
}

/// SplitMix64: a tiny, dependency-free, well-mixed generator step.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(rank: usize, step: usize, seed: u64, i: usize) -> f64 {
    let key = seed
        .wrapping_mul(0x1000_0000_01B3)
        .wrapping_add((rank as u64) << 40)
        .wrapping_add((step as u64) << 24)
        .wrapping_add(i as u64);
    // 53 random bits → [0, 1).
    (splitmix(key) >> 11) as f64 / (1u64 << 53) as f64
}

/// A deterministic gradient of length `d` for (`rank`, `step`, `seed`): values in
/// (−1, 1) with both signs, distinct with overwhelming probability (so top-k has no ties
/// and every implementation selects the same entries), different per rank and step.
pub fn grad(d: usize, rank: usize, step: usize, seed: u64) -> Vec<f32> {
    (0..d)
        .map(|i| (2.0 * unit(rank, step, seed, i) - 1.0) as f32)
        .collect()
}

/// Like [`grad`] but strictly positive (in (0.001, 1.001)), so no sum over ranks is
/// exactly zero and an update's support is the union of the contributions' supports.
pub fn positive_grad(d: usize, rank: usize, step: usize, seed: u64) -> Vec<f32> {
    (0..d)
        .map(|i| (unit(rank, step, seed, i) + 0.001) as f32)
        .collect()
}

/// Splits a flat vector into consecutive tensors of `sizes` (which must sum to its length).
pub fn split(flat: &[f32], sizes: &[usize]) -> Vec<Vec<f32>> {
    assert_eq!(
        flat.len(),
        sizes.iter().sum::<usize>(),
        "split: lengths disagree"
    );
    let mut out = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for &n in sizes {
        out.push(flat[at..at + n].to_vec());
        at += n;
    }
    out
}

/// Concatenates tensors into one flat vector (the inverse of [`split`]).
pub fn flatten(tensors: &[Vec<f32>]) -> Vec<f32> {
    tensors.iter().flatten().copied().collect()
}

/// The bit patterns of `v`, for comparisons that must be exact (replicas stay
/// bit-identical; `-0.0` and NaN payloads count).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Element-wise mean of equally long vectors, accumulated in `f64`.
pub fn mean_f64(vs: &[Vec<f32>]) -> Vec<f64> {
    let d = vs.first().map_or(0, Vec::len);
    let mut out = vec![0.0f64; d];
    for v in vs {
        assert_eq!(v.len(), d, "mean_f64: lengths differ");
        for (o, &x) in out.iter_mut().zip(v) {
            *o += f64::from(x);
        }
    }
    let p = vs.len().max(1) as f64;
    out.iter_mut().for_each(|o| *o /= p);
    out
}

/// Sum of a vector's entries in `f64`.
pub fn sum_f64(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x)).sum()
}

/// Sum of the absolute values in `f64` (the scale a conservation error is measured against).
pub fn abs_sum_f64(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x).abs()).sum()
}

/// Asserts `|got − want| ≤ atol + rtol·|want|` element by element, naming the first
/// offending index in the panic message.
pub fn assert_close(got: &[f32], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= atol + rtol * w.abs(),
            "{what}: entry {i} is {g}, expected {w} (error {err:e})"
        );
    }
}

/// An independent single-process TopkA (OMGS-SGD (Shi et al., INFOCOM 2020) §II-F; SparCML's
/// all-gather of local top-k): every rank keeps its own error feedback, selects its exact top-`k`
/// of `grad + residual` with `sparsify`, and the update is the sum of all selections divided by P,
/// accumulated in `f64`. `grads[r][s]` is rank r's gradient of step s; returns the update of every
/// step.
pub fn topka_reference(grads: &[Vec<Vec<f32>>], k: usize) -> Vec<Vec<f64>> {
    let p = grads.len();
    let steps = grads.first().map_or(0, Vec::len);
    let d = grads.first().and_then(|g| g.first()).map_or(0, Vec::len);
    let mut fbs: Vec<ErrorFeedback> = (0..p).map(|_| ErrorFeedback::new(d)).collect();
    let mut sel = ExactTopK::new();
    (0..steps)
        .map(|s| {
            let mut upd = vec![0.0f64; d];
            for (r, fb) in fbs.iter_mut().enumerate() {
                let (sg, _) = fb
                    .step(&mut sel, &grads[r][s], k)
                    .unwrap_or_else(|e| panic!("reference top-k failed: {e}"));
                for (&i, &v) in sg.indices().iter().zip(sg.values()) {
                    upd[i as usize] += f64::from(v);
                }
            }
            upd.iter_mut().for_each(|u| *u /= p as f64);
            upd
        })
        .collect()
}

/// The update that mass conservation implies for one step:
/// `(Σ_r (grad_r + residual_before_r) − Σ_r residual_after_r) / P`, in `f64`. Any sparse
/// all-reduce that conserves mass (every one but gTopk) must return this (up to `f32`
/// rounding of the terms).
pub fn conservation_update(
    grads: &[Vec<f32>],
    residual_before: &[Vec<f32>],
    residual_after: &[Vec<f32>],
) -> Vec<f64> {
    let p = grads.len();
    let d = grads.first().map_or(0, Vec::len);
    let mut out = vec![0.0f64; d];
    for r in 0..p {
        for i in 0..d {
            out[i] += f64::from(grads[r][i]) + f64::from(residual_before[r][i])
                - f64::from(residual_after[r][i]);
        }
    }
    out.iter_mut().for_each(|o| *o /= p as f64);
    out
}

/// Sets entries with `|x| ≤ eps` to exactly zero. A reference computed from sums and
/// differences (such as [`conservation_update`]) leaves rounding noise (~1e-8) where the
/// real update has an exact zero; an optimizer with a per-element normalisation (LAMB's
/// `m/√v`) would turn that noise into a full-size step, so the reference must be snapped
/// before it is fed to one.
pub fn snap_noise(v: &mut [f64], eps: f64) {
    for x in v.iter_mut() {
        if x.abs() <= eps {
            *x = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_flatten_round_trip() {
        let v: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let parts = split(&v, &[3, 0, 7]);
        assert_eq!(parts[1].len(), 0);
        assert_eq!(flatten(&parts), v);
    }

    #[test]
    fn generators_are_deterministic_and_distinct() {
        assert_eq!(grad(50, 2, 3, 9), grad(50, 2, 3, 9));
        assert_ne!(grad(50, 2, 3, 9), grad(50, 2, 4, 9));
        let g = grad(1000, 0, 0, 1);
        assert!(g.iter().any(|&x| x < 0.0) && g.iter().any(|&x| x > 0.0));
        assert!(positive_grad(1000, 1, 1, 1).iter().all(|&x| x > 0.0));
    }

    #[test]
    fn topka_reference_at_full_density_is_the_mean() {
        let grads: Vec<Vec<Vec<f32>>> = (0..3)
            .map(|r| (0..2).map(|s| grad(20, r, s, 5)).collect())
            .collect();
        let refs = topka_reference(&grads, 20);
        for (s, u) in refs.iter().enumerate() {
            let step: Vec<Vec<f32>> = grads.iter().map(|g| g[s].clone()).collect();
            let m = mean_f64(&step);
            for (a, b) in u.iter().zip(&m) {
                assert!((a - b).abs() < 1e-6);
            }
        }
    }
}
