//! Where samples come from: the slow level of Fig. 5 (MSTopK/HiTopKComm, Shi et al., MLSys
//! 2021, §4.1), usually a networked file system or an object store.
//!
//! A [`Source`] hands out the raw bytes of one sample by index. Readers for the three local
//! formats people start with ([`FolderSource`], [`Cifar10Source`], [`MnistSource`]); remote
//! data sets are [`crate::remote::ObjectStoreSource`].

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A data set of samples addressed by index `0..len()`.
///
/// Implementations are shared by the prefetch workers, so they take `&self` and must be
/// `Send + Sync`. Every method that takes an index must reject one `>= len()` with
/// [`Error::IndexOutOfRange`] (or return a neutral value for `name` and `label`).
pub trait Source: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    /// True when the data set has no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw (undecoded) bytes of sample `index`, exactly as the disk cache stores them.
    fn read(&self, index: usize) -> Result<Vec<u8>>;

    /// A human-readable name for sample `index` (its file, or file and record), for errors.
    fn name(&self, index: usize) -> String;

    /// The class label of sample `index`; `raw` is what [`Source::read`] returned, for
    /// formats that store the label inside the record (CIFAR-10).
    fn label(&self, index: usize, raw: &[u8]) -> Option<u32>;

    /// A string that identifies this data set (paths and sizes); the disk cache keeps the
    /// entries of different data sets apart by it, so two sources must not share one.
    fn fingerprint(&self) -> String;
}

/// Forwards [`Source`] through a smart pointer, so `Arc<dyn Source>` and
/// `Box<dyn Source>` are sources themselves.
macro_rules! forward_source {
    ($($ptr:ident),*) => {$(
        impl<S: Source + ?Sized> Source for $ptr<S> {
            fn len(&self) -> usize {
                (**self).len()
            }
            fn read(&self, index: usize) -> Result<Vec<u8>> {
                (**self).read(index)
            }
            fn name(&self, index: usize) -> String {
                (**self).name(index)
            }
            fn label(&self, index: usize, raw: &[u8]) -> Option<u32> {
                (**self).label(index, raw)
            }
            fn fingerprint(&self) -> String {
                (**self).fingerprint()
            }
        }
    )*};
}
forward_source!(Arc, Box);

pub(crate) fn check_index(index: usize, len: usize) -> Result<()> {
    if index < len {
        Ok(())
    } else {
        Err(Error::IndexOutOfRange { index, len })
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads `len` bytes at `offset` of `path`, opening the file per request as an NFS client
/// would; errors name the sample.
pub(crate) fn read_at(
    path: &Path,
    offset: u64,
    len: usize,
    index: usize,
    name: &str,
) -> Result<Vec<u8>> {
    let wrap = |source| Error::Read {
        index,
        name: name.to_string(),
        source,
    };
    let mut f = File::open(path).map_err(wrap)?;
    f.seek(SeekFrom::Start(offset)).map_err(wrap)?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).map_err(wrap)?;
    Ok(buf)
}

// ---------------------------------------------------------------------------------------------

/// A directory with one sub-folder per class and one file per sample, like torchvision's
/// `ImageFolder`: `root/cat/001.png`, `root/dog/xyz.jpg`.
///
/// Classes are the sub-folder names in sorted order (label = position); samples are the
/// files in each class folder (recursively) in sorted path order, so the index of a sample
/// is the same on every machine. Hidden files (starting with `.`) are ignored.
#[derive(Debug, Clone)]
pub struct FolderSource {
    root: PathBuf,
    classes: Vec<String>,
    files: Vec<(PathBuf, u32)>,
}

impl FolderSource {
    /// Scans `root`, taking every non-hidden file under each class folder.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        Self::open_filtered(root, &[])
    }

    /// Scans `root`, taking only files whose extension (case-insensitive) is in
    /// `extensions` (all files when empty), e.g. `&["png", "jpg", "jpeg"]`.
    pub fn open_filtered(root: impl AsRef<Path>, extensions: &[&str]) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let mut classes = Vec::new();
        for entry in std::fs::read_dir(&root).map_err(io_err(&root))? {
            let entry = entry.map_err(io_err(&root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if entry.file_type().map_err(io_err(&root))?.is_dir() {
                classes.push(name);
            }
        }
        classes.sort();
        let mut files = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let mut found = Vec::new();
            walk(&root.join(class), extensions, &mut found)?;
            found.sort();
            let label = u32::try_from(label)
                .map_err(|_| Error::Config("more than u32::MAX classes".into()))?;
            files.extend(found.into_iter().map(|p| (p, label)));
        }
        Ok(Self {
            root,
            classes,
            files,
        })
    }

    /// The class names, in label order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The file of sample `index`, if in range.
    pub fn path(&self, index: usize) -> Option<&Path> {
        self.files.get(index).map(|(p, _)| p.as_path())
    }
}

fn walk(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let ft = entry.file_type().map_err(io_err(&path))?;
        if ft.is_dir() {
            walk(&path, extensions, out)?;
        } else {
            let ok = extensions.is_empty()
                || path
                    .extension()
                    .map(|e| e.to_string_lossy().to_ascii_lowercase())
                    .is_some_and(|e| extensions.iter().any(|x| x.eq_ignore_ascii_case(&e)));
            if ok {
                out.push(path);
            }
        }
    }
    Ok(())
}

impl Source for FolderSource {
    fn len(&self) -> usize {
        self.files.len()
    }

    fn read(&self, index: usize) -> Result<Vec<u8>> {
        check_index(index, self.files.len())?;
        let path = &self.files[index].0;
        std::fs::read(path).map_err(|source| Error::Read {
            index,
            name: path.display().to_string(),
            source,
        })
    }

    fn name(&self, index: usize) -> String {
        match self.files.get(index) {
            Some((p, _)) => p.display().to_string(),
            None => format!("#{index} (out of range)"),
        }
    }

    fn label(&self, index: usize, _raw: &[u8]) -> Option<u32> {
        self.files.get(index).map(|(_, l)| *l)
    }

    fn fingerprint(&self) -> String {
        format!(
            "folder:{}:{}:{}",
            self.root.display(),
            self.classes.len(),
            self.files.len()
        )
    }
}

// ---------------------------------------------------------------------------------------------

/// Bytes per CIFAR-10 record: one label byte then 3×32×32 pixel bytes (red, green, blue
/// planes, row-major), as in the `data_batch_*.bin` files of the binary release.
pub const CIFAR10_RECORD: usize = 1 + CIFAR10_PIXELS;
/// Pixel bytes per CIFAR-10 image (3 channels × 32 × 32).
pub const CIFAR10_PIXELS: usize = 3 * 32 * 32;

/// CIFAR-10 in its binary release: one or more batch files of fixed-size records.
///
/// The raw bytes of a sample are its whole 3073-byte record (label byte included); use
/// [`crate::decode::Cifar10Decoder`] to turn them into a `[3, 32, 32]` tensor.
#[derive(Debug, Clone)]
pub struct Cifar10Source {
    /// (path, first global index, records)
    files: Vec<(PathBuf, usize, usize)>,
    len: usize,
}

impl Cifar10Source {
    /// Opens batch files in the given order (e.g. `data_batch_1.bin` … `data_batch_5.bin`);
    /// each length must be a whole number of records.
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Self> {
        let mut files = Vec::new();
        let mut len = 0usize;
        for p in paths {
            let p = p.as_ref().to_path_buf();
            let size = std::fs::metadata(&p).map_err(io_err(&p))?.len();
            if size % CIFAR10_RECORD as u64 != 0 {
                return Err(Error::Format {
                    path: p,
                    reason: format!(
                        "length {size} is not a multiple of the {CIFAR10_RECORD}-byte record"
                    ),
                });
            }
            let n = usize::try_from(size / CIFAR10_RECORD as u64).map_err(|_| Error::Format {
                path: p.clone(),
                reason: "too many records".into(),
            })?;
            files.push((p, len, n));
            len += n;
        }
        Ok(Self { files, len })
    }

    fn locate(&self, index: usize) -> Option<(&Path, usize)> {
        // Few files: a linear scan is as fast as a binary search and obviously right.
        self.files
            .iter()
            .find(|(_, first, n)| index >= *first && index < first + n)
            .map(|(p, first, _)| (p.as_path(), index - first))
    }
}

impl Source for Cifar10Source {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, index: usize) -> Result<Vec<u8>> {
        check_index(index, self.len)?;
        let (path, rec) = self.locate(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.len,
        })?;
        let name = self.name(index);
        read_at(
            path,
            (rec * CIFAR10_RECORD) as u64,
            CIFAR10_RECORD,
            index,
            &name,
        )
    }

    fn name(&self, index: usize) -> String {
        match self.locate(index) {
            Some((p, rec)) => format!("{} record {rec}", p.display()),
            None => format!("#{index} (out of range)"),
        }
    }

    fn label(&self, _index: usize, raw: &[u8]) -> Option<u32> {
        raw.first().map(|&b| u32::from(b))
    }

    fn fingerprint(&self) -> String {
        let mut s = String::from("cifar10");
        for (p, _, n) in &self.files {
            s.push_str(&format!(":{}={n}", p.display()));
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------

/// Parsed header of an IDX file holding unsigned bytes (type code 0x08).
#[derive(Debug, Clone, PartialEq, Eq)]
struct IdxHeader {
    dims: Vec<usize>,
    header_len: usize,
}

fn read_idx_header(path: &Path) -> Result<IdxHeader> {
    let bad = |reason: String| Error::Format {
        path: path.to_path_buf(),
        reason,
    };
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic)
        .map_err(|_| bad("shorter than the 4-byte IDX magic".into()))?;
    if magic[0] != 0 || magic[1] != 0 {
        return Err(bad(format!("bad IDX magic {magic:02x?}")));
    }
    if magic[2] != 0x08 {
        return Err(bad(format!(
            "IDX type 0x{:02x} is not unsigned byte (0x08)",
            magic[2]
        )));
    }
    let ndim = usize::from(magic[3]);
    if ndim == 0 {
        return Err(bad("IDX file with zero dimensions".into()));
    }
    let mut dims = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        let mut d = [0u8; 4];
        f.read_exact(&mut d)
            .map_err(|_| bad("truncated IDX header".into()))?;
        dims.push(u32::from_be_bytes(d) as usize);
    }
    let header_len = 4 + 4 * ndim;
    let payload = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("IDX dimensions overflow".into()))?;
    let size = std::fs::metadata(path).map_err(io_err(path))?.len();
    if size != (header_len + payload) as u64 {
        return Err(bad(format!(
            "length {size} does not match header dims {dims:?} ({} bytes expected)",
            header_len + payload
        )));
    }
    Ok(IdxHeader { dims, header_len })
}

/// MNIST (or Fashion-MNIST, or any unsigned-byte IDX pair): an images file
/// (`train-images-idx3-ubyte`, magic 0x00000803) and an optional labels file
/// (`train-labels-idx1-ubyte`, magic 0x00000801).
///
/// The raw bytes of a sample are its `rows × cols` pixels; use
/// [`crate::decode::U8Decoder`] with shape `[1, rows, cols]` to decode them.
#[derive(Debug, Clone)]
pub struct MnistSource {
    images: PathBuf,
    header_len: usize,
    sample_dims: Vec<usize>,
    sample_bytes: usize,
    len: usize,
    labels: Option<Vec<u8>>,
}

impl MnistSource {
    /// Opens an images file and, if given, its labels file (read into memory: one byte per
    /// sample). Lengths and magics are checked.
    pub fn open(images: impl AsRef<Path>, labels: Option<&Path>) -> Result<Self> {
        let images = images.as_ref().to_path_buf();
        let h = read_idx_header(&images)?;
        let len = h.dims[0];
        let sample_dims = h.dims[1..].to_vec();
        let sample_bytes = sample_dims.iter().product::<usize>();
        let labels = match labels {
            None => None,
            Some(lp) => {
                let lh = read_idx_header(lp)?;
                if lh.dims.len() != 1 || lh.dims[0] != len {
                    return Err(Error::Format {
                        path: lp.to_path_buf(),
                        reason: format!(
                            "labels file has dims {:?}, expected [{len}] to match the images",
                            lh.dims
                        ),
                    });
                }
                let all = std::fs::read(lp).map_err(io_err(lp))?;
                Some(all[lh.header_len..].to_vec())
            }
        };
        Ok(Self {
            images,
            header_len: h.header_len,
            sample_dims,
            sample_bytes,
            len,
            labels,
        })
    }

    /// The shape of one sample (e.g. `[28, 28]`).
    pub fn sample_dims(&self) -> &[usize] {
        &self.sample_dims
    }
}

impl Source for MnistSource {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, index: usize) -> Result<Vec<u8>> {
        check_index(index, self.len)?;
        let name = self.name(index);
        read_at(
            &self.images,
            (self.header_len + index * self.sample_bytes) as u64,
            self.sample_bytes,
            index,
            &name,
        )
    }

    fn name(&self, index: usize) -> String {
        format!("{} image {index}", self.images.display())
    }

    fn label(&self, index: usize, _raw: &[u8]) -> Option<u32> {
        self.labels
            .as_ref()
            .and_then(|l| l.get(index))
            .map(|&b| u32::from(b))
    }

    fn fingerprint(&self) -> String {
        format!(
            "mnist:{}:{}:{:?}",
            self.images.display(),
            self.len,
            self.sample_dims
        )
    }
}

// ---------------------------------------------------------------------------------------------

/// An in-memory source of byte vectors; handy for tests and for data generated on the fly.
#[derive(Debug, Clone, Default)]
pub struct VecSource {
    samples: Vec<(Vec<u8>, Option<u32>)>,
    id: String,
}

impl VecSource {
    /// `id` names the data set in the disk cache (see [`Source::fingerprint`]).
    pub fn new(id: impl Into<String>, samples: Vec<(Vec<u8>, Option<u32>)>) -> Self {
        Self {
            samples,
            id: id.into(),
        }
    }
}

impl Source for VecSource {
    fn len(&self) -> usize {
        self.samples.len()
    }
    fn read(&self, index: usize) -> Result<Vec<u8>> {
        check_index(index, self.samples.len())?;
        Ok(self.samples[index].0.clone())
    }
    fn name(&self, index: usize) -> String {
        format!("{}[{index}]", self.id)
    }
    fn label(&self, index: usize, _raw: &[u8]) -> Option<u32> {
        self.samples.get(index).and_then(|s| s.1)
    }
    fn fingerprint(&self) -> String {
        format!("vec:{}:{}", self.id, self.samples.len())
    }
}
