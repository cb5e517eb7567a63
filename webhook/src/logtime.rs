//! Log timestamps as tracing-subscriber's `SystemTime` timer writes them
//! (`2026-12-06T02:25:03.351738Z`, UTC, microseconds), with the date and the time of day formatted
//! once per second per thread instead of once per line.
//!
//! The webhook writes a line per admission, and formatting the timestamp through `core::fmt` was
//! a fifth of a text line's cost (`cargo bench -p vgpu-webhook --bench logline`; numbers in
//! docs/BENCHMARKS.md). Here a line costs a clock read, a copy of the cached 19 bytes and six
//! digits.

use std::cell::Cell;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{self, FormatTime};

/// `YYYY-MM-DDTHH:MM:SS`.
type Prefix = [u8; 19];

/// The last second formatted on this thread, and its text.
#[derive(Clone, Copy)]
struct Cached {
    second: u64,
    prefix: Prefix,
}

thread_local! {
    static LAST: Cell<Option<Cached>> = const { Cell::new(None) };
}

/// The seconds since the epoch of 9999-12-31T23:59:59Z: past it the year takes more than four
/// digits, which [`prefix`] does not write.
const LAST_FOUR_DIGIT_SECOND: u64 = 253_402_300_799;

/// A [`FormatTime`] writing exactly what [`time::SystemTime`] writes, faster.
#[derive(Debug, Clone, Copy, Default)]
pub struct CachedUtcTime;

impl FormatTime for CachedUtcTime {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|since_epoch| LAST.with(|last| stamp_at(since_epoch, last)));
        match stamp {
            // Only ASCII digits and separators: the check cannot fail, and costs less than the
            // `unsafe` that would skip it.
            Some(stamp) => w.write_str(std::str::from_utf8(&stamp).map_err(|_| fmt::Error)?),
            // Before 1970 or after 9999: rare enough to format the slow way (which reads the
            // clock again, a microsecond later at most).
            None => time::SystemTime.format_time(w),
        }
    }
}

/// The timestamp of `since_epoch`, through `last` (this thread's cache): its date and time of day
/// are formatted only when its second is not the last one formatted. `None` past
/// [`LAST_FOUR_DIGIT_SECOND`].
fn stamp_at(since_epoch: Duration, last: &Cell<Option<Cached>>) -> Option<[u8; 27]> {
    let second = since_epoch.as_secs();
    if second > LAST_FOUR_DIGIT_SECOND {
        return None;
    }
    let prefix = match last.get() {
        Some(c) if c.second == second => c.prefix,
        _ => {
            let prefix = prefix(second);
            last.set(Some(Cached { second, prefix }));
            prefix
        }
    };
    Some(stamp(&prefix, since_epoch.subsec_micros()))
}

/// `prefix` followed by `.ffffffZ`.
fn stamp(prefix: &Prefix, micros: u32) -> [u8; 27] {
    let mut out = [0u8; 27];
    out[..19].copy_from_slice(prefix);
    out[19] = b'.';
    put_digits(&mut out[20..26], micros);
    out[26] = b'Z';
    out
}

/// The date and time of day of `second` (since the epoch, at most [`LAST_FOUR_DIGIT_SECOND`]).
fn prefix(second: u64) -> Prefix {
    let (year, month, day) = civil_date(second / 86_400);
    let of_day = second % 86_400;
    let mut p = *b"0000-00-00T00:00:00";
    put_digits(&mut p[0..4], year);
    put_digits(&mut p[5..7], month);
    put_digits(&mut p[8..10], day);
    put_digits(&mut p[11..13], (of_day / 3600) as u32);
    put_digits(&mut p[14..16], (of_day / 60 % 60) as u32);
    put_digits(&mut p[17..19], (of_day % 60) as u32);
    p
}

/// `value` in decimal, zero-padded to fill `out` (higher digits dropped).
fn put_digits(out: &mut [u8], mut value: u32) {
    for b in out.iter_mut().rev() {
        *b = b'0' + (value % 10) as u8;
        value /= 10;
    }
    debug_assert_eq!(value, 0, "a value wider than its field");
}

/// Year, month (1-12) and day (1-31) of the day `days` after 1970-01-01, proleptic Gregorian
/// (H. Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_date(days: u64) -> (u32, u32, u32) {
    // Count from 0000-03-01, so that a leap day is the last day of its year.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year as u32, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn text(second: u64, micros: u32) -> String {
        String::from_utf8(stamp(&prefix(second), micros).to_vec()).unwrap()
    }

    /// The day after `(year, month, day)`, by the calendar's rules stated directly.
    fn next_day((year, month, day): (u32, u32, u32)) -> (u32, u32, u32) {
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        let days_in_month = match month {
            2 if leap => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        match (day < days_in_month, month < 12) {
            (true, _) => (year, month, day + 1),
            (false, true) => (year, month + 1, 1),
            (false, false) => (year + 1, 1, 1),
        }
    }

    #[test]
    fn known_instants_are_written_as_tracing_subscriber_writes_them() {
        for (second, micros, want) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 7, "2000-02-29T00:00:00.000007Z"),
            (951_868_799, 999_999, "2000-02-29T23:59:59.999999Z"),
            (1_796_523_903, 351_738, "2026-12-06T02:25:03.351738Z"),
            (4_107_542_400, 0, "2100-03-01T00:00:00.000000Z"),
            (4_107_542_399, 10, "2100-02-28T23:59:59.000010Z"),
            (13_574_563_200, 0, "2400-02-29T00:00:00.000000Z"),
            (
                LAST_FOUR_DIGIT_SECOND,
                123_456,
                "9999-12-31T23:59:59.123456Z",
            ),
        ] {
            assert_eq!(text(second, micros), want, "{second}");
        }
    }

    #[test]
    fn every_day_from_1970_to_9999_has_its_calendar_date() {
        let mut want = (1970, 1, 1);
        for days in 0..=LAST_FOUR_DIGIT_SECOND / 86_400 {
            assert_eq!(civil_date(days), want, "day {days}");
            want = next_day(want);
        }
        assert_eq!(want, (10_000, 1, 1));
    }

    #[test]
    fn the_cache_follows_the_second_forwards_and_backwards() {
        let last = Cell::new(None);
        let at = |s: u64, us: u32| {
            let t = Duration::from_secs(s) + Duration::from_micros(u64::from(us));
            String::from_utf8(stamp_at(t, &last).unwrap().to_vec()).unwrap()
        };
        assert_eq!(at(1_796_523_903, 1), "2026-12-06T02:25:03.000001Z");
        assert_eq!(at(1_796_523_903, 999_999), "2026-12-06T02:25:03.999999Z");
        assert_eq!(at(1_796_523_904, 0), "2026-12-06T02:25:04.000000Z");
        // A clock stepped back, or a line formatted late: the older second again.
        assert_eq!(at(1_796_523_903, 5), "2026-12-06T02:25:03.000005Z");
        assert_eq!(at(86_399, 0), "1970-01-01T23:59:59.000000Z");
        assert_eq!(at(86_400, 0), "1970-01-02T00:00:00.000000Z");
        // Nanoseconds are cut to microseconds, as tracing-subscriber does.
        let t = Duration::new(86_400, 999_999_999);
        assert_eq!(&stamp_at(t, &last).unwrap()[19..], b".999999Z");
        assert_eq!(
            stamp_at(Duration::from_secs(LAST_FOUR_DIGIT_SECOND + 1), &last),
            None
        );
    }

    #[test]
    fn the_timer_writes_now_in_the_same_shape_as_the_slow_timer() {
        let now = |timer: &dyn FormatTime| {
            let mut s = String::new();
            timer.format_time(&mut Writer::new(&mut s)).unwrap();
            s
        };
        let before = now(&time::SystemTime);
        let ours = now(&CachedUtcTime);
        let after = now(&time::SystemTime);
        let shape = |s: &str| {
            s.chars()
                .map(|c| if c.is_ascii_digit() { '9' } else { c })
                .collect::<String>()
        };
        assert_eq!(shape(&ours), shape(&before), "{ours} vs {before}");
        // Same format, so the text orders as the instants do.
        assert!(
            before <= ours && ours <= after,
            "{ours} is not between {before} and {after}"
        );
    }
}
