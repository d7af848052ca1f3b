//! The operations guide's monitoring, with the tools SREs run: a real
//! Prometheus Operator (built from its pinned module,
//! tests/control-plane/versions.env) beside the control plane, and the
//! Prometheus it manages as a pod on the real node. nmo is installed as a
//! user installs it, `helm install` with `prometheus.enabled=true`; the
//! guide's kube-state-metrics runs as a pod with deploy/kube-state-metrics
//! (its configuration, rights and the guide's alerts) and a ServiceMonitor
//! as kube-prometheus-stack makes for it (`honorLabels`).
//!
//! What must hold: the guide's `kubectl get servicemonitor` lists nmo's;
//! the Prometheus Operator turns the chart's ServiceMonitor into a scrape
//! of both replicas over HTTPS with Prometheus's own ServiceAccount token
//! (its RBAC as the Prometheus Operator's docs give it: get on /metrics),
//! and both targets are up; the guide's metric is there; nmo's rules and
//! the guide's load; for a Failed and a Running maintenance all four
//! alerts go pending, naming the maintenance, and, with their `for`
//! shortened (the one change: that `for` itself is held by `promtool test
//! rules` in host/tests/prometheus.rs), fire.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use nmo_control_plane::{ControlPlane, isolated, scratch_image};
use serde_json::Value;

use crate::common::prometheus::Server;
use crate::common::{free_port, real::rendered};
use crate::real_node::{KWOK, NS, REAL, helm_install, kubectl_ok, no_restarts, operator_ready};

const MONITORING: &str = "monitoring";
const PROMETHEUS_IMAGE: &str = "localhost/prometheus:v3.10.0";
const RELOADER_IMAGE: &str = "localhost/prometheus-config-reloader:v0.90.1";
const KSM_IMAGE: &str = "localhost/kube-state-metrics:v2.20.0";

/// The images the node needs beside nmo's: Prometheus, the Prometheus
/// Operator's config reloader and kube-state-metrics, each its one static
/// binary (built with the control plane) in a scratch image.
fn images(dir: &Path) -> Vec<std::path::PathBuf> {
    let bins = nmo_control_plane::Binaries::ensure().expect("the control plane's binaries");
    [
        ("prometheus", PROMETHEUS_IMAGE, "/bin/prometheus"),
        (
            "prometheus-config-reloader",
            RELOADER_IMAGE,
            "/bin/prometheus-config-reloader",
        ),
        ("kube-state-metrics", KSM_IMAGE, "/bin/kube-state-metrics"),
    ]
    .into_iter()
    .map(|(binary, name, at)| {
        let out = dir.join(format!("{binary}.tar"));
        scratch_image(&bins.path(binary), &out, name, at, "65534:65534")
            .unwrap_or_else(|e| panic!("the {binary} image: {e}"));
        out
    })
    .collect()
}

/// The Prometheus Operator as a process beside the control plane (its
/// admin kubeconfig), every namespace watched, the reloader image the
/// node has. Its log goes to `dir`.
fn start_prometheus_operator(cp: &ControlPlane, dir: &Path) -> tokio::process::Child {
    let log = std::fs::File::create(dir.join("prometheus-operator.log")).unwrap();
    tokio::process::Command::new(cp.binaries().path("prometheus-operator"))
        .env("KUBECONFIG", cp.kubeconfig_path())
        .arg(format!("--prometheus-config-reloader={RELOADER_IMAGE}"))
        .arg(format!("--web.listen-address=127.0.0.1:{}", free_port()))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("the Prometheus Operator starts")
}

/// Prometheus as the Prometheus Operator's docs set it up: a
/// ServiceAccount whose ClusterRole reads what service discovery needs
/// and may get /metrics; every ServiceMonitor and rule of every
/// namespace selected; short intervals (settings, so the test is quick).
const PROMETHEUS: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: prometheus, namespace: monitoring}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: prometheus}
rules:
- apiGroups: [""]
  resources: [nodes, nodes/metrics, services, endpoints, pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [ingresses]
  verbs: [get, list, watch]
- nonResourceURLs: [/metrics]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: prometheus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: prometheus}
subjects:
- {kind: ServiceAccount, name: prometheus, namespace: monitoring}
---
apiVersion: monitoring.coreos.com/v1
kind: Prometheus
metadata: {name: k8s, namespace: monitoring}
spec:
  image: PROMETHEUS_IMAGE
  version: v3.10.0
  replicas: 1
  serviceAccountName: prometheus
  serviceMonitorSelector: {}
  serviceMonitorNamespaceSelector: {}
  ruleSelector: {}
  ruleNamespaceSelector: {}
  scrapeInterval: 2s
  evaluationInterval: 2s
"#;

/// kube-state-metrics as a cluster runs it for the guide: its own
/// ServiceAccount (deploy/kube-state-metrics binds it), only the custom
/// resources' metrics from the shipped configuration, and the
/// ServiceMonitor kube-prometheus-stack makes for it.
const KUBE_STATE_METRICS: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-state-metrics, namespace: kube-system}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: kube-state-metrics, namespace: kube-system}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: kube-state-metrics}}
  template:
    metadata: {labels: {app.kubernetes.io/name: kube-state-metrics}}
    spec:
      serviceAccountName: kube-state-metrics
      containers:
      - name: kube-state-metrics
        image: KSM_IMAGE
        args:
        - --custom-resource-state-only
        - --custom-resource-state-config-file=/etc/ksm/custom-resource-state.yaml
        - --port=8080
        - --telemetry-port=8081
        ports:
        - {name: http-metrics, containerPort: 8080}
        volumeMounts:
        - {name: config, mountPath: /etc/ksm}
      volumes:
      - name: config
        configMap: {name: kube-state-metrics-nodemaintenance}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-state-metrics
  namespace: kube-system
  labels: {app.kubernetes.io/name: kube-state-metrics}
spec:
  selector: {app.kubernetes.io/name: kube-state-metrics}
  ports:
  - {name: http-metrics, port: 8080, targetPort: http-metrics}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: kube-state-metrics, namespace: kube-system}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: kube-state-metrics}}
  endpoints:
  - {port: http-metrics, honorLabels: true}
"#;

/// The objects deploy/kube-state-metrics adds (its configuration, the
/// rights and the guide's alerts), as YAML.
fn kube_state_metrics_component() -> String {
    rendered("with-kube-state-metrics")
        .into_iter()
        .filter(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.contains("kube-state-metrics"))
        })
        .map(|d| nmo::yaml::to_string(&d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

/// A maintenance that fails: made before the operator (and its webhook,
/// which would refuse it) is installed, of a node that does not exist.
async fn ghost_maintenance(cp: &ControlPlane) {
    let client = cp.client().await.unwrap();
    nmo::crd::apply(&client, Duration::from_secs(60))
        .await
        .expect("the CRD applies");
    kubectl_ok(
        cp,
        &["create", "-f", "-"],
        Some(&crate::real_node::maintenance("nm-failed", "ghost")),
    )
    .await;
}

/// A maintenance that keeps Running: a pod on the kwok node behind a
/// budget that allows no eviction.
async fn held_maintenance(cp: &ControlPlane) {
    kubectl_ok(
        cp,
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: held, namespace: default, labels: {{app: held}}}}\n\
             spec:\n  nodeName: {KWOK}\n  tolerations: [{{operator: Exists}}]\n  \
             containers: [{{name: c, image: busybox}}]\n---\n\
             apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: held, namespace: default}}\n\
             spec: {{minAvailable: 1, selector: {{matchLabels: {{app: held}}}}}}\n"
        )),
    )
    .await;
    // Through the webhook, once its Service answers.
    crate::real_node::admits_once_through_the_webhook(cp, "nm-stuck", KWOK).await;
}

/// Waits, at most `limit`, until `ok` holds of `path` of the Prometheus
/// API (`/api/v1/<path>`); the last answer and the Prometheus Operator's
/// log on failure.
async fn wait_api(
    server: &Server,
    what: &str,
    path: &str,
    limit: Duration,
    dir: &Path,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let begun = Instant::now();
    loop {
        let answer = server.api(path, &[]).await;
        if ok(&answer) {
            return answer;
        }
        assert!(
            begun.elapsed() < limit,
            "never {what} within {limit:?}; /api/v1/{path}: {answer:#}\nthe Prometheus Operator's log:\n{}",
            tail(&std::fs::read_to_string(dir.join("prometheus-operator.log")).unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The Prometheus pod's address, once it is Ready.
async fn prometheus_pod(cp: &mut ControlPlane) -> String {
    let pods: Api<Pod> = Api::namespaced(cp.client().await.unwrap(), MONITORING);
    let found = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let waited = cp
        .wait_for(
            "the Prometheus Operator's Prometheus pod Ready",
            Duration::from_secs(180),
            || {
                let pods = pods.clone();
                let found = found.clone();
                async move {
                    let ready = pods
                        .list(&ListParams::default().labels("app.kubernetes.io/name=prometheus"))
                        .await
                        .ok()
                        .and_then(|l| l.items.into_iter().next())
                        .and_then(|p| p.status)
                        .filter(|s| {
                            s.container_statuses
                                .as_ref()
                                .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c.ready))
                        })
                        .and_then(|s| s.pod_ip);
                    let is = ready.is_some();
                    *found.lock().unwrap() = ready;
                    is
                }
            },
        )
        .await;
    if let Err(e) = waited {
        crate::real_node::fail_describing(cp, MONITORING, e).await;
    }
    found.lock().unwrap().clone().unwrap()
}

/// The active alerts named `alert` for maintenance `name`, as
/// (state, labels).
fn alerts_for(answer: &Value, alert: &str, name: &str) -> Vec<String> {
    answer["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["labels"]["alertname"] == alert)
        .filter(|a| a["labels"]["node_maintenance"] == name || a["labels"]["name"] == name)
        .map(|a| a["state"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The four alerts (nmo's two, the guide's two) for the Failed and the
/// Running maintenance, each in `state`.
fn all_alerts_in(answer: &Value, state: &str) -> bool {
    [
        ("NodeMaintenanceFailed", "nm-failed"),
        ("NodeMaintenanceStuck", "nm-stuck"),
    ]
    .into_iter()
    .all(|(alert, name)| {
        let states = alerts_for(answer, alert, name);
        // One from nmo's rules (node_maintenance), one from the guide's
        // (kube-state-metrics' name).
        states.len() == 2 && states.iter().all(|s| s == state)
    })
}

/// The active alerts, one line each: name, maintenance, state.
fn summary(answer: &Value) -> String {
    answer["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let l = &a["labels"];
            let name = l["node_maintenance"].as_str().or(l["name"].as_str());
            format!(
                "{} {} {}",
                l["alertname"].as_str().unwrap_or_default(),
                name.unwrap_or_default(),
                a["state"].as_str().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every shipped PrometheusRule with its alerts' `for` set to `to`.
fn rules_with_for(to: &str) -> String {
    let mut rules: Vec<Value> = rendered("with-prometheus")
        .into_iter()
        .chain(rendered("with-kube-state-metrics"))
        .filter(|d| d["kind"] == "PrometheusRule")
        .collect();
    for rule in &mut rules {
        for group in rule["spec"]["groups"].as_array_mut().unwrap() {
            for r in group["rules"].as_array_mut().unwrap() {
                r["for"] = Value::from(to);
            }
        }
    }
    rules
        .iter()
        .map(|d| nmo::yaml::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

#[test]
fn the_prometheus_operator_scrapes_nmo_through_the_charts_service_monitor_and_its_alerts_fire() {
    let work = tempfile::tempdir().unwrap();
    let mut all = vec![crate::image::archive()];
    all.extend(images(work.path()));
    let dir = work.path().to_owned();
    isolated(move || async move {
        let begun = Instant::now();
        let mut cp = crate::real_node::start_with(&[REAL], all).await;
        cp.start_cert_manager().await.unwrap();
        let crds =
            std::fs::read_to_string(cp.binaries().path("prometheus-operator-crds-all.yaml")).unwrap();
        cp.apply(&crds).await.unwrap();
        ghost_maintenance(&cp).await;

        // nmo as the chart installs it, with its Prometheus objects.
        helm_install(&cp, &["prometheus.enabled=true"]);
        let pods = operator_ready(&mut cp).await;
        // The guide: "kubectl get servicemonitor -n node-maintenance-operator-system".
        let monitors = kubectl_ok(&cp, &["get", "servicemonitor", "-n", NS], None).await;
        assert!(
            monitors.contains("node-maintenance-operator-controller-manager-metrics-monitor"),
            "{monitors}"
        );
        held_maintenance(&cp).await;

        // The guide's kube-state-metrics, then Prometheus.
        let ksm = kube_state_metrics_component();
        cp.apply(&ksm).await.unwrap();
        cp.apply(&KUBE_STATE_METRICS.replace("KSM_IMAGE", KSM_IMAGE))
            .await
            .unwrap();
        kubectl_ok(&cp, &["create", "namespace", MONITORING], None).await;
        let _operator = start_prometheus_operator(&cp, &dir);
        cp.apply(&PROMETHEUS.replace("PROMETHEUS_IMAGE", PROMETHEUS_IMAGE))
            .await
            .unwrap();
        let ip = prometheus_pod(&mut cp).await;
        eprintln!("Prometheus Ready at {ip} after {:?}", begun.elapsed());
        let prometheus = Server::at(format!("http://{ip}:9090"));

        // Both replicas scraped over HTTPS with Prometheus's token, up.
        let limit = Duration::from_secs(120);
        let targets = wait_api(
            &prometheus,
            "both nmo replicas' targets up",
            "targets",
            limit,
            &dir,
            |a| {
                let nmo: Vec<&Value> = a["data"]["activeTargets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|t| t["labels"]["namespace"] == NS)
                    .collect();
                nmo.len() == 2 && nmo.iter().all(|t| t["health"] == "up")
            },
        )
        .await;
        for t in targets["data"]["activeTargets"].as_array().unwrap() {
            if t["labels"]["namespace"] == NS {
                let url = t["scrapeUrl"].as_str().unwrap();
                assert!(
                    url.starts_with("https://") && url.ends_with(":8443/metrics"),
                    "{t}"
                );
            }
        }
        // The guide's metric, from both.
        wait_api(
            &prometheus,
            "controller_runtime_reconcile_total from both replicas",
            &format!(
                "query?query=count(count%20by%20(pod)%20(controller_runtime_reconcile_total%7Bnamespace%3D%22{NS}%22%7D))"
            ),
            limit,
            &dir,
            |a| a["data"]["result"][0]["value"][1] == "2",
        )
        .await;

        // nmo's rules and the guide's, loaded and healthy.
        let rules = wait_api(&prometheus, "the four alerting rules loaded", "rules", limit, &dir, |a| {
            let names: Vec<&str> = a["data"]["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                .filter_map(|r| r["name"].as_str())
                .collect();
            names.len() == 4
                && names.iter().filter(|n| **n == "NodeMaintenanceFailed").count() == 2
                && names.iter().filter(|n| **n == "NodeMaintenanceStuck").count() == 2
        })
        .await;
        for g in rules["data"]["groups"].as_array().unwrap() {
            for r in g["rules"].as_array().unwrap() {
                assert_eq!(r["health"], "ok", "{r}");
            }
        }

        // A Failed and a Running maintenance: the alerts pending (their
        // `for` still to run)...
        let pending = wait_api(&prometheus, "all four alerts pending", "alerts", limit, &dir, |a| {
            all_alerts_in(a, "pending")
        })
        .await;
        eprintln!("after {:?}: {}", begun.elapsed(), summary(&pending));
        // ...and firing once their `for` is over (shortened here).
        cp.apply_forcing(&rules_with_for("1s")).await.unwrap();
        let firing = wait_api(&prometheus, "all four alerts firing", "alerts", limit, &dir, |a| {
            all_alerts_in(a, "firing")
        })
        .await;
        eprintln!("after {:?}: {}", begun.elapsed(), summary(&firing));

        no_restarts(&cp, NS, &pods).await;
        eprintln!("done after {:?}", begun.elapsed());
        cp.stop();
    })
    .unwrap();
}
