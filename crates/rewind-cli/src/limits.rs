//! What `rewind serve` lets clients have, worked out at start: file
//! descriptors, connection caps, and logging that a client cannot turn
//! against the disk.
//!
//! # File descriptors
//!
//! Every connection costs descriptors, and so does the engine: journal
//! segments, index runs, packs, the chunk table. When clients took them
//! all, the engine failed to open an index manifest and poisoned the volume
//! (finding 1 of issue 11). So at start the soft `RLIMIT_NOFILE` is raised
//! to the hard limit, and the descriptors are shared out: Rewind's own
//! files keep `max(256, 25 %)` of them (but at most half), whatever
//! clients do; of the rest, half go to NBD (`FDS_PER_CONNECTION` per
//! connection, or `FDS_PER_TLS_CONNECTION` with TLS on, and one per refusal
//! under way: up to 64 per listener, fewer if NBD's half is small) and half
//! to HTTP (one per connection). NFS takes a quarter of NBD's connections
//! (at most 64, two descriptors each) out of NBD's half. The NBD
//! connection cap is the smaller of `--nbd-connections-max` and what its
//! half allows; the HTTP share is logged for the HTTP server's cap.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use rewind_http::ApiLimits;
use rewind_nbd::ServerConfig;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Descriptors kept for Rewind's own files at the least.
const RESERVED_FDS_MIN: u64 = 256;
/// And at least this fraction of the limit.
const RESERVED_FDS_DIVISOR: u64 = 4;

/// `rewind serve`'s options for limits and logging.
#[derive(Args)]
pub struct LimitArgs {
    /// Most NBD connections at once (default: 128, or fewer if the file
    /// descriptor limit leaves less room). Clients beyond it are refused
    /// with a message.
    #[arg(long)]
    nbd_connections_max: Option<usize>,
    /// Most NBD connections from one client: one IP address (every local
    /// TCP client is 127.0.0.1) or one user on the Unix socket.
    #[arg(long, default_value_t = ServerConfig::default().connections_per_client_max)]
    nbd_connections_per_client: usize,
    /// Close a connection to a live volume that sends no request for this
    /// long (`none`: never; a VM's disk may stay silent for days, and
    /// cutting it costs the guest an I/O error).
    #[arg(long, default_value = "none", value_parser = parse_timeout)]
    nbd_idle_timeout: Timeout,
    /// The same for views (VOLUME@TIME), which are reopened cheaply.
    #[arg(long, default_value = "1h", value_parser = parse_timeout)]
    nbd_view_idle_timeout: Timeout,
    /// Imports running at once; more wait in line (up to 8 times as many),
    /// beyond that the API answers 503.
    #[arg(long, default_value_t = ApiLimits::default().imports_max)]
    imports_max: usize,
    /// Log as human-readable text (colour only on a terminal) or JSON lines.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// What the servers are configured with.
pub struct Limits {
    pub nbd: ServerConfig,
    /// NFS connections at once: a quarter of NBD's share, at most 64; two
    /// descriptors each, taken from NBD's share.
    pub nfs_connections_max: usize,
    pub api: ApiLimits,
    /// The most API connections the descriptor budget holds.
    pub http_connections_max: usize,
}

impl LimitArgs {
    /// Raises the file descriptor limit, derives the connection caps from
    /// it and the options, and logs the budget. Call after `init_logging`.
    pub fn apply(&self, nbd_listeners: usize, nbd_tls: bool) -> Result<Limits> {
        let (fds, not_raised) = FdBudget::raise();
        if let Some(error) = not_raised {
            tracing::warn!(%error, "cannot raise the file descriptor limit to the hard limit; working within {}", fds.limit);
        }
        if self.nbd_connections_per_client == 0 || self.imports_max == 0 {
            bail!("--nbd-connections-per-client and --imports-max must be at least 1");
        }
        let defaults = ServerConfig::default();
        let refusals_max = fds.nbd_refusals_max(defaults.refusals_max);
        let connections_max = fds.nbd_connections_max(
            self.nbd_connections_max,
            defaults.connections_max,
            nbd_listeners * refusals_max,
            nbd_tls,
        )?;
        let nfs_connections_max = (connections_max / 4).clamp(1, 64);
        let connections_max = connections_max.saturating_sub(nfs_connections_max.div_ceil(2)).max(1);
        let nbd = ServerConfig {
            connections_max,
            refusals_max,
            connections_per_client_max: self.nbd_connections_per_client.min(connections_max),
            idle_timeout: self.nbd_idle_timeout.0,
            idle_timeout_read_only: self.nbd_view_idle_timeout.0,
            ..defaults
        };
        let api = ApiLimits {
            imports_max: self.imports_max,
            imports_waiting_max: 8 * self.imports_max,
            ..ApiLimits::default()
        };
        tracing::info!(
            limit = fds.limit,
            raised_from = fds.limit_before,
            reserved = fds.reserved,
            nbd_connections_max = nbd.connections_max,
            nbd_connections_per_client = nbd.connections_per_client_max,
            nfs_connections_max,
            http_connections_max = fds.http_connections_max(),
            "file descriptors: {} ({}); {} kept for Rewind's own files, NBD up to {} connections ({} per client), \
             NFS up to {} connections, HTTP up to {} connections",
            fds.limit,
            if fds.limit == fds.limit_before {
                "the hard limit".to_owned()
            } else {
                format!("soft limit raised from {}", fds.limit_before)
            },
            fds.reserved,
            nbd.connections_max,
            nbd.connections_per_client_max,
            nfs_connections_max,
            fds.http_connections_max(),
        );
        Ok(Limits { nbd, nfs_connections_max, api, http_connections_max: fds.http_connections_max() })
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; colour only when standard error is a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logs to standard error, filtered by `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // rustls logs every failed handshake, which any client can cause.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rustls=error"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        // Escape codes only help a terminal; in a file they are noise.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// A timeout that may be off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeout(pub Option<Duration>);

/// `none`, `off` or `0` for no timeout, else a duration like `1h` or `90s`.
pub fn parse_timeout(text: &str) -> Result<Timeout, String> {
    if ["none", "off", "0"].contains(&text.trim()) {
        return Ok(Timeout(None));
    }
    match humantime::parse_duration(text.trim()) {
        Ok(duration) => Ok(Timeout(Some(duration).filter(|duration| !duration.is_zero()))),
        Err(error) => Err(format!("{error}; write it like 1h, 10m or 90s, or none")),
    }
}

/// The file descriptor limit, raised, and how it is shared out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdBudget {
    /// The soft limit before and after raising it.
    pub limit_before: u64,
    pub limit: u64,
    /// Kept for Rewind's own files.
    pub reserved: u64,
    /// For NBD connections and refusals, and for HTTP connections.
    pub nbd: u64,
    pub http: u64,
}

impl FdBudget {
    /// Raises the soft limit to the hard one and shares it out; says why
    /// if it could not be raised.
    pub fn raise() -> (FdBudget, Option<rustix::io::Errno>) {
        let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
        // An unlimited hard limit cannot be the soft one: the kernel caps
        // descriptors at fs.nr_open.
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .unwrap_or(1 << 20);
        let before = current.unwrap_or(nr_open);
        let target = maximum.unwrap_or(nr_open).min(nr_open);
        if target <= before {
            return (FdBudget::share(before, before), None);
        }
        match setrlimit(Resource::Nofile, Rlimit { current: Some(target), maximum }) {
            Ok(()) => (FdBudget::share(before, target), None),
            Err(error) => (FdBudget::share(before, before), Some(error)),
        }
    }

    fn share(limit_before: u64, limit: u64) -> FdBudget {
        // A budget beyond 2^20 descriptors is as good as unlimited.
        let limit = limit.min(1 << 20);
        // At least half is left to clients, so a small limit still serves some.
        let reserved = (limit / RESERVED_FDS_DIVISOR).max(RESERVED_FDS_MIN).min(limit / 2);
        let clients = limit - reserved;
        FdBudget { limit_before, limit, reserved, nbd: clients / 2, http: clients - clients / 2 }
    }

    /// Refusals under way per NBD listener: `default`, or an eighth of
    /// NBD's share if that is less.
    pub fn nbd_refusals_max(&self, default: usize) -> usize {
        usize::try_from(self.nbd / 8).unwrap_or(usize::MAX).clamp(1, default)
    }

    /// The NBD connection cap: `requested`, or the default, within the
    /// budget left after `refusals` descriptors; an explicit request the
    /// budget cannot hold is an error.
    pub fn nbd_connections_max(
        &self,
        requested: Option<usize>,
        default: usize,
        refusals: usize,
        tls: bool,
    ) -> Result<usize> {
        let per_connection =
            if tls { rewind_nbd::server::FDS_PER_TLS_CONNECTION } else { rewind_nbd::server::FDS_PER_CONNECTION };
        let fits = self.nbd.saturating_sub(refusals as u64) / per_connection as u64;
        let fits = usize::try_from(fits).unwrap_or(usize::MAX);
        match requested {
            Some(requested) if requested > fits => bail!(
                "--nbd-connections-max {requested} needs more file descriptors than the limit leaves for NBD: \
                 {} of {} (each connection takes {}); raise the hard limit (ulimit -Hn) or ask for at most {fits}",
                self.nbd,
                self.limit,
                per_connection
            ),
            Some(0) => bail!("--nbd-connections-max must be at least 1"),
            Some(requested) => Ok(requested),
            None if fits == 0 => bail!(
                "the file descriptor limit ({}) leaves no room for NBD connections after the {} Rewind keeps for \
                 its own files; raise it (ulimit -n) to at least 1024",
                self.limit,
                self.reserved
            ),
            None => Ok(default.min(fits)),
        }
    }

    /// The most HTTP connections the budget holds.
    pub fn http_connections_max(&self) -> usize {
        usize::try_from(self.http).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_keeps_a_reserve_and_shares_the_rest() {
        let budget = FdBudget::share(1024, 1024);
        assert_eq!((budget.reserved, budget.nbd, budget.http), (256, 384, 384));
        // 384 - 48 refusals = 336 descriptors: 84 connections, 56 with TLS.
        assert_eq!(budget.nbd_refusals_max(64), 48);
        assert_eq!(budget.nbd_connections_max(None, 128, 48, false).unwrap(), 84);
        assert_eq!(budget.nbd_connections_max(None, 128, 48, true).unwrap(), 56);
        assert_eq!(budget.nbd_connections_max(Some(10), 128, 48, false).unwrap(), 10);
        let error = budget.nbd_connections_max(Some(500), 128, 48, false).unwrap_err().to_string();
        assert!(error.contains("ulimit -Hn"), "{error}");

        let budget = FdBudget::share(1024, 1 << 20);
        assert_eq!(budget.reserved, 1 << 18);
        assert_eq!(budget.nbd_refusals_max(64), 64);
        assert_eq!(budget.nbd_connections_max(None, 128, 128, true).unwrap(), 128);

        // A small limit still serves a few: half is kept, a quarter each.
        let budget = FdBudget::share(256, 256);
        assert_eq!((budget.reserved, budget.nbd, budget.http), (128, 64, 64));
        assert_eq!(budget.nbd_connections_max(None, 128, budget.nbd_refusals_max(64), false).unwrap(), 14);
        let budget = FdBudget::share(8, 8);
        assert!(budget.nbd_connections_max(None, 128, budget.nbd_refusals_max(64), false).is_err());
    }

    #[test]
    fn timeouts_can_be_turned_off() {
        assert_eq!(parse_timeout("none"), Ok(Timeout(None)));
        assert_eq!(parse_timeout("0"), Ok(Timeout(None)));
        assert_eq!(parse_timeout("90s"), Ok(Timeout(Some(Duration::from_secs(90)))));
        assert!(parse_timeout("soon").is_err());
    }
}
