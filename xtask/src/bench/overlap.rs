//! `cargo xtask bench overlap`: the controller's resident memory as a tenant names the same
//! Consul data again and again (overlapping prefixes, more bindings), on the real local servers.
//! The distinct data stays the same; memory should too.

use std::time::Duration;

use anyhow::{Result, ensure};
use consulbind_api::ConsulBinding;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

use super::harness::{self, Bench, Controller, Release, binding, cores, deployment, metric};
use crate::env::Env;

const ADMIN_PORT: u16 = 18094;
/// How long each step is given to read and settle before memory is read.
const SETTLE: Duration = Duration::from_secs(15);

pub struct Sizes {
    pub keys: usize,
    pub value_bytes: usize,
    /// The most prefixes one binding names.
    pub prefixes: usize,
    /// The most bindings.
    pub bindings: usize,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    ensure!(sizes.keys > 0 && sizes.prefixes > 0 && sizes.bindings > 0, "need keys, prefixes and bindings");
    harness::run(env, async |bench| measure(bench, &sizes).await)
}

async fn measure(bench: &Bench, sizes: &Sizes) -> Result<()> {
    let ns = bench.namespace("bench-overlap").await?;
    // Every key lies under every prefix a binding names: `<ns>/`, `<ns>/x`, `<ns>/xx`, …
    let root = format!("{ns}/{}", "x".repeat(sizes.prefixes));
    let value = vec![b'v'; sizes.value_bytes];
    let keys: Vec<String> = (0..sizes.keys).map(|i| format!("{root}/key-{i:06}")).collect();
    let distinct: usize = keys.iter().map(|k| k.len() + sizes.value_bytes).sum();
    println!(
        "==> {} keys of {} bytes ({:.2} MB of keys and values) under {root}/",
        sizes.keys,
        sizes.value_bytes,
        distinct as f64 / 1e6
    );
    harness::each(&keys, 8, |key| bench.consul.put(key, &value, None)).await?;
    bench.apply::<Deployment>(&ns, deployment("web")).await?;

    let args = ["--default-token-prefixes=*".to_owned()];
    let release =
        Release { name: "bench-overlap-controller", namespaces: &ns, admin_port: ADMIN_PORT, args: &args, env: &[] };
    let controller = bench.controller(release)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = controller.rss_split_kib()?;
    let mut rows = Vec::new();
    for (count, prefixes) in steps(sizes) {
        rows.push(step(bench, &ns, &controller, (count, prefixes), idle).await?);
    }
    let (idle_anon, idle_file) = idle;
    println!(
        "\nresults: release build, {} cores; idle {} MiB resident ({} MiB anonymous); {:.2} MB of distinct keys \
         and values; memory read {} s after each step:",
        cores(),
        mib(idle_anon + idle_file),
        mib(idle_anon),
        distinct as f64 / 1e6,
        SETTLE.as_secs()
    );
    println!(
        "| bindings | prefixes each | paths watched | distinct entries held | resident MiB | anonymous MiB | above idle |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    rows.iter().for_each(|r| println!("{r}"));
    println!("peak resident memory (VmHWM): {} MiB", mib(controller.hwm_kib()?));
    Ok(())
}

/// (bindings, prefixes each) of every step: one binding naming more and more prefixes, four
/// times as many each step, then more bindings naming the most.
fn steps(sizes: &Sizes) -> Vec<(usize, usize)> {
    let mut steps = vec![(1, 1)];
    let mut prefixes = 4;
    while prefixes < sizes.prefixes {
        steps.push((1, prefixes));
        prefixes *= 4;
    }
    steps.push((1, sizes.prefixes));
    if sizes.bindings > 1 {
        steps.push((sizes.bindings, sizes.prefixes));
    }
    steps.dedup();
    steps
}

/// Applies `count` bindings of `prefixes` prefixes each, lets them settle, and returns the table
/// row of what the controller then holds.
async fn step(
    bench: &Bench,
    ns: &str,
    controller: &Controller,
    (count, prefixes): (usize, usize),
    (idle_anon, idle_file): (u64, u64),
) -> Result<String> {
    for b in 0..count {
        let keys: Vec<_> = (0..prefixes)
            .map(|p| json!({"key": format!("{ns}/{}", "x".repeat(p)), "recurse": true, "optional": true}))
            .collect();
        // The default quiet period: nothing changes here, only memory is read.
        let spec = json!({"keys": keys, "targets": [{"kind": "Deployment", "name": "web"}]});
        bench.apply::<ConsulBinding>(ns, binding(&format!("b{b}"), spec)).await?;
    }
    tokio::time::sleep(SETTLE).await;
    let metrics = controller.metrics()?;
    let (anon, file) = controller.rss_split_kib()?;
    let entries = metric(&metrics, "consulbind_consul_entries").unwrap_or_default();
    let paths = metric(&metrics, "consulbind_consul_watches").unwrap_or_default();
    Ok(format!(
        "| {count} | {prefixes} | {paths} | {entries} | {} | {} | +{} |",
        mib(anon + file),
        mib(anon),
        mib((anon + file).saturating_sub(idle_anon + idle_file))
    ))
}

/// KiB as MiB with one decimal and no unit, for the table whose columns name it.
fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}
