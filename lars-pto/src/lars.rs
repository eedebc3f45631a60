//! LARS, layer-wise adaptive rate scaling (You, Gitman & Ginsburg 2017, Algorithm 1;
//! MSTopK/HiTopKComm (Shi et al., MLSys 2021), Eq. 11), with the per-layer coefficients computed by
//! the parallel tensor operator.
//!
//! For a layer with weights `w` and aggregated gradient `g` (MSTopK/HiTopKComm
//! (Shi et al., MLSys 2021) Eq. 11, You et al. Eq. 6 with the trust coefficient η and weight decay
//! β folded into the denominator):
//!
//! ```text
//! trust = η·‖w‖ / (‖g‖ + β·‖w‖ + ε)        if ‖w‖ > 0 and ‖g‖ > 0, else 1
//! scale = min(1, trust / lr)                with the clip of apex LARC, else trust
//! v     = μ·v + lr·scale·(g + β·w)          (You et al. Algorithm 1; MLPerf reference)
//! w     = w − v
//! ```
//!
//! Layers on the skip list (biases and normalisation layers, as the MLPerf ResNet-50
//! reference does) get neither scaling nor decay: `scale = 1`, `β = 0`.

use collectives::Communicator;

use crate::error::{non_negative, unit_interval, Param, Quantity, Tensor};
use crate::fingerprint::Fingerprint;
use crate::kernels::sum_sq2;
use crate::layers::{check_list, check_pair, optimizer_operator, LayerSpec, SkipList};
use crate::pto::{Exchange, Mode, Pto};
use crate::{Error, Result};

/// LARS hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct LarsConfig {
    /// Trust coefficient η (You et al. 2017 §3; 0.001 in the paper and the MLPerf reference).
    pub trust_coefficient: f64,
    /// Weight decay β, folded into the trust ratio and the update.
    pub weight_decay: f64,
    /// ε in the trust-ratio denominator (0 in the MLPerf reference, 1e-8 in apex LARC).
    pub epsilon: f64,
    /// SGD momentum μ.
    pub momentum: f64,
    /// apex LARC's clip mode: the layer's rate is `min(lr, trust · lr_local)`, i.e. the
    /// scale is `min(1, trust / lr)`.
    pub clip: bool,
    /// Layers exempt from scaling and weight decay.
    pub skip: SkipList,
}

impl Default for LarsConfig {
    /// η = 0.001 (You et al.), β = 1e-4 and μ = 0.9 (the authors' training defaults),
    /// ε = 0 (MLPerf), no clip, the default skip list.
    fn default() -> Self {
        LarsConfig {
            trust_coefficient: 0.001,
            weight_decay: 1e-4,
            epsilon: 0.0,
            momentum: 0.9,
            clip: false,
            skip: SkipList::default(),
        }
    }
}

impl LarsConfig {
    /// Checks every hyper-parameter's domain.
    pub fn validate(&self) -> Result<()> {
        non_negative(Param::TrustCoefficient, self.trust_coefficient)?;
        non_negative(Param::WeightDecay, self.weight_decay)?;
        non_negative(Param::Epsilon, self.epsilon)?;
        unit_interval(Param::Momentum, self.momentum)
    }

    fn fingerprint(&self) -> Fingerprint {
        self.skip.fingerprint(
            Fingerprint::new()
                .str("lars")
                .f64(self.trust_coefficient)
                .f64(self.weight_decay)
                .f64(self.epsilon)
                .f64(self.momentum)
                .u64(u64::from(self.clip)),
        )
    }
}

/// One layer's LARS coefficients, the operator's per-layer output (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LarsCoeff {
    /// ‖w‖.
    pub weight_norm: f64,
    /// ‖g‖.
    pub grad_norm: f64,
    /// `η‖w‖/(‖g‖ + β‖w‖ + ε)`, or 1 for a zero norm or a skipped layer.
    pub trust_ratio: f64,
    /// What multiplies the global learning rate: the trust ratio, clipped in LARC mode.
    pub scale: f64,
}

/// One layer's coefficients (the per-layer function of the operator). `excluded` layers
/// get ratio 1; a non-finite norm or ratio is an error naming the layer.
pub fn lars_coeff(
    cfg: &LarsConfig,
    layer: usize,
    excluded: bool,
    w: &[f32],
    g: &[f32],
    lr: f64,
) -> Result<LarsCoeff> {
    let (ww, gg) = sum_sq2(w, g);
    let (wn, gn) = (ww.sqrt(), gg.sqrt());
    finite(layer, Quantity::WeightNorm, wn)?;
    finite(layer, Quantity::GradNorm, gn)?;
    let (trust, scale) = if excluded || wn == 0.0 || gn == 0.0 {
        (1.0, 1.0)
    } else {
        // MSTopK/HiTopKComm (Shi et al., MLSys 2021) Eq. 11 (γ = η, ε = weight decay there) with an
        // extra ε as in LARC.
        let trust = cfg.trust_coefficient * wn / (gn + cfg.weight_decay * wn + cfg.epsilon);
        finite(layer, Quantity::TrustRatio, trust)?;
        // apex LARC clip: adaptive_lr = min(adaptive_lr / lr, 1).
        let scale = if cfg.clip && lr > 0.0 {
            (trust / lr).min(1.0)
        } else {
            trust
        };
        (trust, scale)
    };
    Ok(LarsCoeff {
        weight_norm: wn,
        grad_norm: gn,
        trust_ratio: trust,
        scale,
    })
}

pub(crate) fn finite(layer: usize, quantity: Quantity, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(Error::NonFinite {
            layer,
            quantity,
            value,
        })
    }
}

/// The LARS optimizer: momentum SGD with per-layer rates from the parallel tensor operator.
#[derive(Debug, Clone)]
pub struct Lars {
    cfg: LarsConfig,
    excluded: Vec<bool>,
    pto: Pto,
    /// Momentum buffers, allocated at the first step.
    momentum: Vec<Vec<f32>>,
}

impl Lars {
    /// Builds the optimizer for `layers`. Collective: checks on every rank that all ranks
    /// have the same layers and hyper-parameters, and that the hyper-parameters are valid.
    pub fn new<C: Communicator + ?Sized>(
        comm: &C,
        cfg: LarsConfig,
        layers: &[LayerSpec],
    ) -> Result<Lars> {
        let (excluded, pto) = optimizer_operator(
            comm,
            layers,
            &cfg.skip,
            cfg.fingerprint().finish(),
            cfg.validate(),
        )?;
        Ok(Lars {
            cfg,
            excluded,
            pto,
            momentum: Vec::new(),
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LarsConfig {
        &self.cfg
    }

    operator_accessors!();

    /// The momentum buffers (empty before the first step).
    pub fn momentum_buffers(&self) -> &[Vec<f32>] {
        &self.momentum
    }

    /// Continues from saved [`Self::momentum_buffers`] (a checkpoint): one per layer of its
    /// size, or none before the first step. On error nothing changes.
    pub fn restore_momentum(&mut self, momentum: Vec<Vec<f32>>) -> Result<()> {
        if !momentum.is_empty() {
            check_list(self.pto.numels(), Tensor::Momentum, &momentum)?;
        }
        self.momentum = momentum;
        Ok(())
    }

    /// Every layer's coefficients for global learning rate `lr`, on every rank.
    /// Collective in [`Mode::Parallel`].
    pub fn coefficients<C, W, G>(
        &self,
        comm: &C,
        weights: &[W],
        grads: &[G],
        lr: f64,
    ) -> Result<Vec<LarsCoeff>>
    where
        C: Communicator + ?Sized,
        W: AsRef<[f32]>,
        G: AsRef<[f32]>,
    {
        let check = non_negative(Param::LearningRate, lr)
            .and_then(|()| check_pair(self.pto.numels(), weights, grads));
        let salt = Fingerprint::new().str("lars-step").f64(lr).finish();
        self.pto.map(comm, salt, check, |l| {
            lars_coeff(
                &self.cfg,
                l,
                self.excluded[l],
                weights[l].as_ref(),
                grads[l].as_ref(),
                lr,
            )
        })
    }

    /// One LARS step: coefficients through the operator, then the momentum update of every
    /// layer (which every rank does, as every rank needs the new weights). Returns the
    /// coefficients.
    pub fn step<C, W, G>(
        &mut self,
        comm: &C,
        weights: &mut [W],
        grads: &[G],
        lr: f64,
    ) -> Result<Vec<LarsCoeff>>
    where
        C: Communicator + ?Sized,
        W: AsRef<[f32]> + AsMut<[f32]>,
        G: AsRef<[f32]>,
    {
        let coeffs = self.coefficients(comm, weights, grads, lr)?;
        if self.momentum.is_empty() {
            self.momentum = self.pto.numels().iter().map(|&n| vec![0.0; n]).collect();
        }
        check_list(self.pto.numels(), Tensor::Momentum, &self.momentum)?;
        let mu = self.cfg.momentum as f32;
        for (l, ((w, g), v)) in weights
            .iter_mut()
            .zip(grads)
            .zip(self.momentum.iter_mut())
            .enumerate()
        {
            let c = &coeffs[l];
            let step = (lr * c.scale) as f32;
            let wd = if self.excluded[l] {
                0.0
            } else {
                self.cfg.weight_decay as f32
            };
            for ((w, &g), v) in w.as_mut().iter_mut().zip(g.as_ref()).zip(v.iter_mut()) {
                *v = mu * *v + step * (g + wd * *w);
                *w -= *v;
            }
        }
        Ok(coeffs)
    }
}
