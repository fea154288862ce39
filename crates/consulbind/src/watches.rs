//! Long-lived Consul watches. Every binding that reads the same key with the same datacenter,
//! namespace, partition and token shares one watched path; the paths of a scope share a handful
//! of blocking queries (see [`consul_kv::group`]), so the connections to Consul stay within the
//! client's budget however many keys are bound. A path wakes its bindings only when its content
//! (not merely an index) changes.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use consul_kv::{
    Backoff, Client, ErrorKind, KvEntry, KvQuery, Token,
    group::{self, Members, WatchPath},
    index::{Cursor, Progress},
    jitter, same_entries,
};
use consulbind_api::{ConsulBinding, conditions::reason};
use kube::runtime::reflector::ObjectRef;
use serde::Serialize;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use crate::metrics::Metrics;

pub type BindingRef = ObjectRef<ConsulBinding>;

/// A binding's name and namespace, without the resource version and uid that
/// `ObjectRef::from_obj` copies: they play no part in comparisons, and the maps keep tens of
/// thousands of these.
pub fn binding_ref(binding: &ConsulBinding) -> BindingRef {
    let mut oref = ObjectRef::from_obj(binding);
    oref.extra = Default::default();
    oref
}

/// The latest word from Consul on one watched path.
#[derive(Clone, Debug)]
pub enum KeyState {
    /// No answer yet.
    Pending,
    Ready(Content),
    /// Requests have failed for longer than the grace period; retried with backoff. `last` is
    /// the content from before, kept so that recovery with the same content is no change.
    Failed {
        reason: &'static str,
        message: String,
        last: Option<Content>,
    },
}

#[derive(Clone, Debug)]
pub struct Content {
    /// Sorted by key; empty when the key or prefix is missing.
    pub entries: Arc<[KvEntry]>,
    /// When this content was first seen.
    pub changed_at: Instant,
    /// Consul's index went backwards just as this content became missing or empty: data lost
    /// in a restore or a rebuilt cluster, not a change anyone made.
    pub reset_hold: bool,
}

/// What an answer did to a path.
#[derive(Debug, PartialEq, Eq)]
enum Update {
    Same,
    /// The first answer for the path.
    First,
    /// The same content as before a failure: the bindings need to hear that Consul is back.
    Recovered,
    Changed,
}

/// Called with each binding a watch wants reconciled.
pub type Wake = Arc<dyn Fn(BindingRef) + Send + Sync>;

/// How long membership changes settle before the groups are planned again, so that a burst of
/// new bindings costs one re-plan rather than one per binding.
const SETTLE: Duration = Duration::from_millis(100);
/// The wait of each blocking query while there are more groups than slots, so that the groups
/// take turns.
const ROTATION_WAIT: Duration = Duration::from_secs(10);
/// The shortest wait of a blocking query.
const MIN_WAIT: Duration = Duration::from_secs(1);
/// How soon a prefix found too large is read again: it rarely shrinks by itself.
const TOO_LARGE_RETRY: Duration = Duration::from_secs(60);

/// How much one bound prefix may hold. Past either, its bindings show `PrefixTooLarge` and its
/// content is never kept.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub entries: usize,
    /// Bytes of keys and values.
    pub bytes: u64,
}

impl Limits {
    /// The most bytes of Consul's answer for one path: JSON with values in base64 is about
    /// 4/3 of the raw size, plus a little per entry. An exact key may hold up to Consul's own
    /// limit of 512 KiB, whatever the prefix limit.
    fn answer_bytes(&self, recurse: bool) -> u64 {
        let prefix = self.bytes.saturating_mul(2).saturating_add(64 << 10);
        if recurse { prefix } else { prefix.max(1 << 20) }
    }
}

#[derive(Clone)]
pub struct Watches {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    wake: Wake,
    metrics: Arc<Metrics>,
    /// How long requests may fail before the paths report it.
    grace: Duration,
    limits: Limits,
    inner: Mutex<Inner>,
    replan: Notify,
    /// More groups than blocking slots: the groups rotate with short waits.
    rotating: AtomicBool,
}

#[derive(Default)]
struct Inner {
    paths: HashMap<KvQuery, Arc<Path>>,
    /// Each binding's queries, without duplicates: a short list takes less room than a set.
    by_binding: HashMap<BindingRef, Box<[KvQuery]>>,
    groups: HashMap<KvQuery, GroupHandle>,
}

/// One watched path: its latest state and the bindings that read it.
struct Path {
    /// Bindings read it when they reconcile; a change wakes them through [`Wake`].
    state: Mutex<KeyState>,
    /// Without duplicates. Most paths have one or two, and a list of them takes far less room
    /// than a set, across tens of thousands of paths.
    subscribers: Mutex<Vec<BindingRef>>,
    /// A shared read that included this path was too large: it is read on its own from now on.
    solo: AtomicBool,
}

impl Path {
    fn wake(&self, wake: &Wake) {
        self.subscribers.lock().unwrap().iter().cloned().for_each(|b| wake(b));
    }
}

/// The paths one group's query serves.
struct Roster {
    paths: Vec<WatchPath>,
    cells: Vec<Arc<Path>>,
    members: Members,
}

impl Roster {
    fn new(paths: Vec<WatchPath>, cells: Vec<Arc<Path>>) -> Self {
        Self { members: Members::new(&paths), paths, cells }
    }

    fn serves(&self, paths: &[WatchPath], cells: &[Arc<Path>]) -> bool {
        self.paths == paths && self.cells.iter().zip(cells).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

struct GroupHandle {
    roster: watch::Sender<Arc<Roster>>,
    task: JoinHandle<()>,
    born: Instant,
}

/// A group younger than this, when no longer needed, finishes its request (its wait is no
/// longer than its age) instead of dropping it: a dropped request leaves a socket closing
/// outside the connection budget for a moment, and cold starts replace many young groups.
const RETIRE_YOUNG: Duration = Duration::from_secs(30);

impl Drop for GroupHandle {
    fn drop(&mut self) {
        // Dropping the roster sender tells the task to stop once its request is done.
        if self.born.elapsed() >= RETIRE_YOUNG {
            self.task.abort();
        }
    }
}

/// The part of a query that decides whether two paths may share a blocking query: ACLs filter
/// per token, and the other fields pick another data set.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Scope {
    datacenter: Option<String>,
    namespace: Option<String>,
    partition: Option<String>,
    token: Option<TokenKey>,
}

/// Orders tokens without ever printing them.
#[derive(Clone, PartialEq, Eq, Hash)]
struct TokenKey(Token);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialOrd for TokenKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TokenKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.expose().cmp(other.0.expose())
    }
}

impl Scope {
    fn of(query: &KvQuery) -> Self {
        Self {
            datacenter: query.datacenter.clone(),
            namespace: query.namespace.clone(),
            partition: query.partition.clone(),
            token: query.token.clone().map(TokenKey),
        }
    }

    fn query(&self, key: String, recurse: bool) -> KvQuery {
        KvQuery {
            key,
            recurse,
            datacenter: self.datacenter.clone(),
            namespace: self.namespace.clone(),
            partition: self.partition.clone(),
            token: self.token.clone().map(|t| t.0),
        }
    }
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
    pub fn new(client: Client, wake: Wake, metrics: Arc<Metrics>, grace: Duration, limits: Limits) -> Self {
        let shared = Arc::new(Shared {
            client,
            wake,
            metrics,
            grace,
            limits,
            inner: Mutex::default(),
            replan: Notify::new(),
            rotating: AtomicBool::new(false),
        });
        tokio::spawn(plan_forever(shared.clone()));
        Self { shared }
    }

    /// Makes `binding` subscribe to exactly `queries`, adding paths as needed and releasing the
    /// ones it no longer uses. Returns the current state of each query, in order.
    pub fn subscribe(&self, binding: &BindingRef, queries: &[KvQuery]) -> Vec<KeyState> {
        let mut inner = self.shared.inner.lock().unwrap();
        let wanted: HashSet<KvQuery> = queries.iter().cloned().collect();
        let old: HashSet<KvQuery> =
            inner.by_binding.remove(binding).unwrap_or_default().into_vec().into_iter().collect();
        let mut replan = false;
        for query in old.difference(&wanted) {
            replan |= inner.unsubscribe(binding, query);
        }
        for query in wanted.difference(&old) {
            let path = inner.paths.entry(query.clone()).or_insert_with(|| {
                replan = true;
                Arc::new(Path {
                    state: Mutex::new(KeyState::Pending),
                    subscribers: Mutex::default(),
                    solo: AtomicBool::new(false),
                })
            });
            let mut subscribers = path.subscribers.lock().unwrap();
            if !subscribers.contains(binding) {
                subscribers.push(binding.clone());
            }
        }
        inner.by_binding.insert(binding.clone(), wanted.into_iter().collect());
        let states = queries.iter().map(|q| inner.paths[q].state.lock().unwrap().clone()).collect();
        drop(inner);
        if replan {
            self.shared.replan.notify_one();
        }
        states
    }

    /// Releases every path of a binding that is gone.
    pub fn release(&self, binding: &BindingRef) {
        let mut inner = self.shared.inner.lock().unwrap();
        let mut replan = false;
        for query in inner.by_binding.remove(binding).unwrap_or_default().iter() {
            replan |= inner.unsubscribe(binding, query);
        }
        drop(inner);
        if replan {
            self.shared.replan.notify_one();
        }
    }

    /// Releases the paths of every binding for which `keep` is false, for bindings whose
    /// deletion was missed while the binding watch was down.
    pub fn retain(&self, keep: impl Fn(&BindingRef) -> bool) {
        let gone: Vec<BindingRef> =
            self.shared.inner.lock().unwrap().by_binding.keys().filter(|b| !keep(b)).cloned().collect();
        for binding in gone {
            self.release(&binding);
        }
    }

    pub fn list(&self) -> Vec<WatchInfo> {
        let inner = self.shared.inner.lock().unwrap();
        let mut read_by = HashMap::new();
        for (query, group) in &inner.groups {
            for cell in &group.roster.borrow().cells {
                read_by.insert(Arc::as_ptr(cell), query.key.clone());
            }
        }
        let mut list: Vec<WatchInfo> = inner
            .paths
            .iter()
            .map(|(q, path)| {
                let mut subscribers: Vec<String> =
                    path.subscribers.lock().unwrap().iter().map(ToString::to_string).collect();
                subscribers.sort();
                WatchInfo {
                    key: q.key.clone(),
                    recurse: q.recurse,
                    datacenter: q.datacenter.clone(),
                    namespace: q.namespace.clone(),
                    partition: q.partition.clone(),
                    with_token: q.token.is_some(),
                    read_by: read_by.get(&Arc::as_ptr(path)).cloned(),
                    subscribers,
                }
            })
            .collect();
        list.sort_by(|a, b| (&a.key, &a.subscribers).cmp(&(&b.key, &b.subscribers)));
        list
    }
}

impl Inner {
    /// Returns whether the path is gone, so the groups need planning again.
    fn unsubscribe(&mut self, binding: &BindingRef, query: &KvQuery) -> bool {
        let Some(path) = self.paths.get(query) else {
            return false;
        };
        let mut subscribers = path.subscribers.lock().unwrap();
        subscribers.retain(|b| b != binding);
        if !subscribers.is_empty() {
            return false;
        }
        drop(subscribers);
        debug!(key = %query.key, "no binding reads this Consul path any more");
        self.paths.remove(query);
        true
    }
}

async fn plan_forever(shared: Arc<Shared>) {
    loop {
        shared.replan.notified().await;
        tokio::time::sleep(SETTLE).await;
        plan(&shared);
    }
}

/// Shares the blocking slots among the scopes and cuts each scope's paths into its share of
/// groups. Groups whose key and paths stay the same keep running untouched.
fn plan(shared: &Arc<Shared>) {
    let mut inner = shared.inner.lock().unwrap();
    let mut scopes: BTreeMap<Scope, Vec<(WatchPath, Arc<Path>)>> = BTreeMap::new();
    for (query, path) in &inner.paths {
        let watch_path = WatchPath { key: query.key.clone(), recurse: query.recurse };
        scopes.entry(Scope::of(query)).or_default().push((watch_path, path.clone()));
    }
    let slots = shared.client.blocking_slots();
    let shares = shares(&scopes.values().map(Vec::len).collect::<Vec<_>>(), slots);

    let mut current: HashMap<Scope, Vec<(String, bool)>> = HashMap::new();
    for query in inner.groups.keys() {
        current.entry(Scope::of(query)).or_default().push((query.key.clone(), query.recurse));
    }
    let mut groups: HashMap<KvQuery, (Vec<WatchPath>, Vec<Arc<Path>>)> = HashMap::new();
    for ((scope, mut paths), share) in scopes.into_iter().zip(shares) {
        paths.sort_by(|a, b| a.0.cmp(&b.0));
        let (watch_paths, cells): (Vec<WatchPath>, Vec<Arc<Path>>) = paths.into_iter().unzip();
        // Paths too large to share a read get one each; the rest share what is left.
        let (solo, shared_paths): (Vec<usize>, Vec<usize>) =
            (0..cells.len()).partition(|&i| cells[i].solo.load(Ordering::Relaxed));
        let solo_keys: HashSet<(&str, bool)> =
            solo.iter().map(|&i| (watch_paths[i].key.as_str(), watch_paths[i].recurse)).collect();
        let current: Vec<(String, bool)> = current
            .remove(&scope)
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, recurse)| !solo_keys.contains(&(key.as_str(), *recurse)))
            .collect();
        let rest: Vec<WatchPath> = shared_paths.iter().map(|&i| watch_paths[i].clone()).collect();
        let share = share.saturating_sub(solo.len()).max(1);
        let mut planned: Vec<(String, bool, Vec<usize>)> = group::assign(&rest, &current, share)
            .into_iter()
            .map(|g| (g.key, g.recurse, g.members.iter().map(|&i| shared_paths[i]).collect()))
            .collect();
        planned.extend(solo.iter().map(|&i| (watch_paths[i].key.clone(), watch_paths[i].recurse, vec![i])));
        for (key, recurse, members) in planned {
            // A shared group may read the very key of a solo path: one query serves both.
            let (paths, group_cells) = groups.entry(scope.query(key, recurse)).or_default();
            for i in members {
                paths.push(watch_paths[i].clone());
                group_cells.push(cells[i].clone());
            }
        }
    }

    let rotating = groups.len() > slots;
    if rotating != shared.rotating.swap(rotating, Ordering::Relaxed) {
        match rotating {
            true => warn!(
                groups = groups.len(),
                slots,
                "more distinct Consul tokens and scopes than blocking-query slots; watches take turns with \
                 {ROTATION_WAIT:?} waits, so changes may show late. Raise --consul-max-connections"
            ),
            false => info!(groups = groups.len(), slots, "every Consul watch group has a blocking-query slot again"),
        }
    }
    shared.metrics.consul_watch_groups_over_budget.set(groups.len().saturating_sub(slots) as i64);

    let mut running = std::mem::take(&mut inner.groups);
    for (query, (paths, cells)) in groups {
        let (paths, cells) = sorted(paths, cells);
        let handle = match running.remove(&query) {
            Some(handle) => {
                if !handle.roster.borrow().serves(&paths, &cells) {
                    handle.roster.send_replace(Arc::new(Roster::new(paths, cells)));
                }
                handle
            }
            None => start_group(shared, query.clone(), Roster::new(paths, cells)),
        };
        inner.groups.insert(query, handle);
    }
    // Whatever is left in `running` is no longer needed and stops when dropped here.
    debug!(paths = inner.paths.len(), groups = inner.groups.len(), stopped = running.len(), "planned Consul watches");
    shared.metrics.consul_watches.set(inner.paths.len() as i64);
    shared.metrics.consul_watch_groups.set(inner.groups.len() as i64);
}

/// Sorts a roster's paths, keeping each cell beside its path.
fn sorted(paths: Vec<WatchPath>, cells: Vec<Arc<Path>>) -> (Vec<WatchPath>, Vec<Arc<Path>>) {
    if paths.is_sorted() {
        return (paths, cells);
    }
    let mut pairs: Vec<(WatchPath, Arc<Path>)> = paths.into_iter().zip(cells).collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs.into_iter().unzip()
}

/// Splits `slots` among scopes in proportion to their paths, at least one each.
fn shares(sizes: &[usize], slots: usize) -> Vec<usize> {
    let total: usize = sizes.iter().sum();
    let spare = slots.saturating_sub(sizes.len());
    sizes.iter().map(|&n| 1 + (spare * n).checked_div(total).unwrap_or(0)).collect()
}

fn start_group(shared: &Arc<Shared>, query: KvQuery, roster: Roster) -> GroupHandle {
    let (tx, rx) = watch::channel(Arc::new(roster));
    let task = tokio::spawn(run_group(shared.clone(), query, rx));
    GroupHandle { roster: tx, task, born: Instant::now() }
}

/// Follows one group's query with blocking requests until aborted, and hands each path its
/// part of every answer. The group's key never changes, so any answer covers whatever paths
/// the roster holds when it arrives.
async fn run_group(shared: Arc<Shared>, query: KvQuery, mut roster: watch::Receiver<Arc<Roster>>) {
    let born = Instant::now();
    let mut cursor = Cursor::default();
    // Capped low, so that once Consul answers again the status shows it within seconds.
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
    // The roster and the entries its paths need, as of the last answer every path was told of.
    let mut last: Option<(Arc<Roster>, Vec<KvEntry>)> = None;
    let mut failing_since: Option<Instant> = None;
    loop {
        if roster.has_changed().is_err() {
            return;
        }
        let index = if last.is_some() { cursor.index() } else { 0 };
        let started = Instant::now();
        let limit = answer_limit(&shared.limits, &roster.borrow());
        let request = shared.client.get_wait(&query, index, group_wait(&shared, born), limit);
        tokio::pin!(request);
        let result = loop {
            tokio::select! {
                result = &mut request => break Some(result),
                // New paths need their content now. Short reads of just those paths give it to
                // them; the blocking query goes on, since one given up keeps a connection busy
                // on the Consul agent until its wait runs out.
                changed = roster.changed(), if index != 0 => {
                    if changed.is_err() {
                        // Retired: finish the request, tell no one.
                        let _ = (&mut request).await;
                        return;
                    }
                    let members = roster.borrow_and_update().clone();
                    let Some((before, entries)) = last.take() else { break None };
                    match read_new_paths(&shared, &query, &before, &members, entries).await {
                        Some(entries) => last = Some((members, entries)),
                        None => break None,
                    }
                }
            }
        };
        let Some(result) = result else {
            // A new path could not be read alone: read the whole group afresh instead.
            continue;
        };
        if roster.has_changed().is_err() {
            // Retired while reading: another group serves these paths now.
            return;
        }
        shared.metrics.consul_request(result.as_ref().err().map(|e| e.kind()), started.elapsed());
        let members = roster.borrow_and_update().clone();
        match result {
            Ok(response) => {
                backoff.reset();
                failing_since = None;
                let reset = cursor.answered(response.index) == Progress::Reset;
                if reset {
                    warn!(key = %query.key, index = response.index, "Consul's index went backwards (a restore or a rebuilt cluster?); reading afresh");
                }
                let seen = last.take().filter(|(seen, _)| Arc::ptr_eq(seen, &members) && !reset).map(|(_, old)| old);
                last = Some(deliver(&shared, &members, response.entries, seen.as_deref(), reset, response.index));
            }
            Err(error) if error.kind() == ErrorKind::TooLarge => {
                cursor.failed();
                last = None;
                if members.cells.len() > 1 {
                    info!(key = %query.key, paths = members.cells.len(), "a shared Consul read was too large; its paths are read on their own");
                    members.cells.iter().for_each(|c| c.solo.store(true, Ordering::Relaxed));
                    shared.replan.notify_one();
                } else {
                    warn!(key = %query.key, %error, "a bound Consul prefix is over the limit");
                    let message = format!(
                        "{error}: the prefix holds more than --max-prefix-bytes ({} bytes of keys and values) \
                         allows; bind a narrower prefix, or ask for a higher limit",
                        shared.limits.bytes
                    );
                    for cell in &members.cells {
                        if set_failed(cell, reason::PREFIX_TOO_LARGE, &message) {
                            cell.wake(&shared.wake);
                        }
                    }
                }
                // Until the planner regroups these paths, or a while has passed.
                tokio::select! {
                    changed = roster.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep(TOO_LARGE_RETRY) => {}
                }
            }
            Err(error) => {
                cursor.failed();
                last = None;
                let reason = match error.kind() {
                    ErrorKind::AccessDenied => reason::ACCESS_DENIED,
                    ErrorKind::Unreachable => reason::CONSUL_UNREACHABLE,
                    _ => reason::CONSUL_ERROR,
                };
                let delay = backoff.next_delay();
                warn!(key = %query.key, recurse = query.recurse, %error, retry_in = ?delay, "Consul read failed");
                let message = error.to_string();
                let report = || {
                    for cell in &members.cells {
                        if set_failed(cell, reason, &message) {
                            cell.wake(&shared.wake);
                        }
                    }
                };
                // A blip within the grace period shows nowhere; a longer failure shows once the
                // grace is over, even in the middle of a backoff.
                let due = *failing_since.get_or_insert_with(Instant::now) + shared.grace;
                let retry = tokio::time::Instant::now() + delay;
                if Instant::now() >= due {
                    report();
                } else if tokio::time::Instant::from_std(due) < retry {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
                    report();
                }
                tokio::time::sleep_until(retry).await;
            }
        }
    }
}

/// Reads the paths of `members` that `before` did not have, each alone, and merges them into
/// `entries`. `None` when a read failed.
async fn read_new_paths(
    shared: &Shared,
    query: &KvQuery,
    before: &Roster,
    members: &Roster,
    mut entries: Vec<KvEntry>,
) -> Option<Vec<KvEntry>> {
    let new: Vec<usize> = {
        // Addresses as numbers: raw pointers cannot be held across an await.
        let known: HashSet<usize> = before.cells.iter().map(|c| Arc::as_ptr(c) as usize).collect();
        (0..members.cells.len()).filter(|&i| !known.contains(&(Arc::as_ptr(&members.cells[i]) as usize))).collect()
    };
    let reads = new.iter().map(|&i| {
        let path = &members.paths[i];
        let query = KvQuery { key: path.key.clone(), recurse: path.recurse, ..query.clone() };
        let limit = shared.limits.answer_bytes(path.recurse);
        async move { shared.client.get_wait(&query, 0, MIN_WAIT, limit).await }
    });
    let reads = futures::future::join_all(reads).await;
    for (&i, read) in new.iter().zip(reads) {
        let response = read.ok()?;
        let path = &members.paths[i];
        group::merge(&mut entries, path, response.entries);
        hand_over(shared, path, &members.cells[i], group::select(&entries, path), false);
    }
    Some(entries)
}

/// Hands each path of `members` its part of `entries`: only the paths whose entries differ
/// from `old`, or all of them without `old`. Wakes the bindings of paths whose content changed
/// or came back after a failure. `reset` says the index went backwards with this answer.
fn deliver(
    shared: &Shared,
    members: &Arc<Roster>,
    entries: Vec<KvEntry>,
    old: Option<&[KvEntry]>,
    reset: bool,
    index: u64,
) -> (Arc<Roster>, Vec<KvEntry>) {
    let entries = members.members.retain(entries);
    let changed: Vec<usize> = match old {
        Some(old) => members.members.changed(old, &entries),
        None => (0..members.paths.len()).collect(),
    };
    for i in changed {
        let path = &members.paths[i];
        if hand_over(shared, path, &members.cells[i], group::select(&entries, path), reset) == Update::Changed {
            info!(key = %path.key, recurse = path.recurse, index, "Consul content changed");
        }
    }
    (members.clone(), entries)
}

/// Gives one path its entries, or the `PrefixTooLarge` failure when they are over the limits,
/// and wakes its bindings when that is news.
fn hand_over(shared: &Shared, path: &WatchPath, cell: &Path, entries: &[KvEntry], reset: bool) -> Update {
    let limits = &shared.limits;
    let bytes: u64 = entries.iter().map(|e| (e.key.len() + e.value.len()) as u64).sum();
    let update = if path.recurse && (entries.len() > limits.entries || bytes > limits.bytes) {
        let message = format!(
            "the prefix {:?} holds {} keys and {bytes} bytes, over the limit of {} keys (--max-prefix-entries) \
             and {} bytes (--max-prefix-bytes); bind a narrower prefix, or ask for a higher limit",
            path.key,
            entries.len(),
            limits.entries,
            limits.bytes
        );
        match set_failed(cell, reason::PREFIX_TOO_LARGE, &message) {
            true => Update::Changed,
            false => Update::Same,
        }
    } else {
        set_ready(cell, entries, reset)
    };
    if update != Update::Same {
        cell.wake(&shared.wake);
    }
    update
}

/// The most bytes a group's answer may have: what its paths may hold together.
fn answer_limit(limits: &Limits, roster: &Roster) -> u64 {
    roster.paths.iter().fold(0u64, |sum, p| sum.saturating_add(limits.answer_bytes(p.recurse)))
}

/// The wait of a group's next blocking query. A young group waits no longer than it has lived,
/// so that one replaced soon after it started (while many bindings arrive at once) leaves no
/// request behind on the agent for long; and groups take turns while there are too many.
fn group_wait(shared: &Shared, born: Instant) -> Duration {
    let wait = match shared.rotating.load(Ordering::Relaxed) {
        true => ROTATION_WAIT,
        false => shared.client.wait(),
    };
    jitter(wait.min(born.elapsed().max(MIN_WAIT)), 0.1)
}

/// Records new entries. Content that turns missing or empty in the same answer as an index
/// reset is marked as lost data; it stays marked until the content is back.
fn set_ready(path: &Path, entries: &[KvEntry], reset: bool) -> Update {
    let current = &mut *path.state.lock().unwrap();
    let (before, was_ready) = match current {
        KeyState::Ready(content) => (Some(&*content), true),
        KeyState::Failed { last, .. } => (last.as_ref(), false),
        KeyState::Pending => (None, false),
    };
    let (update, content) = match before.filter(|b| same_entries(&b.entries, entries)) {
        Some(before) => {
            let update = if was_ready { Update::Same } else { Update::Recovered };
            (update, Content { entries: entries.into(), ..before.clone() })
        }
        None => {
            let update = if before.is_some() { Update::Changed } else { Update::First };
            let lost = reset && entries.is_empty() && before.is_some_and(|b| !b.entries.is_empty());
            (update, Content { entries: entries.into(), changed_at: Instant::now(), reset_hold: lost })
        }
    };
    *current = KeyState::Ready(content);
    update
}

fn set_failed(path: &Path, reason: &'static str, message: &str) -> bool {
    let current = &mut *path.state.lock().unwrap();
    let last = match current {
        KeyState::Failed { reason: r, message: m, .. } if *r == reason && m == message => return false,
        KeyState::Failed { last, .. } => last.take(),
        KeyState::Ready(content) => Some(content.clone()),
        KeyState::Pending => None,
    };
    *current = KeyState::Failed { reason, message: message.to_owned(), last };
    true
}

#[cfg(test)]
mod tests {
    use super::shares;

    #[test]
    fn shares_never_exceed_the_slots_when_they_suffice() {
        for sizes in [vec![1], vec![10_000], vec![5, 5, 5], vec![1, 9_999], vec![3; 24]] {
            for slots in [1, 2, 24, 100] {
                let got = shares(&sizes, slots);
                assert!(got.iter().all(|&s| s >= 1));
                if sizes.len() <= slots {
                    assert!(got.iter().sum::<usize>() <= slots, "{sizes:?} {slots}: {got:?}");
                }
            }
        }
        assert_eq!(shares(&[1, 9_999], 24), [1, 22]);
    }
}
