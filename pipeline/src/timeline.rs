//! The iteration timeline of OMGS-SGD (Shi et al., INFOCOM 2020) (Eq. 2-9 and 17) for a merge plan:
//! per layer the backward span, per merged group the sparsification and communication spans, the
//! iteration time and the non-overlapped communication.
//!
//! The model: backward runs from the last layer to the first on the compute stream;
//! when a group's lowest layer finishes, the group is sparsified on the same stream
//! (Eq. 6-7: the next layer's backward waits for it), then communicated on a separate
//! stream in order (Eq. 8: a group's communication starts when it is sparsified and the
//! previous group's communication is done). `t_iter = τ_c^(1) + t_c^(1)` (Eq. 17) and
//! `t_c^no = t_iter − (τ_s^(1) + t_s^(1))` (Eq. 9, whose printed sign is a typo).
//!
//! Costs come through the small [`StepCosts`] trait so tests can plug in simple ones;
//! [`OmgsCosts`] and [`DenseCosts`] wrap the `cost_model` presets and calibrations.

use serde::{Deserialize, Serialize};

use crate::plan::MergePlan;
use crate::profile::LayerProfile;
use crate::{Error, Result};

/// Per-group costs the timeline needs. Both take the group's dense element count.
pub trait StepCosts {
    /// Time to sparsify (compress) a group of `numel` elements on the compute stream
    /// (`t_s`, OMGS-SGD (Shi et al., INFOCOM 2020) Eq. 10). Zero for dense schemes.
    fn sparsify_s(&self, numel: usize) -> f64;
    /// Time to communicate a group of `numel` elements (`t_c`, OMGS-SGD (Shi et al., INFOCOM 2020)
    /// Eq. 11).
    fn comm_s(&self, numel: usize) -> f64;
    /// Start-up time α of one communication (Theorem 1's α). Defaults to `comm_s(0)`,
    /// exact for affine models.
    fn comm_alpha_s(&self) -> f64 {
        self.comm_s(0)
    }
}

impl<T: StepCosts + ?Sized> StepCosts for &T {
    fn sparsify_s(&self, numel: usize) -> f64 {
        (**self).sparsify_s(numel)
    }
    fn comm_s(&self, numel: usize) -> f64 {
        (**self).comm_s(numel)
    }
    fn comm_alpha_s(&self) -> f64 {
        (**self).comm_alpha_s()
    }
}

/// Simple closed-form costs for tests and quick studies: `t_s = γ·x·log2 x` and
/// `t_c = α + β·x` (OMGS-SGD (Shi et al., INFOCOM 2020) Eq. 10-11 with x in elements).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SimpleCosts {
    /// γ·ρ of Eq. 10, seconds per `x·log2 x`.
    pub gamma: f64,
    /// α of Eq. 11, seconds.
    pub alpha: f64,
    /// β of Eq. 11, seconds per element.
    pub beta: f64,
}

fn xlog2x(x: usize) -> f64 {
    if x <= 1 {
        0.0
    } else {
        let x = x as f64;
        x * x.log2()
    }
}

impl StepCosts for SimpleCosts {
    fn sparsify_s(&self, numel: usize) -> f64 {
        self.gamma * xlog2x(numel)
    }
    fn comm_s(&self, numel: usize) -> f64 {
        self.alpha + self.beta * numel as f64
    }
}

/// Sparse costs of the OMGS 1 GbE cluster (or any calibration in the same form): top-k on
/// the dense group, all-gather of the `⌈ρ·x⌉` selected elements (the authors' code: the all-gather
/// model's `x` counts selected elements).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OmgsCosts {
    /// Top-k selection time model (OMGS-SGD (Shi et al., INFOCOM 2020) Eq. 10).
    pub topk: cost_model::TopkModel,
    /// All-gather time model of a sparse group (OMGS-SGD (Shi et al., INFOCOM 2020) Eq. 11).
    pub allgather: cost_model::SparseAllgatherModel,
    /// Density ρ: fraction of a group's elements sent.
    pub density: f64,
}

impl OmgsCosts {
    /// The paper's 1 GbE cluster at `p` workers (2, 4, 8 or 16), density 0.001.
    pub fn preset(p: usize) -> Result<Self> {
        let pre = cost_model::presets::omgs_1gbe(p)?;
        Ok(OmgsCosts {
            topk: pre.topk,
            allgather: pre.sparse_allgather,
            density: pre.density,
        })
    }

    /// The paper's 1 GbE cluster at `p` workers, at the density OMGS-SGD trains `model`
    /// with (0.005 for LSTM-PTB, 0.001 otherwise).
    pub fn preset_for(p: usize, model: &str) -> Result<Self> {
        let pre = cost_model::presets::omgs_1gbe(p)?.for_model(model)?;
        Ok(OmgsCosts {
            topk: pre.topk,
            allgather: pre.sparse_allgather,
            density: pre.density,
        })
    }

    /// Selected elements of a group of `numel`: `max(1, ⌈ρ·numel⌉)`.
    pub fn selected(&self, numel: usize) -> usize {
        ((self.density * numel as f64).ceil() as usize).clamp(1, numel.max(1))
    }
}

impl StepCosts for OmgsCosts {
    fn sparsify_s(&self, numel: usize) -> f64 {
        self.topk.time(numel)
    }
    fn comm_s(&self, numel: usize) -> f64 {
        self.allgather.time(self.selected(numel))
    }
    fn comm_alpha_s(&self) -> f64 {
        self.allgather.time(0)
    }
}

/// Dense costs (P-SGD / MG-WFBP): no sparsification, all-reduce `α + β·bytes` of the f32
/// group (the preset's MG-WFBP constants, or a calibration).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DenseCosts {
    /// All-reduce time model, `n` in bytes.
    pub allreduce: cost_model::LinearModel,
}

impl DenseCosts {
    /// The MG-WFBP constants the OMGS authors' code carries.
    pub fn preset(p: usize) -> Result<Self> {
        Ok(DenseCosts {
            allreduce: cost_model::presets::omgs_1gbe(p)?.dense,
        })
    }
}

impl StepCosts for DenseCosts {
    fn sparsify_s(&self, _numel: usize) -> f64 {
        0.0
    }
    fn comm_s(&self, numel: usize) -> f64 {
        self.allreduce.time(numel * 4)
    }
    fn comm_alpha_s(&self) -> f64 {
        self.allreduce.alpha_s
    }
}

/// Sparse costs from a machine calibration (`cargo xtask calibrate`): its exact top-k fit
/// (else its first) for `t_s`, and for `t_c` its piecewise all-gather fit (bytes per rank:
/// 8 per selected element, index and value) or, without one, a ring all-gather over its
/// ping-pong link, `(P − 1)·(α + β·bytes)`, plus the exchange's dense output: the sparse
/// all-gather hands back the averaged group as a dense vector (zero-filled, the gathered
/// entries added in, then scaled), priced as one local reduction pass over the group's
/// bytes (the calibration's reduction fit). Without that term the communication part of a
/// 2.2-million-weight MLP's iteration was predicted at 0.008 ms against 1.05 ms for its
/// exchanges timed alone (`cargo xtask calibrate --ranks 2`, three groups).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibratedCosts {
    /// Top-k time model (the exact selector's fit when the calibration swept it).
    pub topk: cost_model::TopkModel,
    /// All-gather time against bytes per rank: the calibration's direct fit of the
    /// all-gather (its piecewise model), or `None` to price it from the ping-pong link.
    pub allgather: Option<cost_model::CollectiveFit>,
    /// All-gather `α + β·bytes` from the ping-pong link, `P − 1` rounds, when the
    /// calibration has no all-gather fit.
    pub allgather_link: cost_model::LinearModel,
    /// Time of one local reduction pass against bytes (the calibration's fit per size
    /// regime, or its single line): the exchange's dense output. `None` without a
    /// reduction sweep (the output then goes unpriced).
    #[serde(default)]
    pub dense_output: Option<cost_model::fit::PiecewiseLinear>,
    /// Density ρ.
    pub density: f64,
}

impl CalibratedCosts {
    /// Costs from `cal` at `density`.
    pub fn from_calibration(cal: &cost_model::Calibration, density: f64) -> Result<Self> {
        let topk = cal
            .topk_model("exact")
            .or_else(|| cal.topk.first().map(|t| t.fit.model))
            .ok_or_else(|| Error::InvalidArgument("the calibration has no top-k fit".into()))?;
        // The ring all-gather is what the sparse step sends its entries with.
        let allgather = cal
            .collective_fit(
                cost_model::Collective::Allgather,
                cost_model::Algorithm::Ring,
            )
            .or_else(|| {
                cal.collectives
                    .iter()
                    .find(|c| c.op == cost_model::Collective::Allgather)
            })
            .cloned();
        let link = cal.pingpong.model;
        let rounds = cal.ranks.saturating_sub(1).max(1) as f64;
        // The reduction fit per size regime, else (an older calibration) its single line
        // as one segment over every size.
        let dense_output = cal
            .reduction_piecewise
            .as_ref()
            .map(|f| f.model.clone())
            .or_else(|| {
                let r = cal.reduction?.model;
                Some(cost_model::fit::PiecewiseLinear {
                    segments: vec![cost_model::fit::Segment {
                        start: 0.0,
                        fitted_min: 0.0,
                        fitted_max: f64::MAX,
                        model: cost_model::LinearModel::new(r.alpha_s, r.beta_s + r.gamma_s),
                    }],
                })
            });
        Ok(CalibratedCosts {
            topk,
            allgather,
            allgather_link: cost_model::LinearModel::new(
                rounds * link.alpha_s,
                rounds * link.beta_s,
            ),
            dense_output,
            density,
        })
    }

    fn allgather_s(&self, bytes: usize) -> f64 {
        match &self.allgather {
            Some(fit) => fit.time(bytes),
            None => self.allgather_link.time(bytes),
        }
    }
}

impl StepCosts for CalibratedCosts {
    fn sparsify_s(&self, numel: usize) -> f64 {
        self.topk.time(numel)
    }
    fn comm_s(&self, numel: usize) -> f64 {
        let k = ((self.density * numel as f64).ceil() as usize).clamp(1, numel.max(1));
        let output = self
            .dense_output
            .as_ref()
            .map_or(0.0, |m| m.time(4 * numel).max(0.0));
        self.allgather_s(8 * k) + output
    }
    fn comm_alpha_s(&self) -> f64 {
        // The start-up cost: the smallest message's time.
        self.allgather_s(8)
    }
}

/// Costs with sparsification removed (the dense MG-WFBP view of any comm model).
#[derive(Debug, Clone, Copy)]
pub struct NoSparsify<C>(pub C);

impl<C: StepCosts> StepCosts for NoSparsify<C> {
    fn sparsify_s(&self, _numel: usize) -> f64 {
        0.0
    }
    fn comm_s(&self, numel: usize) -> f64 {
        self.0.comm_s(numel)
    }
    fn comm_alpha_s(&self) -> f64 {
        self.0.comm_alpha_s()
    }
}

/// A time interval, seconds from the start of the iteration.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Span {
    /// Start, seconds.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
}

impl Span {
    /// `end − start`.
    pub fn len(&self) -> f64 {
        self.end - self.start
    }
}

/// One merged group's spans.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupTiming {
    /// Layers of the group (forward-order indices, ascending).
    pub layers: Vec<usize>,
    /// Elements in the group.
    pub numel: usize,
    /// Sparsification span (`τ_s`, `t_s`).
    pub sparsify: Span,
    /// Communication span (`τ_c`, `t_c`).
    pub comm: Span,
    /// What a data-dependent exchange sent (measured timelines of threshold algorithms);
    /// `None` in predictions and where the traffic follows from the size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<Traffic>,
}

/// The traffic of one data-dependent sparse exchange, from its step statistics: a threshold
/// algorithm (ExDyna) selects a data-dependent count, so its time follows from what it
/// selected, not from `ρ` alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// Density of the update, `nnz / d` (the ranks' selections are disjoint: their sum).
    pub density: f64,
    /// Padding overhead `P · max_i k_i / Σ_i k_i` of the all-gather (1 where nothing pads).
    pub padding: f64,
}

/// A predicted or measured iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Forward span (`t_f`).
    pub forward: Span,
    /// Backward span per layer, forward order (`τ_b^(l)`, `t_b^(l)`).
    pub backward: Vec<Span>,
    /// Groups in communication order (the group holding the last layer first).
    pub groups: Vec<GroupTiming>,
    /// Iteration time (Eq. 17; measured: until `finish` had every group back).
    pub iteration_s: f64,
    /// When the compute stream finished (backward and sparsification).
    pub compute_end_s: f64,
    /// Non-overlapped communication `t_c^no` (Eq. 9).
    pub non_overlapped_comm_s: f64,
}

impl Timeline {
    /// Total sparsification time `Σ t_s`.
    pub fn total_sparsify_s(&self) -> f64 {
        self.groups.iter().map(|g| g.sparsify.len()).sum()
    }

    /// Total communication time `Σ t_c`.
    pub fn total_comm_s(&self) -> f64 {
        self.groups.iter().map(|g| g.comm.len()).sum()
    }
}

fn checked(what: &'static str, numel: usize, v: f64) -> Result<f64> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(Error::InvalidCost {
            what,
            numel,
            value: v,
        })
    }
}

/// Predicts the timeline of `plan` on `profile` with `costs` (OMGS-SGD (Shi et al., INFOCOM 2020)
/// Eq. 2-9, 17).
pub fn predict(
    profile: &LayerProfile,
    plan: &MergePlan,
    costs: &impl StepCosts,
) -> Result<Timeline> {
    plan.check_layers(profile.len())?;
    let layers = profile.layers();
    let tf = profile.forward_s();
    let mut backward = vec![Span::default(); layers.len()];
    let mut groups = Vec::with_capacity(plan.num_groups());
    let mut t = tf; // compute stream
    let mut comm_free = 0.0f64;
    for g in plan.groups().iter().rev() {
        let mut numel = 0;
        for &l in g.iter().rev() {
            backward[l] = Span {
                start: t,
                end: t + layers[l].backward_s,
            };
            t += layers[l].backward_s;
            numel += layers[l].numel;
        }
        let ts = checked("sparsify_s", numel, costs.sparsify_s(numel))?;
        let tc = checked("comm_s", numel, costs.comm_s(numel))?;
        let sparsify = Span {
            start: t,
            end: t + ts,
        };
        t += ts;
        let cstart = t.max(comm_free);
        comm_free = cstart + tc;
        groups.push(GroupTiming {
            layers: g.clone(),
            numel,
            sparsify,
            comm: Span {
                start: cstart,
                end: comm_free,
            },
            traffic: None,
        });
    }
    Ok(Timeline {
        forward: Span {
            start: 0.0,
            end: tf,
        },
        backward,
        groups,
        iteration_s: comm_free.max(t),
        compute_end_s: t,
        non_overlapped_comm_s: (comm_free - t).max(0.0),
    })
}

/// Iteration time of a plan given by group boundaries, without building a [`Timeline`]:
/// `ends[i]` is the (exclusive, forward-order) end of group `i`, groups ascending. Used by
/// the planners' inner loops; costs are trusted (see [`predict`] for the checked path).
pub(crate) fn iteration_time_bounds(
    backward: &[f64],
    sizes: &[usize],
    forward_s: f64,
    starts: &[usize],
    costs: &impl StepCosts,
) -> f64 {
    // starts: ascending group starts, first is 0.
    let mut t = forward_s;
    let mut comm_free = 0.0f64;
    let mut hi = backward.len();
    for &lo in starts.iter().rev() {
        let mut numel = 0;
        for l in (lo..hi).rev() {
            t += backward[l];
            numel += sizes[l];
        }
        t += costs.sparsify_s(numel);
        comm_free = t.max(comm_free) + costs.comm_s(numel);
        hi = lo;
    }
    comm_free.max(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Layer;

    /// [`SimpleCosts`] with γ, α, β.
    fn costs(gamma: f64, alpha: f64, beta: f64) -> SimpleCosts {
        SimpleCosts { gamma, alpha, beta }
    }

    /// The calibrated communication of a group is its all-gather plus its dense output,
    /// one reduction pass over the group's bytes (per size regime when the calibration has
    /// them, else its single line), and the all-gather alone without a reduction sweep.
    #[test]
    fn calibrated_communication_prices_the_dense_output() {
        use cost_model::fit::{fit_linear, fit_reduction, fit_reduction_piecewise};
        use cost_model::{Calibration, Sample, Topology};
        let line = |a: f64, b: f64| -> Vec<Sample> {
            [1e3, 1e4, 1e5, 1e6, 1e7]
                .iter()
                .map(|&n| Sample::new(n, a + b * n))
                .collect()
        };
        let pingpong = fit_linear(&line(2e-6, 1e-10)).unwrap();
        let red = line(1e-6, 2e-10);
        let mut cal = Calibration {
            schema: cost_model::calibration::SCHEMA,
            backend: "thread".into(),
            ranks: 2,
            topology: Topology::flat(2, cost_model::Link::new(2e-6, 1e-10)).unwrap(),
            pingpong,
            pingpong_piecewise: None,
            reduction: Some(fit_reduction(&red, 0.0).unwrap()),
            reduction_piecewise: Some(fit_reduction_piecewise(&red).unwrap()),
            collectives: vec![],
            topk: vec![],
        };
        let with_topk = |cal: &Calibration| {
            let mut c = cal.clone();
            c.topk.push(cost_model::TopkFit {
                selector: "exact".into(),
                density: 0.01,
                fit: cost_model::fit_topk_linear(&line(1e-6, 1e-9)).unwrap(),
            });
            c
        };
        let numel = 1 << 20;
        let k = (0.01 * numel as f64).ceil();
        let gather = 2e-6 + 1e-10 * 8.0 * k;
        let output = 1e-6 + 2e-10 * 4.0 * numel as f64;
        for piecewise in [true, false] {
            let mut c = with_topk(&cal);
            if !piecewise {
                c.reduction_piecewise = None;
            }
            let costs = CalibratedCosts::from_calibration(&c, 0.01).unwrap();
            let got = costs.comm_s(numel);
            assert!(
                (got - gather - output).abs() < 1e-9 * output,
                "{got} {piecewise}"
            );
            // Every term is finite, so the costs survive JSON.
            let text = serde_json::to_string(&costs).unwrap();
            let back: CalibratedCosts = serde_json::from_str(&text).unwrap();
            assert_eq!(back, costs, "{piecewise}");
        }
        cal.reduction = None;
        cal.reduction_piecewise = None;
        let costs = CalibratedCosts::from_calibration(&with_topk(&cal), 0.01).unwrap();
        assert!((costs.comm_s(numel) - gather).abs() < 1e-12);
    }

    fn prof(spec: &[(usize, f64)]) -> LayerProfile {
        let layers = spec
            .iter()
            .enumerate()
            .map(|(i, &(n, t))| Layer {
                name: format!("l{i}"),
                numel: n,
                backward_s: t,
            })
            .collect();
        LayerProfile::new("t", 0.5, layers).unwrap()
    }

    #[test]
    fn layerwise_matches_eq_5_to_9_by_hand() {
        // Two layers, t_s = 0 (γ = 0), t_c = 1 + 0.1·x.
        let p = prof(&[(10, 2.0), (20, 1.0)]);
        let c = costs(0.0, 1.0, 0.1);
        let t = predict(&p, &MergePlan::layerwise(2), &c).unwrap();
        let span = |start, end| Span { start, end };
        // Layer 2 (index 1): backward 0.5..1.5, comm 1.5..4.5; layer 1: backward 1.5..3.5,
        // comm max(3.5, 4.5)..6.5.
        assert_eq!(t.backward[1], span(0.5, 1.5));
        assert_eq!(t.groups[0].comm, span(1.5, 4.5));
        assert_eq!(t.groups[1].comm, span(4.5, 6.5));
        assert_eq!(t.iteration_s, 6.5);
        assert_eq!(t.compute_end_s, 3.5);
        assert_eq!(t.non_overlapped_comm_s, 3.0);
        let single = predict(&p, &MergePlan::single(2), &c).unwrap();
        // Eq. 4 without t_s: t_f + t_b + t_c = 0.5 + 3 + 4.
        assert!((single.iteration_s - 7.5).abs() < 1e-12);
    }

    #[test]
    fn sparsification_delays_the_next_backward() {
        let p = prof(&[(4, 1.0), (4, 1.0)]);
        let c = costs(0.25, 0.0, 0.0);
        let t = predict(&p, &MergePlan::layerwise(2), &c).unwrap();
        // t_s(4) = 0.25·4·2 = 2: layer 0's backward starts after layer 1's sparsification.
        assert_eq!(t.backward[0].start, 0.5 + 1.0 + 2.0);
        assert_eq!(t.total_sparsify_s(), 4.0);
    }

    #[test]
    fn bad_costs_are_typed_errors() {
        struct Nan;
        impl StepCosts for Nan {
            fn sparsify_s(&self, _: usize) -> f64 {
                f64::NAN
            }
            fn comm_s(&self, _: usize) -> f64 {
                1.0
            }
        }
        let p = prof(&[(4, 1.0)]);
        assert!(matches!(
            predict(&p, &MergePlan::single(1), &Nan),
            Err(Error::InvalidCost { .. })
        ));
        assert!(predict(&p, &MergePlan::single(2), &costs(0.0, 0.0, 0.0)).is_err());
    }

    #[test]
    fn fast_path_agrees_with_predict() {
        let p = prof(&[(100, 0.3), (5, 0.1), (700, 0.7), (3, 0.05)]);
        let c = costs(1e-3, 0.2, 1e-3);
        let plan = MergePlan::from_starts(4, vec![0, 2, 3]).unwrap();
        let full = predict(&p, &plan, &c).unwrap().iteration_s;
        let bw: Vec<f64> = p.layers().iter().map(|l| l.backward_s).collect();
        let fast = iteration_time_bounds(&bw, &p.sizes(), p.forward_s(), plan.starts(), &c);
        assert!((full - fast).abs() < 1e-12);
    }
}
