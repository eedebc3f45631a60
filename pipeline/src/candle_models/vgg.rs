//! VGG-16 with batch norm in its CIFAR-10 shape (Simonyan & Zisserman, configuration D,
//! with BN after every convolution and a single 512 → classes linear classifier, as in the
//! CIFAR-10 VGG-16 of OMGS-SGD's experiments): about 14.7 M parameters.

use candle_core::{Module, ModuleT, Tensor};
use candle_nn::Linear;

use super::ConvBn;
use crate::staged::Stages;
use crate::{Error, Result};

/// Configuration D: output channels, `0` for a 2×2 max pool.
const CFG: [usize; 18] = [
    64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
];

struct Block {
    conv: ConvBn,
    pool: bool,
}

impl ModuleT for Block {
    fn forward_t(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let y = self.conv.forward_t(x, train)?;
        if self.pool {
            y.max_pool2d(2)
        } else {
            Ok(y)
        }
    }
}

struct Classifier(Linear);

impl ModuleT for Classifier {
    fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
        self.0.forward(&x.mean((2, 3))?)
    }
}

/// VGG-16-BN for `channels × side × side` inputs (`side` a multiple of 32) and `classes`
/// outputs. `width_div` divides every channel count (1 for the real model; larger for
/// small tests). Fourteen stages: thirteen conv-BN-ReLU(-pool) blocks and the classifier.
pub fn vgg16_bn(
    channels: usize,
    side: usize,
    classes: usize,
    width_div: usize,
    seed: u64,
) -> Result<Stages> {
    if channels == 0 || side == 0 || side % 32 != 0 || classes < 2 || width_div == 0 {
        return Err(Error::InvalidArgument(format!(
            "vgg16_bn needs a side that is a multiple of 32, ≥ 2 classes and width_div ≥ 1 (got side {side}, {classes} classes, width_div {width_div})"
        )));
    }
    let mut m = Stages::new("vgg16_bn", seed);
    let mut cin = channels;
    let mut i = 0;
    while i < CFG.len() {
        let cout = (CFG[i] / width_div).max(1);
        let pool = CFG.get(i + 1) == Some(&0);
        m.push(&format!("features.{i}"), |vb| {
            Ok(Block {
                conv: ConvBn::new(vb, cin, cout, 3, 1, true)?,
                pool,
            })
        })?;
        cin = cout;
        i += if pool { 2 } else { 1 };
    }
    m.push("classifier", |vb| {
        Ok(Classifier(candle_nn::linear(cin, classes, vb)?))
    })?;
    Ok(m)
}
