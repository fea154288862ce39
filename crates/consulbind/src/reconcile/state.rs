//! What this replica remembers of each binding between reconciles, in one record under one map,
//! so that a deleted binding leaves nothing behind: its pending debounce, its restore grace, the
//! stamps the workload cache has not seen yet, what it last wrote, and its backoffs.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use consulbind_api::{ConsulBinding, ConsulBindingStatus, WorkloadKind};
use kube::ResourceExt;
use tokio::time::Instant;

use super::{debounce::Pending, packed::Packed, restore::Restore, status::fingerprints};
use crate::{
    BindingRef, Lock, binding_ref,
    cluster::{Version, Workload},
    metrics::{Metrics, ReadyLabels, RolloutLabels},
};

#[derive(Debug, Default)]
pub struct Record {
    /// A change seen but not yet rolled out. Boxed, as are the backoffs: most records have
    /// neither, and there is a record per binding.
    pub pending: Option<Box<Pending>>,
    pub restore: Restore,
    /// What this binding stamped on each workload, and the object and generation that came of
    /// it, for as long as the workload cache has not caught up.
    pub stamps: BTreeMap<Workload, (Version, String)>,
    pub written: Written,
    /// A status whose write failed after its stamps landed, the only record of them (rollout
    /// times, the budget spent, a wave's progress): the next reconcile plans on it, and
    /// stamps nothing until a status is written.
    pub owed: Option<Box<ConsulBindingStatus>>,
    backoffs: Option<Box<Backoffs>>,
    /// A hash of the generation and annotations last let through to a reconcile.
    seen: Option<u64>,
    /// The status the binding cache last showed, with a hash of the binding's uid. The cache
    /// keeps no status: a status is most of a binding's size, and packed it takes a fraction.
    cached: Option<(u64, Packed)>,
}

impl Record {
    /// Drops the copy of a write once the cache shows it, so that the copies do not add up to
    /// a second store of every status. Times reach the cache with whole seconds, and the JSON
    /// of both has them so.
    fn settle(&mut self) {
        if let (Some(written), Some((uid, packed))) = (self.written.status.as_deref(), &self.cached)
            && hashed(&written.0) == *uid
            && serde_json::to_vec(&written.1).is_ok_and(|w| w == packed.json())
        {
            self.written.status = None;
        }
    }
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
    /// A hash of the applied checksum when the targets last carried the content, with the
    /// [`fingerprints`] of its sources.
    pub settled: Option<Settled>,
}

/// A hash of an applied checksum, then the [`fingerprints`] of its sources: one allocation of
/// about 40 bytes, where the checksum and a list took two, about 160 bytes with their room.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled(Box<[u64]>);

impl Settled {
    pub fn new(applied: &str, fingerprints: &[u64]) -> Self {
        Self(std::iter::once(hashed(applied)).chain(fingerprints.iter().copied()).collect())
    }

    /// The fingerprints, if `applied` is the checksum they were recorded with.
    pub fn fingerprints_of(&self, applied: Option<&str>) -> Option<&[u64]> {
        let (checksum, fingerprints) = self.0.split_first()?;
        (applied.map(hashed) == Some(*checksum)).then_some(fingerprints)
    }
}

/// Reads that failed or were refused, and until when.
#[derive(Debug, Default)]
pub struct Backoffs {
    /// Since when reading its ConfigMaps and Secrets has failed, until a read succeeds.
    pub objects_failing_since: Option<Instant>,
    /// Refused as too large: it watches nothing until the refusal ends or the spec changes.
    refused: Option<Box<Refusal>>,
}

/// A refusal as too large, with what the status says, so that a reconcile cut short before its
/// status write does not leave the next one with nothing to show.
#[derive(Debug)]
struct Refusal {
    generation: Option<i64>,
    until: Instant,
    message: String,
}

/// How long a binding whose keys hold more than it may bind watches nothing before it reads
/// them again, unless its spec changes.
const REFUSED_FOR: Duration = Duration::from_secs(300);

impl Backoffs {
    /// Why the binding is refused as too large, if it still is at `generation`: a spec change
    /// reads it again at once.
    pub fn refusal(&self, generation: Option<i64>, now: Instant) -> Option<&str> {
        let refused = self.refused.as_deref().filter(|r| r.generation == generation && now < r.until)?;
        Some(&refused.message)
    }

    /// Refuses the binding as too large at `generation` for a while, jittered so that many
    /// bindings refused at once are not read again at once.
    pub fn refuse(&mut self, generation: Option<i64>, now: Instant, message: String) {
        let until = now + consul_kv::jitter(REFUSED_FOR, 0.2);
        self.refused = Some(Box::new(Refusal { generation, until, message }));
    }
}

impl Record {
    /// The backoffs, made empty if there were none.
    pub fn backoffs(&mut self) -> &mut Backoffs {
        self.backoffs.get_or_insert_default()
    }

    /// Why the binding is refused as too large, if it still is at `generation`.
    pub fn refusal(&self, generation: Option<i64>, now: Instant) -> Option<&str> {
        self.backoffs.as_ref()?.refusal(generation, now)
    }

    /// Reading its ConfigMaps and Secrets succeeded.
    pub fn objects_read(&mut self) {
        if let Some(backoffs) = &mut self.backoffs {
            backoffs.objects_failing_since = None;
        }
    }

    /// `status` was written after a plan for `desired`, by a reconcile that started at
    /// `started`. `shown`: it showed what the first read found (Consul and the objects were read).
    pub fn wrote(&mut self, shown: bool, desired: Option<&str>, status: &ConsulBindingStatus, started: Instant) {
        let settled = status.applied_checksum.as_ref().filter(|a| desired == Some(a.as_str()));
        self.restore.written(shown, settled.is_some(), started);
        if let Some(applied) = settled {
            self.written.settled = Some(Settled::new(applied, &fingerprints(status)));
        }
    }
}

/// Every binding's record, across the scopes this replica serves. Boxed: a table has room for up
/// to twice the records it holds.
pub struct States {
    records: Mutex<HashMap<BindingRef, Box<Record>>>,
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

    /// Whether the binding's generation or annotations (the one the binding cache keeps) are new
    /// since the last version seen: only such a version reaches a reconcile from the watch.
    pub fn spec_changed(&self, binding: &impl kube::Resource) -> bool {
        let meta = binding.meta();
        let hash = hashed((meta.generation, &meta.annotations));
        self.update(&binding_ref(binding), |record| record.seen.replace(hash) != Some(hash))
    }

    /// The binding's name as its record holds it, so that the maps that name the binding share
    /// one copy.
    pub fn name(&self, binding: &ConsulBinding) -> BindingRef {
        let name = binding_ref(binding);
        self.records.locked().get_key_value(&name).map_or(name, |(held, _)| held.clone())
    }

    /// The binding watch has a new version of `binding`: its status moves into the record, and
    /// the copy of a write goes once it shows it.
    pub fn cache(&self, binding: &mut ConsulBinding) {
        let json = binding.status.take().and_then(|status| serde_json::to_vec(&status).ok());
        let packed = Packed::new(&json.unwrap_or_default());
        let uid = hashed(binding.uid().unwrap_or_default());
        let name = binding_ref(binding);
        let mut records = self.records.locked();
        let record = records.entry(name.clone()).or_default();
        // A binding made again under the name, its deletion unseen (a watch that listed again):
        // nothing the record holds is the new one's, and its first version is news.
        let gone =
            record.cached.as_ref().is_some_and(|(cached, _)| *cached != uid).then(|| std::mem::take(&mut **record));
        record.cached = Some((uid, packed));
        record.settle();
        drop(records);
        if let Some(gone) = gone {
            self.forget(&name, Some(Box::new(gone)));
        }
    }

    /// This replica wrote `status` for the binding whose uid is `uid`. The watch event of the
    /// write may have come already: then the copy goes at once.
    pub fn wrote_status(&self, binding: &BindingRef, uid: String, status: &ConsulBindingStatus) {
        self.update(binding, |record| {
            record.written.status = Some(Box::new((uid, status.clone())));
            record.settle();
        });
    }

    /// The status last written for `binding`: this replica's copy of its last write, or else
    /// what the binding cache showed last, for this object (not another of the same name).
    pub fn last_status(&self, binding: &ConsulBinding) -> ConsulBindingStatus {
        let uid = binding.uid().unwrap_or_default();
        let json = {
            let records = self.records.locked();
            let Some(record) = records.get(&binding_ref(binding)) else { return ConsulBindingStatus::default() };
            match (record.written.status.as_deref(), &record.cached) {
                (Some((written_uid, status)), _) if *written_uid == uid => return status.clone(),
                (_, Some((cached_uid, packed))) if *cached_uid == hashed(uid) => packed.json(),
                _ => return ConsulBindingStatus::default(),
            }
        };
        match json.is_empty() {
            true => ConsulBindingStatus::default(),
            false => serde_json::from_slice(&json).unwrap_or_default(),
        }
    }

    /// The binding is gone: its whole record goes, and its metric series.
    pub fn delete(&self, binding: &BindingRef) {
        let removed = self.records.locked().remove(binding);
        self.forget(binding, removed);
    }

    /// Drops the record of every binding for which `keep` is false, after a re-list.
    pub fn reset(&self, keep: impl Fn(&BindingRef) -> bool) {
        let gone: Vec<(BindingRef, Box<Record>)> = {
            let mut records = self.records.locked();
            let gone: Vec<BindingRef> = records.keys().filter(|b| !keep(b)).cloned().collect();
            gone.into_iter().filter_map(|b| records.remove(&b).map(|r| (b, r))).collect()
        };
        for (binding, record) in gone {
            self.forget(&binding, Some(record));
        }
    }

    fn forget(&self, binding: &BindingRef, record: Option<Box<Record>>) {
        if let Some(state) = record.and_then(|r| r.written.ready) {
            self.gauge(state).dec();
        }
        let namespace = binding.namespace().to_owned();
        for kind in WorkloadKind::ALL {
            let labels =
                RolloutLabels { namespace: namespace.clone(), binding: binding.name().to_owned(), kind: kind.as_str() };
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

/// A hash that stays the same across runs, for what a record compares but need not keep.
fn hashed(value: impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(value)
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

    #[test]
    fn a_refusal_holds_for_its_generation_until_it_ends_and_keeps_its_message() {
        let now = Instant::now();
        let mut backoffs = Backoffs::default();
        assert_eq!(backoffs.refusal(Some(1), now), None);
        backoffs.refuse(Some(1), now, "too large".into());
        let until = backoffs.refused.as_ref().expect("refused").until;
        // Four to six minutes, jittered.
        assert!(until >= now + Duration::from_secs(240) && until <= now + Duration::from_secs(360));
        let before = until - Duration::from_millis(1);
        assert_eq!(backoffs.refusal(Some(1), before), Some("too large"), "what the status says, until the end");
        assert_eq!(backoffs.refusal(Some(1), until), None, "ended");
        assert_eq!(backoffs.refusal(Some(2), now), None, "a spec change reads it again");
    }

    fn binding(name: &str, uid: &str, status: Option<ConsulBindingStatus>) -> ConsulBinding {
        let mut binding = ConsulBinding::new(name, ConsulBindingSpec::default());
        binding.metadata.namespace = Some("ns".into());
        binding.metadata.uid = Some(uid.into());
        binding.status = status.map(Box::new);
        binding
    }

    #[test]
    fn a_deleted_binding_leaves_nothing_behind() {
        let states = states();
        let (a, b) = (BindingRef::new("ns", "a"), BindingRef::new("ns", "b"));
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
    fn only_a_new_generation_or_annotation_reaches_a_reconcile() {
        let states = states();
        let mut a = binding("a", "uid-1", None);
        a.metadata.generation = Some(1);
        assert!(states.spec_changed(&a), "the first sight");
        a.status = Some(Box::new(status("sum")));
        assert!(!states.spec_changed(&a), "a status write");
        a.metadata.generation = Some(2);
        assert!(states.spec_changed(&a));
        a.metadata.annotations = Some([(consulbind_api::ROLL_OUTSIDE_WINDOW.into(), "sum".into())].into());
        assert!(states.spec_changed(&a));
        assert!(!states.spec_changed(&a));
        states.delete(&binding_ref(&a));
        assert!(states.spec_changed(&a), "made again after a deletion");
        // Made again while the watch was away: its deletion unseen, another uid is news, and the
        // record of the one before goes.
        let name = binding_ref(&a);
        states.cache(&mut a.clone());
        states.update(&name, |r| r.backoffs().refuse(Some(2), Instant::now(), "too large".into()));
        let mut again = a.clone();
        again.metadata.uid = Some("uid-2".into());
        states.cache(&mut again);
        assert!(states.spec_changed(&again), "made again unseen");
        assert!(states.update(&name, |r| r.refusal(Some(2), Instant::now()).is_none()), "the old record went");
    }

    #[test]
    fn the_ready_gauges_count_each_binding_once() {
        let states = states();
        let a = BindingRef::new("ns", "a");
        states.set_ready(&a, "False");
        states.set_ready(&a, "False");
        states.set_ready(&a, "True");
        assert_eq!((gauge(&states, "True"), gauge(&states, "False")), (1, 0));
    }

    fn status(sum: &str) -> ConsulBindingStatus {
        ConsulBindingStatus { applied_checksum: Some(sum.into()), ..Default::default() }
    }

    #[test]
    fn the_written_copy_goes_once_the_cache_has_it_or_another_object_has_the_name() {
        let states = states();
        let a = BindingRef::new("ns", "a");
        let kept = |states: &States| states.update(&a, |r| r.written.status.is_some());
        states.wrote_status(&a, "uid-1".into(), &status("sum"));
        assert!(kept(&states));

        states.cache(&mut binding("a", "uid-1", None));
        assert!(kept(&states), "the cache has not seen the write");
        states.cache(&mut binding("a", "uid-1", Some(status("sum"))));
        assert!(!kept(&states));
        states.wrote_status(&a, "uid-1".into(), &status("sum"));
        assert!(!kept(&states), "a write whose watch event came first");

        states.wrote_status(&a, "uid-1".into(), &status("new"));
        states.cache(&mut binding("a", "uid-2", None));
        assert!(!kept(&states), "the record is the new object's");
    }

    #[test]
    fn the_last_status_is_never_older_than_the_last_write() {
        let states = states();
        let a = BindingRef::new("ns", "a");
        let mut held = binding("a", "uid-1", Some(status("old")));
        states.cache(&mut held);
        assert_eq!(held.status, None, "the cache keeps no status");
        let last = |held: &ConsulBinding| states.last_status(held).applied_checksum;
        assert_eq!(last(&held).as_deref(), Some("old"));

        states.wrote_status(&a, "uid-1".into(), &status("new"));
        assert_eq!(last(&held).as_deref(), Some("new"), "the copy of the write");
        // A relist may bring the status from before the write.
        states.cache(&mut binding("a", "uid-1", Some(status("old"))));
        assert_eq!(last(&held).as_deref(), Some("new"));
        states.cache(&mut binding("a", "uid-1", Some(status("new"))));
        assert!(!states.update(&a, |r| r.written.status.is_some()));
        assert_eq!(last(&held).as_deref(), Some("new"), "from the cache");
        // Another object of the same name says nothing of this one.
        states.cache(&mut binding("a", "uid-2", Some(status("other"))));
        assert_eq!(last(&held), None);
        assert_eq!(last(&binding("a", "uid-2", None)).as_deref(), Some("other"));
    }

    /// The maps that name a binding share the name its record holds, rather than each holding
    /// a copy; the backoffs take room only once a read fails.
    #[test]
    fn a_record_shares_its_name_and_holds_backoffs_only_when_used() {
        let states = states();
        let mut a = binding("a", "uid-1", None);
        states.cache(&mut a);
        let held = states.records.locked().keys().next().cloned().unwrap();
        assert!(states.name(&a).shares(&held));
        assert!(!BindingRef::new("ns", "a").shares(&held));
        assert!(!states.name(&binding("b", "uid-2", None)).shares(&held), "no record: a name of its own");

        let name = states.name(&a);
        states.update(&name, |r| r.objects_read());
        assert!(states.update(&name, |r| r.backoffs.is_none()), "a success allocates nothing");
        let now = Instant::now();
        states.update(&name, |r| r.backoffs().refuse(Some(1), now, "too large".into()));
        assert!(states.update(&name, |r| r.refusal(Some(1), now).is_some()));
        assert!(states.update(&name, |r| r.refusal(Some(2), now).is_none()), "a spec change reads again");
    }

    /// A status whose applied checksum is the one planned settles the record: the restore grace
    /// of a reset before that reconcile ends, and what the targets carry is kept to name what
    /// the next rollout brings. One that is not leaves both as they were.
    #[test]
    fn a_status_that_carries_the_planned_checksum_settles_the_record() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let grace = Duration::from_secs(30);
        let status =
            |applied: &str| ConsulBindingStatus { applied_checksum: Some(applied.into()), ..Default::default() };
        let mut record = Record::default();
        assert_eq!(record.restore.grace(false, None, Some(at(1)), at(2), grace).0, Some(grace));
        record.wrote(false, Some("v2"), &status("v1"), at(3));
        assert!(record.written.settled.is_none(), "the targets do not carry the planned content yet");
        assert_eq!(record.restore.grace(false, None, Some(at(1)), at(4), grace).0, Some(grace));
        let key = consulbind_api::KeyStatus { key: "app/a".into(), checksum: "k".into(), ..Default::default() };
        let carried = ConsulBindingStatus { keys: vec![key], ..status("v2") };
        record.wrote(false, Some("v2"), &carried, at(5));
        let settled = record.written.settled.as_ref().expect("settled");
        let expected = fingerprints(&carried);
        assert_eq!(settled.fingerprints_of(Some("v2")), Some(&expected[..]), "recorded for v2");
        assert_eq!(expected.len(), 1, "one source");
        assert_eq!(settled.fingerprints_of(Some("v1")), None);
        assert_eq!(settled.fingerprints_of(None), None);
        assert_eq!(record.restore.grace(false, None, Some(at(1)), at(6), grace).0, None);
    }

    /// The copy of a write for an object deleted since is not the status of the one made again
    /// under its name.
    #[test]
    fn a_write_for_an_object_deleted_since_is_not_the_new_ones_status() {
        let states = states();
        states.wrote_status(&BindingRef::new("ns", "a"), "uid-1".into(), &status("old object"));
        let mut again = binding("a", "uid-2", Some(status("new object")));
        states.cache(&mut again);
        assert_eq!(states.last_status(&again).applied_checksum.as_deref(), Some("new object"));
        assert_eq!(states.last_status(&binding("a", "uid-3", None)), ConsulBindingStatus::default());
    }
}
