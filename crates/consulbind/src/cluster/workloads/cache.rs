//! One kind's metadata cache, fed by a watch: what it keeps of each workload, and which
//! events are news to the bindings.

use std::hash::{Hash, Hasher};

use consulbind_api::WorkloadKind;
use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        watcher::{self, watcher},
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::{
    kept::Kept,
    store::{self, Store, Writer},
    template::{Template, live_meta},
};
use crate::cluster::{Listing, health};

/// Whether the API server serves a kind to this controller, as its last list or watch said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// Not listed yet.
    Unknown,
    Yes,
    /// No such kind: its CRD is not installed.
    NotInstalled,
    /// The API server refused: RBAC.
    Forbidden,
}

/// A workload that was added, deleted or relabelled.
pub struct Touched {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A cache of one kind; with `served`, a kind that may be missing from the cluster, whose
/// presence is reported there.
pub(super) fn cache<K>(
    client: &Client,
    namespace: Option<&str>,
    kind: WorkloadKind,
    served: Option<watch::Sender<Served>>,
) -> (Store, futures::stream::BoxStream<'static, Touched>)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Template
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (reader, mut writer) = store::store();
    let mut news = News::new(kind);
    // Whole objects arrive, for the pod template's annotations; what is kept is their name,
    // labels and this controller's annotations, so memory stays small per workload.
    let events = watcher(api, watcher::Config::default());
    let stream = match served {
        // A kind that may be installed at any moment is looked for again within seconds.
        Some(_) => {
            let retry = backon::ExponentialBuilder::default()
                .with_min_delay(std::time::Duration::from_millis(800))
                .with_max_delay(std::time::Duration::from_secs(8))
                .with_jitter()
                .without_max_times();
            events.backoff(Patient::new(watcher::ExponentialBackoff::from(retry))).boxed()
        }
        None => events.default_backoff().boxed(),
    };
    let stream = stream.map_ok(|event| event_of(event, live_meta));
    let mut listing = Listing::default();
    let store = reader.clone();
    let stream = stream
        .flat_map(move |event| {
            let listing_after = listing.after(&event);
            let now = served.as_ref().and_then(|_| served_after_event(&event));
            let touched: Vec<Touched> = match event {
                Ok(event) => news.apply(&store, &mut writer, event),
                // An optional kind that is not installed is no news on every retry.
                Err(error) if now == Some(Served::NotInstalled) => {
                    tracing::debug!(%kind, %error, "kind not served; retrying");
                    Vec::new()
                }
                Err(error) => {
                    tracing::warn!(%kind, %error, "watching workloads failed; retrying");
                    Vec::new()
                }
            };
            // Told once the store holds the event: a reconcile woken at a list's end must find it.
            if let (Some(served), Some(now)) = (&served, now) {
                tell_served(served, kind, now);
            }
            listing.set(listing_after);
            futures::stream::iter(touched)
        })
        .boxed();
    (reader, stream)
}

/// What a list or watch event says about whether the kind is served.
fn served_after_event<T>(event: &Result<watcher::Event<T>, watcher::Error>) -> Option<Served> {
    match event {
        Ok(watcher::Event::InitDone) => Some(Served::Yes),
        Err(error) => served_after(error),
        _ => None,
    }
}

fn tell_served(served: &watch::Sender<Served>, kind: WorkloadKind, now: Served) {
    served.send_if_modified(|state| {
        let changed = *state != now;
        if changed {
            tracing::info!(%kind, served = ?now, "the cluster's answer for this kind changed");
        }
        *state = now;
        changed
    });
}

/// Which of one kind's watch events are news to the bindings: judged against the store's
/// version of the object before the event is applied, so that nothing else is kept per
/// workload.
struct News {
    kind: WorkloadKind,
    /// What a re-list found changed, held back until the store has swapped in what it listed.
    held: Vec<Touched>,
}

impl News {
    fn new(kind: WorkloadKind) -> Self {
        Self { kind, held: Vec::new() }
    }

    /// Applies `event` to the store, and returns the workloads it touched, now that the store
    /// holds them. What a re-list no longer shows was deleted while the watch was down, and
    /// gets no deletion event of its own.
    fn apply(&mut self, store: &Store, writer: &mut Writer, event: watcher::Event<Kept>) -> Vec<Touched> {
        let kind = self.kind;
        let touched = |obj: &Kept| Touched {
            kind,
            namespace: obj.namespace().to_owned(),
            name: obj.name().to_owned(),
            labels: obj.labels.to_map(),
        };
        // New, or its labels or annotations changed: a status update alone is no news.
        let news =
            |obj: &Kept| store.get(obj.namespace(), obj.name()).is_none_or(|old| signature(&old) != signature(obj));
        let now = match &event {
            watcher::Event::Init => {
                self.held.clear();
                Vec::new()
            }
            watcher::Event::InitApply(obj) => {
                if news(obj) {
                    self.held.push(touched(obj));
                }
                Vec::new()
            }
            watcher::Event::InitDone => std::mem::take(&mut self.held),
            watcher::Event::Apply(obj) => match news(obj) {
                true => vec![touched(obj)],
                false => Vec::new(),
            },
            watcher::Event::Delete(obj) => vec![touched(obj)],
        };
        let gone = writer.apply(event);
        now.into_iter().chain(gone.iter().map(|old| Touched { labels: Default::default(), ..touched(old) })).collect()
    }
}

/// A backoff that a retry's own start does not reset. The watcher says `Init` before each list
/// it tries, and a stream backoff resets on anything but an error, so a kind the cluster does
/// not serve would be listed again every 0.8 s for ever. Only a watch that has gone without
/// failing for a while starts again from the shortest delay.
struct Patient<B> {
    backoff: B,
    failed_at: Option<tokio::time::Instant>,
}

impl<B> Patient<B> {
    /// How long a watch must go without failing before its next failure is retried soon again.
    const QUIET: std::time::Duration = std::time::Duration::from_secs(30);

    fn new(backoff: B) -> Self {
        Self { backoff, failed_at: None }
    }
}

impl<B: Iterator<Item = std::time::Duration>> Iterator for Patient<B> {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        self.failed_at = Some(tokio::time::Instant::now());
        self.backoff.next()
    }
}

impl<B: kube::runtime::utils::Backoff> kube::runtime::utils::Backoff for Patient<B> {
    fn reset(&mut self) {
        if self.failed_at.is_none_or(|at| at.elapsed() >= Self::QUIET) {
            self.backoff.reset();
        }
    }
}

/// A hash of what the bindings read of a workload's metadata: its labels and annotations.
fn signature(obj: &Kept) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    // A health detail (replica counts) changes often; its verdict wakes the bindings.
    let annotations = obj.annotations.iter().filter(|(k, _)| *k != health::DETAIL);
    (&obj.labels, annotations.collect::<Vec<_>>()).hash(&mut hasher);
    hasher.finish()
}

/// What a failed list or watch says about whether the kind is served.
fn served_after(error: &watcher::Error) -> Option<Served> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status,
        watcher::Error::WatchError(status) => status,
        _ => return None,
    };
    match status.code {
        404 => Some(Served::NotInstalled),
        403 => Some(Served::Forbidden),
        _ => None,
    }
}

fn event_of<K, M>(event: watcher::Event<K>, f: impl Fn(K) -> M) -> watcher::Event<M> {
    match event {
        watcher::Event::Apply(obj) => watcher::Event::Apply(f(obj)),
        watcher::Event::Delete(obj) => watcher::Event::Delete(f(obj)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(obj) => watcher::Event::InitApply(f(obj)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use kube::core::response::Status;
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_news_is_told_and_a_relist_tells_what_was_deleted_while_the_watch_was_down() {
        let (store, mut writer) = store::store();
        let mut news = News::new(WorkloadKind::Deployment);
        let deploy = |name: &str, label: &str| {
            let labels = BTreeMap::from([("app".to_owned(), label.to_owned())]).into();
            Kept::new(name, "ns", Default::default(), labels, Default::default())
        };
        let mut apply = |event: watcher::Event<Kept>| -> Vec<String> {
            news.apply(&store, &mut writer, event).into_iter().map(|t| t.name).collect()
        };
        assert_eq!(apply(watcher::Event::Init), [] as [String; 0]);
        assert_eq!(apply(watcher::Event::InitApply(deploy("a", "1"))), [] as [String; 0], "held back");
        assert_eq!(apply(watcher::Event::InitApply(deploy("b", "1"))), [] as [String; 0]);
        assert_eq!(apply(watcher::Event::InitDone), ["a", "b"]);
        assert_eq!(apply(watcher::Event::Apply(deploy("a", "1"))), [] as [String; 0], "a status update alone");
        assert_eq!(apply(watcher::Event::Apply(deploy("a", "2"))), ["a"], "new labels");
        // The watch was down while b was deleted and c made; the re-list shows a and c.
        assert_eq!(apply(watcher::Event::Init), [] as [String; 0]);
        assert_eq!(apply(watcher::Event::InitApply(deploy("a", "2"))), [] as [String; 0]);
        assert_eq!(apply(watcher::Event::InitApply(deploy("c", "1"))), [] as [String; 0]);
        assert_eq!(apply(watcher::Event::InitDone), ["c", "b"]);
        assert_eq!(store.len(), 2, "nothing is kept for b");
        assert_eq!(apply(watcher::Event::Delete(deploy("c", "1"))), ["c"]);
        assert_eq!(store.len(), 1);
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status { code, ..Status::default() }))
    }

    #[test]
    fn a_missing_or_forbidden_kind_is_told_apart_from_a_blip() {
        let list = |code| served_after(&watcher::Error::InitialListFailed(api_error(code)));
        assert_eq!(list(404), Some(Served::NotInstalled));
        assert_eq!(list(403), Some(Served::Forbidden));
        assert_eq!(list(500), None, "a server error says nothing about the kind");
        let watch = watcher::Error::WatchStartFailed(api_error(404));
        assert_eq!(served_after(&watch), Some(Served::NotInstalled));
    }

    #[tokio::test(start_paused = true)]
    async fn a_kind_not_served_is_listed_less_and_less_often_and_a_lasting_watch_starts_afresh() {
        use kube::runtime::utils::Backoff;
        let exponential = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(800))
            .with_max_delay(Duration::from_secs(8))
            .without_max_times();
        let mut backoff = Patient::new(watcher::ExponentialBackoff::from(exponential));
        let mut delays = Vec::new();
        for _ in 0..6 {
            let delay = backoff.next().unwrap();
            delays.push(delay);
            tokio::time::advance(delay).await;
            // The watcher's Init before it tries the list again.
            backoff.reset();
        }
        let tenths: Vec<u128> = delays.iter().map(|d| d.as_millis() / 100).collect();
        assert_eq!(tenths, [8, 16, 32, 64, 80, 80], "the retry's own start reset nothing");
        tokio::time::advance(Duration::from_secs(30)).await;
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(800)), "a watch that lasted starts afresh");
    }
}
