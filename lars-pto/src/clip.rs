//! Global gradient-norm clipping (as `torch.nn.utils.clip_grad_norm_`) with the per-layer
//! sums of squares computed by the parallel tensor operator: each rank sums the squares of
//! its layers, the per-layer sums are all-gathered, and every rank adds them in layer order,
//! so the global norm is the same bits everywhere.

use collectives::Communicator;

use crate::error::{positive, Param, Quantity, Tensor};
use crate::fingerprint::Fingerprint;
use crate::kernels::sum_sq;
use crate::lars::finite;
use crate::layers::check_list;
use crate::pto::Pto;
use crate::Result;

/// What clipping did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipInfo {
    /// `‖g‖` over all layers, before clipping.
    pub total_norm: f64,
    /// The factor the gradients were multiplied by (1 when not clipped).
    pub coefficient: f64,
}

/// Scales all gradients by `max_norm / (‖g‖ + 1e-6)` when that is below 1 (the 1e-6 is
/// PyTorch's). Collective in [`crate::Mode::Parallel`]; a non-finite norm is an error on
/// every rank and leaves the gradients unchanged.
pub fn clip_grad_norm<C, G>(comm: &C, pto: &Pto, grads: &mut [G], max_norm: f64) -> Result<ClipInfo>
where
    C: Communicator + ?Sized,
    G: AsRef<[f32]> + AsMut<[f32]>,
{
    let info = grad_norm_info(comm, pto, grads, max_norm)?;
    if info.coefficient < 1.0 {
        let c = info.coefficient as f32;
        for g in grads.iter_mut() {
            for x in g.as_mut() {
                *x *= c;
            }
        }
    }
    Ok(info)
}

/// The global norm and clip coefficient without touching the gradients.
pub fn grad_norm_info<C, G>(comm: &C, pto: &Pto, grads: &[G], max_norm: f64) -> Result<ClipInfo>
where
    C: Communicator + ?Sized,
    G: AsRef<[f32]>,
{
    let check = positive(Param::MaxNorm, max_norm)
        .and_then(|()| check_list(pto.numels(), Tensor::Grad, grads));
    let salt = Fingerprint::new().str("clip").f64(max_norm).finish();
    let sums: Vec<f64> = pto.map(comm, salt, check, |l| {
        let s = sum_sq(grads[l].as_ref());
        finite(l, Quantity::GradNorm, s.sqrt())?;
        Ok(s)
    })?;
    let total_norm = sums.iter().sum::<f64>().sqrt();
    finite(usize::MAX, Quantity::GlobalNorm, total_norm)?;
    Ok(ClipInfo {
        total_norm,
        coefficient: (max_norm / (total_norm + 1e-6)).min(1.0),
    })
}
