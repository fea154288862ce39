//! A workload's pod template, and what a cache keeps of it: this controller's annotations,
//! each marked when its binding's field manager set it, the objects the template references,
//! and the workload's health.

use std::collections::BTreeMap;

use consulbind_api::WorkloadKind;
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment, StatefulSet},
        core::v1::PodSpec,
    },
    apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time},
};
use kube::Resource;

use super::kept::Kept;
use crate::{
    cluster::{
        Version,
        argo::Rollout,
        cronjob::{CronJob, CronJobV1Beta1},
        health::{self, Health},
        references,
    },
    names,
};

/// Set on a cached Rollout that takes its template from another workload, with that
/// workload's kind and name.
pub(super) const WORKLOAD_REF: &str = "workload-ref";

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
/// annotation after it; anything else (a rollout undo, a hand edit) set the live value. The
/// mark's value is when, in seconds since the epoch as the managed fields keep it (or empty).
pub(super) const OWNED: &str = "owned.";

/// What the caches keep of a workload: name, namespace, uid, generation and labels, and as annotations this
/// controller's pod-template annotations, each with an [`OWNED`] mark when the binding's field
/// manager holds it, and the ConfigMaps and Secrets its pod template references.
pub(super) fn live_meta<K: Resource<DynamicType = ()> + Template>(obj: K) -> Kept {
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
        if let Some(at) = stamped_by_its_binding(meta, K::KIND, &key) {
            annotations.insert(format!("{OWNED}{key}"), at.map(|t| t.0.as_second().to_string()).unwrap_or_default());
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
    let (name, namespace) = (meta.name.as_deref().unwrap_or_default(), meta.namespace.as_deref().unwrap_or_default());
    // The version tells whether the cache has caught up with a stamp.
    Kept::new(name, namespace, Version::of(&obj), meta.labels.clone().unwrap_or_default().into(), annotations.into())
}

/// Whether this controller set `annotation` for its binding, from the object's managed fields:
/// the binding's own field manager, or the joint write of several bindings' stamps; and if so,
/// when that manager last changed the object, if the entry says.
fn stamped_by_its_binding(meta: &ObjectMeta, kind: WorkloadKind, annotation: &str) -> Option<Option<Time>> {
    let part = annotation.strip_prefix(names::ANNOTATION_PREFIX).and_then(|p| p.strip_prefix('/'))?;
    let manager = format!("consulbind-{part}");
    let field = format!("f:{annotation}");
    let entry = meta.managed_fields.iter().flatten().filter(|m| stamps_for(m, &manager)).find(|m| {
        let Some(fields) = m.fields_v1.as_ref().map(|f| &f.0) else { return false };
        let template = kind.template_path().iter().fold(fields, |at, part| &at[format!("f:{part}").as_str()]);
        !template["f:metadata"]["f:annotations"][&field].is_null()
    })?;
    Some(entry.time.clone())
}

fn stamps_for(entry: &ManagedFieldsEntry, manager: &str) -> bool {
    match entry.manager.as_deref() {
        Some(m) if m == manager => true,
        Some(names::JOINT_MANAGER) => entry.operation.as_deref() == Some("Update"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_rollout_with_a_workload_ref_is_marked_and_keeps_only_our_annotations() {
        let rollout: Rollout = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "a", "uid": "u-1", "generation": 4,
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"workloadRef": {"kind": "Deployment", "name": "web-template"},
                "template": {"metadata": {"annotations": {"checksum.consulbind.dev/cfg": "abc", "other": "x"}}}}
        }))
        .unwrap();
        let kept = live_meta(rollout);
        let annotations = &kept.annotations;
        assert_eq!(annotations.get(WORKLOAD_REF), Some(r#"Deployment "web-template""#));
        assert_eq!(annotations.get("checksum.consulbind.dev/cfg"), Some("abc"));
        assert!(
            !annotations.contains_key("other")
                && !annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration")
        );
        assert_eq!(kept.version(), Version { uid: "u-1".into(), generation: 4 }, "a stamp is trusted by both");
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
            stamped_by_its_binding(&meta, WorkloadKind::Deployment, &format!("checksum.consulbind.dev/{binding}"))
                .is_some()
        };
        assert!(owned(vec![entry("consulbind-a", "Apply", &["a"])], "a"));
        assert!(!owned(vec![entry("consulbind-b", "Apply", &["a", "b"])], "a"), "another binding's manager");
        assert!(owned(vec![entry("consulbind", "Update", &["a", "b"])], "b"), "a joint write");
        assert!(!owned(vec![entry("consulbind", "Apply", &["a"])], "a"), "a joint write is an update");
        assert!(!owned(vec![entry("kube-controller-manager", "Update", &["a"])], "a"), "a rollback");
        assert!(!owned(vec![entry("consulbind", "Update", &["b"])], "a"));
        // When it was set: its manager's entry's time.
        let mut timed = entry("consulbind-a", "Apply", &["a"]);
        timed["time"] = json!("2026-11-29T10:00:00Z");
        let meta: ObjectMeta = serde_json::from_value(json!({"managedFields": [timed]})).unwrap();
        let at = stamped_by_its_binding(&meta, WorkloadKind::Deployment, "checksum.consulbind.dev/a");
        assert_eq!(at.flatten().map(|t| t.0.to_string()), Some("2026-11-29T10:00:00Z".to_owned()));
        // A CronJob's is on its job template.
        let meta: ObjectMeta = serde_json::from_value(json!({"managedFields": [{
            "manager": "consulbind-a", "operation": "Apply", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:jobTemplate": {"f:spec": {"f:template": {"f:metadata": {"f:annotations": {
                "f:checksum.consulbind.dev/a": {}}}}}}}}}]}))
        .unwrap();
        assert!(stamped_by_its_binding(&meta, WorkloadKind::CronJob, "checksum.consulbind.dev/a").is_some());
        assert!(stamped_by_its_binding(&meta, WorkloadKind::Deployment, "checksum.consulbind.dev/a").is_none());
    }
}
