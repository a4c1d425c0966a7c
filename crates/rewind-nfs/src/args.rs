//! The arguments of NFSv3 and MOUNT calls, decoded by hand from untrusted
//! bytes (`xdr.rs` says why), into the tree's terms.

use rewind_tree::{CreateHow, SetAttributes, SetTime};
use rewind_types::Timestamp;

use crate::xdr::{Garbage, Result, XdrReader};

/// File handles are at most 64 bytes (ours are 32).
pub const FH_BYTES_MAX: usize = 64;
/// Names longer than a tree allows still decode, to be refused with
/// NFS3ERR_NAMETOOLONG rather than as garbage.
pub const NAME_BYTES_MAX: usize = 1024;
pub const PATH_BYTES_MAX: usize = 4096;
/// A WRITE carries at most this much (FSINFO's wtmax).
pub const WRITE_BYTES_MAX: usize = 1 << 20;

pub fn handle<'a>(reader: &mut XdrReader<'a>) -> Result<&'a [u8]> {
    reader.opaque(FH_BYTES_MAX, "file handle")
}

/// A directory and a name in it (`diropargs3`).
pub fn dir_name<'a>(reader: &mut XdrReader<'a>) -> Result<(&'a [u8], &'a [u8])> {
    Ok((handle(reader)?, reader.opaque(NAME_BYTES_MAX, "name")?))
}

pub fn time(reader: &mut XdrReader<'_>) -> Result<Timestamp> {
    let (seconds, nanos) = (reader.u32()?, reader.u32()?);
    if nanos >= 1_000_000_000 {
        return Err(Garbage(format!("a time of {nanos} nanoseconds")));
    }
    Ok(Timestamp::from_unix_nanos(u64::from(seconds) * 1_000_000_000 + u64::from(nanos)))
}

fn set_time(reader: &mut XdrReader<'_>) -> Result<Option<SetTime>> {
    match reader.u32()? {
        0 => Ok(None),
        1 => Ok(Some(SetTime::ServerNow)),
        2 => Ok(Some(SetTime::Client(time(reader)?))),
        other => Err(Garbage(format!("time_how {other}"))),
    }
}

/// `sattr3`.
pub fn set_attributes(reader: &mut XdrReader<'_>) -> Result<SetAttributes> {
    let mode = reader.bool()?.then(|| reader.u32()).transpose()?;
    let uid = reader.bool()?.then(|| reader.u32()).transpose()?;
    let gid = reader.bool()?.then(|| reader.u32()).transpose()?;
    let size = reader.bool()?.then(|| reader.u64()).transpose()?;
    let atime = set_time(reader)?;
    let mtime = set_time(reader)?;
    Ok(SetAttributes { mode, uid, gid, size, atime, mtime })
}

/// `createhow3`.
pub fn create_how(reader: &mut XdrReader<'_>) -> Result<CreateHow> {
    match reader.u32()? {
        0 => Ok(CreateHow::Unchecked(set_attributes(reader)?)),
        1 => Ok(CreateHow::Guarded(set_attributes(reader)?)),
        2 => Ok(CreateHow::Exclusive(reader.fixed::<8>("create verifier")?)),
        other => Err(Garbage(format!("createmode3 {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|word| word.to_be_bytes()).collect()
    }

    #[test]
    fn attributes_to_set_decode_and_bad_unions_are_garbage() {
        let bytes = words(&[1, 0o640, 0, 1, 7, 1, 0, 5, 1, 2, 9, 10]);
        let attributes = set_attributes(&mut XdrReader::new(&bytes)).unwrap();
        assert_eq!(attributes.mode, Some(0o640));
        assert_eq!(attributes.uid, None);
        assert_eq!(attributes.gid, Some(7));
        assert_eq!(attributes.size, Some(5));
        assert_eq!(attributes.atime, Some(SetTime::ServerNow));
        assert_eq!(attributes.mtime, Some(SetTime::Client(Timestamp::from_unix_nanos(9_000_000_010))));
        assert!(set_attributes(&mut XdrReader::new(&words(&[0, 0, 0, 0, 3, 0]))).is_err(), "time_how 3");
        assert!(set_attributes(&mut XdrReader::new(&words(&[2]))).is_err(), "a boolean of 2");
        assert!(time(&mut XdrReader::new(&words(&[1, 1_000_000_000]))).is_err());
        assert!(create_how(&mut XdrReader::new(&words(&[3]))).is_err());
        let exclusive = create_how(&mut XdrReader::new(&[0, 0, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8])).unwrap();
        assert_eq!(exclusive, CreateHow::Exclusive([1, 2, 3, 4, 5, 6, 7, 8]));
    }
}
