//! The workloads a binding rolls.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A workload to roll, chosen either by name or by label selector.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend(
    "oneOf" = [{"required": ["name"]}, {"required": ["selector"]}],
    "x-kubernetes-validations" = [{
        "rule": "has(self.name) != has(self.selector)",
        "message": "spec.targets: each target needs exactly one of name and selector"
    }]
))]
pub struct TargetRef {
    /// Kind of the workload.
    pub kind: WorkloadKind,

    /// Name of the workload. Exactly one of `name` and `selector` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,

    /// Every workload of `kind` whose labels match. Exactly one of `name` and `selector` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// The kinds of workload that can be rolled: `Rollout` is Argo Rollouts' (`argoproj.io/v1alpha1`);
/// a `CronJob`'s stamp goes on its job template, so the Jobs it makes next run the new content.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum WorkloadKind {
    #[default]
    Deployment,
    StatefulSet,
    DaemonSet,
    Rollout,
    CronJob,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 5] =
        [Self::Deployment, Self::StatefulSet, Self::DaemonSet, Self::Rollout, Self::CronJob];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
            Self::DaemonSet => "DaemonSet",
            Self::Rollout => "Rollout",
            Self::CronJob => "CronJob",
        }
    }

    /// Its current API version; a cluster older than 1.21 serves `CronJob` as `batch/v1beta1`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::Rollout => "argoproj.io/v1alpha1",
            Self::CronJob => "batch/v1",
            _ => "apps/v1",
        }
    }

    /// Where its pod template is, from the object's root.
    pub fn template_path(self) -> &'static [&'static str] {
        match self {
            Self::CronJob => &["spec", "jobTemplate", "spec", "template"],
            _ => &["spec", "template"],
        }
    }
}

impl std::fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
