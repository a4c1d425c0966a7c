//! `rewind serve`: the NBD server, the management API and the maintenance
//! thread around one node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};

use rewind_access::{Grants, Tokens, ADMIN_TOKEN_FILE};
use rewind_engine::pool::Pool;
use rewind_engine::{
    Bucket, Clock, EngineError, Node, NodeConfig, Reserve, Retention, TierConfig, Timestamp, VolumeName, VolumeSpec,
};
use rewind_http::{AllowedHosts, ApiState, Door, HttpConfig};
use rewind_io::OsStorage;
use rewind_nbd::engine::{AccessPolicy, EngineCatalog};
use rewind_nbd::{NbdTls, Server, TlsMode};
use rewind_nfs::{Network, NfsConfig, NfsServer, Proxy, ProxyConfig, ProxyMode, UpstreamAddress};
use rewind_tree::{Mirror, Trees};

use rewind_s3::lock::ObjectLock;
use rewind_s3::{S3Config, S3MetaStore, S3PackStore};
use rewind_seal::{seal_bucket, KeySource};

use crate::limits::{self, LimitArgs};

/// Held by whoever uses a data directory, so two processes never do.
pub const LOCK_FILE: &str = "rewind.lock";

/// How often maintenance runs when nothing wakes it earlier.
const MAINTENANCE_PERIOD: Duration = Duration::from_millis(20);
/// How often the slow work on history (archiving, retention, merges,
/// garbage collection) looks for something to do.
const HISTORY_PERIOD: Duration = Duration::from_secs(1);
/// Threads uploading packs to the bucket, and how often each looks for work.
const UPLOADERS: usize = 2;
const UPLOAD_PERIOD: Duration = Duration::from_millis(500);
/// `--upload-alert-after`'s default, for commands that do not take it.
const DEFAULT_ALERT_AFTER_NANOS: u64 = 600_000_000_000;
/// Top-level files of the data directory the node's catalog keeps besides
/// the engine's own (tokens are not: a recovered node makes new ones).
const CATALOGED_NODE_FILES: [&str; 1] = [rewind_access::GRANTS_FILE];

/// The bucket a data directory's node keeps its history in: recorded in
/// `DATA_DIR/bucket.json` the first time it is served with `--bucket` (or
/// recovered from one), because once packs have left for the bucket the
/// node cannot be served without it. `rewind serve` and the offline
/// commands use it when no `--bucket` is given.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BucketRecord {
    pub url: String,
    pub endpoint: Option<String>,
    /// Absolute.
    pub key_file: Option<PathBuf>,
    /// The object lock everything written is held under (`--lock`), as given.
    #[serde(default)]
    pub lock: Option<String>,
    /// The node's name among the nodes sharing the bucket (`--node-name`).
    #[serde(default)]
    pub node_name: Option<String>,
    /// How long a pack no node needs waits before it leaves the bucket
    /// (`--pool-grace`), as given.
    #[serde(default)]
    pub pool_grace: Option<String>,
}

/// `--pool-grace`'s default: a generous bound on how far the nodes' clocks
/// and archive passes may lag.
const DEFAULT_POOL_GRACE: &str = "1h";

const BUCKET_FILE: &str = "bucket.json";

impl BucketRecord {
    pub fn new(
        url: &str,
        endpoint: Option<String>,
        key_file: Option<&Path>,
        lock: Option<&str>,
    ) -> Result<BucketRecord> {
        let key_file = key_file
            .map(|file| file.canonicalize().with_context(|| format!("cannot find the key file {}", file.display())))
            .transpose()?;
        if let Some(lock) = lock {
            parse_lock(lock)?;
        }
        Ok(BucketRecord {
            url: url.to_owned(),
            endpoint,
            key_file,
            lock: lock.map(str::to_owned),
            node_name: None,
            pool_grace: None,
        })
    }

    /// The node joins the nodes sharing the bucket as `name`
    /// (`rewind_engine::pool`), with a grace period (`--pool-grace`).
    pub fn in_pool(self, name: Option<String>, grace: Option<String>) -> Result<BucketRecord> {
        if let Some(grace) = &grace {
            parse_grace(grace)?;
        }
        Ok(BucketRecord { node_name: name, pool_grace: grace, ..self })
    }

    /// The bucket recorded for `data_dir`, if any.
    pub fn read(data_dir: &Path) -> Result<Option<BucketRecord>> {
        let path = data_dir.join(BUCKET_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).with_context(|| {
                format!("{} is damaged: it names the bucket this node's history is in", path.display())
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Records it for `data_dir` (atomically).
    pub fn write(&self, data_dir: &Path) -> Result<()> {
        let path = data_dir.join(BUCKET_FILE);
        let temporary = data_dir.join(format!("{BUCKET_FILE}.tmp"));
        let file =
            std::fs::File::create(&temporary).with_context(|| format!("cannot write {}", temporary.display()))?;
        serde_json::to_writer_pretty(&file, self)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path).with_context(|| format!("cannot write {}", path.display()))?;
        std::fs::File::open(data_dir)?.sync_all()?;
        Ok(())
    }

    /// The bucket, its packs kept locally up to `cache_max` bytes once
    /// uploaded; sealed under the bucket's data key, opened with the key
    /// file (see `rewind_seal`). A node named for a shared bucket joins
    /// the nodes sharing it, if it has not yet.
    pub fn open(&self, cache_max: Option<u64>) -> Result<Bucket> {
        self.open_as(cache_max, true)
    }

    /// [`BucketRecord::open`] for a node that must already be a member of
    /// the nodes sharing the bucket, if it is named (a recovery: a
    /// mistyped name must not join a node that never publishes).
    pub fn open_member(&self) -> Result<Bucket> {
        self.open_as(None, false)
    }

    fn open_as(&self, cache_max: Option<u64>, may_join: bool) -> Result<Bucket> {
        let url = &self.url;
        if self.node_name.is_some() && self.lock.is_some() {
            bail!(
                "--lock with --node-name: object lock is not yet kept for a bucket shared by several nodes (each \
                 would extend the others' holds); use a bucket, or prefix, per node to lock it"
            );
        }
        let s3 = S3Config::from_url(url, self.endpoint.clone()).map_err(anyhow::Error::msg)?;
        let mut packs = S3PackStore::new(&s3).with_context(|| format!("cannot use the bucket {url}"))?;
        let mut meta = S3MetaStore::new(&s3).with_context(|| format!("cannot use the bucket {url}"))?;
        let lock = match &self.lock {
            Some(lock) => {
                let lock = ObjectLock::new(&s3, parse_lock(lock)?).with_context(|| format!("cannot lock {url}"))?;
                Some(Arc::new(lock))
            }
            // Deletes that only hide objects behind delete markers would
            // go unnoticed: a locked bucket is served with its lock.
            None if rewind_s3::lock::has_lock(&s3).with_context(|| format!("cannot use the bucket {url}"))? => bail!(
                "{url} has object lock: serve (or recover) it with --lock PERIOD, how long what is written \
                 there is held (e.g. --lock 30d)"
            ),
            None => None,
        };
        if let Some(lock) = &lock {
            packs = packs.with_lock(Arc::clone(lock));
            meta = meta.with_lock(Arc::clone(lock));
        }
        let key = self.key_file.as_deref().map(KeySource::from_file).transpose()?;
        let (packs, meta) = seal_bucket(Arc::new(packs), Arc::new(meta), key.as_ref())
            .with_context(|| format!("cannot use the bucket {url}"))?;
        let mut tier = TierConfig { cache_bytes_max: cache_max.unwrap_or(u64::MAX), ..TierConfig::default() };
        let retention = lock.map(|lock| lock as Arc<dyn Retention>);
        let (meta, pool) = match &self.node_name {
            None => (meta, None),
            Some(name) => {
                let grace = parse_grace(self.pool_grace.as_deref().unwrap_or(DEFAULT_POOL_GRACE))?;
                let pool = match may_join {
                    true => Pool::join(meta, name, grace),
                    false => Pool::member(meta, name, grace),
                }
                .with_context(|| format!("cannot be node {name:?} of the nodes sharing {url}"))?;
                tier.node = pool.number;
                (pool.node_store(name), Some(pool))
            }
        };
        Ok(Bucket { packs, tier, meta, retention, alert_after_nanos: DEFAULT_ALERT_AFTER_NANOS, pool })
    }

    /// The bucket to serve `data_dir` with: the one given (which must be the
    /// one recorded, if any), else the one recorded.
    pub fn to_serve(data_dir: &Path, given: Option<BucketRecord>) -> Result<Option<BucketRecord>> {
        let recorded = BucketRecord::read(data_dir)?;
        match (recorded, given) {
            (Some(recorded), Some(given)) if recorded.url != given.url => bail!(
                "the history of the node in {} is in {} (recorded in {}): it cannot be served with --bucket {}",
                data_dir.display(),
                recorded.url,
                data_dir.join(BUCKET_FILE).display(),
                given.url
            ),
            (Some(recorded), Some(given)) if recorded.node_name.is_none() && given.node_name.is_some() => bail!(
                "the node in {} keeps its history in {} as a node of its own (recorded in {}): it cannot join the \
                 nodes sharing a bucket (--node-name) — its packs are numbered for a bucket of its own",
                data_dir.display(),
                recorded.url,
                data_dir.join(BUCKET_FILE).display()
            ),
            (Some(recorded), Some(given))
                if recorded.node_name.is_some()
                    && given.node_name.is_some()
                    && recorded.node_name != given.node_name =>
            {
                bail!(
                    "the node in {} is {:?} in {} (recorded in {}): it cannot be served as {:?}",
                    data_dir.display(),
                    recorded.node_name.unwrap_or_default(),
                    recorded.url,
                    data_dir.join(BUCKET_FILE).display(),
                    given.node_name.unwrap_or_default()
                )
            }
            // The lock, once given, stays until another is given.
            (recorded, Some(given)) => {
                let lock = given.lock.clone().or(recorded.as_ref().and_then(|recorded| recorded.lock.clone()));
                let node_name =
                    given.node_name.clone().or(recorded.as_ref().and_then(|recorded| recorded.node_name.clone()));
                let pool_grace = given.pool_grace.clone().or(recorded.and_then(|recorded| recorded.pool_grace));
                Ok(Some(BucketRecord { lock, node_name, pool_grace, ..given }))
            }
            (Some(recorded), None) => {
                tracing::info!(bucket = %recorded.url, "serving with the bucket recorded in {BUCKET_FILE}");
                Ok(Some(recorded))
            }
            (None, None) => Ok(None),
        }
    }
}

/// `--pool-grace` in nanoseconds.
fn parse_grace(text: &str) -> Result<u64> {
    let grace =
        humantime::parse_duration(text).with_context(|| format!("bad --pool-grace {text:?}; write it like 1h"))?;
    u64::try_from(grace.as_nanos())
        .ok()
        .filter(|&nanos| nanos > 0)
        .with_context(|| format!("--pool-grace {text:?} is out of range"))
}

/// `--lock`'s period: at least a second.
fn parse_lock(text: &str) -> Result<Duration> {
    let period = humantime::parse_duration(text).map_err(|error| anyhow::anyhow!("--lock {text:?}: {error}"))?;
    if period.as_secs() == 0 {
        bail!("--lock {text:?}: an object lock holds for a second at least (e.g. --lock 30d)");
    }
    Ok(period)
}

/// `--journal-io`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum JournalIo {
    Direct,
    Buffered,
}

/// Where NFS is served unless `--nfs` says otherwise.
const NFS_ADDRESS_DEFAULT: SocketAddr =
    SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 2049));

#[derive(Args)]
pub struct ServeArgs {
    /// NBD listening address (TCP).
    #[arg(long, default_value = "127.0.0.1:10809")]
    nbd: SocketAddr,
    /// Also serve NBD on this Unix socket.
    #[arg(long)]
    nbd_unix: Option<PathBuf>,
    /// NFSv3 listening address (TCP) for the file trees: MOUNT and NFS on this one port, no
    /// portmapper needed [default: 127.0.0.1:2049; if that is taken, by another NFS server say,
    /// NFS is not served and a warning says so, while an address given here must be free]
    #[arg(long)]
    nfs: Option<SocketAddr>,
    /// Do not serve NFS.
    #[arg(long)]
    no_nfs: bool,
    /// A network NFS clients may connect from (repeatable), e.g. 10.0.0.0/24; only this machine
    /// otherwise (AUTH_SYS believes whatever user a client says it is).
    #[arg(long = "nfs-allow", value_name = "NETWORK", value_parser = Network::parse)]
    nfs_allow: Vec<Network>,
    /// Management API listening address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// How often retention and space caps are applied: retention's clock
    /// advances and the index runs it thins further are rewritten (shorter:
    /// space back sooner, more rewriting).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    retention_interval: Duration,
    /// How often history moves from the journal into the deduplicated,
    /// compressed chunk store (sooner when 64 MiB of it waits).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    archive_interval: Duration,
    /// Do not lay out the history of bookmarks in block order in the
    /// background once archived (each costs up to a write of the volume's
    /// size, and views of them then read as fast as the present; `rewind
    /// volume defrag` still does it on demand).
    #[arg(long)]
    no_bookmark_layout: bool,
    /// How often garbage collection runs, when there is garbage.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    gc_interval: Duration,
    /// Free space on the data directory's filesystem that writes to volumes
    /// never use (they get ENOSPC below it), left to Rewind's own work —
    /// archiving, retention, history deletes, garbage collection, deleting
    /// volumes — so a full disk can be emptied with `rewind` itself: a size
    /// (1GiB) or a share of the filesystem (2%). Warned of below twice it.
    #[arg(long, default_value = "1%", value_parser = parse_reserve)]
    reserve: Reserve,
    /// Once a volume's journal has been quiet this long after a commit, a
    /// small vouch record is written so that damage to the last
    /// acknowledged writes is told from a torn write after a crash; 0s
    /// never writes one (bench/vouch.py measures the cost).
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    journal_vouch_after: Duration,
    /// While a volume is being written (a write within this long), its
    /// destaging, archiving and checkpoints wait so the burst has the disk —
    /// up to 1 GiB of history, or 2 GiB of journal for checkpoints — and
    /// catch up once writes pause; 0s never waits (bench/journal.py
    /// measures both).
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    burst_quiet: Duration,
    /// Memory the volumes' journals, together, keep what they wrote in until
    /// it is destaged. The journal writes around the page cache, so reads of
    /// blocks not destaged yet, and the destager's own, come from here
    /// instead of the disk; 0 keeps nothing. `auto`: an eighth of the
    /// memory this process may use (the machine's, or its cgroup's limit if
    /// lower), at least 64 MiB; it is held while a burst waits to be
    /// destaged, and its buffers a minute or two longer, for the next.
    /// Large writes (64 KiB or more) take at most an eighth of it: they
    /// are read back from the disk sequentially.
    #[arg(long, value_name = "SIZE|auto", default_value = "auto", value_parser = parse_memory_share)]
    journal_memory: MemoryShare,
    /// Memory for the version index's pages, verified and kept between
    /// reads, shared by all volumes: a view reads the index for every
    /// block, and an index larger than this is read from the files and
    /// checked again on every pass. `auto`: a thirty-second of the memory
    /// this process may use (as for `--journal-memory`), at least 64 MiB.
    #[arg(long, value_name = "SIZE|auto", default_value = "auto", value_parser = parse_memory_share)]
    index_cache: MemoryShare,
    /// Reads keep archiving waiting too (a pass under way pauses), up to
    /// this long after the last write, while the disk has room above twice
    /// the reserve for the history all volumes have waiting: a read job
    /// right after a burst of writes keeps the cores. In the journaled
    /// layout small reads (under 64 KiB on average) keep destaging and
    /// checkpoints waiting too (a pass stops between parts); 0s: nothing
    /// waits for reads.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    burst_reads: Duration,
    /// Tier history's packs to S3-compatible object storage: `s3://BUCKET/PREFIX`.
    /// Recorded in DATA_DIR/bucket.json: later starts (and `--offline`
    /// commands) use it without the option, since the history is there.
    /// Packs are sealed here, uploaded in the background, and evicted from
    /// the local disk beyond `--cache-max`. Credentials come from the AWS
    /// chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a web identity,
    /// instance metadata); `--endpoint` names a store other than AWS's.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    bucket: Option<String>,
    /// The S3-compatible endpoint of `--bucket` (MinIO, Ceph RGW, …), e.g.
    /// http://127.0.0.1:9000.
    #[arg(long, value_name = "URL", requires = "bucket")]
    endpoint: Option<String>,
    /// With `--bucket`: bytes of uploaded packs kept on the local disk (the
    /// newest packs, and those read last); the rest is read from the bucket.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    cache_max: Option<u64>,
    /// With `--bucket`: packs smaller than this (what a quiet minute of
    /// archiving makes) are not uploaded one by one but at the next catalog,
    /// rewritten into one first: a bucket bills, and slows, by the object.
    /// `0` uploads every pack as soon as it is sealed.
    #[arg(long, value_name = "SIZE", default_value = "8MiB", value_parser = parse_size_arg, requires = "bucket")]
    upload_batch_below: u64,
    /// With `--bucket`: how often the node's catalog (what `rewind node
    /// recover` rebuilds it from: volumes, bookmarks, policies, index runs,
    /// chunk table) is published to the bucket once archived history has
    /// changed. With `--archive-interval`, it bounds what a lost disk loses.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration, requires = "bucket")]
    upload_interval: Duration,
    /// With `--bucket`: encrypt everything sent to it (XChaCha20-Poly1305)
    /// under the bucket's data key, wrapped by this key: a file of 32 bytes
    /// (or 64 hex digits), or of a passphrase (stretched with Argon2id).
    /// A new bucket or prefix gets its data key on first use; one that is
    /// encrypted cannot be used without it. Keep a copy off this machine:
    /// without it, the bucket's history cannot be read.
    #[arg(long, value_name = "FILE", requires = "bucket")]
    key_file: Option<PathBuf>,
    /// With `--bucket`: once history has waited this long for its upload
    /// (the bucket unreachable, credentials refused), `rewind stats` shows
    /// an alert and the log says so (once).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration, requires = "bucket")]
    upload_alert_after: Duration,
    /// With `--bucket`: hold everything written there under S3 Object Lock
    /// (compliance mode) for this long (`30d`), extended while it is still
    /// wanted: history published inside the lock cannot be deleted, not
    /// even with the node's credentials; deletes wait for holds to run out.
    /// The bucket must have been created with object lock. Recorded in
    /// DATA_DIR/bucket.json.
    #[arg(long, value_name = "PERIOD", requires = "bucket")]
    lock: Option<String>,
    /// With `--bucket`: share the bucket with other nodes, as this node
    /// (a name unique among them): each writes its own volumes, and history
    /// one node has stored the others do not store again (they borrow it
    /// from its packs). Recorded in DATA_DIR/bucket.json.
    #[arg(long, value_name = "NAME", requires = "bucket")]
    node_name: Option<String>,
    /// With `--node-name`: a pack no node needs any more leaves the bucket
    /// once every node has published a catalog taken half this long after
    /// it was let go. The nodes' clocks must agree to within a quarter of
    /// it, and it must be at least 8 `--upload-interval`s (default 1h).
    #[arg(long, value_name = "DURATION", requires = "node_name")]
    pool_grace: Option<String>,
    /// How journals write: `direct` goes around the page cache (O_DIRECT;
    /// filesystems that refuse it get `buffered`, with a log line), which
    /// keeps one copy of every byte and syncs only what was written
    /// (bench/journal.py measures both).
    #[arg(long, value_enum, default_value_t = JournalIo::Direct)]
    journal_io: JournalIo,
    /// The most segment files (64 MiB each) a journal keeps for reuse: as
    /// many as it started between two reclaims at most in the last hour
    /// (the disk space its last burst took), and two written ahead at a
    /// quiet moment for journals that commit often. A commit into a reused
    /// file costs the disk one flush, into a new one a filesystem metadata
    /// commit as well, and large writes into new files run at about three
    /// quarters of the disk's speed. Spares beyond the two are given back
    /// when free space falls below twice `--reserve`. 0 deletes reclaimed
    /// segments and writes none ahead (bench/sync.py measures both).
    #[arg(long, value_name = "COUNT", default_value_t = 256)]
    journal_spares: usize,
    /// Do not write spare journal segment files at quiet moments in place of
    /// those the chunk store adopted (history written in runs that neither
    /// dedups nor compresses stays where the journal wrote it, so its file
    /// is never reused). Each such spare costs a segment's write of zeros
    /// while the volume is idle; without them a burst as large as the last
    /// writes into new files, at about four fifths of the disk's speed.
    #[arg(long)]
    no_journal_spares_ahead: bool,
    /// Do not ask the kernel for transparent huge pages behind the journals'
    /// batch buffers. They made 1 MiB writes into fresh buffers 1.15–1.3×
    /// faster here (BENCHMARKS.md), but where
    /// /sys/kernel/mm/transparent_hugepage/defrag is `madvise` or `always`
    /// the kernel compacts memory in place to find one, and on a fragmented
    /// machine the writer waits for that.
    #[arg(long)]
    no_journal_huge_pages: bool,
    /// TLS for NBD (STARTTLS): off; on (offered, optional); require (every
    /// option but STARTTLS refused before it). Default: require when
    /// --tls-cert is given, otherwise off.
    #[arg(long, value_enum)]
    tls: Option<TlsArg>,
    /// The server's certificate chain (PEM), for NBD TLS and for HTTPS: with
    /// it the API is served over HTTPS.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Require NBD clients to present a certificate signed by --tls-ca; its
    /// common name is the identity `rewind access grant` names.
    #[arg(long)]
    tls_verify_peer: bool,
    /// The CA (PEM) that signs NBD client certificates (with --tls-verify-peer).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// TLS-PSK keys in nbdkit's --tls-psk format: not supported (rustls, the
    /// TLS library, has no external pre-shared keys); use certificates.
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,
    /// Another host name the API answers to (the Host header), besides
    /// localhost, 127.0.0.1, ::1 and the --http address; repeatable.
    #[arg(long = "http-allowed-host", value_name = "NAME")]
    http_allowed_hosts: Vec<String>,
    /// Most API connections held at once; past it the longest idle one is
    /// closed, or, when all are busy, the newcomer refused.
    #[arg(long, default_value_t = HttpConfig::default().connections_max)]
    http_connections_max: usize,
    /// Longest wait for an API request's header, from when the server starts
    /// waiting (a new connection, or the end of the previous response: it is
    /// also how long a keep-alive connection may idle).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    http_header_timeout: Duration,
    /// Longest an API request body (an import) may stall without sending.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    http_body_timeout: Duration,
    #[command(flatten)]
    limits: LimitArgs,
    /// Serve NBD or the API on a non-loopback address without TLS (NBD: TLS
    /// required with client certificates; API: HTTPS).
    #[arg(long)]
    insecure: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TlsArg {
    Off,
    On,
    Require,
}

impl ServeArgs {
    fn tls_mode(&self) -> TlsMode {
        match (self.tls, &self.tls_cert) {
            (Some(TlsArg::Off), _) | (None, None) => TlsMode::Off,
            (Some(TlsArg::On), _) => TlsMode::On,
            (Some(TlsArg::Require), _) | (None, Some(_)) => TlsMode::Require,
        }
    }

    /// Refuses what cannot work, and what would open the node to its
    /// network without saying so, naming what to add.
    fn check(&self) -> Result<()> {
        if self.tls_psk.is_some() {
            bail!(
                "--tls-psk is not supported: rustls, Rewind's TLS library, has no external pre-shared keys \
                 (rustls issue 174). Use certificates: --tls-cert FILE --tls-key FILE, and for clients \
                 --tls-verify-peer --tls-ca FILE"
            );
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            bail!("--tls-cert and --tls-key go together: the certificate and its private key");
        }
        if self.tls_mode() != TlsMode::Off && self.tls_cert.is_none() {
            bail!("--tls on|require needs the server's certificate: add --tls-cert FILE --tls-key FILE");
        }
        if self.tls_verify_peer != self.tls_ca.is_some() {
            bail!("--tls-verify-peer and --tls-ca go together: the CA that signs the client certificates");
        }
        if self.tls_verify_peer && self.tls_mode() == TlsMode::Off {
            bail!("--tls-verify-peer needs TLS: drop --tls off");
        }
        if self.insecure {
            return Ok(());
        }
        if !self.http.ip().is_loopback() && self.tls_cert.is_none() {
            bail!(
                "refusing to serve the API on {} in plain HTTP, where anyone on the network can read its \
                 tokens: add --tls-cert FILE --tls-key FILE (the API then uses HTTPS), bind it to 127.0.0.1, \
                 or pass --insecure",
                self.http
            );
        }
        if !self.nbd.ip().is_loopback() {
            let mut missing = Vec::new();
            if self.tls_cert.is_none() {
                missing.push("--tls-cert FILE --tls-key FILE");
            }
            if self.tls_mode() != TlsMode::Require {
                missing.push("--tls require");
            }
            if !self.tls_verify_peer {
                missing.push("--tls-verify-peer --tls-ca FILE");
            }
            if !missing.is_empty() {
                bail!(
                    "refusing to serve NBD on {} without TLS and client certificates, where anyone who reaches \
                     it could read and write volumes: add {}, bind it to 127.0.0.1, or pass --insecure",
                    self.nbd,
                    missing.join(" and ")
                );
            }
        }
        Ok(())
    }
}

/// `--reserve`: `2%` or a size like `1GiB`.
fn parse_reserve(text: &str) -> Result<Reserve, String> {
    if let Some(percent) = text.strip_suffix('%') {
        return match percent.trim().parse::<u8>() {
            Ok(percent @ 0..=50) => Ok(Reserve::Percent(percent)),
            _ => Err(format!("{text:?}: a share of the filesystem from 0% to 50%")),
        };
    }
    parse_size::parse_size(text)
        .map(Reserve::Bytes)
        .map_err(|error| format!("{text:?} is neither a size (1GiB) nor a share (2%): {error}"))
}

fn parse_size_arg(text: &str) -> Result<u64, String> {
    crate::parse_bytes(text, "size").map_err(|error| format!("{error:#}"))
}

/// `--journal-memory`, `--index-cache`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MemoryShare {
    /// A share of the memory this process may use ([`memory_share_auto`]).
    Auto,
    Bytes(u64),
}

impl MemoryShare {
    /// The bytes this stands for: `Auto` as `1 / share` of the memory
    /// this process may use, at least `at_least`; logged, with `flag`.
    fn bytes(self, share: u64, at_least: u64, flag: &str, what: &str) -> u64 {
        match self {
            MemoryShare::Bytes(bytes) => bytes,
            MemoryShare::Auto => {
                let bytes = memory_share_auto(share, at_least);
                let shown = indicatif::HumanBytes(bytes);
                tracing::info!(bytes, "{what} {shown} ({flag} auto)");
                bytes
            }
        }
    }
}

fn parse_memory_share(text: &str) -> Result<MemoryShare, String> {
    if text.eq_ignore_ascii_case("auto") {
        return Ok(MemoryShare::Auto);
    }
    parse_size::Config::new()
        .with_binary()
        .parse_size(text)
        .map(MemoryShare::Bytes)
        .map_err(|error| format!("cannot read {text:?} as a size ({error}); write it like 3GiB or 512MiB, or auto"))
}

/// `--journal-memory auto` takes this share of the memory the process may
/// use. The read right after a burst of random writes reads what the
/// memory no longer holds from the disk: with a 3 GiB share of 23 GiB it
/// ran at 0.85 of rested (median), with a fixed 1 GiB at about 0.55, the
/// peak resident set 2.2 GiB against 1.5 (BENCHMARKS.md, "What the read
/// right after a burst waits for"). A share rather than a size, so that a
/// small machine is not asked for a gigabyte and a large one uses its room.
const JOURNAL_MEMORY_SHARE: u64 = 8;
/// What `--journal-memory auto` takes at least: the 64 MiB a journal kept
/// before the memory was shared.
const JOURNAL_MEMORY_AUTO_MIN: u64 = 64 << 20;
/// `--index-cache auto` takes this share of the memory the process may
/// use. An index takes 32 bytes a version: 103 MiB for a 1 GiB volume's
/// few million; with the fixed 64 MiB cache before, a view read of it
/// loaded and verified index pages on every pass (5.5% of the server's
/// samples, BENCHMARKS.md "Index pages and pack readers kept for a view read").
const INDEX_CACHE_SHARE: u64 = 32;
/// What `--index-cache auto` takes at least: the fixed size it had before.
const INDEX_CACHE_AUTO_MIN: u64 = 64 << 20;
/// The memory taken as usable where the machine's cannot be read.
const MEMORY_UNKNOWN: u64 = 8 << 30;

/// `1 / share` of the memory this process may use, at least `at_least`:
/// the smaller of the machine's (`/proc/meminfo`) and the limit of its
/// cgroup or any cgroup above it, as a container sees it.
fn memory_share_auto(share: u64, at_least: u64) -> u64 {
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| meminfo_total(&text));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|text| cgroup_limit(&text));
    let usable = machine.into_iter().chain(cgroup).min().unwrap_or_else(|| {
        let shown = indicatif::HumanBytes(MEMORY_UNKNOWN);
        tracing::warn!("cannot read this machine's memory; memory sized by a share of it takes {shown} as usable");
        MEMORY_UNKNOWN
    });
    (usable / share).max(at_least)
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn meminfo_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// The lowest memory limit on the way from this process's cgroup up to the
/// root of its hierarchy: cgroup v2 (`0::/a/b` in `/proc/self/cgroup`,
/// `memory.max`) or v1's memory controller (`4:memory:/a/b`,
/// `memory.limit_in_bytes`, "no limit" being a huge number). A path that
/// the mounted hierarchy does not show (a container's view) is walked up
/// until it does. `None` if no limit can be read.
fn cgroup_limit(self_cgroup: &str) -> Option<u64> {
    self_cgroup
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once(':')?;
            let (controllers, path) = rest.split_once(':')?;
            match controllers {
                "" => Some(("/sys/fs/cgroup", path, "memory.max")),
                _ if controllers.split(',').any(|name| name == "memory") => {
                    Some(("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes"))
                }
                _ => None,
            }
        })
        .filter_map(|(root, path, file)| lowest_limit_up_to(Path::new(root), path, file))
        .min()
}

fn lowest_limit_up_to(root: &Path, path: &str, file: &str) -> Option<u64> {
    let mut dir = root.join(path.trim_start_matches('/'));
    let mut lowest: Option<u64> = None;
    loop {
        let limit = std::fs::read_to_string(dir.join(file)).ok().and_then(|text| text.trim().parse().ok());
        lowest = lowest.into_iter().chain(limit).min();
        if dir == root || !dir.pop() {
            return lowest;
        }
    }
}

fn nanos(duration: Duration, option: &str) -> Result<u64> {
    let nanos = u64::try_from(duration.as_nanos()).with_context(|| format!("{option} is too long"))?;
    Ok(nanos.max(1))
}

pub fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// The system clock, for the engine's one wait: an archive pass pausing for
/// reads (see `rewind_engine::Clock`).
struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        now()
    }

    fn sleep(&self, nanos: u64) {
        thread::sleep(Duration::from_nanos(nanos));
    }
}

/// `rewind proxy`: `rewind serve`, with one tree's present forwarded to an
/// NFSv3 server Rewind does not run, every update it applies recorded in
/// the tree (UCDP-O; UCDP-A with `--async`).
#[derive(Args)]
pub struct ProxyArgs {
    /// The NFSv3 server to protect: HOST:PORT of its NFS service (nfs-ganesha, a kernel nfsd …).
    #[arg(long, value_name = "HOST:PORT")]
    upstream: String,
    /// The tree that keeps its history (made if there is none); clients mount /TREE from here.
    #[arg(long)]
    tree: String,
    /// The upstream export to protect [default: its only export].
    #[arg(long, value_name = "PATH")]
    upstream_export: Option<String>,
    /// The upstream's MOUNT port [default: what its portmapper says, else its NFS port].
    #[arg(long, value_name = "PORT")]
    upstream_mount_port: Option<u16>,
    /// Answer each update once the upstream has applied it and record it behind, in order, durable
    /// with the journal's next flush (UCDP-A; without it, each update is in history before its client
    /// hears back). A crash loses the steps still queued or unflushed, never the upstream's data: the
    /// next start records the state they led to.
    #[arg(long = "async")]
    asynchronous: bool,
    /// Updates the asynchronous queue holds before clients wait for it.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..), requires = "asynchronous")]
    async_queue_updates: u64,
    /// WRITE data the asynchronous queue holds before clients wait for it (at least 1MiB).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size_arg, requires = "asynchronous")]
    async_queue_bytes: u64,
    #[command(flatten)]
    serve: ServeArgs,
}

pub fn proxy(data_dir: &Path, args: ProxyArgs) -> Result<()> {
    if args.serve.no_nfs {
        bail!("rewind proxy serves NFS: leave out --no-nfs");
    }
    if args.async_queue_bytes < 1 << 20 {
        bail!("--async-queue-bytes must hold one 1MiB WRITE at least");
    }
    let upstream = UpstreamAddress::resolve(&args.upstream, args.upstream_mount_port)
        .with_context(|| format!("--upstream {}", args.upstream))?;
    let mode = match args.asynchronous {
        false => ProxyMode::Synchronous,
        true => ProxyMode::Asynchronous {
            updates_max: usize::try_from(args.async_queue_updates)?,
            bytes_max: usize::try_from(args.async_queue_bytes)?,
        },
    };
    let proxy = ProxyTo { tree: args.tree, config: ProxyConfig { upstream, export: args.upstream_export, mode } };
    run(data_dir, args.serve, Some(proxy))
}

/// The tree a `rewind proxy` records, and its upstream.
struct ProxyTo {
    tree: String,
    config: ProxyConfig,
}

pub fn serve(data_dir: &Path, args: ServeArgs) -> Result<()> {
    run(data_dir, args, None)
}

fn run(data_dir: &Path, args: ServeArgs, proxy_to: Option<ProxyTo>) -> Result<()> {
    args.check()?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls::server(cert, key, args.tls_ca.as_deref())?),
        _ => None,
    };
    limits::init_logging(args.limits.log_format);
    let nbd_listeners = 1 + usize::from(args.nbd_unix.is_some());
    let limits = args.limits.apply(nbd_listeners, tls.is_some())?;
    let storage = OsStorage::new(data_dir).with_context(|| format!("cannot use {}", data_dir.display()))?;
    let _lock = storage
        .lock_exclusive(LOCK_FILE)
        .with_context(|| format!("{} is in use by another rewind process", data_dir.display()))?;
    let mut config = NodeConfig::default();
    config.volume.retention_interval_nanos = nanos(args.retention_interval, "--retention-interval")?;
    config.volume.archive_interval_nanos = nanos(args.archive_interval, "--archive-interval")?;
    config.volume.lay_out_bookmarks = !args.no_bookmark_layout;
    config.collect_interval_nanos = nanos(args.gc_interval, "--gc-interval")?;
    config.reserve = args.reserve;
    config.volume.burst_quiet_nanos = nanos(args.burst_quiet, "--burst-quiet")?;
    config.volume.burst_reads_nanos = nanos(args.burst_reads, "--burst-reads")?;
    config.volume.journal.direct_io = args.journal_io == JournalIo::Direct;
    config.volume.journal.spare_segments_max = args.journal_spares;
    config.volume.journal.spares_for_adopted = !args.no_journal_spares_ahead;
    config.volume.journal.huge_pages = !args.no_journal_huge_pages;
    config.journal_memory_bytes = args.journal_memory.bytes(
        JOURNAL_MEMORY_SHARE,
        JOURNAL_MEMORY_AUTO_MIN,
        "--journal-memory",
        "journals keep up to",
    );
    config.index_cache_bytes =
        args.index_cache.bytes(INDEX_CACHE_SHARE, INDEX_CACHE_AUTO_MIN, "--index-cache", "index pages cached up to");
    config.volume.vouch_after_nanos =
        u64::try_from(args.journal_vouch_after.as_nanos()).context("--journal-vouch-after is too long")?;
    let tokens = Arc::new(Tokens::open(data_dir)?);
    let made_admin = tokens.ensure_admin()?.is_some();
    let grants = Arc::new(Grants::open(data_dir)?);
    let given = match &args.bucket {
        Some(url) => {
            let record = BucketRecord::new(url, args.endpoint.clone(), args.key_file.as_deref(), args.lock.as_deref())?;
            Some(record.in_pool(args.node_name.clone(), args.pool_grace.clone())?)
        }
        None => None,
    };
    let record = BucketRecord::to_serve(data_dir, given)?;
    let bucket = match &record {
        None => None,
        Some(record) => {
            let mut bucket = record.open(args.cache_max)?;
            if let Some(pool) = &bucket.pool {
                // The others' tables are trusted a quarter of the grace
                // period: several catalogs must fit in it.
                let upload_nanos = nanos(args.upload_interval, "--upload-interval")?;
                if pool.grace_nanos < upload_nanos.saturating_mul(8) {
                    bail!(
                        "--pool-grace must be at least 8 times --upload-interval ({:?}): the nodes read each \
                         other's catalogs at every upload",
                        args.upload_interval
                    );
                }
            }
            bucket.alert_after_nanos = nanos(args.upload_alert_after, "--upload-alert-after")?;
            bucket.tier.batch_below_bytes = args.upload_batch_below;
            Some(bucket)
        }
    };
    let node = Arc::new(Node::open_with_bucket(Arc::new(storage), config, bucket)?);
    node.set_clock(Arc::new(SystemClock));
    if let Some(record) = &record {
        record.write(data_dir)?;
    }

    let policy =
        AccessPolicy::Grants { grants: Arc::clone(&grants), client_certificates_required: args.tls_verify_peer };
    let catalog = EngineCatalog::with_policy(Arc::clone(&node), policy);
    let mut nbd = Server::new(Arc::new(catalog), limits.nbd);
    if let Some(tls) = &tls {
        nbd = nbd.with_tls(NbdTls { mode: args.tls_mode(), config: Arc::clone(&tls.nbd) });
    }
    let nbd_address = nbd.serve_tcp(args.nbd).with_context(|| format!("cannot listen for NBD on {}", args.nbd))?;
    if let Some(path) = &args.nbd_unix {
        nbd.serve_unix(path).with_context(|| format!("cannot listen for NBD on {}", path.display()))?;
    }

    // One `Tree` per tree, shared by NFS and the API.
    let trees = Arc::new(Trees::new(Arc::clone(&node)));
    let proxies = match proxy_to {
        None => Vec::new(),
        Some(ProxyTo { tree, config }) => {
            if node.volume(&tree).is_err() {
                let name = VolumeName::new(&tree).map_err(|error| anyhow!("--tree {tree:?}: {error}"))?;
                node.create_volume(VolumeSpec::tree(name), rewind_serve::now())?;
                tracing::info!(%tree, "made the tree that keeps the upstream's history");
            }
            let open = trees.by_name(&tree, rewind_serve::now())?;
            let upstream = config.upstream.nfs;
            let proxy = Proxy::start(open, config).with_context(|| {
                format!("cannot proxy {upstream} (is it up, and does its export let this machine in as root?)")
            })?;
            vec![proxy]
        }
    };
    let nfs = match args.no_nfs {
        true => None,
        false => {
            let mut config = NfsConfig::default();
            config.allowed.extend(args.nfs_allow.iter().copied());
            config.serve.connections_max = limits.nfs_connections_max;
            config.serve.connections_per_client_max =
                config.serve.connections_per_client_max.min(limits.nfs_connections_max);
            let server = NfsServer::new(Arc::clone(&trees), &proxies, config);
            let address = args.nfs.unwrap_or(NFS_ADDRESS_DEFAULT);
            match server.serve_tcp(address) {
                Ok(address) => Some((server, address)),
                Err(error) if args.nfs.is_none() && error.kind() == std::io::ErrorKind::AddrInUse => {
                    tracing::warn!(
                        %error,
                        "file trees are not served over NFS: {address} is in use (another NFS server?); pass \
                         --nfs ADDRESS to serve them elsewhere, or --no-nfs to say you do not want them served"
                    );
                    None
                }
                Err(error) => {
                    return Err(error).with_context(|| {
                        format!(
                            "cannot listen for NFS on {address} (another NFS server there? --nfs ADDRESS, or --no-nfs)"
                        )
                    })
                }
            }
        }
    };

    let stopping = Arc::new(AtomicBool::new(false));
    let maintenance = spawn_node_loop("maintenance", &node, &stopping, node.work_signal(), Node::maintain)?;
    // The journals reach the disk on a thread of their own, so writers do
    // not wait for a full journal buffer while maintenance is destaging.
    let journal_writer = spawn_node_loop("journal", &node, &stopping, node.journal_signal(), Node::write_out_journals)?;
    // Packs go to the bucket on threads of their own: two uploads at once.
    let uploaders: Vec<_> = (0..if record.is_some() { UPLOADERS } else { 0 })
        .map(|index| {
            let node = Arc::clone(&node);
            let stopping = Arc::clone(&stopping);
            let upload_interval = args.upload_interval;
            thread::Builder::new().name(format!("upload-{index}")).spawn(move || {
                yield_to_serving();
                let mut failing = false;
                // The first uploader publishes the catalog too.
                let publishes = index == 0;
                let mut published_at: Option<Instant> = None;
                let mut alerting = false;
                let publish = |node: &Node| -> Result<(), EngineError> {
                    if let Some(published) = node.publish_catalog(now(), &CATALOGED_NODE_FILES)? {
                        tracing::info!(
                            generation = published.generation,
                            files = published.files,
                            pieces_uploaded = published.pieces_uploaded,
                            bytes_uploaded = published.bytes_uploaded,
                            "published the node's catalog to the bucket"
                        );
                    }
                    Ok(())
                };
                loop {
                    if stopping.load(Ordering::Acquire) {
                        // A last catalog: a clean stop leaves the bucket current.
                        if publishes {
                            if let Err(error) = node.maintain_bucket(now()).and_then(|_| publish(&node)) {
                                tracing::warn!(%error, "the last catalog was not published");
                            }
                        }
                        break;
                    }
                    let due = publishes && published_at.is_none_or(|at| at.elapsed() >= upload_interval);
                    // Whether the bucket answered: something uploaded, or a catalog published.
                    let answered = node.maintain_bucket(now()).and_then(|worked| match due {
                        true => publish(&node).map(|()| {
                            published_at = Some(Instant::now());
                            true
                        }),
                        false => Ok(worked),
                    });
                    match answered {
                        Ok(true) if failing => {
                            tracing::info!("the bucket answers again; uploads go on");
                            failing = false;
                        }
                        Ok(_) => {}
                        Err(error) if !failing => {
                            tracing::warn!(%error, "uploading to the bucket failed; retrying");
                            failing = true;
                        }
                        Err(_) => {}
                    }
                    if publishes {
                        // Said once when it starts and once when it ends.
                        let alert = node.bucket_alert(now());
                        match (&alert, alerting) {
                            (Some(alert), false) => tracing::error!(alert = %alert, "history waits for the bucket"),
                            (None, true) => tracing::info!("every pack waiting for the bucket is uploaded again"),
                            _ => {}
                        }
                        alerting = alert.is_some();
                    }
                    // Woken at once when a pack is sealed (below).
                    thread::park_timeout(UPLOAD_PERIOD);
                }
            })
        })
        .collect::<Result<_, _>>()?;
    let upload_threads: Vec<thread::Thread> = uploaders.iter().map(|uploader| uploader.thread().clone()).collect();
    node.wake_on_sealed(Box::new(move || upload_threads.iter().for_each(thread::Thread::unpark)));
    let (history_stop, history_stopped) = std::sync::mpsc::channel::<()>();
    let history = {
        let (node, trees) = (Arc::clone(&node), Arc::clone(&trees));
        thread::Builder::new().name("history".into()).spawn(move || {
            yield_to_serving();
            loop {
                // Past views of trees nobody reads stop holding history.
                trees.close_idle_views(rewind_tree::VIEW_IDLE_SWEEPS);
                // Failures are logged by the node; a failing volume is poisoned.
                let _ = node.maintain_history(now());
                match history_stopped.recv_timeout(HISTORY_PERIOD) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return,
                }
            }
        })?
    };

    // Blocking work is bounded by kind (rewind_http's `jobs` module); the
    // pool is sized to match, so it never grows a thread per slow client.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(limits.api.blocking_threads_max())
        .enable_all()
        .build()?;
    let served = runtime.block_on(async {
        let shutdown = shutdown_signal()?;
        let listener = tokio::net::TcpListener::bind(args.http)
            .await
            .with_context(|| format!("cannot listen for the API on {}", args.http))?;
        let http_address = listener.local_addr()?;
        println!("rewind {} serving {}", env!("CARGO_PKG_VERSION"), data_dir.display());
        println!("listening nbd {nbd_address}");
        if let Some(path) = &args.nbd_unix {
            println!("listening nbd-unix {}", path.display());
        }
        if let Some((_, address)) = &nfs {
            println!("listening nfs {address}");
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        println!("listening {scheme} {http_address}");
        let admin_token = data_dir.join(ADMIN_TOKEN_FILE);
        if made_admin {
            println!(
                "created the admin API token in {} (the CLI reads it there; elsewhere set REWIND_TOKEN)",
                admin_token.display()
            );
        }
        let volumes: Vec<String> = node.volumes().iter().map(|volume| volume.name().to_string()).collect();
        println!(
            "exports: {} (and NAME@TIME views); stop with Ctrl-C",
            if volumes.is_empty() { "none yet".to_owned() } else { volumes.join(", ") }
        );
        let door = Door {
            tokens: Arc::clone(&tokens),
            allowed_hosts: AllowedHosts::new(args.http.ip(), &args.http_allowed_hosts),
            https: tls.is_some(),
        };
        let state = ApiState {
            node: Arc::clone(&node),
            nbd_address: Some(nbd_address.to_string()),
            data_dir: data_dir.canonicalize().ok().map(|path| path.display().to_string()),
            door,
            grants,
            limits: limits.api,
            trees: Arc::clone(&trees),
        };
        let http_config = HttpConfig {
            // Within the file descriptor budget (`limits`), whatever is asked.
            connections_max: args.http_connections_max.min(limits.http_connections_max).max(1),
            header_timeout: args.http_header_timeout.max(Duration::from_millis(1)),
            body_stall_timeout: args.http_body_timeout.max(Duration::from_millis(1)),
            tls: tls.as_ref().map(|tls| Arc::clone(&tls.http)),
            ..HttpConfig::default()
        };
        rewind_http::serve(listener, state, http_config, shutdown).await.context("API server failed")
    });

    tracing::info!("shutting down");
    nbd.shutdown();
    if let Some((nfs, _)) = &nfs {
        nfs.shutdown();
    }
    for proxy in &proxies {
        proxy.drain();
        let status = proxy.status();
        tracing::info!(upstream = %status.upstream, forwarded = status.forwarded, recorded = status.recorded,
            unrecorded = status.unrecorded, lag = ?status.lag, "proxy stopped");
    }
    // An archive pass over what a burst left would otherwise hold the
    // stop up for minutes.
    node.stop_passes();
    let _ = history_stop.send(());
    history.join().expect("history thread does not panic");
    stopping.store(true, Ordering::Release);
    node.work_signal().notify();
    node.journal_signal().notify();
    maintenance.join().expect("maintenance thread does not panic");
    journal_writer.join().expect("journal thread does not panic");
    for uploader in uploaders {
        uploader.thread().unpark();
        uploader.join().expect("upload thread does not panic");
    }
    node.shut_down(now()).context("final checkpoint failed; the next start replays the journal")?;
    served
}

/// A thread named `name` that runs `work` on the node until `stopping`,
/// again whenever `signal` wakes it and at least every `MAINTENANCE_PERIOD`.
fn spawn_node_loop(
    name: &str,
    node: &Arc<Node>,
    stopping: &Arc<AtomicBool>,
    signal: Arc<rewind_engine::WorkSignal>,
    work: fn(&Node, Timestamp) -> Result<bool, EngineError>,
) -> std::io::Result<thread::JoinHandle<()>> {
    let (node, stopping) = (Arc::clone(node), Arc::clone(stopping));
    thread::Builder::new().name(name.into()).spawn(move || {
        while !stopping.load(Ordering::Acquire) {
            // Failures poison the volume concerned and are logged by the node.
            let _ = work(&node, now());
            signal.wait(MAINTENANCE_PERIOD);
        }
    })
}

/// Ctrl-C or SIGTERM: the handlers are installed when this is called, the
/// returned future waits for either. It is called before the server says
/// it is listening, so a stop from then on is a clean one; an `async fn`
/// installed them only when first polled, and a SIGTERM right after
/// "listening" killed the process instead (seen in CI: a test that started
/// and at once stopped a server got "exited with signal: 15").
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// The nice value of the history thread (archiving, retention, the copy
/// after a revert): where it and a thread serving clients want the same
/// core, Linux gives it about a tenth of the time (weights 110 and 1024),
/// and every idle cycle otherwise — so a burst's deferred work does not take
/// the next job's speed, and still gets done (issue 13, req 4).
const HISTORY_NICE: i32 = 10;

/// Lowers the calling thread's priority to `HISTORY_NICE`.
fn yield_to_serving() {
    let thread = rustix::thread::gettid();
    // On Linux a thread id names one thread: the others keep their priority.
    if let Err(error) = rustix::process::setpriority_process(Some(thread), HISTORY_NICE) {
        tracing::warn!(%error, "cannot lower the history thread's priority; it competes with serving");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_shares_are_a_size_or_auto() {
        assert_eq!(parse_memory_share("auto"), Ok(MemoryShare::Auto));
        assert_eq!(parse_memory_share("AUTO"), Ok(MemoryShare::Auto));
        assert_eq!(parse_memory_share("3GiB"), Ok(MemoryShare::Bytes(3 << 30)));
        assert_eq!(parse_memory_share("0"), Ok(MemoryShare::Bytes(0)));
        let error = parse_memory_share("lots").unwrap_err();
        assert!(error.contains("3GiB") && error.ends_with("or auto"), "{error}");
    }

    #[test]
    fn meminfo_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24578344 kB\nMemFree:        21000000 kB\n";
        assert_eq!(meminfo_total(meminfo), Some(24_578_344 * 1024));
        assert_eq!(meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(meminfo_total("MemTotal: many kB\n"), None);
    }

    #[test]
    fn cgroup_limits_are_the_lowest_on_the_way_up() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::fs::write(root.path().join("memory.max"), "max\n").unwrap();
        std::fs::write(root.path().join("a/memory.max"), "1000\n").unwrap();
        std::fs::write(root.path().join("a/b/memory.max"), "2000\n").unwrap();
        assert_eq!(lowest_limit_up_to(root.path(), "/a/b", "memory.max"), Some(1000));
        // A path the hierarchy does not show (a container's view) is walked up.
        assert_eq!(lowest_limit_up_to(root.path(), "/a/b/not/here", "memory.max"), Some(1000));
        assert_eq!(lowest_limit_up_to(root.path(), "/", "memory.max"), None);
        assert_eq!(cgroup_limit("1:cpu:/\n9:name=systemd:/\n"), None);
    }

    #[test]
    fn auto_is_a_share_of_what_this_process_may_use() {
        let machine = meminfo_total(&std::fs::read_to_string("/proc/meminfo").unwrap()).unwrap();
        for (share, at_least) in
            [(JOURNAL_MEMORY_SHARE, JOURNAL_MEMORY_AUTO_MIN), (INDEX_CACHE_SHARE, INDEX_CACHE_AUTO_MIN)]
        {
            let auto = memory_share_auto(share, at_least);
            assert!(auto <= (machine / share).max(at_least), "{auto} of {machine}");
            assert!(auto >= at_least, "{auto}");
        }
        assert_eq!(MemoryShare::Bytes(5).bytes(JOURNAL_MEMORY_SHARE, JOURNAL_MEMORY_AUTO_MIN, "--flag", "kept"), 5);
    }
}
