//! Batches of a rank's shard in a reproducible order, read ahead of compute by background
//! workers (the pipelining of DataCache, MSTopK/HiTopKComm (Shi et al., MLSys 2021), §4.1:
//! "the time cost of data reading … can be almost fully overlapped by GPU computations"),
//! resumable in the middle of an epoch.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};

use crate::cache::{DataCache, Sample};
use crate::decode::Tensor;
use crate::error::{Error, Result};
use crate::order::epoch_order;
use crate::shard::ShardPlan;
use crate::stats::{add, add_time, StatsSnapshot};

/// Where a loader stands: enough to resume an epoch in the middle on another run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// The epoch being read.
    pub epoch: u64,
    /// Samples of this rank's epoch order already delivered.
    pub position: usize,
    /// The order seed.
    pub seed: u64,
}

impl LoaderState {
    /// JSON text of the state.
    pub fn to_json(&self) -> String {
        // A struct of three integers always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses [`LoaderState::to_json`] output.
    pub fn from_json(s: &str) -> Result<Self> {
        serde_json::from_str(s).map_err(|e| Error::State(format!("cannot parse state: {e}")))
    }
}

/// What the progress hook is told after every delivered batch.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Epoch being read.
    pub epoch: u64,
    /// Batches delivered so far in this epoch (counting those before a resume).
    pub batches_done: usize,
    /// Batches in the epoch.
    pub batches_total: usize,
    /// Samples of the epoch order consumed so far.
    pub samples_done: usize,
    /// Samples in this rank's epoch.
    pub samples_total: usize,
    /// The cache counters now.
    pub stats: StatsSnapshot,
}

/// A callback for progress bars (e.g. indicatif in `cargo xtask`), run on the consumer's
/// thread after each batch.
pub type ProgressHook = Arc<dyn Fn(&Progress) + Send + Sync>;

/// How a [`Loader`] batches, orders and reads ahead.
#[derive(Clone)]
pub struct LoaderConfig {
    /// Samples per batch (≥ 1).
    pub batch_size: usize,
    /// Seed of the per-epoch order.
    pub seed: u64,
    /// Shuffle the shard each epoch (else increasing index order).
    pub shuffle: bool,
    /// Drop a last batch smaller than `batch_size`.
    pub drop_last: bool,
    /// Background reader threads; 0 reads in the consumer's thread (no prefetch).
    pub workers: usize,
    /// Batches that may be read ahead of the consumer (≥ 1 when `workers > 0`).
    pub prefetch_depth: usize,
    /// Leave out samples that fail to read or decode (counted, listed in
    /// [`Batch::skipped`]) instead of failing their batch.
    pub skip_errors: bool,
    /// Called after every batch.
    pub progress: Option<ProgressHook>,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        Self {
            batch_size: 32,
            seed: 0,
            shuffle: true,
            drop_last: false,
            workers: 2,
            prefetch_depth: 4,
            skip_errors: false,
            progress: None,
        }
    }
}

impl std::fmt::Debug for LoaderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoaderConfig")
            .field("batch_size", &self.batch_size)
            .field("seed", &self.seed)
            .field("shuffle", &self.shuffle)
            .field("drop_last", &self.drop_last)
            .field("workers", &self.workers)
            .field("prefetch_depth", &self.prefetch_depth)
            .field("skip_errors", &self.skip_errors)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// One batch, samples in epoch order.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Epoch it belongs to.
    pub epoch: u64,
    /// Its number within the epoch.
    pub number: usize,
    /// The delivered samples.
    pub samples: Vec<Arc<Sample>>,
    /// Samples left out because of an error (index, message), with `skip_errors`.
    pub skipped: Vec<(usize, String)>,
}

impl Batch {
    /// Indices of the delivered samples.
    pub fn indices(&self) -> Vec<usize> {
        self.samples.iter().map(|s| s.index).collect()
    }

    /// Labels of the delivered samples.
    pub fn labels(&self) -> Vec<Option<u32>> {
        self.samples.iter().map(|s| s.label).collect()
    }

    /// The samples stacked into one `[batch, …]` tensor; fails when shapes differ.
    pub fn stack(&self) -> Result<Tensor> {
        let Some(first) = self.samples.first() else {
            return Ok(Tensor {
                shape: vec![0],
                data: Vec::new(),
            });
        };
        let shape = &first.tensor.shape;
        let mut data = Vec::with_capacity(self.samples.len() * first.tensor.data.len());
        for s in &self.samples {
            if &s.tensor.shape != shape {
                return Err(Error::Config(format!(
                    "cannot stack sample {} of shape {:?} with shape {shape:?}",
                    s.index, s.tensor.shape
                )));
            }
            data.extend_from_slice(&s.tensor.data);
        }
        let mut full = vec![self.samples.len()];
        full.extend_from_slice(shape);
        Ok(Tensor { shape: full, data })
    }
}

/// Reads one rank's shard of a [`DataCache`] in batches.
#[derive(Debug, Clone)]
pub struct Loader {
    cache: Arc<DataCache>,
    cfg: LoaderConfig,
    shard: Arc<Vec<usize>>,
}

impl Loader {
    /// Checks the configuration against the cache and the plan.
    pub fn new(cache: Arc<DataCache>, plan: ShardPlan, cfg: LoaderConfig) -> Result<Self> {
        if cfg.batch_size == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        if cfg.workers > 0 && cfg.prefetch_depth == 0 {
            return Err(Error::Config(
                "prefetch depth must be at least 1 when there are workers".into(),
            ));
        }
        if plan.dataset_len() != cache.len() {
            return Err(Error::Config(format!(
                "shard plan is for {} samples but the data set has {}",
                plan.dataset_len(),
                cache.len()
            )));
        }
        Ok(Self {
            cache,
            cfg,
            shard: Arc::new(plan.indices()),
        })
    }

    /// The cache read through.
    pub fn cache(&self) -> &Arc<DataCache> {
        &self.cache
    }

    /// Samples in this rank's shard.
    pub fn shard_len(&self) -> usize {
        self.shard.len()
    }

    /// Samples delivered per epoch (the shard, less a dropped last batch).
    pub fn samples_per_epoch(&self) -> usize {
        if self.cfg.drop_last {
            self.shard.len() / self.cfg.batch_size * self.cfg.batch_size
        } else {
            self.shard.len()
        }
    }

    /// Batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.samples_per_epoch().div_ceil(self.cfg.batch_size)
    }

    /// This rank's sample indices in the order of `epoch`.
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        epoch_order(&self.shard, self.cfg.seed, epoch, self.cfg.shuffle)
    }

    /// Reads `epoch` from its start.
    pub fn epoch(&self, epoch: u64) -> EpochIter {
        self.start(epoch, 0)
    }

    /// Continues the epoch a saved state stands in; a state at the end of an epoch yields
    /// nothing (its `state()` moves to the next epoch). The seed must match the loader's.
    pub fn resume(&self, state: &LoaderState) -> Result<EpochIter> {
        if state.seed != self.cfg.seed {
            return Err(Error::State(format!(
                "state seed {} differs from the loader seed {}",
                state.seed, self.cfg.seed
            )));
        }
        if state.position > self.shard.len() {
            return Err(Error::State(format!(
                "position {} is past the shard of {} samples",
                state.position,
                self.shard.len()
            )));
        }
        Ok(self.start(state.epoch, state.position))
    }

    fn start(&self, epoch: u64, position: usize) -> EpochIter {
        let order = self.order(epoch);
        let end = self.samples_per_epoch().max(position.min(order.len()));
        let bs = self.cfg.batch_size;
        let mut batches = Vec::new();
        let mut p = position;
        while p < end {
            let q = (p + bs).min(end);
            batches.push((p, q));
            p = q;
        }
        let first_number = position.div_ceil(bs);
        let job = Arc::new(Job {
            cache: self.cache.clone(),
            order,
            batches,
            epoch,
            first_number,
            skip_errors: self.cfg.skip_errors,
        });
        let prefetch = (self.cfg.workers > 0 && !job.batches.is_empty())
            .then(|| Prefetch::spawn(job.clone(), self.cfg.workers, self.cfg.prefetch_depth));
        EpochIter {
            job,
            next: 0,
            position,
            seed: self.cfg.seed,
            end,
            total_batches: self.batches_per_epoch(),
            progress: self.cfg.progress.clone(),
            prefetch,
            failed: false,
        }
    }
}

/// What the workers need to build batch `i` of an epoch.
struct Job {
    cache: Arc<DataCache>,
    order: Vec<usize>,
    /// (start, end) positions in `order`, for the batches still to deliver.
    batches: Vec<(usize, usize)>,
    epoch: u64,
    first_number: usize,
    skip_errors: bool,
}

impl Job {
    fn load(&self, i: usize) -> Result<Batch> {
        let (a, b) = self.batches[i];
        let mut samples = Vec::with_capacity(b - a);
        let mut skipped = Vec::new();
        for &index in &self.order[a..b] {
            match self.cache.get(index) {
                Ok(s) => samples.push(s),
                Err(e @ (Error::Read { .. } | Error::Decode { .. })) if self.skip_errors => {
                    tracing::warn!(index, error = %e, "skipping sample");
                    add(&self.cache.stats_ref().skipped, 1);
                    skipped.push((index, e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Batch {
            epoch: self.epoch,
            number: self.first_number + i,
            samples,
            skipped,
        })
    }

    /// [`Job::load`] with a panicking decoder turned into an error, so that the consumer
    /// never waits for a batch that will not come.
    fn load_caught(&self, i: usize) -> Result<Batch> {
        catch_unwind(AssertUnwindSafe(|| self.load(i))).unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            Err(Error::Worker(format!("batch {i}: {msg}")))
        })
    }
}

#[derive(Default)]
struct Gate {
    next: usize,
    consumed: usize,
    stop: bool,
}

struct Prefetch {
    gate: Arc<(Mutex<Gate>, Condvar)>,
    rx: Receiver<(usize, Result<Batch>)>,
    ready: BTreeMap<usize, Result<Batch>>,
    handles: Vec<JoinHandle<()>>,
}

impl Prefetch {
    fn spawn(job: Arc<Job>, workers: usize, depth: usize) -> Self {
        let gate = Arc::new((Mutex::new(Gate::default()), Condvar::new()));
        let (tx, rx) = crossbeam_channel::unbounded();
        let handles = (0..workers.min(job.batches.len()))
            .map(|_| {
                let (job, gate, tx) = (job.clone(), gate.clone(), tx.clone());
                std::thread::spawn(move || worker(&job, &gate, &tx, depth))
            })
            .collect();
        Self {
            gate,
            rx,
            ready: BTreeMap::new(),
            handles,
        }
    }

    fn consumed(&self, n: usize) {
        let (m, cv) = &*self.gate;
        m.lock().unwrap_or_else(|p| p.into_inner()).consumed = n;
        cv.notify_all();
    }
}

/// Takes batch numbers in order, never more than `depth` ahead of the consumer.
fn worker(
    job: &Job,
    gate: &(Mutex<Gate>, Condvar),
    tx: &Sender<(usize, Result<Batch>)>,
    depth: usize,
) {
    let (m, cv) = gate;
    loop {
        let i = {
            let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
            while !g.stop && g.next < job.batches.len() && g.next >= g.consumed + depth {
                g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            if g.stop || g.next >= job.batches.len() {
                return;
            }
            g.next += 1;
            g.next - 1
        };
        if tx.send((i, job.load_caught(i))).is_err() {
            return;
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.gate;
            m.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
            cv.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// The batches of one epoch, in order. Dropping it stops the workers.
pub struct EpochIter {
    job: Arc<Job>,
    next: usize,
    position: usize,
    seed: u64,
    end: usize,
    total_batches: usize,
    progress: Option<ProgressHook>,
    prefetch: Option<Prefetch>,
    failed: bool,
}

impl EpochIter {
    /// The state after the last delivered batch; at the end of the epoch it points to the
    /// start of the next one.
    pub fn state(&self) -> LoaderState {
        if self.position >= self.end && self.next >= self.job.batches.len() {
            LoaderState {
                epoch: self.job.epoch + 1,
                position: 0,
                seed: self.seed,
            }
        } else {
            LoaderState {
                epoch: self.job.epoch,
                position: self.position,
                seed: self.seed,
            }
        }
    }

    /// Batches still to come.
    pub fn remaining(&self) -> usize {
        self.job.batches.len() - self.next
    }

    fn fetch(&mut self, i: usize) -> Result<Batch> {
        let Some(pf) = self.prefetch.as_mut() else {
            return self.job.load_caught(i);
        };
        let failed = &mut self.failed;
        loop {
            if let Some(r) = pf.ready.remove(&i) {
                return r;
            }
            match pf.rx.recv() {
                Ok((j, r)) => {
                    pf.ready.insert(j, r);
                }
                Err(_) => {
                    *failed = true;
                    return Err(Error::Worker("all prefetch workers exited".into()));
                }
            }
        }
    }
}

impl Iterator for EpochIter {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.next >= self.job.batches.len() {
            return None;
        }
        let i = self.next;
        let t = Instant::now();
        let r = self.fetch(i);
        add_time(&self.job.cache.stats_ref().wait_ns, t.elapsed());
        self.next += 1;
        self.position = self.job.batches[i].1;
        if let Some(pf) = &self.prefetch {
            pf.consumed(self.next);
        }
        if let Some(hook) = &self.progress {
            hook(&Progress {
                epoch: self.job.epoch,
                batches_done: self.job.first_number + self.next,
                batches_total: self.total_batches,
                samples_done: self.position,
                samples_total: self.end,
                stats: self.job.cache.stats(),
            });
        }
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining();
        (n, Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::U8Decoder;
    use crate::shard::ShardMode;
    use crate::source::VecSource;
    use proptest::prelude::*;

    fn cache(n: usize) -> Arc<DataCache> {
        let src = VecSource::new("t", (0..n).map(|i| (vec![i as u8], None)).collect());
        Arc::new(
            DataCache::builder(src, U8Decoder::new(vec![1]))
                .memory(1 << 16)
                .build()
                .unwrap(),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Stopping anywhere and resuming from the saved state reproduces the epoch order
        /// exactly; every shard index comes exactly once.
        #[test]
        fn resume_anywhere_reproduces_the_order(
            n in 0usize..60, world in 1usize..4, rank_pick in 0usize..4, batch in 1usize..9,
            workers in 0usize..3, depth in 1usize..4, stop in 0usize..12, seed in any::<u64>(),
            epoch in 0u64..5,
        ) {
            let rank = rank_pick % world;
            let plan = ShardPlan::new(n, world, rank, ShardMode::Strided).unwrap();
            let cfg = LoaderConfig {
                batch_size: batch, seed, workers, prefetch_depth: depth,
                ..LoaderConfig::default()
            };
            let loader = Loader::new(cache(n), plan, cfg).unwrap();
            let mut it = loader.epoch(epoch);
            let mut got = Vec::new();
            for _ in 0..stop {
                match it.next() {
                    Some(b) => got.extend(b.unwrap().indices()),
                    None => break,
                }
            }
            let state = LoaderState::from_json(&it.state().to_json()).unwrap();
            drop(it);
            if state.epoch == epoch {
                for b in loader.resume(&state).unwrap() {
                    got.extend(b.unwrap().indices());
                }
            } else {
                prop_assert_eq!(state, LoaderState { epoch: epoch + 1, position: 0, seed });
            }
            prop_assert_eq!(&got, &loader.order(epoch));
            let mut sorted = got.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, plan.indices());
        }
    }

    #[test]
    fn rejects_bad_config() {
        let c = cache(4);
        let plan = ShardPlan::single(4);
        let zero = LoaderConfig {
            batch_size: 0,
            ..LoaderConfig::default()
        };
        assert!(Loader::new(c.clone(), plan, zero).is_err());
        let depth = LoaderConfig {
            prefetch_depth: 0,
            workers: 1,
            ..LoaderConfig::default()
        };
        assert!(Loader::new(c, plan, depth).is_err());
    }
}
