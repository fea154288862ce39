//! The environment's Kubernetes: etcd, kube-apiserver (and a second one on demand),
//! kube-controller-manager, the current CRD server, and the files they read.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use super::provision::{self, Tools};
use super::{Env, port};
use crate::common::repo_root;
use crate::process::{capture, http_get, run, succeeds};

// Not the default ports, so a local etcd, Kubernetes or Consul can keep theirs. Every port goes
// through `port`, which adds CONSULBIND_ENV_PORT_OFFSET.
pub(super) const ETCD_PORT: u16 = 23791;
const ETCD_PEER_PORT: u16 = 23801;
pub(super) const APISERVER_PORT: u16 = 16443;
/// Kubernetes' CRD server at a current version, for the CRD's validation rules.
const APIEXTENSIONS_PORT: u16 = 16450;

impl Env {
    /// etcd, kube-apiserver and kube-controller-manager, each ready before the next starts.
    pub(super) fn start_kubernetes(&self, tools: &Tools) -> Result<()> {
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
                // What workloads and their pods need on the one node: the workloads' controllers,
                // Jobs and CronJobs, the node's lifecycle (which lifts its `not-ready` taint),
                // endpoints and the collection of finished pods. No cloud and no node IPAM: the
                // pods share the node's network.
                "--controllers=deployment,replicaset,statefulset,daemonset,job,cronjob,garbagecollector,\
             namespace,serviceaccount,serviceaccount-token,clusterrole-aggregation,nodelifecycle,podgc,endpoint"
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
            // The node's name resolves to loopback, where its kubelet listens.
            "--kubelet-preferred-address-types=Hostname".to_owned(),
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

    pub(super) fn apiextensions_kubeconfig(&self) -> PathBuf {
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

    pub(super) fn kubeconfig(&self) -> PathBuf {
        self.path("kubeconfig")
    }

    /// The service account key pair, the token file with the admin token, and a kubeconfig using it.
    /// The apiserver writes its own self-signed serving cert into `pki/` on first start.
    pub(super) fn write_kube_files(&self, admin_token: &str) -> Result<()> {
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

    pub(super) fn kubectl(&self, kubectl: &Path) -> Command {
        let mut cmd = Command::new(kubectl);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig().display()));
        cmd
    }

    pub(super) fn apiserver_ready(&self, kubectl: &Path) -> bool {
        capture(self.kubectl(kubectl).args(["get", "--raw=/readyz", "--request-timeout=5s"]))
            .is_ok_and(|body| body.trim() == "ok")
    }

    /// Applies the CRDs for Kubernetes 1.20 (without validation rules, which it refuses) and waits
    /// until the API serves them.
    pub(super) fn apply_crds(&self, kubectl: &Path) -> Result<()> {
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

pub(super) fn etcd_healthy() -> bool {
    http_get(port(ETCD_PORT), "/health", None).is_some_and(|(status, body)| status == 200 && body.contains("true"))
}
