//! The decision at the heart of a reconcile, free of I/O: given what Consul and the cluster
//! look like now and what the status says was applied, which targets to roll and what to report.

use std::collections::BTreeMap;

use consul_kv::KvEntry;
use consulbind_api::{
    ConsulBindingSpec, ConsulBindingStatus, KeySource, KeyStatus, TargetStatus, WorkloadKind,
    conditions::{self, reason},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tokio::time::Instant;

use crate::{
    checksum::{self, Source},
    debounce::{Decision, Pending, Window},
};

/// A workload found for one of the binding's targets.
pub type Workload = (WorkloadKind, String);

/// The content of one bound key or prefix; no entries means missing.
pub struct KeyContent<'a> {
    pub source: &'a KeySource,
    pub entries: &'a [KvEntry],
}

/// What the Consul side looks like for this binding.
pub enum Consul<'a> {
    Ready(Vec<KeyContent<'a>>),
    /// A watch has not answered yet.
    Waiting,
    /// The keys cannot be read; the reason is one of [`conditions::reason`].
    Failed { reason: &'static str, message: String },
}

pub struct Input<'a> {
    pub spec: &'a ConsulBindingSpec,
    pub window: Window,
    pub generation: Option<i64>,
    pub previous: &'a ConsulBindingStatus,
    pub consul: Consul<'a>,
    /// Workloads found for the targets, sorted and unique.
    pub found: &'a [Workload],
    /// A sentence for each target that matched nothing.
    pub missing: &'a [String],
}

/// What to do, before any of it is done.
#[derive(Debug, Default)]
pub struct Plan {
    /// Checksum of the current content, when every key could be read.
    pub desired: Option<String>,
    pub keys: Vec<KeyStatus>,
    /// Workloads to stamp with `desired`.
    pub roll: Vec<Workload>,
    /// Why the content is not being rolled out now: a reason and a message.
    pub hold: Option<(&'static str, String)>,
    /// Reconcile again at this time to finish a debounce.
    pub wake_at: Option<Instant>,
    /// First sight of the content: recorded without a rollout.
    pub baseline: bool,
}

pub fn plan(input: &Input<'_>, pending: &mut Option<Pending>, now: Instant) -> Plan {
    let contents = match &input.consul {
        Consul::Ready(contents) => contents,
        Consul::Waiting => {
            return Plan {
                keys: input.previous.keys.clone(),
                hold: Some((reason::WAITING_FOR_CONSUL, "waiting for the first answer from Consul".into())),
                ..Plan::default()
            };
        }
        Consul::Failed { reason, message } => {
            return Plan { keys: input.previous.keys.clone(), hold: Some((reason, message.clone())), ..Plan::default() };
        }
    };
    let keys: Vec<KeyStatus> = contents.iter().map(key_status).collect();
    let desired = checksum::checksum(&contents.iter().map(source).collect::<Vec<_>>());
    let mut plan = Plan { desired: Some(desired.clone()), keys, ..Plan::default() };

    let missing: Vec<&str> =
        contents.iter().filter(|c| !c.source.optional && c.entries.is_empty()).map(|c| c.source.key.as_str()).collect();
    if !missing.is_empty() {
        *pending = None;
        plan.hold = Some((
            reason::KEY_MISSING,
            format!(
                "required Consul {} {} missing; rollouts are held until {} again (or mark it optional)",
                if missing.len() == 1 { "key" } else { "keys" },
                quoted(&missing),
                if missing.len() == 1 { "it exists" } else { "they exist" },
            ),
        ));
        return plan;
    }

    let Some(applied) = input.previous.applied_checksum.as_deref() else {
        plan.baseline = !input.spec.rollout.as_ref().is_some_and(|r| r.on_bind);
        if !plan.baseline {
            plan.roll = input.found.to_vec();
        }
        return plan;
    };

    let carried = carried_checksums(input.previous);
    let on_bind = input.spec.rollout.as_ref().is_some_and(|r| r.on_bind);
    // New workloads start with the current content, so they are only rolled when asked to.
    let behind: Vec<Workload> = input
        .found
        .iter()
        .filter(|w| carried.get(*w).map_or(on_bind, |c| *c != desired))
        .cloned()
        .collect();
    if applied == desired && behind.is_empty() {
        *pending = None;
        return plan;
    }
    if input.spec.suspend {
        plan.hold = Some((reason::SUSPENDED, "rollouts are suspended; the change is rolled out on resume".into()));
        return plan;
    }
    match Pending::observe(pending, &desired, now, input.window) {
        Decision::RollNow => {
            *pending = None;
            plan.roll = behind;
        }
        Decision::WaitUntil(at) => {
            let secs = at.saturating_duration_since(now).as_secs_f64();
            plan.hold = Some((reason::PENDING, format!("content changed; rolling out in {secs:.1}s unless it changes again")));
            plan.wake_at = Some(at);
        }
    }
    plan
}

/// The outcome of stamping the planned workloads.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rolled: Vec<Workload>,
    /// Workload and error message.
    pub failed: Vec<(Workload, String)>,
}

/// The status to write after carrying out `plan`.
pub fn status(input: &Input<'_>, plan: &Plan, outcome: &Outcome, now: &Time) -> ConsulBindingStatus {
    let previous = input.previous;
    let desired = plan.desired.as_deref();

    let targets: Vec<TargetStatus> = input
        .found
        .iter()
        .filter_map(|w| {
            let old = previous.targets.iter().find(|t| t.kind == w.0 && t.name == w.1);
            let (checksum, last_rolled_time) = match old {
                _ if outcome.rolled.contains(w) => (desired?.to_owned(), Some(now.clone())),
                Some(old) => (old.checksum.clone(), old.last_rolled_time.clone()),
                // Found now and not rolled: it started with the content of today.
                None => (desired.or(previous.applied_checksum.as_deref())?.to_owned(), None),
            };
            Some(TargetStatus { kind: w.0, name: w.1.clone(), checksum, last_rolled_time })
        })
        .collect();

    // Applied moves only once every planned stamp landed; a failed one is retried next time.
    let applied = match desired {
        Some(d) if plan.hold.is_none() && outcome.failed.is_empty() => Some(d.to_owned()),
        _ => previous.applied_checksum.clone(),
    };
    let changed = !outcome.rolled.is_empty() || (previous.applied_checksum.is_some() && applied != previous.applied_checksum);
    let carrying = targets.iter().filter(|t| Some(&t.checksum) == applied.as_ref()).count();
    let up_to_date = applied.is_some() && desired.is_none_or(|d| applied.as_deref() == Some(d)) && carrying == targets.len();

    let mut conditions = Vec::new();
    let mut set = |type_: &str, ok: Option<bool>, reason: &str, message: String| {
        conditions.push(condition(&previous.conditions, type_, ok, reason, message, input.generation, now));
    };

    match &input.consul {
        Consul::Ready(contents) => {
            set(conditions::CONSUL_SYNCED, Some(true), reason::SYNCED, format!("read {} from Consul", count(contents.len(), "key")))
        }
        Consul::Waiting => {
            set(conditions::CONSUL_SYNCED, None, reason::WAITING_FOR_CONSUL, "waiting for the first answer from Consul".into())
        }
        Consul::Failed { reason, message } => set(conditions::CONSUL_SYNCED, Some(false), reason, message.clone()),
    }

    let target_problem = if let Some(((kind, name), error)) = outcome.failed.first() {
        Some((reason::PATCH_FAILED, format!("could not update {kind} {name}: {error}")))
    } else if !input.missing.is_empty() {
        Some((reason::TARGET_MISSING, input.missing.join("; ")))
    } else {
        None
    };
    let (targets_ok, targets_reason, targets_message) = match (&target_problem, &plan.hold) {
        (Some((r, m)), _) => (false, *r, m.clone()),
        (None, Some((r, m))) if !up_to_date => (false, *r, m.clone()),
        _ => (true, reason::UP_TO_DATE, format!("{} carry the applied content", count(targets.len(), "target"))),
    };
    set(conditions::TARGETS_UPDATED, Some(targets_ok), targets_reason, targets_message);

    let (ready, ready_reason, ready_message) = match (&plan.hold, &target_problem) {
        (Some((r, m)), _) | (None, Some((r, m))) => (false, *r, m.clone()),
        _ if plan.baseline => (true, reason::BASELINED, "recorded the current content as the baseline; nothing was restarted".into()),
        _ => {
            let suffix = if input.spec.suspend { " (rollouts suspended)" } else { "" };
            (true, reason::UP_TO_DATE, format!("targets carry the current Consul content{suffix}"))
        }
    };
    set(conditions::READY, Some(ready), ready_reason, ready_message);

    let present = plan.keys.iter().filter(|k| k.present).count();
    ConsulBindingStatus {
        observed_generation: input.generation,
        short_checksum: applied.as_deref().map(|c| checksum::short(c).to_owned()),
        applied_checksum: applied,
        key_summary: Some(format!("{present}/{}", plan.keys.len())),
        target_summary: Some(format!("{carrying}/{}", targets.len())),
        keys: plan.keys.clone(),
        targets,
        last_sync_time: if desired.is_some() { Some(now.clone()) } else { previous.last_sync_time.clone() },
        last_change_time: if changed { Some(now.clone()) } else { previous.last_change_time.clone() },
        conditions,
    }
}

fn carried_checksums(status: &ConsulBindingStatus) -> BTreeMap<Workload, String> {
    status.targets.iter().map(|t| ((t.kind, t.name.clone()), t.checksum.clone())).collect()
}

fn source<'a>(content: &KeyContent<'a>) -> Source<'a> {
    if content.source.recurse {
        Source::Prefix {
            prefix: &content.source.key,
            entries: content.entries.iter().map(|e| (e.key.as_str(), e.value.as_slice())).collect(),
        }
    } else {
        Source::Key {
            key: &content.source.key,
            value: content.entries.iter().find(|e| e.key == content.source.key).map(|e| e.value.as_slice()),
        }
    }
}

fn key_status(content: &KeyContent<'_>) -> KeyStatus {
    let entries = match content.entries.iter().position(|e| e.key == content.source.key) {
        _ if content.source.recurse => content.entries,
        Some(i) => &content.entries[i..=i],
        None => &[],
    };
    KeyStatus {
        key: content.source.key.clone(),
        recurse: content.source.recurse,
        present: !entries.is_empty(),
        entries: content.source.recurse.then(|| u32::try_from(entries.len()).unwrap_or(u32::MAX)),
        checksum: checksum::checksum(&[source(content)]),
        modify_index: entries.iter().map(|e| e.modify_index).max(),
    }
}

/// A condition, keeping the previous transition time when its status did not change.
fn condition(
    previous: &[Condition],
    type_: &str,
    ok: Option<bool>,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = match ok {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

fn quoted(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
}
