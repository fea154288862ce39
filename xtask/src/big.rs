//! `cargo xtask bench big`: the controller's resident memory with one binding of large values,
//! on the real local servers: before the binding, once it is Ready, and after each change.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use consulbind_api::ConsulBinding;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Namespace};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::{
    bench::{all_ready, hwm_kib, rss_kib},
    env::Env,
};

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
    let (vars, runtime) = crate::bench::prepare(env)?;
    runtime.block_on(measure(env, &vars, &sizes))
}

async fn measure(env: &Env, vars: &[(&'static str, String)], sizes: &Sizes) -> Result<()> {
    let (client, consul, ns) = crate::bench::clients_and_namespace(vars, "bench-big").await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
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
    stream::iter((0..sizes.prefixes).flat_map(|p| (0..sizes.values).map(move |i| (p, i))))
        .map(|(p, i)| {
            let (consul, value, key) = (&consul, &value, format!("{}{i}", prefix(p)));
            async move { consul.put(&key, value, None).await }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    let apply = PatchParams::apply("consulbind-bench").force();
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    deployments.patch("web", &apply, &Patch::Apply(crate::scale::deployment("web"))).await?;

    let largest_prefix = sizes.values * (sizes.value_bytes + 64);
    let args = [
        format!("--max-prefix-bytes={}", largest_prefix.max(4 << 20)),
        format!("--max-binding-bytes={}", (total + total / 8).max(32 << 20)),
        "--default-token-prefixes=*".to_owned(),
    ];
    let (controller, pid) =
        crate::bench::release_controller(env, "bench-big-controller", vars, &ns, ADMIN_PORT, &args, &[])?;

    let result = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle = rss_kib(pid)?;
        let keys: Vec<_> = (0..sizes.prefixes).map(|p| json!({"key": prefix(p), "recurse": true})).collect();
        let binding = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding",
                             "metadata": {"name": "big"},
                             "spec": {"keys": keys, "targets": [{"kind": "Deployment", "name": "web"}],
                                      "rollout": {"quietPeriod": "0s"}}});
        let bindings = Api::<ConsulBinding>::namespaced(client.clone(), &ns);
        let created = Instant::now();
        bindings.patch("big", &apply, &Patch::Apply(binding)).await?;
        ensure!(all_ready(&bindings, 1, READY_WITHIN).await?, "the binding is not Ready after {READY_WITHIN:?}");
        let ready_after = created.elapsed();
        let ready = rss_kib(pid)?;

        let mut after_changes = Vec::new();
        for change in 1..=sizes.changes {
            let before = deployments.get("web").await?.metadata.generation;
            let key = format!("{}0", prefix(change % sizes.prefixes));
            consul.put(&key, &vec![b'a' + (change % 26) as u8; sizes.value_bytes], None).await?;
            let written = Instant::now();
            while deployments.get("web").await?.metadata.generation == before {
                ensure!(written.elapsed() < Duration::from_secs(60), "no rollout within 60 s of writing {key}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            after_changes.push(rss_kib(pid)?);
        }
        let peak = hwm_kib(pid)?;
        let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
        println!(
            "\nresults: one binding of {:.1} MB ({} × {} × {} bytes), release build, {} cores:",
            total as f64 / 1e6,
            sizes.prefixes,
            sizes.values,
            sizes.value_bytes,
            std::thread::available_parallelism().map_or(0, |n| n.get())
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
        println!("  peak resident memory (VmHWM):          {}", mib(peak));
        Ok(())
    }
    .await;

    controller.stop()?;
    let _ = namespaces.delete(&ns, &Default::default()).await;
    let _ = consul.delete(&format!("{ns}/"), true, None).await;
    result
}
