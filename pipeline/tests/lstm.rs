//! The LSTM language model trained on token files through `datacache`: a small model on a
//! slice of the shipped King James Gospels learns (training loss falls, validation and
//! test perplexity below the vocabulary's uniform guess) with every scheme on thread
//! ranks, parameters bit-identical on every rank after every step; the training loop
//! carries each stream's LSTM state from window to window and resets it at every epoch
//! start; missing or corrupt token files and a vocabulary that differs from the model's
//! are typed errors.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{Tensor, Var};
use common::{kjv_slice, small_lstm as small, BPTT};
use pipeline::candle_models::LstmShape;
use pipeline::data::{kjv_dir, CacheOptions, Dataset, Eval, RankLoader, TextData};
use pipeline::staged::Staged;
use pipeline::train::{ModelKind, TrainConfig};
use pipeline::{Error, SchemeKind};

#[test]
fn a_small_lstm_learns_with_every_scheme() {
    let tmp = tempfile::tempdir().unwrap();
    let vocab = kjv_slice(tmp.path(), 2401);
    let data = TextData::open(tmp.path(), BPTT, &CacheOptions::default()).unwrap();
    // 240 windows, 2 ranks, 4 streams: 30 iterations per epoch.
    for scheme in [
        SchemeKind::Dense,
        SchemeKind::Topk,
        SchemeKind::Lags,
        SchemeKind::Mgs,
        SchemeKind::Omgs,
        SchemeKind::Topka,
        SchemeKind::Topkdsa,
        SchemeKind::Gtopk,
        SchemeKind::Cltk,
        SchemeKind::Spardl,
        SchemeKind::SpardlRsag,
        SchemeKind::SpardlBsag,
        SchemeKind::Hitopk,
        SchemeKind::Exdyna,
        SchemeKind::Oktopk,
        SchemeKind::Switch,
        SchemeKind::Bsp1,
        SchemeKind::Bsp2,
        SchemeKind::Bsp3,
    ] {
        let cfg = TrainConfig {
            scheme,
            ..small(vocab)
        };
        let r = pipeline::train(&cfg, &data, None).unwrap_or_else(|e| panic!("{scheme}: {e}"));
        assert_eq!(r.params_checked_steps, 60, "{scheme}");
        assert_eq!(r.epochs.len(), 2);
        let (first, last) = (&r.epochs[0], &r.epochs[1]);
        assert!(
            last.loss < first.loss,
            "{scheme}: {} -> {}",
            first.loss,
            last.loss
        );
        let ppl = last.test_ppl.expect("a language model reports perplexity");
        assert!(
            ppl.is_finite() && ppl < vocab as f64 / 4.0,
            "{scheme}: perplexity {ppl} against a vocabulary of {vocab}"
        );
        assert!((ppl - last.test_loss.exp()).abs() < 1e-6 * ppl);
        assert_eq!(r.test_ppl, Some(ppl));
        let (vl, vp) = (last.valid_loss.unwrap(), last.valid_ppl.unwrap());
        assert!(
            vp.is_finite() && vp < vocab as f64 / 4.0 && (vp - vl.exp()).abs() < 1e-6 * vp,
            "{scheme}: validation perplexity {vp}"
        );
        assert!(vl < first.valid_loss.unwrap(), "{scheme}: validation loss");
    }
}

#[test]
fn missing_or_corrupt_token_files_and_a_vocabulary_mismatch_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let open = |p: &Path| TextData::open(p, BPTT, &CacheOptions::default());
    assert!(matches!(open(tmp.path()), Err(Error::Data(_))));
    let vocab = kjv_slice(tmp.path(), 2401);
    let data = open(tmp.path()).unwrap();
    // The model's vocabulary differs from the files'.
    let cfg = TrainConfig {
        lstm: LstmShape {
            vocab: vocab - 1,
            ..small(vocab).lstm
        },
        ..small(vocab)
    };
    assert!(matches!(
        pipeline::train(&cfg, &data, None),
        Err(Error::Data(_))
    ));
    // An image model on token files, and bptt 0.
    let cfg = TrainConfig {
        model: ModelKind::Resnet20,
        ..small(vocab)
    };
    assert!(matches!(
        pipeline::train(&cfg, &data, None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        TextData::open(tmp.path(), 0, &CacheOptions::default()),
        Err(Error::InvalidArgument(_))
    ));
    // vocab.txt with another vocabulary than the token files.
    let words = std::fs::read_to_string(tmp.path().join("vocab.txt")).unwrap();
    std::fs::write(tmp.path().join("vocab.txt"), format!("{words}extra\n")).unwrap();
    assert!(matches!(open(tmp.path()), Err(Error::Data(_))));
    std::fs::write(tmp.path().join("vocab.txt"), &words).unwrap();
    // A truncated file, an id outside the vocabulary, a missing file: of the test and of
    // the validation split.
    for split in ["test", "valid"] {
        let p = tmp.path().join(format!("{split}.tok"));
        let good = std::fs::read(&p).unwrap();
        std::fs::write(&p, &good[..good.len() - 1]).unwrap();
        assert!(matches!(open(tmp.path()), Err(Error::Data(_))), "{split}");
        let mut bad = good.clone();
        bad[datacache::tokens::TOKEN_HEADER_LEN + 1] = 0xff;
        std::fs::write(&p, &bad).unwrap();
        assert!(matches!(open(tmp.path()), Err(Error::Data(_))), "{split}");
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(open(tmp.path()), Err(Error::Data(_))), "{split}");
        std::fs::write(&p, &good).unwrap();
        assert!(open(tmp.path()).is_ok());
    }
}

#[test]
fn the_shipped_corpus_opens() {
    let data = TextData::open(&kjv_dir(), 35, &CacheOptions::default()).unwrap();
    assert_eq!(pipeline::data::Dataset::vocab(&data), Some(2000));
    assert_eq!(data.train_windows(), (78_754 - 1) / 35);
}

/// The shipped model, recording before each training-mode forward of its first LSTM layer
/// whether the window starts from a carried state.
struct Recording {
    inner: Box<dyn Staged>,
    carried: Arc<Mutex<Vec<bool>>>,
}

impl Staged for Recording {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn num_stages(&self) -> usize {
        self.inner.num_stages()
    }
    fn forward_stage(&self, i: usize, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        if i == 1 && train {
            let held = !self.inner.carried_state(1)?.is_empty();
            self.carried.lock().unwrap().push(held);
        }
        self.inner.forward_stage(i, x, train)
    }
    fn stage_params(&self, i: usize) -> &[(String, Var)] {
        self.inner.stage_params(i)
    }
    fn reset_state(&self, train: bool) -> candle_core::Result<()> {
        self.inner.reset_state(train)
    }
    fn carried_state(&self, i: usize) -> candle_core::Result<Vec<Tensor>> {
        self.inner.carried_state(i)
    }
    fn set_carried_state(&self, i: usize, state: &[Tensor]) -> candle_core::Result<()> {
        self.inner.set_carried_state(i, state)
    }
}

/// Token data whose models record (one record per model built: per rank).
struct RecordingData {
    data: TextData,
    records: Mutex<Vec<Arc<Mutex<Vec<bool>>>>>,
}

impl Dataset for RecordingData {
    fn name(&self) -> String {
        self.data.name()
    }
    fn build_model(
        &self,
        kind: ModelKind,
        lstm: LstmShape,
        seed: u64,
    ) -> pipeline::Result<Box<dyn Staged>> {
        let carried = Arc::new(Mutex::new(Vec::new()));
        self.records.lock().unwrap().push(carried.clone());
        Ok(Box::new(Recording {
            inner: self.data.build_model(kind, lstm, seed)?,
            carried,
        }))
    }
    fn iters_per_epoch(&self, world: usize, batch: usize) -> usize {
        self.data.iters_per_epoch(world, batch)
    }
    fn loader(
        &self,
        world: usize,
        rank: usize,
        batch: usize,
        seed: u64,
    ) -> pipeline::Result<Box<dyn RankLoader>> {
        self.data.loader(world, rank, batch, seed)
    }
    fn evaluate(&self, model: &dyn Staged) -> pipeline::Result<Eval> {
        self.data.evaluate(model)
    }
    fn validation(&self, model: &dyn Staged) -> pipeline::Result<Option<Eval>> {
        self.data.validation(model)
    }
    fn vocab(&self) -> Option<usize> {
        self.data.vocab()
    }
}

/// Truncated BPTT in the training loop: on every rank, the first window of each epoch
/// starts from zeros and every other window from the state the previous one left
/// (evaluation keeps a state of its own: the model's unit tests).
#[test]
fn the_training_loop_carries_the_state_and_resets_it_every_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let vocab = kjv_slice(tmp.path(), 2401);
    let data = RecordingData {
        data: TextData::open(tmp.path(), BPTT, &CacheOptions::default()).unwrap(),
        records: Mutex::new(Vec::new()),
    };
    let cfg = TrainConfig {
        scheme: SchemeKind::Dense,
        ..small(vocab)
    };
    let iters = data.iters_per_epoch(cfg.ranks, cfg.batch);
    assert_eq!(iters, 30);
    let r = pipeline::train(&cfg, &data, None).unwrap();
    assert_eq!(r.epochs.len(), 2);
    let records = data.records.lock().unwrap();
    assert_eq!(records.len(), cfg.ranks);
    for rank in records.iter() {
        let carried = rank.lock().unwrap().clone();
        let expected: Vec<bool> = (0..cfg.epochs * iters).map(|k| k % iters != 0).collect();
        assert_eq!(carried, expected);
    }
}

/// The shipped corpus is checked against its SHA256SUMS: a validation token changed to
/// another id of the vocabulary still parses, but is a typed error.
#[test]
fn a_token_file_that_differs_from_its_sha256sums_is_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "train.tok",
        "valid.tok",
        "test.tok",
        "vocab.txt",
        "SHA256SUMS",
    ] {
        std::fs::copy(kjv_dir().join(f), tmp.path().join(f)).unwrap();
    }
    let open = || TextData::open(tmp.path(), 35, &CacheOptions::default());
    assert!(open().is_ok());
    let p = tmp.path().join("valid.tok");
    let good = std::fs::read(&p).unwrap();
    let mut bad = good.clone();
    let at = datacache::tokens::TOKEN_HEADER_LEN + 2 * 100;
    bad[at] = if bad[at] == 1 { 2 } else { 1 };
    bad[at + 1] = 0;
    std::fs::write(&p, &bad).unwrap();
    assert!(
        matches!(open(), Err(Error::Data(e)) if e.contains("SHA-256")),
        "an altered valid.tok opened"
    );
    std::fs::remove_file(&p).unwrap();
    assert!(matches!(open(), Err(Error::Data(_))));
}
