//! A binding as the binding cache keeps it: the metadata the controller reads, and its spec as
//! JSON, read back at the start of each reconcile. Typed, a spec took 128 bytes inline and its
//! lists and strings about 260 more; as JSON, most take under 200 in all.

use std::borrow::Cow;

use consulbind_api::{ConsulBinding, ConsulBindingSpec};
use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::Resource;

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(from = "ConsulBinding")]
pub struct Cached {
    pub metadata: ObjectMeta,
    spec: Box<[u8]>,
}

impl From<ConsulBinding> for Cached {
    fn from(binding: ConsulBinding) -> Self {
        // A typed spec always serializes.
        let spec = serde_json::to_vec(&binding.spec).unwrap_or_default();
        Self { metadata: binding.metadata, spec: spec.into_boxed_slice() }
    }
}

impl Cached {
    /// The binding whole again, without its status (its record keeps that).
    pub fn binding(&self) -> ConsulBinding {
        ConsulBinding { metadata: self.metadata.clone(), spec: self.spec(), status: None }
    }

    pub fn spec(&self) -> ConsulBindingSpec {
        serde_json::from_slice(&self.spec).expect("a spec this process wrote as JSON reads back")
    }
}

impl Resource for Cached {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        ConsulBinding::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        ConsulBinding::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        ConsulBinding::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        ConsulBinding::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use consulbind_api::{KeySource, TargetRef, WorkloadKind};
    use serde::Deserialize;

    use super::*;

    #[test]
    fn a_binding_reads_back_whole_but_for_its_status() {
        let spec = ConsulBindingSpec {
            keys: vec![KeySource { key: "app/config".into(), ..Default::default() }],
            targets: vec![TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), ..Default::default() }],
            ..Default::default()
        };
        let mut binding = ConsulBinding::new("web", spec);
        binding.metadata.namespace = Some("team".into());
        binding.metadata.generation = Some(3);
        let cached = Cached::from(binding.clone());
        assert_eq!(cached.meta().name.as_deref(), Some("web"));
        let json = |b: &ConsulBinding| serde_json::to_value(b).expect("serializes");
        assert_eq!(json(&cached.binding()), json(&binding));
    }

    /// Every field the examples set, waves, windows and all, reads back as it was.
    #[test]
    fn the_examples_read_back_whole() {
        let examples =
            [include_str!("../../../examples/consulbinding.yaml"), include_str!("../../../examples/advanced.yaml")];
        let mut read = 0;
        for document in examples.iter().flat_map(|text| serde_yaml::Deserializer::from_str(text)) {
            let value = serde_yaml::Value::deserialize(document).expect("YAML");
            if value.get("kind").and_then(|k| k.as_str()) != Some("ConsulBinding") {
                continue;
            }
            let binding: ConsulBinding = serde_yaml::from_value(value).expect("a binding");
            let json = |b: &ConsulBinding| serde_json::to_value(b).expect("serializes");
            assert_eq!(json(&Cached::from(binding.clone()).binding()), json(&binding));
            read += 1;
        }
        assert!(read >= 2, "{read} examples read");
    }
}
