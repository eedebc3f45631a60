//! The order in which a rank visits its shard: a permutation that depends only on
//! `(seed, epoch)`, so every run, every machine and every resume sees the same order.
//!
//! The permutation is a Fisher–Yates shuffle driven by ChaCha8 (a specified stream cipher,
//! so the order does not change with library versions); a test pins one order.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// SplitMix64 finaliser: spreads (seed, epoch) over the whole 64-bit seed space.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The RNG seed for one epoch.
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    mix(mix(seed) ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// A permutation of `0..n` for `(seed, epoch)`.
pub fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(epoch_seed(seed, epoch));
    for i in (1..n).rev() {
        // Lemire's multiply-shift maps a u64 onto 0..=i; the bias (< i / 2^64) is immaterial.
        let j = ((u128::from(rng.next_u64()) * (i as u128 + 1)) >> 64) as usize;
        p.swap(i, j);
    }
    p
}

/// Applies [`permutation`] to `items` (a shard's indices) when `shuffle`, else copies them.
pub fn epoch_order(items: &[usize], seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    if !shuffle {
        return items.to_vec();
    }
    permutation(items.len(), seed, epoch)
        .into_iter()
        .map(|i| items[i])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_permutation_and_reproducible() {
        for n in [0, 1, 2, 17, 100] {
            let p = permutation(n, 42, 3);
            let mut s = p.clone();
            s.sort_unstable();
            assert_eq!(s, (0..n).collect::<Vec<_>>());
            assert_eq!(p, permutation(n, 42, 3));
        }
        assert_ne!(permutation(50, 42, 3), permutation(50, 42, 4));
        assert_ne!(permutation(50, 42, 3), permutation(50, 43, 3));
    }

    #[test]
    fn order_is_pinned() {
        // If this changes, every saved LoaderState resumes into a different order.
        assert_eq!(permutation(10, 7, 0), PINNED.to_vec());
    }

    const PINNED: [usize; 10] = [6, 2, 3, 1, 9, 0, 5, 8, 4, 7];
}
