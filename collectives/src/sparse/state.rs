//! Checkpoint state of the sparse allreduces: everything one rank carries from a step to
//! the next, so a run stopped after step `t` and restored continues bit-identically.
//!
//! - every algorithm: the rank's residual (gradient mass not sent yet);
//! - ExDyna (Yoon & Oh, CCGrid 2024): the step `t` (it picks each rank's partition,
//!   Algorithm 3 line 29), the threshold of Algorithm 5, the partitions of Algorithm 3
//!   (blocks and first block of each) and last step's per-worker counts;
//! - SparDL (Zhao et al.): B-SAG's `h`, its step and same-direction flag, and `N_t`
//!   (Algorithm 2); the R-SAG and plain variants have none beyond the residual.
//!
//! The algorithms reach this module through [`stateful!`] in their `SparseAllreduce` impl;
//! the others keep the trait's default (no export), so a checkpoint of them is refused
//! instead of resumed without their state.

use super::exdyna::ExDyna;
use super::spardl::SparDl;
use super::SparseAllreduce;
use crate::{Error, Result};

/// What a sparse allreduce carries between steps on one rank (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct AlgoState {
    /// The exporting algorithm's [`SparseAllreduce::name`]; importing into another is an
    /// error.
    pub algo: String,
    /// The residual, length `d`.
    pub residual: Vec<f32>,
    /// The algorithm's other state as words (floats as their bit patterns).
    pub words: Vec<u64>,
}

const MAGIC: &[u8; 4] = b"SAS1";

impl AlgoState {
    /// The byte form: magic, name, residual, words (little-endian, lengths in front).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + self.algo.len() + 4 * self.residual.len());
        out.extend_from_slice(MAGIC);
        for (len, bytes) in [
            (self.algo.len(), self.algo.as_bytes().to_vec()),
            (
                self.residual.len(),
                bytemuck::cast_slice(&self.residual).to_vec(),
            ),
            (self.words.len(), bytemuck::cast_slice(&self.words).to_vec()),
        ] {
            out.extend_from_slice(&(len as u64).to_le_bytes());
            out.extend_from_slice(&bytes);
        }
        out
    }

    /// Parses [`Self::encode`]'s output. Any other bytes are
    /// [`Error::InvalidArgument`]; a length field is checked against the bytes left before
    /// anything is allocated.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = |why: &str| Error::InvalidArgument(format!("sparse allreduce state: {why}"));
        let rest = bytes
            .strip_prefix(MAGIC)
            .ok_or_else(|| bad("wrong magic"))?;
        let mut rest = rest;
        let mut field = |width: usize| -> Result<&[u8]> {
            let (len, tail) = rest
                .split_first_chunk::<8>()
                .ok_or_else(|| bad("truncated length"))?;
            let n = usize::try_from(u64::from_le_bytes(*len))
                .ok()
                .and_then(|n| n.checked_mul(width))
                .filter(|&n| n <= tail.len())
                .ok_or_else(|| bad("length past the end"))?;
            let (body, tail) = tail.split_at(n);
            rest = tail;
            Ok(body)
        };
        let algo = String::from_utf8(field(1)?.to_vec()).map_err(|_| bad("name not UTF-8"))?;
        let residual = bytemuck::pod_collect_to_vec(field(4)?);
        let words = bytemuck::pod_collect_to_vec(field(8)?);
        if !rest.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(AlgoState {
            algo,
            residual,
            words,
        })
    }

    /// The checks every import makes: the same algorithm, a finite residual of length
    /// `d`, and `words` words.
    fn check(&self, alg: &dyn SparseAllreduce, words: usize) -> Result<()> {
        if self.algo != alg.name() {
            return Err(Error::InvalidArgument(format!(
                "a {} state cannot restore {}",
                self.algo,
                alg.name()
            )));
        }
        sparsify::feedback::check_residual(&self.residual, alg.len())?;
        if self.words.len() != words {
            return Err(Error::InvalidArgument(format!(
                "{} state has {} words, expected {words}",
                self.algo,
                self.words.len()
            )));
        }
        Ok(())
    }
}

/// The export and import of one algorithm; [`stateful!`] forwards the trait's methods here.
pub(super) trait Stateful {
    fn export(&self) -> AlgoState;
    fn import(&mut self, state: &AlgoState) -> Result<()>;
}

/// The `SparseAllreduce::{export_state, import_state}` of an algorithm with a
/// [`Stateful`] impl.
macro_rules! stateful {
    () => {
        fn export_state(&self) -> Option<$crate::sparse::AlgoState> {
            Some($crate::sparse::state::Stateful::export(self))
        }
        fn import_state(&mut self, state: &$crate::sparse::AlgoState) -> $crate::Result<()> {
            $crate::sparse::state::Stateful::import(self, state)
        }
    };
}
pub(crate) use stateful;

fn f32_word(w: u64, what: &str) -> Result<f32> {
    let v = u32::try_from(w)
        .map(f32::from_bits)
        .map_err(|_| Error::InvalidArgument(format!("{what}: {w:#x} is not an f32")))?;
    finite(f64::from(v), what).map(|_| v)
}

fn finite(v: f64, what: &str) -> Result<f64> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} {v} is not finite and ≥ 0"
        )))
    }
}

fn words_usize(w: &[u64]) -> Result<Vec<usize>> {
    w.iter()
        .map(|&x| {
            usize::try_from(x)
                .map_err(|_| Error::InvalidArgument(format!("count {x} overflows usize")))
        })
        .collect()
}

impl Stateful for ExDyna {
    /// Words: `t`, threshold, then P partition sizes, P first blocks and P counts.
    fn export(&self) -> AlgoState {
        let mut words = vec![self.t, u64::from(self.threshold.to_bits())];
        for v in [&self.blk_part, &self.blk_pos, &self.kt] {
            words.extend(v.iter().map(|&x| x as u64));
        }
        AlgoState {
            algo: self.name().into(),
            residual: self.resid.clone(),
            words,
        }
    }

    fn import(&mut self, state: &AlgoState) -> Result<()> {
        let p = self.blk_part.len();
        state.check(self, 2 + 3 * p)?;
        let w = &state.words;
        let threshold = f32_word(w[1], "ExDyna threshold")?;
        let part = words_usize(&w[2..2 + p])?;
        let pos = words_usize(&w[2 + p..2 + 2 * p])?;
        let kt = words_usize(&w[2 + 2 * p..])?;
        // Algorithm 3 moves blocks between neighbours: the block count is kept, every
        // partition stays non-empty and starts where the previous one ends.
        let blocks: usize = self.blk_part.iter().sum();
        let contiguous = (1..p).all(|i| pos[i] == pos[i - 1].saturating_add(part[i - 1]));
        if part.contains(&0)
            || part.iter().try_fold(0usize, |a, &b| a.checked_add(b)) != Some(blocks)
            || pos.first() != Some(&0)
            || !contiguous
            || kt.iter().any(|&k| k > self.resid.len())
        {
            return Err(Error::InvalidArgument(format!(
                "ExDyna state: partitions {part:?} at {pos:?} (counts {kt:?}) do not tile \
                 the {blocks} blocks"
            )));
        }
        self.resid.copy_from_slice(&state.residual);
        self.t = w[0];
        self.threshold = threshold;
        self.blk_part = part;
        self.blk_pos = pos;
        self.kt = kt;
        Ok(())
    }
}

impl Stateful for SparDl {
    /// Words: B-SAG's `h`, its step (`f64` bits), the flag and `N_t`.
    fn export(&self) -> AlgoState {
        AlgoState {
            algo: self.name().into(),
            residual: self.resid.clone(),
            words: vec![
                self.h.to_bits(),
                self.h_step.to_bits(),
                u64::from(self.h_flag),
                self.last_n as u64,
            ],
        }
    }

    fn import(&mut self, state: &AlgoState) -> Result<()> {
        state.check(self, 4)?;
        let w = &state.words;
        let h = finite(f64::from_bits(w[0]), "SparDL B-SAG h")?;
        let h_step = f64::from_bits(w[1]);
        if !h_step.is_finite() || w[2] > 1 {
            return Err(Error::InvalidArgument(format!(
                "SparDL state: h step {h_step}, flag {}",
                w[2]
            )));
        }
        self.resid.copy_from_slice(&state.residual);
        self.h = h;
        self.h_step = h_step;
        self.h_flag = w[2] == 1;
        self.last_n = words_usize(&w[3..])?[0];
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::{build, Sag, SparseAlgo};
    use crate::ThreadComm;

    fn grad(rank: usize, step: usize, d: usize) -> Vec<f32> {
        (0..d)
            .map(|i| (((i * 37 + rank * 11 + step * 5) % 23) as f32 - 11.0) * 0.1)
            .collect()
    }

    /// Steps 0..n on P ranks, the state exported after step `cut` and imported into a
    /// freshly built algorithm that runs the rest: every update equals the uninterrupted
    /// run's bit for bit.
    #[test]
    fn a_restored_algorithm_continues_bit_identically() {
        let (p, d, n, cut) = (4, 5000, 6, 3);
        for algo in [
            SparseAlgo::ExDyna { warm_start: false },
            SparseAlgo::ALL[4],
            SparseAlgo::SparDl {
                sag: Sag::Bruck,
                teams: Some(2),
                selector: None,
            },
        ] {
            // Every update's bits, uninterrupted and restored.
            let out = ThreadComm::run(p, |comm| -> Result<(Vec<u32>, Vec<u32>)> {
                let r = crate::Communicator::rank(&comm);
                let mut whole = build(algo, &comm, d, 0.01)?;
                let mut a = Vec::new();
                for s in 0..n {
                    a.push(whole.step(&comm, &grad(r, s, d))?.0.to_dense());
                }
                let mut first = build(algo, &comm, d, 0.01)?;
                let mut b = Vec::new();
                for s in 0..cut {
                    b.push(first.step(&comm, &grad(r, s, d))?.0.to_dense());
                }
                let saved = first.export_state().expect("exports").encode();
                let mut second = build(algo, &comm, d, 0.01)?;
                second.import_state(&AlgoState::decode(&saved)?)?;
                for s in cut..n {
                    b.push(second.step(&comm, &grad(r, s, d))?.0.to_dense());
                }
                let bits = |v: Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect();
                Ok((bits(a), bits(b)))
            })
            .unwrap();
            for (a, b) in out {
                assert!(a[(n - 1) * d..].iter().any(|&v| v != 0), "{algo}: vacuous");
                assert_eq!(a, b, "{algo}");
            }
        }
    }

    #[test]
    fn a_wrong_or_corrupt_state_is_refused() {
        ThreadComm::run(2, |comm| -> Result<()> {
            let mut ex = build(SparseAlgo::ExDyna { warm_start: false }, &comm, 4096, 0.01)?;
            let mut sp = build(SparseAlgo::ALL[4], &comm, 4096, 0.01)?;
            ex.step(&comm, &grad(0, 0, 4096))?;
            let good = ex.export_state().expect("exports");
            // Another algorithm, another length, a broken partition, a NaN.
            assert!(sp.import_state(&good).is_err());
            let mut short = good.clone();
            short.residual.pop();
            assert!(ex.import_state(&short).is_err());
            let mut tiles = good.clone();
            tiles.words[2] += 1;
            assert!(ex.import_state(&tiles).is_err());
            let mut nan = good.clone();
            nan.residual[7] = f32::NAN;
            assert!(ex.import_state(&nan).is_err());
            ex.import_state(&good)?;
            // Every prefix of the bytes and a flipped magic are errors, never a panic.
            let bytes = good.encode();
            for cut in 0..bytes.len() {
                assert!(AlgoState::decode(&bytes[..cut]).is_err(), "{cut}");
            }
            assert_eq!(AlgoState::decode(&bytes)?, good);
            // An algorithm without export refuses to import.
            let mut topka = build(SparseAlgo::ALL[0], &comm, 4096, 0.01)?;
            assert!(topka.export_state().is_none());
            assert!(topka.import_state(&good).is_err());
            Ok(())
        })
        .unwrap();
    }
}
