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
//! - [`ImageData::generated_cifar10`]: generated files in CIFAR-10 format, for throughput;
//! - [`TextData`]: token-id files for the LSTM language model (`datacache::tokens`), by
//!   default the four Gospels of the King James Version that the repository ships in
//!   `data/kjv-gospels/` (converted from Debian's `bible-kjv` by
//!   `tools/kjv_to_tokens.py`).
//!
//! Training reads either through one [`Dataset`] trait: the model that fits the data, the
//! batches of one rank's shard (resumable), and the test metrics ([`Eval`]: accuracy and
//! mean cross entropy, plus perplexity for a language model), and the validation metrics
//! of data that has a validation split (`valid.tok` of token files).
//!
//! Missing or corrupt files, missing labels, labels outside the classes and a vocabulary
//! that differs from the model's are [`Error::Data`]. A folder with a `SHA256SUMS` file
//! (the shipped ones: the converters write it) has every listed file checked against it
//! on open ([`verify_sums`]), which also catches damage that still parses.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::sync::OnceLock;

use candle_core::{Device, Tensor};
use datacache::{
    Cifar10Decoder, Cifar10Source, DataCache, Decoder, Loader, LoaderConfig, LoaderState,
    MnistSource, ShardMode, ShardPlan, Source, TokenDecoder, TokenSource, U8Decoder,
};
use rand::{Rng, SeedableRng};

use crate::candle_models::{LstmLm, LstmShape};
use crate::staged::{self, Staged};
use crate::train::ModelKind;
use crate::{Error, Result};

/// An epoch's batches `(inputs, targets)` for one rank, with the position to resume from.
pub trait Batches: Iterator<Item = Result<(Tensor, Tensor)>> {
    /// Where the epoch stands (epoch, samples delivered, seed).
    fn state(&self) -> LoaderState;
}

/// One rank's reader of the training set.
pub trait RankLoader {
    /// The batches of `epoch` from its start.
    fn epoch(&self, epoch: u64) -> Box<dyn Batches>;
    /// The rest of the epoch a saved state stands in.
    fn resume(&self, state: &LoaderState) -> Result<Box<dyn Batches>>;
}

/// Test-set metrics of a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eval {
    /// Accuracy, % (of images; of next tokens for a language model).
    pub accuracy: f64,
    /// Mean cross entropy per prediction, nats.
    pub loss: f64,
    /// `exp(loss)` for a language model, `None` for a classifier.
    pub perplexity: Option<f64>,
}

/// A training data set, as training sees it. See the module docs.
pub trait Dataset: Send + Sync {
    /// Short name for reports.
    fn name(&self) -> String;
    /// A fresh `kind` model that fits this data, initialised from `seed`; `lstm` is the
    /// language model's shape, whose vocabulary must be the data's.
    fn build_model(&self, kind: ModelKind, lstm: LstmShape, seed: u64) -> Result<Box<dyn Staged>>;
    /// Iterations per epoch that every one of `world` ranks can fill with `batch`.
    fn iters_per_epoch(&self, world: usize, batch: usize) -> usize;
    /// Rank `rank` of `world`'s loader, `batch` samples (or streams) per iteration.
    fn loader(
        &self,
        world: usize,
        rank: usize,
        batch: usize,
        seed: u64,
    ) -> Result<Box<dyn RankLoader>>;
    /// The model's metrics on the test set.
    fn evaluate(&self, model: &dyn Staged) -> Result<Eval>;
    /// The model's metrics on the validation set, if the data has one (`None` by
    /// default).
    fn validation(&self, _model: &dyn Staged) -> Result<Option<Eval>> {
        Ok(None)
    }
    /// The vocabulary of token data (`None` for images).
    fn vocab(&self) -> Option<usize> {
        None
    }
}

/// Accuracy and mean loss of `model` on `(x, y)` in chunks of `chunk` rows of `x`, in
/// order; `y` holds the targets of each row (`[N]` for images, `[N, T]` for token
/// windows). The model's evaluation state is reset first ([`Staged::reset_state`]), then
/// carried from chunk to chunk, so row `b` of consecutive chunks must continue one stream
/// for a model that carries state (its training state is not touched).
pub fn evaluate_chunks(model: &dyn Staged, x: &Tensor, y: &Tensor, chunk: usize) -> Result<Eval> {
    model.reset_state(false)?;
    let n = x.dim(0)?;
    let (mut right, mut count, mut loss) = (0usize, 0usize, 0.0f64);
    let mut i = 0;
    while i < n {
        let b = chunk.max(1).min(n - i);
        let logits = staged::forward(model, &x.narrow(0, i, b)?, false)?;
        let t = y.narrow(0, i, b)?.flatten_all()?;
        let k = t.elem_count();
        right += staged::correct(&logits, &t)?;
        loss += f64::from(model.loss(&logits, &t)?.to_scalar::<f32>()?) * k as f64;
        count += k;
        i += b;
    }
    let count = count.max(1) as f64;
    Ok(Eval {
        accuracy: 100.0 * right as f64 / count,
        loss: loss / count,
        perplexity: None,
    })
}

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

/// The token files shipped in the repository (`data/kjv-gospels`).
pub fn kjv_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("data")
        .join("kjv-gospels")
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
    test_cache: OnceLock<(Tensor, Tensor)>,
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

/// Checks the files that `dir/SHA256SUMS` lists (`sha256sum` format: hex digest, space,
/// optional `*`, name; one a line) if `dir` has one. A listed file that is missing or
/// whose digest differs, and a malformed line, are [`Error::Data`]; a folder without
/// `SHA256SUMS` (e.g. a user's) passes unchecked.
pub fn verify_sums(dir: &Path) -> Result<()> {
    use sha2::{Digest, Sha256};
    let list = dir.join("SHA256SUMS");
    let text = match std::fs::read_to_string(&list) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::Data(format!("{}: {e}", list.display()))),
    };
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = || Error::Data(format!("{} line {}: malformed", list.display(), n + 1));
        let (digest, name) = line.split_once(' ').ok_or_else(bad)?;
        let name = name.trim_start_matches(' ').trim_start_matches('*');
        if digest.len() != 64 || name.is_empty() || name.contains(['/', '\\']) {
            return Err(bad());
        }
        let path = need(dir.join(name))?;
        let bytes =
            std::fs::read(&path).map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
        let got: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if !got.eq_ignore_ascii_case(digest) {
            return Err(Error::Data(format!(
                "{}: SHA-256 {got}, SHA256SUMS lists {digest} (damaged or replaced)",
                path.display()
            )));
        }
    }
    Ok(())
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
        verify_sums(dir)?;
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
            test_cache: OnceLock::new(),
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
            test_cache: OnceLock::new(),
        };
        data.check_labels()?;
        Ok(data)
    }

    /// The whole test set as `(images [N, C, H, W], labels u32 [N])`, read once.
    fn test_set(&self) -> Result<&(Tensor, Tensor)> {
        if let Some(t) = self.test_cache.get() {
            return Ok(t);
        }
        let t = self.test_tensors(&Device::Cpu)?;
        Ok(self.test_cache.get_or_init(|| t))
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

/// [`Batches`] over a `datacache` epoch of labelled images.
struct ImageBatches(datacache::EpochIter);

impl Iterator for ImageBatches {
    type Item = Result<(Tensor, Tensor)>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|b| {
            b.map_err(Error::from)
                .and_then(|b| batch_tensors(&b, &Device::Cpu))
        })
    }
}

impl Batches for ImageBatches {
    fn state(&self) -> LoaderState {
        self.0.state()
    }
}

impl RankLoader for Loader {
    fn epoch(&self, epoch: u64) -> Box<dyn Batches> {
        Box::new(ImageBatches(Loader::epoch(self, epoch)))
    }
    fn resume(&self, state: &LoaderState) -> Result<Box<dyn Batches>> {
        Ok(Box::new(ImageBatches(Loader::resume(self, state)?)))
    }
}

impl Dataset for ImageData {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn build_model(&self, kind: ModelKind, _lstm: LstmShape, seed: u64) -> Result<Box<dyn Staged>> {
        let [c, h, w] = self.shape;
        if h != w {
            return Err(Error::InvalidArgument(format!(
                "square images expected, got {:?}",
                self.shape
            )));
        }
        Ok(match kind {
            ModelKind::Resnet20 => {
                Box::new(crate::candle_models::resnet20(c, h, self.classes, seed)?)
            }
            ModelKind::Vgg16Bn => {
                Box::new(crate::candle_models::vgg16_bn(c, h, self.classes, 1, seed)?)
            }
            ModelKind::Lstm => {
                return Err(Error::InvalidArgument(format!(
                    "the LSTM language model reads token files, not the images of `{}`",
                    self.name
                )))
            }
        })
    }
    fn iters_per_epoch(&self, world: usize, batch: usize) -> usize {
        self.train_len() / world.max(1) / batch.max(1)
    }
    fn loader(
        &self,
        world: usize,
        rank: usize,
        batch: usize,
        seed: u64,
    ) -> Result<Box<dyn RankLoader>> {
        Ok(Box::new(ImageData::loader(self, world, rank, batch, seed)?))
    }
    fn evaluate(&self, model: &dyn Staged) -> Result<Eval> {
        let (x, y) = self.test_set()?;
        evaluate_chunks(model, x, y, 256)
    }
}

/// Streams an evaluation split is read in: the PyTorch `word_language_model`'s
/// `eval_batch_size`.
pub const EVAL_STREAMS: usize = 10;

/// Token-id files for a language model (`datacache::tokens`): `train.tok`, `valid.tok`,
/// `test.tok` and `vocab.txt` (one token a line) in a folder, read as windows of `bptt`
/// inputs through a memory level. Batches are Penn Treebank style
/// ([`datacache::stream_batches`]): each rank's contiguous shard of the training stream
/// is cut into `batch` streams read in order, so a model that carries its state from
/// window to window (truncated BPTT) continues each stream.
///
/// The validation and test splits are read the same way, as [`EVAL_STREAMS`] contiguous
/// streams (fewer if the split has fewer windows) evaluated from a zero state carried
/// across their windows; the last `windows mod streams` windows are left out, as the
/// PyTorch `batchify` trims. Every file is required: a missing or corrupt one is
/// [`Error::Data`].
pub struct TextData {
    train: Arc<DataCache>,
    valid: EvalSplit,
    test: EvalSplit,
    vocab: usize,
    bptt: usize,
    name: String,
}

/// An evaluation split and, once read, its windows in stream order with the stream count.
struct EvalSplit {
    cache: Arc<DataCache>,
    tensors: OnceLock<(Tensor, Tensor, usize)>,
}

impl TextData {
    /// Opens the token files in `dir` with windows of `bptt` steps. Every file's
    /// vocabulary must be `vocab.txt`'s.
    pub fn open(dir: &Path, bptt: usize, opts: &CacheOptions) -> Result<Self> {
        if bptt == 0 {
            return Err(Error::InvalidArgument("bptt must be at least 1".into()));
        }
        verify_sums(dir)?;
        let vocab_path = need(dir.join("vocab.txt"))?;
        let words = std::fs::read_to_string(&vocab_path)
            .map_err(|e| Error::Data(format!("{}: {e}", vocab_path.display())))?
            .lines()
            .count();
        let decoder: Arc<dyn Decoder> = Arc::new(TokenDecoder { seq_len: bptt });
        let open = |split: &str| -> Result<Arc<DataCache>> {
            let src = TokenSource::open(need(dir.join(format!("{split}.tok")))?, bptt)?;
            if src.vocab() != words {
                return Err(Error::Data(format!(
                    "{split}.tok has a vocabulary of {}, vocab.txt lists {words}",
                    src.vocab()
                )));
            }
            build_cache(
                Arc::new(src),
                decoder.clone(),
                opts,
                &format!("tokens-{split}"),
            )
        };
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tokens".into());
        let split = |name: &str| -> Result<EvalSplit> {
            Ok(EvalSplit {
                cache: open(name)?,
                tensors: OnceLock::new(),
            })
        };
        Ok(TextData {
            train: open("train")?,
            valid: split("valid")?,
            test: split("test")?,
            vocab: words,
            bptt,
            name,
        })
    }

    /// `model`'s metrics on `split`, its windows read as streams (see the type's docs).
    fn evaluate_split(&self, split: &EvalSplit, model: &dyn Staged) -> Result<Eval> {
        let (x, y, streams) = match split.tensors.get() {
            Some(t) => t,
            None => {
                let windows = split.cache.len();
                let streams = EVAL_STREAMS.min(windows);
                let plan = ShardPlan::new(windows, 1, 0, ShardMode::Contiguous)?;
                let order = datacache::stream_batches(&plan, streams)?.concat();
                let (x, y) = Self::windows(&split.cache, &order, self.bptt)?;
                split.tensors.get_or_init(|| (x, y, streams))
            }
        };
        let e = evaluate_chunks(model, x, y, *streams)?;
        Ok(Eval {
            perplexity: Some(e.loss.exp()),
            ..e
        })
    }

    /// Training windows of `bptt` steps.
    pub fn train_windows(&self) -> usize {
        self.train.len()
    }

    /// Windows `indices` as `(inputs u32 [B, bptt], targets u32 [B, bptt])`.
    fn windows(cache: &DataCache, indices: &[usize], bptt: usize) -> Result<(Tensor, Tensor)> {
        let mut x = Vec::with_capacity(indices.len() * bptt);
        let mut y = Vec::with_capacity(indices.len() * bptt);
        for &i in indices {
            let w = &cache.get(i)?.tensor.data;
            x.extend(w[..bptt].iter().map(|&v| v as u32));
            y.extend(w[1..].iter().map(|&v| v as u32));
        }
        let shape = (indices.len(), bptt);
        Ok((
            Tensor::from_vec(x, shape, &Device::Cpu)?,
            Tensor::from_vec(y, shape, &Device::Cpu)?,
        ))
    }
}

/// One rank's streams over the training windows.
#[derive(Clone)]
struct TextLoader {
    cache: Arc<DataCache>,
    /// The windows of each iteration.
    order: Arc<Vec<Vec<usize>>>,
    bptt: usize,
    seed: u64,
}

/// An epoch of [`TextLoader`]: iteration `next` onwards.
struct TextBatches {
    loader: TextLoader,
    epoch: u64,
    next: usize,
}

impl Iterator for TextBatches {
    type Item = Result<(Tensor, Tensor)>;
    fn next(&mut self) -> Option<Self::Item> {
        let ids = self.loader.order.get(self.next)?;
        self.next += 1;
        Some(
            TextData::windows(&self.loader.cache, ids, self.loader.bptt)
                .and_then(|(x, y)| Ok((x, y.flatten_all()?))),
        )
    }
}

impl Batches for TextBatches {
    fn state(&self) -> LoaderState {
        let per = self.loader.order.first().map_or(0, Vec::len);
        LoaderState {
            epoch: self.epoch,
            position: self.next * per,
            seed: self.loader.seed,
        }
    }
}

impl TextLoader {
    fn at(&self, epoch: u64, next: usize) -> TextBatches {
        TextBatches {
            loader: self.clone(),
            epoch,
            next,
        }
    }
}

impl RankLoader for TextLoader {
    fn epoch(&self, epoch: u64) -> Box<dyn Batches> {
        Box::new(self.at(epoch, 0))
    }
    fn resume(&self, state: &LoaderState) -> Result<Box<dyn Batches>> {
        let per = self.order.first().map_or(1, Vec::len);
        if state.seed != self.seed
            || state.position % per != 0
            || state.position / per > self.order.len()
        {
            return Err(Error::Data(format!(
                "loader state {state:?} does not fit {} iterations of {per} streams (seed {})",
                self.order.len(),
                self.seed
            )));
        }
        Ok(Box::new(self.at(state.epoch, state.position / per)))
    }
}

impl Dataset for TextData {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn vocab(&self) -> Option<usize> {
        Some(self.vocab)
    }
    fn build_model(&self, kind: ModelKind, lstm: LstmShape, seed: u64) -> Result<Box<dyn Staged>> {
        if kind != ModelKind::Lstm {
            return Err(Error::InvalidArgument(format!(
                "{kind} classifies images; the token files of `{}` need the LSTM model",
                self.name
            )));
        }
        if lstm.vocab != self.vocab {
            return Err(Error::Data(format!(
                "the model's vocabulary has {} entries, the token files' {}",
                lstm.vocab, self.vocab
            )));
        }
        Ok(Box::new(LstmLm::new(lstm, seed)?))
    }
    fn iters_per_epoch(&self, world: usize, batch: usize) -> usize {
        // The smallest contiguous shard has ⌊len / world⌋ windows.
        self.train.len() / world.max(1) / batch.max(1)
    }
    fn loader(
        &self,
        world: usize,
        rank: usize,
        batch: usize,
        seed: u64,
    ) -> Result<Box<dyn RankLoader>> {
        let plan = ShardPlan::new(self.train.len(), world, rank, ShardMode::Contiguous)?;
        Ok(Box::new(TextLoader {
            cache: self.train.clone(),
            order: Arc::new(datacache::stream_batches(&plan, batch)?),
            bptt: self.bptt,
            seed,
        }))
    }
    fn evaluate(&self, model: &dyn Staged) -> Result<Eval> {
        self.evaluate_split(&self.test, model)
    }
    fn validation(&self, model: &dyn Staged) -> Result<Option<Eval>> {
        self.evaluate_split(&self.valid, model).map(Some)
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
        // A pixel altered: still a valid file, but not the one SHA256SUMS lists.
        std::fs::copy(digits_dir().join("SHA256SUMS"), tmp.join("SHA256SUMS")).unwrap();
        assert!(ImageData::digits(&tmp, &CacheOptions::default()).is_ok());
        let mut altered = bytes.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        std::fs::write(&p, &altered).unwrap();
        assert!(matches!(
            ImageData::digits(&tmp, &CacheOptions::default()),
            Err(Error::Data(e)) if e.contains("SHA-256")
        ));
        std::fs::write(&p, &bytes).unwrap();
        std::fs::remove_file(tmp.join("SHA256SUMS")).unwrap();
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
