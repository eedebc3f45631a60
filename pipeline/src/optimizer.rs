//! One [`Optimizer`] trait for the training step: SGD with momentum and weight decay, and
//! LARS and LAMB from `lars-pto`, whose per-layer norms and trust ratios are split across
//! the ranks by its parallel tensor operator (PTO, MSTopK/HiTopKComm (Shi et al., MLSys
//! 2021), §4.2) and all-gathered, bit-identical to computing every layer locally.
//!
//! Every rank calls `step` with the same averaged gradients, so the weights stay
//! bit-identical; LARS/LAMB's construction is collective and checks that every rank has
//! the same layers and hyper-parameters.

use collectives::Communicator;
use lars_pto::{Lamb, LambConfig, Lars, LarsConfig, LayerSpec};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{f32_lists_from_state, f32_lists_state, Dec, Enc};
use crate::{Error, Result};

/// Updates the weights from the averaged gradients.
pub trait Optimizer: Send {
    /// Short name for reports.
    fn name(&self) -> String;
    /// One step at learning rate `lr`. Collective for the PTO optimizers: every rank calls
    /// it with the same gradients.
    fn step(
        &mut self,
        comm: &dyn Communicator,
        weights: &mut [Vec<f32>],
        grads: &[Vec<f32>],
        lr: f32,
    ) -> Result<()>;
    /// Its state (momentum, moments, step count), for a checkpoint: the same on every
    /// rank, as the steps are.
    fn save_state(&self) -> Vec<u8>;
    /// Continues from [`Self::save_state`]'s output of the same optimizer and layers.
    fn restore_state(&mut self, state: &[u8]) -> Result<()>;
}

/// Which optimizer to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
pub enum OptimizerKind {
    /// SGD with momentum and (L2) weight decay.
    #[default]
    Sgd,
    /// LARS (You et al.), trust ratios by PTO.
    Lars,
    /// LAMB (You et al. 2020), trust ratios by PTO.
    Lamb,
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Lars => "lars",
            OptimizerKind::Lamb => "lamb",
        })
    }
}

/// SGD with momentum: `v ← μ·v + g + λ·w`, `w ← w − lr·v` (the PyTorch form).
#[derive(Debug, Clone, PartialEq)]
pub struct Sgd {
    /// Momentum μ.
    pub momentum: f32,
    /// Weight decay λ.
    pub weight_decay: f32,
    velocity: Vec<Vec<f32>>,
}

impl Sgd {
    /// SGD with `momentum` in [0, 1) and `weight_decay` ≥ 0.
    pub fn new(momentum: f32, weight_decay: f32) -> Result<Self> {
        if !((0.0..1.0).contains(&momentum) && weight_decay >= 0.0 && weight_decay.is_finite()) {
            return Err(Error::InvalidArgument(format!(
                "momentum {momentum} outside [0, 1) or weight decay {weight_decay} < 0"
            )));
        }
        Ok(Sgd {
            momentum,
            weight_decay,
            velocity: Vec::new(),
        })
    }
}

impl Optimizer for Sgd {
    fn name(&self) -> String {
        format!("sgd(μ={}, λ={})", self.momentum, self.weight_decay)
    }
    fn step(
        &mut self,
        _comm: &dyn Communicator,
        weights: &mut [Vec<f32>],
        grads: &[Vec<f32>],
        lr: f32,
    ) -> Result<()> {
        check_shapes(weights, grads)?;
        if self.velocity.is_empty() {
            self.velocity = weights.iter().map(|w| vec![0.0; w.len()]).collect();
        }
        // A restored velocity of other shapes would be zipped short: a silent partial update.
        if self.velocity.len() != weights.len()
            || self
                .velocity
                .iter()
                .zip(weights.iter())
                .any(|(v, w)| v.len() != w.len())
        {
            return Err(Error::InvalidArgument(
                "the restored SGD velocity does not match the weights' shapes".into(),
            ));
        }
        for ((w, g), v) in weights.iter_mut().zip(grads).zip(&mut self.velocity) {
            for ((wi, gi), vi) in w.iter_mut().zip(g).zip(v.iter_mut()) {
                *vi = self.momentum * *vi + gi + self.weight_decay * *wi;
                *wi -= lr * *vi;
            }
        }
        Ok(())
    }
    fn save_state(&self) -> Vec<u8> {
        f32_lists_state(&self.velocity)
    }
    /// The velocity's shapes are checked against the weights at the next step.
    fn restore_state(&mut self, state: &[u8]) -> Result<()> {
        self.velocity = f32_lists_from_state(state)?;
        Ok(())
    }
}

fn check_shapes(weights: &[Vec<f32>], grads: &[Vec<f32>]) -> Result<()> {
    if weights.len() != grads.len() {
        return Err(Error::InvalidArgument(format!(
            "{} weight tensors, {} gradients",
            weights.len(),
            grads.len()
        )));
    }
    for (i, (w, g)) in weights.iter().zip(grads).enumerate() {
        if w.len() != g.len() {
            return Err(Error::GradientLength {
                layer: i,
                got: g.len(),
                expected: w.len(),
            });
        }
    }
    Ok(())
}

/// The `lars-pto` optimizers behind [`Optimizer`]: each already has the trait's `step`
/// (collective, the parallel tensor operator splitting the work), so only the name differs.
macro_rules! pto_optimizer {
    ($($wrapper:ident($inner:ty) = $name:literal),* $(,)?) => {$(
        struct $wrapper($inner);

        impl Optimizer for $wrapper {
            fn name(&self) -> String {
                $name.into()
            }
            fn step(
                &mut self,
                comm: &dyn Communicator,
                weights: &mut [Vec<f32>],
                grads: &[Vec<f32>],
                lr: f32,
            ) -> Result<()> {
                self.0.step(comm, weights, grads, f64::from(lr))?;
                Ok(())
            }
            fn save_state(&self) -> Vec<u8> {
                PtoState::save(&self.0)
            }
            fn restore_state(&mut self, state: &[u8]) -> Result<()> {
                PtoState::restore(&mut self.0, state)
            }
        }
    )*};
}

/// The checkpoint state of a `lars-pto` optimizer.
trait PtoState {
    fn save(&self) -> Vec<u8>;
    fn restore(&mut self, state: &[u8]) -> Result<()>;
}

impl PtoState for Lars {
    /// The momentum buffers.
    fn save(&self) -> Vec<u8> {
        f32_lists_state(self.momentum_buffers())
    }
    fn restore(&mut self, state: &[u8]) -> Result<()> {
        Ok(self.restore_momentum(f32_lists_from_state(state)?)?)
    }
}

impl PtoState for Lamb {
    /// The step count and both moments.
    fn save(&self) -> Vec<u8> {
        let (m, v) = self.moments();
        let mut e = Enc::default();
        e.u64(self.steps()).f32_lists(m).f32_lists(v);
        e.0
    }
    fn restore(&mut self, state: &[u8]) -> Result<()> {
        let mut d = Dec(state);
        let steps = d.u64()?;
        let (m, v) = (d.f32_lists()?, d.f32_lists()?);
        d.finish()?;
        Ok(self.restore_moments(m, v, steps)?)
    }
}
pto_optimizer!(LarsOpt(Lars) = "lars(pto)", LambOpt(Lamb) = "lamb(pto)");

/// Builds `kind` for `layers` (name, element count; forward order). SGD uses `momentum`
/// and `weight_decay`; LARS uses them too, with the default trust coefficient; LAMB its
/// defaults with `weight_decay`. Collective for LARS and LAMB.
pub fn build(
    kind: OptimizerKind,
    comm: &dyn Communicator,
    layers: &[(String, usize)],
    momentum: f32,
    weight_decay: f32,
) -> Result<Box<dyn Optimizer>> {
    let specs: Vec<LayerSpec> = layers
        .iter()
        .map(|(n, k)| LayerSpec::new(n.clone(), *k))
        .collect();
    Ok(match kind {
        OptimizerKind::Sgd => Box::new(Sgd::new(momentum, weight_decay)?),
        OptimizerKind::Lars => Box::new(LarsOpt(Lars::new(
            comm,
            LarsConfig {
                momentum: f64::from(momentum),
                weight_decay: f64::from(weight_decay),
                ..LarsConfig::default()
            },
            &specs,
        )?)),
        OptimizerKind::Lamb => Box::new(LambOpt(Lamb::new(
            comm,
            LambConfig {
                weight_decay: f64::from(weight_decay),
                ..LambConfig::default()
            },
            &specs,
        )?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectives::ThreadComm;

    #[test]
    fn every_optimizer_moves_downhill_identically_on_every_rank() {
        let layers = vec![("conv.weight".to_string(), 4), ("fc.bias".to_string(), 2)];
        for kind in [OptimizerKind::Sgd, OptimizerKind::Lars, OptimizerKind::Lamb] {
            let out = ThreadComm::run(3, |comm| -> Result<Vec<Vec<f32>>> {
                let mut opt = build(kind, &comm, &layers, 0.9, 1e-4)?;
                let mut w = vec![vec![1.0, -2.0, 0.5, 3.0], vec![0.1, 0.2]];
                let g = vec![vec![0.5, -0.5, 0.1, 1.0], vec![0.3, -0.3]];
                for _ in 0..3 {
                    opt.step(&comm, &mut w, &g, 0.1)?;
                }
                Ok(w)
            })
            .unwrap();
            assert!(out.iter().all(|w| w == &out[0]), "{kind}");
            // Every coordinate moved against its gradient's sign.
            assert!(
                out[0][0][0] < 1.0 && out[0][0][1] > -2.0,
                "{kind}: {:?}",
                out[0]
            );
        }
        assert!(Sgd::new(1.0, 0.0).is_err());
        // A restored optimizer continues bit-identically; a state of the wrong shape is
        // refused.
        for kind in [OptimizerKind::Sgd, OptimizerKind::Lars, OptimizerKind::Lamb] {
            type Weights = Vec<Vec<f32>>;
            let out = ThreadComm::run(2, |comm| -> Result<(Weights, Weights)> {
                let g = vec![vec![0.5, -0.5, 0.1, 1.0], vec![0.3, -0.3]];
                let mut a = build(kind, &comm, &layers, 0.9, 1e-4)?;
                let mut wa = vec![vec![1.0, -2.0, 0.5, 3.0], vec![0.1, 0.2]];
                for _ in 0..2 {
                    a.step(&comm, &mut wa, &g, 0.1)?;
                }
                let mut b = build(kind, &comm, &layers, 0.9, 1e-4)?;
                b.restore_state(&a.save_state())?;
                let mut wb = wa.clone();
                a.step(&comm, &mut wa, &g, 0.1)?;
                b.step(&comm, &mut wb, &g, 0.1)?;
                assert!(b.restore_state(&a.save_state()[..7]).is_err());
                // A well-formed state for other layers is refused at the step, not zipped short.
                let mut c = build(kind, &comm, &layers, 0.9, 1e-4)?;
                let other = build(kind, &comm, &[("x".to_string(), 3)], 0.9, 1e-4);
                if let (Ok(mut o), OptimizerKind::Sgd) = (other, kind) {
                    o.step(&comm, &mut [vec![1.0; 3]], &[vec![1.0; 3]], 0.1)?;
                    c.restore_state(&o.save_state())?;
                    let mut w = wa.clone();
                    assert!(c.step(&comm, &mut w, &g, 0.1).is_err());
                }
                Ok((wa, wb))
            })
            .unwrap();
            for (a, b) in out {
                assert_eq!(a, b, "{kind}");
            }
        }
        let bad = ThreadComm::run(1, |comm| -> Result<()> {
            let mut opt = build(OptimizerKind::Sgd, &comm, &layers, 0.9, 0.0)?;
            opt.step(&comm, &mut [vec![0.0; 4]], &[vec![0.0; 3]], 0.1)
        });
        assert!(bad.is_err());
    }
}
