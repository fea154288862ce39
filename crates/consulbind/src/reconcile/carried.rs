//! What each target carries, as a state kept in the status and read back here alone.
//!
//! A workload's pod template holds a stamp S of this binding's (or none, or someone else's
//! value). S stands for a checksum C of the content its pods run: S itself, or the newer
//! content it was rebased to when its template's references changed (a template change rolls
//! its workload by itself; see [`content`](super::content)). That is the workload's own row,
//! `targets[]` while it is found and `formerTargets[]` after it left the targets, so one that
//! comes back (relabelled out of a selector and back) is judged by what it runs; a workload
//! without a row or a stamp counts as started with the content of the moment it is found.
//! - A target is behind when what its stamp stands for is not what it reads now.
//! - A rebase moves the row of a target found to what it reads now; a former target's pods did
//!   not start again, so its row stays.

use std::collections::BTreeMap;

use consulbind_api::{
    ConsulBindingStatus, RolloutPhase, RolloutStatus, TargetState, TargetStatus,
    conditions::{self, reason},
};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};

use super::{
    input::{Consul, Input, Outcome, Plan},
    staging::Staging,
};
use crate::cluster::{Live, Version, Workload};

/// The most rows of former targets kept, the newest.
const MAX_FORMER: usize = 16;
const SECOND: SignedDuration = SignedDuration::from_secs(1);

/// The status's memory of what each workload carries.
pub struct Carried<'a> {
    rows: BTreeMap<Workload, &'a TargetStatus>,
}

impl<'a> Carried<'a> {
    /// The rows of `status` that belong to the workloads of `versions` as they are now: a row
    /// of another uid was a workload deleted since and made again under its name.
    pub fn new(status: &'a ConsulBindingStatus, versions: &BTreeMap<Workload, Version>) -> Self {
        let theirs = |t: &&TargetStatus| match (&t.uid, versions.get(&(t.kind, t.name.clone()))) {
            (Some(uid), Some(now)) if !now.uid.is_empty() => *uid == now.uid,
            _ => true,
        };
        // A target's row wins over a former one of the same workload.
        let rows = status.former_targets.iter().chain(&status.targets).filter(theirs);
        Self { rows: rows.map(|t| ((t.kind, t.name.clone()), t)).collect() }
    }

    /// The last status's row of `w`.
    pub fn row(&self, w: &Workload) -> Option<&'a TargetStatus> {
        self.rows.get(w).copied()
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

/// The previous status with the rolls it does not record, or `None` when it records every one.
/// A target whose own stamp is neither what its row says it runs nor the stamp it carried then
/// was stamped after that status was written: its status write failed before a restart or a
/// handover, its patch landed though the answer was lost, or another binding's write carried
/// its stamp. Its row is moved to what it runs, rolled when the stamp was set. The managed
/// fields keep that to the second, so the end of that second is taken, and no earlier than the
/// start of the rollout the status records for that content: a pause, a health timeout and the
/// budget count from no earlier than the roll. A rollout of that content that no status records
/// begins with these rolls.
pub fn unrecorded(input: &Input<'_>) -> Result<Option<ConsulBindingStatus>, (&'static str, String)> {
    let Some(staging) = input.staging else { return Ok(None) };
    let carried = Carried::new(input.previous, input.versions);
    let now = input.clock;
    let rolls: Vec<(&Workload, &str, Timestamp)> = input
        .found
        .iter()
        .filter_map(|w| {
            let (live, row) = (input.live.get(w).filter(|l| l.owned)?, carried.row(w)?);
            let runs = live.checksum();
            if row.checksum == runs || row.stamp.as_deref() == Some(runs) {
                return None;
            }
            let at = live.at.and_then(|at| at.checked_add(SECOND).ok()).map_or(now, |at| at.min(now));
            Some((w, runs, at))
        })
        .collect();
    if rolls.is_empty() {
        return Ok(None);
    }
    // A rollout is of the whole content, a target's stamp of its own (which, with its template's
    // references, differs from the whole): a roll to what the target reads now is the rollout of
    // what the binding reads now. Until the content is read, such a binding cannot tell.
    let read = super::plan::contents(input);
    if read.is_none() && input.spec.include_target_references {
        return Err(unread(input));
    }
    let rollout_of = |w: &Workload, runs: &str| match &read {
        Some((desired, content)) if content.get(w).is_some_and(|c| c == runs) => desired.clone(),
        _ => runs.to_owned(),
    };
    let rolls = rolls.into_iter().map(|(w, runs, at)| (w, runs, rollout_of(w, runs), at)).collect();
    Ok(Some(amend(input, &carried, staging, rolls)))
}

/// Why the content is not read.
fn unread(input: &Input<'_>) -> (&'static str, String) {
    match (&input.consul, &input.objects) {
        (Consul::Failed { reason, message }, _) | (_, Err((reason, message))) => (*reason, message.clone()),
        _ => (reason::CONSUL_UNREACHABLE, "the content is not read yet".into()),
    }
}

/// The previous status with `rolls` recorded: each target, what it runs, the rollout that is
/// of, and when it rolled.
fn amend(
    input: &Input<'_>,
    carried: &Carried<'_>,
    staging: &Staging,
    rolls: Vec<(&Workload, &str, String, Timestamp)>,
) -> ConsulBindingStatus {
    let recorded = |of: &str| input.previous.rollout.as_ref().filter(|r| r.checksum == of);
    let rolls: Vec<_> = rolls
        .into_iter()
        .map(|(w, runs, of, at)| {
            let at = recorded(&of).map_or(at, |r| at.max(r.started_time.0));
            (w, runs, of, at)
        })
        .collect();
    let mut status = input.previous.clone();
    for (w, runs, _, at) in &rolls {
        let uid = carried.row(w).and_then(|r| r.uid.clone());
        let rows = status.targets.iter_mut().chain(status.former_targets.iter_mut());
        let Some(row) = rows.filter(|t| (t.kind, t.name.as_str()) == (w.0, w.1.as_str())).find(|t| t.uid == uid) else {
            continue;
        };
        (row.checksum, row.stamp, row.last_rolled_time) = ((*runs).to_owned(), None, Some(Time(*at)));
        (row.state, row.message) = (Some(TargetState::Rolling), None);
        if staging.budget.is_some() {
            row.rolled_times.push(Time(*at));
        }
    }
    // Its sources are not what these rows now stand for: no target is taken as rebased on them.
    if let Some(ready) = status.conditions.iter_mut().find(|c| c.type_ == conditions::READY) {
        (ready.status, ready.reason) = ("False".into(), reason::PENDING.into());
    }
    // A rollout the status records of other content is over: these rolls came after its start.
    let latest = rolls.iter().max_by_key(|(_, _, _, at)| *at).map(|(_, _, of, _)| of);
    if let Some(latest) = latest.filter(|of| recorded(of).is_none()) {
        let started =
            rolls.iter().filter(|(_, _, of, _)| of == latest).map(|(_, _, _, at)| *at).min().unwrap_or(input.clock);
        let waves = u32::try_from(staging.waves.len() + 1).unwrap_or(u32::MAX);
        status.rollout = Some(RolloutStatus {
            checksum: latest.clone(),
            wave: 1,
            waves,
            phase: RolloutPhase::Rolling,
            since: Time(started),
            started_time: Time(started),
            progress: format!("1/{waves} {}", RolloutPhase::Rolling.as_str()),
            next_window: None,
        });
    }
    status
}

/// The targets' rows of the status to write after `plan` and its `outcome`.
pub fn rows(input: &Input<'_>, plan: &Plan, outcome: &Outcome, now: &Time) -> Vec<TargetStatus> {
    let carried = Carried::new(input.previous, input.versions);
    input
        .found
        .iter()
        .filter_map(|w| {
            let old = carried.rows.get(w);
            let live = input.live.get(w).filter(|l| l.owned);
            let want = plan.content.get(w);
            let (checksum, stamp, last_rolled_time) = match old {
                _ if outcome.rolled.contains(w) => (want?.clone(), None, Some(now.clone())),
                // Its stamp is what it reads now (a template that dropped a reference).
                Some(old) if live.is_some_and(|l| Some(l.checksum()) == want.map(String::as_str)) => {
                    (want?.clone(), None, old.last_rolled_time.clone())
                }
                Some(old) => {
                    // Its own stamp stands for what its row says it does, or else for itself.
                    let (checksum, stamp) = match live {
                        Some(live) => (carried.stands_for(w, live).to_owned(), Some(live.checksum().to_owned())),
                        None => (old.checksum.clone(), old.stamp.clone()),
                    };
                    let (checksum, stamp) = match want {
                        // A template with no stamp of the binding's has no stamp to keep.
                        Some(want) if plan.rebased.contains(w) => (want.clone(), stamp.or(live.map(|_| checksum))),
                        _ => (checksum, stamp),
                    };
                    (checksum, stamp, old.last_rolled_time.clone())
                }
                // Found now and not rolled. At a baseline a stamp of this binding's from before (a
                // binding made again) stands for today's content, and is no cause to roll later;
                // otherwise its own stamp says what it runs, and a workload without one started
                // with the content of today, which is known once every source is read.
                None => match live {
                    Some(live) if !plan.baseline => {
                        (carried.stands_for(w, live).to_owned(), Some(live.checksum().to_owned()), None)
                    }
                    _ => (want?.clone(), live.filter(|_| plan.baseline).map(|l| l.checksum().to_owned()), None),
                },
            };
            let stamp = stamp.filter(|s| *s != checksum);
            let uid = input.versions.get(w).map(|v| v.uid.clone()).filter(|uid| !uid.is_empty());
            let (state, message, rolled_times, judged_time) = match (&plan.staged, old) {
                _ if input.staging.is_none() => (None, None, Vec::new(), None),
                (Some(step), _) => {
                    // A patch that failed rolled nothing: the target is still to roll, and the
                    // budget is not spent.
                    let (state, message) = match outcome.failed.iter().any(|(f, _)| f == w) {
                        true => step.unrolled.get(w).cloned().flatten().unzip(),
                        false => step.states.get(w).cloned().unzip(),
                    };
                    let mut times = step.times.get(w).cloned().unwrap_or_default();
                    if outcome.rolled.contains(w) && input.staging.is_some_and(|s| s.budget.is_some()) {
                        times.push(now.clone());
                    }
                    (state, message.flatten(), times, step.judged.get(w).cloned())
                }
                // Nothing was staged (a source cannot be read, or is missing): the last word stands.
                (None, Some(old)) => {
                    (old.state, old.message.clone(), old.rolled_times.clone(), old.judged_time.clone())
                }
                (None, None) => (None, None, Vec::new(), None),
            };
            let row = TargetStatus {
                kind: w.0,
                name: w.1.clone(),
                checksum,
                stamp,
                last_rolled_time,
                uid,
                state,
                message,
                rolled_times,
                judged_time,
            };
            Some(row)
        })
        .collect()
}

/// How many of `rows` carry their content. While some source cannot be read, a row counts as
/// carrying it if it did in the last status and has not moved since.
pub fn carrying(previous: &ConsulBindingStatus, plan: &Plan, rows: &[TargetStatus]) -> usize {
    let was_up_to_date =
        previous.conditions.iter().any(|c| c.type_ == conditions::TARGETS_UPDATED && c.status == "True");
    let carries = |t: &&TargetStatus| {
        let w = (t.kind, t.name.clone());
        match plan.content.get(&w) {
            Some(want) => *want == t.checksum,
            None => {
                let unmoved =
                    previous.targets.iter().any(|p| (p.kind, &p.name, &p.checksum) == (t.kind, &t.name, &t.checksum));
                (was_up_to_date && unmoved) || previous.applied_checksum.as_ref() == Some(&t.checksum)
            }
        }
    };
    rows.iter().filter(carries).count()
}

/// The rows of workloads no longer found, the newest [`MAX_FORMER`]: the last status's, with
/// the targets it had that are gone now. After an `edited` spec their states are forgotten: one
/// that halted the rollout as it went no longer holds it.
pub fn former(previous: &ConsulBindingStatus, found: &[Workload], edited: bool) -> Vec<TargetStatus> {
    let gone = |t: &&TargetStatus| !found.iter().any(|w| w.0 == t.kind && w.1 == t.name);
    let mut former: Vec<TargetStatus> = Vec::new();
    for row in previous.former_targets.iter().chain(&previous.targets).filter(gone) {
        former.retain(|f| (f.kind, &f.name) != (row.kind, &row.name));
        let mut row = row.clone();
        if edited {
            (row.state, row.message) = (None, None);
        }
        former.push(row);
    }
    former.drain(..former.len().saturating_sub(MAX_FORMER));
    former
}

#[cfg(test)]
mod tests {
    use consulbind_api::WorkloadKind;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use super::*;

    fn row(name: &str, checksum: &str) -> TargetStatus {
        TargetStatus {
            kind: WorkloadKind::Deployment,
            name: name.into(),
            checksum: checksum.into(),
            ..Default::default()
        }
    }

    fn deploy(name: &str) -> Workload {
        (WorkloadKind::Deployment, name.into())
    }

    fn names(rows: &[TargetStatus]) -> Vec<(&str, &str)> {
        rows.iter().map(|r| (r.name.as_str(), r.checksum.as_str())).collect()
    }

    #[test]
    fn former_rows_are_those_of_workloads_gone_the_newest_once_each_and_at_most_sixteen() {
        let mut previous = ConsulBindingStatus {
            targets: vec![row("a", "c2"), row("b", "c2"), row("c", "c2")],
            former_targets: vec![row("a", "c1"), row("d", "c1")],
            ..Default::default()
        };
        // `a` came back; `b` left; `d` is still gone; `c` is found.
        let found = [deploy("a"), deploy("c")];
        assert_eq!(names(&former(&previous, &found, false)), [("d", "c1"), ("b", "c2")]);
        // Gone from the targets, a workload's latest row is the one kept.
        assert_eq!(names(&former(&previous, &[], false)), [("d", "c1"), ("a", "c2"), ("b", "c2"), ("c", "c2")]);

        previous.targets = (0..20).map(|i| row(&format!("w{i:02}"), "c3")).collect();
        let kept = former(&previous, &[], false);
        assert_eq!(kept.len(), MAX_FORMER);
        assert_eq!((kept[0].name.as_str(), kept[15].name.as_str()), ("w04", "w19"), "the newest are kept");
        let kept =
            former(&ConsulBindingStatus { targets: previous.targets[..16].to_vec(), ..Default::default() }, &[], false);
        assert_eq!(kept.len(), MAX_FORMER, "sixteen are all kept");
    }

    #[test]
    fn a_row_carries_its_content_when_known_and_else_what_it_carried_unmoved() {
        let plan = Plan {
            content: [(deploy("a"), "c2".to_owned()), (deploy("b"), "c2".to_owned())].into(),
            ..Default::default()
        };
        let rows = [row("a", "c2"), row("b", "c1")];
        let previous = ConsulBindingStatus::default();
        assert_eq!(carrying(&previous, &plan, &rows), 1, "only a carries c2");

        // A source cannot be read: the content is unknown.
        let unknown = Plan::default();
        let updated = Condition {
            type_: conditions::TARGETS_UPDATED.into(),
            status: "True".into(),
            reason: "UpToDate".into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        };
        let previous = ConsulBindingStatus {
            targets: vec![row("a", "c1"), row("b", "c0")],
            conditions: vec![updated.clone()],
            ..Default::default()
        };
        let now = [row("a", "c1"), row("b", "c1")];
        assert_eq!(carrying(&previous, &unknown, &now), 1, "a is unmoved from a status that was up to date");
        let was_behind = ConsulBindingStatus { conditions: vec![], ..previous.clone() };
        assert_eq!(carrying(&was_behind, &unknown, &now), 0, "unmoved, from a status that was not up to date");
        let applied = ConsulBindingStatus { applied_checksum: Some("c1".into()), ..was_behind };
        assert_eq!(carrying(&applied, &unknown, &now), 2, "both carry what was applied");
        let other_kind = [TargetStatus { kind: WorkloadKind::StatefulSet, ..row("a", "c1") }];
        assert_eq!(carrying(&previous, &unknown, &other_kind), 0, "another kind's row is another workload");
        let not_up = Condition { status: "False".into(), ..updated };
        let previous = ConsulBindingStatus { conditions: vec![not_up], ..previous };
        assert_eq!(carrying(&previous, &unknown, &now), 0, "TargetsUpdated=False");
    }
}
