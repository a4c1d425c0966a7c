//! Reading the times operators type: RFC 3339, Unix time, relative times and
//! bookmark names. The current time and the local time zone are inputs; the
//! engine reads no clock.

use std::fmt;
use std::str::FromStr;

use jiff::civil::{DateTime, Time};
use jiff::tz::TimeZone;
use rewind_format::meta::{RetentionTier, VolumePolicy};
use rewind_types::{BookmarkName, Timestamp};

/// What a time expression names, before bookmarks are looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PointInTime {
    At(Timestamp),
    Bookmark(BookmarkName),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot read {input:?} as a point in time: {reason}. Use RFC 3339 (2026-11-22T10:03:12Z), \
     a local date and time (2026-11-22 10:03:12) or time of day today (10:03:12), Unix seconds \
     (1763805792) or nanoseconds (1763805792000000000), a relative time (-10m, \"10 minutes ago\"), \
     or a bookmark name"
)]
pub struct TimeSpecError {
    pub input: String,
    pub reason: String,
}

/// The present, as a point in time.
pub(crate) const NOW: &str = "now";

/// Parses `input` relative to `now`, reading times without an offset in `zone`.
pub fn parse_point_in_time(input: &str, now: Timestamp, zone: &TimeZone) -> Result<PointInTime, TimeSpecError> {
    let error = |reason: &str| TimeSpecError { input: input.to_owned(), reason: reason.to_owned() };
    let text = input.trim();
    if text.is_empty() {
        return Err(error("it is empty"));
    }
    if text == NOW {
        return Ok(PointInTime::At(now));
    }
    if let Some(digits) =
        text.strip_prefix('@').or(Some(text)).filter(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
    {
        return unix_time(digits).map(PointInTime::At).map_err(|reason| error(&reason));
    }
    if let Some(ago) = relative(text) {
        let nanos = ago.map_err(|reason| error(&reason))?;
        return Ok(PointInTime::At(now.saturating_sub_nanos(nanos)));
    }
    if let Ok(timestamp) = jiff::Timestamp::from_str(text) {
        return to_timestamp(timestamp).map(PointInTime::At).map_err(|reason| error(&reason));
    }
    if let Ok(civil) = DateTime::from_str(text) {
        let zoned = civil.to_zoned(zone.clone()).map_err(|e| error(&e.to_string()))?;
        return to_timestamp(zoned.timestamp()).map(PointInTime::At).map_err(|reason| error(&reason));
    }
    if let Ok(time) = Time::from_str(text) {
        let today = to_jiff(now).to_zoned(zone.clone()).date();
        let zoned = today.to_datetime(time).to_zoned(zone.clone()).map_err(|e| error(&e.to_string()))?;
        return to_timestamp(zoned.timestamp()).map(PointInTime::At).map_err(|reason| error(&reason));
    }
    if text.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(error("it looks like a date or time but is not one this reads"));
    }
    BookmarkName::new(text).map(PointInTime::Bookmark).map_err(|invalid| error(invalid.reason))
}

/// A protection granularity: `0` or `ew` (every write, the IBM paper's
/// term), or a duration such as `1s`, `5m`, `1h30m`. In nanoseconds.
pub fn parse_granularity(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text == "0" || text == "ew" {
        return Ok(0);
    }
    let duration = humantime::parse_duration(text).map_err(|error| {
        format!("bad granularity {text:?}: {error}; use 0 or ew (every write) or a duration like 1s, 5m, 1h")
    })?;
    u64::try_from(duration.as_nanos()).map_err(|_| format!("granularity {text:?} is too long"))
}

/// A granularity for people: `every write`, or `5m`.
pub fn display_granularity(nanos: u64) -> String {
    if nanos == 0 {
        "every write".to_owned()
    } else {
        humantime::format_duration(std::time::Duration::from_nanos(nanos)).to_string()
    }
}

/// A retention policy: tiers `interval:age`, youngest first, separated by
/// commas — `all:2h, 1m:24h, 1h:7d, 1d:30d` keeps every write for 2 hours,
/// then one version per block per minute until a day old, and so on; history
/// older than the last age is dropped (its state then is the oldest kept).
/// `forever` (or nothing) keeps all history.
pub fn parse_retention(text: &str) -> Result<Vec<RetentionTier>, String> {
    let text = text.trim();
    if text.is_empty() || text == "forever" {
        return Ok(Vec::new());
    }
    let duration = |part: &str, what: &str| {
        let nanos = humantime::parse_duration(part.trim())
            .map_err(|error| format!("bad {what} {part:?} in retention {text:?}: {error}"))?
            .as_nanos();
        u64::try_from(nanos).map_err(|_| format!("{what} {part:?} is too long"))
    };
    let tiers = text.split(',').map(|tier| {
        let (interval, age) = tier.split_once(':').ok_or_else(|| {
            format!("bad retention tier {:?}: write interval:age, like all:2h or 1m:24h", tier.trim())
        })?;
        let interval_nanos = if interval.trim() == "all" { 0 } else { duration(interval, "interval")? };
        Ok(RetentionTier { interval_nanos, age_nanos: duration(age, "age")? })
    });
    let tiers = tiers.collect::<Result<Vec<_>, String>>()?;
    if tiers.len() > VolumePolicy::TIERS_MAX {
        return Err(format!("{} retention tiers; at most {} are allowed", tiers.len(), VolumePolicy::TIERS_MAX));
    }
    Ok(tiers)
}

/// Retention for people: `all:2h, 1m:24h`, or `forever`.
pub fn display_retention(tiers: &[RetentionTier]) -> String {
    if tiers.is_empty() {
        return "forever".to_owned();
    }
    let duration = |nanos| humantime::format_duration(std::time::Duration::from_nanos(nanos)).to_string();
    let tier = |tier: &RetentionTier| {
        let interval = if tier.interval_nanos == 0 { "all".to_owned() } else { duration(tier.interval_nanos) };
        format!("{interval}:{}", duration(tier.age_nanos))
    };
    tiers.iter().map(tier).collect::<Vec<_>>().join(", ")
}

/// `-10m`, `-1h30m`, `10 minutes ago`, `2h ago`: `Some(Ok(nanoseconds))`;
/// `None` if `text` is not relative at all.
fn relative(text: &str) -> Option<Result<u64, String>> {
    // A duration starts with a digit: a bookmark may end in "ago" (`chicago`).
    let ago = || text.strip_suffix("ago").filter(|_| text.starts_with(|c: char| c.is_ascii_digit()));
    let duration = text.strip_prefix('-').or_else(|| ago().map(str::trim_end))?;
    Some(
        humantime::parse_duration(duration.trim())
            .map_err(|error| format!("bad duration {duration:?}: {error}"))
            .and_then(|duration| u64::try_from(duration.as_nanos()).map_err(|_| "duration too long".to_owned())),
    )
}

fn unix_time(digits: &str) -> Result<Timestamp, String> {
    let value: u64 = digits.parse().map_err(|_| "number out of range".to_owned())?;
    let nanos = match digits.len() {
        1..=12 => value.checked_mul(1_000_000_000),
        13 => value.checked_mul(1_000_000),
        16 => value.checked_mul(1_000),
        19 | 20 => Some(value),
        _ => return Err(format!("a {}-digit Unix time is ambiguous (seconds have up to 12 digits, milliseconds 13, microseconds 16, nanoseconds 19)", digits.len())),
    };
    nanos.map(Timestamp::from_unix_nanos).ok_or_else(|| "Unix time out of range".to_owned())
}

fn to_timestamp(timestamp: jiff::Timestamp) -> Result<Timestamp, String> {
    let nanos = timestamp.as_nanosecond();
    u64::try_from(nanos).map(Timestamp::from_unix_nanos).map_err(|_| {
        if nanos < 0 {
            "it is before 1970".to_owned()
        } else {
            "it is after 2554, the last moment Rewind can represent".to_owned()
        }
    })
}

fn to_jiff(timestamp: Timestamp) -> jiff::Timestamp {
    jiff::Timestamp::from_nanosecond(i128::from(timestamp.unix_nanos())).expect("u64 nanoseconds fit")
}

/// A timestamp as RFC 3339 in UTC, with only as many fractional digits as it has.
pub struct DisplayTime(pub Timestamp);

impl fmt::Display for DisplayTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", to_jiff(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_unix_nanos(1_763_805_792_000_000_000);

    fn at(input: &str) -> Timestamp {
        match parse_point_in_time(input, NOW, &TimeZone::UTC).unwrap() {
            PointInTime::At(timestamp) => timestamp,
            PointInTime::Bookmark(name) => panic!("{input} read as bookmark {name}"),
        }
    }

    #[test]
    fn granularities() {
        assert_eq!(parse_granularity("0"), Ok(0));
        let tiers = parse_retention("all:2h, 1m:24h,1h:7d").unwrap();
        let hour = 3_600_000_000_000;
        assert_eq!(
            tiers,
            [
                RetentionTier { interval_nanos: 0, age_nanos: 2 * hour },
                RetentionTier { interval_nanos: hour / 60, age_nanos: 24 * hour },
                RetentionTier { interval_nanos: hour, age_nanos: 7 * 24 * hour },
            ]
        );
        assert_eq!(display_retention(&tiers), "all:2h, 1m:1day, 1h:7days");
        assert_eq!(parse_retention("forever"), Ok(Vec::new()));
        assert_eq!(display_retention(&[]), "forever");
        assert!(parse_retention("1m").unwrap_err().contains("interval:age"));
        assert!(parse_retention("all:soon").unwrap_err().contains("bad age"));
        assert_eq!(parse_granularity("5m"), Ok(300_000_000_000));
        assert_eq!(parse_granularity(" 1h30m "), Ok(5_400_000_000_000));
        let error = parse_granularity("5 parsecs").unwrap_err();
        assert!(error.contains("use 0 or ew (every write) or a duration"), "{error}");
        assert_eq!(display_granularity(0), "every write");
        assert_eq!(display_granularity(300_000_000_000), "5m");
    }

    #[test]
    fn every_documented_form() {
        assert_eq!(at("2025-11-22T10:03:12Z"), NOW);
        assert_eq!(at("2025-11-22T11:03:12+01:00"), NOW);
        assert_eq!(at("2025-11-22 10:03:12"), NOW);
        assert_eq!(at("10:03:12"), NOW);
        assert_eq!(at("1763805792"), NOW);
        assert_eq!(at("@1763805792"), NOW);
        assert_eq!(at("1763805792000"), NOW);
        assert_eq!(at("1763805792000000000"), NOW);
        assert_eq!(at("now"), NOW);
        let ten_minutes = 600 * 1_000_000_000;
        assert_eq!(at("-10m"), NOW.saturating_sub_nanos(ten_minutes));
        assert_eq!(at("10 minutes ago"), NOW.saturating_sub_nanos(ten_minutes));
        assert_eq!(at("10min ago"), NOW.saturating_sub_nanos(ten_minutes));
        assert_eq!(at("-1h 30m"), NOW.saturating_sub_nanos(5400 * 1_000_000_000));
        assert_eq!(
            parse_point_in_time("before-upgrade", NOW, &TimeZone::UTC).unwrap(),
            PointInTime::Bookmark(BookmarkName::new("before-upgrade").unwrap())
        );
        // A bookmark that ends in "ago" is a bookmark (it read as a bad duration).
        assert_eq!(
            parse_point_in_time("chicago", NOW, &TimeZone::UTC).unwrap(),
            PointInTime::Bookmark(BookmarkName::new("chicago").unwrap())
        );
        assert_eq!(DisplayTime(NOW).to_string(), "2025-11-22T10:03:12Z");
    }

    #[test]
    fn bad_input_says_why() {
        for bad in [
            "",
            "-10parsecs",
            "2026-13-40T00:00:00Z",
            "12345678901234",
            "a b",
            "3 fortnights ago",
            "2999-01-01T00:00:00Z",
        ] {
            let error = parse_point_in_time(bad, NOW, &TimeZone::UTC).unwrap_err();
            assert!(error.to_string().contains("RFC 3339"), "{bad}: {error}");
        }
    }
}
