//! Schedules that change the targets too: the selector target relabelled in and out, its template's
//! references to the ConfigMap added and dropped, the ConfigMap edited, rollouts undone, workloads
//! deleted and made again.

use super::{Kind, run_seeds};

/// With the selector target relabelled and its references changed as well. Each target
/// carries the checksum of what it reads; with one checksum for the whole binding, a reference
/// that one target added or dropped rolled the others for nothing (seed 376).
#[test]
fn schedules_with_target_changes_keep_every_invariant() {
    run_seeds(Kind::Targets);
}
