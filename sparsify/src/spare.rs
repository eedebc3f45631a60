//! [`Spare`]: the index and value buffers of results handed back with
//! [`crate::Selector::recycle`], which the next selection writes into instead of allocating
//! new ones.
//!
//! A result of `k` entries takes `8·k` bytes. At ρ = 0.01 and d = 2^24 that is 1.3 MiB,
//! which the allocator maps afresh on every call and the kernel then faults in page by page
//! (295 faults a call): about 1 ms of a 5.6 ms step on the 2-core bench machine, more than
//! the whole selection after the pass. A recycled pair of buffers is already mapped.

use crate::SparseGrad;

/// Buffers kept for the next result (empty until a result is recycled).
#[derive(Debug, Default, Clone)]
pub(crate) struct Spare {
    idx: Vec<u32>,
    val: Vec<f32>,
}

impl Spare {
    /// Keeps the buffers of a finished result (the larger of the old and the new).
    pub(crate) fn keep(&mut self, used: SparseGrad<f32>) {
        let (idx, val, _) = used.into_parts();
        if idx.capacity() > self.idx.capacity() {
            self.idx = idx;
        }
        if val.capacity() > self.val.capacity() {
            self.val = val;
        }
    }

    /// Two empty lists with room for `cap` entries: the kept buffers where they are large
    /// enough, fresh ones otherwise (a kept buffer too small is dropped rather than grown,
    /// since growing would copy it).
    pub(crate) fn lists(&mut self, cap: usize) -> (Vec<u32>, Vec<f32>) {
        (fit(&mut self.idx, cap), fit(&mut self.val, cap))
    }
}

/// The kept buffer, emptied, when it holds `cap` entries; else a new one with an eighth
/// more room, so that a threshold selector whose count creeps up from step to step can
/// still reuse it.
fn fit<T>(kept: &mut Vec<T>, cap: usize) -> Vec<T> {
    if kept.capacity() >= cap && kept.capacity() > 0 {
        let mut v = std::mem::take(kept);
        v.clear();
        v
    } else {
        Vec::with_capacity(cap + cap / 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_buffers_come_back_when_large_enough() {
        let mut s = Spare::default();
        let (i, v) = s.lists(100);
        assert!(i.capacity() >= 100 && v.capacity() >= 100);
        let sg = SparseGrad::from_parts_unchecked(i, v, 1000);
        let (pi, pv) = (sg.indices().as_ptr(), sg.values().as_ptr());
        s.keep(sg);
        let (i, v) = s.lists(50);
        assert_eq!(
            (i.as_ptr(), v.as_ptr()),
            (pi, pv),
            "the kept buffers are reused"
        );
        assert!(i.is_empty() && v.is_empty());
        s.keep(SparseGrad::from_parts_unchecked(i, v, 1000));
        let (i, _) = s.lists(1000);
        assert_ne!(i.as_ptr(), pi, "too small a buffer is not reused");
        assert!(i.capacity() >= 1000);
    }
}
