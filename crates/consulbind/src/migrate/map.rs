//! Reloader's and Wave's annotations on one workload, turned into one ConsulBinding. Pure: the
//! caller reads the workloads and objects from files or from the cluster.

use std::collections::BTreeMap;

use consulbind_api::{
    ConsulBinding, ConsulBindingSpec, MAX_QUIET_PERIOD, ObjectKind, ObjectSource, RolloutPolicy, TargetRef,
    WorkloadKind, parse_duration,
};
use k8s_openapi::api::core::v1::PodSpec;

use crate::cluster::references;

const RELOADER_AUTO: &str = "reloader.stakater.com/auto";
const RELOADER_CONFIGMAP_AUTO: &str = "configmap.reloader.stakater.com/auto";
const RELOADER_SECRET_AUTO: &str = "secret.reloader.stakater.com/auto";
const RELOADER_CONFIGMAP_RELOAD: &str = "configmap.reloader.stakater.com/reload";
const RELOADER_SECRET_RELOAD: &str = "secret.reloader.stakater.com/reload";
const RELOADER_SEARCH: &str = "reloader.stakater.com/search";
const RELOADER_MATCH: &str = "reloader.stakater.com/match";
const RELOADER_IGNORE: &str = "reloader.stakater.com/ignore";
const RELOADER_PAUSE: &str = "deployment.reloader.stakater.com/pause-period";
const WAVE_UPDATE: &str = "wave.pusher.com/update-on-config-change";
const WAVE_CONFIGMAPS: &str = "wave.pusher.com/extra-configmaps";
const WAVE_SECRETS: &str = "wave.pusher.com/extra-secrets";

/// The annotations this module reads; any other of Reloader's or Wave's is reported unmapped.
const KNOWN: &[&str] = &[
    RELOADER_AUTO,
    RELOADER_CONFIGMAP_AUTO,
    RELOADER_SECRET_AUTO,
    RELOADER_CONFIGMAP_RELOAD,
    RELOADER_SECRET_RELOAD,
    RELOADER_SEARCH,
    RELOADER_PAUSE,
    WAVE_UPDATE,
    WAVE_CONFIGMAPS,
    WAVE_SECRETS,
];

/// A workload as the mapping needs it.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub namespace: Option<String>,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    /// Its pod template's annotations and spec (a CronJob's job template's).
    pub template_annotations: BTreeMap<String, String>,
    pub pod: PodSpec,
}

impl Workload {
    /// `Deployment team-a/app`, as notes name it.
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{} {namespace}/{}", self.kind.as_str(), self.name),
            None => format!("{} {}", self.kind.as_str(), self.name),
        }
    }
}

/// The ConfigMaps' and Secrets' annotations by namespace, kind and name, and whether that is all
/// of them (read from the cluster) or only those given (read from files).
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub annotations: BTreeMap<(Option<String>, ObjectKind, String), BTreeMap<String, String>>,
    pub complete: bool,
}

impl Objects {
    fn flagged(&self, namespace: &Option<String>, kind: ObjectKind, name: &str, annotation: &str) -> Option<bool> {
        match self.annotations.get(&(namespace.clone(), kind, name.to_owned())) {
            Some(annotations) => Some(annotations.get(annotation).is_some_and(|v| v == "true")),
            None => (self.complete).then_some(false),
        }
    }
}

/// What one workload's annotations become: a binding (none when they bind nothing), the
/// annotations it came from, and what could not be mapped, and why.
#[derive(Debug, Default)]
pub struct Mapped {
    pub binding: Option<ConsulBinding>,
    pub from: Vec<String>,
    pub notes: Vec<String>,
}

/// Maps one workload. `name` is the binding's name.
pub fn map(workload: &Workload, objects: &Objects, name: &str) -> Mapped {
    let mut out = Mapped::default();
    let annotations = &workload.annotations;
    let on = |key: &str| annotations.get(key).is_some_and(|v| v.trim() == "true");
    for key in annotations.keys().filter(|k| is_theirs(k)) {
        if KNOWN.contains(&key.as_str()) {
            out.from.push(format!("{key}: {}", annotations[key]));
        } else {
            out.notes.push(format!("{key} is not mapped: consulbind has nothing like it"));
        }
    }
    let mut spec = ConsulBindingSpec {
        targets: vec![TargetRef { kind: workload.kind, name: Some(workload.name.clone()), selector: None }],
        ..Default::default()
    };
    let mut chosen: BTreeMap<(ObjectKind, String), ObjectSource> = BTreeMap::new();

    // What the pod template references, followed by Wave or one of Reloader's auto modes.
    let reloader_auto = on(RELOADER_AUTO);
    let follows = |kind| {
        on(WAVE_UPDATE)
            || reloader_auto
            || match kind {
                ObjectKind::ConfigMap => on(RELOADER_CONFIGMAP_AUTO),
                ObjectKind::Secret => on(RELOADER_SECRET_AUTO),
            }
    };
    let references = references::of(&workload.pod);
    let mut left_out = Vec::new();
    for ((kind, object), used) in &references {
        let ignored = !on(WAVE_UPDATE)
            && objects.flagged(&workload.namespace, *kind, object, RELOADER_IGNORE).unwrap_or_else(|| {
                if follows(*kind) {
                    out.notes.push(format!(
                        "{kind} {object} was not among the objects read, so a {RELOADER_IGNORE} on it is not seen"
                    ));
                }
                false
            });
        let matched = on(RELOADER_SEARCH)
            && objects.flagged(&workload.namespace, *kind, object, RELOADER_MATCH).unwrap_or_else(|| {
                out.notes.push(format!(
                    "{kind} {object} was not among the objects read, so whether it has {RELOADER_MATCH} is not known; it is left out"
                ));
                false
            });
        if ignored {
            out.notes.push(format!("{kind} {object} has {RELOADER_IGNORE}: \"true\", so it is left out"));
        }
        if (follows(*kind) && !ignored) || matched {
            let keys = used.keys.as_ref().map(|keys| keys.iter().cloned().collect());
            chosen
                .insert((*kind, object.clone()), ObjectSource { name: object.clone(), keys, optional: used.optional });
        } else {
            left_out.push((*kind, object.clone()));
        }
    }
    if on(WAVE_UPDATE) || reloader_auto {
        if left_out.is_empty() {
            // Every reference is followed: so are those a template change adds later.
            spec.include_target_references = true;
            chosen.clear();
        } else {
            out.notes.push(
                "the objects the template references now are listed one by one, since some are left out; \
                 a reference added later is not followed until it is listed"
                    .to_owned(),
            );
        }
    } else if !chosen.is_empty() && (on(RELOADER_CONFIGMAP_AUTO) || on(RELOADER_SECRET_AUTO)) {
        out.notes.push(
            "the objects of one kind that the template references now are listed one by one; \
             a reference added later is not followed until it is listed"
                .to_owned(),
        );
    }

    // Objects named outright: the whole object, whatever the template reads of it.
    let mut name_all = |kind, list: &str, cross_namespace: bool| {
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let object = match entry.split_once('/') {
                Some((namespace, object)) if cross_namespace => {
                    if workload.namespace.as_deref() != Some(namespace) {
                        out.notes.push(format!(
                            "{kind} {entry} is not mapped: it is in another namespace, and a binding reads only its own"
                        ));
                        continue;
                    }
                    object
                }
                _ => entry,
            };
            chosen.insert((kind, object.to_owned()), ObjectSource { name: object.to_owned(), ..Default::default() });
        }
    };
    for (key, kind, cross_namespace) in [
        (RELOADER_CONFIGMAP_RELOAD, ObjectKind::ConfigMap, false),
        (RELOADER_SECRET_RELOAD, ObjectKind::Secret, false),
        (WAVE_CONFIGMAPS, ObjectKind::ConfigMap, true),
        (WAVE_SECRETS, ObjectKind::Secret, true),
    ] {
        if let Some(list) = annotations.get(key) {
            name_all(kind, list, cross_namespace);
        }
    }
    for ((kind, _), source) in chosen {
        match kind {
            ObjectKind::ConfigMap => spec.config_maps.push(source),
            ObjectKind::Secret => spec.secrets.push(source),
        }
    }

    if let Some(period) = annotations.get(RELOADER_PAUSE) {
        match parse_duration(period.trim()) {
            Ok(p) if p <= MAX_QUIET_PERIOD => {
                out.notes.push(format!(
                    "{RELOADER_PAUSE} {period} became rollout.quietPeriod: changes within it roll once, \
                     after it rather than before it, and the workload is never paused"
                ));
                // The longest wait must allow the quiet period.
                let max_delay = (p > std::time::Duration::from_secs(30)).then(|| period.trim().to_owned());
                spec.rollout = Some(Box::new(RolloutPolicy {
                    quiet_period: Some(period.trim().to_owned()),
                    max_delay,
                    ..Default::default()
                }));
            }
            _ => out.notes.push(format!(
                "{RELOADER_PAUSE} {period} is not mapped: rollout.quietPeriod takes a duration such as 5m, at most 1h"
            )),
        }
    }

    for container in workload.pod.init_containers.iter().flatten().chain(&workload.pod.containers) {
        if container.env.iter().flatten().any(|e| e.name.starts_with("STAKATER_")) {
            out.notes.push(format!(
                "container {} carries Reloader's STAKATER_* env vars; removing them is a template change, and one rollout",
                container.name
            ));
        }
    }
    for key in workload.template_annotations.keys().filter(|k| is_theirs(k)) {
        out.notes.push(format!("the pod template carries {key}; removing it is a template change, and one rollout"));
    }

    let binds = !spec.config_maps.is_empty() || !spec.secrets.is_empty() || spec.include_target_references;
    if binds {
        let mut binding = ConsulBinding::new(name, spec);
        binding.metadata.namespace = workload.namespace.clone();
        out.binding = Some(binding);
    } else if !out.from.is_empty() {
        out.notes
            .push("no binding: its annotations name no ConfigMap or Secret that the binding could read".to_owned());
    }
    out
}

/// Whether an annotation is Reloader's or Wave's.
pub(crate) fn is_theirs(key: &str) -> bool {
    let domain = key.split('/').next().unwrap_or_default();
    domain == "reloader.stakater.com" || domain.ends_with(".reloader.stakater.com") || domain == "wave.pusher.com"
}
