//! Schedules of Consul's faults: wipes, snapshot restores, reaped tombstones, outages, a path the
//! token may no longer read, controller restarts, the go-ahead and suspend, with the targets fixed.

use super::{Kind, run_seeds};

/// Consul's faults, restarts, the go-ahead and suspend, with the targets fixed.
#[test]
fn schedules_of_consul_faults_keep_every_invariant() {
    run_seeds(Kind::Consul);
}
