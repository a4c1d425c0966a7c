//! Sealed objects: a header, then segments of [`SEGMENT_BYTES`] of
//! plaintext each sealed with XChaCha20-Poly1305 (see the crate
//! documentation).
//!
//! ```text
//! 0   4  magic RWSE
//! 4   4  version (1)
//! 8   4  segment plaintext bytes (65536)
//! 12  4  zero
//! 16 16  nonce prefix: random, fresh for the object
//! 32  8  data key id (the first 8 bytes of the key's BLAKE3 id hash)
//! 40 24  zero
//! 64     segments: ciphertext and a 16-byte tag each; every one full but the
//!        last, which may be empty (an empty object is one empty segment)
//! ```
//!
//! Segment `i`'s nonce is the prefix followed by `i` (u64, little-endian);
//! its associated data is `rewind-seal 1`, the object's name (length-
//! prefixed), the header, `i`, and 1 for the last segment, 0 before it.

use std::io;

use chacha20poly1305::aead::{Aead, AeadInPlace, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::key::DataKey;

pub const HEADER_BYTES: u64 = 64;
pub const SEGMENT_BYTES: u64 = 64 << 10;
const TAG_BYTES: u64 = 16;
const MAGIC: &[u8; 4] = b"RWSE";
const VERSION: u32 = 1;

/// Seals and opens objects under one data key.
pub struct Sealer {
    cipher: XChaCha20Poly1305,
    key_id: [u8; 8],
    name_key: [u8; 32],
}

/// A sealed object's header, as read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    bytes: [u8; HEADER_BYTES as usize],
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl Header {
    fn prefix(&self) -> &[u8] {
        &self.bytes[16..32]
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl Sealer {
    pub fn new(key: &DataKey) -> Sealer {
        Sealer { cipher: XChaCha20Poly1305::new(&key.cipher_key().into()), key_id: key.id(), name_key: key.name_key() }
    }

    /// A keyed hash of `bytes`: names content without revealing it.
    pub fn content_hash(&self, bytes: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.name_key, bytes).as_bytes()
    }

    /// A fresh header for a new object.
    pub fn new_header(&self) -> io::Result<Header> {
        let mut bytes = [0u8; HEADER_BYTES as usize];
        bytes[0..4].copy_from_slice(MAGIC);
        bytes[4..8].copy_from_slice(&VERSION.to_le_bytes());
        bytes[8..12].copy_from_slice(&(SEGMENT_BYTES as u32).to_le_bytes());
        getrandom::fill(&mut bytes[16..32]).map_err(|error| io::Error::other(format!("no randomness: {error}")))?;
        bytes[32..40].copy_from_slice(&self.key_id);
        Ok(Header { bytes })
    }

    /// The header at the start of object `what`, checked.
    pub fn read_header(&self, what: &str, bytes: &[u8]) -> io::Result<Header> {
        let bytes: [u8; HEADER_BYTES as usize] = bytes
            .get(..HEADER_BYTES as usize)
            .and_then(|header| header.try_into().ok())
            .ok_or_else(|| invalid(format!("{what} is too short to be a sealed object")))?;
        if &bytes[0..4] != MAGIC {
            return Err(invalid(format!(
                "{what} is not sealed: it was written without encryption, or it is not Rewind's"
            )));
        }
        let version = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        let segment = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION || u64::from(segment) != SEGMENT_BYTES {
            return Err(invalid(format!("{what}: sealed object version {version}, segments of {segment} bytes")));
        }
        if bytes[32..40] != self.key_id {
            return Err(invalid(format!(
                "{what} is sealed under another data key (id {}), not this bucket's ({})",
                hex(&bytes[32..40]),
                hex(&self.key_id)
            )));
        }
        Ok(Header { bytes })
    }

    fn nonce(header: &Header, index: u64) -> XNonce {
        let mut nonce = [0u8; 24];
        nonce[..16].copy_from_slice(header.prefix());
        nonce[16..].copy_from_slice(&index.to_le_bytes());
        nonce.into()
    }

    fn associated(name: &str, header: &Header, index: u64, last: bool) -> Vec<u8> {
        let mut aad = Vec::with_capacity(96 + name.len());
        aad.extend_from_slice(b"rewind-seal 1");
        aad.extend_from_slice(&(name.len() as u32).to_le_bytes());
        aad.extend_from_slice(name.as_bytes());
        aad.extend_from_slice(&header.bytes);
        aad.extend_from_slice(&index.to_le_bytes());
        aad.push(u8::from(last));
        aad
    }

    /// Segment `index` of object `name` sealed: ciphertext and tag.
    pub fn seal_segment(&self, name: &str, header: &Header, index: u64, last: bool, plain: &[u8]) -> Vec<u8> {
        assert!(plain.len() as u64 <= SEGMENT_BYTES && (last || plain.len() as u64 == SEGMENT_BYTES));
        let aad = Self::associated(name, header, index, last);
        self.cipher
            .encrypt(&Self::nonce(header, index), Payload { msg: plain, aad: &aad })
            .expect("XChaCha20-Poly1305 seals any segment")
    }

    /// A whole object sealed.
    pub fn seal(&self, name: &str, plain: &[u8]) -> io::Result<Vec<u8>> {
        let header = self.new_header()?;
        let mut sealed = Vec::with_capacity(sealed_bytes(plain.len() as u64) as usize);
        sealed.extend_from_slice(&header.bytes);
        let count = segment_count_of_plain(plain.len() as u64);
        for index in 0..count {
            let start = (index * SEGMENT_BYTES) as usize;
            let end = (start + SEGMENT_BYTES as usize).min(plain.len());
            sealed.extend_from_slice(&self.seal_segment(name, &header, index, index + 1 == count, &plain[start..end]));
        }
        Ok(sealed)
    }

    /// A whole sealed object opened.
    pub fn open(&self, name: &str, what: &str, sealed: &[u8]) -> io::Result<Vec<u8>> {
        let header = self.read_header(what, sealed)?;
        let size = sealed.len() as u64;
        let plain = plain_bytes(size).ok_or_else(|| truncated(what, size))?;
        let mut body = sealed[HEADER_BYTES as usize..].to_vec();
        let mut out = vec![0; plain as usize];
        self.open_segments(name, what, &header, size, 0, &mut body, 0, &mut out)?;
        Ok(out)
    }

    /// Opens, in place, the segments from `first` whose sealed bytes are
    /// `sealed`, of an object of `size` sealed bytes, and copies their
    /// plaintext from byte `skip` on into `out` (filled exactly).
    #[allow(clippy::too_many_arguments)]
    pub fn open_segments(
        &self,
        name: &str,
        what: &str,
        header: &Header,
        size: u64,
        first: u64,
        sealed: &mut [u8],
        skip: usize,
        out: &mut [u8],
    ) -> io::Result<()> {
        let count = segment_count(size).ok_or_else(|| truncated(what, size))?;
        let stride = (SEGMENT_BYTES + TAG_BYTES) as usize;
        let (mut skip, mut copied) = (skip, 0);
        for (segment, index) in sealed.chunks_mut(stride).zip(first..) {
            let failed = || {
                invalid(format!(
                    "{what} does not open with this bucket's data key (segment {index}): it was damaged, \
                     truncated, or swapped for another object"
                ))
            };
            let Some(split) = segment.len().checked_sub(TAG_BYTES as usize) else { return Err(failed()) };
            let (text, tag) = segment.split_at_mut(split);
            let aad = Self::associated(name, header, index, index + 1 == count);
            self.cipher
                .decrypt_in_place_detached(&Self::nonce(header, index), &aad, text, (&*tag).into())
                .map_err(|_| failed())?;
            let from = skip.min(text.len());
            let take = (text.len() - from).min(out.len() - copied);
            out[copied..copied + take].copy_from_slice(&text[from..from + take]);
            copied += take;
            skip -= from;
            if copied == out.len() {
                return Ok(());
            }
        }
        Err(truncated(what, size))
    }
}

fn truncated(what: &str, size: u64) -> io::Error {
    invalid(format!("{what}: {size} bytes cannot be a sealed object (truncated?)"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn segment_count_of_plain(plain: u64) -> u64 {
    plain.div_ceil(SEGMENT_BYTES).max(1)
}

/// The sealed size of `plain` bytes.
pub fn sealed_bytes(plain: u64) -> u64 {
    HEADER_BYTES + plain + segment_count_of_plain(plain) * TAG_BYTES
}

/// How many segments a sealed object of `size` bytes has.
pub fn segment_count(size: u64) -> Option<u64> {
    let body = size.checked_sub(HEADER_BYTES)?;
    let count = body.div_ceil(SEGMENT_BYTES + TAG_BYTES).max(1);
    // The last segment holds its tag at least.
    (body >= (count - 1) * (SEGMENT_BYTES + TAG_BYTES) + TAG_BYTES).then_some(count)
}

/// The plaintext size of a sealed object of `size` bytes.
pub fn plain_bytes(size: u64) -> Option<u64> {
    let count = segment_count(size)?;
    Some(size - HEADER_BYTES - count * TAG_BYTES)
}

/// The sealed bytes holding plaintext `offset..offset + length` of an
/// object of `size` sealed bytes: the first segment and the byte range.
pub fn sealed_range(size: u64, offset: u64, length: u64) -> (u64, std::ops::Range<u64>) {
    assert!(length > 0);
    let first = offset / SEGMENT_BYTES;
    let last = (offset + length - 1) / SEGMENT_BYTES;
    let start = HEADER_BYTES + first * (SEGMENT_BYTES + TAG_BYTES);
    let end = (HEADER_BYTES + (last + 1) * (SEGMENT_BYTES + TAG_BYTES)).min(size);
    (first, start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_go_both_ways() {
        for plain in
            [0, 1, SEGMENT_BYTES - 1, SEGMENT_BYTES, SEGMENT_BYTES + 1, 5 * SEGMENT_BYTES, 5 * SEGMENT_BYTES + 7]
        {
            let size = sealed_bytes(plain);
            assert_eq!(plain_bytes(size), Some(plain), "{plain}");
        }
        assert_eq!(plain_bytes(HEADER_BYTES + 15), None, "shorter than a tag");
        assert_eq!(plain_bytes(HEADER_BYTES + SEGMENT_BYTES + TAG_BYTES + 3), None, "a last segment without its tag");
    }
}
