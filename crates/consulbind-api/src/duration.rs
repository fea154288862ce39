use std::time::Duration;

use jiff::SignedDuration;

/// The longest `rollout.quietPeriod` a binding may ask for.
pub const MAX_QUIET_PERIOD: Duration = Duration::from_secs(3600);
/// The longest `rollout.maxDelay` a binding may ask for.
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// Durations such as `500ms`, `5s`, `1m30s` or `2h`. The API server enforces this pattern.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// Parses a duration matching [`DURATION_PATTERN`], with jiff's parser of friendly durations
/// restricted to that grammar (no spaces, signs, fractions or other units).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?}: use units ms, s, m or h, such as 500ms, 5s or 1m30s");
    if !text.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'm' | b's' | b'h')) {
        return Err(invalid());
    }
    let parsed: SignedDuration = text.parse().map_err(|_| invalid())?;
    Duration::try_from(parsed).map_err(|_| invalid())
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
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "5", "s", "5x", "1.5s", "-1s", "5 s", "1d", "1hh", "9999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
