//! The disk cache across real processes: writers killed with SIGKILL at random moments, and
//! several processes writing, reading and evicting the same keys of one directory at once.
//! Child processes are this test binary run again with an environment variable naming the
//! role (`std::env::current_exe()`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datacache::stats::Stats;
use datacache::{DiskCache, Durability, Lookup};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ROLE: &str = "DATACACHE_PROC_ROLE";
const DIR: &str = "DATACACHE_PROC_DIR";
const SEED: &str = "DATACACHE_PROC_SEED";
const NS: &str = "procs";
/// Keys every process works on (few, so that they collide).
const KEYS: usize = 8;

/// A payload that says which key and generation it is and is otherwise a pure function of
/// them, so a reader can check it byte for byte without knowing which write it sees.
fn payload(key: usize, gen: u64, len: usize) -> Vec<u8> {
    let len = len.max(24);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&(key as u64).to_le_bytes());
    v.extend_from_slice(&gen.to_le_bytes());
    v.extend_from_slice(&(len as u64).to_le_bytes());
    let mut x = gen.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ key as u64 | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// Whether `bytes` is exactly some `payload(key, …)`.
fn exact(key: usize, bytes: &[u8]) -> bool {
    if bytes.len() < 24 {
        return false;
    }
    let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap());
    word(0) == key as u64
        && word(2) == bytes.len() as u64
        && payload(key, word(1), bytes.len()) == bytes
}

fn open(dir: &Path, limit: u64, stats: Arc<Stats>) -> DiskCache {
    DiskCache::open_with(dir, NS, limit, Durability::Fsync, stats).unwrap()
}

fn spawn(role: &str, dir: &Path, seed: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_role",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ])
        .env(ROLE, role)
        .env(DIR, dir)
        .env(SEED, seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Body of the child processes; does nothing in a normal test run.
#[test]
fn child_role() {
    let (Ok(role), Ok(dir)) = (std::env::var(ROLE), std::env::var(DIR)) else {
        return;
    };
    let seed: u64 = std::env::var(SEED).unwrap().parse().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = Path::new(&dir);
    let stats = Arc::new(Stats::default());
    match role.as_str() {
        // Writes entries forever, until killed; sizes up to 256 KiB so that a kill often
        // lands inside a write.
        "crash_writer" => {
            let d = open(dir, 1 << 30, stats);
            println!("ready");
            loop {
                let key = rng.gen_range(0..KEYS);
                let len = rng.gen_range(24..256 << 10);
                d.put(key, &payload(key, rng.gen(), len));
            }
        }
        // Writes, reads and (the limit is a few entries) evicts the shared keys for a while.
        "writer" | "reader" => {
            let d = open(dir, 200 << 10, stats.clone());
            let until = Instant::now() + Duration::from_millis(1500);
            let (mut hits, mut bad) = (0u64, 0u64);
            while Instant::now() < until {
                let key = rng.gen_range(0..KEYS);
                if role == "writer" && rng.gen_bool(0.5) {
                    let len = rng.gen_range(24..64 << 10);
                    d.put(key, &payload(key, rng.gen(), len));
                } else {
                    match d.get(key) {
                        Lookup::Hit(b) if exact(key, &b) => hits += 1,
                        Lookup::Hit(_) => bad += 1,
                        Lookup::Miss | Lookup::Corrupt => {}
                    }
                }
            }
            let s = stats.snapshot();
            println!(
                "result hits={hits} bad={bad} corrupt={} evictions={} writes={}",
                s.disk_corrupt, s.disk_evictions, s.disk_writes
            );
        }
        other => panic!("unknown role {other}"),
    }
}

fn tmp_files(dir: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name().to_string_lossy().contains(".tmp.") {
                n += 1;
            }
        }
    }
    n
}

/// `trials` times: start a writer, kill it with SIGKILL after a random delay, then open the
/// directory as the next run would and check every key is byte-exact or absent.
fn sigkill_trials(trials: usize) {
    let t = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let (mut served, mut killed_mid_write, mut corrupt) = (0usize, 0usize, 0u64);
    let mut tmps_before = 0;
    let started = Instant::now();
    for trial in 0..trials {
        let mut child = spawn("crash_writer", t.path(), trial as u64);
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("ready") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
        }
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..20_000)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // One more temporary file than before: the writer died between creating it and
        // renaming it into place, i.e. inside a write.
        let tmps = tmp_files(t.path());
        killed_mid_write += usize::from(tmps > tmps_before);
        tmps_before = tmps;
        // The next run: open the directory and read every key.
        let stats = Arc::new(Stats::default());
        let d = open(t.path(), 1 << 30, stats.clone());
        for key in 0..KEYS {
            if let Lookup::Hit(b) = d.get(key) {
                assert!(
                    exact(key, &b),
                    "trial {trial}: key {key} served {} wrong bytes",
                    b.len()
                );
                served += 1;
            }
        }
        corrupt += stats.snapshot().disk_corrupt;
    }
    eprintln!(
        "{trials} SIGKILL trials in {:.1} s: {served} entries served, all byte-exact; \
         {killed_mid_write} kills landed inside a write; {corrupt} bad entries found",
        started.elapsed().as_secs_f64()
    );
    assert!(served > 0, "no entry was ever served: the check is vacuous");
    assert!(
        killed_mid_write > 0,
        "no kill landed inside a write: the test is vacuous"
    );
    assert_eq!(corrupt, 0, "a bad entry reached its final name");
}

#[test]
fn sigkill_during_writes_never_serves_a_bad_entry() {
    sigkill_trials(100);
}

#[test]
#[ignore = "about a minute; run with --ignored"]
fn sigkill_during_writes_never_serves_a_bad_entry_1000() {
    sigkill_trials(1000);
}

/// Three writers and two readers on the same 8 keys with a limit of a few entries, so that
/// same-key writes race, reads overlap writes, and eviction removes files other processes
/// are reading.
#[test]
fn processes_share_one_directory() {
    let t = tempfile::tempdir().unwrap();
    let roles = ["writer", "writer", "writer", "reader", "reader"];
    let children: Vec<_> = roles
        .iter()
        .enumerate()
        .map(|(k, r)| spawn(r, t.path(), 100 + k as u64))
        .collect();
    let (mut hits, mut evictions, mut writes) = (0u64, 0u64, 0u64);
    for mut c in children {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut c.stdout.take().unwrap(), &mut out).unwrap();
        assert!(c.wait().unwrap().success(), "a child failed: {out}");
        let line = out
            .lines()
            .find(|l| l.starts_with("result"))
            .expect("no result line");
        let field = |name: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap()
                .parse()
                .unwrap()
        };
        assert_eq!(field("bad"), 0, "a process was served wrong bytes: {line}");
        assert_eq!(field("corrupt"), 0, "a process found a bad entry: {line}");
        hits += field("hits");
        evictions += field("evictions");
        writes += field("writes");
    }
    eprintln!("5 processes: {writes} writes, {hits} verified hits, {evictions} evictions");
    assert!(hits > 0 && writes > 0 && evictions > 0, "vacuous run");
    // What is left is intact.
    let d = open(t.path(), 200 << 10, Arc::new(Stats::default()));
    for key in 0..KEYS {
        if let Lookup::Hit(b) = d.get(key) {
            assert!(exact(key, &b));
        }
    }
    assert_eq!(tmp_files(t.path()), 0, "temporary files left behind");
}
