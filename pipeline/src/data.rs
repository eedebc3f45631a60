//! Data sets for the built-in training: the [`Dataset`] trait a real loader implements
//! (for example over `datacache`), an in-memory implementation, and a generated
//! classification task (a random two-layer "teacher" network labels Gaussian inputs), so
//! training runs anywhere without downloads.

use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use crate::{Error, Result};

/// A labelled classification data set with fixed-size inputs.
pub trait Dataset: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;
    /// True when there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Features per sample.
    fn input_dim(&self) -> usize;
    /// Number of classes.
    fn classes(&self) -> usize;
    /// Copies sample `i`'s features into `out` (length `input_dim`) and returns its label.
    fn sample(&self, i: usize, out: &mut [f32]) -> Result<usize>;
}

/// Samples held in memory, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct InMemory {
    x: Vec<f32>,
    y: Vec<usize>,
    dim: usize,
    classes: usize,
}

impl InMemory {
    /// A data set from row-major features and labels; checks shapes and labels.
    pub fn new(x: Vec<f32>, y: Vec<usize>, dim: usize, classes: usize) -> Result<Self> {
        if dim == 0 || classes == 0 || x.len() != y.len() * dim {
            return Err(Error::InvalidArgument(format!(
                "{} features for {} labels of dimension {dim}, {classes} classes",
                x.len(),
                y.len()
            )));
        }
        if let Some(bad) = y.iter().find(|&&c| c >= classes) {
            return Err(Error::InvalidArgument(format!(
                "label {bad} ≥ {classes} classes"
            )));
        }
        Ok(InMemory { x, y, dim, classes })
    }

    /// Labels.
    pub fn labels(&self) -> &[usize] {
        &self.y
    }
}

impl Dataset for InMemory {
    fn len(&self) -> usize {
        self.y.len()
    }
    fn input_dim(&self) -> usize {
        self.dim
    }
    fn classes(&self) -> usize {
        self.classes
    }
    fn sample(&self, i: usize, out: &mut [f32]) -> Result<usize> {
        let label = *self.y.get(i).ok_or_else(|| {
            Error::InvalidArgument(format!("sample {i} outside 0..{}", self.y.len()))
        })?;
        if out.len() != self.dim {
            return Err(Error::InvalidArgument(format!(
                "output buffer of {} for dimension {}",
                out.len(),
                self.dim
            )));
        }
        out.copy_from_slice(&self.x[i * self.dim..(i + 1) * self.dim]);
        Ok(label)
    }
}

/// A generated task: inputs `x ~ N(0, I)` of `dim` features, labels
/// `argmax(W₂·tanh(W₁·x))` of a random teacher with 32 hidden units. Returns (train, test).
pub fn synthetic(
    train: usize,
    test: usize,
    dim: usize,
    classes: usize,
    seed: u64,
) -> Result<(InMemory, InMemory)> {
    if dim == 0 || classes < 2 || train == 0 || test == 0 {
        return Err(Error::InvalidArgument(format!(
            "synthetic data needs samples, dimension and ≥ 2 classes (train {train}, test {test}, dim {dim}, classes {classes})"
        )));
    }
    const HIDDEN: usize = 32;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n01 = Normal::new(0.0f32, 1.0).unwrap_or_else(|_| unreachable!("valid normal"));
    let w1: Vec<f32> = (0..HIDDEN * dim)
        .map(|_| n01.sample(&mut rng) / (dim as f32).sqrt())
        .collect();
    let w2: Vec<f32> = (0..classes * HIDDEN)
        .map(|_| n01.sample(&mut rng))
        .collect();
    let mut make = |n: usize| -> Result<InMemory> {
        let mut x = Vec::with_capacity(n * dim);
        let mut y = Vec::with_capacity(n);
        let mut h = [0.0f32; HIDDEN];
        for _ in 0..n {
            let xs: Vec<f32> = (0..dim).map(|_| n01.sample(&mut rng)).collect();
            for (j, hj) in h.iter_mut().enumerate() {
                *hj = w1[j * dim..(j + 1) * dim]
                    .iter()
                    .zip(&xs)
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    .tanh();
            }
            let label = (0..classes)
                .map(|c| {
                    w2[c * HIDDEN..(c + 1) * HIDDEN]
                        .iter()
                        .zip(&h)
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                })
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(c, _)| c)
                .unwrap_or(0);
            x.extend_from_slice(&xs);
            y.push(label);
        }
        InMemory::new(x, y, dim, classes)
    };
    let tr = make(train)?;
    let te = make(test)?;
    Ok((tr, te))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_is_deterministic_and_uses_every_class() {
        let (a, _) = synthetic(500, 10, 16, 4, 3).unwrap();
        let (b, _) = synthetic(500, 10, 16, 4, 3).unwrap();
        assert_eq!(a, b);
        for c in 0..4 {
            assert!(a.labels().iter().filter(|&&y| y == c).count() > 10);
        }
        let mut buf = vec![0.0; 16];
        assert!(a.sample(500, &mut buf).is_err());
        assert!(a.sample(0, &mut buf[..3]).is_err());
        assert!(synthetic(0, 1, 1, 2, 0).is_err());
        assert!(InMemory::new(vec![0.0; 4], vec![0, 3], 2, 2).is_err());
    }
}
