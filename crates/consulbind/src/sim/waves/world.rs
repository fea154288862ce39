//! A small world of Deployments under one binding that stages its rollouts, reconciled by the
//! controller's own decide and apply: the waves simulator's and the state machine's unit tests'.

use super::*;
use k8s_openapi::jiff::{RoundMode, TimestampRound, Unit};

/// Deployments `names`, the canary labelled `track=canary`, all healthy and carrying nothing,
/// under one binding that stages its rollouts. Each [`World::tick`] is one reconcile, the
/// controller's decide and apply, with the writes landing here.
pub struct World {
    pub spec: ConsulBindingSpec,
    pub status: ConsulBindingStatus,
    pub value: String,
    index: u64,
    path: Path,
    pub found: Vec<Workload>,
    pub labels: BTreeMap<Workload, BTreeMap<String, String>>,
    pub live: BTreeMap<Workload, Live>,
    pub versions: BTreeMap<Workload, Version>,
    pub health: BTreeMap<Workload, Health>,
    pub clock: Timestamp,
    /// The controller's memory of the binding, which a restart drops.
    pub record: Record,
    /// The binding's generation: a person's edit of its spec moves it.
    pub generation: i64,
    /// Generations added by the binding's stamps, per workload.
    pub rolls: BTreeMap<String, u32>,
    /// Patches of these workloads fail (a rule missing, a webhook refusing).
    pub refusing: BTreeSet<Workload>,
    /// Patches of these workloads land, but their answer is lost (a timeout, a reset
    /// connection): the controller sees them fail.
    pub unanswered: BTreeSet<Workload>,
    /// Writes of the binding's status fail (the API server overloaded, a rule missing), after
    /// the stamps landed.
    pub status_fails: bool,
    /// The binding is refused before anything is read (its token Secret holds no token, its namespace
    /// is over its share): the reconcile shows why and acts on nothing.
    pub refused: bool,
    /// Consul cannot be reached: the binding's keys are not read.
    pub consul_down: bool,
    /// What the last plan said each target should carry, and the content's checksum.
    pub content: BTreeMap<Workload, String>,
    pub desired: Option<String>,
    /// The workloads whose pod template references ConfigMap `cm`, which holds `cm`'s value.
    pub refs: BTreeSet<Workload>,
    pub cm: String,
    /// The binding's `consulbind.dev/roll-outside-window` annotation.
    pub let_through: Option<String>,
    /// The reasons of the Notice and Warning events raised.
    pub events: Vec<String>,
    /// And their notes.
    pub notes: Vec<String>,
    /// How soon the last reconcile's plan asked to look again, if it did: the wake its requeue
    /// follows (the world refuses no binding and retries no read, so every tick has a plan).
    pub wake: Option<Duration>,
}

pub fn deploy(name: &str) -> Workload {
    (WorkloadKind::Deployment, name.to_owned())
}

pub fn canary() -> LabelSelector {
    LabelSelector { match_labels: Some([("track".to_owned(), "canary".to_owned())].into()), ..Default::default() }
}

impl World {
    pub fn new(names: &[&str], waves: Vec<Wave>, budget: Option<RolloutBudget>) -> Self {
        let rollout = RolloutPolicy { quiet_period: Some("0s".into()), waves, budget, ..Default::default() };
        let mut world = Self::unbound(names, rollout);
        world.tick();
        assert_eq!(world.ready().reason, reason::BASELINED);
        world
    }

    pub fn staged(names: &[&str], waves: Vec<Wave>) -> Self {
        Self::new(names, waves, None)
    }

    /// The world before its binding's first reconcile.
    pub fn unbound(names: &[&str], rollout: RolloutPolicy) -> Self {
        let spec = ConsulBindingSpec {
            keys: vec![KeySource { key: "app/config".into(), ..Default::default() }],
            targets: vec![TargetRef {
                kind: WorkloadKind::Deployment,
                selector: Some(LabelSelector::default()),
                name: None,
            }],
            rollout: Some(Box::new(rollout)),
            include_target_references: true,
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
        Self {
            spec,
            status: ConsulBindingStatus::default(),
            value: "v1".into(),
            index: 10,
            path: Path::default(),
            found,
            labels,
            live: BTreeMap::new(),
            versions,
            health: BTreeMap::new(),
            clock: "2026-11-26T03:00:00Z".parse().unwrap(),
            record: Record::default(),
            generation: 1,
            rolls: BTreeMap::new(),
            refusing: BTreeSet::new(),
            unanswered: BTreeSet::new(),
            status_fails: false,
            content: BTreeMap::new(),
            desired: None,
            refs: BTreeSet::new(),
            cm: "c1".into(),
            let_through: None,
            events: Vec::new(),
            notes: Vec::new(),
            wake: None,
            refused: false,
            consul_down: false,
        }
    }

    pub fn write(&mut self, value: &str) {
        self.value = value.into();
        self.index += 1;
    }

    pub fn advance(&mut self, by: Duration) {
        self.clock = self.clock.checked_add(k8s_openapi::jiff::SignedDuration::try_from(by).unwrap()).unwrap();
    }

    /// A new replica takes over: it knows the status alone.
    pub fn restart(&mut self) {
        self.record = Record::default();
    }

    /// One reconcile; returns the workloads it rolled, whether its status write landed or
    /// not. Each takes a microsecond: no two reconciles happen at the same instant.
    pub fn tick(&mut self) -> Vec<String> {
        self.advance(Duration::from_micros(1));
        self.wake = None;
        let entries =
            vec![KvEntry::new("app/config", self.value.clone(), self.index).digested(|v| checksum::digest(&KEY, v))];
        self.path.set_answer(&entries, false, None);
        let spec = self.spec.clone();
        let cm = References::from([((ObjectKind::ConfigMap, "cm".into()), Use { keys: None, optional: false })]);
        let resolved = Resolved {
            found: self.found.clone(),
            live: self.live.clone(),
            versions: self.versions.clone(),
            health: self.health.clone(),
            labels: self.labels.clone(),
            uses: self.refs.iter().map(|w| (w.clone(), cm.clone())).collect(),
            references: if self.refs.is_empty() { References::default() } else { cm },
            ..Resolved::default()
        };
        let bound = read::bound_objects(&spec, &resolved.references).expect("one reference at most");
        let data = std::sync::Arc::new(Digested {
            version: self.cm.clone(),
            fingerprint: 0,
            entries: vec![("k".into(), Field::Data, checksum::digest(&KEY, self.cm.as_bytes()))].into(),
        });
        let objects = bound.iter().map(|_| Some(data.clone())).collect();
        let mut read = super::super::read_of(&spec, KEY, vec![self.path.state()], resolved, bound, objects);
        if self.consul_down {
            read.consul = Err((reason::CONSUL_UNREACHABLE, "connection refused".into()));
        }
        if let Some(staging) = &mut read.staging {
            staging.let_through.clone_from(&self.let_through);
        }
        let now = Instant::now();
        let observed = Observed {
            spec: &spec,
            generation: Some(self.generation),
            previous: self.status.clone(),
            started: now,
            clock: self.clock,
            read: match self.refused {
                false => Ok(read),
                true => Err(Refused {
                    reason: reason::TOKEN_SECRET_INVALID,
                    message: "the token Secret holds no token".into(),
                    then: Action::await_change(),
                }),
            },
        };
        let decision = decide::decide(&observed, &mut self.record, now);
        let mut port = Writes { world: self, rolled: Vec::new(), now };
        let applied = futures::executor::block_on(apply::apply(&mut port, &observed, decision));
        let rolled = port.rolled;
        if let Err(error) = applied {
            assert!(self.status_fails, "only a status write fails: {error}");
            // The error policy looks again soon.
            self.wake = Some(Duration::from_secs(5));
        }
        rolled
    }

    /// A person changes `name`'s pod template to reference ConfigMap `cm`, or no longer: its
    /// controller starts its pods again, which read everything as it is now.
    pub fn reference(&mut self, name: &str, referenced: bool) {
        let w = deploy(name);
        match referenced {
            true => self.refs.insert(w.clone()),
            false => self.refs.remove(&w),
        };
        self.versions.get_mut(&w).expect("a found workload").generation += 1;
    }

    pub fn healthy(&mut self, name: &str) {
        self.health.remove(&deploy(name));
    }

    pub fn fail(&mut self, name: &str) {
        self.health.insert(deploy(name), Health::Failed("ProgressDeadlineExceeded: timed out".into()));
    }

    pub fn ready(&self) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        self.status.conditions.iter().find(|c| c.type_ == conditions::READY).unwrap().clone()
    }

    pub fn state(&self, name: &str) -> Option<TargetState> {
        self.status.targets.iter().find(|t| t.name == name).and_then(|t| t.state)
    }

    pub fn phase(&self) -> Option<(u32, RolloutPhase)> {
        self.status.rollout.as_ref().map(|r| (r.wave, r.phase))
    }

    pub fn rolls(&self, name: &str) -> u32 {
        self.rolls.get(name).copied().unwrap_or(0)
    }

    /// A person deletes workload `name`.
    pub fn delete(&mut self, name: &str) {
        let w = deploy(name);
        self.found.retain(|f| *f != w);
        self.live.remove(&w);
        self.versions.remove(&w);
        self.health.remove(&w);
    }

    /// A GitOps tool makes workload `name` again from its manifest, which has no stamp: its pods
    /// start with what they read now, and are not ready yet.
    pub fn make_again(&mut self, name: &str) {
        let w = deploy(name);
        let uid = format!("uid-{name}-{}", self.index);
        self.versions.insert(w.clone(), Version { uid, generation: 1 });
        self.health.insert(w.clone(), Health::Progressing("0 of 1 replicas available".into()));
        self.found.push(w);
        self.found.sort();
    }
}

/// The world's side of the controller's writes.
struct Writes<'w> {
    world: &'w mut World,
    rolled: Vec<String>,
    now: Instant,
}

impl Port for Writes<'_> {
    fn record<R>(&mut self, f: impl FnOnce(&mut Record) -> R) -> R {
        f(&mut self.world.record)
    }

    fn hold(&mut self, plan: &Plan) {
        self.world.content = plan.content.clone();
        self.world.desired = plan.desired.clone();
    }

    async fn stamp(&mut self, _: &Read, plan: &Plan) -> Outcome {
        let world = &mut *self.world;
        let mut outcome = Outcome::default();
        for w in &plan.roll {
            if world.refusing.contains(w) {
                outcome.failed.push((w.clone(), "deployments.apps is forbidden".into()));
                continue;
            }
            // The managed fields keep the second of the write.
            let at = world.clock.round(TimestampRound::new().smallest(Unit::Second).mode(RoundMode::Trunc)).ok();
            world.live.insert(w.clone(), Live { value: plan.values[w].clone(), owned: true, at });
            world.versions.get_mut(w).expect("a found workload").generation += 1;
            *world.rolls.entry(w.1.clone()).or_default() += 1;
            world.health.insert(w.clone(), Health::Progressing("0 of 1 replicas updated".into()));
            self.rolled.push(w.1.clone());
            match world.unanswered.contains(w) {
                true => outcome.failed.push((w.clone(), "etcdserver: request timed out".into())),
                false => outcome.rolled.push(w.clone()),
            }
        }
        outcome
    }

    fn due(&mut self, at: Option<Instant>) {
        self.world.wake = at.map(|at| at.saturating_duration_since(self.now));
    }

    fn publish(&mut self, event: Event, _: &Read, _: &ConsulBindingStatus, _: &Outcome) {
        if let Event::Notice { reason, message } | Event::Warning { reason, message } = event {
            self.world.events.push(reason.to_owned());
            self.world.notes.push(message);
        }
    }

    async fn status(&mut self, _: &ConsulBindingStatus, status: &ConsulBindingStatus) -> Result<(), crate::Error> {
        if self.world.status_fails {
            let refused = kube::core::Status { code: 503, ..Default::default() };
            return Err(crate::Error::Status(kube::Error::Api(Box::new(refused))));
        }
        self.world.status = status.clone();
        Ok(())
    }

    async fn write_limited(&mut self, _: &ConsulBindingStatus, _: Instant) -> Result<Action, crate::Error> {
        unreachable!("no write limit")
    }
}
