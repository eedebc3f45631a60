//! Sums of squares with f64 accumulation, in a fixed order so the result depends only on
//! the input bytes (the operator's bit-identity rests on that). Eight independent lanes
//! let the compiler vectorise and keep the rounding error of f32 inputs far below the
//! 1e-6 relative the optimizers promise.

const LANES: usize = 8;

/// `Σ x²` accumulated in f64.
pub fn sum_sq(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            let v = f64::from(c[i]);
            acc[i] += v * v;
        }
    }
    let mut t = 0.0f64;
    for &v in tail {
        let v = f64::from(v);
        t += v * v;
    }
    reduce(acc) + t
}

/// `(Σ a², Σ b²)` in one pass over two slices of equal length (the shorter one bounds it).
pub fn sum_sq2(a: &[f32], b: &[f32]) -> (f64, f64) {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut sa = [0.0f64; LANES];
    let mut sb = [0.0f64; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            let u = f64::from(x[i]);
            let v = f64::from(y[i]);
            sa[i] += u * u;
            sb[i] += v * v;
        }
    }
    let (mut ra, mut rb) = (0.0f64, 0.0f64);
    for (&u, &v) in ta.iter().zip(tb) {
        let (u, v) = (f64::from(u), f64::from(v));
        ra += u * u;
        rb += v * v;
    }
    (reduce(sa) + ra, reduce(sb) + rb)
}

/// Pairwise sum of the lanes, in a fixed order.
pub(crate) fn reduce(acc: [f64; LANES]) -> f64 {
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_plain_sum() {
        let x: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin()).collect();
        let y: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
        let plain = |v: &[f32]| v.iter().map(|&a| f64::from(a) * f64::from(a)).sum::<f64>();
        let rel = |a: f64, b: f64| ((a - b) / b).abs();
        assert!(rel(sum_sq(&x), plain(&x)) < 1e-12);
        let (a, b) = sum_sq2(&x, &y);
        assert!(rel(a, plain(&x)) < 1e-12 && rel(b, plain(&y)) < 1e-12);
        assert_eq!(a.to_bits(), sum_sq(&x).to_bits());
        assert_eq!(sum_sq(&[]), 0.0);
    }
}
