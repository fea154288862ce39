//! The first steps of a reconcile: check the spec, find the token, and gather what Consul and
//! the workload caches say. Nothing here writes to the cluster.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use consul_kv::{KvQuery, Scope, ScopeToken, Token};
use consulbind_api::{
    ConsulBinding, ConsulBindingSpec, KeySource, MAX_DELAY, MAX_QUIET_PERIOD, ObjectKind, ObjectSource, parse_duration,
};

use super::{
    context::Context,
    debounce::Window,
    input::{Consul, KeyContent},
};
use crate::{
    cluster::{
        Live, Version, Workload,
        health::Health,
        references::References,
        selector,
        tokens::{Lookup, TOKEN_LABEL},
        workloads::Resolved,
    },
    watches::KeyState,
};

const DEFAULT_QUIET: Duration = Duration::from_secs(2);
const DEFAULT_MAX: Duration = Duration::from_secs(30);

/// Checks what the schema cannot, and returns the debounce window.
pub fn validate(spec: &ConsulBindingSpec) -> Result<Window, String> {
    if spec.keys.is_empty() && spec.objects().next().is_none() && !spec.include_target_references {
        return Err(
            "the binding has no source: set spec.keys, spec.configMaps, spec.secrets or spec.includeTargetReferences"
                .into(),
        );
    }
    for (kind, object) in spec.objects() {
        if object.name.is_empty() || object.keys.iter().flatten().any(String::is_empty) {
            return Err(format!("each {kind} source needs a name, and none of its keys may be empty"));
        }
    }
    for source in &spec.keys {
        if let Some(problem) = consulbind_api::key_problem(&source.key) {
            return Err(format!("Consul key {:?} {problem}", source.key));
        }
    }
    // One source read two ways would count once, by whichever entry came first.
    let same_key = |a: &&KeySource, b: &&KeySource| a.key == b.key && a.recurse == b.recurse;
    if let Some(source) = listed_twice(&spec.keys.iter().collect::<Vec<_>>(), same_key) {
        let what = if source.recurse { "prefix" } else { "key" };
        return Err(format!(
            "Consul {what} {:?} is listed twice in spec.keys with different settings; list it once",
            source.key
        ));
    }
    let same_object =
        |(a, x): &(ObjectKind, &ObjectSource), (b, y): &(ObjectKind, &ObjectSource)| a == b && x.name == y.name;
    if let Some((kind, source)) = listed_twice(&spec.objects().collect::<Vec<_>>(), same_object) {
        return Err(format!(
            "{kind} {:?} is listed twice with different keys or optional; list it once, with every key it should \
             read",
            source.name
        ));
    }
    for target in &spec.targets {
        if target.name.is_some() == target.selector.is_some() {
            return Err(format!("each {} target needs exactly one of name and selector", target.kind));
        }
        if let Some(error) = selector::selector_error(target) {
            return Err(error);
        }
    }
    let rollout = spec.rollout.clone().unwrap_or_default();
    let duration = |field: &str, text: Option<String>, default, limit: Duration| {
        let Some(text) = text else { return Ok(default) };
        let value = parse_duration(&text).map_err(|e| format!("spec.rollout.{field}: {e}"))?;
        match value <= limit {
            true => Ok(value),
            false => Err(format!("spec.rollout.{field} is {text}; at most {} is allowed", human(limit))),
        }
    };
    super::staging::Staging::of(spec, &Default::default())?;
    let quiet = duration("quietPeriod", rollout.quiet_period, DEFAULT_QUIET, MAX_QUIET_PERIOD)?;
    let max = duration("maxDelay", rollout.max_delay, DEFAULT_MAX.max(quiet), MAX_DELAY)?;
    Ok(Window { quiet, max })
}

/// What a spec that earlier releases took, and newer API servers refuse, does now: it is served
/// as before, and this says how, and what to change. (A `maxDelay` shorter than `quietPeriod`
/// rolls a change `maxDelay` after it is first seen, as releases before the rule did.)
pub fn caution(spec: &ConsulBindingSpec) -> Option<String> {
    let rollout = spec.rollout.as_ref()?;
    let quiet = parse_duration(rollout.quiet_period.as_deref()?).ok()?;
    let max = parse_duration(rollout.max_delay.as_deref()?).ok()?;
    (max < quiet).then(|| {
        format!(
            "spec.rollout.maxDelay ({}) is shorter than spec.rollout.quietPeriod ({}), so the quiet period is never \
             waited for: a change rolls out maxDelay after it is first seen. API servers from Kubernetes 1.25 refuse \
             this spec at its next apply; set maxDelay to at least quietPeriod",
            rollout.max_delay.as_deref().unwrap_or_default(),
            rollout.quiet_period.as_deref().unwrap_or_default(),
        )
    })
}

/// The first entry that names the same source as an earlier one, with other settings.
fn listed_twice<T: PartialEq>(entries: &[T], same: impl Fn(&T, &T) -> bool) -> Option<&T> {
    entries.iter().enumerate().find_map(|(i, entry)| {
        entries[..i].iter().any(|earlier| same(earlier, entry) && earlier != entry).then_some(entry)
    })
}

/// A whole number of hours as `1h`, for messages.
fn human(limit: Duration) -> String {
    format!("{}h", limit.as_secs() / 3600)
}

/// Where a binding's Consul token comes from.
pub enum TokenSource {
    Default,
    Secret(Token),
    /// A problem with the Secret that a person must fix.
    Invalid(String),
    /// The default token may not read these keys for this namespace.
    Forbidden(String),
}

impl TokenSource {
    pub fn into_token(self) -> Option<Token> {
        match self {
            TokenSource::Secret(token) => Some(token),
            _ => None,
        }
    }
}

/// The token for this binding's keys: from its Secret, if it names one; otherwise the
/// controller default, where the namespace's policy lets it read these keys.
pub fn token(ctx: &Context, namespace: &str, spec: &ConsulBindingSpec) -> TokenSource {
    let Some(secret_ref) = spec.consul.as_ref().and_then(|c| c.token_secret_ref.as_ref()) else {
        return match ctx.policy.check(namespace, spec) {
            Ok(()) => TokenSource::Default,
            Err(message) => TokenSource::Forbidden(message),
        };
    };
    let key = secret_ref.key.as_deref().unwrap_or("token");
    match ctx.tokens.get(namespace, &secret_ref.name, key) {
        Lookup::Token(token) => TokenSource::Secret(Token::new(token)),
        Lookup::NoSecret => TokenSource::Invalid(format!(
            "token Secret {:?} not found in namespace {namespace}, or it lacks the label {TOKEN_LABEL}=true \
             that lets a Secret serve as a Consul token",
            secret_ref.name
        )),
        Lookup::NoKey => TokenSource::Invalid(format!(
            "token Secret {:?} has no non-empty key {key:?} (the controller reads the first {} keys of a token \
                 Secret)",
            secret_ref.name,
            crate::cluster::tokens::MAX_TOKEN_KEYS
        )),
        Lookup::Unfit => TokenSource::Invalid(format!(
            "the value of key {key:?} in token Secret {:?} is not a Consul token: it has characters no token has \
             (a space, a line break or non-ASCII inside it)",
            secret_ref.name
        )),
        Lookup::TooLarge => TokenSource::Invalid(format!(
            "the value of key {key:?} in token Secret {:?} is longer than {} bytes, more than a Consul token",
            secret_ref.name,
            crate::cluster::tokens::MAX_TOKEN_BYTES
        )),
    }
}

/// Whether a reconcile decides now, with `listing`: some cache is part-way through a list. Until
/// its last page its store holds what it listed before while the others may hold what is there
/// now, and a decision on that mix can roll a workload for a change its pods already read.
pub fn decides(listing: bool) -> bool {
    !listing
}

/// One watch query for each bound key, with the binding's Consul scope and token.
pub fn queries(spec: &ConsulBindingSpec, token: Option<Token>) -> Vec<KvQuery> {
    let consul = spec.consul.clone().unwrap_or_default();
    let scope = Arc::new(Scope {
        datacenter: consul.datacenter,
        namespace: consul.namespace,
        partition: consul.partition,
        token: token.map(ScopeToken),
    });
    spec.keys.iter().map(|k| KvQuery::new(k.key.as_str(), k.recurse).in_scope(&scope)).collect()
}

/// What Consul says for the binding; `None` while a key has had no answer yet. Content of more
/// than `max_bytes` in all is refused.
pub fn consul_view<'a>(spec: &'a ConsulBindingSpec, states: &'a [KeyState], max_bytes: u64) -> Option<Consul<'a>> {
    let mut contents = Vec::with_capacity(states.len());
    let mut bytes = 0u64;
    for (source, state) in spec.keys.iter().zip(states) {
        match state {
            KeyState::Pending => return None,
            KeyState::Failed { reason, message, .. } => {
                return Some(Consul::Failed { reason, message: format!("reading {:?}: {message}", source.key) });
            }
            KeyState::Ready(content) => {
                bytes = content.entries.iter().fold(bytes, |sum, e| sum.saturating_add(e.key.len() as u64 + e.size));
                contents.push(KeyContent {
                    source,
                    entries: &content.entries,
                    reset_hold: content.reset_hold,
                    index: content.index,
                })
            }
        }
    }
    if bytes > max_bytes {
        let message = format!(
            "the bound keys hold {bytes} bytes in all, more than the {max_bytes} bytes one binding may bind \
             (--max-binding-bytes); bind fewer or narrower prefixes, or split the binding"
        );
        return Some(Consul::Failed { reason: consulbind_api::conditions::reason::BINDING_TOO_LARGE, message });
    }
    Some(Consul::Ready(contents))
}

/// The most ConfigMaps and Secrets a binding's targets may reference, together: each is part
/// of the status.
pub const MAX_REFERENCES: usize = 64;

/// A bound ConfigMap or Secret.
pub struct Bound {
    pub kind: ObjectKind,
    pub source: ObjectSource,
    /// Bound through a target's pod template, not named in the spec.
    pub referenced: bool,
}

/// The ConfigMaps and Secrets a binding reads: those of its spec, then, with
/// `includeTargetReferences`, those its targets reference that the spec does not name.
pub fn bound_objects(spec: &ConsulBindingSpec, references: &References) -> Result<Vec<Bound>, String> {
    let mut bound: Vec<Bound> =
        spec.objects().map(|(kind, source)| Bound { kind, source: source.clone(), referenced: false }).collect();
    if !spec.include_target_references {
        return Ok(bound);
    }
    let named = |kind, name: &str| spec.objects().any(|(k, o)| k == kind && o.name == name);
    let referenced: Vec<Bound> = references
        .iter()
        .filter(|((kind, name), _)| !named(*kind, name))
        .map(|((kind, name), used)| Bound {
            kind: *kind,
            source: ObjectSource {
                name: name.clone(),
                keys: used.keys.as_ref().map(|keys| keys.iter().cloned().collect()),
                optional: used.optional,
            },
            referenced: true,
        })
        .collect();
    if referenced.len() > MAX_REFERENCES {
        return Err(format!(
            "the targets' pod templates reference {} ConfigMaps and Secrets that the spec does not name, more than \
             the {MAX_REFERENCES} a binding may read that way; name the ones that matter in spec.configMaps and \
             spec.secrets instead of spec.includeTargetReferences",
            referenced.len()
        ));
    }
    bound.extend(referenced);
    Ok(bound)
}

/// When the newest of the binding's contents was first seen.
pub fn latest_change(contents: &[KeyState]) -> Option<tokio::time::Instant> {
    contents
        .iter()
        .filter_map(|s| match s {
            KeyState::Ready(content) => Some(content.changed_at),
            _ => None,
        })
        .max()
}

/// The workload cache can lag behind a stamp this binding just made; until it catches up, what
/// was stamped is what the workload carries. Puts each stamp the cache has not seen yet into
/// `resolved.live`, and drops the rest: those the cache has caught up with, those of workloads
/// no longer found, and those of a workload made again under the same name (another uid),
/// which carries nothing of the old stamp.
pub fn trust(stamps: &mut BTreeMap<Workload, (Version, String)>, resolved: &mut Resolved) {
    trust_stamps(stamps, &resolved.versions, &mut resolved.live);
    // The cached status is of the template before the stamp.
    for workload in stamps.keys() {
        let news = Health::Progressing("its controller has not observed the new template yet".into());
        resolved.health.insert(workload.clone(), news);
    }
}

/// [`trust`] over the cached versions and annotations alone.
pub fn trust_stamps(
    stamps: &mut BTreeMap<Workload, (Version, String)>,
    versions: &BTreeMap<Workload, Version>,
    live: &mut BTreeMap<Workload, Live>,
) {
    stamps.retain(|workload, (stamped, value)| {
        let Some(cached) = versions.get(workload) else { return false };
        let behind = cached.uid == stamped.uid && cached.generation < stamped.generation;
        if behind {
            live.insert(workload.clone(), Live { value: value.clone(), owned: true, at: None });
        }
        behind
    });
}

/// Why `binding` is not served, when its namespace has more bindings than the controller serves
/// in one: the oldest are (by creation time, then name), so a new one cannot push out another.
pub fn beyond_namespace_share(
    limit: usize,
    bindings: &[Arc<impl kube::Resource>],
    binding: &ConsulBinding,
) -> Option<String> {
    if bindings.len() <= limit {
        return None;
    }
    // Counted, not sorted: every binding past the limit asks again every few seconds.
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    fn key(meta: &ObjectMeta) -> (Option<&Time>, Option<&str>) {
        (meta.creation_timestamp.as_ref(), meta.name.as_deref())
    }
    let own = key(&binding.metadata);
    let (mut count, mut older) = (0, 0);
    for b in bindings.iter().map(|b| b.meta()).filter(|b| b.namespace == binding.metadata.namespace) {
        count += 1;
        older += usize::from(key(b) < own);
    }
    (count > limit && older >= limit).then(|| {
        format!(
            "this namespace has {count} ConsulBindings, more than the {limit} the controller serves in one \
             namespace (--max-bindings-per-namespace); the oldest {limit} are served, and this one once older ones \
             are deleted, or the limit is raised"
        )
    })
}

#[cfg(test)]
mod tests {
    use consulbind_api::{RolloutPolicy, TargetRef, WorkloadKind};

    use super::*;

    #[test]
    fn an_own_stamp_is_trusted_only_on_the_object_it_was_made_on_until_the_cache_has_it() {
        let web: Workload = (WorkloadKind::Deployment, "web".into());
        let version = |uid: &str, generation| Version { uid: uid.into(), generation };
        let resolved = |cached: Option<Version>| Resolved {
            found: cached.iter().map(|_| web.clone()).collect(),
            versions: cached.into_iter().map(|v| (web.clone(), v)).collect(),
            ..Default::default()
        };
        let stamped = || BTreeMap::from([(web.clone(), (version("a", 3), "sum".to_owned()))]);

        // The cache lags behind the stamp: the stamp is what the workload carries.
        let (mut stamps, mut lagging) = (stamped(), resolved(Some(version("a", 2))));
        trust(&mut stamps, &mut lagging);
        assert_eq!(lagging.live[&web], Live { value: "sum".into(), owned: true, at: None });
        assert_eq!(stamps.len(), 1, "kept until the cache catches up");

        // Caught up: the cache speaks for itself, and the stamp is forgotten.
        let mut current = resolved(Some(version("a", 3)));
        trust(&mut stamps, &mut current);
        assert!(current.live.is_empty() && stamps.is_empty());

        // Deleted and made again under the same name: generation 1 is behind 3, but it is another
        // object, which never carried the stamp.
        let (mut stamps, mut again) = (stamped(), resolved(Some(version("b", 1))));
        trust(&mut stamps, &mut again);
        assert!(again.live.is_empty(), "a new object was taken to carry the old one's stamp");
        assert!(stamps.is_empty());

        // Gone: nothing is kept for it.
        let (mut stamps, mut gone) = (stamped(), resolved(None));
        trust(&mut stamps, &mut gone);
        assert!(stamps.is_empty());
    }

    fn spec(target: TargetRef, rollout: Option<RolloutPolicy>) -> ConsulBindingSpec {
        let keys = vec![consulbind_api::KeySource { key: "app".into(), ..Default::default() }];
        ConsulBindingSpec { keys, targets: vec![target], rollout: rollout.map(Box::new), ..Default::default() }
    }

    #[test]
    fn a_binding_needs_a_source_of_some_kind() {
        let none = ConsulBindingSpec { keys: vec![], ..spec(named(), None) };
        assert!(validate(&none).unwrap_err().contains("no source"));
        let object = consulbind_api::ObjectSource { name: "app".into(), ..Default::default() };
        assert!(validate(&ConsulBindingSpec { config_maps: vec![object.clone()], ..none.clone() }).is_ok());
        assert!(validate(&ConsulBindingSpec { secrets: vec![object], ..none }).is_ok());
    }

    fn named() -> TargetRef {
        TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), selector: None }
    }

    #[test]
    fn defaults_apply_and_durations_parse() {
        assert_eq!(validate(&spec(named(), None)), Ok(Window { quiet: DEFAULT_QUIET, max: DEFAULT_MAX }));
        let rollout =
            RolloutPolicy { quiet_period: Some("1m".into()), max_delay: Some("5m".into()), ..Default::default() };
        assert_eq!(
            validate(&spec(named(), Some(rollout))),
            Ok(Window { quiet: Duration::from_secs(60), max: Duration::from_secs(300) })
        );
    }

    #[test]
    fn durations_are_bounded_and_the_message_names_the_field() {
        let rollout = |quiet: &str, max: &str| RolloutPolicy {
            quiet_period: Some(quiet.into()),
            max_delay: Some(max.into()),
            ..Default::default()
        };
        assert_eq!(
            validate(&spec(named(), Some(rollout("1h", "24h")))),
            Ok(Window { quiet: MAX_QUIET_PERIOD, max: MAX_DELAY })
        );
        let error = validate(&spec(named(), Some(rollout("9223372036854775807s", "1m")))).unwrap_err();
        assert!(error.contains("spec.rollout.quietPeriod") && error.contains("at most 1h"), "{error}");
        let error = validate(&spec(named(), Some(rollout("1s", "24h1s")))).unwrap_err();
        assert!(error.contains("spec.rollout.maxDelay") && error.contains("at most 24h"), "{error}");
        let error = validate(&spec(named(), Some(rollout("1s", "99999999999999999999h")))).unwrap_err();
        assert!(error.contains("spec.rollout.maxDelay"), "{error}");
        // Refused at admission on a current server, and served as releases before the rule did:
        // the change rolls maxDelay after it is first seen; the binding says so.
        let taken = spec(named(), Some(rollout("1m", "30s")));
        assert_eq!(validate(&taken), Ok(Window { quiet: Duration::from_secs(60), max: Duration::from_secs(30) }));
        let said = caution(&taken).expect("a caution");
        assert!(said.contains("maxDelay (30s) is shorter than spec.rollout.quietPeriod (1m)"), "{said}");
        assert_eq!(caution(&spec(named(), Some(rollout("30s", "1m")))), None);
        assert!(validate(&spec(named(), Some(rollout("1m", "1m")))).is_ok());
    }

    #[test]
    fn keys_that_consul_would_misread_are_refused() {
        for bad in ["/app", "app//x", "./x", "app/../x", "app/.", "//", "a/../"] {
            let spec = ConsulBindingSpec {
                keys: vec![consulbind_api::KeySource { key: bad.into(), ..Default::default() }],
                ..spec(named(), None)
            };
            assert!(validate(&spec).is_err(), "{bad}");
        }
        for good in ["app", "app/", "app/x.json", ".hidden/x", "..x/y", "a/.b/", "a/b..c"] {
            let spec = ConsulBindingSpec {
                keys: vec![consulbind_api::KeySource { key: good.into(), ..Default::default() }],
                ..spec(named(), None)
            };
            assert!(validate(&spec).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_key_over_512_bytes_is_refused() {
        let key = |key: String| ConsulBindingSpec {
            keys: vec![consulbind_api::KeySource { key, ..Default::default() }],
            ..spec(named(), None)
        };
        assert!(validate(&key("k".repeat(512))).is_ok());
        assert!(validate(&key("k".repeat(513))).unwrap_err().contains("longer than 512 bytes"));
    }

    #[test]
    fn a_source_listed_twice_with_different_settings_is_refused_and_an_exact_repeat_is_not() {
        use consulbind_api::{KeySource, ObjectSource};
        let app = KeySource { key: "app".into(), ..Default::default() };
        let keys = |keys: Vec<KeySource>| ConsulBindingSpec { keys, ..spec(named(), None) };
        assert!(validate(&keys(vec![app.clone(), app.clone()])).is_ok());
        assert!(validate(&keys(vec![app.clone(), KeySource { recurse: true, ..app.clone() }])).is_ok(), "a prefix");
        let error = validate(&keys(vec![app.clone(), KeySource { optional: true, ..app }])).unwrap_err();
        assert!(error.contains(r#"Consul key "app" is listed twice"#), "{error}");

        let object = |keys: &[&str]| ObjectSource {
            name: "app".into(),
            keys: Some(keys.iter().map(|k| k.to_string()).collect()),
            ..Default::default()
        };
        let config_maps = |config_maps| ConsulBindingSpec { config_maps, ..spec(named(), None) };
        assert!(validate(&config_maps(vec![object(&["a"]), object(&["a"])])).is_ok());
        let error = validate(&config_maps(vec![object(&["a"]), object(&["b"])])).unwrap_err();
        assert!(error.contains(r#"ConfigMap "app" is listed twice"#), "{error}");
        let beside = ConsulBindingSpec { secrets: vec![object(&["b"])], ..config_maps(vec![object(&["a"])]) };
        assert!(validate(&beside).is_ok(), "a Secret of the same name is another object");
    }

    #[test]
    fn a_target_needs_exactly_one_of_name_and_selector() {
        let both = TargetRef { selector: Some(Default::default()), ..named() };
        let neither = TargetRef { name: None, ..named() };
        for target in [both, neither] {
            assert!(validate(&spec(target, None)).unwrap_err().contains("exactly one of name and selector"));
        }
    }

    #[test]
    fn the_objects_bound_are_the_specs_then_those_the_targets_reference_that_it_does_not_name() {
        use consulbind_api::ObjectSource;

        use crate::cluster::references::Use;
        let source = |name: &str| ObjectSource { name: name.into(), keys: None, optional: false };
        let mut spec = ConsulBindingSpec {
            config_maps: vec![source("app")],
            secrets: vec![source("creds")],
            include_target_references: true,
            ..Default::default()
        };
        let used = |keys: &[&str], optional| Use {
            keys: (!keys.is_empty()).then(|| keys.iter().map(|k| k.to_string()).collect()),
            optional,
        };
        let references = References::from([
            // Named in the spec already.
            ((ObjectKind::ConfigMap, "app".into()), used(&[], false)),
            // The same name, of the other kind.
            ((ObjectKind::Secret, "app".into()), used(&["token"], true)),
            ((ObjectKind::ConfigMap, "flags".into()), used(&[], false)),
        ]);
        let shown = |bound: Result<Vec<Bound>, String>| -> Vec<String> {
            let bound = bound.expect("within the limit");
            bound
                .iter()
                .map(|b| {
                    format!("{:?} {} {:?} {} {}", b.kind, b.source.name, b.source.keys, b.source.optional, b.referenced)
                })
                .collect()
        };
        assert_eq!(
            shown(bound_objects(&spec, &references)),
            [
                "ConfigMap app None false false",
                "Secret creds None false false",
                "ConfigMap flags None false true",
                "Secret app Some([\"token\"]) true true",
            ]
        );
        spec.include_target_references = false;
        assert_eq!(
            shown(bound_objects(&spec, &references)),
            ["ConfigMap app None false false", "Secret creds None false false"]
        );

        spec.include_target_references = true;
        let many = |n: usize| (0..n).map(|i| ((ObjectKind::ConfigMap, format!("cm-{i}")), used(&[], false))).collect();
        assert_eq!(bound_objects(&spec, &many(MAX_REFERENCES)).map(|b| b.len()), Ok(MAX_REFERENCES + 2));
        let refused = bound_objects(&spec, &many(MAX_REFERENCES + 1)).err().expect("over the limit");
        assert!(refused.contains("reference 65 ConfigMaps and Secrets"), "{refused}");
    }

    #[test]
    fn the_bytes_bound_count_each_keys_name_and_value_up_to_the_limit() {
        let spec = ConsulBindingSpec {
            keys: vec![consulbind_api::KeySource { key: "app/".into(), recurse: true, optional: false }],
            ..Default::default()
        };
        let path = crate::watches::path::Path::default();
        // 4 bytes of name and 10 of value, and 5 and 1.
        let entries = [consul_kv::KvEntry::new("app/", vec![0; 10], 7), consul_kv::KvEntry::new("app/x", vec![0], 8)];
        path.set_answer(&entries, false, None);
        let states = [path.state()];
        let held = |max| match consul_view(&spec, &states, max) {
            Some(Consul::Ready(_)) => Ok(()),
            Some(Consul::Failed { reason, message }) => Err((reason, message)),
            None => panic!("answered"),
        };
        assert_eq!(held(20), Ok(()), "20 bytes at most");
        let (reason, message) = held(19).unwrap_err();
        assert_eq!(reason, consulbind_api::conditions::reason::BINDING_TOO_LARGE);
        assert!(message.contains("hold 20 bytes in all, more than the 19 bytes"), "{message}");
    }

    #[test]
    fn a_cache_part_way_through_a_list_holds_every_decision() {
        assert!(!decides(true));
        assert!(decides(false));
    }

    #[test]
    fn an_object_source_needs_a_name_and_no_empty_key() {
        let with = |name: &str, keys: Option<Vec<String>>| ConsulBindingSpec {
            config_maps: vec![consulbind_api::ObjectSource { name: name.into(), keys, optional: false }],
            targets: vec![named()],
            ..Default::default()
        };
        assert!(validate(&with("app", Some(vec!["a".into()]))).is_ok());
        for spec in [with("", None), with("app", Some(vec!["a".into(), String::new()]))] {
            let refused = validate(&spec).unwrap_err();
            assert!(
                refused.contains("each ConfigMap source needs a name, and none of its keys may be empty"),
                "{refused}"
            );
        }
    }

    #[test]
    fn a_max_delay_shorter_than_the_quiet_period_is_served_with_a_caution_and_an_equal_one_is_not() {
        let rollout = |quiet: &str, max: &str| {
            spec(
                named(),
                Some(RolloutPolicy {
                    quiet_period: Some(quiet.into()),
                    max_delay: Some(max.into()),
                    ..Default::default()
                }),
            )
        };
        assert!(caution(&rollout("10s", "5s")).is_some_and(|c| c.contains("maxDelay (5s) is shorter")));
        assert_eq!(caution(&rollout("10s", "10s")), None);
        assert_eq!(caution(&rollout("5s", "10s")), None);
    }

    /// The latest change is when the newest content was first seen; a path with no content
    /// yet, or failing, adds none.
    #[test]
    fn the_latest_change_is_the_first_sight_of_the_newest_content() {
        let start = tokio::time::Instant::now();
        let ready = |secs| {
            let changed_at = start + std::time::Duration::from_secs(secs);
            let content = crate::watches::Content {
                entries: Default::default(),
                changed_at,
                reset_hold: false,
                reset_at: None,
                index: None,
            };
            KeyState::Ready(content)
        };
        let failed = || KeyState::Failed { reason: "ConsulUnavailable", message: String::new(), last: None };
        let contents = [ready(3), KeyState::Pending, ready(9), failed()];
        assert_eq!(latest_change(&contents), Some(start + std::time::Duration::from_secs(9)));
        assert_eq!(latest_change(&[KeyState::Pending, failed()]), None);
    }

    /// Each bound key is one query, in order, in the binding's Consul scope and with its token;
    /// only a token from a Secret overrides the controller's default.
    #[test]
    fn each_key_is_a_query_in_the_bindings_scope_with_its_token() {
        let keys = vec![
            KeySource { key: "app/".into(), recurse: true, ..Default::default() },
            KeySource { key: "db".into(), ..Default::default() },
        ];
        let consul = consulbind_api::ConsulSettings {
            datacenter: Some("dc2".into()),
            namespace: Some("team".into()),
            partition: Some("part".into()),
            ..Default::default()
        };
        let spec = ConsulBindingSpec { keys, consul: Some(Box::new(consul)), ..spec(named(), None) };
        let token = TokenSource::Secret(Token::new("from-secret")).into_token();
        let queries = queries(&spec, token.clone());
        let scope = Scope {
            datacenter: Some("dc2".into()),
            namespace: Some("team".into()),
            partition: Some("part".into()),
            token: token.clone().map(ScopeToken),
        };
        assert_eq!(queries, [scope.query("app/", true), scope.query("db", false)]);
        assert_eq!(queries[0].token().map(Token::expose), Some("from-secret"));
        assert!(std::ptr::eq(queries[0].scope(), queries[1].scope()), "a binding's queries share one scope");

        for source in [TokenSource::Default, TokenSource::Invalid("x".into()), TokenSource::Forbidden("x".into())] {
            assert!(source.into_token().is_none(), "only a Secret's token overrides the default");
        }
    }

    /// Over the limit, a namespace's oldest bindings are served (by creation time, then name),
    /// whatever other namespaces hold; a binding past them is told why.
    #[test]
    fn a_namespace_over_its_share_serves_its_oldest_bindings() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let binding = |namespace: &str, name: &str, secs: i64| {
            let mut binding = ConsulBinding::new(name, spec(named(), None));
            binding.metadata.namespace = Some(namespace.into());
            let at = k8s_openapi::jiff::Timestamp::from_second(secs).unwrap();
            binding.metadata.creation_timestamp = Some(Time(at));
            Arc::new(binding)
        };
        let (old, older, b_same, a_same) =
            (binding("a", "old", 20), binding("a", "older", 10), binding("a", "b", 30), binding("a", "a", 30));
        let others = [binding("b", "x", 1), binding("b", "y", 2), binding("b", "z", 3)];
        let all: Vec<_> =
            [old.clone(), older.clone(), b_same.clone(), a_same.clone()].into_iter().chain(others.clone()).collect();

        let served = |limit, binding: &ConsulBinding| beyond_namespace_share(limit, &all, binding).is_none();
        assert!(served(2, &older) && served(2, &old), "the oldest two are served");
        let refused = beyond_namespace_share(2, &all, &a_same).expect("a third is refused");
        assert!(refused.contains("has 4 ConsulBindings, more than the 2"), "{refused}");
        assert!(!served(2, &b_same));
        // Of two made in the same second, the name decides.
        assert!(served(3, &a_same) && !served(3, &b_same));
        // At the limit every one is served, though the cluster holds more.
        assert!([&old, &older, &a_same, &b_same].iter().all(|b| served(4, b)));
        // Another namespace's count does not spill over: three there, limit three.
        assert!(others.iter().all(|b| served(3, b)));
        // Fewer in all than the limit.
        assert!(served(7, &b_same));
    }
}
