//! Large packs go up in parts (issue 14 req 2): 8 MiB parts sent two at a
//! time, then one CompleteMultipartUpload with `If-None-Match: *`, so a
//! pack still appears whole or not at all, and never over another — the
//! same promise as the single conditional PUT of smaller packs. A failed
//! upload is aborted. One a crash left behind is aborted when the pack is
//! uploaded again, or deleted: a node's packs are its own, so an unfinished
//! upload of one at that point belongs to a process that is gone. (Listing
//! every unfinished upload under a prefix would be simpler, but MinIO lists
//! them only by whole key.)
//!
//! `object_store` makes the parts; the conditional completion and the
//! listing of unfinished uploads are `crate::signed` requests.

use std::io;

use bytes::Bytes;
use futures_util::{stream, StreamExt, TryStreamExt};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use reqwest::{Method, StatusCode};

use crate::signed::{element, Signed};
use crate::to_io;

/// Packs at least this large go up in parts.
pub(crate) const MULTIPART_MIN_BYTES: usize = 16 << 20;
/// The size of each part but the last (S3's least is 5 MiB).
const PART_BYTES: usize = 8 << 20;
/// Parts sent at once. Each request must end within the client's timeout
/// (30 s): two 8 MiB parts at once need about 4.5 Mbit/s, what a single
/// PUT of a pack just below `MULTIPART_MIN_BYTES` needs. All of a 32 MiB
/// pack's parts at once needed 9 Mbit/s, and below that every attempt
/// timed out, for ever.
const PARTS_AT_ONCE: usize = 2;

/// What a completed upload left: its ETag.
pub(crate) struct Completed {
    pub(crate) e_tag: String,
}

/// Uploads `bytes` to `location` in parts; `AlreadyExists` if an object is
/// there already (including one an earlier attempt completed unheard).
pub(crate) async fn put_new(signed: &Signed, location: &Path, bytes: Vec<u8>, what: &str) -> io::Result<Completed> {
    let store = &signed.store;
    abort_unfinished(signed, location.as_ref()).await?;
    let id = store.create_multipart(location).await.map_err(|error| to_io(error, what))?;
    let bytes = Bytes::from(bytes);
    let parts = (0..bytes.len().div_ceil(PART_BYTES)).map(|index| {
        let part = bytes.slice(index * PART_BYTES..bytes.len().min((index + 1) * PART_BYTES));
        store.put_part(location, &id, index, PutPayload::from(part))
    });
    let parts: Result<Vec<PartId>, _> = stream::iter(parts).buffered(PARTS_AT_ONCE).try_collect().await;
    let completed = match parts {
        Ok(parts) => complete_new(signed, location, &id, &parts, what).await,
        Err(error) => Err(to_io(error, what)),
    };
    if completed.is_err() {
        // Best effort: a part left behind is aborted at the next listing.
        let _ = store.abort_multipart(location, &id).await;
    }
    completed
}

async fn complete_new(
    signed: &Signed,
    location: &Path,
    id: &str,
    parts: &[PartId],
    what: &str,
) -> io::Result<Completed> {
    let mut body = String::from("<CompleteMultipartUpload>");
    for (index, part) in parts.iter().enumerate() {
        body += &format!("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", index + 1, part.content_id);
    }
    body += "</CompleteMultipartUpload>";
    let headers = [("if-none-match", "*".to_owned()), ("content-type", "application/xml".to_owned())];
    let query = format!("uploadId={}", query_encode(id));
    let (status, reply) = signed.send(Method::POST, location.as_ref(), &query, &headers, body.into_bytes()).await?;
    let code = element(&reply, "Code");
    let already = || io::Error::new(io::ErrorKind::AlreadyExists, format!("{what} is there already"));
    match (status, code) {
        // S3 may answer 200 and then an error, once it has worked on it.
        (status, None) if status.is_success() => {
            // Quoted, and the quotes escaped as XML may escape them.
            let e_tag = element(&reply, "ETag").unwrap_or("").replace("&quot;", "\"").replace("&#34;", "\"");
            Ok(Completed { e_tag: e_tag.trim_matches('"').to_owned() })
        }
        (StatusCode::PRECONDITION_FAILED, _) | (_, Some("PreconditionFailed")) => Err(already()),
        // Completed before, its reply lost: the upload is gone, the object there.
        (_, Some("NoSuchUpload")) if store_has(signed, location).await => Err(already()),
        _ => Err(signed.refused(&format!("cannot complete the upload of {what}"), status, &reply)),
    }
}

async fn store_has(signed: &Signed, location: &Path) -> bool {
    signed.store.head(location).await.is_ok()
}

/// `text` for a query string: unreserved characters as they are.
fn query_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// The unfinished multipart uploads of keys starting with `prefix`, as
/// keys and ids.
async fn unfinished(signed: &Signed, prefix: &str) -> io::Result<Vec<(String, String)>> {
    let query = format!("prefix={}&uploads=", query_encode(prefix));
    let (status, reply) = signed.send(Method::GET, "", &query, &[], Vec::new()).await?;
    if !status.is_success() {
        return Err(signed.refused(&format!("cannot list the unfinished uploads of {}", signed.url), status, &reply));
    }
    let mut uploads = Vec::new();
    let mut rest = reply.as_str();
    while let Some(start) = rest.find("<Upload>") {
        let end = rest[start..].find("</Upload>").map_or(rest.len(), |end| start + end);
        let upload = &rest[start..end];
        if let (Some(key), Some(id)) = (element(upload, "Key"), element(upload, "UploadId")) {
            uploads.push((key.to_owned(), id.to_owned()));
        }
        rest = &rest[end..];
    }
    Ok(uploads)
}

/// Aborts the unfinished uploads of `key`; returns how many.
pub(crate) async fn abort_unfinished(signed: &Signed, key: &str) -> io::Result<usize> {
    let uploads = unfinished(signed, key).await?;
    let mut aborted = 0;
    for (listed, id) in uploads.iter().filter(|(listed, _)| listed == key) {
        let location = Path::from(listed.as_str());
        match signed.store.abort_multipart(&location, id).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => return Err(to_io(error, listed)),
        }
        tracing::info!(object = %listed, "aborted a multipart upload a crash left unfinished");
        aborted += 1;
    }
    Ok(aborted)
}
