//! What a reconcile tells people: the binding's status, written only when it says something
//! new, and events on the binding and the workloads. One of the two places that write to the
//! cluster.

use consulbind_api::{ConsulBinding, ConsulBindingStatus, TargetState, TargetStatus, WorkloadKind, conditions};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::events::{EventType, Reporter},
};
use serde_json::json;
use tracing::{debug, info, warn};

use super::{context::Context, input::Outcome, read::latest_change, status};
use crate::{
    Error, binding_ref, checksum,
    metrics::{RolloutLabels, WorkloadLabels},
    watches::KeyState,
};

/// Field manager for binding status.
pub const STATUS_MANAGER: &str = "consulbind";

/// Writes the status when it changed, and raises an event when Ready turns to a new problem.
pub async fn status(
    ctx: &Context,
    binding: &ConsulBinding,
    previous: &ConsulBindingStatus,
    status: &ConsulBindingStatus,
) -> Result<(), Error> {
    // The replica that serves the binding, written with the first status after a handover.
    let sharded;
    let status = match ctx.writes.gate().map(|gate| gate.me()) {
        Some(me) if status.shard.as_deref() != Some(me) => {
            sharded = ConsulBindingStatus { shard: Some(me.to_owned()), ..status.clone() };
            &sharded
        }
        _ => status,
    };
    if needs_write(previous, status) {
        write(ctx, binding, status).await?;
    }
    told(ctx, binding, previous, status);
    Ok(())
}

/// Writes the whole status of `binding`.
async fn write(ctx: &Context, binding: &ConsulBinding, status: &ConsulBindingStatus) -> Result<(), Error> {
    let namespace = binding.namespace().unwrap_or_default();
    let api: Api<ConsulBinding> = Api::namespaced(ctx.client.clone(), &namespace);
    let uid = binding.uid().unwrap_or_default();
    let params = PatchParams { field_manager: Some(STATUS_MANAGER.into()), ..PatchParams::default() };
    let patch = status_patch(&uid, status);
    let slot = match ready(status).is_some_and(|c| c.reason == conditions::reason::WRITE_LIMITED) {
        true => ctx.writes.notice(&namespace).await,
        false => ctx.writes.permit(&namespace).await,
    }?;
    api.patch_status(&binding.name_any(), &params, &Patch::<()>::Json(patch)).await.map_err(Error::Status)?;
    drop(slot);
    ctx.states.wrote_status(&binding_ref(binding), uid, status);
    Ok(())
}

/// Raises an event when Ready turns to a new problem, once the status shows it: a status write
/// that fails is retried, and each retry would raise it again.
fn told(ctx: &Context, binding: &ConsulBinding, previous: &ConsulBindingStatus, status: &ConsulBindingStatus) {
    let oref = binding_ref(binding);
    let (old, new) = (ready(previous), ready(status));
    if let Some(new) = new {
        let state = match new.status.as_str() {
            "True" => "True",
            "False" => "False",
            _ => "Unknown",
        };
        ctx.states.set_ready(&oref, state);
        let is_new_problem = new.status == "False" && old.is_none_or(|o| o.reason != new.reason);
        let quiet = [
            conditions::reason::PENDING,
            conditions::reason::SUSPENDED,
            conditions::reason::ROLLOUT_IN_PROGRESS,
            conditions::reason::WAVE_PAUSED,
        ];
        if is_new_problem && new.reason == conditions::reason::ROLLOUT_HALTED {
            ctx.metrics.rollout_halts.inc();
        }
        if is_new_problem && !quiet.contains(&new.reason.as_str()) {
            warn!(binding = %oref, reason = %new.reason, message = %new.message, "binding not ready");
            publish(ctx, binding.object_ref(&()), EventType::Warning, &new.reason, new.message.clone());
        }
    }
}

fn ready(status: &ConsulBindingStatus) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == conditions::READY)
}

/// Whether a reconcile would write: stamp a workload, or a status that says something new.
pub fn writes(
    previous: &ConsulBindingStatus,
    plan: &super::input::Plan,
    status: impl FnOnce() -> ConsulBindingStatus,
) -> bool {
    !plan.roll.is_empty() || needs_write(previous, &status())
}

/// Tells the binding that its namespace is over `--namespace-write-limit`, with the one status
/// write and event that take none of the limit, and looks again once it may write.
pub async fn write_limited(
    ctx: &Context,
    binding: &ConsulBinding,
    previous: &ConsulBindingStatus,
    free: tokio::time::Instant,
) -> Result<kube::runtime::controller::Action, Error> {
    let namespace = binding.namespace().unwrap_or_default();
    let limit = ctx.writes.rate().map(|r| r.to_string()).unwrap_or_default();
    ctx.metrics.writes_held.get_or_create(&crate::metrics::NamespaceLabels { namespace: namespace.clone() }).inc();
    let message = format!(
        "namespace {namespace} is over its write limit of {limit} (--namespace-write-limit), which counts every \
         workload stamp, status and event the controller writes there; this binding's changes wait, coalesced, \
         and roll out once the namespace is within it"
    );
    let now = Time(Timestamp::now());
    let held = not_served(previous, binding.metadata.generation, conditions::reason::WRITE_LIMITED, &message, &now);
    status(ctx, binding, previous, &held).await?;
    let wait = free.saturating_duration_since(tokio::time::Instant::now());
    Ok(kube::runtime::controller::Action::requeue(wait.max(std::time::Duration::from_millis(50))))
}

/// The status of a binding that cannot be served (an invalid spec, a controller bug): Ready
/// and TargetsUpdated say why; the rest stays as it was, but for the states of former targets
/// after an edit: the edit that releases a rollout held for a deleted target
/// ([`carried::former`](super::carried::former)) is not used up by a reconcile that could not
/// act on it.
pub fn not_served(
    previous: &ConsulBindingStatus,
    generation: Option<i64>,
    reason: &str,
    message: &str,
    now: &Time,
) -> ConsulBindingStatus {
    let replaced = [conditions::READY, conditions::TARGETS_UPDATED, conditions::RECONCILING, conditions::STALLED];
    let mut conditions: Vec<_> =
        previous.conditions.iter().filter(|c| !replaced.contains(&c.type_.as_str())).cloned().collect();
    for type_ in [conditions::READY, conditions::TARGETS_UPDATED] {
        let condition =
            status::condition(&previous.conditions, type_, Some(false), reason, message.into(), generation, now);
        conditions.push(condition);
    }
    status::kstatus(&previous.conditions, &mut conditions, generation, now);
    let mut status = ConsulBindingStatus { observed_generation: generation, conditions, ..previous.clone() };
    if previous.observed_generation != generation {
        // A target may be gone by now, unseen: the halt it would keep is the edit's to release.
        let unsettled = |t: &TargetStatus| matches!(t.state, Some(TargetState::Rolling | TargetState::Halted));
        let rows = status.targets.iter_mut().filter(|t| unsettled(t)).chain(&mut status.former_targets);
        rows.for_each(|row| (row.state, row.message) = (None, None));
    }
    status
}

pub fn short(status: &ConsulBindingStatus) -> &str {
    status.short_checksum.as_deref().unwrap_or("-")
}

/// Logs, counts and raises the events of a rollout, on the binding and on each workload.
pub fn rolled_out(
    ctx: &Context,
    binding: &ConsulBinding,
    applied: Option<&[u64]>,
    status: &ConsulBindingStatus,
    outcome: &Outcome,
    contents: &[KeyState],
) {
    let namespace = binding.namespace().unwrap_or_default();
    let name = binding.name_any();
    let list: Vec<String> = outcome.rolled.iter().map(|(k, n)| format!("{k}/{n}")).collect();
    let checksum = status.applied_checksum.as_deref().map_or("-", checksum::short).to_owned();
    let changed = changed_sources(applied, status);
    let because = match changed.is_empty() {
        true => String::new(),
        false => format!(" after a change of {}", changed.join(", ")),
    };
    info!(binding = %format!("{namespace}/{name}"), %checksum, targets = %list.join(", "), changed = %changed.join(", "), "rolled out a change");
    if let Some(latest) = latest_change(contents) {
        ctx.metrics.change_to_rollout.observe(latest.elapsed().as_secs_f64());
    }
    let note = format!("rolled out content {checksum} to {}{because}", list.join(", "));
    publish(ctx, binding.object_ref(&()), EventType::Normal, conditions::reason::ROLLED_OUT, note);
    for (kind, workload) in &outcome.rolled {
        ctx.metrics
            .rollouts
            .get_or_create(&RolloutLabels { namespace: namespace.clone(), binding: name.clone(), kind: kind.as_str() })
            .inc();
        let labels = WorkloadLabels { namespace: namespace.clone(), kind: kind.as_str(), workload: workload.clone() };
        ctx.metrics.workload_rollouts.get_or_create(&labels).inc();
        let reference = workload_reference(ctx.workloads.api_version(*kind), &namespace, *kind, workload);
        let row = status.targets.iter().find(|t| t.kind == *kind && t.name == *workload);
        let checksum = row.map_or(checksum.as_str(), |t| checksum::short(&t.checksum));
        let note = format!("ConsulBinding {name} changed the pod template annotation to {checksum}{because}");
        publish(ctx, reference, EventType::Normal, conditions::reason::ROLLED_OUT, note);
    }
}

/// The sources that differ from `applied` (fingerprints of when the targets last carried the
/// content), for people to read: `Consul key "app/db"`, `ConfigMap "app"`.
/// A workload, as the events of its rollout name it: `kubectl describe` lists them under it.
fn workload_reference(api_version: &str, namespace: &str, kind: WorkloadKind, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.as_str().into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

pub(super) fn changed_sources(applied: Option<&[u64]>, status: &ConsulBindingStatus) -> Vec<String> {
    let now = status::fingerprints(status);
    let Some(applied) = applied.filter(|a| a.len() == now.len()) else { return Vec::new() };
    let keys = status.keys.iter().map(|k| format!("Consul {} {:?}", if k.recurse { "prefix" } else { "key" }, k.key));
    let names = keys.chain(status.objects.iter().map(|o| format!("{} {:?}", o.kind, o.name)));
    names.zip(now.iter().zip(applied)).filter(|(_, (now, then))| now != then).map(|(name, _)| name).collect()
}

/// Records an event without holding up the reconcile: the next change of this binding waits
/// for the reconcile to end, and events are not part of the decision.
///
/// Not through kube's `Recorder`: it counts a repeat by object, type and reason alone and
/// patches the first event's note into the series, so a second `RolledOut` within six minutes
/// would show the sources the first named; it names the event after the object whatever its
/// length, which the API server refuses past 253; and it keeps each event for minutes. The
/// controller raises an event only on news, so there are few repeats to count.
pub fn publish(ctx: &Context, reference: ObjectReference, type_: EventType, reason: &str, note: String) {
    let api: Api<Event> = Api::namespaced(ctx.client.clone(), reference.namespace.as_deref().unwrap_or("default"));
    let event = event(&ctx.reporter, reference, type_, reason, note, Timestamp::now());
    let reason = reason.to_owned();
    let (writes, namespace) = (ctx.writes.clone(), reference_namespace(&event));
    let notice = reason == conditions::reason::WRITE_LIMITED;
    tokio::spawn(async move {
        let slot = match notice {
            true => writes.notice(&namespace).await,
            false => writes.permit(&namespace).await,
        };
        let _slot = match slot {
            Ok(slot) => slot,
            Err(error) => return debug!(%error, reason, "event not recorded"),
        };
        if let Err(error) = api.create(&PostParams::default(), &event).await {
            warn!(%error, reason, "could not record event");
        }
    });
}

fn reference_namespace(event: &Event) -> String {
    event.metadata.namespace.clone().unwrap_or_default()
}

/// The API server refuses a longer note.
const NOTE_LIMIT: usize = 1024;
/// Room in an object name for the event name's suffix: a dot and up to 16 hex digits.
const NAME_ROOM: usize = 253 - 17;

/// An event as the API server takes it, whatever the length of the note and of the object's
/// name: the note is cut to its limit, and the name is cut so that the event's stays within 253.
fn event(
    reporter: &Reporter,
    reference: ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
    now: Timestamp,
) -> Event {
    let object = reference.name.as_deref().unwrap_or(&reporter.controller);
    let object = object.get(..NAME_ROOM).unwrap_or(object).trim_end_matches(['.', '-']);
    let name = format!("{object}.{:x}", now.as_nanosecond());
    Event {
        metadata: ObjectMeta { name: Some(name), namespace: reference.namespace.clone(), ..ObjectMeta::default() },
        action: Some("Reconcile".into()),
        reason: Some(reason.into()),
        note: Some(clip(note, NOTE_LIMIT)),
        type_: Some(match type_ {
            EventType::Normal => "Normal".into(),
            EventType::Warning => "Warning".into(),
        }),
        event_time: Some(MicroTime(now)),
        regarding: Some(reference),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(reporter.instance.clone().unwrap_or_else(|| reporter.controller.clone())),
        ..Event::default()
    }
}

/// `text` in at most `limit` bytes, cut at a character with an ellipsis.
pub fn clip(mut text: String, limit: usize) -> String {
    const MORE: &str = "…";
    if text.len() > limit {
        let mut end = limit - MORE.len();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(MORE);
    }
    text
}

/// The whole status, for the binding of `uid` only: a reconcile still running for a binding
/// that was deleted and made again under its name must not give the new one its status. A JSON
/// patch, since the status subresource ignores the uid of a merge patch; and the whole status,
/// since a server-side apply that drops a field sends it to the 1.20 API server as null, which
/// the schema refuses.
fn status_patch(uid: &str, status: &ConsulBindingStatus) -> json_patch::Patch {
    let ops = json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "add", "path": "/status", "value": status},
    ]);
    serde_json::from_value(ops).expect("a JSON patch")
}

/// Whether the status says anything new. The sync time alone is not news: writing it on every
/// reconcile would make an idle controller write for nothing.
pub fn needs_write(previous: &ConsulBindingStatus, status: &ConsulBindingStatus) -> bool {
    let strip = |s: &ConsulBindingStatus| ConsulBindingStatus { last_sync_time: None, ..s.clone() };
    strip(previous) != strip(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stays_within_the_api_servers_limits_for_a_long_note_and_name() {
        let reporter = Reporter { controller: "consulbind".into(), instance: Some("pod-1".into()) };
        let reference = |name: String| ObjectReference {
            kind: Some("Deployment".into()),
            namespace: Some("ns".into()),
            name: Some(name),
            ..ObjectReference::default()
        };
        let now: Timestamp = "2026-11-24T10:00:00Z".parse().unwrap();
        let long = format!("{}.-{}", "a".repeat(NAME_ROOM - 2), "b".repeat(20));
        let note = "é".repeat(600);
        let event = event(&reporter, reference(long), EventType::Normal, "RolledOut", note, now);
        let name = event.metadata.name.unwrap();
        assert!(name.len() <= 253 && name.starts_with(&"a".repeat(NAME_ROOM - 2)), "{name}");
        assert!(!name.contains(".-") && !name.contains(".."), "{name}");
        let note = event.note.unwrap();
        assert!(note.len() <= NOTE_LIMIT && note.ends_with('…') && note.starts_with("éé"), "{}", note.len());
        assert_eq!(event.regarding.unwrap().namespace.as_deref(), Some("ns"));
        assert_eq!(event.reporting_instance.as_deref(), Some("pod-1"));

        let short = event_note(&reporter, reference("web".into()), "rolled out".into(), now);
        assert_eq!(short, ("web.".to_owned() + &format!("{:x}", now.as_nanosecond()), "rolled out".to_owned()));
    }

    #[test]
    fn a_rollouts_event_on_a_workload_names_it_whole() {
        let reference = workload_reference("apps/v1", "shop", WorkloadKind::StatefulSet, "db");
        let named = [reference.api_version, reference.kind, reference.namespace, reference.name];
        assert_eq!(named, ["apps/v1", "StatefulSet", "shop", "db"].map(|s| Some(s.to_owned())));
    }

    #[test]
    fn an_event_says_who_reported_what_and_when_in_the_objects_namespace() {
        let reporter = Reporter { controller: "consulbind".into(), instance: None };
        let reference = ObjectReference { namespace: Some("ns".into()), name: Some("b".into()), ..Default::default() };
        let now: Timestamp = "2026-11-24T10:00:00Z".parse().unwrap();
        let event = event(&reporter, reference, EventType::Warning, "KeyMissing", "gone".into(), now);
        let told = (
            event.metadata.namespace.as_deref(),
            event.action.as_deref(),
            event.reason.as_deref(),
            event.type_.as_deref(),
            event.event_time.map(|t| t.0),
            event.reporting_controller.as_deref(),
            event.reporting_instance.as_deref(),
        );
        let expected = (
            Some("ns"),
            Some("Reconcile"),
            Some("KeyMissing"),
            Some("Warning"),
            Some(now),
            Some("consulbind"),
            Some("consulbind"),
        );
        assert_eq!(told, expected);
    }

    fn event_note(reporter: &Reporter, reference: ObjectReference, note: String, now: Timestamp) -> (String, String) {
        let event = event(reporter, reference, EventType::Normal, "RolledOut", note, now);
        (event.metadata.name.unwrap(), event.note.unwrap())
    }

    #[test]
    fn the_status_is_written_whole_and_only_to_the_binding_it_was_made_for() {
        let status = ConsulBindingStatus { applied_checksum: Some("c".into()), ..Default::default() };
        let patch = serde_json::to_value(status_patch("uid-1", &status)).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
                {"op": "add", "path": "/status", "value": {"appliedChecksum": "c"}},
            ])
        );
        let mut binding =
            json!({"metadata": {"uid": "uid-2"}, "status": {"appliedChecksum": "old", "keySummary": "1/1"}});
        assert!(json_patch::patch(&mut binding, &status_patch("uid-1", &status)).is_err(), "a new binding");
        assert_eq!(binding["status"]["appliedChecksum"], "old");
        json_patch::patch(&mut binding, &status_patch("uid-2", &status)).unwrap();
        assert_eq!(binding["status"], json!({"appliedChecksum": "c"}), "fields no longer set are gone");
    }

    #[test]
    fn needs_write_ignores_a_fresh_sync_time_only() {
        let old = ConsulBindingStatus {
            last_sync_time: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
            ..Default::default()
        };
        let later =
            ConsulBindingStatus { last_sync_time: Some(Time("2026-01-01T05:00:00Z".parse().unwrap())), ..old.clone() };
        assert!(!needs_write(&old, &later));
        assert!(needs_write(&old, &ConsulBindingStatus { applied_checksum: Some("x".into()), ..later }));
    }

    /// A rollout's event names the sources whose content changed since the record of what the
    /// targets carried, and none when that record is of other sources.
    #[test]
    fn a_rollout_names_the_sources_whose_content_changed() {
        use consulbind_api::{KeyStatus, ObjectKind, ObjectStatus};
        let key = |key: &str, recurse, checksum: &str| KeyStatus {
            key: key.into(),
            recurse,
            checksum: checksum.into(),
            ..KeyStatus::default()
        };
        let status = ConsulBindingStatus {
            keys: vec![key("app/a", false, "1"), key("app/", true, "2")],
            objects: vec![ObjectStatus {
                kind: ObjectKind::ConfigMap,
                name: "cm".into(),
                checksum: "3".into(),
                ..ObjectStatus::default()
            }],
            ..ConsulBindingStatus::default()
        };
        let now = status::fingerprints(&status);
        let mut then = now.clone();
        then[1] ^= 1;
        then[2] ^= 1;
        assert_eq!(changed_sources(Some(&then), &status), ["Consul prefix \"app/\"", "ConfigMap \"cm\""]);
        assert_eq!(changed_sources(Some(&now), &status), Vec::<String>::new());
        assert_eq!(changed_sources(Some(&then[..2]), &status), Vec::<String>::new(), "a record of other sources");
        assert_eq!(changed_sources(None, &status), Vec::<String>::new());
    }

    /// A binding not served says why in Ready and TargetsUpdated, once each, and keeps the
    /// rest of what its status said.
    #[test]
    fn a_binding_not_served_keeps_its_other_conditions() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let now = Time("2026-11-24T10:00:00Z".parse().unwrap());
        let condition = |type_: &str| Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: "Fine".into(),
            message: String::new(),
            last_transition_time: now.clone(),
            observed_generation: Some(1),
        };
        let synced = condition(conditions::CONSUL_SYNCED);
        let previous = ConsulBindingStatus {
            conditions: vec![synced.clone(), condition(conditions::READY)],
            ..ConsulBindingStatus::default()
        };
        let status = not_served(&previous, Some(2), "InvalidSpec", "spec.targets is empty", &now);
        assert!(status.conditions.contains(&synced), "{:?}", status.conditions);
        for type_ in [conditions::READY, conditions::TARGETS_UPDATED] {
            let found: Vec<_> = status.conditions.iter().filter(|c| c.type_ == type_).collect();
            assert_eq!(found.len(), 1, "{type_}");
            assert_eq!((found[0].status.as_str(), found[0].reason.as_str()), ("False", "InvalidSpec"));
        }
    }

    /// An event is named after its object, whole when the name leaves room for the suffix, and
    /// counts against the write limit of the object's namespace.
    #[test]
    fn an_event_keeps_an_object_name_that_leaves_room_and_its_namespace() {
        let reporter = Reporter { controller: "consulbind".into(), instance: None };
        let name = "n".repeat(236);
        let reference =
            ObjectReference { name: Some(name.clone()), namespace: Some("team".into()), ..ObjectReference::default() };
        let now: Timestamp = "2026-11-24T10:00:00Z".parse().unwrap();
        let event = event(&reporter, reference, EventType::Normal, "RolledOut", "note".into(), now);
        assert!(event.metadata.name.as_deref().is_some_and(|n| n.starts_with(&format!("{name}."))));
        assert_eq!(reference_namespace(&event), "team");
    }

    /// A note of exactly the limit is kept whole; a longer one is cut to fill the limit, not
    /// less, and never inside a character.
    #[test]
    fn a_note_is_cut_only_past_the_limit_and_then_to_the_limit() {
        let exact = "a".repeat(NOTE_LIMIT);
        assert_eq!(clip(exact.clone(), NOTE_LIMIT), exact);
        let cut = clip("a".repeat(NOTE_LIMIT + 1), NOTE_LIMIT);
        assert_eq!(cut.len(), NOTE_LIMIT);
        assert!(cut.ends_with('…'));
        // 'é' is two bytes: the cut falls back to the character's start.
        let cut = clip("é".repeat(NOTE_LIMIT), NOTE_LIMIT);
        assert_eq!(cut.len(), NOTE_LIMIT - 1);
    }
}
