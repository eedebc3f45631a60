//! [`SparseGrad`]: a sparse gradient in coordinate form, the type every selector and every
//! sparse collective produces, with a compact validated wire encoding.
//!
//! Wire format (little-endian): 16-byte header `b"SG"`, value code `u8`, reserved `u8`,
//! `nnz: u32`, `len: u64`; then `nnz` `u32` indices; then `nnz` values. Indices first keeps
//! the value array aligned for every supported type.

use crate::{Error, Result, Value};

const MAGIC: [u8; 2] = *b"SG";
/// Size of the encoded header in bytes.
pub const HEADER_BYTES: usize = 16;

/// A sparse gradient: strictly increasing `u32` indices into a dense vector of length `len`,
/// with one value each.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseGrad<V: Value = f32> {
    indices: Vec<u32>,
    values: Vec<V>,
    len: usize,
}

impl<V: Value> SparseGrad<V> {
    /// An empty sparse gradient of dense length `len`.
    pub fn empty(len: usize) -> Self {
        SparseGrad {
            indices: Vec::new(),
            values: Vec::new(),
            len,
        }
    }

    /// Builds from parts, checking equal lengths, strictly increasing indices and bounds.
    pub fn new(indices: Vec<u32>, values: Vec<V>, len: usize) -> Result<Self> {
        check_len(len)?;
        if indices.len() != values.len() {
            return Err(Error::LengthMismatch {
                what: "values",
                got: values.len(),
                expected: indices.len(),
            });
        }
        validate_indices(&indices, len)?;
        Ok(SparseGrad {
            indices,
            values,
            len,
        })
    }

    /// Builds from parts the caller guarantees valid (strictly increasing, `< len`, equal
    /// lengths). Checked in debug builds.
    pub fn from_parts_unchecked(indices: Vec<u32>, values: Vec<V>, len: usize) -> Self {
        debug_assert_eq!(indices.len(), values.len());
        debug_assert!(validate_indices(&indices, len).is_ok());
        SparseGrad {
            indices,
            values,
            len,
        }
    }

    /// Builds from (index, value) pairs in any order; duplicate indices are summed in `f32`.
    pub fn from_pairs(mut pairs: Vec<(u32, f32)>, len: usize) -> Result<Self> {
        check_len(len)?;
        pairs.sort_unstable_by_key(|p| p.0);
        let mut indices: Vec<u32> = Vec::with_capacity(pairs.len());
        let mut sums: Vec<f32> = Vec::with_capacity(pairs.len());
        for (i, v) in pairs {
            if i as usize >= len {
                return Err(Error::InvalidIndices(format!("index {i} ≥ length {len}")));
            }
            if indices.last() == Some(&i) {
                *sums.last_mut().expect("same length as indices") += v;
            } else {
                indices.push(i);
                sums.push(v);
            }
        }
        let values = sums.into_iter().map(V::from_f32).collect();
        Ok(SparseGrad {
            indices,
            values,
            len,
        })
    }

    /// The non-zero entries of a dense slice.
    pub fn from_dense(dense: &[f32]) -> Result<Self> {
        check_len(dense.len())?;
        let mut indices = Vec::new();
        let mut values = Vec::new();
        for (i, &x) in dense.iter().enumerate() {
            if x != 0.0 {
                indices.push(i as u32);
                values.push(V::from_f32(x));
            }
        }
        Ok(SparseGrad {
            indices,
            values,
            len: dense.len(),
        })
    }

    /// The dense vector this represents, in `f32`.
    pub fn to_dense(&self) -> Vec<f32> {
        let mut d = vec![0.0f32; self.len];
        for (&i, &v) in self.indices.iter().zip(&self.values) {
            d[i as usize] = v.to_f32();
        }
        d
    }

    /// Adds this sparse gradient into `dense` (which must have length `len`).
    pub fn scatter_add_into(&self, dense: &mut [f32]) -> Result<()> {
        if dense.len() != self.len {
            return Err(Error::LengthMismatch {
                what: "dense buffer",
                got: dense.len(),
                expected: self.len,
            });
        }
        for (&i, &v) in self.indices.iter().zip(&self.values) {
            dense[i as usize] += v.to_f32();
        }
        Ok(())
    }

    /// Strictly increasing indices.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    /// Values, one per index.
    pub fn values(&self) -> &[V] {
        &self.values
    }

    /// Mutable values (indices stay fixed, so the invariants hold).
    pub fn values_mut(&mut self) -> &mut [V] {
        &mut self.values
    }

    /// Dense length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the dense length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// Fraction of the dense length that is stored (0 for an empty vector).
    pub fn density(&self) -> f64 {
        if self.len == 0 {
            0.0
        } else {
            self.nnz() as f64 / self.len as f64
        }
    }

    /// Takes the parts apart: (indices, values, dense length).
    pub fn into_parts(self) -> (Vec<u32>, Vec<V>, usize) {
        (self.indices, self.values, self.len)
    }

    /// Converts values to another element type (rounding to nearest).
    pub fn cast<W: Value>(&self) -> SparseGrad<W> {
        SparseGrad {
            indices: self.indices.clone(),
            values: self
                .values
                .iter()
                .map(|v| W::from_f32(v.to_f32()))
                .collect(),
            len: self.len,
        }
    }

    /// Size of [`encode`](Self::encode)'s output in bytes.
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES + self.nnz() * (4 + std::mem::size_of::<V>())
    }

    /// The compact wire encoding (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    /// Appends the wire encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(V::CODE);
        out.push(0);
        out.extend_from_slice(&(self.nnz() as u32).to_le_bytes());
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        out.extend_from_slice(bytemuck::cast_slice(&self.indices));
        out.extend_from_slice(bytemuck::cast_slice(&self.values));
    }

    /// Decodes and validates a wire message: header, type, lengths, order and bounds.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let (sg, used) = Self::decode_prefix(bytes)?;
        if used != bytes.len() {
            return Err(Error::Decode(format!(
                "{} trailing bytes after the message",
                bytes.len() - used
            )));
        }
        Ok(sg)
    }

    /// Decodes one message from the front of `bytes`; returns it and the bytes it used, so
    /// that several messages can be concatenated.
    pub fn decode_prefix(bytes: &[u8]) -> Result<(Self, usize)> {
        if bytes.len() < HEADER_BYTES {
            return Err(Error::Decode(format!(
                "{} bytes, shorter than the {HEADER_BYTES}-byte header",
                bytes.len()
            )));
        }
        if bytes[0..2] != MAGIC {
            return Err(Error::Decode("bad magic".into()));
        }
        if bytes[2] != V::CODE {
            return Err(Error::Decode(format!(
                "value type code {} but decoding as {} (code {})",
                bytes[2],
                V::NAME,
                V::CODE
            )));
        }
        let nnz = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
        let len64 = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let len = usize::try_from(len64).map_err(|_| Error::TooLong(usize::MAX))?;
        check_len(len)?;
        let vsize = std::mem::size_of::<V>();
        let need = nnz
            .checked_mul(4 + vsize)
            .and_then(|b| b.checked_add(HEADER_BYTES))
            .ok_or_else(|| Error::Decode(format!("nnz {nnz} overflows")))?;
        if bytes.len() < need {
            return Err(Error::Decode(format!(
                "truncated: {} bytes, header says {need}",
                bytes.len()
            )));
        }
        let idx_end = HEADER_BYTES + 4 * nnz;
        let indices: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes[HEADER_BYTES..idx_end]);
        let values: Vec<V> = bytemuck::pod_collect_to_vec(&bytes[idx_end..need]);
        validate_indices(&indices, len)?;
        Ok((
            SparseGrad {
                indices,
                values,
                len,
            },
            need,
        ))
    }
}

fn check_len(len: usize) -> Result<()> {
    if len as u64 > u32::MAX as u64 + 1 {
        Err(Error::TooLong(len))
    } else {
        Ok(())
    }
}

/// Checks that `indices` is strictly increasing and every index is `< len`.
pub fn validate_indices(indices: &[u32], len: usize) -> Result<()> {
    for (pos, w) in indices.windows(2).enumerate() {
        if w[0] >= w[1] {
            return Err(Error::InvalidIndices(format!(
                "not strictly increasing at position {}: {} then {}",
                pos + 1,
                w[0],
                w[1]
            )));
        }
    }
    if let Some(&last) = indices.last() {
        if last as usize >= len {
            return Err(Error::InvalidIndices(format!(
                "index {last} ≥ dense length {len}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn round_trips_every_type() {
        let sg = SparseGrad::<f32>::new(vec![1, 5, 9], vec![1.0, -2.5, 3.0], 10).unwrap();
        assert_eq!(SparseGrad::<f32>::decode(&sg.encode()).unwrap(), sg);
        let h: SparseGrad<f16> = sg.cast();
        assert_eq!(SparseGrad::<f16>::decode(&h.encode()).unwrap(), h);
        let b: SparseGrad<bf16> = sg.cast();
        assert_eq!(SparseGrad::<bf16>::decode(&b.encode()).unwrap(), b);
        assert_eq!(sg.to_dense()[5], -2.5);
        let e = SparseGrad::<f32>::empty(0);
        assert_eq!(SparseGrad::<f32>::decode(&e.encode()).unwrap(), e);
    }

    #[test]
    fn decoder_rejects_bad_messages() {
        let sg = SparseGrad::<f32>::new(vec![1, 5], vec![1.0, 2.0], 6).unwrap();
        let enc = sg.encode();
        assert!(SparseGrad::<f32>::decode(&enc[..enc.len() - 1]).is_err());
        assert!(SparseGrad::<f16>::decode(&enc).is_err());
        let mut unordered = enc.clone();
        unordered[16..20].copy_from_slice(&7u32.to_le_bytes());
        assert!(matches!(
            SparseGrad::<f32>::decode(&unordered),
            Err(Error::InvalidIndices(_))
        ));
        let mut oob = enc.clone();
        oob[8..16].copy_from_slice(&5u64.to_le_bytes());
        assert!(SparseGrad::<f32>::decode(&oob).is_err());
        assert!(SparseGrad::<f32>::decode(&[0u8; 3]).is_err());
    }

    #[test]
    fn new_validates() {
        assert!(SparseGrad::<f32>::new(vec![3, 3], vec![1.0, 1.0], 5).is_err());
        assert!(SparseGrad::<f32>::new(vec![5], vec![1.0], 5).is_err());
        assert!(SparseGrad::<f32>::new(vec![1], vec![], 5).is_err());
        let p = SparseGrad::<f32>::from_pairs(vec![(4, 1.0), (1, 2.0), (4, 0.5)], 5).unwrap();
        assert_eq!(p.indices(), &[1, 4]);
        assert_eq!(p.values(), &[2.0, 1.5]);
    }
}
