//! What goes to the bucket is sealed on the node (issue 14 req 4): every
//! pack and catalog object is encrypted and authenticated with
//! XChaCha20-Poly1305 under the bucket's *data key*, which lives in the
//! bucket wrapped by a key the operator holds (`--key-file`: 32 bytes, or
//! a passphrase stretched with Argon2id). The bucket's owner sees object
//! names, sizes and times, and nothing else: catalog pieces are named by a
//! keyed hash of their contents, so known content cannot be tested for.
//!
//! [`SealedPackStore`] and [`SealedMetaStore`] wrap any pack or meta store
//! (the seams of `rewind_chunks`), so the chunk store and the catalog do
//! not know. A sealed object (`docs/format/bucket.md`, "Sealed objects") is
//! a 64-byte header — with a nonce prefix fresh for the object — and
//! segments of 64 KiB of plaintext, each sealed on its own with the
//! object's name, its header, its index and whether it is the last bound as
//! associated data: a ranged read opens only the segments it needs; an
//! object swapped for another, truncated, or sealed under another key fails
//! to open, with an error that says so. Pack and catalog names are never
//! reused (packs are numbered, catalogs by generation), so the name binds
//! the generation too.
//!
//! [`seal_bucket`] decides, from what the bucket holds, whether it is
//! sealed, and refuses the combinations that would mix: a sealed bucket
//! without a key, and a key for a bucket already holding plaintext.

mod key;
mod object;
mod stores;

pub use key::{rekey, DataKey, KeySource, KEYS_DIR};
pub use object::{Sealer, HEADER_BYTES, SEGMENT_BYTES};
pub use stores::{seal_bucket, SealedMetaStore, SealedPackStore};
