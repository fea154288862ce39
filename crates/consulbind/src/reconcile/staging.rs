//! A binding's rules for staging its rollouts, as its spec and the controller's flags give them:
//! waves, a health timeout, a budget and rollout windows.

use std::{collections::BTreeMap, time::Duration};

use consulbind_api::{ConsulBindingSpec, WorkloadKind, parse_duration, parse_rate};
use kube::core::{Selector, SelectorExt};

pub use super::calendar::{Calendar, Gate};
use crate::cluster::{Workload, selector};

/// The longest `healthTimeout`, `pause` or budget span a binding may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// `healthTimeout` when the spec sets none.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(600);
/// A binding's rules for staging its rollouts.
#[derive(Clone, Debug)]
#[cfg_attr(test, derive(PartialEq))]
pub struct Staging {
    pub waves: Vec<WaveRule>,
    pub health_timeout: Duration,
    pub budget: Option<Budget>,
    /// When rollouts may start; none: at any time.
    pub windows: Calendar,
    /// The checksum the binding's `consulbind.dev/roll-outside-window` annotation lets roll
    /// outside the windows.
    pub let_through: Option<String>,
}

/// What a binding without rules of its own stages its rollouts by: the controller's flags.
#[derive(Clone, Debug, Default)]
pub struct Defaults {
    pub budget: Option<Budget>,
    pub windows: Calendar,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WaveRule {
    kind: Option<WorkloadKind>,
    name: Option<String>,
    selector: Option<Selector>,
    pub(crate) max_parallel: Option<u32>,
    pub(crate) pause: Duration,
}

/// At most `max` rollouts of each target within any span of `per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub max: u32,
    pub per: Duration,
}

impl Budget {
    /// `N/span`, as the controller's `--default-rollout-budget` takes it, such as `3/1h`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (max, per) = parse_rate(text, "3/1h")?;
        bounded(max, per, "the rollout budget")
    }
}

fn budget(max: u32, per: &str, field: &str) -> Result<Budget, String> {
    bounded(max, duration(per, field)?, field)
}

fn bounded(max: u32, per: Duration, field: &str) -> Result<Budget, String> {
    if !(1..=100).contains(&max) {
        return Err(format!("{field} allows {max} rollouts; between 1 and 100 are allowed"));
    }
    if per.is_zero() {
        return Err(format!("{field}: the span is zero"));
    }
    if per > MAX_WAIT {
        return Err(format!("{field} spans {per:?}; at most 24h is allowed"));
    }
    Ok(Budget { max, per })
}

fn duration(text: &str, field: &str) -> Result<Duration, String> {
    let value = parse_duration(text).map_err(|e| format!("{field}: {e}"))?;
    match value <= MAX_WAIT {
        true => Ok(value),
        false => Err(format!("{field} is {text}; at most 24h is allowed")),
    }
}

impl Staging {
    /// Whether a wave selects its targets by label.
    pub fn selects_by_label(&self) -> bool {
        self.waves.iter().any(|w| w.selector.is_some())
    }

    /// The binding's staging rules, with the `defaults` for a binding without a budget or
    /// windows of its own; `None` when it has no waves, budget or windows.
    pub fn of(spec: &ConsulBindingSpec, defaults: &Defaults) -> Result<Option<Self>, String> {
        let rollout = spec.rollout.clone().unwrap_or_default();
        let mut waves = Vec::new();
        for (i, wave) in rollout.waves.iter().enumerate() {
            let field = format!("spec.rollout.waves[{i}]");
            if wave.name.is_some() && wave.selector.is_some() {
                return Err(format!("{field} sets both name and selector; set at most one"));
            }
            if wave.max_parallel == Some(0) {
                return Err(format!("{field}.maxParallel is 0; at least 1 target must be able to roll"));
            }
            let selector = match &wave.selector {
                None => None,
                Some(s) => match selector::label_selector_error(s) {
                    Some(problem) => return Err(format!("{field}.selector: {problem}")),
                    None => Selector::try_from(s.clone()).ok(),
                },
            };
            let pause = match &wave.pause {
                Some(text) => duration(text, &format!("{field}.pause"))?,
                None => Duration::ZERO,
            };
            let (kind, name, max_parallel) = (wave.kind, wave.name.clone(), wave.max_parallel);
            waves.push(WaveRule { kind, name, selector, max_parallel, pause });
        }
        let health_timeout = match &rollout.health_timeout {
            Some(text) => duration(text, "spec.rollout.healthTimeout")?,
            None => DEFAULT_HEALTH_TIMEOUT,
        };
        let budget = match &rollout.budget {
            Some(b) => Some(budget(b.max_rollouts, &b.per, "spec.rollout.budget")?),
            None => defaults.budget,
        };
        let windows = match rollout.windows.is_empty() {
            true => defaults.windows.clone(),
            false => Calendar::of(&rollout.windows, "spec.rollout.windows")?,
        };
        let staged = !waves.is_empty() || budget.is_some() || !windows.is_empty();
        Ok(staged.then_some(Self { waves, health_timeout, budget, windows, let_through: None }))
    }

    /// The wave a target belongs to: the first whose filter takes it, else the last.
    pub(crate) fn wave_of(&self, w: &Workload, labels: Option<&BTreeMap<String, String>>) -> usize {
        let empty = BTreeMap::new();
        let labels = labels.unwrap_or(&empty);
        let takes = |rule: &WaveRule| {
            rule.kind.is_none_or(|k| k == w.0)
                && rule.name.as_ref().is_none_or(|n| *n == w.1)
                && rule.selector.as_ref().is_none_or(|s| s.matches(labels))
        };
        self.waves.iter().position(takes).unwrap_or(self.waves.len())
    }
}

#[cfg(test)]
mod tests {
    use consulbind_api::{RolloutBudget, RolloutPolicy, Wave};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    fn staged(policy: RolloutPolicy) -> Result<Option<Staging>, String> {
        Staging::of(&ConsulBindingSpec { rollout: Some(Box::new(policy)), ..Default::default() }, &Default::default())
    }

    /// Every wait may span a whole day, and no more.
    #[test]
    fn a_wait_of_a_day_is_allowed_and_longer_is_not() {
        let day = Duration::from_secs(24 * 3600);
        let budget = |per: &str| RolloutBudget { max_rollouts: 3, per: per.into() };
        let staging = staged(RolloutPolicy {
            waves: vec![Wave { pause: Some("24h".into()), ..Default::default() }],
            health_timeout: Some("24h".into()),
            budget: Some(budget("24h")),
            ..Default::default()
        });
        let staging = staging.unwrap().unwrap();
        assert_eq!((staging.waves[0].pause, staging.health_timeout), (day, day));
        assert_eq!(staging.budget, Some(Budget { max: 3, per: day }));
        let over = staged(RolloutPolicy { budget: Some(budget("24h1s")), ..Default::default() });
        assert!(over.unwrap_err().contains("at most 24h"));
        assert!(Budget::parse("3/25h").is_err() && Budget::parse("3/24h").is_ok());
    }

    /// Only a wave with a label selector needs the targets' labels.
    #[test]
    fn labels_are_wanted_only_by_a_wave_that_selects_by_label() {
        let selector =
            LabelSelector { match_labels: Some([("tier".into(), "canary".into())].into()), ..Default::default() };
        let by_label = Wave { selector: Some(selector), ..Default::default() };
        let by_name = Wave { name: Some("web".into()), ..Default::default() };
        let waves = |waves: Vec<Wave>| staged(RolloutPolicy { waves, ..Default::default() }).unwrap().unwrap();
        assert!(waves(vec![by_name.clone(), by_label]).selects_by_label());
        assert!(!waves(vec![by_name, Wave::default()]).selects_by_label());
    }

    /// A target goes to the first wave whose kind, name and labels all take it; one that none
    /// takes, after the last.
    #[test]
    fn a_target_goes_to_the_first_wave_that_takes_it() {
        let canary: BTreeMap<String, String> = [("tier".into(), "canary".into())].into();
        let selector = LabelSelector { match_labels: Some(canary.clone()), ..Default::default() };
        let waves = vec![
            Wave { name: Some("first".into()), ..Default::default() },
            Wave { kind: Some(WorkloadKind::StatefulSet), ..Default::default() },
            Wave { selector: Some(selector), ..Default::default() },
        ];
        let staging = staged(RolloutPolicy { waves, ..Default::default() }).unwrap().unwrap();
        let deploy = |name: &str| (WorkloadKind::Deployment, name.to_owned());
        assert_eq!(staging.wave_of(&deploy("first"), None), 0);
        assert_eq!(staging.wave_of(&(WorkloadKind::StatefulSet, "db".into()), None), 1);
        assert_eq!(staging.wave_of(&deploy("web"), Some(&canary)), 2);
        assert_eq!(staging.wave_of(&deploy("web"), None), 3);
    }
}
