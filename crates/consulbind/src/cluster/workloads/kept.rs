//! What a workload cache keeps of each workload, compact: a cluster may hold tens of thousands
//! of workloads, and the metadata type they arrive as is about 2 KiB each once cached.

use std::{borrow::Cow, collections::BTreeMap};

use kube::runtime::reflector::Lookup;

use crate::cluster::Version;

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

/// A few labels or annotations, sorted by key: an empty one allocates nothing, and one of a
/// few entries takes a tenth of a `BTreeMap`'s first node.
#[derive(Clone, Debug, Default, PartialEq, Hash)]
pub struct Pairs(Box<[(Box<str>, Box<str>)]>);

impl Pairs {
    pub fn get(&self, key: &str) -> Option<&str> {
        let at = self.0.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        Some(&self.0[at].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// As the map that selectors and decoders take.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }
}

impl From<BTreeMap<String, String>> for Pairs {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(map.into_iter().map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_keep_a_map_and_find_by_key() {
        let map: BTreeMap<String, String> =
            [("b", "2"), ("a", "1"), ("c", "")].map(|(k, v)| (k.to_owned(), v.to_owned())).into();
        let pairs = Pairs::from(map.clone());
        assert_eq!(pairs.to_map(), map);
        assert_eq!((pairs.get("a"), pairs.get("c"), pairs.get("d")), (Some("1"), Some(""), None));
        assert!(pairs.contains_key("b") && !pairs.contains_key("bb"));
        assert_eq!(Pairs::default().to_map(), BTreeMap::new());
    }
}
