//! The operations guide's alerts on kube-state-metrics, as written, work
//! with `deploy/kube-state-metrics`: the real kube-state-metrics (built
//! from its Go module with the control plane) runs with the shipped
//! CustomResourceState configuration, under a ServiceAccount that has only
//! the shipped ClusterRole, against the real control plane; a real
//! Prometheus (Debian's) scrapes it and evaluates the shipped
//! PrometheusRule (whose rules are the guide's, checked word for word);
//! the operator leaves one maintenance Failed, one Running behind a
//! PodDisruptionBudget and one Succeeded.
//!
//! The alerts' `for` (5 minutes, 2 hours) is not waited for: Prometheus
//! shows each alert pending for the right maintenance (and none for the
//! Succeeded one), then `promtool test rules` replays the series taken from
//! that scrape, labels and values as scraped, over three hours of
//! compressed time, and checks when each alert fires and for whom.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::prometheus::{self as prom, run, tool};
use common::real::{RealEnv, rendered};
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, PostParams};
use nmo::crd::MaintenancePhase;
use nmo_control_plane::Options;
use serde_json::{Value, json};

/// The guide's two rules (the observability chapter), as it writes them:
/// (alert, expr, for, summary).
const GUIDE: [(&str, &str, &str, &str); 2] = [
    (
        "NodeMaintenanceFailed",
        r#"kube_customresource_status_phase{kind="NodeMaintenance", phase="Failed"} > 0"#,
        "5m",
        "Node maintenance failed",
    ),
    (
        "NodeMaintenanceStuck",
        r#"kube_customresource_status_phase{kind="NodeMaintenance", phase="Running"} > 0"#,
        "2h",
        "Node maintenance running for more than 2 hours",
    ),
];

/// The documents of `deploy/with-kube-state-metrics` that the
/// kube-state-metrics component adds.
fn component_objects() -> Vec<Value> {
    rendered("with-kube-state-metrics")
        .into_iter()
        .filter(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.contains("kube-state-metrics"))
        })
        .collect()
}

/// The shipped rules are the guide's, word for word where it matters
/// (expression, `for`, severity, summary).
fn check_rules_are_the_guides(rule: &Value) {
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), GUIDE.len());
    for (alert, expr, r#for, summary) in GUIDE {
        let r = rules
            .iter()
            .find(|r| r["alert"] == alert)
            .unwrap_or_else(|| panic!("{alert} missing"));
        assert_eq!(r["expr"], expr, "{alert}");
        assert_eq!(r["for"], r#for, "{alert}");
        assert_eq!(r["labels"], json!({"severity": "warning"}), "{alert}");
        assert_eq!(r["annotations"]["summary"], summary, "{alert}");
    }
}

/// Starts kube-state-metrics with `config` under `kubeconfig`, serving
/// only the custom resources' metrics on `port`.
fn start_kube_state_metrics(
    bin: &Path,
    dir: &Path,
    kubeconfig: &Path,
    config: &str,
    port: u16,
) -> tokio::process::Child {
    let file = dir.join("custom-resource-state.yaml");
    std::fs::write(&file, config).unwrap();
    let log = std::fs::File::create(dir.join("kube-state-metrics.log")).unwrap();
    tokio::process::Command::new(bin)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--custom-resource-state-only")
        .arg(format!(
            "--custom-resource-state-config-file={}",
            file.display()
        ))
        .arg("--host=127.0.0.1")
        .arg(format!("--port={port}"))
        .arg("--telemetry-host=127.0.0.1")
        .arg(format!("--telemetry-port={}", free_port()))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("kube-state-metrics starts")
}

/// The value of the one series `expr` selects, once there is one.
async fn wait_value(server: &prom::Server, expr: &str, want: &str, log: &Path) {
    let limit = Duration::from_secs(60);
    let started = std::time::Instant::now();
    loop {
        let v = server.vector(expr).await;
        if v.len() == 1 && v[0]["value"][1] == want {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "never {expr} = {want} (now {v:?}); kube-state-metrics' log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `labels` (a series' label set from the Prometheus API) as a series
/// selector promtool reads.
fn series(labels: &Value) -> String {
    let map = labels.as_object().unwrap();
    let name = map["__name__"].as_str().unwrap();
    let rest: Vec<String> = map
        .iter()
        .filter(|(k, _)| *k != "__name__")
        .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap()))
        .collect();
    format!("{name}{{{}}}", rest.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_alerts_fire_on_kube_state_metrics_for_failed_and_stuck_maintenances_only() {
    let (Some(prometheus), Some(promtool)) = (tool("prometheus"), tool("promtool")) else {
        return;
    };
    let objects = component_objects();
    let rule = objects
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("the component's PrometheusRule")
        .clone();
    check_rules_are_the_guides(&rule);

    let env = RealEnv::start(Options::workers(3)).await;
    // The component as the real API server takes it (the PrometheusRule
    // against the Prometheus Operator's CRDs), and the ServiceAccount
    // kube-state-metrics' own manifests create.
    let crds =
        std::fs::read_to_string(env.cp.binaries().path("prometheus-operator-crds.yaml")).unwrap();
    env.cp.apply(&crds).await.unwrap();
    Api::<ServiceAccount>::namespaced(env.admin.clone(), "kube-system")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kube-state-metrics"}})).unwrap(),
        )
        .await
        .unwrap();
    let rendered = objects
        .iter()
        .map(|d| nmo::yaml::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n");
    env.cp.apply(&rendered).await.unwrap();
    // Its configuration, as the cluster holds it.
    let config = Api::<ConfigMap>::namespaced(env.admin.clone(), "kube-system")
        .get("kube-state-metrics-nodemaintenance")
        .await
        .unwrap()
        .data
        .unwrap()["custom-resource-state.yaml"]
        .clone();

    // Three maintenances as the operator leaves them: one Succeeded (an
    // empty node), one Running (its drain held by a PodDisruptionBudget
    // that allows nothing), one Failed (a node that does not exist).
    succeeded_and_held(&env, "nm-done", "nm-stuck").await;
    env.create_nm("nm-failed", "ghost").await;
    env.wait_phase("nm-failed", MaintenancePhase::Failed).await;

    // kube-state-metrics with the shipped configuration and only the
    // shipped rights.
    let dir = tempfile::tempdir().unwrap();
    let token = env
        .cp
        .service_account_token("kube-system", "kube-state-metrics")
        .await
        .unwrap();
    let kubeconfig = env
        .cp
        .write_kubeconfig("kube-state-metrics.kubeconfig", &token)
        .unwrap();
    let ksm_port = free_port();
    let _ksm = start_kube_state_metrics(
        &env.cp.binaries().path("kube-state-metrics"),
        dir.path(),
        &kubeconfig,
        &config,
        ksm_port,
    );
    let log = dir.path().join("kube-state-metrics.log");

    // Prometheus scrapes it (honoring its labels, as kube-prometheus-stack's
    // ServiceMonitor for kube-state-metrics does) and evaluates the shipped
    // rules.
    prom::rules_file(&rule, dir.path(), "rules.yaml");
    let server = prom::Server::start(
        &prometheus,
        dir.path(),
        &format!(
            "- job_name: kube-state-metrics\n  honor_labels: true\n  static_configs:\n  - targets: ['127.0.0.1:{ksm_port}']\n"
        ),
        &["rules.yaml"],
    );
    for (name, phase) in [
        ("nm-failed", "Failed"),
        ("nm-stuck", "Running"),
        ("nm-done", "Succeeded"),
    ] {
        wait_value(
            &server,
            &format!(
                r#"kube_customresource_status_phase{{kind="NodeMaintenance", name="{name}", phase="{phase}"}}"#
            ),
            "1",
            &log,
        )
        .await;
    }
    // The node is a label; the other phases are 0.
    let failed = server
        .vector(r#"kube_customresource_status_phase{name="nm-failed"}"#)
        .await;
    assert_eq!(failed.len(), 3, "{failed:?}");
    for s in &failed {
        assert_eq!(s["metric"]["node"], "ghost");
        assert_eq!(s["metric"]["customresource_kind"], "NodeMaintenance");
        let want = if s["metric"]["phase"] == "Failed" {
            "1"
        } else {
            "0"
        };
        assert_eq!(s["value"][1], want, "{s}");
    }
    // The cheap extras: progress, the pods, the pods still waited for,
    // the creation time.
    wait_value(
        &server,
        r#"kube_customresource_nodemaintenance_drain_progress{name="nm-done"}"#,
        "100",
        &log,
    )
    .await;
    let pending = server
        .vector(r#"kube_customresource_nodemaintenance_pending_pod{name="nm-stuck"}"#)
        .await;
    assert!(
        !pending.is_empty()
            && pending.iter().all(|p| {
                p["metric"]["pod_namespace"] == "default"
                    && p["metric"]["pod"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("web-"))
            }),
        "{pending:?}"
    );
    let created = server
        .vector(r#"time() - kube_customresource_nodemaintenance_created{name="nm-done"}"#)
        .await;
    let age: f64 = created[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!((0.0..600.0).contains(&age), "created {age} s ago?");

    // The rules, evaluated by this Prometheus on these series: each alert
    // pending for its maintenance only.
    let alerts = |alert: &'static str| {
        let server = &server;
        async move {
            let mut names: Vec<String> = server
                .vector(&format!(r#"ALERTS{{alertname="{alert}"}}"#))
                .await
                .iter()
                .map(|a| {
                    format!(
                        "{}:{}",
                        a["metric"]["name"].as_str().unwrap_or_default(),
                        a["metric"]["alertstate"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            names.sort();
            names
        }
    };
    wait_until(
        "NodeMaintenanceFailed pending for nm-failed and NodeMaintenanceStuck for nm-stuck",
        Duration::from_secs(30),
        || async {
            alerts("NodeMaintenanceFailed").await == ["nm-failed:pending"]
                && alerts("NodeMaintenanceStuck").await == ["nm-stuck:pending"]
        },
    )
    .await;

    // The series as scraped, replayed by promtool over three hours.
    let scraped = server
        .api(
            "series",
            &[(
                "match[]",
                r#"kube_customresource_status_phase{kind="NodeMaintenance"}"#,
            )],
        )
        .await["data"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(scraped.len(), 9, "3 maintenances x 3 phases: {scraped:?}");
    let mut input = vec![];
    for labels in &scraped {
        let selector = series(labels);
        let value = server.vector(&selector).await[0]["value"][1]
            .as_str()
            .unwrap()
            .to_owned();
        input.push(json!({"series": selector, "values": format!("{value}x180")}));
    }
    let firing = |alert: &str, name: &str, phase: &str| {
        let labels = scraped
            .iter()
            .find(|l| l["name"] == name && l["phase"] == phase)
            .unwrap();
        vec![prom::expected_alert(&prom::rule_of(&rule, alert), labels)]
    };
    let none: Vec<Value> = vec![];
    let tests = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input,
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "NodeMaintenanceFailed", "exp_alerts": none},
                {"eval_time": "6m", "alertname": "NodeMaintenanceFailed",
                 "exp_alerts": firing("NodeMaintenanceFailed", "nm-failed", "Failed")},
                {"eval_time": "119m", "alertname": "NodeMaintenanceStuck", "exp_alerts": none},
                {"eval_time": "121m", "alertname": "NodeMaintenanceStuck",
                 "exp_alerts": firing("NodeMaintenanceStuck", "nm-stuck", "Running")},
                {"eval_time": "170m", "alertname": "NodeMaintenanceFailed",
                 "exp_alerts": firing("NodeMaintenanceFailed", "nm-failed", "Failed")},
            ]
        }]
    });
    let (ok, out) = run(&promtool, &["check", "rules", "rules.yaml"], dir.path());
    assert!(ok, "promtool check rules: {out}");
    let out = prom::promtool_test(&promtool, dir.path(), &tests);
    eprintln!(
        "promtool test rules on the scraped series:\n{}\n{out}",
        std::fs::read_to_string(dir.path().join("tests.yaml")).unwrap()
    );
    drop(server);
    env.stop();
}
