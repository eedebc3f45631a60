//! Stop-and-resume of real training (ResNet-20 on the shipped digits, P = 4 thread ranks,
//! SparDL and ExDyna): the resumed run's parameters after every later step, and its
//! epochs' numbers, equal an uninterrupted run's bit for bit; a checkpoint of another P
//! or configuration is a typed error on every rank; a damaged newest checkpoint falls
//! back to the previous one, which still resumes bit-identically. The LSTM language model
//! resumes bit-identically too: the state each rank's streams carry from window to window
//! (truncated BPTT) is saved with the rank's part.

mod common;

use std::path::Path;

use collectives::{ThreadComm, ThreadConfig};
use pipeline::checkpoint::CheckpointError;
use pipeline::data::{digits_dir, CacheOptions, ImageData, TextData};
use pipeline::train::{run_rank, CheckpointConfig, TrainConfig, TrainReport};
use pipeline::{Error, SchemeKind};

fn digits() -> ImageData {
    ImageData::digits(&digits_dir(), &CacheOptions::default()).unwrap()
}

/// The first `train` training and `test` test samples of the shipped digits, written as
/// IDX files to `dir` (no `SHA256SUMS`, so they are read unchecked), and opened.
fn digits_slice(dir: &Path, train: usize, test: usize) -> ImageData {
    use datacache::{MnistSource, Source};
    for (prefix, n) in [("train", train), ("t10k", test)] {
        let file = |kind: &str| format!("{prefix}-{kind}-ubyte");
        let (images, labels) = (file("images-idx3"), file("labels-idx1"));
        let src = MnistSource::open(
            digits_dir().join(&images),
            Some(&digits_dir().join(&labels)),
        )
        .unwrap();
        assert!(n <= src.len(), "only {} {prefix} samples", src.len());
        let (mut pixels, mut label_bytes) = (Vec::new(), Vec::new());
        for i in 0..n {
            let raw = src.read(i).unwrap();
            label_bytes.push(src.label(i, &raw).unwrap() as u8);
            pixels.extend_from_slice(&raw);
        }
        let side = |j: usize| src.sample_dims()[j] as u32;
        datacache::formats::write_mnist(
            &dir.join(&images),
            &dir.join(&labels),
            side(0),
            side(1),
            &pixels,
            &label_bytes,
        )
        .unwrap();
    }
    ImageData::digits(dir, &CacheOptions::default()).unwrap()
}

/// 2 epochs (11 steps each on the whole shipped set: 1437 samples, P = 4, batch 32), profile
/// of 2 steps.
fn config(scheme: SchemeKind) -> TrainConfig {
    TrainConfig {
        scheme,
        ranks: 4,
        epochs: 2,
        batch: 32,
        density: 0.05,
        profile_iters: 2,
        check_params: true,
        trace_iters: 0,
        ..TrainConfig::default()
    }
}

fn with_checkpoints(cfg: &TrainConfig, dir: &Path, every: usize, resume: bool) -> TrainConfig {
    TrainConfig {
        checkpoint: CheckpointConfig {
            dir: Some(dir.to_path_buf()),
            every,
            resume,
        },
        ..cfg.clone()
    }
}

/// The epochs' numbers without their times (`None` metrics as NaN bits).
fn epoch_numbers(r: &TrainReport) -> Vec<(usize, u32, [u64; 5])> {
    let bits = |v: Option<f64>| v.unwrap_or(f64::NAN).to_bits();
    r.epochs
        .iter()
        .map(|e| {
            (
                e.epoch,
                e.loss.to_bits(),
                [
                    e.train_acc.to_bits(),
                    e.test_acc.to_bits(),
                    e.test_loss.to_bits(),
                    bits(e.valid_loss),
                    bits(e.test_ppl),
                ],
            )
        })
        .collect()
}

/// The resumed run continues the uninterrupted one exactly, from step `from`.
fn assert_continues(whole: &TrainReport, resumed: &TrainReport, from: usize) {
    assert_eq!(resumed.first_step, from);
    assert_eq!(resumed.steps, whole.steps);
    assert_eq!(
        resumed.step_param_hashes,
        whole.step_param_hashes[from..],
        "parameters after steps {}..={}",
        from + 1,
        whole.steps
    );
    assert_eq!(resumed.final_param_hash, whole.final_param_hash);
    assert_eq!(epoch_numbers(resumed), epoch_numbers(whole));
    assert_eq!(resumed.params_checked_steps, whole.params_checked_steps);
}

/// The training samples of [`a_resumed_sparse_run_equals_an_uninterrupted_one_bit_for_bit`]:
/// 6 steps an epoch at P = 4, batch 32. On the whole set (11 steps an epoch) it was CI's
/// slowest test, 160 s on the 2-core VM; on this slice, 70 s.
const SLICE_TRAIN: usize = 6 * 4 * 32;

#[test]
fn a_resumed_sparse_run_equals_an_uninterrupted_one_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let data = digits_slice(dir.path(), SLICE_TRAIN, 360);
    // SparDL stops in the middle of epoch 1; ExDyna at its last step, before the epoch's
    // evaluation, with checkpoints every 5 steps as well.
    for (scheme, stop, every) in [(SchemeKind::Spardl, 4, 0), (SchemeKind::Exdyna, 6, 5)] {
        let cfg = config(scheme);
        let whole = pipeline::train(&cfg, &data, None).unwrap();
        assert_eq!(whole.steps, 12);
        assert_eq!(whole.step_param_hashes.len(), 12);
        let tmp = tempfile::tempdir().unwrap();
        let first = TrainConfig {
            stop_after_steps: Some(stop),
            ..with_checkpoints(&cfg, tmp.path(), every, false)
        };
        let cut = pipeline::train(&first, &data, None).unwrap();
        assert_eq!(cut.steps, stop);
        assert_eq!(cut.step_param_hashes, whole.step_param_hashes[..stop]);
        assert!(cut.last_checkpoint.is_some());
        let resumed =
            pipeline::train(&with_checkpoints(&cfg, tmp.path(), 0, true), &data, None).unwrap();
        assert_continues(&whole, &resumed, stop);
        assert_eq!(resumed.resumed_from, cut.last_checkpoint);
        assert!(resumed.skipped_checkpoints.is_empty());
        assert_eq!(resumed.epochs.len(), 2);
        assert!(resumed.test_acc > 20.0, "{scheme}: {}", resumed.test_acc);

        // The newest checkpoint damaged (truncated): the previous one (the last multiple
        // of `every` before `stop`) is taken, and resuming from it is just as exact.
        if let Some(periods) = (stop - 1).checked_div(every) {
            let previous = periods * every;
            assert!(previous > 0 && previous < stop);
            let newest = tmp
                .path()
                .join(pipeline::checkpoint::file_name(stop as u64));
            let bytes = std::fs::read(&newest).unwrap();
            std::fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
            let resumed =
                pipeline::train(&with_checkpoints(&cfg, tmp.path(), 0, true), &data, None).unwrap();
            assert_continues(&whole, &resumed, previous);
            assert_eq!(resumed.skipped_checkpoints.len(), 1);
        }
    }
}

/// The LSTM stopped in the middle of epoch 1 (its streams holding a carried state) and
/// resumed continues the uninterrupted run bit for bit: parameters after every step,
/// training loss, validation and test metrics.
#[test]
fn a_resumed_lstm_run_continues_its_streams_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let vocab = common::kjv_slice(tmp.path(), 2401);
    let data = TextData::open(tmp.path(), common::BPTT, &CacheOptions::default()).unwrap();
    let cfg = TrainConfig {
        scheme: SchemeKind::Spardl,
        ..common::small_lstm(vocab)
    };
    let whole = pipeline::train(&cfg, &data, None).unwrap();
    assert_eq!(whole.steps, 60);
    let dir = tmp.path().join("ck");
    let stop = 43;
    let cut = pipeline::train(
        &TrainConfig {
            stop_after_steps: Some(stop),
            ..with_checkpoints(&cfg, &dir, 0, false)
        },
        &data,
        None,
    )
    .unwrap();
    assert_eq!(cut.step_param_hashes, whole.step_param_hashes[..stop]);
    let resumed = pipeline::train(&with_checkpoints(&cfg, &dir, 0, true), &data, None).unwrap();
    assert_continues(&whole, &resumed, stop);
    assert!(whole.epochs.iter().all(|e| e.valid_ppl.is_some()));
}

#[test]
fn a_checkpoint_of_another_run_is_a_typed_error_on_every_rank() {
    let data = digits();
    let cfg = config(SchemeKind::Spardl);
    let tmp = tempfile::tempdir().unwrap();
    let first = TrainConfig {
        stop_after_steps: Some(3),
        ..with_checkpoints(&cfg, tmp.path(), 0, false)
    };
    pipeline::train(&first, &data, None).unwrap();
    let resume = with_checkpoints(&cfg, tmp.path(), 0, true);
    let on_every_rank = |cfg: TrainConfig| -> Vec<pipeline::Result<TrainReport>> {
        ThreadComm::run_all(
            cfg.ranks,
            ThreadConfig::with_timeout(std::time::Duration::from_secs(20)),
            |comm| run_rank(comm, &cfg, &data, None, None),
        )
        .unwrap()
    };
    // Another P.
    for r in on_every_rank(TrainConfig {
        ranks: 2,
        ..resume.clone()
    }) {
        assert!(
            matches!(
                r,
                Err(Error::Checkpoint(CheckpointError::Ranks {
                    saved: 4,
                    ranks: 2,
                    ..
                }))
            ),
            "{r:?}"
        );
    }
    // Another configuration (learning rate, then density).
    for cfg in [
        TrainConfig {
            lr: 0.05,
            ..resume.clone()
        },
        TrainConfig {
            density: 0.1,
            ..resume.clone()
        },
    ] {
        for r in on_every_rank(cfg) {
            assert!(
                matches!(r, Err(Error::Checkpoint(CheckpointError::Config { .. }))),
                "{r:?}"
            );
        }
    }
    // No checkpoint at all.
    let empty = tempfile::tempdir().unwrap();
    for r in on_every_rank(with_checkpoints(&cfg, empty.path(), 0, true)) {
        assert!(
            matches!(r, Err(Error::Checkpoint(CheckpointError::Missing { .. }))),
            "{r:?}"
        );
    }
    // The right run resumes from it.
    assert!(on_every_rank(resume).iter().all(|r| r.is_ok()));
}

#[test]
fn checkpoint_options_that_cannot_work_are_refused() {
    let data = digits();
    let cfg = config(SchemeKind::Spardl);
    let tmp = tempfile::tempdir().unwrap();
    for bad in [
        // Resume without a directory.
        TrainConfig {
            checkpoint: CheckpointConfig {
                dir: None,
                every: 0,
                resume: true,
            },
            ..cfg.clone()
        },
        // A checkpoint inside the profile.
        TrainConfig {
            stop_after_steps: Some(1),
            ..with_checkpoints(&cfg, tmp.path(), 0, false)
        },
        TrainConfig {
            stop_after_steps: Some(0),
            ..cfg.clone()
        },
    ] {
        assert!(
            matches!(
                pipeline::train(&bad, &data, None),
                Err(Error::InvalidArgument(_))
            ),
            "{bad:?}"
        );
    }
    // A sparse algorithm that exports no state cannot be checkpointed: the save is a
    // typed error (on every rank), not a checkpoint without its residuals.
    let topka = TrainConfig {
        stop_after_steps: Some(3),
        ..with_checkpoints(&config(SchemeKind::Topka), tmp.path(), 0, false)
    };
    let res = ThreadComm::run_all(
        4,
        ThreadConfig::with_timeout(std::time::Duration::from_secs(20)),
        |comm| run_rank(comm, &topka, &data, None, None),
    )
    .unwrap();
    for r in res {
        assert!(
            matches!(r, Err(Error::Checkpoint(CheckpointError::State(_)))),
            "{r:?}"
        );
    }
    assert!(pipeline::checkpoint::list(tmp.path()).unwrap().is_empty());
}
