//! CUDA selectors (feature `cuda`) on device-resident gradients.
//!
//! [`CudaSparsifier`] runs error feedback fused with a selector on device buffers (anything
//! cudarc can hand out a device pointer for: a [`CudaSlice`], a view of one, or a candle
//! CUDA tensor's storage, without a copy), and copies only the selected (index, value)
//! pairs to the host, optionally rounded to `f16`/`bf16` for the wire with the rounding
//! error kept in the residual (as [`crate::ErrorFeedback::step_as`] does on the CPU).
//! [`CudaSparsifier::apply_sparse`] applies an aggregated sparse update on the device.
//!
//! Selectors and their passes over the `d` dense elements:
//! - exact top-k (ties: lower index), radix select: one fused pass `r += g` that also
//!   builds the level-0 magnitude histogram (12 bytes per element), a parallel bin search,
//!   one ordered compaction of the candidates at or above the chosen bin (4 bytes per
//!   element, decoupled look-back scan); the two finer radix levels and the final ordered
//!   emission run on the candidates only;
//! - MSTopK (Shi et al., MLSys 2021, Algorithm 1) with the candidate shortcut of the CPU
//!   path: the same two passes, then the N rounds in one block over the candidates;
//! - hard threshold and ExDyna's partition-wise threshold (Yoon & Oh, CCGrid 2024,
//!   Algorithm 4): one fused pass that accumulates and emits in order.
//!
//! Results equal the CPU selectors': the same indices for exact top-k and the thresholds;
//! for MSTopK the same thresholds, hence the same selection, whenever the device's sum of
//! `|x|` equals the CPU's (it is summed in a different order, so the last bits of the mean
//! can differ on general data). The random offset is drawn on the host from the same
//! seeded stream as [`crate::MsTopK`].
//!
//! On a non-finite value every path returns [`Error::NonFinite`] naming the smallest such
//! index and leaves the residual holding `residual + grad` (nothing zeroed), like the CPU.
//!
//! Kernels are CUDA C in `kernels.cu`, compiled at run time by NVRTC for the device's own
//! architecture. Nothing here runs without a GPU: [`CudaSparsifier::available`] checks for
//! libcuda first (creating a context without it panics inside cudarc) and then for a device.

use std::ops::Range;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceSlice, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Error, Result, SelectInfo, SparseGrad, Value};

/// The CUDA C source of every kernel.
pub const KERNELS: &str = include_str!("kernels.cu");

/// The oldest virtual architecture the kernels build for (`__match_any_sync` and
/// `__nanosleep` need compute capability 7.0). NVRTC 13 no longer targets it; at run time
/// the kernels are compiled for the device's own architecture instead.
pub const PORTABLE_ARCH: &str = "compute_70";

/// The architecture of the H100 and H200, the devices the figures are measured on.
pub const HOPPER_ARCH: &str = "compute_90";

/// True when libnvrtc can be loaded (no GPU needed).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library; no symbol is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The loaded NVRTC's (major, minor) version, or `None` without libnvrtc.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above) and both pointers are valid.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (rc == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// Compiles `source` (the kernels, possibly with checks appended) to PTX with NVRTC for
/// the virtual architecture `arch` (e.g. `"compute_90"`).
pub fn compile_kernels_source(
    source: &str,
    arch: &str,
) -> std::result::Result<cudarc::nvrtc::Ptx, String> {
    cudarc::nvrtc::compile_ptx_with_opts(
        source,
        cudarc::nvrtc::CompileOptions {
            options: vec![format!("--gpu-architecture={arch}"), "-std=c++14".into()],
            ..Default::default()
        },
    )
    .map_err(|e| format!("NVRTC ({arch}): {e}"))
}

/// Compiles [`KERNELS`] to PTX with NVRTC for `arch`.
pub fn compile_kernels(arch: &str) -> std::result::Result<cudarc::nvrtc::Ptx, String> {
    compile_kernels_source(KERNELS, arch)
}

/// Mirror of `struct State` in `kernels.cu`: every selection decision lives here on the
/// device; the host writes it once per call and reads it back once or twice.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
struct State {
    a_bits: u32,
    b_lo: u32,
    part_lo: u64,
    part_hi: u64,
    b_start: u64,
    b_need: u64,
    prefix: u32,
    t_low: u32,
    k_rem: u64,
    first_bad: u64,
    n_cand: u64,
    cand_cap: u64,
    count: u64,
    out_cap: u64,
    total_a: u64,
    total_b: u64,
    argmax_key: u64,
    abs_sum: f64,
    max_bits: u32,
    t1_bits: u32,
    t2_bits: u32,
    from_cand: u32,
    k1: u64,
    len2: u64,
    k_sel: u64,
}

const STATE_WORDS: usize = std::mem::size_of::<State>() / 8;
const NONE: u64 = u64::MAX;

/// Field offsets of the host's `State`, in declaration order, as `core::mem::offset_of!`
/// gives them; the layout tests compare them with the kernel's `offsetof`.
pub fn state_layout() -> Vec<(&'static str, usize)> {
    use std::mem::offset_of;
    vec![
        ("a_bits", offset_of!(State, a_bits)),
        ("b_lo", offset_of!(State, b_lo)),
        ("part_lo", offset_of!(State, part_lo)),
        ("part_hi", offset_of!(State, part_hi)),
        ("b_start", offset_of!(State, b_start)),
        ("b_need", offset_of!(State, b_need)),
        ("prefix", offset_of!(State, prefix)),
        ("t_low", offset_of!(State, t_low)),
        ("k_rem", offset_of!(State, k_rem)),
        ("first_bad", offset_of!(State, first_bad)),
        ("n_cand", offset_of!(State, n_cand)),
        ("cand_cap", offset_of!(State, cand_cap)),
        ("count", offset_of!(State, count)),
        ("out_cap", offset_of!(State, out_cap)),
        ("total_a", offset_of!(State, total_a)),
        ("total_b", offset_of!(State, total_b)),
        ("argmax_key", offset_of!(State, argmax_key)),
        ("abs_sum", offset_of!(State, abs_sum)),
        ("max_bits", offset_of!(State, max_bits)),
        ("t1_bits", offset_of!(State, t1_bits)),
        ("t2_bits", offset_of!(State, t2_bits)),
        ("from_cand", offset_of!(State, from_cand)),
        ("k1", offset_of!(State, k1)),
        ("len2", offset_of!(State, len2)),
        ("k_sel", offset_of!(State, k_sel)),
    ]
}

/// Size in bytes of the host's `State`.
pub fn state_size() -> usize {
    std::mem::size_of::<State>()
}

/// The kernel's `struct State` layout as NVRTC compiles it, without a GPU: `source` (the
/// kernels) is compiled with a device-global `State` and a table of its fields' addresses,
/// which NVRTC emits into the PTX as constant initialisers (`generic(probe)+8`, ...).
/// Returns the offset of every field named by [`state_layout`], in that order, then
/// `sizeof(State)`.
pub fn nvrtc_state_layout(source: &str, arch: &str) -> std::result::Result<Vec<u64>, String> {
    let names: Vec<&str> = state_layout().iter().map(|(n, _)| *n).collect();
    let mut src = String::from(source);
    src.push_str("\n__device__ State sparsify_layout_probe;\n");
    src.push_str("__device__ const void* sparsify_layout_fields[] = {");
    for n in &names {
        src.push_str(&format!("&sparsify_layout_probe.{n}, "));
    }
    src.push_str("};\n__device__ unsigned long long sparsify_layout_size = sizeof(State);\n");
    let ptx = compile_kernels_source(&src, arch)?.to_src();
    let line = |var: &str| {
        ptx.lines()
            .find(|l| l.contains(var) && l.contains('='))
            .map(str::to_owned)
            .ok_or_else(|| format!("no initialiser of {var} in the PTX"))
    };
    let fields = line("sparsify_layout_fields")?;
    let inner = fields
        .split_once('{')
        .and_then(|(_, r)| r.split_once('}'))
        .map(|(x, _)| x)
        .ok_or_else(|| format!("unexpected PTX: {fields}"))?;
    let mut out = Vec::with_capacity(names.len() + 1);
    for item in inner.split(',') {
        let off = match item.trim().split_once('+') {
            None => 0,
            Some((_, o)) => o
                .trim()
                .parse::<u64>()
                .map_err(|e| format!("{item}: {e}"))?,
        };
        out.push(off);
    }
    if out.len() != names.len() {
        return Err(format!(
            "{} field addresses for {} fields",
            out.len(),
            names.len()
        ));
    }
    let size = line("sparsify_layout_size")?;
    let size = size
        .rsplit_once('=')
        .map(|(_, v)| v.trim().trim_end_matches(';').trim())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| format!("unexpected PTX: {size}"))?;
    out.push(size);
    Ok(out)
}

impl State {
    /// A state for a call over `n` elements: no classes, nothing found, whole partition.
    fn fresh(n: u64) -> Self {
        State {
            a_bits: u32::MAX,
            b_lo: u32::MAX,
            part_hi: n,
            first_bad: NONE,
            t1_bits: 0x7fff_ffff,
            ..Zeroable::zeroed()
        }
    }
}

fn cu<E: std::fmt::Display>(e: E) -> Error {
    Error::Cuda(e.to_string())
}

/// Threshold bits for "`|x| ≥ t`" (NaN or `t ≤ 0`: 0, everything), as the CPU's selectors.
fn ge_bits(t: f32) -> u32 {
    if t > 0.0 {
        (t.to_bits() & 0x7fff_ffff).min(0x7f80_0000)
    } else {
        0
    }
}

/// Where one selection's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallTimes {
    /// Device time from the call's first operation to its last kernel, measured with CUDA
    /// events (as `torch.cuda.Event` times torch's kernels): launch gaps included, the copy
    /// of the pairs to the host not.
    pub device: std::time::Duration,
    /// Wall-clock time until the state and the pairs were on the host (launches, device
    /// work, copies, synchronisation).
    pub to_state: std::time::Duration,
    /// Wall-clock time to turn the staged pairs into the `SparseGrad` (copy and validation).
    pub host_build: std::time::Duration,
}

/// Which selector [`CudaSparsifier::select_fused`] runs.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuSelection {
    /// Exactly `min(k, d)` entries of largest magnitude, ties broken by the lower index
    /// (as [`crate::ExactTopK`]).
    Exact,
    /// MSTopK with `rounds` binary-search rounds (as [`crate::MsTopK`] with the same seed).
    MsTopK {
        /// `N` of Algorithm 1 (the paper benchmarks 30).
        rounds: usize,
    },
    /// Every `|acc| ≥ threshold` (as [`crate::HardThreshold::new`]); `k` only decides the
    /// edges `k = 0` (nothing) and `k ≥ d` (everything).
    Threshold(f32),
    /// ExDyna's Algorithm 4: `|acc| ≥ threshold` inside `range` (None: everything); when
    /// that selects nothing and `k > 0`, the largest magnitude of the partition. The caller
    /// scales the threshold afterwards (e.g. [`crate::ExDyna::scale`]), as with
    /// `set_auto_scale(false)` on the CPU.
    ExDyna {
        /// The partition this worker selects from.
        range: Option<Range<usize>>,
        /// δ_t.
        threshold: f32,
    },
}

/// Kernels loaded from one module.
struct Kernels {
    accumulate: CudaFunction,
    radix_hist: CudaFunction,
    radix_pick: CudaFunction,
    compact: CudaFunction,
    ms_rounds: CudaFunction,
    part_argmax: CudaFunction,
    finish: CudaFunction,
    scatter_add: CudaFunction,
    state_layout: CudaFunction,
    sample_abs: CudaFunction,
    ef_candidates: CudaFunction,
    mark_classes: CudaFunction,
    emit_marked: CudaFunction,
}

/// Threads per block of the grid-stride kernels.
const THREADS: u32 = 256;
/// Elements per tile of the fused accumulate pass (`AT * AI` in kernels.cu).
const ACC_TILE: u64 = 256 * 8;
/// Elements per tile of the ordered compaction (`CTILE` in kernels.cu).
const COMPACT_TILE: u64 = 256 * 16;
/// Bins of the level-0 histogram.
const HBINS: usize = 2048;
/// Radix levels below level 0: (shift, width) of bits 19..9 and 8..0.
const FINE_LEVELS: [(i32, i32); 2] = [(9, 11), (0, 9)];
/// All three radix levels, level 0 (bits 30..20) first.
const LEVELS: [(i32, i32); 3] = [(20, 11), (9, 11), (0, 9)];
/// Samples of `r + g` that place the one-pass path's candidate bound.
const SAMPLES: u64 = 1 << 16;
/// Threads per block of the fused candidate pass (`FT` in kernels.cu).
const FUSED_THREADS: u32 = 256;
/// Offset of the output indices in the page-locked staging (after the state).
const STAGE_PAIRS: usize = 256;
/// Words per tile of the bitmap emission (`ETILE` in kernels.cu).
const EMIT_TILE: u64 = 256 * 4;

/// The sample rank whose value bounds the candidates for `k` of `n` entries with `s`
/// samples: k's expected share of the sample plus four standard deviations and a floor,
/// so that fewer than `k` entries reach it only with negligible probability (the host
/// checks, and falls back to the two-pass path, when it happens).
fn sample_rank(k: u64, n: u64, s: u64) -> u64 {
    let share = k as f64 * s as f64 / n as f64;
    ((share + 4.0 * share.sqrt() + 16.0).ceil() as u64).clamp(1, s)
}

/// Device-side selectors on one CUDA stream, with their scratch buffers (grown on demand
/// and kept between calls).
pub struct CudaSparsifier {
    stream: Arc<CudaStream>,
    k: Kernels,
    arch: String,
    sms: u32,
    state: CudaSlice<u64>,
    hist: CudaSlice<u64>,
    look: CudaSlice<u64>,
    cand_idx: CudaSlice<u32>,
    cand_val: CudaSlice<f32>,
    out_idx: CudaSlice<u32>,
    out_val: CudaSlice<f32>,
    out16: CudaSlice<u16>,
    /// Two class bitmaps of ⌈d/32⌉ words each, zero between calls (the emission clears
    /// what it reads; `bitmap_dirty` says a call may have stopped before that).
    bitmap: CudaSlice<u32>,
    bitmap_dirty: bool,
    fallbacks: u64,
    /// Page-locked staging for the state and the output pairs.
    pinned: Option<PinnedHostSlice<u8>>,
    /// (pairs, wire type, value offset) the last state read staged.
    staged: (usize, i32, usize),
    last_times: CallTimes,
    /// CUDA events around the device work of the last selection.
    events: Option<(CudaEvent, CudaEvent)>,
    /// Page-locked source of state writes, and whether one may still be in flight.
    pinned_put: Option<PinnedHostSlice<u64>>,
    put_pending: bool,
    /// The histogram may hold counts (see `clear_hist`).
    hist_dirty: bool,
    rng: ChaCha8Rng,
}

impl std::fmt::Debug for CudaSparsifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSparsifier")
            .field("ordinal", &self.ordinal())
            .field("arch", &self.arch)
            .finish_non_exhaustive()
    }
}

/// A device pointer for a kernel argument. The guard cudarc returns is dropped at once:
/// only for the scratch buffers, which never leave this sparsifier's stream.
fn dptr<T, B: DevicePtr<T>>(stream: &CudaStream, b: &B) -> u64 {
    b.device_ptr(stream).0
}

impl CudaSparsifier {
    /// True when libcuda loads and at least one device exists.
    pub fn available() -> bool {
        // SAFETY: only probes whether the driver library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return false;
        }
        matches!(CudaContext::device_count(), Ok(n) if n > 0)
    }

    /// Opens device `ordinal` on its default stream. `seed` drives MSTopK's offsets.
    pub fn new(ordinal: usize, seed: u64) -> Result<Self> {
        if !Self::available() {
            return Err(Error::Cuda("no CUDA driver or device".into()));
        }
        let ctx = CudaContext::new(ordinal).map_err(cu)?;
        Self::with_stream(ctx.default_stream(), seed)
    }

    /// Runs on `stream` (e.g. the stream a framework's tensors live on), compiling the
    /// kernels with NVRTC for the device's compute capability.
    pub fn with_stream(stream: Arc<CudaStream>, seed: u64) -> Result<Self> {
        let ctx = stream.context().clone();
        let (major, minor) = ctx.compute_capability().map_err(cu)?;
        if major < 7 {
            return Err(Error::Cuda(format!(
                "compute capability {major}.{minor}; the kernels need 7.0 or newer"
            )));
        }
        let arch = format!("compute_{major}{minor}");
        let ptx = compile_kernels(&arch).map_err(Error::Cuda)?;
        let m = ctx.load_module(ptx).map_err(cu)?;
        let f = |n: &str| m.load_function(n).map_err(cu);
        let k = Kernels {
            accumulate: f("ef_accumulate")?,
            radix_hist: f("radix_hist")?,
            radix_pick: f("radix_pick")?,
            compact: f("compact")?,
            ms_rounds: f("ms_rounds")?,
            part_argmax: f("part_argmax")?,
            finish: f("finish")?,
            scatter_add: f("scatter_add")?,
            state_layout: f("state_layout")?,
            sample_abs: f("sample_abs")?,
            ef_candidates: f("ef_candidates")?,
            mark_classes: f("mark_classes")?,
            emit_marked: f("emit_marked")?,
        };
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cu)?
            .max(1) as u32;
        let a = |n: usize| stream.alloc_zeros::<u64>(n).map_err(cu);
        Ok(CudaSparsifier {
            state: a(STATE_WORDS)?,
            hist: a(HBINS)?,
            look: a(1)?,
            cand_idx: stream.alloc_zeros::<u32>(1).map_err(cu)?,
            cand_val: stream.alloc_zeros::<f32>(1).map_err(cu)?,
            out_idx: stream.alloc_zeros::<u32>(1).map_err(cu)?,
            out_val: stream.alloc_zeros::<f32>(1).map_err(cu)?,
            out16: stream.alloc_zeros::<u16>(1).map_err(cu)?,
            bitmap: stream.alloc_zeros::<u32>(2).map_err(cu)?,
            bitmap_dirty: false,
            fallbacks: 0,
            pinned: None,
            staged: (0, 0, 0),
            last_times: CallTimes::default(),
            events: None,
            pinned_put: None,
            put_pending: false,
            hist_dirty: true,
            stream,
            k,
            arch,
            sms,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// How many exact top-k and MSTopK calls so far fell back to the two-pass path because
    /// the sampled bound let too few or too many candidates through (benches report it).
    pub fn two_pass_fallbacks(&self) -> u64 {
        self.fallbacks
    }

    /// Where the last selection's time went (see [`CallTimes`]).
    pub fn last_call_times(&self) -> CallTimes {
        self.last_times
    }

    /// The stream every operation runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// The architecture the kernels were compiled for (`compute_90` on an H100).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The device's name as the driver reports it.
    pub fn device_name(&self) -> Result<String> {
        self.stream.context().name().map_err(cu)
    }

    /// Peak memory bandwidth in bytes/s from the driver's memory clock and bus width
    /// (double data rate), or `None` when the driver does not report them.
    pub fn peak_bandwidth(&self) -> Option<f64> {
        let ctx = self.stream.context();
        let clock_khz = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
            .ok()?;
        let bus_bits = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
            .ok()?;
        (clock_khz > 0 && bus_bits > 0)
            .then(|| 2.0 * f64::from(clock_khz) * 1e3 * f64::from(bus_bits) / 8.0)
    }

    /// Copies a host slice to a new device buffer.
    pub fn upload(&self, x: &[f32]) -> Result<CudaSlice<f32>> {
        self.stream.clone_htod(x).map_err(cu)
    }

    /// Copies a device buffer back to the host.
    pub fn download(&self, x: &CudaSlice<f32>) -> Result<Vec<f32>> {
        self.stream.clone_dtoh(x).map_err(cu)
    }

    /// The kernel's `offsetof` of every `State` field (same order as [`state_layout`]),
    /// then `sizeof(State)`, computed on the device.
    pub fn device_state_layout(&self) -> Result<Vec<u64>> {
        let n = state_layout().len() + 1;
        let mut out = self.stream.alloc_zeros::<u64>(n).map_err(cu)?;
        let sp = dptr(&self.stream, &self.state);
        let mut b = self.stream.launch_builder(&self.k.state_layout);
        b.arg(&sp).arg(&mut out);
        // SAFETY: matches `state_layout(const State*, u64*)`; `out` holds one word per
        // field plus one.
        unsafe { b.launch(Self::cfg(1, 1)) }.map_err(cu)?;
        self.stream.clone_dtoh(&out).map_err(cu)
    }

    fn cfg(blocks: u64, threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (blocks.clamp(1, i32::MAX as u64) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Blocks for a grid-stride kernel over `n` elements: enough to fill the device.
    fn grid(&self, n: u64) -> u64 {
        n.div_ceil(u64::from(THREADS))
            .clamp(1, u64::from(self.sms) * 8)
    }

    /// Writes the state (asynchronously, from page-locked memory: the host waits first if
    /// the previous write may still be reading it).
    fn put_state(&mut self, s: &State) -> Result<()> {
        if self.put_pending {
            self.stream.synchronize().map_err(cu)?;
        }
        if self.pinned_put.is_none() {
            let ctx = self.stream.context().clone();
            // SAFETY: written below before any copy reads it.
            let p = unsafe { ctx.alloc_pinned_with_flags::<u64>(STATE_WORDS, 0) }.map_err(cu)?;
            self.pinned_put = Some(p);
        }
        let p = self.pinned_put.as_mut().expect("allocated above");
        let words: [u64; STATE_WORDS] = bytemuck::cast(*s);
        p.as_mut_slice().map_err(cu)?.copy_from_slice(&words);
        let dst = dptr(&self.stream, &self.state);
        let src = p.as_slice().map_err(cu)?;
        // SAFETY: `state` holds STATE_WORDS words; the page-locked source stays untouched
        // until a later put_state, which waits for this copy (put_pending) first.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(cu)?;
        self.put_pending = true;
        Ok(())
    }

    /// Reads the state back (waits for everything enqueued so far).
    fn get_state(&mut self) -> Result<State> {
        self.get_state_with(0, 0)
    }

    /// Page-locked host memory of at least `bytes` (cacheable: the host reads it), grown
    /// on demand and kept.
    fn staging(&mut self, bytes: usize) -> Result<*mut u8> {
        if self.pinned.as_ref().is_none_or(|p| p.len() < bytes) {
            self.pinned = None;
            let ctx = self.stream.context().clone();
            // SAFETY: the memory is only read after the copies below have written it.
            let p = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes.next_power_of_two(), 0) }
                .map_err(cu)?;
            self.pinned = Some(p);
        }
        let p = self.pinned.as_mut().expect("allocated above");
        p.as_mut_ptr().map_err(cu)
    }

    /// Reads the state back and, with `expect > 0`, the first `expect` output pairs (values
    /// in the wire format `wire`) in the same synchronisation, into page-locked memory that
    /// [`Self::collect`] reads when the call emitted at most that many.
    fn get_state_with(&mut self, expect: u64, wire: i32) -> Result<State> {
        let expect = expect.min(self.out_idx.len() as u64) as usize;
        let vsize = if wire == 0 { 4 } else { 2 };
        let vo = STAGE_PAIRS + (4 * expect).next_multiple_of(256);
        let base = self.staging(vo + vsize * expect)?;
        if let Some((_, end)) = &self.events {
            // The device work ends here: what follows is the copy to the host.
            end.record(&self.stream).map_err(cu)?;
        }
        let cs = self.stream.cu_stream();
        let copy = |off: usize, src: u64, bytes: usize| {
            // SAFETY: `base` holds at least `vo + vsize·expect` bytes, every region copied
            // into lies inside it, and each source buffer holds `bytes` bytes; the host
            // reads them only after the synchronize below.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(base.add(off), bytes);
                cudarc::driver::result::memcpy_dtoh_async(dst, src, cs)
            }
            .map_err(cu)
        };
        copy(
            0,
            dptr(&self.stream, &self.state),
            std::mem::size_of::<State>(),
        )?;
        if expect > 0 {
            copy(STAGE_PAIRS, dptr(&self.stream, &self.out_idx), 4 * expect)?;
            let vp = if wire == 0 {
                dptr(&self.stream, &self.out_val)
            } else {
                dptr(&self.stream, &self.out16)
            };
            copy(vo, vp, vsize * expect)?;
        }
        self.stream.synchronize().map_err(cu)?;
        self.put_pending = false;
        // Every histogram written so far was read and zeroed by its bin search.
        self.hist_dirty = false;
        self.staged = (expect, wire, vo);
        // SAFETY: the state's bytes were copied above and the stream has synchronised;
        // State is Pod, and read_unaligned needs no alignment.
        Ok(unsafe { std::ptr::read_unaligned(base as *const State) })
    }

    fn ensure_cand(&mut self, cap: usize) -> Result<()> {
        if self.cand_idx.len() < cap {
            self.cand_idx = self.stream.alloc_zeros::<u32>(cap).map_err(cu)?;
            self.cand_val = self.stream.alloc_zeros::<f32>(cap).map_err(cu)?;
        }
        Ok(())
    }

    fn ensure_out(&mut self, cap: usize) -> Result<()> {
        let cap = cap.max(1);
        if self.out_idx.len() < cap {
            self.out_idx = self.stream.alloc_zeros::<u32>(cap).map_err(cu)?;
            self.out_val = self.stream.alloc_zeros::<f32>(cap).map_err(cu)?;
            self.out16 = self.stream.alloc_zeros::<u16>(cap).map_err(cu)?;
        }
        Ok(())
    }

    /// Zeroes the histogram unless it is known to be zero (every bin search zeroes the
    /// bins it read; a call that stopped between a histogram and its search leaves it dirty).
    fn clear_hist(&mut self) -> Result<()> {
        if self.hist_dirty {
            self.stream.memset_zeros(&mut self.hist).map_err(cu)?;
        }
        self.hist_dirty = true;
        Ok(())
    }

    /// `r += g` (g = 0: read only) with the level-0 histogram (mode 1) and/or the |x|
    /// statistics (mode 2).
    fn k_accumulate(&mut self, r: u64, g: u64, n: u64, mode: i32) -> Result<()> {
        let (sp, hp) = (
            dptr(&self.stream, &self.state),
            dptr(&self.stream, &self.hist),
        );
        let blocks = n.div_ceil(ACC_TILE).clamp(1, u64::from(self.sms) * 4);
        let mut b = self.stream.launch_builder(&self.k.accumulate);
        b.arg(&r).arg(&g).arg(&n).arg(&sp).arg(&hp).arg(&mode);
        // SAFETY: matches `ef_accumulate`; r and g hold n floats (checked by the caller).
        unsafe { b.launch(Self::cfg(blocks, 256)) }.map_err(cu)?;
        Ok(())
    }

    /// One radix level's bin search (mode 0: middle, 1: level 0 sets the candidates,
    /// 2: last level sets the emission classes).
    fn k_pick(&mut self, shift: i32, width: i32, mode: i32) -> Result<()> {
        let (sp, hp) = (
            dptr(&self.stream, &self.state),
            dptr(&self.stream, &self.hist),
        );
        let mut b = self.stream.launch_builder(&self.k.radix_pick);
        b.arg(&hp).arg(&sp).arg(&shift).arg(&width).arg(&mode);
        // SAFETY: matches `radix_pick`; one block of 1024 threads, hist holds 2048 bins.
        unsafe { b.launch(Self::cfg(1, 1024)) }.map_err(cu)?;
        Ok(())
    }

    /// Histogram of a finer radix level over the candidates.
    /// The histogram is zero on entry: cleared at the start of a call, and each bin
    /// search zeroes the bins it read.
    fn k_radix_hist(&mut self, shift: i32, width: i32) -> Result<()> {
        let cap = self.cand_val.len() as u64;
        let (xp, sp, hp) = (
            dptr(&self.stream, &self.cand_val),
            dptr(&self.stream, &self.state),
            dptr(&self.stream, &self.hist),
        );
        let mut b = self.stream.launch_builder(&self.k.radix_hist);
        b.arg(&xp)
            .arg(&cap)
            .arg(&sp)
            .arg(&hp)
            .arg(&shift)
            .arg(&width);
        // SAFETY: matches `radix_hist`; it reads at most `cap` candidates.
        unsafe { b.launch(Self::cfg(self.grid(cap), THREADS)) }.map_err(cu)?;
        Ok(())
    }

    /// Ordered compaction of `x[0..n)` (see `compact` in kernels.cu). `cand_input`: x is
    /// the candidate buffer (n = its capacity, indices from `cand_idx`); otherwise x = `r`.
    /// `target`: 0 candidates, 1 output, 2 count only.
    fn k_compact(&mut self, r: u64, g: u64, n: u64, cand_input: bool, target: i32) -> Result<()> {
        let (x, xidx, n) = if cand_input {
            (
                dptr(&self.stream, &self.cand_val),
                dptr(&self.stream, &self.cand_idx),
                self.cand_val.len() as u64,
            )
        } else {
            (r, 0u64, n)
        };
        let ntiles = n.div_ceil(COMPACT_TILE).max(1);
        let lp = self.zeroed_look(ntiles)?;
        let sp = dptr(&self.stream, &self.state);
        let (oi, ov) = if target == 0 {
            (
                dptr(&self.stream, &self.cand_idx),
                dptr(&self.stream, &self.cand_val),
            )
        } else {
            (
                dptr(&self.stream, &self.out_idx),
                dptr(&self.stream, &self.out_val),
            )
        };
        let mut b = self.stream.launch_builder(&self.k.compact);
        b.arg(&x).arg(&g).arg(&xidx).arg(&n).arg(&sp).arg(&lp);
        b.arg(&ntiles).arg(&oi).arg(&ov).arg(&target);
        // SAFETY: matches `compact`; one block per tile, `look` holds 1 + 2·ntiles zeroed
        // words, and the kernel writes outputs only below the capacity recorded in the state.
        unsafe { b.launch(Self::cfg(ntiles, 256)) }.map_err(cu)?;
        Ok(())
    }

    /// Zeroes (or rounds to the wire type) the emitted entries of `r`, unless the call failed.
    fn k_finish(&mut self, r: u64, wire: i32) -> Result<()> {
        let cap = self.out_idx.len() as u64;
        let (ip, vp, hp, sp) = (
            dptr(&self.stream, &self.out_idx),
            dptr(&self.stream, &self.out_val),
            dptr(&self.stream, &self.out16),
            dptr(&self.stream, &self.state),
        );
        let mut b = self.stream.launch_builder(&self.k.finish);
        b.arg(&r).arg(&ip).arg(&vp).arg(&hp).arg(&sp).arg(&wire);
        // SAFETY: matches `finish`; it touches at most `count <= out_cap` entries.
        unsafe { b.launch(Self::cfg(self.grid(cap), THREADS)) }.map_err(cu)?;
        Ok(())
    }

    /// The typed error for a non-finite value at `index` of `r` (reads the value back).
    fn bad(&self, r: u64, index: u64) -> Error {
        let mut v = [f32::NAN];
        // SAFETY: index < n was recorded by a kernel reading r[index]; one float is copied
        // into `v`, which lives until the synchronize below.
        let ok = unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut v[..],
                r + 4 * index,
                self.stream.cu_stream(),
            )
        }
        .is_ok()
            && self.stream.synchronize().is_ok();
        Error::NonFinite {
            index: index as usize,
            value: if ok { v[0] } else { f32::NAN },
        }
    }

    /// Bitmaps for `n` entries, zeroed.
    fn ensure_bitmap(&mut self, n: u64) -> Result<()> {
        let words = 2 * n.div_ceil(32) as usize;
        if self.bitmap.len() < words {
            self.bitmap = self.stream.alloc_zeros::<u32>(words).map_err(cu)?;
            self.bitmap_dirty = false;
        } else if self.bitmap_dirty {
            self.stream.memset_zeros(&mut self.bitmap).map_err(cu)?;
            self.bitmap_dirty = false;
        }
        Ok(())
    }

    /// `samples` strided values of `r + g` into the candidate buffer (read only).
    fn k_sample(&mut self, r: u64, g: u64, n: u64, samples: u64) -> Result<()> {
        let cp = dptr(&self.stream, &self.cand_val);
        let mut b = self.stream.launch_builder(&self.k.sample_abs);
        b.arg(&r).arg(&g).arg(&n).arg(&samples).arg(&cp);
        // SAFETY: matches `sample_abs`; every index read is < n, and the candidate buffer
        // holds at least `samples` floats (checked by the caller).
        unsafe { b.launch(Self::cfg(self.grid(samples), THREADS)) }.map_err(cu)?;
        Ok(())
    }

    /// The sample's `k_rem`-th largest value becomes `t_low` (the select then restarts for
    /// `k_sel`). `tight = false`: only its level-0 bin (bits 30..20, 1/8 of an octave), whose
    /// lower edge lets more candidates through but saves four launches, which suits exact
    /// top-k; `tight`: the value itself, for MSTopK, whose rounds scan the candidates in one
    /// block and so cost in proportion to their number.
    fn sampled_bound(&mut self, tight: bool) -> Result<()> {
        let levels = if tight { &LEVELS[..] } else { &LEVELS[..1] };
        for (i, &(shift, width)) in levels.iter().enumerate() {
            self.k_radix_hist(shift, width)?;
            self.k_pick(shift, width, if i + 1 == levels.len() { 3 } else { 0 })?;
        }
        Ok(())
    }

    /// The fused pass: `r += g` (g = 0: read only), the non-finite check, and every entry
    /// at or above `t_low` inside the partition appended to the candidates; mode 2 adds
    /// the |x| statistics.
    fn k_fused(&mut self, r: u64, g: u64, n: u64, mode: i32) -> Result<()> {
        let (sp, ip, vp) = (
            dptr(&self.stream, &self.state),
            dptr(&self.stream, &self.cand_idx),
            dptr(&self.stream, &self.cand_val),
        );
        let vec = i32::from(r.is_multiple_of(16) && g.is_multiple_of(16));
        // One wave: four resident blocks per SM (`__launch_bounds__(FT, 4)`).
        let blocks = n
            .div_ceil(8 * u64::from(FUSED_THREADS))
            .clamp(1, u64::from(self.sms) * 4);
        let mut b = self.stream.launch_builder(&self.k.ef_candidates);
        b.arg(&r).arg(&g).arg(&n).arg(&sp).arg(&ip).arg(&vp);
        b.arg(&mode).arg(&vec);
        // SAFETY: matches `ef_candidates`; r and g hold n floats (checked by the caller),
        // float4 access only when both are 16-byte aligned, and candidates are written
        // only below the capacity recorded in the state.
        unsafe { b.launch(Self::cfg(blocks, FUSED_THREADS)) }.map_err(cu)?;
        Ok(())
    }

    /// Zeroed look-back words for `ntiles` tiles.
    fn zeroed_look(&mut self, ntiles: u64) -> Result<u64> {
        let words = 1 + 2 * ntiles as usize;
        if self.look.len() < words {
            self.look = self.stream.alloc_zeros::<u64>(words).map_err(cu)?;
        } else {
            let mut v = self.look.slice_mut(..words);
            self.stream.memset_zeros(&mut v).map_err(cu)?;
        }
        Ok(dptr(&self.stream, &self.look))
    }

    /// Marks the candidates' classes in the bitmaps, then emits the marked entries of `r`
    /// in index order into the output buffers (clearing the bitmaps) and, when the call
    /// succeeded, finishes them in `r` for the wire type (no separate `finish`).
    fn k_mark_and_emit(&mut self, r: u64, n: u64, wire: i32) -> Result<()> {
        let words = n.div_ceil(32);
        self.bitmap_dirty = true;
        let cap = self.cand_val.len() as u64;
        let (ip, vp, sp, bp) = (
            dptr(&self.stream, &self.cand_idx),
            dptr(&self.stream, &self.cand_val),
            dptr(&self.stream, &self.state),
            dptr(&self.stream, &self.bitmap),
        );
        let mut b = self.stream.launch_builder(&self.k.mark_classes);
        b.arg(&ip).arg(&vp).arg(&sp).arg(&bp).arg(&words);
        // SAFETY: matches `mark_classes`; candidate indices are < n, and the bitmap holds
        // 2·⌈n/32⌉ words (ensure_bitmap).
        unsafe { b.launch(Self::cfg(self.grid(cap), THREADS)) }.map_err(cu)?;
        let ntiles = words.div_ceil(EMIT_TILE).max(1);
        let lp = self.zeroed_look(ntiles)?;
        let (oi, ov, oh) = (
            dptr(&self.stream, &self.out_idx),
            dptr(&self.stream, &self.out_val),
            dptr(&self.stream, &self.out16),
        );
        let mut b = self.stream.launch_builder(&self.k.emit_marked);
        b.arg(&bp).arg(&words).arg(&r).arg(&sp).arg(&lp);
        b.arg(&ntiles).arg(&oi).arg(&ov).arg(&oh).arg(&wire);
        // SAFETY: matches `emit_marked`; one block per tile, `look` holds 1 + 2·ntiles
        // zeroed words, and outputs are written only below `out_cap`.
        unsafe { b.launch(Self::cfg(ntiles, 256)) }.map_err(cu)?;
        Ok(())
    }

    /// Exact top-k of `r + g` for `0 < k < n` (see the module docs); on return the output
    /// buffers hold the `k` entries and `r` is finished (or an error is returned).
    fn run_exact(&mut self, r: u64, g: u64, n: u64, k: u64, wire: i32) -> Result<State> {
        match self.exact_one_pass(r, g, n, k, wire)? {
            Some(st) => Ok(st),
            // r holds r + g now and nothing was zeroed: select again from it, read only.
            None => {
                self.fallbacks += 1;
                self.exact_two_pass(r, 0, n, k, wire)
            }
        }
    }

    /// A state for the one-pass path: the sample in the candidate buffer, its rank
    /// `sample_rank(need)`, and `need` entries to find among the candidates.
    fn one_pass_state(&mut self, n: u64, k: u64, need: u64) -> Result<(State, u64)> {
        self.ensure_out(k as usize)?;
        let samples = SAMPLES.min(n);
        let cap = (4 * k + 65_536).min(n).max(samples);
        self.ensure_cand(cap as usize)?;
        self.ensure_bitmap(n)?;
        let mut s = State::fresh(n);
        s.k_rem = sample_rank(need, n, samples);
        s.n_cand = samples;
        s.cand_cap = self.cand_idx.len() as u64;
        s.out_cap = k;
        s.k_sel = need;
        Ok((s, samples))
    }

    /// The one-pass exact top-k; `None` when the sampled bound let too few or too many
    /// candidates through (then `r` holds `r + g`, untouched otherwise).
    fn exact_one_pass(
        &mut self,
        r: u64,
        g: u64,
        n: u64,
        k: u64,
        wire: i32,
    ) -> Result<Option<State>> {
        let (s, samples) = self.one_pass_state(n, k, k)?;
        self.put_state(&s)?;
        self.clear_hist()?;
        self.k_sample(r, g, n, samples)?;
        self.sampled_bound(false)?;
        self.k_fused(r, g, n, 0)?;
        for (i, &(shift, width)) in LEVELS.iter().enumerate() {
            self.k_radix_hist(shift, width)?;
            self.k_pick(shift, width, if i == 2 { 2 } else { 0 })?;
        }
        self.k_mark_and_emit(r, n, wire)?;
        let st = self.get_state_with(k, wire)?;
        self.bitmap_dirty = false;
        if st.first_bad != NONE {
            return Err(self.bad(r, st.first_bad));
        }
        Ok((st.n_cand >= k && st.n_cand <= st.cand_cap).then_some(st))
    }

    /// The two-pass exact top-k (histogram pass, ordered compaction of the dense vector).
    fn exact_two_pass(&mut self, r: u64, mut g: u64, n: u64, k: u64, wire: i32) -> Result<State> {
        self.ensure_out(k as usize)?;
        let mut cap = (4 * k + 65_536).min(n) as usize;
        loop {
            self.ensure_cand(cap)?;
            let mut s = State::fresh(n);
            s.k_rem = k;
            s.cand_cap = self.cand_idx.len() as u64;
            s.out_cap = k;
            self.put_state(&s)?;
            self.clear_hist()?;
            self.k_accumulate(r, g, n, 1)?;
            self.k_pick(20, 11, 1)?;
            self.k_compact(r, 0, n, false, 0)?;
            for (li, &(shift, width)) in FINE_LEVELS.iter().enumerate() {
                self.k_radix_hist(shift, width)?;
                self.k_pick(shift, width, if li == 1 { 2 } else { 0 })?;
            }
            self.k_compact(r, 0, 0, true, 1)?;
            self.k_finish(r, wire)?;
            let st = self.get_state_with(k, wire)?;
            if st.first_bad != NONE {
                return Err(self.bad(r, st.first_bad));
            }
            if st.n_cand <= st.cand_cap {
                return Ok(st);
            }
            // More candidates than room (a wide level-0 bin): grow and select again from
            // the accumulated residual, read only.
            cap = (st.n_cand + st.n_cand / 4).min(n) as usize;
            g = 0;
        }
    }

    /// MSTopK of `r + g` for `0 < k < n`.
    fn run_mstopk(
        &mut self,
        r: u64,
        g: u64,
        n: u64,
        k: u64,
        rounds: usize,
        wire: i32,
    ) -> Result<State> {
        let rounds = i32::try_from(rounds)
            .map_err(|_| Error::InvalidArgument(format!("{rounds} MSTopK rounds")))?;
        // Candidates: more than k of them, so every round below their floor has more than
        // k entries above it.
        let (s, samples) = self.one_pass_state(n, k, k + 1)?;
        self.put_state(&s)?;
        self.clear_hist()?;
        self.k_sample(r, g, n, samples)?;
        self.sampled_bound(true)?;
        self.k_fused(r, g, n, 2)?;
        self.k_ms_rounds(n, k, rounds)?;
        let st = self.get_state()?;
        if st.first_bad != NONE {
            return Err(self.bad(r, st.first_bad));
        }
        let st = if st.n_cand > k && st.n_cand <= st.cand_cap {
            st
        } else {
            // The sampled bound missed: the two-pass candidates from r (= r + g now).
            self.fallbacks += 1;
            self.mstopk_two_pass_candidates(r, n, k, rounds)?
        };
        self.mstopk_emit(r, n, k, st, wire)
    }

    fn k_ms_rounds(&mut self, n: u64, k: u64, rounds: i32) -> Result<()> {
        let (cp, sp) = (
            dptr(&self.stream, &self.cand_val),
            dptr(&self.stream, &self.state),
        );
        let ccap = self.cand_val.len() as u64;
        let mut b = self.stream.launch_builder(&self.k.ms_rounds);
        b.arg(&cp).arg(&ccap).arg(&sp).arg(&n).arg(&k).arg(&rounds);
        // SAFETY: matches `ms_rounds`; one block of 1024 threads over the candidates.
        unsafe { b.launch(Self::cfg(1, 1024)) }.map_err(cu)?;
        Ok(())
    }

    /// MSTopK's candidates and rounds on the two-pass path, from `r` read only.
    fn mstopk_two_pass_candidates(&mut self, r: u64, n: u64, k: u64, rounds: i32) -> Result<State> {
        let mut cap = (4 * k + 65_536).min(n) as usize;
        loop {
            self.ensure_cand(cap)?;
            let mut s = State::fresh(n);
            // At or above the bin of the (k+1)-th largest.
            s.k_rem = k + 1;
            s.cand_cap = self.cand_idx.len() as u64;
            s.out_cap = k;
            self.put_state(&s)?;
            self.clear_hist()?;
            self.k_accumulate(r, 0, n, 3)?;
            self.k_pick(20, 11, 1)?;
            self.k_compact(r, 0, n, false, 0)?;
            self.k_ms_rounds(n, k, rounds)?;
            let st = self.get_state()?;
            if st.n_cand <= st.cand_cap {
                return Ok(st);
            }
            cap = (st.n_cand + st.n_cand / 4).min(n) as usize;
        }
    }

    /// MSTopK's emission once the rounds have run: all of class A (≥ thres1) and a window
    /// of class B ([thres2, thres1)) from a random offset drawn like the CPU's.
    fn mstopk_emit(&mut self, r: u64, n: u64, k: u64, mut st: State, wire: i32) -> Result<State> {
        let from_cand = st.from_cand == 1;
        if !from_cand {
            // thres2 fell below the candidates: count class B over the whole vector.
            self.put_state(&st)?;
            self.k_compact(r, 0, n, false, 2)?;
            st = self.get_state()?;
            st.len2 = st.total_b;
        }
        let need = (k - st.k1) as usize;
        // Drawn exactly like the CPU's MsTopK (same stream, same range), once per call.
        let start = self
            .rng
            .gen_range(0..=(st.len2 as usize).saturating_sub(need));
        st.b_start = start as u64;
        st.b_need = need as u64;
        st.count = 0;
        st.k_sel = 0;
        self.put_state(&st)?;
        if from_cand {
            self.ensure_bitmap(n)?;
            self.k_mark_and_emit(r, n, wire)?;
        } else {
            self.k_compact(r, 0, n, false, 1)?;
            self.k_finish(r, wire)?;
        }
        let st = self.get_state_with(k, wire)?;
        self.bitmap_dirty = false;
        Ok(st)
    }

    /// Threshold selection over `part` (classes from `tbits`), fused with `r += g`; with
    /// `fallback`, an empty result takes the partition's largest magnitude.
    #[allow(clippy::too_many_arguments)]
    fn run_threshold(
        &mut self,
        r: u64,
        mut g: u64,
        n: u64,
        part: Range<u64>,
        tbits: u32,
        fallback: bool,
        wire: i32,
    ) -> Result<State> {
        let mut cap = self.cand_idx.len().max(4096.min(n as usize));
        let mut st = loop {
            self.ensure_cand(cap)?;
            self.ensure_out(cap)?;
            self.ensure_bitmap(n)?;
            let mut s = State::fresh(n);
            s.t_low = tbits;
            s.a_bits = tbits;
            s.b_lo = tbits;
            s.part_lo = part.start;
            s.part_hi = part.end;
            // Every candidate is emitted, so the output holds as many as the candidates.
            s.cand_cap = self.cand_idx.len().min(self.out_idx.len()) as u64;
            s.out_cap = self.out_idx.len() as u64;
            self.put_state(&s)?;
            self.k_fused(r, g, n, 0)?;
            self.k_mark_and_emit(r, n, wire)?;
            let st = self.get_state()?;
            self.bitmap_dirty = false;
            if st.first_bad != NONE {
                return Err(self.bad(r, st.first_bad));
            }
            if st.n_cand <= st.cand_cap {
                break st;
            }
            // More than the buffers hold: grow them and select again from the accumulated
            // residual, read only (nothing was zeroed).
            cap = (st.n_cand + st.n_cand / 4).min(n) as usize;
            g = 0;
        };
        if fallback && st.count == 0 && part.start < part.end {
            let sp = dptr(&self.stream, &self.state);
            let mut b = self.stream.launch_builder(&self.k.part_argmax);
            b.arg(&r).arg(&part.start).arg(&part.end).arg(&sp);
            // SAFETY: matches `part_argmax`; part lies inside r (checked by the caller).
            unsafe { b.launch(Self::cfg(self.grid(part.end - part.start), THREADS)) }
                .map_err(cu)?;
            st = self.get_state()?;
            let i = u64::from(u32::MAX - (st.argmax_key & 0xffff_ffff) as u32);
            let (ip, vp) = (
                dptr(&self.stream, &self.out_idx),
                dptr(&self.stream, &self.out_val),
            );
            let idx = [i as u32];
            // SAFETY: out_idx and out_val hold at least one element; `idx` lives until the
            // get_state below synchronizes the stream; i < n.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(ip, &idx[..], self.stream.cu_stream())
                    .map_err(cu)?;
                cudarc::driver::result::memcpy_dtod_async(
                    vp,
                    r + 4 * i,
                    4,
                    self.stream.cu_stream(),
                )
                .map_err(cu)?;
            }
            st.count = 1;
            self.put_state(&st)?;
            self.k_finish(r, wire)?;
            st = self.get_state()?;
        }
        Ok(st)
    }

    /// Appends the `count` emitted pairs as `V` values to `idx` and `val`: from the
    /// page-locked copy when the last state read brought them, else copied now.
    fn collect_into<V: Value>(
        &mut self,
        count: usize,
        wire: i32,
        idx: &mut Vec<u32>,
        val: &mut Vec<V>,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        if !(self.staged.0 >= count && self.staged.1 == wire) {
            self.get_state_with(count as u64, wire)?;
        }
        let vo = self.staged.2;
        let base = self.staging(0)?;
        // SAFETY: get_state_with copied `count` indices to STAGE_PAIRS and `count` values of
        // V's size to `vo` (V::CODE matches `wire`) and synchronised. The page-locked block
        // is page-aligned and both offsets are multiples of 256, so both views are aligned.
        unsafe {
            idx.extend_from_slice(std::slice::from_raw_parts(
                base.add(STAGE_PAIRS) as *const u32,
                count,
            ));
            val.extend_from_slice(std::slice::from_raw_parts(base.add(vo) as *const V, count));
        }
        Ok(())
    }

    /// Fused error feedback with any selector, on device buffers: `residual += grad`,
    /// select, and leave `residual + grad` minus what was sent in `residual` (the selected
    /// entries zeroed for `V = f32`; their rounding error for `f16`/`bf16`, saturating at
    /// the type's largest finite value). Only the selected pairs are copied to the host.
    /// As on the CPU, `k = 0` selects nothing and `k ≥ d` everything, for every selector.
    /// `SelectInfo::threshold` is the CPU's: the smallest selected magnitude for exact
    /// top-k and MSTopK (of the rounded values for `f16`/`bf16`), the threshold used for
    /// the threshold selectors, 0 when nothing was selected or at the edges.
    pub fn select_fused<V: Value, R: DevicePtrMut<f32>, G: DevicePtr<f32>>(
        &mut self,
        how: &GpuSelection,
        residual: &mut R,
        grad: &G,
        k: usize,
    ) -> Result<(SparseGrad<V>, SelectInfo)> {
        let mut out = SparseGrad::empty(grad.len());
        let info = self.select_inner(how, residual, grad, Some(k), &mut out)?;
        Ok((out, info))
    }

    /// [`Self::select_fused`] into `out`, reusing its buffers: no host allocation once they
    /// have grown to the selection's size (the steady state of a training loop). On an
    /// error `out` is left empty.
    pub fn select_fused_into<V: Value, R: DevicePtrMut<f32>, G: DevicePtr<f32>>(
        &mut self,
        how: &GpuSelection,
        residual: &mut R,
        grad: &G,
        k: usize,
        out: &mut SparseGrad<V>,
    ) -> Result<SelectInfo> {
        self.select_inner(how, residual, grad, Some(k), out)
    }

    /// Checks what every entry point checks: equal lengths, `u32`-addressable, same device.
    fn check_buffers<R: DeviceSlice<f32>, G: DeviceSlice<f32>>(
        &self,
        residual: &R,
        grad: &G,
    ) -> Result<()> {
        if residual.len() != grad.len() {
            return Err(Error::LengthMismatch {
                what: "residual",
                got: residual.len(),
                expected: grad.len(),
            });
        }
        let d = grad.len();
        if d as u64 > u64::from(u32::MAX) + 1 {
            return Err(Error::TooLong(d));
        }
        for (what, ord) in [
            ("residual", residual.stream().context().ordinal()),
            ("gradient", grad.stream().context().ordinal()),
        ] {
            if ord != self.ordinal() {
                return Err(Error::InvalidArgument(format!(
                    "{what} is on device {ord}, this sparsifier on device {}",
                    self.ordinal()
                )));
            }
        }
        Ok(())
    }

    /// `k = None`: no edge rules (the plain threshold of [`Self::threshold_fused`]).
    fn select_inner<V: Value, R: DevicePtrMut<f32>, G: DevicePtr<f32>>(
        &mut self,
        how: &GpuSelection,
        residual: &mut R,
        grad: &G,
        k: Option<usize>,
        out: &mut SparseGrad<V>,
    ) -> Result<SelectInfo> {
        let (mut idx, mut val, _) = std::mem::replace(out, SparseGrad::empty(0)).into_parts();
        idx.clear();
        val.clear();
        self.check_buffers(residual, grad)?;
        let d = grad.len();
        let wire = match V::CODE {
            c if c == f32::CODE => 0,
            c if c == half::f16::CODE => 1,
            c if c == half::bf16::CODE => 2,
            c => return Err(Error::InvalidArgument(format!("wire type code {c}"))),
        };
        if let GpuSelection::Threshold(t) = how {
            if !(t.is_finite() && *t >= 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "threshold must be finite and ≥ 0, got {t}"
                )));
            }
        }
        let part = match how {
            GpuSelection::ExDyna {
                range: Some(range), ..
            } => {
                if range.start > range.end || range.end > d {
                    return Err(Error::InvalidArgument(format!(
                        "partition {}..{} outside the dense length {d}",
                        range.start, range.end
                    )));
                }
                range.start as u64..range.end as u64
            }
            _ => 0..d as u64,
        };
        if d == 0 {
            return Ok(SelectInfo::default());
        }
        let stream = self.stream.clone();
        // The user's buffers: hold cudarc's guards for the whole call, so other streams
        // using them wait for (and are waited on by) this one.
        let (r, _rg) = residual.device_ptr_mut(&stream);
        let (g, _gg) = grad.device_ptr(&stream);
        let n = d as u64;
        let edge = match k {
            Some(0) => Some(u32::MAX),
            Some(k) if k >= d => Some(0),
            _ => None,
        };
        let t0 = std::time::Instant::now();
        if self.events.is_none() {
            let ctx = self.stream.context();
            let ev = || {
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(cu)
            };
            self.events = Some((ev()?, ev()?));
        }
        if let Some((start, _)) = &self.events {
            start.record(&self.stream).map_err(cu)?;
        }
        let (st, threshold) = match (how, edge) {
            (_, Some(t)) => (
                self.run_threshold(r, g, n, 0..n, t, false, wire)?,
                Some(0.0),
            ),
            (GpuSelection::Exact, None) => {
                let k = k.unwrap_or(d) as u64;
                let st = self.run_exact(r, g, n, k, wire)?;
                (st, Some(f32::from_bits(st.prefix)))
            }
            (GpuSelection::MsTopK { rounds }, None) => {
                let k = k.unwrap_or(d) as u64;
                (self.run_mstopk(r, g, n, k, *rounds, wire)?, None)
            }
            (GpuSelection::Threshold(t), None) => {
                let st = self.run_threshold(r, g, n, 0..n, ge_bits(*t), false, wire)?;
                (st, Some(*t))
            }
            (GpuSelection::ExDyna { threshold, .. }, None) => {
                let tb = ge_bits(*threshold);
                (
                    self.run_threshold(r, g, n, part, tb, true, wire)?,
                    Some(*threshold),
                )
            }
        };
        let t1 = std::time::Instant::now();
        self.collect_into::<V>(st.count as usize, wire, &mut idx, &mut val)?;
        *out = SparseGrad::new(idx, val, d)?;
        let device = match &self.events {
            Some((a, b)) => a.elapsed_ms(b).map_err(cu)?,
            None => f32::NAN,
        };
        self.last_times = CallTimes {
            device: std::time::Duration::from_secs_f64(f64::from(device.max(0.0)) / 1e3),
            to_state: t1 - t0,
            host_build: t1.elapsed(),
        };
        let sg = &*out;
        let threshold = match (threshold, sg.nnz()) {
            (_, 0) => 0.0,
            (Some(t), _) => t,
            (None, _) => sg
                .values()
                .iter()
                .map(|v| v.to_f32().abs())
                .fold(f32::INFINITY, f32::min),
        };
        Ok(SelectInfo {
            threshold,
            selected: sg.nnz(),
        })
    }

    /// Fused error feedback + exact top-k (ties: lower index), `f32` values.
    pub fn topk_fused<R: DevicePtrMut<f32>, G: DevicePtr<f32>>(
        &mut self,
        residual: &mut R,
        grad: &G,
        k: usize,
    ) -> Result<SparseGrad<f32>> {
        self.select_fused(&GpuSelection::Exact, residual, grad, k)
            .map(|r| r.0)
    }

    /// Fused error feedback + MSTopK with `rounds` rounds, `f32` values.
    pub fn mstopk_fused<R: DevicePtrMut<f32>, G: DevicePtr<f32>>(
        &mut self,
        residual: &mut R,
        grad: &G,
        k: usize,
        rounds: usize,
    ) -> Result<SparseGrad<f32>> {
        self.select_fused(&GpuSelection::MsTopK { rounds }, residual, grad, k)
            .map(|r| r.0)
    }

    /// Fused error feedback + hard threshold: every `|acc| ≥ threshold`, `f32` values.
    pub fn threshold_fused<R: DevicePtrMut<f32>, G: DevicePtr<f32>>(
        &mut self,
        residual: &mut R,
        grad: &G,
        threshold: f32,
    ) -> Result<SparseGrad<f32>> {
        let mut out = SparseGrad::empty(grad.len());
        self.select_inner(
            &GpuSelection::Threshold(threshold),
            residual,
            grad,
            None,
            &mut out,
        )?;
        Ok(out)
    }

    /// Restarts MSTopK's offset stream from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.rng = ChaCha8Rng::seed_from_u64(seed);
    }

    /// `residual += grad` only (no selection), checking for non-finite values: one pass
    /// of 12 bytes per element, the memory floor every fused selector is measured against.
    pub fn accumulate<R: DevicePtrMut<f32>, G: DevicePtr<f32>>(
        &mut self,
        residual: &mut R,
        grad: &G,
    ) -> Result<()> {
        self.check_buffers(residual, grad)?;
        if grad.is_empty() {
            return Ok(());
        }
        let stream = self.stream.clone();
        let (r, _rg) = residual.device_ptr_mut(&stream);
        let (g, _gg) = grad.device_ptr(&stream);
        let mut s = State::fresh(grad.len() as u64);
        s.t_low = u32::MAX; // no candidates: the plain vectorised pass
        self.put_state(&s)?;
        self.k_fused(r, g, grad.len() as u64, 0)?;
        let st = self.get_state()?;
        if st.first_bad != NONE {
            return Err(self.bad(r, st.first_bad));
        }
        Ok(())
    }

    /// Applies a sparse update on the device: `dst[i] += alpha · v` for every (i, v) of
    /// `update` (e.g. the aggregated result of a sparse allreduce, with `alpha = −lr`).
    /// Uploads only the pairs.
    pub fn apply_sparse<V: Value, D: DevicePtrMut<f32>>(
        &mut self,
        dst: &mut D,
        update: &SparseGrad<V>,
        alpha: f32,
    ) -> Result<()> {
        if update.len() != dst.len() {
            return Err(Error::LengthMismatch {
                what: "sparse update",
                got: update.len(),
                expected: dst.len(),
            });
        }
        let nnz = update.nnz();
        if nnz == 0 {
            return Ok(());
        }
        let vals: Vec<f32> = update.values().iter().map(|v| v.to_f32()).collect();
        let idx = self.stream.clone_htod(update.indices()).map_err(cu)?;
        let val = self.stream.clone_htod(&vals).map_err(cu)?;
        let stream = self.stream.clone();
        let (dp, _dg) = dst.device_ptr_mut(&stream);
        let (ip, vp) = (dptr(&stream, &idx), dptr(&stream, &val));
        let n = nnz as u64;
        let mut b = self.stream.launch_builder(&self.k.scatter_add);
        b.arg(&dp).arg(&ip).arg(&vp).arg(&n).arg(&alpha);
        // SAFETY: matches `scatter_add`; SparseGrad's indices are unique and < dst.len().
        unsafe { b.launch(Self::cfg(self.grid(n), THREADS)) }.map_err(cu)?;
        // idx and val are freed on drop; the stream orders the free after the kernel.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_has_no_padding_and_known_size() {
        let layout = state_layout();
        let mut end = 0;
        for w in layout.windows(2) {
            assert!(w[0].1 < w[1].1, "fields in declaration order: {w:?}");
        }
        for (name, off) in &layout {
            assert_eq!(off % 4, 0, "{name}");
            end = end.max(*off);
        }
        assert_eq!(state_size(), 168);
        assert_eq!(STATE_WORDS * 8, state_size());
        assert!(end < state_size());
    }

    #[test]
    fn ge_bits_matches_the_cpu_rule() {
        assert_eq!(ge_bits(0.0), 0);
        assert_eq!(ge_bits(-1.0), 0);
        assert_eq!(ge_bits(f32::NAN), 0);
        assert_eq!(ge_bits(1.5), 1.5f32.to_bits());
        assert_eq!(ge_bits(f32::INFINITY), 0x7f80_0000);
    }
}
