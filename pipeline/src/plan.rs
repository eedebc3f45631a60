//! Merge plans (contiguous groups of layers communicated together) and the planners of OMGS-SGD
//! (Shi et al., INFOCOM 2020): layer-wise (LAGS-SGD), one group (TopK-SGD), threshold merging
//! (MGS-SGD, the authors' semantics), OMGS Algorithm 1 (Theorem 1's Q3 ∧ Q5 rule), the dense
//! MG-WFBP variant, an exact planner (dynamic programming over non-dominated states) and an
//! exhaustive search over all `2^(L−1)` plans as the reference.
//!
//! Algorithm 1 is a greedy pass; under the timeline model it does not always reach the
//! optimum (the test `omgs_algorithm_1_is_not_always_optimal` shows a profile where it
//! misses), so the default planner is [`Planner::Exact`], which does.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::profile::LayerProfile;
use crate::timeline::{iteration_time_bounds, predict, NoSparsify, StepCosts};
use crate::{Error, Result};

/// A partition of the layers `0..L` (forward order) into contiguous groups. Groups are
/// stored in forward order; they are sparsified and communicated in reverse (the group
/// holding the last layer first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergePlan {
    layers: usize,
    starts: Vec<usize>,
}

impl MergePlan {
    /// A plan from ascending group starts (the first must be 0, all `< layers`).
    pub fn from_starts(layers: usize, starts: Vec<usize>) -> Result<Self> {
        if layers == 0 {
            return Err(Error::InvalidPlan("a plan needs at least one layer".into()));
        }
        if starts.first() != Some(&0) {
            return Err(Error::InvalidPlan(
                "the first group must start at layer 0".into(),
            ));
        }
        if starts.windows(2).any(|w| w[0] >= w[1]) || starts.iter().any(|&s| s >= layers) {
            return Err(Error::InvalidPlan(format!(
                "group starts {starts:?} must be strictly increasing and below {layers}"
            )));
        }
        Ok(MergePlan { layers, starts })
    }

    /// A plan from groups of layer indices (forward order, contiguous, covering `0..layers`).
    pub fn from_groups(layers: usize, groups: &[Vec<usize>]) -> Result<Self> {
        let mut next = 0;
        let mut starts = Vec::with_capacity(groups.len());
        for g in groups {
            if g.is_empty() {
                return Err(Error::InvalidPlan("empty group".into()));
            }
            for (i, &l) in g.iter().enumerate() {
                if l != next + i {
                    return Err(Error::InvalidPlan(format!(
                        "groups must list layers 0..{layers} contiguously in order; found {l} where {} was expected",
                        next + i
                    )));
                }
            }
            starts.push(next);
            next += g.len();
        }
        if next != layers {
            return Err(Error::InvalidPlan(format!(
                "groups cover {next} layers, the profile has {layers}"
            )));
        }
        MergePlan::from_starts(layers, starts)
    }

    /// Every layer its own group (LAGS-SGD).
    pub fn layerwise(layers: usize) -> Self {
        MergePlan {
            layers,
            starts: (0..layers).collect(),
        }
    }

    /// All layers in one group (TopK-SGD).
    pub fn single(layers: usize) -> Self {
        MergePlan {
            layers,
            starts: vec![0],
        }
    }

    /// Number of layers `L`.
    pub fn num_layers(&self) -> usize {
        self.layers
    }

    /// Number of groups (communications per iteration, OMGS-SGD (Shi et al., INFOCOM 2020)
    /// Table V).
    pub fn num_groups(&self) -> usize {
        self.starts.len()
    }

    /// Group starts, ascending.
    pub fn starts(&self) -> &[usize] {
        &self.starts
    }

    /// Layer range of group `g` (forward order).
    pub fn range(&self, g: usize) -> std::ops::Range<usize> {
        let end = self.starts.get(g + 1).copied().unwrap_or(self.layers);
        self.starts[g]..end
    }

    /// Groups as lists of layer indices, forward order.
    pub fn groups(&self) -> Vec<Vec<usize>> {
        (0..self.num_groups())
            .map(|g| self.range(g).collect())
            .collect()
    }

    /// The group holding `layer`.
    pub fn group_of(&self, layer: usize) -> usize {
        self.starts.partition_point(|&s| s <= layer) - 1
    }

    /// Checks the plan is for `layers` layers.
    pub fn check_layers(&self, layers: usize) -> Result<()> {
        if self.layers == layers {
            Ok(())
        } else {
            Err(Error::InvalidPlan(format!(
                "plan is for {} layers, the profile has {layers}",
                self.layers
            )))
        }
    }
}

/// Default threshold of MGS-SGD: 8192 elements (OMGS-SGD (Shi et al., INFOCOM 2020) §V-D,
/// footnote 10).
pub const DEFAULT_THRESHOLD: usize = 8192;

/// Largest profile the exhaustive search accepts (`2^(L−1)` plans).
pub const EXHAUSTIVE_MAX_LAYERS: usize = 22;

/// A merge planner. Names: `lags`, `topk`, `threshold` (or `threshold:N`), `omgs`,
/// `exact`, `mgwfbp`, `exhaustive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Planner {
    /// Layer-wise, every tensor its own group (LAGS-SGD).
    Lags,
    /// One group (TopK-SGD).
    TopK,
    /// Threshold merging with this many elements (MGS-SGD).
    Threshold(usize),
    /// OMGS-SGD (Shi et al., INFOCOM 2020) Algorithm 1 (FindMergedLayers, Theorem 1's Q3 ∧ Q5).
    Omgs,
    /// Exact optimum of the timeline model (dynamic programming); the default.
    #[default]
    Exact,
    /// MG-WFBP: Algorithm 1 with no sparsification cost (the dense merge rule).
    MgWfbp,
    /// Every plan tried (reference for small `L`).
    Exhaustive,
}

impl std::fmt::Display for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Planner::Lags => write!(f, "lags"),
            Planner::TopK => write!(f, "topk"),
            Planner::Threshold(DEFAULT_THRESHOLD) => write!(f, "threshold"),
            Planner::Threshold(n) => write!(f, "threshold:{n}"),
            Planner::Omgs => write!(f, "omgs"),
            Planner::Exact => write!(f, "exact"),
            Planner::MgWfbp => write!(f, "mgwfbp"),
            Planner::Exhaustive => write!(f, "exhaustive"),
        }
    }
}

impl FromStr for Planner {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "lags" => Planner::Lags,
            "topk" => Planner::TopK,
            "threshold" | "mgs" => Planner::Threshold(DEFAULT_THRESHOLD),
            "omgs" => Planner::Omgs,
            "exact" | "default" => Planner::Exact,
            "mgwfbp" => Planner::MgWfbp,
            "exhaustive" => Planner::Exhaustive,
            other => match other.strip_prefix("threshold:").map(str::parse::<usize>) {
                Some(Ok(n)) => Planner::Threshold(n),
                _ => return Err(Error::UnknownPlanner(other.to_string())),
            },
        })
    }
}

impl Planner {
    /// Every planner that runs on any profile (the exhaustive search excluded).
    pub const ALL: [Planner; 6] = [
        Planner::Lags,
        Planner::TopK,
        Planner::Threshold(DEFAULT_THRESHOLD),
        Planner::Omgs,
        Planner::MgWfbp,
        Planner::Exact,
    ];

    /// Plans `profile` under `costs`.
    pub fn plan(&self, profile: &LayerProfile, costs: &impl StepCosts) -> Result<MergePlan> {
        let l = profile.len();
        match *self {
            Planner::Lags => Ok(MergePlan::layerwise(l)),
            Planner::TopK => Ok(MergePlan::single(l)),
            Planner::Threshold(n) => Ok(threshold(profile, n)),
            Planner::Omgs => algorithm1(profile, costs),
            Planner::MgWfbp => algorithm1(profile, &NoSparsify(costs)),
            Planner::Exact => exact(profile, costs),
            Planner::Exhaustive => exhaustive(profile, costs),
        }
    }
}

/// Threshold merging (MGS-SGD) as the OMGS authors' code does it: walk from the
/// last tensor to the first adding element counts; the group closes right after the tensor
/// that makes the running total reach `threshold`; leftovers form the last group.
pub fn threshold(profile: &LayerProfile, threshold: usize) -> MergePlan {
    let mut starts = Vec::new();
    let mut total = 0usize;
    let layers = profile.layers();
    for l in (0..layers.len()).rev() {
        total += layers[l].numel;
        if total >= threshold && l > 0 {
            starts.push(l);
            total = 0;
        }
    }
    starts.push(0);
    starts.reverse();
    MergePlan {
        layers: layers.len(),
        starts,
    }
}

/// OMGS-SGD (Shi et al., INFOCOM 2020) Algorithm 1 (FindMergedLayers): start with every layer
/// normal; for `l = L → 2` make `l` a merged layer (merge its group into layer `l−1`) when
/// Theorem 1's Q3 ∧ Q5 holds, then recompute the start times (Eq. 13-15) before looking at the next
/// layer.
pub fn algorithm1(profile: &LayerProfile, costs: &impl StepCosts) -> Result<MergePlan> {
    let l_count = profile.len();
    let layers = profile.layers();
    let alpha = costs.comm_alpha_s();
    // merged[l]: layer l (forward index ≥ 1) is merged into l−1.
    let mut merged = vec![false; l_count];
    let mut plan = MergePlan::layerwise(l_count);
    let mut tl = predict(profile, &plan, costs)?;
    for l in (1..l_count).rev() {
        // The group whose lowest layer is l (layers above may already be merged into it).
        let gi = tl
            .groups
            .iter()
            .position(|g| g.layers.first() == Some(&l))
            .ok_or_else(|| Error::InvalidPlan("timeline lost a group".into()))?;
        let g = &tl.groups[gi];
        let d_l = g.numel;
        let d_prev = layers[l - 1].numel;
        // u = τ_b^(l) + t_b^(l) + t_b^(l−1) (the group's backward end plus layer l−1's).
        let u = tl.backward[l].end + layers[l - 1].backward_s;
        let tau_c = g.comm.start;
        let q3 = u + costs.sparsify_s(d_l) + costs.sparsify_s(d_prev) < tau_c + costs.comm_s(d_l);
        let q5 = tau_c + alpha > u + costs.sparsify_s(d_l + d_prev);
        if q3 && q5 {
            merged[l] = true;
            let starts = (0..l_count).filter(|&i| i == 0 || !merged[i]).collect();
            plan = MergePlan::from_starts(l_count, starts)?;
            tl = predict(profile, &plan, costs)?;
        }
    }
    Ok(plan)
}

#[derive(Clone, Copy)]
struct State {
    /// Total communication time of the suffix's groups.
    a: f64,
    /// Compute-side critical path of the suffix (relative to its compute start).
    d: f64,
    next: usize,
    idx: usize,
}

/// Adds candidate `s` to the boundary's staircase `front` (ascending `a`, strictly
/// descending `d`) unless a state already there dominates it, and drops the states it
/// dominates. A suffix state's final value is `C + max(δ + A, D)` where the prefix's
/// `δ = E − C ≥ lo`, so `s1` dominates `s2` on every such prefix when `A1 ≤ A2` and
/// `D1 ≤ max(D2, lo + A2)`. That relation is transitive, and along the staircase the
/// nearest state below `s` (in `(a, d)` order) has the smallest `d` of all below it, so
/// one binary search decides almost every candidate; the front stays a few dozen states
/// long, which keeps the rare insertions cheap. The kept set is the one a sort of all
/// candidates followed by a left-to-right sweep would keep.
fn insert_state(front: &mut Vec<State>, s: State, lo: f64) {
    let pos = front.partition_point(|x| x.a < s.a || (x.a == s.a && x.d <= s.d));
    if pos > 0 && front[pos - 1].d <= s.d.max(lo + s.a) {
        return;
    }
    let mut w = pos;
    for r in pos..front.len() {
        let t = front[r];
        if s.d > t.d.max(lo + t.a) {
            front[w] = t;
            w += 1;
        }
    }
    front.truncate(w);
    front.insert(pos, s);
}

/// Finishes a boundary's front from its staircase (see [`insert_state`]): a prefix's
/// `δ` also lies below `hi` for every prefix that can still beat the upper bound, so
/// for `A1 > A2`, `s1` dominates `s2` when `D1 ≤ D2` and `hi + A1 ≤ D2`.
fn finish_front(kept: &[State], hi: f64, thin_width: f64, cap: usize) -> Vec<State> {
    // Right to left: the next kept state has the smallest `a` of all with smaller `d`.
    let mut out: Vec<State> = Vec::with_capacity(kept.len());
    for &r in kept.iter().rev() {
        if let Some(next) = out.last() {
            if hi + next.a <= r.d {
                continue;
            }
        }
        out.push(r);
    }
    out.reverse();
    if out.len() > THIN_ABOVE {
        thin(&mut out, thin_width);
    }
    if out.len() > cap {
        // Keep `cap` states spread along the front, both ends included.
        let n = out.len();
        out = (0..cap)
            .map(|i| out[i * (n - 1) / (cap - 1).max(1)])
            .collect();
    }
    out
}

/// Fronts longer than this are thinned (see [`exact`]).
const THIN_ABOVE: usize = 16;
/// States per boundary in [`exact`]'s first (upper-bound) pass.
const FIRST_PASS_CAP: usize = 3;
/// Width of a thinning bucket, relative to the upper bound.
const THIN_WIDTH: f64 = 1e-5;

/// Keeps, per bucket of `a` values `width` wide, only the state with the smallest `d`
/// (the last one, as `d` descends). Replacing a state by one whose `a` is at most `width`
/// larger and whose `d` is smaller costs at most `width` on the final time per boundary.
fn thin(front: &mut Vec<State>, width: f64) {
    let mut out: Vec<State> = Vec::with_capacity(front.len());
    let mut start = f64::NEG_INFINITY;
    for &s in front.iter() {
        match out.last_mut() {
            Some(last) if s.a - start < width => *last = s,
            _ => {
                start = s.a;
                out.push(s);
            }
        }
    }
    *front = out;
}

/// The exact optimum of the timeline model.
///
/// Communication is a single in-order queue, so for a suffix of groups (in backward
/// order) starting when compute is at `C` and the link is busy until `E`, the link
/// finishes at `max(E + A, C + D)`, where `A = Σ t_c` of the suffix and
/// `D = max_g (ready_g − C + Σ_{h ≥ g} t_c^(h))` its compute-side critical path. Both
/// only grow what follows, so a dynamic program from the first layer backwards keeps, at
/// each boundary, the Pareto front of `(A, D)` over suffix plans; `A` takes few distinct
/// values (about α times the number of groups), which keeps fronts small. States that
/// cannot beat the best baseline plan (a lower bound from the cheapest possible prefix)
/// are dropped. The result equals the exhaustive search (property-tested).
pub fn exact(profile: &LayerProfile, costs: &impl StepCosts) -> Result<MergePlan> {
    let l_count = profile.len();
    let layers = profile.layers();
    let tf = profile.forward_s();
    // Prefix sums over backward positions (position i = forward layer L−1−i).
    let mut b = vec![0.0; l_count + 1];
    let mut n = vec![0usize; l_count + 1];
    for i in 0..l_count {
        let layer = &layers[l_count - 1 - i];
        b[i + 1] = b[i] + layer.backward_s;
        n[i + 1] = n[i] + layer.numel;
    }
    // Costs of every candidate group [j, k) (row j holds the groups starting at j),
    // checked once. In the same row-major sweep: the cheapest total sparsification of
    // the prefix [0, k) over any grouping (`ts_min`, a lower bound for the compute time
    // spent before boundary k, relaxed forward from each final `ts_min[j]`) and the
    // cheapest communication of any group ending at k (`tc_in`).
    let w = l_count + 1;
    let idx = |j: usize, k: usize| j * w + k;
    let mut ts = vec![0.0; w * w];
    let mut tc = vec![0.0; w * w];
    let mut ts_min = vec![f64::INFINITY; w];
    ts_min[0] = 0.0;
    let mut tc_in = vec![f64::INFINITY; w];
    for j in 0..l_count {
        let base = ts_min[j];
        for k in j + 1..=l_count {
            let numel = n[k] - n[j];
            let s = costs.sparsify_s(numel);
            let c = costs.comm_s(numel);
            if !(s.is_finite() && s >= 0.0) {
                return Err(Error::InvalidCost {
                    what: "sparsify_s",
                    numel,
                    value: s,
                });
            }
            if !(c.is_finite() && c >= 0.0) {
                return Err(Error::InvalidCost {
                    what: "comm_s",
                    numel,
                    value: c,
                });
            }
            ts[idx(j, k)] = s;
            tc[idx(j, k)] = c;
            ts_min[k] = ts_min[k].min(base + s);
            tc_in[k] = tc_in[k].min(c);
        }
    }
    // Lower bounds at each boundary j over all prefix plans: compute done
    // (`c_min[j]`) and link free (`e_min[j]`), by the monotone recurrences relaxed to them
    // (forward, row by row, like `ts_min`).
    let c_min: Vec<f64> = (0..=l_count).map(|j| tf + b[j] + ts_min[j]).collect();
    let mut e_min = vec![f64::INFINITY; w];
    e_min[0] = 0.0;
    for j in 0..l_count {
        let e = e_min[j];
        let row = &tc[idx(j, 0)..idx(j + 1, 0)];
        for k in j + 1..=l_count {
            e_min[k] = e_min[k].min(c_min[k].max(e) + row[k]);
        }
    }
    // Upper bound: the best of the cheap baselines.
    let bw: Vec<f64> = layers.iter().map(|l| l.backward_s).collect();
    let sizes = profile.sizes();
    let mut ub = f64::INFINITY;
    for plan in [
        MergePlan::single(l_count),
        MergePlan::layerwise(l_count),
        threshold(profile, DEFAULT_THRESHOLD),
    ] {
        ub = ub.min(iteration_time_bounds(&bw, &sizes, tf, plan.starts(), costs));
    }
    let ub = ub * (1.0 + 1e-9) + 1e-15;
    // Least total communication of any suffix plan from boundary j.
    let mut a_min = vec![0.0; l_count + 1];
    for j in (0..l_count).rev() {
        a_min[j] = (j + 1..=l_count)
            .map(|k| tc[idx(j, k)] + a_min[k])
            .fold(f64::INFINITY, f64::min);
    }
    // The dynamic program under upper bound `ub`, keeping at most `cap` states per
    // boundary; returns the best plan's group starts.
    let thin_width = THIN_WIDTH * ub;
    let run = |ub: f64, cap: usize| -> Result<Vec<usize>> {
        let mut fronts: Vec<Vec<State>> = vec![Vec::new(); l_count + 1];
        fronts[l_count].push(State {
            a: 0.0,
            d: f64::NEG_INFINITY,
            next: l_count,
            idx: 0,
        });
        let mut stair: Vec<State> = Vec::new();
        for j in (0..l_count).rev() {
            let (c_lo, e_lo) = (c_min[j], e_min[j]);
            // E − C at boundary j: exactly −t_f at the start; afterwards at least the last
            // prefix group's communication.
            let lo = if j == 0 { -tf } else { tc_in[j] };
            // A prefix with E − C above this cannot finish under the upper bound.
            let hi = (ub - a_min[j] - c_lo).max(lo);
            stair.clear();
            for k in j + 1..=l_count {
                let front = &fronts[k];
                let (Some(first), Some(last)) = (front.first(), front.last()) else {
                    continue;
                };
                let (s, c) = (ts[idx(j, k)], tc[idx(j, k)]);
                let a0 = b[k] - b[j] + s;
                // Fronts ascend in `a` and descend in `d`, so every candidate through this
                // group has a ≥ t_c + a_first and d ≥ a0 + max(a_first + t_c, d_last).
                let a_lb = c + first.a;
                if (c_lo + a0 + a_lb.max(last.d)).max(e_lo + a_lb) > ub {
                    continue;
                }
                for (si, st) in front.iter().enumerate() {
                    let a = c + st.a;
                    if e_lo + a > ub {
                        break; // `a` only grows along the front
                    }
                    let d = a0 + a.max(st.d);
                    if c_lo + d <= ub {
                        insert_state(
                            &mut stair,
                            State {
                                a,
                                d,
                                next: k,
                                idx: si,
                            },
                            lo,
                        );
                    }
                    // Further states of this front have larger `a` and smaller `d`; once
                    // `a ≥ d` the candidates only get worse in both coordinates.
                    if a >= st.d {
                        break;
                    }
                }
            }
            fronts[j] = finish_front(&stair, hi, thin_width, cap);
        }
        let (mut i, _) = fronts[0]
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.a.max(tf + s.d)))
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .ok_or_else(|| Error::InvalidPlan("no plan found".into()))?;
        let mut j = 0;
        let mut starts = Vec::new();
        while j < l_count {
            let s = fronts[j][i];
            // Group = positions [j, next) = forward layers [L−next, L−j).
            starts.push(l_count - s.next);
            j = s.next;
            i = s.idx;
        }
        starts.sort_unstable();
        Ok(starts)
    };
    // A first pass keeping a few states per boundary finds a near-optimal plan cheaply;
    // its time is a much tighter upper bound, which prunes most of the exact pass.
    let first = run(ub, FIRST_PASS_CAP)?;
    let t = iteration_time_bounds(&bw, &sizes, tf, &first, costs);
    let starts = run(ub.min(t * (1.0 + 1e-9) + 1e-15), usize::MAX)?;
    MergePlan::from_starts(l_count, starts)
}

/// Tries every plan (`2^(L−1)`), the reference for small profiles.
pub fn exhaustive(profile: &LayerProfile, costs: &impl StepCosts) -> Result<MergePlan> {
    let l_count = profile.len();
    if l_count > EXHAUSTIVE_MAX_LAYERS {
        return Err(Error::TooManyLayers {
            planner: "exhaustive",
            max: EXHAUSTIVE_MAX_LAYERS,
            layers: l_count,
        });
    }
    let bw: Vec<f64> = profile.layers().iter().map(|l| l.backward_s).collect();
    let sizes = profile.sizes();
    let mut best: Option<(f64, Vec<usize>)> = None;
    let mut starts = Vec::with_capacity(l_count);
    for mask in 0u64..(1u64 << (l_count - 1)) {
        starts.clear();
        starts.push(0);
        // Bit i set: a group starts at layer i + 1.
        starts.extend(
            (0..l_count - 1)
                .filter(|i| mask >> i & 1 == 1)
                .map(|i| i + 1),
        );
        let t = iteration_time_bounds(&bw, &sizes, profile.forward_s(), &starts, costs);
        if !t.is_finite() {
            return Err(Error::InvalidCost {
                what: "iteration",
                numel: 0,
                value: t,
            });
        }
        if best.as_ref().is_none_or(|(bt, _)| t < *bt) {
            best = Some((t, starts.clone()));
        }
    }
    let (_, s) = best.ok_or_else(|| Error::InvalidPlan("no plan found".into()))?;
    MergePlan::from_starts(l_count, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Layer;
    use crate::timeline::{OmgsCosts, SimpleCosts};
    use crate::zoo;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    fn random_profile(rng: &mut impl Rng, l: usize) -> LayerProfile {
        let layers = (0..l)
            .map(|i| Layer {
                name: format!("l{i}"),
                numel: if rng.gen_bool(0.4) {
                    rng.gen_range(1..2_000)
                } else {
                    rng.gen_range(1_000..3_000_000)
                },
                backward_s: rng.gen_range(0.0..0.03),
            })
            .collect();
        LayerProfile::new("random", rng.gen_range(0.0..0.05), layers).unwrap()
    }

    fn time(p: &LayerProfile, plan: &MergePlan, c: &impl StepCosts) -> f64 {
        predict(p, plan, c).unwrap().iteration_s
    }

    #[test]
    fn threshold_8192_gives_table_v_group_counts() {
        // OMGS-SGD (Shi et al., INFOCOM 2020) Table V, MGS-SGD column.
        for (name, groups) in [
            ("vgg16", 13),
            ("resnet50", 53),
            ("inception_v4", 150),
            ("lstm_ptb", 9),
        ] {
            let p = zoo::profile(name).unwrap();
            let plan = Planner::Threshold(8192)
                .plan(&p, &OmgsCosts::preset(16).unwrap())
                .unwrap();
            assert_eq!(plan.num_groups(), groups, "{name}");
        }
    }

    #[test]
    fn threshold_semantics() {
        let p = LayerProfile::from_sizes("t", &[5, 3, 10, 2, 7]).unwrap();
        // From the end: 7+2 = 9 ≥ 8 closes {3,4}; 10 closes {2}; 3+5 = 8 closes {0,1}.
        assert_eq!(
            threshold(&p, 8).groups(),
            vec![vec![0, 1], vec![2], vec![3, 4]]
        );
        assert_eq!(threshold(&p, 0).num_groups(), 5);
        assert_eq!(threshold(&p, 1000).num_groups(), 1);
    }

    #[test]
    fn plan_constructors_validate() {
        assert!(MergePlan::from_groups(3, &[vec![0], vec![1, 2]]).is_ok());
        assert!(MergePlan::from_groups(3, &[vec![0], vec![2]]).is_err());
        assert!(MergePlan::from_groups(3, &[vec![0, 1, 2], vec![]]).is_err());
        assert!(MergePlan::from_starts(3, vec![1]).is_err());
        assert!(MergePlan::from_starts(3, vec![0, 0]).is_err());
        assert!(MergePlan::from_starts(0, vec![0]).is_err());
        let p = MergePlan::from_starts(5, vec![0, 2, 4]).unwrap();
        assert_eq!(p.group_of(3), 1);
        assert_eq!(p.group_of(4), 2);
        assert_eq!(p.range(2), 4..5);
    }

    #[test]
    fn planner_names_round_trip() {
        for p in Planner::ALL
            .iter()
            .chain([&Planner::Exhaustive, &Planner::Threshold(5)])
        {
            assert_eq!(&p.to_string().parse::<Planner>().unwrap(), p);
        }
        assert!(matches!(
            "fastest".parse::<Planner>(),
            Err(Error::UnknownPlanner(_))
        ));
        assert!("threshold:x".parse::<Planner>().is_err());
        assert_eq!(Planner::default(), Planner::Exact);
    }

    #[test]
    fn default_planner_beats_every_baseline_on_the_zoo_at_p16() {
        let c = OmgsCosts::preset(16).unwrap();
        for name in zoo::MODELS {
            let p = zoo::profile(name).unwrap();
            let best = time(&p, &Planner::default().plan(&p, &c).unwrap(), &c);
            for planner in Planner::ALL {
                let t = time(&p, &planner.plan(&p, &c).unwrap(), &c);
                assert!(
                    best <= t * (1.0 + 1e-12),
                    "{name}: default {best} > {planner} {t}"
                );
            }
        }
    }

    #[test]
    fn omgs_algorithm_1_is_not_always_optimal() {
        // Algorithm 1 decides each layer greedily from the current start times; search
        // random small profiles for one where it misses the exhaustive optimum.
        let c = OmgsCosts::preset(16).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut worst: f64 = 0.0;
        for _ in 0..300 {
            let p = random_profile(&mut rng, 8);
            let opt = time(&p, &exhaustive(&p, &c).unwrap(), &c);
            let a1 = time(&p, &algorithm1(&p, &c).unwrap(), &c);
            assert!(opt <= a1 * (1.0 + 1e-12));
            worst = worst.max(a1 / opt - 1.0);
        }
        assert!(
            worst > 1e-6,
            "Algorithm 1 matched the optimum on every profile tried"
        );
    }

    #[test]
    fn bad_inputs() {
        let p = LayerProfile::from_sizes("big", &[1; 30]).unwrap();
        let c = SimpleCosts {
            gamma: 0.0,
            alpha: 1.0,
            beta: 0.0,
        };
        assert!(matches!(
            exhaustive(&p, &c),
            Err(Error::TooManyLayers { .. })
        ));
        let neg = SimpleCosts {
            gamma: 0.0,
            alpha: -1.0,
            beta: 0.0,
        };
        assert!(matches!(exact(&p, &neg), Err(Error::InvalidCost { .. })));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn exact_equals_exhaustive(seed in any::<u64>(), l in 1usize..=12, p_idx in 0usize..4) {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let prof = random_profile(&mut rng, l);
            let c = OmgsCosts::preset([2, 4, 8, 16][p_idx]).unwrap();
            let e = time(&prof, &exact(&prof, &c).unwrap(), &c);
            let x = time(&prof, &exhaustive(&prof, &c).unwrap(), &c);
            prop_assert!((e - x).abs() <= 1e-12 * x.max(1.0), "exact {} exhaustive {}", e, x);
            for planner in Planner::ALL {
                let t = time(&prof, &planner.plan(&prof, &c).unwrap(), &c);
                prop_assert!(e <= t * (1.0 + 1e-12));
            }
        }

        #[test]
        fn exact_equals_exhaustive_simple_costs(seed in any::<u64>(), l in 1usize..=14) {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let prof = random_profile(&mut rng, l);
            let c = SimpleCosts { gamma: rng.gen_range(0.0..1e-9), alpha: rng.gen_range(0.0..0.05), beta: rng.gen_range(0.0..1e-8) };
            let e = time(&prof, &exact(&prof, &c).unwrap(), &c);
            let x = time(&prof, &exhaustive(&prof, &c).unwrap(), &c);
            prop_assert!((e - x).abs() <= 1e-12 * x.max(1.0));
        }
    }
}
