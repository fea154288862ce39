//! The CustomResourceDefinition as `cargo xtask crdgen` writes it into `crds/`: with validation
//! rules for Kubernetes 1.25 and newer, and without them for older API servers, which refuse the
//! rules' field.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::{
    Schema,
    transform::{Transform, transform_subschemas},
};

use crate::ConsulBinding;

/// The CRD with [`DropNullable`] applied to every version's schema. Its validation rules
/// (`x-kubernetes-validations`, CEL) refuse at admission what the controller would show as
/// `InvalidSpec`; the controller keeps its own checks for servers without them.
pub fn crd() -> CustomResourceDefinition {
    transformed(&mut DropNullable)
}

/// [`crd`] without its validation rules, for Kubernetes 1.20 to 1.24.
pub fn crd_without_rules() -> CustomResourceDefinition {
    transformed(&mut |schema: &mut Schema| {
        DropNullable.transform(schema);
        DropRules.transform(schema);
    })
}

fn transformed(transform: &mut impl Transform) -> CustomResourceDefinition {
    let mut crd = ConsulBinding::crd();
    for version in &mut crd.spec.versions {
        let Some(props) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) else {
            continue;
        };
        let mut schema = Schema::try_from(serde_json::to_value(&*props).expect("JSONSchemaProps serialize"))
            .expect("the CRD schema is a JSON object");
        transform.transform(&mut schema);
        *props = serde_json::from_value(schema.to_value()).expect("valid JSONSchemaProps after the transform");
    }
    crd
}

struct DropRules;

impl Transform for DropRules {
    fn transform(&mut self, schema: &mut Schema) {
        schema.remove("x-kubernetes-validations");
        transform_subschemas(self, schema);
    }
}

/// Removes `nullable: true`, which kube-derive adds to every `Option` field. The 1.20 API server
/// drops the type of nullable fields from its OpenAPI v2, so `kubectl explain` showed them as
/// `<>`. Every `Option` field here is skipped when `None` rather than sent as null, and the API
/// server prunes a null that some other client sends to a non-nullable field.
pub struct DropNullable;

impl Transform for DropNullable {
    fn transform(&mut self, schema: &mut Schema) {
        schema.remove("nullable");
        // An optional enum lists null among its values; the API server refuses that.
        if let Some(serde_json::Value::Array(values)) = schema.get_mut("enum") {
            values.retain(|v| !v.is_null());
        }
        transform_subschemas(self, schema);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn schema() -> Value {
        let crd = crd();
        serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
            .unwrap()
    }

    /// Every schema below `path` (properties and array items), with its path.
    fn walk<'a>(path: String, schema: &'a Value, out: &mut Vec<(String, &'a Value)>) {
        out.push((path.clone(), schema));
        if let Some(props) = schema["properties"].as_object() {
            for (name, child) in props {
                walk(format!("{path}.{name}"), child, out);
            }
        }
        if schema["items"].is_object() {
            walk(format!("{path}[]"), &schema["items"], out);
        }
        if schema["additionalProperties"].is_object() {
            walk(format!("{path}{{}}"), &schema["additionalProperties"], out);
        }
    }

    #[test]
    fn no_field_is_nullable_and_every_field_has_a_type() {
        let schema = schema();
        let mut all = Vec::new();
        walk("consulbinding".into(), &schema, &mut all);
        assert!(all.len() > 40, "walked only {} schemas", all.len());
        for (path, field) in all {
            assert!(field.get("nullable").is_none(), "{path} is nullable");
            let values = field.get("enum").and_then(Value::as_array).into_iter().flatten();
            assert!(values.clone().all(|v| !v.is_null()), "{path} lists null among its values");
            assert!(field["type"].is_string(), "{path} has no type: {field}");
        }
    }

    #[test]
    fn the_variant_for_old_servers_has_every_field_and_no_rule() {
        let with = serde_json::to_string(&crd()).unwrap();
        let without = serde_json::to_string(&crd_without_rules()).unwrap();
        assert_eq!(
            with.matches("x-kubernetes-validations").count(),
            6,
            "spec, targets, rollout, waves, budget, windows"
        );
        assert!(!without.contains("x-kubernetes-validations"));
        let mut stripped: Value = serde_json::from_str(&with).unwrap();
        fn drop_rules(v: &mut Value) {
            match v {
                Value::Object(map) => {
                    map.remove("x-kubernetes-validations");
                    map.values_mut().for_each(drop_rules);
                }
                Value::Array(items) => items.iter_mut().for_each(drop_rules),
                _ => {}
            }
        }
        drop_rules(&mut stripped);
        assert_eq!(stripped, serde_json::from_str::<Value>(&without).unwrap());
    }

    #[test]
    fn optional_fields_stay_optional() {
        let schema = schema();
        let required = |v: &Value| v["required"].as_array().cloned().unwrap_or_default();
        assert!(!required(&schema).contains(&"status".into()));
        let spec = &schema["properties"]["spec"];
        assert_eq!(required(spec), vec![Value::from("targets")]);
        assert!(required(&spec["properties"]["consul"]).is_empty());
    }

    #[test]
    fn absent_options_are_not_serialized_as_null() {
        let binding = ConsulBinding::new("b", crate::ConsulBindingSpec::default());
        let json = serde_json::to_value(&binding).unwrap();
        assert!(json.get("status").is_none(), "{json}");
        assert!(json["spec"].get("consul").is_none() && json["spec"].get("rollout").is_none(), "{json}");
        let status = serde_json::to_value(crate::ConsulBindingStatus::default()).unwrap();
        assert_eq!(status, serde_json::json!({}));
    }
}
