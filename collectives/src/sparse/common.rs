//! Plumbing shared by the sparse algorithms: the collective construction check, a counting
//! adapter over the communicator, sparse entry blocks and their wire form, deterministic
//! sparse top-k and ordered sums, and a Bruck all-gather over a group of ranks.

use cost_model::plan::dense::bruck_rounds;
use sparsify::{ExactTopK, MsTopK, Selector};

use super::{SelectorKind, SparseAlgo};
use crate::{Communicator, Error, Metered, Result, Tag};

/// Tags of the sparse algorithms (`0x6100..=0x613F`), one per phase.
pub(crate) mod tags {
    use crate::Tag;
    pub const CHECK: Tag = 0x6100;
    pub const SRS: Tag = 0x6101;
    pub const AG: Tag = 0x6102;
    pub const SAG: Tag = 0x6103;
    pub const TOPKA: Tag = 0x6105;
    pub const GT_REDUCE: Tag = 0x6106;
    pub const GT_BCAST: Tag = 0x6107;
    pub const DSA_RS: Tag = 0x6108;
    pub const DSA_AG: Tag = 0x6109;
    pub const EX_COUNTS: Tag = 0x610B;
    pub const EX_IDX: Tag = 0x610C;
    pub const HI_INTER: Tag = 0x610D;
    pub const HI_INTRA: Tag = 0x610E;
    pub const OK_BOUNDS: Tag = 0x6120;
    pub const OK_COUNTS: Tag = 0x6121;
    pub const OK_REDUCE: Tag = 0x6122;
    pub const OK_GCOUNTS: Tag = 0x6123;
    pub const OK_GATHER: Tag = 0x6124;
}

/// The options of a [`SparseAlgo`] as flat fields, for the algorithms to read and the
/// agreement check to compare (an option an algorithm does not take is its default).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Opts {
    pub selector: Option<SelectorKind>,
    pub teams: Option<usize>,
    pub ranks_per_node: Option<usize>,
    pub f16_wire: bool,
    pub exdyna_warm_start: bool,
    pub oktopk: Option<(u32, u32)>,
}

impl Opts {
    fn of(algo: &SparseAlgo) -> Self {
        Opts {
            selector: algo.selector(),
            teams: algo.teams(),
            ranks_per_node: algo.ranks_per_node(),
            f16_wire: algo.f16_wire(),
            exdyna_warm_start: algo.warm_start(),
            oktopk: algo.oktopk_periods(),
        }
    }
}

/// The agreed configuration an algorithm is built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    pub p: usize,
    pub rank: usize,
    pub d: usize,
    pub density: f64,
    pub opts: Opts,
}

impl Config {
    /// Target number of entries `k = ⌈density · d⌉`, in `1..=d`.
    pub fn k(&self) -> usize {
        ((self.density * self.d as f64).ceil() as usize).clamp(1, self.d)
    }

    /// Same size and rank as at construction, and a gradient of length `d`.
    pub fn check_step(&self, comm: &dyn Communicator, grad: &[f32]) -> Result<()> {
        if comm.size() != self.p || comm.rank() != self.rank {
            return Err(Error::InvalidArgument(format!(
                "step on a communicator of size {} rank {}, built for size {} rank {}",
                comm.size(),
                comm.rank(),
                self.p,
                self.rank
            )));
        }
        if grad.len() != self.d {
            return Err(Error::InvalidArgument(format!(
                "gradient has {} elements, the algorithm was built for d = {}",
                grad.len(),
                self.d
            )));
        }
        Ok(())
    }
}

const FIELDS: [&str; 10] = [
    "algorithm",
    "dense length d",
    "density",
    "selector",
    "teams",
    "ranks per node",
    "f16 wire",
    "exdyna warm start",
    "oktopk tau",
    "oktopk rebalance",
];

/// 0 for the algorithm's default, else the position in [`SelectorKind::ALL`] plus one.
fn selector_code(s: Option<SelectorKind>) -> u64 {
    s.and_then(|k| SelectorKind::ALL.iter().position(|&a| a == k))
        .map_or(0, |i| i as u64 + 1)
}

/// Collective construction check: every rank learns every rank's (algorithm, d, density,
/// options) through one Bruck all-gather, so a disagreement or an invalid value is the
/// same error everywhere. Then the values are validated against P.
pub(crate) fn setup(
    comm: &dyn Communicator,
    algo: &SparseAlgo,
    d: usize,
    density: f64,
) -> Result<Config> {
    setup_inner(comm, algo.code(), d, density, &Opts::of(algo)).map_err(|e| fail_together(comm, e))
}

/// Every rank reaches the same verdict from the same table; before returning it, the ranks
/// meet at a barrier so that none stops while another still waits for its part of the
/// exchange (a transport may cut such waits short once a peer has failed).
pub(crate) fn fail_together(comm: &dyn Communicator, e: Error) -> Error {
    if comm.size() > 1 && !matches!(e, Error::Timeout { .. } | Error::PeerFailed { .. }) {
        let _ = comm.barrier();
    }
    e
}

fn setup_inner(
    comm: &dyn Communicator,
    code: u64,
    d: usize,
    density: f64,
    opts: &Opts,
) -> Result<Config> {
    let p = comm.size();
    let words: [u64; 10] = [
        code,
        d as u64,
        density.to_bits(),
        selector_code(opts.selector),
        opts.teams.map_or(0, |t| t as u64),
        opts.ranks_per_node.map_or(0, |t| t as u64),
        opts.f16_wire as u64,
        opts.exdyna_warm_start as u64,
        opts.oktopk.map_or(0, |t| u64::from(t.0)),
        opts.oktopk.map_or(0, |t| u64::from(t.1)),
    ];
    if p > 1 {
        let mine: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let cc = counting(comm);
        let g = Group::world(p, comm.rank());
        let sizes = vec![mine.len(); p];
        let all = bruck(&cc, &g, mine, Some(&sizes), tags::CHECK)?;
        let get = |r: usize, f: usize| -> u64 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&all[r][8 * f..8 * f + 8]);
            u64::from_le_bytes(b)
        };
        for (f, what) in FIELDS.iter().enumerate() {
            if (1..p).any(|r| get(r, f) != get(0, f)) {
                let detail = (0..p)
                    .map(|r| {
                        let v = get(r, f);
                        if f == 2 {
                            format!("rank {r}: {}", f64::from_bits(v))
                        } else {
                            format!("rank {r}: {v}")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(Error::Mismatch { what, detail });
            }
        }
    }
    if let Some(kind) = opts.selector.filter(|k| !k.exact_count()) {
        return Err(Error::InvalidArgument(format!(
            "selector {kind} does not return exactly k entries; the sparse allreduces take \
             exact or mstopk"
        )));
    }
    if let Some((tau, rebalance)) = opts.oktopk.filter(|&(t, r)| t == 0 || r == 0) {
        return Err(Error::InvalidArgument(format!(
            "Ok-Topk periods must be at least 1 step: tau = {tau}, rebalance = {rebalance}"
        )));
    }
    if !(density.is_finite() && density > 0.0 && density <= 1.0) {
        return Err(Error::InvalidArgument(format!(
            "density {density} is outside (0, 1]"
        )));
    }
    if d < p {
        return Err(Error::InvalidArgument(format!(
            "dense length d = {d} is smaller than P = {p}"
        )));
    }
    if d as u64 > u64::from(u32::MAX) {
        return Err(Error::InvalidArgument(format!(
            "dense length d = {d} exceeds the u32 index range"
        )));
    }
    Ok(Config {
        p,
        rank: comm.rank(),
        d,
        density,
        opts: *opts,
    })
}

/// The selector `kind` asks for, `default` when it is `None` (validated by [`setup`]: exact
/// or MSTopK).
pub(crate) fn make_selector(
    kind: Option<SelectorKind>,
    default: SelectorKind,
) -> Box<dyn Selector> {
    match kind.unwrap_or(default) {
        SelectorKind::MsTopK => Box::new(MsTopK::default()),
        _ => Box::new(ExactTopK::new()),
    }
}

/// A borrowed communicator as an owned one, so that one step can meter it.
pub(crate) struct Borrowed<'a>(pub &'a dyn Communicator);

// SAFETY: a `Borrowed` (and the `Counting` around it) is created, used and dropped inside
// one `step` call on the calling thread and is never moved to or shared with another
// thread; `Send` is only required by the `Communicator` trait bound so that it can be
// handed to the generic dense collectives.
unsafe impl Send for Borrowed<'_> {}

crate::comm::forward_communicator!(impl['a] Borrowed<'a>, |s| s.0);

/// This step's communicator, metered: messages, rounds and bytes as `SimComm` counts
/// them, and the sparse entries received (`add_items`), so step stats exist on every
/// transport.
pub(crate) type Counting<'a> = Metered<Borrowed<'a>>;

/// Meters `comm` from zero.
pub(crate) fn counting(comm: &dyn Communicator) -> Counting<'_> {
    Metered::metered(Borrowed(comm))
}

/// A group of ranks of one communicator, listed by world rank, and this rank's position.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub members: Vec<usize>,
    pub me: usize,
}

impl Group {
    pub fn world(p: usize, rank: usize) -> Self {
        Group {
            members: (0..p).collect(),
            me: rank,
        }
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }
}

/// Bruck all-gather of one byte block per group member, in the rounds of
/// `cost_model::plan::dense::bruck_rounds` (SparDL (Zhao et al.) §2, Fig. 2b): in round
/// `s`, with `gap = 2^s`, send the first `min(gap, n − gap)` held blocks to position
/// `me − gap` and receive as many from `me + gap`; `⌈log2 n⌉` send-receive rounds for
/// any `n`. `sizes` gives every member's block length when all ranks know them (no
/// framing on the wire); otherwise each block travels behind a 4-byte length. Returns the
/// blocks by group position.
pub(crate) fn bruck(
    comm: &Counting,
    g: &Group,
    mine: Vec<u8>,
    sizes: Option<&[usize]>,
    tag: Tag,
) -> Result<Vec<Vec<u8>>> {
    let n = g.size();
    let mut held: Vec<Vec<u8>> = Vec::with_capacity(n);
    held.push(mine);
    for round in bruck_rounds(n, g.me) {
        let (gap, cnt) = (round.gap, round.count);
        let mut msg = Vec::new();
        for b in &held[..cnt] {
            if sizes.is_none() {
                msg.extend_from_slice(&(b.len() as u32).to_le_bytes());
            }
            msg.extend_from_slice(b);
        }
        let (dest, src) = (g.members[round.to], g.members[round.from]);
        let got = comm.sendrecv(dest, tag, &msg, src, tag)?;
        let mut off = 0usize;
        for j in 0..cnt {
            let len = match sizes {
                Some(s) => s[(g.me + gap + j) % n],
                None => {
                    let h = got.get(off..off + 4).ok_or_else(|| short(comm, src, tag))?;
                    off += 4;
                    u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize
                }
            };
            let b = got
                .get(off..off + len)
                .ok_or_else(|| short(comm, src, tag))?;
            held.push(b.to_vec());
            off += len;
        }
        if off != got.len() {
            return Err(short(comm, src, tag));
        }
    }
    let mut out = vec![Vec::new(); n];
    for (i, b) in held.into_iter().enumerate() {
        out[(g.me + i) % n] = b;
    }
    Ok(out)
}

fn short(comm: &Counting, src: usize, tag: Tag) -> Error {
    Error::Mismatch {
        what: "message length",
        detail: format!(
            "rank {} got a message of unexpected length from rank {src} (tag {tag})",
            comm.rank()
        ),
    }
}

/// A block of sparse entries: global indices (strictly increasing inside one block) with
/// one `f32` value each.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Entries {
    pub idx: Vec<u32>,
    pub val: Vec<f32>,
}

impl Entries {
    pub fn len(&self) -> usize {
        self.idx.len()
    }

    /// Wire form: the indices, then the values (8 bytes per entry, no header).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(bytemuck::cast_slice(&self.idx));
        out.extend_from_slice(bytemuck::cast_slice(&self.val));
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 * self.len());
        self.encode_into(&mut v);
        v
    }

    /// Decodes `n` entries from the front of `bytes`, checking every index lies in
    /// `range`; returns the entries and the bytes used.
    pub fn decode(
        bytes: &[u8],
        n: usize,
        range: std::ops::Range<usize>,
    ) -> Result<(Entries, usize)> {
        let need = 8 * n;
        if bytes.len() < need {
            return Err(Error::Mismatch {
                what: "message length",
                detail: format!(
                    "sparse block of {n} entries needs {need} bytes, got {}",
                    bytes.len()
                ),
            });
        }
        let idx: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes[..4 * n]);
        let val: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes[4 * n..need]);
        if let Some(&bad) = idx.iter().find(|&&i| !range.contains(&(i as usize))) {
            return Err(Error::InvalidArgument(format!(
                "received index {bad} outside its block {range:?}"
            )));
        }
        Ok((Entries { idx, val }, need))
    }

    /// Decodes a whole message of entries (its length must be a multiple of 8).
    pub fn decode_all(bytes: &[u8], range: std::ops::Range<usize>) -> Result<Entries> {
        if bytes.len() % 8 != 0 {
            return Err(Error::Mismatch {
                what: "message length",
                detail: format!(
                    "{} bytes is not a whole number of sparse entries",
                    bytes.len()
                ),
            });
        }
        Ok(Entries::decode(bytes, bytes.len() / 8, range)?.0)
    }

    /// From a selection over a slice that starts at global index `base`.
    pub fn from_local(idx: &[u32], val: &[f32], base: usize) -> Entries {
        Entries {
            idx: idx.iter().map(|&i| i + base as u32).collect(),
            val: val.to_vec(),
        }
    }
}

/// Sum of several entry blocks in the given order: each index's value is
/// `((0 + v_first) + v_second) + …` over the parts that hold it, so every rank that sums
/// the same parts in the same order gets the same bits. Result sorted by index.
pub(crate) fn sum_ordered(parts: &[&Entries]) -> Entries {
    if parts.len() == 1 {
        let mut e = parts[0].clone();
        sort_by_index(&mut e);
        return e;
    }
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut pairs: Vec<(u32, f32)> = Vec::with_capacity(total);
    for p in parts {
        pairs.extend(p.idx.iter().copied().zip(p.val.iter().copied()));
    }
    pairs.sort_by_key(|x| x.0); // stable: keeps the part order within an index
    let mut out = Entries::default();
    for (i, v) in pairs {
        if out.idx.last() == Some(&i) {
            if let Some(s) = out.val.last_mut() {
                *s += v;
            }
        } else {
            out.idx.push(i);
            out.val.push(0.0 + v);
        }
    }
    out
}

fn sort_by_index(e: &mut Entries) {
    if e.idx.windows(2).all(|w| w[0] < w[1]) {
        return;
    }
    let mut pairs: Vec<(u32, f32)> = e.idx.iter().copied().zip(e.val.iter().copied()).collect();
    pairs.sort_by_key(|x| x.0);
    e.idx = pairs.iter().map(|x| x.0).collect();
    e.val = pairs.iter().map(|x| x.1).collect();
}

/// Deterministic top-`k` of a sparse block by (magnitude desc, index asc): returns the
/// kept and the dropped entries, both sorted by index. Ranks holding the same block keep
/// the same entries.
pub(crate) fn topk_entries(e: &Entries, k: usize) -> (Entries, Entries) {
    if e.len() <= k {
        return (e.clone(), Entries::default());
    }
    let mut order: Vec<u32> = (0..e.len() as u32).collect();
    let key = |j: &u32| {
        let j = *j as usize;
        (std::cmp::Reverse(e.val[j].abs().to_bits()), e.idx[j])
    };
    if k > 0 {
        order.select_nth_unstable_by_key(k - 1, key);
    }
    let mut keep: Vec<u32> = order[..k].to_vec();
    let mut drop: Vec<u32> = order[k..].to_vec();
    keep.sort_unstable();
    drop.sort_unstable();
    let pick = |js: &[u32]| Entries {
        idx: js.iter().map(|&j| e.idx[j as usize]).collect(),
        val: js.iter().map(|&j| e.val[j as usize]).collect(),
    };
    (pick(&keep), pick(&drop))
}

/// The final update: entries (sorted, distinct, `< d`) divided by P, zeros dropped. Entries
/// out of order (a corrupt or mismatched peer message) are a typed error, never an invalid
/// `SparseGrad` (found by the `sparse_wire` fuzz target).
pub(crate) fn finish_update(
    e: &Entries,
    d: usize,
    p: usize,
) -> crate::Result<sparsify::SparseGrad<f32>> {
    let pf = p as f32;
    let mut idx = Vec::with_capacity(e.len());
    let mut val = Vec::with_capacity(e.len());
    for (&i, &v) in e.idx.iter().zip(&e.val) {
        if (i as usize) < d && v != 0.0 {
            idx.push(i);
            val.push(v / pf);
        }
    }
    if let Some(w) = idx.windows(2).find(|w| w[0] >= w[1]) {
        return Err(crate::Error::InvalidArgument(format!(
            "the summed entries hold index {} before {}: a peer's message is out of order",
            w[0], w[1]
        )));
    }
    Ok(sparsify::SparseGrad::from_parts_unchecked(idx, val, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topk_entries_is_deterministic_and_splits() {
        let e = Entries {
            idx: vec![1, 3, 5, 7, 9],
            val: vec![1.0, -3.0, 3.0, 0.5, 2.0],
        };
        let (k, d) = topk_entries(&e, 2);
        assert_eq!(k.idx, vec![3, 5]);
        assert_eq!(d.idx, vec![1, 7, 9]);
        let (k0, d0) = topk_entries(&e, 0);
        assert!(k0.idx.is_empty());
        assert_eq!(d0.len(), 5);
    }

    #[test]
    fn sum_ordered_sums_in_part_order() {
        let a = Entries {
            idx: vec![0, 2],
            val: vec![1.0, 2.0],
        };
        let b = Entries {
            idx: vec![2, 4],
            val: vec![3.0, 4.0],
        };
        let s = sum_ordered(&[&a, &b]);
        assert_eq!(s.idx, vec![0, 2, 4]);
        assert_eq!(s.val, vec![1.0, 5.0, 4.0]);
    }
}
