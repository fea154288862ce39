use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Binds Consul KV keys or prefixes to workloads in the same namespace. When the content behind the
/// keys changes, the controller stamps a checksum into each workload's pod template, which makes
/// Kubernetes roll it out.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "consulbind.dev",
    version = "v1alpha1",
    kind = "ConsulBinding",
    plural = "consulbindings",
    shortname = "cbind",
    namespaced,
    status = "ConsulBindingStatus",
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consul: Option<ConsulSettings>,

    /// How changes are turned into rollouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutPolicy>,

    /// Pause rollouts. Changes are still tracked; resuming rolls out once if the content differs
    /// from what the targets last received.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// A Consul key or prefix: `/`-separated segments, none empty, `.` or `..`; a prefix may end
/// with `/`. Written for the API server's regular expressions, which have no look-ahead.
pub const KEY_PATTERN: &str = r"^((?:[^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)/)*(?:[^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)?$";

/// What is wrong with a key, by the rule of [`KEY_PATTERN`], for objects the schema did not check,
/// and by Consul's own: it refuses a key with a character that does not print.
pub fn key_problem(key: &str) -> Option<String> {
    if key.len() > MAX_KEY_LENGTH {
        return Some("is longer than 512 bytes".into());
    }
    if let Some(c) = key.chars().find(|c| !prints(*c)) {
        return Some(format!(
            "contains U+{:04X}, which Consul refuses in a key (a control character, a space other than U+0020, or an \
             invisible formatting character); copied text often brings one",
            u32::from(c)
        ));
    }
    if key.starts_with('/') {
        return Some("starts with /, so Consul would read another key".into());
    }
    // A trailing `/` marks a folder prefix; every other segment must be a real name.
    let body = key.strip_suffix('/').unwrap_or(key);
    body.split('/').find_map(|segment| match segment {
        "" => Some("has an empty segment (//), so Consul would read another key, or none".into()),
        "." | ".." => Some("has a . or .. segment, so Consul would read another key, or none".into()),
        _ => None,
    })
}

/// Whether Consul takes `c` in a key: it refuses what Go's `unicode.IsPrint` does not print.
/// Unassigned code points are left to Consul, which refuses them with an answer of its own.
fn prints(c: char) -> bool {
    let format = matches!(
        c,
        '\u{ad}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{890}'..='\u{891}'
            | '\u{8e2}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{fdd0}'..='\u{fdef}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e000}'..='\u{f8ff}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e007f}'
            | '\u{f0000}'..='\u{10ffff}'
    );
    c == ' ' || !(c.is_control() || c.is_whitespace() || format || (u32::from(c) & 0xfffe) == 0xfffe)
}
/// The longest Consul key a binding may name, in bytes.
pub const MAX_KEY_LENGTH: usize = 512;

/// One Consul key, or every key under a prefix.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeySource {
    /// The Consul key, for example `app/config.json`, or a prefix such as `app/features/` when
    /// `recurse` is true. Segments are separated by `/`; none may be empty, `.` or `..`, and the
    /// key may not start with `/` (Consul would read such a key as another, or as missing). At
    /// most 512 bytes.
    #[schemars(length(min = 1, max = 512), regex(pattern = KEY_PATTERN))]
    pub key: String,

    /// Treat `key` as a prefix and bind every key below it, recursively.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recurse: bool,

    /// A missing optional key (or empty prefix) is part of the content like any value. A missing
    /// required one holds all rollouts of this binding until it exists again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// A ConfigMap or Secret in the binding's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSource {
    /// Name of the object.
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    pub name: String,

    /// Only these keys of its `data` (and of a ConfigMap's `binaryData`); the whole object when
    /// absent. At most 64, none empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub keys: Option<Vec<String>>,

    /// A missing optional object is part of the content like any data. A missing required
    /// one holds all rollouts of this binding until it exists.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// A Kubernetes object name (a DNS subdomain).
pub const NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// The kinds of Kubernetes object a binding may read besides Consul.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum ObjectKind {
    #[default]
    ConfigMap,
    Secret,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ConsulBindingSpec {
    /// The ConfigMaps and Secrets the binding reads, ConfigMaps first, each in spec order.
    pub fn objects(&self) -> impl Iterator<Item = (ObjectKind, &ObjectSource)> {
        let config_maps = self.config_maps.iter().map(|o| (ObjectKind::ConfigMap, o));
        config_maps.chain(self.secrets.iter().map(|o| (ObjectKind::Secret, o)))
    }
}

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

/// Consul settings for one binding.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsulSettings {
    /// Consul datacenter to read from. Defaults to the agent's own datacenter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datacenter: Option<String>,

    /// Consul Enterprise namespace. Sent only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// Consul Enterprise admin partition. Sent only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,

    /// A Secret in this namespace holding the ACL token to read the keys with. The Secret must
    /// carry the label `consulbind.dev/token=true`. Without it the controller's default token is
    /// used, for the key prefixes that the namespace's `consulbind.dev/default-token-prefixes`
    /// annotation (or the controller's `--default-token-prefixes`) allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,
}

/// A key in a Secret in the binding's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1))]
    pub name: String,

    /// Key within the Secret's data. Defaults to `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Debouncing, as in consul-template's `wait { min, max }`: each new change restarts the quiet
/// period, and a stream of changes still rolls out once `maxDelay` has passed since the first.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.quietPeriod) || duration(self.quietPeriod) <= duration('1h')",
        "message": "spec.rollout.quietPeriod: at most 1h is allowed"
    },
    {
        "rule": "!has(self.maxDelay) || duration(self.maxDelay) <= duration('24h')",
        "message": "spec.rollout.maxDelay: at most 24h is allowed"
    },
    {
        "rule": "!has(self.quietPeriod) || !has(self.maxDelay) || duration(self.maxDelay) >= duration(self.quietPeriod)",
        "message": "spec.rollout.maxDelay: shorter than spec.rollout.quietPeriod, so the quiet period could never be waited for"
    },
    {
        "rule": "!has(self.healthTimeout) || duration(self.healthTimeout) <= duration('24h')",
        "message": "spec.rollout.healthTimeout: at most 24h is allowed"
    }
]))]
pub struct RolloutPolicy {
    /// How long the content must stay unchanged before rolling out, such as `0s`, `5s` or `1m30s`.
    /// Defaults to `2s`; at most `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24), regex(pattern = crate::DURATION_PATTERN))]
    pub quiet_period: Option<String>,

    /// The longest a change waits for the content to settle, counted from the first change.
    /// Defaults to `30s`; at most `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24), regex(pattern = crate::DURATION_PATTERN))]
    pub max_delay: Option<String>,

    /// Roll the targets once when the binding is first created (or a target is first found).
    /// By default the controller records the current content as a baseline and restarts nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_bind: bool,

    /// `Rollout` (the default) patches the targets. `DryRun` does everything else (watches,
    /// checksums, debounce, status) and reports in `status.dryRun` and an event which targets
    /// would have been rolled, and why. Switching back to `Rollout` rolls the targets once if
    /// the content differs from what they carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<RolloutMode>,

    /// Roll the targets in ordered waves, each once the one before is healthy; at most 16. A
    /// target belongs to the first wave whose filter matches it; a wave without a filter takes
    /// every target left; targets no wave takes form a last wave. Without waves every target
    /// rolls at once, with no health wait.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub waves: Vec<Wave>,

    /// How long a target rolled in a wave may take to become healthy before the rollout halts.
    /// Defaults to `10m`; at most `24h`. Only with `waves`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24), regex(pattern = crate::DURATION_PATTERN))]
    pub health_timeout: Option<String>,

    /// Caps how often this binding rolls each target. A change beyond it waits, coalesced with
    /// later ones, and the latest content rolls as soon as the budget allows. Without it, the
    /// controller's `--default-rollout-budget` applies, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<RolloutBudget>,
}

/// One wave of a staged rollout.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(has(self.name) && has(self.selector))",
        "message": "spec.rollout.waves: a wave sets both name and selector; set at most one"
    },
    {
        "rule": "!has(self.pause) || duration(self.pause) <= duration('24h')",
        "message": "spec.rollout.waves: a wave's pause is longer than 24h"
    }
]))]
pub struct Wave {
    /// Only targets of this kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<WorkloadKind>,

    /// Only the target of this name. At most one of `name` and `selector` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,

    /// Only targets whose labels match. At most one of `name` and `selector` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,

    /// How many of its targets may be rolling at once (patched and not yet healthy); all when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_parallel: Option<u32>,

    /// How long to wait once the whole wave is healthy before the next wave starts, such as
    /// `2m`; at most `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24), regex(pattern = crate::DURATION_PATTERN))]
    pub pause: Option<String>,
}

/// At most `maxRollouts` rollouts of each target within any span of `per`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "duration(self.per) > duration('0s') && duration(self.per) <= duration('24h')",
    "message": "spec.rollout.budget.per: more than 0s and at most 24h"
}]))]
pub struct RolloutBudget {
    /// Between 1 and 100.
    #[schemars(range(min = 1, max = 100))]
    pub max_rollouts: u32,

    /// Such as `1m` or `1h`; at most `24h`.
    #[schemars(length(max = 24), regex(pattern = crate::DURATION_PATTERN))]
    pub per: String,
}

/// Whether changes are rolled out, or only reported.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutMode {
    #[default]
    Rollout,
    DryRun,
}

/// What the controller last saw and did.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsulBindingStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Checksum of the bound content that the targets last received (or were baselined with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_checksum: Option<String>,

    /// The first 12 characters of `appliedChecksum`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_checksum: Option<String>,

    /// Sources present / sources bound: Consul keys, ConfigMaps and Secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_summary: Option<String>,

    /// Targets carrying the applied checksum / targets found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_summary: Option<String>,

    /// The content last read from Consul, one entry per bound key or prefix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyStatus>,

    /// The ConfigMaps and Secrets last read, one entry per bound object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectStatus>,

    /// The workloads found for the targets, and what each carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetStatus>,

    /// The rows of workloads no longer found, as they were in `targets`: kept, the newest 16, so
    /// that one found again (relabelled out of a selector and back) is judged by what it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub former_targets: Vec<TargetStatus>,

    /// When the controller last read every bound key from Consul successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,

    /// When a content change was last rolled out to the targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change_time: Option<Time>,

    /// A digest of the spec this status describes, `suspend` aside. A change of it made while
    /// rollouts are not suspended is the go-ahead for content held as lost (`keys[].lost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_spec: Option<String>,

    /// A staged rollout (`rollout.waves`) or one waiting for its budget: which wave, since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,

    /// What the binding would do now if it were not in `DryRun` mode; only set in that mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<DryRunStatus>,

    /// `Ready`, `ConsulSynced` and `TargetsUpdated`, each with a reason and message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Where a staged rollout stands.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The checksum of the content being rolled out.
    pub checksum: String,

    /// The current wave, from 1.
    pub wave: u32,

    /// How many waves the targets form.
    pub waves: u32,

    pub phase: RolloutPhase,

    /// Since when the rollout is in this wave and phase.
    pub since: Time,

    /// When the rollout of this content started.
    pub started_time: Time,

    /// `wave/waves phase`, for `kubectl get`.
    pub progress: String,
}

/// What a staged rollout is doing.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// Rolling the current wave's targets and waiting for them to become healthy.
    #[default]
    Rolling,
    /// The current wave is healthy; the next starts after its pause.
    Paused,
    /// A target failed or was not healthy in time; nothing more rolls until it is healthy or
    /// the content changes.
    Halted,
    /// Targets wait for the rollout budget.
    Waiting,
    /// Every target carries the content and is healthy.
    Complete,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rolling => "Rolling",
            Self::Paused => "Paused",
            Self::Halted => "Halted",
            Self::Waiting => "Waiting",
            Self::Complete => "Complete",
        }
    }
}

/// Where one target stands in a staged rollout or a budget.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TargetState {
    /// Rolled, and not healthy yet.
    Rolling,
    /// Rolled, and healthy since.
    Healthy,
    /// Rolled, and failed or not healthy within `rollout.healthTimeout`.
    Halted,
    /// Behind its content, waiting for the rollout budget.
    Waiting,
}

/// One bound key or prefix as last read from Consul.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyStatus {
    /// The key or prefix, as in the spec.
    pub key: String,

    /// Whether `key` is a prefix.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recurse: bool,

    /// Whether the key exists (for a prefix: whether any key lies below it).
    pub present: bool,

    /// Number of keys below a prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u32>,

    /// Keyed checksum (HMAC) of this key's content alone.
    pub checksum: String,

    /// Consul's ModifyIndex of the key (for a prefix: the highest below it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modify_index: Option<u64>,

    /// Emptied as Consul's index went backwards (a snapshot restore or a rebuilt cluster):
    /// rollouts are held until it is back, or the spec changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

/// One bound ConfigMap or Secret as last read.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStatus {
    pub kind: ObjectKind,

    pub name: String,

    /// Whether the object exists.
    pub present: bool,

    /// Number of its data keys that count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u32>,

    /// Keyed checksum (HMAC) of this object's bound data alone.
    pub checksum: String,

    /// Bound because a target's pod template references it (`includeTargetReferences`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub referenced: bool,

    /// For a referenced object, the only data keys the references read; all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
}

/// The rollout a dry run held back.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DryRunStatus {
    /// Checksum of the content the targets would have received.
    pub checksum: String,

    /// The targets that would have been rolled, as `Kind/name`; empty when every target carries
    /// the current content.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub would_roll: Vec<String>,

    /// Why they would have been rolled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A workload the binding rolls.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    /// Kind of the workload.
    pub kind: WorkloadKind,

    /// Name of the workload.
    pub name: String,

    /// The content checksum this workload runs with: of the Consul keys and named objects,
    /// and the objects its own pod template references.
    pub checksum: String,

    /// Its pod-template annotation, when that is an older checksum which stands for
    /// `checksum`: only the set of objects its template references changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<String>,

    /// When the controller last rolled this workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rolled_time: Option<Time>,

    /// The workload's uid: one deleted and made again under the same name is another, which
    /// started with the content of its time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,

    /// In a staged rollout or a budget: whether it is rolling, healthy, halted or waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TargetState>,

    /// Why it is halted or waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// With a rollout budget: when this binding rolled it within the budget's span, oldest
    /// first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled_times: Vec<Time>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_consul_would_refuse_or_read_as_another_are_refused() {
        for (key, why) in [
            ("app/config\n", "U+000A"),
            ("app/\t/x", "U+0009"),
            ("app/\u{a0}config", "U+00A0"),
            ("app/con\u{200b}fig", "U+200B"),
            ("app/\u{feff}", "U+FEFF"),
            ("app/\u{e000}", "U+E000"),
            ("/app", "starts with /"),
            ("app//x", "empty segment"),
            ("app/../x", ". or .. segment"),
        ] {
            let problem = key_problem(key).unwrap_or_else(|| panic!("{key:?} was accepted"));
            assert!(problem.contains(why), "{key:?}: {problem}");
        }
        for key in ["app/config", "app/with space", "app/é/日本/🦀", "app/a?b#c%d&e+f", "app/features/", ".x/..y"]
        {
            assert_eq!(key_problem(key), None, "{key:?}");
        }
    }
}
