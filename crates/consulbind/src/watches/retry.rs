//! How a runner waits on the Consul agent: out a backoff, or for it to go down.

use std::time::Duration;

use consul_kv::Error;
use tokio::{
    sync::watch,
    time::{Instant, sleep_until},
};

/// Waits out a failed request's backoff. A blip within the grace period shows nowhere; a
/// longer failure is reported once the grace is over, even in the middle of a backoff. While
/// the agent is known to be down nothing is retried, and when it answers again every group
/// retries at once rather than at the end of its own backoff.
pub(super) async fn wait_to_retry(
    agent: &mut watch::Receiver<Option<Error>>,
    due: Instant,
    retry: Instant,
    report: impl Fn(),
) {
    let mut reported = false;
    loop {
        let up = agent.borrow_and_update().is_none();
        let now = Instant::now();
        if !reported && now >= due {
            report();
            reported = true;
        }
        if up && now >= retry {
            return;
        }
        let next = match (reported, up) {
            (false, true) => due.min(retry),
            (false, false) => due,
            (true, true) => retry,
            (true, false) => now + Duration::from_secs(3600),
        };
        tokio::select! {
            _ = sleep_until(next) => {}
            changed = agent.changed() => if changed.is_err() || agent.borrow().is_none() { return },
        }
    }
}

/// Returns once the agent is known to be down.
pub(super) async fn went_down(agent: &mut watch::Receiver<Option<Error>>) -> Error {
    let down = agent.wait_for(Option::is_some).await.ok().and_then(|down| down.clone());
    match down {
        Some(down) => down,
        None => std::future::pending().await,
    }
}
