//! How watched paths are cut into groups, one query each: afresh ([`partition`]), or keeping
//! the groups that still serve ([`assign`]).

use std::collections::HashMap;
use std::ops::Range;

use super::members::{WatchPath, lengths};

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
        match cover.filter(|&c| path.key.starts_with(&*paths[c].key)) {
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
            .map(|(i, p)| Group { key: p.key.to_string(), recurse: p.recurse, members: vec![i] })
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
            [only] => Group { key: only.key.to_string(), recurse: only.recurse, members: run.collect() },
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
        let own = if path.recurse { prefixes.get(&*path.key) } else { exact.get(&*path.key) };
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
            [only] => (group.key, group.recurse) = (paths[only].key.to_string(), paths[only].recurse),
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
        key: paths[i].key.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn path(key: &str, recurse: bool) -> WatchPath {
        WatchPath { key: key.into(), recurse }
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
}
