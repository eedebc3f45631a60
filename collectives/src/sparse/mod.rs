//! Sparse allreduce of top-k gradients: one trait, [`SparseAllreduce`], for TopkA, TopkDSA, gTopk,
//! CLT-k (baselines of SparDL (Zhao et al.) §4 and ExDyna (Yoon & Oh, CCGrid 2024) §III), SparDL
//! with its Spar-Reduce-Scatter, global residual collection, R-SAG and B-SAG (SparDL (Zhao et al.)
//! §3), Ok-Topk (Li & Hoefler, PPoPP'22; SparDL's main baseline), HiTopKComm (Shi et al., MLSys 2021, §3.2, Algorithm 2) and ExDyna
//! (Yoon & Oh, CCGrid 2024, §IV, Algorithms 1-5).
//!
//! Every algorithm is built from a [`SparseAlgo`] (the variant carries that algorithm's
//! options) for a dense length `d` and a density in (0, 1], on a communicator: construction
//! is collective and exchanges the configuration, so a rank that disagrees (another `d`, density, algorithm or option) or
//! an option that does not fit `P` is a typed error on **every** rank instead of a hang.
//! Each [`SparseAllreduce::step`] takes this rank's new dense gradient, adds its residual
//! (error feedback), selects, communicates, updates the residuals and returns the
//! aggregated update, **the sum over ranks divided by P (an average)**, bit-identical on
//! every rank, with [`StepStats`]. Messages, rounds and bytes are counted by the algorithm
//! as it sends, so they are available on any transport.
//!
//! Mass conservation: across all ranks, `Σ (grad + residual before) = P · update + Σ
//! residual after` (up to `f32` rounding) for every algorithm except gTopk, which drops
//! mass by design and reports it in [`StepStats::mass_dropped`].
//!
//! Tags: `0x6100..=0x613F` (the dense collectives use `0x6000..=0x603F`).
//!
//! ```
//! use collectives::sparse::{build, Sag, SparseAlgo};
//! use collectives::{Communicator, ThreadComm};
//! let updates = ThreadComm::run(3, |comm| -> collectives::Result<Vec<f32>> {
//!     let spardl = SparseAlgo::SparDl { sag: Sag::None, teams: None, selector: None };
//!     let mut alg = build(spardl, &comm, 12, 0.5)?;
//!     let grad: Vec<f32> = (0..12).map(|i| (i * (comm.rank() + 1)) as f32).collect();
//!     let (update, _stats) = alg.step(&comm, &grad)?;
//!     Ok(update.to_dense())
//! })
//! .unwrap();
//! assert_eq!(updates[0], updates[1]);
//! assert_eq!(updates[1], updates[2]);
//! ```

mod algo;
mod cltk;
mod common;
mod exdyna;
mod gtopk;
mod hitopk;
mod oktopk;
mod scaffold;
mod spardl;
mod state;
mod topka;
mod topkdsa;

pub use algo::SparseAlgo;
pub use cltk::CltK;
pub use exdyna::{steady_state, ExDyna, ExDynaStats};
pub use gtopk::GTopk;
pub use hitopk::HiTopK;
pub use oktopk::OkTopk;
pub use spardl::{Sag, SparDl};
/// The selector choice, shared with `sparsify`.
pub use sparsify::SelectorKind;
pub use state::AlgoState;
pub use topka::TopkA;
pub use topkdsa::TopkDsa;

use sparsify::SparseGrad;

use crate::{Communicator, Error, Result};

/// What one step did, as seen by this rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepStats {
    /// Entries this rank selected locally (from its own dense data) in this step.
    pub selected: usize,
    /// Non-zero entries of the returned update.
    pub nnz: usize,
    /// `nnz / d`: the actual density of the update.
    pub density: f64,
    /// Messages this rank sent.
    pub messages: u64,
    /// Communication rounds of this rank: one per send, receive or send-receive pair (the
    /// same count as `SimComm`'s).
    pub rounds: u64,
    /// Payload bytes this rank sent.
    pub bytes_sent: u64,
    /// Payload bytes this rank received.
    pub bytes_recv: u64,
    /// Sparse entries (index + value) this rank received, the unit of SparDL (Zhao et al.)
    /// Table 1's bandwidth terms (`k` counts entries).
    pub entries_recv: u64,
    /// Padding overhead `f(t) = P · max_i k_i / Σ_i k_i` of ExDyna (Yoon & Oh, CCGrid 2024) Eq. 5
    /// where the all-gather pads to the largest count (ExDyna); `None` where nothing is padded.
    pub padding: Option<f64>,
    /// Gradient mass (sum of values) this rank's merges discarded for good: non-zero only
    /// for gTopk, whose tree merges drop contributions by design (SparDL (Zhao et al.) §5).
    pub mass_dropped: f64,
}

/// A sparse allreduce: owns its residuals, thresholds and partitions across steps.
pub trait SparseAllreduce: Send {
    /// Short lower-case name ([`SparseAlgo::name`]).
    fn name(&self) -> &'static str;

    /// Dense length `d` it was built for.
    fn len(&self) -> usize;

    /// True when built for `d = 0` (never: construction rejects it; here for clippy).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Target density it was built for.
    fn density(&self) -> f64;

    /// One step: error feedback, selection, communication, residual update. Returns the
    /// aggregated update (sum over ranks / P), bit-identical on every rank, and this rank's
    /// stats. `comm` must be the communicator (or an equivalent wrapper of it) the
    /// algorithm was built on; `grad.len()` must be `d`.
    ///
    /// A wrong communicator or gradient length is checked locally, before any message:
    /// that rank returns `Error::InvalidArgument` at once, and its peers, left waiting
    /// for its messages, get `Error::PeerFailed` or `Error::Timeout` from the transport
    /// (never a hang, but not the same typed error everywhere). Agreeing on the length
    /// would cost an extra all-reduce (`⌈log2 P⌉` rounds) on every step, while `d` is
    /// already agreed at construction, so a wrong length is a local caller bug.
    fn step(
        &mut self,
        comm: &dyn Communicator,
        grad: &[f32],
    ) -> Result<(SparseGrad<f32>, StepStats)>;

    /// This rank's residual (length `d`): everything it holds back for later steps.
    fn residual(&self) -> &[f32];

    /// Everything this rank carries to its next step, for a checkpoint; `None` where the
    /// algorithm does not export its state (ExDyna and SparDL do), so that a checkpoint of
    /// it is refused rather than resumed without it.
    fn export_state(&self) -> Option<AlgoState> {
        None
    }

    /// Continues from [`Self::export_state`]'s output of the same algorithm, `d` and P: the
    /// next step is then bit-identical to the exporting instance's. A state of another
    /// algorithm or length, or one that is not internally consistent, is
    /// [`Error::InvalidArgument`] and changes nothing.
    fn import_state(&mut self, state: &AlgoState) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "{} has no checkpoint state to restore a {} state into",
            self.name(),
            state.algo
        )))
    }
}

/// Builds `algo`. Collective: every rank must call it; disagreement on any argument is an
/// error on every rank.
pub fn build(
    algo: SparseAlgo,
    comm: &dyn Communicator,
    d: usize,
    density: f64,
) -> Result<Box<dyn SparseAllreduce>> {
    let cfg = common::setup(comm, &algo, d, density)?;
    Ok(match algo {
        SparseAlgo::HiTopK { .. } => Box::new(HiTopK::from_config(comm, cfg)?),
        SparseAlgo::CltK { .. } => Box::new(CltK::from_config(cfg)),
        SparseAlgo::ExDyna { .. } => Box::new(ExDyna::from_config(cfg)),
        SparseAlgo::TopkA { .. } => Box::new(TopkA::from_config(cfg)),
        SparseAlgo::TopkDsa { .. } => Box::new(TopkDsa::from_config(cfg)),
        SparseAlgo::GTopk { .. } => Box::new(GTopk::from_config(cfg)),
        SparseAlgo::OkTopk { .. } => Box::new(OkTopk::from_config(cfg)),
        SparseAlgo::SparDl { sag, .. } => {
            Box::new(SparDl::from_config(cfg, sag).map_err(|e| common::fail_together(comm, e))?)
        }
    })
}
