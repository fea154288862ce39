//! Command-line flags. Every flag can also be set from the environment variable named beside it.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{CommandFactory, Parser, ValueEnum};
use consul_kv::{ClientConfig, Token};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "consulbind",
    version,
    about = "Rolls Kubernetes workloads when the Consul KV content they read changes"
)]
pub struct Config {
    /// Consul HTTP address, with scheme.
    #[arg(long, env = "CONSUL_HTTP_ADDR", default_value = "http://127.0.0.1:8500")]
    pub consul_http_addr: String,

    /// Default Consul ACL token, for bindings without a tokenSecretRef.
    #[arg(long, env = "CONSUL_HTTP_TOKEN", hide_env_values = true, value_parser = token)]
    pub consul_http_token: Option<Token>,

    /// File holding the default Consul ACL token, read again every 5 s, so that a rotated
    /// token takes effect without a restart. `--consul-http-token` wins if both are set. A file
    /// that does not exist means no default token (an optional Secret that is not there).
    #[arg(long, env = "CONSUL_HTTP_TOKEN_FILE")]
    pub consul_http_token_file: Option<PathBuf>,

    /// PEM file of the CA that signed Consul's certificate.
    #[arg(long, env = "CONSUL_CACERT")]
    pub consul_cacert: Option<PathBuf>,

    /// PEM client certificate, for Consul agents that verify incoming TLS.
    #[arg(long, env = "CONSUL_CLIENT_CERT")]
    pub consul_client_cert: Option<PathBuf>,

    /// PEM key of the client certificate.
    #[arg(long, env = "CONSUL_CLIENT_KEY")]
    pub consul_client_key: Option<PathBuf>,

    /// Verify Consul's TLS certificate.
    #[arg(long, env = "CONSUL_HTTP_SSL_VERIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub consul_http_ssl_verify: bool,

    /// Name to verify Consul's certificate against, when it differs from the address's host.
    #[arg(long, env = "CONSUL_TLS_SERVER_NAME")]
    pub consul_tls_server_name: Option<String>,

    /// How long one blocking Consul query waits for a change, such as `5m`.
    #[arg(long, env = "CONSULBIND_CONSUL_WAIT", default_value = "5m", value_parser = duration)]
    pub consul_wait: Duration,

    /// The most HTTP connections held to Consul at once. Consul drops connections past its
    /// `limits.http_max_conns_per_client` (200 by default); keep well under it.
    #[arg(long, env = "CONSULBIND_CONSUL_MAX_CONNECTIONS", default_value_t = 32, value_parser = clap::value_parser!(u16).range(4..))]
    pub consul_max_connections: u16,

    /// How long Consul may fail before the bindings show it. A shorter blip changes nothing.
    #[arg(long, env = "CONSULBIND_CONSUL_FAILURE_GRACE", default_value = "5s", value_parser = duration)]
    pub consul_failure_grace: Duration,

    /// How long reading a bound ConfigMap or Secret may fail before the binding shows it
    /// (`ObjectUnreadable`). A shorter failure changes nothing; the read is retried meanwhile.
    #[arg(long, env = "CONSULBIND_OBJECT_FAILURE_GRACE", default_value = "5s", value_parser = duration)]
    pub object_failure_grace: Duration,

    /// After Consul's index went backwards (a snapshot restore, a rebuilt cluster), content
    /// that differs from what the targets carry rolls only once it has been stable this long,
    /// whatever the binding's quiet period: a restore written back key by key is one change.
    #[arg(long, env = "CONSULBIND_CONSUL_RESTORE_GRACE", default_value = "30s", value_parser = duration)]
    pub consul_restore_grace: Duration,

    /// Consul key prefixes that bindings may read with the default token, comma-separated (`*`
    /// allows every key), in every namespace without the `consulbind.dev/default-token-prefixes`
    /// annotation. Unset, the default token serves only namespaces whose annotation allows it.
    #[arg(long, env = "CONSULBIND_DEFAULT_TOKEN_PREFIXES")]
    pub default_token_prefixes: Option<String>,

    /// The most keys one recursively bound prefix may hold. Past it the binding shows
    /// `PrefixTooLarge` and the content is not kept.
    #[arg(long, env = "CONSULBIND_MAX_PREFIX_ENTRIES", default_value_t = 2000)]
    pub max_prefix_entries: usize,

    /// The most bytes of keys and values one recursively bound prefix may hold. Past it the
    /// binding shows `PrefixTooLarge`, and Consul's answer is cut off unread at about twice this.
    #[arg(long, env = "CONSULBIND_MAX_PREFIX_BYTES", default_value_t = 4 << 20)]
    pub max_prefix_bytes: u64,

    /// The most bytes of keys and values all of one binding's keys and prefixes may hold
    /// together. Past it the binding shows `BindingTooLarge`.
    #[arg(long, env = "CONSULBIND_MAX_BINDING_BYTES", default_value_t = 32 << 20)]
    pub max_binding_bytes: u64,

    /// The most ConsulBindings of one namespace served, the oldest first: one namespace cannot
    /// multiply the controller's watches and writes past it. The others show
    /// `TooManyBindings` until older ones are deleted.
    #[arg(long, env = "CONSULBIND_MAX_BINDINGS_PER_NAMESPACE", default_value_t = 5000)]
    pub max_bindings_per_namespace: usize,

    /// The most distinct Consul paths (key or prefix, with its token) the bindings of one
    /// namespace watch. A binding whose keys would take its namespace past it watches nothing
    /// and shows `TooManyWatchedPaths` until paths are freed; the bindings watching already
    /// keep their paths.
    #[arg(long, env = "CONSULBIND_MAX_WATCHED_PATHS_PER_NAMESPACE", default_value_t = 20_000)]
    pub max_watched_paths_per_namespace: usize,

    /// A rollout budget for bindings without `spec.rollout.budget`, as `N/span`, such as `3/1h`:
    /// each target is rolled at most N times by one binding within any span. None by default,
    /// so that no change is held back by surprise.
    #[arg(long, env = "CONSULBIND_DEFAULT_ROLLOUT_BUDGET", value_parser = crate::reconcile::staging::Budget::parse)]
    pub default_rollout_budget: Option<crate::reconcile::staging::Budget>,

    /// Rollout windows for bindings without `spec.rollout.windows`, as a JSON list of windows
    /// in the same form, such as `[{"schedule": "0 22 * * 1-5", "duration": "6h",
    /// "timeZone": "Europe/Paris"}]`. None by default: changes roll when they settle.
    #[arg(long, env = "CONSULBIND_DEFAULT_ROLLOUT_WINDOWS", value_parser = crate::reconcile::calendar::Calendar::parse)]
    pub default_rollout_windows: Option<crate::reconcile::calendar::Calendar>,

    /// The most writes (workload stamps, statuses, events) the controller has in flight to the
    /// API server at once. A namespace alone may use them all; namespaces that compete take
    /// them in turn, one write each, so one namespace's flood of changes cannot delay another's
    /// rollout by more than a write.
    #[arg(long, env = "CONSULBIND_MAX_CONCURRENT_WRITES", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_writes: u16,

    /// A hard limit on each namespace's writes (workload stamps, statuses, events), as `N/span`
    /// such as `100/1m`: a namespace may write N at once, then one every span/N. A namespace over
    /// it shows `WriteLimited` on its bindings, with an event, and its changes wait, coalesced.
    /// None by default: the fair sharing of `--max-concurrent-writes` is enough for most.
    #[arg(long, env = "CONSULBIND_NAMESPACE_WRITE_LIMIT", value_parser = crate::writes::Rate::parse)]
    pub namespace_write_limit: Option<crate::writes::Rate>,

    /// The most data keys a bound ConfigMap or Secret may have: the controller keeps a digest
    /// of each. Past it, its bindings show `BindingTooLarge` and roll nothing.
    #[arg(long, env = "CONSULBIND_MAX_OBJECT_KEYS", default_value_t = 4096)]
    pub max_object_keys: usize,

    /// Report what every binding would roll, and roll nothing, whatever `spec.rollout.mode`
    /// says: for a first install in a production cluster.
    #[arg(long, env = "CONSULBIND_DRY_RUN", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub dry_run: bool,

    /// Namespaces to serve, comma-separated. Empty serves every namespace.
    #[arg(long, env = "CONSULBIND_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,

    /// Address of the HTTP server for /metrics, /livez and /readyz.
    #[arg(long, env = "CONSULBIND_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,

    /// Address of the HTTP server for /debug/watches, which lists every tenant's keys and
    /// bindings. Keep it on loopback; `none` turns it off.
    #[arg(long, env = "CONSULBIND_DEBUG_ADDR", default_value = "127.0.0.1:8081", value_parser = debug_addr)]
    pub debug_addr: DebugAddr,

    /// Log format.
    #[arg(long, env = "CONSULBIND_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The Secret that holds the key of every checksum, made on first start: `name` in the
    /// controller's own namespace, or `namespace/name`. Back it up: without it, every bound
    /// workload rolls once.
    #[arg(long, env = "CONSULBIND_CHECKSUM_KEY_SECRET", default_value = "consulbind-checksum-key")]
    pub checksum_key_secret: String,

    /// Elect a leader through a Lease, so that only one replica acts.
    #[arg(long, env = "CONSULBIND_LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Name of the leader Lease.
    #[arg(long, env = "CONSULBIND_LEASE_NAME", default_value = "consulbind-leader")]
    pub lease_name: String,

    /// Namespace of the leader Lease. Defaults to the namespace the pod runs in.
    #[arg(long, env = "CONSULBIND_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// How long a leader's claim lasts without renewal; a standby takes over after this.
    #[arg(long, env = "CONSULBIND_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,

    /// How often the leader renews, and a standby retries.
    #[arg(long, env = "CONSULBIND_LEASE_RENEW", default_value = "5s", value_parser = duration)]
    pub lease_renew: Duration,

    /// This replica's identity in the Lease. Defaults to the host name.
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
        if self.leader_elect && self.lease_renew.saturating_mul(3) >= self.lease_duration.saturating_mul(2) {
            return Err(format!(
                "--lease-renew ({:?}) must be under two thirds of --lease-duration ({:?}), so a leader that cannot \
                 renew stops before a standby takes over",
                self.lease_renew, self.lease_duration
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
    }
}
