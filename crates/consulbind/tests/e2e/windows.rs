//! Rollout windows on the real servers, by the wall clock: `* * * * *` opens a window at each
//! minute's start. A rollout is counted as a bump of the Deployment's `metadata.generation`;
//! a Deployment of zero replicas is healthy once its controller observes the new template.

use std::time::Duration;

use consulbind_api::{
    ConsulBinding, ROLL_OUTSIDE_WINDOW, RolloutPhase,
    conditions::{self, reason},
};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::support::{self, Scene, wait};

fn deployment(name: &str, track: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name, "track": track}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]}}}})
}

fn windowed(key: &str, windows: Value, waves: Value) -> Value {
    json!({"keys": [{"key": key}], "targets": [{"kind": "Deployment", "selector": {"matchLabels": {}}}],
        "rollout": {"quietPeriod": "0s", "windows": windows, "waves": waves}})
}

/// Sleeps until the wall clock is `second` seconds into a minute.
async fn until_second(second: i64) {
    let now = Timestamp::now().as_millisecond();
    let wait = (second * 1000 - now.rem_euclid(60_000)).rem_euclid(60_000);
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
}

fn next_window(binding: &ConsulBinding) -> Timestamp {
    let rollout = binding.status.as_ref().and_then(|s| s.rollout.as_ref()).expect("status.rollout");
    assert_eq!(rollout.phase, RolloutPhase::Waiting, "{rollout:?}");
    rollout.next_window.as_ref().expect("status.rollout.nextWindow").0
}

impl Scene {
    async fn set_up(&self, name: &str, names: &[(&str, &str)], windows: Value, waves: Value) -> String {
        let key = self.key(name);
        self.put(&key, "v1").await;
        for (name, track) in names {
            self.apply(deployment(name, track)).await.unwrap();
        }
        self.binding("app", windowed(&key, windows, waves)).await;
        self.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
        key
    }

    /// Waits for the Deployment's generation to reach `want`, and says when it did.
    async fn rolled_at(&self, name: &str, want: i64) -> Timestamp {
        let what = format!("Deployment {name} at generation {want}");
        let timeout = Duration::from_secs(90);
        if let Err(error) =
            support::wait_for(&what, timeout, || async { Ok(self.generation(name).await >= want) }).await
        {
            panic!("{error}\n{}", self.log());
        }
        Timestamp::now()
    }
}

/// A change made 30 s before the window opens waits for it, with the opening in the status,
/// and rolls once when it opens.
#[tokio::test]
async fn a_change_outside_the_window_rolls_once_when_it_opens_and_not_before() {
    let Some(s) = Scene::new("windows-open").await else { return };
    let key = s
        .set_up("config", &[("web", "stable")], json!([{"schedule": "* * * * *", "duration": "15s"}]), json!([]))
        .await;
    until_second(30).await;
    s.put(&key, "v2").await;
    let held = s.wait_condition("app", conditions::READY, "False", reason::OUTSIDE_ROLLOUT_WINDOW).await;
    let opens = next_window(&held);
    let message = &held.status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == "Ready").unwrap().message;
    assert!(message.contains(&opens.to_string()), "the message names the opening: {message}");
    assert_eq!(opens.as_second().rem_euclid(60), 0, "a minute's start: {opens}");
    assert_eq!(s.generation("web").await, 1, "nothing rolled before the window");
    let rolled = s.rolled_at("web", 2).await;
    assert!(rolled >= opens, "rolled at {rolled}, before the window opened at {opens}");
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "one rollout");
    s.finish().await;
}

/// A deny window holds a change made inside it, which rolls once it has passed.
#[tokio::test]
async fn a_deny_window_holds_a_change_that_rolls_once_it_has_passed() {
    let Some(s) = Scene::new("windows-deny").await else { return };
    let windows = json!([{"kind": "deny", "schedule": "* * * * *", "duration": "40s"}]);
    let key = s.set_up("config", &[("web", "stable")], windows, json!([])).await;
    until_second(5).await;
    s.put(&key, "v2").await;
    let held = s.wait_condition("app", conditions::READY, "False", reason::OUTSIDE_ROLLOUT_WINDOW).await;
    let opens = next_window(&held);
    assert_eq!(opens.as_second().rem_euclid(60), 40, "the deny window's end: {opens}");
    assert_eq!(s.generation("web").await, 1);
    let rolled = s.rolled_at("web", 2).await;
    assert!(rolled >= opens, "rolled at {rolled}, inside the deny window that ended at {opens}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "one rollout");
    s.finish().await;
}

/// The binding's annotation naming the held checksum rolls it now, wave after wave, with events
/// that name it; the next change keeps to the windows.
#[tokio::test]
async fn the_annotation_naming_the_held_checksum_rolls_it_now_with_an_event_and_only_it() {
    let Some(s) = Scene::new("windows-urgent").await else { return };
    // On the first of January only.
    let windows = json!([{"schedule": "0 0 1 1 *", "duration": "1h", "timeZone": "Pacific/Kiritimati"}]);
    let waves = json!([{"selector": {"matchLabels": {"track": "canary"}}}, {}]);
    let key = s.set_up("config", &[("canary", "canary"), ("web", "stable")], windows, waves).await;
    s.put(&key, "v2").await;
    let held = s.wait_condition("app", conditions::READY, "False", reason::OUTSIDE_ROLLOUT_WINDOW).await;
    let checksum = held.status.as_ref().and_then(|s| s.rollout.as_ref()).unwrap().checksum.clone();
    let short = consulbind::checksum::short(&checksum).to_owned();
    let message = s.wait_message("app", conditions::READY, "False", reason::OUTSIDE_ROLLOUT_WINDOW).await;
    assert!(message.contains(&format!("{ROLL_OUTSIDE_WINDOW}={short}")), "the message says how: {message}");
    s.kubectl(&["annotate", "consulbinding", "app", &format!("{ROLL_OUTSIDE_WINDOW}=0123456789ab")]);
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 1, "another checksum lets nothing through");

    s.kubectl(&["annotate", "--overwrite", "consulbinding", "app", &format!("{ROLL_OUTSIDE_WINDOW}={short}")]);
    s.rolled_at("web", 2).await;
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    let what = "a RolledOutsideWindow event for each wave";
    wait(what, || async {
        let events = s.events_for("app").await;
        Ok(events.iter().filter(|(r, _)| r == reason::ROLLED_OUTSIDE_WINDOW).count() == 2)
    })
    .await
    .unwrap();
    for (r, note) in s.events_for("app").await.iter().filter(|(r, _)| r == reason::ROLLED_OUTSIDE_WINDOW) {
        assert!(note.contains(&short), "{r}: {note}");
    }

    s.put(&key, "v3").await;
    s.wait_condition("app", conditions::READY, "False", reason::OUTSIDE_ROLLOUT_WINDOW).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "the annotation let one checksum through, not the next");
    s.finish().await;
}

/// A controller restarted while a change waits for its window rolls it once when it opens.
#[tokio::test]
async fn a_restart_while_waiting_for_a_window_rolls_once_when_it_opens() {
    let Some(mut s) = Scene::new("windows-restart").await else { return };
    let key = s
        .set_up("config", &[("web", "stable")], json!([{"schedule": "* * * * *", "duration": "15s"}]), json!([]))
        .await;
    until_second(25).await;
    s.put(&key, "v2").await;
    let held = s.wait_condition("app", conditions::READY, "False", reason::OUTSIDE_ROLLOUT_WINDOW).await;
    let opens = next_window(&held);
    s.stop_controller().await;
    s.start_controller(&[]).await;
    let rolled = s.rolled_at("web", 2).await;
    assert!(rolled >= opens, "rolled at {rolled}, before the window opened at {opens}");
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "one rollout across the restart");
    s.finish().await;
}

/// The canary wave rolls inside the window; its pause ends after the window closed, so the rest
/// wait for the next window and roll once then.
#[tokio::test]
async fn a_window_that_closes_during_a_pause_holds_the_next_wave_until_it_opens_again() {
    let Some(s) = Scene::new("windows-waves").await else { return };
    let waves = json!([{"selector": {"matchLabels": {"track": "canary"}}, "pause": "15s"}, {}]);
    let windows = json!([{"schedule": "* * * * *", "duration": "10s"}]);
    let key = s.set_up("config", &[("canary", "canary"), ("web", "stable")], windows, waves).await;
    until_second(1).await;
    s.put(&key, "v2").await;
    s.rolled_at("canary", 2).await;
    let held = s.wait_condition("app", conditions::READY, "False", reason::OUTSIDE_ROLLOUT_WINDOW).await;
    let opens = next_window(&held);
    let rollout = held.status.as_ref().and_then(|s| s.rollout.as_ref()).unwrap();
    assert_eq!((rollout.wave, rollout.waves), (2, 2), "the second wave waits: {rollout:?}");
    assert_eq!(s.generation("web").await, 1);
    let rolled = s.rolled_at("web", 2).await;
    assert!(rolled >= opens, "rolled at {rolled}, before the window opened at {opens}");
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!((s.generation("canary").await, s.generation("web").await), (2, 2), "one rollout each");
    s.finish().await;
}

/// The API server refuses a malformed schedule or zone by its pattern; the controller refuses
/// what the bed's server cannot check (it has no CEL rules) with `InvalidSpec`, naming the
/// field, and serves the other bindings.
#[tokio::test]
async fn malformed_windows_are_refused_by_field_and_another_binding_rolls() {
    let Some(s) = Scene::new("windows-bad").await else { return };
    let deny = json!([{"kind": "deny", "schedule": "0 0 1 1 *", "duration": "1m"}]);
    let key = s.set_up("config", &[("web", "stable")], deny, json!([])).await;
    for (window, field) in [
        (json!({"schedule": "0 22 * *", "duration": "1h"}), "schedule"),
        (json!({"schedule": "61 * * * *", "duration": "1h"}), "schedule"),
        (json!({"schedule": "* * * * *", "duration": "soon"}), "duration"),
        (json!({"schedule": "* * * * *", "duration": "1h", "timeZone": "../etc/passwd"}), "timeZone"),
        (json!({"kind": "sometimes", "schedule": "* * * * *", "duration": "1h"}), "kind"),
    ] {
        s.assert_refused(windowed(&key, json!([window]), json!([])), field).await;
    }
    let zone = json!([{"schedule": "* * * * *", "duration": "1h", "timeZone": "Mars/Olympus"}]);
    s.binding("zone", windowed(&key, zone, json!([]))).await;
    let zero = json!([{"schedule": "* * * * *", "duration": "0s"}]);
    s.binding("zero", windowed(&key, zero, json!([]))).await;
    let message = s.wait_message("zone", conditions::READY, "False", reason::INVALID_SPEC).await;
    assert!(message.contains("spec.rollout.windows[0].timeZone \"Mars/Olympus\""), "{message}");
    let message = s.wait_message("zero", conditions::READY, "False", reason::INVALID_SPEC).await;
    assert!(message.contains("spec.rollout.windows[0].duration is 0s"), "{message}");

    s.put(&key, "v2").await;
    s.rolled_at("web", 2).await;
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, 2, "one change, one rollout, by the one binding served");
    s.finish().await;
}
