//! Built-in pure-Rust models with layer-wise backward, to drive the runtime end to end: an
//! MLP and a small convolutional net. `backward` calls a hook per parameter tensor in
//! backward order (last tensor first), the way a framework's gradient hooks fire, so the
//! reducer overlaps communication with the rest of backward.

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

use crate::profile::{Layer, LayerProfile};
use crate::{Error, Result};

/// A model trained by [`crate::train`]: parameters as tensors in forward order.
pub trait Model: Send {
    /// Name for reports.
    fn name(&self) -> String;
    /// Parameter tensors (forward order).
    fn params(&self) -> &[Vec<f32>];
    /// Mutable parameter tensors.
    fn params_mut(&mut self) -> &mut [Vec<f32>];
    /// Tensor names (forward order).
    fn param_names(&self) -> Vec<String>;
    /// Input features per sample.
    fn input_dim(&self) -> usize;
    /// Number of classes (logits per sample).
    fn classes(&self) -> usize;
    /// Forward of a batch (`batch × input_dim`, row-major); returns logits and keeps what
    /// backward needs.
    fn forward(&mut self, x: &[f32], batch: usize) -> Result<Vec<f32>>;
    /// Backward from `dlogits` (`batch × classes`) of the last forward; calls `hook(tensor,
    /// grad)` once per tensor, last tensor first.
    fn backward(
        &mut self,
        dlogits: &[f32],
        hook: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
    ) -> Result<()>;
    /// Backward FLOPs per sample of each tensor (forward order), for a FLOP-based profile.
    fn backward_flops(&self) -> Vec<f64>;
    /// Element counts per tensor.
    fn param_sizes(&self) -> Vec<usize> {
        self.params().iter().map(Vec::len).collect()
    }
    /// A layer profile with backward times from FLOPs at `flops_per_s` and `batch`.
    fn profile(&self, batch: usize, flops_per_s: f64) -> Result<LayerProfile> {
        let layers = self
            .param_names()
            .into_iter()
            .zip(self.param_sizes())
            .zip(self.backward_flops())
            .map(|((name, numel), f)| Layer {
                name,
                numel,
                backward_s: f * batch as f64 / flops_per_s,
            })
            .collect();
        let fwd: f64 = self.backward_flops().iter().sum::<f64>() * 0.5 * batch as f64 / flops_per_s;
        LayerProfile::new(self.name(), fwd, layers)
    }
}

/// Softmax cross-entropy: mean loss, correct predictions, and `dlogits` (already divided
/// by the batch).
pub fn softmax_xent(
    logits: &[f32],
    labels: &[usize],
    classes: usize,
) -> Result<(f32, usize, Vec<f32>)> {
    if logits.len() != labels.len() * classes {
        return Err(Error::InvalidArgument(format!(
            "{} logits for {} labels × {classes} classes",
            logits.len(),
            labels.len()
        )));
    }
    let b = labels.len().max(1) as f32;
    let mut grad = vec![0.0; logits.len()];
    let mut loss = 0.0;
    let mut correct = 0;
    for (i, &y) in labels.iter().enumerate() {
        if y >= classes {
            return Err(Error::InvalidArgument(format!(
                "label {y} ≥ {classes} classes"
            )));
        }
        let row = &logits[i * classes..(i + 1) * classes];
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|v| (v - m).exp()).sum();
        let argmax = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(j, _)| j)
            .unwrap_or(0);
        correct += usize::from(argmax == y);
        loss += -(row[y] - m - sum.ln());
        for j in 0..classes {
            let p = (row[j] - m).exp() / sum;
            grad[i * classes + j] = (p - f32::from(j == y)) / b;
        }
    }
    Ok((loss / b, correct, grad))
}

fn init(rng: &mut impl Rng, n: usize, fan_in: usize) -> Vec<f32> {
    let std = (2.0 / fan_in as f32).sqrt();
    let d = Normal::new(0.0, std).unwrap_or_else(|_| unreachable!("positive std"));
    (0..n).map(|_| d.sample(rng)).collect()
}

/// `y = x·Wᵀ + b` for a batch; `w` is `out × in`.
fn linear_fwd(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    batch: usize,
    n_in: usize,
    n_out: usize,
) -> Vec<f32> {
    let mut y = vec![0.0; batch * n_out];
    for s in 0..batch {
        let xs = &x[s * n_in..(s + 1) * n_in];
        for o in 0..n_out {
            let wr = &w[o * n_in..(o + 1) * n_in];
            y[s * n_out + o] = b[o] + xs.iter().zip(wr).map(|(a, c)| a * c).sum::<f32>();
        }
    }
    y
}

/// Gradients of a linear layer: (dW, db, dx).
fn linear_bwd(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    batch: usize,
    n_in: usize,
    n_out: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dw = vec![0.0; n_out * n_in];
    let mut db = vec![0.0; n_out];
    let mut dx = vec![0.0; batch * n_in];
    for s in 0..batch {
        let xs = &x[s * n_in..(s + 1) * n_in];
        let dxs = &mut dx[s * n_in..(s + 1) * n_in];
        for o in 0..n_out {
            let g = dy[s * n_out + o];
            if g == 0.0 {
                continue;
            }
            db[o] += g;
            let dwr = &mut dw[o * n_in..(o + 1) * n_in];
            let wr = &w[o * n_in..(o + 1) * n_in];
            for i in 0..n_in {
                dwr[i] += g * xs[i];
                dxs[i] += g * wr[i];
            }
        }
    }
    (dw, db, dx)
}

/// A multi-layer perceptron with ReLU: tensors `fc{i}.weight`, `fc{i}.bias`.
#[derive(Clone)]
pub struct Mlp {
    dims: Vec<usize>,
    params: Vec<Vec<f32>>,
    /// Inputs of each linear layer from the last forward.
    acts: Vec<Vec<f32>>,
    batch: usize,
}

impl Mlp {
    /// An MLP with layer widths `dims` (input, hidden..., classes), He-initialised from `seed`.
    pub fn new(dims: &[usize], seed: u64) -> Result<Self> {
        if dims.len() < 2 || dims.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "MLP widths {dims:?}: need ≥ 2, all > 0"
            )));
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut params = Vec::new();
        for w in dims.windows(2) {
            params.push(init(&mut rng, w[0] * w[1], w[0]));
            params.push(vec![0.0; w[1]]);
        }
        Ok(Mlp {
            dims: dims.to_vec(),
            params,
            acts: Vec::new(),
            batch: 0,
        })
    }
}

impl Model for Mlp {
    fn name(&self) -> String {
        format!("mlp{:?}", self.dims)
    }
    fn params(&self) -> &[Vec<f32>] {
        &self.params
    }
    fn params_mut(&mut self) -> &mut [Vec<f32>] {
        &mut self.params
    }
    fn param_names(&self) -> Vec<String> {
        (0..self.dims.len() - 1)
            .flat_map(|i| [format!("fc{i}.weight"), format!("fc{i}.bias")])
            .collect()
    }
    fn input_dim(&self) -> usize {
        self.dims[0]
    }
    fn classes(&self) -> usize {
        self.dims[self.dims.len() - 1]
    }
    fn forward(&mut self, x: &[f32], batch: usize) -> Result<Vec<f32>> {
        if x.len() != batch * self.dims[0] {
            return Err(Error::InvalidArgument(format!(
                "input has {} values for batch {batch} × {}",
                x.len(),
                self.dims[0]
            )));
        }
        self.batch = batch;
        self.acts.clear();
        let mut h = x.to_vec();
        let n = self.dims.len() - 1;
        for i in 0..n {
            let y = linear_fwd(
                &h,
                &self.params[2 * i],
                &self.params[2 * i + 1],
                batch,
                self.dims[i],
                self.dims[i + 1],
            );
            self.acts.push(std::mem::replace(&mut h, y));
            if i + 1 < n {
                h.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
        Ok(h)
    }
    fn backward(
        &mut self,
        dlogits: &[f32],
        hook: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
    ) -> Result<()> {
        let n = self.dims.len() - 1;
        if self.acts.len() != n || dlogits.len() != self.batch * self.classes() {
            return Err(Error::InvalidArgument(
                "backward without a matching forward".into(),
            ));
        }
        let mut dy = dlogits.to_vec();
        for i in (0..n).rev() {
            let (dw, db, mut dx) = linear_bwd(
                &self.acts[i],
                &self.params[2 * i],
                &dy,
                self.batch,
                self.dims[i],
                self.dims[i + 1],
            );
            hook(2 * i + 1, &db)?;
            hook(2 * i, &dw)?;
            if i > 0 {
                // ReLU of layer i−1's output, which is this layer's input.
                for (d, a) in dx.iter_mut().zip(&self.acts[i]) {
                    if *a <= 0.0 {
                        *d = 0.0;
                    }
                }
            }
            dy = dx;
        }
        Ok(())
    }
    fn backward_flops(&self) -> Vec<f64> {
        self.dims
            .windows(2)
            .flat_map(|w| [4.0 * (w[0] * w[1]) as f64, w[1] as f64])
            .collect()
    }
}

/// A small convolutional net on `c × s × s` inputs: conv3×3(c→c1)+ReLU+avgpool2,
/// conv3×3(c1→c2)+ReLU+avgpool2, linear to the classes. Tensors: `conv1.weight`,
/// `conv1.bias`, `conv2.weight`, `conv2.bias`, `fc.weight`, `fc.bias`.
#[derive(Clone)]
pub struct SmallCnn {
    c: usize,
    s: usize,
    c1: usize,
    c2: usize,
    classes: usize,
    params: Vec<Vec<f32>>,
    batch: usize,
    cache: Vec<Vec<f32>>,
}

/// Visits the output/input position pairs `(yy·s + xx, iy·s + ix)` that kernel tap
/// `(ky, kx)` of a 3×3 convolution with padding 1 connects on an `s × s` plane (taps that
/// fall into the padding are skipped), row by row: the loop both passes share.
fn conv_tap(s: usize, ky: usize, kx: usize, mut f: impl FnMut(usize, usize)) {
    for yy in 0..s {
        let iy = yy + ky;
        if iy < 1 || iy > s {
            continue;
        }
        for xx in 0..s {
            let ix = xx + kx;
            if ix < 1 || ix > s {
                continue;
            }
            f(yy * s + xx, (iy - 1) * s + ix - 1);
        }
    }
}

/// 3×3 convolution, padding 1, on `b × cin × s × s`.
fn conv_fwd(
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    b: usize,
    cin: usize,
    cout: usize,
    s: usize,
) -> Vec<f32> {
    let mut y = vec![0.0; b * cout * s * s];
    for n in 0..b {
        for co in 0..cout {
            let yo = &mut y[(n * cout + co) * s * s..(n * cout + co + 1) * s * s];
            yo.iter_mut().for_each(|v| *v = bias[co]);
            for ci in 0..cin {
                let xi = &x[(n * cin + ci) * s * s..(n * cin + ci + 1) * s * s];
                let wk = &w[(co * cin + ci) * 9..(co * cin + ci + 1) * 9];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let wv = wk[ky * 3 + kx];
                        conv_tap(s, ky, kx, |o, i| yo[o] += wv * xi[i]);
                    }
                }
            }
        }
    }
    y
}

/// Gradients of [`conv_fwd`]: (dW, db, dx).
fn conv_bwd(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    b: usize,
    cin: usize,
    cout: usize,
    s: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dw = vec![0.0; cout * cin * 9];
    let mut db = vec![0.0; cout];
    let mut dx = vec![0.0; b * cin * s * s];
    for n in 0..b {
        for co in 0..cout {
            let dyo = &dy[(n * cout + co) * s * s..(n * cout + co + 1) * s * s];
            db[co] += dyo.iter().sum::<f32>();
            for ci in 0..cin {
                let base = (n * cin + ci) * s * s;
                for ky in 0..3 {
                    for kx in 0..3 {
                        let widx = (co * cin + ci) * 9 + ky * 3 + kx;
                        let wv = w[widx];
                        let mut acc = 0.0;
                        conv_tap(s, ky, kx, |o, i| {
                            let g = dyo[o];
                            acc += g * x[base + i];
                            dx[base + i] += g * wv;
                        });
                        dw[widx] += acc;
                    }
                }
            }
        }
    }
    (dw, db, dx)
}

fn relu_pool_fwd(y: &[f32], planes: usize, s: usize) -> Vec<f32> {
    let h = s / 2;
    let mut out = vec![0.0; planes * h * h];
    for p in 0..planes {
        for i in 0..h {
            for j in 0..h {
                let mut acc = 0.0;
                for (di, dj) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    acc += y[p * s * s + (2 * i + di) * s + 2 * j + dj].max(0.0);
                }
                out[p * h * h + i * h + j] = acc * 0.25;
            }
        }
    }
    out
}

fn relu_pool_bwd(y: &[f32], dout: &[f32], planes: usize, s: usize) -> Vec<f32> {
    let h = s / 2;
    let mut dy = vec![0.0; planes * s * s];
    for p in 0..planes {
        for i in 0..h {
            for j in 0..h {
                let g = dout[p * h * h + i * h + j] * 0.25;
                for (di, dj) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let k = p * s * s + (2 * i + di) * s + 2 * j + dj;
                    if y[k] > 0.0 {
                        dy[k] = g;
                    }
                }
            }
        }
    }
    dy
}

impl SmallCnn {
    /// A net for `channels × side × side` inputs (side divisible by 4) and `classes`.
    pub fn new(channels: usize, side: usize, classes: usize, seed: u64) -> Result<Self> {
        if channels == 0 || side == 0 || side % 4 != 0 || classes == 0 {
            return Err(Error::InvalidArgument(format!(
                "CNN input {channels}×{side}×{side} (side must be a positive multiple of 4), {classes} classes"
            )));
        }
        let (c1, c2) = (16, 32);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let flat = c2 * (side / 4) * (side / 4);
        let params = vec![
            init(&mut rng, c1 * channels * 9, channels * 9),
            vec![0.0; c1],
            init(&mut rng, c2 * c1 * 9, c1 * 9),
            vec![0.0; c2],
            init(&mut rng, classes * flat, flat),
            vec![0.0; classes],
        ];
        Ok(SmallCnn {
            c: channels,
            s: side,
            c1,
            c2,
            classes,
            params,
            batch: 0,
            cache: Vec::new(),
        })
    }
}

impl Model for SmallCnn {
    fn name(&self) -> String {
        format!("cnn{}x{}x{}", self.c, self.s, self.s)
    }
    fn params(&self) -> &[Vec<f32>] {
        &self.params
    }
    fn params_mut(&mut self) -> &mut [Vec<f32>] {
        &mut self.params
    }
    fn param_names(&self) -> Vec<String> {
        [
            "conv1.weight",
            "conv1.bias",
            "conv2.weight",
            "conv2.bias",
            "fc.weight",
            "fc.bias",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
    fn input_dim(&self) -> usize {
        self.c * self.s * self.s
    }
    fn classes(&self) -> usize {
        self.classes
    }
    fn forward(&mut self, x: &[f32], batch: usize) -> Result<Vec<f32>> {
        if x.len() != batch * self.input_dim() {
            return Err(Error::InvalidArgument(format!(
                "input has {} values for batch {batch} × {}",
                x.len(),
                self.input_dim()
            )));
        }
        let (s, h) = (self.s, self.s / 2);
        let y1 = conv_fwd(
            x,
            &self.params[0],
            &self.params[1],
            batch,
            self.c,
            self.c1,
            s,
        );
        let p1 = relu_pool_fwd(&y1, batch * self.c1, s);
        let y2 = conv_fwd(
            &p1,
            &self.params[2],
            &self.params[3],
            batch,
            self.c1,
            self.c2,
            h,
        );
        let p2 = relu_pool_fwd(&y2, batch * self.c2, h);
        let flat = self.c2 * (s / 4) * (s / 4);
        let logits = linear_fwd(
            &p2,
            &self.params[4],
            &self.params[5],
            batch,
            flat,
            self.classes,
        );
        self.batch = batch;
        self.cache = vec![x.to_vec(), y1, p1, y2, p2];
        Ok(logits)
    }
    fn backward(
        &mut self,
        dlogits: &[f32],
        hook: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
    ) -> Result<()> {
        if self.cache.len() != 5 || dlogits.len() != self.batch * self.classes {
            return Err(Error::InvalidArgument(
                "backward without a matching forward".into(),
            ));
        }
        let (s, h, b) = (self.s, self.s / 2, self.batch);
        let flat = self.c2 * (s / 4) * (s / 4);
        let (dw, db, dp2) = linear_bwd(
            &self.cache[4],
            &self.params[4],
            dlogits,
            b,
            flat,
            self.classes,
        );
        hook(5, &db)?;
        hook(4, &dw)?;
        let dy2 = relu_pool_bwd(&self.cache[3], &dp2, b * self.c2, h);
        let (dw, db, dp1) = conv_bwd(
            &self.cache[2],
            &self.params[2],
            &dy2,
            b,
            self.c1,
            self.c2,
            h,
        );
        hook(3, &db)?;
        hook(2, &dw)?;
        let dy1 = relu_pool_bwd(&self.cache[1], &dp1, b * self.c1, s);
        let (dw, db, _) = conv_bwd(&self.cache[0], &self.params[0], &dy1, b, self.c, self.c1, s);
        hook(1, &db)?;
        hook(0, &dw)?;
        Ok(())
    }
    fn backward_flops(&self) -> Vec<f64> {
        let (s, h) = (
            (self.s * self.s) as f64,
            ((self.s / 2) * (self.s / 2)) as f64,
        );
        let flat = (self.c2 * (self.s / 4) * (self.s / 4)) as f64;
        vec![
            4.0 * 9.0 * (self.c * self.c1) as f64 * s,
            self.c1 as f64 * s,
            4.0 * 9.0 * (self.c1 * self.c2) as f64 * h,
            self.c2 as f64 * h,
            4.0 * flat * self.classes as f64,
            self.classes as f64,
        ]
    }
}

/// A model whose forward and per-tensor backward also take fixed extra times (sleeps),
/// emulating an accelerator whose per-layer times come from a profile: the real gradients
/// are still computed, and the hooks fire after each tensor's emulated time.
pub struct EmulatedDevice {
    inner: Box<dyn Model>,
    forward_s: f64,
    backward_s: Vec<f64>,
}

impl EmulatedDevice {
    /// Wraps `inner` with the forward time and per-tensor backward times of `profile`.
    pub fn new(inner: Box<dyn Model>, profile: &LayerProfile) -> Result<Self> {
        if profile.sizes() != inner.param_sizes() {
            return Err(Error::InvalidArgument(
                "profile does not match the model's tensors".into(),
            ));
        }
        Ok(EmulatedDevice {
            forward_s: profile.forward_s(),
            backward_s: profile.layers().iter().map(|l| l.backward_s).collect(),
            inner,
        })
    }
}

fn sleep_s(t: f64) {
    if t > 0.0 && t.is_finite() {
        std::thread::sleep(std::time::Duration::from_secs_f64(t));
    }
}

impl Model for EmulatedDevice {
    fn name(&self) -> String {
        format!("emulated({})", self.inner.name())
    }
    fn params(&self) -> &[Vec<f32>] {
        self.inner.params()
    }
    fn params_mut(&mut self) -> &mut [Vec<f32>] {
        self.inner.params_mut()
    }
    fn param_names(&self) -> Vec<String> {
        self.inner.param_names()
    }
    fn input_dim(&self) -> usize {
        self.inner.input_dim()
    }
    fn classes(&self) -> usize {
        self.inner.classes()
    }
    fn forward(&mut self, x: &[f32], batch: usize) -> Result<Vec<f32>> {
        let y = self.inner.forward(x, batch)?;
        sleep_s(self.forward_s);
        Ok(y)
    }
    fn backward(
        &mut self,
        dlogits: &[f32],
        hook: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
    ) -> Result<()> {
        let times = self.backward_s.clone();
        self.inner.backward(dlogits, &mut |t, g| {
            sleep_s(times.get(t).copied().unwrap_or(0.0));
            hook(t, g)
        })
    }
    fn backward_flops(&self) -> Vec<f64> {
        self.inner.backward_flops()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finite-difference check of every tensor's gradient.
    #[allow(clippy::needless_range_loop)]
    fn grad_check(model: &mut dyn Model, x: &[f32], labels: &[usize]) {
        let b = labels.len();
        let logits = model.forward(x, b).unwrap();
        let (_, _, dl) = softmax_xent(&logits, labels, model.classes()).unwrap();
        let mut grads: Vec<Vec<f32>> = vec![Vec::new(); model.params().len()];
        let mut order = Vec::new();
        model
            .backward(&dl, &mut |t, g| {
                order.push(t);
                grads[t] = g.to_vec();
                Ok(())
            })
            .unwrap();
        let n = grads.len();
        assert_eq!(order, (0..n).rev().collect::<Vec<_>>());
        for t in 0..n {
            for i in [0, model.params()[t].len() / 2, model.params()[t].len() - 1] {
                let eps = 1e-2;
                model.params_mut()[t][i] += eps;
                let lp = softmax_xent(&model.forward(x, b).unwrap(), labels, model.classes())
                    .unwrap()
                    .0;
                model.params_mut()[t][i] -= 2.0 * eps;
                let lm = softmax_xent(&model.forward(x, b).unwrap(), labels, model.classes())
                    .unwrap()
                    .0;
                model.params_mut()[t][i] += eps;
                let num = (lp - lm) / (2.0 * eps);
                assert!(
                    (num - grads[t][i]).abs() < 2e-2 * (1.0 + num.abs()),
                    "tensor {t}[{i}]: numeric {num}, analytic {}",
                    grads[t][i]
                );
            }
        }
    }

    #[test]
    fn mlp_gradients_match_finite_differences() {
        let mut m = Mlp::new(&[5, 7, 3], 1).unwrap();
        let x: Vec<f32> = (0..10).map(|i| (i as f32 * 0.37).sin()).collect();
        grad_check(&mut m, &x, &[0, 2]);
    }

    #[test]
    fn cnn_gradients_match_finite_differences() {
        let mut m = SmallCnn::new(1, 4, 3, 2).unwrap();
        let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.53).cos()).collect();
        grad_check(&mut m, &x, &[1, 2]);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(Mlp::new(&[3], 0).is_err());
        assert!(SmallCnn::new(1, 6, 3, 0).is_err());
        let mut m = Mlp::new(&[3, 2], 0).unwrap();
        assert!(m.forward(&[1.0; 5], 2).is_err());
        assert!(softmax_xent(&[0.0; 4], &[5, 0], 2).is_err());
    }
}
