//! The planner: shares the blocking slots among the scopes and cuts each scope's paths into its
//! share of groups (see [`consul_kv::group`]), starting, handing over and retiring the groups'
//! runners. Groups whose key and paths stay the same keep running untouched.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use consul_kv::{
    KvQuery,
    group::{self, Scope, WatchPath},
};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{debug, info, warn};

use super::{
    path::Path,
    runner::{ROTATION_WAIT, Roster, Runner},
};

/// A group younger than this, when no longer needed, finishes its request (its wait is no
/// longer than its age) instead of dropping it: a dropped request leaves a socket closing
/// outside the connection budget for a moment, and cold starts replace many young groups.
const RETIRE_YOUNG: Duration = Duration::from_secs(30);

/// A running group: its roster, which the planner may hand over, and its runner.
pub struct GroupHandle {
    roster: watch::Sender<Arc<Roster>>,
    task: JoinHandle<()>,
    born: Instant,
}

impl GroupHandle {
    pub fn roster(&self) -> Arc<Roster> {
        self.roster.borrow().clone()
    }
}

impl Drop for GroupHandle {
    fn drop(&mut self) {
        // Dropping the roster sender tells the task to stop once its request is done.
        if self.born.elapsed() >= RETIRE_YOUNG {
            self.task.abort();
        }
    }
}

/// Plans the groups for `paths`, updating `groups` in place: kept groups get their new roster,
/// new ones start, and the ones no longer needed stop.
pub fn plan(runner: &Arc<Runner>, paths: &HashMap<KvQuery, Arc<Path>>, groups: &mut HashMap<KvQuery, GroupHandle>) {
    let mut scopes: BTreeMap<Scope, Vec<(WatchPath, Arc<Path>)>> = BTreeMap::new();
    for (query, path) in paths {
        let watch_path = WatchPath { key: query.key.clone(), recurse: query.recurse };
        scopes.entry(Scope::of(query)).or_default().push((watch_path, path.clone()));
    }
    let slots = runner.consul.blocking_slots();
    let shares = group::shares(&scopes.values().map(Vec::len).collect::<Vec<_>>(), slots);

    let mut current: HashMap<Scope, Vec<(String, bool)>> = HashMap::new();
    for query in groups.keys() {
        current.entry(Scope::of(query)).or_default().push((query.key.clone(), query.recurse));
    }
    let mut planned: HashMap<KvQuery, (Vec<WatchPath>, Vec<Arc<Path>>)> = HashMap::new();
    for ((scope, mut paths), share) in scopes.into_iter().zip(shares) {
        paths.sort_by(|a, b| a.0.cmp(&b.0));
        let (watch_paths, cells): (Vec<WatchPath>, Vec<Arc<Path>>) = paths.into_iter().unzip();
        // Paths too large to share a read get one each; the rest share what is left.
        let (solo, shared_paths): (Vec<usize>, Vec<usize>) = (0..cells.len()).partition(|&i| cells[i].solo());
        let solo_keys: HashSet<(&str, bool)> =
            solo.iter().map(|&i| (watch_paths[i].key.as_str(), watch_paths[i].recurse)).collect();
        let current: Vec<(String, bool)> = current
            .remove(&scope)
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, recurse)| !solo_keys.contains(&(key.as_str(), *recurse)))
            .collect();
        let rest: Vec<WatchPath> = shared_paths.iter().map(|&i| watch_paths[i].clone()).collect();
        let share = share.saturating_sub(solo.len()).max(1);
        let mut cut: Vec<(String, bool, Vec<usize>)> = group::assign(&rest, &current, share)
            .into_iter()
            .map(|g| (g.key, g.recurse, g.members.iter().map(|&i| shared_paths[i]).collect()))
            .collect();
        cut.extend(solo.iter().map(|&i| (watch_paths[i].key.clone(), watch_paths[i].recurse, vec![i])));
        for (key, recurse, members) in cut {
            // A shared group may read the very key of a solo path: one query serves both.
            let (paths, group_cells) = planned.entry(scope.query(key, recurse)).or_default();
            for i in members {
                paths.push(watch_paths[i].clone());
                group_cells.push(cells[i].clone());
            }
        }
    }

    let rotating = planned.len() > slots;
    if rotating != runner.rotating.swap(rotating, Ordering::Relaxed) {
        match rotating {
            true => warn!(
                groups = planned.len(),
                slots,
                "more distinct Consul tokens and scopes than blocking-query slots; watches take turns with \
                 {ROTATION_WAIT:?} waits, so changes may show late. Raise --consul-max-connections"
            ),
            false => info!(groups = planned.len(), slots, "every Consul watch group has a blocking-query slot again"),
        }
    }
    runner.metrics.consul_watch_groups_over_budget.set(planned.len().saturating_sub(slots) as i64);

    let mut running = std::mem::take(groups);
    for (query, (paths, cells)) in planned {
        let (paths, cells) = sorted(paths, cells);
        let handle = match running.remove(&query) {
            Some(handle) => {
                if !handle.roster.borrow().serves(&paths, &cells) {
                    handle.roster.send_replace(Arc::new(Roster::new(paths, cells)));
                }
                handle
            }
            None => start_group(runner, query.clone(), Roster::new(paths, cells)),
        };
        groups.insert(query, handle);
    }
    // Whatever is left in `running` is no longer needed and stops when dropped here.
    debug!(paths = paths.len(), groups = groups.len(), stopped = running.len(), "planned Consul watches");
    runner.metrics.consul_watches.set(paths.len() as i64);
    runner.metrics.consul_watch_groups.set(groups.len() as i64);
}

/// Sorts a roster's paths, keeping each cell beside its path.
fn sorted(paths: Vec<WatchPath>, cells: Vec<Arc<Path>>) -> (Vec<WatchPath>, Vec<Arc<Path>>) {
    if paths.is_sorted() {
        return (paths, cells);
    }
    let mut pairs: Vec<(WatchPath, Arc<Path>)> = paths.into_iter().zip(cells).collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs.into_iter().unzip()
}

fn start_group(runner: &Arc<Runner>, query: KvQuery, roster: Roster) -> GroupHandle {
    let (tx, rx) = watch::channel(Arc::new(roster));
    let task = tokio::spawn(runner.clone().run_group(query, rx));
    GroupHandle { roster: tx, task, born: Instant::now() }
}
