//! Replicas that share the bindings by namespace (`--sharding`). Each holds a Lease of its own
//! in the ring; [`ring`] says which namespaces are its and when it may act on them, [`gate`]
//! holds back every write that is not its to make.
//!
//! A replica that gains a namespace lists its bindings afresh and starts from their status, as
//! after a restart; one that loses a namespace forgets everything of it.

pub mod gate;
pub mod ring;

use std::{collections::BTreeMap, pin::Pin, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use tokio::{sync::watch, time::Instant};
use tracing::{error, info, warn};

use self::ring::{Ring, Seen, Step};
pub use self::{
    gate::{Gate, NotServed},
    ring::{MAX_LEASE, Served, View},
};

/// The label that names a Lease's ring: `kubectl get leases -l consulbind.dev/ring`.
pub const RING_LABEL: &str = "consulbind.dev/ring";
/// The annotation on a Lease that shows the digest of the view its replica acts on.
pub const VIEW_ANNOTATION: &str = "consulbind.dev/view";
/// The annotation on a namespace that pins it to one replica, by its identity.
pub const PIN_ANNOTATION: &str = "consulbind.dev/shard";
/// How often the ring is listed: a replica that died is noticed within its Lease and this.
const LOOK: Duration = Duration::from_secs(1);

/// A sharded replica's side of the ring: the gate of its writes, the view it serves, and the task
/// that keeps its Lease, which deletes it on shutdown.
pub struct Shards {
    pub gate: Arc<Gate>,
    pub views: watch::Receiver<Option<Served>>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Where the ring's Leases are and how long each lasts.
pub struct Settings {
    pub namespace: String,
    pub ring: String,
    pub identity: String,
    pub duration: Duration,
    pub renew: Duration,
}

/// Joins the ring and keeps this replica's Lease renewed in the background. `pins` reads the
/// namespaces' pins. A replica that cannot renew within two thirds of its Lease exits.
pub fn join(
    client: &Client,
    settings: Settings,
    pins: impl Fn() -> BTreeMap<String, String> + Send + 'static,
    shutdown: watch::Receiver<bool>,
) -> Shards {
    let gate = Gate::new(settings.identity.clone(), settings.duration);
    let (views_tx, views) = watch::channel(None);
    let api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let task = tokio::spawn(run(api, settings, gate.clone(), views_tx, pins, shutdown));
    Shards { gate, views, task }
}

/// The stream `make` gives for the view served, made again whenever another is served. Between
/// views (a drain) the last goes on: its writes are held at the gate.
pub fn per_view<S, F>(views: watch::Receiver<Option<Served>>, make: F) -> impl Stream<Item = S::Item> + Send
where
    S: Stream + Send + 'static,
    S::Item: Send,
    F: Fn(Served) -> S + Send + Sync + 'static,
{
    let make = Arc::new(make);
    futures::stream::unfold((views, None::<Pin<Box<S>>>), move |(mut views, mut current)| {
        let make = make.clone();
        async move {
            loop {
                let changed = tokio::select! {
                    Ok(()) = views.changed() => None,
                    item = async {
                        match current.as_mut() {
                            Some(stream) => stream.next().await,
                            None => std::future::pending().await,
                        }
                    } => Some(item),
                };
                match changed {
                    Some(item) => return item.map(|item| (item, (views, current))),
                    None => {
                        if let Some(view) = views.borrow_and_update().clone() {
                            current = Some(Box::pin(make(view)));
                        }
                    }
                }
            }
        }
    })
}

async fn run(
    api: Api<Lease>,
    settings: Settings,
    gate: Arc<Gate>,
    views: watch::Sender<Option<Served>>,
    pins: impl Fn() -> BTreeMap<String, String>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut leases = Cluster { api: api.clone(), selector: format!("{RING_LABEL}={}", settings.ring) };
    let (namespace, ring) = (settings.namespace.clone(), settings.ring.clone());
    let mut replica = Replica::new(settings, gate, views);
    info!(lease = %format!("{namespace}/{}", replica.lease_name()), %ring, "joining the shard ring");
    loop {
        let looked = Instant::now();
        if !replica.look(&mut leases, pins()).await {
            error!(
                "this replica's shard Lease was not renewed in time; exiting so that no two replicas write for one \
                 namespace"
            );
            std::process::exit(1);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(looked + LOOK) => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
    }
    replica.leave().await;
    // Gone at once rather than after its duration: the others take over without waiting.
    match api.delete(replica.lease_name(), &DeleteParams::default()).await {
        Ok(_) => info!("left the shard ring"),
        Err(error) => warn!(%error, "could not delete this replica's shard Lease"),
    }
}

/// The ring's Leases: listed whole, and this replica's written.
#[allow(async_fn_in_trait)]
pub trait Leases {
    /// Every Lease of the ring, as the API server holds them now.
    async fn list(&mut self) -> kube::Result<Vec<Lease>>;
    /// Writes this replica's Lease: made when `create`, else replaced at the version it carries.
    async fn write(&mut self, lease: &Lease, create: bool) -> kube::Result<()>;
}

struct Cluster {
    api: Api<Lease>,
    selector: String,
}

impl Leases for Cluster {
    async fn list(&mut self) -> kube::Result<Vec<Lease>> {
        Ok(self.api.list(&ListParams::default().labels(&self.selector)).await?.items)
    }

    async fn write(&mut self, lease: &Lease, create: bool) -> kube::Result<()> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        match create {
            true => self.api.create(&PostParams::default(), lease).await.map(drop),
            false => self.api.replace(&name, &PostParams::default(), lease).await.map(drop),
        }
    }
}

/// One replica of the ring, between looks.
pub struct Replica {
    settings: Settings,
    name: String,
    /// Made at the first look, once this replica's incarnation is known from its Lease.
    ring: Option<Ring>,
    incarnation: i32,
    gate: Arc<Gate>,
    views: watch::Sender<Option<Served>>,
    /// The digest this replica's Lease is to show.
    shown: Option<String>,
    last_sent: Option<Instant>,
    last_renewed: Instant,
    wall: Box<dyn Fn() -> Timestamp + Send + Sync>,
}

impl Replica {
    pub fn new(settings: Settings, gate: Arc<Gate>, views: watch::Sender<Option<Served>>) -> Self {
        let name = lease_name(&settings.ring, &settings.identity);
        let last_renewed = Instant::now();
        let wall = Box::new(Timestamp::now);
        Self {
            settings,
            name,
            ring: None,
            incarnation: 0,
            gate,
            views,
            shown: None,
            last_sent: None,
            last_renewed,
            wall,
        }
    }

    /// Reads the wall clock from `wall`: a simulated one.
    #[cfg(test)]
    pub fn with_wall(self, wall: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        Self { wall: Box::new(wall), ..self }
    }

    /// Lists the ring, drains and shows a new view when it changed, renews the Lease when due,
    /// and serves once every replica agrees. False when the Lease went unrenewed for two thirds
    /// of its duration: the replica must stop.
    pub async fn look(&mut self, leases: &mut impl Leases, pins: BTreeMap<String, String>) -> bool {
        // Stopped past its fence (a pause, a partition): the others may have taken its share.
        if self.lapsed() {
            return false;
        }
        let looked = Instant::now();
        match leases.list().await {
            Err(error) => warn!(%error, "could not list the shard Leases"),
            Ok(items) => {
                let listed: Vec<Seen> = items.iter().map(seen).collect();
                let own = items.iter().find(|l| l.metadata.name.as_deref() == Some(self.name.as_str()));
                let ring = self.ring.get_or_insert_with(|| {
                    self.incarnation = own.map_or(0, |lease| seen(lease).incarnation.saturating_add(1));
                    Ring::new(self.settings.identity.clone(), self.incarnation)
                });
                let step = ring.step(&listed, pins, looked, (self.wall)());
                if let Step::Publish { drain, digest } = &step {
                    if *drain {
                        info!("the shard ring changed; this replica writes nothing until every replica agrees");
                        let _ = self.views.send(None);
                        self.gate.drain().await;
                    }
                    self.shown = Some(digest.clone());
                }
                let publish = matches!(step, Step::Publish { .. });
                let due = publish || self.last_sent.is_none_or(|at| at.elapsed() >= self.settings.renew);
                if due && let Some(digest) = self.shown.clone() {
                    // Past the fence since the list (paused in between): the others may have
                    // taken its share, and a renewal now must not let its old view act again.
                    if self.last_renewed.elapsed() >= self.settings.duration * 2 / 3 {
                        return false;
                    }
                    let sent = Instant::now();
                    self.last_sent = Some(sent);
                    let lease = lease(&self.name, own, &self.settings, self.incarnation, &digest, (self.wall)());
                    match leases.write(&lease, own.is_none()).await {
                        Ok(()) => {
                            self.gate.renewed(sent);
                            self.last_renewed = sent;
                            if publish {
                                ring.published(digest);
                            }
                        }
                        Err(error) => warn!(%error, "could not renew this replica's shard Lease"),
                    }
                }
                if let Step::Serve(served) = step {
                    let members: Vec<&str> = served.view.members().collect();
                    info!(?members, "every replica agrees on the shard ring; serving its share");
                    self.gate.serve(served.clone());
                    let _ = self.views.send(Some(served));
                }
            }
        }
        !self.lapsed()
    }

    fn lapsed(&self) -> bool {
        self.last_renewed.elapsed() >= self.settings.duration * 2 / 3
    }

    /// The name of this replica's Lease.
    pub fn lease_name(&self) -> &str {
        &self.name
    }

    /// Stops serving, and returns once the writes let through are done.
    pub async fn leave(&mut self) {
        let _ = self.views.send(None);
        self.gate.drain().await;
    }
}

fn lease_name(ring: &str, identity: &str) -> String {
    format!("{ring}-{identity}")
}

fn seen(lease: &Lease) -> Seen {
    let spec = lease.spec.clone().unwrap_or_default();
    Seen {
        holder: spec.holder_identity,
        renewed: spec.renew_time.map(|t| t.0),
        duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(1) as u64),
        incarnation: spec.lease_transitions.unwrap_or(0),
        view: lease.metadata.annotations.as_ref().and_then(|a| a.get(VIEW_ANNOTATION).cloned()),
    }
}

/// This replica's Lease, renewed now and showing `digest`; its transitions count the
/// incarnations. It carries the version listed, so a replace that crossed another write fails,
/// and is made again at the next look.
fn lease(
    name: &str,
    own: Option<&Lease>,
    settings: &Settings,
    incarnation: i32,
    digest: &str,
    now: Timestamp,
) -> Lease {
    let now = MicroTime(now);
    let mut lease = own.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(LeaseSpec { acquire_time: Some(now.clone()), ..Default::default() }),
    });
    lease.metadata.labels.get_or_insert_default().insert(RING_LABEL.into(), settings.ring.clone());
    lease.metadata.annotations.get_or_insert_default().insert(VIEW_ANNOTATION.into(), digest.into());
    lease.metadata.managed_fields = None;
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some(settings.identity.clone());
    spec.lease_duration_seconds = Some(i32::try_from(settings.duration.as_secs().max(1)).unwrap_or(i32::MAX));
    spec.renew_time = Some(now);
    spec.lease_transitions = Some(incarnation);
    lease
}
