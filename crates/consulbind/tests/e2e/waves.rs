//! Staged rollouts on the real servers, on workloads whose pods never run: the bed's node
//! takes only pods that tolerate its taint (`pods.rs` has those). A Deployment of zero replicas
//! is healthy once its controller observes a new template; one of one replica never is, and
//! with `progressDeadlineSeconds` it reports `ProgressDeadlineExceeded`. A rollout is counted
//! as a bump of `metadata.generation`, the binding's stamp as its pod-template annotation.

use std::time::Duration;

use consulbind::names;
use consulbind_api::{
    ConsulBinding, RolloutPhase, TargetState,
    conditions::{self, reason},
};
use serde_json::{Value, json};

use crate::support::{self, Scene, wait};

/// A Deployment of `replicas`, labelled `track`.
fn deployment(name: &str, replicas: i32, track: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name, "track": track}},
        "spec": {"replicas": replicas, "progressDeadlineSeconds": 5, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]}}}})
}

/// The ConfigMap `extra`, which `reading_extra` makes a Deployment reference.
fn extra() -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra"}, "data": {"x": "1"}})
}

fn reading_extra(mut deployment: Value) -> Value {
    deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "extra"}}]);
    deployment
}

pub(crate) fn staged(key: &str, rollout: Value) -> Value {
    let mut rollout = rollout;
    rollout["quietPeriod"] = json!("0s");
    json!({"keys": [{"key": key}], "targets": [{"kind": "Deployment", "selector": {"matchLabels": {}}}],
        "rollout": rollout})
}

pub(crate) fn canary_first(pause: &str) -> Value {
    json!({"waves": [{"selector": {"matchLabels": {"track": "canary"}}, "pause": pause}, {}]})
}

impl Scene {
    pub(crate) async fn deployments(&self, list: &[(&str, i32, &str)]) {
        for (name, replicas, track) in list {
            self.apply(deployment(name, *replicas, track)).await.unwrap();
        }
    }

    async fn generations(&self, names: &[&str]) -> Vec<i64> {
        let mut all = Vec::new();
        for name in names {
            all.push(self.generation(name).await);
        }
        all
    }

    /// Whether the Deployment carries the binding's stamp of `checksum`.
    async fn carries(&self, binding: &str, name: &str, checksum: &str) -> bool {
        let annotations = self.template_annotations("Deployment", name).await;
        annotations.get(&names::annotation_key(binding)).is_some_and(|v| v.starts_with(checksum))
    }

    async fn wait_generation(&self, name: &str, want: i64) {
        let what = format!("Deployment {name} at generation {want}");
        if let Err(error) = wait(&what, || async { Ok(self.generation(name).await >= want) }).await {
            panic!("{error} (at {})\n{}", self.generation(name).await, self.log());
        }
    }

    async fn scale(&self, name: &str, replicas: i32) {
        self.kubectl(&["scale", "deployment", name, &format!("--replicas={replicas}")]);
    }

    /// A canary-first rollout (a pause of 20 s) by a binding that reads its targets' references,
    /// beside the ConfigMap `extra`, which the canary references if `referenced`: once a change
    /// has rolled the canary and its wave pauses, the binding then.
    async fn paused_with_references(&self, referenced: bool) -> ConsulBinding {
        let key = self.key("config");
        self.put(&key, "v1").await;
        self.apply(extra()).await.unwrap();
        let canary = deployment("canary", 0, "canary");
        self.apply(if referenced { reading_extra(canary) } else { canary }).await.unwrap();
        self.deployments(&[("web", 0, "stable")]).await;
        let mut spec = staged(&key, canary_first("20s"));
        spec["includeTargetReferences"] = json!(true);
        self.binding("app", spec).await;
        self.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
        self.put(&key, "v2").await;
        self.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await
    }

    /// Someone fixes the halted canary's capacity: the rollout goes on by itself, and each of
    /// the rest rolls once.
    async fn fix_the_canary(&self) {
        self.scale("canary", 0).await;
        self.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
        tokio::time::sleep(support::SETTLE).await;
        let generations = self.generations(&["canary", "web-a", "web-b"]).await;
        assert_eq!(generations, [3, 2, 2], "the scale, and one rollout each");
    }
}

#[tokio::test]
async fn a_canary_wave_rolls_first_and_the_rest_follow_once_it_is_healthy_and_paused() {
    let Some(s) = Scene::new("waves-canary").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 0, "canary"), ("web-a", 0, "stable"), ("web-b", 0, "stable")]).await;
    s.binding("app", staged(&key, canary_first("4s"))).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, "v2").await;
    let paused = s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await;
    let rollout = paused.status.as_ref().and_then(|s| s.rollout.clone()).expect("status.rollout");
    assert_eq!((rollout.wave, rollout.waves, rollout.phase), (1, 2, RolloutPhase::Paused));
    assert_eq!(s.generations(&["canary", "web-a", "web-b"]).await, [2, 1, 1], "only the canary rolled");
    let shown = s.kubectl(&["get", "consulbinding", "app"]);
    assert!(shown.contains("1/2 Paused"), "kubectl get shows the wave:\n{shown}");

    let done = s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    let status = done.status.unwrap();
    assert_eq!(status.rollout.map(|r| (r.wave, r.phase)), Some((2, RolloutPhase::Complete)));
    assert!(status.targets.iter().all(|t| t.state == Some(TargetState::Healthy)), "{:?}", status.targets);
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web-a", "web-b"]).await, [2, 2, 2], "each rolled once");
    s.finish().await;
}

#[tokio::test]
async fn a_failing_canary_halts_the_rest_and_once_healthy_they_roll_once_each() {
    let Some(s) = Scene::new("waves-halt").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 1, "canary"), ("web-a", 0, "stable"), ("web-b", 0, "stable")]).await;
    s.binding("app", staged(&key, canary_first("0s"))).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, "v2").await;
    let halted = s.wait_message("app", conditions::READY, "False", reason::ROLLOUT_HALTED).await;
    assert!(halted.contains("Deployment canary ProgressDeadlineExceeded"), "{halted}");
    s.wait_event("app", reason::ROLLOUT_HALTED).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web-a", "web-b"]).await, [2, 1, 1], "the rest keep what they carry");

    s.fix_the_canary().await;
    s.finish().await;
}

/// A halted canary deleted (to be made again by a GitOps tool, say) keeps the rest held: gone,
/// it gates nothing, and the rest would take the content that halted it. Made again healthy, the
/// rest roll, once each.
#[tokio::test]
async fn a_halted_canary_deleted_keeps_the_rest_held_until_it_is_back_and_healthy() {
    let Some(s) = Scene::new("waves-gone").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 1, "canary"), ("web", 0, "stable")]).await;
    s.binding("app", staged(&key, canary_first("0s"))).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_HALTED).await;

    s.kubectl(&["delete", "deployment", "canary"]);
    let held = s.wait_message_containing("app", conditions::READY, reason::ROLLOUT_HALTED, "was deleted").await;
    assert!(held.contains("Deployment canary"), "{held}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 1, "the rest keep what they carry");
    // The controller looks again every 30 s while it holds; each look leaves the status as is.
    let version = s.get_binding("app").await.metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(s.get_binding("app").await.metadata.resource_version, version, "the held status is not written again");

    s.deployments(&[("canary", 0, "canary")]).await;
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "rolled once");
    s.finish().await;
}

/// A change held by a suspend leaves the status as it is at each look (here woken by a label put
/// on a target): the targets it judges with no rollout recorded keep the time of their first
/// judgement, where each look wrote a new one.
#[tokio::test]
async fn a_change_held_by_a_suspend_leaves_the_status_as_it_is() {
    let Some(s) = Scene::new("waves-suspend-held").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 0, "canary"), ("web", 0, "stable")]).await;
    s.binding("app", staged(&key, canary_first("0s"))).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    let mut suspended = staged(&key, canary_first("0s"));
    suspended["suspend"] = json!(true);
    s.binding("app", suspended).await;
    s.wait_observed("app").await;
    s.put(&key, "v3").await;
    s.wait_condition("app", conditions::READY, "False", reason::SUSPENDED).await;
    tokio::time::sleep(support::SETTLE).await;

    let version = s.get_binding("app").await.metadata.resource_version;
    for poke in 0..3 {
        s.kubectl(&["label", "deployment", "web", &format!("poke={poke}"), "--overwrite"]);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(support::SETTLE).await;
    let binding = s.get_binding("app").await;
    assert_eq!(binding.metadata.resource_version, version, "written again: {:?}", binding.status.map(|s| s.targets));
    assert_eq!(s.generations(&["canary", "web"]).await, [2, 2], "rolled while suspended");
    s.finish().await;
}

/// A halted canary deleted and made again that never becomes available (here a Deployment
/// whose progress deadline is ten minutes away) halts the rollout again once the health timeout
/// has passed since it was made, where it held the rest as in progress for ever.
#[tokio::test]
async fn a_canary_made_again_that_stays_progressing_halts_at_the_health_timeout() {
    let Some(s) = Scene::new("waves-made-again").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 1, "canary"), ("web", 0, "stable")]).await;
    let mut rollout = canary_first("0s");
    rollout["healthTimeout"] = json!("15s");
    s.binding("app", staged(&key, rollout)).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_HALTED).await;
    s.kubectl(&["delete", "deployment", "canary"]);
    s.wait_message_containing("app", conditions::READY, reason::ROLLOUT_HALTED, "was deleted").await;

    let mut canary = deployment("canary", 1, "canary");
    canary["spec"].as_object_mut().unwrap().remove("progressDeadlineSeconds");
    s.apply(canary).await.unwrap();
    s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_IN_PROGRESS).await;
    let halted =
        s.wait_message_containing("app", conditions::READY, reason::ROLLOUT_HALTED, "not healthy within").await;
    assert!(halted.contains("15s"), "{halted}");
    assert_eq!(s.generation("web").await, 1, "the rest keep what they carry");
    s.finish().await;
}

/// A long-standing canary the rollout does not roll (the change is of a ConfigMap only the rest
/// reference) that is progressing for its own reasons holds the rest from the rollout's start,
/// and halts it once `healthTimeout` has passed since then, not at once.
#[tokio::test]
async fn a_canary_not_rolled_and_progressing_is_timed_from_the_rollouts_start() {
    let Some(s) = Scene::new("waves-not-rolled").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.apply(extra()).await.unwrap();
    let mut canary = deployment("canary", 1, "canary");
    canary["spec"].as_object_mut().unwrap().remove("progressDeadlineSeconds");
    s.apply(canary).await.unwrap();
    s.apply(reading_extra(deployment("web", 0, "stable"))).await.unwrap();
    let mut rollout = canary_first("0s");
    rollout["healthTimeout"] = json!("15s");
    let mut spec = staged(&key, rollout);
    spec["includeTargetReferences"] = json!(true);
    s.binding("app", spec).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    // The canary has been progressing for longer than the health timeout.
    tokio::time::sleep(std::time::Duration::from_secs(16)).await;

    s.apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra"}, "data": {"x": "2"}}))
        .await
        .unwrap();
    let held = s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_IN_PROGRESS).await;
    let ready = support::ready(&held).unwrap();
    assert!(ready.message.contains("canary"), "{}", ready.message);
    let halted =
        s.wait_message_containing("app", conditions::READY, reason::ROLLOUT_HALTED, "not healthy within").await;
    assert!(halted.contains("15s"), "{halted}");
    assert_eq!(s.generations(&["canary", "web"]).await, [1, 1], "nothing rolled");
    s.finish().await;
}

/// A long-standing Deployment labelled into the targets during a canary's long pause, in the
/// canary's wave and progressing for its own reasons, is timed from when the rollout first
/// judged it: it holds the rest and halts them once `healthTimeout` has passed since then, not
/// at once for a rollout that began longer ago than that.
#[tokio::test]
async fn a_workload_labelled_into_the_targets_late_in_a_rollout_is_timed_from_then() {
    let Some(s) = Scene::new("waves-found-late").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    let bound = |mut deployment: Value| {
        deployment["metadata"]["labels"]["bound"] = json!("yes");
        deployment
    };
    s.apply(bound(deployment("canary", 0, "canary"))).await.unwrap();
    s.apply(bound(deployment("web", 0, "stable"))).await.unwrap();
    let mut late = deployment("late", 1, "canary");
    late["spec"].as_object_mut().unwrap().remove("progressDeadlineSeconds");
    s.apply(late).await.unwrap();
    let mut rollout = canary_first("1h");
    rollout["healthTimeout"] = json!("15s");
    let mut spec = staged(&key, rollout);
    spec["targets"] = json!([{"kind": "Deployment", "selector": {"matchLabels": {"bound": "yes"}}}]);
    s.binding("app", spec).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await;
    tokio::time::sleep(std::time::Duration::from_secs(16)).await;

    s.kubectl(&["label", "deployment", "late", "bound=yes"]);
    let held = || async {
        let binding = s.get_binding("app").await;
        let state = binding.status.iter().flat_map(|st| &st.targets).find(|t| t.name == "late").and_then(|t| t.state);
        Ok(state == Some(TargetState::Rolling))
    };
    wait("late judged as rolling", held).await.unwrap();
    let ready = support::ready(&s.get_binding("app").await).unwrap();
    assert_eq!(ready.reason, reason::ROLLOUT_IN_PROGRESS, "{}", ready.message);
    let halted =
        s.wait_message_containing("app", conditions::READY, reason::ROLLOUT_HALTED, "not healthy within").await;
    assert!(halted.contains("late"), "{halted}");
    assert_eq!(s.generations(&["canary", "web", "late"]).await, [2, 1, 1]);
    s.finish().await;
}

/// A halted canary deleted for good: the edit of the binding that releases the rest, made while
/// the binding is refused (its namespace over `--max-bindings-per-namespace` for a while), still
/// releases it once the binding is served again.
#[tokio::test]
async fn an_edit_made_while_the_binding_is_refused_releases_a_deleted_canarys_halt() {
    edit_while_refused("waves-gone-edit", false).await;
}

/// The same with the canary deleted while the binding is refused, so that no served look saw
/// it gone.
#[tokio::test]
async fn a_canary_deleted_and_an_edit_both_while_the_binding_is_refused_release_the_rest() {
    edit_while_refused("waves-gone-refused", true).await;
}

async fn edit_while_refused(scene: &str, deleted_while_refused: bool) {
    let Some(mut s) = Scene::new(scene).await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 1, "canary"), ("web", 0, "stable")]).await;
    // Older than "app": made first, and first by name should both be made in one second.
    s.binding("aaa", json!({"keys": [{"key": key}], "targets": [{"kind": "Deployment", "name": "elsewhere"}]})).await;
    let mut spec = staged(&key, canary_first("0s"));
    s.binding("app", spec.clone()).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_HALTED).await;
    if !deleted_while_refused {
        s.kubectl(&["delete", "deployment", "canary"]);
        s.wait_message_containing("app", conditions::READY, reason::ROLLOUT_HALTED, "was deleted").await;
    }

    s.stop_controller().await;
    s.start_controller(&["--max-bindings-per-namespace=1"]).await;
    s.wait_condition("app", conditions::READY, "False", reason::TOO_MANY_BINDINGS).await;
    if deleted_while_refused {
        s.kubectl(&["delete", "deployment", "canary"]);
    }
    spec["rollout"]["healthTimeout"] = json!("20m");
    s.binding("app", spec).await;
    s.wait_observed("app").await;
    assert_eq!(s.generation("web").await, 1, "nothing rolls while the binding is refused");

    s.stop_controller().await;
    s.start_controller(&[]).await;
    s.wait_generation("web", 2).await;
    s.finish().await;
}

#[tokio::test]
async fn a_revert_during_a_halt_rolls_back_only_the_canary() {
    let Some(s) = Scene::new("waves-revert").await else { return };
    let key = s.key("config");
    s.put(&key, "good").await;
    s.deployments(&[("canary", 1, "canary"), ("web-a", 0, "stable")]).await;
    s.binding("app", staged(&key, canary_first("0s"))).await;
    let baseline = s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    let good = baseline.status.unwrap().applied_checksum.unwrap();

    s.put(&key, "bad").await;
    s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_HALTED).await;
    s.put(&key, "good").await;
    s.wait_generation("canary", 3).await;
    let wait_back = || async { Ok(s.carries("app", "canary", &good).await) };
    wait("the canary back on the good content", wait_back).await.unwrap();
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web-a"]).await, [3, 1], "web-a never received the bad content");
    s.finish().await;
}

/// With a restart of the controller while the first pair is rolling: it goes on from the status.
#[tokio::test]
async fn max_parallel_two_rolls_six_targets_in_pairs() {
    let Some(mut s) = Scene::new("waves-pairs").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    let names = ["d1", "d2", "d3", "d4", "d5", "d6"];
    let list: Vec<(&str, i32, &str)> = names.iter().map(|n| (*n, 1, "stable")).collect();
    s.deployments(&list).await;
    s.binding("app", staged(&key, json!({"waves": [{"maxParallel": 2}], "healthTimeout": "10m"}))).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, "v2").await;
    let desired = s.checksum_of(&key, b"v2").await;
    for pair in names.chunks(2) {
        for name in pair {
            s.wait_generation(name, 2).await;
        }
        tokio::time::sleep(support::SETTLE).await;
        let mut carrying = Vec::new();
        for name in names {
            if s.carries("app", name, &desired).await {
                carrying.push(name);
            }
        }
        let upto = names.iter().position(|n| n == pair.last().unwrap()).unwrap() + 1;
        assert_eq!(carrying, names[..upto], "two at a time, each pair once the one before is healthy");
        if pair[0] == "d1" {
            s.stop_controller().await;
            s.start_controller(&[]).await;
            tokio::time::sleep(support::SETTLE).await;
            assert_eq!(s.generations(&names).await, [2, 2, 1, 1, 1, 1], "the restart rolled nothing more");
        }
        // Each of the pair becomes healthy: no replicas to wait for.
        for name in pair {
            s.scale(name, 0).await;
        }
    }
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert!(s.generations(&names).await.iter().all(|g| *g == 3), "one rollout and one scale each");
    s.finish().await;
}

#[tokio::test]
async fn a_budget_of_two_per_span_gives_three_rollouts_for_five_changes_with_the_last_content() {
    let Some(s) = Scene::new("waves-budget").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("web", 0, "stable")]).await;
    s.binding("app", staged(&key, json!({"budget": {"maxRollouts": 2, "per": "20s"}}))).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    for (i, value) in ["v2", "v3", "v4", "v5", "v6"].iter().enumerate() {
        s.put(&key, value).await;
        if i < 2 {
            s.wait_generation("web", 2 + i as i64).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    }
    let waiting = s.wait_message("app", conditions::READY, "False", reason::ROLLOUT_BUDGET_EXHAUSTED).await;
    assert!(waiting.contains("the next rollout may happen at"), "{waiting}");
    assert_eq!(s.generation("web").await, 3, "two rollouts within the span");

    // A restart during the wait changes nothing: the roll times are in the status.
    let mut s = s;
    s.stop_controller().await;
    s.start_controller(&[]).await;
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    let last = s.checksum_of(&key, b"v6").await;
    assert!(s.carries("app", "web", &last).await, "the last content rolled");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 4, "three rollouts for five changes");
    s.finish().await;
}

#[tokio::test]
async fn a_restart_in_the_middle_of_a_wave_pause_goes_on_where_it_was() {
    let Some(mut s) = Scene::new("waves-restart").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 0, "canary"), ("web-a", 0, "stable")]).await;
    s.binding("app", staged(&key, canary_first("6s"))).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, "v2").await;
    s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await;
    s.stop_controller().await;
    s.start_controller(&[]).await;
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web-a"]).await, [2, 2], "each rolled once across the restart");
    s.finish().await;
}

/// A canary healthy when its pause begins and unable to run during it (scaled up where no pod
/// can start; a scale is no new template, so Kubernetes reports no deadline) holds the rest when
/// the pause ends, and halts once its `healthTimeout` is over; healthy again, its wave pauses
/// afresh and the rest roll once each. (Before the fix, the rest rolled when the pause ended, and
/// the canary's row still said Healthy.)
#[tokio::test]
async fn a_canary_that_sours_during_its_pause_holds_the_rest_until_it_is_healthy_again() {
    let Some(s) = Scene::new("waves-sour").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 0, "canary"), ("web-a", 0, "stable"), ("web-b", 0, "stable")]).await;
    let mut rollout = canary_first("8s");
    rollout["healthTimeout"] = json!("25s");
    s.binding("app", staged(&key, rollout)).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, "v2").await;
    s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await;
    s.scale("canary", 1).await;
    let held = s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_IN_PROGRESS).await;
    let canary = held.status.unwrap().targets.into_iter().find(|t| t.name == "canary").expect("the canary's row");
    assert_eq!(canary.state, Some(TargetState::Rolling), "the row says what the canary says now: {canary:?}");
    // Past the end of the pause as it was first set.
    tokio::time::sleep(std::time::Duration::from_secs(9)).await;
    assert_eq!(s.generations(&["canary", "web-a", "web-b"]).await, [3, 1, 1], "the rest hold");
    let halted = s.wait_message("app", conditions::READY, "False", reason::ROLLOUT_HALTED).await;
    assert!(halted.contains("not healthy within 25s"), "{halted}");
    assert_eq!(s.generations(&["web-a", "web-b"]).await, [1, 1]);

    s.scale("canary", 0).await;
    s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await;
    assert_eq!(s.generations(&["web-a", "web-b"]).await, [1, 1], "its wave pauses afresh");
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web-a", "web-b"]).await, [4, 2, 2], "two scales, and one rollout each");
    s.finish().await;
}

/// A change that waits for its quiet period puts the rolled canary behind its content for a
/// moment; reverted within it, the canary is current again and still not healthy, and the rest
/// wait (they rolled, before the fix: the canary's state was dropped while it was behind).
#[tokio::test]
async fn a_canary_whose_content_changes_and_changes_back_within_the_quiet_period_still_gates_the_rest() {
    let Some(s) = Scene::new("waves-flicker").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 1, "canary"), ("web", 0, "stable")]).await;
    let mut spec = staged(&key, canary_first("0s"));
    spec["rollout"]["quietPeriod"] = json!("2s");
    s.binding("app", spec).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, "v2").await;
    s.wait_generation("canary", 2).await;
    s.put(&key, "v3").await;
    s.wait_condition("app", conditions::READY, "False", reason::PENDING).await;
    s.put(&key, "v2").await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web"]).await, [2, 1], "web waits for the canary");

    s.scale("canary", 0).await;
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web"]).await, [3, 2], "the scale, and one rollout each");
    s.finish().await;
}

/// A wave's pause comes once: the next wave, rolled one at a time, goes on as each target is
/// healthy (before the fix, the first wave paused again before each of them).
#[tokio::test]
async fn a_wave_pauses_once_and_the_next_rolls_one_at_a_time_without_pausing_again() {
    let Some(s) = Scene::new("waves-once").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 0, "canary"), ("web-a", 0, "stable"), ("web-b", 0, "stable")]).await;
    let rollout = json!({"waves": [{"selector": {"matchLabels": {"track": "canary"}}, "pause": "5s"},
        {"maxParallel": 1}]});
    s.binding("app", staged(&key, rollout)).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, "v2").await;
    let desired = s.checksum_of(&key, b"v2").await;
    let mut seen: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let status = s.get_binding("app").await.status.unwrap_or_default();
        let rollout = status.rollout.filter(|r| r.checksum == desired);
        // A pause that begins again shows as the same wave and phase since a later time.
        let progress = rollout.map(|r| format!("{} since {}", r.progress, r.since.0)).unwrap_or_default();
        if seen.last() != Some(&progress) {
            seen.push(progress.clone());
        }
        if progress.starts_with("2/2 Complete") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not complete: {seen:?}\n{}", s.log());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let paused = seen.iter().filter(|p| p.starts_with("1/2 Paused")).count();
    assert_eq!(paused, 1, "one pause, before the second wave: {seen:?}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web-a", "web-b"]).await, [2, 2, 2]);
    s.finish().await;
}

/// StatefulSets and DaemonSets report health by their own rules: here a StatefulSet of no
/// replicas and a DaemonSet on no node are healthy once their controllers observe the change.
#[tokio::test]
async fn a_stateful_set_wave_then_a_daemon_set_wave_each_healthy_by_its_own_rules() {
    let Some(s) = Scene::new("waves-kinds").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    let mut sts = support::workload("StatefulSet", "db", json!({}));
    sts["spec"]["replicas"] = json!(0);
    s.apply(sts).await.unwrap();
    s.apply(support::workload("DaemonSet", "agent", json!({}))).await.unwrap();
    let spec = json!({"keys": [{"key": key}],
        "targets": [{"kind": "StatefulSet", "name": "db"}, {"kind": "DaemonSet", "name": "agent"}],
        "rollout": {"quietPeriod": "0s", "waves": [{"kind": "StatefulSet", "pause": "2s"}, {"kind": "DaemonSet"}]}});
    s.binding("app", spec).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, "v2").await;
    let paused = s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await;
    let desired = paused.status.as_ref().and_then(|s| s.rollout.as_ref()).map(|r| r.checksum.clone()).unwrap();
    let annotation = names::annotation_key("app");
    let carries = |kind: &'static str, name: &'static str| {
        let s = &s;
        let (annotation, desired) = (annotation.clone(), desired.clone());
        async move { s.template_annotations(kind, name).await.get(&annotation).is_some_and(|v| *v == desired) }
    };
    assert!(carries("StatefulSet", "db").await, "the StatefulSet rolled first");
    assert!(!carries("DaemonSet", "agent").await, "the DaemonSet waits for the StatefulSet's wave");
    let done = s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    let targets = done.status.unwrap().targets;
    assert!(targets.iter().all(|t| t.state == Some(TargetState::Healthy)), "{targets:?}");
    assert!(carries("DaemonSet", "agent").await);
    s.finish().await;
}

/// `onBind` rolls through the waves like any change: the canary first, and the rest only once
/// it is healthy (before the fix, every target rolled at once when bound).
#[tokio::test]
async fn on_bind_with_a_canary_wave_rolls_the_canary_first() {
    let Some(s) = Scene::new("waves-onbind").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("canary", 1, "canary"), ("web-a", 0, "stable"), ("web-b", 0, "stable")]).await;
    let mut rollout = canary_first("0s");
    rollout["onBind"] = json!(true);
    s.binding("app", staged(&key, rollout)).await;
    s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_HALTED).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web-a", "web-b"]).await, [2, 1, 1], "the canary alone");
    s.fix_the_canary().await;
    s.finish().await;
}

/// A patch the API server refuses (the controller's account without `patch` on Deployments)
/// shows as `PatchFailed` with its event, not as the wave in progress that tried it, and spends
/// no budget: once the rule is back, the change rolls at once, and the budget counts that one
/// rollout.
#[tokio::test]
async fn a_refused_patch_in_a_wave_shows_spends_no_budget_and_rolls_once_the_rule_is_back() {
    let Some(mut s) = Scene::without_controller("waves-refused").await else { return };
    let twin = crate::rbac::Twin::new(&s, "consulbind-refused-probe").await;
    let without = twin.cluster_rules_with(|rule| {
        if rule.resources.iter().flatten().any(|r| r == "deployments") {
            rule.verbs.retain(|v| v != "patch");
        }
    });
    assert_ne!(without, twin.cluster_rules, "no rule grants patch on Deployments");
    twin.start_controller(&mut s, &[]).await;
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("web", 0, "stable")]).await;
    let mut rollout = canary_first("0s");
    rollout["budget"] = json!({"maxRollouts": 1, "per": "1h"});
    s.binding("app", staged(&key, rollout)).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    twin.set_rules(&without, &twin.own_rules).await;
    s.put(&key, "v2").await;
    let failed = s.wait_condition("app", conditions::READY, "False", reason::PATCH_FAILED).await;
    let row = failed.status.unwrap().targets.into_iter().find(|t| t.name == "web").expect("web's row");
    assert!(row.rolled_times.is_empty(), "no roll time for a refused patch: {row:?}");
    assert_eq!(s.generation("web").await, 1);
    let told = || async { Ok(s.events_for("app").await.iter().any(|(r, _)| r == reason::PATCH_FAILED)) };
    wait("a PatchFailed event", told).await.unwrap();

    twin.set_rules(&twin.cluster_rules, &twin.own_rules).await;
    let done = s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    let row = done.status.unwrap().targets.into_iter().find(|t| t.name == "web").expect("web's row");
    assert_eq!(row.rolled_times.len(), 1, "{row:?}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "one rollout");
    s.finish().await;
}

/// A patch refused once the quiet period is over leaves the change settled: once the rule is
/// back, the retry rolls it without showing `ChangePending` for a second quiet period.
#[tokio::test]
async fn a_patch_refused_after_the_quiet_period_rolls_at_the_retry_without_a_second_one() {
    let Some(mut s) = Scene::without_controller("quiet-refused").await else { return };
    let twin = crate::rbac::Twin::new(&s, "consulbind-quiet-probe").await;
    let without = twin.cluster_rules_with(|rule| {
        if rule.resources.iter().flatten().any(|r| r == "deployments") {
            rule.verbs.retain(|v| v != "patch");
        }
    });
    twin.start_controller(&mut s, &[]).await;
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("web", 0, "stable")]).await;
    let spec = json!({"keys": [{"key": key}], "targets": [{"kind": "Deployment", "name": "web"}],
                      "rollout": {"quietPeriod": "5s"}});
    s.binding("app", spec).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    twin.set_rules(&without, &twin.own_rules).await;
    s.put(&key, "v2").await;
    s.wait_condition("app", conditions::READY, "False", reason::PATCH_FAILED).await;
    twin.set_rules(&twin.cluster_rules, &twin.own_rules).await;
    let mut seen = Vec::new();
    loop {
        let binding = s.get_binding("app").await;
        let ready = support::ready(&binding);
        let now = ready.map(|c| c.reason).unwrap_or_default();
        if now == reason::UP_TO_DATE {
            break;
        }
        seen.push(now);
        assert!(seen.len() < 400, "not rolled within a minute: {seen:?}");
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    seen.dedup();
    assert!(!seen.iter().any(|r| r == reason::PENDING), "a second quiet period: {seen:?}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "one rollout");
    s.finish().await;
}

/// A status write refused after the stamp landed (the controller's account without its rule on
/// `consulbindings/status`) leaves the status owed: a change made meanwhile rolls nothing, and
/// once the rule is back the status records the roll and the budget it spent holds that change.
/// Before, the retry planned on the status the API server held, and rolled again.
#[tokio::test]
async fn a_status_write_refused_after_a_roll_spends_the_budget_all_the_same() {
    let Some(mut s) = Scene::without_controller("waves-owed").await else { return };
    let twin = crate::rbac::Twin::new(&s, "consulbind-owed-probe").await;
    let without = twin.cluster_rules_without_status();
    assert_ne!(without, twin.cluster_rules, "no rule grants the status");
    twin.start_controller(&mut s, &[]).await;
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("web", 0, "stable")]).await;
    s.binding("app", staged(&key, json!({"budget": {"maxRollouts": 1, "per": "1h"}}))).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;

    twin.set_rules(&without, &twin.own_rules).await;
    s.put(&key, "v2").await;
    let rolled = || async { Ok(s.generation("web").await == 2) };
    wait("web to roll to v2", rolled).await.unwrap();
    let refused = || async { Ok(s.log().contains("writing status")) };
    wait("the status write to be refused", refused).await.unwrap();
    s.put(&key, "v3").await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "rolled again while the status owed the last roll");

    twin.set_rules(&twin.cluster_rules, &twin.own_rules).await;
    let held = s.wait_condition("app", conditions::READY, "False", reason::ROLLOUT_BUDGET_EXHAUSTED).await;
    let row = held.status.unwrap().targets.into_iter().find(|t| t.name == "web").expect("web's row");
    assert_eq!(row.rolled_times.len(), 1, "{row:?}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "the budget the roll spent holds the next change");
    s.finish().await;
}

/// A problem raises its Warning event once the status shows it, not on each retry of a status
/// write that the API server refuses meanwhile.
#[tokio::test]
async fn a_problem_whose_status_write_is_refused_for_a_while_is_told_once() {
    let Some(mut s) = Scene::without_controller("waves-told-once").await else { return };
    let twin = crate::rbac::Twin::new(&s, "consulbind-told-probe").await;
    let without = twin.cluster_rules_without_status();
    twin.set_rules(&without, &twin.own_rules).await;
    twin.start_controller(&mut s, &[]).await;
    s.deployments(&[("web", 0, "stable")]).await;
    s.binding("app", staged(&s.key("absent"), json!({}))).await;
    let refused = || async { Ok(s.log().matches("writing status").count() >= 3) };
    wait("three refused status writes", refused).await.unwrap();
    let told =
        || async { s.events_for("app").await.into_iter().filter(|(reason, _)| reason == reason::KEY_MISSING).count() };
    assert_eq!(told().await, 0, "told before the status could show it");

    twin.set_rules(&twin.cluster_rules, &twin.own_rules).await;
    s.wait_condition("app", conditions::READY, "False", reason::KEY_MISSING).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(told().await, 1);
    s.finish().await;
}

/// The canary rolled, and the controller stopped before any status could record it (its
/// status writes refused): the controller that starts next finds the roll on the canary itself,
/// when its stamp was set, and keeps the canary's pause.
#[tokio::test]
async fn a_canary_roll_no_status_recorded_before_a_restart_keeps_its_pause() {
    unrecorded_canary_roll("waves-unrecorded", "consulbind-unrecorded-probe", false, false).await;
}

/// The same where the rest also read a ConfigMap their templates reference, so that the
/// canary's content is not the whole's: its roll is of the rollout all the same.
#[tokio::test]
async fn a_canary_roll_no_status_recorded_keeps_its_pause_where_the_rest_read_more() {
    unrecorded_canary_roll("waves-unrecorded-refs", "consulbind-unrecorded-refs-probe", true, false).await;
}

/// The same with Consul away (here the token Secret spoilt) when the controller starts again:
/// until the content is read the roll cannot be told from the canary's own checksum, so the
/// binding says why and records nothing; once it is read, the pause is kept.
#[tokio::test]
async fn a_canary_roll_no_status_recorded_and_found_while_consul_is_away_keeps_its_pause() {
    unrecorded_canary_roll("waves-unrecorded-away", "consulbind-unrecorded-away-probe", true, true).await;
}

async fn unrecorded_canary_roll(scene: &str, probe: &'static str, references: bool, consul_away: bool) {
    let Some(mut s) = Scene::without_controller(scene).await else { return };
    let twin = crate::rbac::Twin::new(&s, probe).await;
    let without = twin.cluster_rules_without_status();
    twin.start_controller(&mut s, &[]).await;
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.apply(extra()).await.unwrap();
    s.deployments(&[("canary", 0, "canary")]).await;
    let web = deployment("web", 0, "stable");
    s.apply(if references { reading_extra(web) } else { web }).await.unwrap();
    let (token, good) = (support::token_secret, support::ANY_TOKEN);
    s.apply(token(good)).await.unwrap();
    let mut spec = staged(&key, canary_first("1h"));
    spec["includeTargetReferences"] = json!(references);
    spec["consul"] = json!({"tokenSecretRef": {"name": "token"}});
    s.binding("app", spec).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    twin.set_rules(&without, &twin.own_rules).await;
    let before = k8s_openapi::jiff::Timestamp::now();
    s.put(&key, "v2").await;
    let rolled = || async { Ok(s.generation("canary").await == 2) };
    wait("the canary to roll to v2", rolled).await.unwrap();
    let refused = || async { Ok(s.log().contains("writing status")) };
    wait("the status write to be refused", refused).await.unwrap();
    s.stop_controller().await;
    let after = k8s_openapi::jiff::Timestamp::now();

    twin.set_rules(&twin.cluster_rules, &twin.own_rules).await;
    if consul_away {
        s.apply(token("not a token")).await.unwrap();
    }
    twin.start_controller(&mut s, &[]).await;
    if consul_away {
        s.wait_condition("app", conditions::READY, "False", reason::TOKEN_SECRET_INVALID).await;
        tokio::time::sleep(support::SETTLE).await;
        s.apply(token(good)).await.unwrap();
    }
    let paused = s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await;
    let canary = paused.status.unwrap().targets.into_iter().find(|t| t.name == "canary").expect("the canary's row");
    let at = canary.last_rolled_time.expect("the canary's roll").0;
    // The managed fields keep the second of the stamp; the end of that second is taken.
    let latest = after + std::time::Duration::from_secs(1);
    assert!(before < at && at <= latest, "rolled at {at}, after {before} and by {latest}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web"]).await, [2, 1], "the rest waits out the canary's pause");
    s.finish().await;
}

/// An `OnDelete` StatefulSet and an `OnDelete` DaemonSet in the first wave are healthy once their
/// controllers observe the change, as `kubectl rollout status` has it: their pods change only when
/// deleted. The DaemonSet has a node to run on (a Node object no other workload tolerates) and a
/// pod that never starts; before the fix, it held the second wave for ever.
#[tokio::test]
async fn on_delete_stateful_sets_and_daemon_sets_in_the_first_wave_let_the_second_through() {
    let Some(s) = Scene::new("waves-ondelete").await else { return };
    let node = format!("{}-node", s.ns);
    let taint = json!([{"key": "consulbind-e2e", "value": node, "effect": "NoSchedule"}]);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(s.client.clone());
    let manifest = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "spec": {"taints": taint}});
    nodes.create(&Default::default(), &serde_json::from_value(manifest).unwrap()).await.unwrap();
    let key = s.key("config");
    s.put(&key, "v1").await;
    let mut sts = support::workload("StatefulSet", "db", json!({}));
    sts["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
    s.apply(sts).await.unwrap();
    let mut ds = support::workload("DaemonSet", "agent", json!({}));
    ds["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
    // Its own node's taint, and those the node-lifecycle controller gives a node with no
    // kubelet; not the bed's node, which runs only local images.
    ds["spec"]["template"]["spec"]["tolerations"] = json!([{"key": "consulbind-e2e", "operator": "Exists"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]);
    s.apply(ds).await.unwrap();
    s.deployments(&[("web", 0, "stable")]).await;
    let spec = json!({"keys": [{"key": key}],
        "targets": [{"kind": "StatefulSet", "name": "db"}, {"kind": "DaemonSet", "name": "agent"},
            {"kind": "Deployment", "name": "web"}],
        "rollout": {"quietPeriod": "0s", "healthTimeout": "1m",
            "waves": [{"kind": "StatefulSet"}, {"kind": "DaemonSet"}, {}]}});
    s.binding("app", spec).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    let scheduled = || async {
        let shown = s.kubectl(&["get", "daemonset", "agent", "-o", "jsonpath={.status.desiredNumberScheduled}"]);
        Ok(shown.trim() == "1")
    };
    wait("the DaemonSet to have its node", scheduled).await.unwrap();

    s.put(&key, "v2").await;
    let message = s.wait_message("app", conditions::READY, "True", reason::PODS_AWAIT_DELETION).await;
    assert!(message.contains("StatefulSet db: 0 of 1 pods run the current template"), "{message}");
    assert!(message.contains("DaemonSet agent: 0 of 1 pods"), "{message}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "the last wave rolled");
    nodes.delete(&node, &Default::default()).await.unwrap();
    s.finish().await;
}

/// A reference added to the canary's template during its pause is recorded without a rollout
/// of its own, as when nothing is in flight: the template change restarted its pods, which read
/// the ConfigMap as it is. The rollout goes on, not over: still its first wave, started when it
/// was (the pause starts afresh only if the canary is seen rolling its new template), and the
/// rest roll once after it.
#[tokio::test]
async fn a_reference_added_to_the_canary_during_its_pause_rolls_nothing_more_and_the_pause_goes_on() {
    let Some(s) = Scene::new("waves-reference").await else { return };
    let paused = s.paused_with_references(false).await;
    let before = paused.status.unwrap().rollout.expect("status.rollout");
    s.apply(reading_extra(deployment("canary", 0, "canary"))).await.unwrap();
    let read = || async {
        let status = s.get_binding("app").await.status.unwrap_or_default();
        Ok(status.objects.iter().any(|o| o.name == "extra" && o.referenced))
    };
    wait("the binding to read the canary's new reference", read).await.unwrap();
    // The canary's template change is judged first (in progress until it is available again).
    let status = s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await.status.unwrap();
    let now = status.rollout.expect("status.rollout");
    assert_eq!((now.wave, &now.started_time), (1, &before.started_time), "{now:?}");
    assert!(now.since >= before.since, "{now:?}");
    assert_eq!(s.generations(&["canary", "web"]).await, [3, 1], "the stamp, then the template change");

    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web"]).await, [3, 2], "no second rollout of the canary");
    s.finish().await;
}

/// Wave and budget fields at their bounds and past them: the API server refuses what its schema
/// can tell, the controller names the field it refuses, and another binding rolls meanwhile.
/// With a quiet period of 0 s the canary rolls in the instant its rollout begins (the status
/// keeps that instant to the microsecond); the only reference it then drops rolls nothing more.
#[tokio::test]
async fn a_reference_dropped_by_a_canary_rolled_as_its_rollout_began_rolls_nothing_more() {
    let Some(s) = Scene::new("waves-dropped").await else { return };
    let paused = s.paused_with_references(true).await;
    let status = paused.status.unwrap();
    let (rollout, canary_row) = (status.rollout.expect("status.rollout"), &status.targets[0]);
    assert_eq!(canary_row.last_rolled_time.as_ref(), Some(&rollout.started_time), "rolled as the rollout began");
    s.deployments(&[("canary", 0, "canary")]).await;
    let dropped = || async {
        let status = s.get_binding("app").await.status.unwrap_or_default();
        Ok(!status.objects.iter().any(|o| o.name == "extra"))
    };
    wait("the binding to drop the canary's reference", dropped).await.unwrap();
    // The canary's template change is judged first (in progress until it is available again).
    s.wait_condition("app", conditions::READY, "False", reason::WAVE_PAUSED).await;
    assert_eq!(s.generations(&["canary", "web"]).await, [3, 1], "the stamp, then the template change");

    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generations(&["canary", "web"]).await, [3, 2], "no second rollout of the canary");
    s.finish().await;
}

#[tokio::test]
async fn malformed_waves_and_budgets_are_refused_by_field_and_another_binding_rolls() {
    let Some(s) = Scene::new("waves-bad").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.deployments(&[("web", 0, "stable")]).await;
    let both = json!({"waves": [{"name": "web", "selector": {"matchLabels": {"a": "b"}}}]});
    s.binding("both", staged(&key, both)).await;
    let long = json!({"waves": [{"pause": "25h"}], "healthTimeout": "24h"});
    s.binding("long", staged(&key, long)).await;
    for (rollout, field) in [
        (json!({"waves": [{"maxParallel": 0}]}), "maxParallel"),
        (json!({"budget": {"maxRollouts": 101, "per": "1m"}}), "maxRollouts"),
        (json!({"budget": {"maxRollouts": 1, "per": "soon"}}), "per"),
    ] {
        s.assert_refused(staged(&key, rollout), field).await;
    }
    let most = json!({"waves": (0..16).map(|_| json!({"maxParallel": 4294967295u32, "pause": "24h"})).collect::<Vec<_>>(),
        "healthTimeout": "24h", "budget": {"maxRollouts": 100, "per": "24h"}});
    s.binding("most", staged(&key, most)).await;

    let message = s.wait_message("both", conditions::READY, "False", reason::INVALID_SPEC).await;
    assert!(message.contains("spec.rollout.waves[0] sets both name and selector"), "{message}");
    let message = s.wait_message("long", conditions::READY, "False", reason::INVALID_SPEC).await;
    assert!(message.contains("spec.rollout.waves[0].pause") && message.contains("24h"), "{message}");
    s.wait_condition("most", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_generation("web", 2).await;
    s.wait_condition("most", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "one change, one rollout, by the one binding served");
    s.finish().await;
}
