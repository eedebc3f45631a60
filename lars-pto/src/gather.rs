//! The all-gather with variable counts that the parallel tensor operator ends with
//! (MSTopK/HiTopKComm (Shi et al., MLSys 2021) Eq. 14). Every rank knows every count in advance
//! (they follow from the agreed layer list), so no count exchange is needed.
//!
//! [`crate::Exchange::Direct`]: a one-round point-to-point exchange over the
//! [`Communicator`] (every rank sends its part to every other rank, then receives theirs;
//! sends are buffered, so this cannot deadlock). The default exchange is `collectives`'
//! `allgatherv_known`; this one is kept as an option (one round instead of ⌈log2 P⌉,
//! useful on in-process transports) and as an independent check of it in the tests.

use collectives::{Communicator, Tag};

use crate::{Error, Result};

/// Gathers every rank's `mine` (rank `r` contributes exactly `lens[r]` bytes) into one
/// buffer in rank order. Receives everything before reporting a wrong length, so that no
/// message is left behind to confuse a later exchange.
pub(crate) fn allgatherv_bytes<C: Communicator + ?Sized>(
    comm: &C,
    tag: Tag,
    mine: &[u8],
    lens: &[usize],
) -> Result<Vec<u8>> {
    let p = comm.size();
    let me = comm.rank();
    if lens.len() != p || lens.get(me) != Some(&mine.len()) {
        return Err(Error::Protocol {
            src: me,
            detail: format!(
                "own part has {} bytes, the layout says {:?} ({} ranks)",
                mine.len(),
                lens.get(me),
                lens.len()
            ),
        });
    }
    for r in (0..p).filter(|&r| r != me) {
        comm.send(r, tag, mine)?;
    }
    let total: usize = lens.iter().sum();
    let mut out = Vec::with_capacity(total);
    let mut bad = None;
    for (r, &len) in lens.iter().enumerate() {
        if r == me {
            out.extend_from_slice(mine);
            continue;
        }
        let msg = comm.recv(r, tag)?;
        if msg.len() != len && bad.is_none() {
            bad = Some(Error::Protocol {
                src: r,
                detail: format!("part has {} bytes, expected {len}", msg.len()),
            });
        }
        // Keep offsets right even for a malformed part; the error is returned below.
        out.resize(out.len() + len, 0);
        let at = out.len() - len;
        let n = msg.len().min(len);
        out[at..at + n].copy_from_slice(&msg[..n]);
    }
    match bad {
        Some(e) => Err(e),
        None => Ok(out),
    }
}
