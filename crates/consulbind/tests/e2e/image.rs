//! The controller image that `cargo xtask image` writes (CONSULBIND_E2E_IMAGE): its root file
//! system unpacked and run with chroot, as the image's user and entrypoint, against the local
//! servers. A Consul write rolls a Deployment, and /metrics has every metric config/monitoring/ uses.
//! The image carries the licences of what it is built from.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::OnceLock,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use consulbind_api::conditions::{self, reason};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::support::{Scene, controller_kubeconfig, deploy, free_port, get, spec, wait};

const DEPLOY: &str = "Deployment";
const LABELS: [&str; 3] =
    ["org.opencontainers.image.source", "org.opencontainers.image.version", "org.opencontainers.image.licenses"];

#[tokio::test]
async fn controller_from_the_image_rolls_out_and_exports_every_monitored_metric() {
    let Some(s) = Scene::without_controller("image").await else {
        return;
    };
    let image = image();
    assert_eq!(image.user, "65532:65532", "the image must run as the non-root user");
    for label in LABELS {
        assert!(image.labels.get(label).and_then(Value::as_str).is_some_and(|v| !v.is_empty()), "no {label} label");
    }
    // The crates linked in, each with its licence, and jemalloc's own notice, which the
    // binary's allocator needs beside it.
    let notices = std::fs::read_to_string(image.rootfs.join("usr/share/doc/consulbind/THIRD-PARTY-NOTICES"))
        .expect("the crates' licences in the image");
    for line in ["\nkube 5.", "\ntikv-jemalloc-sys ", "Copyright (C) 2002-present Jason Evans"] {
        assert!(notices.contains(line), "{line:?} is not among the image's notices");
    }
    let controller = ImageController::start(image, &s.ns).await.unwrap();

    let key = s.key("config");
    s.put(&key, "v1").await;
    s.workload(DEPLOY, "web", json!({})).await;
    s.wait_revisions(DEPLOY, "web", 1).await;
    s.binding("cfg", spec(json!([{"key": key}]), deploy("web"), "0s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.ns);
    let generation = deployments.get("web").await.unwrap().metadata.generation;
    let before = s.template_annotations(DEPLOY, "web").await;

    s.put(&key, "v2").await;
    s.wait_revisions(DEPLOY, "web", 2).await;
    let binding = s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    let annotations = s.template_annotations(DEPLOY, "web").await;
    let stamped = annotations.get("checksum.consulbind.dev/cfg");
    assert!(stamped.is_some() && stamped != before.get("checksum.consulbind.dev/cfg"), "{annotations:?}");
    assert_eq!(stamped, binding.status.unwrap().applied_checksum.as_ref());
    assert!(deployments.get("web").await.unwrap().metadata.generation > generation, "the generation did not move");

    // Every family has samples by now: a reconcile, Consul reads and a rollout happened.
    let metrics = controller.get("/metrics").await;
    let (names, bounds) = monitored();
    assert!(names.len() >= 8, "found only {names:?} in config/monitoring/");
    let sampled = |name: &str| metrics.lines().any(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with([' ', '{'])));
    let missing: Vec<&String> = names.iter().filter(|n| !sampled(n)).collect();
    assert!(
        missing.is_empty(),
        "config/monitoring/ uses metrics the controller does not export: {missing:?}\n{metrics}"
    );
    let missing: Vec<&String> = bounds.iter().filter(|b| !metrics.contains(&format!("le=\"{b}\""))).collect();
    assert!(missing.is_empty(), "config/monitoring/ uses histogram buckets that do not exist: {missing:?}");

    controller.stop().await;
    s.finish().await;
}

/// Metric names (`consulbind_...`) and histogram bounds (`le="..."`) used in config/monitoring/.
fn monitored() -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/monitoring");
    let mut names = BTreeSet::new();
    let mut bounds = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let word = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
        for (i, _) in text.match_indices("consulbind_") {
            names.insert(word(&text[i..]));
        }
        for (i, m) in text.match_indices("le=\"") {
            bounds.insert(text[i + m.len()..].chars().take_while(|c| *c != '"').collect::<String>());
        }
    }
    (names, bounds)
}

/// The image's root file system and the parts of its configuration that say how to run it.
struct Image {
    rootfs: PathBuf,
    user: String,
    entrypoint: Vec<String>,
    labels: serde_json::Map<String, Value>,
}

/// Unpacked once per test run from the OCI archive.
fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let archive = std::env::var_os("CONSULBIND_E2E_IMAGE")
            .expect("CONSULBIND_E2E_IMAGE must name the image archive; run `cargo xtask image` or `cargo xtask e2e`");
        unpack(Path::new(&archive)).unwrap()
    })
}

fn unpack(archive: &Path) -> Result<Image> {
    ensure!(archive.is_file(), "no image archive at {}; run `cargo xtask image`", archive.display());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("image");
    let _ = std::fs::remove_dir_all(&dir);
    let (layout, rootfs) = (dir.join("oci"), dir.join("rootfs"));
    std::fs::create_dir_all(&layout)?;
    std::fs::create_dir_all(&rootfs)?;
    tar(archive, &layout)?;
    let blob = |descriptor: &Value| -> Result<PathBuf> {
        let digest = descriptor["digest"].as_str().context("a descriptor without digest")?;
        Ok(layout.join("blobs").join(digest.replacen(':', "/", 1)))
    };
    let json = |path: PathBuf| -> Result<Value> { Ok(serde_json::from_slice(&std::fs::read(path)?)?) };
    let index = json(layout.join("index.json"))?;
    let manifest = json(blob(&index["manifests"][0])?)?;
    // One layer from scratch, so there are no whiteouts to apply.
    for layer in manifest["layers"].as_array().context("a manifest without layers")? {
        tar(&blob(layer)?, &rootfs)?;
    }
    let config = json(blob(&manifest["config"])?)?;
    let config = &config["config"];
    let entrypoint: Vec<String> = serde_json::from_value(config["Entrypoint"].clone())?;
    ensure!(!entrypoint.is_empty(), "the image has no entrypoint");

    // The controller's kubeconfig, with its CA copied inside: chroot sees nothing else.
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(controller_kubeconfig())?)?;
    let cluster = &mut kubeconfig["clusters"][0]["cluster"];
    let ca = cluster["certificate-authority"].as_str().context("a kubeconfig without CA file")?.to_owned();
    std::fs::create_dir_all(rootfs.join("etc/consulbind"))?;
    std::fs::copy(ca, rootfs.join("etc/consulbind/ca.crt"))?;
    cluster["certificate-authority"] = "/etc/consulbind/ca.crt".into();
    std::fs::write(rootfs.join("etc/consulbind/kubeconfig"), serde_yaml::to_string(&kubeconfig)?)?;
    Ok(Image {
        rootfs,
        user: config["User"].as_str().unwrap_or_default().to_owned(),
        entrypoint,
        labels: config["Labels"].as_object().cloned().unwrap_or_default(),
    })
}

fn tar(archive: &Path, into: &Path) -> Result<()> {
    let status = std::process::Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(into).status()?;
    ensure!(status.success(), "tar -xf {} failed", archive.display());
    Ok(())
}

/// The image's entrypoint under chroot, as its user, with only the environment a pod would get.
struct ImageController {
    child: Child,
    admin: SocketAddr,
    log_path: PathBuf,
}

impl ImageController {
    async fn start(image: &Image, ns: &str) -> Result<Self> {
        let admin = free_port();
        let log_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-logs").join(format!("{ns}.log"));
        std::fs::create_dir_all(log_path.parent().unwrap())?;
        let log = std::fs::File::create(&log_path)?;
        // A full path: the cleared environment has no PATH to look it up in.
        let child = Command::new("/usr/sbin/chroot")
            .arg(format!("--userspec={}", image.user))
            .arg(&image.rootfs)
            .args(&image.entrypoint)
            .arg(format!("--namespaces={ns}"))
            .arg(format!("--admin-addr={admin}"))
            .env_clear()
            .env("KUBECONFIG", "/etc/consulbind/kubeconfig")
            .env("CONSUL_HTTP_ADDR", std::env::var("CONSUL_HTTP_ADDR")?)
            .env("RUST_LOG", "info,consulbind=debug")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .context("starting the image's controller with chroot")?;
        let controller = Self { child, admin, log_path };
        let url = format!("http://{admin}/readyz");
        if let Err(error) =
            wait("controller from the image to be ready", || async { Ok(get(&url).await.is_ok_and(|(c, _)| c == 200)) })
                .await
        {
            bail!("{error}\n{}", controller.log());
        }
        Ok(controller)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> String {
        get(&format!("http://{}{path}", self.admin)).await.unwrap().1
    }

    /// SIGTERM, and wait for a prompt exit: chroot executes the controller in its own process.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        }
        let exited = tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await;
        assert!(exited.is_ok_and(|s| s.is_ok()), "the controller did not exit within 15 s of SIGTERM\n{}", self.log());
    }
}
