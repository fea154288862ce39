//! The content checksum stamped on workloads and shown in the status.
//!
//! It is `v3:` and an HMAC-SHA-256 in lowercase hex, keyed by the [`Key::scoped`] key of where
//! the data lives (the binding's namespace, and the Consul datacenter, namespace and partition
//! its spec names), derived from the cluster's checksum [`Key`], over this encoding:
//!
//! ```text
//! "consulbind-checksum-v2\0"
//! then, for each bound source in ascending (kind, key) order, duplicates removed:
//!   exact key: 'K' lp(key) present:u8 [lp(d(value)) if present]
//!   prefix:    'P' lp(prefix) count:u64be { lp(key) lp(d(value)) } for each key, ascending
//!   ConfigMap: 'C' lp(name) present:u8 [count:u64be { lp(key) field:u8 lp(d(value)) } for each
//!              bound data key, ascending, if present], where field is 'd' (data) or 'b' (binaryData)
//!   Secret:    'S' and the same as a ConfigMap
//! where lp(x) = len(x):u64be x
//! and   d(v)  = HMAC-SHA-256(key, "consulbind-value\0" v), the value's keyed [`digest`]
//! ```
//!
//! So the controller keeps a digest of each value, never the value. Without the key, a checksum
//! cannot be checked against a guessed value; and since the key is bound to where the data
//! lives, the same Secret data in another namespace, or the same key in another datacenter, has
//! another checksum, so one namespace's status cannot confirm a guess about another's. Indexes,
//! flags and the order of the spec's lists play no part. Changing any of this would roll every
//! bound workload on upgrade, so the format is pinned by test vectors. Earlier releases stamped
//! `v2:` (the same under the cluster's key itself, recognised from the same digests), [`v1`]
//! (the same encoding over the values themselves) and, before the key, [`legacy`]; a binding
//! that still carries one of the last two is read once more with its values to recognise it.

pub mod key;

use consulbind_api::ObjectKind;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

const HEADER_V1: &[u8] = b"consulbind-checksum-v1\0";
const HEADER: &[u8] = b"consulbind-checksum-v2\0";
const VALUE_DOMAIN: &[u8] = b"consulbind-value\0";
const SCOPE_DOMAIN: &[u8] = b"consulbind-scope\0";
/// Marks a checksum of the current format.
pub const PREFIX: &str = "v3:";
/// Marks a checksum under the cluster's key itself, as releases before scoped keys stamped.
pub const PREFIX_V2: &str = "v2:";

/// The length of a value's [`digest`].
pub const DIGEST_LEN: usize = 32;

/// The content behind one entry of `spec.keys`, `spec.configMaps` or `spec.secrets`: values,
/// or their digests.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source<'a> {
    Key {
        key: &'a str,
        value: Option<&'a [u8]>,
    },
    Prefix {
        prefix: &'a str,
        entries: Vec<(&'a str, &'a [u8])>,
    },
    /// A ConfigMap or Secret: `None` when it does not exist.
    Object {
        kind: ObjectKind,
        name: &'a str,
        entries: Option<Vec<(&'a str, Field, &'a [u8])>>,
    },
}

/// Where a ConfigMap's or Secret's value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    Data,
    BinaryData,
}

impl Source<'_> {
    fn sort_key(&self) -> (u8, &str) {
        match self {
            Source::Key { key, .. } => (b'K', key),
            Source::Prefix { prefix, .. } => (b'P', prefix),
            Source::Object { kind: ObjectKind::ConfigMap, name, .. } => (b'C', name),
            Source::Object { kind: ObjectKind::Secret, name, .. } => (b'S', name),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Source::Key { key, value } => {
                out.push(b'K');
                length_prefixed(out, key.as_bytes());
                out.push(u8::from(value.is_some()));
                if let Some(value) = value {
                    length_prefixed(out, value);
                }
            }
            Source::Prefix { prefix, entries } => {
                let mut entries = entries.clone();
                entries.sort_unstable();
                entries.dedup_by(|a, b| a.0 == b.0);
                out.push(b'P');
                length_prefixed(out, prefix.as_bytes());
                out.extend_from_slice(&(entries.len() as u64).to_be_bytes());
                for (key, value) in entries {
                    length_prefixed(out, key.as_bytes());
                    length_prefixed(out, value);
                }
            }
            Source::Object { name, entries, .. } => {
                out.push(self.sort_key().0);
                length_prefixed(out, name.as_bytes());
                out.push(u8::from(entries.is_some()));
                if let Some(entries) = entries {
                    let mut entries = entries.clone();
                    entries.sort_unstable();
                    entries.dedup_by(|a, b| a.0 == b.0);
                    out.extend_from_slice(&(entries.len() as u64).to_be_bytes());
                    for (key, field, value) in entries {
                        length_prefixed(out, key.as_bytes());
                        out.push(match field {
                            Field::Data => b'd',
                            Field::BinaryData => b'b',
                        });
                        length_prefixed(out, value);
                    }
                }
            }
        }
    }
}

fn length_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The canonical encoding of a set of sources, after `header`.
fn encode(header: &[u8], sources: &[Source<'_>]) -> Vec<u8> {
    let mut sorted: Vec<&Source<'_>> = sources.iter().collect();
    sorted.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    sorted.dedup_by(|a, b| a.sort_key() == b.sort_key());
    let mut out = header.to_vec();
    for source in sorted {
        source.encode(&mut out);
    }
    out
}

/// The secret that keys every checksum of a cluster: the cluster's key, which also keys the
/// digests of values, and for checksums the key of one scope derived from it.
#[derive(Clone)]
pub struct Key {
    bytes: [u8; KEY_LEN],
    scope: Option<[u8; KEY_LEN]>,
}

pub const KEY_LEN: usize = 32;

impl Key {
    pub const fn new(bytes: [u8; KEY_LEN]) -> Self {
        Self { bytes, scope: None }
    }

    /// The key of checksums of data in Kubernetes namespace `namespace` and, for Consul, in
    /// `consul` (the datacenter, namespace and partition a spec names, empty where it names
    /// none). Digests of values stay under the cluster's key, which every scope shares.
    pub fn scoped(&self, namespace: &str, consul: [&str; 3]) -> Self {
        let mut mac = self.mac();
        mac.update(SCOPE_DOMAIN);
        for part in std::iter::once(namespace).chain(consul) {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        Self { bytes: self.bytes, scope: Some(mac.finalize().into_bytes().into()) }
    }

    /// The cluster's key, for the checksums of the format before scopes.
    pub fn unscoped(&self) -> Self {
        Self::new(self.bytes)
    }

    /// A fresh random key, from the system's generator.
    pub fn generate() -> std::io::Result<Self> {
        let mut bytes = [0; KEY_LEN];
        getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Self::new(bytes))
    }

    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.bytes
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC takes keys of any length")
    }

    /// The MAC of checksums: the scope's key, or the cluster's.
    fn checksum_mac(&self) -> (Hmac<Sha256>, &'static str) {
        match &self.scope {
            Some(scope) => (Hmac::<Sha256>::new_from_slice(scope).expect("any length"), PREFIX),
            None => (self.mac(), PREFIX_V2),
        }
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

/// The keyed digest of one value: all the controller keeps of it.
pub fn digest(key: &Key, value: &[u8]) -> [u8; DIGEST_LEN] {
    let mut mac = key.mac();
    mac.update(VALUE_DOMAIN);
    mac.update(value);
    mac.finalize().into_bytes().into()
}

/// The checksum of sources whose values are already [`digest`]s.
pub fn from_digests(key: &Key, sources: &[Source<'_>]) -> String {
    let (mut mac, prefix) = key.checksum_mac();
    mac.update(&encode(HEADER, sources));
    format!("{prefix}{}", hex(&mac.finalize().into_bytes()))
}

/// The checksum of sources with their values.
pub fn checksum(key: &Key, sources: &[Source<'_>]) -> String {
    let digests: Vec<Vec<[u8; DIGEST_LEN]>> = sources
        .iter()
        .map(|s| match s {
            Source::Key { value, .. } => value.iter().map(|v| digest(key, v)).collect(),
            Source::Prefix { entries, .. } => entries.iter().map(|(_, v)| digest(key, v)).collect(),
            Source::Object { entries, .. } => entries.iter().flatten().map(|(_, _, v)| digest(key, v)).collect(),
        })
        .collect();
    let digested: Vec<Source<'_>> = sources
        .iter()
        .zip(&digests)
        .map(|(s, d)| match s {
            Source::Key { key, .. } => Source::Key { key, value: d.first().map(|d| d.as_slice()) },
            Source::Prefix { prefix, entries } => Source::Prefix {
                prefix,
                entries: entries.iter().zip(d).map(|((k, _), d)| (*k, d.as_slice())).collect(),
            },
            Source::Object { kind, name, entries } => Source::Object {
                kind: *kind,
                name,
                entries: entries
                    .as_ref()
                    .map(|e| e.iter().zip(d).map(|((k, f, _), d)| (*k, *f, d.as_slice())).collect()),
            },
        })
        .collect();
    from_digests(key, &digested)
}

/// Whether a stamped or recorded value is of the current format.
pub fn is_current(value: &str) -> bool {
    value.starts_with(PREFIX)
}

/// Whether a value is of the format before scopes, which the same digests can recognise.
pub fn is_v2(value: &str) -> bool {
    value.starts_with(PREFIX_V2)
}

/// What releases before per-value digests stamped, for recognising such values once.
pub fn v1(key: &Key, sources: &[Source<'_>]) -> String {
    let mut mac = key.mac();
    mac.update(&encode(HEADER_V1, sources));
    hex(&mac.finalize().into_bytes())
}

/// The plain SHA-256 that releases before the key stamped, for recognising such values once.
pub fn legacy(sources: &[Source<'_>]) -> String {
    hex(&Sha256::digest(encode(HEADER_V1, sources)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first hex digits of a checksum, for columns and messages.
pub fn short(checksum: &str) -> &str {
    let hex = checksum.strip_prefix(PREFIX).or_else(|| checksum.strip_prefix(PREFIX_V2)).unwrap_or(checksum);
    hex.get(..12).unwrap_or(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_is_fresh_each_time() {
        let (a, b) = (Key::generate().unwrap(), Key::generate().unwrap());
        assert_ne!(a.bytes(), b.bytes());
        assert_ne!(a.bytes(), &[0; KEY_LEN]);
    }

    fn vector() -> Vec<Source<'static>> {
        vec![
            Source::Key { key: "app/config.json", value: Some(br#"{"pool":10}"#) },
            Source::Key { key: "app/optional", value: None },
            Source::Prefix {
                prefix: "app/features/",
                entries: vec![("app/features/b", b"off"), ("app/features/a", b"on")],
            },
        ]
    }

    fn key() -> Key {
        Key::new(std::array::from_fn(|i| i as u8))
    }

    #[test]
    fn pinned_test_vectors() {
        // Computed independently from the documented formats (Python's hmac, key bytes 0..=31).
        // Changing one rolls every bound workload.
        assert_eq!(checksum(&key(), &vector()), "v2:56f935c8a3ed3f932e0ec120b59ea28f5793ff0937ec5e4f39b9d6a373c35102");
        assert_eq!(v1(&key(), &vector()), "c50a65401a32ead7db3a91504cf0067ac6d94b62f7e5bbf8d4140bbfba2d4453");
        assert_eq!(legacy(&vector()), "b14a888965cdb9657b5b5370cd112364a9b33a0f4e36dd7023c686add0556d26");
    }

    /// The same content in another namespace (or Consul datacenter) has another checksum, and
    /// digests stay those of the cluster's key.
    #[test]
    fn pinned_test_vectors_of_scoped_keys() {
        // Computed independently from the documented format (Python's hmac, key bytes 0..=31).
        let team_a = key().scoped("team-a", ["dc1", "", ""]);
        let team_b = key().scoped("team-b", ["dc1", "", ""]);
        assert_eq!(checksum(&team_a, &vector()), "v3:551ecf59944a5cd993c365ed0404a120ee15a80aeb2b9ad528ca58c0f6e40919");
        assert_eq!(checksum(&team_b, &vector()), "v3:15522a4b269e8a690e405018d97c81d403295d8ad5c748d30d1d6b3a803fe877");
        assert_ne!(checksum(&key().scoped("team-a", ["dc2", "", ""]), &vector()), checksum(&team_a, &vector()));
        assert_ne!(checksum(&key().scoped("team-a", ["dc1", "", "p"]), &vector()), checksum(&team_a, &vector()));
        assert_eq!(digest(&team_a, b"on"), digest(&key(), b"on"));
        assert_eq!(checksum(&team_a.unscoped(), &vector()), checksum(&key(), &vector()));
        assert!(is_current(&checksum(&team_a, &vector())) && is_v2(&checksum(&key(), &vector())));
    }

    #[test]
    fn a_checksum_of_digests_is_the_checksum_of_the_values() {
        let d = |v: &[u8]| digest(&key(), v);
        let (config, on, off) = (d(br#"{"pool":10}"#), d(b"on"), d(b"off"));
        let digested = vec![
            Source::Key { key: "app/config.json", value: Some(&config) },
            Source::Key { key: "app/optional", value: None },
            Source::Prefix {
                prefix: "app/features/",
                entries: vec![("app/features/b", &off), ("app/features/a", &on)],
            },
        ];
        assert_eq!(from_digests(&key(), &digested), checksum(&key(), &vector()));
        assert!(is_v2(&checksum(&key(), &vector())));
        assert!(!is_v2(&v1(&key(), &vector())) && !is_v2(&legacy(&vector())));
        assert_eq!(short(&checksum(&key(), &vector())), "56f935c8a3ed");
        assert_eq!(short("c50a65401a32ead7"), "c50a65401a32");
    }

    fn objects() -> Vec<Source<'static>> {
        let mut sources = vector();
        sources.push(Source::Object {
            kind: ObjectKind::ConfigMap,
            name: "app",
            entries: Some(vec![("b.bin", Field::BinaryData, b"\x00\x01"), ("a.conf", Field::Data, b"x=1")]),
        });
        sources.push(Source::Object {
            kind: ObjectKind::Secret,
            name: "db",
            entries: Some(vec![("password", Field::Data, b"hunter2")]),
        });
        sources.push(Source::Object { kind: ObjectKind::ConfigMap, name: "gone", entries: None });
        sources
    }

    #[test]
    fn pinned_test_vector_with_config_maps_and_secrets() {
        // Computed independently from the documented format (Python's hmac, key bytes 0..=31).
        assert_eq!(checksum(&key(), &objects()), "v2:ae34e5e2fd5b30933d52e85d5b6b31cab878bef139c04a74ce84d62b50fdf260");
    }

    #[test]
    fn an_object_is_told_apart_by_kind_field_and_presence() {
        let object = |kind, field, entries: bool| Source::Object {
            kind,
            name: "x",
            entries: entries.then(|| vec![("k", field, b"v".as_slice())]),
        };
        let config_map = checksum(&key(), &[object(ObjectKind::ConfigMap, Field::Data, true)]);
        assert_ne!(config_map, checksum(&key(), &[object(ObjectKind::Secret, Field::Data, true)]));
        assert_ne!(config_map, checksum(&key(), &[object(ObjectKind::ConfigMap, Field::BinaryData, true)]));
        let missing = checksum(&key(), &[object(ObjectKind::ConfigMap, Field::Data, false)]);
        let empty =
            checksum(&key(), &[Source::Object { kind: ObjectKind::ConfigMap, name: "x", entries: Some(vec![]) }]);
        assert_ne!(missing, empty);
        assert_ne!(config_map, checksum(&key(), &[Source::Key { key: "x", value: Some(b"v") }]));
    }

    #[test]
    fn another_key_gives_another_checksum() {
        let other = Key::new([7; KEY_LEN]);
        assert_ne!(checksum(&other, &vector()), checksum(&key(), &vector()));
        assert_ne!(checksum(&key(), &vector()), legacy(&vector()));
        assert_eq!(format!("{:?}", key()), "Key(<redacted>)");
    }

    #[test]
    fn canonical_encoding_layout() {
        let sources = [Source::Key { key: "a", value: Some(b"xy") }, Source::Key { key: "b", value: None }];
        let enc = encode(HEADER_V1, &sources);
        let mut want = b"consulbind-checksum-v1\0".to_vec();
        want.extend_from_slice(b"K\0\0\0\0\0\0\0\x01a\x01\0\0\0\0\0\0\0\x02xy");
        want.extend_from_slice(b"K\0\0\0\0\0\0\0\x01b\x00");
        assert_eq!(enc, want);
    }

    #[test]
    fn order_of_sources_and_entries_does_not_matter() {
        let mut reversed = vector();
        reversed.reverse();
        if let Source::Prefix { entries, .. } = &mut reversed[0] {
            entries.reverse();
        }
        assert_eq!(checksum(&key(), &reversed), checksum(&key(), &vector()));
    }

    #[test]
    fn duplicate_sources_count_once() {
        let mut doubled = vector();
        doubled.push(vector()[0].clone());
        assert_eq!(checksum(&key(), &doubled), checksum(&key(), &vector()));
    }

    #[test]
    fn distinguishes_missing_empty_and_boundaries() {
        let missing = legacy(&[Source::Key { key: "k", value: None }]);
        let empty = legacy(&[Source::Key { key: "k", value: Some(b"") }]);
        assert_ne!(missing, empty);
        // Moving bytes between a key and its value must change the checksum.
        let a = legacy(&[Source::Prefix { prefix: "p/", entries: vec![("p/ab", b"c")] }]);
        let b = legacy(&[Source::Prefix { prefix: "p/", entries: vec![("p/a", b"bc")] }]);
        assert_ne!(a, b);
        // An exact key and a prefix with the same name are different sources.
        let key = legacy(&[Source::Key { key: "p", value: Some(b"") }]);
        let prefix = legacy(&[Source::Prefix { prefix: "p", entries: vec![] }]);
        assert_ne!(key, prefix);
    }
}
