//! What a workload cache keeps of each workload, compact: a cluster may hold tens of thousands
//! of workloads, and the metadata type they arrive as is about 2 KiB each once cached.

use std::borrow::Cow;

use kube::runtime::reflector::Lookup;

use crate::cluster::{Version, pairs::Pairs};

/// One workload as cached: its name, namespace, version, labels and the annotations
/// [`live_meta`](super::template::live_meta) chose.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    name: Box<str>,
    namespace: Box<str>,
    uid: Box<str>,
    /// The generation, or for a kind without one its resource version (see [`Version`]).
    generation: i64,
    pub labels: Pairs,
    pub annotations: Pairs,
}

impl Kept {
    pub fn new(name: &str, namespace: &str, version: Version, labels: Pairs, annotations: Pairs) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            uid: version.uid.into(),
            generation: version.generation,
            labels,
            annotations,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn version(&self) -> Version {
        Version { uid: self.uid.to_string(), generation: self.generation }
    }
}

/// The store's key is the name and namespace alone: a version in it would be two more strings
/// per workload, and lookups are by name.
impl Lookup for Kept {
    type DynamicType = ();

    fn kind(_: &()) -> Cow<'_, str> {
        "Workload".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "workloads".into()
    }

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.namespace))
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}
