//! The staged rollout's state machine, driven through whole plans and statuses over a small
//! world of Deployments whose health the tests set.

use std::{collections::BTreeMap, time::Duration};

use consul_kv::KvEntry;
use consulbind_api::{
    ConsulBindingSpec, ConsulBindingStatus, KeySource, RolloutBudget, RolloutPhase, RolloutPolicy, TargetRef,
    TargetState, Wave, WorkloadKind, conditions, conditions::reason,
};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{LabelSelector, Time},
    jiff::Timestamp,
};
use tokio::time::Instant;

use super::*;
use crate::{
    checksum,
    cluster::{Live, Version},
    reconcile::{
        debounce::Pending,
        plan::{Consul, KeyContent, Outcome, plan},
        status::status,
    },
};

const KEY: checksum::Key = checksum::Key::new([7; checksum::KEY_LEN]);

/// Deployments `names`, the canary labelled `track=canary`, all healthy and carrying nothing.
struct World {
    spec: ConsulBindingSpec,
    status: ConsulBindingStatus,
    value: String,
    index: u64,
    found: Vec<Workload>,
    labels: BTreeMap<Workload, BTreeMap<String, String>>,
    live: BTreeMap<Workload, Live>,
    versions: BTreeMap<Workload, Version>,
    health: BTreeMap<Workload, Health>,
    clock: Timestamp,
    pending: Option<Pending>,
    /// Generations added by the binding's stamps, per workload.
    rolls: BTreeMap<String, u32>,
    last: Option<crate::reconcile::plan::Plan>,
}

fn deploy(name: &str) -> Workload {
    (WorkloadKind::Deployment, name.to_owned())
}

fn canary() -> LabelSelector {
    LabelSelector { match_labels: Some([("track".to_owned(), "canary".to_owned())].into()), ..Default::default() }
}

impl World {
    fn new(names: &[&str], waves: Vec<Wave>, budget: Option<RolloutBudget>) -> Self {
        let rollout = RolloutPolicy { quiet_period: Some("0s".into()), waves, budget, ..Default::default() };
        let spec = ConsulBindingSpec {
            keys: vec![KeySource { key: "app/config".into(), ..Default::default() }],
            targets: vec![TargetRef {
                kind: WorkloadKind::Deployment,
                selector: Some(LabelSelector::default()),
                name: None,
            }],
            rollout: Some(rollout),
            ..Default::default()
        };
        let found: Vec<Workload> = names.iter().map(|n| deploy(n)).collect();
        let labels = found
            .iter()
            .map(|w| {
                let track = if w.1.starts_with("canary") { "canary" } else { "stable" };
                (w.clone(), [("track".to_owned(), track.to_owned())].into())
            })
            .collect();
        let versions =
            found.iter().map(|w| (w.clone(), Version { uid: format!("uid-{}", w.1), generation: 1 })).collect();
        let mut world = Self {
            spec,
            status: ConsulBindingStatus::default(),
            value: "v1".into(),
            index: 10,
            found,
            labels,
            live: BTreeMap::new(),
            versions,
            health: BTreeMap::new(),
            clock: "2026-11-26T03:00:00Z".parse().unwrap(),
            pending: None,
            rolls: BTreeMap::new(),
            last: None,
        };
        world.tick();
        assert_eq!(world.ready().reason, reason::BASELINED);
        world
    }

    fn staged(names: &[&str], waves: Vec<Wave>) -> Self {
        Self::new(names, waves, None)
    }

    fn write(&mut self, value: &str) {
        self.value = value.into();
        self.index += 1;
    }

    fn advance(&mut self, by: Duration) {
        self.clock = self.clock.checked_add(k8s_openapi::jiff::SignedDuration::try_from(by).unwrap()).unwrap();
    }

    /// One reconcile, every planned stamp landing; returns the workloads it rolled.
    fn tick(&mut self) -> Vec<String> {
        let entries = vec![
            KvEntry::new("app/config", self.value.clone(), self.index).digested(|v| checksum::digest(&KEY, v).to_vec()),
        ];
        let staging = Staging::of(&self.spec, None).unwrap();
        let input = Input {
            key: &KEY,
            spec: &self.spec,
            window: crate::reconcile::read::validate(&self.spec).unwrap(),
            generation: Some(1),
            previous: &self.status,
            consul: Consul::Ready(vec![KeyContent {
                source: &self.spec.keys[0],
                entries: &entries,
                reset_hold: false,
                index: None,
            }]),
            objects: Ok(Vec::new()),
            found: &self.found,
            live: &self.live,
            uses: &BTreeMap::new(),
            versions: &self.versions,
            missing: &[],
            unserved: &[],
            dry_run: false,
            in_turns: None,
            restore: None,
            restored: false,
            staging: staging.as_ref(),
            health: &self.health,
            labels: &self.labels,
            clock: self.clock,
        };
        let plan = plan(&input, &mut self.pending, Instant::now());
        let outcome = Outcome { rolled: plan.roll.clone(), failed: vec![] };
        let status = status(&input, &plan, &outcome, &Time(self.clock));
        for w in &plan.roll {
            self.live.insert(w.clone(), Live { value: plan.values[w].clone(), owned: true });
            self.versions.get_mut(w).unwrap().generation += 1;
            *self.rolls.entry(w.1.clone()).or_default() += 1;
            self.health.insert(w.clone(), Health::Progressing("0 of 1 replicas updated".into()));
        }
        self.status = status;
        let rolled = plan.roll.iter().map(|w| w.1.clone()).collect();
        self.last = Some(plan);
        rolled
    }

    fn healthy(&mut self, name: &str) {
        self.health.remove(&deploy(name));
    }

    fn fail(&mut self, name: &str) {
        self.health.insert(deploy(name), Health::Failed("ProgressDeadlineExceeded: timed out".into()));
    }

    fn ready(&self) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        self.status.conditions.iter().find(|c| c.type_ == conditions::READY).unwrap().clone()
    }

    fn state(&self, name: &str) -> Option<TargetState> {
        self.status.targets.iter().find(|t| t.name == name).and_then(|t| t.state)
    }

    fn phase(&self) -> Option<(u32, RolloutPhase)> {
        self.status.rollout.as_ref().map(|r| (r.wave, r.phase))
    }

    fn rolls(&self, name: &str) -> u32 {
        self.rolls.get(name).copied().unwrap_or(0)
    }
}

fn canary_then_rest(pause: Option<&str>, max_parallel: Option<u32>) -> Vec<Wave> {
    vec![
        Wave { selector: Some(canary()), pause: pause.map(Into::into), ..Default::default() },
        Wave { max_parallel, ..Default::default() },
    ]
}

#[test]
fn a_canary_wave_rolls_alone_and_the_rest_follow_once_it_is_healthy_and_its_pause_is_over() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(Some("2m"), None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    assert_eq!(
        (world.ready().reason.as_str(), world.phase()),
        (reason::ROLLOUT_IN_PROGRESS, Some((1, RolloutPhase::Rolling)))
    );
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    assert_eq!(world.tick(), Vec::<String>::new(), "the rest wait for the canary's health");
    world.advance(Duration::from_secs(30));
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new(), "the pause starts once the canary is healthy");
    assert_eq!((world.ready().reason.as_str(), world.phase()), (reason::WAVE_PAUSED, Some((1, RolloutPhase::Paused))));
    assert_eq!(world.state("canary"), Some(TargetState::Healthy));
    world.advance(Duration::from_secs(119));
    assert_eq!(world.tick(), Vec::<String>::new());
    world.advance(Duration::from_secs(1));
    assert_eq!(world.tick(), ["web-a", "web-b"]);
    assert_eq!(world.phase(), Some((2, RolloutPhase::Rolling)));
    world.healthy("web-a");
    world.healthy("web-b");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!((world.ready().reason.as_str(), world.phase()), (reason::UP_TO_DATE, Some((2, RolloutPhase::Complete))));
    assert_eq!(world.status.applied_checksum, world.last.as_ref().unwrap().desired);
    assert_eq!(world.tick(), Vec::<String>::new(), "settled: nothing more");
    for name in ["canary", "web-a", "web-b"] {
        assert_eq!(world.rolls(name), 1, "{name}");
    }
}

#[test]
fn a_failed_canary_halts_the_rest_until_it_is_healthy_and_then_each_rolls_once() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(None, None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.fail("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    let ready = world.ready();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::ROLLOUT_HALTED));
    assert!(ready.message.contains("Deployment canary ProgressDeadlineExceeded"), "{}", ready.message);
    assert_eq!(world.state("canary"), Some(TargetState::Halted));
    world.advance(Duration::from_secs(3600));
    assert_eq!(world.tick(), Vec::<String>::new(), "a halt waits as long as it takes");
    world.healthy("canary");
    assert_eq!(world.tick(), ["web-a", "web-b"]);
    world.healthy("web-a");
    world.healthy("web-b");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!([world.rolls("canary"), world.rolls("web-a"), world.rolls("web-b")], [1, 1, 1]);
}

#[test]
fn a_target_not_healthy_within_the_health_timeout_halts_the_rollout() {
    let mut world = World::staged(&["canary", "web-a"], canary_then_rest(None, None));
    world.spec.rollout.as_mut().unwrap().health_timeout = Some("5m".into());
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.advance(Duration::from_secs(299));
    world.tick();
    assert_eq!(world.ready().reason, reason::ROLLOUT_IN_PROGRESS);
    world.advance(Duration::from_secs(1));
    world.tick();
    let ready = world.ready();
    assert_eq!(ready.reason, reason::ROLLOUT_HALTED);
    assert!(ready.message.contains("not healthy within 5m"), "{}", ready.message);
    assert_eq!(world.rolls("web-a"), 0);
}

#[test]
fn max_parallel_rolls_a_wave_in_groups_as_each_becomes_healthy() {
    let names = ["a", "b", "c", "d", "e", "f"];
    let mut world = World::staged(&names, vec![Wave { max_parallel: Some(2), ..Default::default() }]);
    world.write("v2");
    assert_eq!(world.tick(), ["a", "b"]);
    assert_eq!(world.tick(), Vec::<String>::new());
    world.healthy("a");
    assert_eq!(world.tick(), ["c"], "one slot freed");
    world.healthy("b");
    world.healthy("c");
    assert_eq!(world.tick(), ["d", "e"]);
    world.healthy("d");
    world.healthy("e");
    assert_eq!(world.tick(), ["f"]);
    world.healthy("f");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert!(names.iter().all(|n| world.rolls(n) == 1));
}

#[test]
fn a_revert_during_a_halt_rolls_back_only_the_targets_that_received_the_bad_content() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(None, None));
    world.write("bad");
    assert_eq!(world.tick(), ["canary"]);
    world.fail("canary");
    world.tick();
    assert_eq!(world.ready().reason, reason::ROLLOUT_HALTED);
    world.write("v1");
    assert_eq!(world.tick(), ["canary"], "the revert starts again from the first wave");
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new(), "the others already carry the content");
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!([world.rolls("canary"), world.rolls("web-a"), world.rolls("web-b")], [2, 0, 0]);
}

#[test]
fn a_new_change_during_a_wave_supersedes_it_from_the_first_wave() {
    let mut world = World::staged(&["canary", "web-a"], canary_then_rest(None, None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.healthy("canary");
    assert_eq!(world.tick(), ["web-a"]);
    world.write("v3");
    assert_eq!(world.tick(), ["canary"], "web-a waits for the canary again");
    world.healthy("canary");
    world.healthy("web-a");
    assert_eq!(world.tick(), ["web-a"]);
    world.healthy("web-a");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!([world.rolls("canary"), world.rolls("web-a")], [2, 2]);
}

#[test]
fn a_rolling_canary_whose_content_changes_and_changes_back_still_gates_the_next_wave() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    // A change that waits for its quiet period leaves the canary behind for a while...
    let rollout = world.spec.rollout.as_mut().unwrap();
    (rollout.quiet_period, rollout.max_delay) = (Some("1h".into()), Some("2h".into()));
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::PENDING);
    // ...and its revert makes it current again, still not healthy.
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new(), "web waits for the canary's health");
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    world.healthy("canary");
    assert_eq!(world.tick(), ["web"]);
}

#[test]
fn a_budget_of_two_per_minute_gives_three_rollouts_for_five_changes_the_last_with_the_last_content() {
    let budget = RolloutBudget { max_rollouts: 2, per: "1m".into() };
    let mut world = World::new(&["web"], Vec::new(), Some(budget));
    for (i, value) in ["v2", "v3", "v4", "v5", "v6"].iter().enumerate() {
        world.write(value);
        let rolled = world.tick();
        assert_eq!(rolled.len(), usize::from(i < 2), "change {value}");
        world.advance(Duration::from_secs(5));
    }
    let ready = world.ready();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::ROLLOUT_BUDGET_EXHAUSTED));
    assert!(ready.message.contains("2026-11-26T03:01:00Z"), "{}", ready.message);
    assert_eq!(world.state("web"), Some(TargetState::Waiting));
    world.advance(Duration::from_secs(34));
    assert_eq!(world.tick(), Vec::<String>::new());
    world.advance(Duration::from_secs(1));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!(world.live[&deploy("web")].value, world.last.as_ref().unwrap().content[&deploy("web")]);
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    world.advance(Duration::from_secs(600));
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.rolls("web"), 3);
    assert!(world.status.targets[0].rolled_times.len() <= 2, "only the times within the span are kept");
}

#[test]
fn a_restart_in_the_middle_of_a_wave_or_a_pause_goes_on_from_the_status() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(Some("1m"), Some(1)));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    // A new replica: no debounce record, the status alone.
    world.pending = None;
    assert_eq!(world.tick(), Vec::<String>::new(), "the canary is still rolling");
    world.healthy("canary");
    world.tick();
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.pending = None;
    world.advance(Duration::from_secs(30));
    assert_eq!(world.tick(), Vec::<String>::new(), "the pause counts from when it began");
    world.advance(Duration::from_secs(30));
    world.pending = None;
    assert_eq!(world.tick(), ["web-a"]);
    world.pending = None;
    assert_eq!(world.tick(), Vec::<String>::new());
    world.healthy("web-a");
    assert_eq!(world.tick(), ["web-b"]);
    world.healthy("web-b");
    world.tick();
    assert_eq!([world.rolls("canary"), world.rolls("web-a"), world.rolls("web-b")], [1, 1, 1]);
}

#[test]
fn without_waves_or_a_budget_nothing_is_staged() {
    let spec = ConsulBindingSpec { rollout: Some(RolloutPolicy::default()), ..Default::default() };
    assert_eq!(Staging::of(&spec, None), Ok(None));
    let wave = |w: Wave| ConsulBindingSpec {
        rollout: Some(RolloutPolicy { waves: vec![w], ..Default::default() }),
        ..Default::default()
    };
    let both = Wave { name: Some("a".into()), selector: Some(canary()), ..Default::default() };
    assert!(Staging::of(&wave(both), None).unwrap_err().contains("both name and selector"));
    let long = Wave { pause: Some("25h".into()), ..Default::default() };
    assert!(Staging::of(&wave(long), None).unwrap_err().contains("at most 24h"));
    assert_eq!(Budget::parse("3/1h"), Ok(Budget { max: 3, per: Duration::from_secs(3600) }));
    assert!(Budget::parse("0/1h").is_err() && Budget::parse("3").is_err() && Budget::parse("3/0s").is_err());
}

mod sim;
