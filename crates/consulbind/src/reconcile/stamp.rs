//! The rollout itself: the binding's annotation, server-side-applied to each workload's pod
//! template. One of the two places that write to the cluster.

use consulbind_api::WorkloadKind;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{
    context::Context,
    plan::{Outcome, Plan},
};
use crate::{
    BindingRef,
    cluster::{Version, Workload, argo::Rollout},
    names,
};

/// How many workloads of one binding are patched at once.
const STAMP_CONCURRENCY: usize = 8;

/// Stamps the planned value on every workload of `plan.roll`, a few at a time, and remembers
/// each stamp until the workload cache shows it.
pub async fn stamp_all(ctx: &Context, binding: &BindingRef, plan: &Plan, desired: &str) -> Outcome {
    let namespace = binding.namespace.as_deref().unwrap_or_default();
    let annotation = names::annotation_key(&binding.name);
    let manager = names::field_manager(&binding.name);
    let (annotation, manager) = (&annotation, &manager);
    let results: Vec<_> = futures::stream::iter(plan.roll.iter().cloned())
        .map(|workload| async move {
            let started = std::time::Instant::now();
            let value = plan.values.get(&workload).map_or(desired, String::as_str);
            let result = stamp(&ctx.client, namespace, &workload, annotation, value, manager).await;
            ctx.metrics.stage("patch", started.elapsed());
            if let Ok(version) = &result {
                ctx.states.update(binding, |r| r.stamps.insert(workload.clone(), (version.clone(), value.to_owned())));
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

/// Sets the binding's annotation on the workload's pod template, and nothing else, by
/// server-side apply as the binding's own field manager. Kubernetes then rolls the workload.
/// Returns the workload's uid and generation after the patch.
async fn stamp(
    client: &Client,
    namespace: &str,
    (kind, name): &Workload,
    annotation: &str,
    checksum: &str,
    field_manager: &str,
) -> kube::Result<Version> {
    let body = json!({
        "apiVersion": kind.api_version(),
        "kind": kind.as_str(),
        "metadata": { "name": name },
        "spec": { "template": { "metadata": { "annotations": { annotation: checksum } } } },
    });
    let params = PatchParams::apply(field_manager).force();
    match kind {
        WorkloadKind::Deployment => apply::<Deployment>(client, namespace, name, &params, &body).await,
        WorkloadKind::StatefulSet => apply::<StatefulSet>(client, namespace, name, &params, &body).await,
        WorkloadKind::DaemonSet => apply::<DaemonSet>(client, namespace, name, &params, &body).await,
        WorkloadKind::Rollout => apply::<Rollout>(client, namespace, name, &params, &body).await,
    }
}

async fn apply<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    params: &PatchParams,
    body: &serde_json::Value,
) -> kube::Result<Version>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let patched = Api::<K>::namespaced(client.clone(), namespace).patch(name, params, &Patch::Apply(body)).await?;
    Ok(Version::of(&patched))
}
