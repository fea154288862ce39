//! The rollout itself: the binding's annotation on each workload's pod template. One of the
//! two places that write to the cluster.

use std::collections::BTreeMap;

use consulbind_api::WorkloadKind;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::{
    Client, Resource,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tracing::debug;

use super::{
    context::Context,
    desk::{Stamp, Turn, Written},
    input::{Outcome, Plan},
};
use crate::{
    BindingRef, Lock,
    cluster::{
        self, Version, Workload,
        argo::Rollout,
        cronjob::{CronJob, CronJobV1Beta1},
    },
    names,
};

/// How many workloads of one binding are patched at once.
const STAMP_CONCURRENCY: usize = 8;

/// Stamps the planned value on every workload of `plan.roll`, a few at a time, and remembers
/// each stamp until the workload cache shows it. A workload that other bindings in flight may
/// stamp too gets their stamps in the same write (see [`desk`](super::desk)).
pub async fn stamp_all(
    ctx: &Context,
    binding: &BindingRef,
    plan: &Plan,
    versions: &BTreeMap<Workload, Version>,
) -> Outcome {
    let namespace = binding.namespace().to_owned();
    let turns: Vec<(Workload, String, Turn)> = plan
        .roll
        .iter()
        .map(|workload| {
            let value = plan.values[workload].clone();
            let stamp = stamp_of(binding, value.clone());
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
            let uid = versions.get(&workload).map(|v| v.uid.as_str()).filter(|uid| !uid.is_empty());
            let target = &workload;
            let (result, carried) = ctx
                .desk
                .run(turn, |stamps| async move {
                    let _slot = ctx.writes.permit(namespace).await.map_err(|e| e.to_string())?;
                    let api_version = ctx.workloads.api_version(target.0);
                    write(&ctx.client, namespace, target, api_version, uid, stamps).await
                })
                .await;
            ctx.metrics.stage("patch", started.elapsed());
            if let Ok(version) = &result {
                ctx.states.update(binding, |r| r.stamps.insert(workload.clone(), (version.clone(), value)));
                for stamp in carried {
                    debug!(binding = %stamp.binding, workload = %workload.1, by = %binding, "held stamp carried");
                    let remembered = (version.clone(), stamp.value);
                    ctx.states.update(&stamp.binding, |r| r.stamps.insert(workload.clone(), remembered));
                }
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

/// Puts on the desk the stamps of the targets the plan holds back (see [`desk`](super::desk)).
pub fn hold(ctx: &Context, binding: &BindingRef, plan: &Plan) {
    let namespace = binding.namespace().to_owned();
    let held = plan.held.iter().map(|w| ((namespace.clone(), w.clone()), stamp_of(binding, plan.content[w].clone())));
    ctx.desk.hold(binding, held.collect());
}

fn stamp_of(binding: &BindingRef, value: String) -> Stamp {
    Stamp {
        binding: binding.clone(),
        annotation: names::annotation_key(binding.name()),
        value,
        manager: names::field_manager(binding.name()),
    }
}

/// Sets the stamped annotations on the workload's pod template, and nothing else. Kubernetes
/// then rolls the workload. One stamp is server-side-applied as its binding's own field
/// manager; several, due together, go in one merge patch as [`names::JOINT_MANAGER`], so that
/// one change is one new generation. Either way the workload's managed fields say that this
/// controller set each annotation (an apply also loses the field to a rollout undo, which an
/// update shares). With `uid`, the write is held to the object the cache last saw: a workload
/// deleted since is not created by the apply, and one made again under its name is left for
/// the next look. Returns the workload's uid and generation after the write.
async fn write(
    client: &Client,
    namespace: &str,
    workload: &Workload,
    api_version: &str,
    uid: Option<&str>,
    stamps: Vec<Stamp>,
) -> Written {
    let (kind, name) = workload;
    let (body, params) = body(workload, api_version, uid, &stamps);
    let patched = match kind {
        WorkloadKind::Deployment => patch::<Deployment>(client, namespace, name, &params, &body).await,
        WorkloadKind::StatefulSet => patch::<StatefulSet>(client, namespace, name, &params, &body).await,
        WorkloadKind::DaemonSet => patch::<DaemonSet>(client, namespace, name, &params, &body).await,
        WorkloadKind::Rollout => patch::<Rollout>(client, namespace, name, &params, &body).await,
        WorkloadKind::CronJob if api_version == CronJob::api_version(&()) => {
            patch::<CronJob>(client, namespace, name, &params, &body).await
        }
        WorkloadKind::CronJob => patch::<CronJobV1Beta1>(client, namespace, name, &params, &body).await,
    };
    patched.map_err(failure)
}

/// What a failed stamp tells the binding's status.
fn failure(error: kube::Error) -> String {
    match &error {
        // An apply held to a uid that finds no object: 409, `... "web": uid mismatch: ...` (no
        // name has a space).
        kube::Error::Api(status) if status.code == 409 && status.message.contains(": uid mismatch") => {
            "it is gone; nothing was stamped".to_owned()
        }
        kube::Error::Api(status) if status.code == 404 => {
            "it is gone, or its kind is no longer served; nothing was stamped".to_owned()
        }
        // Another uid under the name is refused as a change of an immutable field.
        kube::Error::Api(status) if status.code == 422 && status.message.contains("metadata.uid") => {
            "it was deleted and made again since it was read; it is looked at again".to_owned()
        }
        _ => error.to_string(),
    }
}

/// The write of `stamps` on the pod template: an apply of one, a merge patch of several.
fn body(
    (kind, name): &Workload,
    api_version: &str,
    uid: Option<&str>,
    stamps: &[Stamp],
) -> (Patch<serde_json::Value>, PatchParams) {
    let annotations: serde_json::Map<String, serde_json::Value> =
        stamps.iter().map(|s| (s.annotation.clone(), s.value.clone().into())).collect();
    let template = json!({ "metadata": { "annotations": annotations } });
    let mut body = kind.template_path().iter().rev().fold(template, |inner, part| json!({ *part: inner }));
    if let Some(uid) = uid {
        body["metadata"] = json!({ "uid": uid });
    }
    match stamps {
        [alone] => {
            body["apiVersion"] = api_version.into();
            body["kind"] = kind.as_str().into();
            body["metadata"]["name"] = name.as_str().into();
            (Patch::Apply(body), PatchParams::apply(&alone.manager).force())
        }
        _ => {
            let params = PatchParams { field_manager: Some(names::JOINT_MANAGER.into()), ..PatchParams::default() };
            (Patch::Merge(body), params)
        }
    }
}

/// The patch through the client itself rather than `Api<K>`, whose answer would be built
/// into a whole `K` only for its uid and generation.
async fn patch<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    params: &PatchParams,
    body: &Patch<serde_json::Value>,
) -> kube::Result<Version>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
{
    let request = kube::core::Request::new(K::url_path(&(), Some(namespace)));
    let request = request.patch(name, params, body).map_err(kube::Error::BuildRequest)?;
    Ok(client.request::<cluster::Written>(request).await?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_is_held_to_the_object_the_cache_saw() {
        let web: Workload = (WorkloadKind::Deployment, "web".into());
        let stamp = |binding: &str| Stamp {
            binding: BindingRef::new("ns", binding),
            annotation: format!("checksum.consulbind.dev/{binding}"),
            value: format!("v2:{binding}"),
            manager: format!("consulbind-{binding}"),
        };
        let (Patch::Apply(alone), params) = body(&web, "apps/v1", Some("u-1"), &[stamp("a")]) else {
            panic!("not an apply")
        };
        assert_eq!(
            alone,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "uid": "u-1"},
                "spec": {"template": {"metadata": {"annotations": {"checksum.consulbind.dev/a": "v2:a"}}}}})
        );
        assert_eq!(params.field_manager.as_deref(), Some("consulbind-a"));

        let (Patch::Merge(joint), params) = body(&web, "apps/v1", Some("u-1"), &[stamp("a"), stamp("b")]) else {
            panic!("not a merge patch")
        };
        assert_eq!(joint["metadata"], json!({"uid": "u-1"}));
        assert_eq!(joint["spec"]["template"]["metadata"]["annotations"].as_object().unwrap().len(), 2);
        assert_eq!(params.field_manager.as_deref(), Some(names::JOINT_MANAGER));

        let (Patch::Merge(unknown), _) = body(&web, "apps/v1", None, &[stamp("a"), stamp("b")]) else { panic!() };
        assert!(unknown.get("metadata").is_none(), "no uid to hold it to");

        let nightly: Workload = (WorkloadKind::CronJob, "nightly".into());
        let (Patch::Apply(cron), _) = body(&nightly, "batch/v1beta1", None, &[stamp("a")]) else { panic!() };
        assert_eq!(
            cron,
            json!({"apiVersion": "batch/v1beta1", "kind": "CronJob", "metadata": {"name": "nightly"},
                "spec": {"jobTemplate": {"spec": {"template": {"metadata": {"annotations": {
                    "checksum.consulbind.dev/a": "v2:a"}}}}}}}),
            "a CronJob's stamp goes on its job template"
        );
    }

    /// A stamp refused because its workload went, or was made again, says so; any other
    /// failure is told as the API server gave it.
    #[test]
    fn a_failed_stamp_tells_why_in_words_a_person_can_act_on() {
        let api = |code, message: &str| {
            failure(kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.into(),
                ..Default::default()
            })))
        };
        let mismatch =
            r#"Operation cannot be fulfilled on deployments.apps "web": uid mismatch: the object was deleted"#;
        assert_eq!(api(409, mismatch), "it is gone; nothing was stamped");
        assert_eq!(api(404, "not found"), "it is gone, or its kind is no longer served; nothing was stamped");
        let made_again = "Deployment.apps \"web\" is invalid: metadata.uid: Invalid value";
        assert_eq!(api(422, made_again), "it was deleted and made again since it was read; it is looked at again");
        for (code, message) in [(409, "the object has been modified"), (422, mismatch), (500, "etcdserver: timeout")] {
            let told = api(code, message);
            assert!(told.contains(message) && !told.contains("nothing was stamped"), "{code}: {told}");
        }
    }
}
