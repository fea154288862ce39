//! consulbind: rolls Kubernetes workloads when the Consul KV content they read changes.
//!
//! The path of a change, room by room:
//! - [`watches`] holds the shared blocking queries to Consul: the registry of bindings and
//!   paths, the planner that cuts paths into groups, and the runner that follows each group and
//!   wakes the bindings whose content changed.
//! - [`cluster`] keeps read-only caches of what the cluster holds: workloads, token Secrets, the
//!   namespaces' default-token policy, and which bindings an event concerns.
//! - [`reconcile`] drives one binding: read (Consul and the caches), plan (pure), stamp the pod
//!   templates, report the status and events. Stamp and report are the only writes.
//! - [`checksum`] is the keyed checksum of the content, and the Secret that holds its key.
//!
//! [`controller`] wires them together, and [`intake`] lets a list's bindings into its queue a
//! few at a time; [`lease`] elects a leader, or [`shards`] shares the namespaces between
//! replicas; [`admin`] serves health, metrics and the debug listing.

pub mod admin;
pub mod cached;
pub mod checksum;
pub mod cluster;
pub mod config;
pub mod controller;
pub mod intake;
pub mod lease;
pub mod metrics;
pub mod migrate;
pub mod names;
pub mod probe;
pub mod reconcile;
#[cfg(test)]
mod reference;
pub mod shards;
#[cfg(test)]
mod sim;
pub mod watches;
pub mod writes;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::runtime::reflector::ObjectRef;

/// Locks a mutex even after a panic poisoned it. One binding's panic must not stop the
/// bindings of every other team: every lock here guards an index or a cache whose entries stay
/// valid on their own, and a panicking reconcile is caught and retried.
pub trait Lock<T> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Lock<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Lock`] for a lock of many readers.
pub trait ReadWrite<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> ReadWrite<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A binding by namespace and name, as one shared `namespace/name`: the records, the interest,
/// the watches and the desk each name tens of thousands of bindings, and a clone costs 16 bytes
/// where kube's `ObjectRef` costs 96 and two strings.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BindingRef(Arc<str>);

impl BindingRef {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(format!("{namespace}/{name}").into())
    }

    /// Neither part holds a `/`: both are DNS names.
    fn parts(&self) -> (&str, &str) {
        self.0.split_once('/').unwrap_or(("", &self.0))
    }

    pub fn namespace(&self) -> &str {
        self.parts().0
    }

    pub fn name(&self) -> &str {
        self.parts().1
    }

    /// Whether both are the one shared copy.
    #[cfg(test)]
    pub fn shares(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// kube-runtime's reference, for its store and its controller.
    pub fn object_ref(&self) -> ObjectRef<cached::Cached> {
        ObjectRef::new(self.name()).within(self.namespace())
    }
}

impl Ord for BindingRef {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

impl PartialOrd for BindingRef {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::fmt::Display for BindingRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for BindingRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

impl<K: kube::Resource> From<&ObjectRef<K>> for BindingRef {
    fn from(oref: &ObjectRef<K>) -> Self {
        Self::new(oref.namespace.as_deref().unwrap_or_default(), &oref.name)
    }
}

pub fn binding_ref(binding: &impl kube::Resource) -> BindingRef {
    let meta = binding.meta();
    BindingRef::new(meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

/// Keeps of `meta`'s annotations only those named in `keep`: the cached copies read no others,
/// and kubectl's last-applied copy among them is often most of an object's size.
pub fn keep_annotations(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, keep: &[&str]) {
    let annotations = meta.annotations.take().unwrap_or_default();
    let kept: std::collections::BTreeMap<String, String> =
        annotations.into_iter().filter(|(k, _)| keep.contains(&k.as_str())).collect();
    meta.annotations = (!kept.is_empty()).then_some(kept);
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing status: {0}")]
    Status(#[source] kube::Error),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Consul(#[from] consul_kv::Error),
    #[error(transparent)]
    ChecksumKey(#[from] checksum::key::Error),
    #[error("{0}")]
    Config(String),
    #[error("admin server: {0}")]
    Admin(#[source] std::io::Error),
    #[error("a controller task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("the controller failed on this binding: {0}")]
    Panicked(String),
    #[error(transparent)]
    NotServed(#[from] shards::NotServed),
    #[error("a cache stopped before it was ready: {0}")]
    CacheStopped(#[from] kube::runtime::reflector::store::WriterDropped),
    #[error(transparent)]
    WorkloadsStopped(#[from] cluster::workloads::Stopped),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The `result` label of `consulbind_reconciles_total` for a failed reconcile.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Status(_) => "status_error",
            Error::Kube(_) => "kube_error",
            Error::Consul(_) => "consul_error",
            Error::ChecksumKey(_) => "checksum_key_error",
            Error::Config(_) => "config_error",
            Error::Admin(_) => "admin_error",
            Error::Task(_) | Error::CacheStopped(_) | Error::WorkloadsStopped(_) => "task_error",
            Error::Panicked(_) => "panic",
            Error::NotServed(_) => "not_served",
        }
    }
}
