//! `datacache` feeding `pipeline`: a generated MNIST IDX file (written with
//! `datacache::formats`) is read through a `DataCache` (shared disk directory + memory
//! level) by one `Loader` per rank, sharded across P ranks, and each batch drives a
//! data-parallel step of a `pipeline` model through the `Reducer` (sparse TopK all-gather
//! with error feedback, merge plan from the exact planner) over `ThreadComm`.
//!
//! The loader + candle model steps (stage-wise backward into the `Reducer`) are driven
//! here directly, as a framework's training loop would; a second test runs
//! `pipeline::train`, which reads IDX files through its own `DataCache` and loaders.
//!
//! Checked: every rank sees exactly its shard once per epoch (and only its shard), the
//! shards are disjoint and cover the data set, every delivered sample carries the pixels
//! and label written to the file, the second epoch is served from memory, and the model
//! replicas stay bit-identical across ranks.

use std::path::Path;
use std::sync::Arc;

use collectives::Communicator;
use datacache::{
    formats, DataCache, Loader, LoaderConfig, MnistSource, ShardMode, ShardPlan, U8Decoder,
};
use integration_tests::{bits, flatten, run_ranks, AnyResult};
use pipeline::staged::{self, Staged, Stages};
use pipeline::{LayerProfile, Planner, SimpleCosts, TopkAllgather};

const N: usize = 96;
const SIDE: u32 = 8;
const CLASSES: usize = 4;
const BATCH: usize = 8;

/// Pixels of sample i: a pattern from its index; label i mod 4.
fn pixels(i: usize) -> Vec<u8> {
    (0..(SIDE * SIDE) as usize)
        .map(|j| ((i * 31 + j * 7 + (i % CLASSES) * 50) % 256) as u8)
        .collect()
}

fn label(i: usize) -> u8 {
    (i % CLASSES) as u8
}

fn write_mnist(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let images = dir.join("train-images-idx3-ubyte");
    let labels = dir.join("train-labels-idx1-ubyte");
    let px: Vec<u8> = (0..N).flat_map(pixels).collect();
    let lb: Vec<u8> = (0..N).map(label).collect();
    formats::write_mnist(&images, &labels, SIDE, SIDE, &px, &lb).expect("write MNIST");
    (images, labels)
}

fn open_cache(images: &Path, labels: &Path, disk: &Path) -> AnyResult<Arc<DataCache>> {
    let src = MnistSource::open(images, Some(labels))?;
    Ok(Arc::new(
        DataCache::builder(src, U8Decoder::new(vec![1, SIDE as usize, SIDE as usize]))
            .disk(disk, 1 << 20)
            .memory(1 << 20)
            .build()?,
    ))
}

struct RankOut {
    /// Indices delivered, per epoch, in delivery order.
    seen: Vec<Vec<usize>>,
    /// This rank's shard as the plan says.
    shard: Vec<usize>,
    params: Vec<f32>,
    losses: Vec<f32>,
    memory_hits_epoch1: u64,
    source_reads: u64,
}

fn run_sharded(p: usize, mode: ShardMode) -> Vec<RankOut> {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (images, labels) = write_mnist(tmp.path());
    let disk = tmp.path().join("cache");
    let dim = (SIDE * SIDE) as usize;
    run_ranks(p, |comm| -> AnyResult<RankOut> {
        let r = comm.rank();
        // Each rank opens its own handle on the shared cache directory, as separate
        // processes would.
        let cache = open_cache(&images, &labels, &disk)?;
        let plan = ShardPlan::new(cache.len(), p, r, mode)?;
        let cfg = LoaderConfig {
            batch_size: BATCH,
            seed: 5,
            drop_last: true,
            workers: 1,
            prefetch_depth: 2,
            ..LoaderConfig::default()
        };
        let loader = Loader::new(cache.clone(), plan, cfg)?;

        let mut model = Stages::new("mlp", 42);
        model.push("hidden", |vb| {
            let l = candle_nn::linear(dim, 16, vb)?;
            Ok(candle_nn::func_t(move |x, _| {
                candle_core::Module::forward(&l, &x.flatten_from(1)?)?.relu()
            }))
        })?;
        model.push("out", |vb| candle_nn::linear(16, CLASSES, vb))?;
        let sizes = staged::layer_sizes(&model);
        // FLOP-proportional backward times at the zoo's device speed.
        let bw: Vec<f64> = sizes
            .iter()
            .map(|&n| 4.0 * (BATCH * n) as f64 / pipeline::zoo::DEVICE_FLOPS)
            .collect();
        let profile: LayerProfile =
            LayerProfile::from_sizes("mlp", &sizes)?.with_backward_times(0.0, &bw)?;
        let costs = SimpleCosts {
            gamma: 1e-8,
            alpha: 1e-3,
            beta: 1e-7,
        };
        let merge = Planner::Exact.plan(&profile, &costs)?;
        let mut red = pipeline::Reducer::new(comm, &sizes, merge, &TopkAllgather { density: 0.3 })?;

        let mut seen = Vec::new();
        let mut losses = Vec::new();
        let mut memory_hits_epoch1 = 0;
        for epoch in 0..2u64 {
            let before = cache.stats();
            let mut idx = Vec::new();
            for batch in loader.epoch(epoch) {
                let batch = batch?;
                // The delivered samples are the written ones.
                for s in &batch.samples {
                    let want: Vec<f32> = pixels(s.index)
                        .iter()
                        .map(|&b| f32::from(b) / 255.0)
                        .collect();
                    if s.tensor.data != want || s.label != Some(u32::from(label(s.index))) {
                        return Err(format!("sample {} decoded wrongly", s.index).into());
                    }
                }
                idx.extend(batch.indices());
                let (x, y) = pipeline::data::batch_tensors(&batch, &candle_core::Device::Cpu)?;
                red.begin()?;
                let fwd = staged::forward_train(&model, &x)?;
                let loss = model.loss(fwd.logits(), &y)?;
                red.forward_done()?;
                staged::backward_staged(&model, &fwd, &loss, &mut |t, g| red.ready(t, g))?;
                let grads = red.finish()?;
                let mut w = staged::get_params(&model)?;
                for (w, g) in w.iter_mut().zip(&grads) {
                    for (wi, gi) in w.iter_mut().zip(g) {
                        *wi -= 0.1 * gi;
                    }
                }
                staged::set_params(&model, &w)?;
                losses.push(loss.to_scalar::<f32>()?);
            }
            if epoch == 1 {
                memory_hits_epoch1 = cache.stats().since(&before).memory_hits;
            }
            seen.push(idx);
        }
        drop(red.shutdown()?);
        Ok(RankOut {
            seen,
            shard: plan.indices(),
            params: flatten(&staged::get_params(&model)?),
            losses,
            memory_hits_epoch1,
            source_reads: cache.stats().source_reads,
        })
    })
}

fn check_sharded(p: usize, mode: ShardMode) {
    let what = format!("P={p} {mode:?}");
    let outs = run_sharded(p, mode);
    let mut union: Vec<usize> = Vec::new();
    for (r, o) in outs.iter().enumerate() {
        let per_epoch = o.shard.len() / BATCH * BATCH;
        for (e, idx) in o.seen.iter().enumerate() {
            assert_eq!(idx.len(), per_epoch, "{what}: rank {r} epoch {e} count");
            let mut sorted = idx.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                idx.len(),
                "{what}: rank {r} epoch {e} repeats a sample"
            );
            assert!(
                idx.iter().all(|i| o.shard.contains(i)),
                "{what}: rank {r} epoch {e} read outside its shard"
            );
        }
        // Shuffled per epoch, deterministically.
        assert_ne!(
            o.seen[0], o.seen[1],
            "{what}: rank {r} same order both epochs"
        );
        // Epoch 1 comes from memory; the source was read once per sample of the shard.
        assert_eq!(
            o.memory_hits_epoch1 as usize, per_epoch,
            "{what}: rank {r} memory hits"
        );
        assert_eq!(
            o.source_reads as usize, per_epoch,
            "{what}: rank {r} source reads"
        );
        assert!(
            o.losses.iter().all(|l| l.is_finite()),
            "{what}: rank {r} loss"
        );
        // Replicas identical.
        assert_eq!(
            bits(&o.params),
            bits(&outs[0].params),
            "{what}: rank {r}'s model differs from rank 0's"
        );
        union.extend(&o.shard);
    }
    let total = union.len();
    union.sort_unstable();
    union.dedup();
    assert_eq!(union.len(), total, "{what}: shards overlap");
    assert_eq!(
        union,
        (0..N).collect::<Vec<_>>(),
        "{what}: shards do not cover the data set"
    );
}

#[test]
fn sharded_loader_feeds_data_parallel_steps() {
    check_sharded(3, ShardMode::Contiguous);
    check_sharded(4, ShardMode::Strided);
}

#[test]
fn pipeline_train_reads_idx_files_through_its_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write_mnist(tmp.path());
    // The same samples as the test split.
    let px: Vec<u8> = (0..N).flat_map(pixels).collect();
    let lb: Vec<u8> = (0..N).map(label).collect();
    formats::write_mnist(
        &tmp.path().join("t10k-images-idx3-ubyte"),
        &tmp.path().join("t10k-labels-idx1-ubyte"),
        SIDE,
        SIDE,
        &px,
        &lb,
    )
    .expect("write test split");
    let data = pipeline::data::ImageData::digits(tmp.path(), &Default::default()).expect("open");
    let cfg = pipeline::TrainConfig {
        scheme: pipeline::SchemeKind::Topk,
        ranks: 2,
        density: 0.1,
        epochs: 2,
        batch: BATCH,
        profile_iters: 2,
        check_params: true,
        ..pipeline::TrainConfig::default()
    };
    let report = pipeline::train(&cfg, &data, None).expect("train over the cache");
    assert_eq!(report.epochs.len(), 2);
    assert_eq!(report.params_checked_steps, 2 * (N / 2 / BATCH));
    assert!((0.0..=100.0).contains(&report.test_acc));
    // Every training sample was read once per epoch, the second from memory.
    let stats = data.train_stats();
    assert_eq!(stats.source_reads as usize, N);
    assert!(stats.memory_hits as usize >= N);
}
