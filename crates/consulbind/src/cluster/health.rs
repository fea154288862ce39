//! Whether a workload's own controller has finished rolling out its current template, by the
//! rules `kubectl rollout status` follows, read from the object the watch delivers. Only the
//! verdict and a short detail are cached, and only for workloads that are not healthy.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, DeploymentCondition, StatefulSet};

use super::argo::Rollout;

/// A workload's rollout as its controller reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Health {
    #[default]
    Healthy,
    /// Not there yet; what it reports.
    Progressing(String),
    /// Held by a person (a Deployment's `spec.paused`): it waits for them, not for a timeout.
    Paused(String),
    /// Done as far as its controller goes (`updateStrategy: OnDelete`), but some pods run the
    /// old template until someone deletes them.
    AwaitsDeletion(String),
    /// Its controller gave up (`Progressing=False`, or an Argo Rollout `Degraded`).
    Failed(String),
}

/// Cache annotations: the verdict, part of what wakes bindings, and its detail, which is not.
pub const VERDICT: &str = "health";
pub const DETAIL: &str = "health-detail";

impl Health {
    /// As cache annotations; none for a healthy workload.
    pub fn encode(&self) -> Option<[(String, String); 2]> {
        let (verdict, detail) = match self {
            Self::Healthy => return None,
            Self::Progressing(d) => ("Progressing", d),
            Self::Paused(d) => ("Paused", d),
            Self::AwaitsDeletion(d) => ("AwaitsDeletion", d),
            Self::Failed(d) => ("Failed", d),
        };
        Some([(VERDICT.into(), verdict.into()), (DETAIL.into(), detail.clone())])
    }

    pub fn decode(annotations: &super::pairs::Pairs) -> Self {
        let detail = annotations.get(DETAIL).unwrap_or_default().to_owned();
        match annotations.get(VERDICT) {
            Some("Failed") => Self::Failed(detail),
            Some("Paused") => Self::Paused(detail),
            Some("AwaitsDeletion") => Self::AwaitsDeletion(detail),
            Some(_) => Self::Progressing(detail),
            None => Self::Healthy,
        }
    }
}

fn observed(generation: Option<i64>, observed: Option<i64>) -> Result<(), Health> {
    match observed.unwrap_or(0) >= generation.unwrap_or(0) {
        true => Ok(()),
        false => Err(Health::Progressing("its controller has not observed the new template yet".into())),
    }
}

fn verdict(f: impl FnOnce() -> Result<(), Health>) -> Health {
    f().err().unwrap_or(Health::Healthy)
}

/// As `kubectl rollout status`: observed; then not past its progress deadline
/// (`Progressing=False` for `ProgressDeadlineExceeded`, the one reason it fails on), every
/// replica updated, no old replica left, and every updated one available. A condition of a
/// generation not yet observed says nothing of the current one. A paused Deployment that has
/// not finished waits for whoever paused it, and says so.
pub fn deployment(d: &Deployment) -> Health {
    let health = verdict(|| {
        let status = d.status.as_ref().cloned().unwrap_or_default();
        observed(d.metadata.generation, status.observed_generation)?;
        let stalled = |c: &&DeploymentCondition| {
            c.type_.as_deref() == Some("Progressing")
                && c.status.as_deref() == Some("False")
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        };
        if let Some(c) = status.conditions.iter().flatten().find(stalled) {
            let message = c.message.as_deref().unwrap_or_default();
            return Err(Health::Failed(format!("ProgressDeadlineExceeded: {message}")));
        }
        let replicas = d.spec.replicas.unwrap_or(1);
        let updated = status.updated_replicas.unwrap_or(0);
        let available = status.available_replicas.unwrap_or(0);
        let old = status.replicas.unwrap_or(0).saturating_sub(updated);
        if updated < replicas {
            return Err(Health::Progressing(format!("{updated} of {replicas} replicas updated")));
        }
        if old > 0 {
            return Err(Health::Progressing(format!("{old} old replicas are pending termination")));
        }
        if available < updated {
            return Err(Health::Progressing(format!("{available} of {updated} updated replicas are available")));
        }
        Ok(())
    });
    match health {
        Health::Progressing(what) if d.spec.paused == Some(true) => {
            Health::Paused(format!("paused (spec.paused), so it rolls once resumed (kubectl rollout resume): {what}"))
        }
        health => health,
    }
}

/// An `OnDelete` workload of which `updated` of `all` pods run the current template: done once
/// all do; until then the rest take it when deleted.
fn on_delete(updated: i32, all: i32) -> Result<(), Health> {
    match updated < all {
        true => Err(Health::AwaitsDeletion(format!(
            "{updated} of {all} pods run the current template; the rest take it when deleted (updateStrategy OnDelete)"
        ))),
        false => Ok(()),
    }
}

/// Observed; with `OnDelete`, the pods still on the old template await deletion; otherwise every
/// replica ready and those above the partition updated, the update complete when unpartitioned.
pub fn stateful_set(s: &StatefulSet) -> Health {
    verdict(|| {
        let status = s.status.clone().unwrap_or_default();
        observed(s.metadata.generation, status.observed_generation)?;
        let spec = &s.spec;
        let strategy = spec.update_strategy.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1);
        let updated = status.updated_replicas.unwrap_or(0);
        if strategy.type_.as_deref() == Some("OnDelete") {
            return on_delete(updated, replicas);
        }
        let partition = strategy.rolling_update.and_then(|r| r.partition).unwrap_or(0).clamp(0, replicas);
        let ready = status.ready_replicas.unwrap_or(0);
        let complete = partition > 0 || status.current_revision == status.update_revision;
        if updated < replicas - partition || ready < replicas || !complete {
            return Err(Health::Progressing(format!("{updated} of {replicas} replicas updated, {ready} ready")));
        }
        Ok(())
    })
}

/// As `kubectl rollout status`: observed; with `OnDelete`, the pods still on the old template
/// await deletion; otherwise updated and available on every node it should run on.
pub fn daemon_set(d: &DaemonSet) -> Health {
    verdict(|| {
        let status = d.status.clone().unwrap_or_default();
        observed(d.metadata.generation, status.observed_generation)?;
        let desired = status.desired_number_scheduled;
        let updated = status.updated_number_scheduled.unwrap_or(0);
        if d.spec.update_strategy.as_ref().and_then(|u| u.type_.as_deref()) == Some("OnDelete") {
            return on_delete(updated, desired);
        }
        let available = status.number_available.unwrap_or(0);
        if updated < desired || available < desired {
            return Err(Health::Progressing(format!("{updated} of {desired} nodes updated, {available} available")));
        }
        Ok(())
    })
}

/// Observed and `phase: Healthy`; `Degraded` is a failure; anything else (`Progressing`,
/// `Paused`) is on its way. A phase of a generation not yet observed says nothing of the current
/// one.
pub fn rollout(r: &Rollout) -> Health {
    verdict(|| {
        let status = r.status.clone().unwrap_or_default();
        let observed_generation = match &status.observed_generation {
            Some(serde_json::Value::Number(n)) => n.as_i64(),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            _ => None,
        };
        observed(r.metadata.generation, observed_generation)?;
        let message = status.message.unwrap_or_default();
        match status.phase.as_deref() {
            Some("Degraded") => Err(Health::Failed(format!("Degraded: {message}"))),
            Some("Healthy") => Ok(()),
            phase => Err(Health::Progressing(format!("{}: {message}", phase.unwrap_or("no phase yet")))),
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deploy(value: serde_json::Value) -> Deployment {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_deployment_is_healthy_once_observed_updated_and_available_and_failed_past_its_deadline() {
        let base = |replicas: i32, status: serde_json::Value| {
            deploy(json!({"metadata": {"name": "web", "generation": 3}, "spec": {"replicas": replicas,
                "selector": {}, "template": {}}, "status": status}))
        };
        let unobserved = base(0, json!({"observedGeneration": 2}));
        assert!(matches!(deployment(&unobserved), Health::Progressing(_)));
        assert_eq!(deployment(&base(0, json!({"observedGeneration": 3}))), Health::Healthy, "nothing to run");
        let updating = base(4, json!({"observedGeneration": 3, "updatedReplicas": 3, "replicas": 4}));
        assert_eq!(deployment(&updating), Health::Progressing("3 of 4 replicas updated".into()));
        let old =
            base(4, json!({"observedGeneration": 3, "updatedReplicas": 4, "replicas": 5, "availableReplicas": 4}));
        assert_eq!(deployment(&old), Health::Progressing("1 old replicas are pending termination".into()));
        let waiting =
            base(4, json!({"observedGeneration": 3, "updatedReplicas": 4, "replicas": 4, "availableReplicas": 3}));
        assert_eq!(
            deployment(&waiting),
            Health::Progressing("3 of 4 updated replicas are available".into()),
            "as kubectl rollout status, whatever maxUnavailable allows"
        );
        let done =
            base(4, json!({"observedGeneration": 3, "updatedReplicas": 4, "replicas": 4, "availableReplicas": 4}));
        assert_eq!(deployment(&done), Health::Healthy);
        let failed = base(
            1,
            json!({"observedGeneration": 3, "conditions": [{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"web-1\" has timed out progressing."}]}),
        );
        assert_eq!(
            deployment(&failed),
            Health::Failed("ProgressDeadlineExceeded: ReplicaSet \"web-1\" has timed out progressing.".into())
        );
        // A fix applied to a halted target: the condition is the old template's until observed.
        let fixed = base(
            1,
            json!({"observedGeneration": 2, "conditions": [{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded"}]}),
        );
        assert!(matches!(deployment(&fixed), Health::Progressing(_)), "{:?}", deployment(&fixed));
    }

    #[test]
    fn a_deployment_fails_only_past_its_progress_deadline_and_a_paused_one_says_so() {
        let with = |spec: serde_json::Value, status: serde_json::Value| {
            let mut spec = spec;
            spec.as_object_mut().unwrap().extend([("selector".into(), json!({})), ("template".into(), json!({}))]);
            deploy(json!({"metadata": {"name": "web", "generation": 3}, "spec": spec, "status": status}))
        };
        // What the deployment controller writes while a ReplicaSet cannot make its pods (a
        // quota, an admission webhook): `kubectl rollout status` waits on, and so does this.
        let quota = with(
            json!({"replicas": 2}),
            json!({"observedGeneration": 3, "replicas": 1, "updatedReplicas": 0, "conditions": [
                {"type": "Progressing", "status": "False", "reason": "ReplicaSetCreateError",
                 "message": "exceeded quota"}]}),
        );
        assert_eq!(deployment(&quota), Health::Progressing("0 of 2 replicas updated".into()));
        let paused = with(
            json!({"replicas": 2, "paused": true}),
            json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 0, "availableReplicas": 2,
                "conditions": [{"type": "Progressing", "status": "Unknown", "reason": "DeploymentPaused"}]}),
        );
        assert_eq!(
            deployment(&paused),
            Health::Paused(
                "paused (spec.paused), so it rolls once resumed (kubectl rollout resume): 0 of 2 replicas updated"
                    .into()
            )
        );
        let done = with(
            json!({"replicas": 2, "paused": true}),
            json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}),
        );
        assert_eq!(deployment(&done), Health::Healthy, "paused with nothing left to roll");
    }

    #[test]
    fn a_daemon_set_is_healthy_once_every_node_runs_it_updated_and_one_on_delete_awaits_its_pods_deletion() {
        let ds = |strategy: &str, status: serde_json::Value| -> DaemonSet {
            serde_json::from_value(json!({"metadata": {"generation": 2}, "spec": {"selector": {}, "template": {},
                "updateStrategy": {"type": strategy}}, "status": status}))
            .unwrap()
        };
        let counts = |updated: i32, available: i32| {
            json!({"observedGeneration": 2, "desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                "numberMisscheduled": 0, "numberReady": available, "updatedNumberScheduled": updated,
                "numberAvailable": available})
        };
        assert!(matches!(daemon_set(&ds("RollingUpdate", counts(3, 2))), Health::Progressing(_)));
        assert_eq!(daemon_set(&ds("RollingUpdate", counts(3, 3))), Health::Healthy);
        assert_eq!(
            daemon_set(&ds("OnDelete", counts(1, 3))),
            Health::AwaitsDeletion(
                "1 of 3 pods run the current template; the rest take it when deleted (updateStrategy OnDelete)".into()
            ),
            "done as far as its controller goes, but the old pods run on"
        );
        assert_eq!(daemon_set(&ds("OnDelete", counts(3, 3))), Health::Healthy, "every pod deleted and back");
        let unobserved = json!({"observedGeneration": 1, "desiredNumberScheduled": 3, "currentNumberScheduled": 3,
            "numberMisscheduled": 0, "numberReady": 3});
        assert!(matches!(daemon_set(&ds("OnDelete", unobserved)), Health::Progressing(_)));
    }

    #[test]
    fn other_kinds_follow_their_own_controllers_rules() {
        let sts: StatefulSet = serde_json::from_value(json!({"metadata": {"generation": 2}, "spec": {"replicas": 2,
            "selector": {}, "template": {}, "serviceName": "s"}, "status": {"observedGeneration": 2, "replicas": 2,
            "updatedReplicas": 2, "readyReplicas": 2, "currentRevision": "a", "updateRevision": "b"}}))
        .unwrap();
        assert!(matches!(stateful_set(&sts), Health::Progressing(_)), "the update is not complete");
        let mut on_delete = sts.clone();
        on_delete.spec.update_strategy = Some(serde_json::from_value(json!({"type": "OnDelete"})).unwrap());
        on_delete.status.as_mut().unwrap().updated_replicas = Some(0);
        assert!(matches!(stateful_set(&on_delete), Health::AwaitsDeletion(_)), "{:?}", stateful_set(&on_delete));
        let ds: DaemonSet = serde_json::from_value(json!({"metadata": {"generation": 1}, "spec": {"selector": {},
            "template": {}}, "status": {"observedGeneration": 1, "desiredNumberScheduled": 0,
            "currentNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0}}))
        .unwrap();
        assert_eq!(daemon_set(&ds), Health::Healthy);
        let degraded: Rollout = serde_json::from_value(json!({"metadata": {"generation": 5},
            "status": {"phase": "Degraded", "message": "ProgressDeadlineExceeded", "observedGeneration": "5"}}))
        .unwrap();
        assert!(matches!(rollout(&degraded), Health::Failed(_)));
        let fixed: Rollout = serde_json::from_value(json!({"metadata": {"generation": 6},
            "status": {"phase": "Degraded", "message": "ProgressDeadlineExceeded", "observedGeneration": "5"}}))
        .unwrap();
        assert!(matches!(rollout(&fixed), Health::Progressing(_)), "a Degraded of the last generation");
        let healthy: Rollout = serde_json::from_value(json!({"metadata": {"generation": 5},
            "status": {"phase": "Healthy", "observedGeneration": "5"}}))
        .unwrap();
        assert_eq!(rollout(&healthy), Health::Healthy);
    }

    #[test]
    fn only_a_workload_that_is_not_healthy_costs_an_annotation() {
        assert_eq!(Health::Healthy.encode(), None);
        let all = [
            Health::Progressing("1 of 2".into()),
            Health::Paused("p".into()),
            Health::AwaitsDeletion("d".into()),
            Health::Failed("x".into()),
        ];
        for health in all {
            let annotations = health.encode().unwrap().into_iter().collect();
            assert_eq!(Health::decode(&annotations), health);
        }
    }
}
