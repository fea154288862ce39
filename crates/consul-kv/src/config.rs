//! Client configuration and the standard `CONSUL_*` environment variables.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::Error;

/// An ACL token, held by `secrecy`: `Debug` and `Display` print `<redacted>`, so a token
/// never reaches a log line by accident, and its memory is zeroed when dropped. Call
/// [`Token::expose`] to get the text.
#[derive(Clone)]
pub struct Token(SecretString);

impl Token {
    pub fn new(s: impl Into<String>) -> Self {
        Self(SecretString::from(s.into()))
    }

    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

// Equal tokens read the same data, so watches with equal tokens may share a query.
impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for Token {}

impl std::hash::Hash for Token {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.expose().hash(state);
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How to reach one Consul agent.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `http://127.0.0.1:8500` or `https://host:8501`; a bare `host:port` means http.
    pub address: String,
    /// Sent when a query carries no token of its own.
    pub token: Option<Token>,
    /// Where `token` came from; [`crate::Client::reload`] reads it again.
    pub token_file: Option<PathBuf>,
    /// PEM CA bundle. When set, it replaces the built-in roots, as in Consul's own client.
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate; needs `client_key`.
    pub client_cert: Option<PathBuf>,
    /// PEM private key for `client_cert`.
    pub client_key: Option<PathBuf>,
    /// `false` accepts any server certificate.
    pub ssl_verify: bool,
    /// Verify the server certificate against this name instead of the address host.
    pub tls_server_name: Option<String>,
    /// How long Consul may hold a blocking query. Consul caps it at 10 minutes.
    pub wait: Duration,
    /// The most HTTP connections this client holds to Consul at once, busy and idle together.
    /// Consul closes connections past `limits.http_max_conns_per_client` (200 by default).
    pub max_connections: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            address: "http://127.0.0.1:8500".to_owned(),
            token: None,
            token_file: None,
            ca_cert: None,
            client_cert: None,
            client_key: None,
            ssl_verify: true,
            tls_server_name: None,
            wait: Duration::from_secs(5 * 60),
            max_connections: 32,
        }
    }
}

impl ClientConfig {
    /// Reads the standard Consul environment variables, like the `consul` CLI:
    /// `CONSUL_HTTP_ADDR`, `CONSUL_HTTP_SSL`, `CONSUL_HTTP_TOKEN`,
    /// `CONSUL_HTTP_TOKEN_FILE`, `CONSUL_CACERT`, `CONSUL_CLIENT_CERT`,
    /// `CONSUL_CLIENT_KEY`, `CONSUL_HTTP_SSL_VERIFY` and `CONSUL_TLS_SERVER_NAME`.
    pub fn from_env() -> Result<Self, Error> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`ClientConfig::from_env`] with any source of variables. Empty values
    /// count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut config = Self::default();

        let ssl = var("CONSUL_HTTP_SSL").map(|v| parse_bool("CONSUL_HTTP_SSL", &v)).transpose()?.unwrap_or(false);
        if let Some(addr) = var("CONSUL_HTTP_ADDR") {
            // An explicit scheme wins over CONSUL_HTTP_SSL, as in Consul's Go client.
            config.address = match addr.contains("://") {
                true => addr,
                false if ssl => format!("https://{addr}"),
                false => format!("http://{addr}"),
            };
        } else if ssl {
            config.address = "https://127.0.0.1:8500".to_owned();
        }

        config.token = match (var("CONSUL_HTTP_TOKEN"), var("CONSUL_HTTP_TOKEN_FILE")) {
            (Some(token), _) => Some(Token::new(token.trim())),
            (None, Some(path)) => {
                config.token_file = Some(PathBuf::from(&path));
                Some(read_token_file(&path)?)
            }
            (None, None) => None,
        };
        config.ca_cert = var("CONSUL_CACERT").map(PathBuf::from);
        config.client_cert = var("CONSUL_CLIENT_CERT").map(PathBuf::from);
        config.client_key = var("CONSUL_CLIENT_KEY").map(PathBuf::from);
        if let Some(v) = var("CONSUL_HTTP_SSL_VERIFY") {
            config.ssl_verify = parse_bool("CONSUL_HTTP_SSL_VERIFY", &v)?;
        }
        config.tls_server_name = var("CONSUL_TLS_SERVER_NAME");
        Ok(config)
    }
}

fn read_token_file(path: &str) -> Result<Token, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read CONSUL_HTTP_TOKEN_FILE {path:?}: {e}")))?;
    match text.trim() {
        "" => Err(Error::Config(format!("CONSUL_HTTP_TOKEN_FILE {path:?} is empty"))),
        token => Ok(Token::new(token)),
    }
}

/// The spellings Go's `strconv.ParseBool` accepts, which is what Consul uses.
fn parse_bool(name: &str, value: &str) -> Result<bool, Error> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(Error::Config(format!("{name} must be true or false, not {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from_vars(vars: &[(&str, &str)]) -> Result<ClientConfig, Error> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ClientConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_without_variables() {
        let config = from_vars(&[]).unwrap();
        assert_eq!(config.address, "http://127.0.0.1:8500");
        assert!(config.token.is_none());
        assert!(config.ssl_verify);
        assert_eq!(config.wait, Duration::from_secs(300));
    }

    #[test]
    fn reads_address_and_tls_settings() {
        let config = from_vars(&[
            ("CONSUL_HTTP_ADDR", "https://consul.example:8501"),
            ("CONSUL_CACERT", "/etc/consul/ca.pem"),
            ("CONSUL_CLIENT_CERT", "/etc/consul/cert.pem"),
            ("CONSUL_CLIENT_KEY", "/etc/consul/key.pem"),
            ("CONSUL_HTTP_SSL_VERIFY", "0"),
            ("CONSUL_TLS_SERVER_NAME", "server.dc1.consul"),
        ])
        .unwrap();
        assert_eq!(config.address, "https://consul.example:8501");
        assert_eq!(config.ca_cert, Some(PathBuf::from("/etc/consul/ca.pem")));
        assert_eq!(config.client_cert, Some(PathBuf::from("/etc/consul/cert.pem")));
        assert_eq!(config.client_key, Some(PathBuf::from("/etc/consul/key.pem")));
        assert!(!config.ssl_verify);
        assert_eq!(config.tls_server_name.as_deref(), Some("server.dc1.consul"));
    }

    #[test]
    fn ssl_flag_applies_only_to_a_bare_address() {
        let bare = from_vars(&[("CONSUL_HTTP_ADDR", "consul:8501"), ("CONSUL_HTTP_SSL", "true")]);
        assert_eq!(bare.unwrap().address, "https://consul:8501");
        let plain = from_vars(&[("CONSUL_HTTP_ADDR", "consul:8500")]);
        assert_eq!(plain.unwrap().address, "http://consul:8500");
        let explicit = from_vars(&[("CONSUL_HTTP_ADDR", "http://c:8500"), ("CONSUL_HTTP_SSL", "1")]);
        assert_eq!(explicit.unwrap().address, "http://c:8500");
    }

    #[test]
    fn token_wins_over_token_file() {
        let config =
            from_vars(&[("CONSUL_HTTP_TOKEN", "from-env"), ("CONSUL_HTTP_TOKEN_FILE", "/nonexistent/ignored")])
                .unwrap();
        assert_eq!(config.token.unwrap().expose(), "from-env");
    }

    #[test]
    fn token_file_is_trimmed() {
        let path = std::env::temp_dir().join(format!("consul-kv-token-{}", std::process::id()));
        std::fs::write(&path, "  from-file\n").unwrap();
        let config = from_vars(&[("CONSUL_HTTP_TOKEN_FILE", path.to_str().unwrap())]);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(config.unwrap().token.unwrap().expose(), "from-file");
    }

    #[test]
    fn bad_values_are_config_errors() {
        for vars in [
            [("CONSUL_HTTP_SSL_VERIFY", "maybe")],
            [("CONSUL_HTTP_SSL", "yes")],
            [("CONSUL_HTTP_TOKEN_FILE", "/nonexistent/token")],
        ] {
            let err = from_vars(&vars).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Config, "{err}");
            assert!(err.to_string().contains(vars[0].0), "{err}");
        }
    }

    #[test]
    fn token_is_redacted() {
        let token = Token::new("s3cr3t");
        assert_eq!(format!("{token:?}"), "<redacted>");
        assert_eq!(token.to_string(), "<redacted>");
        let config = ClientConfig { token: Some(token), ..Default::default() };
        assert!(!format!("{config:?}").contains("s3cr3t"));
    }
}
