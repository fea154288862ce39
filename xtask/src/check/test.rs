//! `cargo xtask test`, everything CI checks, and `cargo xtask e2e`, the end-to-end tests alone.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::{book, crdgen, explain, helm, monitoring};
use crate::common::{cargo, minutes};
use crate::env::Env;
use crate::env::{apt, image, provision};
use crate::process::{capture, catch_interrupts, interrupted, run};

/// Runs every step, even after one fails, so a single run shows all problems. The environment is
/// stopped at the end whatever happened.
pub fn all(env: &Env, e2e_args: &[String]) -> Result<()> {
    catch_interrupts();
    let mut report = Report::default();
    report.step("cargo fmt --all --check", || run(cargo().args(["fmt", "--all", "--check"])));
    report.step("cargo clippy --workspace --all-targets -- -D warnings", || {
        run(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))
    });
    report.step("crdgen --check", || crdgen::run(true));
    report.step("config/monitoring (promtool check rules, dashboard, kustomize)", monitoring::check);
    report.step("config/helm (helm lint, the same objects as kustomize, every value)", || helm::check(false));
    report.step("the book (mdbook build, every relative link)", book::check);
    report.step("unit tests", || run(cargo().args(["test", "--workspace", "--lib", "--bins"])));
    report.step("controller image (cargo xtask image)", image::build);

    let mut guard = StopGuard { env, stopped: false };
    let up = report.step("fresh environment", || {
        env.down()?;
        env.wipe()?;
        env.up()
    });
    if up {
        report.step("the node comes back from a crash (cargo xtask env node-crash)", || env.check_node_crash());
        report.step("kubectl explain shows every field's type", || explain::check(env));
        report.step("end-to-end tests", || e2e(env, e2e_args));
    } else {
        report.skip("the node comes back from a crash (cargo xtask env node-crash)");
        report.skip("kubectl explain shows every field's type");
        report.skip("end-to-end tests");
    }
    report.always("stop the environment", || guard.stop());
    report.finish()
}

/// The decision core's simulator (`crates/consulbind/src/sim/`), on its own.
pub fn sim(seeds: u64, seed: Option<u64>) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["test", "--package", "consulbind", "--lib", "sim::"]);
    cmd.env("CONSULBIND_SIM_SEEDS", seeds.to_string());
    if let Some(seed) = seed {
        cmd.env("CONSULBIND_SIM_SEED", seed.to_string());
    }
    run(&mut cmd)
}

/// The end-to-end tests against an environment that is already up.
pub fn e2e_on_running(env: &Env, args: &[String]) -> Result<()> {
    env.status()?;
    image::build()?;
    e2e(env, args)
}

/// Every integration-test target (`tests/`), with the env file's variables and CONSULBIND_E2E=1.
fn e2e(env: &Env, args: &[String]) -> Result<()> {
    if !has_integration_tests()? {
        println!("NOTE: the workspace has no integration test targets yet; nothing to run");
        return Ok(());
    }
    // Argo CD's dialect, to run the health check of config/argocd/ on real statuses.
    apt::ensure_packages(&["lua5.1"], false)?;
    // The chart is installed into the API server and run with its own RBAC.
    provision::helm()?;
    // The CRD's validation rules are tested on a current CRD server.
    env.start_apiextensions(&provision::apiextensions()?)?;
    run(cargo()
        .args(["test", "--workspace", "--test", "*", "--"])
        .args(args)
        .envs(env.vars()?)
        .env("CONSULBIND_E2E", "1")
        // The fault tests restart their Consul agent through `cargo xtask env consul-restart`.
        .env("CONSULBIND_XTASK", std::env::current_exe()?)
        // The image tests run the controller from this archive; `image::build` writes it.
        .env("CONSULBIND_E2E_IMAGE", image::archive())
        // The tests mostly wait on servers, each in its own namespace: run many at once.
        .env("RUST_TEST_THREADS", std::env::var("RUST_TEST_THREADS").unwrap_or_else(|_| "8".into())))
}

/// `cargo test --test '*'` fails when no target matches, which is the case before the first test lands.
fn has_integration_tests() -> Result<bool> {
    let metadata = capture(cargo().args(["metadata", "--no-deps", "--format-version=1"]))?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata)?;
    let targets = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|package| package["targets"].as_array().into_iter().flatten());
    Ok(targets.flat_map(|target| target["kind"].as_array().into_iter().flatten()).any(|kind| kind == "test"))
}

/// Stops the environment when dropped, so a panicking step doesn't leave servers running.
struct StopGuard<'a> {
    env: &'a Env,
    stopped: bool,
}

impl StopGuard<'_> {
    fn stop(&mut self) -> Result<()> {
        self.stopped = true;
        self.env.down()
    }
}

impl Drop for StopGuard<'_> {
    fn drop(&mut self) {
        if !self.stopped
            && let Err(e) = self.env.down()
        {
            eprintln!("error stopping the environment: {e:#}");
        }
    }
}

enum Outcome {
    Passed(Duration),
    Failed(Duration),
    Skipped,
}

#[derive(Default)]
struct Report {
    steps: Vec<(&'static str, Outcome)>,
}

impl Report {
    /// Runs a step unless Ctrl-C was pressed, and returns whether it passed.
    fn step(&mut self, name: &'static str, f: impl FnOnce() -> Result<()>) -> bool {
        if interrupted() {
            self.skip(name);
            return false;
        }
        self.always(name, f)
    }

    fn always(&mut self, name: &'static str, f: impl FnOnce() -> Result<()>) -> bool {
        println!("\n==== {name} ====");
        let start = Instant::now();
        let result = f();
        if let Err(e) = &result {
            eprintln!("error: {e:#}");
        }
        let elapsed = start.elapsed();
        let outcome = if result.is_ok() { Outcome::Passed(elapsed) } else { Outcome::Failed(elapsed) };
        self.steps.push((name, outcome));
        result.is_ok()
    }

    fn skip(&mut self, name: &'static str) {
        self.steps.push((name, Outcome::Skipped));
    }

    fn finish(self) -> Result<()> {
        println!("\n==== summary ====");
        let mut failed = 0;
        for (name, outcome) in &self.steps {
            match outcome {
                Outcome::Passed(t) => println!("  ok       {name} ({})", minutes(*t)),
                Outcome::Failed(t) => {
                    failed += 1;
                    println!("  FAILED   {name} ({})", minutes(*t));
                }
                Outcome::Skipped => println!("  skipped  {name}"),
            }
        }
        if interrupted() {
            bail!("interrupted");
        }
        if failed > 0 {
            bail!("{failed} of {} steps failed", self.steps.len());
        }
        Ok(())
    }
}
