//! ConfigMaps and Secrets as sources beside Consul: one checksum, one debounce, one rollout.

use std::time::Duration;

use consulbind_api::conditions::{self, reason};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use consulbind::names;
use kube::api::{Patch, PatchParams};

use crate::{
    DEPLOY,
    support::{self, SETTLE, Scene, deploy, spec, workload},
};

fn config_map(name: &str, labels: Value, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": data})
}

fn secret(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data})
}

/// Rollouts of `web` so far, after giving the controller time to make a wrong one.
async fn settled_revisions(s: &Scene) -> usize {
    tokio::time::sleep(SETTLE).await;
    s.revisions(DEPLOY, "web").await
}

#[tokio::test]
async fn a_config_map_rolls_once_on_a_data_change_and_not_on_labels_neighbours_or_a_reapply() {
    let Some(s) = Scene::new("configmap").await else { return };
    s.apply(config_map("app", json!({}), json!({"a.conf": "x=1", "unbound": "1"}))).await.unwrap();
    s.apply(config_map("other", json!({}), json!({"a.conf": "x=1"}))).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    let spec = json!({"configMaps": [{"name": "app", "keys": ["a.conf", "b.bin"]}], "targets": deploy("web"),
                      "rollout": {"quietPeriod": "0s"}});
    s.binding("cfg", spec).await;
    let baselined = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    assert_eq!(baselined.key_summary.as_deref(), Some("1/1"));
    let object = &baselined.objects[0];
    assert!(object.present && object.entries == Some(1) && object.name == "app", "{object:?}");

    // A label, a neighbour, the same data applied again, and a key the binding does not read.
    s.apply(config_map("app", json!({"team": "a"}), json!({"a.conf": "x=1", "unbound": "1"}))).await.unwrap();
    s.apply(config_map("other", json!({}), json!({"a.conf": "x=2"}))).await.unwrap();
    s.apply(config_map("app", json!({"team": "b"}), json!({"a.conf": "x=1", "unbound": "2"}))).await.unwrap();
    assert_eq!(settled_revisions(&s).await, 1, "rolled without a change of the bound data");
    let still = s.get_binding("cfg").await.status.unwrap();
    assert_eq!(still.applied_checksum, baselined.applied_checksum);

    s.apply(config_map("app", json!({"team": "b"}), json!({"a.conf": "x=2", "unbound": "2"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 2).await;
    let rolled = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await.status.unwrap();
    assert_ne!(rolled.applied_checksum, baselined.applied_checksum);
    assert_ne!(rolled.objects[0].checksum, object.checksum);
    let note = s.wait_event("cfg", reason::ROLLED_OUT).await;
    assert!(note.contains(r#"ConfigMap "app""#), "the event does not say which source changed: {note}");

    // binaryData counts like data.
    let binary = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "labels": {"team": "b"}},
                        "data": {"a.conf": "x=2", "unbound": "2"}, "binaryData": {"b.bin": "AAE="}});
    s.apply(binary).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 3).await;
    assert_eq!(settled_revisions(&s).await, 3);
    s.finish().await;
}

#[tokio::test]
async fn a_secret_rolls_once_and_nothing_shows_its_value_or_a_plain_digest() {
    let Some(s) = Scene::new("secret-source").await else { return };
    let (old, new) = (format!("hunter2-{}", s.ns), format!("correct-horse-{}", s.ns));
    s.apply(secret("db", json!({"password": &old}))).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    let spec = json!({"secrets": [{"name": "db"}], "targets": deploy("web"), "rollout": {"quietPeriod": "0s"}});
    s.binding("cfg", spec).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    s.apply(secret("db", json!({"password": &new}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 2).await;
    let binding = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert_eq!(settled_revisions(&s).await, 2);

    let status = serde_json::to_string(&binding.status).unwrap();
    let events = format!("{:?}", s.events_for("cfg").await);
    let annotations = format!("{:?}", s.template_annotations(DEPLOY, "web").await);
    let log = s.log();
    for value in [&old, &new] {
        let hex: String = Sha256::digest(value.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let base64 = base64_of(value.as_bytes());
        for (place, text) in [("status", &status), ("events", &events), ("annotations", &annotations), ("log", &log)] {
            for trace in [value.as_str(), &hex[..16], base64.as_str()] {
                assert!(!text.contains(trace), "the {place} shows {trace:?}");
            }
        }
    }
    s.finish().await;
}

/// How the API server shows a Secret's value.
fn base64_of(bytes: &[u8]) -> String {
    serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap().as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_consul_key_and_a_config_map_changed_half_a_second_apart_roll_once() {
    let Some(s) = Scene::new("one-debounce").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.apply(config_map("app", json!({}), json!({"a.conf": "x=1"}))).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    let spec = json!({"keys": [{"key": &key}], "configMaps": [{"name": "app"}], "targets": deploy("web"),
                      "rollout": {"quietPeriod": "3s"}});
    s.binding("cfg", spec).await;
    let baselined = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    assert_eq!(baselined.key_summary.as_deref(), Some("2/2"));

    s.put(&key, "v2").await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    s.apply(config_map("app", json!({}), json!({"a.conf": "x=2"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 2).await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(settled_revisions(&s).await, 2, "two sources changed together rolled more than once");
    let note = s.wait_event("cfg", reason::ROLLED_OUT).await;
    assert!(note.contains(r#"ConfigMap "app""#) && note.contains(&format!("Consul key {key:?}")), "{note}");
    s.finish().await;
}

#[tokio::test]
async fn a_missing_required_config_map_holds_until_it_is_created_and_a_binding_needs_a_source() {
    let Some(s) = Scene::new("missing-object").await else { return };
    s.workload(DEPLOY, "web", json!({})).await;
    let spec = json!({"configMaps": [{"name": "later"}], "secrets": [{"name": "maybe", "optional": true}],
                      "targets": deploy("web"), "rollout": {"quietPeriod": "0s"}});
    s.binding("cfg", spec).await;
    let ready = s.wait_message("cfg", conditions::READY, "False", reason::OBJECT_MISSING).await;
    assert!(ready.contains(r#"ConfigMap "later""#) && !ready.contains("maybe"), "{}", ready);
    assert_eq!(settled_revisions(&s).await, 1);

    s.apply(config_map("later", json!({}), json!({"a": "1"}))).await.unwrap();
    let ready = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    assert_eq!(ready.key_summary.as_deref(), Some("1/2"), "the optional Secret is absent");
    assert_eq!(settled_revisions(&s).await, 1);

    // The optional Secret appearing is a change like any other.
    s.apply(secret("maybe", json!({"a": "1"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 2).await;

    s.binding("empty", json!({"targets": deploy("web")})).await;
    let ready = s.wait_message("empty", conditions::READY, "False", reason::INVALID_SPEC).await;
    assert!(ready.contains("no source"), "{}", ready);
    s.finish().await;
}

/// Deployment `web` whose pod template uses the objects of `pod` (volumes, containers).
fn web_using(pod: Value) -> Value {
    let mut web = workload(DEPLOY, "web", json!({}));
    let template = &mut web["spec"]["template"]["spec"];
    let container = pod["container"].as_object().cloned().unwrap_or_default();
    template["containers"][0].as_object_mut().unwrap().extend(container);
    if let Some(volumes) = pod.get("volumes") {
        template["volumes"] = volumes.clone();
    }
    web
}

#[tokio::test]
async fn references_through_env_from_a_secret_volume_a_projected_volume_and_a_secret_key_ref_each_roll_once() {
    let Some(s) = Scene::new("references").await else { return };
    s.apply(config_map("env", json!({}), json!({"LEVEL": "info"}))).await.unwrap();
    s.apply(secret("tls", json!({"tls.crt": "one"}))).await.unwrap();
    s.apply(config_map("projected", json!({}), json!({"a": "1", "unused": "1"}))).await.unwrap();
    s.apply(secret("db", json!({"password": "p1", "user": "u1"}))).await.unwrap();
    s.apply(config_map("unreferenced", json!({}), json!({"a": "1"}))).await.unwrap();
    s.apply(secret("registry", json!({"token": "r1"}))).await.unwrap();
    let web = web_using(json!({
        "volumes": [
            {"name": "tls", "secret": {"secretName": "tls"}},
            {"name": "all", "projected": {"sources": [
                {"configMap": {"name": "projected", "items": [{"key": "a", "path": "a"}]}}
            ]}}
        ],
        "container": {
            "envFrom": [{"configMapRef": {"name": "env"}}],
            "env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]
        }
    }));
    let mut web = web;
    web["spec"]["template"]["spec"]["imagePullSecrets"] = json!([{"name": "registry"}]);
    s.apply(web).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 1).await;
    let spec = json!({"includeTargetReferences": true, "targets": deploy("web"), "rollout": {"quietPeriod": "0s"}});
    s.binding("cfg", spec).await;
    let baselined = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    let mut bound: Vec<(String, String, bool)> =
        baselined.objects.iter().map(|o| (o.kind.to_string(), o.name.clone(), o.referenced)).collect();
    bound.sort();
    let expected = [("ConfigMap", "env"), ("ConfigMap", "projected"), ("Secret", "db"), ("Secret", "tls")];
    assert_eq!(bound, expected.map(|(k, n)| (k.to_owned(), n.to_owned(), true)), "image pull Secrets are not content");
    assert_eq!(baselined.key_summary.as_deref(), Some("4/4"));

    // What no reference reads: another ConfigMap, a key outside items or outside the keyRef, the
    // image pull Secret.
    s.apply(config_map("unreferenced", json!({}), json!({"a": "2"}))).await.unwrap();
    s.apply(config_map("projected", json!({}), json!({"a": "1", "unused": "2"}))).await.unwrap();
    s.apply(secret("db", json!({"password": "p1", "user": "u2"}))).await.unwrap();
    s.apply(secret("registry", json!({"token": "r2"}))).await.unwrap();
    assert_eq!(settled_revisions(&s).await, 1, "rolled for data no reference reads");

    s.apply(config_map("env", json!({}), json!({"LEVEL": "debug"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.apply(secret("tls", json!({"tls.crt": "two"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 3).await;
    s.apply(config_map("projected", json!({}), json!({"a": "2", "unused": "2"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 4).await;
    s.apply(secret("db", json!({"password": "p2", "user": "u2"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 5).await;
    let named = || async {
        let events = s.events_for("cfg").await;
        Ok(events.iter().any(|(r, n)| r == reason::ROLLED_OUT && n.contains(r#"Secret "db""#)))
    };
    support::wait("a RolledOut event naming the Secret", named).await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn a_template_change_that_adds_or_drops_a_reference_rolls_once_and_a_restart_rolls_nothing() {
    let Some(mut s) = Scene::new("reference-added").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.apply(config_map("extra", json!({}), json!({"x": "1"}))).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    let mut spec = spec(json!([{"key": &key}]), deploy("web"), "0s");
    spec["includeTargetReferences"] = json!(true);
    s.binding("cfg", spec).await;
    let baselined = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    assert!(baselined.objects.is_empty());
    // Rolled once by a change, so that the workload carries the binding's own stamp.
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    let stamp = s.template_annotations(DEPLOY, "web").await[&names::annotation_key("cfg")].clone();

    // The template change rolls; the reference it adds does not roll again.
    s.apply(web_using(json!({"container": {"envFrom": [{"configMapRef": {"name": "extra"}}]}}))).await.unwrap();
    crate::support::wait("the binding to read the new reference", || async {
        let status = s.get_binding("cfg").await.status.unwrap_or_default();
        Ok(status.objects.iter().any(|o| o.name == "extra" && o.referenced))
    })
    .await
    .unwrap();
    s.wait_revisions(DEPLOY, "web", 3).await;
    assert_eq!(s.template_annotations(DEPLOY, "web").await[&names::annotation_key("cfg")], stamp);
    let status = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await.status.unwrap();
    assert_eq!(status.target_summary.as_deref(), Some("1/1"));
    assert_eq!(status.targets[0].stamp.as_deref(), Some(stamp.as_str()));
    s.wait_event_containing("cfg", reason::BASELINED, "restarted nothing").await;

    // After a restart the old stamp still stands for the new content.
    s.stop_controller().await;
    s.start_controller(&[]).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert_eq!(settled_revisions(&s).await, 3, "a restart rolled a workload whose stamp stands for the content");

    // The new reference is content now.
    s.apply(config_map("extra", json!({}), json!({"x": "2"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 4).await;

    // Dropping it is the template's rollout alone, and its changes no longer roll.
    s.apply(workload(DEPLOY, "web", json!({}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 5).await;
    crate::support::wait("the binding to drop the reference", || async {
        Ok(s.get_binding("cfg").await.status.unwrap_or_default().objects.is_empty())
    })
    .await
    .unwrap();
    s.apply(config_map("extra", json!({}), json!({"x": "3"}))).await.unwrap();
    assert_eq!(settled_revisions(&s).await, 5);
    s.finish().await;
}

#[tokio::test]
async fn a_consul_only_status_from_before_config_map_sources_keeps_its_checksum_and_rolls_nothing() {
    let Some(mut s) = Scene::new("upgrade-sources").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("cfg", spec(json!([{"key": &key}]), deploy("web"), "0s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.stop_controller().await;

    // The status as that release wrote it: no objects, and keys counted from Consul alone. Its
    // checksum of the same content is the one pinned by the checksum tests' vectors.
    let keyed = s.checksum_of(&key, b"v2").await;
    let key_checksum = s.get_binding("cfg").await.status.unwrap().keys[0].checksum.clone();
    let status = json!({"status": {"appliedChecksum": &keyed, "shortChecksum": &keyed[..12], "keySummary": "1/1",
        "targetSummary": "1/1", "objects": null,
        "keys": [{"key": &key, "present": true, "entries": 1, "checksum": key_checksum}],
        "targets": [{"kind": "Deployment", "name": "web", "checksum": &keyed}]}});
    s.bindings().patch_status("cfg", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    assert_eq!(s.template_annotations(DEPLOY, "web").await[&names::annotation_key("cfg")], keyed);

    s.start_controller(&[]).await;
    let after = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await.status.unwrap();
    assert_eq!(after.applied_checksum.as_ref(), Some(&keyed));
    assert_eq!(settled_revisions(&s).await, 2, "an upgrade rolled");
    s.put(&key, "v3").await;
    s.wait_revisions(DEPLOY, "web", 3).await;
    s.finish().await;
}

#[tokio::test]
async fn a_template_over_the_reference_limit_is_refused_without_a_rollout_and_other_bindings_still_roll() {
    use consulbind::reconcile::read::MAX_REFERENCES;
    let Some(s) = Scene::new("too-many-references").await else { return };
    let names: Vec<String> = (0..=MAX_REFERENCES).map(|i| format!("ref-{i:02}")).collect();
    for name in &names {
        s.apply(config_map(name, json!({}), json!({"a": "1"}))).await.unwrap();
    }
    let env_from = |names: &[String]| -> Value { names.iter().map(|n| json!({"configMapRef": {"name": n}})).collect() };
    s.apply(web_using(json!({"container": {"envFrom": env_from(&names)}}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 1).await;
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "neighbour", json!({})).await;
    s.binding("neighbour", spec(json!([{"key": &key}]), deploy("neighbour"), "0s")).await;
    s.wait_condition("neighbour", conditions::READY, "True", reason::BASELINED).await;

    let spec_over =
        json!({"includeTargetReferences": true, "targets": deploy("web"), "rollout": {"quietPeriod": "0s"}});
    s.binding("over", spec_over).await;
    let ready = s.wait_message("over", conditions::READY, "False", reason::BINDING_TOO_LARGE).await;
    assert!(ready.contains(&MAX_REFERENCES.to_string()), "{}", ready);
    s.wait_event("over", reason::BINDING_TOO_LARGE).await;
    s.apply(config_map("ref-00", json!({}), json!({"a": "2"}))).await.unwrap();
    assert_eq!(settled_revisions(&s).await, 1, "a refused binding rolled its target");

    // The same controller serves the binding beside it.
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "neighbour", 2).await;

    // Back within the limit: the template change rolls the workload by itself, and the binding
    // takes the content it runs with as its baseline, adding no rollout of its own.
    s.apply(web_using(json!({"container": {"envFrom": env_from(&names[..MAX_REFERENCES])}}))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 2).await;
    let status = s.wait_condition("over", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    assert_eq!(status.objects.len(), MAX_REFERENCES);
    assert_eq!(settled_revisions(&s).await, 2, "the binding rolled when it came back within the limit");
    assert_eq!(s.revisions(DEPLOY, "neighbour").await, 2);
    s.finish().await;
}

/// Deployment `web` in the selector `tier=config`, its template reading ConfigMap `extra`.
fn web_reading_extra() -> Value {
    let mut web = workload(DEPLOY, "web", json!({"tier": "config"}));
    web["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "extra"}}]);
    web
}

/// Labels `web` back into binding `cfg`'s selector, and waits until `cfg` targets both
/// workloads again, is up to date, and has had time to make a wrong rollout.
async fn relabel_web_back(s: &Scene) {
    s.kubectl(&["label", "deployment", "web", "tier=config"]);
    crate::support::wait("the binding to find web again", || async {
        Ok(s.get_binding("cfg").await.status.unwrap_or_default().targets.len() == 2)
    })
    .await
    .unwrap();
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(SETTLE).await;
}

/// A workload whose template came to reference a ConfigMap after a rollout (recorded without a
/// rollout of the binding's), relabelled out of the selector and back, rolls nothing, and
/// neither does the target beside it: the status remembers what its stamp stands for after
/// its row went.
#[tokio::test]
async fn a_rebased_workload_relabelled_out_of_the_selector_and_back_rolls_nothing() {
    let Some(mut s) = Scene::new("rebased-relabel").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.apply(config_map("extra", json!({}), json!({"x": "1"}))).await.unwrap();
    s.workload(DEPLOY, "web", json!({"tier": "config"})).await;
    s.workload(DEPLOY, "api", json!({"tier": "config"})).await;
    let targets = json!([{"kind": "Deployment", "selector": {"matchLabels": {"tier": "config"}}}]);
    let mut spec = spec(json!([{"key": &key}]), targets, "0s");
    spec["includeTargetReferences"] = json!(true);
    s.binding("cfg", spec).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let created = s.generation("web").await;
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_revisions(DEPLOY, "api", 2).await;
    let api = s.generation("api").await;

    // The template now reads ConfigMap extra: that change is its own rollout.
    let web = web_reading_extra();
    s.apply(web).await.unwrap();
    crate::support::wait("the binding to read the new reference", || async {
        let status = s.get_binding("cfg").await.status.unwrap_or_default();
        Ok(status.objects.iter().any(|o| o.name == "extra" && o.referenced)
            && status.targets.iter().any(|t| t.name == "web" && t.stamp.is_some()))
    })
    .await
    .unwrap();
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    let carried = s.generation("web").await;
    assert_eq!(carried, created + 2, "one rollout for the change, one for the template\n{}", s.log());

    // Out of the selector and back, a few seconds later: no rollout.
    s.kubectl(&["label", "deployment", "web", "tier-"]);
    crate::support::wait("the binding to lose its target", || async {
        let status = s.get_binding("cfg").await.status.unwrap_or_default();
        Ok(status.targets.len() == 1 && status.former_targets.len() == 1)
    })
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    relabel_web_back(&s).await;
    assert_eq!(s.generation("web").await, carried, "relabelled back, it rolled with no change\n{}", s.log());
    assert_eq!(s.generation("api").await, api, "a workload found again rolled another\n{}", s.log());
    // Looked at again from its status alone, as after a restart.
    s.stop_controller().await;
    s.start_controller(&[]).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, carried, "after a restart, it rolled with no change\n{}", s.log());
    assert_eq!(s.generation("api").await, api, "{}", s.log());

    // The next change of content rolls it, once.
    s.put(&key, "v3").await;
    crate::support::wait("the change to roll", || async { Ok(s.generation("web").await > carried) }).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, carried + 1, "{}", s.log());
    s.finish().await;
}

/// Each target carries what it reads: a ConfigMap that one workload's template references
/// rolls that workload alone, and a workload that leaves the targets, with its references,
/// changes nothing for the others.
#[tokio::test]
async fn a_config_map_one_target_references_rolls_that_target_alone() {
    let Some(s) = Scene::new("per-target").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.apply(config_map("extra", json!({}), json!({"x": "1"}))).await.unwrap();
    let web = web_reading_extra();
    s.apply(web).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 1).await;
    s.workload(DEPLOY, "api", json!({"tier": "config"})).await;
    let targets = json!([{"kind": "Deployment", "selector": {"matchLabels": {"tier": "config"}}}]);
    let mut spec = spec(json!([{"key": &key}]), targets, "0s");
    spec["includeTargetReferences"] = json!(true);
    s.binding("cfg", spec).await;
    let baselined = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    let row = |status: &consulbind_api::ConsulBindingStatus, name: &str| {
        status.targets.iter().find(|t| t.name == name).map(|t| t.checksum.clone()).unwrap()
    };
    assert_ne!(row(&baselined, "web"), row(&baselined, "api"), "the two targets read different content");
    let (web, api) = (s.generation("web").await, s.generation("api").await);

    // The ConfigMap only web reads.
    s.apply(config_map("extra", json!({}), json!({"x": "2"}))).await.unwrap();
    crate::support::wait("web to roll", || async { Ok(s.generation("web").await > web) }).await.unwrap();
    let status = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await.status.unwrap();
    assert_eq!(status.target_summary.as_deref(), Some("2/2"));
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, web + 1, "{}", s.log());
    assert_eq!(s.generation("api").await, api, "a ConfigMap api does not read rolled it\n{}", s.log());

    // What both read.
    s.put(&key, "v2").await;
    crate::support::wait("both to roll", || async {
        Ok(s.generation("web").await > web + 1 && s.generation("api").await > api)
    })
    .await
    .unwrap();
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    let (web, api) = (web + 2, api + 1);

    // web leaves the targets with its reference, and comes back: nobody rolls.
    s.kubectl(&["label", "deployment", "web", "tier-"]);
    crate::support::wait("the binding to lose web", || async {
        let status = s.get_binding("cfg").await.status.unwrap_or_default();
        Ok(status.targets.len() == 1 && status.objects.is_empty())
    })
    .await
    .unwrap();
    relabel_web_back(&s).await;
    assert_eq!(s.generation("web").await, web, "{}", s.log());
    assert_eq!(s.generation("api").await, api, "{}", s.log());
    s.finish().await;
}

/// A workload deleted and made again under its name while the content changed started with
/// that content: the status's row of the workload before it is not its own, and nothing rolls.
#[tokio::test]
async fn a_workload_deleted_and_made_again_while_the_content_changed_rolls_nothing() {
    let Some(s) = Scene::new("remade-changed").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("cfg", spec(json!([{"key": &key}]), deploy("web"), "0s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;

    s.kubectl(&["delete", "deployment", "web", "--wait=true"]);
    s.wait_condition("cfg", conditions::READY, "False", reason::TARGET_MISSING).await;
    s.put(&key, "v3").await;
    crate::support::wait("the binding to read v3", || async {
        let status = s.get_binding("cfg").await.status.unwrap_or_default();
        Ok(status.applied_checksum.as_deref() == Some(s.checksum_of(&key, b"v3").await.as_str()))
    })
    .await
    .unwrap();
    s.apply(workload(DEPLOY, "web", json!({}))).await.unwrap();
    let status = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await.status.unwrap();
    assert!(status.targets[0].uid.is_some(), "{status:?}");
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, 1, "the new workload rolled for content it started with\n{}", s.log());

    s.put(&key, "v4").await;
    crate::support::wait("the change to roll", || async { Ok(s.generation("web").await > 1) }).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "{}", s.log());
    s.finish().await;
}

/// A ConfigMap with more data keys than `--max-object-keys` is refused with a reason naming it,
/// rolls nothing, is not read again until it changes, and takes nothing from the binding beside
/// it; back within the limit it is read, and its next change rolls.
#[tokio::test]
async fn a_config_map_over_the_key_limit_is_refused_and_rolls_nothing() {
    let Some(s) = Scene::with_args("object-keys", &["--max-object-keys=100"]).await else { return };
    let many: serde_json::Map<String, Value> = (0..150).map(|i| (format!("k{i:03}"), json!("1"))).collect();
    s.apply(config_map("many", json!({}), Value::Object(many.clone()))).await.unwrap();
    s.apply(config_map("few", json!({}), json!({"a": "1"}))).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    s.workload(DEPLOY, "api", json!({})).await;
    let binding = |name: &str, target: &str| json!({"configMaps": [{"name": name}], "targets": deploy(target), "rollout": {"quietPeriod": "0s"}});
    s.binding("many", binding("many", "web")).await;
    s.binding("few", binding("few", "api")).await;
    let message = s.wait_message("many", conditions::READY, "False", reason::BINDING_TOO_LARGE).await;
    assert!(message.contains(r#"ConfigMap "many""#) && message.contains("--max-object-keys"), "{message}");
    s.wait_condition("few", conditions::READY, "True", reason::BASELINED).await;
    s.wait_event("many", reason::BINDING_TOO_LARGE).await;
    // Looked at again every 15 s, and read again only once it changes.
    let reads = || {
        s.log().matches(&format!("reading a bound object's data kind=ConfigMap namespace={} name=many", s.ns)).count()
    };
    let refused = reads();
    assert!(refused >= 1, "the refused read is logged");
    tokio::time::sleep(std::time::Duration::from_secs(17)).await;
    assert_eq!(reads(), refused, "the same version read again");

    let mut changed = many.clone();
    changed.insert("k000".into(), json!("2"));
    s.apply(config_map("many", json!({}), Value::Object(changed))).await.unwrap();
    assert_eq!(settled_revisions(&s).await, 1, "a refused ConfigMap rolled its target");
    s.apply(config_map("few", json!({}), json!({"a": "2"}))).await.unwrap();
    s.wait_revisions(DEPLOY, "api", 2).await;

    // Within the limit: read as its first content, then its changes roll.
    let within: serde_json::Map<String, Value> = (0..50).map(|i| (format!("k{i:03}"), json!("1"))).collect();
    s.apply(config_map("many", json!({}), Value::Object(within.clone()))).await.unwrap();
    s.wait_condition("many", conditions::READY, "True", reason::BASELINED).await;
    let mut within = within;
    within.insert("k000".into(), json!("3"));
    s.apply(config_map("many", json!({}), Value::Object(within))).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.finish().await;
}

/// What the controller keeps of a ConfigMap (the digests of its data) goes once no binding reads
/// it: after the spec stops naming it, and after the binding is deleted.
#[tokio::test]
async fn the_digests_of_a_config_map_no_binding_reads_any_more_are_dropped() {
    let Some(s) = Scene::new("digests-dropped").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.apply(config_map("app", json!({}), json!({"a": "1", "b": "2", "c": "3"}))).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    let digests = || async { s.controller().metric("consulbind_object_digests").await };
    let kept = |want: f64| {
        let digests = &digests;
        move || async move { Ok(digests().await == Some(want)) }
    };
    let with_config_map = json!({"keys": [{"key": &key}], "configMaps": [{"name": "app"}], "targets": deploy("web"),
        "rollout": {"quietPeriod": "0s"}});
    s.binding("cfg", with_config_map.clone()).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    crate::support::wait("the ConfigMap's digests to be kept", kept(1.0)).await.unwrap();

    s.binding("cfg", spec(json!([{"key": &key}]), deploy("web"), "0s")).await;
    crate::support::wait("the digests to go with the spec's ConfigMap", kept(0.0)).await.unwrap();
    s.binding("cfg", with_config_map).await;
    crate::support::wait("the digests to be read again", kept(1.0)).await.unwrap();
    s.bindings().delete("cfg", &Default::default()).await.unwrap();
    crate::support::wait("the digests to go with the binding", kept(0.0)).await.unwrap();
    s.finish().await;
}

/// A bound ConfigMap that cannot be read for a moment shows nowhere (`--object-failure-grace`),
/// and its change rolls out once it can be read again; one unreadable for longer than the grace
/// shows `ObjectUnreadable` with an event, and recovers. The controller runs as a twin of its
/// account whose rule on ConfigMaps is taken away and given back.
#[tokio::test]
async fn a_config_map_unreadable_for_less_than_the_grace_shows_nowhere_and_for_longer_shows() {
    let Some(mut s) = Scene::without_controller("objgrace").await else { return };
    let twin = crate::rbac::Twin::new(&s, "consulbind-grace-probe").await;
    let without =
        twin.cluster_rules_with(|rule| rule.resources.iter_mut().for_each(|r| r.retain(|r| r != "configmaps")));
    assert_ne!(without, twin.cluster_rules, "no rule grants ConfigMaps");
    twin.start_controller(&mut s, &["--object-failure-grace=8s"]).await;
    s.apply(config_map("app", json!({}), json!({"a.conf": "1"}))).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding(
        "cfg",
        json!({"configMaps": [{"name": "app"}], "targets": deploy("web"), "rollout": {"quietPeriod": "0s"}}),
    )
    .await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;

    // Unreadable for about 3 s, while it changes.
    twin.set_rules(&without, &twin.own_rules).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.apply(config_map("app", json!({}), json!({"a.conf": "2"}))).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..15 {
        let binding = s.get_binding("cfg").await;
        let ready = support::ready(&binding);
        seen.extend(ready.filter(|c| c.status != "True").map(|c| c.reason));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    twin.set_rules(&twin.cluster_rules, &twin.own_rules).await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    assert!(s.log().contains("a bound object could not be read; retrying"), "the read never failed:\n{}", s.log());
    assert_eq!(seen, Vec::<String>::new(), "a failure shorter than the grace showed");
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    let events = s.events_for("cfg").await;
    assert!(!events.iter().any(|(r, _)| r == reason::OBJECT_UNREADABLE), "{events:?}");

    // Unreadable for longer than the grace.
    twin.set_rules(&without, &twin.own_rules).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let changed = std::time::Instant::now();
    s.apply(config_map("app", json!({}), json!({"a.conf": "3"}))).await.unwrap();
    let message = s.wait_message("cfg", conditions::READY, "False", reason::OBJECT_UNREADABLE).await;
    assert!(changed.elapsed() >= Duration::from_secs(7), "shown after {:?}, within the grace", changed.elapsed());
    assert!(message.contains("ConfigMap") && message.contains("forbidden"), "{message}");
    s.wait_event("cfg", reason::OBJECT_UNREADABLE).await;
    twin.set_rules(&twin.cluster_rules, &twin.own_rules).await;
    s.wait_revisions(DEPLOY, "web", 3).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 3, "one rollout per change");
    s.finish().await;
}
