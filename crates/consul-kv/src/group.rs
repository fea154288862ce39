//! Many watched keys on few blocking queries.
//!
//! Every blocking query in flight holds a connection, so a watcher with more keys than
//! connections reads them in groups: the sorted keys and prefixes of one scope (datacenter,
//! namespace, partition and token) are cut into at most `slots` runs, and each run is read by
//! one recursive query on the longest prefix its keys share. Runs follow the key hierarchy,
//! like the branches of a trie, largest first, so that a group's prefix covers little beyond
//! its own keys and no two groups read the same prefix. When a group's
//! query answers, [`Members::changed`] finds the watched paths whose entries moved, comparing
//! the new entries with the last ones key by key, so the work after a write grows with what
//! changed, not with the number of watched keys.
//!
//! A watched path, and what an answer holds for each, are in `members`; the cutting into
//! groups is in `plan`.

mod members;
mod plan;

pub use crate::kv::{Scope, ScopeToken};

pub use members::{Members, WatchPath, merge, select, span};
pub use plan::{Group, assign, partition};

/// Splits `slots` among scopes in proportion to their paths, at least one each.
pub fn shares(sizes: &[usize], slots: usize) -> Vec<usize> {
    let total: usize = sizes.iter().sum();
    let spare = slots.saturating_sub(sizes.len());
    sizes.iter().map(|&n| 1 + (spare * n).checked_div(total).unwrap_or(0)).collect()
}

/// Splits `slots` fairly among claimants that can use at most `demands` each: every claimant
/// gets as much as it asks for or an equal part of what is left, whichever is less (max-min
/// fairness), so one claimant's size never shrinks another's part below an equal split. When
/// slots are fewer than claimants, the first ones get one each.
pub fn fair(demands: &[usize], slots: usize) -> Vec<usize> {
    let mut got = vec![0; demands.len()];
    let mut left = slots;
    loop {
        let wanting: Vec<usize> = (0..demands.len()).filter(|&i| got[i] < demands[i]).collect();
        if wanting.is_empty() || left == 0 {
            return got;
        }
        let each = (left / wanting.len()).max(1);
        for i in wanting {
            let add = each.min(demands[i] - got[i]).min(left);
            got[i] += add;
            left -= add;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KvEntry;

    fn entry(key: &str, value: &str, modify_index: u64) -> KvEntry {
        KvEntry::new(key, value, modify_index)
    }

    /// A small deterministic generator, so the property tests need no extra crate.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    fn random_key(rng: &mut Lcg) -> String {
        let depth = 1 + rng.below(3);
        (0..depth).map(|_| ["a", "b", "ab", "c", "é"][rng.below(5) as usize]).collect::<Vec<_>>().join("/")
    }

    fn random_paths(rng: &mut Lcg, n: usize) -> Vec<WatchPath> {
        let mut paths: Vec<WatchPath> = (0..n)
            .map(|_| {
                let recurse = rng.below(3) == 0;
                let mut key = random_key(rng);
                if recurse && rng.below(2) == 0 {
                    key.push('/');
                }
                WatchPath { key: key.into(), recurse }
            })
            .collect();
        paths.sort();
        paths.dedup();
        paths
    }

    fn random_entries(rng: &mut Lcg, n: usize) -> Vec<KvEntry> {
        let mut entries: Vec<KvEntry> =
            (0..n).map(|_| entry(&random_key(rng), ["x", "y"][rng.below(2) as usize], 1 + rng.below(3))).collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        entries.dedup_by(|a, b| a.key == b.key);
        entries
    }

    /// For any paths, entries and budget: no more groups than slots, every path read by the group
    /// that serves it, and exactly the paths whose own entries differ reported as changed.
    #[test]
    fn grouping_reads_and_wakes_exactly_what_changed() {
        let mut rng = Lcg(7);
        for round in 0..2_000 {
            let n = 1 + rng.below(40) as usize;
            let paths = random_paths(&mut rng, n);
            let slots = 1 + rng.below(12) as usize;
            // Half the rounds plan from an earlier set of groups, as after paths come and go.
            let groups = match round % 2 {
                0 => partition(&paths, slots),
                _ => {
                    let n = 1 + rng.below(40) as usize;
                    let before = random_paths(&mut rng, n);
                    let current: Vec<(String, bool)> =
                        partition(&before, slots).into_iter().map(|g| (g.key, g.recurse)).collect();
                    assign(&paths, &current, slots)
                }
            };
            assert!(groups.len() <= slots, "round {round}: {} groups for {slots} slots", groups.len());
            let mut covered: Vec<usize> = groups.iter().flat_map(|g| g.members.clone()).collect();
            covered.sort_unstable();
            assert_eq!(covered, (0..paths.len()).collect::<Vec<_>>(), "round {round}: each path in one group");
            let mut queries: Vec<(&str, bool)> = groups.iter().map(|g| (g.key.as_str(), g.recurse)).collect();
            queries.sort();
            queries.dedup();
            assert_eq!(queries.len(), groups.len(), "round {round}: two groups share a query: {groups:?}");
            for group in &groups {
                let root = WatchPath { key: group.key.as_str().into(), recurse: group.recurse };
                for &i in &group.members {
                    let covered = match root.recurse {
                        true => paths[i].key.starts_with(&*root.key),
                        false => paths[i] == root,
                    };
                    assert!(covered, "round {round}: {root:?} does not read {:?}", paths[i]);
                }
            }

            let n = rng.below(30) as usize;
            let old = random_entries(&mut rng, n);
            let mut new = old.clone();
            for _ in 0..rng.below(4) {
                match rng.below(3) {
                    0 if !new.is_empty() => drop(new.remove(rng.below(new.len() as u64) as usize)),
                    1 if !new.is_empty() => {
                        let i = rng.below(new.len() as u64) as usize;
                        new[i].value = b"changed".to_vec().into();
                        new[i].modify_index += 10;
                    }
                    _ => new.push(entry(&random_key(&mut rng), "new", 50)),
                }
            }
            new.sort_by(|a, b| a.key.cmp(&b.key));
            new.dedup_by(|a, b| a.key == b.key);

            for group in &groups {
                let index = Members::new(group.members.iter().map(|&i| paths[i].clone()).collect());
                let members = index.paths();
                let root = WatchPath { key: group.key.as_str().into(), recurse: group.recurse };
                // What the group's query returns, less what no member needs.
                let (read_old, read_new) = (select(&old, &root).to_vec(), select(&new, &root).to_vec());
                let (kept_old, kept_new) = (index.retain(read_old), index.retain(read_new));
                for member in members {
                    assert_eq!(select(&kept_new, member), select(&new, member), "round {round}: {member:?}");
                }
                let expected: Vec<usize> =
                    (0..members.len()).filter(|&i| select(&old, &members[i]) != select(&new, &members[i])).collect();
                assert_eq!(index.changed(&kept_old, &kept_new), expected, "round {round}");
            }
        }
    }

    #[test]
    fn shares_never_exceed_the_slots_when_they_suffice() {
        for sizes in [vec![1], vec![10_000], vec![5, 5, 5], vec![1, 9_999], vec![3; 24]] {
            for slots in [1, 2, 24, 100] {
                let got = shares(&sizes, slots);
                assert!(got.iter().all(|&s| s >= 1));
                if sizes.len() <= slots {
                    assert!(got.iter().sum::<usize>() <= slots, "{sizes:?} {slots}: {got:?}");
                }
            }
        }
        assert_eq!(shares(&[1, 9_999], 24), [1, 22]);
    }

    #[test]
    fn fair_shares_give_the_small_what_they_ask_and_split_the_rest() {
        assert_eq!(fair(&[1, 200], 20), [1, 19], "one namespace's many scopes leave the other its need");
        assert_eq!(fair(&[5, 200, 300], 20), [5, 8, 7]);
        assert_eq!(fair(&[10_000, 1], 20), [19, 1]);
        assert_eq!(fair(&[2, 2], 20), [2, 2], "never more than asked");
        assert_eq!(fair(&[3, 3, 3], 2), [1, 1, 0], "fewer slots than claimants");
        assert_eq!(fair(&[], 5), Vec::<usize>::new());
        let mut rng = Lcg(11);
        for _ in 0..2_000 {
            let demands: Vec<usize> = (0..rng.below(8)).map(|_| rng.below(50) as usize).collect();
            let slots = rng.below(40) as usize;
            let got = fair(&demands, slots);
            assert_eq!(got.iter().sum::<usize>(), slots.min(demands.iter().sum()), "{demands:?} {slots}");
            for (i, (&g, &d)) in got.iter().zip(&demands).enumerate() {
                assert!(g <= d);
                // Anyone short of its demand holds at least as much as every other, less one.
                if g < d {
                    assert!(got.iter().all(|&o| o <= g + 1), "{demands:?} {slots}: {got:?} at {i}");
                }
            }
        }
    }

    #[test]
    fn scopes_order_by_token_without_showing_it() {
        let query = |token: &str| crate::KvQuery::exact("k").with_token(crate::Token::new(token));
        let (a, b) = (query("a-secret").scope().clone(), query("b-secret").scope().clone());
        assert!(a < b);
        assert!(!format!("{a:?}").contains("a-secret"));
        assert_eq!(a.query("k", false), query("a-secret"));
    }
}
