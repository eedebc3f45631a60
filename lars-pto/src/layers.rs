//! The layer list an optimizer is built with, the skip list that exempts layers from
//! layer-wise adaptation, and the shape checks of per-layer tensor lists.

use collectives::Communicator;

use crate::error::Tensor;
use crate::fingerprint::Fingerprint;
use crate::pto::Pto;
use crate::{Error, Result};

/// One layer (parameter tensor) in the order the optimizer sees them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LayerSpec {
    /// Name, matched against the [`SkipList`].
    pub name: String,
    /// Number of elements.
    pub numel: usize,
    /// Exempt from layer-wise scaling and weight decay regardless of the name (for
    /// frameworks whose names do not say "bias" or "norm", e.g. every 1-D tensor).
    pub exclude: bool,
}

impl LayerSpec {
    /// A layer that the skip list decides about.
    pub fn new(name: impl Into<String>, numel: usize) -> Self {
        LayerSpec {
            name: name.into(),
            numel,
            exclude: false,
        }
    }

    /// The same layer, exempt (or not) whatever its name.
    pub fn excluded(mut self, exclude: bool) -> Self {
        self.exclude = exclude;
        self
    }
}

/// Case-insensitive name substrings of layers that get neither trust-ratio scaling nor
/// weight decay. The MLPerf ResNet-50 reference (TensorFlow LARS) skips
/// `['batch_normalization', 'bias']`; BERT's LAMB excludes `['LayerNorm', 'layer_norm',
/// 'bias']`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SkipList {
    patterns: Vec<String>,
}

impl Default for SkipList {
    /// Biases and normalisation layers under the usual names: `bias`, `norm` (batch norm,
    /// layer norm, `batch_normalization`) and `bn` (PyTorch ResNet's `bn1`, `bn2`, ...).
    fn default() -> Self {
        SkipList::new(["bias", "norm", "bn"])
    }
}

impl SkipList {
    /// A skip list of the given substrings.
    pub fn new<S: Into<String>>(patterns: impl IntoIterator<Item = S>) -> Self {
        SkipList {
            patterns: patterns
                .into_iter()
                .map(|p| p.into().to_lowercase())
                .filter(|p| !p.is_empty())
                .collect(),
        }
    }

    /// Skips nothing (every layer is adapted and decayed).
    pub fn none() -> Self {
        SkipList {
            patterns: Vec::new(),
        }
    }

    /// The MLPerf ResNet-50 reference list: `batch_normalization` and `bias`.
    pub fn mlperf_resnet() -> Self {
        SkipList::new(["batch_normalization", "bias"])
    }

    /// Whether a layer of this name is skipped.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.to_lowercase();
        self.patterns.iter().any(|p| name.contains(p.as_str()))
    }

    pub(crate) fn fingerprint(&self, fp: Fingerprint) -> Fingerprint {
        self.patterns
            .iter()
            .fold(fp.u64(self.patterns.len() as u64), |fp, p| fp.str(p))
    }
}

/// Which layers are exempt, by the explicit flag or the skip list.
pub(crate) fn exclusions(layers: &[LayerSpec], skip: &SkipList) -> Vec<bool> {
    layers
        .iter()
        .map(|l| l.exclude || skip.matches(&l.name))
        .collect()
}

/// Fingerprint of a layer list (names, sizes, exemptions).
pub(crate) fn fingerprint_layers(layers: &[LayerSpec], excluded: &[bool]) -> Fingerprint {
    layers.iter().zip(excluded).fold(
        Fingerprint::new().u64(layers.len() as u64),
        |fp, (l, &x)| fp.str(&l.name).u64(l.numel as u64).u64(u64::from(x)),
    )
}

/// The exemptions and the checked operator an optimizer is built on. Collective: every
/// rank checks that all ranks have the same layers and hyper-parameters (`cfg_fp`, the
/// config's fingerprint) and that `valid` (the config's validation) holds everywhere.
pub(crate) fn optimizer_operator<C: Communicator + ?Sized>(
    comm: &C,
    layers: &[LayerSpec],
    skip: &SkipList,
    cfg_fp: u64,
    valid: Result<()>,
) -> Result<(Vec<bool>, Pto)> {
    let excluded = exclusions(layers, skip);
    let salt = fingerprint_layers(layers, &excluded).u64(cfg_fp).finish();
    let numels: Vec<usize> = layers.iter().map(|l| l.numel).collect();
    let pto = Pto::with_check(comm, &numels, salt, valid)?;
    Ok((excluded, pto))
}

/// Checks a list of per-layer tensors against the layer sizes.
pub(crate) fn check_list<T: AsRef<[f32]>>(
    numels: &[usize],
    tensor: Tensor,
    xs: &[T],
) -> Result<()> {
    if xs.len() != numels.len() {
        return Err(Error::LayerCount {
            tensor,
            expected: numels.len(),
            got: xs.len(),
        });
    }
    for (layer, (x, &n)) in xs.iter().zip(numels).enumerate() {
        let got = x.as_ref().len();
        if got != n {
            return Err(Error::LayoutMismatch {
                layer,
                tensor,
                expected: n,
                got,
            });
        }
    }
    Ok(())
}

/// Checks weights and gradients: the same count as the layers, each gradient shaped like
/// its weight, each weight the size the layer list says.
pub(crate) fn check_pair<W: AsRef<[f32]>, G: AsRef<[f32]>>(
    numels: &[usize],
    weights: &[W],
    grads: &[G],
) -> Result<()> {
    for (tensor, got) in [(Tensor::Weight, weights.len()), (Tensor::Grad, grads.len())] {
        if got != numels.len() {
            return Err(Error::LayerCount {
                tensor,
                expected: numels.len(),
                got,
            });
        }
    }
    for (layer, (w, g)) in weights.iter().zip(grads).enumerate() {
        let (w, g) = (w.as_ref().len(), g.as_ref().len());
        if w != g {
            return Err(Error::ShapeMismatch {
                layer,
                weight: w,
                grad: g,
            });
        }
    }
    check_list(numels, Tensor::Weight, weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_skip_list_catches_bias_and_norm_layers() {
        let s = SkipList::default();
        for n in [
            "conv1.bias",
            "bn1.weight",
            "layer1.0.bn2.bias",
            "encoder.layer.0.attention.output.LayerNorm.weight",
            "resnet_model/batch_normalization/gamma",
        ] {
            assert!(s.matches(n), "{n}");
        }
        for n in ["conv1.weight", "fc.weight", "attention.self.query.weight"] {
            assert!(!s.matches(n), "{n}");
        }
        assert!(!SkipList::none().matches("bias"));
        assert!(SkipList::mlperf_resnet().matches("dense/bias"));
    }

    #[test]
    fn shape_checks_name_the_first_bad_layer() {
        let numels = [2, 3];
        let w = vec![vec![0.0f32; 2], vec![0.0; 3]];
        let g_bad = vec![vec![0.0f32; 2], vec![0.0; 4]];
        assert_eq!(
            check_pair(&numels, &w, &g_bad),
            Err(Error::ShapeMismatch {
                layer: 1,
                weight: 3,
                grad: 4
            })
        );
        assert_eq!(
            check_pair(&numels, &w[..1], &g_bad[..1]),
            Err(Error::LayerCount {
                tensor: Tensor::Weight,
                expected: 2,
                got: 1
            })
        );
        let w_big = vec![vec![0.0f32; 5], vec![0.0; 3]];
        assert!(matches!(
            check_pair(&numels, &w_big, &w_big),
            Err(Error::LayoutMismatch { layer: 0, .. })
        ));
        assert_eq!(check_pair(&numels, &w, &w), Ok(()));
    }
}
