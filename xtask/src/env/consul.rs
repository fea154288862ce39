//! The environment's Consul agents: their ports, configuration, certificates, and the faults
//! the tests cause (a restart, a freeze).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use super::provision::{self, Tools};
use super::{Env, port};
use crate::common::remove_all;
use crate::process::{capture, http_get};

/// The plain agent's HTTPS port.
pub(super) const CONSUL_HTTPS_PORT: u16 = 18501;
pub(super) const CONSUL_FAULTS_HTTPS_PORT: u16 = 18701;

/// A single-server Consul agent on loopback. DNS and gRPC are off. Ports are before the offset.
pub(super) struct Agent {
    pub(super) name: &'static str,
    http: u16,
    /// HTTPS beside HTTP, with the environment's own CA.
    https: Option<u16>,
    server: u16,
    serf_lan: u16,
    serf_wan: u16,
    acl: bool,
}

/// The files of the environment's CA and of the HTTPS agent's certificate.
pub(super) struct ConsulTls {
    pub(super) ca: PathBuf,
    ca_key: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// The plain agent, which `CONSUL_HTTP_ADDR` points at.
pub(super) const CONSUL: Agent = Agent {
    name: "consul",
    http: 18500,
    https: Some(CONSUL_HTTPS_PORT),
    server: 18510,
    serf_lan: 18511,
    serf_wan: 18512,
    acl: false,
};
/// ACLs on with default deny, for the ACL tests.
pub(super) const CONSUL_ACL: Agent =
    Agent { name: "consul-acl", http: 18600, https: None, server: 18610, serf_lan: 18611, serf_wan: 18612, acl: true };
/// A plain agent of its own for the tests that stop, restart or wipe Consul, so that the other
/// tests, which run at the same time, never see it go.
pub(super) const CONSUL_FAULTS: Agent = Agent {
    name: "consul-faults",
    http: 18700,
    https: Some(CONSUL_FAULTS_HTTPS_PORT),
    server: 18710,
    serf_lan: 18711,
    serf_wan: 18712,
    acl: false,
};
pub(super) const AGENTS: [&Agent; 3] = [&CONSUL, &CONSUL_ACL, &CONSUL_FAULTS];

impl Agent {
    pub(super) fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", port(self.http))
    }

    /// Serving, with a leader, and for the ACL agent accepting its master token, which only works
    /// once the new leader has stored it.
    pub(super) fn ready(&self, master_token: &str) -> bool {
        let leader = http_get(port(self.http), "/v1/status/leader", None)
            .is_some_and(|(status, body)| status == 200 && !body.trim().trim_matches('"').is_empty());
        leader
            && (!self.acl
                || http_get(port(self.http), "/v1/acl/token/self", Some(master_token)).is_some_and(|(s, _)| s == 200))
    }
}

impl Env {
    pub(super) fn start_agent(&self, tools: &Tools, agent: &Agent, master_token: &str) -> Result<()> {
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

    /// Where the HTTPS agent's CA and serving certificate live.
    pub(super) fn consul_tls(&self) -> ConsulTls {
        let pki = self.path("pki");
        ConsulTls {
            ca: pki.join("consul-ca.crt"),
            ca_key: pki.join("consul-ca.key"),
            cert: pki.join("consul.crt"),
            key: pki.join("consul.key"),
        }
    }

    /// A CA and a serving certificate for 127.0.0.1, for the agent that also speaks HTTPS.
    pub(super) fn write_consul_certs(&self) -> Result<()> {
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
}

fn agent(name: &str) -> Result<&'static Agent> {
    AGENTS.into_iter().find(|a| a.name == name).with_context(|| {
        let names: Vec<&str> = AGENTS.iter().map(|a| a.name).collect();
        format!("no Consul agent {name:?}; the agents are {}", names.join(", "))
    })
}
