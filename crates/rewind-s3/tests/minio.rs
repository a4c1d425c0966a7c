//! The S3 pack store against a real MinIO (issue 14, req 1): the pack-store
//! conformance suite, the same with the fault wrapper around it, and a
//! MinIO that stops answering and comes back. `scripts/test.sh` installs
//! MinIO; `REWIND_MINIO` names another binary.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rewind_chunks::conformance::{check_faults, check_store};
use rewind_chunks::pack_store::FaultyPackStore;
use rewind_chunks::PackStore;
use rewind_s3::{S3Config, S3PackStore};

const USER: &str = "rewind-test";
const PASSWORD: &str = "rewind-test-secret";
const BUCKET: &str = "rewind";

fn minio_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REWIND_MINIO") {
        return PathBuf::from(path);
    }
    let home_go = std::env::var_os("HOME").map(|home| Path::new(&home).join("go/bin/minio"));
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join("minio")).find(|path| path.exists()));
    on_path.or(home_go.filter(|path| path.exists())).unwrap_or_else(|| {
        panic!("MinIO is needed (a real S3 server): scripts/test.sh installs it, or set REWIND_MINIO=/path/to/minio")
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A MinIO server on its own directory and port, with one bucket.
struct Minio {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl Minio {
    fn start() -> Minio {
        let dir = tempfile::tempdir().unwrap();
        // A top-level directory of the drive is a bucket to MinIO.
        std::fs::create_dir_all(dir.path().join("data").join(BUCKET)).unwrap();
        let mut minio = Minio { dir, port: free_port(), child: None };
        minio.run();
        minio
    }

    fn run(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("minio.log")).unwrap();
        let child = Command::new(minio_binary())
            .args(["server", "--quiet", "--address", &format!("127.0.0.1:{}", self.port)])
            .args(["--console-address", &format!("127.0.0.1:{}", free_port())])
            .arg(self.dir.path().join("data"))
            .env("MINIO_ROOT_USER", USER)
            .env("MINIO_ROOT_PASSWORD", PASSWORD)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start minio");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.ready() {
            assert!(Instant::now() < deadline, "MinIO did not start: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// MinIO's liveness check answers 200.
    fn ready(&self) -> bool {
        let url = format!("http://127.0.0.1:{}/minio/health/ready", self.port);
        ureq::get(&url).call().is_ok_and(|response| response.status() == 200)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("minio.log")).unwrap_or_default()
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn store(&self, prefix: &str) -> S3PackStore {
        let config = S3Config {
            prefix: prefix.to_owned(),
            access_key: Some((USER.to_owned(), PASSWORD.to_owned())),
            ..S3Config::from_url(&format!("s3://{BUCKET}"), Some(format!("http://127.0.0.1:{}", self.port))).unwrap()
        };
        S3PackStore::new(&config).unwrap()
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn the_s3_pack_store_keeps_the_contract_on_minio() {
    let minio = Minio::start();
    let store = minio.store("node-a");
    // 40 MiB: past one pack's target size of 32 MiB.
    check_store(&store, 1, 40 << 20);
    // Under another prefix, a store sees none of the first one's packs.
    let other = minio.store("node-b");
    check_store(&other, 1, 1 << 20);
}

#[test]
fn faults_around_the_s3_pack_store_stay_errors_of_their_calls() {
    let minio = Minio::start();
    let faulty = FaultyPackStore::new(Arc::new(minio.store("faults")));
    check_store(&faulty, 1, 3 << 20);
    check_faults(&faulty, 100);
}

#[test]
fn a_minio_that_stops_answering_fails_calls_transiently_until_it_is_back() {
    let mut minio = Minio::start();
    let store = minio.store("outage");
    let mut upload = store.create(1).unwrap();
    upload.append(&[1; 100_000]).unwrap();
    upload.finish().unwrap();

    minio.stop();
    let started = Instant::now();
    let errors = [
        store.stat(1).map(|_| ()).expect_err("stat"),
        store.list().map(|_| ()).expect_err("list"),
        store.delete(1).expect_err("delete"),
        {
            let mut upload = store.create(2).unwrap();
            upload.append(&[2; 1000]).unwrap();
            upload.finish().map(|_| ()).expect_err("finish")
        },
    ];
    for error in &errors {
        assert!(rewind_io::is_transient(error), "a store that does not answer fails transiently: {error}");
    }
    assert!(started.elapsed() < Duration::from_secs(60), "bounded by the retries: {:?}", started.elapsed());

    minio.run();
    let mut back = vec![0; 100_000];
    store.read(1, 0, &mut back).expect("read once MinIO is back");
    assert_eq!(back, vec![1; 100_000]);
    assert_eq!(store.list().unwrap().iter().map(|stored| stored.pack).collect::<Vec<_>>(), vec![1]);
    store.delete(1).unwrap();
}

/// The chunk store with its packs in MinIO: chunks stored, read back,
/// found again by dedup after reopening from the same directory and
/// bucket, and garbage collected from the bucket.
#[test]
fn the_chunk_store_keeps_its_packs_in_minio() {
    use rewind_chunks::{ChunkStore, ChunkStoreConfig, Counting};
    use rewind_io::{OsStorage, Storage};

    let minio = Minio::start();
    let local = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(local.path()).unwrap());
    let config = ChunkStoreConfig { pack_bytes_target: 256 << 10, ..ChunkStoreConfig::default() };
    let open = || {
        let packs: Arc<dyn PackStore> = Arc::new(minio.store("chunks"));
        ChunkStore::open_with_packs(Arc::clone(&storage), "chunks", config, packs).unwrap()
    };
    // Bytes that do not compress: 200 blocks fill several packs.
    let noise = |seed: u64| {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..4096).map(move |_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
    };
    let blocks: Vec<Vec<u8>> = (0..200u64).map(|index| noise(index).collect()).collect();
    let store = open();
    store.finish_open(Counting::Exact).unwrap();
    let mut session = store.session().unwrap();
    let ids: Vec<_> = blocks.iter().map(|block| session.put(block).unwrap()).collect();
    session.finish().unwrap();
    let in_bucket = minio.store("chunks").list().unwrap();
    assert!(in_bucket.len() >= 2, "several packs of 256 KiB: {in_bucket:?}");
    assert!(local.path().join("chunks/packs").read_dir().is_err(), "no pack is kept locally");
    drop(store);

    let store = open();
    for (id, block) in ids.iter().zip(&blocks) {
        store.mark(*id, block.len() as u32).unwrap();
    }
    store.finish_open(Counting::Exact).unwrap();
    let mut out = vec![0; 4096];
    for (id, block) in ids.iter().zip(&blocks) {
        store.read(*id, &mut out).unwrap();
        assert_eq!(&out, block);
    }
    let mut session = store.session().unwrap();
    assert_eq!(session.put(&blocks[7]).unwrap(), ids[7], "dedup finds the chunk in the bucket's packs");
    session.finish().unwrap();

    // Every reference let go: collection deletes the packs from the bucket.
    for (index, (id, block)) in ids.iter().zip(&blocks).enumerate() {
        store.release(*id, block.len() as u32);
        if index == 7 {
            store.release(*id, block.len() as u32);
        }
    }
    store.collect(&mut |_, _, _| {}).unwrap();
    assert!(minio.store("chunks").list().unwrap().is_empty(), "collected from the bucket");
}
