//! RFC 3339 timestamps (UTC, whole seconds) for annotations, without a date crate.
//!
//! Only what the heartbeat annotation needs: write `2026-12-02T18:46:27Z` from Unix seconds and read it
//! back. Conversions follow Howard Hinnant's `days_from_civil` / `civil_from_days` algorithms.

use thiserror::Error;

/// A timestamp that is not `YYYY-MM-DDTHH:MM:SSZ`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0:?} is not an RFC 3339 UTC timestamp (YYYY-MM-DDTHH:MM:SSZ)")]
pub struct TimestampError(pub String);

/// Now in RFC 3339 with microseconds, UTC (a `MicroTime`, as Events and leases carry it).
pub fn now_rfc3339_micros() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let base = format_rfc3339(now.as_secs());
    // format_rfc3339 ends with 'Z'; the fraction goes before it.
    let stem = base.trim_end_matches('Z');
    format!("{stem}.{:06}Z", now.subsec_micros())
}

/// Formats Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` (fractional seconds allowed and dropped) into Unix seconds.
pub fn parse_rfc3339(s: &str) -> Result<u64, TimestampError> {
    let bad = || TimestampError(s.to_string());
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    // `get`, not slicing: byte 19 may fall inside a multi-byte character (found by fuzzing).
    let tail = s.get(19..).ok_or_else(bad)?;
    let tail = tail.strip_prefix('.').map_or(Some(tail), |f| {
        f.trim_start_matches(|c: char| c.is_ascii_digit()).into()
    });
    if !matches!(tail, Some("Z" | "z")) {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<u64, TimestampError> {
        let part = s.get(r).ok_or_else(bad)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse().map_err(|_| bad())
    };
    let (y, mo, d, h, mi, se) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 || y < 1970
    {
        return Err(bad());
    }
    let days = days_from_civil(y as i64, mo as u32, d as u32);
    Ok(days as u64 * 86_400 + h * 3600 + mi * 60 + se)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(1_796_237_187), "2026-12-02T18:46:27Z");
        assert_eq!(format_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(parse_rfc3339("2026-12-02T18:46:27Z"), Ok(1_796_237_187));
        assert_eq!(
            parse_rfc3339("2026-12-02T18:46:27.123456Z"),
            Ok(1_796_237_187)
        );
        for bad in [
            "",
            "2026-12-02 18:46:27Z",
            "2026-13-02T18:46:27Z",
            "2026-12-02T18:46:27+01:00",
            "2026-12-02T18:46:27",
            "x026-12-02T18:46:27Z",
            // A multi-byte character across byte 19, where the seconds end.
            "2026-12-02T18:46:0\u{e9}Z",
            "2026-12-02T18:46:\u{20ac}Z",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn round_trips_across_years() {
        for t in (0..4_102_444_800u64).step_by(86_399 * 37) {
            assert_eq!(parse_rfc3339(&format_rfc3339(t)), Ok(t));
        }
    }

    proptest::proptest! {
        /// Any text parses or errors (never panics), and what parses formats back to the same instant.
        #[test]
        fn any_text_parses_or_errors(s in "[0-9T:Z.-]{0,4}\\PC{0,26}") {
            if let Ok(t) = parse_rfc3339(&s) {
                proptest::prop_assert_eq!(parse_rfc3339(&format_rfc3339(t)), Ok(t));
            }
        }

        /// Every instant up to year 9999 round trips.
        #[test]
        fn instants_round_trip(t in 0u64..253_402_300_800) {
            proptest::prop_assert_eq!(parse_rfc3339(&format_rfc3339(t)), Ok(t));
        }
    }
}
