//! The workloads bindings roll: metadata-only caches to find them, and the stamp that rolls them.

use std::collections::BTreeSet;

use consulbind_api::{TargetRef, WorkloadKind};
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
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

use crate::plan::Workload;

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

/// Which targets exist.
#[derive(Debug, Default)]
pub struct Resolved {
    pub found: Vec<Workload>,
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

    /// The workloads in `namespace` that `targets` name or select.
    pub fn resolve(&self, namespace: &str, targets: &[TargetRef]) -> Resolved {
        let mut found = BTreeSet::new();
        let mut missing = Vec::new();
        for target in targets {
            let names = match target.kind {
                WorkloadKind::Deployment => select(&self.deployments, namespace, target),
                WorkloadKind::StatefulSet => select(&self.statefulsets, namespace, target),
                WorkloadKind::DaemonSet => select(&self.daemonsets, namespace, target),
            };
            if names.is_empty() {
                missing.push(match (&target.name, &target.selector) {
                    (Some(name), _) => format!("{} {name:?} not found", target.kind),
                    (None, _) => format!("no {} matches the selector", target.kind),
                });
            }
            found.extend(names.into_iter().map(|n| (target.kind, n)));
        }
        Resolved { found: found.into_iter().collect(), missing }
    }
}

fn cache<K>(
    client: &Client,
    namespace: Option<&str>,
    kind: WorkloadKind,
) -> (Store<PartialObjectMeta<K>>, futures::stream::BoxStream<'static, Touched>)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<PartialObjectMeta<K>> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (reader, writer) = reflector::store();
    let mut seen = std::collections::HashMap::new();
    // Names and labels are all the caches need; the rest would cost memory per workload.
    let stream = watcher(api, watcher::Config::default()).default_backoff().modify(strip::<PartialObjectMeta<K>>);
    let stream = reflector::reflector(writer, stream)
        .filter_map(move |event| {
            let touched = match event {
                Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                    let signature = (obj.uid(), obj.labels().clone());
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

/// Drops what no cache reads: annotations (with kubectl's last-applied copy), managed fields,
/// owner references and finalizers.
pub fn strip<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.annotations = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

fn select<K>(store: &Store<PartialObjectMeta<K>>, namespace: &str, target: &TargetRef) -> Vec<String>
where
    K: Resource<DynamicType = ()> + Clone,
{
    if let Some(name) = &target.name {
        let key = ObjectRef::<PartialObjectMeta<K>>::new(name).within(namespace);
        return store.get(&key).map(|_| vec![name.clone()]).unwrap_or_default();
    }
    let Some(selector) = target.selector.clone().and_then(|s| Selector::try_from(s).ok()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = store
        .state()
        .iter()
        .filter(|obj| obj.namespace().as_deref() == Some(namespace) && selector.matches(obj.labels()))
        .map(|obj| obj.name_any())
        .collect();
    names.sort();
    names
}

/// Sets the binding's annotation on the workload's pod template, and nothing else, by
/// server-side apply as the binding's own field manager. Kubernetes then rolls the workload.
pub async fn stamp(
    client: &Client,
    namespace: &str,
    (kind, name): &Workload,
    annotation: &str,
    checksum: &str,
    field_manager: &str,
) -> kube::Result<()> {
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
) -> kube::Result<()>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), namespace).patch(name, params, &Patch::Apply(body)).await.map(drop)
}

/// Whether `selector` is usable, for spec validation.
pub fn selector_error(target: &TargetRef) -> Option<String> {
    let selector = target.selector.clone()?;
    Selector::try_from(selector).err().map(|e| format!("invalid selector on {} target: {e}", target.kind))
}
