//! Objects a store holds against deletion (issue 14 req 6): S3 Object Lock
//! on the bucket, so that history inside the lock survives whoever holds
//! the node's credentials — ransomware, an operator's mistake, a rogue
//! `rewind gc`. The store behind the seam (`rewind_s3::lock`) keeps every
//! object it writes locked for the lock's period and extends the hold of
//! every object still wanted before it ends; a delete of a locked object is
//! refused with [`Locked`] and gives the object up (its hold is no longer
//! extended), so it goes at a later delete once its hold has run out.
//!
//! Callers that delete what nothing names (retired packs, old catalogs,
//! unnamed pieces) treat [`Locked`] as "not yet": they keep the object, and
//! whatever it names, until a later try succeeds.

use std::fmt;
use std::io;

/// A delete refused because the object is held until `until_unix_seconds`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locked {
    /// Where the object is, for messages.
    pub object: String,
    pub until_unix_seconds: u64,
}

impl fmt::Display for Locked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is under object lock until Unix time {}", self.object, self.until_unix_seconds)
    }
}

impl std::error::Error for Locked {}

impl Locked {
    pub fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, self)
    }
}

/// The [`Locked`] behind `error`, if the store refused a delete for its lock.
pub fn locked(error: &io::Error) -> Option<&Locked> {
    error.get_ref().and_then(|inner| inner.downcast_ref::<Locked>())
}

/// What a store's hold on its objects is, for `rewind stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// How long every object written or still wanted stays held.
    pub period_seconds: u64,
    /// Objects whose hold is known (and extended while wanted).
    pub held: u64,
    /// Objects a delete gave up, waiting for their hold to run out.
    pub given_up: u64,
    /// Objects whose hold could not be set yet (tried again at each extension).
    pub pending: u64,
    /// Holds set or extended since the node started.
    pub extensions: u64,
    /// The earliest end of a wanted object's hold, Unix seconds.
    pub earliest_end_unix_seconds: Option<u64>,
}

/// A store's hold on its objects; see the module documentation.
pub trait Retention: Send + Sync {
    /// Extends the hold of every object the store keeps and no delete gave
    /// up, where it would end within the period; sets it on those written
    /// whose hold failed. Called on the node's bucket schedule.
    fn extend(&self) -> io::Result<RetentionReport>;
    /// The hold as last known, without asking the store.
    fn report(&self) -> RetentionReport;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_error_is_found_again_behind_io_error() {
        let error = Locked { object: "s3://b/packs/1".into(), until_unix_seconds: 7 }.into_io();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(locked(&error).map(|locked| locked.until_unix_seconds), Some(7));
        assert!(error.to_string().contains("under object lock"), "{error}");
        assert!(locked(&io::Error::new(io::ErrorKind::PermissionDenied, "refused")).is_none());
    }
}
