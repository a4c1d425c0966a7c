//! What Rewind's front ends share, so that each protocol (NBD in
//! `rewind-nbd`, NFS in `rewind-nfs`) writes only its own part:
//!
//! - [`listen`]: listeners, one thread per connection, connection limits
//!   (with the protocol's way of telling a refused client why), shutdown;
//! - [`log_limit`]: the log lines a client can cause, budgeted per client;
//! - [`transport`]: TCP and Unix streams as one trait;
//! - the clock ([`now`]) and the `NAME@TIME` grammar of exports
//!   ([`split_point`]); the times themselves are the engine's
//!   (`Volume::parse_time`).

pub mod listen;
pub mod log_limit;
pub mod transport;

use std::time::SystemTime;

use rewind_types::Timestamp;

/// The wall clock, for the times front ends stamp writes and resolve
/// relative times with (the engine takes time as an input).
pub fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// Splits an export name into the object's name and the point in time
/// after `@`, if any: `db@-10m` → (`db`, `-10m`).
pub fn split_point(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((object, time)) => (object, Some(time)),
        None => (name, None),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_split_at_the_first_at_sign() {
        assert_eq!(super::split_point("db"), ("db", None));
        assert_eq!(super::split_point("db@-10m"), ("db", Some("-10m")));
        assert_eq!(super::split_point("db@before@x"), ("db", Some("before@x")));
    }
}
