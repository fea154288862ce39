//! One reconcile of one binding: read, plan, stamp, report.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use consul_kv::{KvQuery, Token, jitter};
use consulbind_api::{ConsulBinding, ConsulBindingSpec, ConsulBindingStatus, RolloutMode, conditions, parse_duration};
use futures::StreamExt;
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        controller::Action,
        events::{Event, EventType, Recorder, Reporter},
        reflector::Store,
    },
};
use serde_json::json;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::{
    checksum,
    debounce::{Pending, Window},
    express::Express,
    interest::Interest,
    metrics::{Metrics, ReadyLabels, RolloutLabels},
    names,
    plan::{self, Consul, Input, KeyContent, Live, Outcome},
    policy::Policy,
    tokens::{Lookup, TOKEN_LABEL, Tokens},
    watches::{BindingRef, KeyState, Watches, binding_ref},
    workloads::{self, Workloads},
};

/// Field manager for binding status.
pub const STATUS_MANAGER: &str = "consulbind";
/// How often a settled binding is looked at again, as a safety net: Consul, the workloads and
/// the token Secrets all wake it when they change. Such a reconcile writes nothing unless
/// something changed, and jitter keeps many bindings from coming due together.
const RESYNC: Duration = Duration::from_secs(600);
/// How many workloads of one binding are patched at once.
const STAMP_CONCURRENCY: usize = 8;
/// How soon a binding that is not healthy is looked at again.
const RETRY: Duration = Duration::from_secs(15);
const DEFAULT_QUIET: Duration = Duration::from_secs(2);
const DEFAULT_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing status: {0}")]
    Status(#[source] kube::Error),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Status(_) => "status_error",
        }
    }
}

pub struct Context {
    pub client: Client,
    /// Who records the events. Each event gets a recorder of its own: kube's keeps every event
    /// it sent for minutes, to count repeats, which at thousands of bindings is megabytes, and
    /// the controller raises an event only when there is news.
    pub reporter: Reporter,
    pub watches: Watches,
    pub workloads: Workloads,
    pub tokens: Tokens,
    /// What the default token may read in each namespace.
    pub policy: Policy,
    /// Keys every checksum, so that none can be checked against a guessed value.
    pub checksum_key: checksum::Key,
    /// `--dry-run`: every binding reports instead of rolling.
    pub dry_run: bool,
    pub bindings: Store<ConsulBinding>,
    /// Which bindings a workload or Secret event wakes.
    pub interest: Arc<Mutex<Interest>>,
    pub metrics: Arc<Metrics>,
    pub pending: Mutex<HashMap<BindingRef, Pending>>,
    /// Ready state of every binding this replica serves, across scopes, for the metric.
    pub ready: Arc<Mutex<HashMap<BindingRef, &'static str>>>,
    /// What this replica last stamped on each workload, and the generation that came of it, for
    /// as long as the workload cache has not caught up.
    pub stamped: Mutex<HashMap<(String, plan::Workload), (i64, String)>>,
    /// The status this replica last wrote, by binding uid. Only the leader writes status, so it
    /// is never older than the cache, which may not have seen the write yet when a Consul
    /// change wakes the binding again.
    pub written: Mutex<HashMap<BindingRef, (String, ConsulBindingStatus)>>,
    /// Which bindings are being reconciled, and the runs that start on a Consul wake.
    pub express: Arc<Express>,
}

impl Context {
    /// Forgets a deleted binding: its watches, debounce and metrics.
    pub fn forget(&self, binding: &BindingRef) {
        self.watches.release(binding);
        self.interest.lock().unwrap().remove(binding);
        self.pending.lock().unwrap().remove(binding);
        self.written.lock().unwrap().remove(binding);
        self.set_ready(binding, None);
    }

    /// Drops the copy of the status this replica wrote once the cache shows it, so that the
    /// copies do not add up to a second store of every status.
    pub fn cached(&self, binding: &ConsulBinding) {
        let oref = binding_ref(binding);
        let mut written = self.written.lock().unwrap();
        let Some((uid, status)) = written.get(&oref) else { return };
        if binding.uid().as_ref() == Some(uid) && same_as_stored(binding.status.as_ref(), status) {
            written.remove(&oref);
        }
    }

    /// Forgets every binding for which `keep` is false.
    pub fn retain(&self, keep: impl Fn(&BindingRef) -> bool) {
        self.watches.retain(&keep);
        self.interest.lock().unwrap().retain(&keep);
        self.pending.lock().unwrap().retain(|b, _| keep(b));
        self.written.lock().unwrap().retain(|b, _| keep(b));
        let gone: Vec<BindingRef> = self.ready.lock().unwrap().keys().filter(|b| !keep(b)).cloned().collect();
        for binding in gone {
            self.set_ready(&binding, None);
        }
    }

    /// Moves the binding between the ready-state gauges; costs the same however many bindings.
    fn set_ready(&self, binding: &BindingRef, state: Option<&'static str>) {
        let mut ready = self.ready.lock().unwrap();
        let old = match state {
            Some(s) => ready.insert(binding.clone(), s),
            None => ready.remove(binding),
        };
        if old != state {
            let gauge = |ready| self.metrics.bindings.get_or_create(&ReadyLabels { ready }).clone();
            old.map(|s| gauge(s).dec());
            state.map(|s| gauge(s).inc());
        }
    }
}

pub async fn reconcile(binding: Arc<ConsulBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    let oref = binding_ref(&binding);
    let _running = ctx.express.enter(&oref).await;
    // An express run may have written the status while this one waited.
    let binding = ctx.bindings.get(&oref).unwrap_or(binding);
    reconcile_marked(binding, &ctx).await
}

/// A reconcile by a caller that holds the binding's running mark.
pub async fn reconcile_marked(binding: Arc<ConsulBinding>, ctx: &Context) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&binding, ctx).await;
    let label = match &result {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    ctx.metrics.reconciled(label, started.elapsed());
    result
}

async fn reconcile_inner(binding: &ConsulBinding, ctx: &Context) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let namespace = binding.namespace().unwrap_or_default();
    let name = binding.name_any();
    let oref = binding_ref(binding);
    let previous = last_status(ctx, binding, &oref);
    let spec = &binding.spec;

    let window = match validate(spec) {
        Ok(window) => window,
        Err(message) => {
            ctx.watches.release(&oref);
            ctx.interest.lock().unwrap().remove(&oref);
            let status = invalid_status(binding, &previous, &message);
            report(ctx, binding, &previous, &status).await?;
            return Ok(Action::await_change());
        }
    };

    let mut contents = Vec::new();
    let source = match token(ctx, &namespace, spec) {
        TokenSource::Default => match ctx.policy.check(&namespace, spec) {
            Ok(()) => TokenSource::Default,
            Err(message) => TokenSource::Forbidden(message),
        },
        source => source,
    };
    let consul = match source {
        TokenSource::Invalid(message) => {
            ctx.watches.release(&oref);
            Consul::Failed { reason: conditions::reason::TOKEN_SECRET_INVALID, message }
        }
        // Refused before Consul is asked: the token would have read it.
        TokenSource::Forbidden(message) => {
            ctx.watches.release(&oref);
            Consul::Failed { reason: conditions::reason::DEFAULT_TOKEN_FORBIDDEN, message }
        }
        source => {
            contents = subscribe(ctx, &oref, &queries(spec, source.into_token()));
            match consul_view(spec, &contents) {
                Some(consul) => consul,
                // Consul answers within moments, and its first answer wakes the binding: writing
                // "waiting" first would double the writes of a cold start, and after a restart
                // would flap Ready.
                None => return Ok(Action::requeue(RETRY)),
            }
        }
    };
    let mut resolved = ctx.workloads.resolve(&namespace, &spec.targets, &names::annotation_key(&name));
    trust_own_stamps(ctx, &namespace, &mut resolved);
    ctx.interest.lock().unwrap().set(&oref, spec, &resolved.found);
    let input = Input {
        key: &ctx.checksum_key,
        spec,
        window,
        generation: binding.metadata.generation,
        previous: &previous,
        consul,
        found: &resolved.found,
        live: &resolved.live,
        missing: &resolved.missing,
        unserved: &resolved.unserved,
        dry_run: ctx.dry_run || spec.rollout.as_ref().and_then(|r| r.mode) == Some(RolloutMode::DryRun),
    };
    let upgraded = plan::upgrade_legacy(&input);
    let input = match &upgraded {
        Some(upgraded) => Input { previous: &upgraded.previous, live: &upgraded.live, ..input },
        None => input,
    };

    let plan = {
        let mut pending = ctx.pending.lock().unwrap();
        let mut entry = pending.remove(&oref);
        let plan = plan::plan(&input, &mut entry, Instant::now());
        if let Some(entry) = entry {
            pending.insert(oref.clone(), entry);
        }
        plan
    };

    let outcome = match &plan.desired {
        Some(desired) if !plan.roll.is_empty() => {
            if let Some(seen) = latest_change(&contents) {
                ctx.metrics.stage("consul_to_reconcile", started.saturating_duration_since(seen));
            }
            ctx.metrics.stage("reconcile_to_patch", started.elapsed());
            stamp_all(ctx, &namespace, &name, &plan, desired).await
        }
        _ => Outcome::default(),
    };
    let now = Time(Timestamp::now());
    let status = plan::status(&input, &plan, &outcome, &now);

    if !outcome.rolled.is_empty() {
        rolled_out(ctx, binding, &status, &outcome, &contents);
    } else if !plan.would_roll.is_empty() && status.dry_run != previous.dry_run {
        if let Some((reason, message)) = &plan.hold {
            info!(binding = %oref, %message, "dry run");
            publish(ctx, binding.object_ref(&()), EventType::Normal, reason, message.clone());
        }
    } else if plan.baseline && previous.applied_checksum.is_none() {
        let note = format!("recorded checksum {} as the baseline; nothing was restarted", short(&status));
        publish(ctx, binding.object_ref(&()), EventType::Normal, conditions::reason::BASELINED, note);
    }
    report(ctx, binding, &previous, &status).await?;

    // A Consul failure retries on its own, but a binding that is not healthy is looked at soon.
    let healthy = outcome.failed.is_empty() && matches!(input.consul, Consul::Ready(_));
    let retry = if healthy { jitter(RESYNC, 0.2) } else { RETRY };
    Ok(match plan.wake_at {
        Some(at) => Action::requeue(at.saturating_duration_since(Instant::now()).max(Duration::from_millis(50))),
        None => Action::requeue(retry),
    })
}

/// The workload cache can lag behind a stamp this replica just made; until it catches up, what
/// was stamped is what the workload carries.
fn trust_own_stamps(ctx: &Context, namespace: &str, resolved: &mut workloads::Resolved) {
    let mut stamped = ctx.stamped.lock().unwrap();
    for workload in &resolved.found {
        let key = (namespace.to_owned(), workload.clone());
        let Some((generation, value)) = stamped.get(&key) else { continue };
        if resolved.generations.get(workload).is_some_and(|cached| cached < generation) {
            resolved.live.insert(workload.clone(), Live { value: value.clone(), owned: true });
        } else {
            stamped.remove(&key);
        }
    }
}

/// Stamps the planned value on every workload, a few at a time.
async fn stamp_all(ctx: &Context, namespace: &str, binding: &str, plan: &plan::Plan, desired: &str) -> Outcome {
    let annotation = names::annotation_key(binding);
    let manager = names::field_manager(binding);
    let (annotation, manager) = (&annotation, &manager);
    let results: Vec<_> = futures::stream::iter(plan.roll.iter().cloned())
        .map(|workload| async move {
            let started = std::time::Instant::now();
            let value = plan.values.get(&workload).map_or(desired, String::as_str);
            let result = workloads::stamp(&ctx.client, namespace, &workload, annotation, value, manager).await;
            ctx.metrics.stage("patch", started.elapsed());
            if let Ok(generation) = &result {
                let key = (namespace.to_owned(), workload.clone());
                ctx.stamped.lock().unwrap().insert(key, (*generation, value.to_owned()));
            }
            (workload, result.map(drop))
        })
        .buffer_unordered(STAMP_CONCURRENCY)
        .collect()
        .await;
    let mut outcome = Outcome::default();
    for (workload, result) in results {
        match result {
            Ok(()) => outcome.rolled.push(workload),
            Err(e) => outcome.failed.push((workload, e.to_string())),
        }
    }
    outcome.rolled.sort();
    outcome.failed.sort();
    outcome
}

pub fn error_policy(binding: Arc<ConsulBinding>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(binding = %BindingRef::from_obj(&*binding), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Checks what the schema cannot, and returns the debounce window.
pub fn validate(spec: &ConsulBindingSpec) -> Result<Window, String> {
    for source in &spec.keys {
        if let Some(problem) = consulbind_api::key_problem(&source.key) {
            return Err(format!("Consul key {:?} {problem}; Consul would read another key, or none", source.key));
        }
    }
    for target in &spec.targets {
        if target.name.is_some() == target.selector.is_some() {
            return Err(format!("each {} target needs exactly one of name and selector", target.kind));
        }
        if let Some(error) = workloads::selector_error(target) {
            return Err(error);
        }
    }
    let rollout = spec.rollout.clone().unwrap_or_default();
    let duration = |text: Option<String>, default| text.map_or(Ok(default), |t| parse_duration(&t));
    let quiet = duration(rollout.quiet_period, DEFAULT_QUIET)?;
    let max = duration(rollout.max_delay, DEFAULT_MAX.max(quiet))?;
    Ok(Window { quiet, max })
}

/// Where a binding's Consul token comes from.
enum TokenSource {
    Default,
    Secret(Token),
    /// A problem with the Secret that a person must fix.
    Invalid(String),
    /// The default token may not read these keys for this namespace.
    Forbidden(String),
}

impl TokenSource {
    fn into_token(self) -> Option<Token> {
        match self {
            TokenSource::Secret(token) => Some(token),
            _ => None,
        }
    }
}

/// The token for this binding's keys: from its Secret, if it names one; otherwise the
/// controller default.
fn token(ctx: &Context, namespace: &str, spec: &ConsulBindingSpec) -> TokenSource {
    let Some(secret_ref) = spec.consul.as_ref().and_then(|c| c.token_secret_ref.as_ref()) else {
        return TokenSource::Default;
    };
    let key = secret_ref.key.as_deref().unwrap_or("token");
    match ctx.tokens.get(namespace, &secret_ref.name, key) {
        Lookup::Token(token) => TokenSource::Secret(Token::new(token)),
        Lookup::NoSecret => TokenSource::Invalid(format!(
            "token Secret {:?} not found in namespace {namespace}, or it lacks the label {TOKEN_LABEL}=true \
             that lets a Secret serve as a Consul token",
            secret_ref.name
        )),
        Lookup::NoKey => {
            TokenSource::Invalid(format!("token Secret {:?} has no non-empty key {key:?}", secret_ref.name))
        }
    }
}

/// Subscribes a binding to its watches, unless it was deleted while this reconcile waited:
/// the deletion's release may already have run, and must not be undone.
fn subscribe(ctx: &Context, binding: &BindingRef, queries: &[KvQuery]) -> Vec<KeyState> {
    let states = ctx.watches.subscribe(binding, queries);
    if ctx.bindings.get(binding).is_none() {
        ctx.watches.release(binding);
    }
    states
}

/// The binding's status: the one this replica last wrote for this very object, else the cached one.
fn last_status(ctx: &Context, binding: &ConsulBinding, oref: &BindingRef) -> ConsulBindingStatus {
    // The watch event of a write can come before the copy is kept; drop it here then.
    ctx.cached(binding);
    let uid = binding.uid().unwrap_or_default();
    match ctx.written.lock().unwrap().get(oref) {
        Some((written_uid, status)) if *written_uid == uid => status.clone(),
        _ => binding.status.clone().unwrap_or_default(),
    }
}

/// Whether the cached status is the one written. Times reach the cache with whole seconds, so
/// the two are compared as the API server stores them.
fn same_as_stored(cached: Option<&ConsulBindingStatus>, written: &ConsulBindingStatus) -> bool {
    let stored = |s: &ConsulBindingStatus| serde_json::to_value(s).ok();
    cached.and_then(stored) == stored(written)
}

fn queries(spec: &ConsulBindingSpec, token: Option<Token>) -> Vec<KvQuery> {
    let consul = spec.consul.clone().unwrap_or_default();
    spec.keys
        .iter()
        .map(|k| KvQuery {
            key: k.key.clone(),
            recurse: k.recurse,
            datacenter: consul.datacenter.clone(),
            namespace: consul.namespace.clone(),
            partition: consul.partition.clone(),
            token: token.clone(),
        })
        .collect()
}

/// What Consul says for the binding; `None` while a key has had no answer yet.
fn consul_view<'a>(spec: &'a ConsulBindingSpec, states: &'a [KeyState]) -> Option<Consul<'a>> {
    let mut contents = Vec::with_capacity(states.len());
    for (source, state) in spec.keys.iter().zip(states) {
        match state {
            KeyState::Pending => return None,
            KeyState::Failed { reason, message, .. } => {
                return Some(Consul::Failed { reason, message: format!("reading {:?}: {message}", source.key) });
            }
            KeyState::Ready(content) => {
                contents.push(KeyContent { source, entries: &content.entries, reset_hold: content.reset_hold })
            }
        }
    }
    Some(Consul::Ready(contents))
}

fn invalid_status(binding: &ConsulBinding, previous: &ConsulBindingStatus, message: &str) -> ConsulBindingStatus {
    let now = Time(Timestamp::now());
    let generation = binding.metadata.generation;
    let conditions = [conditions::READY, conditions::TARGETS_UPDATED]
        .into_iter()
        .map(|type_| {
            let reason = conditions::reason::INVALID_SPEC;
            plan::condition(&previous.conditions, type_, Some(false), reason, message.into(), generation, &now)
        })
        .collect();
    ConsulBindingStatus { observed_generation: generation, conditions, ..previous.clone() }
}

fn short(status: &ConsulBindingStatus) -> &str {
    status.short_checksum.as_deref().unwrap_or("-")
}

fn rolled_out(
    ctx: &Context,
    binding: &ConsulBinding,
    status: &ConsulBindingStatus,
    outcome: &Outcome,
    contents: &[KeyState],
) {
    let namespace = binding.namespace().unwrap_or_default();
    let name = binding.name_any();
    let list: Vec<String> = outcome.rolled.iter().map(|(k, n)| format!("{k}/{n}")).collect();
    let checksum = status.applied_checksum.as_deref().map_or("-", checksum::short).to_owned();
    info!(binding = %format!("{namespace}/{name}"), %checksum, targets = %list.join(", "), "rolled out Consul change");
    if let Some(latest) = latest_change(contents) {
        ctx.metrics.change_to_rollout.observe(latest.elapsed().as_secs_f64());
    }
    let note = format!("rolled out Consul content {checksum} to {}", list.join(", "));
    publish(ctx, binding.object_ref(&()), EventType::Normal, conditions::reason::ROLLED_OUT, note);
    for (kind, workload) in &outcome.rolled {
        ctx.metrics
            .rollouts
            .get_or_create(&RolloutLabels { namespace: namespace.clone(), binding: name.clone(), kind: kind.as_str() })
            .inc();
        let reference = ObjectReference {
            api_version: Some(kind.api_version().into()),
            kind: Some(kind.as_str().into()),
            namespace: Some(namespace.clone()),
            name: Some(workload.clone()),
            ..ObjectReference::default()
        };
        let note =
            format!("ConsulBinding {name} changed the pod template annotation to {checksum} after a Consul change");
        publish(ctx, reference, EventType::Normal, conditions::reason::ROLLED_OUT, note);
    }
}

/// When the newest of the binding's contents was first seen.
fn latest_change(contents: &[KeyState]) -> Option<std::time::Instant> {
    contents
        .iter()
        .filter_map(|s| match s {
            KeyState::Ready(content) => Some(content.changed_at),
            _ => None,
        })
        .max()
}

/// Writes the status when it changed, and raises an event when Ready turns to a new problem.
async fn report(
    ctx: &Context,
    binding: &ConsulBinding,
    previous: &ConsulBindingStatus,
    status: &ConsulBindingStatus,
) -> Result<(), Error> {
    let oref = binding_ref(binding);
    let ready = |s: &ConsulBindingStatus| s.conditions.iter().find(|c| c.type_ == conditions::READY).cloned();
    let (old, new) = (ready(previous), ready(status));
    if let Some(new) = &new {
        ctx.set_ready(
            &oref,
            Some(match new.status.as_str() {
                "True" => "True",
                "False" => "False",
                _ => "Unknown",
            }),
        );
        let is_new_problem = new.status == "False" && old.as_ref().is_none_or(|o| o.reason != new.reason);
        let quiet = [conditions::reason::PENDING, conditions::reason::SUSPENDED];
        if is_new_problem && !quiet.contains(&new.reason.as_str()) {
            warn!(binding = %oref, reason = %new.reason, message = %new.message, "binding not ready");
            publish(ctx, binding.object_ref(&()), EventType::Warning, &new.reason, new.message.clone());
        }
    }
    if !needs_write(previous, status) {
        return Ok(());
    }
    let api: Api<ConsulBinding> = Api::namespaced(ctx.client.clone(), &binding.namespace().unwrap_or_default());
    // A merge patch of what changed: a server-side apply that drops a field sends it to the
    // 1.20 API server as null, which the schema refuses.
    let (old, new) =
        (serde_json::to_value(previous).unwrap_or_default(), serde_json::to_value(status).unwrap_or_default());
    let patch = json!({ "status": merge_diff(&old, &new) });
    let params = PatchParams { field_manager: Some(STATUS_MANAGER.into()), ..PatchParams::default() };
    api.patch_status(&binding.name_any(), &params, &Patch::Merge(&patch)).await.map_err(Error::Status)?;
    ctx.written.lock().unwrap().insert(oref, (binding.uid().unwrap_or_default(), status.clone()));
    Ok(())
}

/// The JSON merge patch (RFC 7386) that turns `old` into `new`: changed fields, objects
/// merged field by field, and null for each field `new` no longer has.
fn merge_diff(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = serde_json::Map::new();
            for (key, value) in new {
                match old.get(key) {
                    Some(before) if before == value => {}
                    Some(before) => drop(patch.insert(key.clone(), merge_diff(before, value))),
                    None => drop(patch.insert(key.clone(), value.clone())),
                }
            }
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// Whether the status says anything new. The sync time alone is not news: writing it on every
/// reconcile would make an idle controller write for nothing.
fn needs_write(previous: &ConsulBindingStatus, status: &ConsulBindingStatus) -> bool {
    let strip = |s: &ConsulBindingStatus| ConsulBindingStatus { last_sync_time: None, ..s.clone() };
    strip(previous) != strip(status)
}

/// Records an event without holding up the reconcile: the next change of this binding waits
/// for the reconcile to end, and events are not part of the decision.
fn publish(ctx: &Context, reference: ObjectReference, type_: EventType, reason: &str, note: String) {
    let event = Event { type_, reason: reason.into(), note: Some(note), action: "Reconcile".into(), secondary: None };
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let reason = reason.to_owned();
    tokio::spawn(async move {
        if let Err(error) = recorder.publish(&event, &reference).await {
            warn!(%error, reason, "could not record event");
        }
    });
}

#[cfg(test)]
mod tests {
    use consulbind_api::{RolloutPolicy, TargetRef, WorkloadKind};

    use super::*;

    fn spec(target: TargetRef, rollout: Option<RolloutPolicy>) -> ConsulBindingSpec {
        ConsulBindingSpec { targets: vec![target], rollout, ..Default::default() }
    }

    fn named() -> TargetRef {
        TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), selector: None }
    }

    #[test]
    fn defaults_apply_and_durations_parse() {
        assert_eq!(validate(&spec(named(), None)), Ok(Window { quiet: DEFAULT_QUIET, max: DEFAULT_MAX }));
        let rollout =
            RolloutPolicy { quiet_period: Some("1m".into()), max_delay: Some("5m".into()), ..Default::default() };
        assert_eq!(
            validate(&spec(named(), Some(rollout))),
            Ok(Window { quiet: Duration::from_secs(60), max: Duration::from_secs(300) })
        );
    }

    #[test]
    fn keys_that_consul_would_misread_are_refused() {
        for bad in ["/app", "app//x", "./x", "app/../x", "app/.", "//", "a/../"] {
            let spec = ConsulBindingSpec {
                keys: vec![consulbind_api::KeySource { key: bad.into(), ..Default::default() }],
                ..spec(named(), None)
            };
            assert!(validate(&spec).is_err(), "{bad}");
        }
        for good in ["app", "app/", "app/x.json", ".hidden/x", "..x/y", "a/.b/", "a/b..c"] {
            let spec = ConsulBindingSpec {
                keys: vec![consulbind_api::KeySource { key: good.into(), ..Default::default() }],
                ..spec(named(), None)
            };
            assert!(validate(&spec).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_target_needs_exactly_one_of_name_and_selector() {
        let both = TargetRef { selector: Some(Default::default()), ..named() };
        let neither = TargetRef { name: None, ..named() };
        for target in [both, neither] {
            assert!(validate(&spec(target, None)).unwrap_err().contains("exactly one of name and selector"));
        }
    }

    #[test]
    fn merge_diff_sets_changes_and_removes_what_is_gone() {
        let old = json!({"a": 1, "b": {"x": 1, "y": 2}, "c": [1, 2], "gone": {"z": 1}});
        let new = json!({"a": 1, "b": {"x": 1, "y": 3}, "c": [1], "new": "n"});
        assert_eq!(merge_diff(&old, &new), json!({"b": {"y": 3}, "c": [1], "new": "n", "gone": null}));
        assert_eq!(merge_diff(&old, &old), json!({}));
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
}
