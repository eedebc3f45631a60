//! The LSTM language model trained on token files through `datacache`: a small model on a
//! slice of the shipped King James Gospels learns (training loss falls, test perplexity
//! below the vocabulary's uniform guess) with every scheme on thread ranks, parameters
//! bit-identical on every rank after every step; missing or corrupt token files and a
//! vocabulary that differs from the model's are typed errors.

use std::path::Path;

use datacache::tokens::{write_tokens, TokenSource};
use pipeline::candle_models::LstmShape;
use pipeline::data::{kjv_dir, CacheOptions, TextData};
use pipeline::train::{ModelKind, TrainConfig};
use pipeline::{Error, SchemeKind};

const BPTT: usize = 10;

/// The first `tokens` training tokens and the first 1,000 test tokens of the shipped
/// corpus, with its vocabulary, in `dir`.
fn slice(dir: &Path, tokens: usize) -> usize {
    let read = |split: &str, n: usize| -> (usize, Vec<u16>) {
        let path = kjv_dir().join(format!("{split}.tok"));
        let src = TokenSource::open(&path, 1).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let ids = bytes[datacache::tokens::TOKEN_HEADER_LEN..]
            .chunks_exact(2)
            .take(n)
            .map(|p| u16::from_le_bytes([p[0], p[1]]))
            .collect();
        (src.vocab(), ids)
    };
    let (vocab, train) = read("train", tokens);
    let (_, test) = read("test", 1000);
    write_tokens(&dir.join("train.tok"), vocab as u32, &train).unwrap();
    write_tokens(&dir.join("test.tok"), vocab as u32, &test).unwrap();
    std::fs::copy(kjv_dir().join("vocab.txt"), dir.join("vocab.txt")).unwrap();
    vocab
}

fn small(vocab: usize) -> TrainConfig {
    TrainConfig {
        model: ModelKind::Lstm,
        lstm: LstmShape {
            vocab,
            embed: 16,
            hidden: 16,
        },
        ranks: 2,
        epochs: 2,
        batch: 4,
        lr: 1.0,
        warmup_epochs: 0.0,
        density: 0.05,
        profile_iters: 2,
        check_params: true,
        trace_iters: 0,
        ..TrainConfig::default()
    }
}

#[test]
fn a_small_lstm_learns_with_every_scheme() {
    let tmp = tempfile::tempdir().unwrap();
    let vocab = slice(tmp.path(), 2401);
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
    }
}

#[test]
fn missing_or_corrupt_token_files_and_a_vocabulary_mismatch_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let open = |p: &Path| TextData::open(p, BPTT, &CacheOptions::default());
    assert!(matches!(open(tmp.path()), Err(Error::Data(_))));
    let vocab = slice(tmp.path(), 2401);
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
    // A truncated file, and an id outside the vocabulary.
    let p = tmp.path().join("test.tok");
    let good = std::fs::read(&p).unwrap();
    std::fs::write(&p, &good[..good.len() - 1]).unwrap();
    assert!(matches!(open(tmp.path()), Err(Error::Data(_))));
    let mut bad = good.clone();
    bad[datacache::tokens::TOKEN_HEADER_LEN + 1] = 0xff;
    std::fs::write(&p, &bad).unwrap();
    assert!(matches!(open(tmp.path()), Err(Error::Data(_))));
    std::fs::remove_file(&p).unwrap();
    assert!(matches!(open(tmp.path()), Err(Error::Data(_))));
    std::fs::write(&p, &good).unwrap();
    assert!(open(tmp.path()).is_ok());
}

#[test]
fn the_shipped_corpus_opens() {
    let data = TextData::open(&kjv_dir(), 35, &CacheOptions::default()).unwrap();
    assert_eq!(pipeline::data::Dataset::vocab(&data), Some(2000));
    assert_eq!(data.train_windows(), (78_754 - 1) / 35);
}
