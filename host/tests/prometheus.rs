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

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use nmo::crd::MaintenancePhase;
use serde_json::Value;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

/// The tool's path; `None` (skip) when it is missing outside CI.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is missing: install Debian's prometheus package (.ci/run does)"
        );
        eprintln!("skipped: {name} is not installed (apt-get install prometheus)");
    }
    found
}

/// The PrometheusRule's groups, as a Prometheus rules file.
fn rules_file(dir: &Path) -> (PathBuf, Value) {
    let text = std::fs::read_to_string(deploy("prometheus/monitor.yaml")).unwrap();
    let rule: Value = nmo::yaml::documents::<Value>(&text)
        .unwrap()
        .into_iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let groups = serde_json::json!({"groups": rule["spec"]["groups"]});
    let path = dir.join("rules.yaml");
    std::fs::write(&path, nmo::yaml::to_string(&groups).unwrap()).unwrap();
    (path, rule)
}

fn run(cmd: &Path, args: &[&str], dir: &Path) -> (bool, String) {
    let out = std::process::Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
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

    // The series the rules read are ones the operator exports.
    let exported = nmo::metrics::Metrics::new().render();
    assert!(
        exported.contains(r#"nmo_node_maintenances{phase="Failed"}"#),
        "{exported}"
    );
    assert!(exported.contains(r#"nmo_node_maintenances{phase="Running"}"#));
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let expr = r["expr"].as_str().unwrap();
        assert!(expr.starts_with("nmo_node_maintenances{"), "{expr}");
    }
    let annotations = |alert: &str| {
        rule["spec"]["groups"][0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["alert"] == alert)
            .unwrap()["annotations"]
            .clone()
    };
    let scrape = r#"job="nmo", instance="10.0.0.7:8080""#;
    // As the operator exports them: a gauge per phase, every phase present
    // (0 when none), one sample per scrape.
    let tests = serde_json::json!({
        "rule_files": [rules.file_name().unwrap().to_str().unwrap()],
        "evaluation_interval": "1m",
        "tests": [
            {
                // A maintenance fails at 10m and stays Failed.
                "interval": "1m",
                "input_series": [
                    {"series": format!("nmo_node_maintenances{{phase=\"Failed\", {scrape}}}"), "values": "0x9 1x60"},
                    {"series": format!("nmo_node_maintenances{{phase=\"Running\", {scrape}}}"), "values": "1x9 0x60"},
                    {"series": format!("nmo_node_maintenances{{phase=\"Succeeded\", {scrape}}}"), "values": "0x70"},
                    {"series": format!("nmo_node_maintenances{{phase=\"Pending\", {scrape}}}"), "values": "0x70"},
                ],
                "alert_rule_test": [
                    {"eval_time": "14m", "alertname": "NodeMaintenanceFailed", "exp_alerts": []},
                    {"eval_time": "16m", "alertname": "NodeMaintenanceFailed", "exp_alerts": [
                        {"exp_labels": {"severity": "warning", "phase": "Failed", "job": "nmo", "instance": "10.0.0.7:8080"},
                         "exp_annotations": annotations("NodeMaintenanceFailed")}
                    ]},
                    {"eval_time": "60m", "alertname": "NodeMaintenanceStuck", "exp_alerts": []},
                ]
            },
            {
                // A maintenance runs for 3 hours (a drain held up).
                "interval": "1m",
                "input_series": [
                    {"series": format!("nmo_node_maintenances{{phase=\"Running\", {scrape}}}"), "values": "1x180"},
                    {"series": format!("nmo_node_maintenances{{phase=\"Failed\", {scrape}}}"), "values": "0x180"},
                ],
                "alert_rule_test": [
                    {"eval_time": "119m", "alertname": "NodeMaintenanceStuck", "exp_alerts": []},
                    {"eval_time": "121m", "alertname": "NodeMaintenanceStuck", "exp_alerts": [
                        {"exp_labels": {"severity": "warning", "phase": "Running", "job": "nmo", "instance": "10.0.0.7:8080"},
                         "exp_annotations": annotations("NodeMaintenanceStuck")}
                    ]},
                    {"eval_time": "170m", "alertname": "NodeMaintenanceFailed", "exp_alerts": []},
                ]
            },
            {
                // Maintenances that ran and succeeded: no alert, ever.
                "interval": "1m",
                "input_series": [
                    {"series": format!("nmo_node_maintenances{{phase=\"Running\", {scrape}}}"), "values": "1x20 0x200"},
                    {"series": format!("nmo_node_maintenances{{phase=\"Succeeded\", {scrape}}}"), "values": "0x20 3x200"},
                    {"series": format!("nmo_node_maintenances{{phase=\"Failed\", {scrape}}}"), "values": "0x220"},
                ],
                "alert_rule_test": [
                    {"eval_time": "30m", "alertname": "NodeMaintenanceFailed", "exp_alerts": []},
                    {"eval_time": "200m", "alertname": "NodeMaintenanceStuck", "exp_alerts": []},
                    {"eval_time": "200m", "alertname": "NodeMaintenanceFailed", "exp_alerts": []},
                ]
            }
        ]
    });
    std::fs::write(
        dir.path().join("tests.yaml"),
        nmo::yaml::to_string(&tests).unwrap(),
    )
    .unwrap();
    let (ok, out) = run(&promtool, &["test", "rules", "tests.yaml"], dir.path());
    assert!(ok, "promtool test rules: {out}");
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

/// Asks Prometheus's HTTP API.
async fn query(port: u16, expr: &str) -> Value {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--get", "--data-urlencode"])
        .arg(format!("query={expr}"))
        .arg(format!("http://127.0.0.1:{port}/api/v1/query"))
        .output()
        .await
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
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
    let store = policy_store(None);
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&cluster.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let counted =
        nmo::client::operator_client_counted(config, Some(store.metrics().clone())).unwrap();
    let ctx = nmo::controller::Context::new(counted, store, Default::default());
    let env = Env {
        cluster,
        client,
        controller: tokio::spawn({
            let ctx = ctx.clone();
            async move {
                nmo::controller::run(ctx).await.expect("controller runs");
            }
        }),
        metrics: ctx.metrics.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_port = listener.local_addr().unwrap().port();
    let c = ctx.clone();
    tokio::spawn(nmo::server::serve(
        listener,
        nmo::server::metrics(env.metrics.clone(), Arc::new(move || c.refresh_gauges())),
    ));

    let dir = tempfile::tempdir().unwrap();
    let prom_port = free_port();
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n- job_name: nmo\n  static_configs:\n  - targets: ['127.0.0.1:{metrics_port}']\n"
        ),
    )
    .unwrap();
    let mut server = tokio::process::Command::new(&prometheus)
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until(
        "Prometheus scraping the operator",
        Duration::from_secs(30),
        || async {
            query(prom_port, "up{job=\"nmo\"}").await["data"]["result"][0]["value"][1] == "1"
        },
    )
    .await;

    env.create_nm("nm-1", "worker-1").await;
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    for (title, expr) in dashboard_queries() {
        wait_until(
            &format!("data for the panel {title:?}: {expr}"),
            Duration::from_secs(30),
            || async {
                let answer = query(prom_port, &expr).await;
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
                query(prom_port, expr).await["data"]["result"][0]["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v > 0.0)
            },
        )
        .await;
    }
    // The phase the dashboard shows is the maintenance's.
    let succeeded = query(
        prom_port,
        "sum by (phase) (nmo_node_maintenances{phase=\"Succeeded\"})",
    )
    .await;
    assert_eq!(
        succeeded["data"]["result"][0]["value"][1], "1",
        "{succeeded}"
    );
    server.kill().await.unwrap();
    env.stop().await;
}
