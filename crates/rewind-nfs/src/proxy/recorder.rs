//! UCDP-A: the mirror records behind the upstream. Updates the upstream
//! has applied (and the client has been answered for) wait in a queue that
//! one thread records, in order.
//!
//! # The lag, bounded
//!
//! The queue holds at most `updates_max` updates and `bytes_max` bytes of
//! WRITE data; a client whose update would overflow it waits (so the lag
//! is at most what the recorder does with a full queue: at the journal's
//! speed, well under a second for the defaults). Creates wait for the
//! recorder to reach them, because the handle the client gets is the
//! mirror's.
//!
//! # What a crash loses
//!
//! The queue is memory, and what the recorder wrote reaches the disk with
//! the journal's next flush (the volume's commit interval), not before the
//! client is answered: if the proxy dies, the updates queued and those
//! recorded since the last flush are not in history as steps of their own.
//! The upstream has them, and the next start compares the mirror with it,
//! so the state they led to is recorded then, as one point in time. Nothing
//! the upstream holds is lost; the points in time between the last flushed
//! record and the restart are.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rewind_tree::{Caller, Handle, MirrorLag};
use rustc_hash::FxHashMap;

use super::upstream::Fattr;
use super::Proxy;
use crate::update::Update;

/// How the proxy records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Each update is recorded before the client is answered (UCDP-O).
    Synchronous,
    /// Answered at once, recorded by a queue of at most this many updates
    /// and bytes (UCDP-A).
    Asynchronous { updates_max: usize, bytes_max: usize },
}

/// Queue-to-record times in buckets of powers of two of microseconds.
#[derive(Default)]
struct Histogram {
    buckets: [u64; 32],
    total: Duration,
    count: u64,
    max: Duration,
}

impl Histogram {
    fn observe(&mut self, lag: Duration) {
        let micros = lag.as_micros().max(1) as u64;
        self.buckets[(63 - micros.leading_zeros() as usize).min(31)] += 1;
        self.total += lag;
        self.count += 1;
        self.max = self.max.max(lag);
    }

    /// The upper bound of the bucket holding the 99th percentile.
    fn p99(&self) -> Duration {
        let wanted = self.count - self.count / 100;
        let mut seen = 0;
        for (bucket, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= wanted && *count > 0 {
                return Duration::from_micros(2u64 << bucket).min(self.max);
            }
        }
        self.max
    }
}

struct Item {
    update: Update<'static>,
    made: Option<(Vec<u8>, Fattr)>,
    author: Caller,
    queued: Instant,
    ticket: u64,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    bytes: usize,
    next_ticket: u64,
    /// Every ticket below this is recorded.
    recorded_below: u64,
    /// When the update being recorded was queued.
    in_flight: Option<Instant>,
    /// Clients waiting for room.
    waiting: usize,
    /// What creates made, for the clients waiting on them.
    created: FxHashMap<u64, Option<Handle>>,
    lag: Histogram,
    stopping: bool,
}

/// The queue and its bounds, shared by the clients' threads and the recorder's.
struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
    updates_max: usize,
    bytes_max: usize,
}

impl Shared {
    fn new(updates_max: usize, bytes_max: usize) -> Shared {
        assert!(updates_max > 0 && bytes_max >= crate::args::WRITE_BYTES_MAX, "a queue holds at least one WRITE");
        Shared { queue: Mutex::new(Queue::default()), changed: Condvar::new(), updates_max, bytes_max }
    }

    /// Queues an update, waiting while the queue is full. Returns its ticket.
    fn submit(&self, update: Update<'static>, made: Option<(Vec<u8>, Fattr)>, author: Caller) -> u64 {
        let mut queue = self.queue.lock();
        let bytes = update.bytes();
        while !queue.items.is_empty() && (queue.items.len() >= self.updates_max || queue.bytes + bytes > self.bytes_max)
        {
            queue.waiting += 1;
            self.changed.notify_all();
            self.changed.wait(&mut queue);
            queue.waiting -= 1;
        }
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.bytes += bytes;
        queue.items.push_back(Item { update, made, author, queued: Instant::now(), ticket });
        self.changed.notify_all();
        ticket
    }

    /// The next update to record, in order; `None` once stopping.
    fn take(&self) -> Option<Item> {
        let mut queue = self.queue.lock();
        loop {
            if queue.stopping {
                return None;
            }
            if let Some(item) = queue.items.pop_front() {
                queue.in_flight = Some(item.queued);
                // Room for a waiting client.
                self.changed.notify_all();
                return Some(item);
            }
            self.changed.wait(&mut queue);
        }
    }

    /// `item` is recorded (`created`: what a create made).
    fn finish(&self, item: &Item, created: Option<Handle>) {
        let mut queue = self.queue.lock();
        queue.in_flight = None;
        queue.bytes -= item.update.bytes();
        queue.lag.observe(item.queued.elapsed());
        if item.made.is_some() {
            queue.created.insert(item.ticket, created);
        }
        queue.recorded_below = item.ticket + 1;
        self.changed.notify_all();
    }

    /// Waits for a create's ticket to be recorded: the mirror's object.
    fn wait(&self, ticket: u64) -> Option<Handle> {
        let mut queue = self.queue.lock();
        while queue.recorded_below <= ticket {
            self.changed.wait(&mut queue);
        }
        queue.created.remove(&ticket).flatten()
    }

    /// Waits until everything queued so far is recorded.
    fn drain(&self) {
        let mut queue = self.queue.lock();
        let last = queue.next_ticket;
        while queue.recorded_below < last {
            self.changed.wait(&mut queue);
        }
    }

    fn lag(&self) -> MirrorLag {
        let queue = self.queue.lock();
        let oldest = queue.in_flight.or(queue.items.front().map(|item| item.queued));
        MirrorLag {
            pending_updates: queue.items.len() + usize::from(queue.in_flight.is_some()),
            pending_bytes: queue.bytes,
            waiting_clients: queue.waiting,
            behind: oldest.map_or(Duration::ZERO, |queued| queued.elapsed()),
            recorded: queue.lag.count,
            mean: queue.lag.total.checked_div(queue.lag.count.max(1) as u32).unwrap_or_default(),
            p99: queue.lag.p99(),
            max: queue.lag.max,
        }
    }
}

/// The queue, and the thread that records it.
pub(super) struct Recorder {
    shared: Arc<Shared>,
}

impl Recorder {
    pub(super) fn start(proxy: Weak<Proxy>, updates_max: usize, bytes_max: usize) -> Recorder {
        let shared = Arc::new(Shared::new(updates_max, bytes_max));
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("proxy-recorder".into())
            .spawn(move || {
                while let Some(item) = worker.take() {
                    let Some(proxy) = proxy.upgrade() else { return };
                    let made = item.made.as_ref().map(|(fh, fattr)| (&fh[..], fattr));
                    let created = proxy.record_or_resync(&item.update, made, &item.author);
                    drop(proxy);
                    worker.finish(&item, created);
                }
            })
            .expect("spawning the proxy's recorder");
        Recorder { shared }
    }

    pub(super) fn submit(&self, update: Update<'static>, made: Option<(Vec<u8>, Fattr)>, author: Caller) -> u64 {
        self.shared.submit(update, made, author)
    }

    pub(super) fn wait(&self, ticket: u64) -> Option<Handle> {
        self.shared.wait(ticket)
    }

    pub(super) fn drain(&self) {
        self.shared.drain()
    }

    pub(super) fn lag(&self) -> MirrorLag {
        self.shared.lag()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.shared.queue.lock().stopping = true;
        self.shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn write(bytes: usize) -> Update<'static> {
        let data = Cow::Owned(vec![0; bytes]);
        Update::Write { file: Cow::Owned(vec![1; 32]), offset: 0, data, stability: rewind_tree::Stability::Unstable }
    }

    /// A client whose update would overflow the queue waits until the
    /// recorder takes one: the queue never holds more than its bounds.
    #[test]
    fn a_full_queue_makes_the_next_client_wait_for_the_recorder() {
        let shared = Arc::new(Shared::new(3, 1 << 20));
        for _ in 0..3 {
            shared.submit(write(1), None, Caller::root([0; 16], 0));
        }
        let client = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || shared.submit(write(1), None, Caller::root([0; 16], 0)))
        };
        let mut queue = shared.queue.lock();
        while queue.waiting == 0 {
            shared.changed.wait(&mut queue);
        }
        assert_eq!(queue.items.len(), 3, "the fourth waits");
        drop(queue);
        let first = shared.take().unwrap();
        assert_eq!(first.ticket, 0, "in order");
        assert_eq!(client.join().unwrap(), 3, "taken in once there was room");
        assert_eq!(shared.lag().pending_updates, 4, "three queued, one being recorded");
        shared.finish(&first, None);
        assert_eq!(shared.lag().recorded, 1);

        // Bytes bound it too: a WRITE that would pass them waits for room.
        let shared = Arc::new(Shared::new(100, 1 << 20));
        shared.submit(write(700 << 10), None, Caller::root([0; 16], 0));
        let client = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || shared.submit(write(700 << 10), None, Caller::root([0; 16], 0)))
        };
        let mut queue = shared.queue.lock();
        while queue.waiting == 0 {
            shared.changed.wait(&mut queue);
        }
        assert_eq!(queue.bytes, 700 << 10);
        drop(queue);
        let first = shared.take().unwrap();
        shared.finish(&first, None);
        assert_eq!(client.join().unwrap(), 1);
    }
}
