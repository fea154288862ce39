//! `consulbind migrate`: ConsulBindings from Reloader's and Wave's annotations, read from
//! manifest files or from the cluster, written to standard output. It changes nothing anywhere:
//! it reads workloads and ConfigMaps, and only the metadata of Secrets.

mod map;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::Parser;
use consulbind_api::{ObjectKind, WorkloadKind};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::core::PartialObjectMeta;
use kube::{Client, Resource};
use serde::Deserialize as _;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use map::{Mapped, Objects, Workload, map};

/// Turns Reloader's and Wave's annotations into ConsulBindings, written to standard output;
/// what cannot be mapped is said on standard error. Nothing is changed in the cluster.
#[derive(Parser, Debug)]
#[command(name = "consulbind migrate")]
pub struct Args {
    /// Manifests to read workloads, ConfigMaps and Secrets from: files, folders (their .yaml,
    /// .yml and .json files, recursively) or `-` for standard input. Without any, the cluster of
    /// the current kubeconfig context is read.
    #[arg(short = 'f', long = "filename")]
    pub files: Vec<PathBuf>,

    /// The namespace to read from the cluster (the context's by default), or of manifests
    /// without one.
    #[arg(short, long)]
    pub namespace: Option<String>,

    /// Read every namespace of the cluster.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
}

/// Runs the command; the process's exit code.
pub async fn run(args: Args) -> i32 {
    let read = if args.files.is_empty() { from_cluster(&args).await } else { from_files(&args) };
    let (workloads, objects) = match read {
        Ok(read) => read,
        Err(error) => {
            eprintln!("error: {error}");
            return 1;
        }
    };
    let (text, notes, count) = write(&workloads, &objects);
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        eprintln!("error: writing the bindings: {error}");
        return 1;
    }
    for note in &notes {
        eprintln!("note: {note}");
    }
    let annotated = workloads.iter().filter(|w| w.annotations.keys().any(|k| map::is_theirs(k))).count();
    eprintln!(
        "{count} binding(s) from {annotated} workload(s) with Reloader's or Wave's annotations, of {} read",
        workloads.len()
    );
    0
}

/// The bindings as YAML documents, each under a comment that says where it came from, and the
/// notes, each naming its workload. A name two workloads of a namespace share gets the kind.
pub fn write(workloads: &[Workload], objects: &Objects) -> (String, Vec<String>, usize) {
    let mut seen: BTreeMap<(Option<String>, &str), usize> = BTreeMap::new();
    for w in workloads {
        *seen.entry((w.namespace.clone(), w.name.as_str())).or_default() += 1;
    }
    let (mut text, mut notes, mut count) = (String::new(), Vec::new(), 0);
    for w in workloads {
        let name = match seen[&(w.namespace.clone(), w.name.as_str())] {
            1 => w.name.clone(),
            _ => format!("{}-{}", w.name, w.kind.as_str().to_lowercase()),
        };
        let mapped = map(w, objects, &name);
        notes.extend(mapped.notes.iter().map(|n| format!("{}: {n}", w.id())));
        let Some(binding) = mapped.binding else { continue };
        count += 1;
        text += &format!("---\n# {}, from {}\n", w.id(), mapped.from.join(", "));
        text += &serde_yaml::to_string(&binding).unwrap_or_default();
    }
    (text, notes, count)
}

fn from_files(args: &Args) -> Result<(Vec<Workload>, Objects), String> {
    let mut texts = Vec::new();
    for path in &args.files {
        if path == Path::new("-") {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).map_err(|e| format!("reading standard input: {e}"))?;
            texts.push(("standard input".to_owned(), text));
        } else {
            for file in manifests(path)? {
                let text = std::fs::read_to_string(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
                texts.push((file.display().to_string(), text));
            }
        }
    }
    let mut read = Found::default();
    for (source, text) in texts {
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let doc = serde_yaml::Value::deserialize(doc).map_err(|e| format!("{source}: {e}"))?;
            let doc: Value = serde_json::to_value(doc).map_err(|e| format!("{source}: {e}"))?;
            read.add(&doc, args.namespace.as_deref()).map_err(|e| format!("{source}: {e}"))?;
        }
    }
    Ok((read.workloads, Objects { annotations: read.objects, complete: false }))
}

/// The manifest files under `path`, sorted.
fn manifests(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = BTreeSet::new();
    let entries = std::fs::read_dir(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("reading {}: {e}", path.display()))?.path();
        if path.is_dir() {
            files.extend(manifests(&path)?);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json") {
            files.insert(path);
        }
    }
    Ok(files.into_iter().collect())
}

#[derive(Default)]
struct Found {
    workloads: Vec<Workload>,
    objects: BTreeMap<(Option<String>, ObjectKind, String), BTreeMap<String, String>>,
}

impl Found {
    /// Adds one manifest (a `List`'s items each); other kinds are skipped.
    fn add(&mut self, doc: &Value, namespace: Option<&str>) -> Result<(), String> {
        if doc["kind"] == "List" {
            for item in doc["items"].as_array().into_iter().flatten() {
                self.add(item, namespace)?;
            }
            return Ok(());
        }
        let meta = &doc["metadata"];
        let name = meta["name"].as_str().unwrap_or_default().to_owned();
        let namespace = meta["namespace"].as_str().or(namespace).map(str::to_owned);
        let annotations = strings(&meta["annotations"]);
        let group = doc["apiVersion"].as_str().unwrap_or_default().split('/').rev().nth(1).unwrap_or("");
        let kind = doc["kind"].as_str().unwrap_or_default();
        let object = match (group, kind) {
            ("", "ConfigMap") => Some(ObjectKind::ConfigMap),
            ("", "Secret") => Some(ObjectKind::Secret),
            _ => None,
        };
        if let Some(kind) = object {
            self.object(kind, namespace, name, annotations);
            return Ok(());
        }
        let (kind, template) = match (group, kind) {
            ("apps", "Deployment") => (WorkloadKind::Deployment, "/spec/template"),
            ("apps", "StatefulSet") => (WorkloadKind::StatefulSet, "/spec/template"),
            ("apps", "DaemonSet") => (WorkloadKind::DaemonSet, "/spec/template"),
            ("argoproj.io", "Rollout") => (WorkloadKind::Rollout, "/spec/template"),
            ("batch", "CronJob") => (WorkloadKind::CronJob, "/spec/jobTemplate/spec/template"),
            _ => return Ok(()),
        };
        let template = doc.pointer(template).unwrap_or(&Value::Null);
        let pod = match template.get("spec") {
            Some(spec) => serde_json::from_value(spec.clone())
                .map_err(|e| format!("{} {name}: its pod template: {e}", kind.as_str()))?,
            None => Default::default(),
        };
        let template_annotations = strings(&template["metadata"]["annotations"]);
        self.workloads.push(Workload { kind, namespace, name, annotations, template_annotations, pod });
        Ok(())
    }

    fn object(
        &mut self,
        kind: ObjectKind,
        namespace: Option<String>,
        name: String,
        annotations: BTreeMap<String, String>,
    ) {
        self.objects.insert((namespace, kind, name), annotations);
    }
}

fn strings(map: &Value) -> BTreeMap<String, String> {
    let map = map.as_object().into_iter().flatten();
    map.filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect()
}

async fn from_cluster(args: &Args) -> Result<(Vec<Workload>, Objects), String> {
    let client = Client::try_default().await.map_err(|e| format!("connecting to the cluster: {e}"))?;
    let namespace = match (&args.namespace, args.all_namespaces) {
        (_, true) => None,
        (Some(namespace), false) => Some(namespace.clone()),
        (None, false) => Some(client.default_namespace().to_owned()),
    };
    let mut read = Found::default();
    for (group, version, kind, plural) in [
        ("apps", "v1", "Deployment", "deployments"),
        ("apps", "v1", "StatefulSet", "statefulsets"),
        ("apps", "v1", "DaemonSet", "daemonsets"),
        ("batch", "v1", "CronJob", "cronjobs"),
        ("argoproj.io", "v1alpha1", "Rollout", "rollouts"),
    ] {
        let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = match &namespace {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let items = match every(|lp| {
            let api = api.clone();
            async move { api.list(&lp).await }
        })
        .await
        {
            Ok(items) => items,
            // Argo Rollouts, or batch/v1 CronJobs before 1.21, may not be served.
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(error) => return Err(format!("listing {plural}: {error}")),
        };
        for item in items {
            let mut doc = serde_json::to_value(&item).map_err(|e| e.to_string())?;
            doc["apiVersion"] = Value::from(resource.api_version.clone());
            doc["kind"] = Value::from(kind);
            read.add(&doc, None)?;
        }
    }
    objects::<ConfigMap>(&client, &namespace, ObjectKind::ConfigMap, &mut read).await?;
    objects::<Secret>(&client, &namespace, ObjectKind::Secret, &mut read).await?;
    Ok((read.workloads, Objects { annotations: read.objects, complete: true }))
}

/// The annotations of every object of kind `K`: metadata only, so no Secret's data is read.
async fn objects<K>(
    client: &Client,
    namespace: &Option<String>,
    kind: ObjectKind,
    read: &mut Found,
) -> Result<(), String>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let items: Vec<PartialObjectMeta<K>> = every(|lp| {
        let api = api.clone();
        async move { api.list_metadata(&lp).await }
    })
    .await
    .map_err(|e| format!("listing {}s: {e}", kind.as_str()))?;
    for item in items {
        let meta = item.metadata;
        read.object(kind, meta.namespace, meta.name.unwrap_or_default(), meta.annotations.unwrap_or_default());
    }
    Ok(())
}

/// Every item of a list, 500 at a time.
async fn every<T, F, Fut>(list: F) -> Result<Vec<T>, kube::Error>
where
    T: Clone + DeserializeOwned,
    F: Fn(ListParams) -> Fut,
    Fut: std::future::Future<Output = Result<kube::core::ObjectList<T>, kube::Error>>,
{
    let mut params = ListParams::default().limit(500);
    let mut items = Vec::new();
    loop {
        let page = list(params.clone()).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

#[cfg(test)]
mod tests {
    use consulbind_api::{ConsulBinding, ObjectSource};

    use super::*;

    /// The bindings and notes made from a testdata file, each binding by name.
    fn migrated(file: &str) -> (BTreeMap<String, ConsulBinding>, Vec<String>) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/migrate/testdata").join(file);
        let args = Args { files: vec![path], namespace: None, all_namespaces: false };
        let (workloads, objects) = from_files(&args).unwrap();
        let (text, notes, count) = write(&workloads, &objects);
        let mut bindings = BTreeMap::new();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let binding = ConsulBinding::deserialize(doc).unwrap();
            assert_eq!(binding.metadata.namespace.as_deref(), Some("shop"));
            bindings.insert(binding.metadata.name.clone().unwrap(), binding);
        }
        assert_eq!(bindings.len(), count, "{text}");
        (bindings, notes)
    }

    fn names(sources: &[ObjectSource]) -> Vec<&str> {
        sources.iter().map(|s| s.name.as_str()).collect()
    }

    fn noted(notes: &[String], workload: &str, says: &str) -> bool {
        notes.iter().any(|n| n.starts_with(workload) && n.contains(says))
    }

    #[test]
    fn malformed_input_is_an_error_that_names_the_file_and_empty_input_is_no_binding() {
        let folder = std::env::temp_dir().join(format!("consulbind-migrate-{}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap();
        let read = |file: &str, text: &str| {
            let path = folder.join(file);
            std::fs::write(&path, text).unwrap();
            let args = Args { files: vec![path], namespace: Some("shop".into()), all_namespaces: false };
            from_files(&args).map(|(workloads, objects)| write(&workloads, &objects).2)
        };
        let broken = read("broken.yaml", "kind: [Deployment\n");
        let template = read(
            "template.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n\
             spec: {template: {spec: {containers: not-a-list}}}\n",
        );
        let empty = read("empty.yaml", "");
        let list = read("list.yaml", "apiVersion: v1\nkind: List\nitems: []\n");
        std::fs::remove_dir_all(&folder).unwrap();

        let broken = broken.unwrap_err();
        assert!(broken.contains("broken.yaml"), "{broken}");
        let template = template.unwrap_err();
        assert!(
            template.contains("template.yaml") && template.contains("Deployment web: its pod template"),
            "{template}"
        );
        assert_eq!(empty, Ok(0));
        assert_eq!(list, Ok(0));
    }

    #[test]
    fn reloaders_annotations_as_its_readme_gives_them() {
        let (bindings, notes) = migrated("reloader.yaml");
        assert_eq!(bindings.keys().collect::<Vec<_>>(), ["auto", "ignoring", "named", "search"]);

        let auto = &bindings["auto"].spec;
        assert!(auto.include_target_references && auto.config_maps.is_empty() && auto.secrets.is_empty());
        assert_eq!(auto.targets[0].kind, WorkloadKind::Deployment);
        assert_eq!(auto.targets[0].name.as_deref(), Some("auto"));
        assert!(noted(&notes, "Deployment shop/auto", "STAKATER_"), "{notes:?}");

        let named = &bindings["named"].spec;
        assert_eq!(names(&named.config_maps), ["bar-configmap", "baz-configmap", "foo-configmap"]);
        assert_eq!(names(&named.secrets), ["foo-secret"]);
        assert!(!named.include_target_references && named.config_maps.iter().all(|s| s.keys.is_none()));

        // Search follows only the referenced objects that carry match.
        let search = &bindings["search"].spec;
        assert_eq!(names(&search.config_maps), ["matched"]);
        assert_eq!(search.targets[0].kind, WorkloadKind::StatefulSet);

        // An ignored object is left out, so the others are listed one by one.
        let ignoring = &bindings["ignoring"].spec;
        assert!(!ignoring.include_target_references);
        assert_eq!(names(&ignoring.config_maps), ["settings"]);
        assert!(noted(&notes, "DaemonSet shop/ignoring", "ConfigMap ignored has reloader.stakater.com/ignore"));
        let rollout = ignoring.rollout.as_ref().unwrap();
        assert_eq!((rollout.quiet_period.as_deref(), rollout.max_delay.as_deref()), (Some("5m"), Some("5m")));
        assert!(noted(&notes, "DaemonSet shop/ignoring", "rollout-strategy is not mapped"), "{notes:?}");

        assert!(!notes.iter().any(|n| n.contains("unannotated")), "{notes:?}");
    }

    #[test]
    fn waves_annotations_as_its_readme_gives_them() {
        let (bindings, notes) = migrated("wave.yaml");
        // A Deployment and a CronJob share the name foo.
        let deployment = &bindings["foo-deployment"].spec;
        assert!(deployment.include_target_references);
        assert_eq!(names(&deployment.config_maps), ["configmap-2"]);
        assert_eq!(names(&deployment.secrets), ["my-secret"]);
        for other in ["ConfigMap some-namespace/my-configmap", "Secret some-namespace/my-secret"] {
            assert!(noted(&notes, "Deployment shop/foo", &format!("{other} is not mapped")), "{notes:?}");
        }
        assert!(noted(&notes, "Deployment shop/foo", "wave.pusher.com/config-hash"), "{notes:?}");
        let cron = &bindings["foo-cronjob"].spec;
        assert!(cron.include_target_references && cron.targets[0].kind == WorkloadKind::CronJob);
    }

    #[test]
    fn an_object_not_read_is_named_and_what_the_cluster_lacks_is_known_absent() {
        let workload = |annotations: &[(&str, &str)]| Workload {
            kind: WorkloadKind::Deployment,
            namespace: Some("shop".into()),
            name: "app".into(),
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            pod: serde_json::from_value(serde_json::json!({
                "containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "unseen"}}]}]
            }))
            .unwrap(),
            ..Default::default()
        };
        let files = Objects::default();
        let cluster = Objects { complete: true, ..Default::default() };
        let search = workload(&[("reloader.stakater.com/search", "true")]);
        let from_files = map(&search, &files, "app");
        assert!(from_files.binding.is_none());
        assert!(from_files.notes.iter().any(|n| n.contains("ConfigMap unseen was not among the objects read")));
        assert!(from_files.notes.iter().any(|n| n.starts_with("no binding")), "{:?}", from_files.notes);
        let from_cluster = map(&search, &cluster, "app");
        assert!(!from_cluster.notes.iter().any(|n| n.contains("not among")), "{:?}", from_cluster.notes);

        let auto = map(&workload(&[("reloader.stakater.com/auto", "true")]), &files, "app");
        assert!(auto.notes.iter().any(|n| n.contains("reloader.stakater.com/ignore on it is not seen")));
        assert!(auto.binding.unwrap().spec.include_target_references);
        let off = map(&workload(&[("reloader.stakater.com/auto", "false")]), &cluster, "app");
        assert!(off.binding.is_none());
    }
}
