//! The cheapest proxy a user-space process can be: relay TCP connections
//! from `--listen` to `--upstream`, bytes only, nothing parsed or logged.
//! bench/nfs_mix.py puts it in front of nfs-ganesha to measure the floor
//! any NFS proxy pays on this machine (a second loopback hop, a read and a
//! write per message each way), against which `rewind proxy` is read.
//!
//! A thread per direction blocked in `read`, so a message costs one wake-up
//! and two system calls, with no poll loop between them.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Relay TCP connections to an upstream, bytes only: the floor for any proxy")]
struct Args {
    /// Address to listen on, several times for several relays (pairs with `--upstream` in order).
    #[arg(long, required = true)]
    listen: Vec<String>,
    /// Address each `--listen` relays to.
    #[arg(long, required = true)]
    upstream: Vec<String>,
}

/// Large enough for an NFS WRITE of 64 KiB and its header in one read.
const BUFFER_BYTES: usize = 256 * 1024;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.listen.len() == args.upstream.len(),
        "give one --upstream for each --listen ({} and {})",
        args.listen.len(),
        args.upstream.len()
    );
    let relays = args
        .listen
        .iter()
        .zip(args.upstream)
        .map(|(listen, upstream)| {
            let listener = TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
            Ok(thread::spawn(move || accept(&listener, &upstream)))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for relay in relays {
        relay.join().expect("relay thread panicked")?;
    }
    Ok(())
}

fn accept(listener: &TcpListener, upstream: &str) -> anyhow::Result<()> {
    for client in listener.incoming() {
        let client = client.context("accepting a connection")?;
        let server = match TcpStream::connect(upstream) {
            Ok(server) => server,
            Err(error) => {
                eprintln!("tcp-relay: connecting to {upstream}: {error}");
                continue;
            }
        };
        for stream in [&client, &server] {
            stream.set_nodelay(true)?;
        }
        let (client_in, server_in) = (client.try_clone()?, server.try_clone()?);
        thread::spawn(move || pass(client_in, server));
        thread::spawn(move || pass(server_in, client));
    }
    Ok(())
}

/// Copy `from` to `to` until `from` ends, then end `to` as well.
fn pass(mut from: TcpStream, mut to: TcpStream) {
    let mut buffer = vec![0; BUFFER_BYTES];
    loop {
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => {
                if to.write_all(&buffer[..count]).is_err() {
                    break;
                }
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    // The other direction sees the end and stops too; an error here means it already has.
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
