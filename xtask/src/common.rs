//! What all three groups use: the workspace root, the cache, deleting a tree, and durations as
//! people read them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};

/// The workspace root: xtask lives one level below it.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the workspace")
}

/// Cargo, as the one running xtask, in the workspace root.
pub fn cargo() -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(repo_root());
    cmd
}

/// Where downloads and built binaries are kept between runs, keyed by version.
pub fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME") {
            Some(home) => PathBuf::from(home).join(".cache"),
            None => bail!("neither XDG_CACHE_HOME nor HOME is set, so there is no cache directory"),
        },
    };
    Ok(base.join("consulbind"))
}

/// Deletes a directory tree; one that is already gone is fine.
pub fn remove_all(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

pub fn minutes(elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    format!("{}m{:02}s", secs / 60, secs % 60)
}
