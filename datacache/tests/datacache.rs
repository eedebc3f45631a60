//! End-to-end tests on small real files: CIFAR-10 binary batches, MNIST IDX files and PNG
//! image folders written into temp dirs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use datacache::formats::{write_cifar10_batch, write_mnist, write_png};
use datacache::source::CIFAR10_PIXELS;
use datacache::{
    Cifar10Decoder, Cifar10Source, DataCache, Decoder, Error, FolderSource, ImageDecoder, Loader,
    LoaderConfig, LoaderState, MnistSource, ShardMode, ShardPlan, Source, Tensor, U8Decoder,
    VecSource,
};

fn cifar_pixels(i: usize) -> Vec<u8> {
    (0..CIFAR10_PIXELS)
        .map(|p| ((i * 31 + p) % 251) as u8)
        .collect()
}

/// Two batch files (real CIFAR-10 layout) holding `n` records; label = i % 10.
fn make_cifar(dir: &Path, n: usize) -> Vec<PathBuf> {
    let half = n / 2;
    let recs: Vec<(u8, Vec<u8>)> = (0..n).map(|i| ((i % 10) as u8, cifar_pixels(i))).collect();
    let a = dir.join("data_batch_1.bin");
    let b = dir.join("data_batch_2.bin");
    write_cifar10_batch(&a, &recs[..half]).unwrap();
    write_cifar10_batch(&b, &recs[half..]).unwrap();
    vec![a, b]
}

fn make_mnist(dir: &Path, n: usize) -> (PathBuf, PathBuf) {
    let (rows, cols) = (6u32, 5u32);
    let px: Vec<u8> = (0..n * 30).map(|j| (j % 256) as u8).collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    let (im, lb) = (
        dir.join("train-images-idx3-ubyte"),
        dir.join("train-labels-idx1-ubyte"),
    );
    write_mnist(&im, &lb, rows, cols, &px, &labels).unwrap();
    (im, lb)
}

/// `n` 4×3 PNGs in 3 class folders; the red value of pixel 0 encodes the sample number.
fn make_png_folder(dir: &Path, n: usize) {
    for i in 0..n {
        let class = dir.join(["cat", "dog", "emu"][i % 3]);
        std::fs::create_dir_all(&class).unwrap();
        let mut px = vec![0u8; 4 * 3 * 3];
        px[0] = i as u8;
        px[1] = 200;
        write_png(&class.join(format!("{i:03}.png")), 4, 3, &px).unwrap();
    }
}

fn cfg(batch: usize, seed: u64, workers: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size: batch,
        seed,
        workers,
        prefetch_depth: 3,
        ..LoaderConfig::default()
    }
}

/// A cache over `source` with a 1 MiB memory level and, with `disk`, a 1 MiB disk level
/// in that directory.
fn cache_of(
    source: impl Source + 'static,
    decoder: impl Decoder + 'static,
    disk: Option<&Path>,
) -> Arc<DataCache> {
    let mut b = DataCache::builder(source, decoder).memory(1 << 20);
    if let Some(dir) = disk {
        b = b.disk(dir, 1 << 20);
    }
    Arc::new(b.build().unwrap())
}

/// A temp dir holding `n` CIFAR-10 samples: the dir (deleted on drop), the batch files
/// and the path for a disk cache inside it.
fn cifar_dir(n: usize) -> (tempfile::TempDir, Vec<PathBuf>, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let files = make_cifar(t.path(), n);
    let disk = t.path().join("cache");
    (t, files, disk)
}

/// [`cache_of`] the CIFAR-10 batches `files`, with its disk level in `disk`.
fn cifar_cache(files: &[PathBuf], disk: &Path) -> Arc<DataCache> {
    cache_of(
        Cifar10Source::open(files).unwrap(),
        Cifar10Decoder,
        Some(disk),
    )
}

/// [`cache_of`] the MNIST files `images`, `labels` in memory only, decoded to `shape`.
fn mnist_cache(images: &Path, labels: &Path, shape: Vec<usize>) -> Arc<DataCache> {
    cache_of(
        MnistSource::open(images, Some(labels)).unwrap(),
        U8Decoder::new(shape),
        None,
    )
}

/// For world sizes 1..=3 and both modes: each rank's epoch delivers its shard exactly once,
/// the shards' union is the data set, and orders are reproducible by a fresh loader.
fn check_epochs(make: &dyn Fn() -> Arc<DataCache>, check_sample: &dyn Fn(&datacache::Sample)) {
    let n = make().len();
    for world in 1..=3 {
        for mode in [ShardMode::Contiguous, ShardMode::Strided] {
            let mut union = vec![0usize; n];
            for rank in 0..world {
                let cache = make();
                let plan = ShardPlan::new(n, world, rank, mode).unwrap();
                let loader = Loader::new(cache, plan, cfg(4, 11, rank % 3)).unwrap();
                let mut orders = Vec::new();
                for epoch in 0..2 {
                    let mut got = Vec::new();
                    for b in loader.epoch(epoch) {
                        let b = b.unwrap();
                        for s in &b.samples {
                            check_sample(s);
                        }
                        got.extend(b.indices());
                    }
                    let set: BTreeSet<_> = got.iter().copied().collect();
                    assert_eq!(set.len(), got.len(), "duplicate within an epoch");
                    assert_eq!(set, plan.indices().into_iter().collect());
                    assert_eq!(got, loader.order(epoch));
                    orders.push(got);
                }
                if orders[0].len() > 3 {
                    assert_ne!(orders[0], orders[1], "epochs should differ");
                }
                for &i in &orders[0] {
                    union[i] += 1;
                }
                // A new loader over a new cache (another run) yields the same order.
                let again = Loader::new(make(), plan, cfg(4, 11, 2)).unwrap();
                let got: Vec<usize> = again.epoch(1).flat_map(|b| b.unwrap().indices()).collect();
                assert_eq!(got, orders[1]);
            }
            assert!(
                union.iter().all(|&c| c == 1),
                "union of shards is the data set"
            );
        }
    }
}

#[test]
fn cifar10_epochs_shards_and_content() {
    let (t, files, disk) = cifar_dir(23);
    let make = || cifar_cache(&files, &disk);
    check_epochs(&make, &|s| {
        assert_eq!(s.label, Some((s.index % 10) as u32));
        assert_eq!(s.tensor.shape, vec![3, 32, 32]);
        assert_eq!(
            s.tensor.data[5],
            f32::from(cifar_pixels(s.index)[5]) / 255.0
        );
    });
    // Bad files are typed errors.
    let bad = t.path().join("bad.bin");
    std::fs::write(&bad, [0u8; 100]).unwrap();
    assert!(matches!(
        Cifar10Source::open(&[&bad]),
        Err(Error::Format { .. })
    ));
}

#[test]
fn mnist_epochs_shards_and_content() {
    let t = tempfile::tempdir().unwrap();
    let (im, lb) = make_mnist(t.path(), 17);
    let make = || mnist_cache(&im, &lb, vec![1, 6, 5]);
    check_epochs(&make, &|s| {
        assert_eq!(s.label, Some((s.index % 10) as u32));
        assert_eq!(s.tensor.data[0], ((s.index * 30) % 256) as f32 / 255.0);
    });
    // Labels that do not match the images, and truncated files, are rejected.
    let (im2, lb2) = make_mnist(&t.path().join("x").tap_mkdir(), 5);
    assert!(MnistSource::open(&im, Some(&lb2)).is_err());
    let bytes = std::fs::read(&im2).unwrap();
    std::fs::write(&im2, &bytes[..bytes.len() - 1]).unwrap();
    assert!(matches!(
        MnistSource::open(&im2, None),
        Err(Error::Format { .. })
    ));
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}
impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

#[test]
fn png_folder_epochs_shards_and_content() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("images");
    make_png_folder(&root, 14);
    let disk = t.path().join("cache");
    let src = FolderSource::open_filtered(&root, &["png"]).unwrap();
    assert_eq!(src.classes(), &["cat", "dog", "emu"]);
    let make = || {
        cache_of(
            FolderSource::open(&root).unwrap(),
            ImageDecoder::default(),
            Some(&disk),
        )
    };
    let src2 = src.clone();
    check_epochs(&make, &move |s| {
        let path = src2.path(s.index).unwrap();
        let number: usize = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        assert_eq!(s.label, Some((number % 3) as u32));
        assert_eq!(s.tensor.shape, vec![3, 3, 4]);
        assert_eq!(s.tensor.data[0], number as f32 / 255.0);
        assert_eq!(s.tensor.data[12], 200.0 / 255.0); // green plane, pixel 0
    });
}

#[test]
fn out_of_range_is_rejected() {
    let src = VecSource::new("v", vec![(vec![1], None); 3]);
    assert!(matches!(
        src.read(3),
        Err(Error::IndexOutOfRange { index: 3, len: 3 })
    ));
    let cache = DataCache::builder(src, U8Decoder::new(vec![1]))
        .build()
        .unwrap();
    assert!(matches!(cache.get(3), Err(Error::IndexOutOfRange { .. })));
    assert!(matches!(
        cache.get(usize::MAX),
        Err(Error::IndexOutOfRange { .. })
    ));
    assert!(cache.get(2).is_ok());
    let plan = ShardPlan::single(4);
    assert!(Loader::new(Arc::new(cache), plan, cfg(1, 0, 0)).is_err());
}

#[test]
fn corrupted_disk_entries_are_refetched() {
    let (_t, files, disk) = cifar_dir(12);
    let make = || cifar_cache(&files, &disk);
    let first = make();
    let loader = Loader::new(first.clone(), ShardPlan::single(12), cfg(5, 1, 2)).unwrap();
    let clean: Vec<_> = loader.epoch(0).flat_map(|b| b.unwrap().samples).collect();
    assert_eq!(first.stats().source_reads, 12);
    assert_eq!(first.stats().disk_writes, 12);

    // Damage four entries in four ways.
    let d = first.disk().unwrap();
    let flip = d.entry_path(0);
    let mut b = std::fs::read(&flip).unwrap();
    b[100] ^= 0x55;
    std::fs::write(&flip, b).unwrap();
    let trunc = d.entry_path(3);
    let b = std::fs::read(&trunc).unwrap();
    std::fs::write(&trunc, &b[..b.len() / 2]).unwrap();
    std::fs::write(d.entry_path(7), b"").unwrap();
    std::fs::write(d.entry_path(11), vec![0xAB; 4000]).unwrap();

    // A new run (cold memory) over the same disk: exactly those four come from the source.
    let second = make();
    let loader = Loader::new(second.clone(), ShardPlan::single(12), cfg(5, 1, 2)).unwrap();
    let again: Vec<_> = loader.epoch(0).flat_map(|b| b.unwrap().samples).collect();
    let s = second.stats();
    assert_eq!(s.disk_corrupt, 4);
    assert_eq!(s.source_reads, 4);
    assert_eq!(s.disk_hits, 8);
    assert_eq!(clean, again);
    // ... and they are repaired on disk.
    let third = make();
    for i in 0..12 {
        third.get(i).unwrap();
    }
    assert_eq!(third.stats().source_reads, 0);
    assert_eq!(third.stats().disk_corrupt, 0);
}

#[test]
fn missing_and_undecodable_samples_are_named_and_can_be_skipped() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("images");
    make_png_folder(&root, 9);
    let src = FolderSource::open(&root).unwrap();
    let garbage = src.path(4).unwrap().to_path_buf();
    let missing = src.path(6).unwrap().to_path_buf();
    std::fs::write(&garbage, b"this is not a png").unwrap();
    std::fs::remove_file(&missing).unwrap();

    let cache = Arc::new(
        DataCache::builder(src, ImageDecoder::default())
            .memory(1 << 20)
            .build()
            .unwrap(),
    );
    match cache.get(4) {
        Err(Error::Decode { index: 4, name, .. }) => {
            assert!(name.contains(garbage.file_name().unwrap().to_str().unwrap()))
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    match cache.get(6) {
        Err(e @ Error::Read { .. }) => {
            assert_eq!(e.sample_index(), Some(6));
            assert!(e.to_string().contains(missing.to_str().unwrap()));
        }
        other => panic!("expected a read error, got {other:?}"),
    }

    // Without skipping, the batches holding them fail and the others are delivered.
    let strict = Loader::new(cache.clone(), ShardPlan::single(9), cfg(3, 0, 2)).unwrap();
    let results: Vec<_> = strict.epoch(0).collect();
    assert_eq!(results.len(), 3);
    assert!(results.iter().filter(|r| r.is_err()).count() >= 1);

    // With skipping, every other sample comes exactly once.
    let mut c = cfg(3, 0, 2);
    c.skip_errors = true;
    let lenient = Loader::new(cache.clone(), ShardPlan::single(9), c).unwrap();
    let mut got = Vec::new();
    let mut skipped = Vec::new();
    for b in lenient.epoch(0) {
        let b = b.unwrap();
        got.extend(b.indices());
        skipped.extend(b.skipped.iter().map(|s| s.0));
    }
    got.sort();
    skipped.sort();
    assert_eq!(got, vec![0, 1, 2, 3, 5, 7, 8]);
    assert_eq!(skipped, vec![4, 6]);
    assert_eq!(cache.stats().skipped, 2);
}

#[test]
fn unwritable_disk_degrades_to_memory_and_source() {
    let (_t, files, disk) = cifar_dir(10);
    let cache = cifar_cache(&files, &disk);
    // Pull the directory away and put a file in its place: every write now fails, as on a
    // full disk.
    let dir = cache.disk().unwrap().dir().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, b"in the way").unwrap();
    let loader = Loader::new(cache.clone(), ShardPlan::single(10), cfg(4, 0, 2)).unwrap();
    for epoch in 0..2 {
        let n: usize = loader.epoch(epoch).map(|b| b.unwrap().samples.len()).sum();
        assert_eq!(n, 10);
    }
    let s = cache.stats();
    assert!(s.disk_write_failures >= 1);
    assert!(!cache.disk().unwrap().is_enabled());
    assert_eq!(s.source_reads, 10);
    assert_eq!(s.memory_hits, 10);
}

/// Sample bytes that say which sample they are, to catch any mix-up between processes.
fn tagged_source(n: usize) -> VecSource {
    VecSource::new(
        "shared",
        (0..n)
            .map(|i| {
                let mut v = vec![(i % 256) as u8; 300 + i];
                v[..8].copy_from_slice(&(i as u64).to_le_bytes());
                (v, None)
            })
            .collect(),
    )
}

fn raw_ok(i: usize, raw: &[u8]) -> bool {
    raw.len() == 300 + i
        && raw[..8] == (i as u64).to_le_bytes()
        && raw[8..].iter().all(|&b| b == (i % 256) as u8)
}

fn hammer_shared_dir(dir: &Path, n: usize, limit: u64, seed: u64) {
    let cache = DataCache::builder(tagged_source(n), U8Decoder::new(vec![0]))
        .disk(dir, limit)
        .build()
        .unwrap();
    for round in 0..3 {
        for i in datacache::order::permutation(n, seed, round) {
            let raw = cache.get_raw(i).unwrap();
            assert!(raw_ok(i, &raw), "sample {i} came back wrong");
        }
    }
}

#[test]
fn threads_with_separate_handles_share_one_dir() {
    let t = tempfile::tempdir().unwrap();
    let n = 60;
    for limit in [1u64 << 24, 15_000] {
        // big enough for everything, then small enough to evict while others read
        std::thread::scope(|s| {
            for k in 0..4 {
                let dir = t.path().join(format!("lim{limit}"));
                s.spawn(move || hammer_shared_dir(&dir, n, limit, k));
            }
        });
    }
    let leftover: Vec<_> = walk_files(t.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".tmp."))
        .collect();
    assert!(leftover.is_empty(), "temporary files left: {leftover:?}");
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

const CHILD_ENV: &str = "DATACACHE_TEST_CHILD_DIR";

/// Body of the subprocesses of `processes_share_one_dir`; does nothing in a normal run.
#[test]
fn child_process_worker() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let seed: u64 = std::env::var("DATACACHE_TEST_CHILD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    hammer_shared_dir(Path::new(&dir), 80, 20_000, seed);
}

#[test]
fn processes_share_one_dir() {
    let t = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|k| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "child_process_worker",
                    "--test-threads=1",
                    "--quiet",
                ])
                .env(CHILD_ENV, t.path())
                .env("DATACACHE_TEST_CHILD_SEED", k.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a child process failed");
    }
    // Everything left on disk is intact and within the limit, give or take the ~5% per
    // process written between directory rescans.
    let cache = DataCache::builder(tagged_source(80), U8Decoder::new(vec![0]))
        .disk(t.path(), 20_000)
        .build()
        .unwrap();
    assert!(cache.disk().unwrap().total_bytes() <= 20_000 * 5 / 4);
    for i in 0..80 {
        assert!(raw_ok(i, &cache.get_raw(i).unwrap()));
    }
    assert_eq!(cache.stats().disk_corrupt, 0);
}

#[test]
fn resume_in_the_middle_of_an_epoch() {
    let t = tempfile::tempdir().unwrap();
    let (im, lb) = make_mnist(t.path(), 41);
    let make = || mnist_cache(&im, &lb, vec![30]);
    let plan = ShardPlan::new(41, 2, 1, ShardMode::Strided).unwrap();
    let loader = Loader::new(make(), plan, cfg(4, 99, 3)).unwrap();
    let full = loader.order(5);
    for stop_after in [0usize, 1, 3, 4] {
        let mut it = loader.epoch(5);
        let mut got: Vec<usize> = Vec::new();
        for _ in 0..stop_after {
            got.extend(it.next().unwrap().unwrap().indices());
        }
        let saved = it.state().to_json();
        drop(it);
        // Another run: new cache, new loader, the saved JSON.
        let state = LoaderState::from_json(&saved).unwrap();
        assert_eq!(
            state,
            LoaderState {
                epoch: 5,
                position: got.len(),
                seed: 99
            }
        );
        let loader2 = Loader::new(make(), plan, cfg(4, 99, 1)).unwrap();
        let mut it2 = loader2.resume(&state).unwrap();
        for b in it2.by_ref() {
            got.extend(b.unwrap().indices());
        }
        assert_eq!(got, full);
        assert_eq!(
            it2.state(),
            LoaderState {
                epoch: 6,
                position: 0,
                seed: 99
            }
        );
    }
    // A position that is not on a batch boundary also resumes exactly.
    let st = LoaderState {
        epoch: 2,
        position: 7,
        seed: 99,
    };
    let rest: Vec<usize> = loader
        .resume(&st)
        .unwrap()
        .flat_map(|b| b.unwrap().indices())
        .collect();
    assert_eq!(rest, loader.order(2)[7..].to_vec());
    // States that do not fit are typed errors.
    for (position, seed) in [(0, 1), (999, 99)] {
        let bad = LoaderState {
            epoch: 0,
            position,
            seed,
        };
        assert!(
            matches!(loader.resume(&bad), Err(Error::State(_))),
            "{bad:?}"
        );
    }
    assert!(LoaderState::from_json("{\"epoch\":1}").is_err());
}

#[test]
fn prefetch_delivers_in_order_and_reports_progress() {
    let n = 50;
    let src = VecSource::new(
        "p",
        (0..n).map(|i| (vec![i as u8; 8], Some(i as u32))).collect(),
    );
    let cache = Arc::new(
        DataCache::builder(src, U8Decoder::new(vec![8]))
            .memory(1 << 20)
            .build()
            .unwrap(),
    );
    let calls = Arc::new(Mutex::new(Vec::new()));
    let calls2 = calls.clone();
    let mut c = cfg(6, 5, 4);
    c.prefetch_depth = 2;
    c.drop_last = true;
    c.progress = Some(Arc::new(move |p: &datacache::Progress| {
        calls2
            .lock()
            .unwrap()
            .push((p.batches_done, p.batches_total, p.samples_done));
    }));
    let loader = Loader::new(cache.clone(), ShardPlan::single(n), c.clone()).unwrap();
    let batches: Vec<_> = loader.epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 8);
    assert!(batches
        .iter()
        .enumerate()
        .all(|(k, b)| b.number == k && b.samples.len() == 6));
    let sync = Loader::new(
        cache.clone(),
        ShardPlan::single(n),
        LoaderConfig { workers: 0, ..c },
    )
    .unwrap();
    let same: Vec<Vec<usize>> = sync.epoch(0).map(|b| b.unwrap().indices()).collect();
    assert_eq!(
        same,
        batches.iter().map(|b| b.indices()).collect::<Vec<_>>()
    );
    {
        let calls = calls.lock().unwrap();
        assert_eq!(calls.len(), 16);
        assert_eq!(calls[7], (8, 8, 48));
    }
    let stacked = batches[0].stack().unwrap();
    assert_eq!(stacked.shape, vec![6, 8]);
    // Dropping an iterator half-way stops its workers (the test would hang otherwise).
    let mut it = loader.epoch(1);
    it.next();
    drop(it);
}

#[test]
fn panicking_decoder_fails_its_batch_only() {
    let src = VecSource::new("panic", (0..12).map(|i| (vec![i as u8], None)).collect());
    let decoder = |raw: &[u8]| -> Result<Tensor, String> {
        assert!(raw[0] != 5, "decoder bug on sample 5");
        Ok(Tensor::new(vec![1], vec![f32::from(raw[0])]).unwrap())
    };
    let cache = Arc::new(DataCache::builder(src, decoder).build().unwrap());
    let mut c = cfg(4, 0, 2);
    c.shuffle = false;
    let loader = Loader::new(cache, ShardPlan::single(12), c).unwrap();
    let r: Vec<_> = loader.epoch(0).collect();
    assert_eq!(r.len(), 3);
    assert!(matches!(r[1], Err(Error::Worker(_))));
    assert!(r[0].is_ok() && r[2].is_ok());
}

#[test]
fn memory_level_is_bounded_by_bytes() {
    let n = 200;
    let src = VecSource::new("m", (0..n).map(|i| (vec![i as u8; 256], None)).collect());
    let cap = 64 * 1024;
    let cache = DataCache::builder(src, U8Decoder::new(vec![256]))
        .memory(cap)
        .build()
        .unwrap();
    for i in 0..n {
        cache.get(i).unwrap();
    }
    let (count, weight) = cache.memory_usage();
    assert!(weight <= cap, "weight {weight} over {cap}");
    assert!(count > 0 && (count as usize) < n);
}

#[test]
fn closure_decoder_counts_decodes() {
    let decodes = Arc::new(AtomicUsize::new(0));
    let d2 = decodes.clone();
    let decoder = move |raw: &[u8]| -> Result<Tensor, String> {
        d2.fetch_add(1, Ordering::Relaxed);
        U8Decoder::new(vec![raw.len()]).decode(raw)
    };
    let src = VecSource::new("c", vec![(vec![1, 2, 3], None); 5]);
    let cache = DataCache::builder(src, decoder)
        .memory(1 << 16)
        .build()
        .unwrap();
    for _ in 0..3 {
        for i in 0..5 {
            cache.get(i).unwrap();
        }
    }
    assert_eq!(decodes.load(Ordering::Relaxed), 5);
    assert_eq!(cache.stats().memory_hits, 10);
}
