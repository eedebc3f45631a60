//! The report: `report.json` (schema 1, described in `docs/ARCHITECTURE.md`) and `report.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The machine and transport a report was measured on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// Logical CPUs of the machine that wrote the report.
    pub cpus: usize,
    /// Transport of the communicating suites: `thread` or `mpi`.
    pub backend: String,
    /// Ranks of the communicating suites.
    pub ranks: usize,
    /// Threads of the rayon pool the compute runs on: one pool shared by the thread ranks
    /// of one process, or each MPI rank's own, its share of the node's cores. 0 in reports
    /// written before it was recorded.
    #[serde(default)]
    pub pool_threads: usize,
    /// Whether this was a `--quick` run.
    #[serde(default)]
    pub quick: bool,
    /// Operating system and architecture.
    #[serde(default)]
    pub os: String,
}

/// One measured figure; `params` holds every knob that shaped it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Suite name (`topk`, `allreduce`, ...).
    pub suite: String,
    /// Case: the algorithm's short lower-case name.
    pub case: String,
    /// Every parameter that shaped the figure (`ranks`, `d`, `density`, `bytes`, `model`).
    pub params: BTreeMap<String, serde_json::Value>,
    /// What was measured (`time_s`, `busbw_gbs`, ...).
    pub metric: String,
    /// The figure.
    pub value: f64,
    /// Its unit.
    pub unit: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Format version.
    pub schema: u32,
    /// Where it was measured.
    pub machine: Machine,
    /// Every figure.
    pub records: Vec<Record>,
}

/// A paper's headline claim next to what this run measured.
#[derive(Debug, Clone)]
pub struct Headline {
    /// Which paper and where (`OMGS-SGD (Shi et al., INFOCOM 2020) Table VI`).
    pub source: String,
    /// The claim in words.
    pub claim: String,
    /// What we measured, in words.
    pub ours: String,
    /// Reproduced (true), not reproduced (false), or not comparable here (None).
    pub reproduced: Option<bool>,
}

/// What one suite produced.
#[derive(Debug, Default)]
pub struct SuiteOutput {
    /// Its records.
    pub records: Vec<Record>,
    /// Its Markdown section body (what was measured, tables, plot links, paper numbers).
    pub markdown: String,
    /// Headline comparisons for the summary.
    pub headlines: Vec<Headline>,
    /// One-line findings for the summary (e.g. the fastest scheme).
    pub findings: Vec<String>,
}

impl SuiteOutput {
    /// Adds a record.
    pub fn record(
        &mut self,
        suite: &str,
        case: &str,
        params: &[(&str, serde_json::Value)],
        metric: &str,
        value: f64,
        unit: &str,
    ) {
        self.records.push(Record {
            suite: suite.into(),
            case: case.into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            metric: metric.into(),
            value,
            unit: unit.into(),
        });
    }
}

/// Builds a Markdown table from a header and rows.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| {} |", header.join(" | "));
    let _ = writeln!(
        s,
        "|{}|",
        header.iter().map(|_| " --- ").collect::<Vec<_>>().join("|")
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

/// Formats seconds with a sensible unit.
pub fn secs(t: f64) -> String {
    if !t.is_finite() {
        "–".into()
    } else if t >= 1.0 {
        format!("{t:.2} s")
    } else if t >= 1e-3 {
        format!("{:.2} ms", t * 1e3)
    } else {
        format!("{:.1} µs", t * 1e6)
    }
}

/// Formats a byte count with a binary unit.
pub fn bytes(n: f64) -> String {
    if n >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", n / (1u64 << 30) as f64)
    } else if n >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", n / (1u64 << 20) as f64)
    } else if n >= 1024.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{n:.0} B")
    }
}

/// Writes `report.json`.
pub fn write_json(report: &Report, dir: &Path) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("report.json"), text)
}

/// Writes `report.md`: the summary, then one section per suite.
pub fn write_markdown(
    dir: &Path,
    machine: &Machine,
    command: &str,
    elapsed_s: f64,
    sections: &[(String, SuiteOutput)],
) -> std::io::Result<()> {
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmark report\n");
    let _ = writeln!(
        md,
        "`{command}` on {} CPUs, backend `{}`, {} ranks, a pool of {} threads per process{}; {:.0} s in all.\n",
        machine.cpus,
        machine.backend,
        machine.ranks,
        machine.pool_threads,
        if machine.quick { ", quick run" } else { "" },
        elapsed_s
    );
    let _ = writeln!(md, "## Summary\n");
    for (_, out) in sections {
        for f in &out.findings {
            let _ = writeln!(md, "- {f}");
        }
    }
    let heads: Vec<&Headline> = sections.iter().flat_map(|(_, o)| &o.headlines).collect();
    if !heads.is_empty() {
        let rows: Vec<Vec<String>> = heads
            .iter()
            .map(|h| {
                vec![
                    h.source.clone(),
                    h.claim.clone(),
                    h.ours.clone(),
                    match h.reproduced {
                        Some(true) => "reproduced".into(),
                        Some(false) => "not reproduced".into(),
                        None => "not comparable here".into(),
                    },
                ]
            })
            .collect();
        let _ = writeln!(md, "\nPapers' headline results against this run:\n");
        md.push_str(&table(&["paper", "claim", "this run", "verdict"], &rows));
    }
    for (name, out) in sections {
        let _ = writeln!(md, "\n## `{name}`\n");
        md.push_str(&out.markdown);
        md.push('\n');
    }
    std::fs::write(dir.join("report.md"), md)
}

/// Checks a report against the format: schema, non-empty names, finite values, and that
/// every required suite is present.
pub fn validate(report: &Report, required: &[&str]) -> Result<(), String> {
    if report.schema != 1 {
        return Err(format!("schema {} is not 1", report.schema));
    }
    for (i, r) in report.records.iter().enumerate() {
        if r.suite.is_empty() || r.case.is_empty() || r.metric.is_empty() {
            return Err(format!("record {i} has an empty suite, case or metric"));
        }
        if !r.value.is_finite() {
            return Err(format!(
                "record {i} ({}/{}/{}) is not finite",
                r.suite, r.case, r.metric
            ));
        }
    }
    for s in required {
        if !report.records.iter().any(|r| r.suite == *s) {
            return Err(format!("suite {s} has no records"));
        }
    }
    Ok(())
}
