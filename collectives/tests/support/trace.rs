//! The message trace a plan predicts, in the shape `SimComm::take_trace` records, so a
//! test can compare a real run with the plan call by call.

use std::collections::{HashMap, VecDeque};

use collectives::Traced;
use cost_model::schedule::{Op, Schedule};

/// Every rank's expected calls: the schedule's operations in program order, each receive
/// sized by the send it matches (FIFO per sender, receiver and tag, as the transports
/// match). A receive with no matching send gets `usize::MAX` bytes, so it cannot compare
/// equal to a real call.
pub fn expected(s: &Schedule) -> Vec<Vec<Traced>> {
    let mut q: HashMap<(usize, usize, u32), VecDeque<usize>> = HashMap::new();
    for (r, ops) in s.ops.iter().enumerate() {
        for op in ops {
            match *op {
                Op::Send { to, tag, bytes }
                | Op::SendRecv {
                    to,
                    send_tag: tag,
                    bytes,
                    ..
                } => q.entry((r, to, tag)).or_default().push_back(bytes),
                Op::Recv { .. } => {}
            }
        }
    }
    let mut pop = |from: usize, to: usize, tag: u32| {
        q.get_mut(&(from, to, tag))
            .and_then(|d| d.pop_front())
            .unwrap_or(usize::MAX)
    };
    s.ops
        .iter()
        .enumerate()
        .map(|(r, ops)| {
            ops.iter()
                .map(|op| match *op {
                    Op::Send { to, bytes, .. } => Traced::Send { to, bytes },
                    Op::Recv { from, tag, .. } => Traced::Recv {
                        from,
                        bytes: pop(from, r, tag),
                    },
                    Op::SendRecv {
                        to,
                        bytes,
                        from,
                        recv_tag,
                        ..
                    } => Traced::SendRecv {
                        to,
                        sent: bytes,
                        from,
                        received: pop(from, r, recv_tag),
                    },
                })
                .collect()
        })
        .collect()
}

/// Asserts that every rank's recorded calls equal the plan's, call by call.
pub fn assert_trace(what: &str, plan: &Schedule, got: &[Vec<Traced>]) {
    let want = expected(plan);
    assert_eq!(want.len(), got.len(), "{what}: rank count");
    for (r, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(
            w.len(),
            g.len(),
            "{what}: rank {r} calls\nplan {w:?}\nrun  {g:?}"
        );
        for (i, (a, b)) in w.iter().zip(g).enumerate() {
            assert_eq!(a, b, "{what}: rank {r} call {i}");
        }
    }
}
