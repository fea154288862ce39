//! Consul's blocking-query index rules, kept in one place.
//!
//! See <https://developer.hashicorp.com/consul/api-docs/features/blocking#implementation-details>.

/// The index to send on the next request, given the one sent before (`prev`)
/// and the `X-Consul-Index` that came back (`returned`).
///
/// - The index went backwards (snapshot restore, leader change, tombstone
///   reaping): reset to 0, so the next request is non-blocking and re-reads.
/// - Otherwise never go below 1: a blocking request with index 0 returns at
///   once, which turns a watch into a hot loop.
pub fn next(prev: u64, returned: u64) -> u64 {
    if returned < prev { 0 } else { returned.max(1) }
}

/// The index of one watch across requests: blocking while answers come in order, and a fresh,
/// non-blocking read after any failure or an index that went backwards, so that recovery (or
/// data loss) shows at once instead of after a whole wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    /// What to send next; 0 reads without blocking.
    index: u64,
    /// The last index Consul answered, kept across failures to notice a reset behind one.
    high: u64,
    /// The last answer was lower than `high`, and is being read again before it is believed.
    doubted: bool,
}

/// What an answer says about the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The first answer, or one after a fresh read, no lower than any before.
    Fresh,
    /// Same or higher than before, on a blocking read.
    Forward,
    /// Lower than before, once: an agent that has just restarted may answer from an empty
    /// state for a moment. Read again (the index to send is 0) before believing it.
    Suspect,
    /// Lower than before, twice in a row: a snapshot restore, a rebuilt cluster or reaped
    /// tombstones.
    Reset,
}

impl Cursor {
    /// The index to send: 0 reads without blocking.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Takes the `X-Consul-Index` of an answer to a request sent with [`Cursor::index`].
    pub fn answered(&mut self, returned: u64) -> Progress {
        self.answered_above(returned, 0)
    }

    /// Takes an answer whose index must not be below `floor` either: a missing key answers
    /// the index of its whole table, which never goes below any index the table answered
    /// before, unless its data went back.
    pub fn answered_above(&mut self, returned: u64, floor: u64) -> Progress {
        let sent = self.index;
        let lower = returned < self.high || returned < floor;
        if lower && !self.doubted {
            self.doubted = true;
            self.index = 0;
            return Progress::Suspect;
        }
        self.doubted = false;
        self.high = returned;
        if lower {
            self.index = 0;
            return Progress::Reset;
        }
        self.index = next(sent, returned);
        if sent == 0 { Progress::Fresh } else { Progress::Forward }
    }

    /// After a failed request: read fresh next time.
    pub fn failed(&mut self) {
        self.index = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::{Cursor, Progress, next};

    #[test]
    fn cursor_reads_fresh_after_failures_and_resets() {
        let mut cursor = Cursor::default();
        assert_eq!(cursor.index(), 0);
        assert_eq!(cursor.answered(10), Progress::Fresh);
        assert_eq!(cursor.index(), 10);
        assert_eq!(cursor.answered(12), Progress::Forward);
        cursor.failed();
        assert_eq!(cursor.index(), 0);
        assert_eq!(cursor.answered(12), Progress::Fresh);
        assert_eq!(cursor.answered(3), Progress::Suspect);
        assert_eq!(cursor.index(), 0, "a lower index is read again");
        assert_eq!(cursor.answered(2), Progress::Reset, "lower again: believed");
        assert_eq!(cursor.index(), 0, "a reset reads fresh next");
        assert_eq!(cursor.answered(3), Progress::Fresh);
        assert_eq!(cursor.index(), 3);
        // A restart that lost data, seen only through the fresh read after the failure.
        cursor.failed();
        assert_eq!(cursor.answered(2), Progress::Suspect);
        assert_eq!(cursor.answered(2), Progress::Reset);
        // A missing key on an empty store answers index 0; never block on it.
        let mut cursor = Cursor::default();
        cursor.answered(0);
        assert_eq!(cursor.index(), 1);
    }

    #[test]
    fn an_answer_below_the_floor_is_read_again_then_believed() {
        let mut cursor = Cursor::default();
        assert_eq!(cursor.answered_above(20, 0), Progress::Fresh);
        assert_eq!(cursor.answered_above(70, 120), Progress::Suspect);
        assert_eq!(cursor.answered_above(70, 120), Progress::Reset);
        assert_eq!(cursor.answered_above(71, 70), Progress::Fresh);
        assert_eq!(cursor.answered_above(72, 70), Progress::Forward);
    }

    #[test]
    fn advances_normally() {
        assert_eq!(next(0, 7), 7);
        assert_eq!(next(7, 7), 7);
        assert_eq!(next(7, 12), 12);
    }

    #[test]
    fn resets_when_index_goes_backwards() {
        assert_eq!(next(12, 5), 0);
        assert_eq!(next(12, 0), 0);
        assert_eq!(next(2, 1), 0);
    }

    #[test]
    fn never_goes_below_one() {
        assert_eq!(next(0, 0), 1);
        // After a reset the next response restarts from whatever Consul says.
        assert_eq!(next(0, 3), 3);
    }

    #[test]
    fn a_lower_index_that_the_next_read_contradicts_is_no_reset() {
        let mut cursor = Cursor::default();
        cursor.answered(0);
        assert_eq!(cursor.answered(10), Progress::Forward);
        // A restarted agent's first answer, then its real state.
        assert_eq!(cursor.answered(1), Progress::Suspect);
        assert_eq!(cursor.answered(11), Progress::Fresh);
        assert_eq!(cursor.index(), 11);
        // The doubt does not carry over to a later lower answer.
        assert_eq!(cursor.answered(5), Progress::Suspect);
    }
}
