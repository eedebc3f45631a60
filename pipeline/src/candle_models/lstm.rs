//! A 2-layer LSTM language model in the LSTM-PTB shape of OMGS-SGD (Shi et al., INFOCOM
//! 2020): embedding, two LSTM layers, a linear decoder over the vocabulary (vocabulary
//! 10,000, 1,500 units: about 66 M parameters). Input `u32 [batch, steps]` token ids,
//! output logits `[batch · steps, vocab]` for next-token targets `u32 [batch · steps]`.
//!
//! **Truncated BPTT.** As in the PyTorch `word_language_model` that the LSTM-PTB
//! experiments train, each LSTM layer starts a window from the final `(h, c)` of the
//! previous window of the same mode, row by row (row `b` of consecutive batches is one
//! stream: [`datacache::stream_batches`]), detached so that no gradient crosses windows.
//! Training and evaluation carry separate states ([`Staged::reset_state`]): evaluation
//! never disturbs the training state. A state starts from zeros after a reset, and when
//! the batch's row count differs from the state's. The training state is what
//! [`Staged::carried_state`] exposes to checkpoints.

use std::sync::{Arc, Mutex};

use candle_core::{Module, ModuleT, Tensor};
use candle_nn::rnn::{LSTMConfig, LSTMState, RNN};
use candle_nn::{Embedding, Linear, LSTM};

use crate::staged::{Staged, Stages};
use crate::{Error, Result};

/// Sizes of the language model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LstmShape {
    /// Vocabulary size.
    pub vocab: usize,
    /// Embedding width.
    pub embed: usize,
    /// Hidden units of each LSTM layer.
    pub hidden: usize,
}

impl LstmShape {
    /// The LSTM-PTB model of OMGS-SGD: vocabulary 10,000, 1,500 units.
    pub const PTB: LstmShape = LstmShape {
        vocab: 10_000,
        embed: 1_500,
        hidden: 1_500,
    };

    /// A small model for the shipped corpus and tests: vocabulary 2,000 (that of
    /// `data/kjv-gospels`), 128 units.
    pub const SMALL: LstmShape = LstmShape {
        vocab: 2_000,
        embed: 128,
        hidden: 128,
    };
}

struct Embed(Embedding);
impl ModuleT for Embed {
    fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
        self.0.forward(x)
    }
}

/// The final `(h, c)` of the last window of each mode, detached (`None`: start from
/// zeros).
#[derive(Default)]
struct Carried {
    train: Mutex<Option<LSTMState>>,
    eval: Mutex<Option<LSTMState>>,
}

impl Carried {
    fn slot(
        &self,
        train: bool,
    ) -> candle_core::Result<std::sync::MutexGuard<'_, Option<LSTMState>>> {
        let m = if train { &self.train } else { &self.eval };
        m.lock()
            .map_err(|_| candle_core::Error::Msg("poisoned LSTM state".into()))
    }
}

/// One LSTM layer that starts each window from the carried state of its mode.
struct Layer {
    lstm: LSTM,
    carried: Arc<Carried>,
}

impl ModuleT for Layer {
    fn forward_t(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let rows = x.dim(0)?;
        let mut slot = self.carried.slot(train)?;
        let init = match slot.take() {
            Some(s) if s.h.dim(0)? == rows => s,
            _ => self.lstm.zero_state(rows)?,
        };
        let states = self.lstm.seq_init(x, &init)?;
        let last = states
            .last()
            .ok_or_else(|| candle_core::Error::Msg("an LSTM window of 0 steps".into()))?;
        *slot = Some(LSTMState::new(last.h.detach(), last.c.detach()));
        self.lstm.states_to_tensor(&states)
    }
}

struct Decoder(Linear);
impl ModuleT for Decoder {
    fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
        let (b, t, h) = x.dims3()?;
        self.0.forward(&x.reshape((b * t, h))?)
    }
}

/// Stages of the model: embedding, then the LSTM layers, then the decoder.
const FIRST_LSTM_STAGE: usize = 1;

/// The language model: four stages (embedding, LSTM 1, LSTM 2, decoder). See the module
/// docs for the state it carries between windows.
pub struct LstmLm {
    inner: Stages,
    hidden: usize,
    /// The carried state of each LSTM layer (stage `FIRST_LSTM_STAGE + i`).
    carried: Vec<Arc<Carried>>,
}

impl LstmLm {
    /// A model of `shape`, initialised from `seed`.
    pub fn new(shape: LstmShape, seed: u64) -> Result<Self> {
        if shape.vocab < 2 || shape.embed == 0 || shape.hidden == 0 {
            return Err(Error::InvalidArgument(format!("bad LSTM shape {shape:?}")));
        }
        let mut m = Stages::new("lstm_ptb", seed);
        m.push("embed", |vb| {
            Ok(Embed(candle_nn::embedding(shape.vocab, shape.embed, vb)?))
        })?;
        let mut carried = Vec::new();
        for (i, input) in [shape.embed, shape.hidden].into_iter().enumerate() {
            let state = Arc::new(Carried::default());
            carried.push(state.clone());
            m.push(&format!("lstm{i}"), |vb| {
                Ok(Layer {
                    lstm: candle_nn::lstm(input, shape.hidden, LSTMConfig::default(), vb)?,
                    carried: state,
                })
            })?;
        }
        m.push("decoder", |vb| {
            Ok(Decoder(candle_nn::linear(shape.hidden, shape.vocab, vb)?))
        })?;
        Ok(LstmLm {
            inner: m,
            hidden: shape.hidden,
            carried,
        })
    }

    /// Stage `i`'s carried state, if `i` is an LSTM layer.
    fn layer(&self, i: usize) -> Option<&Carried> {
        i.checked_sub(FIRST_LSTM_STAGE)
            .and_then(|l| self.carried.get(l))
            .map(|c| &**c)
    }
}

impl Staged for LstmLm {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn num_stages(&self) -> usize {
        self.inner.num_stages()
    }
    fn forward_stage(&self, i: usize, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        self.inner.forward_stage(i, x, train)
    }
    fn stage_params(&self, i: usize) -> &[(String, candle_core::Var)] {
        self.inner.stage_params(i)
    }
    fn reset_state(&self, train: bool) -> candle_core::Result<()> {
        for c in &self.carried {
            *c.slot(train)? = None;
        }
        Ok(())
    }
    /// An LSTM layer's `[h, c]` (each `[streams, hidden]`), or nothing before its first
    /// training window and after a reset.
    fn carried_state(&self, i: usize) -> candle_core::Result<Vec<Tensor>> {
        Ok(match self.layer(i) {
            Some(c) => c
                .slot(true)?
                .as_ref()
                .map(|s| vec![s.h.clone(), s.c.clone()])
                .unwrap_or_default(),
            None => Vec::new(),
        })
    }
    fn set_carried_state(&self, i: usize, state: &[Tensor]) -> candle_core::Result<()> {
        let Some(c) = self.layer(i) else {
            if state.is_empty() {
                return Ok(());
            }
            candle_core::bail!("stage {i} of `{}` carries no state", self.name());
        };
        let new = match state {
            [] => None,
            [h, c] => {
                let (hb, hh) = h.dims2()?;
                if c.dims2()? != (hb, hh) || hh != self.hidden {
                    candle_core::bail!(
                        "stage {i}: LSTM state of shapes {:?} and {:?}, expected [rows, {}] twice",
                        h.dims(),
                        c.dims(),
                        self.hidden
                    );
                }
                Some(LSTMState::new(h.detach(), c.detach()))
            }
            _ => candle_core::bail!(
                "stage {i}: an LSTM state is (h, c), got {} tensors",
                state.len()
            ),
        };
        *c.slot(true)? = new;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::staged::{forward, forward_train, get_carried, set_carried};
    use candle_core::Device;

    fn model() -> LstmLm {
        let shape = LstmShape {
            vocab: 30,
            embed: 6,
            hidden: 8,
        };
        LstmLm::new(shape, 3).unwrap()
    }

    /// Two consecutive windows of 3 streams: `(inputs, targets)` of each.
    fn windows() -> [(Tensor, Tensor); 2] {
        let stream: Vec<Vec<u32>> = (0..3)
            .map(|s| (0..9).map(|t| ((t * 7 + s * 11) % 30) as u32).collect())
            .collect();
        let cut = |from: usize| {
            let x: Vec<u32> = stream
                .iter()
                .flat_map(|r| r[from..from + 4].to_vec())
                .collect();
            let y: Vec<u32> = stream
                .iter()
                .flat_map(|r| r[from + 1..from + 5].to_vec())
                .collect();
            (
                Tensor::from_vec(x, (3, 4), &Device::Cpu).unwrap(),
                Tensor::from_vec(y, 12, &Device::Cpu).unwrap(),
            )
        };
        [cut(0), cut(4)]
    }

    fn train_loss(m: &LstmLm, (x, y): &(Tensor, Tensor)) -> f32 {
        let f = forward_train(m, x).unwrap();
        m.loss(f.logits(), y).unwrap().to_scalar::<f32>().unwrap()
    }

    #[test]
    fn the_second_window_starts_from_the_first_ones_state() {
        let [a, b] = windows();
        let m = model();
        assert!(get_carried(&m).unwrap().iter().all(Vec::is_empty));
        train_loss(&m, &a);
        let state = get_carried(&m).unwrap();
        assert_eq!(state.iter().map(Vec::len).collect::<Vec<_>>(), [0, 2, 2, 0]);
        assert_eq!(state[2][0].dims, [3, 8]);
        assert!(state[2][1].values.iter().any(|&v| v != 0.0));
        let carried = train_loss(&m, &b);
        // A fresh model (same weights) and a reset one start the window from zeros.
        let fresh = train_loss(&model(), &b);
        m.reset_state(true).unwrap();
        assert!(get_carried(&m).unwrap().iter().all(Vec::is_empty));
        let reset = train_loss(&m, &b);
        assert_eq!(fresh.to_bits(), reset.to_bits());
        assert_ne!(carried, fresh, "the carried state changes nothing");
        // Saved and restored, the state reproduces the carried window bit for bit.
        set_carried(&m, &state).unwrap();
        assert_eq!(train_loss(&m, &b).to_bits(), carried.to_bits());
    }

    #[test]
    fn evaluation_keeps_its_own_state_and_a_new_row_count_starts_from_zeros() {
        let [a, b] = windows();
        let m = model();
        train_loss(&m, &a);
        let before = get_carried(&m).unwrap();
        // Evaluation carries its own state: the second window differs from a fresh one's.
        let eval = |x: &Tensor| forward(&m, x, false).unwrap().to_vec2::<f32>().unwrap();
        m.reset_state(false).unwrap();
        let first = eval(&a.0);
        let second = eval(&b.0);
        m.reset_state(false).unwrap();
        assert_eq!(eval(&a.0), first, "the evaluation reset");
        assert_ne!(eval(&a.0), first, "the evaluation state is carried");
        assert_ne!(second, first);
        assert_eq!(
            get_carried(&m).unwrap(),
            before,
            "evaluation moved the training state"
        );
        // Two streams instead of three: no state of that shape, so zeros.
        let two = |t: &Tensor| t.narrow(0, 0, 2).unwrap();
        let fresh = model();
        let f = forward(&fresh, &two(&b.0), true).unwrap();
        let g = forward(&m, &two(&b.0), true).unwrap();
        assert_eq!(f.to_vec2::<f32>().unwrap(), g.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn a_state_that_does_not_fit_is_an_error() {
        let m = model();
        let t = |r: usize, c: usize| {
            Tensor::zeros((r, c), candle_core::DType::F32, &Device::Cpu).unwrap()
        };
        assert!(m.set_carried_state(1, &[t(3, 8), t(3, 8)]).is_ok());
        assert!(m.set_carried_state(1, &[t(3, 8), t(2, 8)]).is_err());
        assert!(m.set_carried_state(1, &[t(3, 7), t(3, 7)]).is_err());
        assert!(m.set_carried_state(1, &[t(3, 8)]).is_err());
        assert!(m.set_carried_state(0, &[t(3, 8), t(3, 8)]).is_err());
        assert!(m.set_carried_state(0, &[]).is_ok());
        assert!(set_carried(&m, &[vec![], vec![]]).is_err());
        // Dims whose product overflows (a corrupt checkpoint): an error, not a panic.
        let huge = crate::staged::HostTensor {
            dims: vec![usize::MAX, 2],
            values: vec![0.0; 2],
        };
        let state = vec![vec![], vec![huge.clone(), huge], vec![], vec![]];
        assert!(set_carried(&m, &state).is_err());
    }
}
