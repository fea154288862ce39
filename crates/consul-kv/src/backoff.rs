//! Retry delays with jitter, so that many watches failing together (a Consul
//! restart, a revoked token) do not retry together.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Capped exponential backoff with "equal jitter": the n-th delay lies in `[d/2, d]` where
/// `d = min(max, base * 2^n)`. backon adds up to as much again as its own delay, so it runs
/// at half the scale.
///
/// Equal rather than full jitter keeps a floor of `d/2`, so a retry never
/// fires immediately against a server that just failed.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        let max = max.max(base);
        let builder = ExponentialBuilder::default()
            .with_min_delay(base / 2)
            .with_max_delay(max / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self { delays: builder.build(), builder, max }
    }

    /// The delay before the next retry; each call doubles the ceiling up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.max).min(self.max)
    }

    /// Call after a success, so the next failure starts from `base` again.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

/// `d` scaled by a random factor in `[1 - fraction, 1 + fraction]`
/// (`fraction` is clamped to `0..=1`). Use it to spread watch start times and
/// wait durations so that they do not all expire at once.
pub fn jitter(d: Duration, fraction: f64) -> Duration {
    let fraction = fraction.clamp(0.0, 1.0);
    d.mul_f64(1.0 - fraction + 2.0 * fraction * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(10);

    #[test]
    fn grows_within_equal_jitter_bounds() {
        let mut backoff = Backoff::new(BASE, MAX);
        for n in 0..7 {
            let ceiling = BASE * 2u32.pow(n);
            let delay = backoff.next_delay();
            assert!(delay >= ceiling / 2 && delay <= ceiling, "{n}: {delay:?}");
        }
    }

    #[test]
    fn is_capped_at_max_forever() {
        let mut backoff = Backoff::new(BASE, MAX);
        for _ in 0..200 {
            let delay = backoff.next_delay();
            assert!(delay <= MAX, "{delay:?}");
        }
        assert!(backoff.next_delay() >= MAX / 2);
    }

    #[test]
    fn reset_starts_over() {
        let mut backoff = Backoff::new(BASE, MAX);
        for _ in 0..10 {
            backoff.next_delay();
        }
        backoff.reset();
        assert!(backoff.next_delay() <= BASE);
    }

    #[test]
    fn delays_are_actually_random() {
        let mut backoff = Backoff::new(MAX, MAX);
        let delays: std::collections::HashSet<_> = (0..20).map(|_| backoff.next_delay()).collect();
        assert!(delays.len() > 10, "{delays:?}");
    }

    #[test]
    fn jitter_stays_within_fraction() {
        let d = Duration::from_secs(60);
        for _ in 0..100 {
            let j = jitter(d, 0.1);
            assert!(j >= Duration::from_secs(54) && j <= Duration::from_secs(66), "{j:?}");
        }
        assert_eq!(jitter(d, 0.0), d);
        assert!(jitter(d, 5.0) <= 2 * d);
    }
}
