//! S3 calls `object_store` has no method for (object lock's, a multipart
//! upload completed only if its object is new, listing unfinished uploads):
//! requests signed with SigV4 by `object_store`'s own signer, with the
//! credentials its client found, and sent with `reqwest`.

use std::io;
use std::time::Duration;

use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::HttpRequestBody;
use reqwest::{Method, StatusCode};

use crate::{to_io, S3Config};

/// How often a request that failed in transit or with a 5xx is sent again.
const RETRIES_MAX: u32 = 3;

pub(crate) struct Signed {
    /// For its credentials (the AWS chain), and the calls it has.
    pub(crate) store: AmazonS3,
    http: reqwest::Client,
    /// `ENDPOINT/BUCKET`: requests are path-style, as `object_store` makes them.
    pub(crate) base: String,
    region: String,
    /// `s3://BUCKET/PREFIX`, for messages.
    pub(crate) url: String,
}

/// The text of the first `<tag>` element of `xml`.
pub(crate) fn element<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let start = xml.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    Some(&xml[start..end])
}

impl Signed {
    pub(crate) fn new(config: &S3Config, store: AmazonS3) -> io::Result<Signed> {
        let region = config
            .region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".to_owned());
        let endpoint = config.endpoint.clone().unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        Ok(Signed {
            store,
            http: reqwest::Client::builder()
                .timeout(config.request_timeout())
                .connect_timeout(crate::CONNECT_TIMEOUT)
                .build()
                .map_err(io::Error::other)?,
            base: format!("{}/{}", endpoint.trim_end_matches('/'), config.bucket),
            region,
            url: config.url(),
        })
    }

    /// A signed request for `key` (the bucket itself when empty) with
    /// `query` (`retention`, `versionId=…`); its status and body. Sent
    /// again, after a pause, when it fails in transit or with a 5xx: every
    /// call made here may be (a repeat finds its work done).
    pub(crate) async fn send(
        &self,
        method: Method,
        key: &str,
        query: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> io::Result<(StatusCode, String)> {
        let mut attempt = 0;
        loop {
            let sent = self.send_once(method.clone(), key, query, headers, body.clone()).await;
            let failed = match &sent {
                Ok((status, _)) => status.is_server_error(),
                Err(error) => error.kind() == io::ErrorKind::ConnectionAborted,
            };
            if !failed || attempt == RETRIES_MAX {
                return sent;
            }
            attempt += 1;
            // 100 ms, 200 ms, 400 ms, with up to as much again of jitter.
            let pause = Duration::from_millis(100 << (attempt - 1));
            // The clock's nanoseconds: enough to keep retrying clients apart.
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let jitter = u64::from(nanos.subsec_nanos()) % pause.as_millis().max(1) as u64;
            tokio::time::sleep(pause + Duration::from_millis(jitter)).await;
        }
    }

    async fn send_once(
        &self,
        method: Method,
        key: &str,
        query: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> io::Result<(StatusCode, String)> {
        let mut url = match key.is_empty() {
            true => format!("{}/", self.base),
            false => format!("{}/{key}", self.base),
        };
        if !query.is_empty() {
            url = format!("{url}?{query}");
        }
        let credential = self.store.credentials().get_credential().await.map_err(|error| to_io(error, &self.url))?;
        let mut request = http::Request::builder().method(method.clone()).uri(&url);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let mut request = request.body(HttpRequestBody::from(body.clone())).map_err(io::Error::other)?;
        AwsAuthorizer::new(&credential, "s3", &self.region)
            .try_authorize(&mut request, None)
            .map_err(|error| to_io(error, &url))?;
        let in_transit =
            |error: reqwest::Error| io::Error::new(io::ErrorKind::ConnectionAborted, format!("{url}: {error}"));
        let reply = self
            .http
            .request(method, &url)
            .headers(request.headers().clone())
            .body(body)
            .send()
            .await
            .map_err(in_transit)?;
        let status = reply.status();
        let text = reply.text().await.map_err(in_transit)?;
        Ok((status, text))
    }

    /// `error` from a reply the store refused.
    pub(crate) fn refused(&self, what: &str, status: StatusCode, body: &str) -> io::Error {
        let code = element(body, "Code").unwrap_or("");
        let message = element(body, "Message").unwrap_or(body);
        let kind = match status {
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => io::ErrorKind::PermissionDenied,
            StatusCode::NOT_FOUND => io::ErrorKind::NotFound,
            status if status.is_server_error() => io::ErrorKind::ConnectionAborted,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, format!("{what}: {status} {code}: {message}"))
    }
}
