//! Label selectors as Kubernetes takes them: kube's parser accepts some that the API server
//! refuses, and one of those (`NotIn` with no values) would select every workload of a kind.

use consulbind_api::TargetRef;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::Selector;

/// What is wrong with a target's selector, for spec validation.
pub fn selector_error(target: &TargetRef) -> Option<String> {
    let problem = label_selector_error(target.selector.as_ref()?)?;
    Some(format!("invalid selector on {} target: {problem}", target.kind))
}

/// What the API server would refuse in `selector`.
pub fn label_selector_error(selector: &LabelSelector) -> Option<String> {
    problem(selector).or_else(|| Selector::try_from(selector.clone()).err().map(|e| e.to_string()))
}

/// By the API server's rules for a `LabelSelector`.
fn problem(selector: &LabelSelector) -> Option<String> {
    for (key, value) in selector.match_labels.iter().flatten() {
        if let Some(problem) = key_problem(key).or_else(|| value_problem(value)) {
            return Some(format!("matchLabels {key:?}: {value:?}: {problem}"));
        }
    }
    for expression in selector.match_expressions.iter().flatten() {
        let (key, operator) = (&expression.key, expression.operator.as_str());
        let values = expression.values.as_deref().unwrap_or_default();
        let problem = match operator {
            "In" | "NotIn" if values.is_empty() => Some("needs at least one value".into()),
            "Exists" | "DoesNotExist" if !values.is_empty() => Some("takes no values".into()),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {
                key_problem(key).or_else(|| values.iter().find_map(|v| value_problem(v).map(|p| format!("{v:?} {p}"))))
            }
            _ => Some("the operator is none of In, NotIn, Exists and DoesNotExist".into()),
        };
        if let Some(problem) = problem {
            return Some(format!("matchExpressions {key:?} {operator}: {problem}"));
        }
    }
    None
}

/// A label key: an optional DNS subdomain and `/`, then a name.
fn key_problem(key: &str) -> Option<String> {
    let (prefix, name) = key.rsplit_once('/').map_or((None, key), |(p, n)| (Some(p), n));
    let dns = |p: &str| {
        p.len() <= 253
            && p.split('.').all(|label| {
                let b = label.as_bytes();
                !b.is_empty()
                    && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                    && b[0] != b'-'
                    && b[b.len() - 1] != b'-'
            })
    };
    if prefix.is_some_and(|p| !dns(p)) {
        return Some("the key's prefix is not a DNS subdomain".into());
    }
    match name.is_empty() {
        true => Some("the key has no name".into()),
        false => value_problem(name).map(|p| format!("the key's name {p}")),
    }
}

/// A label value, or the name part of a key: empty, or at most 63 letters, digits, `-`, `_` and
/// `.`, starting and ending with a letter or digit.
fn value_problem(value: &str) -> Option<String> {
    let b = value.as_bytes();
    let fine = b.is_empty()
        || (b.len() <= 63
            && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric());
    (!fine).then(|| {
        "is not a label value (at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or \
         digit)"
            .into()
    })
}

#[cfg(test)]
mod tests {
    use consulbind_api::WorkloadKind;
    use serde_json::json;

    use super::*;

    fn error(selector: serde_json::Value) -> Option<String> {
        let selector = serde_json::from_value(selector).unwrap();
        selector_error(&TargetRef { kind: WorkloadKind::Deployment, name: None, selector: Some(selector) })
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> serde_json::Value {
        json!({"matchExpressions": [{"key": key, "operator": operator, "values": values}]})
    }

    #[test]
    fn selectors_the_api_server_refuses_are_refused() {
        // `NotIn` with no values would otherwise select every Deployment of the namespace.
        for (selector, why) in [
            (expression("app", "NotIn", &[]), "needs at least one value"),
            (expression("app", "In", &[]), "needs at least one value"),
            (expression("app", "Exists", &["web"]), "takes no values"),
            (expression("app", "Gt", &["1"]), "operator"),
            (expression("app", "In", &["not valid"]), "not a label value"),
            (expression("Bad_Prefix/app", "Exists", &[]), "DNS subdomain"),
            (expression("", "Exists", &[]), "no name"),
            (json!({"matchLabels": {"app": "-web"}}), "not a label value"),
            (json!({"matchLabels": {"team/": "a"}}), "no name"),
            (json!({"matchLabels": {"app": "x".repeat(64)}}), "not a label value"),
        ] {
            let error = error(selector.clone()).unwrap_or_else(|| panic!("{selector} was accepted"));
            assert!(error.contains(why), "{selector}: {error}");
        }
    }

    #[test]
    fn selectors_the_api_server_takes_are_taken() {
        for selector in [
            json!({}),
            json!({"matchLabels": {"app": "web", "example.com/tier": "", "x": "a.b_c-d"}}),
            expression("app", "In", &["web", "api"]),
            expression("app.kubernetes.io/name", "DoesNotExist", &[]),
            json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
        ] {
            assert_eq!(error(selector.clone()), None, "{selector}");
        }
    }
}
