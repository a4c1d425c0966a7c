//! The proxy (UCDP-O, and UCDP-A asynchronously) in front of an upstream
//! NFSv3 server, through a real client library (`nfs3_client` over TCP).
//! The upstream here is Rewind's own NFS server on a node of its own, so
//! its tree's history is the truth the mirror's is checked against, at the
//! end and at points in between; `crates/rewind-cli/tests/proxy.rs` runs
//! the same proxy in front of nfs-ganesha.

mod common;

use common::{connect, dir_op, mode, now, status, Connection};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use rewind_engine::{Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_io::{OsStorage, SimConfig, SimStorage, Storage};
use rewind_nfs::{FileHandle, NfsConfig, NfsServer, Proxy, ProxyConfig, ProxyMode, UpstreamAddress};
use rewind_tree::{walk, Caller, CreateHow, FileKind, Mirror, Namespace, SetAttributes, Stability, Trees};

fn root() -> Caller {
    Caller::root([0; 16], 0)
}

async fn lookup(client: &mut Connection, dir: &nfs_fh3, text: &str) -> nfs_fh3 {
    let found = client.lookup(&LOOKUP3args { what: dir_op(dir, text) }).await.unwrap();
    match found {
        Nfs3Result::Ok(found) => found.object,
        Nfs3Result::Err((status, _)) => panic!("LOOKUP {text}: {status:?}"),
    }
}

async fn create(client: &mut Connection, dir: &nfs_fh3, text: &str) -> nfs_fh3 {
    let how = createhow3::GUARDED(mode(0o640));
    let created = client.create(&CREATE3args { where_: dir_op(dir, text), how }).await.unwrap().unwrap();
    let Nfs3Option::Some(handle) = created.obj else { panic!("CREATE returns the handle") };
    handle
}

async fn write(client: &mut Connection, file: &nfs_fh3, offset: u64, data: &[u8]) {
    let args = WRITE3args {
        file: file.clone(),
        offset,
        count: data.len() as u32,
        stable: stable_how::FILE_SYNC,
        data: Opaque::borrowed(data),
    };
    client.write(&args).await.unwrap().unwrap();
}

async fn read(client: &mut Connection, file: &nfs_fh3) -> Vec<u8> {
    let read = client.read(&READ3args { file: file.clone(), offset: 0, count: 1 << 20 }).await.unwrap().unwrap();
    read.data.to_vec()
}

/// Every path with its kind, size, mode, owner, link count and contents
/// (or target), sorted: what the mirror and the upstream must agree on.
/// (Times are not compared: the mirror's are when it recorded.)
fn describe(namespace: &dyn Namespace) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), namespace.getattr_root().unwrap())];
    while let Some((path, attributes)) = stack.pop() {
        let content = match attributes.kind {
            FileKind::Regular => {
                let (bytes, _) = namespace.read(attributes.handle, 0, 8 << 20, &root()).unwrap();
                format!("{} bytes, blake3 {}", bytes.len(), blake3::hash(&bytes))
            }
            FileKind::Symlink => {
                format!("-> {:?}", String::from_utf8_lossy(&namespace.readlink(attributes.handle).unwrap()))
            }
            _ => String::new(),
        };
        let links = if attributes.kind == FileKind::Directory { 0 } else { attributes.nlink };
        out.push(format!(
            "/{path} {:?} {} {:o} {}:{} {links} {content}",
            attributes.kind, attributes.size, attributes.mode, attributes.uid, attributes.gid
        ));
        if attributes.kind == FileKind::Directory {
            let listing = namespace.readdir(attributes.handle, 0, 10_000, &root()).unwrap();
            assert!(listing.eof);
            for entry in listing.entries.into_iter().filter(|entry| entry.name != b"." && entry.name != b"..") {
                let child =
                    format!("{path}{}{}", if path.is_empty() { "" } else { "/" }, String::from_utf8_lossy(&entry.name));
                stack.push((child, entry.attributes));
            }
        }
    }
    out.sort();
    out
}

/// A node with one tree, served over NFS.
struct Side {
    trees: Arc<Trees>,
    server: NfsServer,
    address: SocketAddr,
    name: &'static str,
}

impl Side {
    fn open(dir: &Path, name: &'static str, proxy: Option<(&Side, ProxyMode)>) -> (Side, Option<Arc<Proxy>>) {
        Side::open_with(dir, name, proxy, NfsConfig::default())
    }

    fn open_with(
        dir: &Path,
        name: &'static str,
        proxy: Option<(&Side, ProxyMode)>,
        config: NfsConfig,
    ) -> (Side, Option<Arc<Proxy>>) {
        Side::open_on(Arc::new(OsStorage::new(dir).unwrap()), name, proxy, config)
    }

    fn open_on(
        storage: Arc<dyn Storage>,
        name: &'static str,
        proxy: Option<(&Side, ProxyMode)>,
        config: NfsConfig,
    ) -> (Side, Option<Arc<Proxy>>) {
        let node = Arc::new(Node::open(storage, NodeConfig::default()).unwrap());
        if node.volume(name).is_err() {
            node.create_volume(VolumeSpec::tree(VolumeName::new(name).unwrap()), now()).unwrap();
        }
        let trees = Arc::new(Trees::new(node));
        let proxy = proxy.map(|(upstream, mode)| {
            let address =
                UpstreamAddress::resolve(&upstream.address.to_string(), Some(upstream.address.port())).unwrap();
            let config = ProxyConfig { upstream: address, export: None, mode };
            Proxy::start(trees.by_name(name, now()).unwrap(), config).unwrap()
        });
        let server = NfsServer::new(Arc::clone(&trees), proxy.as_slice(), config);
        let address = server.serve_tcp("127.0.0.1:0").unwrap();
        (Side { trees, server, address, name }, proxy)
    }

    fn present(&self) -> Vec<String> {
        describe(&self.trees.by_name(self.name, now()).unwrap().tree)
    }

    fn at(&self, at: Timestamp) -> Vec<String> {
        describe(&self.trees.by_name(self.name, now()).unwrap().tree.view(at).unwrap())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_update_through_the_proxy_is_the_upstreams_and_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _) = Side::open(&dir.path().join("upstream"), "origin", None);
    // The upstream holds files before the proxy is put in front of it.
    {
        let origin = upstream.trees.by_name("origin", now()).unwrap();
        let top = origin.tree.root().unwrap();
        let how = CreateHow::Guarded(SetAttributes { mode: Some(0o600), ..SetAttributes::default() });
        let (file, _) = origin.tree.create(top, b"pre.txt", &how, &root(), now()).unwrap();
        origin.tree.write(file.handle, 0, b"there before", Stability::FileSync, &root(), now()).unwrap();
        origin.tree.mkdir(top, b"old", &SetAttributes::default(), &root(), now()).unwrap();
    }
    let (mirror, proxy) = Side::open(&dir.path().join("mirror"), "shop", Some((&upstream, ProxyMode::Synchronous)));
    let proxy = proxy.unwrap();
    assert_eq!(mirror.present(), upstream.present(), "the first start copies the upstream in");

    let mut client = connect(mirror.address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    let pre = lookup(&mut client, &top, "pre.txt").await;
    assert_eq!(read(&mut client, &pre).await, b"there before");
    // Handles are the mirror's, not the upstream's.
    let decoded = FileHandle::decode(&pre.data.0).expect("a Rewind handle");
    assert_eq!(decoded.tree, mirror.trees.by_name("shop", now()).unwrap().id);
    let mut direct = connect(upstream.address, "/origin", 0).await;
    let direct_top = direct.root_nfs_fh3();
    let upstream_pre = lookup(&mut direct, &direct_top, "pre.txt").await;
    let forged = client.getattr(&GETATTR3args { object: upstream_pre.clone() }).await.unwrap();
    assert_ne!(status(forged), nfsstat3::NFS3_OK, "an upstream handle is not let through");

    // Every kind of update.
    let file = create(&mut client, &top, "a.txt").await;
    write(&mut client, &file, 0, b"first version").await;
    let written = now();
    write(&mut client, &file, 6, b"VERSION, longer").await;
    let setattr = SETATTR3args { object: file.clone(), new_attributes: mode(0o604), guard: sattrguard3::default() };
    client.setattr(&setattr).await.unwrap().unwrap();
    let made = client.mkdir(&MKDIR3args { where_: dir_op(&top, "d"), attributes: mode(0o750) }).await.unwrap();
    let Nfs3Option::Some(d) = made.unwrap().obj else { panic!("MKDIR returns the handle") };
    let symlink = SYMLINK3args {
        where_: dir_op(&d, "l"),
        symlink: symlinkdata3 {
            symlink_attributes: sattr3::default(),
            symlink_data: nfspath3(Opaque::borrowed(b"../a.txt")),
        },
    };
    client.symlink(&symlink).await.unwrap().unwrap();
    client.link(&LINK3args { file: file.clone(), link: dir_op(&d, "hard") }).await.unwrap().unwrap();
    let fifo = MKNOD3args { where_: dir_op(&d, "fifo"), what: mknoddata3::NF3FIFO(sattr3::default()) };
    client.mknod(&fifo).await.unwrap().unwrap();
    let middle = now();
    let rename = RENAME3args { from: dir_op(&top, "a.txt"), to: dir_op(&d, "b.txt") };
    client.rename(&rename).await.unwrap().unwrap();
    client.remove(&REMOVE3args { object: dir_op(&top, "pre.txt") }).await.unwrap().unwrap();
    client.rmdir(&RMDIR3args { object: dir_op(&top, "old") }).await.unwrap().unwrap();
    client.commit(&COMMIT3args { file: file.clone(), offset: 0, count: 0 }).await.unwrap().unwrap();
    // What the upstream refuses is passed on and not recorded.
    let recorded = proxy.status().recorded;
    let guarded = CREATE3args { where_: dir_op(&d, "b.txt"), how: createhow3::GUARDED(mode(0o600)) };
    assert_eq!(status(client.create(&guarded).await.unwrap()), nfsstat3::NFS3ERR_EXIST);
    assert_eq!(proxy.status().recorded, recorded, "a refused update is not history");

    assert_eq!(mirror.present(), upstream.present(), "the mirror is the upstream");
    for at in [written, middle] {
        assert_eq!(mirror.at(at), upstream.at(at), "the mirror's past is the upstream's");
    }
    let before_rename = mirror.at(middle);
    assert!(before_rename.iter().any(|line| line.starts_with("/pre.txt")), "{before_rename:?}");
    assert!(before_rename.iter().any(|line| line.starts_with("/a.txt")), "{before_rename:?}");

    // The renamed file keeps its handle; the history of it is there, with
    // the client as its author.
    assert_eq!(read(&mut client, &file).await, b"first VERSION, longer");
    let shop = mirror.trees.by_name("shop", now()).unwrap();
    let found = walk(&shop.tree, "d/b.txt").unwrap();
    let versions = shop.tree.history(found.handle, 100).unwrap();
    assert!(versions.len() >= 4, "created, written twice, chmodded: {versions:?}");
    assert!(versions.iter().all(|version| version.attributes.author.address[12..] == [127, 0, 0, 1]), "{versions:?}");

    // The past, through the proxy: /.rewind/TIME is the mirror's.
    let past = lookup(&mut client, &top, ".rewind").await;
    let then = lookup(&mut client, &past, &middle.unix_nanos().to_string()).await;
    let old = lookup(&mut client, &then, "pre.txt").await;
    assert_eq!(read(&mut client, &old).await, b"there before");
    let into_past = CREATE3args { where_: dir_op(&then, "no.txt"), how: createhow3::GUARDED(mode(0o600)) };
    assert_eq!(status(client.create(&into_past).await.unwrap()), nfsstat3::NFS3ERR_ROFS);

    // A change made on the upstream behind the proxy's back is taken in
    // when the proxy meets it.
    let behind = create(&mut direct, &direct_top, "behind.txt").await;
    write(&mut direct, &behind, 0, b"made upstream").await;
    let seen = lookup(&mut client, &top, "behind.txt").await;
    assert_eq!(read(&mut client, &seen).await, b"made upstream");
    assert_eq!(mirror.present(), upstream.present());
    mirror.server.shutdown();
    upstream.server.shutdown();
}

#[tokio::test(flavor = "current_thread")]
async fn every_update_a_synchronous_proxy_answered_survives_a_power_loss_of_the_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _) = Side::open(&dir.path().join("upstream"), "origin", None);
    // The mirror on a simulated disk whose power loss keeps only what was
    // synced (nothing random: no seed to print).
    let storage = SimStorage::new(SimConfig { write_survival: 0.0, ..SimConfig::default() }, 0);
    let (mirror, proxy) = Side::open_on(
        Arc::new(storage.clone()),
        "shop",
        Some((&upstream, ProxyMode::Synchronous)),
        NfsConfig::default(),
    );
    let mut client = connect(mirror.address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    // Metadata, a stable write, and an unstable one made stable by COMMIT:
    // NFS wants each durable when it is answered (the SETATTR of a mode
    // alone, which it does not, with the MKDIR after it).
    let file = create(&mut client, &top, "a.txt").await;
    write(&mut client, &file, 0, b"stable, ").await;
    let unstable = WRITE3args {
        file: file.clone(),
        offset: 8,
        count: 8,
        stable: stable_how::UNSTABLE,
        data: Opaque::borrowed(b"unstable"),
    };
    client.write(&unstable).await.unwrap().unwrap();
    client.commit(&COMMIT3args { file: file.clone(), offset: 0, count: 0 }).await.unwrap().unwrap();
    let setattr = SETATTR3args { object: file.clone(), new_attributes: mode(0o604), guard: sattrguard3::default() };
    client.setattr(&setattr).await.unwrap().unwrap();
    client.mkdir(&MKDIR3args { where_: dir_op(&top, "d"), attributes: mode(0o750) }).await.unwrap().unwrap();
    let d = lookup(&mut client, &top, "d").await;
    client.rename(&RENAME3args { from: dir_op(&top, "a.txt"), to: dir_op(&d, "b.txt") }).await.unwrap().unwrap();
    let answered = mirror.present();
    assert_eq!(answered, upstream.present());
    assert!(answered.iter().any(|line| line.starts_with("/d/b.txt Regular 16 604")), "{answered:?}");

    mirror.server.shutdown();
    drop((client, proxy, mirror));
    storage.crash();
    let (after, _) = Side::open_on(Arc::new(storage.clone()), "shop", None, NfsConfig::default());
    assert_eq!(after.present(), answered, "every answered update is in the mirror after the power loss");
    upstream.server.shutdown();
}

/// One client's share of `clients_racing_...`: creates, writes, removes,
/// mkdirs and rmdirs on names the other clients use too, so that updates
/// of one directory, and writes to a file another client removes, race.
/// Refusals (a name taken or gone meanwhile) are part of it.
async fn race(address: SocketAddr, seed: u64, client_index: u64) {
    let mut client = connect(address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    let shared = lookup(&mut client, &top, "shared").await;
    let own = lookup(&mut client, &top, &format!("own{client_index}")).await;
    let mut state = seed ^ (client_index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = move |bound: u64| {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % bound
    };
    for step in 0..150 {
        let dir = if next(3) == 0 { &own } else { &shared };
        let name = format!("n{}", next(6));
        match next(5) {
            0 | 1 => {
                let how = createhow3::UNCHECKED(mode(0o640));
                let _ = client.create(&CREATE3args { where_: dir_op(dir, &name), how }).await.unwrap();
            }
            2 => {
                let found = client.lookup(&LOOKUP3args { what: dir_op(dir, &name) }).await.unwrap();
                if let Nfs3Result::Ok(found) = found {
                    let data = format!("client {client_index} step {step}");
                    let args = WRITE3args {
                        file: found.object,
                        offset: next(3) * 16,
                        count: data.len() as u32,
                        stable: stable_how::FILE_SYNC,
                        data: Opaque::borrowed(data.as_bytes()),
                    };
                    let _ = client.write(&args).await.unwrap();
                }
            }
            3 => {
                let _ = client.remove(&REMOVE3args { object: dir_op(dir, &name) }).await.unwrap();
            }
            _ => {
                let _ =
                    client.mkdir(&MKDIR3args { where_: dir_op(dir, &name), attributes: mode(0o750) }).await.unwrap();
                let _ = client.rmdir(&RMDIR3args { object: dir_op(dir, &name) }).await.unwrap();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_racing_on_shared_directories_and_files_leave_the_mirror_as_the_upstream_without_comparisons() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    println!("seed {seed}");
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _) = Side::open(&dir.path().join("upstream"), "origin", None);
    let (mirror, proxy) = Side::open(&dir.path().join("mirror"), "shop", Some((&upstream, ProxyMode::Synchronous)));
    let proxy = proxy.unwrap();
    let mut client = connect(mirror.address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    for name in ["shared", "own0", "own1", "own2", "own3"] {
        client.mkdir(&MKDIR3args { where_: dir_op(&top, name), attributes: mode(0o777) }).await.unwrap().unwrap();
    }
    // A name that is not there is the upstream's answer, passed on (it once
    // ended the connection's thread instead, and the client waited on).
    let args = LOOKUP3args { what: dir_op(&top, "missing") };
    let lookup_missing = client.lookup(&args);
    let missing = tokio::time::timeout(std::time::Duration::from_secs(30), lookup_missing)
        .await
        .expect("an answer to a LOOKUP of a missing name")
        .unwrap();
    assert_eq!(status(missing), nfsstat3::NFS3ERR_NOENT);
    let before = proxy.status();
    let racers: Vec<_> = (0..4).map(|index| tokio::spawn(race(mirror.address, seed, index))).collect();
    for racer in racers {
        racer.await.unwrap();
    }
    assert_eq!(mirror.present(), upstream.present(), "seed {seed}");
    let after = proxy.status();
    assert!(after.recorded > before.recorded + 100, "seed {seed}: the race recorded updates");
    assert_eq!(
        (after.unrecorded, after.resyncs),
        (before.unrecorded, before.resyncs),
        "seed {seed}: every update was recorded as the upstream applied it, none brought in by a comparison"
    );
    mirror.server.shutdown();
    upstream.server.shutdown();
}

#[tokio::test(flavor = "current_thread")]
async fn a_commit_alone_makes_the_unstable_writes_before_it_survive_a_power_loss_of_the_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _) = Side::open(&dir.path().join("upstream"), "origin", None);
    let storage = SimStorage::new(SimConfig { write_survival: 0.0, ..SimConfig::default() }, 0);
    let (mirror, proxy) = Side::open_on(
        Arc::new(storage.clone()),
        "shop",
        Some((&upstream, ProxyMode::Synchronous)),
        NfsConfig::default(),
    );
    let mut client = connect(mirror.address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    let file = create(&mut client, &top, "a.txt").await;
    // The last update before the power loss is the COMMIT: the mirror's
    // flush, which now runs while the upstream syncs, must have happened
    // before its reply. (This is the durability it owes, not when it ran.)
    for offset in [0, 8] {
        let unstable = WRITE3args {
            file: file.clone(),
            offset,
            count: 8,
            stable: stable_how::UNSTABLE,
            data: Opaque::borrowed(b"unstable"),
        };
        client.write(&unstable).await.unwrap().unwrap();
    }
    client.commit(&COMMIT3args { file: file.clone(), offset: 0, count: 0 }).await.unwrap().unwrap();
    let answered = mirror.present();
    assert!(answered.iter().any(|line| line.starts_with("/a.txt Regular 16 ")), "{answered:?}");

    mirror.server.shutdown();
    drop((client, proxy, mirror));
    storage.crash();
    let (after, _) = Side::open_on(Arc::new(storage.clone()), "shop", None, NfsConfig::default());
    assert_eq!(after.present(), answered, "the committed writes are in the mirror after the power loss");
    upstream.server.shutdown();
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_mirror_disk_never_stops_the_upstream_and_the_mirror_catches_up_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _) = Side::open(&dir.path().join("upstream"), "origin", None);
    let storage = SimStorage::new(SimConfig::default(), 12);
    let (mirror, proxy) = Side::open_on(
        Arc::new(storage.clone()),
        "shop",
        Some((&upstream, ProxyMode::Synchronous)),
        NfsConfig::default(),
    );
    let proxy = proxy.unwrap();
    let mut client = connect(mirror.address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    let file = create(&mut client, &top, "data.bin").await;
    write(&mut client, &file, 0, b"recorded").await;
    assert_eq!(mirror.present(), upstream.present());

    // The mirror's disk fills (the journal's segment already made takes
    // some writes first). The upstream goes on applying updates, and
    // clients hear what it answered: writes succeed and read back from it.
    storage.set_capacity(Some(storage.used_bytes()));
    let block = vec![9u8; 1 << 20];
    let mut offset = 0;
    while proxy.status().unrecorded == 0 {
        assert!(offset < 256 << 20, "256 MiB fit on a full disk: {:?}", proxy.status());
        write(&mut client, &file, offset, &block).await;
        offset += block.len() as u64;
    }
    // Out of step now: the whole-tree comparison that would bring it back
    // is paced, not run before each of the updates that follow.
    let resyncs = proxy.status().resyncs;
    for _ in 0..20 {
        write(&mut client, &file, offset, &block).await;
    }
    let compared = proxy.status().resyncs - resyncs;
    assert!(compared < 10, "{compared} comparisons for 20 updates while full");
    let read = client.read(&READ3args { file: file.clone(), offset, count: 1 << 20 }).await.unwrap().unwrap();
    assert!(read.data.len() == 1 << 20 && read.data.iter().all(|&byte| byte == 9), "read from the upstream");
    // A file made meanwhile is made upstream; the out-of-step mirror has no
    // handle to give for it yet (RFC 1813 lets a CREATE reply leave it out:
    // the client looks the name up).
    let how = createhow3::GUARDED(mode(0o640));
    let made = client.create(&CREATE3args { where_: dir_op(&top, "new.txt"), how }).await.unwrap().unwrap();
    assert!(matches!(made.obj, Nfs3Option::None), "no handle the mirror cannot back: {:?}", proxy.status());
    let status_full = proxy.status();
    assert!(status_full.unrecorded > 0 && !status_full.in_step, "what did not fit is counted: {status_full:?}");
    assert_ne!(mirror.present(), upstream.present(), "the mirror is behind while its disk is full");
    let shop = mirror.trees.by_name("shop", now()).unwrap();
    assert!(shop.tree.volume().poison_cause().is_none(), "a full disk poisons nothing");

    // Space returns: within the pause between comparisons (at most 10 s),
    // an update brings the mirror in step again, with no restart.
    storage.set_capacity(None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while mirror.present() != upstream.present() {
        assert!(std::time::Instant::now() < deadline, "the mirror never caught up: {:?}", proxy.status());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        write(&mut client, &file, 0, b"recorded").await;
    }
    let status = proxy.status();
    assert!(status.in_step && status.resyncs > status_full.resyncs, "by comparing with the upstream: {status:?}");
    let new = lookup(&mut client, &top, "new.txt").await;
    write(&mut client, &new, 0, b"new").await;
    assert_eq!(mirror.present(), upstream.present());
    mirror.server.shutdown();
    upstream.server.shutdown();
}

#[tokio::test(flavor = "current_thread")]
async fn asynchronous_recording_stays_within_its_bounds_and_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _) = Side::open(&dir.path().join("upstream"), "origin", None);
    let (updates_max, bytes_max) = (4, 1 << 20);
    let mode = ProxyMode::Asynchronous { updates_max, bytes_max };
    let (mirror, proxy) = Side::open(&dir.path().join("mirror"), "shop", Some((&upstream, mode)));
    let proxy = proxy.unwrap();
    let mut client = connect(mirror.address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    let mut writes = 0;
    let mut pending_max = 0;
    for index in 0..8 {
        let file = create(&mut client, &top, &format!("f{index}")).await;
        for piece in 0..8u64 {
            let data = vec![(index * 8 + piece) as u8; 96 << 10];
            write(&mut client, &file, piece * (96 << 10), &data).await;
            writes += 1;
            let lag = proxy.status().lag.expect("an asynchronous proxy measures its lag");
            assert!(lag.pending_bytes <= bytes_max, "{lag:?}");
            pending_max = pending_max.max(lag.pending_updates);
        }
    }
    // At most the queue's updates, and the one being recorded.
    assert!(pending_max <= updates_max + 1, "{pending_max} updates behind");
    proxy.drain();
    let lag = proxy.status().lag.unwrap();
    assert_eq!(lag.pending_updates, 0);
    assert!(lag.recorded >= writes + 8, "{lag:?}");
    assert!(lag.max >= lag.mean && !lag.max.is_zero(), "{lag:?}");
    assert_eq!(mirror.present(), upstream.present(), "caught up");
    println!("asynchronous lag: {lag:?}, at most {pending_max} updates behind");
    mirror.server.shutdown();
    upstream.server.shutdown();
}

#[tokio::test(flavor = "current_thread")]
async fn a_restart_takes_in_what_changed_upstream_meanwhile_and_keeps_handles() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _) = Side::open(&dir.path().join("upstream"), "origin", None);
    let mirror_dir = dir.path().join("mirror");
    let (kept, stable_handle, before) = {
        let (mirror, _proxy) = Side::open(&mirror_dir, "shop", Some((&upstream, ProxyMode::Synchronous)));
        let mut client = connect(mirror.address, "/shop", 0).await;
        let top = client.root_nfs_fh3();
        for text in ["kept.txt", "changed.txt", "gone.txt"] {
            let file = create(&mut client, &top, text).await;
            write(&mut client, &file, 0, text.as_bytes()).await;
        }
        let kept = lookup(&mut client, &top, "kept.txt").await;
        mirror.server.shutdown();
        (kept.clone(), kept, now())
    };
    // While the proxy is down, the upstream changes.
    {
        let origin = upstream.trees.by_name("origin", now()).unwrap();
        let top = origin.tree.root().unwrap();
        let changed = walk(&origin.tree, "changed.txt").unwrap();
        origin.tree.write(changed.handle, 0, b"CHANGED while down", Stability::FileSync, &root(), now()).unwrap();
        origin.tree.remove(top, b"gone.txt", false, &root(), now()).unwrap();
        let (dir, _) = origin.tree.mkdir(top, b"new", &SetAttributes::default(), &root(), now()).unwrap();
        origin.tree.link(changed.handle, dir.handle, b"linked", &root(), now()).unwrap();
    }
    let (mirror, proxy) = Side::open(&mirror_dir, "shop", Some((&upstream, ProxyMode::Synchronous)));
    assert_eq!(mirror.present(), upstream.present(), "the start took the changes in");
    assert_eq!(proxy.unwrap().status().resyncs, 1);
    let old = mirror.at(before);
    assert!(old.iter().any(|line| line.starts_with("/gone.txt")), "the past before the restart stays: {old:?}");
    let mut client = connect(mirror.address, "/shop", 0).await;
    assert_eq!(read(&mut client, &stable_handle).await, b"kept.txt", "a handle lives across a restart");
    let top = client.root_nfs_fh3();
    assert_eq!(kept, lookup(&mut client, &top, "kept.txt").await);
    mirror.server.shutdown();
    upstream.server.shutdown();
}

#[tokio::test(flavor = "current_thread")]
async fn a_connection_the_upstream_closed_while_idle_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let idle = NfsConfig { idle_timeout: std::time::Duration::from_millis(50), ..NfsConfig::default() };
    let (upstream, _) = Side::open_with(&dir.path().join("upstream"), "origin", None, idle);
    let (mirror, _proxy) = Side::open(&dir.path().join("mirror"), "shop", Some((&upstream, ProxyMode::Synchronous)));
    let mut client = connect(mirror.address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    let file = create(&mut client, &top, "a.txt").await;
    // The upstream closes the proxy's kept connection once it is idle.
    while upstream.server.connection_count() > 0 {
        tokio::task::yield_now().await;
    }
    write(&mut client, &file, 0, b"after the upstream closed").await;
    assert_eq!(read(&mut client, &file).await, b"after the upstream closed");
    assert_eq!(mirror.present(), upstream.present());
    mirror.server.shutdown();
    upstream.server.shutdown();
}

#[tokio::test(flavor = "current_thread")]
async fn a_name_made_upstream_that_a_full_mirror_cannot_take_in_is_answered_try_again() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _) = Side::open(&dir.path().join("upstream"), "origin", None);
    let storage = SimStorage::new(SimConfig::default(), 13);
    let (mirror, proxy) = Side::open_on(
        Arc::new(storage.clone()),
        "shop",
        Some((&upstream, ProxyMode::Synchronous)),
        NfsConfig::default(),
    );
    let proxy = proxy.unwrap();
    let mut client = connect(mirror.address, "/shop", 0).await;
    let top = client.root_nfs_fh3();
    let file = create(&mut client, &top, "data.bin").await;
    // The mirror's disk fills: writes go on until one cannot be recorded.
    storage.set_capacity(Some(storage.used_bytes()));
    let block = vec![9u8; 1 << 20];
    let mut offset = 0;
    while proxy.status().unrecorded == 0 {
        assert!(offset < 256 << 20, "256 MiB fit on a full disk: {:?}", proxy.status());
        write(&mut client, &file, offset, &block).await;
        offset += block.len() as u64;
    }
    // Another program makes a file on the upstream, larger than what is
    // left: the proxy's LOOKUP finds a name its mirror does not know and
    // cannot take in. The client is told to try again, not that the server
    // failed.
    let mut behind = connect(upstream.address, "/origin", 0).await;
    let behind_top = behind.root_nfs_fh3();
    let made = create(&mut behind, &behind_top, "behind.bin").await;
    let contents = vec![7u8; 2 << 20];
    for (at, piece) in contents.chunks(1 << 20).enumerate() {
        write(&mut behind, &made, (at << 20) as u64, piece).await;
    }
    let found = client.lookup(&LOOKUP3args { what: dir_op(&top, "behind.bin") }).await.unwrap();
    let Nfs3Result::Err((refused, _)) = found else { panic!("a full mirror took in 2 MiB: {:?}", proxy.status()) };
    assert_eq!(refused, nfsstat3::NFS3ERR_JUKEBOX);

    // What the failed LOOKUP took in in part (the name) is not trusted:
    // once space returns, the same LOOKUP takes the whole file in.
    storage.set_capacity(None);
    let found = lookup(&mut client, &top, "behind.bin").await;
    let read = client.read(&READ3args { file: found, offset: 1 << 20, count: 1 << 20 }).await.unwrap().unwrap();
    assert_eq!(read.data.to_vec(), contents[1 << 20..]);
    let shop = mirror.trees.by_name("shop", now()).unwrap();
    let (kept, _) = shop.tree.read(walk(&shop.tree, "behind.bin").unwrap().handle, 0, 4 << 20, &root()).unwrap();
    assert!(kept == contents, "the mirror holds the file made upstream: {} bytes", kept.len());
    // And the mirror, out of step since, is brought in step by an update.
    assert!(!proxy.status().in_step);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while mirror.present() != upstream.present() {
        assert!(std::time::Instant::now() < deadline, "the mirror never caught up: {:?}", proxy.status());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        write(&mut client, &file, 0, b"recorded").await;
    }
    assert!(proxy.status().in_step);
    mirror.server.shutdown();
    upstream.server.shutdown();
}
