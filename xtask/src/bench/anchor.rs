//! `cargo xtask bench anchor`: this controller beside k8s-consul-mutator-rs, its nearest peer, on
//! the same local servers and measured the same way, one controller at a time, alternating.
//!
//! The mutator is built unchanged from fetched copies of its repository and its two git
//! dependencies (never vendored here), once, into the cache. Each controller has a namespace of
//! its own with N Deployments (`replicas: 0`), each bound to a Consul key of its own: the
//! mutator's by its annotation, ours by one binding each with a quiet period of 0. A round
//! starts one controller, lets it settle, writes C changes one at a time (each to the next
//! key), times each from just before the Consul PUT until a watch on the Deployments sees the
//! new generation, and stops it. Between rounds, with no controller running, a raw PATCH of one
//! pod-template annotation is timed the same way: the floor.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use consulbind_api::ConsulBinding;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::harness::{
    self, Bench, Controller, Generations, Release, SETUP_AT_ONCE, all_ready, binding, cores, deployment, percentile_ms,
    rolled_at_once, stage_means,
};
use crate::{common::cache_dir, env::Env, process};

/// The commit of k8s-consul-mutator-rs that is built and measured.
const COMMIT: &str = "6566de5";
const REPOSITORIES: [&str; 3] = ["k8s-consul-mutator-rs", "consulrs", "axum-test-helper"];
/// Its key annotation on a Deployment.
const KEY_ANNOTATION: &str = "k8s-consul-mutator.io/key-config";
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
const MUTATOR_PORT: u16 = 18093;
const ADMIN_PORT: u16 = 18092;

pub struct Sizes {
    pub bindings: usize,
    pub changes: usize,
    pub rounds: usize,
    /// A pause after each change is seen, before the next: lets what a controller writes after
    /// the stamp (our status and events) finish before the next change is timed.
    pub gap: Duration,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    ensure!(sizes.bindings > 0 && sizes.changes > 0 && sizes.rounds > 0, "need bindings, changes and rounds");
    let mutator = build_mutator()?;
    harness::run(env, async |bench| measure(bench, &sizes, &mutator).await)
}

/// Where the fetched copies are: bare git directories named `owner+name/repo`.
fn mirrors() -> PathBuf {
    std::env::var_os("CONSULBIND_ANCHOR_MIRRORS").map_or_else(|| PathBuf::from("/work/.mirror"), PathBuf::from)
}

/// Builds the mutator from the fetched copies, unless the cache has it.
fn build_mutator() -> Result<PathBuf> {
    let dir = cache_dir()?.join("anchor").join(REPOSITORIES[0]);
    let binary = dir.join("target/release").join(REPOSITORIES[0]);
    if binary.exists() {
        return Ok(binary);
    }
    let copy = |name: &str| mirrors().join(format!("ngerakines+{name}")).join("repo");
    for name in REPOSITORIES {
        ensure!(
            copy(name).exists(),
            "no copy of github:ngerakines/{name} at {}: fetch the three repositories named in \
             ../shared/anchors/mutator.md, or set CONSULBIND_ANCHOR_MIRRORS to the directory that holds \
             them as owner+name/repo",
            copy(name).display()
        );
    }
    println!("==> building k8s-consul-mutator-rs {COMMIT} from the fetched copies (once; minutes on 2 cores)");
    if !dir.join("Cargo.toml").exists() {
        std::fs::create_dir_all(dir.parent().context("cache dir")?)?;
        process::run(Command::new("git").arg("clone").arg("-q").arg(copy(REPOSITORIES[0])).arg(&dir))?;
    }
    process::run(Command::new("git").current_dir(&dir).args(["checkout", "-q", COMMIT]))?;
    // Its Cargo.toml takes the other two from GitHub; git reads them from the copies instead.
    let mut cargo = Command::new(env!("CARGO"));
    cargo.current_dir(&dir).args(["build", "--release", "--locked", "-j2"]);
    cargo.env("CARGO_NET_GIT_FETCH_WITH_CLI", "true").env("GIT_CONFIG_COUNT", "2");
    for (i, name) in REPOSITORIES[1..].iter().enumerate() {
        cargo.env(format!("GIT_CONFIG_KEY_{i}"), format!("url.file://{}.insteadOf", copy(name).display()));
        cargo.env(format!("GIT_CONFIG_VALUE_{i}"), format!("https://github.com/ngerakines/{name}.git"));
    }
    process::run(&mut cargo)?;
    ensure!(binary.exists(), "the mutator's build made no {}", binary.display());
    Ok(binary)
}

/// One round of one controller.
struct Round {
    latencies: Vec<Duration>,
    missed: usize,
    spurious: i64,
    rss_kib: u64,
    /// CPU time the controller used during the changes.
    cpu: Duration,
    /// This controller's own account of where a change's time went: stage and mean.
    stages: Vec<(&'static str, Duration)>,
}

/// A namespace of N keyed Deployments, and the watch that times them.
struct Side {
    ns: String,
    keys: Vec<String>,
    deployments: Api<Deployment>,
    generations: Generations,
}

async fn measure(bench: &Bench, sizes: &Sizes, mutator: &Path) -> Result<()> {
    bench.clear_earlier_runs().await?;
    println!(
        "==> {} Deployments each for the mutator and for consulbind, each bound to a key of its own",
        sizes.bindings
    );
    let mutator_side = side(bench, "mutator", sizes.bindings).await?;
    let consulbind_side = side(bench, "consulbind", sizes.bindings).await?;
    let floor_ns = bench.namespace("bench-anchor-floor").await?;
    bench.apply::<Deployment>(&floor_ns, deployment("floor")).await?;
    let floor_api = bench.api::<Deployment>(&floor_ns);
    let floor_generations = Generations::watch(floor_api.clone());
    ensure!(floor_generations.seen(1, Duration::from_secs(60)).await, "the watch did not see the floor Deployment");

    let mut rows = Vec::new();
    let mut step = 0;
    for round in 1..=sizes.rounds {
        let floor = time_patches(&floor_api, &floor_generations, sizes.changes.min(100)).await?;
        let m = mutator_round(bench, mutator, &mutator_side, sizes, &mut step).await?;
        let c = consulbind_round(bench, &consulbind_side, sizes, &mut step).await?;
        print_round(round, &m, &c, &floor);
        rows.push((m, c, floor));
    }
    summary(&rows, sizes);
    Ok(())
}

/// The namespace of one controller: `n` Deployments, each bound to a key of its own, by the
/// mutator's annotation or by one binding each.
async fn side(bench: &Bench, who: &str, n: usize) -> Result<Side> {
    let ns = bench.namespace(&format!("bench-anchor-{who}")).await?;
    let keys: Vec<String> = (0..n).map(|i| format!("{ns}/k{i:04}")).collect();
    harness::each(&keys, SETUP_AT_ONCE, |key| bench.consul.put(key, b"v0", None)).await?;
    harness::each(0..n, SETUP_AT_ONCE, |i| {
        let mut manifest = deployment(&format!("w{i:04}"));
        if who == "mutator" {
            manifest["metadata"]["annotations"] = json!({KEY_ANNOTATION: &keys[i]});
        }
        bench.apply::<Deployment>(&ns, manifest)
    })
    .await?;
    if who == "consulbind" {
        harness::each(0..n, SETUP_AT_ONCE, |i| {
            let spec = rolled_at_once(json!({"keys": [{"key": &keys[i]}]}), [format!("w{i:04}")]);
            bench.apply::<ConsulBinding>(&ns, binding(&format!("b{i:04}"), spec))
        })
        .await?;
    }
    let deployments = bench.api::<Deployment>(&ns);
    let generations = Generations::watch(deployments.clone());
    ensure!(generations.seen(n, Duration::from_secs(60)).await, "the watch did not see the {who} Deployments");
    Ok(Side { ns, keys, deployments, generations })
}

async fn mutator_round(bench: &Bench, binary: &Path, side: &Side, sizes: &Sizes, step: &mut usize) -> Result<Round> {
    let daemon = bench.start(
        "bench-anchor-mutator",
        Command::new(binary)
            .envs(bench.vars().iter().map(|(k, v)| (*k, v)))
            .env("UPDATE_DEBOUNCE", "0")
            .env("WATCH_DISPATCHER_FIRST_RECONCILE", "10")
            .env("PORT", MUTATOR_PORT.to_string())
            .env("SECURE_PORT", "0")
            .env("RUST_LOG", "warn"),
    )?;
    // It ignores the watcher's first list: Deployments that existed before it started are seen
    // once something touches them. A label does not move the generation.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let touch = json!({"metadata": {"labels": {"bench-touch": step.to_string()}}});
    harness::each(0..side.keys.len(), SETUP_AT_ONCE, |i| {
        let (deployments, touch) = (&side.deployments, &touch);
        async move { deployments.patch(&format!("w{i:04}"), &PatchParams::default(), &Patch::Merge(touch)).await }
    })
    .await?;
    // Then, after its first reconcile, it rolls every Deployment once, its checksum annotation
    // being new to it.
    tokio::time::sleep(Duration::from_secs(25)).await;
    side.generations.settle(Duration::from_secs(5), Duration::from_secs(60)).await;
    let round = changes_round(bench, side, sizes, step, &daemon).await;
    daemon.stop()?;
    round
}

async fn consulbind_round(bench: &Bench, side: &Side, sizes: &Sizes, step: &mut usize) -> Result<Round> {
    let args = ["--default-token-prefixes=*".to_owned()];
    let release = Release {
        name: "bench-anchor-consulbind",
        namespaces: &side.ns,
        admin_port: ADMIN_PORT,
        args: &args,
        env: &[],
    };
    let controller = bench.controller(release)?;
    let bindings = bench.api::<ConsulBinding>(&side.ns);
    ensure!(all_ready(&bindings, side.keys.len(), Duration::from_secs(120)).await?, "not every binding Ready");
    side.generations.settle(Duration::from_secs(3), Duration::from_secs(60)).await;
    let mut round = changes_round(bench, side, sizes, step, &controller).await?;
    let metrics = controller.metrics()?;
    round.stages = stage_means(&metrics).into_iter().map(|(stage, mean, _)| (stage, mean)).collect();
    controller.stop()?;
    Ok(round)
}

/// Writes `changes` values one at a time, each to the next key, and times each until its
/// Deployment's new generation is seen.
async fn changes_round(
    bench: &Bench,
    side: &Side,
    sizes: &Sizes,
    step: &mut usize,
    controller: &Controller,
) -> Result<Round> {
    let changes = sizes.changes;
    let mut expected = side.generations.now();
    ensure!(expected.len() == side.keys.len(), "the watch saw {} Deployments", expected.len());
    let mut latencies = Vec::with_capacity(changes);
    let mut missed = 0;
    let cpu_before = controller.cpu_time()?;
    for change in 0..changes {
        let i = change % side.keys.len();
        let target = [format!("w{i:04}")];
        *step += 1;
        let write = (side.keys[i].as_str(), format!("v{step}"));
        match side
            .generations
            .time_change(&bench.consul, (write.0, &write.1), &target, &mut expected, CHANGE_TIMEOUT)
            .await?
        {
            Some(latency) => latencies.push(latency),
            None => missed += 1,
        }
        tokio::time::sleep(sizes.gap).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spurious = side.generations.spurious(&expected);
    latencies.sort();
    let cpu = controller.cpu_time()?.saturating_sub(cpu_before);
    Ok(Round { latencies, missed, spurious, rss_kib: controller.rss_kib()?, cpu, stages: Vec::new() })
}

/// Raw writes of one pod-template annotation, timed like a change: merge patches, and
/// server-side applies of the same field, alternating.
struct Floor {
    merge: Vec<Duration>,
    apply: Vec<Duration>,
}

async fn time_patches(api: &Api<Deployment>, generations: &Generations, count: usize) -> Result<Floor> {
    let mut expected = generations.now();
    let target = vec!["floor".to_owned()];
    let mut floor = Floor { merge: Vec::with_capacity(count), apply: Vec::with_capacity(count) };
    let apply = PatchParams::apply("consulbind-bench-floor").force();
    for i in 0..count * 2 {
        *expected.get_mut("floor").context("the floor Deployment")? += 1;
        let annotations = json!({"bench/floor": format!("{i}-{:?}", Instant::now())});
        let written = Instant::now();
        if i % 2 == 0 {
            let patch = json!({"spec": {"template": {"metadata": {"annotations": annotations}}}});
            api.patch("floor", &PatchParams::default(), &Patch::Merge(&patch)).await?;
        } else {
            let body = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "floor"},
                              "spec": {"template": {"metadata": {"annotations": annotations}}}});
            api.patch("floor", &apply, &Patch::Apply(&body)).await?;
        }
        let took = generations.reached(&target, &expected, written, CHANGE_TIMEOUT).await;
        let list = if i % 2 == 0 { &mut floor.merge } else { &mut floor.apply };
        list.extend(took);
    }
    floor.merge.sort();
    floor.apply.sort();
    Ok(floor)
}

fn line(who: &str, r: &Round) -> String {
    let p = |q| percentile_ms(&r.latencies, q);
    format!(
        "{who:<11} p50 {:>6.1}  p90 {:>6.1}  p99 {:>6.1}  max {:>7.1} ms   missed {}  spurious {}  RSS {:.1} MiB  CPU {:.2} s",
        p(0.5),
        p(0.9),
        p(0.99),
        p(1.0),
        r.missed,
        r.spurious,
        r.rss_kib as f64 / 1024.0,
        r.cpu.as_secs_f64()
    )
}

fn print_round(round: usize, m: &Round, c: &Round, floor: &Floor) {
    println!("round {round} ({} changes each)", m.latencies.len() + m.missed);
    println!("  {}", line("mutator", m));
    println!("  {}", line("consulbind", c));
    let stages: Vec<String> =
        c.stages.iter().map(|(stage, mean)| format!("{stage} {:.2}", mean.as_secs_f64() * 1000.0)).collect();
    println!("    consulbind's stages, mean ms: {}", stages.join(", "));
    println!(
        "  raw writes  p50 {:>6.1} ms merge patch, {:.1} ms server-side apply ({} each)",
        percentile_ms(&floor.merge, 0.5),
        percentile_ms(&floor.apply, 0.5),
        floor.merge.len()
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The mutator's round, ours, and the raw writes of the same round.
type Row = (Round, Round, Floor);

fn summary(rows: &[Row], sizes: &Sizes) {
    let of = |f: &dyn Fn(&Row) -> f64| median(rows.iter().map(f).collect());
    let (m50, c50) = (of(&|r| percentile_ms(&r.0.latencies, 0.5)), of(&|r| percentile_ms(&r.1.latencies, 0.5)));
    let (m99, c99) = (of(&|r| percentile_ms(&r.0.latencies, 0.99)), of(&|r| percentile_ms(&r.1.latencies, 0.99)));
    let floor = of(&|r| percentile_ms(&r.2.merge, 0.5));
    let apply = of(&|r| percentile_ms(&r.2.apply, 0.5));
    println!(
        "\nresults: {} Deployments each, {} changes per round, {} rounds, {} ms between changes, {} cores; medians \
         over the rounds",
        sizes.bindings,
        sizes.changes,
        sizes.rounds,
        sizes.gap.as_millis(),
        cores()
    );
    println!("  mutator     p50 {m50:.1} ms  p99 {m99:.1} ms");
    println!("  consulbind  p50 {c50:.1} ms  p99 {c99:.1} ms");
    println!(
        "  raw merge patch p50 {floor:.1} ms (server-side apply {apply:.1} ms); consulbind's p50 is {:.2} times the \
         patch, the mutator's {:.2}",
        c50 / floor,
        m50 / floor
    );
}
