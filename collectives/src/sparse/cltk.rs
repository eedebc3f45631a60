//! CLT-k, cyclic local top-k (ExDyna (Yoon & Oh, CCGrid 2024) §III, ref. [16]): at step `t` the
//! leader `t mod P` selects the top-k indices of its own accumulated gradient, broadcasts them, and
//! every rank contributes its accumulated values at exactly those indices to a dense all-reduce of
//! `k` numbers. No gradient build-up (one index set) and no mass lost: every rank zeroes its
//! residual exactly where it contributed.

use sparsify::SparseGrad;

use super::common::{self, Config, Counting, Entries};
use super::scaffold::{self, accessors, constructor, counted_step};
use super::{SelectorKind, SparseAllreduce, StepStats};
use crate::dense::{broadcast, BroadcastAlgo, DenseOptions};
use crate::{Error, Result};

/// CLT-k: a cyclic leader selects, the others follow.
pub struct CltK {
    cfg: Config,
    resid: Vec<f32>,
    sel: Box<dyn sparsify::Selector>,
    t: u64,
}

impl CltK {
    constructor!(CltK { selector: Option<sparsify::SelectorKind> }, "CLT-k");

    pub(crate) fn from_config(cfg: Config) -> Self {
        CltK {
            resid: vec![0.0; cfg.d],
            sel: common::make_selector(cfg.opts.selector, SelectorKind::Exact),
            t: 0,
            cfg,
        }
    }
}

impl SparseAllreduce for CltK {
    accessors!("cltk", |s| &s.resid);
    counted_step!();
}

impl CltK {
    /// One step on the counting adapter `cc` (see [`SparseAllreduce::step`]).
    fn run(&mut self, cc: &Counting, grad: &[f32]) -> Result<(SparseGrad<f32>, StepStats)> {
        let (p, d, k, rank) = (self.cfg.p, self.cfg.d, self.cfg.k(), self.cfg.rank);
        let leader = (self.t % p as u64) as usize;
        self.t += 1;
        scaffold::accumulate(&mut self.resid, grad);
        let mut idx = vec![0u32; k];
        let mut selected = 0;
        if rank == leader {
            let (sg, _) = self.sel.select(&self.resid, k)?;
            scaffold::exact_count("cltk", sg.nnz(), k)?;
            idx.copy_from_slice(sg.indices());
            selected = k;
        } else {
            // Followers check their own input too; the leader's selector does it for it.
            scaffold::check_finite(&self.resid)?;
        }
        let dense = DenseOptions::default().unchecked();
        broadcast(cc, &mut idx, leader, BroadcastAlgo::Binomial, &dense)?;
        if idx.windows(2).any(|w| w[0] >= w[1]) || idx.last().is_some_and(|&i| i as usize >= d) {
            return Err(Error::InvalidArgument(
                "cltk: leader's indices are not valid".into(),
            ));
        }
        let val = scaffold::allreduce_at(cc, &mut self.resid, &idx)?;
        let sum = Entries { idx, val };
        scaffold::finish(&self.cfg, &sum, cc.counts(), selected)
    }
}
