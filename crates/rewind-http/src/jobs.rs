//! Slow work, bounded: imports as jobs, and a small share of threads for
//! the other slow requests.
//!
//! Engine calls block, so handlers run them on tokio's blocking pool. That
//! pool grows a thread per call up to its maximum, and a call that waits on
//! a slow client holds its thread throughout: 600 imports trickling their
//! bodies once took 518 threads, and `GET /v1/volumes` queued behind them
//! until it timed out. So:
//!
//! - An import is a job ([`Jobs`]). At most `ApiLimits::imports_max` run at
//!   once, each on one blocking thread; up to `ApiLimits::imports_waiting_max`
//!   more wait in line without a thread (an async wait; their uploads stall
//!   until it is their turn); beyond that the server answers 503 `busy`,
//!   saying how many run and wait. `GET /v1/jobs` shows each with its
//!   progress; finished ones are kept for a while (`FINISHED_KEPT`).
//! - Other slow requests (garbage collection, measuring stats, deleting
//!   history, streaming the write history, a tree's listing, history and
//!   reverts, which walk or copy without bound) take one of
//!   `ApiLimits::slow_work_max` permits before they get a thread, and wait
//!   for one without a thread, in a line of at most
//!   `ApiLimits::slow_waiting_max`; no token holds more than a quarter of
//!   the places (running or waiting). Beyond either, 503 `busy`: one
//!   token's slow requests, each holding its connection while it waits,
//!   once filled every connection slot the API has.
//! - `blocking_threads_max` is what the runtime's blocking pool needs: the
//!   two above plus `QUICK_THREADS` that only quick calls (a listing, a
//!   bookmark) can use, so those always find a thread soon.
//!
//! Memory: a waiting import holds its connection and a job record; a running
//! one its blocking thread and at most `IMPORT_CHUNKS_QUEUED` body chunks
//! (hyper reads at most ~400 KiB per chunk).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rewind_engine::Timestamp;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::{time, JobInfo};

/// Threads of the blocking pool kept for quick engine calls.
pub const QUICK_THREADS: usize = 16;

/// Finished jobs `GET /v1/jobs` still shows.
const FINISHED_KEPT: usize = 64;

/// Body chunks queued between an import's upload and its engine thread.
pub(crate) const IMPORT_CHUNKS_QUEUED: usize = 8;

/// How much slow work the API takes on at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    /// Imports running at once.
    pub imports_max: usize,
    /// Imports waiting for one of those; more are refused with 503.
    pub imports_waiting_max: usize,
    /// Other slow requests running at once (more wait without a thread).
    pub slow_work_max: usize,
    /// Other slow requests waiting for one of those; more are refused with 503.
    pub slow_waiting_max: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits { imports_max: 2, imports_waiting_max: 16, slow_work_max: 4, slow_waiting_max: 32 }
    }
}

impl ApiLimits {
    /// What the tokio runtime's `max_blocking_threads` should be.
    pub fn blocking_threads_max(&self) -> usize {
        self.imports_max + self.slow_work_max + QUICK_THREADS
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    Done,
    Failed,
}

/// One job, shared by its handler (which updates it) and the registry.
pub(crate) struct Job {
    id: u64,
    volume: String,
    bytes_total: u64,
    bytes_done: AtomicU64,
    submitted: Timestamp,
    state: Mutex<(State, Option<String>)>,
}

impl Job {
    pub(crate) fn progress(&self, bytes_done: u64) {
        self.bytes_done.store(bytes_done, Ordering::Relaxed);
    }

    fn info(&self, waiting_behind: Option<u64>) -> JobInfo {
        let (state, error) = self.state.lock().clone();
        JobInfo {
            id: self.id,
            kind: "import".to_owned(),
            volume: self.volume.clone(),
            state: match state {
                State::Waiting => "waiting",
                State::Running => "running",
                State::Done => "done",
                State::Failed => "failed",
            }
            .to_owned(),
            waiting_behind,
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total,
            submitted: time(self.submitted),
            error,
        }
    }
}

/// Why an import cannot even wait.
pub(crate) struct Busy {
    pub(crate) running: usize,
    pub(crate) waiting: usize,
}

/// The imports running, waiting and recently finished.
pub(crate) struct Jobs {
    limits: ApiLimits,
    imports: Arc<Semaphore>,
    slow: Arc<Semaphore>,
    slow_line: Arc<Mutex<SlowLine>>,
    next_id: AtomicU64,
    /// Oldest first: unfinished ones, and up to `FINISHED_KEPT` finished.
    jobs: Mutex<VecDeque<Arc<Job>>>,
}

/// An import's place: waiting, then holding a running slot. Dropping it
/// without `finish` marks the job failed (the client went away).
pub(crate) struct Ticket {
    pub(crate) job: Arc<Job>,
    permit: Option<OwnedSemaphorePermit>,
    finished: bool,
}

impl Ticket {
    /// Waits for a running slot (without a thread) and marks the job running.
    pub(crate) async fn run(&mut self, jobs: &Jobs) {
        let permit = Arc::clone(&jobs.imports).acquire_owned().await.expect("the semaphore is never closed");
        self.permit = Some(permit);
        self.job.state.lock().0 = State::Running;
    }

    pub(crate) fn finish(mut self, result: Result<(), String>) {
        *self.job.state.lock() = match result {
            Ok(()) => (State::Done, None),
            Err(error) => (State::Failed, Some(error)),
        };
        self.finished = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.finished {
            *self.job.state.lock() = (State::Failed, Some("the client went away before the import finished".into()));
        }
    }
}

impl Jobs {
    pub(crate) fn new(limits: ApiLimits) -> Jobs {
        assert!(limits.imports_max > 0 && limits.slow_work_max > 0);
        Jobs {
            limits,
            imports: Arc::new(Semaphore::new(limits.imports_max)),
            slow: Arc::new(Semaphore::new(limits.slow_work_max)),
            slow_line: Arc::default(),
            next_id: AtomicU64::new(1),
            jobs: Mutex::new(VecDeque::new()),
        }
    }

    pub(crate) fn limits(&self) -> ApiLimits {
        self.limits
    }

    /// Registers an import, waiting; `Busy` if the line is full.
    pub(crate) fn submit_import(&self, volume: &str, bytes_total: u64, now: Timestamp) -> Result<Ticket, Busy> {
        let mut jobs = self.jobs.lock();
        let count = |state| jobs.iter().filter(|job| job.state.lock().0 == state).count();
        let (running, waiting) = (count(State::Running), count(State::Waiting));
        if waiting >= self.limits.imports_waiting_max {
            return Err(Busy { running, waiting });
        }
        // Forget the oldest finished jobs beyond what is kept.
        let finished = jobs.len() - running - waiting;
        let mut excess = (finished + 1).saturating_sub(FINISHED_KEPT);
        jobs.retain(|job| {
            let done = matches!(job.state.lock().0, State::Done | State::Failed);
            let drop = done && excess > 0;
            excess -= usize::from(drop);
            !drop
        });
        let job = Arc::new(Job {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            volume: volume.to_owned(),
            bytes_total,
            bytes_done: AtomicU64::new(0),
            submitted: now,
            state: Mutex::new((State::Waiting, None)),
        });
        jobs.push_back(Arc::clone(&job));
        Ok(Ticket { job, permit: None, finished: false })
    }

    /// Every job, newest first.
    pub(crate) fn list(&self) -> Vec<JobInfo> {
        let jobs = self.jobs.lock();
        let mut waiting_ahead = 0;
        let mut infos: Vec<JobInfo> = jobs
            .iter()
            .map(|job| {
                let waiting = job.state.lock().0 == State::Waiting;
                let info = job.info(waiting.then_some(waiting_ahead));
                waiting_ahead += u64::from(waiting);
                info
            })
            .collect();
        infos.reverse();
        infos
    }

    /// A permit for one piece of other slow work for token `token`; waits
    /// without a thread, in a bounded line (see the module documentation).
    pub(crate) async fn slow_permit(&self, token: &str) -> Result<SlowPermit, SlowBusy> {
        let place = {
            let mut line = self.slow_line.lock();
            let waiting = line.total.saturating_sub(self.limits.slow_work_max - self.slow.available_permits());
            let token_max = (self.limits.slow_work_max + self.limits.slow_waiting_max).div_ceil(4);
            let held = line.by_token.get(token).copied().unwrap_or(0);
            if waiting >= self.limits.slow_waiting_max || held >= token_max {
                return Err(SlowBusy { waiting, held, token_max });
            }
            line.total += 1;
            *line.by_token.entry(token.to_owned()).or_default() += 1;
            // Taken before the wait: a client that goes away leaves the line.
            Place { line: Arc::clone(&self.slow_line), token: token.to_owned() }
        };
        let permit = Arc::clone(&self.slow).acquire_owned().await.expect("the semaphore is never closed");
        Ok(SlowPermit { _permit: permit, _place: place })
    }
}

/// The slow requests running or waiting, in all and by token.
#[derive(Default)]
struct SlowLine {
    total: usize,
    by_token: HashMap<String, usize>,
}

/// A slow request's place in [`SlowLine`], given back when dropped.
struct Place {
    line: Arc<Mutex<SlowLine>>,
    token: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut line = self.line.lock();
        line.total -= 1;
        let held = line.by_token.get_mut(&self.token).expect("a place is counted");
        *held -= 1;
        if *held == 0 {
            line.by_token.remove(&self.token);
        }
    }
}

/// The right to run one slow request (see [`Jobs::slow_permit`]).
pub(crate) struct SlowPermit {
    _permit: OwnedSemaphorePermit,
    _place: Place,
}

/// Why a slow request cannot even wait.
#[derive(Debug)]
pub(crate) struct SlowBusy {
    pub(crate) waiting: usize,
    /// The slow requests of its token, running or waiting, and the most it may have.
    pub(crate) held: usize,
    pub(crate) token_max: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn imports_run_a_few_at_a_time_and_wait_in_a_bounded_line() {
        let jobs = Jobs::new(ApiLimits { imports_max: 1, imports_waiting_max: 2, ..ApiLimits::default() });
        let now = Timestamp::from_unix_nanos(1);
        let mut first = jobs.submit_import("a", 10, now).ok().unwrap();
        first.run(&jobs).await;
        let second = jobs.submit_import("b", 10, now).ok().unwrap();
        let _third = jobs.submit_import("c", 10, now).ok().unwrap();
        let busy = jobs.submit_import("d", 10, now).err().unwrap();
        assert_eq!((busy.running, busy.waiting), (1, 2));
        let list = jobs.list();
        let states: Vec<_> =
            list.iter().map(|job| (job.volume.as_str(), job.state.as_str(), job.waiting_behind)).collect();
        assert_eq!(states, [("c", "waiting", Some(1)), ("b", "waiting", Some(0)), ("a", "running", None)]);
        first.job.progress(10);
        first.finish(Ok(()));
        drop(second);
        let list = jobs.list();
        assert_eq!(list[1].state, "failed");
        assert_eq!(list[2].bytes_done, 10);
        assert_eq!(list[2].state, "done");
    }

    #[tokio::test]
    async fn finished_jobs_are_forgotten_beyond_a_bound() {
        let jobs = Jobs::new(ApiLimits::default());
        for _ in 0..FINISHED_KEPT + 10 {
            let mut ticket = jobs.submit_import("v", 1, Timestamp::from_unix_nanos(1)).ok().unwrap();
            ticket.run(&jobs).await;
            ticket.finish(Err("no".into()));
        }
        assert_eq!(jobs.list().len(), FINISHED_KEPT);
    }

    /// Slow requests wait in a bounded line, and no token takes more than a
    /// quarter of its places: one token's slow requests, each holding its
    /// connection while it waits, once filled every connection slot.
    #[tokio::test]
    async fn slow_work_waits_in_a_bounded_line_and_no_token_takes_it_all() {
        let jobs = Jobs::new(ApiLimits { slow_work_max: 2, slow_waiting_max: 6, ..ApiLimits::default() });
        let running = [jobs.slow_permit("a").await.unwrap(), jobs.slow_permit("a").await.unwrap()];
        let refused = jobs.slow_permit("a").await.err().expect("a's share is full");
        assert_eq!((refused.held, refused.token_max), (2, 2));
        // Six wait, two tokens' worth each; each takes its place at its first poll.
        let mut waiting: Vec<_> =
            ["b", "b", "c", "c", "d", "d"].iter().map(|token| Box::pin(jobs.slow_permit(token))).collect();
        for place in &mut waiting {
            assert!(futures_util::poll!(place.as_mut()).is_pending(), "no thread is free");
        }
        let refused = jobs.slow_permit("e").await.err().expect("the line is full");
        assert_eq!(refused.waiting, 6);
        // A client that goes away leaves the line; one that finishes lets the next run.
        drop(waiting.remove(0));
        let mut next = Box::pin(jobs.slow_permit("e"));
        assert!(futures_util::poll!(next.as_mut()).is_pending());
        drop(running);
        assert!(waiting.remove(0).await.is_ok(), "the first in line runs");
    }
}
