//! Where a binding's content comes from: Consul keys, read with the binding's Consul settings,
//! and ConfigMaps and Secrets.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Consul key or prefix: `/`-separated segments, none empty, `.` or `..`; a prefix may end
/// with `/`. Written for the API server's regular expressions, which have no look-ahead.
pub const KEY_PATTERN: &str = r"^((?:[^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)/)*(?:[^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)?$";

/// What is wrong with a key, by the rule of [`KEY_PATTERN`], for objects the schema did not check,
/// and by Consul's own: it refuses a key with a character that does not print.
pub fn key_problem(key: &str) -> Option<String> {
    if key.len() > MAX_KEY_LENGTH {
        return Some("is longer than 512 bytes".into());
    }
    if let Some(c) = key.chars().find(|c| !prints(*c)) {
        return Some(format!(
            "contains U+{:04X}, which Consul refuses in a key (a control character, a space other than U+0020, or an \
             invisible formatting character); copied text often brings one",
            u32::from(c)
        ));
    }
    if key.starts_with('/') {
        return Some("starts with /, so Consul would read another key".into());
    }
    // A trailing `/` marks a folder prefix; every other segment must be a real name.
    let body = key.strip_suffix('/').unwrap_or(key);
    body.split('/').find_map(|segment| match segment {
        "" => Some("has an empty segment (//), so Consul would read another key, or none".into()),
        "." | ".." => Some("has a . or .. segment, so Consul would read another key, or none".into()),
        _ => None,
    })
}

/// Whether Consul takes `c` in a key: it refuses what Go's `unicode.IsPrint` does not print.
/// Unassigned code points are left to Consul, which refuses them with an answer of its own.
fn prints(c: char) -> bool {
    let format = matches!(
        c,
        '\u{ad}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{890}'..='\u{891}'
            | '\u{8e2}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{fdd0}'..='\u{fdef}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e000}'..='\u{f8ff}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e007f}'
            | '\u{f0000}'..='\u{10ffff}'
    );
    c == ' ' || !(c.is_control() || c.is_whitespace() || format || (u32::from(c) & 0xfffe) == 0xfffe)
}
/// The longest Consul key a binding may name, in bytes.
pub const MAX_KEY_LENGTH: usize = 512;

/// One Consul key, or every key under a prefix.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeySource {
    /// The Consul key, for example `app/config.json`, or a prefix such as `app/features/` when
    /// `recurse` is true. Segments are separated by `/`; none may be empty, `.` or `..`, and the
    /// key may not start with `/` (Consul would read such a key as another, or as missing). At
    /// most 512 bytes.
    #[schemars(length(min = 1, max = 512), regex(pattern = KEY_PATTERN))]
    pub key: String,

    /// Treat `key` as a prefix and bind every key below it, recursively.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recurse: bool,

    /// A missing optional key (or empty prefix) is part of the content like any value. A missing
    /// required one holds all rollouts of this binding until it exists again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// A ConfigMap or Secret in the binding's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSource {
    /// Name of the object.
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    pub name: String,

    /// Only these keys of its `data` (and of a ConfigMap's `binaryData`); the whole object when
    /// absent. At most 64, none empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub keys: Option<Vec<String>>,

    /// A missing optional object is part of the content like any data. A missing required
    /// one holds all rollouts of this binding until it exists.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// A Kubernetes object name (a DNS subdomain).
pub const NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// The kinds of Kubernetes object a binding may read besides Consul.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum ObjectKind {
    #[default]
    ConfigMap,
    Secret,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Consul settings for one binding.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsulSettings {
    /// Consul datacenter to read from. Defaults to the agent's own datacenter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datacenter: Option<String>,

    /// Consul Enterprise namespace. Sent only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// Consul Enterprise admin partition. Sent only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,

    /// A Secret in this namespace holding the ACL token to read the keys with. The Secret must
    /// carry the label `consulbind.dev/token=true`. Without it the controller's default token is
    /// used, for the key prefixes that the namespace's `consulbind.dev/default-token-prefixes`
    /// annotation (or the controller's `--default-token-prefixes`) allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,
}

/// A key in a Secret in the binding's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1))]
    pub name: String,

    /// Key within the Secret's data. Defaults to `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_consul_would_refuse_or_read_as_another_are_refused() {
        for (key, why) in [
            ("app/config\n", "U+000A"),
            ("app/\t/x", "U+0009"),
            ("app/\u{a0}config", "U+00A0"),
            ("app/con\u{200b}fig", "U+200B"),
            ("app/\u{feff}", "U+FEFF"),
            ("app/\u{e000}", "U+E000"),
            ("/app", "starts with /"),
            ("app//x", "empty segment"),
            ("app/../x", ". or .. segment"),
        ] {
            let problem = key_problem(key).unwrap_or_else(|| panic!("{key:?} was accepted"));
            assert!(problem.contains(why), "{key:?}: {problem}");
        }
        for key in ["app/config", "app/with space", "app/é/日本/🦀", "app/a?b#c%d&e+f", "app/features/", ".x/..y"]
        {
            assert_eq!(key_problem(key), None, "{key:?}");
        }
    }
}
