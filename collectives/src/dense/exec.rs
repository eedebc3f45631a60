//! Runs a rank's plan ([`cost_model::plan::Step`]) over a communicator: the one place
//! where the dense collectives touch the transport. The plans themselves (who sends which
//! range to whom, in which order) live in `cost_model::plan::dense`, where the cost model
//! prices the very same steps.

use cost_model::plan::{max_message, Combine, Step};

use crate::dense::util::pair_mut;
use crate::dense::wire::{expect_len, Scratch, WireElem};
use crate::{Communicator, Error, Result};

/// Runs `steps` on an `f32` buffer with `W` on the wire: sums stay in `f32`, messages are
/// encoded to `W` and decoded on arrival, [`Step::Round`] rounds in place.
pub(crate) fn run_wire<C: Communicator + ?Sized, W: WireElem>(
    comm: &C,
    buf: &mut [f32],
    steps: &[Step],
) -> Result<()> {
    let mut sc = Scratch::<W>::new(max_message(steps));
    for st in steps {
        match st {
            Step::Send { to, tag, range } => sc.send(comm, *to, *tag, &buf[range.clone()])?,
            Step::Recv {
                from,
                tag,
                range,
                combine,
            } => sc.exchange(comm, None, *from, *tag, &mut buf[range.clone()], *combine)?,
            Step::SendRecv {
                to,
                send,
                from,
                recv,
                tag,
                combine,
            } => {
                if send == recv && matches!(combine, Combine::Sum { .. }) {
                    let b = &mut buf[send.clone()];
                    sc.exchange_in_place(comm, *to, *from, *tag, b, *combine)?
                } else {
                    let (s, r) = pair_mut(buf, send.clone(), recv.clone());
                    sc.exchange(comm, Some((*to, s)), *from, *tag, r, *combine)?
                }
            }
            Step::Round { range } => W::round_in_place(&mut buf[range.clone()]),
        }
    }
    Ok(())
}

/// Runs a copy-only plan on a byte buffer (all-gather, broadcast).
pub(crate) fn run_bytes<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [u8],
    steps: &[Step],
) -> Result<()> {
    for st in steps {
        match st {
            Step::Send { to, tag, range } => comm.send(*to, *tag, &buf[range.clone()])?,
            Step::Recv {
                from,
                tag,
                range,
                combine: Combine::Copy,
            } => {
                let n = comm.recv_agreed_into(*from, *tag, &mut buf[range.clone()])?;
                expect_len(comm, *from, *tag, n, range.len())?;
            }
            Step::SendRecv {
                to,
                send,
                from,
                recv,
                tag,
                combine: Combine::Copy,
            } => {
                let want = recv.len();
                let (s, r) = pair_mut(buf, send.clone(), recv.clone());
                let n = comm.sendrecv_agreed_into(*to, *tag, s, *from, *tag, r)?;
                expect_len(comm, *from, *tag, n, want)?;
            }
            Step::Round { .. } => {}
            _ => return Err(internal("a reducing step on a byte buffer")),
        }
    }
    Ok(())
}

fn internal(what: &str) -> Error {
    Error::InvalidArgument(format!("dense plan: {what} cannot be executed"))
}
