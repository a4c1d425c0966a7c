//! The API takes only what it understands: unknown JSON fields and query
//! parameters are refused naming them, every PATCH changes what it names or
//! says why not, and bodies are capped. Each refusal is an `ErrorBody`. A
//! token limited to some volumes deletes only those, and a volume being
//! imported is in use.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use rewind_access::{Grants, TokenSpec, Tokens};
use rewind_engine::{Node, NodeConfig, Timestamp, VolumeName};
use rewind_http::api::{ErrorBody, VolumeInfo};
use rewind_http::{router, AllowedHosts, ApiLimits, ApiState, Door, JSON_BODY_BYTES_MAX};
use rewind_io::OsStorage;
use tower::ServiceExt;

struct Api {
    router: axum::Router,
    node: Arc<Node>,
    tokens: Arc<Tokens>,
    token: String,
    _dir: tempfile::TempDir,
}

impl Api {
    fn new() -> Api {
        let dir = tempfile::tempdir().unwrap();
        let node = Arc::new(Node::open(Arc::new(OsStorage::new(dir.path()).unwrap()), NodeConfig::default()).unwrap());
        let tokens = Arc::new(Tokens::open(dir.path()).unwrap());
        let token = tokens.ensure_admin().unwrap().expect("a new admin token");
        let door = Door {
            tokens: Arc::clone(&tokens),
            allowed_hosts: AllowedHosts::new("127.0.0.1".parse().unwrap(), &[]),
            https: false,
        };
        let grants = Arc::new(Grants::open(dir.path()).unwrap());
        let state = ApiState {
            node: Arc::clone(&node),
            nbd_address: None,
            data_dir: Some("/var/lib/rewind".to_owned()),
            door,
            grants,
            limits: ApiLimits::default(),
            trees: Arc::new(rewind_tree::Trees::new(Arc::clone(&node))),
        };
        Api { router: router(state), node, tokens, token, _dir: dir }
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        content_type: &str,
        body: impl Into<Body>,
    ) -> (StatusCode, Vec<u8>) {
        self.call_as(&self.token, method, uri, content_type, body).await
    }

    async fn call_as(
        &self,
        token: &str,
        method: Method,
        uri: &str,
        content_type: &str,
        body: impl Into<Body>,
    ) -> (StatusCode, Vec<u8>) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", content_type)
            .body(body.into())
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        (status, response.into_body().collect().await.unwrap().to_bytes().to_vec())
    }

    async fn json(&self, method: Method, uri: &str, body: &str) -> (StatusCode, Vec<u8>) {
        self.call(method, uri, "application/json", body.to_owned()).await
    }

    /// Asserts a 400 whose message contains `expected`; returns the message.
    async fn refused(&self, method: Method, uri: &str, body: &str, expected: &str) -> String {
        let (status, bytes) = self.json(method, uri, body).await;
        let error: ErrorBody = serde_json::from_slice(&bytes).expect("an ErrorBody");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error:?}");
        assert_eq!(error.kind, "invalid");
        assert!(error.error.contains(expected), "{:?} does not contain {expected:?}", error.error);
        error.error
    }
}

#[tokio::test]
async fn unknown_fields_are_refused_naming_them_and_create_nothing() {
    let api = Api::new();
    let message = api
        .refused(
            Method::POST,
            "/v1/volumes",
            r#"{"name": "v", "size_bytes": 1048576, "layuot": "cow"}"#,
            "unknown field `layuot`, expected one of `name`, `size_bytes`, `block_size`, `layout`",
        )
        .await;
    assert!(message.contains("`space_max`"), "{message}");
    assert!(api.node.volumes().is_empty(), "nothing was created");

    let (status, bytes) =
        api.json(Method::POST, "/v1/volumes", r#"{"name": "v", "size_bytes": 1048576, "layout": "cow"}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let info: VolumeInfo = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(info.layout, "cow");
    api.refused(Method::POST, "/v1/volumes/v/bookmarks", r#"{"name": "b", "when": "-1m"}"#, "unknown field `when`")
        .await;
}

#[tokio::test]
async fn every_patch_changes_what_it_names_or_says_why_not() {
    let api = Api::new();
    let (status, _) = api.json(Method::POST, "/v1/volumes", r#"{"name": "v", "size_bytes": 1048576}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    api.refused(Method::PATCH, "/v1/volumes/v", r#"{"size_bytes": 1}"#, "size_bytes cannot be changed").await;
    api.refused(Method::PATCH, "/v1/volumes/v", r#"{"layout": "row"}"#, "layout cannot be changed").await;
    api.refused(Method::PATCH, "/v1/volumes/v", "{}", "nothing to change").await;
    api.refused(Method::PATCH, "/v1/volumes/v", r#"{"retention": null}"#, "nothing to change").await;
    api.refused(Method::PATCH, "/v1/volumes/v", "[1]", "expected a JSON object").await;
    api.refused(
        Method::PATCH,
        "/v1/volumes/v",
        r#"{"retention": "all:1h", "colour": "red"}"#,
        "unknown field `colour`, expected one of `granularity`, `retention`, `space_max`",
    )
    .await;
    assert_eq!(api.node.volume("v").unwrap().space_max_bytes(), 0, "a refused PATCH changed nothing");

    let (status, bytes) = api.json(Method::PATCH, "/v1/volumes/v", r#"{"space_max": "1GiB"}"#).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(api.node.volume("v").unwrap().space_max_bytes(), 1 << 30);
}

#[tokio::test]
async fn unknown_query_parameters_are_refused_naming_them() {
    let api = Api::new();
    let (status, _) = api.json(Method::POST, "/v1/volumes", r#"{"name": "v", "size_bytes": 1048576}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    api.refused(Method::GET, "/v1/volumes/v/timeline?bucket=60", "", "unknown field `bucket`").await;
    api.refused(Method::DELETE, "/v1/volumes/v?forse=true", "", "unknown field `forse`").await;
    api.refused(Method::GET, "/v1/volumes/v/view?at=now&zone=UTC", "", "unknown field `zone`").await;
    api.refused(Method::POST, "/v1/volumes/w/import?layuot=cow", "", "unknown field `layuot`").await;
    assert!(api.node.volume("v").is_ok(), "the misspelt delete deleted nothing");
}

#[tokio::test]
async fn json_bodies_are_small_and_json() {
    let api = Api::new();
    let name = "x".repeat(JSON_BODY_BYTES_MAX);
    let body = format!(r#"{{"name": "{name}", "size_bytes": 1048576}}"#);
    let (status, bytes) = api.json(Method::POST, "/v1/volumes", &body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let error: ErrorBody = serde_json::from_slice(&bytes).unwrap();
    assert!(error.error.contains("larger than"), "{}", error.error);

    for content_type in ["text/plain", "application/xml"] {
        let (status, bytes) =
            api.call(Method::POST, "/v1/volumes", content_type, r#"{"name": "v", "size_bytes": 1048576}"#).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{content_type}");
        let error: ErrorBody = serde_json::from_slice(&bytes).unwrap();
        assert!(error.error.contains("application/json"), "{}", error.error);
    }
    assert!(api.node.volumes().is_empty());
}

#[tokio::test]
async fn a_token_limited_to_a_volume_deletes_no_clone_it_may_not_see() {
    let api = Api::new();
    let (status, _) = api.json(Method::POST, "/v1/volumes", r#"{"name": "alpha", "size_bytes": 1048576}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let clone = VolumeName::new("prod-copy").unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    api.node.clone_volume("alpha", None, clone, Timestamp::from_unix_nanos(now)).unwrap();
    let spec = TokenSpec { volumes: vec!["alpha".to_owned()], ..TokenSpec::default() };
    let (_, limited) = api.tokens.create(&spec).unwrap();

    let uri = "/v1/volumes/alpha?with_clones=true&force=true";
    let (status, bytes) = api.call_as(&limited, Method::DELETE, uri, "application/json", "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{}", String::from_utf8_lossy(&bytes));
    assert!(!String::from_utf8_lossy(&bytes).contains("prod-copy"), "the clone's name is not told");
    let (status, _) = api.call_as(&limited, Method::DELETE, "/v1/volumes/alpha", "application/json", "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "nor told by a refusal that names the clones");
    assert!(api.node.volume("prod-copy").is_ok() && api.node.volume("alpha").is_ok());

    // The admin's token sees both: both go.
    let (status, _) = api.call(Method::DELETE, uri, "application/json", "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(api.node.volumes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_being_imported_is_in_use_and_a_failed_import_deletes_only_its_own() {
    let api = Arc::new(Api::new());
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let body = Body::from_stream(futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|piece| (piece, receiver))
    }));
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/volumes/x/import")
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {}", api.token))
        .header("content-type", "application/octet-stream")
        .header("content-length", (1u64 << 20).to_string())
        .body(body)
        .unwrap();
    let import = tokio::spawn({
        let router = api.router.clone();
        async move { router.oneshot(request).await.unwrap().status() }
    });
    sender.send(Ok(vec![7; 64 << 10])).await.unwrap();
    // The import has its volume and writes to it.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !api.node.volume("x").is_ok_and(|volume| !volume.clients().is_empty()) {
        assert!(tokio::time::Instant::now() < deadline, "the import never attached to its volume");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let (status, _) = api.call(Method::DELETE, "/v1/volumes/x", "application/json", "").await;
    assert_eq!(status, StatusCode::CONFLICT, "in use by the import");

    // Deleted by force and made again by someone else: the import, failing
    // later, leaves that volume alone.
    let (status, _) = api.call(Method::DELETE, "/v1/volumes/x?force=true", "application/json", "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = api.json(Method::POST, "/v1/volumes", r#"{"name": "x", "size_bytes": 1048576}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    drop(sender);
    assert_ne!(import.await.unwrap(), StatusCode::CREATED, "the upload ended short");
    let (status, _) = api.call(Method::GET, "/v1/volumes/x", "application/json", "").await;
    assert_eq!(status, StatusCode::OK, "the volume made again is still there");
}

/// Where the node keeps its files is told only to tokens of the whole node.
#[tokio::test]
async fn health_names_the_data_directory_only_to_a_token_of_the_whole_node() {
    let api = Api::new();
    let spec = TokenSpec { volumes: vec!["alpha".to_owned()], ..TokenSpec::default() };
    let (_, limited) = api.tokens.create(&spec).unwrap();
    let health = |bytes: Vec<u8>| serde_json::from_slice::<rewind_http::api::Health>(&bytes).unwrap();
    let (status, bytes) = api.call(Method::GET, "/v1/health", "application/json", "").await;
    assert_eq!((status, health(bytes).data_dir.as_deref()), (StatusCode::OK, Some("/var/lib/rewind")));
    let (status, bytes) = api.call_as(&limited, Method::GET, "/v1/health", "application/json", "").await;
    assert_eq!((status, health(bytes).data_dir), (StatusCode::OK, None));
}
