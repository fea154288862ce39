//! The checks of the Helm chart (config/helm/consulbind) that need no server: `helm lint`, that
//! its objects equal the kustomize manifests' in effect for the same settings, that each value
//! reaches what it sets, and that values.yaml's defaults are the controller's own. Installing it
//! into the API server and running the controller with its RBAC is an end-to-end test
//! (crates/consulbind/tests/e2e/helm.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::common::{cargo, repo_root};
use crate::env::provision;
use crate::process::{capture, run};

mod page;
mod schema;

const CHART: &str = "config/helm/consulbind";
const RELEASE: &str = "consulbind";
const NAMESPACE: &str = "consulbind-system";

/// Each value that sets a flag, its environment variable and a value other than its default.
const FLAGS: &[(&str, &str, &str)] = &[
    ("consul.address", "CONSUL_HTTP_ADDR", "https://consul.example.com:8501"),
    ("consul.sslVerify", "CONSUL_HTTP_SSL_VERIFY", "false"),
    ("consul.tlsServerName", "CONSUL_TLS_SERVER_NAME", "consul.example.com"),
    ("consul.wait", "CONSULBIND_CONSUL_WAIT", "2m"),
    ("consul.maxConnections", "CONSULBIND_CONSUL_MAX_CONNECTIONS", "100"),
    ("consul.failureGrace", "CONSULBIND_CONSUL_FAILURE_GRACE", "20s"),
    ("consul.restoreGrace", "CONSULBIND_CONSUL_RESTORE_GRACE", "1m"),
    ("controller.defaultTokenPrefixes", "CONSULBIND_DEFAULT_TOKEN_PREFIXES", "apps/\\,shared/"),
    ("controller.checksumKeySecret", "CONSULBIND_CHECKSUM_KEY_SECRET", "key-of-checksums"),
    ("controller.objectFailureGrace", "CONSULBIND_OBJECT_FAILURE_GRACE", "10s"),
    ("controller.maxPrefixEntries", "CONSULBIND_MAX_PREFIX_ENTRIES", "500"),
    ("controller.maxPrefixBytes", "CONSULBIND_MAX_PREFIX_BYTES", "1048576"),
    ("controller.maxBindingBytes", "CONSULBIND_MAX_BINDING_BYTES", "8388608"),
    ("controller.maxBindingsPerNamespace", "CONSULBIND_MAX_BINDINGS_PER_NAMESPACE", "50"),
    ("controller.maxWatchedPathsPerNamespace", "CONSULBIND_MAX_WATCHED_PATHS_PER_NAMESPACE", "500"),
    ("controller.maxObjectKeys", "CONSULBIND_MAX_OBJECT_KEYS", "100"),
    ("controller.defaultRolloutBudget", "CONSULBIND_DEFAULT_ROLLOUT_BUDGET", "3/1h"),
    ("controller.maxConcurrentWrites", "CONSULBIND_MAX_CONCURRENT_WRITES", "16"),
    ("controller.namespaceWriteLimit", "CONSULBIND_NAMESPACE_WRITE_LIMIT", "100/1m"),
    ("controller.dryRun", "CONSULBIND_DRY_RUN", "true"),
    ("controller.logFormat", "CONSULBIND_LOG_FORMAT", "text"),
    ("controller.debugAddr", "CONSULBIND_DEBUG_ADDR", "none"),
    ("controller.logLevel", "RUST_LOG", "consulbind=debug"),
    ("leaderElection.enabled", "CONSULBIND_LEADER_ELECT", "false"),
    ("leaderElection.leaseName", "CONSULBIND_LEASE_NAME", "other-lease"),
    ("leaderElection.leaseDuration", "CONSULBIND_LEASE_DURATION", "30s"),
    ("leaderElection.leaseRenew", "CONSULBIND_LEASE_RENEW", "10s"),
    ("sharding.enabled", "CONSULBIND_SHARDING", "true"),
    ("sharding.ring", "CONSULBIND_SHARD_RING", "other-ring"),
    ("namespaces", "CONSULBIND_NAMESPACES", "{team-a,team-b}"),
    ("metrics.port", "CONSULBIND_ADMIN_ADDR", "9090"),
];

/// With `write`, writes what the chart derives anew first; otherwise it must be current.
pub fn check(write: bool) -> Result<()> {
    let help = controller_help()?;
    for (path, derived) in derived(&help)? {
        if write {
            std::fs::write(&path, &derived)?;
        }
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        ensure!(written == derived, "{} is not current; run cargo xtask helm --write", path.display());
    }
    let helm = provision::helm()?;
    let defaults = controller_defaults(&help)?;
    let chart = repo_root().join(CHART);
    for sets in [&[][..], &["namespaces={team-a,team-b}"], &["podDisruptionBudget.enabled=true"]] {
        for strict in [false, true] {
            let mut lint = Command::new(&helm);
            lint.arg("lint").arg(&chart).args(strict.then_some("--strict"));
            run(lint.args(sets.iter().flat_map(|s| ["--set", s])))?;
        }
    }

    let same = |sets: &[&str], kustomization: &str| -> Result<()> {
        let chart = effect(&template(&helm, sets)?, &defaults)?;
        let built = capture(Command::new("kubectl").arg("kustomize").arg(repo_root().join(kustomization)))?;
        let kustomized = effect(&parse(&built)?, &defaults)?;
        same_objects(&chart, &kustomized)
            .with_context(|| format!("the chart with {sets:?} against {kustomization}"))?;
        println!("the chart with {sets:?} makes the objects of {kustomization}: {} of them", chart.len());
        Ok(())
    };
    // The kustomize manifests leave the tag to an overlay; the Namespace is Helm's to make.
    same(&["image.tag=latest"], "config")?;
    same(&["image.tag=latest", "namespaces={team-a,team-b}"], "config/overlays/namespaced")?;

    overrides(&helm, &defaults)?;
    probe(&helm)?;
    values_are_the_defaults(&defaults)?;
    refused(&helm)
}

/// Each file the chart derives, and what it must hold: the values' schema, and the alerts and
/// dashboard of config/monitoring/, which a chart cannot read from outside its own folder, and the
/// book's page of the values.
fn derived(help: &str) -> Result<Vec<(PathBuf, String)>> {
    let mut files = vec![(schema::path(), schema::generate()?), (page::path(), page::generate(help)?)];
    for name in ["prometheusrule.yaml", "consulbind-dashboard.json"] {
        let source = repo_root().join("config/monitoring").join(name);
        let text = std::fs::read_to_string(&source).with_context(|| format!("reading {}", source.display()))?;
        files.push((repo_root().join(CHART).join("files").join(name), text));
    }
    Ok(files)
}

/// The schema refuses an unknown value and a value of the wrong type, naming it.
fn refused(helm: &Path) -> Result<()> {
    for (set, named) in [("controller.dryRn=true", "dryRn"), ("consul.maxConnections=many", "maxConnections")] {
        for verb in ["lint", "template"] {
            let out = Command::new(helm).arg(verb).arg(repo_root().join(CHART)).args(["--set", set]).output()?;
            let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            ensure!(!out.status.success() && said.contains(named), "helm {verb} --set {set} was not refused:\n{said}");
        }
    }
    println!("values.schema.json refuses an unknown value and a mistyped one");
    Ok(())
}

/// `helm template` of the chart, CRDs included, as the release `consulbind` in consulbind-system.
fn template(helm: &Path, sets: &[&str]) -> Result<Vec<Value>> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", RELEASE]).arg(repo_root().join(CHART));
    // The `helm test` pod is checked on its own ([`probe`]).
    cmd.args(["--namespace", NAMESPACE, "--include-crds", "--skip-tests"]);
    parse(&capture(cmd.args(sets.iter().flat_map(|s| ["--set", *s])))?)
}

fn parse(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(doc)?;
        let value: Value = serde_json::to_value(value)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

type Objects = BTreeMap<String, Value>;

/// What the objects do, keyed by kind, namespace and name: labels and annotations dropped (Helm
/// adds its own; selectors follow them), each container's settings resolved from its ConfigMap
/// into one map with the controller's defaults left out, and rules sorted. The Namespace itself is
/// not compared: Helm makes it with `--create-namespace`.
fn effect(docs: &[Value], defaults: &BTreeMap<String, String>) -> Result<Objects> {
    let config_maps: BTreeMap<String, Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .map(|d| (d["metadata"]["name"].as_str().unwrap_or_default().to_owned(), d["data"].clone()))
        .collect();
    let mut objects = Objects::new();
    for doc in docs {
        let kind = doc["kind"].as_str().context("an object without a kind")?;
        if matches!(kind, "Namespace" | "ConfigMap") {
            continue;
        }
        let mut doc = doc.clone();
        strip(&mut doc);
        if let Some(containers) = doc.pointer_mut("/spec/template/spec/containers").and_then(Value::as_array_mut) {
            for container in containers {
                let env = settings(container, &config_maps, defaults)?;
                let container = container.as_object_mut().context("a container")?;
                container.remove("envFrom");
                container.insert("env".into(), env);
            }
        }
        if let Some(rules) = doc.get_mut("rules").and_then(Value::as_array_mut) {
            rules.sort_by_key(Value::to_string);
        }
        let m = &doc["metadata"];
        let key = format!("{kind} {}/{}", m["namespace"].as_str().unwrap_or(""), m["name"].as_str().unwrap_or(""));
        ensure!(objects.insert(key.clone(), doc).is_none(), "{key} twice");
    }
    Ok(objects)
}

/// Drops labels, annotations and the selectors made of them, and writes whole numbers as integers.
fn strip(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for key in ["labels", "annotations", "matchLabels", "selector"] {
                map.remove(key);
            }
            map.values_mut().for_each(strip);
        }
        Value::Array(items) => items.iter_mut().for_each(strip),
        // kustomize writes 100.0 as 100.
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0) {
                *value = json!(f as i64);
            }
        }
        _ => {}
    }
}

/// A container's environment, its ConfigMaps' entries and its own, less those that say what the
/// controller would do anyway.
fn settings(
    container: &Value,
    config_maps: &BTreeMap<String, Value>,
    defaults: &BTreeMap<String, String>,
) -> Result<Value> {
    let mut env = serde_json::Map::new();
    for from in container["envFrom"].as_array().into_iter().flatten() {
        let name = from["configMapRef"]["name"].as_str().context("envFrom other than a ConfigMap")?;
        let data = config_maps.get(name).with_context(|| format!("envFrom names ConfigMap {name}, not made"))?;
        env.extend(data.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
    }
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().context("an env entry without a name")?;
        let value = var.get("value").cloned().unwrap_or_else(|| json!({"valueFrom": var["valueFrom"]}));
        env.insert(name.to_owned(), value);
    }
    env.retain(|name, value| defaults.get(name).is_none_or(|default| value.as_str() != Some(default)));
    Ok(Value::Object(env))
}

fn same_objects(chart: &Objects, kustomized: &Objects) -> Result<()> {
    let (a, b): (BTreeSet<_>, BTreeSet<_>) = (chart.keys().collect(), kustomized.keys().collect());
    ensure!(a == b, "only in the chart: {:?}; only in kustomize: {:?}", a.difference(&b), b.difference(&a));
    for (key, object) in chart {
        if let Some(path) = first_difference(object, &kustomized[key], String::new()) {
            bail!(
                "{key} differs at {path}:\n  chart:     {}\n  kustomize: {}",
                object.pointer(&path).map_or("(none)".into(), Value::to_string),
                kustomized[key].pointer(&path).map_or("(none)".into(), Value::to_string),
            );
        }
    }
    Ok(())
}

/// The JSON pointer of the first place where `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => first_difference(p, q, format!("{at}/{k}")),
                _ => Some(format!("{at}/{k}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(p, q, format!("{at}/{i}")))
        }
        _ => (a != b).then_some(at),
    }
}

/// Each documented value reaches what it sets.
fn overrides(helm: &Path, defaults: &BTreeMap<String, String>) -> Result<()> {
    let find = |objects: &Objects, key: &str| objects.get(key).cloned().with_context(|| format!("no {key}"));
    let deployment = |objects: &Objects| find(objects, &format!("Deployment {NAMESPACE}/{RELEASE}"));
    let container = |objects: &Objects| {
        Ok::<_, anyhow::Error>(deployment(objects)?["spec"]["template"]["spec"]["containers"][0].clone())
    };
    let render = |sets: &[&str]| -> Result<Objects> {
        let mut lint = Command::new(helm);
        lint.args(["lint", "--strict"]).arg(repo_root().join(CHART));
        run(lint.args(sets.iter().flat_map(|s| ["--set", *s])))?;
        effect(&template(helm, sets)?, &BTreeMap::new())
    };

    for (value, var, sample) in FLAGS {
        let set = format!("{value}={sample}");
        let env = container(&render(&[&set])?)?["env"][var].clone();
        let expected = match *var {
            "CONSULBIND_NAMESPACES" => "team-a,team-b".to_owned(),
            "CONSULBIND_ADMIN_ADDR" => format!("0.0.0.0:{sample}"),
            _ => sample.replace("\\,", ","),
        };
        ensure!(env == json!(expected), "--set {set} gave {var}={env}, not {expected:?}");
        ensure!(defaults.contains_key(*var) || *var == "RUST_LOG", "{var} is not a flag of the controller");
    }

    // Rollout windows are a list, given to the controller as the JSON it takes.
    let windows = r#"[{"schedule":"0 22 * * 1-5","duration":"6h","timeZone":"Europe/Paris"}]"#;
    let mut cmd = Command::new(helm);
    cmd.args(["template", RELEASE]).arg(repo_root().join(CHART)).args(["--namespace", NAMESPACE]);
    let set = format!("controller.defaultRolloutWindows={windows}");
    let objects = effect(&parse(&capture(cmd.args(["--set-json", &set]))?)?, &BTreeMap::new())?;
    let env = container(&objects)?["env"]["CONSULBIND_DEFAULT_ROLLOUT_WINDOWS"].clone();
    let given: Option<Value> = env.as_str().and_then(|e| serde_json::from_str(e).ok());
    ensure!(
        given == serde_json::from_str(windows).ok(),
        "--set-json {set} gave CONSULBIND_DEFAULT_ROLLOUT_WINDOWS={env}"
    );
    ensure!(defaults.contains_key("CONSULBIND_DEFAULT_ROLLOUT_WINDOWS"), "no --default-rollout-windows");

    let objects = render(&[])?;
    let image = container(&objects)?["image"].clone();
    ensure!(
        image == json!(format!("consulbind:{}", app_version()?)),
        "the default image is {image}, not the appVersion's"
    );
    let objects = render(&[
        "image.repository=registry.example.com/consulbind",
        "image.tag=v9",
        "image.pullPolicy=Always",
        "imagePullSecrets={regcred}",
        "replicaCount=3",
        "resources.limits.memory=256Mi",
    ])?;
    let (d, c) = (deployment(&objects)?, container(&objects)?);
    ensure!(c["image"] == "registry.example.com/consulbind:v9" && c["imagePullPolicy"] == "Always", "image: {c}");
    ensure!(d["spec"]["template"]["spec"]["imagePullSecrets"] == json!([{"name": "regcred"}]), "imagePullSecrets");
    ensure!(d["spec"]["replicas"] == 3, "replicaCount");
    ensure!(c["resources"]["limits"]["memory"] == "256Mi", "resources");
    let security = &c["securityContext"];
    ensure!(
        security["runAsNonRoot"] == true
            && security["readOnlyRootFilesystem"] == true
            && security["allowPrivilegeEscalation"] == false
            && security["capabilities"]["drop"] == json!(["ALL"]),
        "the container's security context: {security}"
    );

    let objects = render(&["metrics.serviceMonitor.enabled=true", "podDisruptionBudget.enabled=true"])?;
    let monitor = find(&objects, &format!("ServiceMonitor {NAMESPACE}/{RELEASE}"))?;
    let mut kustomized = parse(&std::fs::read_to_string(repo_root().join("config/monitoring/servicemonitor.yaml"))?)?;
    strip(&mut kustomized[0]);
    ensure!(monitor["spec"] == kustomized[0]["spec"], "the ServiceMonitor differs from config/monitoring's");
    let budget = find(&objects, &format!("PodDisruptionBudget {NAMESPACE}/{RELEASE}"))?;
    ensure!(budget["spec"]["minAvailable"] == 1, "the PodDisruptionBudget: {budget}");
    ensure!(!render(&[])?.keys().any(|k| k.starts_with("ServiceMonitor") || k.starts_with("PodDisruptionBudget")));

    let grafana = shown(
        helm,
        "templates/monitoring.yaml",
        &["metrics.dashboard.enabled=true", "metrics.dashboard.namespace=grafana"],
    )?;
    ensure!(
        grafana["metadata"]["labels"]["grafana_dashboard"] == "1" && grafana["metadata"]["namespace"] == "grafana",
        "the dashboard's labels and namespace: {}",
        grafana["metadata"]
    );
    let json = std::fs::read_to_string(repo_root().join("config/monitoring/consulbind-dashboard.json"))?;
    ensure!(
        grafana["data"]["consulbind-dashboard.json"].as_str().map(str::trim_end) == Some(json.trim_end()),
        "the dashboard differs from config/monitoring's"
    );
    let rule = shown(
        helm,
        "templates/monitoring.yaml",
        &["metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=prom"],
    )?;
    ensure!(rule["metadata"]["labels"]["release"] == "prom", "prometheusRule.labels: {}", rule["metadata"]);
    let kustomized = parse(&std::fs::read_to_string(repo_root().join("config/monitoring/prometheusrule.yaml"))?)?;
    ensure!(rule["spec"] == kustomized[0]["spec"], "the PrometheusRule differs from config/monitoring's");
    render(&["metrics.prometheusRule.enabled=true", "metrics.dashboard.enabled=true"])?;
    ensure!(!render(&[])?.keys().any(|k| k.starts_with("PrometheusRule") || k.ends_with("-dashboard")));

    // The NetworkPolicy: the admin port in; DNS, the API server and Consul's port out.
    let policy = |sets: &[&str]| -> Result<Value> {
        let mut sets = sets.to_vec();
        sets.push("networkPolicy.enabled=true");
        render(&sets)?;
        shown(helm, "templates/networkpolicy.yaml", &sets)
    };
    let ports = |policy: &Value, rule: usize| -> Vec<Value> {
        let ports = policy["spec"]["egress"][rule]["ports"].as_array().cloned().unwrap_or_default();
        ports.iter().map(|p| p["port"].clone()).collect()
    };
    let p = policy(&[])?;
    ensure!(p["spec"]["ingress"] == json!([{"ports": [{"port": "admin", "protocol": "TCP"}]}]), "ingress: {p}");
    ensure!(ports(&p, 0) == [json!(53), json!(53)] && ports(&p, 1) == [json!(443), json!(6443)], "egress: {p}");
    ensure!(ports(&p, 2) == [json!(8500)], "Consul's port from consul.address: {p}");
    ensure!(ports(&policy(&["consul.address=https://consul.example.com"])?, 2) == [json!(443)], "https's port");
    let p = policy(&[
        "networkPolicy.consulPorts={8501}",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
        "networkPolicy.extraEgress[0].ports[0].port=3128",
    ])?;
    ensure!(ports(&p, 2) == [json!(8501)] && ports(&p, 3) == [json!(3128)], "consulPorts, extraEgress: {p}");
    ensure!(p["spec"]["ingress"][0]["from"][0]["namespaceSelector"].is_object(), "metricsFrom: {p}");
    ensure!(!render(&[])?.keys().any(|k| k.starts_with("NetworkPolicy")), "a NetworkPolicy by default");

    let objects = render(&["serviceAccount.create=false", "serviceAccount.name=platform-sa"])?;
    ensure!(!objects.keys().any(|k| k.starts_with("ServiceAccount")), "serviceAccount.create=false made one");
    ensure!(deployment(&objects)?["spec"]["template"]["spec"]["serviceAccountName"] == "platform-sa");
    let subjects = &find(&objects, &format!("ClusterRoleBinding /{RELEASE}"))?["subjects"][0]["name"];
    ensure!(subjects == "platform-sa", "the ClusterRoleBinding names {subjects}");
    let objects = render(&[])?;
    let view = find(&objects, &format!("ClusterRole /{RELEASE}-view"))?;
    let edit = find(&objects, &format!("ClusterRole /{RELEASE}-edit"))?;
    ensure!(view["rules"][0]["verbs"] == json!(["get", "list", "watch"]), "the view role: {view}");
    ensure!(edit["rules"][0]["verbs"].to_string().contains("delete"), "the edit role: {edit}");
    let labels = |role: &str| -> Result<Value> {
        let text = capture(
            Command::new(helm)
                .args(["template", RELEASE])
                .arg(repo_root().join(CHART))
                .args(["--show-only", "templates/aggregated-roles.yaml"]),
        )?;
        let docs = parse(&text)?;
        let doc = docs.iter().find(|d| d["metadata"]["name"] == role).with_context(|| format!("no {role}"))?;
        Ok(doc["metadata"]["labels"].clone())
    };
    ensure!(labels(&format!("{RELEASE}-view"))?["rbac.authorization.k8s.io/aggregate-to-view"] == "true");
    ensure!(labels(&format!("{RELEASE}-edit"))?["rbac.authorization.k8s.io/aggregate-to-admin"] == "true");
    let objects = render(&["rbac.aggregateToDefaultRoles=false"])?;
    ensure!(!objects.keys().any(|k| k.ends_with("-view") || k.ends_with("-edit")), "roles made without the value");
    let objects = render(&["rbac.create=false"])?;
    ensure!(!objects.keys().any(|k| k.contains("Role")), "rbac.create=false made {:?}", objects.keys());

    let objects = render(&["controller.checksumKeySecret=vault/checksums"])?;
    let key_role = find(&objects, &format!("Role vault/{RELEASE}-checksum-key"))?;
    ensure!(key_role["rules"].to_string().contains("\"checksums\""), "the checksum key's Role: {key_role}");
    let own = find(&objects, &format!("Role {NAMESPACE}/{RELEASE}-own-namespace"))?;
    ensure!(!own["rules"].to_string().contains("secrets"), "the own Role still grants Secrets: {own}");

    let objects = render(&["consul.tls.secret=consul-ca", "consul.tls.clientCertificate=true", "consul.tokenSecret="])?;
    let (d, c) = (deployment(&objects)?, container(&objects)?);
    ensure!(c["env"]["CONSUL_CACERT"] == "/var/run/secrets/consul-tls/ca.crt", "CONSUL_CACERT: {}", c["env"]);
    ensure!(c["env"]["CONSUL_CLIENT_KEY"] == "/var/run/secrets/consul-tls/tls.key", "CONSUL_CLIENT_KEY");
    ensure!(c["env"].get("CONSUL_HTTP_TOKEN_FILE").is_none(), "a token file without consul.tokenSecret");
    let volumes = d["spec"]["template"]["spec"]["volumes"].to_string();
    ensure!(volumes.contains("consul-ca") && !volumes.contains("consulbind-consul-token"), "volumes: {volumes}");

    let objects = render(&["extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://proxy:3128"])?;
    ensure!(container(&objects)?["env"]["HTTPS_PROXY"] == "http://proxy:3128", "extraEnv");
    let objects = render(&[
        "extraArgs[0]=--max-prefix-entries=5000",
        "extraVolumes[0].name=ca",
        "extraVolumes[0].configMap.name=corp-ca",
        "extraVolumeMounts[0].name=ca",
        "extraVolumeMounts[0].mountPath=/etc/corp-ca",
        "topologySpreadConstraints[0].maxSkew=1",
        "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    ])?;
    let (d, c) = (deployment(&objects)?, container(&objects)?);
    ensure!(c["args"] == json!(["--max-prefix-entries=5000"]), "extraArgs: {}", c["args"]);
    let pod = &d["spec"]["template"]["spec"];
    ensure!(pod["volumes"].to_string().contains("corp-ca"), "extraVolumes: {}", pod["volumes"]);
    ensure!(c["volumeMounts"].to_string().contains("/etc/corp-ca"), "extraVolumeMounts: {}", c["volumeMounts"]);
    ensure!(pod["topologySpreadConstraints"][0]["maxSkew"] == 1, "topologySpreadConstraints");
    ensure!(pod["volumes"].to_string().contains("consul-token"), "extraVolumes replaced the chart's own");
    let objects = render(&["metrics.port=9090"])?;
    let service = find(&objects, &format!("Service {NAMESPACE}/{RELEASE}-metrics"))?;
    ensure!(service["spec"]["ports"][0]["port"] == 9090, "the metrics Service: {service}");

    // The CRD is Helm's to install once and never to delete: it is in crds/, not a template.
    let mut cmd = Command::new(helm);
    cmd.args(["template", RELEASE]).arg(repo_root().join(CHART));
    let templates = capture(&mut cmd)?;
    ensure!(
        !templates.contains("kind: CustomResourceDefinition"),
        "a template makes the CRD, which `helm uninstall` would delete"
    );
    println!("every value of the chart reaches what it sets ({} flags)", FLAGS.len());
    Ok(())
}

/// The `helm test` pod runs the controller's image as `consulbind probe` against the metrics
/// Service, as the controller's ServiceAccount; no Service or NetworkPolicy takes it for the
/// controller, and a policy that limits who reaches the admin port lets it in.
fn probe(helm: &Path) -> Result<()> {
    let pod = shown(helm, "templates/tests/probe.yaml", &["metrics.port=9090"])?;
    let deployment = shown(helm, "templates/deployment.yaml", &[])?;
    let controller = &deployment["spec"]["template"]["spec"];
    ensure!(pod["metadata"]["annotations"]["helm.sh/hook"] == "test", "the probe is no test hook: {pod}");
    let container = &pod["spec"]["containers"][0];
    let url = format!("--url=http://{RELEASE}-metrics.{NAMESPACE}.svc:9090/readyz");
    ensure!(container["args"] == json!(["probe", url]), "the probe's args: {}", container["args"]);
    ensure!(container["image"] == controller["containers"][0]["image"], "the probe's image: {}", container["image"]);
    ensure!(pod["spec"]["serviceAccountName"] == controller["serviceAccountName"], "the probe's account");
    let labels = pod["metadata"]["labels"].as_object().context("the probe's labels")?;
    let service = shown(helm, "templates/service.yaml", &[])?;
    let selects =
        |selector: &Value| selector.as_object().is_some_and(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)));
    ensure!(!selects(&service["spec"]["selector"]), "the metrics Service selects the probe pod");
    let policy = shown(
        helm,
        "templates/networkpolicy.yaml",
        &["networkPolicy.enabled=true", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring"],
    )?;
    ensure!(!selects(&policy["spec"]["podSelector"]["matchLabels"]), "the NetworkPolicy selects the probe pod");
    let from = policy["spec"]["ingress"][0]["from"].as_array().cloned().unwrap_or_default();
    ensure!(from.iter().any(|peer| selects(&peer["podSelector"]["matchLabels"])), "the policy keeps the probe out");
    let without = Command::new(helm)
        .args(["template", RELEASE])
        .arg(repo_root().join(CHART))
        .args(["--show-only", "templates/tests/probe.yaml", "--set", "metrics.service.enabled=false"])
        .output()?;
    ensure!(!without.status.success(), "a probe without the metrics Service to ask");
    println!("the helm test pod probes the controller through its Service");
    Ok(())
}

/// The first object `helm template` makes of one template, with `sets`.
fn shown(helm: &Path, path: &str, sets: &[&str]) -> Result<Value> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", RELEASE]).arg(repo_root().join(CHART)).args(["--namespace", NAMESPACE]);
    let text = capture(cmd.args(["--show-only", path]).args(sets.iter().flat_map(|s| ["--set", *s])))?;
    parse(&text)?.into_iter().next().with_context(|| format!("{path} made nothing with {sets:?}"))
}

/// values.yaml's defaults are the controller's: each flag the chart sets by default, set to
/// what the controller would take anyway, or to what config/ sets.
fn values_are_the_defaults(defaults: &BTreeMap<String, String>) -> Result<()> {
    let values: Value = serde_yaml::from_str(&std::fs::read_to_string(repo_root().join(CHART).join("values.yaml"))?)?;
    // Where the chart, like config/, differs from the controller on purpose.
    let chosen = [
        ("CONSUL_HTTP_ADDR", "http://consul-server.consul.svc:8500"),
        ("CONSULBIND_LOG_FORMAT", "json"),
        ("CONSULBIND_LEADER_ELECT", "true"),
    ];
    for (value, var, _) in FLAGS {
        let pointer = format!("/{}", value.replace('.', "/"));
        let given = match values.pointer(&pointer).with_context(|| format!("values.yaml has no {value}"))? {
            Value::String(s) => s.clone(),
            Value::Array(a) if a.is_empty() => String::new(),
            other => other.to_string(),
        };
        let given = match *var {
            "CONSULBIND_ADMIN_ADDR" => format!("0.0.0.0:{given}"),
            _ => given,
        };
        let expected = match chosen.iter().find(|(v, _)| v == var) {
            Some((_, value)) => value.to_string(),
            None => defaults.get(*var).cloned().unwrap_or_default(),
        };
        ensure!(given == expected, "values.yaml sets {value} to {given:?}; the controller's default is {expected:?}");
    }
    let windows = values.pointer("/controller/defaultRolloutWindows");
    ensure!(windows == Some(&json!([])), "values.yaml sets controller.defaultRolloutWindows to {windows:?}, not []");
    println!("values.yaml's defaults are the controller's");
    Ok(())
}

/// `consulbind -h`, whose short help keeps each flag's environment variable and default on one line.
fn controller_help() -> Result<String> {
    run(cargo().args(["build", "--quiet", "--package", "consulbind", "--bin", "consulbind"]))?;
    let binary: PathBuf = repo_root().join("target/debug/consulbind");
    capture(Command::new(binary).arg("-h"))
}

/// Each environment variable of the controller and its default, from its help.
fn controller_defaults(help: &str) -> Result<BTreeMap<String, String>> {
    let mut defaults = BTreeMap::new();
    for line in help.lines() {
        let Some((_, env)) = line.split_once("[env: ") else { continue };
        let name = env.split(['=', ']']).next().unwrap_or_default().to_owned();
        let default = line.split_once("[default: ").map(|(_, d)| d.split(']').next().unwrap_or_default().to_owned());
        defaults.insert(name, default.unwrap_or_default());
    }
    ensure!(defaults.len() > 20, "`consulbind --help` lists {} environment variables", defaults.len());
    Ok(defaults)
}

fn app_version() -> Result<String> {
    let chart: Value = serde_yaml::from_str(&std::fs::read_to_string(repo_root().join(CHART).join("Chart.yaml"))?)?;
    chart["appVersion"].as_str().map(str::to_owned).context("Chart.yaml has no appVersion")
}
