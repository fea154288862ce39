//! More distinct keys than Consul lets one client hold connections for.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use consulbind_api::conditions::{self, reason};
use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::json;

use crate::support::{Scene, connections_to, wait_for};

const BINDINGS: usize = 300;
const BUDGET: usize = 16;

/// 300 bindings, each on a key of its own and one key they all share: 301 keys, more than
/// Consul's default of 200 connections per client, on a budget of 16 connections.
#[tokio::test]
async fn more_keys_than_consul_allows_connections_share_a_few_queries() {
    let Some(s) = Scene::without_controller("scale").await else {
        return;
    };
    let budget = format!("--consul-max-connections={BUDGET}");
    let port: u16 = std::env::var("CONSUL_HTTP_ADDR").unwrap().rsplit(':').next().unwrap().parse().unwrap();
    let (s, most) = bind_and_roll(s, BINDINGS, &[&budget], &[], port).await;
    assert!(most <= BUDGET, "the controller held {most} connections to Consul, over its budget of {BUDGET}");
    let groups = s.controller().metric("consulbind_consul_watch_groups").await.unwrap();
    assert!(groups <= BUDGET as f64, "{groups} blocking queries for a budget of {BUDGET}");
    assert_eq!(s.controller().metric("consulbind_consul_watches").await, Some(BINDINGS as f64 + 1.0));
    s.finish().await;
}

/// Over TLS, Consul speaks HTTP/2: every blocking query and read shares one connection, so the
/// connection budget does not limit the queries. Four connections would allow one blocking
/// query over HTTP/1.1; here every key has its own.
#[tokio::test]
async fn over_tls_every_query_shares_one_connection() {
    let Some((address, ca)) = crate::support::tls_consul() else { return };
    let Some(s) = Scene::without_controller("tls").await else {
        return;
    };
    let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
    let envs = [("CONSUL_HTTP_ADDR", address.as_str()), ("CONSUL_CACERT", ca.as_str())];
    let (s, most) = bind_and_roll(s, 30, &["--consul-max-connections=4"], &envs, port).await;
    assert_eq!(most, 1, "the controller held {most} connections to Consul's HTTPS port, not one");
    let groups = s.controller().metric("consulbind_consul_watch_groups").await.unwrap();
    assert_eq!(groups, 31.0, "{groups} blocking queries for 31 keys: the connection budget limited the streams");
    s.finish().await;
}

/// Applies `bindings` Deployments and bindings, each on a key of its own and one they all
/// share, starts the controller, waits until every binding is baselined, changes the shared key
/// and checks that every Deployment rolled exactly once. Returns the most connections the
/// controller held to `port` meanwhile.
async fn bind_and_roll(
    mut s: Scene,
    bindings: usize,
    args: &[&str],
    envs: &[(&str, &str)],
    port: u16,
) -> (Scene, usize) {
    let shared = s.key("shared");
    s.put(&shared, "v1").await;
    let names: Vec<String> = (0..bindings).map(|i| format!("app-{i:03}")).collect();
    stream::iter(&names)
        .for_each_concurrent(16, |name| {
            let s = &s;
            async move {
                s.put(&s.key(&format!("own/{name}")), "own").await;
                s.apply(deployment(name)).await.unwrap();
            }
        })
        .await;

    s.start_controller_with_env(args, envs).await;
    let pid = s.controller().pid();
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (most, done) = (most.clone(), done.clone());
        async move {
            while !done.load(Ordering::Relaxed) {
                most.fetch_max(connections_to(pid, port), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });

    stream::iter(&names)
        .for_each_concurrent(16, |name| {
            let (s, shared) = (&s, &shared);
            async move {
                let keys = json!([{"key": shared}, {"key": s.key(&format!("own/{name}"))}]);
                let spec = json!({"keys": keys, "targets": [{"kind": "Deployment", "name": name}],
                                  "rollout": {"quietPeriod": "0s"}});
                s.binding(name, spec).await;
            }
        })
        .await;
    let ready = |s: &Scene| {
        let s = s.bindings();
        async move {
            let list = s.list(&Default::default()).await?;
            let ready = list.items.iter().filter(|b| {
                let conditions = b.status.iter().flat_map(|s| &s.conditions);
                conditions.into_iter().any(|c| c.type_ == conditions::READY && c.reason == reason::BASELINED)
            });
            Ok(ready.count() == bindings)
        }
    };
    if let Err(error) = wait_for("every binding baselined", Duration::from_secs(120), || ready(&s)).await {
        panic!("{error}\n{}", s.log());
    }

    // A rollout is a new pod template, which moves the generation; the ReplicaSets follow at
    // kube-controller-manager's pace, which is not what this test measures.
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.ns);
    let generations = || async {
        let list = deployments.list(&Default::default()).await.unwrap();
        list.items.iter().map(|d| d.metadata.generation.unwrap_or_default()).collect::<Vec<_>>()
    };
    assert!(generations().await.iter().all(|&g| g == 1));
    s.put(&shared, "v2").await;
    let rolled = || async { Ok(generations().await.iter().filter(|&&g| g >= 2).count() == bindings) };
    if let Err(error) = wait_for("every Deployment rolled", Duration::from_secs(60), rolled).await {
        panic!("{error}\n{}", s.log());
    }
    tokio::time::sleep(crate::support::SETTLE).await;
    assert!(generations().await.iter().all(|&g| g == 2), "a Deployment rolled more than once");
    done.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    let most = most.load(Ordering::Relaxed);
    assert!(most >= 1, "the sampler saw no Consul connection at all, so it measured nothing");
    (s, most)
}

fn deployment(name: &str) -> serde_json::Value {
    // No replicas: a rollout still makes a new ReplicaSet, and no Pods load the servers.
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {
        "replicas": 0,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]}},
    }})
}
