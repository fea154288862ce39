//! One reconcile of one binding, in three stages: [`observe`] (every read: the spec, the token,
//! what Consul and the caches say), [`decide`] (pure: validation, restore, upgrade, [`plan`],
//! waves, status and events), [`apply`] (the stamps, the status and the events, through a port
//! that the simulators fake). [`state`] keeps each binding's record between reconciles, and
//! [`express`] lets a Consul wake run at once.

pub mod apply;
pub mod calendar;
pub mod carried;
pub mod content;
pub mod context;
pub mod crowded;
pub mod debounce;
pub mod decide;
pub mod desk;
pub mod express;
pub mod input;
pub mod loss;
pub mod observe;
mod packed;
pub mod plan;
pub mod read;
pub mod report;
pub mod restore;
pub mod staging;
pub mod stamp;
pub mod state;
pub mod status;
pub mod upgrade;
pub mod waves;

use std::{any::Any, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use consulbind_api::{ConsulBinding, conditions};
use futures::FutureExt;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::runtime::controller::Action;
use tokio::time::Instant;
use tracing::{debug, error, warn};

pub use self::context::Context;
use crate::{BindingRef, Error, binding_ref, cached::Cached};

/// How soon a sharded replica looks again at a binding it does not serve yet.
const SHARD_WAIT: Duration = Duration::from_secs(1);
/// How soon a binding that is not healthy is looked at again.
const RETRY: Duration = Duration::from_secs(15);

/// kube-runtime's entry: waits until no express run has the binding.
pub async fn reconcile(binding: Arc<Cached>, ctx: Arc<Context>) -> Result<Action, Error> {
    let oref = binding_ref(&*binding);
    let _running = ctx.express.enter(&oref).await;
    // An express run may have written the status while this one waited.
    let binding = ctx.bindings.get(&oref.object_ref()).unwrap_or(binding);
    reconcile_marked(Arc::new(binding.binding()), &ctx).await
}

/// Reconciles `binding` at once, if it is idle and an express slot is free. kube-runtime's
/// queued run follows either way, and keeps the retries.
pub fn express(ctx: &Arc<Context>, binding: &BindingRef) {
    let Some(object) = ctx.bindings.get(&binding.object_ref()) else { return };
    let Some(ticket) = ctx.express.try_start(binding) else { return };
    let ctx = ctx.clone();
    tokio::spawn(async move {
        if let Err(error) = reconcile_marked(Arc::new(object.binding()), &ctx).await {
            // The queued run that follows retries it, with the error policy.
            debug!(%error, "express reconcile failed");
        }
        drop(ticket);
    });
}

pub fn error_policy(binding: Arc<Cached>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(binding = %binding_ref(&*binding), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// A reconcile by a caller that holds the binding's running mark. A panic ends this reconcile
/// only: the binding says so, and is retried like any failure.
async fn reconcile_marked(binding: Arc<ConsulBinding>, ctx: &Context) -> Result<Action, Error> {
    // A sharded replica leaves alone a binding of a namespace it does not serve, or whose fresh
    // list is still under way: it reads, decides and writes nothing of it.
    let oref = binding_ref(&*binding);
    if let Some(gate) = ctx.writes.gate()
        && !gate.ready(oref.namespace())
    {
        ctx.desk.done(&oref);
        return Ok(Action::requeue(SHARD_WAIT));
    }
    let started = std::time::Instant::now();
    let result = match AssertUnwindSafe(reconcile_binding(&binding, ctx)).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(panicked(ctx, &binding, panic).await),
    };
    // Whatever way it ended, no stamp waits for this run any more.
    ctx.desk.done(&oref);
    // Deleted while this run was in flight: the watches, record and gauge it made again go, as
    // nothing else would take them (a healthy binding's run asks for no retry).
    if ctx.bindings.get(&oref.object_ref()).is_none() {
        ctx.forget(&oref);
    }
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
    let previous = ctx.states.last_status(binding);
    let note = format!("the controller failed on this binding ({message}); it retries, please report this as a bug");
    let now = Time(Timestamp::now());
    let reason = conditions::reason::CONTROLLER_ERROR;
    let status = report::not_served(&previous, binding.metadata.generation, reason, &note, &now);
    if let Err(error) = report::status(ctx, binding, &previous, &status).await {
        warn!(binding = %oref, %error, "could not show the failure in the status");
    }
    Error::Panicked(message)
}

/// Observe, decide, apply.
async fn reconcile_binding(binding: &ConsulBinding, ctx: &Context) -> Result<Action, Error> {
    let started = Instant::now();
    let observed = match observe::observe(ctx, binding, started).await {
        Ok(observed) => observed,
        Err(action) => return Ok(action),
    };
    let oref = binding_ref(binding);
    let decision = ctx.states.update(&oref, |record| decide::decide(&observed, record, Instant::now()));
    apply::apply(&mut apply::Cluster::new(ctx, binding, started), &observed, decision).await
}
