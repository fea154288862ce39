//! The part of Argo Rollouts' `Rollout` (`argoproj.io/v1alpha1`) this controller reads: enough
//! to find one, see what its pod template carries, and tell whether it takes its template
//! from a Deployment instead (`workloadRef`), and which ConfigMaps and Secrets its pods use.
//! Everything else is ignored when decoding.

use std::borrow::Cow;

use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{Resource, core::NamespaceResourceScope};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Rollout {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<RolloutSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RolloutStatus>,
}

/// What tells whether a Rollout is healthy.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// A number, or its string: Argo has written both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_ref: Option<WorkloadRef>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Template {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// A template this controller cannot decode is one without references, not a failed list
    /// of every Rollout: Argo's schema is not the API server's own.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub spec: Option<PodSpec>,
}

fn lenient<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<PodSpec>, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).ok())
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct WorkloadRef {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

impl Resource for Rollout {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Rollout".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "argoproj.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "rollouts".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_it_needs_and_ignores_the_rest() {
        let rollout: Rollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "web", "namespace": "a", "generation": 3},
            "spec": {"replicas": 2, "strategy": {"canary": {"steps": [{"setWeight": 20}]}},
                     "template": {"metadata": {"annotations": {"x": "y"}}, "spec": {"containers": []}}}
        }))
        .unwrap();
        let template = rollout.spec.unwrap().template.unwrap();
        assert_eq!(template.metadata.unwrap().annotations.unwrap()["x"], "y");
        assert!(template.spec.is_some());
        let odd: Rollout = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "odd"},
            "spec": {"template": {"spec": {"containers": "not a list"}}}
        }))
        .unwrap();
        assert!(odd.spec.unwrap().template.unwrap().spec.is_none(), "an odd template is read as none");
        assert_eq!(Rollout::api_version(&()), "argoproj.io/v1alpha1");
        let by_ref: Rollout = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web-template"}}
        }))
        .unwrap();
        assert_eq!(by_ref.spec.unwrap().workload_ref.unwrap().name, "web-template");
    }
}
