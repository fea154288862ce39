//! The checks of config/monitoring/ that need no server: promtool on the PrometheusRule's rule
//! groups, the dashboard's JSON, and the kustomization. Whether the controller exports every metric
//! they use is an end-to-end test (crates/consulbind/tests/e2e/image.rs).

use std::fs;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::common::repo_root;
use crate::env::apt;
use crate::process::{capture, run};

pub fn check() -> Result<()> {
    // promtool comes with Debian's prometheus package.
    apt::ensure_packages(&["prometheus"], false)?;
    let dir = repo_root().join("config/monitoring");
    let rule: serde_yaml::Value = serde_yaml::from_str(&fs::read_to_string(dir.join("prometheusrule.yaml"))?)?;
    ensure!(rule["kind"] == "PrometheusRule", "prometheusrule.yaml holds no PrometheusRule");
    // promtool reads plain rule groups, which are the PrometheusRule's spec.
    let groups = repo_root().join("target/monitoring/rules.yaml");
    fs::create_dir_all(groups.parent().context("a parent")?)?;
    fs::write(&groups, serde_yaml::to_string(&rule["spec"])?)?;
    run(Command::new("promtool").arg("check").arg("rules").arg(&groups))?;

    let dashboard: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("consulbind-dashboard.json"))?)
            .context("consulbind-dashboard.json is not JSON")?;
    let panels = dashboard["panels"].as_array().map_or(0, Vec::len);
    ensure!(panels > 0, "the dashboard has no panels");
    println!("consulbind-dashboard.json: {panels} panels");

    let built = capture(Command::new("kubectl").arg("kustomize").arg(&dir))?;
    for kind in ["kind: PrometheusRule", "kind: ServiceMonitor", "kind: ConfigMap"] {
        ensure!(built.contains(kind), "`kubectl kustomize config/monitoring` has no {kind}");
    }
    let main = fs::read_to_string(repo_root().join("config/kustomization.yaml"))?;
    ensure!(!main.contains("monitoring"), "config/kustomization.yaml must not include the optional monitoring/");
    Ok(())
}
