//! The status a reconcile writes, from its plan and what stamping it did: the targets' rows,
//! the applied checksum, the conditions and the summaries.

use consulbind_api::{
    ConsulBindingStatus, DryRunStatus,
    conditions::{self, reason},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::{
    carried,
    input::{Consul, Input, Outcome, Plan},
    loss,
};
use crate::{checksum, cluster::health::Health};

/// The status to write after carrying out `plan`.
pub fn status(input: &Input<'_>, plan: &Plan, outcome: &Outcome, now: &Time) -> ConsulBindingStatus {
    let previous = input.previous;
    let desired = plan.desired.as_deref();

    let targets = carried::rows(input, plan, outcome, now);

    // Applied moves only once every planned stamp landed; a failed one is retried next time.
    let applied = match desired {
        Some(d) if plan.hold.is_none() && outcome.failed.is_empty() => Some(d.to_owned()),
        _ => previous.applied_checksum.clone(),
    };
    let changed =
        !outcome.rolled.is_empty() || (previous.applied_checksum.is_some() && applied != previous.applied_checksum);
    let carrying = carried::carrying(previous, plan, &targets);
    let up_to_date =
        applied.is_some() && desired.is_none_or(|d| applied.as_deref() == Some(d)) && carrying == targets.len();

    let mut conditions = Vec::new();
    let mut set = |type_: &str, ok: Option<bool>, reason: &str, message: String| {
        conditions.push(condition(&previous.conditions, type_, ok, reason, message, input.generation, now));
    };

    match &input.consul {
        Consul::Ready(contents) if contents.is_empty() => {
            set(conditions::CONSUL_SYNCED, Some(true), reason::SYNCED, "no Consul keys are bound".into())
        }
        Consul::Ready(contents) => {
            let read = format!("read {} from Consul", count(contents.len(), "key"));
            match input.in_turns {
                None => set(conditions::CONSUL_SYNCED, Some(true), reason::SYNCED, read),
                Some(cycle) => set(
                    conditions::CONSUL_SYNCED,
                    Some(true),
                    reason::WATCHES_IN_TURNS,
                    format!(
                        "{read}; this namespace uses more distinct Consul tokens than its share of the controller's \
                         blocking queries, so its watches take turns and a change may show up to {}s late: use \
                         fewer tokens, or ask for a higher --consul-max-connections",
                        cycle.as_secs().max(1)
                    ),
                ),
            }
        }
        Consul::Failed { reason, message } => set(conditions::CONSUL_SYNCED, Some(false), reason, message.clone()),
    }

    let target_problem = if let Some(((kind, name), error)) = outcome.failed.first() {
        Some((reason::PATCH_FAILED, format!("could not update {kind} {name}: {error}")))
    } else if !input.unserved.is_empty() {
        Some((reason::KIND_NOT_SERVED, input.unserved.join("; ")))
    } else if !input.missing.is_empty() {
        Some((reason::TARGET_MISSING, input.missing.join("; ")))
    } else {
        None
    };
    let (targets_ok, targets_reason, targets_message) = match (&target_problem, &plan.hold) {
        (Some((r, m)), _) => (false, *r, m.clone()),
        (None, Some((r, m))) if !up_to_date => (false, *r, m.clone()),
        _ => (true, reason::UP_TO_DATE, format!("{} the applied content", carry(targets.len()))),
    };
    set(conditions::TARGETS_UPDATED, Some(targets_ok), targets_reason, targets_message);

    // A baseline stays the word until something is rolled, however often the binding is looked at.
    let still_baseline =
        previous.conditions.iter().any(|c| c.type_ == conditions::READY && c.reason == reason::BASELINED)
            && applied == previous.applied_checksum
            && outcome.rolled.is_empty();
    let (ready, ready_reason, ready_message) = match (&plan.hold, &target_problem) {
        // A refused patch needs a person; the hold of the wave that tried it would end by itself.
        (_, Some((r, m))) if *r == reason::PATCH_FAILED => (false, *r, m.clone()),
        // A dry run holding back a rollout is the mode working, not a problem.
        (Some((r, m)), None) if *r == reason::DRY_RUN => (true, *r, m.clone()),
        (Some((r, m)), _) | (None, Some((r, m))) => (false, *r, m.clone()),
        _ if plan.baseline || still_baseline => {
            (true, reason::BASELINED, "recorded the current content as the baseline; nothing was restarted".into())
        }
        _ => {
            let suffix = match () {
                _ if input.spec.suspend => " (rollouts suspended)",
                _ if input.dry_run => " (dry run: nothing is patched)",
                _ => "",
            };
            let carried = format!("{} the current content{suffix}", carry(targets.len()));
            match awaiting_deletion(input) {
                Some(which) => (true, reason::PODS_AWAIT_DELETION, format!("{carried}; {which}")),
                None => (true, reason::UP_TO_DATE, carried),
            }
        }
    };
    set(conditions::READY, Some(ready), ready_reason, ready_message);
    kstatus(&previous.conditions, &mut conditions, input.generation, now);

    let present = plan.keys.iter().filter(|k| k.present).count() + plan.objects.iter().filter(|o| o.present).count();
    ConsulBindingStatus {
        observed_generation: input.generation,
        short_checksum: applied.as_deref().map(|c| checksum::short(c).to_owned()),
        applied_checksum: applied,
        key_summary: Some(format!("{present}/{}", plan.keys.len() + plan.objects.len())),
        target_summary: Some(format!("{carrying}/{}", targets.len())),
        keys: plan.keys.clone(),
        objects: plan.objects.clone(),
        targets,
        last_sync_time: if desired.is_some() { Some(now.clone()) } else { previous.last_sync_time.clone() },
        last_change_time: if changed { Some(now.clone()) } else { previous.last_change_time.clone() },
        observed_spec: Some(loss::spec_digest(input.spec)),
        // Named where the status is written, by the replica that writes it.
        shard: None,
        former_targets: carried::former(previous, input.found, input.generation != previous.observed_generation),
        rollout: match &plan.staged {
            _ if input.staging.is_none() => None,
            Some(step) => step.rollout.clone(),
            None => previous.rollout.clone(),
        },
        dry_run: match desired {
            Some(desired) if input.dry_run => Some(DryRunStatus {
                checksum: desired.to_owned(),
                would_roll: plan.would_roll.iter().map(|(k, n)| format!("{k}/{n}")).collect(),
                reason: plan.why.clone(),
            }),
            _ if input.dry_run => previous.dry_run.clone(),
            _ => None,
        },
        conditions,
    }
}

/// Whether a reason of `Ready=False` is work that ends by itself, as opposed to a problem that
/// waits for someone.
fn ends_by_itself(reason: &str) -> bool {
    [
        reason::PENDING,
        reason::ROLLOUT_IN_PROGRESS,
        reason::WAVE_PAUSED,
        reason::ROLLOUT_BUDGET_EXHAUSTED,
        reason::OUTSIDE_ROLLOUT_WINDOW,
        reason::WRITE_LIMITED,
    ]
    .contains(&reason)
}

/// Each source's checksum in `status`, in order, as a short fingerprint: kept from the last
/// time the targets carried the content, to tell which sources a rollout brings.
pub fn fingerprints(status: &ConsulBindingStatus) -> Vec<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let checksums = status.keys.iter().map(|k| &k.checksum).chain(status.objects.iter().map(|o| &o.checksum));
    checksums
        .map(|c| {
            let mut hasher = DefaultHasher::new();
            c.hash(&mut hasher);
            hasher.finish()
        })
        .collect()
}

/// Adds kstatus's `Reconciling` and `Stalled`, read from the Ready condition in `conditions`:
/// Flux and `kubectl wait` read these. A suspended binding holding a change is neither.
pub fn kstatus(previous: &[Condition], conditions: &mut Vec<Condition>, generation: Option<i64>, now: &Time) {
    let Some(ready) = conditions.iter().find(|c| c.type_ == conditions::READY).cloned() else { return };
    let (reconciling, stalled) = match ready.status.as_str() {
        "True" => (false, false),
        "False" if ready.reason == reason::SUSPENDED => (false, false),
        "False" => (ends_by_itself(&ready.reason), !ends_by_itself(&ready.reason)),
        _ => (true, false),
    };
    let idle = [(conditions::RECONCILING, "no work is under way"), (conditions::STALLED, "nothing waits for a person")];
    for ((type_, idle), on) in idle.into_iter().zip([reconciling, stalled]) {
        // The API server takes no empty message.
        let message = if on { ready.message.clone() } else { idle.to_owned() };
        conditions.push(condition(previous, type_, Some(on), &ready.reason, message, generation, now));
    }
}

/// The longest message a condition keeps, as Kubernetes' own conditions: one that names what a
/// spec holds (every target missing, say) could otherwise make the status too large to write.
pub(super) const MESSAGE_LIMIT: usize = 32 * 1024;

/// A condition, keeping the previous transition time when its status did not change.
pub fn condition(
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
        message: super::report::clip(message, MESSAGE_LIMIT),
        observed_generation: generation,
        last_transition_time,
    }
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

/// "1 target carries", "2 targets carry", "0 targets carry".
/// The `OnDelete` targets whose pods still run an older template, for people to read.
fn awaiting_deletion(input: &Input<'_>) -> Option<String> {
    let waiting: Vec<String> = input
        .health
        .iter()
        .filter_map(|((kind, name), health)| match health {
            Health::AwaitsDeletion(what) => Some(format!("{kind} {name}: {what}")),
            _ => None,
        })
        .collect();
    (!waiting.is_empty()).then(|| waiting.join("; "))
}

fn carry(targets: usize) -> String {
    format!("{} {}", count(targets, "target"), if targets == 1 { "carries" } else { "carry" })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    /// Reconciling and Stalled, as kstatus reads them, after a Ready of `status` and `reason`.
    fn after(status: Option<bool>, reason: &str) -> (String, String, String) {
        let now = Time(Timestamp::UNIX_EPOCH);
        let mut conditions = vec![condition(&[], conditions::READY, status, reason, "why".into(), Some(1), &now)];
        kstatus(&[], &mut conditions, Some(1), &now);
        let of = |type_: &str| conditions.iter().find(|c| c.type_ == type_).unwrap().clone();
        let (reconciling, stalled) = (of(conditions::RECONCILING), of(conditions::STALLED));
        assert_eq!((reconciling.reason.as_str(), stalled.reason.as_str()), (reason, reason));
        assert!(
            !reconciling.message.is_empty() && !stalled.message.is_empty(),
            "the API server takes no empty message"
        );
        (reconciling.status, stalled.status, stalled.message)
    }

    /// A message that names what the spec holds stays within Kubernetes' limit for a condition.
    #[test]
    fn a_condition_message_is_cut_to_the_limit() {
        let now = Time(Timestamp::UNIX_EPOCH);
        let long = format!("Deployment {:?} not found", "w".repeat(700 << 10));
        let c = condition(&[], conditions::READY, Some(false), "TargetMissing", long, Some(1), &now);
        assert!(c.message.len() <= MESSAGE_LIMIT && c.message.starts_with("Deployment \"www"), "{}", c.message.len());
    }

    #[test]
    fn work_that_ends_by_itself_is_reconciling_and_a_problem_for_a_person_is_stalled() {
        let on = |r: &str, s: &str| (r.to_owned(), s.to_owned());
        let pair = |(r, s, _): (String, String, String)| (r, s);
        assert_eq!(pair(after(Some(true), reason::UP_TO_DATE)), on("False", "False"));
        assert_eq!(pair(after(Some(true), reason::BASELINED)), on("False", "False"));
        for waiting in [reason::PENDING, reason::ROLLOUT_IN_PROGRESS, reason::WAVE_PAUSED, reason::WRITE_LIMITED] {
            assert_eq!(pair(after(Some(false), waiting)), on("True", "False"), "{waiting}");
        }
        assert_eq!(pair(after(Some(false), reason::ROLLOUT_BUDGET_EXHAUSTED)), on("True", "False"));
        for stuck in [
            reason::INVALID_SPEC,
            reason::ACCESS_DENIED,
            reason::KEY_MISSING,
            reason::TARGET_MISSING,
            reason::ROLLOUT_HALTED,
            reason::CONSUL_UNREACHABLE,
        ] {
            assert_eq!(pair(after(Some(false), stuck)), on("False", "True"), "{stuck}");
        }
        assert_eq!(pair(after(Some(false), reason::SUSPENDED)), on("False", "False"), "suspended is neither");
        assert_eq!(pair(after(None, reason::PENDING)), on("True", "False"), "not known yet");
        assert_eq!(after(Some(false), reason::KEY_MISSING).2, "why", "Ready's message on the condition that is True");
    }

    /// A condition keeps its transition time while its status stays, and takes the time of this
    /// write when it turns; another type's time is never taken.
    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_turns() {
        let (then, now) = (Time(Timestamp::UNIX_EPOCH), Time("2026-01-02T03:04:05Z".parse().unwrap()));
        let previous = [condition(&[], conditions::READY, Some(true), reason::UP_TO_DATE, "ok".into(), Some(1), &then)];
        let at = |type_: &str, ok| {
            condition(&previous, type_, Some(ok), reason::UP_TO_DATE, "now".into(), Some(2), &now).last_transition_time
        };
        assert_eq!(at(conditions::READY, true), then);
        assert_eq!(at(conditions::READY, false), now);
        assert_eq!(at(conditions::CONSUL_SYNCED, true), now);
    }
}
