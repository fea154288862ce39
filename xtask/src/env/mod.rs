//! `cargo xtask env up|down|status`: etcd, kube-apiserver, kube-controller-manager, a node
//! (containerd, kube-scheduler, kubelet) and three Consul agents (plain, with ACLs, and one for
//! the fault tests) on loopback. Their data, certs, tokens, logs and pid files live in
//! `target/consulbind-env/`.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::common::{minutes, remove_all, repo_root};
use crate::process::Daemon;
use consul::{AGENTS, CONSUL, CONSUL_ACL, CONSUL_FAULTS, CONSUL_FAULTS_HTTPS_PORT, CONSUL_HTTPS_PORT};
use kubernetes::{APISERVER_PORT, ETCD_PORT, etcd_healthy};

pub mod apt;
mod consul;
pub mod demo;
pub mod image;
mod kubernetes;
pub mod node;
pub mod notices;
pub mod provision;

/// The API server's port, whose connections the benchmarks count.
pub fn apiserver_port() -> u16 {
    port(APISERVER_PORT)
}

/// `base` shifted by CONSULBIND_ENV_PORT_OFFSET (default 0), so two environments can run side by
/// side on one machine, e.g. two worktrees. Read once: every port of a run must agree.
fn port(base: u16) -> u16 {
    static OFFSET: OnceLock<u16> = OnceLock::new();
    let offset = *OFFSET.get_or_init(|| match std::env::var("CONSULBIND_ENV_PORT_OFFSET") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("CONSULBIND_ENV_PORT_OFFSET={v:?} is not a number from 0 to 65535")),
        _ => 0,
    });
    base.checked_add(offset)
        .unwrap_or_else(|| panic!("port {base} + CONSULBIND_ENV_PORT_OFFSET {offset} is above 65535"))
}

pub struct Env {
    dir: PathBuf,
}

impl Env {
    pub fn new() -> Self {
        Self { dir: repo_root().join("target/consulbind-env") }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn run_dir(&self) -> &Path {
        &self.dir
    }

    pub fn env_file(&self) -> PathBuf {
        self.path("env")
    }

    pub fn daemon(&self, name: &'static str) -> Daemon {
        Daemon::new(name, &self.dir)
    }

    /// Every process, in start order.
    fn daemons(&self) -> Vec<Daemon> {
        let [containerd, scheduler, kubelet] = node::DAEMONS;
        ["etcd", "kube-apiserver", "kube-controller-manager", containerd, scheduler, kubelet]
            .into_iter()
            .chain(AGENTS.map(|a| a.name))
            .map(|n| self.daemon(n))
            .collect()
    }

    /// Starts whatever isn't running, waits until all of it is ready, installs the CRDs and writes the
    /// env file. Safe to run again at any time.
    pub fn up(&self) -> Result<()> {
        let started = Instant::now();
        let tools = provision::tools()?;
        fs::create_dir_all(&self.dir)?;
        let admin_token = self.secret("admin-token")?;
        let master_token = self.secret("consul-acl-master-token")?;
        self.write_kube_files(&admin_token)?;
        self.write_consul_certs()?;

        println!("==> starting the environment in {}", self.dir.display());
        // Consul first: its agents elect themselves while Kubernetes comes up.
        for agent in AGENTS {
            self.start_agent(&tools, agent, &master_token)?;
        }
        self.start_kubernetes(&tools)?;
        self.start_node(&tools)?;
        for agent in AGENTS {
            self.daemon(agent.name)
                .wait_ready("serving with a leader", Duration::from_secs(60), || agent.ready(&master_token))?;
        }

        self.apply_crds(&tools.kubectl)?;
        // Built only by the commands that test it (`cargo xtask e2e` and `test`).
        if let Some(binary) = provision::apiextensions_if_built()? {
            self.start_apiextensions(&binary)?;
        }
        self.write_env_file()?;
        println!("environment up after {}; to use it from a shell:", minutes(started.elapsed()));
        println!("    source {}", shown(&self.path("env")).display());
        Ok(())
    }

    /// Stops the processes `up` started, by their recorded pids. Data stays for the next `up`.
    pub fn down(&self) -> Result<()> {
        let mut failed = Vec::new();
        // Controllers of the demo and the benchmark, then the servers in reverse start order.
        let controllers = [
            self.daemon("controller"),
            self.daemon("bench-controller"),
            self.daemon("kube-apiserver-2"),
            self.daemon("apiextensions-apiserver"),
        ];
        for daemon in controllers.into_iter().chain(self.daemons().into_iter().rev()) {
            // The pods go with their runtime, and what they leave goes after it.
            let node = daemon.name == "containerd";
            if node && let Err(e) = self.remove_pods() {
                eprintln!("{e:#}");
                failed.push("the pods");
            }
            if let Err(e) = daemon.stop() {
                eprintln!("{e:#}");
                failed.push(daemon.name);
            }
            if node && let Err(e) = self.remove_node_leftovers() {
                eprintln!("{e:#}");
                failed.push("the pods' leftovers");
            }
        }
        ensure!(failed.is_empty(), "could not stop {}", failed.join(", "));
        Ok(())
    }

    /// Deletes all state (data, certs, tokens, logs). Call it only after `down`.
    pub fn wipe(&self) -> Result<()> {
        remove_all(&self.dir)
    }

    /// Prints each process with its state and endpoint, and fails unless all are running and healthy.
    pub fn status(&self) -> Result<()> {
        let master_token = fs::read_to_string(self.path("consul-acl-master-token")).unwrap_or_default();
        let apiserver_ready = provision::kubectl().is_ok_and(|kubectl| self.apiserver_ready(&kubectl));
        let rows = [
            (format!("http://127.0.0.1:{}", port(ETCD_PORT)), etcd_healthy()),
            (format!("https://127.0.0.1:{}", port(APISERVER_PORT)), apiserver_ready),
            // No health port: running is all we can tell.
            ("-".to_owned(), true),
            (self.containerd_socket().display().to_string(), self.containerd_serving()),
            (format!("http://127.0.0.1:{}", self.scheduler_port()), self.scheduler_healthy()),
            (format!("https://{}:{}", node::NODE, self.kubelet_port()), self.kubelet_healthy()),
            (CONSUL.addr(), CONSUL.ready("")),
            (CONSUL_ACL.addr(), CONSUL_ACL.ready(master_token.trim())),
            (CONSUL_FAULTS.addr(), CONSUL_FAULTS.ready("")),
        ];
        println!("environment in {}", shown(&self.dir).display());
        let mut all_up = true;
        for (daemon, (endpoint, healthy)) in self.daemons().iter().zip(rows) {
            let state = match daemon.pid() {
                Some(pid) if healthy => format!("running (pid {pid})"),
                Some(pid) => format!("UNHEALTHY (pid {pid})"),
                None => "stopped".to_owned(),
            };
            all_up &= daemon.pid().is_some() && healthy;
            println!("  {:<24} {state:<20} {endpoint:<24} {}", daemon.name, shown(&daemon.log()).display());
        }
        ensure!(all_up, "the environment is not fully up; `cargo xtask env up` starts what is missing");
        println!("to use it from a shell:\n    source {}", shown(&self.path("env")).display());
        Ok(())
    }

    /// What the env file exports; the end-to-end tests get the same.
    pub fn vars(&self) -> Result<Vec<(&'static str, String)>> {
        let master_token = fs::read_to_string(self.path("consul-acl-master-token"))
            .context("the environment was never set up; run `cargo xtask env up`")?;
        Ok(vec![
            ("KUBECONFIG", self.kubeconfig().display().to_string()),
            ("CONSUL_HTTP_ADDR", CONSUL.addr()),
            ("CONSULBIND_E2E_ACL_ADDR", CONSUL_ACL.addr()),
            ("CONSULBIND_E2E_FAULTS_ADDR", CONSUL_FAULTS.addr()),
            ("CONSULBIND_E2E_FAULTS_TLS_ADDR", format!("https://127.0.0.1:{}", port(CONSUL_FAULTS_HTTPS_PORT))),
            ("CONSULBIND_E2E_ACL_TOKEN", master_token.trim().to_owned()),
            ("CONSULBIND_E2E_TLS_ADDR", format!("https://127.0.0.1:{}", port(CONSUL_HTTPS_PORT))),
            ("CONSULBIND_E2E_CONSUL_CA", self.consul_tls().ca.display().to_string()),
            // Installed by `cargo xtask e2e` (and `cargo xtask helm`), for the chart's tests.
            ("CONSULBIND_HELM", provision::helm_path()?.display().to_string()),
            // Started once `cargo xtask e2e` (or `test`) has built it.
            ("CONSULBIND_E2E_APIEXTENSIONS_KUBECONFIG", self.apiextensions_kubeconfig().display().to_string()),
        ])
    }

    fn write_env_file(&self) -> Result<()> {
        let mut text = String::from("# Written by `cargo xtask env up`, for `source`.\n");
        for (name, value) in self.vars()? {
            text += &format!("export {name}='{}'\n", value.replace('\'', r"'\''"));
        }
        Ok(fs::write(self.path("env"), text)?)
    }

    /// A random token kept in the run dir, so it stays the same across `down` and `up`.
    fn secret(&self, name: &str) -> Result<String> {
        let path = self.path(name);
        if let Ok(token) = fs::read_to_string(&path)
            && !token.trim().is_empty()
        {
            return Ok(token.trim().to_owned());
        }
        let token = uuid()?;
        fs::write(&path, &token)?;
        Ok(token)
    }
}

/// A path relative to the current directory when it is inside it, for shorter output.
fn shown(path: &Path) -> &Path {
    std::env::current_dir().ok().and_then(|cwd| path.strip_prefix(cwd).ok()).unwrap_or(path)
}

/// A random version-4 UUID, the form Consul wants for its master token.
fn uuid() -> Result<String> {
    let mut b = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|byte| format!("{byte:02x}")).collect();
    Ok(format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]))
}
