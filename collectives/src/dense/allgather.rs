//! All-gather with equal or variable counts per rank: ring, recursive doubling (with the
//! non-power-of-two fold-in) and Bruck (Thakur, Rabenseifner & Gropp 2005, §3.1).
//!
//! Every algorithm moves bytes only: the typed entry points cast through `bytemuck`.

use bytemuck::Pod;

use cost_model::plan::dense as plan;

use crate::dense::exec::run_bytes;
use crate::dense::library::library_of;
use crate::dense::shared_memory::{self, segment_of};
use crate::dense::util::{check_call, gather_words};
use crate::dense::wire::with_byte_scratch;
use crate::dense::{tags, DenseOptions, Op, WireType};
use crate::{Communicator, Error, Result, Tag};

/// Per-rank sizes or offsets of one call: on the stack up to 16 ranks, so that a small
/// all-gather allocates no bookkeeping.
type Sizes = smallvec::SmallVec<[usize; 17]>;

/// All-gather algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AllgatherAlgo {
    /// P − 1 neighbour steps, each moving one rank's block: bandwidth-optimal.
    #[default]
    Ring,
    /// log2 P exchanges of doubling size; other P fold the extra ranks in first.
    RecursiveDoubling,
    /// ⌈log2 P⌉ steps for any P (Bruck et al. 1997); one local rotation at the end.
    Bruck,
    /// The transport library's own all-gather (`MPI_Allgather`, `MPI_Allgatherv`), for
    /// transports that have one ([`Communicator::library`]). Not in [`AllgatherAlgo::ALL`]:
    /// [`choose_allgather_for`](crate::dense::choose_allgather_for) ranks it beside ours
    /// when a calibration measured it.
    Library,
    /// Through memory all ranks share ([`crate::dense::shared_memory`]), for communicators
    /// on one machine that have a segment ([`Communicator::shared_segment`]). Not in
    /// [`AllgatherAlgo::ALL`]: the chooser ranks it when the communicator has a segment
    /// and a calibration measured it.
    SharedMemory,
}

impl AllgatherAlgo {
    /// Every algorithm, for benchmarks and tests.
    pub const ALL: [AllgatherAlgo; 3] = [
        AllgatherAlgo::Ring,
        AllgatherAlgo::RecursiveDoubling,
        AllgatherAlgo::Bruck,
    ];

    /// Short name: `ring`, `recursive_doubling`, `bruck`, `library`, `shared_memory`.
    pub fn name(&self) -> &'static str {
        match self {
            AllgatherAlgo::Ring => "ring",
            AllgatherAlgo::RecursiveDoubling => "recursive_doubling",
            AllgatherAlgo::Bruck => "bruck",
            AllgatherAlgo::Library => "library",
            AllgatherAlgo::SharedMemory => "shared_memory",
        }
    }

    pub(crate) fn code(&self) -> u64 {
        match self {
            AllgatherAlgo::Ring => 1,
            AllgatherAlgo::RecursiveDoubling => 2,
            AllgatherAlgo::Bruck => 3,
            AllgatherAlgo::Library => 4,
            AllgatherAlgo::SharedMemory => 5,
        }
    }
}

/// The result of a variable-count all-gather: every rank's contribution, concatenated in
/// rank order, with the counts (in elements) to find each one.
#[derive(Debug, Clone, PartialEq)]
pub struct Gathered<T> {
    /// All contributions, rank 0 first.
    pub data: Vec<T>,
    /// Elements contributed by each rank.
    pub counts: Vec<usize>,
    /// Offset of each rank's contribution in `data` (length P + 1, last = total).
    pub displs: Vec<usize>,
}

impl<T> Gathered<T> {
    /// Rank `r`'s contribution (empty for a rank out of range).
    pub fn part(&self, r: usize) -> &[T] {
        match (self.displs.get(r), self.displs.get(r + 1)) {
            (Some(&a), Some(&b)) => &self.data[a..b],
            _ => &[],
        }
    }
}

/// Equal-count all-gather: `out` (length P · `mine.len()`) receives every rank's `mine`
/// in rank order. With `opts.check` the lengths are compared on every rank first.
pub fn allgather<C: Communicator + ?Sized, T: Pod>(
    comm: &C,
    mine: &[T],
    out: &mut [T],
    algo: AllgatherAlgo,
    opts: &DenseOptions,
) -> Result<()> {
    let p = comm.size();
    check_call(comm, opts, Op::Allgather, mine.len(), (algo.code(), 0), 0)?;
    if out.len() != mine.len() * p {
        return Err(Error::InvalidArgument(format!(
            "allgather: output has {} elements, need {} × {p}",
            out.len(),
            mine.len()
        )));
    }
    if algo == AllgatherAlgo::Library {
        // Straight to the library's equal-block call: at a few KiB a call takes well under
        // a microsecond, and building the counts of the general path showed in the time.
        return library_of(comm, "allgather", WireType::F32)?
            .allgather_bytes(bytemuck::cast_slice(mine), bytemuck::cast_slice_mut(out));
    }
    let bytes = std::mem::size_of_val(mine);
    let counts: Sizes = smallvec::smallvec![bytes; p];
    gather_core(
        comm,
        bytemuck::cast_slice(mine),
        bytemuck::cast_slice_mut(out),
        &counts,
        algo,
        tags::ALLGATHER,
    )
}

/// The word sent beside rank `rank`'s count and algorithm code: a mix of the three
/// (the SplitMix64 finaliser), so that a count corrupted or forged on the wire fails the
/// check instead of sizing the output.
fn count_check(rank: usize, count: u64, algo: u64) -> u64 {
    let mut z = count
        .rotate_left(17)
        .wrapping_add(algo.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        ^ (rank as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Variable-count all-gather: exchanges the counts first (one Bruck all-gather of three
/// words per rank: count, algorithm, check word), then the data. Every rank gets the same
/// [`Gathered`].
///
/// The output is allocated from the peers' counts before their data arrives, so a count
/// is used only once its check word matches and its byte size fits in memory
/// (`isize::MAX` bytes in all): a corrupt count is [`Error::Mismatch`] (or
/// [`Error::InvalidArgument`] for a size no allocation can hold) on every rank that
/// received it, never a panic or an allocation the peers' data does not fill.
pub fn allgatherv<C: Communicator + ?Sized, T: Pod>(
    comm: &C,
    mine: &[T],
    algo: AllgatherAlgo,
) -> Result<Gathered<T>> {
    let p = comm.size();
    let own = mine.len() as u64;
    let all = gather_words(
        comm,
        [own, algo.code(), count_check(comm.rank(), own, algo.code())],
        tags::COUNTS,
    )?;
    let mut counts = Vec::with_capacity(p);
    for (r, &[c, a, check]) in all.iter().enumerate() {
        if check != count_check(r, c, a) {
            return Err(Error::Mismatch {
                what: "count",
                detail: format!(
                    "allgatherv: rank {}: the count from rank {r} fails its check word \
                     (corrupt message)",
                    comm.rank()
                ),
            });
        }
        if a != algo.code() {
            return Err(Error::Mismatch {
                what: "algorithm",
                detail: format!(
                    "allgatherv: rank {r} uses another algorithm than rank {}",
                    comm.rank()
                ),
            });
        }
        let c = usize::try_from(c)
            .map_err(|_| Error::InvalidArgument("allgatherv: count overflows usize".into()))?;
        counts.push(c);
    }
    allgatherv_known(comm, mine, &counts, algo)
}

/// Variable-count all-gather when every rank already knows every count (the hot path:
/// no count exchange). `counts[comm.rank()]` must equal `mine.len()`; a peer that sends
/// fewer bytes than its count is reported as [`Error::Mismatch`], and one that sends more
/// ends the job under MPI (`MPI_ERR_TRUNCATE`: the receives are posted ahead, see
/// `Communicator::recv_agreed_into`), so the counts must be the ones every rank agreed on.
pub fn allgatherv_known<C: Communicator + ?Sized, T: Pod>(
    comm: &C,
    mine: &[T],
    counts: &[usize],
    algo: AllgatherAlgo,
) -> Result<Gathered<T>> {
    let p = comm.size();
    if counts.len() != p || counts[comm.rank()] != mine.len() {
        return Err(Error::InvalidArgument(format!(
            "allgatherv: {} counts for {p} ranks, own count {:?} vs {} elements",
            counts.len(),
            counts.get(comm.rank()),
            mine.len()
        )));
    }
    let mut displs = Vec::with_capacity(p + 1);
    let mut total = 0usize;
    let sz = std::mem::size_of::<T>();
    for &c in counts {
        displs.push(total);
        total = total
            .checked_add(c)
            .filter(|t| t.checked_mul(sz).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "allgatherv: counts {counts:?} of {sz}-byte elements exceed the largest \
                     allocation"
                ))
            })?;
    }
    displs.push(total);
    let mut data: Vec<T> = bytemuck::zeroed_vec(total);
    let byte_counts: Vec<usize> = counts.iter().map(|c| c * sz).collect();
    gather_core(
        comm,
        bytemuck::cast_slice(mine),
        bytemuck::cast_slice_mut(&mut data),
        &byte_counts,
        algo,
        tags::ALLGATHER,
    )?;
    Ok(Gathered {
        data,
        counts: counts.to_vec(),
        displs,
    })
}

/// Byte-level all-gather: `out` is the concatenation of blocks of `counts[r]` bytes in
/// rank order; `mine` is this rank's block.
pub(crate) fn gather_core<C: Communicator + ?Sized>(
    comm: &C,
    mine: &[u8],
    out: &mut [u8],
    counts: &[usize],
    algo: AllgatherAlgo,
    tag: Tag,
) -> Result<()> {
    let p = comm.size();
    let r = comm.rank();
    if algo == AllgatherAlgo::Library {
        let total = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
        if total != Some(out.len()) || counts.get(r) != Some(&mine.len()) {
            return Err(Error::InvalidArgument(format!(
                "allgather: output holds {} bytes, counts {counts:?}",
                out.len()
            )));
        }
        library_of(comm, "allgather", WireType::F32)?.allgatherv_bytes(mine, out, counts)?;
        // Every block but this rank's comes in (with equal blocks the ring sends as much).
        comm.record_collective(out.len() - mine.len(), out.len() - mine.len());
        return Ok(());
    }
    let mut displs = Sizes::with_capacity(p + 1);
    let mut acc = 0;
    for &c in counts {
        displs.push(acc);
        acc += c;
    }
    displs.push(acc);
    if acc != out.len() || counts[r] != mine.len() {
        return Err(Error::InvalidArgument(format!(
            "allgather: output holds {} bytes, counts sum to {acc}",
            out.len()
        )));
    }
    if algo == AllgatherAlgo::SharedMemory {
        let seg = segment_of(comm, "allgather", WireType::F32)?;
        shared_memory::allgatherv(seg, mine, out, &displs)?;
        comm.record_collective(out.len() - mine.len(), out.len() - mine.len());
        return Ok(());
    }
    out[displs[r]..displs[r + 1]].copy_from_slice(mine);
    if p == 1 {
        return Ok(());
    }
    match algo {
        AllgatherAlgo::Ring => run_bytes(comm, out, &plan::allgather_ring(&displs, r, tag)),
        AllgatherAlgo::RecursiveDoubling => run_bytes(
            comm,
            out,
            &plan::allgather_recursive_doubling(&displs, r, tag),
        ),
        AllgatherAlgo::Library | AllgatherAlgo::SharedMemory => Err(Error::InvalidArgument(
            "the library and shared-memory all-gathers are dispatched before".into(),
        )),
        AllgatherAlgo::Bruck => {
            // The plan works on a rotated copy in which this rank's block comes first.
            let (rot, steps) = plan::allgather_bruck(&displs, r, tag);
            // The copy is pooled scratch: a fresh one per call faulted in its pages every
            // time (at P = 2, 16 MiB took over 4x the ring's time).
            with_byte_scratch(out.len(), |tmp| {
                tmp[..rot[1]].copy_from_slice(mine);
                run_bytes(comm, tmp, &steps)?;
                for i in 1..p {
                    let b = (r + i) % p;
                    out[displs[b]..displs[b + 1]].copy_from_slice(&tmp[rot[i]..rot[i + 1]]);
                }
                Ok(())
            })
        }
    }
}
