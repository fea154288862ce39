//! The controller's writes to the API server (stamps, statuses, events), shared between
//! namespaces. At most `slots` are in flight. A namespace alone may use them all; while
//! several wait, each freed slot goes to the next of them in turn, one write each. So a
//! namespace whose content changes without pause queues behind its own writes (its reconciles
//! wait, and its changes coalesce), and another namespace's rollout waits for at most one write
//! of each busy namespace, not for the flood.
//!
//! With `--namespace-write-limit`, each namespace also has a rate (a token bucket of `N` per
//! span). A reconcile asks [`Writes::held`] before it writes: a namespace over its rate writes
//! nothing but one status that says so, and its changes wait, coalesced, until it is within.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use consulbind_api::parse_rate;
use tokio::{sync::oneshot, time::Instant};

use crate::{
    Lock,
    shards::{Gate, NotServed, gate::Entry},
};

#[derive(Clone)]
pub struct Writes {
    queue: Arc<Mutex<Queue>>,
    /// A sharded replica's: each write goes ahead only in a namespace it serves.
    gate: Option<Arc<Gate>>,
}

/// A namespace's write rate: at most `max` writes in any `per`, as `N/span` such as `100/1m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub max: u32,
    pub per: Duration,
}

impl Rate {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (max, per) = parse_rate(text, "100/1m")?;
        if max == 0 || per.is_zero() || per > Duration::from_secs(24 * 3600) {
            return Err(format!("{text:?}: the count must be at least 1 and the span between 1ms and 24h"));
        }
        Ok(Self { max, per })
    }

    /// The time one write takes of the rate.
    fn interval(&self) -> Duration {
        self.per / self.max
    }

    /// How far ahead of its rate a namespace may write: a burst of `max`.
    fn burst(&self) -> Duration {
        self.per - self.interval()
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} per {:?}", self.max, self.per)
    }
}

struct Queue {
    free: usize,
    rate: Option<Rate>,
    /// When each namespace's rate is next free, had it used none of its burst (the theoretical
    /// arrival time of the generic cell rate algorithm); only namespaces that wrote lately.
    due: HashMap<String, Instant>,
    /// The writes waiting, by namespace, in the order they came.
    waiting: HashMap<String, VecDeque<oneshot::Sender<()>>>,
    /// The namespaces with writes waiting, in turn.
    turns: VecDeque<String>,
}

/// A slot for one write; dropping it passes the slot on.
#[must_use]
pub struct Permit {
    queue: Arc<Mutex<Queue>>,
    _entry: Option<Entry>,
}

impl Writes {
    pub fn new(slots: usize, rate: Option<Rate>, gate: Option<Arc<Gate>>) -> Self {
        let queue =
            Queue { free: slots.max(1), rate, due: HashMap::new(), waiting: HashMap::new(), turns: VecDeque::new() };
        Self { queue: Arc::new(Mutex::new(queue)), gate }
    }

    /// A sharded replica's gate.
    pub fn gate(&self) -> Option<&Arc<Gate>> {
        self.gate.as_ref()
    }

    /// The namespace's rate, if it has one.
    pub fn rate(&self) -> Option<Rate> {
        self.queue.locked().rate
    }

    /// When `namespace` may write again, if it is over its rate now.
    pub fn held(&self, namespace: &str) -> Option<Instant> {
        let queue = self.queue.locked();
        let rate = queue.rate?;
        let free = queue.due.get(namespace)?.checked_sub(rate.burst())?;
        (free > Instant::now()).then_some(free)
    }

    /// Waits for the namespace's rate, then for a slot, for a write in `namespace`.
    pub async fn permit(&self, namespace: &str) -> Result<Permit, NotServed> {
        let start = self.queue.locked().take_rate(namespace);
        if let Some(start) = start {
            tokio::time::sleep_until(start).await;
        }
        self.admit(self.slot(namespace).await, namespace)
    }

    /// A slot for the one write that tells a binding its namespace is over its rate: it takes
    /// none of the rate, or the namespace could never be told.
    pub async fn notice(&self, namespace: &str) -> Result<Permit, NotServed> {
        self.admit(self.slot(namespace).await, namespace)
    }

    /// Asks the gate last, once the write is about to go.
    fn admit(&self, mut permit: Permit, namespace: &str) -> Result<Permit, NotServed> {
        if let Some(gate) = &self.gate {
            permit._entry = Some(gate.enter(namespace)?);
        }
        Ok(permit)
    }

    async fn slot(&self, namespace: &str) -> Permit {
        let receiver = {
            let mut queue = self.queue.locked();
            if queue.free > 0 && queue.turns.is_empty() {
                queue.free -= 1;
                return Permit { queue: self.queue.clone(), _entry: None };
            }
            let (sender, receiver) = oneshot::channel();
            let waiting = queue.waiting.entry(namespace.to_owned()).or_default();
            waiting.push_back(sender);
            if waiting.len() == 1 {
                queue.turns.push_back(namespace.to_owned());
            }
            receiver
        };
        let mut waiting = Waiting { receiver, queue: self.queue.clone() };
        // The sender is only dropped after a slot was handed over, or with the queue.
        let _ = (&mut waiting.receiver).await;
        Permit { queue: self.queue.clone(), _entry: None }
    }

    /// Writes waiting for a slot.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.queue.locked().waiting.values().map(VecDeque::len).sum()
    }
}

impl Queue {
    /// Takes one write of the namespace's rate: when it may start.
    fn take_rate(&mut self, namespace: &str) -> Option<Instant> {
        let rate = self.rate?;
        let now = Instant::now();
        if self.due.len() > 1024 {
            self.due.retain(|_, due| *due > now);
        }
        let due = self.due.entry(namespace.to_owned()).or_insert(now);
        let start = due.checked_sub(rate.burst()).map_or(now, |free| free.max(now));
        *due = (*due).max(now) + rate.interval();
        (start > now).then_some(start)
    }

    /// Hands a freed slot to the next namespace in turn, or keeps it.
    fn release(&mut self) {
        while let Some(namespace) = self.turns.pop_front() {
            let Some(waiting) = self.waiting.get_mut(&namespace) else { continue };
            let next = waiting.pop_front();
            if waiting.is_empty() {
                self.waiting.remove(&namespace);
            } else {
                self.turns.push_back(namespace);
            }
            // A waiter that went away takes no slot.
            if next.is_some_and(|sender| sender.send(()).is_ok()) {
                return;
            }
        }
        self.free += 1;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.queue.locked().release();
    }
}

/// A write waiting for its slot; given one and dropped before it took it, it passes it on.
struct Waiting {
    receiver: oneshot::Receiver<()>,
    queue: Arc<Mutex<Queue>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.receiver.try_recv().is_ok() {
            self.queue.locked().release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_namespace_alone_uses_every_slot() {
        let writes = Writes::new(3, None, None);
        let permits = [
            writes.permit("a").await.expect("no gate"),
            writes.permit("a").await.expect("no gate"),
            writes.permit("a").await.expect("no gate"),
        ];
        assert_eq!(writes.queue.locked().free, 0);
        drop(permits);
        assert_eq!(writes.queue.locked().free, 3);
    }

    #[tokio::test]
    async fn waiting_namespaces_take_freed_slots_in_turn_whatever_they_queued() {
        let writes = Writes::new(1, None, None);
        let first = writes.permit("flood").await.expect("no gate");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // The flooding namespace queues ten writes before the quiet one queues its one.
        for (i, namespace) in std::iter::repeat_n("flood", 10).chain(["quiet"]).enumerate() {
            let (queued, order) = (writes.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = queued.permit(namespace).await.expect("no gate");
                order.locked().push(namespace);
                tokio::task::yield_now().await;
            }));
            while writes.waiting() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.locked().clone();
        assert_eq!(
            order.iter().position(|n| *n == "quiet"),
            Some(1),
            "one write of the flood, then the quiet one: {order:?}"
        );
        assert_eq!(writes.queue.locked().free, 1);
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_takes_no_slot() {
        let writes = Writes::new(1, None, None);
        let held = writes.permit("a").await.expect("no gate");
        let gone = tokio::spawn({
            let writes = writes.clone();
            async move { writes.permit("b").await.expect("no gate") }
        });
        while writes.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(held);
        assert_eq!(writes.queue.locked().free, 1, "the slot came back");
        let _again = writes.permit("c").await.expect("no gate");
    }

    #[tokio::test(start_paused = true)]
    async fn a_namespace_writes_its_burst_then_at_its_rate_and_others_are_not_held() {
        let rate = Rate::parse("3/3s").unwrap();
        let writes = Writes::new(8, Some(rate), None);
        let start = Instant::now();
        for _ in 0..3 {
            drop(writes.permit("flood").await.expect("no gate"));
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst goes at once");
        let free = writes.held("flood").expect("over its rate after its burst");
        assert_eq!(free - start, Duration::from_secs(1));
        assert_eq!(writes.held("quiet"), None, "another namespace has its own rate");
        drop(writes.notice("flood").await.expect("no gate"));
        assert_eq!(writes.held("flood"), Some(free), "the notice takes none of the rate");
        drop(writes.permit("flood").await.expect("no gate"));
        assert_eq!(start.elapsed(), Duration::from_secs(1), "the next write waits its turn");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(writes.held("flood"), None, "the rate refills");
    }

    #[test]
    fn rates_parse_and_nonsense_is_refused() {
        assert_eq!(Rate::parse("100/1m"), Ok(Rate { max: 100, per: Duration::from_secs(60) }));
        for bad in ["0/1m", "5/0s", "5", "x/1m", "5/25h", "-1/1m"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn without_a_rate_nothing_is_held() {
        let writes = Writes::new(1, None, None);
        for _ in 0..100 {
            drop(writes.permit("a").await.expect("no gate"));
        }
        assert_eq!(writes.held("a"), None);
    }
}
