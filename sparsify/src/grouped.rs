//! The small-tensor path of exact selection (and of MSTopK's candidates): a threshold that is never too high, found from
//! group maxima instead of a sample, and a second pass that costs little because the
//! tensor is still in cache.
//!
//! Partition the `d` elements into groups and take each group's largest magnitude. If at
//! least `k` groups have a maximum `≥ T`, then at least `k` elements are `≥ T`, so `T` is at
//! most the k-th magnitude: the candidates `|x| ≥ T` always hold the top `k`, and there is
//! no fallback. With `T` the k-th largest group maximum and groups of 16 elements, a group
//! past `T` usually holds one candidate, so the candidates are about `k` (a sampled
//! threshold, which must leave a safety margin, keeps 2–3× `k` on a small tensor).
//!
//! The groups are the 16 lanes of a span of 16 blocks ([`kernel::GROUP_SPAN`]), so the
//! accumulate pass keeps them with one vector `max` per block. The second pass filters only
//! the spans that hold a group past `T`, reading the accumulated vector from cache.

use crate::kernel::{self, Cand, PassOut, INF_BITS};

/// Largest input that takes this path: the accumulate pass, the group maxima and the
/// filter pass must fit in a core's cache (`r` and `g` are 2 × 128 KiB at 2^15 elements):
/// measured here, 2^15 gains 10–16 % over the sampled path and 2^16 loses 3–20 %.
pub(crate) const MAX_LEN: usize = 1 << 15;

/// Fewest groups per selected element: below four, `T` falls so low that the candidates
/// are many times `k` and the sampled path is cheaper.
const GROUPS_PER_K: usize = 4;

/// Whether a fused step over `d` elements with `k` selected takes this path.
///
/// No lower bound on `d`: below 2^12 there is neither a sample nor a warm start, and the
/// step used to filter from threshold 0, emitting every element and selecting among all of
/// them. This path instead, on the 2-core Zen 3 VM at ρ = 0.01 (`k` at least 1; median of
/// 5,000–20,000 fresh-gradient steps): exact top-k 1.21 → 0.35 µs at 2^7, 1.22–1.79 →
/// 0.39–0.45 µs at 2^8, 4.0–5.7 → 0.91 µs at 2^10, 6.8–10.9 → 1.38 µs at 2^11; MSTopK
/// 2.0 → 0.8 µs at 2^7 and 9.3–12.6 → 1.8 µs at 2^11.
pub(crate) fn applies(d: usize, k: usize) -> bool {
    d <= MAX_LEN && k > 0 && k.saturating_mul(GROUPS_PER_K) <= d / 16
}

/// Accumulates `r += g` and emits into `cand` (cleared first, in index order) every
/// accumulated entry with magnitude bits `≥ T`, where `T` is a threshold at most the k-th
/// magnitude (see the module docs); returns `T` and the pass flags (non-finite values are
/// always among the candidates, so the flags report the first one). Nothing is zeroed.
/// With `STATS` the flags also carry the `|x|` sum (in the order of a statistics pass) and
/// the largest magnitude. Requires [`applies`]`(r.len(), k)` and `r.len() == g.len()`.
pub(crate) fn fused<const STATS: bool>(
    r: &mut [f32],
    g: &[f32],
    k: usize,
    maxes: &mut Vec<i32>,
    cand: &mut Cand,
) -> (i32, PassOut) {
    let d = r.len();
    maxes.clear();
    maxes.resize(d.div_ceil(kernel::GROUP_SPAN) * 16, -1);
    let (top, abs_sum) = kernel::add_max_one::<STATS>(r, g, maxes);
    let t = kth_group_max(maxes, top, k);
    cand.clear();
    let mut out: Option<PassOut> = None;
    // Runs of consecutive spans with a group at or past `t`, each filtered in one call.
    let spans = maxes.chunks_exact(16).map(|m| m.iter().any(|&v| v >= t));
    let mut run: Option<usize> = None;
    for (s, hit) in spans.chain(std::iter::once(false)).enumerate() {
        match (hit, run) {
            (true, None) => run = Some(s),
            (false, Some(first)) => {
                let lo = first * kernel::GROUP_SPAN;
                let hi = (s * kernel::GROUP_SPAN).min(d);
                let o = kernel::scan_one::<false>(&r[lo..hi], lo, t, usize::MAX, cand);
                match &mut out {
                    Some(acc) => acc.merge(&o),
                    None => out = Some(o),
                }
                run = None;
            }
            _ => {}
        }
    }
    let mut out = out.unwrap_or_else(PassOut::new);
    if STATS {
        out.abs_sum = abs_sum;
        out.max_bits = top;
    }
    (t, out)
}

/// The largest `T ≤ INF_BITS` with at least `k` group maxima at or above it, or a slightly
/// smaller one (`top` is the largest maximum): the search stops as soon as the count lies within `k + k/8` (a few more
/// candidates cost less than more counting passes). Requires at least `k` non-empty groups.
///
/// A bisection on the magnitude bits, bracketed first within three binary orders of
/// magnitude of the largest maximum (where the k-th of a gradient's group maxima lies unless
/// `k` is most of the groups), which saves the passes a bisection from zero spends on tiny
/// exponents.
fn kth_group_max(maxes: &[i32], top: i32, k: usize) -> i32 {
    if top >= INF_BITS && kernel::count_ge(maxes, INF_BITS) >= k {
        return INF_BITS;
    }
    // Invariant: count(lo) ≥ k > count(hi).
    let mut hi = top.min(INF_BITS - 1) + 1;
    let mut lo = (hi - (3 << 23)).max(0);
    if lo > 0 && kernel::count_ge(maxes, lo) < k {
        (hi, lo) = (lo, 0);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let c = kernel::count_ge(maxes, mid);
        if c >= k {
            lo = mid;
            if c <= k + k / 8 {
                break;
            }
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The brute-force group maxima of `x` in the layout of [`kernel::GROUP_SPAN`].
    fn group_maxes(x: &[f32]) -> Vec<i32> {
        let mut m = vec![-1; x.len().div_ceil(kernel::GROUP_SPAN) * 16];
        for (i, v) in x.iter().enumerate() {
            let at = i / kernel::GROUP_SPAN * 16 + i % 16;
            m[at] = m[at].max(kernel::abs_bits(*v));
        }
        m
    }

    #[test]
    fn maxima_and_threshold_bound_the_kth_magnitude() {
        let small = [(64, 5), (200, 6), (1000, 7), (2048 + 3, 8)];
        for (d, seed) in [(4096, 1), (5000, 2), (MAX_LEN, 3), (4096 + 17, 4)]
            .into_iter()
            .chain(small)
        {
            let g = crate::exact::tests::gen_vec(seed, d, 0);
            let r0 = crate::exact::tests::gen_vec(seed + 9, d, 1);
            let mut r = r0.clone();
            let mut maxes = vec![-1; d.div_ceil(kernel::GROUP_SPAN) * 16];
            let (top, sum) = kernel::add_max_one::<true>(&mut r, &g, &mut maxes);
            let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
            assert_eq!(r, acc);
            assert_eq!(maxes, group_maxes(&acc));
            assert_eq!(Some(&top), maxes.iter().max());
            assert_eq!(sum.to_bits(), kernel::abs_sum(&acc).to_bits());
            let mut mags: Vec<i32> = acc.iter().map(|v| kernel::abs_bits(*v)).collect();
            mags.sort_unstable_by(|a, b| b.cmp(a));
            let mut tried = 0;
            for k in [1, 3, d / 256, d / 64] {
                if !applies(d, k) {
                    continue;
                }
                tried += 1;
                let t = kth_group_max(&maxes, top, k);
                assert!(t <= mags[k - 1], "d {d} k {k}: T above the k-th magnitude");
                let cands = mags.iter().filter(|&&m| m >= t).count();
                assert!(cands >= k && cands <= 3 * k + 16, "d {d} k {k}: {cands}");
            }
            assert!(tried >= 2, "d {d}: the path must be exercised");
        }
    }

    /// The exact selector on this path: the reference's indices and conserved mass for every
    /// kind of input (ties, a ramp, mostly zeros), and the first non-finite value reported.
    #[test]
    fn exact_selection_on_this_path_matches_the_reference() {
        use crate::exact::{reference_topk, tests::gen_vec};
        use crate::{Error, ExactTopK, Selector};
        let mut taken = 0;
        for kind in 0..4u8 {
            for d in [64, 300, 2048, 4096, 7777, MAX_LEN] {
                for k in [1, 5, d / 100, d / 70] {
                    let g = gen_vec(u64::from(kind) + d as u64, d, kind);
                    let r0 = gen_vec(3, d, 0);
                    let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
                    let mut r = r0.clone();
                    taken += usize::from(applies(d, k));
                    let (sg, _) = ExactTopK::new().select_fused(&mut r, &g, k).unwrap();
                    assert_eq!(sg.indices(), &reference_topk(&acc, k)[..], "{kind} {d} {k}");
                    sg.scatter_add_into(&mut r).unwrap();
                    assert!(r.iter().zip(&acc).all(|(a, b)| a.to_bits() == b.to_bits()));
                }
            }
        }
        // 48 of them at 4096 and above: the small sizes must take the path too.
        assert!(taken >= 80, "only {taken} cases took the path");
        let mut g = gen_vec(5, 8192, 0);
        g[700] = f32::NAN;
        g[5000] = f32::INFINITY;
        let mut r = vec![0.5; 8192];
        assert!(applies(8192, 40));
        let err = ExactTopK::new().select_fused(&mut r, &g, 40);
        assert!(matches!(err, Err(Error::NonFinite { index: 700, .. })));
        assert!(r[1].to_bits() == (0.5 + g[1]).to_bits() && r[700].is_nan());
    }

    /// MSTopK from this path's candidates (and its `|x|` sum, which sets every round's
    /// threshold) selects exactly what the literal Algorithm 1 selects.
    #[test]
    fn mstopk_on_this_path_matches_algorithm_1() {
        use crate::exact::tests::gen_vec;
        use crate::mstopk::reference_mstopk;
        use crate::{MsTopK, Selector};
        use rand::SeedableRng;
        let mut taken = 0;
        for kind in 0..4u8 {
            for d in [256, 1000, 2048 + 17, 4096, 4096 + 17, 9000, MAX_LEN] {
                for k in [d / 250, d / 200, d / 100, d / 70] {
                    let g = gen_vec(u64::from(kind) * 31 + d as u64, d, kind);
                    let r0 = gen_vec(8, d, 0);
                    let acc: Vec<f32> = r0.iter().zip(&g).map(|(a, b)| a + b).collect();
                    let mut r = r0.clone();
                    taken += usize::from(applies(d, k + 1) && k >= d / 256);
                    let (sg, _) = MsTopK::with_seed(9).select_fused(&mut r, &g, k).unwrap();
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
                    let want = reference_mstopk(&acc, k, crate::mstopk::DEFAULT_ROUNDS, &mut rng);
                    assert_eq!(sg.indices(), &want[..], "kind {kind} d {d} k {k}");
                    sg.scatter_add_into(&mut r).unwrap();
                    assert!(r.iter().zip(&acc).all(|(a, b)| a.to_bits() == b.to_bits()));
                }
            }
        }
        // 64 of them at 4096 and above: the small sizes must take the path too.
        assert!(taken >= 112, "only {taken} cases took the path");
    }
}
