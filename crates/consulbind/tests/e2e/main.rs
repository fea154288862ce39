//! End-to-end scenarios against a real kube-apiserver, kube-controller-manager and Consul,
//! with the real controller binary. Each test has its own namespace and controller.

mod admission;
mod captures;
mod cronjobs;
mod faults;
mod gitops;
mod grants;
mod helm;
mod image;
mod migrate;
mod operations;
mod pods;
mod rbac;
mod relist;
mod rollouts;
mod scale;
mod shards;
mod sources;
mod support;
mod tenant;
mod waves;
mod windows;

use consulbind::names;
use consulbind_api::conditions::{self, reason};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use support::{SETTLE, Scene, deploy, spec};

const DEPLOY: &str = "Deployment";

/// A Deployment bound to one key, baselined without a rollout.
async fn bound_deployment(s: &Scene, key: &str, quiet: &str) {
    s.put(key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.wait_revisions(DEPLOY, "web", 1).await;
    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), quiet)).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    s.wait_revisions(DEPLOY, "web", 1).await;
}

#[tokio::test]
async fn value_change_rolls_out_once_and_updates_status() {
    let Some(s) = Scene::new("value-change").await else {
        return;
    };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    let before = s.get_binding("cfg").await.status.unwrap();
    assert!(before.last_change_time.is_none());
    assert_eq!(before.key_summary.as_deref(), Some("1/1"));

    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    let binding = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    let status = binding.status.unwrap();
    assert_ne!(status.applied_checksum, before.applied_checksum);
    assert!(status.last_change_time.is_some());
    assert_eq!(status.target_summary.as_deref(), Some("1/1"));
    let target = &status.targets[0];
    assert_eq!(Some(&target.checksum), status.applied_checksum.as_ref());
    assert!(target.last_rolled_time.is_some());
    let annotations = s.template_annotations(DEPLOY, "web").await;
    assert_eq!(annotations.get("checksum.consulbind.dev/cfg"), status.applied_checksum.as_ref());

    let table = s.kubectl(&["get", "consulbindings", "cfg"]);
    let short = status.short_checksum.unwrap();
    assert!(table.contains(&short) && table.contains("True") && table.contains("1/1"), "{table}");
    s.wait_event("cfg", reason::ROLLED_OUT).await;
    assert!(s.wait_event("web", reason::ROLLED_OUT).await.contains("cfg"));
    s.finish().await;
}

#[tokio::test]
async fn rewriting_the_same_bytes_does_not_roll() {
    let Some(s) = Scene::new("same-bytes").await else {
        return;
    };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    s.put(&key, "v1").await;
    // Deleting and recreating moves every index but not the content.
    s.delete_key(&key).await;
    s.put(&key, "v1").await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 1, "{}", s.log());
    // The controller is live: a real change still rolls.
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.finish().await;
}

#[tokio::test]
async fn changes_inside_the_quiet_period_roll_once() {
    let Some(s) = Scene::new("debounce").await else {
        return;
    };
    let keys: Vec<String> = ["a", "b", "c"].iter().map(|k| s.key(k)).collect();
    for key in &keys {
        s.put(key, "v1").await;
    }
    s.workload(DEPLOY, "web", json!({})).await;
    let key_list: Vec<_> = keys.iter().map(|k| json!({"key": k})).collect();
    s.binding("cfg", spec(json!(key_list), deploy("web"), "3s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    for key in &keys {
        s.put(key, "v2").await;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    s.wait_condition("cfg", conditions::READY, "False", reason::PENDING).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 1, "rolled before the quiet period ended");
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.finish().await;
}

#[tokio::test]
async fn restart_without_change_does_not_roll_and_change_while_down_rolls_once() {
    let Some(mut s) = Scene::new("restart").await else {
        return;
    };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;

    s.stop_controller().await;
    s.start_controller(&[]).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 1, "{}", s.log());

    s.stop_controller().await;
    s.put(&key, "changed while down").await;
    s.start_controller(&[]).await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

#[tokio::test]
async fn a_crash_between_stamp_and_status_rolls_only_once() {
    let Some(mut s) = Scene::new("crash").await else { return };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    s.stop_controller().await;
    s.put(&key, "v2").await;
    // What the controller stamps for v2, as if it had crashed right after the patch.
    let stamped = s.checksum_of(&key, b"v2").await;
    stamp_as_the_controller(&s, "cfg", &stamped).await;
    s.wait_revisions(DEPLOY, "web", 2).await;

    s.start_controller(&[]).await;
    let binding = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert_eq!(binding.status.unwrap().applied_checksum, Some(stamped));
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.finish().await;
}

#[tokio::test]
async fn a_crash_after_stamping_with_the_content_reverted_meanwhile_ends_on_the_current_content() {
    let Some(mut s) = Scene::new("crash-revert").await else { return };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    s.stop_controller().await;
    // Stamped v2 and crashed before the status; then the content went back to v1.
    s.put(&key, "v2").await;
    let v2 = s.checksum_of(&key, b"v2").await;
    stamp_as_the_controller(&s, "cfg", &v2).await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.put(&key, "v1").await;

    s.start_controller(&[]).await;
    s.wait_revisions(DEPLOY, "web", 3).await;
    let v1 = s.checksum_of(&key, b"v1").await;
    assert_eq!(s.template_annotations(DEPLOY, "web").await.get(&names::annotation_key("cfg")), Some(&v1));
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

#[tokio::test]
async fn a_rollout_undo_then_a_change_back_to_the_undone_content_rolls_exactly_once() {
    let Some(s) = Scene::new("undo").await else { return };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    s.put(&key, "b").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.put(&key, "c").await;
    s.wait_revisions(DEPLOY, "web", 3).await;
    let generation = || async {
        let deployment = Api::<Deployment>::namespaced(s.client.clone(), &s.ns).get("web").await.unwrap();
        deployment.metadata.generation.unwrap()
    };
    // The template goes back to b's checksum; its new pods read c.
    s.kubectl(&["rollout", "undo", "deployment/web"]);
    let b = s.checksum_of(&key, b"b").await;
    let annotation = names::annotation_key("cfg");
    support::wait("the undo", || async {
        Ok(s.template_annotations(DEPLOY, "web").await.get(&annotation) == Some(&b))
    })
    .await
    .unwrap();
    let after_undo = generation().await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(generation().await, after_undo, "the undo alone made the controller roll\n{}", s.log());

    // Back to b in Consul: the pods run c, so exactly one rollout.
    s.put(&key, "b").await;
    support::wait("a rollout", || async { Ok(generation().await > after_undo) }).await.unwrap();
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(generation().await, after_undo + 1, "more than one rollout\n{}", s.log());
    let carried = s.template_annotations(DEPLOY, "web").await[&annotation].clone();
    assert_eq!(carried, format!("{b}~1"));
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

/// Sets the binding's annotation as the controller's own field manager would.
async fn stamp_as_the_controller(s: &Scene, binding: &str, value: &str) {
    let patch = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"template": {"metadata": {"annotations": {names::annotation_key(binding): value}}}}});
    let pp = PatchParams::apply(&names::field_manager(binding)).force();
    Api::<Deployment>::namespaced(s.client.clone(), &s.ns).patch("web", &pp, &Patch::Apply(&patch)).await.unwrap();
}

#[tokio::test]
async fn adding_or_removing_a_key_under_a_prefix_rolls_once() {
    let Some(s) = Scene::new("prefix").await else {
        return;
    };
    let prefix = s.key("features/");
    s.put(&format!("{prefix}a"), "on").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("cfg", spec(json!([{"key": prefix, "recurse": true}]), deploy("web"), "0s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;

    s.put(&format!("{prefix}b"), "on").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    let status = s.get_binding("cfg").await.status.unwrap();
    assert_eq!(status.keys[0].entries, Some(2));

    s.delete_key(&format!("{prefix}a")).await;
    s.wait_revisions(DEPLOY, "web", 3).await;
    s.finish().await;
}

#[tokio::test]
async fn statefulset_daemonset_and_selected_targets_roll() {
    let Some(s) = Scene::new("kinds").await else {
        return;
    };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload("StatefulSet", "db", json!({})).await;
    s.workload("DaemonSet", "agent", json!({})).await;
    s.workload(DEPLOY, "api", json!({"tier": "backend"})).await;
    s.workload(DEPLOY, "worker", json!({"tier": "backend"})).await;
    s.workload(DEPLOY, "frontend", json!({"tier": "frontend"})).await;
    let targets = json!([
        {"kind": "StatefulSet", "name": "db"},
        {"kind": "DaemonSet", "name": "agent"},
        {"kind": "Deployment", "selector": {"matchLabels": {"tier": "backend"}}},
    ]);
    s.binding("cfg", spec(json!([{"key": key}]), targets, "0s")).await;
    let binding = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let mut found = support::status_targets(&binding);
    found.sort();
    assert_eq!(found, ["DaemonSet/agent", "Deployment/api", "Deployment/worker", "StatefulSet/db"]);
    // A template change before the first revision exists would be folded into it.
    for (kind, name) in
        [("StatefulSet", "db"), ("DaemonSet", "agent"), (DEPLOY, "api"), (DEPLOY, "worker"), (DEPLOY, "frontend")]
    {
        support::wait("a first revision", || async { Ok(s.revisions(kind, name).await == 1) }).await.unwrap();
    }

    s.put(&key, "v2").await;
    s.wait_revisions("StatefulSet", "db", 2).await;
    s.wait_revisions("DaemonSet", "agent", 2).await;
    s.wait_revisions(DEPLOY, "api", 2).await;
    s.wait_revisions(DEPLOY, "worker", 2).await;
    assert_eq!(s.revisions(DEPLOY, "frontend").await, 1, "an unselected Deployment rolled");
    s.finish().await;
}

#[tokio::test]
async fn deleted_required_key_holds_until_it_returns_with_new_content() {
    let Some(s) = Scene::new("key-missing").await else {
        return;
    };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;

    s.delete_key(&key).await;
    let binding = s.wait_condition("cfg", conditions::READY, "False", reason::KEY_MISSING).await;
    assert!(binding.status.unwrap().conditions.iter().any(|c| c.message.contains(&key)));
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 1);
    s.wait_event("cfg", reason::KEY_MISSING).await;

    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

#[tokio::test]
async fn suspended_binding_rolls_once_on_resume() {
    let Some(s) = Scene::new("suspend").await else {
        return;
    };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;

    s.binding(
        "cfg",
        json!({"keys": [{"key": key}], "targets": deploy("web"), "rollout": {"quietPeriod": "0s"}, "suspend": true}),
    )
    .await;
    // The change must come after the controller has seen the suspension, not race it.
    s.wait_observed("cfg").await;
    s.put(&key, "v2").await;
    s.wait_condition("cfg", conditions::READY, "False", reason::SUSPENDED).await;
    s.put(&key, "v3").await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 1, "rolled while suspended");

    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.finish().await;
}

#[tokio::test]
async fn two_bindings_on_one_deployment_keep_their_own_annotations() {
    let Some(s) = Scene::new("two-bindings").await else {
        return;
    };
    let (a, b) = (s.key("a"), s.key("b"));
    s.put(&a, "1").await;
    s.put(&b, "1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("first", spec(json!([{"key": a}]), deploy("web"), "0s")).await;
    s.binding("second", spec(json!([{"key": b}]), deploy("web"), "0s")).await;
    s.wait_condition("first", conditions::READY, "True", reason::BASELINED).await;
    s.wait_condition("second", conditions::READY, "True", reason::BASELINED).await;

    s.put(&a, "2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.put(&b, "2").await;
    s.wait_revisions(DEPLOY, "web", 3).await;
    let annotations = s.template_annotations(DEPLOY, "web").await;
    let first = s.get_binding("first").await.status.unwrap().applied_checksum;
    let second = s.get_binding("second").await.status.unwrap().applied_checksum;
    assert_eq!(annotations.get("checksum.consulbind.dev/first"), first.as_ref());
    assert_eq!(annotations.get("checksum.consulbind.dev/second"), second.as_ref());

    s.put(&a, "3").await;
    s.wait_revisions(DEPLOY, "web", 4).await;
    assert!(s.template_annotations(DEPLOY, "web").await.contains_key("checksum.consulbind.dev/second"));
    s.finish().await;
}

/// Every value of the `Ready` condition of the namespace's bindings, as a watch sees them.
fn record_ready(s: &Scene) -> std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let events = watcher(s.bindings(), watcher::Config::default()).applied_objects();
    let record = seen.clone();
    tokio::spawn(events.for_each(move |binding| {
        if let Ok(binding) = binding
            && let Some(c) = support::ready(&binding)
        {
            let name = binding.metadata.name.clone().unwrap_or_default();
            record.lock().unwrap().push((name, c.status, c.reason));
        }
        futures::future::ready(())
    }));
    seen
}

async fn deployment_generation(s: &Scene, name: &str) -> i64 {
    Api::<Deployment>::namespaced(s.client.clone(), &s.ns).get(name).await.unwrap().metadata.generation.unwrap()
}

#[tokio::test]
async fn two_bindings_due_together_on_one_deployment_give_one_new_generation() {
    let Some(mut s) = Scene::new("joint-stamp").await else { return };
    let (shared, own) = (s.key("shared"), s.key("own"));
    s.put(&shared, "1").await;
    s.put(&own, "1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("first", spec(json!([{"key": shared}, {"key": own}]), deploy("web"), "0s")).await;
    s.binding("second", spec(json!([{"key": shared}]), deploy("web"), "0s")).await;
    s.wait_condition("first", conditions::READY, "True", reason::BASELINED).await;
    s.wait_condition("second", conditions::READY, "True", reason::BASELINED).await;
    let ready = record_ready(&s);
    let before = deployment_generation(&s, "web").await;

    s.put(&shared, "2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    assert_eq!(deployment_generation(&s, "web").await, before + 1, "one change, one template change\n{}", s.log());
    for name in ["first", "second"] {
        let binding = s.wait_condition(name, conditions::READY, "True", reason::UP_TO_DATE).await;
        let applied = binding.status.unwrap().applied_checksum;
        let annotations = s.template_annotations(DEPLOY, "web").await;
        assert_eq!(annotations.get(&format!("checksum.consulbind.dev/{name}")), applied.as_ref(), "{name}");
        let rolled = s.events_for(name).await.into_iter().filter(|(r, _)| r == reason::ROLLED_OUT).count();
        assert_eq!(rolled, 1, "RolledOut events of {name}");
    }
    let left: Vec<_> = ready.lock().unwrap().iter().filter(|(_, status, _)| status != "True").cloned().collect();
    assert!(left.is_empty(), "a binding left Ready: {left:?}");

    // Each binding still knows its annotation as its own: a change of one rolls once, leaves
    // the other's annotation, and a restart rolls nothing.
    s.put(&own, "2").await;
    s.wait_revisions(DEPLOY, "web", 3).await;
    s.wait_condition("first", conditions::READY, "True", reason::UP_TO_DATE).await;
    let second = s.get_binding("second").await.status.unwrap().applied_checksum;
    let annotations = s.template_annotations(DEPLOY, "web").await;
    assert_eq!(annotations.get("checksum.consulbind.dev/second"), second.as_ref());
    s.stop_controller().await;
    s.start_controller(&[]).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 3, "rolled after a restart\n{}", s.log());
    s.wait_condition("second", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

/// A target that leaves during a quiet period does not restart it for the others: the binding's
/// whole checksum changes, what the others are to receive does not (simulator, two bindings on
/// a workload, seed 94: the restarted quiet period rolled a workload a second time).
#[tokio::test]
async fn a_target_leaving_during_the_quiet_period_does_not_delay_the_others() {
    let Some(s) = Scene::new("quiet-leave").await else { return };
    let key = s.key("config");
    s.put(&key, "1").await;
    s.apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra"}, "data": {"x": "1"}}))
        .await
        .unwrap();
    s.workload(DEPLOY, "web", json!({"tier": "quiet"})).await;
    let mut api = support::workload(DEPLOY, "api", json!({"tier": "quiet"}));
    api["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "extra"}}]);
    s.apply(api).await.unwrap();
    s.wait_revisions(DEPLOY, "api", 1).await;
    let targets = json!([{"kind": "Deployment", "selector": {"matchLabels": {"tier": "quiet"}}}]);
    let mut binding = spec(json!([{"key": key}]), targets, "12s");
    binding["includeTargetReferences"] = json!(true);
    s.binding("cfg", binding).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;

    let (before, api_before) = (deployment_generation(&s, "web").await, deployment_generation(&s, "api").await);
    let changed = tokio::time::Instant::now();
    s.put(&key, "2").await;
    s.wait_condition("cfg", conditions::READY, "False", reason::PENDING).await;
    tokio::time::sleep_until(changed + std::time::Duration::from_secs(6)).await;
    s.kubectl(&["label", "deployment", "api", "tier-"]);
    let rolled = || async { Ok(deployment_generation(&s, "web").await > before) };
    support::wait("web to roll", rolled).await.unwrap();
    // Rolled at 12 s; with its quiet period restarted when api left, it would be at 18 s.
    let took = changed.elapsed();
    assert!(
        took < std::time::Duration::from_secs(16),
        "web rolled {took:?} after the change: the quiet period restarted"
    );
    assert_eq!(deployment_generation(&s, "api").await, api_before, "api left before the quiet period ended");
    s.finish().await;
}

/// A binding with the longest name the API allows, rolling more workloads than an event's
/// note can list, still leaves its events on itself and on each workload.
#[tokio::test]
async fn a_rollout_of_many_workloads_by_a_long_named_binding_is_recorded_in_events() {
    let Some(s) = Scene::new("long-events").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    let names: Vec<String> = (0..20).map(|i| format!("service-{i:02}-{}", "x".repeat(48))).collect();
    for name in &names {
        s.workload(DEPLOY, name, json!({"tier": "many"})).await;
    }
    let binding = format!("b{}", "n".repeat(252));
    let targets = json!([{"kind": "Deployment", "selector": {"matchLabels": {"tier": "many"}}}]);
    s.binding(&binding, spec(json!([{"key": key}]), targets, "0s")).await;
    s.wait_condition(&binding, conditions::READY, "True", reason::BASELINED).await;
    let baselined = || async { Ok(s.events_for(&binding).await.iter().any(|(r, _)| r == reason::BASELINED)) };
    support::wait("the binding's Baselined event", baselined).await.unwrap();

    s.put(&key, "v2").await;
    for name in &names {
        s.wait_revisions(DEPLOY, name, 2).await;
    }
    let rolled = || async { s.events_for(&binding).await.into_iter().find(|(r, _)| r == reason::ROLLED_OUT) };
    support::wait("the binding's RolledOut event", || async { Ok(rolled().await.is_some()) }).await.unwrap();
    let (_, note) = rolled().await.unwrap();
    assert!(note.len() <= 1024 && note.contains(&names[0]), "{note}");
    for name in &names {
        let on_workload = || async { Ok(s.events_for(name).await.iter().any(|(r, _)| r == reason::ROLLED_OUT)) };
        support::wait(&format!("a RolledOut event on {name}"), on_workload).await.unwrap();
    }
    assert!(!s.log().contains("could not record event"), "{}", s.log());
    s.finish().await;
}

/// Bindings woken by one change wait out their quiet periods on timers of their own, and a
/// ConfigMap change wakes them outside Consul: either way, one change is one new generation.
#[tokio::test]
async fn two_bindings_on_one_deployment_after_a_quiet_period_or_a_config_map_change_give_one_new_generation() {
    let Some(s) = Scene::new("joint-quiet").await else { return };
    let shared = s.key("shared");
    s.put(&shared, "1").await;
    let config_map = |value: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"a.conf": value}});
    s.apply(config_map("1")).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    let both = |quiet: &str| {
        json!({"keys": [{"key": shared}], "configMaps": [{"name": "app"}], "targets": deploy("web"),
               "rollout": {"quietPeriod": quiet}})
    };
    s.binding("first", both("2s")).await;
    s.binding("second", both("2s")).await;
    s.wait_condition("first", conditions::READY, "True", reason::BASELINED).await;
    s.wait_condition("second", conditions::READY, "True", reason::BASELINED).await;

    let mut generation = deployment_generation(&s, "web").await;
    let mut revisions = 1;
    for (change, quiet) in [("Consul", "2s"), ("ConfigMap", "2s"), ("ConfigMap", "0s")] {
        if quiet != "2s" {
            s.binding("first", both(quiet)).await;
            s.binding("second", both(quiet)).await;
            tokio::time::sleep(SETTLE).await;
            assert_eq!(deployment_generation(&s, "web").await, generation, "a new quiet period rolled");
        }
        match change {
            "Consul" => s.put(&shared, &format!("{revisions}-next")).await,
            _ => s.apply(config_map(&format!("{revisions}-next"))).await.unwrap(),
        }
        revisions += 1;
        s.wait_revisions(DEPLOY, "web", revisions).await;
        for name in ["first", "second"] {
            s.wait_condition(name, conditions::READY, "True", reason::UP_TO_DATE).await;
        }
        tokio::time::sleep(SETTLE).await;
        let now = deployment_generation(&s, "web").await;
        assert_eq!(
            now,
            generation + 1,
            "a {change} change with a quiet period of {quiet}: one template change\n{}",
            s.log()
        );
        assert_eq!(s.revisions(DEPLOY, "web").await, revisions, "{change}, {quiet}");
        generation = now;
    }
    s.finish().await;
}

/// The binding whose quiet period ends first rolls `web`; the other, still waiting, had the same
/// checksum to stamp, and that write carries its stamp: one new generation, not one per binding.
#[tokio::test]
async fn two_bindings_with_different_quiet_periods_on_one_deployment_give_one_new_generation() {
    let Some(s) = Scene::new("joint-apart").await else { return };
    let shared = s.key("shared");
    s.put(&shared, "1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    let quiet =
        |quiet: &str| json!({"keys": [{"key": shared}], "targets": deploy("web"), "rollout": {"quietPeriod": quiet}});
    s.binding("fast", quiet("1s")).await;
    s.binding("slow", quiet("8s")).await;
    for name in ["fast", "slow"] {
        s.wait_condition(name, conditions::READY, "True", reason::BASELINED).await;
    }
    let mut generation = deployment_generation(&s, "web").await;
    for value in ["2", "3"] {
        s.put(&shared, value).await;
        s.wait_condition("fast", conditions::READY, "True", reason::UP_TO_DATE).await;
        // Past the slow binding's quiet period.
        tokio::time::sleep(std::time::Duration::from_secs(8) + SETTLE).await;
        let slow = s.wait_condition("slow", conditions::READY, "True", reason::UP_TO_DATE).await;
        let now = deployment_generation(&s, "web").await;
        assert_eq!(now, generation + 1, "one change of {shared} to {value}: one template change\n{}", s.log());
        generation = now;
        let annotations = s.template_annotations(DEPLOY, "web").await;
        let applied = slow.status.and_then(|status| status.applied_checksum);
        assert_eq!(
            annotations.get(&names::annotation_key("slow")),
            applied.as_ref(),
            "slow's stamp says what web runs"
        );
    }
    s.finish().await;
}

#[tokio::test]
async fn a_workload_deleted_right_after_a_stamp_and_made_again_rolls_once_at_the_next_change() {
    let Some(s) = Scene::new("remade").await else { return };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    let deployments = Api::<Deployment>::namespaced(s.client.clone(), &s.ns);
    s.put(&key, "v2").await;
    support::wait("the stamp", || async {
        Ok(deployments.get("web").await?.metadata.generation.unwrap_or_default() > 1)
    })
    .await
    .unwrap();
    deployments.delete("web", &kube::api::DeleteParams::foreground()).await.unwrap();
    support::wait("the deletion", || async { Ok(deployments.get_opt("web").await?.is_none()) }).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    tokio::time::sleep(SETTLE).await;
    let remade = deployments.get("web").await.unwrap();
    assert_eq!(remade.metadata.generation, Some(1), "the new Deployment was rolled for the old change\n{}", s.log());

    s.put(&key, "v3").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    let binding = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    let annotations = s.template_annotations(DEPLOY, "web").await;
    assert_eq!(annotations.get("checksum.consulbind.dev/cfg"), binding.status.unwrap().applied_checksum.as_ref());
    s.finish().await;
}

#[tokio::test]
async fn api_server_refuses_invalid_bindings() {
    let Some(s) = Scene::new("invalid").await else {
        return;
    };
    let ok_keys = json!([{"key": "k"}]);
    let cases = [
        ("no targets", json!({"keys": ok_keys, "targets": []}), "spec.targets"),
        (
            "unknown kind",
            json!({"keys": ok_keys, "targets": [{"kind": "ReplicaSet", "name": "x"}]}),
            "Unsupported value: \"ReplicaSet\"",
        ),
        (
            "malformed duration",
            json!({"keys": ok_keys, "targets": deploy("web"), "rollout": {"quietPeriod": "5 seconds"}}),
            "spec.rollout.quietPeriod",
        ),
        (
            "name and selector",
            json!({"keys": ok_keys, "targets": [{"kind": "Deployment", "name": "a", "selector": {}}]}),
            "oneOf",
        ),
        ("neither name nor selector", json!({"keys": ok_keys, "targets": [{"kind": "Deployment"}]}), "spec.targets"),
        ("leading slash", json!({"keys": [{"key": "/app/db"}], "targets": deploy("web")}), "spec.keys.key"),
        ("empty segment", json!({"keys": [{"key": "app//db"}], "targets": deploy("web")}), "spec.keys.key"),
        ("dot-dot segment", json!({"keys": [{"key": "app/../db"}], "targets": deploy("web")}), "spec.keys.key"),
        ("dot segment", json!({"keys": [{"key": "./db"}], "targets": deploy("web")}), "spec.keys.key"),
        ("key over 512 bytes", json!({"keys": [{"key": "k".repeat(513)}], "targets": deploy("web")}), "spec.keys.key"),
        (
            "malformed ConfigMap name",
            json!({"configMaps": [{"name": "Bad_Name"}], "targets": deploy("web")}),
            "spec.configMaps.name",
        ),
        ("empty Secret name", json!({"secrets": [{"name": ""}], "targets": deploy("web")}), "spec.secrets.name"),
        (
            "ConfigMap name too long",
            json!({"configMaps": [{"name": "a".repeat(254)}], "targets": deploy("web")}),
            "spec.configMaps.name",
        ),
        (
            "too many Secrets",
            json!({"secrets": (0..33).map(|i| json!({"name": format!("s{i}")})).collect::<Vec<_>>(), "targets": deploy("web")}),
            "spec.secrets",
        ),
    ];
    for (case, spec, expected) in cases {
        let manifest = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": "bad"}, "spec": spec});
        let error = s.apply(manifest).await.expect_err(case).to_string();
        assert!(error.contains(expected), "{case}: {error}");
    }
    // What the pattern lets through is what a folder prefix or a dotted name needs.
    let fine =
        json!({"keys": [{"key": "app/features/", "recurse": true}, {"key": ".hidden/x..y"}], "targets": deploy("web")});
    let manifest = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": "fine"}, "spec": fine});
    s.apply(manifest).await.expect("a prefix with a trailing slash and dotted names are valid");

    // The most objects, the longest name and no Consul key: accepted, and served with its reason.
    let objects = |prefix: &str| -> Vec<serde_json::Value> {
        let mut names: Vec<String> = (1..32).map(|i| format!("{prefix}{i}")).collect();
        names.push("a".repeat(253));
        names.into_iter().map(|name| json!({"name": name, "keys": vec!["k"; 64]})).collect()
    };
    let largest = json!({"configMaps": objects("c"), "secrets": objects("s"), "targets": deploy("web")});
    let manifest = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": "largest"}, "spec": largest});
    s.apply(manifest).await.expect("32 ConfigMaps and 32 Secrets of 64 keys each are valid");
    let ready = s.wait_message("largest", conditions::READY, "False", reason::OBJECT_MISSING).await;
    assert!(ready.contains(r#"ConfigMap "c1""#) && ready.contains(r#"Secret "s31""#), "{}", ready);

    // A key with a character Consul refuses, as copied text brings: refused before Consul is asked.
    let copied = json!({"keys": [{"key": "app/con\u{a0}fig"}], "targets": deploy("web")});
    let manifest = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": "copied"}, "spec": copied});
    s.apply(manifest).await.expect("the schema takes any character but /");
    let ready = s.wait_message("copied", conditions::READY, "False", reason::INVALID_SPEC).await;
    assert!(ready.contains("U+00A0"), "{}", ready);

    // A selector kube's parser takes and the API server would not: `NotIn` with no values
    // would select every Deployment of the namespace.
    let every = json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": []}]});
    let loose = json!({"keys": ok_keys, "targets": [{"kind": "Deployment", "selector": every}]});
    let manifest = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": "loose"}, "spec": loose});
    s.apply(manifest).await.expect("the schema does not check selectors");
    let ready = s.wait_message("loose", conditions::READY, "False", reason::INVALID_SPEC).await;
    assert!(ready.contains("needs at least one value"), "{}", ready);

    // What the schema cannot say: one ConfigMap listed twice, each time with other keys.
    let twice = json!({"configMaps": [{"name": "app", "keys": ["a"]}, {"name": "app", "keys": ["b"]}],
                       "targets": deploy("web")});
    let manifest = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": "twice"}, "spec": twice});
    s.apply(manifest).await.expect("the schema lets a list repeat a name");
    let ready = s.wait_message("twice", conditions::READY, "False", reason::INVALID_SPEC).await;
    assert!(ready.contains(r#"ConfigMap "app" is listed twice"#), "{}", ready);
    s.wait_event("twice", reason::INVALID_SPEC).await;
    s.finish().await;
}

/// A binding deleted and made again (a reinstall, `kubectl replace --force`) while the content
/// changed baselines over the old binding's stamp, and rolls nothing at its next wake.
#[tokio::test]
async fn a_binding_made_again_after_a_change_baselines_and_rolls_only_at_the_next_change() {
    let Some(s) = Scene::new("binding-again").await else { return };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;

    s.bindings().delete("cfg", &Default::default()).await.unwrap();
    support::wait("cfg to go", || async { Ok(s.bindings().get_opt("cfg").await?.is_none()) }).await.unwrap();
    s.put(&key, "v3").await;
    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    // A label on the Deployment (not its template) wakes the binding again, as a resync would.
    let label = json!({"metadata": {"labels": {"woken": "yes"}}});
    let deployments = Api::<Deployment>::namespaced(s.client.clone(), &s.ns);
    deployments.patch("web", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 2, "rolled after a baseline\n{}", s.log());

    s.put(&key, "v4").await;
    s.wait_revisions(DEPLOY, "web", 3).await;
    s.finish().await;
}

#[tokio::test]
async fn deleting_a_binding_stops_its_watch_and_leaves_the_workload() {
    let Some(s) = Scene::new("delete").await else { return };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    s.workload(DEPLOY, "api", json!({})).await;
    s.binding("twin", spec(json!([{"key": key}]), deploy("api"), "0s")).await;
    s.wait_condition("twin", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_revisions(DEPLOY, "api", 2).await;

    // Both bindings read the key through one shared watch.
    let watches: serde_json::Value = serde_json::from_str(&s.controller().get("/debug/watches").await).unwrap();
    assert_eq!(watches.as_array().unwrap().len(), 1, "{watches}");
    assert_eq!(watches[0]["key"], key.as_str());
    let subscribers = [format!("{}/cfg", s.ns), format!("{}/twin", s.ns)];
    assert_eq!(watches[0]["subscribers"], json!(subscribers), "{watches}");
    assert_eq!(s.controller().metric("consulbind_consul_watches").await, Some(1.0));

    let annotations = s.template_annotations(DEPLOY, "web").await;
    s.bindings().delete("cfg", &Default::default()).await.unwrap();
    support::wait("cfg to unsubscribe", || async {
        Ok(!s.controller().get("/debug/watches").await.contains("/cfg\""))
    })
    .await
    .unwrap();
    assert_eq!(s.controller().metric("consulbind_consul_watches").await, Some(1.0), "the twin's watch stopped too");
    assert_eq!(s.controller().metric("consulbind_consul_entries").await, Some(1.0), "the key's one entry");
    let metrics = s.controller().get("/metrics").await;
    assert!(!metrics.contains(r#"binding="cfg""#), "the deleted binding's series stayed:\n{metrics}");
    assert!(metrics.contains(r#"binding="twin""#), "{metrics}");
    s.bindings().delete("twin", &Default::default()).await.unwrap();
    support::wait("the watch to stop", || async {
        Ok(s.controller().metric("consulbind_consul_watches").await == Some(0.0))
    })
    .await
    .unwrap();
    assert_eq!(s.controller().get("/debug/watches").await, "[]");
    // And the entry it held goes too, not left at the peak.
    support::wait("the entry to be forgotten", || async {
        Ok(s.controller().metric("consulbind_consul_entries").await == Some(0.0))
    })
    .await
    .unwrap();

    s.put(&key, "v3").await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 2);
    assert_eq!(s.revisions(DEPLOY, "api").await, 2);
    assert_eq!(s.template_annotations(DEPLOY, "web").await, annotations);
    s.finish().await;
}

#[tokio::test]
async fn missing_target_is_reported_and_picked_up_without_rollout() {
    let Some(s) = Scene::new("late-target").await else {
        return;
    };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    let binding = s.wait_condition("cfg", conditions::TARGETS_UPDATED, "False", reason::TARGET_MISSING).await;
    assert_eq!(support::ready(&binding).unwrap().reason, reason::TARGET_MISSING);

    s.workload(DEPLOY, "web", json!({})).await;
    let binding = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert_eq!(support::status_targets(&binding), ["Deployment/web"]);
    s.wait_revisions(DEPLOY, "web", 1).await;
    s.finish().await;
}

#[tokio::test]
async fn a_broken_binding_does_not_block_the_others() {
    let Some(s) = Scene::new("isolation").await else {
        return;
    };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    let broken =
        json!({"keys": [{"key": key}], "targets": deploy("web"), "consul": {"tokenSecretRef": {"name": "absent"}}});
    s.binding("broken", broken).await;
    let binding = s.wait_condition("broken", conditions::CONSUL_SYNCED, "False", reason::TOKEN_SECRET_INVALID).await;
    assert!(binding.status.unwrap().conditions.iter().any(|c| c.message.contains("\"absent\" not found")));

    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

#[tokio::test]
async fn unreachable_consul_is_a_condition_not_a_rollout() {
    let dead = format!("--consul-http-addr=http://{}", support::free_port());
    let Some(s) = Scene::with_args("unreachable", &[&dead]).await else {
        return;
    };
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("cfg", spec(json!([{"key": s.key("config")}]), deploy("web"), "0s")).await;
    let synced = s.wait_message("cfg", conditions::CONSUL_SYNCED, "False", reason::CONSUL_UNREACHABLE).await;
    assert!(synced.contains("cannot reach Consul") || synced.contains("connect"), "{}", synced);
    // Events are recorded beside the status write, not before it.
    support::wait("the ConsulUnreachable event", || async {
        Ok(s.events_for("cfg").await.iter().any(|(r, _)| r == reason::CONSUL_UNREACHABLE))
    })
    .await
    .unwrap();
    s.wait_revisions(DEPLOY, "web", 1).await;
    s.finish().await;
}

/// The CA file is read again while the controller runs: Consul's certificate, refused under
/// another CA, shows as a condition; once the right CA is in the file the binding syncs, without
/// a restart and without a rollout.
#[tokio::test]
async fn a_rotated_consul_ca_file_is_picked_up() {
    let Some((address, ca)) = support::tls_consul() else { return };
    let Some(mut s) = Scene::without_controller("ca-reload").await else {
        return;
    };
    // A certificate that did not sign Consul's: the API server's own.
    let wrong = std::path::Path::new(&ca).with_file_name("apiserver.crt");
    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-ca.crt", s.ns));
    std::fs::copy(&wrong, &file).unwrap();
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    let envs = [("CONSUL_HTTP_ADDR", address.as_str()), ("CONSUL_CACERT", file.to_str().unwrap())];
    s.start_controller_with_env(&[], &envs).await;
    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), "0s")).await;

    let synced = s.wait_message("cfg", conditions::CONSUL_SYNCED, "False", reason::CONSUL_UNREACHABLE).await;
    assert!(synced.contains("certificate"), "{}", synced);

    std::fs::copy(&ca, &file).unwrap();
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 1, "the CA rotation rolled the Deployment");
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    let _ = std::fs::remove_file(&file);
    s.finish().await;
}

#[tokio::test]
async fn acl_token_from_secret_syncs_and_a_bad_one_is_denied_without_leaking() {
    let Some((acl_addr, master)) = support::acl_consul() else {
        assert!(
            !support::servers_required(),
            "CONSULBIND_E2E_ACL_ADDR and CONSULBIND_E2E_ACL_TOKEN must be set; run `cargo xtask e2e`"
        );
        return;
    };
    let addr_flag = format!("--consul-http-addr={acl_addr}");
    let Some(s) = Scene::with_args("acl", &[&addr_flag]).await else {
        return;
    };
    let key = s.key("config");
    let acl = acl::Acl::new(&acl_addr, master.clone());
    acl.put(&key, "v1").await;
    let good = acl.read_token(&format!("{}/", s.ns)).await;
    let bad = "00000000-1111-2222-3333-444444444444".to_owned();
    // The cache keeps no more of a labelled Secret than a token needs.
    let huge = "h".repeat(512 << 10);
    let unfit = format!("{good}\u{e9}");

    s.workload(DEPLOY, "web", json!({})).await;
    let labelled = json!({"consulbind.dev/token": "true"});
    for (name, token, labels) in [
        ("good-token", &good, &labelled),
        ("bad-token", &bad, &labelled),
        ("unlabelled", &good, &json!({})),
        ("huge-token", &huge, &labelled),
        ("unfit-token", &unfit, &labelled),
    ] {
        let metadata = json!({"name": name, "labels": labels});
        s.apply(json!({"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "stringData": {"token": token}}))
            .await
            .unwrap();
    }
    let with_secret = |secret: &str| {
        json!({"keys": [{"key": key}], "targets": deploy("web"), "rollout": {"quietPeriod": "0s"},
               "consul": {"tokenSecretRef": {"name": secret}}})
    };
    s.binding("good", with_secret("good-token")).await;
    s.binding("bad", with_secret("bad-token")).await;
    s.binding("unlabelled", with_secret("unlabelled")).await;
    s.binding("huge", with_secret("huge-token")).await;
    s.binding("unfit", with_secret("unfit-token")).await;
    s.wait_condition("good", conditions::CONSUL_SYNCED, "True", reason::SYNCED).await;
    // Until the token cache has seen a Secret, the same reason says it was not found.
    s.wait_message_containing("huge", conditions::READY, reason::TOKEN_SECRET_INVALID, "longer than 1024 bytes").await;
    let message = s.wait_message_containing("unfit", conditions::READY, reason::TOKEN_SECRET_INVALID, "no token").await;
    assert!(!message.contains(&good), "the token leaked: {message}");
    // A Secret without the opt-in label never serves as a token, whatever it holds.
    let label = "consulbind.dev/token=true";
    let message = s.wait_message_containing("unlabelled", conditions::READY, reason::TOKEN_SECRET_INVALID, label).await;
    assert!(!message.contains(&good), "the token leaked: {message}");
    let denied = s.wait_condition("bad", conditions::CONSUL_SYNCED, "False", reason::ACCESS_DENIED).await;

    acl.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    let status = serde_json::to_string(&denied.status).unwrap()
        + &serde_json::to_string(&s.get_binding("good").await.status).unwrap();
    s.wait_event("bad", reason::ACCESS_DENIED).await;
    let events = format!("{:?}", s.events_for("bad").await) + &format!("{:?}", s.events_for("good").await);
    let log = s.log();
    for secret in [&good, &bad, &master.expose().to_owned()] {
        assert!(!status.contains(secret.as_str()), "token in status");
        assert!(!events.contains(secret.as_str()), "token in events");
        assert!(!log.contains(secret.as_str()), "token in the controller log");
    }
    s.finish().await;
}

/// A token Secret for `token`, Deployment web, and binding cfg reading `open` and, optional,
/// `second` with it.
async fn bind_with_token(s: &Scene, token: &str, open: &str, second: &str) {
    let metadata = json!({"name": "token", "labels": {"consulbind.dev/token": "true"}});
    s.apply(json!({"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "stringData": {"token": token}}))
        .await
        .unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    let keys = json!([{"key": open}, {"key": second, "optional": true}]);
    let spec = json!({"keys": keys, "targets": deploy("web"), "rollout": {"quietPeriod": "0s"},
                      "consul": {"tokenSecretRef": {"name": "token"}}});
    s.binding("cfg", spec).await;
}

/// Both of the binding's keys are read by one recursive read of `prefix`.
async fn assert_one_read(s: &Scene, prefix: &str) {
    let watches: serde_json::Value = serde_json::from_str(&s.controller().get("/debug/watches").await).unwrap();
    let read_by: Vec<&str> = watches.as_array().unwrap().iter().map(|w| w["read_by"].as_str().unwrap()).collect();
    assert_eq!(read_by, [prefix, prefix], "the keys do not share a read: {watches}");
}

/// Consul filters a recursive read by ACL without a word: a key the token may no longer read
/// would look deleted in a shared read, and roll the targets.
#[tokio::test]
async fn a_key_the_token_may_no_longer_read_in_a_shared_read_is_denied_not_deleted() {
    let (acl_addr, master) =
        support::acl_consul().expect("CONSULBIND_E2E_ACL_ADDR and CONSULBIND_E2E_ACL_TOKEN must be set");
    // One blocking slot: the binding's keys share one recursive read.
    let args = [format!("--consul-http-addr={acl_addr}"), "--consul-max-connections=4".into()];
    let Some(s) = Scene::with_args("acl-shared", &[&args[0], &args[1]]).await else { return };
    let (open, secret, other) = (s.key("open"), s.key("secret"), s.key("other"));
    let acl = acl::Acl::new(&acl_addr, master.clone());
    acl.put(&open, "v1").await;
    acl.put(&secret, "v1").await;
    let prefix = format!("{}/", s.ns);
    let token = acl.read_token(&prefix).await;
    bind_with_token(&s, &token, &open, &secret).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    assert_one_read(&s, &prefix).await;

    // The token loses the key; a write elsewhere under the prefix wakes the shared read.
    acl.deny(&prefix, &secret).await;
    acl.put(&other, "x").await;
    let synced = s.wait_message("cfg", conditions::CONSUL_SYNCED, "False", reason::ACCESS_DENIED).await;
    assert!(synced.contains(&secret), "{}", synced);
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.revisions(DEPLOY, "web").await, 1, "a key the token may not read was taken for deleted");
    assert!(!s.log().contains(&token), "token in the controller log");
    s.finish().await;
}

/// A key the token may not read, and which does not exist, is read alone from its shared read
/// now and then: once its policy is granted the binding is served, though nothing under the
/// key changed.
#[tokio::test]
async fn a_missing_key_refused_in_a_shared_read_is_served_once_its_policy_is_granted() {
    let (acl_addr, master) =
        support::acl_consul().expect("CONSULBIND_E2E_ACL_ADDR and CONSULBIND_E2E_ACL_TOKEN must be set");
    let args = [format!("--consul-http-addr={acl_addr}"), "--consul-max-connections=4".into()];
    let Some(s) = Scene::with_args("acl-granted", &[&args[0], &args[1]]).await else { return };
    let (open, absent, other) = (s.key("open"), s.key("absent"), s.key("other"));
    let acl = acl::Acl::new(&acl_addr, master.clone());
    acl.put(&open, "v1").await;
    let prefix = format!("{}/", s.ns);
    let token = acl.read_token(&prefix).await;
    acl.deny(&prefix, &absent).await;
    bind_with_token(&s, &token, &open, &absent).await;
    let synced = s.wait_message("cfg", conditions::CONSUL_SYNCED, "False", reason::ACCESS_DENIED).await;
    assert!(synced.contains(&absent), "{}", synced);
    assert_one_read(&s, &prefix).await;

    acl.grant(&prefix).await;
    let granted = tokio::time::Instant::now();
    // Writes elsewhere under the prefix keep the shared read answering.
    let writes = async {
        for i in 0..20 {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            acl.put(&other, &i.to_string()).await;
        }
    };
    let served = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED);
    tokio::select! {
        _ = writes => panic!("the grant did not show within 100 s\n{}", s.log()),
        _ = served => {}
    }
    s.wait_condition("cfg", conditions::CONSUL_SYNCED, "True", reason::SYNCED).await;
    assert!(granted.elapsed() < std::time::Duration::from_secs(60), "shown {:?} after the grant", granted.elapsed());
    assert_eq!(s.revisions(DEPLOY, "web").await, 1);
    s.finish().await;
}

/// A key Consul refuses (U+0378 is unassigned, which the controller's own check leaves to
/// Consul) fails its own binding only; the binding that shares its read goes on.
#[tokio::test]
async fn a_key_consul_refuses_fails_alone_and_the_read_it_shares_goes_on() {
    // One blocking slot: the namespace's keys share one recursive read.
    let Some(s) = Scene::with_args("refused-key", &["--consul-max-connections=4"]).await else { return };
    let key = s.key("config");
    bound_deployment(&s, &key, "0s").await;
    s.workload(DEPLOY, "other", json!({})).await;
    let odd = s.key("odd\u{378}");
    s.binding("odd", spec(json!([{"key": odd, "optional": true}]), deploy("other"), "0s")).await;
    let synced = s.wait_message("odd", conditions::CONSUL_SYNCED, "False", reason::CONSUL_ERROR).await;
    assert!(synced.contains("HTTP 400"), "{}", synced);
    let watches: serde_json::Value = serde_json::from_str(&s.controller().get("/debug/watches").await).unwrap();
    let read_by: Vec<&str> = watches.as_array().unwrap().iter().map(|w| w["read_by"].as_str().unwrap()).collect();
    assert!(read_by.len() == 2 && read_by[0] == read_by[1], "the keys do not share a read: {watches}");

    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert_eq!(s.revisions(DEPLOY, "other").await, 1);
    s.finish().await;
}

#[tokio::test]
async fn a_rotated_default_token_file_is_picked_up_without_a_restart() {
    let (acl_addr, master) =
        support::acl_consul().expect("CONSULBIND_E2E_ACL_ADDR and CONSULBIND_E2E_ACL_TOKEN must be set");
    let Some(mut s) = Scene::without_controller("rotate").await else {
        return;
    };
    let key = s.key("config");
    let acl = acl::Acl::new(&acl_addr, master.clone());
    acl.put(&key, "v1").await;
    let good = acl.read_token(&format!("{}/", s.ns)).await;
    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}.token", s.ns));
    std::fs::write(&file, "00000000-1111-2222-3333-444444444444\n").unwrap();
    let (addr_flag, file_flag) =
        (format!("--consul-http-addr={acl_addr}"), format!("--consul-http-token-file={}", file.display()));
    s.start_controller(&[&addr_flag, &file_flag]).await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    s.wait_condition("cfg", conditions::CONSUL_SYNCED, "False", reason::ACCESS_DENIED).await;

    // As Vault Agent does: the file is replaced in place, and the controller keeps running.
    std::fs::write(&file, format!("{good}\n")).unwrap();
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    assert!(s.log().contains("reloaded the Consul token file"), "{}", s.log());
    assert!(!s.log().contains(&good), "the token reached the log");
    s.finish().await;
}

mod acl {
    use consul_kv::{Client, ClientConfig, Token};
    use serde_json::{Value, json};

    /// The ACL agent, driven with its management token.
    pub struct Acl {
        addr: String,
        master: Token,
        http: reqwest::Client,
    }

    impl Acl {
        pub fn new(addr: &str, master: Token) -> Self {
            Self { addr: addr.to_owned(), master, http: reqwest::Client::new() }
        }

        pub async fn put(&self, key: &str, value: &str) {
            let client = Client::new(ClientConfig {
                address: self.addr.clone(),
                token: Some(self.master.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
            client.put(key, value.as_bytes(), None).await.unwrap();
        }

        async fn call(&self, path: &str, body: Value) -> Value {
            let response = self
                .http
                .put(format!("{}{path}", self.addr))
                .header("X-Consul-Token", self.master.expose())
                .json(&body)
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "{path}: {}", response.text().await.unwrap());
            response.json().await.unwrap()
        }

        /// Denies `key` to the tokens `read_token` made for `prefix`.
        pub async fn deny(&self, prefix: &str, key: &str) {
            let policy = format!("e2e-{}", prefix.trim_end_matches('/'));
            let url = format!("{}/v1/acl/policy/name/{policy}", self.addr);
            let request = self.http.get(url).header("X-Consul-Token", self.master.expose());
            let current: Value = request.send().await.unwrap().json().await.unwrap();
            let rules =
                format!("key_prefix \"{prefix}\" {{ policy = \"read\" }}\nkey \"{key}\" {{ policy = \"deny\" }}");
            let path = format!("/v1/acl/policy/{}", current["ID"].as_str().unwrap());
            self.call(&path, json!({"Name": policy, "Rules": rules})).await;
        }

        /// Lets the tokens `read_token` made for `prefix` read every key under it again.
        pub async fn grant(&self, prefix: &str) {
            let policy = format!("e2e-{}", prefix.trim_end_matches('/'));
            let url = format!("{}/v1/acl/policy/name/{policy}", self.addr);
            let request = self.http.get(url).header("X-Consul-Token", self.master.expose());
            let current: Value = request.send().await.unwrap().json().await.unwrap();
            let rules = format!("key_prefix \"{prefix}\" {{ policy = \"read\" }}");
            let path = format!("/v1/acl/policy/{}", current["ID"].as_str().unwrap());
            self.call(&path, json!({"Name": policy, "Rules": rules})).await;
        }

        /// A token of a policy `name` with `rules`.
        pub async fn token_with(&self, name: &str, rules: &str) -> String {
            self.call("/v1/acl/policy", json!({"Name": name, "Rules": rules})).await;
            let token = self.call("/v1/acl/token", json!({"Policies": [{"Name": name}]})).await;
            token["SecretID"].as_str().unwrap().to_owned()
        }

        /// A token that may read keys under `prefix`.
        pub async fn read_token(&self, prefix: &str) -> String {
            self.read_tokens(prefix, 1).await.remove(0)
        }

        /// `n` distinct tokens that may read keys under `prefix`.
        pub async fn read_tokens(&self, prefix: &str, n: usize) -> Vec<String> {
            let policy = format!("e2e-{}", prefix.trim_end_matches('/'));
            let rules = format!("key_prefix \"{prefix}\" {{ policy = \"read\" }}");
            self.call("/v1/acl/policy", json!({"Name": policy, "Rules": rules})).await;
            let mut tokens = Vec::new();
            for _ in 0..n {
                let token = self.call("/v1/acl/token", json!({"Policies": [{"Name": policy}]})).await;
                tokens.push(token["SecretID"].as_str().unwrap().to_owned());
            }
            tokens
        }
    }
}

/// A binding an earlier release took and a current API server refuses at its next apply
/// (`maxDelay` shorter than `quietPeriod`), stored before the upgrade: the controller still
/// serves it, as that release did (a change rolls `maxDelay` after it is first seen), and says
/// what to change with a `SpecWarning` condition and a Warning event.
#[tokio::test]
async fn a_spec_an_earlier_release_served_is_still_served_after_the_upgrade_with_a_warning() {
    let Some(s) = Scene::new("upgrade-served").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload("Deployment", "web", json!({})).await;
    s.binding(
        "old",
        json!({"keys": [{"key": key}], "targets": support::deploy("web"),
            "rollout": {"quietPeriod": "1m", "maxDelay": "2s"}}),
    )
    .await;
    let shown = s.wait_condition("old", conditions::READY, "True", reason::BASELINED).await;
    let warning = shown.status.unwrap().conditions.into_iter().find(|c| c.type_ == conditions::SPEC_WARNING);
    let warning = warning.expect("a SpecWarning condition");
    assert_eq!((warning.status.as_str(), warning.reason.as_str()), ("True", reason::MAX_DELAY_BELOW_QUIET_PERIOD));
    assert!(warning.message.contains("set maxDelay to at least quietPeriod"), "{}", warning.message);
    let warned =
        || async { Ok(s.events_for("old").await.iter().any(|(r, _)| r == reason::MAX_DELAY_BELOW_QUIET_PERIOD)) };
    support::wait("a Warning event", warned).await.unwrap();

    let started = std::time::Instant::now();
    s.put(&key, "v2").await;
    s.wait_condition("old", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "rolled after {:?}, not at maxDelay",
        started.elapsed()
    );
    assert_eq!(s.generation("web").await, 2);
    s.finish().await;
}
