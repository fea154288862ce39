//! The rollout itself: the binding's annotation on each workload's pod template. One of the
//! two places that write to the cluster.

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
    desk::{Stamp, Turn, Written},
    plan::{Outcome, Plan},
};
use crate::{
    BindingRef, Lock,
    cluster::{Version, Workload, argo::Rollout},
    names,
};

/// How many workloads of one binding are patched at once.
const STAMP_CONCURRENCY: usize = 8;

/// Stamps the planned value on every workload of `plan.roll`, a few at a time, and remembers
/// each stamp until the workload cache shows it. A workload that other bindings in flight may
/// stamp too gets their stamps in the same write (see [`desk`](super::desk)).
pub async fn stamp_all(ctx: &Context, binding: &BindingRef, plan: &Plan, desired: &str) -> Outcome {
    let namespace = binding.namespace.clone().unwrap_or_default();
    let annotation = names::annotation_key(&binding.name);
    let manager = names::field_manager(&binding.name);
    let turns: Vec<(Workload, String, Turn)> = plan
        .roll
        .iter()
        .map(|workload| {
            let value = plan.values.get(workload).map_or(desired, String::as_str).to_owned();
            let stamp = Stamp { annotation: annotation.clone(), value: value.clone(), manager: manager.clone() };
            let (kind, name) = workload;
            let mut others = ctx.interest.locked().workload(&namespace, *kind, name, &Default::default());
            others.remove(binding);
            let target = (namespace.clone(), workload.clone());
            (workload.clone(), value, ctx.desk.submit(target, stamp, others.into_iter().collect()))
        })
        .collect();
    ctx.desk.planned(binding);
    let namespace = namespace.as_str();
    let results: Vec<_> = futures::stream::iter(turns)
        .map(|(workload, value, turn)| async move {
            let started = std::time::Instant::now();
            let result = ctx.desk.run(turn, |stamps| write(&ctx.client, namespace, &workload, stamps)).await;
            ctx.metrics.stage("patch", started.elapsed());
            if let Ok(version) = &result {
                ctx.states.update(binding, |r| r.stamps.insert(workload.clone(), (version.clone(), value)));
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
            Err(e) => outcome.failed.push((workload, e)),
        }
    }
    outcome.rolled.sort();
    outcome.failed.sort();
    outcome
}

/// Sets the stamped annotations on the workload's pod template, and nothing else. Kubernetes
/// then rolls the workload. One stamp is server-side-applied as its binding's own field
/// manager; several, due together, go in one merge patch as [`names::JOINT_MANAGER`], so that
/// one change is one new generation. Either way the workload's managed fields say that this
/// controller set each annotation. Returns the workload's uid and generation after the write.
async fn write(client: &Client, namespace: &str, (kind, name): &Workload, stamps: Vec<Stamp>) -> Written {
    let annotations: serde_json::Map<String, serde_json::Value> =
        stamps.iter().map(|s| (s.annotation.clone(), s.value.clone().into())).collect();
    let template = json!({ "template": { "metadata": { "annotations": annotations } } });
    let (body, params) = match stamps.as_slice() {
        [alone] => {
            let body = json!({
                "apiVersion": kind.api_version(),
                "kind": kind.as_str(),
                "metadata": { "name": name },
                "spec": template,
            });
            (Patch::Apply(body), PatchParams::apply(&alone.manager).force())
        }
        _ => {
            let params = PatchParams { field_manager: Some(names::JOINT_MANAGER.into()), ..PatchParams::default() };
            (Patch::Merge(json!({ "spec": template })), params)
        }
    };
    let patched = match kind {
        WorkloadKind::Deployment => patch::<Deployment>(client, namespace, name, &params, &body).await,
        WorkloadKind::StatefulSet => patch::<StatefulSet>(client, namespace, name, &params, &body).await,
        WorkloadKind::DaemonSet => patch::<DaemonSet>(client, namespace, name, &params, &body).await,
        WorkloadKind::Rollout => patch::<Rollout>(client, namespace, name, &params, &body).await,
    };
    patched.map_err(|e| e.to_string())
}

async fn patch<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    params: &PatchParams,
    body: &Patch<serde_json::Value>,
) -> kube::Result<Version>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let patched = Api::<K>::namespaced(client.clone(), namespace).patch(name, params, body).await?;
    Ok(Version::of(&patched))
}
