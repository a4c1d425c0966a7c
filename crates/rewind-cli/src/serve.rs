//! `rewind serve`: the NBD server, the management API and the maintenance
//! thread around one node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Args;

use rewind_engine::{Node, NodeConfig, Timestamp};
use rewind_http::ApiState;
use rewind_io::OsStorage;
use rewind_nbd::engine::EngineCatalog;
use rewind_nbd::{Server, ServerConfig};

/// Held by whoever uses a data directory, so two processes never do.
pub const LOCK_FILE: &str = "rewind.lock";

/// How often maintenance runs when nothing wakes it earlier.
const MAINTENANCE_PERIOD: Duration = Duration::from_millis(20);
/// How often the slow work on history (archiving, retention, merges,
/// garbage collection) looks for something to do.
const HISTORY_PERIOD: Duration = Duration::from_secs(1);

#[derive(Args)]
pub struct ServeArgs {
    /// NBD listening address (TCP).
    #[arg(long, default_value = "127.0.0.1:10809")]
    nbd: SocketAddr,
    /// Also serve NBD on this Unix socket.
    #[arg(long)]
    nbd_unix: Option<PathBuf>,
    /// Management API listening address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// How often retention and space caps are applied: retention's clock
    /// advances and the index runs it thins further are rewritten (shorter:
    /// space back sooner, more rewriting).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    retention_interval: Duration,
    /// How often history moves from the journal into the deduplicated,
    /// compressed chunk store (sooner when 64 MiB of it waits).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    archive_interval: Duration,
    /// How often garbage collection runs, when there is garbage.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    gc_interval: Duration,
}

fn nanos(duration: Duration, option: &str) -> Result<u64> {
    let nanos = u64::try_from(duration.as_nanos()).with_context(|| format!("{option} is too long"))?;
    Ok(nanos.max(1))
}

pub fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

pub fn serve(data_dir: &Path, args: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let storage = OsStorage::new(data_dir).with_context(|| format!("cannot use {}", data_dir.display()))?;
    let _lock = storage
        .lock_exclusive(LOCK_FILE)
        .with_context(|| format!("{} is in use by another rewind process", data_dir.display()))?;
    let mut config = NodeConfig::default();
    config.volume.retention_interval_nanos = nanos(args.retention_interval, "--retention-interval")?;
    config.volume.archive_interval_nanos = nanos(args.archive_interval, "--archive-interval")?;
    config.collect_interval_nanos = nanos(args.gc_interval, "--gc-interval")?;
    let node = Arc::new(Node::open(Arc::new(storage), config)?);

    let nbd = Server::new(Arc::new(EngineCatalog::new(Arc::clone(&node))), ServerConfig::default());
    let nbd_address = nbd.serve_tcp(args.nbd).with_context(|| format!("cannot listen for NBD on {}", args.nbd))?;
    if let Some(path) = &args.nbd_unix {
        nbd.serve_unix(path).with_context(|| format!("cannot listen for NBD on {}", path.display()))?;
    }

    let stopping = Arc::new(AtomicBool::new(false));
    let maintenance = {
        let node = Arc::clone(&node);
        let stopping = Arc::clone(&stopping);
        let work = node.work_signal();
        thread::Builder::new().name("maintenance".into()).spawn(move || {
            while !stopping.load(Ordering::Acquire) {
                // Failures poison the volume concerned and are logged by the node.
                let _ = node.maintain(now());
                work.wait(MAINTENANCE_PERIOD);
            }
        })?
    };
    let (history_stop, history_stopped) = std::sync::mpsc::channel::<()>();
    let history = {
        let node = Arc::clone(&node);
        thread::Builder::new().name("history".into()).spawn(move || loop {
            // Failures are logged by the node; a failing volume is poisoned.
            let _ = node.maintain_history(now());
            match history_stopped.recv_timeout(HISTORY_PERIOD) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                _ => return,
            }
        })?
    };

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.http)
            .await
            .with_context(|| format!("cannot listen for the API on {}", args.http))?;
        let http_address = listener.local_addr()?;
        println!("rewind {} serving {}", env!("CARGO_PKG_VERSION"), data_dir.display());
        println!("listening nbd {nbd_address}");
        if let Some(path) = &args.nbd_unix {
            println!("listening nbd-unix {}", path.display());
        }
        println!("listening http {http_address}");
        let volumes: Vec<String> = node.volumes().iter().map(|volume| volume.name().to_string()).collect();
        println!(
            "exports: {} (and NAME@TIME views); stop with Ctrl-C",
            if volumes.is_empty() { "none yet".to_owned() } else { volumes.join(", ") }
        );
        let state = ApiState { node: Arc::clone(&node), nbd_address: Some(nbd_address.to_string()) };
        rewind_http::serve(listener, state, shutdown_signal()).await.context("API server failed")
    });

    tracing::info!("shutting down");
    nbd.shutdown();
    let _ = history_stop.send(());
    history.join().expect("history thread does not panic");
    stopping.store(true, Ordering::Release);
    node.work_signal().notify();
    maintenance.join().expect("maintenance thread does not panic");
    node.checkpoint_all(now()).context("final checkpoint failed; the next start replays the journal")?;
    served
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler installs");
    tokio::select! {
        _ = interrupt => {}
        _ = terminate.recv() => {}
    }
}
