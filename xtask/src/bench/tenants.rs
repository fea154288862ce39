//! `cargo xtask bench tenants`: one namespace with many Consul tokens of its own, and another
//! namespace with one, on the ACL agent. Measures the quiet namespace's change-to-rollout
//! latency while the busy one takes turns, and the busy one's own latency in its turns.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use consul_kv::Client as Consul;
use consulbind_api::{ConsulBinding, conditions};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Secret};
use kube::{Api, api::ListParams};
use serde_json::json;

use super::harness::{
    self, Bench, Controller, Release, SETUP_AT_ONCE, all_ready, binding, cores, deployment, metric, rolled_at_once,
    summary,
};
use crate::{env::Env, env::provision, process};

const ADMIN_PORT: u16 = 18092;
/// How often the Deployment's generation is read while waiting for a rollout.
const POLL: Duration = Duration::from_millis(5);
/// How long a rollout may take before the benchmark fails.
const ROLLOUT_WITHIN: Duration = Duration::from_secs(120);

pub struct Sizes {
    pub scopes: usize,
    pub changes: usize,
    pub busy_changes: usize,
    pub max_connections: usize,
    /// Token scopes the busy namespace adds at once, after the steady phases.
    pub burst: usize,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    ensure!(sizes.scopes > 0 && sizes.changes > 0, "need at least one scope and one change");
    harness::run(env, async |bench| measure(bench, &sizes).await)
}

/// The ACL agent, with its master token, as the consul CLI and a client.
struct Acl {
    cli: PathBuf,
    addr: String,
    master: String,
    consul: Consul,
}

impl Acl {
    async fn connect(bench: &Bench) -> Result<Self> {
        let (addr, master) = (bench.var("CONSULBIND_E2E_ACL_ADDR")?, bench.var("CONSULBIND_E2E_ACL_TOKEN")?);
        let consul = harness::consul_at(&addr, Some(&master)).await?;
        Ok(Self { cli: provision::tools()?.consul, addr, master, consul })
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        run_acl(&self.cli, &self.addr, &self.master, args)
    }

    /// A policy that reads the keys under `<ns>/`, deleted at the end of the run.
    fn policy(&self, bench: &Bench, ns: &str) -> Result<()> {
        let rules = format!("key_prefix \"{ns}/\" {{ policy = \"read\" }}");
        self.run(&["policy", "create", &format!("-name={ns}"), &format!("-rules={rules}")])?;
        let (cli, addr, master, name) =
            (self.cli.clone(), self.addr.clone(), self.master.clone(), format!("-name={ns}"));
        bench.after(move || drop(run_acl(&cli, &addr, &master, &["policy", "delete", &name])));
        Ok(())
    }

    /// A new token of the policy `ns`.
    fn token(&self, ns: &str) -> Result<String> {
        let out = self.run(&["token", "create", &format!("-policy-name={ns}"), "-format=json"])?;
        let parsed: serde_json::Value = serde_json::from_str(&out)?;
        Ok(parsed["SecretID"].as_str().context("SecretID")?.to_owned())
    }
}

fn run_acl(cli: &Path, addr: &str, master: &str, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new(cli);
    cmd.args(["acl"]).args(args).env("CONSUL_HTTP_ADDR", addr).env("CONSUL_HTTP_TOKEN", master);
    process::capture(&mut cmd)
}

/// The namespace of many token scopes and the one beside it, and how to bind in them.
struct Tenants<'a> {
    bench: &'a Bench,
    acl: Acl,
    busy: String,
    quiet: String,
}

impl Tenants<'_> {
    fn busy_key(&self, i: usize) -> String {
        format!("{}/k{i:04}", self.busy)
    }

    fn quiet_key(&self) -> String {
        format!("{}/config", self.quiet)
    }

    /// A key, a token Secret and a binding that reads the key with it, all named `name`.
    async fn bind(&self, ns: &str, name: &str, token: &str, key: &str) -> Result<()> {
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": name, "labels": {"consulbind.dev/token": "true"}},
                            "stringData": {"token": token}});
        let sources = json!({"keys": [{"key": key}], "consul": {"tokenSecretRef": {"name": name}}});
        self.acl.consul.put(key, b"v0", None).await?;
        self.bench.apply::<Secret>(ns, secret).await?;
        self.bench.apply::<ConsulBinding>(ns, binding(name, rolled_at_once(sources, ["web"]))).await
    }

    /// Binds `tokens` in the busy namespace, as `<prefix><i>` on the keys from `first` on.
    async fn bind_busy(&self, tokens: &[String], prefix: &str, first: usize) -> Result<()> {
        harness::each(tokens.iter().enumerate(), SETUP_AT_ONCE, |(i, token)| {
            let (name, key) = (format!("{prefix}{i:04}"), self.busy_key(first + i));
            async move { self.bind(&self.busy, &name, token, &key).await }
        })
        .await
    }

    /// Writes change number `change` to `key` and times it until `web` in `ns` rolls; adds the
    /// time of the write alone to `puts`.
    async fn rollout(&self, ns: &str, key: &str, change: usize, puts: &mut Duration) -> Result<Duration> {
        let web = self.bench.web(ns, POLL, ROLLOUT_WITHIN);
        let value = format!("v{change}");
        let timed = web.after(&format!("writing {key}"), self.acl.consul.put(key, value.as_bytes(), None)).await?;
        *puts += timed.change;
        Ok(timed.total)
    }
}

async fn measure(bench: &Bench, sizes: &Sizes) -> Result<()> {
    let acl = Acl::connect(bench).await?;
    let (busy, quiet) = (bench.namespace("bench-busy").await?, bench.namespace("bench-quiet").await?);
    let t = Tenants { bench, acl, busy, quiet };
    let scopes = sizes.scopes;
    println!("==> {scopes} Consul tokens and bindings in {}, one in {}, on the ACL agent", t.busy, t.quiet);
    let setup = Instant::now();
    for ns in [&t.busy, &t.quiet] {
        t.acl.policy(bench, ns)?;
    }
    let busy_tokens: Vec<String> = (0..scopes).map(|_| t.acl.token(&t.busy)).collect::<Result<_>>()?;
    let burst_tokens: Vec<String> = (0..sizes.burst).map(|_| t.acl.token(&t.busy)).collect::<Result<_>>()?;
    let quiet_token = t.acl.token(&t.quiet)?;
    for ns in [&t.busy, &t.quiet] {
        bench.apply::<Deployment>(ns, deployment("web")).await?;
    }
    t.bind_busy(&busy_tokens, "b", 0).await?;
    t.bind(&t.quiet, "cfg", &quiet_token, &t.quiet_key()).await?;
    println!("    set up in {:.0} s", setup.elapsed().as_secs_f64());

    let args = [format!("--consul-max-connections={}", sizes.max_connections)];
    let served = format!("{},{}", t.busy, t.quiet);
    let env = [("CONSUL_HTTP_ADDR", t.acl.addr.as_str())];
    let release = Release {
        name: "bench-tenants-controller",
        namespaces: &served,
        admin_port: ADMIN_PORT,
        args: &args,
        env: &env,
    };
    let controller = bench.controller(release)?;
    let in_turns = ready(&t, scopes).await?;
    let mut steady = steady(&t, sizes).await?;
    let mut burst = burst(&t, sizes, &burst_tokens, &controller).await?;
    let metrics = controller.metrics()?;
    let groups_in_turns =
        metric(&metrics, &format!("consulbind_consul_watch_groups_in_turns{{namespace=\"{}\"}}", t.busy));

    let quantiles = [0.5, 0.9, 0.99];
    println!(
        "\nresults: {scopes} token scopes in one namespace, 1 in another, budget {} connections, {} cores",
        sizes.max_connections,
        cores()
    );
    println!("  busy bindings whose ConsulSynced says WatchesInTurns:  {in_turns} of {scopes}");
    println!("  busy namespace's groups in turns (metric):            {}", groups_in_turns.unwrap_or(f64::NAN));
    println!("  quiet namespace, Consul write to new generation:      {}", summary(&mut steady.quiet, &quantiles));
    println!("  quiet namespace, ConsulSynced not Synced after a change: {}", steady.not_synced);
    if !steady.busy.is_empty() {
        println!("  busy namespace, in its turns:                         {}", summary(&mut steady.busy, &quantiles));
    }
    if !burst.latencies.is_empty() {
        println!(
            "  quiet namespace while {} more scopes came at once ({:.0} s to all Ready): {}",
            sizes.burst,
            burst.took.as_secs_f64(),
            summary(&mut burst.latencies, &quantiles)
        );
        println!(
            "    of which in the PUT itself: {:.0} ms in all; the controller's Consul requests meanwhile: {} ({:.0}/s)",
            burst.puts.as_secs_f64() * 1000.0,
            burst.requests,
            burst.requests / burst.took.as_secs_f64().max(0.001)
        );
    }
    println!("  resident memory: {} MiB", controller.rss_kib()? / 1024);
    ensure!(steady.not_synced == 0, "the quiet namespace's ConsulSynced left Synced");
    Ok(())
}

/// Waits until every binding is Ready, and returns how many of the busy ones take turns.
async fn ready(t: &Tenants<'_>, scopes: usize) -> Result<usize> {
    let (busy, quiet) = (t.bench.api::<ConsulBinding>(&t.busy), t.bench.api::<ConsulBinding>(&t.quiet));
    let within = Duration::from_secs(600);
    ensure!(all_ready(&busy, scopes, within).await?, "the busy namespace's bindings: not all Ready in 600 s");
    ensure!(all_ready(&quiet, 1, within).await?, "the quiet namespace's binding: not Ready in 600 s");
    let list = busy.list(&ListParams::default()).await?;
    let in_turns = |b: &&ConsulBinding| {
        condition(b, conditions::CONSUL_SYNCED).map(|c| c.1) == Some(conditions::reason::WATCHES_IN_TURNS)
    };
    Ok(list.items.iter().filter(in_turns).count())
}

/// The steady phases' latencies: the quiet namespace's, then the busy one's in its turns.
struct Steady {
    quiet: Vec<Duration>,
    busy: Vec<Duration>,
    /// Changes after which the quiet binding's ConsulSynced was not Synced.
    not_synced: usize,
}

async fn steady(t: &Tenants<'_>, sizes: &Sizes) -> Result<Steady> {
    let quiet_bindings = t.bench.api::<ConsulBinding>(&t.quiet);
    let mut puts = Duration::ZERO;
    let mut result = Steady { quiet: Vec::new(), busy: Vec::new(), not_synced: 0 };
    for change in 1..=sizes.changes {
        result.quiet.push(t.rollout(&t.quiet, &t.quiet_key(), change, &mut puts).await?);
        let binding = quiet_bindings.get("cfg").await?;
        if condition(&binding, conditions::CONSUL_SYNCED).map(|c| c.1) != Some(conditions::reason::SYNCED) {
            result.not_synced += 1;
        }
    }
    for change in 1..=sizes.busy_changes {
        let key = t.busy_key(change * 7 % sizes.scopes);
        result.busy.push(t.rollout(&t.busy, &key, change, &mut puts).await?);
    }
    Ok(result)
}

/// The quiet namespace's latencies while the busy one added many scopes at once.
#[derive(Default)]
struct Burst {
    latencies: Vec<Duration>,
    /// Until every binding was Ready.
    took: Duration,
    /// In the PUTs of the timed writes alone.
    puts: Duration,
    /// The controller's Consul requests meanwhile.
    requests: f64,
}

/// A burst: the busy namespace adds many scopes at once while the quiet one changes.
async fn burst(t: &Tenants<'_>, sizes: &Sizes, tokens: &[String], controller: &Controller) -> Result<Burst> {
    let mut burst = Burst::default();
    if sizes.burst == 0 {
        return Ok(burst);
    }
    let requests = || -> Result<f64> {
        let text = controller.metrics()?;
        let total = text.lines().filter(|l| l.starts_with("consulbind_consul_requests_total"));
        Ok(total.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum())
    };
    let requests_before = requests()?;
    let busy_bindings = t.bench.api::<ConsulBinding>(&t.busy);
    let started = Instant::now();
    let adding = t.bind_busy(tokens, "burst", sizes.scopes);
    tokio::pin!(adding);
    let mut added = false;
    let mut change = sizes.changes;
    loop {
        if !added {
            tokio::select! {
                result = &mut adding => { result?; added = true; }
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
        }
        change += 1;
        burst.latencies.push(t.rollout(&t.quiet, &t.quiet_key(), change, &mut burst.puts).await?);
        let ready = added && count_ready(&busy_bindings).await? == sizes.scopes + sizes.burst;
        if ready || started.elapsed() > Duration::from_secs(300) {
            burst.took = started.elapsed();
            burst.requests = requests()? - requests_before;
            return Ok(burst);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The (status, reason) of a binding's condition `type_`.
fn condition<'a>(binding: &'a ConsulBinding, type_: &str) -> Option<(&'a str, &'a str)> {
    let conditions = &binding.status.as_ref()?.conditions;
    conditions.iter().find(|c| c.type_ == type_).map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// How many of the bindings say Ready=True now.
async fn count_ready(api: &Api<ConsulBinding>) -> Result<usize> {
    let list = api.list(&ListParams::default()).await?;
    Ok(list.items.iter().filter(|b| condition(b, conditions::READY).map(|c| c.0) == Some("True")).count())
}
