//! Every wire decoder and JSON reader under arbitrary bytes (proptest): each input must give
//! a value or a typed error, never a panic, and no allocation may follow a length field
//! beyond [`fuzz_harness::ALLOC_LIMIT`]. The same entry points are the cargo-fuzz targets in
//! `fuzz/` (`cargo xtask fuzz`); inputs those runs found crashing are kept in
//! `fuzz/regressions/TARGET/` and replayed here.

mod fuzz_harness;

use fuzz_harness::{largest_alloc, run, seeds, ALLOC_LIMIT, TARGETS};
use proptest::prelude::*;

/// Arbitrary bytes, and for the structured targets mutations of a valid input: a random
/// seed with a few bytes overwritten, or cut short.
fn input(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds(target);
    let n = seeds.len();
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        (
            0..n,
            proptest::collection::vec((any::<u16>(), any::<u8>()), 1..6),
            any::<u16>()
        )
            .prop_map(move |(i, edits, cut)| {
                let mut v = seeds[i].clone();
                for (at, b) in edits {
                    if !v.is_empty() {
                        let at = at as usize % v.len();
                        v[at] = b;
                    }
                }
                let keep = v.len() - (cut as usize % 8).min(v.len());
                v.truncate(keep);
                v
            }),
    ]
}

fn check(target: &'static str, data: &[u8]) {
    run(target, data);
    assert!(
        largest_alloc() <= ALLOC_LIMIT,
        "{target}: an allocation of {} bytes after input {data:?}",
        largest_alloc()
    );
}

/// The seeds are valid: the properties below start from inputs that decode, so they are
/// not vacuous.
#[test]
fn seeds_decode() {
    for t in TARGETS {
        let seeds = seeds(t);
        assert!(!seeds.is_empty(), "{t}: no seeds");
        let ok = seeds.iter().filter(|s| run(t, s)).count();
        match t {
            // A hand-written calibration may fail validation; the fuzzer starts from its shape.
            "calibration_json" => {}
            _ => assert_eq!(ok, seeds.len(), "{t}: {ok} of {} seeds decode", seeds.len()),
        }
    }
}

/// A header claiming 2^32 − 1 entries over 2^32 elements, with no data behind it, is a
/// typed error that allocates nothing like what it claims.
#[test]
fn sparse_grad_length_fields_are_not_trusted() {
    let sg = sparsify::SparseGrad::<f32>::new(vec![1], vec![1.0], 4).unwrap();
    let mut enc = sg.encode();
    enc[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    enc[8..16].copy_from_slice(&(1u64 << 32).to_le_bytes());
    assert!(sparsify::SparseGrad::<f32>::decode(&enc).is_err());
    assert!(largest_alloc() <= ALLOC_LIMIT);
}

/// ExDyna once trusted the counts its peers send (see `fuzz_harness::EXDYNA`): a count word
/// of 2^31 − 1 made its step ask for 8 GiB. Counts above the sender's partition are now a
/// typed error before anything is allocated.
#[test]
fn exdyna_rejects_a_corrupt_count() {
    for msg in 0..64u8 {
        fuzz_harness::exdyna_wire(&[0, msg, 2, 0, 0, 0xff, 0xff, 0xff, 0x7f]);
        assert!(largest_alloc() <= ALLOC_LIMIT, "message {msg}");
    }
}

/// Ok-Topk (the last case of `fuzz_harness::SPARSE`) checks every count, boundary and
/// index it receives: a word of 2^31 − 1 at the start of any of its messages (the setup's
/// agreement, the region boundaries, the counts, the entries of both steps) is a typed
/// error, never an allocation of that size.
#[test]
fn oktopk_rejects_corrupt_counts() {
    const OKTOPK: u8 = 8;
    for msg in 0..24u8 {
        let ok = run(
            "sparse_wire",
            &[OKTOPK, msg, 2, 0, 0, 0xff, 0xff, 0xff, 0x7f],
        );
        assert!(!ok, "message {msg}: a corrupt word was accepted");
        assert!(largest_alloc() <= ALLOC_LIMIT, "message {msg}");
    }
}

/// `allgatherv` once sized its output from the counts it all-gathered unchecked (see
/// `fuzz_harness::ALLGATHERV`): this input, found by `cargo xtask fuzz` in `dense_wire`,
/// corrupts a count, which made it panic. Each count now travels with a check word.
#[test]
fn allgatherv_rejects_a_corrupt_count() {
    assert!(!fuzz_harness::allgatherv_wire(&[
        0, 0, 0x26, 0x51, 0xf8, 0x35, 0x80
    ]));
    // The unmutated recording replays cleanly: the case can pass.
    assert!(fuzz_harness::allgatherv_wire(&[0, 0, 3, 0, 0]));
}

/// Writes every target's seeds into `fuzz/seeds/TARGET/`, the corpus `cargo xtask fuzz`
/// starts from: `cargo test -p integration-tests --test decoders_fuzz -- --ignored seeds`.
#[test]
#[ignore = "writes files into fuzz/seeds"]
fn write_fuzz_seeds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    for t in TARGETS {
        let dir = root.join(t);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds(t).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:03}")), s).unwrap();
        }
    }
}

/// Crash inputs the fuzz runs found, kept as regression tests.
#[test]
fn fuzz_regressions_stay_fixed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    for t in TARGETS {
        let Ok(dir) = std::fs::read_dir(root.join(t)) else {
            continue;
        };
        for f in dir.flatten() {
            let data = std::fs::read(f.path()).unwrap();
            check(t, &data);
        }
    }
}

macro_rules! fuzz_props {
    ($($name:ident => $target:literal, $cases:expr;)*) => {
        $(
            proptest! {
                #![proptest_config(ProptestConfig::with_cases($cases))]
                #[test]
                fn $name(data in input($target)) {
                    check($target, &data);
                }
            }
        )*
    };
}

fuzz_props! {
    sparse_grad_decoder_never_panics => "sparse_grad", 2000;
    dense_wire_never_panics => "dense_wire", 400;
    sparse_wire_never_panics => "sparse_wire", 400;
    sim_header_never_panics => "sim_header", 200;
    pto_trailer_never_panics => "pto_trailer", 300;
    profile_json_never_panics => "profile_json", 1000;
    calibration_json_never_panics => "calibration_json", 1000;
}
