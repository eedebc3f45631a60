//! Token streams for language models: a token-id file reader ([`TokenSource`]) whose
//! samples are fixed-length windows of the stream, the decoder of a window
//! ([`TokenDecoder`]), and the batching of Penn Treebank language modelling
//! ([`stream_batches`]): a rank's shard is cut into `batch` contiguous streams and
//! iteration `t` takes window `t` of every stream, so the windows of one stream follow each
//! other through the epoch (truncated backpropagation through time over `seq_len` steps).
//!
//! File format (little-endian), written by [`write_tokens`]:
//!
//! | bytes | content |
//! | --- | --- |
//! | 0..8 | magic `SDLTOK01` |
//! | 8..12 | `u32` vocabulary size `V` (2..=65,536) |
//! | 12..20 | `u64` token count `N` |
//! | 20.. | `N` × `u16` token ids, each `< V` |
//!
//! A window of `seq_len` inputs carries one more token, the last input's target, so window
//! `i` covers tokens `i·seq_len ..= (i+1)·seq_len` and consecutive windows share one token:
//! the stream is cut, never skipped.

use std::path::{Path, PathBuf};

use crate::decode::{Decoder, Tensor};
use crate::error::{Error, Result};
use crate::shard::{ShardMode, ShardPlan};
use crate::source::{check_index, io_err, read_at, Source};

/// The file's first eight bytes.
pub const TOKEN_MAGIC: &[u8; 8] = b"SDLTOK01";
/// Header bytes before the ids.
pub const TOKEN_HEADER_LEN: usize = 20;

/// Writes `ids` as a token file of vocabulary `vocab`; ids `>= vocab` are rejected.
pub fn write_tokens(path: &Path, vocab: u32, ids: &[u16]) -> Result<()> {
    if let Some(p) = ids.iter().position(|&t| u32::from(t) >= vocab) {
        return Err(Error::Config(format!(
            "token {p} is {} but the vocabulary has {vocab} entries",
            ids[p]
        )));
    }
    let mut bytes = Vec::with_capacity(TOKEN_HEADER_LEN + 2 * ids.len());
    bytes.extend_from_slice(TOKEN_MAGIC);
    bytes.extend_from_slice(&vocab.to_le_bytes());
    bytes.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    for t in ids {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    std::fs::write(path, bytes).map_err(io_err(path))
}

/// A token file as a data set of windows of `seq_len` inputs (plus one target token).
/// Opening checks the header, the length and every id against the vocabulary, so a
/// corrupt file is an [`Error::Format`] before training starts.
#[derive(Debug, Clone)]
pub struct TokenSource {
    path: PathBuf,
    vocab: usize,
    count: usize,
    seq_len: usize,
}

impl TokenSource {
    /// Opens `path` with windows of `seq_len` (≥ 1) inputs.
    pub fn open(path: impl AsRef<Path>, seq_len: usize) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let bad = |reason: String| Error::Format {
            path: path.clone(),
            reason,
        };
        if seq_len == 0 {
            return Err(Error::Config("token windows need seq_len ≥ 1".into()));
        }
        let bytes = std::fs::read(&path).map_err(io_err(&path))?;
        if bytes.len() < TOKEN_HEADER_LEN || &bytes[..8] != TOKEN_MAGIC {
            return Err(bad("not a token file (magic SDLTOK01 expected)".into()));
        }
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&bytes[r]);
            u64::from_le_bytes(b)
        };
        let vocab = word(8..12) as usize;
        let count = word(12..20);
        if !(2..=1 << 16).contains(&vocab) {
            return Err(bad(format!("vocabulary size {vocab} outside 2..=65536")));
        }
        let expected = (TOKEN_HEADER_LEN as u64).saturating_add(count.saturating_mul(2));
        if bytes.len() as u64 != expected {
            return Err(bad(format!(
                "{} bytes for {count} tokens (expected {expected})",
                bytes.len()
            )));
        }
        let count = count as usize;
        for (i, pair) in bytes[TOKEN_HEADER_LEN..].chunks_exact(2).enumerate() {
            let t = u16::from_le_bytes([pair[0], pair[1]]) as usize;
            if t >= vocab {
                return Err(bad(format!(
                    "token {i} is {t}, outside the vocabulary of {vocab}"
                )));
            }
        }
        if count <= seq_len {
            return Err(bad(format!(
                "{count} tokens do not fill one window of {seq_len} inputs and a target"
            )));
        }
        Ok(Self {
            path,
            vocab,
            count,
            seq_len,
        })
    }

    /// Vocabulary size `V` from the header.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Tokens in the file.
    pub fn tokens(&self) -> usize {
        self.count
    }

    /// Inputs per window.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}

impl Source for TokenSource {
    fn len(&self) -> usize {
        (self.count - 1) / self.seq_len
    }

    fn read(&self, index: usize) -> Result<Vec<u8>> {
        check_index(index, self.len())?;
        read_at(
            &self.path,
            (TOKEN_HEADER_LEN + 2 * index * self.seq_len) as u64,
            2 * (self.seq_len + 1),
            index,
            &self.name(index),
        )
    }

    fn name(&self, index: usize) -> String {
        format!("{} window {index}", self.path.display())
    }

    fn label(&self, _index: usize, _raw: &[u8]) -> Option<u32> {
        None
    }

    fn fingerprint(&self) -> String {
        format!(
            "tokens:{}:{}:{}:{}",
            self.path.display(),
            self.count,
            self.vocab,
            self.seq_len
        )
    }
}

/// A window's `seq_len + 1` little-endian `u16` ids as an `f32` tensor of shape
/// `[seq_len + 1]` (ids below 2^16 are exact in `f32`).
#[derive(Debug, Clone, Copy)]
pub struct TokenDecoder {
    /// Inputs per window.
    pub seq_len: usize,
}

impl Decoder for TokenDecoder {
    fn decode(&self, raw: &[u8]) -> Result<Tensor, String> {
        let n = self.seq_len + 1;
        if raw.len() != 2 * n {
            return Err(format!(
                "{} bytes, expected {} for a window of {} inputs",
                raw.len(),
                2 * n,
                self.seq_len
            ));
        }
        Ok(Tensor {
            shape: vec![n],
            data: raw
                .chunks_exact(2)
                .map(|p| f32::from(u16::from_le_bytes([p[0], p[1]])))
                .collect(),
        })
    }
}

/// The windows of each iteration of an epoch for rank `plan.rank()`, Penn Treebank style:
/// the rank's contiguous shard of `n` windows is cut into `batch` streams of
/// `m = n / batch` windows (the last `n mod batch` are left out), and iteration `t` takes
/// window `t` of every stream. The order is the same every epoch: a language model reads
/// its text in order.
pub fn stream_batches(plan: &ShardPlan, batch: usize) -> Result<Vec<Vec<usize>>> {
    if batch == 0 {
        return Err(Error::Config("batch size must be at least 1".into()));
    }
    if plan.mode() != ShardMode::Contiguous {
        return Err(Error::Config("token streams need contiguous shards".into()));
    }
    let shard = plan.indices();
    let m = shard.len() / batch;
    if m == 0 {
        return Err(Error::Config(format!(
            "rank {}'s {} windows do not fill {batch} streams",
            plan.rank(),
            shard.len()
        )));
    }
    Ok((0..m)
        .map(|t| (0..batch).map(|b| shard[b * m + t]).collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("datacache-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    #[test]
    fn windows_cover_the_stream_and_corrupt_files_are_format_errors() {
        let ids: Vec<u16> = (0..101).map(|i| (i * 7 % 50) as u16).collect();
        let p = tmp("a.tok");
        write_tokens(&p, 50, &ids).unwrap();
        let s = TokenSource::open(&p, 10).unwrap();
        assert_eq!((s.len(), s.vocab(), s.tokens()), (10, 50, 101));
        let dec = TokenDecoder { seq_len: 10 };
        for i in 0..s.len() {
            let t = dec.decode(&s.read(i).unwrap()).unwrap();
            let want: Vec<f32> = ids[i * 10..=i * 10 + 10]
                .iter()
                .map(|&v| f32::from(v))
                .collect();
            assert_eq!(t.data, want);
        }
        assert!(matches!(s.read(10), Err(Error::IndexOutOfRange { .. })));
        assert!(write_tokens(&p, 5, &ids).is_err());
        let bytes = std::fs::read(&p).unwrap();
        // Truncated, bad magic, an id outside the vocabulary, a bad vocabulary size.
        let mut cases = vec![bytes[..bytes.len() - 1].to_vec()];
        let mut b = bytes.clone();
        b[0] = b'X';
        cases.push(b);
        let mut b = bytes.clone();
        b[TOKEN_HEADER_LEN + 4] = 60;
        cases.push(b);
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        cases.push(b);
        for (i, c) in cases.into_iter().enumerate() {
            let q = tmp(&format!("bad{i}.tok"));
            std::fs::write(&q, c).unwrap();
            assert!(
                matches!(TokenSource::open(&q, 10), Err(Error::Format { .. })),
                "case {i}"
            );
        }
        assert!(matches!(
            TokenSource::open(tmp("missing.tok"), 10),
            Err(Error::Io { .. })
        ));
        assert!(matches!(
            TokenSource::open(&p, 200),
            Err(Error::Format { .. })
        ));
    }

    #[test]
    fn streams_are_contiguous_and_partition_the_shard() {
        let plan = ShardPlan::new(43, 2, 1, ShardMode::Contiguous).unwrap();
        let b = stream_batches(&plan, 4).unwrap();
        let shard = plan.indices();
        let m = shard.len() / 4;
        assert_eq!(b.len(), m);
        assert!(m > 1);
        for s in 0..4 {
            let stream: Vec<usize> = b.iter().map(|it| it[s]).collect();
            assert!(stream.windows(2).all(|w| w[1] == w[0] + 1), "{stream:?}");
        }
        let mut all: Vec<usize> = b.concat();
        all.sort_unstable();
        assert_eq!(all, shard[..4 * m].to_vec());
        assert!(stream_batches(&plan, 100).is_err());
        assert!(stream_batches(&plan, 0).is_err());
        let strided = ShardPlan::new(43, 2, 1, ShardMode::Strided).unwrap();
        assert!(stream_batches(&strided, 2).is_err());
    }
}
