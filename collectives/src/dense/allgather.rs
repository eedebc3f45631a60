//! All-gather with equal or variable counts per rank: ring, recursive doubling (with the
//! non-power-of-two fold-in) and Bruck (Thakur, Rabenseifner & Gropp 2005, §3.1).
//!
//! Every algorithm moves bytes only: the typed entry points cast through `bytemuck`.

use bytemuck::Pod;

use crate::dense::util::{agree, ceil_log2, pair_mut, Fold};
use crate::dense::{tags, DenseOptions, Op};
use crate::{Communicator, Error, Result, Tag};

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
}

impl AllgatherAlgo {
    /// Every algorithm, for benchmarks and tests.
    pub const ALL: [AllgatherAlgo; 3] = [
        AllgatherAlgo::Ring,
        AllgatherAlgo::RecursiveDoubling,
        AllgatherAlgo::Bruck,
    ];

    /// Short name: `ring`, `recursive_doubling`, `bruck`.
    pub fn name(&self) -> &'static str {
        match self {
            AllgatherAlgo::Ring => "ring",
            AllgatherAlgo::RecursiveDoubling => "recursive_doubling",
            AllgatherAlgo::Bruck => "bruck",
        }
    }

    pub(crate) fn code(&self) -> u64 {
        match self {
            AllgatherAlgo::Ring => 1,
            AllgatherAlgo::RecursiveDoubling => 2,
            AllgatherAlgo::Bruck => 3,
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
    if opts.check {
        agree(
            comm,
            [
                Op::Allgather as u64,
                mine.len() as u64,
                algo.code(),
                0,
                0,
                0,
            ],
        )?;
    }
    if out.len() != mine.len() * p {
        return Err(Error::InvalidArgument(format!(
            "allgather: output has {} elements, need {} × {p}",
            out.len(),
            mine.len()
        )));
    }
    let bytes = std::mem::size_of_val(mine);
    let counts = vec![bytes; p];
    gather_core(
        comm,
        bytemuck::cast_slice(mine),
        bytemuck::cast_slice_mut(out),
        &counts,
        algo,
        tags::ALLGATHER,
    )
}

/// Variable-count all-gather: exchanges the counts first (one Bruck all-gather of one
/// word per rank), then the data. Every rank gets the same [`Gathered`].
pub fn allgatherv<C: Communicator + ?Sized, T: Pod>(
    comm: &C,
    mine: &[T],
    algo: AllgatherAlgo,
) -> Result<Gathered<T>> {
    let p = comm.size();
    let word = [(mine.len() as u64).to_le_bytes(), algo.code().to_le_bytes()].concat();
    let mut all = vec![0u8; 16 * p];
    gather_core(
        comm,
        &word,
        &mut all,
        &vec![16; p],
        AllgatherAlgo::Bruck,
        tags::COUNTS,
    )?;
    let mut counts = Vec::with_capacity(p);
    for r in 0..p {
        let mut c = [0u8; 8];
        c.copy_from_slice(&all[16 * r..16 * r + 8]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&all[16 * r + 8..16 * r + 16]);
        if u64::from_le_bytes(a) != algo.code() {
            return Err(Error::Mismatch {
                what: "algorithm",
                detail: format!(
                    "allgatherv: rank {r} uses another algorithm than rank {}",
                    comm.rank()
                ),
            });
        }
        let c = usize::try_from(u64::from_le_bytes(c))
            .map_err(|_| Error::InvalidArgument("allgatherv: count overflows usize".into()))?;
        counts.push(c);
    }
    allgatherv_known(comm, mine, &counts, algo)
}

/// Variable-count all-gather when every rank already knows every count (the hot path:
/// no count exchange). `counts[comm.rank()]` must equal `mine.len()`; a peer that sends
/// another length is reported as [`Error::Mismatch`].
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
    for &c in counts {
        displs.push(total);
        total = total
            .checked_add(c)
            .ok_or_else(|| Error::InvalidArgument("allgatherv: total count overflows".into()))?;
    }
    displs.push(total);
    let mut data: Vec<T> = bytemuck::zeroed_vec(total);
    let sz = std::mem::size_of::<T>();
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
    let mut displs = Vec::with_capacity(p + 1);
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
    out[displs[r]..displs[r + 1]].copy_from_slice(mine);
    if p == 1 {
        return Ok(());
    }
    match algo {
        AllgatherAlgo::Ring => ring_blocks(comm, out, &displs, r, p, &|i| i, tag),
        AllgatherAlgo::RecursiveDoubling => recursive_doubling(comm, out, &displs, tag),
        AllgatherAlgo::Bruck => bruck(comm, out, &displs, tag),
    }
}

/// Ring all-gather of blocks `displs[i]..displs[i+1]` where `me` (a virtual index, mapped
/// to communicator ranks by `abs`) already holds its own block.
pub(crate) fn ring_blocks<C: Communicator + ?Sized>(
    comm: &C,
    out: &mut [u8],
    displs: &[usize],
    me: usize,
    p: usize,
    abs: &dyn Fn(usize) -> usize,
    tag: Tag,
) -> Result<()> {
    let right = abs((me + 1) % p);
    let left = abs((me + p - 1) % p);
    for s in 0..p - 1 {
        let sb = (me + p - s) % p;
        let rb = (me + 2 * p - s - 1) % p;
        let want = displs[rb + 1] - displs[rb];
        let (send, recv) = pair_mut(out, displs[sb]..displs[sb + 1], displs[rb]..displs[rb + 1]);
        let n = comm.sendrecv_into(right, tag, send, left, tag, recv)?;
        check_bytes(comm, left, tag, n, want)?;
    }
    Ok(())
}

fn check_bytes<C: Communicator + ?Sized>(
    comm: &C,
    src: usize,
    tag: Tag,
    got: usize,
    want: usize,
) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Mismatch {
            what: "message length",
            detail: format!(
                "rank {} expected {want} bytes from rank {src} (tag {tag}), got {got}",
                comm.rank()
            ),
        })
    }
}

/// Recursive doubling with the fold-in: extra even ranks hand their block to their odd
/// partner, the P2 = 2^⌊log2 P⌋ acting ranks double their contiguous holdings each step,
/// and the odd partners send the full result back.
fn recursive_doubling<C: Communicator + ?Sized>(
    comm: &C,
    out: &mut [u8],
    displs: &[usize],
    tag: Tag,
) -> Result<()> {
    let p = comm.size();
    let r = comm.rank();
    let fold = Fold::new(p);
    let Some(v) = fold.virt(r) else {
        // Folded-out even rank: give my block to r + 1, get everything back.
        comm.send(r + 1, tag + 1, &out[displs[r]..displs[r + 1]])?;
        let n = comm.recv_into(r + 1, tag + 2, out)?;
        return check_bytes(comm, r + 1, tag + 2, n, out.len());
    };
    if r < 2 * fold.rem {
        let want = displs[r] - displs[r - 1];
        let n = comm.recv_into(r - 1, tag + 1, &mut out[displs[r - 1]..displs[r]])?;
        check_bytes(comm, r - 1, tag + 1, n, want)?;
    }
    // Byte range held by virtual ranks lo..hi.
    let span = |lo: usize, hi: usize| {
        displs[fold.orig_lo(lo)]..displs[if hi >= fold.p2 { p } else { fold.orig_lo(hi) }]
    };
    let mut mask = 1;
    while mask < fold.p2 {
        let pv = v ^ mask;
        let lo = v & !(mask - 1);
        let plo = pv & !(mask - 1);
        let mine = span(lo, lo + mask);
        let theirs = span(plo, plo + mask);
        let want = theirs.end - theirs.start;
        let partner = fold.actor(pv);
        let (send, recv) = pair_mut(out, mine, theirs);
        let n = comm.sendrecv_into(partner, tag, send, partner, tag, recv)?;
        check_bytes(comm, partner, tag, n, want)?;
        mask <<= 1;
    }
    if r < 2 * fold.rem {
        comm.send(r - 1, tag + 2, out)?;
    }
    Ok(())
}

/// Bruck's all-gather: ⌈log2 P⌉ steps; step k sends the first min(2^k, P − 2^k) blocks
/// held (in the order own, own + 1, …) to rank − 2^k and receives as many from rank + 2^k.
fn bruck<C: Communicator + ?Sized>(
    comm: &C,
    out: &mut [u8],
    displs: &[usize],
    tag: Tag,
) -> Result<()> {
    let p = comm.size();
    let r = comm.rank();
    // Rotated offsets: block (r + i) mod p sits at rot[i].
    let mut rot = Vec::with_capacity(p + 1);
    let mut acc = 0;
    for i in 0..p {
        rot.push(acc);
        let b = (r + i) % p;
        acc += displs[b + 1] - displs[b];
    }
    rot.push(acc);
    let mut tmp = vec![0u8; acc];
    tmp[..rot[1]].copy_from_slice(&out[displs[r]..displs[r + 1]]);
    for k in 0..ceil_log2(p) {
        let d = 1usize << k;
        let cnt = d.min(p - d);
        let dest = (r + p - d) % p;
        let src = (r + d) % p;
        let (send, recv) = pair_mut(&mut tmp, 0..rot[cnt], rot[d]..rot[d + cnt]);
        let want = recv.len();
        let n = comm.sendrecv_into(dest, tag, send, src, tag, recv)?;
        check_bytes(comm, src, tag, n, want)?;
    }
    for i in 1..p {
        let b = (r + i) % p;
        out[displs[b]..displs[b + 1]].copy_from_slice(&tmp[rot[i]..rot[i + 1]]);
    }
    Ok(())
}
