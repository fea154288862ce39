//! Wires the watches, caches and the kube-runtime `Controller` together.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use consulbind_api::ConsulBinding;
use futures::{StreamExt, TryStreamExt, channel::mpsc};
use kube::{
    Api, Client,
    runtime::{
        Controller, WatchStreamExt,
        controller::Config as ControllerConfig,
        events::Reporter,
        reflector,
        watcher::{self, watcher},
    },
};
use prometheus_client::registry::Registry;
use tokio::sync::watch as signal;
use tracing::{debug, info, warn};

use crate::{
    BindingRef, Error, Lock,
    admin::{self, Admin},
    cached::Cached,
    checksum,
    cluster::{
        interest::Interest,
        objects::{ObjectId, Objects},
        policy::{Allowed, Policy},
        tokens::{SecretTouched, Tokens},
        workloads::{Touched, Workloads},
    },
    config::Config,
    intake::Intake,
    lease,
    metrics::Metrics,
    reconcile::{self, Context, desk::Desk, state::States},
    shards::{self, Served, View},
    watches::{Limits, Wake, Watches},
};

const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
/// Reconciles in flight at once. Most of a reconcile is waiting on the API server, so a cold
/// start of thousands of bindings wants many; the API server's own limits stay far away.
const RECONCILE_CONCURRENCY: u16 = 32;

/// Runs until `shutdown` turns true.
pub async fn run(config: Config, shutdown: signal::Receiver<bool>) -> Result<(), Error> {
    let client = crate::cluster::client::connect(config.api_http2).await?;
    let consul = consul_kv::Client::new(config.consul().map_err(Error::Config)?).await?;
    tokio::spawn(reload_consul_files(consul.clone()));
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));

    // Scope `None` serves every namespace; otherwise one controller per listed namespace.
    let scopes: Vec<Option<String>> =
        if config.namespaces.is_empty() { vec![None] } else { config.namespaces.iter().cloned().map(Some).collect() };
    let mut senders = HashMap::new();
    let mut receivers = Vec::new();
    for scope in &scopes {
        let (tx, rx) = mpsc::unbounded();
        senders.insert(scope.clone(), tx);
        receivers.push(rx);
    }
    let serves_all = config.namespaces.is_empty();
    let desk: Arc<Desk> = Arc::default();
    let woken = desk.clone();
    let wake: Wake = Arc::new(move |binding: BindingRef| {
        woken.woken(&binding);
        let scope = if serves_all { None } else { Some(binding.namespace().to_owned()) };
        if let Some(tx) = senders.get(&scope) {
            let _ = tx.unbounded_send(binding);
        }
    });
    let limits = Limits { entries: config.max_prefix_entries, bytes: config.max_prefix_bytes };
    let watches = Watches::new(consul, wake, metrics.clone(), config.consul_failure_grace, limits);

    let admin = serve_admin(&config, Admin { registry, ready: false.into(), watches: watches.clone() }).await?;

    let mut shutdown = shutdown;
    // Each scope's namespace cache adds its pins once started.
    let pinned: Arc<Mutex<Vec<Policy>>> = Arc::default();
    let shards = config.sharding.then(|| join_ring(&client, &config, &metrics, pinned.clone(), shutdown.clone()));
    let writes = crate::writes::Writes::new(
        usize::from(config.max_concurrent_writes),
        config.namespace_write_limit,
        shards.as_ref().map(|s| s.gate.clone()),
    );
    let leadership = if config.leader_elect {
        match lease::acquire(&client, &config, &metrics, &admin.ready, &mut shutdown).await {
            Some(leadership) => Some(leadership),
            None => return Ok(()),
        }
    } else {
        metrics.leader.set(1);
        None
    };

    let (key_namespace, key_name) = config.checksum_key_secret(&client);
    let checksum_key = checksum::key::load_or_create(&client, &key_namespace, &key_name).await?;
    watches.set_digest_key(checksum_key.clone());
    let default_prefixes = config.default_token_prefixes.as_deref().map(Allowed::parse);
    let reporter = Reporter { controller: "consulbind".into(), instance: config.identity.clone() };

    let states = Arc::new(States::new(metrics.clone()));
    let interest: Arc<Mutex<Interest>> = Arc::default();
    let mut scopes_started = Vec::new();
    let mut caches_ready = Vec::new();
    for (scope, wakes) in scopes.into_iter().zip(receivers) {
        let (workloads, touched) = Workloads::start(&client, scope.as_deref());
        let (tokens, secrets_touched) = Tokens::start(&client, scope.as_deref());
        let (objects, objects_touched) =
            Objects::start(&client, scope.as_deref(), checksum_key.clone(), config.max_object_keys);
        let (policy, namespaces_touched) = Policy::start(&client, scope.as_deref(), default_prefixes.clone());
        pinned.locked().push(policy.clone());
        let (reader, writer) = reflector::store::<Cached>();
        let ctx = Arc::new(Context {
            client: client.clone(),
            reporter: reporter.clone(),
            watches: watches.clone(),
            workloads,
            tokens,
            objects,
            policy,
            checksum_key: checksum_key.clone(),
            dry_run: config.dry_run,
            restore_grace: config.consul_restore_grace,
            bindings: reader,
            interest: interest.clone(),
            metrics: metrics.clone(),
            states: states.clone(),
            express: Default::default(),
            desk: desk.clone(),
            max_binding_bytes: config.max_binding_bytes,
            object_failure_grace: config.object_failure_grace,
            max_bindings_per_namespace: config.max_bindings_per_namespace,
            crowded: Default::default(),
            max_watched_paths_per_namespace: config.max_watched_paths_per_namespace,
            staging_defaults: crate::reconcile::staging::Defaults {
                budget: config.default_rollout_budget,
                windows: config.default_rollout_windows.clone().unwrap_or_default(),
            },
            writes: writes.clone(),
        });
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        caches_ready.push(ready_rx);
        let scope = Scope {
            name: scope,
            writer,
            touched,
            secrets_touched,
            objects_touched,
            namespaces_touched,
            wakes,
            ready: ready_tx,
        };
        let views = shards.as_ref().map(|s| s.views.clone());
        scopes_started.push(tokio::spawn(run_scope(client.clone(), scope, ctx, views, shutdown.clone())));
    }
    // Ready once every scope's caches have listed; a scope that cannot list stays not ready.
    for ready in caches_ready {
        let _ = ready.await;
    }
    admin.ready.store(true, Ordering::Relaxed);
    for task in scopes_started {
        task.await??;
    }
    leave(leadership, shards).await;
    info!("stopped");
    Ok(())
}

/// Serves health and metrics on `--admin-addr`, and the debug listing on `--debug-addr`.
async fn serve_admin(config: &Config, admin: Admin) -> Result<Arc<Admin>, Error> {
    let admin = Arc::new(admin);
    let listener = admin::bind(config.admin_addr).await.map_err(Error::Admin)?;
    info!(addr = %listener.local_addr().map_err(Error::Admin)?, "admin server listening");
    tokio::spawn(admin::serve(listener, admin.clone()));
    if let Some(addr) = config.debug_addr.0 {
        let listener = admin::bind(addr).await.map_err(Error::Admin)?;
        info!(addr = %listener.local_addr().map_err(Error::Admin)?, "debug server listening");
        tokio::spawn(admin::serve_debug(listener, admin.clone()));
    }
    Ok(admin)
}

/// Hands the leader Lease back, or leaves the shard ring (the ring's task drains and deletes this
/// replica's Lease), so that the others take over at once.
async fn leave(leadership: Option<lease::Leadership>, shards: Option<shards::Shards>) {
    if let Some(leadership) = leadership {
        leadership.release().await;
    }
    if let Some(shards) = shards
        && tokio::time::timeout(SHUTDOWN_GRACE, shards.task).await.is_err()
    {
        warn!("could not leave the shard ring within {SHUTDOWN_GRACE:?} of shutdown");
    }
}

/// Joins the shard ring (`--sharding`), with the pins of the namespaces `pinned` holds; the
/// leader gauge says whether this replica serves its share.
fn join_ring(
    client: &Client,
    config: &Config,
    metrics: &Arc<Metrics>,
    pinned: Arc<Mutex<Vec<Policy>>>,
    shutdown: signal::Receiver<bool>,
) -> shards::Shards {
    let settings = shards::Settings {
        namespace: config.lease_namespace.clone().unwrap_or_else(|| crate::config::own_namespace(client)),
        ring: config.shard_ring.clone(),
        identity: config.identity.clone().unwrap_or_else(lease::hostname),
        duration: config.lease_duration,
        renew: config.lease_renew,
    };
    let pins = move || pinned.locked().iter().flat_map(Policy::pins).collect();
    let shards = shards::join(client, settings, pins, shutdown);
    let (mut views, metrics) = (shards.views.clone(), metrics.clone());
    tokio::spawn(async move {
        loop {
            metrics.leader.set(i64::from(views.borrow_and_update().is_some()));
            if views.changed().await.is_err() {
                break;
            }
        }
    });
    shards
}

/// Picks up a rotated token file, CA, client certificate or key (Vault Agent, cert-manager).
async fn reload_consul_files(consul: consul_kv::Client) {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(5);
    loop {
        tokio::time::sleep(EVERY).await;
        match consul.reload().await {
            Ok(true) => info!("reloaded the Consul token file or TLS files"),
            Ok(false) => {}
            Err(error) => warn!(%error, "could not reload the Consul token or TLS files; keeping the old ones"),
        }
    }
}

/// What one controller serves: every namespace, or one of `--namespaces`.
struct Scope<T, S, O, N> {
    name: Option<String>,
    writer: reflector::store::Writer<Cached>,
    touched: T,
    secrets_touched: S,
    objects_touched: O,
    namespaces_touched: N,
    wakes: mpsc::UnboundedReceiver<BindingRef>,
    ready: tokio::sync::oneshot::Sender<()>,
}

/// Workload, token Secret, ConfigMap, Secret and namespace changes, and the cluster starting or
/// stopping to serve a kind, wake the bindings they concern, through the returned stream.
fn wake_on_touches(
    ctx: &Arc<Context>,
    touched: impl futures::Stream<Item = Touched> + Send + 'static,
    secrets_touched: impl futures::Stream<Item = SecretTouched> + Send + 'static,
    objects_touched: impl futures::Stream<Item = ObjectId> + Send + 'static,
    namespaces_touched: impl futures::Stream<Item = String> + Send + 'static,
) -> mpsc::UnboundedReceiver<BindingRef> {
    // Marked woken, like a Consul wake: bindings on one workload woken by one ConfigMap change
    // stamp it in one write.
    let (tx, touched_rx) = mpsc::unbounded();
    let desk = ctx.desk.clone();
    let touched_tx = move |binding: BindingRef| {
        desk.woken(&binding);
        let _ = tx.unbounded_send(binding);
    };
    let secret_tx = touched_tx.clone();
    let namespace_tx = touched_tx.clone();
    let kind_tx = touched_tx.clone();
    let object_tx = touched_tx.clone();
    let interest = ctx.interest.clone();
    tokio::spawn(touched.for_each(move |t| {
        for binding in interest.locked().workload(&t.namespace, t.kind, &t.name, &t.labels) {
            touched_tx(binding);
        }
        futures::future::ready(())
    }));
    let interest = ctx.interest.clone();
    tokio::spawn(secrets_touched.for_each(move |(namespace, name)| {
        for binding in interest.locked().secret(&namespace, &name) {
            secret_tx(binding);
        }
        futures::future::ready(())
    }));
    let interest = ctx.interest.clone();
    tokio::spawn(objects_touched.for_each(move |object| {
        for binding in interest.locked().object(&object) {
            object_tx(binding);
        }
        futures::future::ready(())
    }));
    // The cluster starting or stopping to serve an optional kind (Argo Rollouts installed or
    // removed, a rule granted) concerns every binding that targets one.
    for (kind, mut served) in ctx.workloads.optional_kinds_served() {
        let (bindings, served_tx) = (ctx.bindings.clone(), kind_tx.clone());
        tokio::spawn(async move {
            while served.changed().await.is_ok() {
                let targets = |b: &Cached| b.spec().targets.iter().any(|t| t.kind == kind);
                for binding in bindings.state().iter().filter(|b| targets(b)) {
                    served_tx(crate::binding_ref(&**binding));
                }
            }
        });
    }
    // A namespace's rule changes rarely; every binding there is looked at again.
    let bindings = ctx.bindings.clone();
    tokio::spawn(namespaces_touched.for_each(move |namespace| {
        for binding in bindings.state().iter().filter(|b| b.metadata.namespace.as_ref() == Some(&namespace)) {
            namespace_tx(crate::binding_ref(&**binding));
        }
        futures::future::ready(())
    }));
    touched_rx
}

async fn run_scope(
    client: Client,
    scope: Scope<
        impl futures::Stream<Item = Touched> + Send + 'static,
        impl futures::Stream<Item = SecretTouched> + Send + 'static,
        impl futures::Stream<Item = ObjectId> + Send + 'static,
        impl futures::Stream<Item = String> + Send + 'static,
    >,
    ctx: Arc<Context>,
    views: Option<signal::Receiver<Option<Served>>>,
    mut shutdown: signal::Receiver<bool>,
) -> Result<(), Error> {
    let Scope { name: scope, writer, touched, secrets_touched, objects_touched, namespaces_touched, wakes, ready } =
        scope;
    let api: Api<ConsulBinding> = match &scope {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let reader = ctx.bindings.clone();

    let touched_rx = wake_on_touches(&ctx, touched, secrets_touched, objects_touched, namespaces_touched);
    // The caches must be complete before the first reconcile, or a present target would look
    // missing.
    tokio::select! {
        ready = async {
            ctx.workloads.wait_until_ready().await?;
            ctx.tokens.wait_until_ready().await?;
            ctx.policy.wait_until_ready().await.map_err(Error::from)
        } => ready?,
        _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
    }
    debug!(scope = scope.as_deref().unwrap_or("*"), "workload caches ready");
    let _ = ready.send(());

    let express_ctx = ctx.clone();
    let drain = ctx.clone();
    let not_found = ctx.clone();
    let (freed, freed_rx) = mpsc::unbounded();
    let (lists, lists_rx) = mpsc::unbounded();
    let bindings = binding_events(api, writer, &ctx, views, scope, freed, lists);
    let intake = Arc::new(Intake::default());
    let (store, states) = (ctx.bindings.clone(), ctx.states.clone());
    // A new spec, as on the watch: a relist's bindings unchanged meanwhile need no reconcile.
    let listed =
        intake.clone().paced(lists_rx, move |b| store.get(&b.object_ref()).is_some_and(|b| states.spec_changed(&*b)));
    let started = intake.clone();

    if let Some(gate) = ctx.writes.gate() {
        let shard = gate.me().to_owned();
        let served = ctx.metrics.shard_bindings.get_or_create(&crate::metrics::ShardLabels { shard }).clone();
        tokio::spawn(count_served(ctx.bindings.clone(), served));
    }
    let stop = {
        let mut shutdown = shutdown.clone();
        async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        }
    };
    let controller = Controller::for_stream(bindings, reader)
        .with_config(ControllerConfig::default().concurrency(RECONCILE_CONCURRENCY))
        .reconcile_on(wakes.inspect(move |binding| reconcile::express(&express_ctx, binding)).map(|b| b.object_ref()))
        .reconcile_on(touched_rx.map(|b| b.object_ref()))
        .reconcile_on(freed_rx.map(|b: BindingRef| b.object_ref()))
        .reconcile_on(resync(ctx.bindings.clone()).map(|b| b.object_ref()))
        .reconcile_on(listed.map(|b| b.object_ref()))
        .graceful_shutdown_on(stop)
        .run(
            move |binding, ctx| {
                started.started(&crate::binding_ref(&*binding));
                reconcile::reconcile(binding, ctx)
            },
            reconcile::error_policy,
            ctx,
        )
        .for_each(|result| {
            if let Err(error) = result {
                use kube::runtime::controller::Error as E;
                match error {
                    // A wake for a binding that is gone: make sure nothing of it stays behind.
                    E::ObjectNotFound(gone) => {
                        let gone = BindingRef::from(&*gone);
                        intake.started(&gone);
                        not_found.forget(&gone);
                    }
                    // Logged by the error policy.
                    E::ReconcilerFailed(..) => {}
                    error => warn!(%error, "controller error"),
                }
            }
            futures::future::ready(())
        });
    // kube-runtime holds shutdown until the binding cache has listed once, which never happens
    // while the API refuses the list; don't let that keep the process alive.
    tokio::select! {
        _ = controller => {}
        _ = async {
            let _ = shutdown.wait_for(|stop| *stop).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => warn!("in-flight reconciles did not finish within {SHUTDOWN_GRACE:?} of shutdown; abandoning them"),
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, drain.express.drain()).await.is_err() {
        warn!("express reconciles did not finish within {SHUTDOWN_GRACE:?} of shutdown; abandoning them");
    }
    Ok(())
}

/// The bindings of `scope` the controller is to reconcile, kept in `writer`'s store: each new
/// one, each new spec, and each one gained by a sharded replica (`views`).
fn binding_events(
    api: Api<ConsulBinding>,
    writer: reflector::store::Writer<Cached>,
    ctx: &Arc<Context>,
    views: Option<signal::Receiver<Option<Served>>>,
    scope: Option<String>,
    freed: mpsc::UnboundedSender<BindingRef>,
    lists: mpsc::UnboundedSender<Vec<BindingRef>>,
) -> impl futures::Stream<Item = Result<Cached, watcher::Error>> + Send + 'static {
    let forget = ctx.clone();
    let seen = ctx.clone();
    let store = ctx.bindings.clone();
    let listed_scope = scope.clone();
    let in_scope = move |b: &BindingRef| scope.as_deref().is_none_or(|s| s == b.namespace());
    let in_this_scope = in_scope.clone();
    // The view whose list is under way, told to the gate once it is done.
    let listing: Arc<Mutex<Option<View>>> = Arc::default();
    let (listing_view, relisting) = (listing.clone(), ctx.clone());
    // kubectl's last-applied copy, the managed fields and the status are most of a binding's
    // size; of the annotations, the controller reads one, and it reads no label. The status
    // moves to the binding's record, compact. The resource version, held twice (the store's key
    // copies it), is the watch's business alone: it has taken it before this runs.
    let cache = ctx.clone();
    let compact = move |binding: &mut ConsulBinding| {
        cache.states.cache(binding);
        let meta = &mut binding.metadata;
        (meta.managed_fields, meta.labels, meta.resource_version) = (None, None, None);
        crate::keep_annotations(meta, &[consulbind_api::ROLL_OUTSIDE_WINDOW]);
    };
    let events = match views {
        // A sharded replica lists the bindings again for each view it serves, and keeps those
        // of its namespaces: the fresh list drops the rest, and gives the status of those gained.
        Some(views) => {
            shards::per_view(views, move |served: Served| {
                // What this replica holds of a namespace another may have served meanwhile is
                // stale: it goes, and the list gives it again from the status.
                let namespace = |b: &BindingRef| b.namespace().to_owned();
                relisting.retain(|b| !in_this_scope(b) || served.continues(&namespace(b)));
                *listing_view.locked() = Some(served.view.clone());
                let ours = move |event: &watcher::Event<ConsulBinding>| match event {
                    watcher::Event::Apply(b) | watcher::Event::InitApply(b) => {
                        served.owns(b.metadata.namespace.as_deref().unwrap_or_default())
                    }
                    _ => true,
                };
                watcher(api.clone(), watcher::Config::default())
                    .default_backoff()
                    .try_filter(move |event| futures::future::ready(ours(event)))
            })
            .modify(compact)
            .boxed()
        }
        None => watcher(api, watcher::Config::default()).default_backoff().modify(compact).boxed(),
    };
    let mut listed = Listed { lists, pending: Vec::new() };
    reflector::reflector(writer, events.map_ok(cached))
        .inspect_ok(move |event| match event {
            // A binding refused for its namespace's share waits for a deletion there.
            watcher::Event::Delete(binding) => {
                forget.forget(&crate::binding_ref(binding));
                if let Some(next) = forget.crowded.deleted(binding) {
                    let _ = freed.unbounded_send(next);
                }
            }
            // A relist can hide deletions; drop whatever the fresh list no longer has.
            watcher::Event::InitDone => {
                forget.retain(|b| !in_scope(b) || store.get(&b.object_ref()).is_some());
                for refused in forget.crowded.take_all() {
                    let _ = freed.unbounded_send(refused);
                }
                if let (Some(gate), Some(view)) = (forget.writes.gate(), listing.locked().as_ref()) {
                    gate.listed(view, listed_scope.as_deref());
                }
            }
            _ => {}
        })
        .try_filter_map(move |event| futures::future::ready(Ok(listed.objects(event))))
        // A new spec, or a checksum let through outside the rollout windows.
        .try_filter(move |binding| futures::future::ready(seen.states.spec_changed(binding)))
}

/// The bindings each watch event brings to the controller. Those of a list go to `lists` once it
/// is done, when the store holds them: a reconcile of one the store does not hold yet would find
/// nothing, and a binding gained by a sharded replica, or made during a relist, would wait for
/// the resync. The intake lets them into the queue.
struct Listed {
    lists: mpsc::UnboundedSender<Vec<BindingRef>>,
    pending: Vec<BindingRef>,
}

impl Listed {
    fn objects(&mut self, event: watcher::Event<Cached>) -> Option<Cached> {
        match event {
            watcher::Event::Apply(binding) => Some(binding),
            watcher::Event::Init => {
                self.pending.clear();
                None
            }
            watcher::Event::InitApply(binding) => {
                self.pending.push(crate::binding_ref(&binding));
                None
            }
            watcher::Event::InitDone => {
                let _ = self.lists.unbounded_send(std::mem::take(&mut self.pending));
                None
            }
            watcher::Event::Delete(_) => None,
        }
    }
}

/// The watch's bindings as the binding cache keeps them.
fn cached(event: watcher::Event<ConsulBinding>) -> watcher::Event<Cached> {
    use watcher::Event as E;
    match event {
        E::Apply(binding) => E::Apply(binding.into()),
        E::InitApply(binding) => E::InitApply(binding.into()),
        E::Delete(binding) => E::Delete(binding.into()),
        E::Init => E::Init,
        E::InitDone => E::InitDone,
    }
}

/// Keeps `served` counting the bindings of `store`, as this scope's share of the gauge.
async fn count_served(store: reflector::Store<Cached>, served: prometheus_client::metrics::gauge::Gauge) {
    let mut counted = 0;
    loop {
        let now = store.state().len() as i64;
        served.inc_by(now - counted);
        counted = now;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// How often each binding is looked at again, as a safety net: Consul, the workloads, the
/// objects and the token Secrets all wake it when they change, and such a reconcile writes
/// nothing unless something changed.
const RESYNC: Duration = Duration::from_secs(600);
/// The resync's tick: each binding comes due at one tick of each round, by its name.
const RESYNC_TICK: Duration = Duration::from_secs(1);

/// Every binding in `store`, once each [`RESYNC`], spread over it by a hash of its name. One
/// timer serves them all, where a requeue of each would keep an entry per binding in the
/// controller's queue.
fn resync(store: reflector::Store<Cached>) -> mpsc::UnboundedReceiver<BindingRef> {
    let (tx, rx) = mpsc::unbounded();
    let ticks = (RESYNC.as_millis() / RESYNC_TICK.as_millis()) as u64;
    tokio::spawn(async move {
        // The first round starts a round after the start, whose reconciles look at every binding.
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC_TICK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for tick in (0..ticks).cycle() {
            interval.tick().await;
            // Only the bindings due now are copied out of the store, not all of them each tick.
            let due = |b: &Cached| {
                let meta = &b.metadata;
                resync_tick(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default(), ticks) == tick
            };
            for binding in store.state_filter(due) {
                if tx.unbounded_send(crate::binding_ref(&*binding)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// The tick of each round at which the binding `namespace`/`name` comes due.
fn resync_tick(namespace: Option<&str>, name: &str, ticks: u64) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::hash::DefaultHasher>::default().hash_one((namespace, name)) % ticks
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;

    use super::*;

    fn binding(name: &str) -> Cached {
        let mut binding = ConsulBinding::new(name, Default::default());
        binding.metadata.namespace = Some("team".into());
        binding.into()
    }

    /// A list's bindings reach the intake once it is done, when the store holds them: in time to
    /// be found.
    #[test]
    fn the_bindings_of_a_list_come_once_the_list_is_done() {
        let (lists, mut lists_rx) = mpsc::unbounded();
        let mut listed = Listed { lists, pending: Vec::new() };
        for event in
            [watcher::Event::Init, watcher::Event::InitApply(binding("a")), watcher::Event::InitApply(binding("b"))]
        {
            assert!(listed.objects(event).is_none());
            assert!(lists_rx.try_recv().is_err(), "before the list is done");
        }
        assert!(listed.objects(watcher::Event::InitDone).is_none());
        let list = lists_rx.try_recv().unwrap();
        assert_eq!(list.iter().map(|b| b.name()).collect::<Vec<_>>(), ["a", "b"]);
        let apply = listed.objects(watcher::Event::Apply(binding("c")));
        assert_eq!(apply.map(|b| b.name_any()).as_deref(), Some("c"), "a watch event comes at once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_resync_round_wakes_every_binding_once() {
        let (store, mut writer) = reflector::store::<Cached>();
        let names: Vec<String> = (0..50).map(|i| format!("b{i}")).collect();
        for name in &names {
            writer.apply_watcher_event(&watcher::Event::Apply(binding(name)));
        }
        let mut woken = resync(store);
        let half_tick = RESYNC_TICK / 2;
        tokio::time::sleep(RESYNC - half_tick).await;
        assert!(woken.try_recv().is_err(), "none in the round after the start");
        let end = tokio::time::Instant::now() + RESYNC;
        let mut seen = Vec::new();
        while let Ok(Some(binding)) = tokio::time::timeout_at(end, woken.next()).await {
            seen.push(binding.name().to_owned());
        }
        seen.sort();
        let mut expected = names.clone();
        expected.sort();
        assert_eq!(seen, expected, "each once in a round");
        let ticks: std::collections::BTreeSet<u64> = names.iter().map(|n| resync_tick(Some("team"), n, 600)).collect();
        assert!(ticks.len() > 25, "spread over the round: {} ticks for 50 bindings", ticks.len());
    }
}
