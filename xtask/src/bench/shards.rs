//! `cargo xtask bench shards`: the same bindings served by one sharded replica, then by three,
//! on the real local servers: change-to-rollout latency and memory per replica, the shares of the
//! ring, and a handover under load (one replica SIGKILLed while its namespaces change).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use consulbind_api::ConsulBinding;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, api::ListParams};
use serde_json::json;

use super::harness::{
    self, Bench, Controller, Generations, Release, binding, cores, deployment, metric, mib, rolled_at_once, summary,
};
use crate::env::Env;

const SETUP_CONCURRENCY: usize = 32;
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
const LEASE: &str = "6s";
/// The replica that serves alone first, then the three of the ring: each with its daemon's name
/// and admin port.
const SOLO: (&str, &str, u16) = ("solo", "bench-shard-solo", 18110);
const NAMES: [&str; 3] = ["shard-a", "shard-b", "shard-c"];
const REPLICAS: [(&str, &str, u16); 3] =
    [("shard-a", "bench-shard-a", 18111), ("shard-b", "bench-shard-b", 18112), ("shard-c", "bench-shard-c", 18113)];

pub struct Sizes {
    pub bindings: usize,
    pub namespaces: usize,
    pub changes: usize,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    ensure!(sizes.namespaces > 0 && sizes.bindings >= sizes.namespaces, "need a binding in every namespace");
    harness::run(env, async |bench| measure(bench, &sizes).await)
}

/// Binding `b`'s namespace, key and Deployment: one each, the bindings dealt round the namespaces.
struct Layout {
    namespaces: Vec<String>,
    bindings: usize,
}

impl Layout {
    fn namespace(&self, b: usize) -> &str {
        &self.namespaces[b % self.namespaces.len()]
    }

    fn key(&self, b: usize) -> String {
        format!("{}/k{b:05}", self.namespace(b))
    }

    fn workload(b: usize) -> String {
        format!("w{b:05}")
    }
}

async fn measure(bench: &Bench, sizes: &Sizes) -> Result<()> {
    bench.clear_earlier_runs().await?;
    let mut namespaces = Vec::new();
    for i in 0..sizes.namespaces {
        namespaces.push(bench.namespace(&format!("bench-shards-{i}")).await?);
    }
    let layout = Layout { namespaces, bindings: sizes.bindings };
    set_up(bench, &layout).await?;
    let generations = Generations::watch(Api::all(bench.kube.clone()));
    ensure!(generations.seen(sizes.bindings, Duration::from_secs(120)).await, "the watch did not see every Deployment");
    let mut expected = generations.now();

    println!("==> one replica");
    let one = start(bench, &layout, "bench-one", &[SOLO])?;
    let ready = served(bench, &layout, &[SOLO.0], Duration::from_secs(900)).await?;
    println!("    every binding Ready and served {:.1} s after the start", ready.as_secs_f64());
    let mut alone = changes(bench, &layout, "one", sizes.changes, &generations, &mut expected).await?;
    let alone_rss = one[0].rss_kib()?;
    one[0].stop()?;

    println!("==> three replicas");
    let three = start(bench, &layout, "bench-three", &REPLICAS)?;
    let ready = served(bench, &layout, &NAMES, Duration::from_secs(900)).await?;
    println!("    every binding served by the ring {:.1} s after the start", ready.as_secs_f64());
    let mut shared = changes(bench, &layout, "three", sizes.changes, &generations, &mut expected).await?;
    // Each replica counts what its binding cache holds, every second; the ring serves every
    // binding of the cluster, not only these.
    let everywhere = Api::<ConsulBinding>::all(bench.kube.clone()).list(&ListParams::default()).await?.items.len();
    let mut shares = Vec::new();
    for _ in 0..30 {
        shares = three.iter().zip(NAMES).map(|(c, name)| share(c, name)).collect::<Result<_>>()?;
        if shares.iter().sum::<f64>() as usize == everywhere {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let rss: Vec<u64> = three.iter().map(Controller::rss_kib).collect::<Result<_>>()?;

    // A handover under load: SIGKILL the first replica, and change a key of each of its bindings.
    let owners = owners(bench, &layout).await?;
    let theirs: Vec<usize> =
        (0..sizes.bindings).filter(|b| owners.get(b).map(String::as_str) == Some(NAMES[0])).collect();
    ensure!(!theirs.is_empty(), "{} serves no binding", NAMES[0]);
    let killed = Instant::now();
    std::process::Command::new("kill").args(["-KILL", &three[0].pid.to_string()]).status()?;
    let moved: Vec<String> = theirs.iter().map(|b| Layout::workload(*b)).collect();
    for b in &theirs {
        *expected.get_mut(&Layout::workload(*b)).context("a Deployment the watch never saw")? += 1;
        bench.consul.put(&layout.key(*b), b"after the kill", None).await?;
    }
    // Every one of them is rolled and its status written: on 2 cores, about 50 a second.
    let wait = Duration::from_secs(120).max(Duration::from_millis(40) * theirs.len() as u32);
    let handover = generations.reached(&moved, &expected, killed, wait).await;
    generations.settle(Duration::from_secs(5), Duration::from_secs(60)).await;
    let spurious = generations.spurious(&expected);
    let missed = moved.iter().filter(|w| generations.now().get(*w).copied().unwrap_or_default() < expected[*w]).count();

    println!(
        "\nresults: {} bindings (one key, one Deployment each) in {} namespaces, {} changes per run, {} cores, \
         --lease-duration={LEASE}",
        sizes.bindings,
        sizes.namespaces,
        sizes.changes,
        cores()
    );
    println!("  one replica:    change to new generation {}", summary(&mut alone, &[0.5, 0.99]));
    println!("                  resident memory {}", mib(alone_rss));
    println!("  three replicas: change to new generation {}", summary(&mut shared, &[0.5, 0.99]));
    for ((name, share), rss) in NAMES.iter().zip(&shares).zip(&rss) {
        println!("                  {name}: {share} bindings, resident memory {}", mib(*rss));
    }
    println!(
        "                  bindings counted by the replicas: {} of the cluster's {everywhere}",
        shares.iter().sum::<f64>()
    );
    match handover {
        Some(took) => println!(
            "  handover: SIGKILL of {} with {} bindings, each changed at once: all rolled {:.1} s after the kill",
            NAMES[0],
            theirs.len(),
            took.as_secs_f64()
        ),
        None => println!("  handover: not every change rolled within {} s of the kill", wait.as_secs()),
    }
    println!("  missed rollouts: {missed}, spurious rollouts: {spurious}");
    ensure!(shares.iter().sum::<f64>() as usize == everywhere, "the replicas' shares do not add up");
    ensure!(missed == 0 && spurious == 0, "{missed} missed and {spurious} spurious rollouts");
    Ok(())
}

async fn set_up(bench: &Bench, layout: &Layout) -> Result<()> {
    let n = layout.bindings;
    println!("==> {n} bindings, keys and Deployments (replicas 0) in {} namespaces", layout.namespaces.len());
    let setup = Instant::now();
    harness::each(0..n, SETUP_CONCURRENCY, |b| {
        let key = layout.key(b);
        async move { bench.consul.put(&key, b"v0", None).await }
    })
    .await?;
    harness::each(0..n, SETUP_CONCURRENCY, |b| {
        bench.apply::<Deployment>(layout.namespace(b), deployment(&Layout::workload(b)))
    })
    .await?;
    harness::each(0..n, SETUP_CONCURRENCY, |b| {
        let spec = rolled_at_once(json!({"keys": [{"key": layout.key(b)}]}), [Layout::workload(b)]);
        bench.apply::<ConsulBinding>(layout.namespace(b), binding(&format!("b{b:05}"), spec))
    })
    .await?;
    println!("    set up in {:.0} s", setup.elapsed().as_secs_f64());
    Ok(())
}

/// Starts `replicas` (identity, daemon, admin port) in ring `ring`, serving every namespace.
fn start(
    bench: &Bench,
    layout: &Layout,
    ring: &str,
    replicas: &[(&str, &'static str, u16)],
) -> Result<Vec<Controller>> {
    let mut started = Vec::new();
    for &(identity, daemon, admin_port) in replicas {
        let args = [
            "--sharding=true".to_owned(),
            format!("--shard-ring={ring}"),
            format!("--identity={identity}"),
            format!("--lease-namespace={}", layout.namespaces[0]),
            format!("--lease-duration={LEASE}"),
            "--lease-renew=1s".to_owned(),
            "--default-token-prefixes=*".to_owned(),
        ];
        let release = Release { name: daemon, namespaces: "", admin_port, args: &args, env: &[] };
        started.push(bench.controller(release)?);
    }
    Ok(started)
}

/// Each binding's `status.shard`, by its number.
async fn owners(bench: &Bench, layout: &Layout) -> Result<HashMap<usize, String>> {
    let mut owners = HashMap::new();
    for ns in &layout.namespaces {
        for b in bench.api::<ConsulBinding>(ns).list(&ListParams::default()).await?.items {
            let number = b.metadata.name.as_deref().and_then(|n| n.strip_prefix('b')).and_then(|n| n.parse().ok());
            if let (Some(number), Some(shard)) = (number, b.status.and_then(|s| s.shard)) {
                owners.insert(number, shard);
            }
        }
    }
    Ok(owners)
}

/// Waits until every binding is Ready and served by one of `names`; how long that took.
async fn served(bench: &Bench, layout: &Layout, names: &[&str], timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let mut done = 0;
        for ns in &layout.namespaces {
            for b in bench.api::<ConsulBinding>(ns).list(&ListParams::default()).await?.items {
                let status = b.status.unwrap_or_default();
                let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
                done += usize::from(ready && status.shard.as_deref().is_some_and(|s| names.contains(&s)));
            }
        }
        if done == layout.bindings {
            return Ok(start.elapsed());
        }
        ensure!(start.elapsed() < timeout, "{done} of {} bindings served after {timeout:?}", layout.bindings);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `changes` changes one at a time, dealt round the bindings: how long each took to roll.
async fn changes(
    bench: &Bench,
    layout: &Layout,
    run: &str,
    changes: usize,
    generations: &Generations,
    expected: &mut HashMap<String, i64>,
) -> Result<Vec<Duration>> {
    let mut latencies = Vec::new();
    let step = (layout.bindings / changes.max(1)).max(1);
    for change in 0..changes {
        let b = (change * step) % layout.bindings;
        let (key, value) = (layout.key(b), format!("{run}-{change}"));
        let target = [Layout::workload(b)];
        match generations.time_change(&bench.consul, (&key, &value), &target, expected, CHANGE_TIMEOUT).await? {
            Some(latency) => latencies.push(latency),
            None => anyhow::bail!("change {change} to {key} did not roll within {CHANGE_TIMEOUT:?}"),
        }
    }
    Ok(latencies)
}

/// A replica's `consulbind_shard_bindings{shard="name"}`.
fn share(controller: &Controller, name: &str) -> Result<f64> {
    let metrics = controller.metrics()?;
    metric(&metrics, &format!("consulbind_shard_bindings{{shard=\"{name}\"}}")).context("no consulbind_shard_bindings")
}
