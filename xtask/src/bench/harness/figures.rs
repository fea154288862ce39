//! The figures the benchmarks print, and where they are read: the controller's metrics and its
//! process's memory.

use std::time::Duration;

use anyhow::{Context, Result};

/// A sample's value in Prometheus text, by its full name with labels.
pub(crate) fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The controller's own account of where a change's time went, from its metrics: each rollout
/// stage it has seen, with its mean and how many it measured.
pub(crate) fn stage_means(metrics: &str) -> Vec<(&'static str, Duration, f64)> {
    let of = |part: &str, stage: &str| {
        metric(metrics, &format!("consulbind_rollout_stage_seconds_{part}{{stage=\"{stage}\"}}"))
    };
    ["consul_to_reconcile", "reconcile_to_patch", "patch"]
        .into_iter()
        .filter_map(|stage| {
            let (sum, count) = (of("sum", stage)?, of("count", stage).filter(|c| *c > 0.0)?);
            Some((stage, Duration::from_secs_f64(sum / count), count))
        })
        .collect()
}

/// The value at fraction `p` of sorted `sorted`, in milliseconds.
pub(crate) fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// Sorts `latencies` and sums them up as `p50 … ms  p90 … ms  max … ms  (N changes)`, with a
/// column for each fraction of `quantiles`.
pub(crate) fn summary(latencies: &mut [Duration], quantiles: &[f64]) -> String {
    latencies.sort();
    let mut text = String::new();
    for q in quantiles {
        text += &format!("p{:.0} {:.1} ms  ", q * 100.0, percentile_ms(latencies, *q));
    }
    let max = latencies.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    text + &format!("max {max:.1} ms  ({} changes)", latencies.len())
}

/// The machine's cores, which every result names.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// KiB as MiB with one decimal.
pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The CPU time a process has used, user and system, from `/proc/PID/stat`.
pub(super) fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let fields: Vec<&str> = stat.rsplit_once(')').context("no command in stat")?.1.split_whitespace().collect();
    let ticks: u64 =
        fields.get(11..13).context("no utime and stime")?.iter().map(|f| f.parse::<u64>()).sum::<Result<_, _>>()?;
    // SAFETY: sysconf only reads a system constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_millis(ticks * 1000 / per_second))
}

/// A field of `/proc/<pid>/status` given in kB.
pub(super) fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let prefix = format!("{field}:");
    let line = status.lines().find(|l| l.starts_with(&prefix)).with_context(|| format!("no {field}"))?;
    Ok(line.split_whitespace().nth(1).with_context(|| format!("{field} value"))?.parse()?)
}
