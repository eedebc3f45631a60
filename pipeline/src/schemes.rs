//! How a merged group is reduced, split between the two threads of Algorithm 2 (OMGS-SGD
//! (Shi et al., INFOCOM 2020)): [`Compress`] runs on the compute thread right after the group's
//! last gradient arrived (top-k selection with error feedback, OMGS-SGD (Shi et al., INFOCOM 2020)
//! Eq. 10's `t_s`), [`Exchange`] runs on the communication thread (the all-gather of Eq. 11, a
//! dense all-reduce, or a whole sparse all-reduce algorithm from `collectives` that selects while
//! it communicates). A [`Scheme`] makes one pair per group, so per-group state (residuals) lives
//! with it.
//!
//! The pieces are the workspace's own: selection and residual memory are
//! [`sparsify::ErrorFeedback`] driven by a [`sparsify::Selector`] (exact top-k by default),
//! the wire format is [`SparseGrad::encode`], and the transport algorithms are
//! `collectives::dense` (`allgatherv_known`, `allreduce`) and `collectives::sparse`.
//! What this module adds is the runtime's agreement check: every exchange shares each
//! rank's (iteration, group, length), in front of the sparse all-gather's data or in an
//! [`agree`] round before a dense or `collectives::sparse` exchange, so a rank that fell
//! behind is reported as [`Error::RankOutOfStep`] on every rank instead of a mixed-up
//! update.
//!
//! Built in: [`TopkAllgather`] (TopK-SGD / LAGS / MGS / OMGS: exact top-k with error
//! feedback, then an all-gather of the sparse groups, summed and divided by P),
//! [`SelectorAllgather`] (the same with any `sparsify` selector by name),
//! [`DenseAllreduce`] (ring all-reduce, P-SGD / MG-WFBP) and [`CollectiveScheme`] (a
//! `collectives::sparse` algorithm by name).

use collectives::dense::{self, AllgatherAlgo, AllreduceAlgo, DenseOptions};
use collectives::sparse::SparseAlgo;
use collectives::Communicator;
use sparsify::{ErrorFeedback, ExactTopK, Selector, SparseGrad};

use crate::timeline::Traffic;
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
    /// What it carries to the next iteration (the error-feedback residual), for a
    /// checkpoint; empty when nothing.
    fn save_state(&self) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }
    /// Continues from [`Self::save_state`]'s output.
    fn restore_state(&mut self, state: &[u8]) -> Result<()> {
        no_state(state)
    }
    /// Selections that started from the previous iteration's threshold, and how many of
    /// them missed and fell back ([`sparsify::Selector::warm_starts`]); `None` when the
    /// compressor has no such selector.
    fn warm_starts(&self) -> Option<(u64, u64)> {
        None
    }
}

/// The default restore of a stateless half: only an empty state fits.
fn no_state(state: &[u8]) -> Result<()> {
    if state.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "a stateless reduction given {} bytes of state",
            state.len()
        )))
    }
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
    /// What it carries to the next exchange (a sparse algorithm's residual, thresholds,
    /// partitions), for a checkpoint; empty when nothing.
    fn save_state(&self) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }
    /// Continues from [`Self::save_state`]'s output.
    fn restore_state(&mut self, state: &[u8]) -> Result<()> {
        no_state(state)
    }
    /// What the last exchange sent, where that depends on the data (threshold
    /// algorithms); `None` where the size alone decides it.
    fn last_traffic(&self) -> Option<Traffic> {
        None
    }
}

/// One group's halves: the compressor (compute thread) and the exchange (communication
/// thread).
pub type GroupPair = (Box<dyn Compress>, Box<dyn Exchange>);

/// A reduction scheme: one compressor and one exchanger per merged group.
pub trait Scheme: Send + Sync {
    /// Short name for reports.
    fn name(&self) -> String;
    /// The pair for group `index` of `numel` elements on `ranks` ranks.
    fn group(&self, index: usize, numel: usize, ranks: usize) -> Result<GroupPair>;
}

/// Bytes of the header that names an exchange: iteration, group and length as
/// little-endian `u64`s.
pub const HEADER_BYTES: usize = 24;

impl ExchangeCtx {
    /// This position as the wire header.
    fn header(&self) -> [u64; 3] {
        [self.iteration, u64::from(self.group), self.numel as u64]
    }
}

/// Checks every rank's header (rank order) against this rank's position: a peer at
/// another iteration or group is [`Error::RankOutOfStep`], one with another group length
/// a length mismatch. Every rank sees the same headers, so every rank reports.
fn check_headers(comm: &dyn Communicator, ctx: ExchangeCtx, headers: &[[u64; 3]]) -> Result<()> {
    let mine = ctx.header();
    for (peer, h) in headers.iter().enumerate() {
        if h[..2] != mine[..2] {
            return Err(Error::RankOutOfStep {
                rank: comm.rank(),
                peer,
                mine: ctx.iteration,
                theirs: h[0],
                my_group: ctx.group,
                their_group: u32::try_from(h[1]).unwrap_or(u32::MAX),
            });
        }
    }
    for (peer, h) in headers.iter().enumerate() {
        if h[2] != mine[2] {
            return Err(Error::Collectives(collectives::Error::Mismatch {
                what: "group length",
                detail: format!(
                    "rank {} has {}, rank {peer} has {}",
                    comm.rank(),
                    ctx.numel,
                    h[2]
                ),
            }));
        }
    }
    Ok(())
}

/// Agreement step of the exchanges that cannot carry a header in their own messages (a
/// dense all-reduce, a `collectives::sparse` algorithm): one Bruck all-gather
/// (`⌈log2 P⌉` rounds) of every rank's [`HEADER_BYTES`]-byte header, then
/// `check_headers`. The sparse all-gather puts the header in front of its data instead
/// and needs no extra round.
pub fn agree(comm: &dyn Communicator, ctx: ExchangeCtx) -> Result<()> {
    let mut all = vec![[0u64; 3]; comm.size()];
    dense::allgather(
        comm,
        &[ctx.header()],
        &mut all,
        AllgatherAlgo::Bruck,
        &DenseOptions::default().unchecked(),
    )?;
    check_headers(comm, ctx, &all)
}

/// Elements selected from a group of `numel` at `density`: `⌈ρ·numel⌉`, at least 1.
pub fn selected_count(numel: usize, density: f64) -> usize {
    ((density * numel as f64).ceil() as usize).clamp(1, numel.max(1))
}

/// The pair of the all-gather schemes: `selector` with error feedback at `density`
/// (finite, in (0, 1]), then the sparse all-gather.
fn selector_allgather(
    numel: usize,
    density: f64,
    selector: Box<dyn Selector>,
) -> Result<GroupPair> {
    if !(density.is_finite() && density > 0.0 && density <= 1.0) {
        return Err(Error::InvalidArgument(format!(
            "density {density} outside (0, 1]"
        )));
    }
    let exchange = SparseAllgather {
        equal_counts: selector.exact_count(),
        ..SparseAllgather::default()
    };
    Ok((
        Box::new(TopkCompress::with_selector(numel, density, selector)),
        Box::new(exchange),
    ))
}

/// Top-k with error feedback (residual memory, the selector contract): `acc = residual +
/// grad`, select `⌈ρ·n⌉` entries of `acc` with a `sparsify` selector (fused into one pass
/// by [`ErrorFeedback::step`]), keep the rest as the new residual.
pub struct TopkCompress {
    feedback: ErrorFeedback,
    selector: Box<dyn Selector>,
    density: f64,
}

impl TopkCompress {
    /// A compressor for a group of `numel` elements at `density`, with exact top-k.
    pub fn new(numel: usize, density: f64) -> Self {
        Self::with_selector(numel, density, Box::new(ExactTopK::new()))
    }

    /// A compressor with another selector (e.g. from [`sparsify::SelectorKind::build`]).
    pub fn with_selector(numel: usize, density: f64, selector: Box<dyn Selector>) -> Self {
        TopkCompress {
            feedback: ErrorFeedback::new(numel),
            selector,
            density,
        }
    }

    /// The residual kept for the next iteration.
    pub fn residual(&self) -> &[f32] {
        self.feedback.residual()
    }
}

impl Compress for TopkCompress {
    fn compress(&mut self, grad: Vec<f32>) -> Result<Payload> {
        let k = selected_count(grad.len(), self.density);
        match self.feedback.step(self.selector.as_mut(), &grad, k) {
            Ok((sg, _)) => Ok(Payload::Sparse(sg)),
            Err(e) => {
                // A non-finite gradient leaves the residual poisoned: start it afresh so
                // the next iteration is not rejected too.
                if matches!(e, sparsify::Error::NonFinite { .. }) {
                    self.feedback.reset();
                }
                Err(e.into())
            }
        }
    }

    fn set_density(&mut self, density: f64) {
        self.density = density;
    }

    fn warm_starts(&self) -> Option<(u64, u64)> {
        self.selector.warm_starts()
    }

    /// The residual. The selectors' own state (the warm start of exact top-k and MSTopK)
    /// changes only their speed, never what they select, so it is not saved.
    fn save_state(&self) -> Result<Vec<u8>> {
        let mut e = crate::checkpoint::Enc::default();
        e.f32s(self.feedback.residual());
        Ok(e.0)
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<()> {
        let mut d = crate::checkpoint::Dec(state);
        let residual = d.f32s()?;
        d.finish()?;
        Ok(self.feedback.restore(&residual)?)
    }
}

/// Passes the dense gradient through.
pub struct Identity;

impl Compress for Identity {
    fn compress(&mut self, grad: Vec<f32>) -> Result<Payload> {
        Ok(Payload::Dense(grad))
    }
}

/// The payload as a dense vector of the group's length.
fn dense_payload(ctx: ExchangeCtx, payload: Payload) -> Result<Vec<f32>> {
    let data = match payload {
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
    Ok(data)
}

/// Multiplies by `1/P`: the sum over ranks becomes the average.
fn average(comm: &dyn Communicator, data: &mut [f32]) {
    let inv = 1.0 / comm.size() as f32;
    data.iter_mut().for_each(|v| *v *= inv);
}

/// All-gather of every rank's sparse group (`collectives::dense::allgatherv`, or `allgatherv_known`
/// when every rank sends the same number of entries), summed in rank order and divided by P (the
/// sparse aggregation of OMGS-SGD (Shi et al., INFOCOM 2020) §II-F), bit-identical on every rank.
/// Each rank's block is its [`HEADER_BYTES`]-byte header followed by the [`SparseGrad`] wire
/// encoding, so the agreement check costs no extra round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SparseAllgather {
    /// The all-gather algorithm (ring by default, as the timeline of OMGS-SGD
    /// (Shi et al., INFOCOM 2020) assumes).
    pub algo: AllgatherAlgo,
    /// Every rank sends as many entries as this one (an exact-count selector at the same
    /// density): skip the exchange of counts. A peer that sends another length is then a
    /// transport-level length mismatch.
    pub equal_counts: bool,
}

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
        let mut blob = Vec::with_capacity(HEADER_BYTES + sg.encoded_len());
        blob.extend_from_slice(bytemuck::cast_slice(&ctx.header().map(u64::to_le)));
        sg.encode_into(&mut blob);
        let gathered = if self.equal_counts {
            dense::allgatherv_known(comm, &blob, &vec![blob.len(); comm.size()], self.algo)?
        } else {
            dense::allgatherv(comm, &blob, self.algo)?
        };
        let p = comm.size();
        let mut headers = vec![[0u64; 3]; p];
        for (peer, h) in headers.iter_mut().enumerate() {
            let part = gathered.part(peer);
            let Some(bytes) = part.get(..HEADER_BYTES) else {
                return Err(Error::InvalidArgument(format!(
                    "message from rank {peer} lacks its header"
                )));
            };
            for (w, b) in h.iter_mut().zip(bytes.chunks_exact(8)) {
                *w = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
            }
        }
        check_headers(comm, ctx, &headers)?;
        let mut out = vec![0.0f32; ctx.numel];
        for peer in 0..p {
            let g = SparseGrad::<f32>::decode(&gathered.part(peer)[HEADER_BYTES..])?;
            if g.len() != ctx.numel {
                return Err(Error::Collectives(collectives::Error::Mismatch {
                    what: "sparse group length",
                    detail: format!("rank {peer} sent {}, expected {}", g.len(), ctx.numel),
                }));
            }
            g.scatter_add_into(&mut out)?;
        }
        average(comm, &mut out);
        Ok(out)
    }
}

/// Dense all-reduce of the group (`collectives::dense::allreduce`, averaged). The
/// [`agree`] header already compared the lengths, so the collective runs unchecked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DenseExchange {
    /// The all-reduce algorithm (ring by default: reduce-scatter then all-gather, 2(P−1)
    /// rounds; Linear Pipelining (Wang et al.) Algorithm 3's allreduce).
    pub algo: AllreduceAlgo,
}

impl Exchange for DenseExchange {
    fn exchange(
        &mut self,
        comm: &dyn Communicator,
        ctx: ExchangeCtx,
        payload: Payload,
    ) -> Result<Vec<f32>> {
        averaged_sum(comm, ctx, payload, |comm, data, opts| {
            dense::allreduce(comm, data, self.algo, opts)
        })
    }
}

/// Dense all-reduce of the group by the online automatic choice
/// (`collectives::dense::OnlineChoice`), averaged: it starts from the calibration's pick
/// (or the built-in rule's) and re-ranks that pick and the other candidates from the
/// timings of its own calls during training, agreed across ranks. Every rank runs the same
/// algorithm in every call.
#[derive(Debug, Default)]
pub struct OnlineDenseExchange {
    /// The choice and its timings (per size; one per group here).
    pub online: dense::OnlineChoice,
    /// The calibration the choice starts from.
    pub calibration: Option<std::sync::Arc<cost_model::Calibration>>,
}

impl Exchange for OnlineDenseExchange {
    fn exchange(
        &mut self,
        comm: &dyn Communicator,
        ctx: ExchangeCtx,
        payload: Payload,
    ) -> Result<Vec<f32>> {
        let cal = self
            .calibration
            .as_deref()
            .map(|c| c as &dyn dense::Predictor);
        let online = &mut self.online;
        averaged_sum(comm, ctx, payload, |comm, data, opts| {
            online.allreduce(comm, data, cal, opts)
        })
    }
}

/// The dense exchange around an all-reduce `sum`: the payload as the group's dense
/// vector, the [`agree`] header (which compares the lengths, so `sum` runs unchecked), the
/// sum over ranks, divided by P.
fn averaged_sum(
    comm: &dyn Communicator,
    ctx: ExchangeCtx,
    payload: Payload,
    sum: impl FnOnce(&dyn Communicator, &mut [f32], &DenseOptions) -> collectives::Result<()>,
) -> Result<Vec<f32>> {
    let mut data = dense_payload(ctx, payload)?;
    agree(comm, ctx)?;
    sum(comm, &mut data, &DenseOptions::default().unchecked())?;
    average(comm, &mut data);
    Ok(data)
}

/// TopK-SGD family: exact top-k with error feedback per group, sparse all-gather. With one
/// group it is TopK-SGD, with layer-wise groups LAGS-SGD, with a threshold plan MGS-SGD,
/// with the optimal plan OMGS-SGD (Shi et al., INFOCOM 2020, Table I).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopkAllgather {
    /// Density ρ.
    pub density: f64,
}

impl Scheme for TopkAllgather {
    fn name(&self) -> String {
        format!("topk-allgather(ρ={})", self.density)
    }
    fn group(&self, _index: usize, numel: usize, _ranks: usize) -> Result<GroupPair> {
        selector_allgather(numel, self.density, Box::new(ExactTopK::new()))
    }
}

/// [`TopkAllgather`] with any selector of `sparsify`. Threshold selectors send about, not
/// exactly, `⌈ρ·n⌉` entries.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectorAllgather {
    /// The selector.
    pub selector: sparsify::SelectorKind,
    /// Density ρ.
    pub density: f64,
    /// Seed of the selector's random parts (the same on every rank keeps them in step).
    pub seed: u64,
}

impl Scheme for SelectorAllgather {
    fn name(&self) -> String {
        format!("{}-allgather(ρ={})", self.selector, self.density)
    }
    fn group(&self, index: usize, numel: usize, _ranks: usize) -> Result<GroupPair> {
        let selector = self.selector.build(self.seed ^ index as u64);
        selector_allgather(numel, self.density, selector)
    }
}

/// Dense ring all-reduce per group (P-SGD, MG-WFBP).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DenseAllreduce;

impl Scheme for DenseAllreduce {
    fn name(&self) -> String {
        "dense-ring".into()
    }
    fn group(&self, _index: usize, _numel: usize, _ranks: usize) -> Result<GroupPair> {
        Ok((Box::new(Identity), Box::new(DenseExchange::default())))
    }
}

/// A sparse all-reduce algorithm of `collectives::sparse` (SparDL, ExDyna, HiTopKComm,
/// TopkA, ...) as a group's exchange. It selects while it communicates, so its compressor
/// passes the dense gradient through and the whole step runs on the communication thread.
/// The algorithm is built (a collective call) on the first exchange, on that thread.
pub struct CollectiveSparse {
    algo: SparseAlgo,
    density: f64,
    alg: Option<Box<dyn collectives::sparse::SparseAllreduce>>,
    /// A restored state waiting for the algorithm's (collective) construction.
    pending: Option<collectives::sparse::AlgoState>,
    /// The last step's traffic, for a data-dependent algorithm.
    traffic: Option<Traffic>,
}

impl Exchange for CollectiveSparse {
    fn exchange(
        &mut self,
        comm: &dyn Communicator,
        ctx: ExchangeCtx,
        payload: Payload,
    ) -> Result<Vec<f32>> {
        let grad = dense_payload(ctx, payload)?;
        // One header round per step: a rank that fell behind is a typed error, not a
        // silently mixed-up update.
        agree(comm, ctx)?;
        let alg = match &mut self.alg {
            Some(a) => a,
            None => {
                let mut a = collectives::sparse::build(self.algo, comm, ctx.numel, self.density)?;
                if let Some(state) = self.pending.take() {
                    a.import_state(&state)?;
                }
                self.alg.insert(a)
            }
        };
        let (update, stats) = alg.step(comm, &grad)?;
        self.traffic = stats.padding.map(|padding| Traffic {
            density: stats.density,
            padding,
        });
        Ok(update.to_dense())
    }
    fn last_traffic(&self) -> Option<Traffic> {
        self.traffic
    }

    /// The algorithm's [`collectives::sparse::AlgoState`] (empty before its first step);
    /// an algorithm that exports none cannot be checkpointed.
    fn save_state(&self) -> Result<Vec<u8>> {
        match (&self.alg, &self.pending) {
            (Some(a), _) => a.export_state().map(|s| s.encode()).ok_or_else(|| {
                Error::InvalidArgument(format!("{} cannot be checkpointed", self.algo))
            }),
            (None, Some(s)) => Ok(s.encode()),
            (None, None) => Ok(Vec::new()),
        }
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<()> {
        if state.is_empty() {
            return Ok(());
        }
        let state = collectives::sparse::AlgoState::decode(state)?;
        match &mut self.alg {
            Some(a) => a.import_state(&state)?,
            None => self.pending = Some(state),
        }
        Ok(())
    }
}

/// A `collectives::sparse` algorithm with its options.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveScheme {
    /// The algorithm, e.g. SparDL, ExDyna, HiTopKComm.
    pub algo: SparseAlgo,
    /// Density ρ.
    pub density: f64,
}

impl Scheme for CollectiveScheme {
    fn name(&self) -> String {
        format!("{}(ρ={})", self.algo, self.density)
    }
    fn group(&self, _index: usize, _numel: usize, _ranks: usize) -> Result<GroupPair> {
        Ok((
            Box::new(Identity),
            Box::new(CollectiveSparse {
                algo: self.algo,
                density: self.density,
                alg: None,
                pending: None,
                traffic: None,
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
                let dense =
                    DenseExchange::default().exchange(&comm, ctx, Payload::Dense(grad.clone()))?;
                let sparse =
                    SparseAllgather::default().exchange(&comm, ctx, Payload::Dense(grad))?;
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

    /// The online choice's exchange averages like the fixed one, and every rank gets the
    /// same bits in every call, across its learning calls (both candidates run) and after.
    #[test]
    fn online_dense_exchange_averages_and_agrees_in_every_call() {
        for p in [2, 3] {
            let calls = 2 * dense::OnlineChoice::learning_calls(4 * 5000) + 5;
            let out = ThreadComm::run(p, |comm| -> Result<Vec<Vec<f32>>> {
                let mut online = OnlineDenseExchange::default();
                let r = comm.rank() as f32;
                (0..calls)
                    .map(|it| {
                        let ctx = ExchangeCtx {
                            iteration: it,
                            group: 0,
                            numel: 5000,
                        };
                        let grad: Vec<f32> = (0..5000)
                            .map(|i| (i % 13) as f32 * 0.1 + r + it as f32)
                            .collect();
                        online.exchange(&comm, ctx, Payload::Dense(grad))
                    })
                    .collect()
            })
            .unwrap();
            let mean_r = (p as f32 - 1.0) / 2.0;
            for (it, got) in out[0].iter().enumerate() {
                for (i, v) in got.iter().enumerate() {
                    let want = (i % 13) as f32 * 0.1 + mean_r + it as f32;
                    assert!(
                        (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "p {p} call {it}"
                    );
                }
                for rank in &out {
                    assert_eq!(
                        bytemuck::cast_slice::<f32, u32>(&rank[it]),
                        bytemuck::cast_slice::<f32, u32>(got),
                        "p {p} call {it}"
                    );
                }
            }
        }
    }

    /// Every rank's own result of `f` on `p` ranks (2 s receive timeout).
    fn run_all<T: Send>(
        p: usize,
        f: impl Fn(&dyn Communicator) -> Result<T> + Send + Sync,
    ) -> Vec<Result<T>> {
        ThreadComm::run_all(
            p,
            collectives::ThreadConfig::with_timeout(std::time::Duration::from_secs(2)),
            |comm| f(&comm),
        )
        .unwrap()
    }

    fn exchangers() -> Vec<Box<dyn Exchange>> {
        vec![
            Box::new(SparseAllgather::default()),
            Box::new(SparseAllgather {
                equal_counts: true,
                ..SparseAllgather::default()
            }),
            Box::new(DenseExchange::default()),
            Box::new(CollectiveSparse {
                algo: SparseAlgo::ALL[4],
                density: 0.5,
                alg: None,
                pending: None,
                traffic: None,
            }),
        ]
    }

    #[test]
    fn out_of_step_rank_is_reported() {
        for (p, strict) in [(2, true), (3, false)] {
            for e in 0..exchangers().len() {
                let res = run_all(p, |comm| {
                    let it = if comm.rank() == 1 { 4 } else { 5 };
                    let ctx = ExchangeCtx {
                        iteration: it,
                        group: 0,
                        numel: 3,
                    };
                    exchangers()[e].exchange(comm, ctx, Payload::Dense(vec![1.0; 3]))
                });
                assert!(res.iter().all(|r| r.is_err()), "{e}: {res:?}");
                // With P = 2 both ranks see both headers before either returns. With more,
                // a rank that returns its error ends ThreadComm's world, and a slower rank
                // still waiting on the header all-gather gets `PeerFailed` instead.
                let out_of_step =
                    |r: &Result<Vec<f32>>| matches!(r, Err(Error::RankOutOfStep { .. }));
                if strict {
                    assert!(res.iter().all(out_of_step), "{e}: {res:?}");
                } else {
                    assert!(res.iter().any(out_of_step), "{e}: {res:?}");
                }
            }
        }
    }

    #[test]
    fn group_length_mismatch_is_reported_on_every_rank() {
        for e in 0..exchangers().len() {
            let res = run_all(2, |comm| {
                let numel = 3 + comm.rank();
                let ctx = ExchangeCtx {
                    iteration: 0,
                    group: 2,
                    numel,
                };
                // One non-zero everywhere: the sparse blocks have equal lengths, so the
                // header (not the transport) finds the mismatch.
                let mut grad = vec![0.0; numel];
                grad[0] = 1.0;
                exchangers()[e].exchange(comm, ctx, Payload::Dense(grad))
            });
            for r in res {
                assert!(
                    matches!(
                        r,
                        Err(Error::Collectives(collectives::Error::Mismatch { .. }))
                    ),
                    "{e}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn any_selector_feeds_the_allgather() {
        let scheme = SelectorAllgather {
            selector: sparsify::SelectorKind::MsTopK,
            density: 0.25,
            seed: 7,
        };
        let out = ThreadComm::run(3, |comm| -> Result<Vec<f32>> {
            let (mut c, mut e) = scheme.group(0, 16, 3)?;
            let grad: Vec<f32> = (0..16)
                .map(|i| (i as f32 - 8.0) * (comm.rank() + 1) as f32)
                .collect();
            let ctx = ExchangeCtx {
                iteration: 0,
                group: 0,
                numel: 16,
            };
            let payload = c.compress(grad)?;
            e.exchange(&comm, ctx, payload)
        })
        .unwrap();
        assert!(out.iter().all(|o| o == &out[0]));
        assert!(out[0].iter().any(|&v| v != 0.0));
        assert!(TopkAllgather { density: 0.0 }.group(0, 4, 1).is_err());
    }
}
