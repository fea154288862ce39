//! Rollout windows: when a binding's changes may start to roll. A window opens at each time its
//! cron schedule names, read in its time zone, and stays open for its duration. A rollout may
//! start inside an `allow` window (at any time, when there is none) and outside every `deny`
//! window: a deny window wins. Pure: whether it is open is a function of the clock alone.

use std::{sync::Arc, time::Duration};

use consulbind_api::{RolloutWindow, WindowKind, parse_duration};
use croner::{
    Cron,
    parser::{CronParser, Seconds, Year},
};
use jiff::{
    SignedDuration, Timestamp,
    tz::{TimeZone, TimeZoneDatabase},
};

/// The longest a window may stay open.
pub const MAX_WINDOW: Duration = Duration::from_secs(168 * 3600);
/// How far ahead the next opening is looked for: a schedule may name one day a year.
const HORIZON: SignedDuration = SignedDuration::from_hours(367 * 24);
/// At most this many windows are stepped through looking for an opening: deny windows back to
/// back could otherwise be walked one by one for a year.
const STEPS: usize = 4096;

/// A binding's rollout windows; none means always open.
#[derive(Clone, Debug, Default)]
pub struct Calendar(Arc<[Slot]>);

#[derive(Debug)]
struct Slot {
    deny: bool,
    cron: Cron,
    length: SignedDuration,
    zone: TimeZone,
}

/// Whether a rollout may start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Open,
    /// Until the time given, if a window opens within a year.
    Closed(Option<Timestamp>),
}

/// For tests: the windows as given.
#[cfg(test)]
impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        let same = |a: &Slot, b: &Slot| {
            (a.deny, a.cron.pattern.to_string(), a.length, a.zone.iana_name())
                == (b.deny, b.cron.pattern.to_string(), b.length, b.zone.iana_name())
        };
        self.0.len() == other.0.len() && self.0.iter().zip(other.0.iter()).all(|(a, b)| same(a, b))
    }
}

impl Calendar {
    /// The windows of `spec.rollout.windows`, or why they cannot be read; `field` names them.
    pub fn of(windows: &[RolloutWindow], field: &str) -> Result<Self, String> {
        let parser = CronParser::builder().seconds(Seconds::Disallowed).year(Year::Disallowed).build();
        let mut slots = Vec::with_capacity(windows.len());
        for (i, window) in windows.iter().enumerate() {
            let field = format!("{field}[{i}]");
            let cron = parser.parse(&window.schedule).map_err(|e| {
                format!("{field}.schedule {:?} is not a five-field cron schedule: {e}", window.schedule)
            })?;
            let length = parse_duration(&window.duration).map_err(|e| format!("{field}.duration: {e}"))?;
            if length.is_zero() || length > MAX_WINDOW {
                return Err(format!("{field}.duration is {}; more than 0s and at most 168h", window.duration));
            }
            let name = window.time_zone.as_deref().unwrap_or("UTC");
            let zone = zones()
                .get(name)
                .map_err(|_| format!("{field}.timeZone {name:?} is not an IANA time zone, such as Europe/Paris"))?;
            let slot = Slot {
                deny: window.kind == Some(WindowKind::Deny),
                cron,
                length: SignedDuration::try_from(length).unwrap_or(SignedDuration::MAX),
                zone,
            };
            if slot.next_start(Timestamp::UNIX_EPOCH).is_none() {
                return Err(format!("{field}.schedule {:?} names no time that exists", window.schedule));
            }
            slots.push(slot);
        }
        Ok(Self(slots.into()))
    }

    /// `--default-rollout-windows`: a JSON list of windows as `spec.rollout.windows` takes them.
    pub fn parse(text: &str) -> Result<Self, String> {
        let windows: Vec<RolloutWindow> = serde_json::from_str(text).map_err(|e| {
            format!(r#"expected a JSON list of windows, such as [{{"schedule": "0 22 * * *", "duration": "6h"}}]: {e}"#)
        })?;
        Self::of(&windows, "window")
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a rollout may start at `now`, and if not, when it may.
    pub fn gate(&self, now: Timestamp) -> Gate {
        match self.opening(now) {
            Some(at) if at == now => Gate::Open,
            opens => Gate::Closed(opens),
        }
    }

    /// The first time from `from` on at which a rollout may start.
    fn opening(&self, from: Timestamp) -> Option<Timestamp> {
        let end = from.checked_add(HORIZON).unwrap_or(Timestamp::MAX);
        let mut at = from;
        for _ in 0..STEPS {
            if at > end {
                return None;
            }
            // Past every deny window open at `at`.
            if let Some(until) = self.0.iter().filter(|s| s.deny).filter_map(|s| s.open_until(at)).max() {
                at = until;
                continue;
            }
            let mut allows = self.0.iter().filter(|s| !s.deny).peekable();
            if allows.peek().is_none() || self.0.iter().any(|s| !s.deny && s.open_until(at).is_some()) {
                return Some(at);
            }
            at = allows.filter_map(|s| s.next_start(at)).min()?;
        }
        None
    }
}

impl Slot {
    /// When the window open at `at` closes; `None` when it is not open then.
    fn open_until(&self, at: Timestamp) -> Option<Timestamp> {
        let start = self.cron.find_previous_occurrence(&at.to_zoned(self.zone.clone()), true).ok()?;
        let until = start.timestamp().checked_add(self.length).unwrap_or(Timestamp::MAX);
        (at < until).then_some(until)
    }

    /// When the window next opens after `at`.
    fn next_start(&self, at: Timestamp) -> Option<Timestamp> {
        let next = self.cron.find_next_occurrence(&at.to_zoned(self.zone.clone()), false).ok()?;
        Some(next.timestamp())
    }
}

/// The time zones bundled into the binary: the controller's image has no `/usr/share/zoneinfo`,
/// and a zone must mean the same wherever the controller runs.
fn zones() -> &'static TimeZoneDatabase {
    static ZONES: std::sync::OnceLock<TimeZoneDatabase> = std::sync::OnceLock::new();
    ZONES.get_or_init(TimeZoneDatabase::bundled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(kind: WindowKind, schedule: &str, duration: &str, zone: Option<&str>) -> RolloutWindow {
        RolloutWindow {
            kind: Some(kind),
            schedule: schedule.into(),
            duration: duration.into(),
            time_zone: zone.map(Into::into),
        }
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn calendar(windows: &[RolloutWindow]) -> Calendar {
        Calendar::of(windows, "spec.rollout.windows").unwrap()
    }

    #[test]
    fn no_windows_is_always_open() {
        assert_eq!(Calendar::default().gate(at("2026-11-27T03:00:00Z")), Gate::Open);
    }

    #[test]
    fn an_allow_window_opens_at_its_schedule_for_its_duration() {
        // 22:00 to 02:00, weekdays.
        let nightly = calendar(&[window(WindowKind::Allow, "0 22 * * 1-5", "4h", None)]);
        // A Friday.
        assert_eq!(nightly.gate(at("2026-11-27T21:59:59Z")), Gate::Closed(Some(at("2026-11-27T22:00:00Z"))));
        assert_eq!(nightly.gate(at("2026-11-27T22:00:00Z")), Gate::Open);
        assert_eq!(nightly.gate(at("2026-11-28T01:59:59Z")), Gate::Open, "it stays open past midnight");
        // The weekend: Monday 22:00 is next.
        assert_eq!(nightly.gate(at("2026-11-28T02:00:00Z")), Gate::Closed(Some(at("2026-11-30T22:00:00Z"))));
    }

    #[test]
    fn a_deny_window_wins_and_the_gate_opens_when_it_ends() {
        let windows =
            [window(WindowKind::Allow, "0 * * * *", "1h", None), window(WindowKind::Deny, "0 12 * * *", "90m", None)];
        let both = calendar(&windows);
        assert_eq!(both.gate(at("2026-11-27T11:59:00Z")), Gate::Open);
        assert_eq!(both.gate(at("2026-11-27T12:00:00Z")), Gate::Closed(Some(at("2026-11-27T13:30:00Z"))));
        // Without allow windows, a deny window alone closes its span only.
        let deny = calendar(&windows[1..]);
        assert_eq!(deny.gate(at("2026-11-27T13:29:59Z")), Gate::Closed(Some(at("2026-11-27T13:30:00Z"))));
        assert_eq!(deny.gate(at("2026-11-27T13:30:00Z")), Gate::Open);
    }

    #[test]
    fn a_window_once_a_year_is_found_months_ahead() {
        let new_year = calendar(&[window(WindowKind::Allow, "0 0 1 1 *", "24h", None)]);
        assert_eq!(new_year.gate(at("2026-02-01T00:00:00Z")), Gate::Closed(Some(at("2027-01-01T00:00:00Z"))));
    }

    #[test]
    fn a_deny_window_that_never_closes_leaves_no_opening() {
        let always = calendar(&[window(WindowKind::Deny, "* * * * *", "2m", None)]);
        assert_eq!(always.gate(at("2026-11-27T12:00:30Z")), Gate::Closed(None));
    }

    #[test]
    fn a_schedule_is_read_in_its_time_zone_across_a_change_of_clocks() {
        // 09:00 in Paris: 08:00 UTC in winter, 07:00 UTC in summer.
        let paris = calendar(&[window(WindowKind::Allow, "0 9 * * *", "1h", Some("Europe/Paris"))]);
        assert_eq!(paris.gate(at("2026-03-28T09:00:00Z")), Gate::Closed(Some(at("2026-03-29T07:00:00Z"))));
        assert_eq!(paris.gate(at("2026-11-27T07:30:00Z")), Gate::Closed(Some(at("2026-11-27T08:00:00Z"))));
        assert_eq!(paris.gate(at("2026-11-27T08:30:00Z")), Gate::Open);
    }

    #[test]
    fn sunday_is_0_and_7_as_in_posix_cron() {
        // 2026-11-29 is a Sunday.
        for schedule in ["0 0 * * 0", "0 0 * * 7", "0 0 * * SUN"] {
            let sunday = calendar(&[window(WindowKind::Allow, schedule, "24h", None)]);
            assert_eq!(
                sunday.gate(at("2026-11-28T12:00:00Z")),
                Gate::Closed(Some(at("2026-11-29T00:00:00Z"))),
                "{schedule}"
            );
        }
    }

    #[test]
    fn malformed_windows_are_refused_with_the_field_named() {
        let refused = |w: RolloutWindow| Calendar::of(&[w], "spec.rollout.windows").unwrap_err();
        assert!(
            refused(window(WindowKind::Allow, "0 22 * *", "1h", None)).starts_with("spec.rollout.windows[0].schedule")
        );
        assert!(refused(window(WindowKind::Allow, "0 0 31 2 *", "1h", None)).contains("names no time that exists"));
        assert!(refused(window(WindowKind::Allow, "* * * * *", "0s", None)).contains("more than 0s"));
        assert!(refused(window(WindowKind::Allow, "* * * * *", "169h", None)).contains("at most 168h"));
        assert!(refused(window(WindowKind::Allow, "* * * * *", "168h1s", None)).contains("at most 168h"));
        assert!(Calendar::of(&[window(WindowKind::Allow, "* * * * *", "168h", None)], "w").is_ok(), "168h is allowed");
        assert!(refused(window(WindowKind::Allow, "* * * * *", "1h", Some("Mars/Olympus"))).contains("timeZone"));
    }

    #[test]
    fn the_flag_takes_a_json_list() {
        let flag = Calendar::parse(r#"[{"schedule": "0 22 * * *", "duration": "6h", "timeZone": "Asia/Tokyo"}]"#);
        assert_eq!(flag.unwrap(), calendar(&[window(WindowKind::Allow, "0 22 * * *", "6h", Some("Asia/Tokyo"))]));
        let other = Calendar::parse(r#"[{"schedule": "0 22 * * *", "duration": "6h"}]"#).unwrap();
        assert_ne!(other, calendar(&[window(WindowKind::Allow, "0 22 * * *", "6h", Some("Asia/Tokyo"))]));
        assert!(Calendar::parse("0 22 * * *").unwrap_err().contains("JSON list"));
    }

    #[test]
    fn an_opening_is_looked_for_367_days_ahead_and_no_further() {
        // Leap days only: 2028-02-29 is 367 days after 2027-02-27.
        let leap = calendar(&[window(WindowKind::Allow, "0 0 29 2 *", "24h", None)]);
        let opening = Gate::Closed(Some(at("2028-02-29T00:00:00Z")));
        assert_eq!(leap.gate(at("2027-02-27T00:00:00Z")), opening, "at the horizon");
        assert_eq!(leap.gate(at("2027-02-26T23:59:59Z")), Gate::Closed(None), "a second past it");
    }
}
