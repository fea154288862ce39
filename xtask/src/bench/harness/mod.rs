//! What every benchmark shares, so that none writes it again: the servers up and the release
//! controller built, clients of the API server and Consul, the namespaces and controllers of one
//! run (taken down after it, whether it passed or failed), the manifests, the waiting, and the
//! figures it prints.

mod figures;
mod watch;

use std::fmt::Debug;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use consul_kv::{Client as Consul, ClientConfig, Token};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::common::repo_root;
use crate::env::{Env, provision};
use crate::process::{self, Daemon};
use watch::Rollout;

pub(crate) use figures::{cores, metric, mib, percentile_ms, stage_means, summary};
pub(crate) use watch::{Generations, all_ready, until};

/// Requests of a set-up in flight at once, unless a benchmark needs more.
pub(crate) const SETUP_AT_ONCE: usize = 16;
/// The field manager of everything the benchmarks apply.
const MANAGER: &str = "consulbind-bench";
/// Every namespace a benchmark makes starts so, which is how a later run finds those an
/// interrupted one left.
const PREFIX: &str = "bench";

/// Runs one benchmark: the servers up, the release controller built, then `measure` with a
/// [`Bench`]. Whatever it made is taken down after it, whether it passed or failed.
pub(crate) fn run(env: &Env, measure: impl AsyncFnOnce(&Bench) -> Result<()>) -> Result<()> {
    env.up()?;
    if std::env::var_os(BINARY).is_none() {
        build_release()?;
    }
    let vars = env.vars()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let bench = Bench::connect(env, vars).await?;
        let result = measure(&bench).await;
        bench.tear_down(result).await
    })
}

/// A controller binary to run in place of the release built from this tree: to compare two
/// builds on the same servers, back to back.
const BINARY: &str = "CONSULBIND_BENCH_BINARY";

/// The release controller the benchmarks run; for a heap profile, on the C library's malloc,
/// which heaptrack sees (jemalloc it does not).
fn build_release() -> Result<()> {
    println!("==> building the controller (release)");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.current_dir(repo_root()).args(["build", "--release", "--quiet", "-p", "consulbind"]);
    if std::env::var_os(HEAPTRACK).is_some() {
        cargo.arg("--no-default-features");
    }
    process::run(&mut cargo)
}

/// Where a heap profile of the controller goes, if anywhere.
const HEAPTRACK: &str = "CONSULBIND_BENCH_HEAPTRACK";

/// Debian's heaptrack library, preloaded into the controller when `CONSULBIND_BENCH_HEAPTRACK`
/// names where its raw profile goes.
const HEAPTRACK_PRELOAD: &str = "/usr/lib/heaptrack/libheaptrack_preload.so";

/// One run of a benchmark: its clients, and what it made, to take down at the end.
pub(crate) struct Bench {
    run_dir: PathBuf,
    vars: Vec<(&'static str, String)>,
    pub kube: kube::Client,
    /// The plain agent, which `CONSUL_HTTP_ADDR` names.
    pub consul: Consul,
    made: Mutex<Made>,
}

#[derive(Default)]
struct Made {
    namespaces: Vec<String>,
    daemons: Vec<Daemon>,
    after: Vec<Box<dyn FnOnce() + Send>>,
}

impl Bench {
    async fn connect(env: &Env, vars: Vec<(&'static str, String)>) -> Result<Self> {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let kubeconfig = Kubeconfig::read_from(var(&vars, "KUBECONFIG")?)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        let consul = consul_at(&var(&vars, "CONSUL_HTTP_ADDR")?, None).await?;
        let run_dir = env.run_dir().to_owned();
        Ok(Self { run_dir, vars, kube: kube::Client::try_from(config)?, consul, made: Default::default() })
    }

    /// One of [`Self::vars`].
    pub(crate) fn var(&self, name: &str) -> Result<String> {
        var(&self.vars, name)
    }

    /// The environment's variables, as its env file exports them.
    pub(crate) fn vars(&self) -> &[(&'static str, String)] {
        &self.vars
    }

    /// A namespace for this run, `<name>-<pid>`, deleted at the end with the Consul keys under
    /// `<namespace>/` on the plain agent.
    pub(crate) async fn namespace(&self, name: &str) -> Result<String> {
        let ns = format!("{name}-{}", std::process::id());
        let namespace = serde_json::from_value(json!({"metadata": {"name": &ns}}))?;
        Api::<Namespace>::all(self.kube.clone()).create(&PostParams::default(), &namespace).await?;
        self.made().namespaces.push(ns.clone());
        Ok(ns)
    }

    /// Deletes what earlier runs left (an interrupted run keeps its namespaces) and waits until it
    /// is gone: kube-controller-manager deletes their Deployments and ReplicaSets one by one,
    /// which would load the servers during this run.
    pub(crate) async fn clear_earlier_runs(&self) -> Result<()> {
        let namespaces = Api::<Namespace>::all(self.kube.clone());
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let list = namespaces.list(&Default::default()).await?;
            let names = list.items.into_iter().filter_map(|n| n.metadata.name);
            let earlier: Vec<String> = names.filter(|n| n.starts_with(&format!("{PREFIX}-"))).collect();
            if earlier.is_empty() {
                return Ok(());
            }
            for name in &earlier {
                let _ = namespaces.delete(name, &Default::default()).await;
            }
            let left = earlier.join(", ");
            ensure!(Instant::now() < deadline, "namespaces of earlier runs still there after 10 minutes: {left}");
            println!("    waiting for earlier runs' namespaces to go: {left}");
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }

    /// The objects of kind `K` in `ns`.
    pub(crate) fn api<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.kube.clone(), ns)
    }

    /// Rollouts of the Deployment `web` in `ns`, which most benchmarks bind.
    pub(crate) fn web(&self, ns: &str, poll: Duration, within: Duration) -> Rollout {
        Rollout::new(self.api(ns), "web", poll, within)
    }

    /// Applies `manifest`, an object of kind `K`, in `ns` (server-side, taking every field).
    pub(crate) async fn apply<K>(&self, ns: &str, manifest: Value) -> Result<()>
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let name = manifest["metadata"]["name"].as_str().context("a manifest without a name")?.to_owned();
        let apply = PatchParams::apply(MANAGER).force();
        self.api::<K>(ns).patch(&name, &apply, &Patch::Apply(manifest)).await?;
        Ok(())
    }

    /// Starts the release controller as daemon `name`, its admin listener on loopback port
    /// `admin_port`, with `args` besides, the environment's variables and then `env`. Whatever
    /// ran under that name is stopped first. It logs at `CONSULBIND_BENCH_LOG`, `warn` by default.
    pub(crate) fn controller(&self, release: Release) -> Result<Controller> {
        let binary = std::env::var_os(BINARY).map_or_else(|| repo_root().join("target/release/consulbind"), Into::into);
        let mut command = Command::new(binary);
        command
            .args((!release.namespaces.is_empty()).then(|| format!("--namespaces={}", release.namespaces)))
            .arg(format!("--admin-addr=127.0.0.1:{}", release.admin_port))
            // Its default port may be taken, and nothing here reads it.
            .arg("--debug-addr=none")
            .args(release.args)
            .env("RUST_LOG", std::env::var("CONSULBIND_BENCH_LOG").unwrap_or_else(|_| "warn".into()))
            .envs(self.vars.iter().map(|(k, v)| (*k, v)))
            .envs(release.env.iter().copied());
        // A heap profile of the controller, for heaptrack_interpret to read afterwards.
        if let Ok(profile) = std::env::var(HEAPTRACK) {
            command
                .env("LD_PRELOAD", HEAPTRACK_PRELOAD)
                .env("DUMP_HEAPTRACK_OUTPUT", format!("{profile}.{}.raw", release.name));
        }
        let mut controller = self.start(release.name, &mut command)?;
        controller.admin_port = Some(release.admin_port);
        Ok(controller)
    }

    /// Starts `command` as daemon `name`, stopping whatever ran under that name first; it is
    /// stopped at the end if it still runs.
    pub(crate) fn start(&self, name: &'static str, command: &mut Command) -> Result<Controller> {
        let daemon = Daemon::new(name, &self.run_dir);
        daemon.stop()?;
        let started = Instant::now();
        daemon.ensure_started(command)?;
        let pid = daemon.pid().with_context(|| format!("{name} exited at once"))?;
        let mut made = self.made();
        if !made.daemons.iter().any(|d| d.name == name) {
            made.daemons.push(Daemon::new(name, &self.run_dir));
        }
        Ok(Controller { daemon, pid, started, admin_port: None })
    }

    /// kubectl on the environment's API server.
    pub(crate) fn kubectl(&self) -> Result<Command> {
        let mut command = Command::new(provision::kubectl()?);
        command.envs(self.vars.iter().map(|(k, v)| (*k, v)));
        Ok(command)
    }

    /// Runs `undo` at the end, after the namespaces are deleted: for what lives outside them.
    pub(crate) fn after(&self, undo: impl FnOnce() + Send + 'static) {
        self.made().after.push(Box::new(undo));
    }

    fn made(&self) -> std::sync::MutexGuard<'_, Made> {
        self.made.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stops the controllers, then deletes the namespaces and their keys. The benchmark's own
    /// error comes first; a controller that would not stop fails a run that passed.
    async fn tear_down(self, result: Result<()>) -> Result<()> {
        let made = self.made.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut stopped = Ok(());
        // Those a benchmark stopped itself are left alone, which keeps the output quiet.
        for daemon in made.daemons.iter().rev().filter(|d| d.pid().is_some()) {
            if let Err(e) = daemon.stop() {
                stopped = stopped.and(Err(e));
            }
        }
        let namespaces = Api::<Namespace>::all(self.kube.clone());
        for ns in &made.namespaces {
            let _ = namespaces.delete(ns, &Default::default()).await;
            let _ = self.consul.delete(&format!("{ns}/"), true, None).await;
        }
        made.after.into_iter().for_each(|undo| undo());
        result.and(stopped)
    }
}

fn var(vars: &[(&'static str, String)], name: &str) -> Result<String> {
    vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone()).with_context(|| name.to_owned())
}

/// A Consul client of the agent at `address`, with `token` for every request.
pub(crate) async fn consul_at(address: &str, token: Option<&str>) -> Result<Consul> {
    let config = ClientConfig { address: address.to_owned(), token: token.map(Token::new), ..Default::default() };
    Ok(Consul::new(config).await?)
}

/// How [`Bench::controller`] starts the release controller.
pub(crate) struct Release<'a> {
    /// Its daemon's name, which its log and pid files take.
    pub name: &'static str,
    /// Its `--namespaces`; empty, every namespace.
    pub namespaces: &'a str,
    pub admin_port: u16,
    pub args: &'a [String],
    /// Variables over the environment's.
    pub env: &'a [(&'a str, &'a str)],
}

/// A controller a benchmark started, and what is read from it.
pub(crate) struct Controller {
    daemon: Daemon,
    pub pid: u32,
    /// Just before it was started.
    pub started: Instant,
    admin_port: Option<u16>,
}

impl Controller {
    /// The text of its `/metrics`.
    pub(crate) fn metrics(&self) -> Result<String> {
        let port = self.admin_port.context("no admin port")?;
        Ok(process::http_get(port, "/metrics", None).context("reading /metrics")?.1)
    }

    /// Resident memory, in KiB.
    pub(crate) fn rss_kib(&self) -> Result<u64> {
        figures::status_kib(self.pid, "VmRSS")
    }

    /// Resident memory as (anonymous, file-backed), in KiB: the heap and stacks, and the pages of
    /// the binary and libraries that were touched.
    pub(crate) fn rss_split_kib(&self) -> Result<(u64, u64)> {
        Ok((figures::status_kib(self.pid, "RssAnon")?, figures::status_kib(self.pid, "RssFile")?))
    }

    /// The CPU time it has used so far.
    pub(crate) fn cpu_time(&self) -> Result<Duration> {
        figures::cpu_time(self.pid)
    }

    /// Peak resident memory, in KiB.
    pub(crate) fn hwm_kib(&self) -> Result<u64> {
        figures::status_kib(self.pid, "VmHWM")
    }

    pub(crate) fn stop(&self) -> Result<()> {
        self.daemon.stop()
    }
}

/// Runs `make` on every item, `at_once` of them at a time, until all are done or one fails: the
/// set-up of many objects.
pub(crate) async fn each<I, F, T, E>(items: I, at_once: usize, make: impl FnMut(I::Item) -> F) -> Result<()>
where
    I: IntoIterator,
    F: Future<Output = std::result::Result<T, E>>,
    anyhow::Error: From<E>,
{
    stream::iter(items).map(make).buffer_unordered(at_once).try_for_each(|_| async { Ok(()) }).await?;
    Ok(())
}

/// A Deployment that nothing runs (`replicas: 0`): a target whose rollouts cost no pods.
pub(crate) fn deployment(name: &str) -> Value {
    deployment_of(name, 0)
}

/// A Deployment of `replicas`; the bed's node takes none of its pods, so it is never healthy.
pub(crate) fn deployment_of(name: &str, replicas: u32) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]}},
    }})
}

/// A ConsulBinding `name` with `spec`.
pub(crate) fn binding(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": name}, "spec": spec})
}

/// The spec most benchmarks bind with: what `sources` names (its `keys` or `configMaps`, and any
/// `consul`), into the Deployments `targets`, rolled with no quiet period so that a change's
/// latency is the controller's own.
pub(crate) fn rolled_at_once(mut sources: Value, targets: impl IntoIterator<Item = impl AsRef<str>>) -> Value {
    let targets: Vec<Value> = targets.into_iter().map(|t| json!({"kind": "Deployment", "name": t.as_ref()})).collect();
    sources["targets"] = Value::Array(targets);
    sources["rollout"] = json!({"quietPeriod": "0s"});
    sources
}
