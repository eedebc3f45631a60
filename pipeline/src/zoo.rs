//! Built-in layer profiles of the models of OMGS-SGD (Shi et al., INFOCOM 2020) §V (Table IV-V) and
//! BERT-base, generated from their architecture definitions (loops over blocks), with the exact
//! parameter-tensor element counts in forward (`named_parameters`) order of the PyTorch models the
//! paper trained, and backward times from a FLOP estimate.
//!
//! | name | tensors | source of the definition |
//! | --- | --- | --- |
//! | `vgg16` | 54 | VGG-16 with batch norm for CIFAR-10 (conv with bias, BN, one linear 512→10) |
//! | `resnet50` | 161 | torchvision ResNet-50 (conv without bias, BN, fc 2048→1000) |
//! | `inception_v4` | 449 | Inception-v4 (Szegedy et al. 2017) as in `pretrainedmodels` (149 BasicConv2d = conv + BN, last linear) |
//! | `lstm_ptb` | 11 | 2-layer LSTM language model on PTB (vocab 10 000, 1500 embedding and hidden, untied decoder) |
//! | `bert_base` | 199 | BERT-base (12 layers, 768 hidden, 3072 intermediate, vocab 30 522, pooler) |
//!
//! Backward times: `2 ×` the forward FLOPs of the op that owns the tensor (gradient of the input
//! plus gradient of the weight), at the per-worker batch of OMGS-SGD (Shi et al., INFOCOM 2020)
//! Table IV, on a device of [`DEVICE_FLOPS`] sustained FLOP/s; element-wise tensors (biases, BN)
//! are charged a few FLOPs per activation. A profile file or the runtime's measurement replaces
//! these estimates where precision matters.

use crate::profile::{Layer, LayerProfile};
use crate::{Error, Result};

/// Sustained FLOP/s assumed for the paper's Nvidia P102-100 (10.8 TFLOP/s FP32 peak) on convolution
/// and GEMM backward. Chosen, not published: about 25% of peak, which puts ResNet-50's forward plus
/// backward at batch 16 near the 0.18 s OMGS-SGD (Shi et al., INFOCOM 2020) §I reports.
pub const DEVICE_FLOPS: f64 = 2.7e12;

/// Names of the built-in profiles.
pub const MODELS: [&str; 5] = ["vgg16", "resnet50", "inception_v4", "lstm_ptb", "bert_base"];

/// A built-in profile by name (see the module table).
pub fn profile(name: &str) -> Result<LayerProfile> {
    match name {
        "vgg16" => Ok(vgg16_cifar10()),
        "resnet50" => Ok(resnet50()),
        "inception_v4" | "inceptionv4" => Ok(inception_v4()),
        "lstm_ptb" | "lstm" => Ok(lstm_ptb()),
        "bert_base" | "bert" => Ok(bert_base()),
        other => Err(Error::UnknownModel(other.to_string())),
    }
}

/// Accumulates parameter tensors with the forward FLOPs of the op that owns them.
struct Net {
    model: &'static str,
    batch: f64,
    tensors: Vec<(String, usize, f64)>,
    forward_flops: f64,
}

impl Net {
    fn new(model: &'static str, batch: usize) -> Self {
        Net {
            model,
            batch: batch as f64,
            tensors: Vec::new(),
            forward_flops: 0.0,
        }
    }

    fn tensor(&mut self, name: String, numel: usize, fwd_flops_per_sample: f64) {
        let f = fwd_flops_per_sample * self.batch;
        self.forward_flops += f;
        self.tensors.push((name, numel, 2.0 * f));
    }

    /// Conv `cin→cout` with a `kh×kw` kernel producing `hw` output pixels.
    fn conv(
        &mut self,
        name: &str,
        cin: usize,
        cout: usize,
        k: (usize, usize),
        hw: usize,
        bias: bool,
    ) {
        let numel = cout * cin * k.0 * k.1;
        self.tensor(format!("{name}.weight"), numel, 2.0 * (numel * hw) as f64);
        if bias {
            self.tensor(format!("{name}.bias"), cout, (cout * hw) as f64);
        }
    }

    /// Batch norm over `c` channels of `hw` pixels (weight and bias).
    fn bn(&mut self, name: &str, c: usize, hw: usize) {
        let act = (c * hw) as f64;
        self.tensor(format!("{name}.weight"), c, 4.0 * act);
        self.tensor(format!("{name}.bias"), c, act);
    }

    /// Linear `n_in→n_out` applied to `tokens` positions per sample.
    fn linear(&mut self, name: &str, n_in: usize, n_out: usize, tokens: usize, bias: bool) {
        let numel = n_in * n_out;
        self.tensor(
            format!("{name}.weight"),
            numel,
            2.0 * (numel * tokens) as f64,
        );
        if bias {
            self.tensor(format!("{name}.bias"), n_out, (n_out * tokens) as f64);
        }
    }

    fn finish(self) -> LayerProfile {
        let layers = self
            .tensors
            .into_iter()
            .map(|(name, numel, flops)| Layer {
                name,
                numel,
                backward_s: flops / DEVICE_FLOPS,
            })
            .collect();
        // The generators only produce positive sizes and finite times.
        LayerProfile::new(self.model, self.forward_flops / DEVICE_FLOPS, layers)
            .unwrap_or_else(|e| unreachable!("built-in profile invalid: {e}"))
    }
}

/// VGG-16 with batch norm for CIFAR-10 (32×32 input), batch 128 (OMGS-SGD
/// (Shi et al., INFOCOM 2020) Table IV).
pub fn vgg16_cifar10() -> LayerProfile {
    const CFG: [usize; 18] = [
        64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
    ];
    let mut net = Net::new("vgg16", 128);
    let (mut cin, mut side, mut i) = (3, 32, 0);
    for &c in &CFG {
        if c == 0 {
            side /= 2;
            continue;
        }
        net.conv(&format!("features.{i}"), cin, c, (3, 3), side * side, true);
        net.bn(&format!("features.{}", i + 1), c, side * side);
        i += 3;
        cin = c;
    }
    net.linear("classifier", 512, 10, 1, true);
    net.finish()
}

/// torchvision ResNet-50 at 224×224, batch 16 (OMGS-SGD (Shi et al., INFOCOM 2020) Table IV).
pub fn resnet50() -> LayerProfile {
    let mut net = Net::new("resnet50", 16);
    net.conv("conv1", 3, 64, (7, 7), 112 * 112, false);
    net.bn("bn1", 64, 112 * 112);
    let mut inplanes = 64;
    for (stage, &(planes, blocks, side)) in [(64, 3, 56), (128, 4, 28), (256, 6, 14), (512, 3, 7)]
        .iter()
        .enumerate()
    {
        let hw = side * side;
        for b in 0..blocks {
            let p = format!("layer{}.{b}", stage + 1);
            // Stride on conv2 (torchvision v1.5); conv1 of the first block sees the larger map.
            let hw1 = if b == 0 && stage > 0 { hw * 4 } else { hw };
            net.conv(&format!("{p}.conv1"), inplanes, planes, (1, 1), hw1, false);
            net.bn(&format!("{p}.bn1"), planes, hw1);
            net.conv(&format!("{p}.conv2"), planes, planes, (3, 3), hw, false);
            net.bn(&format!("{p}.bn2"), planes, hw);
            net.conv(&format!("{p}.conv3"), planes, planes * 4, (1, 1), hw, false);
            net.bn(&format!("{p}.bn3"), planes * 4, hw);
            if b == 0 {
                net.conv(
                    &format!("{p}.downsample.0"),
                    inplanes,
                    planes * 4,
                    (1, 1),
                    hw,
                    false,
                );
                net.bn(&format!("{p}.downsample.1"), planes * 4, hw);
            }
            inplanes = planes * 4;
        }
    }
    net.linear("fc", 2048, 1000, 1, true);
    net.finish()
}

/// Inception-v4 at 299×299, batch 32 (OMGS-SGD (Shi et al., INFOCOM 2020) Table IV), in the
/// registration order of `pretrainedmodels`' `inceptionv4`: every conv is a BasicConv2d (conv
/// without bias + batch norm with weight and bias).
pub fn inception_v4() -> LayerProfile {
    let mut net = Net::new("inception_v4", 32);
    let basic =
        |net: &mut Net, name: String, cin: usize, cout: usize, k: (usize, usize), side: usize| {
            net.conv(&format!("{name}.conv"), cin, cout, k, side * side, false);
            net.bn(&format!("{name}.bn"), cout, side * side);
        };
    let f = |i: usize, rest: &str| format!("features.{i}.{rest}");
    // Stem.
    basic(&mut net, "features.0".into(), 3, 32, (3, 3), 149);
    basic(&mut net, "features.1".into(), 32, 32, (3, 3), 147);
    basic(&mut net, "features.2".into(), 32, 64, (3, 3), 147);
    basic(&mut net, f(3, "conv"), 64, 96, (3, 3), 73); // Mixed_3a
                                                       // Mixed_4a.
    basic(&mut net, f(4, "branch0.0"), 160, 64, (1, 1), 73);
    basic(&mut net, f(4, "branch0.1"), 64, 96, (3, 3), 71);
    basic(&mut net, f(4, "branch1.0"), 160, 64, (1, 1), 73);
    basic(&mut net, f(4, "branch1.1"), 64, 64, (1, 7), 73);
    basic(&mut net, f(4, "branch1.2"), 64, 64, (7, 1), 73);
    basic(&mut net, f(4, "branch1.3"), 64, 96, (3, 3), 71);
    basic(&mut net, f(5, "conv"), 192, 192, (3, 3), 35); // Mixed_5a
    let mut idx = 6;
    for _ in 0..4 {
        // Inception_A at 35×35.
        let s = 35;
        basic(&mut net, f(idx, "branch0"), 384, 96, (1, 1), s);
        basic(&mut net, f(idx, "branch1.0"), 384, 64, (1, 1), s);
        basic(&mut net, f(idx, "branch1.1"), 64, 96, (3, 3), s);
        basic(&mut net, f(idx, "branch2.0"), 384, 64, (1, 1), s);
        basic(&mut net, f(idx, "branch2.1"), 64, 96, (3, 3), s);
        basic(&mut net, f(idx, "branch2.2"), 96, 96, (3, 3), s);
        basic(&mut net, f(idx, "branch3.1"), 384, 96, (1, 1), s);
        idx += 1;
    }
    // Reduction_A 35 → 17.
    basic(&mut net, f(idx, "branch0"), 384, 384, (3, 3), 17);
    basic(&mut net, f(idx, "branch1.0"), 384, 192, (1, 1), 35);
    basic(&mut net, f(idx, "branch1.1"), 192, 224, (3, 3), 35);
    basic(&mut net, f(idx, "branch1.2"), 224, 256, (3, 3), 17);
    idx += 1;
    for _ in 0..7 {
        // Inception_B at 17×17.
        let s = 17;
        basic(&mut net, f(idx, "branch0"), 1024, 384, (1, 1), s);
        basic(&mut net, f(idx, "branch1.0"), 1024, 192, (1, 1), s);
        basic(&mut net, f(idx, "branch1.1"), 192, 224, (1, 7), s);
        basic(&mut net, f(idx, "branch1.2"), 224, 256, (7, 1), s);
        basic(&mut net, f(idx, "branch2.0"), 1024, 192, (1, 1), s);
        basic(&mut net, f(idx, "branch2.1"), 192, 192, (7, 1), s);
        basic(&mut net, f(idx, "branch2.2"), 192, 224, (1, 7), s);
        basic(&mut net, f(idx, "branch2.3"), 224, 224, (7, 1), s);
        basic(&mut net, f(idx, "branch2.4"), 224, 256, (1, 7), s);
        basic(&mut net, f(idx, "branch3.1"), 1024, 128, (1, 1), s);
        idx += 1;
    }
    // Reduction_B 17 → 8.
    basic(&mut net, f(idx, "branch0.0"), 1024, 192, (1, 1), 17);
    basic(&mut net, f(idx, "branch0.1"), 192, 192, (3, 3), 8);
    basic(&mut net, f(idx, "branch1.0"), 1024, 256, (1, 1), 17);
    basic(&mut net, f(idx, "branch1.1"), 256, 256, (1, 7), 17);
    basic(&mut net, f(idx, "branch1.2"), 256, 320, (7, 1), 17);
    basic(&mut net, f(idx, "branch1.3"), 320, 320, (3, 3), 8);
    idx += 1;
    for _ in 0..3 {
        // Inception_C at 8×8.
        let s = 8;
        basic(&mut net, f(idx, "branch0"), 1536, 256, (1, 1), s);
        basic(&mut net, f(idx, "branch1_0"), 1536, 384, (1, 1), s);
        basic(&mut net, f(idx, "branch1_1a"), 384, 256, (1, 3), s);
        basic(&mut net, f(idx, "branch1_1b"), 384, 256, (3, 1), s);
        basic(&mut net, f(idx, "branch2_0"), 1536, 384, (1, 1), s);
        basic(&mut net, f(idx, "branch2_1"), 384, 448, (3, 1), s);
        basic(&mut net, f(idx, "branch2_2"), 448, 512, (1, 3), s);
        basic(&mut net, f(idx, "branch2_3a"), 512, 256, (1, 3), s);
        basic(&mut net, f(idx, "branch2_3b"), 512, 256, (3, 1), s);
        basic(&mut net, f(idx, "branch3.1"), 1536, 256, (1, 1), s);
        idx += 1;
    }
    net.linear("last_linear", 1536, 1000, 1, true);
    net.finish()
}

/// The 2-layer LSTM language model of the PTB experiments: vocabulary 10 000, embedding and hidden
/// size 1500, untied decoder, batch 100 (OMGS-SGD (Shi et al., INFOCOM 2020) Table IV), 35 steps.
pub fn lstm_ptb() -> LayerProfile {
    const VOCAB: usize = 10_000;
    const H: usize = 1500;
    const STEPS: usize = 35;
    let mut net = Net::new("lstm_ptb", 100);
    net.tensor("encoder.weight".into(), VOCAB * H, (STEPS * H) as f64);
    for l in 0..2 {
        let n_in = H;
        net.tensor(
            format!("rnn.weight_ih_l{l}"),
            4 * H * n_in,
            2.0 * (4 * H * n_in * STEPS) as f64,
        );
        net.tensor(
            format!("rnn.weight_hh_l{l}"),
            4 * H * H,
            2.0 * (4 * H * H * STEPS) as f64,
        );
        net.tensor(format!("rnn.bias_ih_l{l}"), 4 * H, (4 * H * STEPS) as f64);
        net.tensor(format!("rnn.bias_hh_l{l}"), 4 * H, (4 * H * STEPS) as f64);
    }
    net.linear("decoder", H, VOCAB, STEPS, true);
    net.finish()
}

/// BERT-base (12 layers, hidden 768, 12 heads, intermediate 3072, vocabulary 30 522,
/// 512 positions, 2 token types, pooler) at sequence length 128, batch 32.
pub fn bert_base() -> LayerProfile {
    const H: usize = 768;
    const I: usize = 3072;
    const SEQ: usize = 128;
    let mut net = Net::new("bert_base", 32);
    let e = "embeddings";
    net.tensor(
        format!("{e}.word_embeddings.weight"),
        30_522 * H,
        (SEQ * H) as f64,
    );
    net.tensor(
        format!("{e}.position_embeddings.weight"),
        512 * H,
        (SEQ * H) as f64,
    );
    net.tensor(
        format!("{e}.token_type_embeddings.weight"),
        2 * H,
        (SEQ * H) as f64,
    );
    net.tensor(format!("{e}.LayerNorm.weight"), H, 4.0 * (SEQ * H) as f64);
    net.tensor(format!("{e}.LayerNorm.bias"), H, (SEQ * H) as f64);
    for l in 0..12 {
        let p = format!("encoder.layer.{l}");
        for qkv in ["query", "key", "value"] {
            net.linear(&format!("{p}.attention.self.{qkv}"), H, H, SEQ, true);
        }
        net.linear(&format!("{p}.attention.output.dense"), H, H, SEQ, true);
        net.tensor(
            format!("{p}.attention.output.LayerNorm.weight"),
            H,
            4.0 * (SEQ * H) as f64,
        );
        net.tensor(
            format!("{p}.attention.output.LayerNorm.bias"),
            H,
            (SEQ * H) as f64,
        );
        net.linear(&format!("{p}.intermediate.dense"), H, I, SEQ, true);
        net.linear(&format!("{p}.output.dense"), I, H, SEQ, true);
        net.tensor(
            format!("{p}.output.LayerNorm.weight"),
            H,
            4.0 * (SEQ * H) as f64,
        );
        net.tensor(format!("{p}.output.LayerNorm.bias"), H, (SEQ * H) as f64);
    }
    net.linear("pooler.dense", H, H, 1, true);
    net.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_counts_and_totals_match_the_frameworks() {
        // (name, tensors, total parameters as PyTorch reports them)
        for (name, tensors, total) in [
            ("vgg16", 54, 14_728_266),
            ("resnet50", 161, 25_557_032),
            ("inception_v4", 449, 42_679_816),
            ("lstm_ptb", 11, 66_034_000),
            ("bert_base", 199, 109_482_240),
        ] {
            let p = profile(name).unwrap();
            assert_eq!(p.len(), tensors, "{name}");
            assert_eq!(p.total_numel(), total, "{name}");
            assert!(p.total_backward_s() > 0.0 && p.forward_s() > 0.0);
        }
        assert!(matches!(profile("alexnet"), Err(Error::UnknownModel(_))));
    }

    #[test]
    fn names_follow_forward_order() {
        let r = resnet50();
        assert_eq!(r.layers()[0].name, "conv1.weight");
        assert_eq!(r.layers()[0].numel, 9408);
        assert_eq!(r.layers()[160].name, "fc.bias");
        let i = inception_v4();
        assert_eq!(i.layers()[448].name, "last_linear.bias");
    }
}
