//! `nfs-mix`: a SPECsfs-like load on an NFSv3 export. Clients (one
//! connection each, one request at a time) issue the NFSv3 operation mix of
//! SPECsfs 3.0 (SFS97_R1) against a working set they make first, with the
//! update operations (WRITE, CREATE, REMOVE, SETATTR, COMMIT) scaled to the
//! share asked for and the rest (LOOKUP, READ, GETATTR, READLINK, ACCESS,
//! READDIRPLUS, READDIR, FSSTAT) scaled to what is left, each keeping its
//! weight within its group, as the UCDP paper's runs at 12–96% updates did.
//!
//! Prints one JSON object: operations, operations per second, mean and p99
//! latency, the share of updates actually issued, and the bytes written
//! (working sets included).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::tokio::TokioConnector;
use nfs3_client::{Nfs3Connection, Nfs3ConnectionBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Connection = Nfs3Connection<nfs3_client::tokio::TokioIo<tokio::net::TcpStream>>;

#[derive(Parser, Clone)]
struct Args {
    #[arg(long)]
    nfs_port: u16,
    #[arg(long)]
    mount_port: u16,
    #[arg(long)]
    export: String,
    /// The directory to make the working set in (it must not exist).
    #[arg(long)]
    dir: String,
    /// Percent of operations that are updates.
    #[arg(long)]
    updates: u32,
    #[arg(long, default_value_t = 4)]
    clients: usize,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Files in the working set, per client (in 4 directories, 128 KiB each).
    #[arg(long, default_value_t = 64)]
    files: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

const FILE_BYTES: u64 = 128 << 10;
const IO_BYTES: usize = 8 << 10;
const DIRECTORIES: usize = 4;

/// The NFSv3 mix of SPECsfs 3.0, in percent.
#[derive(Clone, Copy, Debug)]
enum Op {
    Getattr,
    Lookup,
    Readlink,
    Read,
    Readdir,
    Readdirplus,
    Access,
    Fsstat,
    Write,
    Create,
    Remove,
    Setattr,
    Commit,
}

const READS: [(Op, f64); 8] = [
    (Op::Lookup, 27.0),
    (Op::Read, 18.0),
    (Op::Getattr, 11.0),
    (Op::Readdirplus, 9.0),
    (Op::Readlink, 7.0),
    (Op::Access, 7.0),
    (Op::Readdir, 2.0),
    (Op::Fsstat, 1.0),
];
const UPDATES: [(Op, f64); 5] =
    [(Op::Write, 9.0), (Op::Commit, 5.0), (Op::Create, 1.0), (Op::Remove, 1.0), (Op::Setattr, 1.0)];

fn is_update(op: Op) -> bool {
    UPDATES.iter().any(|(update, _)| std::mem::discriminant(update) == std::mem::discriminant(&op))
}

/// Cumulative weights of every operation for an update share.
fn mix(updates_percent: u32) -> Vec<(Op, f64)> {
    let share = f64::from(updates_percent) / 100.0;
    let (reads, updates): (f64, f64) = (READS.iter().map(|(_, w)| w).sum(), UPDATES.iter().map(|(_, w)| w).sum());
    let mut total = 0.0;
    let scaled = READS.iter().map(|&(op, w)| (op, w / reads * (1.0 - share)));
    let scaled = scaled.chain(UPDATES.iter().map(|&(op, w)| (op, w / updates * share)));
    scaled
        .map(|(op, weight)| {
            total += weight;
            (op, total)
        })
        .collect()
}

fn check<T, E: std::fmt::Debug>(result: Nfs3Result<T, E>, what: &str) -> Result<T> {
    match result {
        Nfs3Result::Ok(value) => Ok(value),
        Nfs3Result::Err((status, _)) => bail!("{what}: {status:?}"),
    }
}

/// A reply that only has to be a success.
fn ok<T, E: std::fmt::Debug>(result: Nfs3Result<T, E>, what: &str) -> Result<()> {
    check(result, what).map(|_| ())
}

fn name(text: &str) -> filename3<'static> {
    filename3(Opaque::owned(text.as_bytes().to_vec()))
}

async fn connect(args: &Args) -> Result<Connection> {
    let credential = opaque_auth::auth_unix(&auth_unix::default());
    Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", &args.export)
        .connect_from_privileged_port(false)
        .mount_port(args.mount_port)
        .nfs3_port(args.nfs_port)
        .credential(credential)
        .mount()
        .await
        .map_err(|error| anyhow::anyhow!("mount {}: {error:?}", args.export))
}

async fn make(client: &mut Connection, dir: &nfs_fh3, text: &str) -> Result<nfs_fh3> {
    let how = createhow3::GUARDED(sattr3 { mode: Nfs3Option::Some(0o644), ..sattr3::default() });
    let created =
        client.create(&CREATE3args { where_: diropargs3 { dir: dir.clone(), name: name(text) }, how }).await?;
    match check(created, "CREATE")?.obj {
        Nfs3Option::Some(handle) => Ok(handle),
        Nfs3Option::None => bail!("CREATE returned no handle"),
    }
}

async fn write(client: &mut Connection, file: &nfs_fh3, offset: u64, data: &[u8], stable: stable_how) -> Result<()> {
    let args =
        WRITE3args { file: file.clone(), offset, count: data.len() as u32, stable, data: Opaque::borrowed(data) };
    check(client.write(&args).await?, "WRITE")?;
    Ok(())
}

/// One client's working set.
struct WorkingSet {
    dirs: Vec<nfs_fh3>,
    /// (directory index, name, handle).
    files: Vec<(usize, String, nfs_fh3)>,
    links: Vec<nfs_fh3>,
    /// Files this client made during the run, to remove.
    made: Vec<(usize, String)>,
}

async fn working_set(
    client: &mut Connection,
    top: &nfs_fh3,
    index: usize,
    args: &Args,
    rng: &mut StdRng,
) -> Result<WorkingSet> {
    let made = client
        .mkdir(&MKDIR3args {
            where_: diropargs3 { dir: top.clone(), name: name(&format!("client{index}")) },
            attributes: sattr3::default(),
        })
        .await?;
    let Nfs3Option::Some(home) = check(made, "MKDIR")?.obj else { bail!("MKDIR returned no handle") };
    let mut set = WorkingSet { dirs: Vec::new(), files: Vec::new(), links: Vec::new(), made: Vec::new() };
    for dir in 0..DIRECTORIES {
        let made = client
            .mkdir(&MKDIR3args {
                where_: diropargs3 { dir: home.clone(), name: name(&format!("d{dir}")) },
                attributes: sattr3::default(),
            })
            .await?;
        let Nfs3Option::Some(handle) = check(made, "MKDIR")?.obj else { bail!("MKDIR returned no handle") };
        set.dirs.push(handle);
    }
    let data: Vec<u8> = (0..FILE_BYTES).map(|_| rng.random()).collect();
    for file in 0..args.files {
        let dir = file % DIRECTORIES;
        let text = format!("f{file}");
        let handle = make(client, &set.dirs[dir], &text).await?;
        for (piece, chunk) in data.chunks(32 << 10).enumerate() {
            write(client, &handle, piece as u64 * (32 << 10), chunk, stable_how::UNSTABLE).await?;
        }
        check(client.commit(&COMMIT3args { file: handle.clone(), offset: 0, count: 0 }).await?, "COMMIT")?;
        set.files.push((dir, text, handle));
        if file % 8 == 0 {
            let symlink = SYMLINK3args {
                where_: diropargs3 { dir: set.dirs[dir].clone(), name: name(&format!("l{file}")) },
                symlink: symlinkdata3 {
                    symlink_attributes: sattr3::default(),
                    symlink_data: nfspath3(Opaque::owned(format!("f{file}").into_bytes())),
                },
            };
            let Nfs3Option::Some(link) = check(client.symlink(&symlink).await?, "SYMLINK")?.obj else {
                bail!("SYMLINK returned no handle")
            };
            set.links.push(link);
        }
    }
    Ok(set)
}

/// Runs the mix until `deadline`: latencies in microseconds, each with its
/// operation, how many were updates, and the bytes written.
async fn run(
    client: &mut Connection,
    set: &mut WorkingSet,
    mix: &[(Op, f64)],
    deadline: Instant,
    index: usize,
    rng: &mut StdRng,
) -> Result<(Vec<(Op, u32)>, u64, u64)> {
    let (mut latencies, mut updates, mut made, mut written) = (Vec::new(), 0, 0u64, 0u64);
    let data = vec![0x5a_u8; IO_BYTES];
    let total = mix.last().expect("a mix").1;
    while Instant::now() < deadline {
        let pick = rng.random::<f64>() * total;
        let op = mix.iter().find(|(_, upto)| pick < *upto).map_or(mix[0].0, |(op, _)| *op);
        let (dir, ref file_name, ref file) = set.files[rng.random_range(0..set.files.len())];
        let offset = rng.random_range(0..FILE_BYTES / IO_BYTES as u64) * IO_BYTES as u64;
        let started = Instant::now();
        match op {
            Op::Getattr => ok(client.getattr(&GETATTR3args { object: file.clone() }).await?, "GETATTR")?,
            Op::Lookup => {
                let what = diropargs3 { dir: set.dirs[dir].clone(), name: name(file_name) };
                ok(client.lookup(&LOOKUP3args { what }).await?, "LOOKUP")?
            }
            Op::Readlink => {
                let link = set.links[rng.random_range(0..set.links.len())].clone();
                ok(client.readlink(&READLINK3args { symlink: link }).await?, "READLINK")?
            }
            Op::Read => {
                let read = READ3args { file: file.clone(), offset, count: IO_BYTES as u32 };
                ok(client.read(&read).await?, "READ")?
            }
            Op::Readdir => {
                let args = READDIR3args {
                    dir: set.dirs[dir].clone(),
                    cookie: 0,
                    cookieverf: cookieverf3::default(),
                    count: 4096,
                };
                ok(client.readdir(&args).await?, "READDIR")?
            }
            Op::Readdirplus => {
                let args = READDIRPLUS3args {
                    dir: set.dirs[dir].clone(),
                    cookie: 0,
                    cookieverf: cookieverf3::default(),
                    dircount: 1024,
                    maxcount: 4096,
                };
                ok(client.readdirplus(&args).await?, "READDIRPLUS")?
            }
            Op::Access => {
                let args = ACCESS3args { object: file.clone(), access: ACCESS3_READ | ACCESS3_MODIFY };
                ok(client.access(&args).await?, "ACCESS")?
            }
            Op::Fsstat => ok(client.fsstat(&FSSTAT3args { fsroot: set.dirs[0].clone() }).await?, "FSSTAT")?,
            Op::Write => {
                write(client, file, offset, &data, stable_how::UNSTABLE).await?;
                written += IO_BYTES as u64;
            }
            Op::Commit => ok(client.commit(&COMMIT3args { file: file.clone(), offset: 0, count: 0 }).await?, "COMMIT")?,
            Op::Setattr => {
                let mode = if rng.random::<bool>() { 0o644 } else { 0o640 };
                let args = SETATTR3args {
                    object: file.clone(),
                    new_attributes: sattr3 { mode: Nfs3Option::Some(mode), ..sattr3::default() },
                    guard: sattrguard3::default(),
                };
                ok(client.setattr(&args).await?, "SETATTR")?
            }
            Op::Create | Op::Remove => match (op, set.made.pop()) {
                (Op::Remove, Some((dir, text))) => {
                    let object = diropargs3 { dir: set.dirs[dir].clone(), name: name(&text) };
                    ok(client.remove(&REMOVE3args { object }).await?, "REMOVE")?
                }
                (_, popped) => {
                    set.made.extend(popped);
                    let dir = rng.random_range(0..DIRECTORIES);
                    let text = format!("new{index}-{made}");
                    made += 1;
                    let handle = make(client, &set.dirs[dir], &text).await?;
                    write(client, &handle, 0, &data, stable_how::UNSTABLE).await?;
                    written += IO_BYTES as u64;
                    set.made.push((dir, text));
                }
            },
        }
        latencies.push((op, started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32));
        updates += u64::from(is_update(op));
    }
    Ok((latencies, updates, written))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.updates <= 100, "--updates is a percentage");
    let mut setup = connect(&args).await?;
    let top = setup.root_nfs_fh3();
    let made = setup
        .mkdir(&MKDIR3args { where_: diropargs3 { dir: top, name: name(&args.dir) }, attributes: sattr3::default() })
        .await?;
    let Nfs3Option::Some(base) = check(made, "MKDIR")?.obj else { bail!("MKDIR returned no handle") };
    let mut clients = Vec::new();
    for index in 0..args.clients {
        let mut rng = StdRng::seed_from_u64(args.seed + index as u64);
        let mut client = connect(&args).await?;
        let set = working_set(&mut client, &base, index, &args, &mut rng).await?;
        clients.push((client, set, rng));
    }
    let mix = mix(args.updates);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(index, (mut client, mut set, mut rng))| {
            let mix = mix.clone();
            tokio::spawn(async move { run(&mut client, &mut set, &mix, deadline, index, &mut rng).await })
        })
        .collect();
    let (mut latencies, mut updates) = (Vec::new(), 0);
    // The working sets, then what the run wrote.
    let mut written = (args.clients * args.files) as u64 * FILE_BYTES;
    for task in tasks {
        let (mine, mine_updates, mine_written) = task.await??;
        latencies.extend(mine);
        updates += mine_updates;
        written += mine_written;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Which operations take the time: count and mean latency of each.
    let mut by_op = std::collections::BTreeMap::<String, (u64, f64)>::new();
    for (op, micros) in &latencies {
        let entry = by_op.entry(format!("{op:?}")).or_default();
        *entry = (entry.0 + 1, entry.1 + f64::from(*micros));
    }
    let by_op: serde_json::Map<String, serde_json::Value> = by_op
        .into_iter()
        .map(|(op, (count, sum))| (op, serde_json::json!({ "count": count, "mean_us": sum / count as f64 })))
        .collect();
    let mut latencies: Vec<u32> = latencies.into_iter().map(|(_, micros)| micros).collect();
    latencies.sort_unstable();
    let ops = latencies.len();
    anyhow::ensure!(ops > 0, "no operation finished in {seconds} s");
    let mean = latencies.iter().map(|&micros| f64::from(micros)).sum::<f64>() / ops as f64;
    let p99 = latencies[(ops * 99 / 100).min(ops - 1)];
    println!(
        "{}",
        serde_json::json!({
            "ops": ops,
            "seconds": seconds,
            "ops_per_s": ops as f64 / seconds,
            "mean_us": mean,
            "p99_us": p99,
            "updates_share": updates as f64 / ops as f64,
            "bytes_written": written,
            "by_operation": by_op,
        })
    );
    Ok(())
}
