//! The runner of one group's blocking query: it follows the query with blocking requests,
//! hands each watched path its part of every answer, wakes the bindings whose content changed,
//! and reports failures once they outlast the grace period. How an answer reaches the paths is
//! in `delivery`, what a group serves in `roster`, and what the answers showed of each KV table
//! in `tables`.

mod delivery;
mod roster;
mod tables;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use consul_kv::{
    Backoff, Error, ErrorKind, KvEntry, KvQuery, KvResponse,
    index::{Cursor, Progress},
    jitter,
};
use consulbind_api::conditions::reason;
use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore, watch},
    time::Instant,
};
use tracing::{info, warn};

pub(super) use self::roster::MIN_WAIT;
pub use self::roster::{Lane, ROTATION_WAIT, Roster};
use self::tables::{Scope, Tables, scope};
pub use super::{
    agent::{AGENT_TIMEOUT, watch_agent},
    source::{KvSource, Limits},
};
use super::{
    path::Wake,
    retry::{wait_to_retry, went_down},
};
use crate::{Lock, metrics::Metrics};

/// How soon a prefix found too large is read again: it rarely shrinks by itself.
const TOO_LARGE_RETRY: Duration = Duration::from_secs(60);
/// How long after a group stops its entries are swept: one sweep serves every group that a
/// re-plan or a tenant's leaving stops at once.
const RETIRED_SWEEP: Duration = Duration::from_secs(5);
/// The longest a path that Consul refused, missing from its shared read, goes without being read
/// alone again: its policy may have been granted, and the key need not exist for that to show.
/// Its group's blocking query waits less meanwhile, so that an answer comes in time; and it is
/// read at most twice as often, whatever the group's other keys do.
const DENIED_RECHECK: Duration = Duration::from_secs(10);
/// A group's blocking wait while one of its paths is refused: with the agent's jitter (a
/// sixteenth) and ours (a tenth), an answer within [`DENIED_RECHECK`].
const DENIED_WAIT: Duration = Duration::from_secs(8);

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
    tables: Tables,
    /// One copy of each entry across every answer.
    entries: super::entries::Entries,
    /// A sweep of `entries` is scheduled.
    sweep_due: AtomicBool,
    /// Held to apply an answer to its paths, and to read paths: a reading sees an answer on
    /// all of its paths or on none.
    pub answers: std::sync::RwLock<()>,
}

/// What the runner of one group carries from one request to the next.
struct GroupState {
    query: KvQuery,
    /// The KV table the query reads.
    table: Scope,
    born: Instant,
    cursor: Cursor,
    backoff: Backoff,
    /// The roster and the entries its paths need, as of the last answer every path was told of.
    last: Option<(Arc<Roster>, Arc<[KvEntry]>)>,
    failing_since: Option<Instant>,
    /// A reset seen but not yet told: the read after it may fail, and the one after that
    /// looks fresh.
    untold_reset: bool,
    denied_checked: Instant,
    agent: watch::Receiver<Option<Error>>,
    /// A group with a slot of its own keeps it, and the source's lease, across its queries.
    own_slot: Option<(OwnedSemaphorePermit, Option<consul_kv::Lease>)>,
}

/// Tells the runner when a group's task ends, retired or aborted.
struct Retired(Arc<Runner>);

impl Drop for Retired {
    fn drop(&mut self) {
        self.0.retired();
    }
}

/// How one request of a group's query ended.
enum Asked {
    Answered(Result<KvResponse, Error>),
    /// A new path could not be read alone: read the whole group afresh instead.
    Again,
    /// The group was retired while it waited.
    Retired,
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
            sweep_due: AtomicBool::new(false),
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

    /// Follows one group's query with blocking requests until aborted or retired (the roster's
    /// sender dropped), and hands each path its part of every answer. The group's key never
    /// changes, so any answer covers whatever paths the roster holds when it arrives.
    pub async fn run_group(self: Arc<Self>, query: KvQuery, mut roster: watch::Receiver<Arc<Roster>>) {
        let _retired = Retired(self.clone());
        let mut group = GroupState {
            table: scope(&query),
            query,
            born: Instant::now(),
            cursor: Cursor::default(),
            // Capped low, so that once Consul answers again the status shows it within seconds.
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(10)),
            last: None,
            failing_since: None,
            untold_reset: false,
            denied_checked: Instant::now(),
            agent: self.agent.subscribe(),
            own_slot: None,
        };
        loop {
            if roster.has_changed().is_err() {
                return;
            }
            let index = if group.last.is_some() { group.cursor.index() } else { 0 };
            let started = Instant::now();
            let (_, epoch) = self.tables.get(&group.table);
            let result = match self.ask(&mut group, &mut roster, index).await {
                Asked::Answered(result) => result,
                Asked::Again => continue,
                Asked::Retired => return,
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
                Ok(response) => self.answered(&mut group, &members, response, epoch).await,
                Err(error) if error.kind() == ErrorKind::TooLarge => {
                    group.cursor.failed();
                    group.last = None;
                    self.too_large(&group.query, &members, &error);
                    // Until the planner regroups these paths, or a while has passed.
                    tokio::select! {
                        changed = roster.changed() => if changed.is_err() { return },
                        _ = tokio::time::sleep(TOO_LARGE_RETRY) => {}
                    }
                }
                Err(error) => self.failed(&mut group, &members, error).await,
            }
        }
    }

    /// A group stopped: the entries only it held can go, a while later, so that one sweep
    /// serves every group stopped with it. Without this, the store would stay at its peak once
    /// a tenant leaves, as answers that grow it are what sweep it otherwise.
    fn retired(self: &Arc<Self>) {
        if self.sweep_due.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let runner = self.clone();
        runtime.spawn(async move {
            tokio::time::sleep(RETIRED_SWEEP).await;
            runner.sweep_due.store(false, Ordering::Relaxed);
            let held = runner.entries.sweep();
            runner.metrics.consul_entries.set(held as i64);
        });
    }

    /// Sends the group's next request at `index`, and while a blocking one waits, reads the
    /// paths that join the group. The request is dropped when this returns, so a request given
    /// up is never held through a backoff.
    async fn ask(&self, group: &mut GroupState, roster: &mut watch::Receiver<Arc<Roster>>, index: u64) -> Asked {
        let GroupState { query, born, last, agent, own_slot, .. } = group;
        let query = &*query;
        let (limit, lane, parked, denied) = {
            let current = roster.borrow();
            let denied = current.cells.iter().any(|c| c.denied());
            (answer_limit(&self.limits, &current), current.lane.clone(), current.parked, denied)
        };
        let mut wait = self.group_wait(*born, lane.as_ref().map(|l| l.wait));
        if denied {
            wait = wait.min(jitter(DENIED_WAIT, 0.1));
        }
        // Planned anew for other slots (the protocol changed): take them afresh.
        let replanned = own_slot.as_ref().is_some_and(|(slot, _)| !Arc::ptr_eq(slot.semaphore(), &self.slots()));
        if lane.is_some() || parked || replanned {
            *own_slot = None;
        }
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
                *own_slot = Some((self.slot().await, self.consul.lease().await));
            }
            let lease = own_slot.as_ref().and_then(|(_, lease)| lease.as_ref()).filter(|_| index >= 1);
            // A parked group whose token was just accepted blocks until the planner gives
            // it a slot; that wait holds up no one.
            let _parked = match (parked, index) {
                (true, 0) => Some(self.parked_reads.acquire().await.expect("never closed")),
                _ => None,
            };
            match lease {
                Some(lease) => self.consul.get_leased(lease, query, index, wait, limit).await,
                None => self.consul.get_wait(query, index, wait, limit).await,
            }
        };
        tokio::pin!(request);
        loop {
            tokio::select! {
                result = &mut request => break Asked::Answered(result),
                // A hung agent answers nothing until the request times out, minutes away.
                down = went_down(agent) => break Asked::Answered(Err(down)),
                // New paths need their content now. Short reads of just those paths give it
                // to them; the blocking query goes on, since one given up keeps a connection
                // busy on the Consul agent until its wait runs out.
                changed = roster.changed(), if index != 0 => {
                    if changed.is_err() {
                        // Retired: finish the request, tell no one.
                        let _ = (&mut request).await;
                        return Asked::Retired;
                    }
                    let members = roster.borrow_and_update().clone();
                    let Some((before, entries)) = last.take() else { break Asked::Again };
                    // The request goes on meanwhile: left unpolled, it keeps what it holds (its
                    // connection, perhaps one of the two readers of answer bodies) from reads
                    // that wait for it, and neither ends. Its answer, if first, covers the new
                    // paths too.
                    let reads = self.read_new_paths(query, &before, &members, entries);
                    let read = tokio::select! {
                        read = reads => read,
                        result = &mut request => break Asked::Answered(result),
                    };
                    match read {
                        Some(entries) => *last = Some((members, entries)),
                        None => break Asked::Again,
                    }
                }
            }
        }
    }

    /// Takes an answer: tells the paths what changed, once the index is believed and the keys
    /// missing from a shared read are confirmed.
    async fn answered(&self, group: &mut GroupState, members: &Arc<Roster>, response: KvResponse, epoch: u64) {
        let query = &group.query;
        group.backoff.reset();
        group.failing_since = None;
        let slots_moved = self.consul.blocking_slots() != self.planned_slots.load(Ordering::Relaxed);
        if members.parked || slots_moved {
            // The token is accepted again, or the slots changed: plan again.
            self.replan.notify_one();
        }
        let missing = !query.recurse && !response.entries.iter().any(|e| *e.key == *query.key);
        let floor = if missing { self.tables.get(&group.table).0 } else { 0 };
        let progress = group.cursor.answered_above(response.index, floor);
        if progress == Progress::Suspect {
            // Nothing is told until a second read agrees.
            info!(key = %query.key, index = response.index, "Consul's index went backwards; reading again before believing it");
            tokio::time::sleep(MIN_WAIT).await;
            return;
        }
        let reset = progress == Progress::Reset || group.untold_reset;
        match progress {
            Progress::Reset => {
                warn!(key = %query.key, index = response.index, "Consul's index went backwards (a restore or a rebuilt cluster?); reading afresh");
                // A prefix's index also goes back when its tombstones are reaped;
                // a missing key's is its table's.
                if missing {
                    self.tables.went_back(&group.table, response.index);
                }
            }
            _ => {
                let seen = response.entries.iter().map(|e| e.modify_index).max().unwrap_or(0);
                self.tables.saw(&group.table, epoch, seen.max(response.index));
            }
        }
        let seen = group.last.take().filter(|(seen, _)| Arc::ptr_eq(seen, members) && !reset).map(|(_, old)| old);
        let recheck = group.denied_checked.elapsed() >= DENIED_RECHECK / 2;
        if recheck {
            group.denied_checked = Instant::now();
        }
        let confirm = self.confirm_vanished(query, members, response.entries, seen.as_deref(), recheck);
        match confirm.await {
            Ok(confirmed) => {
                group.last = Some(self.deliver(query, members, confirmed, seen.as_deref(), reset, response.index));
                group.untold_reset = false;
            }
            // Read the whole group afresh; nothing was told.
            Err(error) => {
                group.untold_reset = reset;
                group.cursor.failed();
                warn!(key = %query.key, %error, "could not confirm a key missing from a shared read");
                tokio::time::sleep(group.backoff.next_delay()).await;
            }
        }
    }

    /// Takes a failed request: each path reports it once it outlasts the grace period, and the
    /// group retries after a backoff.
    async fn failed(&self, group: &mut GroupState, members: &Roster, error: Error) {
        group.cursor.failed();
        group.last = None;
        let reason = match error.kind() {
            ErrorKind::AccessDenied => reason::ACCESS_DENIED,
            ErrorKind::Unreachable => reason::CONSUL_UNREACHABLE,
            _ => reason::CONSUL_ERROR,
        };
        let delay = group.backoff.next_delay();
        let query = &group.query;
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
        let due = *group.failing_since.get_or_insert_with(Instant::now) + self.grace;
        wait_to_retry(&mut group.agent, due, Instant::now() + delay, report).await;
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
    let together = roster.paths().iter().fold(0u64, |sum, p| sum.saturating_add(limits.answer_bytes(p.recurse)));
    together.min(limits.answer_bytes(false))
}

#[cfg(test)]
mod tests;
