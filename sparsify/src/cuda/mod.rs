//! CUDA selectors (feature `cuda`): fused error feedback with exact top-k (radix select,
//! three histogram passes after the accumulate pass, every decision on the device),
//! MSTopK (paper 001 Algorithm 1, its N counting rounds decided on the device) and the hard
//! threshold, on device buffers, returning a host [`SparseGrad`].
//!
//! Kernels are CUDA C in `kernels.cu`, compiled at run time by NVRTC. Nothing here runs
//! without a GPU: [`CudaSparsifier::available`] checks for libcuda first (creating a
//! context without it panics inside cudarc) and then for a device.
//!
//! Differences from the CPU path, on purpose: MSTopK's mean is summed with atomics (the
//! order, hence the last bits, may differ from the CPU's), and its offset is
//! `rand % (len2 − need + 1)` with `rand` drawn on the host from the seeded stream.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Error, Result, SparseGrad};

/// The CUDA C source of every kernel.
pub const KERNELS: &str = include_str!("kernels.cu");

/// Virtual architecture the kernels are compiled for: `atomicAdd` on `double` needs
/// compute capability 6.0, and PTX for `compute_70` JIT-compiles on every later GPU
/// (Volta through Hopper).
pub const PTX_ARCH: &str = "compute_70";

/// Compiles [`KERNELS`] to PTX with NVRTC for [`PTX_ARCH`].
pub fn compile_kernels() -> std::result::Result<cudarc::nvrtc::Ptx, cudarc::nvrtc::CompileError> {
    cudarc::nvrtc::compile_ptx_with_opts(
        KERNELS,
        cudarc::nvrtc::CompileOptions {
            arch: Some(PTX_ARCH),
            ..Default::default()
        },
    )
}

const TILE: usize = 256 * 16;
const THREADS: u32 = 256;

/// Mirror of `struct State` in `kernels.cu` (explicit padding, 136 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct State {
    prefix: u32,
    _p0: u32,
    k_rem: u64,
    a_bits: u32,
    b_lo: u32,
    b_start: u64,
    b_need: u64,
    rand: u64,
    random_offset: i32,
    _p1: u32,
    total_a: u64,
    total_b: u64,
    count: u64,
    first_bad: u32,
    max_bits: u32,
    abs_sum: f64,
    lo: f64,
    hi: f64,
    cur_bits: u32,
    _p2: u32,
    nnz: u64,
    t1_bits: u32,
    t2_bits: u32,
}

const STATE_WORDS: usize = std::mem::size_of::<State>() / 8;

impl State {
    fn fresh() -> Self {
        State {
            first_bad: u32::MAX,
            t1_bits: u32::MAX,
            hi: 1.0,
            ..Zeroable::zeroed()
        }
    }
}

fn cu<E: std::fmt::Display>(e: E) -> Error {
    Error::Cuda(e.to_string())
}

struct Kernels {
    accumulate: CudaFunction,
    radix_hist: CudaFunction,
    radix_pick: CudaFunction,
    ms_threshold: CudaFunction,
    ms_count: CudaFunction,
    ms_decide: CudaFunction,
    ms_classes: CudaFunction,
    count_tiles: CudaFunction,
    scan_tiles: CudaFunction,
    emit_tiles: CudaFunction,
}

/// Device-side selectors on one CUDA stream, with their scratch buffers.
pub struct CudaSparsifier {
    stream: Arc<CudaStream>,
    k: Kernels,
    hist: CudaSlice<u32>,
    state: CudaSlice<u64>,
    ta: CudaSlice<u32>,
    tb: CudaSlice<u32>,
    rng: ChaCha8Rng,
}

impl std::fmt::Debug for CudaSparsifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSparsifier").finish_non_exhaustive()
    }
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

    /// Opens device `ordinal`, compiles the kernels (NVRTC) and allocates scratch space.
    /// `seed` drives MSTopK's offsets.
    pub fn new(ordinal: usize, seed: u64) -> Result<Self> {
        if !Self::available() {
            return Err(Error::Cuda("no CUDA driver or device".into()));
        }
        let ctx = CudaContext::new(ordinal).map_err(cu)?;
        let stream = ctx.default_stream();
        let ptx = compile_kernels().map_err(cu)?;
        let m = ctx.load_module(ptx).map_err(cu)?;
        let f = |n: &str| m.load_function(n).map_err(cu);
        let k = Kernels {
            accumulate: f("ef_accumulate")?,
            radix_hist: f("radix_hist")?,
            radix_pick: f("radix_pick")?,
            ms_threshold: f("ms_threshold")?,
            ms_count: f("ms_count")?,
            ms_decide: f("ms_decide")?,
            ms_classes: f("ms_classes")?,
            count_tiles: f("count_tiles")?,
            scan_tiles: f("scan_tiles")?,
            emit_tiles: f("emit_tiles")?,
        };
        let hist = stream.alloc_zeros::<u32>(2048).map_err(cu)?;
        let state = stream.alloc_zeros::<u64>(STATE_WORDS).map_err(cu)?;
        let ta = stream.alloc_zeros::<u32>(1).map_err(cu)?;
        let tb = stream.alloc_zeros::<u32>(1).map_err(cu)?;
        Ok(CudaSparsifier {
            stream,
            k,
            hist,
            state,
            ta,
            tb,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// The stream every operation runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies a host slice to a new device buffer.
    pub fn upload(&self, x: &[f32]) -> Result<CudaSlice<f32>> {
        self.stream.clone_htod(x).map_err(cu)
    }

    /// Copies a device buffer back to the host.
    pub fn download(&self, x: &CudaSlice<f32>) -> Result<Vec<f32>> {
        self.stream.clone_dtoh(x).map_err(cu)
    }

    fn put_state(&mut self, s: &State) -> Result<()> {
        let words: [u64; STATE_WORDS] = bytemuck::cast(*s);
        self.stream
            .memcpy_htod(&words[..], &mut self.state)
            .map_err(cu)
    }

    fn get_state(&self) -> Result<State> {
        let v = self.stream.clone_dtoh(&self.state).map_err(cu)?;
        let words: [u64; STATE_WORDS] =
            v.try_into().map_err(|_| Error::Cuda("state size".into()))?;
        Ok(bytemuck::cast(words))
    }

    fn grid(n: usize) -> u32 {
        (n.div_ceil(THREADS as usize)).clamp(1, 4096) as u32
    }

    fn one() -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn cfg(blocks: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn check_lens(residual: &CudaSlice<f32>, grad: &CudaSlice<f32>) -> Result<u32> {
        if residual.len() != grad.len() {
            return Err(Error::LengthMismatch {
                what: "residual",
                got: residual.len(),
                expected: grad.len(),
            });
        }
        u32::try_from(grad.len()).map_err(|_| Error::TooLong(grad.len()))
    }

    /// `r += g` with the level-0 histogram and/or the |x| statistics.
    fn accumulate(
        &mut self,
        r: &mut CudaSlice<f32>,
        g: &CudaSlice<f32>,
        n: u32,
        hist: bool,
        stats: bool,
    ) -> Result<()> {
        let (h, s) = (i32::from(hist), i32::from(stats));
        let mut b = self.stream.launch_builder(&self.k.accumulate);
        b.arg(r)
            .arg(g)
            .arg(&n)
            .arg(&mut self.state)
            .arg(&mut self.hist);
        b.arg(&h).arg(&s);
        // SAFETY: arguments match `ef_accumulate`'s signature; buffers hold n elements.
        unsafe { b.launch(Self::cfg(Self::grid(n as usize))) }.map_err(cu)?;
        Ok(())
    }

    /// Ordered emission of the classes set in the state; returns the host result.
    fn emit(
        &mut self,
        r: &mut CudaSlice<f32>,
        n: u32,
        known: Option<usize>,
    ) -> Result<SparseGrad<f32>> {
        let tiles = (n as usize).div_ceil(TILE).max(1);
        if self.ta.len() < tiles {
            self.ta = self.stream.alloc_zeros::<u32>(tiles).map_err(cu)?;
            self.tb = self.stream.alloc_zeros::<u32>(tiles).map_err(cu)?;
        }
        let t32 = tiles as u32;
        let mut b = self.stream.launch_builder(&self.k.count_tiles);
        b.arg(&*r)
            .arg(&n)
            .arg(&self.state)
            .arg(&mut self.ta)
            .arg(&mut self.tb);
        // SAFETY: matches `count_tiles`; one block per tile.
        unsafe { b.launch(Self::cfg(t32)) }.map_err(cu)?;
        let mut b = self.stream.launch_builder(&self.k.scan_tiles);
        b.arg(&mut self.ta)
            .arg(&mut self.tb)
            .arg(&t32)
            .arg(&mut self.state);
        // SAFETY: matches `scan_tiles`; single thread.
        unsafe { b.launch(Self::one()) }.map_err(cu)?;
        // Output capacity: known exactly (k) for exact-count selectors; otherwise read the
        // count the scan produced (threshold selection).
        let cap = match known {
            Some(c) => c,
            None => {
                let s = self.get_state()?;
                if s.first_bad != u32::MAX {
                    return Err(self.bad(r, s.first_bad));
                }
                s.count as usize
            }
        };
        let mut out_idx = self.stream.alloc_zeros::<u32>(cap.max(1)).map_err(cu)?;
        let mut out_val = self.stream.alloc_zeros::<f32>(cap.max(1)).map_err(cu)?;
        let mut b = self.stream.launch_builder(&self.k.emit_tiles);
        b.arg(&mut *r)
            .arg(&n)
            .arg(&self.state)
            .arg(&self.ta)
            .arg(&self.tb);
        b.arg(&mut out_idx).arg(&mut out_val);
        // SAFETY: matches `emit_tiles`; the outputs hold `count <= cap` entries.
        unsafe { b.launch(Self::cfg(t32)) }.map_err(cu)?;
        let s = self.get_state()?;
        if s.first_bad != u32::MAX {
            return Err(self.bad(r, s.first_bad));
        }
        let count = (s.count as usize).min(cap);
        let mut idx = self.stream.clone_dtoh(&out_idx).map_err(cu)?;
        let mut val = self.stream.clone_dtoh(&out_val).map_err(cu)?;
        idx.truncate(count);
        val.truncate(count);
        SparseGrad::new(idx, val, n as usize)
    }

    /// The typed error for a non-finite value at `index` (reads the value back).
    fn bad(&self, r: &CudaSlice<f32>, index: u32) -> Error {
        let value = self
            .stream
            .clone_dtoh(&r.slice(index as usize..index as usize + 1))
            .ok()
            .and_then(|v| v.first().copied())
            .unwrap_or(f32::NAN);
        Error::NonFinite {
            index: index as usize,
            value,
        }
    }

    /// Fused error feedback + exact top-k (ties: lower index): `residual += grad`, select
    /// exactly `min(k, d)` entries, zero them in `residual`.
    pub fn topk_fused(
        &mut self,
        residual: &mut CudaSlice<f32>,
        grad: &CudaSlice<f32>,
        k: usize,
    ) -> Result<SparseGrad<f32>> {
        let n = Self::check_lens(residual, grad)?;
        let k = k.min(n as usize);
        let mut s = State::fresh();
        s.k_rem = k as u64;
        if k == 0 || k == n as usize {
            s.a_bits = if k == 0 { u32::MAX } else { 0 };
            s.b_lo = s.a_bits;
            self.put_state(&s)?;
            self.accumulate(residual, grad, n, false, false)?;
            return self.emit(residual, n, Some(k));
        }
        self.put_state(&s)?;
        self.accumulate(residual, grad, n, true, false)?;
        // Levels: bits 30..20 (histogram built while accumulating), 19..9, 8..0.
        let levels: [(i32, i32); 3] = [(20, 11), (9, 11), (0, 9)];
        for (li, &(shift, width)) in levels.iter().enumerate() {
            if li > 0 {
                let mut b = self.stream.launch_builder(&self.k.radix_hist);
                b.arg(&*residual)
                    .arg(&n)
                    .arg(&self.state)
                    .arg(&mut self.hist);
                b.arg(&shift).arg(&width);
                // SAFETY: matches `radix_hist`.
                unsafe { b.launch(Self::cfg(Self::grid(n as usize))) }.map_err(cu)?;
            }
            let last = i32::from(li == 2);
            let mut b = self.stream.launch_builder(&self.k.radix_pick);
            b.arg(&mut self.hist)
                .arg(&mut self.state)
                .arg(&shift)
                .arg(&width)
                .arg(&last);
            // SAFETY: matches `radix_pick`; single thread.
            unsafe { b.launch(Self::one()) }.map_err(cu)?;
        }
        self.emit(residual, n, Some(k))
    }

    /// Fused error feedback + MSTopK with `rounds` rounds (paper 001 Algorithm 1).
    pub fn mstopk_fused(
        &mut self,
        residual: &mut CudaSlice<f32>,
        grad: &CudaSlice<f32>,
        k: usize,
        rounds: usize,
    ) -> Result<SparseGrad<f32>> {
        let n = Self::check_lens(residual, grad)?;
        let k = k.min(n as usize);
        if k == 0 || k == n as usize {
            return self.topk_fused(residual, grad, k);
        }
        let mut s = State::fresh();
        s.rand = self.rng.gen();
        self.put_state(&s)?;
        self.accumulate(residual, grad, n, false, true)?;
        let (n64, k64) = (u64::from(n), k as u64);
        for _ in 0..rounds {
            let mut b = self.stream.launch_builder(&self.k.ms_threshold);
            b.arg(&mut self.state).arg(&n64);
            // SAFETY: matches `ms_threshold`; single thread.
            unsafe { b.launch(Self::one()) }.map_err(cu)?;
            let mut b = self.stream.launch_builder(&self.k.ms_count);
            b.arg(&*residual).arg(&n).arg(&mut self.state);
            // SAFETY: matches `ms_count`.
            unsafe { b.launch(Self::cfg(Self::grid(n as usize))) }.map_err(cu)?;
            let mut b = self.stream.launch_builder(&self.k.ms_decide);
            b.arg(&mut self.state).arg(&k64);
            // SAFETY: matches `ms_decide`; single thread.
            unsafe { b.launch(Self::one()) }.map_err(cu)?;
        }
        let mut b = self.stream.launch_builder(&self.k.ms_classes);
        b.arg(&mut self.state).arg(&k64);
        // SAFETY: matches `ms_classes`; single thread.
        unsafe { b.launch(Self::one()) }.map_err(cu)?;
        self.emit(residual, n, Some(k))
    }

    /// Fused error feedback + hard threshold: every `|acc| ≥ threshold`.
    pub fn threshold_fused(
        &mut self,
        residual: &mut CudaSlice<f32>,
        grad: &CudaSlice<f32>,
        threshold: f32,
    ) -> Result<SparseGrad<f32>> {
        let n = Self::check_lens(residual, grad)?;
        if !(threshold.is_finite() && threshold >= 0.0) {
            return Err(Error::InvalidArgument(format!("threshold {threshold}")));
        }
        let mut s = State::fresh();
        s.a_bits = threshold.to_bits() & 0x7fff_ffff;
        s.b_lo = s.a_bits;
        self.put_state(&s)?;
        self.accumulate(residual, grad, n, false, false)?;
        self.emit(residual, n, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::reference_topk;
    use crate::exact::tests::gen_vec;

    /// Runs `body` on the GPU when there is one; otherwise says it skipped.
    fn with_gpu(body: impl FnOnce(&mut CudaSparsifier)) {
        if !CudaSparsifier::available() {
            println!("skipped: no CUDA device");
            return;
        }
        let mut g = CudaSparsifier::new(0, 7).expect("device opens");
        body(&mut g);
    }

    /// The kernel source compiles to PTX with NVRTC. Needs only libnvrtc (no GPU, no
    /// driver), so it runs wherever NVRTC is installed, e.g. from the
    /// `nvidia-cuda-nvrtc-cu12` wheel with its `lib` folder on `LD_LIBRARY_PATH`.
    #[test]
    fn kernels_compile_with_nvrtc() {
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipped: libnvrtc not found");
            return;
        }
        let ptx = compile_kernels().expect("kernels.cu compiles with NVRTC");
        let text = ptx.to_src();
        for entry in ["ef_accumulate", "radix_hist", "emit_tiles", ".entry"] {
            assert!(text.contains(entry), "PTX lacks {entry}");
        }
    }

    #[test]
    fn state_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<State>(), 136);
        assert!(KERNELS.contains("struct State"));
    }

    #[test]
    fn gpu_topk_matches_reference_and_conserves_mass() {
        with_gpu(|gpu| {
            for (seed, d, kind) in [
                (1u64, 0usize, 0u8),
                (2, 1000, 1),
                (3, 100_000, 0),
                (4, 70_001, 3),
            ] {
                let g = gen_vec(seed, d, kind);
                let r0 = gen_vec(seed + 9, d, 0);
                let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
                for k in [0, 1, d / 100, d / 3, d] {
                    let mut r = gpu.upload(&r0).unwrap();
                    let gd = gpu.upload(&g).unwrap();
                    let sg = gpu.topk_fused(&mut r, &gd, k).unwrap();
                    assert_eq!(sg.indices(), &reference_topk(&acc, k)[..]);
                    let mut back = gpu.download(&r).unwrap();
                    sg.scatter_add_into(&mut back).unwrap();
                    assert_eq!(back, acc);
                    let mut r = gpu.upload(&r0).unwrap();
                    let ms = gpu.mstopk_fused(&mut r, &gd, k, 30).unwrap();
                    assert_eq!(ms.nnz(), k.min(d));
                    let mut r = gpu.upload(&r0).unwrap();
                    let th = gpu.threshold_fused(&mut r, &gd, 0.5).unwrap();
                    let want: Vec<u32> = (0..d as u32)
                        .filter(|&i| acc[i as usize].abs() >= 0.5)
                        .collect();
                    assert_eq!(th.indices(), &want[..]);
                }
            }
            let mut bad = vec![0.0f32; 5000];
            bad[1234] = f32::NAN;
            let mut r = gpu.upload(&vec![0.0; 5000]).unwrap();
            let gd = gpu.upload(&bad).unwrap();
            assert!(matches!(
                gpu.topk_fused(&mut r, &gd, 10),
                Err(Error::NonFinite { index: 1234, .. })
            ));
        });
    }
}
