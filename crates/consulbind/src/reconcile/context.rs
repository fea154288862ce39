//! What every reconcile of one scope shares: clients, caches and this replica's memory of each
//! binding.

use std::sync::{Arc, Mutex};

use kube::{
    Client,
    runtime::{events::Reporter, reflector::Store},
};

use super::{desk::Desk, express::Express, state::States};
use crate::{
    BindingRef, Lock, checksum,
    cluster::{interest::Interest, objects::Objects, policy::Policy, tokens::Tokens, workloads::Workloads},
    metrics::Metrics,
    watches::Watches,
};

pub struct Context {
    pub client: Client,
    /// Who records the events (see `report::publish`).
    pub reporter: Reporter,
    pub watches: Watches,
    pub workloads: Workloads,
    pub tokens: Tokens,
    /// The ConfigMaps and Secrets that bindings read.
    pub objects: Objects,
    /// What the default token may read in each namespace.
    pub policy: Policy,
    /// Keys every checksum, so that none can be checked against a guessed value.
    pub checksum_key: checksum::Key,
    /// `--dry-run`: every binding reports instead of rolling.
    pub dry_run: bool,
    /// See `--max-binding-bytes`.
    pub max_binding_bytes: u64,
    /// See `--object-failure-grace`.
    pub object_failure_grace: std::time::Duration,
    /// The most bindings of one namespace served; the oldest are.
    pub max_bindings_per_namespace: usize,
    /// The bindings refused for that share.
    pub crowded: super::crowded::Crowded,
    /// See `--max-watched-paths-per-namespace`.
    pub max_watched_paths_per_namespace: usize,
    /// The writes to the API server, shared fairly between namespaces.
    pub writes: crate::writes::Writes,
    /// See `--default-rollout-budget` and `--default-rollout-windows`.
    pub staging_defaults: super::staging::Defaults,
    /// See `--consul-restore-grace`.
    pub restore_grace: std::time::Duration,
    pub bindings: Store<crate::cached::Cached>,
    /// Which bindings a workload, token Secret, ConfigMap or Secret event wakes.
    pub interest: Arc<Mutex<Interest>>,
    pub metrics: Arc<Metrics>,
    /// Each binding's record, across scopes.
    pub states: Arc<States>,
    /// Which bindings are being reconciled, and the runs that start on a Consul wake.
    pub express: Arc<Express>,
    /// Stamps due together on one workload, written together.
    pub desk: Arc<Desk>,
}

impl Context {
    /// Forgets a deleted binding: its watches, its interest and its record.
    pub fn forget(&self, binding: &BindingRef) {
        self.unsubscribe(binding);
        self.states.delete(binding);
    }

    /// Forgets every binding for which `keep` is false.
    pub fn retain(&self, keep: impl Fn(&BindingRef) -> bool) {
        self.watches.retain(&keep);
        self.desk.retain(&keep);
        self.interest.locked().retain(&keep);
        self.forget_unread();
        self.states.reset(&keep);
    }

    /// Drops the digests of the ConfigMaps and Secrets that no binding reads any more.
    pub fn forget_unread(&self) {
        let freed = self.interest.locked().take_freed();
        self.objects.forget(&freed);
        self.metrics.object_digests.set(self.objects.digested() as i64);
    }

    /// Stops watching for a binding that cannot be served now, keeping its record.
    pub fn unsubscribe(&self, binding: &BindingRef) {
        self.desk.forget(binding);
        self.watches.release(binding);
        self.interest.locked().remove(binding);
        self.forget_unread();
    }
}
