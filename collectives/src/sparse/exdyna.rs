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
//! **Warm start** (`SparseAlgo::ExDyna { warm_start }`, off by default; not in the
//! paper): the threshold `1/(2√k)` assumes gradients of unit norm, and as it moves by at
//! most 0.5% per step it can take hundreds of steps to reach its working value (until
//! then far more than `k` entries are selected). With the option, on the first step each
//! rank selects with its own partition's exact threshold: the magnitude of the
//! `k_part`-th largest accumulated entry of the partition (`sparsify::ExactTopK`), with
//! `k_part = round(k · |partition| / d)` in `1..=|partition|` (the smallest positive
//! `f32` where that magnitude is 0, so zeros are never selected). So the first step selects
//! about `k` in all. The ranks' thresholds travel with the first step's count all-gather
//! (4 more bytes per rank, no extra message) and every rank continues from their mean,
//! summed in rank order: one threshold, identical on every rank, as in the paper, which
//! Algorithm 5's scaling then keeps adjusting from the global count.

use sparsify::SparseGrad;

use sparsify::{ExactTopK, Selector};

use super::common::{bruck, tags, Config, Counting, Entries, Group};
use super::scaffold::{self, accessors, constructor, counted_step};
use super::{SparseAllreduce, StepStats};
use crate::{Error, Result};

/// ExDyna (Yoon & Oh, CCGrid 2024) Algorithm 3's α (the authors' code: 1.05 and 1/1.05 = 0.95238).
const ALPHA: f64 = 1.05;
/// Blocks in the gradient vector (the authors' code, `num_blk`).
const NUM_BLK: usize = 1024;

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
}

impl ExDyna {
    constructor!(ExDyna { warm_start: bool }, "ExDyna");

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
    /// one block between unbalanced neighbours.
    fn adjust(&mut self) {
        let p = self.cfg.p;
        let prev = (self.t - 1) % p as u64;
        let mut k = vec![0f64; p];
        for i in 0..p {
            k[(prev as usize + i) % p] = self.kt[i] as f64;
        }
        let sum: f64 = k.iter().sum();
        if sum <= 0.0 {
            return;
        }
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
            }
        }
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
        if self.t >= 1 {
            self.adjust();
        }
        // Algorithm 3 line 29 and Algorithm 4: threshold selection in the own partition.
        let alloc = ((self.t % p as u64) as usize + rank) % p;
        let range = self.part_range(alloc);
        // Same on every rank: the option is agreed at construction.
        let warm = self.t == 0 && self.cfg.opts.exdyna_warm_start && k < d;
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
        // Every rank's accumulated values at the union, summed (Algorithm 1).
        let vals = scaffold::allreduce_at(cc, &mut self.resid, &union)?;
        let mut pairs: Vec<(u32, f32)> = union.into_iter().zip(vals).collect();
        pairs.sort_unstable_by_key(|x| x.0);
        let sum = Entries {
            idx: pairs.iter().map(|x| x.0).collect(),
            val: pairs.iter().map(|x| x.1).collect(),
        };
        // Algorithm 5: online threshold scaling.
        let k_actual: usize = kt.iter().sum();
        if k < d {
            self.threshold = sparsify::threshold::exdyna_scale(self.threshold, k, k_actual);
        }
        self.kt = kt;
        self.t += 1;
        let (update, mut stats) = scaffold::finish(&self.cfg, &sum, cc.counts(), mine.len())?;
        // ExDyna (Yoon & Oh, CCGrid 2024) Eq. 5.
        stats.padding = Some(if k_actual == 0 {
            1.0
        } else {
            (p * m_t) as f64 / k_actual as f64
        });
        Ok((update, stats))
    }
}
