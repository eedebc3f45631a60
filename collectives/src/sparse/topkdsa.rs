//! TopkDSA (SparCML's dynamic sparse allreduce, SparDL (Zhao et al.) §4 baseline [36]): local top-k
//! with error feedback, a split reduce-scatter that sends each rank's entries of block `j`
//! straight to rank `j` (`P − 1` rounds), then a Bruck all-gather of the reduced blocks in
//! which a block that has filled in travels **dense** (values only) once that is smaller
//! than its sparse form. SparDL (Zhao et al.) Table 1: `(P + 2 log P)α` and between `4k(P−1)/P` and
//! `(2k + n)(P−1)/P` numbers. Conserves mass: every selected entry reaches the update.

use cost_model::plan::sparse::direct_exchanges;
use sparsify::SparseGrad;

use super::common::{bruck, sum_ordered, tags, Config, Counting, Entries, Group};
use super::scaffold::{self, accessors, constructor, counted_step, Feedback};
use super::{SelectorKind, SparseAllreduce, StepStats};
use crate::{Communicator, Error, Result};

/// TopkDSA: sparse reduce-scatter plus an all-gather that switches to dense blocks.
pub struct TopkDsa {
    cfg: Config,
    fb: Feedback,
    dense_blocks: usize,
}

/// Start of block `j` of `d` split into `p` nearly equal blocks.
fn start(d: usize, p: usize, j: usize) -> usize {
    j * (d / p) + j.min(d % p)
}

impl TopkDsa {
    constructor!(TopkDsa { selector: Option<sparsify::SelectorKind> }, "TopkDSA");

    pub(crate) fn from_config(cfg: Config) -> Self {
        TopkDsa {
            fb: Feedback::new(&cfg, cfg.d, SelectorKind::Exact),
            dense_blocks: 0,
            cfg,
        }
    }

    /// Blocks that travelled dense in the last step's all-gather.
    pub fn dense_blocks(&self) -> usize {
        self.dense_blocks
    }
}

fn encode_block(e: &Entries, range: std::ops::Range<usize>) -> Vec<u8> {
    let len = range.len();
    let mut out = Vec::new();
    if 8 * e.len() > 4 * len {
        out.extend_from_slice(&1u32.to_le_bytes());
        let mut dense = vec![0.0f32; len];
        for (&i, &v) in e.idx.iter().zip(&e.val) {
            dense[i as usize - range.start] = v;
        }
        out.extend_from_slice(bytemuck::cast_slice(&dense));
    } else {
        out.extend_from_slice(&0u32.to_le_bytes());
        e.encode_into(&mut out);
    }
    out
}

fn decode_block(b: &[u8], range: std::ops::Range<usize>) -> Result<(Entries, bool)> {
    let bad = || Error::Mismatch {
        what: "message length",
        detail: "TopkDSA block".into(),
    };
    let head = b.get(..4).ok_or_else(bad)?;
    let body = &b[4..];
    if head == 1u32.to_le_bytes() {
        if body.len() != 4 * range.len() {
            return Err(bad());
        }
        let val: Vec<f32> = bytemuck::pod_collect_to_vec(body);
        let idx = (range.start as u32..range.end as u32).collect();
        Ok((Entries { idx, val }, true))
    } else {
        Ok((Entries::decode_all(body, range)?, false))
    }
}

impl SparseAllreduce for TopkDsa {
    accessors!("topkdsa", |s| s.fb.residual());
    counted_step!();
}

impl TopkDsa {
    /// One step on the counting adapter `cc` (see [`SparseAllreduce::step`]).
    fn run(&mut self, cc: &Counting, grad: &[f32]) -> Result<(SparseGrad<f32>, StepStats)> {
        let (p, d, k, rank) = (self.cfg.p, self.cfg.d, self.cfg.k(), self.cfg.rank);
        let local = self.fb.select(grad, k, 0)?;
        let (idx, val) = (&local.idx, &local.val);
        let range = |j: usize| start(d, p, j)..start(d, p, j + 1);
        let part_of = |j: usize| {
            let r = range(j);
            let a = idx.partition_point(|&i| (i as usize) < r.start);
            let b = idx.partition_point(|&i| (i as usize) < r.end);
            Entries {
                idx: idx[a..b].to_vec(),
                val: val[a..b].to_vec(),
            }
        };
        // Split reduce-scatter: P − 1 direct exchanges.
        let mut parts: Vec<Entries> = vec![Entries::default(); p];
        parts[rank] = part_of(rank);
        for (dest, src) in direct_exchanges(p, rank) {
            let got = cc.sendrecv(
                dest,
                tags::DSA_RS,
                &part_of(dest).encode(),
                src,
                tags::DSA_RS,
            )?;
            parts[src] = Entries::decode_all(&got, range(rank))?;
            cc.add_items(parts[src].len());
        }
        let refs: Vec<&Entries> = parts.iter().collect();
        let mine = sum_ordered(&refs);
        // All-gather, dense where the block filled in.
        let g = Group::world(p, rank);
        let blocks = bruck(cc, &g, encode_block(&mine, range(rank)), None, tags::DSA_AG)?;
        let mut dense_blocks = 0;
        let parts = scaffold::decode_blocks(cc, &blocks, rank, |j, b| {
            let (e, dense) = decode_block(b, range(j))?;
            dense_blocks += dense as usize;
            Ok((e, !dense))
        })?;
        self.dense_blocks = dense_blocks;
        scaffold::finish(&self.cfg, &scaffold::concat(&parts), cc.counts(), k)
    }
}
