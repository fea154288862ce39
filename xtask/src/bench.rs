//! `cargo xtask bench rollout`: how fast and how small the controller is with many bindings,
//! on the real local servers.
//!
//! N Deployments each get a binding that reads one key of its own and one key shared by all.
//! Each round writes the shared key once and times how long it takes until every Deployment has
//! a new ReplicaSet. It prints the controller's resident memory and its own metrics as well.

use std::{
    collections::HashMap,
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{env::Env, process, provision, repo_root};

const ADMIN_ADDR: &str = "127.0.0.1:18090";
const ADMIN_PORT: u16 = 18090;

pub fn rollout(env: &Env, bindings: usize, rounds: usize) -> Result<()> {
    ensure!(bindings > 0 && rounds > 0, "need at least one binding and one round");
    env.up()?;
    let vars = env.vars()?;
    let consul_addr =
        vars.iter().find(|(k, _)| *k == "CONSUL_HTTP_ADDR").map(|(_, v)| v.clone()).context("CONSUL_HTTP_ADDR")?;
    let tools = provision::tools()?;
    let ns = format!("bench-{}", std::process::id());
    let kubectl = |args: &[&str]| {
        let mut cmd = Command::new(&tools.kubectl);
        cmd.args(["-n", &ns]).args(args).envs(vars.iter().map(|(k, v)| (*k, v)));
        cmd
    };
    let consul_put = |key: &str, value: &str| {
        process::run(
            Command::new(&tools.consul)
                .args(["kv", "put", &format!("-http-addr={consul_addr}"), key, value])
                .stdout(std::process::Stdio::null()),
        )
    };

    build_release()?;

    println!("==> {bindings} Deployments and bindings in namespace {ns}");
    process::run(&mut kubectl(&["create", "namespace", &ns]))?;
    let shared = format!("{ns}/shared");
    consul_put(&shared, "0")?;
    let mut manifests = String::new();
    for i in 0..bindings {
        consul_put(&format!("{ns}/app-{i}"), "v1")?;
        manifests += &manifest(i, &ns);
    }
    let file = env.run_dir().join("bench.yaml");
    std::fs::write(&file, manifests)?;
    process::run(&mut kubectl(&["apply", "--server-side", "-f", &file.display().to_string()]))?;
    wait("a first ReplicaSet for every Deployment", Duration::from_secs(120), || {
        Ok(replica_sets(&mut kubectl(&replica_set_owners()))?.len() == bindings)
    })?;

    let controller = env.daemon("bench-controller");
    controller.stop()?;
    let started = Instant::now();
    controller.ensure_started(
        Command::new(repo_root().join("target/release/consulbind"))
            .args([&format!("--namespaces={ns}"), &format!("--admin-addr={ADMIN_ADDR}"), "--default-token-prefixes=*"])
            .env("RUST_LOG", "warn")
            .envs(vars.iter().map(|(k, v)| (*k, v))),
    )?;
    let result = (|| {
        wait("every binding to record its baseline", Duration::from_secs(300), || {
            let out = process::capture(&mut kubectl(&[
                "get",
                "consulbindings",
                "-o",
                "jsonpath={.items[*].status.appliedChecksum}",
            ]))?;
            Ok(out.split_whitespace().count() == bindings)
        })?;
        let baseline_time = started.elapsed();
        let pid = controller.pid().context("the controller exited")?;
        let rss_idle = rss_kib(pid)?;

        let mut latencies = Vec::new();
        for round in 1..=rounds {
            let before = replica_sets(&mut kubectl(&replica_set_owners()))?;
            let start = Instant::now();
            consul_put(&shared, &round.to_string())?;
            wait("every Deployment to roll", Duration::from_secs(300), || {
                let now = replica_sets(&mut kubectl(&replica_set_owners()))?;
                Ok(now.iter().all(|(owner, n)| *n > before.get(owner).copied().unwrap_or(0)) && now.len() == bindings)
            })?;
            latencies.push(start.elapsed());
        }
        let rss_after = rss_kib(pid)?;
        let metrics = process::http_get(ADMIN_PORT, "/metrics", None).context("reading /metrics")?.1;
        latencies.sort();
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
        println!(
            "\nresults ({}, {}, {} cores):",
            plural(bindings, "binding"),
            plural(rounds, "round"),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
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
        println!(
            "  controller resident memory:               {} KiB idle, {} KiB after the rounds",
            rss_idle, rss_after
        );
        Ok(())
    })();

    controller.stop()?;
    let _ = process::run(&mut kubectl(&["delete", "namespace", &ns, "--wait=false"]));
    result
}

fn manifest(i: usize, ns: &str) -> String {
    format!(
        r#"---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: app-{i}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: app-{i}}}}}
  template:
    metadata: {{labels: {{app: app-{i}}}}}
    spec: {{containers: [{{name: app, image: example.invalid/app:1}}]}}
---
apiVersion: consulbind.dev/v1alpha1
kind: ConsulBinding
metadata: {{name: app-{i}}}
spec:
  keys: [{{key: {ns}/app-{i}}}, {{key: {ns}/shared}}]
  targets: [{{kind: Deployment, name: app-{i}}}]
  rollout: {{quietPeriod: 0s}}
"#
    )
}

fn replica_set_owners() -> [&'static str; 4] {
    ["get", "replicasets", "-o", r#"jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{"\n"}{end}"#]
}

/// ReplicaSets per owning Deployment.
fn replica_sets(cmd: &mut Command) -> Result<HashMap<String, usize>> {
    let mut counts = HashMap::new();
    for owner in process::capture(cmd)?.lines().filter(|l| !l.is_empty()) {
        *counts.entry(owner.to_owned()).or_default() += 1;
    }
    Ok(counts)
}

/// The release controller the benchmarks run.
pub(crate) fn build_release() -> Result<()> {
    println!("==> building the controller (release)");
    process::run(Command::new(env!("CARGO")).current_dir(repo_root()).args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "consulbind",
    ]))
}

pub(crate) fn rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS")
}

/// Resident memory as (anonymous, file-backed), in KiB: the heap and stacks, and the pages of
/// the binary and libraries that were touched.
pub(crate) fn rss_split_kib(pid: u32) -> Result<(u64, u64)> {
    Ok((status_kib(pid, "RssAnon")?, status_kib(pid, "RssFile")?))
}

/// Peak resident memory.
pub(crate) fn hwm_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmHWM")
}

/// A field of `/proc/<pid>/status` given in kB.
fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let prefix = format!("{field}:");
    let line = status.lines().find(|l| l.starts_with(&prefix)).with_context(|| format!("no {field}"))?;
    Ok(line.split_whitespace().nth(1).with_context(|| format!("{field} value"))?.parse()?)
}

/// The environment's variables, for a benchmark that measures from a Tokio runtime.
pub(crate) type Vars = Vec<(&'static str, String)>;

/// What every measuring benchmark does first: the servers up, the release controller built,
/// the environment's variables, and a runtime to measure from.
pub(crate) fn prepare(env: &Env) -> Result<(Vars, tokio::runtime::Runtime)> {
    env.up()?;
    build_release()?;
    Ok((env.vars()?, tokio::runtime::Builder::new_multi_thread().enable_all().build()?))
}

pub(crate) fn var(vars: &[(&'static str, String)], name: &str) -> Result<String> {
    vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone()).with_context(|| name.to_owned())
}

/// A client of the local API server, as its admin.
pub(crate) async fn kube_client(vars: &[(&'static str, String)]) -> Result<kube::Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let kubeconfig = Kubeconfig::read_from(var(vars, "KUBECONFIG")?)?;
    Ok(kube::Client::try_from(kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)?)
}

/// Clients of the local API server and Consul, and a namespace made for one run, named
/// `<name>-<pid>`.
pub(crate) async fn clients_and_namespace(
    vars: &[(&'static str, String)],
    name: &str,
) -> Result<(kube::Client, consul_kv::Client, String)> {
    use kube::api::PostParams;
    let client = kube_client(vars).await?;
    let address = var(vars, "CONSUL_HTTP_ADDR")?;
    let consul = consul_kv::Client::new(consul_kv::ClientConfig { address, ..Default::default() }).await?;
    let ns = format!("{name}-{}", std::process::id());
    let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": &ns}}))?;
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok((client, consul, ns))
}

/// Waits until `bindings` bindings are Ready; false on timeout. Follows a watch rather than
/// listing thousands of bindings again and again, which would load the API server it measures.
pub(crate) async fn all_ready(
    api: &kube::Api<consulbind_api::ConsulBinding>,
    bindings: usize,
    timeout: Duration,
) -> Result<bool> {
    use futures::{StreamExt, TryStreamExt};
    use kube::{
        ResourceExt,
        runtime::{WatchStreamExt, watcher},
    };
    let mut ready = std::collections::HashSet::new();
    let mut events =
        watcher::watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    let follow = async {
        while let Some(binding) = events.try_next().await? {
            let conditions = binding.status.iter().flat_map(|s| &s.conditions);
            match conditions.into_iter().any(|c| c.type_ == "Ready" && c.status == "True") {
                true => ready.insert(binding.name_any()),
                false => ready.remove(&binding.name_any()),
            };
            if ready.len() == bindings {
                return Ok::<_, anyhow::Error>(true);
            }
        }
        Ok(false)
    };
    tokio::time::timeout(timeout, follow).await.unwrap_or(Ok(false))
}

pub(crate) fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The controller's own account of where a change's time went, from its metrics: each rollout
/// stage it has seen, with its mean and how many it measured.
pub(crate) fn stage_means(metrics: &str) -> Vec<(&'static str, Duration, f64)> {
    let of = |part: &str, stage: &str| {
        metric(metrics, &format!("consulbind_rollout_stage_seconds_{part}{{stage=\"{stage}\"}}"))
    };
    ["consul_to_reconcile", "reconcile_to_patch", "patch"]
        .into_iter()
        .filter_map(|stage| {
            let (sum, count) = (of("sum", stage)?, of("count", stage).filter(|c| *c > 0.0)?);
            Some((stage, Duration::from_secs_f64(sum / count), count))
        })
        .collect()
}

fn wait(what: &str, timeout: Duration, done: impl Fn() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if done()? {
            return Ok(());
        }
        sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// `n` and the noun, in the singular for one.
fn plural(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

/// Deployments' generations as a watch sees them, with the time each was first seen: the end
/// of a change's latency, measured the same way for every controller.
pub(crate) struct Generations {
    seen: std::sync::Arc<std::sync::Mutex<HashMap<String, (i64, Instant)>>>,
    /// Told of every new generation, so that waiting for one costs no polling.
    moved: std::sync::Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Generations {
    pub(crate) fn watch(deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment>) -> Self {
        use futures::StreamExt;
        use kube::{
            ResourceExt,
            runtime::{WatchStreamExt, watcher},
        };
        let seen: std::sync::Arc<std::sync::Mutex<HashMap<String, (i64, Instant)>>> = Default::default();
        let moved = std::sync::Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn({
            let (seen, moved) = (seen.clone(), moved.clone());
            async move {
                let mut events = watcher::watcher(deployments, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(Ok(d)) = events.next().await {
                    let generation = d.metadata.generation.unwrap_or_default();
                    let mut seen = seen.lock().unwrap();
                    let entry = seen.entry(d.name_any()).or_insert((generation, Instant::now()));
                    if entry.0 != generation {
                        *entry = (generation, Instant::now());
                        moved.notify_waiters();
                    }
                }
            }
        });
        Self { seen, moved, task }
    }

    /// Every Deployment's generation now.
    pub(crate) fn now(&self) -> HashMap<String, i64> {
        self.seen.lock().unwrap().iter().map(|(name, (generation, _))| (name.clone(), *generation)).collect()
    }

    /// Waits until every one of `targets` has reached its generation in `expected`, and returns
    /// how long after `from` the last of them was seen; `None` after `timeout`.
    pub(crate) async fn reached(
        &self,
        targets: &[String],
        expected: &HashMap<String, i64>,
        from: Instant,
        timeout: Duration,
    ) -> Option<Duration> {
        let deadline = tokio::time::Instant::from_std(from + timeout);
        loop {
            let next = self.moved.notified();
            let done: Option<Instant> = {
                let seen = self.seen.lock().unwrap();
                let at: Option<Vec<Instant>> =
                    targets.iter().map(|t| seen.get(t).filter(|(g, _)| *g >= expected[t]).map(|(_, at)| *at)).collect();
                at.and_then(|at| at.into_iter().max())
            };
            if let Some(at) = done {
                return Some(at.saturating_duration_since(from));
            }
            tokio::time::timeout_at(deadline, next).await.ok()?;
        }
    }

    /// Waits until the watch has seen `count` Deployments; false after `timeout`.
    pub(crate) async fn seen(&self, count: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.seen.lock().unwrap().len() < count {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    /// Waits until no generation has moved for `quiet`, at most `timeout`.
    pub(crate) async fn settle(&self, quiet: Duration, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if tokio::time::timeout(quiet, self.moved.notified()).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Generations {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The value at fraction `p` of sorted `sorted`, in milliseconds.
pub(crate) fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// Deletes what earlier benchmark runs left (an interrupted run keeps its namespaces) and waits until it is
/// gone: kube-controller-manager deletes the Deployments and ReplicaSets one by one, which would
/// load the servers during this run.
pub(crate) async fn wait_for_earlier_runs(namespaces: &kube::Api<k8s_openapi::api::core::v1::Namespace>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list = namespaces.list(&Default::default()).await?;
        let earlier = list.items.iter().filter(|n| n.metadata.name.as_deref().is_some_and(|n| n.starts_with("bench-")));
        let earlier: Vec<_> = earlier.map(|n| n.metadata.name.clone().unwrap_or_default()).collect();
        if earlier.is_empty() {
            return Ok(());
        }
        for name in &earlier {
            let _ = namespaces.delete(name, &Default::default()).await;
        }
        ensure!(
            Instant::now() < deadline,
            "namespaces of earlier runs still there after 10 minutes: {}",
            earlier.join(", ")
        );
        println!("    waiting for earlier runs' namespaces to go: {}", earlier.join(", "));
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Starts the release controller as daemon `name` on `namespaces`, its admin listener on
/// loopback port `admin_port`, with `args` besides, the environment's variables and then
/// `overrides`; whatever ran under that name is stopped first. It logs at
/// `CONSULBIND_BENCH_LOG`, `warn` by default. Returns the daemon and its pid.
pub(crate) fn release_controller(
    env: &Env,
    name: &'static str,
    vars: &[(&'static str, String)],
    namespaces: &str,
    admin_port: u16,
    args: &[String],
    overrides: &[(&str, &str)],
) -> Result<(process::Daemon, u32)> {
    let controller = env.daemon(name);
    controller.stop()?;
    controller.ensure_started(
        Command::new(repo_root().join("target/release/consulbind"))
            .arg(format!("--namespaces={namespaces}"))
            .arg(format!("--admin-addr=127.0.0.1:{admin_port}"))
            .arg("--debug-addr=none")
            .args(args)
            .env("RUST_LOG", std::env::var("CONSULBIND_BENCH_LOG").unwrap_or_else(|_| "warn".into()))
            .envs(vars.iter().map(|(k, v)| (*k, v)))
            .envs(overrides.iter().copied()),
    )?;
    let pid = controller.pid().context("the controller exited at once")?;
    Ok((controller, pid))
}
