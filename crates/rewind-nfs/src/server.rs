//! NFS over TCP on the front ends' shared listeners (`rewind_serve::listen`):
//! one thread per connection reads a record, answers it, and writes the
//! reply, in order. MOUNT and NFS share the port, so no portmapper is
//! needed (clients are told the port: libnfs `?nfsport=2049&mountport=2049`).
//!
//! Limits: records of at most `RECORD_BYTES_MAX` (a larger one ends the
//! connection: the stream cannot be resynchronised), a connection idle for
//! `NfsConfig::idle_timeout` is closed (clients reconnect without noticing),
//! a client that stops reading its replies is dropped after
//! `NfsConfig::write_timeout`, and the shared connection limits. Clients
//! not in `NfsConfig::allowed` are closed at once: by default only this
//! machine (loopback addresses and the Unix socket) gets in, since AUTH_SYS
//! believes whatever user a client claims to be.

use std::io::{self, BufReader};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rewind_serve::listen::{self, Listeners, Peer, Protocol, Running, ServeConfig};
use rewind_serve::log_limit::PeerLog;
use rewind_serve::transport::{PollFirst, Transport};
use tracing::{info, warn};

use crate::rpc::{read_record, write_record};
use rewind_tree::Trees;

use crate::{Dispatcher, Proxy};

/// Client networks let in: an address and how many of its leading bits count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    pub address: IpAddr,
    pub prefix_bits: u8,
}

impl Network {
    pub fn contains(&self, address: IpAddr) -> bool {
        let (ours, theirs) = (widen(self.address), widen(address.to_canonical()));
        let bits = if self.address.is_ipv4() {
            96 + u32::from(self.prefix_bits.min(32))
        } else {
            u32::from(self.prefix_bits.min(128))
        };
        let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
        u128::from(ours) & mask == u128::from(theirs) & mask
    }

    /// `ADDRESS/BITS` or a bare address (all its bits).
    pub fn parse(text: &str) -> Result<Network, String> {
        let (address, bits) = match text.split_once('/') {
            Some((address, bits)) => (address, Some(bits)),
            None => (text, None),
        };
        let address: IpAddr = address.parse().map_err(|error| format!("{text:?}: {error}"))?;
        let bits_max = if address.is_ipv4() { 32 } else { 128 };
        let prefix_bits = match bits {
            None => bits_max,
            Some(bits) => bits
                .parse::<u8>()
                .ok()
                .filter(|&bits| bits <= bits_max)
                .ok_or_else(|| format!("{text:?}: a prefix of 0 to {bits_max} bits after the /"))?,
        };
        Ok(Network { address, prefix_bits })
    }
}

fn widen(address: IpAddr) -> Ipv6Addr {
    match address {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[derive(Clone, Debug)]
pub struct NfsConfig {
    pub serve: ServeConfig,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
    /// Who may connect over TCP (the Unix socket is this machine's).
    pub allowed: Vec<Network>,
}

impl Default for NfsConfig {
    fn default() -> Self {
        let loopback = ["127.0.0.0/8", "::1"].map(|network| Network::parse(network).expect("a network"));
        NfsConfig {
            serve: ServeConfig { connections_max: 64, connections_per_client_max: 16, ..ServeConfig::default() },
            idle_timeout: Duration::from_secs(600),
            write_timeout: Duration::from_secs(60),
            allowed: loopback.to_vec(),
        }
    }
}

/// The NFS protocol as the listeners serve it.
pub struct Nfs {
    dispatcher: Dispatcher,
    config: NfsConfig,
}

impl Protocol for Nfs {
    const NAME: &'static str = "nfs";

    fn serve<S: Transport>(self: &Arc<Self>, stream: S, peer: Peer, log: PeerLog, running: Running) {
        if let Some(address) =
            peer.address.filter(|address| !self.config.allowed.iter().any(|net| net.contains(address.ip())))
        {
            if log.allow() {
                warn!(%address, "NFS client refused: not in the allowed networks (rewind serve --nfs-allow)");
            }
            return;
        }
        match self.serve_connection(stream, &peer, &running) {
            Ok(()) => {
                if log.allow_info() {
                    info!("connection closed by client");
                }
            }
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if log.allow_info() {
                    info!("connection closed: idle for {} s", self.config.idle_timeout.as_secs());
                }
            }
            Err(error) => {
                if log.allow_info() {
                    info!(%error, "connection ended");
                }
            }
        }
    }

    /// RPC has no way to say why before a call: the connection is closed.
    fn refuse<S: Transport>(&self, _stream: S, _message: String) -> Option<Box<dyn listen::Refusal>> {
        None
    }
}

impl Nfs {
    fn serve_connection<S: Transport>(&self, stream: S, peer: &Peer, running: &Running) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.configure()?;
        stream.set_read_timeout(Some(self.config.idle_timeout))?;
        stream.set_write_timeout(Some(self.config.write_timeout))?;
        let (address, port) = match peer.address {
            Some(SocketAddr::V4(v4)) => (v4.ip().to_ipv6_mapped().octets(), v4.port()),
            Some(SocketAddr::V6(v6)) => (v6.ip().octets(), v6.port()),
            None => ([0; 16], 0),
        };
        let mut writer = stream.try_clone()?;
        // Polls before it sleeps, as NBD's reader does (`transport::POLL_BEFORE_SLEEP`).
        let mut reader = BufReader::with_capacity(64 << 10, PollFirst(stream));
        let (mut record, mut reply) = (Vec::new(), Vec::new());
        while !running.is_stopping() {
            if !read_record(&mut reader, &mut record)? {
                return Ok(());
            }
            if !self.dispatcher.answer(&record, address, port, &mut reply) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "a record too short to be an RPC call"));
            }
            write_record(&mut writer, &mut reply)?;
        }
        Ok(())
    }
}

/// An NFS server for a node's trees. Dropping it shuts it down.
pub struct NfsServer {
    listeners: Listeners<Nfs>,
}

impl NfsServer {
    /// Serves `trees` (shared with whatever else changes them: the API),
    /// the present of each proxied one forwarded to its upstream.
    pub fn new(trees: Arc<Trees>, proxies: &[Arc<Proxy>], config: NfsConfig) -> NfsServer {
        assert!(!config.idle_timeout.is_zero() && !config.write_timeout.is_zero(), "timeouts must be positive");
        let serve = config.serve;
        let nfs = Nfs { dispatcher: Dispatcher::new(trees, proxies), config };
        NfsServer { listeners: Listeners::new(Arc::new(nfs), serve) }
    }

    /// Listens on a TCP address and returns the bound address.
    pub fn serve_tcp(&self, address: impl ToSocketAddrs) -> io::Result<SocketAddr> {
        self.listeners.serve_tcp(address)
    }

    pub fn connection_count(&self) -> usize {
        self.listeners.connection_count()
    }

    pub fn shutdown(&self) {
        self.listeners.shutdown()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_contain_what_they_should() {
        let loopback = Network::parse("127.0.0.0/8").unwrap();
        assert!(loopback.contains("127.4.5.6".parse().unwrap()));
        assert!(loopback.contains("::ffff:127.0.0.1".parse().unwrap()), "IPv4 mapped");
        assert!(!loopback.contains("10.0.0.1".parse().unwrap()));
        let one = Network::parse("::1").unwrap();
        assert!(one.contains("::1".parse().unwrap()));
        assert!(!one.contains("::2".parse().unwrap()));
        assert!(Network::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
        assert!(Network::parse("10.0.0.0/33").is_err());
        assert!(Network::parse("nope").is_err());
    }
}
