//! The inputs and the f64 reference of the dense correctness tests, shared by the
//! ThreadComm and the MPI runs so both check the same sums.

/// Deterministic input of rank r: values in [-1, 1) from a tiny LCG.
pub fn input(seed: u64, r: usize, n: usize) -> Vec<f32> {
    let mut s = seed ^ (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// f64 reference sum of every rank's input and the sum of magnitudes (for the rounding
/// bound).
pub fn reference(seed: u64, p: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut sum = vec![0f64; n];
    let mut mag = vec![0f64; n];
    for r in 0..p {
        for (i, x) in input(seed, r, n).into_iter().enumerate() {
            sum[i] += x as f64;
            mag[i] += x.abs() as f64;
        }
    }
    (sum, mag)
}
