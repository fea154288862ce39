use std::time::Duration;

/// The longest `rollout.quietPeriod` a binding may ask for.
pub const MAX_QUIET_PERIOD: Duration = Duration::from_secs(3600);
/// The longest `rollout.maxDelay` a binding may ask for.
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// Durations such as `500ms`, `5s`, `1m30s` or `2h`. The API server enforces this pattern.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// Parses a duration matching [`DURATION_PATTERN`]: the sum of its parts, in any order, as Go's
/// `time.ParseDuration` reads them (`1m30s`, `90s` and `30s1m` are the same). One too long for
/// a clock is the longest there is, for the caller's limit to refuse.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?}: use units ms, s, m or h, such as 500ms, 5s or 1m30s");
    let mut rest = text;
    let mut millis: u64 = 0;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let (unit, after) = match after {
            _ if after.starts_with("ms") => (1, &after[2..]),
            _ if after.starts_with('s') => (1_000, &after[1..]),
            _ if after.starts_with('m') => (60_000, &after[1..]),
            _ if after.starts_with('h') => (3_600_000, &after[1..]),
            _ => return Err(invalid()),
        };
        if number.is_empty() {
            return Err(invalid());
        }
        let number: u64 = number.parse().unwrap_or(u64::MAX);
        millis = millis.saturating_add(number.saturating_mul(unit));
        rest = after;
    }
    Ok(Duration::from_millis(millis))
}

/// Parses `N/span`, such as `3/1h`: a count and the span it holds within. The caller bounds
/// both; `example` is shown when the text has no `/`.
pub fn parse_rate(text: &str, example: &str) -> Result<(u32, Duration), String> {
    let (count, span) = text.split_once('/').ok_or_else(|| format!("{text:?}: expected N/span, such as {example}"))?;
    let count = count.parse().map_err(|_| format!("{text:?}: {count:?} is not a count"))?;
    let span = parse_duration(span).map_err(|e| format!("{text:?}: {e}"))?;
    Ok((count, span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("30s1m"), Ok(Duration::from_secs(90)), "any order, as Go reads it");
        assert_eq!(parse_duration("1h1h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0010ms"), Ok(Duration::from_millis(10)));
    }

    #[test]
    fn the_largest_numbers_are_the_longest_duration_not_misread() {
        for huge in ["18446744073709551615h", "99999999999999999999s", "18446744073709551615ms1ms"] {
            assert_eq!(parse_duration(huge), Ok(Duration::from_millis(u64::MAX)), "{huge}");
        }
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "5", "s", "5x", "1.5s", "-1s", "5 s", "1d", "1hh", "m5", "5sm", "５s", "1µs"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn a_rate_is_a_count_over_a_span() {
        assert_eq!(parse_rate("3/1h", "3/1h"), Ok((3, Duration::from_secs(3600))));
        assert_eq!(parse_rate("100/1m30s", "x"), Ok((100, Duration::from_secs(90))));
        assert_eq!(parse_rate("3", "3/1h"), Err(r#""3": expected N/span, such as 3/1h"#.to_owned()));
        assert_eq!(parse_rate("-1/1h", "x"), Err(r#""-1/1h": "-1" is not a count"#.to_owned()));
        assert!(parse_rate("3/1d", "x").unwrap_err().starts_with(r#""3/1d": invalid duration"#));
    }
}
