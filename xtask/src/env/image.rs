//! `cargo xtask image`: the controller image, built with buildah and no daemon, written as an OCI
//! archive. The root file system holds the release binary, the glibc libraries `ldd` lists, the CA
//! bundle and a non-root user, all taken from the machine's Debian packages, and the licences of
//! the crates and packages it is built from.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use super::apt;
use crate::common::{cargo, remove_all, repo_root};
use crate::process::{capture, run};

pub const ARCHIVE: &str = "target/consulbind-image.oci.tar";
/// The binary's path in the image, as in the Dockerfile.
const ENTRYPOINT: &str = "/consulbind";
/// distroless's `nonroot`, which config/core/deployment.yaml runs as.
const UID: u32 = 65532;
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

pub fn archive() -> PathBuf {
    repo_root().join(ARCHIVE)
}

pub fn build() -> Result<()> {
    apt::ensure_packages(&["buildah", "ca-certificates"], false)?;
    println!("==> cargo build --release -p consulbind");
    run(cargo().args(["build", "--release", "-p", "consulbind", "--locked"]))?;
    let binary = repo_root().join("target/release/consulbind");
    let work = repo_root().join("target/consulbind-image");
    let rootfs = work.join("rootfs");
    remove_all(&rootfs)?;
    fill_rootfs(&rootfs, &binary)?;

    let meta = package_metadata()?;
    let labels = [
        ("org.opencontainers.image.title", "consulbind".to_owned()),
        ("org.opencontainers.image.description", meta.description),
        ("org.opencontainers.image.source", meta.repository),
        ("org.opencontainers.image.version", meta.version),
        ("org.opencontainers.image.licenses", meta.license),
        ("org.opencontainers.image.revision", capture(git().args(["rev-parse", "HEAD"]))?.trim().to_owned()),
    ];

    println!("==> buildah: from scratch, then {ARCHIVE}");
    let buildah = Buildah::new(work.join("storage"));
    let container = buildah.output(&["from", "scratch"])?;
    let result = (|| {
        // The contents of rootfs/ become /, owned by root and read-only to UID, which is all it needs.
        buildah.run(&["copy", &container, &format!("{}/", rootfs.display()), "/"])?;
        let mut config = vec![
            "config".to_owned(),
            format!("--user={UID}:{UID}"),
            format!("--entrypoint=[\"{ENTRYPOINT}\"]"),
            "--cmd=".to_owned(),
            "--workingdir=/".to_owned(),
            // /metrics, /livez, /readyz (CONSULBIND_ADMIN_ADDR).
            "--port=8080".to_owned(),
            "--os=linux".to_owned(),
            format!("--arch={}", go_arch()?),
        ];
        config.extend(labels.iter().map(|(k, v)| format!("--label={k}={v}")));
        config.push(container.clone());
        buildah.run(&config.iter().map(String::as_str).collect::<Vec<_>>())?;
        let archive = archive();
        let _ = fs::remove_file(&archive);
        buildah.run(&["commit", "--format=oci", "--rm", &container, &format!("oci-archive:{}", archive.display())])
    })();
    if result.is_err() {
        let _ = buildah.run(&["rm", &container]);
    }
    result?;
    smoke_test(&buildah)?;
    println!("wrote {ARCHIVE}");
    Ok(())
}

/// Runs the binary from the archive, as the image's user, so a missing library fails here.
fn smoke_test(buildah: &Buildah) -> Result<()> {
    let container = buildah.output(&["from", &format!("oci-archive:{}", archive().display())])?;
    let help = buildah.output(&["run", "--isolation=chroot", &container, "--", ENTRYPOINT, "--help"]);
    let id = buildah.output(&["run", "--isolation=chroot", &container, "--", ENTRYPOINT, "--version"]);
    buildah.run(&["rm", &container])?;
    ensure!(help?.contains("--consul-http-addr"), "`consulbind --help` in the image does not list its flags");
    println!("    the image runs: {}", id?.trim());
    Ok(())
}

fn fill_rootfs(rootfs: &Path, binary: &Path) -> Result<()> {
    for dir in ["etc", "tmp", "home/nonroot"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    copy(binary, &rootfs.join(ENTRYPOINT.trim_start_matches('/')))?;
    let mut packages = BTreeSet::from(["ca-certificates".to_owned()]);
    for lib in shared_libraries(binary)? {
        copy(&lib, &rootfs.join(lib.strip_prefix("/")?))?;
        packages.insert(owning_package(&lib)?);
    }
    copy(Path::new(CA_BUNDLE), &rootfs.join(CA_BUNDLE.trim_start_matches('/')))?;
    super::notices::write(&rootfs.join(super::notices::IN_IMAGE))?;
    // Debian's copyright files of every package the image takes files from.
    for package in &packages {
        let copyright = PathBuf::from(format!("/usr/share/doc/{package}/copyright"));
        copy(&copyright, &rootfs.join(copyright.strip_prefix("/")?))?;
    }
    fs::write(
        rootfs.join("etc/passwd"),
        format!("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{UID}:{UID}:nonroot:/home/nonroot:/sbin/nologin\n"),
    )?;
    fs::write(rootfs.join("etc/group"), format!("root:x:0:\nnonroot:x:{UID}:\n"))?;
    // glibc resolves host names through this; Kubernetes mounts /etc/hosts and /etc/resolv.conf.
    fs::write(rootfs.join("etc/nsswitch.conf"), "passwd: files\ngroup: files\nhosts: files dns\n")?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// What `ldd` resolves for the binary, the dynamic loader included, at the paths it names.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = capture(Command::new("ldd").arg(binary))?;
    let mut libs = Vec::new();
    for line in out.lines().map(str::trim) {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)",
        // or the kernel's "linux-vdso.so.1 (0x...)", which is no file.
        let path = match line.split_once(" => ") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next().filter(|p| p.starts_with('/')),
        };
        match path {
            Some(p) if p.starts_with('/') => libs.push(PathBuf::from(p)),
            Some("not") => bail!("ldd cannot resolve a library of {}: {line}", binary.display()),
            _ => {}
        }
    }
    ensure!(libs.iter().any(|l| l.ends_with("libc.so.6")), "ldd lists no libc for {}:\n{out}", binary.display());
    Ok(libs)
}

/// The Debian package that installed `path`, found through its real location (merged /usr).
fn owning_package(path: &Path) -> Result<String> {
    let real = fs::canonicalize(path)?;
    for candidate in [path.to_path_buf(), real.clone(), Path::new("/").join(real.strip_prefix("/usr")?)] {
        if let Ok(out) = capture(Command::new("dpkg-query").arg("--search").arg(&candidate)) {
            let package = out.split(':').next().unwrap_or_default().trim();
            if !package.is_empty() {
                return Ok(package.to_owned());
            }
        }
    }
    bail!("no Debian package owns {}", path.display())
}

/// Copies the file's content (following symlinks) and mode.
fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to.parent().context("a file has a parent")?)?;
    fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

struct PackageMetadata {
    version: String,
    license: String,
    repository: String,
    description: String,
}

fn package_metadata() -> Result<PackageMetadata> {
    let out = capture(cargo().args(["metadata", "--no-deps", "--format-version=1"]))?;
    let metadata: serde_json::Value = serde_json::from_str(&out)?;
    let packages = metadata["packages"].as_array().context("cargo metadata lists packages")?;
    let package = packages.iter().find(|p| p["name"] == "consulbind").context("no package consulbind")?;
    let field = |name: &str| package[name].as_str().map(str::to_owned).with_context(|| format!("no {name}"));
    Ok(PackageMetadata {
        version: field("version")?,
        license: field("license")?,
        repository: field("repository").or_else(|_| workspace_repository())?,
        description: field("description")?,
    })
}

/// `repository` of `[workspace.package]`, which cargo metadata does not report for a member that
/// does not inherit it.
fn workspace_repository() -> Result<String> {
    let manifest = fs::read_to_string(repo_root().join("Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|line| line.strip_prefix("repository = "))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .context("no repository in the workspace Cargo.toml")
}

/// The OCI name of this machine's architecture.
fn go_arch() -> Result<&'static str> {
    Ok(match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no OCI architecture name known for {other}"),
    })
}

/// buildah as root without a daemon: vfs storage kept under target/, so the machine's own
/// container storage is left alone.
pub(super) struct Buildah {
    storage: PathBuf,
}

impl Buildah {
    pub(super) fn new(storage: PathBuf) -> Self {
        Self { storage }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("buildah");
        cmd.arg("--storage-driver=vfs")
            .arg(format!("--root={}", self.storage.join("root").display()))
            .arg(format!("--runroot={}", self.storage.join("run").display()))
            .args(args)
            .env("BUILDAH_ISOLATION", "chroot");
        cmd
    }

    pub(super) fn run(&self, args: &[&str]) -> Result<()> {
        run(&mut self.command(args))
    }

    pub(super) fn output(&self, args: &[&str]) -> Result<String> {
        Ok(capture(&mut self.command(args))?.trim().to_owned())
    }
}

fn git() -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(repo_root());
    cmd
}
