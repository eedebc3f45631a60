//! Exact evaluation of a message schedule under the α-β clock model that
//! `collectives::SimComm` implements, so predictions equal simulated measurements for any
//! P, size and (hierarchical) topology.
//!
//! The model: a message of `n` bytes sent at local time `t` arrives at `t + α + β·n` (the
//! link between the two ranks' nodes); the sender is busy until then; a receive sets
//! `clock = max(clock, arrival)`; a send-receive is full duplex, `clock = max(own send's
//! arrival, incoming arrival)`. One round per send, receive or send-receive. A reducing
//! receive then adds `γ·bytes` of local work (the topology's γ; 0 reproduces SimComm, whose
//! algorithms model no arithmetic).

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::{Error, Result, Topology};

/// One communication call of one rank, in program order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// A buffered send of `bytes` to world rank `to`.
    Send {
        /// Destination world rank.
        to: usize,
        /// Matching key (tag and communicator context).
        tag: u32,
        /// Payload bytes.
        bytes: usize,
    },
    /// A blocking receive from world rank `from`; `reduce` adds γ·bytes after it.
    Recv {
        /// Source world rank.
        from: usize,
        /// Matching key.
        tag: u32,
        /// Whether the received bytes are summed into a buffer.
        reduce: bool,
    },
    /// A paired send and receive (one round).
    SendRecv {
        /// Destination world rank.
        to: usize,
        /// Matching key of the send.
        send_tag: u32,
        /// Bytes sent.
        bytes: usize,
        /// Source world rank.
        from: usize,
        /// Matching key of the receive.
        recv_tag: u32,
        /// Whether the received bytes are summed into a buffer.
        reduce: bool,
    },
}

/// What one rank spends in a schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RankCost {
    /// Simulated finishing time, seconds (all ranks start at 0).
    pub time_s: f64,
    /// Send, receive and send-receive calls.
    pub rounds: u64,
    /// Messages sent.
    pub messages_sent: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Payload bytes received.
    pub bytes_recv: u64,
}

/// Predicted cost of one collective call: the maxima over ranks plus every rank's cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Completion time: the latest rank's finishing time, seconds.
    pub time_s: f64,
    /// Most rounds any rank performs.
    pub rounds: u64,
    /// Most bytes any rank sends.
    pub bytes_sent: u64,
    /// Most bytes any rank receives.
    pub bytes_recv: u64,
    /// Per world rank.
    pub per_rank: Vec<RankCost>,
}

impl Prediction {
    fn from_ranks(per_rank: Vec<RankCost>) -> Self {
        Prediction {
            time_s: per_rank.iter().map(|c| c.time_s).fold(0.0, f64::max),
            rounds: per_rank.iter().map(|c| c.rounds).max().unwrap_or(0),
            bytes_sent: per_rank.iter().map(|c| c.bytes_sent).max().unwrap_or(0),
            bytes_recv: per_rank.iter().map(|c| c.bytes_recv).max().unwrap_or(0),
            per_rank,
        }
    }
}

/// Every rank's calls, in program order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Schedule {
    /// `ops[r]` is world rank r's program.
    pub ops: Vec<Vec<Op>>,
}

impl Schedule {
    /// An empty schedule for `p` ranks.
    pub fn new(p: usize) -> Self {
        Schedule {
            ops: vec![Vec::new(); p],
        }
    }

    /// Appends a send to rank `r`'s program.
    pub fn send(&mut self, r: usize, to: usize, tag: u32, bytes: usize) {
        self.ops[r].push(Op::Send { to, tag, bytes });
    }

    /// Appends a receive to rank `r`'s program.
    pub fn recv(&mut self, r: usize, from: usize, tag: u32, reduce: bool) {
        self.ops[r].push(Op::Recv { from, tag, reduce });
    }

    /// Appends a send-receive to rank `r`'s program.
    pub fn sendrecv(
        &mut self,
        r: usize,
        to: usize,
        bytes: usize,
        from: usize,
        tag: u32,
        reduce: bool,
    ) {
        self.ops[r].push(Op::SendRecv {
            to,
            send_tag: tag,
            bytes,
            from,
            recv_tag: tag,
            reduce,
        });
    }

    /// Runs the clock model over the schedule on `topo` (which must have as many ranks).
    pub fn evaluate(&self, topo: &Topology) -> Result<Prediction> {
        let p = self.ops.len();
        topo.validate()?;
        topo.check_ranks(p)?;
        let mut queues: HashMap<(usize, usize, u32), VecDeque<(f64, usize)>> = HashMap::new();
        let mut cost = vec![RankCost::default(); p];
        let mut pc = vec![0usize; p];
        // Arrival of the send half of a send-receive already posted.
        let mut posted: Vec<Option<f64>> = vec![None; p];
        let gamma = topo.gamma_s_per_byte;
        let check = |r: usize, peer: usize| -> Result<()> {
            if peer < p {
                Ok(())
            } else {
                Err(Error::InvalidArgument(format!(
                    "schedule: rank {r} addresses rank {peer} of {p}"
                )))
            }
        };
        loop {
            let mut progress = false;
            for r in 0..p {
                while let Some(op) = self.ops[r].get(pc[r]) {
                    let c = &mut cost[r];
                    match *op {
                        Op::Send { to, tag, bytes } => {
                            check(r, to)?;
                            let arrival = c.time_s + topo.link(r, to).time(bytes);
                            queues
                                .entry((r, to, tag))
                                .or_default()
                                .push_back((arrival, bytes));
                            c.time_s = arrival;
                            c.rounds += 1;
                            c.messages_sent += 1;
                            c.bytes_sent += bytes as u64;
                        }
                        Op::Recv { from, tag, reduce } => {
                            check(r, from)?;
                            let Some((arrival, bytes)) =
                                queues.get_mut(&(from, r, tag)).and_then(|q| q.pop_front())
                            else {
                                break;
                            };
                            c.time_s = c.time_s.max(arrival);
                            if reduce {
                                c.time_s += gamma * bytes as f64;
                            }
                            c.rounds += 1;
                            c.bytes_recv += bytes as u64;
                        }
                        Op::SendRecv {
                            to,
                            send_tag,
                            bytes,
                            from,
                            recv_tag,
                            reduce,
                        } => {
                            check(r, to)?;
                            check(r, from)?;
                            if posted[r].is_none() {
                                let arrival = c.time_s + topo.link(r, to).time(bytes);
                                queues
                                    .entry((r, to, send_tag))
                                    .or_default()
                                    .push_back((arrival, bytes));
                                posted[r] = Some(arrival);
                                c.messages_sent += 1;
                                c.bytes_sent += bytes as u64;
                                progress = true;
                            }
                            let Some((arrival, got)) = queues
                                .get_mut(&(from, r, recv_tag))
                                .and_then(|q| q.pop_front())
                            else {
                                break;
                            };
                            let sent = posted[r].take().unwrap_or(c.time_s);
                            c.time_s = c.time_s.max(sent.max(arrival));
                            if reduce {
                                c.time_s += gamma * got as f64;
                            }
                            c.rounds += 1;
                            c.bytes_recv += got as u64;
                        }
                    }
                    pc[r] += 1;
                    progress = true;
                }
            }
            if (0..p).all(|r| pc[r] == self.ops[r].len()) {
                return Ok(Prediction::from_ranks(cost));
            }
            if !progress {
                let stuck: Vec<usize> = (0..p).filter(|&r| pc[r] < self.ops[r].len()).collect();
                return Err(Error::InvalidArgument(format!(
                    "schedule deadlocks: ranks {stuck:?} wait for messages never sent"
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Link;

    #[test]
    fn ping_pong_and_full_duplex() {
        let t = Topology::flat(2, Link::new(1.0, 0.5)).unwrap();
        let mut s = Schedule::new(2);
        s.send(0, 1, 0, 2);
        s.recv(0, 1, 0, false);
        s.recv(1, 0, 0, false);
        s.send(1, 0, 0, 4);
        let p = s.evaluate(&t).unwrap();
        assert_eq!(p.per_rank[1].time_s, 5.0); // arrives at 2, sends until 2 + 3
        assert_eq!(p.time_s, 5.0);
        assert_eq!(p.rounds, 2);
        let mut s = Schedule::new(2);
        s.sendrecv(0, 1, 2, 1, 0, true);
        s.sendrecv(1, 0, 4, 0, 0, true);
        let t = t.with_gamma(0.25).unwrap();
        let p = s.evaluate(&t).unwrap();
        assert_eq!(p.per_rank[0].time_s, 3.0 + 1.0);
        assert_eq!(p.per_rank[1].time_s, 3.0 + 0.5);
    }

    #[test]
    fn deadlock_and_mismatch_are_errors() {
        let t = Topology::flat(2, Link::new(1.0, 0.5)).unwrap();
        let mut s = Schedule::new(2);
        s.recv(0, 1, 0, false);
        assert!(s.evaluate(&t).is_err());
        assert!(Schedule::new(3).evaluate(&t).is_err());
    }
}
