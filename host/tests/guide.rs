//! The Go operator's operations guide (`../shared/seeds/`), command by
//! command, against nmo installed as its README installs it (the
//! README's overlay of deploy/default, as pods on a real node). Each
//! command either gives what the guide says, or is in docs/operator.md's
//! table of the guide's commands with one that works instead, and that
//! one is run here as the docs write it: the events, `describe`, the
//! events watch, the probes and the metrics recipe through `kubectl
//! port-forward` (with a token; and, once deploy/metrics-open is applied,
//! the guide's own recipe as written), `--zap-level=debug`.
//! (`kubectl get servicemonitor` and the alerts:
//! host/tests/prometheus_operator.rs and kube_state_metrics.rs.)

use std::process::Stdio;
use std::time::{Duration, Instant};

use nmo_control_plane::{ControlPlane, isolated};
use tokio::io::AsyncBufReadExt;

use crate::common::blocks;
use crate::real_node::{
    KWOK, NS, REAL, admits_once_through_the_webhook, apply_overlay, cp_phase, kubectl_ok,
    operator_ready, start, user_overlay, web_on_kwok,
};

const DEPLOYMENT: &str = "deployment/node-maintenance-operator-controller-manager";

/// Runs `script` with bash as a user's shell runs it: kubectl on the
/// PATH, the control plane's admin kubeconfig, at most `limit`. Returns
/// whether it succeeded, and its stdout and stderr together.
async fn shell(cp: &ControlPlane, script: &str, limit: Duration) -> (bool, String) {
    let run = tokio::process::Command::new("bash")
        .args(["-c", script])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(limit, run).await {
        Ok(Ok(out)) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Ok(Err(e)) => (false, format!("bash: {e}")),
        Err(_) => (false, format!("still running after {limit:?}")),
    }
}

/// A `kubectl port-forward` the way a user leaves one running in another
/// terminal: started, and waited for until it says it forwards (at most
/// 60 s). Stopped when dropped.
async fn port_forward(cp: &ControlPlane, ports: &str) -> tokio::process::Child {
    let mut child = tokio::process::Command::new("kubectl")
        .args(["port-forward", "-n", NS, DEPLOYMENT, ports])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let said = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("Forwarding from") {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(said, Ok(true)),
        "kubectl port-forward {ports} never forwarded"
    );
    // Keep reading, so the forward never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// docs/operator.md's section on the guide's commands.
fn operators_guide_section() -> String {
    let text =
        std::fs::read_to_string(crate::common::real::deploy_dir().join("../docs/operator.md"))
            .unwrap();
    let start = text
        .find("## The operations guide's commands, on nmo")
        .expect("docs/operator.md has the guide's commands");
    let rest = &text[start + 3..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_owned()
}

/// Waits until the Deployment's rollout is complete (what went wrong on
/// failure: the pods, their logs, the events).
async fn rolled_out(cp: &ControlPlane) {
    let status = cp
        .kubectl(
            &["rollout", "status", "-n", NS, DEPLOYMENT, "--timeout=180s"],
            None,
        )
        .await;
    if let Err(e) = status {
        crate::real_node::fail_describing(cp, NS, e).await;
    }
}

/// The guide's event commands, after a maintenance that succeeded.
async fn events_as_the_guide_reads_them(cp: &ControlPlane) {
    let limit = Duration::from_secs(60);
    // "kubectl get events --sort-by='.lastTimestamp' | grep -i maintenance"
    let (ok, out) = shell(
        cp,
        "kubectl get events --sort-by='.lastTimestamp' | grep -i maintenance",
        limit,
    )
    .await;
    assert!(
        ok && out.contains("BeginMaintenance") && out.contains("SucceedMaintenance"),
        "{out}"
    );
    // "kubectl describe nm <name>": the state and the events together.
    let (ok, out) = shell(cp, "kubectl describe nm nm-guide", limit).await;
    assert!(ok, "{out}");
    for want in [
        "Phase:",
        "Succeeded",
        "BeginMaintenance",
        "SucceedMaintenance",
    ] {
        assert!(out.contains(want), "no {want} in:\n{out}");
    }
    // "kubectl get events -w | grep NodeMaintenance" prints nothing, for
    // either operator (the watch names the object nodemaintenance/<name>);
    // the docs' command instead lists the maintenance's events. Each
    // watch is stopped after 10 s, as a user stops one.
    let section = operators_guide_section();
    assert!(
        section.contains(
            "`kubectl get events -w --field-selector involvedObject.kind=NodeMaintenance`"
        ),
        "docs/operator.md no longer gives the watch that works"
    );
    let (_, out) = shell(
        cp,
        "timeout 10 kubectl get events -w | grep NodeMaintenance",
        limit,
    )
    .await;
    assert!(out.trim().is_empty(), "the guide's watch printed: {out}");
    let (_, out) = shell(
        cp,
        "timeout 10 kubectl get events -w --field-selector involvedObject.kind=NodeMaintenance",
        limit,
    )
    .await;
    assert!(
        out.contains("BeginMaintenance") && out.contains("nodemaintenance/nm-guide"),
        "{out}"
    );
}

/// The probes the guide names, on :8081, through a port-forward.
async fn probes_as_the_guide_reads_them(cp: &ControlPlane) {
    let _forward = port_forward(cp, "8081:8081").await;
    for path in ["/healthz", "/readyz"] {
        let (ok, out) = shell(
            cp,
            &format!("curl -s -o /dev/null -w '%{{http_code}}' http://localhost:8081{path}"),
            Duration::from_secs(30),
        )
        .await;
        assert!(ok && out == "200", "{path}: {out}");
    }
}

/// The guide's metrics recipe on the shipped install: refused on :8080
/// (the docs say so); the docs' recipe with a token reads them.
async fn metrics_with_a_token(cp: &ControlPlane) {
    let section = operators_guide_section();
    assert!(
        section.contains("`kubectl port-forward ... 8080:8080`, then `curl http://localhost:8080/metrics` | connection refused"),
        "docs/operator.md no longer lists the guide's recipe"
    );
    {
        let _forward = port_forward(cp, "8080:8080").await;
        let (ok, out) = shell(
            cp,
            "curl -s http://localhost:8080/metrics | grep controller_runtime_reconcile",
            Duration::from_secs(30),
        )
        .await;
        assert!(!ok, "the guide's recipe read metrics on :8080: {out}");
    }
    let recipe = blocks(&section, "sh");
    assert_eq!(recipe.len(), 1, "one recipe in the section: {recipe:?}");
    // The recipe leaves its port-forward running, as in a terminal.
    let script = format!("{}\nkill $!\n", recipe[0]);
    let (ok, out) = shell(cp, &script, Duration::from_secs(120)).await;
    assert!(
        ok && out.contains("controller_runtime_reconcile_total{"),
        "the docs' recipe with a token:\n{out}"
    );
}

/// deploy/metrics-open, applied over the install as the README's overlay
/// of it: then the guide's recipe works as written.
async fn metrics_open_as_the_guide_reads_them(cp: &ControlPlane, dir: &std::path::Path) {
    // Its ServiceMonitor needs the Prometheus Operator's CRDs.
    let crds =
        std::fs::read_to_string(cp.binaries().path("prometheus-operator-crds.yaml")).unwrap();
    cp.apply(&crds).await.unwrap();
    let overlay = dir.join("my-nmo");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources: [../deploy/metrics-open]\nimages:\n- {name: nmo, newName: localhost/nmo, newTag: dev}\n",
    )
    .unwrap();
    apply_overlay(cp, &overlay).await;
    rolled_out(cp).await;
    // "kubectl port-forward -n node-maintenance-operator-system
    //    deployment/node-maintenance-operator-controller-manager 8080:8080"
    let _forward = port_forward(cp, "8080:8080").await;
    let (ok, out) = shell(
        cp,
        "curl http://localhost:8080/metrics | grep controller_runtime_reconcile",
        Duration::from_secs(30),
    )
    .await;
    assert!(
        ok && out.contains("controller_runtime_reconcile_total{"),
        "{out}"
    );
}

/// The guide: "--zap-level=debug" in the Deployment's args gives
/// detailed JSON logs, the operator's own.
async fn debug_logs(cp: &ControlPlane) {
    kubectl_ok(
        cp,
        &[
            "patch",
            "-n",
            NS,
            DEPLOYMENT,
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--zap-level=debug"}]"#,
        ],
        None,
    )
    .await;
    rolled_out(cp).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, log) = shell(
            cp,
            &format!("kubectl logs -n {NS} -l control-plane=controller-manager --tail=200"),
            Duration::from_secs(30),
        )
        .await;
        let lines: Vec<serde_json::Value> = log
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let debug = lines.iter().filter(|l| l["level"] == "debug").count();
        if debug > 0 {
            assert!(
                !log.contains("tower::buffer") && !log.contains("processing request"),
                "library noise at debug:\n{log}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no debug line in the log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn the_operations_guides_commands_work_or_the_docs_say_what_does() {
    let image = crate::image::archive();
    isolated(move || async move {
        let begun = Instant::now();
        let mut cp = start(&[REAL], image).await;
        cp.start_cert_manager().await.unwrap();
        let work = tempfile::tempdir().unwrap();
        apply_overlay(&cp, &user_overlay(work.path())).await;
        operator_ready(&mut cp).await;
        kubectl_ok(&cp, &["apply", "-f", "-"], Some(&web_on_kwok())).await;
        admits_once_through_the_webhook(&cp, "nm-guide", KWOK).await;
        let client = cp.client().await.unwrap();
        cp.wait_for("nm-guide Succeeded", Duration::from_secs(120), || async {
            cp_phase(&client, "nm-guide").await.as_deref() == Some("Succeeded")
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));

        events_as_the_guide_reads_them(&cp).await;
        probes_as_the_guide_reads_them(&cp).await;
        metrics_with_a_token(&cp).await;
        metrics_open_as_the_guide_reads_them(&cp, work.path()).await;
        debug_logs(&cp).await;
        eprintln!("the guide's commands done in {:?}", begun.elapsed());
        cp.stop();
    })
    .expect("a network namespace of the test's own");
}
