//! Finding and replacing the upstream's handles in the replies that carry
//! them (LOOKUP, CREATE/MKDIR/SYMLINK/MKNOD, READDIRPLUS), read with the
//! same bounded decoding as calls, and cutting a listing that the proxy's
//! handles made larger than the client asked for.

use std::ops::Range;

use crate::args::NAME_BYTES_MAX;
use crate::proxy::upstream::{self, skip_post_op_attr, upstream_handle, Fattr};
use crate::xdr::{Garbage, XdrReader};

/// One upstream handle in a reply.
pub struct Found {
    /// Its bytes in the reply: the opaque, with the "present" flag before it
    /// when the handle is optional (`post_op_fh3`).
    pub at: Range<usize>,
    pub optional: bool,
    pub fh: Vec<u8>,
    /// "." or ".." of a listing (the latter may lead out of the export).
    pub dots: bool,
    /// The object's attributes, when the reply has them.
    pub attributes: Option<Fattr>,
}

/// The upstream handles in a successful reply to `procedure` (positions
/// within `reply`, a record without its mark); none for a failure.
pub fn handles_in(procedure: u32, reply: &[u8]) -> Result<Vec<Found>, Garbage> {
    let mut reader = upstream::results(reply).map_err(|error| Garbage(error.to_string()))?;
    if reader.u32()? != 0 {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    match procedure {
        3 => {
            let start = reader.position();
            let fh = upstream_handle(&mut reader)?.to_vec();
            let at = start..reader.position();
            let attributes = skip_post_op_attr(&mut reader)?;
            found.push(Found { at, optional: false, fh, dots: false, attributes });
        }
        8..=11 => {
            if let Some(one) = optional_handle(&mut reader)? {
                found.push(Found { attributes: skip_post_op_attr(&mut reader)?, ..one });
            }
        }
        17 => found.extend(read_listing(&mut reader)?.into_iter().filter_map(|entry| entry.handle)),
        _ => unreachable!("procedure {procedure} returns no handles"),
    }
    Ok(found)
}

/// One entry of a READDIRPLUS listing: its handle, and where it ends.
struct ListingEntry {
    handle: Option<Found>,
    end: usize,
}

/// A READDIRPLUS3resok up to its entries' end (not `eof`).
fn read_listing(reader: &mut XdrReader<'_>) -> Result<Vec<ListingEntry>, Garbage> {
    skip_post_op_attr(reader)?;
    reader.fixed::<8>("cookie verifier")?;
    let mut entries = Vec::new();
    while reader.bool()? {
        let _fileid = reader.u64()?;
        let dots = matches!(reader.opaque(NAME_BYTES_MAX, "name")?, b"." | b"..");
        let _cookie = reader.u64()?;
        let attributes = skip_post_op_attr(reader)?;
        let handle = optional_handle(reader)?.map(|one| Found { attributes, dots, ..one });
        entries.push(ListingEntry { handle, end: reader.position() });
    }
    Ok(entries)
}

/// A `post_op_fh3`: `None` when the upstream sent none.
fn optional_handle(reader: &mut XdrReader<'_>) -> Result<Option<Found>, Garbage> {
    let start = reader.position();
    if !reader.bool()? {
        return Ok(None);
    }
    let fh = upstream_handle(reader)?.to_vec();
    Ok(Some(Found { at: start..reader.position(), optional: true, fh, dots: false, attributes: None }))
}

/// Replaces handles in `reply` (from `offset` on): each `Found` by our
/// handle, or, when we have none for an optional one, by "no handle".
pub fn replace(reply: &mut Vec<u8>, offset: usize, replacements: &[(&Found, Option<Vec<u8>>)]) {
    let mut rewritten = Vec::with_capacity(reply.len() + 64 * replacements.len());
    let mut copied = 0;
    for (found, ours) in replacements {
        let at = found.at.start + offset..found.at.end + offset;
        rewritten.extend_from_slice(&reply[copied..at.start]);
        match ours {
            Some(ours) => {
                if found.optional {
                    rewritten.extend_from_slice(&1u32.to_be_bytes());
                }
                rewritten.extend_from_slice(&(ours.len() as u32).to_be_bytes());
                rewritten.extend_from_slice(ours);
                rewritten.resize(rewritten.len().next_multiple_of(4), 0);
            }
            None => {
                assert!(found.optional, "a required handle is always replaced");
                rewritten.extend_from_slice(&0u32.to_be_bytes());
            }
        }
        copied = at.end;
    }
    rewritten.extend_from_slice(&reply[copied..]);
    *reply = rewritten;
}

/// A listing whose first entry alone is larger than the client's `maxcount`.
#[derive(Debug, PartialEq, Eq)]
pub struct TooSmall;

/// Cuts a successful READDIRPLUS reply in `reply` (from `offset` on) to
/// the whole entries that fit the client's `maxcount`, the size of
/// READDIRPLUS3resok with its XDR (RFC 1813 §3.3.17): the proxy's handles
/// are larger than an upstream's short ones (Linux's nfsd gives 20 or 28
/// bytes), so an upstream reply that fit may not fit once rewritten. A cut
/// listing ends with "no more entries" and `eof` false, and the client asks
/// on from the last cookie it got; nothing else in the reply changes. A
/// reply that fits, a failure, or one that does not decode is left as it is.
pub fn fit_listing(reply: &mut Vec<u8>, offset: usize, maxcount: u32) -> Result<(), TooSmall> {
    // The listing is part of the record: a record that fits needs no reading.
    if reply.len() - offset <= maxcount as usize {
        return Ok(());
    }
    let Ok(Some((resok_start, entry_ends))) = listing_layout(&reply[offset..]) else { return Ok(()) };
    let resok_bytes = reply.len() - offset - resok_start;
    if resok_bytes <= maxcount as usize {
        return Ok(());
    }
    // "No more entries" and `eof`, after the entries kept.
    let fits = |end: usize| end - resok_start + 8 <= maxcount as usize;
    let Some(&end) = entry_ends.iter().rev().find(|&&end| fits(end)) else { return Err(TooSmall) };
    reply.truncate(offset + end);
    reply.extend_from_slice(&0u32.to_be_bytes());
    reply.extend_from_slice(&0u32.to_be_bytes());
    Ok(())
}

/// Where a successful READDIRPLUS reply's READDIRPLUS3resok starts (after
/// the status), and where each of its entries ends; `None` for a failure.
fn listing_layout(reply: &[u8]) -> Result<Option<(usize, Vec<usize>)>, Garbage> {
    let mut reader = upstream::results(reply).map_err(|error| Garbage(error.to_string()))?;
    if reader.u32()? != 0 {
        return Ok(None);
    }
    let resok_start = reader.position();
    let entry_ends = read_listing(&mut reader)?.into_iter().map(|entry| entry.end).collect();
    reader.bool()?;
    Ok(Some((resok_start, entry_ends)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An accepted RPC reply to READDIRPLUS listing `names`, each with a
    /// handle of `handle_bytes` and no attributes, then `eof`.
    fn listing(names: &[&str], handle_bytes: usize) -> Vec<u8> {
        let mut words = vec![0x5eed_u32, 1, 0, 0, 0, 0, 0, 0];
        let mut reply: Vec<u8> = words.drain(..).flat_map(u32::to_be_bytes).collect();
        reply.extend_from_slice(b"verifier");
        for (index, name) in names.iter().enumerate() {
            reply.extend_from_slice(&1u32.to_be_bytes());
            reply.extend_from_slice(&(index as u64 + 10).to_be_bytes());
            reply.extend_from_slice(&(name.len() as u32).to_be_bytes());
            reply.extend_from_slice(name.as_bytes());
            reply.resize(reply.len().next_multiple_of(4), 0);
            reply.extend_from_slice(&(index as u64 + 1).to_be_bytes());
            reply.extend_from_slice(&0u32.to_be_bytes());
            reply.extend_from_slice(&1u32.to_be_bytes());
            reply.extend_from_slice(&(handle_bytes as u32).to_be_bytes());
            reply.extend(std::iter::repeat_n(index as u8, handle_bytes));
        }
        reply.extend_from_slice(&0u32.to_be_bytes());
        reply.extend_from_slice(&1u32.to_be_bytes());
        reply
    }

    /// The listing as the proxy passes it on: after a record mark, with
    /// 32-byte handles in place of the upstream's.
    fn rewritten(upstream: &[u8]) -> Vec<u8> {
        let found = handles_in(17, upstream).unwrap();
        let ours: Vec<_> = found.iter().map(|found| (found, Some(vec![0xab; 32]))).collect();
        let mut reply = [&[0; 4][..], upstream].concat();
        replace(&mut reply, 4, &ours);
        reply
    }

    /// The listing's READDIRPLUS3resok: after the mark, the RPC header (24) and the status.
    fn resok_bytes(reply: &[u8]) -> usize {
        reply.len() - 4 - 24 - 4
    }

    fn eof(reply: &[u8]) -> bool {
        reply[reply.len() - 4..] == 1u32.to_be_bytes()
    }

    #[test]
    fn a_listing_grown_by_the_proxys_handles_is_cut_to_the_clients_maxcount() {
        let names = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"];
        let upstream = listing(&names, 20);
        let maxcount = (upstream.len() - 24 - 4) as u32;
        let mut reply = rewritten(&upstream);
        assert!(resok_bytes(&reply) > maxcount as usize, "12 bytes more per entry");
        fit_listing(&mut reply, 4, maxcount).unwrap();
        assert!(resok_bytes(&reply) <= maxcount as usize);
        assert!(!eof(&reply), "the client is to ask on");
        let kept = handles_in(17, &reply[4..]).unwrap();
        assert_eq!(kept.len(), names.len() - 1, "every whole entry that fits");
        assert!(kept.iter().all(|found| found.fh == [0xab; 32]));
        // The same as the listing of the entries kept, but for `eof`.
        let mut expected = rewritten(&listing(&names[..kept.len()], 20));
        let eof_at = expected.len() - 4;
        expected[eof_at..].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(reply, expected);
    }

    #[test]
    fn a_listing_that_fits_a_failure_and_garbage_are_left_as_they_are() {
        let fitting = rewritten(&listing(&["a", "b"], 32));
        let mut reply = fitting.clone();
        fit_listing(&mut reply, 4, resok_bytes(&fitting) as u32).unwrap();
        assert_eq!(reply, fitting);
        // Mark, RPC header, NFS3ERR_STALE.
        let failure: Vec<u8> = [0, 0x5eed_u32, 1, 0, 0, 0, 0, 70].into_iter().flat_map(u32::to_be_bytes).collect();
        let mut reply = failure.clone();
        fit_listing(&mut reply, 4, 0).unwrap();
        assert_eq!(reply, failure);
        let mut garbage = vec![7; 40];
        fit_listing(&mut garbage, 4, 0).unwrap();
        assert_eq!(garbage, vec![7; 40]);
    }

    #[test]
    fn a_first_entry_larger_than_maxcount_is_too_small() {
        let mut reply = rewritten(&listing(&["a"], 20));
        // The attributes flag, the verifier, "no more entries" and eof fit; the entry does not.
        assert_eq!(fit_listing(&mut reply, 4, 4 + 8 + 4 + 4 + 8), Err(TooSmall));
    }
}
