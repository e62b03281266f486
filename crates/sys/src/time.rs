//! Unix times written as calendar dates (UTC), for reports, records and manual pages.

/// Days since 1970-01-01 as `YYYY-MM-DD` (the proleptic Gregorian calendar; Howard
/// Hinnant's `civil_from_days`).
pub fn date(days: u64) -> String {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A Unix time (seconds) as RFC 3339 UTC, e.g. `2026-11-28T02:30:12Z`.
pub fn rfc3339(s: u64) -> String {
    let rem = s % 86_400;
    format!("{}T{:02}:{:02}:{:02}Z", date(s / 86_400), rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_seconds_are_written_as_the_calendar_says() {
        assert_eq!(date(19_782), "2024-02-29");
        assert_eq!(rfc3339(1_795_833_012), "2026-11-28T02:30:12Z");
    }
}
