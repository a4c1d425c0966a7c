//! The NFS server's calls: an RPC record — the input as it is, or a well
//! framed call (NFS or MOUNT, any procedure, AUTH_SYS as root or a user)
//! whose arguments are the input, often after a valid file handle — answered
//! by the real dispatcher over a real tree on the simulated disk.
//!
//! Properties: no panic; every answered call gets a reply with its xid;
//! replies stay within the largest record; memory follows the input, not
//! lengths written in it (the reason calls are decoded by hand).
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rewind_engine::{Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_fuzz::{assert_heap_follows_input, peak_heap_bytes, Cursor};
use rewind_io::{SimConfig, SimStorage};
use rewind_nfs::{Dispatcher, HANDLE_BYTES, RECORD_BYTES_MAX};
use rewind_tree::Trees;

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;

struct World {
    dispatcher: Dispatcher,
    /// The root of the tree `home`, as MOUNT hands it out.
    root: Vec<u8>,
}

fn call(xid: u32, program: u32, procedure: u32, uid: u32, arguments: &[u8]) -> Vec<u8> {
    let mut record = Vec::new();
    let credentials = [0u32, 0, uid, uid, 0];
    for word in [xid, 0, 2, program, 3, procedure, 1, credentials.len() as u32 * 4] {
        record.extend_from_slice(&word.to_be_bytes());
    }
    for word in credentials.into_iter().chain([0, 0]) {
        record.extend_from_slice(&word.to_be_bytes());
    }
    record.extend_from_slice(arguments);
    record
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let storage = SimStorage::new(SimConfig::default(), 1);
        let node = Arc::new(Node::open(Arc::new(storage), NodeConfig::default()).expect("a node"));
        let spec = VolumeSpec::tree(VolumeName::new("home").expect("a name"));
        node.create_volume(spec, Timestamp::from_unix_nanos(1_000_000_000)).expect("a tree");
        let dispatcher = Dispatcher::new(Arc::new(Trees::new(node)), &[]);
        let mut path = 5u32.to_be_bytes().to_vec();
        path.extend_from_slice(b"/home\0\0\0");
        let mut reply = Vec::new();
        assert!(dispatcher.answer(&call(1, MOUNT, 1, 0, &path), [0; 16], 0, &mut reply));
        // Record mark, reply header (24), mountstat3, handle length, handle.
        let root = reply[4 + 24 + 8..4 + 24 + 8 + HANDLE_BYTES].to_vec();
        World { dispatcher, root }
    })
}

fuzz_target!(|input: &[u8]| {
    let world = world();
    let mut cursor = Cursor::new(input);
    let (mode, program, procedure, uid) = (cursor.u8(), cursor.u8(), cursor.u8(), cursor.u8());
    let record = match mode & 1 {
        0 => input.to_vec(),
        _ => {
            let (program, procedures) = if program < 230 { (NFS, 23) } else { (MOUNT, 7) };
            let uid = if uid & 1 == 0 { 0 } else { 1000 };
            let mut arguments = Vec::new();
            if mode & 2 != 0 {
                arguments.extend_from_slice(&(HANDLE_BYTES as u32).to_be_bytes());
                arguments.extend_from_slice(&world.root);
            }
            arguments.extend_from_slice(cursor.rest());
            call(0x5eed, program, u32::from(procedure) % procedures, uid, &arguments)
        }
    };
    let mut reply = Vec::new();
    let (answered, peak) = peak_heap_bytes(|| world.dispatcher.answer(&record, [0; 16], 0, &mut reply));
    // What the server sizes by its own limits: a READ of up to 1 MiB, a
    // listing, and the journal's batch buffers (8 MiB each; a durable change
    // seals one and starts the next, and the written ones are kept, up to
    // 64 MiB, for the archiver, which does not run here).
    assert_heap_follows_input(peak, record.len(), 4, 64 << 20);
    if answered {
        assert!(reply.len() >= 4 + 12 && reply.len() <= 4 + RECORD_BYTES_MAX, "{} reply bytes", reply.len());
        assert_eq!(reply[4..8], record[..4], "the reply carries the call's xid");
        assert_eq!(reply[8..12], 1u32.to_be_bytes(), "a REPLY");
    } else {
        assert!(record.len() < 4, "only a record without an xid goes unanswered");
    }
});
