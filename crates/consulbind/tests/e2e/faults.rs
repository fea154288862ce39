//! Consul going away, coming back, and coming back without its data, on an agent of its own.

use std::time::Duration;

use consul_kv::{Client as Consul, ClientConfig};
use consulbind_api::conditions::{self, reason};
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::support::{self, SETTLE, Scene, deploy, spec, wait_for};

const DEPLOY: &str = "Deployment";
const GRACE: &str = "--consul-failure-grace=6s";
const RESTORE_GRACE: Duration = Duration::from_secs(8);

/// The tests here restart and wipe one agent: one at a time.
pub(crate) static AGENT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `cargo xtask env consul-restart` on the fault tests' own agent.
pub(crate) fn restart(empty: bool, down: Duration) {
    let down = format!("--down={}", down.as_secs());
    let mut args = vec!["consul-restart", down.as_str()];
    if empty {
        args.push("--empty");
    }
    xtask(&args);
}

/// `cargo xtask env <args>` on the fault tests' own agent.
fn xtask(args: &[&str]) {
    crate::support::xtask_env(&[args, &["--agent=consul-faults"]].concat());
}

pub(crate) async fn faults_consul() -> Consul {
    let addr = std::env::var("CONSULBIND_E2E_FAULTS_ADDR")
        .expect("CONSULBIND_E2E_FAULTS_ADDR must be set; run `cargo xtask e2e`");
    Consul::new(ClientConfig { address: addr, ..ClientConfig::default() }).await.unwrap()
}

fn ready_reason(binding: &consulbind_api::ConsulBinding) -> Option<(String, String)> {
    support::ready(binding).map(|c| (c.status, c.reason))
}

/// One test, so that its phases never restart the agent under each other.
#[tokio::test]
async fn consul_blips_restarts_and_data_loss_roll_nothing_and_show_within_seconds() {
    let _agent = AGENT.lock().await;
    let consul = faults_consul().await;
    let addr = format!("--consul-http-addr={}", std::env::var("CONSULBIND_E2E_FAULTS_ADDR").unwrap());
    let restore = format!("--consul-restore-grace={}s", RESTORE_GRACE.as_secs());
    let Some(mut s) = Scene::with_args("faults", &[&addr, GRACE, &restore]).await else {
        return;
    };
    let (key, prefix) = (s.key("config"), s.key("features/"));
    consul.put(&key, b"v1", None).await.unwrap();
    consul.put(&format!("{prefix}a"), b"on", None).await.unwrap();
    consul.put(&format!("{prefix}b"), b"on", None).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    s.workload(DEPLOY, "api", json!({})).await;
    s.wait_revisions(DEPLOY, "web", 1).await;
    s.wait_revisions(DEPLOY, "api", 1).await;
    s.binding("required", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    s.binding("optional", spec(json!([{"key": prefix, "recurse": true, "optional": true}]), deploy("api"), "0s")).await;
    s.wait_condition("required", conditions::READY, "True", reason::BASELINED).await;
    s.wait_condition("optional", conditions::READY, "True", reason::BASELINED).await;

    // A blip shorter than the grace period: no status write, no event.
    let versions = |s: &Scene| {
        let api = s.bindings();
        async move {
            let list = api.list(&Default::default()).await.unwrap();
            list.items.iter().map(|b| b.metadata.resource_version.clone().unwrap()).collect::<Vec<_>>()
        }
    };
    let before = versions(&s).await;
    let events_before = s.events_for("required").await.len() + s.events_for("optional").await.len();
    restart(false, Duration::ZERO);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(versions(&s).await, before, "a blip within the grace period wrote a status\n{}", s.log());
    let events_after = s.events_for("required").await.len() + s.events_for("optional").await.len();
    assert_eq!(events_after, events_before, "a blip within the grace period raised an event");

    // Down for longer than the grace: reported, then Ready again within 15 s, no rollout.
    let outage = tokio::task::spawn_blocking(|| restart(false, Duration::from_secs(10)));
    s.wait_condition("required", conditions::CONSUL_SYNCED, "False", reason::CONSUL_UNREACHABLE).await;
    outage.await.unwrap();
    let back = tokio::time::Instant::now();
    s.wait_condition("required", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_condition("optional", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert!(back.elapsed() < Duration::from_secs(15), "Ready {:?} after Consul answered", back.elapsed());
    s.wait_revisions(DEPLOY, "web", 1).await;
    s.wait_revisions(DEPLOY, "api", 1).await;
    consul.put(&key, b"v2", None).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 2).await;

    // Restarted empty: the required key and the optional prefix show as lost, the prefix is not
    // rolled to empty, and restoring the same content rolls nothing, even written back key by key with
    // the half-restored prefix standing for longer than the quiet period.
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    let back = tokio::time::Instant::now();
    let reasons = || async {
        let required = ready_reason(&s.get_binding("required").await);
        let optional = ready_reason(&s.get_binding("optional").await);
        Ok(required.is_some_and(|r| r.0 == "False" && r.1 == reason::CONSUL_INDEX_RESET)
            && optional.is_some_and(|r| r.0 == "False" && r.1 == reason::CONSUL_INDEX_RESET))
    };
    if let Err(error) = wait_for("ConsulIndexReset on both", Duration::from_secs(15), reasons).await {
        panic!("{error} {:?} after Consul answered\n{}", back.elapsed(), s.log());
    }
    s.wait_revisions(DEPLOY, "api", 1).await;
    // A controller restarted meanwhile reads the empty prefix as its first answer, no reset: the
    // status keeps the hold.
    s.stop_controller().await;
    s.start_controller(&[&addr, GRACE, &restore]).await;
    tokio::time::sleep(SETTLE).await;
    s.wait_condition("optional", conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    assert_eq!(s.revisions(DEPLOY, "api").await, 1, "the lost prefix rolled after a restart\n{}", s.log());
    // A hung agent takes the Ready condition for a while; the status's keys keep the hold.
    let frozen = tokio::task::spawn_blocking(|| xtask(&["consul-hang", "--seconds=20"]));
    s.wait_condition("optional", conditions::READY, "False", reason::CONSUL_UNREACHABLE).await;
    frozen.await.unwrap();
    s.wait_condition("optional", conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    tokio::time::sleep(RESTORE_GRACE + SETTLE).await;
    s.wait_condition("optional", conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    assert_eq!(s.revisions(DEPLOY, "api").await, 1, "the lost prefix rolled after an outage\n{}", s.log());
    consul.put(&key, b"v2", None).await.unwrap();
    consul.put(&format!("{prefix}a"), b"on", None).await.unwrap();
    s.wait_condition("optional", conditions::READY, "False", reason::PENDING).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    consul.put(&format!("{prefix}b"), b"on", None).await.unwrap();
    s.wait_condition("required", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_condition("optional", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_revisions(DEPLOY, "api", 1).await;
    // The next real change rolls exactly once.
    consul.put(&format!("{prefix}a"), b"off", None).await.unwrap();
    s.wait_revisions(DEPLOY, "api", 2).await;

    frozen_then_back(&s, 2).await;
    consul.put(&key, b"v3", None).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 3).await;

    // Lost again, and restored key by key with other content: one rollout, once the restored
    // content has stood for the restore grace.
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    s.wait_condition("optional", conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    consul.put(&key, b"v3", None).await.unwrap();
    consul.put(&format!("{prefix}a"), b"off", None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let restored = tokio::time::Instant::now();
    consul.put(&format!("{prefix}b"), b"older", None).await.unwrap();
    s.wait_condition("optional", conditions::READY, "False", reason::PENDING).await;
    let rolled = || async { Ok(s.revisions(DEPLOY, "api").await >= 3) };
    wait_for("the restored content to roll", RESTORE_GRACE * 4, rolled).await.unwrap();
    assert!(restored.elapsed() >= RESTORE_GRACE, "rolled {:?} after the restore, within its grace", restored.elapsed());
    s.wait_revisions(DEPLOY, "api", 3).await;
    s.wait_revisions(DEPLOY, "web", 3).await;

    // Restored while no controller ran: the status's modify indexes show it.
    lift_index(&consul, &s).await;
    consul.put(&key, b"v4", None).await.unwrap();
    consul.put(&format!("{prefix}b"), b"newer", None).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 4).await;
    s.wait_revisions(DEPLOY, "api", 4).await;
    s.wait_condition("required", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_condition("optional", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.stop_controller().await;
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    consul.put(&key, b"restored", None).await.unwrap();
    let restored = tokio::time::Instant::now();
    s.start_controller(&[&addr, GRACE, &restore]).await;
    // The lost prefix is held, and the older value waits out the restore grace, then rolls once.
    s.wait_condition("optional", conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    let rolled = || async { Ok(s.revisions(DEPLOY, "web").await >= 5) };
    wait_for("the restored value to roll", RESTORE_GRACE * 4, rolled).await.unwrap();
    assert!(restored.elapsed() >= RESTORE_GRACE, "rolled {:?} after the restore, within its grace", restored.elapsed());
    consul.put(&format!("{prefix}a"), b"off", None).await.unwrap();
    consul.put(&format!("{prefix}b"), b"newer", None).await.unwrap();
    s.wait_condition("optional", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_revisions(DEPLOY, "web", 5).await;
    s.wait_revisions(DEPLOY, "api", 4).await;

    // Restored with the same content while no controller ran: nothing rolls, and the next
    // change is an ordinary one, with no restore grace left over.
    lift_index(&consul, &s).await;
    consul.put(&key, b"v6", None).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 6).await;
    s.wait_condition("required", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.stop_controller().await;
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    consul.put(&key, b"v6", None).await.unwrap();
    consul.put(&format!("{prefix}a"), b"off", None).await.unwrap();
    consul.put(&format!("{prefix}b"), b"newer", None).await.unwrap();
    s.start_controller(&[&addr, GRACE, &restore]).await;
    s.wait_condition("required", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_condition("optional", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_revisions(DEPLOY, "web", 6).await;
    let changed = tokio::time::Instant::now();
    consul.put(&key, b"v7", None).await.unwrap();
    let rolled = || async { Ok(s.revisions(DEPLOY, "web").await >= 7) };
    wait_for("the next change to roll", RESTORE_GRACE * 4, rolled).await.unwrap();
    assert!(changed.elapsed() < RESTORE_GRACE, "a change after a same-content restore waited {:?}", changed.elapsed());
    s.wait_revisions(DEPLOY, "web", 7).await;
    s.wait_revisions(DEPLOY, "api", 4).await;

    // Over HTTPS every query shares one HTTP/2 connection, and a frozen agent still
    // acknowledges its TCP keep-alives.
    let tls =
        std::env::var("CONSULBIND_E2E_FAULTS_TLS_ADDR").expect("CONSULBIND_E2E_FAULTS_TLS_ADDR; run `cargo xtask e2e`");
    let ca = std::env::var("CONSULBIND_E2E_CONSUL_CA").expect("CONSULBIND_E2E_CONSUL_CA; run `cargo xtask e2e`");
    s.stop_controller().await;
    let envs = [("CONSUL_HTTP_ADDR", tls.as_str()), ("CONSUL_CACERT", ca.as_str())];
    s.start_controller_with_env(&[GRACE, &restore], &envs).await;
    frozen_then_back(&s, 7).await;
    consul.put(&key, b"v8", None).await.unwrap();
    s.wait_revisions(DEPLOY, "web", 8).await;
    s.wait_revisions(DEPLOY, "api", 4).await;
    s.finish().await;
}

pub(crate) fn faults_addr() -> String {
    format!("--consul-http-addr={}", std::env::var("CONSULBIND_E2E_FAULTS_ADDR").unwrap())
}

/// Lost content is held until a person says to roll it: a spec change. The go-ahead rolls once,
/// though the watches still remember the reset, and later changes roll as usual.
#[tokio::test]
async fn the_go_ahead_after_a_loss_rolls_once_and_later_changes_roll_as_usual() {
    let _agent = AGENT.lock().await;
    let consul = faults_consul().await;
    let (addr, restore) = (faults_addr(), "--consul-restore-grace=3s");
    let Some(s) = Scene::with_args("go-ahead", &[&addr, GRACE, restore]).await else { return };
    lift_index(&consul, &s).await;
    let (key, prefix) = (s.key("x"), s.key("flags/"));
    consul.put(&key, b"v1", None).await.unwrap();
    consul.put(&format!("{prefix}a"), b"on", None).await.unwrap();
    consul.put(&format!("{prefix}b"), b"on", None).await.unwrap();
    s.workload(DEPLOY, "web", json!({})).await;
    let keys = json!([{"key": key}, {"key": prefix, "recurse": true, "optional": true}]);
    s.binding("app", spec(keys, deploy("web"), "0s")).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    let before = s.generation("web").await;

    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    consul.put(&key, b"v1", None).await.unwrap();
    let held = s.wait_message("app", conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    assert!(held.contains(&prefix) && !held.contains(&format!("{key:?}")), "{held}");
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, before, "lost content rolled\n{}", s.log());

    // The go-ahead: a change of the spec.
    let patch = json!({"spec": {"rollout": {"quietPeriod": "1s"}}});
    s.bindings().patch("app", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let rolled = || async { Ok(s.generation("web").await > before) };
    wait_for("the go-ahead to roll", Duration::from_secs(30), rolled).await.unwrap();
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, before + 1, "the go-ahead rolled more than once\n{}", s.log());

    // Later changes roll as usual, each once.
    consul.put(&format!("{prefix}a"), b"off", None).await.unwrap();
    let rolled = || async { Ok(s.generation("web").await > before + 1) };
    wait_for("the next change to roll", Duration::from_secs(20), rolled).await.unwrap();
    s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, before + 2, "{}", s.log());
    s.finish().await;
}

/// Data lost while no controller ran is held when the paths share one read, as it is when each
/// is read alone.
#[tokio::test]
async fn data_lost_while_no_controller_ran_is_held_when_paths_share_a_read() {
    let _agent = AGENT.lock().await;
    let consul = faults_consul().await;
    let args = [faults_addr(), GRACE.into(), "--consul-restore-grace=3s".into(), "--consul-max-connections=4".into()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let Some(mut s) = Scene::with_args("shared-loss", &args).await else { return };
    lift_index(&consul, &s).await;
    let names = ["one", "two", "three"];
    for name in names {
        let prefix = s.key(&format!("{name}/"));
        consul.put(&format!("{prefix}a"), b"on", None).await.unwrap();
        consul.put(&format!("{prefix}b"), b"on", None).await.unwrap();
        s.workload(DEPLOY, name, json!({})).await;
        let keys = json!([{"key": prefix, "recurse": true, "optional": true}]);
        s.binding(name, spec(keys, deploy(name), "0s")).await;
    }
    let mut generations = Vec::new();
    for name in names {
        s.wait_condition(name, conditions::READY, "True", reason::BASELINED).await;
        generations.push(s.generation(name).await);
    }
    let watches = s.controller().get("/debug/watches").await;
    let watches: serde_json::Value = serde_json::from_str(&watches).unwrap();
    let read_by: Vec<&str> = watches.as_array().unwrap().iter().filter_map(|w| w["read_by"].as_str()).collect();
    assert!(read_by.len() == 3 && read_by.iter().all(|r| *r == read_by[0]), "not one shared read: {watches}");

    s.stop_controller().await;
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    s.start_controller(&args).await;
    for name in names {
        s.wait_condition(name, conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    }
    tokio::time::sleep(Duration::from_secs(3) + SETTLE).await;
    for (name, generation) in names.iter().zip(generations) {
        assert_eq!(s.generation(name).await, generation, "{name} rolled lost content\n{}", s.log());
        s.wait_condition(name, conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    }
    s.finish().await;
}

/// Writes key `x`, then 100 keys under `bulk/`, so that the agent's index ends about 100 above
/// the key's own.
async fn key_then_bulk(consul: &Consul, s: &Scene) -> (String, String) {
    let (key, bulk) = (s.key("x"), s.key("bulk/"));
    consul.put(&key, b"v1", None).await.unwrap();
    for i in 0..100 {
        consul.put(&format!("{bulk}{i:03}"), b"on", None).await.unwrap();
    }
    (key, bulk)
}

/// Writes elsewhere until the agent's index is past `own`; returns the index reached.
async fn write_past(consul: &Consul, s: &Scene, own: u64) -> u64 {
    let elsewhere = s.key("elsewhere");
    let mut index = 0;
    for i in 0..200 {
        consul.put(&elsewhere, i.to_string().as_bytes(), None).await.unwrap();
        index = consul.get(&consul_kv::KvQuery::exact(&elsewhere), 0).await.unwrap().index;
        if index > own + 5 {
            break;
        }
    }
    index
}

/// Writes elsewhere, to lift the agent's index well above where a rebuilt agent starts.
pub(crate) async fn lift_index(consul: &Consul, s: &Scene) {
    for i in 0..60 {
        consul.put(&s.key("elsewhere"), i.to_string().as_bytes(), None).await.unwrap();
    }
}

/// Freezes the agent: connections stay open and nothing answers. Seen within 15 s, Ready
/// within 5 s of the agent answering again, and no rollout either way (`web` has `revisions`).
async fn frozen_then_back(s: &Scene, revisions: usize) {
    s.wait_condition("required", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_condition("optional", conditions::READY, "True", reason::UP_TO_DATE).await;
    let api = s.revisions(DEPLOY, "api").await;
    let frozen = tokio::task::spawn_blocking(|| xtask(&["consul-hang", "--seconds=25"]));
    let hung_at = tokio::time::Instant::now();
    s.wait_condition("required", conditions::CONSUL_SYNCED, "False", reason::CONSUL_UNREACHABLE).await;
    let seen = hung_at.elapsed();
    assert!(seen < Duration::from_secs(15), "a hung agent showed after {seen:?}\n{}", s.log());
    frozen.await.unwrap();
    let back = tokio::time::Instant::now();
    s.wait_condition("required", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_condition("optional", conditions::READY, "True", reason::UP_TO_DATE).await;
    assert!(back.elapsed() < Duration::from_secs(5), "Ready {:?} after the agent answered again", back.elapsed());
    s.wait_revisions(DEPLOY, "web", revisions).await;
    s.wait_revisions(DEPLOY, "api", api).await;
}

/// A key watched alone that a rebuilt agent no longer has, with the agent written past the
/// key's own index before the watch reads again: Consul answers the missing key with its
/// table's index, above the key's, and only the higher index another path showed of that table
/// tells the loss from a deletion.
#[tokio::test]
async fn a_key_alone_lost_in_a_rebuild_written_past_its_index_is_held() {
    let _agent = AGENT.lock().await;
    let consul = faults_consul().await;
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    let (addr, restore) = (faults_addr(), "--consul-restore-grace=3s");
    let Some(s) = Scene::with_args("alone-lost", &[&addr, GRACE, restore]).await else { return };
    let (key, bulk) = key_then_bulk(&consul, &s).await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.workload(DEPLOY, "api", json!({})).await;
    s.binding("alone", spec(json!([{"key": key, "optional": true}]), deploy("web"), "0s")).await;
    s.binding("bulk", spec(json!([{"key": bulk, "recurse": true, "optional": true}]), deploy("api"), "0s")).await;
    let baselined = s.wait_condition("alone", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    let own = baselined.keys[0].modify_index.unwrap();
    s.wait_condition("bulk", conditions::READY, "True", reason::BASELINED).await;
    let before = s.generation("web").await;

    // Frozen while the agent is rebuilt and written past the key's own index, below bulk's.
    let pid = s.controller().pid().to_string();
    let signal = |sig: &str| std::process::Command::new("kill").args([sig, &pid]).status().unwrap();
    assert!(signal("-STOP").success());
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    let index = write_past(&consul, &s, own).await;
    assert!(signal("-CONT").success());
    assert!(index < own + 100, "the agent was written past bulk's index too: {index}");

    let held = s.wait_message("alone", conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    assert!(held.contains(&format!("{key:?}")), "{held}");
    tokio::time::sleep(Duration::from_secs(3) + SETTLE).await;
    assert_eq!(s.generation("web").await, before, "a lost key was rolled out as a deletion\n{}", s.log());
    s.finish().await;
}

/// The same loss while no controller ran: the status's highest recorded index of the binding's
/// keys, all of one store, is a floor for the index a missing key answers.
#[tokio::test]
async fn a_key_lost_while_no_controller_ran_in_a_rebuild_written_past_its_index_is_held() {
    let _agent = AGENT.lock().await;
    let consul = faults_consul().await;
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    let args = [faults_addr(), GRACE.into(), "--consul-restore-grace=3s".into()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let Some(mut s) = Scene::with_args("first-read-lost", &args).await else { return };
    let (key, bulk) = key_then_bulk(&consul, &s).await;
    s.workload(DEPLOY, "web", json!({})).await;
    let keys = json!([{"key": key, "optional": true}, {"key": bulk, "recurse": true, "optional": true}]);
    s.binding("app", spec(keys, deploy("web"), "0s")).await;
    let baselined = s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    let own = baselined.keys[0].modify_index.unwrap();
    let before = s.generation("web").await;

    s.stop_controller().await;
    tokio::task::spawn_blocking(|| restart(true, Duration::from_secs(1))).await.unwrap();
    // The prefix keeps a key, so its index says nothing; the missing key answers the store's.
    consul.put(&format!("{bulk}000"), b"on", None).await.unwrap();
    let index = write_past(&consul, &s, own).await;
    assert!(index < own + 100, "the agent was written past bulk's index too: {index}");
    s.start_controller(&args).await;

    let held = s.wait_message("app", conditions::READY, "False", reason::CONSUL_INDEX_RESET).await;
    assert!(held.contains(&format!("{key:?}")), "{held}");
    tokio::time::sleep(Duration::from_secs(3) + SETTLE).await;
    assert_eq!(s.generation("web").await, before, "a lost key was rolled out as a deletion\n{}", s.log());
    s.finish().await;
}

/// A hold written by a release before each lost key was marked names the lost keys in its
/// Ready message alone. After the upgrade only those hold: an optional key that was empty all
/// along holds nothing, and the named key back with other content rolls once.
#[tokio::test]
async fn an_upgrade_during_a_hold_holds_only_the_keys_the_older_status_named() {
    let Some(mut s) = Scene::with_args("upgrade-hold", &["--consul-restore-grace=3s"]).await else { return };
    let (key, never) = (s.key("x"), s.key("never"));
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    let keys = json!([{"key": key, "optional": true}, {"key": never, "optional": true}]);
    s.binding("app", spec(keys, deploy("web"), "0s")).await;
    s.wait_condition("app", conditions::READY, "True", reason::BASELINED).await;
    let before = s.generation("web").await;
    s.stop_controller().await;

    // As that release left it: x lost in a reset, no marks, no observed spec; x came back
    // meanwhile with other content.
    let message = format!(
        "Consul's index went backwards (a snapshot restore or a rebuilt cluster?) just as {key:?} became empty; \
         rollouts are held until the content is back. To roll out the empty content, change this binding's spec"
    );
    let held = json!({"status": {"observedSpec": null, "conditions": [{"type": "Ready", "status": "False",
        "reason": "ConsulIndexReset", "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    s.bindings().patch_status("app", &PatchParams::default(), &Patch::Merge(&held)).await.unwrap();
    s.put(&key, "v2").await;
    s.start_controller(&["--consul-restore-grace=3s"]).await;

    let rolled = || async { Ok(s.generation("web").await > before) };
    wait_for("the change to roll after the restore grace", Duration::from_secs(30), rolled).await.unwrap();
    let status = s.wait_condition("app", conditions::READY, "True", reason::UP_TO_DATE).await.status.unwrap();
    assert!(status.keys.iter().all(|k| !k.lost), "{:?}", status.keys);
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, before + 1, "{}", s.log());
    s.finish().await;
}
