//! `NcclComm` over two GPUs driven by two `ThreadComm` ranks, compared with host
//! references. Skips (prints "skipped: ...", passes) without libcuda, libnccl or two GPUs.

use collectives::{Communicator, Error, NcclComm, ThreadComm, ThreadConfig};

const P: usize = 2;

/// `Some(reason)` when this machine cannot run the two-GPU checks.
fn skip_reason() -> Option<String> {
    match NcclComm::probe() {
        Err(e) => Some(e.to_string()),
        Ok(n) if n < P => Some(format!("{n} CUDA device(s), need {P}")),
        Ok(_) => None,
    }
}

/// Deterministic per-rank data: small integers, so f32 sums are exact in any order.
fn data(rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + rank * 13) % 17) as f32 - 8.0)
        .collect()
}

fn config() -> ThreadConfig {
    ThreadConfig::with_timeout(std::time::Duration::from_secs(60))
}

#[test]
fn probe_never_panics() {
    match NcclComm::probe() {
        Ok(n) => println!("probe: {n} CUDA device(s) with libnccl"),
        Err(e) => {
            assert!(matches!(e, Error::Nccl(_)), "{e:?}");
            println!("probe: {e}");
        }
    }
}

#[test]
fn bootstrap_without_gpu_is_a_typed_error_on_every_rank() {
    if NcclComm::probe().is_ok() {
        println!("skipped: a GPU is present, the bootstrap is checked by the GPU tests");
        return;
    }
    let results = ThreadComm::run_all(P, config(), |comm| NcclComm::new(&comm).map(|_| ()))
        .expect("threads ran");
    assert_eq!(results.len(), P);
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Err(Error::Nccl(msg)) => println!("rank {rank}: {msg}"),
            other => panic!("rank {rank}: expected Error::Nccl, got {other:?}"),
        }
    }
}

#[test]
fn allreduce_allgather_broadcast_reduce_scatter_match_host() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let n = 1000usize;
    let sum: Vec<f32> = (0..n)
        .map(|i| (0..P).map(|r| data(r, n)[i]).sum())
        .collect();
    let gathered: Vec<f32> = (0..P).flat_map(|r| data(r, n)).collect();

    let out = ThreadComm::run_with(P, config(), |comm| -> collectives::Result<()> {
        let rank = comm.rank();
        let nc = NcclComm::new(&comm)?;
        assert_eq!((nc.rank(), nc.size()), (rank, P));
        let s = nc.stream().clone();
        let dev = |e: cudarc::driver::DriverError| Error::Nccl(e.to_string());

        // Host convenience all-reduce.
        let mut host = data(rank, n);
        nc.allreduce_sum_host(&mut host)?;
        assert_eq!(host, sum, "allreduce_sum_host on rank {rank}");

        // Device all-reduce.
        let mut buf = s.clone_htod(&data(rank, n)).map_err(dev)?;
        nc.allreduce_sum(&mut buf)?;
        assert_eq!(
            s.clone_dtoh(&buf).map_err(dev)?,
            sum,
            "allreduce rank {rank}"
        );

        // All-gather.
        let send = s.clone_htod(&data(rank, n)).map_err(dev)?;
        let mut recv = s.alloc_zeros::<f32>(n * P).map_err(dev)?;
        nc.allgather(&send, &mut recv)?;
        assert_eq!(
            s.clone_dtoh(&recv).map_err(dev)?,
            gathered,
            "allgather rank {rank}"
        );

        // Broadcast from the last rank.
        let root = P - 1;
        let mut b = s.clone_htod(&data(rank, n)).map_err(dev)?;
        nc.broadcast(&mut b, root)?;
        assert_eq!(
            s.clone_dtoh(&b).map_err(dev)?,
            data(root, n),
            "broadcast rank {rank}"
        );

        // Reduce-scatter of the gathered vector scaled by rank + 1.
        let mine: Vec<f32> = gathered.iter().map(|v| v * (rank + 1) as f32).collect();
        let send = s.clone_htod(&mine).map_err(dev)?;
        let mut recv = s.alloc_zeros::<f32>(n).map_err(dev)?;
        nc.reduce_scatter(&send, &mut recv)?;
        let scale: f32 = (1..=P).map(|r| r as f32).sum();
        let want: Vec<f32> = gathered[rank * n..(rank + 1) * n]
            .iter()
            .map(|v| v * scale)
            .collect();
        assert_eq!(
            s.clone_dtoh(&recv).map_err(dev)?,
            want,
            "reduce_scatter rank {rank}"
        );

        // Different lengths across ranks: a typed error on every rank, not a hang.
        let mut odd = s.alloc_zeros::<f32>(10 + rank).map_err(dev)?;
        match nc.allreduce_sum(&mut odd) {
            Err(Error::Mismatch { .. }) => {}
            other => panic!("rank {rank}: expected Mismatch, got {other:?}"),
        }
        // Bad argument on one rank only: every rank gets InvalidArgument.
        let one = s.clone_htod(&data(rank, n)).map_err(dev)?;
        let mut small = s
            .alloc_zeros::<f32>(if rank == 0 { n } else { n * P })
            .map_err(dev)?;
        match nc.allgather(&one, &mut small) {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("rank {rank}: expected InvalidArgument, got {other:?}"),
        }
        nc.synchronize()
    });
    out.expect("every rank passed");
}
