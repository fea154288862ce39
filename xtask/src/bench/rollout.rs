//! `cargo xtask bench rollout`: how fast and how small the controller is with many bindings,
//! on the real local servers.
//!
//! N Deployments each get a binding that reads one key of its own and one key shared by all.
//! Each round writes the shared key once and times how long it takes until every Deployment has
//! a new ReplicaSet. It prints the controller's resident memory and its own metrics as well.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use consulbind_api::ConsulBinding;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

use super::harness::{
    self, Bench, Release, SETUP_AT_ONCE, binding, cores, deployment_of, metric, rolled_at_once, until,
};
use crate::{env::Env, process};

const ADMIN_PORT: u16 = 18090;
/// How often kubectl reads the ReplicaSets and statuses while waiting.
const POLL: Duration = Duration::from_millis(100);

pub fn run(env: &Env, bindings: usize, rounds: usize) -> Result<()> {
    ensure!(bindings > 0 && rounds > 0, "need at least one binding and one round");
    harness::run(env, async |bench| measure(bench, bindings, rounds).await)
}

async fn measure(bench: &Bench, bindings: usize, rounds: usize) -> Result<()> {
    let ns = bench.namespace("bench").await?;
    println!("==> {bindings} Deployments and bindings in namespace {ns}");
    let shared = format!("{ns}/shared");
    bench.consul.put(&shared, b"0", None).await?;
    harness::each(0..bindings, SETUP_AT_ONCE, |i| {
        let (ns, shared, name) = (&ns, &shared, format!("app-{i}"));
        async move {
            let key = format!("{ns}/{name}");
            bench.consul.put(&key, b"v1", None).await?;
            bench.apply::<Deployment>(ns, deployment_of(&name, 1)).await?;
            let spec = rolled_at_once(json!({"keys": [{"key": key}, {"key": shared}]}), [&name]);
            bench.apply::<ConsulBinding>(ns, binding(&name, spec)).await
        }
    })
    .await?;
    let replica_sets = || replica_sets(bench, &ns);
    let first = "a first ReplicaSet for every Deployment";
    until(first, Duration::from_secs(120), POLL, async || Ok(replica_sets()?.len() == bindings)).await?;

    let args = ["--default-token-prefixes=*".to_owned()];
    let release = Release { name: "bench-controller", namespaces: &ns, admin_port: ADMIN_PORT, args: &args, env: &[] };
    let controller = bench.controller(release)?;
    let baselines = async || {
        let mut kubectl = bench.kubectl()?;
        kubectl.args(["-n", &ns, "get", "consulbindings", "-o", "jsonpath={.items[*].status.appliedChecksum}"]);
        Ok(process::capture(&mut kubectl)?.split_whitespace().count() == bindings)
    };
    until("every binding to record its baseline", Duration::from_secs(300), POLL, baselines).await?;
    let baseline_time = controller.started.elapsed();
    let rss_idle = controller.rss_kib()?;

    let mut latencies = Vec::new();
    for round in 1..=rounds {
        let before = replica_sets()?;
        let start = Instant::now();
        bench.consul.put(&shared, round.to_string().as_bytes(), None).await?;
        let rolled = async || {
            let now = replica_sets()?;
            Ok(now.iter().all(|(owner, n)| *n > before.get(owner).copied().unwrap_or(0)) && now.len() == bindings)
        };
        until("every Deployment to roll", Duration::from_secs(300), POLL, rolled).await?;
        latencies.push(start.elapsed());
    }
    let rss_after = controller.rss_kib()?;
    let metrics = controller.metrics()?;
    latencies.sort();
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!("\nresults ({}, {}, {} cores):", plural(bindings, "binding"), plural(rounds, "round"), cores());
    println!("  start to every baseline recorded:        {}", ms(baseline_time));
    println!(
        "  Consul write to every Deployment rolled:  min {}  median {}  max {}",
        ms(latencies[0]),
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() - 1])
    );
    println!(
        "    (wall clock, polled every 100 ms with kubectl; includes kube-controller-manager creating ReplicaSets)"
    );
    let count = metric(&metrics, "consulbind_change_to_rollout_seconds_count").unwrap_or(0.0);
    let sum = metric(&metrics, "consulbind_change_to_rollout_seconds_sum").unwrap_or(0.0);
    if count > 0.0 {
        println!(
            "  controller: Consul change seen to target patched, mean {:.1} ms over {count} rollouts",
            sum / count * 1000.0
        );
    }
    println!(
        "  shared Consul watches:                    {}",
        metric(&metrics, "consulbind_consul_watches").unwrap_or(0.0)
    );
    println!("  controller resident memory:               {rss_idle} KiB idle, {rss_after} KiB after the rounds");
    Ok(())
}

/// ReplicaSets per owning Deployment in `ns`, as kubectl lists them.
fn replica_sets(bench: &Bench, ns: &str) -> Result<HashMap<String, usize>> {
    let mut kubectl = bench.kubectl()?;
    let owners = r#"jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{"\n"}{end}"#;
    kubectl.args(["-n", ns, "get", "replicasets", "-o", owners]);
    let mut counts = HashMap::new();
    for owner in process::capture(&mut kubectl)?.lines().filter(|l| !l.is_empty()) {
        *counts.entry(owner.to_owned()).or_default() += 1;
    }
    Ok(counts)
}

/// `n` and the noun, in the singular for one.
fn plural(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}
