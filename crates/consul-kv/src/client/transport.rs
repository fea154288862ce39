//! The transport a [`ClientConfig`] describes: its address, its TLS files and the reqwest
//! client built from them, and the files [`Client::reload`](super::Client::reload) reads again.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::Url;

use crate::error::chain;
use crate::{ClientConfig, Error, Token};

/// The HTTP client and the base URL for `config`.
pub(super) async fn build_http(config: &ClientConfig, idle: usize) -> Result<(reqwest::Client, Url), Error> {
    let mut base = parse_address(&config.address)?;
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("consulbind-consul-kv/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(5))
        // Detect dead peers on long polls that carry no data for minutes: TCP keep-alive for
        // HTTP/1.1, and pings on the one HTTP/2 connection, which a hung agent leaves unanswered.
        .tcp_keepalive(Duration::from_secs(30))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .http2_keep_alive_timeout(Duration::from_secs(5))
        .http2_keep_alive_while_idle(true)
        .pool_max_idle_per_host(idle)
        // A redirect could carry the token to another host.
        .redirect(reqwest::redirect::Policy::none());
    // Over TLS, Consul offers HTTP/2, and every request shares one connection. Plain HTTP stays
    // HTTP/1.1: Consul does not speak HTTP/2 without TLS.
    if base.scheme() == "http" {
        builder = builder.http1_only();
    }
    let mut builder = with_tls(builder, config)?;
    if let (Some(name), "https") = (&config.tls_server_name, base.scheme()) {
        let addrs = resolve(&base, &config.address).await?;
        builder = builder.resolve_to_addrs(name, &addrs);
        base.set_host(Some(name)).map_err(|e| Error::Config(format!("bad TLS server name {name:?}: {e}")))?;
    }
    let http = builder.build().map_err(|e| Error::Config(format!("cannot build HTTP client: {}", chain(&e))))?;
    Ok((http, base))
}

/// The bytes of every configured TLS file, in order.
pub(super) fn tls_files(config: &ClientConfig) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    let files = [
        ("CA certificate", &config.ca_cert),
        ("client certificate", &config.client_cert),
        ("client key", &config.client_key),
    ];
    for (what, path) in files {
        if let Some(path) = path {
            bytes.extend(read_pem(what, path)?);
        }
        bytes.push(0);
    }
    Ok(bytes)
}

/// The token in a token file: none when the file is missing or empty, as when an optional
/// Secret is not there.
pub(super) fn read_token_file(path: &std::path::Path) -> Result<Option<Token>, Error> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim()).filter(|t| !t.is_empty()).map(Token::new)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Config(format!("cannot read token file {path:?}: {e}"))),
    }
}

/// Adds the CA, the client certificate and the verification setting.
fn with_tls(mut builder: reqwest::ClientBuilder, config: &ClientConfig) -> Result<reqwest::ClientBuilder, Error> {
    if let Some(path) = &config.ca_cert {
        let pem = read_pem("CA certificate", path)?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| Error::Config(format!("bad CA certificate {path:?}: {e}")))?;
        if certs.is_empty() {
            return Err(Error::Config(format!("no PEM certificate in CA file {path:?}")));
        }
        // Like Consul's own client: a configured CA replaces the public roots.
        builder = builder.tls_built_in_root_certs(false);
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    match (&config.client_cert, &config.client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = read_pem("client key", key)?;
            pem.push(b'\n');
            pem.extend(read_pem("client certificate", cert)?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| Error::Config(format!("bad client certificate or key: {e}")))?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        _ => {
            return Err(Error::Config("client certificate and client key must be set together".into()));
        }
    }
    Ok(builder.danger_accept_invalid_certs(!config.ssl_verify))
}

/// Parses a configured address; a bare `host:port` means http.
fn parse_address(address: &str) -> Result<Url, Error> {
    let with_scheme = match address.contains("://") {
        true => address.to_owned(),
        false => format!("http://{address}"),
    };
    let url = Url::parse(&with_scheme).map_err(|e| Error::Config(format!("bad Consul address {address:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::Config(format!("bad Consul address {address:?}: only http:// and https:// are supported")));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(Error::Config(format!("bad Consul address {address:?}: expected scheme://host:port")));
    }
    Ok(url)
}

/// The socket addresses of the configured host, so that requests can go to
/// the TLS server name and still reach the real host.
async fn resolve(base: &Url, address: &str) -> Result<Vec<SocketAddr>, Error> {
    let port = base.port_or_known_default().unwrap_or(443);
    let unreachable = |detail: String| Error::Unreachable { address: address.to_owned(), detail };
    // IPv6 hosts come bracketed in URLs; lookup_host parses IP literals itself.
    let host = base.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| unreachable(format!("cannot resolve {host}: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(unreachable("the host resolved to no address".into()));
    }
    Ok(addrs)
}

fn read_pem(what: &str, path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Config(format!("cannot read {what} {path:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let url = parse_address("127.0.0.1:8500").unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:8500/");
        let url = parse_address("https://consul.example:8501").unwrap();
        assert_eq!(url.scheme(), "https");
        for bad in ["unix:///var/run/consul.sock", "http://a:1/?x=1", "http://u@host:1", "::"] {
            let err = parse_address(bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Config, "{bad}");
        }
    }
}
