//! The runner against a scripted Consul: each request reaches the test, which answers it (or
//! not), with Tokio's clock paused so that backoffs and the grace period pass at once.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use consul_kv::{Error, KvEntry, KvQuery, KvResponse, group::WatchPath};
use consulbind_api::conditions::reason;
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
    time::Instant,
};

use super::{DENIED_RECHECK, KvSource, Lane, Limits, RETIRED_SWEEP, ROTATION_WAIT, Roster, Runner};
use crate::{
    BindingRef, Lock,
    metrics::Metrics,
    watches::path::{KeyState, Path},
};

const GRACE: Duration = Duration::from_secs(5);

struct Request {
    query: KvQuery,
    index: u64,
    wait: Duration,
    answer: oneshot::Sender<Result<KvResponse, Error>>,
}

impl Request {
    fn reply(self, index: u64, entries: &[(&str, &str, u64)]) {
        let entries = entries.iter().map(|&(k, v, i)| entry(k, v, i)).collect();
        let _ = self.answer.send(Ok(KvResponse { index, entries }));
    }

    fn fail(self, error: Error) {
        let _ = self.answer.send(Err(error));
    }
}

/// Hands every request to the test; one the test drops unanswered blocks for ever.
struct Script(mpsc::UnboundedSender<Request>);

impl KvSource for Script {
    fn get_wait<'a>(
        &'a self,
        query: &'a KvQuery,
        index: u64,
        wait: Duration,
        _max_bytes: u64,
    ) -> BoxFuture<'a, Result<KvResponse, Error>> {
        let (answer, answered) = oneshot::channel();
        let _ = self.0.send(Request { query: query.clone(), index, wait, answer });
        Box::pin(async move {
            match answered.await {
                Ok(result) => result,
                Err(_) => std::future::pending().await,
            }
        })
    }

    fn blocking_slots(&self) -> usize {
        20
    }

    fn wait(&self) -> Duration {
        Duration::from_secs(300)
    }

    fn alive(&self, _timeout: Duration) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }

    fn address(&self) -> &str {
        "http://127.0.0.1:8500"
    }
}

fn entry(key: &str, value: &str, modify_index: u64) -> KvEntry {
    KvEntry::new(key, value, modify_index)
}

fn binding(name: &str) -> BindingRef {
    BindingRef::new("ns", name)
}

fn unreachable() -> Error {
    Error::Unreachable { address: "http://127.0.0.1:8500".into(), detail: "connection refused".into() }
}

/// One group's runner, its paths, and what it woke.
struct Group {
    runner: Arc<Runner>,
    requests: mpsc::UnboundedReceiver<Request>,
    woken: Arc<Mutex<Vec<BindingRef>>>,
    roster: Option<watch::Sender<Arc<Roster>>>,
    cells: Vec<Arc<Path>>,
    paths: Vec<WatchPath>,
    task: JoinHandle<()>,
}

/// Answers reads like [`Script`]; its status check never answers in time.
struct SlowCheck(Script);

impl KvSource for SlowCheck {
    fn get_wait<'a>(
        &'a self,
        query: &'a KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
    ) -> BoxFuture<'a, Result<KvResponse, Error>> {
        self.0.get_wait(query, index, wait, max_bytes)
    }

    fn blocking_slots(&self) -> usize {
        self.0.blocking_slots()
    }

    fn wait(&self) -> Duration {
        self.0.wait()
    }

    fn alive(&self, timeout: Duration) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            tokio::time::sleep(timeout).await;
            Err(unreachable())
        })
    }

    fn address(&self) -> &str {
        self.0.address()
    }
}

/// Answers reads like [`Script`], with the client's blocking slots: a blocking query waits in
/// line for one and holds it until answered.
struct Slotted(Script, Arc<tokio::sync::Semaphore>);

impl KvSource for Slotted {
    fn get_wait<'a>(
        &'a self,
        query: &'a KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
    ) -> BoxFuture<'a, Result<KvResponse, Error>> {
        Box::pin(async move {
            let _slot = match index {
                0 => None,
                _ => Some(self.1.acquire().await.expect("never closed")),
            };
            self.0.get_wait(query, index, wait, max_bytes).await
        })
    }

    fn blocking_slots(&self) -> usize {
        self.1.available_permits()
    }

    fn wait(&self) -> Duration {
        self.0.wait()
    }

    fn alive(&self, timeout: Duration) -> BoxFuture<'_, Result<(), Error>> {
        self.0.alive(timeout)
    }

    fn address(&self) -> &str {
        self.0.address()
    }
}

/// A runner that sends every request to the returned channel, and records what it wakes.
fn runner(limits: Limits) -> (Arc<Runner>, mpsc::UnboundedReceiver<Request>, Arc<Mutex<Vec<BindingRef>>>) {
    runner_over(limits, |tx| Arc::new(Script(tx)))
}

fn runner_over(
    limits: Limits,
    source: impl FnOnce(mpsc::UnboundedSender<Request>) -> Arc<dyn KvSource>,
) -> (Arc<Runner>, mpsc::UnboundedReceiver<Request>, Arc<Mutex<Vec<BindingRef>>>) {
    let (tx, requests) = mpsc::unbounded_channel();
    let woken = Arc::new(Mutex::new(Vec::new()));
    let wake = {
        let woken = woken.clone();
        Arc::new(move |b| woken.locked().push(b))
    };
    let runner = Runner::new(source(tx), wake, Arc::new(Metrics::new(&mut Registry::default())), GRACE, limits);
    runner.plan_slots(20);
    let runner = Arc::new(runner);
    (runner, requests, woken)
}

/// Cells for `paths`, each `(key, recurse, subscribers)`.
fn cells(paths: &[(&str, bool, &[&str])]) -> (Vec<WatchPath>, Vec<Arc<Path>>) {
    paths
        .iter()
        .map(|&(key, recurse, subscribers)| {
            let cell = Arc::new(Path::default());
            subscribers.iter().for_each(|b| cell.subscribe(&binding(b)));
            (WatchPath { key: key.into(), recurse }, cell)
        })
        .unzip()
}

/// Starts a runner of `query` over `paths`, each `(key, recurse, subscribers)`.
fn start(query: KvQuery, paths: &[(&str, bool, &[&str])], limits: Limits) -> Group {
    let (runner, requests, woken) = runner(limits);
    let (watch_paths, cells) = cells(paths);
    let (roster, rx) = watch::channel(Arc::new(Roster::new(watch_paths.clone(), cells.clone(), None, false)));
    let task = tokio::spawn(runner.clone().run_group(query, rx));
    Group { runner, requests, woken, roster: Some(roster), cells, paths: watch_paths, task }
}

fn no_limits() -> Limits {
    Limits { entries: usize::MAX, bytes: u64::MAX }
}

impl Group {
    async fn request(&mut self) -> Request {
        tokio::time::timeout(Duration::from_secs(600), self.requests.recv())
            .await
            .expect("the runner sent no request")
            .expect("the runner stopped")
    }

    /// Lets the runner act on everything sent to it so far.
    async fn settle(&self) {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// The bindings woken since the last look, each once.
    fn woken(&self) -> BTreeSet<String> {
        self.woken.locked().drain(..).map(|b| b.name().to_owned()).collect()
    }

    fn content(&self, i: usize) -> Vec<(String, String)> {
        match self.cells[i].state() {
            KeyState::Ready(content) => {
                content.entries.iter().map(|e| (e.key.to_string(), String::from_utf8_lossy(&e.value).into())).collect()
            }
            other => panic!("path {i} is not ready: {other:?}"),
        }
    }

    /// Hands the runner a new roster: `added` paths beside the ones it has.
    fn add_paths(&mut self, added: &[(&str, bool, &[&str])]) {
        for &(key, recurse, subscribers) in added {
            let cell = Arc::new(Path::default());
            subscribers.iter().for_each(|b| cell.subscribe(&binding(b)));
            self.paths.push(WatchPath { key: key.into(), recurse });
            self.cells.push(cell);
        }
        let roster = Roster::new(self.paths.clone(), self.cells.clone(), None, false);
        self.roster.as_ref().unwrap().send_replace(Arc::new(roster));
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn an_answer_wakes_only_the_bindings_whose_content_changed() {
    let mut group = start(
        KvQuery::prefix("app/"),
        &[("app/a", false, &["one"]), ("app/b", false, &["two"]), ("app/c/", true, &["three", "one"])],
        no_limits(),
    );
    let first = group.request().await;
    assert_eq!((&*first.query.key, first.index), ("app/", 0), "the first read does not block");
    first.reply(10, &[("app/a", "1", 5), ("app/b", "1", 6), ("app/c/x", "1", 7), ("app/unbound", "1", 8)]);

    let second = group.request().await;
    assert_eq!(second.index, 10, "then it blocks on the index Consul gave");
    assert_eq!(group.woken(), names(&["one", "two", "three"]), "the first answer wakes every binding");
    assert_eq!(group.content(2), [("app/c/x".to_owned(), "1".to_owned())], "a path gets only its own keys");

    second.reply(11, &[("app/a", "1", 5), ("app/b", "2", 11), ("app/c/x", "1", 7), ("app/unbound", "1", 8)]);
    let third = group.request().await;
    assert_eq!(third.index, 11);
    assert_eq!(group.woken(), names(&["two"]));
    assert_eq!(group.content(1), [("app/b".to_owned(), "2".to_owned())]);

    // The same bytes written again, and a key no path reads: no binding hears of either.
    third.reply(13, &[("app/a", "1", 12), ("app/b", "2", 11), ("app/c/x", "1", 7), ("app/unbound", "2", 13)]);
    let fourth = group.request().await;
    assert_eq!(fourth.index, 13);
    assert!(group.woken().is_empty());

    // A key deleted under a prefix changes that prefix only.
    fourth.reply(14, &[("app/a", "1", 12), ("app/b", "2", 11)]);
    group.request().await;
    assert_eq!(group.woken(), names(&["three", "one"]));
    assert!(group.content(2).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_failure_shows_after_the_grace_period_and_recovery_is_no_change() {
    let mut group = start(KvQuery::exact("app/a"), &[("app/a", false, &["one", "two"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5)]);
    let blocking = group.request().await;
    assert_eq!(group.woken(), names(&["one", "two"]));
    let KeyState::Ready(before) = group.cells[0].state() else { panic!("not ready") };

    let failed_at = Instant::now();
    blocking.fail(unreachable());
    let mut request = group.request().await;
    let reported = loop {
        assert_eq!(request.index, 0, "a retry after a failure reads fresh, without blocking");
        assert!(Instant::now() - failed_at >= Duration::from_millis(500), "retried without a backoff");
        let failed = matches!(group.cells[0].state(), KeyState::Failed { .. });
        if Instant::now() - failed_at < GRACE {
            assert!(!failed, "a failure showed within the grace period");
            assert!(group.woken().is_empty(), "a binding heard of a blip");
        } else if failed {
            break request;
        }
        assert!(Instant::now() - failed_at < GRACE + Duration::from_secs(11), "the failure never showed");
        request.fail(unreachable());
        request = group.request().await;
    };
    let KeyState::Failed { reason, message, last } = group.cells[0].state() else { unreachable!() };
    assert_eq!(reason, reason::CONSUL_UNREACHABLE);
    assert!(message.contains("connection refused"));
    assert!(last.is_some(), "the content from before is kept");
    assert_eq!(group.woken(), names(&["one", "two"]), "the failure wakes the bindings once");

    // The same failure again is no news.
    reported.fail(unreachable());
    let recovered = group.request().await;
    assert!(group.woken().is_empty());

    // Consul is back with the same content: the bindings hear it, and it is not a change.
    recovered.reply(12, &[("app/a", "1", 5)]);
    let next = group.request().await;
    assert_eq!(next.index, 12);
    assert_eq!(group.woken(), names(&["one", "two"]));
    let KeyState::Ready(after) = group.cells[0].state() else { panic!("not ready after recovery") };
    assert_eq!(after.changed_at, before.changed_at, "recovery with the same content is no change");
}

#[tokio::test(start_paused = true)]
async fn the_grace_period_counts_from_the_first_failure_of_a_run() {
    let mut group = start(KvQuery::exact("app/a"), &[("app/a", false, &["one"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5)]);
    group.request().await.fail(unreachable());
    group.woken();
    // A success in between starts the count again.
    group.request().await.reply(11, &[("app/a", "1", 5)]);
    let again = group.request().await;
    tokio::time::sleep(GRACE * 2).await;
    let failed_at = Instant::now();
    again.fail(unreachable());
    let retry = group.request().await;
    assert!(Instant::now() - failed_at < GRACE);
    assert!(matches!(group.cells[0].state(), KeyState::Ready(_)), "an old failure counted towards the grace");
    assert!(group.woken().is_empty());
    drop(retry);
}

#[tokio::test(start_paused = true)]
async fn an_index_reset_reads_afresh_and_marks_lost_content() {
    let mut group = start(KvQuery::exact("app/a"), &[("app/a", false, &["one"])], no_limits());
    group.request().await.reply(100, &[("app/a", "1", 90)]);
    let blocking = group.request().await;
    assert_eq!(blocking.index, 100);
    group.woken();

    // Consul's data is gone and its index went backwards: a restore, or a rebuilt cluster. The
    // first such answer is read again before anyone hears of it.
    let answered = Instant::now();
    blocking.reply(5, &[]);
    let again = group.request().await;
    assert_eq!(again.index, 0, "a lower index is read again, fresh");
    assert!(Instant::now() - answered >= Duration::from_secs(1), "read again at once");
    assert!(group.woken().is_empty(), "a binding heard of a reset before it was confirmed");
    again.reply(5, &[]);
    let fresh = group.request().await;
    assert_eq!(fresh.index, 0, "after a reset the next read is fresh");
    assert_eq!(group.woken(), names(&["one"]));
    let KeyState::Ready(lost) = group.cells[0].state() else { panic!("not ready") };
    assert!(lost.reset_hold && lost.entries.is_empty(), "content lost with the reset is held, not a change");

    fresh.reply(6, &[]);
    let blocking = group.request().await;
    assert_eq!(blocking.index, 6);
    assert!(group.woken().is_empty(), "still missing: no news");

    blocking.reply(7, &[("app/a", "1", 7)]);
    group.request().await;
    assert_eq!(group.woken(), names(&["one"]));
    let KeyState::Ready(back) = group.cells[0].state() else { panic!("not ready") };
    assert!(!back.reset_hold);
}

/// A reset whose follow-up read fails is still a reset when the group has read afresh: the
/// lost content is held, not rolled out as an edit.
#[tokio::test(start_paused = true)]
async fn a_reset_stays_a_reset_when_the_read_after_it_fails() {
    let paths: &[(&str, bool, &[&str])] = &[("app/a", false, &["one"]), ("app/b/", true, &["two"])];
    let mut group = start(KvQuery::prefix("app/"), paths, no_limits());
    group.request().await.reply(100, &[("app/a", "1", 90), ("app/b/x", "1", 95)]);
    let blocking = group.request().await;
    group.woken();

    blocking.reply(5, &[]);
    group.request().await.reply(5, &[]);
    // The key missing from the shared read is read alone, to be sure; that read fails.
    let alone = group.request().await;
    assert_eq!(alone.query, KvQuery::exact("app/a"));
    alone.fail(unreachable());
    assert!(group.woken().is_empty(), "told before the reset was read whole");

    let fresh = group.request().await;
    assert_eq!(fresh.index, 0, "read afresh after the failure");
    fresh.reply(6, &[]);
    group.request().await.reply(6, &[]);
    group.settle().await;
    assert_eq!(group.woken(), names(&["one", "two"]));
    for i in 0..2 {
        let KeyState::Ready(lost) = group.cells[i].state() else { panic!("path {i} not ready") };
        assert!(lost.reset_hold && lost.entries.is_empty(), "path {i}: content lost with the reset taken for an edit");
    }
}

/// An agent that has just restarted may answer once from an empty state with a low index.
#[tokio::test(start_paused = true)]
async fn a_low_index_that_the_next_read_contradicts_changes_nothing() {
    let mut group = start(KvQuery::exact("app/a"), &[("app/a", false, &["one"])], no_limits());
    group.request().await.reply(100, &[("app/a", "1", 90)]);
    let blocking = group.request().await;
    group.woken();
    blocking.reply(1, &[]);
    let again = group.request().await;
    assert_eq!(again.index, 0);
    again.reply(101, &[("app/a", "1", 90)]);
    let next = group.request().await;
    assert_eq!(next.index, 101);
    assert!(group.woken().is_empty(), "a binding heard of a blip");
    let KeyState::Ready(content) = group.cells[0].state() else { panic!("not ready") };
    assert!(content.reset_at.is_none() && !content.reset_hold && !content.entries.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_new_path_is_read_alone_while_the_blocking_query_goes_on() {
    let mut group = start(KvQuery::prefix("app/"), &[("app/a", false, &["one"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5), ("app/b", "2", 6)]);
    let blocking = group.request().await;
    assert_eq!(blocking.index, 10);
    group.woken();

    group.add_paths(&[("app/b", false, &["two"])]);
    let alone = group.request().await;
    assert_eq!((&*alone.query.key, alone.query.recurse, alone.index), ("app/b", false, 0));
    alone.reply(11, &[("app/b", "2", 6)]);
    group.settle().await;
    assert_eq!(group.woken(), names(&["two"]), "only the new path's bindings hear of it");
    assert_eq!(group.content(1), [("app/b".to_owned(), "2".to_owned())]);
    assert!(group.requests.try_recv().is_err(), "the blocking query was sent again");

    // The blocking query answers for the whole roster; nothing changed.
    blocking.reply(12, &[("app/a", "1", 5), ("app/b", "2", 6)]);
    let next = group.request().await;
    assert_eq!((&*next.query.key, next.index), ("app/", 12));
    assert!(group.woken().is_empty());

    // A change on the new path now comes through the group's query.
    next.reply(13, &[("app/a", "1", 5), ("app/b", "3", 13)]);
    group.request().await;
    assert_eq!(group.woken(), names(&["two"]));
}

#[tokio::test(start_paused = true)]
async fn a_blocking_answer_that_comes_while_new_paths_are_read_is_taken_at_once() {
    // Left waiting on the reads, the request could hold what they need, and neither would end.
    let mut group = start(KvQuery::prefix("app/"), &[("app/a", false, &["one"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5), ("app/b", "2", 6)]);
    let blocking = group.request().await;
    group.woken();
    group.add_paths(&[("app/b", false, &["two"])]);
    let alone = group.request().await;
    assert_eq!((&*alone.query.key, alone.index), ("app/b", 0));
    blocking.reply(12, &[("app/a", "1", 5), ("app/b", "2", 6)]);
    let next = group.request().await;
    assert_eq!((&*next.query.key, next.index), ("app/", 12), "the answer was taken");
    assert_eq!(group.content(1), [("app/b".to_owned(), "2".to_owned())], "it covers the new path");
    assert_eq!(group.woken(), names(&["two"]));
    drop(alone);
}

#[tokio::test(start_paused = true)]
async fn a_new_path_that_cannot_be_read_alone_makes_the_group_read_afresh() {
    let mut group = start(KvQuery::prefix("app/"), &[("app/a", false, &["one"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5)]);
    let blocking = group.request().await;
    group.woken();
    group.add_paths(&[("app/b", false, &["two"])]);
    group.request().await.fail(unreachable());
    let fresh = group.request().await;
    assert_eq!((&*fresh.query.key, fresh.index), ("app/", 0), "the whole group is read afresh");
    fresh.reply(11, &[("app/a", "1", 5), ("app/b", "2", 11)]);
    group.request().await;
    assert_eq!(group.woken(), names(&["two"]), "the known path's content did not change");
    drop(blocking);
}

#[tokio::test(start_paused = true)]
async fn a_retired_group_finishes_its_request_and_tells_no_one() {
    let mut group = start(KvQuery::exact("app/a"), &[("app/a", false, &["one"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5)]);
    let blocking = group.request().await;
    group.woken();
    group.roster = None;
    group.settle().await;
    assert!(!group.task.is_finished(), "the request in flight was dropped");
    blocking.reply(11, &[("app/a", "2", 11)]);
    tokio::time::timeout(Duration::from_secs(1), &mut group.task).await.expect("still running").unwrap();
    assert!(group.woken().is_empty(), "a retired group woke a binding");
    assert_eq!(group.content(0), [("app/a".to_owned(), "1".to_owned())]);
}

#[tokio::test(start_paused = true)]
async fn the_entries_of_a_tenant_that_left_are_forgotten_soon_after_its_group_stops() {
    let mut group = start(KvQuery::prefix("app/"), &[("app/", true, &["one"])], no_limits());
    let entries: Vec<(String, &str, u64)> = (0..50).map(|i| (format!("app/k{i}"), "v", i + 1)).collect();
    let entries: Vec<(&str, &str, u64)> = entries.iter().map(|(k, v, i)| (k.as_str(), *v, *i)).collect();
    group.request().await.reply(60, &entries);
    let blocking = group.request().await;
    assert_eq!(group.runner.metrics.consul_entries.get(), 50);
    // The tenant leaves: its paths go, and the planner retires the group.
    group.cells.clear();
    group.roster = None;
    blocking.reply(61, &entries);
    tokio::time::timeout(Duration::from_secs(1), &mut group.task).await.expect("still running").unwrap();
    tokio::time::sleep(RETIRED_SWEEP / 2).await;
    assert_eq!(group.runner.metrics.consul_entries.get(), 50, "swept before the others retired with it could be");
    tokio::time::sleep(RETIRED_SWEEP).await;
    group.settle().await;
    assert_eq!(group.runner.metrics.consul_entries.get(), 0, "the entries no path holds stay");
}

#[test]
fn a_group_of_many_paths_may_read_no_more_than_one_path_may() {
    let limits = Limits { entries: 10_000, bytes: 4 << 20 };
    let keys: Vec<String> = (0..200).map(|i| format!("app/k{i:03}")).collect();
    let many: Vec<(&str, bool, &[&str])> = keys.iter().map(|k| (k.as_str(), false, &[] as &[&str])).collect();
    let limit = |paths: &[(&str, bool, &[&str])]| {
        let (paths, cells) = cells(paths);
        super::answer_limit(&limits, &Roster::new(paths, cells, None, false))
    };
    assert_eq!(limit(&many), limits.answer_bytes(false));
    assert_eq!(limit(&[("app/", true, &[])]), limits.answer_bytes(true));
}

/// Refused tokens by the thousand must not crowd the reads of everyone else.
#[tokio::test(start_paused = true)]
async fn parked_groups_read_one_at_a_time() {
    let (runner, mut requests, _) = runner(no_limits());
    let mut tasks = Vec::new();
    let mut senders = Vec::new();
    for key in ["a/one", "a/two"] {
        let (paths, cells) = cells(&[(key, false, &["b"])]);
        let (roster, rx) = watch::channel(Arc::new(Roster::new(paths, cells, None, true)));
        tasks.push(tokio::spawn(runner.clone().run_group(KvQuery::exact(key), rx)));
        senders.push(roster);
    }
    let first = requests.recv().await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(requests.try_recv().is_err(), "a second parked read went out while the first was unanswered");
    let key = first.query.key.clone();
    first.fail(denied(&key));
    let second = tokio::time::timeout(Duration::from_secs(1), requests.recv()).await.unwrap().unwrap();
    assert_ne!(second.query.key, key);
    drop(senders);
    tasks.iter().for_each(|t| t.abort());
}

#[tokio::test(start_paused = true)]
async fn a_shared_read_too_large_asks_for_reads_of_their_own() {
    let mut group =
        start(KvQuery::prefix("app/"), &[("app/a/", true, &["one"]), ("app/b/", true, &["two"])], no_limits());
    group.request().await.fail(Error::TooLarge { key: "app/".into(), limit: 10 });
    tokio::time::timeout(Duration::from_secs(1), group.runner.replan.notified()).await.expect("no re-plan asked");
    assert!(group.cells.iter().all(|c| c.solo()));
    assert!(group.woken().is_empty(), "splitting a read is nothing the bindings need to hear");
    assert!(matches!(group.cells[0].state(), KeyState::Pending));
}

#[tokio::test(start_paused = true)]
async fn a_prefix_over_the_limits_fails_on_its_own_and_keeps_nothing() {
    let limits = Limits { entries: 2, bytes: 1 << 20 };
    let mut group =
        start(KvQuery::prefix("app/"), &[("app/big/", true, &["big"]), ("app/small", false, &["small"])], limits);
    group
        .request()
        .await
        .reply(10, &[("app/big/1", "x", 1), ("app/big/2", "x", 2), ("app/big/3", "x", 3), ("app/small", "s", 4)]);
    group.request().await;
    assert_eq!(group.woken(), names(&["big", "small"]));
    let KeyState::Failed { reason, message, last } = group.cells[0].state() else { panic!("not failed") };
    assert_eq!(reason, reason::PREFIX_TOO_LARGE);
    assert!(message.contains("3 keys") && message.contains("--max-prefix-entries"), "{message}");
    assert!(last.is_none(), "content over the limits was kept");
    assert_eq!(group.content(1), [("app/small".to_owned(), "s".to_owned())], "the other path is served");
}

fn denied(key: &str) -> Error {
    Error::AccessDenied { key: key.into(), status: 403, message: "Permission denied".into(), policy: "read" }
}

#[tokio::test(start_paused = true)]
async fn a_key_filtered_out_of_a_shared_read_is_confirmed_alone() {
    let mut group = start(
        KvQuery::prefix("app/"),
        &[("app/a", false, &["one"]), ("app/b", false, &["two"]), ("app/c", false, &["three"])],
        no_limits(),
    );
    group.request().await.reply(10, &[("app/a", "1", 5), ("app/b", "1", 6), ("app/c", "1", 7)]);
    let blocking = group.request().await;
    group.woken();

    // The token may no longer read app/b, and app/c was deleted: both vanish from the answer.
    blocking.reply(11, &[("app/a", "1", 5)]);
    let (mut b, mut c) = (group.request().await, group.request().await);
    if &*b.query.key != "app/b" {
        std::mem::swap(&mut b, &mut c);
    }
    assert_eq!((&*b.query.key, b.query.recurse, b.index), ("app/b", false, 0));
    assert_eq!((&*c.query.key, c.query.recurse), ("app/c", false));
    assert!(group.woken().is_empty(), "a binding heard before the key was confirmed");
    b.fail(denied("app/b"));
    c.reply(12, &[]);
    let next = group.request().await;
    assert_eq!((&*next.query.key, next.index), ("app/", 11));
    assert_eq!(group.woken(), names(&["two", "three"]));
    let KeyState::Failed { reason, .. } = group.cells[1].state() else { panic!("app/b is not failed") };
    assert_eq!(reason, reason::ACCESS_DENIED, "a key the token may not read is not a deleted key");
    assert!(group.content(2).is_empty(), "a 404 confirms the deletion");
    assert_eq!(group.content(0), [("app/a".to_owned(), "1".to_owned())]);

    // Still filtered: no more reads, no more wakes.
    next.reply(13, &[("app/a", "2", 13)]);
    let after = group.request().await;
    assert_eq!(&*after.query.key, "app/");
    assert_eq!(group.woken(), names(&["one"]));
}

#[tokio::test(start_paused = true)]
async fn a_key_consul_refuses_fails_alone_and_its_group_goes_on() {
    let odd = "app/b\u{378}";
    let mut group = start(KvQuery::prefix("app/"), &[("app/a", false, &["one"]), (odd, false, &["odd"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5)]);
    let alone = group.request().await;
    assert_eq!((&*alone.query.key, alone.query.recurse), (odd, false));
    let address = "http://consul".to_owned();
    alone.fail(Error::Server { address, key: odd.into(), status: 400, body: String::new() });
    let next = group.request().await;
    assert_eq!((&*next.query.key, next.index), ("app/", 10), "the group did not go on");
    assert_eq!(group.woken(), names(&["one", "odd"]));
    let KeyState::Failed { reason, .. } = group.cells[1].state() else { panic!("the refused key is not failed") };
    assert_eq!(reason, reason::CONSUL_ERROR);
    assert_eq!(group.content(0), [("app/a".to_owned(), "1".to_owned())]);
}

#[tokio::test(start_paused = true)]
async fn a_missing_key_that_cannot_be_confirmed_tells_no_one() {
    let mut group =
        start(KvQuery::prefix("app/"), &[("app/a", false, &["one"]), ("app/b", false, &["two"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5), ("app/b", "1", 6)]);
    let blocking = group.request().await;
    group.woken();
    blocking.reply(11, &[("app/a", "1", 5)]);
    group.request().await.fail(unreachable());
    let fresh = group.request().await;
    assert_eq!((&*fresh.query.key, fresh.index), ("app/", 0), "the group is read afresh");
    assert!(group.woken().is_empty());
    assert_eq!(group.content(1), [("app/b".to_owned(), "1".to_owned())], "the key was taken for deleted");
    fresh.reply(12, &[("app/a", "1", 5), ("app/b", "1", 6)]);
    group.request().await;
    assert!(group.woken().is_empty(), "nothing changed");
}

#[tokio::test(start_paused = true)]
async fn groups_in_a_lane_take_turns_on_its_slots_with_short_waits() {
    let (runner, mut requests, _woken) = runner(no_limits());
    let lane = Arc::new(Lane::new(2, 1));
    let mut rosters = Vec::new();
    for key in ["a", "b"] {
        let (paths, cells) = cells(&[(key, false, &["one"])]);
        let (roster, rx) = watch::channel(Arc::new(Roster::new(paths, cells, Some(lane.clone()), false)));
        tokio::spawn(runner.clone().run_group(KvQuery::exact(key), rx));
        rosters.push(roster);
    }
    let next = |requests: &mut mpsc::UnboundedReceiver<Request>| requests.try_recv().ok();
    tokio::task::yield_now().await;
    let (first, second) = (next(&mut requests).unwrap(), next(&mut requests).unwrap());
    assert_eq!((first.index, second.index), (0, 0), "plain reads need no turn");
    first.reply(10, &[("a", "1", 5)]);
    second.reply(10, &[("b", "1", 6)]);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let blocking = next(&mut requests).expect("one group blocks");
    assert_eq!(blocking.index, 10);
    assert!(blocking.wait <= ROTATION_WAIT + ROTATION_WAIT / 10, "a lane's query waits briefly: {:?}", blocking.wait);
    assert!(next(&mut requests).is_none(), "the other waits for its turn");
    let turn = blocking.query.key.clone();
    let same = if &*turn == "a" { ("a", "1", 5) } else { ("b", "1", 6) };
    blocking.reply(10, &[same]);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let other = next(&mut requests).expect("the turn passes");
    assert_ne!(other.query.key, turn);
    drop(rosters);
}

#[tokio::test(start_paused = true)]
async fn a_refused_token_asks_for_a_new_plan_and_so_does_its_return() {
    let (runner, mut requests, _woken) = runner(no_limits());
    let (paths, cells) = cells(&[("a", false, &["one"])]);
    let (roster, rx) = watch::channel(Arc::new(Roster::new(paths.clone(), cells.clone(), None, false)));
    tokio::spawn(runner.clone().run_group(KvQuery::exact("a"), rx));
    let replanned = runner.replan.notified();
    tokio::pin!(replanned);
    replanned.as_mut().enable();
    let mut request = requests.recv().await.unwrap();
    // Refused until the grace is over: then the bindings hear it, and the planner parks it.
    while !cells[0].denied() {
        request.fail(denied("a"));
        request = requests.recv().await.unwrap();
    }
    assert_eq!(request.index, 0, "a refused token reads without blocking");
    tokio::time::timeout(Duration::from_secs(1), replanned).await.expect("no new plan asked for");

    // Parked, the group reads on; once Consul accepts the token it needs a slot again.
    roster.send_replace(Arc::new(Roster::new(paths, cells.clone(), None, true)));
    let replanned = runner.replan.notified();
    tokio::pin!(replanned);
    replanned.as_mut().enable();
    request.reply(10, &[("a", "1", 5)]);
    tokio::time::timeout(Duration::from_secs(1), replanned).await.expect("no new plan asked for");
    assert!(!cells[0].denied());
}

#[tokio::test(start_paused = true)]
async fn a_hung_agent_fails_the_groups_and_its_return_retries_them_at_once() {
    let mut group = start(KvQuery::exact("app/a"), &[("app/a", false, &["one"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5)]);
    let hung = group.request().await;
    assert_eq!(hung.index, 10);
    group.woken();

    // The agent stops answering: the blocking query is given up, not waited out.
    let down_at = Instant::now();
    let stopped =
        Error::Unreachable { address: "http://127.0.0.1:8500".into(), detail: "the agent stopped answering".into() };
    group.runner.agent.send_replace(Some(stopped));
    group.settle().await;
    assert!(hung.answer.is_closed(), "the hung request is still awaited");
    tokio::time::sleep(GRACE + Duration::from_secs(30)).await;
    assert!(group.requests.try_recv().is_err(), "a request went to an agent known to be down");
    let KeyState::Failed { reason, message, .. } = group.cells[0].state() else { panic!("no failure shown") };
    assert_eq!(reason, reason::CONSUL_UNREACHABLE);
    assert!(message.contains("stopped answering"), "{message}");
    assert_eq!(group.woken(), names(&["one"]));
    assert!(Instant::now() - down_at >= GRACE);

    // Back: the group reads at once, not at the end of a backoff, and the same content is no change.
    let up_at = Instant::now();
    group.runner.agent.send_replace(None);
    let read = group.request().await;
    assert_eq!(read.index, 0);
    assert!(Instant::now() - up_at < Duration::from_millis(100), "waited {:?}", Instant::now() - up_at);
    read.reply(11, &[("app/a", "1", 5)]);
    group.request().await;
    assert!(matches!(group.cells[0].state(), KeyState::Ready(_)));
}

#[tokio::test(start_paused = true)]
async fn status_checks_that_time_out_while_the_watches_answer_are_no_outage() {
    let (runner, mut requests, _) = runner_over(no_limits(), |tx| Arc::new(SlowCheck(Script(tx))));
    let (paths, cells) = cells(&[("app/a", false, &["one"])]);
    let (_roster, rx) = watch::channel(Arc::new(Roster::new(paths, cells, None, false)));
    tokio::spawn(runner.clone().run_group(KvQuery::exact("app/a"), rx));
    tokio::spawn(super::watch_agent(runner.clone()));
    let next = |requests: &mut mpsc::UnboundedReceiver<Request>| {
        let request = requests.try_recv();
        request.expect("the group sent no request")
    };

    // A busy key: its blocking query answers every 400 ms, through 20 s of checks timing out.
    let until = Instant::now() + Duration::from_secs(20);
    let mut index = 10;
    tokio::time::sleep(Duration::from_millis(1)).await;
    while Instant::now() < until {
        let request = next(&mut requests);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(runner.agent.borrow().is_none(), "the agent counted as down while its watches answered");
        index += 1;
        request.reply(index, &[("app/a", "v", index)]);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    // The watches go quiet too: that is an outage, and the blocking query is given up.
    let hung = next(&mut requests);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(runner.agent.borrow().is_some(), "a hung agent was not noticed");
    assert!(hung.answer.is_closed(), "the hung request is still awaited");
}

#[test]
fn a_crowded_lane_waits_less_so_that_every_turn_comes_round_soon() {
    let lane = Lane::new(200, 19);
    assert_eq!(lane.wait, Duration::from_secs(30) / 11);
    assert!(lane.cycle <= Duration::from_secs(30) && lane.cycle > Duration::from_secs(29));
    assert_eq!(Lane::new(12, 4).wait, ROTATION_WAIT, "a short round keeps the longest wait");
    assert_eq!(Lane::new(12, 4).cycle, Duration::from_secs(30));
    let crowded = Lane::new(2_000, 1);
    assert_eq!(crowded.wait, Duration::from_secs(1), "never below a second");
    assert_eq!(crowded.cycle, Duration::from_secs(2_000));
}

#[tokio::test(start_paused = true)]
async fn a_refused_key_missing_from_a_shared_read_is_read_alone_again_and_its_grant_shows() {
    let mut group =
        start(KvQuery::prefix("app/"), &[("app/a", false, &["one"]), ("app/b", false, &["two"])], no_limits());
    group.request().await.reply(10, &[("app/a", "1", 5)]);
    let alone = group.request().await;
    assert_eq!((&*alone.query.key, alone.query.recurse), ("app/b", false));
    alone.fail(denied("app/b"));
    let blocking = group.request().await;
    group.woken();
    assert!(group.cells[1].denied());

    // Its policy is granted, and the key does not exist: the shared read shows nothing of it.
    // Not read alone at every answer of the group...
    blocking.reply(11, &[("app/a", "2", 11)]);
    let next = group.request().await;
    assert_eq!(&*next.query.key, "app/");
    // ...but again once a while has passed.
    tokio::time::advance(DENIED_RECHECK).await;
    next.reply(12, &[("app/a", "2", 11)]);
    let again = group.request().await;
    assert_eq!((&*again.query.key, again.query.recurse), ("app/b", false));
    again.reply(12, &[]);
    let after = group.request().await;
    assert_eq!(&*after.query.key, "app/");
    assert!(!group.cells[1].denied(), "the grant did not show");
    assert!(group.content(1).is_empty());
    assert_eq!(group.woken(), names(&["one", "two"]));
}

/// Issue 30: a key watched alone that goes missing answers its table's index. After a rebuilt
/// cluster written past the key's own index before the watch read again, only an index some
/// other answer showed of that table tells a loss from a deletion.
#[tokio::test(start_paused = true)]
async fn a_key_alone_missing_below_its_tables_highest_index_was_lost() {
    let (runner, mut requests, woken) = runner(no_limits());
    let (paths, cells) = cells(&[("app/x", false, &["one"]), ("bulk/", true, &["two"])]);
    let roster = |i: usize| {
        let roster = Roster::new(vec![paths[i].clone()], vec![cells[i].clone()], None, false);
        watch::channel(Arc::new(roster))
    };
    let (_x, x) = roster(0);
    let (_bulk, bulk) = roster(1);
    tokio::spawn(runner.clone().run_group(KvQuery::exact("app/x"), x));
    tokio::spawn(runner.clone().run_group(KvQuery::prefix("bulk/"), bulk));
    let mut next = async |key: &str| loop {
        let request = requests.recv().await.expect("the runner stopped");
        if &*request.query.key == key {
            return request;
        }
        // The other group's blocking query: never answered.
        std::mem::forget(request);
    };
    next("app/x").await.reply(20, &[("app/x", "1", 20)]);
    next("bulk/").await.reply(120, &[("bulk/a", "1", 120)]);
    let blocking = next("app/x").await;
    assert_eq!(blocking.index, 20);

    // Gone, in a table whose index is 70 now: above the key's own 20, below the 120 seen.
    blocking.reply(70, &[]);
    let again = next("app/x").await;
    assert_eq!(again.index, 0, "read again before it is believed");
    again.reply(70, &[]);
    next("app/x").await;
    let KeyState::Ready(lost) = cells[0].state() else { panic!("not ready") };
    assert!(lost.reset_hold && lost.entries.is_empty(), "a lost key was taken for a deletion");
    assert!(woken.locked().iter().any(|b| b.name() == "one"));

    // From then on the table counts from 70: a deletion there is a deletion.
    let (paths_z, cells_z) = self::cells(&[("app/z", false, &["four"])]);
    let (_z, z) = watch::channel(Arc::new(Roster::new(paths_z, cells_z.clone(), None, false)));
    tokio::spawn(runner.clone().run_group(KvQuery::exact("app/z"), z));
    next("app/z").await.reply(75, &[("app/z", "1", 75)]);
    next("app/z").await.reply(80, &[]);
    next("app/z").await;
    let KeyState::Ready(deleted) = cells_z[0].state() else { panic!("not ready") };
    assert!(!deleted.reset_hold && deleted.entries.is_empty(), "a deletion after the reset was held");
}

/// Overlapping prefixes hold one copy of their entries: every path of a group is a view of its
/// latest answer, and a second group reading the same keys shares their keys and values.
#[tokio::test(start_paused = true)]
async fn overlapping_paths_hold_views_of_one_answer_and_groups_share_entries() {
    let paths: &[(&str, bool, &[&str])] = &[("p/", true, &["a"]), ("p/x", true, &["b"]), ("p/xx", true, &["c"])];
    let mut group = start(KvQuery::prefix("p/"), paths, no_limits());
    let answer: &[(&str, &str, u64)] = &[("p/xx1", "1", 5), ("p/xx2", "1", 6), ("p/y", "1", 7)];
    group.request().await.reply(10, answer);
    let next = group.request().await;
    let views = |group: &Group| -> Vec<crate::watches::path::View> {
        (0..group.cells.len())
            .map(|i| match group.cells[i].state() {
                KeyState::Ready(content) => content.entries,
                other => panic!("path {i} is not ready: {other:?}"),
            })
            .collect()
    };
    let first = views(&group);
    assert_eq!(first.iter().map(|v| v.len()).collect::<Vec<_>>(), [3, 2, 2]);
    assert!(first.iter().all(|v| Arc::ptr_eq(v.answer(), first[0].answer())), "a path holds a copy of its own");
    assert_eq!(group.woken(), names(&["a", "b", "c"]));

    // Only "p/y" changes, which one path reads: the others move to the new answer too.
    next.reply(11, &[("p/xx1", "1", 5), ("p/xx2", "1", 6), ("p/y", "2", 11)]);
    group.request().await;
    assert_eq!(group.woken(), names(&["a"]));
    let second = views(&group);
    assert!(second.iter().all(|v| Arc::ptr_eq(v.answer(), second[0].answer())), "an older answer is kept");
    assert!(!Arc::ptr_eq(second[0].answer(), first[0].answer()));
    assert!(Arc::ptr_eq(&second[1][0].key, &first[1][0].key), "an unchanged entry was copied");

    // Another group, with the same runner, reading the same keys.
    let (cells_paths, cells) = cells(&[("p/xx", true, &["d"])]);
    let (_roster, rx) = watch::channel(Arc::new(Roster::new(cells_paths, cells.clone(), None, false)));
    let task = tokio::spawn(group.runner.clone().run_group(KvQuery::prefix("p/xx"), rx));
    group.request().await.reply(11, &[("p/xx1", "1", 5), ("p/xx2", "1", 6)]);
    group.request().await;
    let KeyState::Ready(other) = cells[0].state() else { panic!("not ready") };
    assert!(
        Arc::ptr_eq(&other.entries[0].key, &second[2][0].key)
            && Arc::ptr_eq(&other.entries[1].value, &second[2][1].value)
    );
    task.abort();
}

/// A binding woken by an answer finds every path it reads on that answer: woken while one of
/// its overlapping paths still held the answer before, it rolled their mix, and then the whole.
#[tokio::test(start_paused = true)]
async fn a_binding_woken_by_an_answer_finds_all_its_paths_on_that_answer() {
    let paths: &[(&str, bool, &[&str])] = &[("p/", true, &["a"]), ("p/a", true, &["a"]), ("p/ab", true, &["a"])];
    let (watch_paths, cells) = cells(paths);
    let seen: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let wake: crate::watches::Wake = {
        let (cells, seen) = (cells.clone(), seen.clone());
        Arc::new(move |_| {
            let values = cells
                .iter()
                .map(|c| match c.state() {
                    KeyState::Ready(content) => {
                        content.entries.iter().map(|e| String::from_utf8_lossy(&e.value).into_owned()).collect()
                    }
                    _ => "-".to_owned(),
                })
                .collect();
            seen.locked().push(values);
        })
    };
    let (tx, mut requests) = mpsc::unbounded_channel();
    let runner =
        Runner::new(Arc::new(Script(tx)), wake, Arc::new(Metrics::new(&mut Registry::default())), GRACE, no_limits());
    runner.plan_slots(20);
    let runner = Arc::new(runner);
    let (_roster, rx) = watch::channel(Arc::new(Roster::new(watch_paths, cells, None, false)));
    let task = tokio::spawn(runner.clone().run_group(KvQuery::prefix("p/"), rx));
    let next = |requests: &mut mpsc::UnboundedReceiver<Request>| requests.try_recv();
    tokio::time::sleep(Duration::from_millis(1)).await;
    next(&mut requests).expect("a first read").reply(10, &[("p/ab1", "1", 5)]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    next(&mut requests).expect("a blocking read").reply(11, &[("p/ab1", "2", 11)]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let seen = seen.locked().clone();
    assert!(!seen.is_empty());
    for values in &seen {
        assert!(values.iter().all(|v| *v == values[0]), "woken with paths on different answers: {values:?}");
    }
    assert!(seen.last().is_some_and(|v| v[0] == "2"));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_kept_group_never_waits_behind_the_turns_of_lanes_being_replaced() {
    let slots = Arc::new(tokio::sync::Semaphore::new(2));
    let (runner, mut requests, _woken) = runner_over(no_limits(), |tx| Arc::new(Slotted(Script(tx), slots)));
    runner.plan_slots(2);
    let next = |requests: &mut mpsc::UnboundedReceiver<Request>| requests.try_recv().ok();
    let settle = || async {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    };
    let mut rosters = Vec::new();
    let mut start = |key: &str, lane: Option<Arc<Lane>>| {
        let (paths, cells) = cells(&[(key, false, &["b"])]);
        let (roster, rx) = watch::channel(Arc::new(Roster::new(paths, cells, lane, false)));
        tokio::spawn(runner.clone().run_group(KvQuery::exact(key), rx));
        rosters.push(roster);
    };
    start("quiet", None);
    settle().await;
    next(&mut requests).unwrap().reply(10, &[("quiet", "1", 5)]);
    settle().await;
    let quiet = next(&mut requests).expect("the quiet group blocks");
    assert_eq!(quiet.index, 10);
    // A re-plan made a fresh lane while the old lane's group still finishes its turn: together
    // they want more slots than the plan left them.
    start("old", Some(Arc::new(Lane::new(1, 1))));
    start("new", Some(Arc::new(Lane::new(1, 1))));
    settle().await;
    for _ in 0..2 {
        let plain = next(&mut requests).unwrap();
        let key = plain.query.key.clone();
        plain.reply(10, &[(&key, "1", 6)]);
    }
    settle().await;
    let turn = next(&mut requests).expect("one lane group blocks");
    assert!(next(&mut requests).is_none(), "the other waits for a slot");
    quiet.reply(11, &[("quiet", "2", 11)]);
    settle().await;
    let again = next(&mut requests).expect("the quiet group asks again at once, ahead of the lanes");
    assert_eq!((&*again.query.key, again.index), ("quiet", 11));
    drop((turn, again, rosters));
}

/// Issue 45: a key its token may not read, in a group Consul leaves quiet, is read alone again
/// within ten seconds, so a grant shows with no other change.
#[tokio::test(start_paused = true)]
async fn a_refused_key_of_a_quiet_shared_read_is_read_again_within_ten_seconds() {
    let mut group =
        start(KvQuery::prefix("app/"), &[("app/a", false, &["one"]), ("app/b", false, &["two"])], no_limits());
    let first = group.request().await;
    // A group that has lived a while waits its full time.
    tokio::time::advance(Duration::from_secs(600)).await;
    first.reply(10, &[("app/a", "1", 5)]);
    group.request().await.fail(denied("app/b"));
    let mut blocking = group.request().await;
    group.woken();
    assert!(group.cells[1].denied());
    // The grant, at once; nothing else changes. Consul's own jitter adds up to a sixteenth.
    let granted = tokio::time::Instant::now();
    for _ in 0..10 {
        assert_eq!(&*blocking.query.key, "app/");
        assert!(blocking.wait * 17 / 16 < DENIED_RECHECK, "a blocking wait of {:?}", blocking.wait);
        tokio::time::advance(blocking.wait).await;
        blocking.reply(10, &[("app/a", "1", 5)]);
        let next = group.request().await;
        if &*next.query.key == "app/b" {
            assert!(granted.elapsed() <= DENIED_RECHECK, "read again after {:?}", granted.elapsed());
            next.reply(10, &[]);
            group.settle().await;
            assert!(!group.cells[1].denied(), "the grant did not show");
            assert_eq!(group.woken(), names(&["two"]));
            return;
        }
        blocking = next;
    }
    panic!("the refused key was not read again");
}

/// Issue 45: a key or a prefix read alone that Consul refuses is asked again at most ten seconds
/// apart, however long it was refused; its grant shows at the next read.
#[tokio::test(start_paused = true)]
async fn a_refused_path_read_alone_is_asked_again_at_most_ten_seconds_apart() {
    for query in [KvQuery::exact("app/b"), KvQuery::prefix("app/b/")] {
        let recurse = query.recurse;
        let mut group = start(query.clone(), &[(&*query.key, recurse, &["two"])], no_limits());
        let mut request = group.request().await;
        for _ in 0..12 {
            let asked = tokio::time::Instant::now();
            request.fail(denied(&query.key));
            request = group.request().await;
            assert!(asked.elapsed() <= DENIED_RECHECK, "{query:?} asked again after {:?}", asked.elapsed());
        }
        assert!(group.cells[0].denied());
        group.woken();
        request.reply(10, &[]);
        group.settle().await;
        assert!(!group.cells[0].denied(), "{query:?}: the grant did not show");
        assert_eq!(group.woken(), names(&["two"]));
    }
}
