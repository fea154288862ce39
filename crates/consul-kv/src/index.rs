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

#[cfg(test)]
mod tests {
    use super::next;

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
}
