//! `PeerMemory`: how a rank of a [`SharedSegment`](super::shm::SharedSegment) reads a
//! peer's own buffers (not its slots), so that a collective that only moves data copies
//! each byte once instead of twice (into the sender's slot, out of it).
//!
//! Why: an all-gather through the slots makes two copies per block, where Open MPI's
//! shared-memory transport makes one with Linux cross-memory attach (`process_vm_readv`
//! reads another process's memory given its pid). At P = 2 on a 2-core VM the two came
//! out alike from 16 KiB to 1 MiB, so the automatic choice's ratio to MPI was a coin flip
//! around 1.0.
//!
//! - Threads of one process read a peer's buffer through a plain pointer.
//! - Processes read it with `process_vm_readv`, where the kernel allows it (same user, no
//!   ptrace restriction against it, Linux): probed once when the segment is made, agreed
//!   by every rank, and switched off with [`SINGLE_COPY_ENV`]`=0`.
//! - Otherwise collectives go through the slots.

use std::io;

/// Environment variable that, set to `0` on any rank, keeps every rank of a new segment
/// from reading its peers' buffers (collectives then copy through the slots).
pub const SINGLE_COPY_ENV: &str = "COLLECTIVES_SINGLE_COPY";

/// Whether this process allows single-copy reads ([`SINGLE_COPY_ENV`] is not `0`).
pub(crate) fn wanted() -> bool {
    std::env::var(SINGLE_COPY_ENV).map_or(true, |v| v.trim() != "0")
}

/// How a rank reads the buffers its peers publish.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum PeerMemory {
    /// It does not: data moves through the segment's slots.
    #[default]
    Slots,
    /// The ranks are threads of one process: a peer's address is valid here.
    SameProcess,
    /// The ranks are processes of one machine: `process_vm_readv` from the peer's pid
    /// (rank order).
    CrossMemoryAttach(Vec<i32>),
}

impl PeerMemory {
    /// Whether a rank can read its peers' buffers at all.
    pub(crate) fn reads_peers(&self) -> bool {
        !matches!(self, PeerMemory::Slots)
    }

    /// Copies `dst.len()` bytes at address `src` of rank `r`'s address space into `dst`.
    ///
    /// # Safety
    /// `src` must address `dst.len()` readable bytes in rank `r`'s address space (this
    /// process's, for [`PeerMemory::SameProcess`]) that nobody writes during the call.
    pub(crate) unsafe fn read(&self, r: usize, src: u64, dst: &mut [u8]) -> io::Result<()> {
        match self {
            PeerMemory::Slots => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this segment does not read its peers' buffers",
            )),
            PeerMemory::SameProcess => {
                // SAFETY: the caller's contract, in this process.
                let src = unsafe { std::slice::from_raw_parts(src as *const u8, dst.len()) };
                super::shm::copy(dst, src);
                Ok(())
            }
            // SAFETY: the caller's contract, in rank r's process.
            PeerMemory::CrossMemoryAttach(pids) => unsafe { read_process(pids[r], src, dst) },
        }
    }
}

/// Whether this process may read another process's memory with cross-memory attach:
/// reads a byte of a child it starts (`sleep`) at an address from its `/proc/PID/maps`.
/// What Open MPI's shared-memory transport needs for its single copy, where containers'
/// ptrace restrictions often forbid it (then `--mca btl_vader_single_copy_mechanism none`
/// keeps its jobs from failing). `false` where the child cannot be started or read.
pub fn can_read_other_processes() -> bool {
    let Ok(mut child) = std::process::Command::new("sleep")
        .arg("10")
        .stdin(std::process::Stdio::null())
        .spawn()
    else {
        return false;
    };
    let pid = child.id() as i32;
    let readable = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .ok()
        .and_then(|maps| {
            maps.lines()
                .find(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .is_some_and(|p| p.starts_with('r'))
                })
                .and_then(|l| l.split('-').next())
                .and_then(|a| u64::from_str_radix(a, 16).ok())
        });
    let mut byte = [0u8; 1];
    // SAFETY: the kernel checks the remote range; `byte` is ours.
    let ok = readable.is_some_and(|addr| unsafe { read_process(pid, addr, &mut byte) }.is_ok());
    let _ = child.kill();
    let _ = child.wait();
    ok
}

/// `process_vm_readv` of `dst.len()` bytes at `src` in process `pid`, repeated over
/// partial reads.
///
/// # Safety
/// As [`PeerMemory::read`]; the kernel checks that the range is mapped in `pid`, so a bad
/// address is an error, not undefined behaviour here.
#[cfg(target_os = "linux")]
pub(crate) unsafe fn read_process(pid: i32, src: u64, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (src as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` is this process's writable `dst`; the kernel validates `remote`.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        match n {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("process_vm_readv from pid {pid} read nothing"),
                ))
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Elsewhere there is no cross-memory attach.
///
/// # Safety
/// Nothing is read.
#[cfg(not(target_os = "linux"))]
pub(crate) unsafe fn read_process(_pid: i32, _src: u64, _dst: &mut [u8]) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "cross-memory attach is Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_process_reads_copy_the_bytes_and_slots_refuse() {
        let src: Vec<u8> = (0..=255).collect();
        let mut dst = vec![0u8; 256];
        // SAFETY: `src` is 256 readable bytes of this process, not written meanwhile.
        unsafe { PeerMemory::SameProcess.read(0, src.as_ptr() as u64, &mut dst) }.unwrap();
        assert_eq!(dst, src);
        // SAFETY: nothing is read.
        let refused = unsafe { PeerMemory::Slots.read(0, src.as_ptr() as u64, &mut dst) };
        assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::Unsupported);
    }

    /// Reading this very process through the kernel: the bytes where the kernel allows
    /// it, a typed error (never a crash) for an unmapped address.
    #[cfg(target_os = "linux")]
    #[test]
    fn cross_memory_attach_reads_this_process_or_fails_cleanly() {
        let me = std::process::id() as i32;
        let src: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: `src` is readable in this process and not written meanwhile.
        match unsafe { read_process(me, src.as_ptr() as u64, &mut dst) } {
            Ok(()) => assert_eq!(dst, src),
            Err(e) => eprintln!("cross-memory attach unavailable here: {e}"),
        }
        // SAFETY: the kernel checks the remote range; nothing is mapped at page 0.
        assert!(unsafe { read_process(me, 16, &mut dst[..8]) }.is_err());
        // Another process: allowed or not, an answer and no stray child.
        eprintln!("reads other processes: {}", can_read_other_processes());
    }
}
