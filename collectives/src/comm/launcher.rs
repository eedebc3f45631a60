//! What an MPI launcher tells a process before MPI starts: that it is a rank of a job, and
//! how many ranks share this node's cores, from which each rank takes its share of the
//! cores ([`share_cores_among_ranks`]).
//!
//! ```
//! // First thing in `main` of a program started by mpirun, before any thread exists:
//! let threads = collectives::comm::launcher::share_cores_among_ranks();
//! // `None` outside a launcher (as here), or when RAYON_NUM_THREADS was set by the user.
//! assert!(threads.is_none() || std::env::var("RAYON_NUM_THREADS").is_ok());
//! ```

/// Environment variables by which MPI launchers announce a job: Open MPI's `mpirun`,
/// MPICH/Hydra and Slurm's PMI, and PMIx (Open MPI 5, Slurm).
const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];

/// Environment variables by which launchers give the number of ranks on this node: Open
/// MPI's `mpirun` (4 and 5) and MPICH/Hydra (also Intel MPI).
const LOCAL_SIZE_VARS: [&str; 2] = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"];

/// The variable the rayon pool and candle's matrix products read for their thread count.
pub const THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// The variable (and its value) showing that an MPI launcher started this process, if any.
pub fn mpi_launcher() -> Option<(&'static str, String)> {
    LAUNCHER_VARS
        .iter()
        .find_map(|&v| std::env::var(v).ok().map(|x| (v, x)))
}

/// Threads for one rank when `local` ranks share `cores` cores: an equal share, at least
/// one. `None` when the launcher did not say how many ranks share the node (`local`
/// `None`) or gave an unusable count.
pub fn threads_per_rank(cores: usize, local: Option<usize>) -> Option<usize> {
    local.filter(|&n| n > 0).map(|n| (cores / n).max(1))
}

/// The thread count an MPI rank should set in [`THREADS_VAR`], from the environment `env`:
/// `None` outside a launcher, when the user set the variable, or when the launcher does
/// not give its ranks per node.
fn rank_threads(env: impl Fn(&str) -> Option<String>, cores: usize) -> Option<usize> {
    LAUNCHER_VARS.iter().find_map(|&v| env(v))?;
    if env(THREADS_VAR).is_some() {
        return None;
    }
    let local = LOCAL_SIZE_VARS
        .iter()
        .find_map(|&v| env(v)?.trim().parse().ok());
    threads_per_rank(cores, local)
}

/// Gives each rank of an MPI job its share of this node's cores, and returns it: sets
/// [`THREADS_VAR`] unless the user set it, so that the global rayon pool (the selectors'
/// parallel passes) and candle's matrix products each use `cores / ranks on this node`
/// threads. Returns `None`, and changes nothing, outside a launcher, when the launcher
/// does not give its ranks per node, or when the user chose the count.
///
/// Why: without it every rank starts one thread per core, so `P` ranks on a node run
/// `P × cores` busy threads that preempt one another. With 4 ranks on this project's
/// 2-core VM, the planner check's iteration (a candle MLP of 2.2 M weights with exact
/// top-k and the sparse all-gather) took 194–226 ms with a thread per core in each rank
/// and 142–175 ms with one thread each (`xtask calibrate --mpi`, five runs each).
///
/// Must run before any other thread exists (first thing in `main`): it sets a process
/// environment variable.
pub fn share_cores_among_ranks() -> Option<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = rank_threads(|v| std::env::var(v).ok(), cores)?;
    std::env::set_var(THREADS_VAR, threads.to_string());
    Some(threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_share_the_cores_and_get_at_least_one_thread() {
        assert_eq!(threads_per_rank(16, Some(4)), Some(4));
        assert_eq!(threads_per_rank(16, Some(3)), Some(5));
        assert_eq!(threads_per_rank(2, Some(2)), Some(1));
        assert_eq!(threads_per_rank(2, Some(4)), Some(1));
        assert_eq!(threads_per_rank(8, Some(1)), Some(8));
        assert_eq!(threads_per_rank(8, Some(0)), None);
        assert_eq!(threads_per_rank(8, None), None);
    }

    #[test]
    fn only_a_launched_rank_without_a_user_choice_sets_its_threads() {
        fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
            move |v| {
                vars.iter()
                    .find(|(n, _)| *n == v)
                    .map(|(_, x)| x.to_string())
            }
        }
        let ompi = [
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ];
        assert_eq!(rank_threads(env(&ompi), 16), Some(4));
        let hydra = [("PMI_SIZE", "6"), ("MPI_LOCALNRANKS", " 3 ")];
        assert_eq!(rank_threads(env(&hydra), 16), Some(5));
        // Not launched, a user's choice, no count or an unreadable one: nothing is set.
        assert_eq!(
            rank_threads(env(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "4")]), 16),
            None
        );
        let chosen = [
            ("PMIX_RANK", "0"),
            ("MPI_LOCALNRANKS", "2"),
            (THREADS_VAR, "7"),
        ];
        assert_eq!(rank_threads(env(&chosen), 16), None);
        assert_eq!(rank_threads(env(&[("PMIX_RANK", "0")]), 16), None);
        let bad = [("PMI_SIZE", "2"), ("MPI_LOCALNRANKS", "two")];
        assert_eq!(rank_threads(env(&bad), 16), None);
    }
}
