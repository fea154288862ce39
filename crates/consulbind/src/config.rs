//! Command-line flags. Every flag can also be set from the environment variable named beside it.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{CommandFactory, Parser, ValueEnum};
use consul_kv::{ClientConfig, Token};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "consulbind",
    version,
    about = "Rolls Kubernetes workloads when the Consul KV content they read changes",
    after_help = "From Reloader or Wave: `consulbind migrate --help` turns their annotations into ConsulBindings."
)]
pub struct Config {
    /// Consul HTTP address, with its scheme: `http://` or `https://`.
    #[arg(long, env = "CONSUL_HTTP_ADDR", default_value = "http://127.0.0.1:8500")]
    pub consul_http_addr: String,

    /// Default Consul ACL token, for bindings without a `tokenSecretRef`.
    ///
    /// It reads only the keys that the namespace's `consulbind.dev/default-token-prefixes`
    /// annotation, else `--default-token-prefixes`, allows. Never logged.
    #[arg(long, env = "CONSUL_HTTP_TOKEN", hide_env_values = true, value_parser = token)]
    pub consul_http_token: Option<Token>,

    /// File holding the default Consul ACL token; `--consul-http-token` wins if both are set.
    ///
    /// Read again every 5 s, so that a rotated token (Vault Agent) takes effect without a
    /// restart. A file that does not exist means no default token (an optional Secret that is
    /// not there).
    #[arg(long, env = "CONSUL_HTTP_TOKEN_FILE")]
    pub consul_http_token_file: Option<PathBuf>,

    /// PEM file of the CA that signed Consul's certificate.
    ///
    /// This file and the client certificate and key are read again every 5 s, so that files
    /// rotated in place (cert-manager) take effect without a restart.
    #[arg(long, env = "CONSUL_CACERT")]
    pub consul_cacert: Option<PathBuf>,

    /// PEM client certificate, for Consul agents that verify incoming TLS.
    #[arg(long, env = "CONSUL_CLIENT_CERT")]
    pub consul_client_cert: Option<PathBuf>,

    /// PEM key of the client certificate.
    #[arg(long, env = "CONSUL_CLIENT_KEY")]
    pub consul_client_key: Option<PathBuf>,

    /// Verify Consul's TLS certificate.
    ///
    /// It takes a value: `--consul-http-ssl-verify=false` turns the check off.
    #[arg(long, env = "CONSUL_HTTP_SSL_VERIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub consul_http_ssl_verify: bool,

    /// Name to verify Consul's certificate against, when it differs from the address's host.
    #[arg(long, env = "CONSUL_TLS_SERVER_NAME")]
    pub consul_tls_server_name: Option<String>,

    /// How long one blocking Consul query waits for a change, such as `5m`.
    #[arg(long, env = "CONSULBIND_CONSUL_WAIT", default_value = "5m", value_parser = duration)]
    pub consul_wait: Duration,

    /// The most HTTP connections held to Consul at once, at least 4.
    ///
    /// Consul drops connections past its `limits.http_max_conns_per_client` (200 by default),
    /// counted per client address: keep well under it, less what else runs on the
    /// controller's address. See the book's page "Many keys on few connections".
    #[arg(long, env = "CONSULBIND_CONSUL_MAX_CONNECTIONS", default_value_t = 32, value_parser = clap::value_parser!(u16).range(4..))]
    pub consul_max_connections: u16,

    /// How long Consul may fail before the bindings show it.
    ///
    /// A shorter blip shows nowhere and writes nothing.
    #[arg(long, env = "CONSULBIND_CONSUL_FAILURE_GRACE", default_value = "5s", value_parser = duration)]
    pub consul_failure_grace: Duration,

    /// How long reading a bound ConfigMap or Secret may fail before the binding shows
    /// `ObjectUnreadable`.
    ///
    /// A shorter failure shows nowhere and writes nothing; the read is retried meanwhile.
    #[arg(long, env = "CONSULBIND_OBJECT_FAILURE_GRACE", default_value = "5s", value_parser = duration)]
    pub object_failure_grace: Duration,

    /// After Consul's index went backwards (a snapshot restore, a rebuilt cluster), how long
    /// content that differs from what the targets carry must stay put before it rolls.
    ///
    /// This holds whatever the binding's quiet period, so that a restore written back key by
    /// key is one change. See the book's page "The data-loss guard".
    #[arg(long, env = "CONSULBIND_CONSUL_RESTORE_GRACE", default_value = "30s", value_parser = duration)]
    pub consul_restore_grace: Duration,

    /// Consul key prefixes that bindings may read with the default token, comma-separated (`*`
    /// allows every key), in every namespace without the `consulbind.dev/default-token-prefixes`
    /// annotation.
    ///
    /// Only `*` lets it read a Consul namespace or partition. Unset, the default token serves
    /// only namespaces whose annotation allows it. See the book's page "One controller for many
    /// teams".
    #[arg(long, env = "CONSULBIND_DEFAULT_TOKEN_PREFIXES")]
    pub default_token_prefixes: Option<String>,

    /// The most keys one recursively bound prefix may hold.
    ///
    /// Past it the binding shows `PrefixTooLarge` and the content is not kept.
    #[arg(long, env = "CONSULBIND_MAX_PREFIX_ENTRIES", default_value_t = 2000)]
    pub max_prefix_entries: usize,

    /// The most bytes of keys and values one recursively bound prefix may hold.
    ///
    /// Past it the binding shows `PrefixTooLarge`, and Consul's answer is cut off unread at
    /// about twice this, so that memory stays flat. No answer may be larger (nor larger than
    /// 1 MiB, if that is more), a read that several keys share included: a larger shared read
    /// is split into reads of their own.
    #[arg(long, env = "CONSULBIND_MAX_PREFIX_BYTES", default_value_t = 4 << 20)]
    pub max_prefix_bytes: u64,

    /// The most bytes of keys and values all of one binding's keys and prefixes may hold
    /// together.
    ///
    /// Past it the binding shows `BindingTooLarge`, rolls nothing and watches nothing: it
    /// reads its keys again after about 5 minutes, or at once when its spec changes. Values
    /// are never kept (only a digest of each), so this bounds the reads, not what is held.
    #[arg(long, env = "CONSULBIND_MAX_BINDING_BYTES", default_value_t = 32 << 20)]
    pub max_binding_bytes: u64,

    /// The most ConsulBindings of one namespace served, the oldest first (by creation time,
    /// then name).
    ///
    /// It keeps one namespace from multiplying the controller's watches and writes without
    /// end. The default leaves room for the 2,000 bindings of one namespace that `bench scale`
    /// runs; a platform team with many tenants sets it to what one team needs. The others show
    /// `TooManyBindings`, watch nothing and roll nothing; each is served once enough older ones
    /// are deleted (the oldest waiting first, at each deletion), and then starts as a new
    /// binding does.
    #[arg(long, env = "CONSULBIND_MAX_BINDINGS_PER_NAMESPACE", default_value_t = 5000)]
    pub max_bindings_per_namespace: usize,

    /// The most distinct Consul paths (a key or prefix, with the token that reads it) the
    /// bindings of one namespace watch.
    ///
    /// It keeps one namespace from multiplying the controller's queries and memory without
    /// end; the default leaves room for the 10,000 keys of one namespace that `bench scale` runs. A
    /// binding whose keys would take its namespace past it watches nothing and shows
    /// `TooManyWatchedPaths`, with an event; paths its namespace watches already cost nothing
    /// more, and the bindings watching keep their paths. It is looked at again every 15 s, and
    /// served once other bindings free paths.
    #[arg(long, env = "CONSULBIND_MAX_WATCHED_PATHS_PER_NAMESPACE", default_value_t = 20_000)]
    pub max_watched_paths_per_namespace: usize,

    /// A rollout budget for bindings without `spec.rollout.budget`, as `N/span` such as `3/1h`.
    ///
    /// Each target is rolled at most N times by one binding within any span. Unset, bindings
    /// without a budget have none, so that no change is held back by surprise.
    #[arg(long, env = "CONSULBIND_DEFAULT_ROLLOUT_BUDGET", value_parser = crate::reconcile::staging::Budget::parse)]
    pub default_rollout_budget: Option<crate::reconcile::staging::Budget>,

    /// Rollout windows for bindings without `spec.rollout.windows`, as a JSON list of windows
    /// in the same form.
    ///
    /// For example `[{"schedule": "0 22 * * 1-5", "duration": "6h", "timeZone":
    /// "Europe/Paris"}]`. Unset, changes roll when they settle.
    #[arg(long, env = "CONSULBIND_DEFAULT_ROLLOUT_WINDOWS", value_parser = crate::reconcile::calendar::Calendar::parse)]
    pub default_rollout_windows: Option<crate::reconcile::calendar::Calendar>,

    /// The most writes (workload stamps, statuses, events) in flight to the API server at once.
    ///
    /// A namespace alone may use them all; namespaces that compete for them take them in
    /// turn, one write each. So a namespace whose content changes without pause queues behind
    /// its own writes (its changes coalesce, none is lost), while another namespace's writes
    /// wait for at most one of each busy namespace's. Lower it to cap what a flood can ask of
    /// a small API server; the book's page "A namespace that never stops changing" shows what
    /// that costs a fan-out.
    #[arg(long, env = "CONSULBIND_MAX_CONCURRENT_WRITES", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_writes: u16,

    /// Speak HTTP/2 to the API server: a connection carries up to 100 requests and watches at
    /// once, and another opens past that.
    ///
    /// Over HTTP/1.1 each request in flight and each watch holds a connection, about a hundred
    /// during a cold start of 10,000 bindings, each closed after 10 s unused. HTTP/2 holds one
    /// connection on the API server where a cold start opened a hundred, and 1 to 2 MiB less
    /// at that size, but its cold starts and patches were slower in most runs (the benchmarks'
    /// Scale page). It takes a value: `--api-http2=true`.
    #[arg(long, env = "CONSULBIND_API_HTTP2", default_value_t = false, action = clap::ArgAction::Set)]
    pub api_http2: bool,

    /// A hard limit on each namespace's writes, as `N/span` such as `100/1m` (N at least 1,
    /// the span at most 24h).
    ///
    /// A namespace may write N at once, then one every span/N, counting every workload stamp,
    /// status and event the controller writes there. A reconcile of a namespace over it writes
    /// nothing but one status, `Ready=False` with reason `WriteLimited`, and one event (those
    /// two take none of the limit, or the namespace could never be told); its changes wait,
    /// coalesced, and the last one rolls once the namespace is within it.
    /// `consulbind_writes_held_total{namespace}` counts the reconciles held. Unset, namespaces
    /// are only shared fairly by `--max-concurrent-writes`.
    #[arg(long, env = "CONSULBIND_NAMESPACE_WRITE_LIMIT", value_parser = crate::writes::Rate::parse)]
    pub namespace_write_limit: Option<crate::writes::Rate>,

    /// The most data keys a bound ConfigMap or Secret may have.
    ///
    /// The controller keeps a 32-byte digest of each while some binding reads the object: the
    /// digests go when the last binding that reads it stops, or the object goes. Past it the
    /// bindings that read it show `BindingTooLarge`, naming it, and roll nothing.
    #[arg(long, env = "CONSULBIND_MAX_OBJECT_KEYS", default_value_t = 4096)]
    pub max_object_keys: usize,

    /// Run every binding in `DryRun` mode, whatever its `spec.rollout.mode` says.
    ///
    /// No workload is patched; the status and events say what would have rolled. For a first
    /// install in a production cluster. `--dry-run` alone means `--dry-run=true`.
    #[arg(long, env = "CONSULBIND_DRY_RUN", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub dry_run: bool,

    /// Namespaces to serve, comma-separated; unset or empty, every namespace.
    #[arg(long, env = "CONSULBIND_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,

    /// Address of the HTTP server for `/livez`, `/readyz` and `/metrics`.
    #[arg(long, env = "CONSULBIND_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,

    /// Address of the HTTP server for `/debug/watches`; `none` turns it off.
    ///
    /// It lists every watched key with its bindings and the query that reads it, every
    /// team's keys, so it has a listener of its own: keep it on loopback, and reach it with
    /// `kubectl port-forward`.
    #[arg(long, env = "CONSULBIND_DEBUG_ADDR", default_value = "127.0.0.1:8081", value_parser = debug_addr)]
    pub debug_addr: DebugAddr,

    /// Log format: `text` or `json`.
    ///
    /// `RUST_LOG` sets the level (`info` when unset).
    #[arg(long, env = "CONSULBIND_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The Secret that holds the key of every checksum: `name` in the controller's own
    /// namespace, or `namespace/name`.
    ///
    /// Made on first start. Back it up: without it, every bound workload rolls once.
    #[arg(long, env = "CONSULBIND_CHECKSUM_KEY_SECRET", default_value = "consulbind-checksum-key")]
    pub checksum_key_secret: String,

    /// Elect a leader through a Lease, so that only one replica acts.
    ///
    /// It takes a value: `--leader-elect=true`.
    #[arg(long, env = "CONSULBIND_LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Share the namespaces between replicas, each holding a Lease of its own in the ring.
    ///
    /// Every namespace is served by one live replica, chosen by a hash of its name or pinned
    /// with the namespace annotation `consulbind.dev/shard: <replica>`. A replica that joins,
    /// leaves or dies moves only its own share, and no replica writes for a namespace until
    /// the one before it has stopped. Not with `--leader-elect`. It takes a value:
    /// `--sharding=true`.
    #[arg(long, env = "CONSULBIND_SHARDING", default_value_t = false, action = clap::ArgAction::Set)]
    pub sharding: bool,

    /// Name of the shard ring: each replica's Lease is `<ring>-<identity>`, labelled
    /// `consulbind.dev/ring=<ring>`.
    #[arg(long, env = "CONSULBIND_SHARD_RING", default_value = "consulbind")]
    pub shard_ring: String,

    /// Name of the leader Lease.
    #[arg(long, env = "CONSULBIND_LEASE_NAME", default_value = "consulbind-leader")]
    pub lease_name: String,

    /// Namespace of the leader Lease, or of the shard ring's Leases; unset, the controller's
    /// own namespace (the pod's, else the kubeconfig's).
    #[arg(long, env = "CONSULBIND_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// How long a leader's claim lasts without renewal.
    ///
    /// A standby takes over at most this plus one `--lease-renew` period after the leader
    /// stops renewing. With `--sharding`, each replica's own Lease, at most 5m.
    #[arg(long, env = "CONSULBIND_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,

    /// How often the leader renews the Lease, and a standby tries to take it.
    ///
    /// Must be under two thirds of `--lease-duration` (checked with `--leader-elect`): a
    /// leader that has not renewed for two thirds of it exits, counted from when its last
    /// successful renewal was sent, however slowly that was answered.
    #[arg(long, env = "CONSULBIND_LEASE_RENEW", default_value = "5s", value_parser = duration)]
    pub lease_renew: Duration,

    /// This replica's holder identity in the Lease; unset, the host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

fn token(text: &str) -> Result<Token, String> {
    Ok(Token::new(text))
}

/// Where the debug listing listens, if anywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugAddr(pub Option<SocketAddr>);

fn debug_addr(text: &str) -> Result<DebugAddr, String> {
    match text {
        "none" => Ok(DebugAddr(None)),
        addr => addr.parse().map(|a| DebugAddr(Some(a))).map_err(|e| format!("{addr:?}: {e}")),
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    consulbind_api::parse_duration(text)
}

/// The namespace the controller runs in: its pod's, else the kubeconfig's.
pub fn own_namespace(client: &kube::Client) -> String {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .map(|ns| ns.trim().to_owned())
        .unwrap_or_else(|_| client.default_namespace().to_owned())
}

impl Config {
    /// Parses the flags and environment, and exits with a usage error when they contradict
    /// one another.
    pub fn parse_checked() -> Self {
        let config = Self::parse();
        if let Err(message) = config.check() {
            Self::command().error(clap::error::ErrorKind::ArgumentConflict, message).exit();
        }
        config
    }

    /// What no single flag's parser can check.
    pub fn check(&self) -> Result<(), String> {
        // A leader that cannot renew stops at two thirds of the lease; renewing less often
        // than that would stop it between renewals.
        if self.leader_elect && self.sharding {
            return Err("--sharding and --leader-elect exclude each other: with sharding every replica acts, each on \
                        its own namespaces"
                .into());
        }
        if (self.leader_elect || self.sharding)
            && self.lease_renew.saturating_mul(3) >= self.lease_duration.saturating_mul(2)
        {
            return Err(format!(
                "--lease-renew ({:?}) must be under two thirds of --lease-duration ({:?}), so a leader that cannot \
                 renew stops before a standby takes over",
                self.lease_renew, self.lease_duration
            ));
        }
        if self.sharding && self.lease_duration > crate::shards::MAX_LEASE {
            return Err(format!(
                "--lease-duration ({:?}) must be at most {:?} with --sharding: the ring counts no Lease for longer",
                self.lease_duration,
                crate::shards::MAX_LEASE
            ));
        }
        Ok(())
    }

    /// The namespace and name of the checksum key Secret.
    pub fn checksum_key_secret(&self, client: &kube::Client) -> (String, String) {
        match self.checksum_key_secret.split_once('/') {
            Some((ns, name)) => (ns.to_owned(), name.to_owned()),
            None => (own_namespace(client), self.checksum_key_secret.clone()),
        }
    }

    pub fn consul(&self) -> Result<ClientConfig, String> {
        let token = match (&self.consul_http_token, &self.consul_http_token_file) {
            (Some(token), _) => Some(token.expose().trim().to_owned()),
            (None, Some(path)) => match std::fs::read_to_string(path) {
                Ok(token) => Some(token.trim().to_owned()),
                // An optional Secret that is not there mounts no file: run without a default token.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    tracing::warn!(path = %path.display(), "CONSUL_HTTP_TOKEN_FILE does not exist; using no default token");
                    None
                }
                Err(e) => return Err(format!("reading CONSUL_HTTP_TOKEN_FILE {}: {e}", path.display())),
            },
            (None, None) => None,
        };
        Ok(ClientConfig {
            address: self.consul_http_addr.clone(),
            token: token.filter(|t| !t.is_empty()).map(Token::new),
            // Re-read while running, unless a token given directly wins.
            token_file: self.consul_http_token_file.clone().filter(|_| self.consul_http_token.is_none()),
            ca_cert: self.consul_cacert.clone(),
            client_cert: self.consul_client_cert.clone(),
            client_key: self.consul_client_key.clone(),
            ssl_verify: self.consul_http_ssl_verify,
            tls_server_name: self.consul_tls_server_name.clone(),
            wait: self.consul_wait,
            max_connections: self.consul_max_connections.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The book's page of flags, from clap: every visible flag, in clap's order, with its
    /// environment variable, defaults and long help.
    fn page() -> String {
        let rows: String = Config::command()
            .get_arguments()
            .filter(|arg| !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version"))
            .map(row)
            .collect();
        format!(
            "<!-- Generated from the controller's flags (crates/consulbind/src/config.rs) by its unit test; \
             CONSULBIND_WRITE_REFERENCE=1 cargo test -p consulbind --lib config writes it. Do not edit. -->\n\n\
             # Controller flags and environment variables\n\n\
             Every flag can also be set from the environment variable beside it.\n\n\
             | Flag | Environment | Default | Meaning |\n| --- | --- | --- | --- |\n{rows}\n\
             Kubernetes access comes from the in-cluster service account or `KUBECONFIG`.\n\n\
             In a kustomize install, set a flag as its environment variable in the ConfigMap `consulbind-config` \
             (see [On any cluster](../getting-started/cluster.md)); in a Helm install, through the \
             [Helm values](helm-values.md).\n\n\
             The binary has two other commands, each with its own `--help`: `consulbind migrate` writes \
             ConsulBindings from Reloader's and Wave's annotations (see [Migration](../migration.md)), and \
             `consulbind probe` is what the Helm chart's `helm test` pod runs.\n"
        )
    }

    /// One flag's row: its long help (or help, whose last period clap drops) on one line.
    fn row(arg: &clap::Arg) -> String {
        let flag = arg.get_long().unwrap_or_else(|| panic!("{} has no long name", arg.get_id()));
        let env = arg.get_env().map_or_else(|| "none".to_owned(), |env| format!("`{}`", env.to_string_lossy()));
        let defaults: Vec<String> =
            arg.get_default_values().iter().map(|value| format!("`{}`", value.to_string_lossy())).collect();
        let defaults = if defaults.is_empty() { "none".to_owned() } else { defaults.join(", ") };
        let help = match (arg.get_long_help(), arg.get_help()) {
            (Some(long), _) => long.to_string(),
            (None, Some(help)) => format!("{}.", help.to_string().trim_end_matches('.')),
            (None, None) => panic!("--{flag} has no doc comment"),
        };
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(!help.contains("]("), "--{flag}: a Markdown link would show in --help; name the book's page in words");
        format!("| `--{flag}` | {env} | {defaults} | {} |\n", help.replace('|', "\\|"))
    }

    #[test]
    fn the_books_page_of_flags_is_the_commands() {
        crate::reference::hold("docs/src/reference/flags.md", &page(), "config");
    }

    #[test]
    fn flags_parse_and_token_is_hidden() {
        let config = Config::parse_from([
            "consulbind",
            "--consul-http-addr=https://consul:8501",
            "--consul-http-token=s3cr3t",
            "--namespaces=a,b",
            "--consul-http-ssl-verify=false",
        ]);
        assert_eq!(config.namespaces, ["a", "b"]);
        assert_eq!(config.debug_addr, DebugAddr(Some("127.0.0.1:8081".parse().unwrap())));
        let off = Config::parse_from(["consulbind", "--debug-addr=none"]);
        assert_eq!(off.debug_addr, DebugAddr(None));
        let consul = config.consul().unwrap();
        assert!(!consul.ssl_verify);
        assert_eq!(consul.wait, Duration::from_secs(300));
        assert!(!format!("{consul:?}").contains("s3cr3t"));
        assert!(!format!("{config:?}").contains("s3cr3t"));
    }

    #[test]
    fn malformed_limits_are_refused_naming_the_flag() {
        for (flag, value) in [
            ("--namespace-write-limit", "0/1m"),
            ("--namespace-write-limit", "100"),
            ("--namespace-write-limit", "5/48h"),
            ("--max-concurrent-writes", "0"),
            ("--max-concurrent-writes", "70000"),
            ("--default-rollout-budget", "0/1h"),
            ("--default-rollout-budget", "3/0s"),
        ] {
            let error = Config::try_parse_from(["consulbind", &format!("{flag}={value}")]).unwrap_err().to_string();
            assert!(error.contains(flag) && error.contains(value), "{flag}={value}: {error}");
        }
        let extreme = Config::parse_from(["consulbind", "--namespace-write-limit=1/24h", "--max-concurrent-writes=1"]);
        assert_eq!(extreme.namespace_write_limit.map(|r| r.max), Some(1));
        assert_eq!(extreme.max_concurrent_writes, 1);
    }

    #[test]
    fn the_lease_must_be_renewed_well_within_its_duration() {
        let parse = |renew: &str| {
            Config::parse_from([
                "consulbind",
                "--leader-elect=true",
                "--lease-duration=15s",
                &format!("--lease-renew={renew}"),
            ])
        };
        assert!(parse("9s").check().is_ok());
        assert!(parse("10s").check().unwrap_err().contains("two thirds of --lease-duration"));
        assert!(parse("100000000000000s").check().is_err(), "no overflow");
        let no_election = Config::parse_from(["consulbind", "--lease-renew=1h"]);
        assert!(no_election.check().is_ok(), "only checked with --leader-elect");
        let sharded = |duration: &str| {
            let lease = format!("--lease-duration={duration}");
            Config::parse_from(["consulbind", "--sharding=true", &lease, "--lease-renew=5s"]).check()
        };
        assert!(sharded("5m").is_ok());
        assert!(sharded("301s").unwrap_err().contains("at most 300s with --sharding"));
    }
}
