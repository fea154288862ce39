//! What each target reads, and so what it should carry: the binding's Consul keys and the
//! ConfigMaps and Secrets its spec names, which every target reads, and the objects its own pod
//! template references (with `includeTargetReferences`), as it reads them. A change of an
//! object that one workload references rolls that workload alone, as a change of what it reads;
//! without references every target's checksum is the binding's.
//!
//! A target whose template's references changed has started again by itself: its pods read the
//! objects as they are, and what it read before is still what it runs. Its row moves to its new
//! checksum without a rollout (a rebase), if nothing it read before changed meanwhile.

use std::collections::BTreeMap;

use consulbind_api::{
    ConsulBindingStatus, KeyStatus, ObjectKind, ObjectStatus, RolloutPhase, RolloutStatus,
    conditions::{self, reason},
};

use super::input::{Input, KeyContent, ObjectContent, source};
use crate::{
    checksum::{self, Source},
    cluster::{
        Workload,
        references::{References, Use},
    },
};

/// The checksum each found target should carry, computed once per distinct set of references.
pub fn of_targets(
    input: &Input<'_>,
    keys: &[KeyContent<'_>],
    objects: &[ObjectContent<'_>],
) -> BTreeMap<Workload, String> {
    let mut computed: Vec<(Option<&References>, String)> = Vec::new();
    input
        .found
        .iter()
        .map(|w| {
            let uses = input.uses.get(w).filter(|_| input.spec.include_target_references);
            let checksum = match computed.iter().find(|(u, _)| *u == uses) {
                Some((_, checksum)) => checksum.clone(),
                None => {
                    let checksum = of_target(input.key, keys, objects, uses);
                    computed.push((uses, checksum.clone()));
                    checksum
                }
            };
            (w.clone(), checksum)
        })
        .collect()
}

fn of_target(
    key: &checksum::Key,
    keys: &[KeyContent<'_>],
    objects: &[ObjectContent<'_>],
    uses: Option<&References>,
) -> String {
    let read = objects.iter().filter_map(|o| match o.referenced {
        false => Some(bound_source(o)),
        true => {
            let used = uses?.get(&(o.kind, o.source.name.clone()))?;
            Some(object_source(o, |k| used.keys.as_ref().is_none_or(|keys| keys.contains(k))))
        }
    });
    let sources: Vec<Source<'_>> = keys.iter().map(source).chain(read).collect();
    checksum::from_digests(key, &sources)
}

/// The object as a source of the checksum, with the data keys the binding reads of it.
pub fn bound_source<'a>(object: &ObjectContent<'a>) -> Source<'a> {
    object_source(object, |k| object.source.keys.as_ref().is_none_or(|keys| keys.iter().any(|b| b == k)))
}

/// The object as a source of the checksum, with the data keys that `bound` lets through.
pub fn object_source<'a>(object: &ObjectContent<'a>, bound: impl Fn(&str) -> bool) -> Source<'a> {
    Source::Object {
        kind: object.kind,
        name: &object.source.name,
        entries: object.data.map(|data| {
            data.entries
                .iter()
                .filter(|(key, ..)| bound(key))
                .map(|(key, field, digest)| (key.as_str(), *field, digest.as_slice()))
                .collect()
        }),
    }
}

/// The named objects of a status, by kind, name and checksum.
fn named(objects: &[ObjectStatus]) -> impl Iterator<Item = (ObjectKind, &String, &String)> {
    objects.iter().filter(|o| !o.referenced).map(|o| (o.kind, &o.name, &o.checksum))
}

/// Tells which targets may be rebased. One may when it ran what the last status recorded, it
/// was found then, every Consul key and named object is as it was, and every object it
/// references now holds the data it held then under the keys read then, or was not read then
/// (no target referenced it: its template changed).
///
/// A target ran what the status recorded when that status had rolled out all it recorded (no
/// change was held). During a staged rollout of what the status records, one did when it was
/// rolled in that rollout, or when what it carries is the content
/// read now under its references but one, added or dropped since (so it was rolled in this
/// rollout, or needed none).
pub struct Rebase<'a> {
    key: &'a checksum::Key,
    previous: &'a ConsulBindingStatus,
    contents: &'a [KeyContent<'a>],
    objects: &'a [ObjectContent<'a>],
    /// The settled status and unchanged keys and named objects, common to every target.
    open: bool,
    /// A staged rollout under way, of the keys and named objects read now.
    in_flight: Option<&'a RolloutStatus>,
}

impl<'a> Rebase<'a> {
    pub fn new(
        key: &'a checksum::Key,
        previous: &'a ConsulBindingStatus,
        contents: &'a [KeyContent<'a>],
        keys: &[KeyStatus],
        objects: &'a [ObjectContent<'a>],
        statuses: &[ObjectStatus],
    ) -> Self {
        // A status written while a change was held records sources that the targets' rows do
        // not stand for; so does one from a failed patch.
        let settled = [
            reason::UP_TO_DATE,
            reason::PODS_AWAIT_DELETION,
            reason::BASELINED,
            reason::TARGET_MISSING,
            reason::KIND_NOT_SERVED,
        ];
        let staged = [
            reason::ROLLOUT_IN_PROGRESS,
            reason::WAVE_PAUSED,
            reason::ROLLOUT_HALTED,
            reason::ROLLOUT_BUDGET_EXHAUSTED,
            reason::OUTSIDE_ROLLOUT_WINDOW,
        ];
        let ready = previous.conditions.iter().find(|c| c.type_ == conditions::READY);
        let says = |reasons: &[&str]| ready.is_some_and(|c| reasons.contains(&c.reason.as_str()));
        let same_keys = previous.keys.len() == keys.len()
            && previous
                .keys
                .iter()
                .zip(keys)
                .all(|(a, b)| (&a.key, a.recurse, &a.checksum) == (&b.key, b.recurse, &b.checksum));
        let same = same_keys && named(&previous.objects).eq(named(statuses));
        let in_flight =
            previous.rollout.as_ref().filter(|r| same && says(&staged) && r.phase != RolloutPhase::Complete);
        Self { key, previous, contents, objects, open: same && says(&settled), in_flight }
    }

    /// Whether `target`, which references `uses` and carries `row` by the status, runs its
    /// content though it does not carry its checksum.
    pub fn allows(&self, target: &Workload, uses: Option<&References>, row: &str) -> bool {
        let Some(recorded) = self.previous.targets.iter().find(|t| (t.kind, &t.name) == (target.0, &target.1)) else {
            return false;
        };
        let unchanged = uses.into_iter().flat_map(|u| u.keys()).all(|(kind, name)| self.unchanged(*kind, name));
        // The status keeps these times to the microsecond: a roll at or after the start is one
        // of this rollout's, even in the instant it began (a quiet period of 0 s).
        let rolled_since_start =
            |r: &&RolloutStatus| recorded.last_rolled_time.as_ref().is_some_and(|at| at.0 >= r.started_time.0);
        let ran = self.open
            || self.in_flight.as_ref().is_some_and(rolled_since_start)
            || (self.in_flight.is_some() && self.carried_with_one_reference_more_or_less(uses, row));
        ran && unchanged
    }

    /// Whether a staged rollout under way goes on as it was: since its status, only the targets'
    /// references changed, none of the data any of them read before, so neither its wave nor its
    /// pause starts over.
    pub fn continues(&self) -> bool {
        self.in_flight.is_some()
            && self.previous.objects.iter().filter(|o| o.referenced).all(|o| self.unchanged(o.kind, &o.name))
    }

    /// Whether `row` is the content read now under `uses` with one reference taken away, or one
    /// that the binding still reads added back.
    fn carried_with_one_reference_more_or_less(&self, uses: Option<&References>, row: &str) -> bool {
        let uses = uses.cloned().unwrap_or_default();
        let carried = |other: &References| of_target(self.key, self.contents, self.objects, Some(other)) == row;
        let fewer = uses.keys().any(|id| {
            let mut fewer = uses.clone();
            fewer.remove(id);
            carried(&fewer)
        });
        let dropped =
            self.previous.objects.iter().filter(|o| o.referenced && !uses.contains_key(&(o.kind, o.name.clone())));
        let more = dropped.into_iter().any(|o| {
            let mut more = uses.clone();
            more.insert(
                (o.kind, o.name.clone()),
                Use { keys: o.keys.as_ref().map(|k| k.iter().cloned().collect()), optional: false },
            );
            carried(&more)
        });
        fewer || more
    }

    /// Whether a referenced object holds the data it held at the last status, under the keys
    /// read then; one not read then is new to the binding.
    fn unchanged(&self, kind: ObjectKind, name: &str) -> bool {
        let before = self.previous.objects.iter().find(|p| p.referenced && p.kind == kind && p.name == name);
        let now = self.objects.iter().find(|o| o.referenced && o.kind == kind && o.source.name == name);
        match (before, now) {
            (Some(before), Some(now)) => {
                let bound = |k: &str| before.keys.as_ref().is_none_or(|keys| keys.iter().any(|b| b == k));
                let source = object_source(now, bound);
                checksum::from_digests(self.key, std::slice::from_ref(&source)) == before.checksum
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use consulbind_api::ObjectSource;

    use super::*;
    use crate::cluster::objects::Digested;

    const KEY: checksum::Key = checksum::Key::new([7; checksum::KEY_LEN]);

    fn sources(names: &[&str]) -> Vec<ObjectSource> {
        names.iter().map(|name| ObjectSource { name: (*name).into(), ..ObjectSource::default() }).collect()
    }

    fn data(value: &str) -> Digested {
        let entries = vec![("k".to_owned(), checksum::Field::Data, checksum::digest(&KEY, value.as_bytes()))];
        Digested { version: "1".into(), fingerprint: 0, entries: Arc::from(entries) }
    }

    fn referenced<'a>(kind: ObjectKind, source: &'a ObjectSource, data: &'a Digested) -> ObjectContent<'a> {
        ObjectContent { kind, source, referenced: true, data: Some(data) }
    }

    /// What the status records of `object` as read then.
    fn recorded(object: &ObjectContent<'_>) -> ObjectStatus {
        let checksum = checksum::from_digests(&KEY, &[object_source(object, |_| true)]);
        ObjectStatus {
            kind: object.kind,
            name: object.source.name.clone(),
            checksum,
            referenced: true,
            ..ObjectStatus::default()
        }
    }

    fn rebase<'a>(previous: &'a ConsulBindingStatus, objects: &'a [ObjectContent<'a>]) -> Rebase<'a> {
        Rebase { key: &KEY, previous, contents: &[], objects, open: false, in_flight: None }
    }

    fn uses(names: &[&str]) -> References {
        names
            .iter()
            .map(|name| ((ObjectKind::ConfigMap, (*name).to_owned()), Use { keys: None, optional: false }))
            .collect()
    }

    #[test]
    fn an_object_is_held_to_what_its_own_kind_and_name_recorded() {
        let named = sources(&["app"]);
        let (before, after) = (data("v1"), data("v2"));
        // A Secret and a ConfigMap of one name, the Secret listed first: only the Secret changed.
        let secret_then = referenced(ObjectKind::Secret, &named[0], &before);
        let config_map = referenced(ObjectKind::ConfigMap, &named[0], &before);
        let previous =
            ConsulBindingStatus { objects: vec![recorded(&secret_then), recorded(&config_map)], ..Default::default() };
        let now = [referenced(ObjectKind::Secret, &named[0], &after), config_map];
        let rebase = rebase(&previous, &now);
        assert!(rebase.unchanged(ObjectKind::ConfigMap, "app"));
        assert!(!rebase.unchanged(ObjectKind::Secret, "app"));
        assert!(rebase.unchanged(ObjectKind::ConfigMap, "new"), "one not read then is new to the binding");
    }

    #[test]
    fn an_object_is_held_to_the_keys_read_then() {
        let named = sources(&["app"]);
        let then = data("v1");
        let object = referenced(ObjectKind::ConfigMap, &named[0], &then);
        let previous = ConsulBindingStatus {
            objects: vec![ObjectStatus { keys: Some(vec!["k".into()]), ..recorded(&object) }],
            ..Default::default()
        };
        let mut entries = then.entries.to_vec();
        entries.push(("x".to_owned(), checksum::Field::Data, checksum::digest(&KEY, b"new")));
        let grown = Digested { entries: Arc::from(entries), ..data("v1") };
        let now = [referenced(ObjectKind::ConfigMap, &named[0], &grown)];
        assert!(rebase(&previous, &now).unchanged(ObjectKind::ConfigMap, "app"), "a key not read then changes nothing");
        let changed = data("v2");
        let now = [referenced(ObjectKind::ConfigMap, &named[0], &changed)];
        assert!(!rebase(&previous, &now).unchanged(ObjectKind::ConfigMap, "app"));
    }

    #[test]
    fn a_row_with_one_reference_fewer_or_one_dropped_added_back_is_carried() {
        let named = sources(&["a", "b"]);
        let (da, db) = (data("a"), data("b"));
        let objects =
            [referenced(ObjectKind::ConfigMap, &named[0], &da), referenced(ObjectKind::ConfigMap, &named[1], &db)];
        let previous =
            ConsulBindingStatus { objects: vec![recorded(&objects[0]), recorded(&objects[1])], ..Default::default() };
        let rebase = rebase(&previous, &objects);
        let row = |names: &[&str]| of_target(&KEY, &[], &objects, Some(&uses(names)));

        assert!(rebase.carried_with_one_reference_more_or_less(Some(&uses(&["a", "b"])), &row(&["a"])), "one fewer");
        assert!(
            rebase.carried_with_one_reference_more_or_less(Some(&uses(&["a"])), &row(&["a", "b"])),
            "b dropped since"
        );
        assert!(!rebase.carried_with_one_reference_more_or_less(Some(&uses(&["a", "b"])), &row(&[])), "two fewer");
        assert!(
            !rebase.carried_with_one_reference_more_or_less(Some(&uses(&["a", "b"])), &row(&["a", "b"])),
            "as read now"
        );
    }
}
