//! `cargo xtask bench flood`: one namespace whose keys change without pause, bound with
//! `quietPeriod: 0s`, beside a quiet namespace with one binding. Measures the quiet namespace's
//! change-to-rollout latency alone and then during the flood, what the flood's rollouts came
//! to, and whether the API server throttled the controller.

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use consul_kv::{Client as Consul, ClientConfig};
use consulbind_api::ConsulBinding;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Namespace};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{
    bench::{all_ready, percentile_ms, rss_kib},
    env::Env,
};

const ADMIN_PORT: u16 = 18095;
const SETUP_CONCURRENCY: usize = 16;
const POLL: Duration = Duration::from_millis(5);

pub struct Sizes {
    /// Bindings in the flooding namespace, each with a key and a Deployment of its own.
    pub bindings: usize,
    /// How often each of their keys is written.
    pub every: Duration,
    /// Changes to the quiet namespace's key, in each phase.
    pub changes: usize,
    /// The controller's `--namespace-write-limit`.
    pub write_limit: Option<String>,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    ensure!(sizes.bindings > 0 && sizes.changes > 0, "need a binding and a change");
    let (vars, runtime) = crate::bench::prepare(env)?;
    runtime.block_on(measure(env, &vars, &sizes))
}

async fn measure(env: &Env, vars: &[(&'static str, String)], sizes: &Sizes) -> Result<()> {
    let client = crate::bench::kube_client(vars).await?;
    let consul_addr = crate::bench::var(vars, "CONSUL_HTTP_ADDR")?;
    let consul = Consul::new(ClientConfig { address: consul_addr.clone(), ..ClientConfig::default() }).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let run = std::process::id();
    let (flood, quiet) = (format!("bench-flood-{run}"), format!("bench-calm-{run}"));
    for ns in [&flood, &quiet] {
        namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}}))?).await?;
    }
    let apply = PatchParams::apply("consulbind-bench").force();
    let bind = |ns: &str, name: &str, key: &str| {
        let (deployments, bindings) =
            (Api::<Deployment>::namespaced(client.clone(), ns), Api::<ConsulBinding>::namespaced(client.clone(), ns));
        let binding = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": name},
            "spec": {"keys": [{"key": key}], "targets": [{"kind": "Deployment", "name": name}],
                     "rollout": {"quietPeriod": "0s"}}});
        let (apply, consul, name, key) = (&apply, &consul, name.to_owned(), key.to_owned());
        async move {
            consul.put(&key, b"v0", None).await?;
            deployments.patch(&name, apply, &Patch::Apply(crate::scale::deployment(&name))).await?;
            bindings.patch(&name, apply, &Patch::Apply(binding)).await?;
            anyhow::Ok(())
        }
    };
    let flood_key = |i: usize| format!("{flood}/k{i:04}");
    stream::iter(0..sizes.bindings)
        .map(|i| bind(&flood, &format!("f{i:04}"), &flood_key(i)))
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    let quiet_key = format!("{quiet}/config");
    bind(&quiet, "web", &quiet_key).await?;

    let mut args = vec!["--default-token-prefixes=*".to_owned()];
    args.extend(sizes.write_limit.iter().map(|limit| format!("--namespace-write-limit={limit}")));
    let served = format!("{flood},{quiet}");
    let (controller, pid) =
        crate::bench::release_controller(env, "bench-flood-controller", vars, &served, ADMIN_PORT, &args, &[])?;

    let result = async {
        let ready = Duration::from_secs(300);
        let flood_bindings = Api::<ConsulBinding>::namespaced(client.clone(), &flood);
        ensure!(all_ready(&flood_bindings, sizes.bindings, ready).await?, "the flood's bindings: not Ready");
        ensure!(all_ready(&Api::namespaced(client.clone(), &quiet), 1, ready).await?, "the quiet binding: not Ready");
        let quiet_web = Api::<Deployment>::namespaced(client.clone(), &quiet);
        let flood_web = Api::<Deployment>::namespaced(client.clone(), &flood);
        let mut change = 0;
        let mut phase = async |changes: usize| -> Result<Vec<Duration>> {
            let mut latencies = Vec::new();
            for _ in 0..changes {
                change += 1;
                latencies.push(rollout(&consul, &quiet_web, &quiet_key, change).await?);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok(latencies)
        };
        println!("==> the quiet namespace alone: {} changes", sizes.changes);
        let mut alone = phase(sizes.changes).await?;

        let generations = async || -> Result<i64> {
            let list = flood_web.list(&Default::default()).await?;
            Ok(list.items.iter().map(|d| d.metadata.generation.unwrap_or(0)).sum())
        };
        let before = generations().await?;
        let throttled_before = throttled(vars);
        let writing = Arc::new(AtomicBool::new(true));
        let written = Arc::new(AtomicUsize::new(0));
        let writer = tokio::spawn({
            let (consul, writing, written, every) = (consul.clone(), writing.clone(), written.clone(), sizes.every);
            let keys: Vec<String> = (0..sizes.bindings).map(flood_key).collect();
            async move {
                let mut tick = tokio::time::interval(every);
                let mut n = 0u64;
                while writing.load(Ordering::Relaxed) {
                    tick.tick().await;
                    n += 1;
                    let value = format!("f{n}");
                    let writes = keys.iter().map(|k| consul.put(k, value.as_bytes(), None));
                    for result in futures::future::join_all(writes).await {
                        if result.is_ok() {
                            written.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        println!(
            "==> during the flood: {} keys each written every {} ms; {} changes",
            sizes.bindings,
            sizes.every.as_millis(),
            sizes.changes
        );
        let flood_started = Instant::now();
        let mut during = phase(sizes.changes).await?;
        let flood_secs = flood_started.elapsed().as_secs_f64() + 3.0;
        writing.store(false, Ordering::Relaxed);
        writer.await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rolled = generations().await? - before;
        let throttled_after = throttled(vars);

        let summary = |latencies: &mut Vec<Duration>| {
            latencies.sort();
            format!(
                "p50 {:.1} ms  p90 {:.1} ms  max {:.1} ms  ({} changes)",
                percentile_ms(latencies, 0.5),
                percentile_ms(latencies, 0.9),
                latencies.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
                latencies.len()
            )
        };
        println!(
            "\nresults: {} flooding bindings beside 1 quiet one, release build, {} cores, write limit {}:",
            sizes.bindings,
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            sizes.write_limit.as_deref().unwrap_or("none"),
        );
        println!("  quiet namespace alone, Consul write to new generation:  {}", summary(&mut alone));
        println!("  quiet namespace during the flood:                        {}", summary(&mut during));
        let writes = written.load(Ordering::Relaxed);
        println!(
            "  the flood: {writes} Consul writes in {flood_secs:.0} s, {rolled} rollouts of its Deployments (coalesced)"
        );
        match (throttled_before, throttled_after) {
            (Some(before), Some(after)) => {
                println!("  requests the API server rejected (429, priority and fairness): {}", after - before)
            }
            _ => println!("  requests the API server rejected: not reported by this API server"),
        }
        println!("  resident memory: {} MiB", rss_kib(pid)? / 1024);
        Ok(())
    }
    .await;
    controller.stop()?;
    for ns in [&flood, &quiet] {
        let _ = namespaces.delete(ns, &Default::default()).await;
    }
    result
}

/// Requests the API server's priority and fairness rejected, all flows together.
fn throttled(vars: &[(&'static str, String)]) -> Option<f64> {
    let kubectl = crate::provision::kubectl().ok()?;
    let mut cmd = Command::new(kubectl);
    cmd.args(["get", "--raw", "/metrics"]).envs(vars.iter().map(|(k, v)| (*k, v)));
    let text = crate::process::capture(&mut cmd).ok()?;
    let rejected = text
        .lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_rejected_requests_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    Some(rejected.sum())
}

/// Writes `change` to `key` and waits until the Deployment `web` has a new generation.
async fn rollout(consul: &Consul, deployments: &Api<Deployment>, key: &str, change: usize) -> Result<Duration> {
    let before = deployments.get("web").await?.metadata.generation;
    let written = Instant::now();
    consul.put(key, format!("q{change}").as_bytes(), None).await?;
    loop {
        if deployments.get("web").await?.metadata.generation != before {
            return Ok(written.elapsed());
        }
        ensure!(written.elapsed() < Duration::from_secs(60), "no rollout within 60 s of writing {key}");
        tokio::time::sleep(POLL).await;
    }
}
