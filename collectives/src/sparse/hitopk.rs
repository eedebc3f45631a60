//! HiTopKComm (Shi et al., MLSys 2021, §3.2, Algorithm 2) with error feedback on the reduced slice:
//! 1. intra-node dense reduce-scatter, so local rank `j` holds slice `j` of its node's sum;
//! 2. top-`k/n` of `residual + slice` (MSTopK by default, MSTopK/HiTopKComm
//!    (Shi et al., MLSys 2021) Algorithm 1);
//! 3. for each local index `j`, an all-gather among the `m` ranks with local index `j`
//!    (one per node), summed in node order;
//! 4. an intra-node all-gather of the summed slices.
//!
//! Ranks are placed in blocks: rank `r` is on node `r / n` with local index `r mod n`
//! (`n = ranks_per_node`, which must divide P; by default the transport's node structure,
//! [`crate::comm::nodes::ranks_per_node`]). The sub-communicators are split once, at
//! construction. With `f16_wire` the values travel as IEEE half (MSTopK/HiTopKComm
//! (Shi et al., MLSys 2021) §5.3): the reduce-scatter sums through `f16`, and the selected values
//! are rounded to `f16` with the rounding error kept in the residual. Conserves mass on both
//! wires: what a slice owner does not select stays in its residual, and with the `f16` wire
//! each rank also keeps, outside its slice, what rounding took from the partial sums it sent
//! in the reduce-scatter (a ring reduce-scatter leaves exactly those `f32` partial sums in
//! the sender's buffer) and adds it back into its next step's input; with the `f32` wire the
//! residual is zero outside the slice.

use half::f16;
use sparsify::SparseGrad;

use super::common::{self, bruck, sum_ordered, tags, Config, Entries, Group};
use super::scaffold::{self, accessors, constructor, Feedback};
use super::{SelectorKind, SparseAllreduce, StepStats};
use crate::dense::{block_range, reduce_scatter, DenseOptions, ReduceScatterAlgo, WireType};
use crate::{Communicator, Error, Result};

/// HiTopKComm over node-local and cross-node sub-communicators.
pub struct HiTopK {
    cfg: Config,
    n: usize,
    intra: Box<dyn Communicator>,
    inter: Box<dyn Communicator>,
    /// Residual of this rank's slice, and outside it the `f16` wire's rounding of the
    /// partial sums this rank sent (zero with the `f32` wire), as a full-length vector.
    resid: Vec<f32>,
    /// Error feedback over the slice.
    fb: Feedback,
    buf: Vec<f32>,
}

impl HiTopK {
    constructor!(
        HiTopK { ranks_per_node: Option<usize>, f16_wire: bool, selector: Option<sparsify::SelectorKind> },
        "HiTopKComm",
        with_comm
    );

    pub(crate) fn from_config(comm: &dyn Communicator, cfg: Config) -> Result<Self> {
        let p = cfg.p;
        // The node structure: the explicit option, else the transport's (MPI's
        // shared-memory groups, the simulated topology, a thread world's option).
        let n = match cfg.opts.ranks_per_node {
            Some(n) => n,
            None => crate::comm::nodes::ranks_per_node(comm)?,
        };
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
            fb: Feedback::new(&cfg, slice.len(), SelectorKind::MsTopK),
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
    accessors!("hitopk", |s| &s.resid);

    fn step(
        &mut self,
        comm: &dyn Communicator,
        grad: &[f32],
    ) -> Result<(SparseGrad<f32>, StepStats)> {
        self.cfg.check_step(comm, grad)?;
        let (d, n) = (self.cfg.d, self.n);
        let f16_wire = self.cfg.opts.f16_wire;
        let cci = common::counting(self.intra.as_ref());
        let cce = common::counting(self.inter.as_ref());
        let j = self.intra.rank();
        // 1. Intra-node reduce-scatter (Algorithm 2 line 3) of the gradient plus the wire
        // rounding carried outside the slice.
        let slice = block_range(d, n, j);
        self.buf.copy_from_slice(grad);
        if f16_wire {
            for range in [0..slice.start, slice.end..d] {
                for (b, &r) in self.buf[range.clone()].iter_mut().zip(&self.resid[range]) {
                    *b += r;
                }
            }
        }
        let wire = if f16_wire {
            WireType::F16
        } else {
            WireType::F32
        };
        let dense = DenseOptions::with_wire(wire).unchecked();
        if reduce_scatter(&cci, &mut self.buf, ReduceScatterAlgo::Ring, &dense)? != slice {
            return Err(Error::InvalidArgument(
                "HiTopKComm: unexpected slice".into(),
            ));
        }
        // What the f16 wire took from the partial sums this rank sent: outside its slice,
        // the ring leaves each block as the f32 sum that went out. (With the f32 wire the
        // residual stays zero there.)
        if f16_wire {
            for range in [0..slice.start, slice.end..d] {
                for (r, &b) in self.resid[range.clone()].iter_mut().zip(&self.buf[range]) {
                    *r = b - f16::from_f32(b).to_f32();
                }
            }
        }
        // 2. Top-(ρ·d/n) of residual + slice (Algorithm 2 lines 5-7, Eq. 5).
        let kn = ((self.cfg.density * slice.len() as f64).ceil() as usize).min(slice.len());
        let part = &self.buf[slice.clone()];
        let mine = if f16_wire {
            self.fb.select_as::<f16>(part, kn, slice.start)?
        } else {
            self.fb.select(part, kn, slice.start)?
        };
        let selected = mine.len();
        self.resid[slice.clone()].copy_from_slice(self.fb.residual());
        // 3. All-gather among the ranks with this local index, summed in node order.
        let ge = Group::world(self.inter.size(), self.inter.rank());
        let enc = if f16_wire {
            encode16(&mine)
        } else {
            mine.encode()
        };
        let blocks = bruck(&cce, &ge, enc, None, tags::HI_INTER)?;
        let parts = scaffold::decode_blocks(&cce, &blocks, ge.me, |_, b| {
            let e = if f16_wire {
                decode16(b, slice.clone())?
            } else {
                Entries::decode_all(b, slice.clone())?
            };
            Ok((e, true))
        })?;
        let refs: Vec<&Entries> = parts.iter().collect();
        let summed = sum_ordered(&refs);
        // 4. Intra-node all-gather of the summed slices (sent in f32: sums of f16 values).
        let gi = Group::world(n, j);
        let blocks = bruck(&cci, &gi, summed.encode(), None, tags::HI_INTRA)?;
        let parts = scaffold::decode_ranges(&cci, &blocks, j, |x| block_range(d, n, x))?;
        let counts = cci.counts() + cce.counts();
        scaffold::finish(&self.cfg, &scaffold::concat(&parts), counts, selected)
    }
}
