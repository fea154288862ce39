//! How a binding turns changes into rollouts: debouncing, waves, a budget, a dry run.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::targets::WorkloadKind;

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

    /// How long a target rolled in a wave may take to become healthy before the rollout halts
    /// (one made during the rollout: from when it was made). Defaults to `10m`; at most `24h`.
    /// Only with `waves`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24), regex(pattern = crate::DURATION_PATTERN))]
    pub health_timeout: Option<String>,

    /// Caps how often this binding rolls each target. A change beyond it waits, coalesced with
    /// later ones, and the latest content rolls as soon as the budget allows. Without it, the
    /// controller's `--default-rollout-budget` applies, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<RolloutBudget>,

    /// When changes may start to roll: inside an `allow` window (at any time when there is
    /// none) and outside every `deny` window; at most 16. A change outside waits, coalesced with
    /// later ones, until the next window opens; a staged rollout finishes the wave it is rolling
    /// and starts the next one in a window. Without windows, the controller's
    /// `--default-rollout-windows` apply, if set. The binding's annotation
    /// `consulbind.dev/roll-outside-window`, set to the held checksum, lets that content roll now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<RolloutWindow>,
}

/// A span of time that opens at each time a cron schedule names.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "duration(self.duration) > duration('0s') && duration(self.duration) <= duration('168h')",
    "message": "spec.rollout.windows: a window's duration is more than 0s and at most 168h"
}]))]
pub struct RolloutWindow {
    /// `allow` (the default): changes may roll while it is open; `deny`: they may not, whatever
    /// the allow windows say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<WindowKind>,

    /// When the window opens: a standard five-field cron schedule (minute, hour, day of month,
    /// month, day of week; Sunday is 0 or 7), such as `0 22 * * 1-5` for 22:00 on weekdays.
    #[schemars(length(max = 128), regex(pattern = crate::SCHEDULE_PATTERN))]
    pub schedule: String,

    /// How long it stays open, such as `30m` or `8h`; more than 0s and at most `168h`.
    #[schemars(length(max = 24), regex(pattern = crate::DURATION_PATTERN))]
    pub duration: String,

    /// The IANA time zone the schedule is read in, such as `Europe/Paris`; `UTC` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), regex(pattern = crate::TIME_ZONE_PATTERN))]
    pub time_zone: Option<String>,
}

/// Whether a rollout window lets changes roll or holds them.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    #[default]
    Allow,
    Deny,
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
