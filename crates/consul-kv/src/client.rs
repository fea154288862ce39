//! The HTTP client: requests within the connection budget, and statuses turned into errors.
//! What it connects through, and how that is built from the config, is in [`transport`].

mod transport;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, Response, StatusCode, Url};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};

use crate::error::{chain, excerpt};
use crate::kv::{Digest, api_url, key_url, kv_url, parse_entries, request_timeout};
use crate::{ClientConfig, Error, KvQuery, KvResponse, Token};
use transport::{build_http, read_token_file, tls_files};

const TOKEN_HEADER: &str = "X-Consul-Token";
const INDEX_HEADER: &str = "X-Consul-Index";

/// Over HTTP/2 every request is a stream on one connection, and Go's HTTP/2 server (Consul's)
/// serves 250 streams per connection by default: blocking queries may take this many of them,
/// and the rest stay free for short requests.
const STREAM_SLOTS: usize = 200;
/// Answers read and parsed at once.
const READERS: usize = 2;

/// A Consul KV client. Clones share one connection pool and one connection budget.
///
/// Over HTTP/1.1 every request in flight holds its own connection, and Consul
/// allows 200 per client IP by default (`http_max_conns_per_client`) and drops
/// the rest. So the client never holds more than `max_connections`: requests
/// wait for a permit, at most `max_connections / 8` connections stay idle, and
/// blocking queries may take only [`Client::blocking_slots`] of the permits, so
/// that they never starve the short reads and writes.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// Rebuilt by [`Client::reload`] when the TLS files change.
    http: RwLock<reqwest::Client>,
    /// The TLS files as last read, to notice a rotation.
    tls_files: Mutex<Vec<u8>>,
    config: ClientConfig,
    idle: usize,
    /// Where requests go; its host is the TLS server name when one is configured.
    base: Url,
    address: String,
    token: RwLock<Option<Token>>,
    wait: Duration,
    /// Every request in flight holds one.
    requests: Arc<Semaphore>,
    /// Blocking queries hold one of these as well.
    blocking: Arc<Semaphore>,
    blocking_slots: usize,
    /// Over HTTP/2, blocking queries hold one of these instead: they need no connection each.
    streams: Arc<Semaphore>,
    /// Answers read and parsed at once: each is held whole while it is, so a burst of big
    /// answers (a cold start) must not be held all together.
    reading: Semaphore,
    /// Stands in for values, when set: see [`Client::digest_values`].
    digest: std::sync::OnceLock<Digest>,
    /// The pool's connection speaks HTTP/2.
    multiplexed: AtomicBool,
    /// Over TLS: whether the pool holds a connection whose protocol it knows (see `settle`).
    settled: AtomicBool,
    settling: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("address", &self.inner.address)
            .field("wait", &self.inner.wait)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Builds the client. Async only to resolve the host once when
    /// `tls_server_name` is set; it sends no request.
    pub async fn new(config: ClientConfig) -> Result<Self, Error> {
        if config.wait < Duration::from_millis(1) {
            return Err(Error::Config("wait must be at least 1ms".into()));
        }
        if config.max_connections < MIN_CONNECTIONS {
            return Err(Error::Config(format!("max_connections must be at least {MIN_CONNECTIONS}")));
        }
        let budget = Budget::of(config.max_connections);
        let (http, base) = build_http(&config, budget.idle).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                http: RwLock::new(http),
                tls_files: Mutex::new(tls_files(&config)?),
                idle: budget.idle,
                base,
                address: config.address.clone(),
                token: RwLock::new(config.token.clone()),
                wait: config.wait,
                config,
                requests: Arc::new(Semaphore::new(budget.requests)),
                blocking: Arc::new(Semaphore::new(budget.blocking)),
                blocking_slots: budget.blocking,
                streams: Arc::new(Semaphore::new(STREAM_SLOTS)),
                reading: Semaphore::new(READERS),
                digest: Default::default(),
                multiplexed: AtomicBool::new(false),
                settled: AtomicBool::new(false),
                settling: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// Reads the token file and the TLS files again, and takes what changed: Vault Agent and
    /// cert-manager rotate them in place. Requests in flight finish on the old connections.
    /// Returns whether anything changed.
    pub async fn reload(&self) -> Result<bool, Error> {
        let mut changed = false;
        if let Some(path) = &self.inner.config.token_file {
            let token = read_token_file(path)?;
            let mut current = self.inner.token.write().unwrap();
            if *current != token {
                *current = token;
                changed = true;
            }
        }
        let files = tls_files(&self.inner.config)?;
        if files != *self.inner.tls_files.lock().unwrap() {
            let (http, _) = build_http(&self.inner.config, self.inner.idle).await?;
            *self.inner.http.write().unwrap() = http;
            self.inner.settled.store(false, Ordering::Release);
            *self.inner.tls_files.lock().unwrap() = files;
            changed = true;
        }
        Ok(changed)
    }

    fn default_token(&self) -> Option<Token> {
        self.inner.token.read().unwrap().clone()
    }

    /// How many blocking queries may be in flight at once; more wait for a slot. Over HTTP/2,
    /// once the first connection is up, the streams of that one connection, not the connection
    /// budget.
    pub fn blocking_slots(&self) -> usize {
        match self.inner.multiplexed.load(Ordering::Acquire) {
            true => STREAM_SLOTS,
            false => self.inner.blocking_slots,
        }
    }

    /// The configured wait of a blocking query.
    pub fn wait(&self) -> Duration {
        self.inner.wait
    }

    /// The address as configured, for display and for telling clients apart.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// Reads a key or prefix. `index == 0` is a plain read; `index >= 1` is a
    /// blocking query that returns once Consul's index passes `index` or the
    /// configured wait runs out. Compute the index with [`crate::index::next`].
    pub async fn get(&self, query: &KvQuery, index: u64) -> Result<KvResponse, Error> {
        self.get_wait(query, index, self.inner.wait, u64::MAX).await
    }

    /// [`Client::get`] with a wait of its own for a blocking query, capped at the configured one,
    /// and a limit on the bytes of the answer: past it, the rest is not read and the answer is
    /// [`Error::TooLarge`].
    pub async fn get_wait(
        &self,
        query: &KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
    ) -> Result<KvResponse, Error> {
        self.read(query, index, wait, max_bytes, self.inner.digest.get(), None).await
    }

    /// A blocking slot and, over HTTP/1.1, a connection's permit, held for as long as the lease
    /// is: a watch that holds one never waits in line between its queries, behind other
    /// watches or behind a burst of short reads.
    pub async fn lease(&self) -> Lease {
        let multiplexed = self.inner.multiplexed.load(Ordering::Acquire);
        let slots = if multiplexed { &self.inner.streams } else { &self.inner.blocking };
        let slot = slots.clone().acquire_owned().await.expect("never closed");
        let connection = match multiplexed {
            true => None,
            false => Some(self.inner.requests.clone().acquire_owned().await.expect("never closed")),
        };
        Lease { multiplexed, _slot: slot, _connection: connection }
    }

    /// [`Client::get_wait`] under `lease`, which stands for the slot and connection it needs.
    pub async fn get_leased(
        &self,
        lease: &Lease,
        query: &KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
    ) -> Result<KvResponse, Error> {
        self.read(query, index, wait, max_bytes, self.inner.digest.get(), Some(lease)).await
    }

    /// From now on, [`Client::get_wait`] and [`Client::get`] give each value as `digest` of it,
    /// made as the value is decoded: a caller that only compares values never holds them.
    pub fn digest_values(&self, digest: Digest) {
        let _ = self.inner.digest.set(digest);
    }

    /// A plain read that gives the values themselves, whatever [`Client::digest_values`] set.
    pub async fn get_values(&self, query: &KvQuery, max_bytes: u64) -> Result<KvResponse, Error> {
        self.read(query, 0, self.inner.wait, max_bytes, None, None).await
    }

    async fn read(
        &self,
        query: &KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
        digest: Option<&Digest>,
        lease: Option<&Lease>,
    ) -> Result<KvResponse, Error> {
        let wait = wait.clamp(Duration::from_millis(1), self.inner.wait);
        let blocking = (index >= 1).then_some(wait);
        let multiplexed = self.inner.multiplexed.load(Ordering::Acquire);
        // A lease taken before the protocol changed stands for nothing now.
        let leased = blocking.is_some() && lease.is_some_and(|l| l.multiplexed == multiplexed);
        let slots = if multiplexed { &self.inner.streams } else { &self.inner.blocking };
        let _slot = match blocking {
            Some(_) if !leased => Some(slots.acquire().await.expect("never closed")),
            _ => None,
        };
        // A blocking stream holds no connection, so it takes no room from the short requests.
        let _permit = match (blocking.is_some() && multiplexed) || leased {
            true => None,
            false => Some(self.permit().await),
        };
        let url = kv_url(&self.inner.base, query, index, wait);
        let token = query.token().cloned().or_else(|| self.default_token());
        let token = token.as_ref();
        let response = self.send(Method::GET, url, token, request_timeout(blocking), None).await?;
        let status = response.status();
        tracing::trace!(key = %query.key, index, status = status.as_u16(), "consul kv get");
        match status {
            StatusCode::OK | StatusCode::NOT_FOUND => {
                let index = parse_index(response.headers())?;
                let entries = match status {
                    StatusCode::OK => {
                        let _reading = self.inner.reading.acquire().await.expect("never closed");
                        parse_entries(&self.body_within(response, &query.key, max_bytes).await?, digest)?
                    }
                    _ => Vec::new(),
                };
                Ok(KvResponse { index, entries })
            }
            _ => Err(self.status_error(&query.key, "read", response, token).await),
        }
    }

    /// Whether the agent answers at all within `timeout`: any HTTP answer to
    /// `/v1/status/leader` (which needs no token) counts. A hung agent keeps its connections
    /// open and its kernel acknowledges TCP keep-alives, so only a request tells. It takes no
    /// permit, so that requests stuck on a hung agent cannot delay the check. The error says
    /// why not: no answer in time, or the request's own failure (refused, an untrusted
    /// certificate).
    pub async fn alive(&self, timeout: Duration) -> Result<(), Error> {
        let http = self.inner.http.read().unwrap().clone();
        let url = api_url(&self.inner.base, ["status", "leader"]);
        let answered = async { http.get(url).send().await?.bytes().await };
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.unreachable(&e)),
            Err(_) => Err(Error::Unreachable {
                address: self.inner.address.clone(),
                detail: format!("the agent stopped answering (no answer to a status check within {timeout:?})"),
            }),
        }
    }

    /// Writes a value (a plain, non-CAS PUT). Mostly for tests and demos.
    pub async fn put(&self, key: &str, value: &[u8], token: Option<&Token>) -> Result<(), Error> {
        let url = key_url(&self.inner.base, key);
        self.write(Method::PUT, url, key, Some(value.to_vec()), token).await
    }

    /// Deletes a key, or every key under a prefix when `recurse` is set.
    pub async fn delete(&self, key: &str, recurse: bool, token: Option<&Token>) -> Result<(), Error> {
        let mut url = key_url(&self.inner.base, key);
        if recurse {
            url.query_pairs_mut().append_key_only("recurse");
        }
        self.write(Method::DELETE, url, key, None, token).await
    }

    async fn write(
        &self,
        method: Method,
        url: Url,
        key: &str,
        body: Option<Vec<u8>>,
        token: Option<&Token>,
    ) -> Result<(), Error> {
        let token = token.cloned().or_else(|| self.default_token());
        let token = token.as_ref();
        let _permit = self.permit().await;
        let response = self.send(method, url, token, request_timeout(None), body).await?;
        if response.status() != StatusCode::OK {
            return Err(self.status_error(key, "write", response, token).await);
        }
        match self.body(response).await?.trim_ascii() {
            b"true" => Ok(()),
            other => Err(Error::Protocol(format!(
                "write to key {key:?} answered {:?} instead of true",
                excerpt(&String::from_utf8_lossy(other))
            ))),
        }
    }

    /// Held from sending a request until its body is read, so the connection is back in the
    /// pool (or closed) before another request may open one.
    async fn permit(&self) -> SemaphorePermit<'_> {
        self.inner.requests.acquire().await.expect("never closed")
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        token: Option<&Token>,
        timeout: Duration,
        body: Option<Vec<u8>>,
    ) -> Result<Response, Error> {
        let http = self.inner.http.read().unwrap().clone();
        self.settle(&http).await;
        let mut request = http.request(method, url).timeout(timeout);
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(token.expose())
                .map_err(|_| Error::Config("the ACL token has characters not allowed in an HTTP header".into()))?;
            // Keeps the value out of hyper's and reqwest's debug output.
            value.set_sensitive(true);
            request = request.header(TOKEN_HEADER, value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        request.send().await.map_err(|e| {
            self.inner.settled.store(false, Ordering::Release);
            self.unreachable(&e)
        })
    }

    /// Over TLS, Consul offers HTTP/2, but the pool learns it only once a connection is up:
    /// until then every request opens a connection of its own, as many as there are requests in
    /// flight. So after a start, a TLS reload or a connection failure, one short request
    /// (`/v1/status/leader`, which needs no token) goes first, and the others then share its
    /// connection.
    async fn settle(&self, http: &reqwest::Client) {
        if self.inner.base.scheme() != "https" || self.inner.settled.load(Ordering::Acquire) {
            return;
        }
        let _alone = self.inner.settling.lock().await;
        if self.inner.settled.load(Ordering::Acquire) {
            return;
        }
        let url = api_url(&self.inner.base, ["status", "leader"]);
        if let Ok(response) = http.get(url).timeout(request_timeout(None)).send().await {
            let multiplexed = response.version() == reqwest::Version::HTTP_2;
            tracing::debug!(version = ?response.version(), "settled the connection to Consul");
            if response.bytes().await.is_ok() {
                self.inner.multiplexed.store(multiplexed, Ordering::Release);
                self.inner.settled.store(true, Ordering::Release);
            }
        }
    }

    /// The body, read a chunk at a time so that an answer over `limit` is never held whole.
    async fn body_within(&self, mut response: Response, key: &str, limit: u64) -> Result<Vec<u8>, Error> {
        let too_large = || Error::TooLarge { key: key.to_owned(), limit };
        if response.content_length().is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let mut body = Vec::with_capacity(response.content_length().unwrap_or(0) as usize);
        while let Some(chunk) = response.chunk().await.map_err(|e| self.unreachable(&e))? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    async fn body(&self, response: Response) -> Result<Vec<u8>, Error> {
        let bytes = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        Ok(bytes.to_vec())
    }

    /// The error for a status other than the expected ones.
    async fn status_error(&self, key: &str, policy: &'static str, response: Response, token: Option<&Token>) -> Error {
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap_or_default();
        let mut body = excerpt(&String::from_utf8_lossy(&body));
        // Consul does not echo tokens, but make sure no future version can leak one here.
        if let Some(token) = token.filter(|t| !t.expose().is_empty()) {
            body = body.replace(token.expose(), "<redacted>");
        }
        if status == 400 && body.is_empty() {
            body = "a malformed request (Consul refuses a key with a character that does not print)".into();
        }
        match status {
            401 | 403 => Error::AccessDenied { key: key.to_owned(), status, message: body, policy },
            _ => Error::Server { address: self.inner.address.clone(), key: key.to_owned(), status, body },
        }
    }

    fn unreachable(&self, err: &reqwest::Error) -> Error {
        let detail = match err.is_timeout() {
            true => format!("request timed out ({})", chain(err)),
            false => chain(err),
        };
        Error::Unreachable { address: self.inner.address.clone(), detail }
    }
}

const MIN_CONNECTIONS: usize = 4;

/// What [`Client::lease`] holds.
#[must_use]
pub struct Lease {
    multiplexed: bool,
    _slot: OwnedSemaphorePermit,
    _connection: Option<OwnedSemaphorePermit>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("multiplexed", &self.multiplexed).finish_non_exhaustive()
    }
}

/// How a connection budget is split. Idle connections count against Consul's limit too, and a
/// connection on its way back to the pool is neither in use nor idle for a moment, in which a
/// new request may open another. So requests in flight, the idle pool and as much again as
/// slack stay within the budget; blocking queries leave room for short requests.
#[derive(Debug, PartialEq, Eq)]
struct Budget {
    idle: usize,
    requests: usize,
    blocking: usize,
}

impl Budget {
    fn of(max_connections: usize) -> Self {
        let idle = (max_connections / 8).max(1);
        let requests = max_connections - 2 * idle;
        Self { idle, requests, blocking: requests - idle }
    }
}

fn parse_index(headers: &HeaderMap) -> Result<u64, Error> {
    headers
        .get(INDEX_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Error::Protocol(format!("missing or invalid {INDEX_HEADER} header")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_never_exceeded_and_leaves_room_for_short_requests() {
        for max in MIN_CONNECTIONS..500 {
            let budget = Budget::of(max);
            assert!(budget.requests + 2 * budget.idle <= max, "{max}: {budget:?}");
            assert!(budget.blocking >= 1 && budget.blocking < budget.requests, "{max}: {budget:?}");
        }
        assert_eq!(Budget::of(32), Budget { idle: 4, requests: 24, blocking: 20 });
    }

    #[tokio::test]
    async fn a_leased_blocking_query_waits_for_no_permit() {
        // Nothing listens there: a request fails at once, and one waiting for a permit hangs.
        let config = ClientConfig { address: "127.0.0.1:1".into(), max_connections: 8, ..Default::default() };
        let client = Client::new(config).await.unwrap();
        let lease = client.lease().await;
        let taken = client.inner.requests.available_permits();
        let _short_reads = client.inner.requests.acquire_many(taken as u32).await.unwrap();
        let _others = client.inner.blocking.acquire_many(client.inner.blocking.available_permits() as u32).await;
        let query = KvQuery::exact("a");
        let leased = client.get_leased(&lease, &query, 5, Duration::from_secs(1), u64::MAX);
        let answered = tokio::time::timeout(Duration::from_secs(5), leased).await.expect("no wait for a permit");
        assert_eq!(answered.unwrap_err().kind(), crate::ErrorKind::Unreachable);
        let unleased = client.get_wait(&query, 5, Duration::from_secs(1), u64::MAX);
        assert!(tokio::time::timeout(Duration::from_millis(200), unleased).await.is_err(), "without it, it waits");
    }

    #[tokio::test]
    async fn too_small_a_budget_is_refused() {
        let err = Client::new(ClientConfig { max_connections: 3, ..Default::default() }).await.unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Config);
    }

    #[test]
    fn index_header_is_required() {
        let mut headers = HeaderMap::new();
        assert_eq!(parse_index(&headers).unwrap_err().kind(), crate::ErrorKind::Protocol);
        headers.insert(INDEX_HEADER, "abc".parse().unwrap());
        assert!(parse_index(&headers).is_err());
        headers.insert(INDEX_HEADER, "1234".parse().unwrap());
        assert_eq!(parse_index(&headers).unwrap(), 1234);
    }

    #[tokio::test]
    async fn certificate_without_key_is_refused() {
        let config = ClientConfig { client_cert: Some("/nonexistent/cert.pem".into()), ..Default::default() };
        let err = Client::new(config).await.unwrap_err();
        assert!(err.to_string().contains("together"), "{err}");
    }

    #[tokio::test]
    async fn ca_file_without_certificates_is_refused() {
        let path = std::env::temp_dir().join(format!("consul-kv-ca-{}", std::process::id()));
        std::fs::write(&path, "not a certificate\n").unwrap();
        let config = ClientConfig { ca_cert: Some(path.clone()), ..Default::default() };
        let err = Client::new(config).await.unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(err.kind(), crate::ErrorKind::Config, "{err}");
    }

    #[tokio::test]
    async fn token_unfit_for_a_header_is_a_config_error() {
        let client = Client::new(ClientConfig::default()).await.unwrap();
        let query = KvQuery::exact("k").with_token(Token::new("s3cr3t\n"));
        let err = client.get(&query, 0).await.unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Config);
        assert!(!format!("{err} {err:?}").contains("s3cr3t"));
    }

    /// A one-shot HTTP server on loopback: answers every request with `response` and sends the
    /// request head of each connection it accepted.
    async fn serve(response: String) -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut head = vec![0; 8192];
                let n = socket.read(&mut head).await.unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&head[..n]).into_owned());
                let _ = socket.write_all(response.as_bytes()).await;
            }
        });
        (addr, rx)
    }

    #[tokio::test]
    async fn redirects_are_not_followed_so_the_token_stays_home() {
        let (elsewhere, mut reached) =
            serve("HTTP/1.1 404 Not Found\r\nX-Consul-Index: 1\r\nContent-Length: 0\r\n\r\n".into()).await;
        let redirect = format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{elsewhere}/v1/kv/k\r\nContent-Length: 0\r\n\r\n"
        );
        let (consul, mut asked) = serve(redirect).await;
        let config =
            ClientConfig { address: consul.to_string(), token: Some(Token::new("s3cr3t")), ..Default::default() };
        let client = Client::new(config).await.unwrap();
        let err = client.get(&KvQuery::exact("k"), 0).await.unwrap_err();
        assert!(matches!(err, Error::Server { status: 307, .. }), "{err}");
        assert!(!err.to_string().contains("s3cr3t"));
        assert!(asked.recv().await.unwrap().to_lowercase().contains("x-consul-token: s3cr3t"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(reached.try_recv().is_err(), "the redirect target was asked");
    }

    #[tokio::test]
    async fn an_answer_over_the_limit_is_refused_with_or_without_a_length() {
        let entries = r#"[{"Key":"p/a","Value":"aGVsbG8=","ModifyIndex":3}]"#;
        let sized =
            format!("HTTP/1.1 200 OK\r\nX-Consul-Index: 3\r\nContent-Length: {}\r\n\r\n{entries}", entries.len());
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nX-Consul-Index: 3\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{entries}\r\n0\r\n\r\n",
            entries.len()
        );
        for response in [sized, chunked] {
            let (consul, _) = serve(response).await;
            let client = Client::new(ClientConfig { address: consul.to_string(), ..Default::default() }).await.unwrap();
            let query = KvQuery::prefix("p/");
            let err = client.get_wait(&query, 0, Duration::from_secs(1), 10).await.unwrap_err();
            assert!(matches!(err, Error::TooLarge { limit: 10, .. }), "{err}");
            assert_eq!(err.to_string(), r#"Consul's answer for "p/" is larger than 10 bytes"#);
            let read = client.get_wait(&query, 0, Duration::from_secs(1), entries.len() as u64).await.unwrap();
            assert_eq!(&*read.entries[0].value, b"hello");
        }
    }

    #[tokio::test]
    async fn a_rotated_token_file_is_picked_up_by_reload() {
        let (consul, mut asked) =
            serve("HTTP/1.1 404 Not Found\r\nX-Consul-Index: 1\r\nContent-Length: 0\r\n\r\n".into()).await;
        let path = std::env::temp_dir().join(format!("consul-kv-rotate-{}", std::process::id()));
        std::fs::write(&path, "first\n").unwrap();
        let config = ClientConfig {
            address: consul.to_string(),
            token: Some(Token::new("first")),
            token_file: Some(path.clone()),
            ..Default::default()
        };
        let client = Client::new(config).await.unwrap();
        assert!(!client.reload().await.unwrap(), "nothing changed yet");
        std::fs::write(&path, "second\n").unwrap();
        assert!(client.reload().await.unwrap());
        client.get(&KvQuery::exact("k"), 0).await.unwrap();
        assert!(asked.recv().await.unwrap().to_lowercase().contains("x-consul-token: second"));
        std::fs::remove_file(&path).unwrap();
        assert!(client.reload().await.unwrap(), "a removed file means no token");
        client.get(&KvQuery::exact("k"), 0).await.unwrap();
        assert!(!asked.recv().await.unwrap().to_lowercase().contains("x-consul-token"));
    }

    #[tokio::test]
    async fn connection_refused_is_unreachable() {
        // Port 9 (discard) is closed on test machines.
        let config =
            ClientConfig { address: "127.0.0.1:9".into(), token: Some(Token::new("s3cr3t")), ..Default::default() };
        let client = Client::new(config).await.unwrap();
        let err = client.get(&KvQuery::exact("k"), 0).await.unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unreachable);
        let text = format!("{err} {err:?}");
        assert!(text.contains("cannot reach Consul at 127.0.0.1:9"), "{text}");
        assert!(!text.contains("s3cr3t"), "{text}");
    }

    #[tokio::test]
    async fn an_agent_that_accepts_and_never_answers_is_not_alive() {
        // A listener nobody reads from: connections are accepted by the kernel, as with a
        // stopped process, and no answer ever comes.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let client = Client::new(ClientConfig { address, ..Default::default() }).await.unwrap();
        let hung = client.alive(Duration::from_millis(300)).await.unwrap_err();
        assert!(hung.to_string().contains("stopped answering"), "{hung}");
        let (addr, _requests) = serve("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\"\"".into()).await;
        let client = Client::new(ClientConfig { address: addr.to_string(), ..Default::default() }).await.unwrap();
        assert!(client.alive(Duration::from_secs(5)).await.is_ok());
        drop(listener);
        // A failure of its own says what it is, not that the agent hangs.
        let refused = ClientConfig { address: "127.0.0.1:9".into(), ..Default::default() };
        let refused = Client::new(refused).await.unwrap().alive(Duration::from_secs(5)).await.unwrap_err();
        assert!(!refused.to_string().contains("stopped answering"), "{refused}");
    }
}
