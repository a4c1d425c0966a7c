//! Who may call the API, checked before any handler runs.
//!
//! In order, for every request:
//! 1. **Host allow-list** (DNS rebinding): a page on `evil.example` whose name
//!    is made to resolve to 127.0.0.1 sends `Host: evil.example`; only the
//!    loopback names, the address the API is bound to and names added with
//!    `--http-allowed-host` are served (`403` otherwise).
//! 2. **No state change a browser can send cross-origin without a
//!    preflight** (CSRF): a request that is not GET/HEAD/OPTIONS is refused
//!    when its `Content-Type` is one a form can send (`text/plain`,
//!    `application/x-www-form-urlencoded`, `multipart/form-data`: `415`), or
//!    when it names an `Origin` (or `Sec-Fetch-Site`) other than this
//!    server's own (`403`). A browser cannot attach the bearer token to such
//!    a request anyway (that needs a preflight, which gets no CORS answer);
//!    these checks hold even if a token leaked into a page.
//! 3. **Bearer token**: `Authorization: Bearer TOKEN`, on every route,
//!    `/v1/health` and `/metrics` included. No token or a wrong one is `401`
//!    with the same body whatever was wrong.
//! 4. **Role**: read-only tokens may only GET (`403`).
//!
//! The route-level checks (admin-only routes, node-wide routes, a token's
//! volumes) are layers in `server.rs`. A token limited to some volumes gets
//! `404` for any other volume — the same answer as for a volume that does
//! not exist, so it cannot learn which names exist — and `403` for
//! node-wide routes.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use rewind_access::{Principal, Role, Tokens};

use crate::api::ErrorBody;

/// The `Host` names the API answers to.
#[derive(Clone, Debug)]
pub struct AllowedHosts {
    names: Vec<String>,
}

impl AllowedHosts {
    /// The loopback names, `bound` (unless it is the unspecified address,
    /// which no client names) and `extra`.
    pub fn new(bound: IpAddr, extra: &[String]) -> AllowedHosts {
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"].iter().map(|name| name.to_string()).collect();
        if !bound.is_unspecified() {
            names.push(bound.to_string());
        }
        names.extend(extra.iter().map(|name| normalize(name)));
        names.sort();
        names.dedup();
        AllowedHosts { names }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    fn allows(&self, host: &str) -> bool {
        let name = normalize(strip_port(host));
        self.names.contains(&name)
    }
}

/// `[::1]:8080` → `[::1]`, `example:8080` → `example`.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        // One colon followed by digits is a port; more colons is a bare IPv6 address.
        Some((name, port)) if !name.contains(':') && port.bytes().all(|byte| byte.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Lowercase, no brackets around IPv6, no trailing root dot.
fn normalize(name: &str) -> String {
    let name = name.trim().trim_start_matches('[').trim_end_matches(']').trim_end_matches('.');
    name.to_ascii_lowercase()
}

/// What the guard needs.
#[derive(Clone)]
pub struct Door {
    pub tokens: Arc<Tokens>,
    pub allowed_hosts: AllowedHosts,
    /// The API is served over HTTPS: what our own origin's scheme is.
    pub https: bool,
}

pub(crate) fn refusal(status: StatusCode, kind: &str, error: String) -> Response {
    (status, Json(ErrorBody { error, kind: kind.to_owned() })).into_response()
}

fn unauthorized() -> Response {
    let mut response = refusal(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "this API needs a valid token: send Authorization: Bearer TOKEN".to_owned(),
    );
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The media types a cross-origin `<form>` or `fetch` may send without a
/// preflight (the Fetch standard's CORS-safelisted `Content-Type`s).
fn is_form_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else { return false };
    let Ok(value) = value.to_str() else { return true };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    matches!(essence.as_str(), "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data")
}

/// Whether the request says it comes from a page of another origin.
fn is_cross_origin(headers: &HeaderMap, host: &str, https: bool) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return true;
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else { return false };
    let scheme = if https { "https" } else { "http" };
    let ours = format!("{scheme}://{host}");
    !origin.as_bytes().eq_ignore_ascii_case(ours.as_bytes())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The guard every request passes (see the module's doc); on success the
/// request carries its [`Principal`].
pub(crate) async fn guard(State(door): State<Arc<Door>>, mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|value| value.to_str().ok()).unwrap_or("");
    if !door.allowed_hosts.allows(host) {
        return refusal(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this server does not answer to the host name {host:?}; if that is its name, \
                 start it with --http-allowed-host {}",
                normalize(strip_port(host))
            ),
        );
    }
    if changes_state(request.method()) {
        if is_form_type(headers) {
            return refusal(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "requests that change something may not be sent as text/plain or a form (a web page could \
                 send those); send JSON as application/json, or an image as application/octet-stream"
                    .to_owned(),
            );
        }
        if is_cross_origin(headers, host, door.https) {
            return refusal(
                StatusCode::FORBIDDEN,
                "forbidden",
                "requests from another web origin may not change anything here".to_owned(),
            );
        }
    }
    let Some(principal) = bearer(headers).and_then(|token| door.tokens.authenticate(token)) else {
        return unauthorized();
    };
    if principal.role == Role::ReadOnly && changes_state(request.method()) {
        return refusal(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("token {} is read-only: it may only GET", principal.id),
        );
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// Admin-only routes: tokens and NBD access grants.
pub(crate) async fn admin_only(request: Request, next: Next) -> Response {
    match request.extensions().get::<Principal>() {
        Some(principal) if principal.role == Role::Admin => next.run(request).await,
        Some(principal) => refusal(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("only the admin token manages tokens and access grants, not token {}", principal.id),
        ),
        None => unauthorized(),
    }
}

/// Node-wide routes: every volume's numbers, garbage collection, metrics.
pub(crate) async fn node_wide(request: Request, next: Next) -> Response {
    match request.extensions().get::<Principal>() {
        Some(principal) if principal.is_node_wide() => next.run(request).await,
        Some(principal) => refusal(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("token {} is limited to some volumes; this is about the whole node", principal.id),
        ),
        None => unauthorized(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_compared_without_port_case_or_brackets() {
        let hosts = AllowedHosts::new("0.0.0.0".parse().unwrap(), &["Backup.Example.".to_owned()]);
        for host in ["localhost", "LOCALHOST:8080", "127.0.0.1:9", "[::1]:8080", "[::1]", "backup.example:443"] {
            assert!(hosts.allows(host), "{host}");
        }
        for host in ["", "evil.example", "evil.example:8080", "0.0.0.0:8080", "localhost.evil.example", "[::2]:1"] {
            assert!(!hosts.allows(host), "{host}");
        }
        let bound = AllowedHosts::new("10.1.2.3".parse().unwrap(), &[]);
        assert!(bound.allows("10.1.2.3:8080"));
    }

    #[test]
    fn form_types_are_the_cors_safelisted_ones() {
        let mut headers = HeaderMap::new();
        assert!(!is_form_type(&headers), "no body type: not a form");
        for (value, form) in [
            ("text/plain;charset=UTF-8", true),
            ("Application/X-WWW-Form-Urlencoded", true),
            ("multipart/form-data; boundary=x", true),
            ("application/json", false),
            ("application/octet-stream", false),
        ] {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_form_type(&headers), form, "{value}");
        }
    }
}
