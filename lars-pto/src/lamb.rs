//! LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2), with the
//! per-layer trust ratios computed by the parallel tensor operator (MSTopK/HiTopKComm
//! (Shi et al., MLSys 2021) §4.2: "it would be similar to handle the case of LAMB using PTO").
//!
//! For a layer at step t (1-based), Algorithm 2 of You et al. 2020:
//!
//! ```text
//! m = β1·m + (1 − β1)·g
//! v = β2·v + (1 − β2)·g²
//! m̂ = m / (1 − β1^t),   v̂ = v / (1 − β2^t)        (bias correction)
//! u = m̂ / (√v̂ + ε) + λ·w                           (the Adam direction plus decay)
//! trust = φ(‖w‖) / ‖u‖   if both norms > 0, else 1
//! w = w − lr·trust·u
//! ```
//!
//! with φ the identity, or `min(·, max_weight_norm)` (the clamp of the paper's §3). Skipped
//! layers (biases, layer norms, as BERT's `exclude_from_layer_adaptation`) get trust 1 and
//! λ = 0.
//!
//! The trust ratio is a pure function of the state before the step (w, g, m, v): the new
//! moments and `u` are computed on the fly and not stored, so the operator can split it
//! across ranks; the update pass then recomputes `u` with the same f32 operations, so the
//! two agree to the bit.

use collectives::Communicator;

use crate::error::{non_negative, positive, unit_interval, Param, Quantity, Tensor};
use crate::fingerprint::Fingerprint;
use crate::kernels::reduce;
use crate::lars::finite;
use crate::layers::{check_list, check_pair, optimizer_operator, LayerSpec, SkipList};
use crate::pto::{Exchange, Mode, Pto};
use crate::Result;

/// LAMB hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct LambConfig {
    /// β1 (0.9 in You et al. 2020).
    pub beta1: f64,
    /// β2 (0.999).
    pub beta2: f64,
    /// ε added to √v̂ (1e-6 in the BERT recipe).
    pub epsilon: f64,
    /// Weight decay λ (0.01 in the BERT recipe).
    pub weight_decay: f64,
    /// Divide the moments by `1 − β^t`.
    pub bias_correction: bool,
    /// Upper clamp of φ(‖w‖) (NVIDIA's implementation uses 10); `None` for the identity.
    pub max_weight_norm: Option<f64>,
    /// Layers exempt from the trust ratio and weight decay.
    pub skip: SkipList,
}

impl Default for LambConfig {
    /// The BERT recipe of You et al. 2020: β1 = 0.9, β2 = 0.999, ε = 1e-6, λ = 0.01, bias
    /// correction, φ the identity, the default skip list.
    fn default() -> Self {
        LambConfig {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-6,
            weight_decay: 0.01,
            bias_correction: true,
            max_weight_norm: None,
            skip: SkipList::default(),
        }
    }
}

impl LambConfig {
    /// Checks every hyper-parameter's domain.
    pub fn validate(&self) -> Result<()> {
        unit_interval(Param::Beta1, self.beta1)?;
        unit_interval(Param::Beta2, self.beta2)?;
        non_negative(Param::Epsilon, self.epsilon)?;
        non_negative(Param::WeightDecay, self.weight_decay)?;
        if let Some(m) = self.max_weight_norm {
            positive(Param::MaxWeightNorm, m)?;
        }
        Ok(())
    }

    fn fingerprint(&self) -> Fingerprint {
        self.skip.fingerprint(
            Fingerprint::new()
                .str("lamb")
                .f64(self.beta1)
                .f64(self.beta2)
                .f64(self.epsilon)
                .f64(self.weight_decay)
                .u64(u64::from(self.bias_correction))
                .f64(self.max_weight_norm.unwrap_or(-1.0)),
        )
    }
}

/// One layer's LAMB coefficients, the operator's per-layer output (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LambCoeff {
    /// ‖w‖ (before the φ clamp).
    pub weight_norm: f64,
    /// ‖u‖ of the update direction.
    pub update_norm: f64,
    /// `φ(‖w‖)/‖u‖`, or 1 for a zero norm or a skipped layer.
    pub trust_ratio: f64,
}

/// The f32 constants of one layer at one step.
#[derive(Debug, Clone, Copy)]
struct Consts {
    b1: f32,
    omb1: f32,
    b2: f32,
    omb2: f32,
    /// 1 / (1 − β1^t), or 1 without bias correction.
    c1: f32,
    /// 1 / (1 − β2^t).
    c2: f32,
    eps: f32,
    wd: f32,
}

impl Consts {
    fn new(cfg: &LambConfig, t: u64, excluded: bool) -> Consts {
        let (c1, c2) = if cfg.bias_correction {
            let t = i32::try_from(t).unwrap_or(i32::MAX);
            (
                1.0 / (1.0 - cfg.beta1.powi(t)),
                1.0 / (1.0 - cfg.beta2.powi(t)),
            )
        } else {
            (1.0, 1.0)
        };
        Consts {
            b1: cfg.beta1 as f32,
            omb1: (1.0 - cfg.beta1) as f32,
            b2: cfg.beta2 as f32,
            omb2: (1.0 - cfg.beta2) as f32,
            c1: c1 as f32,
            c2: c2 as f32,
            eps: cfg.epsilon as f32,
            wd: if excluded {
                0.0
            } else {
                cfg.weight_decay as f32
            },
        }
    }

    /// New moments and the update direction of one element (You et al. 2020, Algorithm 2).
    #[inline(always)]
    fn elem(&self, w: f32, g: f32, m: f32, v: f32) -> (f32, f32, f32) {
        let m1 = self.b1 * m + self.omb1 * g;
        let v1 = self.b2 * v + self.omb2 * (g * g);
        let u = (m1 * self.c1) / ((v1 * self.c2).sqrt() + self.eps) + self.wd * w;
        (m1, v1, u)
    }
}

/// `(Σ w², Σ u²)` over a layer, f64 lanes in a fixed order. Blocks of `u` are computed
/// into a stack buffer by a plain loop (which the compiler vectorises: sqrt and division
/// four or eight at a time), then squared and summed in eight f64 lanes.
fn norms(k: &Consts, w: &[f32], g: &[f32], m: &[f32], v: &[f32]) -> (f64, f64) {
    const L: usize = 8;
    const B: usize = 512;
    let n = w.len().min(g.len()).min(m.len()).min(v.len());
    let mut sw = [0.0f64; L];
    let mut su = [0.0f64; L];
    let (mut tw, mut tu) = (0.0f64, 0.0f64);
    let mut buf = [0.0f32; B];
    let mut start = 0;
    while start < n {
        let end = (start + B).min(n);
        let len = end - start;
        let (w, g, m, v) = (
            &w[start..end],
            &g[start..end],
            &m[start..end],
            &v[start..end],
        );
        let u = &mut buf[..len];
        for ((((u, &w), &g), &m), &v) in u.iter_mut().zip(w).zip(g).zip(m).zip(v) {
            *u = k.elem(w, g, m, v).2;
        }
        let (cw, cu) = (w.chunks_exact(L), u.chunks_exact(L));
        let (rw, ru) = (cw.remainder(), cu.remainder());
        for (w, u) in cw.zip(cu) {
            for j in 0..L {
                let (a, b) = (f64::from(w[j]), f64::from(u[j]));
                sw[j] += a * a;
                su[j] += b * b;
            }
        }
        for (&a, &b) in rw.iter().zip(ru) {
            let (a, b) = (f64::from(a), f64::from(b));
            tw += a * a;
            tu += b * b;
        }
        start = end;
    }
    (reduce(sw) + tw, reduce(su) + tu)
}

/// One layer's trust ratio (the per-layer function of the operator), from the state before
/// step `t`.
#[allow(clippy::too_many_arguments)]
pub fn lamb_coeff(
    cfg: &LambConfig,
    layer: usize,
    excluded: bool,
    t: u64,
    w: &[f32],
    g: &[f32],
    m: &[f32],
    v: &[f32],
) -> Result<LambCoeff> {
    let k = Consts::new(cfg, t, excluded);
    let (ww, uu) = norms(&k, w, g, m, v);
    let (wn, un) = (ww.sqrt(), uu.sqrt());
    finite(layer, Quantity::WeightNorm, wn)?;
    finite(layer, Quantity::UpdateNorm, un)?;
    let phi = match cfg.max_weight_norm {
        Some(max) => wn.min(max),
        None => wn,
    };
    let trust = if excluded || phi == 0.0 || un == 0.0 {
        1.0
    } else {
        phi / un
    };
    finite(layer, Quantity::TrustRatio, trust)?;
    Ok(LambCoeff {
        weight_norm: wn,
        update_norm: un,
        trust_ratio: trust,
    })
}

/// The LAMB optimizer, with its moments.
#[derive(Debug, Clone)]
pub struct Lamb {
    cfg: LambConfig,
    excluded: Vec<bool>,
    pto: Pto,
    exp_avg: Vec<Vec<f32>>,
    exp_avg_sq: Vec<Vec<f32>>,
    steps: u64,
}

impl Lamb {
    /// Builds the optimizer for `layers`. Collective: checks on every rank that all ranks
    /// have the same layers and hyper-parameters, and that they are valid.
    pub fn new<C: Communicator + ?Sized>(
        comm: &C,
        cfg: LambConfig,
        layers: &[LayerSpec],
    ) -> Result<Lamb> {
        let (excluded, pto) = optimizer_operator(
            comm,
            layers,
            &cfg.skip,
            cfg.fingerprint().finish(),
            cfg.validate(),
        )?;
        Ok(Lamb {
            cfg,
            excluded,
            pto,
            exp_avg: Vec::new(),
            exp_avg_sq: Vec::new(),
            steps: 0,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LambConfig {
        &self.cfg
    }

    operator_accessors!();

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The first and second moments (empty before the first step).
    pub fn moments(&self) -> (&[Vec<f32>], &[Vec<f32>]) {
        (&self.exp_avg, &self.exp_avg_sq)
    }

    /// Continues from saved [`Self::moments`] and [`Self::steps`] (a checkpoint): both
    /// moments one per layer of its size, or both empty before the first step. On error
    /// nothing changes.
    pub fn restore_moments(
        &mut self,
        exp_avg: Vec<Vec<f32>>,
        exp_avg_sq: Vec<Vec<f32>>,
        steps: u64,
    ) -> Result<()> {
        if !(exp_avg.is_empty() && exp_avg_sq.is_empty()) {
            check_list(self.pto.numels(), Tensor::ExpAvg, &exp_avg)?;
            check_list(self.pto.numels(), Tensor::ExpAvgSq, &exp_avg_sq)?;
        }
        self.exp_avg = exp_avg;
        self.exp_avg_sq = exp_avg_sq;
        self.steps = steps;
        Ok(())
    }

    /// Every layer's coefficients for step `t` (1-based) from the state before it: the
    /// weights, the gradients and the moments `exp_avg`, `exp_avg_sq` of step `t − 1`.
    /// Collective in [`Mode::Parallel`]. Does not change anything.
    pub fn trust_ratios<C, W, G, M>(
        &self,
        comm: &C,
        weights: &[W],
        grads: &[G],
        exp_avg: &[M],
        exp_avg_sq: &[M],
        t: u64,
    ) -> Result<Vec<LambCoeff>>
    where
        C: Communicator + ?Sized,
        W: AsRef<[f32]>,
        G: AsRef<[f32]>,
        M: AsRef<[f32]>,
    {
        self.map_trust(comm, weights, grads, exp_avg, exp_avg_sq, t, None)
    }

    /// [`Self::trust_ratios`], with the learning rate of a step (if any) checked on every
    /// rank and folded into the call's fingerprint.
    #[allow(clippy::too_many_arguments)]
    fn map_trust(
        &self,
        comm: &(impl Communicator + ?Sized),
        weights: &[impl AsRef<[f32]>],
        grads: &[impl AsRef<[f32]>],
        exp_avg: &[impl AsRef<[f32]>],
        exp_avg_sq: &[impl AsRef<[f32]>],
        t: u64,
        lr: Option<f64>,
    ) -> Result<Vec<LambCoeff>> {
        let numels = self.pto.numels();
        let check = lr
            .map_or(Ok(()), |lr| non_negative(Param::LearningRate, lr))
            .and_then(|()| check_pair(numels, weights, grads))
            .and_then(|()| check_list(numels, Tensor::ExpAvg, exp_avg))
            .and_then(|()| check_list(numels, Tensor::ExpAvgSq, exp_avg_sq));
        let mut salt = Fingerprint::new().str("lamb-step").u64(t);
        if let Some(lr) = lr {
            salt = salt.f64(lr);
        }
        self.pto.map(comm, salt.finish(), check, |l| {
            lamb_coeff(
                &self.cfg,
                l,
                self.excluded[l],
                t,
                weights[l].as_ref(),
                grads[l].as_ref(),
                exp_avg[l].as_ref(),
                exp_avg_sq[l].as_ref(),
            )
        })
    }

    /// One LAMB step with global learning rate `lr`: trust ratios through the operator,
    /// then the moment and weight update of every layer on every rank. Returns the
    /// coefficients. On error nothing changes.
    pub fn step<C, W, G>(
        &mut self,
        comm: &C,
        weights: &mut [W],
        grads: &[G],
        lr: f64,
    ) -> Result<Vec<LambCoeff>>
    where
        C: Communicator + ?Sized,
        W: AsRef<[f32]> + AsMut<[f32]>,
        G: AsRef<[f32]>,
    {
        if self.exp_avg.is_empty() {
            self.exp_avg = self.pto.numels().iter().map(|&n| vec![0.0; n]).collect();
            self.exp_avg_sq = self.exp_avg.clone();
        }
        let t = self.steps + 1;
        // The learning rate does not enter the trust ratio; check it on every rank all the
        // same, by folding it into the operator's validation.
        let coeffs = self.map_trust(
            comm,
            weights,
            grads,
            &self.exp_avg,
            &self.exp_avg_sq,
            t,
            Some(lr),
        )?;
        for (l, (((w, g), m), v)) in weights
            .iter_mut()
            .zip(grads)
            .zip(self.exp_avg.iter_mut())
            .zip(self.exp_avg_sq.iter_mut())
            .enumerate()
        {
            let k = Consts::new(&self.cfg, t, self.excluded[l]);
            let s = (lr * coeffs[l].trust_ratio) as f32;
            for (((w, &g), m), v) in w
                .as_mut()
                .iter_mut()
                .zip(g.as_ref())
                .zip(m.iter_mut())
                .zip(v.iter_mut())
            {
                let (m1, v1, u) = k.elem(*w, g, *m, *v);
                *m = m1;
                *v = v1;
                *w -= s * u;
            }
        }
        self.steps = t;
        Ok(coeffs)
    }
}
