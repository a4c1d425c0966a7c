//! NBD access grants: which client identity may open which volume, and how.
//!
//! An identity is the common name (CN) of a client's verified TLS
//! certificate, or [`ANYONE`] (`*`), which matches every client that reaches
//! the export, with a certificate or without. A grant on a volume covers its
//! views (`VOLUME@TIME`, always read-only); a read-only grant opens the live
//! volume read-only. When grants apply at all is the NBD catalog's policy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};

use crate::{file, AccessError, Result};

pub const GRANTS_FILE: &str = "access.json";
/// The identity that matches every client.
pub const ANYONE: &str = "*";
const FORMAT: u32 = 1;
const IDENTITY_BYTES_MAX: usize = 1024;
const VOLUME_BYTES_MAX: usize = 255;
const GRANTS_MAX: usize = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Views, and the live volume opened read-only.
    ReadOnly,
    /// The live volume writable, and views.
    ReadWrite,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::ReadOnly => "read-only",
            Access::ReadWrite => "read-write",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantInfo {
    pub volume: String,
    pub identity: String,
    pub access: Access,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsFile {
    format: u32,
    grants: Vec<GrantInfo>,
}

type Table = BTreeMap<(String, String), Access>;

/// The node's NBD access grants.
pub struct Grants {
    path: PathBuf,
    table: RwLock<Table>,
}

fn check(volume: &str, identity: &str) -> Result<()> {
    if volume.is_empty() || volume.len() > VOLUME_BYTES_MAX || volume.contains('@') {
        return Err(AccessError::Invalid(format!("{volume:?} is not a volume name")));
    }
    if identity.is_empty() || identity.len() > IDENTITY_BYTES_MAX || identity.chars().any(char::is_control) {
        return Err(AccessError::Invalid(format!(
            "identity {identity:?} must be 1 to {IDENTITY_BYTES_MAX} bytes without control characters \
             (a client certificate's common name, or * for anyone)"
        )));
    }
    Ok(())
}

impl Grants {
    /// Reads `access.json` in `data_dir` (none yet: no grants).
    pub fn open(data_dir: &Path) -> Result<Grants> {
        let path = data_dir.join(GRANTS_FILE);
        let mut table = Table::new();
        if let Some(bytes) = file::read(&path)? {
            let damaged = |reason: String| AccessError::Damaged { path: path.clone(), reason };
            let parsed: GrantsFile = serde_json::from_slice(&bytes).map_err(|error| damaged(error.to_string()))?;
            if parsed.format != FORMAT {
                return Err(damaged(format!("format {} is not {FORMAT}; a newer Rewind wrote it?", parsed.format)));
            }
            for GrantInfo { volume, identity, access } in parsed.grants {
                check(&volume, &identity).map_err(|error| damaged(error.to_string()))?;
                table.insert((volume, identity), access);
            }
        }
        Ok(Grants { path, table: RwLock::new(table) })
    }

    fn save(&self, table: &Table) -> Result<()> {
        let grants = table
            .iter()
            .map(|((volume, identity), access)| GrantInfo {
                volume: volume.clone(),
                identity: identity.clone(),
                access: *access,
            })
            .collect();
        let mut bytes = serde_json::to_vec_pretty(&GrantsFile { format: FORMAT, grants }).expect("grants serialize");
        bytes.push(b'\n');
        file::write(&self.path, &bytes)
    }

    /// Grants `identity` `access` to `volume`, replacing what it had.
    pub fn grant(&self, volume: &str, identity: &str, access: Access) -> Result<GrantInfo> {
        check(volume, identity)?;
        let mut table = self.table.write().expect("grant lock is not poisoned");
        let key = (volume.to_owned(), identity.to_owned());
        if !table.contains_key(&key) && table.len() >= GRANTS_MAX {
            return Err(AccessError::Invalid(format!("there are {GRANTS_MAX} grants already; revoke some first")));
        }
        let previous = table.insert(key.clone(), access);
        if let Err(error) = self.save(&table) {
            match previous {
                Some(previous) => table.insert(key, previous),
                None => table.remove(&key),
            };
            return Err(error);
        }
        Ok(GrantInfo { volume: volume.to_owned(), identity: identity.to_owned(), access })
    }

    pub fn revoke(&self, volume: &str, identity: &str) -> Result<GrantInfo> {
        let mut table = self.table.write().expect("grant lock is not poisoned");
        let key = (volume.to_owned(), identity.to_owned());
        let Some(access) = table.remove(&key) else {
            return Err(AccessError::NotFound(format!(
                "{identity:?} has no grant on volume {volume:?} (`rewind access list` shows the grants)"
            )));
        };
        if let Err(error) = self.save(&table) {
            table.insert(key, access);
            return Err(error);
        }
        Ok(GrantInfo { volume: volume.to_owned(), identity: identity.to_owned(), access })
    }

    /// Every grant, by volume then identity.
    pub fn list(&self) -> Vec<GrantInfo> {
        let table = self.table.read().expect("grant lock is not poisoned");
        table
            .iter()
            .map(|((volume, identity), access)| GrantInfo {
                volume: volume.clone(),
                identity: identity.clone(),
                access: *access,
            })
            .collect()
    }

    /// The most `identity` (or an anonymous client, `None`) may do with
    /// `volume`: its own grant or the one for anyone, whichever is more.
    pub fn lookup(&self, volume: &str, identity: Option<&str>) -> Option<Access> {
        let table = self.table.read().expect("grant lock is not poisoned");
        let get = |who: &str| table.get(&(volume.to_owned(), who.to_owned())).copied();
        let own = identity.and_then(get);
        let anyone = get(ANYONE);
        own.max(anyone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_match_identity_or_anyone_and_persist() {
        let dir = tempfile::tempdir().unwrap();
        let grants = Grants::open(dir.path()).unwrap();
        assert_eq!(grants.lookup("db", Some("alice")), None, "nothing by default");
        grants.grant("db", "alice", Access::ReadWrite).unwrap();
        grants.grant("db", "bob", Access::ReadOnly).unwrap();
        grants.grant("logs", ANYONE, Access::ReadOnly).unwrap();
        let reopened = Grants::open(dir.path()).unwrap();
        assert_eq!(reopened.lookup("db", Some("alice")), Some(Access::ReadWrite));
        assert_eq!(reopened.lookup("db", Some("bob")), Some(Access::ReadOnly));
        assert_eq!(reopened.lookup("db", Some("carol")), None);
        assert_eq!(reopened.lookup("db", None), None);
        assert_eq!(reopened.lookup("logs", None), Some(Access::ReadOnly));
        assert_eq!(reopened.lookup("logs", Some("carol")), Some(Access::ReadOnly));
        reopened.revoke("db", "alice").unwrap();
        assert!(reopened.revoke("db", "alice").is_err());
        assert_eq!(Grants::open(dir.path()).unwrap().lookup("db", Some("alice")), None);
        assert!(grants.grant("db@x", "alice", Access::ReadOnly).is_err());
        assert!(grants.grant("db", "", Access::ReadOnly).is_err());
    }
}
