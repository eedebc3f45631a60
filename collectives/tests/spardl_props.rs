//! SparDL (Zhao et al.) beyond the properties every sparse all-reduce shares: every block
//! carries work (`k_block ≥ 1`, so no step moves nothing), the default team counts keep
//! the Spar-Reduce-Scatter for prime P, and B-SAG's `h` (Algorithm 2) steers the number of
//! entries after the all-gather between teams, `N_t`, towards `L` over 200 steps (the
//! behaviour of the paper's Fig. 5), with a step that stays within its bounds.

use collectives::sparse::{build, Sag, SparDl, SparseAlgo, SparseAllreduce};
use collectives::{Communicator, ThreadComm};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[path = "support/grads.rs"]
mod grads;

/// Random gradient with a shared structure (every 5th index large on every rank) so that
/// teams overlap, and per-rank noise so that they differ.
fn grad(seed: u64, rank: usize, step: usize, d: usize) -> Vec<f32> {
    grads::structured(seed, rank, step, d, 5)
}

/// A gradient mostly shared by all ranks (the same large entries everywhere, drifting
/// from step to step) plus a little per-rank noise: the teams' top-h overlap heavily, so
/// `h = L/d` gives far fewer than `L` entries after B-SAG and `h` has to grow.
fn shared_grad(rank: usize, step: usize, d: usize) -> Vec<f32> {
    let mut common = ChaCha8Rng::seed_from_u64(1000 + step as u64 / 10);
    let mut own = ChaCha8Rng::seed_from_u64(((rank as u64) << 32) ^ step as u64);
    (0..d)
        .map(|_| {
            // Heavy-tailed, so that the largest entries stand apart from the noise.
            let c: f32 = common.gen_range(-1.0f32..1.0);
            c.powi(9) + 0.01 * own.gen_range(-1.0f32..1.0)
        })
        .collect()
}

/// Non-zero entries of `update` in each of `m` blocks of `chunk`.
fn per_block(update: &[f32], m: usize, chunk: usize) -> Vec<usize> {
    (0..m)
        .map(|b| {
            let end = ((b + 1) * chunk).min(update.len());
            update[(b * chunk).min(end)..end]
                .iter()
                .filter(|v| **v != 0.0)
                .count()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Every block of the update carries entries, at every P and for every SAG, including
    /// densities where `⌊⌈d/m⌉·ρ⌋ = 0` (the authors' code would move nothing there).
    #[test]
    fn every_block_has_work(p in 1usize..=17, chunk in 2usize..60, dens_i in 0usize..4, sag_i in 0usize..3, seed in any::<u64>()) {
        let sag = [Sag::None, Sag::Recursive, Sag::Bruck][sag_i];
        let density = [0.001, 0.01, 0.1, 0.5][dens_i];
        let d = p * chunk;
        let out = ThreadComm::run(p, |comm| -> collectives::Result<(usize, usize, Vec<f32>)> {
            let mut alg = SparDl::new(&comm, d, density, sag, None, None)?;
            let mut last = Vec::new();
            for s in 0..2 {
                let (u, st) = alg.step(&comm, &grad(seed, comm.rank(), s, d))?;
                prop_assert_eq_ok(st.nnz > 0)?;
                last = u.to_dense();
            }
            Ok((alg.teams(), alg.k_block(), last))
        })
        .unwrap();
        let (teams, kb, update) = &out[0];
        prop_assert!(*kb >= 1);
        let m = p / teams;
        let blocks = per_block(update, m, d.div_ceil(m));
        prop_assert!(blocks.iter().all(|&n| n >= 1), "P={p} d={d} ρ={density} {sag:?}: {blocks:?}");
        // Without SAG a block holds exactly k_block entries (random data: no sum is zero).
        if sag == Sag::None {
            prop_assert!(blocks.iter().all(|&n| n == *kb), "{blocks:?} vs k_b = {kb}");
        }
    }
}

/// An `Err` the closure can return when `ok` fails (proptest's macros return a
/// `TestCaseError`, which a rank's closure cannot).
fn prop_assert_eq_ok(ok: bool) -> collectives::Result<()> {
    if ok {
        Ok(())
    } else {
        Err(collectives::Error::InvalidArgument(
            "an empty update".into(),
        ))
    }
}

#[test]
fn tiny_density_moves_one_entry_per_block() {
    // ⌈60/6⌉ · 0.01 = 0.1: k_b = 1, six entries in the update.
    let nnz = ThreadComm::run(6, |comm| -> collectives::Result<usize> {
        let spardl = SparseAlgo::SparDl {
            sag: Sag::None,
            teams: None,
            selector: None,
        };
        let mut alg = build(spardl, &comm, 60, 0.01)?;
        Ok(alg.step(&comm, &grad(3, comm.rank(), 0, 60))?.1.nnz)
    })
    .unwrap();
    assert!(nnz.iter().all(|&n| n == 6), "{nnz:?}");
}

#[test]
fn prime_p_keeps_the_spar_reduce_scatter() {
    for p in [2usize, 3, 5, 7, 11, 13] {
        let out = ThreadComm::run(p, |comm| -> collectives::Result<(usize, u64)> {
            let mut alg = SparDl::new(&comm, 40 * p, 0.1, Sag::Bruck, None, None)?;
            let (_, st) = alg.step(&comm, &grad(1, comm.rank(), 0, 40 * p))?;
            Ok((alg.teams(), st.rounds))
        })
        .unwrap();
        let (teams, rounds) = out[0];
        // One team of P ranks: SRS (⌈log2 P⌉ rounds) and the final all-gather.
        assert_eq!(teams, 1, "P={p}");
        let l = u64::from(usize::BITS - (p - 1).leading_zeros());
        assert_eq!(rounds, 2 * l, "P={p}");
    }
}

/// 200 steps of B-SAG: after the first adjustments, `N_t` stays near `L` at every team
/// position (the paper's Fig. 5 and Algorithm 2), `h` stays in `[L/d, L]` and the step of
/// `h` in `[½, L(1 − 1/d)]`.
#[test]
fn bsag_n_t_tracks_l_over_200_steps() {
    const STEPS: usize = 200;
    let (p, teams, d, density) = (8usize, 4usize, 4000usize, 0.02);
    let runs = ThreadComm::run(
        p,
        |comm| -> collectives::Result<Vec<(f64, f64, usize, usize)>> {
            let mut alg = SparDl::new(&comm, d, density, Sag::Bruck, Some(teams), None)?;
            let mut out = Vec::new();
            for s in 0..STEPS {
                alg.step(&comm, &shared_grad(comm.rank(), s, d))?;
                out.push((alg.h(), alg.h_step(), alg.last_gathered(), alg.k_block()));
            }
            Ok(out)
        },
    )
    .unwrap();
    let m = p / teams;
    for (r, run) in runs.iter().enumerate() {
        let l = run[0].3 as f64;
        for &(h, step, _, _) in run {
            assert!(
                h >= l / teams as f64 - 1e-9 && h <= l + 1e-9,
                "rank {r}: h = {h}"
            );
            let width = l - l / teams as f64;
            assert!(
                step.abs() >= 0.5 - 1e-12 && step.abs() <= width + 1e-9,
                "rank {r}: step {step}"
            );
        }
        // Ranks at the same team position see the same N_t and agree on h.
        assert_eq!(run, &runs[r % m], "rank {r} vs position {}", r % m);
        let tail: Vec<f64> = run[50..].iter().map(|x| x.2 as f64 / l).collect();
        let mean = tail.iter().sum::<f64>() / tail.len() as f64;
        let within = tail.iter().filter(|&&x| (0.75..=1.25).contains(&x)).count();
        eprintln!(
            "rank {r}: L = {l}, mean N_t/L over steps 50..200 = {mean:.3}, {within}/{} within ±25%",
            tail.len()
        );
        assert!((0.9..=1.1).contains(&mean), "rank {r}: mean N_t/L = {mean}");
        assert!(
            within * 10 >= tail.len() * 9,
            "rank {r}: {within}/{}",
            tail.len()
        );
        // It tracks from both sides, not by sitting at a bound.
        assert!(tail.iter().any(|&x| x > 1.0) && tail.iter().any(|&x| x <= 1.0));
    }
    // The first N_t (h = L/d) is far below L: the adjustment did the work.
    let first = runs[0][0].2 as f64 / runs[0][0].3 as f64;
    eprintln!("N_0/L = {first:.3}");
    assert!(
        first < 0.6,
        "N_0/L = {first}: the test would not show any tracking"
    );
}
