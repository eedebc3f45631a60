//! SparDL (Zhao et al., §3): Spar-Reduce-Scatter (SRS) with the non-recursive partner
//! structure for any P, global residual collection (Algorithm 1), a final Bruck
//! all-gather, and the Spar-All-Gather variants R-SAG (teams a power of two) and B-SAG
//! (any team count, with Algorithm 2's adjustment of `h`).
//!
//! Blocks (from the authors' code): `chunk = ⌈d / m⌉` for `m` ranks per team,
//! padded to `chunk · m`; `k_block = max(1, ⌊chunk · density⌋)` (the authors' code has no
//! `max`, and moves nothing where the floor is 0). SRS partners: `rounds =
//! ⌈log2 m⌉`, bag sizes `[2^i for i < rounds − 1] + [m − 2^(rounds−1)]` reversed, `gap =
//! m − sizes[0]`; in round `i` send bag `(pos + gap) …` (`sizes[i]` blocks) to `pos + gap`
//! and receive blocks `pos …` from `pos − gap`, then `gap /= 2`. A block is top-k'd just
//! before it is sent, after everything received for it was added (§3.1 "Optimization for
//! SRS"), so every message holds exactly `k_block` entries per block and SparDL moves
//! `2⌈log2 P⌉` rounds and `4k(P − 1)/P` numbers: Table 1, Eq. 3.
//!
//! Global residual collection (§3.2, Algorithm 1 lines 3, 8, 12-14): every selection keeps
//! what it discarded in the selecting rank's work buffer (local and in-procedure
//! residuals); at the end the residual is that buffer at the indices of the final global
//! gradient, and the rank's own accumulated gradient elsewhere (local and end-procedure
//! residuals). Across ranks nothing is lost. R-SAG and B-SAG discard after sums that
//! several ranks hold identically; each holder keeps its share (`1/2^(s+1)` at R-SAG step
//! `s`, generalising the paper's "half" of the first step; `1/d` after B-SAG, §3.3).

use sparsify::{Selector, SparseGrad};

use cost_model::plan::sparse::{srs_rounds, SagKind, SpardlLayout};

use super::common::{
    self, bruck, sum_ordered, tags, topk_entries, Config, Counting, Entries, Group,
};
use super::scaffold::{self, accessors, counted_step};
use super::{SelectorKind, SparseAlgo, SparseAllreduce, StepStats};
use crate::{Communicator, Error, Result};

/// Which Spar-All-Gather SparDL runs between its teams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sag {
    /// One team: SRS then Bruck all-gather (`spardl`).
    None,
    /// R-SAG: recursive doubling between teams with a top-L after each exchange; the team
    /// count must be a power of two (`spardl_rsag`).
    Recursive,
    /// B-SAG: top-h, Bruck all-gather between teams, top-L; any team count that divides P
    /// (`spardl_bsag`).
    Bruck,
}

/// SparDL with its global residual collection; see the module docs.
pub struct SparDl {
    cfg: Config,
    sag: Sag,
    teams: usize,
    /// Ranks per team.
    m: usize,
    chunk: usize,
    kb: usize,
    pub(super) resid: Vec<f32>,
    work: Vec<f32>,
    sel: Box<dyn Selector>,
    /// B-SAG's `h`, its step and the same-direction flag (Algorithm 2).
    pub(super) h: f64,
    pub(super) h_step: f64,
    pub(super) h_flag: bool,
    /// Entries in the B-SAG sum of the last step (`N_t` of Algorithm 2).
    pub(super) last_n: usize,
}

impl SparDl {
    /// Builds SparDL with the options of [`super::SparseAlgo::SparDl`] (collective; see
    /// [`super::build`]).
    pub fn new(
        comm: &dyn Communicator,
        d: usize,
        density: f64,
        sag: Sag,
        teams: Option<usize>,
        selector: Option<sparsify::SelectorKind>,
    ) -> Result<Self> {
        let algo = SparseAlgo::SparDl {
            sag,
            teams,
            selector,
        };
        let cfg = common::setup(comm, &algo, d, density)?;
        Self::from_config(cfg, sag).map_err(|e| common::fail_together(comm, e))
    }

    pub(crate) fn from_config(cfg: Config, sag: Sag) -> Result<Self> {
        let kind = match sag {
            Sag::None => SagKind::None,
            Sag::Recursive => SagKind::Recursive,
            Sag::Bruck => SagKind::Bruck,
        };
        let lay = SpardlLayout::new(kind, cfg.opts.teams, cfg.p, cfg.d, cfg.density)?;
        let (teams, m, chunk, kb) = (lay.teams, lay.m, lay.chunk, lay.k_block);
        let l = kb as f64;
        Ok(SparDl {
            sag,
            teams,
            m,
            chunk,
            kb,
            resid: vec![0.0; cfg.d],
            work: vec![0.0; chunk * m],
            sel: common::make_selector(cfg.opts.selector, SelectorKind::Exact),
            // Algorithm 2 line 1: h = k/P, step = 0.01·k(d−1)/P (in team-block units L = dk/P).
            h: l / teams as f64,
            h_step: 0.01 * l * (teams as f64 - 1.0) / teams as f64,
            h_flag: false,
            last_n: 0,
            cfg,
        })
    }

    /// Number of teams `d` of the Spar-All-Gather (1 without SAG).
    pub fn teams(&self) -> usize {
        self.teams
    }

    /// Entries per block, `k_block = max(1, ⌊⌈d/m⌉ · density⌋)`.
    pub fn k_block(&self) -> usize {
        self.kb
    }

    /// B-SAG's current `h` (entries each rank contributes to the all-gather between teams).
    pub fn h(&self) -> f64 {
        self.h
    }

    /// B-SAG's current step of `h` (signed; its magnitude stays in `[½, L(1 − 1/d)]`).
    pub fn h_step(&self) -> f64 {
        self.h_step
    }

    /// B-SAG: entries after the last all-gather between teams (`N_t`, Algorithm 2).
    pub fn last_gathered(&self) -> usize {
        self.last_n
    }

    fn layout(&self) -> SpardlLayout {
        SpardlLayout {
            teams: self.teams,
            m: self.m,
            chunk: self.chunk,
            k_block: self.kb,
        }
    }

    fn block(&self, b: usize) -> std::ops::Range<usize> {
        b * self.chunk..(b + 1) * self.chunk
    }

    /// Top-k_block of block `b` of the work buffer; the rest stays there as residual.
    fn select_block(&mut self, b: usize) -> Result<Entries> {
        let r = self.block(b);
        let base = r.start;
        let (sg, _) = self.sel.select(&self.work[r], self.kb)?;
        if sg.nnz() != self.kb {
            return Err(Error::InvalidArgument(format!(
                "SparDL needs an exact-count selector: got {} entries for k = {}",
                sg.nnz(),
                self.kb
            )));
        }
        for &i in sg.indices() {
            self.work[base + i as usize] = 0.0;
        }
        Ok(Entries::from_local(sg.indices(), sg.values(), base))
    }

    /// Spar-Reduce-Scatter over the team; returns this rank's reduced, selected block.
    fn srs(&mut self, cc: &Counting, team: &Group) -> Result<Entries> {
        let (m, q) = (team.size(), team.me);
        for round in srs_rounds(m, q) {
            let sz = round.count;
            let mut msg = Vec::with_capacity(8 * self.kb * sz);
            for j in 0..sz {
                self.select_block((q + round.gap + j) % m)?
                    .encode_into(&mut msg);
            }
            let got = cc.sendrecv(
                team.members[round.to],
                tags::SRS,
                &msg,
                team.members[round.from],
                tags::SRS,
            )?;
            if got.len() != 8 * self.kb * sz {
                return Err(Error::Mismatch {
                    what: "message length",
                    detail: format!(
                        "SparDL SRS: rank {} expected {} bytes, got {}",
                        cc.rank(),
                        8 * self.kb * sz,
                        got.len()
                    ),
                });
            }
            let mut off = 0;
            for j in 0..sz {
                let r = self.block((q + j) % m);
                let (e, used) = Entries::decode(&got[off..], self.kb, r)?;
                off += used;
                for (&i, &v) in e.idx.iter().zip(&e.val) {
                    self.work[i as usize] += v;
                }
            }
            cc.add_items(self.kb * sz);
        }
        self.select_block(q)
    }

    /// R-SAG (§3.3 1): recursive doubling between teams, top-L after each sum.
    fn rsag(&mut self, cc: &Counting, own: Entries) -> Result<Entries> {
        let t = self.cfg.rank / self.m;
        let q = self.cfg.rank % self.m;
        let mut cur = own;
        let partners: Vec<usize> = self.layout().rsag_partners(t, q).collect();
        for (s, partner) in partners.into_iter().enumerate() {
            let other_team = partner / self.m;
            let got = cc.sendrecv(partner, tags::SAG, &cur.encode(), partner, tags::SAG)?;
            let other = Entries::decode_all(&got, self.block(q))?;
            cc.add_items(other.len());
            let sum = if t < other_team {
                sum_ordered(&[&cur, &other])
            } else {
                sum_ordered(&[&other, &cur])
            };
            let (keep, drop) = topk_entries(&sum, self.kb);
            // 2^(s+1) ranks hold this sum; each keeps its share of what is discarded.
            let share = 0.5f32.powi(s as i32 + 1);
            for (&i, &v) in drop.idx.iter().zip(&drop.val) {
                self.work[i as usize] += v * share;
            }
            cur = keep;
        }
        Ok(cur)
    }

    /// B-SAG (§3.3 2, Algorithm 2): top-h, Bruck all-gather between teams, sum, top-L.
    fn bsag(&mut self, cc: &Counting, own: Entries) -> Result<Entries> {
        let t = self.cfg.rank / self.m;
        let q = self.cfg.rank % self.m;
        let cross = Group {
            members: (0..self.teams).map(|x| x * self.m + q).collect(),
            me: t,
        };
        // At full density every team's block holds every index, the all-overlap bound h = L
        // of §3.3 applies.
        let h = self.layout().bsag_h(self.h);
        let (keep_h, drop_h) = topk_entries(&own, h);
        for (&i, &v) in drop_h.idx.iter().zip(&drop_h.val) {
            self.work[i as usize] += v;
        }
        let blocks = bruck(cc, &cross, keep_h.encode(), None, tags::SAG)?;
        let mut parts = Vec::with_capacity(self.teams);
        for (x, b) in blocks.iter().enumerate() {
            let e = Entries::decode_all(b, self.block(q))?;
            if x != t {
                cc.add_items(e.len());
            }
            parts.push(e);
        }
        let refs: Vec<&Entries> = parts.iter().collect();
        let sum = sum_ordered(&refs);
        let n_t = sum.len();
        let (keep, drop) = topk_entries(&sum, self.kb);
        let share = 1.0 / self.teams as f32;
        for (&i, &v) in drop.idx.iter().zip(&drop.val) {
            self.work[i as usize] += v * share;
        }
        // Algorithm 2 lines 3-12 (applied after the step, for the next one).
        let l = self.kb as f64;
        if (n_t as f64 > l) ^ (self.h_step > 0.0) {
            if self.h_flag {
                self.h_step *= 2.0;
                self.h_flag = false;
            } else {
                self.h_flag = true;
            }
        } else {
            self.h_step = -self.h_step / 2.0;
            self.h_flag = false;
        }
        // The step's magnitude stays in [½, L(1 − 1/d)]: below half an entry the rounded h
        // cannot move (a run of halvings would freeze it), and above the width of h's range
        // a run of doublings would only throw h from one bound to the other.
        let lo = l / self.teams as f64;
        let width = (l - lo).max(0.5);
        self.h_step = self.h_step.signum() * self.h_step.abs().clamp(0.5, width);
        self.h = (self.h + self.h_step).clamp(lo, l.max(lo));
        self.last_n = n_t;
        Ok(keep)
    }
}

impl SparseAllreduce for SparDl {
    accessors!(
        |s| SparseAlgo::SparDl {
            sag: s.sag,
            teams: None,
            selector: None
        }
        .name(),
        |s| &s.resid
    );
    counted_step!();
    super::state::stateful!();
}

impl SparDl {
    /// One step on the counting adapter `cc` (see [`SparseAllreduce::step`]).
    fn run(&mut self, cc: &Counting, grad: &[f32]) -> Result<(SparseGrad<f32>, StepStats)> {
        let d = self.cfg.d;
        // Algorithm 1 lines 1-3: acc = residual + grad; `resid` keeps acc (the copy), `work`
        // is what the selections consume.
        for ((r, w), &g) in self.resid.iter_mut().zip(self.work.iter_mut()).zip(grad) {
            *r += g;
            *w = *r;
        }
        self.work[d..].fill(0.0);
        let t = self.cfg.rank / self.m;
        let q = self.cfg.rank % self.m;
        let team = Group {
            members: (0..self.m).map(|j| t * self.m + j).collect(),
            me: q,
        };
        let own = self.srs(cc, &team)?;
        let selected = self.kb * self.m;
        let fin = match self.sag {
            Sag::None => own,
            Sag::Recursive => self.rsag(cc, own)?,
            Sag::Bruck => self.bsag(cc, own)?,
        };
        // Final Bruck all-gather inside the team (Algorithm 1 line 11).
        let sizes = vec![8 * self.kb; self.m];
        let known = if self.sag == Sag::Bruck {
            None
        } else {
            Some(&sizes[..])
        };
        let blocks = bruck(cc, &team, fin.encode(), known, tags::AG)?;
        let parts = scaffold::decode_ranges(cc, &blocks, q, |j| self.block(j))?;
        let all = scaffold::concat(&parts);
        // Algorithm 1 lines 12-14: at the final indices the residual is what this rank
        // discarded there; elsewhere it stays the accumulated gradient.
        for &i in &all.idx {
            let i = i as usize;
            if i < d {
                self.resid[i] = self.work[i];
            }
        }
        scaffold::finish(&self.cfg, &all, cc.counts(), selected)
    }
}
