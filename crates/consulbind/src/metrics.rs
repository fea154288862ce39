//! Prometheus metrics, served on `/metrics`.

use std::time::Duration;

use consul_kv::ErrorKind;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutLabels {
    pub namespace: String,
    pub binding: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub namespace: String,
    pub kind: &'static str,
    pub workload: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadyLabels {
    pub ready: &'static str,
}

fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

/// From 100 µs, for stages that take milliseconds.
fn fine_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

pub struct Metrics {
    pub reconciles: Family<ResultLabels, Counter>,
    reconcile_duration: Family<ResultLabels, Histogram, fn() -> Histogram>,
    pub rollouts: Family<RolloutLabels, Counter>,
    pub workload_rollouts: Family<WorkloadLabels, Counter>,
    pub rollout_halts: Counter,
    consul_requests: Family<ResultLabels, Counter>,
    consul_request_duration: Histogram,
    pub consul_watches: Gauge,
    pub consul_watch_groups: Gauge,
    pub consul_watch_groups_over_budget: Gauge,
    pub consul_watch_groups_in_turns: Family<NamespaceLabels, Gauge>,
    pub writes_held: Family<NamespaceLabels, Counter>,
    pub bindings: Family<ReadyLabels, Gauge>,
    pub change_to_rollout: Histogram,
    rollout_stages: Family<StageLabels, Histogram, fn() -> Histogram>,
    pub leader: Gauge,
    pub shard_bindings: Family<ShardLabels, Gauge>,
    pub object_digests: Gauge,
    pub consul_entries: Gauge,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            reconcile_duration: Family::new_with_constructor(seconds as fn() -> Histogram),
            rollouts: Family::default(),
            workload_rollouts: Family::default(),
            rollout_halts: Counter::default(),
            consul_requests: Family::default(),
            consul_request_duration: Histogram::new(exponential_buckets(0.005, 2.0, 18)),
            consul_watches: Gauge::default(),
            consul_watch_groups: Gauge::default(),
            consul_watch_groups_over_budget: Gauge::default(),
            consul_watch_groups_in_turns: Family::default(),
            writes_held: Family::default(),
            bindings: Family::default(),
            change_to_rollout: seconds(),
            rollout_stages: Family::new_with_constructor(fine_seconds as fn() -> Histogram),
            leader: Gauge::default(),
            shard_bindings: Family::default(),
            object_digests: Gauge::default(),
            consul_entries: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("consulbind");
        r.register("reconciles", "Reconciles by result", metrics.reconciles.clone());
        r.register("reconcile_duration_seconds", "Reconcile duration by result", metrics.reconcile_duration.clone());
        r.register("rollouts", "Rollouts by binding: each is one workload rolled", metrics.rollouts.clone());
        r.register(
            "workload_rollouts",
            "Rollouts of each workload, by any binding, a series per workload ever rolled: one rolled unusually often has a flapping source",
            metrics.workload_rollouts.clone(),
        );
        r.register(
            "rollout_halts",
            "Staged rollouts halted by a target that failed or was not healthy in time",
            metrics.rollout_halts.clone(),
        );
        r.register("consul_requests", "Consul KV requests by result", metrics.consul_requests.clone());
        r.register(
            "consul_request_duration_seconds",
            "Consul KV request latency, blocking time included",
            metrics.consul_request_duration.clone(),
        );
        r.register("consul_watches", "Distinct Consul keys and prefixes watched", metrics.consul_watches.clone());
        r.register(
            "consul_entries",
            "Distinct Consul entries held, each once however many watched paths cover it",
            metrics.consul_entries.clone(),
        );
        r.register(
            "object_digests",
            "ConfigMaps and Secrets whose data digests are kept (those some binding reads), as of the last reconcile",
            metrics.object_digests.clone(),
        );
        r.register(
            "consul_watch_groups",
            "Blocking Consul queries that serve the watched keys",
            metrics.consul_watch_groups.clone(),
        );
        r.register(
            "consul_watch_groups_over_budget",
            "Watch groups beyond the blocking-query slots their namespaces may use; above 0 some take turns",
            metrics.consul_watch_groups_over_budget.clone(),
        );
        r.register(
            "consul_watch_groups_in_turns",
            "Watch groups of a namespace that take turns for its share of the blocking-query slots \
             (namespace \"*\" for keys read for several namespaces; no series while none takes turns)",
            metrics.consul_watch_groups_in_turns.clone(),
        );
        r.register(
            "writes_held",
            "Reconciles that held back their writes because the namespace was over --namespace-write-limit",
            metrics.writes_held.clone(),
        );
        r.register("bindings", "Bindings by Ready condition status", metrics.bindings.clone());
        r.register(
            "change_to_rollout_seconds",
            "Time from seeing a Consul change to rolling the targets",
            metrics.change_to_rollout.clone(),
        );
        r.register(
            "rollout_stage_seconds",
            "Time spent in each stage of a rollout: consul_to_reconcile (content seen to reconcile start), \
             reconcile_to_patch (reconcile start to the first patch sent) and patch (one workload patch)",
            metrics.rollout_stages.clone(),
        );
        r.register(
            "leader",
            "1 when this replica acts: it holds the leader lease, or with --sharding serves its share of the ring",
            metrics.leader.clone(),
        );
        r.register(
            "shard_bindings",
            "With --sharding, the bindings this replica serves, labelled with its identity",
            metrics.shard_bindings.clone(),
        );
        metrics
    }

    pub fn reconciled(&self, result: &'static str, took: Duration) {
        let labels = ResultLabels { result };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration.get_or_create(&labels).observe(took.as_secs_f64());
    }

    pub fn stage(&self, stage: &'static str, took: Duration) {
        self.rollout_stages.get_or_create(&StageLabels { stage }).observe(took.as_secs_f64());
    }

    pub fn consul_request(&self, error: Option<ErrorKind>, took: Duration) {
        let result = error.map_or("ok", |e| e.as_str());
        self.consul_requests.get_or_create(&ResultLabels { result }).inc();
        self.consul_request_duration.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    /// The book's page of metrics, from the registry: every metric with its type, labels and help.
    fn page() -> String {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        // A family shows its labels only in its samples: one each.
        metrics.reconciled("ok", Duration::ZERO);
        metrics.stage("patch", Duration::ZERO);
        metrics.consul_request(None, Duration::ZERO);
        let (namespace, name) = (String::new(), String::new());
        let rollout = RolloutLabels { namespace: namespace.clone(), binding: name.clone(), kind: "" };
        metrics.rollouts.get_or_create(&rollout).inc();
        let workload = WorkloadLabels { namespace: namespace.clone(), kind: "", workload: name };
        metrics.workload_rollouts.get_or_create(&workload).inc();
        metrics.consul_watch_groups_in_turns.get_or_create(&NamespaceLabels { namespace: namespace.clone() }).set(1);
        metrics.writes_held.get_or_create(&NamespaceLabels { namespace }).inc();
        metrics.bindings.get_or_create(&ReadyLabels { ready: "True" }).set(1);
        metrics.shard_bindings.get_or_create(&ShardLabels { shard: String::new() }).set(1);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();

        let mut rows = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# HELP ") else { continue };
            let (name, help) = rest.split_once(' ').unwrap();
            let kind = text.lines().find_map(|l| l.strip_prefix(&format!("# TYPE {name} "))).unwrap();
            let sample = text
                .lines()
                .find(|l| !l.starts_with('#') && l.starts_with(name))
                .unwrap_or_else(|| panic!("{name} has no sample: give it one above"));
            let labels: Vec<&str> = sample
                .split_once('{')
                .map(|(_, l)| l.trim_end_matches(|c| c != '}').trim_end_matches('}'))
                .into_iter()
                .flat_map(|l| l.split(','))
                .filter_map(|pair| pair.split_once('=').map(|(k, _)| k))
                .filter(|k| *k != "le")
                .collect();
            let series = match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_owned(),
            };
            let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
            let help = help.trim_end_matches('.').replace('|', "\\|");
            rows.push(format!("| `{series}{labels}` | {kind} | {help}. |\n"));
        }
        format!(
            "<!-- Generated from the metrics registry (crates/consulbind/src/metrics.rs) by its unit test; \
             CONSULBIND_WRITE_REFERENCE=1 cargo test -p consulbind --lib metrics writes it. Do not edit. -->\n\n\
             # Metrics\n\n\
             The controller serves `/metrics` (Prometheus text), `/livez` and `/readyz` on `--admin-addr`\n\
             (`0.0.0.0:8080` by default; Helm: `metrics.port`). Metrics carry no Consul key names, and a\n\
             deleted binding's series go with it. Histograms have the series `_bucket`, `_sum` and `_count`.\n\n\
             | Metric | Type | What it says |\n| --- | --- | --- |\n{}\n\
             Alerts and a dashboard built on them are in\n\
             [Metrics, alerts and the dashboard](../operations/monitoring.md).\n",
            rows.concat()
        )
    }

    #[test]
    fn the_books_page_of_metrics_is_the_registrys() {
        crate::reference::hold("docs/src/reference/metrics.md", &page(), "metrics");
    }
}
