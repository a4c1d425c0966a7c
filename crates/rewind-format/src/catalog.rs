//! A node's catalog in its bucket (`docs/format/bucket.md`): the files of
//! its data directory a node needs besides its packs to be rebuilt, each
//! named as a list of content-addressed pieces. Catalog `n` is the object
//! `PREFIX/catalogs/NNNNNNNNNNNNNNNN` (16 hex digits), written once, after
//! every piece and pack it names; the newest is the node.

use rewind_types::Timestamp;

use crate::meta::{finish, open_envelope, seal_envelope};
use crate::{FormatError, Writer};

/// One file of the data directory, by its pieces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogFile {
    /// Relative to the data directory, `/`-separated.
    pub path: String,
    pub bytes: u64,
    /// BLAKE3 hashes of its pieces in order: each piece is the object
    /// `PREFIX/pieces/HASH` (64 hex digits) of [`PIECE_BYTES`] (the last
    /// may be shorter).
    pub pieces: Vec<[u8; 32]>,
}

/// The size of a file's pieces but its last.
pub const PIECE_BYTES: u64 = 4 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Catalog {
    pub generation: u64,
    /// When it was taken, by the node's clock.
    pub taken: Timestamp,
    /// In path order.
    pub files: Vec<CatalogFile>,
}

impl Catalog {
    const MAGIC: [u8; 4] = *b"RWCG";
    const WHAT: &'static str = "catalog";
    const FILES_MAX: usize = 1 << 24;
    const PATH_BYTES_MAX: usize = 4096;

    /// The object name of catalog `generation`.
    pub fn name(generation: u64) -> String {
        format!("catalogs/{generation:016x}")
    }

    /// The generation a catalog object's name gives, if it names one.
    pub fn parse_name(name: &str) -> Option<u64> {
        (name.len() == 16 && name.bytes().all(|byte| byte.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(name, 16).ok())
            .flatten()
    }

    /// The object name of the piece with `hash`.
    pub fn piece_name(hash: &[u8; 32]) -> String {
        let hex: String = hash.iter().map(|byte| format!("{byte:02x}")).collect();
        format!("pieces/{hex}")
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload.u64(self.generation).u64(self.taken.unix_nanos()).u32(self.files.len() as u32);
        for file in &self.files {
            payload.str(&file.path).u64(file.bytes).u32(file.pieces.len() as u32);
            for piece in &file.pieces {
                payload.slice(piece);
            }
        }
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let generation = reader.u64()?;
        let taken = Timestamp::from_unix_nanos(reader.u64()?);
        let count = reader.u32()? as usize;
        if count > Self::FILES_MAX {
            return Err(reader.invalid(format!("{count} files")));
        }
        let mut files: Vec<CatalogFile> = Vec::with_capacity(reader.capacity_for(count, 16));
        for _ in 0..count {
            let path = reader.str()?.to_owned();
            let bytes = reader.u64()?;
            let piece_count = reader.u32()? as u64;
            let expected = bytes.div_ceil(PIECE_BYTES);
            if piece_count != expected {
                return Err(reader.invalid(format!("{path}: {piece_count} pieces for {bytes} bytes")));
            }
            let safe = path.len() <= Self::PATH_BYTES_MAX
                && !path.is_empty()
                && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..");
            if !safe {
                return Err(reader.invalid(format!("file path {path:?}")));
            }
            if files.last().is_some_and(|last| last.path >= path) {
                return Err(reader.invalid(format!("{path} is out of order")));
            }
            let mut pieces = Vec::with_capacity(reader.capacity_for(piece_count as usize, 32));
            for _ in 0..piece_count {
                pieces.push(reader.take(32)?.try_into().expect("32 bytes"));
            }
            files.push(CatalogFile { path, bytes, pieces });
        }
        finish(reader)?;
        Ok(Catalog { generation, taken, files })
    }

    pub fn file(&self, path: &str) -> Option<&CatalogFile> {
        self.files.binary_search_by(|file| file.path.as_str().cmp(path)).ok().map(|found| &self.files[found])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Catalog {
        let file = |path: &str, bytes: u64| CatalogFile {
            path: path.to_owned(),
            bytes,
            pieces: (0..bytes.div_ceil(PIECE_BYTES)).map(|piece| [piece as u8; 32]).collect(),
        };
        Catalog {
            generation: 7,
            taken: Timestamp::from_unix_nanos(1_700_000_000_000_000_000),
            files: vec![file("chunks/table", 9 << 20), file("groups", 0), file("volumes/db/volume.meta", 100)],
        }
    }

    #[test]
    fn a_catalog_reads_back_as_written() {
        let catalog = sample();
        assert_eq!(Catalog::decode(&catalog.encode()).unwrap(), catalog);
        assert_eq!(catalog.file("groups").unwrap().bytes, 0);
        assert!(catalog.file("nothing").is_none());
        assert_eq!(Catalog::parse_name(&Catalog::name(7)["catalogs/".len()..]), Some(7));
        assert_eq!(Catalog::parse_name("not-a-catalog"), None);
    }

    #[test]
    fn paths_that_leave_the_data_directory_are_refused() {
        for path in ["../etc/passwd", "/etc/passwd", "volumes//x", "volumes/./x", ""] {
            let mut catalog = sample();
            catalog.files = vec![CatalogFile { path: path.to_owned(), bytes: 0, pieces: Vec::new() }];
            let error = Catalog::decode(&catalog.encode()).unwrap_err();
            assert!(error.to_string().contains("file path"), "{path}: {error}");
        }
    }

    #[test]
    fn pieces_that_do_not_cover_the_file_are_refused() {
        let mut catalog = sample();
        catalog.files[0].bytes += PIECE_BYTES;
        assert!(Catalog::decode(&catalog.encode()).unwrap_err().to_string().contains("pieces for"));
    }
}
