//! A machine's calibration: the fitted link and top-k models plus direct fits of the
//! collectives that were swept, saved as JSON by `cargo xtask calibrate` and read by the
//! planner and the algorithm chooser.
//!
//! ```json
//! {"schema": 1, "backend": "thread", "ranks": 4,
//!  "topology": {"nodes": 4, "ranks_per_node": 1, "intra": {...}, "inter": {...}, "gamma_s_per_byte": 1e-10},
//!  "pingpong": {"model": {"alpha_s": 2e-6, "beta_s": 1e-10}, "quality": {"r2": 0.99, ...}},
//!  "collectives": [{"op": "allreduce", "algo": "ring", "fit": {...}}],
//!  "topk": [{"selector": "exact", "density": 0.001, "fit": {"model": {"kind": "omgs", "gamma_rho": 2e-10}, ...}}]}
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::dense::{predict_dense, DenseCase};
use crate::fit::{fit_linear, fit_piecewise, Fitted, PiecewiseLinear, Sample};
use crate::models::{LinearModel, ReductionModel, TopkModel};
use crate::{Algorithm, Collective, Error, Result, Topology};

/// Version of the calibration JSON layout.
pub const SCHEMA: u32 = 1;

/// Direct fits of one collective algorithm against `bytes`: the single line
/// `t = α + β·bytes` and the piecewise α-β model (one line per size regime, see
/// [`fit_piecewise`]) that predictions use. `bytes` is the buffer size for all-reduce,
/// reduce-scatter, broadcast and reduce, and each rank's contribution for all-gather.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveFit {
    /// The operation.
    pub op: Collective,
    /// The algorithm.
    pub algo: Algorithm,
    /// The single fitted line over the whole sweep (kept and reported for comparison).
    pub fit: Fitted<LinearModel>,
    /// The piecewise fit (`None` in calibrations written before it existed).
    #[serde(default)]
    pub piecewise: Option<Fitted<PiecewiseLinear>>,
    /// The samples it was fitted to (median time per size).
    #[serde(default)]
    pub samples: Vec<Sample>,
    /// The pipeline block size the sweep ran with, for the algorithms that take one (LP);
    /// a fit only describes that block size.
    #[serde(default)]
    pub block_bytes: Option<usize>,
}

impl CollectiveFit {
    /// A fit of `samples` (median seconds per size): the single line and the piecewise
    /// model with up to [`MAX_SEGMENTS`] regimes.
    pub fn from_samples(op: Collective, algo: Algorithm, samples: Vec<Sample>) -> Result<Self> {
        Ok(CollectiveFit {
            op,
            algo,
            fit: fit_linear(&samples)?,
            piecewise: Some(fit_piecewise(&samples, MAX_SEGMENTS)?),
            samples,
            block_bytes: None,
        })
    }

    /// Seconds for `bytes` as measured: the samples interpolated log-log inside the sweep,
    /// [`CollectiveFit::time`] outside it. What an algorithm chooser ranks by.
    pub fn measured_time(&self, bytes: usize) -> f64 {
        interpolate(&self.samples, bytes as f64).unwrap_or_else(|| self.time(bytes))
    }

    /// The same fit, recorded as swept with pipeline blocks of `block_bytes`.
    pub fn with_block_bytes(mut self, block_bytes: usize) -> Self {
        self.block_bytes = Some(block_bytes);
        self
    }

    /// Predicted seconds for `bytes`: the piecewise model (a shared-memory machine is not
    /// α-β linear across its cache sizes), extrapolated with its nearest segment above the
    /// sweep; below it, the smallest swept size's time (start-up dominates there, and a
    /// line extrapolated below its range can go negative). Calibrations without one (older
    /// files) interpolate the measured medians log-log inside the sweep and use the line
    /// outside it.
    pub fn time(&self, bytes: usize) -> f64 {
        match &self.piecewise {
            Some(p) if !p.model.segments.is_empty() => {
                let smallest = self
                    .samples
                    .iter()
                    .map(|s| s.size)
                    .fold(f64::INFINITY, f64::min);
                p.model.time_f((bytes as f64).max(if smallest.is_finite() {
                    smallest
                } else {
                    0.0
                }))
            }
            _ => interpolate(&self.samples, bytes as f64)
                .unwrap_or_else(|| self.fit.model.time(bytes)),
        }
    }
}

/// Most size regimes a piecewise fit of the calibration may use: latency-bound, then one
/// per cache level the buffers outgrow (L1, L2, last level, memory), and one more for the
/// protocol switch of a transport (eager to rendezvous) or a library changing algorithm
/// inside; each extra one is only kept where the data needs it (see [`fit_piecewise`]).
pub const MAX_SEGMENTS: usize = 6;

/// Log-log interpolation of `(size, time)` samples sorted by size; `None` outside their
/// range or with fewer than two samples. Sizes of 0 are skipped.
pub fn interpolate(samples: &[Sample], x: f64) -> Option<f64> {
    let mut pts: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.size > 0.0 && s.time_s > 0.0)
        .map(|s| (s.size, s.time_s))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    if pts.len() < 2 || x < pts[0].0 || x > pts[pts.len() - 1].0 {
        return None;
    }
    let i = pts.iter().position(|p| p.0 >= x)?;
    if pts[i].0 == x || i == 0 {
        return Some(pts[i].1);
    }
    let (x0, y0) = pts[i - 1];
    let (x1, y1) = pts[i];
    let f = (x.ln() - x0.ln()) / (x1.ln() - x0.ln());
    Some((y0.ln() + f * (y1.ln() - y0.ln())).exp())
}

/// A fitted top-k selection model (sizes in elements).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopkFit {
    /// Selector name (`"exact"`, `"mstopk"`, ...).
    pub selector: String,
    /// Density the sweep used.
    pub density: f64,
    /// The fitted model.
    pub fit: Fitted<TopkModel>,
}

/// Everything a calibration run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// [`SCHEMA`].
    pub schema: u32,
    /// Transport it was measured on (`"thread"`, `"mpi"`).
    pub backend: String,
    /// Number of ranks.
    pub ranks: usize,
    /// The cluster as the link fits describe it (α, β from the ping-pong, γ from the
    /// reduction sweep).
    pub topology: Topology,
    /// One-way point-to-point time against bytes (half a ping-pong round trip): the single
    /// α-β line whose constants describe the link.
    pub pingpong: Fitted<LinearModel>,
    /// The same ping-pong sweep fitted per size regime: what point-to-point time
    /// predictions use (one line cannot span cached and streaming sizes on shared memory).
    #[serde(default)]
    pub pingpong_piecewise: Option<Fitted<PiecewiseLinear>>,
    /// Local reduction (sum of `f32`) time against bytes: γ per byte.
    #[serde(default)]
    pub reduction: Option<Fitted<ReductionModel>>,
    /// The same reduction sweep fitted per size regime (bytes): what predictions of the
    /// summing cost use, since one γ cannot describe both cached and streaming sizes.
    #[serde(default)]
    pub reduction_piecewise: Option<Fitted<PiecewiseLinear>>,
    /// Direct fits of the collectives that were swept.
    #[serde(default)]
    pub collectives: Vec<CollectiveFit>,
    /// Fitted top-k models.
    #[serde(default)]
    pub topk: Vec<TopkFit>,
}

impl Calibration {
    /// Parses and validates a calibration from JSON text (`what` names it in errors).
    pub fn from_json(text: &str, what: &str) -> Result<Self> {
        let c: Calibration = serde_json::from_str(text).map_err(|e| Error::Json {
            path: what.to_string(),
            message: e.to_string(),
        })?;
        c.validate().map_err(|e| Error::Json {
            path: what.to_string(),
            message: e.to_string(),
        })?;
        Ok(c)
    }

    /// Reads a calibration file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Json {
            path: path.display().to_string(),
            message: format!("cannot read: {e}"),
        })?;
        Calibration::from_json(&text, &path.display().to_string())
    }

    /// The calibration as pretty JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain structs of numbers and strings cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Writes the calibration to `path`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()).map_err(|e| Error::Json {
            path: path.display().to_string(),
            message: format!("cannot write: {e}"),
        })
    }

    /// Checks the schema, that the topology is valid and matches `ranks`, and that every
    /// fitted constant is finite.
    pub fn validate(&self) -> Result<()> {
        if self.schema != SCHEMA {
            return Err(Error::InvalidArgument(format!(
                "calibration schema {} is not the supported {SCHEMA}",
                self.schema
            )));
        }
        self.topology.validate()?;
        self.topology.check_ranks(self.ranks)?;
        let finite = |v: f64, what: &str| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(Error::InvalidArgument(format!("{what} is {v}")))
            }
        };
        finite(self.pingpong.model.alpha_s, "ping-pong α")?;
        finite(self.pingpong.model.beta_s, "ping-pong β")?;
        for s in self
            .reduction_piecewise
            .iter()
            .chain(&self.pingpong_piecewise)
            .flat_map(|p| &p.model.segments)
        {
            finite(s.start, "reduction breakpoint")?;
            finite(s.model.alpha_s, "reduction α")?;
            finite(s.model.beta_s, "reduction γ")?;
        }
        for t in &self.topk {
            let d = [1usize << 10, 1 << 20, 1 << 26];
            if d.iter().any(|&d| !t.fit.model.time(d).is_finite()) {
                return Err(Error::InvalidArgument(format!(
                    "top-k model of {} predicts a non-finite time",
                    t.selector
                )));
            }
        }
        for c in &self.collectives {
            if !c.op.fits_algorithm(c.algo) {
                return Err(Error::InvalidArgument(format!(
                    "{} has no {} algorithm",
                    c.op.name(),
                    c.algo.name()
                )));
            }
            finite(c.fit.model.alpha_s, "collective α")?;
            finite(c.fit.model.beta_s, "collective β")?;
            for s in c.piecewise.iter().flat_map(|p| &p.model.segments) {
                finite(s.start, "piecewise breakpoint")?;
                finite(s.model.alpha_s, "piecewise α")?;
                finite(s.model.beta_s, "piecewise β")?;
            }
        }
        Ok(())
    }

    /// The fitted top-k model of `selector` (e.g. `"exact"`), if it was swept: what a
    /// planner pricing selections on this machine should use.
    pub fn topk_model(&self, selector: &str) -> Option<TopkModel> {
        self.topk
            .iter()
            .find(|t| t.selector == selector)
            .map(|t| t.fit.model)
    }

    /// Whether any algorithm of `op` was swept (then the measured fits are what a chooser
    /// should rank, not schedule predictions of the others).
    pub fn has_fits(&self, op: Collective) -> bool {
        self.collectives.iter().any(|c| c.op == op)
    }

    /// Predicted one-way seconds of a point-to-point message of `bytes`: the piecewise
    /// ping-pong fit when there is one, else the line.
    pub fn p2p_s(&self, bytes: usize) -> f64 {
        match &self.pingpong_piecewise {
            Some(p) if !p.model.segments.is_empty() => p.model.time(bytes),
            _ => self.pingpong.model.time(bytes),
        }
    }

    /// The direct fit of `(op, algo)`, if that pair was swept.
    pub fn collective_fit(&self, op: Collective, algo: Algorithm) -> Option<&CollectiveFit> {
        self.collectives
            .iter()
            .find(|c| c.op == op && c.algo == algo)
    }

    /// Predicted seconds of `op` with `algo` on `p` ranks for `bytes` (see
    /// [`CollectiveFit`] for what `bytes` means): the direct fit when this pair was swept at
    /// this P, else the schedule prediction on the calibrated link constants (a flat
    /// cluster of `p` ranks with this calibration's links).
    pub fn predict(&self, op: Collective, algo: Algorithm, p: usize, bytes: usize) -> Result<f64> {
        if p == self.ranks {
            if let Some(c) = self.collective_fit(op, algo) {
                return Ok(c.time(bytes));
            }
        }
        let topo = if p == self.ranks {
            self.topology
        } else {
            Topology::flat(p, self.topology.inter)?.with_gamma(self.topology.gamma_s_per_byte)?
        };
        let case = DenseCase::new(op, algo, bytes / 4).with_block_bytes(64 << 10);
        Ok(predict_dense(&case, &topo)?.time_s)
    }
}

/// Ranks the algorithms of `op` for `bytes` (buffer bytes; per-rank bytes for all-gather)
/// on `topo` by predicted time, fastest first. `block_bytes` is the LP block size; f32
/// elements. Algorithms that cannot run on this topology (torus2d needs ranks per node to
/// divide P, which a valid topology guarantees) are left out with no error.
pub fn rank_dense(
    op: Collective,
    bytes: usize,
    topo: &Topology,
    block_bytes: usize,
) -> Result<Vec<(Algorithm, f64)>> {
    topo.validate()?;
    let mut out = Vec::new();
    for &algo in op.algorithms() {
        let case = DenseCase::new(op, algo, bytes / 4).with_block_bytes(block_bytes);
        if let Ok(pred) = predict_dense(&case, topo) {
            out.push((algo, pred.time_s));
        }
    }
    out.sort_by(|a, b| a.1.total_cmp(&b.1));
    Ok(out)
}

/// [`rank_dense`] through a calibration: direct fits where swept, schedule predictions on
/// the calibrated links otherwise.
pub fn rank_dense_calibrated(
    cal: &Calibration,
    op: Collective,
    p: usize,
    bytes: usize,
) -> Vec<(Algorithm, f64)> {
    let mut out: Vec<(Algorithm, f64)> = op
        .algorithms()
        .iter()
        .filter_map(|&a| cal.predict(op, a, p, bytes).ok().map(|t| (a, t)))
        .filter(|(_, t)| t.is_finite())
        .collect();
    out.sort_by(|a, b| a.1.total_cmp(&b.1));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Link;

    fn cal() -> Calibration {
        let link = Link::new(2e-6, 1e-10);
        let s: Vec<Sample> = [1e3, 1e6]
            .iter()
            .map(|&n| Sample::new(n, 2e-6 + 1e-10 * n))
            .collect();
        let pingpong = fit_linear(&s).unwrap();
        Calibration {
            schema: SCHEMA,
            backend: "thread".into(),
            ranks: 4,
            topology: Topology::flat(4, link).unwrap(),
            pingpong,
            pingpong_piecewise: None,
            reduction: None,
            reduction_piecewise: None,
            collectives: vec![CollectiveFit {
                op: Collective::Allreduce,
                algo: Algorithm::Ring,
                fit: pingpong,
                piecewise: None,
                samples: vec![],
                block_bytes: None,
            }],
            topk: vec![],
        }
    }

    #[test]
    fn interpolation_inside_the_sweep() {
        let s = [Sample::new(1e3, 1e-5), Sample::new(1e5, 1e-3)];
        assert!((interpolate(&s, 1e4).unwrap() - 1e-4).abs() < 1e-15);
        assert_eq!(interpolate(&s, 1e3), Some(1e-5));
        assert_eq!(interpolate(&s, 1e6), None);
        assert_eq!(interpolate(&s[..1], 1e3), None);
    }

    #[test]
    fn piecewise_prediction_and_old_json() {
        // In cache to 256 KiB, then 4× the per-byte cost, on the calibration's ×4 sweep.
        let t = |n: f64| {
            if n <= 262144.0 {
                10e-6 + 0.1e-9 * n
            } else {
                -68.6e-6 + 0.4e-9 * n
            }
        };
        let s: Vec<Sample> = (0..8)
            .map(|i| (1024usize << (2 * i)) as f64)
            .map(|n| Sample::new(n, t(n)))
            .collect();
        let f = CollectiveFit::from_samples(Collective::Allreduce, Algorithm::Ring, s).unwrap();
        let pw = f.piecewise.clone().unwrap();
        assert_eq!(pw.model.segments.len(), 2);
        assert!(pw.quality.r2 > 0.999 && f.fit.quality.r2 < pw.quality.r2);
        for n in [1usize << 10, 100_000, 1 << 20, 16 << 20, 64 << 20] {
            assert!((f.time(n) / t(n as f64) - 1.0).abs() < 1e-6, "{n}");
        }
        let mut c = cal();
        c.collectives[0] = f.clone();
        let back = Calibration::from_json(&c.to_json(), "mem").unwrap();
        assert_eq!(back, c);
        // A file written before the piecewise fit existed still loads and predicts by
        // interpolating its medians.
        let mut old: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        if let Some(o) = old["collectives"][0].as_object_mut() {
            o.remove("piecewise");
        }
        let old = Calibration::from_json(&old.to_string(), "old").unwrap();
        assert_eq!(old.collectives[0].piecewise, None);
        let n = 1 << 20;
        assert!((old.collectives[0].time(n) / t(n as f64) - 1.0).abs() < 1e-9);
        let mut bad = c.clone();
        if let Some(p) = bad.collectives[0].piecewise.as_mut() {
            p.model.segments[1].model.beta_s = f64::NAN;
        }
        assert!(bad.validate().is_err());
    }

    #[test]
    fn json_round_trip_and_errors() {
        let c = cal();
        let back = Calibration::from_json(&c.to_json(), "mem").unwrap();
        assert_eq!(back, c);
        assert!(
            matches!(Calibration::from_json("{", "x.json"), Err(Error::Json { path, .. }) if path == "x.json")
        );
        assert!(matches!(
            Calibration::load("/nonexistent/cal.json"),
            Err(Error::Json { .. })
        ));
        let mut bad = c.clone();
        bad.ranks = 5;
        assert!(Calibration::from_json(&bad.to_json(), "m").is_err());
        let mut bad = c.clone();
        bad.schema = 99;
        assert!(Calibration::from_json(&bad.to_json(), "m").is_err());
    }

    #[test]
    fn measured_only_fits_load_for_the_operations_they_offer() {
        // The library's collectives and the shared-memory ones: priced by a fit only.
        for algo in [Algorithm::Library, Algorithm::SharedMemory] {
            let mut c = cal();
            let mut fit = c.collectives[0].clone();
            fit.algo = algo;
            c.collectives.push(fit.clone());
            let back = Calibration::from_json(&c.to_json(), "mem").unwrap();
            assert_eq!(back, c);
            assert!(c.collective_fit(Collective::Allreduce, algo).is_some());
            // Broadcast has no such variant: a file claiming one is refused.
            fit.op = Collective::Broadcast;
            c.collectives.push(fit);
            assert!(Calibration::from_json(&c.to_json(), "m").is_err(), "{algo}");
            // No schedule prices it: only a measured fit does.
            let t = Topology::flat(4, Link::new(1e-6, 1e-9)).unwrap();
            let case = DenseCase::new(Collective::Allreduce, algo, 1024);
            assert!(predict_dense(&case, &t).is_err(), "{algo}");
        }
    }

    #[test]
    fn prediction_and_ranking() {
        let c = cal();
        let direct = c
            .predict(Collective::Allreduce, Algorithm::Ring, 4, 1000)
            .unwrap();
        assert!((direct - (2e-6 + 1e-7)).abs() < 1e-12);
        let r = rank_dense_calibrated(&c, Collective::Allgather, 4, 1 << 20);
        assert_eq!(r.len(), 3);
        assert!(r.windows(2).all(|w| w[0].1 <= w[1].1));
        // Large messages on a latency-cheap flat link: a bandwidth-optimal algorithm wins;
        // tiny messages: recursive doubling beats the 2(P−1)-step ring.
        let t = Topology::flat(8, Link::new(5e-5, 1e-9)).unwrap();
        let small = rank_dense(Collective::Allreduce, 64, &t, 1 << 16).unwrap();
        assert_eq!(small[0].0, Algorithm::RecursiveDoubling);
        let big = rank_dense(Collective::Allreduce, 64 << 20, &t, 1 << 16).unwrap();
        assert!(
            matches!(
                big[0].0,
                Algorithm::Rabenseifner | Algorithm::Be | Algorithm::Ring
            ),
            "{big:?}"
        );
    }
}
