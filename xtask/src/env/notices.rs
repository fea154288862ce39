//! `cargo xtask notices FILE`: the licences of every crate the controller's binary is built from,
//! with the licence files each package ships (and, for a crate that bundles a C library, that
//! library's), for the image to carry as its licences ask. Identical texts are written once.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::common::cargo;
use crate::process::capture;

/// Where the image keeps the file.
pub const IN_IMAGE: &str = "usr/share/doc/consulbind/THIRD-PARTY-NOTICES";

/// File names, upper-cased, that hold a licence or a copyright notice.
const NAMES: [&str; 5] = ["LICENSE", "LICENCE", "COPYING", "NOTICE", "COPYRIGHT"];

pub fn write(to: &Path) -> Result<()> {
    let host = capture(std::process::Command::new("rustc").args(["--print", "host-tuple"]))?;
    let metadata =
        capture(cargo().args(["metadata", "--format-version=1", "--locked", "--filter-platform", host.trim()]))?;
    let crates = linked(&serde_json::from_str(&metadata)?, "consulbind")?;
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(to, render(&crates)?).with_context(|| format!("writing {}", to.display()))?;
    println!("    {} crates' licences in {}", crates.len(), to.display());
    Ok(())
}

#[derive(Debug, PartialEq)]
struct Crate {
    name: String,
    version: String,
    license: String,
    dir: PathBuf,
    /// It builds a C library it bundles, whose own licence is one folder down.
    bundles: bool,
}

/// The crates `root` links: its normal dependencies, and theirs, without build and dev ones.
fn linked(metadata: &Value, root: &str) -> Result<Vec<Crate>> {
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .context("cargo metadata lists packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .context("cargo metadata has a resolve")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    // A procedural macro runs in the compiler, and neither it nor what it uses is linked.
    let macro_only = |id: &str| {
        packages.get(id).and_then(|p| p["targets"].as_array()).is_some_and(|targets| {
            targets.iter().any(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "proc-macro")))
        })
    };
    let start = packages.values().find(|p| p["name"] == root).context("no such package")?["id"].as_str().unwrap();
    let mut seen = BTreeSet::from([start]);
    let mut queue = vec![start];
    while let Some(id) = queue.pop() {
        for dep in nodes.get(id).and_then(|n| n["deps"].as_array()).into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            if let Some(pkg) = dep["pkg"].as_str().filter(|pkg| normal && !macro_only(pkg))
                && seen.insert(pkg)
            {
                queue.push(pkg);
            }
        }
    }
    seen.remove(start);
    let mut crates: Vec<Crate> = seen
        .into_iter()
        .filter_map(|id| packages.get(id))
        // The workspace's own crates carry the project's licence, the image's own.
        .filter(|p| p["source"].is_string())
        .map(|p| Crate {
            name: p["name"].as_str().unwrap_or_default().to_owned(),
            version: p["version"].as_str().unwrap_or_default().to_owned(),
            license: p["license"].as_str().unwrap_or("see its licence file").to_owned(),
            dir: PathBuf::from(p["manifest_path"].as_str().unwrap_or_default())
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
            bundles: p["links"].is_string(),
        })
        .collect();
    crates.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    Ok(crates)
}

fn is_notice(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().to_uppercase()).unwrap_or_default();
    path.is_file() && NAMES.iter().any(|n| name.starts_with(n))
}

/// A crate's licence files, relative to its folder.
fn notices(krate: &Crate) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(&krate.dir).with_context(|| format!("reading {}", krate.dir.display()))? {
        let path = entry?.path();
        if is_notice(&path) {
            found.push(path);
        } else if krate.bundles && path.is_dir() {
            for inner in fs::read_dir(&path)? {
                let inner = inner?.path();
                if is_notice(&inner) {
                    found.push(inner);
                }
            }
        }
    }
    found.sort();
    Ok(found.into_iter().filter_map(|p| p.strip_prefix(&krate.dir).ok().map(Path::to_path_buf)).collect())
}

fn render(crates: &[Crate]) -> Result<String> {
    let mut out = String::from(
        "consulbind is built from these crates. Each one's licence follows, then the licence files\n\
         their packages ship, each text once with the crates that ship it.\n\n",
    );
    // Text to the crates (and file names) that ship it, in order of first appearance.
    let mut texts: Vec<(String, Vec<String>)> = Vec::new();
    for krate in crates {
        out.push_str(&format!("{} {}: {}\n", krate.name, krate.version, krate.license));
        for file in notices(krate)? {
            let text = fs::read_to_string(krate.dir.join(&file)).unwrap_or_default();
            let shipper = format!("{} {} ({})", krate.name, krate.version, file.display());
            match texts.iter_mut().find(|(t, _)| *t == text) {
                Some((_, shippers)) => shippers.push(shipper),
                None => texts.push((text, vec![shipper])),
            }
        }
    }
    for (text, shippers) in texts {
        out.push_str(&format!("\n{}\n{}\n\n{}\n", "=".repeat(78), shippers.join(",\n"), text.trim_end()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_what_the_binary_links_is_listed() {
        let package = |name: &str, links: Option<&str>| {
            let kind = if name == "derive" { "proc-macro" } else { "lib" };
            json!({"id": name, "name": name, "version": "1.0.0", "license": "MIT",
                   "source": if name == "app" { Value::Null } else { json!("registry") },
                   "manifest_path": format!("/src/{name}/Cargo.toml"), "links": links,
                   "targets": [{"kind": [kind]}]})
        };
        let dep = |pkg: &str, kind: Option<&str>| json!({"pkg": pkg, "dep_kinds": [{"kind": kind}]});
        let metadata = json!({
            "packages": [package("app", None), package("lib", None), package("sys", Some("c")),
                         package("test-only", None), package("builder", None), package("unused", None),
                         package("derive", None), package("parser", None)],
            "resolve": {"nodes": [
                {"id": "app", "deps": [dep("lib", None), dep("test-only", Some("dev")), dep("derive", None)]},
                {"id": "derive", "deps": [dep("parser", None)]},
                {"id": "lib", "deps": [dep("sys", None)]},
                {"id": "sys", "deps": [dep("builder", Some("build"))]},
            ]},
        });
        let crates = linked(&metadata, "app").unwrap();
        let names: Vec<(&str, bool)> = crates.iter().map(|c| (c.name.as_str(), c.bundles)).collect();
        assert_eq!(names, [("lib", false), ("sys", true)]);
        assert_eq!(crates[1].dir, PathBuf::from("/src/sys"));
    }

    #[test]
    fn a_bundled_library_s_licence_is_found_and_each_text_written_once() {
        let root = std::env::temp_dir().join(format!("notices-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let krate = |name: &str, bundles: bool| Crate {
            name: name.into(),
            version: "1.0.0".into(),
            license: "MIT OR Apache-2.0".into(),
            dir: root.join(name),
            bundles,
        };
        for name in ["a", "b"] {
            fs::create_dir_all(root.join(name).join("src")).unwrap();
            fs::write(root.join(name).join("LICENSE-APACHE"), "the Apache text").unwrap();
            fs::write(root.join(name).join("README.md"), "not a licence").unwrap();
        }
        fs::create_dir_all(root.join("b/clib")).unwrap();
        fs::write(root.join("b/clib/COPYING"), "Copyright (C) the C library's authors").unwrap();
        let text = render(&[krate("a", false), krate("b", true)]).unwrap();
        let _ = fs::remove_dir_all(&root);
        assert_eq!(text.matches("the Apache text").count(), 1, "{text}");
        assert!(text.contains("a 1.0.0 (LICENSE-APACHE),\nb 1.0.0 (LICENSE-APACHE)"), "{text}");
        assert!(text.contains("b 1.0.0 (clib/COPYING)\n\nCopyright (C) the C library's authors"), "{text}");
        assert!(text.contains("a 1.0.0: MIT OR Apache-2.0\n"), "{text}");
        assert!(!text.contains("not a licence"), "{text}");
    }
}
