//! Model-based test of lineage on the simulated disk: a node whose volumes
//! are clones of each other (clones of clones, clones at past points and at
//! now), written, zeroed, flushed, bookmarked, reverted in place and
//! reverts undone, the two roots bookmarked and reverted as a group,
//! maintained (archive, retention, collection, the background copy after
//! a revert), promoted (a clone's own
//! copy of its base, after which the base may go) and crashed at random,
//! checked against an oracle per volume whose first state is its
//! base as it was at the branch point, and whose state after a revert is
//! its own state at the point reverted to.
//! Every volume's present and every point it keeps must read as its oracle
//! says — a clone's base is never thinned, deleted or collected from under
//! it — and a base with clones is neither deleted nor has the branch point
//! deleted from its history. Root volumes go round the seven layouts (a
//! clone has its source's layout), some with granularity and retention.
//!
//! Each case prints its seed; `REWIND_SEED=<n>` replays one case and
//! `REWIND_SEEDS=<n>` runs that many.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rewind_engine::{
    BlockSize, BookmarkName, Clones, Durability, EngineError, GroupRevertTo, InUse, Layout, LayoutRules, Node,
    NodeConfig, RepairMode, RevertReport, Timestamp, Volume, VolumeName, VolumeSpec, Writers, ZeroMode,
};
use rewind_io::{SimConfig, SimStorage};

mod support;
use support::{check_everything, config, random_policy, write_data, Oracle};

/// One volume of the case: its oracle, and what it was cloned from.
struct Line {
    name: String,
    oracle: Oracle,
    /// The line it was cloned from and the point, while it reads from it
    /// (a promoted clone does not).
    base: Option<(usize, Timestamp)>,
    deleted: bool,
    /// Oracle states that are reverts, not journal records (all durable:
    /// a revert is made after a flush, and is durable itself).
    reverts: usize,
}

struct Case {
    seed: u64,
    node: Node,
    storage: SimStorage,
    config: NodeConfig,
    lines: Vec<Line>,
    block_bytes: u64,
    /// The group bookmarks of the roots' group: name, and each member's
    /// line and point.
    group_bookmarks: Vec<(String, Vec<(usize, Timestamp)>)>,
}

/// What a case exercised.
#[derive(Default, Debug)]
struct Exercised {
    clones: u64,
    /// Clones whose base is itself a clone.
    clones_of_clones: u64,
    crashes: u64,
    base_deletes_refused: u64,
    branch_deletes_refused: u64,
    deletes: u64,
    reverts: u64,
    undos: u64,
    group_bookmarks: u64,
    group_reverts: u64,
    promotes: u64,
    /// Blocks the background copy after a revert put back into a current store.
    revert_blocks_copied: u64,
    /// Versions a base's retention thinned while clones read from it.
    thinned_under_clones: u64,
}

impl Case {
    fn volume(&self, line: usize) -> Arc<Volume> {
        self.node.volume(&self.lines[line].name).unwrap()
    }

    fn live(&self) -> Vec<usize> {
        (0..self.lines.len()).filter(|&line| !self.lines[line].deleted).collect()
    }

    fn has_clones(&self, line: usize) -> bool {
        self.lines.iter().any(|other| !other.deleted && other.base.is_some_and(|(base, _)| base == line))
    }

    fn check(&self, line: usize) {
        check_everything(&self.volume(line), &self.lines[line].oracle, self.seed);
    }

    /// A crash and a restart: each volume keeps at least what was
    /// acknowledged, and every volume reads as before.
    fn restart(&mut self, step: usize) {
        self.storage.crash();
        self.node = Node::open(Arc::new(self.storage.clone()), self.config)
            .unwrap_or_else(|error| panic!("seed {} step {step}: recovery failed: {error}", self.seed));
        assert!(self.node.damaged_volumes().is_empty(), "seed {}: {:?}", self.seed, self.node.damaged_volumes());
        for line in self.live() {
            let volume = self.volume(line);
            let timeline = volume.timeline();
            let survivors: u64 = timeline.buckets.iter().map(|bucket| bucket.write_count + bucket.zero_count).sum();
            let survivors = survivors as usize + self.lines[line].reverts;
            let oracle = &mut self.lines[line].oracle;
            assert!(survivors >= oracle.durable, "seed {}: volume {line} lost acknowledged writes", self.seed);
            oracle.states.truncate(survivors + 1);
            oracle.durable = survivors;
            oracle.clock = volume.timestamp_last();
            self.check(line);
        }
        // Every group bookmark is on each member still in the group, at its point.
        for (name, points) in &self.group_bookmarks {
            for &(line, at) in points.iter().filter(|(line, _)| !self.lines[*line].deleted) {
                let bookmarks = self.volume(line).bookmarks();
                let found = bookmarks.iter().find(|bookmark| bookmark.name.as_str() == name);
                assert_eq!(
                    found.map(|bookmark| bookmark.timestamp),
                    Some(at),
                    "seed {}: group bookmark {name}",
                    self.seed
                );
            }
        }
    }

    fn line_of(&self, volume: &VolumeName) -> usize {
        self.lines.iter().position(|line| line.name == volume.as_str() && !line.deleted).expect("a live line")
    }

    /// The oracle after `volume` reverted as `report` says.
    fn reverted(&mut self, line: usize, report: &RevertReport) {
        let revert = report.revert;
        let line = &mut self.lines[line];
        let oracle = &mut line.oracle;
        assert!(revert.at > oracle.clock && revert.before == revert.at.saturating_sub_nanos(1), "seed {}", self.seed);
        let image = oracle.at(revert.to).clone();
        oracle.states.push((revert.at, image));
        oracle.clock = revert.at;
        oracle.durable = oracle.states.len() - 1;
        line.reverts += 1;
    }
}

fn run(seed: u64) -> Exercised {
    let layout = Layout::ALL[seed as usize % Layout::ALL.len()];
    println!("seed {seed} ({} layout at the root)", layout.name());
    let mut rng = StdRng::seed_from_u64(seed);
    let storage = SimStorage::new(SimConfig::default(), seed);
    let config = config(&mut rng);
    let block_bytes = [512u32, 4096][rng.random_range(0..2)];
    let size = rng.random_range(8..48u64) * u64::from(block_bytes);
    let mut now = Timestamp::from_unix_nanos(1_000_000);
    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let mut case = Case {
        seed,
        node,
        storage,
        config,
        lines: Vec::new(),
        block_bytes: u64::from(block_bytes),
        group_bookmarks: Vec::new(),
    };
    let mut exercised = Exercised::default();
    // Two roots: one keeping every write, one (in half the cases) thinned.
    for (root, thinned) in [(0, false), (1, seed % 2 == 1)] {
        let (granularity_nanos, retention) = if thinned { random_policy(&mut rng) } else { (0, Vec::new()) };
        let layout = if root == 0 { layout } else { Layout::ALL[rng.random_range(0..Layout::ALL.len())] };
        let spec = VolumeSpec {
            granularity_nanos,
            retention,
            layout,
            cache_bytes: match LayoutRules::of(layout).has_controller_cache() {
                true => u64::from(block_bytes) * rng.random_range(1..200),
                false => 0,
            },
            ..VolumeSpec::new(VolumeName::new(&format!("r{root}")).unwrap(), size, BlockSize::new(block_bytes).unwrap())
        };
        case.node.create_volume(spec, now).unwrap();
        let oracle = Oracle {
            states: vec![(now, vec![0; size as usize])],
            clock: now,
            durable: 0,
            block_bytes: u64::from(block_bytes),
        };
        case.lines.push(Line { name: format!("r{root}"), oracle, base: None, deleted: false, reverts: 0 });
    }
    let roots = [VolumeName::new("r0").unwrap(), VolumeName::new("r1").unwrap()];
    case.node.create_group(VolumeName::new("g").unwrap(), &roots).unwrap();
    for step in 0..rng.random_range(100..300) {
        if rng.random_bool(0.8) {
            now = now.saturating_add_nanos(rng.random_range(1..5_000));
        }
        let live = case.live();
        let line = live[rng.random_range(0..live.len())];
        let volume = case.volume(line);
        match rng.random_range(0..100) {
            0..=39 => {
                let offset = rng.random_range(0..size);
                let length = rng.random_range(1..=(size - offset).min(3 * case.block_bytes));
                let data = write_data(&mut rng, offset, length, case.block_bytes);
                let fua = rng.random_bool(0.1);
                let durability = if fua { Durability::Fua } else { Durability::Buffered };
                volume.write(now, offset, &data, durability).unwrap();
                let oracle = &mut case.lines[line].oracle;
                oracle.write(now, offset, &data);
                if fua {
                    oracle.durable = oracle.states.len() - 1;
                }
            }
            40..=44 => {
                let offset = rng.random_range(0..size);
                let length = rng.random_range(1..=size - offset);
                volume.zero(now, offset, length, ZeroMode::Deallocate, Durability::Buffered).unwrap();
                case.lines[line].oracle.zero(now, offset, length, ZeroMode::Deallocate);
            }
            45..=49 => {
                volume.flush().unwrap();
                let oracle = &mut case.lines[line].oracle;
                oracle.durable = oracle.states.len() - 1;
            }
            50..=59 if case.lines.len() < 12 => {
                // A clone of this volume, at now or at a point it keeps.
                let source = &case.lines[line].oracle;
                let at = match rng.random_bool(0.5) {
                    true => None,
                    false => {
                        let (time, _) = source.states[rng.random_range(0..source.states.len())];
                        match volume.exact_time(time) {
                            Ok(exact) => Some(exact),
                            // Retention dropped it: a clone there is refused as a view is.
                            Err(_) => continue,
                        }
                    }
                };
                let name = format!("c{step}");
                let clone =
                    case.node.clone_volume(&volume.name().to_string(), at, VolumeName::new(&name).unwrap(), now);
                let clone = clone.unwrap_or_else(|error| panic!("seed {seed} step {step}: clone: {error}"));
                let base = clone.base().expect("a clone has a base");
                assert!(&base.volume == volume.name() && !base.copied);
                let branch = base.at;
                let source = &mut case.lines[line].oracle;
                if at.is_none() {
                    // Like a bookmark made now: after every write so far, all durable.
                    source.clock = source.clock.max(now);
                    assert_eq!(branch, source.clock, "seed {seed}: a clone at now starts after every write");
                }
                // Cloning makes every write to the source so far durable.
                source.durable = source.states.len() - 1;
                let oracle = Oracle {
                    states: vec![(clone.created(), source.at(branch).clone())],
                    clock: clone.created(),
                    durable: 0,
                    block_bytes: case.block_bytes,
                };
                exercised.clones += 1;
                exercised.clones_of_clones += u64::from(case.lines[line].base.is_some());
                case.lines.push(Line { name, oracle, base: Some((line, branch)), deleted: false, reverts: 0 });
                case.check(case.lines.len() - 1);
            }
            60..=69 => {
                case.node.maintain(now).unwrap();
                let copied = || -> u64 {
                    case.node.volumes().iter().map(|volume| volume.stats().unwrap().revert_blocks_copied).sum()
                };
                let before = copied();
                case.node.maintain_history(now).unwrap();
                exercised.revert_blocks_copied += copied() - before;
                if case.has_clones(line) {
                    exercised.thinned_under_clones =
                        exercised.thinned_under_clones.max(volume.stats().unwrap().versions_thinned);
                }
                if rng.random_bool(0.2) {
                    case.node.collect(&mut |_, _, _| {}).unwrap();
                }
            }
            70..=72 => {
                let name = BookmarkName::new(&format!("b{step}")).unwrap();
                volume.create_bookmark(name, None, now).unwrap();
                let oracle = &mut case.lines[line].oracle;
                oracle.clock = oracle.clock.max(now);
                oracle.durable = oracle.states.len() - 1;
            }
            73..=76 => {
                // Deleting a base is refused, naming its clones; a leaf goes.
                let name = volume.name().to_string();
                drop(volume);
                let with_clones = rng.random_bool(0.3);
                let clones = if with_clones { Clones::Delete } else { Clones::Refuse };
                match case.node.delete_volume(&name, InUse::Refuse, clones) {
                    Ok(()) => {
                        assert!(with_clones || !case.has_clones(line), "seed {seed}: deleted a base");
                        // With its clones, and theirs.
                        let mut doomed = vec![line];
                        while let Some(gone) = doomed.pop() {
                            case.lines[gone].deleted = true;
                            let clones = (0..case.lines.len()).filter(|&other| {
                                !case.lines[other].deleted
                                    && case.lines[other].base.is_some_and(|(base, _)| base == gone)
                            });
                            doomed.extend(clones.collect::<Vec<_>>());
                        }
                        exercised.deletes += 1;
                        if case.live().is_empty() {
                            break;
                        }
                    }
                    Err(EngineError::HasClones { clones, .. }) => {
                        assert!(!with_clones && case.has_clones(line), "seed {seed}");
                        assert!(!clones.is_empty());
                        exercised.base_deletes_refused += 1;
                    }
                    Err(error) => panic!("seed {seed} step {step}: delete: {error}"),
                }
            }
            77..=79 => {
                // History around a branch point stays: deleting it is refused.
                let clone = case.lines.iter().find(|other| {
                    let created = case.lines[line].oracle.states[0].0;
                    !other.deleted && other.base.is_some_and(|(base, at)| base == line && created < at && at < now)
                });
                if let Some(&Line { base: Some((_, at)), .. }) = clone {
                    let from = case.lines[line].oracle.states[0].0;
                    let refused = volume.delete_history(from, at.saturating_add_nanos(1), now);
                    assert!(
                        matches!(&refused, Err(EngineError::InvalidArgument(message)) if message.contains("starts from")),
                        "seed {seed} step {step}: {refused:?}"
                    );
                    exercised.branch_deletes_refused += 1;
                }
            }
            85..=89 => {
                // Back to a point it keeps, or (a third of the time) undo the last revert.
                let undo = rng.random_bool(0.3);
                let report = match undo {
                    true => match volume.undo_revert(now, Writers::Refuse) {
                        Err(EngineError::InvalidArgument(message)) if case.lines[line].reverts == 0 => {
                            assert!(message.contains("nothing to undo"), "{message}");
                            continue;
                        }
                        report => report,
                    },
                    false => {
                        let oracle = &case.lines[line].oracle;
                        let (time, _) = oracle.states[rng.random_range(0..oracle.states.len())];
                        let Ok(to) = volume.exact_time(time) else { continue };
                        volume.revert(to, now, Writers::Refuse)
                    }
                };
                let report = report.unwrap_or_else(|error| panic!("seed {seed} step {step}: revert: {error}"));
                let revert = report.revert;
                case.reverted(line, &report);
                assert_eq!(
                    volume.bookmarks().iter().find(|bookmark| bookmark.name == report.bookmark).unwrap().timestamp,
                    revert.before
                );
                if undo {
                    exercised.undos += 1;
                } else {
                    exercised.reverts += 1;
                }
                case.check(case.lines.iter().position(|other| other.name == volume.name().as_str()).unwrap());
            }
            80..=84 => {
                drop(volume);
                case.restart(step);
                exercised.crashes += 1;
            }
            90..=92 => {
                // One instant across the roots still in their group.
                let name = format!("g{step}");
                match case.node.bookmark_group("g", BookmarkName::new(&name).unwrap(), now) {
                    Ok(taken) => {
                        let mut points = Vec::new();
                        for point in &taken.members {
                            let member = case.line_of(&point.volume);
                            let oracle = &mut case.lines[member].oracle;
                            // Like a bookmark made now, on every member at once.
                            oracle.clock = oracle.clock.max(now);
                            assert_eq!(point.at, oracle.clock, "seed {seed} step {step}: a group bookmark is now");
                            oracle.durable = oracle.states.len() - 1;
                            points.push((member, point.at));
                        }
                        case.group_bookmarks.push((name, points));
                        exercised.group_bookmarks += 1;
                    }
                    Err(EngineError::InvalidArgument(message)) if message.contains("no members") => {}
                    Err(error) => panic!("seed {seed} step {step}: group bookmark: {error}"),
                }
            }
            95..=96 if case.lines[line].base.is_some() => {
                // The clone gets its own copy of its base: it reads as before
                // (its oracle does not change), and the base may go.
                let mut progress = Vec::new();
                let report = case
                    .node
                    .promote_volume(volume.name().as_str(), &mut |done, total| progress.push((done, total)))
                    .unwrap_or_else(|error| panic!("seed {seed} step {step}: promote: {error}"));
                let (base, branch) = case.lines[line].base.take().unwrap();
                assert_eq!((report.base.volume.as_str(), report.base.at), (case.lines[base].name.as_str(), branch));
                assert!(report.base.copied && volume.base() == Some(report.base.clone()), "seed {seed}");
                assert!(progress.is_sorted() && progress.last() == Some(&(size, size)), "seed {seed}: {progress:?}");
                let again = case.node.promote_volume(volume.name().as_str(), &mut |_, _| {});
                assert!(
                    matches!(&again, Err(EngineError::InvalidArgument(message)) if message.contains("promoted already")),
                    "seed {seed}: {again:?}"
                );
                exercised.promotes += 1;
                case.check(line);
            }
            93..=94 if !case.group_bookmarks.is_empty() => {
                // Every root still in the group back to a group bookmark.
                let (name, _) = &case.group_bookmarks[rng.random_range(0..case.group_bookmarks.len())];
                let to = GroupRevertTo::Bookmark(name);
                let reports = case
                    .node
                    .revert_group("g", to, now, Writers::Refuse)
                    .unwrap_or_else(|error| panic!("seed {seed} step {step}: group revert: {error}"));
                let members = case.node.group("g").unwrap().members;
                assert_eq!(reports.iter().map(|(volume, _)| volume.clone()).collect::<Vec<_>>(), members);
                for (volume, report) in &reports {
                    let member = case.line_of(volume);
                    case.reverted(member, report);
                    case.check(member);
                }
                exercised.group_reverts += 1;
            }
            _ => {
                // Any kept point of any volume reads as its oracle says.
                let oracle = &case.lines[line].oracle;
                let (time, _) = oracle.states[rng.random_range(0..oracle.states.len())];
                if let Ok(exact) = volume.exact_time(time) {
                    let view = volume.view(exact).unwrap();
                    let mut image = vec![0; size as usize];
                    view.read(0, &mut image).unwrap();
                    assert!(
                        &image == oracle.at(exact),
                        "seed {seed} step {step}: {} at {exact:?}",
                        case.lines[line].name
                    );
                }
            }
        }
    }
    for line in case.live() {
        case.check(line);
    }
    case.restart(usize::MAX);
    exercised
}

#[test]
fn clones_read_their_base_at_the_branch_point_through_crashes() {
    if let Ok(seed) = std::env::var("REWIND_SEED") {
        println!("{:?}", run(seed.parse().expect("REWIND_SEED is a number")));
        return;
    }
    let seeds: u64 = std::env::var("REWIND_SEEDS").map_or(200, |count| count.parse().expect("a number"));
    let total = (0..seeds).map(run).fold(Exercised::default(), |total, case| Exercised {
        clones: total.clones + case.clones,
        clones_of_clones: total.clones_of_clones + case.clones_of_clones,
        crashes: total.crashes + case.crashes,
        base_deletes_refused: total.base_deletes_refused + case.base_deletes_refused,
        branch_deletes_refused: total.branch_deletes_refused + case.branch_deletes_refused,
        deletes: total.deletes + case.deletes,
        reverts: total.reverts + case.reverts,
        undos: total.undos + case.undos,
        thinned_under_clones: total.thinned_under_clones + case.thinned_under_clones,
        group_bookmarks: total.group_bookmarks + case.group_bookmarks,
        group_reverts: total.group_reverts + case.group_reverts,
        promotes: total.promotes + case.promotes,
        revert_blocks_copied: total.revert_blocks_copied + case.revert_blocks_copied,
    });
    println!("{total:?}");
    let enough = total.clones > 100
        && total.clones_of_clones > 30
        && total.crashes > 100
        && total.base_deletes_refused > 10
        && total.branch_deletes_refused > 10
        && total.deletes > 10
        && total.reverts > 100
        && total.undos > 30
        && total.thinned_under_clones > 0
        && total.group_bookmarks > 100
        && total.group_reverts > 30
        && total.promotes > 30
        && total.revert_blocks_copied > 100;
    assert!(
        seeds < 30 || enough,
        "clones, reverts, group bookmarks and reverts, promotes, crashes, refused deletes, thinning under clones and \
         the copy after reverts must be exercised"
    );
}

/// A write after a revert and a restart is after the revert, though the
/// journal holds nothing that late and the caller's clock is behind it.
#[test]
fn a_write_after_a_revert_and_a_restart_is_after_the_revert() {
    let storage = SimStorage::new(SimConfig::default(), 7);
    let at = Timestamp::from_unix_nanos;
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let volume = node.create_volume(spec, at(1_000)).unwrap();
    volume.write(at(2_000), 0, &[1; 4096], Durability::Fua).unwrap();
    volume.write(at(2_000), 4096, &[2; 4096], Durability::Fua).unwrap();
    let first = volume.timeline().timestamp_last.saturating_sub_nanos(1);
    let report = volume.revert(first, at(5_000), Writers::Refuse).unwrap();
    assert_eq!(report.revert.at, at(5_000));
    drop(volume);
    drop(node);
    storage.crash();
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let volume = node.volume("v").unwrap();
    // The caller's clock is behind the revert (another thread, a clock step).
    volume.write(at(3_000), 8192, &[3; 4096], Durability::Fua).unwrap();
    let mut image = vec![0; 3 * 4096];
    volume.read(0, &mut image).unwrap();
    assert_eq!(image[..4096], [1; 4096], "written before the point reverted to");
    assert_eq!(image[4096..8192], [0; 4096], "reverted away");
    assert_eq!(image[8192..], [3; 4096], "written after the revert");
}

/// A revert to "now" on a volume idle since its last write goes back to an
/// instant after that write: the revert is made after it, and the present
/// reads and the volume opens again. It was made at that same instant,
/// and every read of the present planned itself for ever (a stack
/// overflow), and the reverts file no longer decoded.
#[test]
fn a_revert_to_now_is_made_after_now() {
    let storage = SimStorage::new(SimConfig::default(), 13);
    let at = Timestamp::from_unix_nanos;
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let volume = node.create_volume(spec, at(1_000)).unwrap();
    volume.write(at(2_000), 0, &[1; 4096], Durability::Fua).unwrap();
    let report = volume.revert(at(5_000), at(5_000), Writers::Refuse).unwrap();
    assert!(report.revert.at > at(5_000), "{:?}", report.revert);
    let mut image = vec![0; 2 * 4096];
    volume.read(0, &mut image).unwrap();
    assert_eq!(image[..4096], [1; 4096], "as it was at the point: as it is");
    drop(volume);
    drop(node);
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    assert!(node.damaged_volumes().is_empty(), "{:?}", node.damaged_volumes());
    node.volume("v").unwrap().read(0, &mut image).unwrap();
    assert_eq!(image[..4096], [1; 4096]);
}

/// A bookmark and a clone made "now" pin the clock after the last write,
/// with no journal record of their own; after a crash the clock must still
/// start after them, or a write at the same instant would be stamped with
/// their time and show through to the bookmark's view and to the clone.
#[test]
fn a_write_after_a_bookmark_or_a_clone_at_now_and_a_restart_is_after_them() {
    let storage = SimStorage::new(SimConfig::default(), 11);
    let at = Timestamp::from_unix_nanos;
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let block = BlockSize::new(4096).unwrap();
    let source = node.create_volume(VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, block), at(1_000)).unwrap();
    let other = node.create_volume(VolumeSpec::new(VolumeName::new("w").unwrap(), 1 << 20, block), at(1_000)).unwrap();
    source.write(at(2_000), 0, &[1; 4096], Durability::Fua).unwrap();
    other.write(at(2_000), 0, &[1; 4096], Durability::Fua).unwrap();
    let bookmark = BookmarkName::new("at-now").unwrap();
    let marked = source.create_bookmark(bookmark.clone(), None, at(5_000)).unwrap().timestamp;
    let clone = node.clone_volume("w", None, VolumeName::new("c").unwrap(), at(5_000)).unwrap();
    assert_eq!((marked, clone.base().unwrap().at), (at(5_000), at(5_000)));
    drop((source, other, clone));
    drop(node);
    storage.crash();
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    // Written at the very instant of the bookmark and of the branch point.
    node.volume("v").unwrap().write(at(5_000), 0, &[2; 4096], Durability::Fua).unwrap();
    node.volume("w").unwrap().write(at(5_000), 0, &[2; 4096], Durability::Fua).unwrap();
    let mut block_read = vec![0; 4096];
    let source = node.volume("v").unwrap();
    source.view(marked).unwrap().read(0, &mut block_read).unwrap();
    assert!(block_read == [1; 4096], "the bookmark shows the state it named");
    node.volume("c").unwrap().read(0, &mut block_read).unwrap();
    assert!(block_read == [1; 4096], "the clone reads its base as it was at the branch point");
    source.read(0, &mut block_read).unwrap();
    assert!(block_read == [2; 4096], "the write is there, after them");
}

/// A clone's branch point stays exact through its base's recovery. The
/// base opens first and checkpoints what it replayed, thinning it; the
/// clone holds its branch point only once it is opened after that. A
/// version the granularity would let a later write in its window
/// supersede, but that the branch point needs, must survive (found by the
/// model above, seed 53 of another stream: a view of the base at the branch
/// point read the window's older version after a restart).
#[test]
fn a_branch_point_stays_exact_through_its_bases_recovery() {
    let storage = SimStorage::new(SimConfig::default(), 13);
    let at = Timestamp::from_unix_nanos;
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let spec = VolumeSpec {
        // One window for everything below: only its last version is kept,
        // and what is pinned.
        granularity_nanos: 1_000_000_000,
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap())
    };
    let base = node.create_volume(spec, at(1_000)).unwrap();
    base.write(at(2_000), 0, &[1; 4096], Durability::Fua).unwrap();
    base.write(at(3_000), 0, &[2; 4096], Durability::Fua).unwrap();
    let clone = node.clone_volume("v", None, VolumeName::new("c").unwrap(), at(4_000)).unwrap();
    let branch = clone.base().unwrap().at;
    base.write(at(5_000), 0, &[3; 4096], Durability::Fua).unwrap();
    drop((base, clone));
    drop(node);
    storage.crash();
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let mut block = vec![0; 4096];
    node.volume("v").unwrap().view(branch).unwrap().read(0, &mut block).unwrap();
    assert!(block == [2; 4096], "the base at the branch point: {}", block[0]);
    node.volume("c").unwrap().read(0, &mut block).unwrap();
    assert!(block == [2; 4096], "the clone reads its base at the branch point: {}", block[0]);
    node.volume("v").unwrap().read(0, &mut block).unwrap();
    assert!(block == [3; 4096], "the base now: {}", block[0]);
}

/// A damaged clone's branch point stays held on its base — exact, for the
/// clone's repair — also once its base, damaged too, is repaired; it is let
/// go when the clone is deleted, or repaired (it then holds it as an open
/// clone, once).
#[test]
fn a_damaged_clone_holds_its_branch_point_until_deleted_or_repaired() {
    for (base_damaged, clone_repaired) in [(false, false), (false, true), (true, true)] {
        let case = format!("base damaged {base_damaged}, clone repaired {clone_repaired}");
        let storage = SimStorage::new(SimConfig::default(), 17);
        // In a window of its own (the first since 1970 keeps every point).
        let at = |nanos: u64| Timestamp::from_unix_nanos(1_700_000_000_000_000_000 + nanos);
        let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
        let spec = VolumeSpec {
            // One window for everything: only its last version is kept, and
            // what is held.
            granularity_nanos: 1_000_000_000,
            ..VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap())
        };
        let base = node.create_volume(spec, at(1_000)).unwrap();
        base.write(at(2_000), 0, &[1; 4096], Durability::Fua).unwrap();
        let clone = node.clone_volume("v", None, VolumeName::new("c").unwrap(), at(3_000)).unwrap();
        let branch = clone.base().unwrap().at;
        base.write(at(4_000), 0, &[2; 4096], Durability::Fua).unwrap();
        base.create_bookmark(BookmarkName::new("later").unwrap(), None, at(5_000)).unwrap();
        drop((base, clone));
        drop(node);
        // Both copies of a metadata file damaged: the volume opens damaged
        // (and a clone of a damaged base too). The base's bookmarks, which
        // its repair resets, not its policy, which holds the granularity.
        let damage: &[&str] = if base_damaged { &["c/policy", "v/bookmarks"] } else { &["c/policy"] };
        for file in damage {
            let path = format!("volumes/{file}");
            let size = rewind_io::Storage::open_file(&storage, &path, rewind_io::OpenMode::Existing)
                .unwrap()
                .size_bytes()
                .unwrap();
            storage.corrupt(&path, 10, 0x20).unwrap();
            storage.corrupt(&path, size / 2 + 10, 0x20).unwrap();
        }
        let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
        assert_eq!(node.damaged_volumes().len(), damage.len(), "{case}");
        if base_damaged {
            let report = node.repair_volume("v", RepairMode::Apply, InUse::Refuse, at(6_000)).unwrap();
            assert!(report.repaired, "{case}: {report:?}");
        }
        let base = node.volume("v").unwrap();
        // A write in the next window closes the branch point's.
        base.write(at(1_500_000_000), 0, &[3; 4096], Durability::Fua).unwrap();
        // What the base pins is worked out again (its recovery pinned the
        // branch point until then).
        drop(base.view(at(1_500_000_000)).unwrap());
        assert!(base.view_exactly(branch, Timestamp::MAX).is_ok(), "{case}: the damaged clone holds its branch point");
        if clone_repaired {
            let report = node.repair_volume("c", RepairMode::Apply, InUse::Refuse, at(1_600_000_000)).unwrap();
            assert!(report.repaired, "{case}: {report:?}");
            assert!(
                base.view_exactly(branch, Timestamp::MAX).is_ok(),
                "{case}: the repaired clone holds its branch point"
            );
            let mut block = vec![0; 4096];
            node.volume("c").unwrap().read(0, &mut block).unwrap();
            assert!(block == [1; 4096], "{case}: the repaired clone reads its branch point: {}", block[0]);
        }
        node.delete_volume("c", InUse::Refuse, Clones::Refuse).unwrap();
        let held = base.view_exactly(branch, Timestamp::MAX).map(|view| view.at());
        assert!(held.is_err(), "{case}: the branch point is let go with the clone: {held:?}");
    }
}

/// A revert with `Writers::Disconnect` cuts its writers off under the
/// write lock: a write of theirs already waiting for that lock when the
/// revert is made fails, rather than being stamped after the revert and
/// landing in the reverted present. A writer writes without pause while
/// the volume is reverted to the point before it started; the present
/// must then read as at that point, every round.
#[test]
fn a_write_waiting_while_a_revert_cuts_its_writer_off_does_not_land() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const ROUNDS: u8 = 20;
    const BLOCKS: u64 = 8;
    let storage = SimStorage::new(SimConfig::default(), 17);
    let node = Node::open(Arc::new(storage), NodeConfig::default()).unwrap();
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let volume = node.create_volume(spec, Timestamp::from_unix_nanos(1_000)).unwrap();
    let clock = Arc::new(AtomicU64::new(2_000));
    let tick = |clock: &AtomicU64| Timestamp::from_unix_nanos(clock.fetch_add(1, Ordering::Relaxed));
    let mut waited_for = 0;
    for round in 1..=ROUNDS {
        volume.write(tick(&clock), 0, &[round; 4096], Durability::Fua).unwrap();
        let point = volume.timeline().timestamp_last;
        let mut expected = vec![0u8; (BLOCKS * 4096) as usize];
        volume.read(4096, &mut expected).unwrap();
        let writer = volume.attach(format!("writer {round}"), rewind_engine::Role::Live);
        let written = Arc::new(AtomicU64::new(0));
        let writing = {
            let (clock, written) = (Arc::clone(&clock), Arc::clone(&written));
            std::thread::spawn(move || loop {
                let block = 1 + written.load(Ordering::Relaxed) % BLOCKS;
                match writer.write(tick(&clock), block * 4096, &[round ^ 0xff; 4096], Durability::Buffered) {
                    Ok(()) => written.fetch_add(1, Ordering::Relaxed),
                    Err(EngineError::CutOff { .. }) => return,
                    Err(error) => panic!("round {round}: {error}"),
                };
            })
        };
        // The writer is under way (so the revert meets it at the lock).
        while written.load(Ordering::Relaxed) < 64 {
            std::thread::yield_now();
        }
        let report = volume.revert(point, tick(&clock), Writers::Disconnect).unwrap();
        assert_eq!(report.disconnected, [format!("writer {round}")]);
        writing.join().unwrap();
        waited_for += written.load(Ordering::Relaxed);
        let mut present = vec![0u8; expected.len()];
        volume.read(4096, &mut present).unwrap();
        assert!(present == expected, "round {round}: a cut-off writer's write landed after the revert");
    }
    println!("{waited_for} writes made before their writers were cut off");
}

/// A view or a bookmark at a past time after the last write raises the
/// clock to it: a write whose caller read the clock before (it waited for
/// room meanwhile) is stamped after the point, so the point's state never
/// changes once it is shown or named. It was stamped before the point and
/// showed through to the open view and to the bookmark.
#[test]
fn a_write_that_comes_in_after_a_view_or_bookmark_of_a_later_time_is_after_it() {
    let storage = SimStorage::new(SimConfig::default(), 19);
    let at = Timestamp::from_unix_nanos;
    let node = Node::open(Arc::new(storage), NodeConfig::default()).unwrap();
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let volume = node.create_volume(spec, at(1_000)).unwrap();
    volume.write(at(2_000), 0, &[1; 4096], Durability::Fua).unwrap();
    let view = volume.view(at(5_000)).unwrap();
    let bookmark = volume.create_bookmark(BookmarkName::new("then").unwrap(), Some(at(6_000)), at(7_000)).unwrap();
    assert_eq!((view.at(), bookmark.timestamp), (at(5_000), at(6_000)));
    assert_eq!(volume.timeline().timestamp_last, at(2_000), "the last write's time is still the last write's");
    // Its caller read the clock at 3 µs, before the view and the bookmark.
    volume.write(at(3_000), 0, &[2; 4096], Durability::Fua).unwrap();
    let mut block = vec![0; 4096];
    view.read(0, &mut block).unwrap();
    assert!(block == [1; 4096], "the open view is as it was shown");
    volume.view(bookmark.timestamp).unwrap().read(0, &mut block).unwrap();
    assert!(block == [1; 4096], "the bookmark names the state it named");
    volume.read(0, &mut block).unwrap();
    assert!(block == [2; 4096], "the write is in the present");
    assert!(
        volume.view_exactly(at(9_000), at(8_000)).is_err(),
        "a time after now, from outside, is refused (it would raise the clock past now)"
    );
}

/// `now` names the present wherever a time is read, so a bookmark of that
/// name could never be reached: it is refused, with what to do instead. A
/// granularity longer than 10 years is refused too (its first window,
/// counted from 1970, would hold today).
#[test]
fn a_bookmark_named_now_and_a_granularity_of_decades_are_refused() {
    let storage = SimStorage::new(SimConfig::default(), 29);
    let at = Timestamp::from_unix_nanos;
    let node = Node::open(Arc::new(storage), NodeConfig::default()).unwrap();
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let volume = node.create_volume(spec.clone(), at(1_000)).unwrap();
    let refused = volume.create_bookmark(BookmarkName::new("now").unwrap(), None, at(2_000)).unwrap_err();
    assert!(refused.to_string().contains("choose another name"), "{refused}");
    assert!(volume.bookmarks().is_empty());

    let fifty_years = 50 * 365 * 86_400 * 1_000_000_000;
    let refused =
        volume.set_policy(rewind_engine::PolicyChange { granularity_nanos: Some(fifty_years), ..Default::default() });
    assert!(refused.unwrap_err().to_string().contains("10 years"));
    let spec = VolumeSpec { granularity_nanos: fifty_years, name: VolumeName::new("w").unwrap(), ..spec };
    let refused = node.create_volume(spec, at(3_000)).err().expect("refused");
    assert!(refused.to_string().contains("10 years"), "{refused}");
}
