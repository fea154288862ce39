//! A deterministic simulator of the decision core. It runs the real watch-path state
//! ([`Path`]), the real first-read comparison, plan, status and per-binding record against an
//! in-memory Consul (indexes that go backwards in a wipe or a snapshot restore, tombstone
//! reaping, outages, a path the token may no longer read, shared and solo reads), in-memory
//! workloads and a ConfigMap (relabelled out of the targets and back, references added and
//! dropped, a rollout undo, deleted and made again), the API server away and back with caches
//! that list again in pages, a second binding on one workload, controller restarts that keep
//! only the status, and the namespace handed between shard replicas part-way through a
//! reconcile's writes. Time is Tokio's paused clock.
//!
//! Each seed makes one schedule; after every step the invariants are checked against a model
//! that knows what happened, not what the controller concluded:
//! - a workload is rolled only if the content changed since it last started, so one change is
//!   one new generation whatever the number of bindings on it;
//! - content lost in a wipe or a restore is never rolled out before the go-ahead;
//! - once content is stable and nothing holds, every target runs the current content;
//! - content held as lost shows as such, naming the key.
//!
//! `CONSULBIND_SIM_SEEDS=N` runs seeds 0..N (default 500); `CONSULBIND_SIM_SEED=S` replays one
//! with its steps printed. `cargo xtask sim --seeds N` runs it on its own.

mod api;
mod events;
mod handover;
mod keys;
mod objects;
mod port;
mod shards;
mod shared;
pub mod waves;

use std::{collections::BTreeMap, fmt::Write as _, sync::Arc, time::Duration};

use consul_kv::{KvEntry, KvQuery};
use consulbind_api::{
    ConsulBindingSpec, ConsulBindingStatus, KeySource, ObjectKind, RolloutMode, RolloutPolicy, TargetRef, WorkloadKind,
    conditions::{self, reason},
};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use tokio::time::Instant;

use crate::{
    BindingRef,
    checksum::{self, Field},
    cluster::{
        Live, Version, Workload,
        objects::Digested,
        references::{References, Use},
        workloads::Resolved,
    },
    reconcile::{
        apply::{self, Port},
        decide::{self, Event},
        desk::{Desk, Stamp},
        input::{Consul, Outcome, Plan},
        observe::{Observed, Read},
        read, restore,
        state::Record,
    },
    watches::{KeyState, path::Path},
};

const KEY: checksum::Key = checksum::Key::new([7; checksum::KEY_LEN]);
const KEYS: [&str; 4] = ["app/x", "app/flags/a", "app/flags/b", "app/opt"];
const VALUES: [&str; 3] = ["v1", "v2", "v3"];
const GRACE: Duration = Duration::from_secs(30);
/// Past every quiet period, maximum delay and restore grace of the schedules.
const SETTLED: Duration = Duration::from_secs(100);
const STEPS: usize = 200;

/// One Consul datacenter's KV store.
#[derive(Clone, Debug)]
struct Store {
    data: BTreeMap<&'static str, (&'static str, u64)>,
    index: u64,
}

impl Store {
    fn put(&mut self, key: &'static str, value: &'static str) {
        self.index += 1;
        self.data.insert(key, (value, self.index));
    }

    fn delete(&mut self, key: &str) {
        if self.data.remove(key).is_some() {
            self.index += 1;
        }
    }

    fn matching<'a>(&'a self, source: &'a KeySource) -> impl Iterator<Item = (&'static str, &'static str, u64)> + 'a {
        let covers = move |k: &str| if source.recurse { k.starts_with(&source.key) } else { k == source.key };
        self.data.iter().filter(move |(k, _)| covers(k)).map(|(k, (v, m))| (*k, *v, *m))
    }

    fn entries(&self, source: &KeySource) -> Vec<KvEntry> {
        self.matching(source).map(|(k, v, m)| KvEntry::new(k, v, m).digested(|v| checksum::digest(&KEY, v))).collect()
    }

    /// Consul's index for a query of the path's own: its newest entry, or the store's when it
    /// matches nothing.
    fn own_index(&self, source: &KeySource) -> u64 {
        self.matching(source).map(|(_, _, m)| m).max().unwrap_or(self.index)
    }

    fn content(&self) -> BTreeMap<&'static str, &'static str> {
        self.data.iter().map(|(k, (v, _))| (*k, *v)).collect()
    }
}

/// What a workload's pods read when they last started: the Consul data and the ConfigMap's
/// data where the binding bound it.
type Content = (BTreeMap<&'static str, &'static str>, Option<BTreeMap<&'static str, &'static str>>);

struct Work {
    /// Each binding's annotation on its template.
    live: [Option<Live>; 2],
    generation: i64,
    runs: Content,
    /// Found by the binding's targets (a selector target: relabelled in and out).
    found: bool,
    /// Its template references the ConfigMap.
    refs: bool,
    /// Made again under its name this many times.
    uid: u32,
    /// The bindings' annotations on its template after each stamp, in order: a rollout undo
    /// puts back an older template.
    stamps: Vec<[Option<String>; 2]>,
    /// What it ran when last stamped (or made).
    stamped_with: Content,
    /// A rollout undo put back an older template since: as documented, it is rolled at the
    /// next change of what it reads, never for the undo alone.
    undone: bool,
    /// The status recorded its last stamp. One whose status write was refused (a handover or a
    /// crash between the two writes) and then undone is known to no one: the status says the
    /// content it brought is still to roll.
    recorded: bool,
    /// The undo put back a template over a stamp the status never recorded.
    undid_unrecorded: bool,
}

impl Work {
    fn new(runs: Content, found: bool) -> Self {
        let stamped_with = runs.clone();
        Self {
            live: [None, None],
            generation: 1,
            runs,
            found,
            refs: false,
            uid: 0,
            stamps: Vec::new(),
            stamped_with,
            undone: false,
            recorded: true,
            undid_unrecorded: false,
        }
    }
}

/// The controller's memory, which a restart drops.
struct Controller {
    paths: Vec<Path>,
    /// The index each path's watch last read at.
    seen: Vec<Option<u64>>,
    /// Read in a shared query, whose index says nothing of the path.
    grouped: Vec<bool>,
    record: Record,
    wake_at: Option<Instant>,
    /// The other binding's record and wake, swapped in while it reconciles.
    other: (Record, Option<Instant>),
    /// Its caches list again, in pages, after the API server came back: until the last page they
    /// hold what they listed before, and the binding waits (as `cluster::listing` makes it).
    listing: bool,
    /// What the ConfigMap cache held when the API server went away: its store until its list
    /// ends, while the other caches may show what is there now.
    cached_cm: Option<BTreeMap<&'static str, &'static str>>,
    /// The stamps the bindings hold back, which a write of the same checksum carries.
    desk: Desk,
}

struct Sim {
    rng: fastrand::Rng,
    /// Schedules relabel the selector target and change its references too.
    targets: bool,
    /// Schedules take the controller's API server away and bring it back.
    api_faults: bool,
    /// The controller's API server is away: it can neither read nor write.
    api_away: bool,
    log: String,
    spec: ConsulBindingSpec,
    generation: i64,
    status: ConsulBindingStatus,
    store: Store,
    snapshots: Vec<Store>,
    consul_up: bool,
    /// The token may no longer read this path: Consul answers it 403.
    denied: Option<usize>,
    controller: Option<Controller>,
    works: BTreeMap<&'static str, Work>,
    cm: BTreeMap<&'static str, &'static str>,
    /// Paths whose content the controller saw and that a wipe or restore emptied, with no
    /// go-ahead since.
    lost: Vec<bool>,
    /// Each path was non-empty when the controller's watch last read it.
    seen_content: Vec<bool>,
    /// A go-ahead was given since the watches last saw an index reset or the controller
    /// started: a ConsulIndexReset hold from before is released.
    go_ahead: bool,
    /// The spec as the last status saw it (its `observedSpec`): a spec that differs from it,
    /// other than in `suspend`, is the go-ahead for the losses that status shows, once the
    /// controller reconciles with rollouts not suspended. An edit undone before then is none.
    shown_spec: Option<ConsulBindingSpec>,
    /// The watches saw an index reset since the controller last reconciled (it could not, with
    /// the API server away): the status does not show what it lost, so no go-ahead covers it.
    reset_unshown: bool,
    /// A second binding on `web` alone, reading the same keys with the same rollout policy, as a
    /// second team's: its spec, generation, status and the spec its status saw, swapped in while it
    /// reconciles ([`Sim::active`] says which is in).
    other: Option<(ConsulBindingSpec, i64, ConsulBindingStatus, Option<ConsulBindingSpec>)>,
    active: usize,
    /// Stamps planned in one round of reconciles, by workload, written as one template change
    /// each: bindings woken by one change stamp a workload in one write (see `reconcile::desk`).
    batch: BTreeMap<&'static str, Vec<(usize, String)>>,
    /// The shard ring whose replicas hand the namespace between them.
    ring: Option<handover::Ring>,
    /// When anything but time last happened.
    quiet_since: Instant,
    started: Instant,
}

impl Sim {
    fn new(seed: u64, kind: Kind) -> Self {
        let targets = kind != Kind::Consul;
        let mut rng = fastrand::Rng::with_seed(seed);
        let quiet = ["0s", "1s", "2s", "5s"][rng.usize(..4)];
        let spec = ConsulBindingSpec {
            keys: vec![
                KeySource { key: "app/x".into(), recurse: false, optional: false },
                KeySource { key: "app/flags/".into(), recurse: true, optional: true },
                KeySource { key: "app/opt".into(), recurse: false, optional: true },
            ],
            targets: vec![
                TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), selector: None },
                TargetRef {
                    kind: WorkloadKind::Deployment,
                    name: None,
                    selector: Some(serde_json::from_value(serde_json::json!({"matchLabels": {"app": "api"}})).unwrap()),
                },
            ],
            include_target_references: true,
            rollout: Some(Box::new(RolloutPolicy {
                quiet_period: Some(quiet.into()),
                max_delay: Some("30s".into()),
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut store = Store { data: BTreeMap::new(), index: 10 };
        store.put("app/x", "v1");
        store.put("app/flags/a", "v1");
        let content = (store.content(), None);
        let works = BTreeMap::from([("web", Work::new(content.clone(), true)), ("api", Work::new(content, true))]);
        let n = spec.keys.len();
        let other = (kind == Kind::Shared).then(|| {
            let spec = ConsulBindingSpec {
                targets: vec![spec.targets[0].clone()],
                include_target_references: false,
                ..spec.clone()
            };
            (spec, 1, ConsulBindingStatus::default(), None)
        });
        Self {
            rng,
            targets,
            api_faults: kind == Kind::Api,
            api_away: false,
            log: String::new(),
            spec,
            generation: 1,
            status: ConsulBindingStatus::default(),
            store,
            snapshots: Vec::new(),
            consul_up: true,
            denied: None,
            controller: None,
            works,
            cm: BTreeMap::from([("k", "v1")]),
            lost: vec![false; n],
            seen_content: vec![false; n],
            go_ahead: false,
            shown_spec: None,
            reset_unshown: false,
            other,
            active: 0,
            batch: BTreeMap::new(),
            ring: (kind == Kind::Handover).then(handover::Ring::new),
            quiet_since: Instant::now(),
            started: Instant::now(),
        }
    }

    /// The controller's caches show the cluster as it is: its API server is there and no re-list
    /// is under way. What is "seen at once" needs it.
    fn sees_cluster(&self) -> bool {
        !self.api_away && self.controller.as_ref().is_none_or(|c| !c.listing)
    }

    /// The controller reconciles: it can reach its API server, and the reconcile's own gate
    /// ([`read::decides`]) lets it while a cache lists. (Decided on a mix of old and new, a Consul
    /// change that came meanwhile rolled a workload whose pods then read the new ConfigMap, and
    /// rolled it again once the ConfigMap's cache had listed: seed 132 of the API schedules,
    /// which fails with the gate open.)
    fn decides(&self) -> bool {
        !self.api_away && read::decides(self.controller.as_ref().is_some_and(|c| c.listing))
    }

    /// Every bound path can be read.
    fn readable(&self) -> bool {
        self.consul_up && self.denied.is_none()
    }

    fn note(&mut self, text: impl std::fmt::Display) {
        let at = self.started.elapsed().as_secs();
        let _ = writeln!(self.log, "  [{at:>5}s] {text}");
    }

    /// The content workload `name` would read if it started now: the keys, and the
    /// ConfigMap if its template references it.
    fn content(&self, name: &str) -> Content {
        (self.store.content(), self.works[name].refs.then(|| self.cm.clone()))
    }

    fn start_controller(&mut self) {
        let n = self.spec.keys.len();
        let grouped = (0..n).map(|_| self.rng.bool()).collect::<Vec<_>>();
        self.note(format_args!("controller starts (shared reads: {grouped:?})"));
        self.go_ahead = false;
        self.controller = Some(Controller {
            paths: (0..n).map(|_| Path::default()).collect(),
            seen: vec![None; n],
            grouped,
            record: Record::default(),
            wake_at: None,
            other: (Record::default(), None),
            listing: false,
            cached_cm: None,
            desk: Desk::default(),
        });
        self.take_over();
        self.deliver(false);
    }

    /// The watches read Consul. `reaped`: the index of each prefix went down with nothing
    /// changed, as when Consul reaps tombstones.
    fn deliver(&mut self, reaped: bool) {
        let (Some(controller), true) = (self.controller.as_mut(), self.consul_up) else { return };
        for (i, source) in self.spec.keys.iter().enumerate() {
            if self.denied == Some(i) {
                controller.paths[i].set_failed(reason::ACCESS_DENIED, "403 (Permission denied)");
                continue;
            }
            let entries = self.store.entries(source);
            let own = self.store.own_index(source);
            let path = &controller.paths[i];
            let before = match path.state() {
                KeyState::Ready(content) | KeyState::Failed { last: Some(content), .. } => {
                    Some(content.entries.is_empty())
                }
                _ => None,
            };
            let grouped = controller.grouped[i];
            let index = if grouped { self.store.index } else { own };
            let mut reset = controller.seen[i].is_some_and(|seen| index < seen);
            if reaped && source.recurse {
                reset = true;
            }
            controller.seen[i] = Some(index);
            self.go_ahead &= !reset;
            self.reset_unshown |= reset;
            // A key that vanishes from a shared read is read alone, with its own index.
            let vanished = before == Some(false) && entries.is_empty();
            // Emptied in an answer whose index did not go backwards: no one can tell a loss
            // from a deletion (a key watched alone answers its table's index once missing).
            if vanished && !reset {
                self.lost[i] = false;
            }
            let own_index = (!grouped || vanished).then_some(own);
            path.set_answer(&entries, reset, own_index);
            self.seen_content[i] = !entries.is_empty();
        }
    }

    /// The last status rolled out what it read.
    fn settled(&self) -> bool {
        let ready = self.status.conditions.iter().find(|c| c.type_ == conditions::READY);
        let settled = [reason::UP_TO_DATE, reason::PODS_AWAIT_DELETION, reason::BASELINED];
        ready.is_some_and(|c| settled.contains(&c.reason.as_str()))
    }

    /// Content held as lost shows as such, naming the key.
    fn check_hold_shown(&mut self, ready: Option<&str>) {
        let lost: Vec<String> =
            self.spec.keys.iter().zip(&self.lost).filter(|(_, l)| **l).map(|(k, _)| k.key.clone()).collect();
        if lost.is_empty() || !self.readable() {
            return;
        }
        let expected = if self.spec.suspend { reason::SUSPENDED } else { reason::CONSUL_INDEX_RESET };
        let message = self.status.conditions.iter().find(|c| c.type_ == conditions::READY).map(|c| c.message.clone());
        let named = message.as_deref().is_some_and(|m| lost.iter().all(|k| m.contains(&format!("{k:?}"))));
        if ready != Some(expected) || !named {
            self.fail(format_args!("{lost:?} lost, but Ready says {ready:?}: {message:?}"));
        }
    }

    /// Once nothing has happened for long enough and nothing holds, every target runs the
    /// current content.
    fn check_settled(&mut self) {
        let required = self.store.data.contains_key("app/x");
        if self.controller.is_none()
            || !self.sees_cluster()
            || !self.readable()
            || self.spec.suspend
            || dry_run(&self.spec)
            || !required
            || self.lost.contains(&true)
            || self.quiet_since.elapsed() < SETTLED
        {
            return;
        }
        // The controller cannot tell every deletion from a loss: holding one, and saying so,
        // is allowed until the go-ahead.
        let ready = self.status.conditions.iter().find(|c| c.type_ == conditions::READY);
        if ready.is_some_and(|c| c.reason == reason::CONSUL_INDEX_RESET) && !self.go_ahead {
            return;
        }
        let behind: Vec<&str> = self
            .works
            .iter()
            .filter(|(name, w)| w.found && w.runs != self.content(name))
            .filter(|(name, w)| !w.undone || w.stamped_with != self.content(name))
            .map(|(name, _)| *name)
            .collect();
        if !behind.is_empty() {
            self.fail(format_args!("{behind:?} still run older content once everything settled"));
        }
    }

    fn fail(&mut self, what: std::fmt::Arguments<'_>) {
        panic!(
            "invariant broken: {what}\nlost {:?}, go-ahead {}\nstatus: {:#?}\nsteps:\n{}",
            self.lost, self.go_ahead, self.status, self.log
        );
    }
}

/// The binding reports what it would roll, and rolls nothing.
pub(crate) fn dry_run(spec: &ConsulBindingSpec) -> bool {
    spec.rollout.as_ref().and_then(|r| r.mode) == Some(RolloutMode::DryRun)
}

/// What the reads of a binding of `spec` find, with the controller's defaults for the rest.
pub(crate) fn read_of(
    spec: &ConsulBindingSpec,
    key: checksum::Key,
    states: Vec<KeyState>,
    resolved: Resolved,
    bound: Vec<read::Bound>,
    objects: Vec<Option<Arc<Digested>>>,
) -> Read {
    Read {
        window: read::validate(spec).expect("a valid spec"),
        key,
        staging: crate::reconcile::staging::Staging::of(spec, &Default::default()).expect("valid staging"),
        dry_run: crate::reconcile::observe::dry_run(false, spec),
        restore_grace: GRACE,
        consul: Ok(states),
        in_turns: None,
        found_restored: None,
        resolved,
        bound,
        objects: Ok(objects),
        values: None,
        write_limited: None,
        caution: None,
    }
}

/// What a schedule's steps may do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Consul's faults, restarts, the go-ahead and suspend.
    Consul,
    /// And the targets relabelled, their references changed, undone, deleted and made again.
    Targets,
    /// And the controller's API server away and back, its caches re-listing in pages.
    Api,
    /// The target changes, with a second binding on one of the workloads.
    Shared,
    /// The target changes, with the namespace handed between the replicas of a shard ring.
    Handover,
}

/// Runs the schedule of `seed`; panics with its steps when an invariant breaks.
fn run(seed: u64, kind: Kind) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    runtime.block_on(async {
        let mut sim = Sim::new(seed, kind);
        sim.start_controller();
        sim.reconcile().await;
        for _ in 0..STEPS {
            sim.step().await;
        }
        // The end: Consul answers, the controller runs, and time passes.
        sim.consul_up = true;
        sim.denied = None;
        sim.api_away = false;
        if let Some(controller) = sim.controller.as_mut() {
            controller.listing = false;
            controller.cached_cm = None;
        }
        if sim.controller.is_none() {
            sim.start_controller();
        }
        sim.deliver(false);
        sim.reconcile().await;
        sim.pass(SETTLED * 2).await;
    });
}

pub(crate) fn run_seeds(kind: Kind) {
    each_seed(|seed| run(seed, kind));
}

/// Runs `run` on seeds 0..`CONSULBIND_SIM_SEEDS` (default 500), or on `CONSULBIND_SIM_SEED`
/// alone, naming the seed that fails.
pub(crate) fn each_seed(run: impl Fn(u64) + std::panic::RefUnwindSafe) {
    if let Some(seed) = std::env::var("CONSULBIND_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        return run(seed);
    }
    let seeds: u64 = std::env::var("CONSULBIND_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(500);
    for seed in 0..seeds {
        if let Err(panic) = std::panic::catch_unwind(|| run(seed)) {
            eprintln!("seed {seed} failed; replay it with CONSULBIND_SIM_SEED={seed}");
            std::panic::resume_unwind(panic);
        }
    }
}
