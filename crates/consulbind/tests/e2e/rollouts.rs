//! Argo Rollouts as a target kind, and the dry-run mode.

use consulbind::names;
use consulbind_api::{
    ConsulBinding,
    conditions::{self, reason},
};
use serde_json::{Value, json};

use crate::support::{self, ROLLOUT_CRD, Scene, deploy, install_rollout_crd, remove_rollout_crd, spec};

const DEPLOY: &str = "Deployment";

fn rollout(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "strategy": {"canary": {"steps": [{"setWeight": 20}, {"pause": {}}]}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]}}}})
}

fn ready_message(binding: &consulbind_api::ConsulBinding) -> String {
    support::ready(binding).map(|c| c.message).unwrap_or_default()
}

#[tokio::test]
async fn rollouts_are_stamped_once_their_crd_appears_without_a_restart() {
    let Some(s) = Scene::without_controller("rollouts").await else { return };
    let _crd = ROLLOUT_CRD.lock().await;
    remove_rollout_crd();
    let mut s = s;
    s.start_controller(&[]).await;
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("dep", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    let by_name = json!([{"kind": "Rollout", "name": "canary"}]);
    s.binding("ro", spec(json!([{"key": key}]), by_name, "0s")).await;

    // Without the CRD: a condition that says so, and the Deployments keep rolling.
    let refused = s.wait_condition("ro", conditions::READY, "False", reason::KIND_NOT_SERVED).await;
    assert!(ready_message(&refused).contains("not served by this cluster"), "{}", ready_message(&refused));
    s.wait_condition("dep", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;

    // Argo Rollouts arrives: picked up by the running controller.
    install_rollout_crd();
    s.apply(rollout("canary", json!({"tier": "web"}))).await.unwrap();
    s.apply(rollout("canary-b", json!({"tier": "web"}))).await.unwrap();
    // Found after the binding's first content: it starts with the current content, no rollout.
    let found = s.wait_condition("ro", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert_eq!(support::status_targets(&found), ["Rollout/canary"]);
    let selecting = json!([{"kind": "Rollout", "selector": {"matchLabels": {"tier": "web"}}}]);
    s.binding("sel", spec(json!([{"key": key}]), selecting, "0s")).await;
    let baseline = s.wait_condition("sel", conditions::READY, "True", reason::BASELINED).await;
    assert_eq!(support::status_targets(&baseline), ["Rollout/canary", "Rollout/canary-b"]);
    assert_eq!((s.rollout_generation("canary").await, s.rollout_generation("canary-b").await), (1, 1));

    // A change stamps each Rollout's template once: both bindings of `canary` are due together,
    // and their annotations go in one write.
    s.put(&key, "v3").await;
    s.wait_condition("ro", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_condition("sel", conditions::READY, "True", reason::UP_TO_DATE).await;
    support::wait("the Rollouts to be stamped", || async {
        Ok(s.rollout_generation("canary").await == 2 && s.rollout_generation("canary-b").await == 2)
    })
    .await
    .unwrap();
    let canary = s.rollouts().get("canary").await.unwrap();
    let annotations = &canary.data["spec"]["template"]["metadata"]["annotations"];
    let v3 = s.checksum_of(&key, b"v3").await;
    assert_eq!(annotations[names::annotation_key("ro")], json!(v3));
    assert_eq!(annotations[names::annotation_key("sel")], json!(v3));
    let managers: Vec<String> =
        canary.metadata.managed_fields.unwrap_or_default().into_iter().filter_map(|m| m.manager).collect();
    assert!(managers.iter().any(|m| m == names::JOINT_MANAGER), "{managers:?}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.rollout_generation("canary").await, 2, "a Rollout was stamped twice");

    // A Rollout that takes its template from a Deployment is not stamped; the binding says why.
    let mut by_ref = rollout("by-ref", json!({}));
    by_ref["spec"] =
        json!({"replicas": 1, "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}});
    s.apply(by_ref).await.unwrap();
    s.binding("ref", spec(json!([{"key": key}]), json!([{"kind": "Rollout", "name": "by-ref"}]), "0s")).await;
    let refused = s.wait_condition("ref", conditions::READY, "False", reason::TARGET_MISSING).await;
    assert!(ready_message(&refused).contains("bind that workload instead"), "{}", ready_message(&refused));
    assert_eq!(s.rollout_generation("by-ref").await, 1);
    s.finish().await;
}

#[tokio::test]
async fn a_dry_run_patches_nothing_says_what_it_would_roll_and_switching_back_rolls_once() {
    let Some(s) = Scene::new("dry-run").await else { return };
    let (key, mut dry, held) = hold_back_a_change(&s, "DryRun").await;
    let report = held.status.clone().unwrap().dry_run.unwrap();
    assert_eq!(report.would_roll, ["Deployment/web"]);
    assert_eq!(report.checksum, s.checksum_of(&key, b"v2").await);
    assert!(report.reason.unwrap().contains("content changed"));
    support::wait("a DryRun event naming the target", || async {
        Ok(s.events_for("cfg").await.iter().any(|(r, note)| r == reason::DRY_RUN && note.contains("Deployment/web")))
    })
    .await
    .unwrap();
    s.wait_revisions(DEPLOY, "web", 1).await;

    // Rollout mode: the held-back change rolls, exactly once.
    dry["rollout"]["mode"] = json!("Rollout");
    s.binding("cfg", dry).await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    let rolled = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert_eq!(rolled.status.unwrap().dry_run, None);
    s.finish().await;
}

#[tokio::test]
async fn the_dry_run_flag_overrides_a_binding_that_asks_for_rollouts() {
    let Some(mut s) = Scene::with_args("dry-run-flag", &["--dry-run"]).await else { return };
    let (_, _, held) = hold_back_a_change(&s, "Rollout").await;
    assert_eq!(held.status.unwrap().dry_run.unwrap().would_roll, ["Deployment/web"]);
    s.wait_revisions(DEPLOY, "web", 1).await;

    s.stop_controller().await;
    s.start_controller(&[]).await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

/// Binds a Deployment with `spec.rollout.mode` set to `mode`, lets it baseline on v1, and writes
/// v2: the change a dry run holds back. Returns the key, the binding's spec, and the binding
/// once it reports the change held back.
async fn hold_back_a_change(s: &Scene, mode: &str) -> (String, Value, ConsulBinding) {
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.wait_revisions(DEPLOY, "web", 1).await;
    let mut binding = spec(json!([{"key": key}]), deploy("web"), "0s");
    binding["rollout"]["mode"] = json!(mode);
    s.binding("cfg", binding.clone()).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    let held = s.wait_condition("cfg", conditions::READY, "True", reason::DRY_RUN).await;
    (key, binding, held)
}
