//! `cargo xtask demo`: the product's main job on real servers, for a newcomer.

use std::{
    path::Path,
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    common::repo_root,
    env::Env,
    env::provision,
    process::{self, Daemon},
};

const NAMESPACE: &str = "default";
const CONFIG_KEY: &str = "demo/web/config.json";
const FEATURE_KEY: &str = "demo/web/features/dark-mode";
const ADMIN_ADDR: &str = "127.0.0.1:18080";
/// The demo binding's quiet period: the example's 2 s, widened so that the claim "two changes,
/// one rollout" does not hang on how fast a fresh `kubectl` starts on a loaded machine.
const QUIET: Duration = Duration::from_secs(10);

pub fn run(env: &Env) -> Result<()> {
    env.up()?;
    let vars = env.vars()?;
    let consul_addr =
        vars.iter().find(|(k, _)| *k == "CONSUL_HTTP_ADDR").map(|(_, v)| v.clone()).context("CONSUL_HTTP_ADDR")?;
    let tools = provision::tools()?;
    let kubectl = |args: &[&str]| {
        let mut cmd = Command::new(&tools.kubectl);
        cmd.args(["-n", NAMESPACE]).args(args).envs(vars.iter().map(|(k, v)| (*k, v)));
        cmd
    };
    let consul_put = |key: &str, value: &str| {
        process::run(Command::new(&tools.consul).args(["kv", "put", &format!("-http-addr={consul_addr}"), key, value]))
    };

    step("building the controller");
    process::run(Command::new(env!("CARGO")).current_dir(repo_root()).args(["build", "--quiet", "-p", "consulbind"]))?;
    let binary = repo_root().join("target/debug/consulbind");

    step("writing the first configuration to Consul and applying examples/");
    consul_put(CONFIG_KEY, r#"{"pool": 10, "color": "blue"}"#)?;
    consul_put(FEATURE_KEY, "on")?;
    let examples = repo_root().join("examples");
    for file in ["deployment.yaml", "consulbinding.yaml"] {
        // The app reads Consul where this environment's agent listens (its ports may be offset).
        let text = std::fs::read_to_string(examples.join(file))?.replace("http://127.0.0.1:18500", &consul_addr);
        process::with_input(&mut kubectl(&["apply", "--server-side", "-f", "-"]), &text)?;
    }
    let quiet = format!(r#"{{"spec": {{"rollout": {{"quietPeriod": "{}s"}}}}}}"#, QUIET.as_secs());
    process::run(&mut kubectl(&["patch", "consulbinding", "web-config", "--type=merge", "-p", &quiet]))?;

    step("starting the controller");
    let controller = env.daemon("controller");
    controller.stop()?;
    controller.ensure_started(
        Command::new(&binary)
            .args([
                &format!("--namespaces={NAMESPACE}"),
                &format!("--admin-addr={ADMIN_ADDR}"),
                // What the example binding reads, and nothing else, with the default token.
                "--default-token-prefixes=demo/",
            ])
            .envs(vars.iter().map(|(k, v)| (*k, v))),
    )?;
    let status_has = |field: &str| {
        let jsonpath = format!("jsonpath={{.status.{field}}}");
        process::capture(&mut kubectl(&["get", "consulbinding", "web-config", "-o", &jsonpath]))
            .is_ok_and(|value| !value.trim().is_empty())
    };
    wait("the binding to record its baseline", Duration::from_secs(60), &controller, || status_has("appliedChecksum"))?;
    show(kubectl(&["get", "consulbindings"]))?;
    wait("the application's pods to be Ready", Duration::from_secs(120), &controller, || {
        app_reports(&kubectl).is_ok_and(|reports| reports.len() == REPLICAS)
    })?;
    show(kubectl(&["get", "pods", "-l", "app=web"]))?;
    let reports_before = app_reports(&kubectl)?;
    // A rollout is a new generation of the Deployment (a ReplicaSet may be reused).
    let generation = || -> Result<i64> {
        let text =
            process::capture(&mut kubectl(&["get", "deployment", "web", "-o", "jsonpath={.metadata.generation}"]))?;
        text.trim().parse().with_context(|| format!("the Deployment's generation: {text:?}"))
    };
    let before = generation()?;

    step(&format!("changing {CONFIG_KEY} in Consul and the ConfigMap web-settings, half a second apart"));
    // Values no earlier run wrote, so that a second demo on the same servers rolls as well: the
    // controller rightly rolls nothing when the workload already runs with this content.
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let first = Instant::now();
    consul_put(CONFIG_KEY, &format!(r#"{{"pool": 20, "color": "green", "written": {stamp}}}"#))?;
    sleep(Duration::from_millis(500));
    let settings = format!(r#"{{"data": {{"log-level": "debug", "written": "{stamp}"}}}}"#);
    process::run(&mut kubectl(&["patch", "configmap", "web-settings", "--type=merge", "-p", &settings]))?;
    // From the start of the Consul write to the API server's answer to the patch: at most the
    // time between the two changes.
    let apart = first.elapsed();
    // Within the quiet period the two are one change, one rollout; past it, each is its own.
    let expected = if apart < QUIET { 1 } else { 2 };
    println!("the two changes were made within {:.1} s of each other", apart.as_secs_f64());
    wait("the rollout (a new generation of the Deployment)", QUIET + Duration::from_secs(60), &controller, || {
        generation().is_ok_and(|g| g >= before + expected)
    })?;
    wait("the binding to report it", Duration::from_secs(30), &controller, || status_has("lastChangeTime"))?;
    // A few seconds more: nothing else rolls.
    sleep(QUIET.min(Duration::from_secs(4)));
    let rollouts = generation()? - before;
    ensure!(rollouts == expected, "the two changes made {rollouts} rollouts, not {expected}");
    match expected {
        1 => println!("one rollout for both changes: they came within the {} s quiet period", QUIET.as_secs()),
        _ => println!(
            "two rollouts: this machine took {:.1} s to make the two changes, past the {} s quiet period",
            apart.as_secs_f64(),
            QUIET.as_secs()
        ),
    }

    // The new pods read the new content at start-up: every Ready pod reports it.
    let written = format!("\"written\": {stamp}");
    wait("every pod to run the new configuration", Duration::from_secs(120), &controller, || {
        app_reports(&kubectl).is_ok_and(|reports| {
            reports.len() == REPLICAS && reports.iter().all(|(_, report)| report.contains(&written))
        })
    })?;
    let took = first.elapsed();

    step("the rollout");
    show(kubectl(&["get", "consulbindings", "-o", "wide"]))?;
    show(kubectl(&["get", "replicasets", "-l", "app=web"]))?;
    show(kubectl(&["get", "pods", "-l", "app=web"]))?;
    show(kubectl(&["get", "events", "--field-selector", "reason=RolledOut"]))?;

    step("what the application read at start-up (kubectl exec POD -- /demo-app report)");
    for (when, reports) in [("before the change", &reports_before), ("after it", &app_reports(&kubectl)?)] {
        println!("{when}:");
        for (pod, report) in reports {
            for line in report.lines() {
                println!("  {pod:<24} {line}");
            }
        }
    }
    println!(
        "\nfrom the Consul write to the last new pod Ready and reporting the new content: {:.1} s, \
         the binding's {} s quiet period included",
        took.as_secs_f64(),
        QUIET.as_secs()
    );

    let env_file = env.env_file();
    println!(
        "\nEverything is still running. Try more by hand:\n\
         \n    source {env}\
         \n    {consul} kv put {CONFIG_KEY} '{{\"pool\": 30}}'\
         \n    kubectl patch configmap web-settings --type=merge -p '{{\"data\": {{\"log-level\": \"warn\"}}}}'\
         \n    kubectl get consulbindings -w\
         \n    kubectl describe consulbinding web-config\
         \n    kubectl get pods -l app=web\
         \n    kubectl logs deploy/web\
         \n    curl -s http://{ADMIN_ADDR}/metrics | grep consulbind_\
         \n    tail -f {log}\
         \n\nTear it all down (controller included):\n\n    cargo xtask env down\n",
        env = shown(&env_file),
        consul = tools.consul.display(),
        log = shown(&controller.log()),
    );
    Ok(())
}

/// The Deployment's replicas, as in examples/deployment.yaml.
const REPLICAS: usize = 2;

/// Each Ready pod of `web` that is not on its way out, with what it says it read.
fn app_reports(kubectl: &impl Fn(&[&str]) -> Command) -> Result<Vec<(String, String)>> {
    let pods: serde_json::Value =
        serde_json::from_str(&process::capture(&mut kubectl(&["get", "pods", "-l", "app=web", "-o", "json"]))?)?;
    let ready = |pod: &&serde_json::Value| {
        pod["metadata"]["deletionTimestamp"].is_null()
            && pod["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    };
    let mut reports = Vec::new();
    for pod in pods["items"].as_array().into_iter().flatten().filter(ready) {
        let name = pod["metadata"]["name"].as_str().context("a pod's name")?.to_owned();
        let report = process::capture(&mut kubectl(&["exec", &name, "--", "/demo-app", "report"]))?;
        reports.push((name, report));
    }
    Ok(reports)
}

fn step(what: &str) {
    println!("\n==> {what}");
}

fn show(mut cmd: Command) -> Result<()> {
    println!("{}", process::capture(&mut cmd)?.trim_end());
    Ok(())
}

fn wait(what: &str, timeout: Duration, controller: &Daemon, done: impl Fn() -> bool) -> Result<()> {
    println!("waiting for {what}...");
    let start = Instant::now();
    while start.elapsed() < timeout {
        if done() {
            return Ok(());
        }
        sleep(Duration::from_millis(500));
    }
    bail!(
        "timed out waiting for {what}; the controller log ({}) ends with:\n{}",
        controller.log().display(),
        process::tail(&controller.log(), 20)
    )
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo_root()).unwrap_or(path).display().to_string()
}
