//! The staged rollout's state machine, driven through whole reconciles over a small world of
//! Deployments whose health the tests set.

use std::time::Duration;

use consulbind_api::{
    ConsulBindingSpec, RolloutBudget, RolloutPhase, RolloutPolicy, RolloutWindow, TargetState, Wave, WindowKind,
    conditions::reason,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::*;
use crate::{
    cluster::{Version, health::Health},
    sim::waves::{World, canary, deploy},
};

fn canary_then_rest(pause: Option<&str>, max_parallel: Option<u32>) -> Vec<Wave> {
    vec![
        Wave { selector: Some(canary()), pause: pause.map(Into::into), ..Default::default() },
        Wave { max_parallel, ..Default::default() },
    ]
}

/// `content` written, the canary rolled alone for it, and healthy.
fn canary_healthy_on(world: &mut World, content: &str) {
    world.write(content);
    assert_eq!(world.tick(), ["canary"], "the canary rolls alone first");
    world.healthy("canary");
}

#[test]
fn a_canary_wave_rolls_alone_and_the_rest_follow_once_it_is_healthy_and_its_pause_is_over() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(Some("2m"), None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    assert_eq!(
        (world.ready().reason.as_str(), world.phase()),
        (reason::ROLLOUT_IN_PROGRESS, Some((1, RolloutPhase::Rolling)))
    );
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    assert_eq!(world.tick(), Vec::<String>::new(), "the rest wait for the canary's health");
    world.advance(Duration::from_secs(30));
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new(), "the pause starts once the canary is healthy");
    assert_eq!((world.ready().reason.as_str(), world.phase()), (reason::WAVE_PAUSED, Some((1, RolloutPhase::Paused))));
    assert_eq!(world.state("canary"), Some(TargetState::Healthy));
    world.advance(Duration::from_secs(119));
    assert_eq!(world.tick(), Vec::<String>::new());
    world.advance(Duration::from_secs(1));
    assert_eq!(world.tick(), ["web-a", "web-b"]);
    assert_eq!(world.phase(), Some((2, RolloutPhase::Rolling)));
    world.healthy("web-a");
    world.healthy("web-b");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!((world.ready().reason.as_str(), world.phase()), (reason::UP_TO_DATE, Some((2, RolloutPhase::Complete))));
    assert_eq!(world.status.applied_checksum, world.desired);
    assert_eq!(world.tick(), Vec::<String>::new(), "settled: nothing more");
    for name in ["canary", "web-a", "web-b"] {
        assert_eq!(world.rolls(name), 1, "{name}");
    }
}

#[test]
fn a_failed_canary_halts_the_rest_until_it_is_healthy_and_then_each_rolls_once() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(None, None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.fail("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    let ready = world.ready();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::ROLLOUT_HALTED));
    assert!(ready.message.contains("Deployment canary ProgressDeadlineExceeded"), "{}", ready.message);
    assert_eq!(world.state("canary"), Some(TargetState::Halted));
    world.advance(Duration::from_secs(3600));
    assert_eq!(world.tick(), Vec::<String>::new(), "a halt waits as long as it takes");
    world.healthy("canary");
    assert_eq!(world.tick(), ["web-a", "web-b"]);
    world.healthy("web-a");
    world.healthy("web-b");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!([world.rolls("canary"), world.rolls("web-a"), world.rolls("web-b")], [1, 1, 1]);
}

#[test]
fn a_target_not_healthy_within_the_health_timeout_halts_the_rollout() {
    let mut world = World::staged(&["canary", "web-a"], canary_then_rest(None, None));
    world.spec.rollout.as_mut().unwrap().health_timeout = Some("5m".into());
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.advance(Duration::from_secs(299));
    world.tick();
    assert_eq!(world.ready().reason, reason::ROLLOUT_IN_PROGRESS);
    world.advance(Duration::from_secs(1));
    world.tick();
    let ready = world.ready();
    assert_eq!(ready.reason, reason::ROLLOUT_HALTED);
    assert!(ready.message.contains("not healthy within 5m"), "{}", ready.message);
    assert_eq!(world.rolls("web-a"), 0);
}

#[test]
fn a_paused_canary_holds_the_rest_past_the_health_timeout_and_says_it_is_paused() {
    let mut world = World::staged(&["canary", "web-a"], canary_then_rest(None, None));
    world.spec.rollout.as_mut().unwrap().health_timeout = Some("5m".into());
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.health.insert(deploy("canary"), Health::Paused("paused (spec.paused): 0 of 1 replicas updated".into()));
    world.advance(Duration::from_secs(3600));
    world.tick();
    let ready = world.ready();
    assert_eq!(ready.reason, reason::ROLLOUT_IN_PROGRESS, "{}", ready.message);
    assert!(ready.message.contains("paused (spec.paused)"), "{}", ready.message);
    assert_eq!(world.rolls("web-a"), 0);
    world.healthy("canary");
    assert_eq!(world.tick(), ["web-a"], "resumed and healthy, the rest follow");
}

#[test]
fn max_parallel_rolls_a_wave_in_groups_as_each_becomes_healthy() {
    let names = ["a", "b", "c", "d", "e", "f"];
    let mut world = World::staged(&names, vec![Wave { max_parallel: Some(2), ..Default::default() }]);
    world.write("v2");
    assert_eq!(world.tick(), ["a", "b"]);
    assert_eq!(world.tick(), Vec::<String>::new());
    world.healthy("a");
    assert_eq!(world.tick(), ["c"], "one slot freed");
    world.healthy("b");
    world.healthy("c");
    assert_eq!(world.tick(), ["d", "e"]);
    world.healthy("d");
    world.healthy("e");
    assert_eq!(world.tick(), ["f"]);
    world.healthy("f");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert!(names.iter().all(|n| world.rolls(n) == 1));
}

#[test]
fn a_revert_during_a_halt_rolls_back_only_the_targets_that_received_the_bad_content() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(None, None));
    world.write("bad");
    assert_eq!(world.tick(), ["canary"]);
    world.fail("canary");
    world.tick();
    assert_eq!(world.ready().reason, reason::ROLLOUT_HALTED);
    world.write("v1");
    assert_eq!(world.tick(), ["canary"], "the revert starts again from the first wave");
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new(), "the others already carry the content");
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!([world.rolls("canary"), world.rolls("web-a"), world.rolls("web-b")], [2, 0, 0]);
}

#[test]
fn a_new_change_during_a_wave_supersedes_it_from_the_first_wave() {
    let mut world = World::staged(&["canary", "web-a"], canary_then_rest(None, None));
    canary_healthy_on(&mut world, "v2");
    assert_eq!(world.tick(), ["web-a"]);
    world.write("v3");
    assert_eq!(world.tick(), ["canary"], "web-a waits for the canary again");
    world.healthy("canary");
    world.healthy("web-a");
    assert_eq!(world.tick(), ["web-a"]);
    world.healthy("web-a");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!([world.rolls("canary"), world.rolls("web-a")], [2, 2]);
}

#[test]
fn a_rolling_canary_whose_content_changes_and_changes_back_still_gates_the_next_wave() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    // A change that waits for its quiet period leaves the canary behind for a while...
    let rollout = world.spec.rollout.as_mut().unwrap();
    (rollout.quiet_period, rollout.max_delay) = (Some("1h".into()), Some("2h".into()));
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::PENDING);
    // ...and its revert makes it current again, still not healthy.
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new(), "web waits for the canary's health");
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    world.healthy("canary");
    assert_eq!(world.tick(), ["web"]);
}

#[test]
fn a_budget_of_two_per_minute_gives_three_rollouts_for_five_changes_the_last_with_the_last_content() {
    let budget = RolloutBudget { max_rollouts: 2, per: "1m".into() };
    let mut world = World::new(&["web"], Vec::new(), Some(budget));
    for (i, value) in ["v2", "v3", "v4", "v5", "v6"].iter().enumerate() {
        world.write(value);
        let rolled = world.tick();
        assert_eq!(rolled.len(), usize::from(i < 2), "change {value}");
        world.advance(Duration::from_secs(5));
    }
    let ready = world.ready();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::ROLLOUT_BUDGET_EXHAUSTED));
    assert!(ready.message.contains("2026-11-26T03:01:00Z"), "{}", ready.message);
    assert_eq!(world.state("web"), Some(TargetState::Waiting));
    world.advance(Duration::from_secs(34));
    assert_eq!(world.tick(), Vec::<String>::new());
    world.advance(Duration::from_secs(1));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!(world.live[&deploy("web")].value, world.content[&deploy("web")]);
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    world.advance(Duration::from_secs(600));
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.rolls("web"), 3);
    assert!(world.status.targets[0].rolled_times.len() <= 2, "only the times within the span are kept");
}

#[test]
fn a_restart_in_the_middle_of_a_wave_or_a_pause_goes_on_from_the_status() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(Some("1m"), Some(1)));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    // A new replica: no debounce record, the status alone.
    world.restart();
    assert_eq!(world.tick(), Vec::<String>::new(), "the canary is still rolling");
    world.healthy("canary");
    world.tick();
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.restart();
    world.advance(Duration::from_secs(30));
    assert_eq!(world.tick(), Vec::<String>::new(), "the pause counts from when it began");
    world.advance(Duration::from_secs(30));
    world.restart();
    assert_eq!(world.tick(), ["web-a"]);
    world.restart();
    assert_eq!(world.tick(), Vec::<String>::new());
    world.healthy("web-a");
    assert_eq!(world.tick(), ["web-b"]);
    world.healthy("web-b");
    world.tick();
    assert_eq!([world.rolls("canary"), world.rolls("web-a"), world.rolls("web-b")], [1, 1, 1]);
}

#[test]
fn without_waves_or_a_budget_nothing_is_staged() {
    let spec = ConsulBindingSpec { rollout: Some(Box::new(RolloutPolicy::default())), ..Default::default() };
    assert_eq!(Staging::of(&spec, &Default::default()), Ok(None));
    let wave = |w: Wave| ConsulBindingSpec {
        rollout: Some(Box::new(RolloutPolicy { waves: vec![w], ..Default::default() })),
        ..Default::default()
    };
    let both = Wave { name: Some("a".into()), selector: Some(canary()), ..Default::default() };
    assert!(Staging::of(&wave(both), &Default::default()).unwrap_err().contains("both name and selector"));
    let long = Wave { pause: Some("25h".into()), ..Default::default() };
    assert!(Staging::of(&wave(long), &Default::default()).unwrap_err().contains("at most 24h"));
    assert_eq!(Budget::parse("3/1h"), Ok(Budget { max: 3, per: Duration::from_secs(3600) }));
    assert!(Budget::parse("0/1h").is_err() && Budget::parse("3").is_err() && Budget::parse("3/0s").is_err());
}

#[test]
fn a_canary_that_sours_during_its_pause_holds_the_next_wave_and_halts_once_it_fails() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("2m"), None));
    canary_healthy_on(&mut world, "v2");
    world.tick();
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.advance(Duration::from_secs(60));
    world.health.insert(deploy("canary"), Health::Progressing("1 of 2 updated replicas are available".into()));
    assert_eq!(world.tick(), Vec::<String>::new(), "the canary is not healthy");
    assert_eq!(
        (world.ready().reason.as_str(), world.state("canary")),
        (reason::ROLLOUT_IN_PROGRESS, Some(TargetState::Rolling))
    );
    world.advance(Duration::from_secs(61));
    assert_eq!(world.tick(), Vec::<String>::new(), "the pause is over, and the canary is still not healthy");
    world.fail("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(
        (world.ready().reason.as_str(), world.state("canary")),
        (reason::ROLLOUT_HALTED, Some(TargetState::Halted))
    );
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new(), "healthy again: its wave pauses afresh");
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.advance(Duration::from_secs(120));
    assert_eq!(world.tick(), ["web"]);
    world.healthy("web");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    // Once the rollout is complete, a target's later trouble is not the binding's.
    world.fail("canary");
    world.tick();
    assert_eq!(
        (world.ready().reason.as_str(), world.state("canary")),
        (reason::UP_TO_DATE, Some(TargetState::Healthy))
    );
}

#[test]
fn a_failed_patch_costs_no_budget_and_the_target_rolls_once_it_can() {
    let budget = RolloutBudget { max_rollouts: 1, per: "1h".into() };
    let mut world = World::new(&["web"], Vec::new(), Some(budget));
    world.refusing.insert(deploy("web"));
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::PATCH_FAILED);
    assert!(world.status.targets[0].rolled_times.is_empty(), "{:?}", world.status.targets[0]);
    world.refusing.clear();
    world.advance(Duration::from_secs(15));
    assert_eq!(world.tick(), ["web"], "the budget is whole");
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!(world.status.targets[0].rolled_times.len(), 1);
}

#[test]
fn a_rolling_target_whose_next_patch_fails_still_gates_the_next_wave() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.refusing.insert(deploy("canary"));
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.state("canary"), Some(TargetState::Rolling), "still rolling v2, not healthy");
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new(), "web waits for the canary's health");
    world.healthy("canary");
    assert_eq!(world.tick(), ["web"]);
}

#[test]
fn on_bind_rolls_through_the_waves_canary_first() {
    let waves = canary_then_rest(Some("1m"), Some(1));
    let rollout = RolloutPolicy { quiet_period: Some("0s".into()), on_bind: true, waves, ..Default::default() };
    let mut world = World::unbound(&["canary", "web-a", "web-b"], rollout);
    assert_eq!(world.tick(), ["canary"], "the canary first, not every target at once");
    assert_eq!(world.ready().reason, reason::ROLLOUT_IN_PROGRESS);
    assert_eq!(world.tick(), Vec::<String>::new());
    world.healthy("canary");
    world.tick();
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.advance(Duration::from_secs(60));
    assert_eq!(world.tick(), ["web-a"], "maxParallel 1");
    world.restart();
    assert_eq!(world.tick(), Vec::<String>::new(), "a restart goes on from the status");
    world.healthy("web-a");
    assert_eq!(world.tick(), ["web-b"]);
    world.healthy("web-b");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!(world.status.applied_checksum, world.desired);
    assert_eq!([world.rolls("canary"), world.rolls("web-a"), world.rolls("web-b")], [1, 1, 1]);
}

#[test]
fn on_bind_spends_the_budget() {
    let budget = Some(RolloutBudget { max_rollouts: 1, per: "1h".into() });
    let rollout = RolloutPolicy { quiet_period: Some("0s".into()), on_bind: true, budget, ..Default::default() };
    let mut world = World::unbound(&["web"], rollout);
    assert_eq!(world.tick(), ["web"]);
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new(), "the bind's rollout counts");
    assert_eq!(world.ready().reason, reason::ROLLOUT_BUDGET_EXHAUSTED);
}

#[test]
fn a_reference_added_to_a_target_not_yet_rolled_rolls_it_once_in_its_wave() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("1m"), None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.reference("web", true);
    assert_eq!(world.tick(), Vec::<String>::new(), "web waits for its wave");
    world.healthy("canary");
    world.tick();
    world.advance(Duration::from_secs(60));
    assert_eq!(world.tick(), ["web"]);
    world.healthy("web");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!([world.rolls("canary"), world.rolls("web")], [1, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_reference_added_to_a_rolled_target_during_its_pause_rolls_nothing_and_the_pause_goes_on() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("2m"), None));
    canary_healthy_on(&mut world, "v2");
    world.tick();
    let paused = world.status.rollout.clone().expect("a rollout");
    assert_eq!((paused.wave, paused.phase), (1, RolloutPhase::Paused));
    world.advance(Duration::from_secs(60));
    // Its pods start again by themselves, and read the ConfigMap as it is.
    world.reference("canary", true);
    assert_eq!(world.tick(), Vec::<String>::new(), "the canary runs its content already");
    let rollout = world.status.rollout.clone().expect("a rollout");
    assert_eq!((rollout.wave, rollout.phase, &rollout.since), (1, RolloutPhase::Paused, &paused.since));
    assert_eq!(rollout.started_time, paused.started_time, "the rollout goes on, not over");
    world.advance(Duration::from_secs(60));
    assert_eq!(world.tick(), ["web"], "at the end of the pause it began");
    world.healthy("web");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!([world.rolls("canary"), world.rolls("web")], [1, 1]);
    // Dropped during the next rollout, once rolled (in the second it began, after a quiet
    // period): nothing more either.
    world.spec.rollout.as_mut().unwrap().quiet_period = Some("1s".into());
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new());
    world.advance(Duration::from_secs(1));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(world.tick(), ["canary"]);
    world.healthy("canary");
    world.reference("canary", false);
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.advance(Duration::from_secs(120));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!([world.rolls("canary"), world.rolls("web")], [2, 2]);
}

#[test]
fn a_target_rolled_by_the_last_rollout_in_the_second_the_next_began_is_rolled_by_the_next() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(None, None));
    canary_healthy_on(&mut world, "v2");
    assert_eq!(world.tick(), ["web-a", "web-b"]);
    // Within the same second: a new change, and web-a's template gains a reference.
    world.write("v3");
    assert_eq!(world.tick(), ["canary"]);
    world.reference("web-a", true);
    world.healthy("canary");
    world.healthy("web-a");
    world.healthy("web-b");
    let mut rolled = world.tick();
    rolled.sort();
    assert_eq!(rolled, ["web-a", "web-b"], "web-a runs v2 still: rolled, not rebased");
}

fn window(kind: WindowKind, schedule: &str, duration: &str) -> RolloutWindow {
    RolloutWindow { kind: Some(kind), schedule: schedule.into(), duration: duration.into(), time_zone: None }
}

/// A world whose binding rolls in `waves` within `windows`; its clock starts at 03:00 UTC.
fn windowed(names: &[&str], waves: Vec<Wave>, windows: Vec<RolloutWindow>) -> World {
    let rollout = RolloutPolicy { quiet_period: Some("0s".into()), waves, windows, ..Default::default() };
    let mut world = World::unbound(names, rollout);
    world.tick();
    assert_eq!(world.ready().reason, reason::BASELINED);
    world
}

fn next_window(world: &World) -> Option<String> {
    world.status.rollout.as_ref().and_then(|r| r.next_window.as_ref()).map(|t| t.0.to_string())
}

#[test]
fn a_change_outside_the_windows_waits_for_the_next_and_later_changes_roll_with_it() {
    let mut world = windowed(&["web"], vec![], vec![window(WindowKind::Allow, "0 4 * * *", "1h")]);
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::OUTSIDE_ROLLOUT_WINDOW);
    assert!(world.ready().message.contains("opens, at 2026-11-26T04:00:00Z"), "{}", world.ready().message);
    assert_eq!(next_window(&world).as_deref(), Some("2026-11-26T04:00:00Z"));
    assert_eq!(world.phase(), Some((1, RolloutPhase::Waiting)));
    world.advance(Duration::from_secs(1800));
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new(), "a later change waits with the first");
    world.advance(Duration::from_secs(1799));
    assert_eq!(world.tick(), Vec::<String>::new());
    world.advance(Duration::from_secs(1));
    assert_eq!(world.tick(), ["web"], "the window opened");
    assert_eq!((world.ready().reason.as_str(), world.phase()), (reason::UP_TO_DATE, None));
    assert_eq!(world.status.applied_checksum, world.desired, "the latest content rolled");
    assert_eq!(world.rolls("web"), 1);
}

#[test]
fn a_window_that_closes_between_waves_lets_the_wave_under_way_finish_and_holds_the_next() {
    let stable = LabelSelector { match_labels: Some([("track".into(), "stable".into())].into()), ..Default::default() };
    // "last" is in no wave: it forms the last.
    let waves = vec![
        Wave { selector: Some(canary()), ..Default::default() },
        Wave { selector: Some(stable), max_parallel: Some(1), ..Default::default() },
    ];
    let windows = vec![window(WindowKind::Allow, "0 3 * * *", "30m")];
    let mut world = windowed(&["canary", "web-a", "web-b", "last"], waves, windows);
    world.labels.insert(deploy("last"), [("track".into(), "last".into())].into());
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.advance(Duration::from_secs(600));
    world.healthy("canary");
    assert_eq!(world.tick(), ["web-a"], "wave 2 starts inside the window, one at a time");
    world.advance(Duration::from_secs(1800));
    world.healthy("web-a");
    assert_eq!(world.tick(), ["web-b"], "the window closed, and the wave under way finishes");
    world.healthy("web-b");
    assert_eq!(world.tick(), Vec::<String>::new(), "the next wave waits for the next window");
    assert_eq!(
        (world.ready().reason.as_str(), world.phase()),
        (reason::OUTSIDE_ROLLOUT_WINDOW, Some((3, RolloutPhase::Waiting)))
    );
    assert_eq!(next_window(&world).as_deref(), Some("2026-11-27T03:00:00Z"));
    world.clock = "2026-11-27T03:00:00Z".parse().unwrap();
    assert_eq!(world.tick(), ["last"]);
    world.healthy("last");
    world.tick();
    assert_eq!((world.ready().reason.as_str(), world.phase()), (reason::UP_TO_DATE, Some((3, RolloutPhase::Complete))));
    for name in ["canary", "web-a", "web-b", "last"] {
        assert_eq!(world.rolls(name), 1, "{name}");
    }
}

#[test]
fn a_deny_window_holds_a_change_that_rolls_once_it_has_passed() {
    let mut world = windowed(&["web"], vec![], vec![window(WindowKind::Deny, "0 3 * * *", "20m")]);
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(next_window(&world).as_deref(), Some("2026-11-26T03:20:00Z"));
    world.advance(Duration::from_secs(1200));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!(world.rolls("web"), 1);
}

#[test]
fn the_annotation_naming_the_held_checksum_rolls_it_outside_the_windows_with_a_notice_and_nothing_after() {
    let mut world = windowed(&["web"], vec![], vec![window(WindowKind::Deny, "0 3 * * *", "1h")]);
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    let held = world.status.rollout.as_ref().unwrap().checksum.clone();
    world.let_through = Some("0123456789ab".into());
    assert_eq!(world.tick(), Vec::<String>::new(), "another checksum lets nothing through");
    world.let_through = Some(crate::checksum::short(&held).to_owned());
    assert!(world.ready().message.contains(&format!("roll-outside-window={}", crate::checksum::short(&held))));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!(world.events, [reason::ROLLED_OUTSIDE_WINDOW]);
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new(), "the next change keeps to the windows");
    assert_eq!(world.ready().reason, reason::OUTSIDE_ROLLOUT_WINDOW);
    assert_eq!(world.events.len(), 1);
}

/// Let through in its first wave, the rollout's event names the checksum it lets through, not
/// the one the targets all carried before.
#[test]
fn the_notice_of_a_wave_let_through_names_the_checksum_let_through() {
    let windows = vec![window(WindowKind::Deny, "0 3 * * *", "1h")];
    let mut world = windowed(&["canary", "web"], canary_then_rest(None, None), windows);
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    let held = crate::checksum::short(&world.status.rollout.as_ref().unwrap().checksum).to_owned();
    world.let_through = Some(held.clone());
    assert_eq!(world.tick(), ["canary"]);
    assert!(world.notes[0].contains(&format!("lets checksum {held} through")), "{}", world.notes[0]);
}

#[test]
fn a_restart_while_waiting_for_a_window_rolls_once_when_it_opens() {
    let mut world = windowed(&["web"], vec![], vec![window(WindowKind::Allow, "30 3 * * *", "10m")]);
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    world.restart();
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::OUTSIDE_ROLLOUT_WINDOW);
    world.advance(Duration::from_secs(1800));
    world.restart();
    assert_eq!(world.tick(), ["web"]);
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.rolls("web"), 1);
}

/// Waves simulator seed 684: a target that carries the content from a rollout that was
/// interrupted, and sours before the content comes back, holds the next wave.
#[tokio::test(start_paused = true)]
async fn a_target_that_carries_the_content_from_an_interrupted_rollout_is_judged_again_when_it_comes_back() {
    async fn pass(world: &mut World, secs: u64) {
        world.advance(Duration::from_secs(secs));
        tokio::time::advance(Duration::from_secs(secs)).await;
    }
    let budget = RolloutBudget { max_rollouts: 1, per: "1h".into() };
    let mut world = World::new(&["canary", "web"], canary_then_rest(Some("2m"), None), Some(budget));
    world.spec.rollout.as_mut().unwrap().quiet_period = Some("3s".into());
    world.write("v2");
    world.tick();
    pass(&mut world, 3).await;
    assert_eq!(world.tick(), ["canary"]);
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    // A change the budget holds at the canary, and back: the canary carries v2 and nothing
    // rolls it again.
    world.write("v3");
    world.tick();
    pass(&mut world, 3).await;
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::ROLLOUT_BUDGET_EXHAUSTED);
    world.write("v2");
    world.tick();
    assert_eq!(world.state("canary"), Some(TargetState::Healthy));
    world.health.insert(deploy("canary"), Health::Progressing("1 of 2 updated replicas are available".into()));
    pass(&mut world, 3).await;
    assert_eq!(world.tick(), Vec::<String>::new(), "web rolled after a canary that is not healthy");
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    world.healthy("canary");
    pass(&mut world, 120).await;
    assert_eq!([world.tick(), world.tick()].concat(), ["web"], "{:?}", world.ready());
}

/// With a quiet period of 0 s the canary rolls in the instant its rollout begins; the only
/// reference it drops then rolls nothing more.
#[test]
fn a_reference_dropped_by_a_canary_rolled_as_its_rollout_began_rolls_nothing_more() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("2m"), None));
    world.reference("canary", true);
    assert_eq!(world.tick(), Vec::<String>::new(), "a reference added with nothing in flight");
    canary_healthy_on(&mut world, "v2");
    world.reference("canary", false);
    assert_eq!(world.tick(), Vec::<String>::new(), "the canary runs its content already");
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.advance(Duration::from_secs(120));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!([world.rolls("canary"), world.rolls("web")], [1, 1]);
}

/// A patch that fails rolled nothing: its target is not shown rolling, while one of its wave
/// whose patch landed is.
#[test]
fn a_target_whose_patch_failed_is_not_shown_rolling_and_ready_says_so() {
    let mut world = World::staged(&["canary", "web-a", "web-b"], canary_then_rest(None, None));
    world.refusing.insert(deploy("canary"));
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.state("canary"), None, "it was never rolled");
    assert_eq!(world.ready().reason, reason::PATCH_FAILED, "{}", world.ready().message);
    world.refusing = [deploy("web-a")].into();
    world.advance(Duration::from_secs(15));
    assert_eq!(world.tick(), ["canary"]);
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    world.healthy("canary");
    assert_eq!(world.tick(), ["web-b"]);
    assert_eq!((world.state("web-a"), world.state("web-b")), (None, Some(TargetState::Rolling)));
    assert_eq!(world.ready().reason, reason::PATCH_FAILED, "not a wave in progress: {}", world.ready().message);
}

/// Waits and targets in messages read as people write them.
#[test]
fn waits_and_targets_read_as_people_write_them() {
    let secs = |s| human(Duration::from_secs(s));
    assert_eq!([secs(7200), secs(5400), secs(90), secs(60), secs(59)], ["2h", "90m", "90s", "1m", "59s"]);
    let five: Vec<Workload> =
        ["a", "b", "c", "d", "e"].map(|n| (consulbind_api::WorkloadKind::Deployment, n.to_owned())).into();
    assert_eq!(names(&five[..3]), "Deployment a, Deployment b, Deployment c");
    assert_eq!(names(&five), "Deployment a, Deployment b, Deployment c and 2 more");
    let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
    assert_eq!(until(later(now, Duration::from_secs(90)), now), Duration::from_secs(90));
    assert_eq!(until(now, later(now, Duration::from_secs(1))), Duration::ZERO, "passed");
}

/// While a wave rolls in groups, Ready says how many are left to roll in it, and says nothing
/// of the kind once none is.
#[test]
fn a_wave_in_groups_says_how_many_are_left_to_roll() {
    let mut world = World::staged(&["a", "b", "c"], vec![Wave { max_parallel: Some(2), ..Default::default() }]);
    world.write("v2");
    assert_eq!(world.tick(), ["a", "b"]);
    let message = world.ready().message;
    assert!(message.ends_with("; 1 more to roll in this wave"), "{message}");
    world.healthy("a");
    assert_eq!(world.tick(), ["c"]);
    let message = world.ready().message;
    assert!(message.contains("waiting for") && !message.contains("more to roll"), "{message}");
}

/// A target at its budget waits while one with budget left rolls.
#[test]
fn a_target_at_its_budget_waits_while_one_with_budget_left_rolls() {
    let budget = RolloutBudget { max_rollouts: 1, per: "1h".into() };
    let mut world = World::new(&["a", "b"], Vec::new(), Some(budget));
    world.refusing.insert(deploy("b"));
    world.write("v2");
    assert_eq!(world.tick(), ["a"], "b's patch fails, and costs it no budget");
    world.advance(Duration::from_secs(1));
    world.write("v3");
    world.refusing.clear();
    assert_eq!(world.tick(), ["b"]);
    assert_eq!(world.state("a"), Some(TargetState::Waiting));
    assert_eq!((world.rolls("a"), world.rolls("b")), (1, 1));
}

/// A rolled target is looked at again when its health timeout ends, not at the next health
/// poll, so that it halts on time; a target behind again waits for its next roll instead.
#[test]
fn a_rolled_target_is_looked_at_again_when_its_health_timeout_ends() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    world.spec.rollout.as_mut().unwrap().health_timeout = Some("10s".into());
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    assert_eq!(world.wake, Some(Duration::from_secs(10)));
    world.advance(Duration::from_secs(4));
    world.tick();
    let wake = world.wake.expect("a wake");
    assert_eq!(wake, Duration::from_secs(6) - Duration::from_micros(1));
    world.advance(wake - Duration::from_micros(1));
    world.tick();
    assert_eq!(
        (world.ready().reason.as_str(), world.state("canary")),
        (reason::ROLLOUT_HALTED, Some(TargetState::Halted))
    );
    // A change waiting out its quiet period wakes at its end, not at the timeout of the roll
    // it supersedes.
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    world.spec.rollout.as_mut().unwrap().health_timeout = Some("20s".into());
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.spec.rollout.as_mut().unwrap().quiet_period = Some("30s".into());
    world.advance(Duration::from_secs(5));
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::PENDING);
    let wake = world.wake.expect("a wake");
    assert!(wake > Duration::from_secs(29), "{wake:?}");
}

/// A roll leaves the budget's span `per` after it: at that instant, which the hold names, the
/// target may roll again.
#[test]
fn a_roll_leaves_the_budget_at_the_end_of_its_span() {
    let budget = RolloutBudget { max_rollouts: 1, per: "1h".into() };
    let mut world = World::new(&["web"], Vec::new(), Some(budget));
    world.write("v2");
    assert_eq!(world.tick(), ["web"]);
    world.write("v3");
    world.advance(Duration::from_secs(3600) - Duration::from_micros(2));
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.state("web"), Some(TargetState::Waiting));
    assert_eq!(world.tick(), ["web"], "an hour after the first");
}

/// A revert rolled back on the canary alone is complete once the canary is healthy: no pause
/// before waves with nothing to roll.
#[test]
fn a_wave_with_nothing_after_it_to_roll_does_not_pause() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("10m"), None));
    world.write("bad");
    assert_eq!(world.tick(), ["canary"]);
    world.fail("canary");
    world.tick();
    canary_healthy_on(&mut world, "v1");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!((world.ready().reason.as_str(), world.phase()), (reason::UP_TO_DATE, Some((2, RolloutPhase::Complete))));
}

/// The next wave starts at the instant its pause ends, and the binding wakes for it.
#[test]
fn the_next_wave_starts_at_the_instant_the_pause_ends() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("2m"), None));
    canary_healthy_on(&mut world, "v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::WAVE_PAUSED);
    let wake = world.wake.expect("a wake at the pause's end");
    assert_eq!(wake, Duration::from_secs(120));
    world.advance(wake - Duration::from_micros(1));
    assert_eq!(world.tick(), ["web"]);
}

/// A wave whose targets partly carry the content already has not started: outside the windows
/// it waits, as any wave not under way.
#[test]
fn a_wave_whose_targets_partly_carry_the_content_waits_for_a_window() {
    let waves = vec![Wave { selector: Some(canary()), ..Default::default() }];
    let windows = vec![window(WindowKind::Allow, "0 3 * * *", "30m")];
    let rollout = RolloutPolicy { quiet_period: Some("0s".into()), waves, windows, ..Default::default() };
    let mut world = World::unbound(&["canary", "web-a", "web-b"], rollout);
    world.refs = [deploy("canary"), deploy("web-a")].into();
    world.tick();
    assert_eq!(world.ready().reason, reason::BASELINED);
    world.cm = "c2".into();
    assert_eq!(world.tick(), ["canary"], "the ConfigMap changed: the targets that read it roll");
    world.healthy("canary");
    world.advance(Duration::from_secs(1800));
    assert_eq!(world.tick(), Vec::<String>::new(), "web-b carries the content; web-a waits for the window");
    assert_eq!(world.ready().reason, reason::OUTSIDE_ROLLOUT_WINDOW);
    assert_eq!(world.rolls("web-a"), 0);
}

/// Without waves, a change held by the windows names no wave.
#[test]
fn without_waves_a_change_held_by_the_windows_names_no_wave() {
    let mut world = windowed(&["web"], vec![], vec![window(WindowKind::Allow, "0 4 * * *", "1h")]);
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    let message = world.ready().message;
    assert!(message.starts_with("outside the rollout windows"), "{message}");
}

/// With every target of the last wave rolled, TargetsUpdated still says the rollout is in
/// progress until they are healthy: carrying the content is not having it applied.
#[test]
fn targets_are_updated_only_once_the_last_wave_is_healthy() {
    let updated = |world: &World| {
        let found = world.status.conditions.iter().find(|c| c.type_ == consulbind_api::conditions::TARGETS_UPDATED);
        found.map(|c| (c.status.clone(), c.reason.clone())).expect("TargetsUpdated")
    };
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    canary_healthy_on(&mut world, "v2");
    assert_eq!(world.tick(), ["web"]);
    assert_eq!(updated(&world), ("False".into(), reason::ROLLOUT_IN_PROGRESS.into()));
    world.healthy("web");
    world.tick();
    assert_eq!(updated(&world), ("True".into(), reason::UP_TO_DATE.into()));
}

/// A status write that fails after the stamps landed leaves its status owed: the next reconcile
/// plans on it, and stamps nothing until a status records what landed. Here the budget the
/// roll spent holds the next change, which rolled again before (the retry planned on the status
/// the API server held).
#[test]
fn a_status_write_that_fails_after_a_roll_spends_the_budget_all_the_same() {
    let budget = RolloutBudget { max_rollouts: 1, per: "1h".into() };
    let mut world = World::new(&["web"], Vec::new(), Some(budget));
    world.write("v2");
    world.status_fails = true;
    assert_eq!(world.tick(), ["web"]);
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new(), "nothing rolls before the status records the roll");
    world.status_fails = false;
    assert_eq!(world.tick(), Vec::<String>::new(), "the owed status is written first");
    assert_eq!(world.status.targets[0].rolled_times.len(), 1, "{:?}", world.status.targets[0]);
    assert_eq!(world.tick(), Vec::<String>::new(), "the budget is spent");
    assert_eq!(world.ready().reason, reason::ROLLOUT_BUDGET_EXHAUSTED);
    assert_eq!(world.rolls("web"), 1);
}

/// The canary's roll, whose status write failed, still starts its wave's pause, and the rest
/// wait for it: the retry does not take the canary for one that needed no roll.
#[test]
fn a_status_write_that_fails_after_the_canary_rolled_keeps_its_pause() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("2m"), None));
    world.write("v2");
    world.status_fails = true;
    assert_eq!(world.tick(), ["canary"]);
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    world.advance(Duration::from_secs(10));
    world.status_fails = false;
    assert_eq!(world.tick(), Vec::<String>::new(), "the owed status is written first");
    assert_eq!(world.tick(), Vec::<String>::new(), "the canary's pause");
    assert_eq!((world.ready().reason.as_str(), world.phase()), (reason::WAVE_PAUSED, Some((1, RolloutPhase::Paused))));
    world.advance(Duration::from_secs(120));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!((world.rolls("canary"), world.rolls("web")), (1, 1));
}

/// A patch that fails once the quiet period is over leaves the retry to roll at once: the change
/// settled, and the failure does not make it wait out a second quiet period.
#[tokio::test(start_paused = true)]
async fn a_patch_that_fails_after_the_quiet_period_rolls_at_the_retry_without_a_second_one() {
    let mut world = World::new(&["web"], Vec::new(), None);
    world.spec.rollout.as_mut().expect("a rollout").quiet_period = Some("30s".into());
    world.refusing.insert(deploy("web"));
    world.write("v2");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::PENDING);
    world.advance(Duration::from_secs(30));
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::PATCH_FAILED);
    world.refusing.clear();
    world.advance(Duration::from_secs(15));
    tokio::time::advance(Duration::from_secs(15)).await;
    assert_eq!(world.tick(), ["web"], "the retry waited for a second quiet period");
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
}

/// The canary rolled, and its status write failed until the replica stopped: the next one finds
/// the roll on the canary itself, records it at the second its stamp was set, and keeps the
/// canary's health gate and pause.
#[test]
fn a_canary_roll_no_status_recorded_before_a_restart_keeps_its_gate_and_pause() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("1h"), None));
    world.status_fails = true;
    world.advance(Duration::from_millis(700));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.restart();
    world.status_fails = false;
    world.advance(Duration::from_secs(10));
    assert_eq!(world.tick(), Vec::<String>::new(), "recorded first");
    assert_eq!(world.ready().reason, reason::PENDING);
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    let canary = world.status.targets.iter().find(|t| t.name == "canary").unwrap().clone();
    let rolled = canary.last_rolled_time.expect("the canary's roll").0;
    let second = |t: Timestamp| t.as_second();
    assert_eq!(second(rolled), second(world.clock) - 10 + 1, "the end of the second of its stamp");
    assert_eq!(world.tick(), Vec::<String>::new(), "web waits for the canary's health");
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.advance(Duration::from_secs(3599));
    assert_eq!(world.tick(), Vec::<String>::new());
    world.advance(Duration::from_secs(1));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!([world.rolls("canary"), world.rolls("web")], [1, 1]);
}

/// The same where another target's template references a ConfigMap, so that the canary's
/// content is not the whole's: the roll found on it is of this rollout all the same, which goes
/// on from it with no second start.
#[test]
fn a_canary_roll_no_status_recorded_is_of_the_rollout_though_another_target_reads_more() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("1h"), None));
    world.reference("web", true);
    world.tick();
    world.status_fails = true;
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    let started = world.clock;
    world.restart();
    world.status_fails = false;
    world.advance(Duration::from_secs(10));
    assert_eq!(world.tick(), Vec::<String>::new(), "recorded first");
    let rollout = world.status.rollout.clone().expect("the rollout found");
    assert_eq!(Some(&rollout.checksum), world.desired.as_ref(), "of the whole content");
    assert_eq!(rollout.started_time.0.as_second(), started.as_second() + 1);
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    assert_eq!(world.status.rollout.as_ref().map(|r| &r.started_time), Some(&rollout.started_time), "not started over");
    world.advance(Duration::from_secs(3600));
    assert_eq!(world.tick(), ["web"]);
    assert_eq!([world.rolls("canary"), world.rolls("web")], [1, 1]);
}

/// The same, with Consul away when the controller starts again: until the content is read, the
/// roll cannot be told from the canary's own checksum, so the binding shows Consul away and
/// records nothing; once it is read, the roll is of the rollout, and its pause is kept.
#[test]
fn a_canary_roll_no_status_recorded_found_while_consul_is_away_keeps_its_pause() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("1h"), None));
    world.reference("web", true);
    world.tick();
    world.status_fails = true;
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.restart();
    world.status_fails = false;
    world.consul_down = true;
    world.advance(Duration::from_secs(10));
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::CONSUL_UNREACHABLE);
    world.consul_down = false;
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new(), "recorded first");
    assert_eq!(world.status.rollout.as_ref().map(|r| &r.checksum), world.desired.as_ref());
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)), "{}", world.ready().message);
    world.advance(Duration::from_secs(1800));
    assert_eq!(world.tick(), Vec::<String>::new(), "web waits out the canary's pause");
    world.advance(Duration::from_secs(1800));
    assert_eq!(world.tick(), ["web"]);
}

/// A patch that landed though its answer was lost counts as the roll it was: the budget is
/// spent, and the next change waits for it.
#[test]
fn a_patch_that_landed_though_its_answer_was_lost_spends_the_budget() {
    let budget = RolloutBudget { max_rollouts: 1, per: "1h".into() };
    let mut world = World::new(&["web"], Vec::new(), Some(budget));
    world.unanswered.insert(deploy("web"));
    world.write("v2");
    assert_eq!(world.tick(), ["web"]);
    assert_eq!(world.ready().reason, reason::PATCH_FAILED);
    world.unanswered.clear();
    world.advance(Duration::from_secs(15));
    assert_eq!(world.tick(), Vec::<String>::new(), "web carries v2");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    assert_eq!(world.status.targets[0].rolled_times.len(), 1, "{:?}", world.status.targets[0]);
    world.write("v3");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::ROLLOUT_BUDGET_EXHAUSTED);
    assert_eq!(world.rolls("web"), 1);
}

/// A canary whose patch landed though its answer was lost is judged and paused for like one
/// whose answer came.
#[test]
fn a_canary_whose_patch_answer_was_lost_still_gates_the_next_wave() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("1m"), None));
    world.unanswered.insert(deploy("canary"));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.unanswered.clear();
    world.advance(Duration::from_secs(15));
    assert_eq!(world.tick(), Vec::<String>::new(), "recorded first");
    assert_eq!(world.tick(), Vec::<String>::new(), "web waits for the canary's health");
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    world.healthy("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.advance(Duration::from_secs(60));
    assert_eq!(world.tick(), ["web"]);
}

/// A canary that rolled v2 and failed, halting the rollout, then deleted.
fn halted_canary_deleted() -> World {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.fail("canary");
    world.tick();
    assert_eq!(world.ready().reason, reason::ROLLOUT_HALTED);
    world.delete("canary");
    world
}

/// A halted canary deleted, then made again from its manifest (a GitOps tool's way to unstick
/// it), holds the rest: while it is gone, and until the one made again is healthy. Then the
/// rest roll, once.
#[test]
fn a_halted_canary_deleted_and_made_again_holds_the_rest_until_it_is_healthy() {
    let mut world = halted_canary_deleted();
    assert_eq!(world.tick(), Vec::<String>::new(), "held while the canary is gone");
    assert_eq!(world.ready().reason, reason::ROLLOUT_HALTED, "{}", world.ready().message);
    assert_eq!(world.tick(), Vec::<String>::new(), "still held");
    world.make_again("canary");
    assert_eq!(world.tick(), Vec::<String>::new(), "held while the canary made again is not healthy");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::ROLLOUT_IN_PROGRESS, "{}", world.ready().message);
    assert_eq!(world.state("canary"), Some(TargetState::Rolling), "judged as rolled when found");
    world.healthy("canary");
    assert_eq!(world.tick(), ["web"]);
    assert_eq!(world.rolls("web"), 1);
}

/// The edit that would release the halt, made while the binding is refused (its token Secret
/// spoilt, say), still releases it once the binding is served again.
#[test]
fn an_edit_made_while_the_binding_is_refused_still_releases_a_deleted_canarys_halt() {
    let mut world = halted_canary_deleted();
    assert_eq!(world.tick(), Vec::<String>::new());
    world.refused = true;
    world.generation += 1;
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::TOKEN_SECRET_INVALID);
    world.refused = false;
    assert_eq!(world.tick(), ["web"], "the edit releases it");
}

/// A canary made again that never becomes healthy (a StatefulSet or a DaemonSet reports no
/// failure of its own) halts the rollout once the health timeout has passed since it was made.
#[test]
fn a_canary_made_again_that_stays_progressing_halts_at_the_health_timeout() {
    let mut world = halted_canary_deleted();
    world.spec.rollout.as_mut().unwrap().health_timeout = Some("5m".into());
    world.tick();
    world.advance(Duration::from_secs(600));
    world.make_again("canary");
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::ROLLOUT_IN_PROGRESS, "{}", world.ready().message);
    world.advance(Duration::from_secs(298));
    world.tick();
    assert_eq!(world.ready().reason, reason::ROLLOUT_IN_PROGRESS, "{}", world.ready().message);
    world.advance(Duration::from_secs(2));
    world.tick();
    let ready = world.ready();
    assert_eq!(ready.reason, reason::ROLLOUT_HALTED);
    assert!(ready.message.contains("not healthy within 5m"), "{}", ready.message);
    world.healthy("canary");
    assert_eq!(world.tick(), ["web"]);
}

/// A target an earlier rollout rolled, that this one does not (it reads less than the one that
/// changed), progressing for its own reasons (a scale-up), is timed from this rollout, also at
/// the look that starts it: it holds its wave, it does not halt it at once.
#[test]
fn a_target_not_rolled_and_progressing_as_a_rollout_starts_is_timed_from_its_start() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    world.reference("web", true);
    world.tick();
    // Rolled by an earlier rollout, an hour ago.
    canary_healthy_on(&mut world, "v2");
    assert_eq!(world.tick(), ["web"]);
    world.healthy("web");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    world.advance(Duration::from_secs(3600));
    world.health.insert(deploy("canary"), Health::Progressing("1 of 2 replicas available".into()));
    world.cm = "changed".into();
    assert_eq!(world.tick(), Vec::<String>::new(), "web waits for the canary's wave");
    assert_eq!(world.ready().reason, reason::ROLLOUT_IN_PROGRESS, "{}", world.ready().message);
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    world.healthy("canary");
    assert_eq!(world.tick(), ["web"]);
}

/// The same for a canary still rolling when the binding was refused, deleted and the binding
/// edited meanwhile: no served look saw it gone, and the edit releases the rest all the same.
#[test]
fn a_canary_deleted_and_an_edit_both_while_the_binding_is_refused_release_the_rest() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    world.write("v2");
    assert_eq!(world.tick(), ["canary"]);
    world.health.insert(deploy("canary"), Health::Progressing("0 of 1 replicas available".into()));
    world.tick();
    assert_eq!(world.state("canary"), Some(TargetState::Rolling));
    world.refused = true;
    world.tick();
    world.delete("canary");
    world.generation += 1;
    world.tick();
    world.refused = false;
    assert_eq!(world.tick(), ["web"], "the edit releases it");
}

/// A long-standing workload first found late in a rollout (labelled into the canary's selector
/// during a long pause) that is progressing for its own reasons is timed from when the rollout
/// first judged it: it holds the rest, and halts them only once `healthTimeout` has passed
/// since then.
#[test]
fn a_workload_found_late_in_a_rollout_is_timed_from_when_it_was_found() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(Some("1h"), None));
    canary_healthy_on(&mut world, "v2");
    world.tick();
    assert_eq!(world.phase(), Some((1, RolloutPhase::Paused)));
    world.advance(Duration::from_secs(1200));
    let late = deploy("canary-late");
    world.versions.insert(late.clone(), Version { uid: "uid-late".into(), generation: 3 });
    world.labels.insert(late.clone(), [("track".to_owned(), "canary".to_owned())].into());
    world.health.insert(late.clone(), Health::Progressing("1 of 2 replicas available".into()));
    world.found.push(late);
    world.found.sort();
    world.tick();
    assert_eq!(world.state("canary-late"), Some(TargetState::Rolling), "{}", world.ready().message);
    world.advance(Duration::from_secs(599));
    world.tick();
    assert_eq!(world.state("canary-late"), Some(TargetState::Rolling), "{}", world.ready().message);
    world.advance(Duration::from_secs(1));
    world.tick();
    let ready = world.ready();
    assert_eq!(ready.reason, reason::ROLLOUT_HALTED);
    assert!(ready.message.contains("not healthy within 10m"), "{}", ready.message);
    assert_eq!(world.rolls("web"), 0);
}

/// A change held while the binding is suspended writes nothing new at each look: the targets
/// judged while it waits keep the judgement times they had.
#[test]
fn a_change_held_by_a_suspend_leaves_the_status_as_it_is() {
    let mut world = World::staged(&["canary", "web"], canary_then_rest(None, None));
    canary_healthy_on(&mut world, "v2");
    assert_eq!(world.tick(), ["web"]);
    world.healthy("web");
    world.tick();
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
    world.spec.suspend = true;
    world.write("v3");
    world.tick();
    let held = world.status.clone();
    world.advance(Duration::from_secs(60));
    assert_eq!(world.tick(), Vec::<String>::new());
    assert!(!crate::reconcile::report::needs_write(&held, &world.status), "{:?}", world.status.targets);
}

/// The halt kept for a deleted canary writes nothing new at each look: its record keeps the
/// time it halted.
#[test]
fn a_halt_kept_for_a_deleted_canary_leaves_the_status_as_it_is() {
    let mut world = halted_canary_deleted();
    world.advance(Duration::from_secs(30));
    world.tick();
    let held = world.status.clone();
    world.advance(Duration::from_secs(30));
    world.tick();
    assert_eq!(world.ready().reason, reason::ROLLOUT_HALTED);
    assert!(!crate::reconcile::report::needs_write(&held, &world.status), "{:?}", world.status.rollout);
}

/// A halted canary deleted for good is released by an edit of the binding (a person's word:
/// the spec may no longer name it), or by a new change.
#[test]
fn a_halted_canary_deleted_for_good_is_released_by_an_edit_of_the_binding() {
    let mut world = halted_canary_deleted();
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::ROLLOUT_HALTED);
    world.generation += 1;
    assert_eq!(world.tick(), ["web"], "the edit releases it");
    world.healthy("web");
    world.tick();
    assert_eq!(world.tick(), Vec::<String>::new());
    assert_eq!(world.ready().reason, reason::UP_TO_DATE);
}
