//! Least privilege: every rule config/ grants is needed. Every other test already runs the
//! controller as the ServiceAccount config/ installs; this one runs it as a twin account bound to
//! copies of the same rules, and takes the rules away one at a time.

use std::time::Duration;

use anyhow::{Context, Result};
use consulbind_api::conditions::{self, reason};
use k8s_openapi::api::{
    core::v1::{Secret, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use crate::support::{
    Controller, ROLLOUT_CRD, SYSTEM_NS, Scene, install_config, install_rollout_crd, kubeconfig_for, wait_for,
};

const PROBE: &str = "consulbind-rbac-probe";
const OWN_ROLE: &str = "consulbind-own-namespace";
const KEY_SECRET: &str = "consulbind-checksum-key";
const STEP: Duration = Duration::from_secs(20);

/// How to start the controller for [`scenario`]: its arguments and environment (its kubeconfig
/// among them), and the namespace and name of its checksum key.
pub struct Start {
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    pub key: (String, String),
}

/// The core path: a token from a Secret, a baseline, a rollout, an event, the status.
pub async fn scenario(s: &Scene, start: &Start, tag: &str) -> Result<()> {
    // The checksum key is made afresh each time, so that creating it is part of the path.
    let secrets: Api<Secret> = Api::namespaced(s.client.clone(), &start.key.0);
    let _ = secrets.delete(&start.key.1, &Default::default()).await;
    let args: Vec<&str> = start.args.iter().map(String::as_str).collect();
    let envs: Vec<(&str, &str)> = start.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let controller = Controller::start_with_env(&s.ns, &args, &envs).await?;
    let result = async {
        let (key, web, binding) = (s.key(tag), format!("web-{tag}"), format!("cfg-{tag}"));
        s.put(&key, "v1").await;
        s.workload("Deployment", &web, json!({})).await;
        let rollout = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": web},
            "spec": {"template": {"metadata": {"labels": {"app": web}}}}});
        s.apply(rollout).await?;
        let (cronjobs, version) = crate::cronjobs::cronjobs(s).await;
        s.apply(crate::cronjobs::cronjob(&version, &web)).await?;
        wait_for("a first ReplicaSet", STEP, || async { Ok(s.revisions("Deployment", &web).await == 1) }).await?;
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "consul-token",
            "labels": {"consulbind.dev/token": "true"}}, "stringData": {"token": "unused-without-acls"}});
        s.apply(secret).await?;
        s.binding(
            &binding,
            json!({"keys": [{"key": key}], "targets": [{"kind": "Deployment", "name": web}, {"kind": "Rollout", "name": web},
                {"kind": "CronJob", "name": web}],
            "rollout": {"quietPeriod": "0s"}, "consul": {"tokenSecretRef": {"name": "consul-token"}}}),
        )
        .await;
        wait_for("a baseline", STEP, || async {
            let b = s.bindings().get(&binding).await?;
            let conditions = b.status.iter().flat_map(|s| &s.conditions);
            Ok(conditions.into_iter().any(|c| c.type_ == conditions::READY && c.reason == reason::BASELINED))
        })
        .await?;
        s.put(&key, "v2").await;
        wait_for("a rollout", STEP, || async { Ok(s.revisions("Deployment", &web).await == 2) }).await?;
        wait_for("a stamped Rollout", STEP, || async { Ok(s.rollout_generation(&web).await == 2) }).await?;
        wait_for("a stamped CronJob", STEP, || async {
            Ok(crate::cronjobs::stamp_of(&cronjobs.get(&web).await?, &binding).is_some())
        })
        .await?;
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

fn rbac(kind: &str, name: &str, namespace: Option<&str>, extra: Value) -> Value {
    let mut object = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": {"name": name}});
    if let Some(ns) = namespace {
        object["metadata"]["namespace"] = json!(ns);
    }
    object.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    object
}

/// A twin of the controller's ServiceAccount in consulbind-system, bound to copies of its roles
/// (the checksum key Secret's name swapped for the twin's own), whose rules a test changes
/// without touching the account every other test runs as.
pub struct Twin {
    pub name: &'static str,
    pub cluster_rules: Vec<PolicyRule>,
    pub own_rules: Vec<PolicyRule>,
    cluster_roles: Api<ClusterRole>,
    roles: Api<Role>,
}

impl Twin {
    pub async fn new(s: &Scene, name: &'static str) -> Self {
        install_config();
        let pp = PatchParams::apply("e2e-rbac").force();
        let cluster_roles: Api<ClusterRole> = Api::all(s.client.clone());
        let roles: Api<Role> = Api::namespaced(s.client.clone(), SYSTEM_NS);
        let cluster_rules = cluster_roles.get("consulbind").await.unwrap().rules.unwrap();
        let mut own_rules = roles.get(OWN_ROLE).await.unwrap().rules.unwrap();
        for rule_name in own_rules.iter_mut().flat_map(|r| r.resource_names.iter_mut().flatten()) {
            if rule_name == KEY_SECRET {
                *rule_name = name.to_owned();
            }
        }
        assert!(own_rules.iter().any(|r| r.resource_names.as_ref().is_some_and(|n| n.iter().any(|n| n == name))));
        let twin = Self { name, cluster_rules, own_rules, cluster_roles, roles };
        twin.set_rules(&twin.cluster_rules, &twin.own_rules).await;

        let subject = json!([{"kind": "ServiceAccount", "name": name, "namespace": SYSTEM_NS}]);
        let account =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": SYSTEM_NS}});
        Api::<ServiceAccount>::namespaced(s.client.clone(), SYSTEM_NS)
            .patch(name, &pp, &Patch::Apply(&account))
            .await
            .unwrap();
        let role_ref = |kind: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name});
        let binding =
            rbac("ClusterRoleBinding", name, None, json!({"subjects": subject, "roleRef": role_ref("ClusterRole")}));
        Api::<ClusterRoleBinding>::all(s.client.clone()).patch(name, &pp, &Patch::Apply(&binding)).await.unwrap();
        let binding =
            rbac("RoleBinding", name, Some(SYSTEM_NS), json!({"subjects": subject, "roleRef": role_ref("Role")}));
        Api::<RoleBinding>::namespaced(s.client.clone(), SYSTEM_NS)
            .patch(name, &pp, &Patch::Apply(&binding))
            .await
            .unwrap();
        twin
    }

    /// The controller's cluster rules, each edited by `edit`.
    pub fn cluster_rules_with(&self, edit: impl FnMut(&mut PolicyRule)) -> Vec<PolicyRule> {
        let mut rules = self.cluster_rules.clone();
        rules.iter_mut().for_each(edit);
        rules
    }

    /// The controller's cluster rules without the one that lets it write a binding's status.
    pub fn cluster_rules_without_status(&self) -> Vec<PolicyRule> {
        let mut rules = self.cluster_rules.clone();
        rules.retain(|rule| !rule.resources.iter().flatten().any(|r| r == "consulbindings/status"));
        rules
    }

    /// Binds the twin to these rules instead.
    pub async fn set_rules(&self, cluster: &[PolicyRule], own: &[PolicyRule]) {
        let pp = PatchParams::apply("e2e-rbac").force();
        let cluster = rbac("ClusterRole", self.name, None, json!({"rules": cluster}));
        let own = rbac("Role", self.name, Some(SYSTEM_NS), json!({"rules": own}));
        self.cluster_roles.patch(self.name, &pp, &Patch::Apply(&cluster)).await.unwrap();
        self.roles.patch(self.name, &pp, &Patch::Apply(&own)).await.unwrap();
    }

    /// The controller's arguments for running as the twin: its own lease and checksum key.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--leader-elect=true".into(),
            format!("--lease-namespace={SYSTEM_NS}"),
            format!("--lease-name={}", self.name),
            format!("--checksum-key-secret={SYSTEM_NS}/{}", self.name),
        ]
    }

    /// Starts the scene's controller as the twin, with `extra` arguments.
    pub async fn start_controller(&self, s: &mut Scene, extra: &[&str]) {
        let kubeconfig = kubeconfig_for(self.name);
        let mut args = self.args();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        s.start_controller_with_env(&args, &[("KUBECONFIG", kubeconfig.to_str().unwrap())]).await;
    }

    /// Starting the controller as the twin, with `kubeconfig`.
    fn start(&self, kubeconfig: &str) -> Start {
        let envs = vec![("KUBECONFIG".to_owned(), kubeconfig.to_owned())];
        Start { args: self.args(), envs, key: (SYSTEM_NS.to_owned(), self.name.to_owned()) }
    }
}

#[tokio::test]
async fn every_granted_rule_is_needed() {
    let Some(s) = Scene::without_controller("rbac").await else { return };
    // The rule on Rollouts is needed only where they are served.
    let _crd = ROLLOUT_CRD.lock().await;
    install_rollout_crd();
    let twin = Twin::new(&s, PROBE).await;
    let (cluster_rules, own_rules) = (twin.cluster_rules.clone(), twin.own_rules.clone());
    let start = twin.start(kubeconfig_for(PROBE).to_str().unwrap());

    scenario(&s, &start, "granted").await.expect("the core path with every rule");
    for (i, rule) in cluster_rules.iter().enumerate() {
        let mut fewer = cluster_rules.clone();
        fewer.remove(i);
        twin.set_rules(&fewer, &own_rules).await;
        let result = scenario(&s, &start, &format!("without-{i}")).await;
        let error = result.expect_err(&format!("removing {rule:?} broke nothing"));
        assert_forbidden(&error, &format!("{rule:?}"));
    }
    for (i, rule) in own_rules.iter().enumerate() {
        let mut fewer = own_rules.clone();
        fewer.remove(i);
        twin.set_rules(&cluster_rules, &fewer).await;
        let result = scenario(&s, &start, &format!("without-own-{i}")).await;
        let error = result.expect_err(&format!("removing {rule:?} broke nothing"));
        assert_forbidden(&error, &format!("{rule:?}"));
    }
    twin.set_rules(&cluster_rules, &own_rules).await;
    scenario(&s, &start, "restored").await.expect("the core path with the rules restored");
    s.finish().await;
}

/// The scenario failed because the API server said 403 to the controller, not for another reason.
pub fn assert_forbidden(error: &anyhow::Error, rule: &str) {
    let text = format!("{error:#}");
    assert!(
        // The API server words every 403 as "<resource> is forbidden: User ... cannot <verb>".
        text.contains("is forbidden"),
        "without {rule} the controller failed, but never saw a 403 Forbidden:\n{text}"
    );
}
