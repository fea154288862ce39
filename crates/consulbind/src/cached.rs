//! A binding as the binding cache keeps it: the metadata the controller reads, and its spec as
//! JSON, read back at the start of each reconcile. Typed, a spec took 128 bytes inline and its
//! lists and strings about 260 more; as JSON, most take under 200 in all. The uid goes with the
//! spec, where kube-runtime's store would hold it twice more (the metadata and the key).

use std::borrow::Cow;

use consulbind_api::{ConsulBinding, ConsulBindingSpec};
use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::Resource;

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(from = "ConsulBinding")]
pub struct Cached {
    pub metadata: ObjectMeta,
    /// The uid's length in a byte, the uid, then the spec's JSON.
    packed: Box<[u8]>,
}

impl From<ConsulBinding> for Cached {
    fn from(mut binding: ConsulBinding) -> Self {
        // Kept in the metadata if too long for its length byte; a uid is a UUID.
        let uid = binding.metadata.uid.take_if(|uid| uid.len() <= usize::from(u8::MAX)).unwrap_or_default();
        let mut packed = vec![uid.len() as u8];
        packed.extend_from_slice(uid.as_bytes());
        // A typed spec always serializes.
        let _ = serde_json::to_writer(&mut packed, &binding.spec);
        Self { metadata: binding.metadata, packed: packed.into_boxed_slice() }
    }
}

impl Cached {
    /// The binding whole again, without its status (its record keeps that).
    pub fn binding(&self) -> ConsulBinding {
        let mut metadata = self.metadata.clone();
        let (uid, _) = self.unpacked();
        if !uid.is_empty() {
            metadata.uid = Some(uid.to_owned());
        }
        ConsulBinding { metadata, spec: self.spec(), status: None }
    }

    /// The uid, which the metadata no longer holds.
    pub fn uid(&self) -> Option<&str> {
        let (uid, _) = self.unpacked();
        if uid.is_empty() { self.metadata.uid.as_deref() } else { Some(uid) }
    }

    pub fn spec(&self) -> ConsulBindingSpec {
        serde_json::from_slice(self.unpacked().1).expect("a spec this process wrote as JSON reads back")
    }

    fn unpacked(&self) -> (&str, &[u8]) {
        let (len, rest) = self.packed.split_first().expect("never empty");
        let (uid, spec) = rest.split_at(usize::from(*len));
        (std::str::from_utf8(uid).expect("written from a str"), spec)
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
        binding.metadata.uid = Some("4a1f0c2e-0000-4000-8000-000000000001".into());
        let cached = Cached::from(binding.clone());
        assert_eq!(cached.meta().uid, None, "kept with the spec");
        assert_eq!(cached.uid(), binding.metadata.uid.as_deref());
        assert_eq!(cached.meta().name.as_deref(), Some("web"));
        let json = |b: &ConsulBinding| serde_json::to_value(b).expect("serializes");
        assert_eq!(json(&cached.binding()), json(&binding));

        binding.metadata.uid = Some("u".repeat(300));
        let long = Cached::from(binding.clone());
        assert_eq!(json(&long.binding()), json(&binding), "a uid of any length");
        assert_eq!(long.uid(), binding.metadata.uid.as_deref());
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
