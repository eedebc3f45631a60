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
/// MPI's `mpirun` (4 and 5) and MPICH/Hydra (also Intel MPI); Slurm's are read after them
/// ([`SLURM_TASKS_VARS`]).
const LOCAL_SIZE_VARS: [&str; 2] = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"];

/// The variable the rayon pool and candle's matrix products read for their thread count.
pub const THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// The variable (and its value) showing that an MPI launcher started this process, if any.
pub fn mpi_launcher() -> Option<(&'static str, String)> {
    launcher_in(|v| std::env::var(v).ok())
}

/// [`mpi_launcher`] in the environment `env`.
fn launcher_in(env: impl Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    LAUNCHER_VARS.iter().find_map(|&v| env(v).map(|x| (v, x)))
}

/// The CPUs a rank can count on, as [`threads_per_rank`] weighs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpus {
    /// CPUs in this process's affinity mask: fewer than `online` when the launcher bound
    /// the rank (Open MPI binds to a core for up to two ranks, to a socket above).
    pub affinity: usize,
    /// CPUs online on the node.
    pub online: usize,
    /// What the standard library counts as usable (`available_parallelism`): the mask, or
    /// fewer under a cgroup CPU quota, which all of the node's ranks share.
    pub usable: usize,
}

impl Cpus {
    /// This process's CPUs (on other systems than Linux, all three are
    /// `available_parallelism`).
    pub fn of_this_process() -> Cpus {
        let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into
            // the zeroed set, and `CPU_COUNT` reads it; `sysconf` has no preconditions.
            let (affinity, online) = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                let ok =
                    libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
                let affinity = if ok == 0 {
                    libc::CPU_COUNT(&set) as usize
                } else {
                    usable
                };
                (affinity, libc::sysconf(libc::_SC_NPROCESSORS_ONLN))
            };
            let online = usize::try_from(online).unwrap_or(0).max(affinity);
            Cpus {
                affinity: affinity.max(1),
                online: online.max(1),
                usable,
            }
        }
        #[cfg(not(target_os = "linux"))]
        Cpus {
            affinity: usable,
            online: usable,
            usable,
        }
    }
}

/// Threads for one of `local` ranks on a node with `cpus`: an equal share of the node's
/// usable CPUs (the online ones, or a cgroup quota's, which every rank of the node
/// shares), but no more than the rank's own affinity mask when the launcher bound it; at
/// least one. `None` when the launcher did not say how many ranks share the node (`local`
/// `None`) or gave an unusable count.
pub fn threads_per_rank(cpus: Cpus, local: Option<usize>) -> Option<usize> {
    let n = local.filter(|&n| n > 0)?;
    let quota = if cpus.usable < cpus.affinity {
        cpus.usable
    } else {
        usize::MAX
    };
    let node = cpus.online.min(quota);
    Some((node / n).min(cpus.affinity).max(1))
}

/// The thread count an MPI rank should set in [`THREADS_VAR`], from the environment `env`:
/// `None` outside a launcher, when the user set the variable, or when the launcher does
/// not give its ranks per node.
fn rank_threads(env: impl Fn(&str) -> Option<String>, cpus: Cpus) -> Option<usize> {
    launcher_in(&env)?;
    if env(THREADS_VAR).is_some() {
        return None;
    }
    let local = LOCAL_SIZE_VARS
        .iter()
        .find_map(|&v| env(v)?.trim().parse().ok())
        .or_else(|| {
            let slurm = SLURM_TASKS_VARS.iter().find_map(|&v| env(v))?;
            let node = env(SLURM_NODE_VAR).and_then(|n| n.trim().parse().ok());
            slurm_tasks_on_node(&slurm, node)
        });
    threads_per_rank(cpus, local)
}

/// Slurm's tasks per node, the step's first (`srun`), then the job's, in its compressed
/// form (`4(x2),3`: two nodes of 4, then one of 3), in node order.
const SLURM_TASKS_VARS: [&str; 2] = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"];

/// This node's index among the step's nodes (`srun` sets it in every task), in the order of
/// [`SLURM_TASKS_VARS`]' lists.
const SLURM_NODE_VAR: &str = "SLURM_NODEID";

/// The tasks on node `node` (its index, [`SLURM_NODE_VAR`]) from a Slurm list in its
/// compressed form: the count every node has when they all have the same (the index is then
/// not needed), else the indexed node's. `None` when the list does not parse, or when it is
/// uneven and the index is missing or past its end.
fn slurm_tasks_on_node(list: &str, node: Option<usize>) -> Option<usize> {
    // (tasks, nodes with that many), in node order.
    let runs: Vec<(usize, usize)> = list
        .split(',')
        .map(|entry| {
            let entry = entry.trim();
            match entry.split_once("(x") {
                Some((n, times)) => Some((n.parse().ok()?, times.strip_suffix(')')?.parse().ok()?)),
                None => Some((entry.parse().ok()?, 1)),
            }
        })
        .collect::<Option<_>>()?;
    let first = runs.first()?.0;
    if runs.iter().all(|&(n, _)| n == first) {
        return Some(first);
    }
    let mut node = node?;
    for (tasks, nodes) in runs {
        if node < nodes {
            return Some(tasks);
        }
        node -= nodes;
    }
    None
}

/// Gives each rank of an MPI job its share of this node's cores, and returns it: sets
/// [`THREADS_VAR`] unless the user set it, so that the global rayon pool (the selectors'
/// parallel passes) and candle's matrix products each use [`threads_per_rank`] threads
/// (the node's CPUs divided among its ranks, within the rank's binding). Returns `None`,
/// and changes nothing, outside a launcher, when the launcher does not give its ranks per
/// node, or when the user chose the count.
///
/// Why: without it every rank starts one thread per core it can see, so `P` unbound ranks
/// on a node run `P × cores` busy threads that preempt one another. With 4 ranks on this
/// project's 2-core VM, the planner check's iteration (a candle MLP of 2.2 M weights with
/// exact top-k and the sparse all-gather) took 194–226 ms with a thread per core in each
/// rank and 142–175 ms with one thread each (`xtask calibrate --mpi`, five runs each).
///
/// Must run before any other thread exists (first thing in `main`): it sets a process
/// environment variable.
pub fn share_cores_among_ranks() -> Option<usize> {
    let threads = rank_threads(|v| std::env::var(v).ok(), Cpus::of_this_process())?;
    std::env::set_var(THREADS_VAR, threads.to_string());
    Some(threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unbound ranks on a node of `n` CPUs.
    fn node(n: usize) -> Cpus {
        Cpus {
            affinity: n,
            online: n,
            usable: n,
        }
    }

    #[test]
    fn ranks_share_the_cores_and_get_at_least_one_thread() {
        assert_eq!(threads_per_rank(node(16), Some(4)), Some(4));
        assert_eq!(threads_per_rank(node(16), Some(3)), Some(5));
        assert_eq!(threads_per_rank(node(2), Some(2)), Some(1));
        assert_eq!(threads_per_rank(node(2), Some(4)), Some(1));
        assert_eq!(threads_per_rank(node(8), Some(1)), Some(8));
        assert_eq!(threads_per_rank(node(8), Some(0)), None);
        assert_eq!(threads_per_rank(node(8), None), None);
    }

    #[test]
    fn a_bound_rank_keeps_within_its_mask_and_a_quota_is_shared() {
        let bound = |affinity| Cpus {
            affinity,
            online: 16,
            usable: affinity,
        };
        // Bound to one core each (Open MPI's default for two ranks): one thread.
        assert_eq!(threads_per_rank(bound(1), Some(2)), Some(1));
        // Bound to a socket of 8 that 4 of the 8 ranks share: 2 threads, not 8.
        assert_eq!(threads_per_rank(bound(8), Some(8)), Some(2));
        // Bound to 4 cores each (srun --cpus-per-task=4): all 4, not 4 / 4.
        assert_eq!(threads_per_rank(bound(4), Some(4)), Some(4));
        // A container with a 2-CPU quota on a 64-CPU host, 2 ranks: one thread each.
        let quota = Cpus {
            affinity: 64,
            online: 64,
            usable: 2,
        };
        assert_eq!(threads_per_rank(quota, Some(2)), Some(1));
        // This process's own CPUs: the standard library's count (mask, then quota) is
        // never above the mask that `sched_getaffinity` read.
        let me = Cpus::of_this_process();
        assert!(me.usable >= 1 && me.usable <= me.affinity, "{me:?}");
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
        assert_eq!(rank_threads(env(&ompi), node(16)), Some(4));
        let hydra = [("PMI_SIZE", "6"), ("MPI_LOCALNRANKS", " 3 ")];
        assert_eq!(rank_threads(env(&hydra), node(16)), Some(5));
        // Not launched, a user's choice, no count or an unreadable one: nothing is set.
        assert_eq!(
            rank_threads(env(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "4")]), node(16)),
            None
        );
        let chosen = [
            ("PMIX_RANK", "0"),
            ("MPI_LOCALNRANKS", "2"),
            (THREADS_VAR, "7"),
        ];
        assert_eq!(rank_threads(env(&chosen), node(16)), None);
        assert_eq!(rank_threads(env(&[("PMIX_RANK", "0")]), node(16)), None);
        // Slurm's srun: its tasks per node when every node has as many.
        let srun = [("PMI_SIZE", "8"), ("SLURM_STEP_TASKS_PER_NODE", "4(x2)")];
        assert_eq!(rank_threads(env(&srun), node(16)), Some(4));
        // Uneven: this node's count, by its index; without the index, nothing.
        let uneven = [("PMIX_RANK", "1"), ("SLURM_TASKS_PER_NODE", "4(x2),3")];
        assert_eq!(rank_threads(env(&uneven), node(16)), None);
        let third = [
            ("PMIX_RANK", "9"),
            ("SLURM_TASKS_PER_NODE", "4(x2),3"),
            ("SLURM_NODEID", "2"),
        ];
        assert_eq!(rank_threads(env(&third), node(16)), Some(5));
        assert_eq!(slurm_tasks_on_node("3", None), Some(3));
        assert_eq!(slurm_tasks_on_node("2,2(x5)", None), Some(2));
        assert_eq!(slurm_tasks_on_node("4(x2),3", Some(0)), Some(4));
        assert_eq!(slurm_tasks_on_node("4(x2),3", Some(1)), Some(4));
        assert_eq!(slurm_tasks_on_node("1,4(x2),3", Some(3)), Some(3));
        assert_eq!(slurm_tasks_on_node("4(x2),3", Some(3)), None);
        assert_eq!(slurm_tasks_on_node("x(x2)", None), None);
        assert_eq!(slurm_tasks_on_node("4(x2", Some(0)), None);
        assert_eq!(slurm_tasks_on_node("", Some(0)), None);
        let bad = [("PMI_SIZE", "2"), ("MPI_LOCALNRANKS", "two")];
        assert_eq!(rank_threads(env(&bad), node(16)), None);
    }
}
