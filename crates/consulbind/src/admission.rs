//! How many bindings the watch of bindings may hand to kube-runtime's queue before their
//! reconciles start. That queue keeps the room of the most it ever held, a few hundred bytes per
//! binding, so a cold start that handed it every binding at once would keep that room for good.
//! The rest wait in a list of names, 16 bytes each, and only until the queue has room.

use std::{collections::HashMap, sync::Arc};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{BindingRef, Lock};

pub struct Admission {
    permits: Arc<Semaphore>,
    /// The bindings handed to the queue whose reconcile has not started yet.
    queued: std::sync::Mutex<HashMap<BindingRef, OwnedSemaphorePermit>>,
}

impl Admission {
    pub fn new(limit: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(limit)), queued: Default::default() }
    }

    /// Waits until `binding` may join the queue. One already queued needs no room of its own:
    /// the queue holds a binding once.
    pub async fn admit(&self, binding: &BindingRef) {
        if self.queued.locked().contains_key(binding) {
            return;
        }
        let permit = self.permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        self.queued.locked().entry(binding.clone()).or_insert(permit);
    }

    /// The binding's reconcile started, or it is gone: its room is free.
    pub fn started(&self, binding: &BindingRef) {
        self.queued.locked().remove(binding);
    }

    #[cfg(test)]
    fn free(&self) -> usize {
        self.permits.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn binding(name: &str) -> BindingRef {
        BindingRef::new("ns", name)
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_admits_the_next_binding_once_a_queued_one_starts() {
        let admission = Arc::new(Admission::new(2));
        admission.admit(&binding("a")).await;
        admission.admit(&binding("b")).await;
        admission.admit(&binding("a")).await;
        assert_eq!(admission.free(), 0, "queued twice, counted once");

        let waiting = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit(&binding("c")).await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "no room until a queued binding starts");
        admission.started(&binding("x"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "a binding that was not queued frees nothing");

        admission.started(&binding("a"));
        waiting.await.unwrap();
        assert_eq!(admission.free(), 0);
        admission.started(&binding("b"));
        admission.started(&binding("c"));
        admission.started(&binding("c"));
        assert_eq!(admission.free(), 2, "every start frees its room once");
    }
}
