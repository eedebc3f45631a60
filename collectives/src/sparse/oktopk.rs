//! Ok-Topk (Li & Hoefler, PPoPP'22), SparDL (Zhao et al.)'s main baseline and a row of its
//! Table 1, in the round structure of the authors' code:
//!
//! 1. **Local selection by threshold.** Every `τ` steps the local threshold is re-derived
//!    as the `k`-th largest magnitude of the accumulated gradient (an exact top-k); in
//!    between it is reused, raised by ×1.03 (at most 5 times) while it would pass more than
//!    `4k/3` entries, and nudged by ×/÷1.012 when the selection leaves `[2k/3, 5k/4]`.
//!    A rank selects its non-zero entries at or above the threshold.
//! 2. **Balanced regions.** `d` is split into `P` regions, region `j` owned by rank `j`.
//!    Every `τ'` steps each rank proposes the `P − 1` indices that split its own selection
//!    into `P` equal counts; the new boundaries are the means of all proposals (one Bruck
//!    all-gather), so every owner receives about the same number of entries.
//! 3. **Split reduce-scatter.** The counts, then the entries of region `j`, go straight to
//!    rank `j` (`P − 1` direct exchanges each); the owner sums them in rank order.
//! 4. **Global selection and all-gather.** On a re-estimation step every reduced entry is
//!    all-gathered and the update is their exact top-k, whose smallest magnitude becomes
//!    the global threshold; on the other steps each owner keeps the entries of its region
//!    at or above that threshold and only those are all-gathered (counts first), and the
//!    threshold is nudged by ×/÷1.008 when they leave `[2k/3, 4k/3]` (every rank sees the
//!    same counts, so every rank holds the same threshold).
//!
//! Residuals: a rank's accumulated gradient stays in its residual except at the indices it
//! selected that made it into the update, which are zeroed (the authors' `involved_indexes`),
//! so no mass is lost. The update is the sum of the contributions divided by P.
//!
//! Cost: `2(P − 1) + 2⌈log2 P⌉` rounds (`⌈log2 P⌉` more on a re-balancing step): SparDL
//! (Zhao et al.) Table 1 writes `2(P + log P)α`, counting `P` for each phase of direct
//! exchanges. The bandwidth depends on the data; Table 1's `[2k(P−1)/P, 6k(P−1)/P]` words
//! is for the steps between re-estimations (a re-estimation step all-gathers every reduced
//! entry). The dense warm-up of the authors' training script (512 steps) is a training
//! schedule, not part of the collective, and is not done here.

use cost_model::plan::bounds;
use cost_model::plan::sparse::{direct_exchanges, OktopkPhase, OktopkStep, COUNT_BYTES};
use sparsify::SparseGrad;

use super::common::{bruck, sum_ordered, tags, topk_entries, Config, Counting, Entries, Group};
use super::scaffold::{self, accessors, constructor, counted_step};
use super::{SparseAllreduce, StepStats};
use crate::{Communicator, Error, Result};

/// The authors' factor for nudging the reused local threshold.
const NUDGE: f32 = 1.012;
/// The authors' factor for raising a reused local threshold that passes too much, and how
/// many times at most.
const RAISE: f32 = 1.03;
const RAISES: usize = 5;
/// The authors' factor for nudging the reused global threshold.
const NUDGE_GLOBAL: f32 = 1.008;

/// Ok-Topk; see the module docs.
pub struct OkTopk {
    cfg: Config,
    tau: u32,
    rebalance: u32,
    /// Steps done.
    t: u64,
    /// Accumulated gradient not yet in an update (error feedback).
    resid: Vec<f32>,
    local_th: f32,
    global_th: f32,
    /// The `P + 1` region boundaries.
    bounds: Vec<usize>,
    /// Last step: entries this rank sent to each region (its own included).
    sent: Vec<usize>,
    /// Last step: entries of each region in the all-gather (the same on every rank).
    gathered: Vec<usize>,
}

impl OkTopk {
    constructor!(
        OkTopk {
            tau: u32,
            rebalance: u32
        },
        "Ok-Topk"
    );

    pub(crate) fn from_config(cfg: Config) -> Self {
        let (tau, rebalance) = cfg.opts.oktopk.unwrap_or((1, 1));
        OkTopk {
            tau,
            rebalance,
            t: 0,
            resid: vec![0.0; cfg.d],
            local_th: 0.0,
            global_th: 0.0,
            bounds: bounds(cfg.d, cfg.p, 0),
            sent: vec![0; cfg.p],
            gathered: vec![0; cfg.p],
            cfg,
        }
    }

    /// Entries this rank sent to each region in the last step (`Observed::OkTopk::sent`).
    pub fn last_sent(&self) -> &[usize] {
        &self.sent
    }

    /// Entries of each region in the last all-gather (`Observed::OkTopk::gathered`).
    pub fn last_gathered(&self) -> &[usize] {
        &self.gathered
    }

    /// The `P + 1` region boundaries the next step uses (unless it re-balances).
    pub fn boundaries(&self) -> &[usize] {
        &self.bounds
    }

    /// The local threshold the next step reuses (unless it re-estimates).
    pub fn local_threshold(&self) -> f32 {
        self.local_th
    }

    /// The global threshold the next step reuses (unless it re-estimates).
    pub fn global_threshold(&self) -> f32 {
        self.global_th
    }

    fn region(&self, j: usize) -> std::ops::Range<usize> {
        self.bounds[j]..self.bounds[j + 1]
    }
}

impl SparseAllreduce for OkTopk {
    accessors!("oktopk", |s| &s.resid);
    counted_step!();
}

/// The `k`-th largest magnitude of `x`, 0 when `k ≥ len` (every entry is then in the
/// top-k). `x` is finite.
fn kth_magnitude(x: &[f32], k: usize) -> f32 {
    if k == 0 || k >= x.len() {
        return 0.0;
    }
    // Non-negative floats order as their bits.
    let mut m: Vec<u32> = x.iter().map(|v| v.abs().to_bits()).collect();
    let (_, nth, _) = m.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    f32::from_bits(*nth)
}

/// Whether `v` passes threshold `th` (zeros never do: they carry no mass).
fn passes(v: f32, th: f32) -> bool {
    v != 0.0 && v.abs() >= th
}

fn corrupt(what: &'static str, detail: String) -> Error {
    Error::Mismatch { what, detail }
}

/// A received count, checked against the most entries it may announce.
fn read_count(bytes: &[u8], max: usize, from: usize) -> Result<usize> {
    let b: [u8; COUNT_BYTES] = bytes.try_into().map_err(|_| {
        corrupt(
            "message length",
            format!(
                "Ok-Topk: a count from rank {from} has {} bytes, not {COUNT_BYTES}",
                bytes.len()
            ),
        )
    })?;
    let n = u32::from_le_bytes(b) as usize;
    if n > max {
        return Err(corrupt(
            "entry count",
            format!("Ok-Topk: rank {from} announced {n} entries for a region of {max}"),
        ));
    }
    Ok(n)
}

impl OkTopk {
    /// One step on the counting adapter `cc` (see [`SparseAllreduce::step`]).
    fn run(&mut self, cc: &Counting, grad: &[f32]) -> Result<(SparseGrad<f32>, StepStats)> {
        let (p, d, k, me) = (self.cfg.p, self.cfg.d, self.cfg.k(), self.cfg.rank);
        scaffold::check_finite(grad)?;
        scaffold::accumulate(&mut self.resid, grad);
        let at = OktopkStep::at(self.t, self.tau, self.rebalance);
        if at.reestimate {
            self.local_th = kth_magnitude(&self.resid, k);
        }
        // One pass over the residual; a raised threshold only drops entries already
        // selected, so the raises filter the selection rather than the whole vector.
        let mut sel: Vec<u32> = (0..d as u32)
            .filter(|&i| passes(self.resid[i as usize], self.local_th))
            .collect();
        if !at.reestimate {
            for _ in 0..RAISES {
                if 3 * sel.len() <= 4 * k {
                    break;
                }
                self.local_th *= RAISE;
                let (th, resid) = (self.local_th, &self.resid);
                sel.retain(|&i| passes(resid[i as usize], th));
            }
        }
        // The authors' nudge of the reused threshold.
        if 3 * sel.len() < 2 * k {
            self.local_th /= NUDGE;
        } else if 4 * sel.len() > 5 * k {
            self.local_th *= NUDGE;
        }
        let world = Group::world(p, me);
        let mut parts = Vec::new();
        let mut counts = Vec::new();
        let mut reduced = Entries::default();
        let mut mine = Entries::default();
        let mut update = Entries::default();
        for phase in at.phases() {
            match phase {
                OktopkPhase::Boundaries => self.rebalance_regions(cc, &world, &sel)?,
                OktopkPhase::Counts => {
                    parts = self.split(&sel);
                    counts = self.exchange_counts(cc, &parts)?;
                }
                OktopkPhase::Reduce => {
                    reduced = self.reduce(cc, std::mem::take(&mut parts), &counts)?;
                }
                OktopkPhase::GatherCounts => {
                    let th = if at.reestimate { 0.0 } else { self.global_th };
                    mine = above(&reduced, th);
                    self.gathered = self.gather_counts(cc, &world, mine.len())?;
                }
                OktopkPhase::Gather => update = self.gather(cc, &world, &mine, at.reestimate, k)?,
            }
        }
        // Residual: zero what this rank contributed to the update.
        let mut g = update.idx.iter().peekable();
        for &i in &sel {
            while g.next_if(|&&u| u < i).is_some() {}
            if g.peek() == Some(&&i) {
                self.resid[i as usize] = 0.0;
            }
        }
        self.t += 1;
        scaffold::finish(&self.cfg, &update, cc.counts(), sel.len())
    }

    /// [`OktopkPhase::Boundaries`]: all-gather every rank's proposal and take the means.
    fn rebalance_regions(&mut self, cc: &Counting, world: &Group, sel: &[u32]) -> Result<()> {
        let (p, d) = (self.cfg.p, self.cfg.d);
        let mine: Vec<u32> = if sel.len() >= p {
            let chunk = sel.len() / p;
            (1..p).map(|i| sel[chunk * i]).collect()
        } else {
            bounds(d, p, 0)[1..p].iter().map(|&b| b as u32).collect()
        };
        let size = COUNT_BYTES * (p - 1);
        let all = bruck(
            cc,
            world,
            bytemuck::cast_slice(&mine).to_vec(),
            Some(&vec![size; p]),
            tags::OK_BOUNDS,
        )?;
        let mut sum = vec![0u64; p - 1];
        for (r, b) in all.iter().enumerate() {
            let prop: Vec<u32> = bytemuck::pod_collect_to_vec(b);
            let sorted = prop.windows(2).all(|w| w[0] <= w[1]);
            if prop.len() != p - 1 || !sorted || prop.last().is_some_and(|&x| x as usize > d) {
                return Err(corrupt(
                    "region boundaries",
                    format!("Ok-Topk: rank {r} proposed {prop:?} for d = {d}"),
                ));
            }
            for (s, &x) in sum.iter_mut().zip(&prop) {
                *s += u64::from(x);
            }
        }
        let mut b = Vec::with_capacity(p + 1);
        b.push(0);
        b.extend(sum.iter().map(|&s| (s / p as u64) as usize));
        b.push(d);
        self.bounds = b;
        Ok(())
    }

    /// This rank's selection split by region, with the accumulated values.
    fn split(&mut self, sel: &[u32]) -> Vec<Entries> {
        let parts: Vec<Entries> = (0..self.cfg.p)
            .map(|j| {
                let r = self.region(j);
                let a = sel.partition_point(|&i| (i as usize) < r.start);
                let b = sel.partition_point(|&i| (i as usize) < r.end);
                let idx = sel[a..b].to_vec();
                let val = idx.iter().map(|&i| self.resid[i as usize]).collect();
                Entries { idx, val }
            })
            .collect();
        self.sent = parts.iter().map(Entries::len).collect();
        parts
    }

    /// [`OktopkPhase::Counts`]: how many entries each rank will send to this one.
    fn exchange_counts(&self, cc: &Counting, parts: &[Entries]) -> Result<Vec<usize>> {
        let (p, me) = (self.cfg.p, self.cfg.rank);
        let max = self.region(me).len();
        let mut counts = vec![0usize; p];
        for (dest, src) in direct_exchanges(p, me) {
            let n = (parts[dest].len() as u32).to_le_bytes();
            let got = cc.sendrecv(dest, tags::OK_COUNTS, &n, src, tags::OK_COUNTS)?;
            counts[src] = read_count(&got, max, src)?;
        }
        Ok(counts)
    }

    /// [`OktopkPhase::Reduce`]: this rank's region, summed in rank order.
    fn reduce(&self, cc: &Counting, mut parts: Vec<Entries>, counts: &[usize]) -> Result<Entries> {
        let (p, me) = (self.cfg.p, self.cfg.rank);
        let mut got_parts: Vec<Entries> = vec![Entries::default(); p];
        for (dest, src) in direct_exchanges(p, me) {
            let msg = parts[dest].encode();
            let got = cc.sendrecv(dest, tags::OK_REDUCE, &msg, src, tags::OK_REDUCE)?;
            if got.len() != 8 * counts[src] {
                return Err(corrupt(
                    "message length",
                    format!(
                        "Ok-Topk: rank {src} announced {} entries and sent {} bytes",
                        counts[src],
                        got.len()
                    ),
                ));
            }
            got_parts[src] = Entries::decode(&got, counts[src], self.region(me))?.0;
            cc.add_items(counts[src]);
        }
        got_parts[me] = std::mem::take(&mut parts[me]);
        let refs: Vec<&Entries> = got_parts.iter().collect();
        Ok(sum_ordered(&refs))
    }

    /// [`OktopkPhase::GatherCounts`]: every region's count of selected entries.
    fn gather_counts(&self, cc: &Counting, world: &Group, n: usize) -> Result<Vec<usize>> {
        let p = self.cfg.p;
        let head = (n as u32).to_le_bytes().to_vec();
        let heads = bruck(
            cc,
            world,
            head,
            Some(&vec![COUNT_BYTES; p]),
            tags::OK_GCOUNTS,
        )?;
        heads
            .iter()
            .enumerate()
            .map(|(j, b)| read_count(b, self.region(j).len(), j))
            .collect()
    }

    /// [`OktopkPhase::Gather`]: every region's selection, everywhere; on a re-estimation
    /// step (every reduced entry was gathered) their exact top-k, whose smallest magnitude
    /// is the new global threshold.
    fn gather(
        &mut self,
        cc: &Counting,
        world: &Group,
        mine: &Entries,
        reestimate: bool,
        k: usize,
    ) -> Result<Entries> {
        let sizes: Vec<usize> = self.gathered.iter().map(|&c| 8 * c).collect();
        let blocks = bruck(cc, world, mine.encode(), Some(&sizes), tags::OK_GATHER)?;
        let parts = scaffold::decode_ranges(cc, &blocks, self.cfg.rank, |j| self.region(j))?;
        let all = scaffold::concat(&parts);
        if !reestimate {
            if 3 * all.len() < 2 * k {
                self.global_th /= NUDGE_GLOBAL;
            } else if 3 * all.len() > 4 * k {
                self.global_th *= NUDGE_GLOBAL;
            }
            return Ok(all);
        }
        let (top, _) = topk_entries(&all, k);
        self.global_th = if all.len() > k {
            top.val
                .iter()
                .map(|v| v.abs())
                .fold(f32::INFINITY, f32::min)
        } else {
            0.0
        };
        Ok(top)
    }
}

/// The entries of `e` that pass threshold `th`.
fn above(e: &Entries, th: f32) -> Entries {
    let keep: Vec<usize> = (0..e.len()).filter(|&j| passes(e.val[j], th)).collect();
    Entries {
        idx: keep.iter().map(|&j| e.idx[j]).collect(),
        val: keep.iter().map(|&j| e.val[j]).collect(),
    }
}

/// Rounds of one Ok-Topk step on `p` ranks: `2(P − 1) + 2⌈log2 P⌉`, plus `⌈log2 P⌉` when
/// it re-balances.
#[cfg(test)]
fn rounds(p: usize, rebalance: bool) -> u64 {
    let l = u64::from(cost_model::plan::ceil_log2(p));
    2 * (p as u64 - 1) + 2 * l + if rebalance { l } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadComm;

    #[test]
    fn kth_magnitude_picks_the_kth_largest() {
        let x = [0.5f32, -3.0, 2.0, 0.0, -1.0];
        assert_eq!(kth_magnitude(&x, 1), 3.0);
        assert_eq!(kth_magnitude(&x, 3), 1.0);
        assert_eq!(kth_magnitude(&x, 5), 0.0);
    }

    #[test]
    fn rounds_and_regions() {
        let out = ThreadComm::run(4, |comm| -> Result<Vec<(u64, Vec<usize>)>> {
            let mut alg = OkTopk::new(&comm, 400, 0.05, 4, 2)?;
            let mut v = Vec::new();
            for s in 0..5 {
                // Mass on the first quarter of d: the regions must shrink there.
                let g: Vec<f32> = (0..400)
                    .map(|i| {
                        let w = if i < 100 { 1.0 } else { 0.01 };
                        w * (((i * 37 + comm.rank() * 11 + s * 5) % 97) as f32 + 1.0)
                    })
                    .collect();
                let (_, st) = alg.step(&comm, &g)?;
                v.push((st.rounds, alg.boundaries().to_vec()));
            }
            Ok(v)
        })
        .unwrap();
        for (s, (r, _)) in out[0].iter().enumerate() {
            assert_eq!(*r, rounds(4, s % 2 == 0), "step {s}");
        }
        let b = &out[0][0].1;
        assert!(b[3] <= 100, "regions not re-balanced: {b:?}");
        for rank in &out {
            assert_eq!(rank[0].1, *b);
        }
    }
}
