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

use consulbind_api::{ConsulBindingStatus, KeyStatus, ObjectKind, ObjectStatus, conditions};

use super::input::{Input, KeyContent, ObjectContent, source};
use crate::{
    checksum::{self, Source},
    cluster::{Workload, references::References},
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

/// Tells which targets may be rebased. One may when the last status had rolled out what it
/// recorded (no change was held), the target was found then, every Consul key and named object
/// is as it was, and every object it references now holds the data it held then under the keys
/// read then, or was not read then (no target referenced it: its template changed).
pub struct Rebase<'a> {
    key: &'a checksum::Key,
    previous: &'a ConsulBindingStatus,
    objects: &'a [ObjectContent<'a>],
    /// The settled status and unchanged keys and named objects, common to every target.
    open: bool,
}

impl<'a> Rebase<'a> {
    pub fn new(
        key: &'a checksum::Key,
        previous: &'a ConsulBindingStatus,
        keys: &[KeyStatus],
        objects: &'a [ObjectContent<'a>],
        statuses: &[ObjectStatus],
    ) -> Self {
        // A status written while a change was held records sources that the targets' rows do
        // not stand for; so does one from a failed patch.
        let settled = [
            conditions::reason::UP_TO_DATE,
            conditions::reason::BASELINED,
            conditions::reason::TARGET_MISSING,
            conditions::reason::KIND_NOT_SERVED,
        ];
        let ready = previous.conditions.iter().find(|c| c.type_ == conditions::READY);
        let same_keys = previous.keys.len() == keys.len()
            && previous
                .keys
                .iter()
                .zip(keys)
                .all(|(a, b)| (&a.key, a.recurse, &a.checksum) == (&b.key, b.recurse, &b.checksum));
        let open = ready.is_some_and(|c| settled.contains(&c.reason.as_str()))
            && same_keys
            && named(&previous.objects).eq(named(statuses));
        Self { key, previous, objects, open }
    }

    /// Whether `target`, which references `uses`, runs its content though it does not carry
    /// its checksum.
    pub fn allows(&self, target: &Workload, uses: Option<&References>) -> bool {
        let was_found = self.previous.targets.iter().any(|t| (t.kind, &t.name) == (target.0, &target.1));
        let unchanged = |(kind, name): &(_, String)| {
            let before = self.previous.objects.iter().find(|p| p.referenced && p.kind == *kind && p.name == *name);
            let now = self.objects.iter().find(|o| o.referenced && o.kind == *kind && o.source.name == *name);
            match (before, now) {
                (Some(before), Some(now)) => {
                    let bound = |k: &str| before.keys.as_ref().is_none_or(|keys| keys.iter().any(|b| b == k));
                    let source = object_source(now, bound);
                    checksum::from_digests(self.key, std::slice::from_ref(&source)) == before.checksum
                }
                _ => true,
            }
        };
        self.open && was_found && uses.into_iter().flat_map(|u| u.keys()).all(unchanged)
    }
}
