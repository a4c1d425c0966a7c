//! The node's file trees, each opened once and shared by everything that
//! serves or changes it (NFS, the API): a `Tree` keeps its present in
//! memory, so two of one volume would each miss the other's changes. Views
//! of the past are opened once and kept while used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use jiff::tz::TimeZone;
use parking_lot::Mutex;
use rewind_engine::{EngineError, Node, VolumeKind};
use rewind_types::Timestamp;
use rustc_hash::FxHashMap;

use crate::Mirror;
use crate::{Tree, TreeError, TreeView};

/// Views kept open per tree; the least recently used goes first.
const VIEWS_OPEN_MAX: usize = 64;
/// How many sweeps (`Trees::close_idle_views`) a view nobody uses stays
/// open: `rewind serve` sweeps before each history pass, about once a
/// second. (Counted in sweeps, not read from a clock: the core reads none.)
pub const VIEW_IDLE_SWEEPS: u64 = 10;

/// A tree's identity, stable across restarts and different for a tree
/// deleted and made again under its name: a hash of its name and creation
/// time (NFS puts it in file handles and reports it as the fsid).
pub fn tree_id(name: &str, created: Timestamp) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(name.as_bytes());
    hasher.update(&created.unix_nanos().to_le_bytes());
    u64::from_le_bytes(hasher.finalize().as_bytes()[..8].try_into().expect("8 bytes"))
}

/// One open tree.
pub struct OpenTree {
    pub id: u64,
    pub name: String,
    pub tree: Tree,
    /// Set when the tree mirrors an upstream server through a proxy: its
    /// present is the upstream's, changed only by the proxy.
    mirror: Mutex<Option<Weak<dyn Mirror>>>,
    /// (time, view, the sweep it was last used in), most recently used
    /// last. An open view holds its time in history (retention and the
    /// space cap keep it), so views nobody uses are closed; a handle into
    /// one opens it again, or is stale if that time is gone by then.
    views: Mutex<Vec<(Timestamp, Arc<TreeView>, u64)>>,
    sweeps: AtomicU64,
}

impl OpenTree {
    /// Makes the tree `mirror`'s; false while another mirror has it.
    pub fn set_mirror(&self, mirror: Weak<dyn Mirror>) -> bool {
        let mut current = self.mirror.lock();
        if current.as_ref().is_some_and(|current| current.strong_count() > 0) {
            return false;
        }
        *current = Some(mirror);
        true
    }

    /// What keeps the tree in step with an upstream server, if anything.
    pub fn mirror(&self) -> Option<Arc<dyn Mirror>> {
        self.mirror.lock().as_ref()?.upgrade()
    }

    /// The view at exactly `at` (a time a handle carries), at or before `now`.
    pub fn view(&self, at: Timestamp, now: Timestamp) -> Result<Arc<TreeView>, TreeError> {
        let mut views = self.views.lock();
        let sweep = self.sweeps.load(Ordering::Relaxed);
        if let Some(position) = views.iter().position(|(time, _, _)| *time == at) {
            let (_, view, _) = views.remove(position);
            views.push((at, Arc::clone(&view), sweep));
            return Ok(view);
        }
        let view = Arc::new(self.tree.view_exactly(at, now)?);
        if views.len() >= VIEWS_OPEN_MAX {
            views.remove(0);
        }
        views.push((at, Arc::clone(&view), sweep));
        Ok(view)
    }

    fn close_idle_views(&self, idle_sweeps: u64) {
        let mut views = self.views.lock();
        let sweep = self.sweeps.fetch_add(1, Ordering::Relaxed) + 1;
        views.retain(|(_, _, used)| sweep - used < idle_sweeps);
    }

    /// The exact time `text` names (a bookmark, RFC 3339, Unix time, "-10m"
    /// …, percent-encoded or not), for `.rewind/TEXT` and `TREE@TEXT`.
    pub fn resolve(&self, text: &str, now: Timestamp, zone: &TimeZone) -> Result<Timestamp, TreeError> {
        let decoded = percent_decode(text).ok_or_else(|| TreeError::Invalid(format!("{text:?}: bad % escape")))?;
        let volume = self.tree.volume();
        let at = volume.parse_time(&decoded, now, zone)?;
        // The exact point a view there shows (granularity may round it down).
        Ok(self.tree.view(at)?.at())
    }
}

/// Decodes `%XX` escapes; `None` if one is malformed or the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = std::str::from_utf8(bytes.get(index + 1..index + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The node's trees.
pub struct Trees {
    node: Arc<Node>,
    open: Mutex<FxHashMap<u64, Arc<OpenTree>>>,
}

impl Trees {
    pub fn new(node: Arc<Node>) -> Trees {
        Trees { node, open: Mutex::new(FxHashMap::default()) }
    }

    /// The names of the node's trees.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .node
            .volumes()
            .iter()
            .filter(|volume| volume.kind() == VolumeKind::Tree)
            .map(|volume| volume.name().to_string())
            .collect();
        names.sort();
        names
    }

    /// The tree called `name`; `now` formats a new one.
    pub fn by_name(&self, name: &str, now: Timestamp) -> Result<Arc<OpenTree>, TreeError> {
        let volume = match self.node.volume(name) {
            Ok(volume) if volume.kind() == VolumeKind::Tree => volume,
            Ok(_) | Err(EngineError::VolumeNotFound(_)) => return Err(TreeError::NotFound),
            Err(error) => return Err(error.into()),
        };
        let id = tree_id(name, volume.created());
        let mut open = self.open.lock();
        if let Some(tree) = open.get(&id) {
            // (The same volume: a tree deleted and made again has another id.)
            return Ok(Arc::clone(tree));
        }
        let tree = Arc::new(OpenTree {
            id,
            name: name.to_owned(),
            tree: Tree::open(volume, now)?,
            mirror: Mutex::new(None),
            views: Mutex::new(Vec::new()),
            sweeps: AtomicU64::new(0),
        });
        open.insert(id, Arc::clone(&tree));
        Ok(tree)
    }

    /// The tree with this id, or `Stale` if it is gone.
    pub fn by_id(&self, id: u64, now: Timestamp) -> Result<Arc<OpenTree>, TreeError> {
        if let Some(tree) = self.open.lock().get(&id) {
            if self.node.volume(&tree.name).is_ok_and(|volume| tree_id(&tree.name, volume.created()) == id) {
                return Ok(Arc::clone(tree));
            }
        }
        for name in self.names() {
            if let Ok(tree) = self.by_name(&name, now) {
                if tree.id == id {
                    return Ok(tree);
                }
            }
        }
        Err(TreeError::Stale)
    }

    /// One sweep: closes the views of every open tree that nobody used in
    /// the last `idle_sweeps` sweeps, so that they stop holding their times
    /// in history. The server sweeps before each retention pass.
    pub fn close_idle_views(&self, idle_sweeps: u64) {
        let open: Vec<Arc<OpenTree>> = self.open.lock().values().cloned().collect();
        for tree in open {
            tree.close_idle_views(idle_sweeps);
        }
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_escapes_decode_and_bad_ones_are_refused() {
        assert_eq!(percent_decode("2026-11-23T10%3A00%3A00Z").as_deref(), Some("2026-11-23T10:00:00Z"));
        assert_eq!(percent_decode("-10m").as_deref(), Some("-10m"));
        assert_eq!(percent_decode("10%20minutes%20ago").as_deref(), Some("10 minutes ago"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }
}
