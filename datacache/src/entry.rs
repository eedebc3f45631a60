//! The on-disk format of one cache entry, and its decoder.
//!
//! ```text
//! offset  size  field
//!      0     4  magic  b"DCEN"
//!      4     2  format version (2), little-endian
//!      6     2  flags (0; any other value is rejected)
//!      8     8  key hash: FNV-1a 64 of the namespace, a 0xff byte, the sample index (u64 LE)
//!     16     8  payload length in bytes
//!     24     4  CRC-32 of the payload
//!     28     4  CRC-32 of bytes 0..28 (the header itself)
//!     32     …  payload
//! ```
//!
//! The header checksum rejects a damaged length or key before they are used; the payload
//! checksum rejects torn or flipped payload bytes; the key hash rejects an entry that sits
//! under another sample's (or another data set's) name. [`decode`] never allocates: it
//! borrows the payload from its input, so no length field can make it reserve memory, and it
//! answers every input with either a valid [`Entry`] or an [`EntryError`]. It is the fuzz
//! target for the format.

use std::fmt;

/// Bytes of the entry header.
pub const HEADER_LEN: usize = 32;
/// The first four bytes of every entry.
pub const MAGIC: [u8; 4] = *b"DCEN";
/// The format version this crate writes and reads.
pub const VERSION: u16 = 2;

/// Identifies the sample an entry holds; stored in the header and checked on every read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub u64);

impl KeyHash {
    /// The key of sample `index` in data-set namespace `namespace` (FNV-1a 64: stable across
    /// runs, platforms and crate versions, unlike `std`'s randomly seeded hasher).
    pub fn of(namespace: &str, index: u64) -> Self {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0100_0000_01b3;
        let mut h = OFFSET;
        for &b in namespace
            .as_bytes()
            .iter()
            .chain(&[0xff])
            .chain(&index.to_le_bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
        Self(h)
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A well-formed entry, borrowing its payload from the decoded bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The key the writer stored.
    pub key: KeyHash,
    /// The sample's raw bytes, checksum verified.
    pub payload: &'a [u8],
}

/// Why bytes are not a valid entry. A reader treats every variant the same way (discard the
/// file, fetch the sample again); the variants say what was wrong, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Fewer bytes than a header (a file cut short, or empty).
    #[error("{len} bytes is shorter than the {HEADER_LEN}-byte entry header")]
    TooShort {
        /// Bytes present.
        len: usize,
    },
    /// The first four bytes are not [`MAGIC`].
    #[error("bad magic {found:02x?}")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// The header's checksum does not match (damaged header).
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// A version this crate cannot read (an older or newer writer).
    #[error("entry format version {found}, this reader understands {VERSION}")]
    Version {
        /// The version found.
        found: u16,
    },
    /// Reserved flag bits are set.
    #[error("unknown flags {found:#06x}")]
    Flags {
        /// The flags found.
        found: u16,
    },
    /// The payload is not as long as the header says (a truncated or extended file).
    #[error("header says {expected} payload bytes, the entry has {found}")]
    Length {
        /// The header's length.
        expected: u64,
        /// Payload bytes present.
        found: u64,
    },
    /// The payload's checksum does not match (torn or flipped bytes).
    #[error("payload checksum mismatch")]
    PayloadChecksum,
    /// A valid entry for another sample or data set.
    #[error("entry holds key {found}, expected {expected}")]
    WrongKey {
        /// The key asked for.
        expected: KeyHash,
        /// The key in the header.
        found: KeyHash,
    },
}

/// The header of an entry holding `payload` under `key`.
pub fn header(key: KeyHash, payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    // h[6..8]: flags, zero
    h[8..16].copy_from_slice(&key.0.to_le_bytes());
    h[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[24..28].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    let hcrc = crc32fast::hash(&h[..28]);
    h[28..32].copy_from_slice(&hcrc.to_le_bytes());
    h
}

/// The whole entry (header and payload) for `payload` under `key`.
pub fn encode(key: KeyHash, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&header(key, payload));
    out.extend_from_slice(payload);
    out
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Checks every field of `bytes` and borrows the payload; never panics, never allocates.
pub fn decode(bytes: &[u8]) -> Result<Entry<'_>, EntryError> {
    let Some((h, payload)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return Err(EntryError::TooShort { len: bytes.len() });
    };
    let magic = [h[0], h[1], h[2], h[3]];
    if magic != MAGIC {
        return Err(EntryError::BadMagic { found: magic });
    }
    if crc32fast::hash(&h[..28]) != le_u32(&h[28..32]) {
        return Err(EntryError::HeaderChecksum);
    }
    let version = le_u16(&h[4..6]);
    if version != VERSION {
        return Err(EntryError::Version { found: version });
    }
    let flags = le_u16(&h[6..8]);
    if flags != 0 {
        return Err(EntryError::Flags { found: flags });
    }
    let len = le_u64(&h[16..24]);
    if len != payload.len() as u64 {
        return Err(EntryError::Length {
            expected: len,
            found: payload.len() as u64,
        });
    }
    if crc32fast::hash(payload) != le_u32(&h[24..28]) {
        return Err(EntryError::PayloadChecksum);
    }
    Ok(Entry {
        key: KeyHash(le_u64(&h[8..16])),
        payload,
    })
}

/// [`decode`], and the entry must hold `key`.
pub fn decode_for(bytes: &[u8], key: KeyHash) -> Result<&[u8], EntryError> {
    let e = decode(bytes)?;
    if e.key != key {
        return Err(EntryError::WrongKey {
            expected: key,
            found: e.key,
        });
    }
    Ok(e.payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_layout() {
        let key = KeyHash::of("ds-1", 7);
        let e = encode(key, b"hello");
        assert_eq!(e.len(), HEADER_LEN + 5);
        assert_eq!(&e[..4], b"DCEN");
        assert_eq!(decode_for(&e, key).unwrap(), b"hello");
        let empty = encode(key, b"");
        assert_eq!(decode(&empty).unwrap().payload, b"");
    }

    #[test]
    fn keys_differ_by_namespace_and_index() {
        let a = KeyHash::of("ds", 1);
        assert_ne!(a, KeyHash::of("ds", 2));
        assert_ne!(a, KeyHash::of("ds2", 1));
        // The separator keeps ("a", …) and ("a\u{1}", …) apart in a way that concatenation
        // alone might not.
        assert_ne!(KeyHash::of("a", 0x01), KeyHash::of("a\u{1}", 0));
        // Pinned: the hash is part of the on-disk format and must not drift.
        assert_eq!(KeyHash::of("", 0).0, 0x2032_dd64_3620_252e);
    }

    #[test]
    fn wrong_key_is_rejected() {
        let e = encode(KeyHash::of("ds", 1), b"x");
        assert!(matches!(
            decode_for(&e, KeyHash::of("ds", 2)),
            Err(EntryError::WrongKey { .. })
        ));
    }

    /// Every proper prefix of an entry (a write cut anywhere) is rejected.
    #[test]
    fn every_truncation_is_rejected() {
        let key = KeyHash::of("ds", 3);
        let e = encode(key, &(0..200u8).collect::<Vec<_>>());
        for cut in 0..e.len() {
            assert!(decode(&e[..cut]).is_err(), "prefix of {cut} bytes accepted");
        }
        let mut longer = e.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(EntryError::Length { .. })));
    }

    /// Every single-bit flip anywhere in an entry is rejected (CRC-32 detects all of them).
    #[test]
    fn every_bit_flip_is_rejected() {
        let key = KeyHash::of("ds", 4);
        let e = encode(key, b"some payload bytes");
        for byte in 0..e.len() {
            for bit in 0..8 {
                let mut f = e.clone();
                f[byte] ^= 1 << bit;
                assert!(
                    decode_for(&f, key).is_err(),
                    "flip of bit {bit} in byte {byte} accepted"
                );
            }
        }
    }

    #[test]
    fn a_huge_length_field_is_an_error_not_an_allocation() {
        let key = KeyHash::of("ds", 5);
        let mut e = encode(key, b"abc");
        e[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let hcrc = crc32fast::hash(&e[..28]);
        e[28..32].copy_from_slice(&hcrc.to_le_bytes());
        assert_eq!(
            decode(&e),
            Err(EntryError::Length {
                expected: u64::MAX,
                found: 3
            })
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Arbitrary bytes: a typed error or a valid entry, never a panic; anything accepted
        /// re-encodes to exactly the input.
        #[test]
        fn arbitrary_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(e) = decode(&bytes) {
                prop_assert_eq!(encode(e.key, e.payload), bytes);
            }
        }

        /// Arbitrary bytes behind a valid magic and header checksum, so that the checks past
        /// the first two are reached (random bytes alone almost never get there).
        #[test]
        fn arbitrary_headers_past_the_checksum(
            fields in proptest::collection::vec(any::<u8>(), 24),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            fix_version in any::<bool>(),
            fix_len in any::<bool>(),
        ) {
            let mut h = [0u8; HEADER_LEN];
            h[..4].copy_from_slice(&MAGIC);
            h[4..28].copy_from_slice(&fields);
            if fix_version {
                h[4..8].copy_from_slice(&[2, 0, 0, 0]);
            }
            if fix_len {
                h[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            }
            let hcrc = crc32fast::hash(&h[..28]);
            h[28..32].copy_from_slice(&hcrc.to_le_bytes());
            let mut bytes = h.to_vec();
            bytes.extend_from_slice(&payload);
            match decode(&bytes) {
                Ok(e) => prop_assert_eq!(encode(e.key, e.payload), bytes),
                Err(EntryError::TooShort { .. } | EntryError::BadMagic { .. } | EntryError::HeaderChecksum) => {
                    prop_assert!(false, "header checks should have passed");
                }
                Err(_) => {}
            }
        }

        /// Valid entries of arbitrary payloads round-trip.
        #[test]
        fn valid_entries_round_trip(ns in "[a-z]{0,8}", index in any::<u64>(), payload in proptest::collection::vec(any::<u8>(), 0..512)) {
            let key = KeyHash::of(&ns, index);
            let e = encode(key, &payload);
            prop_assert_eq!(decode_for(&e, key).unwrap(), &payload[..]);
        }
    }
}
