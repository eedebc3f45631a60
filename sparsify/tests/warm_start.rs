//! The warm start of the exact-count selectors gives the same selection and residual as a
//! cold start, bit for bit, through steady steps, jumps of scale that make it miss, and
//! alternating unrelated tensors of one shape.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use sparsify::exact::reference_topk;
use sparsify::{ErrorFeedback, ExactTopK, MsTopK, Selector};

/// The gradient of step `t`: Gaussian, of scale 1 except a jump to 64× at step 6 (far more
/// candidates than the cap above the last threshold) and a drop to 1/64 at step 8, where
/// the residual is reset too (fewer than `k` above it); from step 10 on it alternates
/// between two unrelated tensors (one heavy-tailed), so a start from the previous step is
/// far off.
fn grad(d: usize, t: usize) -> Vec<f32> {
    let scale = match t {
        6 => 64.0,
        8 => 1.0 / 64.0,
        _ => 1.0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(t as u64 * 1_000_003 + d as u64);
    let n = Normal::new(0.0f32, 1.0).unwrap();
    (0..d)
        .map(|i| {
            let x = n.sample(&mut rng) * scale;
            if t >= 10 && t % 2 == 1 && i % 7 == 0 {
                x * 50.0
            } else {
                x
            }
        })
        .collect()
}

/// Runs `steps` error-feedback steps with a warm and a cold selector made by `make`, and
/// checks that they agree; returns the warm selector's (warm calls, misses).
fn warm_equals_cold(
    make: &dyn Fn() -> Box<dyn Selector>,
    cold: Box<dyn Selector>,
    d: usize,
    k: usize,
    check_exact: bool,
) -> (u64, u64) {
    let (mut warm, mut cold) = (make(), cold);
    let (mut ef_w, mut ef_c) = (ErrorFeedback::new(d), ErrorFeedback::new(d));
    for t in 0..16 {
        let g = grad(d, t);
        if t == 8 {
            ef_w.reset();
            ef_c.reset();
        }
        let acc: Vec<f32> = ef_c.residual().iter().zip(&g).map(|(a, b)| a + b).collect();
        let (sw, iw) = ef_w.step(warm.as_mut(), &g, k).unwrap();
        let (sc, ic) = ef_c.step(cold.as_mut(), &g, k).unwrap();
        assert_eq!(sw, sc, "d {d} k {k} step {t}");
        assert_eq!(iw, ic, "d {d} k {k} step {t}");
        assert!(
            ef_w.residual()
                .iter()
                .zip(ef_c.residual())
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "residual d {d} k {k} step {t}"
        );
        if check_exact {
            assert_eq!(
                sw.indices(),
                &reference_topk(&acc, k)[..],
                "d {d} k {k} step {t}"
            );
        }
        warm.recycle(sw);
    }
    assert_eq!(cold.warm_starts(), Some((0, 0)), "turned off, never warm");
    warm.warm_starts().unwrap()
}

#[test]
fn exact_and_mstopk_warm_start_selects_as_cold() {
    // Just above the smallest that starts warm, on the small-tensor path, sampled in
    // serial, split over the pool, and split with a zeroing pass (k ≥ 2^15).
    let shapes = [
        (5_000, 50),
        (1 << 14, 16),
        (1 << 14, 164),
        (100_000, 1_000),
        ((1 << 20) + 17, 1_048),
        ((1 << 20) + 17, 52_429),
    ];
    let (mut warm_calls, mut misses) = (0, 0);
    for &(d, k) in &shapes {
        let exact = warm_equals_cold(
            &|| Box::new(ExactTopK::new()),
            Box::new(ExactTopK::new().with_warm_start(false)),
            d,
            k,
            true,
        );
        let ms = warm_equals_cold(
            &|| Box::new(MsTopK::with_seed(3)),
            Box::new(MsTopK::with_seed(3).with_warm_start(false)),
            d,
            k,
            false,
        );
        for (w, m) in [exact, ms] {
            // Steps 1–6 start warm; after the fall at 8 the drift keeps some cold, and
            // two misses in a row back off.
            assert!(w >= 6, "d {d} k {k}: only {w} warm calls");
            // The jump at 6 and the drop at 8 miss; most warm calls hit.
            assert!(m >= 2 && m <= w / 2, "d {d} k {k}: {m} misses of {w}");
            warm_calls += w;
            misses += m;
        }
    }
    assert!(warm_calls > misses);
}

#[test]
fn another_shape_starts_cold() {
    let mut sel = ExactTopK::new();
    let mut ef = ErrorFeedback::new(50_000);
    ef.step(&mut sel, &grad(50_000, 0), 500).unwrap();
    ef.step(&mut sel, &grad(50_000, 1), 500).unwrap();
    assert_eq!(sel.warm_starts(), Some((1, 0)));
    ef.step(&mut sel, &grad(50_000, 2), 400).unwrap();
    assert_eq!(
        sel.warm_starts(),
        Some((1, 0)),
        "another k is another tensor"
    );
    let mut other = ErrorFeedback::new(60_000);
    other.step(&mut sel, &grad(60_000, 3), 400).unwrap();
    assert_eq!(sel.warm_starts(), Some((1, 0)), "another d too");
}
