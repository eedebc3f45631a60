//! The dense correctness checks under a real MPI world (run with `mpirun -n P`): every
//! algorithm equals the f64 reference within f32 rounding and every rank holds the same
//! bits; bad input gives a typed error on every rank. Prints `ok: <check>` on rank 0 and
//! exits non-zero on failure.

#[path = "support/dense_ref.rs"]
mod dense_ref;
#[path = "support/mpi.rs"]
mod mpi;

use collectives::dense::{
    allgather, allgatherv, allreduce, block_range, broadcast, reduce, reduce_scatter,
    AllgatherAlgo, AllreduceAlgo, BroadcastAlgo, DenseOptions, OnlineChoice, ReduceAlgo,
    ReduceScatterAlgo, WireType,
};
use collectives::{Communicator, Error, MpiComm};
use dense_ref::{input, reference};

fn within(got: &[f32], seed: u64, p: usize, eps: f64) -> bool {
    let n = got.len();
    let (sum, mag) = reference(seed, p, n);
    let k = (2 * p + 2) as f64 * (eps + 2f64.powi(-24));
    (0..n).all(|i| (got[i] as f64 - sum[i]).abs() <= k * mag[i] + 1e-30)
}

/// FNV-1a of the bits, compared across ranks with an all-gather.
fn same_everywhere(comm: &MpiComm, v: &[f32]) -> collectives::Result<bool> {
    let mut h: u64 = 0xcbf29ce484222325;
    for x in v {
        h = (h ^ x.to_bits() as u64).wrapping_mul(0x100000001b3);
    }
    let mut all = vec![0u64; comm.size()];
    allgather(
        comm,
        &[h],
        &mut all,
        AllgatherAlgo::Bruck,
        &DenseOptions::default(),
    )?;
    Ok(all.iter().all(|&x| x == all[0]))
}

struct Checks<'a> {
    comm: &'a MpiComm,
    failed: Vec<String>,
}

impl Checks<'_> {
    fn check(&mut self, name: String, ok: collectives::Result<bool>) {
        // Every rank must agree that the check passed.
        let mine = matches!(ok, Ok(true)) as u8;
        let mut all = vec![0u8; self.comm.size()];
        let agreed = allgather(
            self.comm,
            &[mine],
            &mut all,
            AllgatherAlgo::Ring,
            &DenseOptions::default(),
        )
        .map(|_| all.iter().all(|&x| x == 1))
        .unwrap_or(false);
        if agreed {
            if self.comm.rank() == 0 {
                println!("ok: {name}");
            }
        } else {
            eprintln!("rank {}: FAILED {name}: {ok:?}", self.comm.rank());
            self.failed.push(name);
        }
    }
}

fn main() {
    let comm = mpi::world();
    let p = comm.size();
    let r = comm.rank();
    let mut c = Checks {
        comm: &comm,
        failed: Vec::new(),
    };
    let mut algos = vec![
        AllreduceAlgo::Ring,
        AllreduceAlgo::RecursiveDoubling,
        AllreduceAlgo::Rabenseifner,
        AllreduceAlgo::BidirectionalExchange,
        AllreduceAlgo::Binomial,
        AllreduceAlgo::LinearPipeline { block_bytes: 40 },
    ];
    for rpn in 1..=p {
        if p % rpn == 0 {
            algos.push(AllreduceAlgo::Torus2d {
                ranks_per_node: rpn,
            });
        }
    }
    for wire in [WireType::F32, WireType::F16, WireType::Bf16] {
        let eps = match wire {
            WireType::F32 => 2f64.powi(-24),
            WireType::F16 => 2f64.powi(-11),
            _ => 2f64.powi(-8),
        };
        // The library's own all-reduce sums f32 on the wire only (checked below).
        // So do the shared-memory ones (one node under mpirun here); their larger sizes
        // take the split path and several rounds.
        let library = (wire == WireType::F32).then_some(AllreduceAlgo::Library);
        let shared = (wire == WireType::F32).then_some(AllreduceAlgo::SharedMemory);
        for &algo in algos.iter().chain(&library).chain(&shared) {
            let large: &[usize] = if algo == AllreduceAlgo::SharedMemory {
                &[9000 + p, 300_001]
            } else {
                &[]
            };
            for &n in [0usize, 1, p + 1, 1000 + p].iter().chain(large) {
                let seed = 42 + n as u64;
                let mut buf = input(seed, r, n);
                let res = allreduce(&comm, &mut buf, algo, &DenseOptions::with_wire(wire))
                    .and_then(|_| Ok(within(&buf, seed, p, eps) && same_everywhere(&comm, &buf)?));
                c.check(
                    format!(
                        "allreduce {} {} p={p} n={n} bit-identical",
                        algo.name(),
                        wire.name()
                    ),
                    res,
                );
            }
        }
    }
    c.check(
        format!("one node: the world has a shared segment p={p}"),
        Ok(comm.shared_segment().is_some()),
    );
    // Whether the kernel allows single-copy reads depends on the machine; every rank must
    // have the same answer.
    let single = comm.shared_segment().is_some_and(|s| s.reads_peers());
    if r == 0 {
        println!("single-copy reads of peers' buffers: {single}");
    }
    c.check(
        format!("single-copy reads agreed p={p}"),
        same_everywhere(&comm, &[f32::from(u8::from(single))]),
    );
    // A plain split has no segment (it is cheap); a split with one runs the shared-memory
    // all-gather, its single-copy sizes included, and sums like the world.
    let plain = comm
        .split(0, r as u32)
        .map(|s| s.shared_segment().is_none());
    c.check(format!("a plain split has no segment p={p}"), plain);
    let res = comm.split_with_segment(0, r as u32).and_then(|sub| {
        let n = 40_000;
        let mut out = vec![0f32; n * p];
        allgather(
            &sub,
            &input(3, r, n),
            &mut out,
            AllgatherAlgo::SharedMemory,
            &DenseOptions::default(),
        )?;
        let mut buf = input(4, r, 1000);
        allreduce(
            &sub,
            &mut buf,
            AllreduceAlgo::SharedMemory,
            &DenseOptions::default(),
        )?;
        Ok(sub.shared_segment().is_some()
            && (0..p).all(|q| out[q * n..(q + 1) * n] == input(3, q, n)[..])
            && within(&buf, 4, p, 2f64.powi(-24)))
    });
    c.check(
        format!("a split with a segment gathers and sums p={p}"),
        res,
    );
    for algo in AllgatherAlgo::ALL
        .into_iter()
        .chain([AllgatherAlgo::Library, AllgatherAlgo::SharedMemory])
    {
        // The shared-memory all-gather reads 160 KB blocks straight from the peers'
        // buffers (where the kernel allows it) and 1.2 MB ones through the slots.
        let sizes: &[usize] = if algo == AllgatherAlgo::SharedMemory {
            &[40_000, 300_007]
        } else {
            &[7]
        };
        for &n in sizes {
            let mut out = vec![0f32; n * p];
            let res = allgather(
                &comm,
                &input(1, r, n),
                &mut out,
                algo,
                &DenseOptions::default(),
            )
            .map(|_| (0..p).all(|q| out[q * n..(q + 1) * n] == input(1, q, n)[..]));
            c.check(format!("allgather {} n={n} p={p}", algo.name()), res);
        }
        let cnt = |q: usize| (3 * q + 1) % 4;
        let res = allgatherv(&comm, &input(2, r, cnt(r)), algo)
            .map(|g| (0..p).all(|q| g.part(q) == &input(2, q, cnt(q))[..]));
        c.check(format!("allgatherv {} p={p}", algo.name()), res);
    }
    for algo in ReduceScatterAlgo::ALL
        .into_iter()
        .chain([ReduceScatterAlgo::Library, ReduceScatterAlgo::SharedMemory])
    {
        let n = if algo == ReduceScatterAlgo::SharedMemory {
            300_000 * p + 2
        } else {
            3 * p + 2
        };
        let mut buf = input(3, r, n);
        let res = reduce_scatter(&comm, &mut buf, algo, &DenseOptions::default()).map(|range| {
            let full: Vec<f32> = buf[range.clone()].to_vec();
            range == block_range(n, p, r) && {
                // Compare the owned block with the reference of the whole vector.
                let mut sum = vec![0f64; n];
                for q in 0..p {
                    for (i, x) in input(3, q, n).into_iter().enumerate() {
                        sum[i] += x as f64;
                    }
                }
                full.iter()
                    .zip(&sum[range])
                    .all(|(a, b)| (*a as f64 - b).abs() < 1e-5 * p as f64)
            }
        });
        c.check(format!("reduce_scatter {} p={p}", algo.name()), res);
    }
    for root in 0..p {
        for algo in [
            BroadcastAlgo::Binomial,
            BroadcastAlgo::ScatterAllgather,
            BroadcastAlgo::LinearPipeline { block_bytes: 12 },
        ] {
            let n = 50;
            let mut buf = if r == root {
                input(4, root, n)
            } else {
                vec![0f32; n]
            };
            let res = broadcast(&comm, &mut buf, root, algo, &DenseOptions::default())
                .map(|_| buf == input(4, root, n));
            c.check(format!("broadcast {} root={root} p={p}", algo.name()), res);
        }
        for algo in [
            ReduceAlgo::Binomial,
            ReduceAlgo::LinearPipeline { block_bytes: 12 },
        ] {
            let n = 50;
            let mut buf = input(5, r, n);
            let res = reduce(&comm, &mut buf, root, algo, &DenseOptions::default())
                .map(|_| r != root || within(&buf, 5, p, 2f64.powi(-24)));
            c.check(format!("reduce {} root={root} p={p}", algo.name()), res);
        }
    }
    // Bad input: a typed error on every rank.
    if p > 1 {
        let mut buf = vec![1f32; 10 + (r == p - 1) as usize];
        let res = allreduce(
            &comm,
            &mut buf,
            AllreduceAlgo::Ring,
            &DenseOptions::default(),
        );
        c.check(
            format!("length mismatch is Error::Mismatch on every rank p={p}"),
            Ok(matches!(res, Err(Error::Mismatch { .. }))),
        );
    }
    let res = allreduce(
        &comm,
        &mut [1.0; 4],
        AllreduceAlgo::Library,
        &DenseOptions::with_wire(WireType::F16),
    );
    c.check(
        format!("library all-reduce with an f16 wire rejected p={p}"),
        Ok(matches!(res, Err(Error::InvalidArgument(_)))),
    );
    let res = allreduce(
        &comm,
        &mut [1.0; 4],
        AllreduceAlgo::LinearPipeline { block_bytes: 0 },
        &DenseOptions::default(),
    );
    c.check(
        format!("LP block 0 rejected p={p}"),
        Ok(matches!(res, Err(Error::InvalidArgument(_)))),
    );
    let res = allreduce(
        &comm,
        &mut [1.0; 4],
        AllreduceAlgo::Torus2d {
            ranks_per_node: p + 1,
        },
        &DenseOptions::default(),
    );
    c.check(
        format!("torus topology not dividing P rejected p={p}"),
        Ok(matches!(res, Err(Error::Topology(_)))),
    );

    // The online choice: every call right, and every rank on the same algorithms after
    // the ranks have agreed on the candidates' times several times (the library's
    // collective is among them under MPI).
    let mut online = OnlineChoice::new();
    let mut res = Ok(true);
    for call in 0..300 {
        let n = [5 + p, 20_000 + p][call % 2];
        let seed = 7 + n as u64;
        let mut buf = input(seed, r, n);
        let ok = online
            .allreduce(&comm, &mut buf, None, &DenseOptions::default())
            .map(|_| within(&buf, seed, p, 2f64.powi(-24)));
        if !matches!(ok, Ok(true)) {
            res = ok;
            break;
        }
    }
    // FNV-1a of the names of the algorithms in use.
    let in_use: Vec<u64> = [5 + p, 20_000 + p]
        .iter()
        .map(|&n| {
            let name = online.allreduce_in_use(4 * n).map_or("none", |a| a.name());
            name.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100000001b3)
            })
        })
        .collect();
    let mut all = vec![0u64; 2 * p];
    let agree = allgather(
        &comm,
        &in_use,
        &mut all,
        AllgatherAlgo::Ring,
        &DenseOptions::default(),
    )
    .map(|_| all.chunks(2).all(|x| x == in_use.as_slice()));
    c.check(
        format!("online choice: sums right, same algorithms on every rank p={p}"),
        res.and_then(|ok| Ok(ok && agree?)),
    );

    let failed = c.failed.len();
    drop(c);
    drop(comm);
    if failed > 0 {
        eprintln!("{failed} checks failed");
        std::process::exit(1);
    }
}
