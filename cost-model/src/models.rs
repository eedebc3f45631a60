//! The analytic cost models: Hockney `α + β·n`, its reduction variant `α + β·n + γ·n`, and the
//! top-k selection models (OMGS `γ·ρ·d·log2 d`, OMGS-SGD (Shi et al., INFOCOM 2020) Eq. 10, a
//! linear `a + b·d`, and a piecewise `a_i + b_i·d` with one line per size regime for calibrated CPU
//! selectors, whose fixed cost per call and per-element cost both change with the cache level and
//! the switch to several threads). Each is a plain serde struct so calibrations can be saved and
//! read back.

use serde::{Deserialize, Serialize};

/// The Hockney model `t(n) = α + β·n` (OMGS-SGD Eq. 11): a start-up cost plus a cost per
/// unit. The unit (bytes or elements) is whatever the model was fitted or published in;
/// each constructor and preset says which.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinearModel {
    /// Start-up time α, seconds.
    pub alpha_s: f64,
    /// Time per unit β, seconds per unit of `n`.
    pub beta_s: f64,
}

impl LinearModel {
    /// A model from α (seconds) and β (seconds per unit).
    pub fn new(alpha_s: f64, beta_s: f64) -> Self {
        LinearModel { alpha_s, beta_s }
    }

    /// Predicted time for a message of `n` units: `α + β·n`.
    pub fn time(&self, n: usize) -> f64 {
        self.time_f(n as f64)
    }

    /// [`LinearModel::time`] for a fractional or very large size.
    pub fn time_f(&self, n: f64) -> f64 {
        self.alpha_s + self.beta_s * n
    }
}

/// The reduction model `t(n) = α + β·n + γ·n` (Linear Pipelining, Table 1): a transfer plus a
/// per-unit arithmetic cost γ of summing what arrived.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReductionModel {
    /// Start-up time α, seconds.
    pub alpha_s: f64,
    /// Transfer time β per unit, seconds.
    pub beta_s: f64,
    /// Reduction time γ per unit, seconds.
    pub gamma_s: f64,
}

impl ReductionModel {
    /// Predicted time for `n` units: `α + (β + γ)·n`.
    pub fn time(&self, n: usize) -> f64 {
        self.alpha_s + (self.beta_s + self.gamma_s) * n as f64
    }
}

/// Time to select the top-k entries of a dense vector of `d` elements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TopkModel {
    /// OMGS-SGD's model `t_s = γ·ρ·d·log2 d` (Eq. 10, Algorithm 1 line 16), with
    /// γ·ρ folded into one coefficient as in the authors' code: the model is valid at the
    /// density ρ it was measured at. Build it from separate γ and ρ with
    /// [`TopkModel::omgs`].
    Omgs {
        /// γ·ρ, seconds per `d·log2 d`.
        gamma_rho: f64,
    },
    /// A linear model `t_s = a + b·d`, which fits streaming selectors (threshold, sampled,
    /// MSTopK's fixed number of passes) better than `d·log d`.
    Linear {
        /// Fixed cost a, seconds.
        a_s: f64,
        /// Cost per element b, seconds.
        b_s: f64,
    },
    /// Up to [`TOPK_MAX_REGIMES`] size regimes, each `a_i + b_i·d` with its own fixed cost
    /// per call (see [`TopkRegime`]); sizes below the first regime's start (the smallest
    /// calibrated size) cost what that size costs: the fixed cost per call dominates there,
    /// and the line extrapolated below its range can go negative.
    Piecewise {
        /// The regimes by increasing `start`; only the first `count` are used. Files
        /// written when fewer regimes were allowed load with the rest unused.
        #[serde(deserialize_with = "regimes_padded")]
        regimes: [TopkRegime; TOPK_MAX_REGIMES],
        /// Number of regimes in use (1 to [`TOPK_MAX_REGIMES`]).
        count: usize,
    },
}

/// Most size regimes of a [`TopkModel::Piecewise`] (fixed, so the model stays `Copy`):
/// call-bound, in cache, and streaming, plus the steps where exact selection changes method
/// (group maxima up to 2^15 elements, a sample above) and where it starts to use the thread
/// pool; as many as a collective's piecewise fit.
pub const TOPK_MAX_REGIMES: usize = 6;

/// Reads up to [`TOPK_MAX_REGIMES`] regimes, padding a shorter list (an older file's) with
/// unused defaults.
fn regimes_padded<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<[TopkRegime; TOPK_MAX_REGIMES], D::Error> {
    let v = Vec::<TopkRegime>::deserialize(d)?;
    if v.len() > TOPK_MAX_REGIMES {
        return Err(serde::de::Error::custom(format!(
            "{} top-k regimes; at most {TOPK_MAX_REGIMES} are supported",
            v.len()
        )));
    }
    let mut out = [TopkRegime::default(); TOPK_MAX_REGIMES];
    out[..v.len()].copy_from_slice(&v);
    Ok(out)
}

/// One size regime of [`TopkModel::Piecewise`]: `a + b·d` for `d ≥ start`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TopkRegime {
    /// Smallest size (elements) the regime predicts for.
    pub start: f64,
    /// Fixed cost per call a, seconds.
    pub a_s: f64,
    /// Cost per element b, seconds.
    pub b_s: f64,
}

impl TopkModel {
    /// The OMGS model from γ and the density ρ (OMGS-SGD Eq. 10).
    pub fn omgs(gamma: f64, density: f64) -> Self {
        TopkModel::Omgs {
            gamma_rho: gamma * density,
        }
    }

    /// Predicted selection time, seconds, for a tensor of `d` elements. `d·log2 d` is
    /// taken as 0 for `d ≤ 1`.
    pub fn time(&self, d: usize) -> f64 {
        let x = d as f64;
        match *self {
            TopkModel::Omgs { gamma_rho } => gamma_rho * x_log2_x(x),
            // A fitted line can cross zero below the sizes it was fitted on.
            TopkModel::Linear { a_s, b_s } => (a_s + b_s * x).max(0.0),
            TopkModel::Piecewise { regimes, count } => {
                let used = &regimes[..count.clamp(1, TOPK_MAX_REGIMES)];
                let x = x.max(used[0].start);
                let r = used.iter().rev().find(|r| r.start <= x).unwrap_or(&used[0]);
                (r.a_s + r.b_s * x).max(0.0)
            }
        }
    }
}

/// OMGS-SGD's all-gather model for a merged group of sparse gradients (Eq. 11 as
/// the authors' code applies it): `t(x) = (a + b·x·P·4)·2` seconds for a group of `x`
/// selected elements on `P` workers. Every worker receives `x·P` values of 4 bytes; the
/// ×2 is values plus indices (two all-gathers).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SparseAllgatherModel {
    /// Number of workers P.
    pub ranks: usize,
    /// Start-up time a of one all-gather, seconds.
    pub a_s: f64,
    /// Time b per byte gathered, seconds.
    pub b_s_per_byte: f64,
}

impl SparseAllgatherModel {
    /// Predicted time, seconds, to all-gather a group of `x` selected elements (values and
    /// indices) from every worker.
    pub fn time(&self, x: usize) -> f64 {
        (self.a_s + self.b_s_per_byte * x as f64 * self.ranks as f64 * 4.0) * 2.0
    }

    /// The same model as an `α + β·x` in elements: `α = 2a`, `β = 8·b·P`.
    pub fn as_linear(&self) -> LinearModel {
        LinearModel::new(2.0 * self.a_s, 8.0 * self.b_s_per_byte * self.ranks as f64)
    }
}

/// `x·log2 x`, 0 for `x ≤ 1` (so tiny tensors cost nothing rather than a negative time).
pub(crate) fn x_log2_x(x: f64) -> f64 {
    if x <= 1.0 {
        0.0
    } else {
        x * x.log2()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_and_reduction_models() {
        let m = LinearModel::new(1e-5, 1e-9);
        assert!((m.time(1000) - (1e-5 + 1e-6)).abs() < 1e-18);
        let r = ReductionModel {
            alpha_s: 1.0,
            beta_s: 2.0,
            gamma_s: 3.0,
        };
        assert_eq!(r.time(2), 11.0);
    }

    #[test]
    fn piecewise_topk_json_with_fewer_regimes_loads() {
        let old = r#"{"kind":"piecewise","regimes":[{"start":1024.0,"a_s":1e-6,"b_s":1e-9},
            {"start":4096.0,"a_s":2e-6,"b_s":5e-10},{"start":0.0,"a_s":0.0,"b_s":0.0}],"count":2}"#;
        let m: TopkModel = serde_json::from_str(old).unwrap();
        assert!((m.time(8192) - (2e-6 + 5e-10 * 8192.0)).abs() < 1e-15);
        let back: TopkModel = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        let zero = r#"{"start":0.0,"a_s":0.0,"b_s":0.0}"#;
        let too_many = format!(
            r#"{{"kind":"piecewise","regimes":[{}],"count":1}}"#,
            [zero; TOPK_MAX_REGIMES + 1].join(",")
        );
        assert!(serde_json::from_str::<TopkModel>(&too_many).is_err());
    }

    #[test]
    fn topk_models() {
        let m = TopkModel::Omgs { gamma_rho: 2.0 };
        assert_eq!(m.time(8), 2.0 * 8.0 * 3.0);
        assert_eq!(m.time(0), 0.0);
        assert_eq!(m.time(1), 0.0);
        let l = TopkModel::Linear { a_s: 1.0, b_s: 0.5 };
        assert_eq!(l.time(4), 3.0);
        let s = serde_json::to_string(&m).unwrap();
        assert!(s.contains("\"kind\":\"omgs\""), "{s}");
        let back: TopkModel = serde_json::from_str(&s).unwrap();
        assert_eq!(back, m);
        let r = |start, a_s, b_s| TopkRegime { start, a_s, b_s };
        let p = TopkModel::Piecewise {
            regimes: [
                r(0.0, 1.0, 1.0),
                r(10.0, 5.0, 0.5),
                TopkRegime::default(),
                TopkRegime::default(),
                TopkRegime::default(),
                TopkRegime::default(),
            ],
            count: 2,
        };
        assert_eq!(p.time(4), 5.0);
        assert_eq!(p.time(20), 15.0);
        let s = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<TopkModel>(&s).unwrap(), p);
    }
}
