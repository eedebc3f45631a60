//! Decoders under arbitrary bytes, shared by `tests/decoders_fuzz.rs` (proptest, in `cargo
//! test`) and the cargo-fuzz targets in `fuzz/`: one entry point per decoder, [`run`], that
//! must return (a typed error or a value) for every input, never panic, hang or allocate
//! without bound because of a length field.
//!
//! Decoders that read a whole buffer (`SparseGrad`'s wire form, the layer profile and
//! calibration JSON) get the bytes as they are. The wire formats inside collectives (the
//! agreement headers of the dense collectives and of the sparse algorithms' setup, the
//! sparse algorithms' messages, the all-gather counts, `SimComm`'s header, the PTO
//! trailer) are only reachable through a communicator, so they are fuzzed by *replay*: the
//! collective runs once on a `ThreadComm` world while rank 0's received messages are
//! recorded; then rank 0 runs it again alone on a [`Replay`] communicator that serves the
//! recorded messages with one of them mutated by the input, so every message of a real run
//! can be corrupted, truncated, extended or replaced, deterministically and on one thread.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use collectives::dense::{ReduceScatterAlgo, WireType};
use collectives::sparse::{build, SparseAlgo};
use collectives::{
    allgatherv, allreduce, AllgatherAlgo, AllreduceAlgo, ClockMode, Communicator, DenseOptions,
    Error, SimComm, Tag, ThreadComm, ThreadConfig,
};
use cost_model::{Link, Topology};

/// The largest single allocation a decoder may make on inputs of these sizes; a length
/// field read from the input and trusted would ask for far more.
pub const ALLOC_LIMIT: usize = 64 << 20;

/// The global allocator of every binary that includes this module: records the largest
/// single request, so a test can check that no length field was trusted, and refuses one
/// above [`ALLOC_LIMIT`] after printing where it came from (the process then aborts with
/// "memory allocation failed", a crash the fuzzer keeps, instead of exhausting memory).
pub struct MaxAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn too_large(size: usize) -> bool {
    LARGEST.fetch_max(size, Ordering::Relaxed);
    if size <= ALLOC_LIMIT {
        return false;
    }
    eprintln!("refused an allocation of {size} bytes (limit {ALLOC_LIMIT})");
    true
}

// SAFETY: forwards every call to the system allocator unchanged, or returns null (an
// allocation failure the caller must handle) for requests above the limit.
unsafe impl std::alloc::GlobalAlloc for MaxAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if too_large(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if too_large(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        if too_large(size) {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static ALLOC: MaxAlloc = MaxAlloc;

/// The largest single allocation this process has made so far.
pub fn largest_alloc() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

/// Every decoder, by name (one cargo-fuzz target each).
pub const TARGETS: [&str; 7] = [
    "sparse_grad",
    "dense_wire",
    "sparse_wire",
    "sim_header",
    "pto_trailer",
    "profile_json",
    "calibration_json",
];

/// Feeds `data` to the decoder `target` (one of [`TARGETS`]). Returns whether the decoder
/// accepted the input; panics only if the decoder did (which is the bug to find) or if
/// `target` is unknown.
pub fn run(target: &str, data: &[u8]) -> bool {
    match target {
        "sparse_grad" => sparse_grad(data),
        "dense_wire" => replayed(DENSE, data),
        "sparse_wire" => replayed(SPARSE, data),
        "sim_header" => replayed(SIM, data),
        "pto_trailer" => replayed(PTO, data),
        "profile_json" => pipeline::LayerProfile::from_json(&String::from_utf8_lossy(data)).is_ok(),
        "calibration_json" => {
            cost_model::Calibration::from_json(&String::from_utf8_lossy(data), "fuzz").is_ok()
        }
        other => panic!("unknown fuzz target {other:?}; known: {TARGETS:?}"),
    }
}

/// Valid inputs of `target` to start from: real encodings, and for the replayed targets
/// the empty mutation of every recorded message (which must decode).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "sparse_grad" => {
            let sg = sparsify::SparseGrad::<f32>::new(vec![1, 5, 9], vec![1.0, -2.5, 3.0], 12)
                .expect("a valid sparse vector");
            let h: sparsify::SparseGrad<half::f16> = sg.cast();
            let b: sparsify::SparseGrad<half::bf16> = sg.cast();
            vec![
                [&[0u8][..], &sg.encode()].concat(),
                [&[1u8][..], &h.encode()].concat(),
                [&[2u8][..], &b.encode()].concat(),
                [&[3u8][..], &sg.encode(), &sg.encode()].concat(),
            ]
        }
        "dense_wire" | "sparse_wire" | "sim_header" | "pto_trailer" => {
            let cases = match target {
                "dense_wire" => DENSE,
                "sparse_wire" => SPARSE,
                "sim_header" => SIM,
                _ => PTO,
            };
            let mut out = Vec::new();
            for c in 0..cases.len() {
                for m in 0..recording(cases, c).msgs.len().min(255) {
                    // Case, message, mode 2 (overwrite at 0 with nothing): the message as sent.
                    out.push(vec![c as u8, m as u8, 2, 0, 0]);
                }
            }
            out
        }
        "profile_json" => vec![pipeline::LayerProfile::from_sizes("fuzz", &[10, 20, 30])
            .expect("a valid profile")
            .to_json()
            .into_bytes()],
        "calibration_json" => vec![CALIBRATION_SEED.as_bytes().to_vec()],
        other => panic!("unknown fuzz target {other:?}; known: {TARGETS:?}"),
    }
}

/// A calibration in the shape `cargo xtask calibrate` writes (schema, backend, ranks,
/// topology, ping-pong fit), for the fuzzer to start from.
const CALIBRATION_SEED: &str = r#"{"schema":1,"backend":"thread","ranks":4,
"topology":{"nodes":1,"ranks_per_node":4,"intra":{"alpha_s":2e-6,"beta_s_per_byte":1e-10},
"inter":{"alpha_s":2e-6,"beta_s_per_byte":1e-10}},
"pingpong":{"model":{"alpha_s":2e-6,"beta_s_per_byte":1e-10},
"quality":{"r2":1.0,"max_rel_err":0.0,"n":2},"samples":[]},"collectives":[],"topk":[]}"#;

/// `SparseGrad`'s decoder: the first byte picks the value type (f32, f16, bf16) and
/// whether to decode one whole message or a concatenation by prefixes.
fn sparse_grad(data: &[u8]) -> bool {
    use sparsify::SparseGrad;
    let Some((&sel, bytes)) = data.split_first() else {
        return false;
    };
    match sel % 4 {
        0 => SparseGrad::<f32>::decode(bytes).is_ok(),
        1 => SparseGrad::<half::f16>::decode(bytes).is_ok(),
        2 => SparseGrad::<half::bf16>::decode(bytes).is_ok(),
        _ => {
            let mut rest = bytes;
            let mut n = 0;
            while let Ok((sg, used)) = SparseGrad::<f32>::decode_prefix(rest) {
                assert!(used > 0 && used <= rest.len(), "decode_prefix used {used}");
                assert!(sg.nnz() <= sg.len(), "nnz {} > len {}", sg.nnz(), sg.len());
                rest = &rest[used..];
                n += 1;
            }
            n > 0 && rest.is_empty()
        }
    }
}

/// Ranks of the recorded worlds.
const P: usize = 4;
/// Dense length of the recorded collectives.
const D: usize = 96;

/// A collective run on every rank of a world; rank 0's run is recorded, then replayed.
type Case = fn(Box<dyn Communicator>) -> Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn grad(rank: usize, step: usize) -> Vec<f32> {
    (0..D)
        .map(|i| (((i * 37 + rank * 11 + step * 5) % 23) as f32 - 11.0) / 7.0)
        .collect()
}

/// The dense collectives: agreement header, data, all-gather counts, every algorithm shape.
const DENSE: &[Case] = &[
    |c| dense_allreduce(&c, AllreduceAlgo::Ring, WireType::F32),
    |c| dense_allreduce(&c, AllreduceAlgo::RecursiveDoubling, WireType::Bf16),
    |c| dense_allreduce(&c, AllreduceAlgo::Rabenseifner, WireType::F16),
    |c| dense_allreduce(&c, AllreduceAlgo::Binomial, WireType::F32),
    |c| {
        let algo = AllreduceAlgo::LinearPipeline { block_bytes: 64 };
        dense_allreduce(&c, algo, WireType::F32)
    },
    |c| {
        let algo = AllreduceAlgo::Torus2d { ranks_per_node: 2 };
        dense_allreduce(&c, algo, WireType::F32)
    },
    |c| {
        let mut buf = grad(c.rank(), 0);
        let opts = DenseOptions::default();
        collectives::reduce_scatter(&c, &mut buf, ReduceScatterAlgo::default(), &opts)
            .map(|_| ())
            .map_err(s)
    },
];

fn dense_allreduce(
    c: &dyn Communicator,
    algo: AllreduceAlgo,
    wire: WireType,
) -> Result<(), String> {
    let mut buf = grad(c.rank(), 0);
    allreduce(c, &mut buf, algo, &DenseOptions::with_wire(wire)).map_err(s)
}

/// `allgatherv`, kept apart: it trusts the counts it all-gathers first and sizes its
/// output from them (`allgatherv_known` → bytemuck's zeroed vector, which panics when the
/// allocation fails), so one corrupt count word panics. Replayed only by the ignored test
/// that shows the bug (fuzz input `fuzz/known_crashes/dense_wire/`), until the counts are
/// bounded.
const ALLGATHERV: &[Case] = &[|c| {
    for algo in AllgatherAlgo::ALL {
        let mine: Vec<u32> = (0..c.rank() * 3 + 1).map(|i| i as u32).collect();
        allgatherv(&c, &mine, algo).map_err(s)?;
    }
    Ok(())
}];

/// Replays `allgatherv` with a message mutated as [`replayed`] describes; see [`ALLGATHERV`].
pub fn allgatherv_wire(data: &[u8]) -> bool {
    replayed(ALLGATHERV, data)
}

/// Every sparse allreduce but ExDyna: its setup's agreement, then two steps of its
/// messages (for Ok-Topk step 0 re-balances its regions and re-estimates its thresholds,
/// step 1 reuses them: every message kind, counts included).
const SPARSE: &[Case] = &[
    |c| sparse(&c, SparseAlgo::ALL[0]),
    |c| sparse(&c, SparseAlgo::ALL[1]),
    |c| sparse(&c, SparseAlgo::ALL[2]),
    |c| sparse(&c, SparseAlgo::ALL[3]),
    |c| sparse(&c, SparseAlgo::ALL[4]),
    |c| sparse(&c, SparseAlgo::ALL[5]),
    |c| sparse(&c, SparseAlgo::ALL[6]),
    |c| sparse(&c, SparseAlgo::ALL[7]),
    |c| sparse(&c, SparseAlgo::ALL[9]),
];

/// ExDyna, kept apart: its step all-gathers per-rank counts and pads its index list to the
/// largest, so a corrupt count once asked for up to 16 GiB; counts above the sender's
/// partition are now refused. Replayed by `exdyna_rejects_a_corrupt_count`.
const EXDYNA: &[Case] = &[|c| sparse(&c, SparseAlgo::ALL[8])];

/// Replays ExDyna with message `data[1]` mutated as [`replayed`] describes; see [`EXDYNA`].
pub fn exdyna_wire(data: &[u8]) -> bool {
    replayed(EXDYNA, data)
}

fn sparse(c: &dyn Communicator, algo: SparseAlgo) -> Result<(), String> {
    let algo = match algo {
        SparseAlgo::HiTopK {
            f16_wire, selector, ..
        } => SparseAlgo::HiTopK {
            ranks_per_node: Some(2),
            f16_wire,
            selector,
        },
        a => a,
    };
    let mut alg = build(algo, c, D, 0.1).map_err(s)?;
    for step in 0..2 {
        alg.step(c, &grad(c.rank(), step)).map_err(s)?;
    }
    Ok(())
}

/// `SimComm`'s per-message header, around a sparse and a dense collective.
const SIM: &[Case] = &[|c| {
    let link = Link::new(1e-5, 1e-9);
    let topo = Topology::flat(c.size(), link).map_err(s)?;
    let sim = SimComm::new(c, topo, ClockMode::Logical).map_err(s)?;
    sparse(&sim, SparseAlgo::ALL[4])?;
    dense_allreduce(&sim, AllreduceAlgo::Ring, WireType::F32)
}];

/// The PTO's agreement at construction and its trailer on every part of a `map`.
const PTO: &[Case] = &[|c| {
    let numels = [7usize, 3, 12, 5, 9];
    let pto = lars_pto::Pto::new(&c, &numels, 42).map_err(s)?;
    pto.map(&c, 7, Ok(()), |l| Ok(l as f32 * 1.5)).map_err(s)?;
    Ok(())
}];

/// Rank 0's received messages in one run of a case, and the splits it made.
#[derive(Default, Clone)]
struct Log {
    /// (context, source, tag, bytes), in the order rank 0 received them.
    msgs: Vec<(u64, usize, Tag, Vec<u8>)>,
    /// Sub-communicator context → (rank, size) of rank 0 in it.
    splits: HashMap<u64, (usize, usize)>,
}

/// The recording of `cases[i]`, made once per process.
fn recording(cases: &'static [Case], i: usize) -> Arc<Log> {
    type Key = (usize, usize);
    static MEMO: OnceLock<Mutex<HashMap<Key, Arc<Log>>>> = OnceLock::new();
    let key = (cases.as_ptr() as usize, i);
    let memo = MEMO.get_or_init(Default::default);
    if let Some(log) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return log.clone();
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let case = cases[i];
    let config = ThreadConfig::with_timeout(Duration::from_secs(30));
    ThreadComm::run_with(P, config, |c| {
        if c.rank() == 0 {
            case(Box::new(Recorder::new(c, log.clone(), 0)))
        } else {
            case(Box::new(c))
        }
    })
    .unwrap_or_else(|e| panic!("the unmutated run of case {i} failed: {e}"));
    let log = Arc::new(log.lock().unwrap_or_else(|e| e.into_inner()).clone());
    memo.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, log.clone());
    log
}

/// Child context of the `seq`-th split of context `ctx` (distinct for the few levels used).
fn child(ctx: u64, seq: u64) -> u64 {
    ctx * 16 + seq + 1
}

/// Rank 0 of a recorded run: forwards everything and logs what it receives.
struct Recorder<C> {
    inner: C,
    log: Arc<Mutex<Log>>,
    ctx: u64,
    splits: Cell<u64>,
}

impl<C: Communicator> Recorder<C> {
    fn new(inner: C, log: Arc<Mutex<Log>>, ctx: u64) -> Self {
        Recorder {
            inner,
            log,
            ctx,
            splits: Cell::new(0),
        }
    }

    fn note(&self, src: usize, tag: Tag, bytes: &[u8]) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.msgs.push((self.ctx, src, tag, bytes.to_vec()));
    }
}

impl<C: Communicator> Communicator for Recorder<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn send(&self, dest: usize, tag: Tag, data: &[u8]) -> collectives::Result<()> {
        self.inner.send(dest, tag, data)
    }
    fn recv(&self, src: usize, tag: Tag) -> collectives::Result<Vec<u8>> {
        let m = self.inner.recv(src, tag)?;
        self.note(src, tag, &m);
        Ok(m)
    }
    fn split(&self, color: u32, key: u32) -> collectives::Result<Box<dyn Communicator>> {
        let sub = self.inner.split(color, key)?;
        let seq = self.splits.get();
        self.splits.set(seq + 1);
        let ctx = child(self.ctx, seq);
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .splits
            .insert(ctx, (sub.rank(), sub.size()));
        Ok(Box::new(Recorder::new(sub, self.log.clone(), ctx)))
    }
    fn barrier(&self) -> collectives::Result<()> {
        self.inner.barrier()
    }
    fn backend(&self) -> String {
        format!("record({})", self.inner.backend())
    }
}

type Queues = HashMap<(u64, usize, Tag), VecDeque<Vec<u8>>>;

/// Rank 0 alone: serves the (mutated) recording per (context, source, tag) in order,
/// drops what it sends; a message that was never recorded is a timeout, as a silent peer.
struct Replay {
    rank: usize,
    size: usize,
    ctx: u64,
    queues: Arc<Mutex<Queues>>,
    splits: Arc<HashMap<u64, (usize, usize)>>,
    seq: Cell<u64>,
}

impl Communicator for Replay {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn send(&self, dest: usize, tag: Tag, _data: &[u8]) -> collectives::Result<()> {
        collectives::comm::check_rank(dest, self.size)?;
        if tag > collectives::MAX_USER_TAG + 1 {
            return Err(Error::ReservedTag {
                tag,
                max: collectives::MAX_USER_TAG,
            });
        }
        Ok(())
    }
    fn recv(&self, src: usize, tag: Tag) -> collectives::Result<Vec<u8>> {
        collectives::comm::check_rank(src, self.size)?;
        let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        q.get_mut(&(self.ctx, src, tag))
            .and_then(|q| q.pop_front())
            .ok_or(Error::Timeout {
                rank: self.rank,
                src,
                tag,
                waited: Duration::ZERO,
            })
    }
    fn split(&self, _color: u32, _key: u32) -> collectives::Result<Box<dyn Communicator>> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let ctx = child(self.ctx, seq);
        let &(rank, size) = self
            .splits
            .get(&ctx)
            .ok_or_else(|| Error::InvalidArgument("split not in the recording".into()))?;
        Ok(Box::new(Replay {
            rank,
            size,
            ctx,
            queues: self.queues.clone(),
            splits: self.splits.clone(),
            seq: Cell::new(0),
        }))
    }
    fn barrier(&self) -> collectives::Result<()> {
        Ok(())
    }
    fn backend(&self) -> String {
        "replay".into()
    }
}

/// Replays case `data[0]` of `cases` with message `data[1]` of its recording mutated by
/// `data[2]` (0: replaced by the rest; 1: truncated to `u16(data[3..5])`; 2: overwritten
/// from offset `u16(data[3..5])` by the rest, growing as needed; 3: the rest appended).
fn replayed(cases: &'static [Case], data: &[u8]) -> bool {
    let Some(&[case, msg, mode, o0, o1]) = data.first_chunk::<5>() else {
        return false;
    };
    let case = case as usize % cases.len();
    let log = recording(cases, case);
    let mut msgs = log.msgs.clone();
    if !msgs.is_empty() {
        let i = msg as usize % msgs.len();
        let bytes = &mut msgs[i].3;
        let at = u16::from_le_bytes([o0, o1]) as usize;
        let rest = &data[5..];
        match mode % 4 {
            0 => *bytes = rest.to_vec(),
            1 => bytes.truncate(at % (bytes.len() + 1)),
            2 => {
                let at = at % (bytes.len() + 1);
                let end = at + rest.len();
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[at..end].copy_from_slice(rest);
            }
            _ => bytes.extend_from_slice(rest),
        }
    }
    let mut queues = Queues::new();
    for (ctx, src, tag, bytes) in msgs {
        queues.entry((ctx, src, tag)).or_default().push_back(bytes);
    }
    let replay = Replay {
        rank: 0,
        size: P,
        ctx: 0,
        queues: Arc::new(Mutex::new(queues)),
        splits: Arc::new(log.splits.clone()),
        seq: Cell::new(0),
    };
    cases[case](Box::new(replay)).is_ok()
}
