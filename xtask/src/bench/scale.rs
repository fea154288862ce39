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
use consulbind_api::ConsulBinding;
use k8s_openapi::api::{apps::v1::Deployment, events::v1::Event};
use kube::{Api, ResourceExt, api::ListParams};
use serde_json::json;

use super::harness::{
    self, Bench, Controller, Generations, Release, all_ready, binding, cores, deployment, metric, rolled_at_once,
    stage_means, summary,
};
use crate::env::Env;

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
    harness::run(env, async |bench| measure(bench, &sizes).await)
}

/// Which workloads and keys binding `b` owns: every `bindings`-th one, from `b` on.
fn owned(b: usize, bindings: usize, total: usize) -> impl Iterator<Item = usize> {
    (b..total).step_by(bindings)
}

fn key(ns: &str, k: usize) -> String {
    format!("{ns}/k{k:05}")
}

fn workload(w: usize) -> String {
    format!("w{w:05}")
}

/// TCP connections the controller held: the most to Consul, the most to the API server, and to
/// the API server at the end.
struct Connections {
    consul: usize,
    api_most: usize,
    api_end: usize,
}

/// What the changes and the idle time came to.
struct Figures {
    latencies: Vec<Duration>,
    missed: usize,
    spurious: i64,
    idle_writes: usize,
}

async fn measure(bench: &Bench, sizes: &Sizes) -> Result<()> {
    // What the controller reads from, and whose connections are counted.
    let (controller_consul, ca) = match sizes.tls {
        true => (bench.var("CONSULBIND_E2E_TLS_ADDR")?, Some(bench.var("CONSULBIND_E2E_CONSUL_CA")?)),
        false => (bench.var("CONSUL_HTTP_ADDR")?, None),
    };
    let consul_port: u16 = controller_consul
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .context("Consul port")?;

    bench.clear_earlier_runs().await?;
    let ns = bench.namespace("bench-scale").await?;
    set_up(bench, &ns, sizes).await?;
    let deployments = bench.api::<Deployment>(&ns);
    let generations = Generations::watch(deployments.clone());

    // All in one namespace: its limits are raised to what the run binds.
    let args = [
        format!("--consul-max-connections={}", sizes.max_connections),
        "--default-token-prefixes=*".to_owned(),
        format!("--max-bindings-per-namespace={}", sizes.bindings.max(5000)),
        format!("--max-watched-paths-per-namespace={}", sizes.keys.max(20_000)),
    ];
    let mut env = vec![("CONSUL_HTTP_ADDR", controller_consul.as_str())];
    env.extend(ca.iter().map(|ca| ("CONSUL_CACERT", ca.as_str())));
    let release =
        Release { name: "bench-scale-controller", namespaces: &ns, admin_port: ADMIN_PORT, args: &args, env: &env };
    let controller = bench.controller(release)?;
    let consul_connections = Sampler::start(controller.pid, consul_port);
    let api_connections = Sampler::start(controller.pid, crate::env::apiserver_port());

    let ready = all_ready(&bench.api(&ns), sizes.bindings, Duration::from_secs(600)).await?;
    let cold_start = controller.started.elapsed();
    println!("    every binding Ready {:.1} s after the controller started", cold_start.as_secs_f64());
    let rss_ready = controller.rss_kib()?;
    let cpu_ready = controller.cpu_time()?;
    ensure!(ready, "not every binding became Ready");

    let mut figures = changes(bench, &ns, sizes, &generations).await?;
    figures.idle_writes = idle_writes(bench, &ns, sizes.idle).await?;
    let connections = Connections {
        consul: consul_connections.stop(),
        api_most: api_connections.stop(),
        api_end: connections(controller.pid, crate::env::apiserver_port()),
    };
    print(sizes, &controller_consul, cold_start, connections, &mut figures, &controller, (rss_ready, cpu_ready))?;
    ensure!(
        figures.missed == 0 && figures.spurious == 0,
        "{} missed and {} spurious rollouts",
        figures.missed,
        figures.spurious
    );
    Ok(())
}

/// The keys, the workloads and the bindings, which share the keys and workloads out.
async fn set_up(bench: &Bench, ns: &str, sizes: &Sizes) -> Result<()> {
    let Sizes { bindings, workloads, keys, .. } = *sizes;
    println!("==> namespace {ns}: {keys} Consul keys, {workloads} Deployments (replicas 0), {bindings} bindings");
    let setup = Instant::now();
    harness::each(0..keys, SETUP_CONCURRENCY, |k| {
        let key = key(ns, k);
        async move { bench.consul.put(&key, b"v0", None).await }
    })
    .await?;
    harness::each(0..workloads, SETUP_CONCURRENCY, |w| bench.apply::<Deployment>(ns, deployment(&workload(w)))).await?;
    harness::each(0..bindings, SETUP_CONCURRENCY, |b| {
        let keys: Vec<_> = owned(b, bindings, keys).map(|k| json!({"key": key(ns, k)})).collect();
        let spec = rolled_at_once(json!({"keys": keys}), owned(b, bindings, workloads).map(workload));
        bench.apply::<ConsulBinding>(ns, binding(&format!("b{b:05}"), spec))
    })
    .await?;
    println!("    set up in {:.0} s", setup.elapsed().as_secs_f64());
    Ok(())
}

/// Changes, one at a time, each to a key of the next binding in turn, timed until the watch sees
/// every target of that binding roll.
async fn changes(bench: &Bench, ns: &str, sizes: &Sizes, generations: &Generations) -> Result<Figures> {
    let Sizes { bindings, workloads, keys, .. } = *sizes;
    let mut expected = generations.now();
    ensure!(expected.len() == workloads, "the watch saw {} of {workloads} Deployments", expected.len());
    let mut figures = Figures { latencies: Vec::with_capacity(sizes.changes), missed: 0, spurious: 0, idle_writes: 0 };
    for change in 0..sizes.changes {
        let b = change % bindings;
        let k = owned(b, bindings, keys).nth(change / bindings % owned(b, bindings, keys).count()).unwrap();
        let targets: Vec<String> = owned(b, bindings, workloads).map(workload).collect();
        let (key, value) = (key(ns, k), format!("v{}", change + 1));
        match generations.time_change(&bench.consul, (&key, &value), &targets, &mut expected, CHANGE_TIMEOUT).await? {
            Some(latency) => figures.latencies.push(latency),
            None => figures.missed += 1,
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    figures.spurious = generations.spurious(&expected);
    Ok(figures)
}

/// Nothing changes for `idle`: what the controller writes meanwhile (statuses, stamps, events).
async fn idle_writes(bench: &Bench, ns: &str, idle: Duration) -> Result<usize> {
    let (bindings, deployments) = (bench.api::<ConsulBinding>(ns), bench.api::<Deployment>(ns));
    let before = snapshot(&bindings, &deployments).await?;
    let idle_from = k8s_openapi::jiff::Timestamp::now();
    tokio::time::sleep(idle).await;
    let after = snapshot(&bindings, &deployments).await?;
    let idle_events = bench
        .api::<Event>(ns)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|e| e.event_time.as_ref().is_some_and(|t| t.0 >= idle_from))
        .count();
    Ok(before.iter().filter(|(name, rv)| after.get(*name) != Some(rv)).count() + idle_events)
}

fn print(
    sizes: &Sizes,
    controller_consul: &str,
    cold_start: Duration,
    connections: Connections,
    figures: &mut Figures,
    controller: &Controller,
    (rss_ready, cpu_ready): (u64, Duration),
) -> Result<()> {
    let cpu_end = controller.cpu_time()?;
    let rss_end = controller.rss_kib()?;
    let (anon_end, file_end) = controller.rss_split_kib()?;
    let metrics = controller.metrics()?;
    let Sizes { bindings, workloads, keys, .. } = *sizes;
    println!(
        "\nresults: {bindings} bindings, {workloads} Deployments, {keys} keys, {} changes, {} cores, budget {} connections",
        sizes.changes,
        cores(),
        sizes.max_connections
    );
    println!("  the controller reads Consul at {controller_consul}");
    println!("  cold start, controller start to every binding Ready:  {:.1} s", cold_start.as_secs_f64());
    println!("  most Consul connections held (sampled every 100 ms): {}", connections.consul);
    println!("  API server connections: at most {}, {} at the end", connections.api_most, connections.api_end);
    println!(
        "  blocking queries serving {} watched keys:           {}",
        metric(&metrics, "consulbind_consul_watches").unwrap_or(f64::NAN),
        metric(&metrics, "consulbind_consul_watch_groups").unwrap_or(f64::NAN)
    );
    println!(
        "  Consul write to new generation seen by a watch:      {}",
        summary(&mut figures.latencies, &[0.5, 0.9, 0.99])
    );
    println!("  missed changes (no rollout within {CHANGE_TIMEOUT:?}):         {}", figures.missed);
    println!("  spurious rollouts:                                   {}", figures.spurious);
    for (stage, mean, n) in stage_means(&metrics) {
        println!("    stage {stage:<20} mean {:.2} ms over {n}", mean.as_secs_f64() * 1000.0);
    }
    println!("  API writes during {} s idle (status, stamps, events):  {}", sizes.idle.as_secs(), figures.idle_writes);
    println!(
        "  controller CPU time: {:.1} s to Ready, {:.1} s over the changes and the idle wait",
        cpu_ready.as_secs_f64(),
        (cpu_end - cpu_ready).as_secs_f64()
    );
    println!(
        "  resident memory: {} MiB when Ready, {} MiB at the end ({} MiB anonymous, {} MiB file-backed)",
        rss_ready / 1024,
        rss_end / 1024,
        anon_end / 1024,
        file_end / 1024
    );
    Ok(())
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

/// The most Consul connections a process held, sampled every 100 ms on a thread of its own.
struct Sampler {
    most: Arc<AtomicUsize>,
    sampling: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(pid: u32, port: u16) -> Self {
        let most = Arc::new(AtomicUsize::new(0));
        let sampling = Arc::new(AtomicBool::new(true));
        let thread = std::thread::spawn({
            let (most, sampling) = (most.clone(), sampling.clone());
            move || {
                while sampling.load(Ordering::Relaxed) {
                    most.fetch_max(connections(pid, port), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        Self { most, sampling, thread: Some(thread) }
    }

    /// Stops sampling; the most it saw.
    fn stop(mut self) -> usize {
        self.end();
        self.most.load(Ordering::Relaxed)
    }

    fn end(&mut self) {
        self.sampling.store(false, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.end();
    }
}

/// Established TCP connections of `pid` to `port`, as `ss` reports them.
fn connections(pid: u32, port: u16) -> usize {
    let out = Command::new("ss").args(["-Htnp", "state", "established", &format!("dport = :{port}")]).output();
    let needle = format!("pid={pid},");
    out.map(|o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.contains(&needle)).count()).unwrap_or(0)
}
