//! The API server's client: kube's own stack, offering HTTP/2 if asked. Over HTTP/1.1 every
//! request in flight and every watch holds a connection of its own: a cold start of 10,000
//! bindings opens about a hundred, each with its TLS state and buffers, closed once idle for
//! [`IDLE`]. Over HTTP/2 a connection carries many, up to [`STREAMS`] at once, and another opens
//! past that. The controller makes no upgraded requests (exec, attach, port-forward), which
//! HTTP/2 cannot carry.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};

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
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, retry::RetryLayer};
use tracing::debug;

use crate::Lock;

/// A connection silent this long is pinged, and dropped if the ping is not answered in
/// [`PING_TIMEOUT`]: every watch shares it, and a peer gone without a word (a node lost, a
/// NAT's entry expired) would otherwise stall them all until TCP gives up, many minutes later.
/// client-go's figures.
const PING_AFTER: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Streams one HTTP/2 connection carries at once. The API server allows 250 (Go's default;
/// `--http2-max-streams-per-connection` may lower it) and queues the rest, while a watch holds
/// its stream for minutes: a controller given many `--namespaces` holds about ten watches for
/// each, and past the limit its Lease renewals and writes would wait behind them. hyper never
/// opens a second connection to a host on its own, so [`Spread`] does, as client-go's transport
/// does.
const STREAMS: usize = 100;

/// How long an idle HTTP/1.1 connection is kept (kube's and client-go's pools: 90 s). A cold
/// start opens one per request in flight, about a hundred at 10,000 bindings, each holding its
/// TLS state and buffers; one opened again costs a TLS handshake.
const IDLE: Duration = Duration::from_secs(10);
/// An HTTP/2 connection's, kube's: hyper's pool times one out by when it last took a request,
/// even while its watches stream on, and the next request then opens another beside it.
const IDLE_HTTP2: Duration = Duration::from_secs(90);

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
    let pool = move || {
        Pool::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(if http2 { IDLE_HTTP2 } else { IDLE })
            .http2_keep_alive_interval(PING_AFTER)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(connector.clone())
    };
    let stack = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from);
    Ok(match http2 {
        true => Client::new(stack.service(Spread::new(pool)), config.default_namespace),
        false => Client::new(stack.service(pool()), config.default_namespace),
    })
}

/// Requests spread over connections of at most [`STREAMS`] each: a request goes on the first
/// with room, and a new connection opens when none has. A stream is counted from the request
/// until its response's body is dropped, which for a watch is when the watch ends.
struct Spread<S> {
    lanes: Arc<Mutex<Vec<Lane<S>>>>,
    open: Arc<dyn Fn() -> S + Send + Sync>,
}

impl<S> Clone for Spread<S> {
    fn clone(&self) -> Self {
        Self { lanes: self.lanes.clone(), open: self.open.clone() }
    }
}

struct Lane<S> {
    service: S,
    streams: Arc<AtomicUsize>,
}

impl<S> Spread<S> {
    fn new(open: impl Fn() -> S + Send + Sync + 'static) -> Self {
        Self { lanes: Arc::default(), open: Arc::new(open) }
    }
}

impl<S, B, R> Service<Request<B>> for Spread<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<Counted<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Each lane is readied as its request is sent.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (service, stream) = {
            let mut lanes = self.lanes.locked();
            let lane = match lanes.iter().position(|lane| lane.streams.load(Ordering::Relaxed) < STREAMS) {
                Some(i) => &lanes[i],
                None => {
                    lanes.push(Lane { service: (self.open)(), streams: Arc::default() });
                    debug!(connections = lanes.len(), "another HTTP/2 connection to the API server");
                    &lanes[lanes.len() - 1]
                }
            };
            (lane.service.clone(), Stream::open(&lane.streams))
        };
        Box::pin(async move {
            let response = service.oneshot(request).await?;
            Ok(response.map(|body| Counted { body, _stream: stream }))
        })
    }
}

/// One stream counted on its lane until dropped.
struct Stream(Arc<AtomicUsize>);

impl Stream {
    fn open(streams: &Arc<AtomicUsize>) -> Self {
        streams.fetch_add(1, Ordering::Relaxed);
        Self(streams.clone())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response's body, holding its stream's place.
struct Counted<B> {
    body: B,
    _stream: Stream,
}

impl<B: Body + Unpin> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
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

    type Lane = tower::util::BoxCloneService<Request<()>, Response<String>, String>;

    /// Lanes that answer with their own number, or fail for a request to `/fail`.
    fn lanes() -> (Spread<Lane>, Arc<AtomicUsize>) {
        let opened = Arc::new(AtomicUsize::new(0));
        let count = opened.clone();
        let spread = Spread::new(move || {
            let lane = count.fetch_add(1, Ordering::Relaxed);
            Lane::new(tower::service_fn(move |request: Request<()>| async move {
                match request.uri().path() {
                    "/fail" => Err(format!("lane {lane} failed")),
                    _ => Ok(Response::new(lane.to_string())),
                }
            }))
        });
        (spread, opened)
    }

    async fn send(spread: &mut Spread<Lane>, path: &str) -> Result<Response<Counted<String>>, String> {
        spread.call(Request::get(path).body(()).unwrap()).await
    }

    #[tokio::test]
    async fn a_connection_carries_its_share_of_streams_and_another_opens_past_it() {
        let (mut spread, opened) = lanes();
        let mut held = Vec::new();
        for _ in 0..STREAMS {
            held.push(send(&mut spread, "/watch").await.unwrap());
        }
        assert!(held.iter().all(|r| r.body().body == "0"));
        assert_eq!(opened.load(Ordering::Relaxed), 1);

        let past = send(&mut spread, "/watch").await.unwrap();
        assert_eq!(past.body().body, "1", "a full connection takes no more");
        assert_eq!(opened.load(Ordering::Relaxed), 2);

        held.pop();
        let freed = send(&mut spread, "/get").await.unwrap();
        assert_eq!(freed.body().body, "0", "a body dropped gives its stream back to the first");
        drop(freed);
        assert_eq!(send(&mut spread, "/fail").await.err().unwrap(), "lane 0 failed");
        assert_eq!(send(&mut spread, "/get").await.unwrap().body().body, "0", "a failed request holds no stream");
        assert_eq!(opened.load(Ordering::Relaxed), 2, "no connection opens while one has room");
    }
}
