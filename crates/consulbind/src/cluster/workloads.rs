//! The workloads bindings roll: small caches to find them and to see what they carry. One
//! kind's cache is in `cache`, what it keeps of a workload in `kept`, chosen from its pod
//! template in `template`.

mod cache;
mod kept;
mod store;
mod template;

use std::collections::BTreeMap;

use consulbind_api::{TargetRef, WorkloadKind};
use futures::Stream;
use k8s_openapi::{
    api::apps::v1::{DaemonSet, Deployment, StatefulSet},
    jiff::Timestamp,
};
use kube::{
    Client,
    core::{Selector, SelectorExt},
};
use tokio::sync::watch;

use self::{
    cache::cache,
    kept::Kept,
    store::Store,
    template::{OWNED, WORKLOAD_REF},
};
pub use self::{
    cache::{Served, Touched},
    store::Stopped,
    template::Template,
};
use super::{
    Live, Version, Workload,
    argo::Rollout,
    cronjob::{CronJob, CronJobV1Beta1},
    health::Health,
    references::{self, References},
};

/// Metadata caches of the workload kinds in one scope (a namespace, or all).
#[derive(Clone)]
pub struct Workloads {
    deployments: Store,
    statefulsets: Store,
    daemonsets: Store,
    rollouts: Store,
    /// Whether the cluster serves Argo Rollouts' kind, which is optional.
    rollouts_served: watch::Receiver<Served>,
    cronjobs: Store,
    cronjobs_served: watch::Receiver<Served>,
    /// Before 1.21, CronJobs are served as `batch/v1beta1` only.
    old_cronjobs: Store,
    old_cronjobs_served: watch::Receiver<Served>,
}

/// Which targets exist, and what they carry.
#[derive(Debug, Default)]
pub struct Resolved {
    pub found: Vec<Workload>,
    /// The binding's annotation on each found workload that has it.
    pub live: BTreeMap<Workload, Live>,
    /// The uid and generation of each found workload, as cached.
    pub versions: BTreeMap<Workload, Version>,
    pub missing: Vec<String>,
    /// A sentence for each target whose kind the cluster does not serve to the controller.
    pub unserved: Vec<String>,
    /// The ConfigMaps and Secrets the found workloads' pod templates reference, merged.
    pub references: References,
    /// Those each found workload's pod template references, for the workloads with any.
    pub uses: BTreeMap<Workload, References>,
    /// The found workloads that are not healthy ([`Health`]), with what each reports.
    pub health: BTreeMap<Workload, Health>,
    /// The labels of each found workload, which waves select by.
    pub labels: BTreeMap<Workload, BTreeMap<String, String>>,
}

impl Workloads {
    /// Starts the caches. The returned stream must be polled to keep them current; it yields
    /// when a workload appears, disappears or changes labels, never for mere status updates.
    pub fn start(client: &Client, namespace: Option<&str>) -> (Self, impl Stream<Item = Touched> + Send + 'static) {
        let (deployments, d) = cache::<Deployment>(client, namespace, WorkloadKind::Deployment, None);
        let (statefulsets, s) = cache::<StatefulSet>(client, namespace, WorkloadKind::StatefulSet, None);
        let (daemonsets, ds) = cache::<DaemonSet>(client, namespace, WorkloadKind::DaemonSet, None);
        let (served, rollouts_served) = watch::channel(Served::Unknown);
        let (rollouts, r) = cache::<Rollout>(client, namespace, WorkloadKind::Rollout, Some(served));
        let (served, cronjobs_served) = watch::channel(Served::Unknown);
        let (cronjobs, c) = cache::<CronJob>(client, namespace, WorkloadKind::CronJob, Some(served));
        let (served, old_cronjobs_served) = watch::channel(Served::Unknown);
        let (old_cronjobs, oc) = cache::<CronJobV1Beta1>(client, namespace, WorkloadKind::CronJob, Some(served));
        let workloads = Self {
            deployments,
            statefulsets,
            daemonsets,
            rollouts,
            rollouts_served,
            cronjobs,
            cronjobs_served,
            old_cronjobs,
            old_cronjobs_served,
        };
        (workloads, futures::stream::select_all([d, s, ds, r, c, oc]))
    }

    /// The API version the cluster serves `kind` at.
    pub fn api_version(&self, kind: WorkloadKind) -> &'static str {
        match kind {
            WorkloadKind::CronJob if self.old_cronjobs_only() => "batch/v1beta1",
            _ => kind.api_version(),
        }
    }

    /// The cluster serves CronJobs as `batch/v1beta1` and not as `batch/v1` (before 1.21).
    pub fn old_cronjobs_only(&self) -> bool {
        *self.cronjobs_served.borrow() != Served::Yes && *self.old_cronjobs_served.borrow() == Served::Yes
    }

    /// Waits for the first list of every kind; for Rollouts, an answer that the kind is not
    /// there is enough.
    pub async fn wait_until_ready(&self) -> Result<(), store::Stopped> {
        self.deployments.wait_until_ready().await?;
        self.statefulsets.wait_until_ready().await?;
        self.daemonsets.wait_until_ready().await?;
        for served in [&self.rollouts_served, &self.cronjobs_served, &self.old_cronjobs_served] {
            let _ = served.clone().wait_for(|s| *s != Served::Unknown).await;
        }
        Ok(())
    }

    /// For each kind the cluster may not serve, what changes whenever it starts or stops
    /// serving it.
    pub fn optional_kinds_served(&self) -> [(WorkloadKind, watch::Receiver<Served>); 3] {
        [
            (WorkloadKind::Rollout, self.rollouts_served.clone()),
            (WorkloadKind::CronJob, self.cronjobs_served.clone()),
            (WorkloadKind::CronJob, self.old_cronjobs_served.clone()),
        ]
    }

    /// The workloads in `namespace` that `targets` name or select, with what `wants` asks of each.
    pub fn resolve(&self, namespace: &str, targets: &[TargetRef], wants: &Wants<'_>) -> Resolved {
        let mut found = BTreeMap::new();
        let mut missing = Vec::new();
        let mut unserved = Vec::new();
        for target in targets {
            let mut live = match target.kind {
                WorkloadKind::Deployment => select(&self.deployments, namespace, target, wants),
                WorkloadKind::StatefulSet => select(&self.statefulsets, namespace, target, wants),
                WorkloadKind::DaemonSet => select(&self.daemonsets, namespace, target, wants),
                WorkloadKind::CronJob => {
                    let (now, old) = (self.cronjobs_served.borrow().clone(), self.old_cronjobs_served.borrow().clone());
                    match (now, old) {
                        (Served::Yes, _) => select(&self.cronjobs, namespace, target, wants),
                        (_, Served::Yes) => select(&self.old_cronjobs, namespace, target, wants),
                        (Served::Forbidden, _) | (_, Served::Forbidden) => {
                            unserved.push(
                                "the controller may not list or watch CronJobs (batch); grant it list, watch and \
                                 patch on cronjobs (see config/rbac)"
                                    .to_owned(),
                            );
                            continue;
                        }
                        _ => {
                            unserved.push("the cluster serves no CronJobs (batch/v1 or batch/v1beta1)".to_owned());
                            continue;
                        }
                    }
                }
                WorkloadKind::Rollout => match &*self.rollouts_served.borrow() {
                    Served::Yes => select(&self.rollouts, namespace, target, wants),
                    Served::Forbidden => {
                        unserved.push(
                            "the controller may not list or watch Argo Rollouts (rollouts.argoproj.io); grant it \
                             list, watch and patch on them (see config/rbac)"
                                .to_owned(),
                        );
                        continue;
                    }
                    Served::NotInstalled | Served::Unknown => {
                        unserved.push(
                            "the kind Rollout (argoproj.io/v1alpha1) is not served by this cluster; install Argo \
                             Rollouts, or target another kind. Rollouts are picked up once it is installed"
                                .to_owned(),
                        );
                        continue;
                    }
                },
            };
            let matched = !live.is_empty();
            // Such a Rollout has no template of its own: a stamp there would change nothing.
            live.retain(|found| match &found.workload_ref {
                Some(source) => {
                    let name = &found.name;
                    missing.push(format!(
                        "Rollout {name:?} takes its pod template from {source} (workloadRef); bind that workload \
                         instead, and Argo Rollouts rolls the Rollout when its template changes"
                    ));
                    false
                }
                None => true,
            });
            if !matched {
                missing.push(match (&target.name, &target.selector) {
                    (Some(name), _) => format!("{} {name:?} not found", target.kind),
                    (None, _) => format!("no {} matches the selector", target.kind),
                });
            }
            found.extend(live.into_iter().map(|s| ((target.kind, s.name.clone()), s)));
        }
        let live = found.iter().filter_map(|(w, s)| Some((w.clone(), s.live.clone()?))).collect();
        let versions = found.iter().map(|(w, s)| (w.clone(), s.version.clone())).collect();
        let mut references = References::new();
        for (id, used) in found.values().flat_map(|s| &s.references) {
            references::add(&mut references, id, used);
        }
        let uses =
            found.iter().filter(|(_, s)| !s.references.is_empty()).map(|(w, s)| (w.clone(), s.references.clone()));
        let uses = uses.collect();
        let health = found.iter().filter(|(_, s)| s.health != Health::Healthy);
        let health = health.map(|(w, s)| (w.clone(), s.health.clone())).collect();
        let labels = found.iter_mut().map(|(w, s)| (w.clone(), std::mem::take(&mut s.labels))).collect();
        let found = found.into_keys().collect();
        Resolved { found, live, versions, missing, unserved, references, uses, health, labels }
    }
}

/// A workload found for a target.
struct Selected {
    name: String,
    /// What it carries.
    live: Option<Live>,
    version: Version,
    /// The workload it takes its template from, if any.
    workload_ref: Option<String>,
    /// The objects its pod template references, when asked for.
    references: References,
    health: Health,
    labels: BTreeMap<String, String>,
}

/// What a reconcile asks of each workload it finds, beside its name and version.
pub struct Wants<'a> {
    /// The binding's pod-template annotation: what the workload carries.
    pub annotation: &'a str,
    /// The objects its pod template references.
    pub references: bool,
    /// Its labels, which waves select by.
    pub labels: bool,
}

fn selected(obj: &Kept, wants: &Wants<'_>) -> Selected {
    let (annotation, annotations) = (wants.annotation, &obj.annotations);
    let owned = annotations.get(&format!("{OWNED}{annotation}"));
    let at = owned.and_then(|at| Timestamp::from_second(at.parse().ok()?).ok());
    let live = annotations.get(annotation).map(|value| Live { value: value.to_owned(), owned: owned.is_some(), at });
    Selected {
        name: obj.name().to_owned(),
        live,
        version: obj.version(),
        workload_ref: annotations.get(WORKLOAD_REF).map(str::to_owned),
        references: if wants.references { references::decode(annotations) } else { References::new() },
        health: Health::decode(annotations),
        labels: if wants.labels { obj.labels.to_map() } else { BTreeMap::new() },
    }
}

fn select(store: &Store, namespace: &str, target: &TargetRef, wants: &Wants<'_>) -> Vec<Selected> {
    if let Some(name) = &target.name {
        return store.get(namespace, name).map(|obj| vec![selected(&obj, wants)]).unwrap_or_default();
    }
    let Some(selector) = target.selector.clone().and_then(|s| Selector::try_from(s).ok()) else {
        return Vec::new();
    };
    let found = store.filtered(namespace, |obj| selector.matches(&obj.labels.to_map()));
    found.iter().map(|obj| selected(obj, wants)).collect()
}
