//! KV request and response types, and the pure parts of a request: its URL,
//! its timeout and the parsing of its body.

use std::{borrow::Cow, sync::Arc, time::Duration};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use reqwest::Url;
use serde::Deserialize;

use crate::{Error, Token};

/// What to read. Equal queries can share one watch, so this is `Hash + Eq`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KvQuery {
    /// The key, or the prefix when `recurse` is set. An empty prefix is the whole KV store.
    pub key: Arc<str>,
    /// Read every key that starts with `key`. This is a string prefix, so
    /// `app` also matches `apple`; end prefixes with `/` to mean a folder.
    pub recurse: bool,
    /// `None` for the agent's own datacenter, namespace and partition and the client's token,
    /// as most queries read. Shared by clones: a watch holds a query for every key.
    scope: Option<Arc<Scope>>,
}

/// The scope of a query that names none.
static AGENT: Scope = Scope { datacenter: None, namespace: None, partition: None, token: None };

impl KvQuery {
    /// One exact key.
    pub fn exact(key: impl AsRef<str>) -> Self {
        Self { key: key.as_ref().into(), ..Self::default() }
    }

    /// Every key under a prefix.
    pub fn prefix(prefix: impl AsRef<str>) -> Self {
        Self { key: prefix.as_ref().into(), recurse: true, ..Self::default() }
    }

    /// A read of `key`, or of every key under it when `recurse` is set, in the agent's scope.
    pub fn new(key: impl Into<Arc<str>>, recurse: bool) -> Self {
        Self { key: key.into(), recurse, scope: None }
    }

    /// A read of `key` in the same scope.
    pub fn beside(&self, key: impl Into<Arc<str>>, recurse: bool) -> Self {
        Self { key: key.into(), recurse, scope: self.scope.clone() }
    }

    /// The same read in `scope`, which queries may share.
    pub fn in_scope(mut self, scope: &Arc<Scope>) -> Self {
        self.scope = (**scope != AGENT).then(|| scope.clone());
        self
    }

    /// The same read with `token` in place of the client's.
    pub fn with_token(self, token: Token) -> Self {
        let scope = Scope { token: Some(ScopeToken(token)), ..self.scope().clone() };
        self.in_scope(&Arc::new(scope))
    }

    pub fn scope(&self) -> &Scope {
        self.scope.as_deref().unwrap_or(&AGENT)
    }

    /// The token that overrides the client's, if any.
    pub fn token(&self) -> Option<&Token> {
        self.scope().token.as_ref().map(|t| &t.0)
    }
}

/// The part of a query that decides whether two paths may share a blocking query: ACLs filter
/// per token, and the other fields pick another data set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    pub datacenter: Option<String>,
    pub namespace: Option<String>,
    pub partition: Option<String>,
    pub token: Option<ScopeToken>,
}

/// A token that orders scopes without ever printing them.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ScopeToken(pub Token);

impl std::fmt::Debug for ScopeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialOrd for ScopeToken {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ScopeToken {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.expose().cmp(other.0.expose())
    }
}

impl Scope {
    /// The query that reads `key` in this scope.
    pub fn query(&self, key: impl Into<Arc<str>>, recurse: bool) -> KvQuery {
        KvQuery::new(key, recurse).in_scope(&Arc::new(self.clone()))
    }
}

/// One key's entry. Key and value are shared, not copied, by clones: a caller may keep the same
/// entry under many overlapping prefixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEntry {
    pub key: Arc<str>,
    /// The raw value (a key stored with no value, Consul's `null`, reads as empty), or what a
    /// caller keeps in its place: see [`KvEntry::digested`].
    pub value: Arc<[u8]>,
    /// The length of the raw value.
    pub size: u64,
    pub modify_index: u64,
}

impl KvEntry {
    pub fn new(key: impl Into<Arc<str>>, value: impl Into<Vec<u8>>, modify_index: u64) -> Self {
        let value = value.into();
        Self { key: key.into(), size: value.len() as u64, value: value.into(), modify_index }
    }

    /// The entry with its value replaced by `digest` of it, keeping its size: for callers that
    /// only ever compare values.
    pub fn digested<D: Into<Arc<[u8]>>>(self, digest: impl FnOnce(&[u8]) -> D) -> Self {
        Self { value: digest(&self.value).into(), ..self }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvResponse {
    /// `X-Consul-Index`. Pass it through [`crate::index::next`] before reusing it.
    pub index: u64,
    /// Sorted by key. Empty when nothing matched; at most one entry without `recurse`.
    pub entries: Vec<KvEntry>,
}

impl KvResponse {
    /// Whether both hold the same keys and values. Indexes are ignored on
    /// purpose: rewriting the same bytes bumps them without changing anything.
    pub fn same_contents(&self, other: &KvResponse) -> bool {
        same_entries(&self.entries, &other.entries)
    }
}

/// Whether two sorted entry lists hold the same keys and values, whatever their indexes.
pub fn same_entries(a: &[KvEntry], b: &[KvEntry]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.key == b.key && a.value == b.value)
}

/// The URL of a KV read. Index 0 is a plain read; index >= 1 makes it a
/// blocking query that Consul holds for up to `wait`.
pub(crate) fn kv_url(base: &Url, query: &KvQuery, index: u64, wait: Duration) -> Url {
    let mut url = key_url(base, &query.key);
    {
        let mut params = url.query_pairs_mut();
        let scope = query.scope();
        let optional = [("dc", &scope.datacenter), ("ns", &scope.namespace), ("partition", &scope.partition)];
        for (name, value) in optional {
            if let Some(value) = value {
                params.append_pair(name, value);
            }
        }
        if query.recurse {
            params.append_key_only("recurse");
        }
        if index >= 1 {
            params.append_pair("index", &index.to_string());
            params.append_pair("wait", &format!("{}ms", wait.as_millis()));
        }
    }
    // query_pairs_mut leaves a bare "?" behind when nothing was appended.
    if url.query() == Some("") {
        url.set_query(None);
    }
    url
}

/// `<base>/v1/kv/<key>`, each key segment percent-encoded and `/` kept.
pub(crate) fn key_url(base: &Url, key: &str) -> Url {
    api_url(base, ["kv"].into_iter().chain(key.split('/')))
}

/// `<base>/v1/<segments>`, each segment percent-encoded; `base` may carry a path of its own.
pub(crate) fn api_url<'a>(base: &Url, segments: impl IntoIterator<Item = &'a str>) -> Url {
    let mut url = base.clone();
    url.path_segments_mut().expect("http(s) URLs always have a path").pop_if_empty().push("v1").extend(segments);
    url
}

/// How long to wait for a response before calling Consul unreachable.
/// Consul adds up to wait/16 of jitter to a blocking query and answers a
/// little late under load, so anything shorter cuts healthy long polls.
pub(crate) fn request_timeout(blocking_wait: Option<Duration>) -> Duration {
    const MARGIN: Duration = Duration::from_secs(5);
    // Short, so that a hung agent shows within seconds; a large prefix still reads in far less.
    const NON_BLOCKING: Duration = Duration::from_secs(10);
    match blocking_wait {
        Some(wait) => wait + wait / 16 + MARGIN,
        None => NON_BLOCKING,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawEntry<'a> {
    /// Borrowed from the answer unless escaped (base64 values never are): a shared read answers
    /// a thousand keys, and each would otherwise be allocated twice before any is kept.
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    value: Option<Cow<'a, str>>,
    modify_index: u64,
}

/// What a caller keeps of each value in its place; see [`KvEntry::digested`].
pub type Digest = Arc<dyn Fn(&[u8]) -> Arc<[u8]> + Send + Sync>;

/// Parses the JSON array of a 200 response into entries sorted by key, each value replaced by
/// `digest` of it as soon as it is decoded, when given.
pub(crate) fn parse_entries(body: &[u8], digest: Option<&Digest>) -> Result<Vec<KvEntry>, Error> {
    let raw: Vec<RawEntry<'_>> = serde_json::from_slice(body)
        .map_err(|e| Error::Protocol(format!("KV response is not a JSON entry list: {e}")))?;
    // One buffer decodes every value; only what is kept of it is allocated.
    let mut decoded = Vec::new();
    let mut entries = raw
        .into_iter()
        .map(|entry| {
            decoded.clear();
            if let Some(encoded) = entry.value.as_deref() {
                STANDARD
                    .decode_vec(encoded, &mut decoded)
                    .map_err(|_| Error::Protocol(format!("value of key {:?} is not valid base64", entry.key)))?;
            }
            let value = match digest {
                Some(digest) => digest(&decoded),
                None => Arc::from(&decoded[..]),
            };
            Ok(KvEntry {
                key: Arc::from(&*entry.key),
                value,
                size: decoded.len() as u64,
                modify_index: entry.modify_index,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_in_the_agents_scope_equals_one_that_names_none() {
        use std::hash::BuildHasher;
        let named = KvQuery::exact("k").in_scope(&Arc::new(Scope::default()));
        assert_eq!(named, KvQuery::exact("k"));
        let state = std::collections::hash_map::RandomState::new();
        assert_eq!(state.hash_one(&named), state.hash_one(KvQuery::exact("k")));
        let other = KvQuery::exact("k").with_token(Token::new("t"));
        assert_ne!(other, KvQuery::exact("k"));
        assert_eq!(other.beside("j", true).token().map(Token::expose), Some("t"), "a read beside keeps the scope");
        assert_eq!(other.beside("j", true).key.as_ref(), "j");
    }

    fn base() -> Url {
        Url::parse("http://127.0.0.1:8500").unwrap()
    }

    const WAIT: Duration = Duration::from_secs(300);

    #[test]
    fn plain_read_has_no_query() {
        let url = kv_url(&base(), &KvQuery::exact("app/db"), 0, WAIT);
        assert_eq!(url.as_str(), "http://127.0.0.1:8500/v1/kv/app/db");
    }

    #[test]
    fn blocking_read_sends_index_and_wait() {
        let url = kv_url(&base(), &KvQuery::exact("app/db"), 42, WAIT);
        assert_eq!(url.as_str(), "http://127.0.0.1:8500/v1/kv/app/db?index=42&wait=300000ms");
    }

    #[test]
    fn optional_params_only_when_set() {
        let query = Scope { datacenter: Some("dc2".into()), partition: Some("team-a".into()), ..Scope::default() }
            .query("app/", true);
        let url = kv_url(&base(), &query, 1, Duration::from_secs(10));
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:8500/v1/kv/app/?dc=dc2&partition=team-a&recurse&index=1&wait=10000ms"
        );
        let query = Scope { namespace: Some("ns1".into()), ..Scope::default() }.query("k", false);
        let url = kv_url(&base(), &query, 0, WAIT);
        assert_eq!(url.as_str(), "http://127.0.0.1:8500/v1/kv/k?ns=ns1");
    }

    #[test]
    fn empty_prefix_is_the_kv_root() {
        let url = kv_url(&base(), &KvQuery::prefix(""), 0, WAIT);
        assert_eq!(url.as_str(), "http://127.0.0.1:8500/v1/kv/?recurse");
    }

    #[test]
    fn key_segments_are_percent_encoded() {
        let url = key_url(&base(), "my app/a b?c#d%e");
        assert_eq!(url.path(), "/v1/kv/my%20app/a%20b%3Fc%23d%25e");
        assert_eq!(url.query(), None);
    }

    #[test]
    fn base_path_is_kept() {
        let base = Url::parse("https://proxy.example/consul/").unwrap();
        assert_eq!(key_url(&base, "k").as_str(), "https://proxy.example/consul/v1/kv/k");
    }

    #[test]
    fn timeout_outlasts_a_blocking_wait() {
        let five_min = Duration::from_secs(300);
        assert_eq!(request_timeout(Some(five_min)), five_min + Duration::from_millis(18_750) + Duration::from_secs(5));
        assert_eq!(request_timeout(Some(Duration::from_secs(16))), Duration::from_secs(22));
        assert_eq!(request_timeout(None), Duration::from_secs(10));
    }

    #[test]
    fn parses_entries_sorted_with_null_values() {
        let body = br#"[
            {"LockIndex":0,"Key":"app/b","Flags":0,"Value":"aGVsbG8=","CreateIndex":5,"ModifyIndex":9},
            {"LockIndex":0,"Key":"app/","Flags":0,"Value":null,"CreateIndex":4,"ModifyIndex":4},
            {"Key":"app/a","Value":"","ModifyIndex":7}
        ]"#;
        let entries = parse_entries(body, None).unwrap();
        let keys: Vec<_> = entries.iter().map(|e| &*e.key).collect();
        assert_eq!(keys, ["app/", "app/a", "app/b"]);
        assert_eq!(&*entries[0].value, b"");
        assert_eq!(&*entries[1].value, b"");
        assert_eq!(&*entries[2].value, b"hello");
        assert_eq!(entries[2].modify_index, 9);
    }

    #[test]
    fn escaped_keys_and_digested_values_keep_what_consul_sent() {
        // An escape cannot be borrowed from the answer; a value decoded into the shared buffer
        // must not leak into the next entry.
        let body = br#"[
            {"Key":"app/caf\u00e9 \"x\"","Value":"bG9uZyB2YWx1ZQ==","ModifyIndex":3},
            {"Key":"app/short","Value":"YQ==","ModifyIndex":4},
            {"Key":"app/none","Value":null,"ModifyIndex":5}
        ]"#;
        let digest: Digest = Arc::new(|v: &[u8]| Arc::from(format!("<{}>", String::from_utf8_lossy(v)).into_bytes()));
        let entries = parse_entries(body, Some(&digest)).unwrap();
        let got: Vec<_> = entries.iter().map(|e| (&*e.key, &*e.value, e.size)).collect();
        assert_eq!(
            got,
            [("app/café \"x\"", &b"<long value>"[..], 10), ("app/none", &b"<>"[..], 0), ("app/short", &b"<a>"[..], 1),]
        );
    }

    #[test]
    fn same_contents_ignores_indexes() {
        let entry = |key: &str, value: &[u8], modify_index| KvEntry::new(key, value, modify_index);
        let a = KvResponse { index: 5, entries: vec![entry("k", b"v", 5)] };
        let rewritten = KvResponse { index: 9, entries: vec![entry("k", b"v", 9)] };
        let changed = KvResponse { index: 9, entries: vec![entry("k", b"w", 9)] };
        let missing = KvResponse { index: 9, entries: vec![] };
        assert!(a.same_contents(&rewritten));
        assert!(!a.same_contents(&changed));
        assert!(!a.same_contents(&missing));
    }

    #[test]
    fn rejects_bad_json_and_bad_base64() {
        let err = parse_entries(b"{\"not\":\"a list\"}", None).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Protocol);
        let err = parse_entries(br#"[{"Key":"k","Value":"!!","ModifyIndex":1}]"#, None).unwrap_err();
        assert!(err.to_string().contains("\"k\""), "{err}");
    }
}
