//! One reconcile of one binding, as named steps: [`read`] (the spec, the token, what Consul and
//! the caches say), [`plan`] (pure: checksum, debounce, what to roll and report), [`stamp`]
//! (the pod templates), [`report`] (status and events). Stamp and report are the only writes.
//! [`state`] keeps each binding's record between reconciles, and [`express`] lets a Consul
//! wake run at once.

pub mod carried;
pub mod content;
pub mod context;
pub mod debounce;
pub mod desk;
pub mod express;
pub mod loss;
pub mod plan;
pub mod read;
pub mod report;
pub mod stamp;
pub mod state;
pub mod status;
pub mod upgrade;
pub mod waves;

use std::{any::Any, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use consul_kv::jitter;
use consulbind_api::{ConsulBinding, RolloutMode, conditions};
use futures::FutureExt;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Resource, ResourceExt,
    runtime::{controller::Action, events::EventType},
};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

pub use self::context::Context;
use self::{
    plan::{Consul, Input, Outcome},
    read::TokenSource,
};
use crate::cluster::objects::Unknown;
use crate::{BindingRef, Error, Lock, binding_ref, names};

/// How often a settled binding is looked at again, as a safety net: Consul, the workloads and
/// the token Secrets all wake it when they change. Such a reconcile writes nothing unless
/// something changed, and jitter keeps many bindings from coming due together.
const RESYNC: Duration = Duration::from_secs(600);
/// How soon a binding that is not healthy is looked at again.
const RETRY: Duration = Duration::from_secs(15);
/// How long a binding whose keys hold more than it may bind watches nothing before it reads
/// them again, unless its spec changes.
const REFUSED_FOR: Duration = Duration::from_secs(300);

/// kube-runtime's entry: waits until no express run has the binding.
pub async fn reconcile(binding: Arc<ConsulBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    let oref = binding_ref(&binding);
    let _running = ctx.express.enter(&oref).await;
    // An express run may have written the status while this one waited.
    let binding = ctx.bindings.get(&oref).unwrap_or(binding);
    reconcile_marked(binding, &ctx).await
}

/// Reconciles `binding` at once, if it is idle and an express slot is free. kube-runtime's
/// queued run follows either way, and keeps the retries.
pub fn express(ctx: &Arc<Context>, binding: &BindingRef) {
    let Some(object) = ctx.bindings.get(binding) else { return };
    let Some(ticket) = ctx.express.try_start(binding) else { return };
    let ctx = ctx.clone();
    tokio::spawn(async move {
        if let Err(error) = reconcile_marked(object, &ctx).await {
            // The queued run that follows retries it, with the error policy.
            debug!(%error, "express reconcile failed");
        }
        drop(ticket);
    });
}

pub fn error_policy(binding: Arc<ConsulBinding>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(binding = %BindingRef::from_obj(&*binding), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// A reconcile by a caller that holds the binding's running mark. A panic ends this reconcile
/// only: the binding says so, and is retried like any failure.
async fn reconcile_marked(binding: Arc<ConsulBinding>, ctx: &Context) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = match AssertUnwindSafe(reconcile_binding(&binding, ctx)).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(panicked(ctx, &binding, panic).await),
    };
    // Whatever way it ended, no stamp waits for this run any more.
    ctx.desk.done(&binding_ref(&binding));
    let label = match &result {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    ctx.metrics.reconciled(label, started.elapsed());
    result
}

/// Shows a panic on the binding, and turns it into an error for the error policy.
async fn panicked(ctx: &Context, binding: &ConsulBinding, panic: Box<dyn Any + Send>) -> Error {
    let message = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_owned(),
        (_, Some(text)) => text.clone(),
        _ => "a panic".to_owned(),
    };
    let oref = binding_ref(binding);
    error!(binding = %oref, %message, "reconcile panicked; other bindings are not affected, and this one is retried");
    let previous = read::last_status(ctx, binding, &oref);
    let note = format!("the controller failed on this binding ({message}); it retries, please report this as a bug");
    let status = report::not_served(binding, &previous, conditions::reason::CONTROLLER_ERROR, &note);
    if let Err(error) = report::status(ctx, binding, &previous, &status).await {
        warn!(binding = %oref, %error, "could not show the failure in the status");
    }
    Error::Panicked(message)
}

/// Read, plan, stamp, report.
async fn reconcile_binding(binding: &ConsulBinding, ctx: &Context) -> Result<Action, Error> {
    let started = Instant::now();
    let namespace = binding.namespace().unwrap_or_default();
    let oref = binding_ref(binding);
    let previous = read::last_status(ctx, binding, &oref);
    let spec = &binding.spec;

    // Read.
    let window = match read::validate(spec) {
        Ok(window) => window,
        Err(message) => {
            ctx.unsubscribe(&oref);
            let status = report::not_served(binding, &previous, conditions::reason::INVALID_SPEC, &message);
            report::status(ctx, binding, &previous, &status).await?;
            return Ok(Action::await_change());
        }
    };
    if let Some(message) = read::beyond_namespace_share(ctx, binding) {
        ctx.unsubscribe(&oref);
        let status = report::not_served(binding, &previous, conditions::reason::TOO_MANY_BINDINGS, &message);
        report::status(ctx, binding, &previous, &status).await?;
        // Served once older bindings go.
        return Ok(Action::requeue(RETRY));
    }
    let mut contents = Vec::new();
    let mut queries = Vec::new();
    let mut in_turns = None;
    // A binding without keys needs no token: its ConfigMaps and Secrets are the content.
    let token = (!spec.keys.is_empty()).then(|| read::token(ctx, &namespace, spec));
    let consul = match token {
        None => {
            ctx.watches.release(&oref);
            Consul::Ready(Vec::new())
        }
        Some(TokenSource::Invalid(message)) => {
            ctx.watches.release(&oref);
            Consul::Failed { reason: conditions::reason::TOKEN_SECRET_INVALID, message }
        }
        // Refused before Consul is asked: the token would have read it.
        Some(TokenSource::Forbidden(message)) => {
            ctx.watches.release(&oref);
            Consul::Failed { reason: conditions::reason::DEFAULT_TOKEN_FORBIDDEN, message }
        }
        Some(source) => 'consul: {
            // Refused as too large: it holds nothing, and its status says why, until it is due
            // to look again.
            let generation = binding.metadata.generation;
            let refused = ctx
                .states
                .update(&oref, |r| r.refused.filter(|(g, until)| *g == generation && Instant::now() < *until));
            if let Some((_, until)) = refused {
                ctx.watches.release(&oref);
                return Ok(Action::requeue(until.saturating_duration_since(Instant::now())));
            }
            queries = read::queries(spec, source.into_token());
            let limit = ctx.max_watched_paths_per_namespace;
            contents = match read::subscribe(ctx, &oref, &queries) {
                Ok(contents) => contents,
                Err(count) => {
                    let message = format!(
                        "with this binding's keys the bindings of namespace {namespace} would watch {count} distinct Consul \
                     paths, more than the {limit} the controller watches for one namespace \
                     (--max-watched-paths-per-namespace); this binding watches nothing until other bindings free \
                     paths (bind fewer or shared prefixes), or the limit is raised"
                    );
                    break 'consul Consul::Failed { reason: conditions::reason::TOO_MANY_WATCHED_PATHS, message };
                }
            };
            in_turns = ctx.watches.in_turns(&queries);
            match read::consul_view(spec, &contents, ctx.max_binding_bytes) {
                Some(consul @ Consul::Failed { reason: conditions::reason::BINDING_TOO_LARGE, .. }) => {
                    ctx.watches.release(&oref);
                    let until = Instant::now() + jitter(REFUSED_FOR, 0.2);
                    ctx.states.update(&oref, |r| r.refused = Some((generation, until)));
                    consul
                }
                Some(consul) => consul,
                // Consul answers within moments, and its first answer wakes the binding: writing
                // "waiting" first would double the writes of a cold start, and after a restart
                // would flap Ready.
                None => return Ok(Action::requeue(RETRY)),
            }
        }
    };
    // Looked at again below, after the reads that follow wait.
    if !read::decides(crate::cluster::listing()) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let annotation = names::annotation_key(&oref.name);
    let staging = waves::Staging::of(spec, ctx.default_rollout_budget).ok().flatten();
    let wants = crate::cluster::workloads::Wants {
        annotation: &annotation,
        references: spec.include_target_references,
        labels: staging.as_ref().is_some_and(waves::Staging::selects_by_label),
    };
    let mut resolved = ctx.workloads.resolve(&namespace, &spec.targets, &wants);
    read::trust_own_stamps(ctx, &oref, &mut resolved);
    let bound = read::bound_objects(spec, &resolved.references);
    let listed = bound.as_deref().unwrap_or_default().iter().map(|b| (b.kind, b.source.name.as_str()));
    ctx.interest.locked().set(&oref, spec, &resolved.found, listed);
    // Read after the interest is recorded, so that a change from here on wakes the binding.
    let objects = match &bound {
        Ok(bound) => match read::objects(ctx, &namespace, bound).await.inspect(|_| ctx.forget_unread()) {
            Ok(objects) => {
                ctx.states.update(&oref, |r| r.objects_failing_since = None);
                Ok(objects)
            }
            // The caches list within moments, and their first list wakes the binding.
            Err(Unknown::Waiting) => return Ok(Action::requeue(Duration::from_secs(1))),
            Err(Unknown::Failed(message)) => {
                // A failure shorter than the grace shows nowhere, as Consul's do.
                let since = ctx.states.update(&oref, |r| *r.objects_failing_since.get_or_insert_with(Instant::now));
                let left = ctx.object_failure_grace.saturating_sub(since.elapsed());
                if !left.is_zero() {
                    debug!(binding = %oref, %message, "a bound object could not be read; retrying");
                    return Ok(Action::requeue(left.clamp(Duration::from_millis(200), Duration::from_secs(1))));
                }
                Err((conditions::reason::OBJECT_UNREADABLE, message))
            }
            Err(Unknown::TooLarge(message)) => Err((conditions::reason::BINDING_TOO_LARGE, message)),
        },
        Err(message) => Err((conditions::reason::BINDING_TOO_LARGE, message.clone())),
    };

    if !read::decides(crate::cluster::listing()) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }

    // Plan.
    // Only this replica's first read can show a restore made while no replica watched: later
    // resets are the watches' to see, and content the binding shares with others may lag
    // behind its status. What it found counts until a status that the plan could judge by
    // (Consul and the objects read) is written. Either hold is marked when the reconcile
    // started, so that one which then finds the content settled ends the grace.
    let held = loss::held_for_lost_content(&previous);
    let compare = matches!(consul, Consul::Ready(_)) && ctx.states.update(&oref, |record| !record.compared);
    let found_restored = match &consul {
        Consul::Ready(read) if compare => match read::restored_at_first_read(&previous, read, &queries, async |alone| {
            ctx.watches.index_if_empty(alone).await
        })
        .await
        {
            Ok(found) => Some(found),
            // The binding's watches answer; a failed read alone is soon tried again.
            Err(error) => {
                debug!(binding = %oref, %error, "could not read a path alone to compare its index; retrying");
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
        },
        _ => None,
    };
    let reset = read::latest_reset(&contents);
    let (restore, restored) = ctx.states.update(&oref, |record| {
        let (restore, restored) = record.restore(held, found_restored, reset, started, ctx.restore_grace);
        (restore, restored && matches!(consul, Consul::Ready(_)))
    });
    let consul_scope = spec.consul.as_ref().map_or(["", "", ""], |c| {
        [c.datacenter.as_deref(), c.namespace.as_deref(), c.partition.as_deref()].map(Option::unwrap_or_default)
    });
    let key = ctx.checksum_key.scoped(&namespace, consul_scope);
    let input = Input {
        key: &key,
        spec,
        window,
        generation: binding.metadata.generation,
        previous: &previous,
        consul,
        objects: objects.as_ref().map(|objects| read::object_contents(objects)).map_err(Clone::clone),
        found: &resolved.found,
        live: &resolved.live,
        uses: &resolved.uses,
        versions: &resolved.versions,
        missing: &resolved.missing,
        unserved: &resolved.unserved,
        dry_run: ctx.dry_run || spec.rollout.as_ref().and_then(|r| r.mode) == Some(RolloutMode::DryRun),
        in_turns,
        restore,
        restored,
        staging: staging.as_ref(),
        health: &resolved.health,
        labels: &resolved.labels,
        clock: Timestamp::now(),
    };
    let upgraded = match upgrade::older_values(&input) {
        true => match ctx.watches.read_with_values(&queries).await.map(|values| upgrade::upgrade(&input, &values)) {
            Ok(Ok(upgraded)) => upgraded,
            // Consul failed, or the content changed in between: its wake brings the next try.
            Ok(Err(_)) | Err(_) => {
                debug!(binding = %oref, "could not read the values that older checksums need; retrying");
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
        },
        false => None,
    };
    let input = match &upgraded {
        Some(upgraded) => Input { previous: &upgraded.previous, live: &upgraded.live, ..input },
        None => input,
    };
    let rescoped = upgrade::rescoped(&input);
    let input = match &rescoped {
        Some(upgraded) => Input { previous: &upgraded.previous, live: &upgraded.live, ..input },
        None => input,
    };
    let (plan, pending) = ctx.states.update(&oref, |record| {
        let before = record.pending.clone();
        (plan::plan(&input, &mut record.pending, Instant::now()), before)
    });
    // A namespace over its write limit writes nothing but the status that says so. A change
    // the plan took as settled stays pending, so that it rolls once the namespace is within.
    let unheld = || status::status(&input, &plan, &Outcome::default(), &Time(Timestamp::now()));
    if let Some(free) = ctx.writes.held(&namespace).filter(|_| report::writes(&previous, &plan, unheld)) {
        ctx.states.update(&oref, |record| {
            if record.pending.is_none() {
                record.pending = pending;
            }
        });
        return report::write_limited(ctx, binding, &previous, free).await;
    }
    stamp::hold(ctx, &oref, &plan);

    // Stamp.
    let outcome = match plan.roll.is_empty() {
        false => {
            if let Some(seen) = read::latest_change(&contents) {
                ctx.metrics.stage("consul_to_reconcile", started.saturating_duration_since(seen));
            }
            ctx.metrics.stage("reconcile_to_patch", started.elapsed());
            stamp::stamp_all(ctx, &oref, &plan, &resolved.versions).await
        }
        true => {
            ctx.desk.planned(&oref);
            Outcome::default()
        }
    };
    // Other bindings' stamps on the same workloads wait for this one when its quiet period ends.
    ctx.desk.due(&oref, plan.wake_at.map(Instant::into_std));

    // Report.
    let now = Time(Timestamp::now());
    let status = status::status(&input, &plan, &outcome, &now);
    if !outcome.rolled.is_empty() {
        let settled = ctx.states.update(&oref, |record| record.settled_sources.clone());
        let applied = settled.filter(|(checksum, _)| previous.applied_checksum.as_ref() == Some(checksum));
        report::rolled_out(ctx, binding, applied.as_ref().map(|(_, f)| f.as_slice()), &status, &outcome, &contents);
    } else if !plan.would_roll.is_empty() && status.dry_run != previous.dry_run {
        if let Some((reason, message)) = &plan.hold {
            info!(binding = %oref, %message, "dry run");
            report::publish(ctx, binding.object_ref(&()), EventType::Normal, reason, message.clone());
        }
    } else if !plan.rebased.is_empty() {
        let list: Vec<String> = plan.rebased.iter().map(|(k, n)| format!("{k}/{n}")).collect();
        let note = format!(
            "the ConfigMaps and Secrets that {} reference{} changed (a template change, or includeTargetReferences \
             set); recorded what {} now read as the content {} run with, and restarted nothing: a template change \
             rolls its workload itself",
            list.join(", "),
            if list.len() == 1 { "s" } else { "" },
            if list.len() == 1 { "it" } else { "they" },
            if list.len() == 1 { "it" } else { "they" },
        );
        info!(binding = %oref, %note, "references changed");
        report::publish(ctx, binding.object_ref(&()), EventType::Normal, conditions::reason::BASELINED, note);
    } else if plan.baseline && previous.applied_checksum.is_none() {
        let note = format!("recorded checksum {} as the baseline; nothing was restarted", report::short(&status));
        report::publish(ctx, binding.object_ref(&()), EventType::Normal, conditions::reason::BASELINED, note);
    }
    report::status(ctx, binding, &previous, &status).await?;
    let shown = restored && input.objects.is_ok();
    ctx.states.update(&oref, |record| record.written(shown, plan.desired.as_deref(), &status, started));

    // A Consul failure retries on its own, but a binding that is not healthy is looked at soon:
    // an object unreadable for want of a rule changes nothing the watches see once it is granted.
    let healthy = outcome.failed.is_empty() && matches!(input.consul, Consul::Ready(_)) && input.objects.is_ok();
    let retry = if healthy { jitter(RESYNC, 0.2) } else { RETRY };
    Ok(match plan.wake_at {
        Some(at) => Action::requeue(at.saturating_duration_since(Instant::now()).max(Duration::from_millis(50))),
        None => Action::requeue(retry),
    })
}
