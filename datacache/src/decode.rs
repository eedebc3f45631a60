//! Turning raw sample bytes into the `f32` tensors a model eats (the "decode and
//! pre-process" step of DataCache, MSTopK/HiTopKComm (Shi et al., MLSys 2021), §4.1, whose
//! output the memory level keeps).

use crate::source::{CIFAR10_PIXELS, CIFAR10_RECORD};

/// A dense `f32` tensor in row-major order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tensor {
    /// Dimensions, outermost first (e.g. `[3, 32, 32]` for CHW).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor from a shape and values; fails when the lengths disagree.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self, String> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(format!(
                "shape {shape:?} holds {n} values but {} were given",
                data.len()
            ));
        }
        Ok(Self { shape, data })
    }

    /// Heap bytes held, the weight of the tensor in the memory cache.
    pub fn nbytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
            + self.shape.len() * std::mem::size_of::<usize>()
    }
}

/// A user-supplied decode function: raw bytes from the source → tensor.
///
/// Any `Fn(&[u8]) -> Result<Tensor, String> + Send + Sync` closure is a decoder. The error
/// string is wrapped into [`crate::Error::Decode`] with the sample's index and name.
pub trait Decoder: Send + Sync {
    /// Decodes one sample.
    fn decode(&self, raw: &[u8]) -> Result<Tensor, String>;
}

impl<F> Decoder for F
where
    F: Fn(&[u8]) -> Result<Tensor, String> + Send + Sync,
{
    fn decode(&self, raw: &[u8]) -> Result<Tensor, String> {
        self(raw)
    }
}

/// Unsigned bytes to `f32` scaled by `1/255` into a fixed shape (MNIST, raw pixel dumps).
#[derive(Debug, Clone)]
pub struct U8Decoder {
    shape: Vec<usize>,
}

impl U8Decoder {
    /// Each sample must hold exactly `shape.iter().product()` bytes.
    pub fn new(shape: Vec<usize>) -> Self {
        Self { shape }
    }
}

impl Decoder for U8Decoder {
    fn decode(&self, raw: &[u8]) -> Result<Tensor, String> {
        let n: usize = self.shape.iter().product();
        if raw.len() != n {
            return Err(format!(
                "{} bytes, expected {n} for shape {:?}",
                raw.len(),
                self.shape
            ));
        }
        Ok(Tensor {
            shape: self.shape.clone(),
            data: raw.iter().map(|&b| f32::from(b) / 255.0).collect(),
        })
    }
}

/// A CIFAR-10 record (label byte + 3072 pixel bytes) to a `[3, 32, 32]` tensor in `[0, 1]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cifar10Decoder;

impl Decoder for Cifar10Decoder {
    fn decode(&self, raw: &[u8]) -> Result<Tensor, String> {
        if raw.len() != CIFAR10_RECORD {
            return Err(format!(
                "CIFAR-10 record of {} bytes, expected {CIFAR10_RECORD}",
                raw.len()
            ));
        }
        let px = &raw[1..];
        debug_assert_eq!(px.len(), CIFAR10_PIXELS);
        Ok(Tensor {
            shape: vec![3, 32, 32],
            data: px.iter().map(|&b| f32::from(b) / 255.0).collect(),
        })
    }
}

/// Colour layout an [`ImageDecoder`] produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Channels {
    /// Three planes, red, green, blue.
    #[default]
    Rgb,
    /// One luminance plane.
    Gray,
}

/// PNG or JPEG bytes to a CHW tensor in `[0, 1]` through the `image` crate, optionally
/// resized (triangle filter) to a fixed size so that batches stack.
#[derive(Debug, Clone, Default)]
pub struct ImageDecoder {
    /// `(width, height)` to resize to; `None` keeps the file's size.
    pub resize: Option<(u32, u32)>,
    /// Colour layout of the output.
    pub channels: Channels,
}

impl ImageDecoder {
    /// RGB output resized to `width × height`.
    pub fn rgb(width: u32, height: u32) -> Self {
        Self {
            resize: Some((width, height)),
            channels: Channels::Rgb,
        }
    }
}

impl Decoder for ImageDecoder {
    fn decode(&self, raw: &[u8]) -> Result<Tensor, String> {
        let mut img = image::load_from_memory(raw).map_err(|e| e.to_string())?;
        if let Some((w, h)) = self.resize {
            if w == 0 || h == 0 {
                return Err(format!("cannot resize to {w}×{h}"));
            }
            if img.width() != w || img.height() != h {
                img = img.resize_exact(w, h, image::imageops::FilterType::Triangle);
            }
        }
        let (w, h) = (img.width() as usize, img.height() as usize);
        match self.channels {
            Channels::Gray => {
                let g = img.to_luma8();
                Ok(Tensor {
                    shape: vec![1, h, w],
                    data: g.as_raw().iter().map(|&b| f32::from(b) / 255.0).collect(),
                })
            }
            Channels::Rgb => {
                let rgb = img.to_rgb8();
                let raw = rgb.as_raw();
                let mut data = vec![0f32; 3 * h * w];
                // HWC interleaved → CHW planes.
                for (p, px) in raw.chunks_exact(3).enumerate() {
                    for c in 0..3 {
                        data[c * h * w + p] = f32::from(px[c]) / 255.0;
                    }
                }
                Ok(Tensor {
                    shape: vec![3, h, w],
                    data,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u8_decoder_checks_length() {
        let d = U8Decoder::new(vec![2, 2]);
        assert_eq!(
            d.decode(&[0, 255, 0, 255]).unwrap().data,
            vec![0.0, 1.0, 0.0, 1.0]
        );
        assert!(d.decode(&[0; 3]).is_err());
    }

    #[test]
    fn cifar_decoder_drops_label_byte() {
        let mut rec = vec![7u8];
        rec.extend((0..CIFAR10_PIXELS).map(|i| (i % 256) as u8));
        let t = Cifar10Decoder.decode(&rec).unwrap();
        assert_eq!(t.shape, vec![3, 32, 32]);
        assert_eq!(t.data[1], 1.0 / 255.0);
        assert!(Cifar10Decoder.decode(&rec[1..]).is_err());
    }

    #[test]
    fn image_decoder_png_round_trip_and_garbage() {
        let (w, h) = (4u32, 3u32);
        let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 256) as u8).collect();
        let png = crate::formats::encode_png(w, h, &px).unwrap();
        let t = ImageDecoder::default().decode(&png).unwrap();
        assert_eq!(t.shape, vec![3, 3, 4]);
        // pixel (0,1) green channel
        assert_eq!(t.data[(h * w) as usize + 1], f32::from(px[4]) / 255.0);
        let r = ImageDecoder::rgb(2, 2).decode(&png).unwrap();
        assert_eq!(r.shape, vec![3, 2, 2]);
        assert!(ImageDecoder::default().decode(b"not an image").is_err());
    }

    #[test]
    fn image_decoder_reads_jpeg() {
        let img = image::RgbImage::from_pixel(8, 8, image::Rgb([200, 100, 50]));
        let mut jpg = std::io::Cursor::new(Vec::new());
        img.write_to(&mut jpg, image::ImageFormat::Jpeg).unwrap();
        let d = ImageDecoder {
            resize: None,
            channels: Channels::Gray,
        };
        let t = d.decode(jpg.get_ref()).unwrap();
        assert_eq!(t.shape, vec![1, 8, 8]);
        let rgb = ImageDecoder::default().decode(jpg.get_ref()).unwrap();
        assert!((rgb.data[0] - 200.0 / 255.0).abs() < 0.05); // lossy, but close
    }

    #[test]
    fn closures_are_decoders() {
        let d = |raw: &[u8]| Tensor::new(vec![raw.len()], raw.iter().map(|&b| b as f32).collect());
        assert_eq!(d.decode(&[1, 2]).unwrap().data, vec![1.0, 2.0]);
    }
}
