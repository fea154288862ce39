//! The ConfigMaps and Secrets that bindings read as sources. Their metadata is watched, and
//! only the name and resource version of each is kept, so that a cluster's thousands of
//! unbound objects cost little. An object's data is fetched only when a binding reads it and
//! its resource version moved, and then kept as keyed digests, never as values.

use std::{
    collections::HashMap,
    hash::BuildHasher,
    sync::{Arc, Mutex, RwLock},
};

use consulbind_api::ObjectKind;
use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;

use super::Relist;
use crate::{
    Lock, ReadWrite,
    checksum::{self, DIGEST_LEN, Field},
};

/// A ConfigMap or Secret: kind, namespace and name.
pub type ObjectId = (ObjectKind, String, String);

/// The data of one object as digests: key, where it lives, and the keyed digest of its value.
#[derive(Debug, PartialEq, Eq)]
pub struct Digested {
    pub version: String,
    /// A hash of the data under a key of this process's: an edit of the labels alone keeps it,
    /// and the digests with it.
    pub fingerprint: u64,
    pub entries: Arc<[(String, Field, [u8; DIGEST_LEN])]>,
}

/// The first object `params` lists in `namespace`.
async fn first<K>(client: &Client, namespace: &str, params: &ListParams) -> kube::Result<Option<K>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Ok(Api::<K>::namespaced(client.clone(), namespace).list(params).await?.items.into_iter().next())
}

/// How far the metadata watch of one kind has come.
#[derive(Clone, Debug, Default, PartialEq)]
enum Listed {
    #[default]
    NotYet,
    Failing(String),
    Yes,
}

#[derive(Clone)]
pub struct Objects {
    client: Client,
    key: checksum::Key,
    /// The resource version of every ConfigMap, then of every Secret.
    versions: [Arc<RwLock<Relist<ObjectId>>>; 2],
    /// Digests of the objects that bindings read, by the version they were read at.
    digests: Arc<Mutex<HashMap<ObjectId, Arc<Digested>>>>,
    /// Objects with more data keys than `max_keys`, by the version read and how many: each
    /// binding that names one looks again every few seconds, and only a new version is read.
    refused: Arc<Mutex<HashMap<ObjectId, (String, usize)>>>,
    listed: [watch::Receiver<Listed>; 2],
    /// The most data keys of a bound object: each costs a digest in the cache.
    max_keys: usize,
    fingerprints: std::hash::RandomState,
}

/// Why an object's data is not known.
#[derive(Debug, PartialEq)]
pub enum Unknown {
    /// The first list has not come in yet.
    Waiting,
    /// A person must act: the controller may not list or read this kind, for example.
    Failed(String),
    /// It has more data keys than a bound object may have.
    TooLarge(String),
}

impl Objects {
    /// Starts the watches. The stream says which objects appeared, changed or went away, and
    /// must be polled to keep the cache current.
    pub fn start(
        client: &Client,
        namespace: Option<&str>,
        key: checksum::Key,
        max_keys: usize,
    ) -> (Self, impl Stream<Item = ObjectId> + Send + 'static) {
        let versions: [Arc<RwLock<Relist<ObjectId>>>; 2] = Default::default();
        let digests: Arc<Mutex<HashMap<ObjectId, Arc<Digested>>>> = Arc::default();
        let (config_maps, config_maps_listed) = watch_kind(
            api::<PartialObjectMeta<ConfigMap>>(client, namespace),
            ObjectKind::ConfigMap,
            &versions[ObjectKind::ConfigMap as usize],
            &digests,
        );
        let (secrets, secrets_listed) = watch_kind(
            api::<PartialObjectMeta<Secret>>(client, namespace),
            ObjectKind::Secret,
            &versions[ObjectKind::Secret as usize],
            &digests,
        );
        let listed = [config_maps_listed, secrets_listed];
        let fingerprints = std::hash::RandomState::new();
        let refused = Arc::default();
        let objects = Self { client: client.clone(), key, versions, digests, refused, listed, max_keys, fingerprints };
        (objects, stream::select(config_maps, secrets))
    }

    /// Drops what is kept of objects no binding reads any more.
    pub fn forget(&self, objects: &[ObjectId]) {
        if objects.is_empty() {
            return;
        }
        let mut digests = self.digests.locked();
        objects.iter().for_each(|o| drop(digests.remove(o)));
        drop(digests);
        let mut refused = self.refused.locked();
        objects.iter().for_each(|o| drop(refused.remove(o)));
    }

    /// How many objects' digests are kept.
    pub fn digested(&self) -> usize {
        self.digests.locked().len()
    }

    /// The digests of an object's data, `Ok(None)` when it does not exist.
    pub async fn read(&self, id: &ObjectId) -> Result<Option<Arc<Digested>>, Unknown> {
        let listed = self.listed[id.0 as usize].borrow().clone();
        match listed {
            Listed::Yes => {}
            Listed::NotYet => return Err(Unknown::Waiting),
            Listed::Failing(error) => return Err(Unknown::Failed(error)),
        }
        let version = self.versions[id.0 as usize].read_locked().version(id).map(str::to_owned);
        let Some(version) = version else { return Ok(None) };
        let known = self.digests.locked().get(id).cloned();
        if let Some(known) = known.as_ref().filter(|d| d.version == version) {
            return Ok(Some(known.clone()));
        }
        let known = known.as_deref();
        let (kind, namespace, name) = id;
        let too_large = |keys: usize| {
            Unknown::TooLarge(format!(
                "{kind} {name:?} has {keys} data keys, more than the {} (--max-object-keys) a bound object may \
                 have; bind fewer keys with larger values, or ask for a higher limit",
                self.max_keys
            ))
        };
        if let Some((_, keys)) = self.refused.locked().get(id).filter(|(at, _)| *at == version) {
            return Err(too_large(*keys));
        }
        // A list by name, which the API server serves as a read of that one object: the
        // controller needs no `get` beyond the `list` its watch has.
        tracing::debug!(%kind, %namespace, %name, "reading a bound object's data");
        let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
        let fetched = match kind {
            ObjectKind::ConfigMap => first::<ConfigMap>(&self.client, namespace, &by_name)
                .await
                .map(|o| o.map(|o| self.digest_config_map(o, known))),
            ObjectKind::Secret => first::<Secret>(&self.client, namespace, &by_name)
                .await
                .map(|o| o.map(|o| self.digest_secret(o, known))),
        };
        let digested = match fetched {
            Ok(Some(Err((version, keys)))) => {
                self.refused.locked().insert(id.clone(), (version, keys));
                return Err(too_large(keys));
            }
            Ok(Some(Ok(digested))) => Arc::new(digested),
            // Deleted since the watch saw it: its deletion wakes the binding again.
            Ok(None) => return Ok(None),
            Err(kube::Error::Api(status)) => {
                return Err(Unknown::Failed(format!("could not read {kind} {name}: {}", status.message)));
            }
            Err(error) => return Err(Unknown::Failed(format!("could not read {kind} {name}: {error}"))),
        };
        self.refused.locked().remove(id);
        let mut digests = self.digests.locked();
        // A slower read must not replace a newer one.
        if digests.get(id).is_none_or(|known| newer(&digested.version, &known.version)) {
            digests.insert(id.clone(), digested.clone());
        }
        Ok(Some(digested))
    }

    fn digest_config_map(&self, object: ConfigMap, known: Option<&Digested>) -> Result<Digested, (String, usize)> {
        let version = object.resource_version().unwrap_or_default();
        let data = object.data.iter().flatten().map(|(k, v)| (k, Field::Data, v.as_bytes()));
        let binary = object.binary_data.iter().flatten().map(|(k, v)| (k, Field::BinaryData, &v.0[..]));
        self.digest(version, data.chain(binary).collect(), known)
    }

    fn digest_secret(&self, object: Secret, known: Option<&Digested>) -> Result<Digested, (String, usize)> {
        let version = object.resource_version().unwrap_or_default();
        let data = object.data.iter().flatten().map(|(k, v)| (k, Field::Data, &v.0[..]));
        self.digest(version, data.collect(), known)
    }

    /// The digests of `data`, or its version and size when it has more keys than a bound object
    /// may: those are counted before any value is digested.
    fn digest(
        &self,
        version: String,
        data: Vec<(&String, Field, &[u8])>,
        known: Option<&Digested>,
    ) -> Result<Digested, (String, usize)> {
        match data.len() > self.max_keys {
            true => Err((version, data.len())),
            false => Ok(digest(&self.key, &self.fingerprints, version, data, known)),
        }
    }
}

/// The digests of `data`; those of `known` again when the data is the same, as after an edit of
/// the labels alone.
fn digest(
    key: &checksum::Key,
    fingerprints: &std::hash::RandomState,
    version: String,
    mut data: Vec<(&String, Field, &[u8])>,
    known: Option<&Digested>,
) -> Digested {
    data.sort_unstable();
    let fingerprint = fingerprints.hash_one(&data);
    let entries = match known.filter(|k| k.fingerprint == fingerprint) {
        Some(known) => known.entries.clone(),
        None => data.into_iter().map(|(k, f, v)| (k.clone(), f, checksum::digest(key, v))).collect(),
    };
    Digested { version, fingerprint, entries }
}

/// Resource versions are opaque, but the API server that serves these gives etcd's revision:
/// where both are numbers the larger is newer, and otherwise the later read wins.
fn newer(candidate: &str, known: &str) -> bool {
    match (candidate.parse::<u64>(), known.parse::<u64>()) {
        (Ok(candidate), Ok(known)) => candidate >= known,
        _ => true,
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// One kind's metadata watch: keeps `versions` current, and yields each object that changed,
/// appeared or went (one gone at a re-list too), whose digests go with it.
fn watch_kind<K>(
    api: Api<PartialObjectMeta<K>>,
    kind: ObjectKind,
    versions: &Arc<RwLock<Relist<ObjectId>>>,
    digests: &Arc<Mutex<HashMap<ObjectId, Arc<Digested>>>>,
) -> (futures::stream::BoxStream<'static, ObjectId>, watch::Receiver<Listed>)
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let (listed_tx, listed) = watch::channel(Listed::NotYet);
    let (versions, digests) = (versions.clone(), digests.clone());
    let id = move |meta: &PartialObjectMeta<K>| (kind, meta.namespace().unwrap_or_default(), meta.name_any());
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut listing = super::Listing::default();
    let touched = events.flat_map(move |event| {
        let touched = match &event {
            Ok(event) => {
                let mut versions = versions.write_locked();
                let touched = versions.event(event, id);
                let gone = touched.iter().filter(|o| versions.version(o).is_none());
                gone.for_each(|o| drop(digests.locked().remove(o)));
                if matches!(event, watcher::Event::InitDone) {
                    tracing::debug!(%kind, news = touched.len(), "listed");
                    listed_tx.send_replace(Listed::Yes);
                }
                touched
            }
            Err(error) => {
                tracing::warn!(%kind, %error, "watching the metadata of this kind failed; retrying");
                if *listed_tx.borrow() != Listed::Yes {
                    listed_tx.send_replace(Listed::Failing(format!("the controller cannot list {kind}s: {error}")));
                }
                Vec::new()
            }
        };
        // Once the versions hold what was listed.
        listing.event(&event);
        stream::iter(touched)
    });
    (touched.boxed(), listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_of_the_labels_alone_keeps_the_digests_and_one_of_the_data_does_not() {
        let key = checksum::Key::new([3; checksum::KEY_LEN]);
        let fingerprints = std::hash::RandomState::new();
        let (a, b) = ("a".to_owned(), "b".to_owned());
        let data = |v: &'static str| vec![(&b, Field::Data, v.as_bytes()), (&a, Field::Data, &b"x"[..])];
        let first = digest(&key, &fingerprints, "1".into(), data("y"), None);
        let relabelled = digest(&key, &fingerprints, "2".into(), data("y"), Some(&first));
        assert!(Arc::ptr_eq(&first.entries, &relabelled.entries), "the same digests, not digested again");
        assert_eq!(relabelled.version, "2");
        let edited = digest(&key, &fingerprints, "3".into(), data("z"), Some(&relabelled));
        assert_ne!(edited.entries, relabelled.entries);
        assert_eq!(edited.entries[0].0, "a", "sorted by key");
    }

    #[test]
    fn a_numeric_resource_version_orders_reads() {
        assert!(newer("12", "9"));
        assert!(newer("9", "9"));
        assert!(!newer("9", "12"));
        assert!(newer("opaque", "12"));
    }
}
