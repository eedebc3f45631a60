//! The frame every algorithm's construction and step share, so that each algorithm file
//! holds only what is specific to it: the `new` constructor and the trait accessors
//! (macros), selection with error feedback, plain accumulation of a residual, the dense
//! all-reduce of accumulated values at agreed indices, decoding of all-gathered blocks,
//! and the final update with its stats.

use std::ops::Range;

use sparsify::{ErrorFeedback, Selector, SparseGrad, Value};

use super::common::{self, Config, Counting, Entries};
use super::{SelectorKind, StepStats};
use crate::dense::{allreduce, choose_allreduce, DenseOptions};
use crate::Counts;
use crate::{Communicator, Error, Result};

/// `pub fn new(comm, d, density, <the variant's options>)`: the collective construction
/// check of that [`super::SparseAlgo`] variant, then `Self::from_config(cfg)` (or
/// `Self::from_config(comm, cfg)` with `with_comm`, for algorithms that split the
/// communicator).
macro_rules! constructor {
    ($variant:ident { $($field:ident : $ty:ty),* }, $title:literal) => {
        $crate::sparse::scaffold::constructor!(
            @ $variant { $($field: $ty),* }, $title, |_comm, cfg| Ok(Self::from_config(cfg))
        );
    };
    ($variant:ident { $($field:ident : $ty:ty),* }, $title:literal, with_comm) => {
        $crate::sparse::scaffold::constructor!(
            @ $variant { $($field: $ty),* }, $title, |comm, cfg| Self::from_config(comm, cfg)
        );
    };
    (@ $variant:ident { $($field:ident : $ty:ty),* }, $title:literal,
     |$comm:ident, $cfg:ident| $make:expr) => {
        #[doc = concat!(
            "Builds ", $title, " with the options of [`super::SparseAlgo::", stringify!($variant),
            "`] (collective; see [`super::build`])."
        )]
        pub fn new(
            $comm: &dyn $crate::Communicator,
            d: usize,
            density: f64,
            $($field: $ty),*
        ) -> $crate::Result<Self> {
            let algo = $crate::sparse::SparseAlgo::$variant { $($field),* };
            let $cfg = $crate::sparse::common::setup($comm, &algo, d, density)?;
            $make
        }
    };
}
pub(crate) use constructor;

/// The [`super::SparseAllreduce`] accessors: `name`, `len` and `density` from `self.cfg`,
/// `residual` from the given closure-like expression (`|s| &s.resid`); `name` is a literal
/// or also such an expression.
macro_rules! accessors {
    ($name:literal, |$s:ident| $resid:expr) => {
        $crate::sparse::scaffold::accessors!(|_s| $name, |$s| $resid);
    };
    (|$n:ident| $name:expr, |$s:ident| $resid:expr) => {
        fn name(&self) -> &'static str {
            let $n = self;
            $name
        }
        fn len(&self) -> usize {
            self.cfg.d
        }
        fn density(&self) -> f64 {
            self.cfg.density
        }
        fn residual(&self) -> &[f32] {
            let $s = self;
            $resid
        }
    };
}
pub(crate) use accessors;

/// The [`super::SparseAllreduce::step`] of an algorithm that runs on one counting
/// adapter: the checks of [`Config::begin`], then its `run(&mut self, cc, grad)`.
macro_rules! counted_step {
    () => {
        fn step(
            &mut self,
            comm: &dyn $crate::Communicator,
            grad: &[f32],
        ) -> $crate::Result<(sparsify::SparseGrad<f32>, $crate::sparse::StepStats)> {
            let cc = self.cfg.begin(comm, grad)?;
            self.run(&cc, grad)
        }
    };
}
pub(crate) use counted_step;

impl Config {
    /// Start of a step: [`Config::check_step`], then a fresh traffic counter over `comm`.
    pub fn begin<'a>(&self, comm: &'a dyn Communicator, grad: &[f32]) -> Result<Counting<'a>> {
        self.check_step(comm, grad)?;
        Ok(common::counting(comm))
    }
}

/// A residual with its selector: selection with fused error feedback (`acc = residual +
/// grad`, select, keep the rest), for the algorithms that select from their whole input.
pub(crate) struct Feedback {
    pub fb: ErrorFeedback,
    pub sel: Box<dyn Selector>,
}

impl Feedback {
    /// Residual of length `len`, the selector `cfg` asks for (`default` when it names
    /// none).
    pub fn new(cfg: &Config, len: usize, default: SelectorKind) -> Self {
        Feedback {
            fb: ErrorFeedback::new(len),
            sel: common::make_selector(cfg.opts.selector, default),
        }
    }

    /// Selects `k` entries of `residual + grad` with error feedback, as entries offset by
    /// `base` (the global index of `grad[0]`).
    pub fn select(&mut self, grad: &[f32], k: usize, base: usize) -> Result<Entries> {
        let (sg, _) = self.fb.step(self.sel.as_mut(), grad, k)?;
        let entries = Entries::from_local(sg.indices(), sg.values(), base);
        self.sel.recycle(sg);
        Ok(entries)
    }

    /// As [`Feedback::select`] with the values rounded to `V` (the rounding error stays
    /// in the residual).
    pub fn select_as<V: Value>(&mut self, grad: &[f32], k: usize, base: usize) -> Result<Entries> {
        let (sg, _) = self.fb.step_as::<V>(self.sel.as_mut(), grad, k)?;
        Ok(Entries {
            idx: sg.indices().iter().map(|&i| i + base as u32).collect(),
            val: sg.values().iter().map(|v| v.to_f32()).collect(),
        })
    }

    pub fn residual(&self) -> &[f32] {
        self.fb.residual()
    }
}

/// `Err` unless an exact-count selector gave `got == k` entries (`who` names the
/// algorithm, whose message sizes rely on the count).
pub(crate) fn exact_count(who: &str, got: usize, k: usize) -> Result<()> {
    if got != k {
        return Err(Error::InvalidArgument(format!(
            "{who} needs an exact-count selector: got {got} entries for k = {k}"
        )));
    }
    Ok(())
}

/// `resid += grad` (the accumulated gradient of the algorithms that keep a plain residual).
pub(crate) fn accumulate(resid: &mut [f32], grad: &[f32]) {
    for (r, &g) in resid.iter_mut().zip(grad) {
        *r += g;
    }
}

/// The first NaN or infinite entry as `sparsify::Error::NonFinite`, as a selector reports it.
pub(crate) fn check_finite(x: &[f32]) -> Result<()> {
    if let Some((i, v)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(sparsify::Error::NonFinite {
            index: i,
            value: *v,
        }
        .into());
    }
    Ok(())
}

/// Takes the accumulated values at `idx` out of `resid` (zeroing them there, so no mass is
/// lost) and sums them over all ranks with the best dense all-reduce for their size.
pub(crate) fn allreduce_at(cc: &Counting, resid: &mut [f32], idx: &[u32]) -> Result<Vec<f32>> {
    let mut vals: Vec<f32> = idx.iter().map(|&i| resid[i as usize]).collect();
    for &i in idx {
        resid[i as usize] = 0.0;
    }
    let dense = DenseOptions::default().unchecked();
    let algo = choose_allreduce(cc.size(), 4 * vals.len(), None);
    allreduce(cc, &mut vals, algo, &dense)?;
    Ok(vals)
}

/// Decodes all-gathered blocks by group position with `decode(position, bytes)`, which
/// also says whether the block travelled sparse; the entries of other members' sparse
/// blocks are added to the received-entry count.
pub(crate) fn decode_blocks(
    cc: &Counting,
    blocks: &[Vec<u8>],
    me: usize,
    mut decode: impl FnMut(usize, &[u8]) -> Result<(Entries, bool)>,
) -> Result<Vec<Entries>> {
    let mut out = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        let (e, sparse) = decode(j, b)?;
        if j != me && sparse {
            cc.add_items(e.len());
        }
        out.push(e);
    }
    Ok(out)
}

/// [`decode_blocks`] of plain entry blocks, block `j` holding indices in `range(j)`.
pub(crate) fn decode_ranges(
    cc: &Counting,
    blocks: &[Vec<u8>],
    me: usize,
    range: impl Fn(usize) -> Range<usize>,
) -> Result<Vec<Entries>> {
    decode_blocks(cc, blocks, me, |j, b| {
        Ok((Entries::decode_all(b, range(j))?, true))
    })
}

/// Blocks over consecutive index ranges, joined in order.
pub(crate) fn concat(parts: &[Entries]) -> Entries {
    let mut all = Entries::default();
    for e in parts {
        all.idx.extend_from_slice(&e.idx);
        all.val.extend_from_slice(&e.val);
    }
    all
}

/// The step's result: the update (`sum` divided by P, see [`common::finish_update`]) and
/// the stats with the traffic `counts` and this rank's `selected` count.
pub(crate) fn finish(
    cfg: &Config,
    sum: &Entries,
    counts: Counts,
    selected: usize,
) -> Result<(SparseGrad<f32>, StepStats)> {
    let update = common::finish_update(sum, cfg.d, cfg.p)?;
    let stats = StepStats {
        selected,
        nnz: update.nnz(),
        density: update.density(),
        messages: counts.messages,
        rounds: counts.rounds,
        bytes_sent: counts.bytes_sent,
        bytes_recv: counts.bytes_recv,
        entries_recv: counts.items_recv,
        ..StepStats::default()
    };
    Ok((update, stats))
}
