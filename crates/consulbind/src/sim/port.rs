//! The controller's side of the simulator: what its reads would find, its own decide and apply,
//! and the writes landing in the model.

use super::*;

impl Sim {
    /// One reconcile of the binding, as the controller's reconcile makes it, with every stamp
    /// landing.
    pub(super) async fn reconcile(&mut self) {
        if !self.decides() || !self.ready() {
            return;
        }
        let Some(mut controller) = self.controller.take() else { return };
        self.renewed();
        self.reconcile_with(&mut controller).await;
        if self.other.is_some() {
            self.swap(&mut controller);
            self.reconcile_with(&mut controller).await;
            self.swap(&mut controller);
        }
        self.write_stamps(&mut controller);
        self.reset_unshown &= !self.readable();
        if !self.let_go_forgotten() {
            self.controller = Some(controller);
        }
    }

    /// Puts the other binding in (or back out): its spec, status and memory.
    pub(super) fn swap(&mut self, controller: &mut Controller) {
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
    pub(super) fn mirror(&mut self) {
        let Some((spec, generation, _, _)) = self.other.as_mut() else { return };
        spec.rollout = self.spec.rollout.clone();
        spec.suspend = self.spec.suspend;
        *generation += 1;
    }

    /// Workload `name` is a target of the active binding.
    pub(super) fn targeted(&self, name: &str) -> bool {
        self.works[name].found && (self.active == 0 || name == "web")
    }

    /// The active binding's reconcile: the world as the controller's reads would find it, then
    /// the controller's own decide and apply, with writes that land in the model.
    pub(super) async fn reconcile_with(&mut self, controller: &mut Controller) {
        let spec = self.spec.clone();
        let Some(observed) = self.observe(&spec, controller).await else { return };
        let decision = decide::decide(&observed, &mut controller.record, Instant::now());
        let ready = observed
            .read
            .as_ref()
            .is_ok_and(|read| matches!(observed.input(read, None, false).consul, Consul::Ready(_)));
        let mut port = Writes {
            sim: self,
            controller,
            spec: &spec,
            ready,
            desired: None,
            rolled: Vec::new(),
            published: Vec::new(),
        };
        let first_record = observed.previous.applied_checksum.is_none();
        let observed_dry_run = observed.previous.dry_run.clone();
        let applied = apply::apply(&mut port, &observed, decision).await;
        let (rolled, published) = (port.rolled, port.published);
        // A reconcile cut short by a handover made some of its writes; the replica that takes
        // over makes the rest, from the status.
        if self.cut_short() {
            self.note(format_args!("  cut short: rolled {rolled:?}, events {published:?}, {applied:?}"));
            return;
        }
        applied.expect("the model takes every write");
        // What the binding's events tell a person, held to what happened: one RolledOut for a
        // reconcile that changed workloads, none for one that did not, and a first record of
        // the content without a rollout said to be a baseline.
        let rolled_out = published.contains(&"RolledOut");
        if rolled_out == rolled.is_empty() {
            self.fail(format_args!("rolled {rolled:?}, but the events were {published:?}"));
        }
        // A DryRun event says what the status newly reports the binding would roll: never
        // outside DryRun mode, never again for a report already shown, always for a new one.
        let reported = self.status.dry_run.clone();
        let would_roll = reported.as_ref().is_some_and(|r| !r.would_roll.is_empty());
        match (published.contains(&"DryRun"), observed_dry_run == reported) {
            (true, _) if !dry_run(&spec) => self.fail(format_args!("a DryRun event outside DryRun mode")),
            (true, true) => self.fail(format_args!("a DryRun event again for {reported:?}")),
            (false, false) if would_roll => self.fail(format_args!("no DryRun event for {reported:?}")),
            _ => {}
        }
        let recorded = self.status.applied_checksum.is_some();
        let baseline = first_record && recorded && rolled.is_empty();
        if baseline && !published.contains(&"Baselined") {
            self.fail(format_args!("the first record of the content was no baseline event, but {published:?}"));
        }
        if !baseline && published.contains(&"Baselined") {
            self.fail(format_args!("a Baselined event, but the content was recorded before or rolled"));
        }
    }

    /// What the controller's reads find: its watches' paths, the workloads as its caches hold
    /// them, the ConfigMap (as listed before the API server went away, while its cache lists
    /// again), and at its first read, whether Consul's indexes went below the status's.
    pub(super) async fn observe<'a>(
        &mut self,
        spec: &'a ConsulBindingSpec,
        controller: &mut Controller,
    ) -> Option<Observed<'a>> {
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
                        let source = KeySource { key: q.key.to_string(), recurse: q.recurse, optional: true };
                        store.matching(&source).next().is_none().then(|| store.own_index(&source))
                    };
                    Ok(queries.iter().map(index).collect())
                };
                let queries = read::queries(spec, None);
                Some(restore::restored_at_first_read(&previous, read, &queries, alone).await.unwrap())
            }
            _ => None,
        };
        let mut read = read_of(spec, KEY.scoped("ns", ["", "", ""]), states, resolved, bound, objects);
        read.found_restored = found_restored;
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
    pub(super) fn go_ahead_given(&mut self, spec: &ConsulBindingSpec, read: bool) {
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
    pub(super) fn stamp(&mut self, name: &str, value: String) -> Version {
        let lost: Vec<String> =
            self.spec.keys.iter().zip(&self.lost).filter(|(_, l)| **l).map(|(k, _)| k.key.clone()).collect();
        if !lost.is_empty() {
            self.fail(format_args!("rolled {name} with {lost:?} lost and no go-ahead"));
        }
        if dry_run(&self.spec) {
            self.fail(format_args!("rolled {name} in DryRun mode"));
        }
        let name = *self.works.keys().find(|n| **n == name).expect("a simulated workload");
        self.batch.entry(name).or_default().push((self.active, value));
        let work = &self.works[name];
        Version { uid: format!("{name}-{}", work.uid), generation: work.generation + 1 }
    }

    /// Each workload stamped in the round gets one template change, with every binding's stamp
    /// and the held stamps of the same checksum, which the bindings then remember as their own.
    pub(super) fn write_stamps(&mut self, controller: &mut Controller) {
        for (name, stamps) in std::mem::take(&mut self.batch) {
            let stamps = stamps.into_iter().map(|(b, value)| stamp(b, value)).collect();
            let (stamps, carried) = controller.desk.carry(&target(name), stamps);
            let stamps: Vec<(usize, String)> =
                stamps.into_iter().map(|s| (usize::from(s.binding.name() == "b"), s.value)).collect();
            let version = self.write(name, stamps);
            for s in carried {
                self.note(format_args!("  {name} carries the held stamp of {}", s.binding.name()));
                let record = if s.binding.name() == "b" { &mut controller.other.0 } else { &mut controller.record };
                record.stamps.insert((WorkloadKind::Deployment, name.to_owned()), (version.clone(), s.value));
            }
        }
    }

    pub(super) fn write(&mut self, name: &str, stamps: Vec<(usize, String)>) -> Version {
        let content = self.content(name);
        let work = &self.works[name];
        let (undone, undo_alone) = (work.undone, work.undone && work.stamped_with == content);
        let unchanged = work.runs == content;
        if undo_alone && !work.undid_unrecorded {
            self.fail(format_args!("rolled {name} for a rollout undo alone"));
        }
        if !undone && unchanged {
            self.fail(format_args!("rolled {name} without a change of its content"));
        }
        // Written before the status of its reconcile, which a handover may refuse.
        let recorded = !self.cut_short();
        let work = self.works.get_mut(name).expect("a simulated workload");
        for (binding, value) in stamps {
            work.live[binding] = Some(Live { value, owned: true, at: None });
        }
        work.generation += 1;
        work.stamps.push(work.live.clone().map(|l| l.map(|l| l.value)));
        work.runs = content.clone();
        work.stamped_with = content;
        work.undone = false;
        work.undid_unrecorded = false;
        work.recorded = recorded;
        Version { uid: format!("{name}-{}", work.uid), generation: work.generation }
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
    /// The events this reconcile published, by kind.
    published: Vec<&'static str>,
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
        let mut outcome = Outcome::default();
        for w in &plan.roll {
            if let Err(refused) = self.sim.admit(true).await {
                outcome.failed.push((w.clone(), refused.to_string()));
                continue;
            }
            let version = self.sim.stamp(&w.1, plan.values[w].clone());
            self.controller.record.stamps.insert(w.clone(), (version, plan.values[w].clone()));
            outcome.rolled.push(w.clone());
        }
        self.rolled = outcome.rolled.clone();
        outcome
    }

    fn due(&mut self, at: Option<Instant>) {
        self.controller.wake_at = at;
    }

    fn publish(&mut self, event: Event, _: &Read, _: &ConsulBindingStatus, _: &Outcome) {
        if self.sim.gate_open().is_ok() {
            self.published.push(event.kind());
        }
    }

    async fn status(&mut self, _: &ConsulBindingStatus, status: &ConsulBindingStatus) -> Result<(), crate::Error> {
        self.sim.admit(false).await?;
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
    BindingRef::new("ns", ["a", "b"][active])
}

fn target(name: &str) -> (String, Workload) {
    ("ns".into(), (WorkloadKind::Deployment, name.to_owned()))
}

fn stamp(active: usize, value: String) -> Stamp {
    let name = ["a", "b"][active];
    Stamp { binding: binding(active), annotation: format!("a/{name}"), value, manager: format!("m-{name}") }
}
