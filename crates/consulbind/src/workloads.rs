//! The workloads bindings roll: small caches to find them and to see what they carry, and the stamp
//! that rolls them.

use std::collections::BTreeMap;

use consulbind_api::{TargetRef, WorkloadKind};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::{
    api::apps::v1::{DaemonSet, Deployment, StatefulSet},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::PartialObjectMeta,
    core::{Selector, SelectorExt},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, watcher},
    },
};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::{
    names,
    plan::{Live, Workload},
};

/// Metadata caches of the three workload kinds in one scope (a namespace, or all).
#[derive(Clone)]
pub struct Workloads {
    deployments: Store<PartialObjectMeta<Deployment>>,
    statefulsets: Store<PartialObjectMeta<StatefulSet>>,
    daemonsets: Store<PartialObjectMeta<DaemonSet>>,
}

/// A workload that was added, deleted or relabelled.
pub struct Touched {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Which targets exist, and what they carry.
#[derive(Debug, Default)]
pub struct Resolved {
    pub found: Vec<Workload>,
    /// The binding's annotation on each found workload that has it.
    pub live: BTreeMap<Workload, Live>,
    /// The generation of each found workload, as cached.
    pub generations: BTreeMap<Workload, i64>,
    pub missing: Vec<String>,
}

impl Workloads {
    /// Starts the caches. The returned stream must be polled to keep them current; it yields
    /// when a workload appears, disappears or changes labels, never for mere status updates.
    pub fn start(client: &Client, namespace: Option<&str>) -> (Self, impl Stream<Item = Touched> + Send + 'static) {
        let (deployments, d) = cache::<Deployment>(client, namespace, WorkloadKind::Deployment);
        let (statefulsets, s) = cache::<StatefulSet>(client, namespace, WorkloadKind::StatefulSet);
        let (daemonsets, ds) = cache::<DaemonSet>(client, namespace, WorkloadKind::DaemonSet);
        (Self { deployments, statefulsets, daemonsets }, futures::stream::select_all([d, s, ds]))
    }

    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.deployments.wait_until_ready().await?;
        self.statefulsets.wait_until_ready().await?;
        self.daemonsets.wait_until_ready().await
    }

    /// The workloads in `namespace` that `targets` name or select, with what each carries in
    /// the pod-template annotation `annotation`.
    pub fn resolve(&self, namespace: &str, targets: &[TargetRef], annotation: &str) -> Resolved {
        let mut found = BTreeMap::new();
        let mut missing = Vec::new();
        for target in targets {
            let live = match target.kind {
                WorkloadKind::Deployment => select(&self.deployments, namespace, target, annotation),
                WorkloadKind::StatefulSet => select(&self.statefulsets, namespace, target, annotation),
                WorkloadKind::DaemonSet => select(&self.daemonsets, namespace, target, annotation),
            };
            if live.is_empty() {
                missing.push(match (&target.name, &target.selector) {
                    (Some(name), _) => format!("{} {name:?} not found", target.kind),
                    (None, _) => format!("no {} matches the selector", target.kind),
                });
            }
            found.extend(live.into_iter().map(|(name, live, generation)| ((target.kind, name), (live, generation))));
        }
        let live = found.iter().filter_map(|(w, (l, _))| Some((w.clone(), l.clone()?))).collect();
        let generations = found.iter().map(|(w, (_, g))| (w.clone(), *g)).collect();
        Resolved { found: found.into_keys().collect(), live, generations, missing }
    }
}

fn cache<K>(
    client: &Client,
    namespace: Option<&str>,
    kind: WorkloadKind,
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
    let mut seen = std::collections::HashMap::new();
    // Whole objects arrive, for the pod template's annotations; what is kept is their name,
    // labels and this controller's annotations, so memory stays small per workload.
    let stream = watcher(api, watcher::Config::default()).default_backoff().map_ok(|event| event_of(event, live_meta));
    let stream = reflector::reflector(writer, stream)
        .filter_map(move |event| {
            let touched = match event {
                Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                    let signature = (obj.uid(), obj.labels().clone(), obj.annotations().clone());
                    (seen.insert(ObjectRef::from_obj(&obj), signature.clone()) != Some(signature)).then_some(obj)
                }
                Ok(watcher::Event::Delete(obj)) => {
                    seen.remove(&ObjectRef::from_obj(&obj));
                    Some(obj)
                }
                Err(error) => {
                    tracing::warn!(%kind, %error, "watching workloads failed; retrying");
                    None
                }
                _ => None,
            };
            futures::future::ready(touched.map(|obj| Touched {
                kind,
                namespace: obj.namespace().unwrap_or_default(),
                name: obj.name_any(),
                labels: obj.labels().clone(),
            }))
        })
        .boxed();
    (reader, stream)
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

/// A workload's pod template annotations.
pub trait Template {
    fn template_annotations(&self) -> Option<&BTreeMap<String, String>>;
}

macro_rules! template {
    ($($kind:ty),*) => {$(
        impl Template for $kind {
            fn template_annotations(&self) -> Option<&BTreeMap<String, String>> {
                self.spec.as_ref()?.template.metadata.as_ref()?.annotations.as_ref()
            }
        }
    )*};
}
template!(Deployment, StatefulSet, DaemonSet);

/// Marks, in a cached workload's annotations, that the binding's own field manager set the
/// annotation after it; anything else (a rollout undo, a hand edit) set the live value.
const OWNED: &str = "owned.";

/// What the caches keep of a workload: name, namespace, uid and labels, and as annotations this
/// controller's pod-template annotations, each with an [`OWNED`] mark when the binding's field
/// manager holds it.
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
        if owned_by_its_binding(meta, &key) {
            annotations.insert(format!("{OWNED}{key}"), String::new());
        }
        annotations.insert(key, value);
    }
    let metadata = ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        generation: meta.generation,
        labels: meta.labels.clone(),
        annotations: Some(annotations).filter(|a| !a.is_empty()),
        ..ObjectMeta::default()
    };
    PartialObjectMeta { types: None, metadata, _phantom: Default::default() }
}

/// Whether the field manager of the binding that owns `annotation` manages it, from the
/// object's managed fields.
fn owned_by_its_binding(meta: &ObjectMeta, annotation: &str) -> bool {
    let Some(part) = annotation.strip_prefix(names::ANNOTATION_PREFIX).and_then(|p| p.strip_prefix('/')) else {
        return false;
    };
    let manager = format!("consulbind-{part}");
    let field = format!("f:{annotation}");
    meta.managed_fields.iter().flatten().filter(|m| m.manager.as_deref() == Some(manager.as_str())).any(|m| {
        let fields = m.fields_v1.as_ref().map(|f| &f.0);
        fields.is_some_and(|f| !f["f:spec"]["f:template"]["f:metadata"]["f:annotations"][&field].is_null())
    })
}

/// Drops what no cache reads: annotations (with kubectl's last-applied copy), managed fields,
/// owner references and finalizers.
pub fn strip<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.annotations = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

fn generation<K: Resource>(obj: &K) -> i64 {
    obj.meta().generation.unwrap_or_default()
}

fn select<K>(
    store: &Store<PartialObjectMeta<K>>,
    namespace: &str,
    target: &TargetRef,
    annotation: &str,
) -> Vec<(String, Option<Live>, i64)>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let live = |obj: &PartialObjectMeta<K>| {
        let annotations = obj.annotations();
        let value = annotations.get(annotation)?.clone();
        Some(Live { value, owned: annotations.contains_key(&format!("{OWNED}{annotation}")) })
    };
    if let Some(name) = &target.name {
        let key = ObjectRef::<PartialObjectMeta<K>>::new(name).within(namespace);
        return store.get(&key).map(|obj| vec![(name.clone(), live(&obj), generation(&*obj))]).unwrap_or_default();
    }
    let Some(selector) = target.selector.clone().and_then(|s| Selector::try_from(s).ok()) else {
        return Vec::new();
    };
    let mut found: Vec<(String, Option<Live>, i64)> = store
        .state()
        .iter()
        .filter(|obj| obj.namespace().as_deref() == Some(namespace) && selector.matches(obj.labels()))
        .map(|obj| (obj.name_any(), live(obj), generation(&**obj)))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Sets the binding's annotation on the workload's pod template, and nothing else, by
/// server-side apply as the binding's own field manager. Kubernetes then rolls the workload.
/// Returns the workload's generation after the patch.
pub async fn stamp(
    client: &Client,
    namespace: &str,
    (kind, name): &Workload,
    annotation: &str,
    checksum: &str,
    field_manager: &str,
) -> kube::Result<i64> {
    let body = json!({
        "apiVersion": "apps/v1",
        "kind": kind.as_str(),
        "metadata": { "name": name },
        "spec": { "template": { "metadata": { "annotations": { annotation: checksum } } } },
    });
    let params = PatchParams::apply(field_manager).force();
    match kind {
        WorkloadKind::Deployment => apply::<Deployment>(client, namespace, name, &params, &body).await,
        WorkloadKind::StatefulSet => apply::<StatefulSet>(client, namespace, name, &params, &body).await,
        WorkloadKind::DaemonSet => apply::<DaemonSet>(client, namespace, name, &params, &body).await,
    }
}

async fn apply<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    params: &PatchParams,
    body: &serde_json::Value,
) -> kube::Result<i64>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let patched = Api::<K>::namespaced(client.clone(), namespace).patch(name, params, &Patch::Apply(body)).await?;
    Ok(generation(&patched))
}

/// Whether `selector` is usable, for spec validation.
pub fn selector_error(target: &TargetRef) -> Option<String> {
    let selector = target.selector.clone()?;
    Selector::try_from(selector).err().map(|e| format!("invalid selector on {} target: {e}", target.kind))
}
