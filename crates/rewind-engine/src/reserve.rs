//! The node's reserve: free space on the data directory's filesystem that
//! client writes never use, so that Rewind itself always has room to free
//! space — archiving, retention, history deletes, garbage collection,
//! deleting volumes all still work on a disk that clients have filled — and
//! so that a full disk is met by a clear refusal (ENOSPC over NBD) before the
//! filesystem is actually full. Only writes of data (and creating volumes)
//! are held to it.
//!
//! The node measures the filesystem at every maintenance pass; writes check
//! the last measurement (one atomic load), so they may overshoot the reserve
//! by what arrives between two passes — which is what a reserve is for.
//! Crossing into the low band (less than twice the reserve free) or below
//! the reserve is logged once, and shown in `rewind stats` and `/metrics`.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use rewind_io::Space;

/// How much free space client writes leave alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    Bytes(u64),
    /// A share of the filesystem's size, in percent (at most 50).
    Percent(u8),
}

impl Reserve {
    pub fn bytes_of(self, total_bytes: u64) -> u64 {
        match self {
            Reserve::Bytes(bytes) => bytes,
            Reserve::Percent(percent) => total_bytes / 100 * u64::from(percent),
        }
    }
}

impl Default for Reserve {
    fn default() -> Self {
        Reserve::Percent(1)
    }
}

/// Where free space stands against the reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SpaceState {
    /// At least twice the reserve is free.
    Ok = 0,
    /// Less than twice the reserve is free: a warning.
    Low = 1,
    /// Less than the reserve is free: client writes are refused.
    Exhausted = 2,
}

impl SpaceState {
    pub fn name(self) -> &'static str {
        match self {
            SpaceState::Ok => "ok",
            SpaceState::Low => "low",
            SpaceState::Exhausted => "exhausted",
        }
    }
}

/// The last measurement, shared by the node and its volumes.
#[derive(Default)]
pub(crate) struct SpaceGauge {
    total_bytes: AtomicU64,
    free_bytes: AtomicU64,
    reserve_bytes: AtomicU64,
    state: AtomicU8,
    /// The history every volume of the node has waiting for the archiver,
    /// in bytes, as of the last measurement: the room their passes will
    /// need for packs (see `history_waiting_fits_room`).
    history_waiting_bytes: AtomicU64,
}

/// What [`crate::Node::space`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpaceReport {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    pub state: SpaceState,
}

impl SpaceGauge {
    /// Records a measurement; returns the state before and after.
    pub fn update(&self, space: Space, reserve: Reserve) -> (SpaceState, SpaceState) {
        let reserve_bytes = reserve.bytes_of(space.total_bytes);
        let state = if space.free_bytes < reserve_bytes {
            SpaceState::Exhausted
        } else if space.free_bytes < reserve_bytes.saturating_mul(2) {
            SpaceState::Low
        } else {
            SpaceState::Ok
        };
        self.total_bytes.store(space.total_bytes, Ordering::Relaxed);
        self.free_bytes.store(space.free_bytes, Ordering::Relaxed);
        self.reserve_bytes.store(reserve_bytes, Ordering::Relaxed);
        let before = self.state.swap(state as u8, Ordering::AcqRel);
        (state_of(before), state)
    }

    pub fn report(&self) -> SpaceReport {
        SpaceReport {
            total_bytes: self.total_bytes.load(Ordering::Relaxed),
            free_bytes: self.free_bytes.load(Ordering::Relaxed),
            reserve_bytes: self.reserve_bytes.load(Ordering::Relaxed),
            state: state_of(self.state.load(Ordering::Acquire)),
        }
    }

    /// Records the history all volumes have waiting for the archiver.
    pub fn set_history_waiting(&self, bytes: u64) {
        self.history_waiting_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Whether the archive passes of all the history the node has waiting
    /// fit the free space above twice the reserve: the bound within which
    /// archiving may wait when nothing adds history meanwhile (reads), since
    /// its passes need room for their packs whether they run now or later.
    pub fn history_waiting_fits_room(&self) -> bool {
        let report = self.report();
        let room = report.free_bytes.saturating_sub(report.reserve_bytes.saturating_mul(2));
        self.history_waiting_bytes.load(Ordering::Relaxed) < room
    }

    /// Why client writes must wait, if they must.
    pub fn refusal(&self) -> Option<String> {
        if state_of(self.state.load(Ordering::Acquire)) != SpaceState::Exhausted {
            return None;
        }
        let report = self.report();
        Some(format!(
            "the data directory's filesystem has {} free, less than the {} kept in reserve",
            human(report.free_bytes),
            human(report.reserve_bytes)
        ))
    }
}

fn state_of(code: u8) -> SpaceState {
    match code {
        0 => SpaceState::Ok,
        1 => SpaceState::Low,
        _ => SpaceState::Exhausted,
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_follow_the_reserve() {
        let gauge = SpaceGauge::default();
        let space = |free_bytes| Space { total_bytes: 1000 << 20, free_bytes };
        let reserve = Reserve::Percent(10);
        assert_eq!(gauge.update(space(500 << 20), reserve), (SpaceState::Ok, SpaceState::Ok));
        assert_eq!(gauge.update(space(150 << 20), reserve).1, SpaceState::Low);
        assert!(gauge.refusal().is_none(), "low is a warning only");
        assert_eq!(gauge.update(space(50 << 20), reserve), (SpaceState::Low, SpaceState::Exhausted));
        let refusal = gauge.refusal().expect("below the reserve");
        assert!(refusal.contains("50.0 MiB free") && refusal.contains("100.0 MiB"), "{refusal}");
        assert_eq!(gauge.update(space(900 << 20), Reserve::Bytes(1 << 20)).1, SpaceState::Ok);
    }

    #[test]
    fn the_history_waiting_fits_the_room_above_twice_the_reserve() {
        let gauge = SpaceGauge::default();
        gauge.update(Space { total_bytes: 1000 << 20, free_bytes: 300 << 20 }, Reserve::Percent(10));
        gauge.set_history_waiting(99 << 20);
        assert!(gauge.history_waiting_fits_room(), "99 MiB in the 100 MiB above twice the reserve");
        gauge.set_history_waiting(100 << 20);
        assert!(!gauge.history_waiting_fits_room());
        gauge.set_history_waiting(0);
        gauge.update(Space { total_bytes: 1000 << 20, free_bytes: 150 << 20 }, Reserve::Percent(10));
        assert!(!gauge.history_waiting_fits_room(), "below twice the reserve nothing waits");
    }
}
