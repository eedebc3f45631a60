//! gTopk (Shi et al., ICDCS 2019; SparDL (Zhao et al.) §4 baseline [42]): local top-k with error
//! feedback, a binomial-tree reduction to rank 0 that keeps only the top-k of each
//! pairwise sum, and a binomial-tree broadcast of the global top-k.
//!
//! SparDL (Zhao et al.) Table 1: `2 log P` rounds and `4k log P` numbers on the critical path (rank
//! 0 receives and sends `log P` messages of `k` indices and `k` values). The tree is binomial, so
//! any P works with `⌈log2 P⌉` levels. As in gTopk, a rank puts back into its residual the entries
//! it selected locally that are not in the global top-k; the contributions a merge discards at
//! indices that *are* in the global top-k are lost by design and reported as
//! [`StepStats::mass_dropped`] by the rank that discarded them.

use sparsify::SparseGrad;

use cost_model::plan::dense as plan;
use cost_model::plan::Step;

use super::common::{sum_ordered, tags, topk_entries, Config, Counting, Entries};
use super::scaffold::{self, accessors, constructor, counted_step, Feedback};
use super::{SelectorKind, SparseAllreduce, StepStats};
use crate::{Communicator, Error, Result};

/// gTopk: tree merge keeping the global top-k.
pub struct GTopk {
    cfg: Config,
    fb: Feedback,
}

impl GTopk {
    constructor!(GTopk { selector: Option<sparsify::SelectorKind> }, "gTopk");

    pub(crate) fn from_config(cfg: Config) -> Self {
        GTopk {
            fb: Feedback::new(&cfg, cfg.d, SelectorKind::Exact),
            cfg,
        }
    }
}

impl SparseAllreduce for GTopk {
    accessors!("gtopk", |s| s.fb.residual());
    counted_step!();
}

impl GTopk {
    /// One step on the counting adapter `cc` (see [`SparseAllreduce::step`]).
    fn run(&mut self, cc: &Counting, grad: &[f32]) -> Result<(SparseGrad<f32>, StepStats)> {
        let (p, d, k, rank) = (self.cfg.p, self.cfg.d, self.cfg.k(), self.cfg.rank);
        let local = self.fb.select(grad, k, 0)?;
        let mut cur = local.clone();
        let mut dropped: Vec<Entries> = Vec::new();
        // The binomial reduction to rank 0 with a top-k merge at every level, then the
        // binomial broadcast of the global top-k: the dense binomial plans, with entries
        // as the payload.
        let mut tree = Vec::new();
        plan::reduce_binomial(&mut tree, 0..0, p, rank, 0, tags::GT_REDUCE);
        plan::bcast_binomial(&mut tree, 0..0, p, rank, 0, tags::GT_BCAST);
        for st in &tree {
            match *st {
                Step::Send { to, tag, .. } => cc.send(to, tag, &cur.encode())?,
                Step::Recv {
                    from, tag, combine, ..
                } => {
                    let got = Entries::decode_all(&cc.recv(from, tag)?, 0..d)?;
                    cc.add_items(got.len());
                    if combine.reduces() {
                        let (keep, drop) = topk_entries(&sum_ordered(&[&cur, &got]), k);
                        dropped.push(drop);
                        cur = keep;
                    } else {
                        cur = got;
                    }
                }
                _ => {}
            }
        }
        let global = cur;
        if global.idx.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::InvalidArgument(
                "gtopk: broadcast indices not increasing".into(),
            ));
        }
        let in_global = |i: u32| global.idx.binary_search(&i).is_ok();
        // Put back the locally selected entries that did not make the global top-k.
        let resid = self.fb.fb.residual_mut();
        for (&i, &v) in local.idx.iter().zip(&local.val) {
            if !in_global(i) {
                resid[i as usize] += v;
            }
        }
        let mass_dropped: f64 = dropped
            .iter()
            .flat_map(|e| e.idx.iter().zip(&e.val))
            .filter(|(&i, _)| in_global(i))
            .map(|(_, &v)| v as f64)
            .sum();
        let (update, mut stats) = scaffold::finish(&self.cfg, &global, cc.counts(), k)?;
        stats.mass_dropped = mass_dropped;
        Ok((update, stats))
    }
}
