//! Waiting on the API server: for bindings to be Ready, for a Deployment's next generation, and
//! a watch that times every Deployment's generations.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use consul_kv::Client as Consul;
use consulbind_api::ConsulBinding;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::Notify;

/// Checks `done` every `every` until it holds; an error naming `what` after `timeout`.
pub(crate) async fn until(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut done: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        if done().await? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits until `bindings` bindings are Ready; false on timeout. Follows a watch rather than
/// listing thousands of bindings again and again, which would load the API server it measures.
pub(crate) async fn all_ready(api: &Api<ConsulBinding>, bindings: usize, timeout: Duration) -> Result<bool> {
    let mut ready = HashSet::new();
    let mut events =
        watcher::watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    let follow = async {
        while let Some(binding) = events.try_next().await? {
            let conditions = binding.status.iter().flat_map(|s| &s.conditions);
            match conditions.into_iter().any(|c| c.type_ == "Ready" && c.status == "True") {
                true => ready.insert(binding.name_any()),
                false => ready.remove(&binding.name_any()),
            };
            if ready.len() == bindings {
                return Ok::<_, anyhow::Error>(true);
            }
        }
        Ok(false)
    };
    tokio::time::timeout(timeout, follow).await.unwrap_or(Ok(false))
}

/// One Deployment whose rollouts are timed by reading its generation, polled every `poll`.
pub(crate) struct Rollout {
    deployments: Api<Deployment>,
    name: String,
    poll: Duration,
    /// How long a rollout may take before the benchmark fails.
    within: Duration,
}

impl Rollout {
    pub(crate) fn new(deployments: Api<Deployment>, name: &str, poll: Duration, within: Duration) -> Self {
        Self { deployments, name: name.to_owned(), poll, within }
    }

    /// Makes `change` (`what`, for the error) and waits for the Deployment's next generation.
    pub(crate) async fn after<T, E>(&self, what: &str, change: impl Future<Output = Result<T, E>>) -> Result<Timed>
    where
        anyhow::Error: From<E>,
    {
        let before = self.deployments.get(&self.name).await?.metadata.generation;
        let changed = Instant::now();
        change.await?;
        let change = changed.elapsed();
        let moved = async || Ok(self.deployments.get(&self.name).await?.metadata.generation != before);
        until(&format!("a rollout of {} after {what}", self.name), self.within, self.poll, moved).await?;
        Ok(Timed { total: changed.elapsed(), change })
    }
}

/// How long a rollout took.
pub(crate) struct Timed {
    /// From just before the change to the new generation.
    pub total: Duration,
    /// Of which the change itself (the write) took.
    pub change: Duration,
}

/// Deployments' generations as a watch sees them, with the time each was first seen: the end
/// of a change's latency, measured the same way for every controller.
pub(crate) struct Generations {
    seen: Arc<Mutex<HashMap<String, (i64, Instant)>>>,
    /// Told of every new generation, so that waiting for one costs no polling.
    moved: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Generations {
    pub(crate) fn watch(deployments: Api<Deployment>) -> Self {
        let seen: Arc<Mutex<HashMap<String, (i64, Instant)>>> = Default::default();
        let moved = Arc::new(Notify::new());
        let task = tokio::spawn({
            let (seen, moved) = (seen.clone(), moved.clone());
            async move {
                let mut events = watcher::watcher(deployments, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(Ok(d)) = events.next().await {
                    let generation = d.metadata.generation.unwrap_or_default();
                    let mut seen = seen.lock().unwrap();
                    let entry = seen.entry(d.name_any()).or_insert((generation, Instant::now()));
                    if entry.0 != generation {
                        *entry = (generation, Instant::now());
                        moved.notify_waiters();
                    }
                }
            }
        });
        Self { seen, moved, task }
    }

    /// Every Deployment's generation now.
    pub(crate) fn now(&self) -> HashMap<String, i64> {
        self.seen.lock().unwrap().iter().map(|(name, (generation, _))| (name.clone(), *generation)).collect()
    }

    /// Waits until every one of `targets` has reached its generation in `expected`, and returns
    /// how long after `from` the last of them was seen; `None` after `timeout`.
    pub(crate) async fn reached(
        &self,
        targets: &[String],
        expected: &HashMap<String, i64>,
        from: Instant,
        timeout: Duration,
    ) -> Option<Duration> {
        let deadline = tokio::time::Instant::from_std(from + timeout);
        loop {
            let next = self.moved.notified();
            let done: Option<Instant> = {
                let seen = self.seen.lock().unwrap();
                let at: Option<Vec<Instant>> =
                    targets.iter().map(|t| seen.get(t).filter(|(g, _)| *g >= expected[t]).map(|(_, at)| *at)).collect();
                at.and_then(|at| at.into_iter().max())
            };
            if let Some(at) = done {
                return Some(at.saturating_duration_since(from));
            }
            tokio::time::timeout_at(deadline, next).await.ok()?;
        }
    }

    /// Writes `value` to Consul `key`, which should roll each of `targets` once more than
    /// `expected` (bumped here), and times it until the watch sees them all; `None` if it does not
    /// within `timeout`.
    pub(crate) async fn time_change(
        &self,
        consul: &Consul,
        (key, value): (&str, &str),
        targets: &[String],
        expected: &mut HashMap<String, i64>,
        timeout: Duration,
    ) -> Result<Option<Duration>> {
        for target in targets {
            *expected.get_mut(target).with_context(|| format!("the watch never saw {target}"))? += 1;
        }
        let written = Instant::now();
        consul.put(key, value.as_bytes(), None).await?;
        Ok(self.reached(targets, expected, written, timeout).await)
    }

    /// Rollouts beyond `expected`: generations that moved with no change to move them.
    pub(crate) fn spurious(&self, expected: &HashMap<String, i64>) -> i64 {
        let now = self.now();
        expected.iter().map(|(name, want)| (now.get(name).copied().unwrap_or_default() - want).max(0)).sum()
    }

    /// Waits until the watch has seen `count` Deployments; false after `timeout`.
    pub(crate) async fn seen(&self, count: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.seen.lock().unwrap().len() < count {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    /// Waits until no generation has moved for `quiet`, at most `timeout`.
    pub(crate) async fn settle(&self, quiet: Duration, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if tokio::time::timeout(quiet, self.moved.notified()).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Generations {
    fn drop(&mut self) {
        self.task.abort();
    }
}
