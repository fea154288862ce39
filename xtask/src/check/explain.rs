//! The `kubectl explain` check of `cargo xtask test`: on the running 1.20 API server, every field
//! of the ConsulBinding has a type and a description, and explain descends into every object.

use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::env::Env;
use crate::process::capture;

/// Paths to explain one level at a time, with a field of each and the type kubectl must show.
const PATHS: [(&str, &str, &str); 11] = [
    ("consulbinding", "spec", "<Object>"),
    ("consulbinding.spec", "consul", "<Object>"),
    ("consulbinding.spec", "keys", "<[]Object>"),
    ("consulbinding.spec.consul", "tokenSecretRef", "<Object>"),
    ("consulbinding.spec.consul.tokenSecretRef", "key", "<string>"),
    ("consulbinding.spec.rollout", "quietPeriod", "<string>"),
    ("consulbinding.spec.targets", "selector", "<Object>"),
    ("consulbinding.spec.targets.selector", "matchLabels", "<map[string]string>"),
    ("consulbinding.status", "lastChangeTime", "<string>"),
    ("consulbinding.status.keys", "modifyIndex", "<integer>"),
    ("consulbinding.status.conditions", "lastTransitionTime", "<string>"),
];

pub fn check(env: &Env) -> Result<()> {
    // A CRD that was just established takes a few seconds to appear in the server's OpenAPI.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match check_once(env) {
            Err(e) if Instant::now() < deadline => {
                println!("not yet: {}", format!("{e:#}").lines().next().unwrap_or_default());
                sleep(Duration::from_secs(2));
            }
            result => return result,
        }
    }
}

fn check_once(env: &Env) -> Result<()> {
    let kubectl = |args: &[&str]| capture(Command::new("kubectl").args(args).envs(env.vars()?));

    // Every field line of the recursive view has a type.
    let tree = kubectl(&["explain", "consulbinding", "--recursive"])?;
    let fields = field_lines(&tree);
    ensure!(
        fields.len() > 40,
        "`kubectl explain consulbinding --recursive` lists only {} fields:\n{tree}",
        fields.len()
    );
    let untyped: Vec<&str> = fields.iter().filter(|(_, t)| t.is_empty() || t == "<>").map(|(n, _)| *n).collect();
    ensure!(untyped.is_empty(), "fields without a type: {untyped:?}\n{tree}");
    for (path, field, want) in PATHS {
        let text = kubectl(&["explain", path])?;
        let fields = field_lines(&text);
        let found = fields.iter().find(|(n, _)| *n == field).map(|(_, t)| t.as_str());
        ensure!(found == Some(want), "`kubectl explain {path}`: {field} is {found:?}, want {want}:\n{text}");
        // Each field line is followed by its description.
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if field_line(line).is_some() {
                let next = lines.get(i + 1).map_or("", |l| l.trim());
                ensure!(
                    !next.is_empty() && field_line(lines[i + 1]).is_none(),
                    "`kubectl explain {path}`: {} has no description:\n{text}",
                    line.trim()
                );
            }
        }
        println!("kubectl explain {path}: {} fields, {field} {want}", fields.len());
    }
    accepts_nulls(env)
}

/// A client that sends null for an optional field or the status (nullable no longer says it may)
/// still gets the object accepted: the API server prunes the nulls.
fn accepts_nulls(env: &Env) -> Result<()> {
    let binding = r#"{"apiVersion": "consulbind.dev/v1alpha1", "kind": "ConsulBinding",
        "metadata": {"name": "nulls", "namespace": "default"},
        "spec": {"keys": [{"key": "a"}], "targets": [{"kind": "Deployment", "name": "web"}],
                 "consul": null, "rollout": {"quietPeriod": null}},
        "status": null}"#;
    let mut child = Command::new("kubectl")
        .args(["create", "--dry-run=server", "-o", "json", "-f", "-"])
        .envs(env.vars()?)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run kubectl")?;
    std::io::Write::write_all(&mut child.stdin.take().context("stdin")?, binding.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("the API server rejects a binding with null optional fields: {}", String::from_utf8_lossy(&out.stderr));
    }
    let created: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(created["spec"].get("consul").is_none(), "null spec.consul was kept: {created}");
    println!("a binding with null optional fields is accepted, the nulls pruned");
    Ok(())
}

/// `(name, type)` of every field line: two or more spaces, a name, a tab, then the type.
fn field_lines(text: &str) -> Vec<(&str, String)> {
    text.lines().filter_map(field_line).collect()
}

fn field_line(line: &str) -> Option<(&str, String)> {
    let (name, kind) = line.split_once('\t')?;
    let name = name.trim();
    (line.starts_with("  ") && !name.is_empty() && !name.contains(' '))
        .then(|| (name, kind.trim().trim_end_matches("-required-").trim().to_owned()))
}
