//! TopkA (SparCML's all-gather of local top-k, SparDL (Zhao et al.) §4 baseline [36]; OMGS-SGD
//! (Shi et al., INFOCOM 2020) §II-F): every rank selects its local top-k with error feedback, all
//! ranks all-gather the (index, value) pairs, and each rank sums them in rank order.
//!
//! The all-gather is Bruck's, so it takes `⌈log2 P⌉` rounds for any P and every rank receives
//! `(P − 1)·k` entries: SparDL (Zhao et al.) Table 1's `(log P)α + 2(P − 1)kβ` (indices and values,
//! `k` of each per rank).

use sparsify::SparseGrad;

use super::common::{bruck, tags, Config, Counting, Entries, Group};
use super::scaffold::{self, accessors, constructor, counted_step, Feedback};
use super::{SelectorKind, SparseAllreduce, StepStats};
use crate::Result;

/// TopkA: local top-k, all-gather of indices and values, sum. Conserves mass: what a rank
/// does not select stays in its residual; everything selected reaches the update.
pub struct TopkA {
    cfg: Config,
    fb: Feedback,
    acc: Vec<f32>,
}

impl TopkA {
    constructor!(TopkA { selector: Option<sparsify::SelectorKind> }, "TopkA");

    pub(crate) fn from_config(cfg: Config) -> Self {
        TopkA {
            fb: Feedback::new(&cfg, cfg.d, SelectorKind::Exact),
            acc: vec![0.0; cfg.d],
            cfg,
        }
    }
}

impl SparseAllreduce for TopkA {
    accessors!("topka", |s| s.fb.residual());
    counted_step!();
}

impl TopkA {
    /// One step on the counting adapter `cc` (see [`SparseAllreduce::step`]).
    fn run(&mut self, cc: &Counting, grad: &[f32]) -> Result<(SparseGrad<f32>, StepStats)> {
        let (p, d, k) = (self.cfg.p, self.cfg.d, self.cfg.k());
        let mine = self.fb.select(grad, k, 0)?;
        scaffold::exact_count("topka", mine.len(), k)?;
        let g = Group::world(p, self.cfg.rank);
        let sizes = vec![8 * k; p];
        let blocks = bruck(cc, &g, mine.encode(), Some(&sizes), tags::TOPKA)?;
        let parts = scaffold::decode_ranges(cc, &blocks, self.cfg.rank, |_| 0..d)?;
        // Sum in rank order into a dense scratch: the same operand order on every rank.
        let mut union: Vec<u32> = Vec::with_capacity(p * k);
        for e in &parts {
            for (&i, &v) in e.idx.iter().zip(&e.val) {
                self.acc[i as usize] += v;
            }
            union.extend_from_slice(&e.idx);
        }
        union.sort_unstable();
        union.dedup();
        let val = union
            .iter()
            .map(|&i| std::mem::take(&mut self.acc[i as usize]))
            .collect();
        let sum = Entries { idx: union, val };
        let (update, mut stats) = scaffold::finish(&self.cfg, &sum, cc.counts(), k)?;
        stats.padding = Some(1.0);
        Ok((update, stats))
    }
}
