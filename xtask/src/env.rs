//! `cargo xtask env up|down|status`: etcd, kube-apiserver, kube-controller-manager and two Consul
//! agents (one plain, one with ACLs) on loopback. Their data, certs, tokens, logs and pid files live
//! in `target/consulbind-env/`.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::process::{Daemon, capture, http_get, run, succeeds};
use crate::provision::{self, Tools};
use crate::{minutes, remove_all, repo_root};

// Not the default ports, so a local etcd, Kubernetes or Consul can keep theirs. Every port goes
// through `port`, which adds CONSULBIND_ENV_PORT_OFFSET.
const ETCD_PORT: u16 = 23791;
const ETCD_PEER_PORT: u16 = 23801;
const APISERVER_PORT: u16 = 16443;
/// Kubernetes' CRD server at a current version, for the CRD's validation rules.
const APIEXTENSIONS_PORT: u16 = 16450;
/// The plain agent's HTTPS port.
const CONSUL_HTTPS_PORT: u16 = 18501;
const CONSUL_FAULTS_HTTPS_PORT: u16 = 18701;

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

/// A single-server Consul agent on loopback. DNS and gRPC are off. Ports are before the offset.
struct Agent {
    name: &'static str,
    http: u16,
    /// HTTPS beside HTTP, with the environment's own CA.
    https: Option<u16>,
    server: u16,
    serf_lan: u16,
    serf_wan: u16,
    acl: bool,
}

/// The files of the environment's CA and of the HTTPS agent's certificate.
struct ConsulTls {
    ca: PathBuf,
    ca_key: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// The plain agent, which `CONSUL_HTTP_ADDR` points at.
const CONSUL: Agent = Agent {
    name: "consul",
    http: 18500,
    https: Some(CONSUL_HTTPS_PORT),
    server: 18510,
    serf_lan: 18511,
    serf_wan: 18512,
    acl: false,
};
/// ACLs on with default deny, for the ACL tests.
/// A plain agent of its own for the tests that stop, restart or wipe Consul, so that the other
/// tests, which run at the same time, never see it go.
const CONSUL_FAULTS: Agent = Agent {
    name: "consul-faults",
    http: 18700,
    https: Some(CONSUL_FAULTS_HTTPS_PORT),
    server: 18710,
    serf_lan: 18711,
    serf_wan: 18712,
    acl: false,
};
const AGENTS: [&Agent; 3] = [&CONSUL, &CONSUL_ACL, &CONSUL_FAULTS];
const CONSUL_ACL: Agent =
    Agent { name: "consul-acl", http: 18600, https: None, server: 18610, serf_lan: 18611, serf_wan: 18612, acl: true };

impl Agent {
    fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", port(self.http))
    }

    /// Serving, with a leader, and for the ACL agent accepting its master token, which only works
    /// once the new leader has stored it.
    fn ready(&self, master_token: &str) -> bool {
        let leader = http_get(port(self.http), "/v1/status/leader", None)
            .is_some_and(|(status, body)| status == 200 && !body.trim().trim_matches('"').is_empty());
        leader
            && (!self.acl
                || http_get(port(self.http), "/v1/acl/token/self", Some(master_token)).is_some_and(|(s, _)| s == 200))
    }
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
    fn daemons(&self) -> [Daemon; 6] {
        ["etcd", "kube-apiserver", "kube-controller-manager", CONSUL.name, CONSUL_ACL.name, CONSUL_FAULTS.name]
            .map(|n| self.daemon(n))
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

    fn start_agent(&self, tools: &Tools, agent: &Agent, master_token: &str) -> Result<()> {
        let config = self.path(&format!("{}.hcl", agent.name));
        fs::write(&config, self.consul_config(agent, master_token))?;
        let config = format!("-config-file={}", config.display());
        self.daemon(agent.name).ensure_started(Command::new(&tools.consul).args(["agent", &config]))
    }

    /// Stops a Consul agent, keeps it down for `down`, optionally deletes its data (a rebuilt
    /// cluster, or a restore that lost everything), and starts it again, ready with a leader.
    pub fn restart_consul(&self, name: &str, empty: bool, down: Duration) -> Result<()> {
        let agent = agent(name)?;
        let tools = provision::tools()?;
        let master_token = self.secret("consul-acl-master-token")?;
        let daemon = self.daemon(agent.name);
        daemon.stop()?;
        std::thread::sleep(down);
        if empty {
            remove_all(&self.path(&format!("{}-data", agent.name)))?;
        }
        self.start_agent(&tools, agent, &master_token)?;
        daemon.wait_ready("serving with a leader", Duration::from_secs(60), || agent.ready(&master_token))
    }

    /// Freezes an agent for `time`; it is thawed even when the wait is interrupted.
    pub fn hang_consul(&self, name: &str, time: Duration) -> Result<()> {
        let pid = self.daemon(agent(name)?.name).pid().with_context(|| format!("{name} is not running"))?;
        let signal = |signal| match unsafe { libc::kill(pid as libc::pid_t, signal) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()).with_context(|| format!("signalling {name} (pid {pid})")),
        };
        crate::process::catch_interrupts();
        signal(libc::SIGSTOP)?;
        let deadline = std::time::Instant::now() + time;
        while std::time::Instant::now() < deadline && !crate::process::interrupted() {
            std::thread::sleep(Duration::from_millis(100));
        }
        signal(libc::SIGCONT)
    }

    /// etcd, kube-apiserver and kube-controller-manager, each ready before the next starts.
    fn start_kubernetes(&self, tools: &Tools) -> Result<()> {
        let etcd = self.daemon("etcd");
        let client_url = format!("http://127.0.0.1:{}", port(ETCD_PORT));
        let peer_url = format!("http://127.0.0.1:{}", port(ETCD_PEER_PORT));
        etcd.ensure_started(Command::new(&tools.etcd).args([
            "--name=consulbind".to_owned(),
            format!("--data-dir={}", self.path("etcd-data").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=consulbind={peer_url}"),
        ]))?;
        etcd.wait_ready("healthy", Duration::from_secs(60), etcd_healthy)?;

        let pki = self.path("pki");
        let apiserver = self.daemon("kube-apiserver");
        apiserver.ensure_started(&mut self.apiserver_command(tools, port(APISERVER_PORT)))?;
        apiserver.wait_ready("ready (/readyz)", Duration::from_secs(180), || self.apiserver_ready(&tools.kubectl))?;

        let controller_manager = self.daemon("kube-controller-manager");
        controller_manager.ensure_started(
            Command::new(&tools.kube_controller_manager).args([
                format!("--kubeconfig={}", self.kubeconfig().display()),
                // Enough for Deployments to roll out as new ReplicaSets. Nothing schedules or runs pods.
                "--controllers=deployment,replicaset,statefulset,daemonset,garbagecollector,namespace,\
             serviceaccount,serviceaccount-token"
                    .to_owned(),
                format!("--service-account-private-key-file={}", pki.join("sa.key").display()),
                format!("--root-ca-file={}", pki.join("apiserver.crt").display()),
                "--leader-elect=false".to_owned(),
                "--secure-port=0".to_owned(),
                "--port=0".to_owned(),
                // The defaults (20 requests per second, 5 Deployments at a time) would make
                // ReplicaSets lag by minutes behind the scale tests and benchmarks.
                "--kube-api-qps=500".to_owned(),
                "--kube-api-burst=1000".to_owned(),
                "--concurrent-deployment-syncs=20".to_owned(),
                "--concurrent-replicaset-syncs=20".to_owned(),
            ]),
        )?;
        // It has no health port; the serviceaccount controller's first object shows it is working.
        controller_manager.wait_ready("creating ServiceAccount default/default", Duration::from_secs(120), || {
            succeeds(self.kubectl(&tools.kubectl).args(["get", "serviceaccount", "default", "--namespace=default"]))
        })
    }

    /// A kube-apiserver on `port` over the environment's etcd, with its certificates and tokens.
    fn apiserver_command(&self, tools: &Tools, port: u16) -> Command {
        let pki = self.path("pki");
        let mut cmd = Command::new(&tools.kube_apiserver);
        cmd.args([
            format!("--etcd-servers=http://127.0.0.1:{}", self::port(ETCD_PORT)),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            // 1.20 still serves an unauthenticated port 8080 unless told not to.
            "--insecure-port=0".to_owned(),
            // Advertise loopback instead of guessing a host address, which may not exist. Endpoints
            // can't hold a loopback address, so nothing maintains those of the `kubernetes` Service.
            "--advertise-address=127.0.0.1".to_owned(),
            "--endpoint-reconciler-type=none".to_owned(),
            format!("--cert-dir={}", pki.display()),
            format!("--token-auth-file={}", self.path("tokens.csv").display()),
            "--authorization-mode=RBAC".to_owned(),
            format!("--service-account-key-file={}", pki.join("sa.pub").display()),
            format!("--service-account-signing-key-file={}", pki.join("sa.key").display()),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        ]);
        cmd
    }

    /// Starts Kubernetes' current CRD server (built by [`provision::apiextensions`]) on the
    /// environment's etcd, under a prefix of its own. It serves CRDs and their objects, and asks
    /// the 1.20 kube-apiserver who a client is (TokenReview), what it may do (SubjectAccessReview)
    /// and which namespaces exist, as an aggregated API server would.
    pub fn start_apiextensions(&self, binary: &Path) -> Result<()> {
        let kubectl = provision::kubectl()?;
        let daemon = self.daemon("apiextensions-apiserver");
        let kubeconfig = self.kubeconfig().display().to_string();
        daemon.ensure_started(
            Command::new(binary).args([
                format!("--etcd-servers=http://127.0.0.1:{}", port(ETCD_PORT)),
                "--etcd-prefix=/apiextensions".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={}", port(APIEXTENSIONS_PORT)),
                format!("--cert-dir={}", self.path("pki/apiextensions").display()),
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                // 1.20 has no client CA for front proxies to publish, no priority and fairness
                // objects and no admission policies: nothing to wait for.
                "--authentication-skip-lookup".to_owned(),
                "--enable-priority-and-fairness=false".to_owned(),
                "--disable-admission-plugins=ValidatingAdmissionPolicy,MutatingAdmissionPolicy,\
             ValidatingAdmissionWebhook,MutatingAdmissionWebhook"
                    .to_owned(),
            ]),
        )?;
        fs::write(
            self.apiextensions_kubeconfig(),
            self.kubeconfig_text(port(APIEXTENSIONS_PORT), "pki/apiextensions/apiserver.crt")?,
        )?;
        daemon.wait_ready("ready (/readyz)", Duration::from_secs(120), || {
            let config = format!("--kubeconfig={}", self.apiextensions_kubeconfig().display());
            capture(Command::new(&kubectl).args([config.as_str(), "get", "--raw=/readyz", "--request-timeout=5s"]))
                .is_ok_and(|body| body.trim() == "ok")
        })
    }

    fn apiextensions_kubeconfig(&self) -> PathBuf {
        self.path("apiextensions.kubeconfig")
    }

    /// Starts or stops a second kube-apiserver on the same etcd, on the next port. A client whose
    /// watches it served comes back to a fresh watch cache: resuming from an older resource
    /// version is refused (410 Gone), and the client lists again.
    pub fn second_apiserver(&self, up: bool) -> Result<()> {
        let daemon = self.daemon("kube-apiserver-2");
        if !up {
            return daemon.stop();
        }
        let tools = provision::tools()?;
        let port = port(APISERVER_PORT) + 1;
        daemon.ensure_started(&mut self.apiserver_command(&tools, port))?;
        daemon.wait_ready("ready (/readyz)", Duration::from_secs(180), || {
            let server = format!("--server=https://127.0.0.1:{port}");
            capture(self.kubectl(&tools.kubectl).args([
                server.as_str(),
                "get",
                "--raw=/readyz",
                "--request-timeout=5s",
            ]))
            .is_ok_and(|body| body.trim() == "ok")
        })
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
            if let Err(e) = daemon.stop() {
                eprintln!("{e:#}");
                failed.push(daemon.name);
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

    fn kubeconfig(&self) -> PathBuf {
        self.path("kubeconfig")
    }

    /// The service account key pair, the token file with the admin token, and a kubeconfig using it.
    /// The apiserver writes its own self-signed serving cert into `pki/` on first start.
    fn write_kube_files(&self, admin_token: &str) -> Result<()> {
        let pki = self.path("pki");
        fs::create_dir_all(&pki)?;
        let key = pki.join("sa.key");
        if !key.exists() {
            // Written beside it and renamed, so an interrupted run leaves no half-written key.
            let tmp = pki.join("sa.key.tmp");
            capture(Command::new("openssl").args(["genrsa", "-out"]).arg(&tmp).arg("2048"))?;
            fs::rename(&tmp, &key)?;
        }
        capture(Command::new("openssl").args(["rsa", "-pubout", "-in"]).arg(&key).arg("-out").arg(pki.join("sa.pub")))?;
        fs::write(self.path("tokens.csv"), format!("{admin_token},admin,admin,system:masters\n"))?;
        Ok(fs::write(self.kubeconfig(), self.kubeconfig_text(port(APISERVER_PORT), "pki/apiserver.crt")?)?)
    }

    /// A kubeconfig for the admin, for the server on `port` whose CA is the file `ca` of the run dir.
    fn kubeconfig_text(&self, port: u16, ca: &str) -> Result<String> {
        let admin_token = self.secret("admin-token")?;
        Ok(format!(
            "apiVersion: v1
kind: Config
clusters:
- name: consulbind
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority: {:?}
users:
- name: admin
  user:
    token: {admin_token}
contexts:
- name: consulbind
  context:
    cluster: consulbind
    user: admin
current-context: consulbind
",
            self.path(ca).display().to_string(),
        ))
    }

    /// Where the HTTPS agent's CA and serving certificate live.
    fn consul_tls(&self) -> ConsulTls {
        let pki = self.path("pki");
        ConsulTls {
            ca: pki.join("consul-ca.crt"),
            ca_key: pki.join("consul-ca.key"),
            cert: pki.join("consul.crt"),
            key: pki.join("consul.key"),
        }
    }

    /// A CA and a serving certificate for 127.0.0.1, for the agent that also speaks HTTPS.
    fn write_consul_certs(&self) -> Result<()> {
        let pki = self.path("pki");
        let ConsulTls { ca, ca_key, cert, key } = self.consul_tls();
        if cert.exists() {
            return Ok(());
        }
        let openssl = |args: &[&str]| capture(Command::new("openssl").args(args));
        let path = |p: &Path| p.display().to_string();
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=consulbind-env CA",
            "-keyout",
            &path(&ca_key),
            "-out",
            &path(&ca),
        ])?;
        let csr = pki.join("consul.csr");
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            &path(&key),
            "-out",
            &path(&csr),
        ])?;
        let ext = pki.join("consul.ext");
        fs::write(&ext, "subjectAltName = IP:127.0.0.1, DNS:localhost\n")?;
        // Written last: its presence says the set is complete.
        let tmp = pki.join("consul.crt.tmp");
        openssl(&[
            "x509",
            "-req",
            "-in",
            &path(&csr),
            "-CA",
            &path(&ca),
            "-CAkey",
            &path(&ca_key),
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            &path(&ext),
            "-out",
            &path(&tmp),
        ])?;
        Ok(fs::rename(&tmp, &cert)?)
    }

    fn consul_config(&self, agent: &Agent, master_token: &str) -> String {
        let data_dir = self.path(&format!("{}-data", agent.name));
        let acl = if agent.acl {
            // The master token is also the agent's own, so it may register itself in the catalog.
            format!(
                "acl {{\n  enabled = true\n  default_policy = \"deny\"\n  tokens {{\n    master = \"{master_token}\"\n    \
                 agent = \"{master_token}\"\n  }}\n}}\n"
            )
        } else {
            String::new()
        };
        format!(
            "node_name = \"{name}\"
data_dir = {data_dir:?}
server = true
bootstrap_expect = 1
bind_addr = \"127.0.0.1\"
client_addr = \"127.0.0.1\"
disable_update_check = true
# Quicker leader election than the production default of 5.
performance {{
  raft_multiplier = 1
}}
{tls}ports {{
  http = {http}{https}
  server = {server}
  serf_lan = {serf_lan}
  serf_wan = {serf_wan}
  dns = -1
  grpc = -1
}}
{acl}",
            name = agent.name,
            data_dir = data_dir.display().to_string(),
            http = port(agent.http),
            https = agent.https.map(|p| format!("\n  https = {}", port(p))).unwrap_or_default(),
            tls = match agent.https {
                Some(_) => {
                    let ConsulTls { ca, cert, key, .. } = self.consul_tls();
                    let path = |p: PathBuf| p.display().to_string();
                    format!("ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n", path(ca), path(cert), path(key))
                }
                None => String::new(),
            },
            server = port(agent.server),
            serf_lan = port(agent.serf_lan),
            serf_wan = port(agent.serf_wan),
        )
    }

    fn kubectl(&self, kubectl: &Path) -> Command {
        let mut cmd = Command::new(kubectl);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig().display()));
        cmd
    }

    fn apiserver_ready(&self, kubectl: &Path) -> bool {
        capture(self.kubectl(kubectl).args(["get", "--raw=/readyz", "--request-timeout=5s"]))
            .is_ok_and(|body| body.trim() == "ok")
    }

    /// Applies the CRDs for Kubernetes 1.20 (without validation rules, which it refuses) and waits
    /// until the API serves them.
    fn apply_crds(&self, kubectl: &Path) -> Result<()> {
        let crds = repo_root().join("crds/before-1.25");
        println!("==> installing the CRDs from crds/before-1.25/");
        run(self.kubectl(kubectl).args(["apply", "--server-side", "--force-conflicts", "-k"]).arg(&crds))?;
        run(self.kubectl(kubectl).args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/consulbindings.consulbind.dev",
        ]))
    }
}

fn etcd_healthy() -> bool {
    http_get(port(ETCD_PORT), "/health", None).is_some_and(|(status, body)| status == 200 && body.contains("true"))
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

fn agent(name: &str) -> Result<&'static Agent> {
    AGENTS.into_iter().find(|a| a.name == name).with_context(|| {
        let names: Vec<&str> = AGENTS.iter().map(|a| a.name).collect();
        format!("no Consul agent {name:?}; the agents are {}", names.join(", "))
    })
}
