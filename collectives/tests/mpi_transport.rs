//! Transport checks over a real MPI world; run under `mpirun -n P` (P = 1, 2, 3, 4, 6 in
//! `cargo xtask ci`). Every rank checks what it received from every other rank; rank 0 prints
//! one `ok:` line per passed check. A failure aborts the whole job with a non-zero code.

#[path = "support/mpi.rs"]
mod mpi;

use mpi::check;
use std::time::Duration;

use collectives::dense::{allreduce, AllreduceAlgo, DenseOptions};
use collectives::{ClockMode, CommExt, Communicator, Error, MpiComm, Result, SimComm, SimStats};
use cost_model::{Link, Topology};
use half::{bf16, f16};

fn pattern(from: usize, to: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i * 31 + from * 7 + to * 13) as u8)
        .collect()
}

fn all_pairs_bytes(c: &dyn Communicator) -> Result<()> {
    for (t, &n) in [0usize, 1, 1 << 20].iter().enumerate() {
        for peer in 0..c.size() {
            c.send(peer, t as u32, &pattern(c.rank(), peer, n))?;
        }
        for peer in 0..c.size() {
            let got = c.recv(peer, t as u32)?;
            check(
                got == pattern(peer, c.rank(), n),
                format!("{n} bytes from {peer}"),
            )?;
        }
    }
    Ok(())
}

fn ring_sendrecv_typed(c: &dyn Communicator) -> Result<()> {
    let p = c.size();
    let right = (c.rank() + 1) % p;
    let left = (c.rank() + p - 1) % p;
    let f: Vec<f32> = c.sendrecv_vec(right, 10, &[c.rank() as f32, 0.5], left, 10)?;
    check(f == vec![left as f32, 0.5], "f32 ring")?;
    let u: Vec<u32> = c.sendrecv_vec(right, 11, &[c.rank() as u32; 3], left, 11)?;
    check(u == vec![left as u32; 3], "u32 ring")?;
    let h: Vec<f16> = c.sendrecv_vec(right, 12, &[f16::from_f32(c.rank() as f32)], left, 12)?;
    check(h[0].to_f32() == left as f32, "f16 ring")?;
    let mut b = [bf16::ZERO; 2];
    let n = c.sendrecv_slice_into(right, 13, &[bf16::from_f32(1.5); 2], left, 13, &mut b)?;
    check(n == 2 && b[1].to_f32() == 1.5, "bf16 ring into buffer")?;
    // Large exchange through sendrecv (rendezvous-sized, both directions at once).
    let big = pattern(c.rank(), right, 4 << 20);
    let got = c.sendrecv(right, 14, &big, left, 14)?;
    check(got == pattern(left, c.rank(), 4 << 20), "4 MiB sendrecv")?;
    Ok(())
}

fn bad_input(c: &dyn Communicator) -> Result<()> {
    check(
        matches!(c.send(c.size(), 0, &[]), Err(Error::InvalidRank { .. })),
        "invalid rank rejected",
    )?;
    check(
        matches!(c.send(0, 0x7F00, &[]), Err(Error::ReservedTag { .. })),
        "reserved tag rejected",
    )?;
    c.send(c.rank(), 20, &[1, 2, 3, 4, 5])?;
    let mut small = [0u8; 4];
    check(
        matches!(
            c.recv_into(c.rank(), 20, &mut small),
            Err(Error::MessageTooLarge { len: 5, .. })
        ),
        "message larger than buffer",
    )?;
    Ok(())
}

fn split_and_barrier(c: &dyn Communicator) -> Result<()> {
    let color = (c.rank() % 2) as u32;
    let sub = c.split(color, (100 - c.rank()) as u32)?;
    let members: Vec<usize> = (0..c.size())
        .filter(|r| r % 2 == color as usize)
        .rev()
        .collect();
    check(sub.size() == members.len(), "split size")?;
    check(members[sub.rank()] == c.rank(), "split order by key")?;
    for peer in 0..sub.size() {
        sub.send_slice(peer, 1, &[c.rank() as u32])?;
    }
    for (peer, &world) in members.iter().enumerate() {
        let got: Vec<u32> = sub.recv_vec(peer, 1)?;
        check(got == vec![world as u32], "split traffic")?;
    }
    sub.barrier()?;
    c.barrier()
}

/// [`Communicator::barrier_idle`] waits like a barrier: the last rank enters 60 ms late,
/// and every other rank must spend most of that in it (a barrier that returned at once,
/// or a no-op, fails here), then an ordinary barrier still works after it.
fn idle_barrier_waits(c: &dyn Communicator) -> Result<()> {
    let late = c.size() - 1;
    let start = std::time::Instant::now();
    if c.rank() == late {
        std::thread::sleep(Duration::from_millis(60));
    }
    c.barrier_idle()?;
    let waited = start.elapsed();
    check(
        c.rank() == late || waited >= Duration::from_millis(45),
        format!("rank {} left the idle barrier after {waited:?}", c.rank()),
    )?;
    c.barrier()
}

/// A rank that waits on the shared segment keeps the library's traffic moving: rank 0
/// sends 8 MiB to the last rank (a buffered send; without single copy, as `cargo xtask
/// ci` runs Open MPI, the library moves its later pieces only inside its calls) and goes
/// straight into a shared-memory all-reduce, while the last rank first receives the
/// message. Before the segment's waits drove the library's progress, rank 0 waited in
/// the all-reduce for the last rank, which waited in its receive for rank 0, until the
/// timeout (10 s here) ended both.
fn send_in_flight_during_shared_wait(c: &mut MpiComm) -> Result<()> {
    let (p, last) = (c.size(), c.size() - 1);
    if p == 1 {
        return Ok(());
    }
    check(
        c.shared_segment().is_some(),
        "one node: the world has a shared segment",
    )?;
    c.set_timeout(Duration::from_secs(10));
    let n = 8 << 20;
    let out = (|| {
        if c.rank() == 0 {
            c.send(last, 30, &pattern(0, last, n))?;
        } else if c.rank() == last {
            let got = c.recv(0, 30)?;
            check(got == pattern(0, last, n), "8 MiB beside the shared wait")?;
        }
        let mut buf = vec![1.0f32; 64];
        // Unchecked: the options' agreement is a message exchange, which would move the
        // send on before the wait.
        let opts = DenseOptions::default().unchecked();
        allreduce(&*c, &mut buf, AllreduceAlgo::SharedMemory, &opts)?;
        check(buf.iter().all(|&x| x == p as f32), "shared all-reduce sum")
    })();
    c.set_timeout(Duration::from_secs(60));
    out?;
    c.barrier()
}

fn sim_counts(c: MpiComm) -> Result<MpiComm> {
    let p = c.size();
    let link = Link::new(1e-5, 1e-9);
    let topo = Topology::flat(p, link).map_err(|e| Error::Topology(e.to_string()))?;
    let s = SimComm::new(c, topo, ClockMode::Logical)?;
    for shift in 1..p {
        let to = (s.rank() + shift) % p;
        let from = (s.rank() + p - shift) % p;
        s.sendrecv(to, 2, &vec![0u8; 1000], from, 2)?;
    }
    let st: SimStats = s.stats();
    let r = (p - 1) as u64;
    check(
        st.rounds == r && st.bytes_sent == 1000 * r && st.bytes_recv == 1000 * r,
        "SimComm counts over MPI",
    )?;
    check(
        (st.clock_s - r as f64 * link.time(1000)).abs() < 1e-12,
        "SimComm clock over MPI",
    )?;
    s.barrier()?;
    Ok(s.into_inner())
}

fn timeout(mut c: MpiComm) -> Result<MpiComm> {
    c.set_timeout(Duration::from_millis(300));
    let r = c.recv(c.rank(), 99);
    check(
        matches!(r, Err(Error::Timeout { tag: 99, .. })),
        "missing message times out",
    )?;
    c.set_timeout(Duration::from_secs(60));
    c.barrier()?;
    Ok(c)
}

fn main() {
    let comm = mpi::world();
    let report = mpi::reporter("mpi_transport", &comm);
    report(
        "all pairs exchange 0, 1, 2^20 bytes",
        all_pairs_bytes(&comm),
    );
    report(
        "ring sendrecv f32/u32/f16/bf16 and 4 MiB",
        ring_sendrecv_typed(&comm),
    );
    report("typed errors for bad input", bad_input(&comm));
    report("split by colour and key, barrier", split_and_barrier(&comm));
    report(
        "idle barrier waits for the last rank",
        idle_barrier_waits(&comm),
    );
    let mut comm = comm;
    report(
        "a send in flight does not stall a shared-memory wait",
        send_in_flight_during_shared_wait(&mut comm),
    );
    let comm = match sim_counts(comm) {
        Ok(c) => {
            report("SimComm counts and clock over MPI", Ok(()));
            c
        }
        Err(e) => {
            report("SimComm counts and clock over MPI", Err(e));
            unreachable!()
        }
    };
    let comm = match timeout(comm) {
        Ok(c) => c,
        Err(e) => {
            report("timeout", Err(e));
            unreachable!()
        }
    };
    report("missing message ends in a timeout", Ok(()));
    drop(comm);
}
