//! What the controller last saw and did, as the binding's status shows it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{sources::ObjectKind, targets::WorkloadKind};

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

    /// With `--sharding`, the replica that serves the binding (its Lease's holder identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,

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
    #[serde(serialize_with = "micro::one")]
    pub since: Time,

    /// When the rollout of this content started.
    #[serde(serialize_with = "micro::one")]
    pub started_time: Time,

    /// `wave/waves phase`, for `kubectl get`.
    pub progress: String,

    /// When the next rollout window opens, while the rollout waits outside the windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<Time>,
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
    /// Targets wait for the rollout budget, or for a rollout window.
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
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "micro::some")]
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

    /// In a staged rollout that did not roll it, yet judges its health (it runs the rollout's
    /// content): when the rollout first did. Its `healthTimeout` counts from then.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "micro::some")]
    pub judged_time: Option<Time>,

    /// With a rollout budget: when this binding rolled it within the budget's span, oldest
    /// first.
    #[serde(default, skip_serializing_if = "Vec::is_empty", serialize_with = "micro::all")]
    pub rolled_times: Vec<Time>,
}

/// The times of rollouts, which the controller compares with one another, written to the
/// microsecond: `metav1.Time` keeps seconds, and a rollout may begin in the second that an
/// earlier one rolled a target.
mod micro {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Unit};
    use serde::Serializer;

    fn text(time: &Time) -> String {
        time.0.round(Unit::Microsecond).unwrap_or(time.0).to_string()
    }

    pub fn one<S: Serializer>(time: &Time, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text(time))
    }

    pub fn some<S: Serializer>(time: &Option<Time>, s: S) -> Result<S::Ok, S::Error> {
        match time {
            Some(time) => s.serialize_some(&text(time)),
            None => s.serialize_none(),
        }
    }

    pub fn all<S: Serializer>(times: &[Time], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(times.iter().map(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_times_keep_microseconds_through_the_api_and_read_back_the_same() {
        let at = |text: &str| Time(text.parse().unwrap());
        let row = TargetStatus {
            last_rolled_time: Some(at("2026-11-27T12:00:00.1234567Z")),
            rolled_times: vec![at("2026-11-27T11:00:00Z"), at("2026-11-27T12:00:00.5Z")],
            ..Default::default()
        };
        let json = serde_json::to_value(&row).unwrap();
        assert_eq!(json["lastRolledTime"], "2026-11-27T12:00:00.123457Z");
        assert_eq!(json["rolledTimes"], serde_json::json!(["2026-11-27T11:00:00Z", "2026-11-27T12:00:00.5Z"]));
        let back: TargetStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back.last_rolled_time, Some(at("2026-11-27T12:00:00.123457Z")));
        assert_eq!(back.rolled_times, row.rolled_times);
        let rollout = RolloutStatus {
            checksum: "c".into(),
            wave: 1,
            waves: 1,
            phase: RolloutPhase::Rolling,
            since: at("2026-11-27T12:00:00Z"),
            started_time: at("2026-11-27T12:00:00.000001Z"),
            progress: "1/1 Rolling".into(),
            next_window: None,
        };
        let json = serde_json::to_value(&rollout).unwrap();
        assert_eq!(
            (&json["since"], &json["startedTime"]),
            (&"2026-11-27T12:00:00Z".into(), &"2026-11-27T12:00:00.000001Z".into())
        );
    }
}
