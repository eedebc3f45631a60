//! The sparse allreduce checks over a real MPI world; run under `mpirun -n P` (P = 1, 2,
//! 3, 4, 6 in `cargo xtask ci`). Rank 0 collects every rank's update and mass balance and
//! prints one `ok:` line per passed check; a failure exits non-zero.

#[path = "support/mpi.rs"]
mod mpi;

use collectives::sparse::{build, SparseAlgo};
use collectives::{ClockMode, CommExt, Communicator, Error, MpiComm, Result, SimComm};
use cost_model::{Link, Topology};
use mpi::check;
use sparsify::SparseGrad;

fn grad_for(rank: usize, step: usize, d: usize) -> Vec<f32> {
    (0..d)
        .map(|i| {
            let x = ((i * 2654435761 + rank * 40503 + step * 9973) % 20011) as f32 / 20011.0 - 0.5;
            if i % 7 == 0 {
                x
            } else {
                0.1 * x
            }
        })
        .collect()
}

/// `algo` with options that fit P (two nodes for HiTopKComm when P is even).
fn opts_for(algo: SparseAlgo, p: usize) -> SparseAlgo {
    match algo {
        SparseAlgo::HiTopK {
            f16_wire, selector, ..
        } if p % 2 == 0 => SparseAlgo::HiTopK {
            ranks_per_node: Some(p / 2),
            f16_wire,
            selector,
        },
        a => a,
    }
}

/// Three steps of `algo`; rank 0 checks identical updates and the mass balance.
fn identical_and_conserving(c: &dyn Communicator, algo: SparseAlgo, density: f64) -> Result<()> {
    identical_and_conserving_as(c, algo, density, true)
}

/// [`identical_and_conserving`], with the options fitted to P (`fit`) or as given.
fn identical_and_conserving_as(
    c: &dyn Communicator,
    algo: SparseAlgo,
    density: f64,
    fit: bool,
) -> Result<()> {
    let p = c.size();
    let d = 97 * p + 13;
    let name = algo.name();
    let algo = if fit { opts_for(algo, p) } else { algo };
    let mut alg = build(algo, c, d, density)?;
    for s in 0..3 {
        let grad = grad_for(c.rank(), s, d);
        let before = alg.residual().to_vec();
        let (u, st) = alg.step(c, &grad)?;
        let bal: Vec<f64> = (0..d)
            .map(|i| grad[i] as f64 + before[i] as f64 - alg.residual()[i] as f64)
            .collect();
        // The f16 wire keeps its rounding in the residual, so only the f32 wire empties it.
        if density == 1.0 && !algo.f16_wire() {
            check(
                alg.residual().iter().all(|x| x.abs() < 1e-5),
                format!("{name}: residual at density 1"),
            )?;
        }
        if c.rank() != 0 {
            c.send(0, 1, &u.encode())?;
            c.send_slice(0, 2, &bal)?;
            c.send_slice(0, 3, &[st.mass_dropped])?;
        } else {
            let mut total = bal;
            let mut dropped = st.mass_dropped;
            for r in 1..p {
                let other = SparseGrad::<f32>::decode(&c.recv(r, 1)?)?;
                let same = other.indices() == u.indices()
                    && other
                        .values()
                        .iter()
                        .zip(u.values())
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                check(
                    same,
                    format!("{name}: rank {r} step {s} update differs from rank 0"),
                )?;
                let b: Vec<f64> = c.recv_vec(r, 2)?;
                for (t, x) in total.iter_mut().zip(b) {
                    *t += x;
                }
                dropped += c.recv_vec::<f64>(r, 3)?[0];
            }
            let upd = u.to_dense();
            let mut gap = 0.0;
            for i in 0..d {
                let diff = total[i] - p as f64 * upd[i] as f64;
                gap += diff;
                if name != "gtopk" {
                    check(
                        diff.abs() <= 1e-4,
                        format!("{name}: step {s} index {i} loses mass {diff}"),
                    )?;
                }
            }
            check(
                (gap - dropped).abs() <= 1e-3,
                format!("{name}: lost {gap}, reported {dropped}"),
            )?;
        }
    }
    c.barrier()
}

/// SparDL's rounds and bytes under SimComm equal SparDL (Zhao et al.) Table 1.
fn spardl_table1(c: MpiComm) -> Result<MpiComm> {
    let p = c.size();
    let topo =
        Topology::flat(p, Link::new(1e-5, 1e-9)).map_err(|e| Error::Topology(e.to_string()))?;
    let s = SimComm::new(c, topo, ClockMode::Logical)?;
    let d = 300 * p + 7;
    let density = 0.05;
    let mut alg = build("spardl".parse()?, &s, d, density)?;
    let before = s.stats();
    alg.step(&s, &grad_for(s.rank(), 0, d))?;
    let st = s.stats().since(&before);
    let kb = (d.div_ceil(p) as f64 * density).floor() as u64;
    let l = if p <= 1 {
        0
    } else {
        (usize::BITS - (p - 1).leading_zeros()) as u64
    };
    check(
        st.rounds == 2 * l,
        format!("rounds {} vs 2⌈log2 P⌉ = {}", st.rounds, 2 * l),
    )?;
    check(
        st.bytes_recv == 16 * kb * (p as u64 - 1),
        format!("bytes {}", st.bytes_recv),
    )?;
    s.barrier()?;
    Ok(s.into_inner())
}

fn bad_input(c: &dyn Communicator) -> Result<()> {
    let d = if c.rank() == c.size() - 1 { 101 } else { 100 };
    let r = build("spardl".parse()?, c, d, 0.1);
    if c.size() > 1 {
        check(
            matches!(r, Err(Error::Mismatch { .. })),
            "different d is a mismatch on every rank",
        )?;
    }
    let r = build("exdyna".parse()?, c, 100, 0.0);
    check(
        matches!(r, Err(Error::InvalidArgument(_))),
        "density 0 is rejected",
    )?;
    c.barrier()
}

/// The node structure comes from MPI: the shared-memory groups (one host: one node of P),
/// or blocks of `COLLECTIVES_RANKS_PER_NODE` when the launcher sets it; HiTopKComm with the
/// FP16 wire and no explicit ranks per node runs on that structure.
fn nodes_from_mpi(c: &dyn Communicator) -> Result<()> {
    let n = collectives::comm::nodes::ranks_per_node(c)?;
    let want = match std::env::var(collectives::comm::mpi::RANKS_PER_NODE_ENV) {
        Ok(v) => v.trim().parse::<usize>().unwrap_or(0),
        Err(_) => c.size(),
    };
    check(n == want, format!("{n} ranks per node, expected {want}"))?;
    if c.rank() == 0 {
        println!("  nodes: {} × {n} ranks", c.size() / n);
    }
    let hitopk = SparseAlgo::HiTopK {
        ranks_per_node: None,
        f16_wire: true,
        selector: None,
    };
    identical_and_conserving_as(c, hitopk, 0.05, false)
}

fn main() {
    let comm = mpi::world();
    let report = mpi::reporter("mpi_sparse", &comm);
    report(
        "node structure from MPI; HiTopKComm FP16 on it: identical updates, mass balance",
        nodes_from_mpi(&comm),
    );
    for algo in SparseAlgo::ALL {
        report(
            &format!("{algo}: identical updates, mass balance"),
            identical_and_conserving(&comm, algo, 0.05),
        );
        report(
            &format!("{algo}: density 1 equals the dense average"),
            identical_and_conserving(&comm, algo, 1.0),
        );
    }
    report("typed errors on every rank for bad input", bad_input(&comm));
    match spardl_table1(comm) {
        Ok(c) => {
            report(
                "SparDL rounds and bytes equal Table 1 under SimComm",
                Ok(()),
            );
            drop(c);
        }
        Err(e) => report(
            "SparDL rounds and bytes equal Table 1 under SimComm",
            Err(e),
        ),
    }
}
