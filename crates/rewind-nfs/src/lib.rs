//! NFSv3 (RFC 1813) and MOUNT v3 for Rewind's file trees: each tree is the
//! export `/TREE`, its past the read-only directories `/TREE/.rewind/TIME`
//! and the exports `/TREE@TIME`.
//!
//! ```text
//!  TCP ─▶ record marking (rpc.rs) ─▶ call header, AUTH_SYS ─▶ MOUNT (mount.rs) ─┐
//!                                                          └▶ NFS (program.rs) ──┴▶ rewind_tree::{Tree, TreeView}
//! ```
//!
//! Calls are decoded by hand with every length bounded (`xdr.rs`); replies
//! are encoded with `nfs3_types`. The code here knows inodes and names, not
//! journals (`rewind-tree` turns each operation into one compound write).

mod args;
mod handle;
mod mount;
mod program;
mod proxy;
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    //! The proxy's handling of the upstream's replies, which it must not
    //! trust, for the fuzz target `nfs_upstream_reply`.
    pub use crate::proxy::reply::{fit_listing, handles_in, replace, Found, TooSmall};
}
mod rpc;
mod server;
mod update;
mod xdr;

pub use handle::{FileHandle, Target, HANDLE_BYTES};
pub use program::{Dispatcher, PAST_NAME};
pub use proxy::upstream::{UpstreamAddress, UpstreamError};
pub use proxy::{Proxy, ProxyConfig, ProxyError, ProxyMode};
pub use server::{Network, NfsConfig, NfsServer};

use rewind_tree::Caller;

/// The anonymous user (AUTH_NONE calls).
const NOBODY: u32 = 65534;

impl Dispatcher {
    /// Answers one RPC record from a client at `address` (an IPv6 address,
    /// IPv4 mapped into it) and `port`. Returns false when nothing can be
    /// answered (not even an xid could be read).
    pub fn answer(&self, record: &[u8], address: [u8; 16], port: u16, out: &mut Vec<u8>) -> bool {
        let call = match rpc::decode_call(record) {
            Ok(call) => call,
            Err(rpc::BadCall::Unreadable) => return false,
            Err(rpc::BadCall::RpcMismatch { xid }) => {
                rpc::denied(out, xid, None);
                return true;
            }
            Err(rpc::BadCall::Auth { xid, stat }) => {
                rpc::denied(out, xid, Some(stat));
                return true;
            }
            Err(rpc::BadCall::Garbage { xid, reason }) => {
                tracing::debug!(%reason, "garbage call header");
                rpc::accepted(out, xid, rpc::Accepted::GarbageArguments, (0, 0));
                return true;
            }
        };
        let caller = match call.credentials {
            rpc::Credentials::Sys { uid, gid, gids } => Caller { uid, gid, gids, address, port, acting_for: None },
            rpc::Credentials::None => {
                Caller { uid: NOBODY, gid: NOBODY, gids: Vec::new(), address, port, acting_for: None }
            }
        };
        let arguments = &record[call.arguments..];
        match (call.program, call.version) {
            (program::PROGRAM, program::VERSION) => match self.proxy_for(call.procedure, arguments) {
                Some(proxy) => {
                    let forwarded = proxy.forward(call.procedure, record, call.arguments, &caller, out);
                    if let Err(failure) = forwarded {
                        program::reply(out, call.xid, call.procedure, Err(failure));
                    }
                }
                None => self.nfs(call.procedure, arguments, &caller, call.xid, out),
            },
            (mount::PROGRAM, mount::VERSION) => self.mount(call.procedure, arguments, &caller, call.xid, out),
            (program::PROGRAM, _) => {
                rpc::accepted(out, call.xid, rpc::Accepted::ProgramMismatch, (program::VERSION, program::VERSION))
            }
            (mount::PROGRAM, _) => {
                rpc::accepted(out, call.xid, rpc::Accepted::ProgramMismatch, (mount::VERSION, mount::VERSION))
            }
            _ => rpc::accepted(out, call.xid, rpc::Accepted::ProgramUnavailable, (0, 0)),
        }
        true
    }
}

pub use rpc::{read_record, write_record, RECORD_BYTES_MAX};
