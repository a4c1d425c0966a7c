//! Who is using a volume: front ends attach each client (an NBD connection
//! to the volume or to one of its views) for as long as it is connected, so
//! that deleting the volume can name them and refuse unless forced.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::Volume;

/// The clients attached to one volume, by attachment id.
#[derive(Default)]
pub(crate) struct Clients {
    next_id: Mutex<u64>,
    attached: Mutex<BTreeMap<u64, String>>,
}

/// A client attached to a volume (see [`Volume::attach`]); detached when dropped.
pub struct Attachment {
    volume: Arc<Volume>,
    id: u64,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let removed = self.volume.clients.attached.lock().remove(&self.id);
        assert!(removed.is_some(), "an attachment is removed once");
    }
}

/// Whether an operation that ends what clients see may go ahead while some
/// are attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InUse {
    /// Refuse, naming the clients.
    Refuse,
    /// Go ahead; the clients get errors from then on.
    Force,
}

impl Volume {
    /// Registers a client of this volume, described for people (e.g. "nbd
    /// 127.0.0.1:51234 (db@-1h)"), until the returned guard is dropped.
    pub fn attach(self: &Arc<Self>, client: String) -> Attachment {
        let id = {
            let mut next = self.clients.next_id.lock();
            *next += 1;
            *next
        };
        self.clients.attached.lock().insert(id, client);
        Attachment { volume: Arc::clone(self), id }
    }

    /// The clients attached now, oldest first.
    pub fn clients(&self) -> Vec<String> {
        self.clients.attached.lock().values().cloned().collect()
    }
}
