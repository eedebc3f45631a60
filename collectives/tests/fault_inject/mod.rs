//! Fault injection shared by the fault tests on `ThreadComm` and `MpiComm`: a communicator
//! wrapper that runs a fault (exit, SIGKILL, SIGSTOP, panic, stall, leave) in the middle of
//! a collective, at a chosen send, and the collectives the tests break.

use std::cell::Cell;

use collectives::sparse::{build, SparseAllreduce, SparseOptions};
use collectives::{allreduce, AllreduceAlgo, Communicator, DenseOptions, Error, Result, Tag};

/// The rank that fails in every fault test.
pub const FAULTY_RANK: usize = 1;

/// Dense length of the collectives the tests break.
const D: usize = 4096;

/// A collective a fault is injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// Ring allreduce of `D` floats (bandwidth-optimal, `2(P − 1)` send-receive rounds).
    Dense,
    /// SparDL's sparse allreduce of `D` floats at density 5 % (SparDL (Zhao et al.)).
    Sparse,
}

impl Collective {
    /// Both collectives.
    pub const ALL: [Collective; 2] = [Collective::Dense, Collective::Sparse];

    /// Short name, as the MPI worker takes it on its command line.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Dense => "dense",
            Collective::Sparse => "sparse",
        }
    }

    /// The collective called `name`.
    pub fn parse(name: &str) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Prepares the collective on `comm` (collective itself: the sparse algorithm agrees on
    /// its configuration), so that [`Prepared::run`] is one call of it.
    pub fn prepare(self, comm: &dyn Communicator) -> Result<Prepared> {
        Ok(match self {
            Collective::Dense => Prepared::Dense,
            Collective::Sparse => {
                Prepared::Sparse(build("spardl", comm, D, 0.05, &SparseOptions::default())?)
            }
        })
    }
}

/// A collective ready to run.
pub enum Prepared {
    /// The dense allreduce (stateless).
    Dense,
    /// The sparse allreduce with its residuals.
    Sparse(Box<dyn SparseAllreduce>),
}

impl Prepared {
    /// One call of the collective on this rank's gradient for `step`.
    pub fn run(&mut self, comm: &dyn Communicator, step: usize) -> Result<()> {
        let grad: Vec<f32> = (0..D)
            .map(|i| ((i * 7919 + comm.rank() * 104_729 + step * 31) % 1000) as f32 / 1000.0)
            .collect();
        match self {
            Prepared::Dense => {
                let mut buf = grad;
                allreduce(
                    comm,
                    &mut buf,
                    AllreduceAlgo::Ring,
                    &DenseOptions::default(),
                )
            }
            Prepared::Sparse(alg) => alg.step(comm, &grad).map(|_| ()),
        }
    }
}

/// Wraps a communicator and runs `fault` at the `n`-th send once armed; counts sends, so a
/// first unarmed call tells where the middle of the next one is.
pub struct FaultAt<C> {
    inner: C,
    sends: Cell<usize>,
    fire_at: Cell<Option<usize>>,
    fault: Box<dyn Fn() -> Error + Send>,
}

impl<C: Communicator> FaultAt<C> {
    /// Wraps `inner`; `fault` runs when armed and returns the error the send then reports
    /// (if it returns at all: exit, SIGKILL and panic do not).
    pub fn new(inner: C, fault: Box<dyn Fn() -> Error + Send>) -> Self {
        FaultAt {
            inner,
            sends: Cell::new(0),
            fire_at: Cell::new(None),
            fault,
        }
    }

    /// Sends made so far.
    pub fn sends(&self) -> usize {
        self.sends.get()
    }

    /// Runs the fault at the send `after` sends from now (1 = the next send).
    pub fn arm(&self, after: usize) {
        self.fire_at.set(Some(self.sends.get() + after.max(1)));
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    fn count_send(&self) -> Result<()> {
        let n = self.sends.get() + 1;
        self.sends.set(n);
        if self.fire_at.get() == Some(n) {
            self.fire_at.set(None);
            return Err((self.fault)());
        }
        Ok(())
    }
}

impl<C: Communicator> Communicator for FaultAt<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn send(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.count_send()?;
        self.inner.send(dest, tag, data)
    }
    fn recv(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        self.inner.recv(src, tag)
    }
    fn recv_into(&self, src: usize, tag: Tag, buf: &mut [u8]) -> Result<usize> {
        self.inner.recv_into(src, tag, buf)
    }
    fn sendrecv(&self, d: usize, st: Tag, data: &[u8], s: usize, rt: Tag) -> Result<Vec<u8>> {
        self.count_send()?;
        self.inner.sendrecv(d, st, data, s, rt)
    }
    fn sendrecv_into(
        &self,
        d: usize,
        st: Tag,
        data: &[u8],
        s: usize,
        rt: Tag,
        buf: &mut [u8],
    ) -> Result<usize> {
        self.count_send()?;
        self.inner.sendrecv_into(d, st, data, s, rt, buf)
    }
    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Communicator>> {
        self.inner.split(color, key)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn backend(&self) -> String {
        format!("fault({})", self.inner.backend())
    }
}

/// Runs `coll` on `comm` as every fault test does: one whole call unarmed (to count the
/// sends of one call), then arms the fault on [`FAULTY_RANK`] at half of that count and
/// calls again, twice. Returns the first error; survivors get it from the transport.
pub fn run_until_fault<C: Communicator>(comm: &FaultAt<C>, coll: Collective) -> Result<()> {
    let mut prepared = coll.prepare(comm)?;
    let before = comm.sends();
    prepared.run(comm, 0)?;
    let per_call = comm.sends() - before;
    assert!(per_call > 1, "{coll:?} sends {per_call} messages per call");
    if comm.rank() == FAULTY_RANK {
        comm.arm(per_call / 2 + 1);
    }
    for step in 1..3 {
        prepared.run(comm, step)?;
    }
    Ok(())
}

/// Whether `e` is what a survivor must get when a peer vanished or stalled: a receive
/// timeout, or (on transports that know) the news that a peer failed.
pub fn is_peer_loss(e: &Error) -> bool {
    matches!(e, Error::Timeout { .. } | Error::PeerFailed { .. })
}
