//! The watchdog of the blocking calls into the MPI library (its own collectives and
//! `MPI_Barrier`). Those calls cannot be polled or withdrawn from, so a peer that stalls or
//! leaves while the others are inside one would hang them for good. A thread per
//! communicator looks at the call in progress a few times per timeout and, when the same
//! call has not returned for the receive timeout, ends the job the way a stuck send does:
//! `rank R/P: fatal: …` on stderr and `MPI_Abort`.
//!
//! The hot path is two plain stores to an atomic only this rank's caller writes (no clock
//! read, no locked instruction): an odd count means a call is in progress, and a count that
//! stays odd and unchanged between looks means the same call is still running.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Exit code of the job when a blocking library call does not return within the timeout.
pub(crate) const LIBRARY_STALL_EXIT: i32 = 73;

/// The blocking library calls, as the watchdog names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum LibraryCall {
    Allreduce,
    Allgather,
    ReduceScatter,
    Barrier,
}

impl LibraryCall {
    const ALL: [LibraryCall; 4] = [
        LibraryCall::Allreduce,
        LibraryCall::Allgather,
        LibraryCall::ReduceScatter,
        LibraryCall::Barrier,
    ];

    fn name(self) -> &'static str {
        match self {
            LibraryCall::Allreduce => "MPI_Allreduce",
            LibraryCall::Allgather => "MPI_Allgather",
            LibraryCall::ReduceScatter => "MPI_Reduce_scatter",
            LibraryCall::Barrier => "MPI_Barrier",
        }
    }
}

/// What the caller and the watchdog thread share.
#[derive(Debug)]
struct Shared {
    /// Bumped on entry to and on return from every call: odd while one is in progress.
    calls: AtomicU64,
    /// The call in progress ([`LibraryCall`] as `u8`).
    call: AtomicU8,
    /// The timeout in nanoseconds (it can change after the thread started).
    timeout_ns: AtomicU64,
    stop: AtomicBool,
}

/// One communicator's watchdog: the thread starts with the first guarded call and ends
/// when the watchdog drops.
#[derive(Debug)]
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the thread that ends the job (through `abort`, given the message; the thread
    /// ends after it) once a call has been in progress for `timeout`.
    pub(crate) fn start(timeout: Duration, abort: Box<dyn Fn(&str) + Send>) -> Watchdog {
        let shared = Arc::new(Shared {
            calls: AtomicU64::new(0),
            call: AtomicU8::new(0),
            timeout_ns: AtomicU64::new(nanos(timeout)),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("mpi-library-watchdog".into())
            .spawn(move || watch(&s, &*abort))
            .map_err(|e| {
                // Not fatal: the calls still work, only without the guarantee.
                eprintln!(
                    "warning: cannot start the watchdog of blocking MPI calls ({e}); a peer \
                     that stalls inside one will hang this rank"
                )
            })
            .ok();
        Watchdog { shared, thread }
    }

    /// Changes the timeout.
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.shared.timeout_ns.store(nanos(timeout), Relaxed);
    }

    /// Runs the blocking `call` under watch.
    #[inline]
    pub(crate) fn guard<T>(&self, which: LibraryCall, call: impl FnOnce() -> T) -> T {
        let s = &*self.shared;
        // Only this rank's caller writes `calls`: a load and a store, no locked instruction.
        let c = s.calls.load(Relaxed);
        s.call.store(which as u8, Relaxed);
        s.calls.store(c + 1, Relaxed);
        let out = call();
        s.calls.store(c + 2, Relaxed);
        out
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The watchdog thread: looks eight times per timeout (at least every 10 ms, at most every
/// second) and ends the job when one call has stayed in progress for the timeout.
fn watch(s: &Shared, abort: &dyn Fn(&str)) {
    let mut seen: Option<(u64, Instant)> = None;
    while !s.stop.load(Relaxed) {
        let timeout = Duration::from_nanos(s.timeout_ns.load(Relaxed));
        std::thread::park_timeout(
            (timeout / 8).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        );
        let c = s.calls.load(Relaxed);
        if c % 2 == 0 {
            seen = None;
            continue;
        }
        match seen {
            Some((prev, since)) if prev == c => {
                if since.elapsed() >= timeout && !s.stop.load(Relaxed) {
                    let call = LibraryCall::ALL
                        .into_iter()
                        .find(|k| *k as u8 == s.call.load(Relaxed))
                        .map_or("a blocking MPI call", LibraryCall::name);
                    abort(&format!(
                        "{call} has not returned after {timeout:?}: a peer stalled or left \
                         (set COLLECTIVES_TIMEOUT_S for longer calls)"
                    ));
                    return;
                }
            }
            _ => seen = Some((c, Instant::now())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_call_past_the_timeout_ends_the_job_and_a_short_one_does_not() {
        // Stands in for `MPI_Abort`: counts the aborts and keeps the last message.
        let aborts = Arc::new(AtomicUsize::new(0));
        let said = Arc::new(std::sync::Mutex::new(String::new()));
        let (a, m) = (Arc::clone(&aborts), Arc::clone(&said));
        let w = Watchdog::start(
            Duration::from_millis(200),
            Box::new(move |msg: &str| {
                a.fetch_add(1, Relaxed);
                *m.lock().unwrap() = msg.to_string();
            }),
        );
        for _ in 0..1000 {
            w.guard(LibraryCall::Barrier, || ());
        }
        w.guard(LibraryCall::Allgather, || {
            std::thread::sleep(Duration::from_millis(100))
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(aborts.load(Relaxed), 0, "short calls must not end the job");
        w.guard(LibraryCall::Allreduce, || {
            std::thread::sleep(Duration::from_millis(600))
        });
        assert_eq!(aborts.load(Relaxed), 1, "a stalled call must end the job");
        assert!(said
            .lock()
            .unwrap()
            .starts_with("MPI_Allreduce has not returned after 200ms"));
        drop(w);
        // A longer timeout set after the start holds for later calls.
        let a = Arc::clone(&aborts);
        let w = Watchdog::start(
            Duration::from_millis(50),
            Box::new(move |_: &str| {
                a.fetch_add(1, Relaxed);
            }),
        );
        w.set_timeout(Duration::from_secs(5));
        w.guard(LibraryCall::Barrier, || {
            std::thread::sleep(Duration::from_millis(400))
        });
        drop(w);
        assert_eq!(aborts.load(Relaxed), 1, "the longer timeout must hold");
    }
}
