//! Timing PTO against every-rank-computes-everything, for the criterion bench
//! (`benches/pto.rs`) and the `lars` suite of `cargo xtask bench`.
//!
//! A [`BenchWorld`] keeps `P` rank threads of a [`ThreadComm`] world alive across
//! iterations (spawning threads per iteration would dominate the time): each call to
//! [`BenchWorld::run`] makes every rank do `iters` coefficient computations, each started
//! by a barrier, and returns the time rank 0 spent in them, all-gather included.
//!
//! Each rank gets its own copy of the inputs, as ranks of a real job each hold theirs: with
//! one shared copy, ranks that all compute every layer in lockstep would read the same cache
//! lines and make the "local" baseline look cheaper than it is. When `P` copies would exceed
//! [`copy_budget_bytes`] (BERT-base at P = 8), the ranks share one read-only copy instead.
//!
//! The model sizes are local lists (this crate cannot depend on `pipeline`'s model zoo).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use collectives::{Communicator, ThreadComm, ThreadConfig};

use crate::{Error, Lamb, LambConfig, Lars, LarsConfig, LayerSpec, Mode, Result};

/// Which optimizer's coefficients to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Optimizer {
    /// LARS: ‖w‖, ‖g‖ and the trust ratio per layer.
    Lars,
    /// LAMB: ‖w‖ and ‖u‖ of the Adam direction (computed on the fly) per layer.
    Lamb,
}

impl Optimizer {
    /// `lars` or `lamb`.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Lars => "lars",
            Optimizer::Lamb => "lamb",
        }
    }
}

/// Element counts of ResNet-50's 161 parameter tensors in forward order (He et al. 2016,
/// torchvision layout: each convolution weight followed by its batch norm's γ and β;
/// 25,557,032 in total).
pub fn resnet50_numels() -> Vec<usize> {
    let mut v = vec![64 * 3 * 7 * 7, 64, 64];
    let mut inp = 64;
    for (blocks, width) in [(3, 64), (4, 128), (6, 256), (3, 512)] {
        for b in 0..blocks {
            let out = width * 4;
            v.extend([inp * width, width, width]);
            v.extend([width * width * 9, width, width]);
            v.extend([width * out, out, out]);
            if b == 0 {
                v.extend([inp * out, out, out]);
            }
            inp = out;
        }
    }
    v.extend([2048 * 1000, 1000]);
    v
}

/// Element counts of BERT-base's 199 parameter tensors (Devlin et al. 2019: 12 layers,
/// hidden 768, 12 heads, intermediate 3072, vocabulary 30522; embeddings, encoder, pooler;
/// 109,482,240 in total).
pub fn bert_base_numels() -> Vec<usize> {
    let h = 768;
    let mut v = vec![30522 * h, 512 * h, 2 * h, h, h];
    for _ in 0..12 {
        for _ in 0..4 {
            v.extend([h * h, h]); // query, key, value, attention output
        }
        v.extend([h, h]); // attention LayerNorm
        v.extend([h * 3072, 3072, 3072 * h, h]); // feed-forward
        v.extend([h, h]); // output LayerNorm
    }
    v.extend([h * h, h]); // pooler
    v
}

/// A model by name, for command lines: `resnet50` or `bert-base`.
pub fn model_numels(name: &str) -> Option<Vec<usize>> {
    match name {
        "resnet50" | "resnet-50" => Some(resnet50_numels()),
        "bert-base" | "bert_base" | "bert" => Some(bert_base_numels()),
        _ => None,
    }
}

/// The inputs every rank shares (read-only, as after aggregation every rank holds the same
/// values): weights, gradients and LAMB moments, filled with a fixed pseudo-random pattern.
#[derive(Debug)]
pub struct ModelData {
    /// Layer sizes.
    pub numels: Vec<usize>,
    /// Weights.
    pub weights: Vec<Vec<f32>>,
    /// Gradients.
    pub grads: Vec<Vec<f32>>,
    /// LAMB first moments (empty for LARS).
    pub exp_avg: Vec<Vec<f32>>,
    /// LAMB second moments (empty for LARS).
    pub exp_avg_sq: Vec<Vec<f32>>,
}

impl ModelData {
    /// Bytes held by all tensors.
    pub fn bytes(&self) -> usize {
        [&self.weights, &self.grads, &self.exp_avg, &self.exp_avg_sq]
            .iter()
            .map(|t| t.iter().map(|x| x.len() * 4).sum::<usize>())
            .sum()
    }

    /// Data for `numels`, with moments only when `opt` needs them.
    pub fn new(numels: &[usize], opt: Optimizer, seed: u64) -> ModelData {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut fill = |n: usize, scale: f32, positive: bool| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    // xorshift64*: cheap, and the values only need to be non-degenerate.
                    state ^= state >> 12;
                    state ^= state << 25;
                    state ^= state >> 27;
                    let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                    let u = r as f32 / (1u64 << 24) as f32; // [0, 1)
                    if positive {
                        scale * (u + 0.01)
                    } else {
                        scale * (2.0 * u - 1.0)
                    }
                })
                .collect()
        };
        let weights = numels.iter().map(|&n| fill(n, 0.05, false)).collect();
        let grads = numels.iter().map(|&n| fill(n, 1e-3, false)).collect();
        let (exp_avg, exp_avg_sq) = match opt {
            Optimizer::Lars => (Vec::new(), Vec::new()),
            Optimizer::Lamb => (
                numels.iter().map(|&n| fill(n, 1e-4, false)).collect(),
                numels.iter().map(|&n| fill(n, 1e-7, true)).collect(),
            ),
        };
        ModelData {
            numels: numels.to_vec(),
            weights,
            grads,
            exp_avg,
            exp_avg_sq,
        }
    }
}

/// Largest total size of per-rank input copies a [`BenchWorld`] makes: 4 GiB, or
/// `LARS_PTO_BENCH_COPY_BUDGET` bytes when that is set.
pub fn copy_budget_bytes() -> usize {
    std::env::var("LARS_PTO_BENCH_COPY_BUDGET")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4 << 30)
}

enum Cmd {
    Run(u64),
    Stop,
}

/// `P` rank threads that stay alive across measurements.
pub struct BenchWorld {
    per_rank_copies: bool,
    cmds: Vec<Sender<Cmd>>,
    done: Receiver<(usize, Result<Duration>)>,
    handles: Vec<JoinHandle<()>>,
}

impl BenchWorld {
    /// Starts `p` ranks that compute `opt`'s coefficients over `data` in `mode`, each on its
    /// own copy of `data` when `p` copies fit in [`copy_budget_bytes`].
    pub fn new(p: usize, data: Arc<ModelData>, opt: Optimizer, mode: Mode) -> Result<BenchWorld> {
        let per_rank_copies = p > 1 && p.saturating_mul(data.bytes()) <= copy_budget_bytes();
        let comms = ThreadComm::world(p, ThreadConfig::with_timeout(Duration::from_secs(300)))?;
        let (done_tx, done) = channel();
        let mut cmds = Vec::with_capacity(p);
        let mut handles = Vec::with_capacity(p);
        for comm in comms {
            let (tx, rx) = channel::<Cmd>();
            cmds.push(tx);
            let data = data.clone();
            let done_tx = done_tx.clone();
            handles.push(std::thread::spawn(move || {
                if per_rank_copies {
                    let own = ModelData {
                        numels: data.numels.clone(),
                        weights: data.weights.clone(),
                        grads: data.grads.clone(),
                        exp_avg: data.exp_avg.clone(),
                        exp_avg_sq: data.exp_avg_sq.clone(),
                    };
                    drop(data);
                    rank_main(comm, &own, opt, mode, rx, done_tx)
                } else {
                    rank_main(comm, &data, opt, mode, rx, done_tx)
                }
            }));
        }
        let world = BenchWorld {
            per_rank_copies,
            cmds,
            done,
            handles,
        };
        world.collect()?; // construction outcome of every rank
        Ok(world)
    }

    /// Whether every rank works on its own copy of the inputs.
    pub fn per_rank_copies(&self) -> bool {
        self.per_rank_copies
    }

    /// Runs `iters` steps on every rank; returns rank 0's total time in them.
    pub fn run(&self, iters: u64) -> Result<Duration> {
        for c in &self.cmds {
            c.send(Cmd::Run(iters)).map_err(|_| stopped())?;
        }
        self.collect()
    }

    fn collect(&self) -> Result<Duration> {
        let mut rank0 = Duration::ZERO;
        let mut first_err = None;
        for _ in 0..self.cmds.len() {
            let (rank, r) = self.done.recv().map_err(|_| stopped())?;
            match r {
                Ok(d) if rank == 0 => rank0 = d,
                Ok(_) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(rank0),
        }
    }
}

impl Drop for BenchWorld {
    fn drop(&mut self) {
        for c in &self.cmds {
            let _ = c.send(Cmd::Stop);
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn stopped() -> Error {
    Error::Protocol {
        src: 0,
        detail: "a bench rank thread stopped".into(),
    }
}

enum Opt {
    Lars(Lars),
    Lamb(Lamb),
}

fn rank_main(
    comm: ThreadComm,
    data: &ModelData,
    opt: Optimizer,
    mode: Mode,
    rx: Receiver<Cmd>,
    done: Sender<(usize, Result<Duration>)>,
) {
    let rank = comm.rank();
    let layers: Vec<LayerSpec> = data
        .numels
        .iter()
        .enumerate()
        .map(|(i, &n)| LayerSpec::new(format!("layer{i}"), n))
        .collect();
    let built = match opt {
        Optimizer::Lars => Lars::new(&comm, LarsConfig::default(), &layers).map(Opt::Lars),
        Optimizer::Lamb => Lamb::new(&comm, LambConfig::default(), &layers).map(Opt::Lamb),
    };
    let mut o = match built {
        Ok(o) => {
            let _ = done.send((rank, Ok(Duration::ZERO)));
            o
        }
        Err(e) => {
            let _ = done.send((rank, Err(e)));
            return;
        }
    };
    match &mut o {
        Opt::Lars(l) => l.set_mode(mode),
        Opt::Lamb(l) => l.set_mode(mode),
    }
    while let Ok(Cmd::Run(iters)) = rx.recv() {
        let r = (|| -> Result<Duration> {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                comm.barrier()?;
                let t0 = Instant::now();
                let n = match &o {
                    Opt::Lars(l) => l
                        .coefficients(&comm, &data.weights, &data.grads, 0.1)?
                        .len(),
                    Opt::Lamb(l) => l
                        .trust_ratios(
                            &comm,
                            &data.weights,
                            &data.grads,
                            &data.exp_avg,
                            &data.exp_avg_sq,
                            10,
                        )?
                        .len(),
                };
                total += t0.elapsed();
                std::hint::black_box(n);
            }
            Ok(total)
        })();
        if done.send((rank, r)).is_err() {
            return;
        }
    }
}

/// Seconds per coefficient step on rank 0 (all-gather included), the mean over `iters`
/// steps after one warm-up step, for `p` ranks on [`ThreadComm`]. What the `lars` suite of
/// `cargo xtask bench` calls, once with [`Mode::Parallel`] and once with [`Mode::Local`].
pub fn bench_step(
    p: usize,
    numels: &[usize],
    opt: Optimizer,
    mode: Mode,
    iters: u64,
) -> Result<f64> {
    let data = Arc::new(ModelData::new(numels, opt, 1));
    let world = BenchWorld::new(p, data, opt, mode)?;
    world.run(1)?;
    let t = world.run(iters.max(1))?;
    Ok(t.as_secs_f64() / iters.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_sizes_match_the_published_totals() {
        let r = resnet50_numels();
        assert_eq!(r.len(), 161);
        assert_eq!(r.iter().sum::<usize>(), 25_557_032);
        let b = bert_base_numels();
        assert_eq!(b.len(), 199);
        assert_eq!(b.iter().sum::<usize>(), 109_482_240);
    }

    #[test]
    fn bench_step_runs_for_both_modes() {
        let numels = [1000, 10, 2000, 5];
        for opt in [Optimizer::Lars, Optimizer::Lamb] {
            for mode in [Mode::Parallel, Mode::Local] {
                let s = bench_step(3, &numels, opt, mode, 2).unwrap();
                assert!(s >= 0.0);
            }
        }
    }
}
