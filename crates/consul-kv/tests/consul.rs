//! Integration tests against a real Consul agent.
//!
//! - `CONSUL_HTTP_ADDR`: a dev agent (`consul agent -dev`). Unset means skip,
//!   unless `CI=true` or `CONSULBIND_E2E=1`, which make it required.
//! - `CONSULBIND_E2E_ACL_ADDR` and `CONSULBIND_E2E_ACL_TOKEN`: a second agent with
//!   ACLs in default-deny mode and its management token; required like the first.
//!
//! Each test writes under its own prefix, so they can run in parallel.

use std::time::{Duration, Instant};

use consul_kv::{Client, ClientConfig, ErrorKind, KvQuery, KvResponse, Token, index};

const WAIT: Duration = Duration::from_secs(10);

async fn plain_client() -> Option<Client> {
    if std::env::var("CONSUL_HTTP_ADDR").is_ok_and(|a| !a.is_empty()) {
        let config = ClientConfig { wait: WAIT, ..ClientConfig::from_env().expect("the CONSUL_* variables are valid") };
        return Some(Client::new(config).await.unwrap());
    }
    let var = |name| std::env::var(name).unwrap_or_default();
    if var("CI") == "true" || var("CONSULBIND_E2E") == "1" {
        panic!(
            "CONSUL_HTTP_ADDR is not set, but CI=true or CONSULBIND_E2E=1 requires these \
             tests: start `consul agent -dev` and set CONSUL_HTTP_ADDR=http://127.0.0.1:8500"
        );
    }
    eprintln!("skipping: set CONSUL_HTTP_ADDR to run the Consul integration tests");
    None
}

/// A prefix no other test (or test run) uses.
fn prefix(test: &str) -> String {
    format!("consul-kv-test/{}/{test}/", std::process::id())
}

/// (key, value) pairs, to compare without indexes.
fn values(response: &KvResponse) -> Vec<(&str, &[u8])> {
    let pairs = response.entries.iter();
    pairs.map(|e| (&*e.key, &e.value[..])).collect()
}

#[tokio::test]
async fn put_get_delete_roundtrip() {
    let Some(client) = plain_client().await else {
        return;
    };
    let prefix = prefix("roundtrip");
    // Spaces, reserved URL characters and non-ASCII must survive the path encoding.
    let key = format!("{prefix}a b?c#d%e/ключ");
    let value = b"binary \x00\xff value";

    client.put(&key, value, None).await.unwrap();
    let response = client.get(&KvQuery::exact(&key), 0).await.unwrap();
    assert!(response.index >= 1);
    assert_eq!(values(&response), [(key.as_str(), &value[..])]);

    client.delete(&key, false, None).await.unwrap();
    let response = client.get(&KvQuery::exact(&key), 0).await.unwrap();
    assert!(response.entries.is_empty());
}

#[tokio::test]
async fn missing_key_is_empty_with_an_index() {
    let Some(client) = plain_client().await else {
        return;
    };
    let query = KvQuery::exact(format!("{}missing", prefix("missing")));
    let response = client.get(&query, 0).await.unwrap();
    assert!(response.entries.is_empty());
    assert!(response.index >= 1, "a 404 still carries X-Consul-Index");
}

#[tokio::test]
async fn blocking_get_wakes_on_write() {
    let Some(client) = plain_client().await else {
        return;
    };
    let key = format!("{}key", prefix("blocking"));
    client.put(&key, b"v1", None).await.unwrap();
    let first = client.get(&KvQuery::exact(&key), 0).await.unwrap();

    let writer = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            client.put(&key, b"v2", None).await.unwrap();
        })
    };
    let started = Instant::now();
    let idx = index::next(0, first.index);
    let second = client.get(&KvQuery::exact(&key), idx).await.unwrap();
    writer.await.unwrap();

    assert!(started.elapsed() < WAIT, "woke by the write, not the wait");
    assert!(second.index > first.index);
    assert_eq!(values(&second), [(key.as_str(), &b"v2"[..])]);
    client.delete(&prefix("blocking"), true, None).await.unwrap();
}

#[tokio::test]
async fn blocking_get_returns_unchanged_after_wait() {
    let Some(address) = plain_client().await.map(|c| c.address().to_owned()) else {
        return;
    };
    let config = ClientConfig { address, wait: Duration::from_secs(1), ..ClientConfig::from_env().unwrap() };
    let client = Client::new(config).await.unwrap();
    // Nobody writes this key, but other tests do write elsewhere.
    let key = format!("{}quiet", prefix("wait"));
    client.put(&key, b"same", None).await.unwrap();
    let first = client.get(&KvQuery::exact(&key), 0).await.unwrap();

    let started = Instant::now();
    let second = client.get(&KvQuery::exact(&key), first.index).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(second.index, first.index);
    assert_eq!(second, first);
    client.delete(&prefix("wait"), true, None).await.unwrap();
}

#[tokio::test]
async fn recurse_returns_sorted_entries_under_the_prefix() {
    let Some(client) = plain_client().await else {
        return;
    };
    let prefix = prefix("recurse");
    for key in ["c", "a", "b/x"] {
        client.put(&format!("{prefix}{key}"), key.as_bytes(), None).await.unwrap();
    }
    // A sibling that shares the prefix text but not the trailing slash.
    let sibling = format!("{}-sibling", prefix.trim_end_matches('/'));
    client.put(&sibling, b"no", None).await.unwrap();

    let response = client.get(&KvQuery::prefix(&prefix), 0).await.unwrap();
    let keys: Vec<_> = response.entries.iter().map(|e| e.key.to_string()).collect();
    assert_eq!(keys, [format!("{prefix}a"), format!("{prefix}b/x"), format!("{prefix}c")]);
    assert_eq!(&*response.entries[1].value, b"b/x");

    client.delete(&prefix, true, None).await.unwrap();
    client.delete(&sibling, false, None).await.unwrap();
    let response = client.get(&KvQuery::prefix(&prefix), 0).await.unwrap();
    assert!(response.entries.is_empty());
}

/// A rewrite of the same bytes is not a change. Consul 1.8.7 itself skips
/// identical writes (the index stays put), but callers compare contents anyway.
#[tokio::test]
async fn rewriting_same_bytes_keeps_contents() {
    let Some(client) = plain_client().await else {
        return;
    };
    let key = format!("{}key", prefix("rewrite"));
    client.put(&key, b"same", None).await.unwrap();
    let before = client.get(&KvQuery::exact(&key), 0).await.unwrap();
    client.put(&key, b"same", None).await.unwrap();
    let after = client.get(&KvQuery::exact(&key), 0).await.unwrap();

    assert!(after.index >= before.index);
    assert!(after.same_contents(&before));
    client.delete(&key, false, None).await.unwrap();
}

/// Why callers must compare contents: deleting and recreating a key with the
/// same bytes moves every index but leaves the contents as they were.
#[tokio::test]
async fn recreating_same_bytes_changes_index_not_contents() {
    let Some(client) = plain_client().await else {
        return;
    };
    let key = format!("{}key", prefix("recreate"));
    client.put(&key, b"same", None).await.unwrap();
    let before = client.get(&KvQuery::exact(&key), 0).await.unwrap();
    client.delete(&key, false, None).await.unwrap();
    client.put(&key, b"same", None).await.unwrap();
    let after = client.get(&KvQuery::exact(&key), 0).await.unwrap();

    assert!(after.index > before.index);
    assert!(after.entries[0].modify_index > before.entries[0].modify_index);
    assert_ne!(after, before, "KvResponse equality includes indexes");
    assert!(after.same_contents(&before));
    client.delete(&key, false, None).await.unwrap();
}

/// Why callers must compare contents: a watch on a missing key wakes on writes elsewhere.
#[tokio::test]
async fn missing_key_watch_wakes_on_unrelated_write() {
    let Some(client) = plain_client().await else {
        return;
    };
    let prefix = prefix("missing-wakes");
    let query = KvQuery::exact(format!("{prefix}missing"));
    let first = client.get(&query, 0).await.unwrap();

    let writer = {
        let (client, other) = (client.clone(), format!("{prefix}other"));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            client.put(&other, b"x", None).await.unwrap();
        })
    };
    let started = Instant::now();
    let second = client.get(&query, index::next(0, first.index)).await.unwrap();
    writer.await.unwrap();

    assert!(started.elapsed() < WAIT);
    assert!(second.index > first.index);
    assert!(second.entries.is_empty() && second.same_contents(&first));
    client.delete(&prefix, true, None).await.unwrap();
}

/// The ACL agent and its management token, or `None` to skip.
async fn acl_agent() -> Option<(Client, Token)> {
    let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
    let (Some(address), Some(token)) = (var("CONSULBIND_E2E_ACL_ADDR"), var("CONSULBIND_E2E_ACL_TOKEN")) else {
        let required = var("CI").as_deref() == Some("true") || var("CONSULBIND_E2E").as_deref() == Some("1");
        assert!(
            !required,
            "CONSULBIND_E2E_ACL_ADDR and CONSULBIND_E2E_ACL_TOKEN are not set, but CI=true or CONSULBIND_E2E=1 \
             requires the ACL tests: run them through `cargo xtask test`"
        );
        eprintln!("skipping: set CONSULBIND_E2E_ACL_ADDR and CONSULBIND_E2E_ACL_TOKEN for ACL tests");
        return None;
    };
    // No default token: each request chooses its own.
    let config = ClientConfig { address, wait: WAIT, ..Default::default() };
    Some((Client::new(config).await.unwrap(), Token::new(token)))
}

#[tokio::test]
async fn acl_denied_errors_never_show_the_token() {
    let Some((client, management)) = acl_agent().await else {
        return;
    };
    let prefix = prefix("acl-denied");
    let key = format!("{prefix}secret");
    client.put(&key, b"v", Some(&management)).await.unwrap();

    let unknown = Token::new("00000000-0000-4000-8000-00000000dead");
    for (token, expected) in [(None, "Permission denied"), (Some(&unknown), "ACL not found")] {
        let query = token.cloned().map_or(KvQuery::exact(key.as_str()), |t| KvQuery::exact(key.as_str()).with_token(t));
        let err = client.get(&query, 0).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
        let text = format!("{err} {err:?}");
        assert!(text.contains(expected) && text.contains(&key), "{text}");
        assert!(!text.contains(management.expose()), "{text}");
        assert!(!text.contains(unknown.expose()), "{text}");
    }

    let err = client.put(&key, b"w", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied);
    assert!(err.to_string().contains("write policy"), "{err}");
    client.delete(&prefix, true, Some(&management)).await.unwrap();
}

#[tokio::test]
async fn acl_token_grants_access() {
    let Some((client, management)) = acl_agent().await else {
        return;
    };
    let key = format!("{}key", prefix("acl-granted"));
    client.put(&key, b"v", Some(&management)).await.unwrap();

    let query = KvQuery::exact(key.as_str()).with_token(management.clone());
    let response = client.get(&query, 0).await.unwrap();
    assert_eq!(values(&response), [(key.as_str(), &b"v"[..])]);

    // The same token as the client's default works too.
    let config =
        ClientConfig { address: client.address().to_owned(), token: Some(management.clone()), ..Default::default() };
    let default_token_client = Client::new(config).await.unwrap();
    let response = default_token_client.get(&KvQuery::exact(&key), 0).await.unwrap();
    assert_eq!(response.entries.len(), 1);
    client.delete(&key, false, Some(&management)).await.unwrap();
}

/// Consul filters recursive reads by ACL silently: no 403, just fewer entries.
#[tokio::test]
async fn acl_recurse_without_permission_is_silently_empty() {
    let Some((client, management)) = acl_agent().await else {
        return;
    };
    let prefix = prefix("acl-recurse");
    client.put(&format!("{prefix}k"), b"v", Some(&management)).await.unwrap();

    let response = client.get(&KvQuery::prefix(&prefix), 0).await.unwrap();
    assert!(response.entries.is_empty());

    let unknown = KvQuery::prefix(prefix.as_str()).with_token(Token::new("00000000-0000-4000-8000-00000000beef"));
    let err = client.get(&unknown, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "an unknown token is still refused");
    client.delete(&prefix, true, Some(&management)).await.unwrap();
}
