//! Test support: the real API server and Consul from `cargo xtask env up`, the real controller
//! binary, and waits that fail with a useful message.

use std::{
    future::Future,
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::Stdio,
    sync::OnceLock,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use consul_kv::{Client as Consul, ClientConfig, Token};
use consulbind::{checksum, cluster::policy::PREFIXES_ANNOTATION};
use consulbind_api::{ConsulBinding, conditions};
use k8s_openapi::api::{
    apps::v1::{ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet},
    core::v1::{Namespace, Secret},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

pub const SETTLE: Duration = Duration::from_secs(4);
const TIMEOUT: Duration = Duration::from_secs(45);

/// The servers, or `None` to skip when they are not configured outside CI.
pub async fn servers() -> Option<(Client, Consul)> {
    if std::env::var_os("KUBECONFIG").is_none() || std::env::var_os("CONSUL_HTTP_ADDR").is_none() {
        assert!(
            !servers_required(),
            "KUBECONFIG and CONSUL_HTTP_ADDR must point at the test servers; run `cargo xtask test`"
        );
        eprintln!("skipped: no test servers (run `cargo xtask env up` and source its env file)");
        return None;
    }
    let client = Client::try_default().await.expect("Kubernetes client");
    let consul =
        Consul::new(ClientConfig { address: std::env::var("CONSUL_HTTP_ADDR").unwrap(), ..ClientConfig::default() })
            .await
            .expect("Consul client");
    Some((client, consul))
}

/// A namespace of its own, and a controller serving only it.
pub struct Scene {
    pub client: Client,
    pub consul: Consul,
    pub ns: String,
    pub controller: Option<Controller>,
}

impl Scene {
    pub async fn new(name: &str) -> Option<Self> {
        Self::with_args(name, &[]).await
    }

    /// `args` are extra controller flags.
    pub async fn with_args(name: &str, args: &[&str]) -> Option<Self> {
        let mut scene = Self::without_controller(name).await?;
        scene.start_controller(args).await;
        Some(scene)
    }

    /// A namespace with no controller yet.
    pub async fn without_controller(name: &str) -> Option<Self> {
        let (client, consul) = servers().await?;
        let ns = format!("{name}-{}", std::process::id() % 100_000);
        // Tests run at once: two with one name would delete each other's namespace.
        static TAKEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        {
            let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
            assert!(!taken.contains(&ns), "two tests use the scene name {name:?}; give each its own");
            taken.push(ns.clone());
        }
        let api: Api<Namespace> = Api::all(client.clone());
        let _ = api.delete(&ns, &DeleteParams::default()).await;
        wait("old namespace to go", || async { Ok(api.get_opt(&ns).await?.is_none()) }).await.unwrap();
        // A cluster admin's rule: bindings here may read any key with the default token.
        let namespace = json!({"metadata": {"name": ns, "annotations": {(PREFIXES_ANNOTATION): "*"}}});
        api.create(&PostParams::default(), &serde_json::from_value(namespace).unwrap()).await.unwrap();
        Some(Self { client, consul, ns, controller: None })
    }

    /// A Consul key unique to this scene.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}/{suffix}", self.ns)
    }

    pub async fn put(&self, key: &str, value: &str) {
        self.consul.put(key, value.as_bytes(), None).await.unwrap();
    }

    /// [`Scene::put`] of owned strings, for many writes at once.
    pub async fn put_owned(&self, key: String, value: String) {
        self.put(&key, &value).await
    }

    pub async fn delete_key(&self, key: &str) {
        self.consul.delete(key, false, None).await.unwrap();
    }

    /// Asserts that the API server refuses a binding of `spec`, naming `field`.
    pub async fn assert_refused(&self, spec: Value, field: &str) {
        let refused = self
            .apply(json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding",
                "metadata": {"name": "refused"}, "spec": spec}))
            .await;
        assert!(refused.as_ref().is_err_and(|e| e.to_string().contains(field)), "{field}: {refused:?}");
    }

    pub async fn apply(&self, manifest: Value) -> Result<()> {
        let kind = manifest["kind"].as_str().unwrap().to_owned();
        let name = manifest["metadata"]["name"].as_str().unwrap().to_owned();
        let pp = PatchParams::apply("e2e-test").force();
        let patch = Patch::Apply(&manifest);
        match kind.as_str() {
            "Deployment" => {
                drop(Api::<Deployment>::namespaced(self.client.clone(), &self.ns).patch(&name, &pp, &patch).await?)
            }
            "StatefulSet" => {
                drop(Api::<StatefulSet>::namespaced(self.client.clone(), &self.ns).patch(&name, &pp, &patch).await?)
            }
            "DaemonSet" => {
                drop(Api::<DaemonSet>::namespaced(self.client.clone(), &self.ns).patch(&name, &pp, &patch).await?)
            }
            "ConsulBinding" => drop(self.bindings().patch(&name, &pp, &patch).await?),
            "Secret" => drop(
                Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.client.clone(), &self.ns)
                    .patch(&name, &pp, &patch)
                    .await?,
            ),
            "ConfigMap" => drop(
                Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(self.client.clone(), &self.ns)
                    .patch(&name, &pp, &patch)
                    .await?,
            ),
            "Rollout" => drop(self.rollouts().patch(&name, &pp, &patch).await?),
            other => {
                let api_version = manifest["apiVersion"].as_str().unwrap_or_default();
                let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
                let gvk = GroupVersionKind::gvk(group, version, other);
                let (resource, _) = kube::discovery::pinned_kind(&self.client, &gvk).await?;
                let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &resource);
                drop(api.patch(&name, &pp, &patch).await?)
            }
        }
        Ok(())
    }

    /// Applies a workload, and waits until kube-controller-manager has made its first revision:
    /// had it not seen this template before a stamp, the stamped one would be the first, and a
    /// rollout would count as none.
    pub async fn workload(&self, kind: &str, name: &str, labels: Value) {
        self.apply(workload(kind, name, labels)).await.unwrap();
        let seen = || async { Ok(self.revisions(kind, name).await >= 1) };
        wait(&format!("a first revision of {kind} {name}"), seen).await.unwrap();
    }

    pub async fn binding(&self, name: &str, spec: Value) {
        self.apply(json!({
            "apiVersion": "consulbind.dev/v1alpha1",
            "kind": "ConsulBinding",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .await
        .unwrap();
    }

    pub fn bindings(&self) -> Api<ConsulBinding> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn get_binding(&self, name: &str) -> ConsulBinding {
        self.bindings().get(name).await.unwrap()
    }

    /// Waits until the binding's condition `type_` has `status` and `reason`.
    pub async fn wait_condition(&self, name: &str, type_: &str, status: &str, reason: &str) -> ConsulBinding {
        let what = format!("{}/{name} {type_}={status} {reason}", self.ns);
        let result = wait(&what, || async {
            let binding = self.bindings().get(name).await?;
            let found = binding.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
            Ok(found.is_some_and(|c| c.status == status && c.reason == reason))
        })
        .await;
        if let Err(error) = result {
            let binding = self.bindings().get(name).await.ok();
            panic!("{error}\nstatus: {:#?}\ncontroller log:\n{}", binding.and_then(|b| b.status), self.log());
        }
        self.get_binding(name).await
    }

    /// Waits until the controller has acted on the binding's latest spec, so that what the test
    /// does next cannot race it.
    pub async fn wait_observed(&self, name: &str) {
        wait(&format!("the controller to see {}/{name}'s latest spec", self.ns), || async {
            let binding = self.bindings().get(name).await?;
            Ok(binding.status.and_then(|st| st.observed_generation) == binding.metadata.generation)
        })
        .await
        .unwrap();
    }

    /// Waits like [`Scene::wait_condition`], and returns the condition's message.
    pub async fn wait_message(&self, name: &str, type_: &str, status: &str, reason: &str) -> String {
        let binding = self.wait_condition(name, type_, status, reason).await;
        let conditions = binding.status.expect("a status with the condition").conditions;
        conditions.into_iter().find(|c| c.type_ == type_).expect("the condition waited for").message
    }

    /// Waits until the binding's condition `type_` has `status` and `reason` and a message that
    /// contains `part`: a reason can pass through another message first (a Secret not yet seen).
    pub async fn wait_message_containing(&self, name: &str, type_: &str, reason: &str, part: &str) -> String {
        let what = format!("{}/{name} {type_} {reason} with a message containing {part:?}", self.ns);
        let message = || async {
            let binding = self.bindings().get(name).await.ok()?;
            let found = binding.status?.conditions.into_iter().find(|c| c.type_ == type_)?;
            (found.reason == reason).then_some(found.message)
        };
        let result = wait(&what, || async { Ok(message().await.is_some_and(|m| m.contains(part))) }).await;
        if let Err(error) = result {
            panic!("{error}\nlast message: {:?}\ncontroller log:\n{}", message().await, self.log());
        }
        message().await.unwrap_or_default()
    }

    /// Number of rollouts a workload has had: ReplicaSets of a Deployment, ControllerRevisions
    /// of a StatefulSet or DaemonSet. The first template counts as one.
    pub async fn revisions(&self, kind: &str, name: &str) -> usize {
        let revision = match kind {
            "Deployment" => ApiResource::erase::<ReplicaSet>(&()),
            _ => ApiResource::erase::<ControllerRevision>(&()),
        };
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &revision);
        let revisions = api.list(&ListParams::default()).await.unwrap().items;
        revisions.iter().filter(|r| r.owner_references().iter().any(|o| o.kind == kind && o.name == name)).count()
    }

    /// A Deployment's `metadata.generation`: one more for every change of its spec, a rollout
    /// among them, whether or not it makes a new ReplicaSet.
    pub async fn generation(&self, name: &str) -> i64 {
        let api = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(self.client.clone(), &self.ns);
        api.get(name).await.unwrap().metadata.generation.unwrap_or_default()
    }

    pub async fn wait_revisions(&self, kind: &str, name: &str, want: usize) {
        let what = format!("{kind} {name} to have {want} {}", if want == 1 { "revision" } else { "revisions" });
        if let Err(error) = wait(&what, || async { Ok(self.revisions(kind, name).await >= want) }).await {
            panic!("{error} (has {})\ncontroller log:\n{}", self.revisions(kind, name).await, self.log());
        }
        // Exactly: give a duplicate rollout time to show up.
        tokio::time::sleep(SETTLE).await;
        assert_eq!(self.revisions(kind, name).await, want, "{kind} {name} rolled more than once\n{}", self.log());
    }

    /// Argo Rollouts' Rollouts in this namespace, as dynamic objects.
    pub fn rollouts(&self) -> Api<DynamicObject> {
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Rollout"), "rollouts");
        Api::namespaced_with(self.client.clone(), &self.ns, &resource)
    }

    /// `metadata.generation` of a Rollout: its spec changed that many times.
    pub async fn rollout_generation(&self, name: &str) -> i64 {
        self.rollouts().get(name).await.unwrap().metadata.generation.unwrap_or_default()
    }

    /// The checksum the controller stamps for `value` under one exact `key`, for a binding of
    /// this namespace that names no Consul datacenter, namespace or partition.
    pub async fn checksum_of(&self, key: &str, value: &[u8]) -> String {
        checksum::checksum(&self.checksum_key().await, &[checksum::Source::Key { key, value: Some(value) }])
    }

    /// The key of the checksums of bindings of this namespace that name no Consul datacenter,
    /// namespace or partition.
    pub async fn checksum_key(&self) -> checksum::Key {
        self.cluster_checksum_key().await.scoped(&self.ns, ["", "", ""])
    }

    /// The cluster's checksum key, which the first controller made.
    pub async fn cluster_checksum_key(&self) -> checksum::Key {
        let secrets = Api::<Secret>::namespaced(self.client.clone(), SYSTEM_NS);
        let secret = secrets.get(CHECKSUM_KEY_SECRET).await.expect("the checksum key Secret");
        let bytes = secret.data.unwrap()[checksum::key::DATA_KEY].0.clone();
        checksum::Key::new(bytes.try_into().expect("a 32-byte key"))
    }

    /// The pod-template annotations of a workload.
    pub async fn template_annotations(&self, kind: &str, name: &str) -> std::collections::BTreeMap<String, String> {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", kind));
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &resource);
        let workload = api.get(name).await.unwrap();
        serde_json::from_value(workload.data["spec"]["template"]["metadata"]["annotations"].clone()).unwrap_or_default()
    }

    /// Reasons and notes of the events in this namespace about `name`.
    pub async fn events_for(&self, name: &str) -> Vec<(String, String)> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.client.clone(), &self.ns);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Waits for an event about `name` with `reason`, and returns its note. Events are raised
    /// beside the status write that shows their news, not before it: one may land a moment
    /// after the condition it tells of.
    pub async fn wait_event(&self, name: &str, reason: &str) -> String {
        self.wait_event_containing(name, reason, "").await
    }

    /// [`Scene::wait_event`] for an event whose note contains `part`.
    pub async fn wait_event_containing(&self, name: &str, reason: &str, part: &str) -> String {
        let note = || async {
            let events = self.events_for(name).await.into_iter();
            events.filter(|(r, n)| r == reason && n.contains(part)).map(|(_, n)| n).next()
        };
        let what = format!("a {reason} event about {name} containing {part:?}");
        if let Err(e) = wait(&what, || async { Ok(note().await.is_some()) }).await {
            panic!("{e}: {:?}\n{}", self.events_for(name).await, self.log());
        }
        note().await.unwrap_or_default()
    }

    pub fn log(&self) -> String {
        self.controller.as_ref().map(|c| c.log()).unwrap_or_default()
    }

    pub fn controller(&self) -> &Controller {
        self.controller.as_ref().expect("controller running")
    }

    pub async fn stop_controller(&mut self) {
        if let Some(controller) = self.controller.take() {
            controller.stop().await;
        }
    }

    pub async fn start_controller(&mut self, args: &[&str]) {
        self.start_controller_with_env(args, &[]).await;
    }

    pub async fn start_controller_with_env(&mut self, args: &[&str], envs: &[(&str, &str)]) {
        assert!(self.controller.is_none());
        self.controller = Some(Controller::start_with_env(&self.ns, args, envs).await.unwrap());
    }

    /// `kubectl get` output for the bindings, as a user would see it.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("kubectl").arg("-n").arg(&self.ns).args(args).output().expect("kubectl");
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    pub async fn finish(mut self) {
        self.stop_controller().await;
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.ns, &DeleteParams::default()).await;
    }
}

/// A binding spec with a quiet period.
pub fn spec(keys: Value, targets: Value, quiet: &str) -> Value {
    json!({"keys": keys, "targets": targets, "rollout": {"quietPeriod": quiet}})
}

/// Targets naming one Deployment.
/// A token Secret named `token`, labelled for the controller, holding `value`. On the bed's
/// Consul without ACLs any well-formed token reads.
pub fn token_secret(value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "stringData": {"token": value},
           "metadata": {"name": "token", "labels": {"consulbind.dev/token": "true"}}})
}

/// A well-formed token, for the bed's Consul without ACLs.
pub const ANY_TOKEN: &str = "00000000-1111-2222-3333-444444444444";

pub fn deploy(name: &str) -> Value {
    json!([{"kind": "Deployment", "name": name}])
}

pub fn workload(kind: &str, name: &str, labels: Value) -> Value {
    let mut selector_labels = json!({"app": name});
    let mut all_labels = selector_labels.clone();
    if let Value::Object(extra) = labels {
        all_labels.as_object_mut().unwrap().extend(extra);
    }
    let template = json!({
        "metadata": {"labels": all_labels.clone()},
        "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]},
    });
    let mut spec = json!({"selector": {"matchLabels": selector_labels.take()}, "template": template});
    if kind != "DaemonSet" {
        spec["replicas"] = json!(1);
    }
    if kind == "StatefulSet" {
        spec["serviceName"] = json!(name);
    }
    json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "labels": all_labels}, "spec": spec})
}

/// A running controller process, serving one namespace.
pub struct Controller {
    child: Child,
    pub admin: SocketAddr,
    /// The debug listener, on loopback.
    pub debug: SocketAddr,
    log_path: PathBuf,
}

impl Controller {
    pub async fn start(ns: &str, args: &[&str]) -> Result<Self> {
        Self::start_with_env(ns, args, &[]).await
    }

    /// Starts the controller as its own ServiceAccount, unless `envs` names another KUBECONFIG.
    pub async fn start_with_env(ns: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<Self> {
        let own = controller_kubeconfig().display().to_string();
        let identity = [("KUBECONFIG", own.as_str())];
        let identity = if envs.iter().any(|(k, _)| *k == "KUBECONFIG") { &[][..] } else { &identity[..] };
        // A test may put the admin listener elsewhere, with its own --admin-addr.
        let given = args.iter().find_map(|a| a.strip_prefix("--admin-addr="));
        let [own_admin, debug] = free_ports();
        let admin = given.map_or(own_admin, |a| a.parse().expect("--admin-addr"));
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-logs");
        std::fs::create_dir_all(&dir)?;
        let log_path = dir.join(format!("{ns}.log"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let child = Command::new(env!("CARGO_BIN_EXE_consulbind"))
            .arg(format!("--namespaces={ns}"))
            .args(given.is_none().then(|| format!("--admin-addr={admin}")))
            .arg(format!("--debug-addr={debug}"))
            .args(args)
            .env("RUST_LOG", "info,consulbind=debug")
            .env("NO_COLOR", "1")
            .envs(identity.iter().copied())
            .envs(envs.iter().copied())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .context("starting consulbind")?;
        let controller = Self { child, admin, debug, log_path };
        let url = format!("http://{admin}/readyz");
        if let Err(error) =
            wait("controller to be ready", || async { Ok(get(&url).await.is_ok_and(|(code, _)| code == 200)) }).await
        {
            bail!("{error}\n{}", controller.log());
        }
        Ok(controller)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// A GET of `path` from the admin listener, or the debug listener for `/debug/` paths.
    pub async fn get(&self, path: &str) -> String {
        let addr = if path.starts_with("/debug/") { self.debug } else { self.admin };
        get(&format!("http://{addr}{path}")).await.unwrap().1
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("controller running")
    }

    /// SIGKILL, as a crash.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// The value of an unlabelled metric.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let body = self.get("/metrics").await;
        body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Waits for the process to exit by itself.
    pub async fn wait_exit(mut self, within: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(within, self.child.wait()).await.ok()?.ok()
    }

    /// SIGTERM, and wait for a prompt exit.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        }
        let exited = tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await;
        assert!(exited.is_ok(), "controller did not exit within 15 s of SIGTERM\n{}", self.log());
    }
}

/// A failing test shows its controller's log, which CI keeps nowhere else.
impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(300).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "---- controller log ({}), last {} lines ----\n{}",
                self.log_path.display(),
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

/// Held by tests that need Argo Rollouts' CRD present or absent: there is one per cluster.
pub static ROLLOUT_CRD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const ROLLOUT_CRD_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/fixtures/argo-rollouts-crd.yaml");

/// Installs the stand-in for Argo Rollouts' CRD, and waits until it is served.
pub fn install_rollout_crd() {
    kubectl(&["apply", "--server-side", "-f", ROLLOUT_CRD_FILE]).unwrap();
    kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd/rollouts.argoproj.io"]).unwrap();
}

/// Removes it, with every Rollout, and waits until it is gone.
pub fn remove_rollout_crd() {
    kubectl(&["delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", ROLLOUT_CRD_FILE]).unwrap();
}

/// The checksum key Secret every test's controller shares, in [`SYSTEM_NS`].
pub const CHECKSUM_KEY_SECRET: &str = "consulbind-checksum-key";

/// The namespace `kubectl apply -k config/` installs the controller into.
pub const SYSTEM_NS: &str = "consulbind-system";

pub fn kubectl(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("kubectl").args(args).output()?;
    if !out.status.success() {
        bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Installs config/ (ServiceAccount, RBAC, Deployment...) once per test run, server-side.
pub fn install_config() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        // The bed is Kubernetes 1.20, which refuses the CRD's validation rules.
        let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/before-1.25");
        kubectl(&["apply", "--server-side", "--force-conflicts", "-k", config.to_str().unwrap()]).unwrap();
    });
}

/// A client that reads its server and credentials from the kubeconfig at `path`.
pub async fn client_from(path: &std::path::Path) -> kube::Client {
    let config = kube::config::Kubeconfig::read_from(path).unwrap();
    let options = kube::config::KubeConfigOptions::default();
    kube::Client::try_from(kube::Config::from_custom_kubeconfig(config, &options).await.unwrap()).unwrap()
}

/// A kubeconfig that authenticates as ServiceAccount `account` of consulbind-system, with a
/// token from the TokenRequest API.
pub fn kubeconfig_for(account: &str) -> PathBuf {
    install_config();
    kubeconfig_in(SYSTEM_NS, account)
}

/// A kubeconfig that authenticates as ServiceAccount `account` of namespace `ns`.
pub fn kubeconfig_in(ns: &str, account: &str) -> PathBuf {
    let token = kubectl(&["-n", ns, "create", "token", account, "--duration=2h"]).unwrap();
    let admin = std::fs::read_to_string(std::env::var("KUBECONFIG").unwrap()).unwrap();
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).unwrap();
    config["users"][0]["user"] = serde_yaml::to_value(json!({ "token": token.trim() })).unwrap();
    // As in a pod: the account's own namespace is the default one.
    config["contexts"][0]["context"]["namespace"] = serde_yaml::Value::from(ns);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{ns}-{account}.kubeconfig"));
    // Renamed into place: a controller of another test process may be reading it.
    let written = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&written, serde_yaml::to_string(&config).unwrap()).unwrap();
    std::fs::rename(&written, &path).unwrap();
    path
}

/// Runs `cargo xtask env <args>`, and fails the test with its output when it fails.
pub fn xtask_env(args: &[&str]) {
    let xtask =
        std::env::var("CONSULBIND_XTASK").expect("CONSULBIND_XTASK names the xtask binary; run `cargo xtask e2e`");
    let out = std::process::Command::new(xtask).arg("env").args(args).output().expect("running xtask");
    assert!(
        out.status.success(),
        "xtask env {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every test's controller runs as the ServiceAccount and RBAC that config/ installs.
pub fn controller_kubeconfig() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| kubeconfig_for("consulbind"))
}

pub fn free_port() -> SocketAddr {
    let [port] = free_ports();
    port
}

/// Distinct free ports, none handed out twice in this process.
pub fn free_ports<const N: usize>() -> [SocketAddr; N] {
    // Below the kernel's ephemeral range (32768 and up), which the port 0 of a bind draws from:
    // there an outgoing connection could take a port while a killed controller's restart waits
    // to listen on it again. A counter keeps the tests of this process apart.
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    const FIRST: u16 = 24_000;
    const COUNT: u16 = 8_000;
    let start = (std::process::id() % u32::from(COUNT)) as u16;
    std::array::from_fn(|_| {
        loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let port = FIRST + (start.wrapping_add(n)) % COUNT;
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                break listener.local_addr().unwrap();
            }
        }
    })
}

/// A plain HTTP GET, returning status and body.
pub async fn get(url: &str) -> Result<(u16, String)> {
    let response = reqwest::get(url).await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// Polls `check` until it returns true, or fails after a timeout.
pub async fn wait<F, Fut>(what: &str, check: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    wait_for(what, TIMEOUT, check).await
}

pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, check: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(error) if tokio::time::Instant::now() >= deadline => {
                bail!("timed out waiting for {what}: {error}")
            }
            Err(_) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether the test servers must be there: in CI and under `cargo xtask`, a missing one fails
/// the test instead of skipping it.
pub fn servers_required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true") || std::env::var_os("CONSULBIND_E2E").is_some()
}

/// The Consul agent's HTTPS address and the CA that signed its certificate.
pub fn tls_consul() -> Option<(String, String)> {
    let found = std::env::var("CONSULBIND_E2E_TLS_ADDR").ok().zip(std::env::var("CONSULBIND_E2E_CONSUL_CA").ok());
    assert!(
        found.is_some() || !servers_required(),
        "CONSULBIND_E2E_TLS_ADDR and CONSULBIND_E2E_CONSUL_CA must be set; run `cargo xtask e2e`"
    );
    found
}

/// The ACL-enabled Consul, and its management token.
pub fn acl_consul() -> Option<(String, Token)> {
    let addr = std::env::var("CONSULBIND_E2E_ACL_ADDR").ok()?;
    let token = std::env::var("CONSULBIND_E2E_ACL_TOKEN").ok()?;
    Some((addr, Token::new(token)))
}

/// The names of every object of `kind` the binding's status lists as targets.
/// The binding's Ready condition, once its status has one.
pub fn ready(binding: &ConsulBinding) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    binding.status.as_ref()?.conditions.iter().find(|c| c.type_ == conditions::READY).cloned()
}

pub fn status_targets(binding: &ConsulBinding) -> Vec<String> {
    binding.status.iter().flat_map(|s| &s.targets).map(|t| format!("{}/{}", t.kind, t.name)).collect()
}

/// The TCP connections process `pid` holds established or opening to `port` on any address,
/// from its file descriptors and the kernel's socket tables. One that either end has begun to
/// close carries no request, so it does not count against the budget.
pub fn connections_to(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.to_string_lossy().into_owned();
                    Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    // The kernel lists a table a page at a time, so a socket opened or closed between two reads
    // can shift a line into the next page: count each socket once.
    let mut open = std::collections::HashSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port =
                fields.get(2).and_then(|r| r.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            // 01 is ESTABLISHED, 02 SYN_SENT.
            let established = matches!(fields.get(3), Some(&"01" | &"02"));
            if remote_port == Some(port) && established && inodes.contains(fields[9]) {
                open.insert(fields[9].to_owned());
            }
        }
    }
    open.len()
}
