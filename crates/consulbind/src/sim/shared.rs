//! Schedules with a second binding on one workload, reading the same keys.

use super::{Kind, run_seeds};

/// With the target changes, and a second binding on `web` reading the same keys: a change both
/// read is one template change of `web`, not one per binding. Seed 94: a target found or gone
/// restarted the others' quiet periods; and after a Consul index reset the bindings left their
/// restore grace at different times, so a change rolled `web` once as each grace ended (now the
/// first write carries the other binding's held stamp of the same checksum).
#[test]
fn schedules_with_two_bindings_on_a_workload_keep_every_invariant() {
    run_seeds(Kind::Shared);
}
