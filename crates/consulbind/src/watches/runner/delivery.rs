//! How an answer reaches a group's paths: keys missing from a shared read are read alone,
//! paths new to the group are read alone while its blocking query goes on, and each path is
//! handed its part, or its failure.

use std::{collections::HashSet, sync::Arc};

use consul_kv::{
    Error, ErrorKind, KvEntry, KvQuery,
    group::{self, WatchPath},
};
use consulbind_api::conditions::reason;
use tracing::{info, warn};

use super::{
    Runner,
    roster::{MIN_WAIT, Roster},
};
use crate::{
    ReadWrite,
    watches::path::{Path, Update, View},
};

/// Reads started at once: more than the Consul client runs at its default budget (24 requests),
/// where a cold start's group may read a thousand new paths, each read's state some kilobytes.
const READS_AT_ONCE: usize = 32;

/// The answers of `reads`, in order, with at most [`READS_AT_ONCE`] of them under way. (A list,
/// not an iterator: a closure's borrow in the stream would keep the task from being `Send`.)
async fn at_most_at_once<F: std::future::Future>(reads: Vec<F>) -> Vec<F::Output> {
    use futures::StreamExt;
    futures::stream::iter(reads).buffered(READS_AT_ONCE).collect().await
}

/// A path of a group that Consul would not read alone: its position, the reason and the message.
type Refused = (usize, &'static str, String);

/// A shared answer, cut down to what its paths cover, with the keys read alone merged in.
#[derive(Default)]
pub(super) struct Confirmed {
    entries: Vec<KvEntry>,
    /// Keys Consul refused alone: their failure.
    refused: Vec<Refused>,
    /// Keys it had refused before and read alone now.
    granted: Vec<usize>,
}

impl Runner {
    /// A shared read too large is split into reads of their own; a path too large alone fails.
    pub(super) fn too_large(&self, query: &KvQuery, members: &Roster, error: &Error) {
        if members.cells.len() > 1 {
            info!(key = %query.key, paths = members.cells.len(), "a shared Consul read was too large; its paths are read on their own");
            members.cells.iter().for_each(|c| c.set_solo());
            self.replan.notify_one();
            return;
        }
        warn!(key = %query.key, %error, "a bound Consul prefix is over the limit");
        let message = format!(
            "{error}: the prefix holds more than --max-prefix-bytes ({} bytes of keys and values) allows; bind a \
             narrower prefix, or ask for a higher limit",
            self.limits.bytes
        );
        for cell in &members.cells {
            if cell.set_failed(reason::PREFIX_TOO_LARGE, &message) {
                cell.wake(&self.wake);
            }
        }
    }

    /// Reads the paths of `members` that `before` did not have, each alone, and merges them
    /// into `entries`. `None` when a read failed.
    pub(super) async fn read_new_paths(
        &self,
        query: &KvQuery,
        before: &Roster,
        members: &Roster,
        entries: Arc<[KvEntry]>,
    ) -> Option<Arc<[KvEntry]>> {
        let new: Vec<usize> = {
            // Addresses as numbers: raw pointers cannot be held across an await.
            let known: HashSet<usize> = before.cells.iter().map(|c| Arc::as_ptr(c) as usize).collect();
            (0..members.cells.len()).filter(|&i| !known.contains(&(Arc::as_ptr(&members.cells[i]) as usize))).collect()
        };
        let reads = new.iter().map(|&i| {
            let path = &members.paths()[i];
            let query = query.beside(path.key.clone(), path.recurse);
            let limit = self.limits.answer_bytes(path.recurse);
            async move { self.consul.get_wait(&query, 0, MIN_WAIT, limit).await }
        });
        let reads = at_most_at_once(reads.collect()).await;
        let mut merged = entries.to_vec();
        let mut indexes = Vec::new();
        for (&i, read) in new.iter().zip(reads) {
            let response = read.ok()?;
            group::merge(&mut merged, &members.paths()[i], response.entries);
            indexes.push((i, response.index));
        }
        let held = self.entries.share(&mut merged);
        self.metrics.consul_entries.set(held as i64);
        let entries: Arc<[KvEntry]> = merged.into();
        let applying = self.answers.write_locked();
        let mut news = Vec::new();
        for (i, path) in members.paths().iter().enumerate() {
            let view = View::new(entries.clone(), group::span(&entries, path));
            match indexes.iter().find(|(new, _)| *new == i) {
                Some(&(_, index)) => {
                    if self.hand_over(path, &members.cells[i], view, false, Some(index)) != Update::Same {
                        news.push(&members.cells[i]);
                    }
                }
                None => members.cells[i].rebase(view),
            }
        }
        drop(applying);
        news.into_iter().for_each(|cell| cell.wake(&self.wake));
        Some(entries)
    }

    /// Consul filters a recursive read by the token's ACL without a word, so a key the token may
    /// no longer read looks deleted. Each exact key that goes missing from a shared recursive
    /// read (or is missing from a fresh one) is read alone under the same token: a 404 confirms
    /// it is gone, and its content is merged in if it is there after all. A 403, or a 400 for a
    /// key Consul refuses, is that key's failure alone, returned with its reason and message;
    /// any other failure fails the whole answer.
    pub(super) async fn confirm_vanished(
        &self,
        query: &KvQuery,
        members: &Roster,
        entries: Vec<KvEntry>,
        old: Option<&[KvEntry]>,
        recheck_denied: bool,
    ) -> Result<Confirmed, Error> {
        let mut entries = members.members.retain(entries);
        if !query.recurse {
            return Ok(Confirmed { entries, ..Confirmed::default() });
        }
        let vanished: Vec<usize> = (0..members.paths().len())
            .filter(|&i| {
                let path = &members.paths()[i];
                !path.recurse
                    && group::select(&entries, path).is_empty()
                    && (old.is_none_or(|old| !group::select(old, path).is_empty())
                        || (recheck_denied && members.cells[i].denied()))
            })
            .collect();
        let reads = vanished.iter().map(|&i| {
            let query = query.beside(members.paths()[i].key.clone(), false);
            async move { self.consul.get_wait(&query, 0, MIN_WAIT, self.limits.answer_bytes(false)).await }
        });
        let (mut refused, mut granted) = (Vec::new(), Vec::new());
        for (&i, read) in vanished.iter().zip(at_most_at_once(reads.collect()).await) {
            match read {
                Ok(response) => {
                    if members.cells[i].denied() {
                        granted.push(i);
                    }
                    group::merge(&mut entries, &members.paths()[i], response.entries)
                }
                Err(error) if error.kind() == ErrorKind::AccessDenied => {
                    refused.push((i, reason::ACCESS_DENIED, error.to_string()))
                }
                Err(error) if error.is_bad_request() => refused.push((i, reason::CONSUL_ERROR, error.to_string())),
                Err(error) => return Err(error),
            }
        }
        Ok(Confirmed { entries, refused, granted })
    }

    /// Hands each path of `members` its part of `entries` (already cut down to what the paths
    /// cover, by [`Runner::confirm_vanished`]): only the paths whose entries differ
    /// from `old`, or all of them without `old`, and its failure to each `refused` one. Wakes the bindings of paths whose content changed or came back after a failure.
    /// `reset` says the index went backwards with this answer, `index` is the answer's.
    pub(super) fn deliver(
        &self,
        query: &KvQuery,
        members: &Arc<Roster>,
        Confirmed { mut entries, refused, granted }: Confirmed,
        old: Option<&[KvEntry]>,
        reset: bool,
        index: u64,
    ) -> (Arc<Roster>, Arc<[KvEntry]>) {
        let held = self.entries.share(&mut entries);
        self.metrics.consul_entries.set(held as i64);
        let entries: Arc<[KvEntry]> = entries.into();
        let mut changed: Vec<usize> = match old {
            Some(old) => members.members.changed(old, &entries),
            None => (0..members.paths().len()).collect(),
        };
        // A key Consul refused before and reads now may hold what it held then: no change of
        // entries, but news to its bindings.
        for i in granted {
            if !changed.contains(&i) {
                changed.push(i);
            }
        }
        // Every path takes its part of the answer before any binding hears of it, and a reconcile
        // reads the paths before or after, never between: a binding reading overlapping paths
        // must not roll their mix and then the whole (two rollouts for one change).
        let applying = self.answers.write_locked();
        let mut news = Vec::new();
        for (i, reason, message) in &refused {
            let cell = &members.cells[*i];
            if cell.set_failed(reason, message) {
                warn!(key = %members.paths()[*i].key, %message, "Consul refused to read a bound key");
                news.push(cell);
            }
        }
        let mut is_changed = vec![false; members.paths().len()];
        changed.into_iter().for_each(|i| is_changed[i] = true);
        for (i, path) in members.paths().iter().enumerate() {
            if refused.iter().any(|(r, ..)| *r == i) {
                continue;
            }
            let view = View::new(entries.clone(), group::span(&entries, path));
            if !is_changed[i] {
                members.cells[i].rebase(view);
                continue;
            }
            let own = (*path.key == *query.key && path.recurse == query.recurse).then_some(index);
            let update = self.hand_over(path, &members.cells[i], view, reset, own);
            if update == Update::Changed {
                info!(key = %path.key, recurse = path.recurse, index, "Consul content changed");
            }
            if update != Update::Same {
                news.push(&members.cells[i]);
            }
        }
        drop(applying);
        news.into_iter().for_each(|cell| cell.wake(&self.wake));
        (members.clone(), entries)
    }

    /// Gives one path its entries, or the `PrefixTooLarge` failure when they are over the
    /// limits; the caller wakes its bindings when that is news.
    fn hand_over(&self, path: &WatchPath, cell: &Path, entries: View, reset: bool, index: Option<u64>) -> Update {
        let limits = &self.limits;
        let bytes: u64 = entries.iter().map(|e| e.key.len() as u64 + e.size).sum();
        if path.recurse && (entries.len() > limits.entries || bytes > limits.bytes) {
            let message = format!(
                "the prefix {:?} holds {} keys and {bytes} bytes, over the limit of {} keys \
                 (--max-prefix-entries) and {} bytes (--max-prefix-bytes); bind a narrower prefix, or ask for a \
                 higher limit",
                path.key,
                entries.len(),
                limits.entries,
                limits.bytes
            );
            match cell.set_failed(reason::PREFIX_TOO_LARGE, &message) {
                true => Update::Changed,
                false => Update::Same,
            }
        } else {
            cell.set_view(entries, reset, index)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn many_reads_are_answered_in_order_a_bounded_number_at_once() {
        let (under_way, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let reads = (0..READS_AT_ONCE * 4).map(|i| {
            let (under_way, most) = (&under_way, &most);
            async move {
                most.fetch_max(under_way.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                under_way.fetch_sub(1, Ordering::SeqCst);
                i
            }
        });
        let answers = at_most_at_once(reads.collect()).await;
        assert_eq!(answers, (0..READS_AT_ONCE * 4).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), READS_AT_ONCE);
    }
}
