//! Schedules in which the binding's namespace moves between the two replicas of a shard ring
//! while Consul and the targets change: its owner drains it (between reconciles or part-way
//! through one's writes), is killed, or stops (SIGSTOP) part-way through a reconcile for longer
//! than its Lease while the other takes over. Each replica runs the real [`Gate`], and every
//! write of a reconcile (each stamp, each event, the status) passes it, as the controller's do.
//! The replica that takes over starts from the status, listed afresh.
//!
//! Beside the decision invariants, from what the model knows of the ring: a write lands only
//! from the replica the model lets serve the namespace at that moment.

use std::sync::Arc;

use super::*;
use crate::shards::{Gate, NotServed, Served, View};

const LEASE: Duration = Duration::from_secs(15);
const NAMESPACE: &str = "ns";

/// How the owner lets the namespace go.
#[derive(Clone, Copy, Debug)]
pub(super) enum Cut {
    /// The ring changed: the owner drains, refusing its writes from then on.
    Drain,
    /// The owner stops for longer than its Lease; the other replica takes over meanwhile, and the
    /// stopped one's writes go on when it resumes.
    Freeze,
}

pub(super) struct Ring {
    gates: [Arc<Gate>; 2],
    /// The replica the model lets write in the namespace: none while it is handed over.
    owner: Option<usize>,
    /// The replica whose controller memory runs the binding.
    running: Option<usize>,
    /// The owner lets go once this many more of its stamps have passed.
    cut: Option<(Cut, usize)>,
}

impl Ring {
    pub(super) fn new() -> Self {
        Self { gates: [0, 1].map(|r| Gate::new(name(r), LEASE)), owner: None, running: None, cut: None }
    }
}

fn name(replica: usize) -> String {
    format!("r{replica}")
}

fn alone(replica: usize) -> View {
    View::new([(name(replica), 0)], BTreeMap::new())
}

impl Sim {
    /// A replica takes the namespace: the other one (or, after a kill, either), from the status,
    /// its bindings listed afresh.
    pub(super) fn take_over(&mut self) {
        let pick = self.rng.usize(..2);
        let Some(ring) = self.ring.as_mut() else { return };
        let next = match (ring.owner, ring.running) {
            (Some(owner), _) => owner,
            (None, Some(last)) => 1 - last,
            (None, None) => pick,
        };
        let between = ring.running.map(alone).into_iter().collect();
        let gate = &ring.gates[next];
        gate.renewed(Instant::now());
        gate.serve(Served::new(alone(next), &name(next), between));
        gate.listed(&alone(next), None);
        (ring.owner, ring.running, ring.cut) = (Some(next), Some(next), None);
        self.note(format_args!("r{next} serves the namespace"));
    }

    /// The running replica is killed: nothing of it writes again.
    pub(super) fn killed(&mut self) {
        if let Some(ring) = self.ring.as_mut() {
            (ring.owner, ring.running, ring.cut) = (None, None, None);
        }
    }

    /// The owner will let the namespace go once `after` more of its stamps passed.
    pub(super) fn arm(&mut self, cut: Cut, after: usize) -> Option<String> {
        let ring = self.ring.as_mut()?;
        let owner = ring.owner.filter(|o| ring.running == Some(*o) && ring.cut.is_none())?;
        ring.cut = Some((cut, after));
        Some(format!("r{owner} will let the namespace go ({cut:?}) after {after} more stamps"))
    }

    /// The running replica is still alive: it renewed its Lease lately.
    pub(super) fn renewed(&mut self) {
        if let Some(ring) = &self.ring
            && let Some(running) = ring.running
        {
            ring.gates[running].renewed(Instant::now());
        }
    }

    /// Whether the running replica's gate lets its next write (a stamp, or the status) through;
    /// an armed cut comes first when due. Stamps count down to it, so that most cuts fall
    /// between the stamps of one reconcile, or between its stamps and its status.
    pub(super) async fn admit(&mut self, stamp: bool) -> Result<(), NotServed> {
        let Some(running) = self.ring.as_ref().and_then(|r| r.running) else { return Ok(()) };
        match self.ring.as_ref().and_then(|r| r.cut) {
            Some((cut, 0)) => self.let_go(running, cut).await,
            Some((cut, after)) if stamp => self.ring.as_mut().expect("a ring").cut = Some((cut, after - 1)),
            _ => {}
        }
        self.gate_open()
    }

    /// Whether the running replica's gate lets a write through now. One it lets through from a
    /// replica the model no longer lets serve the namespace breaks the ring's invariant.
    pub(super) fn gate_open(&mut self) -> Result<(), NotServed> {
        let Some(ring) = self.ring.as_ref() else { return Ok(()) };
        let Some(running) = ring.running else { return Ok(()) };
        let entry = ring.gates[running].enter(NAMESPACE)?;
        if ring.owner != Some(running) {
            let owner = ring.owner;
            self.fail(format_args!("r{running} wrote in the namespace while the model gave it to {owner:?}"));
        }
        drop(entry);
        Ok(())
    }

    async fn let_go(&mut self, running: usize, cut: Cut) {
        let ring = self.ring.as_mut().expect("a ring");
        ring.cut = None;
        match cut {
            Cut::Drain => {
                ring.owner = None;
                ring.gates[running].drain().await;
                self.note(format_args!("  r{running} drains the namespace part-way through its writes"));
            }
            Cut::Freeze => {
                // Past the Lease, the other replica may serve the namespace.
                ring.owner = Some(1 - running);
                self.note(format_args!("  r{running} stops for longer than its Lease; r{} may serve", 1 - running));
                tokio::time::advance(LEASE + Duration::from_secs(1)).await;
            }
        }
    }

    /// After a reconcile: a replica that let the namespace go forgets its bindings there, as its
    /// list for the new view drops them.
    pub(super) fn let_go_forgotten(&mut self) -> bool {
        let Some(ring) = self.ring.as_mut() else { return false };
        let Some(running) = ring.running.filter(|r| ring.owner != Some(*r)) else { return false };
        ring.running = None;
        self.note(format_args!("r{running} forgets the namespace's bindings"));
        true
    }

    /// The running replica is ready to reconcile the namespace: its gate says so.
    pub(super) fn ready(&self) -> bool {
        self.ring.as_ref().is_none_or(|r| r.running.is_some_and(|running| r.gates[running].ready(NAMESPACE)))
    }

    /// Whether some write of the reconcile under way was refused.
    pub(super) fn cut_short(&self) -> bool {
        self.ring.as_ref().is_some_and(|r| r.running != r.owner)
    }
}

/// With the namespace handed between two replicas of a shard ring, drained part-way through a
/// reconcile's writes, or stopped past the Lease while the other took over.
#[test]
fn schedules_with_the_namespace_handed_between_replicas_keep_every_invariant() {
    run_seeds(Kind::Handover);
}
