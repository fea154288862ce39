//! A key its token may not read, granted later: the status tells the truth within 15 s.

use std::time::Duration;

use consulbind_api::conditions::{self, reason};
use serde_json::json;

use crate::{
    acl::Acl,
    support::{self, Scene, deploy},
};

/// 25 keys in one shared read, the last optional, absent and denied by the token's policy. Once
/// the policy grants it, and with no other write to Consul, the binding is Ready within 15 s and
/// nothing rolls (the key's content did not change); writing the key then rolls once.
#[tokio::test]
async fn a_denied_key_of_a_shared_read_is_served_within_15_s_of_its_grant_and_rolls_nothing() {
    let (acl_addr, master) =
        support::acl_consul().expect("CONSULBIND_E2E_ACL_ADDR and CONSULBIND_E2E_ACL_TOKEN must be set");
    // Few blocking slots: the namespace's keys share one recursive read.
    let args = [format!("--consul-http-addr={acl_addr}"), "--consul-max-connections=4".into()];
    let Some(s) = Scene::with_args("acl-grant-15s", &[&args[0], &args[1]]).await else { return };
    let acl = Acl::new(&acl_addr, master);
    let keys: Vec<String> = (0..25).map(|i| s.key(&format!("k{i:02}"))).collect();
    for key in &keys[..24] {
        acl.put(key, "v1").await;
    }
    let prefix = format!("{}/", s.ns);
    let token = acl.read_token(&prefix).await;
    acl.deny(&prefix, &keys[24]).await;
    let metadata = json!({"name": "token", "labels": {"consulbind.dev/token": "true"}});
    s.apply(json!({"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "stringData": {"token": token}}))
        .await
        .unwrap();
    s.workload("Deployment", "web", json!({})).await;
    let mut bound: Vec<serde_json::Value> = keys[..24].iter().map(|k| json!({"key": k})).collect();
    bound.push(json!({"key": keys[24], "optional": true}));
    let spec = json!({"keys": bound, "targets": deploy("web"), "rollout": {"quietPeriod": "0s"},
                      "consul": {"tokenSecretRef": {"name": "token"}}});
    s.binding("cfg", spec).await;
    let synced = s.wait_message("cfg", conditions::CONSUL_SYNCED, "False", reason::ACCESS_DENIED).await;
    assert!(synced.contains(&keys[24]), "{synced}");
    // Denied for a while, as it would be in a cluster, before anyone grants it.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let generation = s.generation("web").await;

    acl.grant(&prefix).await;
    let granted = tokio::time::Instant::now();
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let shown = granted.elapsed();
    assert!(shown <= Duration::from_secs(15), "Ready {shown:?} after the grant\n{}", s.log());
    s.wait_condition("cfg", conditions::CONSUL_SYNCED, "True", reason::SYNCED).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, generation, "the grant rolled the workload");

    acl.put(&keys[24], "v1").await;
    s.wait_condition("cfg", conditions::READY, "True", reason::UP_TO_DATE).await;
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, generation + 1, "the key written: one rollout");
    s.finish().await;
}

/// The token Secret replaced by one whose policy grants the key: served within 15 s, with no
/// rollout.
#[tokio::test]
async fn a_token_secret_replaced_by_one_with_the_grant_is_served_within_15_s() {
    let (acl_addr, master) =
        support::acl_consul().expect("CONSULBIND_E2E_ACL_ADDR and CONSULBIND_E2E_ACL_TOKEN must be set");
    let args = [format!("--consul-http-addr={acl_addr}"), "--consul-max-connections=4".into()];
    let Some(s) = Scene::with_args("acl-grant-token", &[&args[0], &args[1]]).await else { return };
    let acl = Acl::new(&acl_addr, master);
    let (open, absent) = (s.key("open"), s.key("absent"));
    acl.put(&open, "v1").await;
    // Two policies: the first token's reads `open` alone, the second's the namespace's keys.
    let refused =
        acl.token_with(&format!("e2e-{}-open", s.ns), &format!("key \"{open}\" {{ policy = \"read\" }}")).await;
    let allowed = acl.read_token(&format!("{}/", s.ns)).await;
    let secret = crate::support::token_secret;
    s.apply(secret(&refused)).await.unwrap();
    s.workload("Deployment", "web", json!({})).await;
    let keys = json!([{"key": open}, {"key": absent, "optional": true}]);
    let spec = json!({"keys": keys, "targets": deploy("web"), "rollout": {"quietPeriod": "0s"},
                      "consul": {"tokenSecretRef": {"name": "token"}}});
    s.binding("cfg", spec).await;
    s.wait_condition("cfg", conditions::CONSUL_SYNCED, "False", reason::ACCESS_DENIED).await;
    let generation = s.generation("web").await;

    s.apply(secret(&allowed)).await.unwrap();
    let replaced = tokio::time::Instant::now();
    s.wait_condition("cfg", conditions::READY, "True", reason::BASELINED).await;
    let shown = replaced.elapsed();
    assert!(shown <= Duration::from_secs(15), "Ready {shown:?} after the Secret was replaced\n{}", s.log());
    tokio::time::sleep(support::SETTLE).await;
    assert_eq!(s.generation("web").await, generation, "a new token rolled the workload");
    s.finish().await;
}
