use std::time::Duration;

/// Durations such as `500ms`, `5s`, `1m30s` or `2h`. The API server enforces this pattern.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// Parses a duration matching [`DURATION_PATTERN`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?}: use units ms, s, m or h, such as 500ms, 5s or 1m30s");
    if text.is_empty() {
        return Err(invalid());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
        let value: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let (unit, len) = match rest.as_bytes() {
            [b'm', b's', ..] => (Duration::from_millis(1), 2),
            [b's', ..] => (Duration::from_secs(1), 1),
            [b'm', ..] => (Duration::from_secs(60), 1),
            [b'h', ..] => (Duration::from_secs(3600), 1),
            _ => return Err(invalid()),
        };
        let part = unit.checked_mul(u32::try_from(value).map_err(|_| invalid())?).ok_or_else(invalid)?;
        total = total.checked_add(part).ok_or_else(invalid)?;
        rest = &rest[len..];
    }
    Ok(total)
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
        for bad in ["", "5", "s", "5x", "1.5s", "-1s", "5 s", "99999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
