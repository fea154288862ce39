//! Whether a workload's own controller has finished rolling out its current template, by the
//! rules `kubectl rollout status` follows, read from the object the watch delivers. Only the
//! verdict and a short detail are cached, and only for workloads that are not healthy.

use k8s_openapi::{
    api::apps::v1::{DaemonSet, Deployment, DeploymentCondition, StatefulSet},
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::argo::Rollout;

/// A workload's rollout as its controller reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Health {
    #[default]
    Healthy,
    /// Not there yet; what it reports.
    Progressing(String),
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
            Self::Failed(d) => ("Failed", d),
        };
        Some([(VERDICT.into(), verdict.into()), (DETAIL.into(), detail.clone())])
    }

    pub fn decode(annotations: &std::collections::BTreeMap<String, String>) -> Self {
        let detail = annotations.get(DETAIL).cloned().unwrap_or_default();
        match annotations.get(VERDICT).map(String::as_str) {
            Some("Failed") => Self::Failed(detail),
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

/// `value` of `total`: a count, or a percentage rounded up or down.
fn scaled(value: Option<&IntOrString>, total: i32, default: i32, round_up: bool) -> i32 {
    match value {
        None => default,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(text)) => {
            let percent: i64 = text.trim_end_matches('%').parse().unwrap_or(0);
            let scaled = i64::from(total) * percent;
            let n = if round_up { (scaled + 99) / 100 } else { scaled / 100 };
            i32::try_from(n).unwrap_or(total)
        }
    }
}

fn verdict(f: impl FnOnce() -> Result<(), Health>) -> Health {
    f().err().unwrap_or(Health::Healthy)
}

/// Observed, `updatedReplicas == replicas`, `availableReplicas >= replicas - maxUnavailable`, and
/// not `Progressing=False`.
pub fn deployment(d: &Deployment) -> Health {
    verdict(|| {
        let status = d.status.as_ref().cloned().unwrap_or_default();
        let stalled = |c: &&DeploymentCondition| {
            c.type_.as_deref() == Some("Progressing") && c.status.as_deref() == Some("False")
        };
        if let Some(c) = status.conditions.iter().flatten().find(stalled) {
            let reason = c.reason.as_deref().unwrap_or("Progressing=False");
            return Err(Health::Failed(format!("{reason}: {}", c.message.as_deref().unwrap_or_default())));
        }
        observed(d.metadata.generation, status.observed_generation)?;
        let spec = &d.spec;
        let replicas = spec.replicas.unwrap_or(1);
        let rolling = spec.strategy.as_ref().and_then(|s| s.rolling_update.as_ref());
        let max_unavailable = match spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) {
            Some("Recreate") => 0,
            _ => scaled(rolling.and_then(|r| r.max_unavailable.as_ref()), replicas, replicas / 4, false),
        };
        let updated = status.updated_replicas.unwrap_or(0);
        let available = status.available_replicas.unwrap_or(0);
        if updated < replicas || available < replicas - max_unavailable {
            return Err(Health::Progressing(format!(
                "{updated} of {replicas} replicas updated, {available} available"
            )));
        }
        Ok(())
    })
}

/// Observed; with `OnDelete`, nothing more (its pods change only when deleted); otherwise every
/// replica ready and those above the partition updated, the update complete when unpartitioned.
pub fn stateful_set(s: &StatefulSet) -> Health {
    verdict(|| {
        let status = s.status.clone().unwrap_or_default();
        observed(s.metadata.generation, status.observed_generation)?;
        let spec = &s.spec;
        let strategy = spec.update_strategy.clone().unwrap_or_default();
        if strategy.type_.as_deref() == Some("OnDelete") {
            return Ok(());
        }
        let replicas = spec.replicas.unwrap_or(1);
        let partition = strategy.rolling_update.and_then(|r| r.partition).unwrap_or(0).clamp(0, replicas);
        let updated = status.updated_replicas.unwrap_or(0);
        let ready = status.ready_replicas.unwrap_or(0);
        let complete = partition > 0 || status.current_revision == status.update_revision;
        if updated < replicas - partition || ready < replicas || !complete {
            return Err(Health::Progressing(format!("{updated} of {replicas} replicas updated, {ready} ready")));
        }
        Ok(())
    })
}

/// Observed, updated on every node it should run on, and available on all but `maxUnavailable`.
pub fn daemon_set(d: &DaemonSet) -> Health {
    verdict(|| {
        let status = d.status.clone().unwrap_or_default();
        observed(d.metadata.generation, status.observed_generation)?;
        let desired = status.desired_number_scheduled;
        let rolling = d.spec.update_strategy.as_ref().and_then(|u| u.rolling_update.as_ref());
        let max_unavailable = scaled(rolling.and_then(|r| r.max_unavailable.as_ref()), desired, 1, true);
        let updated = status.updated_number_scheduled.unwrap_or(0);
        let available = status.number_available.unwrap_or(0);
        if updated < desired || available < desired - max_unavailable {
            return Err(Health::Progressing(format!("{updated} of {desired} nodes updated, {available} available")));
        }
        Ok(())
    })
}

/// Observed and `phase: Healthy`; `Degraded` is a failure; anything else (`Progressing`,
/// `Paused`) is on its way.
pub fn rollout(r: &Rollout) -> Health {
    verdict(|| {
        let status = r.status.clone().unwrap_or_default();
        let message = status.message.unwrap_or_default();
        match status.phase.as_deref() {
            Some("Degraded") => return Err(Health::Failed(format!("Degraded: {message}"))),
            Some("Healthy") => {}
            phase => return Err(Health::Progressing(format!("{}: {message}", phase.unwrap_or("no phase yet")))),
        }
        let observed_generation = match &status.observed_generation {
            Some(serde_json::Value::Number(n)) => n.as_i64(),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            _ => None,
        };
        observed(r.metadata.generation, observed_generation)
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
        let waiting = base(4, json!({"observedGeneration": 3, "updatedReplicas": 4, "availableReplicas": 2}));
        assert_eq!(deployment(&waiting), Health::Progressing("4 of 4 replicas updated, 2 available".into()));
        let enough = base(4, json!({"observedGeneration": 3, "updatedReplicas": 4, "availableReplicas": 3}));
        assert_eq!(deployment(&enough), Health::Healthy, "25% may be unavailable by default");
        let failed = base(
            1,
            json!({"observedGeneration": 3, "conditions": [{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"web-1\" has timed out progressing."}]}),
        );
        assert_eq!(
            deployment(&failed),
            Health::Failed("ProgressDeadlineExceeded: ReplicaSet \"web-1\" has timed out progressing.".into())
        );
    }

    #[test]
    fn other_kinds_follow_their_own_controllers_rules() {
        let sts: StatefulSet = serde_json::from_value(json!({"metadata": {"generation": 2}, "spec": {"replicas": 2,
            "selector": {}, "template": {}, "serviceName": "s"}, "status": {"observedGeneration": 2, "replicas": 2,
            "updatedReplicas": 2, "readyReplicas": 2, "currentRevision": "a", "updateRevision": "b"}}))
        .unwrap();
        assert!(matches!(stateful_set(&sts), Health::Progressing(_)), "the update is not complete");
        let ds: DaemonSet = serde_json::from_value(json!({"metadata": {"generation": 1}, "spec": {"selector": {},
            "template": {}}, "status": {"observedGeneration": 1, "desiredNumberScheduled": 0,
            "currentNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0}}))
        .unwrap();
        assert_eq!(daemon_set(&ds), Health::Healthy);
        let degraded: Rollout = serde_json::from_value(json!({"metadata": {"generation": 5},
            "status": {"phase": "Degraded", "message": "ProgressDeadlineExceeded", "observedGeneration": "5"}}))
        .unwrap();
        assert!(matches!(rollout(&degraded), Health::Failed(_)));
        let healthy: Rollout = serde_json::from_value(json!({"metadata": {"generation": 5},
            "status": {"phase": "Healthy", "observedGeneration": "5"}}))
        .unwrap();
        assert_eq!(rollout(&healthy), Health::Healthy);
    }

    #[test]
    fn only_a_workload_that_is_not_healthy_costs_an_annotation() {
        assert_eq!(Health::Healthy.encode(), None);
        for health in [Health::Progressing("1 of 2".into()), Health::Failed("x".into())] {
            let annotations = health.encode().unwrap().into_iter().collect();
            assert_eq!(Health::decode(&annotations), health);
        }
    }
}
