//! The `ConsulBinding` custom resource: which Consul KV content drives which workloads.

mod binding;
pub mod conditions;
mod crd;
mod duration;

pub use binding::*;
pub use crd::{DropNullable, crd, crd_without_rules};
pub use duration::{DURATION_PATTERN, MAX_DELAY, MAX_QUIET_PERIOD, parse_duration};

/// API group of every resource this project defines.
pub const GROUP: &str = "consulbind.dev";
