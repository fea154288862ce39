//! `cargo xtask bench big`: the controller's resident memory with one binding of large values,
//! on the real local servers: before the binding, once it is Ready, and after each change.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use consulbind_api::ConsulBinding;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

use super::harness::{self, Bench, Release, all_ready, binding, cores, deployment, mib, rolled_at_once};
use crate::env::Env;

/// How long the binding may take to be Ready.
const READY_WITHIN: Duration = Duration::from_secs(120);
const ADMIN_PORT: u16 = 18093;

pub struct Sizes {
    pub prefixes: usize,
    pub values: usize,
    pub value_bytes: usize,
    pub changes: usize,
}

pub fn run(env: &Env, sizes: Sizes) -> Result<()> {
    ensure!(sizes.prefixes > 0 && sizes.values > 0, "need at least one prefix and one value");
    harness::run(env, async |bench| measure(bench, &sizes).await)
}

async fn measure(bench: &Bench, sizes: &Sizes) -> Result<()> {
    let ns = bench.namespace("bench-big").await?;
    let total = sizes.prefixes * sizes.values * sizes.value_bytes;
    println!(
        "==> {} prefixes of {} values of {} bytes ({:.1} MB) under {ns}/",
        sizes.prefixes,
        sizes.values,
        sizes.value_bytes,
        total as f64 / 1e6
    );
    let value = vec![b'x'; sizes.value_bytes];
    let prefix = |p: usize| format!("{ns}/p{p:03}/");
    let keys = (0..sizes.prefixes).flat_map(|p| (0..sizes.values).map(move |i| (p, i)));
    harness::each(keys, 8, |(p, i)| {
        let (consul, value, key) = (&bench.consul, &value, format!("{}{i}", prefix(p)));
        async move { consul.put(&key, value, None).await }
    })
    .await?;
    bench.apply::<Deployment>(&ns, deployment("web")).await?;

    let largest_prefix = sizes.values * (sizes.value_bytes + 64);
    let args = [
        format!("--max-prefix-bytes={}", largest_prefix.max(4 << 20)),
        format!("--max-binding-bytes={}", (total + total / 8).max(32 << 20)),
        "--default-token-prefixes=*".to_owned(),
    ];
    let release =
        Release { name: "bench-big-controller", namespaces: &ns, admin_port: ADMIN_PORT, args: &args, env: &[] };
    let controller = bench.controller(release)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = controller.rss_kib()?;

    let keys: Vec<_> = (0..sizes.prefixes).map(|p| json!({"key": prefix(p), "recurse": true})).collect();
    let created = Instant::now();
    bench.apply::<ConsulBinding>(&ns, binding("big", rolled_at_once(json!({"keys": keys}), ["web"]))).await?;
    let bindings = bench.api::<ConsulBinding>(&ns);
    ensure!(all_ready(&bindings, 1, READY_WITHIN).await?, "the binding is not Ready after {READY_WITHIN:?}");
    let ready_after = created.elapsed();
    let ready = controller.rss_kib()?;

    let web = bench.web(&ns, Duration::from_millis(20), Duration::from_secs(60));
    let mut after_changes = Vec::new();
    for change in 1..=sizes.changes {
        let key = format!("{}0", prefix(change % sizes.prefixes));
        let value = vec![b'a' + (change % 26) as u8; sizes.value_bytes];
        web.after(&format!("writing {key}"), bench.consul.put(&key, &value, None)).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        after_changes.push(controller.rss_kib()?);
    }
    println!(
        "\nresults: one binding of {:.1} MB ({} × {} × {} bytes), release build, {} cores:",
        total as f64 / 1e6,
        sizes.prefixes,
        sizes.values,
        sizes.value_bytes,
        cores()
    );
    println!("  resident memory before the binding:    {}", mib(idle));
    println!(
        "  resident memory once Ready:            {}  (Ready after {:.1} s)",
        mib(ready),
        ready_after.as_secs_f64()
    );
    for (i, kib) in after_changes.iter().enumerate() {
        println!("  resident memory after change {:>3}:     {}", i + 1, mib(*kib));
    }
    println!("  peak resident memory (VmHWM):          {}", mib(controller.hwm_kib()?));
    Ok(())
}
