//! The decision at the heart of a reconcile, free of I/O: given what Consul and the cluster
//! look like now and what the status says was applied, which targets to roll and what to report.
//! Its types are in [`input`](super::input).

use std::collections::BTreeMap;

use consulbind_api::{KeyStatus, ObjectStatus, RolloutPhase, conditions::reason};
use tokio::time::Instant;

pub use super::input::{Consul, Input, KeyContent, ObjectContent, Outcome, Plan, forced};
use super::{
    carried::Carried,
    content,
    debounce::{Decision, Pending, Window},
    input::{quoted, source},
    loss, waves,
};
use crate::{
    checksum::{self, Source},
    cluster::Workload,
};

pub fn plan(input: &Input<'_>, pending: &mut Option<Pending>, now: Instant) -> Plan {
    let contents = match &input.consul {
        Consul::Ready(contents) => contents,
        Consul::Failed { reason, message } => return unread(input, reason, message),
    };
    let objects = match &input.objects {
        Ok(objects) => objects,
        Err((reason, message)) => return unread(input, reason, message),
    };
    let mut plan = read(input, contents, objects);
    // Content lost as Consul's index went backwards (seen by the watches, marked in the status
    // across a restart, or found by this replica's first read) comes before a missing key or
    // object, required keys included: the status must go on saying what is lost until it is back.
    if loss::hold(input, &mut plan, contents) || missing(&mut plan, contents, objects) {
        *pending = None;
        return plan;
    }
    let Some(applied) = input.previous.applied_checksum.as_deref() else { return first_bind(input, plan, now) };
    let (behind, continues) = behind(input, &mut plan, applied, contents, objects);
    roll_when_settled(input, plan, behind, continues, applied, pending, now)
}

/// The checksum of the whole content and each target's, when every source is read.
pub fn contents(input: &Input<'_>) -> Option<(String, BTreeMap<Workload, String>)> {
    let (Consul::Ready(contents), Ok(objects)) = (&input.consul, &input.objects) else { return None };
    let plan = read(input, contents, objects);
    Some((plan.desired?, plan.content))
}

/// What the sources hold: their statuses, the checksum of the whole and each target's content.
fn read(input: &Input<'_>, contents: &[KeyContent<'_>], objects: &[ObjectContent<'_>]) -> Plan {
    let keys: Vec<KeyStatus> = contents.iter().map(|c| key_status(input.key, c)).collect();
    let object_sources: Vec<Source<'_>> = objects.iter().map(content::bound_source).collect();
    let object_statuses = objects.iter().zip(&object_sources).map(|(o, s)| object_status(input.key, o, s)).collect();
    // Every source of the checksum: the Consul keys, then the ConfigMaps and Secrets.
    let sources: Vec<Source<'_>> = contents.iter().map(source).chain(object_sources).collect();
    let desired = checksum::from_digests(input.key, &sources);
    let content = content::of_targets(input, contents, objects);
    Plan { desired: Some(desired), content, keys, objects: object_statuses, ..Plan::default() }
}

/// Holds the rollout while a required key or object is missing; whether it does.
fn missing(plan: &mut Plan, contents: &[KeyContent<'_>], objects: &[ObjectContent<'_>]) -> bool {
    let keys: Vec<&str> =
        contents.iter().filter(|c| !c.source.optional && c.entries.is_empty()).map(|c| c.source.key.as_str()).collect();
    if !keys.is_empty() {
        let one = keys.len() == 1;
        plan.hold = Some((
            reason::KEY_MISSING,
            format!(
                "required Consul {} {} {} missing; rollouts are held until {} again (or mark {} optional)",
                if one { "key" } else { "keys" },
                quoted(&keys),
                if one { "is" } else { "are" },
                if one { "it exists" } else { "they exist" },
                if one { "it" } else { "them" },
            ),
        ));
        return true;
    }
    let objects: Vec<String> = objects
        .iter()
        .filter(|o| !o.source.optional && o.data.is_none())
        .map(|o| format!("{} {:?}", o.kind, o.source.name))
        .collect();
    if !objects.is_empty() {
        let one = objects.len() == 1;
        plan.hold = Some((
            reason::OBJECT_MISSING,
            format!(
                "required {} {} missing; rollouts are held until {} (or mark {} optional)",
                objects.join(", "),
                if one { "is" } else { "are" },
                if one { "it exists" } else { "they exist" },
                if one { "it" } else { "them" },
            ),
        ));
        return true;
    }
    false
}

/// The first sight of the content: a baseline, or with `onBind` a rollout of every target.
fn first_bind(input: &Input<'_>, mut plan: Plan, now: Instant) -> Plan {
    let on_bind = input.spec.rollout.as_ref().is_some_and(|r| r.on_bind);
    if on_bind && input.spec.suspend {
        // Suspend wins: the first rollout waits for the resume, and records nothing before.
        plan.hold = Some((reason::SUSPENDED, "rollouts are suspended; the targets roll once on resume".into()));
        return plan;
    }
    plan.baseline = !on_bind;
    if plan.baseline {
        return plan;
    }
    if input.dry_run {
        return plan.would_roll(input.found.to_vec(), "rollout.onBind rolls the targets when first bound".into());
    }
    // Until every target has it, through the waves and the budget like any rollout: those with
    // the binding's own stamp of their content have had theirs.
    let stamped = |w: &&Workload| input.live.get(*w).is_some_and(|l| l.owned && l.checksum() == plan.content[*w]);
    let behind: Vec<Workload> = input.found.iter().filter(|w| !stamped(w)).cloned().collect();
    match (input.staging, plan.desired.clone()) {
        (Some(staging), Some(desired)) => {
            let step = waves::step(staging, input, &behind, true, &desired, false);
            plan.roll(step.roll.clone(), input.live);
            plan.stage(step, now);
        }
        _ => plan.roll(behind, input.live),
    }
    plan
}

/// The targets behind their content, decided from what each carries. The binding's own stamp
/// says what its pods run; a value someone else set (a rollout undo, a hand edit) or none at all
/// says nothing, so such a workload is rolled at the next change of what it reads, never for the
/// drift alone. Those whose template's references changed alone run their content already: they
/// go to `plan.rebased`. Also whether a staged rollout under way goes on as it was
/// ([`content::Rebase::continues`]).
fn behind(
    input: &Input<'_>,
    plan: &mut Plan,
    applied: &str,
    contents: &[KeyContent<'_>],
    objects: &[ObjectContent<'_>],
) -> (Vec<Workload>, bool) {
    let on_bind = input.spec.rollout.as_ref().is_some_and(|r| r.on_bind);
    let carried = Carried::new(input.previous, input.versions);
    let content_changed = plan.desired.as_deref() != Some(applied);
    let rebase = content::Rebase::new(input.key, input.previous, contents, &plan.keys, objects, &plan.objects);
    let mut behind = Vec::new();
    for w in input.found {
        let want = plan.content[w].as_str();
        let row = carried.checksum(w);
        // What it runs, as far as the binding can tell.
        let runs = match input.live.get(w) {
            // A stamp of the current content is never behind, whatever it was rebased to since.
            Some(live) if live.owned && live.checksum() == want => continue,
            Some(live) if live.owned => Some(carried.stands_for(w, live)),
            // New workloads start with the current content, so they are only rolled when asked to;
            // one found before without a stamp runs what the status recorded when it was found.
            None if row.is_none() && !on_bind => continue,
            _ if row.is_none() && !content_changed => continue,
            _ => row,
        };
        match runs {
            Some(runs) if runs == want => {}
            Some(runs) if Some(runs) == row && rebase.allows(w, input.uses.get(w), runs) => {
                plan.rebased.push(w.clone())
            }
            _ => behind.push(w.clone()),
        }
    }
    (behind, rebase.continues())
}

/// Rolls `behind` once the change has settled: after its quiet period (or the restore grace),
/// through the waves and the budget; or reports what a dry run would roll.
fn roll_when_settled(
    input: &Input<'_>,
    mut plan: Plan,
    behind: Vec<Workload>,
    continues: bool,
    applied: &str,
    pending: &mut Option<Pending>,
    now: Instant,
) -> Plan {
    let desired = plan.desired.clone().unwrap_or_default();
    let content_changed = applied != desired;
    let staging = input.staging.filter(|_| !input.dry_run);
    // A staged rollout under way goes on without a second quiet period.
    let in_progress = staging.is_some()
        && input
            .previous
            .rollout
            .as_ref()
            .is_some_and(|r| (r.checksum == desired || continues) && r.phase != RolloutPhase::Complete);
    if behind.is_empty() {
        *pending = None;
        if let Some(staging) = staging {
            plan.stage(waves::step(staging, input, &[], true, &desired, continues), now);
        }
        return plan;
    }
    if !input.dry_run {
        plan.held.clone_from(&behind);
    }
    if input.spec.suspend {
        plan.hold = Some((reason::SUSPENDED, "rollouts are suspended; the change is rolled out on resume".into()));
        if let Some(staging) = staging {
            plan.stage(waves::step(staging, input, &behind, false, &desired, continues), now);
        }
        return plan;
    }
    // The previous status records stamps the one the API server holds does not (one owed since
    // its write failed, or rolls found on the workloads): it is written first, and the change
    // rolls at the next reconcile, its quiet period not started over.
    if input.withhold && !input.dry_run {
        let message = "recording rollouts that no status shows yet; rolling out next".into();
        plan.hold = Some((reason::PENDING, message));
        if let Some(staging) = staging {
            plan.stage(waves::step(staging, input, &behind, false, &desired, continues), now);
        }
        return plan;
    }
    // A dry run already reported this very rollout: no second debounce, and no second event.
    let dry_run = input.dry_run && !behind.is_empty();
    if let Some(reported) = input.previous.dry_run.as_ref().filter(|_| dry_run) {
        let names: Vec<String> = behind.iter().map(|(k, n)| format!("{k}/{n}")).collect();
        if reported.checksum == desired && reported.would_roll == names {
            *pending = None;
            let why = reported.reason.clone().unwrap_or_default();
            return plan.would_roll(behind, why);
        }
    }
    // A restore written back key by key passes through states nobody wants rolled out.
    let restoring = input.restore.filter(|_| content_changed);
    let window = match restoring {
        Some(grace) => Window { quiet: input.window.quiet.max(grace), max: input.window.max.max(grace) },
        None => input.window,
    };
    // Every target's, so that a change of what one reads restarts the quiet period while another
    // waits; a target found or gone changes none of the others'.
    let wants = input.found.iter().map(|w| (format!("{}/{}", w.0, w.1), plan.content[w].as_str()));
    let decision = match in_progress {
        true => Decision::RollNow,
        false => Pending::observe(pending, wants, now, window),
    };
    match decision {
        // With nothing to roll, a dry run records the content like any other mode.
        Decision::RollNow if dry_run => {
            *pending = None;
            let why = match content_changed {
                true => {
                    format!("the content changed from {} to {}", checksum::short(applied), checksum::short(&desired))
                }
                false => "they carry an older stamp of this binding than the current content".into(),
            };
            return plan.would_roll(behind, why);
        }
        Decision::RollNow => {
            *pending = None;
            match staging {
                None => {
                    plan.held.clear();
                    plan.roll(behind, input.live);
                }
                Some(staging) => {
                    let step = waves::step(staging, input, &behind, true, &desired, continues);
                    plan.held.retain(|w| !step.roll.contains(w));
                    plan.roll(step.roll.clone(), input.live);
                    plan.stage(step, now);
                }
            }
        }
        Decision::WaitUntil(at) => {
            let secs = at.saturating_duration_since(now).as_secs_f64();
            let message = match restoring {
                None => format!("content changed; rolling out in {secs:.1}s unless it changes again"),
                Some(grace) => format!(
                    "Consul's index went backwards (a restore?) and the content differs from what the targets \
                     carry; rolling out once it has been stable for {}s (--consul-restore-grace), in {secs:.1}s \
                     unless it changes again",
                    grace.as_secs()
                ),
            };
            plan.hold = Some((reason::PENDING, message));
            plan.wake_at = Some(at);
            if let Some(staging) = staging {
                plan.stage(waves::step(staging, input, &behind, false, &desired, continues), now);
            }
        }
    }
    plan
}

/// A plan that keeps what was last read, because some source cannot be read now. A spec
/// change meanwhile is the go-ahead for what was lost, as it would be were Consul read.
fn unread(input: &Input<'_>, reason: &'static str, message: &str) -> Plan {
    Plan {
        keys: loss::unread_keys(input),
        objects: input.previous.objects.clone(),
        hold: Some((reason, message.to_owned())),
        ..Plan::default()
    }
}

fn object_status(key: &checksum::Key, object: &ObjectContent<'_>, source: &Source<'_>) -> ObjectStatus {
    let entries = match source {
        Source::Object { entries, .. } => entries.as_ref().map(|e| u32::try_from(e.len()).unwrap_or(u32::MAX)),
        _ => None,
    };
    ObjectStatus {
        kind: object.kind,
        name: object.source.name.clone(),
        present: object.data.is_some(),
        entries,
        checksum: checksum::from_digests(key, std::slice::from_ref(source)),
        referenced: object.referenced,
        keys: object.source.keys.clone().filter(|_| object.referenced),
    }
}

fn key_status(key: &checksum::Key, content: &KeyContent<'_>) -> KeyStatus {
    let entries = match content.entries.iter().position(|e| *e.key == *content.source.key) {
        _ if content.source.recurse => content.entries,
        Some(i) => &content.entries[i..=i],
        None => &[],
    };
    KeyStatus {
        key: content.source.key.clone(),
        recurse: content.source.recurse,
        present: !entries.is_empty(),
        entries: content.source.recurse.then(|| u32::try_from(entries.len()).unwrap_or(u32::MAX)),
        checksum: checksum::from_digests(key, &[source(content)]),
        modify_index: entries.iter().map(|e| e.modify_index).max(),
        lost: false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::collections::BTreeMap;

    use consul_kv::KvEntry;
    use consulbind_api::{
        ConsulBindingSpec, ConsulBindingStatus, KeySource, ObjectKind, ObjectSource, RolloutPolicy, TargetRef,
        WorkloadKind, conditions,
    };
    use k8s_openapi::{
        apimachinery::pkg::apis::meta::v1::{Condition, Time},
        jiff::Timestamp,
    };

    use super::*;
    use crate::cluster::{
        Live, Version,
        health::Health,
        objects::Digested,
        references::{References, Use},
    };
    use crate::reconcile::{
        restore,
        status::status,
        upgrade::{self, older_values},
    };

    const WINDOW: Window = Window { quiet: Duration::ZERO, max: Duration::from_secs(30) };
    /// A quiet period that a plan waits out.
    const QUIET: Window = Window { quiet: Duration::from_secs(30), max: Duration::from_secs(60) };

    fn spec(optional: bool) -> ConsulBindingSpec {
        ConsulBindingSpec {
            keys: vec![KeySource { key: "app/config".into(), recurse: false, optional }],
            targets: vec![TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), selector: None }],
            ..Default::default()
        }
    }

    /// What the watches hold for `app/config`: the value's digest.
    fn entry(value: &str) -> Vec<KvEntry> {
        raw(value).into_iter().map(|e| e.digested(|v| checksum::digest(&KEY, v))).collect()
    }

    fn raw(value: &str) -> Vec<KvEntry> {
        vec![KvEntry::new("app/config", value, 7)]
    }

    fn web() -> Vec<Workload> {
        vec![(WorkloadKind::Deployment, "web".into())]
    }

    fn now() -> Time {
        Time("2026-01-02T03:04:05Z".parse().unwrap())
    }

    /// `spec` with another quiet period: a change of the spec.
    fn edited(spec: &ConsulBindingSpec) -> ConsulBindingSpec {
        let rollout = RolloutPolicy { quiet_period: Some("0s".into()), ..Default::default() };
        ConsulBindingSpec { rollout: Some(Box::new(rollout)), ..spec.clone() }
    }

    /// Plans `input` and builds the status as if every stamp succeeded.
    fn plan_and_status(input: &Input<'_>) -> (Plan, ConsulBindingStatus) {
        let plan = plan(input, &mut None, Instant::now());
        let outcome = Outcome { rolled: plan.roll.clone(), failed: vec![] };
        let status = status(input, &plan, &outcome, &now());
        (plan, status)
    }

    /// Runs one plan and builds the status as if every stamp succeeded.
    fn step(
        spec: &ConsulBindingSpec,
        previous: &ConsulBindingStatus,
        entries: &[KvEntry],
        found: &[Workload],
    ) -> (Plan, ConsulBindingStatus) {
        step_at(spec, 3, previous, entries, false, found)
    }

    fn step_at(
        spec: &ConsulBindingSpec,
        generation: i64,
        previous: &ConsulBindingStatus,
        entries: &[KvEntry],
        reset_hold: bool,
        found: &[Workload],
    ) -> (Plan, ConsulBindingStatus) {
        let input = Input {
            generation: Some(generation),
            consul: Consul::Ready(vec![KeyContent { source: &spec.keys[0], entries, reset_hold, index: None }]),
            ..input(spec, previous, entries, found)
        };
        plan_and_status(&input)
    }

    /// One plan with the workloads carrying `live`.
    fn step_live(previous: &ConsulBindingStatus, entries: &[KvEntry], live: &[(&str, bool)]) -> Plan {
        let spec = spec(false);
        let found = web();
        let live: BTreeMap<Workload, Live> = live
            .iter()
            .map(|(value, owned)| (found[0].clone(), Live { value: value.to_string(), owned: *owned, at: None }))
            .collect();
        let input = Input { live: &live, ..input(&spec, previous, entries, &found) };
        plan(&input, &mut None, Instant::now())
    }

    const KEY: checksum::Key = checksum::Key::new([42; checksum::KEY_LEN]);
    static NO_LIVE: BTreeMap<Workload, Live> = BTreeMap::new();
    static NO_USES: BTreeMap<Workload, References> = BTreeMap::new();
    static NO_VERSIONS: BTreeMap<Workload, Version> = BTreeMap::new();
    static NO_HEALTH: BTreeMap<Workload, Health> = BTreeMap::new();
    static NO_LABELS: BTreeMap<Workload, BTreeMap<String, String>> = BTreeMap::new();

    /// What a binding that reads `spec.keys[0]` sees: `entries` from Consul, and `found`
    /// workloads that carry nothing. Tests change the rest with `..input(...)`.
    fn input<'a>(
        spec: &'a ConsulBindingSpec,
        previous: &'a ConsulBindingStatus,
        entries: &'a [KvEntry],
        found: &'a [Workload],
    ) -> Input<'a> {
        Input {
            key: &KEY,
            spec,
            window: WINDOW,
            generation: Some(3),
            previous,
            consul: Consul::Ready(vec![KeyContent { source: &spec.keys[0], entries, reset_hold: false, index: None }]),
            objects: Ok(Vec::new()),
            found,
            live: &NO_LIVE,
            uses: &NO_USES,
            versions: &NO_VERSIONS,
            missing: &[],
            unserved: &[],
            dry_run: false,
            in_turns: None,
            restore: None,
            restored: false,
            staging: None,
            health: &NO_HEALTH,
            labels: &NO_LABELS,
            clock: Timestamp::UNIX_EPOCH,
            withhold: false,
        }
    }

    /// A row names its workload's uid, so that a workload made again under the same name is not
    /// judged by the row of the one deleted; a cache without a uid leaves the row without one.
    #[test]
    fn a_row_carries_its_workloads_uid() {
        let spec = spec(false);
        let found = web();
        let entries = entry("v1");
        let previous = ConsulBindingStatus::default();
        let uids = |uid: &str| -> BTreeMap<Workload, Version> {
            [(found[0].clone(), Version { uid: uid.into(), generation: 1 })].into()
        };
        let versions = uids("u-1");
        let (_, status) = plan_and_status(&Input { versions: &versions, ..input(&spec, &previous, &entries, &found) });
        assert_eq!(status.targets[0].uid.as_deref(), Some("u-1"));
        let versions = uids("");
        let (_, status) = plan_and_status(&Input { versions: &versions, ..input(&spec, &previous, &entries, &found) });
        assert_eq!(status.targets[0].uid, None);
    }

    /// Any spec the API server accepts and any order of events, with windows past what
    /// validation allows: the plan and the debounce never panic, roll only found workloads,
    /// and roll nothing in a dry run.
    #[test]
    fn no_spec_or_order_of_events_makes_a_plan_panic() {
        let mut rng = fastrand::Rng::with_seed(17);
        let durations = [Duration::ZERO, Duration::from_millis(1), Duration::from_secs(3600), Duration::MAX];
        let values = ["", "v1", "v2", "a much longer value"];
        let lives = ["", "~", "x~", "~4294967295", "abc~18446744073709551616", "0123456789abcdef~3"];
        let start = Instant::now();
        for _ in 0..2_000 {
            let spec = ConsulBindingSpec {
                keys: vec![KeySource { key: "app/config".into(), recurse: rng.bool(), optional: rng.bool() }],
                targets: vec![TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), selector: None }],
                suspend: rng.u8(..8) == 0,
                rollout: Some(Box::new(RolloutPolicy {
                    on_bind: rng.bool(),
                    mode: rng.bool().then_some(consulbind_api::RolloutMode::DryRun),
                    ..Default::default()
                })),
                ..Default::default()
            };
            let window = Window { quiet: durations[rng.usize(..4)], max: durations[rng.usize(..4)] };
            let mut previous = ConsulBindingStatus::default();
            let mut pending = None;
            let mut at = start;
            for _ in 0..rng.usize(1..12) {
                at = at.checked_add(durations[rng.usize(..3)].mul_f64(rng.f64())).unwrap_or(at);
                let entries = match rng.usize(..5) {
                    0 => vec![],
                    _ => entry(values[rng.usize(..values.len())]),
                };
                let found = if rng.u8(..5) == 0 { vec![] } else { web() };
                let live: BTreeMap<Workload, Live> = match (found.first(), rng.usize(..4)) {
                    (Some(w), 0) => [(
                        w.clone(),
                        Live { value: lives[rng.usize(..lives.len())].into(), owned: rng.bool(), at: None },
                    )]
                    .into(),
                    (Some(w), 1) => {
                        let value = previous.applied_checksum.clone().unwrap_or_default();
                        [(w.clone(), Live { value, owned: rng.bool(), at: None })].into()
                    }
                    _ => BTreeMap::new(),
                };
                let reset_hold = rng.u8(..6) == 0;
                let failed = rng.u8(..8) == 0;
                let consul = match failed {
                    true => Consul::Failed { reason: reason::CONSUL_UNREACHABLE, message: "down".into() },
                    false => Consul::Ready(vec![KeyContent {
                        source: &spec.keys[0],
                        entries: &entries,
                        reset_hold,
                        index: None,
                    }]),
                };
                // As the reconcile sets it: the flag, or the binding's own mode.
                let dry_run = rng.u8(..8) == 0 || spec.rollout.as_ref().is_some_and(|r| r.mode.is_some());
                let input = Input {
                    window,
                    consul,
                    live: &live,
                    dry_run,
                    generation: Some(rng.i64(0..4)),
                    ..input(&spec, &previous, &entries, &found)
                };
                let plan = plan(&input, &mut pending, at);
                assert!(plan.roll.iter().all(|w| found.contains(w)), "rolled a workload that was not found");
                assert!(!dry_run || plan.roll.is_empty(), "a dry run rolled");
                let outcome = Outcome { rolled: plan.roll.clone(), failed: vec![] };
                previous = status(&input, &plan, &outcome, &now());
            }
        }
    }

    fn checksum_of(value: &str) -> String {
        checksum::checksum(&KEY, &[Source::Key { key: "app/config", value: Some(value.as_bytes()) }])
    }

    #[tokio::test(start_paused = true)]
    async fn what_the_workload_carries_decides() {
        let (_, at_v1) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let (v1, v2) = (checksum_of("v1"), checksum_of("v2"));

        // A crash right after stamping v2, and the content back at v1 meanwhile: the pods run v2.
        let plan = step_live(&at_v1, &entry("v1"), &[(&v2, true)]);
        assert_eq!(plan.roll, web(), "the targets must end on the current content");
        assert_eq!(plan.values[&web()[0]], v1);

        // Our own stamp of the current content: nothing to do.
        assert!(step_live(&at_v1, &entry("v1"), &[(&v1, true)]).roll.is_empty());

        // A rollout undo or a hand edit put another value there: no rollout for that alone...
        assert!(step_live(&at_v1, &entry("v1"), &[(&v2, false)]).roll.is_empty());
        assert!(step_live(&at_v1, &entry("v1"), &[]).roll.is_empty(), "a removed annotation");
        // ...but the next change rolls it, with a value that changes the template even when
        // the undo already put the new checksum there.
        let plan = step_live(&at_v1, &entry("v2"), &[(&v2, false)]);
        assert_eq!(plan.roll, web());
        assert_eq!(plan.values[&web()[0]], format!("{v2}~1"));
        let plan = step_live(&at_v1, &entry("v2"), &[(&format!("{v2}~1"), false)]);
        assert_eq!(plan.values[&web()[0]], format!("{v2}~2"));
        // A forced value counts as its checksum once it is ours.
        let (_, at_v2) = step(&spec(false), &at_v1, &entry("v2"), &web());
        assert!(step_live(&at_v2, &entry("v2"), &[(&format!("{v2}~1"), true)]).roll.is_empty());
    }

    /// What the status says a target runs while nothing rolls it (a suspended binding): what
    /// its own stamp of this binding stands for, whether it was found later with an older one, or
    /// a rollout undo put an older one back; and no staged state once the binding stages nothing.
    #[tokio::test(start_paused = true)]
    async fn a_row_says_what_the_targets_own_stamp_stands_for_while_nothing_rolls_it() {
        let suspended = ConsulBindingSpec { suspend: true, ..spec(false) };
        let (v0, v1) = (checksum_of("v0"), checksum_of("v1"));
        let live = BTreeMap::from([(web()[0].clone(), Live { value: v0.clone(), owned: true, at: None })]);
        let found = web();
        let row = |status: &ConsulBindingStatus| (status.targets[0].checksum.clone(), status.targets[0].stamp.clone());

        // Found after the baseline, with an older stamp of this binding's.
        let (_, at_v1) = step(&spec(false), &Default::default(), &entry("v1"), &[]);
        let (plan, status) = plan_and_status(&Input { live: &live, ..input(&suspended, &at_v1, &entry("v1"), &found) });
        assert!(plan.roll.is_empty() && !plan.baseline);
        assert_eq!(row(&status), (v0.clone(), None), "found later");

        // Found with no stamp, so running v1; then an undo put an older stamp back.
        let (_, running) = step(&spec(false), &at_v1, &entry("v1"), &found);
        assert_eq!(row(&running), (v1, None));
        let mut staged = running.clone();
        staged.targets[0].state = Some(consulbind_api::TargetState::Healthy);
        staged.targets[0].rolled_times = vec![now()];
        let (_, status) = plan_and_status(&Input { live: &live, ..input(&suspended, &staged, &entry("v1"), &found) });
        assert_eq!(row(&status), (v0, None), "after an undo");
        let target = &status.targets[0];
        assert_eq!((target.state, target.rolled_times.len()), (None, 0), "a binding that stages nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn checksums_of_older_releases_roll_nothing_and_leave_the_status() {
        fn sources(value: &str) -> [Source<'_>; 1] {
            [Source::Key { key: "app/config", value: Some(value.as_bytes()) }]
        }
        let older: [fn(&'static str) -> String; 2] =
            [|v| checksum::v1(&KEY, &sources(v)), |v| checksum::legacy(&sources(v))];
        for older_of in older {
            let (_, mut old) = step(&spec(false), &Default::default(), &entry("v1"), &web());
            let older = older_of("v1");
            old.applied_checksum = Some(older.clone());
            old.targets[0].checksum = older.clone();
            let spec = spec(false);
            let found = web();
            let upgrade = |previous: &ConsulBindingStatus, value: &str, live: &str| {
                let entries = entry(value);
                let live: BTreeMap<Workload, Live> =
                    [(found[0].clone(), Live { value: live.into(), owned: true, at: None })].into();
                let input = Input { live: &live, ..input(&spec, previous, &entries, &found) };
                // As decide has it: an older stamp the status does not record is disowned first.
                let disowned = upgrade::disowned(&input);
                let input = match &disowned {
                    Some(live) => Input { live, ..input },
                    None => input,
                };
                let upgraded = match older_values(&input) {
                    true => {
                        assert!(upgrade::upgrade(&input, &[raw("changed meanwhile")]).is_err());
                        upgrade::upgrade(&input, &[raw(value)]).expect("the same content")
                    }
                    false => None,
                };
                let input = match &upgraded {
                    Some(u) => Input { previous: &u.previous, live: &u.live, ..input },
                    None => input,
                };
                let plan = plan(&input, &mut None, Instant::now());
                let outcome = Outcome { rolled: plan.roll.clone(), failed: vec![] };
                (plan.roll.clone(), status(&input, &plan, &outcome, &now()))
            };

            // Same content: nothing rolls, and the status shows only current checksums.
            let (roll, status) = upgrade(&old, "v1", &older);
            assert!(roll.is_empty());
            let text = serde_json::to_string(&status).unwrap();
            assert!(!text.contains(&older), "{text}");
            assert_eq!(status.applied_checksum, Some(checksum_of("v1")));
            assert_eq!(status.targets[0].checksum, checksum_of("v1"));
            // The workload keeps its old value until the content changes; that stays quiet too.
            assert!(upgrade(&status, "v1", &older).0.is_empty());
            assert!(upgrade(&old, "v1", &format!("{older}~2")).0.is_empty());

            // Content that changed while the old release was gone rolls, once.
            let (roll, status) = upgrade(&old, "v2", &older);
            assert_eq!(roll, web());
            assert_eq!(status.applied_checksum, Some(checksum_of("v2")));
        }
    }

    /// An older stamp the status does not record (set by hand under the binding's manager, or
    /// left on a workload upgraded across two formats) stands for what the target's row says it
    /// runs, whatever values it digests, at every look, Consul read or not: a right guess of the
    /// values and a wrong one are answered alike, no status ever records it, and a change since
    /// the row rolls.
    #[tokio::test(start_paused = true)]
    async fn an_older_stamp_no_status_records_stands_for_the_targets_row_whatever_it_digests() {
        let legacy =
            |value: &str| checksum::legacy(&[Source::Key { key: "app/config", value: Some(value.as_bytes()) }]);
        let (_, at_v1) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let spec = spec(false);
        let found = web();
        // One look, Consul `down` or read: what it rolls and the status it writes.
        let look = |previous: &ConsulBindingStatus, value: &str, stamp: &str, down: bool| {
            let entries = entry(value);
            let live: BTreeMap<Workload, Live> =
                [(found[0].clone(), Live { value: stamp.into(), owned: true, at: None })].into();
            let mut input = Input { live: &live, ..input(&spec, previous, &entries, &found) };
            if down {
                input.consul = Consul::Failed { reason: reason::CONSUL_UNREACHABLE, message: "down".into() };
            }
            let disowned = upgrade::disowned(&input).expect("not recorded");
            let input = Input { live: &disowned, ..input };
            assert!(!older_values(&input), "no values needed");
            plan_and_status(&input)
        };
        for (value, right, wrong, rolls) in [("v1", "v1", "a wrong guess", vec![]), ("v2", "v2", "v1", web())] {
            for guess in [right, wrong] {
                let (_, status) = look(&at_v1, value, &legacy(guess), true);
                let text = serde_json::to_string(&status).unwrap();
                assert!(!text.contains(&legacy(guess)), "{text}");
                let (plan, _) = look(&status, value, &legacy(guess), false);
                assert_eq!(plan.roll, rolls, "content {value}, a guess of {guess}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn current_checksums_need_no_second_read() {
        let (_, status) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let spec = spec(false);
        let (found, entries) = (web(), entry("v2"));
        let live: BTreeMap<Workload, Live> =
            [(found[0].clone(), Live { value: checksum_of("v1"), owned: true, at: None })].into();
        assert!(!older_values(&Input { live: &live, ..input(&spec, &status, &entries, &found) }));
        // A value someone else set is drift, whatever its format.
        let live: BTreeMap<Workload, Live> =
            [(found[0].clone(), Live { value: "abc".into(), owned: false, at: None })].into();
        assert!(!older_values(&Input { live: &live, ..input(&spec, &status, &entries, &found) }));
    }

    fn condition<'a>(status: &'a ConsulBindingStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn first_sight_is_a_baseline_without_rollout() {
        let (plan, status) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        assert!(plan.baseline && plan.roll.is_empty());
        assert_eq!(status.applied_checksum, plan.desired);
        assert_eq!(status.targets[0].checksum, plan.desired.clone().unwrap());
        assert_eq!(status.targets[0].last_rolled_time, None);
        assert_eq!(condition(&status, conditions::READY).reason, reason::BASELINED);
        assert_eq!(status.key_summary.as_deref(), Some("1/1"));
        assert_eq!(status.keys[0].modify_index, Some(7));
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.last_change_time, None);
    }

    /// A binding deleted and made again, the content changed in between: the workload still
    /// carries the old binding's stamp. The baseline takes it for today's content.
    #[tokio::test(start_paused = true)]
    async fn a_baseline_over_an_old_stamp_of_its_own_rolls_nothing_later() {
        let spec = spec(false);
        let found = web();
        let old = BTreeMap::from([(found[0].clone(), Live { value: checksum_of("v1"), owned: true, at: None })]);
        let fresh = ConsulBindingStatus::default();
        let entries = entry("v2");
        let baseline = Input { live: &old, ..input(&spec, &fresh, &entries, &found) };
        let (plan, status) = plan_and_status(&baseline);
        assert!(plan.baseline && plan.roll.is_empty());
        assert_eq!(status.targets[0].checksum, checksum_of("v2"));
        assert_eq!(status.targets[0].stamp.as_deref(), Some(checksum_of("v1").as_str()));

        let later = Input { live: &old, ..input(&spec, &status, &entries, &found) };
        let (plan, again) = plan_and_status(&later);
        assert!(plan.roll.is_empty(), "rolled at the next wake for a stamp the baseline took in");
        assert_eq!(again.targets, status.targets);
        // The next change rolls it as usual.
        let entries = entry("v3");
        let change = Input { live: &old, ..input(&spec, &status, &entries, &found) };
        assert_eq!(plan_and_status(&change).0.roll, found);
    }

    #[tokio::test(start_paused = true)]
    async fn suspend_wins_over_on_bind_until_resumed() {
        let mut spec = spec(false);
        spec.rollout = Some(Box::new(RolloutPolicy { on_bind: true, ..Default::default() }));
        spec.suspend = true;
        let (plan, suspended) = step(&spec, &Default::default(), &entry("v1"), &web());
        assert!(plan.roll.is_empty(), "a suspended binding rolled on bind");
        assert_eq!(condition(&suspended, conditions::READY).reason, reason::SUSPENDED);
        assert_eq!(suspended.applied_checksum, None);
        spec.suspend = false;
        let (plan, _) = step(&spec, &suspended, &entry("v1"), &web());
        assert_eq!(plan.roll, web(), "the resume rolls once, as onBind asks");
    }

    #[test]
    fn a_restore_while_nobody_watched_shows_only_where_no_write_or_reaping_could_lower_the_index() {
        let exact = KeySource { key: "app/config".into(), recurse: false, optional: true };
        let prefix = KeySource { key: "app/".into(), recurse: true, optional: true };
        let status = |source: &KeySource, modify_index| ConsulBindingStatus {
            keys: vec![KeyStatus {
                key: source.key.clone(),
                recurse: source.recurse,
                present: true,
                modify_index: Some(modify_index),
                ..Default::default()
            }],
            ..Default::default()
        };
        let restored = |source: &KeySource, recorded, entries: &[KvEntry], index| {
            restore::restored_since(
                &status(source, recorded),
                &[KeyContent { source, entries, reset_hold: false, index }],
            )
        };
        let at = |modify_index| vec![KvEntry::new("app/config", "v", modify_index)];
        assert!(restored(&exact, 50, &at(7), None), "a key's own ModifyIndex went down");
        assert!(!restored(&exact, 50, &at(60), None), "a later write");
        assert!(restored(&exact, 50, &[], Some(12)), "missing, and the store's index below the key's");
        assert!(!restored(&exact, 50, &[], Some(70)), "deleted: the store's index moved past it");
        assert!(!restored(&exact, 50, &[], None), "missing from a shared read says nothing");
        assert!(restored(&prefix, 50, &[], Some(12)), "an empty prefix answers with the store's index");
        assert!(!restored(&prefix, 50, &at(7), Some(12)), "a reaped tombstone lowers a prefix's index");

        // Issue 30: a missing key answers the store's index, which no key of the binding can have
        // been above before, though it is above the key's own (a rebuilt store written past it).
        let mut both = status(&exact, 20);
        let bulk = KeyStatus {
            key: "bulk/".into(),
            recurse: true,
            present: true,
            modify_index: Some(120),
            ..Default::default()
        };
        both.keys.push(bulk);
        let missing = |index| [KeyContent { source: &exact, entries: &[], reset_hold: false, index: Some(index) }];
        assert!(
            restore::restored_since(&both, &missing(70)),
            "missing below another key's index was taken for a deletion"
        );
        assert!(!restore::restored_since(&both, &missing(130)), "deleted after everything recorded");
        let present = [KeyContent { source: &exact, entries: &at(70), reset_hold: false, index: Some(70) }];
        assert!(!restore::restored_since(&both, &present), "a key that is there answers its own index");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_lost_while_nobody_watched_is_held_and_one_deleted_meanwhile_rolls() {
        let (optional, found) = (spec(true), web());
        let (_, baseline) = step(&optional, &Default::default(), &entry("v1"), &found);
        assert_eq!(baseline.keys[0].modify_index, Some(7));
        // The first read after a restart finds the key missing, with the store at `index`.
        let first_read = |index| {
            let missing =
                [KeyContent { source: &optional.keys[0], entries: &[], reset_hold: false, index: Some(index) }];
            let restored = restore::restored_since(&baseline, &missing);
            let input =
                Input { consul: Consul::Ready(missing.to_vec()), restored, ..input(&optional, &baseline, &[], &found) };
            (restored, plan_and_status(&input))
        };
        // The store's index below the key's: lost.
        let (restored, (plan, held)) = first_read(3);
        assert!(restored);
        assert!(plan.roll.is_empty(), "lost data was rolled out");
        assert_eq!(condition(&held, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        // Deleted while nobody watched: the store's index moved on, and the empty value rolls.
        let (restored, (plan, _)) = first_read(9);
        assert!(!restored);
        assert_eq!(plan.roll, web());
    }

    #[tokio::test(start_paused = true)]
    async fn a_restore_found_at_the_first_read_stays_held_while_a_lost_optional_key_is_empty() {
        let mut both = spec(false);
        both.keys.push(KeySource { key: "app/extra".into(), recurse: false, optional: true });
        let found = web();
        let read = |config: &'static [KvEntry], extra: &'static [KvEntry], index| {
            vec![
                KeyContent { source: &both.keys[0], entries: config, reset_hold: false, index },
                KeyContent { source: &both.keys[1], entries: extra, reset_hold: false, index },
            ]
        };
        static CONFIG: std::sync::LazyLock<Vec<KvEntry>> =
            std::sync::LazyLock::new(|| vec![KvEntry::new("app/config", "v1", 7)]);
        static EXTRA: std::sync::LazyLock<Vec<KvEntry>> =
            std::sync::LazyLock::new(|| vec![KvEntry::new("app/extra", "on", 8)]);
        fn at<'a>(
            spec: &'a ConsulBindingSpec,
            found: &'a [Workload],
            consul: Vec<KeyContent<'a>>,
            previous: &'a ConsulBindingStatus,
            restored: bool,
        ) -> Input<'a> {
            Input { consul: Consul::Ready(consul), restored, ..input(spec, previous, &[], found) }
        }
        let empty = ConsulBindingStatus::default();
        let (_, baseline) = plan_and_status(&at(&both, &found, read(&CONFIG, &EXTRA, None), &empty, false));
        // Both gone at the first read after a restart, the store's index below theirs: the
        // required key is lost too, and the status says so rather than KeyMissing.
        let (plan, held) = plan_and_status(&at(&both, &found, read(&[], &[], Some(3)), &baseline, true));
        assert!(plan.roll.is_empty());
        assert_eq!(condition(&held, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        // The required key is put back; the optional one stays lost, and nothing rolls.
        let (plan, still) = plan_and_status(&at(&both, &found, read(&CONFIG, &[], Some(4)), &held, false));
        assert!(plan.roll.is_empty(), "lost content was rolled out");
        assert_eq!(condition(&still, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
    }

    #[tokio::test(start_paused = true)]
    async fn content_lost_in_an_index_reset_is_held_until_it_is_back_or_the_spec_changes() {
        let optional = spec(true);
        let (_, baseline) = step(&optional, &Default::default(), &entry("v1"), &web());
        let (plan, held) = step_at(&optional, 3, &baseline, &[], true, &web());
        assert!(plan.roll.is_empty(), "lost data was rolled out");
        assert_eq!(condition(&held, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        assert_eq!(held.applied_checksum, baseline.applied_checksum);
        // The same content restored: nothing to roll, and Ready again.
        let (plan, restored) = step(&optional, &held, &entry("v1"), &web());
        assert!(plan.roll.is_empty());
        assert_eq!(condition(&restored, conditions::READY).status, "True");
        // A spec change is a person's say-so: the empty content rolls once.
        let (plan, _) = step_at(&edited(&optional), 4, &held, &[], true, &web());
        assert_eq!(plan.roll, web());
        // A restart while held: the first read is no reset, and the content is still lost.
        let (plan, after_restart) = step_at(&optional, 3, &held, &[], false, &web());
        assert!(plan.roll.is_empty(), "lost data was rolled out after a restart");
        assert_eq!(condition(&after_restart, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        let (plan, restored) = step(&optional, &after_restart, &entry("v1"), &web());
        assert!(plan.roll.is_empty());
        assert_eq!(condition(&restored, conditions::READY).status, "True");
        // A required key lost in a reset is lost too, not merely missing; one deleted is missing.
        let (_, required) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let (_, lost) = step_at(&spec(false), 3, &required, &[], true, &web());
        assert_eq!(condition(&lost, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        let (_, missing) = step_at(&spec(false), 3, &required, &[], false, &web());
        assert_eq!(condition(&missing, conditions::READY).reason, reason::KEY_MISSING);
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_beside_a_missing_required_key_is_marked_and_outlasts_its_return() {
        let mut both = spec(false);
        both.keys.push(KeySource { key: "app/extra".into(), recurse: false, optional: true });
        let found = web();
        static CONFIG: std::sync::LazyLock<Vec<KvEntry>> = std::sync::LazyLock::new(|| entry("v1"));
        static EXTRA: std::sync::LazyLock<Vec<KvEntry>> =
            std::sync::LazyLock::new(|| vec![KvEntry::new("app/extra", "on", 8)]);
        let read = |config: &'static [KvEntry], extra: &'static [KvEntry], reset_hold| {
            vec![
                KeyContent { source: &both.keys[0], entries: config, reset_hold, index: None },
                KeyContent { source: &both.keys[1], entries: extra, reset_hold, index: None },
            ]
        };
        let at = |consul, previous| Input { consul: Consul::Ready(consul), ..input(&both, previous, &[], &found) };
        let empty = ConsulBindingStatus::default();
        let (_, baseline) = plan_and_status(&at(read(&CONFIG, &EXTRA, false), &empty));
        // One reset empties both, the required key among them.
        let (plan, held) = plan_and_status(&at(read(&[], &[], true), &baseline));
        assert!(plan.roll.is_empty());
        assert_eq!(held.keys.iter().map(|k| k.lost).collect::<Vec<_>>(), [true, true]);
        // The required key is back; after a restart the optional one is still held as lost.
        let (plan, still) = plan_and_status(&at(read(&CONFIG, &[], false), &held));
        assert!(plan.roll.is_empty(), "lost content was rolled out");
        assert_eq!(condition(&still, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        assert_eq!(still.keys.iter().map(|k| k.lost).collect::<Vec<_>>(), [false, true]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_spec_change_while_consul_is_down_is_the_go_ahead_for_what_was_lost() {
        let optional = spec(true);
        let found = web();
        let (_, baseline) = step(&optional, &Default::default(), &entry("v1"), &found);
        let (_, held) = step_at(&optional, 3, &baseline, &[], true, &found);
        let changed = edited(&optional);
        let down = Input {
            generation: Some(4),
            consul: Consul::Failed { reason: reason::CONSUL_UNREACHABLE, message: "down".into() },
            ..input(&changed, &held, &[], &found)
        };
        let (_, failed) = plan_and_status(&down);
        assert!(failed.keys.iter().all(|k| !k.lost));
        let (plan, _) = step_at(&changed, 4, &failed, &[], false, &found);
        assert_eq!(plan.roll, web(), "the spec change was not taken as the go-ahead");
    }

    /// Issue 30, item 1: the watches keep remembering the reset on the path, and a quiet period
    /// makes the go-ahead take more than one reconcile.
    #[tokio::test(start_paused = true)]
    async fn the_go_ahead_rolls_once_though_the_watches_still_remember_the_reset() {
        let optional = spec(true);
        let (_, baseline) = step(&optional, &Default::default(), &entry("v1"), &web());
        let (_, held) = step_at(&optional, 3, &baseline, &[], true, &web());
        assert_eq!(condition(&held, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        let changed = edited(&optional);
        let (plan, after) = step_at(&changed, 4, &held, &[], true, &web());
        assert_eq!(plan.roll, web(), "the go-ahead did not roll");
        let (plan, again) = step_at(&changed, 4, &after, &[], true, &web());
        assert!(plan.roll.is_empty() && plan.hold.is_none(), "{:?}", plan.hold);
        assert_eq!(condition(&again, conditions::READY).reason, reason::UP_TO_DATE);
        // A binding made later on the same path inherits no hold: it baselines.
        let (plan, fresh) = step_at(&changed, 1, &Default::default(), &[], true, &web());
        assert!(plan.baseline && plan.hold.is_none());
        assert_eq!(condition(&fresh, conditions::READY).reason, reason::BASELINED);
    }

    /// The go-ahead is for what the status showed: a loss found in the same reconcile is held.
    #[tokio::test(start_paused = true)]
    async fn the_go_ahead_releases_what_was_shown_and_holds_a_loss_found_with_it() {
        let mut two = spec(true);
        two.keys.push(KeySource { key: "app/extra".into(), recurse: false, optional: true });
        let changed = edited(&two);
        let found = web();
        static CONFIG: std::sync::LazyLock<Vec<KvEntry>> = std::sync::LazyLock::new(|| entry("v1"));
        static EXTRA: std::sync::LazyLock<Vec<KvEntry>> =
            std::sync::LazyLock::new(|| vec![KvEntry::new("app/extra", "on", 8)]);
        let read = |spec: &'static ConsulBindingSpec, config: &'static [KvEntry], extra: &'static [KvEntry]| {
            vec![
                KeyContent { source: &spec.keys[0], entries: config, reset_hold: config.is_empty(), index: None },
                KeyContent { source: &spec.keys[1], entries: extra, reset_hold: extra.is_empty(), index: None },
            ]
        };
        let (two, changed): (&'static ConsulBindingSpec, &'static ConsulBindingSpec) =
            (Box::leak(Box::new(two)), Box::leak(Box::new(changed)));
        let empty = ConsulBindingStatus::default();
        let (_, baseline) = plan_and_status(&Input {
            consul: Consul::Ready(read(two, &CONFIG, &EXTRA)),
            ..input(two, &empty, &[], &found)
        });
        let (_, held) = plan_and_status(&Input {
            consul: Consul::Ready(read(two, &[], &EXTRA)),
            ..input(two, &baseline, &[], &found)
        });
        assert_eq!(held.keys.iter().map(|k| k.lost).collect::<Vec<_>>(), [true, false]);
        let with_change = Input {
            generation: Some(4),
            consul: Consul::Ready(read(changed, &[], &[])),
            ..input(changed, &held, &[], &found)
        };
        let (plan, after) = plan_and_status(&with_change);
        assert!(plan.roll.is_empty(), "a loss nobody was shown was rolled out");
        let (_, message) = plan.hold.expect("held");
        assert!(message.contains("app/extra") && !message.contains("app/config"), "{message}");
        assert_eq!(after.keys.iter().map(|k| k.lost).collect::<Vec<_>>(), [false, true]);
    }

    /// Issue 30, item 4: suspending during a hold and resuming are no go-ahead.
    #[tokio::test(start_paused = true)]
    async fn suspending_and_resuming_during_a_hold_roll_nothing() {
        let optional = spec(true);
        let (_, baseline) = step(&optional, &Default::default(), &entry("v1"), &web());
        let (_, held) = step_at(&optional, 3, &baseline, &[], true, &web());
        let suspended = ConsulBindingSpec { suspend: true, ..optional.clone() };
        let (plan, during) = step_at(&suspended, 4, &held, &[], false, &web());
        assert!(plan.roll.is_empty());
        assert_eq!(condition(&during, conditions::READY).reason, reason::SUSPENDED);
        assert!(during.keys[0].lost, "suspending cleared the mark");
        let (plan, resumed) = step_at(&optional, 5, &during, &[], false, &web());
        assert!(plan.roll.is_empty(), "resuming rolled the lost content");
        assert_eq!(condition(&resumed, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        let (plan, _) = step_at(&edited(&optional), 6, &resumed, &[], false, &web());
        assert_eq!(plan.roll, web(), "a spec change after the resume is the go-ahead");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_for_lost_content_outlasts_a_consul_failure_and_an_unreadable_object() {
        let optional = spec(true);
        let found = web();
        let (_, baseline) = step(&optional, &Default::default(), &entry("v1"), &found);
        let (_, held) = step_at(&optional, 3, &baseline, &[], true, &found);
        assert!(held.keys[0].lost);
        let failures = [
            Input {
                consul: Consul::Failed { reason: reason::CONSUL_UNREACHABLE, message: "down".into() },
                ..input(&optional, &held, &[], &found)
            },
            Input {
                objects: Err((reason::OBJECT_UNREADABLE, "forbidden".into())),
                ..input(&optional, &held, &[], &found)
            },
        ];
        for failure in &failures {
            let (plan, failed) = plan_and_status(failure);
            assert_ne!(condition(&failed, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
            // Read again once the failure is over, the key is still empty: still held.
            let (plan_after, after) = step(&optional, &failed, &[], &found);
            assert!(plan.roll.is_empty() && plan_after.roll.is_empty(), "lost content was rolled out");
            assert_eq!(condition(&after, conditions::READY).reason, reason::CONSUL_INDEX_RESET);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_keys_that_were_lost_hold_a_binding() {
        let mut two = spec(true);
        two.keys.push(KeySource { key: "app/never".into(), recurse: false, optional: true });
        let found = web();
        let read = |config: &'static [KvEntry], reset_hold| {
            vec![
                KeyContent { source: &two.keys[0], entries: config, reset_hold, index: None },
                KeyContent { source: &two.keys[1], entries: &[], reset_hold: false, index: None },
            ]
        };
        static CONFIG: std::sync::LazyLock<Vec<KvEntry>> = std::sync::LazyLock::new(|| entry("v1"));
        let at = |consul, previous| Input { consul: Consul::Ready(consul), ..input(&two, previous, &[], &found) };
        let empty = ConsulBindingStatus::default();
        let (_, baseline) = plan_and_status(&at(read(&CONFIG, false), &empty));
        // A reset empties app/config; app/never was empty all along, so the watches mark no loss.
        let (_, held) = plan_and_status(&at(read(&[], true), &baseline));
        let lost: Vec<bool> = held.keys.iter().map(|k| k.lost).collect();
        assert_eq!(lost, [true, false]);
        let (_, message) = plan_and_status(&at(read(&[], false), &held)).0.hold.unwrap();
        assert!(message.contains("app/config") && !message.contains("app/never"), "{message}");
        // app/config is back: the binding is served, though app/never is still empty.
        let (plan, back) = plan_and_status(&at(read(&CONFIG, false), &held));
        assert!(plan.hold.is_none() && plan.roll.is_empty());
        assert_eq!(condition(&back, conditions::READY).status, "True");
        assert!(back.keys.iter().all(|k| !k.lost));

        // Issue 30: a status of a release before the marks names the lost keys in its message
        // alone. Only those hold: app/config back with other content rolls, app/never holds
        // nothing.
        let mut older = held.clone();
        older.keys.iter_mut().for_each(|k| k.lost = false);
        older.observed_spec = None;
        let mut unreadable = older.clone();
        unreadable.conditions.iter_mut().for_each(|c| c.message = "held".into());
        static CHANGED: std::sync::LazyLock<Vec<KvEntry>> = std::sync::LazyLock::new(|| entry("v2"));
        let (plan, _) = plan_and_status(&at(read(&CHANGED, false), &older));
        assert!(plan.hold.is_none() && plan.roll == web(), "{:?}", plan.hold);
        let (plan, _) = plan_and_status(&at(read(&[], false), &older));
        let (_, message) = plan.hold.expect("the key the message names is still lost");
        assert!(message.contains("app/config") && !message.contains("app/never"), "{message}");
        // One whose message cannot be read holds every empty key, as before.
        let (plan, _) = plan_and_status(&at(read(&CHANGED, false), &unreadable));
        let (_, message) = plan.hold.expect("an unreadable message holds every empty key");
        assert!(message.contains("app/never"), "{message}");
    }

    #[test]
    fn the_keys_an_older_ready_message_names_are_read_back_as_quoted() {
        let message = |names: &[&str]| {
            format!(
                "Consul's index went backwards (a snapshot restore or a rebuilt cluster?) just as {} became empty; \
                 rollouts are held until the content is back. To roll out the empty content, change this binding's \
                 spec",
                quoted(names)
            )
        };
        for names in [&["app/x"][..], &["a", "b/"], &[r#"we"ird, "key"#, "tab\there", "\u{378}\\"]] {
            let named = loss::named_lost(&message(names));
            assert_eq!(named.as_deref(), Some(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>()[..]));
        }
        assert_eq!(loss::named_lost("held"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn after_an_index_reset_a_change_waits_for_the_restore_grace_whatever_the_quiet_period() {
        let grace = Duration::from_secs(30);
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let restoring = |previous: &ConsulBindingStatus, value: &str, pending: &mut Option<Pending>| {
            let (entries, spec, found) = (entry(value), spec(false), web());
            let input = Input { restore: Some(grace), ..input(&spec, previous, &entries, &found) };
            let mut plan = plan(&input, pending, Instant::now());
            plan.values.clear();
            (plan.roll, plan.hold.map(|(r, m)| (r.to_owned(), m)), plan.wake_at)
        };
        let mut pending = None;
        // Half the restore written: other content than the targets carry, held for the grace.
        let start = Instant::now();
        let (roll, hold, wake) = restoring(&baseline, "half", &mut pending);
        assert!(roll.is_empty(), "a half-restored state rolled with a quiet period of 0");
        let (reason, message) = hold.unwrap();
        assert_eq!(reason, reason::PENDING);
        assert!(message.contains("--consul-restore-grace"), "{message}");
        assert_eq!(wake, Some(start + grace));
        // The rest written back: what the targets carry again, so nothing rolls.
        tokio::time::advance(Duration::from_secs(3)).await;
        let (roll, hold, _) = restoring(&baseline, "v1", &mut pending);
        assert!(roll.is_empty() && hold.is_none());
        // Other content that stays put rolls once the grace is over, and only then.
        let changed = Instant::now();
        restoring(&baseline, "older", &mut pending);
        tokio::time::advance(grace - Duration::from_secs(1)).await;
        assert!(restoring(&baseline, "older", &mut pending).0.is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(Instant::now(), changed + grace);
        assert_eq!(restoring(&baseline, "older", &mut pending).0, web());
    }

    #[tokio::test(start_paused = true)]
    async fn on_bind_rolls_at_first_sight() {
        let mut spec = spec(false);
        spec.rollout = Some(Box::new(RolloutPolicy { on_bind: true, ..Default::default() }));
        let (plan, _) = step(&spec, &Default::default(), &entry("v1"), &web());
        assert_eq!(plan.roll, web());
    }

    #[tokio::test(start_paused = true)]
    async fn unchanged_content_rolls_nothing_and_changed_content_rolls_once() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let (plan, same) = step(&spec(false), &baseline, &entry("v1"), &web());
        assert!(plan.roll.is_empty());
        assert_eq!(same.applied_checksum, baseline.applied_checksum);
        assert_eq!(same, baseline, "looking again at unchanged content changes nothing, not even Ready's reason");

        let (plan, changed) = step(&spec(false), &baseline, &entry("v2"), &web());
        assert_eq!(plan.roll, web());
        assert_ne!(changed.applied_checksum, baseline.applied_checksum);
        assert_eq!(changed.last_change_time, Some(now()));
        assert_eq!(changed.targets[0].last_rolled_time, Some(now()));
        let ready = condition(&changed, conditions::READY);
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", reason::UP_TO_DATE));
        // The transition time of a condition whose status did not change is kept.
        assert_eq!(ready.last_transition_time, condition(&baseline, conditions::READY).last_transition_time);

        let (plan, _) = step(&spec(false), &changed, &entry("v2"), &web());
        assert!(plan.roll.is_empty(), "a second reconcile of the same content rolled again");
    }

    #[tokio::test(start_paused = true)]
    async fn missing_required_key_holds_and_missing_optional_key_counts() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let (plan, held) = step(&spec(false), &baseline, &[], &web());
        assert!(plan.roll.is_empty());
        let ready = condition(&held, conditions::READY);
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::KEY_MISSING));
        assert!(ready.message.contains("\"app/config\""));
        assert_eq!(held.applied_checksum, baseline.applied_checksum);
        assert_eq!(held.key_summary.as_deref(), Some("0/1"));

        let (_, baseline) = step(&spec(true), &Default::default(), &entry("v1"), &web());
        let (plan, _) = step(&spec(true), &baseline, &[], &web());
        assert_eq!(plan.roll, web());
    }

    /// One plan of a binding that reads `app/config` and the ConfigMap `app` (its data `data`,
    /// or missing), with `keys` as the ConfigMap's key filter.
    fn step_object(
        previous: &ConsulBindingStatus,
        data: Option<&[(&str, &str)]>,
        keys: Option<Vec<String>>,
        failed: bool,
    ) -> (Plan, ConsulBindingStatus) {
        let source = ObjectSource { name: "app".into(), keys, optional: false };
        let spec = ConsulBindingSpec { config_maps: vec![source], ..spec(false) };
        let digested = data.map(|data| Digested {
            version: "1".into(),
            fingerprint: 0,
            entries: data
                .iter()
                .map(|(k, v)| (k.to_string(), checksum::Field::Data, checksum::digest(&KEY, v.as_bytes())))
                .collect(),
        });
        let object = ObjectContent {
            kind: ObjectKind::ConfigMap,
            source: &spec.config_maps[0],
            referenced: false,
            data: digested.as_ref(),
        };
        let (entries, found) = (entry("v1"), web());
        let objects = match failed {
            true => Err((reason::OBJECT_UNREADABLE, "could not read ConfigMap app: forbidden".to_owned())),
            false => Ok(vec![object]),
        };
        let input = Input { objects, ..input(&spec, previous, &entries, &found) };
        plan_and_status(&input)
    }

    /// A referenced ConfigMap: name, data, and the keys its references read.
    type Referenced<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<&'a [&'a str]>);

    /// One plan of a binding that reads `app/config` (value `value`), with the ConfigMaps its
    /// target references; the target carries `stamp` as its own.
    fn step_references(
        previous: &ConsulBindingStatus,
        value: &str,
        stamp: Option<&str>,
        references: &[Referenced<'_>],
    ) -> (Plan, ConsulBindingStatus) {
        let spec = ConsulBindingSpec { include_target_references: true, ..spec(false) };
        let sources: Vec<ObjectSource> = references
            .iter()
            .map(|(name, _, keys)| ObjectSource {
                name: name.to_string(),
                keys: keys.map(|k| k.iter().map(|k| k.to_string()).collect()),
                optional: false,
            })
            .collect();
        let digested: Vec<Digested> = references
            .iter()
            .map(|(_, data, _)| Digested {
                version: "1".into(),
                fingerprint: 0,
                entries: data
                    .iter()
                    .map(|(k, v)| (k.to_string(), checksum::Field::Data, checksum::digest(&KEY, v.as_bytes())))
                    .collect(),
            })
            .collect();
        let objects = sources
            .iter()
            .zip(&digested)
            .map(|(source, data)| ObjectContent {
                kind: ObjectKind::ConfigMap,
                source,
                referenced: true,
                data: Some(data),
            })
            .collect();
        let (entries, found) = (entry(value), web());
        let live: BTreeMap<Workload, Live> = stamp
            .map(|s| (found[0].clone(), Live { value: s.to_owned(), owned: true, at: None }))
            .into_iter()
            .collect();
        let uses = sources
            .iter()
            .map(|s| {
                let keys = s.keys.as_ref().map(|k| k.iter().cloned().collect());
                ((ObjectKind::ConfigMap, s.name.clone()), Use { keys, optional: false })
            })
            .collect::<References>();
        let uses: BTreeMap<Workload, References> =
            Some((found[0].clone(), uses)).filter(|(_, u)| !u.is_empty()).into_iter().collect();
        let input =
            Input { objects: Ok(objects), live: &live, uses: &uses, ..input(&spec, previous, &entries, &found) };
        plan_and_status(&input)
    }

    /// Issue 30, item 3: the status forgets the rows of workloads no longer found.
    #[tokio::test(start_paused = true)]
    async fn a_rebased_workload_that_leaves_the_targets_and_comes_back_rolls_nothing() {
        let (_, first) = step_references(&Default::default(), "v1", None, &[]);
        let a0 = first.applied_checksum.clone().unwrap();
        let app: &[(&str, &str)] = &[("a", "1")];
        let (_, added) = step_references(&first, "v1", Some(&a0), &[("app", app, None)]);
        let away = ConsulBindingStatus { targets: Vec::new(), former_targets: added.targets.clone(), ..added.clone() };
        let (plan, back) = step_references(&away, "v1", Some(&a0), &[("app", app, None)]);
        assert!(plan.roll.is_empty(), "a workload found again rolled for nothing");
        assert_eq!(back.targets[0].checksum, added.applied_checksum.clone().unwrap());
        // The next change of content rolls it, and the older stamps are forgotten.
        let (plan, rolled) = step_references(&back, "v2", Some(&a0), &[("app", app, None)]);
        assert_eq!(plan.roll, web());
        assert!(rolled.former_targets.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reference_a_template_adds_or_drops_is_recorded_without_a_rollout_and_its_changes_roll() {
        let (_, first) = step_references(&Default::default(), "v1", None, &[]);
        let a0 = first.applied_checksum.clone().unwrap();
        let app: &[(&str, &str)] = &[("a", "1"), ("b", "1")];

        // The template now mounts ConfigMap app: its rollout is the template's own.
        let (plan, added) = step_references(&first, "v1", Some(&a0), &[("app", app, None)]);
        assert!(!plan.rebased.is_empty() && plan.roll.is_empty(), "a new reference rolled");
        let a1 = added.applied_checksum.clone().unwrap();
        assert_ne!(a1, a0);
        assert_eq!((added.targets[0].checksum.as_str(), added.targets[0].stamp.as_deref()), (a1.as_str(), Some(&*a0)));
        assert_eq!(added.target_summary.as_deref(), Some("1/1"));
        assert!(added.objects[0].referenced);

        // Looked at again, or after a restart: the old stamp stands for the new content.
        let (plan, again) = step_references(&added, "v1", Some(&a0), &[("app", app, None)]);
        assert!(plan.roll.is_empty() && plan.rebased.is_empty());
        assert_eq!(again.targets, added.targets);

        // A change of the referenced data rolls, once.
        let changed: &[(&str, &str)] = &[("a", "2"), ("b", "1")];
        let (plan, rolled) = step_references(&added, "v1", Some(&a0), &[("app", changed, None)]);
        assert_eq!(plan.roll, web());
        assert_eq!(rolled.targets[0].stamp, None);
        assert_eq!(rolled.targets[0].checksum, rolled.applied_checksum.clone().unwrap());

        // Reading another key of the same object, or dropping the reference, is the template's too.
        let (plan, narrowed) = step_references(&added, "v1", Some(&a0), &[("app", app, Some(&["a"]))]);
        assert!(!plan.rebased.is_empty() && plan.roll.is_empty());
        assert_eq!(narrowed.objects[0].keys, Some(vec!["a".to_owned()]));
        let (plan, dropped) = step_references(&added, "v1", Some(&a0), &[]);
        assert!(plan.roll.is_empty());
        assert_eq!(dropped.applied_checksum.as_deref(), Some(&*a0));
        assert_eq!((dropped.targets[0].checksum.as_str(), dropped.targets[0].stamp.as_deref()), (&*a0, None));

        // A Consul change that comes with a new reference is a change of content.
        let (plan, _) = step_references(&first, "v2", Some(&a0), &[("app", app, None)]);
        assert_eq!(plan.roll, web());
        // So is one that was held (debounced, suspended) when the reference came.
        let mut held = first.clone();
        held.keys = step_references(&first, "v2", Some(&a0), &[]).1.keys;
        held.conditions
            .iter_mut()
            .filter(|c| c.type_ == conditions::READY)
            .for_each(|c| c.reason = reason::PENDING.into());
        let (plan, _) = step_references(&held, "v2", Some(&a0), &[("app", app, None)]);
        assert!(plan.rebased.is_empty() && plan.roll == web(), "a held change was taken for a reference");
        // And a change of data the reference read before, though it now reads other keys.
        let (plan, _) = step_references(&added, "v1", Some(&a0), &[("app", &[("a", "2"), ("b", "1")], Some(&["a"]))]);
        assert!(plan.rebased.is_empty() && plan.roll == web(), "a re-filtered reference hid a change");
        // So is a reference whose data changed while another one was added.
        let two: &[(&str, &str)] = &[("x", "1")];
        let (plan, _) = step_references(&added, "v1", Some(&a0), &[("app", changed, None), ("two", two, None)]);
        assert_eq!(plan.roll, web());
    }

    /// Two targets, `api` and `web`, of a binding that reads Consul key `v1` and, through
    /// `api`'s template alone, ConfigMap `app` with data `one` or `two`.
    struct ApiReadsApp {
        spec: ConsulBindingSpec,
        source: ObjectSource,
        one: Digested,
        two: Digested,
        api: Workload,
        found: Vec<Workload>,
        uses: BTreeMap<Workload, References>,
        entries: Vec<KvEntry>,
    }

    impl ApiReadsApp {
        fn new() -> Self {
            let digested = |value: &str| Digested {
                version: "1".into(),
                fingerprint: 0,
                entries: vec![("a".into(), checksum::Field::Data, checksum::digest(&KEY, value.as_bytes()))].into(),
            };
            let api: Workload = (WorkloadKind::Deployment, "api".into());
            let app = ((ObjectKind::ConfigMap, "app".into()), Use { keys: None, optional: false });
            Self {
                spec: ConsulBindingSpec { include_target_references: true, ..spec(false) },
                source: ObjectSource { name: "app".into(), keys: None, optional: false },
                one: digested("1"),
                two: digested("2"),
                found: vec![api.clone(), web()[0].clone()],
                uses: BTreeMap::from([(api.clone(), References::from([app]))]),
                api,
                entries: entry("v1"),
            }
        }

        /// What the binding sees with `previous`, `app`'s `data` and `live` stamps.
        fn input<'a>(
            &'a self,
            key: &'a checksum::Key,
            previous: &'a ConsulBindingStatus,
            data: &'a Digested,
            live: &'a BTreeMap<Workload, Live>,
        ) -> Input<'a> {
            let object =
                ObjectContent { kind: ObjectKind::ConfigMap, source: &self.source, referenced: true, data: Some(data) };
            Input {
                key,
                objects: Ok(vec![object]),
                uses: &self.uses,
                live,
                ..input(&self.spec, previous, &self.entries, &self.found)
            }
        }
    }

    /// A release before per-target checksums gave every target the binding's checksum. After
    /// the upgrade each carries what it reads: nothing rolls, and a ConfigMap only api reads
    /// rolls api alone.
    #[tokio::test(start_paused = true)]
    async fn rows_of_one_checksum_for_every_target_are_read_as_what_each_target_reads() {
        let t = ApiReadsApp::new();
        let at = |previous, data, live| plan_and_status(&t.input(&KEY, previous, data, live));
        let fresh = ConsulBindingStatus::default();
        let (_, baseline) = at(&fresh, &t.one, &NO_LIVE);
        let applied = baseline.applied_checksum.clone().unwrap();
        // As the older release wrote it, after a rollout: both rows and stamps the binding's.
        let mut older = baseline.clone();
        older.targets.iter_mut().for_each(|t| t.checksum = applied.clone());
        let live: BTreeMap<Workload, Live> =
            t.found.iter().map(|w| (w.clone(), Live { value: applied.clone(), owned: true, at: None })).collect();
        let (plan, upgraded) = at(&older, &t.one, &live);
        assert!(plan.roll.is_empty(), "an upgrade rolled {:?}", plan.roll);
        assert_eq!(
            upgraded.targets,
            baseline
                .targets
                .iter()
                .map(|t| consulbind_api::TargetStatus {
                    stamp: Some(applied.clone()).filter(|a| *a != t.checksum),
                    ..t.clone()
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(upgraded.target_summary.as_deref(), Some("2/2"));
        let (plan, _) = at(&upgraded, &t.two, &live);
        assert_eq!(plan.roll, std::slice::from_ref(&t.api));
    }

    /// Checksums of a release before scoped keys, in the status and on the workloads, are read
    /// as the scoped checksums of the same content: nothing rolls on upgrade, the status shows
    /// only scoped checksums, and a later change rolls what reads it.
    #[tokio::test(start_paused = true)]
    async fn checksums_under_the_clusters_key_are_read_as_the_scoped_ones_of_the_same_content() {
        let t = ApiReadsApp::new();
        let scoped = KEY.scoped("team-a", ["", "", ""]);
        let at = |key, previous, data, live| {
            let input = t.input(key, previous, data, live);
            let upgraded = super::super::upgrade::rescoped(&input);
            let input = match &upgraded {
                Some(u) => Input { previous: &u.previous, live: &u.live, ..input },
                None => input,
            };
            plan_and_status(&input)
        };
        let fresh = ConsulBindingStatus::default();
        // What the release before wrote, after a rollout: its checksums, and its own stamps.
        let (_, older) = at(&KEY, &fresh, &t.one, &NO_LIVE);
        let stamps = |status: &ConsulBindingStatus| -> BTreeMap<Workload, Live> {
            let rows = status.targets.iter();
            rows.map(|t| ((t.kind, t.name.clone()), Live { value: t.checksum.clone(), owned: true, at: None }))
                .collect()
        };
        let live = stamps(&older);
        assert!(checksum::is_v2(older.applied_checksum.as_deref().unwrap()));

        let (plan, upgraded) = at(&scoped, &older, &t.one, &live);
        assert!(plan.roll.is_empty(), "an upgrade rolled {:?}", plan.roll);
        let (_, fresh_scoped) = at(&scoped, &fresh, &t.one, &NO_LIVE);
        assert_eq!(upgraded.applied_checksum, fresh_scoped.applied_checksum);
        let rows = |s: &ConsulBindingStatus| s.targets.iter().map(|t| t.checksum.clone()).collect::<Vec<_>>();
        assert_eq!(rows(&upgraded), rows(&fresh_scoped));
        assert!(
            upgraded
                .keys
                .iter()
                .map(|k| &k.checksum)
                .chain(upgraded.objects.iter().map(|o| &o.checksum))
                .all(|c| checksum::is_current(c))
        );
        assert_eq!(condition(&upgraded, conditions::READY).reason, condition(&older, conditions::READY).reason);

        // The workloads keep the old stamps until what they read changes: api, alone.
        let (plan, _) = at(&scoped, &upgraded, &t.one, &live);
        assert!(plan.roll.is_empty());
        let (plan, rolled) = at(&scoped, &upgraded, &t.two, &live);
        assert_eq!(plan.roll, std::slice::from_ref(&t.api));
        assert!(checksum::is_current(&rolled.targets[0].checksum));
        // Content other than the old checksums': a v2 row of it is no match.
        let (plan, _) = at(&scoped, &older, &t.two, &live);
        assert_eq!(plan.roll, [t.found[0].clone()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_config_map_is_part_of_the_content_and_a_missing_one_holds() {
        let (_, consul_only) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let (plan, baseline) = step_object(&Default::default(), Some(&[("a", "1"), ("b", "1")]), None, false);
        assert!(plan.baseline && plan.roll.is_empty());
        assert_ne!(baseline.applied_checksum, consul_only.applied_checksum, "the ConfigMap is not in the checksum");
        assert_eq!(baseline.key_summary.as_deref(), Some("2/2"));
        assert_eq!(baseline.objects[0].entries, Some(2));

        let (plan, _) = step_object(&baseline, Some(&[("a", "1"), ("b", "1")]), None, false);
        assert!(plan.roll.is_empty(), "the same data rolled");
        let (plan, rolled) = step_object(&baseline, Some(&[("a", "2"), ("b", "1")]), None, false);
        assert_eq!(plan.roll, web());
        assert_ne!(rolled.objects[0].checksum, baseline.objects[0].checksum);

        // Only the keys a binding names count.
        let only_b = Some(vec!["b".to_owned()]);
        let (_, filtered) = step_object(&Default::default(), Some(&[("a", "1"), ("b", "1")]), only_b.clone(), false);
        let (plan, _) = step_object(&filtered, Some(&[("a", "2"), ("b", "1")]), only_b, false);
        assert!(plan.roll.is_empty(), "a key the binding does not name rolled");

        let (plan, held) = step_object(&baseline, None, None, false);
        assert!(plan.roll.is_empty());
        let ready = condition(&held, conditions::READY);
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::OBJECT_MISSING));
        assert!(ready.message.contains(r#"ConfigMap "app""#), "{}", ready.message);
        let one = "is missing; rollouts are held until it exists (or mark it optional)";
        assert!(ready.message.contains(one), "{}", ready.message);
        assert_eq!(held.applied_checksum, baseline.applied_checksum);
        assert_eq!(held.key_summary.as_deref(), Some("1/2"));

        // Unreadable: nothing rolls, and what was read last stays in the status.
        let (plan, held) = step_object(&baseline, Some(&[("a", "2")]), None, true);
        assert!(plan.roll.is_empty() && plan.desired.is_none());
        assert_eq!(condition(&held, conditions::READY).reason, reason::OBJECT_UNREADABLE);
        assert_eq!((&held.objects, &held.applied_checksum), (&baseline.objects, &baseline.applied_checksum));
    }

    #[tokio::test(start_paused = true)]
    async fn messages_agree_with_their_counts() {
        let message = |status: &ConsulBindingStatus, type_| condition(status, type_).message.clone();
        let (_, one) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        assert_eq!(message(&one, conditions::TARGETS_UPDATED), "1 target carries the applied content");
        let (_, changed) = step(&spec(false), &one, &entry("v2"), &web());
        assert_eq!(message(&changed, conditions::READY), "1 target carries the current content");
        let (_, held) = step(&spec(false), &one, &[], &web());
        assert_eq!(
            message(&held, conditions::READY),
            "required Consul key \"app/config\" is missing; rollouts are held until it exists again (or mark it \
             optional)"
        );

        let two = vec![web()[0].clone(), (WorkloadKind::StatefulSet, "db".into())];
        let (_, both) = step(&spec(false), &Default::default(), &entry("v1"), &two);
        assert_eq!(message(&both, conditions::TARGETS_UPDATED), "2 targets carry the applied content");
        let (_, changed) = step(&spec(false), &both, &entry("v2"), &two);
        assert_eq!(message(&changed, conditions::READY), "2 targets carry the current content");
        assert_eq!(message(&changed, conditions::CONSUL_SYNCED), "read 1 key from Consul");

        let mut two_keys = spec(false);
        two_keys.keys.push(KeySource { key: "app/other".into(), ..Default::default() });
        let input = Input {
            generation: None,
            consul: Consul::Ready(
                two_keys
                    .keys
                    .iter()
                    .map(|source| KeyContent { source, entries: &[], reset_hold: false, index: None })
                    .collect(),
            ),
            ..input(&two_keys, &both, &[], &two)
        };
        let plan = plan(&input, &mut None, Instant::now());
        assert_eq!(
            plan.hold.as_ref().map(|(_, m)| m.as_str()),
            Some(
                "required Consul keys \"app/config\", \"app/other\" are missing; rollouts are held until they exist \
                 again (or mark them optional)"
            )
        );
        let status = status(&input, &plan, &Outcome::default(), &now());
        assert_eq!(message(&status, conditions::CONSUL_SYNCED), "read 2 keys from Consul");
    }

    #[tokio::test(start_paused = true)]
    async fn suspend_holds_the_change_until_resumed() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let mut suspended = spec(false);
        suspended.suspend = true;
        let (plan, held) = step(&suspended, &baseline, &entry("v2"), &web());
        assert!(plan.roll.is_empty());
        assert_eq!(condition(&held, conditions::READY).reason, reason::SUSPENDED);
        let (plan, _) = step(&spec(false), &held, &entry("v2"), &web());
        assert_eq!(plan.roll, web());
    }

    /// One plan and its status in dry-run mode, or not.
    fn step_dry(previous: &ConsulBindingStatus, value: &str, dry_run: bool) -> (Plan, ConsulBindingStatus) {
        let spec = spec(false);
        let (entries, found) = (entry(value), web());
        let input = Input { dry_run, ..input(&spec, previous, &entries, &found) };
        plan_and_status(&input)
    }

    #[tokio::test(start_paused = true)]
    async fn a_dry_run_reports_the_rollout_and_switching_back_rolls_once() {
        let (_, baseline) = step_dry(&Default::default(), "v1", true);
        assert_eq!(baseline.applied_checksum, Some(checksum_of("v1")), "a dry run records its baseline too");
        assert_eq!(baseline.dry_run.as_ref().unwrap().would_roll, Vec::<String>::new());

        let (plan, held) = step_dry(&baseline, "v2", true);
        assert!(plan.roll.is_empty(), "a dry run patched");
        assert_eq!(plan.would_roll, web());
        assert_eq!(held.applied_checksum, baseline.applied_checksum, "nothing was applied");
        let report = held.dry_run.clone().unwrap();
        assert_eq!(report.would_roll, ["Deployment/web"]);
        assert_eq!(report.checksum, checksum_of("v2"));
        let why = report.reason.unwrap();
        assert!(why.contains(checksum::short(&checksum_of("v2"))), "{why}");
        let ready = condition(&held, conditions::READY);
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", reason::DRY_RUN));
        assert!(ready.message.contains("would roll Deployment/web"), "{}", ready.message);
        assert_eq!(condition(&held, conditions::TARGETS_UPDATED).status, "False");

        // Looked at again: the same report, no new debounce.
        let (again, same) = step_dry(&held, "v2", true);
        assert_eq!(again.wake_at, None);
        assert_eq!(same.dry_run, held.dry_run);

        // Back to Rollout: exactly the held-back rollout happens, and the report goes.
        let (plan, rolled) = step_dry(&held, "v2", false);
        assert_eq!(plan.roll, web());
        assert_eq!(rolled.applied_checksum, Some(checksum_of("v2")));
        assert_eq!(rolled.dry_run, None);
        assert!(step_dry(&rolled, "v2", false).0.roll.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dry_run_without_targets_records_the_content() {
        let spec = spec(false);
        let (v1, v2) = (entry("v1"), entry("v2"));
        let step = |previous: &ConsulBindingStatus, entries: &[KvEntry]| {
            let input = Input { dry_run: true, ..input(&spec, previous, entries, &[]) };
            let plan = plan(&input, &mut None, Instant::now());
            status(&input, &plan, &Outcome::default(), &now())
        };
        let baseline = step(&Default::default(), &v1);
        let moved = step(&baseline, &v2);
        assert_eq!(moved.applied_checksum, Some(checksum_of("v2")), "nothing to roll, nothing to hold");
        assert_eq!(moved.dry_run.unwrap().would_roll, Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unserved_kind_is_a_target_problem_of_its_own() {
        let spec = spec(false);
        let (entries, found) = (entry("v1"), web());
        let unserved = ["the kind Rollout (argoproj.io/v1alpha1) is not served by this cluster".to_owned()];
        let previous = ConsulBindingStatus::default();
        let input = Input { unserved: &unserved, ..input(&spec, &previous, &entries, &found) };
        let plan = plan(&input, &mut None, Instant::now());
        let status = status(&input, &plan, &Outcome::default(), &now());
        assert_eq!(condition(&status, conditions::READY).reason, reason::KIND_NOT_SERVED);
        assert_eq!(condition(&status, conditions::TARGETS_UPDATED).reason, reason::KIND_NOT_SERVED);
        // The targets that exist still got their baseline.
        assert_eq!(status.applied_checksum, Some(checksum_of("v1")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_target_is_picked_up_without_rollout() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &[]);
        let (plan, status) = step(&spec(false), &baseline, &entry("v1"), &web());
        assert!(plan.roll.is_empty());
        assert_eq!(status.targets.len(), 1);
        assert_eq!(status.target_summary.as_deref(), Some("1/1"));
    }

    #[tokio::test(start_paused = true)]
    async fn consul_failure_is_reported_and_keeps_what_was_applied() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let spec = spec(false);
        let found = web();
        let input = Input {
            consul: Consul::Failed { reason: reason::ACCESS_DENIED, message: "Consul denied access".into() },
            ..input(&spec, &baseline, &[], &found)
        };
        let plan = plan(&input, &mut None, Instant::now());
        assert!(plan.roll.is_empty() && plan.desired.is_none());
        let status = status(&input, &plan, &Outcome::default(), &now());
        let synced = condition(&status, conditions::CONSUL_SYNCED);
        assert_eq!((synced.status.as_str(), synced.reason.as_str()), ("False", reason::ACCESS_DENIED));
        assert_eq!(status.applied_checksum, baseline.applied_checksum);
        assert_eq!(status.keys, baseline.keys);
        assert_eq!(status.last_sync_time, baseline.last_sync_time);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_stamp_keeps_applied_so_it_is_retried() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let spec = spec(false);
        let entries = entry("v2");
        let found = web();
        let input = input(&spec, &baseline, &entries, &found);
        let plan = plan(&input, &mut None, Instant::now());
        let outcome = Outcome { rolled: vec![], failed: vec![(web()[0].clone(), "forbidden".into())] };
        let status = status(&input, &plan, &outcome, &now());
        assert_eq!(status.applied_checksum, baseline.applied_checksum);
        assert_eq!(condition(&status, conditions::READY).reason, reason::PATCH_FAILED);
        let (plan, _) = step(&spec, &status, &entries, &web());
        assert_eq!(plan.roll, web());
    }

    #[test]
    fn a_keys_status_counts_a_prefix_by_its_entries_and_a_key_by_its_own_entry() {
        let key = checksum::Key::new([7; checksum::KEY_LEN]);
        let prefix = KeySource { key: "app/".into(), recurse: true, optional: false };
        let exact = KeySource { key: "app/x".into(), recurse: false, optional: false };
        // A shared read answers the other keys under the prefix too.
        let entries = [KvEntry::new("app/w", "1", 3), KvEntry::new("app/x", "2", 5), KvEntry::new("app/y", "3", 9)];
        let status =
            |source| key_status(&key, &KeyContent { source, entries: &entries, reset_hold: false, index: None });
        let seen = |s: KeyStatus| (s.present, s.entries, s.modify_index);
        assert_eq!(seen(status(&prefix)), (true, Some(3), Some(9)));
        assert_eq!(seen(status(&exact)), (true, None, Some(5)));
        let alone = |source| {
            let only = &entries[1..2];
            key_status(&key, &KeyContent { source, entries: only, reset_hold: false, index: None }).checksum
        };
        assert_eq!(status(&exact).checksum, alone(&exact), "the other keys count for nothing");
        assert_ne!(status(&prefix).checksum, alone(&prefix), "each entry of a prefix counts");
        let missing = KeySource { key: "app/z".into(), recurse: false, optional: true };
        assert!(!status(&missing).present);
    }

    #[tokio::test(start_paused = true)]
    async fn on_bind_rolls_every_target_but_one_with_the_bindings_own_stamp_of_the_content() {
        let mut spec = spec(false);
        spec.rollout = Some(Box::new(RolloutPolicy { on_bind: true, ..Default::default() }));
        let found = web();
        let first = |live: &[(&str, bool)]| {
            let live: BTreeMap<Workload, Live> = live
                .iter()
                .map(|(value, owned)| (found[0].clone(), Live { value: value.to_string(), owned: *owned, at: None }))
                .collect();
            let (entries, previous) = (entry("v1"), ConsulBindingStatus::default());
            let input = Input { live: &live, ..input(&spec, &previous, &entries, &found) };
            plan(&input, &mut None, Instant::now()).roll
        };
        let (now, older) = (checksum_of("v1"), checksum_of("v0"));
        assert!(first(&[(&now, true)]).is_empty(), "its own stamp of the content");
        assert_eq!(first(&[(&older, true)]), web(), "its own stamp of other content");
        assert_eq!(first(&[(&now, false)]), web(), "another manager's value says nothing of the pods");
        assert_eq!(first(&[]), web());
    }

    /// A target found carrying a value the binding did not stamp says nothing of what its pods
    /// run: it rolls at the next change of the content, never for the drift alone, and someone
    /// else's copy of the current stamp does not pass for the binding's own.
    #[tokio::test(start_paused = true)]
    async fn a_value_someone_else_set_rolls_at_the_next_change_and_never_for_itself() {
        let (_, bare) = step(&spec(false), &Default::default(), &entry("v1"), &[]);
        let foreign = checksum_of("v0");
        assert!(step_live(&bare, &entry("v1"), &[(&foreign, false)]).roll.is_empty(), "no change, no rollout");
        assert_eq!(step_live(&bare, &entry("v2"), &[(&foreign, false)]).roll, web(), "the change rolls it");
        let (_, found) = step(&spec(false), &bare, &entry("v1"), &web());
        assert!(!found.targets.is_empty(), "found without a stamp: a row of what it runs");
        let copied = checksum_of("v2");
        assert_eq!(step_live(&found, &entry("v2"), &[(&copied, false)]).roll, web(), "a copy of the stamp");
    }

    /// While a change waits out its quiet period, its stamps are held for another binding's
    /// write to the same workload to carry; a dry run's never are, as it writes nothing.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_change_holds_its_stamps_for_other_writes_but_a_dry_run_holds_none() {
        let spec = spec(false);
        let (_, baseline) = step(&spec, &Default::default(), &entry("v1"), &web());
        let (entries, found) = (entry("v2"), web());
        let waiting = |dry_run| {
            let input = Input { window: QUIET, dry_run, ..input(&spec, &baseline, &entries, &found) };
            plan(&input, &mut None, Instant::now())
        };
        let (rollout, dry) = (waiting(false), waiting(true));
        assert!(rollout.roll.is_empty() && rollout.wake_at.is_some());
        assert_eq!(rollout.held, web());
        assert!(dry.wake_at.is_some() && dry.would_roll.is_empty());
        assert_eq!(dry.held, Vec::<Workload>::new());
    }

    /// A dry run's report stands for exactly one rollout: looked at again it is reported at
    /// once, while other content or other targets wait out the quiet period afresh.
    #[tokio::test(start_paused = true)]
    async fn a_dry_runs_report_is_reused_only_for_the_same_content_and_targets() {
        let (_, baseline) = step_dry(&Default::default(), "v1", true);
        let (_, reported) = step_dry(&baseline, "v2", true);
        let spec = spec(false);
        let found = web();
        let again = |previous: &ConsulBindingStatus, value: &str| {
            let entries = entry(value);
            let input = Input { window: QUIET, dry_run: true, ..input(&spec, previous, &entries, &found) };
            plan(&input, &mut None, Instant::now())
        };
        let same = again(&reported, "v2");
        assert_eq!((same.would_roll, same.wake_at), (web(), None), "the report stands");
        let other = again(&reported, "v3");
        assert!(other.would_roll.is_empty() && other.wake_at.is_some(), "other content waits");
        let mut elsewhere = reported.clone();
        elsewhere.dry_run.as_mut().unwrap().would_roll = vec!["Deployment/api".into()];
        let moved = again(&elsewhere, "v2");
        assert!(moved.would_roll.is_empty() && moved.wake_at.is_some(), "other targets wait");
    }

    /// A staged rollout's first wave is written; the stamps of the waves after it stay held.
    #[tokio::test(start_paused = true)]
    async fn a_wave_under_way_holds_the_stamps_of_the_waves_after_it() {
        let waves =
            vec![consulbind_api::Wave { name: Some("canary".into()), ..Default::default() }, Default::default()];
        let spec =
            ConsulBindingSpec { rollout: Some(Box::new(RolloutPolicy { waves, ..Default::default() })), ..spec(false) };
        let staging = crate::reconcile::staging::Staging::of(&spec, &Default::default()).unwrap().expect("waves");
        let found: Vec<Workload> =
            ["canary", "web"].iter().map(|n| (WorkloadKind::Deployment, (*n).to_owned())).collect();
        let (_, baseline) = step(&spec, &Default::default(), &entry("v1"), &found);
        let entries = entry("v2");
        let input = Input { staging: Some(&staging), ..input(&spec, &baseline, &entries, &found) };
        let plan = plan(&input, &mut None, Instant::now());
        assert_eq!((plan.roll, plan.held), (found[..1].to_vec(), found[1..].to_vec()));
    }

    /// A workload found as the content changes, without a stamp, started with the content of
    /// today: nothing rolls it.
    #[tokio::test(start_paused = true)]
    async fn a_target_found_without_a_stamp_as_the_content_changes_is_not_rolled() {
        let (_, bare) = step(&spec(false), &Default::default(), &entry("v1"), &[]);
        let (plan, status) = step(&spec(false), &bare, &entry("v2"), &web());
        assert!(plan.roll.is_empty());
        assert_eq!(status.targets[0].checksum, checksum_of("v2"), "it runs what it was found with");
    }

    /// A stamp of the current content is never behind, whatever its row says it stood for.
    #[tokio::test(start_paused = true)]
    async fn a_stamp_of_the_current_content_is_not_behind_whatever_its_row_says() {
        let (v0, v1) = (checksum_of("v0"), checksum_of("v1"));
        let (_, mut previous) = step(&spec(false), &Default::default(), &entry("v0"), &web());
        assert_eq!(previous.targets[0].checksum, v0);
        // Its stamp of v1 stood for v0 (a reference its template dropped, say).
        previous.targets[0].stamp = Some(v1.clone());
        let plan = step_live(&previous, &entry("v1"), &[(&v1, true)]);
        assert!(plan.roll.is_empty() && plan.rebased.is_empty(), "{:?} {:?}", plan.roll, plan.rebased);
    }

    /// `lastChangeTime` is when a change was last rolled out: the first rollout of `onBind`
    /// sets it, a baseline does not, and a later change moves it.
    #[tokio::test(start_paused = true)]
    async fn the_last_change_time_is_set_by_a_rollout_and_never_by_a_baseline() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        assert_eq!(baseline.last_change_time, None);
        let (_, rolled) = step(&spec(false), &baseline, &entry("v2"), &web());
        assert_eq!(rolled.last_change_time, Some(now()));

        let mut on_bind = spec(false);
        on_bind.rollout = Some(Box::new(RolloutPolicy { on_bind: true, ..Default::default() }));
        let (plan, first) = step(&on_bind, &Default::default(), &entry("v1"), &web());
        assert_eq!((plan.roll, first.last_change_time), (web(), Some(now())));
    }

    /// Ready stays `Baselined` however often the binding is looked at, until something rolls;
    /// after a rollout it never turns back.
    #[tokio::test(start_paused = true)]
    async fn a_baseline_stays_the_word_until_something_rolls() {
        let ready = |status: &ConsulBindingStatus| condition(status, conditions::READY).reason.clone();
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let (_, again) = step(&spec(false), &baseline, &entry("v1"), &web());
        assert_eq!(ready(&again), reason::BASELINED);
        let (_, rolled) = step(&spec(false), &again, &entry("v2"), &web());
        let (_, after) = step(&spec(false), &rolled, &entry("v2"), &web());
        assert_eq!((ready(&rolled), ready(&after)), (reason::UP_TO_DATE.to_owned(), reason::UP_TO_DATE.to_owned()));
    }

    /// A binding of ConfigMaps alone says so in `ConsulSynced`, not that it read no keys.
    #[tokio::test(start_paused = true)]
    async fn a_binding_without_keys_says_none_are_bound() {
        let source = ObjectSource { name: "app".into(), keys: None, optional: true };
        let objects_only = ConsulBindingSpec { keys: vec![], config_maps: vec![source], ..spec(false) };
        let object = ObjectContent {
            kind: ObjectKind::ConfigMap,
            source: &objects_only.config_maps[0],
            referenced: false,
            data: None,
        };
        let (keyed, entries, found, previous) = (spec(false), entry("v1"), web(), ConsulBindingStatus::default());
        let input = Input {
            spec: &objects_only,
            consul: Consul::Ready(vec![]),
            objects: Ok(vec![object]),
            ..input(&keyed, &previous, &entries, &found)
        };
        let (_, status) = plan_and_status(&input);
        let synced = condition(&status, conditions::CONSUL_SYNCED);
        assert_eq!((synced.status.as_str(), synced.message.as_str()), ("True", "no Consul keys are bound"));
    }

    /// A binding with nothing to roll says in Ready when rollouts are suspended, or only
    /// dry-run.
    #[tokio::test(start_paused = true)]
    async fn ready_says_when_rollouts_are_suspended_or_only_dry_run() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let (_, rolled) = step(&spec(false), &baseline, &entry("v2"), &web());
        let suspended = ConsulBindingSpec { suspend: true, ..spec(false) };
        let (entries, found) = (entry("v2"), web());
        let message = |input: &Input<'_>| condition(&plan_and_status(input).1, conditions::READY).message.clone();
        let quiet = message(&input(&suspended, &rolled, &entries, &found));
        assert!(quiet.ends_with(" (rollouts suspended)"), "{quiet}");
        let dry = message(&Input { dry_run: true, ..input(&spec(false), &rolled, &entries, &found) });
        assert!(dry.ends_with(" (dry run: nothing is patched)"), "{dry}");
        let plain = message(&input(&spec(false), &rolled, &entries, &found));
        assert!(!plain.ends_with(')'), "{plain}");
    }

    /// A binding whose waves were taken out of its spec shows no staged rollout any more.
    #[tokio::test(start_paused = true)]
    async fn a_binding_no_longer_staged_shows_no_rollout() {
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let rollout = consulbind_api::RolloutStatus {
            checksum: baseline.applied_checksum.clone().unwrap(),
            wave: 1,
            waves: 2,
            phase: consulbind_api::RolloutPhase::Paused,
            since: now(),
            started_time: now(),
            progress: "1/2 waves".into(),
            next_window: None,
        };
        let staged = ConsulBindingStatus { rollout: Some(rollout), ..baseline };
        let (_, status) = step(&spec(false), &staged, &entry("v1"), &web());
        assert_eq!(status.rollout, None);
    }

    /// A hold says so on Ready, and on TargetsUpdated only while a target does not carry the
    /// applied content: while Consul cannot be read, or a key turned required is missing, the
    /// targets that carry it are up to date.
    #[tokio::test(start_paused = true)]
    async fn targets_that_carry_the_applied_content_are_up_to_date_through_a_hold() {
        let targets = |status: &ConsulBindingStatus| {
            let c = condition(status, conditions::TARGETS_UPDATED);
            (c.status.clone(), c.reason.clone())
        };
        let (_, baseline) = step(&spec(false), &Default::default(), &entry("v1"), &web());
        let (_, rolled) = step(&spec(false), &baseline, &entry("v2"), &web());
        let failed = || Consul::Failed { reason: reason::CONSUL_UNREACHABLE, message: "connection refused".into() };
        let (spec, entries, found) = (spec(false), entry("v2"), web());
        let (_, unread) = plan_and_status(&Input { consul: failed(), ..input(&spec, &rolled, &entries, &found) });
        assert_eq!(targets(&unread), ("True".into(), reason::UP_TO_DATE.into()));
        assert_eq!(condition(&unread, conditions::READY).reason, reason::CONSUL_UNREACHABLE);

        // Bound while optional and missing, then made required: the targets carry what is there.
        let (_, missing) = step(&self::spec(true), &Default::default(), &[], &web());
        let (plan, required) = step(&self::spec(false), &missing, &[], &web());
        assert_eq!(plan.desired, missing.applied_checksum);
        assert_eq!(condition(&required, conditions::READY).reason, reason::KEY_MISSING);
        assert_eq!(targets(&required), ("True".into(), reason::UP_TO_DATE.into()));
    }

    /// A dry run's report stays while Consul cannot be read, and goes with the dry run.
    #[tokio::test(start_paused = true)]
    async fn a_dry_runs_report_outlasts_an_unread_consul_and_goes_with_the_dry_run() {
        let (spec, entries, found) = (spec(false), entry("v1"), web());
        let (_, baseline) = step(&spec, &Default::default(), &entry("v0"), &found);
        let (_, reported) = plan_and_status(&Input { dry_run: true, ..input(&spec, &baseline, &entries, &found) });
        let report = reported.dry_run.clone().expect("a dry run's report");
        assert_eq!(report.would_roll, ["Deployment/web"]);
        let failed = Consul::Failed { reason: reason::CONSUL_UNREACHABLE, message: "connection refused".into() };
        let unread = Input { dry_run: true, consul: failed, ..input(&spec, &reported, &entries, &found) };
        assert_eq!(plan_and_status(&unread).1.dry_run, Some(report));
        assert_eq!(plan_and_status(&input(&spec, &reported, &entries, &found)).1.dry_run, None);
    }

    /// An older checksum in any one place asks for the second read: the applied one, a
    /// target's row, or the binding's own stamp on a workload where its row records it.
    #[tokio::test(start_paused = true)]
    async fn an_older_checksum_in_any_one_place_asks_for_a_second_read() {
        let (spec, entries, found) = (spec(false), entry("v1"), web());
        let (_, current) = step(&spec, &Default::default(), &entries, &found);
        let older = checksum::legacy(&[Source::Key { key: "app/config", value: Some(b"v1") }]);
        let applied = ConsulBindingStatus { applied_checksum: Some(older.clone()), ..current.clone() };
        let mut row = current.clone();
        row.targets[0].checksum = older.clone();
        let mut stamped = current.clone();
        stamped.targets[0].stamp = Some(older.clone());
        let live: BTreeMap<Workload, Live> = [(found[0].clone(), Live { value: older, owned: true, at: None })].into();
        assert!(older_values(&input(&spec, &applied, &entries, &found)), "the applied checksum");
        assert!(older_values(&input(&spec, &row, &entries, &found)), "a target's row");
        assert!(older_values(&Input { live: &live, ..input(&spec, &stamped, &entries, &found) }), "a stamp recorded");
        assert!(!older_values(&Input { live: &live, ..input(&spec, &current, &entries, &found) }), "one not recorded");
        assert!(!older_values(&input(&spec, &current, &entries, &found)));
    }

    /// A binding whose status and stamps are all scoped is planned once, with no second plan
    /// under the cluster's key; one with a checksum of the release before is rescoped.
    #[tokio::test(start_paused = true)]
    async fn only_a_binding_with_checksums_under_the_clusters_key_is_rescoped() {
        let t = ApiReadsApp::new();
        let scoped = KEY.scoped("team-a", ["", "", ""]);
        let fresh = ConsulBindingStatus::default();
        let (_, current) = plan_and_status(&t.input(&scoped, &fresh, &t.one, &NO_LIVE));
        let rows = current.targets.iter();
        let stamps: BTreeMap<Workload, Live> = rows
            .map(|r| ((r.kind, r.name.clone()), Live { value: r.checksum.clone(), owned: true, at: None }))
            .collect();
        let rescoped = |previous, live| super::super::upgrade::rescoped(&t.input(&scoped, previous, &t.one, live));
        assert!(rescoped(&current, &stamps).is_none());
        let (_, older) = plan_and_status(&t.input(&KEY, &fresh, &t.one, &NO_LIVE));
        assert!(rescoped(&older, &NO_LIVE).is_some());
    }
}
