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
//! The queue is memory: if the proxy dies, the updates in it (at most the
//! bounds above) are not in history as steps of their own. The upstream
//! has them, and the next start compares the mirror with it, so the state
//! they led to is recorded then, as one point in time. Nothing the upstream
//! holds is lost; the points in time between the last recorded update and
//! the restart are.

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
    /// The updates being recorded (taken from `items`, not yet done).
    in_flight: Option<(Instant, usize)>,
    /// What creates made, for the clients waiting on them.
    created: FxHashMap<u64, Option<Handle>>,
    lag: Histogram,
    stopping: bool,
}

pub(super) struct Recorder {
    shared: Arc<(Mutex<Queue>, Condvar)>,
    updates_max: usize,
    bytes_max: usize,
}

impl Recorder {
    pub(super) fn start(proxy: Weak<Proxy>, updates_max: usize, bytes_max: usize) -> Recorder {
        assert!(updates_max > 0 && bytes_max >= crate::args::WRITE_BYTES_MAX, "a queue holds at least one WRITE");
        let shared = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("proxy-recorder".into())
            .spawn(move || record_in_order(&proxy, &worker))
            .expect("spawning the proxy's recorder");
        Recorder { shared, updates_max, bytes_max }
    }

    /// Queues an update, waiting while the queue is full. Returns its ticket.
    pub(super) fn submit(&self, update: Update<'static>, made: Option<(Vec<u8>, Fattr)>, author: Caller) -> u64 {
        let (queue, changed) = &*self.shared;
        let mut queue = queue.lock();
        let bytes = update.bytes();
        while !queue.items.is_empty() && (queue.items.len() >= self.updates_max || queue.bytes + bytes > self.bytes_max)
        {
            changed.wait(&mut queue);
        }
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.bytes += bytes;
        queue.items.push_back(Item { update, made, author, queued: Instant::now(), ticket });
        changed.notify_all();
        ticket
    }

    /// Waits for a create's ticket to be recorded: the mirror's object.
    pub(super) fn wait(&self, ticket: u64) -> Option<Handle> {
        let (queue, changed) = &*self.shared;
        let mut queue = queue.lock();
        while queue.recorded_below <= ticket {
            changed.wait(&mut queue);
        }
        queue.created.remove(&ticket).flatten()
    }

    /// Waits until everything queued so far is recorded.
    pub(super) fn drain(&self) {
        let (queue, changed) = &*self.shared;
        let mut queue = queue.lock();
        let last = queue.next_ticket;
        while queue.recorded_below < last {
            changed.wait(&mut queue);
        }
    }

    pub(super) fn lag(&self) -> MirrorLag {
        let queue = self.shared.0.lock();
        let oldest = queue.in_flight.map(|(queued, _)| queued).or(queue.items.front().map(|item| item.queued));
        MirrorLag {
            pending_updates: queue.items.len() + usize::from(queue.in_flight.is_some()),
            pending_bytes: queue.bytes,
            behind: oldest.map_or(Duration::ZERO, |queued| queued.elapsed()),
            recorded: queue.lag.count,
            mean: queue.lag.total.checked_div(queue.lag.count.max(1) as u32).unwrap_or_default(),
            p99: queue.lag.p99(),
            max: queue.lag.max,
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let (queue, changed) = &*self.shared;
        queue.lock().stopping = true;
        changed.notify_all();
    }
}

fn record_in_order(proxy: &Weak<Proxy>, shared: &(Mutex<Queue>, Condvar)) {
    let (queue, changed) = shared;
    loop {
        let item = {
            let mut queue = queue.lock();
            loop {
                if queue.stopping {
                    return;
                }
                if let Some(item) = queue.items.pop_front() {
                    queue.in_flight = Some((item.queued, item.update.bytes()));
                    break item;
                }
                changed.wait(&mut queue);
            }
        };
        let Some(proxy) = proxy.upgrade() else { return };
        let made = item.made.as_ref().map(|(fh, fattr)| (&fh[..], fattr));
        let created = proxy.record_or_resync(&item.update, made, &item.author);
        drop(proxy);
        let mut queue = queue.lock();
        queue.in_flight = None;
        queue.bytes -= item.update.bytes();
        queue.lag.observe(item.queued.elapsed());
        if item.made.is_some() {
            queue.created.insert(item.ticket, created);
        }
        queue.recorded_below = item.ticket + 1;
        changed.notify_all();
    }
}
