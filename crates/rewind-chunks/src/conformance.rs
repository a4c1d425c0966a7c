//! The conformance suite every [`PackStore`] passes (see `pack_store`):
//! the local directory and the chunk store's fault wrapper in this crate's
//! tests, S3 against a real MinIO in `rewind-s3`'s. Each check panics with
//! what the store did wrong.
//!
//! The suite uses pack numbers from `first` on and leaves none behind, so
//! one bucket or directory can hold several runs.

use std::io;

use rewind_io::{OpenMode, Storage};

use crate::pack_store::{Fault, FaultyPackStore, PackStore};

/// `length` bytes that neither compress nor repeat, different for every
/// `seed` (xorshift): test data for packs, chunks and volumes.
pub fn noise(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Bytes of pack `pack`, `length` long, distinct per `(pack, salt)`.
fn contents(pack: u64, salt: u8, length: usize) -> Vec<u8> {
    noise(pack.wrapping_mul(256) ^ u64::from(salt), length)
}

fn put(store: &dyn PackStore, pack: u64, bytes: &[u8], piece: usize) -> io::Result<crate::pack_store::Generation> {
    let mut upload = store.create(pack)?;
    for part in bytes.chunks(piece.max(1)) {
        upload.append(part)?;
    }
    assert_eq!(upload.len(), bytes.len() as u64, "an upload counts what was appended");
    upload.finish()
}

/// [`PackStore::read_vectored`] into slices of `lengths`, joined.
fn read_scattered(store: &dyn PackStore, pack: u64, offset: u64, lengths: &[usize]) -> io::Result<Vec<u8>> {
    let mut buffers: Vec<Vec<u8>> = lengths.iter().map(|&length| vec![0xee; length]).collect();
    let mut slices: Vec<io::IoSliceMut<'_>> = buffers.iter_mut().map(|buf| io::IoSliceMut::new(buf)).collect();
    store.read_vectored(pack, offset, &mut slices)?;
    Ok(buffers.concat())
}

fn read(store: &dyn PackStore, pack: u64, offset: u64, length: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; length];
    store.read(pack, offset, &mut buf)?;
    Ok(buf)
}

fn kind<T: std::fmt::Debug>(result: io::Result<T>) -> io::ErrorKind {
    result.expect_err("the call fails").kind()
}

fn listed(store: &dyn PackStore, first: u64) -> Vec<u64> {
    let packs = store.list().expect("list");
    assert!(packs.windows(2).all(|pair| pair[0].pack < pair[1].pack), "listed in number order: {packs:?}");
    packs.iter().map(|stored| stored.pack).filter(|&pack| pack >= first).collect()
}

/// [`PackStore::adopt`]: a sealed file of `storage` (written here, in `dir`)
/// taken whole as pack `first`, read back, refused under a taken number,
/// and deleted without touching the file's own name. `links`: the store
/// keeps its packs as files of `storage` and takes the file by a second
/// name rather than a copy.
pub fn check_adopt(store: &dyn PackStore, storage: &dyn Storage, dir: &str, first: u64, links: bool) {
    assert!(listed(store, first).is_empty(), "the suite starts from no packs at or after {first}");
    storage.create_dir_all(dir).unwrap();
    let path = format!("{dir}/adopted-{first}");
    let bytes = contents(first, 9, (3 << 20) + 1_234);
    let file = storage.open_file(&path, OpenMode::CreateNew).unwrap();
    file.write_all_at(&bytes, 0).unwrap();
    file.sync_data().unwrap();
    storage.sync_dir(dir).unwrap();
    let generation = store.adopt(first, &path, &*file).expect("adopt the file");
    let stat = store.stat(first).expect("stat the adopted pack");
    assert_eq!((stat.bytes, &stat.generation), (bytes.len() as u64, &generation));
    assert_eq!(read(store, first, 0, bytes.len()).unwrap(), bytes, "the whole file");
    assert_eq!(read(store, first, 1 << 20, 5_000).unwrap(), bytes[1 << 20..(1 << 20) + 5_000], "a range");
    assert_eq!(listed(store, first), vec![first]);
    assert_eq!(storage.link_count(&path).unwrap(), if links { 2 } else { 1 }, "a second name, or a copy");
    assert_eq!(kind(store.adopt(first, &path, &*file)), io::ErrorKind::AlreadyExists, "a taken number");
    assert_eq!(read(store, first, 0, bytes.len()).unwrap(), bytes, "the refused adoption changed nothing");
    store.delete(first).expect("delete the adopted pack");
    assert_eq!(listed(store, first), Vec::<u64>::new());
    let mut left = vec![0; bytes.len()];
    file.read_exact_at(&mut left, 0).unwrap();
    assert_eq!(left, bytes, "the file keeps its bytes under its own name");
    assert_eq!(storage.link_count(&path).unwrap(), 1);
    storage.remove_file(&path).unwrap();
}

/// The contract every store keeps; `large` (at least 64 bytes) is the size
/// of the one large pack.
pub fn check_store(store: &dyn PackStore, first: u64, large: usize) {
    assert!(listed(store, first).is_empty(), "the suite starts from no packs at or after {first}");
    let (a, b, c) = (first, first + 1, first + 2);

    // Written in pieces, read back by ranges, listed with its size and
    // the generation the finish gave.
    let bytes_a = contents(a, 0, 100_000);
    let generation_a = put(store, a, &bytes_a, 7_000).expect("put pack a");
    let stat = store.stat(a).expect("stat pack a");
    assert_eq!((stat.pack, stat.bytes, &stat.generation), (a, 100_000, &generation_a));
    assert_eq!(read(store, a, 0, 100_000).unwrap(), bytes_a, "the whole pack");
    assert_eq!(read(store, a, 4_321, 10_000).unwrap(), bytes_a[4_321..14_321], "a range inside");
    assert_eq!(read(store, a, 99_990, 10).unwrap(), bytes_a[99_990..], "the last bytes");
    assert_eq!(read(store, a, 50, 0).unwrap(), Vec::<u8>::new(), "an empty range");
    assert_eq!(kind(read(store, a, 99_990, 11)), io::ErrorKind::UnexpectedEof, "a range past the end");
    assert_eq!(kind(read(store, a, 200_000, 1)), io::ErrorKind::UnexpectedEof, "a range after the end");
    assert_eq!(kind(read(store, b, 0, 1)), io::ErrorKind::NotFound, "a missing pack");
    // Scattered: slices in turn, empty ones among them.
    let lengths = [56, 0, 4_096, 7, 4_096, 0];
    assert_eq!(read_scattered(store, a, 1_000, &lengths).unwrap(), bytes_a[1_000..9_255], "a scatter read");
    assert_eq!(kind(read_scattered(store, a, 99_000, &[500, 501])), io::ErrorKind::UnexpectedEof, "past the end");
    assert_eq!(kind(read_scattered(store, b, 0, &[1])), io::ErrorKind::NotFound, "a missing pack, scattered");
    assert_eq!(kind(store.stat(b)), io::ErrorKind::NotFound, "a missing pack's stat");

    // Nothing is visible before the finish; an abort leaves nothing; a
    // dropped upload leaves nothing either.
    let mut upload = store.create(b).expect("create pack b");
    upload.append(&contents(b, 0, 5_000)).unwrap();
    assert_eq!(listed(store, first), vec![a], "an unfinished pack is not listed");
    assert_eq!(kind(store.stat(b)), io::ErrorKind::NotFound, "an unfinished pack has no stat");
    upload.abort().expect("abort");
    assert_eq!(listed(store, first), vec![a]);
    let mut dropped = store.create(b).expect("create pack b again");
    dropped.append(&contents(b, 1, 5_000)).unwrap();
    drop(dropped);
    assert_eq!(listed(store, first), vec![a], "a dropped upload is not listed");

    // Written once: a second pack under a taken number is refused and the
    // first is unchanged.
    let generation_b = put(store, b, &contents(b, 2, 3_000), 3_000).expect("put pack b after the abort");
    assert_eq!(kind(put(store, a, &contents(a, 1, 100_000), 50_000)), io::ErrorKind::AlreadyExists);
    assert_eq!(read(store, a, 0, 100_000).unwrap(), bytes_a, "the refused write changed nothing");
    assert_eq!(store.stat(a).unwrap().generation, generation_a);

    // A large pack, in 1 MiB appends.
    let bytes_c = contents(c, 0, large);
    put(store, c, &bytes_c, 1 << 20).expect("put the large pack");
    assert_eq!(store.stat(c).unwrap().bytes, large as u64);
    let (middle, span) = (large / 2 - 3, (large / 4).min(1 << 20));
    assert_eq!(read(store, c, middle as u64, span).unwrap(), bytes_c[middle..middle + span]);
    assert_eq!(listed(store, first), vec![a, b, c]);

    // Deleted, deleted again, and written anew under the same number with
    // other contents: another generation.
    store.delete(b).expect("delete pack b");
    store.delete(b).expect("deleting a deleted pack is not an error");
    assert_eq!(kind(store.stat(b)), io::ErrorKind::NotFound);
    assert_eq!(listed(store, first), vec![a, c]);
    let generation_b2 = put(store, b, &contents(b, 3, 3_000), 1_000).expect("put pack b anew");
    assert_ne!(generation_b2, generation_b, "other contents, another generation");
    assert_eq!(store.stat(b).unwrap().generation, generation_b2);

    for pack in [a, b, c] {
        store.delete(pack).expect("clean up");
    }
    assert!(listed(store, first).is_empty(), "the suite leaves no packs behind");
}

/// Faults injected around a store stay errors of the calls they hit: an
/// unreachable store fails every call with a transient error and works
/// again once it answers; flipped bits reach the reader (whose checksums
/// must catch them); a finish whose reply is lost left the pack there.
pub fn check_faults(faulty: &FaultyPackStore, first: u64) {
    let store: &dyn PackStore = faulty;
    let bytes = contents(first, 0, 20_000);
    put(store, first, &bytes, 4_096).expect("put with no fault");

    faulty.set(Some(Fault::Unreachable));
    let errors = [
        store.create(first + 1).map(|_| ()).expect_err("create"),
        store.read(first, 0, &mut [0; 16]).expect_err("read"),
        store.stat(first).map(|_| ()).expect_err("stat"),
        store.list().map(|_| ()).expect_err("list"),
        store.delete(first).expect_err("delete"),
    ];
    for error in &errors {
        assert!(rewind_io::is_transient(error), "an unreachable store's errors are transient: {error}");
    }
    faulty.set(None);
    assert_eq!(read(store, first, 0, 20_000).unwrap(), bytes, "the store answers again, unchanged");

    // Unreachable part-way through an upload: nothing is left.
    let mut upload = store.create(first + 1).unwrap();
    upload.append(&bytes[..1_000]).unwrap();
    faulty.set(Some(Fault::Unreachable));
    assert!(rewind_io::is_transient(&upload.append(&bytes[1_000..]).expect_err("append")));
    faulty.set(None);
    drop(upload);
    assert_eq!(listed(store, first), vec![first]);

    faulty.set(Some(Fault::FlipBit));
    let flipped = read(store, first, 0, 20_000).unwrap();
    faulty.set(None);
    assert_ne!(flipped, bytes, "the flipped bit reaches the reader");
    assert_eq!(flipped.iter().zip(&bytes).filter(|(x, y)| x != y).count(), 1, "one byte differs");

    faulty.set(Some(Fault::LoseFinishReply));
    let lost = put(store, first + 2, &bytes, 8_192).expect_err("the finish's reply is lost");
    faulty.set(None);
    assert!(rewind_io::is_transient(&lost), "a lost reply is transient: {lost}");
    assert_eq!(store.stat(first + 2).expect("the pack is there all the same").bytes, 20_000);
    assert_eq!(kind(put(store, first + 2, &bytes, 8_192)), io::ErrorKind::AlreadyExists, "a retry finds it there");

    assert_eq!(faulty.injected(), 8, "every fault was injected, and only those");
    for pack in [first, first + 2] {
        store.delete(pack).unwrap();
    }
    assert!(listed(store, first).is_empty());
}
