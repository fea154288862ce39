//! The restore grace, in one machine. After Consul's index went backwards (a snapshot restore,
//! a rebuilt cluster) since the targets last carried the content, a change waits until the
//! content has been stable for `--consul-restore-grace`: a restore written back key by key
//! passes through states nobody wants rolled out. It starts with a reset the watches saw
//! ([`latest_reset`]), a status held for lost content read at a replica's start, or a restore
//! that a replica's first read finds ([`restored_at_first_read`]); it ends once the targets carry
//! the content.

use std::time::Duration;

use consul_kv::KvQuery;
use consulbind_api::ConsulBindingStatus;
use tokio::time::Instant;

use super::{input::KeyContent, loss::recorded};
use crate::watches::KeyState;

/// What a replica knows of the grace of one binding.
#[derive(Debug, Default)]
pub struct Restore {
    /// When the targets last carried the content (or were rolled to it): a reset after this
    /// puts the binding in its grace.
    settled_at: Option<Instant>,
    /// When this replica first read a status held for content lost in an index reset (as after
    /// a restart during the hold), or one that Consul's index has gone below (a restore while no
    /// replica watched): like a reset, it puts the binding in its grace.
    held_since: Option<Instant>,
    /// This replica has compared Consul's first answer with the status ([`restored_since`]).
    pub compared: bool,
    /// That comparison found a restore, and no status written since says so yet.
    restored: bool,
}

impl Restore {
    /// The grace that applies to a reconcile that started at `started`, and whether a restore
    /// found at this replica's first read is still to be shown. `held`: the last status holds
    /// content lost in an index reset; `found`: what the first read found, when this reconcile
    /// made it; `reset`: the latest index reset the watches saw on its paths.
    pub fn grace(
        &mut self,
        held: bool,
        found: Option<bool>,
        reset: Option<Instant>,
        started: Instant,
        grace: Duration,
    ) -> (Option<Duration>, bool) {
        if let Some(found) = found {
            self.compared = true;
            if found {
                self.restored = true;
                self.held_since = Some(started);
            }
        }
        if held && self.held_since.is_none() {
            self.held_since = Some(started);
        }
        let reset = reset.max(self.held_since);
        let restore = reset.filter(|reset| self.settled_at.is_none_or(|settled| settled < *reset)).map(|_| grace);
        (restore, self.restored)
    }

    /// A status was written by a reconcile that started at `started`. `shown`: it showed what the
    /// first read found (Consul and the objects were read); `settled`: the targets carry the
    /// content, which ends the grace of any reset before `started`.
    pub fn written(&mut self, shown: bool, settled: bool, started: Instant) {
        if shown {
            self.restored = false;
        }
        if settled {
            self.settled_at = Some(started);
        }
    }
}

/// When an answer for one of the binding's contents last came with Consul's index gone backwards.
pub fn latest_reset(contents: &[KeyState]) -> Option<tokio::time::Instant> {
    contents
        .iter()
        .filter_map(|s| match s {
            KeyState::Ready(content) => content.reset_at,
            KeyState::Failed { last, .. } => last.as_ref()?.reset_at,
            KeyState::Pending => None,
        })
        .max()
}

/// Whether this replica's first read of a binding finds Consul restored since `previous` was
/// written ([`restored_since`]). A path read in a shared query is read alone where its
/// own index is needed, so the grouping of the reads changes nothing.
pub async fn restored_at_first_read(
    previous: &ConsulBindingStatus,
    read: &[KeyContent<'_>],
    queries: &[KvQuery],
    index_if_empty: impl AsyncFnOnce(&[&KvQuery]) -> Result<Vec<Option<u64>>, consul_kv::Error>,
) -> Result<bool, consul_kv::Error> {
    let needs = needs_own_index(previous, read);
    let mut indexed = read.to_vec();
    if needs.contains(&true) {
        let alone: Vec<&KvQuery> = queries.iter().zip(&needs).filter(|(_, n)| **n).map(|(q, _)| q).collect();
        let indexes = index_if_empty(&alone).await?;
        let wanted = indexed.iter_mut().zip(&needs).filter(|(_, n)| **n).map(|(c, _)| c);
        for (content, index) in wanted.zip(indexes) {
            content.index = index;
        }
    }
    Ok(restored_since(previous, &indexed))
}

/// Whether Consul's index went backwards since `status` was written, as in a snapshot restore or
/// a rebuilt cluster while no replica watched: a key read below the modify index the status
/// recorded for it. Only what no write, delete or tombstone reaping can give counts: an exact
/// key's own ModifyIndex, or the index of a query of its own, which for a missing key or an
/// empty prefix is the whole store's (or its newest tombstone's, written after anything the
/// status recorded), so it is below none of the indexes the status recorded for the binding's
/// keys, all of one store. A prefix with keys left says nothing (reaping the tombstone of its
/// newest key lowers its index).
pub fn restored_since(status: &ConsulBindingStatus, contents: &[KeyContent<'_>]) -> bool {
    let highest = status.keys.iter().filter_map(|k| k.modify_index).max();
    contents.iter().any(|c| {
        let Some(recorded) = recorded(status, c).and_then(|k| k.modify_index) else { return false };
        let floor = if is_empty(c) { highest.unwrap_or(recorded) } else { recorded };
        own_index(c).is_some_and(|now| now < floor)
    })
}

fn is_empty(content: &KeyContent<'_>) -> bool {
    !content.entries.iter().any(|e| content.source.recurse || *e.key == *content.source.key)
}

/// The index [`restored_since`] compares for `content`: `None` where it says nothing.
fn own_index(content: &KeyContent<'_>) -> Option<u64> {
    match content.source.recurse {
        false => {
            content.entries.iter().find(|e| *e.key == *content.source.key).map(|e| e.modify_index).or(content.index)
        }
        true => content.index.filter(|_| content.entries.is_empty()),
    }
}

/// Which of `contents` a first read must read alone for [`restored_since`] to judge it: empty
/// (or missing) where the status recorded an index, and read in a shared query, whose index
/// says nothing of the path.
pub fn needs_own_index(status: &ConsulBindingStatus, contents: &[KeyContent<'_>]) -> Vec<bool> {
    contents
        .iter()
        .map(|c| is_empty(c) && c.index.is_none() && recorded(status, c).is_some_and(|k| k.modify_index.is_some()))
        .collect()
}

#[cfg(test)]
mod tests {
    use consul_kv::KvEntry;
    use consulbind_api::{KeySource, KeyStatus};

    use super::*;

    const GRACE: Duration = Duration::from_secs(30);

    fn status(key: &KeySource, modify_index: u64) -> ConsulBindingStatus {
        let key = KeyStatus {
            key: key.key.clone(),
            recurse: key.recurse,
            present: true,
            modify_index: Some(modify_index),
            ..Default::default()
        };
        ConsulBindingStatus { keys: vec![key], ..Default::default() }
    }

    fn exact() -> KeySource {
        KeySource { key: "app/config".into(), ..Default::default() }
    }

    /// A reset after the targets last settled puts the binding in its grace; one at or before
    /// the start of the reconcile that settled them was read by it; settling again ends it.
    #[test]
    fn a_reset_after_the_targets_settled_gives_the_grace_and_settling_again_ends_it() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let mut restore = Restore::default();
        assert_eq!(restore.grace(false, None, Some(at(1)), at(2), GRACE), (Some(GRACE), false), "never settled");
        restore.written(false, true, at(5));
        for reset in [at(1), at(5)] {
            assert_eq!(restore.grace(false, None, Some(reset), at(6), GRACE).0, None);
        }
        assert_eq!(restore.grace(false, None, Some(at(7)), at(8), GRACE).0, Some(GRACE));
        restore.written(false, true, at(9));
        assert_eq!(restore.grace(false, None, Some(at(7)), at(10), GRACE).0, None, "settled since");
        assert_eq!(restore.grace(false, None, None, at(10), GRACE).0, None, "no reset");
    }

    /// A restore found at a replica's first read holds from that reconcile on, and is to be
    /// shown until a status has shown it; a held status read at the start holds likewise.
    #[test]
    fn a_restore_found_at_the_first_read_holds_and_is_shown_until_a_status_shows_it() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let mut restore = Restore::default();
        restore.written(false, true, at(0));
        assert_eq!(restore.grace(false, Some(true), None, at(1), GRACE), (Some(GRACE), true));
        assert!(restore.compared);
        restore.written(false, false, at(2));
        assert_eq!(restore.grace(false, None, None, at(3), GRACE), (Some(GRACE), true), "not shown yet");
        restore.written(true, false, at(4));
        assert_eq!(restore.grace(false, None, None, at(5), GRACE), (Some(GRACE), false), "shown, still held");
        restore.written(true, true, at(6));
        assert_eq!(restore.grace(false, None, None, at(7), GRACE), (None, false), "settled");

        let mut held = Restore::default();
        assert_eq!(held.grace(true, Some(false), None, at(8), GRACE), (Some(GRACE), false));
    }

    #[test]
    fn a_key_read_at_the_index_recorded_is_not_restored() {
        let exact = exact();
        let entries = [KvEntry::new("app/config", "v", 50)];
        let content = [KeyContent { source: &exact, entries: &entries, reset_hold: false, index: None }];
        assert!(!restored_since(&status(&exact, 50), &content));
        assert!(restored_since(&status(&exact, 51), &content));
    }

    /// Only a key found empty in a shared read, whose status recorded an index, is read alone.
    #[test]
    fn only_an_empty_key_read_in_a_shared_query_with_a_recorded_index_is_read_alone() {
        let (exact, other) = (exact(), KeySource { key: "db".into(), ..Default::default() });
        let entries = [KvEntry::new("app/config", "v", 50)];
        let content = |source, entries, index| KeyContent { source, entries, reset_hold: false, index };
        let contents = [
            content(&exact, &[][..], None),
            content(&exact, &entries[..], None),
            content(&exact, &[][..], Some(60)),
            content(&other, &[][..], None),
        ];
        assert_eq!(needs_own_index(&status(&exact, 50), &contents), [true, false, false, false]);
    }

    /// A first read reads a missing key alone, and the store's index then tells a restore from a
    /// deletion.
    #[tokio::test]
    async fn a_first_read_finds_a_restore_in_what_it_reads_alone() {
        let exact = exact();
        let query = KvQuery::exact("app/config");
        let read = [KeyContent { source: &exact, entries: &[], reset_hold: false, index: None }];
        for (store, restored) in [(12, true), (70, false)] {
            let alone = async |alone: &[&KvQuery]| {
                assert_eq!(alone, [&query]);
                Ok(vec![Some(store)])
            };
            let found = restored_at_first_read(&status(&exact, 50), &read, std::slice::from_ref(&query), alone).await;
            assert_eq!(found.unwrap(), restored, "the store at {store}");
        }
    }
}
