//! Whether the Consul agent answers at all, and how the runners wait for it.

use std::{sync::Arc, time::Duration};

use consul_kv::Error;
use tokio::{
    sync::watch,
    time::{Instant, sleep_until},
};
use tracing::{info, warn};

use super::runner::Runner;
use crate::Lock;

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

/// How often the agent is asked whether it answers at all, and how long it may take.
const AGENT_CHECK: Duration = Duration::from_secs(2);
pub const AGENT_TIMEOUT: Duration = Duration::from_millis(1_500);

/// Keeps [`Runner::agent`] current: the agent counts as down after two checks in a row went
/// unanswered (one slow answer under load is no reason to give up every blocking query; the
/// second comes half a second after the first), and up again at its first answer, checked
/// every second while it is down. A check that times out while the watches have answers is
/// a slow agent, not a hung one (its servers electing a leader, say): cutting every blocking
/// query then would only add a read of every group to its load.
pub async fn watch_agent(runner: Arc<Runner>) {
    let mut unanswered = 0;
    loop {
        let asked = Instant::now();
        let checked = runner.consul.alive(AGENT_TIMEOUT).await;
        let answered = checked.is_ok() || runner.answered_at.locked().is_some_and(|at| at >= asked);
        unanswered = if answered { 0 } else { unanswered + 1 };
        let down = checked.err().filter(|_| unanswered >= 2);
        let up = down.is_none();
        if runner.agent.send_if_modified(|was| {
            was.is_none() != up && {
                *was = down.clone();
                true
            }
        }) {
            match &down {
                None => info!(address = runner.consul.address(), "the Consul agent answers again"),
                Some(error) => warn!(
                    address = runner.consul.address(),
                    %error,
                    "the Consul agent stopped answering; its watches fail over to reads once it is back"
                ),
            }
        }
        let next = match (unanswered, up) {
            (0, _) => AGENT_CHECK,
            (_, true) => Duration::from_millis(500),
            (_, false) => Duration::from_secs(1),
        };
        tokio::time::sleep(next).await;
    }
}
