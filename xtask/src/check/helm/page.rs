//! The book's Helm values page (docs/src/reference/helm-values.md), made from `values.yaml`: each
//! value with its default and the comment above it, and, for a value that sets a controller flag,
//! that flag and its help from `consulbind --help`. A value without a comment or a flag fails the
//! check, so the page says something about every value.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_yaml::Value;

use super::{CHART, FLAGS, schema};
use crate::common::repo_root;

pub fn path() -> PathBuf {
    repo_root().join("docs/src/reference/helm-values.md")
}

const HEAD: &str = "<!-- Generated from config/helm/consulbind/values.yaml by `cargo xtask helm --write`; edit that file. -->

# Helm values

The chart is `config/helm/consulbind`; installing it is in [On any cluster](../getting-started/cluster.md#2b-install-with-helm).
A value that sets a controller flag names it; the [flags](flags.md) page says more.

The chart's `values.schema.json` is made from `values.yaml` too: every value takes the type of its
default, and no object takes a key it does not declare, except those whose keys are yours (the
values whose default is an object below, such as `resources`). So `helm install`, `upgrade`,
`template` and `lint` refuse a mistyped value (`--set controller.dryRn=true`) or one of the wrong
type, and name it.

The settings go into the ConfigMap `<name>-config`, whose checksum is a pod-template annotation:
`helm upgrade` with other values rolls the controller.

| Value | Default | What it sets |
| --- | --- | --- |
";

/// The page, from values.yaml and the controller's `--help`.
pub fn generate(help: &str) -> Result<String> {
    let text = std::fs::read_to_string(repo_root().join(CHART).join("values.yaml"))?;
    let values: Value = serde_yaml::from_str(&text)?;
    let flags = flags(help);
    let mut page = HEAD.to_owned();
    let mut bare = Vec::new();
    for (path, comment) in commented(&text) {
        let value = lookup(&values, &path).with_context(|| format!("values.yaml: no {path}"))?;
        let open = schema::OPEN.contains(&path.as_str());
        if schema::OPEN.iter().any(|o| path.starts_with(&format!("{o}."))) {
            continue;
        }
        let group = matches!(value, Value::Mapping(m) if !m.is_empty()) && !open;
        let flag = FLAGS.iter().chain(MORE).find(|(v, ..)| *v == path).and_then(|(_, var, _)| flags.get(*var));
        let mut about = comment.join(" ");
        if let Some((flag, text)) = flag {
            about = format!("{about} Sets `{flag}`: {text}").trim().to_owned();
        }
        if about.is_empty() {
            if group {
                continue;
            }
            bare.push(path);
            continue;
        }
        let default = if group { String::new() } else { show(value)? };
        page += &format!("| `{path}` | {default} | {} |\n", about.replace('|', "\\|"));
    }
    if !bare.is_empty() {
        bail!("values.yaml: no comment above these, and they set no flag; say what they do: {}", bare.join(", "));
    }
    Ok(page)
}

/// Values that set a flag in a form `FLAGS` does not test as a string.
const MORE: &[(&str, &str, &str)] = &[("controller.defaultRolloutWindows", "CONSULBIND_DEFAULT_ROLLOUT_WINDOWS", "")];

/// Each key of values.yaml by its dotted path, in the file's order, with the comment lines right
/// above it (a blank line ends a comment).
fn commented(text: &str) -> Vec<(String, Vec<String>)> {
    let mut keys = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut comment = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            comment.clear();
        } else if let Some(c) = trimmed.strip_prefix('#') {
            comment.push(c.trim().to_owned());
        } else if let Some((key, _)) = trimmed.split_once(':').filter(|_| !trimmed.starts_with('-')) {
            stack.retain(|(i, _)| *i < indent);
            let path = stack.iter().map(|(_, k)| k.as_str()).chain([key]).collect::<Vec<_>>().join(".");
            stack.push((indent, key.to_owned()));
            keys.push((path, std::mem::take(&mut comment)));
        }
    }
    keys
}

fn lookup<'a>(values: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(values, |value, key| value.get(key))
}

/// A default as the page shows it: inline, as JSON would write it.
fn show(value: &Value) -> Result<String> {
    Ok(match value {
        Value::String(s) if s.is_empty() => "`\"\"`".to_owned(),
        Value::String(s) => format!("`{s}`"),
        other => format!("`{}`", serde_json::to_string(other)?),
    })
}

/// Each flag's name and help by its environment variable, from `consulbind -h`: a flag's line,
/// then its help with `[env: …]`, `[default: …]` and the like at the end.
fn flags(help: &str) -> BTreeMap<String, (String, String)> {
    let mut flags = BTreeMap::new();
    let mut lines = help.lines().map(str::trim).peekable();
    while let Some(line) = lines.next() {
        let Some(flag) = line.split([' ', ',']).find(|w| w.starts_with("--")) else { continue };
        let Some(text) = lines.peek().filter(|l| l.contains("[env: ")) else { continue };
        let (about, tail) = text.split_once(" [env: ").unwrap_or_default();
        let var = tail.split(['=', ']']).next().unwrap_or_default();
        let mut about = if about.ends_with('.') { about.to_owned() } else { format!("{about}.") };
        // "Elect a leader" reads on after "Sets `--leader-elect`:" as "elect a leader".
        if about.chars().nth(1).is_some_and(char::is_lowercase) {
            about.replace_range(..1, &about[..1].to_lowercase());
        }
        flags.insert(var.to_owned(), (flag.to_owned(), about));
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_takes_the_comment_right_above_it_and_its_parents_path() {
        let text =
            "# the file\n\n# outer\nouter:\n  # inner one\n  # and more\n  inner: 1\n  bare: 2\n# top\ntop: []\n";
        let keys = commented(text);
        let want = [
            ("outer", vec!["outer"]),
            ("outer.inner", vec!["inner one", "and more"]),
            ("outer.bare", vec![]),
            ("top", vec!["top"]),
        ];
        let want: Vec<(String, Vec<String>)> =
            want.iter().map(|(p, c)| (p.to_string(), c.iter().map(|s| s.to_string()).collect())).collect();
        assert_eq!(keys, want);
    }

    #[test]
    fn a_flag_is_read_with_its_help_and_environment_variable() {
        let help = "      --consul-wait <CONSUL_WAIT>\n          How long one query waits [env: CONSULBIND_CONSUL_WAIT=] [default: 5m]\n";
        let flags = flags(help);
        assert_eq!(flags["CONSULBIND_CONSUL_WAIT"], ("--consul-wait".into(), "how long one query waits.".into()));
    }
}
