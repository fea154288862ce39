//! The `ConsulBinding` resource and its spec. The spec's parts (sources, targets, rollout) and
//! the status each have a file of their own.

mod rollout;
mod sources;
mod status;
mod targets;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::{rollout::*, sources::*, status::*, targets::*};

/// Binds Consul KV keys or prefixes, ConfigMaps and Secrets to workloads in the same namespace
/// (Deployments, StatefulSets, DaemonSets, CronJobs and Argo Rollouts). When the content behind
/// them changes, the controller stamps a checksum into each workload's pod template, which makes
/// Kubernetes roll it out.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "consulbind.dev",
    version = "v1alpha1",
    kind = "ConsulBinding",
    plural = "consulbindings",
    shortname = "cbind",
    namespaced,
    // Boxed: the binding cache keeps every binding, and keeps no status (it moves to the
    // binding's record), so inline it would be half of each cached object for nothing.
    status = "Box<ConsulBindingStatus>",
    doc = "Binds Consul KV keys or prefixes, ConfigMaps and Secrets to Deployments, StatefulSets, DaemonSets and Argo Rollouts in its namespace, and rolls them when the content changes.",
    printcolumn = r#"{"name":"Keys","type":"string","jsonPath":".status.keySummary","description":"Sources present / sources bound"}"#,
    printcolumn = r#"{"name":"Targets","type":"string","jsonPath":".status.targetSummary","description":"Targets carrying the applied checksum / targets found"}"#,
    printcolumn = r#"{"name":"Checksum","type":"string","jsonPath":".status.shortChecksum","description":"Start of the applied checksum"}"#,
    printcolumn = r#"{"name":"Last Change","type":"date","jsonPath":".status.lastChangeTime","description":"When a content change was last rolled out"}"#,
    printcolumn = r#"{"name":"Wave","type":"string","jsonPath":".status.rollout.progress","description":"A staged rollout's wave and phase"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "(has(self.keys) && size(self.keys) > 0) || (has(self.configMaps) && size(self.configMaps) > 0) || (has(self.secrets) && size(self.secrets) > 0) || (has(self.includeTargetReferences) && self.includeTargetReferences)",
        "message": "spec: the binding has no source; set spec.keys, spec.configMaps, spec.secrets or spec.includeTargetReferences"
    },
    {
        "rule": "!has(self.keys) || self.keys.all(a, self.keys.all(b, a.key != b.key || (has(a.recurse) && a.recurse) != (has(b.recurse) && b.recurse) || (has(a.optional) && a.optional) == (has(b.optional) && b.optional)))",
        "message": "spec.keys: a Consul key or prefix is listed twice with different settings; list it once"
    },
    {
        "rule": "!has(self.configMaps) || self.configMaps.all(a, self.configMaps.all(b, a.name != b.name || ((has(a.optional) && a.optional) == (has(b.optional) && b.optional) && has(a.keys) == has(b.keys) && (!has(a.keys) || a.keys == b.keys))))",
        "message": "spec.configMaps: a ConfigMap is listed twice with different keys or optional; list it once, with every key it should read"
    },
    {
        "rule": "!has(self.secrets) || self.secrets.all(a, self.secrets.all(b, a.name != b.name || ((has(a.optional) && a.optional) == (has(b.optional) && b.optional) && has(a.keys) == has(b.keys) && (!has(a.keys) || a.keys == b.keys))))",
        "message": "spec.secrets: a Secret is listed twice with different keys or optional; list it once, with every key it should read"
    }
]))]
pub struct ConsulBindingSpec {
    /// Consul keys or key prefixes whose content drives the targets; at most 64. A binding
    /// needs at least one source: a key, a ConfigMap or a Secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub keys: Vec<KeySource>,

    /// ConfigMaps in this namespace whose data drives the targets too; at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub config_maps: Vec<ObjectSource>,

    /// Secrets in this namespace whose data drives the targets too; at most 32. Their values
    /// never appear in the status, events or logs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub secrets: Vec<ObjectSource>,

    /// Also bind every ConfigMap and Secret that the targets' pod templates reference (volumes,
    /// projected volumes, `env[].valueFrom` and `envFrom`, of containers and init containers;
    /// not image pull Secrets), honouring each reference's `items`, key and `optional`. A
    /// reference that a template change adds or drops is recorded without a rollout of its
    /// own: the template change already rolls. `configMaps` and `secrets` win over a reference
    /// to the same object.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_target_references: bool,

    /// Workloads in this namespace to roll when the content changes; at most 32 entries (a
    /// selector may match many workloads).
    #[schemars(length(min = 1, max = 32))]
    pub targets: Vec<TargetRef>,

    /// Per-binding Consul settings. Anything left out uses the controller's defaults.
    // Boxed, as `rollout` is: a binding that sets neither is 264 bytes smaller in the controller's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consul: Option<Box<ConsulSettings>>,

    /// How changes are turned into rollouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Box<RolloutPolicy>>,

    /// Pause rollouts. Changes are still tracked; resuming rolls out once if the content differs
    /// from what the targets last received.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

impl ConsulBindingSpec {
    /// The ConfigMaps and Secrets the binding reads, ConfigMaps first, each in spec order.
    pub fn objects(&self) -> impl Iterator<Item = (ObjectKind, &ObjectSource)> {
        let config_maps = self.config_maps.iter().map(|o| (ObjectKind::ConfigMap, o));
        config_maps.chain(self.secrets.iter().map(|o| (ObjectKind::Secret, o)))
    }
}
