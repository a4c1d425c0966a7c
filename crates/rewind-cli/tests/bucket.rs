//! History off the machine (issue 14 req 2): `rewind serve --bucket` seals
//! packs locally, uploads them to a real MinIO, evicts them beyond
//! `--cache-max`, and serves views of evicted history from the bucket with
//! ranged reads; `rewind stats` and `/metrics` show where packs are and the
//! traffic each way; restores and clones read it too. While the bucket
//! does not answer, writes and archiving go on and the uploads wait; they
//! catch up once it answers. A node whose disk is lost is rebuilt from its
//! bucket alone (`rewind node recover`): byte images at bookmarks and at
//! times between them, fio's verified writes and an ext4 filesystem at two
//! bookmarks come back.

mod common;

use common::filesystem::FsTest;
use common::{json, require, run, wait_for, Server};
use rewind_chunks::conformance::noise;
use rewind_s3::minio::{Minio, LOCKED_BUCKET, PASSWORD, USER};

fn node_stats(server: &Server) -> serde_json::Value {
    json(&server.rewind(&["stats", "--json"]))
}

#[test]
fn history_goes_to_the_bucket_and_views_of_evicted_history_read_from_it() {
    require("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let minio = Minio::start(&dir.path().join("minio"));
    let endpoint = minio.endpoint();
    // Every pack goes up as it is sealed (small ones would wait for a catalog).
    let options = [
        "--bucket",
        "s3://rewind/node-1",
        "--endpoint",
        &endpoint,
        "--cache-max",
        "1MiB",
        "--archive-interval",
        "1s",
        "--upload-batch-below",
        "0",
    ];
    let env = [("AWS_ACCESS_KEY_ID", USER), ("AWS_SECRET_ACCESS_KEY", PASSWORD)];
    let server = Server::start_with_env(&dir.path().join("data"), &options, &env);
    server.rewind(&["volume", "create", "v", "--size", "8MiB"]);

    // Six rounds of 2 MiB that do not compress, each bookmarked and
    // archived into a pack of its own before the next.
    const ROUND: usize = 2 << 20;
    for round in 0..6u64 {
        let image = dir.path().join(format!("round-{round}.raw"));
        std::fs::write(&image, noise(round, ROUND)).unwrap();
        run("nbdcopy", &[image.to_str().unwrap(), &server.uri("v")]);
        server.rewind(&["bookmark", "v", &format!("r{round}")]);
        wait_for("the round to be archived", || node_stats(&server)["pack_count"].as_u64() > Some(round));
    }

    // Every pack uploaded; all but the newest four evicted from the disk.
    wait_for("every pack to be uploaded and the oldest evicted", || {
        let bucket = &node_stats(&server)["bucket"];
        bucket["upload_waiting_packs"] == 0 && bucket["evictions"].as_u64() >= Some(2)
    });
    let bucket = node_stats(&server)["bucket"].clone();
    assert!(bucket["bucket_packs"].as_u64() >= Some(6), "{bucket}");
    assert!(bucket["local_bytes"].as_u64() < bucket["bucket_bytes"].as_u64(), "{bucket}");
    assert_eq!(bucket["bucket_reads"], 0, "nothing read from the bucket yet: {bucket}");

    // The first round's view reads from the bucket, byte for byte.
    let out = dir.path().join("r0.raw");
    run("nbdcopy", &[&server.uri("v@r0"), out.to_str().unwrap()]);
    let read = std::fs::read(&out).unwrap();
    assert!(read[..ROUND] == noise(0, ROUND)[..], "the view at r0 reads what round 0 wrote");
    let bucket = node_stats(&server)["bucket"].clone();
    assert!(bucket["bucket_reads"].as_u64() > Some(0), "read from the bucket: {bucket}");
    assert!(bucket["bucket_read_bytes"].as_u64() >= Some(ROUND as u64 / 2), "{bucket}");

    // A restore of round 1 and a clone of round 0 read what left the disk too.
    let restored = dir.path().join("r1.restored");
    server.rewind(&["restore", "v@r1", "--to", restored.to_str().unwrap()]);
    assert!(std::fs::read(&restored).unwrap()[..ROUND] == noise(1, ROUND)[..], "the restore of r1");
    server.rewind(&["volume", "clone", "v@r0", "c"]);
    let cloned = dir.path().join("c.raw");
    run("nbdcopy", &[&server.uri("c"), cloned.to_str().unwrap()]);
    assert!(std::fs::read(&cloned).unwrap()[..ROUND] == noise(0, ROUND)[..], "the clone of r0");

    let text = server.rewind(&["stats"]);
    assert!(text.contains("bucket ") && text.contains("waiting for upload 0 B in 0 packs (oldest 0.0 s)"), "{text}");
    let metrics = run("curl", &["-sf", "-H", &server.authorization(), &format!("{}/metrics", server.api())]);
    let families = [
        "rewind_bucket_upload_waiting_bytes 0",
        "rewind_bucket_upload_lag_seconds 0",
        "rewind_bucket_pack_reads_total{from=\"bucket\"}",
    ];
    for family in families {
        assert!(metrics.contains(family), "{family} in /metrics");
    }
}

#[test]
fn writes_go_on_while_the_bucket_is_down_and_uploads_catch_up_after() {
    require("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let mut minio = Minio::start(&dir.path().join("minio"));
    let endpoint = minio.endpoint();
    let options = [
        "--bucket",
        "s3://rewind/node-2",
        "--endpoint",
        &endpoint,
        "--archive-interval",
        "1s",
        "--upload-alert-after",
        "1s",
        "--upload-batch-below",
        "0",
    ];
    let env = [("AWS_ACCESS_KEY_ID", USER), ("AWS_SECRET_ACCESS_KEY", PASSWORD)];
    let server = Server::start_with_env(&dir.path().join("data"), &options, &env);
    server.rewind(&["volume", "create", "v", "--size", "8MiB"]);
    const ROUND: usize = 1 << 20;
    let write_round = |round: u64| {
        let image = dir.path().join(format!("round-{round}.raw"));
        std::fs::write(&image, noise(round, ROUND)).unwrap();
        run("nbdcopy", &[image.to_str().unwrap(), &server.uri("v")]);
        server.rewind(&["bookmark", "v", &format!("r{round}")]);
        wait_for("the round to be archived", || node_stats(&server)["pack_count"].as_u64() > Some(round));
    };
    write_round(0);
    wait_for("the first pack to be uploaded", || node_stats(&server)["bucket"]["upload_waiting_packs"] == 0);

    minio.stop();
    for round in 1..4 {
        write_round(round);
    }
    let bucket = node_stats(&server)["bucket"].clone();
    assert_eq!(bucket["upload_waiting_packs"], 3, "three packs wait while the bucket is down: {bucket}");
    assert!(bucket["upload_lag_seconds"].as_f64() > Some(0.0), "the oldest has waited: {bucket}");
    wait_for("the alert: history waits for the bucket", || node_stats(&server)["bucket"]["alert"].is_string());
    let text = server.rewind(&["stats"]);
    assert!(text.contains("ALERT") && text.contains("a lost disk would lose it"), "{text}");

    minio.run();
    wait_for("the uploads to catch up", || node_stats(&server)["bucket"]["upload_waiting_packs"] == 0);
    assert!(node_stats(&server)["bucket"]["alert"].is_null(), "the alert ends with the backlog");
    assert!(node_stats(&server)["bucket"]["bucket_packs"].as_u64() >= Some(4));
    for round in 0..4u64 {
        let out = dir.path().join(format!("r{round}.out"));
        run("nbdcopy", &[&server.uri(&format!("v@r{round}")), out.to_str().unwrap()]);
        assert!(std::fs::read(&out).unwrap()[..ROUND] == noise(round, ROUND)[..], "round {round} reads back");
    }
}

/// The catalog covers each volume up to at least `nanos` (Unix).
fn catalog_covers(server: &Server, volumes: &[&str], nanos: u128) -> bool {
    let stats = node_stats(server);
    let Some(listed) = stats["bucket"]["catalog"]["volumes"].as_array().cloned() else { return false };
    volumes.iter().all(|name| {
        listed.iter().any(|volume| {
            volume["name"] == *name
                && volume["recoverable_to_unix_nanos"].as_u64().is_some_and(|at| u128::from(at) > nanos)
        })
    })
}

/// fio's verified random writes into the upper half of db (8 MiB): the
/// rounds of nbdcopy write the lower half.
fn fio_verified(uri: &str, extra: &[&str]) -> String {
    let uri = format!("--uri={uri}");
    let mut args = vec![
        "--name=verify",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bs=4k",
        "--offset=4M",
        "--size=4M",
        "--iodepth=8",
        "--verify=crc32c",
        "--randseed=42",
        // fio would otherwise leave a verify state file in the working directory.
        "--verify_state_save=0",
        &uri,
    ];
    args.extend_from_slice(extra);
    run("fio", &args)
}

#[test]
fn a_lost_node_is_recovered_from_its_bucket_alone() {
    require("nbdcopy");
    require("qemu-img");
    require("fio");
    require("nbdfuse");
    require("mkfs.ext4");
    require("losetup");
    let _mounts = FsTest::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let minio = Minio::start(&dir.path().join("minio"));
    let endpoint = minio.endpoint();
    let options = [
        "--bucket",
        "s3://rewind/lost-node",
        "--endpoint",
        &endpoint,
        "--cache-max",
        "1MiB",
        "--archive-interval",
        "1s",
        "--upload-interval",
        "1s",
    ];
    let env = [("AWS_ACCESS_KEY_ID", USER), ("AWS_SECRET_ACCESS_KEY", PASSWORD)];
    let data = dir.path().join("data");
    let mut server = Server::start_with_env(&data, &options, &env);
    server.rewind(&["volume", "create", "db", "--size", "8MiB"]);
    server.rewind(&["volume", "create", "logs", "--size", "4MiB", "--layout", "logging"]);
    server.rewind(&["volume", "create", "scratch", "--size", "4MiB", "--layout", "cow"]);
    const ROUND: usize = 2 << 20;
    let write = |server: &Server, volume: &str, seed: u64| {
        let image = dir.path().join(format!("{volume}-{seed}.raw"));
        std::fs::write(&image, noise(seed, ROUND)).unwrap();
        run("nbdcopy", &[image.to_str().unwrap(), &server.uri(volume)]);
    };
    let now_nanos = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let started = now_nanos();
    for round in 0..3u64 {
        write(&server, "db", round);
        write(&server, "logs", 100 + round);
        server.rewind(&["bookmark", "db", &format!("r{round}")]);
        server.rewind(&["bookmark", "logs", &format!("r{round}")]);
    }
    server.rewind(&["volume", "clone", "db@r0", "c"]);
    write(&server, "c", 9);
    write(&server, "scratch", 50);
    // fio's verified writes, then a filesystem's story: ext4 made, files
    // written, frozen and bookmarked, then changed and bookmarked again.
    fio_verified(&server.uri("db"), &["--fsync=16"]);
    server.rewind(&["bookmark", "db", "fio"]);
    server.rewind(&["volume", "create", "fs", "--size", "32MiB"]);
    let mut fs_test = FsTest::new(dir.path());
    let (fuse, mnt) = (fs_test.fuse.clone(), fs_test.mnt.clone());
    let disk = fs_test.attach(&server.uri("fs"), &fuse, false);
    run("mkfs.ext4", &["-q", &disk]);
    run("mount", &[&disk, mnt.to_str().unwrap()]);
    let (keep, doomed) = (noise(11, 3 << 20), noise(12, 1 << 20));
    std::fs::write(mnt.join("keep.bin"), &keep).unwrap();
    std::fs::write(mnt.join("doomed.bin"), &doomed).unwrap();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::write(mnt.join("dir/note.txt"), b"before the upgrade\n").unwrap();
    run("fsfreeze", &["-f", mnt.to_str().unwrap()]);
    server.rewind(&["bookmark", "fs", "before-upgrade"]);
    run("fsfreeze", &["-u", mnt.to_str().unwrap()]);
    std::fs::remove_file(mnt.join("doomed.bin")).unwrap();
    std::fs::write(mnt.join("dir/note.txt"), b"after the upgrade\n").unwrap();
    run("fsfreeze", &["-f", mnt.to_str().unwrap()]);
    server.rewind(&["bookmark", "fs", "after-upgrade"]);
    run("fsfreeze", &["-u", mnt.to_str().unwrap()]);
    fs_test.detach();
    let written = now_nanos();
    wait_for("a catalog covering every write", || catalog_covers(&server, &["db", "logs", "c", "fs"], written));
    // Points between the bookmarks too: five times spread over the history,
    // as Unix nanoseconds, read before the loss to compare after it.
    let points: Vec<String> =
        (0..5u128).map(|i| (started + (written - started) * (2 * i + 1) / 10).to_string()).collect();
    let read_point = |server: &Server, export: &str, tag: &str| {
        let out = dir.path().join(format!("{}-{tag}.raw", export.replace('@', "-")));
        run("nbdcopy", &[&server.uri(export), out.to_str().unwrap()]);
        out
    };
    let mut before = Vec::new();
    for point in &points {
        for volume in ["db", "logs"] {
            let export = format!("{volume}@{point}");
            before.push((read_point(&server, &export, "before"), export));
        }
    }
    let text = server.rewind(&["stats"]);
    assert!(text.contains("catalog         generation") && text.contains("recoverable to"), "{text}");
    let metrics = run("curl", &["-sf", "-H", &server.authorization(), &format!("{}/metrics", server.api())]);
    assert!(metrics.contains("rewind_bucket_recovery_point_age_seconds{volume=\"db\"}"), "{metrics}");

    // The machine is lost.
    server.kill();
    std::fs::remove_dir_all(&data).unwrap();

    let recovered = dir.path().join("recovered");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
    command
        .args(["--data-dir", recovered.to_str().unwrap(), "node", "recover"])
        .args(["--bucket", "s3://rewind/lost-node", "--endpoint", &endpoint, "--json"])
        .envs(env);
    let output = common::bounded_output(command);
    assert!(output.status.success(), "{}", common::describe(&output));
    let summary = json(&String::from_utf8_lossy(&output.stdout));
    let names: Vec<&str> = summary["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["c", "db", "fs", "logs"], "{summary}");
    let left_out = &summary["left_out"][0];
    assert_eq!(left_out["name"], "scratch", "{summary}");
    assert!(left_out["reason"].as_str().unwrap().contains("cow"), "{summary}");

    // Served again: every bookmark and the present of each volume read back.
    let server = Server::start_with_env(&recovered, &options, &env);
    let read = |export: &str| {
        let out = dir.path().join(format!("{}.out", export.replace('@', "-")));
        run("nbdcopy", &[&server.uri(export), out.to_str().unwrap()]);
        std::fs::read(&out).unwrap()
    };
    for round in 0..3u64 {
        assert!(read(&format!("db@r{round}"))[..ROUND] == noise(round, ROUND)[..], "db@r{round}");
        assert!(read(&format!("logs@r{round}"))[..ROUND] == noise(100 + round, ROUND)[..], "logs@r{round}");
    }
    assert!(read("db")[..ROUND] == noise(2, ROUND)[..], "db's present");
    for (before, export) in &before {
        let after = read_point(&server, export, "after");
        let (before, after) = (before.to_str().unwrap(), after.to_str().unwrap());
        let compared = run("qemu-img", &["compare", "-f", "raw", "-F", "raw", before, after]);
        assert!(compared.contains("identical"), "{export}: {compared}");
    }
    assert!(read("c")[..ROUND] == noise(9, ROUND)[..], "the clone's present");
    // fio's data verifies at its bookmark; the filesystem mounts at both of
    // its bookmarks and holds what it held.
    fio_verified(&server.uri("db@fio"), &["--verify_only"]);
    std::fs::create_dir(dir.path().join("after")).unwrap();
    let mut fs_test = FsTest::new(&dir.path().join("after"));
    let (fuse, fuse_view, mnt, old) =
        (fs_test.fuse.clone(), fs_test.fuse_view.clone(), fs_test.mnt.clone(), fs_test.old.clone());
    let before = fs_test.attach(&server.uri("fs@before-upgrade"), &fuse_view, true);
    run("mount", &["-o", "ro,noload", &before, old.to_str().unwrap()]);
    assert!(std::fs::read(old.join("keep.bin")).unwrap() == keep, "keep.bin before the upgrade");
    assert!(std::fs::read(old.join("doomed.bin")).unwrap() == doomed, "the deleted file, before the upgrade");
    assert_eq!(std::fs::read(old.join("dir/note.txt")).unwrap(), b"before the upgrade\n");
    let after = fs_test.attach(&server.uri("fs@after-upgrade"), &fuse, true);
    run("mount", &["-o", "ro,noload", &after, mnt.to_str().unwrap()]);
    assert!(std::fs::read(mnt.join("keep.bin")).unwrap() == keep, "keep.bin after the upgrade");
    assert!(!mnt.join("doomed.bin").exists(), "deleted after the upgrade");
    assert_eq!(std::fs::read(mnt.join("dir/note.txt")).unwrap(), b"after the upgrade\n");
    fs_test.detach();
    let info = json(&server.rewind(&["volume", "info", "c", "--json"]));
    assert_eq!(info["base"]["volume"], "db", "still a clone of db: {info}");
    // And it goes on: a write to the recovered volume, kept as history.
    write(&server, "db", 7);
    server.rewind(&["bookmark", "db", "after"]);
    assert!(read("db@after")[..ROUND] == noise(7, ROUND)[..]);
    assert!(read("db@r1")[..ROUND] == noise(1, ROUND)[..]);
}

/// Whether any file under `dir` holds the 64 bytes `probe`.
fn found_under(dir: &std::path::Path, probe: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().any(|entry| {
        let path = entry.unwrap().path();
        match path.is_dir() {
            true => found_under(&path, probe),
            false => std::fs::read(&path).unwrap().windows(probe.len()).any(|window| window == probe),
        }
    })
}

#[test]
fn an_encrypted_bucket_holds_nothing_readable_and_opens_only_with_its_key() {
    require("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let minio_dir = dir.path().join("minio");
    let minio = Minio::start(&minio_dir);
    let endpoint = minio.endpoint();
    let key = dir.path().join("key");
    std::fs::write(&key, "a passphrase only the operator knows\n").unwrap();
    let key = key.to_str().unwrap();
    let bucket = ["--bucket", "s3://rewind/sealed", "--endpoint", &endpoint];
    let tiering = ["--archive-interval", "1s", "--upload-interval", "1s", "--key-file", key];
    let options: Vec<&str> = bucket.iter().chain(&tiering).copied().collect();
    let env = [("AWS_ACCESS_KEY_ID", USER), ("AWS_SECRET_ACCESS_KEY", PASSWORD)];
    let data = dir.path().join("data");
    let mut server = Server::start_with_env(&data, &options, &env);
    server.rewind(&["volume", "create", "db", "--size", "4MiB"]);
    const ROUND: usize = 1 << 20;
    let image = dir.path().join("round.raw");
    std::fs::write(&image, noise(42, ROUND)).unwrap();
    run("nbdcopy", &[image.to_str().unwrap(), &server.uri("db")]);
    server.rewind(&["bookmark", "db", "sealed"]);
    let written = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    wait_for("a catalog covering the write", || catalog_covers(&server, &["db"], written));
    server.kill();
    // Packs, catalog and pieces are in MinIO's directory; none of the bytes written is.
    for offset in [0, ROUND / 3, ROUND - 64] {
        assert!(
            !found_under(&minio_dir, &noise(42, ROUND)[offset..offset + 64]),
            "plaintext at {offset} in the bucket"
        );
    }
    // The search would find it: the same bytes sent unsealed are found.
    let plain = rewind_s3::S3PackStore::new(&minio.config("plain")).unwrap();
    let mut upload = rewind_chunks::PackStore::create(&plain, 1).unwrap();
    upload.append(&noise(42, ROUND)).unwrap();
    upload.finish().unwrap();
    assert!(found_under(&minio_dir, &noise(42, ROUND)[ROUND / 3..ROUND / 3 + 64]), "unsealed bytes are found");

    let recover = |target: &std::path::Path, key: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
        command.args(["--data-dir", target.to_str().unwrap(), "node", "recover"]).args(bucket).envs(env);
        if let Some(key) = key {
            command.args(["--key-file", key]);
        }
        common::bounded_output(command)
    };
    let target = dir.path().join("recovered");
    let output = recover(&target, None);
    assert!(!output.status.success() && common::describe(&output).contains("the bucket is encrypted"));
    assert!(!target.exists(), "nothing written without the key");
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not the passphrase at all").unwrap();
    let output = recover(&target, Some(wrong.to_str().unwrap()));
    assert!(
        !output.status.success() && common::describe(&output).contains("does not open"),
        "{}",
        common::describe(&output)
    );
    assert!(!target.exists(), "nothing written with a wrong key");

    // Re-keyed to a new key file: the old one no longer opens it; the new one does.
    let new = dir.path().join("new-key");
    std::fs::write(&new, [7u8; 32]).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
    command
        .args(["node", "rekey"])
        .args(bucket)
        .args(["--key-file", key, "--new-key-file", new.to_str().unwrap()])
        .envs(env);
    let output = common::bounded_output(command);
    assert!(output.status.success(), "{}", common::describe(&output));
    assert!(!recover(&target, Some(key)).status.success(), "the old key no longer opens the bucket");
    let output = recover(&target, Some(new.to_str().unwrap()));
    assert!(output.status.success(), "{}", common::describe(&output));
    assert!(common::describe(&output).contains("bucket.json"), "it says how to serve it");

    // The recovered directory remembers its bucket, endpoint and key file:
    // another bucket is refused, and a plain `rewind serve` serves it.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
    command.args(["--data-dir", target.to_str().unwrap(), "serve", "--bucket", "s3://rewind/other"]).envs(env);
    let refused = common::describe(&common::bounded_output(command));
    assert!(refused.contains("cannot be served with --bucket s3://rewind/other"), "{refused}");
    let server = Server::start_with_env(&target, &["--archive-interval", "1s"], &env);
    let out = dir.path().join("sealed.out");
    run("nbdcopy", &[&server.uri("db@sealed"), out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap()[..ROUND] == noise(42, ROUND)[..], "the bookmark reads back");
}

/// Object lock (issue 14 req 6): a node served with `--lock` into a bucket
/// made with object lock has its history deleted with its own credentials
/// — the volume deleted, its chunks collected, newer catalogs published —
/// and the bucket still holds the older catalogs and everything they name:
/// `rewind node recover --as-of` brings the volume back as it was. A locked
/// bucket is not served, nor recovered, without `--lock`.
#[test]
fn history_in_a_locked_bucket_outlives_its_deletion() {
    require("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let minio = Minio::start(&dir.path().join("minio"));
    minio.create_locked_bucket();
    let endpoint = minio.endpoint();
    let env = [("AWS_ACCESS_KEY_ID", USER), ("AWS_SECRET_ACCESS_KEY", PASSWORD)];
    let url = format!("s3://{LOCKED_BUCKET}/node");
    let bucket = ["--bucket", &url, "--endpoint", &endpoint];
    let intervals = ["--archive-interval", "1s", "--upload-interval", "1s", "--gc-interval", "1s"];

    // Without --lock, a locked bucket is refused: deletes would only hide objects.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
    let unlocked = dir.path().join("unlocked");
    command.args(["--data-dir", unlocked.to_str().unwrap(), "serve"]).args(bucket).envs(env);
    let output = common::bounded_output(command);
    assert!(!output.status.success(), "{}", common::describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--lock PERIOD"), "{}", common::describe(&output));

    let data = dir.path().join("data");
    let options: Vec<&str> = bucket.iter().chain(&intervals).copied().chain(["--lock", "1h"]).collect();
    let mut server = Server::start_with_env(&data, &options, &env);
    let generation = |server: &Server| node_stats(server)["bucket"]["catalog"]["generation"].as_u64().unwrap_or(0);
    const SIZE: usize = 2 << 20;
    let write = |server: &Server, volume: &str, seed: u64| {
        let image = dir.path().join(format!("{volume}-{seed}.raw"));
        std::fs::write(&image, noise(seed, SIZE)).unwrap();
        run("nbdcopy", &[image.to_str().unwrap(), &server.uri(volume)]);
    };
    let now_nanos = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    server.rewind(&["volume", "create", "db", "--size", "2MiB"]);
    server.rewind(&["volume", "create", "other", "--size", "2MiB"]);
    write(&server, "db", 1);
    server.rewind(&["bookmark", "db", "good"]);
    let written = now_nanos();
    wait_for("a catalog covering db", || catalog_covers(&server, &["db"], written));
    let before_the_attack = now_nanos();

    // The attack, with the node's own credentials: db and its history
    // deleted, collected, and catalogs published until db's have left the
    // ones the node keeps.
    server.rewind(&["volume", "delete", "db", "--yes"]);
    let deleted_at = generation(&server);
    for seed in 0..4 {
        let last = generation(&server);
        write(&server, "other", 10 + seed);
        let written = now_nanos();
        wait_for("a newer catalog", || generation(&server) > last && catalog_covers(&server, &["other"], written));
    }
    let stats = node_stats(&server);
    let catalog = &stats["bucket"]["catalog"];
    assert!(catalog["generation"].as_u64().unwrap() >= deleted_at + 4, "{stats}");
    assert!(catalog["volumes"].as_array().unwrap().iter().all(|volume| volume["name"] != "db"), "{stats}");
    assert!(catalog["held_catalogs"].as_u64().unwrap() >= 1, "older catalogs held: {stats}");
    let lock = &catalog["lock"];
    assert_eq!(lock["period_seconds"], 3600, "{stats}");
    assert!(lock["waiting_to_expire"].as_u64().unwrap() >= 1, "deletes refused: {stats}");
    assert!(lock["held"].as_u64().unwrap() > lock["waiting_to_expire"].as_u64().unwrap(), "{stats}");
    let text = server.rewind(&["stats"]);
    assert!(text.contains("object lock") && text.contains("older catalogs kept"), "{text}");

    // The machine is lost too. Recovered as of before the attack, from the
    // catalogs and packs the lock kept.
    server.kill();
    std::fs::remove_dir_all(&data).unwrap();
    let recover = |into: &std::path::Path, extra: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
        command.args(["--data-dir", into.to_str().unwrap(), "node", "recover", "--json"]).args(bucket).args(extra);
        command.envs(env);
        common::bounded_output(command)
    };
    let recovered = dir.path().join("recovered");
    let output = recover(&recovered, &["--as-of", &before_the_attack.to_string()]);
    assert!(!output.status.success() && String::from_utf8_lossy(&output.stderr).contains("--lock"));
    let output = recover(&recovered, &["--as-of", &before_the_attack.to_string(), "--lock", "1h"]);
    assert!(output.status.success(), "{}", common::describe(&output));
    let summary = json(&String::from_utf8_lossy(&output.stdout));
    let names: Vec<&str> = summary["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["db", "other"], "{summary}");
    let server = Server::start_with_env(&recovered, &options, &env);
    let out = dir.path().join("db-good.out");
    run("nbdcopy", &[&server.uri("db@good"), out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == noise(1, SIZE), "db@good as it was before the attack");
}

/// Small packs do not become small objects (issue 14 req 2): six rounds of
/// history archived into six small packs wait for the next catalog (here,
/// the last at a clean stop), which puts them together; the bucket holds
/// one pack for them, and every round reads back from it after a restart.
#[test]
fn small_packs_go_to_the_bucket_together() {
    require("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let minio = Minio::start(&dir.path().join("minio"));
    let endpoint = minio.endpoint();
    let options = [
        "--bucket",
        "s3://rewind/batched",
        "--endpoint",
        &endpoint,
        "--archive-interval",
        "1s",
        "--upload-interval",
        "1h",
        "--cache-max",
        "0",
    ];
    let env = [("AWS_ACCESS_KEY_ID", USER), ("AWS_SECRET_ACCESS_KEY", PASSWORD)];
    let data = dir.path().join("data");
    let mut server = Server::start_with_env(&data, &options, &env);
    server.rewind(&["volume", "create", "v", "--size", "4MiB"]);
    const ROUND: usize = 512 << 10;
    for round in 0..6u64 {
        let image = dir.path().join(format!("round-{round}.raw"));
        std::fs::write(&image, noise(round, ROUND)).unwrap();
        run("nbdcopy", &[image.to_str().unwrap(), &server.uri("v")]);
        server.rewind(&["bookmark", "v", &format!("r{round}")]);
        // All of the round's history in packs, not only a pack more: in
        // one CI run (2026-12-04) a round's worth (538,720 bytes) went into
        // a pack of its own after the stop's catalog and was uploaded
        // alone after the restart, two packs in the bucket.
        wait_for("the round's history to wait in packs for the catalog", || {
            let archived = json(&server.rewind(&["stats", "v", "--json"]))["versions_in_journal"].as_u64() == Some(0);
            archived && node_stats(&server)["bucket"]["upload_waiting_packs"].as_u64() > Some(round)
        });
    }
    assert_eq!(node_stats(&server)["bucket"]["bucket_packs"], 0, "none uploaded one by one");
    server.stop();

    let server = Server::start_with_env(&data, &options, &env);
    let bucket = node_stats(&server)["bucket"].clone();
    assert_eq!(
        (bucket["bucket_packs"].as_u64(), bucket["upload_waiting_packs"].as_u64()),
        (Some(1), Some(0)),
        "{bucket}"
    );
    for round in 0..6u64 {
        let out = dir.path().join(format!("r{round}.out"));
        run("nbdcopy", &[&server.uri(&format!("v@r{round}")), out.to_str().unwrap()]);
        assert!(std::fs::read(&out).unwrap()[..ROUND] == noise(round, ROUND)[..], "round {round} reads back");
    }
}

/// Two nodes, one bucket (issue 14 req 7): `b` stores nothing that `a`
/// already stored — it borrows `a`'s chunks from `a`'s packs — and reads
/// them back from the bucket; `a`'s garbage collection keeps the packs `b`
/// borrows from however it is interrupted (kill -9 at a random moment of
/// it, the delay printed with its seed), and lets them go once `b`'s own
/// collection (killed too) has given them up: the bucket ends empty.
#[test]
fn two_nodes_share_a_bucket_and_collect_safely_while_the_other_writes() {
    require("nbdcopy");
    let seed: u64 = match std::env::var("REWIND_SEED") {
        Ok(seed) => seed.parse().expect("REWIND_SEED is a number"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    };
    println!("seed {seed} (REWIND_SEED={seed} replays the kill delays)");
    let dir = tempfile::tempdir().unwrap();
    let minio = Minio::start(&dir.path().join("minio"));
    let endpoint = minio.endpoint();
    let env = [("AWS_ACCESS_KEY_ID", USER), ("AWS_SECRET_ACCESS_KEY", PASSWORD)];
    // One data key for the bucket, wrapped by one key file both nodes have.
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "a passphrase both nodes know\n").unwrap();
    let key = key_file.to_str().unwrap();
    let bucket_options = ["--bucket", "s3://rewind/shared", "--endpoint", &endpoint, "--key-file", key];
    let start = |name: &str| {
        let options = [
            "--node-name",
            name,
            "--pool-grace",
            "12s",
            "--archive-interval",
            "1s",
            "--upload-interval",
            "1s",
            "--gc-interval",
            "1s",
            "--upload-batch-below",
            "0",
        ];
        let options: Vec<&str> = bucket_options.iter().chain(&options).copied().collect();
        Server::start_with_env(&dir.path().join(name), &options, &env)
    };
    let pool = |server: &Server| node_stats(server)["bucket"]["catalog"]["pool"].clone();
    let bucket = |server: &Server| node_stats(server)["bucket"].clone();
    const SIZE: usize = 8 << 20;
    const CHUNKS: u64 = (SIZE / 4096) as u64;
    let write = |server: &Server, volume: &str, image: u64| {
        let path = dir.path().join(format!("image-{image}.raw"));
        std::fs::write(&path, noise(image, SIZE)).unwrap();
        run("nbdcopy", &[path.to_str().unwrap(), &server.uri(volume)]);
    };
    let now_nanos = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    // A kill at a random moment of the collection a delete starts.
    let mut delays = (0..2).map(|round| (seed.wrapping_mul(2_654_435_761).rotate_left(round * 17)) % 1500);
    let kill_during_collection = |server: &mut Server, delay: u64| {
        println!("kill -9 {delay} ms after the delete");
        std::thread::sleep(std::time::Duration::from_millis(delay));
        server.kill();
    };

    let mut a = start("a");
    let mut b = start("b");
    a.rewind(&["volume", "create", "db", "--size", "8MiB"]);
    write(&a, "db", 1);
    let written = now_nanos();
    wait_for("a's catalog covering db", || catalog_covers(&a, &["db"], written));
    wait_for("b to read a's chunk table", || pool(&b)["chunks_lendable"].as_u64() >= Some(CHUNKS));

    // b writes the same bytes, bookmarks them and overwrites them.
    b.rewind(&["volume", "create", "copy", "--size", "8MiB"]);
    write(&b, "copy", 1);
    b.rewind(&["bookmark", "copy", "one"]);
    write(&b, "copy", 2);
    let written = now_nanos();
    wait_for("b's catalog covering copy", || catalog_covers(&b, &["copy"], written));
    let shared = pool(&b);
    assert_eq!(shared["node_name"], "b", "{shared}");
    assert_eq!(shared["chunks_borrowed"].as_u64(), Some(CHUNKS), "every chunk of image 1 borrowed: {shared}");
    let stored = node_stats(&b)["unique_stored_bytes"].as_u64().unwrap();
    assert!(stored < (SIZE + SIZE / 8) as u64, "b stored image 2 alone, {stored} bytes");
    assert!(pool(&a)["other_nodes"].as_array().unwrap().iter().any(|peer| peer["name"] == "b"), "{}", pool(&a));
    let text = b.rewind(&["stats"]);
    assert!(text.contains("shared bucket   node b (number 2); others: a (catalog"), "{text}");
    let read_back = |server: &Server, export: &str, image: u64| {
        let out = dir.path().join("read.raw");
        run("nbdcopy", &[&server.uri(export), out.to_str().unwrap()]);
        assert!(std::fs::read(&out).unwrap() == noise(image, SIZE), "{export} reads image {image}");
    };
    read_back(&b, "copy@one", 1);

    // a deletes db and collects, killed part-way; restarted, it collects
    // again, and keeps in the bucket every pack b borrows from.
    a.rewind(&["volume", "delete", "db", "--yes"]);
    kill_during_collection(&mut a, delays.next().unwrap());
    let a = start("a");
    wait_for("a to collect db's history", || node_stats(&a)["pack_count"] == 0);
    let generation = |server: &Server| bucket(server)["catalog"]["generation"].as_u64().unwrap_or(0);
    let (first_a, first_b) = (generation(&a), generation(&b));
    wait_for("several catalogs of both nodes past the grace period", || {
        generation(&a) >= first_a + 4 && generation(&b) >= first_b + 4
    });
    assert!(bucket(&a)["retired_packs"].as_u64() > Some(0), "kept for b: {}", bucket(&a));

    // b's machine is lost: recovered from the bucket under its name, its
    // present and copy@one rebuilt from a's packs as much as its own.
    b.kill();
    std::fs::remove_dir_all(dir.path().join("b")).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
    command.args(["--data-dir", dir.path().join("b").to_str().unwrap(), "node", "recover", "--json"]);
    command.args(bucket_options).args(["--node-name", "b"]).envs(env);
    let output = common::bounded_output(command);
    assert!(output.status.success(), "{}", common::describe(&output));
    // A mistyped name does not join (it would never publish, and hold every
    // deletion): the recovery is refused, naming the nodes.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
    command.args(["--data-dir", dir.path().join("typo").to_str().unwrap(), "node", "recover"]);
    command.args(bucket_options).args(["--node-name", "bb"]).envs(env);
    let output = common::bounded_output(command);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("the nodes are: a, b"), "{}", common::describe(&output));
    let mut b = start("b");
    read_back(&b, "copy@one", 1);
    read_back(&b, "copy", 2);

    // b lets copy go, killed during its collection too: a's packs leave
    // the bucket once b's catalogs no longer name them, and b's own go.
    b.rewind(&["volume", "delete", "copy", "--yes"]);
    kill_during_collection(&mut b, delays.next().unwrap());
    let b = start("b");
    wait_for("b to give back what it borrowed", || pool(&b)["chunks_borrowed"] == 0);
    wait_for("the bucket to empty", || {
        let (of_a, of_b) = (bucket(&a), bucket(&b));
        of_a["retired_packs"] == 0
            && of_a["bucket_packs"] == 0
            && of_b["retired_packs"] == 0
            && of_b["bucket_packs"] == 0
    });

    // A node that kept history in a bucket of its own cannot join: its packs
    // are numbered for a bucket of its own.
    let solo = dir.path().join("solo");
    let mut alone = Server::start_with_env(&solo, &["--bucket", "s3://rewind/solo", "--endpoint", &endpoint], &env);
    alone.stop();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"));
    command.args(["--data-dir", solo.to_str().unwrap(), "serve", "--bucket", "s3://rewind/solo"]);
    command.args(["--endpoint", &endpoint, "--node-name", "solo"]).envs(env);
    let output = common::bounded_output(command);
    assert!(!output.status.success(), "{}", common::describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot join"), "{}", common::describe(&output));
}

/// MYCDP's hot set (issue 14 req 2): a `logging` volume reads its present
/// from history, so the packs holding the newest version of its blocks stay
/// on the disk whatever `--cache-max` — here the oldest pack, which an
/// eviction by age and reads alone would have sent away — while superseded
/// history leaves it and is read back from the bucket.
#[test]
fn the_present_of_a_logging_volume_stays_on_the_disk() {
    require("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let minio = Minio::start(&dir.path().join("minio"));
    let endpoint = minio.endpoint();
    let options = [
        "--bucket",
        "s3://rewind/hot",
        "--endpoint",
        &endpoint,
        "--cache-max",
        "0",
        "--archive-interval",
        "1s",
        "--upload-interval",
        "1s",
        "--upload-batch-below",
        "0",
    ];
    let env = [("AWS_ACCESS_KEY_ID", USER), ("AWS_SECRET_ACCESS_KEY", PASSWORD)];
    let server = Server::start_with_env(&dir.path().join("data"), &options, &env);
    server.rewind(&["volume", "create", "log", "--size", "8MiB", "--layout", "logging"]);

    // Round 0 writes the whole volume, rounds 1 to 6 its first MiB only:
    // the present is round 6's first MiB and round 0's other seven.
    const SIZE: usize = 8 << 20;
    const MIB: usize = 1 << 20;
    for round in 0..=6u64 {
        let image = dir.path().join(format!("round-{round}.raw"));
        std::fs::write(&image, noise(round, if round == 0 { SIZE } else { MIB })).unwrap();
        run("nbdcopy", &[image.to_str().unwrap(), &server.uri("log")]);
        server.rewind(&["bookmark", "log", &format!("r{round}")]);
        wait_for("the round to be archived", || node_stats(&server)["pack_count"].as_u64() > Some(round));
    }
    wait_for("every pack uploaded and the superseded ones evicted", || {
        let bucket = &node_stats(&server)["bucket"];
        bucket["upload_waiting_packs"] == 0 && bucket["evictions"].as_u64() >= Some(2)
    });
    let bucket = node_stats(&server)["bucket"].clone();
    assert!(bucket["kept_packs"].as_u64() >= Some(1), "{bucket}");
    let reads = |server: &Server| node_stats(server)["bucket"]["bucket_reads"].as_u64().unwrap();
    let before = reads(&server);

    let out = dir.path().join("present.raw");
    run("nbdcopy", &[&server.uri("log"), out.to_str().unwrap()]);
    let present = std::fs::read(&out).unwrap();
    assert!(present[..MIB] == noise(6, MIB)[..] && present[MIB..] == noise(0, SIZE)[MIB..], "the present");
    assert_eq!(reads(&server), before, "the present read from the disk alone");

    let out = dir.path().join("r1.raw");
    run("nbdcopy", &[&server.uri("log@r1"), out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap()[..MIB] == noise(1, MIB)[..], "log@r1");
    assert!(reads(&server) > before, "superseded history read back from the bucket");
    let text = server.rewind(&["stats"]);
    assert!(text.contains("kept here"), "{text}");
}
