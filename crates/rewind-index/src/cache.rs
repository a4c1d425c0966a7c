//! A bounded cache of verified index pages, shared by every run of every
//! volume on a node, with CLOCK (second chance) eviction.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use rewind_format::index::PAGE_BYTES;

pub type PageBytes = Arc<[u8]>;

struct Slot {
    bytes: PageBytes,
    referenced: AtomicBool,
}

struct Inner {
    slots: FxHashMap<(u64, u64), Slot>,
    clock: VecDeque<(u64, u64)>,
}

pub struct PageCache {
    pages_max: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Cache counters, for stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCacheStats {
    pub pages: u64,
    pub hits: u64,
    pub misses: u64,
}

impl PageCache {
    pub fn new(bytes_max: u64) -> Arc<Self> {
        let pages_max = usize::try_from(bytes_max / PAGE_BYTES as u64).expect("fits").max(16);
        Arc::new(PageCache {
            pages_max,
            inner: Mutex::new(Inner { slots: FxHashMap::default(), clock: VecDeque::new() }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// The page `(run, page)`, loaded with `load` (which verifies it) on a miss.
    /// The lock is not held while loading; two threads may load the same page.
    pub fn get<E>(&self, key: (u64, u64), load: impl FnOnce() -> Result<PageBytes, E>) -> Result<PageBytes, E> {
        if let Some(slot) = self.inner.lock().slots.get(&key) {
            slot.referenced.store(true, Ordering::Relaxed);
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(&slot.bytes));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let bytes = load()?;
        let mut inner = self.inner.lock();
        while inner.slots.len() >= self.pages_max {
            let victim = inner.clock.pop_front().expect("slots and clock agree");
            let second_chance = inner.slots[&victim].referenced.swap(false, Ordering::Relaxed);
            if second_chance {
                inner.clock.push_back(victim);
            } else {
                inner.slots.remove(&victim);
            }
        }
        let slot = Slot { bytes: Arc::clone(&bytes), referenced: AtomicBool::new(false) };
        if inner.slots.insert(key, slot).is_none() {
            inner.clock.push_back(key);
        }
        Ok(bytes)
    }

    /// Drops every page of `run` (after the run was merged away).
    pub fn forget_run(&self, run: u64) {
        let mut inner = self.inner.lock();
        inner.slots.retain(|&(owner, _), _| owner != run);
        inner.clock.retain(|&(owner, _)| owner != run);
    }

    pub fn stats(&self) -> PageCacheStats {
        PageCacheStats {
            pages: self.inner.lock().slots.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_bounds_and_prefers_referenced_pages() {
        let cache = PageCache::new(16 * PAGE_BYTES as u64);
        let page = |tag: u8| -> Result<PageBytes, ()> { Ok(Arc::from(vec![tag; PAGE_BYTES])) };
        for index in 0..16u64 {
            cache.get((1, index), || page(index as u8)).unwrap();
        }
        // Touch page 0 so it gets a second chance.
        cache.get((1, 0), || -> Result<PageBytes, ()> { panic!("page 0 is cached") }).unwrap();
        cache.get((1, 100), || page(100)).unwrap();
        assert_eq!(cache.stats().pages, 16);
        assert_eq!(cache.get((1, 0), || page(0)).unwrap()[0], 0);
        assert_eq!(cache.stats().misses, 17, "page 0 survived eviction");
        cache.forget_run(1);
        assert_eq!(cache.stats().pages, 0);
    }
}
