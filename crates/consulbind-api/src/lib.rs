//! The `ConsulBinding` custom resource: which Consul KV content drives which workloads.

mod binding;
pub mod conditions;
mod duration;

pub use binding::*;
pub use duration::{DURATION_PATTERN, parse_duration};

/// API group of every resource this project defines.
pub const GROUP: &str = "consulbind.dev";
