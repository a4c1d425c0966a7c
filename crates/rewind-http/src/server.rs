use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use futures_util::StreamExt;
use jiff::tz::TimeZone;
use rewind_tree::Trees;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::sync::mpsc;

use rewind_access::{AccessError, GrantInfo, Grants, Principal, TokenInfo, TokenSpec};
use rewind_engine::{
    BookmarkName, Clones, EngineError, GroupRevertTo, InUse, Node, RepairMode, Role, Timestamp, VolumeName, Writers,
};

use crate::api::{
    time, tree_file_bytes, view_export, AllocationExtent, BookmarkInfo, ChangeGroup, Changes, CreateBookmark,
    CreateClone, CreateGroup, CreateVolume, CreatedToken, DefragEvent, DefragSummary, DefragVolume, DeletedHistory,
    ErrorBody, GcEvent, GroupBookmarkInfo, GroupInfo, GroupRevertSummary, Health, ImportSummary, JobInfo, NodeReport,
    PromoteEvent, PromoteSummary, RepairSummary, RevertSummary, RevertTreePath, RevertVolume, RevokeGrant, Timeline,
    TreeFileQuery, TreeHistory, TreeHistoryQuery, TreeListing, TreeListingQuery, TreeMirror, TreeRevertSummary,
    UpdateVolume, ViewInfo, VolumeDetail, VolumeInfo, VolumeReport, DATA_BYTES_MAX, FIXED_AT_CREATION,
};
use crate::auth::{self, Door};
use crate::edge::HttpConfig;
use crate::jobs::{ApiLimits, Jobs, SlowPermit, IMPORT_CHUNKS_QUEUED};

/// The most bytes of a JSON request body. Every body but an import's is a
/// small object (a volume's name and policy, a bookmark, a token); an
/// import streams.
pub const JSON_BODY_BYTES_MAX: usize = 64 * 1024;

/// What the handlers share.
pub struct ApiState {
    pub node: Arc<Node>,
    /// Where the NBD server listens, reported by `/v1/health` so clients can
    /// print the right URIs.
    pub nbd_address: Option<String>,
    /// The data directory, reported by `/v1/health` so that a restore is
    /// never written into it.
    pub data_dir: Option<String>,
    /// Who may call the API (tokens, allowed host names, our own scheme).
    pub door: Door,
    /// NBD access grants, managed here and read by the NBD catalog.
    pub grants: Arc<Grants>,
    /// How much slow work (imports, gc, stats) runs at once (`crate::jobs`).
    pub limits: ApiLimits,
    /// The file trees, shared with the NFS server (one `Tree` each).
    pub trees: Arc<Trees>,
}

type Shared = Arc<ApiState>;

/// The wall clock, read here at the edge and passed into the engine.
pub(crate) fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

pub enum ApiError {
    Engine(EngineError),
    Access(AccessError),
    Forbidden(String),
    /// Refused before reaching the engine: bad input, or too much work.
    Request {
        status: StatusCode,
        kind: &'static str,
        message: String,
    },
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        ApiError::Engine(error)
    }
}

impl From<AccessError> for ApiError {
    fn from(error: AccessError) -> Self {
        ApiError::Access(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = match self {
            ApiError::Engine(error) => error,
            ApiError::Forbidden(message) => return auth::refusal(StatusCode::FORBIDDEN, "forbidden", message),
            ApiError::Request { status, kind, message } => {
                let mut response = auth::refusal(status, kind, message);
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
                }
                return response;
            }
            ApiError::Access(error) => {
                let (status, kind) = match &error {
                    AccessError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid"),
                    AccessError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
                    _ => (StatusCode::INTERNAL_SERVER_ERROR, "io"),
                };
                if status.is_server_error() {
                    tracing::error!(%error, "API request failed");
                }
                return auth::refusal(status, kind, error.to_string());
            }
        };
        let (status, kind) = match &error {
            EngineError::VolumeNotFound(_) | EngineError::GroupNotFound(_) | EngineError::BookmarkNotFound { .. } => {
                (StatusCode::NOT_FOUND, "not_found")
            }
            EngineError::VolumeExists(_)
            | EngineError::BookmarkExists { .. }
            | EngineError::InUse { .. }
            | EngineError::HasClones { .. }
            | EngineError::WritersConnected { .. }
            | EngineError::CutOff { .. } => (StatusCode::CONFLICT, "conflict"),
            EngineError::Poisoned { .. } | EngineError::Closed(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            EngineError::Damaged { .. } => (StatusCode::SERVICE_UNAVAILABLE, "damaged"),
            EngineError::RecoveryPending { .. } => (StatusCode::SERVICE_UNAVAILABLE, "recovering"),
            EngineError::CollectionWaits { .. } => (StatusCode::CONFLICT, "conflict"),
            error if error.is_no_space() => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
            error if error.is_corruption() => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt"),
            EngineError::Chunks(rewind_engine::ChunkError::Poisoned { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            EngineError::Io { .. } | EngineError::Journal(_) | EngineError::Index(_) | EngineError::Chunks(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "io")
            }
            _ => (StatusCode::BAD_REQUEST, "invalid"),
        };
        // Only failures of Rewind itself: a full disk or a damaged volume is
        // the engine's to report, once, not at every request.
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(%error, "API request failed");
        }
        (status, Json(ErrorBody { error: error.to_string(), kind: kind.to_owned() })).into_response()
    }
}

fn invalid(message: String) -> ApiError {
    ApiError::Engine(EngineError::InvalidArgument(message))
}

/// A JSON body, strictly: unknown fields are refused naming the field (the
/// wire types deny them), and every refusal is an `ErrorBody`, not axum's
/// plain text. At most `JSON_BODY_BYTES_MAX` bytes (the router's limit).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let json =
            request.headers().get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).is_some_and(|value| {
                let essence = value.split(';').next().unwrap_or_default().trim();
                essence.eq_ignore_ascii_case("application/json") || essence.ends_with("+json")
            });
        if !json {
            return Err(ApiError::Request {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                kind: "invalid",
                message: "send the body as JSON, with Content-Type: application/json".into(),
            });
        }
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| ApiError::Request {
            status: rejection.status(),
            kind: "invalid",
            message: if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                format!("the request body is larger than the {JSON_BODY_BYTES_MAX} bytes any JSON request needs")
            } else {
                rejection.body_text()
            },
        })?;
        serde_json::from_slice(&bytes).map(ApiJson).map_err(|error| invalid(format!("request body: {error}")))
    }
}

/// Query parameters, strictly: unknown ones are refused, naming them.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        match Query::<T>::try_from_uri(&parts.uri) {
            Ok(Query(query)) => Ok(ApiQuery(query)),
            // "Failed to deserialize query string: unknown field `x`, expected …"
            Err(rejection) => Err(invalid(rejection.body_text())),
        }
    }
}

/// Runs quick blocking engine work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(ApiError::Engine),
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

/// Slow work on behalf of the request's token: a place in the bounded
/// line for the few threads slow work has (see `crate::jobs`).
struct SlowWork {
    jobs: Arc<Jobs>,
    token: String,
}

impl<S: Send + Sync> FromRequestParts<S> for SlowWork {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let jobs = parts.extensions.get::<Arc<Jobs>>().expect("the router gives every request the jobs");
        let principal = parts.extensions.get::<Principal>().expect("the guard names every request's token");
        Ok(SlowWork { jobs: Arc::clone(jobs), token: principal.id.clone() })
    }
}

impl SlowWork {
    /// Waits (without a thread) for one of the threads, or 503 `busy` when
    /// the line, or this token's share of it, is full.
    async fn permit(&self) -> Result<SlowPermit, ApiError> {
        self.jobs.slow_permit(&self.token).await.map_err(|busy| ApiError::Request {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "busy",
            message: format!(
                "too much slow work: {} requests waiting (at most {}), {} of them or running for this token (at \
                 most {}); try again once some have finished",
                busy.waiting,
                self.jobs.limits().slow_waiting_max,
                busy.held,
                busy.token_max
            ),
        })
    }

    /// Runs slow blocking engine work once a thread for it is free.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let permit = self.permit().await?;
        // Held by the work itself: it runs on even if the client goes away.
        blocking(move || {
            let _permit = permit;
            work()
        })
        .await
    }
}

/// The API: every route behind the guard (`crate::auth`), with the checks
/// that depend on the route in layers of their own.
pub fn router(state: ApiState) -> Router {
    let door = Arc::new(state.door.clone());
    let jobs = Arc::new(Jobs::new(state.limits));
    // A token limited to some volumes sees no other (404, as if absent).
    let volume_routes = Router::new()
        .route("/v1/volumes/{name}", get(volume_detail).patch(update_volume).delete(delete_volume))
        // An import streams its body however large; every other body is small JSON.
        .route("/v1/volumes/{name}/import", post(import_volume).layer(DefaultBodyLimit::disable()))
        .route("/v1/volumes/{name}/timeline", get(timeline))
        .route("/v1/volumes/{name}/writes", get(write_history))
        .route("/v1/volumes/{name}/bookmarks", get(list_bookmarks).post(create_bookmark))
        .route("/v1/volumes/{name}/clones", post(create_clone))
        .route("/v1/volumes/{name}/revert", post(revert_volume))
        .route("/v1/volumes/{name}/promote", post(promote_volume))
        .route("/v1/volumes/{name}/defrag", post(defrag_volume))
        .route("/v1/volumes/{name}/bookmarks/{bookmark}", delete(delete_bookmark))
        .route("/v1/volumes/{name}/view", get(resolve_view))
        .route("/v1/volumes/{name}/changes", get(changes))
        .route("/v1/volumes/{name}/allocation", get(allocation))
        .route("/v1/volumes/{name}/data", get(data))
        .route("/v1/volumes/{name}/history", delete(delete_history))
        .route("/v1/volumes/{name}/stats", get(volume_stats))
        .route("/v1/volumes/{name}/repair", post(repair_volume))
        .route("/v1/trees/{name}/history", get(tree_history))
        .route("/v1/trees/{name}/mirror", get(tree_mirror))
        .route("/v1/trees/{name}/listing", get(tree_listing))
        .route("/v1/trees/{name}/revert", post(revert_tree_path))
        .route("/v1/trees/{name}/files/{ino}", get(tree_file))
        .route_layer(middleware::from_fn(volume_scope));
    let node_routes = Router::new()
        .route("/v1/stats", get(node_stats))
        .route("/v1/gc", post(collect_garbage))
        .route("/v1/jobs", get(list_jobs))
        .route("/v1/jobs/{id}", get(job))
        .route("/metrics", get(crate::metrics::metrics))
        // A group spans volumes: node-wide tokens only.
        .route("/v1/groups", get(list_groups).post(create_group))
        .route("/v1/groups/{name}", get(group_detail).patch(change_group).delete(delete_group))
        .route("/v1/groups/{name}/bookmarks", post(create_group_bookmark))
        .route("/v1/groups/{name}/bookmarks/{bookmark}", delete(delete_group_bookmark))
        .route("/v1/groups/{name}/revert", post(revert_group))
        .route("/v1/groups/{name}/clones", post(clone_group))
        .route_layer(middleware::from_fn(auth::node_wide));
    let admin_routes = Router::new()
        .route("/v1/tokens", get(list_tokens).post(create_token))
        .route("/v1/tokens/{id}", delete(revoke_token))
        .route("/v1/access", get(list_grants).post(create_grant).delete(revoke_grant))
        .route_layer(middleware::from_fn(auth::admin_only));
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/volumes", get(list_volumes).post(create_volume))
        .merge(volume_routes)
        .merge(node_routes)
        .merge(admin_routes)
        .with_state(Arc::new(state))
        .layer(Extension(jobs))
        .layer(DefaultBodyLimit::max(JSON_BODY_BYTES_MAX))
        .layer(middleware::from_fn_with_state(door, auth::guard))
}

/// Serves the API on `listener` until `shutdown` completes, within the
/// limits of `config` (see `crate::edge`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    crate::edge::serve(listener, router(state), config, shutdown).await
}

async fn volume_scope(
    Extension(principal): Extension<Principal>,
    Path(parameters): Path<HashMap<String, String>>,
    request: Request,
    next: Next,
) -> Response {
    match parameters.get("name") {
        Some(name) if !principal.may_see(name) => {
            ApiError::Engine(EngineError::VolumeNotFound(name.clone())).into_response()
        }
        _ => next.run(request).await,
    }
}

async fn health(State(state): State<Shared>, Extension(principal): Extension<Principal>) -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        volumes: state.node.volumes().iter().filter(|volume| principal.may_see(volume.name().as_str())).count(),
        nbd_address: state.nbd_address.clone(),
        // Where the node keeps its files is for tokens of the whole node.
        data_dir: state.data_dir.clone().filter(|_| principal.is_node_wide()),
    })
}

async fn list_volumes(
    State(state): State<Shared>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Vec<VolumeInfo>>, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || Ok(crate::api::volume_list(&node, |name| principal.may_see(name)))).await.map(Json)
}

/// Refuses to create `name` with a token limited to other volumes.
fn may_create(principal: &Principal, name: &str) -> Result<(), ApiError> {
    if principal.may_see(name) {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!("token {} may not create volume {name}: it is limited to others", principal.id)))
}

async fn create_volume(
    State(state): State<Shared>,
    Extension(principal): Extension<Principal>,
    ApiJson(request): ApiJson<CreateVolume>,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    may_create(&principal, &request.name)?;
    let node = Arc::clone(&state.node);
    let spec = request.spec().map_err(invalid)?;
    let volume = blocking(move || node.create_volume(spec, now())).await?;
    Ok((StatusCode::CREATED, Json(VolumeInfo::of(&volume))))
}

async fn volume_detail(State(state): State<Shared>, Path(name): Path<String>) -> Result<Json<VolumeDetail>, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || {
        let volume = node.volume(&name)?;
        Ok(VolumeDetail { info: VolumeInfo::of(&volume), stats: volume.stats()?.into() })
    })
    .await
    .map(Json)
}

/// Changes what history a volume keeps. Every PATCH changes what it names
/// or says why not: a field fixed at creation, an unknown field and an
/// empty body are refused, each with its reason.
async fn update_volume(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> Result<Json<VolumeInfo>, ApiError> {
    let node = Arc::clone(&state.node);
    let example = r#"{"retention": "all:6h, 10m:14d"}"#;
    let Some(fields) = body.as_object() else {
        return Err(invalid(format!("request body: expected a JSON object such as {example}")));
    };
    if let Some(fixed) = FIXED_AT_CREATION.iter().find(|field| fields.contains_key(**field)) {
        return Err(invalid(format!(
            "{fixed} cannot be changed: a volume's name, size, block size, layout and cache are fixed when it is \
             created (import or copy it into a new volume instead); PATCH changes granularity, retention and \
             space_max"
        )));
    }
    let request: UpdateVolume =
        serde_json::from_value(body).map_err(|error| invalid(format!("request body: {error}")))?;
    if request.is_empty() {
        return Err(invalid(format!(
            "nothing to change: name at least one of granularity, retention and space_max, e.g. {example}"
        )));
    }
    let change = request.parse().map_err(invalid)?;
    blocking(move || {
        let volume = node.volume(&name)?;
        volume.set_policy(change)?;
        Ok(VolumeInfo::of(&volume))
    })
    .await
    .map(Json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    /// Delete even with clients connected (they get errors from then on).
    #[serde(default)]
    force: bool,
    /// Delete the volume's clones (and theirs) with it.
    #[serde(default)]
    with_clones: bool,
}

async fn delete_volume(
    State(state): State<Shared>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    let node = Arc::clone(&state.node);
    let in_use = if query.force { InUse::Force } else { InUse::Refuse };
    let clones = if query.with_clones { Clones::Delete } else { Clones::Refuse };
    // A token limited to some volumes deletes, and learns of, only those:
    // clones it may not see are not deleted with their base, nor named.
    if !node.clones_and_theirs(&name).iter().all(|clone| principal.may_see(clone)) {
        return Err(ApiError::Forbidden(format!(
            "{name} has clones this token may not see; a token for all of them (or an admin's) can delete it"
        )));
    }
    blocking(move || node.delete_volume(&name, in_use, clones)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RepairQuery {
    /// Repair (otherwise only say what a repair would do).
    #[serde(default)]
    apply: bool,
    /// Take a volume with clients connected out of service to repair it.
    #[serde(default)]
    force: bool,
}

/// Rebuilding what is derived can read a whole journal: slow work.
async fn repair_volume(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<RepairQuery>,
) -> Result<Json<RepairSummary>, ApiError> {
    let node = Arc::clone(&state.node);
    let mode = if query.apply { RepairMode::Apply } else { RepairMode::Plan };
    let in_use = if query.force { InUse::Force } else { InUse::Refuse };
    let report = slow.run(move || node.repair_volume(&name, mode, in_use, now())).await?;
    Ok(Json(RepairSummary::of(&report, !query.apply)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportQuery {
    block_size: Option<u32>,
    layout: Option<String>,
    cache: Option<String>,
    granularity: Option<String>,
    retention: Option<String>,
    space_max: Option<String>,
}

/// Bridges the async request body to the engine's blocking `Read`.
struct BodyReader {
    chunks: mpsc::Receiver<Result<Bytes, io::Error>>,
    current: Bytes,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let count = buf.len().min(self.current.len());
        buf[..count].copy_from_slice(&self.current.split_to(count));
        Ok(count)
    }
}

/// Creates a volume from the raw image in the body, as a job (see
/// `crate::jobs`): it waits for a running slot, then streams the body into
/// the volume. All or nothing: a failed import leaves no volume. An upload
/// that stalls fails after the edge's body stall timeout.
async fn import_volume(
    State(state): State<Shared>,
    Extension(jobs): Extension<Arc<Jobs>>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<ImportQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<ImportSummary>), ApiError> {
    let node = Arc::clone(&state.node);
    let size_bytes = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .ok_or_else(|| invalid("an import needs a Content-Length: the image's size is the volume's size".into()))?;
    let ImportQuery { block_size, layout, cache, granularity, retention, space_max } = query;
    let request = CreateVolume {
        name: name.clone(),
        size_bytes,
        block_size,
        layout,
        cache,
        granularity,
        retention,
        space_max,
        tree: false,
    };
    let spec = request.spec().map_err(invalid)?;
    // Refused now rather than after waiting in line.
    if node.volume(&name).is_ok() {
        return Err(ApiError::Engine(EngineError::VolumeExists(name)));
    }
    let mut ticket = jobs.submit_import(&name, size_bytes, now()).map_err(|busy| {
        let limits = jobs.limits();
        ApiError::Request {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "busy",
            message: format!(
                "too many imports: {} running and {} waiting (at most {} run and {} wait; rewind serve \
                 --imports-max); try again once one has finished (GET /v1/jobs shows them)",
                busy.running, busy.waiting, limits.imports_max, limits.imports_waiting_max
            ),
        }
    })?;
    ticket.run(&jobs).await;
    // Creating, importing and (on failure) deleting all happen on the
    // blocking thread, so they finish even if the client goes away and this
    // future is dropped: the upload then ends short, the import fails, and
    // no half-imported volume is left behind.
    let (sender, chunks) = mpsc::channel(IMPORT_CHUNKS_QUEUED);
    let import = tokio::task::spawn_blocking(move || {
        let volume = match node.create_volume(spec, now()) {
            Ok(volume) => volume,
            Err(error) => {
                ticket.finish(Err(error.to_string()));
                return Err(error);
            }
        };
        let mut reader = BodyReader { chunks, current: Bytes::new() };
        let job = Arc::clone(&ticket.job);
        // Attached as its writer: a DELETE without `force` meanwhile is
        // refused (in use), as it is for an NBD client's volume.
        let attached = volume.attach(format!("import over HTTP ({name})"), Role::Live);
        let imported = attached.import(now(), &mut reader, &mut |done| job.progress(done));
        drop(attached);
        match imported {
            Ok(report) => {
                ticket.finish(Ok(()));
                Ok((volume, report))
            }
            Err(error) => {
                // An import is all or nothing; the job ends once its volume
                // is gone. Only its own volume: one deleted (with `force`)
                // and made again under the name meanwhile is someone else's.
                let still_its_own = node.volume(&name).is_ok_and(|named| Arc::ptr_eq(&named, &volume));
                if still_its_own {
                    if let Err(delete) = node.delete_volume(&name, InUse::Force, Clones::Refuse) {
                        tracing::error!(volume = %name, error = %delete, "cannot delete a failed import");
                    }
                }
                ticket.finish(Err(error.to_string()));
                Err(error)
            }
        }
    });
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let failed = chunk.is_err();
        if sender.send(chunk.map_err(io::Error::other)).await.is_err() || failed {
            break;
        }
    }
    drop(sender);
    let (volume, report) = match import.await {
        Ok(result) => result?,
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    };
    Ok((
        StatusCode::CREATED,
        Json(ImportSummary {
            volume: VolumeInfo::of(&volume),
            bytes_read: report.bytes_read,
            bytes_written: report.bytes_written,
        }),
    ))
}

async fn list_jobs(Extension(jobs): Extension<Arc<Jobs>>) -> Json<Vec<JobInfo>> {
    Json(jobs.list())
}

async fn job(Extension(jobs): Extension<Arc<Jobs>>, Path(id): Path<u64>) -> Result<Json<JobInfo>, ApiError> {
    jobs.list().into_iter().find(|job| job.id == id).map(Json).ok_or_else(|| ApiError::Request {
        status: StatusCode::NOT_FOUND,
        kind: "not_found",
        message: format!("no job {id}: finished jobs are forgotten after a while (GET /v1/jobs lists those kept)"),
    })
}

async fn volume_stats(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
) -> Result<Json<VolumeReport>, ApiError> {
    let node = Arc::clone(&state.node);
    slow.run(move || {
        let volume = node.volume(&name)?;
        VolumeReport::of(&volume, &volume.measure_space(now())?)
    })
    .await
    .map(Json)
}

async fn node_stats(State(state): State<Shared>, slow: SlowWork) -> Result<Json<NodeReport>, ApiError> {
    let node = Arc::clone(&state.node);
    slow.run(move || NodeReport::measure(&node, now())).await.map(Json)
}

/// Collects garbage now, streaming progress as newline-delimited JSON
/// ([`GcEvent`]): the work can take minutes on a large store.
async fn collect_garbage(State(state): State<Shared>, slow: SlowWork) -> Result<Response, ApiError> {
    let node = Arc::clone(&state.node);
    stream_slow_work(&slow, move |send| {
        let mut progress = |phase, done, total| send(GcEvent::progress(phase, done, total), done == total);
        match node.collect(&mut progress) {
            Ok(report) => GcEvent::Done(report.into()),
            Err(error) => GcEvent::Failed { error: error.to_string() },
        }
    })
    .await
}

/// Promotes a clone: copies what it reads from its base into it, streaming
/// progress as newline-delimited JSON ([`PromoteEvent`]) while the clone
/// keeps serving; afterwards the base may be deleted.
async fn promote_volume(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let node = Arc::clone(&state.node);
    // Refusals (not a clone, promoted already) answer as errors, not streams.
    let volume = node.volume(&name)?;
    volume.check_promotable()?;
    stream_slow_work(&slow, move |send| {
        let mut progress = |done, total| send(PromoteEvent::Progress { done, total }, done == total);
        match node.promote_volume(&name, &mut progress) {
            Ok(report) => PromoteEvent::Done(PromoteSummary::of(&name, &report)),
            Err(error) => PromoteEvent::Failed { error: error.to_string() },
        }
    })
    .await
}

/// Lays out the history a view of the volume reads in block order (see
/// `rewind_engine::View::defrag`), streaming progress as newline-delimited
/// JSON ([`DefragEvent`]) while the volume and its views keep serving.
async fn defrag_volume(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<DefragVolume>,
) -> Result<Response, ApiError> {
    let node = Arc::clone(&state.node);
    // Refusals (no such volume, a time outside its history) answer as
    // errors, not streams.
    let view = blocking(move || {
        let volume = node.volume(&name)?;
        volume.view(volume.parse_time(&request.at, now(), &TimeZone::system())?)
    })
    .await?;
    stream_slow_work(&slow, move |send| {
        let mut progress = |done, total| send(DefragEvent::Progress { done, total }, done == total);
        match view.defrag(&mut progress) {
            Ok(report) => DefragEvent::Done(DefragSummary::of(view.volume().name().as_str(), view.at(), &report)),
            Err(error) => DefragEvent::Failed { error: error.to_string() },
        }
    })
    .await
}

/// Runs `work` on a blocking thread under a slow-work permit and streams
/// what it sends as newline-delimited JSON: its progress events (at most
/// ten a second, and every one marked last of its phase — clients
/// interpolate), then the event it returns.
async fn stream_slow_work<E: serde::Serialize + Send + 'static>(
    slow: &SlowWork,
    work: impl FnOnce(&mut dyn FnMut(E, bool)) -> E + Send + 'static,
) -> Result<Response, ApiError> {
    let (sender, events) = mpsc::channel::<E>(16);
    let permit = slow.permit().await?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut last_sent = std::time::Instant::now();
        let mut send = |event, last_of_phase: bool| {
            if last_of_phase || last_sent.elapsed() >= std::time::Duration::from_millis(100) {
                last_sent = std::time::Instant::now();
                let _ = sender.blocking_send(event);
            }
        };
        let last = work(&mut send);
        let _ = sender.blocking_send(last);
    });
    let lines = tokio_stream_of(events).map(|event| {
        let mut line = serde_json::to_vec(&event).expect("events serialize");
        line.push(b'\n');
        Ok::<_, io::Error>(Bytes::from(line))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response())
}

fn tokio_stream_of<T: Send + 'static>(mut receiver: mpsc::Receiver<T>) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |context| receiver.poll_recv(context))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimelineQuery {
    bucket_seconds: Option<u64>,
}

async fn timeline(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<TimelineQuery>,
) -> Result<Json<Timeline>, ApiError> {
    let node = Arc::clone(&state.node);
    let bucket_seconds = query.bucket_seconds.unwrap_or(60);
    if bucket_seconds < 60 || bucket_seconds % 60 != 0 {
        return Err(invalid(format!("bucket_seconds must be a multiple of 60, not {bucket_seconds}")));
    }
    blocking(move || {
        let volume = node.volume(&name)?;
        Ok(Timeline::of(&name, volume.kind(), &volume.timeline(), bucket_seconds))
    })
    .await
    .map(Json)
}

/// The versions of one file of a tree (see [`TreeHistoryQuery`]).
async fn tree_history(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<TreeHistoryQuery>,
) -> Result<Json<TreeHistory>, ApiError> {
    let trees = Arc::clone(&state.trees);
    slow.run(move || TreeHistory::of(&trees, name, query, now())).await.map(Json)
}

/// How the proxy keeping a tree in step with its upstream is doing.
async fn tree_mirror(State(state): State<Shared>, Path(name): Path<String>) -> Result<Json<TreeMirror>, ApiError> {
    let trees = Arc::clone(&state.trees);
    blocking(move || TreeMirror::of(&trees, name, now())).await.map(Json)
}

/// Everything under a path of a tree at one point (see [`TreeListingQuery`]).
async fn tree_listing(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<TreeListingQuery>,
) -> Result<Json<TreeListing>, ApiError> {
    let trees = Arc::clone(&state.trees);
    slow.run(move || TreeListing::of(&trees, name, query, now())).await.map(Json)
}

/// Puts one path of a tree back as it was (see [`RevertTreePath`]).
async fn revert_tree_path(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<RevertTreePath>,
) -> Result<Json<TreeRevertSummary>, ApiError> {
    let trees = Arc::clone(&state.trees);
    slow.run(move || TreeRevertSummary::of(&trees, name, request, now())).await.map(Json)
}

/// Bytes of one file of a tree at an exact point (see [`TreeFileQuery`]).
async fn tree_file(
    State(state): State<Shared>,
    Path((name, ino)): Path<(String, u64)>,
    ApiQuery(query): ApiQuery<TreeFileQuery>,
) -> Result<Response, ApiError> {
    let trees = Arc::clone(&state.trees);
    let bytes = blocking(move || tree_file_bytes(&trees, &name, ino, &query, now())).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// The writes a volume's history keeps, oldest first, streamed as
/// newline-delimited JSON ([`KeptWrite`](crate::api::KeptWrite) per line):
/// a long history has millions, more than one JSON document should hold.
async fn write_history(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    const WRITES_PER_CHUNK: usize = 8192;
    let node = Arc::clone(&state.node);
    // One of the slow-work permits for the whole stream, not only its
    // start: each open stream holds a sort's memory and scratch files.
    let permit = slow.permit().await?;
    let history = blocking(move || node.volume(&name)?.write_history()).await?;
    let (sender, chunks) = mpsc::channel::<io::Result<Bytes>>(2);
    // Read on a blocking thread (the merge reads the sort's scratch files),
    // as fast as the client takes it; a client that goes away ends it.
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut writes = history.into_iter();
        loop {
            let mut text = Vec::with_capacity(WRITES_PER_CHUNK * 40);
            for write in writes.by_ref().take(WRITES_PER_CHUNK) {
                match write {
                    Ok(write) => {
                        serde_json::to_writer(&mut text, &crate::api::kept_write(&write)).expect("numbers serialize");
                        text.push(b'\n');
                    }
                    // A read of the sort's scratch files that fails ends the
                    // stream early: the client sees a cut-short response,
                    // and the server logs why.
                    Err(error) => {
                        tracing::error!(%error, "the write history could not be read to the end");
                        let _ = sender.blocking_send(Err(io::Error::other(error.to_string())));
                        return;
                    }
                }
            }
            if text.is_empty() || sender.blocking_send(Ok(Bytes::from(text))).is_err() {
                return;
            }
        }
    });
    let stream =
        futures_util::stream::unfold(
            chunks,
            |mut chunks| async move { chunks.recv().await.map(|chunk| (chunk, chunks)) },
        );
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response())
}

async fn list_bookmarks(
    State(state): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Vec<BookmarkInfo>>, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || {
        let volume = node.volume(&name)?;
        Ok(volume.bookmarks().iter().map(|bookmark| BookmarkInfo::of(&name, volume.kind(), bookmark)).collect())
    })
    .await
    .map(Json)
}

async fn create_bookmark(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<CreateBookmark>,
) -> Result<(StatusCode, Json<BookmarkInfo>), ApiError> {
    let node = Arc::clone(&state.node);
    let bookmark_name = BookmarkName::new(&request.name).map_err(|error| invalid(error.to_string()))?;
    let bookmark = blocking(move || {
        let volume = node.volume(&name)?;
        let now = now();
        let at = match &request.at {
            Some(expression) => Some(volume.parse_time(expression, now, &TimeZone::system())?),
            None => None,
        };
        let bookmark = volume.create_bookmark(bookmark_name, at, now)?;
        Ok(BookmarkInfo::of(&name, volume.kind(), &bookmark))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(bookmark)))
}

/// A writable clone of the volume as it was at a point (now if none):
/// immediate, nothing is copied.
async fn create_clone(
    State(state): State<Shared>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<CreateClone>,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    may_create(&principal, &request.name)?;
    let clone_name = VolumeName::new(&request.name).map_err(|error| invalid(error.to_string()))?;
    let node = Arc::clone(&state.node);
    let clone = blocking(move || {
        let source = node.volume(&name)?;
        let now = now();
        let at = match &request.at {
            Some(expression) => Some(source.parse_time(expression, now, &TimeZone::system())?),
            None => None,
        };
        node.clone_volume(&name, at, clone_name, now)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(VolumeInfo::of(&clone))))
}

/// Puts the volume back to a point in time, in place: metadata only.
async fn revert_volume(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<RevertVolume>,
) -> Result<Json<RevertSummary>, ApiError> {
    let writers = if request.disconnect { Writers::Disconnect } else { Writers::Refuse };
    let node = Arc::clone(&state.node);
    blocking(move || {
        let volume = node.volume(&name)?;
        let now = now();
        let report = match (&request.to, request.undo) {
            (None, true) => volume.undo_revert(now, writers)?,
            (Some(to), false) => volume.revert(volume.parse_time(to, now, &TimeZone::system())?, now, writers)?,
            _ => {
                return Err(EngineError::InvalidArgument(
                    "name either the point to revert to (\"to\") or \"undo\": true".to_owned(),
                ))
            }
        };
        Ok(RevertSummary::of(&name, &report))
    })
    .await
    .map(Json)
}

async fn delete_bookmark(
    State(state): State<Shared>,
    Path((name, bookmark)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || node.delete_bookmark(&name, &bookmark)).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn volume_names(names: &[String]) -> Result<Vec<VolumeName>, ApiError> {
    names.iter().map(|name| VolumeName::new(name).map_err(|error| invalid(error.to_string()))).collect()
}

async fn list_groups(State(state): State<Shared>) -> Result<Json<Vec<GroupInfo>>, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || Ok(node.groups()?.iter().map(|group| GroupInfo::of(group, &node)).collect())).await.map(Json)
}

async fn create_group(
    State(state): State<Shared>,
    ApiJson(request): ApiJson<CreateGroup>,
) -> Result<(StatusCode, Json<GroupInfo>), ApiError> {
    let name = VolumeName::new(&request.name).map_err(|error| invalid(error.to_string()))?;
    let members = volume_names(&request.members)?;
    let node = Arc::clone(&state.node);
    let group = blocking(move || Ok(GroupInfo::of(&node.create_group(name, &members)?, &node))).await?;
    Ok((StatusCode::CREATED, Json(group)))
}

async fn group_detail(State(state): State<Shared>, Path(name): Path<String>) -> Result<Json<GroupInfo>, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || Ok(GroupInfo::of(&node.group(&name)?, &node))).await.map(Json)
}

async fn change_group(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<ChangeGroup>,
) -> Result<Json<GroupInfo>, ApiError> {
    if request.add.is_empty() && request.remove.is_empty() {
        return Err(invalid("name volumes to \"add\" to the group or \"remove\" from it".to_owned()));
    }
    let (add, remove) = (volume_names(&request.add)?, volume_names(&request.remove)?);
    let node = Arc::clone(&state.node);
    blocking(move || Ok(GroupInfo::of(&node.change_group(&name, &add, &remove)?, &node))).await.map(Json)
}

async fn delete_group(State(state): State<Shared>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || node.delete_group(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One instant across every member (now: a group bookmark fences writes).
async fn create_group_bookmark(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<CreateBookmark>,
) -> Result<(StatusCode, Json<GroupBookmarkInfo>), ApiError> {
    if request.at.is_some() {
        return Err(invalid(
            "a group bookmark is taken now, with the members' writes fenced together; \"at\" is for one volume's \
             bookmarks"
                .to_owned(),
        ));
    }
    let bookmark = BookmarkName::new(&request.name).map_err(|error| invalid(error.to_string()))?;
    let node = Arc::clone(&state.node);
    let taken =
        blocking(move || Ok(GroupBookmarkInfo::of(&node.bookmark_group(&name, bookmark, now())?, &node))).await?;
    Ok((StatusCode::CREATED, Json(taken)))
}

async fn delete_group_bookmark(
    State(state): State<Shared>,
    Path((name, bookmark)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || node.delete_group_bookmark(&name, &bookmark)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A new group of clones of the members at one of the group's bookmarks.
async fn clone_group(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<CreateClone>,
) -> Result<(StatusCode, Json<GroupInfo>), ApiError> {
    let clone_name = VolumeName::new(&request.name).map_err(|error| invalid(error.to_string()))?;
    let Some(bookmark) = request.at else {
        return Err(invalid(format!(
            "a group is cloned at one of its bookmarks (\"at\"), the one instant its volumes share; \
             `rewind bookmark list {name}` shows them"
        )));
    };
    let node = Arc::clone(&state.node);
    let group =
        blocking(move || Ok(GroupInfo::of(&node.clone_group(&name, &bookmark, clone_name, now())?, &node))).await?;
    Ok((StatusCode::CREATED, Json(group)))
}

/// Every member to a group bookmark (or each one's undo), or none.
async fn revert_group(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<RevertVolume>,
) -> Result<Json<GroupRevertSummary>, ApiError> {
    let writers = if request.disconnect { Writers::Disconnect } else { Writers::Refuse };
    let node = Arc::clone(&state.node);
    blocking(move || {
        let to = match (&request.to, request.undo) {
            (None, true) => GroupRevertTo::Undo,
            (Some(to), false) => GroupRevertTo::Bookmark(to),
            _ => {
                return Err(EngineError::InvalidArgument(
                    "name either the group bookmark to revert to (\"to\") or \"undo\": true".to_owned(),
                ))
            }
        };
        let reports = node.revert_group(&name, to, now(), writers)?;
        let members = reports.iter().map(|(volume, report)| RevertSummary::of(volume.as_str(), report)).collect();
        Ok(GroupRevertSummary { group: name, members })
    })
    .await
    .map(Json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ViewQuery {
    at: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryRange {
    from: String,
    to: String,
}

async fn delete_history(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
    ApiQuery(range): ApiQuery<HistoryRange>,
) -> Result<Json<DeletedHistory>, ApiError> {
    let node = Arc::clone(&state.node);
    slow.run(move || DeletedHistory::delete(&*node.volume(&name)?, &range.from, &range.to, now())).await.map(Json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangesQuery {
    from: String,
    to: Option<String>,
}

async fn changes(
    State(state): State<Shared>,
    slow: SlowWork,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<ChangesQuery>,
) -> Result<Json<Changes>, ApiError> {
    let node = Arc::clone(&state.node);
    slow.run(move || {
        let volume = node.volume(&name)?;
        let view = |input: &str| volume.view(volume.parse_time(input, now(), &TimeZone::system())?);
        let earlier = view(&query.from)?;
        let later = query.to.as_deref().map(view).transpose()?;
        Changes::between(&volume, &earlier, later.as_ref())
    })
    .await
    .map(Json)
}

/// A byte range of a volume at an exact point (nanoseconds since the epoch,
/// as a view resolved it): a restore reads it a piece at a time.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RangeQuery {
    at: u64,
    offset: u64,
    length: u64,
}

async fn allocation(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<RangeQuery>,
) -> Result<Json<Vec<AllocationExtent>>, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || {
        let view = node.volume(&name)?.view_exactly(Timestamp::from_unix_nanos(query.at), now())?;
        let extents = view.block_status(query.offset, query.length)?;
        Ok(extents
            .iter()
            .map(|extent| AllocationExtent { length: extent.length, allocated: extent.allocated })
            .collect())
    })
    .await
    .map(Json)
}

async fn data(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<RangeQuery>,
) -> Result<Response, ApiError> {
    if query.length > DATA_BYTES_MAX {
        return Err(invalid(format!("at most {DATA_BYTES_MAX} bytes at a time, not {}", query.length)));
    }
    let node = Arc::clone(&state.node);
    let bytes = blocking(move || {
        let view = node.volume(&name)?.view_exactly(Timestamp::from_unix_nanos(query.at), now())?;
        let mut buffer = vec![0; query.length as usize];
        view.read(query.offset, &mut buffer)?;
        Ok(buffer)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

async fn resolve_view(
    State(state): State<Shared>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<ViewQuery>,
) -> Result<Json<ViewInfo>, ApiError> {
    let node = Arc::clone(&state.node);
    blocking(move || {
        let volume = node.volume(&name)?;
        let at = volume.parse_time(&query.at, now(), &TimeZone::system())?;
        Ok(ViewInfo {
            volume: name.clone(),
            at: time(at),
            at_unix_nanos: at.unix_nanos(),
            export: view_export(&name, at),
        })
    })
    .await
    .map(Json)
}

/// Token and grant changes write a file and sync it: off the async threads.
async fn access_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AccessError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(ApiError::Access),
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

async fn list_tokens(State(state): State<Shared>) -> Json<Vec<TokenInfo>> {
    Json(state.door.tokens.list())
}

async fn create_token(
    State(state): State<Shared>,
    ApiJson(spec): ApiJson<TokenSpec>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    let tokens = Arc::clone(&state.door.tokens);
    let (info, token) = access_blocking(move || tokens.create(&spec)).await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { info, token })))
}

async fn revoke_token(State(state): State<Shared>, Path(id): Path<String>) -> Result<Json<TokenInfo>, ApiError> {
    let tokens = Arc::clone(&state.door.tokens);
    Ok(Json(access_blocking(move || tokens.revoke(&id)).await?))
}

async fn list_grants(State(state): State<Shared>) -> Json<Vec<GrantInfo>> {
    Json(state.grants.list())
}

async fn create_grant(
    State(state): State<Shared>,
    ApiJson(request): ApiJson<GrantInfo>,
) -> Result<(StatusCode, Json<GrantInfo>), ApiError> {
    let node = Arc::clone(&state.node);
    let volume = request.volume.clone();
    // Only what exists can be granted: a typo should not wait for a volume.
    blocking(move || node.volume(&volume).map(drop)).await?;
    let grants = Arc::clone(&state.grants);
    let granted = access_blocking(move || grants.grant(&request.volume, &request.identity, request.access)).await?;
    Ok((StatusCode::CREATED, Json(granted)))
}

async fn revoke_grant(
    State(state): State<Shared>,
    ApiQuery(request): ApiQuery<RevokeGrant>,
) -> Result<Json<GrantInfo>, ApiError> {
    let grants = Arc::clone(&state.grants);
    Ok(Json(access_blocking(move || grants.revoke(&request.volume, &request.identity)).await?))
}
