//! `cargo xtask mutants`: mutation testing of the reconcile decisions with cargo-mutants, on
//! demand only (hours on 2 cores). It changes the code under `crates/consulbind/src/reconcile/`
//! one mutant at a time and runs the package's unit tests against each: a mutant they pass is a
//! decision no test pins down.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::common::{cache_dir, repo_root};
use crate::process::{run as run_command, succeeds};

/// The cargo-mutants that is installed and run; a new one is a new cache entry.
const VERSION: &str = "27.1.0";
/// The files whose mutants are tried.
const FILES: &str = "crates/consulbind/src/reconcile/**";
/// Where its report goes: `mutants.out/` inside it.
const OUTPUT: &str = "target/mutants";
/// Seeds of the simulator per test run: enough to catch a wrong decision, few enough that one
/// run of the unit tests stays short, as it runs once per mutant.
const SIM_SEEDS: &str = "60";
/// Seconds one test run may take before the mutant counts as a timeout (an endless loop): about
/// seven times what the unit tests take unmutated here (17 s), for a busy machine.
const TIMEOUT_SECS: &str = "120";

/// Installs cargo-mutants if needed, runs it, and prints its counts. `args` go to cargo-mutants.
pub fn run(args: &[String]) -> Result<()> {
    let binary = install()?;
    let output = repo_root().join(OUTPUT);
    fs::create_dir_all(&output)?;
    // Run as cargo runs a subcommand, but by its path: another cargo-mutants on PATH or in
    // ~/.cargo/bin may be another version.
    let mut mutants = Command::new(binary);
    mutants.arg("mutants").current_dir(repo_root()).env("CARGO", env!("CARGO"));
    mutants.args(["--package", "consulbind", "--file", FILES, "--timeout", TIMEOUT_SECS]);
    mutants.arg("--output").arg(&output).args(args);
    // The unit tests only: the end-to-end ones need servers.
    mutants.args(["--", "--lib"]).env("CONSULBIND_SIM_SEEDS", SIM_SEEDS);
    println!("==> cargo mutants {VERSION} on {FILES} (unit tests, {SIM_SEEDS} simulator seeds each)");
    let started = std::time::SystemTime::now();
    let status = mutants.status().context("cannot run cargo mutants")?;
    let report = output.join("mutants.out");
    // cargo-mutants' exit codes: 0 all caught, 2 some missed, 3 some timed out; any other means
    // the run did not finish (4: the tests fail with no mutant at all).
    match status.code() {
        Some(0 | 2 | 3) => {}
        Some(4) => bail!("the unit tests fail with no mutant; see {}", report.join("log").display()),
        _ => bail!("cargo mutants failed ({status})"),
    }
    // `--list` and the like test nothing and leave an earlier run's report as it was.
    let written = fs::metadata(report.join("outcomes.json")).and_then(|m| m.modified());
    if !written.is_ok_and(|at| at >= started) {
        return Ok(());
    }
    let counts = Counts::read(&report)?;
    println!("\n{counts}\nthe report: {} (missed.txt lists what no test caught)", report.display());
    Ok(())
}

/// `<cache>/cargo-mutants-<version>/bin/cargo-mutants`, installed from crates.io unless it is
/// there already.
fn install() -> Result<PathBuf> {
    let root = cache_dir()?.join(format!("cargo-mutants-{VERSION}"));
    let binary = root.join("bin/cargo-mutants");
    // Run by its path it takes the subcommand's name first, as cargo passes it.
    if succeeds(Command::new(&binary).args(["mutants", "--version"])) {
        return Ok(binary);
    }
    println!("==> installing cargo-mutants {VERSION} into {} (once; minutes)", root.display());
    run_command(
        Command::new(env!("CARGO"))
            .args(["install", "cargo-mutants", "--locked", "--version", VERSION, "--root"])
            .arg(&root),
    )?;
    Ok(binary)
}

/// What became of the mutants, from the report's `outcomes.json`.
struct Counts {
    caught: u64,
    missed: u64,
    unviable: u64,
    timeout: u64,
}

impl Counts {
    fn read(report: &Path) -> Result<Self> {
        let path = report.join("outcomes.json");
        let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let outcomes: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
        let count = |name: &str| outcomes[name].as_u64().with_context(|| format!("no {name} in {}", path.display()));
        Ok(Self {
            caught: count("caught")?,
            missed: count("missed")?,
            unviable: count("unviable")?,
            timeout: count("timeout")?,
        })
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { caught, missed, unviable, timeout } = self;
        write!(f, "mutants: {caught} caught, {missed} missed, {unviable} unviable, {timeout} timeout")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_come_from_outcomes_json() {
        let report = std::env::temp_dir().join(format!("xtask-mutants-{}", std::process::id()));
        fs::create_dir_all(&report).unwrap();
        let outcomes = r#"{"outcomes": [], "total_mutants": 10, "missed": 6, "caught": 1, "timeout": 1,
                           "unviable": 2, "success": 0, "cargo_mutants_version": "27.1.0"}"#;
        fs::write(report.join("outcomes.json"), outcomes).unwrap();
        let counts = Counts::read(&report);
        fs::remove_dir_all(&report).unwrap();
        assert_eq!(counts.unwrap().to_string(), "mutants: 1 caught, 6 missed, 2 unviable, 1 timeout");
    }
}
