//! Every write of a sharded replica passes here: it goes ahead only for a namespace of the view
//! the replica serves, and only while the replica's Lease is fresh. A drain waits for the
//! writes let through, so that the next view is shown only once they are done.
//!
//! A namespace gained (or regained after another replica may have served it) is held until the
//! bindings are listed afresh: until then what the replica holds of them is not their status.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::ring::{Served, View};
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
    serving: Option<Served>,
    /// Whether each namespace asked about is this replica's in `serving`, and ready.
    ours: HashMap<String, bool>,
    /// The bindings were listed afresh since `serving` began: every namespace, or these.
    listed_all: bool,
    listed: HashSet<String>,
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
    /// Whether `namespace` is this replica's now, and its bindings' records are true.
    fn ours(&mut self, namespace: &str) -> bool {
        let Some(served) = &self.serving else { return false };
        if let Some(ours) = self.ours.get(namespace) {
            return *ours;
        }
        let listed = self.listed_all || self.listed.contains(namespace);
        let ours = served.owns(namespace) && (listed || served.continues(namespace));
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
        if !state.ours(namespace) {
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

    pub fn serve(&self, served: Served) {
        let mut state = self.state.locked();
        *state =
            State { serving: Some(served), in_flight: state.in_flight, renewed: state.renewed, ..State::default() };
    }

    /// Whether a reconcile of a binding in `namespace` may go on: it is this replica's, and what
    /// the replica holds of it is true. Otherwise it waits, reading and deciding nothing.
    pub fn ready(&self, namespace: &str) -> bool {
        self.state.locked().ours(namespace)
    }

    /// The bindings of `scope` (every namespace when `None`) were listed afresh for `view`.
    pub fn listed(&self, view: &View, scope: Option<&str>) {
        let mut state = self.state.locked();
        if state.serving.as_ref().is_none_or(|s| s.view != *view) {
            return;
        }
        match scope {
            None => state.listed_all = true,
            Some(namespace) => drop(state.listed.insert(namespace.to_owned())),
        }
        state.ours.clear();
    }

    /// Lets no write through from now on, and returns once the writes let through are done.
    pub async fn drain(&self) {
        {
            let mut state = self.state.locked();
            state.serving = None;
            state.ours.clear();
            state.listed_all = false;
            state.listed.clear();
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

    /// `view` served by a, its bindings listed afresh.
    fn listed(gate: &Gate, members: &[&str]) {
        gate.serve(Served::new(view(members), "a", Vec::new()));
        gate.listed(&view(members), None);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_go_ahead_only_for_served_namespaces_while_the_lease_is_fresh() {
        let gate = Gate::new("a".into(), Duration::from_secs(15));
        listed(&gate, &["a"]);
        assert_eq!(gate.enter("team").err(), Some(NotServed::Late), "never renewed");
        gate.renewed(Instant::now());
        assert!(gate.enter("team").is_ok());
        listed(&gate, &["b"]);
        assert_eq!(gate.enter("team").err(), Some(NotServed::Elsewhere("team".into())));
        listed(&gate, &["a"]);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(gate.enter("team").err(), Some(NotServed::Late), "fenced at two thirds of the lease");
        gate.renewed(Instant::now() - Duration::from_secs(20));
        assert_eq!(gate.enter("team").err(), Some(NotServed::Late), "an older renewal does not move the fence back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_namespace_gained_waits_until_its_bindings_are_listed_afresh_and_one_kept_does_not() {
        let gate = Gate::new("a".into(), Duration::from_secs(15));
        gate.renewed(Instant::now());
        let (before, after) = (view(&["a", "b"]), view(&["a"]));
        let kept = (0..50).map(|i| format!("team-{i}")).find(|ns| before.owner(ns) == Some("a")).unwrap();
        let gained = (0..50).map(|i| format!("team-{i}")).find(|ns| before.owner(ns) == Some("b")).unwrap();
        gate.serve(Served::new(after.clone(), "a", vec![before]));
        assert!(gate.ready(&kept) && gate.enter(&kept).is_ok());
        assert!(!gate.ready(&gained) && gate.enter(&gained).is_err());
        gate.listed(&view(&["a", "c"]), None);
        assert!(!gate.ready(&gained), "a list for another view counts for nothing");
        gate.listed(&after, Some(&kept));
        assert!(!gate.ready(&gained), "nor one of another namespace");
        gate.listed(&after, Some(&gained));
        assert!(gate.ready(&gained) && gate.enter(&gained).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_refuses_new_writes_and_waits_for_those_let_through() {
        let gate = Gate::new("a".into(), Duration::from_secs(15));
        gate.renewed(Instant::now());
        listed(&gate, &["a"]);
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
