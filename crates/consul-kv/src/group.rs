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

use std::collections::HashMap;
use std::ops::Range;

use crate::{KvEntry, KvQuery, Token};

/// The part of a query that decides whether two paths may share a blocking query: ACLs filter
/// per token, and the other fields pick another data set.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    pub datacenter: Option<String>,
    pub namespace: Option<String>,
    pub partition: Option<String>,
    pub token: Option<ScopeToken>,
}

/// A token that orders scopes without ever printing them.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ScopeToken(pub Token);

impl std::fmt::Debug for ScopeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialOrd for ScopeToken {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ScopeToken {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.expose().cmp(other.0.expose())
    }
}

impl Scope {
    pub fn of(query: &KvQuery) -> Self {
        Self {
            datacenter: query.datacenter.clone(),
            namespace: query.namespace.clone(),
            partition: query.partition.clone(),
            token: query.token.clone().map(ScopeToken),
        }
    }

    /// The query that reads `key` in this scope.
    pub fn query(&self, key: String, recurse: bool) -> KvQuery {
        KvQuery {
            key,
            recurse,
            datacenter: self.datacenter.clone(),
            namespace: self.namespace.clone(),
            partition: self.partition.clone(),
            token: self.token.clone().map(|t| t.0),
        }
    }
}

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

/// One watched key, or prefix when `recurse` is set.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchPath {
    pub key: String,
    pub recurse: bool,
}

impl WatchPath {
    /// Whether `key` is this path's, or below it for a prefix.
    pub fn covers(&self, key: &str) -> bool {
        match self.recurse {
            true => key.starts_with(&self.key),
            false => key == self.key,
        }
    }
}

/// One query that reads a run of watched paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The key to read: the paths' longest common prefix, or the one path itself.
    pub key: String,
    pub recurse: bool,
    /// The paths this query serves, as sorted positions in the input.
    pub members: Vec<usize>,
}

/// For each of sorted `paths`, the one that covers it and that no other covers: itself, or a
/// prefix among them that reads its entries too.
fn tops(paths: &[WatchPath]) -> Vec<usize> {
    let mut tops: Vec<usize> = Vec::with_capacity(paths.len());
    let mut cover: Option<usize> = None;
    for (i, path) in paths.iter().enumerate() {
        // What a prefix covers sorts right after it, the very same key read alone just before.
        match cover.filter(|&c| path.key.starts_with(&paths[c].key)) {
            Some(c) => tops.push(c),
            None => {
                tops.push(i);
                if path.recurse {
                    cover = Some(i);
                    if i > 0 && !paths[i - 1].recurse && paths[i - 1].key == path.key && tops[i - 1] == i - 1 {
                        tops[i - 1] = i;
                    }
                }
            }
        }
    }
    tops
}

/// Plans the paths no other covers with `plan`, then puts each covered path in the group of
/// the prefix that covers it: one answer reaches overlapping paths at once, so a binding that
/// names `cfg/` and `cfg/a` sees one write once, not once per query.
fn nested(paths: &[WatchPath], plan: impl FnOnce(&[WatchPath]) -> Vec<Group>) -> Vec<Group> {
    let tops = tops(paths);
    let outer: Vec<usize> = (0..paths.len()).filter(|&i| tops[i] == i).collect();
    if outer.len() == paths.len() {
        return plan(paths);
    }
    let outer_paths: Vec<WatchPath> = outer.iter().map(|&i| paths[i].clone()).collect();
    let mut groups = plan(&outer_paths);
    let mut group_of = vec![0; paths.len()];
    for (g, group) in groups.iter_mut().enumerate() {
        for member in std::mem::take(&mut group.members) {
            group_of[outer[member]] = g;
        }
    }
    for (i, top) in tops.iter().enumerate() {
        groups[group_of[*top]].members.push(i);
    }
    groups
}

/// Cuts sorted, unique `paths` into at most `slots` groups (at least one slot is assumed),
/// each with a key of its own. With enough slots every path no other covers is its own query,
/// which transfers the least; a path a prefix among them covers is read by that prefix's query.
pub fn partition(paths: &[WatchPath], slots: usize) -> Vec<Group> {
    nested(paths, |paths| partition_disjoint(paths, slots))
}

fn partition_disjoint(paths: &[WatchPath], slots: usize) -> Vec<Group> {
    debug_assert!(paths.is_sorted(), "paths must be sorted");
    let slots = slots.max(1);
    if paths.len() <= slots {
        return paths
            .iter()
            .enumerate()
            .map(|(i, p)| Group { key: p.key.clone(), recurse: p.recurse, members: vec![i] })
            .collect();
    }
    // Start from one group over everything and split the largest group that still fits into
    // its branches, like walking down a trie: the groups stay disjoint and their keys distinct.
    let mut runs: Vec<Range<usize>> = Vec::new();
    runs.push(0..paths.len());
    loop {
        let mut largest: Vec<usize> = (0..runs.len()).filter(|&i| runs[i].len() > 1).collect();
        largest.sort_by_key(|&i| std::cmp::Reverse(runs[i].len()));
        let split = largest.into_iter().find_map(|i| {
            let branches = branches(paths, runs[i].clone());
            (branches.len() > 1 && runs.len() - 1 + branches.len() <= slots).then_some((i, branches))
        });
        match split {
            Some((i, branches)) => drop(runs.splice(i..=i, branches)),
            None => break,
        }
    }
    runs.into_iter()
        .map(|run| match &paths[run.clone()] {
            [only] => Group { key: only.key.clone(), recurse: only.recurse, members: run.collect() },
            // The common prefix of a sorted run is that of its first and last keys.
            [first, .., last] => {
                Group { key: common_prefix(&first.key, &last.key).to_owned(), recurse: true, members: run.collect() }
            }
            [] => unreachable!("runs are never empty"),
        })
        .collect()
}

/// Plans again after paths came or went, keeping the `current` groups (key and recurse) that
/// still serve: each path joins the current group that covers it (the deepest prefix, or an
/// exact read of that very key), a path no group covers gets a group of its own while slots
/// last, groups left without paths go, and a group its paths no longer fill narrows to what
/// they share. It cuts afresh with [`partition`] only when that cannot fit, or when every path
/// can have a query of its own. Stable groups matter: a blocking query given up early keeps its
/// connection busy on the Consul agent until its wait runs out.
pub fn assign(paths: &[WatchPath], current: &[(String, bool)], slots: usize) -> Vec<Group> {
    nested(paths, |paths| assign_disjoint(paths, current, slots))
}

fn assign_disjoint(paths: &[WatchPath], current: &[(String, bool)], slots: usize) -> Vec<Group> {
    let slots = slots.max(1);
    // Room for a query per path, as when slots were freed or found: that transfers the least,
    // and a path's own query is never given up while it stays.
    if paths.len() <= slots {
        return partition_disjoint(paths, slots);
    }
    let mut groups: Vec<Group> = current
        .iter()
        .map(|(key, recurse)| Group { key: key.clone(), recurse: *recurse, members: Vec::new() })
        .collect();
    let exact: HashMap<&str, usize> =
        groups.iter().enumerate().filter(|(_, g)| !g.recurse).map(|(i, g)| (g.key.as_str(), i)).collect();
    let prefixes: HashMap<&str, usize> =
        groups.iter().enumerate().filter(|(_, g)| g.recurse).map(|(i, g)| (g.key.as_str(), i)).collect();
    let lengths = lengths(prefixes.keys().map(|k| k.len()));
    let mut homes = Vec::with_capacity(paths.len());
    let mut homeless = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let own = if path.recurse { prefixes.get(path.key.as_str()) } else { exact.get(path.key.as_str()) };
        let deepest = || lengths.iter().rev().find_map(|&end| prefixes.get(path.key.get(..end)?));
        match own.or_else(deepest) {
            Some(&g) => homes.push((g, i)),
            None => homeless.push(i),
        }
    }
    for (g, i) in homes {
        groups[g].members.push(i);
    }
    groups.retain(|g| !g.members.is_empty());
    // A group whose paths have left it narrower than its key reads only what they share now,
    // so that a wide read does not outlive the paths that needed it.
    for group in groups.iter_mut().filter(|g| g.recurse) {
        match group.members[..] {
            [only] => (group.key, group.recurse) = (paths[only].key.clone(), paths[only].recurse),
            [first, .., last] => {
                let shared = common_prefix(&paths[first].key, &paths[last].key);
                if shared.len() > group.key.len() {
                    group.key = shared.to_owned();
                }
            }
            [] => unreachable!("empty groups are gone"),
        }
    }
    if groups.len() + homeless.len() > slots {
        return partition_disjoint(paths, slots);
    }
    groups.extend(homeless.into_iter().map(|i| Group {
        key: paths[i].key.clone(),
        recurse: paths[i].recurse,
        members: vec![i],
    }));
    groups
}

/// Splits a sorted run by the character that follows the run's common prefix; the paths that
/// end at the prefix come first, as one branch.
fn branches(paths: &[WatchPath], run: Range<usize>) -> Vec<Range<usize>> {
    let run_paths = &paths[run.clone()];
    let (first, last) = (&run_paths[0].key, &run_paths[run_paths.len() - 1].key);
    let depth = common_prefix(first, last).len();
    let next = |p: &WatchPath| p.key[depth..].chars().next();
    let mut branches = Vec::new();
    let mut start = run.start;
    for i in run.start + 1..run.end {
        if next(&paths[i]) != next(&paths[i - 1]) {
            branches.push(start..i);
            start = i;
        }
    }
    branches.push(start..run.end);
    branches
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
    &entries[span(entries, path)]
}

/// Where in sorted `entries` the ones `path` covers are.
pub fn span(entries: &[KvEntry], path: &WatchPath) -> Range<usize> {
    let start = entries.partition_point(|e| &*e.key < path.key.as_str());
    let end = match path.recurse {
        true => start + entries[start..].partition_point(|e| path.covers(&e.key)),
        false => start + usize::from(entries.get(start).is_some_and(|e| path.covers(&e.key))),
    };
    start..end
}

/// Replaces what sorted `entries` hold for `path` with `fresh`, a read of that path alone, so
/// that a path new to a group needs no read of the whole group. Only what the path covers is
/// taken, so `entries` stay sorted whatever the answer holds.
pub fn merge(entries: &mut Vec<KvEntry>, path: &WatchPath, fresh: Vec<KvEntry>) {
    let span = span(entries, path);
    entries.splice(span, fresh.into_iter().filter(|e| path.covers(&e.key)));
}

/// Distinct lengths, ascending: a key is looked up once per prefix length, not once per
/// character, however long it is.
fn lengths(lengths: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut lengths: Vec<usize> = lengths.collect();
    lengths.sort_unstable();
    lengths.dedup();
    lengths
}

/// The paths one group serves, indexed to find which of them an entry belongs to.
#[derive(Debug, Default)]
pub struct Members {
    exact: HashMap<String, usize>,
    prefixes: HashMap<String, usize>,
    /// The lengths of the prefixes, ascending: the only places a key can meet one.
    lengths: Vec<usize>,
}

impl Members {
    /// Indexes `paths`; the numbers returned later are positions in it.
    pub fn new(paths: &[WatchPath]) -> Self {
        let mut members = Self::default();
        for (i, path) in paths.iter().enumerate() {
            let map = if path.recurse { &mut members.prefixes } else { &mut members.exact };
            map.insert(path.key.clone(), i);
        }
        members.lengths = lengths(members.prefixes.keys().map(String::len));
        members
    }

    /// Calls `f` with every path that covers `key`: at most one exact key and one prefix per
    /// prefix length.
    fn covering(&self, key: &str, mut f: impl FnMut(usize)) {
        if let Some(&i) = self.exact.get(key) {
            f(i);
        }
        for &end in self.lengths.iter().take_while(|&&end| end <= key.len()) {
            if let Some(&i) = key.get(..end).and_then(|start| self.prefixes.get(start)) {
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
                WatchPath { key, recurse }
            })
            .collect();
        paths.sort();
        paths.dedup();
        paths
    }

    /// A write under overlapping paths is one answer for all of them: a binding with no quiet
    /// period rolled once per answer when `cfg/` and `cfg/a` were read by two queries.
    #[test]
    fn paths_a_prefix_among_them_covers_are_read_by_its_query() {
        let paths = vec![
            path("app", false),
            path("cfg/", false),
            path("cfg/", true),
            path("cfg/a", true),
            path("cfg/ab", false),
            path("z", false),
        ];
        for slots in [1, 2, 3, 6, 10] {
            let groups = partition(&paths, slots);
            let home = |i: usize| groups.iter().position(|g| g.members.contains(&i)).unwrap();
            assert!([1, 3, 4].iter().all(|&i| home(i) == home(2)), "{slots} slots: {groups:?}");
            let group = &groups[home(2)];
            assert!(group.recurse && "cfg/".starts_with(&group.key), "{group:?}");
            assert!(groups.iter().all(|g| g.members.is_sorted()));
            let assigned = assign(&paths, &[("cfg/a".into(), true), ("cfg/".into(), true)], slots);
            let home = |i: usize| assigned.iter().position(|g| g.members.contains(&i)).unwrap();
            assert!([1, 3, 4].iter().all(|&i| home(i) == home(2)), "{slots} slots: {assigned:?}");
        }
        let groups = partition(&paths, 10);
        assert_eq!(groups.len(), 3, "app, cfg/ with what it covers, z: {groups:?}");
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
                Group { key: "a".into(), recurse: false, members: vec![0] },
                Group { key: "b/".into(), recurse: true, members: vec![1] }
            ]
        );
    }

    #[test]
    fn splits_along_the_key_hierarchy() {
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
        assert_eq!(groups.len(), 19, "ten branches, then the largest split into ten more");
        let largest = groups.iter().map(|g| g.members.len()).max().unwrap();
        assert_eq!(largest, 1_000);
        let keys: Vec<&str> = groups.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(&keys[..3], ["bench/k000", "bench/k001", "bench/k002"]);
        assert_eq!(keys[18], "bench/k09");
    }

    #[test]
    fn assign_keeps_the_groups_that_still_serve() {
        let paths: Vec<WatchPath> = (0..100).map(|i| path(&format!("app/k{i:02}"), false)).collect();
        let groups = partition(&paths, 12);
        let current: Vec<(String, bool)> = groups.iter().map(|g| (g.key.clone(), g.recurse)).collect();
        // New keys under existing prefixes join them; a key elsewhere gets its own query.
        let mut more = paths.clone();
        more.extend([path("app/k055", false), path("db/x", false)]);
        more.sort();
        let again = assign(&more, &current, 12);
        for (key, recurse) in &current {
            assert!(again.iter().any(|g| g.key == *key && g.recurse == *recurse), "{key} was replaced");
        }
        let db = again.iter().find(|g| g.key == "db/x").expect("a query of its own");
        assert!(!db.recurse);
        // No slot left for a new query: cut afresh.
        let full = assign(&more, &current, current.len());
        assert!(full.len() <= current.len());
        // Groups without paths go, and with a slot for each path every path has its own query.
        let fewer = assign(&paths[..5], &current, 12);
        assert_eq!(fewer.len(), 5);
        assert!(fewer.iter().all(|g| !g.recurse && g.members.len() == 1));
        let kept = assign(&paths[..20], &current, 12);
        assert!(kept.iter().all(|g| current.contains(&(g.key.clone(), g.recurse))), "too few slots: kept");
    }

    #[test]
    fn prefixes_cut_on_character_boundaries() {
        assert_eq!(common_prefix("aé", "aè"), "a");
        assert_eq!(common_prefix("abc", "abd"), "ab");
        assert_eq!(common_prefix("", "x"), "");
    }

    #[test]
    fn merge_replaces_one_path_and_keeps_the_order() {
        let mut entries = vec![entry("a", "1", 1), entry("b/x", "2", 1), entry("b/y", "3", 1), entry("c", "4", 1)];
        merge(&mut entries, &path("b/", true), vec![entry("b/y", "new", 9), entry("b/z", "5", 9)]);
        let keys: Vec<&str> = entries.iter().map(|e| &*e.key).collect();
        assert_eq!(keys, ["a", "b/y", "b/z", "c"]);
        merge(&mut entries, &path("bb", false), vec![entry("bb", "6", 9)]);
        assert_eq!(select(&entries, &path("bb", false)), &[entry("bb", "6", 9)]);
        assert!(entries.is_sorted_by(|a, b| a.key < b.key));
        merge(&mut entries, &path("a", false), vec![]);
        assert_eq!(&*entries[0].key, "b/y");
        // An answer beyond the path (a key Consul read as another) brings nothing else in.
        merge(&mut entries, &path("c", false), vec![entry("a", "x", 9), entry("c", "7", 9), entry("z", "x", 9)]);
        let keys: Vec<&str> = entries.iter().map(|e| &*e.key).collect();
        assert_eq!(keys, ["b/y", "b/z", "bb", "c"]);
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
                let root = WatchPath { key: group.key.clone(), recurse: group.recurse };
                for &i in &group.members {
                    let covered = match root.recurse {
                        true => paths[i].key.starts_with(&root.key),
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
                let members: Vec<WatchPath> = group.members.iter().map(|&i| paths[i].clone()).collect();
                let members = &members[..];
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

    #[test]
    fn a_key_meets_the_prefixes_of_each_length_and_none_mid_character() {
        let members = [path("a/", true), path("a/€", true), path("a/€x", false), path("b/cd", true)];
        let index = Members::new(&members);
        let covering = |key: &str| {
            let mut found = Vec::new();
            index.covering(key, |i| found.push(i));
            found
        };
        assert_eq!(covering("a/€x"), [2, 0, 1]);
        assert_eq!(covering("a/€y"), [0, 1]);
        // Byte 4 is inside the three-byte character: no prefix of that length can match there.
        assert_eq!(covering("a/€"), [0, 1]);
        assert_eq!(covering("a"), Vec::<usize>::new());
        assert_eq!(covering(&format!("b/cd{}", "z".repeat(100_000))), [3]);
        assert!(!index.covers("b/c"));
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
    fn a_group_narrows_when_the_paths_that_widened_it_leave() {
        let wide = [path("a/x", false), path("b/y", false)];
        let current: Vec<(String, bool)> = partition(&wide, 1).into_iter().map(|g| (g.key, g.recurse)).collect();
        assert_eq!(current, [(String::new(), true)], "the two share nothing: the whole store");
        let narrow = [path("a/x", false), path("a/z", false)];
        let groups = assign(&narrow, &current, 1);
        assert_eq!(groups.len(), 1);
        assert_eq!((groups[0].key.as_str(), groups[0].recurse), ("a/", true));
        let one = assign(&narrow[..1], &current, 1);
        assert_eq!((one[0].key.as_str(), one[0].recurse), ("a/x", false), "one key left: read it alone");
    }

    #[test]
    fn scopes_order_by_token_without_showing_it() {
        let query = |token: &str| KvQuery { token: Some(Token::new(token)), ..KvQuery::exact("k") };
        let (a, b) = (Scope::of(&query("a-secret")), Scope::of(&query("b-secret")));
        assert!(a < b);
        assert!(!format!("{a:?}").contains("a-secret"));
        assert_eq!(a.query("k".into(), false), query("a-secret"));
    }
}
