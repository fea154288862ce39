//! The workloads bindings roll: small caches to find them and to see what they carry.

use std::{
    collections::BTreeMap,
    hash::{Hash, Hasher},
};

use consulbind_api::{TargetRef, WorkloadKind};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment, StatefulSet},
        core::v1::PodSpec,
    },
    apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    core::PartialObjectMeta,
    core::{Selector, SelectorExt},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, watcher},
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::{
    Live, Version, Workload,
    argo::Rollout,
    cronjob::{CronJob, CronJobV1Beta1},
    health::{self, Health},
    references::{self, References},
};
use crate::names;

/// Metadata caches of the workload kinds in one scope (a namespace, or all).
#[derive(Clone)]
pub struct Workloads {
    deployments: Store<PartialObjectMeta<Deployment>>,
    statefulsets: Store<PartialObjectMeta<StatefulSet>>,
    daemonsets: Store<PartialObjectMeta<DaemonSet>>,
    rollouts: Store<PartialObjectMeta<Rollout>>,
    /// Whether the cluster serves Argo Rollouts' kind, which is optional.
    rollouts_served: watch::Receiver<Served>,
    cronjobs: Store<PartialObjectMeta<CronJob>>,
    cronjobs_served: watch::Receiver<Served>,
    /// Before 1.21, CronJobs are served as `batch/v1beta1` only.
    old_cronjobs: Store<PartialObjectMeta<CronJobV1Beta1>>,
    old_cronjobs_served: watch::Receiver<Served>,
}

/// Whether the API server serves a kind to this controller, as its last list or watch said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// Not listed yet.
    Unknown,
    Yes,
    /// No such kind: its CRD is not installed.
    NotInstalled,
    /// The API server refused: RBAC.
    Forbidden,
}

/// A workload that was added, deleted or relabelled.
pub struct Touched {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Set on a cached Rollout that takes its template from another workload, with that
/// workload's kind and name.
const WORKLOAD_REF: &str = "workload-ref";

/// Which targets exist, and what they carry.
#[derive(Debug, Default)]
pub struct Resolved {
    pub found: Vec<Workload>,
    /// The binding's annotation on each found workload that has it.
    pub live: BTreeMap<Workload, Live>,
    /// The uid and generation of each found workload, as cached.
    pub versions: BTreeMap<Workload, Version>,
    pub missing: Vec<String>,
    /// A sentence for each target whose kind the cluster does not serve to the controller.
    pub unserved: Vec<String>,
    /// The ConfigMaps and Secrets the found workloads' pod templates reference, merged.
    pub references: References,
    /// Those each found workload's pod template references, for the workloads with any.
    pub uses: BTreeMap<Workload, References>,
    /// The found workloads that are not healthy ([`Health`]), with what each reports.
    pub health: BTreeMap<Workload, Health>,
    /// The labels of each found workload, which waves select by.
    pub labels: BTreeMap<Workload, BTreeMap<String, String>>,
}

impl Workloads {
    /// Starts the caches. The returned stream must be polled to keep them current; it yields
    /// when a workload appears, disappears or changes labels, never for mere status updates.
    pub fn start(client: &Client, namespace: Option<&str>) -> (Self, impl Stream<Item = Touched> + Send + 'static) {
        let (deployments, d) = cache::<Deployment>(client, namespace, WorkloadKind::Deployment, None);
        let (statefulsets, s) = cache::<StatefulSet>(client, namespace, WorkloadKind::StatefulSet, None);
        let (daemonsets, ds) = cache::<DaemonSet>(client, namespace, WorkloadKind::DaemonSet, None);
        let (served, rollouts_served) = watch::channel(Served::Unknown);
        let (rollouts, r) = cache::<Rollout>(client, namespace, WorkloadKind::Rollout, Some(served));
        let (served, cronjobs_served) = watch::channel(Served::Unknown);
        let (cronjobs, c) = cache::<CronJob>(client, namespace, WorkloadKind::CronJob, Some(served));
        let (served, old_cronjobs_served) = watch::channel(Served::Unknown);
        let (old_cronjobs, oc) = cache::<CronJobV1Beta1>(client, namespace, WorkloadKind::CronJob, Some(served));
        let workloads = Self {
            deployments,
            statefulsets,
            daemonsets,
            rollouts,
            rollouts_served,
            cronjobs,
            cronjobs_served,
            old_cronjobs,
            old_cronjobs_served,
        };
        (workloads, futures::stream::select_all([d, s, ds, r, c, oc]))
    }

    /// The API version the cluster serves `kind` at.
    pub fn api_version(&self, kind: WorkloadKind) -> &'static str {
        match kind {
            WorkloadKind::CronJob if self.old_cronjobs_only() => "batch/v1beta1",
            _ => kind.api_version(),
        }
    }

    /// The cluster serves CronJobs as `batch/v1beta1` and not as `batch/v1` (before 1.21).
    pub fn old_cronjobs_only(&self) -> bool {
        *self.cronjobs_served.borrow() != Served::Yes && *self.old_cronjobs_served.borrow() == Served::Yes
    }

    /// Waits for the first list of every kind; for Rollouts, an answer that the kind is not
    /// there is enough.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.deployments.wait_until_ready().await?;
        self.statefulsets.wait_until_ready().await?;
        self.daemonsets.wait_until_ready().await?;
        for served in [&self.rollouts_served, &self.cronjobs_served, &self.old_cronjobs_served] {
            let _ = served.clone().wait_for(|s| *s != Served::Unknown).await;
        }
        Ok(())
    }

    /// For each kind the cluster may not serve, what changes whenever it starts or stops
    /// serving it.
    pub fn optional_kinds_served(&self) -> [(WorkloadKind, watch::Receiver<Served>); 3] {
        [
            (WorkloadKind::Rollout, self.rollouts_served.clone()),
            (WorkloadKind::CronJob, self.cronjobs_served.clone()),
            (WorkloadKind::CronJob, self.old_cronjobs_served.clone()),
        ]
    }

    /// The workloads in `namespace` that `targets` name or select, with what `wants` asks of each.
    pub fn resolve(&self, namespace: &str, targets: &[TargetRef], wants: &Wants<'_>) -> Resolved {
        let mut found = BTreeMap::new();
        let mut missing = Vec::new();
        let mut unserved = Vec::new();
        for target in targets {
            let mut live = match target.kind {
                WorkloadKind::Deployment => select(&self.deployments, namespace, target, wants),
                WorkloadKind::StatefulSet => select(&self.statefulsets, namespace, target, wants),
                WorkloadKind::DaemonSet => select(&self.daemonsets, namespace, target, wants),
                WorkloadKind::CronJob => {
                    let (now, old) = (self.cronjobs_served.borrow().clone(), self.old_cronjobs_served.borrow().clone());
                    match (now, old) {
                        (Served::Yes, _) => select(&self.cronjobs, namespace, target, wants),
                        (_, Served::Yes) => select(&self.old_cronjobs, namespace, target, wants),
                        (Served::Forbidden, _) | (_, Served::Forbidden) => {
                            unserved.push(
                                "the controller may not list or watch CronJobs (batch); grant it list, watch and \
                                 patch on cronjobs (see config/rbac)"
                                    .to_owned(),
                            );
                            continue;
                        }
                        _ => {
                            unserved.push("the cluster serves no CronJobs (batch/v1 or batch/v1beta1)".to_owned());
                            continue;
                        }
                    }
                }
                WorkloadKind::Rollout => match &*self.rollouts_served.borrow() {
                    Served::Yes => select(&self.rollouts, namespace, target, wants),
                    Served::Forbidden => {
                        unserved.push(
                            "the controller may not list or watch Argo Rollouts (rollouts.argoproj.io); grant it \
                             list, watch and patch on them (see config/rbac)"
                                .to_owned(),
                        );
                        continue;
                    }
                    Served::NotInstalled | Served::Unknown => {
                        unserved.push(
                            "the kind Rollout (argoproj.io/v1alpha1) is not served by this cluster; install Argo \
                             Rollouts, or target another kind. Rollouts are picked up once it is installed"
                                .to_owned(),
                        );
                        continue;
                    }
                },
            };
            let matched = !live.is_empty();
            // Such a Rollout has no template of its own: a stamp there would change nothing.
            live.retain(|found| match &found.workload_ref {
                Some(source) => {
                    let name = &found.name;
                    missing.push(format!(
                        "Rollout {name:?} takes its pod template from {source} (workloadRef); bind that workload \
                         instead, and Argo Rollouts rolls the Rollout when its template changes"
                    ));
                    false
                }
                None => true,
            });
            if !matched {
                missing.push(match (&target.name, &target.selector) {
                    (Some(name), _) => format!("{} {name:?} not found", target.kind),
                    (None, _) => format!("no {} matches the selector", target.kind),
                });
            }
            found.extend(live.into_iter().map(|s| ((target.kind, s.name.clone()), s)));
        }
        let live = found.iter().filter_map(|(w, s)| Some((w.clone(), s.live.clone()?))).collect();
        let versions = found.iter().map(|(w, s)| (w.clone(), s.version.clone())).collect();
        let mut references = References::new();
        for (id, used) in found.values().flat_map(|s| &s.references) {
            references::add(&mut references, id, used);
        }
        let uses =
            found.iter().filter(|(_, s)| !s.references.is_empty()).map(|(w, s)| (w.clone(), s.references.clone()));
        let uses = uses.collect();
        let health = found.iter().filter(|(_, s)| s.health != Health::Healthy);
        let health = health.map(|(w, s)| (w.clone(), s.health.clone())).collect();
        let labels = found.iter_mut().map(|(w, s)| (w.clone(), std::mem::take(&mut s.labels))).collect();
        let found = found.into_keys().collect();
        Resolved { found, live, versions, missing, unserved, references, uses, health, labels }
    }
}

/// A cache of one kind; with `served`, a kind that may be missing from the cluster, whose
/// presence is reported there.
fn cache<K>(
    client: &Client,
    namespace: Option<&str>,
    kind: WorkloadKind,
    served: Option<watch::Sender<Served>>,
) -> (Store<PartialObjectMeta<K>>, futures::stream::BoxStream<'static, Touched>)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Template
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (reader, writer) = reflector::store();
    let mut seen = Seen::default();
    // What a re-list found changed, held back until the store has swapped in what it listed.
    let mut relisted: Vec<Touched> = Vec::new();
    // Whole objects arrive, for the pod template's annotations; what is kept is their name,
    // labels and this controller's annotations, so memory stays small per workload.
    let events = watcher(api, watcher::Config::default());
    let stream = match served {
        // A kind that may be installed at any moment is looked for again within seconds.
        Some(_) => {
            let retry = backon::ExponentialBuilder::default()
                .with_min_delay(std::time::Duration::from_millis(800))
                .with_max_delay(std::time::Duration::from_secs(8))
                .with_jitter()
                .without_max_times();
            events.backoff(Patient::new(watcher::ExponentialBackoff::from(retry))).boxed()
        }
        None => events.default_backoff().boxed(),
    };
    let stream = stream.map_ok(|event| event_of(event, live_meta));
    let mut listing = super::Listing::default();
    let stream = reflector::reflector(writer, stream)
        .flat_map(move |event| {
            listing.event(&event);
            if let Some(served) = &served {
                let now = match &event {
                    Ok(watcher::Event::InitDone) => Some(Served::Yes),
                    Err(error) => served_after(error),
                    _ => None,
                };
                if let Some(now) = now {
                    served.send_if_modified(|state| {
                        let changed = *state != now;
                        if changed {
                            tracing::info!(%kind, served = ?now, "the cluster's answer for this kind changed");
                        }
                        *state = now;
                        changed
                    });
                }
            }
            let touched = |obj: &PartialObjectMeta<K>| Touched {
                kind,
                namespace: obj.namespace().unwrap_or_default(),
                name: obj.name_any(),
                labels: obj.labels().clone(),
            };
            let touched: Vec<Touched> = match event {
                Ok(watcher::Event::Init) => {
                    seen.relisting();
                    relisted.clear();
                    Vec::new()
                }
                Ok(watcher::Event::InitDone) => {
                    let gone = seen.relisted().into_iter().map(|gone| {
                        let namespace = gone.namespace.unwrap_or_default();
                        Touched { kind, namespace, name: gone.name, labels: Default::default() }
                    });
                    std::mem::take(&mut relisted).into_iter().chain(gone).collect()
                }
                Ok(watcher::Event::InitApply(obj)) => {
                    let signature = signature(&obj);
                    if seen.applied(ObjectRef::from_obj(&obj), signature) {
                        relisted.push(touched(&obj));
                    }
                    Vec::new()
                }
                Ok(watcher::Event::Apply(obj)) => match seen.applied(ObjectRef::from_obj(&obj), signature(&obj)) {
                    true => vec![touched(&obj)],
                    false => Vec::new(),
                },
                Ok(watcher::Event::Delete(obj)) => {
                    seen.deleted(&ObjectRef::from_obj(&obj));
                    vec![touched(&obj)]
                }
                // An optional kind that is not installed is no news on every retry.
                Err(error) if served.as_ref().is_some_and(|s| *s.borrow() == Served::NotInstalled) => {
                    tracing::debug!(%kind, %error, "kind not served; retrying");
                    Vec::new()
                }
                Err(error) => {
                    tracing::warn!(%kind, %error, "watching workloads failed; retrying");
                    Vec::new()
                }
            };
            futures::stream::iter(touched)
        })
        .boxed();
    (reader, stream)
}

/// A backoff that a retry's own start does not reset. The watcher says `Init` before each list
/// it tries, and a stream backoff resets on anything but an error, so a kind the cluster does
/// not serve would be listed again every 0.8 s for ever. Only a watch that has gone without
/// failing for a while starts again from the shortest delay.
struct Patient<B> {
    backoff: B,
    failed_at: Option<tokio::time::Instant>,
}

impl<B> Patient<B> {
    /// How long a watch must go without failing before its next failure is retried soon again.
    const QUIET: std::time::Duration = std::time::Duration::from_secs(30);

    fn new(backoff: B) -> Self {
        Self { backoff, failed_at: None }
    }
}

impl<B: Iterator<Item = std::time::Duration>> Iterator for Patient<B> {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        self.failed_at = Some(tokio::time::Instant::now());
        self.backoff.next()
    }
}

impl<B: kube::runtime::utils::Backoff> kube::runtime::utils::Backoff for Patient<B> {
    fn reset(&mut self) {
        if self.failed_at.is_none_or(|at| at.elapsed() >= Self::QUIET) {
            self.backoff.reset();
        }
    }
}

/// A hash of what the bindings read of a workload's metadata: its labels and annotations. A
/// hash, not a copy: [`Seen`] has an entry per workload in the cluster.
fn signature<K: Resource>(obj: &PartialObjectMeta<K>) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    // A health detail (replica counts) changes often; its verdict wakes the bindings.
    let annotations = obj.annotations().iter().filter(|(k, _)| *k != health::DETAIL);
    (obj.labels(), annotations.collect::<Vec<_>>()).hash(&mut hasher);
    hasher.finish()
}

/// What a cache has shown of each object: a hash of its labels and annotations, not a copy, since
/// this has an entry per workload in the cluster. A status update alone is no news.
struct Seen<K: Resource<DynamicType = ()>> {
    signatures: std::collections::HashMap<ObjectRef<K>, u64>,
    /// What a re-list has shown so far: what it never shows was deleted while the watch was
    /// down, and gets no deletion event of its own.
    relisted: Option<std::collections::HashSet<ObjectRef<K>>>,
}

impl<K: Resource<DynamicType = ()>> Default for Seen<K> {
    fn default() -> Self {
        Self { signatures: Default::default(), relisted: None }
    }
}

impl<K: Resource<DynamicType = ()>> Seen<K> {
    /// Returns whether the object is new or its labels or annotations changed.
    fn applied(&mut self, object: ObjectRef<K>, signature: u64) -> bool {
        if let Some(listed) = &mut self.relisted {
            listed.insert(object.clone());
        }
        self.signatures.insert(object, signature) != Some(signature)
    }

    fn deleted(&mut self, object: &ObjectRef<K>) {
        self.signatures.remove(object);
    }

    fn relisting(&mut self) {
        self.relisted = Some(Default::default());
    }

    /// The list is complete: forgets and returns the objects it did not show.
    fn relisted(&mut self) -> Vec<ObjectRef<K>> {
        let Some(listed) = self.relisted.take() else { return Vec::new() };
        let gone: Vec<ObjectRef<K>> = self.signatures.keys().filter(|k| !listed.contains(*k)).cloned().collect();
        for k in &gone {
            self.signatures.remove(k);
        }
        gone
    }
}

/// What a failed list or watch says about whether the kind is served.
fn served_after(error: &watcher::Error) -> Option<Served> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status,
        watcher::Error::WatchError(status) => status,
        _ => return None,
    };
    match status.code {
        404 => Some(Served::NotInstalled),
        403 => Some(Served::Forbidden),
        _ => None,
    }
}

fn event_of<K, M>(event: watcher::Event<K>, f: impl Fn(K) -> M) -> watcher::Event<M> {
    match event {
        watcher::Event::Apply(obj) => watcher::Event::Apply(f(obj)),
        watcher::Event::Delete(obj) => watcher::Event::Delete(f(obj)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(obj) => watcher::Event::InitApply(f(obj)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A workload's pod template: its annotations and its spec.
pub trait Template {
    const KIND: WorkloadKind;

    fn template_annotations(&self) -> Option<&BTreeMap<String, String>>;

    fn pod_spec(&self) -> Option<&PodSpec>;

    /// The workload this one takes its template from, as "Kind name".
    fn workload_ref(&self) -> Option<String> {
        None
    }

    fn health(&self) -> Health;
}

impl Template for Rollout {
    const KIND: WorkloadKind = WorkloadKind::Rollout;

    fn template_annotations(&self) -> Option<&BTreeMap<String, String>> {
        self.spec.as_ref()?.template.as_ref()?.metadata.as_ref()?.annotations.as_ref()
    }

    fn pod_spec(&self) -> Option<&PodSpec> {
        self.spec.as_ref()?.template.as_ref()?.spec.as_ref()
    }

    fn workload_ref(&self) -> Option<String> {
        let reference = self.spec.as_ref()?.workload_ref.as_ref()?;
        Some(format!("{} {:?}", reference.kind, reference.name))
    }

    fn health(&self) -> Health {
        health::rollout(self)
    }
}

macro_rules! template {
    ($($kind:ident: $health:path),*) => {$(
        impl Template for $kind {
            const KIND: WorkloadKind = WorkloadKind::$kind;

            fn health(&self) -> Health {
                $health(self)
            }

            fn template_annotations(&self) -> Option<&BTreeMap<String, String>> {
                self.spec.template.metadata.as_ref()?.annotations.as_ref()
            }

            fn pod_spec(&self) -> Option<&PodSpec> {
                self.spec.template.spec.as_ref()
            }
        }
    )*};
}
template!(Deployment: health::deployment, StatefulSet: health::stateful_set, DaemonSet: health::daemon_set);

macro_rules! cronjob_template {
    ($($kind:ty),*) => {$(
        impl Template for $kind {
            const KIND: WorkloadKind = WorkloadKind::CronJob;

            fn template_annotations(&self) -> Option<&BTreeMap<String, String>> {
                self.spec.as_ref()?.template()?.metadata.as_ref()?.annotations.as_ref()
            }

            fn pod_spec(&self) -> Option<&PodSpec> {
                self.spec.as_ref()?.template()?.spec.as_ref()
            }

            /// A CronJob rolls nothing that runs: the next Job it makes carries the stamp.
            fn health(&self) -> Health {
                Health::Healthy
            }
        }
    )*};
}
cronjob_template!(CronJob, CronJobV1Beta1);

/// Marks, in a cached workload's annotations, that the binding's own field manager set the
/// annotation after it; anything else (a rollout undo, a hand edit) set the live value.
const OWNED: &str = "owned.";

/// What the caches keep of a workload: name, namespace, uid, generation and labels, and as annotations this
/// controller's pod-template annotations, each with an [`OWNED`] mark when the binding's field
/// manager holds it, and the ConfigMaps and Secrets its pod template references.
fn live_meta<K: Resource<DynamicType = ()> + Template>(obj: K) -> PartialObjectMeta<K> {
    let meta = obj.meta();
    let ours: BTreeMap<String, String> = obj
        .template_annotations()
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.starts_with(names::ANNOTATION_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut annotations = BTreeMap::new();
    for (key, value) in ours {
        if owned_by_its_binding(meta, K::KIND, &key) {
            annotations.insert(format!("{OWNED}{key}"), String::new());
        }
        annotations.insert(key, value);
    }
    if let Some(source) = obj.workload_ref() {
        annotations.insert(WORKLOAD_REF.to_owned(), source);
    }
    if let Some(spec) = obj.pod_spec() {
        annotations.extend(references::encode(&references::of(spec)));
    }
    annotations.extend(obj.health().encode().into_iter().flatten());
    let metadata = ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        // With the generation, tells whether the cache has caught up with a stamp.
        uid: meta.uid.clone(),
        generation: meta.generation,
        resource_version: meta.generation.is_none().then(|| meta.resource_version.clone()).flatten(),
        labels: meta.labels.clone(),
        annotations: Some(annotations).filter(|a| !a.is_empty()),
        ..ObjectMeta::default()
    };
    PartialObjectMeta { types: None, metadata, _phantom: Default::default() }
}

/// Whether this controller set `annotation` for its binding, from the object's managed fields:
/// the binding's own field manager, or the joint write of several bindings' stamps.
fn owned_by_its_binding(meta: &ObjectMeta, kind: WorkloadKind, annotation: &str) -> bool {
    let Some(part) = annotation.strip_prefix(names::ANNOTATION_PREFIX).and_then(|p| p.strip_prefix('/')) else {
        return false;
    };
    let manager = format!("consulbind-{part}");
    let field = format!("f:{annotation}");
    meta.managed_fields.iter().flatten().filter(|m| stamps_for(m, &manager)).any(|m| {
        let Some(fields) = m.fields_v1.as_ref().map(|f| &f.0) else { return false };
        let template = kind.template_path().iter().fold(fields, |at, part| &at[format!("f:{part}").as_str()]);
        !template["f:metadata"]["f:annotations"][&field].is_null()
    })
}

fn stamps_for(entry: &ManagedFieldsEntry, manager: &str) -> bool {
    match entry.manager.as_deref() {
        Some(m) if m == manager => true,
        Some(names::JOINT_MANAGER) => entry.operation.as_deref() == Some("Update"),
        _ => false,
    }
}

/// A workload found for a target.
struct Selected {
    name: String,
    /// What it carries.
    live: Option<Live>,
    version: Version,
    /// The workload it takes its template from, if any.
    workload_ref: Option<String>,
    /// The objects its pod template references, when asked for.
    references: References,
    health: Health,
    labels: BTreeMap<String, String>,
}

/// What a reconcile asks of each workload it finds, beside its name and version.
pub struct Wants<'a> {
    /// The binding's pod-template annotation: what the workload carries.
    pub annotation: &'a str,
    /// The objects its pod template references.
    pub references: bool,
    /// Its labels, which waves select by.
    pub labels: bool,
}

fn selected<K: Resource>(obj: &PartialObjectMeta<K>, wants: &Wants<'_>) -> Selected {
    let (annotation, annotations) = (wants.annotation, obj.annotations());
    let owned = |key: &str| annotations.contains_key(&format!("{OWNED}{key}"));
    let live = annotations.get(annotation).map(|value| Live { value: value.clone(), owned: owned(annotation) });
    Selected {
        name: obj.name_any(),
        live,
        version: Version::of(obj),
        workload_ref: annotations.get(WORKLOAD_REF).cloned(),
        references: if wants.references { references::decode(annotations) } else { References::new() },
        health: Health::decode(annotations),
        labels: if wants.labels { obj.labels().clone() } else { BTreeMap::new() },
    }
}

fn select<K>(
    store: &Store<PartialObjectMeta<K>>,
    namespace: &str,
    target: &TargetRef,
    wants: &Wants<'_>,
) -> Vec<Selected>
where
    K: Resource<DynamicType = ()> + Clone,
{
    if let Some(name) = &target.name {
        let key = ObjectRef::<PartialObjectMeta<K>>::new(name).within(namespace);
        return store.get(&key).map(|obj| vec![selected(&obj, wants)]).unwrap_or_default();
    }
    let Some(selector) = target.selector.clone().and_then(|s| Selector::try_from(s).ok()) else {
        return Vec::new();
    };
    let mut found: Vec<Selected> = store
        .state()
        .iter()
        .filter(|obj| obj.namespace().as_deref() == Some(namespace) && selector.matches(obj.labels()))
        .map(|obj| selected(obj, wants))
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

#[cfg(test)]
mod tests {
    use kube::core::response::Status;
    use serde_json::json;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_relist_forgets_and_reports_what_was_deleted_while_the_watch_was_down() {
        let deploy = |name: &str| ObjectRef::<Deployment>::new(name).within("ns");
        let mut seen = Seen::<Deployment>::default();
        assert!(seen.applied(deploy("a"), 1));
        assert!(seen.applied(deploy("b"), 1));
        assert!(!seen.applied(deploy("a"), 1), "a status update alone is no news");
        assert!(seen.applied(deploy("a"), 2), "new labels or annotations are");
        // The watch was down while b was deleted; the re-list shows only a and c.
        seen.relisting();
        assert!(!seen.applied(deploy("a"), 2));
        assert!(seen.applied(deploy("c"), 1));
        assert_eq!(seen.relisted(), [deploy("b")]);
        assert_eq!(seen.signatures.len(), 2, "nothing is kept for b");
        assert!(seen.relisted().is_empty(), "only a complete list says what is gone");
        seen.deleted(&deploy("c"));
        assert_eq!(seen.signatures.len(), 1);
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status { code, ..Status::default() }))
    }

    #[test]
    fn a_missing_or_forbidden_kind_is_told_apart_from_a_blip() {
        let list = |code| served_after(&watcher::Error::InitialListFailed(api_error(code)));
        assert_eq!(list(404), Some(Served::NotInstalled));
        assert_eq!(list(403), Some(Served::Forbidden));
        assert_eq!(list(500), None, "a server error says nothing about the kind");
        let watch = watcher::Error::WatchStartFailed(api_error(404));
        assert_eq!(served_after(&watch), Some(Served::NotInstalled));
    }

    #[test]
    fn a_rollout_with_a_workload_ref_is_marked_and_keeps_only_our_annotations() {
        let rollout: Rollout = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "a", "uid": "u-1", "generation": 4,
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"workloadRef": {"kind": "Deployment", "name": "web-template"},
                "template": {"metadata": {"annotations": {"checksum.consulbind.dev/cfg": "abc", "other": "x"}}}}
        }))
        .unwrap();
        let meta = live_meta(rollout);
        let annotations = meta.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.get(WORKLOAD_REF).map(String::as_str), Some(r#"Deployment "web-template""#));
        assert_eq!(annotations.get("checksum.consulbind.dev/cfg").map(String::as_str), Some("abc"));
        assert!(
            !annotations.contains_key("other")
                && !annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration")
        );
        assert_eq!(Version::of(&meta), Version { uid: "u-1".into(), generation: 4 }, "a stamp is trusted by both");
    }

    #[tokio::test(start_paused = true)]
    async fn a_kind_not_served_is_listed_less_and_less_often_and_a_lasting_watch_starts_afresh() {
        use kube::runtime::utils::Backoff;
        let exponential = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(800))
            .with_max_delay(Duration::from_secs(8))
            .without_max_times();
        let mut backoff = Patient::new(watcher::ExponentialBackoff::from(exponential));
        let mut delays = Vec::new();
        for _ in 0..6 {
            let delay = backoff.next().unwrap();
            delays.push(delay);
            tokio::time::advance(delay).await;
            // The watcher's Init before it tries the list again.
            backoff.reset();
        }
        let tenths: Vec<u128> = delays.iter().map(|d| d.as_millis() / 100).collect();
        assert_eq!(tenths, [8, 16, 32, 64, 80, 80], "the retry's own start reset nothing");
        tokio::time::advance(Duration::from_secs(30)).await;
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(800)), "a watch that lasted starts afresh");
    }

    #[test]
    fn an_annotation_is_owned_when_its_binding_or_a_joint_write_set_it_and_not_after_a_rollback() {
        let entry = |manager: &str, operation: &str, annotations: &[&str]| {
            let fields: serde_json::Map<_, _> =
                annotations.iter().map(|a| (format!("f:checksum.consulbind.dev/{a}"), json!({}))).collect();
            json!({"manager": manager, "operation": operation, "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:template": {"f:metadata": {"f:annotations": fields}}}}})
        };
        let owned = |entries: Vec<serde_json::Value>, binding: &str| {
            let meta: ObjectMeta = serde_json::from_value(json!({"managedFields": entries})).unwrap();
            owned_by_its_binding(&meta, WorkloadKind::Deployment, &format!("checksum.consulbind.dev/{binding}"))
        };
        assert!(owned(vec![entry("consulbind-a", "Apply", &["a"])], "a"));
        assert!(!owned(vec![entry("consulbind-b", "Apply", &["a", "b"])], "a"), "another binding's manager");
        assert!(owned(vec![entry("consulbind", "Update", &["a", "b"])], "b"), "a joint write");
        assert!(!owned(vec![entry("consulbind", "Apply", &["a"])], "a"), "a joint write is an update");
        assert!(!owned(vec![entry("kube-controller-manager", "Update", &["a"])], "a"), "a rollback");
        assert!(!owned(vec![entry("consulbind", "Update", &["b"])], "a"));
        // A CronJob's is on its job template.
        let meta: ObjectMeta = serde_json::from_value(json!({"managedFields": [{
            "manager": "consulbind-a", "operation": "Apply", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:jobTemplate": {"f:spec": {"f:template": {"f:metadata": {"f:annotations": {
                "f:checksum.consulbind.dev/a": {}}}}}}}}}]}))
        .unwrap();
        assert!(owned_by_its_binding(&meta, WorkloadKind::CronJob, "checksum.consulbind.dev/a"));
        assert!(!owned_by_its_binding(&meta, WorkloadKind::Deployment, "checksum.consulbind.dev/a"));
    }
}
