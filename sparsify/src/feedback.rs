//! [`ErrorFeedback`]: residual memory. Each step computes `acc = residual + grad`, selects
//! from `acc`, and keeps `acc` with the selected entries zeroed as the next residual, so no
//! gradient mass is ever dropped. With a reduced-precision output type the rounding error
//! of every sent value goes back into the residual too.

use crate::{Error, Result, SelectInfo, Selection, Selector, SparseGrad, Value};

/// Residual memory for one gradient vector of fixed length, kept 64-byte aligned so that
/// no 64-byte vector access straddles two cache lines.
#[derive(Clone)]
pub struct ErrorFeedback {
    /// The residual in its first `len` values; the rest of the last line stays zero.
    lines: Vec<Line>,
    len: usize,
}

/// Sixteen `f32`, 64-byte aligned: the residual's unit of storage, so that the passes'
/// 64-byte vector loads and stores never straddle two cache lines. A `Vec<f32>` of
/// 2^18 values or more is mapped by the allocator 16 bytes past a page boundary, and one
/// under that lands wherever the heap has room, so that the same step ran at a different
/// speed from one allocation to the next (the floor at 2^14: 0.64–0.80 µs by case). With
/// the residual aligned (the gradient not) on the 2-core Zen 5 (timing program, three
/// alternations of 2001 rounds) a step at 2^14, ρ = 0.01 took 1.68–1.72 µs instead of
/// 1.85–1.87 µs for exact top-k and 1.22–1.26 µs instead of 1.34–1.35 µs for the hard
/// threshold; at 2^16 and 2^20 the steps were level, while `accumulate` on the aligned
/// residual ran faster (the selectors' ratio to it rose: exact at 2^16, ρ = 0.001,
/// 1.76–1.78× → 2.08–2.12×).
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([f32; 16]);

// SAFETY: `Line` is `repr(C)` around sixteen `f32` (64 bytes, its alignment): no padding,
// and every bit pattern, zero included, is a valid value.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl bytemuck::Pod for Line {}

impl std::fmt::Debug for ErrorFeedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorFeedback")
            .field("residual", &self.residual())
            .finish()
    }
}

impl PartialEq for ErrorFeedback {
    fn eq(&self, other: &Self) -> bool {
        self.residual() == other.residual()
    }
}

impl ErrorFeedback {
    /// A zero residual of length `len`.
    pub fn new(len: usize) -> Self {
        ErrorFeedback {
            lines: vec![Line::default(); len.div_ceil(16)],
            len,
        }
    }

    /// Starts from a given residual (e.g. restored from a checkpoint), copied into aligned
    /// storage.
    pub fn from_residual(residual: Vec<f32>) -> Self {
        let mut ef = Self::new(residual.len());
        ef.residual_mut().copy_from_slice(&residual);
        ef
    }

    /// Continues from a saved residual (a checkpoint): it must have this memory's length
    /// and be finite ([`check_residual`]); on error the residual is unchanged.
    pub fn restore(&mut self, residual: &[f32]) -> Result<()> {
        check_residual(residual, self.len)?;
        self.residual_mut().copy_from_slice(residual);
        Ok(())
    }

    /// The current residual.
    pub fn residual(&self) -> &[f32] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    /// Mutable access to the residual (e.g. to add back values that a collective dropped).
    pub fn residual_mut(&mut self) -> &mut [f32] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }

    /// Dense length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length residual.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Zeroes the residual (e.g. after a [`Error::NonFinite`] left it poisoned).
    pub fn reset(&mut self) {
        self.residual_mut().fill(0.0);
    }

    /// Takes the residual out (a copy: the memory keeps it aligned).
    pub fn into_residual(self) -> Vec<f32> {
        self.residual().to_vec()
    }

    /// One step in `f32`: `acc = residual + grad`, select about or exactly `k` entries of
    /// `acc` with `selector` (fused into one pass where the selector supports it), and keep
    /// the rest as the residual. Selected values plus the new residual equal
    /// `residual + grad` exactly, element by element.
    ///
    /// A gradient of the wrong length is [`Error::LengthMismatch`] and leaves the residual
    /// untouched. A NaN or infinity is [`Error::NonFinite`] naming its index; the residual
    /// then holds the accumulated (poisoned) values: call [`reset`](Self::reset).
    pub fn step(&mut self, selector: &mut dyn Selector, grad: &[f32], k: usize) -> Selection {
        if grad.len() != self.len {
            return Err(Error::LengthMismatch {
                what: "gradient",
                got: grad.len(),
                expected: self.len,
            });
        }
        selector.select_fused(self.residual_mut(), grad, k)
    }

    /// Like [`step`](Self::step) but the values go out as `V` (f32, f16, bf16): each is
    /// rounded to nearest (saturating at `V`'s largest finite value instead of overflowing
    /// to infinity) and the rounding error `acc - V(acc)` is put back into the residual.
    pub fn step_as<V: Value>(
        &mut self,
        selector: &mut dyn Selector,
        grad: &[f32],
        k: usize,
    ) -> Result<(SparseGrad<V>, SelectInfo)> {
        let (sg, info) = self.step(selector, grad, k)?;
        let (idx, val, len) = sg.into_parts();
        let mut out = Vec::with_capacity(val.len());
        let residual = self.residual_mut();
        for (&i, &v) in idx.iter().zip(&val) {
            let q = round_saturating::<V>(v);
            if let Some(r) = residual.get_mut(i as usize) {
                *r += v - q.to_f32();
            }
            out.push(q);
        }
        Ok((SparseGrad::from_parts_unchecked(idx, out, len), info))
    }
}

/// Checks a residual read back from outside (a checkpoint) before it becomes gradient
/// memory: `len` entries, all finite. A NaN or infinity would poison every later step of
/// the rank, so it is [`Error::NonFinite`] here rather than there.
pub fn check_residual(residual: &[f32], len: usize) -> Result<()> {
    crate::check_same_len(residual.len(), len)?;
    match residual.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(Error::NonFinite {
            index,
            value: residual[index],
        }),
        None => Ok(()),
    }
}

/// `residual += grad`, the accumulation half of an error-feedback step without selection,
/// split over the rayon pool exactly like the selectors' fused passes (serial for short
/// vectors). It is the memory floor of a fused step: every selector reads both vectors and
/// writes the residual at least once. Non-finite values are not checked.
pub fn accumulate(residual: &mut [f32], grad: &[f32]) -> Result<()> {
    crate::check_same_len(residual.len(), grad.len())?;
    let n = grad.len();
    let add = |r: &mut [f32], g: &[f32]| crate::kernel::add_far_one(r, g, n);
    let np = crate::kernel::pieces(n);
    if np == 1 {
        add(residual, grad);
    } else {
        // The pieces run as the fused passes' do (`kernel::run_pieces`), so that the floor
        // pays the same hand-off as the passes measured against it.
        let len = n.div_ceil(np);
        let mut work: smallvec::SmallVec<[_; 16]> =
            residual.chunks_mut(len).zip(grad.chunks(len)).collect();
        crate::kernel::run_pieces(&mut work, |_, (r, g)| add(r, g));
    }
    Ok(())
}

/// Rounds to `V`, clamping to its largest finite magnitude instead of overflowing.
pub fn round_saturating<V: Value>(x: f32) -> V {
    let q = V::from_f32(x);
    if q.to_f32().is_finite() || !x.is_finite() {
        return q;
    }
    // Overflowed: step back one unit in the last place of V, towards zero.
    let inf = V::from_f32(x);
    let bits: &[u8] = bytemuck::bytes_of(&inf);
    match bits.len() {
        2 => {
            let b = u16::from_le_bytes([bits[0], bits[1]]) - 1;
            *bytemuck::from_bytes::<V>(&b.to_le_bytes())
        }
        _ => V::from_f32(f32::MAX.copysign(x)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn the_residual_is_aligned_and_round_trips() {
        for len in [0, 1, 15, 16, 17, 1000, 1 << 18] {
            let r: Vec<f32> = (0..len).map(|i| i as f32 - 7.5).collect();
            let ef = ErrorFeedback::from_residual(r.clone());
            let copy = ef.clone();
            for e in [&ef, &copy] {
                assert_eq!(e.residual().as_ptr() as usize % 64, 0, "len {len}");
                assert_eq!(e.len(), len);
                assert_eq!(e.residual(), &r[..]);
            }
            assert_eq!(ef, copy);
            assert_eq!(ef.into_residual(), r);
        }
        let mut ef = ErrorFeedback::new(3);
        ef.residual_mut().copy_from_slice(&[1.0, 2.0, 3.0]);
        assert_ne!(ef, ErrorFeedback::new(3));
        assert_eq!(
            format!("{ef:?}"),
            "ErrorFeedback { residual: [1.0, 2.0, 3.0] }"
        );
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let h: f16 = round_saturating(1.0e6);
        assert_eq!(h.to_f32(), 65504.0);
        let h: f16 = round_saturating(-1.0e6);
        assert_eq!(h.to_f32(), -65504.0);
        let b: bf16 = round_saturating(f32::MAX);
        assert!(b.to_f32().is_finite());
        let f: f32 = round_saturating(1.5);
        assert_eq!(f, 1.5);
    }
}

#[cfg(test)]
mod conservation {
    use super::*;
    use crate::exact::tests::vec_strategy;
    use crate::{ExactTopK, MsTopK};
    use half::{bf16, f16};
    use proptest::prelude::*;

    /// Steps twice in `V` and checks `sent + new residual == residual + grad` per element:
    /// exactly when `|acc|` is in V's range (the rounding error is exact in f32), within
    /// one f32 rounding otherwise.
    fn check<V: Value>(g: &[f32], k: usize, sel: &mut dyn Selector) -> Result<(), TestCaseError> {
        let mut ef = ErrorFeedback::new(g.len());
        for _ in 0..2 {
            let acc: Vec<f32> = ef.residual().iter().zip(g).map(|(a, b)| a + b).collect();
            let (sg, _) = ef.step_as::<V>(sel, g, k)?;
            let mut back = ef.residual().to_vec();
            sg.scatter_add_into(&mut back)?;
            for (a, b) in back.iter().zip(&acc) {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn mass_is_conserved_in_every_type((g, k) in vec_strategy()) {
            check::<f32>(&g, k, &mut ExactTopK::new())?;
            check::<f16>(&g, k, &mut ExactTopK::new())?;
            check::<bf16>(&g, k, &mut ExactTopK::new())?;
            check::<f16>(&g, k, &mut MsTopK::default())?;
        }
    }

    #[test]
    fn saturated_values_keep_their_error() {
        let g = [1.0e6f32, -3.0, 7.0e5];
        let mut ef = ErrorFeedback::new(3);
        let (sg, _) = ef.step_as::<f16>(&mut ExactTopK::new(), &g, 2).unwrap();
        assert_eq!(sg.indices(), &[0, 2]);
        assert_eq!(sg.values()[0].to_f32(), 65504.0);
        assert_eq!(ef.residual()[0], 1.0e6 - 65504.0);
        assert_eq!(ef.residual()[1], -3.0);
    }
}
