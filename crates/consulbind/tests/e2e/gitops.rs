//! What GitOps tools read of a binding: kstatus's conditions (Flux, `kubectl wait`) and the
//! Argo CD health check in `config/argocd/`, run by Lua 5.1 (Argo CD's dialect) on statuses the
//! controller wrote on the real servers.

use std::process::Command;

use consulbind_api::conditions::{self, reason};
use serde_json::{Value, json};

use crate::support::{self, Scene, deploy, spec};

/// The health check as shipped.
fn health_check() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/argocd/argocd-cm.yaml");
    let config: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    config["data"]["resource.customizations.health.consulbind.dev_ConsulBinding"].as_str().unwrap().to_owned()
}

/// `value` as a Lua table constructor, the way Argo CD hands an object to a health check.
fn lua(value: &Value) -> String {
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => lua_string(s),
        Value::Array(items) => format!("{{{}}}", items.iter().map(lua).collect::<Vec<_>>().join(", ")),
        Value::Object(fields) => {
            let fields = fields.iter().filter(|(_, v)| !v.is_null());
            let fields = fields.map(|(k, v)| format!("[{}] = {}", lua_string(k), lua(v)));
            format!("{{{}}}", fields.collect::<Vec<_>>().join(", "))
        }
    }
}

/// A Lua 5.1 string literal: every byte but printable ASCII as a decimal escape.
fn lua_string(text: &str) -> String {
    let escaped = text.bytes().map(|b| match b {
        b'"' | b'\\' => format!("\\{}", b as char),
        0x20..=0x7e => (b as char).to_string(),
        _ => format!("\\{b:03}"),
    });
    format!("\"{}\"", escaped.collect::<String>())
}

/// The health Argo CD would show for `binding`: its status and message.
fn argo_health(binding: &Value) -> (String, String) {
    let script = format!(
        "obj = {}\nlocal hs = (function()\n{}\nend)()\nio.write(hs.status, \"\\t\", hs.message or \"\")",
        lua(binding),
        health_check()
    );
    let out = Command::new("lua5.1").arg("-e").arg(&script).output().expect("lua5.1 (cargo xtask e2e installs it)");
    assert!(out.status.success(), "lua5.1: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let (status, message) = text.split_once('\t').unwrap();
    (status.to_owned(), message.to_owned())
}

async fn health_of(s: &Scene, name: &str) -> (String, String) {
    argo_health(&serde_json::to_value(s.get_binding(name).await).unwrap())
}

fn condition<'a>(binding: &'a consulbind_api::ConsulBinding, type_: &str) -> (&'a str, &'a str) {
    let status = binding.status.as_ref().unwrap();
    let found = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (found.status.as_str(), found.reason.as_str())
}

#[tokio::test]
async fn flux_and_argo_cd_read_settled_waiting_stuck_and_suspended_bindings_as_such() {
    if Command::new("lua5.1").arg("-v").output().is_err() && !support::servers_required() {
        return;
    }
    let Some(s) = Scene::new("gitops").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload("Deployment", "web", json!({})).await;

    s.binding("settled", spec(json!([{"key": &key}]), deploy("web"), "0s")).await;
    // A Deployment of its own: a stamp of another binding on the same one would carry its change.
    s.workload("Deployment", "slow", json!({})).await;
    s.binding("waiting", spec(json!([{"key": &key}]), deploy("slow"), "1h")).await;
    s.binding("stuck", spec(json!([{"key": s.key("absent")}]), deploy("web"), "0s")).await;
    // What the schema cannot say: one ConfigMap listed twice.
    let twice = json!({"configMaps": [{"name": "app", "keys": ["a"]}, {"name": "app", "keys": ["b"]}],
                       "targets": deploy("web")});
    s.binding("invalid", twice).await;
    let mut suspended = spec(json!([{"key": &key}]), deploy("web"), "0s");
    suspended["suspend"] = json!(true);
    s.binding("suspended", suspended).await;

    let settled = s.wait_condition("settled", conditions::READY, "True", reason::BASELINED).await;
    assert_eq!(condition(&settled, conditions::RECONCILING).0, "False");
    assert_eq!(condition(&settled, conditions::STALLED).0, "False");
    assert_eq!(health_of(&s, "settled").await.0, "Healthy");
    s.kubectl(&["wait", "--for=condition=Ready", "--timeout=10s", "consulbinding/settled"]);

    s.wait_condition("suspended", conditions::READY, "True", reason::BASELINED).await;
    assert_eq!(health_of(&s, "suspended").await.0, "Suspended");

    s.wait_condition("waiting", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    let waiting = s.wait_condition("waiting", conditions::RECONCILING, "True", reason::PENDING).await;
    assert_eq!(condition(&waiting, conditions::STALLED).0, "False");
    let (health, message) = health_of(&s, "waiting").await;
    assert_eq!(health, "Progressing", "{message}");
    assert!(message.starts_with(reason::PENDING), "{message}");

    let stuck = s.wait_condition("stuck", conditions::STALLED, "True", reason::KEY_MISSING).await;
    assert_eq!(condition(&stuck, conditions::RECONCILING).0, "False");
    assert_eq!(health_of(&s, "stuck").await.0, "Degraded");
    s.kubectl(&["wait", "--for=condition=Stalled", "--timeout=10s", "consulbinding/stuck"]);

    s.wait_condition("invalid", conditions::STALLED, "True", reason::INVALID_SPEC).await;
    let (health, message) = health_of(&s, "invalid").await;
    assert_eq!(health, "Degraded");
    assert!(message.contains(r#"ConfigMap "app" is listed twice"#), "{message}");

    // A spec the controller has not observed yet is Progressing, whatever the conditions say.
    let mut unobserved = serde_json::to_value(s.get_binding("settled").await).unwrap();
    unobserved["metadata"]["generation"] = json!(99);
    assert_eq!(argo_health(&unobserved).0, "Progressing");
    assert_eq!(argo_health(&json!({"metadata": {"name": "new", "generation": 1}, "spec": {}})).0, "Progressing");
    s.finish().await;
}
