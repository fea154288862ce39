//! The controller's writes to the API server (stamps, statuses, events), shared between
//! namespaces. At most `slots` are in flight. A namespace alone may use them all; while
//! several wait, each freed slot goes to the next of them in turn, one write each. So a
//! namespace whose content changes without pause queues behind its own writes (its reconciles
//! wait, and its changes coalesce), and another namespace's rollout waits for at most one write
//! of each busy namespace, not for the flood.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use tokio::sync::oneshot;

use crate::Lock;

#[derive(Clone)]
pub struct Writes {
    queue: Arc<Mutex<Queue>>,
}

struct Queue {
    free: usize,
    /// The writes waiting, by namespace, in the order they came.
    waiting: HashMap<String, VecDeque<oneshot::Sender<()>>>,
    /// The namespaces with writes waiting, in turn.
    turns: VecDeque<String>,
}

/// A slot for one write; dropping it passes the slot on.
#[must_use]
pub struct Permit {
    queue: Arc<Mutex<Queue>>,
}

impl Writes {
    pub fn new(slots: usize) -> Self {
        let queue = Queue { free: slots.max(1), waiting: HashMap::new(), turns: VecDeque::new() };
        Self { queue: Arc::new(Mutex::new(queue)) }
    }

    /// Waits for a slot for a write in `namespace`.
    pub async fn permit(&self, namespace: &str) -> Permit {
        let receiver = {
            let mut queue = self.queue.locked();
            if queue.free > 0 && queue.turns.is_empty() {
                queue.free -= 1;
                return Permit { queue: self.queue.clone() };
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
        Permit { queue: self.queue.clone() }
    }

    /// Writes waiting for a slot.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.queue.locked().waiting.values().map(VecDeque::len).sum()
    }
}

impl Queue {
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
        let writes = Writes::new(3);
        let permits = [writes.permit("a").await, writes.permit("a").await, writes.permit("a").await];
        assert_eq!(writes.queue.locked().free, 0);
        drop(permits);
        assert_eq!(writes.queue.locked().free, 3);
    }

    #[tokio::test]
    async fn waiting_namespaces_take_freed_slots_in_turn_whatever_they_queued() {
        let writes = Writes::new(1);
        let first = writes.permit("flood").await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // The flooding namespace queues ten writes before the quiet one queues its one.
        for (i, namespace) in std::iter::repeat_n("flood", 10).chain(["quiet"]).enumerate() {
            let (queued, order) = (writes.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = queued.permit(namespace).await;
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
        let writes = Writes::new(1);
        let held = writes.permit("a").await;
        let gone = tokio::spawn({
            let writes = writes.clone();
            async move { writes.permit("b").await }
        });
        while writes.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(held);
        assert_eq!(writes.queue.locked().free, 1, "the slot came back");
        let _again = writes.permit("c").await;
    }
}
