//! `cargo xtask bench objects`: what ConfigMaps and Secrets that no binding reads cost the
//! controller's resident memory, on the real local servers.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use consulbind_api::ConsulBinding;
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Secret},
};
use serde_json::{Value, json};

use super::harness::{
    self, Bench, Controller, Release, SETUP_AT_ONCE, all_ready, binding, cores, deployment, deployment_of, mib,
    rolled_at_once,
};
use crate::env::Env;

/// How long the binding may take to be Ready.
const READY_WITHIN: Duration = Duration::from_secs(120);
const ADMIN_PORT: u16 = 18094;

pub struct Sizes {
    pub config_maps: usize,
    pub secrets: usize,
    pub bytes: usize,
    pub deployments: usize,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    harness::run(env, async |bench| measure(bench, &sizes).await)
}

async fn measure(bench: &Bench, sizes: &Sizes) -> Result<()> {
    let ns = bench.namespace("bench-objects").await?;
    bench.apply::<Deployment>(&ns, deployment("web")).await?;
    bench.apply::<ConfigMap>(&ns, bound("1")).await?;
    let spec = rolled_at_once(json!({"configMaps": [{"name": "bound"}]}), ["web"]);
    bench.apply::<ConsulBinding>(&ns, binding("web", spec)).await?;

    let controller = start(bench, &ns).await?;
    let without = controller.rss_kib()?;
    make_unbound(bench, &ns, sizes).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let with = controller.rss_kib()?;

    // The bound one still rolls.
    let web = bench.web(&ns, Duration::from_millis(20), Duration::from_secs(30));
    let rolled = web.after("the bound ConfigMap's change", bench.apply::<ConfigMap>(&ns, bound("2"))).await?;
    // From the ConfigMap written, as the controller can only see it then.
    let rolled_after = rolled.total - rolled.change;

    // A start with every object already there: the first list.
    let restarted = start(bench, &ns).await?.rss_kib()?;

    println!(
        "\nresults: {} ConfigMaps and {} Secrets of {} bytes and {} Deployments, unbound, release build, {} cores:",
        sizes.config_maps,
        sizes.secrets,
        sizes.bytes,
        sizes.deployments,
        cores()
    );
    println!("  resident memory with one bound ConfigMap:      {}", mib(without));
    println!(
        "  after the unbound objects were made:           {}  (+{})",
        mib(with),
        mib(with.saturating_sub(without))
    );
    println!(
        "  restarted with them all there, once Ready:     {}  (+{})",
        mib(restarted),
        mib(restarted.saturating_sub(without))
    );
    println!("  the bound ConfigMap's change to a new generation: {:.0} ms", rolled_after.as_secs_f64() * 1000.0);
    Ok(())
}

/// The ConfigMap the one binding reads.
fn bound(value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bound"}, "data": {"v": value}})
}

/// (Re)starts the controller and waits until the binding is Ready and a little more.
async fn start(bench: &Bench, ns: &str) -> Result<Controller> {
    let release =
        Release { name: "bench-objects-controller", namespaces: ns, admin_port: ADMIN_PORT, args: &[], env: &[] };
    let controller = bench.controller(release)?;
    let bindings = bench.api::<ConsulBinding>(ns);
    ensure!(all_ready(&bindings, 1, READY_WITHIN).await?, "the binding is not Ready after {READY_WITHIN:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(controller)
}

/// The ConfigMaps, Secrets and Deployments that no binding reads.
async fn make_unbound(bench: &Bench, ns: &str, sizes: &Sizes) -> Result<()> {
    let value = "x".repeat(sizes.bytes);
    println!(
        "==> {} ConfigMaps and {} Secrets of {} bytes, and {} Deployments of one replica (never healthy \
         here: their pods never run), that no binding reads, in {ns}",
        sizes.config_maps, sizes.secrets, sizes.bytes, sizes.deployments
    );
    let made = Instant::now();
    let objects = (0..sizes.config_maps).map(|i| (0, i)).chain((0..sizes.secrets).map(|i| (1, i)));
    let objects = objects.chain((0..sizes.deployments).map(|i| (2, i)));
    harness::each(objects, SETUP_AT_ONCE, |(kind, i)| {
        let name = format!("unbound-{i:05}");
        let value = &value;
        async move {
            match kind {
                2 => bench.apply::<Deployment>(ns, deployment_of(&name, 1)).await,
                0 => {
                    let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}});
                    bench.apply::<ConfigMap>(ns, object).await
                }
                _ => {
                    let object = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"v": value}});
                    bench.apply::<Secret>(ns, object).await
                }
            }
        }
    })
    .await?;
    println!("    made in {:.0} s", made.elapsed().as_secs_f64());
    Ok(())
}
