//! `cargo xtask bench flood`: one namespace whose keys change without pause, bound with
//! `quietPeriod: 0s`, beside a quiet namespace with one binding. Measures the quiet namespace's
//! change-to-rollout latency alone and then during the flood, what the flood's rollouts came
//! to, and whether the API server throttled the controller.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use consul_kv::Client as Consul;
use consulbind_api::ConsulBinding;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

use super::harness::{
    self, Bench, Release, SETUP_AT_ONCE, all_ready, binding, cores, deployment, rolled_at_once, summary,
};
use crate::env::Env;
use crate::process;

const ADMIN_PORT: u16 = 18095;
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
    harness::run(env, async |bench| measure(bench, &sizes).await)
}

/// The two namespaces: the flooding one and the quiet one beside it.
struct Sides {
    flood: String,
    quiet: String,
}

impl Sides {
    fn flood_key(&self, i: usize) -> String {
        format!("{}/k{i:04}", self.flood)
    }

    fn quiet_key(&self) -> String {
        format!("{}/config", self.quiet)
    }
}

async fn measure(bench: &Bench, sizes: &Sizes) -> Result<()> {
    let sides = Sides { flood: bench.namespace("bench-flood").await?, quiet: bench.namespace("bench-calm").await? };
    set_up(bench, &sides, sizes).await?;
    let mut args = vec!["--default-token-prefixes=*".to_owned()];
    args.extend(sizes.write_limit.iter().map(|limit| format!("--namespace-write-limit={limit}")));
    let served = format!("{},{}", sides.flood, sides.quiet);
    let release =
        Release { name: "bench-flood-controller", namespaces: &served, admin_port: ADMIN_PORT, args: &args, env: &[] };
    let controller = bench.controller(release)?;
    let ready = Duration::from_secs(300);
    let flood_bindings = bench.api::<ConsulBinding>(&sides.flood);
    ensure!(all_ready(&flood_bindings, sizes.bindings, ready).await?, "the flood's bindings: not Ready");
    ensure!(all_ready(&bench.api(&sides.quiet), 1, ready).await?, "the quiet binding: not Ready");

    let web = bench.web(&sides.quiet, POLL, Duration::from_secs(60));
    let mut change = 0;
    let mut phase = async |changes: usize| -> Result<Vec<Duration>> {
        let mut latencies = Vec::new();
        for _ in 0..changes {
            change += 1;
            let (key, value) = (sides.quiet_key(), format!("q{change}"));
            latencies.push(
                web.after(&format!("writing {key}"), bench.consul.put(&key, value.as_bytes(), None)).await?.total,
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(latencies)
    };
    println!("==> the quiet namespace alone: {} changes", sizes.changes);
    let mut alone = phase(sizes.changes).await?;

    let flood_web = bench.api::<Deployment>(&sides.flood);
    let generations = async || -> Result<i64> {
        let list = flood_web.list(&Default::default()).await?;
        Ok(list.items.iter().map(|d| d.metadata.generation.unwrap_or(0)).sum())
    };
    let before = generations().await?;
    let throttled_before = throttled(bench);
    let writer = Writer::start(&bench.consul, (0..sizes.bindings).map(|i| sides.flood_key(i)).collect(), sizes.every);
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
    let writes = writer.stop().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rolled = generations().await? - before;
    let throttled_after = throttled(bench);

    println!(
        "\nresults: {} flooding bindings beside 1 quiet one, release build, {} cores, write limit {}:",
        sizes.bindings,
        cores(),
        sizes.write_limit.as_deref().unwrap_or("none"),
    );
    println!("  quiet namespace alone, Consul write to new generation:  {}", summary(&mut alone, &[0.5, 0.9]));
    println!("  quiet namespace during the flood:                        {}", summary(&mut during, &[0.5, 0.9]));
    println!(
        "  the flood: {writes} Consul writes in {flood_secs:.0} s, {rolled} rollouts of its Deployments (coalesced)"
    );
    match (throttled_before, throttled_after) {
        (Some(before), Some(after)) => {
            println!("  requests the API server rejected (429, priority and fairness): {}", after - before)
        }
        _ => println!("  requests the API server rejected: not reported by this API server"),
    }
    println!("  resident memory: {} MiB", controller.rss_kib()? / 1024);
    Ok(())
}

/// A key and a Deployment of its own, and a binding of one to the other, for each of the flood's
/// bindings, then the same for the quiet namespace's `web`.
async fn set_up(bench: &Bench, sides: &Sides, sizes: &Sizes) -> Result<()> {
    let bind = async |ns: &str, name: &str, key: &str| {
        bench.consul.put(key, b"v0", None).await?;
        bench.apply::<Deployment>(ns, deployment(name)).await?;
        let spec = rolled_at_once(json!({"keys": [{"key": key}]}), [name]);
        bench.apply::<ConsulBinding>(ns, binding(name, spec)).await
    };
    harness::each(0..sizes.bindings, SETUP_AT_ONCE, |i| {
        let (name, key) = (format!("f{i:04}"), sides.flood_key(i));
        async move { bind(&sides.flood, &name, &key).await }
    })
    .await?;
    bind(&sides.quiet, "web", &sides.quiet_key()).await
}

/// Writes every one of its keys every tick, counting the writes that succeed, until stopped.
struct Writer {
    writing: Arc<AtomicBool>,
    written: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(consul: &Consul, keys: Vec<String>, every: Duration) -> Self {
        let writing = Arc::new(AtomicBool::new(true));
        let written = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (consul, writing, written) = (consul.clone(), writing.clone(), written.clone());
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
        Self { writing, written, task }
    }

    /// Stops it after the writes in flight, and returns how many it made.
    async fn stop(self) -> Result<usize> {
        self.writing.store(false, Ordering::Relaxed);
        self.task.await?;
        Ok(self.written.load(Ordering::Relaxed))
    }
}

/// Requests the API server's priority and fairness rejected, all flows together.
fn throttled(bench: &Bench) -> Option<f64> {
    let mut cmd = bench.kubectl().ok()?;
    cmd.args(["get", "--raw", "/metrics"]);
    let text = process::capture(&mut cmd).ok()?;
    let rejected = text
        .lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_rejected_requests_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    Some(rejected.sum())
}
