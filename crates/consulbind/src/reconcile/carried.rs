//! What each target carries, as a state kept in the status and read back here alone.
//!
//! A workload's pod template holds a stamp S of this binding's (or none, or someone else's
//! value). S stands for a checksum C: S itself, or the newer content it was rebased to when
//! only the set of ConfigMaps and Secrets the targets reference changed (a template change
//! rolls its workload by itself). The status keeps that in two places that are read as one:
//! `targets[].stamp` for each workload found, and `rebasedStamps` for the binding, which
//! outlasts a workload that leaves the targets and comes back.
//! - A target is behind when what its stamp stands for is not the current content.
//! - A rebase adds the applied checksum to the stamps that stand for the new one; a change of
//!   the applied checksum by a rollout clears them, as every older stamp is then behind.

use std::collections::BTreeMap;

use consulbind_api::{ConsulBindingStatus, TargetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::plan::{Input, Outcome, Plan};
use crate::cluster::{Live, Workload};

/// The most stamps kept as standing for the applied checksum: each rebase adds one.
const MAX_REBASED: usize = 8;

/// The status's memory of what each target carries.
pub struct Carried<'a> {
    rows: BTreeMap<Workload, &'a TargetStatus>,
    applied: Option<&'a str>,
    rebased: &'a [String],
}

impl<'a> Carried<'a> {
    pub fn new(status: &'a ConsulBindingStatus) -> Self {
        Self {
            rows: status.targets.iter().map(|t| ((t.kind, t.name.clone()), t)).collect(),
            applied: status.applied_checksum.as_deref(),
            rebased: &status.rebased_stamps,
        }
    }

    /// What the last status recorded `w` as running, if it listed it among the targets found.
    pub fn checksum(&self, w: &Workload) -> Option<&'a str> {
        self.rows.get(w).map(|t| t.checksum.as_str())
    }

    /// The content a workload's own stamp stands for.
    pub fn stands_for<'l>(&self, w: &Workload, live: &'l Live) -> &'l str
    where
        'a: 'l,
    {
        match (self.rows.get(w), self.applied) {
            (Some(t), _) if t.stamp.as_deref() == Some(live.checksum()) => &t.checksum,
            (_, Some(applied)) if self.rebased.iter().any(|s| s == live.checksum()) => applied,
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
                        Some(d) if plan.rebased && previous.applied_checksum.as_ref() == Some(&checksum) => {
                            (d.to_owned(), stamp.or(Some(checksum)))
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

/// The stamps that stand for `applied` in the status to write.
pub fn rebased_stamps(previous: &ConsulBindingStatus, plan: &Plan, applied: Option<&String>) -> Vec<String> {
    let before = previous.applied_checksum.as_ref();
    let mut stamps = match () {
        _ if applied == before => previous.rebased_stamps.clone(),
        // What stood for the content before stands for the new content after a rebase.
        _ if plan.rebased => previous.rebased_stamps.iter().chain(before).cloned().collect(),
        _ => Vec::new(),
    };
    let mut seen = std::collections::HashSet::new();
    stamps.retain(|s| Some(s) != applied && seen.insert(s.clone()));
    if stamps.len() > MAX_REBASED {
        stamps.drain(..stamps.len() - MAX_REBASED);
    }
    stamps
}
