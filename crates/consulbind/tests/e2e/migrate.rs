//! `consulbind migrate` on the bed: it reads Reloader's and Wave's annotations from the cluster,
//! changes nothing there, and the bindings it writes, once applied, roll each workload once
//! for a change of what it named.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use consulbind_api::conditions::{self, reason};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{Api, ResourceExt, api::ListParams};
use serde_json::{Value, json};

use crate::support::{SETTLE, Scene, wait, workload};

fn config_map(name: &str, value: &str, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "annotations": annotations}, "data": {"value": value}})
}

/// A Deployment annotated by the other tool, whose container reads `env_from` whole.
fn annotated(name: &str, annotations: Value, env_from: &str) -> Value {
    let mut manifest = workload("Deployment", name, json!({}));
    manifest["metadata"]["annotations"] = annotations;
    manifest["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": env_from}}]);
    manifest
}

/// What a write would change: each ConfigMap's resource version, each Deployment's generation
/// and annotations (kube-controller-manager writes their status), and the bindings.
async fn versions(s: &Scene) -> BTreeMap<String, String> {
    let lp = ListParams::default();
    let deployments = Api::<Deployment>::namespaced(s.client.clone(), &s.ns).list(&lp).await.unwrap();
    let maps = Api::<ConfigMap>::namespaced(s.client.clone(), &s.ns).list(&lp).await.unwrap();
    let bindings = s.bindings().list(&lp).await.unwrap();
    let deployments = deployments.items.iter().map(|d| {
        (format!("Deployment {}", d.name_any()), format!("{:?} {:?}", d.metadata.generation, d.annotations()))
    });
    let maps = maps.items.iter().map(|m| (format!("ConfigMap {}", m.name_any()), m.resource_version().unwrap()));
    let bindings = bindings.items.iter().map(|b| (format!("ConsulBinding {}", b.name_any()), String::new()));
    deployments.chain(maps).chain(bindings).collect()
}

#[tokio::test]
async fn migrate_turns_reloader_and_wave_annotations_into_bindings_that_roll_once() {
    let Some(s) = Scene::new("migrate").await else { return };
    s.apply(config_map("settings", "1", json!({}))).await.unwrap();
    s.apply(config_map("ignored", "1", json!({"reloader.stakater.com/ignore": "true"}))).await.unwrap();
    s.apply(config_map("extra", "1", json!({}))).await.unwrap();
    let reloader = json!({"reloader.stakater.com/auto": "true"});
    s.apply(annotated("reloaded", reloader, "settings")).await.unwrap();
    let wave = json!({"wave.pusher.com/update-on-config-change": "true", "wave.pusher.com/extra-configmaps": "extra"});
    s.apply(annotated("waved", wave, "ignored")).await.unwrap();
    let named = json!({"configmap.reloader.stakater.com/reload": "extra", "reloader.stakater.com/auto": "true"});
    s.apply(annotated("ignoring", named, "ignored")).await.unwrap();
    // The deployment controller marks a Deployment with its revision after it made the
    // ReplicaSet: the snapshot below is taken once that write is done, not racing it.
    let deployments = Api::<Deployment>::namespaced(s.client.clone(), &s.ns);
    for name in WORKLOADS {
        let seen = || async {
            let marked = deployments.get(name).await?.annotations().contains_key("deployment.kubernetes.io/revision");
            Ok(marked && s.revisions("Deployment", name).await >= 1)
        };
        wait(&format!("a first revision of {name}"), seen).await.unwrap();
    }
    let before = versions(&s).await;

    let out = Command::new(env!("CARGO_BIN_EXE_consulbind")).args(["migrate", "-n", &s.ns]).output().unwrap();
    let (bindings, notes) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{notes}");
    assert_eq!(versions(&s).await, before, "migrate changed the cluster");
    assert!(notes.contains("3 binding(s) from 3 workload(s)"), "{notes}");
    assert!(notes.contains("ConfigMap ignored has reloader.stakater.com/ignore"), "{notes}");

    let mut apply = Command::new("kubectl")
        .args(["apply", "-n", &s.ns, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    apply.stdin.take().unwrap().write_all(bindings.as_bytes()).unwrap();
    let applied = apply.wait_with_output().unwrap();
    assert!(applied.status.success(), "kubectl apply: {}\n{bindings}", String::from_utf8_lossy(&applied.stderr));
    for name in WORKLOADS {
        s.wait_condition(name, conditions::READY, "True", reason::BASELINED).await;
    }
    // The referenced object rolls the auto workloads; the ignored one only Wave's, which knows
    // no ignore; the named one those that name it.
    s.apply(config_map("settings", "2", json!({}))).await.unwrap();
    rolled_once(&s, &["reloaded"]).await;
    s.apply(config_map("ignored", "2", json!({"reloader.stakater.com/ignore": "true"}))).await.unwrap();
    rolled_once(&s, &["waved"]).await;
    s.apply(config_map("extra", "2", json!({}))).await.unwrap();
    rolled_once(&s, &["waved", "ignoring"]).await;
    s.finish().await;
}

const WORKLOADS: [&str; 3] = ["reloaded", "waved", "ignoring"];

/// Waits until each of `changed` rolled once, then asserts that no workload rolled more.
async fn rolled_once(s: &Scene, changed: &[&str]) {
    let mut want = BTreeMap::new();
    for name in WORKLOADS {
        want.insert(name, s.generation(name).await + i64::from(changed.contains(&name)));
    }
    let all = || async {
        for name in changed {
            if s.generation(name).await < want[name] {
                return Ok(false);
            }
        }
        Ok(true)
    };
    wait(&format!("{changed:?} to roll"), all).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    for name in WORKLOADS {
        assert_eq!(s.generation(name).await, want[name], "{name} after a change for {changed:?}\n{}", s.log());
    }
}
