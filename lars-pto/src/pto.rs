//! The parallel tensor operator (PTO) of MSTopK/HiTopKComm (Shi et al., MLSys 2021) §4.2,
//! Eq. 12-14.
//!
//! After gradient aggregation every rank holds the same gradients and weights, so a
//! per-layer operation `r = OP(g)` (Eq. 12) whose inputs are identical everywhere can be
//! split: rank `p` computes `r[p] = OP(g[p])` for its own layers only (Eq. 13) and one
//! all-gather of the small results gives every rank all of `r` (Eq. 14). Here layers are
//! assigned in contiguous ranges balanced by element count ([`balanced_ranges`]).
//!
//! Every part sent carries a fixed-size trailer: a fingerprint of what must agree across
//! ranks (the layer list and hyper-parameters, fixed when the operator is built, plus a
//! per-call salt such as the learning rate) and a [`Status`]. A rank whose inputs are bad,
//! or whose layers give a non-finite norm, still sends its part, marked failed; so every rank
//! returns the same typed error and none waits for a part that never comes.
//!
//! The result is bit-identical on every rank and bit-identical to computing every layer
//! locally: each layer's output is computed by the same function from the same bytes, and
//! the all-gather only moves bytes.

use std::ops::Range;

use bytemuck::{Pod, Zeroable};
use collectives::dense::{allgatherv_known, AllgatherAlgo};
use collectives::{Communicator, Tag};

use crate::error::Status;
use crate::fingerprint::Fingerprint;
use crate::gather::allgatherv_bytes;
use crate::partition::balanced_ranges;
use crate::{Error, Result};

/// Default message tag of [`Exchange::Direct`].
pub const DEFAULT_TAG: Tag = 0x4C50;

/// How the parts are all-gathered (MSTopK/HiTopKComm (Shi et al., MLSys 2021) Eq. 14). Must be the
/// same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exchange {
    /// `collectives`' variable-count all-gather with known counts (no count exchange).
    /// The default uses Bruck: ⌈log2 P⌉ rounds, the right shape for parts of a few hundred
    /// bytes where latency dominates.
    Allgatherv(AllgatherAlgo),
    /// One round: every rank sends its part to every other rank, then receives theirs
    /// (P − 1 messages each, on the given user tag).
    Direct(Tag),
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange::Allgatherv(AllgatherAlgo::Bruck)
    }
}

impl Exchange {
    fn gather<C: Communicator + ?Sized>(
        self,
        comm: &C,
        mine: &[u8],
        lens: &[usize],
    ) -> Result<Vec<u8>> {
        match self {
            Exchange::Direct(tag) => allgatherv_bytes(comm, tag, mine, lens),
            Exchange::Allgatherv(algo) => Ok(allgatherv_known(comm, mine, lens, algo)?.data),
        }
    }
}

/// How the per-layer work is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Each rank computes its range of layers, then all-gather (MSTopK/HiTopKComm
    /// (Shi et al., MLSys 2021) Eq. 13-14).
    #[default]
    Parallel,
    /// Every rank computes every layer and nothing is exchanged: the traditional scheme the
    /// paper compares against. Input errors are then only reported on the ranks that have
    /// them (the inputs of the other ranks are not seen).
    Local,
}

/// What follows every part on the wire.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct Trailer {
    fingerprint: u64,
    status: Status,
}

const TRAILER: usize = std::mem::size_of::<Trailer>();

/// The parallel tensor operator over a fixed list of layers. Build it once (a collective
/// call that checks every rank has the same layer list) and call [`map`](Self::map) each
/// step.
#[derive(Debug, Clone)]
pub struct Pto {
    rank: usize,
    size: usize,
    numels: Vec<usize>,
    ranges: Vec<Range<usize>>,
    fingerprint: u64,
    exchange: Exchange,
    mode: Mode,
}

impl Pto {
    /// Builds the operator for layers of `numels` elements. Collective: every rank must call
    /// it; ranks whose `numels` or `salt` (a fingerprint of anything else that must agree,
    /// such as hyper-parameters) differ get [`Error::Mismatch`] on every rank.
    pub fn new<C: Communicator + ?Sized>(comm: &C, numels: &[usize], salt: u64) -> Result<Pto> {
        Self::with_check(comm, numels, salt, Ok(()))
    }

    /// [`new`](Self::new) with a local validation result that is shared with every rank, so
    /// that a bad hyper-parameter on one rank is an error on all. The agreement uses the
    /// default [`Exchange`].
    pub fn with_check<C: Communicator + ?Sized>(
        comm: &C,
        numels: &[usize],
        salt: u64,
        check: Result<()>,
    ) -> Result<Pto> {
        let mut fp = Fingerprint::new().u64(numels.len() as u64);
        for &n in numels {
            fp = fp.u64(n as u64);
        }
        let fingerprint = fp.u64(salt).finish();
        let size = comm.size();
        let pto = Pto {
            rank: comm.rank(),
            size,
            numels: numels.to_vec(),
            ranges: balanced_ranges(numels, size),
            fingerprint,
            exchange: Exchange::default(),
            mode: Mode::Parallel,
        };
        // Agree: trailers only, one fixed-size part per rank.
        let mine = Trailer {
            fingerprint,
            status: Status::of(&check),
        };
        let all = pto
            .exchange
            .gather(comm, bytemuck::bytes_of(&mine), &vec![TRAILER; size])?;
        let trailers: Vec<Trailer> = (0..size)
            .map(|r| bytemuck::pod_read_unaligned(&all[r * TRAILER..(r + 1) * TRAILER]))
            .collect();
        resolve(pto.rank, &trailers, check, "layer list or hyper-parameters")?;
        Ok(pto)
    }

    /// Sets how parts are all-gathered; must be the same on every rank. A
    /// [`Exchange::Direct`] tag must be a user tag (`0..=MAX_USER_TAG`).
    pub fn set_exchange(&mut self, exchange: Exchange) -> Result<()> {
        if let Exchange::Direct(tag) = exchange {
            collectives::comm::check_tag(tag)?;
        }
        self.exchange = exchange;
        Ok(())
    }

    /// How parts are all-gathered.
    pub fn exchange(&self) -> Exchange {
        self.exchange
    }

    /// Sets how the work is done; must be the same on every rank.
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// How the work is done.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Element counts of the layers.
    pub fn numels(&self) -> &[usize] {
        &self.numels
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.numels.len()
    }

    /// The contiguous range of layers each rank computes, in rank order.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// The layers this rank computes in [`Mode::Parallel`].
    pub fn my_range(&self) -> Range<usize> {
        self.ranges.get(self.rank).cloned().unwrap_or(0..0)
    }

    /// The fingerprint every rank agreed on.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Computes `f(layer)` for every layer and returns the results in layer order on every
    /// rank. Collective in [`Mode::Parallel`].
    ///
    /// `salt` fingerprints this call's scalars that must agree (learning rate, step count);
    /// `check` is this rank's validation of its inputs. If any rank's check fails or any
    /// `f` fails, every rank returns the error of the lowest failing rank (the first failing
    /// layer in layer order, as the local computation would); if the salts differ, every
    /// rank returns [`Error::Mismatch`].
    pub fn map<C, T, F>(&self, comm: &C, salt: u64, check: Result<()>, mut f: F) -> Result<Vec<T>>
    where
        C: Communicator + ?Sized,
        T: Pod,
        F: FnMut(usize) -> Result<T>,
    {
        if self.mode == Mode::Local {
            check?;
            return (0..self.numels.len()).map(f).collect();
        }
        let sz = std::mem::size_of::<T>();
        let mine = self.my_range();
        let mut out: Vec<T> = Vec::with_capacity(mine.len());
        let status = check.and_then(|()| {
            for l in mine.clone() {
                out.push(f(l)?);
            }
            Ok(())
        });
        // A failed part keeps its length (zeros), so every rank knows every length.
        out.resize(mine.len(), T::zeroed());
        let trailer = Trailer {
            fingerprint: Fingerprint::new().u64(self.fingerprint).u64(salt).finish(),
            status: Status::of(&status),
        };
        let mut part = Vec::with_capacity(mine.len() * sz + TRAILER);
        part.extend_from_slice(bytemuck::cast_slice(&out));
        part.extend_from_slice(bytemuck::bytes_of(&trailer));
        let lens: Vec<usize> = self.ranges.iter().map(|r| r.len() * sz + TRAILER).collect();
        let all = self.exchange.gather(comm, &part, &lens)?;
        let mut trailers = Vec::with_capacity(self.size);
        let mut results: Vec<T> = Vec::with_capacity(self.numels.len());
        let mut at = 0;
        for (r, &len) in lens.iter().enumerate() {
            let payload = &all[at..at + len - TRAILER];
            trailers.push(bytemuck::pod_read_unaligned::<Trailer>(
                &all[at + len - TRAILER..at + len],
            ));
            if r == self.rank {
                results.extend_from_slice(&out);
            } else {
                results.extend(
                    payload
                        .chunks_exact(sz.max(1))
                        .map(bytemuck::pod_read_unaligned::<T>),
                );
            }
            at += len;
        }
        resolve(self.rank, &trailers, status, "step parameters")?;
        if sz == 0 {
            // Zero-sized outputs carry no bytes; there is one per layer all the same.
            results = vec![T::zeroed(); self.numels.len()];
        }
        Ok(results)
    }
}

/// Turns the gathered trailers into the common outcome: the lowest failing rank's error
/// (this rank's own error when that is this rank), then a fingerprint mismatch.
fn resolve(me: usize, trailers: &[Trailer], own: Result<()>, what: &'static str) -> Result<()> {
    for (r, t) in trailers.iter().enumerate() {
        if let Some(e) = t.status.to_error(r) {
            return match own {
                Err(mine) if r == me => Err(mine),
                _ => Err(e),
            };
        }
    }
    let first = trailers.first().map(|t| t.fingerprint);
    if trailers.iter().any(|t| Some(t.fingerprint) != first) {
        let detail = trailers
            .iter()
            .enumerate()
            .map(|(r, t)| format!("rank {r}: {:016x}", t.fingerprint))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::Mismatch { what, detail });
    }
    Ok(())
}
