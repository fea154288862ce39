//! The Secrets that may serve as Consul tokens: a cache of only those that carry
//! [`TOKEN_LABEL`], so that no other Secret is read and a reconcile never calls the API for one.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, watcher},
    },
};

/// The label a Secret needs before a binding may use it as its Consul token.
pub const TOKEN_LABEL: &str = "consulbind.dev/token";

/// A token Secret that appeared, changed or went away: its namespace and name.
pub type SecretTouched = (String, String);

#[derive(Clone)]
pub struct Tokens {
    store: Store<Secret>,
}

impl Tokens {
    /// Starts the cache. The stream must be polled to keep it current.
    pub fn start(
        client: &Client,
        namespace: Option<&str>,
    ) -> (Self, impl Stream<Item = SecretTouched> + Send + 'static) {
        let api: Api<Secret> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (store, writer) = reflector::store();
        let config = watcher::Config::default().labels(&format!("{TOKEN_LABEL}=true"));
        let events = watcher(api, config).default_backoff().modify(super::strip::<Secret>);
        let touched = reflector::reflector(writer, events).filter_map(|event| {
            let touched = match event {
                Ok(watcher::Event::Apply(s) | watcher::Event::Delete(s) | watcher::Event::InitApply(s)) => {
                    Some((s.namespace().unwrap_or_default(), s.name_any()))
                }
                Err(error) => {
                    tracing::warn!(%error, "watching token Secrets failed; retrying");
                    None
                }
                _ => None,
            };
            futures::future::ready(touched)
        });
        (Self { store }, touched)
    }

    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.store.wait_until_ready().await
    }

    /// The value of `key` in the labelled Secret `name`, if there is one.
    pub fn get(&self, namespace: &str, name: &str, key: &str) -> Lookup {
        let Some(secret) = self.store.get(&ObjectRef::new(name).within(namespace)) else {
            return Lookup::NoSecret;
        };
        let value =
            secret.data.as_ref().and_then(|d| d.get(key)).map(|v| String::from_utf8_lossy(&v.0).trim().to_owned());
        match value {
            Some(token) if !token.is_empty() => Lookup::Token(token),
            _ => Lookup::NoKey,
        }
    }
}

pub enum Lookup {
    Token(String),
    /// No Secret of that name carries the label.
    NoSecret,
    /// The Secret has no non-empty value under the key.
    NoKey,
}
