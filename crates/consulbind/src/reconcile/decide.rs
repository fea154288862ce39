//! The second stage of a reconcile, free of I/O: from what [`observe`](super::observe) read and
//! the binding's record, what to write. The controller and the simulators run this same code.

use std::time::Duration;

use consulbind_api::{ConsulBindingStatus, conditions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use tokio::time::Instant;

use super::{
    input::{Consul, Input, Outcome, Plan},
    loss,
    observe::{Observed, Read},
    plan, report, restore,
    state::Record,
    status,
    upgrade::{self, Upgraded},
};

/// What a reconcile writes.
pub enum Decision<'a> {
    /// The binding is not served: the status that says why, and when to look again.
    Refused { status: Box<ConsulBindingStatus>, then: Action },
    /// Decide again after this: the values read for an upgrade are no longer the content.
    Retry(Duration),
    /// The namespace is over its write limit until then: only the status that says so.
    WriteLimited(Instant),
    /// Stamp and report what the plan says.
    Act(Box<Act<'a>>),
}

/// A plan, and what it was made of.
pub struct Act<'a> {
    pub read: &'a Read,
    pub plan: Plan,
    /// The status and stamps, with checksums of older formats read as current ones.
    upgraded: Option<Upgraded>,
    restore: Option<Duration>,
    /// This replica's first read found a restore that no status written since shows.
    pub restored: bool,
}

impl<'a> Act<'a> {
    pub fn input(&'a self, observed: &'a Observed<'_>) -> Input<'a> {
        let input = observed.input(self.read, self.restore, self.restored);
        match &self.upgraded {
            Some(upgraded) => Input { previous: &upgraded.previous, live: &upgraded.live, ..input },
            None => input,
        }
    }
}

/// Decides a reconcile of what `observed` holds, keeping in `record` what the next one needs.
pub fn decide<'a>(observed: &'a Observed<'_>, record: &mut Record, now: Instant) -> Decision<'a> {
    let previous = &observed.previous;
    let read = match &observed.read {
        Ok(read) => read,
        Err(refused) => {
            let time = Time(observed.clock);
            let status = report::not_served(previous, observed.generation, refused.reason, &refused.message, &time);
            return Decision::Refused { status: Box::new(status), then: refused.then.clone() };
        }
    };
    // Either hold is marked when the reconcile started, so that one which then finds the
    // content settled ends the grace.
    let held = loss::held_for_lost_content(previous);
    let reset = restore::latest_reset(read.contents());
    let (restore, restored) =
        record.restore.grace(held, read.found_restored, reset, observed.started, read.restore_grace);
    let restored = restored && read.consul_ready();
    let mut act = Act { read, plan: Plan::default(), upgraded: None, restore, restored };
    if let Some(values) = &read.values {
        match upgrade::upgrade(&act.input(observed), values) {
            Ok(upgraded) => act.upgraded = upgraded,
            // The content changed in between: its wake brings the next try.
            Err(_) => return Decision::Retry(Duration::from_secs(1)),
        }
    }
    let mut input = act.input(observed);
    if let Some(rescoped) = upgrade::rescoped(&input) {
        act.upgraded = Some(rescoped);
        input = act.input(observed);
    }
    let pending = record.pending.clone();
    let plan = plan::plan(&input, &mut record.pending, now);
    // A namespace over its write limit writes nothing but the status that says so. A change
    // the plan took as settled stays pending, so that it rolls once the namespace is within.
    if let Some(free) = read.write_limited {
        let unheld = || status::status(&input, &plan, &Outcome::default(), &Time(observed.clock));
        if report::writes(previous, &plan, unheld) {
            if record.pending.is_none() {
                record.pending = pending;
            }
            return Decision::WriteLimited(free);
        }
    }
    act.plan = plan;
    Decision::Act(Box::new(act))
}

/// What a reconcile tells once its stamps are written.
pub struct Report {
    pub status: ConsulBindingStatus,
    pub events: Vec<Event>,
    /// Look again then, to end a debounce or a wave's pause.
    pub wake_at: Option<Instant>,
    /// Consul, the objects and every stamp went well: nothing needs a look soon.
    pub healthy: bool,
}

/// An event on the binding.
pub enum Event {
    /// Workloads were rolled; the fingerprints of the sources that the targets carried before,
    /// to name what changed ([`status::fingerprints`]).
    RolledOut { applied: Option<Vec<u64>> },
    /// A dry run would roll workloads.
    DryRun { reason: &'static str, message: String },
    /// The targets' references changed: what they read now is recorded as what they run.
    Rebased(String),
    /// The content's first sight, recorded without a rollout.
    Baselined(String),
    /// Something a person should change.
    Warning { reason: &'static str, message: String },
    /// Something a person did that the binding's history should keep.
    Notice { reason: &'static str, message: String },
}

/// The status and the event that report `act` with what its stamps did. `settled`: the record's
/// [`Written::settled`](super::state::Written::settled).
pub fn conclude(
    observed: &Observed<'_>,
    act: &Act<'_>,
    outcome: &Outcome,
    settled: Option<&(String, Vec<u64>)>,
) -> Report {
    let previous = &observed.previous;
    let plan = &act.plan;
    let input = act.input(observed);
    let mut status = status::status(&input, plan, outcome, &Time(observed.clock));
    let mut events: Vec<Event> = caution(observed, act.read, &mut status).into_iter().collect();
    let event = if !outcome.rolled.is_empty() {
        let applied = settled.filter(|(checksum, _)| previous.applied_checksum.as_ref() == Some(checksum));
        Some(Event::RolledOut { applied: applied.map(|(_, fingerprints)| fingerprints.clone()) })
    } else if !plan.would_roll.is_empty() && status.dry_run != previous.dry_run {
        plan.hold.as_ref().map(|(reason, message)| Event::DryRun { reason, message: message.clone() })
    } else if !plan.rebased.is_empty() {
        Some(Event::Rebased(rebased(plan)))
    } else if plan.baseline && previous.applied_checksum.is_none() {
        let short = report::short(&status);
        Some(Event::Baselined(format!("recorded checksum {short} as the baseline; nothing was restarted")))
    } else {
        None
    };
    events.extend(event);
    if !outcome.rolled.is_empty() && plan.staged.as_ref().is_some_and(|s| s.let_through) {
        let names: Vec<String> = outcome.rolled.iter().map(|(k, n)| format!("{k}/{n}")).collect();
        let message = format!(
            "rolled {} outside the rollout windows: the annotation {} lets checksum {} through",
            names.join(", "),
            consulbind_api::ROLL_OUTSIDE_WINDOW,
            report::short(&status)
        );
        events.push(Event::Notice { reason: conditions::reason::ROLLED_OUTSIDE_WINDOW, message });
    }
    let healthy = outcome.failed.is_empty() && matches!(input.consul, Consul::Ready(_)) && input.objects.is_ok();
    Report { status, events, wake_at: plan.wake_at, healthy }
}

/// Shows what the spec does that newer API servers refuse, as the `SpecWarning` condition; a
/// Warning event when it is new.
fn caution(observed: &Observed<'_>, read: &Read, status: &mut ConsulBindingStatus) -> Option<Event> {
    let message = read.caution.clone()?;
    let reason = conditions::reason::MAX_DELAY_BELOW_QUIET_PERIOD;
    let previous = &observed.previous.conditions;
    let new = !previous.iter().any(|c| c.type_ == conditions::SPEC_WARNING && c.message == message);
    let time = Time(observed.clock);
    let warning = status::condition(
        previous,
        conditions::SPEC_WARNING,
        Some(true),
        reason,
        message.clone(),
        observed.generation,
        &time,
    );
    status.conditions.push(warning);
    new.then_some(Event::Warning { reason, message })
}

fn rebased(plan: &Plan) -> String {
    let list: Vec<String> = plan.rebased.iter().map(|(k, n)| format!("{k}/{n}")).collect();
    let one = list.len() == 1;
    format!(
        "the ConfigMaps and Secrets that {} reference{} changed (a template change, or includeTargetReferences set); \
         recorded what {} now read as the content {} run with, and restarted nothing: a template change rolls its \
         workload itself",
        list.join(", "),
        if one { "s" } else { "" },
        if one { "it" } else { "they" },
        if one { "it" } else { "they" },
    )
}

/// Whether a written status showed what this replica's first read found: Consul and the objects
/// were read.
pub fn shown(act: &Act<'_>) -> bool {
    act.restored && act.read.objects.is_ok()
}
