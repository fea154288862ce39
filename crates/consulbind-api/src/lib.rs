//! The `ConsulBinding` custom resource: which Consul KV content drives which workloads.

mod binding;
pub mod conditions;
mod crd;
mod duration;
mod schedule;

pub use binding::*;
pub use crd::{DropNullable, crd, crd_without_rules};
pub use duration::{DURATION_PATTERN, MAX_DELAY, MAX_QUIET_PERIOD, parse_duration, parse_rate};
pub use schedule::{SCHEDULE_PATTERN, TIME_ZONE_PATTERN};

/// API group of every resource this project defines.
pub const GROUP: &str = "consulbind.dev";

/// The binding's annotation that lets one content roll outside its rollout windows: its value
/// is the checksum held (`status.rollout.checksum`, or its first 12 hex digits).
pub const ROLL_OUTSIDE_WINDOW: &str = "consulbind.dev/roll-outside-window";
