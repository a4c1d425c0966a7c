//! The append buffer: the newest versions, in memory, in arrival order, with a
//! per-block list for lookups. Arrival order is time order, because a volume's
//! version times strictly increase — unless the index takes *late* entries
//! (the COW layout files a version when it is copied, long after it was
//! written): then only each block's own versions arrive in time order.

use smallvec::SmallVec;

use rewind_types::block_hash::BlockMap;
use rewind_types::{Lsn, Timestamp, Version};

#[derive(Default)]
pub struct Memtable {
    versions: Vec<Version>,
    /// Positions in `versions` of each block's versions, oldest first;
    /// keyed so that a large write's blocks take neighbouring slots.
    by_block: BlockMap<SmallVec<[u32; 2]>>,
    /// LSN of the last journal record whose versions are in here.
    lsn_last: Lsn,
    timestamp_min: Option<Timestamp>,
    timestamp_max: Option<Timestamp>,
}

impl Memtable {
    pub fn len(&self) -> usize {
        self.versions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }

    /// Versions it has room for without growing.
    pub fn capacity(&self) -> usize {
        self.versions.capacity()
    }

    /// An empty memtable in this one's memory.
    pub fn emptied(mut self) -> Memtable {
        self.versions.clear();
        self.by_block.clear();
        Memtable { versions: self.versions, by_block: self.by_block, ..Memtable::default() }
    }

    pub fn lsn_last(&self) -> Lsn {
        self.lsn_last
    }

    pub fn timestamp_min(&self) -> Option<Timestamp> {
        self.timestamp_min
    }

    pub fn timestamp_max(&self) -> Option<Timestamp> {
        self.timestamp_max
    }

    /// Adds the versions of journal record `lsn`: all of one time, later than
    /// any here, or (`late`) of any times, each later than its block's.
    pub fn insert(&mut self, lsn: Lsn, versions: &[Version], late: bool) {
        assert!(lsn > self.lsn_last, "records arrive in LSN order");
        let Some(first) = versions.first() else { return };
        if !late {
            assert!(self.timestamp_max.is_none_or(|last| first.timestamp > last), "version times strictly increase");
        }
        for version in versions {
            assert!(late || version.timestamp == first.timestamp, "a record's versions share its time");
            let position = u32::try_from(self.versions.len()).expect("memtables stay below 4G versions");
            let positions = self.by_block.entry(version.block.0).or_default();
            if let Some(&last) = positions.last() {
                assert!(
                    self.versions[last as usize].timestamp < version.timestamp,
                    "a block's versions arrive in time order"
                );
            }
            self.versions.push(*version);
            positions.push(position);
            self.timestamp_min = Some(self.timestamp_min.map_or(version.timestamp, |min| min.min(version.timestamp)));
            self.timestamp_max = Some(self.timestamp_max.map_or(version.timestamp, |max| max.max(version.timestamp)));
        }
        self.lsn_last = lsn;
    }

    /// The newest version of `block` at or before `at`.
    pub fn find_le(&self, block: u64, at: Timestamp) -> Option<Version> {
        let positions = self.by_block.get(&block)?;
        let count = positions.partition_point(|&position| self.versions[position as usize].timestamp <= at);
        count.checked_sub(1).map(|index| self.versions[positions[index] as usize])
    }

    /// The blocks with versions here, in no order.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_block.keys().copied()
    }

    /// All versions sorted by `(block, timestamp)`, for writing a run.
    pub fn sorted(&self) -> Vec<Version> {
        let mut blocks: Vec<u64> = self.by_block.keys().copied().collect();
        blocks.sort_unstable();
        let mut sorted = Vec::with_capacity(self.versions.len());
        for block in blocks {
            sorted.extend(self.by_block[&block].iter().map(|&position| self.versions[position as usize]));
        }
        sorted
    }

    /// Approximate heap bytes held, for memory accounting.
    pub fn memory_bytes(&self) -> usize {
        self.versions.capacity() * std::mem::size_of::<Version>()
            + self.by_block.capacity() * (8 + std::mem::size_of::<SmallVec<[u32; 2]>>() + 1)
    }
}
