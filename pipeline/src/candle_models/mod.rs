//! The built-in candle models, each a [`crate::staged::Staged`] chain: ResNet-20 (He et
//! al., CIFAR variant), VGG-16 with batch norm (the CIFAR-10 shape of OMGS-SGD (Shi et al.,
//! INFOCOM 2020)), and a 2-layer LSTM language model in its LSTM-PTB shape.
//!
//! Stages are the units of layer-wise readiness: ResNet-20's stem, each residual block and
//! the head; each of VGG's conv-BN-ReLU(-pool) blocks and the classifier; the LSTM's
//! embedding, each LSTM layer and the decoder. The LSTM layers carry their final state
//! from one window to the next of the same stream (truncated BPTT; see [`LstmLm`]).

mod lstm;
mod resnet;
mod vgg;

pub use lstm::{LstmLm, LstmShape};
pub use resnet::resnet20;
pub use vgg::vgg16_bn;

use candle_core::{Module, ModuleT, Tensor};
use candle_nn::{BatchNorm, Conv2d, Conv2dConfig, VarBuilder};

/// Convolution (no bias) followed by batch norm, optionally ReLU.
pub(crate) struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm,
    relu: bool,
}

impl ConvBn {
    pub(crate) fn new(
        vb: VarBuilder,
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        relu: bool,
    ) -> candle_core::Result<Self> {
        let cfg = Conv2dConfig {
            padding: k / 2,
            stride,
            ..Conv2dConfig::default()
        };
        Ok(ConvBn {
            conv: candle_nn::conv2d_no_bias(cin, cout, k, cfg, vb.pp("conv"))?,
            bn: candle_nn::batch_norm(cout, 1e-5, vb.pp("bn"))?,
            relu,
        })
    }
}

impl ModuleT for ConvBn {
    fn forward_t(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let y = self.bn.forward_t(&self.conv.forward(x)?, train)?;
        if self.relu {
            y.relu()
        } else {
            Ok(y)
        }
    }
}
