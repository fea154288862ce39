//! The first stage of a reconcile: every read. What the spec, the token, Consul's paths, the
//! caches and the status say at one moment, in one value that [`decide`](super::decide) takes
//! without touching anything. Each early exit of a reconcile is here: a read that has no answer
//! yet ends it, to be tried again.

use std::{sync::Arc, time::Duration};

use consul_kv::KvEntry;
use consulbind_api::{ConsulBinding, ConsulBindingSpec, ConsulBindingStatus, RolloutMode, conditions::reason};
use k8s_openapi::jiff::Timestamp;
use kube::{ResourceExt, runtime::controller::Action};
use tokio::time::Instant;
use tracing::debug;

use super::{
    Context, RETRY,
    debounce::Window,
    input::{Consul, Input, ObjectContent},
    read::{self, Bound, TokenSource},
    restore,
    staging::Staging,
    upgrade,
};
use crate::{
    BindingRef, Lock, checksum,
    cluster::{
        objects::{Digested, Unknown},
        workloads::Resolved,
    },
    names,
    watches::KeyState,
};

/// One binding as a reconcile found it.
pub struct Observed<'a> {
    pub spec: &'a ConsulBindingSpec,
    pub generation: Option<i64>,
    /// The status last written.
    pub previous: ConsulBindingStatus,
    /// When the reconcile started.
    pub started: Instant,
    /// The wall clock then, for what the status records across restarts.
    pub clock: Timestamp,
    /// What was read, or why the binding is not served.
    pub read: Result<Read, Refused>,
}

/// Why a binding is not served, and when to look again.
pub struct Refused {
    pub reason: &'static str,
    pub message: String,
    pub then: Action,
}

/// What a served binding reads.
pub struct Read {
    pub window: Window,
    /// Keys every checksum of the binding.
    pub key: checksum::Key,
    pub staging: Option<Staging>,
    pub dry_run: bool,
    /// See `--consul-restore-grace`.
    pub restore_grace: Duration,
    /// What each bound path's watch holds, or why Consul is not read at all.
    pub consul: Result<Vec<KeyState>, (&'static str, String)>,
    /// The binding's watches take turns with others of its namespace, a round in at most this.
    pub in_turns: Option<Duration>,
    /// This replica's first read of the binding, when this reconcile made it: whether Consul was
    /// restored since the status was written ([`restore::restored_at_first_read`]).
    pub found_restored: Option<bool>,
    pub resolved: Resolved,
    pub bound: Vec<Bound>,
    /// The data of each bound object, in the order of `bound`, or why it cannot be read.
    pub objects: Result<Vec<Option<Arc<Digested>>>, (&'static str, String)>,
    /// The values of the binding's keys, read where the status or a stamp holds a checksum of an
    /// older format ([`upgrade::older_values`]).
    pub values: Option<Vec<Vec<KvEntry>>>,
    /// The namespace is over its write limit until then.
    pub write_limited: Option<Instant>,
    /// What the spec does that newer API servers refuse ([`read::caution`]).
    pub caution: Option<String>,
}

impl Observed<'_> {
    /// The plan's input, with the restore grace that applies.
    pub fn input<'a>(&'a self, read: &'a Read, restore: Option<Duration>, restored: bool) -> Input<'a> {
        let consul = match &read.consul {
            Ok(states) => read::consul_view(self.spec, states, u64::MAX),
            Err((reason, message)) => Some(Consul::Failed { reason, message: message.clone() }),
        };
        let objects = read.objects.as_ref().map_err(Clone::clone).map(|data| {
            let bound = read.bound.iter().zip(data);
            bound
                .map(|(b, data)| ObjectContent {
                    kind: b.kind,
                    source: &b.source,
                    referenced: b.referenced,
                    data: data.as_deref(),
                })
                .collect()
        });
        let resolved = &read.resolved;
        Input {
            key: &read.key,
            spec: self.spec,
            window: read.window,
            generation: self.generation,
            previous: &self.previous,
            // Observed only once every path has answered.
            consul: consul.unwrap_or(Consul::Failed { reason: reason::CONSUL_UNREACHABLE, message: String::new() }),
            objects,
            found: &resolved.found,
            live: &resolved.live,
            uses: &resolved.uses,
            versions: &resolved.versions,
            missing: &resolved.missing,
            unserved: &resolved.unserved,
            dry_run: read.dry_run,
            in_turns: read.in_turns,
            restore,
            restored,
            staging: read.staging.as_ref(),
            health: &resolved.health,
            labels: &resolved.labels,
            clock: self.clock,
            withhold: false,
        }
    }
}

impl Read {
    /// What each bound path's watch holds; none when Consul is not read.
    pub fn contents(&self) -> &[KeyState] {
        self.consul.as_deref().unwrap_or_default()
    }

    /// Every bound path was read: the input's Consul is ready.
    pub fn consul_ready(&self) -> bool {
        self.consul.as_ref().is_ok_and(|states| states.iter().all(|s| matches!(s, KeyState::Ready(_))))
    }
}

/// Reads all a reconcile of `binding` decides on, or says when to look again.
pub async fn observe<'a>(ctx: &Context, binding: &'a ConsulBinding, started: Instant) -> Result<Observed<'a>, Action> {
    let oref = ctx.states.name(binding);
    let spec = &binding.spec;
    let observed = |read| Observed {
        spec,
        generation: binding.metadata.generation,
        previous: ctx.states.last_status(binding),
        started,
        clock: Timestamp::now(),
        read,
    };
    let window = match read::validate(spec) {
        Ok(window) => window,
        Err(message) => {
            ctx.unsubscribe(&oref);
            let refused = Refused { reason: reason::INVALID_SPEC, message, then: Action::await_change() };
            return Ok(observed(Err(refused)));
        }
    };
    // Every reconcile asks, so the store is not copied: only a namespace's own bindings, and
    // only when the store holds more than one namespace may.
    let limit = ctx.max_bindings_per_namespace;
    let crowded = || ctx.bindings.state_filter(|b| b.metadata.namespace == binding.metadata.namespace);
    let cached = || ctx.bindings.get(&oref.object_ref()).is_some_and(|b| b.uid() == binding.metadata.uid.as_deref());
    let beyond = || {
        let judged = cached() && ctx.bindings.len() > limit;
        judged.then(|| read::beyond_namespace_share(limit, &crowded(), binding)).flatten()
    };
    if let Some(message) = ctx.crowded.judge(binding, beyond) {
        ctx.unsubscribe(&oref);
        // Looked at again when a binding of its namespace is deleted.
        let refused = Refused { reason: reason::TOO_MANY_BINDINGS, message, then: Action::await_change() };
        return Ok(observed(Err(refused)));
    }
    let (consul, queries, in_turns) = consul(ctx, binding, &oref).await?;
    // Looked at again below, after the reads that follow wait.
    put_off_while_listing(&oref).await?;
    let namespace = binding.namespace().unwrap_or_default();
    let annotation = names::annotation_key(oref.name());
    let mut staging = Staging::of(spec, &ctx.staging_defaults).ok().flatten();
    if let Some(staging) = &mut staging {
        staging.let_through = binding.annotations().get(consulbind_api::ROLL_OUTSIDE_WINDOW).cloned();
    }
    let wants = crate::cluster::workloads::Wants {
        annotation: &annotation,
        references: spec.include_target_references,
        labels: staging.as_ref().is_some_and(Staging::selects_by_label),
    };
    let mut resolved = ctx.workloads.resolve(&namespace, &spec.targets, &wants);
    ctx.states.update(&oref, |record| read::trust(&mut record.stamps, &mut resolved));
    let bound = read::bound_objects(spec, &resolved.references);
    let listed = bound.as_deref().unwrap_or_default().iter().map(|b| (b.kind, b.source.name.as_str()));
    ctx.interest.locked().set(&oref, spec, &resolved.found, listed);
    // Read after the interest is recorded, so that a change from here on wakes the binding.
    let objects = match &bound {
        Ok(bound) => objects(ctx, &oref, &namespace, bound).await?,
        Err(message) => Err((reason::BINDING_TOO_LARGE, message.clone())),
    };
    put_off_while_listing(&oref).await?;

    let consul_scope = spec.consul.as_ref().map_or(["", "", ""], |c| {
        [c.datacenter.as_deref(), c.namespace.as_deref(), c.partition.as_deref()].map(Option::unwrap_or_default)
    });
    let read = Read {
        window,
        key: ctx.checksum_key.scoped(&namespace, consul_scope),
        staging,
        dry_run: dry_run(ctx.dry_run, spec),
        restore_grace: ctx.restore_grace,
        consul,
        in_turns,
        found_restored: None,
        resolved,
        bound: bound.unwrap_or_default(),
        objects,
        values: None,
        write_limited: ctx.writes.held(&namespace),
        caution: read::caution(spec),
    };
    let mut observed = observed(Ok(read));
    first_read(ctx, &oref, &mut observed, &queries).await?;
    older_values(ctx, &oref, &mut observed, &queries).await?;
    Ok(observed)
}

type ConsulRead = (Result<Vec<KeyState>, (&'static str, String)>, Vec<consul_kv::KvQuery>, Option<Duration>);

/// Whether the binding only reports what it would roll: the controller's `--dry-run` (`forced`)
/// or its own `rollout.mode`.
pub fn dry_run(forced: bool, spec: &ConsulBindingSpec) -> bool {
    forced || spec.rollout.as_ref().and_then(|r| r.mode) == Some(RolloutMode::DryRun)
}

/// What the binding's watches hold: subscribed, with the token, unless the keys cannot be read.
async fn consul(ctx: &Context, binding: &ConsulBinding, oref: &BindingRef) -> Result<ConsulRead, Action> {
    let spec = &binding.spec;
    let namespace = binding.namespace().unwrap_or_default();
    // A binding without keys needs no token: its ConfigMaps and Secrets are the content.
    let source = match (!spec.keys.is_empty()).then(|| read::token(ctx, &namespace, spec)) {
        None => {
            ctx.watches.release(oref);
            return Ok((Ok(Vec::new()), Vec::new(), None));
        }
        Some(TokenSource::Invalid(message)) => {
            ctx.watches.release(oref);
            return Ok((Err((reason::TOKEN_SECRET_INVALID, message)), Vec::new(), None));
        }
        // Refused before Consul is asked: the token would have read it.
        Some(TokenSource::Forbidden(message)) => {
            ctx.watches.release(oref);
            return Ok((Err((reason::DEFAULT_TOKEN_FORBIDDEN, message)), Vec::new(), None));
        }
        Some(source) => source,
    };
    // Refused as too large: it holds nothing, and its status says why, until it is due to look
    // again. The reason is told again, not taken as shown: the reconcile that refused it may
    // have ended before its status write.
    let generation = binding.metadata.generation;
    if let Some(message) = ctx.states.update(oref, |r| r.refusal(generation, Instant::now()).map(str::to_owned)) {
        ctx.watches.release(oref);
        return Ok((Err((reason::BINDING_TOO_LARGE, message)), Vec::new(), None));
    }
    let queries = read::queries(spec, source.into_token());
    let subscribed = ctx.watches.subscribe(oref, &queries, ctx.max_watched_paths_per_namespace);
    // Deleted while this reconcile waited: the deletion's release may already have run, and must
    // not be undone.
    if ctx.bindings.get(&oref.object_ref()).is_none() {
        ctx.watches.release(oref);
    }
    let states = match subscribed {
        Ok(states) => states,
        Err(count) => {
            let limit = ctx.max_watched_paths_per_namespace;
            let message = format!(
                "with this binding's keys the bindings of namespace {namespace} would watch {count} distinct Consul \
                 paths, more than the {limit} the controller watches for one namespace \
                 (--max-watched-paths-per-namespace); this binding watches nothing until other bindings free \
                 paths (bind fewer or shared prefixes), or the limit is raised"
            );
            return Ok((Err((reason::TOO_MANY_WATCHED_PATHS, message)), queries, None));
        }
    };
    let in_turns = ctx.watches.in_turns(&queries);
    let consul = match read::consul_view(spec, &states, ctx.max_binding_bytes) {
        Some(Consul::Failed { reason: reason::BINDING_TOO_LARGE, message }) => {
            ctx.watches.release(oref);
            ctx.states.update(oref, |r| r.backoffs().refuse(generation, Instant::now(), message.clone()));
            Err((reason::BINDING_TOO_LARGE, message))
        }
        Some(_) => Ok(()),
        // Consul answers within moments, and its first answer wakes the binding: writing
        // "waiting" first would double the writes of a cold start, and after a restart would
        // flap Ready.
        None => return Err(Action::requeue(RETRY)),
    };
    Ok((consul.map(|()| states), queries, in_turns))
}

/// The bound ConfigMaps and Secrets. A failure shorter than `--object-failure-grace` shows
/// nowhere, as Consul's do: the reconcile is tried again.
async fn objects(
    ctx: &Context,
    oref: &BindingRef,
    namespace: &str,
    bound: &[Bound],
) -> Result<Result<Vec<Option<Arc<Digested>>>, (&'static str, String)>, Action> {
    // In order, each `None` where the object does not exist.
    let digests = async {
        let mut digests = Vec::with_capacity(bound.len());
        for object in bound {
            digests.push(ctx.objects.read(&(object.kind, namespace.to_owned(), object.source.name.clone())).await?);
        }
        Ok::<_, Unknown>(digests)
    };
    match digests.await.inspect(|_| ctx.forget_unread()) {
        Ok(objects) => {
            ctx.states.update(oref, |r| r.objects_read());
            Ok(Ok(objects))
        }
        // The caches list within moments, and their first list wakes the binding.
        Err(Unknown::Waiting) => Err(Action::requeue(Duration::from_secs(1))),
        Err(Unknown::Failed(message)) => {
            let since =
                ctx.states.update(oref, |r| *r.backoffs().objects_failing_since.get_or_insert_with(Instant::now));
            let left = ctx.object_failure_grace.saturating_sub(since.elapsed());
            if !left.is_zero() {
                debug!(binding = %oref, %message, "a bound object could not be read; retrying");
                return Err(Action::requeue(left.clamp(Duration::from_millis(200), Duration::from_secs(1))));
            }
            Ok(Err((reason::OBJECT_UNREADABLE, message)))
        }
        Err(Unknown::TooLarge(message)) => Ok(Err((reason::BINDING_TOO_LARGE, message))),
    }
}

/// Only this replica's first read can show a restore made while no replica watched: later
/// resets are the watches' to see, and content the binding shares with others may lag behind
/// its status.
async fn first_read(
    ctx: &Context,
    oref: &BindingRef,
    observed: &mut Observed<'_>,
    queries: &[consul_kv::KvQuery],
) -> Result<(), Action> {
    let Ok(read) = &observed.read else { return Ok(()) };
    let Ok(states) = &read.consul else { return Ok(()) };
    if ctx.states.update(oref, |record| record.restore.compared) {
        return Ok(());
    }
    let Some(Consul::Ready(contents)) = read::consul_view(observed.spec, states, u64::MAX) else { return Ok(()) };
    let found = restore::restored_at_first_read(&observed.previous, &contents, queries, async |alone| {
        ctx.watches.index_if_empty(alone).await
    })
    .await
    // The binding's watches answer; a failed read alone is soon tried again.
    .map_err(|error| {
        debug!(binding = %oref, %error, "could not read a path alone to compare its index; retrying");
        Action::requeue(Duration::from_secs(1))
    })?;
    if let Ok(read) = &mut observed.read {
        read.found_restored = Some(found);
    }
    Ok(())
}

/// The values of the binding's keys, where a checksum of an older format needs them.
async fn older_values(
    ctx: &Context,
    oref: &BindingRef,
    observed: &mut Observed<'_>,
    queries: &[consul_kv::KvQuery],
) -> Result<(), Action> {
    let Ok(read) = &observed.read else { return Ok(()) };
    if !upgrade::older_values(&observed.input(read, None, false)) {
        return Ok(());
    }
    let values = ctx.watches.read_with_values(queries).await.map_err(|_| {
        // Consul failed: its wake brings the next try.
        debug!(binding = %oref, "could not read the values that older checksums need; retrying");
        Action::requeue(Duration::from_secs(1))
    })?;
    if let Ok(read) = &mut observed.read {
        read.values = Some(values);
    }
    Ok(())
}

/// While a cache is part-way through a list the binding decides nothing: it is looked at again
/// once the lists are done, or in 500 ms. What it read meanwhile may be of the mix, so it starts
/// afresh either way.
async fn put_off_while_listing(oref: &BindingRef) -> Result<(), Action> {
    if read::decides(crate::cluster::listing()) {
        return Ok(());
    }
    debug!(binding = %oref, "a cache is part-way through a list; looked at again once it is done");
    let _ = tokio::time::timeout(Duration::from_millis(500), crate::cluster::listed()).await;
    Err(Action::requeue(Duration::ZERO))
}
