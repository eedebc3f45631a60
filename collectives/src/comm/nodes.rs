//! The node structure of a communicator, as hierarchical algorithms need it: how many ranks
//! share each machine, taken from the transport ([`Communicator::node`]: MPI's shared-memory
//! split, the simulated topology, or a thread world's explicit option) and checked to agree
//! on every rank.
//!
//! HiTopKComm (Shi et al., MLSys 2021) and the 2D-torus all-reduce place ranks in blocks:
//! rank `r` on node `r / n` with local index `r mod n`. [`ranks_per_node`] therefore accepts
//! only a block layout of equal nodes and says plainly what else it found, rather than run
//! a hierarchical schedule whose "node" spans two machines.

use super::Communicator;
use crate::dense::tags;
use crate::dense::util::gather_words;
use crate::{Error, Result};

/// Ranks per node of `comm`'s layout. Collective: every rank gets the same answer or the
/// same error.
///
/// - Every rank's transport knows its node: the nodes must be contiguous blocks of equal
///   size in rank order (what `mpirun` gives with its default `--map-by slot` or `core`);
///   the block size is returned. Any other layout is an [`Error::InvalidArgument`] that
///   names it.
/// - No rank's transport knows: one node, `P`.
/// - Some know and some do not: [`Error::Mismatch`].
pub fn ranks_per_node<C: Communicator + ?Sized>(comm: &C) -> Result<usize> {
    let node = comm.node();
    // Two words per rank, whether the node is known and which, so every id is usable.
    let mine = [u64::from(node.is_some()), node.unwrap_or(0)];
    let all: Vec<Option<u64>> = if comm.size() > 1 {
        gather_words(comm, mine, tags::CHECK)?
            .into_iter()
            .map(|[known, id]| (known != 0).then_some(id))
            .collect()
    } else {
        vec![node]
    };
    layout_of(&all)
}

/// The 2D-torus all-reduce (MSTopK/HiTopKComm (Shi et al., MLSys 2021) §5.3) on `comm`'s
/// nodes: rows are the nodes, columns the ranks of a node ([`ranks_per_node`]).
/// Collective.
pub fn torus2d<C: Communicator + ?Sized>(comm: &C) -> Result<crate::dense::AllreduceAlgo> {
    Ok(crate::dense::AllreduceAlgo::Torus2d {
        ranks_per_node: ranks_per_node(comm)?,
    })
}

/// The block size of the nodes `all` (rank order; `None`: the transport does not know),
/// or why they are not a block layout.
pub fn layout_of(all: &[Option<u64>]) -> Result<usize> {
    let p = all.len();
    if p == 0 {
        return Err(Error::InvalidArgument("no ranks".into()));
    }
    let unknown = all.iter().filter(|n| n.is_none()).count();
    if unknown == p {
        return Ok(p);
    }
    if unknown > 0 {
        return Err(Error::Mismatch {
            what: "node structure",
            detail: format!(
                "{unknown} of {p} ranks' transports do not know their node: {}",
                describe(all)
            ),
        });
    }
    // The first block's length is the candidate n; every block must have it and every
    // node must appear in one block only.
    let n = all.iter().take_while(|&&id| id == all[0]).count();
    let blocks_ok = p % n == 0 && all.chunks(n).all(|b| b.iter().all(|&id| id == b[0])) && {
        let mut firsts: Vec<Option<u64>> = all.chunks(n).map(|b| b[0]).collect();
        firsts.sort_unstable();
        firsts.windows(2).all(|w| w[0] != w[1])
    };
    if !blocks_ok {
        return Err(Error::InvalidArgument(format!(
            "hierarchical algorithms need ranks placed on nodes in equal contiguous blocks \
             (rank r on node r / n); found {}. Launch with `mpirun --map-by slot` or pass \
             the ranks per node explicitly",
            describe(all)
        )));
    }
    Ok(n)
}

/// `rank → node` as a short list for error messages.
fn describe(all: &[Option<u64>]) -> String {
    let mut s: Vec<String> = all
        .iter()
        .take(32)
        .map(|n| n.map_or("?".to_string(), |n| n.to_string()))
        .collect();
    if all.len() > 32 {
        s.push(format!("… ({} ranks)", all.len()));
    }
    format!("nodes by rank [{}]", s.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::sim::{ClockMode, SimComm};
    use crate::{ThreadComm, ThreadConfig};
    use cost_model::{Link, Topology};

    #[test]
    fn block_layouts_and_their_errors() {
        let known = |ids: &[u64]| ids.iter().map(|&i| Some(i)).collect::<Vec<_>>();
        assert_eq!(layout_of(&known(&[7, 7, 7, 7])).unwrap(), 4);
        assert_eq!(layout_of(&known(&[3, 3, 9, 9, 1, 1])).unwrap(), 2);
        assert_eq!(layout_of(&known(&[0, 1, 2])).unwrap(), 1);
        // Every id is usable, u64::MAX included.
        assert_eq!(layout_of(&known(&[u64::MAX, u64::MAX, 0, 0])).unwrap(), 2);
        assert_eq!(layout_of(&[None; 5]).unwrap(), 5);
        // Round-robin placement, unequal nodes, a node split in two blocks.
        for bad in [&[0, 1, 0, 1][..], &[0, 0, 0, 1], &[0, 0, 1, 1, 0, 0]] {
            assert!(
                matches!(layout_of(&known(bad)), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            layout_of(&[Some(0), None]),
            Err(Error::Mismatch { .. })
        ));
        assert!(layout_of(&[]).is_err());
    }

    #[test]
    fn threads_report_their_configured_nodes() {
        for (p, n) in [(4, None), (4, Some(2)), (6, Some(3)), (5, Some(1))] {
            let mut cfg = ThreadConfig::default();
            if let Some(n) = n {
                cfg = cfg.with_ranks_per_node(n);
            }
            let got = ThreadComm::run_with(p, cfg, |c| ranks_per_node(&c)).unwrap();
            assert_eq!(got, vec![n.unwrap_or(p); p]);
        }
        let bad = ThreadComm::world(4, ThreadConfig::default().with_ranks_per_node(3));
        assert!(matches!(bad, Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn the_simulator_reports_its_topology_and_splits_keep_nodes() {
        let topo = Topology::new(3, 2, Link::new(1e-6, 1e-9), Link::new(1e-5, 1e-8)).unwrap();
        let got = ThreadComm::run(6, |c| -> Result<(usize, usize)> {
            let s = SimComm::new(c, topo, ClockMode::Logical)?;
            let whole = ranks_per_node(&s)?;
            // The even world ranks: one per node, so one rank per node in the split.
            let sub = s.split((s.rank() % 2) as u32, s.rank() as u32)?;
            Ok((whole, ranks_per_node(sub.as_ref())?))
        })
        .unwrap();
        assert_eq!(got, vec![(2, 1); 6]);
        let algos = ThreadComm::run(6, |c| {
            let s = SimComm::new(c, topo, ClockMode::Logical)?;
            torus2d(&s)
        })
        .unwrap();
        assert!(algos
            .iter()
            .all(|a| *a == crate::dense::AllreduceAlgo::Torus2d { ranks_per_node: 2 }));
    }
}
