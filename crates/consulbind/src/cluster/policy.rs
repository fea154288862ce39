//! What the controller's default Consul token may read for each namespace. Cluster admins set
//! it on the namespace (an annotation tenants cannot edit) or for every namespace with a flag;
//! with neither, a binding needs a token of its own.

use std::collections::BTreeMap;

use consulbind_api::ConsulBindingSpec;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, watcher},
    },
};

use crate::shards::PIN_ANNOTATION;

/// The namespace annotation that lists the key prefixes the default token may read there.
pub const PREFIXES_ANNOTATION: &str = "consulbind.dev/default-token-prefixes";

/// Key prefixes, matched like Consul's `key_prefix` ACL rules: `app` also covers `apple`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allowed {
    Everything,
    Prefixes(Vec<String>),
}

impl Allowed {
    /// Parses a comma-separated list; `*` allows every key, and an empty list none.
    pub fn parse(text: &str) -> Self {
        let entries: Vec<String> =
            text.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect();
        if entries.iter().any(|p| p == "*") { Self::Everything } else { Self::Prefixes(entries) }
    }

    fn covers(&self, key: &str) -> bool {
        match self {
            Self::Everything => true,
            Self::Prefixes(prefixes) => prefixes.iter().any(|p| key.starts_with(p.as_str())),
        }
    }
}

/// Where a namespace's rule came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Annotation,
    Flag,
    Nothing,
}

#[derive(Clone)]
pub struct Policy {
    flag: Option<Allowed>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
}

impl Policy {
    /// Starts the namespace cache: every namespace, or the one `scope` names. The stream yields
    /// the name of each namespace whose rule may have changed, and must be polled.
    pub fn start(
        client: &Client,
        scope: Option<&str>,
        flag: Option<Allowed>,
    ) -> (Self, impl Stream<Item = String> + Send + 'static) {
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
        let mut config = watcher::Config::default();
        if let Some(name) = scope {
            // A watch on one name needs only a grant on that name.
            config = config.fields(&format!("metadata.name={name}"));
        }
        let (store, writer) = reflector::store();
        let events = watcher(api, config).default_backoff().modify(keep_rule);
        let (mut relist, mut listing) = (super::Relist::default(), super::Listing::default());
        let touched = reflector::reflector(writer, events).flat_map(move |event| {
            listing.event(&event);
            let touched = match event {
                Ok(event) => relist.event(&event, |ns: &PartialObjectMeta<Namespace>| ns.name_any()),
                Err(error) => {
                    tracing::warn!(%error, "watching namespaces failed; retrying");
                    Vec::new()
                }
            };
            futures::stream::iter(touched)
        });
        (Self { flag, namespaces: store }, touched)
    }

    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.namespaces.wait_until_ready().await
    }

    /// The namespaces pinned to a shard, and the replica each is pinned to.
    pub fn pins(&self) -> BTreeMap<String, String> {
        self.namespaces
            .state()
            .iter()
            .filter_map(|ns| Some((ns.name_any(), ns.annotations().get(PIN_ANNOTATION)?.clone())))
            .collect()
    }

    /// Whether the default token may read every key of `spec` for a binding in `namespace`,
    /// and if not, what a person should do about it.
    pub fn check(&self, namespace: &str, spec: &ConsulBindingSpec) -> Result<(), String> {
        let annotation = self
            .namespaces
            .get(&ObjectRef::new(namespace))
            .and_then(|ns| ns.annotations().get(PREFIXES_ANNOTATION).map(|text| Allowed::parse(text)));
        let (allowed, origin) = match (annotation, &self.flag) {
            (Some(allowed), _) => (allowed, Origin::Annotation),
            (None, Some(flag)) => (flag.clone(), Origin::Flag),
            (None, None) => (Allowed::Prefixes(Vec::new()), Origin::Nothing),
        };
        check(&allowed, origin, namespace, spec)
    }
}

fn check(allowed: &Allowed, origin: Origin, namespace: &str, spec: &ConsulBindingSpec) -> Result<(), String> {
    let fix = format!(
        "give the binding its own token with consul.tokenSecretRef, or ask a cluster admin to allow it in the \
         namespace annotation {PREFIXES_ANNOTATION}"
    );
    if origin == Origin::Nothing {
        return Err(format!(
            "the controller's default Consul token serves no binding in namespace {namespace}: neither the \
             namespace annotation {PREFIXES_ANNOTATION} nor --default-token-prefixes is set; {fix}"
        ));
    }
    // Consul namespaces and partitions are other tenants' data: prefixes cannot say which one,
    // so only `*` opens them to the default token.
    let consul = spec.consul.clone().unwrap_or_default();
    if *allowed != Allowed::Everything {
        for (field, value) in [("namespace", &consul.namespace), ("partition", &consul.partition)] {
            if let Some(value) = value {
                return Err(format!(
                    "the controller's default Consul token reads Consul {field} {value:?} only where every key \
                     is allowed (*); {fix}"
                ));
            }
        }
    }
    let denied: Vec<&str> = spec.keys.iter().map(|k| k.key.as_str()).filter(|key| !allowed.covers(key)).collect();
    if denied.is_empty() {
        return Ok(());
    }
    let source = match origin {
        Origin::Annotation => format!("the annotation {PREFIXES_ANNOTATION} of namespace {namespace}"),
        _ => "--default-token-prefixes".to_owned(),
    };
    let list = denied.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ");
    let (noun, verb) = if denied.len() == 1 { ("key", "is") } else { ("keys", "are") };
    Err(format!(
        "Consul {noun} {list} {verb} outside the prefixes that {source} lets bindings read with the controller's \
         default token; {fix}"
    ))
}

/// Keeps only the rule and the shard pin: other annotations (kubectl's last-applied copy among
/// them), labels and managed fields are most of a namespace's size.
fn keep_rule(ns: &mut PartialObjectMeta<Namespace>) {
    crate::keep_annotations(&mut ns.metadata, &[PREFIXES_ANNOTATION, PIN_ANNOTATION]);
    ns.metadata.labels = None;
    ns.metadata.managed_fields = None;
    ns.metadata.owner_references = None;
    ns.metadata.finalizers = None;
}

#[cfg(test)]
mod tests {
    use consulbind_api::{ConsulSettings, KeySource};

    use super::*;

    fn spec(keys: &[&str]) -> ConsulBindingSpec {
        ConsulBindingSpec {
            keys: keys.iter().map(|k| KeySource { key: (*k).into(), ..Default::default() }).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn lists_parse() {
        assert_eq!(
            Allowed::parse(" team-a/ , shared/flags,"),
            Allowed::Prefixes(vec!["team-a/".into(), "shared/flags".into()])
        );
        assert_eq!(Allowed::parse("team-a/,*"), Allowed::Everything);
        assert_eq!(Allowed::parse(" , "), Allowed::Prefixes(vec![]));
    }

    #[test]
    fn keys_must_lie_under_an_allowed_prefix() {
        let allowed = Allowed::parse("team-a/,shared/flags");
        assert!(check(&allowed, Origin::Flag, "ns", &spec(&["team-a/db", "shared/flags"])).is_ok());
        assert!(check(&allowed, Origin::Flag, "ns", &spec(&["team-a/"])).is_ok());
        let error = check(&allowed, Origin::Annotation, "ns", &spec(&["team-a/db", "team-b/db", "team"])).unwrap_err();
        assert!(error.contains(r#"keys "team-b/db", "team" are outside"#), "{error}");
        assert!(error.contains(PREFIXES_ANNOTATION), "{error}");
        let error = check(&allowed, Origin::Flag, "ns", &spec(&["x"])).unwrap_err();
        assert!(error.contains(r#"key "x" is outside the prefixes that --default-token-prefixes"#), "{error}");
    }

    #[test]
    fn nothing_set_allows_nothing() {
        let error = check(&Allowed::Prefixes(vec![]), Origin::Nothing, "team-a", &spec(&["app/x"])).unwrap_err();
        assert!(error.contains("serves no binding in namespace team-a"), "{error}");
        assert!(check(&Allowed::Prefixes(vec![]), Origin::Annotation, "team-a", &spec(&["app/x"])).is_err());
    }

    #[test]
    fn consul_namespaces_and_partitions_need_everything() {
        let mut s = spec(&["app/x"]);
        s.consul = Some(Box::new(ConsulSettings { namespace: Some("team-b".into()), ..Default::default() }));
        assert!(check(&Allowed::parse("app/"), Origin::Flag, "ns", &s).unwrap_err().contains("Consul namespace"));
        assert!(check(&Allowed::Everything, Origin::Flag, "ns", &s).is_ok());
        s.consul = Some(Box::new(ConsulSettings { partition: Some("p".into()), ..Default::default() }));
        assert!(check(&Allowed::parse("app/"), Origin::Flag, "ns", &s).unwrap_err().contains("Consul partition"));
        // Datacenters hold the same key space, as in Consul's own ACL rules.
        s.consul = Some(Box::new(ConsulSettings { datacenter: Some("dc2".into()), ..Default::default() }));
        assert!(check(&Allowed::parse("app/"), Origin::Flag, "ns", &s).is_ok());
    }
}
