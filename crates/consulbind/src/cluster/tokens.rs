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
        let events = watcher(api, config).default_backoff().modify(|secret: &mut Secret| {
            super::strip(secret);
            keep_token_sized(secret);
        });
        let (mut relist, mut listing) = (super::Relist::default(), super::Listing::default());
        let touched = reflector::reflector(writer, events).flat_map(move |event| {
            listing.event(&event);
            let touched = match event {
                Ok(event) => relist.event(&event, |s: &Secret| (s.namespace().unwrap_or_default(), s.name_any())),
                Err(error) => {
                    tracing::warn!(%error, "watching token Secrets failed; retrying");
                    Vec::new()
                }
            };
            futures::stream::iter(touched)
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
        lookup(secret.data.as_ref().and_then(|d| d.get(key)).map(|v| &v.0[..]))
    }
}

/// What a labelled Secret's value under the key says of a token.
fn lookup(value: Option<&[u8]>) -> Lookup {
    if value == Some(TOO_LARGE) {
        return Lookup::TooLarge;
    }
    match value.map(|v| String::from_utf8_lossy(v).trim().to_owned()) {
        // Sent as a header, which carries visible ASCII alone: Consul's tokens are UUIDs.
        Some(token) if !token.bytes().all(|b| b.is_ascii_graphic()) => Lookup::Unfit,
        Some(token) if !token.is_empty() => Lookup::Token(token),
        _ => Lookup::NoKey,
    }
}

/// The longest value kept from a labelled Secret. Consul's tokens are 36-character UUIDs; the
/// cache holds every labelled Secret, and anyone in a namespace can label many large ones.
pub const MAX_TOKEN_BYTES: usize = 1024;
/// The most keys kept from a labelled Secret.
pub const MAX_TOKEN_KEYS: usize = 16;
/// Kept in place of a longer value: never UTF-8, so never a token.
const TOO_LARGE: &[u8] = b"\xff";

/// Keeps what could be a token: the first keys, and their values up to a token's size, a longer
/// one as a marker, so that a binding naming it hears why it cannot be used. Labels go too: the
/// watch selects by label on the server, and a tenant may put thousands on a Secret.
fn keep_token_sized(secret: &mut Secret) {
    secret.string_data = None;
    secret.metadata.labels = None;
    if let Some(data) = &mut secret.data {
        while data.len() > MAX_TOKEN_KEYS {
            data.pop_last();
        }
        for value in data.values_mut().filter(|v| v.0.len() > MAX_TOKEN_BYTES) {
            value.0 = TOO_LARGE.to_vec();
        }
    }
}

// Never printed outside tests: it may hold a token.
#[cfg_attr(test, derive(Debug, PartialEq))]
pub enum Lookup {
    Token(String),
    /// No Secret of that name carries the label.
    NoSecret,
    /// The Secret has no non-empty value under the key.
    NoKey,
    /// The value under the key is longer than any Consul token.
    TooLarge,
    /// The value has characters no token has (a line break, a space or non-ASCII inside it).
    Unfit,
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn a_labelled_secret_keeps_token_sized_values_of_its_first_keys_only_and_no_labels() {
        let mut data: std::collections::BTreeMap<String, ByteString> =
            (0..40).map(|i| (format!("k{i:02}"), ByteString(vec![b'v'; 10]))).collect();
        data.insert("k00".into(), ByteString(vec![b'x'; 8 << 20]));
        data.insert("k01".into(), ByteString(vec![b't'; MAX_TOKEN_BYTES]));
        let mut secret = Secret { data: Some(data), ..Secret::default() };
        let labels = (0..2500).map(|i| (format!("label-{i}"), "x".repeat(400)));
        secret.metadata.labels = Some(labels.collect());
        keep_token_sized(&mut secret);
        assert_eq!(secret.metadata.labels, None, "labels a tenant set are cached");
        let data = secret.data.as_ref().unwrap();
        assert_eq!(data.len(), MAX_TOKEN_KEYS);
        assert_eq!(data["k00"].0, TOO_LARGE);
        assert_eq!(data["k01"].0.len(), MAX_TOKEN_BYTES, "a value of a token's size is kept whole");
        let kept: usize = data.values().map(|v| v.0.len()).sum();
        assert!(kept < 2 * MAX_TOKEN_BYTES, "{kept} bytes kept");
    }

    #[test]
    fn a_value_a_header_cannot_carry_is_no_token() {
        let uuid = "00000000-1111-2222-3333-444444444444";
        assert_eq!(lookup(Some(format!(" {uuid}\n").as_bytes())), Lookup::Token(uuid.into()), "trimmed");
        for unfit in ["0000 1111", "0000\n1111", "t\u{e9}st"] {
            assert_eq!(lookup(Some(unfit.as_bytes())), Lookup::Unfit, "{unfit:?}");
        }
        assert_eq!(lookup(Some(b"  ")), Lookup::NoKey);
        assert_eq!(lookup(None), Lookup::NoKey);
        assert_eq!(lookup(Some(TOO_LARGE)), Lookup::TooLarge);
    }
}
