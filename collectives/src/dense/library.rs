//! The `Library` algorithm of each dense collective: the transport library's own
//! collective (`MPI_Allreduce`, `MPI_Allgatherv`, `MPI_Reduce_scatter`) behind the same
//! entry points and argument checks as ours. It is what lets the automatic choice
//! (`choose_allreduce_for` and its siblings) never fall behind the library: with a
//! calibration that measured the library beside our algorithms, the chooser ranks all of
//! them by what was measured.

use crate::comm::LibraryCollectives;
use crate::dense::WireType;
use crate::{Communicator, Error, Result};

/// The library collectives of `comm`, or a typed error: the transport has none (threads,
/// the simulator), or the wire type is not `f32` (the library sums `f32` only; a narrower
/// wire type is one of our algorithms' options). Every rank gets the same answer: the
/// transport and the options agree across ranks.
pub(crate) fn library_of<'c, C: Communicator + ?Sized>(
    comm: &'c C,
    op: &str,
    wire: WireType,
) -> Result<&'c dyn LibraryCollectives> {
    if wire != WireType::F32 {
        return Err(Error::InvalidArgument(format!(
            "{op}: the library algorithm sums f32 on the wire; wire type {} needs one of \
             ours",
            wire.name()
        )));
    }
    comm.library().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{op}: the library algorithm needs a transport with its own collectives (MPI); \
             {} has none",
            comm.backend()
        ))
    })
}
