//! Development tasks for consulbind: `cargo xtask env up|down|status`, `test`, `e2e`, `crdgen`, `image`,
//! `explain`, `monitoring`, `helm`, `book`, `demo`, `bench …`, `sim`, `mutants`. This file is the command line
//! alone: the environment and its provisioning are in `env/`, the benchmarks in `bench/`, the checks
//! in `check/`.

mod bench;
mod check;
mod common;
mod env;
mod process;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Development tasks for consulbind")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Manage the local environment: etcd, kube-apiserver, kube-controller-manager, a node and three Consul agents.
    Env {
        #[command(subcommand)]
        action: EnvAction,
    },
    /// Check everything: fmt, clippy, crdgen --check, monitoring rules, the chart, the book, unit tests, the image, then kubectl explain
    /// and end-to-end tests on a fresh environment.
    Test {
        /// Passed to the end-to-end test binaries, e.g. a test name filter or --nocapture.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Build the image, then run the end-to-end tests against the environment that is already up.
    E2e {
        /// Passed to the end-to-end test binaries, e.g. a test name filter or --nocapture.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Write the CRD manifests into crds/, or with --check fail if they are out of date.
    Crdgen {
        #[arg(long)]
        check: bool,
    },
    /// Check on the running environment that `kubectl explain` shows every ConsulBinding field's type.
    Explain,
    /// Check config/monitoring/: promtool on the rules, the dashboard JSON, the kustomization.
    Monitoring,
    /// Check the Helm chart in config/helm/: helm lint, the same objects as kustomize, every value, the values' schema.
    Helm {
        /// Write what the chart derives first: values.schema.json from values.yaml, files/ from
        /// config/monitoring/, and the book's Helm values page.
        #[arg(long)]
        write: bool,
    },
    /// Build the book in docs/ with mdBook into target/book, failing on a warning or a broken link.
    Book,
    /// Build the controller image with buildah (no daemon) into target/consulbind-image.oci.tar.
    Image,
    /// Write the licences of every crate the controller is built from, as the image carries them.
    Notices { file: std::path::PathBuf },
    /// Measure the controller on the local servers and print the figures.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
    /// Bring the environment up, run the controller on examples/, and show a Consul write rolling the demo app's pods.
    Demo,
    /// Run the decision core's deterministic simulator on seeds 0..N, or replay one seed with its steps.
    Sim {
        #[arg(long, default_value_t = 500)]
        seeds: u64,
        /// Replay this seed alone; a failure prints its steps.
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Mutation testing of crates/consulbind/src/reconcile/ with cargo-mutants (installed into the
    /// cache on first use) and the package's unit tests; prints what was caught and missed. Slow:
    /// hours on 2 cores. Not part of `test`.
    Mutants {
        /// Simulator seeds per test run. Few make a quick first pass; the mutants it misses are
        /// then tried again with more (`--seeds 60 --again`).
        #[arg(long, default_value_t = 10)]
        seeds: u32,
        /// Try again the mutants in scope whose newest outcome (in xtask/mutants.txt and the
        /// reports in target/mutants/) is missed or timed out.
        #[arg(long, conflicts_with = "rest")]
        again: bool,
        /// Try the mutants in scope that have no outcome yet (new code, moved lines, parts not
        /// run yet).
        #[arg(long)]
        rest: bool,
        /// Only print the totals for the mutants in scope now, and write them to
        /// xtask/mutants.txt.
        #[arg(long, conflicts_with_all = ["again", "rest"])]
        totals: bool,
        /// Passed to cargo-mutants, e.g. `--list`, or `--shard 1/8` for an eighth of the
        /// mutants (each shard keeps its own report).
        #[arg(last = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Many bindings, workloads and keys: cold start, Consul connections, change-to-rollout
    /// latency through a watch, missed and spurious rollouts, idle writes and memory.
    Scale {
        #[arg(long, default_value_t = 2_000)]
        bindings: usize,
        /// Deployments, with `replicas: 0`, shared out among the bindings.
        #[arg(long, default_value_t = 5_000)]
        workloads: usize,
        /// Distinct Consul keys, shared out among the bindings.
        #[arg(long, default_value_t = 10_000)]
        keys: usize,
        /// Consul writes, one at a time, each to a key of the next binding.
        #[arg(long, default_value_t = 1_000)]
        changes: usize,
        /// Seconds of nothing happening, to count the controller's writes.
        #[arg(long, default_value_t = 60)]
        idle: u64,
        /// The controller's --consul-max-connections.
        #[arg(long, default_value_t = 32)]
        max_connections: usize,
        /// The controller reads Consul over HTTPS, where it speaks HTTP/2.
        #[arg(long)]
        consul_tls: bool,
    },
    /// One namespace with many Consul tokens, another with one, on the ACL agent: the quiet
    /// namespace's change-to-rollout latency while the busy one takes turns, and the busy one's.
    Tenants {
        /// Distinct tokens, each with its own binding, in the busy namespace.
        #[arg(long, default_value_t = 200)]
        scopes: usize,
        /// Consul writes to the quiet namespace's key, one at a time.
        #[arg(long, default_value_t = 100)]
        changes: usize,
        /// Consul writes to the busy namespace's keys, one at a time, after those.
        #[arg(long, default_value_t = 5)]
        busy_changes: usize,
        /// The controller's --consul-max-connections.
        #[arg(long, default_value_t = 32)]
        max_connections: usize,
        /// Token scopes, each with its binding, that the busy namespace then adds at once while
        /// the quiet namespace's key keeps changing.
        #[arg(long, default_value_t = 200)]
        burst: usize,
    },
    /// The same bindings served by one sharded replica, then by three: change-to-rollout latency,
    /// memory per replica, the ring's shares, and a handover under load (a replica SIGKILLed while
    /// each of its bindings changes).
    Shards {
        /// Bindings, each with a key and a Deployment of its own.
        #[arg(long, default_value_t = 3000)]
        bindings: usize,
        /// Namespaces the bindings are dealt round.
        #[arg(long, default_value_t = 30)]
        namespaces: usize,
        /// Consul writes per run, one at a time.
        #[arg(long, default_value_t = 100)]
        changes: usize,
    },
    /// One binding of large values: the controller's resident memory before it, once it is
    /// Ready, and after each change.
    Big {
        #[arg(long, default_value_t = 12)]
        prefixes: usize,
        /// Values under each prefix.
        #[arg(long, default_value_t = 8)]
        values: usize,
        #[arg(long, default_value_t = 400_000)]
        value_bytes: usize,
        /// Consul writes of one value each, one at a time.
        #[arg(long, default_value_t = 5)]
        changes: usize,
    },
    /// A tenant naming the same Consul data again and again: resident memory as overlapping
    /// prefixes and bindings multiply over the same keys.
    Overlap {
        #[arg(long, default_value_t = 1_900)]
        keys: usize,
        #[arg(long, default_value_t = 300)]
        value_bytes: usize,
        /// The most prefixes one binding names, each covering every key.
        #[arg(long, default_value_t = 64)]
        prefixes: usize,
        /// Bindings naming those prefixes, at the last step.
        #[arg(long, default_value_t = 4)]
        bindings: usize,
    },
    /// A namespace whose keys change without pause beside a quiet one: the quiet namespace's
    /// change-to-rollout latency alone and during the flood.
    Flood {
        /// Bindings in the flooding namespace, each with a key and a Deployment of its own.
        #[arg(long, default_value_t = 20)]
        bindings: usize,
        /// How often each of their keys is written, in milliseconds.
        #[arg(long, default_value_t = 50)]
        every_ms: u64,
        /// Changes to the quiet namespace's key, alone and then during the flood.
        #[arg(long, default_value_t = 30)]
        changes: usize,
        /// The controller's --namespace-write-limit (N/span), if any.
        #[arg(long)]
        namespace_write_limit: Option<String>,
    },
    /// ConfigMaps and Secrets that no binding reads: what they add to the controller's
    /// resident memory, made while it runs and listed at a start.
    Objects {
        #[arg(long, default_value_t = 2_000)]
        config_maps: usize,
        #[arg(long, default_value_t = 2_000)]
        secrets: usize,
        /// Bytes of data in each.
        #[arg(long, default_value_t = 8_192)]
        bytes: usize,
        /// Deployments that no binding targets, beside them.
        #[arg(long, default_value_t = 3_000)]
        deployments: usize,
    },
    /// This controller beside k8s-consul-mutator-rs, built from fetched copies, on the same
    /// servers, one at a time, alternating: latency, missed and spurious rollouts, memory, and a
    /// raw PATCH as the floor.
    Anchor {
        /// Deployments per controller, each bound to a key of its own.
        #[arg(long, default_value_t = 50)]
        bindings: usize,
        /// Consul writes per controller and round, one at a time.
        #[arg(long, default_value_t = 200)]
        changes: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Milliseconds to wait after each change is seen before the next one.
        #[arg(long, default_value_t = 0)]
        gap_ms: u64,
    },
    /// Time from one Consul write to every bound Deployment rolled, and the controller's memory.
    Rollout {
        /// Number of Deployments, each with its own binding.
        #[arg(long, default_value_t = 50)]
        bindings: usize,
        /// Number of writes to the key every binding shares.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
}

#[derive(Subcommand)]
enum EnvAction {
    /// Provision (first run only) and start everything, install the CRDs and write the env file.
    Up,
    /// Stop the processes that `up` started. Data is kept for the next `up`, unless --wipe.
    Down {
        /// Delete all the environment's data too (etcd, Consul, certificates, logs), so that the
        /// next `up` starts empty; the built and downloaded servers stay cached.
        #[arg(long)]
        wipe: bool,
    },
    /// Show what is running and whether it is healthy.
    Status,
    /// Stop a Consul agent and start it again, with its data or (--empty) without, to try faults.
    ConsulRestart {
        /// consul, consul-acl or consul-faults (the one the fault tests use).
        #[arg(long, default_value = "consul")]
        agent: String,
        /// Delete the agent's data before it starts again, as after a rebuild.
        #[arg(long)]
        empty: bool,
        /// Seconds to keep it down.
        #[arg(long, default_value_t = 0)]
        down: u64,
    },
    /// Start (or with --stop, stop) a second kube-apiserver on the same etcd, on the port after the
    /// first: a client of it sees its watches refused with 410 Gone when it comes back, and lists
    /// again.
    SecondApiserver {
        #[arg(long)]
        stop: bool,
    },
    /// Check that the node comes back from a crash: a pod runs, containerd and the kubelet are
    /// killed (SIGKILL), and `up` leaves no process, shim, mount or cgroup of the old pod and runs
    /// it again. Part of `cargo xtask test`.
    NodeCrash,
    /// Freeze a Consul agent (SIGSTOP) and thaw it (SIGCONT) after a while: its connections stay
    /// open and nothing answers, as in a long pause of the agent or its machine.
    ConsulHang {
        /// consul, consul-acl or consul-faults (the one the fault tests use).
        #[arg(long, default_value = "consul")]
        agent: String,
        /// Seconds to keep it frozen.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Just the message chain: a backtrace (with RUST_BACKTRACE set) only hides it.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    let env = env::Env::new();
    match command {
        Command::Env { action } => match action {
            EnvAction::Up => env.up(),
            EnvAction::Down { wipe } => env.down().and_then(|()| if wipe { env.wipe() } else { Ok(()) }),
            EnvAction::Status => env.status(),
            EnvAction::ConsulRestart { agent, empty, down } => {
                env.restart_consul(&agent, empty, Duration::from_secs(down))
            }
            EnvAction::SecondApiserver { stop } => env.second_apiserver(!stop),
            EnvAction::NodeCrash => env.check_node_crash(),
            EnvAction::ConsulHang { agent, seconds } => env.hang_consul(&agent, Duration::from_secs(seconds)),
        },
        Command::Test { args } => check::test::all(&env, &args),
        Command::E2e { args } => check::test::e2e_on_running(&env, &args),
        Command::Crdgen { check: only_check } => check::crdgen::run(only_check),
        Command::Explain => env.status().and_then(|()| check::explain::check(&env)),
        Command::Monitoring => check::monitoring::check(),
        Command::Helm { write } => check::helm::check(write),
        Command::Book => check::book::check(),
        Command::Image => env::image::build(),
        Command::Notices { file } => env::notices::write(&file),
        Command::Demo => env::demo::run(&env),
        Command::Sim { seeds, seed } => check::test::sim(seeds, seed),
        Command::Mutants { totals: true, .. } => check::mutants::totals(),
        Command::Mutants { seeds, again, rest, args, .. } => {
            let pick = match (again, rest) {
                (true, _) => check::mutants::Pick::Again,
                (false, true) => check::mutants::Pick::Rest,
                (false, false) => check::mutants::Pick::Args,
            };
            check::mutants::run(seeds, pick, &args)
        }
        Command::Bench { bench: Bench::Big { prefixes, values, value_bytes, changes } } => {
            bench::big::run(&env, bench::big::Sizes { prefixes, values, value_bytes, changes })
        }
        Command::Bench { bench: Bench::Overlap { keys, value_bytes, prefixes, bindings } } => {
            bench::overlap::run(&env, bench::overlap::Sizes { keys, value_bytes, prefixes, bindings })
        }
        Command::Bench { bench: Bench::Objects { config_maps, secrets, bytes, deployments } } => {
            bench::objects::run(&env, bench::objects::Sizes { config_maps, secrets, bytes, deployments })
        }
        Command::Bench { bench: Bench::Flood { bindings, every_ms, changes, namespace_write_limit } } => {
            let every = Duration::from_millis(every_ms);
            bench::flood::run(
                &env,
                bench::flood::Sizes { bindings, every, changes, write_limit: namespace_write_limit },
            )
        }
        Command::Bench { bench: Bench::Shards { bindings, namespaces, changes } } => {
            bench::shards::run(&env, bench::shards::Sizes { bindings, namespaces, changes })
        }
        Command::Bench { bench: Bench::Rollout { bindings, rounds } } => bench::rollout::run(&env, bindings, rounds),
        Command::Bench { bench: Bench::Anchor { bindings, changes, rounds, gap_ms } } => {
            let gap = Duration::from_millis(gap_ms);
            bench::anchor::run(&env, bench::anchor::Sizes { bindings, changes, rounds, gap })
        }
        Command::Bench { bench: Bench::Tenants { scopes, changes, busy_changes, max_connections, burst } } => {
            bench::tenants::run(&env, bench::tenants::Sizes { scopes, changes, busy_changes, max_connections, burst })
        }
        Command::Bench {
            bench: Bench::Scale { bindings, workloads, keys, changes, idle, max_connections, consul_tls },
        } => {
            let idle = Duration::from_secs(idle);
            let tls = consul_tls;
            bench::scale::run(
                &env,
                bench::scale::Sizes { bindings, workloads, keys, changes, idle, max_connections, tls },
            )
        }
    }
}
