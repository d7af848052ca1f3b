//! The alerts and the Grafana dashboard, checked by a real Prometheus
//! (Debian's `prometheus` package: `promtool` and `prometheus`; `.ci/run`
//! installs it): the shipped rules pass `promtool check rules`; `promtool
//! test rules` with series shaped as the operator exports them fires
//! `NodeMaintenanceFailed` after its `for`, `NodeMaintenanceStuck` after 2 h,
//! and neither for a maintenance that succeeded; and a Prometheus scraping a
//! running operator through a maintenance returns data for every panel of
//! the dashboard.
//!
//! Outside CI (`CI` unset) a machine without Prometheus skips these with a
//! message; in CI a missing Prometheus fails them.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::prometheus::{self as prom, run, tool};
use common::*;
use nmo::crd::MaintenancePhase;
use serde_json::Value;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

/// The operator's PrometheusRule, and its groups as a rules file.
fn rules_file(dir: &Path) -> (PathBuf, Value) {
    let text = std::fs::read_to_string(deploy("prometheus/monitor.yaml")).unwrap();
    let rule: Value = nmo::yaml::documents::<Value>(&text)
        .unwrap()
        .into_iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    (prom::rules_file(&rule, dir, "rules.yaml"), rule)
}

#[test]
fn the_alerts_fire_when_they_should_and_only_then() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (rules, rule) = rules_file(dir.path());
    let (ok, out) = run(&promtool, &["check", "rules", "rules.yaml"], dir.path());
    assert!(ok, "promtool check rules: {out}");

    // The series the rules read are ones the operator exports: one per
    // maintenance, for its phase.
    let metrics = metrics();
    metrics
        .controller
        .set_maintenances([("nm-a", "worker-1", State::Failed, 0)]);
    let exported = metrics.render().unwrap();
    assert!(
        exported.contains(
            r#"nmo_node_maintenance_phase{node="worker-1",node_maintenance="nm-a",phase="Failed"} 1"#
        ),
        "{exported}"
    );
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let expr = r["expr"].as_str().unwrap();
        assert!(expr.contains("nmo_node_maintenance_phase{"), "{expr}");
    }
    // An alert as promtool shows it: its labels, and the rule's
    // annotations filled in for the maintenance.
    let alert = |name: &str, nm: &str, node: &str| {
        prom::expected_alert(
            &prom::rule_of(&rule, name),
            &serde_json::json!({"node_maintenance": nm, "node": node}),
        )
    };
    // As the operator exports it: one series per maintenance, for the
    // phase it is in (the others absent: `_`), one sample per scrape, from
    // each of two replicas.
    let series = |nm: &str, node: &str, phase: &str, values: &str| {
        ["10.0.0.7:8080", "10.0.0.8:8080"].map(|instance| {
            serde_json::json!({
                "series": format!(
                    "nmo_node_maintenance_phase{{node_maintenance=\"{nm}\", node=\"{node}\", phase=\"{phase}\", job=\"nmo\", instance=\"{instance}\"}}"
                ),
                "values": values,
            })
        })
    };
    let inputs = |all: Vec<[Value; 2]>| all.into_iter().flatten().collect::<Vec<_>>();
    let none: Vec<Value> = vec![];
    let tests = serde_json::json!({
        "rule_files": [rules.file_name().unwrap().to_str().unwrap()],
        "evaluation_interval": "1m",
        "tests": [
            {
                // nm-a runs 10 minutes, then fails and stays Failed.
                "interval": "1m",
                "input_series": inputs(vec![
                    series("nm-a", "worker-1", "Running", "1x9"),
                    series("nm-a", "worker-1", "Failed", "_x10 1x60"),
                ]),
                "alert_rule_test": [
                    {"eval_time": "14m", "alertname": "NodeMaintenanceFailed", "exp_alerts": none},
                    {"eval_time": "16m", "alertname": "NodeMaintenanceFailed",
                     "exp_alerts": [alert("NodeMaintenanceFailed", "nm-a", "worker-1")]},
                    {"eval_time": "60m", "alertname": "NodeMaintenanceStuck", "exp_alerts": none},
                ]
            },
            {
                // nm-b runs for 3 hours (a drain held up); nm-c beside it
                // succeeds after 20 minutes.
                "interval": "1m",
                "input_series": inputs(vec![
                    series("nm-b", "worker-2", "Running", "1x180"),
                    series("nm-c", "worker-3", "Running", "1x19"),
                    series("nm-c", "worker-3", "Succeeded", "_x20 1x160"),
                ]),
                "alert_rule_test": [
                    {"eval_time": "119m", "alertname": "NodeMaintenanceStuck", "exp_alerts": none},
                    {"eval_time": "121m", "alertname": "NodeMaintenanceStuck",
                     "exp_alerts": [alert("NodeMaintenanceStuck", "nm-b", "worker-2")]},
                    {"eval_time": "170m", "alertname": "NodeMaintenanceFailed", "exp_alerts": none},
                ]
            },
            {
                // Three maintenances back to back, each Running for an
                // hour, then Succeeded: some maintenance runs for three
                // hours, none of them for two. No alert, ever.
                "interval": "1m",
                "input_series": inputs(vec![
                    series("nm-d", "worker-1", "Running", "1x59"),
                    series("nm-d", "worker-1", "Succeeded", "_x60 1x140"),
                    series("nm-e", "worker-2", "Running", "_x60 1x59"),
                    series("nm-e", "worker-2", "Succeeded", "_x120 1x80"),
                    series("nm-f", "worker-3", "Running", "_x120 1x59"),
                    series("nm-f", "worker-3", "Succeeded", "_x180 1x20"),
                ]),
                "alert_rule_test": [
                    {"eval_time": "125m", "alertname": "NodeMaintenanceStuck", "exp_alerts": none},
                    {"eval_time": "179m", "alertname": "NodeMaintenanceStuck", "exp_alerts": none},
                    {"eval_time": "200m", "alertname": "NodeMaintenanceFailed", "exp_alerts": none},
                ]
            }
        ]
    });
    prom::promtool_test(&promtool, dir.path(), &tests);
}

/// The dashboard's panel queries.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy("grafana/dashboard.yaml")).unwrap();
    let cm: Value = nmo::yaml::from_str(&text).unwrap();
    let json = cm["data"]["node-maintenance-operator.json"]
        .as_str()
        .unwrap();
    let dashboard: Value = serde_json::from_str(json).unwrap();
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_owned()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scraping_the_operator_has_data_for_every_dashboard_panel() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    // The operator, with the context whose gauges are refreshed at each
    // scrape, as the binary serves its metrics.
    let (cluster, client) = start_cluster(2).await;
    for i in 0..3 {
        cluster
            .create(bare(
                &format!("p-{i}"),
                "worker-1",
                serde_json::json!({}),
                30,
            ))
            .unwrap();
    }
    // The operator's client counts its requests in the same registry, as
    // the binary's does.
    let counts = metrics();
    let store = policy_store_counted(None, counts.policy.clone());
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&cluster.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let counted =
        nmo::client::operator_client_counted(config, Some(counts.client.clone())).unwrap();
    let ctx = nmo::controller::Context::new(
        counted,
        store,
        Default::default(),
        counts.controller.clone(),
    );
    let env = Env {
        cluster,
        client,
        controller: tokio::spawn({
            let ctx = ctx.clone();
            async move {
                nmo::controller::run(ctx).await.expect("controller runs");
            }
        }),
        metrics: counts,
        ctx: Some(ctx.clone()),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_port = listener.local_addr().unwrap().port();
    let c = ctx.clone();
    tokio::spawn(nmo::server::serve(
        listener,
        nmo::server::metrics(
            env.metrics.registry.clone(),
            Arc::new(move || c.refresh_gauges()),
        ),
    ));

    let dir = tempfile::tempdir().unwrap();
    let server = prom::Server::start(
        &prometheus,
        dir.path(),
        &format!("- job_name: nmo\n  static_configs:\n  - targets: ['127.0.0.1:{metrics_port}']\n"),
        &[],
    );
    wait_until(
        "Prometheus scraping the operator",
        Duration::from_secs(30),
        || async { server.query("up{job=\"nmo\"}").await["data"]["result"][0]["value"][1] == "1" },
    )
    .await;

    env.create_nm("nm-1", "worker-1").await;
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    for (title, expr) in dashboard_queries() {
        wait_until(
            &format!("data for the panel {title:?}: {expr}"),
            Duration::from_secs(30),
            || async {
                let answer = server.query(&expr).await;
                answer["status"] == "success"
                    && answer["data"]["result"]
                        .as_array()
                        .is_some_and(|r| !r.is_empty())
            },
        )
        .await;
    }
    // client-go's and the process's families, as dashboards for
    // controller-runtime operators expect them.
    for expr in [
        r#"sum(rest_client_requests_total{job="nmo", code="201", method="POST"})"#,
        r#"sum(rest_client_requests_total{job="nmo", code="200", method="GET"})"#,
        r#"process_resident_memory_bytes{job="nmo"}"#,
        // Whole seconds (the collector's counter is an integer): present,
        // and counting from the process's start.
        r#"process_start_time_seconds{job="nmo"}"#,
        r#"process_cpu_seconds_total{job="nmo"} + 1"#,
    ] {
        wait_until(
            &format!("a value for {expr}"),
            Duration::from_secs(30),
            || async {
                server.query(expr).await["data"]["result"][0]["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v > 0.0)
            },
        )
        .await;
    }
    // The phase the dashboard shows is the maintenance's.
    let succeeded = server
        .query("sum by (phase) (nmo_node_maintenances{phase=\"Succeeded\"})")
        .await;
    assert_eq!(
        succeeded["data"]["result"][0]["value"][1], "1",
        "{succeeded}"
    );
    drop(server);
    env.stop().await;
}
