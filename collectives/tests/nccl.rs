//! `NcclComm` over up to two GPUs driven by `ThreadComm` ranks (one rank per GPU; on a
//! one-GPU machine a single rank, whose point-to-point goes to itself), compared with host
//! references. Skips (prints "skipped: ...", passes) only without libcuda, libnccl or a GPU;
//! the checks that need two ranks to disagree run when two GPUs are present.

use collectives::dense::block_range;
use collectives::{Communicator, Error, NcclComm, ThreadComm, ThreadConfig};

/// Ranks for the GPU tests (one per device, at most two), or `None` after printing why
/// they cannot run.
fn ranks() -> Option<usize> {
    match NcclComm::probe() {
        Err(e) => {
            println!("skipped: {e}");
            None
        }
        Ok(n) => Some(n.min(2)),
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
    const P: usize = 2;
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
    let Some(p) = ranks() else { return };
    #[allow(non_snake_case)]
    let P = p;
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

        if P < 2 {
            // The disagreement checks need two ranks.
            return nc.synchronize();
        }
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

/// Point-to-point inside groups, and the uneven reduce-scatter and all-gather built on it
/// (HiTopKComm's intra-node steps), against host references; mismatched lengths and bad
/// peers are typed errors on every rank.
#[test]
fn p2p_and_uneven_collectives_match_host() {
    let Some(p) = ranks() else { return };
    let d = 1001usize;
    let counts: Vec<usize> = (0..p).map(|i| block_range(d, p, i).len()).collect();
    let sum: Vec<f32> = (0..d)
        .map(|i| (0..p).map(|r| data(r, d)[i]).sum())
        .collect();
    let out = ThreadComm::run_with(p, config(), |comm| -> collectives::Result<()> {
        let rank = comm.rank();
        let nc = NcclComm::new(&comm)?;
        let s = nc.stream().clone();
        let dev = |e: cudarc::driver::DriverError| Error::Nccl(e.to_string());

        // A ring step: send to the right, receive from the left (to oneself when p = 1).
        let right = (rank + 1) % p;
        let left = (rank + p - 1) % p;
        let mine = s.clone_htod(&data(rank, d)).map_err(dev)?;
        let mut got = s.alloc_zeros::<f32>(d).map_err(dev)?;
        nc.send_recv(&[(right, mine.as_view())], &mut [(left, got.as_view_mut())])?;
        assert_eq!(
            s.clone_dtoh(&got).map_err(dev)?,
            data(left, d),
            "ring rank {rank}"
        );

        // Uneven reduce-scatter: block `rank` of the sum.
        let mut block = s.alloc_zeros::<f32>(counts[rank]).map_err(dev)?;
        nc.reduce_scatter_v(&mine, &mut block, &counts)?;
        let r = block_range(d, p, rank);
        assert_eq!(
            s.clone_dtoh(&block).map_err(dev)?,
            sum[r.clone()],
            "rs_v rank {rank}"
        );

        // Uneven all-gather of those blocks gives the whole sum everywhere.
        let mut whole = s.alloc_zeros::<f32>(d).map_err(dev)?;
        nc.allgather_v(&block, &mut whole, &counts)?;
        assert_eq!(s.clone_dtoh(&whole).map_err(dev)?, sum, "ag_v rank {rank}");

        // A peer outside the communicator: InvalidArgument on every rank.
        let bad_peer = if rank == 0 { p } else { left };
        match nc.send_recv(
            &[(bad_peer, mine.as_view())],
            &mut [(left, got.as_view_mut())],
        ) {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("rank {rank}: expected InvalidArgument, got {other:?}"),
        }
        // Block sizes that do not add up: InvalidArgument on every rank.
        let mut wrong = counts.clone();
        wrong[0] += 1;
        match nc.allgather_v(&block, &mut whole, &wrong) {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("rank {rank}: expected InvalidArgument, got {other:?}"),
        }
        if p >= 2 {
            // A receive shorter than the matching send: Mismatch on every rank, no hang.
            let short = if rank == 0 { d - 1 } else { d };
            let mut small = s.alloc_zeros::<f32>(short).map_err(dev)?;
            match nc.send_recv(
                &[(right, mine.as_view())],
                &mut [(left, small.as_view_mut())],
            ) {
                Err(Error::Mismatch { .. }) => {}
                other => panic!("rank {rank}: expected Mismatch, got {other:?}"),
            }
        }
        nc.synchronize()
    });
    out.expect("every rank passed");
}
