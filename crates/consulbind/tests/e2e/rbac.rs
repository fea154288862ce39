//! The controller authenticated as its own ServiceAccount, with exactly the RBAC in config/.

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, bail};
use consulbind_api::conditions::{self, reason};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::support::{Controller, Scene, wait_for};

const SYSTEM_NS: &str = "consulbind-system";
const STEP: Duration = Duration::from_secs(20);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kubectl(args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl").args(args).output()?;
    if !out.status.success() {
        bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// A kubeconfig for the controller's ServiceAccount, with a token from the TokenRequest API.
fn service_account_kubeconfig() -> Result<PathBuf> {
    let token = kubectl(&["-n", SYSTEM_NS, "create", "token", "consulbind", "--duration=2h"])?;
    let admin = std::fs::read_to_string(std::env::var("KUBECONFIG")?)?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin)?;
    config["users"][0]["user"] = serde_yaml::to_value(serde_json::json!({ "token": token.trim() }))?;
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("consulbind-sa.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

/// The core path as the ServiceAccount: a token from a Secret, a baseline, a rollout, events.
async fn scenario(s: &Scene, kubeconfig: &str, tag: &str) -> Result<()> {
    let args = ["--leader-elect=true", &format!("--lease-namespace={SYSTEM_NS}"), "--identity=rbac-e2e"];
    let controller = Controller::start_with_env(&s.ns, &args, &[("KUBECONFIG", kubeconfig)]).await?;
    let result = async {
        let (key, web, binding) = (s.key(tag), format!("web-{tag}"), format!("cfg-{tag}"));
        s.put(&key, "v1").await;
        s.workload("Deployment", &web, json!({})).await;
        s.apply(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "consul-token"}, "stringData": {"token": "unused-without-acls"}}))
            .await?;
        s.binding(&binding, json!({"keys": [{"key": key}], "targets": [{"kind": "Deployment", "name": web}],
            "rollout": {"quietPeriod": "0s"}, "consul": {"tokenSecretRef": {"name": "consul-token"}}}))
            .await;
        wait_for("a baseline", STEP, || async {
            let b = s.bindings().get(&binding).await?;
            Ok(b.status.iter().flat_map(|s| &s.conditions).any(|c| c.type_ == conditions::READY && c.reason == reason::BASELINED))
        })
        .await?;
        s.put(&key, "v2").await;
        wait_for("a rollout", STEP, || async { Ok(s.revisions("Deployment", &web).await == 2) }).await?;
        wait_for("a RolledOut event", STEP, || async {
            Ok(s.events_for(&binding).await.iter().any(|(r, _)| r == reason::ROLLED_OUT))
        })
        .await
    }
    .await;
    let log = controller.log();
    controller.stop().await;
    result.with_context(|| format!("controller log:\n{log}"))
}

#[tokio::test]
async fn runs_as_its_service_account_and_needs_every_rule_it_is_granted() {
    let Some(s) = Scene::without_controller("rbac").await else { return };
    let config = repo().join("config");
    kubectl(&["apply", "--server-side", "--force-conflicts", "-k", config.to_str().unwrap()]).unwrap();
    let kubeconfig = service_account_kubeconfig().unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap();

    scenario(&s, kubeconfig, "granted").await.expect("the core scenario as the ServiceAccount");

    let pp = PatchParams::apply("e2e-rbac").force();
    let cluster_roles: Api<ClusterRole> = Api::all(s.client.clone());
    let full = cluster_roles.get("consulbind").await.unwrap().rules.unwrap();
    for (i, rule) in full.iter().enumerate() {
        let mut fewer = full.clone();
        fewer.remove(i);
        let patch = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "rules": fewer});
        cluster_roles.patch("consulbind", &pp, &Patch::Apply(&patch)).await.unwrap();
        let result = scenario(&s, kubeconfig, &format!("without-{i}")).await;
        assert!(result.is_err(), "removing {rule:?} from the ClusterRole broke nothing");
    }
    let patch = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "rules": full});
    cluster_roles.patch("consulbind", &pp, &Patch::Apply(&patch)).await.unwrap();

    let roles: Api<Role> = Api::namespaced(s.client.clone(), SYSTEM_NS);
    let role = roles.get("consulbind-leader-election").await.unwrap();
    assert_eq!(role.rules.as_ref().map(Vec::len), Some(1));
    let patch = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": []});
    roles.patch("consulbind-leader-election", &pp, &Patch::Apply(&patch)).await.unwrap();
    let result = scenario(&s, kubeconfig, "without-lease").await;
    let patch = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": role.rules});
    roles.patch("consulbind-leader-election", &pp, &Patch::Apply(&patch)).await.unwrap();
    assert!(result.is_err(), "removing the Lease rule broke nothing");

    scenario(&s, kubeconfig, "restored").await.expect("the core scenario with the rules restored");
    s.finish().await;
}
