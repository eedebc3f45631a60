//! Candle models cut into stages, and the stage-by-stage backward that gives the runtime
//! layer-wise readiness (wait-free backpropagation, OMGS-SGD (Shi et al., INFOCOM 2020),
//! Algorithm 2).
//!
//! A [`Staged`] model is a chain `x → stage 0 → stage 1 → … → logits`. Forward keeps each
//! stage's input detached as a [`Var`] ([`forward_train`]); backward then runs one stage at
//! a time from the last ([`backward_staged`]): the last stage from the loss, every other
//! stage seeded with the gradient of the next stage's input,
//! `(out · upstream).sum_all().backward()`, whose gradient with respect to the stage's
//! parameters is exactly the chain rule's. As soon as a stage is done its parameter
//! gradients go to the caller (the [`crate::Reducer`]'s hook), so their communication runs
//! while earlier stages are still differentiating.
//!
//! A *layer*, for the merge planner and the reducer, is one parameter tensor; layers are
//! numbered in forward order (stage by stage, each stage's tensors in its own fixed order)
//! and handed over in reverse.
//!
//! **Carried state.** A stage may carry state from one batch to the next (an LSTM's final
//! `(h, c)`: truncated BPTT). It enters the next batch as a detached constant, so the cut
//! above is unchanged: gradients stay exactly those of a full backward through the
//! window. Every forward in training mode advances the training state, every forward in
//! evaluation mode a separate evaluation state; [`Staged::reset_state`] forgets one,
//! [`get_carried`] / [`set_carried`] save and restore the training state (checkpoints).
//!
//! [`Stages`] builds a [`Staged`] model from closures over a fresh `VarBuilder` per stage,
//! so a user's own candle modules plug in with a few lines (see the crate's `own_model`
//! example). Parameters are initialised deterministically from a seed, so every rank starts
//! from the same weights without a broadcast.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{ModuleT, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};

use crate::{Error, Result};

/// A candle model cut into a chain of stages. See the module docs.
pub trait Staged: Send + Sync {
    /// Short name for reports (e.g. `resnet20`).
    fn name(&self) -> String;
    /// Number of stages.
    fn num_stages(&self) -> usize;
    /// Runs stage `i` on `x`; `train` selects batch statistics in batch norm.
    fn forward_stage(&self, i: usize, x: &Tensor, train: bool) -> candle_core::Result<Tensor>;
    /// Stage `i`'s trainable parameters (name, variable), in a fixed order.
    fn stage_params(&self, i: usize) -> &[(String, Var)];
    /// Stage `i`'s state that training changes but no gradient reaches (batch-norm
    /// running statistics), in a fixed order: a checkpoint saves it. None by default.
    fn stage_buffers(&self, _i: usize) -> &[(String, Var)] {
        &[]
    }
    /// Forgets the state that stages carry from one batch to the next of the same mode
    /// (`train` picks training or evaluation; e.g. an LSTM's final hidden state, truncated
    /// BPTT), so the next batch of that mode starts from zeros. The training loop calls it
    /// at every epoch start, [`crate::data::evaluate_chunks`] before its first chunk.
    /// Nothing to forget by default.
    fn reset_state(&self, _train: bool) -> candle_core::Result<()> {
        Ok(())
    }
    /// Stage `i`'s state carried into the next training batch (detached: no gradient
    /// crosses batches), in a fixed order; empty when the next batch starts from zeros.
    /// It is each rank's own (its own streams), and a checkpoint saves it per rank. None
    /// by default.
    fn carried_state(&self, _i: usize) -> candle_core::Result<Vec<Tensor>> {
        Ok(Vec::new())
    }
    /// Installs stage `i`'s carried training state as [`Staged::carried_state`] gave it
    /// (empty: start from zeros). A stage without state accepts only the empty list.
    fn set_carried_state(&self, i: usize, state: &[Tensor]) -> candle_core::Result<()> {
        if state.is_empty() {
            Ok(())
        } else {
            candle_core::bail!("stage {i} of `{}` carries no state", self.name())
        }
    }
    /// The loss of the final output against the targets; cross entropy over the last
    /// dimension by default (logits `[N, C]`, targets `u32 [N]`).
    fn loss(&self, logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::loss::cross_entropy(logits, targets)
    }
    /// The device the parameters live on.
    fn device(&self) -> Device {
        Device::Cpu
    }
}

/// Every layer (parameter tensor) of `model` in forward order: name and shape.
pub fn layers(model: &dyn Staged) -> Vec<(String, Vec<usize>)> {
    (0..model.num_stages())
        .flat_map(|s| model.stage_params(s).iter())
        .map(|(n, v)| (n.clone(), v.as_tensor().dims().to_vec()))
        .collect()
}

/// Element count of every layer, forward order.
pub fn layer_sizes(model: &dyn Staged) -> Vec<usize> {
    layers(model)
        .iter()
        .map(|(_, s)| s.iter().product())
        .collect()
}

/// Which stage each layer belongs to, forward order.
pub fn layer_stages(model: &dyn Staged) -> Vec<usize> {
    (0..model.num_stages())
        .flat_map(|s| std::iter::repeat_n(s, model.stage_params(s).len()))
        .collect()
}

/// Which variables of a stage: [`Staged::stage_params`] or [`Staged::stage_buffers`].
type Pick = fn(&dyn Staged, usize) -> &[(String, Var)];

/// Every parameter's values, one vector per layer, forward order.
pub fn get_params(model: &dyn Staged) -> Result<Vec<Vec<f32>>> {
    get_vars(model, |m, s| m.stage_params(s))
}

/// Stage `stage`'s parameters concatenated (its tensors in their fixed order).
pub fn get_stage_params(model: &dyn Staged, stage: usize) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for (_, v) in model.stage_params(stage) {
        out.extend(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

/// Overwrites every parameter from `values` (one vector per layer, forward order).
pub fn set_params(model: &dyn Staged, values: &[Vec<f32>]) -> Result<()> {
    set_vars(model, |m, s| m.stage_params(s), values)
}

/// Every buffer's values ([`Staged::stage_buffers`]), forward order.
pub fn get_buffers(model: &dyn Staged) -> Result<Vec<Vec<f32>>> {
    get_vars(model, |m, s| m.stage_buffers(s))
}

/// Overwrites every buffer from `values` (forward order).
pub fn set_buffers(model: &dyn Staged, values: &[Vec<f32>]) -> Result<()> {
    set_vars(model, |m, s| m.stage_buffers(s), values)
}

/// A tensor on the host: its dims and values (row-major), as a checkpoint holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions.
    pub dims: Vec<usize>,
    /// Values, row-major.
    pub values: Vec<f32>,
}

/// Every stage's carried training state ([`Staged::carried_state`]), one list per stage.
pub fn get_carried(model: &dyn Staged) -> Result<Vec<Vec<HostTensor>>> {
    (0..model.num_stages())
        .map(|s| {
            model
                .carried_state(s)?
                .iter()
                .map(|t| {
                    Ok(HostTensor {
                        dims: t.dims().to_vec(),
                        values: t.flatten_all()?.to_vec1::<f32>()?,
                    })
                })
                .collect()
        })
        .collect()
}

/// Installs every stage's carried training state as [`get_carried`] gave it.
pub fn set_carried(model: &dyn Staged, state: &[Vec<HostTensor>]) -> Result<()> {
    if state.len() != model.num_stages() {
        return Err(Error::InvalidArgument(format!(
            "carried state of {} stages for a model of {}",
            state.len(),
            model.num_stages()
        )));
    }
    let dev = model.device();
    for (s, tensors) in state.iter().enumerate() {
        let tensors = tensors
            .iter()
            .map(|t| {
                // Checked: the dims come from a checkpoint file and may be corrupt.
                let want = t.dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                if want != Some(t.values.len()) {
                    return Err(Error::InvalidArgument(format!(
                        "stage {s}: {} values for dims {:?}",
                        t.values.len(),
                        t.dims
                    )));
                }
                Ok(Tensor::from_slice(&t.values, t.dims.as_slice(), &dev)?)
            })
            .collect::<Result<Vec<_>>>()?;
        model
            .set_carried_state(s, &tensors)
            .map_err(|e| Error::Model(format!("carried state of stage {s}: {e}")))?;
    }
    Ok(())
}

fn get_vars(model: &dyn Staged, pick: Pick) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::new();
    for s in 0..model.num_stages() {
        for (_, v) in pick(model, s) {
            out.push(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
    }
    Ok(out)
}

fn set_vars(model: &dyn Staged, pick: Pick, values: &[Vec<f32>]) -> Result<()> {
    let dev = model.device();
    let mut i = 0;
    for s in 0..model.num_stages() {
        for (name, v) in pick(model, s) {
            let w = values.get(i).ok_or_else(|| {
                Error::InvalidArgument(format!("{} values for more layers", values.len()))
            })?;
            let dims = v.as_tensor().dims().to_vec();
            if w.len() != dims.iter().product::<usize>() {
                return Err(Error::GradientLength {
                    layer: i,
                    got: w.len(),
                    expected: dims.iter().product(),
                });
            }
            v.set(&Tensor::from_slice(w, dims.as_slice(), &dev)?)
                .map_err(|e| Error::Model(format!("setting `{name}`: {e}")))?;
            i += 1;
        }
    }
    if i != values.len() {
        return Err(Error::InvalidArgument(format!(
            "{} values for {i} layers",
            values.len()
        )));
    }
    Ok(())
}

/// The chain run without cutting: logits of `x`.
pub fn forward(model: &dyn Staged, x: &Tensor, train: bool) -> Result<Tensor> {
    let mut h = x.clone();
    for s in 0..model.num_stages() {
        h = model.forward_stage(s, &h, train)?;
    }
    Ok(h)
}

/// What a cut forward keeps for [`backward_staged`].
pub struct Forward {
    /// Each stage's input as a variable (`None` for stage 0: the data needs no gradient).
    inputs: Vec<Option<Var>>,
    /// Each stage's output.
    outputs: Vec<Tensor>,
}

impl Forward {
    /// The model's output (logits).
    pub fn logits(&self) -> &Tensor {
        // A model has at least one stage (checked in `forward_train`).
        &self.outputs[self.outputs.len() - 1]
    }
}

/// Forward in training mode, each stage's input detached as a [`Var`].
pub fn forward_train(model: &dyn Staged, x: &Tensor) -> Result<Forward> {
    forward_train_with(model, x, &mut |_| Ok(()))
}

/// [`forward_train`] calling `before(s)` before stage `s` runs: where BSP-SGD Algorithm 1
/// of Linear Pipelining (Wang et al.) waits for the stage's parameters, so the broadcast
/// of the next stage's overlaps this stage's forward.
pub fn forward_train_with(
    model: &dyn Staged,
    x: &Tensor,
    before: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<Forward> {
    let n = model.num_stages();
    if n == 0 {
        return Err(Error::InvalidArgument(format!(
            "model `{}` has no stages",
            model.name()
        )));
    }
    let mut inputs = Vec::with_capacity(n);
    let mut outputs: Vec<Tensor> = Vec::with_capacity(n);
    for s in 0..n {
        before(s)?;
        let out = match outputs.last() {
            None => {
                inputs.push(None);
                model.forward_stage(s, x, true)?
            }
            Some(prev) => {
                let v = Var::from_tensor(&prev.detach())?;
                let out = model.forward_stage(s, v.as_tensor(), true)?;
                inputs.push(Some(v));
                out
            }
        };
        outputs.push(out);
    }
    Ok(Forward { inputs, outputs })
}

/// Backward stage by stage from `loss` (a scalar computed from [`Forward::logits`]).
/// After each stage, `ready(layer, grad)` is called for the stage's layers in reverse
/// forward order, so layers arrive `L−1, …, 0` as [`crate::Reducer::ready`] expects. A
/// parameter the loss does not depend on gets a zero gradient.
pub fn backward_staged(
    model: &dyn Staged,
    fwd: &Forward,
    loss: &Tensor,
    ready: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
) -> Result<()> {
    let n = model.num_stages();
    let counts: Vec<usize> = (0..n).map(|s| model.stage_params(s).len()).collect();
    let mut next_layer = counts.iter().sum::<usize>();
    let mut upstream: Option<Tensor> = None;
    for s in (0..n).rev() {
        let grads = match upstream.take() {
            None => loss.backward()?,
            Some(up) => (&fwd.outputs[s] * up)?.sum_all()?.backward()?,
        };
        for (name, v) in model.stage_params(s).iter().rev() {
            next_layer -= 1;
            let g = match grads.get(v.as_tensor()) {
                Some(g) => g.flatten_all()?.to_vec1::<f32>()?,
                None => vec![0.0; v.as_tensor().elem_count()],
            };
            if !g.iter().all(|x| x.is_finite()) {
                return Err(Error::Model(format!(
                    "non-finite gradient in `{name}` (stage {s})"
                )));
            }
            ready(next_layer, &g)?;
        }
        if let Some(input) = &fwd.inputs[s] {
            let g = grads.get(input.as_tensor()).ok_or_else(|| {
                Error::Model(format!(
                    "stage {s} of `{}` does not depend on its input",
                    model.name()
                ))
            })?;
            upstream = Some(g.clone());
        }
    }
    Ok(())
}

/// Number of rows of `logits` (`[N, C]`) whose argmax equals `targets` (`u32 [N]`).
pub fn correct(logits: &Tensor, targets: &Tensor) -> Result<usize> {
    let pred = logits.argmax(D::Minus1)?;
    let eq = pred.eq(targets)?.to_dtype(DType::F32)?.sum_all()?;
    Ok(eq.to_scalar::<f32>()? as usize)
}

type StageFn = Box<dyn Fn(&Tensor, bool) -> candle_core::Result<Tensor> + Send + Sync>;

struct Stage {
    params: Vec<(String, Var)>,
    buffers: Vec<(String, Var)>,
    run: StageFn,
}

/// A [`Staged`] model assembled stage by stage. See the module docs.
pub struct Stages {
    name: String,
    seed: u64,
    device: Device,
    stages: Vec<Stage>,
}

impl Stages {
    /// An empty chain named `name` whose parameters are initialised from `seed`, on CPU.
    pub fn new(name: impl Into<String>, seed: u64) -> Self {
        Stages {
            name: name.into(),
            seed,
            device: Device::Cpu,
            stages: Vec::new(),
        }
    }

    /// The same on `device` (a CUDA device with the `cuda` feature).
    pub fn on(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Adds a stage: `build` gets a fresh `VarBuilder` (prefix `name`) and returns any
    /// candle [`ModuleT`]. The variables it creates are the stage's parameters (batch-norm
    /// running statistics excluded), initialised from the seed: He-uniform for
    /// convolutions, `±1/√fan_in` for matrices, ones for 1-D `weight`s, zeros for biases.
    pub fn push<M, F>(&mut self, name: &str, build: F) -> Result<&mut Self>
    where
        M: ModuleT + Send + Sync + 'static,
        F: FnOnce(VarBuilder) -> candle_core::Result<M>,
    {
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &self.device).pp(name);
        let module = Arc::new(build(vb)?);
        let (mut buffers, mut params): (Vec<(String, Var)>, Vec<_>) = vm
            .data()
            .lock()
            .map_err(|_| Error::Model("poisoned VarMap".into()))?
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .partition(|(n, _)| n.ends_with("running_mean") || n.ends_with("running_var"));
        params.sort_by(|a, b| a.0.cmp(&b.0));
        buffers.sort_by(|a, b| a.0.cmp(&b.0));
        for (n, v) in &params {
            seeded_init(self.seed, n, v, &self.device)?;
        }
        self.stages.push(Stage {
            params,
            buffers,
            run: Box::new(move |x, train| module.forward_t(x, train)),
        });
        Ok(self)
    }

    /// Adds a parameter-free stage (a reshape, a pooling).
    pub fn push_fn<F>(&mut self, f: F) -> &mut Self
    where
        F: Fn(&Tensor, bool) -> candle_core::Result<Tensor> + Send + Sync + 'static,
    {
        self.stages.push(Stage {
            params: Vec::new(),
            buffers: Vec::new(),
            run: Box::new(f),
        });
        self
    }

    /// Adds a stage whose parameters the caller already has (e.g. loaded weights): no
    /// initialisation.
    pub fn push_with_params<F>(&mut self, params: Vec<(String, Var)>, f: F) -> &mut Self
    where
        F: Fn(&Tensor, bool) -> candle_core::Result<Tensor> + Send + Sync + 'static,
    {
        self.stages.push(Stage {
            params,
            buffers: Vec::new(),
            run: Box::new(f),
        });
        self
    }
}

impl Staged for Stages {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn num_stages(&self) -> usize {
        self.stages.len()
    }
    fn forward_stage(&self, i: usize, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        match self.stages.get(i) {
            Some(s) => (s.run)(x, train),
            None => candle_core::bail!("stage {i} outside 0..{}", self.stages.len()),
        }
    }
    fn stage_params(&self, i: usize) -> &[(String, Var)] {
        self.stages
            .get(i)
            .map(|s| s.params.as_slice())
            .unwrap_or(&[])
    }
    fn stage_buffers(&self, i: usize) -> &[(String, Var)] {
        self.stages
            .get(i)
            .map(|s| s.buffers.as_slice())
            .unwrap_or(&[])
    }
    fn device(&self) -> Device {
        self.device.clone()
    }
}

/// Deterministic initialisation of one parameter from `(seed, name)`.
fn seeded_init(seed: u64, name: &str, v: &Var, device: &Device) -> Result<()> {
    let dims = v.as_tensor().dims().to_vec();
    let n: usize = dims.iter().product();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ h.finish());
    let values: Vec<f32> = if dims.len() >= 2 {
        let fan_in: usize = dims[1..].iter().product::<usize>().max(1);
        let bound = if dims.len() >= 3 {
            (6.0 / fan_in as f32).sqrt()
        } else {
            1.0 / (fan_in as f32).sqrt()
        };
        (0..n).map(|_| rng.gen_range(-bound..bound)).collect()
    } else if name.ends_with("bias") {
        vec![0.0; n]
    } else {
        vec![1.0; n]
    };
    v.set(&Tensor::from_vec(values, dims.as_slice(), device)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candle_models::{resnet20, vgg16_bn, LstmLm, LstmShape};

    /// Stage-wise gradients equal those of one full backward through the uncut chain,
    /// both from the carried state the model holds on entry; the staged gradients.
    fn check_equal(model: &dyn Staged, x: &Tensor, y: &Tensor) -> Vec<Vec<f32>> {
        let carried = get_carried(model).unwrap();
        let fwd = forward_train(model, x).unwrap();
        let loss = model.loss(fwd.logits(), y).unwrap();
        let mut staged: Vec<Vec<f32>> = vec![Vec::new(); layer_sizes(model).len()];
        let mut order = Vec::new();
        backward_staged(model, &fwd, &loss, &mut |l, g| {
            order.push(l);
            staged[l] = g.to_vec();
            Ok(())
        })
        .unwrap();
        let expect: Vec<usize> = (0..staged.len()).rev().collect();
        assert_eq!(order, expect);
        // The full forward starts from the same carried state.
        set_carried(model, &carried).unwrap();
        let logits = forward(model, x, true).unwrap();
        let full = model.loss(&logits, y).unwrap().backward().unwrap();
        let mut nonzero = 0;
        let mut i = 0;
        for s in 0..model.num_stages() {
            for (name, v) in model.stage_params(s) {
                let g = full
                    .get(v.as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                assert_eq!(g.len(), staged[i].len());
                for (a, b) in g.iter().zip(&staged[i]) {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                        "{name}: full {a} vs staged {b}"
                    );
                    nonzero += usize::from(*a != 0.0);
                }
                i += 1;
            }
        }
        assert!(nonzero > 0, "vacuous: every gradient is zero");
        staged
    }

    #[test]
    fn resnet20_stagewise_gradients_equal_full_backward() {
        let m = resnet20(1, 8, 10, 3).unwrap();
        assert_eq!(m.num_stages(), 11);
        let x = Tensor::randn(0f32, 1.0, (4, 1, 8, 8), &Device::Cpu).unwrap();
        let y = Tensor::new(&[1u32, 3, 5, 7], &Device::Cpu).unwrap();
        check_equal(&m, &x, &y);
        // ResNet-20 of He et al. has about 0.27 M parameters on CIFAR-10.
        let n: usize = layer_sizes(&m).iter().sum();
        assert!((260_000..300_000).contains(&n), "{n}");
    }

    #[test]
    fn vgg_and_lstm_stagewise_gradients_equal_full_backward() {
        let m = vgg16_bn(3, 32, 10, 4, 1).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 3, 32, 32), &Device::Cpu).unwrap();
        let y = Tensor::new(&[1u32, 9], &Device::Cpu).unwrap();
        check_equal(&m, &x, &y);
        let shape = LstmShape {
            vocab: 50,
            embed: 8,
            hidden: 12,
        };
        let lm = LstmLm::new(shape, 5).unwrap();
        let tokens = Tensor::new(&[[1u32, 4, 9, 2], [7, 7, 3, 0]], &Device::Cpu).unwrap();
        let next = Tensor::new(&[4u32, 9, 2, 8, 7, 3, 0, 1], &Device::Cpu).unwrap();
        check_equal(&lm, &tokens, &next);
        // Truncated BPTT: the next window starts from the state the first one left, and
        // the cut still gives a full backward's gradients (with respect to this window).
        let more = Tensor::new(&[[8u32, 2, 2, 5], [1, 6, 6, 4]], &Device::Cpu).unwrap();
        let target = Tensor::new(&[2u32, 2, 5, 3, 6, 6, 4, 9], &Device::Cpu).unwrap();
        let carried = get_carried(&lm).unwrap();
        assert_eq!(carried[1].len(), 2, "layer 1 carries (h, c)");
        assert!(carried[1][0].values.iter().any(|&v| v != 0.0));
        let with_state = check_equal(&lm, &more, &target);
        lm.reset_state(true).unwrap();
        let without = check_equal(&lm, &more, &target);
        assert_ne!(with_state, without, "the carried state changes nothing");
    }

    #[test]
    fn params_round_trip_and_seeds_agree() {
        let a = resnet20(1, 8, 10, 9).unwrap();
        let b = resnet20(1, 8, 10, 9).unwrap();
        let c = resnet20(1, 8, 10, 10).unwrap();
        let pa = get_params(&a).unwrap();
        assert_eq!(pa, get_params(&b).unwrap());
        assert_ne!(pa, get_params(&c).unwrap());
        set_params(&c, &pa).unwrap();
        assert_eq!(pa, get_params(&c).unwrap());
        assert!(set_params(&c, &pa[1..]).is_err());
        let mut short = pa.clone();
        short[0].pop();
        assert!(matches!(
            set_params(&c, &short),
            Err(Error::GradientLength { layer: 0, .. })
        ));
    }
}
