//! Reading XDR (RFC 4506) from an untrusted call, with every length checked
//! against what is left before anything is allocated.
//!
//! Why not `nfs3_types`' decoders: they allocate what a length field asks
//! for before reading (`Opaque::unpack` makes a buffer of the length, a
//! `Vec`'s unpack reserves its count), so twelve hostile bytes could ask
//! for gigabytes. Replies are encoded with `nfs3_types` (`Pack`), which
//! only writes what we hand it.

/// The call's bytes did not hold what the procedure takes (GARBAGE_ARGS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Garbage(pub String);

pub type Result<T> = std::result::Result<T, Garbage>;

/// A cursor over one call's bytes.
pub struct XdrReader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> XdrReader<'a> {
    pub fn new(bytes: &'a [u8]) -> XdrReader<'a> {
        XdrReader { bytes, position: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    pub fn position(&self) -> usize {
        self.position
    }

    fn take(&mut self, count: usize, what: &str) -> Result<&'a [u8]> {
        if count > self.remaining() {
            return Err(Garbage(format!("{what}: {count} bytes wanted, {} left", self.remaining())));
        }
        let taken = &self.bytes[self.position..self.position + count];
        self.position += count;
        Ok(taken)
    }

    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.take(4, "u32")?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(self.take(8, "u64")?.try_into().expect("8 bytes")))
    }

    pub fn bool(&mut self) -> Result<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(Garbage(format!("a boolean of {other}"))),
        }
    }

    /// Variable-length opaque data of at most `max` bytes (padding skipped).
    pub fn opaque(&mut self, max: usize, what: &str) -> Result<&'a [u8]> {
        let length = self.u32()? as usize;
        if length > max {
            return Err(Garbage(format!("{what} of {length} bytes (at most {max})")));
        }
        let data = self.take(length, what)?;
        self.take(length.next_multiple_of(4) - length, what)?;
        Ok(data)
    }

    /// Fixed-length opaque data.
    pub fn fixed<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let data = self.take(N, what)?.try_into().expect("N bytes");
        self.take(N.next_multiple_of(4) - N, what)?;
        Ok(data)
    }

    /// The rest of the call, which must be empty.
    pub fn finish(&self) -> Result<()> {
        match self.remaining() {
            0 => Ok(()),
            left => Err(Garbage(format!("{left} bytes after the arguments"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked_before_anything_is_taken() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&5u32.to_be_bytes());
        bytes.extend_from_slice(b"hello\0\0\0");
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        let mut reader = XdrReader::new(&bytes);
        assert_eq!(reader.opaque(255, "name").unwrap(), b"hello");
        // A hostile length is refused from the field alone.
        assert!(reader.opaque(usize::MAX, "name").unwrap_err().0.contains("4294967295 bytes wanted"));
        let mut reader = XdrReader::new(&bytes);
        assert!(reader.opaque(4, "name").unwrap_err().0.contains("at most 4"));
        let mut reader = XdrReader::new(&[0, 0, 0, 2]);
        assert!(reader.bool().is_err());
        assert!(XdrReader::new(&[0, 0, 0]).u32().is_err());
    }
}
