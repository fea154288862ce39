//! Debian packages the servers, `image` and the monitoring checks need, installed with apt-get
//! when missing.

use std::process::Command;

use anyhow::Result;

use crate::process::{capture, run};

/// Installs the packages that are missing, and skips apt entirely when none are. Recommended
/// packages come along only with `recommends`.
pub fn ensure_packages(packages: &[&str], recommends: bool) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("==> installing {} with apt-get", missing.join(" "));
    run(Command::new("apt-get").arg("update"))?;
    let mut install = Command::new("apt-get");
    install.args(["install", "-y"]);
    if !recommends {
        install.arg("--no-install-recommends");
    }
    run(install.args(&missing).env("DEBIAN_FRONTEND", "noninteractive"))
}

fn installed(package: &str) -> bool {
    capture(Command::new("dpkg-query").args(["--show", "--showformat=${Status}", package]))
        .is_ok_and(|status| status == "install ok installed")
}
