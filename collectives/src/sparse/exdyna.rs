//! ExDyna (Yoon & Oh, CCGrid 2024, §IV, Algorithms 1-5): block-based partitioning of the gradient
//! vector, dynamic partition allocation with a cyclic assignment, partition-wise threshold
//! selection and online threshold scaling; then an all-gather of the counts and of the (padded)
//! indices and an all-reduce of every rank's accumulated values at their union.
//!
//! Constants (from the authors' code): `num_blk = 1024`, `sz_blk = a − a % 32`
//! with `a = d / 1024`, the remainder to the last partition, `min_blk = num_blk / (4P)`;
//! partition of rank `r` at step `t` is `(t mod P + r) mod P`; adjustment with α = 1.05,
//! `blk_move = 1`; threshold starts at `1 / (2√k)` and scales by ×1.005 (`k'/k > 1.1`),
//! ×1.00125 (`> 1/1.1`) or ×0.995 (Algorithm 5, β = 1.1, γ = 0.005).
//!
//! Where `d < 32 · 1024` the block size would be 0: blocks then hold `max(1, d / 1024)`
//! elements and there are at most `d / sz_blk` of them; with P > 1024 there are P blocks;
//! `min_blk` is at least 1 so no partition empties. At density 1 the threshold is 0 (every
//! entry selected). Conserves mass: each rank zeroes its residual exactly at the union it
//! contributed to.
//!
//! **Fast convergence** (`SparseAlgo::ExDyna { warm_start: true }`, off by default; not in
//! the paper): the threshold `1/(2√k)` assumes gradients of unit norm, and Algorithm 5 moves
//! it by at most 0.5% per step, so from that start it takes hundreds of steps to select about
//! `k` (measured in `tests/sparse_exdyna.rs`). With the option:
//! - **warm start**: on each of the first [`ExDyna::WARM_STEPS`] steps each rank selects with its own
//!   partition's exact threshold, the magnitude of the `k_part`-th largest accumulated entry
//!   of the partition (`sparsify::ExactTopK`), `k_part = round(k · |partition| / d)` in
//!   `1..=|partition|` (the smallest positive `f32` where that magnitude is 0, so zeros are
//!   never selected). The ranks' thresholds travel with that step's count all-gather (4 more
//!   bytes per rank, no extra message) and every rank continues from their mean, summed in
//!   rank order: one threshold, identical on every rank, as in the paper. Several steps,
//!   not one, because the residuals still grow (unselected mass builds up) while the warm
//!   start runs; a single step's threshold undershoots the working value.
//! - **adaptive step**: where the global count `k'` is outside Algorithm 5's band
//!   `[k/β, β·k]`, the threshold moves by a relative step that doubles (from γ = 0.5% up to
//!   5%) while `k'` stays on the same side, and halves when it crosses to the other side;
//!   inside the band Algorithm 5 applies unchanged (and the step resets to γ). A
//!   proportional correction such as `δ·(k'/k)^(1/2)` oscillates (measured: `k'/k` from 0.05
//!   to 30): with error feedback many residuals sit just below the threshold, so the count
//!   reacts to a small threshold change far more than any fixed exponent assumes.
//!
//! Measured in `tests/sparse_exdyna.rs` (P = 4, d = 2^15, ρ = 0.01, heavy-tailed gradients):
//! the mean of `k'/k` over 20 steps stays within ±10% from step 57 on with the option, from
//! step 887 on without it ([`steady_state`]).
//!
//! **Per-step stats** ([`ExDynaStats`], [`ExDyna::last_stats`]): the density error ε_t
//! (Eq. 6), the global error ‖e_t‖ (Eq. 1), the padding overhead `C_t` (Eq. 4) and `f(t)`
//! (Eq. 5), every step and identical on every rank. ‖e_t‖ needs every rank's local error
//! `‖e_{i,t}‖` (the residual after this step's selection): they ride as P more words in
//! the values all-reduce (4P bytes, no extra message).

use sparsify::SparseGrad;

use sparsify::{ExactTopK, Selector};

use super::common::{bruck, tags, Config, Counting, Entries, Group};
use super::scaffold::{self, accessors, constructor, counted_step};
use super::{SparseAllreduce, StepStats};
use crate::dense::{allreduce, choose_allreduce, DenseOptions};
use crate::{Error, Result};

/// ExDyna (Yoon & Oh, CCGrid 2024) Algorithm 3's α (the authors' code: 1.05 and 1/1.05 = 0.95238).
const ALPHA: f64 = 1.05;
/// Blocks in the gradient vector (the authors' code, `num_blk`).
const NUM_BLK: usize = 1024;
/// Largest relative threshold step of the fast mode (Algorithm 5's γ is 0.005).
const MAX_GAIN: f64 = 0.05;

/// What one ExDyna step did, identical on every rank: the quantities of ExDyna (Yoon & Oh,
/// CCGrid 2024) §IV that the paper tracks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ExDynaStats {
    /// Step number `t` since construction.
    pub step: u64,
    /// Threshold `δ_t` the selection used (on a warm-start step: the mean of the ranks'
    /// exact partition thresholds).
    pub threshold: f32,
    /// Target `k = ⌈ρ·d⌉`.
    pub target: usize,
    /// Selected in all, `k' = Σ_i k_{i,t}`.
    pub selected: usize,
    /// Largest per-rank count `m_t`, to which the index all-gather pads.
    pub max_selected: usize,
    /// Density error `ε_t = |k − k'| / d` (Eq. 6).
    pub density_error: f64,
    /// Global error `‖e_t‖ = (1/P) Σ_i ‖e_{i,t}‖` (Eq. 1), with `e_{i,t}` rank i's residual
    /// after this step.
    pub global_error: f64,
    /// Padding overhead `C_t = P · Σ_i (m_t − k_{i,t})` (Eq. 4), in entries.
    pub padding_overhead: usize,
    /// All-gather traffic over the balanced case, `f(t) = P·m_t / k'` (Eq. 5; 1 when
    /// `k' = 0`).
    pub padding_ratio: f64,
    /// Blocks Algorithm 3 moved between adjacent partitions before this step's selection.
    pub blocks_moved: usize,
    /// Whether this step selected with the warm start's exact thresholds.
    pub warm: bool,
}

impl ExDynaStats {
    /// `k'/k`, the ratio Algorithm 5 examines (`exam`).
    pub fn ratio(&self) -> f64 {
        self.selected as f64 / self.target.max(1) as f64
    }
}

/// Where a run of ExDyna steps reaches its steady state: the first step `t` from which every
/// mean of `k'/k` over `window` consecutive steps ending at `t` or later is within
/// `1 ± tol`, and the mean of `k'/k` from there to the end. `None` when the last window is
/// outside (or `stats` is shorter than `window`). A window, not single steps, because at a
/// steady threshold the per-step count still moves by about ±10% with the data.
pub fn steady_state(stats: &[ExDynaStats], window: usize, tol: f64) -> Option<(u64, f64)> {
    let window = window.max(1);
    let r: Vec<f64> = stats.iter().map(ExDynaStats::ratio).collect();
    let inside = |end: usize| {
        let m = r[end + 1 - window..=end].iter().sum::<f64>() / window as f64;
        (m - 1.0).abs() <= tol
    };
    let last = r.len().checked_sub(1)?;
    if last + 1 < window || !inside(last) {
        return None;
    }
    let first = (window - 1..=last)
        .rev()
        .take_while(|&e| inside(e))
        .last()
        .unwrap_or(last);
    let mean = r[first..].iter().sum::<f64>() / (r.len() - first) as f64;
    Some((stats[first].step, mean))
}

/// ExDyna; see the module docs.
pub struct ExDyna {
    cfg: Config,
    pub(super) resid: Vec<f32>,
    sz_blk: usize,
    min_blk: usize,
    pub(super) blk_part: Vec<usize>,
    pub(super) blk_pos: Vec<usize>,
    pub(super) threshold: f32,
    /// Per-worker counts of the previous step.
    pub(super) kt: Vec<usize>,
    pub(super) t: u64,
    last: ExDynaStats,
    /// Fast mode: relative threshold step and the side of the band of the last count.
    gain: f64,
    side: i8,
}

impl ExDyna {
    constructor!(ExDyna { warm_start: bool }, "ExDyna");

    /// Steps of exact partition thresholds at the start of the fast mode (see the module
    /// docs; the cost model's replay counts their 4 more bytes per rank).
    pub const WARM_STEPS: u64 = cost_model::sparse_replay::EXDYNA_WARM_STEPS;

    pub(crate) fn from_config(cfg: Config) -> Self {
        let (p, d) = (cfg.p, cfg.d);
        let mut num_blk = NUM_BLK.max(p);
        let a = d / num_blk;
        let mut sz_blk = a - a % 32;
        if sz_blk == 0 {
            sz_blk = a.max(1);
            num_blk = num_blk.min(d / sz_blk);
        }
        // Algorithm 2.
        let quotient = num_blk / p;
        let rem = num_blk % p;
        let blk_part: Vec<usize> = (0..p).map(|i| quotient + usize::from(i < rem)).collect();
        let mut blk_pos = vec![0usize; p];
        for i in 1..p {
            blk_pos[i] = blk_pos[i - 1] + blk_part[i - 1];
        }
        let k = cfg.k();
        ExDyna {
            resid: vec![0.0; d],
            sz_blk,
            min_blk: (num_blk / (4 * p)).max(1),
            blk_part,
            blk_pos,
            threshold: if k >= d {
                0.0
            } else {
                (1.0 / (2.0 * (k as f64).sqrt())) as f32
            },
            kt: vec![0; p],
            t: 0,
            last: ExDynaStats::default(),
            gain: sparsify::threshold::EXDYNA_GAMMA,
            side: 0,
            cfg,
        }
    }

    /// The current selection threshold.
    pub fn threshold(&self) -> f32 {
        self.threshold
    }

    /// Blocks in each partition (partition order).
    pub fn partition_blocks(&self) -> &[usize] {
        &self.blk_part
    }

    /// First block of each partition (partition order): the partition boundaries that
    /// Algorithm 3 moves.
    pub fn partition_starts(&self) -> &[usize] {
        &self.blk_pos
    }

    /// Stats of the last step (all zero before the first).
    pub fn last_stats(&self) -> &ExDynaStats {
        &self.last
    }

    /// Algorithm 5, or in the fast mode the adaptive step outside its band (see the module
    /// docs), for `k_actual` selected in all.
    fn next_threshold(&mut self, k_actual: usize) -> f32 {
        let (k, thr) = (self.cfg.k(), self.threshold);
        let exam = k_actual as f64 / k as f64;
        let beta = sparsify::threshold::EXDYNA_BETA;
        let gamma = sparsify::threshold::EXDYNA_GAMMA;
        let side = if exam > beta {
            1
        } else if exam < 1.0 / beta {
            -1
        } else {
            0
        };
        if !self.cfg.opts.exdyna_warm_start || side == 0 {
            self.gain = gamma;
            self.side = side;
            return sparsify::threshold::exdyna_scale(thr, k, k_actual);
        }
        self.gain = if side == self.side {
            (self.gain * 2.0).min(MAX_GAIN)
        } else {
            (self.gain / 2.0).max(gamma)
        };
        self.side = side;
        let f = if side > 0 {
            1.0 + self.gain
        } else {
            1.0 / (1.0 + self.gain)
        };
        (f64::from(thr) * f).max(f64::from(f32::MIN_POSITIVE)) as f32
    }

    fn part_range(&self, i: usize) -> std::ops::Range<usize> {
        let s = self.blk_pos[i] * self.sz_blk;
        let e = if i + 1 == self.cfg.p {
            self.cfg.d
        } else {
            (self.blk_pos[i] + self.blk_part[i]) * self.sz_blk
        };
        s.min(self.cfg.d)..e.min(self.cfg.d)
    }

    /// Warm start: the magnitude of the `k_part`-th largest accumulated entry of `range`
    /// (see the module docs), or the current threshold for an empty range.
    fn warm_threshold(&self, range: std::ops::Range<usize>) -> Result<f32> {
        if range.is_empty() {
            return Ok(self.threshold);
        }
        let (k, d) = (self.cfg.k() as f64, self.cfg.d as f64);
        let k_part = ((k * range.len() as f64 / d).round() as usize).clamp(1, range.len());
        let (_, info) = ExactTopK::new().select(&self.resid[range], k_part)?;
        Ok(info.threshold.max(f32::MIN_POSITIVE))
    }

    /// Algorithm 3 lines 1-28: re-map last step's per-worker counts to partitions and move
    /// one block between unbalanced neighbours; returns the blocks moved.
    fn adjust(&mut self) -> usize {
        let p = self.cfg.p;
        let prev = (self.t - 1) % p as u64;
        let mut k = vec![0f64; p];
        for i in 0..p {
            k[(prev as usize + i) % p] = self.kt[i] as f64;
        }
        let sum: f64 = k.iter().sum();
        if sum <= 0.0 {
            return 0;
        }
        let mut moved = 0;
        let pk_prev = sum / p as f64;
        let den_prev = sum / self.cfg.d as f64;
        let k_move = self.sz_blk as f64 * den_prev;
        for i in 0..p.saturating_sub(1) {
            let det = k[i] / pk_prev;
            let det2 = k[i + 1] / pk_prev;
            if det > ALPHA && det2 < 1.0 / ALPHA {
                if self.blk_part[i] < self.min_blk + 1 {
                    continue;
                }
                self.blk_part[i] -= 1;
                self.blk_part[i + 1] += 1;
                self.blk_pos[i + 1] -= 1;
                k[i] -= k_move;
                k[i + 1] += k_move;
                moved += 1;
            }
            if det < 1.0 / ALPHA && det2 > ALPHA {
                if self.blk_part[i + 1] < self.min_blk + 1 {
                    continue;
                }
                self.blk_part[i] += 1;
                self.blk_part[i + 1] -= 1;
                self.blk_pos[i + 1] += 1;
                k[i] += k_move;
                k[i + 1] -= k_move;
                moved += 1;
            }
        }
        moved
    }
}

impl SparseAllreduce for ExDyna {
    accessors!("exdyna", |s| &s.resid);
    counted_step!();
    super::state::stateful!();
}

impl ExDyna {
    /// One step on the counting adapter `cc` (see [`SparseAllreduce::step`]).
    fn run(&mut self, cc: &Counting, grad: &[f32]) -> Result<(SparseGrad<f32>, StepStats)> {
        let (p, d, k, rank) = (self.cfg.p, self.cfg.d, self.cfg.k(), self.cfg.rank);
        scaffold::accumulate(&mut self.resid, grad);
        scaffold::check_finite(&self.resid)?;
        let blocks_moved = if self.t >= 1 { self.adjust() } else { 0 };
        // Algorithm 3 line 29 and Algorithm 4: threshold selection in the own partition.
        let alloc = ((self.t % p as u64) as usize + rank) % p;
        let range = self.part_range(alloc);
        // Same on every rank: the option is agreed at construction.
        let warm = self.t < Self::WARM_STEPS && self.cfg.opts.exdyna_warm_start && k < d;
        let thr = if warm {
            self.warm_threshold(range.clone())?
        } else {
            self.threshold
        };
        let mut mine: Vec<u32> = range
            .clone()
            .filter(|&i| self.resid[i].abs() >= thr)
            .map(|i| i as u32)
            .collect();
        if mine.is_empty() && !range.is_empty() {
            // the authors' code: if nothing is selected, take one index (the largest magnitude).
            let best = range
                .clone()
                .max_by(|&a, &b| {
                    self.resid[a]
                        .abs()
                        .total_cmp(&self.resid[b].abs())
                        .then(b.cmp(&a))
                })
                .unwrap_or(range.start);
            mine.push(best as u32);
        }
        // All-gather of the counts (with the warm-start thresholds on a warm step), then
        // of the indices padded to the largest count.
        let g = Group::world(p, rank);
        let mut head = (mine.len() as u32).to_le_bytes().to_vec();
        if warm {
            head.extend_from_slice(&thr.to_bits().to_le_bytes());
        }
        let sizes = vec![head.len(); p];
        let counts_b = bruck(cc, &g, head, Some(&sizes), tags::EX_COUNTS)?;
        let word = |b: &[u8], w: usize| u32::from_le_bytes([b[w], b[w + 1], b[w + 2], b[w + 3]]);
        let kt: Vec<usize> = counts_b.iter().map(|b| word(b, 0) as usize).collect();
        if warm {
            let sum: f64 = counts_b
                .iter()
                .map(|b| f64::from(f32::from_bits(word(b, 4))))
                .sum();
            self.threshold = (sum / p as f64) as f32;
        }
        // A rank selects at most its partition: a larger count is a corrupt or mismatched
        // message, refused before it sizes the padded all-gather (every rank sees the same
        // counts, so every rank refuses).
        for (r, &c) in kt.iter().enumerate() {
            let part = self.part_range(((self.t % p as u64) as usize + r) % p);
            if c > part.len() {
                return Err(Error::InvalidArgument(format!(
                    "ExDyna: rank {r} reports {c} selected entries, more than its partition \
                     of {}",
                    part.len()
                )));
            }
        }
        let m_t = kt.iter().copied().max().unwrap_or(0);
        let mut padded = mine.clone();
        padded.resize(m_t, u32::MAX);
        let idx_b = bruck(
            cc,
            &g,
            bytemuck::cast_slice(&padded).to_vec(),
            Some(&vec![4 * m_t; p]),
            tags::EX_IDX,
        )?;
        let mut union: Vec<u32> = Vec::with_capacity(kt.iter().sum());
        for (r, b) in idx_b.iter().enumerate() {
            let ids: Vec<u32> = bytemuck::pod_collect_to_vec(b);
            let part = self.part_range(((self.t % p as u64) as usize + r) % p);
            let own = ids.get(..kt[r]).unwrap_or(&[]);
            if own.len() != kt[r]
                || own.iter().any(|&i| !part.contains(&(i as usize)))
                || own.windows(2).any(|w| w[0] >= w[1])
            {
                return Err(Error::InvalidArgument(format!(
                    "exdyna: rank {r}'s indices are not in its partition {part:?}"
                )));
            }
            if r != rank {
                cc.add_items(kt[r]);
            }
            union.extend_from_slice(own);
        }
        // Every rank's accumulated values at the union, summed (Algorithm 1), and after them
        // P words, rank i's local error ‖e_{i,t}‖ (Eq. 1: the residual's norm once the union
        // leaves it) in word i and zeros elsewhere, so the sum hands every rank every local
        // error exactly.
        let mut vals: Vec<f32> = union.iter().map(|&i| self.resid[i as usize]).collect();
        for &i in &union {
            self.resid[i as usize] = 0.0;
        }
        let local_error = self
            .resid
            .iter()
            .map(|&x| f64::from(x).powi(2))
            .sum::<f64>();
        let at = vals.len();
        vals.resize(at + p, 0.0);
        vals[at + rank] = local_error.sqrt() as f32;
        let dense = DenseOptions::default().unchecked();
        let algo = choose_allreduce(p, 4 * vals.len(), None);
        allreduce(cc, &mut vals, algo, &dense)?;
        let errors = vals.split_off(at);
        let global_error = errors.iter().map(|&e| f64::from(e)).sum::<f64>() / p as f64;
        let mut pairs: Vec<(u32, f32)> = union.into_iter().zip(vals).collect();
        pairs.sort_unstable_by_key(|x| x.0);
        let sum = Entries {
            idx: pairs.iter().map(|x| x.0).collect(),
            val: pairs.iter().map(|x| x.1).collect(),
        };
        // Algorithm 5: online threshold scaling.
        let k_actual: usize = kt.iter().sum();
        // Eq. 5 (f(t)), Eq. 4 (C_t) and Eq. 6 (ε_t).
        let padding_ratio = if k_actual == 0 {
            1.0
        } else {
            (p * m_t) as f64 / k_actual as f64
        };
        self.last = ExDynaStats {
            step: self.t,
            threshold: if warm { self.threshold } else { thr },
            target: k,
            selected: k_actual,
            max_selected: m_t,
            density_error: k.abs_diff(k_actual) as f64 / d as f64,
            global_error,
            padding_overhead: p * (p * m_t - k_actual),
            padding_ratio,
            blocks_moved,
            warm,
        };
        if k < d {
            self.threshold = self.next_threshold(k_actual);
        }
        self.kt = kt;
        self.t += 1;
        let (update, mut stats) = scaffold::finish(&self.cfg, &sum, cc.counts(), mine.len())?;
        stats.padding = Some(padding_ratio);
        Ok((update, stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ratios: &[f64]) -> Vec<ExDynaStats> {
        ratios
            .iter()
            .enumerate()
            .map(|(t, &r)| ExDynaStats {
                step: t as u64,
                target: 1000,
                selected: (r * 1000.0).round() as usize,
                ..ExDynaStats::default()
            })
            .collect()
    }

    #[test]
    fn steady_state_is_where_every_later_window_is_inside() {
        // 10 steps far above k, then alternating 0.85 / 1.15 (single steps outside ±10%,
        // every 4-step mean at 1.0).
        let mut r = vec![5.0; 10];
        r.extend((0..40).map(|i| if i % 2 == 0 { 0.85 } else { 1.15 }));
        let (at, mean) = steady_state(&run(&r), 4, 0.1).unwrap();
        assert_eq!(
            at, 13,
            "first window wholly after the transient ends at step 13"
        );
        assert!((mean - 1.0).abs() < 0.01, "{mean}");
        // A late excursion moves the settling point past it.
        r[40] = 3.0;
        assert_eq!(steady_state(&run(&r), 4, 0.1).unwrap().0, 44);
        // Never inside, or too short: none.
        assert_eq!(steady_state(&run(&[2.0; 30]), 4, 0.1), None);
        assert_eq!(steady_state(&run(&[1.0; 3]), 4, 0.1), None);
        assert_eq!(steady_state(&run(&[1.0; 4]), 4, 0.1).map(|x| x.0), Some(3));
    }
}
