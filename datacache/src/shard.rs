//! Which samples each rank owns. DataCache of Shi et al. (MLSys 2021), §4.1: "the full data set is
//! split into multiple parts that are separately stored on multiple nodes", so each rank caches
//! only its part. The plan is fixed across epochs (a rank always reads the same samples, so its
//! caches stay warm); only the order inside a shard changes per epoch (see [`crate::order`]).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How indices are dealt to ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ShardMode {
    /// Rank r gets one contiguous range; sizes differ by at most one. Best for file-based
    /// sources (neighbouring records share files).
    #[default]
    Contiguous,
    /// Rank r gets `r, r + P, r + 2P, …` (PyTorch `DistributedSampler` without padding).
    Strided,
}

/// The part of a data set of `len` samples that rank `rank` of `world` owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPlan {
    len: usize,
    world: usize,
    rank: usize,
    mode: ShardMode,
}

impl ShardPlan {
    /// Rejects `world == 0` and `rank >= world`. Ranks may own zero samples (`world > len`).
    pub fn new(len: usize, world: usize, rank: usize, mode: ShardMode) -> Result<Self> {
        if world == 0 {
            return Err(Error::Config("world size must be at least 1".into()));
        }
        if rank >= world {
            return Err(Error::Config(format!(
                "rank {rank} is not below world size {world}"
            )));
        }
        Ok(Self {
            len,
            world,
            rank,
            mode,
        })
    }

    /// The whole data set on one rank.
    pub fn single(len: usize) -> Self {
        Self {
            len,
            world: 1,
            rank: 0,
            mode: ShardMode::Contiguous,
        }
    }

    /// Data-set size.
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// This plan's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Dealing mode.
    pub fn mode(&self) -> ShardMode {
        self.mode
    }

    fn bound(&self, r: usize) -> usize {
        // floor(len·r / world) without overflow.
        ((self.len as u128 * r as u128) / self.world as u128) as usize
    }

    /// Number of samples this rank owns.
    pub fn shard_len(&self) -> usize {
        match self.mode {
            ShardMode::Contiguous => self.bound(self.rank + 1) - self.bound(self.rank),
            ShardMode::Strided => {
                if self.rank < self.len {
                    (self.len - self.rank).div_ceil(self.world)
                } else {
                    0
                }
            }
        }
    }

    /// The global sample indices this rank owns, increasing.
    pub fn indices(&self) -> Vec<usize> {
        match self.mode {
            ShardMode::Contiguous => (self.bound(self.rank)..self.bound(self.rank + 1)).collect(),
            ShardMode::Strided => (self.rank..self.len).step_by(self.world).collect(),
        }
    }

    /// The rank that owns sample `index`, or `None` when out of range.
    pub fn owner(&self, index: usize) -> Option<usize> {
        if index >= self.len {
            return None;
        }
        match self.mode {
            ShardMode::Strided => Some(index % self.world),
            ShardMode::Contiguous => {
                // Smallest r with bound(r + 1) > index; start from the proportional guess.
                let mut r = ((index as u128 * self.world as u128) / self.len as u128) as usize;
                while r > 0 && self.bound(r) > index {
                    r -= 1;
                }
                while self.bound(r + 1) <= index {
                    r += 1;
                }
                Some(r)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_bad_ranks() {
        assert!(ShardPlan::new(10, 0, 0, ShardMode::Contiguous).is_err());
        assert!(ShardPlan::new(10, 3, 3, ShardMode::Strided).is_err());
        assert!(ShardPlan::new(0, 3, 2, ShardMode::Strided).is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn shards_partition_the_data_set(len in 0usize..300, world in 1usize..12, strided in any::<bool>()) {
            let mode = if strided { ShardMode::Strided } else { ShardMode::Contiguous };
            let mut seen = vec![0u32; len];
            let mut sizes = Vec::new();
            for r in 0..world {
                let p = ShardPlan::new(len, world, r, mode).unwrap();
                let idx = p.indices();
                prop_assert_eq!(idx.len(), p.shard_len());
                for &i in &idx {
                    seen[i] += 1;
                    prop_assert_eq!(p.owner(i), Some(r));
                }
                sizes.push(idx.len());
            }
            prop_assert!(seen.iter().all(|&c| c == 1));
            let (mn, mx) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(mx - mn <= 1);
        }
    }
}
