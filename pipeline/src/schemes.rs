//! How a merged group is reduced, split between the two threads of Algorithm 2 (paper 000):
//! [`Compress`] runs on the compute thread right after the group's last gradient arrived
//! (top-k selection with error feedback, paper 000 Eq. 10's `t_s`), [`Exchange`] runs on
//! the communication thread (the all-gather of Eq. 11, a dense all-reduce, or a whole
//! sparse all-reduce algorithm from `collectives` that selects while it communicates).
//! A [`Scheme`] makes one pair per group, so per-group state (residuals) lives with it.
//!
//! Built in: [`TopkAllgather`] (TopK-SGD / LAGS / MGS / OMGS: exact top-k with error
//! feedback, then an all-gather of the sparse groups, summed and divided by P) and
//! [`DenseRing`] (ring all-reduce, P-SGD / MG-WFBP). Messages carry the iteration and
//! group, so a rank that fell behind is reported as [`Error::RankOutOfStep`].

use collectives::{Communicator, Tag};
use sparsify::SparseGrad;

use crate::{Error, Result};

/// What the compute side hands to the communication side.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// The group's dense gradient (dense schemes, or algorithms that select themselves).
    Dense(Vec<f32>),
    /// The group's selected entries.
    Sparse(SparseGrad<f32>),
}

/// Where an exchange is: every rank must agree on all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExchangeCtx {
    /// Iteration number (from 0).
    pub iteration: u64,
    /// Group index (forward order).
    pub group: u32,
    /// Elements in the group.
    pub numel: usize,
}

/// Compute-thread half of a group's reduction.
pub trait Compress: Send {
    /// Turns the group's dense gradient into what is communicated.
    fn compress(&mut self, grad: Vec<f32>) -> Result<Payload>;
    /// Changes the density (density warm-up); a no-op for dense schemes.
    fn set_density(&mut self, _density: f64) {}
}

/// Communication-thread half: returns the group's gradient averaged over the ranks, the
/// same on every rank.
pub trait Exchange: Send {
    /// Exchanges one group.
    fn exchange(
        &mut self,
        comm: &dyn Communicator,
        ctx: ExchangeCtx,
        payload: Payload,
    ) -> Result<Vec<f32>>;
}

/// A reduction scheme: one compressor and one exchanger per merged group.
pub trait Scheme: Send + Sync {
    /// Short name for reports.
    fn name(&self) -> String;
    /// The pair for group `index` of `numel` elements on `ranks` ranks.
    fn group(
        &self,
        index: usize,
        numel: usize,
        ranks: usize,
    ) -> Result<(Box<dyn Compress>, Box<dyn Exchange>)>;
}

/// Tag of the built-in exchanges' messages.
pub const TAG_EXCHANGE: Tag = 0x6A00;

const HEADER: usize = 16;

fn header(ctx: ExchangeCtx) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&ctx.iteration.to_le_bytes());
    h[8..12].copy_from_slice(&ctx.group.to_le_bytes());
    h[12..].copy_from_slice(&(ctx.numel as u32).to_le_bytes());
    h
}

/// Checks a received message's header against this rank's position.
fn check_header(comm: &dyn Communicator, peer: usize, ctx: ExchangeCtx, msg: &[u8]) -> Result<()> {
    let Some(h) = msg.get(..HEADER) else {
        return Err(Error::InvalidArgument(format!(
            "message from rank {peer} lacks its header"
        )));
    };
    let it = u64::from_le_bytes(h[..8].try_into().unwrap_or([0; 8]));
    let group = u32::from_le_bytes(h[8..12].try_into().unwrap_or([0; 4]));
    let numel = u32::from_le_bytes(h[12..].try_into().unwrap_or([0; 4])) as usize;
    if it != ctx.iteration || group != ctx.group {
        return Err(Error::RankOutOfStep {
            rank: comm.rank(),
            peer,
            mine: ctx.iteration,
            theirs: it,
            my_group: ctx.group,
            their_group: group,
        });
    }
    if numel != ctx.numel {
        return Err(Error::Collectives(collectives::Error::Mismatch {
            what: "group length",
            detail: format!(
                "rank {} has {}, rank {peer} has {numel}",
                comm.rank(),
                ctx.numel
            ),
        }));
    }
    Ok(())
}

/// Elements selected from a group of `numel` at `density`: `⌈ρ·numel⌉`, at least 1.
pub fn selected_count(numel: usize, density: f64) -> usize {
    ((density * numel as f64).ceil() as usize).clamp(1, numel.max(1))
}

/// Exact top-k of `acc` by magnitude, indices ascending. Non-finite entries are an error.
pub fn exact_topk(acc: &[f32], k: usize) -> Result<SparseGrad<f32>> {
    if let Some(i) = acc.iter().position(|v| !v.is_finite()) {
        return Err(Error::InvalidArgument(format!(
            "gradient entry {i} is {} (not finite)",
            acc[i]
        )));
    }
    let k = k.min(acc.len());
    let mut idx: Vec<u32> = (0..acc.len() as u32).collect();
    if k > 0 && k < acc.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            acc[b as usize]
                .abs()
                .total_cmp(&acc[a as usize].abs())
                .then(a.cmp(&b))
        });
    }
    idx.truncate(k);
    idx.sort_unstable();
    let values = idx.iter().map(|&i| acc[i as usize]).collect();
    Ok(SparseGrad::new(idx, values, acc.len())?)
}

/// Top-k with error feedback (residual memory): `acc = residual + grad`, select the top
/// `⌈ρ·n⌉`, keep the rest as the new residual (DESIGN.md's error-feedback contract).
pub struct TopkCompress {
    residual: Vec<f32>,
    density: f64,
}

impl TopkCompress {
    /// A compressor for a group of `numel` elements at `density`.
    pub fn new(numel: usize, density: f64) -> Self {
        TopkCompress {
            residual: vec![0.0; numel],
            density,
        }
    }

    /// The residual kept for the next iteration.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }
}

impl Compress for TopkCompress {
    fn compress(&mut self, grad: Vec<f32>) -> Result<Payload> {
        if grad.len() != self.residual.len() {
            return Err(Error::InvalidArgument(format!(
                "group gradient has {} elements, residual {}",
                grad.len(),
                self.residual.len()
            )));
        }
        for (r, g) in self.residual.iter_mut().zip(&grad) {
            *r += *g;
        }
        let k = selected_count(grad.len(), self.density);
        let sg = exact_topk(&self.residual, k)?;
        for &i in sg.indices() {
            self.residual[i as usize] = 0.0;
        }
        Ok(Payload::Sparse(sg))
    }

    fn set_density(&mut self, density: f64) {
        self.density = density;
    }
}

/// Passes the dense gradient through.
pub struct Identity;

impl Compress for Identity {
    fn compress(&mut self, grad: Vec<f32>) -> Result<Payload> {
        Ok(Payload::Dense(grad))
    }
}

/// Ring all-gather of one byte blob per rank (P−1 send-receive rounds); returns the blobs
/// in rank order, each checked against `ctx`.
pub fn ring_allgather(
    comm: &dyn Communicator,
    ctx: ExchangeCtx,
    mine: Vec<u8>,
) -> Result<Vec<Vec<u8>>> {
    let p = comm.size();
    let r = comm.rank();
    let mut blobs: Vec<Vec<u8>> = vec![Vec::new(); p];
    let mut msg = Vec::with_capacity(HEADER + mine.len());
    msg.extend_from_slice(&header(ctx));
    msg.extend_from_slice(&mine);
    blobs[r] = msg;
    let right = (r + 1) % p;
    let left = (r + p - 1) % p;
    for s in 0..p.saturating_sub(1) {
        let send_idx = (r + p - s) % p;
        let recv_idx = (r + 2 * p - s - 1) % p;
        let got = comm.sendrecv(right, TAG_EXCHANGE, &blobs[send_idx], left, TAG_EXCHANGE)?;
        check_header(comm, recv_idx, ctx, &got)?;
        blobs[recv_idx] = got;
    }
    Ok(blobs.into_iter().map(|mut b| b.split_off(HEADER)).collect())
}

/// All-gather of every rank's sparse group, summed in rank order and divided by P (the
/// sparse aggregation of paper 000 §II-F), bit-identical on every rank.
pub struct SparseAllgather;

impl Exchange for SparseAllgather {
    fn exchange(
        &mut self,
        comm: &dyn Communicator,
        ctx: ExchangeCtx,
        payload: Payload,
    ) -> Result<Vec<f32>> {
        let sg = match payload {
            Payload::Sparse(s) => s,
            Payload::Dense(d) => SparseGrad::from_dense(&d)?,
        };
        let blobs = ring_allgather(comm, ctx, sg.encode())?;
        let mut out = vec![0.0f32; ctx.numel];
        for (peer, b) in blobs.iter().enumerate() {
            let g = SparseGrad::<f32>::decode(b)?;
            if g.len() != ctx.numel {
                return Err(Error::Collectives(collectives::Error::Mismatch {
                    what: "sparse group length",
                    detail: format!("rank {peer} sent {}, expected {}", g.len(), ctx.numel),
                }));
            }
            g.scatter_add_into(&mut out)?;
        }
        let inv = 1.0 / comm.size() as f32;
        out.iter_mut().for_each(|v| *v *= inv);
        Ok(out)
    }
}

fn chunk_bounds(n: usize, p: usize, i: usize) -> std::ops::Range<usize> {
    let base = n / p;
    let rem = n % p;
    let start = i * base + i.min(rem);
    start..start + base + usize::from(i < rem)
}

/// Ring all-reduce (reduce-scatter then all-gather, 2(P−1) rounds; paper 004 Algorithm 3's
/// allreduce), averaged.
pub struct DenseRing;

impl Exchange for DenseRing {
    fn exchange(
        &mut self,
        comm: &dyn Communicator,
        ctx: ExchangeCtx,
        payload: Payload,
    ) -> Result<Vec<f32>> {
        let mut data = match payload {
            Payload::Dense(d) => d,
            Payload::Sparse(s) => s.to_dense(),
        };
        if data.len() != ctx.numel {
            return Err(Error::InvalidArgument(format!(
                "dense group has {} elements, expected {}",
                data.len(),
                ctx.numel
            )));
        }
        let p = comm.size();
        let r = comm.rank();
        let n = data.len();
        let right = (r + 1) % p;
        let left = (r + p - 1) % p;
        let h = header(ctx);
        let mut msg = Vec::new();
        let mut send = |comm: &dyn Communicator, chunk: &[f32]| -> Result<Vec<u8>> {
            msg.clear();
            msg.extend_from_slice(&h);
            msg.extend_from_slice(bytemuck::cast_slice(chunk));
            let got = comm.sendrecv(right, TAG_EXCHANGE, &msg, left, TAG_EXCHANGE)?;
            check_header(comm, left, ctx, &got)?;
            Ok(got)
        };
        for s in 0..p.saturating_sub(1) {
            let si = (r + p - s) % p;
            let ri = (r + 2 * p - s - 1) % p;
            let got = send(comm, &data[chunk_bounds(n, p, si)])?;
            let dst = &mut data[chunk_bounds(n, p, ri)];
            add_bytes(dst, &got[HEADER..], left)?;
        }
        for s in 0..p.saturating_sub(1) {
            let si = (r + 1 + p - s) % p;
            let ri = (r + p - s) % p;
            let got = send(comm, &data[chunk_bounds(n, p, si)])?;
            let dst = &mut data[chunk_bounds(n, p, ri)];
            copy_bytes(dst, &got[HEADER..], left)?;
        }
        let inv = 1.0 / p as f32;
        data.iter_mut().for_each(|v| *v *= inv);
        Ok(data)
    }
}

fn f32_iter(bytes: &[u8], peer: usize, want: usize) -> Result<impl Iterator<Item = f32> + '_> {
    if bytes.len() != want * 4 {
        return Err(Error::Collectives(collectives::Error::Mismatch {
            what: "dense chunk length",
            detail: format!(
                "rank {peer} sent {} bytes, expected {}",
                bytes.len(),
                want * 4
            ),
        }));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
}

fn add_bytes(dst: &mut [f32], bytes: &[u8], peer: usize) -> Result<()> {
    let n = dst.len();
    for (d, v) in dst.iter_mut().zip(f32_iter(bytes, peer, n)?) {
        *d += v;
    }
    Ok(())
}

fn copy_bytes(dst: &mut [f32], bytes: &[u8], peer: usize) -> Result<()> {
    let n = dst.len();
    for (d, v) in dst.iter_mut().zip(f32_iter(bytes, peer, n)?) {
        *d = v;
    }
    Ok(())
}

/// TopK-SGD family: exact top-k with error feedback per group, sparse all-gather. With one
/// group it is TopK-SGD, with layer-wise groups LAGS-SGD, with a threshold plan MGS-SGD,
/// with the optimal plan OMGS-SGD (paper 000 Table I).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopkAllgather {
    /// Density ρ.
    pub density: f64,
}

impl Scheme for TopkAllgather {
    fn name(&self) -> String {
        format!("topk-allgather(ρ={})", self.density)
    }
    fn group(
        &self,
        _index: usize,
        numel: usize,
        _ranks: usize,
    ) -> Result<(Box<dyn Compress>, Box<dyn Exchange>)> {
        if !(self.density.is_finite() && self.density > 0.0 && self.density <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "density {} outside (0, 1]",
                self.density
            )));
        }
        Ok((
            Box::new(TopkCompress::new(numel, self.density)),
            Box::new(SparseAllgather),
        ))
    }
}

/// Dense ring all-reduce per group (P-SGD, MG-WFBP).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DenseAllreduce;

impl Scheme for DenseAllreduce {
    fn name(&self) -> String {
        "dense-ring".into()
    }
    fn group(
        &self,
        _index: usize,
        _numel: usize,
        _ranks: usize,
    ) -> Result<(Box<dyn Compress>, Box<dyn Exchange>)> {
        Ok((Box::new(Identity), Box::new(DenseRing)))
    }
}

/// A sparse all-reduce algorithm of `collectives::sparse` (SparDL, ExDyna, HiTopKComm,
/// TopkA, ...) as a group's exchange. It selects while it communicates, so its compressor
/// passes the dense gradient through and the whole step runs on the communication thread.
/// The algorithm is built (a collective call) on the first exchange, on that thread.
pub struct CollectiveSparse {
    name: String,
    density: f64,
    opts: collectives::sparse::SparseOptions,
    alg: Option<Box<dyn collectives::sparse::SparseAllreduce>>,
}

impl Exchange for CollectiveSparse {
    fn exchange(
        &mut self,
        comm: &dyn Communicator,
        ctx: ExchangeCtx,
        payload: Payload,
    ) -> Result<Vec<f32>> {
        let grad = match payload {
            Payload::Dense(d) => d,
            Payload::Sparse(s) => s.to_dense(),
        };
        // One header round per step: a rank that fell behind is a typed error, not a
        // silently mixed-up update.
        ring_allgather(comm, ctx, Vec::new())?;
        let alg = match &mut self.alg {
            Some(a) => a,
            None => self.alg.insert(collectives::sparse::build(
                &self.name,
                comm,
                ctx.numel,
                self.density,
                &self.opts,
            )?),
        };
        let (update, _stats) = alg.step(comm, &grad)?;
        Ok(update.to_dense())
    }
}

/// A `collectives::sparse` algorithm by name (one of `collectives::sparse::NAMES`).
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveScheme {
    /// Algorithm name, e.g. `spardl`, `exdyna`, `hitopk`.
    pub name: String,
    /// Density ρ.
    pub density: f64,
    /// The algorithm's options.
    pub opts: collectives::sparse::SparseOptions,
}

impl Scheme for CollectiveScheme {
    fn name(&self) -> String {
        format!("{}(ρ={})", self.name, self.density)
    }
    fn group(
        &self,
        _index: usize,
        _numel: usize,
        _ranks: usize,
    ) -> Result<(Box<dyn Compress>, Box<dyn Exchange>)> {
        if !collectives::sparse::NAMES.contains(&self.name.as_str()) {
            return Err(Error::InvalidArgument(format!(
                "unknown sparse allreduce `{}`; known: {}",
                self.name,
                collectives::sparse::NAMES.join(", ")
            )));
        }
        Ok((
            Box::new(Identity),
            Box::new(CollectiveSparse {
                name: self.name.clone(),
                density: self.density,
                opts: self.opts,
                alg: None,
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectives::ThreadComm;

    #[test]
    fn topk_keeps_mass_in_the_residual() {
        let mut c = TopkCompress::new(5, 0.4);
        let Payload::Sparse(s) = c.compress(vec![1.0, -5.0, 0.5, 4.0, 0.1]).unwrap() else {
            panic!("sparse expected")
        };
        assert_eq!(s.indices(), &[1, 3]);
        assert_eq!(c.residual(), &[1.0, 0.0, 0.5, 0.0, 0.1]);
        assert!(c.compress(vec![f32::NAN; 5]).is_err());
        assert!(c.compress(vec![0.0; 4]).is_err());
    }

    #[test]
    fn exchanges_average_and_agree() {
        for p in [1, 2, 3, 4] {
            let out = ThreadComm::run(p, |comm| -> Result<(Vec<f32>, Vec<f32>)> {
                let r = comm.rank() as f32;
                let ctx = ExchangeCtx {
                    iteration: 3,
                    group: 1,
                    numel: 7,
                };
                let grad: Vec<f32> = (0..7).map(|i| i as f32 + r).collect();
                let dense = DenseRing.exchange(&comm, ctx, Payload::Dense(grad.clone()))?;
                let sparse = SparseAllgather.exchange(&comm, ctx, Payload::Dense(grad))?;
                Ok((dense, sparse))
            })
            .unwrap();
            let mean_r = (p as f32 - 1.0) / 2.0;
            for (d, s) in &out {
                for i in 0..7 {
                    assert!((d[i] - (i as f32 + mean_r)).abs() < 1e-5);
                    assert!((s[i] - (i as f32 + mean_r)).abs() < 1e-5);
                }
                assert_eq!(d, &out[0].0);
                assert_eq!(s, &out[0].1);
            }
        }
    }

    #[test]
    fn out_of_step_rank_is_reported() {
        let res = ThreadComm::run_all(
            2,
            collectives::ThreadConfig::with_timeout(std::time::Duration::from_secs(2)),
            |comm| -> Result<Vec<f32>> {
                let it = if comm.rank() == 1 { 4 } else { 5 };
                let ctx = ExchangeCtx {
                    iteration: it,
                    group: 0,
                    numel: 3,
                };
                SparseAllgather.exchange(&comm, ctx, Payload::Dense(vec![1.0; 3]))
            },
        )
        .unwrap();
        for r in res {
            assert!(matches!(r, Err(Error::RankOutOfStep { .. })), "{r:?}");
        }
    }
}
