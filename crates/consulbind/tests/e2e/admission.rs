//! The CRD's validation rules on a current API server: Kubernetes' own CRD server at 1.36
//! (built from Debian sid's sources by `cargo xtask e2e`), on the bed's etcd and asking the 1.20
//! kube-apiserver who a client is. The 1.20 bed serves the CRD without the rules
//! (crds/before-1.25/), where the controller refuses the same bindings as `InvalidSpec`.

use std::{path::PathBuf, time::Duration};

use consulbind_api::{ConsulBinding, ConsulBindingSpec, ConsulBindingStatus};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::support::{Scene, client_from, wait_for};

const CRD_NAME: &str = "consulbindings.consulbind.dev";

/// A client of the current CRD server, with the CRD of crds/ (rules and all) installed and
/// established there. Each test has a client of its own: a client's connections live on the
/// runtime of the test that made it.
async fn current() -> Client {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let client = client().await;
    INSTALLED.get_or_init(|| install(client.clone())).await;
    client
}

async fn client() -> Client {
    let path = std::env::var("CONSULBIND_E2E_APIEXTENSIONS_KUBECONFIG").unwrap();
    assert!(
        std::path::Path::new(&path).exists(),
        "no current CRD server: `cargo xtask e2e` builds and starts it ({path} is missing)"
    );
    client_from(std::path::Path::new(&path)).await
}

async fn install(client: Client) {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds/consulbinding.yaml");
    let crd: CustomResourceDefinition = serde_yaml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let pp = PatchParams::apply("e2e-admission").force();
    crds.patch(CRD_NAME, &pp, &Patch::Apply(&crd)).await.expect("the current API server takes the CRD with its rules");
    let established = || async {
        let conditions = crds.get(CRD_NAME).await?.status.and_then(|s| s.conditions).unwrap_or_default();
        let structural = conditions.iter().all(|c| c.type_ != "NonStructuralSchema" || c.status != "True");
        assert!(structural, "the CRD is not structural: {conditions:?}");
        Ok(conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"))
    };
    wait_for("the CRD established", Duration::from_secs(30), established).await.unwrap();
}

fn binding(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "metadata": {"name": name}, "spec": spec})
}

/// A valid spec with `change` merged into it.
fn spec_with(change: Value) -> Value {
    let mut spec = json!({"keys": [{"key": "app/config"}], "targets": [{"kind": "Deployment", "name": "web"}]});
    for (field, value) in change.as_object().unwrap() {
        spec[field] = value.clone();
    }
    spec
}

#[tokio::test]
async fn each_rule_refuses_a_malformed_binding_at_apply_naming_the_field() {
    let Some(s) = Scene::without_controller("admission").await else { return };
    let bindings: Api<ConsulBinding> = Api::namespaced(current().await, &s.ns);
    let pp = PatchParams::apply("e2e-admission");
    let selector = json!({"matchLabels": {"app": "web"}});
    // Each cross-field rule of the controller's `InvalidSpec`, then size bounds of the schema.
    let cases = [
        (json!({"keys": []}), "spec: the binding has no source", true),
        (
            json!({"targets": [{"kind": "Deployment", "name": "web", "selector": selector}]}),
            "exactly one of name and selector",
            true,
        ),
        // The schema's oneOf refuses it first, and the API server then skips the rules.
        (json!({"targets": [{"kind": "Deployment"}]}), "spec.targets[0].name: Required value", true),
        (
            json!({"keys": [{"key": "a"}, {"key": "a", "optional": true}]}),
            "spec.keys: a Consul key or prefix is listed twice",
            true,
        ),
        (
            json!({"configMaps": [{"name": "c"}, {"name": "c", "keys": ["x"]}]}),
            "spec.configMaps: a ConfigMap is listed twice",
            true,
        ),
        (
            json!({"secrets": [{"name": "s", "keys": ["x"]}, {"name": "s", "keys": ["y"]}]}),
            "spec.secrets: a Secret is listed twice",
            true,
        ),
        (json!({"rollout": {"quietPeriod": "2h"}}), "spec.rollout.quietPeriod: at most 1h", true),
        (json!({"rollout": {"maxDelay": "24h1s"}}), "spec.rollout.maxDelay: at most 24h", true),
        // Taken by releases before the rule: the controller serves it with a SpecWarning.
        (
            json!({"rollout": {"quietPeriod": "1m", "maxDelay": "30s"}}),
            "spec.rollout.maxDelay: shorter than spec.rollout.quietPeriod",
            false,
        ),
        (json!({"rollout": {"healthTimeout": "25h"}}), "spec.rollout.healthTimeout: at most 24h", true),
        (
            json!({"rollout": {"waves": [{"name": "web", "selector": selector}]}}),
            "spec.rollout.waves: a wave sets both name and selector",
            true,
        ),
        (
            json!({"rollout": {"waves": [{"pause": "24h1ms"}]}}),
            "spec.rollout.waves: a wave's pause is longer than 24h",
            true,
        ),
        (json!({"rollout": {"budget": {"maxRollouts": 3, "per": "0s"}}}), "spec.rollout.budget.per", true),
        (json!({"rollout": {"budget": {"maxRollouts": 3, "per": "48h"}}}), "spec.rollout.budget.per", true),
        (json!({"rollout": {"budget": {"maxRollouts": 101, "per": "1h"}}}), "spec.rollout.budget.maxRollouts", true),
        (json!({"rollout": {"waves": [{"maxParallel": 0}]}}), "spec.rollout.waves[0].maxParallel", true),
        (
            json!({"rollout": {"windows": [{"schedule": "0 22 * *", "duration": "1h"}]}}),
            "spec.rollout.windows[0].schedule",
            true,
        ),
        (
            json!({"rollout": {"windows": [{"schedule": "* 24 * * *", "duration": "1h"}]}}),
            "spec.rollout.windows[0].schedule",
            true,
        ),
        (
            json!({"rollout": {"windows": [{"schedule": "* * * * *", "duration": "0s"}]}}),
            "spec.rollout.windows: a window's duration",
            true,
        ),
        (
            json!({"rollout": {"windows": [{"schedule": "* * * * *", "duration": "169h"}]}}),
            "spec.rollout.windows: a window's duration",
            true,
        ),
        (
            json!({"rollout": {"windows": [{"schedule": "* * * * *", "duration": "1h", "timeZone": "a/b/c/d"}]}}),
            "spec.rollout.windows[0].timeZone",
            true,
        ),
        (json!({"configMaps": [{"name": "c", "keys": [""]}]}), "spec.configMaps[0].keys[0]", true),
        (json!({"keys": (0..65).map(|i| json!({"key": format!("k{i}")})).collect::<Vec<_>>()}), "spec.keys", false),
        (json!({"keys": [{"key": "/app"}]}), "spec.keys[0].key", true),
    ];
    for (i, (change, field, controller_refuses)) in cases.into_iter().enumerate() {
        let spec = spec_with(change);
        let result =
            bindings.patch(&format!("bad-{i}"), &pp, &Patch::Apply(&binding(&format!("bad-{i}"), spec.clone()))).await;
        let Err(kube::Error::Api(status)) = result else {
            panic!("the current API server took {spec}: {result:?}");
        };
        assert_eq!(status.code, 422, "{spec}: {status:?}");
        assert!(status.message.contains(field), "the refusal of {spec} does not name {field:?}: {}", status.message);
        // The controller keeps the same checks, for servers without the rules.
        if controller_refuses {
            let parsed: ConsulBindingSpec = serde_json::from_value(spec.clone()).unwrap();
            assert!(consulbind::reconcile::read::validate(&parsed).is_err(), "the controller takes {spec}");
        }
    }
    s.finish().await;
}

#[tokio::test]
async fn every_example_is_taken_and_the_status_is_written_through_its_subresource() {
    let Some(s) = Scene::without_controller("admission-ok").await else { return };
    let bindings: Api<ConsulBinding> = Api::namespaced(current().await, &s.ns);
    let pp = PatchParams::apply("e2e-admission");
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut taken = 0;
    for file in std::fs::read_dir(examples).unwrap() {
        let path = file.unwrap().path();
        // Beside the manifests, the demo app's source.
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut object: Value = serde::Deserialize::deserialize(doc).unwrap();
            if object["kind"] != "ConsulBinding" {
                continue;
            }
            object["metadata"].as_object_mut().unwrap().remove("namespace");
            let name = object["metadata"]["name"].as_str().unwrap().to_owned();
            bindings.patch(&name, &pp, &Patch::Apply(&object)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            taken += 1;
        }
    }
    assert!(taken >= 2, "only {taken} example bindings");

    // As the controller writes it: server-side apply of the status alone.
    let status = ConsulBindingStatus { short_checksum: Some("0123456789ab".into()), ..Default::default() };
    let patch = json!({"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding", "status": status});
    let name = "ok";
    let spec = spec_with(json!({}));
    bindings.create(&PostParams::default(), &serde_json::from_value(binding(name, spec)).unwrap()).await.unwrap();
    bindings.patch_status(name, &PatchParams::apply("consulbind").force(), &Patch::Apply(&patch)).await.unwrap();
    let read = bindings.get(name).await.unwrap();
    assert_eq!(read.status.and_then(|s| s.short_checksum).as_deref(), Some("0123456789ab"));
    s.finish().await;
}

/// A binding stored before the rule came (here through the CRD without its rules) and broken
/// by it: once the CRD has its rules, the controller can still write its status, and its spec
/// is taken again unchanged, since the API server judges only what changed (validation
/// ratcheting). The CRD is a copy under a group of its own, so the other tests' CRD never lacks
/// its rules.
#[tokio::test]
async fn a_stored_binding_that_breaks_a_newer_rule_still_takes_its_status() {
    let Some(s) = Scene::without_controller("admission-stored").await else { return };
    let client = client().await;
    let group = "upgrade.consulbind.dev";
    let crd = |file: &str| -> CustomResourceDefinition {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(file);
        let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        crd["metadata"]["name"] = json!(format!("consulbindings.{group}"));
        crd["spec"]["group"] = json!(group);
        serde_json::from_value(crd).unwrap()
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("e2e-admission").force();
    let name = format!("consulbindings.{group}");
    let established = || async {
        let conditions = crds.get(&name).await?.status.and_then(|s| s.conditions).unwrap_or_default();
        Ok(conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"))
    };
    crds.patch(&name, &pp, &Patch::Apply(&crd("crds/before-1.25/consulbinding.yaml"))).await.unwrap();
    wait_for("the CRD without rules established", Duration::from_secs(30), established).await.unwrap();
    let resource = kube::api::ApiResource {
        group: group.into(),
        version: "v1alpha1".into(),
        api_version: format!("{group}/v1alpha1"),
        kind: "ConsulBinding".into(),
        plural: "consulbindings".into(),
    };
    let bindings: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), &s.ns, &resource);
    let mut stored = binding("stored", spec_with(json!({"rollout": {"quietPeriod": "1m", "maxDelay": "30s"}})));
    stored["apiVersion"] = json!(format!("{group}/v1alpha1"));
    // Retried: the new group's discovery may lag behind Established for a moment.
    let create = || async {
        Ok(bindings.patch("stored", &PatchParams::apply("e2e-admission"), &Patch::Apply(&stored)).await.is_ok())
    };
    wait_for("the stored binding", Duration::from_secs(30), create).await.unwrap();

    crds.patch(&name, &pp, &Patch::Apply(&crd("crds/consulbinding.yaml"))).await.unwrap();
    // A new probe each time: one taken before the rules came would be judged by what changed.
    let probes = std::sync::atomic::AtomicUsize::new(0);
    let ruled = || async {
        let name = format!("probe-{}", probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let mut probe = stored.clone();
        probe["metadata"]["name"] = json!(name);
        let refused = bindings.patch(&name, &PatchParams::apply("e2e-admission"), &Patch::Apply(&probe)).await;
        Ok(matches!(refused, Err(kube::Error::Api(status)) if status.code == 422))
    };
    wait_for("the rules in force", Duration::from_secs(30), ruled).await.unwrap();

    let status = json!({"apiVersion": format!("{group}/v1alpha1"), "kind": "ConsulBinding",
        "status": {"shortChecksum": "0123456789ab"}});
    let written =
        bindings.patch_status("stored", &PatchParams::apply("consulbind").force(), &Patch::Apply(&status)).await;
    assert!(written.is_ok(), "the status of a stored binding the rules now refuse: {written:?}");
    let reapplied = bindings.patch("stored", &PatchParams::apply("e2e-admission"), &Patch::Apply(&stored)).await;
    assert!(reapplied.is_ok(), "the same spec applied again: {reapplied:?}");
    crds.delete(&name, &Default::default()).await.unwrap();
    s.finish().await;
}
