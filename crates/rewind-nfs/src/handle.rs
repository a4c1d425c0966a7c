//! File handles: which tree, which inode in which incarnation, and which
//! point in time (the present, or a view). 32 bytes, stable across
//! restarts: the tree is named by a hash of its name and creation time, the
//! inode by its number and generation, a view by its exact time.
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 1 | version (1) |
//! | 1 | 1 | kind: 0 an inode, 1 the tree's `.rewind` directory |
//! | 2 | 2 | zero |
//! | 4 | 8 | tree id |
//! | 12 | 8 | inode |
//! | 20 | 4 | generation |
//! | 24 | 8 | 0: the present; else the view's time (Unix nanoseconds) |
//!
//! A handle that does not decode is NFS3ERR_BADHANDLE; one that decodes but
//! names a tree, inode or time that is gone is NFS3ERR_STALE.

use rewind_tree::Handle;
use rewind_types::Timestamp;

pub const HANDLE_BYTES: usize = 32;
const VERSION: u8 = 1;

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Inode(Handle),
    /// `/.rewind` of the tree's present root: the past, by time or bookmark.
    Past,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle {
    pub tree: u64,
    pub target: Target,
    /// `None`: the present.
    pub at: Option<Timestamp>,
}

impl FileHandle {
    pub fn encode(&self) -> Vec<u8> {
        let (kind, ino, generation) = match self.target {
            Target::Inode(handle) => (0u8, handle.ino, handle.generation),
            Target::Past => (1, 0, 0),
        };
        let mut bytes = Vec::with_capacity(HANDLE_BYTES);
        bytes.extend_from_slice(&[VERSION, kind, 0, 0]);
        bytes.extend_from_slice(&self.tree.to_le_bytes());
        bytes.extend_from_slice(&ino.to_le_bytes());
        bytes.extend_from_slice(&generation.to_le_bytes());
        bytes.extend_from_slice(&self.at.map_or(0, Timestamp::unix_nanos).to_le_bytes());
        bytes
    }

    /// `None` for bytes that are not one of our handles.
    pub fn decode(bytes: &[u8]) -> Option<FileHandle> {
        if bytes.len() != HANDLE_BYTES || bytes[0] != VERSION || bytes[2..4] != [0, 0] {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let tree = word(4);
        let (ino, generation) = (word(12), u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes")));
        let at = match word(24) {
            0 => None,
            nanos => Some(Timestamp::from_unix_nanos(nanos)),
        };
        let target = match bytes[1] {
            0 => Target::Inode(Handle { ino, generation }),
            1 if ino == 0 && generation == 0 && at.is_none() => Target::Past,
            _ => return None,
        };
        Some(FileHandle { tree, target, at })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_garbage_is_not_one() {
        let handles = [
            FileHandle { tree: 9, target: Target::Inode(Handle { ino: 5, generation: 2 }), at: None },
            FileHandle {
                tree: u64::MAX,
                target: Target::Inode(Handle { ino: 1, generation: 1 }),
                at: Some(Timestamp::from_unix_nanos(77)),
            },
            FileHandle { tree: 3, target: Target::Past, at: None },
        ];
        for handle in handles {
            let bytes = handle.encode();
            assert_eq!(bytes.len(), HANDLE_BYTES);
            assert_eq!(FileHandle::decode(&bytes), Some(handle));
        }
        let mut bad = handles[0].encode();
        bad[0] = 2;
        assert_eq!(FileHandle::decode(&bad), None);
        assert_eq!(FileHandle::decode(&handles[0].encode()[..31]), None);
        let mut bad = handles[2].encode();
        bad[12] = 1;
        assert_eq!(FileHandle::decode(&bad), None, "the past directory has no inode");
    }
}
