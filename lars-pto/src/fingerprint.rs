//! A 64-bit FNV-1a fingerprint of what must be identical on every rank (the layer list,
//! the hyper-parameters, a step's scalars). Ranks exchange 8 bytes instead of the lists.

/// An FNV-1a hasher over explicit little-endian encodings, so the fingerprint does not depend
/// on the platform or on `std`'s hasher seeds (ranks may be different processes).
#[derive(Debug, Clone, Copy)]
pub struct Fingerprint(u64);

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint(OFFSET)
    }
}

impl Fingerprint {
    /// A fresh fingerprint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Mixes in raw bytes.
    pub fn bytes(mut self, data: &[u8]) -> Self {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
        self
    }

    /// Mixes in an integer.
    pub fn u64(self, v: u64) -> Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Mixes in a float by its bits (so -0.0 and 0.0 differ, and NaN payloads count).
    pub fn f64(self, v: f64) -> Self {
        self.u64(v.to_bits())
    }

    /// Mixes in a string, length-prefixed so that ("ab","c") and ("a","bc") differ.
    pub fn str(self, s: &str) -> Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }

    /// The 64-bit value.
    pub fn finish(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinguishes_boundaries_and_values() {
        let a = Fingerprint::new().str("ab").str("c").finish();
        let b = Fingerprint::new().str("a").str("bc").finish();
        assert_ne!(a, b);
        assert_ne!(
            Fingerprint::new().f64(0.0).finish(),
            Fingerprint::new().f64(-0.0).finish()
        );
        assert_eq!(
            Fingerprint::new().u64(7).finish(),
            Fingerprint::new().u64(7).finish()
        );
    }
}
