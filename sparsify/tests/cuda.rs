//! The CUDA selectors against the CPU selectors and the sort-based references.
//!
//! Every property test runs its CPU half everywhere and its GPU half on the same input
//! whenever a CUDA device is present. The GPU half is skipped only when there is no device
//! (no libcuda or no GPU); with a device, a failure to open it, to find NVRTC or to
//! compile the kernels fails the test. The NVRTC tests need only libnvrtc (no GPU).

#![cfg(feature = "cuda")]

use std::sync::{Mutex, MutexGuard, OnceLock};

use half::{bf16, f16};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sparsify::cuda::{self, CudaSparsifier, GpuSelection};
use sparsify::exact::reference_topk;
use sparsify::mstopk::reference_mstopk;
use sparsify::{
    Error, ErrorFeedback, ExDyna, ExactTopK, HardThreshold, MsTopK, Selector, SparseGrad, Value,
};

/// The shared device sparsifier, or `None` (after saying so) when there is no device.
fn gpu() -> Option<MutexGuard<'static, CudaSparsifier>> {
    static G: OnceLock<Option<Mutex<CudaSparsifier>>> = OnceLock::new();
    let g = G.get_or_init(|| {
        if !CudaSparsifier::available() {
            eprintln!("GPU half skipped: no CUDA driver or device");
            return None;
        }
        // A device is present: from here on every failure is a test failure.
        let s = CudaSparsifier::new(0, 0).expect("the CUDA device opens and the kernels compile");
        eprintln!(
            "GPU half runs on {} ({})",
            s.device_name().unwrap_or_default(),
            s.arch()
        );
        Some(Mutex::new(s))
    });
    g.as_ref()
        .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Test vectors: 0 cubed uniforms, 1 few distinct values (ties), 2 sorted ramp, 3 mostly
/// zeros, 4 multiples of 2^-12 in (-4, 4) (every sum of up to 2^20 of them is exact in
/// f64, so the CPU and GPU means agree bit for bit).
fn gen_vec(seed: u64, d: usize, kind: u8) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..d)
        .map(|i| match kind % 5 {
            0 => {
                let u: f32 = rng.gen_range(-1.0..1.0);
                u * u * u * 3.0
            }
            1 => rng.gen_range(-4i32..=4) as f32 * 0.5,
            2 => i as f32 * 1e-3 - 1.0,
            3 => {
                if rng.gen_bool(0.02) {
                    rng.gen_range(-1.0..1.0)
                } else {
                    0.0
                }
            }
            _ => {
                let u: f32 = rng.gen_range(-1.0f32..1.0);
                (u * u * u * 16_384.0).round() / 4096.0
            }
        })
        .collect()
}

/// (gradient, residual, k) with the same size and density mix as the CPU tests.
fn case_strategy(kinds: std::ops::Range<u8>) -> impl Strategy<Value = (Vec<f32>, Vec<f32>, usize)> {
    (any::<u64>(), 0usize..12_000, kinds, 0.0f64..1.05).prop_map(|(s, d, kind, frac)| {
        let d = if s % 3 == 0 { d % 300 } else { d };
        let k = ((d as f64) * frac * frac * frac) as usize;
        let r_kind = if kind == 4 { 4 } else { 0 };
        (gen_vec(s, d, kind), gen_vec(s ^ 0x5eed, d, r_kind), k)
    })
}

fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// Bit patterns for exact comparison, with every NaN as one pattern: the GPU's arithmetic
/// returns the canonical NaN (0x7fffffff) where the CPU keeps the operand's payload.
fn bits(x: &[f32]) -> Vec<u32> {
    x.iter()
        .map(|v| if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() })
        .collect()
}

/// The CPU step: (selected, residual after) from `sel` fused with error feedback.
fn cpu_step<V: Value>(
    sel: &mut dyn Selector,
    r0: &[f32],
    g: &[f32],
    k: usize,
) -> sparsify::Result<(SparseGrad<V>, Vec<f32>)> {
    let mut ef = ErrorFeedback::from_residual(r0.to_vec());
    let (sg, _) = ef.step_as::<V>(sel, g, k)?;
    Ok((sg, ef.into_residual()))
}

/// The GPU step on freshly uploaded buffers: (selected, residual after).
fn gpu_step<V: Value>(
    gpu: &mut CudaSparsifier,
    how: &GpuSelection,
    r0: &[f32],
    g: &[f32],
    k: usize,
) -> sparsify::Result<(SparseGrad<V>, Vec<f32>)> {
    let mut r = gpu.upload(r0)?;
    let gd = gpu.upload(g)?;
    let out = gpu.select_fused::<V, _, _>(how, &mut r, &gd, k);
    let back = gpu.download(&r)?;
    out.map(|(sg, _)| (sg, back))
}

/// Same pairs bit for bit and the same residual bit for bit.
fn same<V: Value>(
    what: &str,
    cpu: &(SparseGrad<V>, Vec<f32>),
    gpu: &(SparseGrad<V>, Vec<f32>),
) -> Result<(), TestCaseError> {
    prop_assert_eq!(cpu.0.indices(), gpu.0.indices(), "{} indices", what);
    let cv: Vec<&[u8]> = cpu.0.values().iter().map(bytemuck::bytes_of).collect();
    let gv: Vec<&[u8]> = gpu.0.values().iter().map(bytemuck::bytes_of).collect();
    prop_assert_eq!(cv, gv, "{} values", what);
    prop_assert_eq!(bits(&cpu.1), bits(&gpu.1), "{} residual", what);
    Ok(())
}

/// Mass conservation: sent values plus the new residual equal residual + grad exactly
/// (as values: a sent −0.0 comes back as +0.0).
fn conserves(acc: &[f32], sg: &SparseGrad<f32>, resid: &[f32]) -> Result<(), TestCaseError> {
    let mut back = resid.to_vec();
    sg.scatter_add_into(&mut back).unwrap();
    prop_assert_eq!(back, acc.to_vec());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Exact top-k: the CPU and the GPU both give the sort reference's indices, the
    /// accumulated values, and the same residual.
    #[test]
    fn exact_topk_cpu_and_gpu_equal_the_reference((g, r0, k) in case_strategy(0..5)) {
        let acc = add(&r0, &g);
        let want = reference_topk(&acc, k);
        let cpu = cpu_step::<f32>(&mut ExactTopK::new(), &r0, &g, k).unwrap();
        prop_assert_eq!(cpu.0.indices(), &want[..]);
        conserves(&acc, &cpu.0, &cpu.1)?;
        if let Some(mut gpu) = gpu() {
            let out = gpu_step::<f32>(&mut gpu, &GpuSelection::Exact, &r0, &g, k).unwrap();
            same("exact", &cpu, &out)?;
        }
    }

    /// MSTopK: exactly min(k, d) entries; on exactly summable data (equal means) the GPU
    /// equals the CPU and the literal Algorithm 1 entry for entry, offset included.
    #[test]
    fn mstopk_cpu_and_gpu_agree(
        (g, r0, k) in case_strategy(0..5), seed in any::<u64>(), rounds in 0usize..40
    ) {
        let acc = add(&r0, &g);
        let cpu = cpu_step::<f32>(&mut MsTopK::new(rounds, seed), &r0, &g, k).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        prop_assert_eq!(cpu.0.indices(), &reference_mstopk(&acc, k, rounds, &mut rng)[..]);
        prop_assert_eq!(cpu.0.nnz(), k.min(acc.len()));
        conserves(&acc, &cpu.0, &cpu.1)?;
        if let Some(mut gpu) = gpu() {
            gpu.reseed(seed);
            let how = GpuSelection::MsTopK { rounds };
            let out = gpu_step::<f32>(&mut gpu, &how, &r0, &g, k).unwrap();
            prop_assert_eq!(out.0.nnz(), k.min(acc.len()));
            conserves(&acc, &out.0, &out.1)?;
            let exactly_summable = acc.iter().all(|v| (v * 4096.0).fract() == 0.0 && v.abs() < 8.0);
            if exactly_summable {
                same("mstopk", &cpu, &out)?;
            }
        }
    }

    /// Hard threshold and ExDyna's partition-wise threshold (scaling off): the same set as
    /// the CPU, the same residual.
    #[test]
    fn thresholds_cpu_and_gpu_agree(
        (g, r0, k) in case_strategy(0..5), t in 0.0f32..2.0, a in 0.0f64..1.0, b in 0.0f64..1.0
    ) {
        let acc = add(&r0, &g);
        let mut hard = HardThreshold::new(t).unwrap();
        let cpu = cpu_step::<f32>(&mut hard, &r0, &g, k).unwrap();
        if k > 0 && k < acc.len() {
            let want: Vec<u32> = (0..acc.len() as u32).filter(|&i| acc[i as usize].abs() >= t).collect();
            prop_assert_eq!(cpu.0.indices(), &want[..]);
        }
        conserves(&acc, &cpu.0, &cpu.1)?;
        let d = acc.len();
        let (lo, hi) = {
            let (x, y) = ((a * d as f64) as usize, (b * d as f64) as usize);
            (x.min(y), x.max(y))
        };
        let mut ex = ExDyna::new();
        ex.set_range(lo, hi).unwrap();
        ex.set_threshold(t);
        ex.set_auto_scale(false);
        let cpu_ex = cpu_step::<f32>(&mut ex, &r0, &g, k).unwrap();
        conserves(&acc, &cpu_ex.0, &cpu_ex.1)?;
        if k > 0 && k < d {
            prop_assert!(cpu_ex.0.indices().iter().all(|&i| (lo..hi).contains(&(i as usize))));
        }
        if let Some(mut gpu) = gpu() {
            let out = gpu_step::<f32>(&mut gpu, &GpuSelection::Threshold(t), &r0, &g, k).unwrap();
            same("threshold", &cpu, &out)?;
            let how = GpuSelection::ExDyna { range: Some(lo..hi), threshold: t };
            let out = gpu_step::<f32>(&mut gpu, &how, &r0, &g, k).unwrap();
            same("exdyna", &cpu_ex, &out)?;
        }
    }

    /// f16 and bf16 on the wire: the same rounded values and the same residual (holding
    /// the rounding error) as the CPU's `step_as`.
    #[test]
    fn wire_types_cpu_and_gpu_agree((g, r0, k) in case_strategy(0..5)) {
        let g: Vec<f32> = g.iter().map(|v| v * 3.0e4).collect();
        let c16 = cpu_step::<f16>(&mut ExactTopK::new(), &r0, &g, k).unwrap();
        let cb16 = cpu_step::<bf16>(&mut ExactTopK::new(), &r0, &g, k).unwrap();
        prop_assert_eq!(c16.0.nnz(), k.min(g.len()));
        prop_assert_eq!(cb16.0.nnz(), k.min(g.len()));
        if let Some(mut gpu) = gpu() {
            let o16 = gpu_step::<f16>(&mut gpu, &GpuSelection::Exact, &r0, &g, k).unwrap();
            same("f16", &c16, &o16)?;
            let ob16 = gpu_step::<bf16>(&mut gpu, &GpuSelection::Exact, &r0, &g, k).unwrap();
            same("bf16", &cb16, &ob16)?;
        }
    }

    /// A sparse update applied on the device equals the host's scatter-add.
    #[test]
    fn apply_sparse_matches_host_scatter((g, r0, _k) in case_strategy(0..5), alpha in -2.0f32..2.0) {
        let sg = SparseGrad::<f32>::from_dense(&g).unwrap();
        let mut want = r0.clone();
        let scaled: Vec<f32> = sg.values().iter().map(|v| alpha * v).collect();
        SparseGrad::new(sg.indices().to_vec(), scaled, sg.len()).unwrap()
            .scatter_add_into(&mut want).unwrap();
        if let Some(mut gpu) = gpu() {
            let mut dst = gpu.upload(&r0).unwrap();
            gpu.apply_sparse(&mut dst, &sg, alpha).unwrap();
            prop_assert_eq!(bits(&gpu.download(&dst).unwrap()), bits(&want));
        }
    }
}

/// A NaN or infinity: every selector fails with the smallest such index, on both paths,
/// and the residual keeps `residual + grad` (nothing zeroed), like the CPU.
#[test]
fn non_finite_input_keeps_the_residual() {
    let d = 50_000;
    let r0 = gen_vec(1, d, 0);
    let mut g = gen_vec(2, d, 0);
    g[31_337] = f32::NAN;
    g[40_000] = f32::INFINITY;
    let acc = add(&r0, &g);
    let mut ex = ExDyna::new();
    ex.set_range(100, 200).unwrap();
    ex.set_threshold(0.5);
    ex.set_auto_scale(false);
    let cases: Vec<(Box<dyn Selector>, GpuSelection)> = vec![
        (Box::new(ExactTopK::new()), GpuSelection::Exact),
        (
            Box::new(MsTopK::new(30, 3)),
            GpuSelection::MsTopK { rounds: 30 },
        ),
        (
            Box::new(HardThreshold::new(0.5).unwrap()),
            GpuSelection::Threshold(0.5),
        ),
        (
            Box::new(ex),
            GpuSelection::ExDyna {
                range: Some(100..200),
                threshold: 0.5,
            },
        ),
    ];
    let mut gpu = gpu();
    for (mut sel, how) in cases {
        for k in [0, 1, 50, 5_000, d] {
            let mut ef = ErrorFeedback::from_residual(r0.clone());
            match ef.step(sel.as_mut(), &g, k) {
                Err(Error::NonFinite {
                    index: 31_337,
                    value,
                }) => assert!(value.is_nan()),
                other => panic!("CPU {how:?} k {k}: {other:?}"),
            }
            assert_eq!(bits(ef.residual()), bits(&acc), "CPU {how:?} k {k}");
            if let Some(gpu) = gpu.as_mut() {
                let mut r = gpu.upload(&r0).unwrap();
                let gd = gpu.upload(&g).unwrap();
                match gpu.select_fused::<f32, _, _>(&how, &mut r, &gd, k) {
                    Err(Error::NonFinite {
                        index: 31_337,
                        value,
                    }) => assert!(value.is_nan()),
                    other => panic!("GPU {how:?} k {k}: {other:?}"),
                }
                assert_eq!(
                    bits(&gpu.download(&r).unwrap()),
                    bits(&acc),
                    "GPU {how:?} k {k}"
                );
                // The next call on the same sparsifier is clean (no state left dirty).
                let mut r = gpu.upload(&r0).unwrap();
                let clean = gpu.upload(&gen_vec(2, d, 0)).unwrap();
                let sg = gpu.topk_fused(&mut r, &clean, 10).unwrap();
                assert_eq!(sg.nnz(), 10);
            }
        }
    }
}

/// Wrong lengths, a bad threshold or partition: typed errors on both paths.
#[test]
fn bad_arguments_are_typed_errors() {
    assert!(HardThreshold::new(-1.0).is_err());
    let mut ex = ExDyna::new();
    ex.set_range(0, 20).unwrap();
    assert!(ex.select(&[1.0; 10], 2).is_err());
    if let Some(mut gpu) = gpu() {
        let mut r = gpu.upload(&[0.0; 10]).unwrap();
        let g = gpu.upload(&[1.0; 11]).unwrap();
        assert!(matches!(
            gpu.topk_fused(&mut r, &g, 3),
            Err(Error::LengthMismatch { .. })
        ));
        let g = gpu.upload(&[1.0; 10]).unwrap();
        assert!(matches!(
            gpu.threshold_fused(&mut r, &g, f32::NAN),
            Err(Error::InvalidArgument(_))
        ));
        let how = GpuSelection::ExDyna {
            range: Some(0..20),
            threshold: 0.1,
        };
        assert!(matches!(
            gpu.select_fused::<f32, _, _>(&how, &mut r, &g, 2),
            Err(Error::InvalidArgument(_))
        ));
    }
}

/// Sizes past one tile, one block and one wave; distributions whose level-0 bin is wide
/// (uniform, all ties) so the candidate buffers overflow and the read-only retry runs.
#[test]
fn large_inputs_match_the_cpu() {
    let Some(mut gpu) = gpu() else {
        // The CPU half of these sizes is covered by the selectors' own tests.
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let d = (1 << 22) + 12_345;
    let vectors: Vec<(&str, Vec<f32>)> = vec![
        ("cubed", gen_vec(3, d, 0)),
        (
            "uniform",
            (0..d).map(|_| rng.gen_range(-1.0f32..1.0)).collect(),
        ),
        ("ties", vec![0.25; d]),
        ("sparse", gen_vec(4, d, 3)),
    ];
    let zero = vec![0.0f32; d];
    for (name, g) in &vectors {
        for k in [1, 4_199, d / 1000, d / 100, d / 2] {
            let cpu = cpu_step::<f32>(&mut ExactTopK::new(), &zero, g, k).unwrap();
            let out = gpu_step::<f32>(&mut gpu, &GpuSelection::Exact, &zero, g, k).unwrap();
            assert_eq!(cpu.0.indices(), out.0.indices(), "{name} k {k}");
            assert_eq!(bits(&cpu.1), bits(&out.1), "{name} k {k}");
            gpu.reseed(5);
            let how = GpuSelection::MsTopK { rounds: 30 };
            let ms = gpu_step::<f32>(&mut gpu, &how, &zero, g, k).unwrap();
            assert_eq!(ms.0.nnz(), k, "{name} mstopk k {k}");
        }
    }
}

/// The kernels compile with NVRTC for the H100/H200 and, where this NVRTC still targets
/// it (before CUDA 13), for compute_70. Needs libnvrtc only; without it the test fails
/// when a GPU is present and says it skipped otherwise.
#[test]
fn kernels_compile_with_nvrtc() {
    let Some((major, minor)) = cuda::nvrtc_version() else {
        assert!(
            !CudaSparsifier::available(),
            "a GPU is present but libnvrtc is not"
        );
        eprintln!("skipped: libnvrtc not found");
        return;
    };
    eprintln!("NVRTC {major}.{minor}");
    let mut archs = vec![cuda::HOPPER_ARCH];
    if major < 13 {
        archs.push(cuda::PORTABLE_ARCH);
    }
    for arch in archs {
        let ptx = cuda::compile_kernels(arch).unwrap_or_else(|e| panic!("{e}"));
        let text = ptx.to_src();
        for entry in [
            "ef_accumulate",
            "radix_hist",
            "radix_pick",
            "compact",
            "ms_rounds",
            "part_argmax",
            "finish",
            "scatter_add",
            "sample_abs",
            "ef_candidates",
            "mark_classes",
            "emit_marked",
            "state_layout",
        ] {
            assert!(
                text.contains(&format!(".entry {entry}")),
                "{arch}: PTX lacks {entry}"
            );
        }
    }
}

/// The shared state struct: every field offset of the host's `repr(C)` struct
/// (`offset_of!`) equals the kernel's, as NVRTC lays it out (no GPU needed) and, with a
/// device, as a kernel measures it.
#[test]
fn state_layout_matches_the_kernel() {
    let host = cuda::state_layout();
    assert_eq!(host.len(), 25);
    let want: Vec<u64> = host
        .iter()
        .map(|(_, o)| *o as u64)
        .chain([cuda::state_size() as u64])
        .collect();
    if cuda::nvrtc_available() {
        let dev = cuda::nvrtc_state_layout(cuda::KERNELS, cuda::HOPPER_ARCH)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(dev, want, "NVRTC layout vs host (fields then size)");
        // Not vacuous: a kernel struct with one field widened disagrees.
        let widened = cuda::KERNELS.replacen("u32 t_low;", "u64 t_low;", 1);
        assert_ne!(widened, cuda::KERNELS);
        let dev =
            cuda::nvrtc_state_layout(&widened, cuda::HOPPER_ARCH).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(dev, want);
    } else {
        assert!(
            !CudaSparsifier::available(),
            "a GPU is present but libnvrtc is not"
        );
        eprintln!("NVRTC half skipped: libnvrtc not found");
    }
    if let Some(gpu) = gpu() {
        assert_eq!(
            gpu.device_state_layout().unwrap(),
            want,
            "device layout vs host"
        );
    }
}

/// `select_fused_into` reuses the caller's `SparseGrad` across calls of different sizes and
/// selectors and gives what `select_fused` gives; the device-time split is filled in.
#[test]
fn select_into_reuses_and_matches() {
    let Some(mut gpu) = gpu() else {
        return;
    };
    let mut out = SparseGrad::<f32>::empty(0);
    for (seed, d, k) in [
        (1u64, 100_000usize, 1_000usize),
        (2, 3_000, 2_999),
        (3, 1 << 20, 10),
    ] {
        let g = gen_vec(seed, d, 0);
        let r0 = gen_vec(seed ^ 7, d, 0);
        for how in [GpuSelection::Exact, GpuSelection::Threshold(0.5)] {
            let want = gpu_step::<f32>(&mut gpu, &how, &r0, &g, k).unwrap();
            let mut r = gpu.upload(&r0).unwrap();
            let gd = gpu.upload(&g).unwrap();
            gpu.select_fused_into(&how, &mut r, &gd, k, &mut out)
                .unwrap();
            assert_eq!(out.indices(), want.0.indices(), "{how:?} d {d}");
            assert_eq!(bits(out.values()), bits(want.0.values()), "{how:?} d {d}");
            assert_eq!(bits(&gpu.download(&r).unwrap()), bits(&want.1));
            assert!(out.nnz() > 0, "not vacuous");
            let t = gpu.last_call_times();
            // CUDA events sit inside the wall-clock interval (their resolution is about 0.5 µs).
            let slack = std::time::Duration::from_micros(50);
            assert!(t.device > std::time::Duration::ZERO && t.device <= t.to_state + slack);
        }
    }
}
