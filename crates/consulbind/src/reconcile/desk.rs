//! Stamps due together on one workload go in one write.
//!
//! Bindings that read the same key are woken by the same Consul answer. Each stamps its own
//! annotation, and each write of a pod template is a new generation: two bindings on one
//! workload would give two rollouts for one change. So a stamp for a workload that another
//! binding in flight (woken, not yet planned) may also stamp waits, for a moment, until that
//! binding has planned; whatever was submitted for the workload by then is one write. A stamp
//! with no other binding in flight goes at once. A binding waiting out a quiet period counts as
//! in flight from a moment before its quiet period ends: bindings woken by one change end their
//! quiet periods together, each on its own timer.
//!
//! A binding that holds a change back (a quiet period, a restore grace) leaves on the desk
//! the stamp it would write. When another binding writes the workload with a stamp for the
//! same checksum, that held stamp goes in the same write: the pods start on that content, so
//! the held binding's own rollout of it would be a second one for one change.

use std::{
    collections::HashMap,
    future::Future,
    sync::Mutex,
    time::{Duration, Instant},
};

use tokio::sync::{Notify, watch};

use crate::{
    BindingRef, Lock,
    cluster::{Version, Workload},
};

/// How long a stamp waits at most for the other bindings in flight on its workload.
const GATHER: Duration = Duration::from_millis(250);
/// A binding woken longer ago than this is not waited for: its reconcile is queued behind
/// others, or it will not run at all.
const STALE: Duration = Duration::from_secs(2);

/// One binding's annotation on one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub binding: BindingRef,
    pub annotation: String,
    pub value: String,
    /// The binding's own field manager, for a write of its stamp alone.
    pub manager: String,
}

/// A workload in a namespace.
pub type Target = (String, Workload);

pub type Written = Result<Version, String>;

#[derive(Default)]
pub struct Desk {
    inner: Mutex<Inner>,
    planned: Notify,
}

#[derive(Default)]
struct Inner {
    /// Bindings woken whose reconcile has not planned yet, and since when.
    flight: HashMap<BindingRef, Instant>,
    /// Bindings whose quiet period ends at a time, when they plan again.
    due: HashMap<BindingRef, Instant>,
    last_sweep: Option<Instant>,
    /// Stamps waiting for a write, by workload.
    open: HashMap<Target, Batch>,
    /// Stamps held back, by workload, and the workloads each binding holds one for.
    held: HashMap<Target, Vec<Stamp>>,
    holds: HashMap<BindingRef, Vec<Target>>,
}

struct Batch {
    stamps: Vec<Stamp>,
    done: watch::Sender<Option<Written>>,
}

/// What a submitted stamp does next.
pub enum Turn {
    /// Written at once, with the held stamps it carries.
    Alone(Target, Stamp),
    /// Waits for the bindings in `others` to plan, then writes every stamp of the workload.
    Lead { target: Target, others: Vec<BindingRef> },
    /// Another stamp leads the write this one joined.
    Joined(watch::Receiver<Option<Written>>),
}

impl Desk {
    /// A binding was woken, and may soon stamp.
    pub fn woken(&self, binding: &BindingRef) {
        let now = Instant::now();
        let mut inner = self.inner.locked();
        inner.flight.insert(binding.clone(), now);
        inner.sweep(now);
    }

    /// The binding plans again at `at`, when its quiet period ends, or at no set time.
    pub fn due(&self, binding: &BindingRef, at: Option<Instant>) {
        let mut inner = self.inner.locked();
        match at {
            Some(at) => drop(inner.due.insert(binding.clone(), at)),
            None => drop(inner.due.remove(binding)),
        }
        inner.sweep(Instant::now());
    }

    /// The stamps the binding's last plan held back, in place of those of its plan before.
    pub fn hold(&self, binding: &BindingRef, stamps: Vec<(Target, Stamp)>) {
        let mut inner = self.inner.locked();
        inner.release(binding);
        if stamps.is_empty() {
            return;
        }
        let targets = stamps.iter().map(|(t, _)| t.clone()).collect();
        for (target, stamp) in stamps {
            inner.held.entry(target).or_default().push(stamp);
        }
        inner.holds.insert(binding.clone(), targets);
    }

    /// The binding is deleted or no longer served: nothing waits for it, and it holds nothing.
    pub fn forget(&self, binding: &BindingRef) {
        self.inner.locked().release(binding);
        self.planned(binding);
    }

    /// Forgets every binding for which `keep` is false.
    pub fn retain(&self, keep: impl Fn(&BindingRef) -> bool) {
        let mut inner = self.inner.locked();
        let gone: Vec<BindingRef> = inner.holds.keys().filter(|b| !keep(b)).cloned().collect();
        for binding in &gone {
            inner.release(binding);
        }
        inner.flight.retain(|b, _| keep(b));
        inner.due.retain(|b, _| keep(b));
    }

    /// The binding has planned: every stamp it will make now is submitted.
    pub fn planned(&self, binding: &BindingRef) {
        let mut inner = self.inner.locked();
        let (woken, due) = (inner.flight.remove(binding), inner.due.remove(binding));
        drop(inner);
        if woken.is_some() || due.is_some() {
            self.planned.notify_waiters();
        }
    }

    /// The binding's reconcile ended, planned or not: it is no longer in flight for its wake.
    /// The time it is due, which that reconcile may have set, stays.
    pub fn done(&self, binding: &BindingRef) {
        if self.inner.locked().flight.remove(binding).is_some() {
            self.planned.notify_waiters();
        }
    }

    /// Puts a binding's stamp for a workload on the desk. `others` are the other bindings that
    /// target the workload.
    pub fn submit(&self, target: Target, stamp: Stamp, others: Vec<BindingRef>) -> Turn {
        let mut inner = self.inner.locked();
        if let Some(batch) = inner.open.get_mut(&target) {
            batch.stamps.push(stamp);
            return Turn::Joined(batch.done.subscribe());
        }
        let others: Vec<BindingRef> = others.into_iter().filter(|b| inner.in_flight(b)).collect();
        if others.is_empty() {
            return Turn::Alone(target, stamp);
        }
        inner.open.insert(target.clone(), Batch { stamps: vec![stamp], done: watch::Sender::new(None) });
        Turn::Lead { target, others }
    }

    /// Writes, or waits for, the stamp. `write` gets the stamps of one write: one stamp is
    /// written as its binding's own, several as one joint write. Returns the outcome, and the
    /// held stamps of other bindings that the write carried.
    pub async fn run<F, Fut>(&self, turn: Turn, write: F) -> (Written, Vec<Stamp>)
    where
        F: FnOnce(Vec<Stamp>) -> Fut,
        Fut: Future<Output = Written>,
    {
        let (target, stamps) = match turn {
            Turn::Alone(target, stamp) => (target, vec![stamp]),
            Turn::Joined(done) => return (outcome(done).await, Vec::new()),
            Turn::Lead { target, others } => {
                let deadline = tokio::time::Instant::now() + GATHER;
                loop {
                    let planned = self.planned.notified();
                    if !others.iter().any(|b| self.inner.locked().in_flight(b)) {
                        break;
                    }
                    if tokio::time::timeout_at(deadline, planned).await.is_err() {
                        break;
                    }
                }
                let Some(batch) = self.inner.locked().open.remove(&target) else {
                    return (Err("the stamp was lost from the desk".into()), Vec::new());
                };
                let (stamps, carried) = self.carry(&target, batch.stamps);
                let written = write(stamps).await;
                batch.done.send_replace(Some(written.clone()));
                return (written, carried);
            }
        };
        let (stamps, carried) = self.carry(&target, stamps);
        (write(stamps).await, carried)
    }

    /// Adds to a write of `stamps` on `target` the held stamps of other bindings that stand for
    /// a checksum it writes; they are no longer held. Returns the write's stamps, and those.
    pub fn carry(&self, target: &Target, mut stamps: Vec<Stamp>) -> (Vec<Stamp>, Vec<Stamp>) {
        let mut inner = self.inner.locked();
        let Some(held) = inner.held.get_mut(target) else { return (stamps, Vec::new()) };
        let (carried, kept): (Vec<Stamp>, Vec<Stamp>) = std::mem::take(held).into_iter().partition(|h| {
            !stamps.iter().any(|s| s.binding == h.binding)
                && stamps.iter().any(|s| checksum(&s.value) == checksum(&h.value))
        });
        *held = kept;
        if held.is_empty() {
            inner.held.remove(target);
        }
        stamps.extend(carried.iter().cloned());
        (stamps, carried)
    }
}

/// The checksum a stamp stands for, without the counter of a forced one.
fn checksum(value: &str) -> &str {
    value.split_once('~').map_or(value, |(c, _)| c)
}

impl Inner {
    fn release(&mut self, binding: &BindingRef) {
        for target in self.holds.remove(binding).unwrap_or_default() {
            if let Some(held) = self.held.get_mut(&target) {
                held.retain(|s| s.binding != *binding);
                if held.is_empty() {
                    self.held.remove(&target);
                }
            }
        }
    }

    fn in_flight(&self, binding: &BindingRef) -> bool {
        let now = Instant::now();
        let woken = self.flight.get(binding).is_some_and(|at| now.duration_since(*at) <= STALE);
        let due =
            self.due.get(binding).is_some_and(|at| *at <= now + GATHER && now.saturating_duration_since(*at) <= STALE);
        woken || due
    }

    /// Bindings that never planned (deleted, out of scope) must not pile up.
    fn sweep(&mut self, now: Instant) {
        if self.last_sweep.is_none_or(|at| now.duration_since(at) > STALE) {
            self.flight.retain(|_, at| now.saturating_duration_since(*at) <= STALE);
            self.due.retain(|_, at| now.saturating_duration_since(*at) <= STALE);
            self.last_sweep = Some(now);
        }
    }
}

async fn outcome(mut done: watch::Receiver<Option<Written>>) -> Written {
    match done.wait_for(Option::is_some).await {
        Ok(written) => written.clone().unwrap_or_else(|| Err("no outcome".into())),
        Err(_) => Err("the joint write was abandoned; it is retried".into()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use consulbind_api::WorkloadKind;

    use super::*;

    fn web() -> Target {
        ("ns".into(), (WorkloadKind::Deployment, "web".into()))
    }

    fn stamp(name: &str) -> Stamp {
        Stamp {
            binding: binding(name),
            annotation: format!("a/{name}"),
            value: "sum".into(),
            manager: format!("m-{name}"),
        }
    }

    fn binding(name: &str) -> BindingRef {
        BindingRef::new("ns", name)
    }

    fn version() -> Version {
        Version { uid: "u".into(), generation: 2 }
    }

    #[tokio::test]
    async fn a_stamp_with_no_other_binding_in_flight_is_written_at_once_alone() {
        let desk = Desk::default();
        desk.woken(&binding("b"));
        desk.planned(&binding("b"));
        // "b" targets the workload too, but has planned already.
        let turn = desk.submit(web(), stamp("a"), vec![binding("b")]);
        assert!(matches!(turn, Turn::Alone(..)));
        let written = desk.run(turn, |stamps| async move {
            assert_eq!(stamps, [stamp("a")]);
            Ok(version())
        });
        assert_eq!(written.await, (Ok(version()), Vec::new()));
    }

    #[tokio::test]
    async fn bindings_woken_together_on_one_workload_stamp_it_in_one_write() {
        let desk = Arc::new(Desk::default());
        let (a, b) = (binding("a"), binding("b"));
        desk.woken(&a);
        desk.woken(&b);
        let writes = Arc::new(Mutex::new(Vec::new()));
        let turn = desk.submit(web(), stamp("a"), vec![b.clone()]);
        desk.planned(&a);
        let lead = tokio::spawn({
            let (desk, writes) = (desk.clone(), writes.clone());
            async move {
                desk.run(turn, |stamps| async move {
                    writes.locked().push(stamps);
                    Ok(version())
                })
                .await
                .0
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!lead.is_finished(), "wrote before the other binding in flight had planned");

        let joined = desk.submit(web(), stamp("b"), vec![a.clone()]);
        assert!(matches!(joined, Turn::Joined(_)));
        desk.planned(&b);
        let second = desk.run(joined, |_| async { panic!("a joined stamp is written by its lead") }).await.0;
        assert_eq!(second, Ok(version()));
        assert_eq!(lead.await.unwrap(), Ok(version()));
        assert_eq!(*writes.locked(), [vec![stamp("a"), stamp("b")]]);
    }

    /// How long a stamp that waits for binding `b` still waits once `end` ends `b`'s run: no
    /// time at all, on a clock that stands still while nothing waits on it.
    async fn wait_after(end: impl FnOnce(&Desk, &BindingRef)) -> Duration {
        let desk = Arc::new(Desk::default());
        let b = binding("b");
        desk.woken(&b);
        let turn = desk.submit(web(), stamp("a"), vec![b.clone()]);
        assert!(matches!(turn, Turn::Lead { .. }));
        let lead = tokio::spawn({
            let desk = desk.clone();
            async move {
                desk.run(turn, |stamps| async move { Ok(Version { uid: "u".into(), generation: stamps.len() as i64 }) })
                    .await
                    .0
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!lead.is_finished());
        let started = tokio::time::Instant::now();
        end(&desk, &b);
        let written = tokio::time::timeout(Duration::from_secs(5), lead).await.unwrap().unwrap();
        assert_eq!(written, Ok(Version { uid: "u".into(), generation: 1 }), "one stamp, written alone");
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_binding_that_plans_no_stamp_for_the_workload_ends_the_wait() {
        assert_eq!(wait_after(Desk::planned).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_that_ends_without_a_plan_ends_the_wait() {
        assert_eq!(wait_after(Desk::done).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_binding_that_never_plans_delays_a_stamp_by_the_gathering_window_only() {
        let desk = Desk::default();
        desk.woken(&binding("stuck"));
        let turn = desk.submit(web(), stamp("a"), vec![binding("stuck")]);
        let started = tokio::time::Instant::now();
        let (written, _) = desk.run(turn, |_| async { Ok(version()) }).await;
        assert_eq!(written, Ok(version()));
        assert_eq!(started.elapsed(), GATHER);
        // The next stamp opens a write of its own.
        assert!(matches!(desk.submit(web(), stamp("a"), vec![]), Turn::Alone(..)));
    }

    #[tokio::test]
    async fn a_binding_whose_quiet_period_ends_now_is_waited_for_and_one_due_later_is_not() {
        let desk = Desk::default();
        let (soon, later) = (binding("soon"), binding("later"));
        let now = Instant::now();
        // Set by the reconcile that planned the wait, whose end leaves it in place.
        desk.due(&soon, Some(now + GATHER / 2));
        desk.done(&soon);
        desk.due(&later, Some(now + Duration::from_secs(60)));
        let turn = desk.submit(web(), stamp("a"), vec![soon.clone(), later.clone()]);
        let Turn::Lead { others, .. } = turn else { panic!("wrote alone while a binding's quiet period was ending") };
        assert_eq!(others, std::slice::from_ref(&soon));
        // Its run at the end of the quiet period plans, and is no longer waited for.
        desk.planned(&soon);
        assert!(!desk.inner.locked().in_flight(&soon));
        desk.due(&soon, None);
        desk.inner.locked().open.clear();
        assert!(matches!(desk.submit(web(), stamp("a"), vec![soon, later]), Turn::Alone(..)));
    }

    #[test]
    fn bindings_that_never_plan_are_forgotten_once_stale() {
        let desk = Desk::default();
        let start = Instant::now();
        desk.woken(&binding("gone"));
        desk.due(&binding("deleted"), Some(start + Duration::from_secs(1)));
        let kept_at = |after: Duration| {
            let mut inner = desk.inner.locked();
            inner.sweep(start + after);
            let mut names: Vec<String> =
                inner.flight.keys().chain(inner.due.keys()).map(|b| b.name().to_owned()).collect();
            names.sort();
            names
        };
        assert_eq!(kept_at(STALE / 2), ["deleted", "gone"], "none stale yet");
        assert!(kept_at(STALE * 3).is_empty(), "both stale");
    }

    fn held(name: &str, value: &str) -> (Target, Stamp) {
        (web(), Stamp { value: value.into(), ..stamp(name) })
    }

    #[tokio::test]
    async fn a_write_carries_the_held_stamps_of_its_checksum_once_and_no_others() {
        let desk = Desk::default();
        desk.hold(&binding("b"), vec![held("b", "sum")]);
        desk.hold(&binding("c"), vec![held("c", "other")]);
        // A forced stamp stands for the same checksum.
        let turn = desk.submit(web(), Stamp { value: "sum~1".into(), ..stamp("a") }, vec![binding("b"), binding("c")]);
        let (written, carried) = desk
            .run(turn, |stamps| async move {
                let values: Vec<(&str, &str)> = stamps.iter().map(|s| (s.binding.name(), s.value.as_str())).collect();
                assert_eq!(values, [("a", "sum~1"), ("b", "sum")]);
                Ok(version())
            })
            .await;
        assert_eq!((written, carried), (Ok(version()), vec![stamp("b")]));
        let turn = desk.submit(web(), stamp("a"), vec![]);
        let (_, carried) =
            desk.run(turn, |stamps| async move { Ok(Version { generation: stamps.len() as i64, ..version() }) }).await;
        assert_eq!(carried, [], "a held stamp was carried twice");
        // "c" still holds its own.
        assert_eq!(desk.carry(&web(), vec![Stamp { value: "other".into(), ..stamp("a") }]).1, [held("c", "other").1]);
    }

    #[tokio::test]
    async fn a_binding_holds_what_its_last_plan_held_and_nothing_once_forgotten() {
        let desk = Desk::default();
        let b = binding("b");
        let carried = |desk: &Desk| desk.carry(&web(), vec![stamp("a")]).1;
        desk.hold(&b, vec![held("b", "sum")]);
        desk.hold(&b, vec![]);
        assert_eq!(carried(&desk), []);
        desk.hold(&b, vec![held("b", "sum")]);
        desk.forget(&b);
        assert_eq!(carried(&desk), []);
        desk.hold(&b, vec![held("b", "sum")]);
        desk.retain(|x| *x != b);
        assert_eq!(carried(&desk), []);
        // Its own write never carries its held stamp (a plan holds or rolls a target, not both).
        desk.hold(&b, vec![held("b", "sum")]);
        assert_eq!(desk.carry(&web(), vec![stamp("b")]).1, []);
        assert_eq!(carried(&desk), [stamp("b")]);
        assert!(desk.inner.locked().held.is_empty());
    }

    #[tokio::test]
    async fn a_failed_joint_write_fails_every_stamp_in_it() {
        let desk = Arc::new(Desk::default());
        let (a, b) = (binding("a"), binding("b"));
        desk.woken(&b);
        let lead = desk.submit(web(), stamp("a"), vec![b.clone()]);
        let joined = desk.submit(web(), stamp("b"), vec![a]);
        desk.planned(&b);
        let failed = |_| async { Err::<Version, _>("forbidden".to_owned()) };
        assert_eq!(desk.run(lead, failed).await.0, Err("forbidden".into()));
        assert_eq!(desk.run(joined, |_| async { Ok(version()) }).await.0, Err("forbidden".into()));
    }
}
