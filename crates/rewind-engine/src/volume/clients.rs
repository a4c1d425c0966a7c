//! Who is using a volume: front ends attach each client (an NBD connection
//! to the volume or to one of its views) for as long as it is connected, so
//! that deleting the volume can name them and refuse unless forced, and a
//! revert can name the writers — or cut them off.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use rewind_types::Timestamp;

use crate::{Durability, EngineError, Volume, ZeroMode};

/// How a client uses the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The live volume, which it may write.
    Live,
    /// A read-only view of a point in time, which a revert does not change.
    View,
}

struct Client {
    description: String,
    role: Role,
    /// Set when the client is cut off (see [`Attachment::is_cut_off`]).
    cut_off: Arc<AtomicBool>,
    /// Ends the client's connection when it is cut off, if the front end
    /// gave a way (see [`Attachment::on_cut_off`]).
    hang_up: Option<HangUp>,
}

/// Ends a client's connection: it stops reading requests, answers those in
/// flight (which fail, as the client is cut off) and closes.
pub type HangUp = Box<dyn FnOnce() + Send>;

/// The clients attached to one volume, by attachment id.
#[derive(Default)]
pub(crate) struct Clients {
    next_id: Mutex<u64>,
    attached: Mutex<BTreeMap<u64, Client>>,
}

/// A client attached to a volume (see [`Volume::attach`]); detached when dropped.
pub struct Attachment {
    volume: Arc<Volume>,
    id: u64,
    cut_off: Arc<AtomicBool>,
}

impl Attachment {
    /// The volume changed under this client (a revert it was cut off by):
    /// its requests must fail from now on, so that it reconnects.
    pub fn is_cut_off(&self) -> bool {
        self.cut_off.load(Ordering::Acquire)
    }

    pub(crate) fn volume(&self) -> &Volume {
        &self.volume
    }

    /// Writes to the live volume as this client: fails, having written
    /// nothing, once a revert cut it off — even a write that was already
    /// waiting when the revert was made (see [`Volume::write`]).
    pub fn write(&self, now: Timestamp, offset: u64, data: &[u8], durability: Durability) -> Result<(), EngineError> {
        self.volume.write_by(Some(&self.cut_off), now, offset, data, durability)
    }

    /// Zeroes as this client (see [`Attachment::write`] and [`Volume::zero`]).
    pub fn zero(
        &self,
        now: Timestamp,
        offset: u64,
        length: u64,
        mode: ZeroMode,
        durability: Durability,
    ) -> Result<(), EngineError> {
        self.volume.zero_by(Some(&self.cut_off), now, offset, length, mode, durability)
    }

    /// How to end this client's connection when it is cut off — at once if
    /// it already is.
    pub fn on_cut_off(&self, hang_up: HangUp) {
        let mut attached = self.volume.clients.attached.lock();
        let client = attached.get_mut(&self.id).expect("an attachment is attached until dropped");
        if client.cut_off.load(Ordering::Acquire) {
            drop(attached);
            hang_up();
        } else {
            client.hang_up = Some(hang_up);
        }
    }
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
    pub fn attach(self: &Arc<Self>, description: String, role: Role) -> Attachment {
        let id = {
            let mut next = self.clients.next_id.lock();
            *next += 1;
            *next
        };
        let cut_off = Arc::new(AtomicBool::new(false));
        let client = Client { description, role, cut_off: Arc::clone(&cut_off), hang_up: None };
        self.clients.attached.lock().insert(id, client);
        Attachment { volume: Arc::clone(self), id, cut_off }
    }

    /// The clients attached now, oldest first.
    pub fn clients(&self) -> Vec<String> {
        self.clients.attached.lock().values().map(|client| client.description.clone()).collect()
    }

    /// The clients of the live volume (not of views), oldest first.
    pub(crate) fn live_clients(&self) -> Vec<String> {
        let attached = self.clients.attached.lock();
        attached.values().filter(|client| client.role == Role::Live).map(|client| client.description.clone()).collect()
    }

    /// Cuts off every client of the live volume: their requests fail from
    /// now on. Called under the write lock, so that no write of theirs
    /// waiting for it gets in after (see [`Volume::write`]); their
    /// connections are ended by [`CutOff::hang_up`], once the lock is let go.
    pub(crate) fn cut_off_live_clients(&self) -> CutOff {
        let mut attached = self.clients.attached.lock();
        let mut cut_off = CutOff::default();
        for client in attached.values_mut().filter(|client| client.role == Role::Live) {
            client.cut_off.store(true, Ordering::Release);
            cut_off.hang_ups.extend(client.hang_up.take());
            cut_off.clients.push(client.description.clone());
        }
        cut_off
    }
}

/// The clients a revert cut off.
#[derive(Default)]
pub(crate) struct CutOff {
    pub clients: Vec<String>,
    hang_ups: Vec<HangUp>,
}

impl CutOff {
    /// Ends their connections; returns who they were.
    pub fn hang_up(self) -> Vec<String> {
        self.hang_ups.into_iter().for_each(|hang_up| hang_up());
        self.clients
    }
}
