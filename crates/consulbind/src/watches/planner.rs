//! The planner: shares the blocking slots fairly among tenants (namespaces first, then the
//! scopes within one), cuts each scope's paths into its share of groups (see
//! [`consul_kv::group`]), and starts, hands over and retires the groups' runners. Groups whose
//! key and paths stay the same keep running untouched.
//!
//! A tenant with more groups than its share puts them in a lane: they take turns on the lane's
//! slots with short waits, and no other tenant waits for them. Scopes whose token is refused
//! everywhere are parked: they read without blocking, retrying with backoff, and take no slot.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
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
    runner::{Lane, Roster, Runner},
};
use crate::metrics::NamespaceLabels;

/// A group younger than this, when no longer needed, finishes its request (its wait is no
/// longer than its age) instead of dropping it: a dropped request leaves a socket closing
/// outside the connection budget for a moment, and cold starts replace many young groups.
const RETIRE_YOUNG: Duration = Duration::from_secs(30);

/// Who pays for a scope's blocking queries.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tenant {
    /// Paths read for bindings of more than one namespace, as with the controller's own token.
    Shared,
    Namespace(String),
    /// Every namespace together, when there are more namespaces with scopes of their own than
    /// slots.
    Crowd,
}

impl Tenant {
    /// The tenant of a path read for bindings of these namespaces.
    fn of<'a>(mut namespaces: impl Iterator<Item = Option<&'a str>>) -> Self {
        let Some(first) = namespaces.next() else { return Self::Shared };
        match namespaces.all(|n| n == first) {
            true => Self::Namespace(first.unwrap_or_default().to_owned()),
            false => Self::Shared,
        }
    }

    fn label(&self) -> String {
        match self {
            Self::Namespace(namespace) => namespace.clone(),
            Self::Shared | Self::Crowd => "*".to_owned(),
        }
    }
}

/// One scope's paths, as the layout sees them.
#[derive(Debug)]
pub struct ScopePaths {
    pub scope: Scope,
    pub tenant: Tenant,
    /// Every path's token is refused.
    pub parked: bool,
    /// Sorted.
    pub paths: Vec<WatchPath>,
    /// Paths too large to share a read.
    pub solo: Vec<bool>,
    /// The keys this scope's groups read now.
    pub current: Vec<(String, bool)>,
}

/// One planned group.
#[derive(Debug, PartialEq, Eq)]
pub struct Cut {
    pub query: KvQuery,
    /// Positions in the scope's paths.
    pub members: Vec<usize>,
    pub scope: usize,
    /// The tenant whose lane the group takes turns in.
    pub lane: Option<Tenant>,
    pub parked: bool,
}

/// Every group, and the slots of each lane.
#[derive(Debug, Default)]
pub struct Layout {
    pub cuts: Vec<Cut>,
    pub lanes: BTreeMap<Tenant, usize>,
}

/// Decides the groups: the slots go to tenants by [`group::fair`] over how many paths each
/// has, and a tenant's part goes to its scopes in proportion to their paths, or one group each
/// in turns when the part is smaller than its scopes.
pub fn layout(scopes: &[ScopePaths], slots: usize) -> Layout {
    let slots = slots.max(1);
    let mut tenants: BTreeMap<Tenant, Vec<usize>> = BTreeMap::new();
    for (i, scope) in scopes.iter().enumerate().filter(|(_, s)| !s.parked) {
        tenants.entry(scope.tenant.clone()).or_default().push(i);
    }
    // With more tenants than slots, fairness between them is impossible: namespaces share one
    // part, beside the shared scopes, and with a single slot everyone shares it.
    if tenants.len() > slots {
        let shared = tenants.remove(&Tenant::Shared);
        let crowd: Vec<usize> = std::mem::take(&mut tenants).into_values().flatten().collect();
        tenants.insert(Tenant::Crowd, crowd);
        if let Some(shared) = shared {
            match slots {
                1 => tenants.get_mut(&Tenant::Crowd).unwrap().extend(shared),
                _ => drop(tenants.insert(Tenant::Shared, shared)),
            }
        }
    }
    let demands: Vec<usize> =
        tenants.values().map(|members| members.iter().map(|&i| scopes[i].paths.len()).sum()).collect();
    let parts = group::fair(&demands, slots);

    let mut layout = Layout::default();
    for ((tenant, members), part) in tenants.into_iter().zip(parts) {
        let part = part.max(1);
        let sizes: Vec<usize> = members.iter().map(|&i| scopes[i].paths.len()).collect();
        let shares = match part >= members.len() {
            true => group::shares(&sizes, part),
            false => vec![1; members.len()],
        };
        let start = layout.cuts.len();
        for (&i, share) in members.iter().zip(shares) {
            layout.cuts.extend(cut(&scopes[i], i, share, false));
        }
        if layout.cuts.len() - start > part {
            layout.cuts[start..].iter_mut().for_each(|c| c.lane = Some(tenant.clone()));
            layout.lanes.insert(tenant, part);
        }
    }
    for (i, scope) in scopes.iter().enumerate().filter(|(_, s)| s.parked) {
        layout.cuts.extend(cut(scope, i, 1, true));
    }
    layout
}

/// Cuts one scope into `share` groups: paths too large to share a read get one each, and the
/// rest share what is left. A shared group may read the very key of a solo path: one query
/// serves both.
fn cut(scope: &ScopePaths, index: usize, share: usize, parked: bool) -> Vec<Cut> {
    let paths = &scope.paths;
    let (solo, shared): (Vec<usize>, Vec<usize>) = (0..paths.len()).partition(|&i| scope.solo[i]);
    let solo_keys: HashSet<(&str, bool)> = solo.iter().map(|&i| (&*paths[i].key, paths[i].recurse)).collect();
    let current: Vec<(String, bool)> =
        scope.current.iter().filter(|(key, recurse)| !solo_keys.contains(&(key.as_str(), *recurse))).cloned().collect();
    let rest: Vec<WatchPath> = shared.iter().map(|&i| paths[i].clone()).collect();
    let share = share.saturating_sub(solo.len()).max(1);
    let groups = if rest.is_empty() { Vec::new() } else { group::assign(&rest, &current, share) };
    let mut cuts: Vec<Cut> = Vec::new();
    let mut by_query: HashMap<KvQuery, usize> = HashMap::new();
    let planned = groups
        .into_iter()
        .map(|g| (g.key, g.recurse, g.members.iter().map(|&i| shared[i]).collect::<Vec<_>>()))
        .chain(solo.iter().map(|&i| (paths[i].key.to_string(), paths[i].recurse, vec![i])));
    for (key, recurse, members) in planned {
        let query = scope.scope.query(key, recurse);
        match by_query.get(&query) {
            Some(&at) => cuts[at].members.extend(members),
            None => {
                by_query.insert(query.clone(), cuts.len());
                cuts.push(Cut { query, members, scope: index, lane: None, parked });
            }
        }
    }
    cuts
}

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

/// The running groups and the lanes they take turns in.
#[derive(Default)]
pub struct Groups {
    pub running: HashMap<KvQuery, GroupHandle>,
    /// A lane is kept while its slots and wait stay the same.
    lanes: HashMap<Tenant, Arc<Lane>>,
    /// The namespaces with groups in turns, for their metric series.
    in_turns: HashSet<String>,
}

/// Plans the groups for `paths`, updating `groups` in place: kept groups get their new roster,
/// new ones start, and the ones no longer needed stop.
pub fn plan(runner: &Arc<Runner>, paths: &HashMap<Arc<KvQuery>, Arc<Path>>, groups: &mut Groups) {
    let mut by_scope: BTreeMap<Scope, Vec<(WatchPath, Arc<Path>)>> = BTreeMap::new();
    for (query, path) in paths {
        let watch_path = WatchPath { key: query.key.clone(), recurse: query.recurse };
        by_scope.entry(query.scope().clone()).or_default().push((watch_path, path.clone()));
    }
    let mut current: HashMap<Scope, Vec<(String, bool)>> = HashMap::new();
    for query in groups.running.keys() {
        current.entry(query.scope().clone()).or_default().push((query.key.to_string(), query.recurse));
    }
    let mut cells: Vec<Vec<Arc<Path>>> = Vec::with_capacity(by_scope.len());
    let scopes: Vec<ScopePaths> = by_scope
        .into_iter()
        .map(|(scope, mut members)| {
            members.sort_by(|a, b| a.0.cmp(&b.0));
            let (paths, scope_cells): (Vec<WatchPath>, Vec<Arc<Path>>) = members.into_iter().unzip();
            let subscribers: Vec<_> = scope_cells.iter().flat_map(|c| c.subscribers()).collect();
            let scope_paths = ScopePaths {
                tenant: Tenant::of(subscribers.iter().map(|b| Some(b.namespace()))),
                parked: scope_cells.iter().all(|c| c.denied()),
                solo: scope_cells.iter().map(|c| c.solo()).collect(),
                current: current.remove(&scope).unwrap_or_default(),
                scope,
                paths,
            };
            cells.push(scope_cells);
            scope_paths
        })
        .collect();
    let slots = runner.consul.blocking_slots();
    runner.plan_slots(slots);
    let layout = layout(&scopes, slots);

    let mut kept = std::mem::take(&mut groups.lanes);
    for (tenant, &slots) in &layout.lanes {
        let members = layout.cuts.iter().filter(|c| c.lane.as_ref() == Some(tenant)).count();
        let fresh = Lane::new(members, slots);
        let lane = match kept.remove(tenant) {
            Some(lane) if lane.permits == fresh.permits && lane.wait == fresh.wait => lane,
            _ => Arc::new(fresh),
        };
        groups.lanes.insert(tenant.clone(), lane);
    }
    report_turns(runner, &scopes, &layout, groups);

    let mut running = std::mem::take(&mut groups.running);
    let mut in_turns: HashMap<*const Path, Duration> = HashMap::new();
    for cut in layout.cuts {
        let scope = &scopes[cut.scope];
        let mut members: Vec<(WatchPath, Arc<Path>)> =
            cut.members.iter().map(|&i| (scope.paths[i].clone(), cells[cut.scope][i].clone())).collect();
        members.sort_by(|a, b| a.0.cmp(&b.0));
        let (paths, group_cells): (Vec<WatchPath>, Vec<Arc<Path>>) = members.into_iter().unzip();
        let lane = cut.lane.map(|t| groups.lanes[&t].clone());
        if let Some(lane) = &lane {
            in_turns.extend(group_cells.iter().map(|c| (Arc::as_ptr(c), lane.cycle)));
        }
        let roster = Roster::new(paths, group_cells, lane, cut.parked);
        let handle = match running.remove(&cut.query) {
            Some(handle) => {
                if !handle.roster.borrow().same(&roster) {
                    handle.roster.send_replace(Arc::new(roster));
                }
                handle
            }
            None => start_group(runner, cut.query.clone(), roster),
        };
        groups.running.insert(cut.query, handle);
    }
    for cell in cells.iter().flatten() {
        if cell.set_in_turns(in_turns.get(&Arc::as_ptr(cell)).copied()) {
            cell.wake(&runner.wake);
        }
    }
    // Whatever is left in `running` is no longer needed and stops when dropped here.
    debug!(paths = paths.len(), groups = groups.running.len(), stopped = running.len(), "planned Consul watches");
    runner.metrics.consul_watches.set(paths.len() as i64);
    runner.metrics.consul_watch_groups.set(groups.running.len() as i64);
}

/// Logs each tenant that starts or stops taking turns, and keeps the per-namespace metric.
fn report_turns(runner: &Runner, scopes: &[ScopePaths], layout: &Layout, groups: &mut Groups) {
    let mut per_namespace: BTreeMap<String, i64> = BTreeMap::new();
    for cut in layout.cuts.iter().filter(|c| c.lane.is_some()) {
        *per_namespace.entry(scopes[cut.scope].tenant.label()).or_default() += 1;
    }
    let over: usize = layout
        .lanes
        .iter()
        .map(|(tenant, &slots)| layout.cuts.iter().filter(|c| c.lane.as_ref() == Some(tenant)).count() - slots)
        .sum();
    runner.metrics.consul_watch_groups_over_budget.set(over as i64);
    for (namespace, count) in &per_namespace {
        runner
            .metrics
            .consul_watch_groups_in_turns
            .get_or_create(&NamespaceLabels { namespace: namespace.clone() })
            .set(*count);
        if !groups.in_turns.contains(namespace) {
            warn!(
                namespace,
                groups = count,
                "a namespace has more Consul token scopes than its share of blocking-query slots; its watches take \
                 turns, so its changes may show late. Raise --consul-max-connections"
            );
        }
    }
    for namespace in groups.in_turns.iter().filter(|n| !per_namespace.contains_key(*n)) {
        runner.metrics.consul_watch_groups_in_turns.remove(&NamespaceLabels { namespace: namespace.clone() });
        info!(namespace, "a namespace's Consul watches have blocking-query slots of their own again");
    }
    groups.in_turns = per_namespace.into_keys().collect();
}

fn start_group(runner: &Arc<Runner>, query: KvQuery, roster: Roster) -> GroupHandle {
    let (tx, rx) = watch::channel(Arc::new(roster));
    let task = tokio::spawn(runner.clone().run_group(query, rx));
    GroupHandle { roster: tx, task, born: Instant::now() }
}

#[cfg(test)]
mod tests {
    use consul_kv::Token;

    use super::*;

    fn scope(token: Option<&str>, tenant: Tenant, keys: &[&str]) -> ScopePaths {
        let query = token.map_or(KvQuery::exact(""), |t| KvQuery::exact("").with_token(Token::new(t)));
        let mut paths: Vec<WatchPath> = keys.iter().map(|k| WatchPath { key: (*k).into(), recurse: false }).collect();
        paths.sort();
        ScopePaths {
            scope: query.scope().clone(),
            tenant,
            parked: false,
            solo: vec![false; paths.len()],
            paths,
            current: Vec::new(),
        }
    }

    fn ns(name: &str) -> Tenant {
        Tenant::Namespace(name.into())
    }

    fn busy(tokens: usize) -> Vec<ScopePaths> {
        (0..tokens).map(|i| scope(Some(&format!("token-{i}")), ns("busy"), &[&format!("busy/k{i}")])).collect()
    }

    #[test]
    fn many_token_scopes_take_turns_within_their_own_namespace() {
        let mut scopes = busy(200);
        scopes.push(scope(None, Tenant::Shared, &["app/a", "app/b", "db/x"]));
        let planned = layout(&scopes, 20);
        let shared: Vec<&Cut> = planned.cuts.iter().filter(|c| c.scope == 200).collect();
        assert_eq!(shared.len(), 3, "the shared scope's need is met: one query per key");
        assert!(shared.iter().all(|c| c.lane.is_none()));
        assert_eq!(planned.lanes, BTreeMap::from([(ns("busy"), 17)]));
        let busy_cuts = planned.cuts.iter().filter(|c| c.lane == Some(ns("busy"))).count();
        assert_eq!(busy_cuts, 200, "each busy scope still has its group, in turns");
    }

    #[test]
    fn a_namespace_within_its_share_takes_no_turns() {
        let mut scopes = busy(12);
        scopes.push(scope(Some("quiet"), ns("quiet"), &["quiet/a", "quiet/b"]));
        let planned = layout(&scopes, 20);
        assert!(planned.lanes.is_empty(), "12 + 2 groups fit in 20 slots");
        assert!(planned.cuts.iter().all(|c| c.lane.is_none()));

        let mut scopes = busy(30);
        scopes.push(scope(Some("quiet"), ns("quiet"), &["quiet/a", "quiet/b"]));
        let planned = layout(&scopes, 20);
        assert_eq!(planned.lanes, BTreeMap::from([(ns("busy"), 18)]));
        let quiet: Vec<&Cut> = planned.cuts.iter().filter(|c| c.scope == 30).collect();
        assert_eq!(quiet.len(), 2);
        assert!(quiet.iter().all(|c| c.lane.is_none()));
    }

    #[test]
    fn refused_tokens_take_no_slot() {
        let mut scopes = busy(40);
        scopes.iter_mut().for_each(|s| s.parked = true);
        scopes.push(scope(Some("good"), ns("busy"), &["busy/good"]));
        let planned = layout(&scopes, 20);
        assert!(planned.lanes.is_empty(), "forty refused tokens put nobody in turns");
        assert_eq!(planned.cuts.iter().filter(|c| c.parked).count(), 40);
        assert!(planned.cuts.iter().all(|c| c.lane.is_none()));
    }

    #[test]
    fn another_namespace_never_widens_a_scope_s_read() {
        let keys: Vec<String> = (0..50).map(|i| format!("team/app/k{i:02}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut scopes = busy(500);
        scopes.push(scope(None, Tenant::Shared, &keys));
        let planned = layout(&scopes, 20);
        for cut in planned.cuts.iter().filter(|c| c.scope == 500) {
            assert!(cut.query.key.starts_with("team/app/k"), "{:?} reads beyond the scope's own keys", cut.query.key);
            assert!(cut.lane.is_none());
        }
    }

    #[test]
    fn more_namespaces_than_slots_share_one_lane_beside_the_shared_scopes() {
        let mut scopes: Vec<ScopePaths> =
            (0..30).map(|i| scope(Some(&format!("t{i}")), ns(&format!("ns{i:02}")), &["k"])).collect();
        scopes.push(scope(None, Tenant::Shared, &["shared/a", "shared/b"]));
        let planned_ten = layout(&scopes, 10);
        assert_eq!(planned_ten.lanes, BTreeMap::from([(Tenant::Crowd, 8)]));
        assert!(planned_ten.cuts.iter().filter(|c| c.scope == 30).all(|c| c.lane.is_none()));
        let single = layout(&scopes, 1);
        assert_eq!(single.lanes, BTreeMap::from([(Tenant::Crowd, 1)]), "one slot: everyone in turns on it");
    }

    #[test]
    fn lanes_and_dedicated_groups_never_exceed_the_slots() {
        let mut seed = 3u64;
        let mut below = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for round in 0..500 {
            let slots = 1 + below(24) as usize;
            let scopes: Vec<ScopePaths> = (0..below(40))
                .map(|i| {
                    let tenant = match below(4) {
                        0 => Tenant::Shared,
                        n => ns(&format!("ns{n}")),
                    };
                    let keys: Vec<String> = (0..1 + below(6)).map(|k| format!("k{}/{k}", below(3))).collect();
                    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    keys.dedup();
                    let mut s = scope(Some(&format!("t{i}")), tenant, &keys);
                    s.paths.dedup();
                    s.solo = vec![false; s.paths.len()];
                    s.parked = below(5) == 0;
                    s
                })
                .collect();
            let planned = layout(&scopes, slots);
            let dedicated = planned.cuts.iter().filter(|c| c.lane.is_none() && !c.parked).count();
            let lanes: usize = planned.lanes.values().sum();
            assert!(dedicated + lanes <= slots, "round {round}: {dedicated} + {lanes} for {slots} slots");
            for (i, s) in scopes.iter().enumerate() {
                let mut members: Vec<usize> =
                    planned.cuts.iter().filter(|c| c.scope == i).flat_map(|c| c.members.clone()).collect();
                members.sort_unstable();
                assert_eq!(members, (0..s.paths.len()).collect::<Vec<_>>(), "round {round}: every path read once");
            }
        }
    }

    #[test]
    fn tenants_are_namespaces_unless_shared() {
        assert_eq!(Tenant::of([Some("a"), Some("a")].into_iter()), ns("a"));
        assert_eq!(Tenant::of([Some("a"), Some("b")].into_iter()), Tenant::Shared);
        assert_eq!(Tenant::of(std::iter::empty()), Tenant::Shared);
    }
}
