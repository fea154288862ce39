//! The shapes of a rollout window's schedule and time zone, for the API server to refuse a
//! malformed one at apply time. The controller parses both again with croner and jiff.

/// One comma-separated field of a cron schedule whose values match `$v`: `*` or a value or a
/// range, each with an optional step.
macro_rules! field {
    ($v:literal) => {
        concat!(
            r"(\*|(",
            $v,
            r")(-(",
            $v,
            r"))?)(/[1-9][0-9]?)?",
            r"(,(\*|(",
            $v,
            r")(-(",
            $v,
            r"))?)(/[1-9][0-9]?)?)*"
        )
    };
}

/// A standard five-field cron schedule: minute, hour, day of month, month (1-12 or a name such
/// as `JAN`), day of week (0-7, Sunday being 0 and 7, or a name such as `MON`).
pub const SCHEDULE_PATTERN: &str = concat!(
    "^ *",
    field!("[0-5]?[0-9]"),
    " +",
    field!("[01]?[0-9]|2[0-3]"),
    " +",
    field!("0?[1-9]|[12][0-9]|3[01]"),
    " +",
    field!("0?[1-9]|1[0-2]|[A-Za-z]{3}"),
    " +",
    field!("[0-7]|[A-Za-z]{3}"),
    " *$"
);

/// An IANA time zone's name, such as `UTC`, `Europe/Paris` or `America/Argentina/Salta`.
pub const TIME_ZONE_PATTERN: &str = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$";

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, text: &str) -> bool {
        regex::Regex::new(pattern).unwrap().is_match(text)
    }

    #[test]
    fn schedules_of_five_fields_with_values_in_range_match() {
        for ok in [
            "* * * * *",
            "0 22 * * 1-5",
            "*/15 9-17 * * MON-FRI",
            "0 0 1,15 JAN,jul 0",
            "30 2 31 12 7",
            "5-10/2 * * * *",
        ] {
            assert!(matches(SCHEDULE_PATTERN, ok), "{ok}");
        }
        for bad in [
            "* * * *",
            "* * * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "* * * * 8",
            "*/0 * * * *",
            "@daily",
            "0 9 * * 1;",
            "",
        ] {
            assert!(!matches(SCHEDULE_PATTERN, bad), "{bad}");
        }
    }

    #[test]
    fn time_zones_are_names_with_up_to_two_slashes() {
        for ok in ["UTC", "Europe/Paris", "America/Argentina/Salta", "Etc/GMT+5", "EST5EDT"] {
            assert!(matches(TIME_ZONE_PATTERN, ok), "{ok}");
        }
        for bad in ["", "/etc/passwd", "Europe/../x", "a b", "Europe/Paris/x/y"] {
            assert!(!matches(TIME_ZONE_PATTERN, bad), "{bad}");
        }
    }
}
