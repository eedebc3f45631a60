//! The measured timeline as Chrome trace events (the JSON that `chrome://tracing` and
//! Perfetto open, as Horovod's timeline writes): one complete event (`"ph": "X"`) per
//! forward, per layer's backward, per group's selection and communication, and per
//! optimizer step; compute on thread 0, communication on thread 1, one process per rank.

use serde::{Deserialize, Serialize};

use crate::timeline::{Span, Timeline};
use crate::Result;

/// One complete event of the Chrome trace format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Event name.
    pub name: String,
    /// Category (`forward`, `backward`, `selection`, `comm`, `optimizer`).
    pub cat: String,
    /// Phase: always `X` (complete event).
    pub ph: String,
    /// Start, microseconds since the run began.
    pub ts: f64,
    /// Duration, microseconds.
    pub dur: f64,
    /// Process: the rank.
    pub pid: usize,
    /// Thread: 0 compute, 1 communication.
    pub tid: usize,
}

fn event(name: String, cat: &str, start_s: f64, dur_s: f64, pid: usize, tid: usize) -> TraceEvent {
    TraceEvent {
        name,
        cat: cat.into(),
        ph: "X".into(),
        ts: start_s * 1e6,
        dur: dur_s.max(0.0) * 1e6,
        pid,
        tid,
    }
}

/// The events of one iteration (`step`) that started `start_s` after the run began, with
/// its optimizer step of `opt_s` after the last group came back.
pub fn iteration_events(
    rank: usize,
    step: usize,
    start_s: f64,
    tl: &Timeline,
    opt_s: f64,
) -> Vec<TraceEvent> {
    // The event of `span` of this iteration on thread `tid`.
    let at = |name: String, cat: &str, span: &Span, tid: usize| {
        event(name, cat, start_s + span.start, span.len(), rank, tid)
    };
    let mut out = vec![at(format!("forward #{step}"), "forward", &tl.forward, 0)];
    for (l, s) in tl.backward.iter().enumerate() {
        if s.len() > 0.0 {
            out.push(at(format!("backward L{l}"), "backward", s, 0));
        }
    }
    for (g, grp) in tl.groups.iter().enumerate() {
        let name = format!("group {g} ({} elems)", grp.numel);
        if grp.sparsify.len() > 0.0 {
            out.push(at(format!("select {name}"), "selection", &grp.sparsify, 0));
        }
        out.push(at(format!("comm {name}"), "comm", &grp.comm, 1));
    }
    let opt_start = start_s + tl.iteration_s;
    out.push(event(
        format!("optimizer #{step}"),
        "optimizer",
        opt_start,
        opt_s,
        rank,
        0,
    ));
    out
}

/// Writes `events` as a Chrome trace JSON file (`{"traceEvents": [...]}`).
pub fn write(path: &std::path::Path, events: &[TraceEvent]) -> Result<()> {
    let json = serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" });
    std::fs::write(path, serde_json::to_string(&json)?)?;
    Ok(())
}
