//! A 2-layer LSTM language model in the LSTM-PTB shape of OMGS-SGD (Shi et al., INFOCOM
//! 2020): embedding, two LSTM layers, a linear decoder over the vocabulary (vocabulary
//! 10,000, 1,500 units: about 66 M parameters). Input `u32 [batch, steps]` token ids,
//! output logits `[batch · steps, vocab]` for next-token targets `u32 [batch · steps]`.

use candle_core::{Module, ModuleT, Tensor};
use candle_nn::rnn::{LSTMConfig, RNN};
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

struct Layer(LSTM);
impl ModuleT for Layer {
    fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
        let states = self.0.seq(x)?;
        self.0.states_to_tensor(&states)
    }
}

struct Decoder(Linear);
impl ModuleT for Decoder {
    fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
        let (b, t, h) = x.dims3()?;
        self.0.forward(&x.reshape((b * t, h))?)
    }
}

/// The language model: four stages (embedding, LSTM 1, LSTM 2, decoder).
pub struct LstmLm {
    inner: Stages,
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
        for (i, input) in [shape.embed, shape.hidden].into_iter().enumerate() {
            m.push(&format!("lstm{i}"), |vb| {
                Ok(Layer(candle_nn::lstm(
                    input,
                    shape.hidden,
                    LSTMConfig::default(),
                    vb,
                )?))
            })?;
        }
        m.push("decoder", |vb| {
            Ok(Decoder(candle_nn::linear(shape.hidden, shape.vocab, vb)?))
        })?;
        Ok(LstmLm { inner: m })
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
}
