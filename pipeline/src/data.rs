//! Training input through `datacache`: the MNIST IDX and CIFAR-10 binary readers behind a
//! memory level (decoded tensors) and an optional disk level (raw bytes, kept across
//! runs), per-rank shards, a per-epoch order that is a pure function of `(seed, epoch)`,
//! and background prefetch.
//!
//! Data sets:
//! - [`ImageData::digits`]: real handwritten digits in MNIST IDX format (the 1,797 8×8
//!   digits that scikit-learn ships, converted by the repository's
//!   `tools/digits_to_idx.py` into `data/digits/`);
//! - [`ImageData::cifar10`]: the CIFAR-10 binary release (`--data DIR`);
//! - [`ImageData::generated_cifar10`]: generated files in CIFAR-10 format, for throughput.
//!
//! Missing or corrupt files, missing labels and labels outside the classes are
//! [`Error::Data`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Device, Tensor};
use datacache::{
    Cifar10Decoder, Cifar10Source, DataCache, Decoder, Loader, LoaderConfig, MnistSource,
    ShardMode, ShardPlan, Source, U8Decoder,
};
use rand::{Rng, SeedableRng};

use crate::{Error, Result};

/// Where the data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSpec {
    /// MNIST IDX files (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
    /// `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`) in a folder, e.g. `data/digits`.
    Idx(PathBuf),
    /// The CIFAR-10 binary release in a folder (`data_batch_1.bin` … `data_batch_5.bin`,
    /// `test_batch.bin`).
    Cifar10(PathBuf),
    /// Generated CIFAR-10-format files written to a folder: train and test samples.
    GeneratedCifar10 {
        /// Folder to write to.
        dir: PathBuf,
        /// Training samples.
        train: usize,
        /// Test samples.
        test: usize,
    },
}

/// The digits shipped in the repository (`data/digits`), found from this crate's folder.
pub fn digits_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("data")
        .join("digits")
}

/// A labelled image data set: training and test caches and the sample shape.
pub struct ImageData {
    train: Arc<DataCache>,
    test: Arc<DataCache>,
    /// `[channels, height, width]` of one sample.
    pub shape: [usize; 3],
    /// Number of classes.
    pub classes: usize,
    /// Short name for reports.
    pub name: String,
}

/// Options of the cache levels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CacheOptions {
    /// Disk level folder (raw bytes), `None` for no disk level.
    pub disk: Option<PathBuf>,
    /// Memory level bytes (decoded tensors); 0 picks 256 MiB.
    pub memory_bytes: u64,
}

fn build_cache(
    source: Arc<dyn Source>,
    decoder: Arc<dyn Decoder>,
    opts: &CacheOptions,
    namespace: &str,
) -> Result<Arc<DataCache>> {
    let mut b = DataCache::builder_arc(source, decoder).memory(if opts.memory_bytes == 0 {
        256 << 20
    } else {
        opts.memory_bytes
    });
    if let Some(d) = &opts.disk {
        b = b.disk(d, 1 << 30).namespace(namespace);
    }
    Ok(Arc::new(b.build()?))
}

fn need(path: PathBuf) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Data(format!("missing data file {}", path.display())))
    }
}

impl ImageData {
    /// Opens `spec` with the cache levels of `opts`.
    pub fn open(spec: &DataSpec, opts: &CacheOptions) -> Result<Self> {
        match spec {
            DataSpec::Idx(dir) => Self::digits(dir, opts),
            DataSpec::Cifar10(dir) => Self::cifar10(dir, opts),
            DataSpec::GeneratedCifar10 { dir, train, test } => {
                Self::generated_cifar10(dir, *train, *test, 1, opts)
            }
        }
    }

    /// MNIST IDX files in `dir` (10 classes; samples `1 × rows × cols`).
    pub fn digits(dir: &Path, opts: &CacheOptions) -> Result<Self> {
        let open = |prefix: &str| -> Result<MnistSource> {
            let images = need(dir.join(format!("{prefix}-images-idx3-ubyte")))?;
            let labels = need(dir.join(format!("{prefix}-labels-idx1-ubyte")))?;
            Ok(MnistSource::open(&images, Some(&labels))?)
        };
        let tr = open("train")?;
        let te = open("t10k")?;
        let dims = tr.sample_dims().to_vec();
        if dims.len() != 2 || te.sample_dims() != dims.as_slice() {
            return Err(Error::Data(format!(
                "IDX images of shape {dims:?} (train) and {:?} (test): expected equal 2-D images",
                te.sample_dims()
            )));
        }
        let decoder: Arc<dyn Decoder> = Arc::new(U8Decoder::new(vec![1, dims[0], dims[1]]));
        let data = ImageData {
            train: build_cache(Arc::new(tr), decoder.clone(), opts, "idx-train")?,
            test: build_cache(Arc::new(te), decoder, opts, "idx-test")?,
            shape: [1, dims[0], dims[1]],
            classes: 10,
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "idx".into()),
        };
        data.check_labels()?;
        Ok(data)
    }

    /// The CIFAR-10 binary release in `dir`.
    pub fn cifar10(dir: &Path, opts: &CacheOptions) -> Result<Self> {
        let train: Vec<PathBuf> = (1..=5)
            .map(|i| need(dir.join(format!("data_batch_{i}.bin"))))
            .collect::<Result<_>>()?;
        Self::cifar10_files(&train, &need(dir.join("test_batch.bin"))?, opts, "cifar10")
    }

    fn cifar10_files(
        train: &[PathBuf],
        test: &Path,
        opts: &CacheOptions,
        name: &str,
    ) -> Result<Self> {
        let decoder: Arc<dyn Decoder> = Arc::new(Cifar10Decoder);
        let data = ImageData {
            train: build_cache(
                Arc::new(Cifar10Source::open(train)?),
                decoder.clone(),
                opts,
                &format!("{name}-train"),
            )?,
            test: build_cache(
                Arc::new(Cifar10Source::open(&[test])?),
                decoder,
                opts,
                &format!("{name}-test"),
            )?,
            shape: [3, 32, 32],
            classes: 10,
            name: name.into(),
        };
        data.check_labels()?;
        Ok(data)
    }

    /// Writes `train` and `test` generated samples in CIFAR-10 format into `dir` (random
    /// pixels, labels `i mod 10`; for throughput, not accuracy) and opens them.
    pub fn generated_cifar10(
        dir: &Path,
        train: usize,
        test: usize,
        seed: u64,
        opts: &CacheOptions,
    ) -> Result<Self> {
        if train == 0 || test == 0 {
            return Err(Error::InvalidArgument(
                "generated data needs train and test samples".into(),
            ));
        }
        std::fs::create_dir_all(dir)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut write = |file: &str, n: usize| -> Result<PathBuf> {
            let records: Vec<(u8, Vec<u8>)> = (0..n)
                .map(|i| {
                    let px = (0..datacache::source::CIFAR10_PIXELS)
                        .map(|_| rng.gen())
                        .collect();
                    ((i % 10) as u8, px)
                })
                .collect();
            let path = dir.join(file);
            datacache::formats::write_cifar10_batch(&path, &records)?;
            Ok(path)
        };
        let tr = write("data_batch_1.bin", train)?;
        let te = write("test_batch.bin", test)?;
        Self::cifar10_files(&[tr], &te, opts, "generated-cifar10")
    }

    /// Training samples.
    pub fn train_len(&self) -> usize {
        self.train.len()
    }

    /// Test samples.
    pub fn test_len(&self) -> usize {
        self.test.len()
    }

    /// Every label must exist and be a class: read once through the caches (which also
    /// warms them).
    fn check_labels(&self) -> Result<()> {
        for cache in [&self.train, &self.test] {
            if cache.is_empty() {
                return Err(Error::Data("a data set without samples".into()));
            }
            for i in 0..cache.len() {
                match cache.get(i)?.label {
                    Some(l) if (l as usize) < self.classes => {}
                    other => {
                        return Err(Error::Data(format!(
                            "sample {i}: label {other:?} is not one of {} classes",
                            self.classes
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Rank `rank` of `world`'s loader over the training set: its contiguous shard,
    /// shuffled by `(seed, epoch)`, `batch` samples per batch, read ahead by one worker.
    pub fn loader(&self, world: usize, rank: usize, batch: usize, seed: u64) -> Result<Loader> {
        let plan = ShardPlan::new(self.train.len(), world, rank, ShardMode::Contiguous)?;
        let cfg = LoaderConfig {
            batch_size: batch,
            seed,
            shuffle: true,
            drop_last: true,
            workers: 1,
            prefetch_depth: 2,
            ..LoaderConfig::default()
        };
        Ok(Loader::new(self.train.clone(), plan, cfg)?)
    }

    /// The whole test set as `(images [N, C, H, W], labels u32 [N])`.
    pub fn test_tensors(&self, device: &Device) -> Result<(Tensor, Tensor)> {
        let mut x = Vec::with_capacity(self.test.len() * self.shape.iter().product::<usize>());
        let mut y = Vec::with_capacity(self.test.len());
        for i in 0..self.test.len() {
            let s = self.test.get(i)?;
            x.extend_from_slice(&s.tensor.data);
            y.push(s.label.unwrap_or(0));
        }
        let [c, h, w] = self.shape;
        Ok((
            Tensor::from_vec(x, (self.test.len(), c, h, w), device)?,
            Tensor::from_vec(y, self.test.len(), device)?,
        ))
    }

    /// Cache statistics of the training set (hits per level, bytes).
    pub fn train_stats(&self) -> datacache::StatsSnapshot {
        self.train.stats()
    }
}

/// A loader batch as `(images [B, C, H, W], labels u32 [B])`.
pub fn batch_tensors(batch: &datacache::Batch, device: &Device) -> Result<(Tensor, Tensor)> {
    let t = batch.stack()?;
    let labels = batch
        .labels()
        .into_iter()
        .enumerate()
        .map(|(i, l)| l.ok_or_else(|| Error::Data(format!("sample {i} of a batch has no label"))))
        .collect::<Result<Vec<u32>>>()?;
    let n = labels.len();
    Ok((
        Tensor::from_vec(t.data, t.shape, device)?,
        Tensor::from_vec(labels, n, device)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_digits_open_and_corrupt_files_are_errors() {
        let d = ImageData::digits(&digits_dir(), &CacheOptions::default()).unwrap();
        assert_eq!((d.train_len(), d.test_len()), (1437, 360));
        assert_eq!(d.shape, [1, 8, 8]);
        let (x, y) = d.test_tensors(&Device::Cpu).unwrap();
        assert_eq!(x.dims(), &[360, 1, 8, 8]);
        // Every class is in the test split.
        let labels = y.to_vec1::<u32>().unwrap();
        assert!((0..10).all(|c| labels.contains(&c)));
        let tmp = std::env::temp_dir().join(format!("pipeline-data-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        assert!(matches!(
            ImageData::digits(&tmp, &CacheOptions::default()),
            Err(Error::Data(_))
        ));
        for f in [
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        ] {
            std::fs::copy(digits_dir().join(f), tmp.join(f)).unwrap();
        }
        // Truncated images.
        let p = tmp.join("train-images-idx3-ubyte");
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
        assert!(matches!(
            ImageData::digits(&tmp, &CacheOptions::default()),
            Err(Error::Data(_))
        ));
        std::fs::write(&p, &bytes).unwrap();
        // A label outside the classes.
        let p = tmp.join("t10k-labels-idx1-ubyte");
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[8] = 42;
        std::fs::write(&p, &bytes).unwrap();
        assert!(matches!(
            ImageData::digits(&tmp, &CacheOptions::default()),
            Err(Error::Data(_))
        ));
        let g = ImageData::generated_cifar10(&tmp, 20, 10, 3, &CacheOptions::default()).unwrap();
        assert_eq!((g.train_len(), g.shape), (20, [3, 32, 32]));
        assert!(matches!(
            ImageData::cifar10(&tmp, &CacheOptions::default()),
            Err(Error::Data(_))
        ));
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
