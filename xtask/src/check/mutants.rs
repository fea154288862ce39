//! `cargo xtask mutants`: mutation testing of the reconcile decisions with cargo-mutants, on
//! demand only (hours on 2 cores). It changes the code under `crates/consulbind/src/reconcile/`
//! one mutant at a time and runs the package's unit tests against each: a mutant they pass is a
//! decision no test pins down.

use std::collections::HashMap;
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
/// (`context.rs`), the port that writes to the API server with the writers in `report.rs` and
/// `stamp.rs` it calls, and the reads of `observe` through that context (the caches, the
/// watches, Consul): only the end-to-end tests reach them. The simulators drive every stage
/// between them, and the pure parts of those reads and writes have unit cases where they live.
const EXCLUDE_FILES: &[&str] =
    &["crates/consulbind/src/reconcile/mod.rs", "crates/consulbind/src/reconcile/context.rs"];
const EXCLUDE_RE: &[&str] = &[
    "impl Port for Cluster",
    r"reconcile/observe\.rs:\d+:\d+: (replace (observe|consul|objects|first_read|older_values) -> .*|.* in (observe|consul|objects|first_read|older_values))$",
    r"reconcile/report\.rs:\d+:\d+: (replace (status|write_limited|rolled_out|publish) (->|with \(\)).*|.* in (status|write_limited|rolled_out|publish))$",
    r"reconcile/stamp\.rs:\d+:\d+: (replace (stamp_all|hold|write|patch) (->|with \(\)).*|.* in (stamp_all|hold|write|patch))$",
];
/// Where the reports go: one folder per run, `mutants.out/` inside each.
const OUTPUT: &str = "target/mutants";
/// The newest outcome of each mutant in scope, kept in the repository so that a run on one
/// machine counts on the next: a line each, the outcome and the mutant's name. Every run and
/// `--totals` rewrite it from itself and the reports.
const LEDGER: &str = "xtask/mutants.txt";

/// Which mutants a run tries.
pub enum Pick {
    /// Those cargo-mutants picks from `args` (all of them, or a `--shard`).
    Args,
    /// Those whose newest outcome is missed or timed out, to try with more seeds.
    Again,
    /// Those in scope that no report has an outcome for.
    Rest,
}

/// Installs cargo-mutants if needed, runs it with `seeds` simulator seeds per test run on the
/// mutants `pick` names, and prints its counts, then the totals over every report. `args` go
/// to cargo-mutants.
pub fn run(seeds: u32, pick: Pick, args: &[String]) -> Result<()> {
    // Jobs would share the one target directory: cargo then judges each copy's build by the
    // files of the copy that built last, and a job can test another's mutant, or none.
    let jobs = args.iter().any(|a| a == "-j" || a.starts_with("--jobs") || (a.starts_with("-j") && a != "-j1"));
    ensure!(!jobs, "one job at a time: the runs share target/mutants-build, where two jobs test each other's mutants");
    let binary = install()?;
    let shard = args.iter().position(|a| a == "--shard").and_then(|i| args.get(i + 1));
    let shard = args.iter().find_map(|a| a.strip_prefix("--shard=")).or(shard.map(String::as_str));
    let shard = shard.map(|s| format!("-{}", s.replace('/', "-of-"))).unwrap_or_default();
    // A run that picks by the earlier outcomes has a folder of its own, so that none of them
    // is replaced.
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let output = repo_root().join(OUTPUT).join(match pick {
        Pick::Args if shard.is_empty() => "all".to_owned(),
        Pick::Args => format!("shard{shard}"),
        Pick::Again => format!("again{shard}-{at}"),
        Pick::Rest => format!("rest{shard}-{at}"),
    });
    let wanted = match pick {
        Pick::Args => None,
        Pick::Again | Pick::Rest => {
            let tried = outcomes()?;
            let wanted: Vec<String> = in_scope(&binary)?
                .into_iter()
                .filter(|name| match (&pick, tried.get(name)) {
                    (Pick::Again, outcome) => outcome.is_some_and(|o| matches!(*o, "missed" | "timeout")),
                    (_, outcome) => outcome.is_none(),
                })
                .collect();
            ensure!(!wanted.is_empty(), "no mutant in scope is left to try so");
            println!("==> {} mutants to try", wanted.len());
            Some(wanted)
        }
    };
    fs::create_dir_all(&output)?;
    let mut mutants = cargo_mutants(&binary);
    if let Some(wanted) = &wanted {
        // One pattern each: a single one of hundreds would pass the limit of one argument.
        for name in wanted {
            mutants.arg("--re").arg(format!("^{}$", escape(name)));
        }
    }
    // A test run that takes this long is an endless loop: the unmutated tests take about
    // 4 s with 10 seeds and 21 s with 60 here, and a busy machine is slower.
    mutants.args(["--timeout", &(60 + seeds).to_string()]);
    // The unit tests only, built and run: the end-to-end ones need servers, and building them,
    // the library and the binary for every mutant would treble its time.
    mutants.args(["--cargo-arg=--lib", "--profile", "mutants"]);
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
    println!("\nthis run: {} ({}; missed.txt lists what no test caught)", Counts::read(&report)?, report.display());
    print_totals(&binary)
}

/// Prints the totals over every report, for the mutants in scope now.
pub fn totals() -> Result<()> {
    print_totals(&install()?)
}

fn print_totals(binary: &Path) -> Result<()> {
    let outcomes = outcomes()?;
    let scope = in_scope(binary)?;
    record(&outcomes, &scope)?;
    let mut total = Counts::default();
    for name in &scope {
        if let Some(outcome) = outcomes.get(name) {
            total.count(outcome);
            if matches!(*outcome, "missed" | "timeout") {
                println!("{outcome}: {name}");
            }
        }
    }
    let untried = scope.len() - total.tried();
    println!("{LEDGER} and {OUTPUT}/, over the {} mutants in scope: {total}; {untried} not tried", scope.len());
    Ok(())
}

/// cargo-mutants over the files in scope, run as cargo runs a subcommand but by its path:
/// another cargo-mutants on PATH or in ~/.cargo/bin may be another version.
fn cargo_mutants(binary: &Path) -> Command {
    let mut mutants = Command::new(binary);
    mutants.arg("mutants").current_dir(repo_root()).env("CARGO", env!("CARGO"));
    // One target directory for every run: each copy of the tree then rebuilds only the
    // workspace's own crates, not every dependency (about 4 minutes a run on 2 cores).
    mutants.env("CARGO_TARGET_DIR", repo_root().join("target/mutants-build"));
    mutants.args(["--package", "consulbind", "--file", FILES]);
    for file in EXCLUDE_FILES {
        mutants.args(["--exclude", file]);
    }
    for re in EXCLUDE_RE {
        mutants.args(["--exclude-re", re]);
    }
    mutants
}

/// The names of the mutants in scope now. A name holds its line and column, so a mutant whose
/// code moved is a new one, to be tried again.
///
/// cargo-mutants 27.1 lists and tries the deletion of a field from a struct literal whatever
/// `--re` and `--exclude-re` say, so those are applied here too: such a mutant in an excluded
/// function is tried, but never counted.
fn in_scope(binary: &Path) -> Result<Vec<String>> {
    counted(&crate::process::capture(cargo_mutants(binary).arg("--list"))?)
}

/// The names listed, less those [`EXCLUDE_RE`] leaves out.
fn counted(listed: &str) -> Result<Vec<String>> {
    let excluded = regex::RegexSet::new(EXCLUDE_RE)?;
    Ok(listed.lines().filter(|l| !l.trim().is_empty() && !excluded.is_match(l)).map(str::to_owned).collect())
}

/// The outcome of each mutant tried, from the ledger and every report under the output folder,
/// the newest one's where several tried one.
fn outcomes() -> Result<HashMap<String, &'static str>> {
    let mut reports = Vec::new();
    let ledger = repo_root().join(LEDGER);
    if let Ok(at) = fs::metadata(&ledger).and_then(|m| m.modified()) {
        reports.push((at, ledger));
    }
    let mut folders = vec![repo_root().join(OUTPUT)];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = fs::read_dir(&folder) else { continue };
        for entry in entries {
            let path = entry?.path();
            if path.file_name().is_some_and(|n| n == "mutants.out") {
                // The lists grow as a run goes, so a run cut short counts for what it tried.
                let written = OUTCOMES.iter().filter_map(|list| fs::metadata(path.join(format!("{list}.txt"))).ok());
                if let Some(at) = written.filter_map(|m| m.modified().ok()).max() {
                    reports.push((at, path));
                }
            } else if path.is_dir() && path.file_name().is_some_and(|n| n != "mutants.out.old") {
                folders.push(path);
            }
        }
    }
    reports.sort();
    let mut outcomes = HashMap::new();
    for (_, report) in reports {
        if report.is_file() {
            outcomes.extend(read_ledger(&fs::read_to_string(&report)?)?);
            continue;
        }
        for outcome in OUTCOMES {
            for name in lines(&report, outcome)? {
                outcomes.insert(name, outcome);
            }
        }
    }
    Ok(outcomes)
}

fn read_ledger(text: &str) -> Result<HashMap<String, &'static str>> {
    let lines = text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#'));
    lines
        .map(|line| {
            let (outcome, name) = line.split_once(' ').with_context(|| format!("{LEDGER}: no outcome in {line:?}"))?;
            let outcome = OUTCOMES.iter().find(|o| **o == outcome).with_context(|| format!("{LEDGER}: {outcome:?}"))?;
            Ok((name.to_owned(), *outcome))
        })
        .collect()
}

/// Rewrites the ledger with the outcomes of the mutants in `scope`, in its order.
fn record(outcomes: &HashMap<String, &'static str>, scope: &[String]) -> Result<()> {
    let mut text = String::from("# Written by `cargo xtask mutants`: the newest outcome of each mutant in scope.\n");
    for name in scope {
        if let Some(outcome) = outcomes.get(name) {
            text.push_str(&format!("{outcome} {name}\n"));
        }
    }
    fs::write(repo_root().join(LEDGER), text).with_context(|| format!("writing {LEDGER}"))
}

/// The lists of a report, one per outcome.
const OUTCOMES: [&str; 4] = ["caught", "missed", "unviable", "timeout"];

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

/// What became of the mutants.
#[derive(Default)]
struct Counts {
    caught: usize,
    missed: usize,
    unviable: usize,
    timeout: usize,
}

impl Counts {
    fn read(report: &Path) -> Result<Self> {
        let mut counts = Self::default();
        for outcome in OUTCOMES {
            for _ in lines(report, outcome)? {
                counts.count(outcome);
            }
        }
        Ok(counts)
    }

    fn count(&mut self, outcome: &str) {
        match outcome {
            "caught" => self.caught += 1,
            "missed" => self.missed += 1,
            "unviable" => self.unviable += 1,
            _ => self.timeout += 1,
        }
    }

    fn tried(&self) -> usize {
        self.caught + self.missed + self.unviable + self.timeout
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
        total.count("caught");
        assert_eq!(total.to_string(), "mutants: 4 caught, 1 missed (20% of the viable), 2 unviable, 0 timeout");
    }

    #[test]
    fn the_ledger_reads_back_what_it_records() {
        let text = "# a comment\ncaught a.rs:1:1: replace x with y in f\nmissed b.rs:2:5: delete ! in g\n";
        let read = read_ledger(text).unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read["a.rs:1:1: replace x with y in f"], "caught");
        assert_eq!(read["b.rs:2:5: delete ! in g"], "missed");
        assert!(read_ledger("slain a.rs:1:1: x\n").is_err(), "an outcome that is none");
    }

    #[test]
    fn a_field_deletion_in_an_excluded_function_is_not_counted() {
        let listed = "\
crates/consulbind/src/reconcile/report.rs:41:45: delete field shard from struct ConsulBindingStatus expression in status
crates/consulbind/src/reconcile/report.rs:257:9: delete field metadata from struct Event expression in event
crates/consulbind/src/reconcile/observe.rs:90:5: replace observe -> Result<Observed, Action> with Err(Default::default())
";
        let counted = counted(listed).unwrap();
        assert_eq!(
            counted,
            [
                "crates/consulbind/src/reconcile/report.rs:257:9: delete field metadata from struct Event expression in event"
            ]
        );
    }
}
