//! A deterministic simulator of the decision core. It runs the real watch-path state
//! ([`Path`]), the real first-read comparison, plan, status and per-binding record against an
//! in-memory Consul (indexes that go backwards in a wipe or a snapshot restore, tombstone
//! reaping, outages, a path the token may no longer read, shared and solo reads), in-memory
//! workloads and a ConfigMap (relabelled out of the targets and back, references added and
//! dropped, a rollout undo, deleted and made again), the API server away and back with caches
//! that list again in pages, a second binding on one workload, and controller restarts that
//! keep only the status. Time is Tokio's paused clock.
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
mod keys;
mod objects;
mod shared;
pub mod waves;

use std::{collections::BTreeMap, fmt::Write as _, sync::Arc, time::Duration};

use consul_kv::{KvEntry, KvQuery};
use consulbind_api::{
    ConsulBindingSpec, ConsulBindingStatus, KeySource, ObjectKind, RolloutPolicy, TargetRef, WorkloadKind,
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
        self.matching(source)
            .map(|(k, v, m)| KvEntry::new(k, v, m).digested(|v| checksum::digest(&KEY, v).to_vec()))
            .collect()
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
            rollout: Some(RolloutPolicy {
                quiet_period: Some(quiet.into()),
                max_delay: Some("30s".into()),
                ..Default::default()
            }),
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

    /// One reconcile of the binding, as the controller's reconcile makes it, with every stamp
    /// landing.
    async fn reconcile(&mut self) {
        if !self.decides() {
            return;
        }
        let Some(mut controller) = self.controller.take() else { return };
        self.reconcile_with(&mut controller).await;
        if self.other.is_some() {
            self.swap(&mut controller);
            self.reconcile_with(&mut controller).await;
            self.swap(&mut controller);
        }
        self.write_stamps(&mut controller);
        self.reset_unshown &= !self.readable();
        self.controller = Some(controller);
    }

    /// Puts the other binding in (or back out): its spec, status and memory.
    fn swap(&mut self, controller: &mut Controller) {
        let Some((spec, generation, status, shown)) = self.other.as_mut() else { return };
        std::mem::swap(&mut self.spec, spec);
        std::mem::swap(&mut self.generation, generation);
        std::mem::swap(&mut self.status, status);
        std::mem::swap(&mut self.shown_spec, shown);
        std::mem::swap(&mut controller.record, &mut controller.other.0);
        std::mem::swap(&mut controller.wake_at, &mut controller.other.1);
        self.active ^= 1;
    }

    /// The other binding's spec gets the same edit, as one commit to a GitOps repository makes.
    fn mirror(&mut self) {
        let Some((spec, generation, _, _)) = self.other.as_mut() else { return };
        spec.rollout = self.spec.rollout.clone();
        spec.suspend = self.spec.suspend;
        *generation += 1;
    }

    /// Workload `name` is a target of the active binding.
    fn targeted(&self, name: &str) -> bool {
        self.works[name].found && (self.active == 0 || name == "web")
    }

    /// The active binding's reconcile: the world as the controller's reads would find it, then
    /// the controller's own decide and apply, with writes that land in the model.
    async fn reconcile_with(&mut self, controller: &mut Controller) {
        let spec = self.spec.clone();
        let Some(observed) = self.observe(&spec, controller).await else { return };
        let decision = decide::decide(&observed, &mut controller.record, Instant::now());
        let ready = observed
            .read
            .as_ref()
            .is_ok_and(|read| matches!(observed.input(read, None, false).consul, Consul::Ready(_)));
        let mut port = Writes { sim: self, controller, spec: &spec, ready, desired: None, rolled: Vec::new() };
        apply::apply(&mut port, &observed, decision).await.expect("the model takes every write");
    }

    /// What the controller's reads find: its watches' paths, the workloads as its caches hold
    /// them, the ConfigMap (as listed before the API server went away, while its cache lists
    /// again), and at its first read, whether Consul's indexes went below the status's.
    async fn observe<'a>(&mut self, spec: &'a ConsulBindingSpec, controller: &mut Controller) -> Option<Observed<'a>> {
        let states: Vec<KeyState> = match self.consul_up {
            true => controller.paths.iter().map(Path::state).collect(),
            false => controller
                .paths
                .iter()
                .map(|p| {
                    p.set_failed(reason::CONSUL_UNREACHABLE, "down");
                    p.state()
                })
                .collect(),
        };
        let consul = read::consul_view(spec, &states, u64::MAX)?;
        let ready = matches!(consul, Consul::Ready(_));
        self.go_ahead_given(spec, ready);
        let previous = self.status.clone();
        let targeted: Vec<(&'static str, &Work)> =
            self.works.iter().filter(|(name, _)| self.targeted(name)).map(|(name, w)| (*name, w)).collect();
        let workload = |name: &str| (WorkloadKind::Deployment, name.to_owned());
        let mut resolved = Resolved {
            found: targeted.iter().map(|(name, _)| workload(name)).collect(),
            live: targeted
                .iter()
                .filter_map(|(name, w)| Some((workload(name), w.live[self.active].clone()?)))
                .collect(),
            versions: targeted
                .iter()
                .map(|(name, w)| {
                    (workload(name), Version { uid: format!("{name}-{}", w.uid), generation: w.generation })
                })
                .collect(),
            ..Resolved::default()
        };
        read::trust_stamps(&mut controller.record.stamps, &resolved.versions, &mut resolved.live);
        let cm = References::from([((ObjectKind::ConfigMap, "cm".into()), Use { keys: None, optional: false })]);
        resolved.uses = targeted
            .iter()
            .filter(|(_, w)| w.refs && spec.include_target_references)
            .map(|(name, _)| (workload(name), cm.clone()))
            .collect();
        let references = resolved.uses.values().next().cloned().unwrap_or_default();
        let bound = read::bound_objects(spec, &references).expect("one reference");
        let cached = controller.cached_cm.as_ref().filter(|_| controller.listing).unwrap_or(&self.cm);
        let digested = Arc::new(Digested {
            version: "1".into(),
            fingerprint: 0,
            entries: cached
                .iter()
                .map(|(k, v)| (k.to_string(), Field::Data, checksum::digest(&KEY, v.as_bytes())))
                .collect(),
        });
        let objects = bound.iter().map(|_| Some(digested.clone())).collect();

        let found_restored = match &consul {
            Consul::Ready(read) if !controller.record.restore.compared => {
                self.forget_undetectable(&previous);
                let store = &self.store;
                let alone = async |queries: &[&KvQuery]| {
                    let index = |q: &&KvQuery| {
                        let source = KeySource { key: q.key.clone(), recurse: q.recurse, optional: true };
                        store.matching(&source).next().is_none().then(|| store.own_index(&source))
                    };
                    Ok(queries.iter().map(index).collect())
                };
                let queries = read::queries(spec, None);
                Some(restore::restored_at_first_read(&previous, read, &queries, alone).await.unwrap())
            }
            _ => None,
        };
        let read = Read {
            window: read::validate(spec).expect("the simulated spec is valid"),
            key: KEY.scoped("ns", ["", "", ""]),
            staging: None,
            dry_run: false,
            restore_grace: GRACE,
            consul: Ok(states),
            in_turns: None,
            found_restored,
            resolved,
            bound,
            objects: Ok(objects),
            values: None,
            write_limited: None,
            caution: None,
        };
        Some(Observed {
            spec,
            generation: Some(self.generation),
            previous,
            started: Instant::now(),
            clock: Timestamp::UNIX_EPOCH,
            read: Ok(read),
        })
    }

    /// The go-ahead releases what the status showed as lost. One given while Consul cannot be
    /// read says nothing of a loss the status could not show yet: that is held until a later
    /// go-ahead.
    fn go_ahead_given(&mut self, spec: &ConsulBindingSpec, read: bool) {
        let unsuspended = |s: &ConsulBindingSpec| ConsulBindingSpec { suspend: false, ..s.clone() };
        let edited = self.shown_spec.as_ref().is_some_and(|shown| unsuspended(shown) != unsuspended(spec));
        if edited && !spec.suspend {
            for (lost, shown) in self.lost.iter_mut().zip(&self.status.keys) {
                if shown.lost {
                    *lost = false;
                    self.go_ahead |= read && !self.reset_unshown;
                }
            }
        }
    }

    /// Plans the active binding's stamp on `name`, written with the round's others; returns the
    /// workload's version after that write.
    fn stamp(&mut self, name: &str, value: String) -> Version {
        let lost: Vec<String> =
            self.spec.keys.iter().zip(&self.lost).filter(|(_, l)| **l).map(|(k, _)| k.key.clone()).collect();
        if !lost.is_empty() {
            self.fail(format_args!("rolled {name} with {lost:?} lost and no go-ahead"));
        }
        let name = *self.works.keys().find(|n| **n == name).expect("a simulated workload");
        self.batch.entry(name).or_default().push((self.active, value));
        let work = &self.works[name];
        Version { uid: format!("{name}-{}", work.uid), generation: work.generation + 1 }
    }

    /// Each workload stamped in the round gets one template change, with every binding's stamp
    /// and the held stamps of the same checksum, which the bindings then remember as their own.
    fn write_stamps(&mut self, controller: &mut Controller) {
        for (name, stamps) in std::mem::take(&mut self.batch) {
            let stamps = stamps.into_iter().map(|(b, value)| stamp(b, value)).collect();
            let (stamps, carried) = controller.desk.carry(&target(name), stamps);
            let stamps: Vec<(usize, String)> =
                stamps.into_iter().map(|s| (usize::from(s.binding.name == "b"), s.value)).collect();
            let version = self.write(name, stamps);
            for s in carried {
                self.note(format_args!("  {name} carries the held stamp of {}", s.binding.name));
                let record = if s.binding.name == "b" { &mut controller.other.0 } else { &mut controller.record };
                record.stamps.insert((WorkloadKind::Deployment, name.to_owned()), (version.clone(), s.value));
            }
        }
    }

    fn write(&mut self, name: &str, stamps: Vec<(usize, String)>) -> Version {
        let content = self.content(name);
        let work = &self.works[name];
        let (undone, undo_alone) = (work.undone, work.undone && work.stamped_with == content);
        let unchanged = work.runs == content;
        if undo_alone {
            self.fail(format_args!("rolled {name} for a rollout undo alone"));
        }
        if !undone && unchanged {
            self.fail(format_args!("rolled {name} without a change of its content"));
        }
        let work = self.works.get_mut(name).expect("a simulated workload");
        for (binding, value) in stamps {
            work.live[binding] = Some(Live { value, owned: true });
        }
        work.generation += 1;
        work.stamps.push(work.live.clone().map(|l| l.map(|l| l.value)));
        work.runs = content.clone();
        work.stamped_with = content;
        work.undone = false;
        Version { uid: format!("{name}-{}", work.uid), generation: work.generation }
    }

    /// The last status rolled out what it read.
    fn settled(&self) -> bool {
        let ready = self.status.conditions.iter().find(|c| c.type_ == conditions::READY);
        ready.is_some_and(|c| [reason::UP_TO_DATE, reason::BASELINED].contains(&c.reason.as_str()))
    }

    /// A person changed which objects the workload's template references: its pods start
    /// again and read the objects as they are. What they read from Consul counts as what
    /// they carried before: only a change of references alone is recorded as carried
    /// (a rebase), so a change of Consul data held meanwhile still rolls it.
    fn template_changed(&mut self, name: &str) {
        let objects = self.content(name).1;
        let work = self.works.get_mut(name).expect("a simulated workload");
        work.generation += 1;
        work.runs.1 = objects;
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

    /// Lets `time` pass, reconciling when the binding asked to be.
    async fn pass(&mut self, time: Duration) {
        let until = Instant::now() + time;
        // Nothing runs while the API server is away; the reconcile after it comes back will.
        let wake = |sim: &Self| {
            let controller = sim.controller.as_ref()?;
            let at = [controller.wake_at, controller.other.1].into_iter().flatten().min()?;
            (at <= until && sim.decides()).then_some(at)
        };
        while let Some(at) = wake(self) {
            tokio::time::advance(at.saturating_duration_since(Instant::now())).await;
            self.reconcile().await;
        }
        tokio::time::advance(until.saturating_duration_since(Instant::now())).await;
        self.check_settled();
    }

    /// The store was replaced by a wipe or a restore. Where its index went backwards, each path
    /// that held content the controller's watch saw, and its status too (so the targets may
    /// carry it), and is now empty is lost; where it went forward, nobody can tell it from
    /// edits.
    fn replaced(&mut self, store: Store) {
        let backwards = store.index < self.store.index;
        self.store = store;
        if !backwards {
            return self.edited();
        }
        for (i, source) in self.spec.keys.iter().enumerate() {
            let recorded = self.status.keys.get(i).is_some_and(|k| k.present);
            match self.store.matching(source).next() {
                Some(_) => self.lost[i] = false,
                None => self.lost[i] |= self.seen_content[i] && recorded,
            }
        }
    }

    /// A loss that no replica watched shows only where Consul now answers below an index the
    /// status recorded (as documented): one that does not was indistinguishable from edits.
    fn forget_undetectable(&mut self, previous: &ConsulBindingStatus) {
        let highest = previous.keys.iter().filter_map(|k| k.modify_index).max().unwrap_or(0);
        let below = self.spec.keys.iter().zip(&previous.keys).any(|(source, recorded)| {
            let Some(recorded) = recorded.modify_index else { return false };
            // A missing key or an empty prefix answers the store's index, below none the
            // status recorded.
            let (now, floor) = match (source.recurse, self.store.matching(source).next()) {
                (false, Some((_, _, modify))) => (Some(modify), recorded),
                (_, None) => (Some(self.store.index), highest),
                (true, Some(_)) => (None, recorded),
            };
            now.is_some_and(|now| now < floor)
        });
        if !below {
            for (lost, recorded) in self.lost.iter_mut().zip(&previous.keys) {
                *lost &= recorded.lost;
            }
        }
    }

    /// A put or a delete: what it changes is no loss any more.
    fn edited(&mut self) {
        for (i, source) in self.spec.keys.iter().enumerate() {
            if self.store.matching(source).next().is_some() {
                self.lost[i] = false;
            }
        }
    }

    /// A step in Consul, the controller or the spec, or `None` for time to pass.
    fn consul_event(&mut self, roll: u32, key: &'static str, value: &'static str) -> Option<String> {
        match roll {
            0..25 => Some({
                self.store.put(key, value);
                self.edited();
                format!("put {key}={value}")
            }),
            25..32 => Some({
                self.store.delete(key);
                format!("delete {key}")
            }),
            32..36 => Some({
                let index = self.rng.u64(1..5);
                self.replaced(Store { data: BTreeMap::new(), index });
                "Consul rebuilt empty".into()
            }),
            36..40 => Some({
                self.snapshots.push(self.store.clone());
                "snapshot taken".into()
            }),
            40..44 if !self.snapshots.is_empty() => Some({
                let i = self.rng.usize(..self.snapshots.len());
                let snapshot = self.snapshots[i].clone();
                self.replaced(snapshot);
                format!("snapshot {i} restored")
            }),
            44..47 => Some("tombstones reaped".into()),
            47..51 => Some({
                self.consul_up = !self.consul_up;
                format!("Consul {}", if self.consul_up { "back" } else { "down" })
            }),
            51..57 => Some({
                self.controller = None;
                "controller stopped".into()
            }),
            57..62 => Some({
                let max = if self.rng.bool() { "30s" } else { "31s" };
                let changed = self.spec.rollout.as_ref().and_then(|r| r.max_delay.as_deref()) != Some(max);
                if let Some(rollout) = self.spec.rollout.as_mut() {
                    rollout.max_delay = Some(max.into());
                }
                if changed {
                    self.generation += 1;
                    self.mirror();
                }
                format!("spec edited (maxDelay {max})")
            }),
            62..66 => Some({
                self.spec.suspend = !self.spec.suspend;
                self.generation += 1;
                self.mirror();
                format!("suspend: {}", self.spec.suspend)
            }),
            _ => None,
        }
    }

    /// A step in the workloads, the ConfigMap, the token's policy or the API server, or `None`
    /// for time to pass.
    fn cluster_event(&mut self, roll: u32, value: &'static str, name: &'static str) -> Option<String> {
        match roll {
            // Seen at once, with Consul read: a workload found without a stamp counts as today's.
            66..72 if self.targets && self.readable() && self.controller.is_some() && self.sees_cluster() => Some({
                let api = self.works.get_mut("api").expect("api");
                api.found = !api.found;
                let found = api.found;
                // Found without a stamp of the binding's, or a row of its uid in the status: taken
                // as started with today's content (as documented), since nothing says otherwise.
                let uid = format!("api-{}", self.works["api"].uid);
                let rows = self.status.targets.iter().chain(&self.status.former_targets);
                let known = rows.filter(|t| t.name == "api").any(|t| t.uid.as_ref().is_none_or(|u| *u == uid));
                let api = self.works.get_mut("api").expect("api");
                if found && api.live[0].is_none() && !known {
                    let content = self.content("api");
                    self.works.get_mut("api").expect("api").runs = content;
                }
                format!("api relabelled {}", if found { "into the targets" } else { "out of the targets" })
            }),
            // A reference change is recorded without a rollout where the binding has rolled out
            // what it read, and can see it: found, and Consul read.
            72..77
                if self.targets
                    && self.works["api"].found
                    && self.readable()
                    && self.settled()
                    && self.sees_cluster() =>
            {
                Some({
                    let api = self.works.get_mut("api").expect("api");
                    api.refs = !api.refs;
                    let refs = api.refs;
                    self.template_changed("api");
                    format!("api's template {} the ConfigMap", if refs { "references" } else { "no longer references" })
                })
            }
            77..82 => Some({
                self.cm.insert("k", value);
                format!("ConfigMap k={value}")
            }),
            // `kubectl rollout undo`: an older template, with an older stamp set by another
            // manager; its pods start again and read what is there now.
            82..86 if self.targets && self.works[name].stamps.len() > 1 => Some({
                let content = self.content(name);
                let work = self.works.get_mut(name).expect("a simulated workload");
                let values = work.stamps[self.rng.usize(..work.stamps.len() - 1)].clone();
                work.live = values.map(|v| Some(Live { value: v?, owned: false }));
                work.generation += 1;
                work.runs = content;
                work.undone = true;
                format!("{name} rolled back")
            }),
            // An ACL policy change: the token may no longer read one bound path, or may again.
            89..92 => Some({
                let path = self.rng.usize(..self.spec.keys.len());
                self.denied = match self.denied {
                    Some(_) => None,
                    None => Some(path),
                };
                match self.denied {
                    Some(i) => format!("the token may no longer read {}", self.spec.keys[i].key),
                    None => "the token's policy is granted again".into(),
                }
            }),
            // Deleted and applied again from its manifest, without the binding's stamp; seen at
            // once with Consul read, as a workload found without a stamp counts as today's.
            86..89 if self.targets && self.readable() && self.controller.is_some() && self.sees_cluster() => Some({
                let content = self.content(name);
                let work = self.works.get_mut(name).expect("a simulated workload");
                let (found, refs, uid) = (work.found, work.refs, work.uid + 1);
                *work = Work { refs, uid, ..Work::new(content, found) };
                format!("{name} deleted and made again")
            }),
            // The API server goes away: the caches keep what they listed, and nothing can be read
            // or written. When it is back, they list again, in pages: until the last page, the
            // binding reads what they held.
            92..96 if self.api_faults => Some({
                self.api_away = !self.api_away;
                if let Some(controller) = self.controller.as_mut() {
                    match self.api_away {
                        true => drop(controller.cached_cm.get_or_insert_with(|| self.cm.clone())),
                        false => controller.listing = true,
                    }
                }
                format!("the API server is {}", if self.api_away { "away" } else { "back; the caches list again" })
            }),
            _ => None,
        }
    }

    async fn step(&mut self) {
        // A re-list under way ends (its last page), and wakes the binding.
        if self.controller.as_ref().is_some_and(|c| c.listing) && !self.api_away && self.rng.bool() {
            let controller = self.controller.as_mut().expect("a controller");
            controller.listing = false;
            controller.cached_cm = None;
            self.note("the caches have listed again");
            self.quiet_since = Instant::now();
            self.reconcile().await;
        }
        let roll = self.rng.u32(..100);
        let key = KEYS[self.rng.usize(..KEYS.len())];
        let value = VALUES[self.rng.usize(..VALUES.len())];
        let name = ["web", "api"][self.rng.usize(..2)];
        let event = match roll {
            0..66 => self.consul_event(roll, key, value),
            _ => self.cluster_event(roll, value, name),
        };
        let Some(event) = event else {
            let time = Duration::from_secs(self.rng.u64(1..60));
            self.note(format_args!("{}s pass", time.as_secs()));
            self.pass(time).await;
            return;
        };
        self.note(&event);
        self.quiet_since = Instant::now();
        if self.controller.is_none() && self.rng.u32(..3) > 0 {
            self.start_controller();
        }
        self.deliver(event == "tombstones reaped");
        let time = Duration::from_millis(self.rng.u64(1..3000));
        self.pass(time).await;
        self.reconcile().await;
    }
}

/// The simulator's side of the controller's writes: stamps planned into the round's batch,
/// held stamps on the model's desk, the status into the model.
struct Writes<'s> {
    sim: &'s mut Sim,
    controller: &'s mut Controller,
    spec: &'s ConsulBindingSpec,
    /// Consul was read.
    ready: bool,
    desired: Option<String>,
    rolled: Vec<Workload>,
}

impl Port for Writes<'_> {
    fn record<R>(&mut self, f: impl FnOnce(&mut Record) -> R) -> R {
        f(&mut self.controller.record)
    }

    fn hold(&mut self, plan: &Plan) {
        // Content the targets already carry holds nothing, lost or not.
        if plan.desired.is_some() && plan.desired == self.sim.status.applied_checksum {
            self.sim.lost.fill(false);
        }
        self.desired = plan.desired.clone();
        let active = self.sim.active;
        let held = plan.held.iter().map(|w| (target(&w.1), stamp(active, plan.content[w].clone())));
        self.controller.desk.hold(&binding(active), held.collect());
    }

    async fn stamp(&mut self, _: &Read, plan: &Plan) -> Outcome {
        for w in &plan.roll {
            let version = self.sim.stamp(&w.1, plan.values[w].clone());
            self.controller.record.stamps.insert(w.clone(), (version, plan.values[w].clone()));
        }
        self.rolled = plan.roll.clone();
        Outcome { rolled: plan.roll.clone(), failed: Vec::new() }
    }

    fn due(&mut self, at: Option<Instant>) {
        self.controller.wake_at = at;
    }

    fn publish(&mut self, _: Event, _: &Read, _: &ConsulBindingStatus, _: &Outcome) {}

    async fn status(&mut self, _: &ConsulBindingStatus, status: &ConsulBindingStatus) -> Result<(), crate::Error> {
        let sim = &mut *self.sim;
        if self.ready {
            for (i, source) in self.spec.keys.iter().enumerate() {
                sim.seen_content[i] = sim.store.matching(source).next().is_some();
            }
        }
        let ready = status.conditions.iter().find(|c| c.type_ == conditions::READY).map(|c| c.reason.clone());
        let keys: Vec<(bool, bool)> = status.keys.iter().map(|k| (k.present, k.lost)).collect();
        let short = |c: &str| c.get(3..9).unwrap_or(c).to_owned();
        let rows: Vec<String> = status
            .targets
            .iter()
            .chain(&status.former_targets)
            .map(|t| format!("{}={}/{}", t.name, short(&t.checksum), t.stamp.as_deref().map_or("-".into(), short)))
            .collect();
        let desired = self.desired.as_deref().map_or("-".into(), short);
        sim.note(format_args!("  desired {desired}, rows {rows:?}"));
        sim.note(format_args!("reconciled: Ready {ready:?}, rolled {:?}, keys (present, lost) {keys:?}", self.rolled));
        sim.status = status.clone();
        sim.shown_spec = Some(self.spec.clone());
        sim.check_hold_shown(ready.as_deref());
        Ok(())
    }

    async fn write_limited(&mut self, _: &ConsulBindingStatus, _: Instant) -> Result<Action, crate::Error> {
        unreachable!("the simulated namespace has no write limit")
    }
}

/// The first binding is `a`, the second `b`.
fn binding(active: usize) -> BindingRef {
    BindingRef::new(["a", "b"][active]).within("ns")
}

fn target(name: &str) -> (String, Workload) {
    ("ns".into(), (WorkloadKind::Deployment, name.to_owned()))
}

fn stamp(active: usize, value: String) -> Stamp {
    let name = ["a", "b"][active];
    Stamp { binding: binding(active), annotation: format!("a/{name}"), value, manager: format!("m-{name}") }
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
