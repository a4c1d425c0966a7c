//! The foreign baseline: every version in one `std::collections::BTreeMap`
//! keyed by `(block, time)` — the obvious design whose memory grows with
//! history, which the version index exists to avoid.

use std::collections::BTreeMap;

use rewind_types::{Timestamp, Version};

#[derive(Default)]
pub struct BTreeBaseline {
    versions: BTreeMap<(u64, u64), Version>,
}

impl BTreeBaseline {
    pub fn insert(&mut self, versions: &[Version]) {
        for version in versions {
            let previous = self.versions.insert((version.block.0, version.timestamp.unix_nanos()), *version);
            assert!(previous.is_none(), "one version per block and time");
        }
    }

    pub fn len(&self) -> usize {
        self.versions.len()
    }

    /// The newest version of `block` at or before `at`.
    pub fn find_le(&self, block: u64, at: Timestamp) -> Option<Version> {
        let (&(found, _), version) = self.versions.range(..=(block, at.unix_nanos())).next_back()?;
        (found == block).then_some(*version)
    }
}
