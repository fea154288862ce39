//! One kind's cached workloads, by namespace and then name.
//!
//! kube-runtime's store keys each object by an `ObjectRef` (96 bytes and two strings of its
//! own) in one map for the cluster: at 10,000 workloads the keys cost more than what is kept of
//! the workloads. Here a workload is one pointer in its namespace's sorted set, and a selector
//! looks through its namespace alone.

use std::{
    borrow::Borrow,
    collections::{BTreeSet, HashMap},
    sync::{Arc, RwLock},
};

use kube::runtime::watcher;
use tokio::sync::watch;

use super::kept::Kept;
use crate::ReadWrite;

type Shelves = HashMap<Box<str>, BTreeSet<ByName>>;

/// A workload in its namespace's set, found by name.
#[derive(Clone)]
struct ByName(Arc<Kept>);

impl Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        self.0.name()
    }
}

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl Eq for ByName {}

impl PartialOrd for ByName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.name().cmp(other.0.name())
    }
}

fn insert(shelves: &mut Shelves, workload: Kept) {
    let shelf = match shelves.get_mut(workload.namespace()) {
        Some(shelf) => shelf,
        None => shelves.entry(workload.namespace().into()).or_default(),
    };
    shelf.replace(ByName(Arc::new(workload)));
}

fn contains(shelves: &Shelves, namespace: &str, name: &str) -> bool {
    shelves.get(namespace).is_some_and(|shelf| shelf.contains(name))
}

/// The cache stopped before its first list was done.
#[derive(Debug, thiserror::Error)]
#[error("a workload cache stopped before its first list")]
pub struct Stopped;

/// What one kind's cache holds; cheap to clone.
#[derive(Clone)]
pub struct Store {
    shelves: Arc<RwLock<Shelves>>,
    ready: watch::Receiver<bool>,
}

/// Keeps a [`Store`] current with the watch's events.
pub struct Writer {
    shelves: Arc<RwLock<Shelves>>,
    ready: watch::Sender<bool>,
    /// A list under way, swapped in whole once done.
    listing: Option<Shelves>,
}

pub fn store() -> (Store, Writer) {
    let (ready_tx, ready) = watch::channel(false);
    let shelves = Arc::default();
    (Store { shelves: Arc::clone(&shelves), ready }, Writer { shelves, ready: ready_tx, listing: None })
}

impl Store {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Kept>> {
        let shelves = self.shelves.read_locked();
        Some(shelves.get(namespace)?.get(name)?.0.clone())
    }

    /// Those of `namespace` that `wanted` keeps, by name.
    pub fn filtered(&self, namespace: &str, wanted: impl Fn(&Kept) -> bool) -> Vec<Arc<Kept>> {
        let shelves = self.shelves.read_locked();
        let shelf = shelves.get(namespace).into_iter().flatten();
        shelf.filter(|w| wanted(&w.0)).map(|w| w.0.clone()).collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shelves.read_locked().values().map(BTreeSet::len).sum()
    }

    /// Waits for the first list to be done.
    pub async fn wait_until_ready(&self) -> Result<(), Stopped> {
        self.ready.clone().wait_for(|ready| *ready).await.map(drop).map_err(|_| Stopped)
    }
}

impl Writer {
    /// Applies `event`. At the end of a list, returns what the store held that the list did not
    /// show: deleted while the watch was down.
    pub fn apply(&mut self, event: watcher::Event<Kept>) -> Vec<Arc<Kept>> {
        let write = || self.shelves.write_locked();
        match event {
            watcher::Event::Apply(workload) => insert(&mut write(), workload),
            watcher::Event::Delete(workload) => {
                let mut shelves = write();
                if let Some(shelf) = shelves.get_mut(workload.namespace()) {
                    shelf.remove(workload.name());
                    if shelf.is_empty() {
                        shelves.remove(workload.namespace());
                    }
                }
            }
            watcher::Event::Init => self.listing = Some(Shelves::new()),
            watcher::Event::InitApply(workload) => insert(self.listing.get_or_insert_default(), workload),
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let held = std::mem::replace(&mut *write(), listed);
                self.ready.send_replace(true);
                let now = self.shelves.read_locked();
                let gone = held.into_iter().flat_map(|(namespace, shelf)| {
                    let now = &now;
                    shelf.into_iter().filter(move |w| !contains(now, &namespace, w.0.name()))
                });
                return gone.map(|w| w.0).collect();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(namespace: &str, name: &str) -> Kept {
        Kept::new(name, namespace, Default::default(), Default::default(), Default::default())
    }

    fn names(workloads: &[Arc<Kept>]) -> Vec<&str> {
        workloads.iter().map(|w| w.name()).collect()
    }

    #[tokio::test]
    async fn a_list_is_swapped_in_whole_and_tells_what_it_no_longer_shows() {
        let (store, mut writer) = store();
        writer.apply(watcher::Event::Init);
        for (namespace, name) in [("a", "web"), ("a", "api"), ("b", "web")] {
            writer.apply(watcher::Event::InitApply(workload(namespace, name)));
        }
        assert!(store.get("a", "web").is_none(), "not before the list is done");
        assert!(writer.apply(watcher::Event::InitDone).is_empty());
        store.wait_until_ready().await.unwrap();
        assert_eq!(store.get("a", "web").map(|w| w.namespace().to_owned()).as_deref(), Some("a"));
        assert_eq!(names(&store.filtered("a", |_| true)), ["api", "web"], "by name");
        assert_eq!(names(&store.filtered("b", |_| true)), ["web"], "its namespace alone");

        writer.apply(watcher::Event::Apply(workload("c", "db")));
        writer.apply(watcher::Event::Delete(workload("a", "api")));
        assert_eq!(store.len(), 3);
        // Relisted while b/web and c/db were deleted unseen.
        writer.apply(watcher::Event::Init);
        writer.apply(watcher::Event::InitApply(workload("a", "web")));
        let mut gone: Vec<String> =
            writer.apply(watcher::Event::InitDone).iter().map(|w| format!("{}/{}", w.namespace(), w.name())).collect();
        gone.sort();
        assert_eq!(gone, ["b/web", "c/db"]);
        assert_eq!(store.len(), 1);
        assert!(store.filtered("b", |_| true).is_empty());
    }

    #[tokio::test]
    async fn a_cache_dropped_before_its_list_says_so() {
        let (store, writer) = store();
        drop(writer);
        assert!(store.wait_until_ready().await.is_err());
    }
}
