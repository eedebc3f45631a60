//! A checkpoint writer killed with SIGKILL at random moments (mid-write, mid-rename,
//! mid-prune) never leaves a directory whose newest checkpoint is unusable: the newest
//! intact checkpoint is always there, is at least the last one the writer reported done,
//! and reads back byte for byte. The writer is this test binary run again with an
//! environment variable naming its role (`std::env::current_exe()`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use pipeline::checkpoint::{encode_file, file_name, latest, save_file, Header};

const ROLE: &str = "PIPELINE_CKPT_KILL_DIR";
const RANKS: usize = 2;
const FINGERPRINT: u64 = 0x5eed;

/// The replicated part and rank parts of the checkpoint after `step`: a pure function of
/// the step, a few MB so that a write takes a while.
fn parts(step: u64) -> (Vec<u8>, Vec<Vec<u8>>) {
    let fill = |salt: u64, n: usize| -> Vec<u8> {
        let mut x = step.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    (
        fill(0, 1 << 21),
        (0..RANKS).map(|r| fill(r as u64 + 1, 1 << 20)).collect(),
    )
}

fn header(step: u64) -> Header {
    Header {
        ranks: RANKS,
        fingerprint: FINGERPRINT,
        step,
    }
}

/// Body of the writer process; does nothing in a normal test run.
#[test]
fn child_role() {
    let Ok(dir) = std::env::var(ROLE) else {
        return;
    };
    let dir = Path::new(&dir);
    let start = pipeline::checkpoint::list(dir)
        .unwrap()
        .first()
        .map_or(1, |x| x.0 + 1);
    for step in start.. {
        let (rep, ranks) = parts(step);
        save_file(dir, &encode_file(header(step), &rep, &ranks), step).unwrap();
        println!("saved {step}");
    }
}

#[test]
fn a_writer_killed_at_any_moment_leaves_a_usable_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut saved = 0u64;
    let mut kills_mid_write = 0;
    for trial in 0..40u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
            .env(ROLE, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(out)
                .lines()
                .map_while(|l| l.ok())
                .filter_map(|l| l.strip_prefix("saved ").and_then(|s| s.parse().ok()))
                .max()
        });
        // Pseudo-random moments from a few milliseconds to about a third of a second.
        let ms = 3 + (trial * 7919 + 13) % 300;
        std::thread::sleep(Duration::from_millis(ms));
        child.kill().unwrap();
        child.wait().unwrap();
        if let Some(s) = reader.join().unwrap() {
            saved = saved.max(s);
        }
        let tmp_left = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"));
        kills_mid_write += usize::from(tmp_left);
        if saved == 0 {
            continue;
        }
        let (file, skipped) = latest(dir.path(), RANKS, FINGERPRINT).unwrap();
        assert!(skipped.is_empty(), "trial {trial}: {skipped:?}");
        let step = file.header.step;
        assert!(
            step >= saved,
            "trial {trial}: newest {step}, {saved} reported saved"
        );
        let (rep, ranks) = parts(step);
        assert!(
            file.replicated == rep && file.parts == ranks,
            "trial {trial}"
        );
        assert_eq!(file.path, dir.path().join(file_name(step)));
    }
    // Not vacuous: checkpoints were written, and some kills hit a write in progress.
    assert!(saved > 3, "{saved}");
    assert!(kills_mid_write > 0);
}
