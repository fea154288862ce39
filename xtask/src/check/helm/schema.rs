//! The chart's `values.schema.json`, made from `values.yaml`: each value takes the type of its
//! default, and an object takes no key it does not declare, so Helm refuses a mistyped or
//! unknown value at `install`, `upgrade`, `template` and `lint`. `values.yaml`'s defaults are
//! held to the controller's flags (see [`super::values_are_the_defaults`]), so the flags, the
//! values and the schema cannot disagree.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::{Map, Value, json};

use super::CHART;
use crate::common::repo_root;

/// Values whose keys are the user's own: labels, annotations and Kubernetes' own objects.
pub(super) const OPEN: &[&str] = &[
    "resources",
    "podSecurityContext",
    "securityContext",
    "podAnnotations",
    "podLabels",
    "nodeSelector",
    "affinity",
    "serviceAccount.annotations",
    "metrics.service.annotations",
    "metrics.serviceMonitor.labels",
    "metrics.prometheusRule.labels",
    "metrics.dashboard.labels",
];
/// Values that take a count or a percentage.
const COUNT_OR_PERCENT: &[&str] = &["podDisruptionBudget.minAvailable"];

pub fn path() -> PathBuf {
    repo_root().join(CHART).join("values.schema.json")
}

/// The schema, as the file holds it.
pub fn generate() -> Result<String> {
    let path = repo_root().join(CHART).join("values.yaml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let values: serde_yaml::Value = serde_yaml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let mut schema = of(&values, "");
    schema["$schema"] = json!("http://json-schema.org/draft-07/schema#");
    schema["title"] = json!("Values of the consulbind chart (generated from values.yaml by cargo xtask helm --write)");
    Ok(serde_json::to_string_pretty(&schema)? + "\n")
}

fn of(value: &serde_yaml::Value, at: &str) -> Value {
    use serde_yaml::Value as Y;
    match value {
        _ if COUNT_OR_PERCENT.contains(&at) => json!({"type": ["integer", "string"]}),
        Y::Mapping(_) if OPEN.contains(&at) => json!({"type": "object"}),
        Y::Mapping(map) => {
            let properties: Map<String, Value> = map
                .iter()
                .filter_map(|(key, value)| key.as_str().map(|key| (key, value)))
                .map(|(key, value)| {
                    let path = if at.is_empty() { key.to_owned() } else { format!("{at}.{key}") };
                    (key.to_owned(), of(value, &path))
                })
                .collect();
            json!({"type": "object", "additionalProperties": false, "properties": properties})
        }
        Y::Sequence(_) => json!({"type": "array"}),
        Y::String(_) => json!({"type": "string"}),
        Y::Bool(_) => json!({"type": "boolean"}),
        Y::Number(n) if n.is_i64() || n.is_u64() => json!({"type": "integer"}),
        Y::Number(_) => json!({"type": "number"}),
        Y::Null | Y::Tagged(_) => json!({}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_takes_its_defaults_type_and_an_object_only_its_declared_keys() {
        let values: serde_yaml::Value =
            serde_yaml::from_str("a: {b: 1, c: x}\nnodeSelector: {}\npodDisruptionBudget: {minAvailable: 1}\nd: []")
                .unwrap();
        let schema = of(&values, "");
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["a"]["properties"]["b"]["type"], "integer");
        assert_eq!(schema["properties"]["a"]["properties"]["c"]["type"], "string");
        assert_eq!(schema["properties"]["a"]["additionalProperties"], false);
        assert_eq!(schema["properties"]["nodeSelector"], json!({"type": "object"}), "the user's own keys");
        assert_eq!(
            schema["properties"]["podDisruptionBudget"]["properties"]["minAvailable"]["type"],
            json!(["integer", "string"])
        );
        assert_eq!(schema["properties"]["d"]["type"], "array");
    }
}
