//! Assignment of layers to ranks for the parallel tensor operator: contiguous ranges balanced by
//! element count, not by layer count (MSTopK/HiTopKComm (Shi et al., MLSys 2021) §4.2 splits by
//! layer; a layer's cost is proportional to its elements, so ResNet-50's 2.4M-element 3×3
//! convolutions and its 64-element batch-norm biases must not weigh the same).

use std::ops::Range;

/// Splits layers `0..numels.len()` into `parts` contiguous ranges, in rank order, whose
/// largest element count is as small as possible (the step time of the operator is the
/// slowest rank's). Ties are broken greedily from the front, so with more ranks than needed
/// the last ranks get empty ranges (they send empty parts). `parts == 0` gives no ranges.
///
/// Exact: a binary search over the bottleneck `B` (an integer between the largest layer and
/// the total), each probe a greedy pass that fills a range while it stays ≤ `B`.
pub fn balanced_ranges(numels: &[usize], parts: usize) -> Vec<Range<usize>> {
    let n = numels.len();
    if parts == 0 {
        return Vec::new();
    }
    let total: u128 = numels.iter().map(|&x| x as u128).sum();
    let largest: u128 = numels.iter().map(|&x| x as u128).max().unwrap_or(0);
    let (mut lo, mut hi) = (largest, total);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if greedy_parts(numels, mid) <= parts {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let bound = lo;
    let mut ranges = Vec::with_capacity(parts);
    let mut start = 0;
    while ranges.len() < parts {
        if ranges.len() + 1 == parts {
            // The last range takes whatever is left (nothing when the greedy pass is done).
            ranges.push(start..n);
            break;
        }
        let mut end = start;
        let mut sum: u128 = 0;
        while end < n && sum + numels[end] as u128 <= bound {
            sum += numels[end] as u128;
            end += 1;
        }
        ranges.push(start..end);
        start = end;
    }
    ranges
}

/// Number of ranges the greedy pass needs with bottleneck `bound` (≥ the largest layer).
fn greedy_parts(numels: &[usize], bound: u128) -> usize {
    let mut parts = 1;
    let mut sum: u128 = 0;
    for &x in numels {
        let x = x as u128;
        if sum + x > bound {
            parts += 1;
            sum = 0;
        }
        sum += x;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn load(numels: &[usize], r: &Range<usize>) -> usize {
        numels[r.clone()].iter().sum()
    }

    /// The optimal bottleneck by brute force over all cut positions (small inputs only).
    fn brute_bottleneck(numels: &[usize], parts: usize) -> usize {
        fn go(numels: &[usize], parts: usize) -> usize {
            if parts == 1 || numels.is_empty() {
                return numels.iter().sum();
            }
            (0..=numels.len())
                .map(|cut| {
                    let head: usize = numels[..cut].iter().sum();
                    head.max(go(&numels[cut..], parts - 1))
                })
                .min()
                .unwrap_or(0)
        }
        go(numels, parts)
    }

    #[test]
    fn balances_by_elements_not_layers() {
        // One big layer and many small ones: a split by layer count would give rank 0 the
        // big layer plus half the small ones.
        let numels = [1000, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10];
        let r = balanced_ranges(&numels, 2);
        assert_eq!(r, vec![0..1, 1..11]);
    }

    #[test]
    fn more_ranks_than_layers_and_one_rank() {
        let r = balanced_ranges(&[5, 6, 7], 5);
        assert_eq!(r, vec![0..1, 1..2, 2..3, 3..3, 3..3]);
        assert_eq!(balanced_ranges(&[5, 6, 7], 1), vec![0..3]);
        assert_eq!(balanced_ranges(&[], 3), vec![0..0, 0..0, 0..0]);
        assert!(balanced_ranges(&[1], 0).is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn ranges_tile_and_are_optimal(
            numels in proptest::collection::vec(0usize..1000, 0..9),
            parts in 1usize..6,
        ) {
            let r = balanced_ranges(&numels, parts);
            prop_assert_eq!(r.len(), parts);
            let mut next = 0;
            for range in &r {
                prop_assert_eq!(range.start, next);
                prop_assert!(range.end >= range.start);
                next = range.end;
            }
            prop_assert_eq!(next, numels.len());
            let worst = r.iter().map(|x| load(&numels, x)).max().unwrap_or(0);
            prop_assert_eq!(worst, brute_bottleneck(&numels, parts));
        }
    }
}
