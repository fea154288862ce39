//! `cargo xtask bench overlap`: the controller's resident memory as a tenant names the same
//! Consul data again and again (overlapping prefixes, more bindings), on the real local servers.
//! The distinct data stays the same; memory should too.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use consulbind_api::ConsulBinding;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Namespace};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::{
    bench::{hwm_kib, metric, rss_split_kib},
    env::Env,
    process,
};

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
    let (vars, runtime) = crate::bench::prepare(env)?;
    runtime.block_on(measure(env, &vars, &sizes))
}

async fn measure(env: &Env, vars: &[(&'static str, String)], sizes: &Sizes) -> Result<()> {
    let (client, consul, ns) = crate::bench::clients_and_namespace(vars, "bench-overlap").await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());

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
    stream::iter(&keys).map(|key| consul.put(key, &value, None)).buffer_unordered(8).try_collect::<Vec<_>>().await?;
    let apply = PatchParams::apply("consulbind-bench").force();
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .patch("web", &apply, &Patch::Apply(crate::scale::deployment("web")))
        .await?;

    let _admin = format!("127.0.0.1:{ADMIN_PORT}");
    let args = ["--default-token-prefixes=*".to_owned()];
    let (controller, pid) =
        crate::bench::release_controller(env, "bench-overlap-controller", vars, &ns, ADMIN_PORT, &args, &[])?;

    let result = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (idle_anon, idle_file) = rss_split_kib(pid)?;
        let bindings = Api::<ConsulBinding>::namespaced(client.clone(), &ns);
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
        let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
        let mut rows = Vec::new();
        for (count, prefixes) in steps {
            for b in 0..count {
                let keys: Vec<_> = (0..prefixes)
                    .map(|p| json!({"key": format!("{ns}/{}", "x".repeat(p)), "recurse": true, "optional": true}))
                    .collect();
                let binding = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding",
                                     "metadata": {"name": format!("b{b}")},
                                     "spec": {"keys": keys, "targets": [{"kind": "Deployment", "name": "web"}]}});
                bindings.patch(&format!("b{b}"), &apply, &Patch::Apply(binding)).await?;
            }
            tokio::time::sleep(SETTLE).await;
            let metrics = process::http_get(ADMIN_PORT, "/metrics", None).context("reading /metrics")?.1;
            let (anon, file) = rss_split_kib(pid)?;
            let entries = metric(&metrics, "consulbind_consul_entries").unwrap_or_default();
            let paths = metric(&metrics, "consulbind_consul_watches").unwrap_or_default();
            rows.push(format!(
                "| {count} | {prefixes} | {paths} | {entries} | {} | {} | +{} |",
                mib(anon + file),
                mib(anon),
                mib((anon + file).saturating_sub(idle_anon + idle_file))
            ));
        }
        println!(
            "\nresults: release build, {} cores; idle {} MiB resident ({} MiB anonymous); {:.2} MB of distinct keys \
             and values; memory read {} s after each step:",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            mib(idle_anon + idle_file),
            mib(idle_anon),
            distinct as f64 / 1e6,
            SETTLE.as_secs()
        );
        println!("| bindings | prefixes each | paths watched | distinct entries held | resident MiB | anonymous MiB | above idle |");
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        rows.iter().for_each(|r| println!("{r}"));
        println!("peak resident memory (VmHWM): {} MiB", mib(hwm_kib(pid)?));
        Ok(())
    }
    .await;

    controller.stop()?;
    let _ = namespaces.delete(&ns, &Default::default()).await;
    let _ = consul.delete(&format!("{ns}/"), true, None).await;
    result
}
