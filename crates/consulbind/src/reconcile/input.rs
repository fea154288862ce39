//! The types the decision shares: what a plan takes ([`Input`]: what Consul and the cluster look
//! like now, what the status says was applied), what it decides ([`Plan`], with a staged
//! rollout's [`Step`]), and what stamping made of it ([`Outcome`]).

use std::{collections::BTreeMap, time::Duration};

use consul_kv::KvEntry;
use consulbind_api::{
    ConsulBindingSpec, ConsulBindingStatus, KeySource, KeyStatus, ObjectKind, ObjectSource, ObjectStatus,
    RolloutStatus, TargetState, conditions::reason,
};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use tokio::time::Instant;

use super::{debounce::Window, staging::Staging};
use crate::{
    checksum::{self, Source},
    cluster::{Live, Version, Workload, health::Health, objects::Digested, references::References},
};

/// The content of one bound key or prefix, each value as its keyed digest; no entries means
/// missing.
#[derive(Clone, Copy)]
pub struct KeyContent<'a> {
    pub source: &'a KeySource,
    pub entries: &'a [KvEntry],
    /// It became missing or empty as Consul's index went backwards: lost data, not an edit.
    pub reset_hold: bool,
    /// Consul's index for the key as read by a query of its own.
    pub index: Option<u64>,
}

/// One bound ConfigMap or Secret: its data as digests, `None` when it does not exist.
#[derive(Clone, Copy)]
pub struct ObjectContent<'a> {
    pub kind: ObjectKind,
    pub source: &'a ObjectSource,
    /// Bound through a target's pod template.
    pub referenced: bool,
    pub data: Option<&'a Digested>,
}

/// What the Consul side looks like for this binding.
#[derive(Clone)]
pub enum Consul<'a> {
    Ready(Vec<KeyContent<'a>>),
    /// The keys cannot be read; the reason is one of [`reason`].
    Failed {
        reason: &'static str,
        message: String,
    },
}

#[derive(Clone)]
pub struct Input<'a> {
    pub spec: &'a ConsulBindingSpec,
    /// Keys every checksum.
    pub key: &'a checksum::Key,
    pub window: Window,
    pub generation: Option<i64>,
    pub previous: &'a ConsulBindingStatus,
    pub consul: Consul<'a>,
    /// The bound ConfigMaps and Secrets, or why they cannot be read: a reason and a message.
    pub objects: Result<Vec<ObjectContent<'a>>, (&'static str, String)>,
    /// Workloads found for the targets, sorted and unique.
    pub found: &'a [Workload],
    /// What the found workloads carry in the binding's pod-template annotation.
    pub live: &'a BTreeMap<Workload, Live>,
    /// The uid and generation of each found workload.
    pub versions: &'a BTreeMap<Workload, Version>,
    /// The ConfigMaps and Secrets each found workload's pod template references, for those with any.
    pub uses: &'a BTreeMap<Workload, References>,
    /// A sentence for each target that matched nothing.
    pub missing: &'a [String],
    /// A sentence for each target whose kind the cluster does not serve.
    pub unserved: &'a [String],
    /// Report what would be rolled instead of rolling it.
    pub dry_run: bool,
    /// The binding's watches take turns with others of its namespace, a round in at most this.
    pub in_turns: Option<std::time::Duration>,
    /// Consul's index went backwards since the targets last carried the content: a change waits
    /// until the content has been stable this long.
    pub restore: Option<std::time::Duration>,
    /// This replica's first read found Consul restored since the status was written
    /// ([`loss::restored_since`]).
    pub restored: bool,
    /// Waves, a health gate and a budget, when the binding stages its rollouts.
    pub staging: Option<&'a Staging>,
    /// The found workloads that are not healthy, with what each reports.
    pub health: &'a BTreeMap<Workload, Health>,
    /// The found workloads' labels, which waves select by.
    pub labels: &'a BTreeMap<Workload, BTreeMap<String, String>>,
    /// The wall clock, for what the status records across restarts.
    pub clock: Timestamp,
    /// The previous status records stamps that the one the API server holds does not: it is
    /// written before anything rolls.
    pub withhold: bool,
}

/// The annotation value that rolls a workload whose template already carries `checksum` (put
/// back by a rollout undo): the same checksum with a counter, so the template changes.
pub fn forced(checksum: &str, live: &Live) -> String {
    let n: u32 = live.value.split_once('~').and_then(|(_, n)| n.parse().ok()).unwrap_or(0);
    format!("{checksum}~{}", n.checked_add(1).unwrap_or(0))
}

/// What to do, before any of it is done.
#[derive(Debug, Default)]
pub struct Plan {
    /// Checksum of the current content, when every key could be read.
    pub desired: Option<String>,
    pub keys: Vec<KeyStatus>,
    pub objects: Vec<ObjectStatus>,
    /// What each found target should carry ([`content`]), when every key could be read.
    pub content: BTreeMap<Workload, String>,
    /// Workloads to stamp.
    pub roll: Vec<Workload>,
    /// The annotation value for each workload of `roll`.
    pub values: BTreeMap<Workload, String>,
    /// Targets behind their content that this plan does not roll (a quiet period, a restore
    /// grace, a suspend): another binding's write of the same checksum may carry their stamp.
    pub held: Vec<Workload>,
    /// Why the content is not being rolled out now: a reason and a message.
    pub hold: Option<(&'static str, String)>,
    /// Reconcile again at this time to finish a debounce.
    pub wake_at: Option<Instant>,
    /// First sight of the content: recorded without a rollout.
    pub baseline: bool,
    /// Targets that run their content already, as their template's references changed: it is
    /// recorded as what they run, and their stamps stand for it ([`content`]).
    pub rebased: Vec<Workload>,
    /// In a dry run, the workloads that would have been rolled, and why.
    pub would_roll: Vec<Workload>,
    pub why: Option<String>,
    /// A staged rollout's step: target states, roll times, the wave. `None` keeps the last ones.
    pub staged: Option<Step>,
}

impl Plan {
    /// Rolls `targets` to their content: a stamp that already holds it gets a counter.
    pub(super) fn roll(&mut self, targets: Vec<Workload>, live: &BTreeMap<Workload, Live>) {
        for w in &targets {
            let want = &self.content[w];
            let value = match live.get(w) {
                Some(live) if live.checksum() == want => forced(want, live),
                _ => want.clone(),
            };
            self.values.insert(w.clone(), value);
        }
        self.roll = targets;
    }

    /// Takes a staged rollout's step; a hold already decided (a quiet period, a suspend) stands.
    pub(super) fn stage(&mut self, mut step: Step, now: Instant) {
        if self.hold.is_none() {
            self.hold = step.hold.take();
        }
        if let Some(wake) = step.wake {
            let at = now + wake.max(std::time::Duration::from_millis(50));
            self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
        }
        self.staged = Some(step);
    }

    /// A dry run's result: `targets` would roll for `why`; nothing is patched.
    pub(super) fn would_roll(mut self, targets: Vec<Workload>, why: String) -> Self {
        let list: Vec<String> = targets.iter().map(|(k, n)| format!("{k}/{n}")).collect();
        self.hold =
            Some((reason::DRY_RUN, format!("dry run: would roll {} ({why}); nothing was patched", list.join(", "))));
        self.would_roll = targets;
        self.why = Some(why);
        self
    }
}

/// What one step of the state machine decided.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    /// Targets to roll now.
    pub roll: Vec<Workload>,
    /// Each found target's state, and why it is halted or waiting.
    pub states: BTreeMap<Workload, (TargetState, Option<String>)>,
    /// The state each target of `roll` had before this step rolled it: its state still, should
    /// its patch fail.
    pub unrolled: BTreeMap<Workload, Option<(TargetState, Option<String>)>>,
    /// With a budget: the times each target was rolled within its span, before this step.
    pub times: BTreeMap<Workload, Vec<Time>>,
    /// Targets judged that this rollout did not roll: when it first judged them.
    pub judged: BTreeMap<Workload, Time>,
    pub rollout: Option<RolloutStatus>,
    pub hold: Option<(&'static str, String)>,
    /// Look again after this.
    pub wake: Option<Duration>,
    /// The binding's annotation let this step roll outside the rollout windows.
    pub let_through: bool,
}

/// The outcome of stamping the planned workloads.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rolled: Vec<Workload>,
    /// Workload and error message.
    pub failed: Vec<(Workload, String)>,
}

pub fn source<'a>(content: &KeyContent<'a>) -> Source<'a> {
    if content.source.recurse {
        Source::Prefix {
            prefix: &content.source.key,
            entries: content.entries.iter().map(|e| (&*e.key, &*e.value)).collect(),
        }
    } else {
        Source::Key {
            key: &content.source.key,
            value: content.entries.iter().find(|e| *e.key == *content.source.key).map(|e| &*e.value),
        }
    }
}

pub fn quoted(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_step_asks_to_look_again_after_its_wait_at_least_50_ms_on_and_the_sooner_of_two() {
        let now = Instant::now();
        let wake_at = |before: Option<Duration>, wait: Duration| {
            let mut plan = Plan { wake_at: before.map(|b| now + b), ..Plan::default() };
            plan.stage(Step { wake: Some(wait), ..Step::default() }, now);
            plan.wake_at.map(|at| at - now)
        };
        assert_eq!(wake_at(None, Duration::from_secs(3)), Some(Duration::from_secs(3)));
        assert_eq!(wake_at(None, Duration::ZERO), Some(Duration::from_millis(50)));
        assert_eq!(wake_at(Some(Duration::from_secs(1)), Duration::from_secs(3)), Some(Duration::from_secs(1)));
        assert_eq!(wake_at(Some(Duration::from_secs(5)), Duration::from_secs(3)), Some(Duration::from_secs(3)));
    }
}
