//! A few labels or annotations, compact, as the caches keep them.

use std::collections::BTreeMap;

/// A few labels or annotations, sorted by key, in two allocations however many: their text end
/// to end, and where each key and value ends. An empty one allocates nothing. A workload's
/// labels and annotations are mostly short strings, each of which cost an allocation of 32 bytes
/// or more, as much again as the text in it.
#[derive(Clone, Debug, Default, PartialEq, Hash)]
pub struct Pairs {
    text: Box<str>,
    /// The end of each key, then of its value.
    ends: Box<[u32]>,
}

impl Pairs {
    fn len(&self) -> usize {
        self.ends.len() / 2
    }

    fn at(&self, i: usize) -> (&str, &str) {
        let start = if i == 0 { 0 } else { self.ends[2 * i - 1] as usize };
        let (key_end, end) = (self.ends[2 * i] as usize, self.ends[2 * i + 1] as usize);
        (&self.text[start..key_end], &self.text[key_end..end])
    }

    /// The index of the first pair whose key is not below `key`.
    fn partition_point(&self, below: impl Fn(&str) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let mid = (low + high) / 2;
            if below(self.at(mid).0) { low = mid + 1 } else { high = mid }
        }
        low
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        let at = self.partition_point(|k| k < key);
        (at < self.len()).then(|| self.at(at)).filter(|(k, _)| *k == key).map(|(_, v)| v)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        (0..self.len()).map(|i| self.at(i))
    }

    /// Those whose key starts with `prefix`.
    pub fn starting_with<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        let from = self.partition_point(|k| k < prefix);
        (from..self.len()).map(|i| self.at(i)).take_while(move |(k, _)| k.starts_with(prefix))
    }

    /// As the map that selectors take.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }
}

impl From<BTreeMap<String, String>> for Pairs {
    /// Text beyond 4 GiB, which no object the API server serves holds, is cut at the last pair
    /// that fits.
    fn from(map: BTreeMap<String, String>) -> Self {
        let mut text = String::with_capacity(map.iter().map(|(k, v)| k.len() + v.len()).sum());
        let mut ends = Vec::with_capacity(2 * map.len());
        for (key, value) in &map {
            let (Ok(key_end), Ok(end)) =
                (u32::try_from(text.len() + key.len()), u32::try_from(text.len() + key.len() + value.len()))
            else {
                break;
            };
            text.push_str(key);
            text.push_str(value);
            ends.extend([key_end, end]);
        }
        Self { text: text.into_boxed_str(), ends: ends.into_boxed_slice() }
    }
}

impl FromIterator<(String, String)> for Pairs {
    /// Sorted by key; the last of a key stands, as in a map.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        Self::from(pairs.into_iter().collect::<BTreeMap<_, _>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_keep_a_map_and_find_by_key() {
        let map: BTreeMap<String, String> =
            [("b", "2"), ("a", "1"), ("c", "")].map(|(k, v)| (k.to_owned(), v.to_owned())).into();
        let pairs = Pairs::from(map.clone());
        assert_eq!(pairs.to_map(), map);
        assert_eq!((pairs.get("a"), pairs.get("c"), pairs.get("d")), (Some("1"), Some(""), None));
        assert!(pairs.contains_key("b") && !pairs.contains_key("bb"));
        assert_eq!(Pairs::default().to_map(), BTreeMap::new());
        let refs: Pairs = [("ref.b", ""), ("ref.a", ""), ("re", ""), ("ref", ""), ("rf", "")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into_iter()
            .collect();
        let keys: Vec<&str> = refs.starting_with("ref.").map(|(k, _)| k).collect();
        assert_eq!(keys, ["ref.a", "ref.b"]);
        assert_eq!(refs.starting_with("z").count(), 0, "past the last key");
        assert_eq!(Pairs::default().get("a"), None);
        assert_eq!(Pairs::default().starting_with("").count(), 0);
    }
}
