//! Least-squares fitting of the models from measured `(size, time)` samples.
//!
//! Times measured over sizes that span decades carry roughly multiplicative noise, so the
//! fits minimise the *relative* residual `Σ ((pred − t)/t)²` (weighted least squares with
//! weights `1/t²`); an ordinary fit would let the largest sizes swamp α. The reported
//! quality is the ordinary coefficient of determination R² on the raw times and the worst
//! relative residual.
//!
//! **R² is computed on the raw times** (unweighted squares of seconds), not on the relative
//! error that the fit minimises: it is dominated by the largest sizes, while
//! `max_rel_residual` is the relative-error measure that weighs every size alike. A line
//! fitted for relative error can therefore have a low R² when the large sizes bend away.
//!
//! [`fit_piecewise`] is the standard remedy for machines whose per-byte cost changes with
//! the message size (shared memory once messages leave the caches; eager against rendezvous
//! protocols on a network): MPI libraries tune their algorithms per size range for the same
//! reason. It fits up to three size regimes, each its own `α_i + β_i·n`, with breakpoints
//! chosen by least squares over the measured sizes.

use serde::{Deserialize, Serialize};

use crate::models::{
    x_log2_x, LinearModel, ReductionModel, TopkModel, TopkRegime, TOPK_MAX_REGIMES,
};
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

/// Fits `t = α + β·n` (OMGS-SGD Eq. 11) by relative least squares. Sizes are in whatever
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

/// Fits `t = α + β·n + γ·n` (Linear Pipelining, Table 1) for a reduction whose per-unit transfer
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

/// Fits OMGS's `t = γρ·d·log2 d` (OMGS-SGD Eq. 10, §V-B: the authors fit it over
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

/// Fits a piecewise top-k model ([`TopkModel::Piecewise`]): [`fit_piecewise`] with up to
/// three regimes over sizes in elements. Each regime keeps its own fixed cost per call,
/// which dominates small tensors (the ones layer-wise and merged sparsification select
/// from), and its own cost per element (the cache level, one thread or several).
pub fn fit_topk_piecewise(samples: &[Sample]) -> Result<Fitted<TopkModel>> {
    let pw = fit_piecewise(samples, TOPK_MAX_REGIMES)?;
    let mut regimes = [TopkRegime::default(); TOPK_MAX_REGIMES];
    for (i, (r, s)) in regimes.iter_mut().zip(&pw.model.segments).enumerate() {
        *r = TopkRegime {
            // The first regime starts at the smallest calibrated size: below it the model
            // predicts that size's time instead of extrapolating the line.
            start: if i == 0 { s.fitted_min } else { s.start },
            a_s: s.model.alpha_s,
            b_s: s.model.beta_s,
        };
    }
    let model = TopkModel::Piecewise {
        regimes,
        count: pw.model.segments.len(),
    };
    Ok(Fitted {
        model,
        quality: quality(samples, |d| model.time(d as usize)),
    })
}

/// Fits the reduction cost `t = α_i + (β + γ_i)·n` per size regime ([`fit_piecewise`]
/// over bytes): summing `f32` runs at the bandwidth of the cache level the buffers fit in,
/// so one γ misses by tens of percent at either end of a 1 KiB … 16 MiB sweep.
pub fn fit_reduction_piecewise(samples: &[Sample]) -> Result<Fitted<PiecewiseLinear>> {
    fit_piecewise(samples, crate::calibration::MAX_SEGMENTS)
}

/// One size regime of a [`PiecewiseLinear`] model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Smallest size this segment predicts for (0 for the first segment); larger sizes up
    /// to the next segment's `start` use it too.
    pub start: f64,
    /// Smallest measured size the segment was fitted on.
    pub fitted_min: f64,
    /// Largest measured size the segment was fitted on.
    pub fitted_max: f64,
    /// `α_i + β_i·n` of this regime.
    pub model: LinearModel,
}

/// A piecewise α-β model: one `α_i + β_i·n` per size regime, segments sorted by `start`.
///
/// The segments are fitted independently, so the model is **not continuous in general**: at
/// each breakpoint it switches where the two neighbouring lines cross when that crossing
/// lies between the last size of one segment and the first of the next (continuous there),
/// else at the geometric mean of those two sizes (a jump, as a protocol switch makes). Sizes
/// below the first segment's fitted range and above the last one's extrapolate with the
/// nearest segment.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PiecewiseLinear {
    /// The regimes, by increasing `start`; the first starts at 0.
    pub segments: Vec<Segment>,
}

impl PiecewiseLinear {
    /// The segment that predicts size `n` (the last one whose `start` is ≤ `n`).
    pub fn segment(&self, n: f64) -> Option<&Segment> {
        self.segments
            .iter()
            .rev()
            .find(|s| s.start <= n)
            .or(self.segments.first())
    }

    /// Predicted time for `n` units (NaN for a model with no segments).
    pub fn time_f(&self, n: f64) -> f64 {
        self.segment(n).map_or(f64::NAN, |s| s.model.time_f(n))
    }

    /// [`PiecewiseLinear::time_f`] for an integer size.
    pub fn time(&self, n: usize) -> f64 {
        self.time_f(n as f64)
    }

    /// Sizes where the model switches segment.
    pub fn breakpoints(&self) -> Vec<f64> {
        self.segments.iter().skip(1).map(|s| s.start).collect()
    }
}

/// A split is kept only if it divides the sum of squared relative residuals by at least this
/// factor (the RMS relative residual by 2): with 5% noise a single regime almost never gains
/// that much from a spurious split, while a real regime change gains far more.
pub const PIECEWISE_MIN_GAIN: f64 = 4.0;

/// Worst relative residual above which [`fit_piecewise`] adds a segment even when the
/// squared-sum gain is below [`PIECEWISE_MIN_GAIN`]: two thirds of the calibrated models'
/// goal (15 %), so that a fit which just meets the goal on one run's medians does not
/// cross it on the next.
pub const PIECEWISE_TARGET_REL: f64 = 0.10;

/// Most size regimes [`fit_piecewise`] fits.
pub const MAX_PIECEWISE_SEGMENTS: usize = 6;

/// Below this RMS relative residual a single line is exact to measurement precision and is
/// never split.
const PIECEWISE_NOISE_FLOOR: f64 = 1e-6;

/// The line of one segment of a piecewise fit: the relative least-squares line under the
/// constraint β ≥ 0, and its sum of squared relative residuals. A per-byte cost that falls
/// with size is noise between latency-bound sizes, not a regime; where the free line's slope
/// is negative, the constrained optimum lies on β = 0, the flat line at the relative
/// least-squares constant `Σ(1/t) / Σ(1/t²)`. Before, such a segment was refused, and a
/// noisy dip among the small sizes (8 KiB measured faster than 4 KiB) forced one line over
/// 4–16 KiB that missed by 17 %.
fn segment_line(samples: &[Sample]) -> Option<(LinearModel, f64)> {
    let (m, ssr) = line_ssr(samples)?;
    if m.beta_s >= 0.0 {
        return Some((m, ssr));
    }
    let inv: f64 = samples.iter().map(|s| 1.0 / s.time_s).sum();
    let inv2: f64 = samples.iter().map(|s| 1.0 / (s.time_s * s.time_s)).sum();
    let flat = LinearModel::new(inv / inv2, 0.0);
    let ssr = samples
        .iter()
        .map(|s| ((flat.alpha_s - s.time_s) / s.time_s).powi(2))
        .sum();
    Some((flat, ssr))
}

/// Relative least-squares line through `samples` and its sum of squared relative residuals.
fn line_ssr(samples: &[Sample]) -> Option<(LinearModel, f64)> {
    let rows: Vec<([f64; 2], f64, f64)> = samples
        .iter()
        .map(|s| ([1.0, s.size], s.time_s, 1.0 / (s.time_s * s.time_s)))
        .collect();
    let [a, b] = weighted_lstsq(&rows)?;
    let m = LinearModel::new(a, b);
    let ssr = samples
        .iter()
        .map(|s| ((m.time_f(s.size) - s.time_s) / s.time_s).powi(2))
        .sum();
    Some((m, ssr))
}

/// Fits a piecewise α-β model with at most `max_segments` (1 to [`MAX_PIECEWISE_SEGMENTS`])
/// size regimes by relative least squares.
///
/// For each number of segments, every split between distinct measured sizes that leaves each
/// segment at least two distinct sizes is considered (by dynamic programming) and the one with the smallest total `Σ ((pred − t)/t)²` is kept (a segment
/// whose least-squares slope comes out negative is fitted flat, see `segment_line`); a split is only accepted when it divides that sum by at least
/// [`PIECEWISE_MIN_GAIN`] over the best fit with fewer segments, so data with one regime stays one
/// line, or when that fit misses some size by more than [`PIECEWISE_TARGET_REL`] and the split
/// misses by less. Fewer than 4 distinct sizes give a single line. Breakpoint placement and continuity: see
/// [`PiecewiseLinear`]. Same sample checks and errors as [`fit_linear`].
///
/// ```
/// use cost_model::fit::{fit_piecewise, Sample};
///
/// // 2 KiB … 8 MiB: 0.1 ns/byte in cache, 0.4 ns/byte beyond 256 KiB.
/// let s: Vec<Sample> = (11..=23)
///     .map(|e| (1u64 << e) as f64)
///     .map(|n| Sample::new(n, if n <= 262144.0 { 1e-5 + 1e-10 * n } else { 4e-10 * n - 6.86432e-5 }))
///     .collect();
/// let f = fit_piecewise(&s, 3).unwrap();
/// assert_eq!(f.model.segments.len(), 2);
/// assert!((f.model.breakpoints()[0] / 262144.0 - 1.0).abs() < 0.01);
/// assert!(f.quality.r2 > 0.9999);
/// ```
pub fn fit_piecewise(samples: &[Sample], max_segments: usize) -> Result<Fitted<PiecewiseLinear>> {
    let distinct = check_samples(samples)?;
    if !(1..=MAX_PIECEWISE_SEGMENTS).contains(&max_segments) {
        return Err(Error::InvalidArgument(format!(
            "max_segments = {max_segments}; 1 to {MAX_PIECEWISE_SEGMENTS} size regimes are supported"
        )));
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.size.total_cmp(&b.size));
    // starts[k]: index in `sorted` of the k-th distinct size; starts[distinct] = len.
    let mut starts: Vec<usize> = (0..sorted.len())
        .filter(|&i| i == 0 || sorted[i].size != sorted[i - 1].size)
        .collect();
    starts.push(sorted.len());
    let n = distinct;
    // seg[i][j]: the line over distinct sizes [i, j) (j − i ≥ 2) and its SSR, with β ≥ 0.
    let mut seg: Vec<Vec<Option<(LinearModel, f64)>>> = vec![vec![None; n + 1]; n + 1];
    for (i, row) in seg.iter_mut().enumerate() {
        for (j, cell) in row.iter_mut().enumerate().skip(i + 2) {
            *cell = segment_line(&sorted[starts[i]..starts[j]]);
        }
    }
    let (single, single_ssr) = line_ssr(samples).ok_or_else(singular)?;
    // Each candidate: (ssr, cut points in distinct-size indices, lines).
    let mut best: (f64, Vec<usize>, Vec<LinearModel>) = (single_ssr, vec![], vec![single]);
    let floor = PIECEWISE_NOISE_FLOOR.powi(2) * sorted.len() as f64;
    // split[j]: the best split of distinct sizes [0, j) into the current number of
    // segments, as (ssr, cuts); dynamic programming over the number of segments. Every
    // number of segments is tried whether or not fewer were kept: a two-way split may
    // gain little while a three-way split that isolates a regime gains much.
    let mut split: Vec<Option<(f64, Vec<usize>)>> = (0..=n)
        .map(|j| seg[0][j].map(|(_, s)| (s, vec![])))
        .collect();
    for k in 2..=max_segments.min(n / 2) {
        let mut next: Vec<Option<(f64, Vec<usize>)>> = vec![None; n + 1];
        for (j, cell) in next.iter_mut().enumerate().skip(2 * k) {
            for i in 2 * (k - 1)..=j - 2 {
                if let (Some((prev, cuts)), Some((_, s))) = (&split[i], &seg[i][j]) {
                    if cell.as_ref().is_none_or(|c| prev + s < c.0) {
                        let mut c = cuts.clone();
                        c.push(i);
                        *cell = Some((prev + s, c));
                    }
                }
            }
        }
        split = next;
        if best.0 <= floor {
            break;
        }
        if let Some((ssr, cuts)) = &split[n] {
            let mut bounds = vec![0];
            bounds.extend(cuts);
            bounds.push(n);
            let lines: Vec<LinearModel> = bounds
                .windows(2)
                .filter_map(|w| seg[w[0]][w[1]].map(|(m, _)| m))
                .collect();
            // Each segment's worst relative residual on its own sizes.
            let worst = |bounds: &[usize], lines: &[LinearModel]| {
                bounds
                    .windows(2)
                    .zip(lines)
                    .flat_map(|(w, m)| {
                        sorted[starts[w[0]]..starts[w[1]]]
                            .iter()
                            .map(move |s| ((m.time_f(s.size) - s.time_s) / s.time_s).abs())
                    })
                    .fold(0.0, f64::max)
            };
            let mut old_bounds = vec![0];
            old_bounds.extend(&best.1);
            old_bounds.push(n);
            let (now, before) = (worst(&bounds, &lines), worst(&old_bounds, &best.2));
            // A split is kept when it clearly pays in the squared sum, or when the fit
            // with fewer segments misses some size by more than PIECEWISE_TARGET_REL and
            // this one misses by less: a regime the least-squares gain alone would not
            // buy, since one badly described size adds little to the sum.
            let pays = ssr * PIECEWISE_MIN_GAIN <= best.0;
            let needed = before > PIECEWISE_TARGET_REL && now < before;
            if pays || needed {
                best = (*ssr, cuts.clone(), lines);
            }
        }
    }
    let (_, cuts, lines) = best;
    let size_at = |k: usize| sorted[starts[k]].size;
    let mut bounds = vec![0usize];
    bounds.extend(&cuts);
    bounds.push(distinct);
    let mut segments: Vec<Segment> = Vec::with_capacity(lines.len());
    for (i, model) in lines.into_iter().enumerate() {
        let (lo, hi) = (bounds[i], bounds[i + 1]);
        let start = match segments.last() {
            None => 0.0,
            Some(prev) => {
                let (a, b) = (size_at(lo - 1), size_at(lo));
                let db = prev.model.beta_s - model.beta_s;
                let cross = (model.alpha_s - prev.model.alpha_s) / db;
                // A tolerance so that a break exactly at a measured size counts as inside.
                let tol = 1e-9 * b;
                if db != 0.0 && cross.is_finite() && (a - tol..=b + tol).contains(&cross) {
                    cross.clamp(a, b)
                } else {
                    (a.max(f64::MIN_POSITIVE) * b).sqrt()
                }
            }
        };
        segments.push(Segment {
            start,
            fitted_min: size_at(lo),
            fitted_max: size_at(hi - 1),
            model,
        });
    }
    let model = PiecewiseLinear { segments };
    let q = quality(samples, |n| model.time_f(n));
    Ok(Fitted { model, quality: q })
}

/// Fits link constants `(α, β)` or `(α, β, γ)` from collective timings whose closed form is
/// `t = α·A + β·B (+ γ·C)` with known coefficients per sample (rounds, bytes on the critical
/// path, bytes reduced: see [`crate::dense::closed_form`]). Each row is `(coefficients, time)`.
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

/// The median of `values` (the mean of the two middle ones for an even count; 0 for none):
/// the statistic of repeated timings, robust to the one run that another process delays.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
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
    fn piecewise_topk_and_reduction_predict_within_15pct() {
        // A selector with a 3 µs fixed cost and 6 ns/element in cache, 0.4 ns/element
        // (several threads) beyond 128K elements: one line misses the small sizes by far
        // more than 15 %, OMGS's γρ·d·log d too; the piecewise fit does not.
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let t = |d: f64| {
            if d < 131072.0 {
                3e-6 + 6e-9 * d
            } else {
                2e-4 + 0.4e-9 * d
            }
        };
        let s: Vec<Sample> = (10..=22)
            .map(|e| (1u64 << e) as f64)
            .flat_map(|d| [d, d])
            .map(|d| Sample::new(d, noisy(&mut rng, t(d))))
            .collect();
        let pw = fit_topk_piecewise(&s).unwrap();
        assert!(pw.quality.max_rel_residual < 0.15, "{pw:?}");
        assert!(matches!(pw.model, TopkModel::Piecewise { count: 2.., .. }));
        assert!((pw.model.time(1 << 10) / t(1024.0) - 1.0).abs() < 0.1);
        // Below the sweep: the smallest size's time, never the line's extrapolation.
        assert_eq!(pw.model.time(10), pw.model.time(1 << 10));
        // A first regime whose line crosses zero above 0 (measured at the real 16 KiB …
        // 4 MiB exact top-k of a 2-core host): still no negative time below the sweep.
        let steep: Vec<Sample> = (14..=22)
            .map(|e| (1u64 << e) as f64)
            .map(|d| Sample::new(d, -2.4e-6 + 1.6e-9 * d))
            .collect();
        let m = fit_topk_piecewise(&steep).unwrap().model;
        assert!(m.time(10) > 0.0 && m.time(10) == m.time(1 << 14), "{m:?}");
        assert_eq!(
            TopkModel::Linear {
                a_s: -1e-6,
                b_s: 1e-9
            }
            .time(10),
            0.0
        );
        assert!(fit_topk_linear(&s).unwrap().quality.max_rel_residual > 0.15);
        assert!(fit_topk_omgs(&s).unwrap().quality.max_rel_residual > 0.15);
        let red = fit_reduction_piecewise(&s).unwrap();
        assert!(red.quality.max_rel_residual < 0.15);
        assert!(fit_topk_piecewise(&s[..1]).is_err());
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

    /// 1 KiB … 16 MiB in quarter-octave steps (57 sizes).
    fn dense_sizes() -> Vec<f64> {
        (0..=56)
            .map(|i| 1024.0 * 2f64.powf(i as f64 / 4.0))
            .collect()
    }

    #[test]
    fn piecewise_recovers_two_regimes_under_5pct_noise() {
        // In cache up to 512 KiB, then 3× the per-byte cost; continuous at the break.
        let (a1, b1, brk, b2) = (20e-6, 0.2e-9, 512.0 * 1024.0, 0.6e-9);
        let a2 = a1 + (b1 - b2) * brk;
        let truth = |n: f64| if n < brk { a1 + b1 * n } else { a2 + b2 * n };
        for seed in 0..4 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let s: Vec<Sample> = dense_sizes()
                .into_iter()
                .flat_map(|n| std::iter::repeat_n(n, 3))
                .map(|n| Sample::new(n, noisy(&mut rng, truth(n))))
                .collect();
            let f = fit_piecewise(&s, 3).unwrap();
            let seg = &f.model.segments;
            assert_eq!(seg.len(), 2, "seed {seed}: {f:?}");
            let bp = f.model.breakpoints()[0];
            assert!((bp / brk - 1.0).abs() < 0.10, "seed {seed}: break {bp}");
            let close = |x: f64, y: f64| (x / y - 1.0).abs() < 0.10;
            assert!(close(seg[0].model.alpha_s, a1), "seed {seed}: {f:?}");
            assert!(close(seg[0].model.beta_s, b1), "seed {seed}: {f:?}");
            assert!(close(seg[1].model.alpha_s, a2), "seed {seed}: {f:?}");
            assert!(close(seg[1].model.beta_s, b2), "seed {seed}: {f:?}");
            assert!(f.quality.r2 > 0.99 && f.quality.max_rel_residual < 0.08);
            // The single line is much worse on the same data.
            let line = fit_linear(&s).unwrap();
            assert!(line.quality.max_rel_residual > 2.0 * f.quality.max_rel_residual);
            // Extrapolation uses the nearest segment.
            assert_eq!(f.model.time_f(1.0), seg[0].model.time_f(1.0));
            assert_eq!(f.model.time_f(1e9), seg[1].model.time_f(1e9));
        }
    }

    #[test]
    fn piecewise_keeps_one_segment_for_one_regime() {
        for seed in 0..8 {
            let mut rng = ChaCha8Rng::seed_from_u64(100 + seed);
            let (alpha, beta) = (50e-6, 1e-9);
            let s: Vec<Sample> = sizes()
                .into_iter()
                .flat_map(|n| std::iter::repeat_n(n, 3))
                .map(|n| Sample::new(n, noisy(&mut rng, alpha + beta * n)))
                .collect();
            let f = fit_piecewise(&s, 3).unwrap();
            assert_eq!(f.model.segments.len(), 1, "seed {seed}: {f:?}");
            let line = fit_linear(&s).unwrap();
            assert_eq!(f.model.segments[0].model, line.model);
            assert_eq!(f.quality, line.quality);
        }
        // Exact data: never split.
        let s: Vec<Sample> = sizes()
            .into_iter()
            .map(|n| Sample::new(n, 1e-5 + 1e-9 * n))
            .collect();
        assert_eq!(fit_piecewise(&s, 3).unwrap().model.segments.len(), 1);
    }

    #[test]
    fn piecewise_four_regimes_need_four_segments() {
        // Four regimes on a ×2 sweep (1 KiB … 64 MiB): latency, cache, memory, and a
        // slower regime beyond; three segments cannot describe it exactly, four can.
        let lines = [
            (5e-6, 0.05e-9),
            (1e-6, 0.3e-9),
            (-3e-3, 1.5e-9),
            (-30e-3, 3e-9),
        ];
        let breaks = [40e3, 3e6, 18e6];
        let s: Vec<Sample> = (10..=26)
            .map(|e| (1u64 << e) as f64)
            .map(|n| {
                let k = breaks.iter().filter(|&&b| n >= b).count();
                Sample::new(n, lines[k].0 + lines[k].1 * n)
            })
            .collect();
        let four = fit_piecewise(&s, 4).unwrap();
        assert_eq!(four.model.segments.len(), 4, "{four:?}");
        assert!(four.quality.max_rel_residual < 1e-9);
        let three = fit_piecewise(&s, 3).unwrap();
        assert!(three.quality.max_rel_residual > 1e-3, "{three:?}");
        // More segments allowed than the data needs: still four.
        assert_eq!(fit_piecewise(&s, 6).unwrap().model.segments.len(), 4);
    }

    #[test]
    fn piecewise_three_regimes_and_small_sweeps() {
        // Three clear regimes on the ×4 sweep the calibration uses (1 KiB … 16 MiB).
        let s: Vec<Sample> = (0..8)
            .map(|i| (1024usize << (2 * i)) as f64)
            .map(|n| {
                let t = if n < 40e3 {
                    5e-6 + 0.05e-9 * n
                } else if n < 3e6 {
                    1e-6 + 0.3e-9 * n
                } else {
                    -3e-3 + 1.5e-9 * n
                };
                Sample::new(n, t)
            })
            .collect();
        let f = fit_piecewise(&s, 3).unwrap();
        assert_eq!(f.model.segments.len(), 3, "{f:?}");
        assert!(f.quality.max_rel_residual < 1e-9);
        assert_eq!(fit_piecewise(&s, 2).unwrap().model.segments.len(), 2);
        assert_eq!(fit_piecewise(&s, 1).unwrap().model.segments.len(), 1);
        // Fewer than 4 distinct sizes: a single line, even with a visible kink.
        let few = [
            Sample::new(1e3, 1e-6),
            Sample::new(1e4, 2e-6),
            Sample::new(1e5, 1e-4),
        ];
        let f = fit_piecewise(&few, 3).unwrap();
        assert_eq!(f.model.segments.len(), 1);
        assert_eq!(f.model.segments[0].model, fit_linear(&few).unwrap().model);
        // A segment whose free slope is negative (noise at latency-bound sizes) is fitted
        // flat, at the relative least-squares constant, instead of being refused.
        let dip = [1e3, 2e3, 3e3, 4e3].map(|n| Sample::new(n, 1e-5));
        let mut dip = dip.to_vec();
        dip[1].time_s = 0.9e-5;
        dip[2].time_s = 2e-5;
        dip[3].time_s = 4e-5;
        let f = fit_piecewise(&dip, 3).unwrap();
        assert_eq!(f.model.segments.len(), 2, "{f:?}");
        let flat = f.model.segments[0].model;
        assert_eq!(flat.beta_s, 0.0);
        let c = (1.0 / 1e-5 + 1.0 / 0.9e-5) / (1.0 / 1e-10 + 1.0 / 0.81e-10);
        assert!((flat.alpha_s / c - 1.0).abs() < 1e-9, "{flat:?}");
        // The constant beats its neighbours on the squared relative residuals.
        let ssr = |a: f64| {
            dip[..2]
                .iter()
                .map(|s| ((a - s.time_s) / s.time_s).powi(2))
                .sum::<f64>()
        };
        assert!(ssr(c) < ssr(c * 1.001) && ssr(c) < ssr(c * 0.999));
        assert!(f.quality.max_rel_residual < 0.06, "{f:?}");
        // Same typed errors as the line; bad segment counts rejected.
        assert!(matches!(fit_piecewise(&[], 2), Err(Error::Fit(_))));
        assert!(fit_piecewise(&few, 0).is_err());
        assert!(fit_piecewise(&few, MAX_PIECEWISE_SEGMENTS + 1).is_err());
        let json = serde_json::to_string(&f).unwrap();
        let back: Fitted<PiecewiseLinear> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, f);
        assert!(PiecewiseLinear::default().time_f(1.0).is_nan());
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
