//! consulbind: rolls Kubernetes workloads when the Consul KV content they read changes.
//!
//! The path of a change: a shared blocking query in [`watches`] sees new content and wakes the
//! bindings that read it; [`reconcile`] gathers what Consul and the workload caches in
//! [`workloads`] say, [`plan`] decides (checksums from [`checksum`], debounce from
//! [`debounce`]), [`workloads::stamp`] patches the pod templates, and the status is written.

pub mod admin;
pub mod argo;
pub mod checksum;
pub mod checksum_key;
pub mod config;
pub mod controller;
pub mod debounce;
pub mod express;
pub mod interest;
pub mod lease;
pub mod metrics;
pub mod names;
pub mod plan;
pub mod policy;
pub mod reconcile;
pub mod tokens;
pub mod watches;
pub mod workloads;
