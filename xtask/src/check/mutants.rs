//! `cargo xtask mutants`: mutation testing of the reconcile decisions with cargo-mutants, on
//! demand only (hours on 2 cores). It changes the code under `crates/consulbind/src/reconcile/`
//! one mutant at a time and runs the package's unit tests against each: a mutant they pass is a
//! decision no test pins down.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::common::{cache_dir, repo_root};
use crate::process::{run as run_command, succeeds};

/// The cargo-mutants that is installed and run; a new one is a new cache entry.
const VERSION: &str = "27.1.0";
/// The files whose mutants are tried.
const FILES: &str = "crates/consulbind/src/reconcile/**";
/// What is left out, and why: the wiring that hands a reconcile to kube-runtime and catches its
/// panics (`mod.rs`), the shared context that ties the caches and watches to a client
/// (`context.rs`), and the port that writes to the API server, which only the end-to-end tests
/// reach. The simulators drive every stage between them.
const EXCLUDE_FILES: &[&str] =
    &["crates/consulbind/src/reconcile/mod.rs", "crates/consulbind/src/reconcile/context.rs"];
const EXCLUDE_RE: &[&str] = &["impl Port for Cluster"];
/// Where the reports go: one folder per shard, `mutants.out/` inside each, and the second
/// pass's in `again/` beside it.
const OUTPUT: &str = "target/mutants";

/// Installs cargo-mutants if needed, runs it with `seeds` simulator seeds per test run, and
/// prints its counts, then the counts of every shard's report. With `again` (`K/N`), it tries
/// again exactly the mutants that shard's first pass missed or timed out. `args` go to
/// cargo-mutants.
pub fn run(seeds: u32, again: Option<&str>, args: &[String]) -> Result<()> {
    let binary = install()?;
    let shard = args.iter().position(|a| a == "--shard").and_then(|i| args.get(i + 1));
    let shard = args.iter().find_map(|a| a.strip_prefix("--shard=")).or(shard.map(String::as_str)).or(again);
    let folder = repo_root().join(OUTPUT).join(match shard {
        Some(shard) => format!("shard-{}", shard.replace('/', "-of-")),
        None => "all".to_owned(),
    });
    let (output, wanted) = match again {
        Some(_) => (folder.join("again"), Some(undecided(&folder.join("mutants.out"))?)),
        None => (folder.clone(), None),
    };
    fs::create_dir_all(&output)?;
    // Run as cargo runs a subcommand, but by its path: another cargo-mutants on PATH or in
    // ~/.cargo/bin may be another version.
    let mut mutants = Command::new(binary);
    mutants.arg("mutants").current_dir(repo_root()).env("CARGO", env!("CARGO"));
    mutants.args(["--package", "consulbind", "--file", FILES]);
    for file in EXCLUDE_FILES {
        mutants.args(["--exclude", file]);
    }
    for re in EXCLUDE_RE {
        mutants.args(["--exclude-re", re]);
    }
    if let Some(wanted) = &wanted {
        ensure!(!wanted.is_empty(), "the first pass of shard {} left nothing to try again", again.unwrap_or_default());
        let names: Vec<String> = wanted.iter().map(|name| format!("^{}$", escape(name))).collect();
        mutants.args(["--re", &names.join("|")]);
    }
    // A test run that takes this long is an endless loop: the unmutated tests take about
    // 4 s with 10 seeds and 21 s with 60 here, and a busy machine is slower.
    mutants.args(["--timeout", &(60 + seeds).to_string()]);
    // The unit tests only, built and run: the end-to-end ones need servers, and building them
    // for every mutant would double its time.
    mutants.args(["--cargo-test-arg=--lib", "--profile", "mutants"]);
    mutants.arg("--output").arg(&output).args(args).env("CONSULBIND_SIM_SEEDS", seeds.to_string());
    println!("==> cargo mutants {VERSION} on {FILES} (unit tests, {seeds} simulator seeds each)");
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
    println!("\nthe report: {} (missed.txt lists what no test caught)", report.display());
    let mut total = Counts::default();
    for entry in fs::read_dir(repo_root().join(OUTPUT))? {
        let shard = entry?.path();
        if shard.join("mutants.out").is_dir() {
            let counts = Counts::of_shard(&shard)?;
            println!("{}: {counts}", shard.file_name().unwrap_or_default().to_string_lossy());
            total.add(&counts);
        }
    }
    println!("every shard under {OUTPUT}/, {total}");
    Ok(())
}

/// What a first pass left undecided: the mutants it missed, and those that timed out.
fn undecided(report: &Path) -> Result<Vec<String>> {
    Ok([lines(report, "missed")?, lines(report, "timeout")?].concat())
}

fn lines(report: &Path, list: &str) -> Result<Vec<String>> {
    let path = report.join(format!("{list}.txt"));
    match fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// `name` as a regular expression that matches it alone.
fn escape(name: &str) -> String {
    name.chars()
        .flat_map(|c| match c {
            '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$' => vec!['\\', c],
            _ => vec![c],
        })
        .collect()
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

/// What became of the mutants, from the report's lists, which also hold what earlier runs
/// found when a run was `--iterate`d.
#[derive(Default)]
struct Counts {
    caught: usize,
    missed: usize,
    unviable: usize,
    timeout: usize,
}

impl Counts {
    fn read(report: &Path) -> Result<Self> {
        let count = |list: &str| lines(report, list).map(|l| l.len());
        Ok(Self {
            caught: count("caught")?,
            missed: count("missed")?,
            unviable: count("unviable")?,
            timeout: count("timeout")?,
        })
    }

    /// A shard's counts: its first pass, with what the second decided of the undecided rest.
    /// A second pass tries a few mutants more than asked (cargo-mutants' field deletions pass
    /// any filter): only those asked count.
    fn of_shard(shard: &Path) -> Result<Self> {
        let first = Self::read(&shard.join("mutants.out"))?;
        let again = shard.join("again/mutants.out");
        if !again.is_dir() {
            return Ok(first);
        }
        let asked = undecided(&shard.join("mutants.out"))?;
        let decided = |list: &str| -> Result<usize> {
            Ok(lines(&again, list)?.iter().filter(|name| asked.contains(name)).count())
        };
        // One asked but not tried again has left the files in scope.
        Ok(Self {
            caught: first.caught + decided("caught")?,
            unviable: first.unviable + decided("unviable")?,
            timeout: decided("timeout")?,
            missed: decided("missed")?,
        })
    }

    fn add(&mut self, other: &Self) {
        self.caught += other.caught;
        self.missed += other.missed;
        self.unviable += other.unviable;
        self.timeout += other.timeout;
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { caught, missed, unviable, timeout } = self;
        let viable = caught + missed + timeout;
        let share = if viable == 0 { 0.0 } else { 100.0 * *missed as f64 / viable as f64 };
        write!(
            f,
            "mutants: {caught} caught, {missed} missed ({share:.0}% of the viable), {unviable} unviable, {timeout} timeout"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_come_from_the_report_lists() {
        let report = std::env::temp_dir().join(format!("xtask-mutants-{}", std::process::id()));
        fs::create_dir_all(&report).unwrap();
        fs::write(report.join("caught.txt"), "a.rs:1:1: x\na.rs:2:1: y\na.rs:3:1: z\n").unwrap();
        fs::write(report.join("missed.txt"), "a.rs:4:1: w\n").unwrap();
        fs::write(report.join("unviable.txt"), "a.rs:5:1: v\na.rs:6:1: u\n").unwrap();
        let counts = Counts::read(&report);
        fs::remove_dir_all(&report).unwrap();
        let mut total = counts.unwrap();
        assert_eq!(total.to_string(), "mutants: 3 caught, 1 missed (25% of the viable), 2 unviable, 0 timeout");
        total.add(&Counts { caught: 1, missed: 0, unviable: 0, timeout: 0 });
        assert_eq!(total.to_string(), "mutants: 4 caught, 1 missed (20% of the viable), 2 unviable, 0 timeout");
    }
}
