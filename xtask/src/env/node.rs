//! The bed's one node: containerd, the kubelet and kube-scheduler, so that pods really run.
//!
//! Everything stays on this machine and on loopback:
//! - pods use `hostNetwork: true`; the CNI configuration is there only so that containerd
//!   reports its network ready;
//! - images are built here ([`PAUSE_IMAGE`], [`DEMO_IMAGE`]) and imported, and every registry is
//!   reached through a proxy on a loopback port where nothing listens, so a pull fails at once;
//! - the node is tainted ([`TAINT`]): only the pods meant to run tolerate it, and every other
//!   workload of the tests stays Pending as before;
//! - containerd's config, root, state and socket, the kubelet's root and the pods' cgroups are
//!   the environment's own, and `down` removes every container, shim, mount and cgroup.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::image::Buildah;
use super::provision::{self, Tools};
use super::{Env, apt, port};
use crate::common::{cargo, remove_all, repo_root};
use crate::process::{capture, http_get, run, succeeds, with_input};

const KUBELET_PORT: u16 = 16460;
const KUBELET_HEALTHZ_PORT: u16 = 16461;
const SCHEDULER_PORT: u16 = 16462;
/// The node's name and its `Hostname` address, which the API server dials to reach the kubelet
/// (`kubectl logs`, `exec`): a name that resolves to loopback, since the kubelet refuses a
/// loopback `--node-ip`.
pub const NODE: &str = "localhost";
/// Only pods that tolerate it run, so no test's `busybox` or `example.invalid/app` is pulled.
pub const TAINT: &str = "consulbind.dev/local-images";
pub const PAUSE_IMAGE: &str = "consulbind.local/pause:3.4";
/// `examples/demo-app`, built static.
pub const DEMO_IMAGE: &str = "consulbind.local/demo-app:dev";
/// Where registries are reached: a loopback port where nothing listens.
const NO_REGISTRY: &str = "http://127.0.0.1:1";

/// The node's processes, in start order.
pub(super) const DAEMONS: [&str; 3] = ["containerd", "kube-scheduler", "kubelet"];

impl Env {
    fn node_path(&self, name: &str) -> PathBuf {
        self.path("node").join(name)
    }

    pub(super) fn containerd_socket(&self) -> PathBuf {
        self.node_path("containerd.sock")
    }

    /// The pods' cgroup parent, one per environment so two side by side keep apart.
    fn cgroup_root(&self) -> String {
        format!("consulbind-{}", port(0))
    }

    fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg(format!("--address={}", self.containerd_socket().display())).arg("--namespace=k8s.io");
        cmd
    }

    /// containerd, the images, kube-scheduler and the kubelet, until the node is Ready.
    pub(super) fn start_node(&self, tools: &Tools) -> Result<()> {
        apt::ensure_packages(&["containerd", "runc", "containernetworking-plugins", "gcc", "libc6-dev"], false)?;
        let containerd = self.daemon("containerd");
        if containerd.pid().is_none() {
            // What a run that crashed or was killed left behind.
            self.remove_node_leftovers()?;
        }
        fs::create_dir_all(self.node_path("cni"))?;
        fs::write(
            self.node_path("cni/10-loopback.conflist"),
            r#"{"cniVersion": "0.4.0", "name": "consulbind", "plugins": [{"type": "loopback"}]}"#,
        )?;
        fs::write(self.node_path("containerd.toml"), self.containerd_config())?;
        containerd.ensure_started(
            Command::new("containerd")
                .arg(format!("--config={}", self.node_path("containerd.toml").display()))
                .env("HTTP_PROXY", NO_REGISTRY)
                .env("HTTPS_PROXY", NO_REGISTRY)
                .env("NO_PROXY", ""),
        )?;
        containerd.wait_ready("serving", Duration::from_secs(60), || self.containerd_serving())?;
        self.import_images()?;

        let scheduler = self.daemon("kube-scheduler");
        scheduler.ensure_started(Command::new(&tools.kube_scheduler).args([
            format!("--kubeconfig={}", self.kubeconfig().display()),
            "--leader-elect=false".to_owned(),
            "--address=127.0.0.1".to_owned(),
            format!("--port={}", port(SCHEDULER_PORT)),
            "--secure-port=0".to_owned(),
        ]))?;
        scheduler.wait_ready("healthy", Duration::from_secs(60), || self.scheduler_healthy())?;

        self.make_cgroup_root()?;
        fs::write(self.node_path("kubelet.yaml"), self.kubelet_config())?;
        let kubelet = self.daemon("kubelet");
        kubelet.ensure_started(
            Command::new(&tools.kubelet)
                .args([
                    format!("--config={}", self.node_path("kubelet.yaml").display()),
                    format!("--kubeconfig={}", self.kubeconfig().display()),
                    format!("--root-dir={}", self.node_path("kubelet").display()),
                    "--container-runtime=remote".to_owned(),
                    format!("--container-runtime-endpoint=unix://{}", self.containerd_socket().display()),
                    format!("--pod-infra-container-image={PAUSE_IMAGE}"),
                    format!("--hostname-override={NODE}"),
                    format!("--register-with-taints={TAINT}=only:NoSchedule"),
                ])
                // Its in-tree cloud providers would ask the link-local metadata services for credentials.
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("HTTP_PROXY", NO_REGISTRY)
                .env("HTTPS_PROXY", NO_REGISTRY)
                .env("NO_PROXY", "127.0.0.1,localhost"),
        )?;
        kubelet.wait_ready("a Ready node", Duration::from_secs(120), || self.node_ready(&tools.kubectl))
    }

    /// Ready, and rid of the `not-ready` taint the node-lifecycle controller lifts.
    fn node_ready(&self, kubectl: &Path) -> bool {
        let jsonpath = r#"jsonpath={.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}"#;
        capture(self.kubectl(kubectl).args(["get", "node", NODE, "-o", jsonpath]))
            .is_ok_and(|out| out.starts_with("True") && !out.contains("node.kubernetes.io/not-ready"))
    }

    fn containerd_config(&self) -> String {
        let dir = |name: &str| self.node_path(name).display().to_string();
        format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Without it runc fails with "can't get final child's PID from pipe": a sandbox here may not
  # lower its oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
            root = dir("containerd/root"),
            state = dir("containerd/state"),
            socket = self.containerd_socket().display(),
            opt = dir("containerd/opt"),
            cni = dir("cni"),
        )
    }

    fn kubelet_config(&self) -> String {
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
# Only the API server reaches it, on loopback.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
failSwapOn: false
# The images are built here and cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
",
            port = port(KUBELET_PORT),
            healthz = port(KUBELET_HEALTHZ_PORT),
            cgroup = self.cgroup_root(),
        )
    }

    /// The pause image from the Kubernetes source, and the demo app: built here, imported into
    /// containerd. An image whose binary has not changed since its import is left as it is.
    fn import_images(&self) -> Result<()> {
        let dir = repo_root().join("target/consulbind-node-images");
        fs::create_dir_all(&dir)?;
        let pause = dir.join("pause");
        if !pause.is_file() {
            let source = dir.join("pause.c");
            fs::write(&source, provision::kubernetes_source("build/pause/linux/pause.c")?)?;
            run(Command::new("gcc")
                .args(["-Os", "-Wall", "-Werror", "-static", "-DVERSION=v3.4-consulbind", "-o"])
                .arg(&pause)
                .arg(&source))?;
        }
        let demo = demo_app()?;
        for (name, binary) in [(PAUSE_IMAGE, pause), (DEMO_IMAGE, demo)] {
            let digest = capture(Command::new("sha256sum").arg(&binary))?;
            let stamp = dir.join(format!("{}.imported", name.replace(['/', ':'], "_")));
            let listed = capture(self.ctr().args(["images", "ls", "--quiet", &format!("name=={name}")]))?;
            if listed.trim() == name && fs::read_to_string(&stamp).ok().as_deref() == Some(&digest) {
                continue;
            }
            let archive = dir.join(format!("{}.tar", name.replace(['/', ':'], "_")));
            local_image(&dir, name, &binary, &archive)?;
            run(self.ctr().args(["images", "import"]).arg(&archive))?;
            fs::write(&stamp, &digest)?;
        }
        Ok(())
    }

    /// The pods' cgroup parent in every hierarchy: the kubelet refuses a `cgroupRoot` that is
    /// missing. A new cpuset takes its parent's CPUs and memory nodes, or no task could join it.
    fn make_cgroup_root(&self) -> Result<()> {
        for hierarchy in cgroup_hierarchies()? {
            let dir = hierarchy.join(self.cgroup_root());
            fs::create_dir_all(&dir)?;
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(parent) = fs::read_to_string(hierarchy.join(file))
                    && fs::read_to_string(dir.join(file)).is_ok_and(|own| own.trim().is_empty())
                {
                    fs::write(dir.join(file), parent.trim())?;
                }
            }
        }
        Ok(())
    }

    /// Before containerd stops: every pod's processes killed, and its tasks and containers
    /// deleted, so that no shim lingers and the next start begins with no pod.
    pub(super) fn remove_pods(&self) -> Result<()> {
        if self.daemon("containerd").pid().is_none() {
            return Ok(());
        }
        self.kill_pod_processes()?;
        for id in capture(self.ctr().args(["tasks", "ls", "--quiet"]))?.lines() {
            let _ = capture(self.ctr().args(["tasks", "delete", "--force", id]));
        }
        for id in capture(self.ctr().args(["containers", "ls", "--quiet"]))?.lines() {
            let _ = capture(self.ctr().args(["containers", "delete", id]));
        }
        Ok(())
    }

    /// Once containerd is down, or after a crash: processes still in the pods' cgroups, shims of
    /// this containerd, mounts under the environment's directory and the cgroups themselves.
    pub(super) fn remove_node_leftovers(&self) -> Result<()> {
        self.kill_pod_processes()?;
        for pid in self.shims()? {
            // SAFETY: kill(2) has no memory effects.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for point in self.mounts()? {
            run(Command::new("umount").args(["--lazy", &point]))?;
        }
        for hierarchy in cgroup_hierarchies()? {
            remove_cgroup(&hierarchy.join(self.cgroup_root()))?;
        }
        // Checked, not assumed: whatever is left would outlive the environment.
        std::thread::sleep(Duration::from_millis(200));
        let shims = self.shims()?;
        ensure!(shims.is_empty(), "the shims {shims:?} of the node's containerd survived SIGKILL");
        let mounts = self.mounts()?;
        ensure!(mounts.is_empty(), "the pods' mounts {mounts:?} are still there");
        let cgroups: Vec<PathBuf> =
            cgroup_hierarchies()?.iter().map(|h| h.join(self.cgroup_root())).filter(|c| c.exists()).collect();
        ensure!(cgroups.is_empty(), "the pods' cgroups {cgroups:?} are still there");
        Ok(())
    }

    /// The live shims of this environment's containerd.
    fn shims(&self) -> Result<Vec<i32>> {
        let socket = self.containerd_socket().display().to_string();
        let mut found = Vec::new();
        for entry in fs::read_dir("/proc")?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
            let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                && args.contains(&socket.as_bytes())
            {
                found.push(pid);
            }
        }
        Ok(found)
    }

    /// Mount points under the node's directory, a mount inside another before it.
    fn mounts(&self) -> Result<Vec<String>> {
        let dir = self.path("node").display().to_string();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
        let mut mounts: Vec<String> = mountinfo
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| point.starts_with(&dir))
            .map(str::to_owned)
            .collect();
        mounts.sort_by_key(|point| std::cmp::Reverse(point.len()));
        mounts.dedup();
        Ok(mounts)
    }

    /// SIGKILL to every process in the pods' cgroups, until none is left.
    fn kill_pod_processes(&self) -> Result<()> {
        let roots: Vec<PathBuf> = cgroup_hierarchies()?.iter().map(|h| h.join(self.cgroup_root())).collect();
        for _ in 0..50 {
            let mut procs = Vec::new();
            for root in &roots {
                collect_procs(root, &mut procs);
            }
            procs.sort_unstable();
            procs.dedup();
            if procs.is_empty() {
                return Ok(());
            }
            for pid in procs {
                // SAFETY: kill(2) has no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("processes in the cgroups {} survived SIGKILL", self.cgroup_root())
    }

    /// A pod runs; containerd and the kubelet die as in a crash, leaving the pod's processes
    /// and shims behind; `up` removes those and the pod runs again in new ones.
    pub fn check_node_crash(&self) -> Result<()> {
        let tools = provision::tools()?;
        let kubectl = |args: &[&str]| {
            let mut cmd = self.kubectl(&tools.kubectl);
            cmd.args(["--namespace=default"]).args(args);
            cmd
        };
        let pod = format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "node-crash"}}, "spec": {{
                "hostNetwork": true, "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                "tolerations": [{{"key": "{TAINT}", "operator": "Exists"}}],
                "containers": [{{"name": "app", "image": "{DEMO_IMAGE}", "imagePullPolicy": "Never",
                    "readinessProbe": {{"exec": {{"command": ["/demo-app", "ready"]}}, "periodSeconds": 1}}}}]}}}}"#
        );
        let _ = capture(&mut kubectl(&["delete", "pod", "node-crash", "--wait=true", "--ignore-not-found"]));
        let mut create = kubectl(&["create", "-f", "-"]);
        with_input(&mut create, &pod)?;
        // The container's id, once it is ready.
        let running = || {
            let jsonpath = "jsonpath={.status.containerStatuses[0].ready} {.status.containerStatuses[0].containerID}";
            let out = capture(&mut kubectl(&["get", "pod", "node-crash", "-o", jsonpath])).unwrap_or_default();
            out.strip_prefix("true ").map(|id| id.trim().to_owned())
        };
        let kubelet = self.daemon("kubelet");
        kubelet.wait_ready("running the pod node-crash", Duration::from_secs(120), || running().is_some())?;
        let before = running().context("the pod node-crash stopped running")?;
        let shims = self.shims()?;
        ensure!(!shims.is_empty(), "the pod node-crash runs in no shim of the node's containerd");
        for daemon in [self.daemon("kubelet"), self.daemon("containerd")] {
            let pid = daemon.pid().with_context(|| format!("{} is not running", daemon.name))?;
            // SAFETY: kill(2) has no memory effects.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let gone = |name: &'static str| self.daemon(name).pid().is_none();
        for _ in 0..100 {
            if gone("kubelet") && gone("containerd") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        println!("==> killed containerd and the kubelet; the pods' shims {shims:?} live on");
        self.up()?;
        let left: Vec<i32> = self.shims()?.into_iter().filter(|pid| shims.contains(pid)).collect();
        ensure!(left.is_empty(), "the old shims {left:?} outlived `up`");
        kubelet.wait_ready("running the pod node-crash in a new container", Duration::from_secs(120), || {
            running().is_some_and(|id| id != before)
        })?;
        run(&mut kubectl(&["delete", "pod", "node-crash", "--wait=true"]))
    }

    pub(super) fn kubelet_port(&self) -> u16 {
        port(KUBELET_PORT)
    }

    pub(super) fn scheduler_port(&self) -> u16 {
        port(SCHEDULER_PORT)
    }

    pub(super) fn containerd_serving(&self) -> bool {
        succeeds(self.ctr().arg("version"))
    }

    pub(super) fn scheduler_healthy(&self) -> bool {
        http_get(port(SCHEDULER_PORT), "/healthz", None).is_some_and(|(status, _)| status == 200)
    }

    pub(super) fn kubelet_healthy(&self) -> bool {
        http_get(port(KUBELET_HEALTHZ_PORT), "/healthz", None).is_some_and(|(status, _)| status == 200)
    }
}

/// `examples/demo-app`, built static so that its image needs nothing else.
fn demo_app() -> Result<PathBuf> {
    let triple = capture(Command::new("rustc").arg("-vV"))?
        .lines()
        .find_map(|line| line.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")?;
    println!("==> cargo build --release -p demo-app (static)");
    run(cargo()
        .args(["build", "--quiet", "--release", "--locked", "-p", "demo-app", "--target", &triple])
        // Set with --target, it reaches the demo app's crates alone, not the host's build.
        .env("RUSTFLAGS", "-C target-feature=+crt-static"))?;
    Ok(repo_root().join("target").join(triple).join("release/demo-app"))
}

/// A one-binary image, `name`, written to `archive` as docker-archive, which `ctr` imports
/// with its name.
fn local_image(dir: &Path, name: &str, binary: &Path, archive: &Path) -> Result<()> {
    apt::ensure_packages(&["buildah"], false)?;
    let rootfs = dir.join("rootfs");
    remove_all(&rootfs)?;
    fs::create_dir_all(rootfs.join("tmp"))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    let entrypoint = format!("/{}", binary.file_name().and_then(|n| n.to_str()).context("a binary's name")?);
    fs::copy(binary, rootfs.join(entrypoint.trim_start_matches('/')))?;
    let buildah = Buildah::new(dir.join("storage"));
    let container = buildah.output(&["from", "scratch"])?;
    let result = (|| {
        buildah.run(&["copy", &container, &format!("{}/", rootfs.display()), "/"])?;
        buildah.run(&["config", &format!("--entrypoint=[\"{entrypoint}\"]"), "--cmd=", "--user=65532", &container])?;
        let _ = fs::remove_file(archive);
        buildah.run(&["commit", "--rm", &container, &format!("docker-archive:{}:{name}", archive.display())])
    })();
    if result.is_err() {
        let _ = buildah.run(&["rm", &container]);
    }
    result?;
    remove_all(&rootfs)
}

/// Every mounted cgroup hierarchy: v1's (`/sys/fs/cgroup/cpu`, …) and v2's, which runc fills
/// too where both are mounted.
fn cgroup_hierarchies() -> Result<Vec<PathBuf>> {
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    let found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            matches!(fields.get(2), Some(&"cgroup" | &"cgroup2")).then(|| PathBuf::from(fields[1]))
        })
        .collect();
    ensure!(!found.is_empty(), "no cgroup file system is mounted");
    Ok(found)
}

fn collect_procs(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_procs(&entry.path(), out);
        }
    }
}

/// Removes a cgroup and those below it, children first; one already gone is fine.
fn remove_cgroup(dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else { return Ok(()) };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&entry.path())?;
        }
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove the cgroup {}", dir.display()))
        }
        _ => Ok(()),
    }
}
