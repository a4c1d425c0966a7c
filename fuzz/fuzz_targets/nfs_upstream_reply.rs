//! The proxy's reading of the upstream's replies: an upstream NFS server is
//! not trusted, so a LOOKUP, CREATE/MKDIR/SYMLINK/MKNOD or READDIRPLUS reply
//! that carries handles — the input after an RPC reply header, or the input
//! as it is — is searched for them (`rewind_nfs::fuzzing::handles_in`) and
//! they are replaced by the proxy's own (`replace`), as `Proxy::map_reply`
//! does.
//!
//! Properties: no panic; memory follows the input; the rewritten reply
//! reads back with the proxy's handles exactly where the upstream's were
//! (optional ones the proxy has none for left out), and with the same
//! attributes and names; a READDIRPLUS listing cut to a client's maxcount
//! (`fit_listing`) fits it and keeps a prefix of the entries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_fuzz::{assert_heap_follows_input, peak_heap_bytes, Cursor};
use rewind_nfs::fuzzing::{fit_listing, handles_in, replace, TooSmall};
use rewind_nfs::HANDLE_BYTES;

/// The procedures whose replies carry handles.
const PROCEDURES: [u32; 6] = [3, 8, 9, 10, 11, 17];

fn accepted_reply(results: &[u8]) -> Vec<u8> {
    let mut reply = Vec::new();
    // xid, REPLY, MSG_ACCEPTED, verifier AUTH_NONE with no body, SUCCESS.
    for word in [0x5eed_u32, 1, 0, 0, 0, 0] {
        reply.extend_from_slice(&word.to_be_bytes());
    }
    reply.extend_from_slice(results);
    reply
}

fuzz_target!(|input: &[u8]| {
    let mut cursor = Cursor::new(input);
    let (mode, procedure) = (cursor.u8(), cursor.u8());
    let procedure = PROCEDURES[usize::from(procedure) % PROCEDURES.len()];
    let reply = match mode & 1 {
        0 => input.to_vec(),
        _ => accepted_reply(cursor.rest()),
    };
    let (found, peak) = peak_heap_bytes(|| handles_in(procedure, &reply));
    // A listing's entry can be 36 bytes (an empty name and handle) and is
    // found as about 120 bytes, in a vector that doubles as it grows.
    assert_heap_follows_input(peak, reply.len(), 8, 1 << 10);
    let Ok(found) = found else { return };
    if procedure != 17 {
        assert!(found.len() <= 1, "one handle at most outside a listing");
    }

    // The proxy's handles: a distinct one for each, none for some of the
    // optional ones (a name the mirror could not take in).
    let ours: Vec<Option<Vec<u8>>> = found
        .iter()
        .enumerate()
        .map(|(index, one)| {
            let left_out = one.optional && (mode >> 1) & 1 == 1 && index % 2 == 1;
            (!left_out).then(|| {
                let mut handle = vec![0xab; HANDLE_BYTES];
                handle[..8].copy_from_slice(&(index as u64).to_be_bytes());
                handle
            })
        })
        .collect();
    // As the proxy holds it: after 4 bytes kept for the record mark.
    let mut framed = vec![0; 4];
    framed.extend_from_slice(&reply);
    let replacements: Vec<_> = found.iter().zip(ours.iter().cloned()).collect();
    replace(&mut framed, 4, &replacements);

    let again = handles_in(procedure, &framed[4..]).expect("a rewritten reply reads back");
    let kept: Vec<_> = found.iter().zip(&ours).filter(|(_, ours)| ours.is_some()).collect();
    assert_eq!(again.len(), kept.len(), "every handle given is found again, and only those");
    for (after, (before, ours)) in again.iter().zip(&kept) {
        assert_eq!(Some(&after.fh), ours.as_ref(), "the proxy's handle in place of the upstream's");
        assert_eq!(after.attributes, before.attributes, "attributes as the upstream gave them");
        assert_eq!(after.dots, before.dots, "the same names");
    }

    // A listing cut to a client's maxcount: as large as the upstream's
    // reply, or smaller by a multiple of 8 bytes the input chooses.
    if procedure != 17 || mode & 1 == 0 {
        return;
    }
    // After the mark, the RPC header (24 bytes) and the status.
    let resok_bytes = |framed: &[u8]| framed.len() - 4 - 24 - 4;
    let maxcount = resok_bytes(&framed).saturating_sub(usize::from(mode >> 2) * 8) as u32;
    let before = framed.clone();
    match fit_listing(&mut framed, 4, maxcount) {
        Err(TooSmall) => {
            assert!(resok_bytes(&framed) > maxcount as usize && framed == before, "only a listing that does not fit")
        }
        Ok(()) if framed == before => {}
        Ok(()) => {
            assert!(resok_bytes(&framed) <= maxcount as usize, "within the client's maxcount");
            let cut = handles_in(procedure, &framed[4..]).expect("a cut listing reads back");
            assert!(cut.len() <= again.len(), "a cut listing keeps a prefix of the entries");
            for (cut, whole) in cut.iter().zip(&again) {
                assert_eq!((&cut.fh, &cut.attributes), (&whole.fh, &whole.attributes));
            }
        }
    }
});
