//! Which bindings an event about a workload or a token Secret concerns. Each event costs a few
//! lookups and the selectors of its own namespace and kind, never a scan of every binding.

use std::collections::{BTreeMap, HashMap, HashSet};

use consulbind_api::{ConsulBindingSpec, ObjectKind, WorkloadKind};
use kube::core::{Selector, SelectorExt};

use super::{Workload, objects::ObjectId};
use crate::BindingRef;

/// A workload of one namespace.
type Named = (WorkloadKind, Box<str>);

#[derive(Default)]
pub struct Interest {
    /// Workloads a binding names, or found through a selector at its last reconcile (so that
    /// one relabelled away or deleted still wakes it), by namespace: there is an entry per
    /// workload found, and most namespaces hold many.
    named: HashMap<Box<str>, HashMap<Named, Bindings>>,
    selecting: HashMap<(String, WorkloadKind), HashMap<BindingRef, Vec<Selector>>>,
    secrets: HashMap<(String, String), Bindings>,
    objects: HashMap<ObjectId, Bindings>,
    by_binding: HashMap<BindingRef, Registered>,
    /// Objects that lost their last binding, for [`Interest::take_freed`].
    freed: Vec<ObjectId>,
}

/// The bindings one thing concerns, without duplicates. Most things concern one, held inline:
/// a list or a set would take a second allocation for each.
#[derive(Clone, Debug)]
enum Bindings {
    One(BindingRef),
    Many(Vec<BindingRef>),
}

impl Bindings {
    fn add(&mut self, binding: &BindingRef) {
        match self {
            Self::One(one) if one == binding => {}
            Self::One(one) => *self = Self::Many(vec![one.clone(), binding.clone()]),
            Self::Many(list) if list.contains(binding) => {}
            Self::Many(list) => list.push(binding.clone()),
        }
    }

    /// Removes `binding`; false when none is left.
    fn remove(&mut self, binding: &BindingRef) -> bool {
        match self {
            Self::One(one) => one != binding,
            Self::Many(list) => {
                list.retain(|b| b != binding);
                !list.is_empty()
            }
        }
    }

    fn as_slice(&self) -> &[BindingRef] {
        match self {
            Self::One(one) => std::slice::from_ref(one),
            Self::Many(list) => list,
        }
    }
}

/// What a binding registered, each in its own namespace, which is not kept again: there is one
/// per binding.
#[derive(Default)]
struct Registered {
    named: Box<[(WorkloadKind, Box<str>)]>,
    selecting: Box<[WorkloadKind]>,
    secret: Option<Box<str>>,
    objects: Box<[(ObjectKind, Box<str>)]>,
}

impl Interest {
    /// Records what `binding` cares about now, replacing what it cared about before: its
    /// targets, its token Secret, the workloads `found` for it and the ConfigMaps and Secrets
    /// it reads, `objects`.
    pub fn set<'a>(
        &mut self,
        binding: &BindingRef,
        spec: &ConsulBindingSpec,
        found: &[Workload],
        objects: impl IntoIterator<Item = (ObjectKind, &'a str)>,
    ) {
        let namespace = binding.namespace().to_owned();
        let mut selectors: HashMap<WorkloadKind, Vec<Selector>> = HashMap::new();
        let mut named = Vec::new();
        for target in &spec.targets {
            if let Some(name) = &target.name {
                named.push((target.kind, name.as_str().into()));
            }
            if let Some(selector) = target.selector.clone().and_then(|s| Selector::try_from(s).ok()) {
                selectors.entry(target.kind).or_default().push(selector);
            }
        }
        named.extend(found.iter().map(|(kind, name)| (*kind, name.as_str().into())));
        named.sort();
        named.dedup();
        let mut selecting: Vec<WorkloadKind> = selectors.keys().copied().collect();
        selecting.sort();
        let mut objects: Vec<(ObjectKind, Box<str>)> =
            objects.into_iter().map(|(kind, name)| (kind, name.into())).collect();
        objects.sort();
        objects.dedup();
        let registered = Registered {
            named: named.into(),
            selecting: selecting.into(),
            secret: spec.consul.as_ref().and_then(|c| c.token_secret_ref.as_ref()).map(|s| s.name.as_str().into()),
            objects: objects.into(),
        };

        self.remove(binding);
        if !registered.named.is_empty() {
            let named = self.named.entry(namespace.as_str().into()).or_default();
            for (kind, name) in &registered.named {
                add_to(named, (*kind, name.clone()), binding);
            }
        }
        for (kind, list) in selectors {
            self.selecting.entry((namespace.clone(), kind)).or_default().insert(binding.clone(), list);
        }
        if let Some(secret) = &registered.secret {
            add_to(&mut self.secrets, (namespace.clone(), secret.to_string()), binding);
        }
        for (kind, name) in &registered.objects {
            add_to(&mut self.objects, (*kind, namespace.clone(), name.to_string()), binding);
        }
        self.by_binding.insert(binding.clone(), registered);
    }

    pub fn remove(&mut self, binding: &BindingRef) {
        let Some(old) = self.by_binding.remove(binding) else { return };
        let namespace = binding.namespace().to_owned();
        if let Some(named) = self.named.get_mut(namespace.as_str()) {
            for (kind, name) in old.named {
                remove_from(named, (kind, name), binding);
            }
            if named.is_empty() {
                self.named.remove(namespace.as_str());
            }
        }
        for kind in old.selecting {
            let key = (namespace.clone(), kind);
            if let Some(map) = self.selecting.get_mut(&key) {
                map.remove(binding);
                if map.is_empty() {
                    self.selecting.remove(&key);
                }
            }
        }
        if let Some(name) = old.secret {
            remove_from(&mut self.secrets, (namespace.clone(), name.into()), binding);
        }
        for (kind, name) in old.objects {
            let key = (kind, namespace.clone(), name.into());
            remove_from(&mut self.objects, key.clone(), binding);
            if !self.objects.contains_key(&key) {
                self.freed.push(key);
            }
        }
    }

    /// The ConfigMaps and Secrets that no binding reads any more, since the last call: what the
    /// caches keep of them can go.
    pub fn take_freed(&mut self) -> Vec<ObjectId> {
        let mut freed = std::mem::take(&mut self.freed);
        freed.retain(|o| !self.objects.contains_key(o));
        freed.sort();
        freed.dedup();
        freed
    }

    /// Forgets every binding for which `keep` is false.
    pub fn retain(&mut self, keep: impl Fn(&BindingRef) -> bool) {
        let gone: Vec<BindingRef> = self.by_binding.keys().filter(|b| !keep(b)).cloned().collect();
        gone.iter().for_each(|b| self.remove(b));
    }

    /// The bindings a change to this workload may concern.
    pub fn workload(
        &self,
        namespace: &str,
        kind: WorkloadKind,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> HashSet<BindingRef> {
        let named = self.named.get(namespace).and_then(|named| named.get(&(kind, name.into())));
        let mut bindings: HashSet<BindingRef> =
            named.map(Bindings::as_slice).unwrap_or_default().iter().cloned().collect();
        if let Some(selecting) = self.selecting.get(&(namespace.to_owned(), kind)) {
            let matching = selecting.iter().filter(|(_, selectors)| selectors.iter().any(|s| s.matches(labels)));
            bindings.extend(matching.map(|(b, _)| b.clone()));
        }
        bindings
    }

    /// The bindings that read this ConfigMap or Secret as a source.
    pub fn object(&self, object: &ObjectId) -> Vec<BindingRef> {
        self.objects.get(object).map(|b| b.as_slice().to_vec()).unwrap_or_default()
    }

    /// The bindings that read their token from this Secret.
    pub fn secret(&self, namespace: &str, name: &str) -> HashSet<BindingRef> {
        let bindings = self.secrets.get(&(namespace.to_owned(), name.to_owned()));
        bindings.map(Bindings::as_slice).unwrap_or_default().iter().cloned().collect()
    }
}

fn add_to<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Bindings>, key: K, binding: &BindingRef) {
    map.entry(key).and_modify(|b| b.add(binding)).or_insert_with(|| Bindings::One(binding.clone()));
}

fn remove_from<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Bindings>, key: K, binding: &BindingRef) {
    if let Some(bindings) = map.get_mut(&key)
        && !bindings.remove(binding)
    {
        map.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use consulbind_api::{ConsulSettings, SecretKeyRef, TargetRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    fn binding(ns: &str, name: &str) -> BindingRef {
        BindingRef::new(ns, name)
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn spec(targets: Vec<TargetRef>, secret: Option<&str>) -> ConsulBindingSpec {
        ConsulBindingSpec {
            targets,
            consul: secret.map(|name| {
                Box::new(ConsulSettings {
                    token_secret_ref: Some(SecretKeyRef { name: name.into(), key: None }),
                    ..Default::default()
                })
            }),
            ..Default::default()
        }
    }

    fn by_name(kind: WorkloadKind, name: &str) -> TargetRef {
        TargetRef { kind, name: Some(name.into()), selector: None }
    }

    fn by_label(kind: WorkloadKind, key: &str, value: &str) -> TargetRef {
        let selector = LabelSelector { match_labels: Some(labels(&[(key, value)])), ..Default::default() };
        TargetRef { kind, name: None, selector: Some(selector) }
    }

    #[test]
    fn events_wake_only_the_bindings_they_concern() {
        use WorkloadKind::*;
        let mut interest = Interest::default();
        let (web, workers, other_ns) = (binding("a", "web"), binding("a", "workers"), binding("b", "web"));
        interest.set(&web, &spec(vec![by_name(Deployment, "web")], Some("token")), &[], []);
        interest.set(
            &workers,
            &spec(vec![by_label(StatefulSet, "tier", "worker")], None),
            &[(StatefulSet, "w1".to_owned())],
            [],
        );
        interest.set(&other_ns, &spec(vec![by_name(Deployment, "web")], None), &[], []);

        let none = labels(&[]);
        assert_eq!(interest.workload("a", Deployment, "web", &none), HashSet::from([web.clone()]));
        assert!(interest.workload("a", StatefulSet, "web", &none).is_empty(), "another kind");
        assert!(interest.workload("c", Deployment, "web", &none).is_empty(), "another namespace");
        let worker = labels(&[("tier", "worker")]);
        assert_eq!(interest.workload("a", StatefulSet, "w2", &worker), HashSet::from([workers.clone()]));
        assert!(interest.workload("b", StatefulSet, "w2", &worker).is_empty());
        // Relabelled away: still the binding's business, through what it found last time.
        assert_eq!(interest.workload("a", StatefulSet, "w1", &none), HashSet::from([workers.clone()]));
        assert_eq!(interest.secret("a", "token"), HashSet::from([web.clone()]));
        assert!(interest.secret("b", "token").is_empty());

        // A spec change replaces the old interest; removal forgets it all.
        interest.set(&web, &spec(vec![by_name(Deployment, "api")], None), &[], []);
        assert!(interest.workload("a", Deployment, "web", &none).is_empty());
        assert!(interest.secret("a", "token").is_empty());
        interest.remove(&workers);
        assert!(interest.workload("a", StatefulSet, "w2", &worker).is_empty());
        assert!(interest.workload("a", StatefulSet, "w1", &none).is_empty());
        interest.remove(&web);
        interest.remove(&other_ns);
        assert!(interest.named.is_empty() && interest.selecting.is_empty() && interest.secrets.is_empty());
    }

    #[test]
    fn a_workload_wakes_every_binding_that_names_it_until_each_lets_go() {
        use WorkloadKind::Deployment;
        let mut interest = Interest::default();
        let (a, b, c) = (binding("ns", "a"), binding("ns", "b"), binding("ns", "c"));
        let web = spec(vec![by_name(Deployment, "web")], None);
        let none = labels(&[]);
        let woken = |interest: &Interest| interest.workload("ns", Deployment, "web", &none);
        for binding in [&a, &b, &c, &b] {
            interest.set(binding, &web, &[], []);
        }
        assert_eq!(woken(&interest), HashSet::from([a.clone(), b.clone(), c.clone()]));
        interest.remove(&a);
        interest.remove(&c);
        assert_eq!(woken(&interest), HashSet::from([b.clone()]));
        interest.set(&a, &web, &[], []);
        interest.remove(&b);
        assert_eq!(woken(&interest), HashSet::from([a.clone()]));
        interest.remove(&a);
        assert!(woken(&interest).is_empty());
        assert!(interest.named.is_empty(), "the namespace goes with its last workload");
    }

    #[test]
    fn a_config_map_or_secret_wakes_the_bindings_that_read_it() {
        use consulbind_api::{ObjectKind::*, ObjectSource};
        let mut interest = Interest::default();
        let (web, other_ns) = (binding("a", "web"), binding("b", "web"));
        let source = |name: &str| ObjectSource { name: name.into(), ..Default::default() };
        let reads =
            ConsulBindingSpec { config_maps: vec![source("app")], secrets: vec![source("db")], ..spec(vec![], None) };
        let objects = || reads.objects().map(|(kind, o)| (kind, o.name.as_str()));
        interest.set(&web, &reads, &[], objects());
        interest.set(&other_ns, &reads, &[], objects());
        let id = |kind, ns: &str, name: &str| (kind, ns.to_owned(), name.to_owned());
        assert_eq!(interest.object(&id(ConfigMap, "a", "app")), vec![web.clone()]);
        assert_eq!(interest.object(&id(Secret, "a", "db")), vec![web.clone()]);
        assert!(interest.object(&id(Secret, "a", "app")).is_empty(), "another kind");
        assert!(interest.object(&id(ConfigMap, "c", "app")).is_empty(), "another namespace");
        interest.set(&web, &spec(vec![], None), &[], []);
        assert!(interest.object(&id(ConfigMap, "a", "app")).is_empty());
        interest.remove(&other_ns);
        assert!(interest.objects.is_empty());
    }

    #[test]
    fn an_object_is_freed_when_its_last_binding_stops_reading_it() {
        let mut interest = Interest::default();
        let (a, b) = (BindingRef::new("ns", "a"), BindingRef::new("ns", "b"));
        let spec = ConsulBindingSpec::default();
        let cm = |name: &'static str| [(ObjectKind::ConfigMap, name)];
        interest.set(&a, &spec, &[], cm("shared"));
        interest.set(&b, &spec, &[], cm("shared"));
        interest.set(&a, &spec, &[], cm("shared"));
        assert!(interest.take_freed().is_empty(), "read again by the binding that set it");
        interest.set(&a, &spec, &[], cm("own"));
        assert!(interest.take_freed().is_empty(), "b still reads it");
        interest.remove(&b);
        assert_eq!(interest.take_freed(), [(ObjectKind::ConfigMap, "ns".to_owned(), "shared".to_owned())]);
        interest.retain(|_| false);
        assert_eq!(interest.take_freed(), [(ObjectKind::ConfigMap, "ns".to_owned(), "own".to_owned())]);
        assert!(interest.take_freed().is_empty());
    }
}
