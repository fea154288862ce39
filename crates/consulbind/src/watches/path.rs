//! One watched path: the latest word from Consul on it, and the bindings that read it.

use std::{
    ops::{Deref, Range},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Duration,
};

use consul_kv::{KvEntry, same_entries};
use consulbind_api::conditions::reason;
use tokio::time::Instant;

use crate::BindingRef;
use crate::Lock;

/// Called with each binding a watch wants reconciled.
pub type Wake = Arc<dyn Fn(BindingRef) + Send + Sync>;

/// The latest word from Consul on one watched path.
#[derive(Clone, Debug)]
pub enum KeyState {
    /// No answer yet.
    Pending,
    Ready(Content),
    /// Requests have failed for longer than the grace period; retried with backoff. `last` is
    /// the content from before, kept so that recovery with the same content is no change.
    Failed {
        reason: &'static str,
        message: String,
        last: Option<Content>,
    },
}

/// A path's entries: its part of an answer that a shared read gives several paths, held once.
#[derive(Clone, Debug, Default)]
pub struct View {
    answer: Arc<[KvEntry]>,
    /// An answer holds far fewer than 2³² entries (see `Limits`), and there is a view per path.
    span: Range<u32>,
}

impl View {
    pub fn new(answer: Arc<[KvEntry]>, span: Range<usize>) -> Self {
        assert!(span.end <= answer.len(), "a span outside its answer");
        let narrow = |i: usize| u32::try_from(i).expect("an answer of more than 2³² entries");
        Self { answer, span: narrow(span.start)..narrow(span.end) }
    }
}

#[cfg(test)]
impl View {
    /// The answer the view is part of.
    pub fn answer(&self) -> &Arc<[KvEntry]> {
        &self.answer
    }
}

impl Deref for View {
    type Target = [KvEntry];

    fn deref(&self) -> &[KvEntry] {
        &self.answer[self.span.start as usize..self.span.end as usize]
    }
}

impl From<&[KvEntry]> for View {
    fn from(entries: &[KvEntry]) -> Self {
        Self::new(entries.into(), 0..entries.len())
    }
}

#[derive(Clone, Debug)]
pub struct Content {
    /// Sorted by key; empty when the key or prefix is missing.
    pub entries: View,
    /// When this content was first seen.
    pub changed_at: Instant,
    /// Consul's index went backwards just as this content became missing or empty: data lost
    /// in a restore or a rebuilt cluster, not a change anyone made.
    pub reset_hold: bool,
    /// When an answer for this path last came with Consul's index gone backwards.
    pub reset_at: Option<Instant>,
    /// Consul's index for this path as last read by a query of its own; in a shared read the
    /// index is the group's, which says nothing of the path.
    pub index: Option<u64>,
}

/// What an answer did to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    Same,
    /// The first answer for the path.
    First,
    /// The same content as before a failure: the bindings need to hear that Consul is back.
    Recovered,
    Changed,
}

/// There is one per watched path, so it is kept small: one lock, a failure boxed, and the one
/// subscriber most paths have held inline.
#[derive(Default)]
pub struct Path {
    held: Mutex<Held>,
    /// A shared read that included this path was too large: it is read on its own from now on.
    solo: AtomicBool,
    /// Its group takes turns with others of its namespace for a blocking-query slot: the
    /// milliseconds a round of turns may take, 0 when not in turns.
    in_turns: AtomicU32,
}

#[derive(Default)]
struct Held {
    /// Bindings read it when they reconcile; a change wakes them through [`Wake`].
    state: State,
    subscribers: Subscribers,
}

/// A [`KeyState`] as a path holds it.
#[derive(Default)]
enum State {
    #[default]
    Pending,
    Ready(Content),
    Failed(Box<Failure>),
}

struct Failure {
    reason: &'static str,
    message: String,
    last: Option<Content>,
}

impl State {
    /// The content as of the last answer, whether or not requests fail since.
    fn last(&self) -> Option<&Content> {
        match self {
            State::Ready(content) => Some(content),
            State::Failed(failure) => failure.last.as_ref(),
            State::Pending => None,
        }
    }
}

/// Without duplicates. Most paths have one, and many thousands of paths are watched.
#[derive(Default)]
enum Subscribers {
    #[default]
    None,
    One(BindingRef),
    Many(Vec<BindingRef>),
}

impl Subscribers {
    fn as_slice(&self) -> &[BindingRef] {
        match self {
            Subscribers::None => &[],
            Subscribers::One(binding) => std::slice::from_ref(binding),
            Subscribers::Many(list) => list,
        }
    }

    fn add(&mut self, binding: &BindingRef) {
        match self {
            Subscribers::None => *self = Subscribers::One(binding.clone()),
            Subscribers::One(first) if first != binding => {
                *self = Subscribers::Many(vec![first.clone(), binding.clone()]);
            }
            Subscribers::Many(list) if !list.contains(binding) => {
                // A push alone would double the room.
                list.reserve_exact(1);
                list.push(binding.clone());
            }
            _ => {}
        }
    }

    fn remove(&mut self, binding: &BindingRef) {
        match self {
            Subscribers::One(only) if only == binding => *self = Subscribers::None,
            Subscribers::Many(list) => {
                list.retain(|b| b != binding);
                if let [last] = &list[..] {
                    *self = Subscribers::One(last.clone());
                }
            }
            _ => {}
        }
    }
}

impl Path {
    pub fn state(&self) -> KeyState {
        match &self.held.locked().state {
            State::Pending => KeyState::Pending,
            State::Ready(content) => KeyState::Ready(content.clone()),
            State::Failed(failure) => KeyState::Failed {
                reason: failure.reason,
                message: failure.message.clone(),
                last: failure.last.clone(),
            },
        }
    }

    pub fn subscribe(&self, binding: &BindingRef) {
        self.held.locked().subscribers.add(binding);
    }

    /// Returns whether no binding reads the path any more.
    pub fn unsubscribe(&self, binding: &BindingRef) -> bool {
        let subscribers = &mut self.held.locked().subscribers;
        subscribers.remove(binding);
        matches!(subscribers, Subscribers::None)
    }

    pub fn subscribers(&self) -> Vec<BindingRef> {
        self.held.locked().subscribers.as_slice().to_vec()
    }

    pub fn wake(&self, wake: &Wake) {
        self.subscribers().into_iter().for_each(|b| wake(b));
    }

    pub fn solo(&self) -> bool {
        self.solo.load(Ordering::Relaxed)
    }

    pub fn set_solo(&self) {
        self.solo.store(true, Ordering::Relaxed);
    }

    /// How long a round of its group's turns may take, when it takes turns.
    pub fn in_turns(&self) -> Option<Duration> {
        let millis = self.in_turns.load(Ordering::Relaxed);
        (millis > 0).then(|| Duration::from_millis(millis.into()))
    }

    /// Returns whether that is news.
    pub fn set_in_turns(&self, cycle: Option<Duration>) -> bool {
        let millis = cycle.map_or(0, |c| c.as_millis().clamp(1, u32::MAX.into()) as u32);
        self.in_turns.swap(millis, Ordering::Relaxed) != millis
    }

    /// Whether Consul refuses this path's token.
    pub fn denied(&self) -> bool {
        matches!(&self.held.locked().state, State::Failed(failure) if failure.reason == reason::ACCESS_DENIED)
    }

    /// Records new entries. Content that turns missing or empty in the same answer as an index
    /// reset is marked as lost data; it stays marked until the content is back. A reset that
    /// changes nothing (Consul reaping the tombstones under a prefix lowers its index) is no
    /// restore, and starts no grace.
    pub fn set_ready(&self, entries: &[KvEntry], reset: bool) -> Update {
        self.set_answer(entries, reset, None)
    }

    /// [`Path::set_ready`], with Consul's index for the path when a query of its own read it.
    pub fn set_answer(&self, entries: &[KvEntry], reset: bool, index: Option<u64>) -> Update {
        self.set_view(entries.into(), reset, index)
    }

    /// The same entries as before, now part of a newer answer, so that the older one can go.
    pub fn rebase(&self, view: View) {
        let mut held = self.held.locked();
        let content = match &mut held.state {
            State::Ready(content) => content,
            State::Failed(failure) => match &mut failure.last {
                Some(content) => content,
                None => return,
            },
            State::Pending => return,
        };
        if same_entries(&content.entries, &view) {
            content.entries = view;
        }
    }

    /// [`Path::set_answer`] with a view of a shared answer.
    pub fn set_view(&self, entries: View, reset: bool, index: Option<u64>) -> Update {
        let current = &mut self.held.locked().state;
        let (before, was_ready) = (current.last(), matches!(current, State::Ready(_)));
        let (update, content) = match before.filter(|b| same_entries(&b.entries, &entries)) {
            Some(before) => {
                let update = if was_ready { Update::Same } else { Update::Recovered };
                (update, Content { entries, index: index.or(before.index), ..before.clone() })
            }
            None => {
                let reset_at = if reset { Some(Instant::now()) } else { before.and_then(|b| b.reset_at) };
                let update = if before.is_some() { Update::Changed } else { Update::First };
                let lost = reset && entries.is_empty() && before.is_some_and(|b| !b.entries.is_empty());
                let changed_at = Instant::now();
                (update, Content { entries, changed_at, reset_hold: lost, reset_at, index })
            }
        };
        *current = State::Ready(content);
        update
    }

    /// Records a failure; returns whether it is news (not the same reason and message again).
    pub fn set_failed(&self, reason: &'static str, message: &str) -> bool {
        let current = &mut self.held.locked().state;
        let last = match std::mem::take(current) {
            State::Failed(failure) if failure.reason == reason && failure.message == message => {
                *current = State::Failed(failure);
                return false;
            }
            State::Failed(failure) => failure.last,
            State::Ready(content) => Some(content),
            State::Pending => None,
        };
        *current = State::Failed(Box::new(Failure { reason, message: message.to_owned(), last }));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str, modify_index: u64) -> KvEntry {
        KvEntry::new(key, value, modify_index)
    }

    fn ready(path: &Path) -> Content {
        match path.state() {
            KeyState::Ready(content) => content,
            other => panic!("not ready: {other:?}"),
        }
    }

    #[test]
    fn content_not_indexes_makes_a_change() {
        let path = Path::default();
        assert_eq!(path.set_ready(&[entry("k", "a", 1)], false), Update::First);
        let first = ready(&path).changed_at;
        assert_eq!(path.set_ready(&[entry("k", "a", 9)], false), Update::Same, "a rewrite of the same bytes");
        assert_eq!(ready(&path).changed_at, first);
        assert_eq!(path.set_ready(&[entry("k", "b", 10)], false), Update::Changed);
        assert_eq!(path.set_ready(&[], false), Update::Changed);
        assert!(!ready(&path).reset_hold, "a plain deletion is an edit");
    }

    #[test]
    fn a_failure_keeps_the_content_and_recovery_with_it_is_no_change() {
        let path = Path::default();
        path.set_ready(&[entry("k", "a", 1)], false);
        let seen = ready(&path).changed_at;
        assert!(path.set_failed("ConsulUnreachable", "down"));
        assert!(!path.set_failed("ConsulUnreachable", "down"), "the same failure again is no news");
        assert!(path.set_failed("AccessDenied", "denied"), "another reason is");
        assert!(matches!(path.state(), KeyState::Failed { last: Some(_), .. }));
        assert_eq!(path.set_ready(&[entry("k", "a", 5)], false), Update::Recovered);
        assert_eq!(ready(&path).changed_at, seen);
    }

    #[test]
    fn content_lost_with_an_index_reset_is_held_until_it_is_back() {
        let path = Path::default();
        path.set_ready(&[entry("k", "a", 7)], false);
        assert_eq!(path.set_ready(&[], true), Update::Changed);
        assert!(ready(&path).reset_hold);
        assert_eq!(path.set_ready(&[], false), Update::Same);
        assert!(ready(&path).reset_hold, "still lost");
        assert_eq!(path.set_ready(&[entry("k", "a", 2)], false), Update::Changed);
        assert!(!ready(&path).reset_hold);
        // A reset that brings content is no loss.
        assert_eq!(path.set_ready(&[entry("k", "b", 1)], true), Update::Changed);
        assert!(!ready(&path).reset_hold);
        // Every content since remembers when the index last went backwards.
        let reset_at = ready(&path).reset_at.expect("the reset is remembered");
        assert_eq!(path.set_ready(&[entry("k", "c", 2)], false), Update::Changed);
        assert_eq!(ready(&path).reset_at, Some(reset_at));
    }

    #[test]
    fn a_reset_that_changes_nothing_starts_no_grace() {
        let path = Path::default();
        path.set_ready(&[entry("k", "a", 7)], false);
        assert_eq!(path.set_ready(&[entry("k", "a", 7)], true), Update::Same);
        let content = ready(&path);
        assert!(content.reset_at.is_none() && !content.reset_hold, "tombstones reaped taken for a restore");
    }

    #[test]
    fn subscribers_have_no_duplicates() {
        let path = Path::default();
        let (a, b) = (BindingRef::new("ns", "a"), BindingRef::new("ns", "b"));
        path.subscribe(&a);
        path.subscribe(&a);
        path.subscribe(&b);
        assert_eq!(path.subscribers(), [a.clone(), b.clone()]);
        assert!(!path.unsubscribe(&a));
        assert!(path.unsubscribe(&b));
    }

    #[test]
    fn subscribers_keep_their_order_as_they_come_and_go() {
        let path = Path::default();
        let [a, b, c] = ["a", "b", "c"].map(|n| BindingRef::new("ns", n));
        for binding in [&a, &b, &c] {
            path.subscribe(binding);
        }
        assert!(!path.unsubscribe(&b));
        assert_eq!(path.subscribers(), [a.clone(), c.clone()]);
        assert!(!path.unsubscribe(&BindingRef::new("ns", "never")), "one never subscribed leaves the rest");
        assert!(!path.unsubscribe(&a));
        assert_eq!(path.subscribers(), std::slice::from_ref(&c));
        path.subscribe(&a);
        assert_eq!(path.subscribers(), [c.clone(), a.clone()]);
        assert!(!path.unsubscribe(&c) && path.unsubscribe(&a));
        assert!(path.subscribers().is_empty());
    }
}
