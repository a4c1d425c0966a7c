//! NBD server side for Rewind (spec: NetworkBlockDevice/nbd `doc/proto.md`).
//!
//! - [`export`]: the traits the server serves (`Catalog`, `Export`).
//! - [`protocol`]: the wire format, pure encode/decode, no I/O.
//! - [`server`]: listeners, connection threads, limits and shutdown; each
//!   connection's requests are read and run by a few threads of its own
//!   (leader/follower, `transmission`).
//! - [`engine`]: Rewind's volumes and views as exports.
//!
//! ```no_run
//! # fn demo(catalog: std::sync::Arc<dyn rewind_nbd::Catalog>) -> std::io::Result<()> {
//! use rewind_nbd::{Server, ServerConfig};
//! let server = Server::new(catalog, ServerConfig::default());
//! let address = server.serve_tcp("127.0.0.1:10809")?;
//! server.serve_unix("/run/rewind/nbd.sock")?;
//! // ... until asked to stop:
//! server.shutdown();
//! # let _ = address; Ok(()) }
//! ```

mod connection;
pub mod engine;
pub mod export;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod protocol;
mod refusal;
pub mod server;
pub mod tls;
mod transmission;

pub use export::{
    BlockSizes, Catalog, Client, DirtyBitmap, DirtyExtent, Export, ExportError, ExportErrorKind, ExportListing, Extent,
    OpenError, OpenErrorKind, ZeroFlags,
};
pub use server::{Server, ServerConfig};
pub use tls::{NbdTls, TlsMode};
