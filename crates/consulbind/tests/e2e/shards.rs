//! Three sharded controllers share the bindings of thirty namespaces: a crash, a restart and a
//! partition move namespaces between them, each change rolls once, and a replica cut off past
//! its Lease writes nothing when it comes back.

use std::{collections::BTreeMap, time::Duration};

use consulbind_api::ConsulBinding;
use k8s_openapi::api::{apps::v1::Deployment, coordination::v1::Lease, core::v1::Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use consulbind::{cluster::policy::PREFIXES_ANNOTATION, shards::View};

use crate::support::{self, Controller, SYSTEM_NS, Scene, deploy, spec, wait, wait_for, workload};

const NAMESPACES: usize = 30;
const LEASE_SECS: u64 = 6;
/// It speaks HTTP/2 to the API server: thirty scopes' watches are more than one connection
/// carries.
const OVER_HTTP2: &str = "replica-a";

struct Ring {
    scene: Scene,
    namespaces: Vec<String>,
}

impl Ring {
    fn key(&self, ns: &str) -> String {
        format!("{}/{ns}", self.scene.ns)
    }

    async fn start(&self, identity: &str) -> Controller {
        let args = [
            format!("--api-http2={}", identity == OVER_HTTP2),
            "--sharding=true".to_owned(),
            format!("--lease-namespace={SYSTEM_NS}"),
            format!("--shard-ring={}", self.scene.ns),
            format!("--lease-duration={LEASE_SECS}s"),
            "--lease-renew=1s".to_owned(),
            format!("--identity={identity}"),
            format!("--namespaces={}", self.namespaces.join(",")),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Controller::start(&format!("{}-{identity}", self.scene.ns), &args).await.unwrap()
    }

    async fn binding(&self, ns: &str) -> ConsulBinding {
        Api::<ConsulBinding>::namespaced(self.scene.client.clone(), ns).get("cfg").await.unwrap()
    }

    /// Each namespace's binding's `status.shard`.
    async fn shards(&self) -> BTreeMap<String, Option<String>> {
        let mut shards = BTreeMap::new();
        for ns in &self.namespaces {
            shards.insert(ns.clone(), self.binding(ns).await.status.and_then(|s| s.shard));
        }
        shards
    }

    async fn generation(&self, ns: &str) -> i64 {
        let api = Api::<Deployment>::namespaced(self.scene.client.clone(), ns);
        api.get("web").await.unwrap().metadata.generation.unwrap_or_default()
    }

    async fn generations(&self) -> BTreeMap<String, i64> {
        let mut generations = BTreeMap::new();
        for ns in &self.namespaces {
            generations.insert(ns.clone(), self.generation(ns).await);
        }
        generations
    }

    /// Waits until the replicas `live` agree on one ring of exactly them, each serving, then until
    /// every binding names one of them, and each counts its own.
    async fn settled(&self, live: &[(&str, &Controller)]) -> BTreeMap<String, Option<String>> {
        let names: Vec<&str> = live.iter().map(|(n, _)| *n).collect();
        let leases = Api::<Lease>::namespaced(self.scene.client.clone(), SYSTEM_NS);
        let selector = format!("consulbind.dev/ring={}", self.scene.ns);
        let agreed = || async {
            // Each live replica's Lease shows the view of exactly the live replicas.
            let listed = leases.list(&ListParams::default().labels(&selector)).await?.items;
            let holder = |l: &Lease| l.spec.clone().and_then(|s| s.holder_identity).unwrap_or_default();
            let theirs: Vec<&Lease> = listed.iter().filter(|l| names.contains(&holder(l).as_str())).collect();
            let members =
                theirs.iter().map(|l| (holder(l), l.spec.clone().and_then(|s| s.lease_transitions).unwrap_or(0)));
            let digest = View::new(members, BTreeMap::new()).digest();
            let shown = |l: &&Lease| {
                l.metadata.annotations.as_ref().and_then(|a| a.get("consulbind.dev/view")) == Some(&digest)
            };
            let mut serving = theirs.len() == names.len() && theirs.iter().all(shown);
            for (_, controller) in live {
                serving &= controller.metric("consulbind_leader").await == Some(1.0);
            }
            Ok(serving)
        };
        if let Err(error) = wait_for("the replicas to agree on the ring", Duration::from_secs(60), agreed).await {
            panic!("{error}");
        }
        let served = || async {
            let shards = self.shards().await;
            let named = shards.values().all(|s| s.as_deref().is_some_and(|s| names.contains(&s)));
            let mut counted = true;
            for (name, controller) in live {
                let theirs = shards.values().filter(|s| s.as_deref() == Some(*name)).count() as f64;
                counted &= served_by(controller, name).await == Some(theirs);
            }
            Ok(named && counted)
        };
        if let Err(error) = wait_for("every binding served by a live replica", Duration::from_secs(60), served).await {
            panic!("{error}: {:?}", self.shards().await);
        }
        self.shards().await
    }
}

/// A replica's `consulbind_shard_bindings{shard="name"}`.
async fn served_by(controller: &Controller, name: &str) -> Option<f64> {
    let body = controller.get("/metrics").await;
    let series = format!("consulbind_shard_bindings{{shard=\"{name}\"}} ");
    body.lines().find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
}

async fn pid_signal(controller: &Controller, signal: &str) {
    let status =
        std::process::Command::new("kill").arg(format!("-{signal}")).arg(controller.pid().to_string()).status();
    assert!(status.unwrap().success(), "kill -{signal}");
}

#[tokio::test]
async fn sharded_replicas_hand_namespaces_over_on_a_crash_a_restart_and_a_partition_rolling_each_change_once() {
    let Some(scene) = Scene::without_controller("shards").await else { return };
    let namespaces: Vec<String> = (0..NAMESPACES).map(|i| format!("{}-{i}", scene.ns)).collect();
    let ring = Ring { scene, namespaces };
    let client = ring.scene.client.clone();
    let all: Api<Namespace> = Api::all(client.clone());
    for ns in &ring.namespaces {
        let _ = all.delete(ns, &DeleteParams::default()).await;
        wait("old namespace to go", || async { Ok(all.get_opt(ns).await?.is_none()) }).await.unwrap();
        let namespace = json!({"metadata": {"name": ns, "annotations": {(PREFIXES_ANNOTATION): "*"}}});
        all.create(&PostParams::default(), &serde_json::from_value(namespace).unwrap()).await.unwrap();
        ring.scene.put(&ring.key(ns), "v1").await;
        let apply = PatchParams::apply("e2e-test").force();
        let web = workload("Deployment", "web", json!({}));
        Api::<Deployment>::namespaced(client.clone(), ns).patch("web", &apply, &Patch::Apply(&web)).await.unwrap();
        let binding = json!({
            "apiVersion": "consulbind.dev/v1alpha1",
            "kind": "ConsulBinding",
            "metadata": {"name": "cfg"},
            "spec": spec(json!([{"key": ring.key(ns)}]), deploy("web"), "0s"),
        });
        let bindings = Api::<ConsulBinding>::namespaced(client.clone(), ns);
        bindings.patch("cfg", &apply, &Patch::Apply(&binding)).await.unwrap();
    }

    let names = ["replica-a", "replica-b", "replica-c"];
    let mut replicas = Vec::new();
    for name in names {
        replicas.push(Some(ring.start(name).await));
    }
    let shards = ring.settled(&running(&names, &replicas)).await;
    for ns in &ring.namespaces {
        let binding = ring.binding(ns).await;
        let ready = support::ready(&binding).unwrap();
        assert_eq!(ready.status, "True", "{ns}: {}", ready.message);
    }
    // Over HTTP/2 thirty scopes' watches spread over a few connections; over HTTP/1.1 each
    // holds one of its own.
    let port = kube::Config::infer().await.unwrap().cluster_url.port_u16().expect("the API server's port");
    for (name, replica) in names.iter().zip(replicas.iter().flatten()) {
        let connections = support::connections_to(replica.pid(), port);
        match *name == OVER_HTTP2 {
            true => assert!((2..=8).contains(&connections), "{name}: {connections} HTTP/2 connections"),
            false => assert!(connections > NAMESPACES, "{name}: {connections} HTTP/1.1 connections"),
        }
    }
    let leases = Api::<Lease>::namespaced(client.clone(), SYSTEM_NS);
    let selector = format!("consulbind.dev/ring={}", ring.scene.ns);
    let listed = leases.list(&ListParams::default().labels(&selector)).await.unwrap();
    assert_eq!(listed.items.len(), 3, "one Lease per replica in the ring");
    let start = ring.generations().await;

    // SIGKILL the replica with the most namespaces, and change the content of each at once.
    let count = |shards: &BTreeMap<String, Option<String>>, name: &str| {
        shards.values().filter(|s| s.as_deref() == Some(name)).count()
    };
    let victim = (0..3).max_by_key(|i| count(&shards, names[*i])).unwrap();
    let moved: Vec<String> =
        ring.namespaces.iter().filter(|ns| shards[*ns].as_deref() == Some(names[victim])).cloned().collect();
    replicas[victim].take().unwrap().kill().await;
    let killed = std::time::Instant::now();
    for ns in &moved {
        ring.scene.put(&ring.key(ns), "v2").await;
    }
    let rolled = || async {
        let mut all = true;
        for ns in &moved {
            all &= ring.generation(ns).await > start[ns];
        }
        Ok(all)
    };
    wait_for("the moved namespaces to roll", Duration::from_secs(60), rolled).await.unwrap();
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(LEASE_SECS + 8), "the others took over after {took:?}");
    let after_crash = ring.settled(&running(&names, &replicas)).await;
    assert!(moved.iter().all(|ns| after_crash[ns].as_deref() != Some(names[victim])));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let handed = ring.generations().await;
    for ns in &ring.namespaces {
        let want = start[ns] + i64::from(moved.contains(ns));
        assert_eq!(handed[ns], want, "{ns}: one rollout for a change made during the handover, none elsewhere");
    }

    // Started again, it takes its namespaces back, with no rollout.
    replicas[victim] = Some(ring.start(names[victim]).await);
    let placed = || async { Ok(ring.shards().await == shards) };
    if let Err(error) = wait_for("the ring to place each namespace as before", Duration::from_secs(60), placed).await {
        panic!("{error}: {:?} against {shards:?}", ring.shards().await);
    }
    let back = ring.settled(&running(&names, &replicas)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(ring.generations().await, handed, "a rebalance rolls nothing");

    // SIGSTOP a replica past its Lease: the others serve its namespaces and roll a change made
    // meanwhile; resumed, it exits without a write.
    let cut = (0..3).find(|i| count(&back, names[*i]) > 0).unwrap();
    let ns = ring.namespaces.iter().find(|ns| back[*ns].as_deref() == Some(names[cut])).unwrap().clone();
    let frozen = replicas[cut].take().unwrap();
    pid_signal(&frozen, "STOP").await;
    ring.scene.put(&ring.key(&ns), "v3").await;
    let others: Vec<(&str, &Controller)> = running(&names, &replicas);
    ring.settled(&others).await;
    wait_for("the change to roll", Duration::from_secs(60), || async { Ok(ring.generation(&ns).await > handed[&ns]) })
        .await
        .unwrap();
    pid_signal(&frozen, "CONT").await;
    let exited = frozen.wait_exit(Duration::from_secs(10)).await;
    assert!(exited.is_some_and(|status| !status.success()), "a replica resumed past its fence exits");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(ring.generation(&ns).await, handed[&ns] + 1, "the change rolled once");

    for controller in replicas.into_iter().flatten() {
        controller.stop().await;
    }
    // SIGTERM deletes a replica's Lease; the one that exited past its fence leaves its own.
    let listed = leases.list(&ListParams::default().labels(&selector)).await.unwrap();
    let left: Vec<String> = listed.items.iter().filter_map(|l| l.spec.clone()?.holder_identity).collect();
    assert_eq!(left, [names[cut]], "the replicas stopped with SIGTERM left the ring");
    for lease in listed.items {
        let _ = leases.delete(&lease.metadata.name.unwrap_or_default(), &DeleteParams::default()).await;
    }
    for ns in &ring.namespaces {
        let _ = all.delete(ns, &DeleteParams::default()).await;
    }
    ring.scene.finish().await;
}

fn running<'a>(names: &[&'static str], replicas: &'a [Option<Controller>]) -> Vec<(&'static str, &'a Controller)> {
    names.iter().zip(replicas).filter_map(|(name, c)| Some((*name, c.as_ref()?))).collect()
}
