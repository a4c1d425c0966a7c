//! `rewind`: the command line. The only place that wires concrete parts
//! together: the real filesystem, the engine, the NBD and HTTP servers.

mod backend;
mod group;
mod lab;
mod limits;
mod node_cmd;
mod output;
mod restore;
mod serve;
mod tls;
mod tree_restore;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use rewind_access::{Access, GrantInfo, TokenSpec};
use rewind_engine::{Clones, InUse};
use rewind_http::api::{
    CreateBookmark, CreateClone, CreateVolume, Policy, RevertTreePath, RevertVolume, TreeHistoryQuery, VolumeInfo,
};

use crate::backend::{Backend, Progress};

#[derive(Parser)]
#[command(
    name = "rewind",
    version,
    about = "Continuous data protection for block volumes: every write kept, any moment readable",
    after_help = TIMES_HELP,
)]
struct Cli {
    /// Data directory: where `serve` keeps volumes, and what other commands
    /// use directly when no server answers.
    #[arg(long, env = "REWIND_DATA_DIR", default_value = "rewind-data", global = true)]
    data_dir: PathBuf,
    /// Management API of the server to talk to. Its token comes from
    /// REWIND_TOKEN, or else from DATA_DIR/admin-token when readable.
    #[arg(long, env = "REWIND_SERVER", default_value = "http://127.0.0.1:8080", global = true)]
    server: String,
    /// The CA certificate (PEM) to trust for an https:// --server (one made
    /// for this node rather than a public one).
    #[arg(long, env = "REWIND_SERVER_CA", value_name = "FILE", global = true)]
    server_ca: Option<PathBuf>,
    /// Work on the data directory directly, without asking a server (it
    /// must not be in use by one).
    #[arg(long, global = true, conflicts_with = "server")]
    offline: bool,
    #[command(subcommand)]
    command: Command,
}

const TIMES_HELP: &str = "\
Times (TIME) may be written as:
  2026-11-22T10:03:12Z      RFC 3339 (any offset; fractions of a second allowed)
  2026-11-22 10:03:12       local date and time of the server
  10:03:12                  that time today, local time of the server
  1763805792                Unix seconds (13 digits: ms, 16: µs, 19: ns; @1763805792 also works)
  -10m, \"10 minutes ago\"    relative to now (s, m, h, d, w; combinations like -1h30m)
  before-upgrade            a bookmark name
Views are NBD exports named VOLUME@TIME, e.g. nbd://127.0.0.1:10809/db@-10m";

#[derive(Subcommand)]
enum Command {
    /// Serve every volume over NBD (VOLUME, and VOLUME@TIME read-only views) and the management API.
    Serve(Box<serve::ServeArgs>),
    /// Protect an NFSv3 server Rewind does not run: serve TREE's present by forwarding to the
    /// upstream, recording every update it applies (`rewind proxy --upstream 127.0.0.1:2050 --tree shop`).
    Proxy(Box<serve::ProxyArgs>),
    /// Create, import, list, inspect and delete volumes.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// File trees, served over NFSv3 with their past as `/.rewind/TIME` directories: `rewind tree create home`.
    #[command(subcommand)]
    Tree(TreeCommand),
    /// The node as a whole: `rewind node recover --bucket s3://BUCKET/PREFIX` rebuilds a lost one from its bucket.
    #[command(subcommand)]
    Node(node_cmd::NodeCommand),
    /// Name a point in time: `rewind bookmark VOLUME NAME [--at TIME]`; also `list` and `delete`.
    /// Given a group, one instant across its volumes.
    Bookmark(BookmarkArgs),
    /// Consistency groups: volumes bookmarked and reverted together (`rewind group create shop db logs`).
    #[command(subcommand)]
    Group(group::GroupCommand),
    /// When a volume was written, how much, and its bookmarks.
    Timeline {
        volume: String,
        /// Bucket size, e.g. 1m, 15m, 1h, 1d (default: chosen to fit the history).
        #[arg(long)]
        bucket: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete history: `rewind history delete VOLUME --from TIME --to TIME`.
    #[command(subcommand)]
    History(HistoryCommand),
    /// Versions written and kept, deduplication and compression, and bytes
    /// by place, for the node and every volume (or one: `rewind stats VOLUME`).
    Stats {
        volume: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Collect garbage now: free chunks no history refers to, rewrite mostly
    /// dead packs (this also runs by itself every `--gc-interval`).
    Gc {
        /// Show a progress bar.
        #[arg(long)]
        progress: bool,
        #[arg(long)]
        json: bool,
    },
    /// The CDP architectures lab: replay block traces through the six
    /// layouts, analyse them against the papers' models, generate traces.
    #[command(subcommand)]
    Lab(lab::LabCommand),
    /// Block traces of protected volumes: `rewind trace export VOLUME > VOLUME.trace`.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// API tokens: `rewind token create [--read-only] [--volume NAME]...`, `list`, `revoke ID`.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Which NBD client may open which volume (by the common name of its
    /// certificate, or * for anyone): `rewind access grant VOLUME IDENTITY [--read-only]`, `revoke`, `list`.
    #[command(subcommand)]
    Access(AccessCommand),
    /// What changed between two points of a volume: `rewind diff db@yesterday-backup [db@-1h]`
    /// lists the byte ranges that read differently (without the second point: up to now).
    Diff {
        /// VOLUME@TIME: the earlier point (see TIME below).
        #[arg(allow_hyphen_values = true)]
        from: String,
        /// VOLUME@TIME: the later point; the present if left out.
        #[arg(allow_hyphen_values = true)]
        to: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Put a volume back, in place, to a point in time: `rewind revert db --to before-upgrade`.
    /// Immediate (metadata only); nothing is lost: the state just before is bookmarked
    /// (`before-revert-…`) and `rewind revert db --undo` brings it back.
    Revert {
        volume: String,
        /// The point to go back to (see TIME below).
        #[arg(long, allow_hyphen_values = true, required_unless_present = "undo", conflicts_with = "undo")]
        to: Option<String>,
        /// Go back to the state just before the last revert.
        #[arg(long)]
        undo: bool,
        /// Cut off NBD clients writing to the volume (their requests fail from
        /// then on, so they reconnect) instead of refusing.
        #[arg(long)]
        disconnect: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write a volume as it was to a file or block device: `rewind restore db@before-upgrade --to
    /// /srv/db.raw --progress`; `--since T0` writes only what changed since T0 onto a copy of the
    /// volume as it was then.
    Restore {
        /// VOLUME@TIME: what to restore (see TIME below).
        #[arg(allow_hyphen_values = true)]
        point: String,
        /// The file or block device to write.
        #[arg(long)]
        to: PathBuf,
        /// The point the target holds already (a bookmark, a time): only the ranges changed since
        /// then are written.
        #[arg(long, allow_hyphen_values = true)]
        since: Option<String>,
        /// Overwrite an existing file or device (a full restore).
        #[arg(long)]
        force: bool,
        #[arg(long)]
        progress: bool,
        #[arg(long)]
        json: bool,
    },
    /// Resolve a point in time to the NBD export that shows the volume as it was then.
    View {
        volume: String,
        /// When (see TIME below).
        #[arg(allow_hyphen_values = true)]
        time: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create an API token; it is shown once (only its hash is kept).
    Create {
        /// It may only read (GET).
        #[arg(long)]
        read_only: bool,
        /// It sees and acts on only this volume (repeatable); others look
        /// absent to it, and node-wide requests are refused.
        #[arg(long = "volume", value_name = "NAME")]
        volumes: Vec<String>,
        /// A label for `token list`.
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List tokens (never the tokens themselves).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token at once (the admin token too: the next `rewind serve` makes a new one).
    Revoke { id: String },
}

#[derive(Subcommand)]
enum AccessCommand {
    /// Let IDENTITY open VOLUME over NBD (and its views). IDENTITY is the
    /// common name (CN) of a client certificate, or * for any client.
    Grant {
        volume: String,
        identity: String,
        /// Views and the live volume, read-only.
        #[arg(long)]
        read_only: bool,
        #[arg(long)]
        json: bool,
    },
    /// Take a grant back (clients already connected keep their connection).
    Revoke { volume: String, identity: String },
    /// List the grants.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Write the volume's kept history as a trace (csv: `time,op,size,lbn`)
    /// on standard output, for `rewind lab replay` and `rewind lab analyze`.
    /// Writes thinned by granularity or retention are not in it.
    Export { volume: String },
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Delete the history between two times: each block keeps its last
    /// version in the range, so every time before FROM and from TO on reads
    /// exactly as before; times in between can no longer be viewed.
    Delete {
        volume: String,
        /// Start of the range (see TIME below).
        #[arg(long, allow_hyphen_values = true)]
        from: String,
        /// End of the range; its state is kept.
        #[arg(long, allow_hyphen_values = true)]
        to: String,
        /// Do not ask (required when not on a terminal).
        #[arg(long)]
        yes: bool,
        #[arg(long)]
        json: bool,
    },
}

/// What history a new volume keeps.
#[derive(Args)]
struct PolicyArgs {
    /// Protection granularity: 0 keeps every write; with a duration such
    /// as 1m, only each block's last write in every minute is history.
    #[arg(long, default_value = "0")]
    granularity: String,
    /// Retention tiers `interval:age`, youngest first: "all:2h, 1m:24h, 1h:7d"
    /// keeps every write for 2 hours, then one version per block per minute
    /// until a day old, per hour until a week old; older history is dropped
    /// (bookmarks stay). The default keeps all history.
    #[arg(long, default_value = "forever")]
    retention: String,
    /// The most bytes the archived history may take, e.g. 200GiB; past it
    /// the oldest history goes first (bookmarks stay). `none`: no cap.
    #[arg(long, default_value = "none")]
    space_max: String,
}

/// How a new volume stores its writes.
#[derive(Args)]
struct ShapeArgs {
    /// Block size: a power of two from 512 B to 64 KiB.
    #[arg(long, default_value = "4KiB")]
    block_size: String,
    /// Where writes go: journaled (journal, then the current store),
    /// logging (history only; the present is read through the map),
    /// split-stream and split-down-stream (behind a controller cache, each
    /// version let go to history; split-down-stream writes them all to the
    /// current store too), checkpointing (as cow, behind a controller cache
    /// that absorbs overwrites of recently written blocks), cow
    /// (copy-on-write: in place, each block copied to history at its first
    /// overwrite after a snapshot) or row (redirect-on-write: the current
    /// store is merged at each snapshot). Snapshots are every granularity
    /// window end and every bookmark.
    #[arg(long, default_value = "journaled")]
    layout: String,
    /// The unit COW copies and ROW redirects (the block size), e.g. 16KiB.
    #[arg(long, conflicts_with = "block_size")]
    snap_block: Option<String>,
    /// The controller cache of split-stream, split-down-stream and checkpointing (3% of it may be dirty), e.g. 64MiB.
    #[arg(long)]
    cache: Option<String>,
}

impl ShapeArgs {
    fn request(self, name: String, size_bytes: u64, policy: PolicyArgs) -> Result<CreateVolume> {
        let block_size = match &self.snap_block {
            Some(_) if !["cow", "row"].contains(&self.layout.as_str()) => {
                bail!("--snap-block is the unit of a snapshot layout (cow, row); for {} use --block-size", self.layout)
            }
            Some(snap_block) => snap_block,
            None => &self.block_size,
        };
        Ok(CreateVolume {
            name,
            size_bytes,
            block_size: Some(parse_block_size(block_size)?),
            layout: Some(self.layout),
            cache: self.cache,
            granularity: Some(policy.granularity),
            retention: Some(policy.retention),
            space_max: Some(policy.space_max),
            tree: false,
        })
    }
}

#[derive(Subcommand)]
enum TreeCommand {
    /// Create an empty file tree; protection begins now. `rewind serve` serves it over NFSv3 as the
    /// export /NAME (and /NAME@TIME, /NAME/.rewind/TIME as it was).
    Create {
        name: String,
        #[command(flatten)]
        policy: PolicyArgs,
        #[arg(long)]
        json: bool,
    },
    /// The node's file trees.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Put a file or directory of a tree back as it was, in place, the rest of the tree untouched:
    /// `rewind tree revert home projects --to -2h`. Nothing is lost: the tree just before is
    /// bookmarked (`before-revert-…`), and reverting the path to that bookmark undoes it.
    Revert {
        tree: String,
        /// The path from the tree's root ("" or / for the whole tree).
        path: String,
        /// The point to go back to (TIME below).
        #[arg(long, allow_hyphen_values = true)]
        to: String,
        #[arg(long)]
        json: bool,
    },
    /// Copy a file or directory of a tree, as it was, out to this machine: `rewind tree restore
    /// home@before-cleanup/projects --to ./projects --progress` (contents, modes, times, hard and
    /// symbolic links; owners too when run as root; devices, sockets and FIFOs are not made).
    Restore {
        /// TREE@TIME/PATH (TIME below; the present without @TIME; the whole tree without /PATH).
        #[arg(allow_hyphen_values = true)]
        point: String,
        /// A directory that does not exist yet (or is empty), or for one file, the file to make.
        #[arg(long)]
        to: PathBuf,
        #[arg(long)]
        progress: bool,
        #[arg(long)]
        json: bool,
    },
    /// Resolve a point in time to the read-only NFS export and `.rewind` directory that show the
    /// tree as it was then: `rewind tree view home -2h`.
    View {
        tree: String,
        /// When (see TIME below).
        #[arg(allow_hyphen_values = true)]
        time: String,
        #[arg(long)]
        json: bool,
    },
    /// How a tree kept by `rewind proxy` follows its upstream NFS server: updates forwarded and
    /// recorded, and with --async how far behind it is.
    Mirror {
        tree: String,
        #[arg(long)]
        json: bool,
    },
    /// Every version of one file: when, its size, and who changed it (the client's address and
    /// user): `rewind tree history home notes.txt`.
    History {
        tree: String,
        /// The file's path from the tree's root.
        path: String,
        /// Find the path in the tree as it was then (a file since removed or renamed); TIME below.
        #[arg(long, allow_hyphen_values = true)]
        at: Option<String>,
        /// At most this many versions, newest first.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Create an empty volume; protection begins now.
    Create {
        name: String,
        /// Size, e.g. 10GiB, 512MiB, 1TB.
        #[arg(long)]
        size: String,
        #[command(flatten)]
        shape: ShapeArgs,
        #[command(flatten)]
        policy: PolicyArgs,
        #[arg(long)]
        json: bool,
    },
    /// Protect an existing raw image: it becomes the volume's first version.
    Import {
        name: String,
        /// A raw disk image; the volume gets its size.
        file: PathBuf,
        #[command(flatten)]
        shape: ShapeArgs,
        #[command(flatten)]
        policy: PolicyArgs,
        /// Show a progress bar (and, with a server, whether the import waits
        /// for a slot: a few run at once).
        #[arg(long)]
        progress: bool,
        #[arg(long)]
        json: bool,
    },
    /// Change a volume's protection policy.
    Set {
        name: String,
        /// Protection granularity: 0 (every write) or a duration like 1m. History
        /// already thinned stays thinned.
        #[arg(long)]
        granularity: Option<String>,
        /// Retention tiers `interval:age`, youngest first, e.g.
        /// "all:6h, 10m:14d"; `forever` keeps all history.
        #[arg(long)]
        retention: Option<String>,
        /// The most bytes the archived history may take, e.g. 200GiB, or `none`.
        #[arg(long)]
        space_max: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List volumes.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show a volume's details and statistics.
    Info {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Repair a damaged volume: rebuild what is derived (checkpoint, index
    /// runs, from the journal), keep what verifies, and say exactly what
    /// is lost. Without --yes, only shows what it would do.
    Repair {
        name: String,
        /// Repair (otherwise only say what would be done).
        #[arg(long)]
        yes: bool,
        /// Take the volume out of service even while clients use it.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume and all its history.
    Delete {
        name: String,
        /// Do not ask (required when not on a terminal).
        #[arg(long)]
        yes: bool,
        /// Delete it even while clients are connected to it (they get errors from then on).
        #[arg(long)]
        force: bool,
        /// Delete its clones (and theirs) with it; without this a volume
        /// that clones read from is not deleted.
        #[arg(long)]
        with_clones: bool,
    },
    /// A writable volume that starts as another was at a point in time:
    /// `rewind volume clone db@-2h db-debug`. Nothing is copied, so it is
    /// immediate; it reads the source's history where it has not been
    /// written, and keeps its own every-write history. Given a group at one
    /// of its bookmarks (`shop@before-migration shop-debug`), a new group of
    /// clones of its volumes, named `shop-debug-<volume>`.
    Clone {
        /// VOLUME@TIME (see TIME in `rewind --help`), or VOLUME for now.
        source: String,
        /// The new volume's name.
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Detach a clone from its base: copy what it reads from the base (the
    /// base as it was at the branch point) into the clone, which serves as
    /// before meanwhile; then the base can be deleted. The clone's
    /// contents, views and history do not change.
    Promote {
        /// The clone.
        name: String,
        /// Show a progress bar.
        #[arg(long)]
        progress: bool,
        #[arg(long)]
        json: bool,
    },
    /// Lay out the history a view reads in block order, so that reading or
    /// restoring it reads the chunk store's packs in order: history is
    /// stored in the order it was archived, and a view of a point that
    /// later writes rewrote in places finds its blocks among other points'
    /// versions. Copies the view's archived chunks into new packs (about
    /// the view's size in the worst case; pieces already in order are left
    /// as they are); the volume and its views keep serving meanwhile.
    Defrag {
        /// VOLUME@TIME (see TIME in `rewind --help`), a bookmark for one.
        point: String,
        /// Show a progress bar.
        #[arg(long)]
        progress: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct BookmarkArgs {
    #[command(subcommand)]
    command: Option<BookmarkCommand>,
    /// The volume to bookmark.
    #[arg(required = true)]
    volume: Option<String>,
    /// The bookmark's name (letters, digits, '.', '_', '-'; not starting with a digit).
    #[arg(required = true)]
    name: Option<String>,
    /// The time to name; by default now, after making every write so far durable.
    #[arg(long, allow_hyphen_values = true)]
    at: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum BookmarkCommand {
    /// Name a point in time (same as `rewind bookmark VOLUME NAME`).
    Create {
        volume: String,
        name: String,
        #[arg(long, allow_hyphen_values = true)]
        at: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List a volume's bookmarks.
    List {
        volume: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a bookmark (the history it named stays).
    Delete { volume: String, name: String },
}

fn parse_bytes(text: &str, what: &str) -> Result<u64> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text)
        .with_context(|| format!("cannot read {text:?} as a {what}; write it like 10GiB, 512MiB or 4096"))
}

/// `VOLUME@TIME` as its two parts (a volume name has no `@`).
/// Runs `work`, showing the progress it reports (done, of total) on `bar`
/// if there is one, cleared once it returns.
fn with_bar<T>(bar: Option<indicatif::ProgressBar>, work: impl FnOnce(&mut dyn FnMut(u64, u64)) -> T) -> T {
    let result = work(&mut |done, total| {
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    result
}

fn volume_at(text: &str) -> Result<(&str, &str)> {
    match text.split_once('@') {
        Some((volume, at)) if !volume.is_empty() && !at.is_empty() => Ok((volume, at)),
        _ => {
            bail!("{text:?} is not VOLUME@TIME: name the volume and a point in time, e.g. db@-1h or db@before-upgrade")
        }
    }
}

fn parse_block_size(text: &str) -> Result<u32> {
    let bytes = parse_bytes(text, "block size")?;
    u32::try_from(bytes)
        .ok()
        .filter(|bytes| bytes.is_power_of_two() && (512..=65536).contains(bytes))
        .with_context(|| format!("block size {text} must be a power of two from 512 B to 64 KiB"))
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let server_given = matches.value_source("server").is_some_and(|source| source != ValueSource::DefaultValue);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    match run(cli, server_given) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Commands other than `serve` end quietly when their reader goes away
/// (`rewind trace export db | head`), as Unix tools do; the server keeps
/// Rust's default of seeing EPIPE as an error on the one socket.
fn die_on_broken_pipe() {
    // SAFETY: restoring a signal's default disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli, server_given: bool) -> Result<()> {
    if !matches!(cli.command, Command::Serve(_) | Command::Proxy(_)) {
        die_on_broken_pipe();
    }
    let command = match cli.command {
        Command::Serve(args) => return serve::serve(&cli.data_dir, *args),
        Command::Proxy(args) => return serve::proxy(&cli.data_dir, *args),
        Command::Lab(command) => return lab::run(command),
        Command::Node(command) => return node_cmd::run(&cli.data_dir, command),
        command => command,
    };
    let creates = matches!(
        command,
        Command::Volume(VolumeCommand::Create { .. } | VolumeCommand::Import { .. })
            | Command::Tree(TreeCommand::Create { .. })
    );
    let backend = if cli.offline {
        backend::local(&cli.data_dir, creates)?
    } else {
        backend::connect(&cli.server, server_given, cli.server_ca.as_deref(), &cli.data_dir, creates)?
    };
    match command {
        Command::Serve(_) | Command::Proxy(_) | Command::Lab(_) | Command::Node(_) => unreachable!("handled above"),
        Command::Trace(TraceCommand::Export { volume }) => lab::export(&*backend, &volume),
        Command::Volume(command) => volume(&*backend, command),
        Command::Tree(command) => tree(&*backend, command),
        Command::Bookmark(args) => bookmark(&*backend, args),
        Command::Group(command) => group::group(&*backend, command),
        Command::Token(command) => token(&*backend, command),
        Command::Access(command) => access(&*backend, command),
        Command::Timeline { volume, bucket, json } => {
            let bucket_seconds = match bucket {
                Some(text) => Some(output::parse_bucket(&text)?),
                None => None,
            };
            let timeline = backend.timeline(&volume, bucket_seconds.unwrap_or(60))?;
            if json {
                return output::json(&timeline);
            }
            let timeline = match bucket_seconds {
                Some(_) => timeline,
                None => backend.timeline(&volume, output::auto_bucket(&timeline))?,
            };
            output::timeline(&timeline);
            Ok(())
        }
        Command::Stats { volume, json } => match volume {
            Some(volume) => {
                let report = backend.volume_stats(&volume)?;
                if json {
                    return output::json(&report);
                }
                output::volume_report(&report);
                Ok(())
            }
            None => {
                let report = backend.node_stats()?;
                if json {
                    return output::json(&report);
                }
                output::node_report(&report);
                Ok(())
            }
        },
        Command::Gc { progress, json } => {
            let bar = progress.then(output::gc_progress_bar);
            let report = backend.collect_garbage(&mut |phase, done, total| {
                if let Some(bar) = &bar {
                    output::gc_progress(bar, phase, done, total);
                }
            });
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            let report = report?;
            if json {
                return output::json(&report);
            }
            output::gc_report(&report);
            Ok(())
        }
        Command::Revert { volume, to, undo, disconnect, json } => {
            let request = RevertVolume { to, undo, disconnect };
            if group::is_group(&*backend, &volume) {
                return group::revert(&*backend, &volume, &request, json);
            }
            let summary = backend.revert_volume(&volume, &request)?;
            if json {
                return output::json(&summary);
            }
            println!(
                "reverted {volume} to {}: it reads as it did then; the state before is bookmark {} \
                 (`rewind revert {volume} --undo` goes back to it)",
                summary.revert.to, summary.bookmark
            );
            for client in &summary.disconnected {
                println!("cut off {client}");
            }
            Ok(())
        }
        Command::Diff { from, to, json } => {
            let (volume, from) = volume_at(&from)?;
            let to = match &to {
                Some(to) => {
                    let (other, to) = volume_at(to)?;
                    if other != volume {
                        bail!("rewind diff compares two points of one volume, not {volume} and {other}");
                    }
                    Some(to)
                }
                None => None,
            };
            let changes = backend.changes(volume, from, to)?;
            if json {
                return output::json(&changes);
            }
            output::changes(&changes);
            Ok(())
        }
        Command::Restore { point, to, since, force, progress, json } => {
            let (volume, at) = volume_at(&point)?;
            let progress = if progress { Progress::Bar } else { Progress::Quiet };
            let request = restore::RestoreRequest { volume, at, target: to, since: since.as_deref(), force, progress };
            let summary = restore::restore(&*backend, request)?;
            if json {
                return output::json(&summary);
            }
            output::restored(&summary);
            Ok(())
        }
        Command::View { volume, time, json } => {
            let view = backend.resolve_view(&volume, &time)?;
            if json {
                return output::json(&view);
            }
            output::view(&view, backend.nbd_address().as_ref());
            Ok(())
        }
        Command::History(HistoryCommand::Delete { volume, from, to, yes, json }) => {
            let question = format!("delete the history of {volume} from {from} to {to}?");
            if !yes && !output::confirm(&question)? {
                bail!("not deleted (pass --yes to delete without asking)");
            }
            let deleted = backend.delete_history(&volume, &from, &to)?;
            if json {
                return output::json(&deleted);
            }
            println!(
                "deleted the history of {} from {} to {}: each block keeps its last version in the range; \
                 {} versions kept, {} dropped by thinning in all",
                deleted.volume, deleted.from, deleted.to, deleted.versions, deleted.versions_thinned
            );
            Ok(())
        }
    }
}

fn tree(backend: &dyn Backend, command: TreeCommand) -> Result<()> {
    match command {
        TreeCommand::Create { name, policy, json } => {
            let request = CreateVolume {
                name,
                size_bytes: 0,
                block_size: None,
                layout: None,
                cache: None,
                granularity: Some(policy.granularity),
                retention: Some(policy.retention),
                space_max: Some(policy.space_max),
                tree: true,
            };
            let info = backend.create_volume(&request)?;
            if json {
                return output::json(&info);
            }
            println!(
                "created file tree {} (keeps {}): nfs://127.0.0.1{}?version=3&nfsport=2049&mountport=2049 \
                 (MOUNT and NFS on one port) once `rewind serve` runs; its past is {}/.rewind/TIME",
                info.name,
                output::kept_history(&info),
                info.export,
                info.export
            );
            Ok(())
        }
        TreeCommand::History { tree, path, at, limit, json } => {
            let history = backend.tree_history(&tree, &TreeHistoryQuery { path, at, limit: Some(limit) })?;
            if json {
                return output::json(&history);
            }
            println!(
                "{}/{}: {} versions, newest first",
                history.tree,
                history.path.trim_start_matches('/'),
                history.versions.len()
            );
            println!("{:<32} {:>12} {:>5} {:>11}  changed by", "point in time (.rewind/…)", "size", "mode", "owner");
            for version in &history.versions {
                println!(
                    "{:<32} {:>12} {:>5} {:>11}  {} (uid {})",
                    version.at,
                    version.size_bytes,
                    version.mode,
                    format!("{}:{}", version.uid, version.gid),
                    version.client,
                    version.client_uid
                );
            }
            Ok(())
        }
        TreeCommand::View { tree, time, json } => {
            let view = backend.resolve_view(&tree, &time)?;
            if json {
                return output::json(&view);
            }
            output::tree_view(&view);
            Ok(())
        }
        TreeCommand::Mirror { tree, json } => {
            let mirror = backend.tree_mirror(&tree)?;
            if json {
                return output::json(&mirror);
            }
            let mode = if mirror.asynchronous { "asynchronously (--async)" } else { "before answering" };
            println!("{} mirrors {}, recording {mode}", mirror.tree, mirror.upstream);
            println!(
                "forwarded {}, recorded {}, unrecorded {} (brought in step by comparison), compared whole {} times",
                mirror.forwarded, mirror.recorded, mirror.unrecorded, mirror.resyncs
            );
            if !mirror.in_step {
                println!(
                    "out of step: updates go unrecorded until a comparison with the upstream succeeds (is the data \
                     directory's disk full? the server's log says what failed)"
                );
            }
            if let Some(lag) = &mirror.lag {
                let ms = |nanos: u64| nanos as f64 / 1e6;
                println!(
                    "behind: {} updates, {} bytes, {} clients waiting for room, oldest {:.1} ms; lag of {} recorded: \
                     mean {:.2} ms, p99 ≤ {:.2} ms, max {:.2} ms",
                    lag.pending_updates,
                    lag.pending_bytes,
                    lag.waiting_clients,
                    ms(lag.behind_nanos),
                    lag.recorded,
                    ms(lag.mean_nanos),
                    ms(lag.p99_nanos),
                    ms(lag.max_nanos)
                );
            }
            Ok(())
        }
        TreeCommand::Revert { tree, path, to, json } => {
            let summary = backend.revert_tree_path(&tree, &RevertTreePath { path, to })?;
            if json {
                return output::json(&summary);
            }
            println!(
                "reverted {}/{} to {}: {} removed, {} files ({}) and {} directories put back; undo with \
                 `rewind tree revert {} {} --to {}`",
                summary.tree,
                summary.path.trim_start_matches('/'),
                summary.to,
                summary.removed,
                summary.files,
                indicatif::HumanBytes(summary.bytes),
                summary.directories,
                summary.tree,
                if summary.path.is_empty() { "/" } else { &summary.path },
                summary.bookmark
            );
            Ok(())
        }
        TreeCommand::Restore { point, to, progress, json } => {
            let progress = if progress { Progress::Bar } else { Progress::Quiet };
            let summary = tree_restore::restore(backend, &point, &to, progress)?;
            if json {
                return output::json(&summary);
            }
            println!(
                "restored {}@{}/{} to {}: {} files ({}), {} directories, {} symbolic and {} hard links{} in {:.1} s",
                summary.tree,
                summary.at,
                summary.path,
                summary.target,
                summary.files,
                indicatif::HumanBytes(summary.bytes),
                summary.directories,
                summary.symlinks,
                summary.hard_links,
                match summary.special_files_skipped {
                    0 => String::new(),
                    count => format!(" ({count} devices, sockets or FIFOs not made)"),
                },
                summary.seconds
            );
            Ok(())
        }
        TreeCommand::List { json } => {
            let trees: Vec<VolumeInfo> =
                backend.list_volumes()?.into_iter().filter(|volume| volume.kind == "tree").collect();
            if json {
                return output::json(&trees);
            }
            if trees.is_empty() {
                println!("no file trees yet: `rewind tree create NAME`");
            }
            for tree in &trees {
                println!("{}\t{}\tkeeps {}\t{}", tree.name, tree.export, output::kept_history(tree), tree.state);
            }
            Ok(())
        }
    }
}

fn volume(backend: &dyn Backend, command: VolumeCommand) -> Result<()> {
    match command {
        VolumeCommand::Create { name, size, shape, policy, json } => {
            let request = shape.request(name, parse_bytes(&size, "size")?, policy)?;
            let info = backend.create_volume(&request)?;
            if json {
                return output::json(&info);
            }
            let (address, when) = match backend.nbd_address() {
                Some(address) => (address, ""),
                None => ("127.0.0.1:10809".into(), " once `rewind serve` runs"),
            };
            println!(
                "created volume {} ({}, {} layout, {} blocks, keeps {}): nbd://{address}/{}{when}",
                info.name,
                indicatif::HumanBytes(info.size_bytes),
                info.layout,
                indicatif::HumanBytes(u64::from(info.block_size)),
                output::kept_history(&info),
                info.export
            );
            Ok(())
        }
        VolumeCommand::Import { name, file, shape, policy, progress, json } => {
            let request = shape.request(name, 0, policy)?;
            let progress = if progress { Progress::Bar } else { Progress::Quiet };
            let summary = backend.import_volume(&request, &file, progress)?;
            if json {
                return output::json(&summary);
            }
            println!(
                "imported {} as volume {}: {} read, {} stored (zero blocks are not stored)",
                file.display(),
                summary.volume.name,
                indicatif::HumanBytes(summary.bytes_read),
                indicatif::HumanBytes(summary.bytes_written)
            );
            Ok(())
        }
        VolumeCommand::Set { name, granularity, retention, space_max, json } => {
            let policy = Policy { granularity, retention, space_max };
            if policy.is_empty() {
                bail!(
                    "nothing to change: pass --granularity (0 for every write, or a duration like 1m), \
                     --retention (tiers like \"all:6h, 10m:14d\", or forever) and/or --space-max \
                     (a size like 200GiB, or none)"
                );
            }
            let info = backend.update_volume(&name, &policy)?;
            if json {
                return output::json(&info);
            }
            println!("volume {} now keeps {}", info.name, output::kept_history(&info));
            Ok(())
        }
        VolumeCommand::List { json } => {
            let volumes = backend.list_volumes()?;
            if json {
                return output::json(&volumes);
            }
            output::volumes(&volumes);
            Ok(())
        }
        VolumeCommand::Info { name, json } => {
            let detail = backend.volume(&name)?;
            if json {
                return output::json(&detail);
            }
            output::volume_detail(&detail);
            Ok(())
        }
        VolumeCommand::Repair { name, yes, force, json } => {
            let in_use = if force { InUse::Force } else { InUse::Refuse };
            let summary = backend.repair_volume(&name, yes, in_use)?;
            if json {
                return output::json(&summary);
            }
            output::repair(&summary);
            match (summary.repaired, &summary.unrepairable) {
                (true, _) => Ok(()),
                (false, Some(_)) => bail!("volume {name} cannot be repaired"),
                (false, None) => bail!("nothing was changed; run `rewind volume repair {name} --yes` to repair"),
            }
        }
        VolumeCommand::Delete { name, yes, force, with_clones } => {
            let what = if with_clones { "its clones and all of their history" } else { "all of its history" };
            if !yes && !output::confirm(&format!("delete volume {name}, {what}?"))? {
                bail!("not deleted (pass --yes to delete without asking)");
            }
            let in_use = if force { InUse::Force } else { InUse::Refuse };
            backend.delete_volume(&name, in_use, if with_clones { Clones::Delete } else { Clones::Refuse })?;
            println!("deleted volume {name}");
            Ok(())
        }
        VolumeCommand::Clone { source, name, json } => {
            let (source, at) = match source.split_once('@') {
                Some(_) => volume_at(&source).map(|(volume, at)| (volume, Some(at.to_owned())))?,
                None => (source.as_str(), None),
            };
            let request = CreateClone { name, at };
            if group::is_group(backend, source) {
                return group::clone(backend, source, &request, json);
            }
            let info = backend.clone_volume(source, &request)?;
            if json {
                return output::json(&info);
            }
            let address = backend.nbd_address().unwrap_or_else(|| "127.0.0.1:10809".into());
            let base = info.base.as_ref().expect("a clone has a base");
            assert!(!base.copied, "a new clone reads from its base");
            println!(
                "created volume {} ({}, {} layout), a writable clone of {} as of {}: nbd://{address}/{}",
                info.name,
                indicatif::HumanBytes(info.size_bytes),
                info.layout,
                base.volume,
                base.at,
                info.export
            );
            Ok(())
        }
        VolumeCommand::Defrag { point, progress, json } => {
            let (name, at) = volume_at(&point)?;
            let bar = progress.then(|| backend::count_bar("laying out history", "blocks"));
            let summary = with_bar(bar, |progress| backend.defrag_volume(name, at, progress))?;
            if json {
                return output::json(&summary);
            }
            println!(
                "{name} as of {}: {} blocks of archived history in {} chunks, which lay in {} of \
                 neighbouring records; {} chunks laid out in block order ({} written){}{}",
                summary.at,
                summary.blocks_archived,
                summary.chunks,
                match summary.runs_before {
                    1 => "one run".to_owned(),
                    runs => format!("{runs} runs"),
                },
                summary.chunks_moved,
                indicatif::HumanBytes(summary.bytes_written),
                match summary.blocks_skipped {
                    0 => String::new(),
                    skipped => format!("; {skipped} blocks never written passed over"),
                },
                match summary.chunks_damaged {
                    0 => String::new(),
                    damaged => format!("; {damaged} damaged chunks left where they are (see the server log)"),
                }
            );
            Ok(())
        }
        VolumeCommand::Promote { name, progress, json } => {
            let bar = progress.then(|| backend::progress_bar(0, "copying the base"));
            let summary = with_bar(bar, |progress| backend.promote_volume(&name, progress))?;
            if json {
                return output::json(&summary);
            }
            println!(
                "promoted {name}: it has its own copy of {} as of {} ({} copied) and no longer needs {}, \
                 which can be deleted (`rewind volume delete {}`)",
                summary.base.volume,
                summary.base.at,
                indicatif::HumanBytes(summary.bytes_copied),
                summary.base.volume,
                summary.base.volume
            );
            Ok(())
        }
    }
}

fn bookmark(backend: &dyn Backend, args: BookmarkArgs) -> Result<()> {
    let command = match args.command {
        Some(command) => command,
        None => BookmarkCommand::Create {
            volume: args.volume.expect("required by clap"),
            name: args.name.expect("required by clap"),
            at: args.at,
            json: args.json,
        },
    };
    match command {
        BookmarkCommand::Create { volume, name, at, json } => {
            let request = CreateBookmark { name, at };
            if group::is_group(backend, &volume) {
                return group::bookmark(backend, &volume, &request, json);
            }
            let bookmark = backend.create_bookmark(&volume, &request)?;
            if json {
                return output::json(&bookmark);
            }
            println!("bookmarked {volume} at {} as {} (view: export {})", bookmark.at, bookmark.name, bookmark.export);
            Ok(())
        }
        BookmarkCommand::List { volume, json } => {
            if group::is_group(backend, &volume) {
                return group::bookmarks(backend, &volume, json);
            }
            let bookmarks = backend.bookmarks(&volume)?;
            if json {
                return output::json(&bookmarks);
            }
            output::bookmarks(&bookmarks);
            Ok(())
        }
        BookmarkCommand::Delete { volume, name } => {
            if group::is_group(backend, &volume) {
                backend.delete_group_bookmark(&volume, &name)?;
                println!("deleted bookmark {name} of group {volume} and of each of its volumes");
                return Ok(());
            }
            backend.delete_bookmark(&volume, &name)?;
            println!("deleted bookmark {name} of {volume}");
            Ok(())
        }
    }
}

fn token(backend: &dyn Backend, command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Create { read_only, volumes, name, json } => {
            let created = backend.create_token(&TokenSpec { name, read_only, volumes })?;
            if json {
                return output::json(&created);
            }
            println!(
                "created token {} ({}, {}); it is shown this once:\n{}",
                created.info.id,
                created.info.role.as_str(),
                output::token_volumes(&created.info),
                created.token
            );
            Ok(())
        }
        TokenCommand::List { json } => {
            let tokens = backend.tokens()?;
            if json {
                return output::json(&tokens);
            }
            output::tokens(&tokens);
            Ok(())
        }
        TokenCommand::Revoke { id } => {
            let revoked = backend.revoke_token(&id)?;
            println!("revoked token {} ({})", revoked.id, revoked.name);
            Ok(())
        }
    }
}

fn access(backend: &dyn Backend, command: AccessCommand) -> Result<()> {
    match command {
        AccessCommand::Grant { volume, identity, read_only, json } => {
            let access = if read_only { Access::ReadOnly } else { Access::ReadWrite };
            let granted = backend.grant(&GrantInfo { volume, identity, access })?;
            if json {
                return output::json(&granted);
            }
            println!("{} may open volume {} {}", granted.identity, granted.volume, granted.access.as_str());
            Ok(())
        }
        AccessCommand::Revoke { volume, identity } => {
            let revoked = backend.revoke_grant(&volume, &identity)?;
            println!("{} may no longer open volume {}", revoked.identity, revoked.volume);
            Ok(())
        }
        AccessCommand::List { json } => {
            let grants = backend.grants()?;
            if json {
                return output::json(&grants);
            }
            output::grants(&grants);
            Ok(())
        }
    }
}
