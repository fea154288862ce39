//! `cargo xtask bench scale`: the controller with many bindings, workloads and keys, on the real
//! local servers, measured from outside: cold start, Consul connections, change-to-rollout
//! latency seen through a watch on the workloads, idle writes and memory.

use std::{
    collections::HashMap,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use consul_kv::{Client as Consul, ClientConfig};
use consulbind_api::ConsulBinding;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Namespace, events::v1::Event};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{
    bench::{Generations, all_ready, metric, percentile_ms, rss_kib, rss_split_kib, stage_means},
    env::Env,
    process, repo_root,
};

const ADMIN_PORT: u16 = 18091;
/// Requests of the set-up in flight at once.
const SETUP_CONCURRENCY: usize = 32;
/// How long one change may take to reach all its targets before it counts as missed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Sizes {
    pub bindings: usize,
    pub workloads: usize,
    pub keys: usize,
    pub changes: usize,
    pub idle: Duration,
    pub max_connections: usize,
    /// The controller reads Consul over HTTPS (HTTP/2) instead of plain HTTP; the benchmark
    /// writes over plain HTTP either way.
    pub tls: bool,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    ensure!(sizes.bindings > 0, "need at least one binding");
    ensure!(sizes.workloads >= sizes.bindings, "need at least one workload per binding");
    ensure!(sizes.keys >= sizes.bindings, "need at least one key per binding");
    let (vars, runtime) = crate::bench::prepare(env)?;
    runtime.block_on(measure(env, &vars, &sizes))
}

/// Which workloads and keys binding `b` owns: every `bindings`-th one, from `b` on.
fn owned(b: usize, bindings: usize, total: usize) -> impl Iterator<Item = usize> {
    (b..total).step_by(bindings)
}

async fn measure(env: &Env, vars: &[(&'static str, String)], sizes: &Sizes) -> Result<()> {
    let var = |name: &str| crate::bench::var(vars, name);
    let client = crate::bench::kube_client(vars).await?;
    let consul_addr = var("CONSUL_HTTP_ADDR")?;
    let consul = Consul::new(ClientConfig { address: consul_addr.clone(), ..ClientConfig::default() }).await?;
    // What the controller reads from, and whose connections are counted.
    let (controller_consul, ca) = match sizes.tls {
        true => (var("CONSULBIND_E2E_TLS_ADDR")?, Some(var("CONSULBIND_E2E_CONSUL_CA")?)),
        false => (consul_addr, None),
    };
    let consul_port: u16 = controller_consul
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .context("Consul port")?;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    crate::bench::wait_for_earlier_runs(&namespaces).await?;
    let ns = format!("bench-scale-{}", std::process::id());
    let Sizes { bindings, workloads, keys, .. } = *sizes;
    println!("==> namespace {ns}: {keys} Consul keys, {workloads} Deployments (replicas 0), {bindings} bindings");
    namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}}))?).await?;
    let key = |k: usize| format!("{ns}/k{k:05}");
    let setup = Instant::now();
    stream::iter(0..keys)
        .map(|k| {
            let consul = &consul;
            let key = key(k);
            async move { consul.put(&key, b"v0", None).await }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let apply = PatchParams::apply("consulbind-bench").force();
    stream::iter(0..workloads)
        .map(|w| {
            let (deployments, apply) = (&deployments, &apply);
            async move {
                deployments.patch(&format!("w{w:05}"), apply, &Patch::Apply(deployment(&format!("w{w:05}")))).await
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    let binding_api: Api<ConsulBinding> = Api::namespaced(client.clone(), &ns);
    stream::iter(0..bindings)
        .map(|b| {
            let (binding_api, apply, key) = (&binding_api, &apply, &key);
            let keys: Vec<_> = owned(b, bindings, keys).map(|k| json!({"key": key(k)})).collect();
            let targets: Vec<_> = owned(b, bindings, workloads)
                .map(|w| json!({"kind": "Deployment", "name": format!("w{w:05}")}))
                .collect();
            let manifest = json!({
                "apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding",
                "metadata": {"name": format!("b{b:05}")},
                "spec": {"keys": keys, "targets": targets, "rollout": {"quietPeriod": "0s"}},
            });
            async move { binding_api.patch(&format!("b{b:05}"), apply, &Patch::Apply(manifest)).await }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    println!("    set up in {:.0} s", setup.elapsed().as_secs_f64());

    let generations = Generations::watch(deployments.clone());

    let controller = env.daemon("bench-scale-controller");
    controller.stop()?;
    let started = Instant::now();
    controller.ensure_started(
        Command::new(repo_root().join("target/release/consulbind"))
            .args([
                &format!("--namespaces={ns}"),
                &format!("--admin-addr=127.0.0.1:{ADMIN_PORT}"),
                &format!("--consul-max-connections={}", sizes.max_connections),
                "--default-token-prefixes=*",
            ])
            .env("RUST_LOG", std::env::var("CONSULBIND_BENCH_LOG").unwrap_or_else(|_| "warn".into()))
            .envs(vars.iter().map(|(k, v)| (*k, v)))
            .env("CONSUL_HTTP_ADDR", &controller_consul)
            .envs(ca.iter().map(|ca| ("CONSUL_CACERT", ca))),
    )?;
    let pid = controller.pid().context("the controller exited at once")?;
    let most_connections = Arc::new(AtomicUsize::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = std::thread::spawn({
        let (most, sampling) = (most_connections.clone(), sampling.clone());
        move || {
            while sampling.load(Ordering::Relaxed) {
                most.fetch_max(connections(pid, consul_port), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });

    let result = async {
        let ready = all_ready(&binding_api, bindings, Duration::from_secs(600)).await?;
        let cold_start = started.elapsed();
        println!("    every binding Ready {:.1} s after the controller started", cold_start.as_secs_f64());
        let rss_ready = rss_kib(pid)?;
        ensure!(ready, "not every binding became Ready");

        // Changes, one at a time, each to a key of the next binding in turn.
        let mut expected = generations.now();
        ensure!(expected.len() == workloads, "the watch saw {} of {workloads} Deployments", expected.len());
        let mut latencies = Vec::with_capacity(sizes.changes);
        let mut missed = 0;
        for change in 0..sizes.changes {
            let b = change % bindings;
            let k = owned(b, bindings, keys).nth(change / bindings % owned(b, bindings, keys).count()).unwrap();
            let targets: Vec<String> = owned(b, bindings, workloads).map(|w| format!("w{w:05}")).collect();
            for t in &targets {
                *expected.get_mut(t).unwrap() += 1;
            }
            let written = Instant::now();
            consul.put(&key(k), format!("v{}", change + 1).as_bytes(), None).await?;
            match generations.reached(&targets, &expected, written, CHANGE_TIMEOUT).await {
                Some(latency) => latencies.push(latency),
                None => missed += 1,
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let final_generations = generations.now();
        let spurious: i64 = expected.iter().map(|(n, want)| (final_generations[n] - want).max(0)).sum();

        // Idle: nothing changes; count what the controller writes.
        let before = snapshot(&binding_api, &deployments).await?;
        let idle_from = k8s_openapi::jiff::Timestamp::now();
        tokio::time::sleep(sizes.idle).await;
        let after = snapshot(&binding_api, &deployments).await?;
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let idle_events = events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|e| e.event_time.as_ref().is_some_and(|t| t.0 >= idle_from))
            .count();
        let idle_writes = before.iter().filter(|(name, rv)| after.get(*name) != Some(rv)).count() + idle_events;
        let rss_end = rss_kib(pid)?;
        let (anon_end, file_end) = rss_split_kib(pid)?;
        let metrics = process::http_get(ADMIN_PORT, "/metrics", None).context("reading /metrics")?.1;

        latencies.sort();
        let pct = |p: f64| percentile_ms(&latencies, p);
        println!(
            "\nresults: {bindings} bindings, {workloads} Deployments, {keys} keys, {} changes, {} cores, budget {} connections",
            sizes.changes,
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            sizes.max_connections
        );
        println!("  the controller reads Consul at {controller_consul}");
        println!("  cold start, controller start to every binding Ready:  {:.1} s", cold_start.as_secs_f64());
        println!("  most Consul connections held (sampled every 100 ms): {}", most_connections.load(Ordering::Relaxed));
        println!(
            "  blocking queries serving {} watched keys:           {}",
            metric(&metrics, "consulbind_consul_watches").unwrap_or(f64::NAN),
            metric(&metrics, "consulbind_consul_watch_groups").unwrap_or(f64::NAN)
        );
        println!(
            "  Consul write to new generation seen by a watch:      p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms  ({} changes)",
            pct(0.5),
            pct(0.9),
            pct(0.99),
            pct(1.0),
            latencies.len()
        );
        println!("  missed changes (no rollout within {CHANGE_TIMEOUT:?}):         {missed}");
        println!("  spurious rollouts:                                   {spurious}");
        for (stage, mean, n) in stage_means(&metrics) {
            println!("    stage {stage:<20} mean {:.2} ms over {n}", mean.as_secs_f64() * 1000.0);
        }
        println!("  API writes during {} s idle (status, stamps, events):  {idle_writes}", sizes.idle.as_secs());
        println!(
            "  resident memory: {} MiB when Ready, {} MiB at the end ({} MiB anonymous, {} MiB file-backed)",
            rss_ready / 1024,
            rss_end / 1024,
            anon_end / 1024,
            file_end / 1024
        );
        ensure!(missed == 0 && spurious == 0, "{missed} missed and {spurious} spurious rollouts");
        Ok(())
    }
    .await;

    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.join();
    drop(generations);
    controller.stop()?;
    let _ = namespaces.delete(&ns, &Default::default()).await;
    result
}

pub(crate) fn deployment(name: &str) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {
        "replicas": 0,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]}},
    }})
}

/// The resource version of every binding and the generation of every Deployment.
async fn snapshot(bindings: &Api<ConsulBinding>, deployments: &Api<Deployment>) -> Result<HashMap<String, String>> {
    let mut versions = HashMap::new();
    for b in bindings.list(&ListParams::default()).await?.items {
        versions.insert(format!("binding/{}", b.name_any()), b.resource_version().unwrap_or_default());
    }
    for d in deployments.list(&ListParams::default()).await?.items {
        versions.insert(format!("deployment/{}", d.name_any()), d.metadata.generation.unwrap_or_default().to_string());
    }
    Ok(versions)
}

/// Established TCP connections of `pid` to `port`, as `ss` reports them.
fn connections(pid: u32, port: u16) -> usize {
    let out = Command::new("ss").args(["-Htnp", "state", "established", &format!("dport = :{port}")]).output();
    let needle = format!("pid={pid},");
    out.map(|o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.contains(&needle)).count()).unwrap_or(0)
}
