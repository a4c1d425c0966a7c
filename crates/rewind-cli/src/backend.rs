//! How commands reach the volumes: through a running server's API, or —
//! when none answers — directly on the data directory, with the same results.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use jiff::tz::TimeZone;
use serde::de::DeserializeOwned;
use serde::Serialize;

use rewind_access::{GrantInfo, Grants, TokenInfo, TokenSpec, Tokens, ADMIN_TOKEN_FILE};
use rewind_engine::{
    BookmarkName, Clones, GroupRevertTo, InUse, Node, NodeConfig, RepairMode, Role, Timestamp, VolumeName, Writers,
};
use rewind_http::api::{
    kept_write, time, tree_file_bytes, view_export, AllocationExtent, BookmarkInfo, ChangeGroup, Changes,
    CreateBookmark, CreateClone, CreateGroup, CreateVolume, CreatedToken, DefragSummary, DefragVolume, DeletedHistory,
    ErrorBody, GcEvent, GcReport, GroupBookmarkInfo, GroupInfo, GroupRevertSummary, Health, ImportSummary, JobInfo,
    KeptWrite, NodeReport, PromoteSummary, RepairSummary, RevertSummary, RevertTreePath, RevertVolume, Streamed,
    Timeline, TreeFileQuery, TreeHistory, TreeHistoryQuery, TreeListing, TreeListingQuery, TreeMirror,
    TreeRevertSummary, UpdateVolume, ViewInfo, VolumeDetail, VolumeInfo, VolumeReport,
};
use rewind_io::{DirLock, OsStorage};

use crate::serve::now;

pub trait Backend: Send + Sync {
    /// The NBD address of the server, when known.
    fn nbd_address(&self) -> Option<String>;
    /// The data directory of the node worked on, if known.
    fn data_dir(&self) -> Option<PathBuf>;
    fn list_volumes(&self) -> Result<Vec<VolumeInfo>>;
    fn create_volume(&self, request: &CreateVolume) -> Result<VolumeInfo>;
    /// Creates `request`'s volume with the file's size and imports the file into it.
    fn import_volume(&self, request: &CreateVolume, file: &Path, progress: Progress) -> Result<ImportSummary>;
    fn volume(&self, name: &str) -> Result<VolumeDetail>;
    fn update_volume(&self, name: &str, request: &UpdateVolume) -> Result<VolumeInfo>;
    fn delete_volume(&self, name: &str, in_use: InUse, clones: Clones) -> Result<()>;
    /// Creates the clone `request` names of volume `source`.
    fn clone_volume(&self, source: &str, request: &CreateClone) -> Result<VolumeInfo>;
    fn revert_volume(&self, name: &str, request: &RevertVolume) -> Result<RevertSummary>;
    /// Gives the clone `name` its own copy of what it reads from its base,
    /// reporting progress as (bytes gone through, volume size).
    fn promote_volume(&self, name: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<PromoteSummary>;
    /// Lays out the history the view of volume `name` at `at` reads in
    /// block order, reporting progress as (blocks gone through, of all).
    fn defrag_volume(&self, name: &str, at: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<DefragSummary>;
    /// Repairs volume `name` (`apply`), or says what a repair would do.
    fn repair_volume(&self, name: &str, apply: bool, in_use: InUse) -> Result<RepairSummary>;
    fn timeline(&self, name: &str, bucket_seconds: u64) -> Result<Timeline>;
    /// Hands `each` the writes the volume's history keeps, oldest first.
    fn write_history(&self, name: &str, each: &mut dyn FnMut(KeptWrite) -> Result<()>) -> Result<()>;
    fn bookmarks(&self, name: &str) -> Result<Vec<BookmarkInfo>>;
    fn create_bookmark(&self, name: &str, request: &CreateBookmark) -> Result<BookmarkInfo>;
    fn delete_bookmark(&self, name: &str, bookmark: &str) -> Result<()>;
    fn resolve_view(&self, name: &str, at: &str) -> Result<ViewInfo>;
    /// The versions of one file of a tree.
    fn tree_history(&self, name: &str, query: &TreeHistoryQuery) -> Result<TreeHistory>;
    fn tree_mirror(&self, name: &str) -> Result<TreeMirror>;
    /// Puts one path of a tree back as it was.
    fn revert_tree_path(&self, name: &str, request: &RevertTreePath) -> Result<TreeRevertSummary>;
    /// Everything under a path of a tree at one point.
    fn tree_listing(&self, name: &str, query: &TreeListingQuery) -> Result<TreeListing>;
    /// Bytes of one file of a tree at the exact point of a listing; fewer than
    /// asked at the end of the file.
    fn tree_file(&self, name: &str, ino: u64, query: &TreeFileQuery) -> Result<Vec<u8>>;
    /// What changed in `name` from `from` to `to` (the present if `None`).
    fn changes(&self, name: &str, from: &str, to: Option<&str>) -> Result<Changes>;
    /// Allocation of `name` at exactly `at` (nanoseconds, as a view resolved
    /// it) from `offset`; may cover less than `length`.
    fn allocation(&self, name: &str, at: u64, offset: u64, length: u64) -> Result<Vec<AllocationExtent>>;
    /// Fills `buf` with `name` at exactly `at` from `offset` (at most
    /// `DATA_BYTES_MAX` bytes).
    fn read(&self, name: &str, at: u64, offset: u64, buf: &mut [u8]) -> Result<()>;
    fn delete_history(&self, name: &str, from: &str, to: &str) -> Result<DeletedHistory>;
    fn volume_stats(&self, name: &str) -> Result<VolumeReport>;
    fn node_stats(&self) -> Result<NodeReport>;
    /// Collects garbage, reporting progress as (phase, done, total).
    fn collect_garbage(&self, progress: &mut dyn FnMut(&str, u64, u64)) -> Result<GcReport>;
    fn tokens(&self) -> Result<Vec<TokenInfo>>;
    fn create_token(&self, spec: &TokenSpec) -> Result<CreatedToken>;
    fn revoke_token(&self, id: &str) -> Result<TokenInfo>;
    fn grants(&self) -> Result<Vec<GrantInfo>>;
    fn grant(&self, grant: &GrantInfo) -> Result<GrantInfo>;
    fn revoke_grant(&self, volume: &str, identity: &str) -> Result<GrantInfo>;
    fn groups(&self) -> Result<Vec<GroupInfo>>;
    fn create_group(&self, request: &CreateGroup) -> Result<GroupInfo>;
    fn change_group(&self, name: &str, request: &ChangeGroup) -> Result<GroupInfo>;
    fn delete_group(&self, name: &str) -> Result<()>;
    /// One instant across the group's volumes (see `rewind_engine::group`).
    fn create_group_bookmark(&self, name: &str, request: &CreateBookmark) -> Result<GroupBookmarkInfo>;
    fn delete_group_bookmark(&self, name: &str, bookmark: &str) -> Result<()>;
    /// Every member to a group bookmark, or each one's undo; all or none.
    fn revert_group(&self, name: &str, request: &RevertVolume) -> Result<GroupRevertSummary>;
    /// A new group of clones of the members at a group bookmark (`request.at`).
    fn clone_group(&self, name: &str, request: &CreateClone) -> Result<GroupInfo>;
}

/// The API token to send: `REWIND_TOKEN`, or the admin token the server
/// wrote into the data directory, if this user can read it.
fn find_token(data_dir: &Path) -> Option<String> {
    match std::env::var("REWIND_TOKEN") {
        Ok(token) if !token.trim().is_empty() => Some(token.trim().to_owned()),
        _ => rewind_access::read_admin_token(data_dir),
    }
}

/// Talks to the server at `server`; if none answers and the user did not
/// name one, works on `data_dir` directly.
pub fn connect(
    server: &str,
    server_given: bool,
    server_ca: Option<&Path>,
    data_dir: &Path,
    creates: bool,
) -> Result<Box<dyn Backend>> {
    let http = HttpBackend::new(server, server_ca, find_token(data_dir), data_dir)?;
    let refused = match http.agent.get(&http.url("/v1/health")).header("Authorization", http.authorization()).call() {
        // Something answered: whatever it says, it is the server to talk to.
        Ok(response) => {
            let health: Health = http.decode(response).with_context(|| format!("the Rewind server at {server}"))?;
            let data_dir = health.data_dir.map(PathBuf::from);
            return Ok(Box::new(HttpBackend { nbd: health.nbd_address, data_dir, ..http }));
        }
        Err(error) => anyhow::Error::from(error),
    };
    if server_given {
        return Err(refused.context(format!("cannot reach the Rewind server at {server}")));
    }
    local(data_dir, creates).with_context(|| format!("no Rewind server answers at {server}"))
}

/// Works on `data_dir` directly (creating it only for commands that create).
pub fn local(data_dir: &Path, creates: bool) -> Result<Box<dyn Backend>> {
    if !data_dir.exists() && !creates {
        bail!(
            "there is no data directory {}; start a server with `rewind serve`, or pass --server or --data-dir",
            data_dir.display()
        );
    }
    let local = LocalBackend::open(data_dir)
        .with_context(|| format!("the data directory {} cannot be used directly", data_dir.display()))?;
    Ok(Box::new(local))
}

/// Whether a long command shows a progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Quiet,
    Bar,
}

pub(crate) fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let bar = labelled_bar("{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}", what);
    bar.set_length(total);
    bar
}

/// A progress bar over a count of `units` (blocks, say), not bytes.
pub(crate) fn count_bar(what: &str, units: &str) -> ProgressBar {
    labelled_bar(&format!("{{msg}} {{wide_bar}} {{pos}}/{{len}} {units} ETA {{eta}}"), what)
}

fn labelled_bar(template: &str, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
    bar.set_message(what.to_owned());
    bar
}

struct HttpBackend {
    base: String,
    agent: ureq::Agent,
    nbd: Option<String>,
    data_dir: Option<PathBuf>,
    token: Option<String>,
    /// Where the admin token would be, for the message when none works.
    admin_token_path: PathBuf,
}

type WithoutBody = ureq::RequestBuilder<ureq::typestate::WithoutBody>;
type WithBody = ureq::RequestBuilder<ureq::typestate::WithBody>;

impl HttpBackend {
    fn new(server: &str, server_ca: Option<&Path>, token: Option<String>, data_dir: &Path) -> Result<HttpBackend> {
        let mut config =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_connect(Some(Duration::from_secs(2)));
        if let Some(ca) = server_ca {
            let roots: Vec<ureq::tls::Certificate<'static>> = crate::tls::certificates(ca)?
                .iter()
                .map(|certificate| ureq::tls::Certificate::from_der(certificate.as_ref()).to_owned())
                .collect();
            let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::new_with_certs(&roots)).build();
            config = config.tls_config(tls);
        }
        Ok(HttpBackend {
            base: server.trim_end_matches('/').to_owned(),
            agent: config.build().into(),
            nbd: None,
            data_dir: None,
            token,
            admin_token_path: data_dir.join(ADMIN_TOKEN_FILE),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn authorization(&self) -> String {
        format!("Bearer {}", self.token.as_deref().unwrap_or(""))
    }

    fn get_request(&self, path: &str) -> WithoutBody {
        self.agent.get(&self.url(path)).header("Authorization", self.authorization())
    }

    fn delete_request(&self, path: &str) -> WithoutBody {
        self.agent.delete(&self.url(path)).header("Authorization", self.authorization())
    }

    fn post_request(&self, path: &str) -> WithBody {
        self.agent.post(&self.url(path)).header("Authorization", self.authorization())
    }

    fn patch_request(&self, path: &str) -> WithBody {
        self.agent.patch(&self.url(path)).header("Authorization", self.authorization())
    }

    /// The server's error, with what to do about a missing or refused token.
    fn error(&self, mut response: ureq::http::Response<ureq::Body>) -> anyhow::Error {
        let status = response.status();
        if status == ureq::http::StatusCode::UNAUTHORIZED {
            return match &self.token {
                None => anyhow!(
                    "the server wants an API token: set REWIND_TOKEN (`rewind token create` makes one), or run \
                     as a user who can read {}",
                    self.admin_token_path.display()
                ),
                Some(_) => anyhow!(
                    "the server refused the API token (revoked, or from another node): set REWIND_TOKEN to a \
                     valid one, or unset it to use {}",
                    self.admin_token_path.display()
                ),
            };
        }
        match response.body_mut().read_json::<ErrorBody>() {
            Ok(body) => anyhow!(body.error),
            Err(_) => anyhow!("the server answered {status}"),
        }
    }

    fn decode<T: DeserializeOwned>(&self, mut response: ureq::http::Response<ureq::Body>) -> Result<T> {
        // ureq stops at 10 MB by default; a timeline of months by the minute is more.
        const ANSWER_BYTES_MAX: u64 = 1 << 30;
        if response.status().is_success() {
            let body = response.body_mut().with_config().limit(ANSWER_BYTES_MAX);
            return body.read_json::<T>().context("unexpected answer from the server");
        }
        Err(self.error(response))
    }

    fn decode_empty(&self, response: ureq::http::Response<ureq::Body>) -> Result<()> {
        if response.status().is_success() {
            return Ok(());
        }
        Err(self.error(response))
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.decode(self.get_request(path).call()?)
    }

    fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        self.decode(self.post_request(path).send_json(body)?)
    }

    /// Posts to `path`, which answers with a stream of events (one JSON
    /// object a line), and hands each to `event` until it says how `what`
    /// ended.
    /// Posts `body` to `path` and follows the stream of [`Streamed`] events
    /// it answers with, handing progress to `progress`, to its result.
    fn streamed<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
        what: &str,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<T> {
        self.events(path, body, what, |event| match event {
            Streamed::Progress { done, total } => {
                progress(done, total);
                None
            }
            Streamed::Done(summary) => Some(Ok(summary)),
            Streamed::Failed { error } => Some(Err(anyhow!(error))),
        })
    }

    fn events<E: DeserializeOwned, T>(
        &self,
        path: &str,
        body: &impl Serialize,
        what: &str,
        mut event: impl FnMut(E) -> Option<Result<T>>,
    ) -> Result<T> {
        let mut response = self.post_request(path).send_json(body)?;
        if !response.status().is_success() {
            return Err(self.error(response));
        }
        let lines = std::io::BufReader::new(response.body_mut().as_reader());
        for line in std::io::BufRead::lines(lines) {
            if let Some(end) = event(serde_json::from_str(&line?).context("unexpected answer from the server")?) {
                return end;
            }
        }
        bail!("the server stopped answering before {what} finished")
    }
}

/// How often `volume import --progress` asks the server how its import is doing.
const JOB_POLL_PERIOD: Duration = Duration::from_millis(250);

/// Shows the server's view of the import of `volume` on `bar` (waiting for
/// a slot, or how much is imported) until `stop` says the upload is over.
fn watch_import(jobs: impl Fn() -> WithoutBody, volume: String, bar: ProgressBar, stop: mpsc::Receiver<()>) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(JOB_POLL_PERIOD) {
        let Ok(mut response) = jobs().call() else { continue };
        if !response.status().is_success() {
            continue;
        }
        let Ok(jobs) = response.body_mut().read_json::<Vec<JobInfo>>() else { continue };
        // Newest first: the first unfinished one for this volume is ours.
        let ours = |job: &&JobInfo| job.volume == volume && matches!(job.state.as_str(), "waiting" | "running");
        let Some(job) = jobs.iter().find(ours) else { continue };
        match job.waiting_behind {
            Some(ahead) => bar.set_message(format!("waiting for an import slot ({ahead} ahead)")),
            None => {
                bar.set_message("importing");
                bar.set_position(job.bytes_done);
            }
        }
    }
}

impl Backend for HttpBackend {
    fn nbd_address(&self) -> Option<String> {
        self.nbd.clone()
    }

    fn data_dir(&self) -> Option<PathBuf> {
        self.data_dir.clone()
    }

    fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        self.get("/v1/volumes")
    }

    fn create_volume(&self, request: &CreateVolume) -> Result<VolumeInfo> {
        self.post("/v1/volumes", request)
    }

    fn import_volume(&self, volume: &CreateVolume, file: &Path, progress: Progress) -> Result<ImportSummary> {
        let mut source = File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
        let size_bytes = source.metadata()?.len();
        let watcher = (progress == Progress::Bar).then(|| {
            let bar = progress_bar(size_bytes, "starting");
            let (stop, stopped) = mpsc::channel();
            let (agent, url, authorization) = (self.agent.clone(), self.url("/v1/jobs"), self.authorization());
            let jobs = move || agent.get(&url).header("Authorization", &authorization);
            let name = volume.name.clone();
            let thread = std::thread::spawn({
                let bar = bar.clone();
                move || watch_import(jobs, name, bar, stopped)
            });
            (bar, stop, thread)
        });
        let mut request = self.post_request(&format!("/v1/volumes/{}/import", volume.name));
        let block_size = volume.block_size.map(|bytes| bytes.to_string());
        let fields = [
            ("block_size", &block_size),
            ("layout", &volume.layout),
            ("cache", &volume.cache),
            ("granularity", &volume.granularity),
            ("retention", &volume.retention),
            ("space_max", &volume.space_max),
        ];
        for (key, value) in fields {
            if let Some(value) = value {
                request = request.query(key, value);
            }
        }
        let response = request
            .header("Content-Length", size_bytes.to_string())
            .header("Content-Type", "application/octet-stream")
            .send(ureq::SendBody::from_reader(&mut source));
        if let Some((bar, stop, thread)) = watcher {
            let _ = stop.send(());
            let _ = thread.join();
            bar.finish_and_clear();
        }
        self.decode(response?)
    }

    fn volume(&self, name: &str) -> Result<VolumeDetail> {
        self.get(&format!("/v1/volumes/{name}"))
    }

    fn update_volume(&self, name: &str, request: &UpdateVolume) -> Result<VolumeInfo> {
        self.decode(self.patch_request(&format!("/v1/volumes/{name}")).send_json(request)?)
    }

    fn delete_volume(&self, name: &str, in_use: InUse, clones: Clones) -> Result<()> {
        let force = in_use == InUse::Force;
        let with_clones = clones == Clones::Delete;
        let path = format!("/v1/volumes/{name}?force={force}&with_clones={with_clones}");
        self.decode_empty(self.delete_request(&path).call()?)
    }

    fn clone_volume(&self, source: &str, request: &CreateClone) -> Result<VolumeInfo> {
        self.post(&format!("/v1/volumes/{source}/clones"), request)
    }

    fn revert_volume(&self, name: &str, request: &RevertVolume) -> Result<RevertSummary> {
        self.post(&format!("/v1/volumes/{name}/revert"), request)
    }

    fn promote_volume(&self, name: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<PromoteSummary> {
        self.streamed(&format!("/v1/volumes/{name}/promote"), &serde_json::json!({}), "the promote", progress)
    }

    fn defrag_volume(&self, name: &str, at: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<DefragSummary> {
        let request = DefragVolume { at: at.to_owned() };
        self.streamed(&format!("/v1/volumes/{name}/defrag"), &request, "the defrag", progress)
    }

    fn repair_volume(&self, name: &str, apply: bool, in_use: InUse) -> Result<RepairSummary> {
        let force = in_use == InUse::Force;
        self.post(&format!("/v1/volumes/{name}/repair?apply={apply}&force={force}"), &serde_json::json!({}))
    }

    fn timeline(&self, name: &str, bucket_seconds: u64) -> Result<Timeline> {
        self.get(&format!("/v1/volumes/{name}/timeline?bucket_seconds={bucket_seconds}"))
    }

    fn write_history(&self, name: &str, each: &mut dyn FnMut(KeptWrite) -> Result<()>) -> Result<()> {
        let mut response = self.get_request(&format!("/v1/volumes/{name}/writes")).call()?;
        if !response.status().is_success() {
            return self.decode(response);
        }
        let lines = std::io::BufReader::with_capacity(1 << 20, response.body_mut().as_reader());
        for line in std::io::BufRead::lines(lines) {
            each(serde_json::from_str(&line?).context("unexpected answer from the server")?)?;
        }
        Ok(())
    }

    fn bookmarks(&self, name: &str) -> Result<Vec<BookmarkInfo>> {
        self.get(&format!("/v1/volumes/{name}/bookmarks"))
    }

    fn create_bookmark(&self, name: &str, request: &CreateBookmark) -> Result<BookmarkInfo> {
        self.post(&format!("/v1/volumes/{name}/bookmarks"), request)
    }

    fn delete_bookmark(&self, name: &str, bookmark: &str) -> Result<()> {
        self.decode_empty(self.delete_request(&format!("/v1/volumes/{name}/bookmarks/{bookmark}")).call()?)
    }

    fn resolve_view(&self, name: &str, at: &str) -> Result<ViewInfo> {
        let response = self.get_request(&format!("/v1/volumes/{name}/view")).query("at", at).call()?;
        self.decode(response)
    }

    fn revert_tree_path(&self, name: &str, request: &RevertTreePath) -> Result<TreeRevertSummary> {
        self.post(&format!("/v1/trees/{name}/revert"), request)
    }

    fn tree_listing(&self, name: &str, query: &TreeListingQuery) -> Result<TreeListing> {
        let mut request = self.get_request(&format!("/v1/trees/{name}/listing")).query("path", &query.path);
        if let Some(at) = &query.at {
            request = request.query("at", at);
        }
        self.decode(request.call()?)
    }

    fn tree_file(&self, name: &str, ino: u64, query: &TreeFileQuery) -> Result<Vec<u8>> {
        let request = self.get_request(&format!("/v1/trees/{name}/files/{ino}"));
        let request = request.query("generation", query.generation.to_string()).query("at", query.at.to_string());
        let request = request.query("offset", query.offset.to_string()).query("length", query.length.to_string());
        let mut response = request.call()?;
        if !response.status().is_success() {
            return Err(self.error(response));
        }
        let mut bytes = Vec::new();
        response.body_mut().as_reader().take(query.length + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > query.length {
            bail!("the server answered more bytes than asked");
        }
        Ok(bytes)
    }

    fn tree_mirror(&self, name: &str) -> Result<TreeMirror> {
        self.get(&format!("/v1/trees/{name}/mirror"))
    }

    fn tree_history(&self, name: &str, query: &TreeHistoryQuery) -> Result<TreeHistory> {
        let mut request = self.get_request(&format!("/v1/trees/{name}/history")).query("path", &query.path);
        if let Some(at) = &query.at {
            request = request.query("at", at);
        }
        if let Some(limit) = query.limit {
            request = request.query("limit", limit.to_string());
        }
        self.decode(request.call()?)
    }

    fn changes(&self, name: &str, from: &str, to: Option<&str>) -> Result<Changes> {
        let request = self.get_request(&format!("/v1/volumes/{name}/changes")).query("from", from);
        let request = match to {
            Some(to) => request.query("to", to),
            None => request,
        };
        self.decode(request.call()?)
    }

    fn allocation(&self, name: &str, at: u64, offset: u64, length: u64) -> Result<Vec<AllocationExtent>> {
        let request = self.get_request(&format!("/v1/volumes/{name}/allocation"));
        let request = request.query("at", at.to_string()).query("offset", offset.to_string());
        self.decode(request.query("length", length.to_string()).call()?)
    }

    fn read(&self, name: &str, at: u64, offset: u64, buf: &mut [u8]) -> Result<()> {
        let request = self.get_request(&format!("/v1/volumes/{name}/data"));
        let request = request.query("at", at.to_string()).query("offset", offset.to_string());
        let mut response = request.query("length", buf.len().to_string()).call()?;
        if !response.status().is_success() {
            return Err(self.error(response));
        }
        let mut body = response.body_mut().as_reader();
        body.read_exact(buf).context("the server's answer ended early")?;
        if body.read(&mut [0])? != 0 {
            bail!("the server answered more bytes than asked");
        }
        Ok(())
    }

    fn delete_history(&self, name: &str, from: &str, to: &str) -> Result<DeletedHistory> {
        let request = self.delete_request(&format!("/v1/volumes/{name}/history"));
        self.decode(request.query("from", from).query("to", to).call()?)
    }

    fn volume_stats(&self, name: &str) -> Result<VolumeReport> {
        self.get(&format!("/v1/volumes/{name}/stats"))
    }

    fn node_stats(&self) -> Result<NodeReport> {
        self.get("/v1/stats")
    }

    fn collect_garbage(&self, progress: &mut dyn FnMut(&str, u64, u64)) -> Result<GcReport> {
        self.events("/v1/gc", &serde_json::json!({}), "garbage collection", |event| match event {
            GcEvent::Progress { phase, done, total } => {
                progress(&phase, done, total);
                None
            }
            GcEvent::Done(report) => Some(Ok(report)),
            GcEvent::Failed { error } => Some(Err(anyhow!(error))),
        })
    }

    fn tokens(&self) -> Result<Vec<TokenInfo>> {
        self.get("/v1/tokens")
    }

    fn create_token(&self, spec: &TokenSpec) -> Result<CreatedToken> {
        self.post("/v1/tokens", spec)
    }

    fn revoke_token(&self, id: &str) -> Result<TokenInfo> {
        self.decode(self.delete_request(&format!("/v1/tokens/{id}")).call()?)
    }

    fn grants(&self) -> Result<Vec<GrantInfo>> {
        self.get("/v1/access")
    }

    fn grant(&self, grant: &GrantInfo) -> Result<GrantInfo> {
        self.post("/v1/access", grant)
    }

    fn revoke_grant(&self, volume: &str, identity: &str) -> Result<GrantInfo> {
        let request = self.delete_request("/v1/access").query("volume", volume).query("identity", identity);
        self.decode(request.call()?)
    }

    fn groups(&self) -> Result<Vec<GroupInfo>> {
        self.get("/v1/groups")
    }

    fn create_group(&self, request: &CreateGroup) -> Result<GroupInfo> {
        self.post("/v1/groups", request)
    }

    fn change_group(&self, name: &str, request: &ChangeGroup) -> Result<GroupInfo> {
        self.decode(self.patch_request(&format!("/v1/groups/{name}")).send_json(request)?)
    }

    fn delete_group(&self, name: &str) -> Result<()> {
        self.decode_empty(self.delete_request(&format!("/v1/groups/{name}")).call()?)
    }

    fn create_group_bookmark(&self, name: &str, request: &CreateBookmark) -> Result<GroupBookmarkInfo> {
        self.post(&format!("/v1/groups/{name}/bookmarks"), request)
    }

    fn delete_group_bookmark(&self, name: &str, bookmark: &str) -> Result<()> {
        self.decode_empty(self.delete_request(&format!("/v1/groups/{name}/bookmarks/{bookmark}")).call()?)
    }

    fn revert_group(&self, name: &str, request: &RevertVolume) -> Result<GroupRevertSummary> {
        self.post(&format!("/v1/groups/{name}/revert"), request)
    }

    fn clone_group(&self, name: &str, request: &CreateClone) -> Result<GroupInfo> {
        self.post(&format!("/v1/groups/{name}/clones"), request)
    }
}

/// Works on the data directory itself, holding its lock.
struct LocalBackend {
    node: Arc<Node>,
    /// The file trees, each opened once.
    trees: rewind_tree::Trees,
    data_dir: PathBuf,
    _lock: DirLock,
}

impl LocalBackend {
    fn open(data_dir: &Path) -> Result<LocalBackend> {
        let storage = OsStorage::new(data_dir)?;
        let lock = storage
            .lock_exclusive(crate::serve::LOCK_FILE)
            .context("it is in use by another rewind process (a server whose API is elsewhere? pass --server)")?;
        // A node whose history went to a bucket opens with it.
        let bucket = crate::serve::BucketRecord::read(data_dir)?.map(|record| record.open(None)).transpose()?;
        let node = Node::open_with_bucket(Arc::new(storage), NodeConfig::default(), bucket)?;
        let node = Arc::new(node);
        let trees = rewind_tree::Trees::new(Arc::clone(&node));
        Ok(LocalBackend { node, trees, data_dir: data_dir.to_owned(), _lock: lock })
    }
}

impl Drop for LocalBackend {
    fn drop(&mut self) {
        if let Err(error) = self.node.shut_down(now()) {
            eprintln!("warning: checkpoint on exit failed ({error}); the next start replays the journal");
        }
    }
}

impl Backend for LocalBackend {
    fn nbd_address(&self) -> Option<String> {
        None
    }

    fn data_dir(&self) -> Option<PathBuf> {
        Some(self.data_dir.clone())
    }

    fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        Ok(rewind_http::api::volume_list(&self.node, |_| true))
    }

    fn create_volume(&self, request: &CreateVolume) -> Result<VolumeInfo> {
        let volume = self.node.create_volume(request.spec().map_err(|error| anyhow!(error))?, now())?;
        Ok(VolumeInfo::of(&volume))
    }

    fn import_volume(&self, request: &CreateVolume, file: &Path, progress: Progress) -> Result<ImportSummary> {
        let mut source = File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
        let size_bytes = source.metadata()?.len();
        let request = CreateVolume { size_bytes, ..request.clone() };
        let volume = self.node.create_volume(request.spec().map_err(|error| anyhow!(error))?, now())?;
        let bar = (progress == Progress::Bar).then(|| progress_bar(size_bytes, "importing"));
        // Attached as its writer, as an NBD client would be.
        let attached = volume.attach(format!("import of {}", file.display()), Role::Live);
        let result = attached.import(now(), &mut source, &mut |done| {
            if let Some(bar) = &bar {
                bar.set_position(done);
            }
        });
        drop(attached);
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        match result {
            Ok(report) => Ok(ImportSummary {
                volume: VolumeInfo::of(&volume),
                bytes_read: report.bytes_read,
                bytes_written: report.bytes_written,
            }),
            Err(error) => {
                self.node.delete_volume(&request.name, InUse::Force, Clones::Refuse)?;
                Err(error.into())
            }
        }
    }

    fn volume(&self, name: &str) -> Result<VolumeDetail> {
        let volume = self.node.volume(name)?;
        Ok(VolumeDetail { info: VolumeInfo::of(&volume), stats: volume.stats()?.into() })
    }

    fn update_volume(&self, name: &str, request: &UpdateVolume) -> Result<VolumeInfo> {
        let volume = self.node.volume(name)?;
        volume.set_policy(request.parse().map_err(|error| anyhow!(error))?)?;
        Ok(VolumeInfo::of(&volume))
    }

    fn delete_volume(&self, name: &str, in_use: InUse, clones: Clones) -> Result<()> {
        Ok(self.node.delete_volume(name, in_use, clones)?)
    }

    fn clone_volume(&self, source: &str, request: &CreateClone) -> Result<VolumeInfo> {
        let volume = self.node.volume(source)?;
        let name = VolumeName::new(&request.name).map_err(|error| anyhow!(error))?;
        let now = now();
        let at = request.at.as_deref().map(|at| volume.parse_time(at, now, &TimeZone::system())).transpose()?;
        Ok(VolumeInfo::of(&*self.node.clone_volume(source, at, name, now)?))
    }

    fn revert_volume(&self, name: &str, request: &RevertVolume) -> Result<RevertSummary> {
        let volume = self.node.volume(name)?;
        let now = now();
        // Offline nobody is connected.
        let report = match &request.to {
            Some(to) => volume.revert(volume.parse_time(to, now, &TimeZone::system())?, now, Writers::Refuse)?,
            None => volume.undo_revert(now, Writers::Refuse)?,
        };
        Ok(RevertSummary::of(name, &report))
    }

    fn promote_volume(&self, name: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<PromoteSummary> {
        Ok(PromoteSummary::of(name, &self.node.promote_volume(name, progress)?))
    }

    fn defrag_volume(&self, name: &str, at: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<DefragSummary> {
        let volume = self.node.volume(name)?;
        let view = volume.view(volume.parse_time(at, now(), &TimeZone::system())?)?;
        Ok(DefragSummary::of(name, view.at(), &view.defrag(progress)?))
    }

    fn repair_volume(&self, name: &str, apply: bool, in_use: InUse) -> Result<RepairSummary> {
        let mode = if apply { RepairMode::Apply } else { RepairMode::Plan };
        Ok(RepairSummary::of(&self.node.repair_volume(name, mode, in_use, now())?, !apply))
    }

    fn timeline(&self, name: &str, bucket_seconds: u64) -> Result<Timeline> {
        let volume = self.node.volume(name)?;
        Ok(Timeline::of(name, volume.kind(), &volume.timeline(), bucket_seconds))
    }

    fn tree_history(&self, name: &str, query: &TreeHistoryQuery) -> Result<TreeHistory> {
        Ok(TreeHistory::of(&self.trees, name.to_owned(), query.clone(), now())?)
    }

    fn tree_mirror(&self, name: &str) -> Result<TreeMirror> {
        Ok(TreeMirror::of(&self.trees, name.to_owned(), now())?)
    }

    fn revert_tree_path(&self, name: &str, request: &RevertTreePath) -> Result<TreeRevertSummary> {
        Ok(TreeRevertSummary::of(&self.trees, name.to_owned(), request.clone(), now())?)
    }

    fn tree_listing(&self, name: &str, query: &TreeListingQuery) -> Result<TreeListing> {
        Ok(TreeListing::of(&self.trees, name.to_owned(), query.clone(), now())?)
    }

    fn tree_file(&self, name: &str, ino: u64, query: &TreeFileQuery) -> Result<Vec<u8>> {
        Ok(tree_file_bytes(&self.trees, name, ino, query, now())?)
    }

    fn write_history(&self, name: &str, each: &mut dyn FnMut(KeptWrite) -> Result<()>) -> Result<()> {
        self.node.volume(name)?.write_history()?.into_iter().try_for_each(|write| each(kept_write(&write?)))
    }

    fn bookmarks(&self, name: &str) -> Result<Vec<BookmarkInfo>> {
        let volume = self.node.volume(name)?;
        Ok(volume.bookmarks().iter().map(|bookmark| BookmarkInfo::of(name, volume.kind(), bookmark)).collect())
    }

    fn create_bookmark(&self, name: &str, request: &CreateBookmark) -> Result<BookmarkInfo> {
        let volume = self.node.volume(name)?;
        let now = now();
        let at = request.at.as_deref().map(|at| volume.parse_time(at, now, &TimeZone::system())).transpose()?;
        let bookmark = volume.create_bookmark(BookmarkName::new(&request.name)?, at, now)?;
        Ok(BookmarkInfo::of(name, volume.kind(), &bookmark))
    }

    fn delete_bookmark(&self, name: &str, bookmark: &str) -> Result<()> {
        self.node.delete_bookmark(name, bookmark)?;
        Ok(())
    }

    fn resolve_view(&self, name: &str, at: &str) -> Result<ViewInfo> {
        let volume = self.node.volume(name)?;
        let at = volume.parse_time(at, now(), &TimeZone::system())?;
        Ok(ViewInfo {
            volume: name.to_owned(),
            at: time(at),
            at_unix_nanos: at.unix_nanos(),
            export: view_export(name, at),
        })
    }

    fn allocation(&self, name: &str, at: u64, offset: u64, length: u64) -> Result<Vec<AllocationExtent>> {
        let view = self.node.volume(name)?.view_exactly(Timestamp::from_unix_nanos(at), now())?;
        let extents = view.block_status(offset, length)?;
        Ok(extents
            .iter()
            .map(|extent| AllocationExtent { length: extent.length, allocated: extent.allocated })
            .collect())
    }

    fn read(&self, name: &str, at: u64, offset: u64, buf: &mut [u8]) -> Result<()> {
        let view = self.node.volume(name)?.view_exactly(Timestamp::from_unix_nanos(at), now())?;
        Ok(view.read(offset, buf)?)
    }

    fn changes(&self, name: &str, from: &str, to: Option<&str>) -> Result<Changes> {
        let volume = self.node.volume(name)?;
        let view = |input: &str| volume.view(volume.parse_time(input, now(), &TimeZone::system())?);
        let earlier = view(from)?;
        let later = to.map(view).transpose()?;
        Ok(Changes::between(&volume, &earlier, later.as_ref())?)
    }

    fn delete_history(&self, name: &str, from: &str, to: &str) -> Result<DeletedHistory> {
        Ok(DeletedHistory::delete(&*self.node.volume(name)?, from, to, now())?)
    }

    fn volume_stats(&self, name: &str) -> Result<VolumeReport> {
        let volume = self.node.volume(name)?;
        Ok(VolumeReport::of(&volume, &volume.measure_space(now())?)?)
    }

    fn node_stats(&self) -> Result<NodeReport> {
        Ok(NodeReport::measure(&self.node, now())?)
    }

    fn collect_garbage(&self, progress: &mut dyn FnMut(&str, u64, u64)) -> Result<GcReport> {
        let report = self.node.collect(&mut |phase, done, total| {
            if let GcEvent::Progress { phase, done, total } = GcEvent::progress(phase, done, total) {
                progress(&phase, done, total);
            }
        })?;
        Ok(report.into())
    }

    fn tokens(&self) -> Result<Vec<TokenInfo>> {
        Ok(Tokens::open(&self.data_dir)?.list())
    }

    fn create_token(&self, spec: &TokenSpec) -> Result<CreatedToken> {
        let (info, token) = Tokens::open(&self.data_dir)?.create(spec)?;
        Ok(CreatedToken { info, token })
    }

    fn revoke_token(&self, id: &str) -> Result<TokenInfo> {
        Ok(Tokens::open(&self.data_dir)?.revoke(id)?)
    }

    fn grants(&self) -> Result<Vec<GrantInfo>> {
        Ok(Grants::open(&self.data_dir)?.list())
    }

    fn grant(&self, grant: &GrantInfo) -> Result<GrantInfo> {
        self.node.volume(&grant.volume)?;
        Ok(Grants::open(&self.data_dir)?.grant(&grant.volume, &grant.identity, grant.access)?)
    }

    fn revoke_grant(&self, volume: &str, identity: &str) -> Result<GrantInfo> {
        Ok(Grants::open(&self.data_dir)?.revoke(volume, identity)?)
    }

    fn groups(&self) -> Result<Vec<GroupInfo>> {
        Ok(self.node.groups()?.iter().map(|group| GroupInfo::of(group, &self.node)).collect())
    }

    fn create_group(&self, request: &CreateGroup) -> Result<GroupInfo> {
        let members = request.members.iter().map(|name| VolumeName::new(name)).collect::<Result<Vec<_>, _>>()?;
        Ok(GroupInfo::of(&self.node.create_group(VolumeName::new(&request.name)?, &members)?, &self.node))
    }

    fn change_group(&self, name: &str, request: &ChangeGroup) -> Result<GroupInfo> {
        let names = |names: &[String]| names.iter().map(|name| VolumeName::new(name)).collect::<Result<Vec<_>, _>>();
        let (add, remove) = (names(&request.add)?, names(&request.remove)?);
        Ok(GroupInfo::of(&self.node.change_group(name, &add, &remove)?, &self.node))
    }

    fn delete_group(&self, name: &str) -> Result<()> {
        self.node.delete_group(name)?;
        Ok(())
    }

    fn create_group_bookmark(&self, name: &str, request: &CreateBookmark) -> Result<GroupBookmarkInfo> {
        if request.at.is_some() {
            bail!("a group bookmark is taken now, with the members' writes fenced together; --at is for one volume");
        }
        let taken = self.node.bookmark_group(name, BookmarkName::new(&request.name)?, now())?;
        Ok(GroupBookmarkInfo::of(&taken, &self.node))
    }

    fn delete_group_bookmark(&self, name: &str, bookmark: &str) -> Result<()> {
        self.node.delete_group_bookmark(name, bookmark)?;
        Ok(())
    }

    fn revert_group(&self, name: &str, request: &RevertVolume) -> Result<GroupRevertSummary> {
        let to = match &request.to {
            Some(to) => GroupRevertTo::Bookmark(to),
            None => GroupRevertTo::Undo,
        };
        // Offline nobody is connected.
        let reports = self.node.revert_group(name, to, now(), Writers::Refuse)?;
        let members = reports.iter().map(|(volume, report)| RevertSummary::of(volume.as_str(), report)).collect();
        Ok(GroupRevertSummary { group: name.to_owned(), members })
    }

    fn clone_group(&self, name: &str, request: &CreateClone) -> Result<GroupInfo> {
        let Some(bookmark) = &request.at else {
            bail!("a group is cloned at one of its bookmarks: rewind volume clone {name}@BOOKMARK NEW");
        };
        Ok(GroupInfo::of(&self.node.clone_group(name, bookmark, VolumeName::new(&request.name)?, now())?, &self.node))
    }
}
