//! Checksums of older formats, read as the current checksum of the same content, so that an
//! upgrade of the controller rolls nothing.

use std::collections::{BTreeMap, HashMap};

use consul_kv::KvEntry;
use consulbind_api::ConsulBindingStatus;

use super::{
    carried::Carried,
    input::{Consul, Input, KeyContent, Plan, source},
};
use crate::{
    checksum::{self, Source},
    cluster::{Live, Workload},
};

/// What the status and the workloads say, with values of an older format read as what they
/// mean.
pub struct Upgraded {
    pub previous: ConsulBindingStatus,
    pub live: BTreeMap<Workload, Live>,
}

/// The values read for [`upgrade`] are not the content the watches hold.
#[derive(Debug)]
pub struct ChangedMeanwhile;

/// Whether the status, or a workload by the binding's own stamp, holds a checksum of an older
/// format: [`checksum::v1`], or before that [`checksum::legacy`]. Only the values can tell
/// whether it is that of the current content, so the caller reads them once more.
///
/// A binding that names ConfigMaps or Secrets was made by a release that reads them: an older
/// value on it stands for content without them, which is a change. (One that only references
/// them through its targets is upgraded like a Consul-only binding, and then rebased.)
pub fn older_values(input: &Input<'_>) -> bool {
    let carried = Carried::new(input.previous, input.versions);
    matches!(input.consul, Consul::Ready(_))
        && input.spec.objects().next().is_none()
        && (input.previous.applied_checksum.as_deref().is_some_and(older)
            || input.previous.targets.iter().any(|t| older(&t.checksum))
            || input.live.iter().any(|(w, l)| l.owned && older(l.checksum()) && recorded(&carried, w, l)))
}

fn older(value: &str) -> bool {
    !checksum::is_current(value) && !checksum::is_v2(value)
}

/// Whether the status records `live` on `w`: as what its row says it runs, or as its stamp.
fn recorded(carried: &Carried<'_>, w: &Workload, live: &Live) -> bool {
    carried.row(w).is_some_and(|r| r.checksum == live.checksum() || r.stamp.as_deref() == Some(live.checksum()))
}

/// The workloads' stamps with those of an older format that the status does not record on the
/// workload taken as someone else's value (see [`carried`](super::carried)): it says nothing of
/// what the pods run, and the row, if any, does. The oldest format is a plain digest of the
/// values that anyone who may patch a workload could set under the binding's manager; read by
/// its value, a roll or none would confirm a guess of them. Legitimately, one is a workload
/// upgraded across two formats, whose row was upgraded while it kept its stamp. `None` when
/// there is none. Needs no values, so it holds at every look, Consul read or not, and no row is
/// ever moved to such a value.
pub fn disowned(input: &Input<'_>) -> Option<BTreeMap<Workload, Live>> {
    let carried = Carried::new(input.previous, input.versions);
    let unrecorded = |w: &Workload, l: &Live| l.owned && older(l.checksum()) && !recorded(&carried, w, l);
    if !input.live.iter().any(|(w, l)| unrecorded(w, l)) {
        return None;
    }
    let mut live = input.live.clone();
    for (w, l) in &mut live {
        if unrecorded(w, l) {
            (l.owned, l.at) = (false, None);
        }
    }
    Some(live)
}

/// Where a value of an older format is that of the current content, it stands for the current
/// checksum of the same content, so an upgrade rolls nothing and the status shows only current
/// checksums; the workload keeps the old value until the content next changes. `values` are the
/// entries of each of the binding's keys, read with their values. `Err` when they are not the
/// content the watches hold (it changed in between); `Ok(None)` when nothing reads differently.
pub fn upgrade(input: &Input<'_>, values: &[Vec<KvEntry>]) -> Result<Option<Upgraded>, ChangedMeanwhile> {
    let Consul::Ready(contents) = &input.consul else { return Ok(None) };
    let read: Vec<KeyContent<'_>> =
        contents.iter().zip(values).map(|(c, entries)| KeyContent { entries, ..*c }).collect();
    let sources: Vec<Source<'_>> = read.iter().map(source).collect();
    let desired = checksum::from_digests(input.key, &contents.iter().map(source).collect::<Vec<_>>());
    if read.len() != contents.len() || checksum::checksum(input.key, &sources) != desired {
        return Err(ChangedMeanwhile);
    }
    let older = [checksum::v1(input.key, &sources), checksum::legacy(&sources)];
    let mut upgraded = Upgraded { previous: input.previous.clone(), live: input.live.clone() };
    let mut found = false;
    let mut read = |value: &mut String| {
        if older.contains(value) {
            *value = desired.clone();
            found = true;
        }
    };
    if let Some(applied) = &mut upgraded.previous.applied_checksum {
        read(applied);
    }
    upgraded.previous.targets.iter_mut().for_each(|t| read(&mut t.checksum));
    // Only the stamps the status records are left owned ([`disowned`]).
    for live in upgraded.live.values_mut().filter(|l| l.owned) {
        if let Some(old) = older.iter().find(|o| live.checksum() == o.as_str()) {
            live.value = live.value.replacen(old.as_str(), &desired, 1);
            found = true;
        }
    }
    Ok(found.then_some(upgraded))
}

/// Where the status or a workload holds checksums under the cluster's key itself, as releases
/// before scoped keys stamped, what they mean in the scope's: two plans that decide nothing
/// compute what each format makes of the content read now, from the same digests.
pub fn rescoped(input: &Input<'_>) -> Option<Upgraded> {
    if !unscoped_values(input) {
        return None;
    }
    let key = input.key.unscoped();
    let unscoped = super::plan::plan(&Input { key: &key, ..input.clone() }, &mut None, tokio::time::Instant::now());
    let scoped = super::plan::plan(input, &mut None, tokio::time::Instant::now());
    Some(rescope(input, &unscoped, &scoped))
}

/// Whether the status, or a workload by a binding's own stamp, holds a checksum under the
/// cluster's key itself.
fn unscoped_values(input: &Input<'_>) -> bool {
    let previous = input.previous;
    let rows = previous.targets.iter().chain(&previous.former_targets).map(|t| t.checksum.as_str());
    let keys = previous.keys.iter().map(|k| k.checksum.as_str());
    let objects = previous.objects.iter().map(|o| o.checksum.as_str());
    let applied = previous.applied_checksum.iter().chain(previous.dry_run.iter().map(|d| &d.checksum));
    let live = input.live.values().filter(|l| l.owned).map(Live::checksum);
    applied.map(String::as_str).chain(rows).chain(keys).chain(objects).chain(live).any(checksum::is_v2)
}

/// Each checksum under the cluster's key that is one of the content read now stands for the
/// scoped checksum of the same content, so the upgrade to scoped keys rolls nothing; others
/// stay as they are, and differ from everything now. `unscoped` and `scoped` are plans of this
/// very input under the cluster's key and under the scope's.
fn rescope(input: &Input<'_>, unscoped: &Plan, scoped: &Plan) -> Upgraded {
    let mut map: HashMap<&str, &str> = HashMap::new();
    if let (Some(before), Some(now)) = (&unscoped.desired, &scoped.desired) {
        map.insert(before, now);
    }
    for (workload, before) in &unscoped.content {
        if let Some(now) = scoped.content.get(workload) {
            map.insert(before, now);
        }
    }
    for (before, now) in unscoped.keys.iter().zip(&scoped.keys) {
        map.insert(&before.checksum, &now.checksum);
    }
    for (before, now) in unscoped.objects.iter().zip(&scoped.objects) {
        map.insert(&before.checksum, &now.checksum);
    }
    let read = |value: &mut String| {
        if let Some(now) = map.get(value.as_str()) {
            *value = (*now).to_owned();
        }
    };
    // A stamp is a checksum, with a `~n` counter when forced: the rows' stamps stay equal to
    // the annotations they were copied from.
    let read_stamp = |value: &mut String| {
        let checksum = value.split_once('~').map_or(value.as_str(), |(c, _)| c);
        if let Some(now) = map.get(checksum) {
            *value = value.replacen(checksum, now, 1);
        }
    };
    let mut previous = input.previous.clone();
    previous.applied_checksum.iter_mut().for_each(read);
    previous.dry_run.iter_mut().for_each(|d| read(&mut d.checksum));
    for row in previous.targets.iter_mut().chain(&mut previous.former_targets) {
        read(&mut row.checksum);
        row.stamp.iter_mut().for_each(read_stamp);
    }
    previous.keys.iter_mut().for_each(|k| read(&mut k.checksum));
    previous.objects.iter_mut().for_each(|o| read(&mut o.checksum));
    let mut live = input.live.clone();
    live.values_mut().filter(|l| l.owned).for_each(|l| read_stamp(&mut l.value));
    Upgraded { previous, live }
}
