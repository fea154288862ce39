//! `cargo xtask book`: builds the book in `docs/` with mdBook (installed into the cache on first
//! use), fails on any warning of mdBook's, and checks that every relative link of the book and of
//! the README names a file that exists.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::common::{cache_dir, repo_root};
use crate::process::{run as run_command, succeeds};

/// The mdBook that is installed and run; a new one is a new cache entry.
const VERSION: &str = "0.5.4";
/// Where the book is written.
const OUTPUT: &str = "target/book";

pub fn check() -> Result<()> {
    let mdbook = install()?;
    let root = repo_root();
    let output = Command::new(&mdbook)
        .args(["build", "docs", "--dest-dir"])
        .arg(root.join(OUTPUT))
        .current_dir(root)
        .output()
        .context("cannot run mdbook")?;
    let log = String::from_utf8_lossy(&output.stderr);
    print!("{log}");
    ensure!(output.status.success(), "mdbook build failed ({})", output.status);
    // mdBook reports a chapter it cannot find or a link it cannot resolve as a warning.
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    ensure!(warnings.is_empty(), "mdbook warned:\n{}", warnings.join("\n"));
    let mut pages = vec![root.join("README.md")];
    markdown_files(&root.join("docs/src"), &mut pages)?;
    let broken: Vec<String> = pages.iter().map(|page| broken_links(page)).collect::<Result<Vec<_>>>()?.concat();
    if !broken.is_empty() {
        bail!("links to files that do not exist:\n{}", broken.join("\n"));
    }
    println!("the book is in {OUTPUT}/; {} pages, every relative link resolves", pages.len());
    Ok(())
}

/// `<cache>/mdbook-<version>/bin/mdbook`, installed from crates.io unless it is there already.
fn install() -> Result<PathBuf> {
    let root = cache_dir()?.join(format!("mdbook-{VERSION}"));
    let binary = root.join("bin/mdbook");
    if succeeds(Command::new(&binary).arg("--version")) {
        return Ok(binary);
    }
    println!("==> installing mdbook {VERSION} into {} (once; minutes)", root.display());
    run_command(
        Command::new(env!("CARGO"))
            .args(["install", "mdbook", "--locked", "--no-default-features", "--version", VERSION, "--root"])
            .arg(&root),
    )?;
    Ok(binary)
}

fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            markdown_files(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
    Ok(())
}

/// The relative links of a Markdown page, outside code, whose file does not exist, as
/// `page:line: target`.
fn broken_links(page: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
    let dir = page.parent().unwrap_or(Path::new("."));
    let shown = page.strip_prefix(repo_root()).unwrap_or(page).display();
    Ok(links(&text)
        .into_iter()
        .filter(|(_, target)| !dir.join(target).exists())
        .map(|(line, target)| format!("{shown}:{line}: {target}"))
        .collect())
}

/// The targets of `[text](target)` links that point to a file of the repository, with their
/// line numbers: no scheme, no bare `#anchor`, the anchor cut off; fenced and inline code left out.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut fenced = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code is every other part between backticks.
        for prose in line.split('`').step_by(2) {
            for (i, _) in prose.match_indices("](") {
                let rest = &prose[i + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = rest[..end].split_whitespace().next().unwrap_or_default();
                let path = target.split('#').next().unwrap_or_default();
                if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                    continue;
                }
                found.push((number + 1, path.to_owned()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_the_files_a_page_points_to() {
        let page = "See [a](concepts/a.md#why) and [b](../b.md \"title\"), [web](https://x.dev/a.md),\n\
                    [top](#top), `[not](code.md)`.\n```\n[fenced](no.md)\n```\n[c](c.md)";
        let links: Vec<(usize, String)> = links(page);
        assert_eq!(links, [(1, "concepts/a.md".to_owned()), (1, "../b.md".to_owned()), (6, "c.md".to_owned())]);
    }
}
