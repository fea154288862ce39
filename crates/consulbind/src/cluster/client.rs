//! The API server's client: kube's own stack, offering HTTP/2 if asked. Over HTTP/1.1 every
//! request in flight and every watch holds a connection of its own, kept 90 s once idle: a cold
//! start of 10,000 bindings opens about a hundred, each with its TLS state and buffers. Over
//! HTTP/2 one connection carries them all. The controller makes no upgraded requests (exec,
//! attach, port-forward), which HTTP/2 cannot carry.

use std::time::Duration;

use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::{
    client::legacy::{Client as Pool, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use kube::{
    Client, Config,
    client::{ConfigExt, RustlsTlsError, retry::RetryPolicy},
};
use tower::{BoxError, ServiceBuilder, retry::RetryLayer};

/// A connection silent this long is pinged, and dropped if the ping is not answered in
/// [`PING_TIMEOUT`]: every watch shares it, and a peer gone without a word (a node lost, a
/// NAT's entry expired) would otherwise stall them all until TCP gives up, many minutes later.
/// client-go's figures.
const PING_AFTER: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client as `Client::try_default` builds it, offering HTTP/2 if `http2`.
pub async fn connect(http2: bool) -> kube::Result<Client> {
    build(Config::infer().await.map_err(kube::Error::InferConfig)?, http2)
}

fn build(config: Config, http2: bool) -> kube::Result<Client> {
    // A proxy this client would not use: kube's own builder says so, as it is built without one.
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // Over HTTP/2 many small frames share the connection: Nagle's wait on the server's delayed
    // ACK would hold a request's last frame back.
    http.set_nodelay(true);
    let mut tls = HttpsConnectorBuilder::new().with_tls_config(config.rustls_client_config()?).https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name.clone().try_into().map_err(|e| kube::Error::RustlsTls(RustlsTlsError::InvalidServerName(e)))?;
        tls = tls.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let tls = match http2 {
        true => tls.enable_all_versions().wrap_connector(http),
        false => tls.enable_http1().wrap_connector(http),
    };
    let mut connector = TimeoutConnector::new(tls);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let pool = Pool::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_AFTER)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(pool);
    Ok(Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_proxy_it_cannot_use_is_refused_not_ignored() {
        let mut config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("http://proxy.internal:3128".parse().unwrap());
        let refused = build(config, true).err().expect("refused");
        assert!(matches!(refused, kube::Error::ProxyProtocolDisabled { .. }), "{refused}");
    }
}
