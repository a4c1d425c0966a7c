//! `tree-bench`: one NFSv3 client (`nfs3_client`, one request at a time,
//! as `nfs-cp` does) timing, on a file of its own in an export:
//!
//! 1. `fresh-write`: the file written sequentially in 1 MiB UNSTABLE WRITEs,
//!    then COMMIT;
//! 2. `fresh-read`: read back sequentially in 1 MiB READs;
//! 3. `overwrite`: 4 KiB UNSTABLE WRITEs at random aligned offsets (seeded),
//!    then COMMIT;
//! 4. `overwritten-read`: the file read sequentially again.
//!
//! Prints one JSON object: MiB/s of 1, 2 and 4, writes/s of 3, and whether
//! the last read matched what was written (it must).

use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::tokio::TokioConnector;
use nfs3_client::Nfs3ConnectionBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Parser)]
struct Args {
    /// MOUNT and NFS port (the same for Rewind; nfs-ganesha's, given both).
    #[arg(long)]
    nfs_port: u16,
    #[arg(long)]
    mount_port: u16,
    /// The export to mount, e.g. /home.
    #[arg(long)]
    export: String,
    /// The file to make in it (it must not exist).
    #[arg(long)]
    file: String,
    #[arg(long, default_value_t = 256)]
    size_mib: u64,
    #[arg(long, default_value_t = 16)]
    overwrite_mib: u64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

const BIG: usize = 1 << 20;
const SMALL: usize = 4096;

fn check<T, E: std::fmt::Debug>(result: Nfs3Result<T, E>, what: &str) -> Result<T> {
    match result {
        Nfs3Result::Ok(value) => Ok(value),
        Nfs3Result::Err((status, _)) => bail!("{what}: {status:?}"),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let credential = opaque_auth::auth_unix(&auth_unix::default());
    let mut client = Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", &args.export)
        .connect_from_privileged_port(false)
        .mount_port(args.mount_port)
        .nfs3_port(args.nfs_port)
        .credential(credential)
        .mount()
        .await
        .map_err(|error| anyhow::anyhow!("mount {}: {error:?}", args.export))?;
    let root = client.root_nfs_fh3();
    let name = filename3(Opaque::owned(args.file.as_bytes().to_vec()));
    let how = createhow3::GUARDED(sattr3 { mode: Nfs3Option::Some(0o644), ..sattr3::default() });
    let created = client.create(&CREATE3args { where_: diropargs3 { dir: root, name }, how }).await?;
    let Nfs3Option::Some(file) = check(created, "CREATE")?.obj else { bail!("CREATE returned no handle") };
    let size = args.size_mib << 20;
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut contents: Vec<u8> = (0..size).map(|_| rng.random()).collect();

    let started = Instant::now();
    for (index, chunk) in contents.chunks(BIG).enumerate() {
        let write = WRITE3args {
            file: file.clone(),
            offset: (index * BIG) as u64,
            count: chunk.len() as u32,
            stable: stable_how::UNSTABLE,
            data: Opaque::borrowed(chunk),
        };
        check(client.write(&write).await?, "WRITE")?;
    }
    check(client.commit(&COMMIT3args { file: file.clone(), offset: 0, count: 0 }).await?, "COMMIT")?;
    let fresh_write = size as f64 / started.elapsed().as_secs_f64() / (1 << 20) as f64;

    let fresh_read = read_all(&mut client, &file, size, &contents).await.context("the fresh read")?;

    let writes = (args.overwrite_mib << 20) / SMALL as u64;
    let started = Instant::now();
    for _ in 0..writes {
        let offset = rng.random_range(0..size / SMALL as u64) * SMALL as u64;
        let block: Vec<u8> = (0..SMALL).map(|_| rng.random()).collect();
        contents[offset as usize..offset as usize + SMALL].copy_from_slice(&block);
        let write = WRITE3args {
            file: file.clone(),
            offset,
            count: SMALL as u32,
            stable: stable_how::UNSTABLE,
            data: Opaque::borrowed(&block),
        };
        check(client.write(&write).await?, "WRITE")?;
    }
    check(client.commit(&COMMIT3args { file: file.clone(), offset: 0, count: 0 }).await?, "COMMIT")?;
    let overwrite = writes as f64 / started.elapsed().as_secs_f64();

    let overwritten_read = read_all(&mut client, &file, size, &contents).await.context("the read after overwrites")?;
    println!(
        "{}",
        serde_json::json!({
            "fresh_write_mib_s": fresh_write,
            "fresh_read_mib_s": fresh_read,
            "overwrite_writes_s": overwrite,
            "overwritten_read_mib_s": overwritten_read,
            "verified": true,
        })
    );
    Ok(())
}

/// Reads the file sequentially in 1 MiB READs, checks it, returns MiB/s.
async fn read_all<IO>(
    client: &mut nfs3_client::Nfs3Connection<IO>,
    file: &nfs_fh3,
    size: u64,
    expected: &[u8],
) -> Result<f64>
where
    IO: nfs3_client::io::AsyncRead + nfs3_client::io::AsyncWrite + Send,
{
    let started = Instant::now();
    let mut offset = 0u64;
    while offset < size {
        let read = check(client.read(&READ3args { file: file.clone(), offset, count: BIG as u32 }).await?, "READ")?;
        let data = read.data.as_ref();
        ensure!(!data.is_empty(), "READ at {offset} returned nothing");
        ensure!(
            data == &expected[offset as usize..offset as usize + data.len()],
            "READ at {offset} returned other bytes"
        );
        offset += data.len() as u64;
    }
    Ok(size as f64 / started.elapsed().as_secs_f64() / (1 << 20) as f64)
}
