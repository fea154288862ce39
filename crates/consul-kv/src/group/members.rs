//! A watched path, what a group's answer holds for each of its paths, and which of them it
//! changed.

use std::ops::Range;
use std::sync::Arc;

use crate::KvEntry;

/// One watched key, or prefix when `recurse` is set. The key is shared: a plan and the index of
/// its groups hold every watched path, and copies of their keys would add up.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchPath {
    pub key: Arc<str>,
    pub recurse: bool,
}

impl WatchPath {
    /// Whether `key` is this path's, or below it for a prefix.
    pub fn covers(&self, key: &str) -> bool {
        match self.recurse {
            true => key.starts_with(&*self.key),
            false => key == &*self.key,
        }
    }
}

/// The entries of sorted `entries` that `path` covers.
pub fn select<'a>(entries: &'a [KvEntry], path: &WatchPath) -> &'a [KvEntry] {
    &entries[span(entries, path)]
}

/// Where in sorted `entries` the ones `path` covers are.
pub fn span(entries: &[KvEntry], path: &WatchPath) -> Range<usize> {
    let start = entries.partition_point(|e| *e.key < *path.key);
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
pub(super) fn lengths(lengths: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut lengths: Vec<usize> = lengths.collect();
    lengths.sort_unstable();
    lengths.dedup();
    lengths
}

/// The paths one group serves, sorted, so that the path an entry belongs to is found by binary
/// search: the index takes no room beside the paths themselves, which a group holds anyway.
#[derive(Debug, Default)]
pub struct Members {
    paths: Vec<WatchPath>,
    /// The lengths of the prefixes, ascending: the only places a key can meet one.
    lengths: Vec<usize>,
}

impl Members {
    /// Indexes `paths`, sorted and without duplicates; the numbers returned later are positions
    /// in it.
    pub fn new(paths: Vec<WatchPath>) -> Self {
        assert!(paths.is_sorted_by(|a, b| a < b), "members must be sorted and distinct");
        let lengths = lengths(paths.iter().filter(|p| p.recurse).map(|p| p.key.len()));
        Self { paths, lengths }
    }

    pub fn paths(&self) -> &[WatchPath] {
        &self.paths
    }

    fn position(&self, key: &str, recurse: bool) -> Option<usize> {
        self.paths.binary_search_by(|p| (&*p.key, p.recurse).cmp(&(key, recurse))).ok()
    }

    /// Calls `f` with every path that covers `key`: at most one exact key and one prefix per
    /// prefix length.
    fn covering(&self, key: &str, mut f: impl FnMut(usize)) {
        if let Some(i) = self.position(key, false) {
            f(i);
        }
        for &end in self.lengths.iter().take_while(|&&end| end <= key.len()) {
            if let Some(i) = key.get(..end).and_then(|start| self.position(start, true)) {
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

    #[test]
    fn a_key_meets_the_prefixes_of_each_length_and_none_mid_character() {
        let members = vec![path("a/", true), path("a/€", true), path("a/€x", false), path("b/cd", true)];
        let index = Members::new(members);
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
}
