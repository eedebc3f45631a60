//! Cross-module tests: PTO bit-identity for P in 1..=17, LARS and LAMB against f64
//! references of the published formulas, and typed errors on every rank.

use std::time::Duration;

use collectives::{Communicator, ThreadComm, ThreadConfig};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::*;

fn cfg() -> ThreadConfig {
    ThreadConfig::with_timeout(Duration::from_secs(20))
}

fn specs(numels: &[usize]) -> Vec<LayerSpec> {
    numels
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            // Every third layer is a bias: it exercises the skip list.
            let name = if i % 3 == 2 {
                format!("l{i}.bias")
            } else {
                format!("l{i}.weight")
            };
            LayerSpec::new(name, n)
        })
        .collect()
}

fn random_tensors(numels: &[usize], scale: f32, rng: &mut ChaCha8Rng) -> Vec<Vec<f32>> {
    numels
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(-scale..scale)).collect())
        .collect()
}

struct Inputs {
    w: Vec<Vec<f32>>,
    g: Vec<Vec<f32>>,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

fn inputs(numels: &[usize], seed: u64) -> Inputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let w = random_tensors(numels, 0.5, &mut rng);
    let mut g = random_tensors(numels, 0.01, &mut rng);
    // A zero gradient: trust ratio 1 by the zero-norm rule.
    if let Some(first) = g.iter_mut().find(|x| !x.is_empty()) {
        first.iter_mut().for_each(|x| *x = 0.0);
    }
    let m = random_tensors(numels, 0.001, &mut rng);
    let v = random_tensors(numels, 1e-5, &mut rng)
        .into_iter()
        .map(|x| x.into_iter().map(f32::abs).collect())
        .collect();
    Inputs { w, g, m, v }
}

fn lars_bits(c: &[LarsCoeff]) -> Vec<[u64; 4]> {
    c.iter()
        .map(|c| {
            [
                c.weight_norm.to_bits(),
                c.grad_norm.to_bits(),
                c.trust_ratio.to_bits(),
                c.scale.to_bits(),
            ]
        })
        .collect()
}

fn lamb_bits(c: &[LambCoeff]) -> Vec<[u64; 3]> {
    c.iter()
        .map(|c| {
            [
                c.weight_norm.to_bits(),
                c.update_norm.to_bits(),
                c.trust_ratio.to_bits(),
            ]
        })
        .collect()
}

type Outcome = (Vec<[u64; 4]>, Vec<[u64; 3]>, u64, Vec<Vec<u32>>);

/// Everything the operator computes, as bits, on every rank of a `p`-rank world.
fn run_all_ops(p: usize, numels: &[usize], x: &Inputs, mode: Mode, ex: Exchange) -> Vec<Outcome> {
    let layers = specs(numels);
    ThreadComm::run_with(p, cfg(), |comm| -> Result<Outcome> {
        let mut lars = Lars::new(
            &comm,
            LarsConfig {
                clip: numels.len() % 2 == 0,
                epsilon: 1e-9,
                ..LarsConfig::default()
            },
            &layers,
        )?;
        lars.set_mode(mode);
        lars.set_exchange(ex)?;
        let mut lamb = Lamb::new(&comm, LambConfig::default(), &layers)?;
        lamb.set_mode(mode);
        lamb.set_exchange(ex)?;
        let lc = lars.coefficients(&comm, &x.w, &x.g, 0.5)?;
        let mc = lamb.trust_ratios(&comm, &x.w, &x.g, &x.m, &x.v, 3)?;
        let norm = grad_norm_info(&comm, lars.pto(), &x.g, 1e-3)?;
        // A full step too: the new weights must agree everywhere.
        let mut w = x.w.clone();
        lamb.step(&comm, &mut w, &x.g, 0.01)?;
        lars.step(&comm, &mut w, &x.g, 0.1)?;
        let wb = w
            .iter()
            .map(|t| t.iter().map(|v| v.to_bits()).collect())
            .collect();
        Ok((
            lars_bits(&lc),
            lamb_bits(&mc),
            norm.total_norm.to_bits(),
            wb,
        ))
    })
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// The PTO result is bit-identical on every rank and to computing every layer
    /// locally, for P in 1..=17 (including P larger than the number of layers).
    #[test]
    fn pto_is_bit_identical_to_local_for_p_1_to_17(
        numels in proptest::collection::vec(0usize..300, 0..12),
        seed in any::<u64>(),
    ) {
        let x = inputs(&numels, seed);
        let reference = run_all_ops(1, &numels, &x, Mode::Local, Exchange::default()).remove(0);
        let variants = [
            (Mode::Parallel, Exchange::default()),
            (Mode::Parallel, Exchange::Direct(DEFAULT_TAG)),
            (Mode::Parallel, Exchange::Allgatherv(AllgatherAlgo::Ring)),
            (Mode::Local, Exchange::default()),
        ];
        for p in 1..=17 {
            for (mode, ex) in variants {
                let all = run_all_ops(p, &numels, &x, mode, ex);
                for (rank, got) in all.iter().enumerate() {
                    prop_assert!(got == &reference, "p = {p}, {mode:?}, {ex:?}: rank {rank} differs");
                }
            }
        }
    }
}

#[test]
fn generic_map_with_more_ranks_than_layers_and_one_rank() {
    let numels = [4usize, 1, 9];
    for p in [1, 2, 3, 7] {
        let out = ThreadComm::run_with(p, cfg(), |comm| -> Result<(Vec<u64>, usize)> {
            let pto = Pto::new(&comm, &numels, 42)?;
            let r = pto.map(&comm, 0, Ok(()), |l| {
                Ok((l as u64 + 1) * 100 + numels[l] as u64)
            })?;
            Ok((r, pto.my_range().len()))
        })
        .unwrap();
        let total: usize = out.iter().map(|o| o.1).sum();
        assert_eq!(total, 3);
        for (r, _) in &out {
            assert_eq!(r, &vec![104, 201, 309]);
        }
    }
}

// ---------------------------------------------------------------- f64 references

fn f64v(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

fn norm(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}

fn rel_close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want.abs().max(f64::MIN_POSITIVE)
}

/// LARS as published (You et al. 2017 Algorithm 1, MSTopK/HiTopKComm (Shi et al., MLSys 2021)
/// Eq. 11, apex LARC clip), in f64. Returns (scale per layer, new weights, new momentum).
fn lars_reference(
    c: &LarsConfig,
    excluded: &[bool],
    w: &[Vec<f64>],
    g: &[Vec<f64>],
    v: &[Vec<f64>],
    lr: f64,
) -> (Vec<f64>, Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let mut scales = Vec::new();
    let (mut nw, mut nv) = (Vec::new(), Vec::new());
    for l in 0..w.len() {
        let (wn, gn) = (norm(&w[l]), norm(&g[l]));
        let mut scale = 1.0;
        if !excluded[l] && wn > 0.0 && gn > 0.0 {
            let trust = c.trust_coefficient * wn / (gn + c.weight_decay * wn + c.epsilon);
            scale = if c.clip { (trust / lr).min(1.0) } else { trust };
        }
        let wd = if excluded[l] { 0.0 } else { c.weight_decay };
        let vl: Vec<f64> = (0..w[l].len())
            .map(|i| c.momentum * v[l][i] + lr * scale * (g[l][i] + wd * w[l][i]))
            .collect();
        nw.push((0..w[l].len()).map(|i| w[l][i] - vl[i]).collect());
        nv.push(vl);
        scales.push(scale);
    }
    (scales, nw, nv)
}

/// LAMB as published (You et al. 2020 Algorithm 2), in f64. Returns (trust per layer, new
/// weights, new m, new v).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn lamb_reference(
    c: &LambConfig,
    excluded: &[bool],
    t: i32,
    w: &[Vec<f64>],
    g: &[Vec<f64>],
    m: &[Vec<f64>],
    v: &[Vec<f64>],
    lr: f64,
) -> (Vec<f64>, Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let (mut trusts, mut nw, mut nm, mut nv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in 0..w.len() {
        let n = w[l].len();
        let m1: Vec<f64> = (0..n)
            .map(|i| c.beta1 * m[l][i] + (1.0 - c.beta1) * g[l][i])
            .collect();
        let v1: Vec<f64> = (0..n)
            .map(|i| c.beta2 * v[l][i] + (1.0 - c.beta2) * g[l][i] * g[l][i])
            .collect();
        let (b1, b2) = if c.bias_correction {
            (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t))
        } else {
            (1.0, 1.0)
        };
        let wd = if excluded[l] { 0.0 } else { c.weight_decay };
        let u: Vec<f64> = (0..n)
            .map(|i| (m1[i] / b1) / ((v1[i] / b2).sqrt() + c.epsilon) + wd * w[l][i])
            .collect();
        let (wn, un) = (norm(&w[l]), norm(&u));
        let phi = c.max_weight_norm.map_or(wn, |mx| wn.min(mx));
        let trust = if excluded[l] || phi == 0.0 || un == 0.0 {
            1.0
        } else {
            phi / un
        };
        nw.push((0..n).map(|i| w[l][i] - lr * trust * u[i]).collect());
        nm.push(m1);
        nv.push(v1);
        trusts.push(trust);
    }
    (trusts, nw, nm, nv)
}

/// `got` (f32) equals `want` (f64) within 1e-6 of the magnitude of the terms that made it.
fn assert_tensor_close(got: &[Vec<f32>], want: &[Vec<f64>], scale: &[Vec<f64>], what: &str) {
    for l in 0..want.len() {
        for i in 0..want[l].len() {
            let (a, b) = (f64::from(got[l][i]), want[l][i]);
            let tol = 1e-6 * scale[l][i].max(b.abs()).max(1e-30);
            assert!((a - b).abs() <= tol, "{what}[{l}][{i}]: {a} vs {b}");
        }
    }
}

/// Magnitude scale of each weight: its reference value after the steps plus its start
/// value (the size of the step taken).
fn weight_scale(rw: &[Vec<f64>], w0: &[Vec<f32>]) -> Vec<Vec<f64>> {
    rw.iter()
        .zip(w0)
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(a, &b)| a.abs() + f64::from(b).abs())
                .collect()
        })
        .collect()
}

/// `|x| + floor` per element: the scale a state tensor is compared at.
fn abs_plus(t: &[Vec<f64>], floor: f64) -> Vec<Vec<f64>> {
    t.iter()
        .map(|t| t.iter().map(|v| v.abs() + floor).collect())
        .collect()
}

#[test]
fn lars_matches_f64_reference_over_steps() {
    let numels = [50usize, 7, 300, 0, 64, 3];
    let layers = specs(&numels);
    for clip in [false, true] {
        let c = LarsConfig {
            clip,
            epsilon: 1e-8,
            weight_decay: 5e-4,
            trust_coefficient: 0.02,
            ..LarsConfig::default()
        };
        let x = inputs(&numels, 7);
        let lrs = [0.5, 0.2, 0.05];
        let out = ThreadComm::run_with(3, cfg(), |comm| -> Result<_> {
            let mut opt = Lars::new(&comm, c.clone(), &layers)?;
            let mut w = x.w.clone();
            let mut coeffs = Vec::new();
            for lr in lrs {
                coeffs.push(opt.step(&comm, &mut w, &x.g, lr)?);
            }
            Ok((
                coeffs,
                w,
                opt.momentum_buffers().to_vec(),
                opt.excluded().to_vec(),
            ))
        })
        .unwrap();
        let (coeffs, w, v, excluded) = &out[0];
        assert_eq!(excluded, &vec![false, false, true, false, false, true]);
        let g = x.g.iter().map(|t| f64v(t)).collect::<Vec<_>>();
        let mut rw: Vec<Vec<f64>> = x.w.iter().map(|t| f64v(t)).collect();
        let mut rv: Vec<Vec<f64>> = numels.iter().map(|&n| vec![0.0; n]).collect();
        for (s, &lr) in lrs.iter().enumerate() {
            let (scales, nw, nv) = lars_reference(&c, excluded, &rw, &g, &rv, lr);
            for (l, want) in scales.iter().enumerate() {
                let got = coeffs[s][l].scale;
                assert!(
                    rel_close(got, *want, 1e-6),
                    "step {s} layer {l}: {got} vs {want}"
                );
                let (wn, gn) = (norm(&rw[l]), norm(&g[l]));
                assert!(rel_close(coeffs[s][l].weight_norm, wn, 1e-6) || wn == 0.0);
                assert!(rel_close(coeffs[s][l].grad_norm, gn, 1e-6) || gn == 0.0);
            }
            rw = nw;
            rv = nv;
        }
        let scale = weight_scale(&rw, &x.w);
        assert_tensor_close(w, &rw, &scale, "lars weights");
        let vscale = abs_plus(&rv, 1e-9);
        assert_tensor_close(v, &rv, &vscale, "lars momentum");
    }
}

#[test]
fn lamb_matches_f64_reference_over_steps() {
    let numels = [40usize, 9, 256, 0, 33, 5];
    let layers = specs(&numels);
    for (bias_correction, max_weight_norm) in [(true, None), (false, Some(2.0))] {
        let c = LambConfig {
            bias_correction,
            max_weight_norm,
            ..LambConfig::default()
        };
        let x = inputs(&numels, 11);
        let lrs = [0.01, 0.005, 0.002];
        let out = ThreadComm::run_with(4, cfg(), |comm| -> Result<_> {
            let mut opt = Lamb::new(&comm, c.clone(), &layers)?;
            let mut w = x.w.clone();
            let mut coeffs = Vec::new();
            for lr in lrs {
                coeffs.push(opt.step(&comm, &mut w, &x.g, lr)?);
            }
            let (m, v) = opt.moments();
            Ok((coeffs, w, m.to_vec(), v.to_vec(), opt.excluded().to_vec()))
        })
        .unwrap();
        for o in &out[1..] {
            assert_eq!(lamb_bits(&o.0.concat()), lamb_bits(&out[0].0.concat()));
        }
        let (coeffs, w, m, v, excluded) = &out[0];
        let g: Vec<Vec<f64>> = x.g.iter().map(|t| f64v(t)).collect();
        let mut rw: Vec<Vec<f64>> = x.w.iter().map(|t| f64v(t)).collect();
        let mut rm: Vec<Vec<f64>> = numels.iter().map(|&n| vec![0.0; n]).collect();
        let mut rv = rm.clone();
        for (s, &lr) in lrs.iter().enumerate() {
            let t = s as i32 + 1;
            let (trusts, nw, nm, nv) = lamb_reference(&c, excluded, t, &rw, &g, &rm, &rv, lr);
            for (l, want) in trusts.iter().enumerate() {
                let got = coeffs[s][l].trust_ratio;
                assert!(
                    rel_close(got, *want, 1e-6),
                    "step {s} layer {l}: {got} vs {want}"
                );
            }
            rw = nw;
            rm = nm;
            rv = nv;
        }
        let scale = weight_scale(&rw, &x.w);
        assert_tensor_close(w, &rw, &scale, "lamb weights");
        let ms = abs_plus(&rm, 1e-12);
        assert_tensor_close(m, &rm, &ms, "lamb m");
        let vs = abs_plus(&rv, 1e-20);
        assert_tensor_close(v, &rv, &vs, "lamb v");
    }
}

#[test]
fn clipping_scales_to_max_norm_on_every_rank() {
    let numels = [100usize, 3, 50];
    let x = inputs(&numels, 3);
    let want =
        x.g.iter()
            .flatten()
            .map(|&v| f64::from(v).powi(2))
            .sum::<f64>()
            .sqrt();
    let out = ThreadComm::run_with(2, cfg(), |comm| -> Result<_> {
        let pto = Pto::new(&comm, &numels, 0)?;
        let mut g = x.g.clone();
        let info = clip_grad_norm(&comm, &pto, &mut g, want / 2.0)?;
        let after = grad_norm_info(&comm, &pto, &g, 1.0)?;
        Ok((info, after.total_norm))
    })
    .unwrap();
    for (info, after) in &out {
        assert!(rel_close(info.total_norm, want, 1e-9));
        // PyTorch's +1e-6 in the denominator keeps the result just under max_norm.
        assert!(rel_close(*after, want / 2.0, 1e-4) && *after < want / 2.0);
    }
}

// ---------------------------------------------------------------- typed errors everywhere

/// Runs `f` on every rank and returns every rank's error (each must fail). The closure
/// hands its result back as `Ok` so that the harness does not abort the other ranks when
/// the first one returns: the point is what each rank's own call returns.
fn on_every_rank<T: std::fmt::Debug + Send>(
    p: usize,
    f: impl Fn(&ThreadComm) -> Result<T> + Sync,
) -> Vec<Error> {
    ThreadComm::run_with(p, cfg(), |comm| Ok::<_, Error>(f(&comm)))
        .unwrap()
        .into_iter()
        .map(|r| r.expect_err("every rank must fail"))
        .collect()
}

#[test]
fn shape_mismatch_on_one_rank_is_an_error_on_every_rank() {
    let numels = [10usize, 20, 30, 40];
    let x = inputs(&numels, 1);
    let errs = on_every_rank(4, |comm| {
        let opt = Lars::new(comm, LarsConfig::default(), &specs(&numels))?;
        let mut g = x.g.clone();
        if comm.rank() == 2 {
            g[1].push(0.0);
        }
        opt.coefficients(comm, &x.w, &g, 0.1)
    });
    for e in errs {
        assert_eq!(
            e,
            Error::ShapeMismatch {
                layer: 1,
                weight: 20,
                grad: 21
            }
        );
    }
}

#[test]
fn non_finite_norm_in_one_ranks_range_is_an_error_on_every_rank() {
    let numels = [10usize, 20, 30, 40];
    let mut x = inputs(&numels, 1);
    x.g[3][5] = f32::NAN;
    x.w[2][0] = f32::INFINITY;
    for p in [1, 2, 4, 6] {
        let errs = on_every_rank(p, |comm| {
            let opt = Lamb::new(comm, LambConfig::default(), &specs(&numels))?;
            opt.trust_ratios(comm, &x.w, &x.g, &x.m, &x.v, 1)
        });
        for e in errs {
            // The first bad layer in layer order, as the local computation would report.
            assert!(
                matches!(
                    e,
                    Error::NonFinite {
                        layer: 2,
                        quantity: Quantity::WeightNorm,
                        ..
                    }
                ),
                "p = {p}: {e}"
            );
        }
    }
    let errs = on_every_rank(3, |comm| {
        let opt = Lars::new(comm, LarsConfig::default(), &specs(&numels))?;
        let mut w = x.w.clone();
        w[2][0] = 1.0;
        opt.coefficients(comm, &w, &x.g, 0.1)
    });
    for e in errs {
        assert!(matches!(
            e,
            Error::NonFinite {
                layer: 3,
                quantity: Quantity::GradNorm,
                ..
            }
        ));
    }
}

#[test]
fn negative_hyper_parameter_on_one_rank_is_an_error_on_every_rank() {
    let numels = [10usize, 20];
    let errs = on_every_rank(3, |comm| {
        let c = LarsConfig {
            weight_decay: if comm.rank() == 1 { -1e-4 } else { 1e-4 },
            ..LarsConfig::default()
        };
        Lars::new(comm, c, &specs(&numels))
    });
    for e in errs {
        assert_eq!(
            e,
            Error::InvalidHyperParameter {
                param: Param::WeightDecay,
                value: -1e-4
            }
        );
    }
    let x = inputs(&numels, 2);
    let errs = on_every_rank(3, |comm| {
        let mut opt = Lamb::new(comm, LambConfig::default(), &specs(&numels))?;
        let mut w = x.w.clone();
        let lr = if comm.rank() == 0 { -0.1 } else { 0.1 };
        opt.step(comm, &mut w, &x.g, lr)
    });
    for e in errs {
        assert!(matches!(
            e,
            Error::InvalidHyperParameter {
                param: Param::LearningRate,
                ..
            }
        ));
    }
    for bad in [f64::NAN, 1.0, -0.1] {
        let c = LambConfig {
            beta2: bad,
            ..LambConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(Error::InvalidHyperParameter {
                param: Param::Beta2,
                ..
            })
        ));
    }
}

#[test]
fn layer_lists_or_step_scalars_that_differ_are_an_error_on_every_rank() {
    let errs = on_every_rank(4, |comm| {
        let mut numels = vec![10usize, 20, 30];
        if comm.rank() == 3 {
            numels[1] = 21;
        }
        Lars::new(comm, LarsConfig::default(), &specs(&numels))
    });
    for e in errs {
        assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    }
    // Same sizes, another name: a different layer list all the same.
    let errs = on_every_rank(2, |comm| {
        let mut layers = specs(&[10, 20]);
        if comm.rank() == 1 {
            layers[0].name = "other".into();
        }
        Lamb::new(comm, LambConfig::default(), &layers)
    });
    assert!(errs.iter().all(|e| matches!(e, Error::Mismatch { .. })));
    let numels = [10usize, 20, 30];
    let x = inputs(&numels, 5);
    let errs = on_every_rank(3, |comm| {
        let opt = Lars::new(comm, LarsConfig::default(), &specs(&numels))?;
        let lr = 0.1 + comm.rank() as f64 * 1e-3;
        opt.coefficients(comm, &x.w, &x.g, lr)
    });
    assert!(errs.iter().all(|e| matches!(e, Error::Mismatch { .. })));
}

#[test]
fn an_error_leaves_the_communicator_usable() {
    let numels = [10usize, 20, 30];
    let x = inputs(&numels, 5);
    let out = ThreadComm::run_with(3, cfg(), |comm| -> Result<Vec<[u64; 4]>> {
        let opt = Lars::new(&comm, LarsConfig::default(), &specs(&numels))?;
        let mut g = x.g.clone();
        g[0][0] = f32::NAN;
        assert!(opt.coefficients(&comm, &x.w, &g, 0.1).is_err());
        Ok(lars_bits(&opt.coefficients(&comm, &x.w, &x.g, 0.1)?))
    })
    .unwrap();
    assert!(out.iter().all(|o| o == &out[0]));
}
