//! The ConfigMaps and Secrets a pod template references, for `spec.includeTargetReferences`:
//! volumes (projected ones too), `env[].valueFrom` and `envFrom`, of containers and init
//! containers. Image pull Secrets are not content.
//!
//! The workload caches keep them as annotations of the cached metadata ([`encode`]), so that a
//! template change that adds or drops one is seen like any other change of what they keep.

use std::collections::{BTreeMap, BTreeSet};

use consulbind_api::ObjectKind;
use k8s_openapi::api::core::v1::{KeyToPath, PodSpec};

use super::pairs::Pairs;

/// How a pod template uses one ConfigMap or Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Use {
    /// The data keys it reads; `None` for all of them.
    pub keys: Option<BTreeSet<String>>,
    /// Every reference to it may be missing.
    pub optional: bool,
}

impl Use {
    /// One use that covers both.
    pub fn merge(&mut self, other: &Use) {
        self.keys = match (self.keys.take(), &other.keys) {
            (Some(mut mine), Some(theirs)) => {
                mine.extend(theirs.iter().cloned());
                Some(mine)
            }
            _ => None,
        };
        self.optional &= other.optional;
    }
}

pub type References = BTreeMap<(ObjectKind, String), Use>;

/// Adds one use of object `id`, merged with any use already there.
pub fn add(references: &mut References, id: &(ObjectKind, String), used: &Use) {
    match references.get_mut(id) {
        Some(known) => known.merge(used),
        None => {
            references.insert(id.clone(), used.clone());
        }
    }
}

/// Every ConfigMap and Secret that `spec` references, with how.
pub fn of(spec: &PodSpec) -> References {
    let mut found = References::new();
    let mut use_of = |kind, name: Option<&String>, keys: Option<BTreeSet<String>>, optional: Option<bool>| {
        let Some(name) = name.filter(|n| !n.is_empty()) else { return };
        add(&mut found, &(kind, name.clone()), &Use { keys, optional: optional.unwrap_or(false) });
    };
    // A key no ConfigMap or Secret can hold matches nothing; dropping it keeps the encoding's
    // `*`, `,` and `?` unambiguous.
    let items = |items: &Option<Vec<KeyToPath>>| {
        items.as_ref().map(|i| i.iter().map(|i| i.key.clone()).filter(|k| data_key(k)).collect())
    };
    for volume in spec.volumes.iter().flatten() {
        if let Some(c) = &volume.config_map {
            use_of(ObjectKind::ConfigMap, Some(&c.name), items(&c.items), c.optional);
        }
        if let Some(s) = &volume.secret {
            use_of(ObjectKind::Secret, s.secret_name.as_ref(), items(&s.items), s.optional);
        }
        for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &source.config_map {
                use_of(ObjectKind::ConfigMap, Some(&c.name), items(&c.items), c.optional);
            }
            if let Some(s) = &source.secret {
                use_of(ObjectKind::Secret, Some(&s.name), items(&s.items), s.optional);
            }
        }
    }
    let containers = spec.init_containers.iter().flatten().chain(&spec.containers);
    for container in containers {
        for from in container.env_from.iter().flatten() {
            if let Some(c) = &from.config_map_ref {
                use_of(ObjectKind::ConfigMap, Some(&c.name), None, c.optional);
            }
            if let Some(s) = &from.secret_ref {
                use_of(ObjectKind::Secret, Some(&s.name), None, s.optional);
            }
        }
        for source in container.env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
            if let Some(c) = &source.config_map_key_ref {
                let keys = [c.key.clone()].into_iter().filter(|k| data_key(k)).collect();
                use_of(ObjectKind::ConfigMap, Some(&c.name), Some(keys), c.optional);
            }
            if let Some(s) = &source.secret_key_ref {
                let keys = [s.key.clone()].into_iter().filter(|k| data_key(k)).collect();
                use_of(ObjectKind::Secret, Some(&s.name), Some(keys), s.optional);
            }
        }
    }
    found
}

/// Whether a ConfigMap or Secret could hold `key`: the API server allows only these characters.
fn data_key(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Annotation keys of the cached metadata that hold references start so; no real annotation
/// is kept there.
pub const PREFIX: &str = "ref.";

/// The references as cached annotations: `ref.ConfigMap/app` = `?` when optional, then `*`
/// for the whole object or the keys joined by commas (data keys hold no comma).
pub fn encode(references: &References) -> impl Iterator<Item = (String, String)> + '_ {
    references.iter().map(|((kind, name), used)| {
        let optional = if used.optional { "?" } else { "" };
        let keys = match &used.keys {
            None => "*".to_owned(),
            Some(keys) => keys.iter().cloned().collect::<Vec<_>>().join(","),
        };
        (format!("{PREFIX}{kind}/{name}"), format!("{optional}{keys}"))
    })
}

/// The references [`encode`] put among `annotations`.
pub fn decode(annotations: &Pairs) -> References {
    annotations
        .starting_with(PREFIX)
        .filter_map(|(key, value)| {
            let (kind, name) = key[PREFIX.len()..].split_once('/')?;
            let kind = match kind {
                "ConfigMap" => ObjectKind::ConfigMap,
                "Secret" => ObjectKind::Secret,
                _ => return None,
            };
            let (optional, keys) = match value.strip_prefix('?') {
                Some(keys) => (true, keys),
                None => (false, value),
            };
            let keys = (keys != "*").then(|| keys.split(',').filter(|k| !k.is_empty()).map(str::to_owned).collect());
            Some(((kind, name.to_owned()), Use { keys, optional }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn whole(optional: bool) -> Use {
        Use { keys: None, optional }
    }

    fn keys(keys: &[&str], optional: bool) -> Use {
        Use { keys: Some(keys.iter().map(|k| k.to_string()).collect()), optional }
    }

    #[test]
    fn every_kind_of_reference_is_found_and_image_pull_secrets_are_not() {
        let spec: PodSpec = serde_json::from_value(json!({
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [
                {"name": "a", "configMap": {"name": "files"}},
                {"name": "b", "secret": {"secretName": "tls", "items": [{"key": "crt", "path": "c"}], "optional": true}},
                {"name": "c", "projected": {"sources": [
                    {"configMap": {"name": "projected", "items": [{"key": "x", "path": "x"}]}},
                    {"secret": {"name": "projected-secret"}},
                    {"downwardAPI": {"items": []}}
                ]}},
                {"name": "d", "emptyDir": {}}
            ],
            "initContainers": [{"name": "init", "envFrom": [{"secretRef": {"name": "init-env", "optional": true}}]}],
            "containers": [{
                "name": "app",
                "envFrom": [{"configMapRef": {"name": "env"}}],
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "one", "key": "a"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "password", "key": "pw"}}},
                    {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "D", "value": "plain"}
                ]
            }]
        }))
        .unwrap();
        let found = of(&spec);
        let expected: References = [
            ((ObjectKind::ConfigMap, "files"), whole(false)),
            ((ObjectKind::Secret, "tls"), keys(&["crt"], true)),
            ((ObjectKind::ConfigMap, "projected"), keys(&["x"], false)),
            ((ObjectKind::Secret, "projected-secret"), whole(false)),
            ((ObjectKind::Secret, "init-env"), whole(true)),
            ((ObjectKind::ConfigMap, "env"), whole(false)),
            ((ObjectKind::ConfigMap, "one"), keys(&["a"], false)),
            ((ObjectKind::Secret, "password"), keys(&["pw"], false)),
        ]
        .into_iter()
        .map(|((kind, name), used)| ((kind, name.to_owned()), used))
        .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn several_uses_of_one_object_merge_into_the_widest() {
        let spec: PodSpec = serde_json::from_value(json!({
            "volumes": [{"name": "v", "configMap": {"name": "app", "items": [{"key": "b", "path": "b"}], "optional": true}}],
            "containers": [{"name": "c", "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "a", "optional": true}}},
                {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a", "optional": true}}}
            ], "envFrom": [{"secretRef": {"name": "s", "optional": false}}]}]
        }))
        .unwrap();
        let found = of(&spec);
        assert_eq!(found[&(ObjectKind::ConfigMap, "app".to_owned())], keys(&["a", "b"], true));
        assert_eq!(found[&(ObjectKind::Secret, "s".to_owned())], whole(false), "one required use makes it required");
    }

    #[test]
    fn keys_no_object_can_hold_are_dropped_so_the_encoding_stays_unambiguous() {
        let spec: PodSpec = serde_json::from_value(json!({
            "volumes": [{"name": "v", "configMap": {"name": "app", "items": [
                {"key": "*", "path": "a"}, {"key": "a,b", "path": "b"}, {"key": "?c", "path": "c"}, {"key": "ok", "path": "d"}
            ]}}],
            "containers": [{"name": "c", "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "*"}}}]}]
        }))
        .unwrap();
        let found = of(&spec);
        let decoded = decode(&encode(&found).collect());
        assert_eq!(decoded, found);
        assert_eq!(found[&(ObjectKind::ConfigMap, "app".to_owned())], keys(&["ok"], false));
        assert_eq!(found[&(ObjectKind::Secret, "s".to_owned())], keys(&[], false), "reads no key it could hold");
    }

    #[test]
    fn references_survive_the_cache_encoding_next_to_other_annotations() {
        let references: References = [
            ((ObjectKind::ConfigMap, "app".to_owned()), keys(&["a", "b.c"], false)),
            ((ObjectKind::Secret, "db".to_owned()), whole(true)),
            ((ObjectKind::Secret, "one".to_owned()), keys(&["k"], true)),
        ]
        .into();
        let mut annotations: BTreeMap<String, String> = encode(&references).collect();
        annotations.insert("checksum.consulbind.dev/x".into(), "abc".into());
        annotations.insert("owned.checksum.consulbind.dev/x".into(), String::new());
        annotations.insert("workload-ref".into(), "Deployment \"t\"".into());
        assert_eq!(decode(&annotations.into()), references);
        assert!(decode(&Pairs::default()).is_empty());
    }
}
