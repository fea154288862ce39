//! The checksum key lives in a Secret in the controller's namespace, made on first start. Every
//! replica reads the same one; losing it changes every checksum, so each workload rolls once.

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

use super::{KEY_LEN, Key};

/// The key's entry in the Secret's data.
pub const DATA_KEY: &str = "key";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading or creating the checksum key Secret {0}: {1}")]
    Api(String, #[source] kube::Error),
    #[error(
        "the checksum key Secret {0} has no {KEY_LEN}-byte entry {DATA_KEY:?}; restore it from a backup, or delete it to make a new one (every bound workload then rolls once)"
    )]
    Malformed(String),
    #[error("generating a checksum key: {0}")]
    Random(#[source] std::io::Error),
}

/// Reads the key from Secret `namespace/name`, creating it when there is none.
pub async fn load_or_create(client: &Client, namespace: &str, name: &str) -> Result<Key, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("{namespace}/{name}");
    // Two replicas may start together: one creates, the other finds it on its second look.
    for _ in 0..2 {
        if let Some(secret) = api.get_opt(name).await.map_err(|e| Error::Api(what.clone(), e))? {
            return parse(&secret).ok_or(Error::Malformed(what));
        }
        let key = Key::generate().map_err(Error::Random)?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some([("app.kubernetes.io/name".to_owned(), "consulbind".to_owned())].into()),
                ..ObjectMeta::default()
            },
            data: Some([(DATA_KEY.to_owned(), ByteString(key.bytes().to_vec()))].into()),
            immutable: Some(true),
            ..Secret::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(secret = %what, "created the checksum key; back it up with the cluster's Secrets");
                return Ok(key);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => return Err(Error::Api(what, e)),
        }
    }
    Err(Error::Malformed(what))
}

fn parse(secret: &Secret) -> Option<Key> {
    let bytes = secret.data.as_ref()?.get(DATA_KEY)?;
    Some(Key::new(bytes.0.as_slice().try_into().ok()?))
}
