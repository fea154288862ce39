//! What each target carries, as a state kept in the status and read back here alone.
//!
//! A workload's pod template holds a stamp S of this binding's (or none, or someone else's
//! value). S stands for a checksum C of the content its pods run: S itself, or the newer
//! content it was rebased to when only the set of ConfigMaps and Secrets the targets reference
//! changed (a template change rolls its workload by itself). That is the workload's own row,
//! `targets[]` while it is found and `formerTargets[]` after it left the targets, so one that
//! comes back (relabelled out of a selector and back) is judged by what it runs; a workload
//! without a row or a stamp counts as started with the content of the moment it is found.
//! - A target is behind when what its stamp stands for is not the current content.
//! - A rebase moves the rows of the targets found that carry the applied checksum to the new
//!   one; a former target's pods did not start again, so its row stays.

use std::collections::BTreeMap;

use consulbind_api::{ConsulBindingStatus, TargetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::plan::{Input, Outcome, Plan};
use crate::cluster::{Live, Workload};

/// The most rows of former targets kept, the newest.
const MAX_FORMER: usize = 16;

/// The status's memory of what each workload carries.
pub struct Carried<'a> {
    rows: BTreeMap<Workload, &'a TargetStatus>,
}

impl<'a> Carried<'a> {
    pub fn new(status: &'a ConsulBindingStatus) -> Self {
        // A target's row wins over a former one of the same workload.
        let rows = status.former_targets.iter().chain(&status.targets);
        Self { rows: rows.map(|t| ((t.kind, t.name.clone()), t)).collect() }
    }

    /// What the last status recorded `w` as running, if it has a row for it.
    pub fn checksum(&self, w: &Workload) -> Option<&'a str> {
        self.rows.get(w).map(|t| t.checksum.as_str())
    }

    /// The content a workload's own stamp stands for.
    pub fn stands_for<'l>(&self, w: &Workload, live: &'l Live) -> &'l str
    where
        'a: 'l,
    {
        match self.rows.get(w) {
            Some(t) if t.stamp.as_deref() == Some(live.checksum()) => &t.checksum,
            _ => live.checksum(),
        }
    }
}

/// The targets' rows of the status to write after `plan` and its `outcome`.
pub fn rows(input: &Input<'_>, plan: &Plan, outcome: &Outcome, now: &Time) -> Vec<TargetStatus> {
    let previous = input.previous;
    let carried = Carried::new(previous);
    let desired = plan.desired.as_deref();
    input
        .found
        .iter()
        .filter_map(|w| {
            let old = carried.rows.get(w);
            let live = input.live.get(w).filter(|l| l.owned);
            let (checksum, stamp, last_rolled_time) = match old {
                _ if outcome.rolled.contains(w) => (desired?.to_owned(), None, Some(now.clone())),
                Some(old) => {
                    let (checksum, stamp) = match live {
                        Some(live) if old.stamp.as_deref() != Some(live.checksum()) => {
                            (carried.stands_for(w, live).to_owned(), Some(live.checksum().to_owned()))
                        }
                        _ => (old.checksum.clone(), old.stamp.clone()),
                    };
                    let (checksum, stamp) = match desired {
                        // A template with no stamp of the binding's has no stamp to keep.
                        Some(d) if plan.rebased && previous.applied_checksum.as_ref() == Some(&checksum) => {
                            (d.to_owned(), stamp.or(live.map(|_| checksum)))
                        }
                        _ => (checksum, stamp),
                    };
                    (checksum, stamp, old.last_rolled_time.clone())
                }
                // Found now and not rolled. At a baseline a stamp of this binding's from before (a
                // binding made again) stands for today's content, and is no cause to roll later;
                // otherwise its own stamp says what it runs, and a workload without one started
                // with the content of today.
                None => match live {
                    Some(live) if !plan.baseline => {
                        (carried.stands_for(w, live).to_owned(), Some(live.checksum().to_owned()), None)
                    }
                    _ => {
                        let checksum = desired.or(previous.applied_checksum.as_deref())?.to_owned();
                        (checksum, live.filter(|_| plan.baseline).map(|l| l.checksum().to_owned()), None)
                    }
                },
            };
            let stamp = stamp.filter(|s| *s != checksum);
            Some(TargetStatus { kind: w.0, name: w.1.clone(), checksum, stamp, last_rolled_time })
        })
        .collect()
}

/// The rows of workloads no longer found, the newest [`MAX_FORMER`]: the last status's, with
/// the targets it had that are gone now.
pub fn former(previous: &ConsulBindingStatus, found: &[Workload]) -> Vec<TargetStatus> {
    let gone = |t: &&TargetStatus| !found.iter().any(|w| w.0 == t.kind && w.1 == t.name);
    let mut former: Vec<TargetStatus> = Vec::new();
    for row in previous.former_targets.iter().chain(&previous.targets).filter(gone) {
        former.retain(|f| (f.kind, &f.name) != (row.kind, &row.name));
        former.push(row.clone());
    }
    if former.len() > MAX_FORMER {
        former.drain(..former.len() - MAX_FORMER);
    }
    former
}
