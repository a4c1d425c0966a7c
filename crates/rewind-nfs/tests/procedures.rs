//! Every NFSv3 procedure through a real client library (`nfs3_client`, over
//! TCP) against the server in this process on a real disk: results, weak
//! cache consistency, the errors RFC 1813 gives, handles that go stale,
//! `/.rewind`, and garbage that must not stop the server.

mod common;

use common::{connect, dir_op, mode, now, status, Connection};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use rewind_engine::{BookmarkName, Node, NodeConfig, VolumeName, VolumeSpec};
use rewind_io::OsStorage;
use rewind_nfs::{NfsConfig, NfsServer};
use rewind_tree::Trees;

async fn lookup(client: &mut Connection, dir: &nfs_fh3, text: &str) -> LOOKUP3res {
    client.lookup(&LOOKUP3args { what: dir_op(dir, text) }).await.unwrap()
}

async fn create(client: &mut Connection, dir: &nfs_fh3, text: &str, how: createhow3) -> nfs_fh3 {
    let created = client.create(&CREATE3args { where_: dir_op(dir, text), how }).await.unwrap().unwrap();
    let Nfs3Option::Some(handle) = created.obj else { panic!("CREATE returns the handle") };
    handle
}

async fn write(client: &mut Connection, file: &nfs_fh3, offset: u64, data: &[u8], stable: stable_how) -> WRITE3resok {
    let args =
        WRITE3args { file: file.clone(), offset, count: data.len() as u32, stable, data: Opaque::borrowed(data) };
    client.write(&args).await.unwrap().unwrap()
}

async fn read(client: &mut Connection, file: &nfs_fh3, offset: u64, count: u32) -> (Vec<u8>, bool) {
    let read = client.read(&READ3args { file: file.clone(), offset, count }).await.unwrap().unwrap();
    (read.data.to_vec(), read.eof)
}

async fn names(client: &mut Connection, dir: &nfs_fh3) -> Vec<String> {
    let mut all = Vec::new();
    let mut cookie = 0;
    loop {
        let args = READDIRPLUS3args {
            dir: dir.clone(),
            cookie,
            cookieverf: cookieverf3::default(),
            dircount: 512,
            maxcount: 1024,
        };
        let listing = client.readdirplus(&args).await.unwrap().unwrap();
        for entry in &listing.reply.entries.0 {
            cookie = entry.cookie;
            all.push(String::from_utf8(entry.name.0.to_vec()).unwrap());
            assert!(entry.name_handle.is_some() && entry.name_attributes.is_some(), "READDIRPLUS gives both");
        }
        if listing.reply.eof {
            break;
        }
    }
    all.sort();
    all
}

#[tokio::test(flavor = "current_thread")]
async fn every_procedure_answers_as_rfc_1813_says() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OsStorage::new(dir.path()).unwrap();
    let node = Arc::new(Node::open(Arc::new(storage), NodeConfig::default()).unwrap());
    node.create_volume(VolumeSpec::tree(VolumeName::new("home").unwrap()), now()).unwrap();
    let trees = Arc::new(Trees::new(Arc::clone(&node)));
    let server = NfsServer::new(Arc::clone(&trees), &[], NfsConfig::default());
    let address = server.serve_tcp("127.0.0.1:0").unwrap();
    let mut client = connect(address, "/home", 0).await;
    client.null().await.unwrap();
    let root = client.root_nfs_fh3();

    // FSINFO, FSSTAT, PATHCONF, GETATTR of the root.
    let info = client.fsinfo(&FSINFO3args { fsroot: root.clone() }).await.unwrap().unwrap();
    assert_eq!((info.rtmax, info.wtmax, info.maxfilesize), (1 << 20, 1 << 20, 64 << 30));
    let stat = client.fsstat(&FSSTAT3args { fsroot: root.clone() }).await.unwrap().unwrap();
    assert!(stat.tfiles > stat.ffiles && stat.tbytes > 0, "{stat:?}");
    let conf = client.pathconf(&PATHCONF3args { object: root.clone() }).await.unwrap().unwrap();
    assert_eq!(conf.name_max, 255);
    let root_attributes = client.getattr(&GETATTR3args { object: root.clone() }).await.unwrap().unwrap().obj_attributes;
    assert_eq!((root_attributes.type_, root_attributes.nlink, root_attributes.mode), (ftype3::NF3DIR, 2, 0o755));

    // CREATE in its three modes.
    let file = create(&mut client, &root, "a.txt", createhow3::UNCHECKED(mode(0o644))).await;
    let again = create(&mut client, &root, "a.txt", createhow3::UNCHECKED(mode(0o644))).await;
    assert_eq!(file, again, "UNCHECKED finds the file that is there");
    let guarded = CREATE3args { where_: dir_op(&root, "a.txt"), how: createhow3::GUARDED(mode(0o644)) };
    assert_eq!(status(client.create(&guarded).await.unwrap()), nfsstat3::NFS3ERR_EXIST);
    let verifier = createverf3([7; 8]);
    let exclusive = create(&mut client, &root, "x.txt", createhow3::EXCLUSIVE(verifier)).await;
    let retried = create(&mut client, &root, "x.txt", createhow3::EXCLUSIVE(verifier)).await;
    assert_eq!(exclusive, retried, "a retried exclusive create finds its own file");
    let other = CREATE3args { where_: dir_op(&root, "x.txt"), how: createhow3::EXCLUSIVE(createverf3([8; 8])) };
    assert_eq!(status(client.create(&other).await.unwrap()), nfsstat3::NFS3ERR_EXIST);

    // WRITE (all three stabilities), READ, COMMIT with the verifier.
    let unstable = write(&mut client, &file, 0, b"hello, ", stable_how::UNSTABLE).await;
    assert_eq!((unstable.count, unstable.committed), (7, stable_how::UNSTABLE));
    let Nfs3Option::Some(before) = unstable.file_wcc.before else { panic!("pre-op attributes") };
    assert_eq!(before.size, 0);
    let synced = write(&mut client, &file, 7, b"world", stable_how::FILE_SYNC).await;
    assert_eq!(synced.committed, stable_how::FILE_SYNC);
    assert_eq!(synced.verf, unstable.verf, "one verifier while the server runs");
    write(&mut client, &file, 20, b"!", stable_how::DATA_SYNC).await;
    let (data, eof) = read(&mut client, &file, 0, 100).await;
    assert_eq!(data, b"hello, world\0\0\0\0\0\0\0\0!", "a gap reads as zeros");
    assert!(eof);
    let (tail, eof) = read(&mut client, &file, 3, 4).await;
    assert_eq!((tail.as_slice(), eof), (&b"lo, "[..], false));
    let commit = client.commit(&COMMIT3args { file: file.clone(), offset: 0, count: 0 }).await.unwrap().unwrap();
    assert_eq!(commit.verf, unstable.verf);

    // SETATTR: size, mode, and the guard.
    let args = SETATTR3args {
        object: file.clone(),
        new_attributes: sattr3 { size: Nfs3Option::Some(5), ..mode(0o600) },
        guard: Nfs3Option::None,
    };
    let changed = client.setattr(&args).await.unwrap().unwrap();
    let Nfs3Option::Some(after) = changed.obj_wcc.after else { panic!("post-op attributes") };
    assert_eq!((after.size, after.mode), (5, 0o600));
    let stale_guard = SETATTR3args {
        object: file.clone(),
        new_attributes: mode(0o644),
        guard: Nfs3Option::Some(nfstime3 { seconds: 1, nseconds: 0 }),
    };
    assert_eq!(status(client.setattr(&stale_guard).await.unwrap()), nfsstat3::NFS3ERR_NOT_SYNC);
    assert_eq!(read(&mut client, &file, 0, 100).await.0, b"hello");

    // MKDIR, SYMLINK, READLINK, MKNOD, LINK, LOOKUP, ACCESS.
    let made =
        client.mkdir(&MKDIR3args { where_: dir_op(&root, "docs"), attributes: mode(0o755) }).await.unwrap().unwrap();
    let Nfs3Option::Some(docs) = made.obj else { panic!("MKDIR returns the handle") };
    let link = SYMLINK3args {
        where_: dir_op(&docs, "to-a"),
        symlink: symlinkdata3 {
            symlink_attributes: sattr3::default(),
            symlink_data: nfspath3(Opaque::borrowed(b"../a.txt")),
        },
    };
    let Nfs3Option::Some(symlink) = client.symlink(&link).await.unwrap().unwrap().obj else { panic!("a handle") };
    let target = client.readlink(&READLINK3args { symlink: symlink.clone() }).await.unwrap().unwrap();
    assert_eq!(target.data.0.as_ref(), b"../a.txt");
    let fifo = MKNOD3args { where_: dir_op(&docs, "pipe"), what: mknoddata3::NF3FIFO(mode(0o600)) };
    client.mknod(&fifo).await.unwrap().unwrap();
    let linked = client.link(&LINK3args { file: file.clone(), link: dir_op(&docs, "b.txt") }).await.unwrap().unwrap();
    let Nfs3Option::Some(linked) = linked.file_attributes else { panic!("attributes") };
    assert_eq!(linked.nlink, 2);
    let found = lookup(&mut client, &docs, "b.txt").await.unwrap();
    assert_eq!(found.object, file, "a hard link is the same file");
    assert_eq!(status(lookup(&mut client, &docs, "nope").await), nfsstat3::NFS3ERR_NOENT);
    assert_eq!(status(lookup(&mut client, &file, "x").await), nfsstat3::NFS3ERR_NOTDIR);
    let long = "n".repeat(256);
    assert_eq!(status(lookup(&mut client, &docs, &long).await), nfsstat3::NFS3ERR_NAMETOOLONG);
    let access = client.access(&ACCESS3args { object: file.clone(), access: ACCESS3_READ | ACCESS3_MODIFY }).await;
    assert_eq!(access.unwrap().unwrap().access, ACCESS3_READ | ACCESS3_MODIFY);
    assert_eq!(names(&mut client, &docs).await, [".", "..", "b.txt", "pipe", "to-a"]);

    // AUTH_SYS is honoured: another user may read a 0600 file of root's? No.
    let mut user = connect(address, "/home", 1000).await;
    let denied = user.read(&READ3args { file: file.clone(), offset: 0, count: 10 }).await.unwrap();
    assert_eq!(status(denied), nfsstat3::NFS3ERR_ACCES);
    let refused = CREATE3args { where_: dir_op(&root, "mine"), how: createhow3::UNCHECKED(mode(0o644)) };
    let refused = user.create(&refused).await.unwrap();
    assert_eq!(status(refused), nfsstat3::NFS3ERR_ACCES, "the root directory is 0755, root's");

    // A bookmark: the past under /.rewind, read-only, hidden from READDIR.
    let volume = node.volume("home").unwrap();
    let bookmark = volume.create_bookmark(BookmarkName::new("v1").unwrap(), None, now()).unwrap();

    // RENAME (over a file, into a directory), REMOVE, RMDIR.
    let renamed = RENAME3args { from: dir_op(&root, "x.txt"), to: dir_op(&docs, "b.txt") };
    client.rename(&renamed).await.unwrap().unwrap();
    assert_eq!(lookup(&mut client, &docs, "b.txt").await.unwrap().object, exclusive);
    let not_empty = client.rmdir(&RMDIR3args { object: dir_op(&root, "docs") }).await.unwrap();
    assert_eq!(status(not_empty), nfsstat3::NFS3ERR_NOTEMPTY);
    let is_dir = client.remove(&REMOVE3args { object: dir_op(&root, "docs") }).await.unwrap();
    assert_eq!(status(is_dir), nfsstat3::NFS3ERR_ISDIR);
    client.remove(&REMOVE3args { object: dir_op(&root, "a.txt") }).await.unwrap().unwrap();
    // The file's last name went: its handle is stale now, and stays so.
    let gone = client.getattr(&GETATTR3args { object: file.clone() }).await.unwrap();
    assert_eq!(status(gone), nfsstat3::NFS3ERR_STALE);
    let garbage = nfs_fh3 { data: Opaque::owned(vec![9; 20]) };
    assert_eq!(status(client.getattr(&GETATTR3args { object: garbage }).await.unwrap()), nfsstat3::NFS3ERR_BADHANDLE);

    let past = lookup(&mut client, &root, ".rewind").await.unwrap().object;
    assert!(!names(&mut client, &root).await.contains(&".rewind".to_owned()), "hidden like .zfs");
    // The name is taken: nothing else can have it, and it cannot go.
    let taken = CREATE3args { where_: dir_op(&root, ".rewind"), how: createhow3::UNCHECKED(mode(0o644)) };
    assert_eq!(status(client.create(&taken).await.unwrap()), nfsstat3::NFS3ERR_EXIST);
    let taken = MKDIR3args { where_: dir_op(&root, ".rewind"), attributes: mode(0o755) };
    assert_eq!(status(client.mkdir(&taken).await.unwrap()), nfsstat3::NFS3ERR_EXIST);
    let removed = client.remove(&REMOVE3args { object: dir_op(&root, ".rewind") }).await.unwrap();
    assert_eq!(status(removed), nfsstat3::NFS3ERR_ROFS);
    assert_eq!(lookup(&mut client, &root, ".rewind").await.unwrap().object, past, "still the past");
    assert_eq!(names(&mut client, &past).await, [".", "..", "v1"]);
    let then = lookup(&mut client, &past, "v1").await.unwrap().object;
    assert_eq!(names(&mut client, &then).await, [".", "..", "a.txt", "docs", "x.txt"]);
    let old = lookup(&mut client, &then, "a.txt").await.unwrap().object;
    assert_eq!(read(&mut client, &old, 0, 100).await.0, b"hello");
    let read_only = WRITE3args {
        file: old.clone(),
        offset: 0,
        count: 1,
        stable: stable_how::FILE_SYNC,
        data: Opaque::borrowed(b"x"),
    };
    assert_eq!(status(client.write(&read_only).await.unwrap()), nfsstat3::NFS3ERR_ROFS);
    let time = bookmark.timestamp.unix_nanos().to_string();
    let by_time = lookup(&mut client, &past, &time).await.unwrap().object;
    assert_eq!(
        names(&mut client, &by_time).await,
        [".", "..", "a.txt", "docs", "x.txt"],
        "a Unix time in ns names the same point"
    );
    assert_eq!(status(lookup(&mut client, &past, "no-such-bookmark").await), nfsstat3::NFS3ERR_NOENT);

    // Garbage on the wire: a call that does not decode gets GARBAGE_ARGS, a
    // huge record closes that connection, and the server goes on serving.
    let mut raw = TcpStream::connect(address).unwrap();
    let mut call = Vec::new();
    for word in [1u32, 0, 2, 100_003, 3, 1, 0, 0, 0, 0, 0xffff_fff0] {
        call.extend_from_slice(&word.to_be_bytes());
    }
    raw.write_all(&(0x8000_0000u32 | call.len() as u32).to_be_bytes()).unwrap();
    raw.write_all(&call).unwrap();
    let mut reply = [0u8; 28];
    raw.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[4..8], &1u32.to_be_bytes(), "the xid");
    assert_eq!(&reply[24..28], &4u32.to_be_bytes(), "GARBAGE_ARGS");
    raw.write_all(&0xffff_ffffu32.to_be_bytes()).unwrap();
    assert_eq!(raw.read(&mut reply).unwrap_or(0), 0, "an oversized record ends that connection");
    assert_eq!(names(&mut client, &root).await, [".", "..", "docs"]);

    // Handles outlive the server: the same handle works after a restart.
    drop(client);
    drop(user);
    server.shutdown();
    let server = NfsServer::new(Arc::new(Trees::new(Arc::clone(&node))), &[], NfsConfig::default());
    let address = server.serve_tcp("127.0.0.1:0").unwrap();
    let mut client = connect(address, "/home/docs", 0).await;
    assert_eq!(client.root_nfs_fh3(), docs, "MOUNT of a directory inside the export");
    assert_eq!(read(&mut client, &exclusive, 0, 10).await.0, b"");
}
