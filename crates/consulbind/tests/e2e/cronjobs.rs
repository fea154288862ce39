//! CronJobs as targets: the stamp goes on the job template's pod template, so the next Job
//! runs with the new content; each change is one new generation of the CronJob, and Jobs
//! already made are left alone. The bed (1.20) serves CronJobs as `batch/v1beta1` only.

use consulbind::names;
use consulbind_api::conditions::{self, reason};
use kube::{
    Api,
    api::{ApiResource, DynamicObject},
};
use serde_json::{Value, json};

use crate::support::{self, SETTLE, Scene, spec};

const CRON: &str = "CronJob";

/// CronJobs as the API server serves them (`batch/v1`, or `batch/v1beta1` before 1.21), and
/// that API version.
pub async fn cronjobs(s: &Scene) -> (Api<DynamicObject>, String) {
    let kind = |version| kube::api::GroupVersionKind::gvk("batch", version, CRON);
    let (resource, _): (ApiResource, _) = match kube::discovery::pinned_kind(&s.client, &kind("v1")).await {
        Ok(found) => found,
        Err(_) => {
            kube::discovery::pinned_kind(&s.client, &kind("v1beta1")).await.expect("the API server serves CronJobs")
        }
    };
    let version = resource.api_version.clone();
    (Api::namespaced_with(s.client.clone(), &s.ns, &resource), version)
}

/// A suspended CronJob (it makes no Jobs by itself) whose pods read ConfigMap `env`.
pub fn cronjob(api_version: &str, name: &str) -> Value {
    json!({
        "apiVersion": api_version, "kind": CRON, "metadata": {"name": name},
        "spec": {
            "schedule": "0 0 1 1 *", "suspend": true,
            "jobTemplate": {"spec": {"template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "job", "image": "example.invalid/job:1", "envFrom": [{"configMapRef": {"name": "env"}}]
                }]}
            }}}
        }
    })
}

pub fn stamp_of(object: &DynamicObject, binding: &str) -> Option<String> {
    let template = &object.data["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"];
    template[names::annotation_key(binding)].as_str().map(str::to_owned)
}

/// Counts the writes of one CronJob from now on, from a watch: a CronJob has no generation
/// before Kubernetes 1.21, and a suspended one is written by no one else.
struct Writes(std::sync::Arc<std::sync::atomic::AtomicUsize>, tokio::task::JoinHandle<()>);

impl Writes {
    async fn watch(api: &Api<DynamicObject>, name: &str) -> Self {
        use futures::StreamExt;
        let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = kube::runtime::watcher(api.clone(), config).boxed();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Counting starts once the watch has listed the object.
        loop {
            if let Some(Ok(kube::runtime::watcher::Event::InitDone)) = events.next().await {
                break;
            }
        }
        let counted = count.clone();
        let task = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if let Ok(kube::runtime::watcher::Event::Apply(_)) = event {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        Self(count, task)
    }

    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for the `want`th write, and checks that no other follows.
    async fn wait(&self, s: &Scene, want: usize) {
        let what = format!("{want} writes of the CronJob");
        if let Err(error) = support::wait(&what, || async { Ok(self.count() >= want) }).await {
            panic!("{error}\n{}", s.log());
        }
        tokio::time::sleep(SETTLE).await;
        assert_eq!(self.count(), want, "the CronJob was written more than once for a change\n{}", s.log());
    }
}

impl Drop for Writes {
    fn drop(&mut self) {
        self.1.abort();
    }
}

#[tokio::test]
async fn a_cronjob_rolls_once_per_change_and_its_jobs_are_left_alone() {
    let Some(s) = Scene::new("cron").await else { return };
    let (api, version) = cronjobs(&s).await;
    let key = s.key("config");
    s.put(&key, "v1").await;
    s.apply(cronjob(&version, "nightly")).await.unwrap();
    // A Job made from it already, as `kubectl create job --from=cronjob/nightly` makes one.
    let template = api.get("nightly").await.unwrap().data["spec"]["jobTemplate"]["spec"].clone();
    s.apply(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "manual"}, "spec": template}))
        .await
        .unwrap();
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(s.client.clone(), &s.ns);
    let job_before = jobs.get("manual").await.unwrap();

    s.binding("cfg", spec(json!([{"key": &key}]), json!([{"kind": CRON, "name": "nightly"}]), "0s")).await;
    let baselined = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    assert_eq!(support::status_targets(&baselined), ["CronJob/nightly"]);
    let writes = Writes::watch(&api, "nightly").await;

    for (change, value) in ["v2", "v3"].into_iter().enumerate() {
        s.put(&key, value).await;
        writes.wait(&s, change + 1).await;
        let want = s.checksum_of(&key, value.as_bytes()).await;
        assert_eq!(stamp_of(&api.get("nightly").await.unwrap(), "cfg"), Some(want), "the job template carries it");
    }
    let job_after = jobs.get("manual").await.unwrap();
    assert_eq!(job_after.metadata.generation, job_before.metadata.generation, "a Job already made is left alone");
    let annotations = job_after.spec.unwrap().template.metadata.unwrap().annotations.unwrap_or_default();
    assert!(!annotations.contains_key(&names::annotation_key("cfg")), "{annotations:?}");
    s.wait_event("nightly", reason::ROLLED_OUT).await;
    s.finish().await;
}

#[tokio::test]
async fn a_cronjob_s_referenced_config_map_rolls_it_and_a_staged_rollout_goes_past_it() {
    let Some(s) = Scene::new("cron-refs").await else { return };
    let (api, version) = cronjobs(&s).await;
    s.apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "env"}, "data": {"LEVEL": "info"}}))
        .await
        .unwrap();
    s.apply(cronjob(&version, "report")).await.unwrap();
    // No replicas: healthy in a bed without kubelets.
    let mut web = support::workload(crate::DEPLOY, "web", json!({}));
    web["spec"]["replicas"] = json!(0);
    web["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "env"}}]);
    s.apply(web).await.unwrap();
    s.wait_revisions(crate::DEPLOY, "web", 1).await;
    // The CronJob first; the Deployment once it counts as healthy, which a CronJob does once stamped.
    let spec = json!({
        "includeTargetReferences": true,
        "targets": [{"kind": CRON, "name": "report"}, {"kind": "Deployment", "name": "web"}],
        "rollout": {"quietPeriod": "0s", "waves": [{"kind": CRON}]}
    });
    s.binding("cfg", spec).await;
    let baselined = s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await.status.unwrap();
    assert!(baselined.objects.iter().any(|o| o.name == "env" && o.referenced), "{:?}", baselined.objects);
    let writes = Writes::watch(&api, "report").await;
    s.apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "env"}, "data": {"LEVEL": "debug"}}))
        .await
        .unwrap();
    writes.wait(&s, 1).await;
    s.wait_revisions(crate::DEPLOY, "web", 2).await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    s.finish().await;
}
