//! Least-squares fitting of the models from measured `(size, time)` samples.
//!
//! Times measured over sizes that span decades carry roughly multiplicative noise, so the
//! fits minimise the *relative* residual `Σ ((pred − t)/t)²` (weighted least squares with
//! weights `1/t²`); an ordinary fit would let the largest sizes swamp α. The reported
//! quality is the ordinary coefficient of determination R² on the raw times and the worst
//! relative residual.

use serde::{Deserialize, Serialize};

use crate::models::{x_log2_x, LinearModel, ReductionModel, TopkModel};
use crate::{Error, Result};

/// One measurement: a size (bytes or elements, as the caller decides) and a time in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Message or tensor size.
    pub size: f64,
    /// Measured time, seconds (> 0).
    pub time_s: f64,
}

impl Sample {
    /// A sample of `size` units measured at `time_s` seconds.
    pub fn new(size: f64, time_s: f64) -> Self {
        Sample { size, time_s }
    }
}

/// How well a model fits its samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FitQuality {
    /// Coefficient of determination on the raw times, `1 − SS_res / SS_tot` (1 when the
    /// times do not vary and are matched exactly).
    pub r2: f64,
    /// Largest `|pred − t| / t` over the samples.
    pub max_rel_residual: f64,
    /// Number of samples (repeats included).
    pub samples: usize,
    /// Number of distinct sizes.
    pub distinct_sizes: usize,
}

/// A fitted model with its quality.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fitted<M> {
    /// The fitted parameters.
    pub model: M,
    /// How well they fit.
    pub quality: FitQuality,
}

fn check_samples(samples: &[Sample]) -> Result<usize> {
    for (i, s) in samples.iter().enumerate() {
        if !(s.size.is_finite() && s.size >= 0.0) {
            return Err(Error::Fit(format!(
                "sample {i} has size {}; sizes must be finite and ≥ 0",
                s.size
            )));
        }
        if !(s.time_s.is_finite() && s.time_s > 0.0) {
            return Err(Error::Fit(format!(
                "sample {i} (size {}) has time {} s; times must be finite and > 0",
                s.size, s.time_s
            )));
        }
    }
    let mut sizes: Vec<f64> = samples.iter().map(|s| s.size).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    if sizes.len() < 2 {
        return Err(Error::Fit(format!(
            "{} samples over {} distinct size(s); at least two distinct sizes are needed",
            samples.len(),
            sizes.len()
        )));
    }
    Ok(sizes.len())
}

/// Quality of predictions `pred` against `samples`.
pub fn quality(samples: &[Sample], pred: impl Fn(f64) -> f64) -> FitQuality {
    let n = samples.len();
    let mean = samples.iter().map(|s| s.time_s).sum::<f64>() / n.max(1) as f64;
    let (mut ss_res, mut ss_tot, mut worst) = (0.0, 0.0, 0.0f64);
    for s in samples {
        let p = pred(s.size);
        ss_res += (p - s.time_s).powi(2);
        ss_tot += (s.time_s - mean).powi(2);
        worst = worst.max((p - s.time_s).abs() / s.time_s);
    }
    let r2 = if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else if ss_res == 0.0 {
        1.0
    } else {
        0.0
    };
    let mut sizes: Vec<f64> = samples.iter().map(|s| s.size).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    FitQuality {
        r2,
        max_rel_residual: worst,
        samples: n,
        distinct_sizes: sizes.len(),
    }
}

/// Solves the weighted least-squares problem `min Σ w_i (x_i·θ − y_i)²` for `K` features by
/// the normal equations with column scaling and partial pivoting. `None` when singular.
fn weighted_lstsq<const K: usize>(rows: &[([f64; K], f64, f64)]) -> Option<[f64; K]> {
    // Column scales keep features of very different magnitudes well conditioned.
    let mut scale = [0.0f64; K];
    for (x, _, w) in rows {
        for j in 0..K {
            scale[j] = scale[j].max((x[j] * w.sqrt()).abs());
        }
    }
    if scale.iter().any(|&s| s == 0.0 || !s.is_finite()) {
        return None;
    }
    let mut a = [[0.0f64; K]; K];
    let mut b = [0.0f64; K];
    for (x, y, w) in rows {
        let xs: [f64; K] = std::array::from_fn(|j| x[j] / scale[j]);
        for i in 0..K {
            b[i] += w * xs[i] * y;
            for j in 0..K {
                a[i][j] += w * xs[i] * xs[j];
            }
        }
    }
    // Gaussian elimination with partial pivoting.
    for c in 0..K {
        let piv = (c..K).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[piv][c].abs() < 1e-12 * a[c][c].abs().max(1e-300) || a[piv][c] == 0.0 {
            return None;
        }
        a.swap(c, piv);
        b.swap(c, piv);
        for r in c + 1..K {
            let f = a[r][c] / a[c][c];
            let pivot_row = a[c];
            for (x, y) in a[r][c..].iter_mut().zip(&pivot_row[c..]) {
                *x -= f * y;
            }
            b[r] -= f * b[c];
        }
    }
    let mut th = [0.0f64; K];
    for c in (0..K).rev() {
        let mut s = b[c];
        for j in c + 1..K {
            s -= a[c][j] * th[j];
        }
        th[c] = s / a[c][c];
    }
    let out: [f64; K] = std::array::from_fn(|j| th[j] / scale[j]);
    out.iter().all(|v| v.is_finite()).then_some(out)
}

fn singular() -> Error {
    Error::Fit("the samples do not determine the parameters (singular system)".into())
}

/// Fits `t = α + β·n` (paper 000 Eq. 11) by relative least squares. Sizes are in whatever
/// unit β should be in. Needs two distinct sizes and finite positive times.
pub fn fit_linear(samples: &[Sample]) -> Result<Fitted<LinearModel>> {
    check_samples(samples)?;
    let rows: Vec<([f64; 2], f64, f64)> = samples
        .iter()
        .map(|s| ([1.0, s.size], s.time_s, 1.0 / (s.time_s * s.time_s)))
        .collect();
    let [alpha, beta] = weighted_lstsq(&rows).ok_or_else(singular)?;
    let model = LinearModel::new(alpha, beta);
    Ok(Fitted {
        model,
        quality: quality(samples, |n| model.time_f(n)),
    })
}

/// Fits `t = α + β·n + γ·n` (paper 004 Table 1) for a reduction whose per-unit transfer
/// cost β is already known (from a ping-pong or all-gather fit): β and γ multiply the same
/// `n` and cannot be told apart from one sweep. γ = fitted slope − β, clamped at 0.
pub fn fit_reduction(samples: &[Sample], beta_s: f64) -> Result<Fitted<ReductionModel>> {
    if !(beta_s.is_finite() && beta_s >= 0.0) {
        return Err(Error::InvalidArgument(format!(
            "β = {beta_s} must be finite and ≥ 0"
        )));
    }
    let lin = fit_linear(samples)?;
    let model = ReductionModel {
        alpha_s: lin.model.alpha_s,
        beta_s,
        gamma_s: (lin.model.beta_s - beta_s).max(0.0),
    };
    Ok(Fitted {
        model,
        quality: quality(samples, |n| {
            model.alpha_s + (model.beta_s + model.gamma_s) * n
        }),
    })
}

/// Fits OMGS's `t = γρ·d·log2 d` (paper 000 Eq. 10, §V-B: the authors fit it over
/// d ∈ [1K, 1M] at ρ = 0.001) by relative least squares through the origin; sizes are
/// element counts.
pub fn fit_topk_omgs(samples: &[Sample]) -> Result<Fitted<TopkModel>> {
    check_samples(samples)?;
    // min Σ ((c·x − t)/t)² ⇒ c = Σ (x/t) / Σ (x/t)².
    let (mut num, mut den) = (0.0, 0.0);
    for s in samples {
        let u = x_log2_x(s.size) / s.time_s;
        num += u;
        den += u * u;
    }
    if den == 0.0 {
        return Err(Error::Fit(
            "every size is ≤ 1 element, so d·log2 d is 0 everywhere".into(),
        ));
    }
    let model = TopkModel::Omgs {
        gamma_rho: num / den,
    };
    Ok(Fitted {
        model,
        quality: quality(samples, |d| model.time(d as usize)),
    })
}

/// Fits the linear top-k model `t = a + b·d` (sizes are element counts).
pub fn fit_topk_linear(samples: &[Sample]) -> Result<Fitted<TopkModel>> {
    let lin = fit_linear(samples)?;
    let model = TopkModel::Linear {
        a_s: lin.model.alpha_s,
        b_s: lin.model.beta_s,
    };
    Ok(Fitted {
        model,
        quality: lin.quality,
    })
}

/// Fits link constants `(α, β)` or `(α, β, γ)` from collective timings whose closed form is
/// `t = α·A + β·B (+ γ·C)` with known coefficients per sample (rounds, bytes on the critical
/// path, bytes reduced: see [`crate::closed`]). Each row is `(coefficients, time)`.
pub fn fit_coefficients<const K: usize>(rows: &[([f64; K], f64)]) -> Result<[f64; K]> {
    if rows.len() < K {
        return Err(Error::Fit(format!(
            "{} samples cannot determine {K} parameters",
            rows.len()
        )));
    }
    for (i, (x, t)) in rows.iter().enumerate() {
        if !(t.is_finite() && *t > 0.0) {
            return Err(Error::Fit(format!(
                "sample {i} has time {t} s; times must be finite and > 0"
            )));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(Error::Fit(format!(
                "sample {i} has a non-finite coefficient"
            )));
        }
    }
    let w: Vec<([f64; K], f64, f64)> = rows.iter().map(|(x, t)| (*x, *t, 1.0 / (t * t))).collect();
    weighted_lstsq(&w).ok_or_else(singular)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn noisy(rng: &mut ChaCha8Rng, t: f64) -> f64 {
        t * (1.0 + rng.gen_range(-0.05..0.05))
    }

    fn sizes() -> Vec<f64> {
        (10..=24).map(|e| (1u64 << e) as f64).collect()
    }

    #[test]
    fn linear_fit_recovers_alpha_beta_under_5pct_noise() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (alpha, beta) = (50e-6, 1e-9);
        let mut s = Vec::new();
        for n in sizes() {
            for _ in 0..5 {
                s.push(Sample::new(n, noisy(&mut rng, alpha + beta * n)));
            }
        }
        let f = fit_linear(&s).unwrap();
        assert!((f.model.alpha_s / alpha - 1.0).abs() < 0.10, "{f:?}");
        assert!((f.model.beta_s / beta - 1.0).abs() < 0.10, "{f:?}");
        assert!(f.quality.r2 > 0.99);
        assert!(f.quality.max_rel_residual < 0.07);
        assert_eq!(f.quality.distinct_sizes, 15);
        assert_eq!(f.quality.samples, 75);
    }

    #[test]
    fn reduction_and_topk_fits_recover_gamma() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (alpha, beta, gamma) = (20e-6, 1e-9, 4e-10);
        let red: Vec<Sample> = sizes()
            .into_iter()
            .flat_map(|n| std::iter::repeat_n(n, 3))
            .map(|n| Sample::new(n, noisy(&mut rng, alpha + (beta + gamma) * n)))
            .collect();
        let f = fit_reduction(&red, beta).unwrap();
        assert!((f.model.gamma_s / gamma - 1.0).abs() < 0.10, "{f:?}");

        let g = 2.18896957e-10;
        let tk: Vec<Sample> = (10..=20)
            .map(|e| (1u64 << e) as f64)
            .flat_map(|d| std::iter::repeat_n(d, 3))
            .map(|d| Sample::new(d, noisy(&mut rng, g * d * d.log2())))
            .collect();
        let f = fit_topk_omgs(&tk).unwrap();
        let TopkModel::Omgs { gamma_rho } = f.model else {
            panic!()
        };
        assert!((gamma_rho / g - 1.0).abs() < 0.10);
        assert!(f.quality.r2 > 0.99);

        let lin: Vec<Sample> = (10..=20)
            .map(|e| (1u64 << e) as f64)
            .map(|d| Sample::new(d, noisy(&mut rng, 1e-4 + 3e-9 * d)))
            .collect();
        let TopkModel::Linear { a_s, b_s } = fit_topk_linear(&lin).unwrap().model else {
            panic!()
        };
        assert!((a_s / 1e-4 - 1.0).abs() < 0.1 && (b_s / 3e-9 - 1.0).abs() < 0.1);
    }

    #[test]
    fn coefficient_fit_recovers_link_constants() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (alpha, beta) = (30e-6, 2e-9);
        // Ring allgather on P = 2..8: (P−1)·α + (P−1)·n/P·β.
        let mut rows = Vec::new();
        for p in 2..=8 {
            for n in sizes() {
                let (a, b) = ((p - 1) as f64, (p - 1) as f64 * n / p as f64);
                rows.push(([a, b], noisy(&mut rng, alpha * a + beta * b)));
            }
        }
        let [a, b] = fit_coefficients(&rows).unwrap();
        assert!((a / alpha - 1.0).abs() < 0.1 && (b / beta - 1.0).abs() < 0.1);
    }

    #[test]
    fn bad_samples_are_typed_errors() {
        let one_size = [Sample::new(8.0, 1.0), Sample::new(8.0, 2.0)];
        assert!(matches!(fit_linear(&one_size), Err(Error::Fit(m)) if m.contains("distinct")));
        assert!(matches!(fit_linear(&[]), Err(Error::Fit(_))));
        for t in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let s = [Sample::new(1.0, 1.0), Sample::new(2.0, t)];
            assert!(matches!(fit_linear(&s), Err(Error::Fit(m)) if m.contains("time")));
        }
        let s = [Sample::new(f64::NAN, 1.0), Sample::new(2.0, 1.0)];
        assert!(matches!(fit_linear(&s), Err(Error::Fit(_))));
        let tiny = [Sample::new(0.0, 1.0), Sample::new(1.0, 1.0)];
        assert!(fit_topk_omgs(&tiny).is_err());
        assert!(fit_reduction(&[Sample::new(1.0, 1.0), Sample::new(2.0, 2.0)], f64::NAN).is_err());
        assert!(fit_coefficients::<2>(&[([1.0, 1.0], 1.0)]).is_err());
        assert!(fit_coefficients(&[([1.0, 1.0], 1.0), ([2.0, 2.0], 2.0)]).is_err());
    }

    #[test]
    fn exact_data_gives_r2_one() {
        let s: Vec<Sample> = sizes()
            .into_iter()
            .map(|n| Sample::new(n, 1e-5 + 1e-9 * n))
            .collect();
        let f = fit_linear(&s).unwrap();
        assert!((f.quality.r2 - 1.0).abs() < 1e-9 && f.quality.max_rel_residual < 1e-9);
    }
}
