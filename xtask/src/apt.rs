//! Debian packages that `image` and the monitoring checks need, installed with apt-get when
//! missing, as `provision` does for the servers' packages.

use std::process::Command;

use anyhow::Result;

use crate::process::{capture, run};

/// Installs the packages that are missing, and skips apt entirely when none are.
pub fn ensure_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("==> installing {} with apt-get", missing.join(" "));
    run(Command::new("apt-get").arg("update"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn installed(package: &str) -> bool {
    capture(Command::new("dpkg-query").args(["--show", "--showformat=${Status}", package]))
        .is_ok_and(|status| status == "install ok installed")
}
