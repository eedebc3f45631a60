//! The measurement behind `cargo xtask bench` (suite `datacache`) and
//! `cargo bench -p datacache`: a throttled source of generated samples (one file each, like
//! an image folder on NFS), read uncached, then through the cache in epoch 1 and epoch 2, then
//! again by a fresh process-like cache over the warm disk, and finally with a simulated
//! compute step with and without prefetching (paper 001 §4.1, Fig. 9's "I/O time reduced
//! over 10 times").

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cache::DataCache;
use crate::decode::{Decoder, Tensor, U8Decoder};
use crate::error::{Error, Result};
use crate::loader::{Loader, LoaderConfig};
use crate::shard::ShardPlan;
use crate::source::{FolderSource, Source, ThrottledSource};
use crate::stats::StatsSnapshot;

/// Knobs of the bench; the defaults run in well under a minute.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchConfig {
    /// Samples in the generated data set.
    pub samples: usize,
    /// Bytes per sample file.
    pub sample_bytes: usize,
    /// Source bandwidth in bytes per second (the emulated NFS link).
    pub bandwidth_bytes_per_s: f64,
    /// Source latency per request, seconds.
    pub latency_s: f64,
    /// CPU time burnt per decode, seconds (stands in for JPEG decoding and augmentation).
    pub decode_cost_s: f64,
    /// Samples per batch.
    pub batch_size: usize,
    /// Prefetch workers.
    pub workers: usize,
    /// Batches read ahead.
    pub prefetch_depth: usize,
    /// Simulated compute (a GPU step: sleeping, not CPU) per batch, seconds.
    pub compute_per_batch_s: f64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            samples: 2000,
            sample_bytes: 16 * 1024,
            bandwidth_bytes_per_s: 50e6,
            latency_s: 2e-3,
            decode_cost_s: 100e-6,
            batch_size: 32,
            workers: 4,
            prefetch_depth: 8,
            compute_per_batch_s: 20e-3,
        }
    }
}

/// One measured pass over the data set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseReport {
    /// `uncached`, `epoch1`, `epoch2`, `rerun_epoch1_disk`, `compute_no_prefetch`,
    /// `compute_prefetch`.
    pub name: String,
    /// Samples delivered.
    pub samples: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// `samples / seconds`.
    pub samples_per_s: f64,
    /// Cache counters of this pass alone.
    pub stats: StatsSnapshot,
}

/// Everything the bench measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    /// The configuration run.
    pub config: BenchConfig,
    /// The passes, in the order run.
    pub phases: Vec<PhaseReport>,
    /// Epoch 2 throughput over epoch 1 throughput.
    pub epoch2_over_epoch1: f64,
    /// Epoch 2 throughput over the uncached loader's.
    pub epoch2_over_uncached: f64,
    /// How much reading and compute overlap with prefetching, with the same workers:
    /// `(t_read + t_compute − t_prefetch) / min(t_read, t_compute)`, where `t_read` is the
    /// `uncached` pass and `t_compute` the summed compute steps; 1 means the shorter of the
    /// two is fully hidden, 0 means they run one after the other.
    pub prefetch_overlap: f64,
    /// Time with compute and no prefetch (`workers = 0`) over time with prefetch.
    pub prefetch_speedup: f64,
}

impl BenchReport {
    /// The phase called `name`.
    pub fn phase(&self, name: &str) -> Option<&PhaseReport> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// A Markdown table of the phases and the summary ratios.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "| phase | samples | time s | samples/s | mem hit | mem miss | disk hit | disk miss | source reads | source MB | wait s |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for p in &self.phases {
            let st = &p.stats;
            s.push_str(&format!(
                "| {} | {} | {:.3} | {:.0} | {} | {} | {} | {} | {} | {:.1} | {:.3} |\n",
                p.name,
                p.samples,
                p.seconds,
                p.samples_per_s,
                st.memory_hits,
                st.memory_misses,
                st.disk_hits,
                st.disk_misses,
                st.source_reads,
                st.source_bytes as f64 / 1e6,
                st.wait_time_s
            ));
        }
        s.push_str(&format!(
            "\nepoch 2 / epoch 1 throughput: {:.1}×; epoch 2 / uncached: {:.1}×; \
             reading/compute overlap with prefetch: {:.0}%; \
             compute_no_prefetch / compute_prefetch time: {:.1}×\n",
            self.epoch2_over_epoch1,
            self.epoch2_over_uncached,
            100.0 * self.prefetch_overlap,
            self.prefetch_speedup
        ));
        s
    }
}

/// Deterministic pseudo-random bytes (xorshift), so the bench needs no RNG state.
fn fill(buf: &mut [u8], mut x: u64) {
    x |= 1;
    for b in buf {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Writes `n` sample files of `bytes` bytes into 10 class folders under `dir`.
pub fn generate_folder(dir: &Path, n: usize, bytes: usize) -> Result<()> {
    let mut buf = vec![0u8; bytes];
    for i in 0..n {
        let class = dir.join(format!("class{}", i % 10));
        std::fs::create_dir_all(&class).map_err(|source| Error::Io {
            path: class.clone(),
            source,
        })?;
        fill(&mut buf, i as u64 + 1);
        let p = class.join(format!("{i:07}.bin"));
        std::fs::write(&p, &buf).map_err(|source| Error::Io { path: p, source })?;
    }
    Ok(())
}

/// A decoder that normalises bytes and then burns `cost` of CPU, like image decoding.
fn costly_decoder(bytes: usize, cost: Duration) -> impl Decoder {
    let inner = U8Decoder::new(vec![bytes]);
    move |raw: &[u8]| -> std::result::Result<Tensor, String> {
        let t = Instant::now();
        let out = inner.decode(raw);
        while t.elapsed() < cost {
            std::hint::spin_loop();
        }
        out
    }
}

fn pass(
    name: &str,
    cache: &Arc<DataCache>,
    cfg: &BenchConfig,
    workers: usize,
    compute: Duration,
) -> Result<PhaseReport> {
    let loader = Loader::new(
        cache.clone(),
        ShardPlan::single(cache.len()),
        LoaderConfig {
            batch_size: cfg.batch_size.max(1),
            seed: 1,
            workers,
            prefetch_depth: cfg.prefetch_depth.max(1),
            ..LoaderConfig::default()
        },
    )?;
    let before = cache.stats();
    let t = Instant::now();
    let mut samples = 0;
    for b in loader.epoch(0) {
        samples += b?.samples.len();
        if !compute.is_zero() {
            std::thread::sleep(compute);
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    Ok(PhaseReport {
        name: name.into(),
        samples,
        seconds,
        samples_per_s: samples as f64 / seconds.max(1e-9),
        stats: cache.stats().since(&before),
    })
}

/// Runs the bench with its files in `work_dir` (the generated source in `source/`, the disk
/// cache in `cache/`, both emptied first).
pub fn run_in(work_dir: &Path, cfg: &BenchConfig) -> Result<BenchReport> {
    let src_dir = work_dir.join("source");
    let cache_dir = work_dir.join("cache");
    for d in [&src_dir, &cache_dir] {
        let _ = std::fs::remove_dir_all(d);
    }
    generate_folder(&src_dir, cfg.samples, cfg.sample_bytes)?;
    let folder = FolderSource::open(&src_dir)?;
    let source: Arc<dyn Source> = Arc::new(ThrottledSource::new(
        folder,
        cfg.bandwidth_bytes_per_s,
        Duration::from_secs_f64(cfg.latency_s.max(0.0)),
    ));
    let decoder: Arc<dyn Decoder> = Arc::new(costly_decoder(
        cfg.sample_bytes,
        Duration::from_secs_f64(cfg.decode_cost_s.max(0.0)),
    ));
    let disk_limit = (cfg.samples as u64 + 1) * (cfg.sample_bytes as u64 + 64) * 2;
    let mem_limit = (cfg.samples as u64 + 1) * (cfg.sample_bytes as u64 * 4 + 256) * 2;
    let cached = || -> Result<Arc<DataCache>> {
        Ok(Arc::new(
            DataCache::builder_arc(source.clone(), decoder.clone())
                .disk(&cache_dir, disk_limit)
                .memory(mem_limit)
                .build()?,
        ))
    };
    let uncached = Arc::new(DataCache::builder_arc(source.clone(), decoder.clone()).build()?);
    let compute = Duration::from_secs_f64(cfg.compute_per_batch_s.max(0.0));
    let w = cfg.workers;

    let mut phases = vec![pass("uncached", &uncached, cfg, w, Duration::ZERO)?];
    let cache = cached()?;
    phases.push(pass("epoch1", &cache, cfg, w, Duration::ZERO)?);
    phases.push(pass("epoch2", &cache, cfg, w, Duration::ZERO)?);
    drop(cache);
    let rerun = cached()?; // a new run: empty memory, warm disk
    phases.push(pass("rerun_epoch1_disk", &rerun, cfg, w, Duration::ZERO)?);
    phases.push(pass("compute_no_prefetch", &uncached, cfg, 0, compute)?);
    phases.push(pass("compute_prefetch", &uncached, cfg, w, compute)?);

    let rate = |n: &str| {
        phases
            .iter()
            .find(|p| p.name == n)
            .map_or(0.0, |p| p.samples_per_s)
    };
    let secs = |n: &str| {
        phases
            .iter()
            .find(|p| p.name == n)
            .map_or(0.0, |p| p.seconds)
    };
    let batches = cfg.samples.div_ceil(cfg.batch_size.max(1)) as f64;
    let t_compute = batches * compute.as_secs_f64();
    let t_read = secs("uncached");
    let overlap = (t_read + t_compute - secs("compute_prefetch")) / t_read.min(t_compute).max(1e-9);
    Ok(BenchReport {
        config: cfg.clone(),
        epoch2_over_epoch1: rate("epoch2") / rate("epoch1").max(1e-9),
        epoch2_over_uncached: rate("epoch2") / rate("uncached").max(1e-9),
        prefetch_overlap: overlap,
        prefetch_speedup: secs("compute_no_prefetch") / secs("compute_prefetch").max(1e-9),
        phases,
    })
}

/// Runs the bench in a fresh directory under the system temp dir and removes it after.
pub fn run(cfg: &BenchConfig) -> Result<BenchReport> {
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "datacache-bench-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let r = run_in(&dir, cfg);
    let _ = std::fs::remove_dir_all(&dir);
    r
}
