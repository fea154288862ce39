//! Every write of a sharded replica passes here: it goes ahead only for a namespace of the view
//! the replica serves, and only while the replica's Lease is fresh. A drain waits for the
//! writes let through, so that the next view is shown only once they are done.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::ring::View;
use crate::Lock;

pub struct Gate {
    me: String,
    /// A write goes ahead only this soon after the last renewal was sent: two thirds of the
    /// Lease, well before another replica may take its namespaces.
    fence: Duration,
    state: Mutex<State>,
    idle: Notify,
}

#[derive(Default)]
struct State {
    serving: Option<View>,
    /// Whether each namespace asked about is this replica's in `serving`.
    ours: HashMap<String, bool>,
    renewed: Option<Instant>,
    in_flight: usize,
}

/// Why a write did not go ahead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotServed {
    #[error("this replica's shard Lease is not renewed, so it writes nothing until it is")]
    Late,
    #[error("namespace {0} is served by another replica, or is being handed over between replicas")]
    Elsewhere(String),
}

/// A write let through; the drain waits for it to be dropped.
#[must_use]
pub struct Entry {
    gate: Arc<Gate>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut state = self.gate.state.locked();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            self.gate.idle.notify_waiters();
        }
    }
}

impl State {
    fn ours(&mut self, me: &str, namespace: &str) -> bool {
        let Some(view) = &self.serving else { return false };
        if let Some(ours) = self.ours.get(namespace) {
            return *ours;
        }
        let ours = view.owner(namespace) == Some(me);
        self.ours.insert(namespace.to_owned(), ours);
        ours
    }
}

impl Gate {
    pub fn new(me: String, lease: Duration) -> Arc<Self> {
        Arc::new(Self { me, fence: lease * 2 / 3, state: Mutex::default(), idle: Notify::new() })
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    /// Lets one write in `namespace` through, if this replica serves it now.
    pub fn enter(self: &Arc<Self>, namespace: &str) -> Result<Entry, NotServed> {
        let mut state = self.state.locked();
        if state.renewed.is_none_or(|at| at.elapsed() >= self.fence) {
            return Err(NotServed::Late);
        }
        if !state.ours(&self.me, namespace) {
            return Err(NotServed::Elsewhere(namespace.to_owned()));
        }
        state.in_flight += 1;
        Ok(Entry { gate: self.clone() })
    }

    /// A renewal sent at `at` succeeded.
    pub fn renewed(&self, at: Instant) {
        let mut state = self.state.locked();
        state.renewed = Some(state.renewed.map_or(at, |last| last.max(at)));
    }

    pub fn serve(&self, view: View) {
        let mut state = self.state.locked();
        state.serving = Some(view);
        state.ours.clear();
    }

    /// Lets no write through from now on, and returns once the writes let through are done.
    pub async fn drain(&self) {
        {
            let mut state = self.state.locked();
            state.serving = None;
            state.ours.clear();
        }
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.state.locked().in_flight == 0 {
                return;
            }
            idle.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(members: &[&str]) -> View {
        View::new(members.iter().map(|m| (m.to_string(), 0)), Default::default())
    }

    #[tokio::test(start_paused = true)]
    async fn writes_go_ahead_only_for_served_namespaces_while_the_lease_is_fresh() {
        let gate = Gate::new("a".into(), Duration::from_secs(15));
        gate.serve(view(&["a"]));
        assert_eq!(gate.enter("team").err(), Some(NotServed::Late), "never renewed");
        gate.renewed(Instant::now());
        assert!(gate.enter("team").is_ok());
        gate.serve(view(&["b"]));
        assert_eq!(gate.enter("team").err(), Some(NotServed::Elsewhere("team".into())));
        gate.serve(view(&["a"]));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(gate.enter("team").err(), Some(NotServed::Late), "fenced at two thirds of the lease");
        gate.renewed(Instant::now() - Duration::from_secs(20));
        assert_eq!(gate.enter("team").err(), Some(NotServed::Late), "an older renewal does not move the fence back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_refuses_new_writes_and_waits_for_those_let_through() {
        let gate = Gate::new("a".into(), Duration::from_secs(15));
        gate.renewed(Instant::now());
        gate.serve(view(&["a"]));
        let entry = gate.enter("team").expect("served");
        let draining = tokio::spawn({
            let gate = gate.clone();
            async move { gate.drain().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!draining.is_finished(), "a write is in flight");
        assert!(gate.enter("team").is_err(), "nothing new goes ahead once draining");
        drop(entry);
        draining.await.expect("drained");
    }
}
