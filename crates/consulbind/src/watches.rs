//! Long-lived Consul watches, shared by every binding that reads the same key with the same
//! datacenter, namespace, partition and token. A watch wakes its bindings when the content
//! (not merely the index) changes, and stops when no binding needs it any more.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use consul_kv::{Backoff, Client, ErrorKind, KvEntry, KvQuery, index};
use consulbind_api::{ConsulBinding, conditions::reason};
use kube::runtime::reflector::ObjectRef;
use serde::Serialize;
use tokio::{sync::watch, task::JoinHandle};
use tracing::{debug, info, warn};

use crate::metrics::Metrics;

pub type BindingRef = ObjectRef<ConsulBinding>;

/// The latest word from Consul on one query.
#[derive(Clone, Debug)]
pub enum KeyState {
    /// No answer yet.
    Pending,
    /// Entries sorted by key; empty when the key or prefix is missing. `changed_at` is when
    /// this content was first seen.
    Ready { entries: Arc<[KvEntry]>, changed_at: std::time::Instant },
    /// The last request failed; retried with backoff.
    Failed { reason: &'static str, message: String },
}

/// Called with each binding a watch wants reconciled.
pub type Wake = Arc<dyn Fn(BindingRef) + Send + Sync>;

#[derive(Clone)]
pub struct Watches {
    client: Client,
    wake: Wake,
    metrics: Arc<Metrics>,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    watches: HashMap<KvQuery, Watch>,
    by_binding: HashMap<BindingRef, HashSet<KvQuery>>,
}

struct Watch {
    state: watch::Receiver<KeyState>,
    subscribers: Arc<Mutex<HashSet<BindingRef>>>,
    task: JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One active watch, for the debug endpoint. Tokens are never shown.
#[derive(Serialize)]
pub struct WatchInfo {
    pub key: String,
    pub recurse: bool,
    pub datacenter: Option<String>,
    pub namespace: Option<String>,
    pub partition: Option<String>,
    pub with_token: bool,
    pub subscribers: Vec<String>,
}

impl Watches {
    pub fn new(client: Client, wake: Wake, metrics: Arc<Metrics>) -> Self {
        Self { client, wake, metrics, inner: Arc::default() }
    }

    /// Makes `binding` subscribe to exactly `queries`, starting watches as needed and releasing
    /// the ones it no longer uses. Returns the current state of each query, in order.
    pub fn subscribe(&self, binding: &BindingRef, queries: &[KvQuery]) -> Vec<KeyState> {
        let mut inner = self.inner.lock().unwrap();
        let wanted: HashSet<KvQuery> = queries.iter().cloned().collect();
        let old = inner.by_binding.remove(binding).unwrap_or_default();
        for query in old.difference(&wanted) {
            inner.unsubscribe(binding, query);
        }
        for query in &wanted {
            let watch = inner.watches.entry(query.clone()).or_insert_with(|| self.start(query.clone()));
            watch.subscribers.lock().unwrap().insert(binding.clone());
        }
        inner.by_binding.insert(binding.clone(), wanted);
        self.metrics.consul_watches.set(inner.watches.len() as i64);
        queries.iter().map(|q| inner.watches[q].state.borrow().clone()).collect()
    }

    /// Releases every watch of a binding that is gone.
    pub fn release(&self, binding: &BindingRef) {
        let mut inner = self.inner.lock().unwrap();
        for query in inner.by_binding.remove(binding).unwrap_or_default() {
            inner.unsubscribe(binding, &query);
        }
        self.metrics.consul_watches.set(inner.watches.len() as i64);
    }

    /// Releases the watches of every binding for which `keep` is false, for bindings whose
    /// deletion was missed while the binding watch was down.
    pub fn retain(&self, keep: impl Fn(&BindingRef) -> bool) {
        let gone: Vec<BindingRef> =
            self.inner.lock().unwrap().by_binding.keys().filter(|b| !keep(b)).cloned().collect();
        for binding in gone {
            self.release(&binding);
        }
    }

    pub fn list(&self) -> Vec<WatchInfo> {
        let inner = self.inner.lock().unwrap();
        let mut list: Vec<WatchInfo> = inner
            .watches
            .iter()
            .map(|(q, w)| {
                let mut subscribers: Vec<String> =
                    w.subscribers.lock().unwrap().iter().map(ToString::to_string).collect();
                subscribers.sort();
                WatchInfo {
                    key: q.key.clone(),
                    recurse: q.recurse,
                    datacenter: q.datacenter.clone(),
                    namespace: q.namespace.clone(),
                    partition: q.partition.clone(),
                    with_token: q.token.is_some(),
                    subscribers,
                }
            })
            .collect();
        list.sort_by(|a, b| (&a.key, &a.subscribers).cmp(&(&b.key, &b.subscribers)));
        list
    }

    fn start(&self, query: KvQuery) -> Watch {
        let (tx, rx) = watch::channel(KeyState::Pending);
        let subscribers: Arc<Mutex<HashSet<BindingRef>>> = Arc::default();
        let notify = {
            let (subscribers, wake) = (subscribers.clone(), self.wake.clone());
            move || subscribers.lock().unwrap().iter().cloned().for_each(|b| wake(b))
        };
        let task = tokio::spawn(run(self.client.clone(), query, tx, notify, self.metrics.clone()));
        Watch { state: rx, subscribers, task }
    }
}

impl Inner {
    fn unsubscribe(&mut self, binding: &BindingRef, query: &KvQuery) {
        let Some(watch) = self.watches.get(query) else {
            return;
        };
        let mut subscribers = watch.subscribers.lock().unwrap();
        subscribers.remove(binding);
        if subscribers.is_empty() {
            drop(subscribers);
            debug!(key = %query.key, "stopping Consul watch");
            self.watches.remove(query);
        }
    }
}

fn same_contents(a: &[KvEntry], b: &[KvEntry]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.key == b.key && a.value == b.value)
}

/// Follows one query with blocking requests until aborted.
async fn run(client: Client, query: KvQuery, state: watch::Sender<KeyState>, notify: impl Fn(), metrics: Arc<Metrics>) {
    let mut last_index = 0;
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        let started = std::time::Instant::now();
        let result = client.get(&query, last_index).await;
        metrics.consul_request(result.as_ref().err().map(|e| e.kind()), started.elapsed());
        match result {
            Ok(response) => {
                backoff.reset();
                last_index = index::next(last_index, response.index);
                // Contents, not indexes, make a change. Index-only moves are kept for the status
                // without waking anyone.
                let changed = state.send_if_modified(|current| {
                    let (content_changed, changed_at) = match current {
                        KeyState::Ready { entries, changed_at } if same_contents(entries, &response.entries) => {
                            (false, *changed_at)
                        }
                        _ => (true, std::time::Instant::now()),
                    };
                    *current = KeyState::Ready { entries: response.entries.into(), changed_at };
                    content_changed
                });
                if changed {
                    info!(key = %query.key, recurse = query.recurse, index = response.index, "Consul content changed");
                    notify();
                }
            }
            Err(error) => {
                let reason = match error.kind() {
                    ErrorKind::AccessDenied => reason::ACCESS_DENIED,
                    ErrorKind::Unreachable => reason::CONSUL_UNREACHABLE,
                    _ => reason::CONSUL_ERROR,
                };
                let message = error.to_string();
                let delay = backoff.next_delay();
                warn!(key = %query.key, %error, retry_in = ?delay, "Consul read failed");
                let changed = state.send_if_modified(|current| match current {
                    KeyState::Failed { reason: r, message: m } if *r == reason && *m == message => false,
                    _ => {
                        *current = KeyState::Failed { reason, message };
                        true
                    }
                });
                if changed {
                    notify();
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}
