//! The second stage of a reconcile, free of I/O: from what [`observe`](super::observe) read and
//! the binding's record, what to write. The controller and the simulators run this same code.

use std::time::Duration;

use consulbind_api::{ConsulBindingStatus, conditions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::controller::Action;
use tokio::time::Instant;

use super::{
    carried, debounce,
    input::{Consul, Input, Outcome, Plan},
    loss,
    observe::{Observed, Read},
    plan, report, restore,
    state::{Record, Settled},
    status,
    upgrade::{self, Upgraded},
};

/// What a reconcile writes.
pub enum Decision<'a> {
    /// The binding is not served: the status that says why, and when to look again.
    Refused { status: Box<ConsulBindingStatus>, then: Action },
    /// Decide again after this: the values read for an upgrade are no longer the content.
    Retry(Duration),
    /// The namespace is over its write limit until then: only the status that says so.
    WriteLimited(Instant),
    /// Stamp and report what the plan says.
    Act(Box<Act<'a>>),
}

/// A plan, and what it was made of.
pub struct Act<'a> {
    pub read: &'a Read,
    pub plan: Plan,
    /// The status and stamps, with checksums of older formats read as current ones.
    upgraded: Option<Upgraded>,
    restore: Option<Duration>,
    /// This replica's first read found a restore that no status written since shows.
    pub restored: bool,
    /// The previous status records stamps the one the API server holds does not (one owed since
    /// its write failed after its stamps landed, or rolls found on the workloads): it is written
    /// before anything rolls, so that the stamps are never more than one status ahead.
    pub withhold: bool,
    /// The change's quiet period that the plan took as over: a patch that fails leaves it to the
    /// retry, which rolls without a second one.
    pub settled: Option<Box<debounce::Pending>>,
}

impl<'a> Act<'a> {
    pub fn input(&'a self, observed: &'a Observed<'_>) -> Input<'a> {
        let input = Input { withhold: self.withhold, ..observed.input(self.read, self.restore, self.restored) };
        match &self.upgraded {
            Some(upgraded) => Input { previous: &upgraded.previous, live: &upgraded.live, ..input },
            None => input,
        }
    }

    /// The status the events are told against: the rolls it records were told when they landed,
    /// or cannot be told now.
    fn previous<'s>(&'s self, observed: &'s Observed<'_>) -> &'s ConsulBindingStatus {
        match (&self.upgraded, self.withhold) {
            (Some(upgraded), true) => &upgraded.previous,
            _ => &observed.previous,
        }
    }
}

/// Decides a reconcile of what `observed` holds, keeping in `record` what the next one needs.
pub fn decide<'a>(observed: &'a Observed<'_>, record: &mut Record, now: Instant) -> Decision<'a> {
    let owed = record.owed.as_deref().cloned();
    let previous = owed.as_ref().unwrap_or(&observed.previous);
    let read = match &observed.read {
        Ok(read) => read,
        Err(refused) => {
            let time = Time(observed.clock);
            let status = report::not_served(previous, observed.generation, refused.reason, &refused.message, &time);
            return Decision::Refused { status: Box::new(status), then: refused.then.clone() };
        }
    };
    // Either hold is marked when the reconcile started, so that one which then finds the
    // content settled ends the grace.
    let held = loss::held_for_lost_content(previous);
    let reset = restore::latest_reset(read.contents());
    let (restore, restored) =
        record.restore.grace(held, read.found_restored, reset, observed.started, read.restore_grace);
    let restored = restored && read.consul_ready();
    let withhold = owed.is_some();
    let upgraded = owed.clone().map(|previous| Upgraded { previous, live: read.resolved.live.clone() });
    let mut act = Act { read, plan: Plan::default(), upgraded, restore, restored, withhold, settled: None };
    let input = act.input(observed);
    if let Some(live) = upgrade::disowned(&input) {
        let previous = input.previous.clone();
        act.upgraded = Some(Upgraded { previous, live });
    }
    if let Some(values) = &read.values {
        match upgrade::upgrade(&act.input(observed), values) {
            Ok(upgraded) => act.upgraded = upgraded.or(act.upgraded.take()),
            // The content changed in between: its wake brings the next try.
            Err(_) => return Decision::Retry(Duration::from_secs(1)),
        }
    }
    let mut input = act.input(observed);
    if let Some(rescoped) = upgrade::rescoped(&input) {
        act.upgraded = Some(rescoped);
        input = act.input(observed);
    }
    // Rolls no status records (not even an owed one), as the workloads show them, are written
    // before anything rolls.
    match carried::unrecorded(&input) {
        Ok(None) => {}
        Ok(Some(previous)) => {
            act.upgraded = Some(Upgraded { previous, live: input.live.clone() });
            act.withhold = true;
            input = act.input(observed);
        }
        // Rolls of a rollout that cannot be told until the content is read: shown as unread,
        // the rows as they are, recorded once it is.
        Err((reason, message)) => {
            let time = Time(observed.clock);
            let status = report::not_served(input.previous, observed.generation, reason, &message, &time);
            return Decision::Refused { status: Box::new(status), then: Action::requeue(Duration::from_secs(5)) };
        }
    }
    let before = record.pending.clone();
    let mut pending = record.pending.take().map(|p| *p);
    let plan = plan::plan(&input, &mut pending, now);
    record.pending = pending.map(Box::new);
    // A namespace over its write limit writes nothing but the status that says so. A change
    // the plan took as settled stays pending, so that it rolls once the namespace is within.
    if let Some(free) = read.write_limited {
        let unheld = || status::status(&input, &plan, &Outcome::default(), &Time(observed.clock));
        if report::writes(previous, &plan, unheld) {
            if record.pending.is_none() {
                record.pending = before;
            }
            return Decision::WriteLimited(free);
        }
    }
    if record.pending.is_none() {
        act.settled = before;
    }
    act.plan = plan;
    Decision::Act(Box::new(act))
}

/// What a reconcile tells once its stamps are written.
pub struct Report {
    pub status: ConsulBindingStatus,
    pub events: Vec<Event>,
    /// Look again then, to end a debounce or a wave's pause.
    pub wake_at: Option<Instant>,
    /// Consul, the objects and every stamp went well: nothing needs a look soon.
    pub healthy: bool,
}

/// An event on the binding.
pub enum Event {
    /// Workloads were rolled; the fingerprints of the sources that the targets carried before,
    /// to name what changed ([`status::fingerprints`]).
    RolledOut { applied: Option<Vec<u64>> },
    /// A dry run would roll workloads.
    DryRun { reason: &'static str, message: String },
    /// The targets' references changed: what they read now is recorded as what they run.
    Rebased(String),
    /// The content's first sight, recorded without a rollout.
    Baselined(String),
    /// Something a person should change.
    Warning { reason: &'static str, message: String },
    /// Something a person did that the binding's history should keep.
    Notice { reason: &'static str, message: String },
}

impl Event {
    /// Whether the event tells what stamps did: that happened whether or not the status that
    /// records it is written. The others tell what the status shows, once it does.
    pub fn of_stamps(&self) -> bool {
        matches!(self, Event::RolledOut { .. } | Event::Notice { .. })
    }
}

#[cfg(test)]
impl Event {
    /// The variant's name, for tests to list what was told.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::RolledOut { .. } => "RolledOut",
            Event::DryRun { .. } => "DryRun",
            Event::Rebased(_) => "Rebased",
            Event::Baselined(_) => "Baselined",
            Event::Warning { .. } => "Warning",
            Event::Notice { .. } => "Notice",
        }
    }
}

/// The status and the event that report `act` with what its stamps did. `settled`: the record's
/// [`Written::settled`](super::state::Written::settled).
pub fn conclude(observed: &Observed<'_>, act: &Act<'_>, outcome: &Outcome, settled: Option<&Settled>) -> Report {
    let previous = act.previous(observed);
    let plan = &act.plan;
    let input = act.input(observed);
    let mut status = status::status(&input, plan, outcome, &Time(observed.clock));
    let mut events: Vec<Event> = caution(observed, previous, act.read, &mut status).into_iter().collect();
    let applied = settled.and_then(|s| s.fingerprints_of(previous.applied_checksum.as_deref()));
    name_what_halted(applied, &mut status);
    let event = if !outcome.rolled.is_empty() {
        Some(Event::RolledOut { applied: applied.map(<[u64]>::to_vec) })
    } else if !plan.would_roll.is_empty() && status.dry_run != previous.dry_run {
        plan.hold.as_ref().map(|(reason, message)| Event::DryRun { reason, message: message.clone() })
    } else if !plan.rebased.is_empty() {
        Some(Event::Rebased(rebased(plan)))
    } else if plan.baseline && previous.applied_checksum.is_none() {
        let short = report::short(&status);
        Some(Event::Baselined(format!("recorded checksum {short} as the baseline; nothing was restarted")))
    } else {
        None
    };
    events.extend(event);
    if !outcome.rolled.is_empty() && plan.staged.as_ref().is_some_and(|s| s.let_through) {
        let names: Vec<String> = outcome.rolled.iter().map(|(k, n)| format!("{k}/{n}")).collect();
        let message = format!(
            "rolled {} outside the rollout windows: the annotation {} lets checksum {} through",
            names.join(", "),
            consulbind_api::ROLL_OUTSIDE_WINDOW,
            plan.desired.as_deref().map_or("-", crate::checksum::short)
        );
        events.push(Event::Notice { reason: conditions::reason::ROLLED_OUTSIDE_WINDOW, message });
    }
    let healthy = outcome.failed.is_empty() && matches!(input.consul, Consul::Ready(_)) && input.objects.is_ok();
    Report { status, events, wake_at: plan.wake_at, healthy }
}

/// A halt says which sources brought the content that halted it, as the rollout's event named
/// them: the person told of it knows what to revert.
fn name_what_halted(applied: Option<&[u64]>, status: &mut ConsulBindingStatus) {
    let changed = report::changed_sources(applied, status);
    let halted = |c: &&mut Condition| c.type_ == conditions::READY && c.reason == conditions::reason::ROLLOUT_HALTED;
    if let Some(ready) = status.conditions.iter_mut().find(halted)
        && !changed.is_empty()
    {
        let named =
            format!("{}; the content that halted it came with a change of {}", ready.message, changed.join(", "));
        ready.message = report::clip(named, status::MESSAGE_LIMIT);
    }
}

/// Shows what the spec does that newer API servers refuse, as the `SpecWarning` condition; a
/// Warning event when it is new.
fn caution(
    observed: &Observed<'_>,
    previous: &ConsulBindingStatus,
    read: &Read,
    status: &mut ConsulBindingStatus,
) -> Option<Event> {
    let message = read.caution.clone()?;
    let reason = conditions::reason::MAX_DELAY_BELOW_QUIET_PERIOD;
    let previous = &previous.conditions;
    let new = !previous.iter().any(|c| c.type_ == conditions::SPEC_WARNING && c.message == message);
    let time = Time(observed.clock);
    let warning = status::condition(
        previous,
        conditions::SPEC_WARNING,
        Some(true),
        reason,
        message.clone(),
        observed.generation,
        &time,
    );
    status.conditions.push(warning);
    new.then_some(Event::Warning { reason, message })
}

fn rebased(plan: &Plan) -> String {
    let list: Vec<String> = plan.rebased.iter().map(|(k, n)| format!("{k}/{n}")).collect();
    let one = list.len() == 1;
    format!(
        "the ConfigMaps and Secrets that {} reference{} changed (a template change, or includeTargetReferences set); \
         recorded what {} now read as the content {}, and restarted nothing: a template change rolls its workload \
         itself",
        list.join(", "),
        if one { "s" } else { "" },
        if one { "it" } else { "they" },
        if one { "it runs with" } else { "they run with" },
    )
}

/// Whether a written status showed what this replica's first read found: Consul and the objects
/// were read.
pub fn shown(act: &Act<'_>) -> bool {
    act.restored && act.read.objects.is_ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use consulbind_api::{ConsulBindingSpec, TargetRef, WorkloadKind};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::{
        checksum,
        cluster::{Live, Workload, workloads::Resolved},
        reconcile::input::Step,
        watches::{Content, KeyState},
    };

    impl<'a> Act<'a> {
        /// An act of `plan` on `read`, with nothing upgraded, restored, withheld or settled.
        fn of(read: &'a Read, plan: Plan) -> Self {
            Act { read, plan, upgraded: None, restore: None, restored: false, withhold: false, settled: None }
        }
    }

    fn spec() -> ConsulBindingSpec {
        ConsulBindingSpec {
            include_target_references: true,
            targets: vec![TargetRef { kind: WorkloadKind::Deployment, name: Some("web".into()), selector: None }],
            ..Default::default()
        }
    }

    fn read(spec: &ConsulBindingSpec) -> Read {
        let key = checksum::Key::new([7; checksum::KEY_LEN]);
        crate::sim::read_of(spec, key, Vec::new(), Resolved::default(), Vec::new(), Vec::new())
    }

    fn observed(spec: &ConsulBindingSpec, previous: ConsulBindingStatus, read: Read) -> Observed<'_> {
        let clock: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        Observed { spec, generation: Some(1), previous, started: Instant::now(), clock, read: Ok(read) }
    }

    fn web() -> Workload {
        (WorkloadKind::Deployment, "web".to_owned())
    }

    /// What `conclude` reports for a plan, after a status `previous`, with `changed` the read's
    /// change of it.
    fn concluded(
        previous: ConsulBindingStatus,
        plan: Plan,
        rolled: bool,
        settled: Option<(&str, Vec<u64>)>,
        change: impl FnOnce(&mut Read),
    ) -> Report {
        let spec = spec();
        let mut read = read(&spec);
        change(&mut read);
        let observed = observed(&spec, previous, read);
        let Ok(read) = &observed.read else { unreachable!() };
        let act = Act::of(read, plan);
        let outcome = Outcome { rolled: if rolled { vec![web()] } else { Vec::new() }, failed: Vec::new() };
        let settled = settled.map(|(checksum, fingerprints)| Settled::new(checksum, &fingerprints));
        conclude(&observed, &act, &outcome, settled.as_ref())
    }

    fn names(report: &Report) -> Vec<&'static str> {
        report.events.iter().map(Event::kind).collect()
    }

    fn applied(checksum: &str) -> ConsulBindingStatus {
        ConsulBindingStatus { applied_checksum: Some(checksum.into()), ..Default::default() }
    }

    #[test]
    fn an_upgraded_status_and_stamps_stand_in_for_those_read() {
        let spec = spec();
        let observed = observed(&spec, applied("old"), read(&spec));
        let Ok(read) = &observed.read else { unreachable!() };
        let mut act = Act::of(read, Plan::default());
        assert_eq!(act.input(&observed).previous.applied_checksum.as_deref(), Some("old"));
        let live = BTreeMap::from([(web(), Live { value: "new".into(), owned: true, at: None })]);
        act.upgraded = Some(Upgraded { previous: applied("new"), live });
        let input = act.input(&observed);
        assert_eq!(input.previous.applied_checksum.as_deref(), Some("new"));
        assert_eq!(input.live.get(&web()).map(|l| l.value.as_str()), Some("new"));
    }

    #[test]
    fn a_rollout_names_what_changed_only_from_a_record_of_the_content_the_targets_carried() {
        let applied_of =
            |settled: &str| match concluded(applied("a"), Plan::default(), true, Some((settled, vec![1, 2])), |_| {})
                .events
                .as_slice()
            {
                [Event::RolledOut { applied }] => applied.clone(),
                _ => panic!("one RolledOut event"),
            };
        assert_eq!(applied_of("a"), Some(vec![1, 2]));
        assert_eq!(applied_of("b"), None, "a record of other content names nothing");
    }

    #[test]
    fn a_halt_names_the_sources_that_brought_its_content() {
        let key = |name: &str, checksum: &str| consulbind_api::KeyStatus {
            key: name.into(),
            checksum: checksum.into(),
            ..Default::default()
        };
        let halted = |message: &str| Condition {
            type_: conditions::READY.into(),
            status: "False".into(),
            reason: conditions::reason::ROLLOUT_HALTED.into(),
            message: message.into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        };
        let before = ConsulBindingStatus { keys: vec![key("app/db", "1"), key("app/ui", "2")], ..Default::default() };
        let applied = status::fingerprints(&before);
        let mut now = ConsulBindingStatus {
            keys: vec![key("app/db", "1"), key("app/ui", "3")],
            conditions: vec![halted("wave 1/2: halted")],
            ..Default::default()
        };
        name_what_halted(Some(&applied), &mut now);
        assert_eq!(
            now.conditions[0].message,
            "wave 1/2: halted; the content that halted it came with a change of Consul key \"app/ui\""
        );
        let mut unknown = ConsulBindingStatus { conditions: vec![halted("wave 1/2: halted")], ..now.clone() };
        name_what_halted(None, &mut unknown);
        assert_eq!(unknown.conditions[0].message, "wave 1/2: halted", "no record of what was carried: nothing named");
    }

    #[test]
    fn a_dry_run_event_needs_workloads_that_would_roll_and_a_report_not_shown_yet() {
        let plan = |would_roll: Vec<Workload>| Plan {
            desired: Some("c".into()),
            would_roll,
            hold: Some(("DryRun", "would roll".into())),
            ..Plan::default()
        };
        let dry = |read: &mut Read| read.dry_run = true;
        let first = concluded(ConsulBindingStatus::default(), plan(vec![web()]), false, None, dry);
        assert_eq!(names(&first), ["DryRun"]);
        let shown = || ConsulBindingStatus { dry_run: first.status.dry_run.clone(), ..Default::default() };
        assert!(names(&concluded(shown(), plan(vec![web()]), false, None, dry)).is_empty(), "shown already");
        let report = concluded(shown(), Plan { baseline: true, ..plan(Vec::new()) }, false, None, dry);
        assert_eq!(names(&report), ["Baselined"], "nothing would roll: the baseline is told");
    }

    #[test]
    fn a_rebase_names_the_workloads_in_a_sentence_that_agrees_with_their_number() {
        let told = |rebased: Vec<Workload>| match concluded(
            applied("a"),
            Plan { rebased, ..Plan::default() },
            false,
            None,
            |_| {},
        )
        .events
        .as_slice()
        {
            [Event::Rebased(message)] => message.clone(),
            _ => panic!("one Rebased event"),
        };
        let one = told(vec![web()]);
        assert!(one.starts_with("the ConfigMaps and Secrets that Deployment/web references changed"), "{one}");
        assert!(one.contains("recorded what it now read as the content it runs with"), "{one}");
        let two = told(vec![web(), (WorkloadKind::StatefulSet, "db".into())]);
        assert!(
            two.starts_with("the ConfigMaps and Secrets that Deployment/web, StatefulSet/db reference changed"),
            "{two}"
        );
        assert!(two.contains("recorded what they now read as the content they run with"), "{two}");
    }

    #[test]
    fn a_report_is_healthy_only_when_consul_the_objects_and_every_stamp_went_well() {
        let healthy = |consul: bool, objects: bool, failed: bool| {
            let spec = spec();
            let mut read = read(&spec);
            if !consul {
                read.consul = Err(("ConsulUnreachable", "down".into()));
            }
            if !objects {
                read.objects = Err(("ObjectUnreadable", "forbidden".into()));
            }
            let observed = observed(&spec, applied("a"), read);
            let Ok(read) = &observed.read else { unreachable!() };
            let act = Act::of(read, Plan::default());
            let failed = if failed { vec![(web(), "conflict".to_owned())] } else { Vec::new() };
            conclude(&observed, &act, &Outcome { rolled: Vec::new(), failed }, None).healthy
        };
        assert!(healthy(true, true, false));
        assert!(!healthy(false, true, false), "Consul unread");
        assert!(!healthy(true, false, false), "the objects unread");
        assert!(!healthy(true, true, true), "a stamp failed");
    }

    #[test]
    fn a_baseline_is_told_only_for_the_first_record() {
        let baseline = || Plan { baseline: true, ..Plan::default() };
        let first = concluded(ConsulBindingStatus::default(), baseline(), false, None, |_| {});
        assert_eq!(names(&first), ["Baselined"]);
        assert!(names(&concluded(applied("a"), baseline(), false, None, |_| {})).is_empty());
    }

    #[test]
    fn a_roll_outside_the_windows_is_noted_only_when_the_annotation_let_a_rollout_through() {
        let plan =
            |let_through: bool| Plan { staged: Some(Step { let_through, ..Step::default() }), ..Plan::default() };
        let noted = |let_through, rolled| {
            names(&concluded(applied("a"), plan(let_through), rolled, None, |_| {})).contains(&"Notice")
        };
        assert!(noted(true, true));
        assert!(!noted(true, false), "nothing rolled");
        assert!(!noted(false, true), "rolled inside a window");
    }

    #[test]
    fn a_spec_warning_is_a_condition_and_an_event_when_its_message_is_new() {
        let caution = |read: &mut Read| read.caution = Some("maxDelay below quietPeriod".into());
        let report = concluded(ConsulBindingStatus::default(), Plan::default(), false, None, caution);
        assert_eq!(names(&report), ["Warning"]);
        let warning = report.status.conditions.iter().find(|c| c.type_ == conditions::SPEC_WARNING).cloned();
        let warning = warning.expect("a SpecWarning condition");
        assert_eq!((warning.status.as_str(), warning.message.as_str()), ("True", "maxDelay below quietPeriod"));

        let shown = |message: &str, type_: &str| {
            let mut condition = warning.clone();
            (condition.message, condition.type_) = (message.into(), type_.into());
            ConsulBindingStatus { conditions: vec![condition], ..Default::default() }
        };
        let again = concluded(
            shown("maxDelay below quietPeriod", conditions::SPEC_WARNING),
            Plan::default(),
            false,
            None,
            caution,
        );
        assert!(names(&again).is_empty(), "the same warning again");
        let other =
            concluded(shown("an older warning", conditions::SPEC_WARNING), Plan::default(), false, None, caution);
        assert_eq!(names(&other), ["Warning"], "a new message");
        let elsewhere =
            concluded(shown("maxDelay below quietPeriod", conditions::READY), Plan::default(), false, None, caution);
        assert_eq!(names(&elsewhere), ["Warning"], "the message in another condition");
        let none = concluded(ConsulBindingStatus::default(), Plan::default(), false, None, |_| {});
        assert!(none.status.conditions.iter().all(|c| c.type_ != conditions::SPEC_WARNING));
    }

    #[test]
    fn a_restore_is_shown_only_by_a_read_of_consul_and_the_objects() {
        let spec = spec();
        let decided = |consul_ready: bool, objects_read: bool| {
            let mut read = read(&spec);
            read.found_restored = Some(true);
            if !consul_ready {
                read.consul = Err(("ConsulUnreachable", "down".into()));
            }
            if !objects_read {
                read.objects = Err(("ObjectUnreadable", "forbidden".into()));
            }
            let observed = observed(&spec, ConsulBindingStatus::default(), read);
            let mut record = Record::default();
            match decide(&observed, &mut record, Instant::now()) {
                Decision::Act(act) => (act.restored, shown(&act)),
                _ => panic!("an act"),
            }
        };
        assert_eq!(decided(true, true), (true, true));
        assert_eq!(decided(false, true), (false, false), "Consul unread");
        assert_eq!(decided(true, false), (true, false), "the objects unread");
    }

    #[test]
    fn an_index_reset_in_the_contents_gives_the_restore_grace() {
        let spec = spec();
        let restore = |reset_at: Option<Instant>| {
            let mut read = read(&spec);
            let content = Content {
                entries: (&[][..]).into(),
                changed_at: Instant::now(),
                reset_hold: false,
                reset_at,
                index: None,
            };
            read.consul = Ok(vec![KeyState::Ready(content)]);
            let grace = read.restore_grace;
            let observed = observed(&spec, ConsulBindingStatus::default(), read);
            match decide(&observed, &mut Record::default(), Instant::now()) {
                Decision::Act(act) => (act.restore, grace),
                _ => panic!("an act"),
            }
        };
        let (after_reset, grace) = restore(Some(Instant::now()));
        assert_eq!(after_reset, Some(grace));
        assert_eq!(restore(None).0, None, "no reset, no grace");
    }

    #[test]
    fn a_binding_not_served_says_why_at_its_generation_and_keeps_what_it_recorded() {
        let spec = spec();
        let mut observed = observed(&spec, applied("sum"), read(&spec));
        observed.generation = Some(2);
        let then = Action::requeue(Duration::from_secs(15));
        let message = "this namespace has too many ConsulBindings".to_owned();
        observed.read =
            Err(crate::reconcile::observe::Refused { reason: "TooManyBindings", message, then: then.clone() });
        let Decision::Refused { status, then: after } = decide(&observed, &mut Record::default(), Instant::now())
        else {
            panic!("refused")
        };
        assert_eq!(after, then);
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.applied_checksum.as_deref(), Some("sum"), "what the targets run stays recorded");
        let ready = status.conditions.iter().find(|c| c.type_ == conditions::READY).expect("Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "TooManyBindings"));
        assert_eq!(ready.message, "this namespace has too many ConsulBindings");
    }

    /// A namespace over its write limit holds a reconcile that would write, and lets through
    /// one with nothing new to say.
    #[test]
    fn over_the_write_limit_only_a_reconcile_that_would_write_is_held() {
        let spec = spec();
        let free = Instant::now() + Duration::from_secs(5);
        let held = |previous: ConsulBindingStatus| {
            let mut read = read(&spec);
            read.write_limited = Some(free);
            let observed = observed(&spec, previous, read);
            matches!(decide(&observed, &mut Record::default(), Instant::now()), Decision::WriteLimited(at) if at == free)
        };
        assert!(held(ConsulBindingStatus::default()), "a first status to write");
        let observed = observed(&spec, ConsulBindingStatus::default(), read(&spec));
        let Decision::Act(act) = decide(&observed, &mut Record::default(), Instant::now()) else { panic!("an act") };
        assert!(act.plan.roll.is_empty());
        let written = status::status(&act.input(&observed), &act.plan, &Outcome::default(), &Time(observed.clock));
        assert!(!held(written), "the status it would write is already there");
    }

    /// The `Baselined` event names the checksum the baseline recorded.
    #[test]
    fn a_baseline_names_the_checksum_it_recorded() {
        let desired = "0123456789abcdef".repeat(4);
        let plan = Plan { baseline: true, desired: Some(desired.clone()), ..Plan::default() };
        let report = concluded(ConsulBindingStatus::default(), plan, false, None, |_| {});
        let short = report.status.short_checksum.clone().expect("a short checksum");
        assert!(desired.starts_with(&short) && !short.is_empty());
        let told = report.events.iter().find_map(|e| match e {
            Event::Baselined(message) => Some(message.clone()),
            _ => None,
        });
        let told = told.expect("Baselined");
        assert!(told.contains(&format!("checksum {short} ")), "{told}");
    }
}
