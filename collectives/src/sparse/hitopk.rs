//! HiTopKComm (paper 001 §3.2, Algorithm 2) with error feedback on the reduced slice:
//! 1. intra-node dense reduce-scatter, so local rank `j` holds slice `j` of its node's sum;
//! 2. top-`k/n` of `residual + slice` (MSTopK by default, paper 001 Algorithm 1);
//! 3. for each local index `j`, an all-gather among the `m` ranks with local index `j`
//!    (one per node), summed in node order;
//! 4. an intra-node all-gather of the summed slices.
//!
//! Ranks are placed in blocks: rank `r` is on node `r / n` with local index `r mod n`
//! (`n = ranks_per_node`, which must divide P). The sub-communicators are split once, at
//! construction. With `f16_wire` the values travel as IEEE half (paper 001 §5.3): the
//! reduce-scatter sums through `f16`, and the selected values are rounded to `f16` with
//! the rounding error kept in the residual. Conserves mass (with the `f32` wire): what a
//! slice owner does not select stays in its residual, which is zero outside its slice.

use half::f16;
use sparsify::{ErrorFeedback, SparseGrad};

use super::common::{self, bruck, sum_ordered, tags, Config, Counting, Entries, Group};
use super::{SelectorKind, SparseAllreduce, SparseOptions, StepStats};
use crate::dense::{block_range, reduce_scatter, DenseOptions, ReduceScatterAlgo, WireType};
use crate::{Communicator, Error, Result};

/// HiTopKComm over node-local and cross-node sub-communicators.
pub struct HiTopK {
    cfg: Config,
    n: usize,
    intra: Box<dyn Communicator>,
    inter: Box<dyn Communicator>,
    /// Residual of this rank's slice only (zero elsewhere), as a full-length vector.
    resid: Vec<f32>,
    /// Error feedback over the slice.
    fb: ErrorFeedback,
    sel: Box<dyn sparsify::Selector>,
    buf: Vec<f32>,
}

impl HiTopK {
    /// Builds HiTopKComm (collective, splits `comm` by node; see [`super::build`]).
    pub fn new(
        comm: &dyn Communicator,
        d: usize,
        density: f64,
        opts: &SparseOptions,
    ) -> Result<Self> {
        let cfg = common::setup(comm, common::name_code("hitopk"), d, density, opts)?;
        Self::from_config(comm, cfg)
    }

    pub(crate) fn from_config(comm: &dyn Communicator, cfg: Config) -> Result<Self> {
        let p = cfg.p;
        let n = cfg.opts.ranks_per_node.unwrap_or(p);
        if n == 0 || p % n != 0 {
            return Err(common::fail_together(
                comm,
                Error::InvalidArgument(format!(
                    "HiTopKComm: {n} ranks per node do not divide P = {p}"
                )),
            ));
        }
        let r = cfg.rank;
        let intra = comm.split((r / n) as u32, r as u32)?;
        let inter = comm.split((r % n) as u32, r as u32)?;
        let slice = block_range(cfg.d, n, r % n);
        Ok(HiTopK {
            n,
            intra,
            inter,
            resid: vec![0.0; cfg.d],
            fb: ErrorFeedback::new(slice.len()),
            sel: common::make_selector(cfg.opts.selector, SelectorKind::MsTopK),
            buf: vec![0.0; cfg.d],
            cfg,
        })
    }

    /// Ranks per node `n`.
    pub fn ranks_per_node(&self) -> usize {
        self.n
    }
}

/// Wire form with `f16` values: indices, then half-precision values.
fn encode16(e: &Entries) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 * e.len());
    out.extend_from_slice(bytemuck::cast_slice(&e.idx));
    let h: Vec<f16> = e.val.iter().map(|&v| f16::from_f32(v)).collect();
    out.extend_from_slice(bytemuck::cast_slice(&h));
    out
}

fn decode16(b: &[u8], range: std::ops::Range<usize>) -> Result<Entries> {
    if b.len() % 6 != 0 {
        return Err(Error::Mismatch {
            what: "message length",
            detail: format!("{} bytes is not a whole number of f16 entries", b.len()),
        });
    }
    let n = b.len() / 6;
    let idx: Vec<u32> = bytemuck::pod_collect_to_vec(&b[..4 * n]);
    let h: Vec<f16> = bytemuck::pod_collect_to_vec(&b[4 * n..]);
    if idx.iter().any(|&i| !range.contains(&(i as usize))) {
        return Err(Error::InvalidArgument(
            "HiTopKComm: index outside its slice".into(),
        ));
    }
    Ok(Entries {
        idx,
        val: h.into_iter().map(f16::to_f32).collect(),
    })
}

impl SparseAllreduce for HiTopK {
    fn name(&self) -> &'static str {
        "hitopk"
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
        let (p, d, n) = (self.cfg.p, self.cfg.d, self.n);
        let f16_wire = self.cfg.opts.f16_wire;
        let cci = Counting::new(self.intra.as_ref());
        let cce = Counting::new(self.inter.as_ref());
        let j = self.intra.rank();
        // 1. Intra-node reduce-scatter (Algorithm 2 line 3).
        self.buf.copy_from_slice(grad);
        let wire = if f16_wire {
            WireType::F16
        } else {
            WireType::F32
        };
        let dense = DenseOptions::with_wire(wire).unchecked();
        let slice = reduce_scatter(&cci, &mut self.buf, ReduceScatterAlgo::Ring, &dense)?;
        if slice != block_range(d, n, j) {
            return Err(Error::InvalidArgument(
                "HiTopKComm: unexpected slice".into(),
            ));
        }
        // 2. Top-(ρ·d/n) of residual + slice (Algorithm 2 lines 5-7, Eq. 5).
        let kn = ((self.cfg.density * slice.len() as f64).ceil() as usize).min(slice.len());
        let part = &self.buf[slice.clone()];
        let (mine, selected) = if f16_wire {
            let (sg, _) = self.fb.step_as::<f16>(self.sel.as_mut(), part, kn)?;
            let e = Entries {
                idx: sg
                    .indices()
                    .iter()
                    .map(|&i| i + slice.start as u32)
                    .collect(),
                val: sg.values().iter().map(|v| v.to_f32()).collect(),
            };
            (e, sg.nnz())
        } else {
            let (sg, _) = self.fb.step(self.sel.as_mut(), part, kn)?;
            (
                Entries::from_local(sg.indices(), sg.values(), slice.start),
                sg.nnz(),
            )
        };
        self.resid[slice.clone()].copy_from_slice(self.fb.residual());
        // 3. All-gather among the ranks with this local index, summed in node order.
        let ge = Group::world(self.inter.size(), self.inter.rank());
        let enc = if f16_wire {
            encode16(&mine)
        } else {
            mine.encode()
        };
        let blocks = bruck(&cce, &ge, enc, None, tags::HI_INTER)?;
        let mut parts = Vec::with_capacity(blocks.len());
        for (x, b) in blocks.iter().enumerate() {
            let e = if f16_wire {
                decode16(b, slice.clone())?
            } else {
                Entries::decode_all(b, slice.clone())?
            };
            if x != ge.me {
                cce.add_entries(e.len());
            }
            parts.push(e);
        }
        let refs: Vec<&Entries> = parts.iter().collect();
        let summed = sum_ordered(&refs);
        // 4. Intra-node all-gather of the summed slices (sent in f32: sums of f16 values).
        let gi = Group::world(n, j);
        let blocks = bruck(&cci, &gi, summed.encode(), None, tags::HI_INTRA)?;
        let mut all = Entries::default();
        for (x, b) in blocks.iter().enumerate() {
            let e = Entries::decode_all(b, block_range(d, n, x))?;
            if x != j {
                cci.add_entries(e.len());
            }
            all.idx.extend_from_slice(&e.idx);
            all.val.extend_from_slice(&e.val);
        }
        let update = common::finish_update(&all, d, p);
        let mut stats = common::with_update(cci.stats(), &update, selected);
        let e = cce.counts();
        stats.messages += e.messages;
        stats.rounds += e.rounds;
        stats.bytes_sent += e.bytes_sent;
        stats.bytes_recv += e.bytes_recv;
        stats.entries_recv += e.entries_recv;
        Ok((update, stats))
    }
}
