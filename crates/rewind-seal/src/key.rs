//! The bucket's data key, wrapped by the operator's key.
//!
//! The data key is 32 random bytes made when a bucket prefix is first used
//! with a key; everything sealed in the bucket is sealed under keys derived
//! from it. It is kept in the bucket as `keys/data-key-NNNNNNNNNNNNNNNN`
//! (the generation, 16 hex digits; the newest is the one), wrapped —
//! sealed with XChaCha20-Poly1305 — by a key-encryption key derived from
//! the operator's key: a 32-byte key file through BLAKE3's key derivation,
//! or a passphrase through Argon2id (64 MiB, 3 passes, a random salt kept
//! beside it). [`rekey`] wraps it again under a new key: nothing else in
//! the bucket changes.
//!
//! ```text
//! 0   4  magic RWDK
//! 4   4  version (1)
//! 8   1  how the key-encryption key is made: 0 key file, 1 passphrase (Argon2id)
//! 9   3  zero
//! 12  4  Argon2id memory (KiB)
//! 16  4  Argon2id passes
//! 20  4  Argon2id lanes
//! 24 16  salt
//! 40 24  nonce
//! 64  8  data key id
//! 72 48  the data key sealed (32 bytes and a 16-byte tag), bytes 0..72 as associated data
//! ```

use std::io;
use std::path::Path;

use argon2::{Algorithm, Argon2, Params, Version};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use rewind_chunks::meta_store::MetaStore;

/// Where the wrapped data keys are in the bucket.
pub const KEYS_DIR: &str = "keys";
const MAGIC: &[u8; 4] = b"RWDK";
const RECORD_BYTES: usize = 120;
const ARGON2_MEMORY_KIB: u32 = 64 << 10;
const ARGON2_PASSES: u32 = 3;
const ARGON2_LANES: u32 = 1;

/// What the operator holds.
#[derive(Clone)]
pub enum KeySource {
    Key([u8; 32]),
    Passphrase(String),
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeySource::Key(_) => "KeySource::Key(..)",
            KeySource::Passphrase(_) => "KeySource::Passphrase(..)",
        })
    }
}

impl KeySource {
    /// `--key-file`: exactly 32 bytes, or 64 hex digits, are a key; any
    /// other contents (without a trailing newline) are a passphrase.
    pub fn from_file(path: &Path) -> io::Result<KeySource> {
        let bytes = std::fs::read(path).map_err(|error| {
            io::Error::new(error.kind(), format!("cannot read the key file {}: {error}", path.display()))
        })?;
        if let Ok(key) = <[u8; 32]>::try_from(bytes.as_slice()) {
            return Ok(KeySource::Key(key));
        }
        let text = String::from_utf8(bytes).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: a key file holds 32 bytes, 64 hex digits, or a passphrase in UTF-8", path.display()),
            )
        })?;
        let text = text.trim_end_matches(['\n', '\r']);
        if text.len() == 64 && text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            let mut key = [0u8; 32];
            for (index, byte) in key.iter_mut().enumerate() {
                *byte = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16).expect("hex digits");
            }
            return Ok(KeySource::Key(key));
        }
        if text.len() < 8 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: a passphrase of fewer than 8 bytes is too weak to protect the bucket", path.display()),
            ));
        }
        Ok(KeySource::Passphrase(text.to_owned()))
    }
}

/// The bucket's data key.
#[derive(Clone)]
pub struct DataKey {
    key: [u8; 32],
}

impl DataKey {
    fn random() -> io::Result<DataKey> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|error| io::Error::other(format!("no randomness: {error}")))?;
        Ok(DataKey { key })
    }

    /// Names the key without revealing it.
    pub fn id(&self) -> [u8; 8] {
        blake3::derive_key("rewind 2026 data key id", &self.key)[..8].try_into().expect("8 bytes")
    }

    pub(crate) fn cipher_key(&self) -> [u8; 32] {
        blake3::derive_key("rewind 2026 object sealing key", &self.key)
    }

    pub(crate) fn name_key(&self) -> [u8; 32] {
        blake3::derive_key("rewind 2026 content naming key", &self.key)
    }

    /// The data key of the bucket whose keys are in `meta`, unwrapped with
    /// `source`; made (and stored) if the bucket has none.
    pub fn open_or_create(meta: &dyn MetaStore, source: &KeySource) -> io::Result<DataKey> {
        match newest(meta)? {
            Some((name, record)) => unwrap(&record, source, &meta.locate(&name)),
            None => {
                let key = DataKey::random()?;
                let name = key_name(1);
                meta.put_new(&name, &wrap(&key, source)?)?;
                tracing::info!(key = %meta.locate(&name), "made the bucket's data key");
                Ok(key)
            }
        }
    }

    /// Whether the bucket whose keys are in `meta` has a data key.
    pub fn exists(meta: &dyn MetaStore) -> io::Result<bool> {
        Ok(newest(meta)?.is_some())
    }
}

fn key_name(generation: u64) -> String {
    format!("{KEYS_DIR}/data-key-{generation:016x}")
}

/// The newest wrapped data key: its name and bytes.
fn newest(meta: &dyn MetaStore) -> io::Result<Option<(String, Vec<u8>)>> {
    let generation = meta
        .list(KEYS_DIR)?
        .iter()
        .filter_map(|name| u64::from_str_radix(name.strip_prefix("data-key-")?, 16).ok())
        .max();
    let Some(generation) = generation else { return Ok(None) };
    let name = key_name(generation);
    let bytes = meta.get(&name)?;
    Ok(Some((name, bytes)))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

fn key_encryption_key(source: &KeySource, passphrase_params: (u32, u32, u32), salt: &[u8]) -> io::Result<[u8; 32]> {
    match source {
        KeySource::Key(key) => Ok(blake3::derive_key("rewind 2026 key-encryption key", key)),
        KeySource::Passphrase(passphrase) => {
            let (memory, passes, lanes) = passphrase_params;
            let params = Params::new(memory, passes, lanes, Some(32))
                .map_err(|error| invalid(format!("Argon2id parameters: {error}")))?;
            let mut key = [0u8; 32];
            Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
                .hash_password_into(passphrase.as_bytes(), salt, &mut key)
                .map_err(|error| invalid(format!("Argon2id: {error}")))?;
            Ok(key)
        }
    }
}

fn wrap(key: &DataKey, source: &KeySource) -> io::Result<Vec<u8>> {
    let mut record = vec![0u8; 72];
    record[0..4].copy_from_slice(MAGIC);
    record[4..8].copy_from_slice(&1u32.to_le_bytes());
    record[8] = u8::from(matches!(source, KeySource::Passphrase(_)));
    record[12..16].copy_from_slice(&ARGON2_MEMORY_KIB.to_le_bytes());
    record[16..20].copy_from_slice(&ARGON2_PASSES.to_le_bytes());
    record[20..24].copy_from_slice(&ARGON2_LANES.to_le_bytes());
    getrandom::fill(&mut record[24..64]).map_err(|error| io::Error::other(format!("no randomness: {error}")))?;
    record[64..72].copy_from_slice(&key.id());
    let kek = key_encryption_key(source, (ARGON2_MEMORY_KIB, ARGON2_PASSES, ARGON2_LANES), &record[24..40])?;
    let sealed = XChaCha20Poly1305::new(&kek.into())
        .encrypt(record[40..64].into(), Payload { msg: &key.key, aad: &record[..72] })
        .expect("sealing 32 bytes");
    record.extend_from_slice(&sealed);
    assert_eq!(record.len(), RECORD_BYTES);
    Ok(record)
}

fn unwrap(record: &[u8], source: &KeySource, what: &str) -> io::Result<DataKey> {
    if record.len() != RECORD_BYTES || &record[0..4] != MAGIC {
        return Err(invalid(format!("{what} is not a wrapped data key")));
    }
    let made_with_passphrase = match record[8] {
        0 => false,
        1 => true,
        other => return Err(invalid(format!("{what}: unknown key derivation {other}"))),
    };
    let given_passphrase = matches!(source, KeySource::Passphrase(_));
    if made_with_passphrase != given_passphrase {
        let (made, given) = match made_with_passphrase {
            true => ("a passphrase", "a 32-byte key"),
            false => ("a 32-byte key", "a passphrase"),
        };
        return Err(invalid(format!("{what} was wrapped with {made}, and the key file holds {given}")));
    }
    let word = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().expect("4 bytes"));
    // Bounded, so a forged record cannot make us allocate without end.
    if word(12) > 4 << 20 || word(16) > 64 || word(20) > 16 {
        return Err(invalid(format!("{what}: Argon2id parameters out of range")));
    }
    let kek = key_encryption_key(source, (word(12), word(16), word(20)), &record[24..40])?;
    let key = XChaCha20Poly1305::new(&kek.into())
        .decrypt(record[40..64].into(), Payload { msg: &record[72..], aad: &record[..72] })
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the key file does not open {what}: it is not the key (or passphrase) this bucket was sealed with"
                ),
            )
        })?;
    let key = DataKey { key: key.try_into().map_err(|_| invalid(format!("{what}: a data key of the wrong size")))? };
    if key.id() != record[64..72] {
        return Err(invalid(format!("{what}: the data key does not match its id")));
    }
    Ok(key)
}

/// Wraps the bucket's data key under `new` (opened with `old`) as the next
/// generation, then deletes the older ones. Returns the new key's name.
pub fn rekey(meta: &dyn MetaStore, old: &KeySource, new: &KeySource) -> io::Result<String> {
    let Some((name, record)) = newest(meta)? else {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} holds no data key", meta.locate(KEYS_DIR))));
    };
    let key = unwrap(&record, old, &meta.locate(&name))?;
    let generation = u64::from_str_radix(name.rsplit('-').next().expect("named by generation"), 16)
        .map_err(|_| invalid(format!("{name}: not a key generation")))?;
    let next = key_name(generation + 1);
    meta.put_new(&next, &wrap(&key, new)?)?;
    for older in meta.list(KEYS_DIR)? {
        let path = format!("{KEYS_DIR}/{older}");
        if path != next {
            meta.delete(&path)?;
        }
    }
    Ok(meta.locate(&next))
}
