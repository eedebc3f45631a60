//! Writers for the on-disk formats the sources read, so that tests, benches and examples
//! can make real CIFAR-10 batches, MNIST IDX files and image folders of any size.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::source::CIFAR10_PIXELS;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a CIFAR-10 binary batch: per record one label byte then 3072 pixel bytes.
pub fn write_cifar10_batch(path: &Path, records: &[(u8, Vec<u8>)]) -> Result<()> {
    let mut out = Vec::with_capacity(records.len() * (1 + CIFAR10_PIXELS));
    for (label, px) in records {
        if px.len() != CIFAR10_PIXELS {
            return Err(Error::Config(format!(
                "CIFAR-10 image of {} bytes, expected {CIFAR10_PIXELS}",
                px.len()
            )));
        }
        out.push(*label);
        out.extend_from_slice(px);
    }
    std::fs::write(path, out).map_err(io(path))
}

/// Writes an unsigned-byte IDX file (MNIST format): magic `00 00 08 ndim`, big-endian
/// `u32` dimensions, then the bytes.
pub fn write_idx_u8(path: &Path, dims: &[u32], data: &[u8]) -> Result<()> {
    let n: usize = dims.iter().map(|&d| d as usize).product();
    if n != data.len() || dims.is_empty() || dims.len() > 255 {
        return Err(Error::Config(format!(
            "IDX dims {dims:?} do not match {} bytes",
            data.len()
        )));
    }
    let mut f = std::fs::File::create(path).map_err(io(path))?;
    let mut header = vec![0u8, 0, 0x08, dims.len() as u8];
    for d in dims {
        header.extend_from_slice(&d.to_be_bytes());
    }
    f.write_all(&header).map_err(io(path))?;
    f.write_all(data).map_err(io(path))
}

/// Writes MNIST-style images (`n × rows × cols`, magic 0x00000803) and labels (magic
/// 0x00000801) files.
pub fn write_mnist(
    images: &Path,
    labels: &Path,
    rows: u32,
    cols: u32,
    pixels: &[u8],
    label_bytes: &[u8],
) -> Result<()> {
    let n = u32::try_from(label_bytes.len())
        .map_err(|_| Error::Config("too many MNIST samples".into()))?;
    write_idx_u8(images, &[n, rows, cols], pixels)?;
    write_idx_u8(labels, &[n], label_bytes)
}

/// Encodes interleaved RGB pixels (`width × height × 3` bytes) as a PNG file in memory.
pub fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>> {
    let img = image::RgbImage::from_raw(width, height, rgb.to_vec()).ok_or_else(|| {
        Error::Config(format!(
            "{} bytes is not a {width}×{height} RGB image",
            rgb.len()
        ))
    })?;
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .map_err(|e| Error::Config(format!("PNG encoding failed: {e}")))?;
    Ok(out.into_inner())
}

/// Writes interleaved RGB pixels as a PNG file.
pub fn write_png(path: &Path, width: u32, height: u32, rgb: &[u8]) -> Result<()> {
    let bytes = encode_png(width, height, rgb)?;
    std::fs::write(path, bytes).map_err(io(path))
}
