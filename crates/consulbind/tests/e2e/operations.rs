//! Running it for real: leader election, metrics, health and logs.

use std::time::Duration;

use consulbind_api::conditions::{self, reason};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

use crate::support::{Controller, SYSTEM_NS, Scene, connections_to, deploy, spec, wait};

const DEPLOY: &str = "Deployment";

/// The Lease lives where config/ lets the controller keep it, under a name of this test's own.
fn ha_args(ns: &str, identity: &str) -> Vec<String> {
    vec![
        "--leader-elect=true".into(),
        format!("--lease-namespace={SYSTEM_NS}"),
        format!("--lease-name={ns}"),
        "--lease-duration=6s".into(),
        "--lease-renew=1s".into(),
        format!("--identity={identity}"),
    ]
}

async fn start(ns: &str, identity: &str) -> Controller {
    let args = ha_args(ns, identity);
    Controller::start(ns, &args.iter().map(String::as_str).collect::<Vec<_>>()).await.unwrap()
}

#[tokio::test]
async fn standby_takes_over_after_the_leader_dies_without_duplicate_or_missed_rollouts() {
    let Some(s) = Scene::without_controller("ha").await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.wait_revisions(DEPLOY, "web", 1).await;

    let first = start(&s.ns, "replica-a").await;
    wait("replica-a to lead", || async { Ok(first.metric("consulbind_leader").await == Some(1.0)) }).await.unwrap();
    let second = start(&s.ns, "replica-b").await;
    // A standby is ready, but not the leader.
    assert_eq!(second.metric("consulbind_leader").await, Some(0.0));

    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    assert_eq!(second.metric("consulbind_consul_watches").await, Some(0.0), "the standby watches Consul");

    first.kill().await;
    s.put(&key, "v3").await;
    let took = std::time::Instant::now();
    wait("replica-b to lead", || async { Ok(second.metric("consulbind_leader").await == Some(1.0)) }).await.unwrap();
    assert!(took.elapsed() < Duration::from_secs(6 + 3), "took over after {:?}", took.elapsed());
    s.wait_revisions(DEPLOY, "web", 3).await;
    let leases = Api::<Lease>::namespaced(s.client.clone(), SYSTEM_NS);
    assert_eq!(leases.get(&s.ns).await.unwrap().spec.unwrap().holder_identity.as_deref(), Some("replica-b"));

    // SIGTERM hands the lease back at once.
    second.stop().await;
    assert_eq!(leases.get(&s.ns).await.unwrap().spec.unwrap().holder_identity, None);
    s.finish().await;
}

#[tokio::test]
async fn metrics_health_and_json_logs_describe_the_work() {
    let Some(s) = Scene::with_args("observe", &["--log-format=json"]).await else { return };
    let c = s.controller();
    assert_eq!(c.get("/livez").await, "ok");
    assert_eq!(c.get("/readyz").await, "ok");
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;

    let metrics = c.get("/metrics").await;
    let rollout = format!("consulbind_rollouts_total{{namespace=\"{}\",binding=\"cfg\",kind=\"Deployment\"}} 1", s.ns);
    for expected in [
        rollout.as_str(),
        "consulbind_consul_watches 1",
        "consulbind_bindings{ready=\"True\"} 1",
        "consulbind_change_to_rollout_seconds_count 1",
        "consulbind_leader 1",
        "consulbind_reconciles_total{result=\"ok\"}",
        "consulbind_reconcile_duration_seconds_count{result=\"ok\"}",
        "consulbind_consul_requests_total{result=\"ok\"}",
        "consulbind_consul_request_duration_seconds_count",
    ] {
        assert!(metrics.contains(expected), "missing {expected:?} in\n{metrics}");
    }

    let log = s.log();
    let lines: Vec<serde_json::Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let rolled = lines.iter().find(|l| l["fields"]["message"] == "rolled out a change").expect("a rollout log line");
    assert_eq!(rolled["fields"]["binding"], format!("{}/cfg", s.ns));
    s.finish().await;
}

/// With `--api-http2=true` its requests and watches share one connection to the API server
/// while they number fewer than a connection carries, however many reconciles run at once:
/// over HTTP/1.1 each request in flight and each watch holds its own.
#[tokio::test]
async fn over_http2_requests_and_watches_share_one_connection_to_the_api_server() {
    let Some(s) = Scene::with_args("one-conn", &["--api-http2=true"]).await else { return };
    let key = s.key("config");
    s.put(&key, "v1").await;
    let names: Vec<String> = (0..20).map(|i| format!("web{i}")).collect();
    for name in &names {
        s.workload(DEPLOY, name, json!({})).await;
    }
    let bindings = names.iter().map(|name| s.binding(name, spec(json!([{"key": key}]), deploy(name), "0s")));
    futures::future::join_all(bindings).await;
    for name in &names {
        s.wait_condition(name, conditions::READY, "True", reason::BASELINED).await;
    }
    s.put(&key, "v2").await;
    for name in &names {
        s.wait_revisions(DEPLOY, name, 2).await;
    }
    let server = kube::Config::infer().await.unwrap().cluster_url;
    let port = server.port_u16().expect("the API server's port");
    assert_eq!(connections_to(s.controller().pid(), port), 1, "connections to {server}");
    s.finish().await;
}
