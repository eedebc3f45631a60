//! Checkpoints of a training run: what one holds, its file format, and the collective save
//! and load that every rank calls.
//!
//! **One file, written by rank 0.** Every rank sends its own part (its error-feedback
//! residuals and the sparse algorithms' state, its loader position, its batch-norm running
//! statistics, the state its recurrent stages carry into the next batch) to rank 0, which
//! writes them after the replicated part (weights, optimizer state, step, plan), once. One file is one rename, so a checkpoint is atomic across all
//! ranks: there is no step at which some ranks' files are new and others' old, and no
//! shared file system is needed (on load rank 0 reads and sends each rank its part). The
//! price is that rank 0 holds every rank's residuals (`P · d` values) while it writes, which
//! for the models here is small.
//!
//! **Format** (little-endian): magic `SDLCKPT\0`, version `u32`, CRC-32 of everything after
//! it, then ranks P `u32`, configuration fingerprint `u64`, step `u64`, the replicated part
//! and P rank parts (each length-prefixed). A file of another version, P or configuration
//! is a typed error; a file whose checksum fails is [`CheckpointError::Corrupt`].
//!
//! **Atomic writes**: the file is written as `ckpt-STEP.bin.tmp`, flushed to disk, renamed
//! to `ckpt-STEP.bin` and the directory flushed; only then are checkpoints older than the
//! newest [`KEEP`] removed. A crash while writing leaves a `.tmp` that no reader looks at,
//! and the previous checkpoint. [`latest`] takes the newest file that reads back intact and
//! names the ones it skipped.
//!
//! Every outcome of [`save`] and [`load`] (a write that failed on rank 0, a file of another
//! configuration, a state that does not fit) is the same [`CheckpointError`] on every rank.

use std::io::Write;
use std::path::{Path, PathBuf};

use collectives::dense::{self, AllgatherAlgo, BroadcastAlgo, DenseOptions};
use collectives::{Communicator, Tag};
use datacache::LoaderState;
use serde::{Deserialize, Serialize};

use crate::staged::HostTensor;
use crate::train::EpochStats;
use crate::{Error, Result};

/// Why a checkpoint could not be written or used; the same on every rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum CheckpointError {
    /// `--resume` with no checkpoint in the directory.
    #[error("no checkpoint in {dir}")]
    Missing {
        /// The directory.
        dir: String,
    },
    /// Reading or writing failed.
    #[error("{path}: {detail}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        detail: String,
    },
    /// Not a complete checkpoint: bad magic, truncated, or the checksum fails.
    #[error("{path} is corrupt: {detail}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// A checkpoint of another format version.
    #[error("{path} has format version {found}, this build reads {expected}")]
    Version {
        /// The file.
        path: String,
        /// Its version.
        found: u32,
        /// Ours.
        expected: u32,
    },
    /// Written by a run with another number of ranks.
    #[error("{path} was written by {saved} ranks, this run has {ranks}")]
    Ranks {
        /// The file.
        path: String,
        /// Its P.
        saved: usize,
        /// This run's P.
        ranks: usize,
    },
    /// Written by a run with another configuration or model.
    #[error("{path} was written with another configuration (fingerprint {saved:016x}, this run {current:016x})")]
    Config {
        /// The file.
        path: String,
        /// Its fingerprint.
        saved: u64,
        /// This run's.
        current: u64,
    },
    /// The state read back does not fit this run (a layer count, a residual length, a
    /// sparse algorithm's state), or a part of the run cannot be checkpointed.
    #[error("checkpoint state: {0}")]
    State(String),
}

/// Magic of a checkpoint file.
pub const MAGIC: &[u8; 8] = b"SDLCKPT\0";
/// Format version this build writes and reads.
pub const VERSION: u32 = 3;
/// Checkpoints kept in a directory: the newest and the one before it.
pub const KEEP: usize = 2;
/// Tag of the rank parts sent to and from rank 0.
const TAG: Tag = 0x6240;
/// Bytes in front of the checksummed body: magic, version, CRC-32.
const PREFIX: usize = 16;

/// Appends values in the checkpoint's byte form (little-endian, lengths in front).
#[derive(Debug, Default)]
pub(crate) struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.u64(v.to_bits())
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.u64(v.len() as u64);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    pub fn f32_lists(&mut self, v: &[Vec<f32>]) -> &mut Self {
        self.u64(v.len() as u64);
        v.iter().for_each(|x| {
            self.f32s(x);
        });
        self
    }
}

/// Reads [`Enc`]'s form back; every length is checked against the bytes left before
/// anything is allocated, so arbitrary bytes give [`CheckpointError::State`].
pub(crate) struct Dec<'a>(pub &'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.0.len() {
            return Err(state(format!(
                "{n} bytes asked for, {} left (a length past the end)",
                self.0.len()
            )));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    }
    /// A count of items of `width` bytes each that must fit in the bytes left.
    fn count(&mut self, width: usize) -> Result<usize> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n.checked_mul(width).is_some_and(|b| b <= self.0.len()))
            .ok_or_else(|| state(format!("count {n} past the end")))
    }
    pub fn usize(&mut self) -> Result<usize> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| state(format!("{v} overflows usize")))
    }
    pub fn f64(&mut self) -> Result<f64> {
        self.u64().map(f64::from_bits)
    }
    /// An `f64` whose NaN stands for `None`.
    pub fn opt_f64(&mut self) -> Result<Option<f64>> {
        Ok(Some(self.f64()?).filter(|v| !v.is_nan()))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.count(1)?;
        self.take(n)
    }
    pub fn str(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| state("a name is not UTF-8"))
    }
    pub fn f32s(&mut self) -> Result<Vec<f32>> {
        let n = self.count(4)?;
        Ok(self
            .take(4 * n)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    pub fn f32_lists(&mut self) -> Result<Vec<Vec<f32>>> {
        let n = self.count(8)?;
        (0..n).map(|_| self.f32s()).collect()
    }
    /// Everything was read.
    pub fn finish(&self) -> Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(state(format!("{} trailing bytes", self.0.len())))
        }
    }
}

/// Buffers `v` (an optimizer's momenta) as a state of their own.
pub(crate) fn f32_lists_state(v: &[Vec<f32>]) -> Vec<u8> {
    let mut e = Enc::default();
    e.f32_lists(v);
    e.0
}

/// [`f32_lists_state`] read back, every byte used.
pub(crate) fn f32_lists_from_state(b: &[u8]) -> Result<Vec<Vec<f32>>> {
    let mut d = Dec(b);
    let v = d.f32_lists()?;
    d.finish()?;
    Ok(v)
}

fn state(msg: impl Into<String>) -> Error {
    CheckpointError::State(msg.into()).into()
}

/// What every rank holds alike, taken from rank 0.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Replicated {
    /// Steps done.
    pub step: u64,
    /// Epoch of the next step (from 0).
    pub epoch: u64,
    /// Its iteration within the epoch (the epoch's end when it equals the iterations per
    /// epoch: evaluation is still to run).
    pub iter: u64,
    /// The epoch the reducer's scheme was built for (the §5.6 switch changes it).
    pub reducer_epoch: u64,
    /// The merge plan's group starts.
    pub plan_starts: Vec<u64>,
    /// The planner's name.
    pub planner: String,
    /// The profile's per-layer backward times and forward time (planning input).
    pub profile_bw: Vec<f64>,
    /// The parameters, one vector per layer.
    pub weights: Vec<Vec<f32>>,
    /// The optimizer's state ([`crate::optimizer::Optimizer::save_state`]).
    pub optimizer: Vec<u8>,
    /// Finished epochs' numbers.
    pub epochs: Vec<EpochStats>,
    /// Training time so far, seconds.
    pub train_time_s: f64,
    /// Rank 0's loss sum and correct count in the unfinished epoch.
    pub loss_sum: f64,
    /// See `loss_sum`.
    pub right: u64,
    /// Steps whose parameters were checked on every rank.
    pub checked: u64,
}

/// What is this rank's own.
#[derive(Debug, Clone, PartialEq)]
pub struct RankPart {
    /// The loader's position.
    pub loader: LoaderState,
    /// The reducer's state ([`crate::Reducer::save_state`]): residuals and the sparse
    /// algorithms' thresholds, partitions, `h`.
    pub reducer: Vec<u8>,
    /// Batch-norm running statistics (they differ per rank: each sees its own batches).
    pub buffers: Vec<Vec<f32>>,
    /// Each stage's carried training state ([`crate::staged::get_carried`]: an LSTM's
    /// final `(h, c)` of this rank's streams), so a resumed run continues its streams.
    pub carried: Vec<Vec<HostTensor>>,
    /// Payload bytes sent so far.
    pub bytes_sent: u64,
}

impl Replicated {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.step)
            .u64(self.epoch)
            .u64(self.iter)
            .u64(self.reducer_epoch);
        e.u64(self.plan_starts.len() as u64);
        self.plan_starts.iter().for_each(|&s| {
            e.u64(s);
        });
        e.str(&self.planner);
        e.u64(self.profile_bw.len() as u64);
        self.profile_bw.iter().for_each(|&t| {
            e.f64(t);
        });
        e.f32_lists(&self.weights).bytes(&self.optimizer);
        e.u64(self.epochs.len() as u64);
        for s in &self.epochs {
            e.u64(s.epoch as u64)
                .f64(f64::from(s.loss))
                .f64(s.train_acc)
                .f64(s.test_acc)
                .f64(s.test_loss)
                .f64(s.test_ppl.unwrap_or(f64::NAN))
                .f64(s.valid_loss.unwrap_or(f64::NAN))
                .f64(s.valid_ppl.unwrap_or(f64::NAN))
                .f64(s.elapsed_s);
        }
        e.f64(self.train_time_s)
            .f64(self.loss_sum)
            .u64(self.right)
            .u64(self.checked);
        e.0
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Dec(bytes);
        let (step, epoch, iter, reducer_epoch) = (d.u64()?, d.u64()?, d.u64()?, d.u64()?);
        let n = d.count(8)?;
        let plan_starts = (0..n).map(|_| d.u64()).collect::<Result<_>>()?;
        let planner = d.str()?;
        let n = d.count(8)?;
        let profile_bw = (0..n).map(|_| d.f64()).collect::<Result<_>>()?;
        let weights = d.f32_lists()?;
        let optimizer = d.bytes()?.to_vec();
        let n = d.count(72)?;
        let mut epochs = Vec::with_capacity(n);
        for _ in 0..n {
            epochs.push(EpochStats {
                epoch: d.usize()?,
                loss: d.f64()? as f32,
                train_acc: d.f64()?,
                test_acc: d.f64()?,
                test_loss: d.f64()?,
                test_ppl: d.opt_f64()?,
                valid_loss: d.opt_f64()?,
                valid_ppl: d.opt_f64()?,
                elapsed_s: d.f64()?,
            });
        }
        let r = Replicated {
            step,
            epoch,
            iter,
            reducer_epoch,
            plan_starts,
            planner,
            profile_bw,
            weights,
            optimizer,
            epochs,
            train_time_s: d.f64()?,
            loss_sum: d.f64()?,
            right: d.u64()?,
            checked: d.u64()?,
        };
        d.finish()?;
        Ok(r)
    }
}

impl RankPart {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.loader.epoch)
            .u64(self.loader.position as u64)
            .u64(self.loader.seed)
            .bytes(&self.reducer)
            .f32_lists(&self.buffers);
        e.u64(self.carried.len() as u64);
        for stage in &self.carried {
            e.u64(stage.len() as u64);
            for t in stage {
                e.u64(t.dims.len() as u64);
                t.dims.iter().for_each(|&d| {
                    e.u64(d as u64);
                });
                e.f32s(&t.values);
            }
        }
        e.u64(self.bytes_sent);
        e.0
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Dec(bytes);
        let r = RankPart {
            loader: LoaderState {
                epoch: d.u64()?,
                position: d.usize()?,
                seed: d.u64()?,
            },
            reducer: d.bytes()?.to_vec(),
            buffers: d.f32_lists()?,
            carried: {
                let stages = d.count(8)?;
                (0..stages)
                    .map(|_| {
                        let n = d.count(16)?;
                        (0..n)
                            .map(|_| {
                                let k = d.count(8)?;
                                Ok(HostTensor {
                                    dims: (0..k).map(|_| d.usize()).collect::<Result<_>>()?,
                                    values: d.f32s()?,
                                })
                            })
                            .collect::<Result<_>>()
                    })
                    .collect::<Result<_>>()?
            },
            bytes_sent: d.u64()?,
        };
        d.finish()?;
        Ok(r)
    }
}

/// What a checkpoint file says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Ranks P of the run that wrote it.
    pub ranks: usize,
    /// Its configuration fingerprint.
    pub fingerprint: u64,
    /// Steps done.
    pub step: u64,
}

/// A checkpoint read back: its header, the replicated part and every rank's part (bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct File {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its header.
    pub header: Header,
    /// The replicated part.
    pub replicated: Vec<u8>,
    /// Rank `r`'s part at `r`.
    pub parts: Vec<Vec<u8>>,
}

/// The file name of the checkpoint after `step` steps.
pub fn file_name(step: u64) -> String {
    format!("ckpt-{step:010}.bin")
}

/// The whole file: prefix, checksummed body.
pub fn encode_file(header: Header, replicated: &[u8], parts: &[Vec<u8>]) -> Vec<u8> {
    let mut body = Enc::default();
    body.0
        .extend_from_slice(&(header.ranks as u32).to_le_bytes());
    body.u64(header.fingerprint)
        .u64(header.step)
        .bytes(replicated);
    for p in parts {
        body.bytes(p);
    }
    let mut out = Vec::with_capacity(PREFIX + body.0.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body.0).to_le_bytes());
    out.extend_from_slice(&body.0);
    out
}

/// Parses a file's bytes and checks them against this run's P and fingerprint: corrupt
/// (magic, checksum, lengths), [`CheckpointError::Version`], then
/// [`CheckpointError::Ranks`] and [`CheckpointError::Config`].
pub fn decode_file(
    path: &Path,
    bytes: &[u8],
    ranks: usize,
    fingerprint: u64,
) -> std::result::Result<File, CheckpointError> {
    let name = path.display().to_string();
    let corrupt = |detail: String| CheckpointError::Corrupt {
        path: name.clone(),
        detail,
    };
    if bytes.len() < PREFIX || &bytes[..8] != MAGIC {
        return Err(corrupt(format!(
            "{} bytes without the checkpoint magic",
            bytes.len()
        )));
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let version = word(8);
    if version != VERSION {
        return Err(CheckpointError::Version {
            path: name.clone(),
            found: version,
            expected: VERSION,
        });
    }
    let body = &bytes[PREFIX..];
    if crc32fast::hash(body) != word(12) {
        return Err(corrupt(format!(
            "the checksum fails over {} bytes (truncated or altered)",
            body.len()
        )));
    }
    let (saved, rest) = body
        .split_first_chunk::<4>()
        .ok_or_else(|| corrupt("no header".into()))?;
    let saved = u32::from_le_bytes(*saved) as usize;
    if saved != ranks {
        return Err(CheckpointError::Ranks {
            path: name.clone(),
            saved,
            ranks,
        });
    }
    let mut d = Dec(rest);
    let parse = |d: &mut Dec| -> Result<File> {
        let header = Header {
            ranks,
            fingerprint: d.u64()?,
            step: d.u64()?,
        };
        let replicated = d.bytes()?.to_vec();
        let parts = (0..ranks)
            .map(|_| d.bytes().map(<[u8]>::to_vec))
            .collect::<Result<_>>()?;
        d.finish()?;
        Ok(File {
            path: path.to_path_buf(),
            header,
            replicated,
            parts,
        })
    };
    let file = parse(&mut d).map_err(|e| corrupt(e.to_string()))?;
    if file.header.fingerprint != fingerprint {
        return Err(CheckpointError::Config {
            path: name.clone(),
            saved: file.header.fingerprint,
            current: fingerprint,
        });
    }
    Ok(file)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |e| CheckpointError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

/// Writes `bytes` as `dir/name` atomically: a temporary file flushed to disk, renamed,
/// the directory flushed (see the module docs).
pub fn write_atomic(
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> std::result::Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    // The rename is durable once the directory is.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(path)
}

/// The checkpoint files in `dir`, newest first (temporary files excluded).
pub fn list(dir: &Path) -> std::result::Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir)(e)),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let step = name
            .to_str()
            .and_then(|n| n.strip_prefix("ckpt-"))
            .and_then(|n| n.strip_suffix(".bin"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(step) = step {
            out.push((step, entry.path()));
        }
    }
    out.sort_by_key(|x| std::cmp::Reverse(x.0));
    Ok(out)
}

/// The newest checkpoint in `dir` that reads back intact for this run, with the newer
/// ones skipped as corrupt (a checkpoint of another P, configuration or version is an
/// error, not skipped: it is not damage but another run's).
pub fn latest(
    dir: &Path,
    ranks: usize,
    fingerprint: u64,
) -> std::result::Result<(File, Vec<CheckpointError>), CheckpointError> {
    let mut skipped = Vec::new();
    for (_, path) in list(dir)? {
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        match decode_file(&path, &bytes, ranks, fingerprint) {
            Ok(f) => return Ok((f, skipped)),
            Err(e @ CheckpointError::Corrupt { .. }) => skipped.push(e),
            Err(e) => return Err(e),
        }
    }
    Err(skipped.pop().unwrap_or(CheckpointError::Missing {
        dir: dir.display().to_string(),
    }))
}

/// Removes all but the newest [`KEEP`] checkpoints, and temporary files that crashed
/// writes left (rank 0 is the only writer, so none is in progress).
fn prune(dir: &Path) -> std::result::Result<(), CheckpointError> {
    for (_, path) in list(dir)?.into_iter().skip(KEEP) {
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    for entry in std::fs::read_dir(dir).map_err(io(dir))?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("ckpt-") && name.ends_with(".bin.tmp") {
            std::fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
        }
    }
    Ok(())
}

/// Writes the file of the checkpoint after `step` into `dir` ([`write_atomic`]), then
/// removes all but the newest [`KEEP`] and any temporary file a crash left.
pub fn save_file(
    dir: &Path,
    bytes: &[u8],
    step: u64,
) -> std::result::Result<PathBuf, CheckpointError> {
    let path = write_atomic(dir, &file_name(step), bytes)?;
    prune(dir)?;
    Ok(path)
}

/// Rank 0's outcome on every rank: `Ok` on rank 0 gives every rank `Ok(())`; rank 0's
/// error becomes the same [`CheckpointError`] on every rank.
fn shared_outcome(
    ctrl: &dyn Communicator,
    local: std::result::Result<(), CheckpointError>,
) -> Result<()> {
    let text = match &local {
        Ok(()) => Vec::new(),
        Err(e) => serde_json::to_vec(e)?,
    };
    let text = broadcast_bytes(ctrl, text)?;
    if text.is_empty() {
        return Ok(());
    }
    let e: CheckpointError = serde_json::from_slice(&text)?;
    leave_together(ctrl);
    Err(e.into())
}

/// Waits until every rank has finished the exchange before an error is returned: a
/// fail-fast transport would otherwise end a slower peer's receive with `PeerFailed`
/// instead of the shared error. The barrier's own outcome changes nothing about it.
fn leave_together(ctrl: &dyn Communicator) {
    let _ = ctrl.barrier();
}

/// Rank 0's `bytes` on every rank.
fn broadcast_bytes(ctrl: &dyn Communicator, bytes: Vec<u8>) -> Result<Vec<u8>> {
    broadcast_from(ctrl, 0, bytes)
}

/// Writes the checkpoint after `header.step` steps into `dir` (collective): every rank's
/// `mine` goes to rank 0, which writes the file atomically and prunes old ones. The file's
/// path on every rank, or the same error on every rank.
pub fn save(
    ctrl: &dyn Communicator,
    dir: &Path,
    header: Header,
    replicated: &Replicated,
    mine: &RankPart,
) -> Result<PathBuf> {
    let path = dir.join(file_name(header.step));
    if ctrl.rank() != 0 {
        ctrl.send(0, TAG, &mine.encode())?;
        shared_outcome(ctrl, Ok(()))?;
        return Ok(path);
    }
    let mut parts = vec![mine.encode()];
    for r in 1..ctrl.size() {
        parts.push(ctrl.recv(r, TAG)?);
    }
    let bytes = encode_file(header, &replicated.encode(), &parts);
    let written = save_file(dir, &bytes, header.step).map(|_| ());
    shared_outcome(ctrl, written)?;
    Ok(path)
}

/// A checkpoint as one rank restores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    /// The file (as rank 0 read it).
    pub path: PathBuf,
    /// Newer files rank 0 skipped as damaged, with why (empty on the other ranks).
    pub skipped: Vec<String>,
    /// The replicated part.
    pub replicated: Replicated,
    /// This rank's part.
    pub mine: RankPart,
}

/// Loads the newest intact checkpoint of `dir` for a run of `ctrl.size()` ranks with
/// `fingerprint` (collective): rank 0 reads it ([`latest`]), checks it and sends every
/// rank its part; any failure is the same [`CheckpointError`] on every rank.
pub fn load(ctrl: &dyn Communicator, dir: &Path, fingerprint: u64) -> Result<Restored> {
    let p = ctrl.size();
    let mut file = None;
    let mut skipped = Vec::new();
    let outcome = if ctrl.rank() == 0 {
        latest(dir, p, fingerprint).map(|(f, s)| {
            skipped = s.iter().map(ToString::to_string).collect();
            file = Some(f);
        })
    } else {
        Ok(())
    };
    shared_outcome(ctrl, outcome)?;
    let (path, replicated, mine) = match file {
        Some(f) => {
            for (r, part) in f.parts.iter().enumerate().skip(1) {
                ctrl.send(r, TAG, part)?;
            }
            let mine = f.parts.into_iter().next().unwrap_or_default();
            (f.path, f.replicated, mine)
        }
        None => (dir.to_path_buf(), Vec::new(), ctrl.recv(0, TAG)?),
    };
    let replicated = broadcast_bytes(ctrl, replicated)?;
    // Parts that passed the checksum decode alike everywhere; a failure is still shared.
    let decoded = Replicated::decode(&replicated).and_then(|r| Ok((r, RankPart::decode(&mine)?)));
    let (replicated, mine) = agree_ok(ctrl, decoded)?;
    Ok(Restored {
        path,
        skipped,
        replicated,
        mine,
    })
}

/// Every rank's `local` outcome shared: if any rank failed, every rank returns the first
/// failing rank's error as a [`CheckpointError::State`].
pub(crate) fn agree_ok<T>(ctrl: &dyn Communicator, local: Result<T>) -> Result<T> {
    let mut all = vec![0u64; ctrl.size()];
    dense::allgather(
        ctrl,
        &[u64::from(local.is_err())],
        &mut all,
        AllgatherAlgo::Bruck,
        &DenseOptions::default(),
    )?;
    let Some(first) = all.iter().position(|&f| f != 0) else {
        return local;
    };
    let text = match (&local, ctrl.rank() == first) {
        (Err(e), true) => e.to_string().into_bytes(),
        _ => Vec::new(),
    };
    let text = broadcast_from(ctrl, first, text)?;
    leave_together(ctrl);
    Err(CheckpointError::State(format!("rank {first}: {}", String::from_utf8_lossy(&text))).into())
}

/// `root`'s `bytes` on every rank (its length first, then the bytes).
fn broadcast_from(ctrl: &dyn Communicator, root: usize, mut bytes: Vec<u8>) -> Result<Vec<u8>> {
    let opts = DenseOptions::default();
    let mut len = [bytes.len() as u64];
    dense::broadcast(ctrl, &mut len, root, BroadcastAlgo::Binomial, &opts)?;
    let n =
        usize::try_from(len[0]).map_err(|_| state(format!("a broadcast of {} bytes", len[0])))?;
    if ctrl.rank() != root {
        bytes = vec![0; n];
    }
    dense::broadcast(ctrl, &mut bytes, root, BroadcastAlgo::Binomial, &opts)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::MergePlan;
    use crate::runtime::Reducer;
    use crate::schemes::{CollectiveScheme, Scheme, TopkAllgather};
    use collectives::sparse::{AlgoState, SparseAlgo};
    use collectives::ThreadComm;
    use proptest::prelude::*;

    fn header(step: u64) -> Header {
        Header {
            ranks: 2,
            fingerprint: 0xfeed,
            step,
        }
    }

    fn file(step: u64) -> Vec<u8> {
        let rep = Replicated {
            step,
            plan_starts: vec![0, 3],
            planner: "topk".into(),
            weights: vec![vec![1.5, -2.0], vec![0.25]],
            ..Replicated::default()
        };
        let part = RankPart {
            loader: LoaderState {
                epoch: 1,
                position: 32,
                seed: 7,
            },
            reducer: vec![1, 2, 3],
            buffers: vec![vec![0.5; 4]],
            carried: vec![
                vec![],
                vec![
                    HostTensor {
                        dims: vec![2, 3],
                        values: vec![0.1, -0.2, 0.3, 0.4, 0.5, -0.6],
                    },
                    HostTensor {
                        dims: vec![2, 3],
                        values: vec![1.0; 6],
                    },
                ],
            ],
            bytes_sent: 99,
        };
        encode_file(header(step), &rep.encode(), &[part.encode(), part.encode()])
    }

    #[test]
    fn a_file_round_trips_and_names_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_atomic(dir.path(), &file_name(6), &file(6)).unwrap();
        let f = decode_file(&path, &std::fs::read(&path).unwrap(), 2, 0xfeed).unwrap();
        assert_eq!(f.header, header(6));
        let rep = Replicated::decode(&f.replicated).unwrap();
        assert_eq!(rep.weights, vec![vec![1.5, -2.0], vec![0.25]]);
        let part = RankPart::decode(&f.parts[1]).unwrap();
        assert_eq!(part.bytes_sent, 99);
        assert_eq!(
            part.carried[1][0].values,
            vec![0.1, -0.2, 0.3, 0.4, 0.5, -0.6]
        );
        assert_eq!(part.carried[1][1].dims, vec![2, 3]);
        assert!(part.carried[0].is_empty());
        let bytes = file(6);
        let check = |b: &[u8], ranks, fp| decode_file(&path, b, ranks, fp);
        assert!(matches!(
            check(&bytes, 3, 0xfeed),
            Err(CheckpointError::Ranks {
                saved: 2,
                ranks: 3,
                ..
            })
        ));
        assert!(matches!(
            check(&bytes, 2, 0xbeef),
            Err(CheckpointError::Config { saved: 0xfeed, .. })
        ));
        let mut version = bytes.clone();
        version[8] = 9;
        assert!(matches!(
            check(&version, 2, 0xfeed),
            Err(CheckpointError::Version { found: 9, .. })
        ));
        // Every truncation and every single flipped bit is corrupt (the CRC covers the
        // header too, so a flipped P reads as damage, not as another run).
        for cut in 0..bytes.len() {
            assert!(check(&bytes[..cut], 2, 0xfeed).is_err(), "{cut}");
        }
        for i in (0..bytes.len()).filter(|&i| !(8..12).contains(&i)) {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(
                matches!(check(&b, 2, 0xfeed), Err(CheckpointError::Corrupt { .. })),
                "byte {i}"
            );
        }
    }

    #[test]
    fn a_crash_while_writing_leaves_the_previous_checkpoint_usable() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_atomic(d, &file_name(6), &file(6)).unwrap();
        write_atomic(d, &file_name(9), &file(9)).unwrap();
        // Interrupted mid-write: a partial temporary file of step 12 (what a crash before
        // the rename leaves) is never read.
        let partial = file(12);
        std::fs::write(
            d.join(format!("{}.tmp", file_name(12))),
            &partial[..partial.len() / 3],
        )
        .unwrap();
        let (f, skipped) = latest(d, 2, 0xfeed).unwrap();
        assert_eq!((f.header.step, skipped.len()), (9, 0));
        // The newest file itself damaged (truncated, then one byte altered): a typed
        // error when read, and `latest` falls back to step 6, naming what it skipped.
        let newest = d.join(file_name(9));
        for damage in [0, 1] {
            let mut b = file(9);
            if damage == 0 {
                b.truncate(b.len() - 5);
            } else {
                let i = b.len() - 2;
                b[i] ^= 1;
            }
            std::fs::write(&newest, &b).unwrap();
            assert!(matches!(
                decode_file(&newest, &b, 2, 0xfeed),
                Err(CheckpointError::Corrupt { .. })
            ));
            let (f, skipped) = latest(d, 2, 0xfeed).unwrap();
            assert_eq!(f.header.step, 6);
            assert!(matches!(skipped[..], [CheckpointError::Corrupt { .. }]));
        }
        // Another run's checkpoint is not skipped over: it is an error.
        assert!(matches!(
            latest(d, 2, 0xbeef),
            Err(CheckpointError::Config { .. })
        ));
        // The next save removes the stale temporary file and keeps the newest two.
        save_file(d, &file(13), 13).unwrap();
        let steps: Vec<u64> = list(d).unwrap().iter().map(|x| x.0).collect();
        assert_eq!(steps, vec![13, 9]);
        assert!(!d.join(format!("{}.tmp", file_name(12))).exists());
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            latest(empty.path(), 2, 0xfeed),
            Err(CheckpointError::Missing { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        /// Arbitrary bytes never panic any decoder and never allocate from a length field.
        #[test]
        fn arbitrary_bytes_are_a_typed_error(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Replicated::decode(&bytes);
            let _ = RankPart::decode(&bytes);
            let _ = decode_file(Path::new("x"), &bytes, 2, 0);
            let mut prefixed = file(3)[..16].to_vec();
            prefixed.extend_from_slice(&bytes);
            prop_assert!(decode_file(Path::new("x"), &prefixed, 2, 0xfeed).is_err());
        }
    }

    #[test]
    fn reducer_state_misuse_is_a_typed_error() {
        ThreadComm::run(1, |comm| -> Result<()> {
            let topk = TopkAllgather { density: 0.5 };
            let mut red = Reducer::new(comm, &[2, 3], MergePlan::layerwise(2), &topk)?;
            red.ready(1, &[1.0, -2.0, 3.0])?;
            assert!(matches!(
                red.save_state(),
                Err(Error::IncompleteIteration { missing: 1, .. })
            ));
            red.ready(0, &[4.0, 5.0])?;
            red.finish()?;
            let good = red.save_state()?;
            assert!(residual_sum(&good) != 0.0);
            // Truncated bytes and another group count change nothing; a residual of the
            // wrong length leaves the reducer failed.
            assert!(matches!(
                red.restore_state(&good[..good.len() - 1]),
                Err(Error::Checkpoint(CheckpointError::State(_)))
            ));
            let comm = red.shutdown()?;
            let mut one = Reducer::new(comm, &[2, 3], MergePlan::single(2), &topk)?;
            assert!(matches!(
                one.restore_state(&good),
                Err(Error::InvalidArgument(_))
            ));
            let comm = one.shutdown()?;
            let mut other = Reducer::new(comm, &[3, 2], MergePlan::layerwise(2), &topk)?;
            assert!(matches!(
                other.restore_state(&good),
                Err(Error::Sparsify(sparsify::Error::LengthMismatch { .. }))
            ));
            assert!(other.ready(1, &[0.0; 2]).is_err());
            Ok(())
        })
        .unwrap();
    }

    /// Every rank's residual mass held by `state` (a reducer's): compressor residuals and
    /// sparse algorithms' residuals.
    fn residual_sum(state: &[u8]) -> f64 {
        let mut d = Dec(state);
        let (_, groups) = (d.u64().unwrap(), d.usize().unwrap());
        let mut sum = 0.0;
        for _ in 0..groups {
            let c = d.bytes().unwrap();
            if !c.is_empty() {
                sum += Dec(c)
                    .f32s()
                    .unwrap()
                    .iter()
                    .map(|&v| f64::from(v))
                    .sum::<f64>();
            }
            let x = d.bytes().unwrap();
            if !x.is_empty() {
                let s = AlgoState::decode(x).unwrap();
                sum += s.residual.iter().map(|&v| f64::from(v)).sum::<f64>();
            }
        }
        sum
    }

    /// The error-feedback invariant across a restart: over P = 4 ranks and every step,
    /// the gradients' sum equals P times the updates' sum plus the residuals left, with
    /// the state saved after step 3 and restored into fresh reducers. The updates equal an
    /// uninterrupted reducer's bit for bit; without the restore the balance fails (the
    /// residuals are the mass a stopped run would lose).
    #[test]
    fn resume_keeps_gradient_mass() {
        let (p, sizes, n, cut) = (4usize, [600usize, 1400], 7, 3);
        let schemes: Vec<Box<dyn Scheme>> = vec![
            Box::new(CollectiveScheme {
                algo: SparseAlgo::ALL[4],
                density: 0.02,
            }),
            Box::new(CollectiveScheme {
                algo: SparseAlgo::ExDyna { warm_start: false },
                density: 0.02,
            }),
            Box::new(TopkAllgather { density: 0.02 }),
        ];
        for scheme in &schemes {
            for restore in [true, false] {
                let out = ThreadComm::run(p, |comm| -> Result<(f64, f64, f64, bool)> {
                    let r = comm.rank();
                    let grad = |l: usize, s: usize| -> Vec<f32> {
                        (0..sizes[l])
                            .map(|i| ((i * 31 + l * 7 + s * 13 + r * 5) % 41) as f32 * 0.01 - 0.2)
                            .collect()
                    };
                    let whole_comm = comm.split(1, r as u32)?;
                    let plan = || MergePlan::from_starts(2, vec![0, 1]);
                    let mut whole = Reducer::new(whole_comm, &sizes, plan()?, &**scheme)?;
                    let mut red = Reducer::new(comm, &sizes, plan()?, &**scheme)?;
                    let (mut grads, mut updates, mut same) = (0.0f64, 0.0f64, true);
                    for s in 0..n {
                        if s == cut {
                            let state = red.save_state()?;
                            let comm = red.shutdown()?;
                            red = Reducer::new(comm, &sizes, plan()?, &**scheme)?;
                            if restore {
                                red.restore_state(&state)?;
                            }
                        }
                        for l in (0..2).rev() {
                            whole.ready(l, &grad(l, s))?;
                            red.ready(l, &grad(l, s))?;
                        }
                        let (u, w) = (red.finish()?, whole.finish()?);
                        same &= u == w;
                        grads += (0..2).flat_map(|l| grad(l, s)).map(f64::from).sum::<f64>();
                        updates += u.iter().flatten().map(|&v| f64::from(v)).sum::<f64>();
                    }
                    let left = residual_sum(&red.save_state()?);
                    drop(whole.shutdown()?);
                    Ok((grads, updates, left, same))
                })
                .unwrap();
                let grads: f64 = out.iter().map(|o| o.0).sum();
                let updates = out[0].1;
                let left: f64 = out.iter().map(|o| o.2).sum();
                assert!(out.iter().all(|o| o.1 == updates));
                assert!(
                    left.abs() > 1.0,
                    "{}: no residual mass ({left})",
                    scheme.name()
                );
                let balance = grads - (p as f64 * updates + left);
                if restore {
                    assert!(out.iter().all(|o| o.3), "{}: updates differ", scheme.name());
                    assert!(balance.abs() < 1e-3, "{}: {balance}", scheme.name());
                } else {
                    assert!(balance.abs() > 1e-2, "{}: {balance}", scheme.name());
                }
            }
        }
    }
}
