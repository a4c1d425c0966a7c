//! Rewind's management API: JSON over HTTP or HTTPS on 127.0.0.1, plus
//! Prometheus metrics at `/metrics`, every route behind a bearer token.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/v1/health` | liveness and version |
//! | GET, POST | `/v1/volumes` | list volumes; create one (`CreateVolume`) |
//! | GET, PATCH, DELETE | `/v1/volumes/{name}` | details and stats; change the policy (`UpdateVolume`); delete with all history (`?with_clones=true`: and its clones) |
//! | POST | `/v1/volumes/{name}/import?block_size=N&layout=L&cache=C&granularity=G&retention=R&space_max=S` | create from a raw image sent as the body, as a job (a few at a time; 503 `busy` when too many wait) |
//! | GET | `/v1/volumes/{name}/timeline?bucket_seconds=N` | write activity and bookmarks |
//! | GET | `/v1/volumes/{name}/writes` | the writes its history keeps, oldest first, as newline-delimited JSON (`KeptWrite` per line: what `rewind trace export` writes as a trace) |
//! | GET, POST | `/v1/volumes/{name}/bookmarks` | list; create (`CreateBookmark`) |
//! | DELETE | `/v1/volumes/{name}/bookmarks/{bookmark}` | delete a bookmark |
//! | POST | `/v1/volumes/{name}/clones` | a writable clone of the volume at a point (`CreateClone`) |
//! | POST | `/v1/volumes/{name}/revert` | revert in place, or undo the last revert (`RevertVolume`) |
//! | POST | `/v1/volumes/{name}/promote` | give a clone its own copy of its base; progress, then the result, as newline-delimited JSON (`PromoteEvent`) |
//! | POST | `/v1/volumes/{name}/defrag` | lay out the history the view at `at` (`DefragVolume`) reads in block order; progress in blocks, then the result, as newline-delimited JSON (`DefragEvent`) |
//! | GET | `/v1/volumes/{name}/view?at=TIME` | resolve a point in time to its NBD export |
//! | GET | `/v1/volumes/{name}/changes?from=TIME[&to=TIME]` | the byte ranges that read differently between two points (to now without `to`) |
//! | GET | `/v1/volumes/{name}/allocation?at=NANOS&offset=O&length=L` | allocated and zero extents at an exact point (for `rewind restore`) |
//! | GET | `/v1/volumes/{name}/data?at=NANOS&offset=O&length=L` | the bytes at an exact point, at most 32 MiB at a time (for `rewind restore`) |
//! | DELETE | `/v1/volumes/{name}/history?from=TIME&to=TIME` | delete history, keeping each block's last version in the range |
//! | GET | `/v1/volumes/{name}/stats` | the volume's history measured now, and its device I/O by store (`VolumeReport`) |
//! | GET | `/v1/stats` | the chunk store and every volume (`NodeReport`) |
//! | POST | `/v1/gc` | garbage-collect now; progress, then the result, as newline-delimited JSON (`GcEvent`) |
//! | GET | `/v1/jobs`, `/v1/jobs/{id}` | imports running, waiting and recently finished, with progress (`JobInfo`) |
//! | GET | `/metrics` | Prometheus text format |
//! | GET, POST | `/v1/tokens` | list API tokens; create one (`TokenSpec` → `CreatedToken`, shown once) — admin token only |
//! | DELETE | `/v1/tokens/{id}` | revoke a token — admin token only |
//! | GET, POST, DELETE | `/v1/access` (`?volume=V&identity=I` to delete) | NBD access grants (`GrantInfo`) — admin token only |
//!
//! Every request passes the guard in `auth` first (allowed `Host`, no
//! cross-origin state change, a valid bearer token, its role and volumes);
//! connections pass the edge in `edge` (a connection cap that closes the
//! longest idle connection first, header/body/write timeouts, HTTPS).
//!
//! Engine calls block on disk I/O, so handlers run them on tokio's blocking
//! pool, within bounds: imports and other slow work get a few threads of
//! their own so quick requests always find one (`jobs`). Input is strict:
//! unknown JSON fields and query parameters are refused naming them, JSON
//! bodies are at most `JSON_BODY_BYTES_MAX` (64 KiB), and a PATCH that would
//! change nothing says why. Errors come back as `ErrorBody` with a status
//! that fits: 404 for unknown names, 409 for duplicates, volumes in use,
//! bases of clones and reverts under writers, 400 for bad input (413 for a
//! JSON body too large), 503 for a poisoned volume or chunk store and, with `Retry-After`, for too many imports
//! or too much other slow work
//! (`busy`), 500 for corruption and I/O errors; 401 without a valid token,
//! 403 for what a token may not do (or a foreign Host or Origin), 415 for a
//! body that is not JSON where JSON is expected (a form or text/plain body
//! on a request that changes something among them).

pub mod api;
mod auth;
mod edge;
mod jobs;
mod metrics;
mod server;

pub use auth::{AllowedHosts, Door};
pub use edge::HttpConfig;
pub use jobs::{ApiLimits, QUICK_THREADS};
pub use server::{router, serve, ApiState, JSON_BODY_BYTES_MAX};
