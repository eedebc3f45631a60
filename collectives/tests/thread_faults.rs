//! Faults on `ThreadComm`, the same scenarios as `mpi_faults` under mpirun: one rank leaves
//! silently, panics or stalls in the middle of a dense or a sparse allreduce, at P = 3 and
//! P = 4. Every survivor must end with a typed error (a timeout, or the news that a peer
//! failed) within its receive timeout, and the whole world must come back.

#[allow(dead_code)] // each fault test uses a part of it
mod fault_inject;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use collectives::{Communicator, Error, RunError, ThreadComm, ThreadConfig};
use fault_inject::{is_peer_loss, run_until_fault, Collective, FaultAt, FAULTY_RANK};

/// Receive timeout of these worlds.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Slack a survivor gets beyond the timeout (thread scheduling on a loaded machine; the
/// MPI test allows 10 s for the whole job).
const SLACK: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The rank returns `Ok` from the middle of the collective: nobody is told.
    Leave,
    /// The rank panics.
    Panic,
    /// The rank sleeps for twice the timeout, then carries on.
    Stall,
}

const LEFT: &str = "injected fault: this rank leaves";

fn strike(fault: Fault) -> Error {
    match fault {
        Fault::Leave => Error::InvalidArgument(LEFT.into()),
        Fault::Panic => panic!("injected fault: this rank panics"),
        Fault::Stall => {
            std::thread::sleep(TIMEOUT * 2);
            Error::InvalidArgument("injected fault: this rank stalled".into())
        }
    }
}

/// What one rank ended with, and when.
type Ended = (Result<(), Error>, Duration);

fn scenario(p: usize, fault: Fault, coll: Collective) {
    let ended: Mutex<Vec<Option<Ended>>> = Mutex::new(vec![None; p]);
    let start = Instant::now();
    let run = ThreadComm::run_with(p, ThreadConfig::with_timeout(TIMEOUT), |c| {
        let rank = c.rank();
        let c = FaultAt::new(c, Box::new(move || strike(fault)));
        let out = run_until_fault(&c, coll);
        ended.lock().unwrap()[rank] = Some((out.clone(), start.elapsed()));
        match out {
            Err(Error::InvalidArgument(m)) if rank == FAULTY_RANK && m == LEFT => Ok(()),
            other => other,
        }
    });
    let label = format!("P={p} {fault:?} {coll:?}");
    let ended = ended.into_inner().unwrap();
    let mut survivors = 0;
    for (rank, e) in ended.iter().enumerate() {
        if rank == FAULTY_RANK {
            continue;
        }
        let (out, at) = e
            .as_ref()
            .unwrap_or_else(|| panic!("{label}: rank {rank} never ended"));
        match out {
            Err(e) if is_peer_loss(e) => survivors += 1,
            other => panic!("{label}: survivor {rank} ended with {other:?}"),
        }
        // A panic is announced at once; a rank that leaves or stalls is found by a timeout
        // (the first survivor to time out then announces itself to the rest).
        let limit = match fault {
            Fault::Panic => SLACK,
            Fault::Leave | Fault::Stall => TIMEOUT + SLACK,
        };
        assert!(*at <= limit, "{label}: survivor {rank} ended after {at:?}");
    }
    assert_eq!(survivors, p - 1, "{label}");
    match (fault, run) {
        (Fault::Panic, Err(RunError::Panicked { rank, .. })) => assert_eq!(rank, FAULTY_RANK),
        (Fault::Panic, other) => panic!("{label}: the run ended with {other:?}"),
        (_, Err(RunError::Failed { rank, error })) => {
            assert_ne!(rank, FAULTY_RANK, "{label}: {error}");
            assert!(is_peer_loss(&error), "{label}: {error}");
        }
        (_, other) => panic!("{label}: the run ended with {:?}", other.map(|_| ())),
    }
}

fn all_of(fault: Fault) {
    for p in [3, 4] {
        for coll in Collective::ALL {
            scenario(p, fault, coll);
        }
    }
}

#[test]
fn a_rank_that_leaves_mid_collective_times_out_every_survivor() {
    all_of(Fault::Leave);
}

#[test]
fn a_rank_that_panics_mid_collective_stops_every_survivor() {
    all_of(Fault::Panic);
}

#[test]
fn a_rank_that_stalls_mid_collective_times_out_every_survivor() {
    all_of(Fault::Stall);
}
