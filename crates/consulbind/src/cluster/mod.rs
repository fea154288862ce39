//! Read-only caches of what the cluster holds, each fed by a watch: the target workloads
//! ([`workloads`], with Argo Rollouts in [`argo`]), the Secrets that hold Consul tokens
//! ([`tokens`]), the ConfigMaps and Secrets that bindings read ([`objects`]), the namespaces'
//! default-token policy ([`policy`]), which bindings an event concerns ([`interest`]), and the
//! selectors the API server would take ([`selector`]). Nothing here writes to the cluster.

pub mod argo;
pub mod interest;
pub mod objects;
pub mod policy;
pub mod references;
pub mod selector;
pub mod tokens;
pub mod workloads;

use consulbind_api::WorkloadKind;
use kube::Resource;

/// A workload found for one of a binding's targets.
pub type Workload = (WorkloadKind, String);

/// Which object a workload is, and how far its spec has come: one deleted and made again under
/// its name has another uid, and starts again at generation 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub uid: String,
    pub generation: i64,
}

impl Version {
    pub fn of<K: kube::Resource>(obj: &K) -> Self {
        Self { uid: obj.meta().uid.clone().unwrap_or_default(), generation: obj.meta().generation.unwrap_or_default() }
    }
}

/// A binding's annotation as a workload carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    pub value: String,
    /// The binding's own field manager set it. Otherwise someone else did: a rollout undo, a
    /// hand edit, a copy of the manifest.
    pub owned: bool,
}

impl Live {
    /// The checksum in the value, without the `~n` counter of a forced stamp.
    pub fn checksum(&self) -> &str {
        self.value.split_once('~').map_or(&self.value, |(c, _)| c)
    }
}

/// Drops what no cache reads: annotations (with kubectl's last-applied copy), managed fields,
/// owner references and finalizers.
pub fn strip<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.annotations = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
}
