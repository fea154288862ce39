//! The paths one group's query serves, and how long its blocking queries may wait: alone, or
//! taking turns with the other groups of its namespace in a lane.

use std::{sync::Arc, time::Duration};

use consul_kv::group::{Members, WatchPath};
use tokio::sync::Semaphore;

use crate::watches::path::Path;

/// The longest wait of a blocking query of a group in a lane, so that the lane's groups take turns.
pub const ROTATION_WAIT: Duration = Duration::from_secs(10);
/// How long a lane's turns may take to come round, as long as its waits are at least
/// [`MIN_WAIT`]: a lane of many groups on few slots waits less each time.
const LANE_CYCLE: Duration = Duration::from_secs(30);
/// The shortest wait of a blocking query.
pub(in crate::watches) const MIN_WAIT: Duration = Duration::from_secs(1);

/// Slots that the groups of one namespace take turns on, when it has more groups than its share.
pub struct Lane {
    pub slots: Semaphore,
    pub permits: usize,
    /// The wait of each of its blocking queries.
    pub wait: Duration,
    /// How long a full round of turns takes, at most: how late a change may show.
    pub cycle: Duration,
}

impl Lane {
    pub fn new(groups: usize, permits: usize) -> Self {
        let permits = permits.max(1);
        let rounds = groups.div_ceil(permits).max(1) as u32;
        let wait = (LANE_CYCLE / rounds).clamp(MIN_WAIT, ROTATION_WAIT);
        Self { slots: Semaphore::new(permits), permits, wait, cycle: wait * rounds }
    }
}

/// The paths one group's query serves, and how it may block.
pub struct Roster {
    /// The paths, sorted, and the cell of each in the same order.
    pub(super) members: Members,
    pub cells: Vec<Arc<Path>>,
    /// The slots the group takes turns on with the other groups of its namespace.
    pub(super) lane: Option<Arc<Lane>>,
    /// Consul refuses the token of every path: the planner gave it no slot.
    pub(super) parked: bool,
}

impl Roster {
    pub fn new(paths: Vec<WatchPath>, cells: Vec<Arc<Path>>, lane: Option<Arc<Lane>>, parked: bool) -> Self {
        Self { members: Members::new(paths), cells, lane, parked }
    }

    pub fn paths(&self) -> &[WatchPath] {
        self.members.paths()
    }

    pub fn same(&self, other: &Roster) -> bool {
        self.paths() == other.paths()
            && self.cells.iter().zip(&other.cells).all(|(a, b)| Arc::ptr_eq(a, b))
            && self.parked == other.parked
            && match (&self.lane, &other.lane) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (a, b) => a.is_none() && b.is_none(),
            }
    }
}
