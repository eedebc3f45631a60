//! CLT-k, cyclic local top-k (paper 002 §III, ref. [16]): at step `t` the leader
//! `t mod P` selects the top-k indices of its own accumulated gradient, broadcasts them,
//! and every rank contributes its accumulated values at exactly those indices to a dense
//! all-reduce of `k` numbers. No gradient build-up (one index set) and no mass lost:
//! every rank zeroes its residual exactly where it contributed.

use sparsify::SparseGrad;

use super::common::{self, Config, Counting, Entries};
use super::{SelectorKind, SparseAllreduce, SparseOptions, StepStats};
use crate::dense::{allreduce, broadcast, choose_allreduce, BroadcastAlgo, DenseOptions};
use crate::{Communicator, Error, Result};

/// CLT-k: a cyclic leader selects, the others follow.
pub struct CltK {
    cfg: Config,
    resid: Vec<f32>,
    sel: Box<dyn sparsify::Selector>,
    t: u64,
}

impl CltK {
    /// Builds CLT-k (collective; see [`super::build`]).
    pub fn new(
        comm: &dyn Communicator,
        d: usize,
        density: f64,
        opts: &SparseOptions,
    ) -> Result<Self> {
        let cfg = common::setup(comm, common::name_code("cltk"), d, density, opts)?;
        Ok(Self::from_config(cfg))
    }

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
    fn name(&self) -> &'static str {
        "cltk"
    }
    fn len(&self) -> usize {
        self.cfg.d
    }
    fn density(&self) -> f64 {
        self.cfg.density
    }
    fn residual(&self) -> &[f32] {
        &self.resid
    }

    fn step(
        &mut self,
        comm: &dyn Communicator,
        grad: &[f32],
    ) -> Result<(SparseGrad<f32>, StepStats)> {
        self.cfg.check_step(comm, grad)?;
        let (p, d, k, rank) = (self.cfg.p, self.cfg.d, self.cfg.k(), self.cfg.rank);
        let cc = Counting::new(comm);
        let leader = (self.t % p as u64) as usize;
        self.t += 1;
        for (r, &g) in self.resid.iter_mut().zip(grad) {
            *r += g;
        }
        let mut idx = vec![0u32; k];
        let mut selected = 0;
        if rank == leader {
            let (sg, _) = self.sel.select(&self.resid, k)?;
            if sg.nnz() != k {
                return Err(Error::InvalidArgument(format!(
                    "cltk needs an exact-count selector: got {} entries for k = {k}",
                    sg.nnz()
                )));
            }
            idx.copy_from_slice(sg.indices());
            selected = k;
        } else if let Some((i, v)) = self.resid.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            // Followers check their own input too; the leader's selector does it for it.
            return Err(sparsify::Error::NonFinite {
                index: i,
                value: *v,
            }
            .into());
        }
        let dense = DenseOptions::default().unchecked();
        broadcast(&cc, &mut idx, leader, BroadcastAlgo::Binomial, &dense)?;
        if idx.windows(2).any(|w| w[0] >= w[1]) || idx.last().is_some_and(|&i| i as usize >= d) {
            return Err(Error::InvalidArgument(
                "cltk: leader's indices are not valid".into(),
            ));
        }
        let mut vals: Vec<f32> = idx.iter().map(|&i| self.resid[i as usize]).collect();
        for &i in &idx {
            self.resid[i as usize] = 0.0;
        }
        allreduce(&cc, &mut vals, choose_allreduce(p, 4 * k, None), &dense)?;
        let update = common::finish_update(&Entries { idx, val: vals }, d, p);
        let stats = common::with_update(cc.stats(), &update, selected);
        Ok((update, stats))
    }
}
