//! Starts a binding's reconcile the moment Consul reports new content.
//!
//! kube-runtime's scheduler puts every request on a timer, even one due now, and the timer fires
//! on its next millisecond tick: 1 to 2 ms, most of the controller's own part of a change. A
//! Consul wake still goes through kube-runtime's queue, which keeps its retries and resyncs; when
//! the binding is idle and a slot is free, it also runs at once. The queued run follows and finds
//! nothing left to do. One mark per binding keeps the two from running it at the same time.
//!
//! This module holds only the marks and the slots; the driver starts the runs.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::BindingRef;
use crate::Lock;

/// Express runs at once; Consul changes arrive one binding at a time, and a burst (a cold start,
/// a group of bindings woken together) is kube-runtime's to spread.
const SLOTS: usize = 4;

pub struct Express {
    running: Mutex<HashSet<BindingRef>>,
    finished: Notify,
    slots: Arc<Semaphore>,
}

impl Default for Express {
    fn default() -> Self {
        Self { running: Mutex::default(), finished: Notify::new(), slots: Arc::new(Semaphore::new(SLOTS)) }
    }
}

/// A binding marked running; the mark goes when this drops.
pub struct Running {
    express: Arc<Express>,
    binding: BindingRef,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.express.running.locked().remove(&self.binding);
        self.express.finished.notify_waiters();
    }
}

/// An express run's mark and slot, both given back when it drops.
pub struct Ticket {
    _running: Running,
    _slot: OwnedSemaphorePermit,
}

impl Express {
    /// Marks `binding` running, once no other run has it.
    pub async fn enter(self: &Arc<Self>, binding: &BindingRef) -> Running {
        loop {
            // Made before the check, so that a run finishing in between still wakes it.
            let finished = self.finished.notified();
            if let Some(running) = self.try_enter(binding) {
                return running;
            }
            finished.await;
        }
    }

    fn try_enter(self: &Arc<Self>, binding: &BindingRef) -> Option<Running> {
        let fresh = self.running.locked().insert(binding.clone());
        fresh.then(|| Running { express: self.clone(), binding: binding.clone() })
    }

    /// A ticket to run `binding` now, if it is idle and a slot is free; otherwise the queue
    /// has it.
    pub fn try_start(self: &Arc<Self>, binding: &BindingRef) -> Option<Ticket> {
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        Some(Ticket { _running: self.try_enter(binding)?, _slot: slot })
    }

    /// Waits for the express runs in flight, and starts no more: for a clean shutdown.
    pub async fn drain(&self) {
        if let Ok(all) = self.slots.acquire_many(SLOTS as u32).await {
            all.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_binding_runs_once_at_a_time() {
        let express = Arc::new(Express::default());
        let binding = BindingRef::new("ns", "b");
        let first = express.enter(&binding).await;
        assert!(express.try_enter(&binding).is_none());
        assert!(express.try_enter(&BindingRef::new("ns", "other")).is_some());

        let waiting = tokio::spawn({
            let (express, binding) = (express.clone(), binding.clone());
            async move { express.enter(&binding).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "entered while another run had the binding");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert!(express.try_enter(&binding).is_none());
        drop(second);
        assert!(express.try_enter(&binding).is_some());
    }

    #[tokio::test]
    async fn express_runs_take_a_slot_each_and_drain_waits_for_them() {
        let express = Arc::new(Express::default());
        let tickets: Vec<Ticket> =
            (0..SLOTS).map(|i| express.try_start(&BindingRef::new("ns", &format!("b{i}"))).unwrap()).collect();
        assert!(express.try_start(&BindingRef::new("ns", "late")).is_none(), "no slot left");
        drop(tickets);
        let busy = express.try_start(&BindingRef::new("ns", "b0")).unwrap();
        assert!(express.try_start(&BindingRef::new("ns", "b0")).is_none(), "b0 is running");

        let drain = tokio::spawn({
            let express = express.clone();
            async move { express.drain().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!drain.is_finished(), "drained while a run was in flight");
        drop(busy);
        tokio::time::timeout(Duration::from_secs(5), drain).await.unwrap().unwrap();
        assert!(express.try_start(&BindingRef::new("ns", "after")).is_none(), "started after the drain");
    }
}
