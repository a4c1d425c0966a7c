//! The layouts: where a volume puts each write. The one list of their names,
//! shared by the engine (which gives each its rules, `rewind-engine`'s
//! `layout` module), the on-disk format (which stores the discriminant), the
//! CLI and API (which parse the names) and the lab (which models the
//! papers' six).

/// Where a volume puts each write: the layouts of the CDP papers (IBM §2,
/// Xiao et al. §2). In every layout the journal is the write-ahead log (the
/// papers' non-volatile cache) and the version index is the map of history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
// Exhaustive on purpose: a new layout must be given its rules (and, in the
// lab, its model) wherever layouts are matched, and the compiler says where.
pub enum Layout {
    /// Every write goes to the journal (history, durability) and, once
    /// durable, to the current store (fast reads of the present).
    Journaled = 0,
    /// IBM's Logging: one store, the history (the journal, then the chunk
    /// store); no current store: the present is read through the map.
    Logging = 1,
    /// IBM's SplitStream: behind the controller cache, the current store
    /// gets only the newest version of each block it destages, the history
    /// every version the cache lets go that the granularity keeps (from the
    /// journal, as it leaves).
    SplitStream = 2,
    /// IBM's SplitDownStream: behind the controller cache, every version it
    /// lets go that the granularity keeps is written to both the current
    /// store and the history.
    SplitDownStream = 3,
    /// IBM's Checkpointing: as COW (history is copied out of the current
    /// store before an overwrite), behind the IBM controller cache: only the
    /// least recently written blocks beyond its dirty limit are destaged, so
    /// overwrites of the others are absorbed.
    Checkpointing = 4,
    /// Xiao's copy-on-write: the current store is written in place; before a
    /// version there is overwritten, if history keeps it (it is the last of
    /// its window, or a bookmark's), it is copied to the chunk store. The
    /// version index holds the copies only, filed as they are made.
    Cow = 5,
    /// Xiao's redirect-on-write: writes are redirected to the journal; the
    /// current store (the source) stays as of the last snapshot until the
    /// blocks redirected since are merged back into it, at the next one.
    Row = 6,
}

impl Layout {
    /// Every layout, in code order.
    pub const ALL: [Layout; 7] = [
        Layout::Journaled,
        Layout::Logging,
        Layout::SplitStream,
        Layout::SplitDownStream,
        Layout::Checkpointing,
        Layout::Cow,
        Layout::Row,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Journaled => "journaled",
            Layout::Logging => "logging",
            Layout::SplitStream => "split-stream",
            Layout::SplitDownStream => "split-down-stream",
            Layout::Checkpointing => "checkpointing",
            Layout::Cow => "cow",
            Layout::Row => "row",
        }
    }

    /// A layout by its name, or an error listing the names.
    pub fn parse(name: &str) -> Result<Layout, String> {
        Layout::ALL.into_iter().find(|layout| layout.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Layout::ALL.iter().map(|layout| layout.name()).collect();
            format!("unknown layout {name:?}; Rewind has {}", names.join(", "))
        })
    }

    /// The layout stored as `code` in `volume.meta` (its discriminant).
    pub fn from_code(code: u8) -> Option<Layout> {
        Layout::ALL.into_iter().find(|layout| *layout as u8 == code)
    }
}
