//! Rollouts judged on pods that really run: the bed's node runs the demo app
//! (`examples/demo-app`), which reads its Consul key once, at start-up, refuses content it cannot
//! parse (its pods crash-loop), and says what it read (`/demo-app report`). Its pods share the
//! node's network, so they reach the bed's Consul on loopback, and tolerate the node's taint.

use std::time::Duration;

use consulbind_api::conditions::{self, reason};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams},
};
use serde_json::{Value, json};

use crate::support::{self, Scene, wait_for};
use crate::waves::canary_first;

/// How long pods take to start, be Ready and go, with room for a loaded machine.
const PODS: Duration = Duration::from_secs(150);

/// A Deployment of the demo app reading `key`, rolled one new pod at a time while every old one
/// serves (maxSurge 1, maxUnavailable 0), as most applications are.
fn app(name: &str, replicas: i32, track: &str, key: &str) -> Value {
    let consul = std::env::var("CONSUL_HTTP_ADDR").expect("CONSUL_HTTP_ADDR");
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name, "track": track}},
        "spec": {"replicas": replicas, "progressDeadlineSeconds": 20,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "hostNetwork": true,
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 5,
                "tolerations": [{"key": "consulbind.dev/local-images", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "app", "image": "consulbind.local/demo-app:dev", "imagePullPolicy": "Never",
                    "env": [{"name": "CONSUL_HTTP_ADDR", "value": consul}, {"name": "DEMO_KEYS", "value": key}],
                    "readinessProbe": {"exec": {"command": ["/demo-app", "ready"]}, "periodSeconds": 1}}]}}}})
}

/// The app as a StatefulSet or a DaemonSet, with that kind's default update strategy.
fn app_as(kind: &str, name: &str, replicas: i32, key: &str) -> Value {
    let mut workload = app(name, replicas, kind, key);
    workload["kind"] = json!(kind);
    let spec = workload["spec"].as_object_mut().unwrap();
    spec.remove("strategy");
    spec.remove("progressDeadlineSeconds");
    match kind {
        "DaemonSet" => drop(spec.remove("replicas")),
        _ => drop(spec.insert("serviceName".into(), json!(name))),
    }
    workload
}

/// A pod of the app: its name, uid, whether it is Ready, and how often its container restarted.
struct Running {
    name: String,
    uid: String,
    ready: bool,
    restarts: i32,
}

impl Scene {
    /// The pods of `app` not on their way out.
    async fn pods(&self, app: &str) -> Vec<Running> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let pods = api.list(&ListParams::default().labels(&format!("app={app}"))).await.unwrap().items;
        let live = pods.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none());
        live.map(|p| {
            let status = p.status.unwrap_or_default();
            let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
            let restarts = status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
            Running { name: p.metadata.name.unwrap(), uid: p.metadata.uid.unwrap(), ready, restarts }
        })
        .collect()
    }

    /// What each pod of `app` read at start-up, by `kubectl exec`; `None` while a pod is not
    /// Ready or cannot be asked.
    async fn reports(&self, app: &str) -> Option<Vec<String>> {
        let mut reports = Vec::new();
        for pod in self.pods(app).await {
            if !pod.ready {
                return None;
            }
            let out = std::process::Command::new("kubectl")
                .args(["-n", &self.ns, "exec", &pod.name, "--", "/demo-app", "report"])
                .output()
                .ok()?;
            reports.push(String::from_utf8(out.stdout).ok().filter(|_| out.status.success())?);
        }
        Some(reports)
    }

    /// Waits until `app` has `replicas` pods, all Ready, and each read `value` from `key`.
    async fn wait_running(&self, app: &str, replicas: usize, key: &str, value: &str) {
        let line = format!("read consul:{key} = {value}\n");
        let check = || async {
            let reports = self.reports(app).await.unwrap_or_default();
            Ok(reports.len() == replicas && reports.iter().all(|r| r == &line))
        };
        let what = format!("{replicas} Ready pods of {app} that read {value}");
        if let Err(e) = wait_for(&what, PODS, check).await {
            panic!("{e}\n{}\n{}", self.kubectl(&["get", "pods", "-o", "wide"]), self.log());
        }
    }

    /// `metadata.generation` of a workload of any kind.
    async fn generation_of(&self, kind: &str, name: &str) -> i64 {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", kind));
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &resource);
        api.get(name).await.unwrap().metadata.generation.unwrap_or_default()
    }

    /// What the pod `pod` read at start-up.
    fn report_of(&self, pod: &str) -> String {
        self.kubectl(&["exec", pod, "--", "/demo-app", "report"])
    }

    async fn uids(&self, app: &str) -> Vec<String> {
        let mut uids: Vec<String> = self.pods(app).await.into_iter().map(|p| p.uid).collect();
        uids.sort();
        uids
    }

    /// A canary and `web` of the app, both running `value` of `key`, and the binding `cfg`
    /// staging `rollout` over them, baselined. Returns `web`'s generation.
    async fn canary_and_web(&self, key: &str, value: &str, (canary, web): (i32, i32), rollout: Value) -> i64 {
        self.put(key, value).await;
        self.apply(app("canary", canary, "canary", key)).await.unwrap();
        self.apply(app("web", web, "main", key)).await.unwrap();
        self.wait_running("canary", canary as usize, key, value).await;
        self.wait_running("web", web as usize, key, value).await;
        self.binding("cfg", crate::waves::staged(key, rollout)).await;
        self.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
        self.generation("web").await
    }

    /// Warning events about `name`: reason and note.
    async fn warnings_for(&self, name: &str) -> Vec<(String, String)> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.client.clone(), &self.ns);
        let events = api.list(&ListParams::default()).await.unwrap().items.into_iter();
        let about = events.filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name));
        about
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }
}

/// One wave over every Deployment: the binding reports its targets up to date only once they
/// are healthy.
fn one_wave(key: &str) -> Value {
    json!({"keys": [{"key": key}], "targets": [{"kind": "Deployment", "selector": {"matchLabels": {}}}],
        "rollout": {"quietPeriod": "0s", "waves": [{}]}})
}

#[tokio::test]
async fn a_change_rolls_three_pods_once_and_when_the_binding_is_up_to_date_every_pod_read_it() {
    let Some(s) = Scene::new("pods-rolling").await else { return };
    let key = s.key("config.json");
    s.put(&key, r#"{"v": 1}"#).await;
    s.apply(app("web", 3, "main", &key)).await.unwrap();
    s.wait_running("web", 3, &key, r#"{"v": 1}"#).await;
    s.binding("cfg", one_wave(&key)).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let (generation, before) = (s.generation("web").await, s.uids("web").await);

    s.put(&key, r#"{"v": 2}"#).await;
    let check = || async {
        let binding = s.get_binding("cfg").await;
        let ready = support::ready(&binding);
        Ok(ready.is_some_and(|r| r.status == "True" && r.reason == reason::UP_TO_DATE))
    };
    wait_for("the binding to say its target is up to date", PODS, check).await.unwrap();
    // At that instant: every pod not on its way out is new and Ready, and read the new content.
    let reports = s.reports("web").await.expect("every pod Ready");
    assert_eq!(reports, vec![format!("read consul:{key} = {{\"v\": 2}}\n"); 3]);
    let after = s.uids("web").await;
    assert!(after.iter().all(|uid| !before.contains(uid)), "an old pod is left: {before:?} {after:?}");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, generation + 1, "one rollout\n{}", s.log());
    s.finish().await;
}

/// Content the app cannot parse reaches the canary alone: its new pods crash-loop while its old
/// ones serve on, the waves halt with a Warning naming the key, the other workload's pods are
/// never touched, and the revert heals the canary with one more rollout.
#[tokio::test]
async fn bad_content_crash_loops_the_canary_halts_the_waves_and_the_revert_heals_it() {
    let Some(s) = Scene::new("pods-bad").await else { return };
    let key = s.key("config.json");
    let good = r#"{"pool": 1}"#;
    let web = s.canary_and_web(&key, good, (2, 2), canary_first("0s")).await;
    let (canary, web_pods) = (s.generation("canary").await, s.uids("web").await);

    s.put(&key, r#"{"pool": "#).await;
    let halted = s.wait_message("cfg", conditions::READY, "False", reason::ROLLOUT_HALTED).await;
    assert!(halted.contains("Deployment canary ProgressDeadlineExceeded"), "{halted}");
    let named = || async {
        let warnings = s.warnings_for("cfg").await;
        Ok(warnings.iter().any(|(r, note)| r == reason::ROLLOUT_HALTED && note.contains(&key)))
    };
    wait_for("a Warning naming the key", PODS, named).await.unwrap();
    let crashed = s.pods("canary").await.into_iter().filter(|p| !p.ready && p.restarts > 0).count();
    assert!(crashed >= 1, "the canary's new pod crash-loops\n{}", s.kubectl(&["get", "pods"]));
    // Its old pods serve on with the content they read.
    let old_serving = s.pods("canary").await.into_iter().filter(|p| p.ready).count();
    assert_eq!(old_serving, 2, "{}", s.kubectl(&["get", "pods"]));
    assert_eq!(s.generation("web").await, web, "the rest is not rolled for the bad content");
    assert_eq!(s.uids("web").await, web_pods);

    s.put(&key, good).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_running("canary", 2, &key, good).await;
    assert_eq!(s.generation("canary").await, canary + 2, "the bad content's rollout and the revert's");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, web, "the rest never rolled\n{}", s.log());
    assert_eq!(s.uids("web").await, web_pods, "the rest's pods never restarted");
    s.wait_running("web", 2, &key, good).await;
    s.finish().await;
}

/// Content the canary's pods take and that goes bad during the canary's pause (it expires, as a
/// certificate would): the pods crash, and the next wave waits past the pause.
#[tokio::test]
async fn a_canary_whose_pods_crash_during_its_pause_holds_the_next_wave() {
    let Some(s) = Scene::new("pods-sour").await else { return };
    let key = s.key("config.json");
    let good = r#"{"pool": 1}"#;
    let web = s.canary_and_web(&key, good, (2, 1), canary_first("30s")).await;

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let expiring = format!(r#"{{"pool": 2, "expiresAt": {}}}"#, now + 20);
    s.put(&key, &expiring).await;
    // Taken: healthy, the canary's pause begins.
    s.wait_running("canary", 2, &key, &expiring).await;
    let pausing = s.wait_message("cfg", conditions::READY, "False", reason::ROLLOUT_IN_PROGRESS).await;
    // Expired: the pods crash, and every restart fails.
    let crashed = || async { Ok(s.pods("canary").await.iter().any(|p| !p.ready && p.restarts > 0)) };
    wait_for("the canary's pods to crash", PODS, crashed).await.unwrap();
    // Past the pause, with room: the next wave still waits.
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(s.generation("web").await, web, "the next wave rolled on a crashing canary ({pausing})\n{}", s.log());
    let held = support::ready(&s.get_binding("cfg").await).unwrap();
    assert_eq!(held.status, "False", "{held:?}");
    assert!(held.message.contains("canary"), "{}", held.message);

    s.put(&key, good).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_running("canary", 2, &key, good).await;
    assert_eq!(s.generation("web").await, web, "the rest never took the content that expired");
    s.finish().await;
}

/// A controller stopped while a rollout's new pods start, and started again: no second rollout,
/// and the rollout goes on to every pod reading the new content.
#[tokio::test]
async fn a_restart_while_the_new_pods_start_rolls_nothing_more() {
    let Some(mut s) = Scene::new("pods-restart").await else { return };
    let key = s.key("config.json");
    s.put(&key, r#"{"v": 1}"#).await;
    s.apply(app("web", 3, "main", &key)).await.unwrap();
    s.wait_running("web", 3, &key, r#"{"v": 1}"#).await;
    s.binding("cfg", one_wave(&key)).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let generation = s.generation("web").await;

    s.put(&key, r#"{"v": 2}"#).await;
    let rolled = || async { Ok(s.generation("web").await > generation) };
    wait_for("the rollout", PODS, rolled).await.unwrap();
    s.stop_controller().await;
    let starting = s.pods("web").await.iter().filter(|p| !p.ready).count();
    s.start_controller(&[]).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.wait_running("web", 3, &key, r#"{"v": 2}"#).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, generation + 1, "one rollout ({starting} pods were starting)\n{}", s.log());
    s.finish().await;
}

/// A pod of an image the node does not hold fails to pull at once, through the loopback proxy
/// that stands for every registry: nothing leaves the machine.
#[tokio::test]
async fn a_pod_of_an_image_not_on_the_node_fails_without_reaching_a_registry() {
    let Some(s) = Scene::without_controller("pods-pull").await else { return };
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pull"}, "spec": {
        "hostNetwork": true, "automountServiceAccountToken": false,
        "tolerations": [{"key": "consulbind.dev/local-images", "operator": "Exists"}],
        "containers": [{"name": "app", "image": "registry.invalid/nothing:1"}]}});
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    api.create(&Default::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
    let message = || async {
        let pod = api.get("pull").await?;
        let waiting = pod.status.and_then(|s| s.container_statuses).and_then(|c| c[0].state.clone()?.waiting);
        anyhow::Ok(waiting.and_then(|w| w.message).unwrap_or_default())
    };
    let pulled = || async { Ok(!message().await?.is_empty()) };
    wait_for("the pull to fail", PODS, pulled).await.unwrap();
    let message = message().await.unwrap();
    assert!(message.contains("proxyconnect tcp: dial tcp 127.0.0.1:1: connect: connection refused"), "{message}");
    s.finish().await;
}

/// A StatefulSet's ordered update and a DaemonSet's pod on the node, each in a wave of its own:
/// the DaemonSet rolls only once every pod of the StatefulSet runs the new content, and the
/// binding is up to date only once the DaemonSet's new pod does. A partitioned StatefulSet
/// updates the ordinals above its partition and counts healthy with the rest left as they are.
#[tokio::test]
async fn a_stateful_set_then_a_daemon_set_each_healthy_once_its_new_pods_are_ready() {
    let Some(s) = Scene::new("pods-kinds").await else { return };
    let key = s.key("config.json");
    let (v1, v2) = (r#"{"v": 1}"#, r#"{"v": 2}"#);
    s.put(&key, v1).await;
    s.apply(app_as("StatefulSet", "db", 2, &key)).await.unwrap();
    let mut partitioned = app_as("StatefulSet", "cache", 2, &key);
    partitioned["spec"]["updateStrategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}});
    s.apply(partitioned).await.unwrap();
    s.apply(app_as("DaemonSet", "agent", 0, &key)).await.unwrap();
    for (app, replicas) in [("db", 2), ("cache", 2), ("agent", 1)] {
        s.wait_running(app, replicas, &key, v1).await;
    }
    let spec = json!({"keys": [{"key": key}],
        "targets": [{"kind": "StatefulSet", "selector": {"matchLabels": {}}},
            {"kind": "DaemonSet", "name": "agent"}],
        "rollout": {"quietPeriod": "0s", "waves": [{"kind": "StatefulSet"}, {"kind": "DaemonSet"}]}});
    s.binding("cfg", spec).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let agent = s.generation_of("DaemonSet", "agent").await;

    s.put(&key, v2).await;
    let rolled = || async { Ok(s.generation_of("DaemonSet", "agent").await > agent) };
    wait_for("the DaemonSet's wave", PODS, rolled).await.unwrap();
    // The first wave was healthy: both of db's pods, ordinal by ordinal, run the new content.
    let line = |value: &str| format!("read consul:{key} = {value}\n");
    assert_eq!(s.report_of("db-0"), line(v2));
    assert_eq!(s.report_of("db-1"), line(v2));
    assert_eq!((s.report_of("cache-0"), s.report_of("cache-1")), (line(v1), line(v2)), "above the partition only");
    let check = || async {
        let ready = support::ready(&s.get_binding("cfg").await);
        Ok(ready.is_some_and(|r| r.status == "True" && r.reason == reason::UP_TO_DATE))
    };
    wait_for("the binding to be up to date", PODS, check).await.unwrap();
    let reports = s.reports("agent").await.expect("the DaemonSet's pod Ready");
    assert_eq!(reports, [line(v2)], "up to date once the DaemonSet's new pod runs");
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation_of("DaemonSet", "agent").await, agent + 1, "one rollout\n{}", s.log());
    s.finish().await;
}

/// A StatefulSet that updates its pods only when they are deleted: once stamped it lets the
/// next wave through, and the binding says its pods still run the old content until someone
/// deletes them, not that it is up to date. Deleted, each comes back with the new content.
#[tokio::test]
async fn an_on_delete_stateful_set_says_its_pods_await_deletion_until_they_are_deleted() {
    let Some(s) = Scene::new("pods-ondelete").await else { return };
    let key = s.key("config.json");
    let (v1, v2) = (r#"{"v": 1}"#, r#"{"v": 2}"#);
    s.put(&key, v1).await;
    let mut db = app_as("StatefulSet", "db", 2, &key);
    db["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
    s.apply(db).await.unwrap();
    s.apply(app("web", 1, "main", &key)).await.unwrap();
    s.wait_running("db", 2, &key, v1).await;
    s.wait_running("web", 1, &key, v1).await;
    let spec = json!({"keys": [{"key": key}],
        "targets": [{"kind": "StatefulSet", "name": "db"}, {"kind": "Deployment", "name": "web"}],
        "rollout": {"quietPeriod": "0s", "waves": [{"kind": "StatefulSet"}, {}]}});
    s.binding("cfg", spec).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;

    s.put(&key, v2).await;
    let message = s.wait_message("cfg", conditions::READY, "True", reason::PODS_AWAIT_DELETION).await;
    assert!(message.contains("StatefulSet db: 0 of 2 pods run the current template"), "{message}");
    s.wait_running("web", 1, &key, v2).await;
    let line = |value: &str| format!("read consul:{key} = {value}\n");
    assert_eq!((s.report_of("db-0"), s.report_of("db-1")), (line(v1), line(v1)), "nothing restarted them");

    s.kubectl(&["delete", "pod", "db-0", "db-1"]);
    s.wait_running("db", 2, &key, v2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

/// A canary someone paused (`kubectl rollout pause`) takes its stamp and rolls no pod: the
/// binding says it is paused and waits past `healthTimeout` without calling it a failure; once
/// resumed, its pods take the content and the rest follow.
#[tokio::test]
async fn a_paused_canary_says_so_holds_the_rest_past_the_health_timeout_and_goes_on_once_resumed() {
    let Some(s) = Scene::new("pods-paused").await else { return };
    let key = s.key("config.json");
    let (v1, v2) = (r#"{"v": 1}"#, r#"{"v": 2}"#);
    let mut rollout = canary_first("0s");
    rollout["healthTimeout"] = json!("10s");
    let web = s.canary_and_web(&key, v1, (1, 1), rollout).await;
    s.kubectl(&["rollout", "pause", "deployment/canary"]);

    s.put(&key, v2).await;
    let paused = s.wait_message_containing("cfg", conditions::READY, reason::ROLLOUT_IN_PROGRESS, "paused").await;
    assert!(paused.contains("kubectl rollout resume"), "{paused}");
    // Past the health timeout, with room: still waiting, not halted.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let ready = support::ready(&s.get_binding("cfg").await).unwrap();
    assert_eq!(ready.reason, reason::ROLLOUT_IN_PROGRESS, "{}", ready.message);
    assert_eq!(s.generation("web").await, web);
    assert_eq!(s.reports("canary").await.unwrap(), [format!("read consul:{key} = {v1}\n")], "no pod rolled");

    s.kubectl(&["rollout", "resume", "deployment/canary"]);
    s.wait_running("canary", 1, &key, v2).await;
    s.wait_running("web", 1, &key, v2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}

/// A CronJob's next Job runs the new content: the binding stamps the job template and makes no
/// Job itself; a Job made from it after the change (as its schedule, or `kubectl create job
/// --from=cronjob/…`, makes one) reads the new value, and one made before keeps what it read.
#[tokio::test]
async fn a_cronjobs_next_job_reads_the_new_content_and_one_made_before_keeps_the_old() {
    let Some(s) = Scene::new("pods-cron").await else { return };
    let key = s.key("config.json");
    let (v1, v2) = (r#"{"v": 1}"#, r#"{"v": 2}"#);
    s.put(&key, v1).await;
    let (api, version) = crate::cronjobs::cronjobs(&s).await;
    let mut cron = crate::cronjobs::cronjob(&version, "nightly");
    let mut pod = app("nightly", 1, "job", &key)["spec"]["template"]["spec"].clone();
    pod["restartPolicy"] = json!("Never");
    let container = &mut pod["containers"][0];
    container.as_object_mut().unwrap().remove("readinessProbe");
    container["env"].as_array_mut().unwrap().push(json!({"name": "DEMO_ONCE", "value": "1"}));
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"] = pod;
    s.apply(cron).await.unwrap();
    let job_from_template = |name: &str, template: Value| json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": template});
    let template = || async { api.get("nightly").await.unwrap().data["spec"]["jobTemplate"]["spec"].clone() };
    let ran = |name: &'static str| {
        let s = &s;
        async move {
            let done =
                || async { Ok(s.kubectl(&["get", "job", name, "-o", "jsonpath={.status.succeeded}"]).trim() == "1") };
            wait_for(&format!("Job {name} to succeed"), PODS, done).await.unwrap();
            s.kubectl(&["logs", &format!("job/{name}")])
        }
    };
    s.apply(job_from_template("before", template().await)).await.unwrap();
    let line = |value: &str| format!("read consul:{key} = {value}\n");
    assert_eq!(ran("before").await, line(v1) + "ready\n");

    let targets = json!([{"kind": "CronJob", "name": "nightly"}]);
    s.binding("cfg", support::spec(json!([{"key": key}]), targets, "0s")).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    s.put(&key, v2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.apply(job_from_template("after", template().await)).await.unwrap();
    assert_eq!(ran("after").await, line(v2) + "ready\n", "the next Job reads the new content");
    assert_eq!(ran("before").await, line(v1) + "ready\n", "a Job made before is left as it ran");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(s.client.clone(), &s.ns);
    let mut names: Vec<String> =
        jobs.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|j| j.metadata.name).collect();
    names.sort();
    assert_eq!(names, ["after", "before"], "the binding made no Job of its own");
    s.finish().await;
}

/// `minReadySeconds`: the canary's new pod counts as available only once it has been Ready that
/// long, and the next wave starts no sooner.
#[tokio::test]
async fn the_next_wave_waits_out_the_canarys_min_ready_seconds() {
    let Some(s) = Scene::new("pods-minready").await else { return };
    let key = s.key("config.json");
    let (v1, v2) = (r#"{"v": 1}"#, r#"{"v": 2}"#);
    s.put(&key, v1).await;
    let mut canary = app("canary", 1, "canary", &key);
    canary["spec"]["minReadySeconds"] = json!(10);
    s.apply(canary).await.unwrap();
    s.apply(app("web", 1, "main", &key)).await.unwrap();
    s.wait_running("canary", 1, &key, v1).await;
    s.wait_running("web", 1, &key, v1).await;
    s.binding("cfg", crate::waves::staged(&key, canary_first("0s"))).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let web = s.generation("web").await;

    s.put(&key, v2).await;
    let rolled = || async { Ok(s.generation("web").await > web) };
    wait_for("the second wave", PODS, rolled).await.unwrap();
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let pods = api.list(&ListParams::default().labels("app=canary")).await.unwrap().items;
    let ready_since = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .flat_map(|p| p.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default())
        .filter(|c| c.type_ == "Ready" && c.status == "True")
        .filter_map(|c| c.last_transition_time)
        .max()
        .expect("the canary's new pod is Ready");
    let ready_for = k8s_openapi::jiff::Timestamp::now().duration_since(ready_since.0);
    // The condition's time is in whole seconds.
    assert!(ready_for.as_secs() >= 9, "the next wave started {ready_for:?} after the canary's pod was Ready");
    s.wait_running("canary", 1, &key, v2).await;
    s.finish().await;
}
