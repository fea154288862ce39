//! The controller's watches served by an API server that goes away and comes back with a fresh
//! watch cache: resuming from the old resource version is refused (410 Gone), and each cache
//! lists again, in pages of 500.

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use consulbind_api::conditions::{READY, reason};

use crate::support::{SETTLE, Scene, controller_kubeconfig, deploy, wait_for, workload};

/// Enough objects of each kind that a list takes two pages, after the bound ones.
const FILLER: usize = 600;

/// `cargo xtask env second-apiserver [--stop]`.
fn second_apiserver(up: bool) {
    crate::support::xtask_env(if up { &["second-apiserver"] } else { &["second-apiserver", "--stop"] });
}

/// The tests here start and stop the one second API server: one at a time.
static SECOND: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Stops the second API server when the test ends, however it ends.
struct Second;

impl Second {
    fn start() -> Self {
        second_apiserver(true);
        Self
    }
}

impl Drop for Second {
    fn drop(&mut self) {
        second_apiserver(false);
    }
}

/// The controller's own kubeconfig, pointed at the second API server.
fn kubeconfig_of_second() -> std::path::PathBuf {
    let own = std::fs::read_to_string(controller_kubeconfig()).unwrap();
    let port: u16 =
        own.split("https://127.0.0.1:").nth(1).and_then(|r| r[..5].parse().ok()).expect("a loopback server");
    let second = own.replace(&format!("https://127.0.0.1:{port}"), &format!("https://127.0.0.1:{}", port + 1));
    let path = controller_kubeconfig().with_extension("second.kubeconfig");
    std::fs::write(&path, second).unwrap();
    path
}

fn config_map(name: &str, value: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": value}})
}

/// What changed while the controller's API server was away is seen as soon as the caches have
/// listed again, not at the next resync ten minutes on: a bound ConfigMap edited rolls its target
/// once, and a reference the template gained is recorded, so that an edit of it rolls. The bound
/// objects come first in each list, on its first page: a binding woken before the last page would
/// read the cache from before, and nothing would wake it again.
#[tokio::test]
async fn changes_made_while_the_api_server_was_away_are_seen_at_the_relist_and_roll_once() {
    let Some(mut s) = Scene::without_controller("relist").await else { return };
    let _alone = SECOND.lock().await;
    let filler = futures::stream::iter(0..FILLER)
        .map(|i| {
            let s = &s;
            async move {
                let name = format!("filler-{i:03}");
                s.apply(config_map(&name, "x")).await.unwrap();
                let mut manifest = workload("Deployment", &name, json!({}));
                manifest["spec"]["replicas"] = json!(0);
                s.apply(manifest).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>();
    filler.await;
    s.apply(config_map("a-cm", "v1")).await.unwrap();
    s.apply(config_map("a-ref", "v1")).await.unwrap();
    s.workload("Deployment", "a-web", json!({})).await;

    let second = Second::start();
    let kubeconfig = kubeconfig_of_second().display().to_string();
    s.start_controller_with_env(&[], &[("KUBECONFIG", &kubeconfig)]).await;
    let spec = json!({"configMaps": [{"name": "a-cm"}], "targets": deploy("a-web"),
        "includeTargetReferences": true, "rollout": {"quietPeriod": "0s"}});
    s.binding("b", spec).await;
    s.wait_condition("b", consulbind_api::conditions::READY, "True", consulbind_api::conditions::reason::BASELINED)
        .await;
    let before = s.generation("a-web").await;

    drop(second);
    s.apply(config_map("a-cm", "v2")).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("a-web").await, before, "nothing can be seen while the API server is away");
    let second = Second::start();

    let rolled = || async { Ok(s.generation("a-web").await > before) };
    wait_for("a-web rolled after the re-list", Duration::from_secs(90), rolled).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("a-web").await, before + 1, "one rollout for one change");
    let log = s.log();
    let lists = log.lines().filter(|l| l.contains("objects: listed kind=ConfigMap")).count();
    assert!(lists >= 2, "the ConfigMaps were listed again after the API server came back:\n{log}");

    // Away again, while the template comes to reference `a-ref`: Kubernetes rolls it for that.
    drop(second);
    let mut web = workload("Deployment", "a-web", json!({}));
    web["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "a-ref"}}]);
    s.apply(web).await.unwrap();
    let second = Second::start();
    let referenced = || async {
        let status = s.get_binding("b").await.status.unwrap_or_default();
        Ok(status.objects.iter().any(|o| o.name == "a-ref" && o.referenced))
    };
    wait_for("the binding to record the reference", Duration::from_secs(90), referenced).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("a-web").await, before + 2, "the template change alone rolled it");
    s.apply(config_map("a-ref", "v2")).await.unwrap();
    let rolled = || async { Ok(s.generation("a-web").await > before + 2) };
    wait_for("a-web rolled for its new reference", Duration::from_secs(30), rolled).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("a-web").await, before + 3, "one rollout for one change");
    s.finish().await;
    drop(second);
}

/// A binding deleted and made again while the controller's API server was away (a GitOps tool
/// that replaces it) is new to the controller once its watch has listed again: its deletion was
/// never seen, and the new one, the same spec under the same name, still gets its first status.
/// Before, the record of the old one took it for a version already seen, and nothing reconciled
/// it until the next resync.
#[tokio::test]
async fn a_binding_made_again_while_the_api_server_was_away_is_reconciled_at_the_relist() {
    let Some(mut s) = Scene::without_controller("relist-remade").await else { return };
    let _alone = SECOND.lock().await;
    s.apply(config_map("app", "v1")).await.unwrap();
    s.workload("Deployment", "web", json!({})).await;
    let second = Second::start();
    let kubeconfig = kubeconfig_of_second().display().to_string();
    s.start_controller_with_env(&[], &[("KUBECONFIG", &kubeconfig)]).await;
    let spec = json!({"configMaps": [{"name": "app"}], "targets": deploy("web"), "rollout": {"quietPeriod": "0s"}});
    s.binding("b", spec.clone()).await;
    let first = s.wait_condition("b", READY, "True", reason::BASELINED).await;
    let before = s.generation("web").await;

    drop(second);
    s.bindings().delete("b", &Default::default()).await.unwrap();
    let gone = || async { Ok(s.bindings().get_opt("b").await.unwrap().is_none()) };
    wait_for("the binding to go", Duration::from_secs(30), gone).await.unwrap();
    s.binding("b", spec).await;
    let _second = Second::start();
    let again = s.wait_condition("b", READY, "True", reason::BASELINED).await;
    assert_ne!(again.metadata.uid, first.metadata.uid, "the same object");
    tokio::time::sleep(SETTLE).await;
    assert_eq!(s.generation("web").await, before, "made again, it rolled");
    s.finish().await;
}
