//! Exact time, rounds and bytes of one step of each `collectives::sparse` algorithm, by
//! replaying its message schedule through the clock model ([`crate::schedule`]), so the
//! prediction equals what `SimComm` measures for any P, d, density and topology.
//!
//! Sparse traffic depends on the data: how many entries survive a selection or a merge. The replay
//! takes those counts as input ([`Observed`]); the algorithms' own stats or accessors report them
//! (`StepStats::selected`, the update's support, `SparDl::h`/`last_gathered`), or a deterministic
//! input fixes them. Without them ([`Observed::Worst`]) each count takes its worst case, which is
//! where SparDL (Zhao et al.) Table 1 and the other closed forms of [`crate::sparse`] apply.
//!
//! The rounds come from [`crate::plan`], which `collectives::sparse` executes: an entry is
//! [`ENTRY_BYTES`] (u32 index, f32 value); a Bruck all-gather whose block sizes the
//! receivers do not know puts a [`FRAME_BYTES`] length before each block; dense phases
//! (CLT-k's broadcast and all-reduce, HiTopKComm's reduce-scatter, ExDyna's all-reduce)
//! are the dense plans, with the all-reduce [`default_allreduce`] picks.
//!
//! The construction-time agreement exchange (and HiTopKComm's communicator split) is not
//! part of a step and is not included.

use crate::dense::{block_start, dense_schedule, DenseCase};
use crate::plan::dense::{bcast_binomial, bruck_rounds, reduce_binomial};
pub use crate::plan::sparse::{default_allreduce, ENTRY_BYTES, FRAME_BYTES};
use crate::plan::sparse::{
    direct_exchanges, k_of, srs_rounds, OktopkPhase, OktopkStep, SagKind, SpardlLayout,
    COUNT_BYTES, OKTOPK_REBALANCE, OKTOPK_TAU,
};
use crate::plan::{push_schedule, Step};
use crate::schedule::{Op, Prediction, Schedule};
use crate::{Algorithm, Collective, Error, Result, Topology};

/// Collectives' tags of the sparse phases (any distinct keys would do).
const T_SRS: u32 = 0x6101;
const T_AG: u32 = 0x6102;
const T_SAG: u32 = 0x6103;
const T_TOPKA: u32 = 0x6105;
const T_GT_REDUCE: u32 = 0x6106;
const T_GT_BCAST: u32 = 0x6107;
const T_DSA_RS: u32 = 0x6108;
const T_DSA_AG: u32 = 0x6109;
const T_EX_COUNTS: u32 = 0x610B;
const T_EX_IDX: u32 = 0x610C;
const T_HI_INTER: u32 = 0x610D;
const T_HI_INTRA: u32 = 0x610E;
const T_OK_BOUNDS: u32 = 0x6120;
const T_OK_COUNTS: u32 = 0x6121;
const T_OK_REDUCE: u32 = 0x6122;
const T_OK_GCOUNTS: u32 = 0x6123;
const T_OK_GATHER: u32 = 0x6124;
/// Offsets that keep the nested dense collectives' keys apart.
const CTX_BCAST: u32 = 0x1_0000;
const CTX_ALLREDUCE: u32 = 0x2_0000;
const CTX_RS: u32 = 0x3_0000;

/// The data-dependent entry counts of one step (see the module docs for who reports them).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Observed {
    /// Every count at its worst case: TopkDSA's `k` entries spread evenly over the blocks
    /// and every reduced block dense; B-SAG's `h = k_b` with nothing in common between
    /// teams; HiTopKComm's exact `⌈ρ·len⌉` per slice with disjoint selections across
    /// nodes; ExDyna's `k` entries on every rank; Ok-Topk's `k` entries on every rank,
    /// spread evenly over the regions, and a global selection of `k` entries in all (on a
    /// re-estimation step, every reduced entry, disjoint across ranks, at most a region's
    /// length of `d` split evenly). The algorithms whose traffic does not
    /// depend on the data (TopkA, gTopk, CLT-k, SparDL, R-SAG) need nothing else.
    #[default]
    Worst,
    /// TopkDSA.
    TopkDsa {
        /// `sent[r][j]`: entries rank r selected in block j (of `d` split into P blocks).
        sent: Vec<Vec<usize>>,
        /// `reduced[j]`: distinct indices in block j after the reduce-scatter (the union
        /// of all ranks' selections there; the update's support in block j when no sum
        /// is exactly zero).
        reduced: Vec<usize>,
    },
    /// SparDL with B-SAG.
    Bsag {
        /// `h[q]`: `h` before the step of the ranks at team position q (`SparDl::h()`;
        /// each position adjusts its own from its own `N_t`), rounded and clamped as the
        /// algorithm does.
        h: Vec<f64>,
        /// `gathered[q]`: entries after the sum between teams at team position q
        /// (`SparDl::last_gathered()` of the ranks at position q).
        gathered: Vec<usize>,
    },
    /// HiTopKComm.
    HiTopK {
        /// `selected[r]`: entries world rank r selected from its slice (`StepStats::selected`).
        selected: Vec<usize>,
        /// `summed[j]`: distinct indices of slice j after the sum across nodes (the
        /// update's support in slice j when no sum is exactly zero).
        summed: Vec<usize>,
    },
    /// ExDyna.
    ExDyna {
        /// `selected[r]`: entries rank r selected (`StepStats::selected`).
        selected: Vec<usize>,
    },
    /// Ok-Topk (`OkTopk::last_sent` and `OkTopk::last_gathered` of each rank).
    OkTopk {
        /// `sent[r][j]`: entries rank r selected in region j (sent to rank j).
        sent: Vec<Vec<usize>>,
        /// `gathered[j]`: entries region j's owner contributed to the all-gather.
        gathered: Vec<usize>,
    },
}

/// Steps of ExDyna's fast mode that select with exact partition thresholds
/// (`collectives::sparse::ExDyna::WARM_STEPS`).
pub const EXDYNA_WARM_STEPS: u64 = 4;

/// One step of a sparse all-reduce to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseStep {
    /// The algorithm (a sparse one).
    pub algo: Algorithm,
    /// Dense length d.
    pub d: usize,
    /// Density ρ in (0, 1].
    pub density: f64,
    /// SparDL's teams; `None`: the algorithm's default (R-SAG: 2 for even P, else 1;
    /// B-SAG: the smallest prime factor of P).
    pub teams: Option<usize>,
    /// HiTopKComm's ranks per node `n`; `None`: the topology's.
    pub ranks_per_node: Option<usize>,
    /// HiTopKComm: values as f16 on the wire.
    pub f16_wire: bool,
    /// Step number since construction (CLT-k's leader is `step mod P`).
    pub step: u64,
    /// ExDyna with `exdyna_warm_start`: on steps below [`EXDYNA_WARM_STEPS`] each rank's
    /// threshold rides along in the count all-gather (4 more bytes per rank).
    pub exdyna_warm_start: bool,
    /// Ok-Topk's threshold re-estimation period `τ` ([`OKTOPK_TAU`] by default).
    pub oktopk_tau: u32,
    /// Ok-Topk's region re-balancing period ([`OKTOPK_REBALANCE`] by default).
    pub oktopk_rebalance: u32,
    /// The data-dependent counts.
    pub observed: Observed,
}

impl SparseStep {
    /// The first step of `algo` with every count at its worst case.
    pub fn new(algo: Algorithm, d: usize, density: f64) -> Self {
        SparseStep {
            algo,
            d,
            density,
            teams: None,
            ranks_per_node: None,
            f16_wire: false,
            step: 0,
            exdyna_warm_start: false,
            oktopk_tau: OKTOPK_TAU,
            oktopk_rebalance: OKTOPK_REBALANCE,
            observed: Observed::Worst,
        }
    }

    /// The same step for an ExDyna built with `exdyna_warm_start`.
    pub fn with_exdyna_warm_start(mut self, warm: bool) -> Self {
        self.exdyna_warm_start = warm;
        self
    }

    /// The same step with the given counts.
    pub fn with_observed(mut self, observed: Observed) -> Self {
        self.observed = observed;
        self
    }

    /// The same step with `teams` SparDL teams.
    pub fn with_teams(mut self, teams: usize) -> Self {
        self.teams = Some(teams);
        self
    }

    /// `k = clamp(⌈ρ·d⌉, 1, d)`, the entries each rank selects.
    pub fn k(&self) -> usize {
        k_of(self.d, self.density)
    }
}

fn len_of(n: usize, parts: usize, j: usize) -> usize {
    block_start(n, parts, j + 1) - block_start(n, parts, j)
}

/// Bruck all-gather ([`bruck_rounds`]) over `group` (world ranks by position) for the
/// member at position `me`; `block[x]` is the payload of position x's block; `framed`
/// adds the length header.
fn bruck(s: &mut Schedule, group: &[usize], me: usize, block: &[usize], framed: bool, tag: u32) {
    let n = group.len();
    for br in bruck_rounds(n, me) {
        let bytes: usize = (0..br.count)
            .map(|i| block[(me + i) % n] + if framed { FRAME_BYTES } else { 0 })
            .sum();
        s.sendrecv(group[me], group[br.to], bytes, group[br.from], tag, false);
    }
}

/// Appends sub-schedule `sub` (ranks `0..map.len()` of a sub-communicator whose member v
/// is world rank `map[v]`) with its tags offset by `ctx`.
fn append(s: &mut Schedule, sub: &Schedule, map: &[usize], ctx: u32) {
    for (v, ops) in sub.ops.iter().enumerate() {
        for op in ops {
            let op = match *op {
                Op::Send { to, tag, bytes } => Op::Send {
                    to: map[to],
                    tag: tag + ctx,
                    bytes,
                },
                Op::Recv { from, tag, reduce } => Op::Recv {
                    from: map[from],
                    tag: tag + ctx,
                    reduce,
                },
                Op::SendRecv {
                    to,
                    send_tag,
                    bytes,
                    from,
                    recv_tag,
                    reduce,
                } => Op::SendRecv {
                    to: map[to],
                    send_tag: send_tag + ctx,
                    bytes,
                    from: map[from],
                    recv_tag: recv_tag + ctx,
                    reduce,
                },
            };
            s.ops[map[v]].push(op);
        }
    }
}

fn world_dense(s: &mut Schedule, case: &DenseCase, ctx: u32) -> Result<()> {
    let p = s.ops.len();
    let sub = dense_schedule(case, p, 1)?;
    let map: Vec<usize> = (0..p).collect();
    append(s, &sub, &map, ctx);
    Ok(())
}

fn bad(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

fn check_len<T>(what: &str, v: &[T], n: usize) -> Result<()> {
    if v.len() == n {
        Ok(())
    } else {
        Err(bad(format!(
            "{what}: {} counts given, {n} expected",
            v.len()
        )))
    }
}

/// SparDL's layout for `step` on `p` ranks.
fn spardl_layout(step: &SparseStep, p: usize) -> Result<SpardlLayout> {
    let sag = match step.algo {
        Algorithm::SpardlRsag => SagKind::Recursive,
        Algorithm::SpardlBsag => SagKind::Bruck,
        _ => SagKind::None,
    };
    SpardlLayout::new(sag, step.teams, p, step.d, step.density)
}

/// The message schedule of `step` on `p` ranks (`rpn`: ranks per node for HiTopKComm).
pub fn sparse_schedule(step: &SparseStep, p: usize, rpn: usize) -> Result<Schedule> {
    if !step.algo.is_sparse() {
        return Err(bad(format!("{} is not a sparse algorithm", step.algo)));
    }
    if !(step.density.is_finite() && step.density > 0.0 && step.density <= 1.0) {
        return Err(bad(format!("density {} must be in (0, 1]", step.density)));
    }
    if p == 0 || step.d < p {
        return Err(bad(format!("d = {} must be at least P = {p} ≥ 1", step.d)));
    }
    let (d, k) = (step.d, step.k());
    let mut s = Schedule::new(p);
    let world: Vec<usize> = (0..p).collect();
    let e = ENTRY_BYTES;
    match step.algo {
        Algorithm::Topka => {
            for w in 0..p {
                bruck(&mut s, &world, w, &vec![e * k; p], false, T_TOPKA);
            }
        }
        Algorithm::Topkdsa => {
            let (sent, reduced) = match &step.observed {
                Observed::TopkDsa { sent, reduced } => {
                    check_len("TopkDSA sent", sent, p)?;
                    for row in sent {
                        check_len("TopkDSA sent row", row, p)?;
                    }
                    check_len("TopkDSA reduced", reduced, p)?;
                    (sent.clone(), reduced.clone())
                }
                Observed::Worst => (
                    vec![(0..p).map(|j| len_of(k, p, j)).collect(); p],
                    (0..p).map(|j| len_of(d, p, j)).collect(),
                ),
                o => return Err(bad(format!("TopkDSA cannot use {o:?}"))),
            };
            let block: Vec<usize> = (0..p)
                .map(|j| {
                    let len = len_of(d, p, j);
                    // A 4-byte dense/sparse flag, then values or entries.
                    4 + if e * reduced[j] > 4 * len {
                        4 * len
                    } else {
                        e * reduced[j]
                    }
                })
                .collect();
            for (w, mine) in sent.iter().enumerate() {
                for (dest, src) in direct_exchanges(p, w) {
                    s.sendrecv(w, dest, e * mine[dest], src, T_DSA_RS, false);
                }
                bruck(&mut s, &world, w, &block, true, T_DSA_AG);
            }
        }
        Algorithm::Gtopk => {
            // The binomial reduce to rank 0 and broadcast, every message k entries.
            for w in 0..p {
                let mut steps: Vec<Step> = Vec::new();
                reduce_binomial(&mut steps, 0..e * k, p, w, 0, T_GT_REDUCE);
                bcast_binomial(&mut steps, 0..e * k, p, w, 0, T_GT_BCAST);
                push_schedule(&mut s, w, &steps, 1);
            }
        }
        Algorithm::Cltk => {
            let leader = (step.step % p as u64) as usize;
            let bcast =
                DenseCase::new(Collective::Broadcast, Algorithm::Binomial, k).with_root(leader);
            world_dense(&mut s, &bcast, CTX_BCAST)?;
            let ar = DenseCase::new(Collective::Allreduce, default_allreduce(p, 4 * k), k);
            world_dense(&mut s, &ar, CTX_ALLREDUCE)?;
        }
        Algorithm::Spardl | Algorithm::SpardlRsag | Algorithm::SpardlBsag => {
            spardl(&mut s, step, p)?;
        }
        Algorithm::Hitopk => hitopk(&mut s, step, p, rpn)?,
        Algorithm::Oktopk => oktopk(&mut s, step, p)?,
        Algorithm::Exdyna => {
            let kt = match &step.observed {
                Observed::ExDyna { selected } => {
                    check_len("ExDyna selected", selected, p)?;
                    selected.clone()
                }
                Observed::Worst => vec![k; p],
                o => return Err(bad(format!("ExDyna cannot use {o:?}"))),
            };
            let m_t = kt.iter().copied().max().unwrap_or(0);
            // The count, plus the threshold on a warm-start step.
            let warm = step.exdyna_warm_start && step.step < EXDYNA_WARM_STEPS && k < step.d;
            let head = if warm { 8 } else { 4 };
            for w in 0..p {
                bruck(&mut s, &world, w, &vec![head; p], false, T_EX_COUNTS);
                bruck(&mut s, &world, w, &vec![4 * m_t; p], false, T_EX_IDX);
            }
            // The values at the union, and the ranks' local errors ‖e_{i,t}‖ (P words).
            let u: usize = kt.iter().sum::<usize>() + p;
            let ar = DenseCase::new(Collective::Allreduce, default_allreduce(p, 4 * u), u);
            world_dense(&mut s, &ar, CTX_ALLREDUCE)?;
        }
        _ => unreachable!("checked is_sparse"),
    }
    Ok(s)
}

fn spardl(s: &mut Schedule, step: &SparseStep, p: usize) -> Result<()> {
    let lay = spardl_layout(step, p)?;
    let (m, kb) = (lay.m, lay.k_block);
    let e = ENTRY_BYTES;
    // B-SAG: the h-entry blocks between teams and the final blocks of each position.
    let (h, fin): (Vec<usize>, Vec<usize>) = match (&step.observed, step.algo) {
        (_, Algorithm::Spardl | Algorithm::SpardlRsag) => (vec![0; m], vec![kb; m]),
        (Observed::Bsag { h, gathered }, _) => {
            check_len("B-SAG h", h, m)?;
            check_len("B-SAG gathered", gathered, m)?;
            (
                h.iter().map(|&h| lay.bsag_h(h)).collect(),
                gathered.iter().map(|&n| n.min(kb)).collect(),
            )
        }
        (Observed::Worst, _) => (vec![kb; m], vec![kb; m]),
        (o, _) => return Err(bad(format!("B-SAG cannot use {o:?}"))),
    };
    for w in 0..p {
        let (t, q) = (w / m, w % m);
        let team: Vec<usize> = (0..m).map(|j| lay.rank(t, j)).collect();
        for r in srs_rounds(m, q) {
            s.sendrecv(w, team[r.to], e * kb * r.count, team[r.from], T_SRS, false);
        }
        match step.algo {
            Algorithm::SpardlRsag => {
                for partner in lay.rsag_partners(t, q) {
                    s.sendrecv(w, partner, e * kb, partner, T_SAG, false);
                }
            }
            Algorithm::SpardlBsag => {
                let cross: Vec<usize> = (0..lay.teams).map(|x| lay.rank(x, q)).collect();
                bruck(s, &cross, t, &vec![e * h[q]; lay.teams], true, T_SAG);
            }
            _ => {}
        }
        let block: Vec<usize> = fin.iter().map(|&n| e * n).collect();
        bruck(
            s,
            &team,
            q,
            &block,
            step.algo == Algorithm::SpardlBsag,
            T_AG,
        );
    }
    Ok(())
}

/// Ok-Topk (Li & Hoefler, PPoPP'22): the phases of [`OktopkStep::phases`] with the counts of
/// `step.observed`.
fn oktopk(s: &mut Schedule, step: &SparseStep, p: usize) -> Result<()> {
    let (d, k) = (step.d, step.k());
    let at = OktopkStep::at(step.step, step.oktopk_tau, step.oktopk_rebalance);
    let (sent, gathered) = match &step.observed {
        Observed::OkTopk { sent, gathered } => {
            check_len("Ok-Topk sent", sent, p)?;
            for row in sent {
                check_len("Ok-Topk sent row", row, p)?;
            }
            check_len("Ok-Topk gathered", gathered, p)?;
            (sent.clone(), gathered.clone())
        }
        Observed::Worst => {
            let sent = vec![(0..p).map(|j| len_of(k, p, j)).collect::<Vec<_>>(); p];
            let gathered = (0..p)
                .map(|j| {
                    if at.reestimate {
                        (p * len_of(k, p, j)).min(len_of(d, p, j))
                    } else {
                        len_of(k, p, j)
                    }
                })
                .collect();
            (sent, gathered)
        }
        o => return Err(bad(format!("Ok-Topk cannot use {o:?}"))),
    };
    let world: Vec<usize> = (0..p).collect();
    let gathered: Vec<usize> = gathered.iter().map(|&n| ENTRY_BYTES * n).collect();
    for (w, mine) in sent.iter().enumerate() {
        for phase in at.phases() {
            match phase {
                OktopkPhase::Boundaries => {
                    let b = COUNT_BYTES * (p - 1);
                    bruck(s, &world, w, &vec![b; p], false, T_OK_BOUNDS);
                }
                OktopkPhase::Counts => {
                    for (dest, src) in direct_exchanges(p, w) {
                        s.sendrecv(w, dest, COUNT_BYTES, src, T_OK_COUNTS, false);
                    }
                }
                OktopkPhase::Reduce => {
                    for (dest, src) in direct_exchanges(p, w) {
                        let bytes = ENTRY_BYTES * mine[dest];
                        s.sendrecv(w, dest, bytes, src, T_OK_REDUCE, false);
                    }
                }
                OktopkPhase::GatherCounts => {
                    bruck(s, &world, w, &vec![COUNT_BYTES; p], false, T_OK_GCOUNTS);
                }
                OktopkPhase::Gather => bruck(s, &world, w, &gathered, false, T_OK_GATHER),
            }
        }
    }
    Ok(())
}

fn hitopk(s: &mut Schedule, step: &SparseStep, p: usize, rpn: usize) -> Result<()> {
    let n = step.ranks_per_node.unwrap_or(rpn);
    if n == 0 || p % n != 0 {
        return Err(bad(format!(
            "HiTopKComm: {n} ranks per node do not divide P = {p}"
        )));
    }
    let (d, m) = (step.d, p / n);
    let kn = |j: usize| {
        let len = len_of(d, n, j);
        ((step.density * len as f64).ceil() as usize).min(len)
    };
    let (selected, summed) = match &step.observed {
        Observed::HiTopK { selected, summed } => {
            check_len("HiTopKComm selected", selected, p)?;
            check_len("HiTopKComm summed", summed, n)?;
            (selected.clone(), summed.clone())
        }
        Observed::Worst => (
            (0..p).map(|r| kn(r % n)).collect(),
            (0..n).map(|j| (m * kn(j)).min(len_of(d, n, j))).collect(),
        ),
        o => return Err(bad(format!("HiTopKComm cannot use {o:?}"))),
    };
    let elem = if step.f16_wire { 2 } else { 4 };
    let entry = if step.f16_wire { 6 } else { ENTRY_BYTES };
    // 1. Ring reduce-scatter inside each node.
    let rs = DenseCase::new(Collective::ReduceScatter, Algorithm::Ring, d).with_elem_bytes(elem);
    let sub = dense_schedule(&rs, n, n)?;
    for node in 0..m {
        let map: Vec<usize> = (0..n).map(|j| node * n + j).collect();
        append(s, &sub, &map, CTX_RS);
    }
    let intra_block: Vec<usize> = summed.iter().map(|&u| ENTRY_BYTES * u).collect();
    for w in 0..p {
        let (node, j) = (w / n, w % n);
        // 3. All-gather of the selections among the ranks with local index j.
        let inter: Vec<usize> = (0..m).map(|x| x * n + j).collect();
        let block: Vec<usize> = inter.iter().map(|&r| entry * selected[r]).collect();
        bruck(s, &inter, node, &block, true, T_HI_INTER);
        // 4. All-gather of the summed slices inside the node.
        let intra: Vec<usize> = (0..n).map(|x| node * n + x).collect();
        bruck(s, &intra, j, &intra_block, true, T_HI_INTRA);
    }
    Ok(())
}

/// Exact time, rounds and bytes per rank of one step of a sparse all-reduce on `topo`
/// (equal to what `SimComm` measures when the counts in `step.observed` are the step's).
pub fn replay_sparse(step: &SparseStep, topo: &Topology) -> Result<Prediction> {
    topo.validate()?;
    sparse_schedule(step, topo.ranks(), topo.ranks_per_node)?.evaluate(topo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ceil_log2;
    use crate::sparse::{predict_sparse, SparseCase};
    use crate::Link;

    const LINK: Link = Link::new(5e-5, 8e-9);

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-15
    }

    fn table(algo: Algorithm, d: usize, density: f64, teams: Option<usize>, t: &Topology) -> f64 {
        let case = SparseCase {
            algo,
            d,
            density,
            teams,
        };
        predict_sparse(&case, t).unwrap().time_s
    }

    fn replay(step: &SparseStep, t: &Topology) -> Prediction {
        replay_sparse(step, t).unwrap()
    }

    fn lg(p: usize) -> u64 {
        ceil_log2(p) as u64
    }

    #[test]
    fn topka_is_table_1_for_any_p() {
        for p in 1..=9 {
            let t = Topology::flat(p, LINK).unwrap();
            for (d, rho) in [(1000, 0.01), (777, 0.1)] {
                let step = SparseStep::new(Algorithm::Topka, d, rho);
                let r = replay(&step, &t);
                let k = step.k() as u64;
                assert!(close(r.time_s, table(Algorithm::Topka, d, rho, None, &t)));
                assert_eq!(r.rounds, lg(p));
                assert_eq!(r.bytes_recv, 8 * k * (p as u64 - 1));
            }
        }
    }

    #[test]
    fn gtopk_is_table_1_on_powers_of_two_and_below_elsewhere() {
        for p in 1..=17 {
            let t = Topology::flat(p, LINK).unwrap();
            let r = replay(&SparseStep::new(Algorithm::Gtopk, 1000, 0.02), &t);
            let want = table(Algorithm::Gtopk, 1000, 0.02, None, &t);
            if p.is_power_of_two() {
                assert!(close(r.time_s, want), "P={p}: {} vs {want}", r.time_s);
                // Rank 0 receives log P and sends log P messages of k entries.
                assert_eq!(r.per_rank[0].rounds, 2 * lg(p));
                assert_eq!(r.per_rank[0].bytes_recv, lg(p) * 8 * 20);
            } else {
                assert!(r.time_s < want, "P={p}");
            }
        }
    }

    #[test]
    fn spardl_and_rsag_are_table_1() {
        // d = 64·P and ρ = 1/8: k_b = 8 per block and k = ⌈ρ·d⌉ = P·k_b, as Table 1 counts.
        for p in 1..=12 {
            let t = Topology::flat(p, LINK).unwrap();
            let d = 64 * p;
            let r = replay(&SparseStep::new(Algorithm::Spardl, d, 0.125), &t);
            assert!(
                close(r.time_s, table(Algorithm::Spardl, d, 0.125, None, &t)),
                "P={p}"
            );
            assert_eq!(r.rounds, 2 * lg(p));
            for teams in [2usize, 4] {
                if p % teams != 0 || p == teams {
                    continue;
                }
                let step = SparseStep::new(Algorithm::SpardlRsag, d, 0.125).with_teams(teams);
                let r = replay(&step, &t);
                let want = table(Algorithm::SpardlRsag, d, 0.125, Some(teams), &t);
                assert!(
                    close(r.time_s, want),
                    "P={p} teams {teams}: {} vs {want}",
                    r.time_s
                );
            }
        }
    }

    #[test]
    fn bsag_worst_case_is_table_1_plus_frames() {
        // Full density: h = k_b, nothing in common between teams (Table 1's worst case).
        // The Bruck all-gathers of B-SAG put a 4-byte length before each of the
        // (teams − 1) + (m − 1) blocks a rank receives; Table 1 does not count them.
        for (p, teams) in [(4usize, 2usize), (4, 4), (8, 2), (8, 4), (16, 4), (16, 8)] {
            let t = Topology::flat(p, LINK).unwrap();
            let d = 16 * p;
            let step = SparseStep::new(Algorithm::SpardlBsag, d, 1.0).with_teams(teams);
            let r = replay(&step, &t);
            let m = p / teams;
            let frames = (FRAME_BYTES * (teams - 1 + m - 1)) as f64;
            let want = table(Algorithm::SpardlBsag, d, 1.0, Some(teams), &t)
                + frames * LINK.beta_s_per_byte;
            assert!(
                close(r.time_s, want),
                "P={p} teams {teams}: {} vs {want}",
                r.time_s
            );
        }
    }

    #[test]
    fn topkdsa_worst_case_bandwidth_is_table_1() {
        // Worst case: k spread evenly over the P blocks, every reduced block dense. The
        // bytes are Table 1's (P − 1)/P·(2k + n) words plus 8 bytes per all-gathered block
        // (dense/sparse flag and length). The rounds are P − 1 + ⌈log2 P⌉, where Table 1
        // counts SparCML's P + 2 log P.
        for p in [1usize, 2, 4, 8, 16] {
            let t = Topology::flat(p, LINK).unwrap();
            let (d, rho) = (1600, 0.04); // k = 64, P | k, P | d
            let r = replay(&SparseStep::new(Algorithm::Topkdsa, d, rho), &t);
            let (pf, k, n) = (p as f64, 64.0, d as f64);
            let bytes = 4.0 * (pf - 1.0) / pf * (2.0 * k + n) + 8.0 * (pf - 1.0);
            assert_eq!(r.bytes_recv as f64, bytes, "P={p}");
            assert_eq!(r.bytes_sent as f64, bytes, "P={p}");
            let rounds = (p - 1) as u64 + lg(p);
            assert_eq!(r.rounds, rounds);
            let want = rounds as f64 * LINK.alpha_s + bytes * LINK.beta_s_per_byte;
            assert!(close(r.time_s, want), "P={p}");
            if p > 1 {
                let paper = table(Algorithm::Topkdsa, d, rho, None, &t);
                let l = lg(p) as f64;
                let diff = (pf + 2.0 * l - rounds as f64) * LINK.alpha_s
                    - 8.0 * (pf - 1.0) * LINK.beta_s_per_byte;
                assert!(close(paper - r.time_s, diff), "P={p}");
            }
        }
    }

    #[test]
    fn cltk_and_exdyna_are_their_closed_forms_with_rabenseifner() {
        // Payloads of 8 KiB and more on powers of two: the chosen all-reduce is
        // Rabenseifner's, as the closed forms assume.
        for p in [2usize, 4, 8, 16] {
            let t = Topology::flat(p, LINK).unwrap();
            for step in [0u64, 1, 5] {
                let mut s = SparseStep::new(Algorithm::Cltk, 8192, 0.25); // k = 2048
                s.step = step;
                let r = replay(&s, &t);
                let want = table(Algorithm::Cltk, 8192, 0.25, None, &t);
                assert!(close(r.time_s, want), "CLT-k P={p}: {} vs {want}", r.time_s);
            }
            // ExDyna worst case: every rank selects k, the union has P·k ≤ d entries.
            let d = 2048 * p * 2;
            let r = replay(&SparseStep::new(Algorithm::Exdyna, d, 0.5 / p as f64), &t);
            let want = table(Algorithm::Exdyna, d, 0.5 / p as f64, None, &t);
            assert!(
                close(r.time_s, want),
                "ExDyna P={p}: {} vs {want}",
                r.time_s
            );
        }
    }

    #[test]
    fn hitopk_worst_case_is_paper_001_with_indices_and_frames() {
        // MSTopK/HiTopKComm (Shi et al., MLSys 2021) Eq. 9-10 count 4 bytes per selected value; the
        // implementation sends 8 (index and value) and a 4-byte length per block. With n | d, n·m |
        // ρ·d and disjoint selections across nodes, the replay is Eq. 7-10 with those bytes.
        let intra = Link::new(3e-6, 2e-11);
        for (m, n) in [(1usize, 4usize), (2, 2), (4, 2), (2, 4), (4, 4), (8, 1)] {
            let t = Topology::new(m, n, intra, LINK).unwrap();
            let (d, rho) = (4096usize, 0.125);
            let r = replay(&SparseStep::new(Algorithm::Hitopk, d, rho), &t);
            let paper = table(Algorithm::Hitopk, d, rho, None, &t);
            let (mf, nf, df) = (m as f64, n as f64, d as f64);
            let extra = LINK.beta_s_per_byte
                * (4.0 * (mf - 1.0) * rho * df / nf + 4.0 * (mf - 1.0))
                + intra.beta_s_per_byte
                    * (4.0 * (nf - 1.0) * rho * df * mf / nf + 4.0 * (nf - 1.0));
            assert!(
                close(r.time_s, paper + extra),
                "{m}×{n}: {} vs {}",
                r.time_s,
                paper + extra
            );
        }
    }

    #[test]
    fn oktopk_rounds_and_nominal_bytes() {
        // k = 4P: 4 entries per rank and region; a re-estimation step gathers all 4P of a
        // region (disjoint), the others 4.
        for p in 1..=17usize {
            let t = Topology::flat(p, LINK).unwrap();
            let (d, rho) = (100 * p, 0.04);
            for step in [0u64, 1, 32, 64, 65] {
                let mut s = SparseStep::new(Algorithm::Oktopk, d, rho);
                s.step = step;
                let r = replay(&s, &t);
                let at = OktopkStep::at(step, OKTOPK_TAU, OKTOPK_REBALANCE);
                let (l, pm) = (lg(p), p as u64 - 1);
                let rebalance = if at.rebalance { l } else { 0 };
                assert_eq!(r.rounds, 2 * pm + 2 * l + rebalance, "P={p} step {step}");
                let gathered = if at.reestimate { 4 * p as u64 } else { 4 };
                let bounds = if at.rebalance { 4 * pm * pm } else { 0 };
                let bytes = bounds + 2 * 4 * pm + 8 * 4 * pm + 8 * gathered * pm;
                assert_eq!(r.bytes_recv, bytes, "P={p} step {step}");
            }
        }
        // Periods of the step, and observed counts of the wrong shape.
        let mut s = SparseStep::new(Algorithm::Oktopk, 400, 0.04);
        s.step = 3;
        s.oktopk_tau = 3;
        s.oktopk_rebalance = 100;
        let t = Topology::flat(4, LINK).unwrap();
        assert_eq!(replay(&s, &t).rounds, 2 * 3 + 2 * 2);
        let bad = s.with_observed(Observed::OkTopk {
            sent: vec![vec![1; 4]; 3],
            gathered: vec![1; 4],
        });
        assert!(replay_sparse(&bad, &t).is_err());
    }

    #[test]
    fn bad_steps_are_errors() {
        let t = Topology::flat(4, LINK).unwrap();
        let bad = |s: SparseStep| replay_sparse(&s, &t).is_err();
        assert!(bad(SparseStep::new(Algorithm::Ring, 100, 0.1)));
        assert!(bad(SparseStep::new(Algorithm::Topka, 100, 0.0)));
        assert!(bad(SparseStep::new(Algorithm::Topka, 3, 0.5)));
        assert!(bad(
            SparseStep::new(Algorithm::SpardlRsag, 100, 0.1).with_teams(3)
        ));
        assert!(bad(SparseStep::new(Algorithm::Exdyna, 100, 0.1)
            .with_observed(Observed::ExDyna {
                selected: vec![1; 3]
            })));
        assert!(bad(SparseStep::new(Algorithm::Topkdsa, 100, 0.1)
            .with_observed(Observed::ExDyna {
                selected: vec![1; 4]
            })));
        let mut s = SparseStep::new(Algorithm::Hitopk, 100, 0.1);
        s.ranks_per_node = Some(3);
        assert!(bad(s));
    }
}
