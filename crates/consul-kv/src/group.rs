//! Many watched keys on few blocking queries.
//!
//! Every blocking query in flight holds a connection, so a watcher with more keys than
//! connections reads them in groups: the sorted keys and prefixes of one scope (datacenter,
//! namespace, partition and token) are cut into at most `slots` runs, and each run is read by
//! one recursive query on the longest prefix its keys share. Cuts go where neighbouring keys
//! share the least, so that a group's prefix covers little beyond its own keys. When a group's
//! query answers, [`Members::changed`] finds the watched paths whose entries moved, comparing
//! the new entries with the last ones key by key, so the work after a write grows with what
//! changed, not with the number of watched keys.

use std::collections::HashMap;
use std::ops::Range;

use crate::KvEntry;

/// One watched key, or prefix when `recurse` is set.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchPath {
    pub key: String,
    pub recurse: bool,
}

/// One query that reads a run of watched paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The key to read: the paths' longest common prefix, or the one path itself.
    pub key: String,
    pub recurse: bool,
    /// The paths this query serves, as a range of the sorted input.
    pub members: Range<usize>,
}

/// Cuts sorted, unique `paths` into at most `slots` groups (at least one slot is assumed).
/// With enough slots every path is its own query, which transfers the least.
pub fn partition(paths: &[WatchPath], slots: usize) -> Vec<Group> {
    debug_assert!(paths.is_sorted(), "paths must be sorted");
    let slots = slots.max(1);
    if paths.len() <= slots {
        return paths
            .iter()
            .enumerate()
            .map(|(i, p)| Group { key: p.key.clone(), recurse: p.recurse, members: i..i + 1 })
            .collect();
    }
    // Cut before index `c` where paths[c - 1] and paths[c] share the least; among equals, the
    // cut nearest an even split keeps the groups alike in size.
    let per_group = paths.len() as f64 / slots as f64;
    let unevenness = |c: usize| {
        let ratio = c as f64 / per_group;
        ((ratio - ratio.round()).abs() * 1e6) as u64
    };
    let mut cuts: Vec<usize> = (1..paths.len()).collect();
    cuts.sort_by_key(|&c| (common_prefix(&paths[c - 1].key, &paths[c].key).len(), unevenness(c), c));
    cuts.truncate(slots - 1);
    cuts.sort_unstable();

    let mut groups = Vec::with_capacity(slots);
    let mut start = 0;
    for end in cuts.into_iter().chain([paths.len()]) {
        let run = &paths[start..end];
        let group = match run {
            [only] => Group { key: only.key.clone(), recurse: only.recurse, members: start..end },
            // The common prefix of a sorted run is that of its first and last keys.
            [first, .., last] => {
                Group { key: common_prefix(&first.key, &last.key).to_owned(), recurse: true, members: start..end }
            }
            [] => unreachable!("cuts are distinct and inside the range"),
        };
        groups.push(group);
        start = end;
    }
    groups
}

/// The longest common prefix, on a character boundary.
fn common_prefix<'a>(a: &'a str, b: &str) -> &'a str {
    let mut len = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(len) {
        len -= 1;
    }
    &a[..len]
}

/// The entries of sorted `entries` that `path` covers.
pub fn select<'a>(entries: &'a [KvEntry], path: &WatchPath) -> &'a [KvEntry] {
    let start = entries.partition_point(|e| e.key.as_str() < path.key.as_str());
    let end = match path.recurse {
        true => start + entries[start..].partition_point(|e| e.key.starts_with(&path.key)),
        false => start + usize::from(entries.get(start).is_some_and(|e| e.key == path.key)),
    };
    &entries[start..end]
}

/// The paths one group serves, indexed to find which of them an entry belongs to.
#[derive(Debug, Default)]
pub struct Members {
    exact: HashMap<String, usize>,
    prefixes: HashMap<String, usize>,
}

impl Members {
    /// Indexes `paths`; the numbers returned later are positions in it.
    pub fn new(paths: &[WatchPath]) -> Self {
        let mut members = Self::default();
        for (i, path) in paths.iter().enumerate() {
            let map = if path.recurse { &mut members.prefixes } else { &mut members.exact };
            map.insert(path.key.clone(), i);
        }
        members
    }

    /// Calls `f` with every path that covers `key`: at most one exact key and one prefix per
    /// character of `key`.
    fn covering(&self, key: &str, mut f: impl FnMut(usize)) {
        if let Some(&i) = self.exact.get(key) {
            f(i);
        }
        if self.prefixes.is_empty() {
            return;
        }
        for (end, _) in key.char_indices().chain([(key.len(), ' ')]) {
            if let Some(&i) = self.prefixes.get(&key[..end]) {
                f(i);
            }
        }
    }

    /// Whether any path covers `key`.
    pub fn covers(&self, key: &str) -> bool {
        let mut any = false;
        self.covering(key, |_| any = true);
        any
    }

    /// Keeps the entries some path covers, so a wide group prefix costs no memory.
    pub fn retain(&self, entries: Vec<KvEntry>) -> Vec<KvEntry> {
        let mut entries = entries;
        entries.retain(|e| self.covers(&e.key));
        entries
    }

    /// The positions of the paths whose entries differ between sorted `old` and `new`: a key
    /// that came, went, or changed its value or modify index. Sorted and unique.
    pub fn changed(&self, old: &[KvEntry], new: &[KvEntry]) -> Vec<usize> {
        let mut changed = Vec::new();
        let (mut a, mut b) = (old.iter().peekable(), new.iter().peekable());
        loop {
            let key = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(x), Some(y)) if x.key == y.key => {
                    let (x, y) = (a.next().unwrap(), b.next().unwrap());
                    if x.value == y.value && x.modify_index == y.modify_index {
                        continue;
                    }
                    &y.key
                }
                (Some(x), Some(y)) if x.key < y.key => &a.next().unwrap().key,
                (Some(_), None) => &a.next().unwrap().key,
                _ => &b.next().unwrap().key,
            };
            self.covering(key, |i| changed.push(i));
        }
        changed.sort_unstable();
        changed.dedup();
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(key: &str, recurse: bool) -> WatchPath {
        WatchPath { key: key.into(), recurse }
    }

    fn entry(key: &str, value: &str, modify_index: u64) -> KvEntry {
        KvEntry { key: key.into(), value: value.into(), modify_index }
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
                WatchPath { key, recurse }
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

    #[test]
    fn one_query_per_path_when_slots_allow() {
        let paths = [path("a", false), path("b/", true)];
        let groups = partition(&paths, 5);
        assert_eq!(
            groups,
            [
                Group { key: "a".into(), recurse: false, members: 0..1 },
                Group { key: "b/".into(), recurse: true, members: 1..2 }
            ]
        );
    }

    #[test]
    fn cuts_where_neighbours_share_least() {
        let paths: Vec<WatchPath> =
            ["app/a/1", "app/a/2", "app/b/1", "app/b/2", "db/x"].iter().map(|k| path(k, false)).collect();
        let groups = partition(&paths, 3);
        let keys: Vec<&str> = groups.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(keys, ["app/a/", "app/b/", "db/x"]);
        assert!(groups[..2].iter().all(|g| g.recurse));
        assert!(!groups[2].recurse, "a lone exact key stays an exact read");
    }

    #[test]
    fn many_similar_keys_split_evenly() {
        let paths: Vec<WatchPath> = (0..10_000).map(|i| path(&format!("bench/k{i:05}"), false)).collect();
        let groups = partition(&paths, 24);
        assert_eq!(groups.len(), 24);
        let largest = groups.iter().map(|g| g.members.len()).max().unwrap();
        assert!(largest <= 1_000, "largest group has {largest} keys");
    }

    #[test]
    fn prefixes_cut_on_character_boundaries() {
        assert_eq!(common_prefix("aé", "aè"), "a");
        assert_eq!(common_prefix("abc", "abd"), "ab");
        assert_eq!(common_prefix("", "x"), "");
    }

    #[test]
    fn select_finds_a_key_or_a_prefix() {
        let entries = [entry("a", "1", 1), entry("a/b", "2", 1), entry("a/c", "3", 1), entry("ab", "4", 1)];
        assert_eq!(select(&entries, &path("a", false)), &entries[..1]);
        assert_eq!(select(&entries, &path("a/", true)), &entries[1..3]);
        assert_eq!(select(&entries, &path("a", true)), &entries[..]);
        assert_eq!(select(&entries, &path("b", false)), &[]);
        assert_eq!(select(&entries, &path("", true)), &entries[..]);
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
            let groups = partition(&paths, slots);
            assert!(groups.len() <= slots, "round {round}: {} groups for {slots} slots", groups.len());
            let covered: usize = groups.iter().map(|g| g.members.len()).sum();
            assert_eq!(covered, paths.len());

            let n = rng.below(30) as usize;
            let old = random_entries(&mut rng, n);
            let mut new = old.clone();
            for _ in 0..rng.below(4) {
                match rng.below(3) {
                    0 if !new.is_empty() => drop(new.remove(rng.below(new.len() as u64) as usize)),
                    1 if !new.is_empty() => {
                        let i = rng.below(new.len() as u64) as usize;
                        new[i].value = b"changed".to_vec();
                        new[i].modify_index += 10;
                    }
                    _ => new.push(entry(&random_key(&mut rng), "new", 50)),
                }
            }
            new.sort_by(|a, b| a.key.cmp(&b.key));
            new.dedup_by(|a, b| a.key == b.key);

            for group in &groups {
                let members = &paths[group.members.clone()];
                let root = WatchPath { key: group.key.clone(), recurse: group.recurse };
                let index = Members::new(members);
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
}
