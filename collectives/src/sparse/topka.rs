//! TopkA (SparCML's all-gather of local top-k, paper 003 §4 baseline [36]; paper 000
//! §II-F): every rank selects its local top-k with error feedback, all ranks all-gather
//! the (index, value) pairs, and each rank sums them in rank order.
//!
//! The all-gather is Bruck's, so it takes `⌈log2 P⌉` rounds for any P and every rank
//! receives `(P − 1)·k` entries: paper 003 Table 1's `(log P)α + 2(P − 1)kβ` (indices and
//! values, `k` of each per rank).

use sparsify::{ErrorFeedback, SparseGrad};

use super::common::{self, bruck, tags, Config, Counting, Entries, Group};
use super::{SelectorKind, SparseAllreduce, SparseOptions, StepStats};
use crate::{Communicator, Error, Result};

/// TopkA: local top-k, all-gather of indices and values, sum. Conserves mass: what a rank
/// does not select stays in its residual; everything selected reaches the update.
pub struct TopkA {
    cfg: Config,
    fb: ErrorFeedback,
    sel: Box<dyn sparsify::Selector>,
    acc: Vec<f32>,
}

impl TopkA {
    /// Builds TopkA (collective; see [`super::build`]).
    pub fn new(
        comm: &dyn Communicator,
        d: usize,
        density: f64,
        opts: &SparseOptions,
    ) -> Result<Self> {
        let cfg = common::setup(comm, common::name_code("topka"), d, density, opts)?;
        Ok(Self::from_config(cfg))
    }

    pub(crate) fn from_config(cfg: Config) -> Self {
        TopkA {
            fb: ErrorFeedback::new(cfg.d),
            sel: common::make_selector(cfg.opts.selector, SelectorKind::Exact),
            acc: vec![0.0; cfg.d],
            cfg,
        }
    }
}

impl SparseAllreduce for TopkA {
    fn name(&self) -> &'static str {
        "topka"
    }
    fn len(&self) -> usize {
        self.cfg.d
    }
    fn density(&self) -> f64 {
        self.cfg.density
    }
    fn residual(&self) -> &[f32] {
        self.fb.residual()
    }

    fn step(
        &mut self,
        comm: &dyn Communicator,
        grad: &[f32],
    ) -> Result<(SparseGrad<f32>, StepStats)> {
        self.cfg.check_step(comm, grad)?;
        let (p, d, k) = (self.cfg.p, self.cfg.d, self.cfg.k());
        let cc = Counting::new(comm);
        let (sg, _) = self.fb.step(self.sel.as_mut(), grad, k)?;
        if sg.nnz() != k {
            return Err(Error::InvalidArgument(format!(
                "topka needs an exact-count selector: got {} entries for k = {k}",
                sg.nnz()
            )));
        }
        let mine = Entries {
            idx: sg.indices().to_vec(),
            val: sg.values().to_vec(),
        };
        let g = Group::world(p, self.cfg.rank);
        let sizes = vec![8 * k; p];
        let blocks = bruck(&cc, &g, mine.encode(), Some(&sizes), tags::TOPKA)?;
        // Sum in rank order into a dense scratch: the same operand order on every rank.
        let mut union: Vec<u32> = Vec::with_capacity(p * k);
        for (r, b) in blocks.iter().enumerate() {
            let e = Entries::decode_all(b, 0..d)?;
            if r != self.cfg.rank {
                cc.add_entries(e.len());
            }
            for (&i, &v) in e.idx.iter().zip(&e.val) {
                self.acc[i as usize] += v;
            }
            union.extend_from_slice(&e.idx);
        }
        union.sort_unstable();
        union.dedup();
        let mut sum = Entries {
            idx: union,
            val: Vec::new(),
        };
        sum.val = sum
            .idx
            .iter()
            .map(|&i| std::mem::take(&mut self.acc[i as usize]))
            .collect();
        let update = common::finish_update(&sum, d, p);
        let mut stats = common::with_update(cc.stats(), &update, k);
        stats.padding = Some(1.0);
        Ok((update, stats))
    }
}
