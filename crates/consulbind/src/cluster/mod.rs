//! Read-only caches of what the cluster holds, each fed by a watch: the target workloads
//! ([`workloads`], with Argo Rollouts in [`argo`]), the Secrets that hold Consul tokens
//! ([`tokens`]), the ConfigMaps and Secrets that bindings read ([`objects`]), the namespaces'
//! default-token policy ([`policy`]), which bindings an event concerns ([`interest`]), and the
//! selectors the API server would take ([`selector`]). Nothing here writes to the cluster.

pub mod argo;
pub mod client;
pub mod cronjob;
pub mod health;
pub mod interest;
pub mod objects;
pub mod pairs;
pub mod policy;
pub mod references;
pub mod selector;
pub mod tokens;
pub mod workloads;

use consulbind_api::WorkloadKind;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

/// A workload found for one of a binding's targets.
pub type Workload = (WorkloadKind, String);

/// Which object a workload is, and how far its spec has come: one deleted and made again under
/// its name has another uid, and starts again at generation 1.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Version {
    pub uid: String,
    pub generation: i64,
}

impl Version {
    pub fn of<K: kube::Resource>(obj: &K) -> Self {
        let meta = obj.meta();
        Self::from_parts(meta.uid.as_deref(), meta.generation, meta.resource_version.as_deref())
    }

    fn from_parts(uid: Option<&str>, generation: Option<i64>, resource_version: Option<&str>) -> Self {
        // Before 1.21 a CronJob has no generation; its resource version (etcd's revision, which
        // only grows) tells as well whether the cache has caught up with a stamp.
        let revision = || resource_version?.parse().ok();
        Self { uid: uid.unwrap_or_default().to_owned(), generation: generation.or_else(revision).unwrap_or_default() }
    }
}

/// What a write's answer says of the object's [`Version`]. Read into this alone, the rest of
/// the answer (the whole spec and its managed fields) is skipped rather than built.
#[derive(serde::Deserialize)]
pub struct Written {
    metadata: WrittenMeta,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    uid: Option<String>,
    generation: Option<i64>,
    resource_version: Option<String>,
}

impl From<Written> for Version {
    fn from(Written { metadata: m }: Written) -> Self {
        Self::from_parts(m.uid.as_deref(), m.generation, m.resource_version.as_deref())
    }
}

/// A binding's annotation as a workload carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    pub value: String,
    /// The binding's own field manager set it. Otherwise someone else did: a rollout undo, a
    /// hand edit, a copy of the manifest.
    pub owned: bool,
    /// When the binding's field manager last changed the workload, to the second, if owned.
    pub at: Option<Timestamp>,
}

impl Live {
    /// The checksum in the value, without the `~n` counter of a forced stamp.
    pub fn checksum(&self) -> &str {
        self.value.split_once('~').map_or(&self.value, |(c, _)| c)
    }
}

/// Drops what no cache reads: annotations (with kubectl's last-applied copy), managed fields,
/// owner references and finalizers.
pub fn strip<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.annotations = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

/// How many of this process's caches are part-way through a list.
static LISTING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Some cache is part-way through a list: until its last page its store holds what it listed
/// before, and the others may already hold what is there now. A decision made on that mix can
/// roll a workload for a change its pods already read.
pub fn listing() -> bool {
    LISTING.load(std::sync::atomic::Ordering::Relaxed) > 0
}

/// Told when the last list under way ends.
static LISTED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Waits until no cache is part-way through a list.
pub async fn listed() {
    loop {
        // Registered before the check, so that a list ending in between still wakes it.
        let mut ended = std::pin::pin!(LISTED.notified());
        ended.as_mut().enable();
        if !listing() {
            return;
        }
        ended.await;
    }
}

/// One watch's part in [`listing`]: from the start of a list to its last page, or to an error,
/// which leaves the store as it was (a list that keeps failing must not hold every binding).
#[derive(Default)]
pub struct Listing {
    on: bool,
}

impl Listing {
    pub fn event<K, E>(&mut self, event: &Result<kube::runtime::watcher::Event<K>, E>) {
        self.set(self.after(event));
    }

    /// Whether a list is under way after `event`; [`set`](Self::set) it once the store holds
    /// the event.
    pub fn after<K, E>(&self, event: &Result<kube::runtime::watcher::Event<K>, E>) -> bool {
        use kube::runtime::watcher::Event;
        match event {
            Ok(Event::Init) => true,
            Ok(Event::InitApply(_)) => self.on,
            _ => false,
        }
    }

    pub fn set(&mut self, on: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if on != self.on {
            match on {
                true => {
                    LISTING.fetch_add(1, Relaxed);
                }
                false => {
                    if LISTING.fetch_sub(1, Relaxed) == 1 {
                        LISTED.notify_waiters();
                    }
                }
            }
            self.on = on;
        }
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Which objects of a watched cache are news to the bindings, by resource version. A re-list
/// (after the watch was down) reports what changed, appeared or went meanwhile, and only at its
/// end, once the reflector's store holds what it listed: a binding woken earlier would read the
/// store from before, and nothing would wake it again.
pub struct Relist<Id> {
    versions: std::collections::HashMap<Id, String>,
    /// What the re-list under way has shown so far.
    fresh: Option<std::collections::HashMap<Id, String>>,
}

impl<Id> Default for Relist<Id> {
    fn default() -> Self {
        Self { versions: Default::default(), fresh: None }
    }
}

impl<Id: Clone + Eq + std::hash::Hash> Relist<Id> {
    /// The resource version of `id` as last listed or watched.
    pub fn version(&self, id: &Id) -> Option<&str> {
        self.versions.get(id).map(String::as_str)
    }

    /// The objects a watcher event makes news of, with `id` naming each.
    pub fn event<K: Resource>(&mut self, event: &kube::runtime::watcher::Event<K>, id: impl Fn(&K) -> Id) -> Vec<Id> {
        use kube::runtime::watcher::Event;
        let version = |obj: &K| obj.meta().resource_version.clone().unwrap_or_default();
        match event {
            Event::Init => {
                self.fresh = Some(Default::default());
                Vec::new()
            }
            Event::InitApply(obj) => {
                self.fresh.get_or_insert_default().insert(id(obj), version(obj));
                Vec::new()
            }
            Event::InitDone => {
                let fresh = self.fresh.take().unwrap_or_default();
                let mut news: Vec<Id> =
                    fresh.iter().filter(|(o, v)| self.versions.get(*o) != Some(*v)).map(|(o, _)| o.clone()).collect();
                news.extend(self.versions.keys().filter(|o| !fresh.contains_key(*o)).cloned());
                self.versions = fresh;
                news
            }
            Event::Apply(obj) => {
                let (object, version) = (id(obj), version(obj));
                match self.versions.get(&object) == Some(&version) {
                    true => Vec::new(),
                    false => {
                        self.versions.insert(object.clone(), version);
                        vec![object]
                    }
                }
            }
            Event::Delete(obj) => {
                let object = id(obj);
                self.versions.remove(&object);
                vec![object]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::watcher::Event;

    use super::*;

    fn secret(name: &str, version: &str) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.into());
        secret.metadata.resource_version = Some(version.into());
        secret
    }

    #[test]
    fn a_relist_reports_what_changed_appeared_or_went_once_it_is_complete() {
        let mut relist = Relist::default();
        let mut feed = |event: Event<Secret>| {
            let mut news = relist.event(&event, |s| s.metadata.name.clone().unwrap_or_default());
            news.sort();
            news
        };
        assert!(feed(Event::Init).is_empty());
        assert!(feed(Event::InitApply(secret("a", "1"))).is_empty(), "news before the store has it");
        assert!(feed(Event::InitApply(secret("b", "1"))).is_empty());
        assert_eq!(feed(Event::InitDone), ["a", "b"]);
        assert!(feed(Event::Apply(secret("a", "1"))).is_empty(), "the same version again is no news");
        assert_eq!(feed(Event::Apply(secret("a", "2"))), ["a"]);
        // Watch down: b went, c came, a is as it was.
        assert!(feed(Event::Init).is_empty());
        assert!(feed(Event::InitApply(secret("a", "2"))).is_empty());
        assert!(feed(Event::InitApply(secret("c", "1"))).is_empty());
        assert_eq!(feed(Event::InitDone), ["b", "c"]);
        assert_eq!(feed(Event::Delete(secret("c", "1"))), ["c"]);
    }

    /// The only test that touches the process-wide count: no live watch runs in unit tests.
    #[tokio::test]
    async fn a_cache_lists_from_its_start_to_its_last_page_or_an_error() {
        let (mut a, mut b) = (Listing::default(), Listing::default());
        let event = |e: Event<Secret>| Ok::<_, ()>(e);
        assert!(!listing());
        a.event(&event(Event::Init));
        b.event(&event(Event::Init));
        let mut done = std::pin::pin!(listed());
        a.event(&event(Event::InitApply(secret("a", "1"))));
        assert!(listing(), "part-way through its first page");
        assert!(futures::poll!(done.as_mut()).is_pending());
        a.event(&event(Event::InitDone));
        assert!(listing(), "the other has not listed yet");
        assert!(futures::poll!(done.as_mut()).is_pending());
        b.event(&Err::<Event<Secret>, ()>(()));
        assert!(!listing(), "a list that failed leaves the store as it was");
        assert!(futures::poll!(done.as_mut()).is_ready(), "told when the last list ends");
        b.event(&event(Event::Init));
        a.event(&event(Event::Apply(secret("a", "2"))));
        assert!(listing());
        drop(b);
        assert!(!listing(), "a watch that ends lists no more");
    }

    #[test]
    fn a_write_answer_gives_its_version_from_the_metadata_alone() {
        let answer = |metadata: serde_json::Value| {
            let body = serde_json::json!({"kind": "Deployment", "metadata": metadata, "spec": {"replicas": 2}});
            Version::from(serde_json::from_value::<Written>(body).unwrap())
        };
        let deployment = answer(serde_json::json!({"uid": "u-1", "generation": 7, "resourceVersion": "912"}));
        assert_eq!(deployment, Version { uid: "u-1".into(), generation: 7 });
        let old_cronjob = answer(serde_json::json!({"uid": "u-2", "resourceVersion": "912"}));
        assert_eq!(old_cronjob, Version { uid: "u-2".into(), generation: 912 }, "no generation before 1.21");
    }
}
