//! Finding and replacing the upstream's handles in the replies that carry
//! them (LOOKUP, CREATE/MKDIR/SYMLINK/MKNOD, READDIRPLUS), read with the
//! same bounded decoding as calls.

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
        17 => {
            skip_post_op_attr(&mut reader)?;
            reader.fixed::<8>("cookie verifier")?;
            while reader.bool()? {
                let _fileid = reader.u64()?;
                let dots = matches!(reader.opaque(NAME_BYTES_MAX, "name")?, b"." | b"..");
                let _cookie = reader.u64()?;
                let attributes = skip_post_op_attr(&mut reader)?;
                if let Some(one) = optional_handle(&mut reader)? {
                    found.push(Found { attributes, dots, ..one });
                }
            }
        }
        _ => unreachable!("procedure {procedure} returns no handles"),
    }
    Ok(found)
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
