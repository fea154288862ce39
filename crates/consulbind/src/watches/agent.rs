//! Whether the Consul agent answers at all.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use tracing::{info, warn};

use super::runner::Runner;
use crate::Lock;

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
