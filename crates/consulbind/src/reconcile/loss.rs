//! Content lost as Consul's index went backwards, as a state of each bound key. The state is
//! kept in the status (`keys[].lost`, and `observedSpec` for the go-ahead) and read back here
//! alone.
//!
//! A key is live (its content counts as it is) or lost (emptied by an index reset while the
//! targets carry content from before: the binding is held).
//! - live → lost: the key is empty, the status recorded content for it, and a reset shows:
//!   the watches saw it emptied in a reset, or this replica's first read found Consul below the
//!   indexes the status recorded ([`restored_since`](super::restore::restored_since)).
//! - lost → live: its content is back, whatever it is; or the go-ahead ([`go_ahead`]), for
//!   the keys the last status showed as lost: one found lost in the same reconcile is held.
//!
//! A key the status records as empty and unmarked is live whatever the watches remember of a
//! reset, so the go-ahead holds for good and a binding made later inherits no hold.

use consulbind_api::{
    ConsulBindingSpec, ConsulBindingStatus, KeyStatus,
    conditions::{self, reason},
};

use super::input::{Input, KeyContent, Plan, quoted};

/// Whether `status` holds the binding for content lost in a Consul index reset. The keys say
/// which ([`KeyStatus::lost`]), and keep saying so while a Consul failure takes the Ready
/// condition; a status written before keys were marked says so by its Ready reason alone.
pub fn held_for_lost_content(status: &ConsulBindingStatus) -> bool {
    status.keys.iter().any(|k| k.lost) || ready_says_lost(status)
}

/// A person's say-so to roll out what was lost: a change of the spec other than `suspend`,
/// made while rollouts are not suspended. Suspending and resuming during a hold are caution,
/// not consent. A status from before `observedSpec` compares generations.
pub fn go_ahead(input: &Input<'_>) -> bool {
    let changed = match &input.previous.observed_spec {
        Some(observed) => *observed != spec_digest(input.spec),
        None => input.generation.is_none() || input.generation != input.previous.observed_generation,
    };
    changed && !input.spec.suspend
}

/// What [`go_ahead`] compares: a digest of `spec` with `suspend` unset, in hex.
pub fn spec_digest(spec: &ConsulBindingSpec) -> String {
    use sha2::{Digest, Sha256};
    let spec = ConsulBindingSpec { suspend: false, ..spec.clone() };
    let json = serde_json::to_vec(&spec).unwrap_or_default();
    Sha256::digest(&json)[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The keys a status written before keys were marked holds as lost: those its Ready message
/// names, or, where that cannot be read, every one. Empty when it has marks or holds nothing.
enum Unmarked {
    None,
    Named(Vec<String>),
    All,
}

impl Unmarked {
    fn of(status: &ConsulBindingStatus) -> Self {
        if status.keys.iter().any(|k| k.lost) || !ready_says_lost(status) {
            return Self::None;
        }
        let message = status.conditions.iter().find(|c| c.type_ == conditions::READY).map(|c| c.message.as_str());
        match message.and_then(named_lost) {
            Some(names) => Self::Named(names),
            None => Self::All,
        }
    }

    fn covers(&self, key: &str) -> bool {
        match self {
            Self::None => false,
            Self::Named(names) => names.iter().any(|n| n == key),
            Self::All => true,
        }
    }
}

/// The keys in a Ready message of [`hold`]'s (`… just as "a", "b" became empty; …`), each
/// quoted as Rust's `{:?}` quotes it; `None` if it is not one.
pub(super) fn named_lost(message: &str) -> Option<Vec<String>> {
    let (_, rest) = message.split_once(") just as ")?;
    let mut chars = rest.chars();
    let mut names = Vec::new();
    loop {
        if chars.next()? != '"' {
            return None;
        }
        let mut name = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => name.push('\n'),
                    'r' => name.push('\r'),
                    't' => name.push('\t'),
                    '0' => name.push('\0'),
                    'u' => {
                        let code: String = chars.by_ref().skip(1).take_while(|c| *c != '}').collect();
                        name.push(char::from_u32(u32::from_str_radix(&code, 16).ok()?)?);
                    }
                    escaped => name.push(escaped),
                },
                c => name.push(c),
            }
        }
        names.push(name);
        let rest = chars.as_str();
        match rest.strip_prefix(", ") {
            Some(more) => chars = more.chars(),
            None => return rest.starts_with(" became empty").then_some(names),
        }
    }
}

/// Holds `plan` for the keys that are lost, and marks them in the status; unless the
/// go-ahead released them or the targets carry the content already. Returns whether it held.
pub fn hold(input: &Input<'_>, plan: &mut Plan, contents: &[KeyContent<'_>]) -> bool {
    let unmarked = Unmarked::of(input.previous);
    let mut marks: Vec<bool> = contents.iter().map(|c| lost(input, c, &unmarked)).collect();
    // The go-ahead releases what the last status showed as lost, not a loss found only now.
    if marks.contains(&true) && go_ahead(input) {
        let shown =
            |c: &KeyContent<'_>| unmarked.covers(&c.source.key) || recorded(input.previous, c).is_some_and(|k| k.lost);
        marks.iter_mut().zip(contents).for_each(|(lost, c)| *lost &= !shown(c));
    }
    let names: Vec<&str> =
        contents.iter().zip(&marks).filter(|(_, lost)| **lost).map(|(c, _)| c.source.key.as_str()).collect();
    if names.is_empty() || input.previous.applied_checksum == plan.desired {
        return false;
    }
    for (status, lost) in plan.keys.iter_mut().zip(marks) {
        status.lost = lost;
    }
    let what = format!(
        "Consul's index went backwards (a snapshot restore or a rebuilt cluster?) just as {} became empty",
        quoted(&names)
    );
    plan.hold = Some(match input.spec.suspend {
        true => (
            reason::SUSPENDED,
            format!(
                "rollouts are suspended; {what}, and that stays held after the resume until the content is back \
                 or the spec changes"
            ),
        ),
        false => (
            reason::CONSUL_INDEX_RESET,
            format!(
                "{what}; rollouts are held until the content is back. To roll out the empty content, change this \
                 binding's spec"
            ),
        ),
    });
    true
}

/// The keys' marks while Consul cannot be read: kept, unless the go-ahead was given.
pub fn unread_keys(input: &Input<'_>) -> Vec<KeyStatus> {
    let go_ahead = input.previous.keys.iter().any(|k| k.lost) && go_ahead(input);
    input.previous.keys.iter().map(|k| KeyStatus { lost: k.lost && !go_ahead, ..k.clone() }).collect()
}

/// Whether the key `content` is read for is lost (see the module's transitions).
fn lost(input: &Input<'_>, content: &KeyContent<'_>, unmarked: &Unmarked) -> bool {
    let recorded = recorded(input.previous, content);
    let had_content = recorded.is_some_and(|k| k.present);
    content.entries.is_empty()
        && (recorded.is_some_and(|k| k.lost)
            || unmarked.covers(&content.source.key)
            || (had_content && (content.reset_hold || input.restored)))
}

fn ready_reason(status: &ConsulBindingStatus) -> Option<&str> {
    status.conditions.iter().find(|c| c.type_ == conditions::READY).map(|c| c.reason.as_str())
}

fn ready_says_lost(status: &ConsulBindingStatus) -> bool {
    ready_reason(status) == Some(reason::CONSUL_INDEX_RESET)
}

/// What `status` says of the key `content` is read for.
pub(super) fn recorded<'s>(status: &'s ConsulBindingStatus, content: &KeyContent<'_>) -> Option<&'s KeyStatus> {
    status.keys.iter().find(|k| k.key == content.source.key && k.recurse == content.source.recurse)
}

#[cfg(test)]
mod tests {
    use consulbind_api::{TargetRef, WorkloadKind};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use tokio::time::Instant;

    use super::*;
    use crate::{
        checksum,
        cluster::workloads::Resolved,
        reconcile::{observe::Observed, status},
    };

    fn spec(suspend: bool) -> ConsulBindingSpec {
        ConsulBindingSpec {
            include_target_references: true,
            targets: vec![TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), selector: None }],
            suspend,
            ..Default::default()
        }
    }

    fn ready(reason: &'static str) -> ConsulBindingStatus {
        let time = Time("2026-11-27T10:00:00Z".parse().unwrap());
        let ready = status::condition(&[], conditions::READY, Some(false), reason, "held".into(), Some(1), &time);
        ConsulBindingStatus { conditions: vec![ready], ..Default::default() }
    }

    #[test]
    fn a_hold_for_lost_content_is_read_from_the_keys_or_an_unmarked_ready_reason() {
        assert!(!held_for_lost_content(&ConsulBindingStatus::default()));
        let lost = KeyStatus { key: "app/a".into(), lost: true, ..Default::default() };
        let kept = KeyStatus { key: "app/b".into(), ..Default::default() };
        let marked = ConsulBindingStatus { keys: vec![kept.clone(), lost], ..Default::default() };
        assert!(held_for_lost_content(&marked));
        assert!(!held_for_lost_content(&ConsulBindingStatus { keys: vec![kept], ..Default::default() }));
        assert!(held_for_lost_content(&ready(reason::CONSUL_INDEX_RESET)), "a status from before the marks");
        assert!(!held_for_lost_content(&ready(reason::KEY_MISSING)));
    }

    /// Whether a reconcile of `spec` at `generation`, after `previous`, is the go-ahead.
    fn go_ahead_of(spec: &ConsulBindingSpec, generation: Option<i64>, previous: ConsulBindingStatus) -> bool {
        let key = checksum::Key::new([7; checksum::KEY_LEN]);
        let read = crate::sim::read_of(spec, key, Vec::new(), Resolved::default(), Vec::new(), Vec::new());
        let clock = "2026-11-27T10:00:00Z".parse().unwrap();
        let observed = Observed { spec, generation, previous, started: Instant::now(), clock, read: Ok(read) };
        let Ok(read) = &observed.read else { unreachable!() };
        go_ahead(&observed.input(read, None, false))
    }

    #[test]
    fn the_go_ahead_is_a_spec_change_other_than_suspend_made_while_not_suspended() {
        let seen = |spec: &ConsulBindingSpec| ConsulBindingStatus {
            observed_spec: Some(spec_digest(spec)),
            observed_generation: Some(1),
            ..Default::default()
        };
        let (running, suspended) = (spec(false), spec(true));
        assert!(!go_ahead_of(&running, Some(2), seen(&running)), "only resumed, or nothing changed");
        assert_eq!(spec_digest(&running), spec_digest(&suspended), "suspend is not part of the digest");
        let mut edited = spec(false);
        edited.rollout = Some(Default::default());
        assert!(go_ahead_of(&edited, Some(2), seen(&running)));
        edited.suspend = true;
        assert!(!go_ahead_of(&edited, Some(2), seen(&running)), "an edit while suspended");

        // A status from before observedSpec compares generations.
        let old = ConsulBindingStatus { observed_generation: Some(2), ..Default::default() };
        assert!(!go_ahead_of(&running, Some(2), old.clone()));
        assert!(go_ahead_of(&running, Some(3), old.clone()));
        assert!(go_ahead_of(&running, None, old));
    }
}
