//! Layer profiles: per parameter tensor, in forward order, its name, element count and backward
//! time (OMGS-SGD (Shi et al., INFOCOM 2020) Table II: `d^(l)` and `t_b^(l)`), plus the forward
//! time `t_f`.
//!
//! JSON: `{"model": "resnet50", "layers": [{"name": "conv1.weight", "numel":
//! 9408, "backward_s": 1.2e-4}]}`; `backward_s` may be omitted (then 0), `forward_s` is an
//! optional extra. Every way in validates: no layers, zero or negative sizes and
//! non-finite or negative times are typed errors.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// One parameter tensor ("layer" in OMGS-SGD (Shi et al., INFOCOM 2020), which merges per tensor).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layer {
    /// Tensor name, e.g. `layer1.0.conv1.weight`.
    pub name: String,
    /// Number of elements `d^(l)`.
    pub numel: usize,
    /// Backward (gradient) time `t_b^(l)`, seconds.
    pub backward_s: f64,
}

/// A validated layer profile (construct with [`LayerProfile::new`] or
/// [`LayerProfile::from_json`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerProfile {
    model: String,
    #[serde(skip_serializing_if = "is_zero")]
    forward_s: f64,
    layers: Vec<Layer>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

#[derive(Deserialize)]
struct RawLayer {
    name: String,
    numel: i64,
    #[serde(default = "zero_opt")]
    backward_s: Option<f64>,
}

fn zero_opt() -> Option<f64> {
    Some(0.0)
}

#[derive(Deserialize)]
struct RawProfile {
    model: String,
    #[serde(default = "zero_opt")]
    forward_s: Option<f64>,
    layers: Vec<RawLayer>,
}

fn check_time(index: usize, name: &str, what: &str, t: f64) -> Result<()> {
    if t.is_finite() && t >= 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidLayer {
            index,
            name: name.to_string(),
            reason: format!("{what} = {t} s; must be finite and ≥ 0"),
        })
    }
}

impl LayerProfile {
    /// A profile from layers in forward order and the forward time `t_f` (seconds).
    pub fn new(model: impl Into<String>, forward_s: f64, layers: Vec<Layer>) -> Result<Self> {
        let p = LayerProfile {
            model: model.into(),
            forward_s,
            layers,
        };
        p.validate()?;
        Ok(p)
    }

    /// A profile of sizes only (backward times 0), layers named `layer{i}`.
    pub fn from_sizes(model: impl Into<String>, sizes: &[usize]) -> Result<Self> {
        let layers = sizes
            .iter()
            .enumerate()
            .map(|(i, &numel)| Layer {
                name: format!("layer{i}"),
                numel,
                backward_s: 0.0,
            })
            .collect();
        LayerProfile::new(model, 0.0, layers)
    }

    fn validate(&self) -> Result<()> {
        if self.layers.is_empty() {
            return Err(Error::EmptyProfile(self.model.clone()));
        }
        check_time(0, "<forward>", "forward_s", self.forward_s)?;
        for (i, l) in self.layers.iter().enumerate() {
            if l.numel == 0 {
                return Err(Error::InvalidLayer {
                    index: i,
                    name: l.name.clone(),
                    reason: "numel = 0; every layer needs at least one element".into(),
                });
            }
            if l.numel > u32::MAX as usize {
                return Err(Error::InvalidLayer {
                    index: i,
                    name: l.name.clone(),
                    reason: format!("numel = {} exceeds the u32 index range", l.numel),
                });
            }
            check_time(i, &l.name, "backward_s", l.backward_s)?;
        }
        Ok(())
    }

    /// Parses and validates the layer-profile JSON format.
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawProfile = serde_json::from_str(text)?;
        let mut layers = Vec::with_capacity(raw.layers.len());
        for (i, l) in raw.layers.into_iter().enumerate() {
            if l.numel <= 0 {
                return Err(Error::InvalidLayer {
                    index: i,
                    name: l.name,
                    reason: format!("numel = {}; sizes must be positive", l.numel),
                });
            }
            let Some(backward_s) = l.backward_s else {
                return Err(Error::InvalidLayer {
                    index: i,
                    name: l.name,
                    reason: "backward_s is null (not a finite number)".into(),
                });
            };
            layers.push(Layer {
                name: l.name,
                numel: l.numel as usize,
                backward_s,
            });
        }
        let forward_s = raw.forward_s.ok_or_else(|| Error::InvalidLayer {
            index: 0,
            name: "<forward>".into(),
            reason: "forward_s is null".into(),
        })?;
        LayerProfile::new(raw.model, forward_s, layers)
    }

    /// Reads a profile file.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let text = std::fs::read_to_string(path.as_ref())
            .map_err(|e| Error::Io(format!("{}: {e}", path.as_ref().display())))?;
        LayerProfile::from_json(&text)
    }

    /// The profile as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Model name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Forward time `t_f`, seconds.
    pub fn forward_s(&self) -> f64 {
        self.forward_s
    }

    /// Layers in forward order (never empty).
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// Number of layers `L`.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Always false: a valid profile has layers (kept for the `len` convention).
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Element counts in forward order.
    pub fn sizes(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.numel).collect()
    }

    /// Total parameters `d`.
    pub fn total_numel(&self) -> usize {
        self.layers.iter().map(|l| l.numel).sum()
    }

    /// Total backward time `t_b = Σ t_b^(l)` (OMGS-SGD (Shi et al., INFOCOM 2020) Eq. 3).
    pub fn total_backward_s(&self) -> f64 {
        self.layers.iter().map(|l| l.backward_s).sum()
    }

    /// The same profile with backward times replaced (forward order), e.g. measured ones.
    pub fn with_backward_times(&self, forward_s: f64, backward_s: &[f64]) -> Result<Self> {
        if backward_s.len() != self.layers.len() {
            return Err(Error::InvalidArgument(format!(
                "{} backward times for {} layers",
                backward_s.len(),
                self.layers.len()
            )));
        }
        let layers = self
            .layers
            .iter()
            .zip(backward_s)
            .map(|(l, &t)| Layer {
                backward_s: t,
                ..l.clone()
            })
            .collect();
        LayerProfile::new(self.model.clone(), forward_s, layers)
    }

    /// The same profile with every time multiplied by `factor` (a faster or slower device).
    pub fn scaled(&self, factor: f64) -> Result<Self> {
        let t: Vec<f64> = self.layers.iter().map(|l| l.backward_s * factor).collect();
        self.with_backward_times(self.forward_s * factor, &t)
    }
}

/// Averages per-layer backward times measured by the per-hook timestamp method (authors' code:
/// the difference of consecutive "gradient ready" timestamps), skipping `warmup` samples.
/// `samples[i][l]` is iteration `i`'s time of layer `l` in forward order.
pub fn average_backward(samples: &[Vec<f64>], warmup: usize) -> Result<Vec<f64>> {
    let used = samples.get(warmup..).unwrap_or(&[]);
    let Some(first) = used.first() else {
        return Err(Error::InvalidArgument(format!(
            "{} samples with {warmup} warm-up leave none to average",
            samples.len()
        )));
    };
    let mut sum = vec![0.0; first.len()];
    for s in used {
        if s.len() != sum.len() {
            return Err(Error::InvalidArgument(
                "samples of different lengths".into(),
            ));
        }
        for (a, b) in sum.iter_mut().zip(s) {
            *a += b;
        }
    }
    let n = used.len() as f64;
    Ok(sum.into_iter().map(|x| x / n).collect())
}

/// One rank's measured iteration for [`slowest_rank_times`]: its forward time and its
/// per-layer backward times in forward order (backward runs from the last layer).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RankSample {
    /// Forward time, seconds.
    pub forward_s: f64,
    /// Backward time per layer, forward order, seconds.
    pub backward_s: Vec<f64>,
}

/// The forward time and per-layer backward times that the slowest rank imposes, from every
/// rank's measurements (`samples[r][i]`: rank `r`, iteration `i`), skipping `warmup`
/// iterations.
///
/// Why: a group's collective starts when its last rank has the group ready, so what predicts
/// a synchronous iteration is not one rank's profile but, iteration by iteration, the latest
/// ready time over ranks. Layer `l`'s ready time on a rank is its forward time plus the
/// backward of layers `L − 1 … l`; this takes the maximum over ranks per iteration, averages
/// over iterations, and differences the result back into per-layer times (non-negative:
/// the ready times grow as backward goes on, and so do their maxima). With one rank it is
/// [`average_backward`]. Returns `(forward_s, backward_s)`.
pub fn slowest_rank_times(samples: &[Vec<RankSample>], warmup: usize) -> Result<(f64, Vec<f64>)> {
    let Some(first) = samples.first() else {
        return Err(Error::InvalidArgument("no rank's samples".into()));
    };
    let iters = first.len();
    if iters <= warmup {
        return Err(Error::InvalidArgument(format!(
            "{iters} samples with {warmup} warm-up leave none to average"
        )));
    }
    let layers = first[warmup].backward_s.len();
    if samples
        .iter()
        .any(|r| r.len() != iters || r.iter().any(|s| s.backward_s.len() != layers))
    {
        return Err(Error::InvalidArgument(
            "ranks' samples differ in iterations or layers".into(),
        ));
    }
    // ready[l]: mean over iterations of the latest ready time of layer l (forward: index L).
    let mut ready = vec![0.0; layers + 1];
    for i in warmup..iters {
        let mut latest = vec![0.0f64; layers + 1];
        for rank in samples {
            let s = &rank[i];
            let mut t = s.forward_s;
            latest[layers] = latest[layers].max(t);
            for l in (0..layers).rev() {
                t += s.backward_s[l];
                latest[l] = latest[l].max(t);
            }
        }
        for (a, b) in ready.iter_mut().zip(&latest) {
            *a += b;
        }
    }
    let n = (iters - warmup) as f64;
    ready.iter_mut().for_each(|r| *r /= n);
    let backward = (0..layers)
        .map(|l| (ready[l] - ready[l + 1]).max(0.0))
        .collect();
    Ok((ready[layers], backward))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_and_defaults() {
        let p = LayerProfile::from_json(
            r#"{"model":"m","layers":[{"name":"a","numel":3,"backward_s":1e-3},{"name":"b","numel":5}]}"#,
        )
        .unwrap();
        assert_eq!(p.sizes(), vec![3, 5]);
        assert_eq!(p.layers()[1].backward_s, 0.0);
        let back = LayerProfile::from_json(&p.to_json()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn slowest_rank_times_take_the_latest_ready_time_per_iteration() {
        let s = |f: f64, b: &[f64]| RankSample {
            forward_s: f,
            backward_s: b.to_vec(),
        };
        // Rank 0 is slow in forward, rank 1 in the last layer's backward (which runs first).
        let samples = vec![
            vec![s(9.0, &[0.0, 0.0]), s(3.0, &[1.0, 1.0])],
            vec![s(9.0, &[0.0, 0.0]), s(1.0, &[1.0, 4.0])],
        ];
        let (f, bw) = slowest_rank_times(&samples, 1).unwrap();
        // Ready times: layer 1 at max(3 + 1, 1 + 4) = 5, layer 0 at max(5, 6) = 6.
        assert_eq!(f, 3.0);
        assert_eq!(bw, vec![1.0, 2.0]);
        // One rank: the plain mean.
        let one = vec![vec![s(2.0, &[1.0, 3.0]), s(4.0, &[3.0, 5.0])]];
        let (f, bw) = slowest_rank_times(&one, 0).unwrap();
        assert_eq!(f, 3.0);
        assert_eq!(
            bw,
            average_backward(&[vec![1.0, 3.0], vec![3.0, 5.0]], 0).unwrap()
        );
        // Mismatched shapes and no samples left are typed errors.
        assert!(slowest_rank_times(&[vec![s(1.0, &[1.0])], vec![]], 0).is_err());
        assert!(slowest_rank_times(&one, 2).is_err());
        assert!(slowest_rank_times(&[], 0).is_err());
    }

    #[test]
    fn bad_profiles_are_typed_errors() {
        let e = LayerProfile::from_json(r#"{"model":"m","layers":[]}"#).unwrap_err();
        assert!(matches!(e, Error::EmptyProfile(_)));
        for bad in [
            r#"{"model":"m","layers":[{"name":"a","numel":0}]}"#,
            r#"{"model":"m","layers":[{"name":"a","numel":-4}]}"#,
            r#"{"model":"m","layers":[{"name":"a","numel":4,"backward_s":-1.0}]}"#,
            r#"{"model":"m","layers":[{"name":"a","numel":4,"backward_s":null}]}"#,
        ] {
            assert!(
                matches!(
                    LayerProfile::from_json(bad),
                    Err(Error::InvalidLayer { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            LayerProfile::from_json("{not json"),
            Err(Error::Json(_))
        ));
        let l = Layer {
            name: "x".into(),
            numel: 4,
            backward_s: f64::NAN,
        };
        assert!(matches!(
            LayerProfile::new("m", 0.0, vec![l]),
            Err(Error::InvalidLayer { .. })
        ));
        assert!(LayerProfile::from_sizes("m", &[1, 2]).unwrap().len() == 2);
        assert!(LayerProfile::new("m", f64::INFINITY, vec![]).is_err());
    }

    #[test]
    fn averages_skip_warmup() {
        let s = vec![vec![9.0, 9.0], vec![1.0, 2.0], vec![3.0, 4.0]];
        assert_eq!(average_backward(&s, 1).unwrap(), vec![2.0, 3.0]);
        assert!(average_backward(&s, 3).is_err());
    }
}
