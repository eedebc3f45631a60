//! Helpers shared by the language-model tests: a slice of the shipped King James Gospels
//! and a small LSTM configuration.

use std::path::Path;

use datacache::tokens::{write_tokens, TokenSource};
use pipeline::candle_models::LstmShape;
use pipeline::data::kjv_dir;
use pipeline::train::{ModelKind, TrainConfig};

/// Truncated-BPTT window of the tests.
pub const BPTT: usize = 10;

/// The first `tokens` training tokens and the first 1,000 validation and test tokens of
/// the shipped corpus, with its vocabulary, written to `dir`; the vocabulary size.
pub fn kjv_slice(dir: &Path, tokens: usize) -> usize {
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
    write_tokens(&dir.join("train.tok"), vocab as u32, &train).unwrap();
    for split in ["valid", "test"] {
        let (_, ids) = read(split, 1000);
        write_tokens(&dir.join(format!("{split}.tok")), vocab as u32, &ids).unwrap();
    }
    std::fs::copy(kjv_dir().join("vocab.txt"), dir.join("vocab.txt")).unwrap();
    vocab
}

/// A 16-unit LSTM over `vocab` on 2 ranks, 4 streams each, 2 epochs, parameters checked
/// after every step.
pub fn small_lstm(vocab: usize) -> TrainConfig {
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
