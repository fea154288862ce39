//! consul-template style `wait { min, max }` for one binding.

use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;

/// Quiet period and hard maximum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub quiet: Duration,
    pub max: Duration,
}

/// A change that has been seen but not yet rolled out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// What each target is to receive.
    wants: BTreeMap<String, String>,
    first_seen: Instant,
    last_change: Instant,
}

/// What to do about the content seen now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    RollNow,
    WaitUntil(Instant),
}

impl Pending {
    /// Records what each target is to receive, as seen at `now`, and decides whether the
    /// content has settled. A new checksum for a target seen before restarts the quiet period;
    /// a target found or gone does not (that is no content change); the maximum counts from the
    /// first change.
    pub fn observe<'a, W: ToString>(
        pending: &mut Option<Pending>,
        wants: impl IntoIterator<Item = (W, &'a str)>,
        now: Instant,
        window: Window,
    ) -> Decision {
        let wants: BTreeMap<String, String> = wants.into_iter().map(|(w, c)| (w.to_string(), c.to_owned())).collect();
        let state =
            pending.get_or_insert_with(|| Pending { wants: BTreeMap::new(), first_seen: now, last_change: now });
        if wants.iter().any(|(w, want)| state.wants.get(w).is_some_and(|before| before != want)) {
            state.last_change = now;
        }
        state.wants = wants;
        let deadline = later(state.last_change, window.quiet).min(later(state.first_seen, window.max));
        if now >= deadline { Decision::RollNow } else { Decision::WaitUntil(deadline) }
    }
}

/// `at + wait`, or as late as the clock allows: a deadline never overflows.
fn later(at: Instant, wait: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(wait).or_else(|| at.checked_add(FAR)).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn one(checksum: &str) -> [(&str, &str); 1] {
        [("web", checksum)]
    }

    const WINDOW: Window = Window { quiet: Duration::from_secs(5), max: Duration::from_secs(12) };

    /// A wait past the end of the clock is a deadline a century away, never now: a binding of
    /// the longest waits must not roll at once.
    #[test]
    fn a_deadline_past_the_end_of_the_clock_is_far_away() {
        let now = Instant::now();
        let far = later(now, Duration::MAX);
        assert!(far.duration_since(now) >= Duration::from_secs(99 * 365 * 24 * 3600), "{:?}", far.duration_since(now));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_quiet_rolls_at_once() {
        let mut pending = None;
        let window = Window { quiet: Duration::ZERO, max: Duration::from_secs(30) };
        assert_eq!(Pending::observe(&mut pending, one("a"), Instant::now(), window), Decision::RollNow);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_the_quiet_period() {
        let mut pending = None;
        let start = Instant::now();
        assert_eq!(
            Pending::observe(&mut pending, one("a"), start, WINDOW),
            Decision::WaitUntil(start + Duration::from_secs(5))
        );
        advance(Duration::from_secs(4)).await;
        assert!(matches!(Pending::observe(&mut pending, one("a"), Instant::now(), WINDOW), Decision::WaitUntil(_)));
        advance(Duration::from_secs(1)).await;
        assert_eq!(Pending::observe(&mut pending, one("a"), Instant::now(), WINDOW), Decision::RollNow);
    }

    #[tokio::test(start_paused = true)]
    async fn each_change_restarts_the_quiet_period() {
        let mut pending = None;
        Pending::observe(&mut pending, one("a"), Instant::now(), WINDOW);
        advance(Duration::from_secs(3)).await;
        let now = Instant::now();
        assert_eq!(
            Pending::observe(&mut pending, one("b"), now, WINDOW),
            Decision::WaitUntil(now + Duration::from_secs(5))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_of_changes_rolls_by_the_maximum() {
        let mut pending = None;
        let start = Instant::now();
        for (i, checksum) in ["a", "b", "c", "d"].iter().enumerate() {
            let decision = Pending::observe(&mut pending, one(checksum), Instant::now(), WINDOW);
            if i > 0 {
                // Never later than first change + max, however often the content changes.
                assert!(matches!(decision, Decision::WaitUntil(t) if t <= start + WINDOW.max));
            }
            advance(Duration::from_secs(3)).await;
        }
        assert_eq!(Instant::now(), start + Duration::from_secs(12));
        assert_eq!(Pending::observe(&mut pending, one("e"), Instant::now(), WINDOW), Decision::RollNow);
    }

    /// Simulator, schedules with two bindings on a workload, seed 94: a target leaving made the
    /// binding's whole checksum new, restarted the quiet period of the one that stayed, and
    /// rolled it a second time after the other binding had rolled it for the same change.
    #[tokio::test(start_paused = true)]
    async fn a_target_found_or_gone_does_not_restart_the_quiet_period_of_the_others() {
        let mut pending = None;
        let start = Instant::now();
        let due = Decision::WaitUntil(start + Duration::from_secs(5));
        assert_eq!(Pending::observe(&mut pending, [("api", "a1"), ("web", "w1")], start, WINDOW), due);
        advance(Duration::from_secs(2)).await;
        assert_eq!(Pending::observe(&mut pending, [("web", "w1")], Instant::now(), WINDOW), due, "api left");
        assert_eq!(Pending::observe(&mut pending, [("new", "n1"), ("web", "w1")], Instant::now(), WINDOW), due);
        advance(Duration::from_secs(3)).await;
        assert_eq!(Pending::observe(&mut pending, [("web", "w1")], Instant::now(), WINDOW), Decision::RollNow);
    }

    /// What one target reads changed while another waits: the quiet period starts again.
    #[tokio::test(start_paused = true)]
    async fn a_change_of_any_targets_content_restarts_the_quiet_period() {
        let mut pending = None;
        Pending::observe(&mut pending, [("api", "a1"), ("web", "w1")], Instant::now(), WINDOW);
        advance(Duration::from_secs(4)).await;
        let now = Instant::now();
        let again = Pending::observe(&mut pending, [("api", "a1"), ("web", "w2")], now, WINDOW);
        assert_eq!(again, Decision::WaitUntil(now + Duration::from_secs(5)));
    }
}
