//! Where a runner's answers come from: the Consul client, or a script in tests, and how much
//! one bound path may hold.

use std::time::Duration;

use consul_kv::{Client, Digest, Error, KvQuery, KvResponse, Lease};
use futures::future::BoxFuture;

use super::runner::MIN_WAIT;

/// Where the answers come from: the Consul client, or a script in tests.
pub trait KvSource: Send + Sync + 'static {
    fn get_wait<'a>(
        &'a self,
        query: &'a KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
    ) -> BoxFuture<'a, Result<KvResponse, Error>>;

    /// How many blocking queries may be in flight at once.
    fn blocking_slots(&self) -> usize;

    /// The longest wait of a blocking query.
    fn wait(&self) -> Duration;

    /// Whether the agent answers at all within `timeout`.
    fn alive(&self, timeout: Duration) -> BoxFuture<'_, Result<(), Error>>;

    /// Where the answers come from, for messages.
    fn address(&self) -> &str;

    /// From now on, answers give `digest` of each value in its place.
    fn digest_values(&self, _digest: Digest) {}

    /// A blocking slot and its connection, held across queries ([`Client::lease`]); `None`
    /// where the source has no such limits.
    fn lease(&self) -> BoxFuture<'_, Option<Lease>> {
        Box::pin(async { None })
    }

    /// [`KvSource::get_wait`] under a lease.
    fn get_leased<'a>(
        &'a self,
        _lease: &'a Lease,
        query: &'a KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
    ) -> BoxFuture<'a, Result<KvResponse, Error>> {
        self.get_wait(query, index, wait, max_bytes)
    }

    /// A plain read with the values themselves.
    fn get_values<'a>(&'a self, query: &'a KvQuery, max_bytes: u64) -> BoxFuture<'a, Result<KvResponse, Error>> {
        self.get_wait(query, 0, MIN_WAIT, max_bytes)
    }
}

impl KvSource for Client {
    fn get_wait<'a>(
        &'a self,
        query: &'a KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
    ) -> BoxFuture<'a, Result<KvResponse, Error>> {
        Box::pin(Client::get_wait(self, query, index, wait, max_bytes))
    }

    fn digest_values(&self, digest: Digest) {
        Client::digest_values(self, digest);
    }

    fn lease(&self) -> BoxFuture<'_, Option<Lease>> {
        Box::pin(async { Some(Client::lease(self).await) })
    }

    fn get_leased<'a>(
        &'a self,
        lease: &'a Lease,
        query: &'a KvQuery,
        index: u64,
        wait: Duration,
        max_bytes: u64,
    ) -> BoxFuture<'a, Result<KvResponse, Error>> {
        Box::pin(Client::get_leased(self, lease, query, index, wait, max_bytes))
    }

    fn get_values<'a>(&'a self, query: &'a KvQuery, max_bytes: u64) -> BoxFuture<'a, Result<KvResponse, Error>> {
        Box::pin(Client::get_values(self, query, max_bytes))
    }

    fn blocking_slots(&self) -> usize {
        Client::blocking_slots(self)
    }

    fn wait(&self) -> Duration {
        Client::wait(self)
    }

    fn alive(&self, timeout: Duration) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(Client::alive(self, timeout))
    }

    fn address(&self) -> &str {
        Client::address(self)
    }
}

/// How much one bound prefix may hold. Past either, its bindings show `PrefixTooLarge` and its
/// content is never kept.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub entries: usize,
    /// Bytes of keys and values.
    pub bytes: u64,
}

impl Limits {
    /// The most bytes of Consul's answer for one path: JSON with values in base64 is about
    /// 4/3 of the raw size, plus a little per entry. An exact key may hold up to Consul's own
    /// limit of 512 KiB, whatever the prefix limit.
    pub fn answer_bytes(&self, recurse: bool) -> u64 {
        let prefix = self.bytes.saturating_mul(2).saturating_add(64 << 10);
        if recurse { prefix } else { prefix.max(1 << 20) }
    }
}
