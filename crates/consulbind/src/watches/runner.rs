//! The runner of one group's blocking query: it follows the query with blocking requests,
//! hands each watched path its part of every answer, wakes the bindings whose content changed,
//! and reports failures once they outlast the grace period.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use consul_kv::{
    Backoff, Error, ErrorKind, KvEntry, KvQuery,
    group::{self, Members, WatchPath},
    index::{Cursor, Progress},
    jitter,
};
use consulbind_api::conditions::reason;
use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore, watch},
    time::Instant,
};
use tracing::{info, warn};

pub use super::{
    agent::{AGENT_TIMEOUT, watch_agent},
    source::{KvSource, Limits},
};
use super::{
    path::{Path, Update, View, Wake},
    retry::{wait_to_retry, went_down},
};
use crate::{Lock, metrics::Metrics};

/// The longest wait of a blocking query of a group in a lane, so that the lane's groups take turns.
pub const ROTATION_WAIT: Duration = Duration::from_secs(10);
/// How long a lane's turns may take to come round, as long as its waits are at least
/// [`MIN_WAIT`]: a lane of many groups on few slots waits less each time.
const LANE_CYCLE: Duration = Duration::from_secs(30);
/// The shortest wait of a blocking query.
pub(super) const MIN_WAIT: Duration = Duration::from_secs(1);
/// How soon a prefix found too large is read again: it rarely shrinks by itself.
const TOO_LARGE_RETRY: Duration = Duration::from_secs(60);
/// How often a key that Consul refused, missing from its shared read, is read alone again at
/// the group's next answer: its policy may have been granted, and the key need not exist for
/// that to show.
const DENIED_RECHECK: Duration = Duration::from_secs(30);

/// A path of a group that Consul would not read alone: its position, the reason and the message.
type Refused = (usize, &'static str, String);

/// A shared answer, cut down to what its paths cover, with the keys read alone merged in.
#[derive(Default)]
struct Confirmed {
    entries: Vec<KvEntry>,
    /// Keys Consul refused alone: their failure.
    refused: Vec<Refused>,
    /// Keys it had refused before and read alone now.
    granted: Vec<usize>,
}

/// Slots that the groups of one namespace take turns on, when it has more groups than its share.
pub struct Lane {
    pub slots: Semaphore,
    pub permits: usize,
    /// The wait of each of its blocking queries.
    pub wait: Duration,
    /// How long a full round of turns takes, at most: how late a change may show.
    pub cycle: Duration,
}

impl Lane {
    pub fn new(groups: usize, permits: usize) -> Self {
        let permits = permits.max(1);
        let rounds = groups.div_ceil(permits).max(1) as u32;
        let wait = (LANE_CYCLE / rounds).clamp(MIN_WAIT, ROTATION_WAIT);
        Self { slots: Semaphore::new(permits), permits, wait, cycle: wait * rounds }
    }
}

/// What every group's runner shares.
pub struct Runner {
    pub consul: Arc<dyn KvSource>,
    pub wake: Wake,
    pub metrics: Arc<Metrics>,
    /// How long requests may fail before the paths report it.
    pub grace: Duration,
    pub limits: Limits,
    /// Asks the planner to cut the groups afresh.
    pub replan: Notify,
    /// The blocking slots the groups were last planned for: the source may offer more once it
    /// knows it speaks HTTP/2.
    pub planned_slots: AtomicUsize,
    /// Those slots. A group with a slot of its own holds one as long as it keeps its slot; a
    /// group in a lane takes one for each turn. So when a re-plan starts groups while the
    /// retired ones finish their requests, only the new groups wait, never one that was kept.
    slots: std::sync::Mutex<Arc<Semaphore>>,
    /// Whether the agent answers, as [`watch_agent`] last found.
    pub agent: watch::Sender<Option<Error>>,
    /// Reads of parked groups go one at a time: a namespace can make refused tokens by the
    /// thousand, and their retries must not crowd the short reads every binding needs.
    pub parked_reads: Semaphore,
    /// When a group's request last had an answer of any kind from the agent.
    pub answered_at: std::sync::Mutex<Option<Instant>>,
    /// What the answers have shown of each KV table.
    tables: std::sync::Mutex<HashMap<Scope, Table>>,
    /// One copy of each entry across every answer.
    entries: super::entries::Entries,
    /// Held to apply an answer to its paths, and to read paths: a reading sees an answer on
    /// all of its paths or on none.
    pub answers: std::sync::RwLock<()>,
}

/// One KV table: a datacenter's, in a namespace and partition (Consul Enterprise).
type Scope = (Option<String>, Option<String>, Option<String>);

fn scope(query: &KvQuery) -> Scope {
    (query.datacenter.clone(), query.namespace.clone(), query.partition.clone())
}

/// What the answers have shown of one KV table. A missing key answers the table's index,
/// which only a restore or a rebuilt cluster takes below an index it answered before, so a key
/// watched alone that goes missing below it was lost, even where its own index did not go back
/// (a rebuilt cluster written past it before the watch read again).
#[derive(Default)]
struct Table {
    /// The highest index an answer showed since the table last went back.
    high: u64,
    /// How often it went back: answers to requests sent before then raise `high` no more.
    epoch: u64,
}

/// The paths one group's query serves, and how it may block.
pub struct Roster {
    pub paths: Vec<WatchPath>,
    pub cells: Vec<Arc<Path>>,
    members: Members,
    /// The slots the group takes turns on with the other groups of its namespace.
    lane: Option<Arc<Lane>>,
    /// Consul refuses the token of every path: the planner gave it no slot.
    parked: bool,
}

impl Roster {
    pub fn new(paths: Vec<WatchPath>, cells: Vec<Arc<Path>>, lane: Option<Arc<Lane>>, parked: bool) -> Self {
        Self { members: Members::new(&paths), paths, cells, lane, parked }
    }

    pub fn same(&self, other: &Roster) -> bool {
        self.paths == other.paths
            && self.cells.iter().zip(&other.cells).all(|(a, b)| Arc::ptr_eq(a, b))
            && self.parked == other.parked
            && match (&self.lane, &other.lane) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (a, b) => a.is_none() && b.is_none(),
            }
    }
}

impl Runner {
    pub fn new(consul: Arc<dyn KvSource>, wake: Wake, metrics: Arc<Metrics>, grace: Duration, limits: Limits) -> Self {
        let slots = consul.blocking_slots();
        Self {
            consul,
            wake,
            metrics,
            grace,
            limits,
            replan: Notify::new(),
            planned_slots: AtomicUsize::new(slots),
            slots: std::sync::Mutex::new(Arc::new(Semaphore::new(slots))),
            agent: watch::Sender::new(None),
            parked_reads: Semaphore::new(1),
            answered_at: Default::default(),
            tables: Default::default(),
            entries: Default::default(),
            answers: Default::default(),
        }
    }

    /// Plans for `slots` blocking slots from now on; groups holding one of the old count keep
    /// it until they let go.
    pub fn plan_slots(&self, slots: usize) {
        if self.planned_slots.swap(slots, Ordering::Relaxed) != slots {
            *self.slots.locked() = Arc::new(Semaphore::new(slots));
        }
    }

    fn slots(&self) -> Arc<Semaphore> {
        self.slots.locked().clone()
    }

    async fn slot(&self) -> OwnedSemaphorePermit {
        self.slots().acquire_owned().await.expect("never closed")
    }

    /// The highest index the table of `scope` answered, and its epoch.
    fn table(&self, scope: &Scope) -> (u64, u64) {
        self.tables.locked().get(scope).map_or((0, 0), |t| (t.high, t.epoch))
    }

    /// An answer to a request sent in `epoch` showed `index` of the table of `scope`.
    fn table_saw(&self, scope: &Scope, epoch: u64, index: u64) {
        let mut tables = self.tables.locked();
        let table = tables.entry(scope.clone()).or_default();
        if table.epoch == epoch {
            table.high = table.high.max(index);
        }
    }

    /// The table of `scope` went back to `index`.
    fn table_went_back(&self, scope: &Scope, index: u64) {
        let mut tables = self.tables.locked();
        let table = tables.entry(scope.clone()).or_default();
        *table = Table { high: index, epoch: table.epoch + 1 };
    }

    /// Follows one group's query with blocking requests until aborted or retired (the roster's
    /// sender dropped), and hands each path its part of every answer. The group's key never
    /// changes, so any answer covers whatever paths the roster holds when it arrives.
    pub async fn run_group(self: Arc<Self>, query: KvQuery, mut roster: watch::Receiver<Arc<Roster>>) {
        let born = Instant::now();
        let mut cursor = Cursor::default();
        // Capped low, so that once Consul answers again the status shows it within seconds.
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        // The roster and the entries its paths need, as of the last answer every path was told of.
        let mut last: Option<(Arc<Roster>, Arc<[KvEntry]>)> = None;
        let mut failing_since: Option<Instant> = None;
        // A reset seen but not yet told: the read after it may fail, and the one after that
        // looks fresh.
        let mut untold_reset = false;
        let mut denied_checked = Instant::now();
        let mut agent = self.agent.subscribe();
        let table = scope(&query);
        // A group with a slot of its own keeps it, and the source's lease, across its queries.
        let mut own_slot: Option<(OwnedSemaphorePermit, Option<consul_kv::Lease>)> = None;
        loop {
            if roster.has_changed().is_err() {
                return;
            }
            let index = if last.is_some() { cursor.index() } else { 0 };
            let started = Instant::now();
            let (_, epoch) = self.table(&table);
            let (limit, lane, parked) = {
                let current = roster.borrow();
                (answer_limit(&self.limits, &current), current.lane.clone(), current.parked)
            };
            let wait = self.group_wait(born, lane.as_ref().map(|l| l.wait));
            // Planned anew for other slots (the protocol changed): take them afresh.
            let replanned = own_slot.as_ref().is_some_and(|(slot, _)| !Arc::ptr_eq(slot.semaphore(), &self.slots()));
            if lane.is_some() || parked || replanned {
                own_slot = None;
            }
            // Scoped, so that a request given up is dropped before any backoff.
            let result = {
                let request = async {
                    // A blocking query in a lane waits for its turn; a plain read needs none.
                    let _turn = match (&lane, index) {
                        (Some(lane), 1..) => {
                            let turn = lane.slots.acquire().await.expect("never closed");
                            Some((turn, self.slot().await))
                        }
                        _ => None,
                    };
                    if lane.is_none() && !parked && index >= 1 && own_slot.is_none() {
                        own_slot = Some((self.slot().await, self.consul.lease().await));
                    }
                    let lease = own_slot.as_ref().and_then(|(_, lease)| lease.as_ref()).filter(|_| index >= 1);
                    // A parked group whose token was just accepted blocks until the planner gives
                    // it a slot; that wait holds up no one.
                    let _parked = match (parked, index) {
                        (true, 0) => Some(self.parked_reads.acquire().await.expect("never closed")),
                        _ => None,
                    };
                    match lease {
                        Some(lease) => self.consul.get_leased(lease, &query, index, wait, limit).await,
                        None => self.consul.get_wait(&query, index, wait, limit).await,
                    }
                };
                tokio::pin!(request);
                loop {
                    tokio::select! {
                        result = &mut request => break Some(result),
                        // A hung agent answers nothing until the request times out, minutes away.
                        down = went_down(&mut agent) => break Some(Err(down)),
                        // New paths need their content now. Short reads of just those paths give it
                        // to them; the blocking query goes on, since one given up keeps a connection
                        // busy on the Consul agent until its wait runs out.
                        changed = roster.changed(), if index != 0 => {
                            if changed.is_err() {
                                // Retired: finish the request, tell no one.
                                let _ = (&mut request).await;
                                return;
                            }
                            let members = roster.borrow_and_update().clone();
                            let Some((before, entries)) = last.take() else { break None };
                            match self.read_new_paths(&query, &before, &members, entries).await {
                                Some(entries) => last = Some((members, entries)),
                                None => break None,
                            }
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
            self.metrics.consul_request(result.as_ref().err().map(|e| e.kind()), started.elapsed());
            if result.as_ref().err().is_none_or(|e| e.kind() != ErrorKind::Unreachable) {
                *self.answered_at.locked() = Some(Instant::now());
            }
            let members = roster.borrow_and_update().clone();
            match result {
                Ok(response) => {
                    backoff.reset();
                    failing_since = None;
                    let slots_moved = self.consul.blocking_slots() != self.planned_slots.load(Ordering::Relaxed);
                    if members.parked || slots_moved {
                        // The token is accepted again, or the slots changed: plan again.
                        self.replan.notify_one();
                    }
                    let missing = !query.recurse && !response.entries.iter().any(|e| *e.key == *query.key);
                    let floor = if missing { self.table(&table).0 } else { 0 };
                    let progress = cursor.answered_above(response.index, floor);
                    if progress == Progress::Suspect {
                        // Nothing is told until a second read agrees.
                        info!(key = %query.key, index = response.index, "Consul's index went backwards; reading again before believing it");
                        tokio::time::sleep(MIN_WAIT).await;
                        continue;
                    }
                    let reset = progress == Progress::Reset || untold_reset;
                    match progress {
                        Progress::Reset => {
                            warn!(key = %query.key, index = response.index, "Consul's index went backwards (a restore or a rebuilt cluster?); reading afresh");
                            // A prefix's index also goes back when its tombstones are reaped;
                            // a missing key's is its table's.
                            if missing {
                                self.table_went_back(&table, response.index);
                            }
                        }
                        _ => {
                            let seen = response.entries.iter().map(|e| e.modify_index).max().unwrap_or(0);
                            self.table_saw(&table, epoch, seen.max(response.index));
                        }
                    }
                    let seen =
                        last.take().filter(|(seen, _)| Arc::ptr_eq(seen, &members) && !reset).map(|(_, old)| old);
                    let recheck = denied_checked.elapsed() >= DENIED_RECHECK;
                    if recheck {
                        denied_checked = Instant::now();
                    }
                    let confirm = self.confirm_vanished(&query, &members, response.entries, seen.as_deref(), recheck);
                    match confirm.await {
                        Ok(confirmed) => {
                            last =
                                Some(self.deliver(&query, &members, confirmed, seen.as_deref(), reset, response.index));
                            untold_reset = false;
                        }
                        // Read the whole group afresh; nothing was told.
                        Err(error) => {
                            untold_reset = reset;
                            cursor.failed();
                            warn!(key = %query.key, %error, "could not confirm a key missing from a shared read");
                            tokio::time::sleep(backoff.next_delay()).await;
                        }
                    }
                }
                Err(error) if error.kind() == ErrorKind::TooLarge => {
                    cursor.failed();
                    last = None;
                    self.too_large(&query, &members, &error);
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
                            if cell.set_failed(reason, &message) {
                                cell.wake(&self.wake);
                            }
                        }
                        if reason == reason::ACCESS_DENIED && !members.parked {
                            // A refused token blocks nothing: park it, and free its slot.
                            self.replan.notify_one();
                        }
                    };
                    let due = *failing_since.get_or_insert_with(Instant::now) + self.grace;
                    wait_to_retry(&mut agent, due, Instant::now() + delay, report).await;
                }
            }
        }
    }

    /// A shared read too large is split into reads of their own; a path too large alone fails.
    fn too_large(&self, query: &KvQuery, members: &Roster, error: &Error) {
        if members.cells.len() > 1 {
            info!(key = %query.key, paths = members.cells.len(), "a shared Consul read was too large; its paths are read on their own");
            members.cells.iter().for_each(|c| c.set_solo());
            self.replan.notify_one();
            return;
        }
        warn!(key = %query.key, %error, "a bound Consul prefix is over the limit");
        let message = format!(
            "{error}: the prefix holds more than --max-prefix-bytes ({} bytes of keys and values) allows; bind a \
             narrower prefix, or ask for a higher limit",
            self.limits.bytes
        );
        for cell in &members.cells {
            if cell.set_failed(reason::PREFIX_TOO_LARGE, &message) {
                cell.wake(&self.wake);
            }
        }
    }

    /// Reads the paths of `members` that `before` did not have, each alone, and merges them
    /// into `entries`. `None` when a read failed.
    async fn read_new_paths(
        &self,
        query: &KvQuery,
        before: &Roster,
        members: &Roster,
        entries: Arc<[KvEntry]>,
    ) -> Option<Arc<[KvEntry]>> {
        let new: Vec<usize> = {
            // Addresses as numbers: raw pointers cannot be held across an await.
            let known: HashSet<usize> = before.cells.iter().map(|c| Arc::as_ptr(c) as usize).collect();
            (0..members.cells.len()).filter(|&i| !known.contains(&(Arc::as_ptr(&members.cells[i]) as usize))).collect()
        };
        let reads = new.iter().map(|&i| {
            let path = &members.paths[i];
            let query = KvQuery { key: path.key.clone(), recurse: path.recurse, ..query.clone() };
            let limit = self.limits.answer_bytes(path.recurse);
            async move { self.consul.get_wait(&query, 0, MIN_WAIT, limit).await }
        });
        let reads = futures::future::join_all(reads).await;
        let mut merged = entries.to_vec();
        let mut indexes = Vec::new();
        for (&i, read) in new.iter().zip(reads) {
            let response = read.ok()?;
            group::merge(&mut merged, &members.paths[i], response.entries);
            indexes.push((i, response.index));
        }
        let held = self.entries.share(&mut merged);
        self.metrics.consul_entries.set(held as i64);
        let entries: Arc<[KvEntry]> = merged.into();
        let applying = self.answers.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut news = Vec::new();
        for (i, path) in members.paths.iter().enumerate() {
            let view = View::new(entries.clone(), group::span(&entries, path));
            match indexes.iter().find(|(new, _)| *new == i) {
                Some(&(_, index)) => {
                    if self.hand_over(path, &members.cells[i], view, false, Some(index)) != Update::Same {
                        news.push(&members.cells[i]);
                    }
                }
                None => members.cells[i].rebase(view),
            }
        }
        drop(applying);
        news.into_iter().for_each(|cell| cell.wake(&self.wake));
        Some(entries)
    }

    /// Consul filters a recursive read by the token's ACL without a word, so a key the token may
    /// no longer read looks deleted. Each exact key that goes missing from a shared recursive
    /// read (or is missing from a fresh one) is read alone under the same token: a 404 confirms
    /// it is gone, and its content is merged in if it is there after all. A 403, or a 400 for a
    /// key Consul refuses, is that key's failure alone, returned with its reason and message;
    /// any other failure fails the whole answer.
    async fn confirm_vanished(
        &self,
        query: &KvQuery,
        members: &Roster,
        entries: Vec<KvEntry>,
        old: Option<&[KvEntry]>,
        recheck_denied: bool,
    ) -> Result<Confirmed, Error> {
        let mut entries = members.members.retain(entries);
        if !query.recurse {
            return Ok(Confirmed { entries, ..Confirmed::default() });
        }
        let vanished: Vec<usize> = (0..members.paths.len())
            .filter(|&i| {
                let path = &members.paths[i];
                !path.recurse
                    && group::select(&entries, path).is_empty()
                    && (old.is_none_or(|old| !group::select(old, path).is_empty())
                        || (recheck_denied && members.cells[i].denied()))
            })
            .collect();
        let reads = vanished.iter().map(|&i| {
            let query = KvQuery { key: members.paths[i].key.clone(), recurse: false, ..query.clone() };
            async move { self.consul.get_wait(&query, 0, MIN_WAIT, self.limits.answer_bytes(false)).await }
        });
        let (mut refused, mut granted) = (Vec::new(), Vec::new());
        for (&i, read) in vanished.iter().zip(futures::future::join_all(reads).await) {
            match read {
                Ok(response) => {
                    if members.cells[i].denied() {
                        granted.push(i);
                    }
                    group::merge(&mut entries, &members.paths[i], response.entries)
                }
                Err(error) if error.kind() == ErrorKind::AccessDenied => {
                    refused.push((i, reason::ACCESS_DENIED, error.to_string()))
                }
                Err(error) if error.is_bad_request() => refused.push((i, reason::CONSUL_ERROR, error.to_string())),
                Err(error) => return Err(error),
            }
        }
        Ok(Confirmed { entries, refused, granted })
    }

    /// Hands each path of `members` its part of `entries` (already cut down to what the paths
    /// cover, by [`Runner::confirm_vanished`]): only the paths whose entries differ
    /// from `old`, or all of them without `old`, and its failure to each `refused` one. Wakes the bindings of paths whose content changed or came back after a failure.
    /// `reset` says the index went backwards with this answer, `index` is the answer's.
    fn deliver(
        &self,
        query: &KvQuery,
        members: &Arc<Roster>,
        Confirmed { mut entries, refused, granted }: Confirmed,
        old: Option<&[KvEntry]>,
        reset: bool,
        index: u64,
    ) -> (Arc<Roster>, Arc<[KvEntry]>) {
        let held = self.entries.share(&mut entries);
        self.metrics.consul_entries.set(held as i64);
        let entries: Arc<[KvEntry]> = entries.into();
        let mut changed: Vec<usize> = match old {
            Some(old) => members.members.changed(old, &entries),
            None => (0..members.paths.len()).collect(),
        };
        // A key Consul refused before and reads now may hold what it held then: no change of
        // entries, but news to its bindings.
        for i in granted {
            if !changed.contains(&i) {
                changed.push(i);
            }
        }
        // Every path takes its part of the answer before any binding hears of it, and a reconcile
        // reads the paths before or after, never between: a binding reading overlapping paths
        // must not roll their mix and then the whole (two rollouts for one change).
        let applying = self.answers.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut news = Vec::new();
        for (i, reason, message) in &refused {
            let cell = &members.cells[*i];
            if cell.set_failed(reason, message) {
                warn!(key = %members.paths[*i].key, %message, "Consul refused to read a bound key");
                news.push(cell);
            }
        }
        let mut is_changed = vec![false; members.paths.len()];
        changed.into_iter().for_each(|i| is_changed[i] = true);
        for (i, path) in members.paths.iter().enumerate() {
            if refused.iter().any(|(r, ..)| *r == i) {
                continue;
            }
            let view = View::new(entries.clone(), group::span(&entries, path));
            if !is_changed[i] {
                members.cells[i].rebase(view);
                continue;
            }
            let own = (path.key == query.key && path.recurse == query.recurse).then_some(index);
            let update = self.hand_over(path, &members.cells[i], view, reset, own);
            if update == Update::Changed {
                info!(key = %path.key, recurse = path.recurse, index, "Consul content changed");
            }
            if update != Update::Same {
                news.push(&members.cells[i]);
            }
        }
        drop(applying);
        news.into_iter().for_each(|cell| cell.wake(&self.wake));
        (members.clone(), entries)
    }

    /// Gives one path its entries, or the `PrefixTooLarge` failure when they are over the
    /// limits; the caller wakes its bindings when that is news.
    fn hand_over(&self, path: &WatchPath, cell: &Path, entries: View, reset: bool, index: Option<u64>) -> Update {
        let limits = &self.limits;
        let bytes: u64 = entries.iter().map(|e| e.key.len() as u64 + e.size).sum();
        if path.recurse && (entries.len() > limits.entries || bytes > limits.bytes) {
            let message = format!(
                "the prefix {:?} holds {} keys and {bytes} bytes, over the limit of {} keys \
                 (--max-prefix-entries) and {} bytes (--max-prefix-bytes); bind a narrower prefix, or ask for a \
                 higher limit",
                path.key,
                entries.len(),
                limits.entries,
                limits.bytes
            );
            match cell.set_failed(reason::PREFIX_TOO_LARGE, &message) {
                true => Update::Changed,
                false => Update::Same,
            }
        } else {
            cell.set_view(entries, reset, index)
        }
    }

    /// The wait of a group's next blocking query. A young group waits no longer than it has
    /// lived, so that one replaced soon after it started (while many bindings arrive at once)
    /// leaves no request behind on the agent for long; and groups in a lane take turns.
    fn group_wait(&self, born: Instant, lane_wait: Option<Duration>) -> Duration {
        let wait = lane_wait.map_or(self.consul.wait(), |w| w.min(self.consul.wait()));
        jitter(wait.min(born.elapsed().max(MIN_WAIT)), 0.1)
    }
}

/// The most bytes a group's answer may have: what its paths may hold together, but never more
/// than one path may. Answers are held whole while they are read, so a tenant's many small keys
/// must not make room for a huge one; a shared read over the limit is split into reads of
/// their own.
fn answer_limit(limits: &Limits, roster: &Roster) -> u64 {
    let together = roster.paths.iter().fold(0u64, |sum, p| sum.saturating_add(limits.answer_bytes(p.recurse)));
    together.min(limits.answer_bytes(false))
}

#[cfg(test)]
mod tests;
