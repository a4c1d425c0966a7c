//! Little-endian field encoding shared by the formats.

use crate::FormatError;

/// Appends fixed-width little-endian fields to a buffer.
#[derive(Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer::default()
    }

    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.bytes.push(value);
        self
    }

    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// A UTF-8 string prefixed by its length as `u16`.
    pub fn str(&mut self, value: &str) -> &mut Self {
        let length = u16::try_from(value.len()).expect("strings in metadata are short");
        self.bytes.extend_from_slice(&length.to_le_bytes());
        self.bytes.extend_from_slice(value.as_bytes());
        self
    }

    pub fn slice(&mut self, value: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(value);
        self
    }

    pub fn zeros(&mut self, count: usize) -> &mut Self {
        self.bytes.resize(self.bytes.len() + count, 0);
        self
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Pads the fields with zeros to `size - 4` bytes and appends the CRC-32C
    /// of everything before it: the common shape of a fixed-size header.
    pub fn into_sealed(mut self, size: usize) -> Vec<u8> {
        assert!(self.bytes.len() <= size - 4, "fields overrun the checksum");
        self.bytes.resize(size - 4, 0);
        let checksum = crate::crc32c(&self.bytes);
        self.bytes.extend_from_slice(&checksum.to_le_bytes());
        self.bytes
    }
}

/// Reads fixed-width little-endian fields, failing with `Truncated` rather than
/// panicking on short input: every decoder runs on untrusted bytes.
pub struct Reader<'a> {
    what: &'static str,
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    pub fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Reader { what, bytes, position: 0 }
    }

    pub fn take(&mut self, count: usize) -> Result<&'a [u8], FormatError> {
        let end = self.position.checked_add(count).filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(FormatError::Truncated {
                what: self.what,
                available: self.bytes.len(),
                needed: self.position.saturating_add(count),
            });
        };
        let slice = &self.bytes[self.position..end];
        self.position = end;
        Ok(slice)
    }

    /// Reads a magic number and checks it is `expected`.
    pub fn magic(&mut self, expected: u32) -> Result<(), FormatError> {
        let found = self.u32()?;
        if found == expected {
            Ok(())
        } else {
            Err(FormatError::BadMagic { what: self.what, found })
        }
    }

    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn str(&mut self) -> Result<&'a str, FormatError> {
        let length = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes"));
        let bytes = self.take(usize::from(length))?;
        std::str::from_utf8(bytes).map_err(|_| self.invalid("string is not UTF-8"))
    }

    pub fn position(&self) -> usize {
        self.position
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    /// The capacity to reserve for `count` items of at least `item_bytes`
    /// bytes each that are about to be read: no more than the bytes left can
    /// hold, so a count field claiming millions in a short file costs
    /// nothing (found by the fuzz targets: a 31-byte timeline reserved
    /// 781 KB, a 55-byte index manifest 1.8 MB).
    pub fn capacity_for(&self, count: usize, item_bytes: usize) -> usize {
        count.min(self.remaining() / item_bytes)
    }

    pub fn invalid(&self, reason: impl Into<String>) -> FormatError {
        FormatError::Invalid { what: self.what, reason: reason.into() }
    }
}
