//! What happens to the world in a schedule: time passing, Consul's writes, wipes, restores and
//! outages, restarts, spec edits, and the workloads, the ConfigMap, the token's policy and the
//! API server changing.

use super::*;

impl Sim {
    /// A person changed which objects the workload's template references: its pods start
    /// again and read the objects as they are. What they read from Consul counts as what
    /// they carried before: only a change of references alone is recorded as carried
    /// (a rebase), so a change of Consul data held meanwhile still rolls it.
    pub(super) fn template_changed(&mut self, name: &str) {
        let objects = self.content(name).1;
        let work = self.works.get_mut(name).expect("a simulated workload");
        work.generation += 1;
        work.runs.1 = objects;
    }

    /// Lets `time` pass, reconciling when the binding asked to be.
    pub(super) async fn pass(&mut self, time: Duration) {
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
    pub(super) fn replaced(&mut self, store: Store) {
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
    pub(super) fn forget_undetectable(&mut self, previous: &ConsulBindingStatus) {
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
    pub(super) fn edited(&mut self) {
        for (i, source) in self.spec.keys.iter().enumerate() {
            if self.store.matching(source).next().is_some() {
                self.lost[i] = false;
            }
        }
    }

    /// A step in Consul, the controller or the spec, or `None` for time to pass.
    pub(super) fn consul_event(&mut self, roll: u32, key: &'static str, value: &'static str) -> Option<String> {
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
                self.killed();
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
            62..64 => Some({
                self.spec.suspend = !self.spec.suspend;
                self.generation += 1;
                self.mirror();
                format!("suspend: {}", self.spec.suspend)
            }),
            64..66 => Some({
                let mode = match dry_run(&self.spec) {
                    true => RolloutMode::Rollout,
                    false => RolloutMode::DryRun,
                };
                self.spec.rollout.get_or_insert_with(Default::default).mode = Some(mode);
                self.generation += 1;
                self.mirror();
                format!("mode: {mode:?}")
            }),
            _ => None,
        }
    }

    /// A step in the workloads, the ConfigMap, the token's policy or the API server, or `None`
    /// for time to pass.
    pub(super) fn cluster_event(&mut self, roll: u32, value: &'static str, name: &'static str) -> Option<String> {
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
                work.live = values.map(|v| Some(Live { value: v?, owned: false, at: None }));
                work.generation += 1;
                work.runs = content;
                work.undone = true;
                work.undid_unrecorded = !work.recorded;
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
            // The owner lets the namespace go, at one of its next writes.
            96..100 if self.controller.is_some() => {
                let cut = if self.rng.bool() { handover::Cut::Drain } else { handover::Cut::Freeze };
                let after = self.rng.usize(..3);
                self.arm(cut, after)
            }
            _ => None,
        }
    }

    pub(super) async fn step(&mut self) {
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
