//! The [`Selector`] contract: pick about or exactly `k` entries of largest magnitude.

use crate::{Result, SparseGrad};

/// What a selection produced besides the entries themselves.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SelectInfo {
    /// The magnitude threshold the selector settled on (0 when it has none).
    pub threshold: f32,
    /// Entries selected (equals `k` for exact-count selectors).
    pub selected: usize,
}

/// What a selection returns: the selected entries and what the selection saw.
pub type Selection = Result<(SparseGrad<f32>, SelectInfo)>;

/// A top-k selector. Exact-count selectors return exactly `min(k, d)` entries; threshold
/// selectors return the entries above their threshold and report the count.
///
/// `select` reads a dense slice and returns the chosen entries with their values. Fused
/// error feedback is [`crate::ErrorFeedback`]'s job, which drives [`Selector::select_fused`].
pub trait Selector: Send {
    /// Short lower-case name used in reports (`"exact"`, `"mstopk"`, ...).
    fn name(&self) -> &'static str;

    /// True when the selector returns exactly `min(k, d)` entries.
    fn exact_count(&self) -> bool;

    /// Selects from `x`. A NaN or infinite entry is an error naming its index.
    fn select(&mut self, x: &[f32], k: usize) -> Selection;

    /// Fused error feedback: `acc = residual + grad` (written into `residual`), select from
    /// `acc`, zero the selected entries of `residual`. The default does it in two steps;
    /// selectors override it with a one-pass kernel.
    fn select_fused(&mut self, residual: &mut [f32], grad: &[f32], k: usize) -> Selection {
        crate::check_same_len(residual.len(), grad.len())?;
        for (r, g) in residual.iter_mut().zip(grad) {
            *r += *g;
        }
        let (sg, info) = self.select(residual, k)?;
        for &i in sg.indices() {
            residual[i as usize] = 0.0;
        }
        Ok((sg, info))
    }

    /// Hands back a result this selector returned, once the caller is done with it, so
    /// that the next selection writes into its buffers instead of allocating new ones.
    /// Optional: a result that is simply dropped costs only the allocation. For large
    /// results that cost is real: the allocator maps fresh pages that the kernel faults
    /// in one by one (exact top-k at d = 2^24, ρ = 0.01 on two cores, fastest of 100
    /// calls: 5.58 ms dropping each result, 4.52 ms recycling it, and 295 page faults a
    /// call fewer). The default drops it.
    fn recycle(&mut self, used: SparseGrad<f32>) {
        drop(used);
    }

    /// For selectors whose fused step starts from the previous call's k-th magnitude
    /// ([`crate::ExactTopK`], [`crate::MsTopK`]): the calls that started warm so far, and
    /// how many of those missed (found fewer than `k` candidates, or too many, and fell
    /// back). `None` for the others.
    fn warm_starts(&self) -> Option<(u64, u64)> {
        None
    }
}
