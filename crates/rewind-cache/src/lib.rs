//! A storage controller's cache, as IBM §4.1 models it: pages of one block
//! (page = extent = block), LRU replacement for reads, LRW (least recently
//! written) for writes, and dirty pages limited to a fraction of the cache
//! (3% by default: the battery-backed part of a segregated write cache).
//!
//! A write to a page that is not dirty makes it dirty; once more pages are
//! dirty than allowed, the least recently written is *destaged* and becomes
//! clean. A write to a page that is already dirty replaces its data and
//! hands the replaced version back: a CDP architecture decides whether the
//! granularity lets it go (*absorbed*) or whether it must be kept. Clean
//! pages serve reads and are evicted least recently used first. A cache of
//! size 0 destages every write at once.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

/// The cache's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheConfig {
    pub pages: u64,
    /// Share of the pages that may be dirty.
    pub dirty_fraction: f64,
}

impl CacheConfig {
    pub fn new(cache_bytes: u64, page_bytes: u64, dirty_fraction: f64) -> CacheConfig {
        CacheConfig { pages: cache_bytes / page_bytes, dirty_fraction }
    }

    fn dirty_max(&self) -> u64 {
        (self.pages as f64 * self.dirty_fraction) as u64
    }
}

/// Pages in an order of use: `BTreeMap` by a sequence number, and where
/// each page is in it.
#[derive(Default)]
struct Ordered<V> {
    by_sequence: BTreeMap<u64, u64>,
    pages: FxHashMap<u64, (u64, V)>,
}

impl<V: Copy> Ordered<V> {
    fn len(&self) -> u64 {
        self.pages.len() as u64
    }

    fn get(&self, block: u64) -> Option<V> {
        self.pages.get(&block).map(|&(_, value)| value)
    }

    /// Inserts or moves `block` to the most recent end; returns its old value.
    fn touch(&mut self, block: u64, sequence: u64, value: V) -> Option<V> {
        let old = self.pages.insert(block, (sequence, value));
        if let Some((old_sequence, _)) = old {
            self.by_sequence.remove(&old_sequence);
        }
        self.by_sequence.insert(sequence, block);
        old.map(|(_, value)| value)
    }

    fn remove(&mut self, block: u64) -> Option<V> {
        let (sequence, value) = self.pages.remove(&block)?;
        self.by_sequence.remove(&sequence);
        Some(value)
    }

    fn pop_oldest(&mut self) -> Option<(u64, V)> {
        let (_, block) = self.by_sequence.pop_first()?;
        let (_, value) = self.pages.remove(&block).expect("ordered pages are mapped");
        Some((block, value))
    }
}

/// What a write did besides caching its version.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome<V> {
    /// The version the write replaced in a dirty page, if any.
    pub replaced: Option<V>,
    /// Pages destaged to make room, oldest first, with their versions.
    pub destaged: Vec<(u64, V)>,
}

/// The cache. `V` is whatever a version carries (its time, its window).
pub struct ControllerCache<V> {
    config: CacheConfig,
    sequence: u64,
    dirty: Ordered<V>,
    clean: Ordered<()>,
}

impl<V: Copy> ControllerCache<V> {
    pub fn new(config: CacheConfig) -> ControllerCache<V> {
        ControllerCache {
            config,
            sequence: 0,
            dirty: Ordered { by_sequence: BTreeMap::new(), pages: FxHashMap::default() },
            clean: Ordered::default(),
        }
    }

    fn next_sequence(&mut self) -> u64 {
        self.sequence += 1;
        self.sequence
    }

    /// A read of `block`: whether the cache holds it. A miss stages it (the
    /// caller counts the device read) as a clean page.
    pub fn read(&mut self, block: u64) -> bool {
        if self.dirty.get(block).is_some() {
            return true;
        }
        let sequence = self.next_sequence();
        let hit = self.clean.touch(block, sequence, ()).is_some();
        self.evict_clean();
        hit
    }

    /// A write of `version` to `block`.
    pub fn write(&mut self, block: u64, version: V) -> WriteOutcome<V> {
        let sequence = self.next_sequence();
        self.clean.remove(block);
        let replaced = self.dirty.touch(block, sequence, version);
        let mut destaged = Vec::new();
        while self.dirty.len() > self.config.dirty_max() {
            let (block, version) = self.dirty.pop_oldest().expect("more dirty pages than allowed");
            destaged.push((block, version));
            let sequence = self.next_sequence();
            self.clean.touch(block, sequence, ());
        }
        self.evict_clean();
        WriteOutcome { replaced, destaged }
    }

    /// The version a dirty page holds.
    pub fn dirty_version(&self, block: u64) -> Option<V> {
        self.dirty.get(block)
    }

    /// Destages every dirty page, least recently written first.
    pub fn flush(&mut self) -> Vec<(u64, V)> {
        let mut flushed = Vec::with_capacity(self.dirty.len() as usize);
        while let Some((block, version)) = self.dirty.pop_oldest() {
            flushed.push((block, version));
            let sequence = self.next_sequence();
            self.clean.touch(block, sequence, ());
        }
        self.evict_clean();
        flushed
    }

    /// Whether `block` is cached (clean or dirty).
    pub fn holds(&self, block: u64) -> bool {
        self.dirty.get(block).is_some() || self.clean.get(block).is_some()
    }

    fn evict_clean(&mut self) {
        while self.dirty.len() + self.clean.len() > self.config.pages && self.clean.pop_oldest().is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_destaged_least_recently_written_first() {
        // 100 pages, 3 may be dirty.
        let mut cache = ControllerCache::new(CacheConfig { pages: 100, dirty_fraction: 0.03 });
        for block in 0..3 {
            assert_eq!(cache.write(block, block * 10), WriteOutcome::default());
        }
        // Rewriting block 0 makes it the most recently written.
        assert_eq!(cache.write(0, 1).replaced, Some(0));
        let outcome = cache.write(7, 70);
        assert_eq!(outcome.destaged, vec![(1, 10)]);
        assert!(cache.read(1), "a destaged page stays cached, clean");
        assert_eq!(cache.flush(), vec![(2, 20), (0, 1), (7, 70)]);
    }

    #[test]
    fn clean_pages_are_evicted_least_recently_used_first() {
        let mut cache: ControllerCache<u64> = ControllerCache::new(CacheConfig { pages: 3, dirty_fraction: 0.0 });
        assert!(!cache.read(1) && !cache.read(2) && !cache.read(3));
        assert!(cache.read(1), "hit");
        assert!(!cache.read(4), "miss; evicts 2, the least recently used");
        assert!(!cache.holds(2) && cache.holds(1) && cache.holds(3));
    }

    #[test]
    fn a_cache_of_nothing_destages_every_write() {
        let mut cache = ControllerCache::new(CacheConfig::new(0, 4096, 0.03));
        assert_eq!(cache.write(5, 'a').destaged, vec![(5, 'a')]);
        assert_eq!(cache.write(5, 'b'), WriteOutcome { replaced: None, destaged: vec![(5, 'b')] });
        assert!(!cache.read(5));
    }
}
