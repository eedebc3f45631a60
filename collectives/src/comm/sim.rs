//! [`SimComm`]: a communicator that wraps any other, moves the real data, and accounts for
//! what it would cost on a cluster described by an α-β [`Topology`].
//!
//! The clock model (Hockney, blocking sends, full-duplex links): a message of `n` bytes
//! sent at local time `t` from world rank `a` to `b` arrives at `t + α + β·n` with α, β of
//! the link between `a` and `b` (intra- or inter-node); the sender is busy until then, so a
//! rank's consecutive sends serialise. A receive advances the local clock to
//! `max(clock, arrival)`. A send-receive pair overlaps its two directions: the clock ends
//! at `max(own arrival at the peer, arrival of the incoming message)`.
//!
//! Counts are per rank and exact: messages and payload bytes sent and received, and
//! *rounds*, one per `send`, `recv` or `sendrecv` call (a send-receive pair is one round).
//! Sub-communicators from [`Communicator::split`] share their rank's counters and clock.
//!
//! In real-time mode the clock is wall time since a common start, and every operation
//! sleeps until its simulated completion, so one machine can emulate a slow network.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cost_model::Topology;

use super::{check_rank, check_tag, Communicator, Tag, WRAPPER_TAG};
use crate::{Error, Result};

/// Per-rank traffic counters and the simulated clock.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SimStats {
    /// Messages this rank sent.
    pub messages_sent: u64,
    /// Messages this rank received.
    pub messages_recv: u64,
    /// Payload bytes this rank sent.
    pub bytes_sent: u64,
    /// Payload bytes this rank received.
    pub bytes_recv: u64,
    /// Communication steps: one per `send`, `recv` or `sendrecv` call.
    pub rounds: u64,
    /// Simulated time of this rank, seconds.
    pub clock_s: f64,
}

impl SimStats {
    /// Counters accumulated since `earlier` (the clock as elapsed simulated time).
    pub fn since(&self, earlier: &SimStats) -> SimStats {
        SimStats {
            messages_sent: self.messages_sent - earlier.messages_sent,
            messages_recv: self.messages_recv - earlier.messages_recv,
            bytes_sent: self.bytes_sent - earlier.bytes_sent,
            bytes_recv: self.bytes_recv - earlier.bytes_recv,
            rounds: self.rounds - earlier.rounds,
            clock_s: self.clock_s - earlier.clock_s,
        }
    }
}

/// Where a replay's prediction and a simulated run of the same calls differ: rounds,
/// messages and bytes of every rank exactly, the clocks and the slowest rank's time to a
/// relative 1e-9. `None` when they agree.
pub fn prediction_mismatch(pred: &cost_model::Prediction, got: &[SimStats]) -> Option<String> {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-15;
    if pred.per_rank.len() != got.len() {
        return Some(format!(
            "{} ranks predicted, {} simulated",
            pred.per_rank.len(),
            got.len()
        ));
    }
    for (r, (p, g)) in pred.per_rank.iter().zip(got).enumerate() {
        let fields = [
            ("rounds", p.rounds, g.rounds),
            ("messages", p.messages_sent, g.messages_sent),
            ("bytes sent", p.bytes_sent, g.bytes_sent),
            ("bytes received", p.bytes_recv, g.bytes_recv),
        ];
        if let Some((what, want, seen)) = fields.iter().find(|f| f.1 != f.2) {
            return Some(format!(
                "rank {r} {what}: {want} predicted, {seen} simulated"
            ));
        }
        if !close(p.time_s, g.clock_s) {
            return Some(format!(
                "rank {r} time: {:e} s predicted, {:e} s simulated",
                p.time_s, g.clock_s
            ));
        }
    }
    let slowest = got.iter().map(|s| s.clock_s).fold(0.0, f64::max);
    (!close(slowest, pred.time_s)).then(|| {
        format!(
            "completion: {:e} s predicted, {:e} s simulated",
            pred.time_s, slowest
        )
    })
}

/// One communication call as [`SimComm`] saw it, with peers as world ranks and payload
/// bytes (see [`SimComm::record_trace`]): what a plan's step must look like on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traced {
    /// A send.
    Send {
        /// Destination world rank.
        to: usize,
        /// Payload bytes.
        bytes: usize,
    },
    /// A receive.
    Recv {
        /// Source world rank.
        from: usize,
        /// Payload bytes.
        bytes: usize,
    },
    /// A send-receive pair.
    SendRecv {
        /// Destination world rank.
        to: usize,
        /// Payload bytes sent.
        sent: usize,
        /// Source world rank.
        from: usize,
        /// Payload bytes received.
        received: usize,
    },
}

type Trace = Arc<Mutex<Option<Vec<Traced>>>>;

/// How the simulated clock relates to wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClockMode {
    /// A logical clock: only communication advances it (plus [`SimComm::advance`]).
    #[default]
    Logical,
    /// Wall time since a common start; operations sleep until their simulated completion.
    RealTime,
}

const HEADER: usize = 8;

/// A simulating wrapper over any communicator. See the module docs for the model.
pub struct SimComm<C: Communicator> {
    inner: C,
    topology: Arc<Topology>,
    /// This communicator's rank → world rank (for choosing intra- or inter-node links).
    world_ranks: Arc<Vec<usize>>,
    state: Arc<Mutex<SimStats>>,
    /// The calls of this rank, when recording (shared with its sub-communicators).
    trace: Trace,
    mode: ClockMode,
    epoch: Instant,
}

impl<C: Communicator> SimComm<C> {
    /// Wraps `inner`, whose ranks are the world ranks of `topology` (sizes must match).
    /// In real-time mode this is collective: the ranks agree on a start with a barrier.
    pub fn new(inner: C, topology: Topology, mode: ClockMode) -> Result<Self> {
        topology.validate()?;
        topology
            .check_ranks(inner.size())
            .map_err(|e| Error::Topology(e.to_string()))?;
        if mode == ClockMode::RealTime {
            inner.barrier()?;
        }
        let world_ranks = Arc::new((0..inner.size()).collect());
        Ok(SimComm {
            inner,
            topology: Arc::new(topology),
            world_ranks,
            state: Arc::new(Mutex::new(SimStats::default())),
            trace: Arc::new(Mutex::new(None)),
            mode,
            epoch: Instant::now(),
        })
    }

    /// This rank's counters and clock so far (shared with its sub-communicators).
    pub fn stats(&self) -> SimStats {
        *self.lock()
    }

    /// Starts (or restarts) recording this rank's calls, its sub-communicators' included.
    pub fn record_trace(&self) {
        *self.trace.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    }

    /// The calls recorded since [`Self::record_trace`], in program order; stops recording.
    pub fn take_trace(&self) -> Vec<Traced> {
        self.trace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
    }

    fn log(&self, t: impl FnOnce(&dyn Fn(usize) -> usize) -> Traced) {
        let mut g = self.trace.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = g.as_mut() {
            v.push(t(&|r| self.world_ranks[r]));
        }
    }

    /// Zeroes the counters and the clock.
    pub fn reset(&self) {
        *self.lock() = SimStats::default();
    }

    /// Advances the clock by `seconds` of modelled local work (compute, top-k).
    pub fn advance(&self, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            let mut s = self.lock();
            s.clock_s += seconds;
            let until = s.clock_s;
            drop(s);
            self.sleep_until(until);
        }
    }

    /// The topology being simulated.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// Unwraps, returning the wrapped communicator.
    pub fn into_inner(self) -> C {
        self.inner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimStats> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Brings the clock up to wall time (real-time mode) and returns it.
    fn start_op(&self) -> f64 {
        let mut s = self.lock();
        if self.mode == ClockMode::RealTime {
            s.clock_s = s.clock_s.max(self.now());
        }
        s.clock_s
    }

    fn sleep_until(&self, t: f64) {
        if self.mode == ClockMode::RealTime {
            let now = self.now();
            if t > now {
                std::thread::sleep(Duration::from_secs_f64(t - now));
            }
        }
    }

    fn link_time(&self, peer: usize, bytes: usize) -> f64 {
        let me = self.world_ranks[self.inner.rank()];
        self.topology.link(me, self.world_ranks[peer]).time(bytes)
    }

    fn frame(arrival: f64, data: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(HEADER + data.len());
        m.extend_from_slice(&arrival.to_le_bytes());
        m.extend_from_slice(data);
        m
    }

    fn unframe(&self, src: usize, tag: Tag, mut msg: Vec<u8>) -> Result<(f64, Vec<u8>)> {
        if msg.len() < HEADER {
            return Err(Error::InvalidArgument(format!(
                "simulated message from rank {src} with tag {tag} lacks its header"
            )));
        }
        let arrival = f64::from_le_bytes(msg[..HEADER].try_into().expect("8 bytes"));
        msg.drain(..HEADER);
        Ok((arrival, msg))
    }

    fn record_send(&self, start: f64, dest: usize, bytes: usize) -> f64 {
        let arrival = start + self.link_time(dest, bytes);
        let mut s = self.lock();
        s.messages_sent += 1;
        s.bytes_sent += bytes as u64;
        arrival
    }

    fn finish(&self, until: f64, recv_bytes: Option<usize>) {
        let mut s = self.lock();
        s.clock_s = s.clock_s.max(until);
        s.rounds += 1;
        if let Some(n) = recv_bytes {
            s.messages_recv += 1;
            s.bytes_recv += n as u64;
        }
        let t = s.clock_s;
        drop(s);
        self.sleep_until(t);
    }
}

impl<C: Communicator> Communicator for SimComm<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    /// The topology's node of this rank's world rank (blocks of `ranks_per_node`).
    fn node(&self) -> Option<u64> {
        let world = self.world_ranks[self.inner.rank()];
        Some((world / self.topology.ranks_per_node.max(1)) as u64)
    }

    fn send(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        check_tag(tag)?;
        check_rank(dest, self.size())?;
        let start = self.start_op();
        let arrival = self.record_send(start, dest, data.len());
        self.inner.send(dest, tag, &Self::frame(arrival, data))?;
        self.finish(arrival, None);
        self.log(|w| Traced::Send {
            to: w(dest),
            bytes: data.len(),
        });
        Ok(())
    }

    fn recv(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        check_tag(tag)?;
        self.start_op();
        let (arrival, msg) = self.unframe(src, tag, self.inner.recv(src, tag)?)?;
        self.finish(arrival, Some(msg.len()));
        self.log(|w| Traced::Recv {
            from: w(src),
            bytes: msg.len(),
        });
        Ok(msg)
    }

    fn sendrecv(&self, dest: usize, st: Tag, data: &[u8], src: usize, rt: Tag) -> Result<Vec<u8>> {
        check_tag(st)?;
        check_tag(rt)?;
        check_rank(dest, self.size())?;
        let start = self.start_op();
        let sent_arrival = self.record_send(start, dest, data.len());
        let raw = self
            .inner
            .sendrecv(dest, st, &Self::frame(sent_arrival, data), src, rt)?;
        let (arrival, msg) = self.unframe(src, rt, raw)?;
        self.finish(sent_arrival.max(arrival), Some(msg.len()));
        self.log(|w| Traced::SendRecv {
            to: w(dest),
            sent: data.len(),
            from: w(src),
            received: msg.len(),
        });
        Ok(msg)
    }

    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Communicator>> {
        // Learn the members' world ranks in the same order the inner split will use.
        let inner_sub = self.inner.split(color, key)?;
        let my_world = self.world_ranks[self.rank()] as u32;
        let mut world_ranks = vec![0usize; inner_sub.size()];
        for peer in 0..inner_sub.size() {
            inner_sub.send(peer, WRAPPER_TAG, &my_world.to_le_bytes())?;
        }
        for (peer, slot) in world_ranks.iter_mut().enumerate() {
            let m = inner_sub.recv(peer, WRAPPER_TAG)?;
            let bytes: [u8; 4] = m
                .as_slice()
                .try_into()
                .map_err(|_| Error::InvalidArgument("bad split handshake".into()))?;
            *slot = u32::from_le_bytes(bytes) as usize;
        }
        Ok(Box::new(SimComm {
            inner: inner_sub,
            topology: self.topology.clone(),
            world_ranks: Arc::new(world_ranks),
            state: self.state.clone(),
            trace: self.trace.clone(),
            mode: self.mode,
            epoch: self.epoch,
        }))
    }

    /// A free, perfect barrier: every rank's clock becomes the latest clock of all ranks.
    /// Nothing is counted.
    fn barrier(&self) -> Result<()> {
        let p = self.size();
        let me = self.rank();
        let mut latest = self.start_op();
        let mut gap = 1;
        // Dissemination max-reduction of the clocks over the inner transport.
        while gap < p {
            let to = (me + gap) % p;
            let from = (me + p - gap) % p;
            let got = barrier_exchange(&self.inner, to, from, latest)?;
            latest = latest.max(got);
            gap *= 2;
        }
        let mut s = self.lock();
        s.clock_s = s.clock_s.max(latest);
        drop(s);
        self.sleep_until(latest);
        self.inner.barrier()
    }

    fn backend(&self) -> String {
        format!("sim({})", self.inner.backend())
    }
}

/// Sends `clock` to `to` and receives a clock from `from` on the wrapper tag, which the
/// inner transport accepts and SimComm's own callers cannot use.
fn barrier_exchange<C: Communicator + ?Sized>(
    inner: &C,
    to: usize,
    from: usize,
    clock: f64,
) -> Result<f64> {
    let m = inner.sendrecv(to, WRAPPER_TAG, &clock.to_le_bytes(), from, WRAPPER_TAG)?;
    let bytes: [u8; 8] = m
        .as_slice()
        .try_into()
        .map_err(|_| Error::InvalidArgument("bad barrier clock message".into()))?;
    Ok(f64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::thread::{ThreadComm, ThreadConfig};
    use cost_model::Link;

    fn topo(nodes: usize, per: usize) -> Topology {
        let intra = Link::new(1e-6, 1e-10);
        let inter = Link::new(1e-4, 1e-8);
        Topology::new(nodes, per, intra, inter).unwrap()
    }

    /// Every ordered pair exchanges 0, 1 and 2^20 bytes with sendrecv; counts are checked
    /// against hand-computed ones, and the clock against the α-β model.
    #[test]
    fn all_pairs_counts_match_hand_computation() {
        let sizes = [0usize, 1, 1 << 20];
        for (nodes, per) in [(1, 1), (1, 3), (2, 2), (3, 2)] {
            let p = nodes * per;
            let t = topo(nodes, per);
            let stats = ThreadComm::run_with(p, ThreadConfig::default(), |c| -> Result<SimStats> {
                let s = SimComm::new(c, t, ClockMode::Logical)?;
                let me = s.rank();
                for &n in &sizes {
                    for shift in 1..p {
                        let to = (me + shift) % p;
                        let from = (me + p - shift) % p;
                        let msg = vec![me as u8; n];
                        let got = s.sendrecv(to, 3, &msg, from, 3)?;
                        assert_eq!(got, vec![from as u8; n]);
                    }
                }
                Ok(s.stats())
            })
            .unwrap();
            let total_bytes: u64 = sizes.iter().map(|&n| n as u64).sum::<u64>() * (p as u64 - 1);
            for (r, st) in stats.iter().enumerate() {
                let rounds = (sizes.len() * (p - 1)) as u64;
                assert_eq!(st.messages_sent, rounds, "rank {r}");
                assert_eq!(st.messages_recv, rounds);
                assert_eq!(st.rounds, rounds);
                assert_eq!(st.bytes_sent, total_bytes);
                assert_eq!(st.bytes_recv, total_bytes);
            }
            // Clock: every rank's clock is the same chain of max(...) over the same rounds;
            // with a single node it is exactly Σ (α + β n) over rounds.
            if nodes == 1 {
                let want: f64 = sizes
                    .iter()
                    .map(|&n| (p as f64 - 1.0) * t.intra.time(n))
                    .sum();
                for st in &stats {
                    assert!(
                        (st.clock_s - want).abs() < 1e-12,
                        "{} vs {want}",
                        st.clock_s
                    );
                }
            }
        }
    }

    #[test]
    fn send_then_recv_serialises_the_sender() {
        let t = topo(1, 3);
        let stats = ThreadComm::run_with(3, ThreadConfig::default(), |c| -> Result<SimStats> {
            let s = SimComm::new(c, t, ClockMode::Logical)?;
            if s.rank() == 0 {
                s.send(1, 0, &[0u8; 1000])?;
                s.send(2, 0, &[0u8; 1000])?;
            } else {
                s.recv(0, 0)?;
            }
            Ok(s.stats())
        })
        .unwrap();
        let one = t.intra.time(1000);
        assert!((stats[0].clock_s - 2.0 * one).abs() < 1e-15);
        assert!((stats[1].clock_s - one).abs() < 1e-15);
        assert!((stats[2].clock_s - 2.0 * one).abs() < 1e-15);
        assert_eq!(stats[0].rounds, 2);
        assert_eq!(stats[1].messages_recv, 1);
    }

    #[test]
    fn split_shares_counters_and_uses_inter_node_links() {
        let t = topo(2, 2);
        let stats = ThreadComm::run_with(4, ThreadConfig::default(), |c| -> Result<SimStats> {
            let s = SimComm::new(c, t, ClockMode::Logical)?;
            // Cross-node communicator: ranks with the same local index.
            let cross = s.split((s.rank() % 2) as u32, s.rank() as u32)?;
            let peer = 1 - cross.rank();
            cross.sendrecv(peer, 0, &[0u8; 100], peer, 0)?;
            Ok(s.stats())
        })
        .unwrap();
        for st in stats {
            assert_eq!(st.rounds, 1);
            assert_eq!(st.bytes_sent, 100);
            assert!((st.clock_s - t.inter.time(100)).abs() < 1e-15);
        }
    }

    #[test]
    fn barrier_synchronises_clocks() {
        let t = topo(1, 3);
        let stats = ThreadComm::run_with(3, ThreadConfig::default(), |c| -> Result<SimStats> {
            let s = SimComm::new(c, t, ClockMode::Logical)?;
            s.advance(s.rank() as f64);
            s.barrier()?;
            Ok(s.stats())
        })
        .unwrap();
        for st in stats {
            assert_eq!(st.clock_s, 2.0);
            assert_eq!(st.rounds, 0);
        }
    }

    #[test]
    fn real_time_mode_waits_for_the_modelled_network() {
        // 1 MB over a 1 Gbit/s link takes 8 ms; 5 exchanges take at least 40 ms.
        let slow = Link::from_gbit(0.0, 1.0);
        let t = Topology::flat(2, slow).unwrap();
        let start = Instant::now();
        ThreadComm::run_with(2, ThreadConfig::default(), |c| -> Result<()> {
            let s = SimComm::new(c, t, ClockMode::RealTime)?;
            let peer = 1 - s.rank();
            for _ in 0..5 {
                s.sendrecv(peer, 0, &vec![0u8; 1_000_000], peer, 0)?;
            }
            Ok(())
        })
        .unwrap();
        assert!(start.elapsed() >= Duration::from_millis(40));
    }

    #[test]
    fn topology_must_match_size() {
        let err = ThreadComm::run_with(3, ThreadConfig::default(), |c| {
            SimComm::new(c, topo(2, 2), ClockMode::Logical).map(|_| ())
        })
        .unwrap_err();
        assert!(err.to_string().contains("does not match 3 ranks"), "{err}");
    }
}
