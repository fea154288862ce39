//! Staged rollouts, as a state machine over what the status recorded and what the workloads
//! report now. Each target is pending (behind its content), rolling (rolled, not healthy yet),
//! healthy, halted (failed, or not healthy within the health timeout) or waiting (behind, and
//! rolled as often as the budget allows). The targets form ordered waves; the first wave with
//! work is current:
//! - a halted target in it halts the rollout, until it is healthy or the content changes;
//! - otherwise its pending targets roll, at most `maxParallel` rolling at once;
//! - a wave that rolled and is healthy pauses before the next one starts.
//!
//! Everything it needs survives the controller: target states, roll times and the wave's
//! phase and time live in the status, health in the workloads themselves.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use consulbind_api::{RolloutPhase, RolloutStatus, TargetState, TargetStatus, conditions::reason};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

pub use super::staging::{Budget, Gate, MAX_WAIT, Staging};
use super::{
    carried::Carried,
    input::{Input, Step},
};
use crate::cluster::{Workload, health::Health};

/// How soon a binding with a target rolling is looked at again, whatever wakes it before.
const HEALTH_POLL: Duration = Duration::from_secs(30);

fn since(at: &Time, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(at.0)).unwrap_or_default()
}

/// How long from `now` until `at`; zero once it has passed.
fn until(at: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(now)).unwrap_or_default()
}

fn later(now: Timestamp, wait: Duration) -> Timestamp {
    let wait = k8s_openapi::jiff::SignedDuration::try_from(wait).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
    now.checked_add(wait).unwrap_or(Timestamp::MAX)
}

/// A time for people: to the second.
fn shown(at: Timestamp) -> String {
    at.round(k8s_openapi::jiff::Unit::Second).unwrap_or(at).to_string()
}

fn name(w: &Workload) -> String {
    format!("{} {}", w.0, w.1)
}

fn names<'a>(ws: impl IntoIterator<Item = &'a Workload>) -> String {
    let all: Vec<String> = ws.into_iter().map(name).collect();
    match all.len() {
        0..=3 => all.join(", "),
        n => format!("{} and {} more", all[..3].join(", "), n - 3),
    }
}

fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        _ if secs >= 3600 && secs.is_multiple_of(3600) => format!("{}h", secs / 3600),
        _ if secs >= 60 && secs.is_multiple_of(60) => format!("{}m", secs / 60),
        _ => format!("{secs}s"),
    }
}

/// One step: `behind` are the targets whose content differs from what they carry, `go` says
/// whether the change may roll now (its quiet period is over), `desired` is the content's
/// checksum; `continues`: since the status, only the targets' references changed
/// ([`Rebase::continues`](super::content::Rebase::continues)). Pure: the same recorded state
/// and reports give the same step. A roll's time joins
/// `times` once its patch has landed ([`carried::rows`](super::carried::rows)): a failed patch
/// costs no budget.
pub fn step(
    staging: &Staging,
    input: &Input<'_>,
    behind: &[Workload],
    go: bool,
    desired: &str,
    continues: bool,
) -> Step {
    let now = input.clock;
    let previous = input.previous;
    let carried = Carried::new(previous, input.versions);
    let behind: BTreeSet<&Workload> = behind.iter().collect();
    let mut step = Step::default();
    // This rollout's record in the status: of this content, or of the same but for the targets'
    // references (`continues`), which starts neither its wave nor its pause over.
    let ours = previous.rollout.as_ref().filter(|r| r.checksum == desired || continues);
    if !staging.waves.is_empty() {
        // A rollout about to start is in flight too: a target that carries its content from an
        // earlier rollout, and soured since, holds the waves after its own (waves simulator
        // seed 684).
        let in_flight = ours.map_or(!behind.is_empty(), |r| r.phase != RolloutPhase::Complete);
        // A rollout about to start starts now; its judgements are recorded once it has.
        let started = ours.map(|r| r.started_time.0);
        judge_health(staging, input, &carried, &behind, (in_flight, started), &mut step);
    }
    let blocked = spend_budget(staging, input, &carried, &behind, &mut step);
    if !go {
        // The change waits for its quiet period: the last rollout's record stands.
        step.rollout = previous.rollout.clone();
        return step;
    }
    let count =
        staging.waves.len() + usize::from(input.found.iter().any(|w| wave(staging, input, w) == staging.waves.len()));
    let record = Record {
        ours,
        started: ours.map_or_else(|| Time(now), |r| r.started_time.clone()),
        count: count.max(1),
        desired,
        now,
    };
    if let Some((row, held)) = ours.and_then(|r| Some((lost(input, r)?, r))) {
        let shown = format!("{} {}", row.kind, row.name);
        step.hold = Some((
            reason::ROLLOUT_HALTED,
            format!(
                "{shown} was deleted before this rollout saw it healthy; the rollout is halted and targets not yet \
                 rolled keep what they carry. It goes on once {shown} is back and healthy; a new change (a fix or \
                 a revert), or an edit of the binding, releases it"
            ),
        ));
        // Kept at its wave, halted since the first look that saw the target gone.
        record.at((held.wave as usize).saturating_sub(1), RolloutPhase::Halted, &mut step);
        step.wake = Some(HEALTH_POLL);
        return step;
    }
    if staging.waves.is_empty() {
        // A budget or windows alone: everything they allow rolls now.
        step.roll = behind.iter().filter(|w| !blocked.contains_key(*w)).map(|w| (*w).clone()).collect();
        if !step.roll.is_empty() && !in_window(staging, input, &record, 0, &mut step) {
            step.roll.clear();
            return step;
        }
        if let Some((w, next)) = blocked.iter().min_by_key(|(_, next)| **next) {
            let waiting = names(blocked.keys().copied());
            let (_, message) = &step.states[*w];
            step.hold = Some((
                reason::ROLLOUT_BUDGET_EXHAUSTED,
                format!("{waiting} wait for the rollout budget: {}: {}", name(w), message.as_deref().unwrap_or("")),
            ));
            step.wake = Some(until(*next, now));
            record.at(0, RolloutPhase::Waiting, &mut step);
        }
        return step;
    }
    through_waves(staging, input, &carried, &behind, &blocked, &record, step)
}

/// The health of the targets a staged rollout rolled, behind their content or not: a target
/// whose content changes and changes back is still the one rolled, and may not be healthy
/// (dropped while it was behind, the next wave rolled: simulator seed 1). Until the rollout is
/// complete, a target healthy once is judged again: one that sours during its wave's pause holds
/// the next wave (waves simulator seed 9). One the rollout did not roll that runs its content
/// (made, or made again under its name, or found, while it is under way) is judged too.
fn judge_health(
    staging: &Staging,
    input: &Input<'_>,
    carried: &Carried<'_>,
    behind: &BTreeSet<&Workload>,
    (in_flight, recorded): (bool, Option<Timestamp>),
    step: &mut Step,
) {
    let now = input.clock;
    let started = recorded.unwrap_or(now);
    for w in input.found {
        let row = carried.row(w);
        let judged = match row.and_then(|r| r.state) {
            Some(TargetState::Rolling | TargetState::Halted | TargetState::Waiting) => true,
            Some(TargetState::Healthy) => in_flight,
            None => in_flight && !behind.contains(w),
        };
        if !judged {
            if let Some(state) = row.and_then(|r| r.state) {
                step.states.insert(w.clone(), (state, None));
            }
            continue;
        }
        // Its health timeout counts from its roll, or for one this rollout did not roll (made,
        // made again or found while it is under way), from when the rollout first judged it.
        let rolled = row.and_then(|r| r.last_rolled_time.as_ref()).map(|t| t.0).filter(|t| *t >= started);
        let base = rolled.unwrap_or_else(|| {
            let kept = row.and_then(|r| r.judged_time.clone());
            let first = kept.as_ref().map(|t| t.0).filter(|t| *t >= started);
            // Before the rollout is recorded (a quiet period, a suspend) the row keeps what it
            // had: a time written at every look would be a status write at every look.
            let shown = if recorded.is_some() { Some(Time(first.unwrap_or(now))) } else { kept };
            if let Some(shown) = shown {
                step.judged.insert(w.clone(), shown);
            }
            first.unwrap_or(now)
        });
        let state = match input.health.get(w) {
            None | Some(Health::Healthy) => (TargetState::Healthy, None),
            // Its controller is done; its pods wait for a person, who need not hold the rest.
            Some(Health::AwaitsDeletion(what)) => (TargetState::Healthy, Some(what.clone())),
            Some(Health::Failed(what)) => (TargetState::Halted, Some(what.clone())),
            // A person holds it; their resume wakes the binding through the watch.
            Some(Health::Paused(what)) => (TargetState::Rolling, Some(what.clone())),
            Some(Health::Progressing(what)) => {
                let waited = Duration::try_from(now.duration_since(base)).unwrap_or_default();
                match waited >= staging.health_timeout {
                    true => {
                        let timeout = human(staging.health_timeout);
                        let what = format!("not healthy within {timeout} (rollout.healthTimeout): {what}");
                        (TargetState::Halted, Some(what))
                    }
                    false if behind.contains(w) => (TargetState::Rolling, Some(what.clone())),
                    false => {
                        let left = staging.health_timeout.saturating_sub(waited);
                        step.wake = Some(step.wake.map_or(left, |w| w.min(left)));
                        (TargetState::Rolling, Some(what.clone()))
                    }
                }
            }
        };
        step.states.insert(w.clone(), state);
    }
}

/// A target this rollout rolled, halted or not healthy yet, that is gone since: its wave's gate
/// would otherwise open without it. (One made again under its name is judged, from when it was
/// made.)
fn lost<'a>(input: &Input<'a>, ours: &RolloutStatus) -> Option<&'a TargetStatus> {
    let previous = input.previous;
    // An edit of the binding is a person's word: the spec may no longer name it.
    if ours.phase == RolloutPhase::Complete || previous.observed_generation != input.generation {
        return None;
    }
    let unsettled = |t: &&TargetStatus| {
        matches!(t.state, Some(TargetState::Halted | TargetState::Rolling))
            && t.last_rolled_time.as_ref().is_some_and(|at| at.0 >= ours.started_time.0)
    };
    let gone = |t: &&TargetStatus| !input.found.iter().any(|w| (w.0, &w.1) == (t.kind, &t.name));
    previous.targets.iter().chain(&previous.former_targets).filter(unsettled).find(gone)
}

/// The rolls of each target still within the budget's span, into `step.times`; a target behind
/// at the cap waits. Returns those, with when each may roll next.
fn spend_budget<'a>(
    staging: &Staging,
    input: &'a Input<'_>,
    carried: &Carried<'_>,
    behind: &BTreeSet<&Workload>,
    step: &mut Step,
) -> BTreeMap<&'a Workload, Timestamp> {
    let now = input.clock;
    let mut blocked = BTreeMap::new();
    if let Some(budget) = staging.budget {
        for w in input.found {
            let times: Vec<Time> = carried
                .row(w)
                .map(|r| r.rolled_times.iter().filter(|t| since(t, now) < budget.per).cloned().collect())
                .unwrap_or_default();
            if behind.contains(w) && times.len() >= budget.max as usize {
                let next = later(times[times.len() - budget.max as usize].0, budget.per);
                blocked.insert(w, next);
                let message = format!(
                    "rolled {} times in the last {} (rollout.budget); the next rollout may happen at {}",
                    times.len(),
                    human(budget.per),
                    shown(next)
                );
                step.states.insert(w.clone(), (TargetState::Waiting, Some(message)));
            }
            if !times.is_empty() {
                step.times.insert(w.clone(), times);
            }
        }
    }

    blocked
}

/// Where the rollout of `desired` stands, to record in the status.
struct Record<'a> {
    /// The status's record of this rollout, if it is under way.
    ours: Option<&'a RolloutStatus>,
    started: Time,
    count: usize,
    desired: &'a str,
    now: Timestamp,
}

impl Record<'_> {
    /// Records the rollout at `wave` (from 0), in `phase`: since when it has been there.
    fn at(&self, wave: usize, phase: RolloutPhase, step: &mut Step) {
        let count = u32::try_from(self.count).unwrap_or(u32::MAX);
        let wave = u32::try_from(wave + 1).unwrap_or(u32::MAX).min(count);
        let same = self.ours.filter(|r| r.wave == wave && r.phase == phase);
        step.rollout = Some(RolloutStatus {
            checksum: self.desired.to_owned(),
            wave,
            waves: count,
            phase,
            since: same.map_or_else(|| Time(self.now), |r| r.since.clone()),
            started_time: self.started.clone(),
            progress: format!("{wave}/{count} {}", phase.as_str()),
            next_window: None,
        });
    }
}

/// The first wave with work is current: a halt there holds everything; otherwise its pending
/// targets roll, within `maxParallel`; a wave done pauses before the next.
fn through_waves(
    staging: &Staging,
    input: &Input<'_>,
    carried: &Carried<'_>,
    behind: &BTreeSet<&Workload>,
    blocked: &BTreeMap<&Workload, Timestamp>,
    record: &Record<'_>,
    mut step: Step,
) -> Step {
    let now = input.clock;
    let (ours, started, count) = (record.ours, &record.started, record.count);
    let state = |step: &Step, w: &Workload| step.states.get(w).map(|(s, _)| *s);
    for i in 0..=staging.waves.len() {
        let members: Vec<&Workload> = input.found.iter().filter(|w| wave(staging, input, w) == i).collect();
        if members.is_empty() {
            continue;
        }
        let shown_wave = i + 1;
        // A target behind its content rolls again, whatever it reports: a fix or a revert.
        let halted = |w: &&&Workload| state(&step, w) == Some(TargetState::Halted) && !behind.contains(**w);
        if let Some(w) = members.iter().find(halted) {
            let what = step.states[*w].1.clone().unwrap_or_default();
            step.hold = Some((
                reason::ROLLOUT_HALTED,
                format!(
                    "wave {shown_wave}/{count}: {} {what}; the rollout is halted and targets not yet rolled keep what \
                     they carry. It goes on once {} is healthy; a new change (a fix or a revert) starts again from \
                     the first wave",
                    name(w),
                    name(w)
                ),
            ));
            record.at(i, RolloutPhase::Halted, &mut step);
            step.wake = Some(HEALTH_POLL);
            return step;
        }
        let rolling: Vec<&Workload> = members
            .iter()
            .copied()
            .filter(|w| state(&step, w) == Some(TargetState::Rolling) && !behind.contains(*w))
            .collect();
        let pending: Vec<&Workload> = members.iter().copied().filter(|w| behind.contains(*w)).collect();
        // Rolled in this rollout.
        let rolled_now =
            |w: &&Workload| carried.row(w).and_then(|r| r.last_rolled_time.as_ref()).is_some_and(|t| t.0 >= started.0);
        if rolling.is_empty() && pending.is_empty() {
            let pause = staging.waves.get(i).map_or(Duration::ZERO, |r| r.pause);
            let more = input.found.iter().any(|w| behind.contains(w) && wave(staging, input, w) > i);
            // A rollout that went past this wave has had its pause.
            let passed = ours.is_some_and(|r| r.wave as usize > shown_wave);
            if !pause.is_zero() && more && !passed && members.iter().any(rolled_now) {
                let paused_since = ours
                    .filter(|r| r.wave as usize == shown_wave && r.phase == RolloutPhase::Paused)
                    .map_or(now, |r| r.since.0);
                let pause_end = later(paused_since, pause);
                if now < pause_end {
                    step.hold = Some((
                        reason::WAVE_PAUSED,
                        format!(
                            "wave {shown_wave}/{count} is healthy; the next wave starts at {} (a pause of {})",
                            shown(pause_end),
                            human(pause)
                        ),
                    ));
                    step.wake = Some(until(pause_end, now));
                    record.at(i, RolloutPhase::Paused, &mut step);
                    return step;
                }
            }
            continue;
        }
        // The current wave: one this rollout has not started waits for a rollout window; one it
        // started finishes, whatever the windows say. A target still rolling from an earlier
        // change of the same content started nothing (waves simulator seed 373); one behind was
        // not rolled to this content, whenever its last roll was (seed 312).
        let rolled_here = |w: &&Workload| !behind.contains(*w) && rolled_now(w);
        let under_way = ours.is_some() && members.iter().any(rolled_here);
        if !under_way && !in_window(staging, input, record, i, &mut step) {
            return step;
        }
        let max = staging.waves.get(i).and_then(|r| r.max_parallel).map_or(usize::MAX, |m| m as usize);
        let slots = max.saturating_sub(rolling.len());
        let rollable = pending.iter().filter(|w| !blocked.contains_key(**w));
        step.roll = rollable.take(slots).map(|w| (*w).clone()).collect();
        for w in &step.roll {
            let before = step.states.insert(w.clone(), (TargetState::Rolling, None));
            step.unrolled.insert(w.clone(), before);
        }
        let rolling: Vec<&Workload> = rolling.into_iter().chain(&step.roll).collect();
        let waiting: Vec<&Workload> = pending.iter().copied().filter(|w| !step.roll.contains(w)).collect();
        let budget_bound: Vec<&Workload> = waiting.iter().copied().filter(|w| blocked.contains_key(w)).collect();
        if rolling.is_empty() {
            let next = budget_bound.iter().filter_map(|w| blocked.get(*w).copied()).min().unwrap_or(now);
            step.hold = Some((
                reason::ROLLOUT_BUDGET_EXHAUSTED,
                format!(
                    "wave {shown_wave}/{count}: {} wait for the rollout budget; the next rollout may happen at {}",
                    names(budget_bound),
                    shown(next)
                ),
            ));
            step.wake = Some(until(next, now));
            record.at(i, RolloutPhase::Waiting, &mut step);
            return step;
        }
        let mut message = format!(
            "wave {shown_wave}/{count}: waiting for {} to become healthy (rollout.healthTimeout {})",
            names(rolling.iter().copied()),
            human(staging.health_timeout)
        );
        let paused = rolling.iter().copied().filter(|w| matches!(input.health.get(*w), Some(Health::Paused(_))));
        let paused: Vec<&Workload> = paused.collect();
        if !paused.is_empty() {
            message = format!(
                "wave {shown_wave}/{count}: waiting for {}, paused (spec.paused), to be resumed \
                 (kubectl rollout resume) and healthy",
                names(paused)
            );
        }
        if !waiting.is_empty() {
            message.push_str(&format!("; {} more to roll in this wave", waiting.len()));
        }
        step.hold = Some((reason::ROLLOUT_IN_PROGRESS, message));
        if !step.roll.is_empty() {
            step.wake = Some(step.wake.map_or(staging.health_timeout, |w| w.min(staging.health_timeout)));
        }
        step.wake = Some(step.wake.map_or(HEALTH_POLL, |w| w.min(HEALTH_POLL)));
        record.at(i, RolloutPhase::Rolling, &mut step);
        return step;
    }
    let last = count - 1;
    record.at(last, RolloutPhase::Complete, &mut step);
    step
}

/// Whether wave `wave` may start now: inside the rollout windows, or let through by the
/// binding's annotation naming this content. Holds the step until the next window opens if not.
fn in_window(staging: &Staging, input: &Input<'_>, record: &Record<'_>, wave: usize, step: &mut Step) -> bool {
    let now = input.clock;
    let Gate::Closed(opens) = staging.windows.gate(now) else { return true };
    let desired = record.desired;
    let short = crate::checksum::short(desired);
    if staging.let_through.as_deref().is_some_and(|c| c == desired || c == short) {
        step.let_through = true;
        return true;
    }
    let when = match opens {
        Some(at) => format!("the change rolls when the next window opens, at {}", shown(at)),
        None => "no window opens within a year".into(),
    };
    let shown_wave = match staging.waves.len() {
        0 => String::new(),
        _ => format!("wave {}/{}: ", wave + 1, record.count),
    };
    step.hold = Some((
        reason::OUTSIDE_ROLLOUT_WINDOW,
        format!(
            "{shown_wave}outside the rollout windows (rollout.windows); {when}. To roll it now, annotate the binding \
             {}={short}",
            consulbind_api::ROLL_OUTSIDE_WINDOW
        ),
    ));
    // Looked at again when the window opens, and hourly without one.
    step.wake = Some(opens.map_or(Duration::from_secs(3600), |at| until(at, now)));
    record.at(wave, RolloutPhase::Waiting, step);
    if let Some(rollout) = &mut step.rollout {
        rollout.next_window = opens.map(Time);
    }
    false
}

fn wave(staging: &Staging, input: &Input<'_>, w: &Workload) -> usize {
    staging.wave_of(w, input.labels.get(w))
}

#[cfg(test)]
mod tests;
