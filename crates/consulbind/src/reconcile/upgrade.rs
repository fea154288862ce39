//! Checksums of older formats, read as the current checksum of the same content, so that an
//! upgrade of the controller rolls nothing.

use std::collections::BTreeMap;

use consul_kv::KvEntry;
use consulbind_api::ConsulBindingStatus;

use super::plan::{Consul, Input, KeyContent, source};
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
    let older = |value: &str| !checksum::is_current(value);
    matches!(input.consul, Consul::Ready(_))
        && input.spec.objects().next().is_none()
        && (input.previous.applied_checksum.as_deref().is_some_and(older)
            || input.previous.targets.iter().any(|t| older(&t.checksum))
            || input.live.values().any(|l| l.owned && older(l.checksum())))
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
    for live in upgraded.live.values_mut() {
        if let Some(old) = older.iter().find(|o| live.checksum() == o.as_str()) {
            live.value = live.value.replacen(old.as_str(), &desired, 1);
            found = true;
        }
    }
    Ok(found.then_some(upgraded))
}
