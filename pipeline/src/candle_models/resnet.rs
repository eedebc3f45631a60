//! ResNet-20 (He et al., "Deep Residual Learning", §4.2): a 3×3 stem of 16 channels, three
//! stages of three basic blocks (16, 32, 64 channels, stride 2 entering stages 2 and 3,
//! 1×1 projection shortcuts where the shape changes), global average pooling and a linear
//! classifier; about 0.27 M parameters.

use candle_core::{Module, ModuleT, Tensor};
use candle_nn::{Linear, VarBuilder};

use super::ConvBn;
use crate::staged::Stages;
use crate::{Error, Result};

struct BasicBlock {
    a: ConvBn,
    b: ConvBn,
    shortcut: Option<ConvBn>,
}

impl BasicBlock {
    fn new(vb: VarBuilder, cin: usize, cout: usize, stride: usize) -> candle_core::Result<Self> {
        let shortcut = if stride != 1 || cin != cout {
            Some(ConvBn::new(vb.pp("shortcut"), cin, cout, 1, stride, false)?)
        } else {
            None
        };
        Ok(BasicBlock {
            a: ConvBn::new(vb.pp("a"), cin, cout, 3, stride, true)?,
            b: ConvBn::new(vb.pp("b"), cout, cout, 3, 1, false)?,
            shortcut,
        })
    }
}

impl ModuleT for BasicBlock {
    fn forward_t(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let y = self.b.forward_t(&self.a.forward_t(x, train)?, train)?;
        let s = match &self.shortcut {
            Some(s) => s.forward_t(x, train)?,
            None => x.clone(),
        };
        (y + s)?.relu()
    }
}

struct Head(Linear);

impl ModuleT for Head {
    fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
        self.0.forward(&x.mean((2, 3))?)
    }
}

/// ResNet-20 for `channels × side × side` inputs (`side` ≥ 4; 32 for CIFAR-10, 8 for the
/// 8×8 digits) and `classes` outputs, initialised from `seed`. Eleven stages: the stem,
/// nine basic blocks, the head.
pub fn resnet20(channels: usize, side: usize, classes: usize, seed: u64) -> Result<Stages> {
    if channels == 0 || side < 4 || classes < 2 {
        return Err(Error::InvalidArgument(format!(
            "resnet20 needs channels ≥ 1, side ≥ 4 and ≥ 2 classes (got {channels}, {side}, {classes})"
        )));
    }
    let mut m = Stages::new("resnet20", seed);
    m.push("stem", |vb| ConvBn::new(vb, channels, 16, 3, 1, true))?;
    let mut cin = 16;
    for (stage, cout) in [16usize, 32, 64].into_iter().enumerate() {
        for block in 0..3 {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            m.push(&format!("layer{}.{block}", stage + 1), |vb| {
                BasicBlock::new(vb, cin, cout, stride)
            })?;
            cin = cout;
        }
    }
    m.push("fc", |vb| Ok(Head(candle_nn::linear(64, classes, vb)?)))?;
    Ok(m)
}
