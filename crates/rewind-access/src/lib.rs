//! Who may do what on a Rewind node, kept in the data directory:
//!
//! - [`Tokens`]: bearer tokens for the management API (`tokens.json`, only
//!   BLAKE3 hashes of them; the admin token itself in `admin-token` so the
//!   CLI on the same machine finds it). Both files are mode 0600.
//! - [`Grants`]: which client identity (the common name of its verified TLS
//!   certificate, or `*` for anyone) may open which volume over NBD, read-only
//!   or read-write (`access.json`, mode 0600).
//!
//! The server holds both in memory and writes a file whole (to a temporary
//! name, synced, then renamed) before a change takes effect, so a crash leaves
//! the old or the new file, never half of one. Offline commands hold the data
//! directory's lock, so a server and a command never change them at once.
//!
//! Nothing here decides *policy* (which route needs which role, who may open
//! an export when no client certificate is asked for): the HTTP server and
//! the NBD catalog do, with what this crate answers.

mod file;
mod grants;
mod tokens;

pub use grants::{Access, GrantInfo, Grants, ANYONE, GRANTS_FILE};
pub use tokens::{read_admin_token, Principal, Role, TokenInfo, TokenSpec, Tokens, ADMIN_TOKEN_FILE, TOKENS_FILE};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{} is damaged ({reason}); restore it from a backup, or move it away to start over (tokens: a new admin token is made at the next start; grants: none remain)", path.display())]
    Damaged { path: PathBuf, reason: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
}

pub type Result<T> = std::result::Result<T, AccessError>;
