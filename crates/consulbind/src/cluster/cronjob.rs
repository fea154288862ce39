//! The part of a `CronJob` this controller reads: enough to find one, see what its job
//! template's pod template carries, and which ConfigMaps and Secrets its pods use. Kubernetes
//! serves it as `batch/v1`, and before 1.21 as `batch/v1beta1` only; the fields read, and the
//! patch, are the same in both, so one shape serves both versions.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, core::NamespaceResourceScope};
use serde::{Deserialize, Serialize};

use super::argo::Template;

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CronJobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_template: Option<JobTemplate>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct JobTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<JobSpec>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
}

impl CronJobSpec {
    /// The pod template of the Jobs it makes.
    pub fn template(&self) -> Option<&Template> {
        self.job_template.as_ref()?.spec.as_ref()?.template.as_ref()
    }
}

macro_rules! cronjob {
    ($(#[$doc:meta])* $name:ident, $version:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, Deserialize, Serialize)]
        pub struct $name {
            pub metadata: ObjectMeta,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub spec: Option<CronJobSpec>,
        }

        impl Resource for $name {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                "CronJob".into()
            }

            fn group(_: &()) -> Cow<'_, str> {
                "batch".into()
            }

            fn version(_: &()) -> Cow<'_, str> {
                $version.into()
            }

            fn plural(_: &()) -> Cow<'_, str> {
                "cronjobs".into()
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

cronjob!(
    /// `batch/v1`, Kubernetes 1.21 and later.
    CronJob,
    "v1"
);
cronjob!(
    /// `batch/v1beta1`, all that Kubernetes 1.20 and earlier serve (removed in 1.25).
    CronJobV1Beta1,
    "v1beta1"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_job_template_and_ignores_the_rest() {
        let cronjob: CronJobV1Beta1 = serde_json::from_value(serde_json::json!({
            "apiVersion": "batch/v1beta1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "a", "generation": 2},
            "spec": {"schedule": "0 0 * * *", "concurrencyPolicy": "Forbid",
                     "jobTemplate": {"spec": {"backoffLimit": 2, "template": {
                         "metadata": {"annotations": {"x": "y"}},
                         "spec": {"restartPolicy": "Never", "containers": [{"name": "job", "image": "job"}]}}}}}
        }))
        .unwrap();
        let template = cronjob.spec.as_ref().and_then(CronJobSpec::template).unwrap();
        assert_eq!(template.metadata.as_ref().unwrap().annotations.as_ref().unwrap()["x"], "y");
        assert!(template.spec.is_some());
        assert_eq!(CronJob::api_version(&()), "batch/v1");
        assert_eq!(CronJobV1Beta1::api_version(&()), "batch/v1beta1");
        let bare: CronJob = serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        assert!(bare.spec.is_none());
    }
}
