//! Log lines a client can cause, limited per client.
//!
//! Anything a client can make the server log — a line per invalid request,
//! per failed request, per connection opened and closed — is a way to fill
//! the disk: before this, one unauthenticated client wrote 1.08 M warnings
//! (729 MB) in six minutes. So every such line goes through a budget:
//!
//! - each client (TCP: its IP address; Unix socket: its user id) may cause
//!   `ServeConfig::log_lines_per_client` lines per
//!   `ServeConfig::log_interval`, however many connections it opens;
//! - all clients together at most `ALL_CLIENTS_FACTOR` times that, so many
//!   addresses cannot multiply the rate without bound either;
//! - what is held back is counted, and one line per client and interval
//!   says how much: "suppressed 51234 log lines about 127.0.0.1 in the last
//!   60 s". It comes with the client's next line after its interval ended,
//!   or when the accept loop sweeps (once per interval), or at shutdown —
//!   not when a connection closes, or a client reconnecting in a loop
//!   would get a summary per connection.
//!
//! So the log grows by at most `(lines_per_client + 1)` lines per client
//! and interval, and `lines_per_client * ALL_CLIENTS_FACTOR` plus one
//! summary per tracked client in all. Clients are tracked while they have
//! connections and until their interval ends; at most `PEERS_TRACKED_MAX`
//! of them, beyond which the rest share one budget.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::warn;

/// All clients together may log this many times what one may.
pub const ALL_CLIENTS_FACTOR: u32 = 10;

/// Most clients with a budget of their own; more share `PeerKey::Others`.
/// Each costs a map entry of under a hundred bytes.
const PEERS_TRACKED_MAX: usize = 4096;

/// Who a budget belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerKey {
    Ip(IpAddr),
    /// A Unix socket peer, by its user id.
    Uid(u32),
    /// A Unix socket peer whose credentials could not be read.
    Unix,
    /// Everyone beyond `PEERS_TRACKED_MAX`.
    Others,
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerKey::Ip(ip) => write!(f, "{ip}"),
            PeerKey::Uid(uid) => write!(f, "Unix socket user {uid}"),
            PeerKey::Unix => f.write_str("Unix socket users"),
            PeerKey::Others => f.write_str("other clients"),
        }
    }
}

struct Bucket {
    window_start: Instant,
    lines: u32,
    suppressed: u64,
    /// Live connections holding a `PeerLog` for this key.
    connections: u32,
}

impl Bucket {
    fn new(now: Instant) -> Bucket {
        Bucket { window_start: now, lines: 0, suppressed: 0, connections: 0 }
    }
}

/// A summary due: `suppressed` lines about `peer` over `elapsed`.
struct Summary {
    peer: PeerKey,
    suppressed: u64,
    elapsed: Duration,
}

impl Summary {
    fn emit(self, lines_per_client: u32, interval: Duration) {
        warn!(
            peer = %self.peer,
            suppressed = self.suppressed,
            "suppressed {} log lines about {} in the last {} s (at most {lines_per_client} per client every {} s)",
            self.suppressed,
            self.peer,
            self.elapsed.as_secs().max(1),
            interval.as_secs().max(1),
        );
    }
}

struct State {
    peers: HashMap<PeerKey, Bucket>,
    all_window_start: Instant,
    all_lines: u32,
}

/// The server's log budget; see the module doc.
pub struct LogBudget {
    interval: Duration,
    lines_per_client: u32,
    lines_all: u32,
    state: Mutex<State>,
}

impl LogBudget {
    pub fn new(interval: Duration, lines_per_client: u32) -> LogBudget {
        assert!(!interval.is_zero());
        let now = Instant::now();
        LogBudget {
            interval,
            lines_per_client,
            lines_all: lines_per_client.saturating_mul(ALL_CLIENTS_FACTOR),
            state: Mutex::new(State { peers: HashMap::new(), all_window_start: now, all_lines: 0 }),
        }
    }

    /// A handle for one connection of `peer`, which keeps the peer's budget
    /// while the connection lives.
    pub fn connection(self: &Arc<Self>, peer: PeerKey) -> PeerLog {
        let mut state = self.state.lock();
        let key = Self::key(&state, peer);
        state.peers.entry(key).or_insert_with(|| Bucket::new(Instant::now())).connections += 1;
        PeerLog { budget: Arc::clone(self), key }
    }

    /// Whether a line about `peer` may be logged now (for peers without a
    /// connection, such as refused ones).
    pub fn allow(&self, peer: PeerKey) -> bool {
        let (allowed, summary) = {
            let mut state = self.state.lock();
            let key = Self::key(&state, peer);
            self.take(&mut state, key, Instant::now())
        };
        if let Some(summary) = summary {
            summary.emit(self.lines_per_client, self.interval);
        }
        allowed
    }

    /// Summarises what each client's ended interval held back, and forgets
    /// clients with no connection whose interval has ended. Call at least
    /// once per interval.
    pub fn sweep(&self) {
        self.summarise(Instant::now(), self.interval);
    }

    /// Summarises what was held back, interval ended or not (at shutdown).
    pub fn flush(&self) {
        self.summarise(Instant::now(), Duration::ZERO);
    }

    fn summarise(&self, now: Instant, interval: Duration) {
        let mut summaries = Vec::new();
        {
            let mut state = self.state.lock();
            state.peers.retain(|&peer, bucket| {
                let elapsed = now.saturating_duration_since(bucket.window_start);
                if elapsed < interval {
                    return true;
                }
                if bucket.suppressed > 0 {
                    summaries.push(Summary { peer, suppressed: bucket.suppressed, elapsed });
                }
                *bucket = Bucket { connections: bucket.connections, ..Bucket::new(now) };
                bucket.connections > 0
            });
        }
        for summary in summaries {
            summary.emit(self.lines_per_client, self.interval);
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    fn key(state: &State, peer: PeerKey) -> PeerKey {
        if state.peers.contains_key(&peer) || state.peers.len() < PEERS_TRACKED_MAX {
            peer
        } else {
            PeerKey::Others
        }
    }

    /// Takes one line from `key`'s budget and the shared one, if both have
    /// one left; returns a summary due because `key`'s interval ended.
    fn take(&self, state: &mut State, key: PeerKey, now: Instant) -> (bool, Option<Summary>) {
        if now.saturating_duration_since(state.all_window_start) >= self.interval {
            state.all_window_start = now;
            state.all_lines = 0;
        }
        let all_left = state.all_lines < self.lines_all;
        let bucket = state.peers.entry(key).or_insert_with(|| Bucket::new(now));
        let mut summary = None;
        let elapsed = now.saturating_duration_since(bucket.window_start);
        if elapsed >= self.interval {
            if bucket.suppressed > 0 {
                summary = Some(Summary { peer: key, suppressed: bucket.suppressed, elapsed });
            }
            *bucket = Bucket { connections: bucket.connections, ..Bucket::new(now) };
        }
        let allowed = all_left && bucket.lines < self.lines_per_client;
        if allowed {
            bucket.lines += 1;
            state.all_lines += 1;
        } else {
            bucket.suppressed += 1;
        }
        (allowed, summary)
    }
}

/// One connection's way to its client's log budget.
pub struct PeerLog {
    budget: Arc<LogBudget>,
    key: PeerKey,
}

impl PeerLog {
    /// For a line at INFO: `if log.allow_info() { info!(…) }`. When INFO is
    /// filtered out the line neither spends the budget nor is counted as
    /// suppressed, so an operator logging warnings only is not told of
    /// lines held back that would never have been shown.
    pub fn allow_info(&self) -> bool {
        tracing::enabled!(tracing::Level::INFO) && self.allow()
    }

    /// Whether a line about this client may be logged now. Use as
    /// `if log.allow() { warn!(…) }`.
    pub fn allow(&self) -> bool {
        let (allowed, summary) = {
            let mut state = self.budget.state.lock();
            self.budget.take(&mut state, self.key, Instant::now())
        };
        if let Some(summary) = summary {
            summary.emit(self.budget.lines_per_client, self.budget.interval);
        }
        allowed
    }
}

impl Clone for PeerLog {
    /// Another handle for the same connection (the TLS part of it, say);
    /// the client's bucket lives until every handle is gone.
    fn clone(&self) -> PeerLog {
        let mut state = self.budget.state.lock();
        state.peers.get_mut(&self.key).expect("a PeerLog's bucket lives as long as it does").connections += 1;
        PeerLog { budget: Arc::clone(&self.budget), key: self.key }
    }
}

impl Drop for PeerLog {
    fn drop(&mut self) {
        // The bucket stays until the sweep after its interval ends, so a
        // client reconnecting does not get a fresh budget.
        let mut state = self.budget.state.lock();
        let bucket = state.peers.get_mut(&self.key).expect("a PeerLog's bucket lives as long as it does");
        bucket.connections -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_its_lines_then_the_rest_is_counted() {
        let budget = Arc::new(LogBudget::new(Duration::from_secs(3600), 3));
        let peer = PeerKey::Ip("192.0.2.1".parse().unwrap());
        let log = budget.connection(peer);
        let second = budget.connection(peer);
        let allowed = (0..100).filter(|i| if i % 2 == 0 { log.allow() } else { second.allow() }).count();
        assert_eq!(allowed, 3, "two connections share one client's budget");
        assert_eq!(budget.state.lock().peers[&peer].suppressed, 97);
        drop(log);
        drop(second);
        let again = budget.connection(peer);
        assert!(!again.allow(), "a reconnecting client gets no new budget");
        drop(again);
        budget.sweep();
        assert_eq!(budget.state.lock().peers[&peer].suppressed, 98, "not summarised before its interval ends");
        budget.flush();
        assert!(budget.state.lock().peers.is_empty(), "summarised and forgotten at shutdown");
    }

    #[test]
    fn clients_have_separate_budgets_within_a_shared_one() {
        let budget = Arc::new(LogBudget::new(Duration::from_secs(3600), 2));
        let allowed: usize = (0..30u8)
            .map(|i| {
                let peer = PeerKey::Ip(IpAddr::from([192, 0, 2, i]));
                (0..5).filter(|_| budget.allow(peer)).count()
            })
            .sum();
        assert_eq!(allowed, 2 * ALL_CLIENTS_FACTOR as usize);
    }

    #[test]
    fn an_ended_interval_starts_a_new_budget_and_forgets_idle_clients() {
        let budget = Arc::new(LogBudget::new(Duration::from_millis(1), 1));
        let peer = PeerKey::Uid(1000);
        assert!(budget.allow(peer));
        assert!(!budget.allow(peer));
        std::thread::sleep(Duration::from_millis(5)); // Time passing is what is tested.
        assert!(budget.allow(peer), "a new interval");
        std::thread::sleep(Duration::from_millis(5));
        budget.sweep();
        assert!(budget.state.lock().peers.is_empty());
    }

    #[test]
    fn beyond_the_tracked_clients_the_rest_share_a_budget() {
        let budget = Arc::new(LogBudget::new(Duration::from_secs(3600), 1));
        let logs: Vec<PeerLog> = (0..PEERS_TRACKED_MAX as u32)
            .map(|i| budget.connection(PeerKey::Ip(IpAddr::from(i.to_be_bytes()))))
            .collect();
        let late = budget.connection(PeerKey::Uid(1));
        assert_eq!(late.key, PeerKey::Others);
        assert_eq!(budget.state.lock().peers.len(), PEERS_TRACKED_MAX + 1);
        drop(logs);
        drop(late);
    }
}
