//! One copy of each Consul entry, however many watched paths and shared reads hold it.
//!
//! Overlapping prefixes, and groups whose reads overlap, each parse the same keys from their own
//! answers. Every answer's entries are swapped for the ones already held when they are the
//! same (key, modify index and value), so memory follows the distinct data watched, not how
//! often a tenant names it.

use std::{collections::HashMap, sync::Arc};

use consul_kv::KvEntry;

use crate::Lock;

#[derive(Default)]
pub struct Entries {
    inner: std::sync::Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    held: HashMap<Arc<str>, (Arc<[u8]>, u64)>,
    /// How many were held after the last sweep: the next comes once that many more are.
    swept: usize,
}

impl Entries {
    /// Makes `entries` share key and value with equal entries already held. Returns how many
    /// distinct entries are held.
    pub fn share(&self, entries: &mut [KvEntry]) -> usize {
        let mut inner = self.inner.locked();
        for entry in entries.iter_mut() {
            match inner.held.get_key_value(&*entry.key) {
                Some((key, (value, index))) if *index == entry.modify_index && **value == *entry.value => {
                    entry.key = key.clone();
                    entry.value = value.clone();
                }
                _ => drop(inner.held.insert(entry.key.clone(), (entry.value.clone(), entry.modify_index))),
            }
        }
        if inner.held.len() > 2 * inner.swept.max(1024) {
            inner.sweep();
        }
        inner.held.len()
    }

    /// Forgets the entries no path holds any more; returns how many are held.
    pub fn sweep(&self) -> usize {
        let mut inner = self.inner.locked();
        inner.sweep();
        inner.held.len()
    }
}

impl Inner {
    /// Forgets the entries no path holds any more.
    fn sweep(&mut self) {
        self.held.retain(|key, (value, _)| Arc::strong_count(key) > 1 || Arc::strong_count(value) > 1);
        self.swept = self.held.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_entries_from_two_answers_share_one_copy_and_changed_ones_do_not() {
        let entries = Entries::default();
        let mut first = vec![KvEntry::new("p/a", "1", 5), KvEntry::new("p/b", "2", 6)];
        entries.share(&mut first);
        let mut second = vec![KvEntry::new("p/a", "1", 5), KvEntry::new("p/b", "3", 7)];
        entries.share(&mut second);
        assert!(Arc::ptr_eq(&first[0].key, &second[0].key) && Arc::ptr_eq(&first[0].value, &second[0].value));
        assert!(!Arc::ptr_eq(&first[1].value, &second[1].value));
        assert_eq!(&*second[1].value, b"3", "a newer value is kept, not the one held");
        // The newer entry is the one held now.
        let mut third = vec![KvEntry::new("p/b", "3", 7)];
        entries.share(&mut third);
        assert!(Arc::ptr_eq(&third[0].value, &second[1].value));
    }

    #[test]
    fn entries_no_answer_holds_are_forgotten() {
        let entries = Entries::default();
        let mut kept = vec![KvEntry::new("kept", "v", 1)];
        entries.share(&mut kept);
        for round in 0..4 {
            let mut answer: Vec<KvEntry> = (0..1024).map(|i| KvEntry::new(format!("k{round}/{i}"), "v", 1)).collect();
            entries.share(&mut answer);
        }
        let mut again = vec![KvEntry::new("kept", "v", 1)];
        let held = entries.share(&mut again);
        assert!(held <= 2 * 1024 + 1, "{held} held");
        assert!(Arc::ptr_eq(&again[0].key, &kept[0].key), "an entry still held was forgotten");
    }
}
