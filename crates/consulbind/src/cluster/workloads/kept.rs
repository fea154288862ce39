//! What a workload cache keeps of each workload, compact: a cluster may hold tens of thousands
//! of workloads, and the metadata type they arrive as is about 2 KiB each once cached.

use crate::cluster::{Version, pairs::Pairs};

/// One workload as cached: its name, namespace, version, labels and the annotations
/// [`live_meta`](super::template::live_meta) chose.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    /// Its namespace, name and uid end to end, in one allocation where three cost twice the text.
    id: Box<str>,
    /// Where the namespace and the name end in `id`.
    cuts: [u32; 2],
    /// The generation, or for a kind without one its resource version (see [`Version`]).
    generation: i64,
    pub labels: Pairs,
    pub annotations: Pairs,
}

impl Kept {
    pub fn new(name: &str, namespace: &str, version: Version, labels: Pairs, annotations: Pairs) -> Self {
        let id = [namespace, name, &version.uid].concat();
        // Names are DNS names and uids UUIDs, far below 4 GiB.
        let cuts = [namespace.len(), namespace.len() + name.len()].map(|cut| cut as u32);
        Self { id: id.into_boxed_str(), cuts, generation: version.generation, labels, annotations }
    }

    pub fn name(&self) -> &str {
        &self.id[self.cuts[0] as usize..self.cuts[1] as usize]
    }

    pub fn namespace(&self) -> &str {
        &self.id[..self.cuts[0] as usize]
    }

    pub fn version(&self) -> Version {
        Version { uid: self.id[self.cuts[1] as usize..].to_owned(), generation: self.generation }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_workload_gives_back_its_parts() {
        let version = Version { uid: "4a1f0c2e".into(), generation: 7 };
        let kept = Kept::new("web", "team", version.clone(), Pairs::default(), Pairs::default());
        assert_eq!((kept.namespace(), kept.name()), ("team", "web"));
        assert_eq!(kept.version(), version);
    }
}
