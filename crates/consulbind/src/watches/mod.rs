//! Long-lived Consul watches. Every binding that reads the same key with the same datacenter,
//! namespace, partition and token shares one watched [`path`]; the paths of a scope share a
//! handful of blocking queries, cut by the [`planner`] (see [`consul_kv::group`]) and followed
//! by the [`runner`], so the connections to Consul stay within the client's budget however many
//! keys are bound. A path wakes its bindings only when its content (not merely an index)
//! changes.
//!
//! This module is the registry: which bindings read which paths.

mod agent;
pub mod entries;
pub mod path;
pub mod planner;
mod retry;
pub mod runner;
mod source;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use consul_kv::{KvEntry, KvQuery};
use serde::Serialize;
use tracing::debug;

use self::{path::Path, planner::Groups, runner::Runner};
pub use self::{
    path::{Content, KeyState, Wake},
    runner::{KvSource, Limits},
};
use crate::{BindingRef, Lock, ReadWrite, metrics::Metrics};

/// How long membership changes settle before the groups are planned again, so that a burst of
/// new bindings costs one re-plan rather than one per binding.
const SETTLE: Duration = Duration::from_millis(100);

#[derive(Clone)]
pub struct Watches {
    shared: Arc<Shared>,
}

struct Shared {
    runner: Arc<Runner>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The query of each path is shared with the bindings' lists: one copy per path.
    paths: HashMap<Arc<KvQuery>, Arc<Path>>,
    /// Each binding's queries, without duplicates: a short list takes less room than a set.
    by_binding: HashMap<BindingRef, Box<[Arc<KvQuery>]>>,
    /// For each namespace, its bindings' subscriptions to each path (by address).
    by_namespace: HashMap<String, HashMap<usize, u32>>,
    groups: Groups,
}

/// One watched path, for the debug endpoint. Tokens are never shown.
#[derive(Serialize)]
pub struct WatchInfo {
    pub key: String,
    pub recurse: bool,
    pub datacenter: Option<String>,
    pub namespace: Option<String>,
    pub partition: Option<String>,
    pub with_token: bool,
    /// The key the blocking query that serves this path reads; none until planned.
    pub read_by: Option<String>,
    pub subscribers: Vec<String>,
}

impl Watches {
    /// Starts the planner, which needs a Tokio runtime. A failing query reports its failure
    /// only once it has lasted `grace`.
    pub fn new(consul: impl KvSource, wake: Wake, metrics: Arc<Metrics>, grace: Duration, limits: Limits) -> Self {
        let runner = Arc::new(Runner::new(Arc::new(consul), wake, metrics, grace, limits));
        let shared = Arc::new(Shared { runner, inner: Mutex::default() });
        tokio::spawn(plan_forever(shared.clone()));
        tokio::spawn(runner::watch_agent(shared.runner.clone()));
        Self { shared }
    }

    /// Makes `binding` subscribe to exactly `queries`, adding paths as needed and releasing the
    /// ones it no longer uses. Returns the current state of each query, in order; or, when the
    /// bindings of its namespace would then watch more than `limit` distinct paths, releases
    /// every path of the binding and returns how many that would be.
    pub fn subscribe(&self, binding: &BindingRef, queries: &[KvQuery], limit: usize) -> Result<Vec<KeyState>, usize> {
        let mut inner = self.shared.inner.locked();
        let _answers = self.shared.runner.answers.read_locked();
        let after = inner.namespace_paths_with(binding, queries);
        let (replan, result) = match after > limit {
            true => (inner.release(binding), Err(after)),
            false => {
                let replan = inner.subscribe(binding, queries);
                (replan, Ok(queries.iter().map(|q| inner.paths[q].state()).collect()))
            }
        };
        drop(inner);
        if replan {
            self.shared.runner.replan.notify_one();
        }
        result
    }

    /// Keys the digests that stand in for values; before the first subscription.
    pub fn set_digest_key(&self, key: crate::checksum::Key) {
        let digest = move |value: &[u8]| Arc::from(crate::checksum::digest(&key, value));
        self.shared.runner.consul.digest_values(Arc::new(digest));
    }

    /// Reads each query once with its values, for recognising what an older release stamped.
    pub async fn read_with_values(&self, queries: &[KvQuery]) -> Result<Vec<Vec<KvEntry>>, consul_kv::Error> {
        let answers = self.read_alone(queries.iter()).await?;
        Ok(answers.into_iter().map(|a| a.entries).collect())
    }

    /// Each query read alone, without waiting: Consul's index for it where it matched nothing,
    /// which for a shared read's path only a read of its own gives.
    pub async fn index_if_empty(&self, queries: &[&KvQuery]) -> Result<Vec<Option<u64>>, consul_kv::Error> {
        let answers = self.read_alone(queries.iter().copied()).await?;
        Ok(answers.into_iter().map(|a| a.entries.is_empty().then_some(a.index)).collect())
    }

    /// One plain read of each query, all at once.
    async fn read_alone(
        &self,
        queries: impl Iterator<Item = &KvQuery>,
    ) -> Result<Vec<consul_kv::KvResponse>, consul_kv::Error> {
        let runner = &self.shared.runner;
        let reads = queries.map(|q| runner.consul.get_values(q, runner.limits.answer_bytes(q.recurse)));
        futures::future::try_join_all(reads).await
    }

    /// How long a round of turns may take for the slowest of `queries` read by a group that
    /// takes turns for a slot; `None` when none does.
    pub fn in_turns(&self, queries: &[KvQuery]) -> Option<Duration> {
        let inner = self.shared.inner.locked();
        queries.iter().filter_map(|q| inner.paths.get(q)?.in_turns()).max()
    }

    /// How many distinct paths the bindings of `binding`'s namespace would watch were it to
    /// subscribe to exactly `queries`, when that is more than `limit`.
    /// Releases every path of a binding that is gone.
    pub fn release(&self, binding: &BindingRef) {
        let replan = self.shared.inner.locked().release(binding);
        if replan {
            self.shared.runner.replan.notify_one();
        }
    }

    /// Releases the paths of every binding for which `keep` is false, for bindings whose
    /// deletion was missed while the binding watch was down.
    pub fn retain(&self, keep: impl Fn(&BindingRef) -> bool) {
        let gone: Vec<BindingRef> =
            self.shared.inner.locked().by_binding.keys().filter(|b| !keep(b)).cloned().collect();
        for binding in gone {
            self.release(&binding);
        }
    }

    pub fn list(&self) -> Vec<WatchInfo> {
        let inner = self.shared.inner.locked();
        let mut read_by = HashMap::new();
        for (query, group) in &inner.groups.running {
            for cell in &group.roster().cells {
                read_by.insert(Arc::as_ptr(cell), query.key.clone());
            }
        }
        let mut list: Vec<WatchInfo> = inner
            .paths
            .iter()
            .map(|(q, path)| {
                let mut subscribers: Vec<String> = path.subscribers().iter().map(ToString::to_string).collect();
                subscribers.sort();
                let scope = q.scope();
                WatchInfo {
                    key: q.key.to_string(),
                    recurse: q.recurse,
                    datacenter: scope.datacenter.clone(),
                    namespace: scope.namespace.clone(),
                    partition: scope.partition.clone(),
                    with_token: scope.token.is_some(),
                    read_by: read_by.get(&Arc::as_ptr(path)).map(ToString::to_string),
                    subscribers,
                }
            })
            .collect();
        list.sort_by(|a, b| (&a.key, &a.subscribers).cmp(&(&b.key, &b.subscribers)));
        list
    }
}

impl Inner {
    /// How many distinct paths the bindings of `binding`'s namespace would watch were it to
    /// subscribe to exactly `queries`.
    fn namespace_paths_with(&self, binding: &BindingRef, queries: &[KvQuery]) -> usize {
        let empty = HashMap::new();
        let watched = self.by_namespace.get(namespace(binding)).unwrap_or(&empty);
        let address = |q: &KvQuery| self.paths.get_key_value(q).map(|(shared, _)| Arc::as_ptr(shared) as usize);
        let wanted: HashSet<&KvQuery> = queries.iter().collect();
        let added = wanted.iter().filter(|q| address(q).is_none_or(|a| !watched.contains_key(&a))).count();
        let own = self.by_binding.get(binding).map(|own| &own[..]).unwrap_or_default();
        let freed = own
            .iter()
            .filter(|q| !wanted.contains(&***q))
            .filter(|q| watched.get(&(Arc::as_ptr(q) as usize)) == Some(&1))
            .count();
        watched.len() + added - freed
    }

    /// Releases every path of `binding`; returns whether a path went.
    fn release(&mut self, binding: &BindingRef) -> bool {
        let mut replan = false;
        for query in self.by_binding.remove(binding).unwrap_or_default().iter() {
            replan |= self.unsubscribe(binding, query);
        }
        replan
    }

    /// Returns whether a path came or went, so the groups need planning again.
    fn subscribe(&mut self, binding: &BindingRef, queries: &[KvQuery]) -> bool {
        let wanted: HashSet<&KvQuery> = queries.iter().collect();
        let old = self.by_binding.remove(binding).unwrap_or_default();
        let mut replan = false;
        for query in old.iter().filter(|q| !wanted.contains(&***q)) {
            replan |= self.unsubscribe(binding, query);
        }
        let had: HashSet<&KvQuery> = old.iter().map(|q| &**q).collect();
        let mut list: Vec<Arc<KvQuery>> = Vec::with_capacity(wanted.len());
        for query in wanted {
            let new = !had.contains(query);
            let shared = match self.paths.get_key_value(query) {
                Some((shared, path)) => {
                    if !had.contains(query) {
                        path.subscribe(binding);
                    }
                    shared.clone()
                }
                None => {
                    replan = true;
                    let shared = Arc::new(query.clone());
                    let path = Arc::new(Path::default());
                    path.subscribe(binding);
                    self.paths.insert(shared.clone(), path);
                    shared
                }
            };
            if new {
                let watched = self.by_namespace.entry(namespace(binding).to_owned()).or_default();
                *watched.entry(Arc::as_ptr(&shared) as usize).or_default() += 1;
            }
            list.push(shared);
        }
        self.by_binding.insert(binding.clone(), list.into_boxed_slice());
        replan
    }

    /// Returns whether the path is gone, so the groups need planning again.
    fn unsubscribe(&mut self, binding: &BindingRef, query: &KvQuery) -> bool {
        let Some((shared, path)) = self.paths.get_key_value(query) else {
            return false;
        };
        if let Some(watched) = self.by_namespace.get_mut(namespace(binding)) {
            let address = Arc::as_ptr(shared) as usize;
            if let Some(count) = watched.get_mut(&address) {
                *count -= 1;
                if *count == 0 {
                    watched.remove(&address);
                }
            }
            if watched.is_empty() {
                self.by_namespace.remove(namespace(binding));
            }
        }
        if !path.unsubscribe(binding) {
            return false;
        }
        debug!(key = %query.key, "no binding reads this Consul path any more");
        self.paths.remove(query);
        true
    }
}

fn namespace(binding: &BindingRef) -> &str {
    binding.namespace()
}

async fn plan_forever(shared: Arc<Shared>) {
    loop {
        shared.runner.replan.notified().await;
        tokio::time::sleep(SETTLE).await;
        let inner = &mut *shared.inner.locked();
        planner::plan(&shared.runner, &inner.paths, &mut inner.groups);
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn binding(name: &str) -> BindingRef {
        BindingRef::new("ns", name)
    }

    #[test]
    fn bindings_share_one_path_and_one_copy_of_its_query_and_the_last_one_out_removes_it() {
        let mut inner = Inner::default();
        let (a, b) = (binding("a"), binding("b"));
        let (shared, own) = (KvQuery::exact("app/shared"), KvQuery::exact("app/a"));
        assert!(inner.subscribe(&a, &[shared.clone(), own.clone(), shared.clone()]), "new paths need a plan");
        assert!(!inner.subscribe(&b, std::slice::from_ref(&shared)), "an existing path needs none");
        assert_eq!(inner.paths.len(), 2);
        assert_eq!(inner.by_binding[&a].len(), 2, "a duplicate query is one subscription");
        let (key, path) = inner.paths.get_key_value(&shared).unwrap();
        assert!(Arc::ptr_eq(key, &inner.by_binding[&b][0]), "the bindings' lists share the path's query");
        assert_eq!(path.subscribers(), [a.clone(), b.clone()]);

        // The same queries again change nothing; dropping one releases only that subscription.
        assert!(!inner.subscribe(&a, &[own.clone(), shared.clone()]));
        assert_eq!(inner.paths[&shared].subscribers(), [a.clone(), b.clone()]);
        assert!(!inner.subscribe(&a, std::slice::from_ref(&own)), "b still reads the shared path");
        assert_eq!(inner.paths[&shared].subscribers(), std::slice::from_ref(&b));
        assert!(inner.subscribe(&b, &[]), "the last reader removes the path");
        assert!(!inner.paths.contains_key(&shared));
        assert!(inner.unsubscribe(&a, &own));
        assert!(inner.paths.is_empty());
    }

    #[test]
    fn a_namespace_counts_its_distinct_paths_whichever_binding_adds_or_frees_them() {
        let mut inner = Inner::default();
        let (a, b) = (binding("a"), binding("b"));
        let other = BindingRef::new("other", "c");
        let q = |k: &str| KvQuery::exact(k);
        inner.subscribe(&a, &[q("x"), q("y")]);
        // Another namespace's paths, shared or not, count for it alone.
        inner.subscribe(&other, &[q("x"), q("z")]);
        assert_eq!(inner.namespace_paths_with(&b, &[q("x")]), 2, "a path the namespace watches already adds none");
        assert_eq!(inner.namespace_paths_with(&b, &[q("z")]), 3, "one another namespace watches counts here too");
        assert_eq!(inner.namespace_paths_with(&a, &[q("y")]), 1, "what a binding drops is freed");
        inner.subscribe(&b, &[q("y"), q("w")]);
        assert_eq!(inner.namespace_paths_with(&a, &[]), 2, "y stays: b reads it");
        assert_eq!(inner.namespace_paths_with(&other, &[]), 0);
        inner.subscribe(&a, &[]);
        inner.subscribe(&b, &[]);
        assert!(!inner.by_namespace.contains_key("ns"), "an empty namespace is forgotten");
        assert_eq!(inner.namespace_paths_with(&other, &[q("x"), q("z")]), 2);
    }
}
