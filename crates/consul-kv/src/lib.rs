//! A small Consul KV client built for long-lived blocking queries.
//!
//! It knows the parts of Consul's HTTP API that watches get wrong in the wild:
//! - the request timeout always outlasts a blocking query (wait + wait/16 + margin);
//! - [`index::next`] resets on an index that goes backwards and never sends
//!   an index below 1 on a blocking request;
//! - a 404 for a missing key is an empty [`KvResponse`], with its index;
//! - tokens go only in the `X-Consul-Token` header and print as `<redacted>`.
//!
//! A response does not mean a change. Consul returns the same contents with a
//! new index when a key is deleted and recreated with the same bytes, when
//! only its flags or lock change, and when a write anywhere wakes a watch on
//! a missing key. Compare contents ([`KvResponse::same_contents`]), not indexes.
//!
//! Consul filters a recursive read by ACL without saying so: a token that
//! exists but may not read a prefix gets an empty 404, not a 403. Only an
//! exact key read, or an unknown token, yields [`ErrorKind::AccessDenied`].
//!
//! Many keys share few blocking queries through [`group`], and the client never holds more
//! connections than [`ClientConfig::max_connections`].
//!
//! The watch loop itself belongs to the caller:
//!
//! ```no_run
//! # async fn watch(client: consul_kv::Client) -> Result<(), consul_kv::Error> {
//! use consul_kv::{index::Cursor, KvQuery};
//! let query = KvQuery::prefix("app/");
//! let mut last: Option<consul_kv::KvResponse> = None;
//! let mut cursor = Cursor::default();
//! loop {
//!     // On an error: `cursor.failed()`, back off, and read fresh.
//!     let response = client.get(&query, cursor.index()).await?;
//!     cursor.answered(response.index);
//!     if !last.as_ref().is_some_and(|last| last.same_contents(&response)) {
//!         // first read, or the contents changed
//!         last = Some(response);
//!     }
//! }
//! # }
//! ```

mod backoff;
mod client;
mod config;
mod error;
pub mod group;
pub mod index;
mod kv;

pub use backoff::{Backoff, jitter};
pub use client::{Client, Lease};
pub use config::{ClientConfig, Token};
pub use error::{Error, ErrorKind};
pub use kv::{Digest, KvEntry, KvQuery, KvResponse, Scope, ScopeToken, same_entries};
