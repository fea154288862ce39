//! What this replica remembers of each binding between reconciles, in one record under one map,
//! so that a deleted binding leaves nothing behind: its pending debounce, its restore grace, the
//! stamps the workload cache has not seen yet, what it last wrote, and its backoffs.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use consulbind_api::{ConsulBinding, ConsulBindingStatus, WorkloadKind};
use kube::ResourceExt;
use tokio::time::Instant;

use super::{debounce::Pending, restore::Restore, status::fingerprints};
use crate::{
    BindingRef, Lock, binding_ref,
    cluster::{Version, Workload},
    metrics::{Metrics, ReadyLabels, RolloutLabels},
};

#[derive(Debug, Default)]
pub struct Record {
    /// A change seen but not yet rolled out.
    pub pending: Option<Pending>,
    pub restore: Restore,
    /// What this binding stamped on each workload, and the object and generation that came of
    /// it, for as long as the workload cache has not caught up.
    pub stamps: BTreeMap<Workload, (Version, String)>,
    pub written: Written,
    pub backoffs: Backoffs,
}

/// What this replica last wrote for the binding.
#[derive(Debug, Default)]
pub struct Written {
    /// The status, with the binding's uid. Only the leader writes status, so it is never older
    /// than the cache, which may not have seen the write yet when a Consul change wakes the
    /// binding again. Boxed: most records have none, and there is a record per binding.
    pub status: Option<Box<(String, ConsulBindingStatus)>>,
    /// The Ready condition's status, as counted in `consulbind_bindings`.
    ready: Option<&'static str>,
    /// The applied checksum when the targets last carried the content, and
    /// [`fingerprints`] of its sources.
    pub settled: Option<(String, Vec<u64>)>,
}

/// Reads that failed or were refused, and until when.
#[derive(Debug, Default)]
pub struct Backoffs {
    /// Since when reading its ConfigMaps and Secrets has failed, until a read succeeds.
    pub objects_failing_since: Option<Instant>,
    /// Refused as too large at this generation: it watches nothing until this time, or a spec
    /// change.
    pub refused: Option<(Option<i64>, Instant)>,
}

impl Record {
    /// `status` was written after a plan for `desired`, by a reconcile that started at
    /// `started`. `shown`: it showed what the first read found (Consul and the objects were read).
    pub fn wrote(&mut self, shown: bool, desired: Option<&str>, status: &ConsulBindingStatus, started: Instant) {
        let settled = status.applied_checksum.as_ref().filter(|a| desired == Some(a.as_str()));
        self.restore.written(shown, settled.is_some(), started);
        if let Some(applied) = settled {
            self.written.settled = Some((applied.clone(), fingerprints(status)));
        }
    }
}

/// Every binding's record, across the scopes this replica serves.
pub struct States {
    records: Mutex<HashMap<BindingRef, Record>>,
    metrics: Arc<Metrics>,
}

impl States {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { records: Mutex::default(), metrics }
    }

    /// Runs `f` on the binding's record, made empty if there was none.
    pub fn update<R>(&self, binding: &BindingRef, f: impl FnOnce(&mut Record) -> R) -> R {
        f(self.records.locked().entry(binding.clone()).or_default())
    }

    /// The binding cache has a new version of the binding: once it shows the status this
    /// replica wrote, the copy goes, so that the copies do not add up to a second store of
    /// every status.
    pub fn apply(&self, binding: &ConsulBinding) {
        let mut records = self.records.locked();
        let Some(record) = records.get_mut(&binding_ref(binding)) else { return };
        if let Some((uid, status)) = record.written.status.as_deref()
            && binding.uid().as_ref() == Some(uid)
            && same_as_stored(binding.status.as_ref(), status)
        {
            record.written.status = None;
        }
    }

    /// The status last written for `binding`: this replica's copy of its last write, or else
    /// the status in the cache. `cached` is read only after the copy was found gone: the copy
    /// goes once the cache has the write, so a `binding` taken from the cache a moment before
    /// may not have it yet.
    pub fn last_status(
        &self,
        binding: &ConsulBinding,
        cached: impl FnOnce() -> Option<Arc<ConsulBinding>>,
    ) -> ConsulBindingStatus {
        // The watch event of a write can come before the copy is kept; it goes here then.
        self.apply(binding);
        let uid = binding.uid().unwrap_or_default();
        let written =
            self.records.locked().get(&binding_ref(binding)).and_then(|r| match r.written.status.as_deref() {
                Some((written_uid, status)) if *written_uid == uid => Some(status.clone()),
                _ => None,
            });
        written.unwrap_or_else(|| {
            let cached = cached().filter(|c| c.uid() == binding.uid());
            cached.as_deref().unwrap_or(binding).status.clone().unwrap_or_default()
        })
    }

    /// The binding is gone: its whole record goes, and its metric series.
    pub fn delete(&self, binding: &BindingRef) {
        let removed = self.records.locked().remove(binding);
        self.forget(binding, removed);
    }

    /// Drops the record of every binding for which `keep` is false, after a re-list.
    pub fn reset(&self, keep: impl Fn(&BindingRef) -> bool) {
        let gone: Vec<(BindingRef, Record)> = {
            let mut records = self.records.locked();
            let gone: Vec<BindingRef> = records.keys().filter(|b| !keep(b)).cloned().collect();
            gone.into_iter().filter_map(|b| records.remove(&b).map(|r| (b, r))).collect()
        };
        for (binding, record) in gone {
            self.forget(&binding, Some(record));
        }
    }

    fn forget(&self, binding: &BindingRef, record: Option<Record>) {
        if let Some(state) = record.and_then(|r| r.written.ready) {
            self.gauge(state).dec();
        }
        let namespace = binding.namespace.clone().unwrap_or_default();
        for kind in WorkloadKind::ALL {
            let labels =
                RolloutLabels { namespace: namespace.clone(), binding: binding.name.clone(), kind: kind.as_str() };
            self.metrics.rollouts.remove(&labels);
        }
    }

    /// Moves the binding between the ready-state gauges; costs the same however many bindings.
    pub fn set_ready(&self, binding: &BindingRef, state: &'static str) {
        let old = self.update(binding, |record| record.written.ready.replace(state));
        if old != Some(state) {
            if let Some(old) = old {
                self.gauge(old).dec();
            }
            self.gauge(state).inc();
        }
    }

    fn gauge(&self, ready: &'static str) -> prometheus_client::metrics::gauge::Gauge {
        self.metrics.bindings.get_or_create(&ReadyLabels { ready }).clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.records.locked().len()
    }
}

/// Whether the cached status is the one written. Times reach the cache with whole seconds, so
/// the two are compared as the API server stores them.
fn same_as_stored(cached: Option<&ConsulBindingStatus>, written: &ConsulBindingStatus) -> bool {
    let stored = |s: &ConsulBindingStatus| serde_json::to_value(s).ok();
    cached.and_then(stored) == stored(written)
}

#[cfg(test)]
mod tests {
    use consulbind_api::ConsulBindingSpec;
    use prometheus_client::registry::Registry;

    use super::*;

    fn states() -> States {
        States::new(Arc::new(Metrics::new(&mut Registry::default())))
    }

    fn gauge(states: &States, ready: &'static str) -> i64 {
        states.gauge(ready).get()
    }

    fn binding(name: &str, uid: &str, status: Option<ConsulBindingStatus>) -> ConsulBinding {
        let mut binding = ConsulBinding::new(name, ConsulBindingSpec::default());
        binding.metadata.namespace = Some("ns".into());
        binding.metadata.uid = Some(uid.into());
        binding.status = status;
        binding
    }

    #[test]
    fn a_deleted_binding_leaves_nothing_behind() {
        let states = states();
        let (a, b) = (BindingRef::new("a").within("ns"), BindingRef::new("b").within("ns"));
        states.set_ready(&a, "True");
        states.set_ready(&b, "False");
        states.update(&a, |r| {
            r.written.status = Some(Box::new(("uid".into(), ConsulBindingStatus::default())));
            r.stamps.insert(
                (WorkloadKind::Deployment, "web".into()),
                (Version { uid: "u".into(), generation: 2 }, "sum".into()),
            );
        });
        assert_eq!((gauge(&states, "True"), gauge(&states, "False")), (1, 1));

        let rolled = RolloutLabels { namespace: "ns".into(), binding: "a".into(), kind: "Deployment" };
        states.metrics.rollouts.get_or_create(&rolled).inc();
        states.delete(&a);
        assert_eq!(states.len(), 1);
        assert_eq!(states.metrics.rollouts.get_or_create(&rolled).get(), 0, "the series of a deleted binding stayed");
        assert_eq!((gauge(&states, "True"), gauge(&states, "False")), (0, 1));
        states.reset(|binding| binding != &b);
        assert_eq!(states.len(), 0);
        assert_eq!(gauge(&states, "False"), 0);
    }

    #[test]
    fn the_ready_gauges_count_each_binding_once() {
        let states = states();
        let a = BindingRef::new("a").within("ns");
        states.set_ready(&a, "False");
        states.set_ready(&a, "False");
        states.set_ready(&a, "True");
        assert_eq!((gauge(&states, "True"), gauge(&states, "False")), (1, 0));
    }

    #[test]
    fn the_written_copy_goes_once_the_cache_has_it_for_the_same_object() {
        let states = states();
        let written = ConsulBindingStatus { applied_checksum: Some("sum".into()), ..Default::default() };
        let a = BindingRef::new("a").within("ns");
        let keep = |states: &States| states.update(&a, |r| r.written.status.is_some());
        states.update(&a, |r| r.written.status = Some(Box::new(("uid-1".into(), written.clone()))));

        states.apply(&binding("a", "uid-1", None));
        assert!(keep(&states), "the cache has not seen the write");
        states.apply(&binding("a", "uid-2", Some(written.clone())));
        assert!(keep(&states), "another object of the same name");
        states.apply(&binding("a", "uid-1", Some(written)));
        assert!(!keep(&states));
    }

    #[test]
    fn the_last_status_is_never_older_than_the_last_write() {
        let states = states();
        let status = |sum: &str| ConsulBindingStatus { applied_checksum: Some(sum.into()), ..Default::default() };
        let a = BindingRef::new("a").within("ns");
        let stale = binding("a", "uid-1", Some(status("old")));
        let fresh = Arc::new(binding("a", "uid-1", Some(status("new"))));
        let last = |held: &ConsulBinding, cached: Option<&Arc<ConsulBinding>>| {
            states.last_status(held, || cached.cloned()).applied_checksum.unwrap()
        };
        assert_eq!(last(&stale, None), "old");

        states.update(&a, |r| r.written.status = Some(Box::new(("uid-1".into(), status("new")))));
        assert_eq!(last(&stale, Some(&fresh)), "new", "the copy of the write");
        // The cache took the write just after the caller read its copy of the binding, and the
        // copy went with it: the cache, read now, has the write.
        states.apply(&fresh);
        assert!(!states.update(&a, |r| r.written.status.is_some()));
        assert_eq!(last(&stale, Some(&fresh)), "new", "a status older than the last write");
        // Another object of the same name in the cache says nothing of this one.
        let other = Arc::new(binding("a", "uid-2", Some(status("other"))));
        assert_eq!(last(&stale, Some(&other)), "old");
    }
}
