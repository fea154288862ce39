//! Lets a list's bindings into kube-runtime's queue a few at a time.
//!
//! kube-runtime's scheduler keeps each request in a map, a set and a timer slab until a reconcile
//! slot takes it, and none of the three gives memory back. A cold start of 10,000 bindings handed
//! over at once left them sized for 10,000 for the life of the process, though only
//! [`ADMITTED`] wait at any moment when a list comes through here.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{Stream, StreamExt, channel::mpsc};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use crate::{BindingRef, Lock};

/// Bindings let in whose reconcile has not started: a few rounds of the reconcile slots, so that
/// none waits for work.
const ADMITTED: usize = 128;
/// So long without one admitted binding starting, and the rest are no longer waited for; a
/// request kube-runtime dropped must not hold back the list behind it.
const STALL: Duration = Duration::from_secs(10);

pub struct Intake {
    slots: Arc<Semaphore>,
    admitted: Mutex<HashMap<BindingRef, OwnedSemaphorePermit>>,
}

impl Default for Intake {
    fn default() -> Self {
        Self { slots: Arc::new(Semaphore::new(ADMITTED)), admitted: Mutex::default() }
    }
}

impl Intake {
    /// Waits for a free place, and holds it for `binding` until its reconcile starts.
    async fn admit(&self, binding: &BindingRef) {
        if self.admitted.locked().contains_key(binding) {
            return;
        }
        let slot = match tokio::time::timeout(STALL, self.slots.clone().acquire_owned()).await {
            Ok(slot) => slot,
            Err(_) => {
                debug!("no admitted binding started in {STALL:?}; letting the list go on");
                std::mem::take(&mut *self.admitted.locked());
                self.slots.clone().acquire_owned().await
            }
        };
        let slot = slot.expect("the semaphore is never closed");
        self.admitted.locked().insert(binding.clone(), slot);
    }

    /// `binding`'s reconcile has started, or found it gone: its place is free.
    pub fn started(&self, binding: &BindingRef) {
        self.admitted.locked().remove(binding);
    }

    /// Each list sent on `lists`, one binding at a time as places free, the namespaces taking
    /// turns: a cold start serves every team from the start, and one team's many bindings do not
    /// all wait on its namespace's share of the writes. `wanted` drops a binding gone or
    /// unchanged by the time its turn comes.
    pub fn paced(
        self: Arc<Self>,
        lists: mpsc::UnboundedReceiver<Vec<BindingRef>>,
        wanted: impl Fn(&BindingRef) -> bool + Send + Sync + 'static,
    ) -> impl Stream<Item = BindingRef> + Send + 'static {
        let wanted = Arc::new(wanted);
        futures::stream::unfold((lists, VecDeque::new()), move |(mut lists, mut queue)| {
            let (intake, wanted) = (self.clone(), wanted.clone());
            async move {
                loop {
                    while let Ok(list) = lists.try_recv() {
                        queue.extend(turns(list));
                    }
                    let Some(binding) = queue.pop_front() else {
                        // Its capacity is the last list's size.
                        queue = VecDeque::new();
                        queue.extend(turns(lists.next().await?));
                        continue;
                    };
                    if wanted(&binding) {
                        intake.admit(&binding).await;
                        return Some((binding, (lists, queue)));
                    }
                }
            }
        })
    }
}

/// `list` with its namespaces taking turns: the first of each, then the second of each, and so on.
fn turns(list: Vec<BindingRef>) -> Vec<BindingRef> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut ranked: Vec<(usize, usize)> = list
        .iter()
        .enumerate()
        .map(|(at, binding)| {
            let turn = seen.entry(binding.namespace()).or_default();
            *turn += 1;
            (*turn, at)
        })
        .collect();
    ranked.sort_unstable();
    let mut list: Vec<Option<BindingRef>> = list.into_iter().map(Some).collect();
    ranked.into_iter().filter_map(|(_, at)| list[at].take()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[(&str, &str)]) -> Vec<BindingRef> {
        names.iter().map(|(ns, name)| BindingRef::new(ns, name)).collect()
    }

    fn names(bindings: &[BindingRef]) -> Vec<String> {
        bindings.iter().map(|b| format!("{}/{}", b.namespace(), b.name())).collect()
    }

    #[test]
    fn namespaces_take_turns_and_each_keeps_its_order() {
        let listed = list(&[("a", "1"), ("a", "2"), ("a", "3"), ("b", "1"), ("c", "1"), ("c", "2")]);
        assert_eq!(names(&turns(listed)), ["a/1", "b/1", "c/1", "a/2", "c/2", "a/3"]);
    }

    /// At most `ADMITTED` wait in kube-runtime's queue; each start lets the next one in, and the
    /// list ends with every wanted binding let in once.
    #[tokio::test(start_paused = true)]
    async fn a_list_is_let_in_as_reconciles_start() {
        let intake = Arc::new(Intake::default());
        let (tx, rx) = mpsc::unbounded();
        let listed: Vec<BindingRef> = (0..ADMITTED + 10).map(|i| BindingRef::new("team", &format!("b{i}"))).collect();
        let gone = listed[3].clone();
        tx.unbounded_send(listed.clone()).unwrap();
        drop(tx);
        let mut paced = Box::pin(intake.clone().paced(rx, move |b| *b != gone));

        let mut first = Vec::new();
        while let Ok(Some(binding)) = tokio::time::timeout(Duration::from_secs(1), paced.next()).await {
            first.push(binding);
        }
        assert_eq!(first.len(), ADMITTED, "the rest wait for starts");
        assert!(!first.contains(&listed[3]), "a binding gone is not let in");

        intake.started(&first[0]);
        intake.started(&first[0]);
        let next = tokio::time::timeout(Duration::from_secs(1), paced.next()).await.unwrap().unwrap();
        assert_eq!(next, listed[ADMITTED + 1]);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), paced.next()).await.is_err(),
            "one start lets one more in, however often it is told"
        );

        for binding in &first[1..] {
            intake.started(binding);
        }
        intake.started(&next);
        let rest: Vec<BindingRef> = paced.collect().await;
        assert_eq!(rest, listed[ADMITTED + 2..]);
    }

    /// A binding let in twice before it starts holds one place: kube-runtime merges the two.
    #[tokio::test(start_paused = true)]
    async fn a_binding_listed_twice_holds_one_place() {
        let intake = Arc::new(Intake::default());
        let (tx, rx) = mpsc::unbounded();
        let once = BindingRef::new("team", "once");
        tx.unbounded_send(vec![once.clone(), once.clone()]).unwrap();
        let mut paced = Box::pin(intake.clone().paced(rx, |_| true));
        assert_eq!(paced.next().await, Some(once.clone()));
        assert_eq!(paced.next().await, Some(once.clone()));
        assert_eq!(intake.slots.available_permits(), ADMITTED - 1);
        intake.started(&once);
        assert_eq!(intake.slots.available_permits(), ADMITTED);
    }

    /// Requests that never start (kube-runtime lost them) hold the list back for `STALL`, not
    /// for ever.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_list_goes_on() {
        let intake = Arc::new(Intake::default());
        let (tx, rx) = mpsc::unbounded();
        let listed: Vec<BindingRef> = (0..ADMITTED + 1).map(|i| BindingRef::new("team", &format!("b{i}"))).collect();
        tx.unbounded_send(listed.clone()).unwrap();
        let mut paced = Box::pin(intake.clone().paced(rx, |_| true));
        for _ in 0..ADMITTED {
            paced.next().await.unwrap();
        }
        let start = tokio::time::Instant::now();
        assert_eq!(paced.next().await.as_ref(), listed.last());
        assert_eq!(start.elapsed(), STALL);
    }
}
