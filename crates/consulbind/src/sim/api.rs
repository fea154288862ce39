//! Schedules with the controller's API server away and back, its caches listing again in pages.

use super::{Kind, run_seeds};

/// With the controller's API server away and back as well: while its caches list again, the
/// binding reads what they held before, and the end of the re-list wakes it.
#[test]
fn schedules_with_the_api_server_away_keep_every_invariant() {
    run_seeds(Kind::Api);
}
