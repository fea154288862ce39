//! `cargo xtask bench tenants`: one namespace with many Consul tokens of its own, and another
//! namespace with one, on the ACL agent. Measures the quiet namespace's change-to-rollout
//! latency while the busy one takes turns, and the busy one's own latency in its turns.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use consul_kv::{Client as Consul, ClientConfig, Token};
use consulbind_api::{ConsulBinding, conditions};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Namespace, Secret},
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{
    bench::{all_ready, metric, rss_kib},
    env::Env,
    process, provision,
};

const ADMIN_PORT: u16 = 18092;
const SETUP_CONCURRENCY: usize = 16;
/// How often the Deployment's generation is read while waiting for a rollout.
const POLL: Duration = Duration::from_millis(5);
/// Time the timed writes spent in Consul's PUT alone, in microseconds.
static PUT_MICROS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
    let (vars, runtime) = crate::bench::prepare(env)?;
    runtime.block_on(measure(env, &vars, &sizes))
}

async fn measure(env: &Env, vars: &[(&'static str, String)], sizes: &Sizes) -> Result<()> {
    let var = |name: &str| crate::bench::var(vars, name);
    let client = crate::bench::kube_client(vars).await?;
    let (acl_addr, master) = (var("CONSULBIND_E2E_ACL_ADDR")?, var("CONSULBIND_E2E_ACL_TOKEN")?);
    let consul =
        Consul::new(ClientConfig { address: acl_addr.clone(), token: Some(Token::new(&master)), ..Default::default() })
            .await?;
    let consul_cli = provision::tools()?.consul;
    let acl = |args: &[&str]| {
        let mut cmd = Command::new(&consul_cli);
        cmd.args(["acl"]).args(args).env("CONSUL_HTTP_ADDR", &acl_addr).env("CONSUL_HTTP_TOKEN", &master);
        process::capture(&mut cmd)
    };

    let run = std::process::id();
    let (busy, quiet) = (format!("bench-busy-{run}"), format!("bench-quiet-{run}"));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&busy, &quiet] {
        namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}}))?).await?;
    }
    let scopes = sizes.scopes;
    println!("==> {scopes} Consul tokens and bindings in {busy}, one in {quiet}, on the ACL agent");
    let setup = Instant::now();
    for ns in [&busy, &quiet] {
        let rules = format!("key_prefix \"{ns}/\" {{ policy = \"read\" }}");
        acl(&["policy", "create", &format!("-name={ns}"), &format!("-rules={rules}")])?;
    }
    let token = |ns: &str| -> Result<String> {
        let out = acl(&["token", "create", &format!("-policy-name={ns}"), "-format=json"])?;
        let parsed: serde_json::Value = serde_json::from_str(&out)?;
        Ok(parsed["SecretID"].as_str().context("SecretID")?.to_owned())
    };
    let busy_tokens: Vec<String> = (0..scopes).map(|_| token(&busy)).collect::<Result<_>>()?;
    let burst_tokens: Vec<String> = (0..sizes.burst).map(|_| token(&busy)).collect::<Result<_>>()?;
    let quiet_token = token(&quiet)?;

    let apply = PatchParams::apply("consulbind-bench").force();
    let put = |ns: &str, name: &str, token: &str, key: &str| {
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": name, "labels": {"consulbind.dev/token": "true"}},
                            "stringData": {"token": token}});
        let binding = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": name},
                             "spec": {"keys": [{"key": key}], "targets": [{"kind": "Deployment", "name": "web"}],
                                      "rollout": {"quietPeriod": "0s"}, "consul": {"tokenSecretRef": {"name": name}}}});
        let (secrets, bindings) =
            (Api::<Secret>::namespaced(client.clone(), ns), Api::<ConsulBinding>::namespaced(client.clone(), ns));
        let (apply, consul, name, key) = (&apply, &consul, name.to_owned(), key.to_owned());
        async move {
            consul.put(&key, b"v0", None).await?;
            secrets.patch(&name, apply, &Patch::Apply(secret)).await?;
            bindings.patch(&name, apply, &Patch::Apply(binding)).await?;
            anyhow::Ok(())
        }
    };
    for ns in [&busy, &quiet] {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .patch("web", &apply, &Patch::Apply(crate::scale::deployment("web")))
            .await?;
    }
    let busy_key = |i: usize| format!("{busy}/k{i:04}");
    stream::iter(busy_tokens.iter().enumerate())
        .map(|(i, token)| put(&busy, &format!("b{i:04}"), token, &busy_key(i)))
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    let quiet_key = format!("{quiet}/config");
    put(&quiet, "cfg", &quiet_token, &quiet_key).await?;
    println!("    set up in {:.0} s", setup.elapsed().as_secs_f64());

    let args = [format!("--consul-max-connections={}", sizes.max_connections)];
    let served = format!("{busy},{quiet}");
    let overrides = [("CONSUL_HTTP_ADDR", acl_addr.as_str())];
    let (controller, pid) = crate::bench::release_controller(
        env,
        "bench-tenants-controller",
        vars,
        &served,
        ADMIN_PORT,
        &args,
        &overrides,
    )?;

    let result = async {
        let (busy_bindings, quiet_bindings) = (
            Api::<ConsulBinding>::namespaced(client.clone(), &busy),
            Api::<ConsulBinding>::namespaced(client.clone(), &quiet),
        );
        let ready = Duration::from_secs(600);
        ensure!(
            all_ready(&busy_bindings, scopes, ready).await?,
            "the busy namespace's bindings: not all Ready in 600 s"
        );
        ensure!(all_ready(&quiet_bindings, 1, ready).await?, "the quiet namespace's binding: not Ready in 600 s");
        let in_turns = busy_bindings
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|b| reason(b, conditions::CONSUL_SYNCED) == Some(conditions::reason::WATCHES_IN_TURNS))
            .count();

        let quiet_web = Api::<Deployment>::namespaced(client.clone(), &quiet);
        let busy_web = Api::<Deployment>::namespaced(client.clone(), &busy);
        let mut quiet_synced_left = 0;
        let mut latencies = Vec::new();
        for change in 1..=sizes.changes {
            latencies.push(rollout(&consul, &quiet_web, &quiet_key, change).await?);
            let binding = quiet_bindings.get("cfg").await?;
            if reason(&binding, conditions::CONSUL_SYNCED) != Some(conditions::reason::SYNCED) {
                quiet_synced_left += 1;
            }
        }
        let mut busy_latencies = Vec::new();
        for change in 1..=sizes.busy_changes {
            let key = busy_key(change * 7 % scopes);
            busy_latencies.push(rollout(&consul, &busy_web, &key, change).await?);
        }
        // A burst: the busy namespace adds many scopes at once while the quiet one changes.
        let mut burst_latencies = Vec::new();
        let mut burst_took = Duration::ZERO;
        let mut burst_puts = Duration::ZERO;
        let mut burst_requests = 0.0;
        if sizes.burst > 0 {
            let requests = || -> Result<f64> {
                let text = process::http_get(ADMIN_PORT, "/metrics", None).context("reading /metrics")?.1;
                let total = text.lines().filter(|l| l.starts_with("consulbind_consul_requests_total"));
                Ok(total.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum())
            };
            let requests_before = requests()?;
            let puts_before = PUT_MICROS.load(std::sync::atomic::Ordering::Relaxed);
            let started = Instant::now();
            let adding = stream::iter(burst_tokens.iter().enumerate())
                .map(|(i, token)| put(&busy, &format!("burst{i:04}"), token, &busy_key(scopes + i)))
                .buffer_unordered(SETUP_CONCURRENCY)
                .try_collect::<Vec<_>>();
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
                burst_latencies.push(rollout(&consul, &quiet_web, &quiet_key, change).await?);
                let ready = added && count_ready(&busy_bindings).await? == scopes + sizes.burst;
                if ready || started.elapsed() > Duration::from_secs(300) {
                    burst_took = started.elapsed();
                    let puts = PUT_MICROS.load(std::sync::atomic::Ordering::Relaxed) - puts_before;
                    burst_puts = Duration::from_micros(puts);
                    burst_requests = requests()? - requests_before;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let metrics = process::http_get(ADMIN_PORT, "/metrics", None).context("reading /metrics")?.1;
        let groups_in_turns =
            metric(&metrics, &format!("consulbind_consul_watch_groups_in_turns{{namespace=\"{busy}\"}}"));

        let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
        let summary = |latencies: &mut Vec<Duration>| {
            latencies.sort();
            let pct = |p: f64| ms(&latencies[((latencies.len() as f64 - 1.0) * p).round() as usize]);
            format!(
                "p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms  ({} changes)",
                pct(0.5),
                pct(0.9),
                pct(0.99),
                ms(latencies.last().unwrap()),
                latencies.len()
            )
        };
        println!(
            "\nresults: {scopes} token scopes in one namespace, 1 in another, budget {} connections, {} cores",
            sizes.max_connections,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!("  busy bindings whose ConsulSynced says WatchesInTurns:  {in_turns} of {scopes}");
        println!("  busy namespace's groups in turns (metric):            {}", groups_in_turns.unwrap_or(f64::NAN));
        println!("  quiet namespace, Consul write to new generation:      {}", summary(&mut latencies));
        println!("  quiet namespace, ConsulSynced not Synced after a change: {quiet_synced_left}");
        if !busy_latencies.is_empty() {
            println!("  busy namespace, in its turns:                         {}", summary(&mut busy_latencies));
        }
        if !burst_latencies.is_empty() {
            println!(
                "  quiet namespace while {} more scopes came at once ({:.0} s to all Ready): {}",
                sizes.burst,
                burst_took.as_secs_f64(),
                summary(&mut burst_latencies)
            );
            println!(
                "    of which in the PUT itself: {:.0} ms in all; the controller's Consul requests meanwhile: {burst_requests} ({:.0}/s)",
                burst_puts.as_secs_f64() * 1000.0,
                burst_requests / burst_took.as_secs_f64().max(0.001)
            );
        }
        println!("  resident memory: {} MiB", rss_kib(pid)? / 1024);
        ensure!(quiet_synced_left == 0, "the quiet namespace's ConsulSynced left Synced");
        Ok(())
    }
    .await;

    controller.stop()?;
    for ns in [&busy, &quiet] {
        let _ = namespaces.delete(ns, &Default::default()).await;
        let _ = acl(&["policy", "delete", &format!("-name={ns}")]);
    }
    result
}

/// Writes `change` to `key` and waits until the Deployment `web` has a new generation.
async fn rollout(consul: &Consul, deployments: &Api<Deployment>, key: &str, change: usize) -> Result<Duration> {
    let before = deployments.get("web").await?.metadata.generation;
    let written = Instant::now();
    consul.put(key, format!("v{change}").as_bytes(), None).await?;
    PUT_MICROS.fetch_add(written.elapsed().as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
    loop {
        if deployments.get("web").await?.metadata.generation != before {
            return Ok(written.elapsed());
        }
        ensure!(written.elapsed() < Duration::from_secs(120), "no rollout within 120 s of writing {key}");
        tokio::time::sleep(POLL).await;
    }
}

fn reason<'a>(binding: &'a ConsulBinding, type_: &str) -> Option<&'a str> {
    let conditions = &binding.status.as_ref()?.conditions;
    conditions.iter().find(|c| c.type_ == type_).map(|c| c.reason.as_str())
}

/// How many of the bindings say Ready=True now.
async fn count_ready(api: &Api<ConsulBinding>) -> Result<usize> {
    let list = api.list(&ListParams::default()).await?;
    Ok(list.items.iter().filter(|b| reason_status(b) == Some("True")).count())
}

fn reason_status(binding: &ConsulBinding) -> Option<&str> {
    let conditions = &binding.status.as_ref()?.conditions;
    conditions.iter().find(|c| c.type_ == conditions::READY).map(|c| c.status.as_str())
}
