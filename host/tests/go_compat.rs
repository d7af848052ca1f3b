//! What a client of the Go operator (its e2e suite, a log search, a script
//! parsing `lastError`) sees, as the real `nmo` binary shows it.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A drain attempt that times out logs the Go operator's two lines, which
/// its e2e suite looks for, and `lastError` has its text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_drain_logs_and_reports_as_the_go_operator() {
    let (cluster, client) = start_cluster(2).await;
    cluster
        .create(never_terminating("stuck", "worker-1"))
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let kc = work.path().join("kc");
    cluster.write_kubeconfig(&kc).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args([
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--webhook-bind-address=0",
            // Documented as "no cache": accepted.
            "--policy-cache-dir=",
        ])
        .arg(format!(
            "--policy={}/nmo_policy_hostile.wasm",
            env!("NMO_POLICY_WASM_DIR")
        ))
        .env("KUBECONFIG", &kc)
        .env("LEASE_NAMESPACE", "medik8s-leases")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log, as zap writes it: JSON lines on stderr.
    let stdout = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let nms: kube::Api<nmo::crd::NodeMaintenance> = kube::Api::all(client.clone());
    create_nm_with_reason_on(&nms, "nm-go", "worker-1", "tune:timeout=1500").await;
    let mut seen = (false, false);
    let started = Instant::now();
    while !(seen.0 && seen.1) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "log lines seen: {seen:?}"
        );
        let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) else {
            assert!(child.try_wait().unwrap().is_none(), "nmo exited");
            continue;
        };
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        // No Rust debug text in any field.
        for (k, v) in entry.as_object().into_iter().flatten() {
            let text = v.as_str().unwrap_or_default();
            assert!(
                !(text.starts_with("Some(") || text == "None"),
                "field {k} of {line}"
            );
        }
        if let Some(m @ ("Not all pods evicted" | "Reconciling with fixed duration")) =
            entry["msg"].as_str()
        {
            // The maintenance and its node, as the Go operator's
            // reconciler logs them (from the pass's span).
            assert_eq!(entry["nodeMaintenance"], "nm-go", "{line}");
            assert_eq!(entry["nodeName"], "worker-1", "{line}");
            if m == "Not all pods evicted" {
                seen.0 = true;
            } else {
                seen.1 = true;
            }
        }
    }
    let status = nms.get("nm-go").await.unwrap().status.unwrap_or_default();
    assert_eq!(
        status.last_error.as_deref(),
        Some(
            "error when waiting for pod \"stuck\" in namespace \"default\" to terminate: context deadline exceeded"
        )
    );
    child.kill().unwrap();
    child.wait().unwrap();
    cluster.stop().await;
}

async fn create_nm_with_reason_on(
    nms: &kube::Api<nmo::crd::NodeMaintenance>,
    name: &str,
    node: &str,
    reason: &str,
) {
    let nm = nmo::crd::NodeMaintenance::new(
        name,
        nmo::crd::NodeMaintenanceSpec {
            node_name: node.into(),
            reason: Some(reason.into()),
        },
    );
    nms.create(&Default::default(), &nm).await.unwrap();
}

/// With no policy directory the embedded default decides, and a reload
/// finds nothing to reject: no error, the reload metric stays good.
#[test]
fn no_policy_directory_is_not_a_rejected_reload() {
    let root = tempfile::tempdir().unwrap();
    let engine = nmo::policy::PolicyEngine::new(Default::default()).unwrap();
    let store =
        nmo::policy::PolicyStore::from_dir(engine, &root.path().join("absent"), None).unwrap();
    assert_eq!(store.reload(), nmo::policy::Reload::Unchanged);
    assert_eq!(store.rejected(), None);
    assert!(
        !store.readiness().contains("rejected"),
        "{}",
        store.readiness()
    );
}
