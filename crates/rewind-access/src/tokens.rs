//! API bearer tokens.
//!
//! A token reads `rewind_<id>_<secret>`: `id` (8 hex digits) names it in
//! lists and revocations and is not secret; `secret` is 32 random bytes in
//! hex. `tokens.json` keeps the BLAKE3 hash of each whole token, never the
//! token, and a presented token is checked by finding its id and comparing
//! hashes in constant time (`blake3::Hash`'s `==`). The one exception is the
//! admin token that `rewind serve` makes on first start: it is also written
//! to `admin-token` (mode 0600), which is how the CLI of a user who can read
//! the data directory finds it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::{file, AccessError, Result};

pub const TOKENS_FILE: &str = "tokens.json";
pub const ADMIN_TOKEN_FILE: &str = "admin-token";
const FORMAT: u32 = 1;
const PREFIX: &str = "rewind_";
const ID_BYTES: usize = 4;
const SECRET_BYTES: usize = 32;
/// A label is for people; this keeps `token list` readable.
const NAME_BYTES_MAX: usize = 128;
/// More than anyone types; bounds the file and the per-request check.
const VOLUMES_PER_TOKEN_MAX: usize = 1024;
const TOKENS_MAX: usize = 10_000;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Everything, including managing tokens and NBD access grants.
    Admin,
    /// Read and change volumes (within its volumes, if it has a list).
    ReadWrite,
    /// Only read (GET).
    ReadOnly,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::ReadWrite => "read-write",
            Role::ReadOnly => "read-only",
        }
    }
}

/// The bearer of a valid token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub id: String,
    pub name: String,
    pub role: Role,
    /// The only volumes it may see or act on; `None`: all of them.
    pub volumes: Option<BTreeSet<String>>,
}

impl Principal {
    pub fn may_see(&self, volume: &str) -> bool {
        self.volumes.as_ref().is_none_or(|volumes| volumes.contains(volume))
    }

    /// Node-wide reads and actions (all volumes' stats, metrics, garbage
    /// collection) are for tokens not limited to some volumes.
    pub fn is_node_wide(&self) -> bool {
        self.volumes.is_none()
    }
}

/// What `token create` asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    /// A label for people (`token list`); defaults to the id.
    #[serde(default)]
    pub name: Option<String>,
    /// Only GET requests.
    #[serde(default)]
    pub read_only: bool,
    /// Only these volumes; empty: all.
    #[serde(default)]
    pub volumes: Vec<String>,
}

/// A token as `token list` shows it (never the secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub role: Role,
    /// `None`: every volume.
    pub volumes: Option<Vec<String>>,
    pub created: String,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredToken {
    id: String,
    name: String,
    role: Role,
    volumes: Option<Vec<String>>,
    created: String,
    /// BLAKE3 of the whole token, hex.
    blake3: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    format: u32,
    tokens: Vec<StoredToken>,
}

struct Entry {
    stored: StoredToken,
    hash: blake3::Hash,
    volumes: Option<BTreeSet<String>>,
}

/// The node's API tokens.
pub struct Tokens {
    path: PathBuf,
    admin_path: PathBuf,
    entries: RwLock<Vec<Entry>>,
}

/// Reads the admin token the server wrote, if this user can.
pub fn read_admin_token(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join(ADMIN_TOKEN_FILE)).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

fn random_hex(bytes: usize) -> String {
    let mut buffer = vec![0u8; bytes];
    // ThreadRng is a CSPRNG seeded from the OS.
    rand::rng().fill_bytes(&mut buffer);
    buffer.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn now_text() -> String {
    jiff::Timestamp::now().round(jiff::Unit::Second).unwrap_or_else(|_| jiff::Timestamp::now()).to_string()
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX || name.chars().any(char::is_control) {
        return Err(AccessError::Invalid(format!(
            "token name {name:?} must be 1 to {NAME_BYTES_MAX} bytes without control characters"
        )));
    }
    Ok(())
}

impl Entry {
    fn new(stored: StoredToken) -> std::result::Result<Entry, String> {
        let hash = blake3::Hash::from_hex(&stored.blake3).map_err(|error| format!("token {}: {error}", stored.id))?;
        let volumes = stored.volumes.as_ref().map(|volumes| volumes.iter().cloned().collect());
        Ok(Entry { stored, hash, volumes })
    }

    fn info(&self) -> TokenInfo {
        let StoredToken { id, name, role, volumes, created, .. } = self.stored.clone();
        TokenInfo { id, name, role, volumes, created }
    }
}

impl Tokens {
    /// Reads `tokens.json` in `data_dir` (none yet: no tokens).
    pub fn open(data_dir: &Path) -> Result<Tokens> {
        let path = data_dir.join(TOKENS_FILE);
        let mut entries = Vec::new();
        if let Some(bytes) = file::read(&path)? {
            let damaged = |reason: String| AccessError::Damaged { path: path.clone(), reason };
            let parsed: TokensFile = serde_json::from_slice(&bytes).map_err(|error| damaged(error.to_string()))?;
            if parsed.format != FORMAT {
                return Err(damaged(format!("format {} is not {FORMAT}; a newer Rewind wrote it?", parsed.format)));
            }
            for stored in parsed.tokens {
                entries.push(Entry::new(stored).map_err(damaged)?);
            }
        }
        Ok(Tokens { path, admin_path: data_dir.join(ADMIN_TOKEN_FILE), entries: RwLock::new(entries) })
    }

    /// Makes an admin token if there is none, writing it to `admin-token`.
    /// Returns it when it made one.
    pub fn ensure_admin(&self) -> Result<Option<String>> {
        let mut entries = self.entries.write().expect("token lock is not poisoned");
        if entries.iter().any(|entry| entry.stored.role == Role::Admin) {
            return Ok(None);
        }
        let (entry, token) = Self::make(&entries, "admin".to_owned(), Role::Admin, None)?;
        // The token file first: should we crash between the two, the next
        // start finds no admin in tokens.json and makes another.
        file::write(&self.admin_path, format!("{token}\n").as_bytes())?;
        entries.push(entry);
        self.save(&entries)?;
        Ok(Some(token))
    }

    fn make(entries: &[Entry], name: String, role: Role, volumes: Option<Vec<String>>) -> Result<(Entry, String)> {
        if entries.len() >= TOKENS_MAX {
            return Err(AccessError::Invalid(format!("there are {TOKENS_MAX} tokens already; revoke some first")));
        }
        let id = loop {
            let id = random_hex(ID_BYTES);
            if !entries.iter().any(|entry| entry.stored.id == id) {
                break id;
            }
        };
        let token = format!("{PREFIX}{id}_{}", random_hex(SECRET_BYTES));
        let stored = StoredToken {
            id,
            name,
            role,
            volumes,
            created: now_text(),
            blake3: blake3::hash(token.as_bytes()).to_hex().to_string(),
        };
        let entry = Entry::new(stored).expect("a hash we made parses");
        Ok((entry, token))
    }

    fn save(&self, entries: &[Entry]) -> Result<()> {
        let contents =
            TokensFile { format: FORMAT, tokens: entries.iter().map(|entry| entry.stored.clone()).collect() };
        let mut bytes = serde_json::to_vec_pretty(&contents).expect("tokens serialize");
        bytes.push(b'\n');
        file::write(&self.path, &bytes)
    }

    /// Creates a token; returns what `token list` will show and the token
    /// itself, which is shown this once and never stored.
    pub fn create(&self, spec: &TokenSpec) -> Result<(TokenInfo, String)> {
        if spec.volumes.len() > VOLUMES_PER_TOKEN_MAX {
            return Err(AccessError::Invalid(format!("a token names at most {VOLUMES_PER_TOKEN_MAX} volumes")));
        }
        if let Some(volume) = spec.volumes.iter().find(|volume| volume.is_empty() || volume.contains('@')) {
            return Err(AccessError::Invalid(format!("{volume:?} is not a volume name")));
        }
        let mut entries = self.entries.write().expect("token lock is not poisoned");
        let role = if spec.read_only { Role::ReadOnly } else { Role::ReadWrite };
        let volumes = (!spec.volumes.is_empty()).then(|| {
            let unique: BTreeSet<String> = spec.volumes.iter().cloned().collect();
            unique.into_iter().collect()
        });
        let (mut entry, token) = Self::make(&entries, String::new(), role, volumes)?;
        entry.stored.name = match &spec.name {
            Some(name) => {
                check_name(name)?;
                name.clone()
            }
            None => entry.stored.id.clone(),
        };
        let info = entry.info();
        entries.push(entry);
        if let Err(error) = self.save(&entries) {
            entries.pop();
            return Err(error);
        }
        Ok((info, token))
    }

    pub fn list(&self) -> Vec<TokenInfo> {
        self.entries.read().expect("token lock is not poisoned").iter().map(Entry::info).collect()
    }

    /// Revokes the token `id` (the admin token too: `rewind serve` makes a
    /// new one at its next start when none is left).
    pub fn revoke(&self, id: &str) -> Result<TokenInfo> {
        let mut entries = self.entries.write().expect("token lock is not poisoned");
        let Some(position) = entries.iter().position(|entry| entry.stored.id == id) else {
            return Err(AccessError::NotFound(format!("there is no token {id:?} (`rewind token list` shows them)")));
        };
        let entry = entries.remove(position);
        if let Err(error) = self.save(&entries) {
            entries.insert(position, entry);
            return Err(error);
        }
        if entry.stored.role == Role::Admin {
            // Nobody should find a revoked token and wonder why it fails.
            match std::fs::remove_file(&self.admin_path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(AccessError::Io { path: self.admin_path.clone(), source }),
            }
        }
        Ok(entry.info())
    }

    /// Who presents `token`, if it is valid.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let rest = token.strip_prefix(PREFIX)?;
        let (id, _secret) = rest.split_once('_')?;
        let presented = blake3::hash(token.as_bytes());
        let entries = self.entries.read().expect("token lock is not poisoned");
        let entry = entries.iter().find(|entry| entry.stored.id == id)?;
        // blake3::Hash compares in constant time.
        (entry.hash == presented).then(|| Principal {
            id: entry.stored.id.clone(),
            name: entry.stored.name.clone(),
            role: entry.stored.role,
            volumes: entry.volumes.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tokens_are_checked_by_hash_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::open(dir.path()).unwrap();
        let admin = tokens.ensure_admin().unwrap().expect("first start makes one");
        assert_eq!(tokens.ensure_admin().unwrap(), None, "only once");
        assert_eq!(read_admin_token(dir.path()).as_deref(), Some(admin.as_str()));
        for file in [TOKENS_FILE, ADMIN_TOKEN_FILE] {
            let mode = std::fs::metadata(dir.path().join(file)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{file}");
        }
        let stored = std::fs::read_to_string(dir.path().join(TOKENS_FILE)).unwrap();
        assert!(!stored.contains(&admin), "tokens.json holds hashes only");

        let spec = TokenSpec { name: Some("ci".into()), read_only: true, volumes: vec!["db".into()] };
        let (info, token) = tokens.create(&spec).unwrap();
        assert_eq!(info.role, Role::ReadOnly);
        let reopened = Tokens::open(dir.path()).unwrap();
        let principal = reopened.authenticate(&token).expect("valid");
        assert_eq!(principal.role, Role::ReadOnly);
        assert!(principal.may_see("db") && !principal.may_see("other"));
        assert_eq!(reopened.authenticate(&admin).unwrap().role, Role::Admin);

        let mut wrong = token.clone();
        wrong.pop();
        wrong.push(if token.ends_with('0') { '1' } else { '0' });
        assert_eq!(reopened.authenticate(&wrong), None);
        assert_eq!(reopened.authenticate(""), None);
        assert_eq!(reopened.authenticate("rewind_"), None);

        reopened.revoke(&info.id).unwrap();
        assert_eq!(reopened.authenticate(&token), None);
        assert!(Tokens::open(dir.path()).unwrap().authenticate(&token).is_none(), "revocation is durable");
    }
}
