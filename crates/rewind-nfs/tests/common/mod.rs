//! What the NFS tests share: a real client (`nfs3_client` over TCP) and the
//! arguments they build.

#![allow(dead_code)] // Each test binary uses a different part of this.

use std::net::SocketAddr;

use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::tokio::TokioConnector;
use nfs3_client::{Nfs3Connection, Nfs3ConnectionBuilder};
use rewind_engine::Timestamp;

pub type Connection = Nfs3Connection<nfs3_client::tokio::TokioIo<tokio::net::TcpStream>>;

pub fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

/// Mounts `path` as user `uid` (MOUNT and NFS on the one port).
pub async fn connect(address: SocketAddr, path: &str, uid: u32) -> Connection {
    let credential = opaque_auth::auth_unix(&auth_unix { uid, gid: uid, ..auth_unix::default() });
    Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", path)
        .connect_from_privileged_port(false)
        .mount_port(address.port())
        .nfs3_port(address.port())
        .credential(credential)
        .mount()
        .await
        .unwrap_or_else(|error| panic!("mount {path}: {error:?}"))
}

pub fn name(text: &str) -> filename3<'static> {
    filename3(Opaque::owned(text.as_bytes().to_vec()))
}

pub fn dir_op(dir: &nfs_fh3, text: &str) -> diropargs3<'static> {
    diropargs3 { dir: dir.clone(), name: name(text) }
}

pub fn mode(bits: u32) -> sattr3 {
    sattr3 { mode: Nfs3Option::Some(bits), ..sattr3::default() }
}

pub fn status<T: std::fmt::Debug, E: std::fmt::Debug>(result: Nfs3Result<T, E>) -> nfsstat3 {
    match result {
        Nfs3Result::Ok(_) => nfsstat3::NFS3_OK,
        Nfs3Result::Err((status, _)) => status,
    }
}
