//! The bindings refused for their namespace's share (`--max-bindings-per-namespace`). Each is
//! looked at again when a binding of its namespace is deleted, the oldest first, not every few
//! seconds: thousands of them, each counting its namespace at each look, would cost the
//! controller what it owes the other namespaces.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;

use crate::{BindingRef, Lock};

/// A binding's place in its namespace's share: by creation time, then name.
type Place = (Option<Timestamp>, String);

#[derive(Default)]
pub struct Crowded {
    by_namespace: Mutex<HashMap<String, BTreeSet<Place>>>,
}

fn place(binding: &impl kube::Resource) -> (String, Place) {
    let meta = binding.meta();
    let created = meta.creation_timestamp.as_ref().map(|t| t.0);
    (meta.namespace.clone().unwrap_or_default(), (created, meta.name.clone().unwrap_or_default()))
}

impl Crowded {
    /// Why `binding` is beyond its namespace's share, as `beyond` tells (nothing once the
    /// binding cache has let it go), noted as refused or served. A refusal is told again under
    /// the lock that deletions take after the cache has let the deleted binding go: one deleted
    /// while `binding` is judged still frees it, and `binding` deleted meanwhile is not kept.
    /// Served bindings, most of them, are judged without it.
    pub fn judge(&self, binding: &impl kube::Resource, beyond: impl Fn() -> Option<String>) -> Option<String> {
        let (namespace, place) = place(binding);
        let first = beyond();
        let mut by_namespace = self.by_namespace.locked();
        let verdict = if first.is_some() { beyond() } else { first };
        if verdict.is_some() {
            by_namespace.entry(namespace).or_default().insert(place);
        } else if let Some(refused) = by_namespace.get_mut(&namespace)
            && refused.remove(&place)
            && refused.is_empty()
        {
            by_namespace.remove(&namespace);
        }
        verdict
    }

    /// `binding` is deleted. When it was served, the oldest binding its namespace refused is
    /// now within the share: that one, to look at again.
    pub fn deleted(&self, binding: &impl kube::Resource) -> Option<BindingRef> {
        let (namespace, place) = place(binding);
        let mut by_namespace = self.by_namespace.locked();
        let refused = by_namespace.get_mut(&namespace)?;
        let next = if refused.remove(&place) { None } else { refused.pop_first() };
        if refused.is_empty() {
            by_namespace.remove(&namespace);
        }
        next.map(|(_, name)| BindingRef::new(&namespace, &name))
    }

    /// Every binding refused, to look at again: a relist may have missed deletions.
    pub fn take_all(&self) -> Vec<BindingRef> {
        let by_namespace = std::mem::take(&mut *self.by_namespace.locked());
        by_namespace
            .into_iter()
            .flat_map(|(ns, refused)| refused.into_iter().map(move |(_, n)| BindingRef::new(&ns, &n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use consulbind_api::ConsulBinding;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn binding(namespace: &str, name: &str, created: i64) -> ConsulBinding {
        let mut binding = ConsulBinding::new(name, Default::default());
        binding.metadata.namespace = Some(namespace.into());
        binding.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        binding
    }

    #[test]
    fn a_served_binding_deleted_frees_the_oldest_refused_of_its_namespace() {
        let crowded = Crowded::default();
        let refuse = |b: ConsulBinding| crowded.judge(&b, || Some("full".into()));
        for (name, created) in [("late", 30), ("old", 10), ("mid", 20)] {
            refuse(binding("team", name, created));
        }
        refuse(binding("other", "x", 1));
        let next = |name: &str| crowded.deleted(&binding("team", name, 5)).map(|b| b.name().to_owned());
        assert_eq!(next("served-a").as_deref(), Some("old"));
        assert_eq!(next("served-b").as_deref(), Some("mid"));
        assert_eq!(crowded.deleted(&binding("team", "late", 30)), None, "a refused one frees nothing");
        assert_eq!(next("served-c"), None, "none left");
        assert_eq!(crowded.take_all(), [BindingRef::new("other", "x")]);
        assert!(crowded.take_all().is_empty());
    }

    /// Refused at a first look, but gone from the cache by the second, under the lock: not
    /// kept, where it would take a later deletion's wake.
    #[test]
    fn a_binding_deleted_while_judged_is_not_kept_as_refused() {
        let crowded = Crowded::default();
        let looks = std::cell::Cell::new(0);
        let beyond = || {
            looks.set(looks.get() + 1);
            (looks.get() == 1).then(|| "full".to_owned())
        };
        assert_eq!(crowded.judge(&binding("team", "c", 30), beyond), None);
        assert_eq!(looks.get(), 2, "a refusal is told again under the lock");
        crowded.judge(&binding("team", "d", 40), || Some("full".into()));
        assert_eq!(crowded.deleted(&binding("team", "a", 1)), Some(BindingRef::new("team", "d")));
    }

    #[test]
    fn a_binding_served_again_is_no_longer_refused() {
        let crowded = Crowded::default();
        assert!(crowded.judge(&binding("team", "a", 10), || Some("full".into())).is_some());
        crowded.judge(&binding("team", "b", 20), || Some("full".into()));
        assert_eq!(crowded.judge(&binding("team", "a", 10), || None), None);
        assert_eq!(crowded.deleted(&binding("team", "gone", 1)), Some(BindingRef::new("team", "b")));
        assert!(crowded.by_namespace.locked().is_empty(), "an empty namespace goes");
    }
}
