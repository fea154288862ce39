//! `cargo xtask bench objects`: what ConfigMaps and Secrets that no binding reads cost the
//! controller's resident memory, on the real local servers.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use consulbind_api::ConsulBinding;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Namespace, Secret},
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{
    bench::{all_ready, rss_kib},
    env::Env,
};

/// How long the binding may take to be Ready.
const READY_WITHIN: Duration = Duration::from_secs(120);
const ADMIN_PORT: u16 = 18094;
const SETUP_CONCURRENCY: usize = 16;

pub struct Sizes {
    pub config_maps: usize,
    pub secrets: usize,
    pub bytes: usize,
    pub deployments: usize,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    let (vars, runtime) = crate::bench::prepare(env)?;
    runtime.block_on(measure(env, &vars, &sizes))
}

async fn measure(env: &Env, vars: &[(&'static str, String)], sizes: &Sizes) -> Result<()> {
    let client = crate::bench::kube_client(vars).await?;
    let ns = format!("bench-objects-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": &ns}}))?).await?;
    let apply = PatchParams::apply("consulbind-bench").force();
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    let bindings = Api::<ConsulBinding>::namespaced(client.clone(), &ns);
    deployments.patch("web", &apply, &Patch::Apply(crate::scale::deployment("web"))).await?;
    let bound = |value: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bound"}, "data": {"v": value}});
    config_maps.patch("bound", &apply, &Patch::Apply(bound("1"))).await?;
    let binding = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": "web"},
                         "spec": {"configMaps": [{"name": "bound"}], "targets": [{"kind": "Deployment", "name": "web"}],
                                  "rollout": {"quietPeriod": "0s"}}});
    bindings.patch("web", &apply, &Patch::Apply(binding)).await?;

    let name = "bench-objects-controller";
    let start = || crate::bench::release_controller(env, name, vars, &ns, ADMIN_PORT, &[], &[]).map(|(_, pid)| pid);
    let controller = env.daemon(name);
    let result = async {
        let pid = start()?;
        ensure!(all_ready(&bindings, 1, READY_WITHIN).await?, "the binding is not Ready after {READY_WITHIN:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let without = rss_kib(pid)?;

        let value = "x".repeat(sizes.bytes);
        println!(
            "==> {} ConfigMaps and {} Secrets of {} bytes, and {} Deployments of one replica (never healthy \
             here: no kubelet), that no binding reads, in {ns}",
            sizes.config_maps, sizes.secrets, sizes.bytes, sizes.deployments
        );
        let made = Instant::now();
        let objects = (0..sizes.config_maps).map(|i| (0, i)).chain((0..sizes.secrets).map(|i| (1, i)));
        let objects = objects.chain((0..sizes.deployments).map(|i| (2, i)));
        stream::iter(objects)
            .map(|(kind, i)| {
                let (config_maps, secrets, deployments, apply, value) =
                    (&config_maps, &secrets, &deployments, &apply, &value);
                async move {
                    let name = format!("unbound-{i:05}");
                    match kind {
                        2 => {
                            let object = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                                    "template": {"metadata": {"labels": {"app": name}},
                                        "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]}}}});
                            deployments.patch(&name, apply, &Patch::Apply(object)).await.map(drop)
                        }
                        0 => {
                            let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}});
                            config_maps.patch(&name, apply, &Patch::Apply(object)).await.map(drop)
                        }
                        _ => {
                            let object = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"v": value}});
                            secrets.patch(&name, apply, &Patch::Apply(object)).await.map(drop)
                        }
                    }
                }
            })
            .buffer_unordered(SETUP_CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?;
        println!("    made in {:.0} s", made.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_secs(5)).await;
        let with = rss_kib(pid)?;

        // The bound one still rolls.
        let before = deployments.get("web").await?.metadata.generation;
        config_maps.patch("bound", &apply, &Patch::Apply(bound("2"))).await?;
        let written = Instant::now();
        while deployments.get("web").await?.metadata.generation == before {
            ensure!(written.elapsed() < Duration::from_secs(30), "no rollout within 30 s of the bound ConfigMap's change");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rolled_after = written.elapsed();

        // A start with every object already there: the first list.
        let pid = start()?;
        ensure!(all_ready(&bindings, 1, READY_WITHIN).await?, "the binding is not Ready after {READY_WITHIN:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let restarted = rss_kib(pid)?;

        let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
        println!(
            "\nresults: {} ConfigMaps and {} Secrets of {} bytes and {} Deployments, unbound, release build, {} cores:",
            sizes.config_maps,
            sizes.secrets,
            sizes.bytes,
            sizes.deployments,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!("  resident memory with one bound ConfigMap:      {}", mib(without));
        println!("  after the unbound objects were made:           {}  (+{})", mib(with), mib(with.saturating_sub(without)));
        println!("  restarted with them all there, once Ready:     {}  (+{})", mib(restarted), mib(restarted.saturating_sub(without)));
        println!("  the bound ConfigMap's change to a new generation: {:.0} ms", rolled_after.as_secs_f64() * 1000.0);
        Ok(())
    }
    .await;
    controller.stop()?;
    let _ = namespaces.delete(&ns, &Default::default()).await;
    result
}
