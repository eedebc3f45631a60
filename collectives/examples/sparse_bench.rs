//! Times every sparse allreduce of `collectives::sparse` next to the best dense allreduce.
//!
//! ```text
//! cargo run --release -p collectives --example sparse_bench -- [--ranks 4] [--log2d 22,24]
//!     [--density 0.01,0.001] [--steps 3] [--algos topka,spardl,...] [--exdyna-cold]
//! mpirun -n 4 target/release/examples/sparse_bench     # built with --features mpi
//! ```
//!
//! Without MPI the ranks are threads of this process (`ThreadComm`). Each line is the mean
//! wall time of one step on rank 0 (after one warm-up step, between barriers), the bytes
//! rank 0 sent per step, and the update's non-zeros. Dense: every dense all-reduce
//! algorithm is timed and the fastest is shown.
//!
//! ExDyna runs with `SparseOptions::exdyna_warm_start`: with the paper's initial threshold
//! `1/(2√k)` it selects most of the vector for hundreds of steps on these gradients, which
//! times a dense exchange, not ExDyna's working regime. `--exdyna-cold` keeps the paper's
//! start for comparison.

use std::time::Instant;

use collectives::dense::{allreduce, AllreduceAlgo, DenseOptions};
use collectives::sparse::{build, SparseAlgo};
use collectives::{Communicator, Result, ThreadComm};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Args {
    ranks: usize,
    log2d: Vec<u32>,
    density: Vec<f64>,
    steps: usize,
    algos: Vec<SparseAlgo>,
    exdyna_cold: bool,
}

fn parse() -> Args {
    let mut a = Args {
        ranks: 4,
        log2d: vec![22, 24],
        density: vec![0.01, 0.001],
        steps: 3,
        algos: SparseAlgo::ALL.to_vec(),
        exdyna_cold: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        if argv[i] == "--exdyna-cold" {
            a.exdyna_cold = true;
            i += 1;
            continue;
        }
        match argv[i].as_str() {
            "--ranks" => a.ranks = v.parse().unwrap_or(a.ranks),
            "--log2d" => a.log2d = v.split(',').filter_map(|x| x.parse().ok()).collect(),
            "--density" => a.density = v.split(',').filter_map(|x| x.parse().ok()).collect(),
            "--steps" => a.steps = v.parse().unwrap_or(a.steps).max(1),
            "--algos" => match v.split(',').map(str::parse).collect() {
                Ok(algos) => a.algos = algos,
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(2);
                }
            },
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    a
}

fn gradient(rank: usize, d: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(rank as u64 + 1);
    (0..d)
        .map(|_| rng.gen_range(-1.0f32..1.0) * rng.gen_range(0.0f32..1.0).powi(4))
        .collect()
}

fn bench(comm: &dyn Communicator, args: &Args) -> Result<()> {
    let p = comm.size();
    let me = comm.rank();
    if me == 0 {
        println!(
            "# backend {} P={p}, {} timed steps each\n{:>6} {:>8} {:>13} {:>11} {:>13} {:>10}",
            comm.backend(),
            args.steps,
            "log2d",
            "density",
            "algorithm",
            "ms/step",
            "bytes sent",
            "nnz"
        );
    }
    for &l in &args.log2d {
        let d = 1usize << l;
        let grad = gradient(me, d);
        // The best dense all-reduce.
        let mut best: Option<(f64, &'static str)> = None;
        for algo in AllreduceAlgo::all(p) {
            let mut buf = grad.clone();
            let opts = DenseOptions::default().unchecked();
            allreduce(comm, &mut buf, algo, &opts)?;
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..args.steps {
                buf.copy_from_slice(&grad);
                allreduce(comm, &mut buf, algo, &opts)?;
            }
            comm.barrier()?;
            let ms = t.elapsed().as_secs_f64() * 1e3 / args.steps as f64;
            if best.is_none_or(|(b, _)| ms < b) {
                best = Some((ms, algo.name()));
            }
        }
        if let (0, Some((ms, name))) = (me, best) {
            println!(
                "{l:>6} {:>8} {:>13} {ms:>11.2} {:>13} {d:>10}",
                "dense",
                format!("dense:{name}"),
                4 * d
            );
        }
        for &density in &args.density {
            for &algo in &args.algos {
                let name = algo.name();
                let algo = match algo {
                    SparseAlgo::HiTopK {
                        f16_wire, selector, ..
                    } if p % 2 == 0 && p > 2 => SparseAlgo::HiTopK {
                        ranks_per_node: Some(p / 2),
                        f16_wire,
                        selector,
                    },
                    SparseAlgo::ExDyna { .. } => SparseAlgo::ExDyna {
                        warm_start: !args.exdyna_cold,
                    },
                    a => a,
                };
                let mut alg = build(algo, comm, d, density)?;
                alg.step(comm, &grad)?;
                comm.barrier()?;
                let t = Instant::now();
                let mut bytes = 0;
                let mut nnz = 0;
                for _ in 0..args.steps {
                    let (u, st) = alg.step(comm, &grad)?;
                    bytes += st.bytes_sent;
                    nnz = u.nnz();
                }
                comm.barrier()?;
                let ms = t.elapsed().as_secs_f64() * 1e3 / args.steps as f64;
                if me == 0 {
                    println!(
                        "{l:>6} {density:>8} {name:>13} {ms:>11.2} {:>13} {nnz:>10}",
                        bytes / args.steps as u64
                    );
                }
            }
        }
    }
    Ok(())
}

fn main() {
    // Under mpirun each rank's selectors get its share of the node's cores, not all of them.
    collectives::comm::launcher::share_cores_among_ranks();
    let args = parse();
    #[cfg(feature = "mpi")]
    if collectives::comm::launcher::mpi_launcher().is_some() {
        let comm = collectives::MpiComm::world().unwrap_or_else(|e| {
            eprintln!("cannot start MPI: {e}");
            std::process::exit(2)
        });
        if let Err(e) = bench(&comm, &args) {
            eprintln!("rank {}: {e}", comm.rank());
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = ThreadComm::run(args.ranks, |comm| bench(&comm, &args)) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
