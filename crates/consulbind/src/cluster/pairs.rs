//! A few labels or annotations, compact, as the caches keep them.

use std::collections::BTreeMap;

/// A few labels or annotations, sorted by key: an empty one allocates nothing, and one of a
/// few entries takes a tenth of a `BTreeMap`'s first node.
#[derive(Clone, Debug, Default, PartialEq, Hash)]
pub struct Pairs(Box<[(Box<str>, Box<str>)]>);

impl Pairs {
    pub fn get(&self, key: &str) -> Option<&str> {
        let at = self.0.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        Some(&self.0[at].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// Those whose key starts with `prefix`.
    pub fn starting_with<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        let from = self.0.partition_point(|(k, _)| **k < *prefix);
        self.0[from..].iter().take_while(move |(k, _)| k.starts_with(prefix)).map(|(k, v)| (&**k, &**v))
    }

    /// As the map that selectors take.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }
}

impl From<BTreeMap<String, String>> for Pairs {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(map.into_iter().map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str())).collect())
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
    }
}
