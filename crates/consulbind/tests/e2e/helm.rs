//! The Helm chart (config/helm/consulbind), installed into the API server with `helm`, and the
//! controller run with the settings and the ServiceAccount the chart made: its RBAC is enough for
//! the core path, and what it does not grant is refused. `cargo xtask helm` checks the rest of the
//! chart without a server.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::anyhow;
use consulbind_api::ConsulBinding;
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Pod, Secret},
    rbac::v1::{ClusterRoleBinding, RoleBinding},
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::rbac::{Start, assert_forbidden, scenario};
use crate::support::{Controller, ROLLOUT_CRD, Scene, client_from, install_rollout_crd, kubeconfig_in};

/// Installs (or upgrades) `release` into `namespace` with `sets`, and returns the path of a
/// kubeconfig for the ServiceAccount it made and how to start the controller as the chart would:
/// with the settings of the chart's ConfigMap, read back from the API server, and that account.
async fn install(s: &Scene, release: &str, namespace: &str, sets: &[String]) -> (PathBuf, Start) {
    let helm = std::env::var("CONSULBIND_HELM").expect("CONSULBIND_HELM names Helm; run `cargo xtask e2e`");
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/helm/consulbind");
    let consul = std::env::var("CONSUL_HTTP_ADDR").unwrap();
    let mut cmd = Command::new(helm);
    cmd.args(["upgrade", "--install", release]).arg(chart);
    cmd.args(["--namespace", namespace, "--create-namespace", "--set", &format!("consul.address={consul}")]);
    let out = cmd.args(sets.iter().flat_map(|s| ["--set", s])).output().expect("running helm");
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let account = format!("{release}-consulbind");
    let kubeconfig = kubeconfig_in(namespace, &account);
    let config_maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), namespace);
    let config = config_maps.get(&format!("{account}-config")).await.unwrap();
    let mut envs: Vec<(String, String)> = config.data.unwrap().into_iter().collect();
    envs.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
    envs.push(("POD_NAME".into(), format!("{account}-0")));
    let start = Start { args: vec![], envs, key: (namespace.to_owned(), "consulbind-checksum-key".to_owned()) };
    (kubeconfig, start)
}

/// The value the chart's settings give `name`.
fn setting<'a>(start: &'a Start, name: &str) -> Option<&'a str> {
    start.envs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// What the chart does not grant: reading a Secret by name (only the labelled token Secrets are
/// listed), deleting a workload, and binding itself to more.
async fn refused(s: &Scene, client: Client, other_namespace: Option<&str>) {
    let forbidden = |what: &str, result: Result<(), kube::Error>| {
        let error = result.err().map(|e| anyhow!(e)).unwrap_or_else(|| panic!("{what} was allowed"));
        assert_forbidden(&error, what);
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &s.ns);
    forbidden("get of a Secret", secrets.get("anything").await.map(drop));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &s.ns);
    forbidden("delete of a Deployment", deployments.delete("anything", &Default::default()).await.map(drop));
    let escalation = serde_json::from_value(json!({"metadata": {"name": "helm-escalation"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "name": "someone"}]}))
    .unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    forbidden("create of a ClusterRoleBinding", bindings.create(&Default::default(), &escalation).await.map(drop));
    if let Some(other) = other_namespace {
        let deployments: Api<Deployment> = Api::namespaced(client, other);
        forbidden(
            "list of Deployments outside the served namespaces",
            deployments.list(&Default::default()).await.map(drop),
        );
    }
}

#[tokio::test]
async fn the_chart_installs_and_its_rbac_serves_every_namespace() {
    let Some(s) = Scene::without_controller("helm").await else { return };
    // The core path stamps a Rollout too.
    let _crd = ROLLOUT_CRD.lock().await;
    install_rollout_crd();
    let (release, namespace) = ("helm-e2e", "consulbind-helm");
    // The API server takes the optional NetworkPolicy as the chart writes it.
    let sets = ["image.tag=e2e".into(), "networkPolicy.enabled=true".into()];
    let (kubeconfig, start) = install(&s, release, namespace, &sets).await;
    assert_eq!(setting(&start, "CONSULBIND_NAMESPACES"), None, "{:?}", start.envs);
    scenario(&s, &start, "cluster").await.expect("the core path with the chart's settings and ServiceAccount");
    refused(&s, client_from(&kubeconfig).await, None).await;
    namespace_editors_manage_bindings(&s).await;
    helm_test_passes_on_the_bed(&s, release, namespace, &start).await;
    s.finish().await;
}

/// `helm test` on the bed. The bed's node runs only pods that tolerate its taint, and the chart's test
/// pod does not, so the test plays the kubelet for the chart's test
/// pod alone: it runs the pod's own arguments with this build's `consulbind`, as the pod's
/// ServiceAccount, the Service's name standing for the controller's address (the bed has no
/// cluster DNS either), and reports the exit as the pod's phase, which is all Helm waits on.
/// It passes against the controller the chart configures, and fails, naming what, once that
/// controller is gone.
async fn helm_test_passes_on_the_bed(s: &Scene, release: &str, namespace: &str, start: &Start) {
    let envs: Vec<(&str, &str)> = start.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let controller = Controller::start_with_env(&s.ns, &[], &envs).await.unwrap();
    let (passed, said) = helm_test(s, release, namespace, &controller.admin.to_string(), "30s").await;
    assert!(passed && said.contains("Succeeded") && said.contains("serves consulbindings.consulbind.dev"), "{said}");
    controller.stop().await;
    let closed = crate::support::free_port().to_string();
    let (passed, said) = helm_test(s, release, namespace, &closed, "1s").await;
    let failed = format!("pod {release}-consulbind-probe failed");
    assert!(!passed && said.contains(&failed) && said.contains(&format!("{closed}/readyz")), "{said}");
}

/// Runs `helm test` while playing the kubelet for its pod, with `service` standing for the
/// controller's Service; whether it passed and what Helm and the probe said.
async fn helm_test(s: &Scene, release: &str, namespace: &str, service: &str, within: &str) -> (bool, String) {
    let helm = std::env::var("CONSULBIND_HELM").unwrap();
    let mut cmd = tokio::process::Command::new(helm);
    cmd.args(["test", release, "--namespace", namespace, "--timeout", "90s"]);
    let helm = cmd.output();
    let kubelet = async {
        let pods: Api<Pod> = Api::namespaced(s.client.clone(), namespace);
        let name = format!("{release}-consulbind-probe");
        let pod = loop {
            match pods.get_opt(&name).await.unwrap() {
                Some(pod) if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending") => break pod,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let spec = pod.spec.unwrap();
        let account = spec.service_account_name.unwrap();
        let container = &spec.containers[0];
        let metrics = format!("{release}-consulbind-metrics.{namespace}.svc:");
        let args: Vec<String> = container
            .args
            .clone()
            .unwrap()
            .into_iter()
            .map(|arg| match arg.find(&metrics) {
                Some(at) => {
                    let port_and_path = &arg[at + metrics.len()..];
                    let path = &port_and_path[port_and_path.find('/').unwrap()..];
                    format!("{}{service}{path}", &arg[..at])
                }
                None => arg,
            })
            .collect();
        assert!(args.iter().any(|a| a.starts_with("--url=") && a.contains(service)), "the pod's arguments: {args:?}");
        let out = Command::new(env!("CARGO_BIN_EXE_consulbind"))
            .args(&args)
            .arg(format!("--within={within}"))
            .env("KUBECONFIG", kubeconfig_in(namespace, &account))
            .output()
            .unwrap();
        let phase = if out.status.success() { "Succeeded" } else { "Failed" };
        let status = json!({"status": {"phase": phase}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let (helm, probe) = tokio::join!(helm, kubelet);
    let helm = helm.unwrap();
    let said = format!(
        "{}{}\nthe probe: {probe}",
        String::from_utf8_lossy(&helm.stdout),
        String::from_utf8_lossy(&helm.stderr)
    );
    (helm.status.success(), said)
}

/// The chart's aggregated roles: a user given Kubernetes' own `edit` role in a namespace may
/// create and delete bindings there, and one given `view` may read them but not create one.
async fn namespace_editors_manage_bindings(s: &Scene) {
    let grant = |user: &str, role: &str| -> RoleBinding {
        serde_json::from_value(json!({"metadata": {"name": format!("{user}-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
        .unwrap()
    };
    let role_bindings: Api<RoleBinding> = Api::namespaced(s.client.clone(), &s.ns);
    for (user, role) in [("tenant-editor", "edit"), ("tenant-viewer", "view")] {
        role_bindings.create(&PostParams::default(), &grant(user, role)).await.unwrap();
    }
    let as_user = |user: &'static str| async move {
        let mut config = kube::Config::infer().await.unwrap();
        config.auth_info.impersonate = Some(user.into());
        Api::<ConsulBinding>::namespaced(Client::try_from(config).unwrap(), &s.ns)
    };
    let binding: ConsulBinding = serde_json::from_value(json!({"apiVersion": "consulbind.dev/v1alpha1",
        "kind": "ConsulBinding", "metadata": {"name": "by-a-tenant"},
        "spec": {"keys": [{"key": "tenant/config"}], "targets": [{"kind": "Deployment", "name": "web"}]}}))
    .unwrap();
    let (editor, viewer) = (as_user("tenant-editor").await, as_user("tenant-viewer").await);
    // kube-controller-manager aggregates the rules into the built-in roles within seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let created = loop {
        match editor.create(&PostParams::default(), &binding).await {
            Ok(created) => break created,
            Err(error) if std::time::Instant::now() < deadline => {
                assert_forbidden(&anyhow!(error), "create of a binding by an editor, before aggregation");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(error) => panic!("an editor of the namespace cannot create a binding: {error}"),
        }
    };
    assert_eq!(created.metadata.name.as_deref(), Some("by-a-tenant"));
    viewer.get("by-a-tenant").await.expect("a viewer reads bindings");
    let other = ConsulBinding {
        metadata: kube::core::ObjectMeta { name: Some("by-a-viewer".into()), ..Default::default() },
        ..binding
    };
    let error = viewer.create(&PostParams::default(), &other).await.map(drop).err().map(|e| anyhow!(e));
    assert_forbidden(&error.expect("a viewer created a binding"), "create of a binding by a viewer");
    editor.delete("by-a-tenant", &DeleteParams::default()).await.expect("an editor deletes bindings");
}

#[tokio::test]
async fn the_chart_serving_listed_namespaces_grants_those_alone() {
    let Some(s) = Scene::without_controller("helm-ns").await else { return };
    let _crd = ROLLOUT_CRD.lock().await;
    install_rollout_crd();
    let (release, namespace) = ("helm-ns", "consulbind-helm-ns");
    let (kubeconfig, start) = install(&s, release, namespace, &[format!("namespaces={{{}}}", s.ns)]).await;
    assert_eq!(setting(&start, "CONSULBIND_NAMESPACES"), Some(s.ns.as_str()), "{:?}", start.envs);
    scenario(&s, &start, "namespaced").await.expect("the core path with the chart's Role in the namespace");
    refused(&s, client_from(&kubeconfig).await, Some("default")).await;
    s.finish().await;
}
