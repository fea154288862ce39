//! The last stage of a reconcile: the writes a [`Decision`] calls for, in their order, through a
//! [`Port`]. The controller's port writes to the cluster; a simulator's writes to its model.

use std::time::Duration;

use consulbind_api::{ConsulBinding, ConsulBindingStatus, conditions};
use kube::{
    Resource,
    runtime::{controller::Action, events::EventType},
};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{
    Context, RETRY,
    decide::{self, Decision, Event, Report},
    input::{Outcome, Plan},
    observe::{Observed, Read},
    read, report, stamp,
    state::Record,
};
use crate::{BindingRef, Error, binding_ref};

/// Where a reconcile's writes go.
#[allow(async_fn_in_trait)]
pub trait Port {
    /// Runs `f` on the binding's record.
    fn record<R>(&mut self, f: impl FnOnce(&mut Record) -> R) -> R;
    /// Holds back the stamps of the targets the plan does not roll, for another binding's write
    /// of the same checksum to carry.
    fn hold(&mut self, plan: &Plan);
    /// Stamps the workloads of `plan.roll`.
    async fn stamp(&mut self, read: &Read, plan: &Plan) -> Outcome;
    /// Other bindings' stamps on the same workloads wait for this one until then.
    fn due(&mut self, at: Option<Instant>);
    fn publish(&mut self, event: Event, read: &Read, status: &ConsulBindingStatus, outcome: &Outcome);
    /// Writes `status` where it says something new.
    async fn status(&mut self, previous: &ConsulBindingStatus, status: &ConsulBindingStatus) -> Result<(), Error>;
    /// Shows that the namespace is over its write limit until `free`, and says when to look again.
    async fn write_limited(&mut self, previous: &ConsulBindingStatus, free: Instant) -> Result<Action, Error>;
}

/// Makes the writes of `decision`, and says when to look at the binding again.
pub async fn apply(port: &mut impl Port, observed: &Observed<'_>, decision: Decision<'_>) -> Result<Action, Error> {
    let previous = &observed.previous;
    let act = match decision {
        Decision::Refused { status, then } => {
            port.status(previous, &status).await?;
            port.record(|record| record.owed = None);
            return Ok(then);
        }
        Decision::Retry(wait) => return Ok(Action::requeue(wait)),
        Decision::WriteLimited(free) => return port.write_limited(previous, free).await,
        Decision::Act(act) => act,
    };
    port.hold(&act.plan);
    let outcome = port.stamp(act.read, &act.plan).await;
    if !outcome.failed.is_empty() && act.settled.is_some() {
        // The retry rolls what failed without waiting out the quiet period again.
        port.record(|record| record.pending = record.pending.take().or_else(|| act.settled.clone()));
    }
    port.due(act.plan.wake_at);
    // What the targets carried last, to name what a rollout, or a halt, brings.
    let halted = act.plan.hold.as_ref().is_some_and(|(reason, _)| *reason == conditions::reason::ROLLOUT_HALTED);
    let settled = match outcome.rolled.is_empty() && !halted {
        true => None,
        false => port.record(|record| record.written.settled.clone()),
    };
    let Report { status, events, wake_at, healthy } = decide::conclude(observed, &act, &outcome, settled.as_ref());
    // A status write that fails is retried, and the retry would tell the rest again.
    let (of_stamps, shown_events): (Vec<_>, Vec<_>) = events.into_iter().partition(Event::of_stamps);
    for event in of_stamps {
        port.publish(event, act.read, &status, &outcome);
    }
    let shown = decide::shown(&act);
    if let Err(error) = port.status(previous, &status).await {
        // The only record of the stamps that landed: the next reconcile plans on it.
        if !outcome.rolled.is_empty() {
            port.record(|record| record.owed = Some(Box::new(status)));
        }
        return Err(error);
    }
    for event in shown_events {
        port.publish(event, act.read, &status, &outcome);
    }
    port.record(|record| {
        record.owed = None;
        record.wrote(shown, act.plan.desired.as_deref(), &status, observed.started);
    });
    if act.withhold {
        // What was withheld rolls now that the status records what landed.
        return Ok(Action::requeue(Duration::from_millis(50)));
    }
    // A Consul failure retries on its own, but a binding that is not healthy is looked at soon:
    // an object unreadable for want of a rule changes nothing the watches see once it is granted.
    // A healthy one waits for a wake, or for the resync that looks at every binding in turn.
    Ok(match wake_at {
        Some(at) => Action::requeue(at.saturating_duration_since(Instant::now()).max(Duration::from_millis(50))),
        None if healthy => Action::await_change(),
        None => Action::requeue(RETRY),
    })
}

/// The controller's port: the API server, the desk of shared stamps, events and metrics.
pub struct Cluster<'a> {
    pub ctx: &'a Context,
    pub binding: &'a ConsulBinding,
    pub oref: BindingRef,
    pub started: Instant,
}

impl<'a> Cluster<'a> {
    pub fn new(ctx: &'a Context, binding: &'a ConsulBinding, started: Instant) -> Self {
        Self { ctx, binding, oref: binding_ref(binding), started }
    }
}

impl Port for Cluster<'_> {
    fn record<R>(&mut self, f: impl FnOnce(&mut Record) -> R) -> R {
        self.ctx.states.update(&self.oref, f)
    }

    fn hold(&mut self, plan: &Plan) {
        stamp::hold(self.ctx, &self.oref, plan);
    }

    async fn stamp(&mut self, read: &Read, plan: &Plan) -> Outcome {
        let ctx = self.ctx;
        if plan.roll.is_empty() {
            ctx.desk.planned(&self.oref);
            return Outcome::default();
        }
        if let Some(seen) = read::latest_change(read.contents()) {
            ctx.metrics.stage("consul_to_reconcile", self.started.saturating_duration_since(seen));
        }
        ctx.metrics.stage("reconcile_to_patch", self.started.elapsed());
        stamp::stamp_all(ctx, &self.oref, plan, &read.resolved.versions).await
    }

    fn due(&mut self, at: Option<Instant>) {
        self.ctx.desk.due(&self.oref, at.map(Instant::into_std));
    }

    fn publish(&mut self, event: Event, read: &Read, status: &ConsulBindingStatus, outcome: &Outcome) {
        let (ctx, binding) = (self.ctx, self.binding);
        let (reason, message) = match event {
            Event::RolledOut { applied } => {
                return report::rolled_out(ctx, binding, applied.as_deref(), status, outcome, read.contents());
            }
            Event::DryRun { reason, message } => {
                info!(binding = %self.oref, %message, "dry run");
                (reason, message)
            }
            Event::Rebased(message) => {
                info!(binding = %self.oref, %message, "references changed");
                (conditions::reason::BASELINED, message)
            }
            Event::Baselined(message) => (conditions::reason::BASELINED, message),
            Event::Notice { reason, message } => {
                info!(binding = %self.oref, %reason, %message, "rolled outside the rollout windows");
                (reason, message)
            }
            Event::Warning { reason, message } => {
                warn!(binding = %self.oref, %reason, %message, "the binding's spec needs a change");
                let reference = binding.object_ref(&());
                return report::publish(ctx, reference, EventType::Warning, reason, message);
            }
        };
        report::publish(ctx, binding.object_ref(&()), EventType::Normal, reason, message);
    }

    async fn status(&mut self, previous: &ConsulBindingStatus, status: &ConsulBindingStatus) -> Result<(), Error> {
        report::status(self.ctx, self.binding, previous, status).await
    }

    async fn write_limited(&mut self, previous: &ConsulBindingStatus, free: Instant) -> Result<Action, Error> {
        report::write_limited(self.ctx, self.binding, previous, free).await
    }
}

#[cfg(test)]
mod tests {
    use consulbind_api::{ConsulBindingSpec, TargetRef, WorkloadKind};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::{checksum, cluster::workloads::Resolved};

    /// A port whose stamps land, and whose status writes land unless `refused`, keeping the
    /// record and the events told.
    #[derive(Default)]
    struct Landing {
        record: Record,
        refused: bool,
        told: Vec<&'static str>,
    }

    impl Port for Landing {
        fn record<R>(&mut self, f: impl FnOnce(&mut Record) -> R) -> R {
            f(&mut self.record)
        }
        fn hold(&mut self, _: &Plan) {}
        async fn stamp(&mut self, _: &Read, plan: &Plan) -> Outcome {
            Outcome { rolled: plan.roll.clone(), failed: Vec::new() }
        }
        fn due(&mut self, _: Option<Instant>) {}
        fn publish(&mut self, event: Event, _: &Read, _: &ConsulBindingStatus, _: &Outcome) {
            self.told.push(event.kind());
        }
        async fn status(&mut self, _: &ConsulBindingStatus, _: &ConsulBindingStatus) -> Result<(), Error> {
            match self.refused {
                true => Err(Error::Config("refused".into())),
                false => Ok(()),
            }
        }
        async fn write_limited(&mut self, _: &ConsulBindingStatus, _: Instant) -> Result<Action, Error> {
            Ok(Action::await_change())
        }
    }

    fn spec() -> ConsulBindingSpec {
        ConsulBindingSpec {
            include_target_references: true,
            targets: vec![TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), selector: None }],
            ..Default::default()
        }
    }

    /// One reconcile of `spec`'s binding through `port`, its read changed by `change`.
    async fn reconcile(
        spec: &ConsulBindingSpec,
        port: &mut Landing,
        change: impl FnOnce(&mut Read),
    ) -> Result<Action, Error> {
        let key = checksum::Key::new([7; checksum::KEY_LEN]);
        let mut read = crate::sim::read_of(spec, key, Vec::new(), Resolved::default(), Vec::new(), Vec::new());
        change(&mut read);
        let observed = Observed {
            spec,
            generation: Some(1),
            previous: ConsulBindingStatus::default(),
            started: Instant::now(),
            clock: Timestamp::now(),
            read: Ok(read),
        };
        let decision = decide::decide(&observed, &mut port.record, Instant::now());
        apply(port, &observed, decision).await
    }

    /// When a reconcile of a settled binding says to look again, with its objects read or not.
    async fn then(objects_read: bool) -> Action {
        let unread = |read: &mut Read| {
            if !objects_read {
                read.objects = Err(("ObjectUnreadable", "forbidden".into()));
            }
        };
        reconcile(&spec(), &mut Landing::default(), unread).await.expect("every write lands")
    }

    #[tokio::test]
    async fn a_healthy_binding_waits_for_a_wake_and_one_that_is_not_is_looked_at_soon() {
        assert_eq!(then(true).await, Action::await_change());
        // A rule granted later changes nothing the watches see.
        assert_eq!(then(false).await, Action::requeue(RETRY));
    }

    /// An event that tells what the status shows waits for the status: a write that fails is
    /// retried, and each retry would raise it again.
    #[tokio::test]
    async fn an_event_of_the_status_is_raised_once_the_status_is_written() {
        let caution = |read: &mut Read| read.caution = Some("maxDelay below quietPeriod".into());
        let mut port = Landing { refused: true, ..Landing::default() };
        for _ in 0..2 {
            assert!(reconcile(&spec(), &mut port, caution).await.is_err());
        }
        assert_eq!(port.told, Vec::<&str>::new(), "told while the status was refused");
        port.refused = false;
        reconcile(&spec(), &mut port, caution).await.expect("written");
        assert_eq!(port.told, ["Warning", "Baselined"]);
    }
}
