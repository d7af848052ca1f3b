//! The orphan sweep never touches a node a live maintenance names (trust
//! round four): 40 nodes left marked by maintenances whose finalizers were
//! removed while the operator was down, the operator started (its sweep
//! restores them one by one), and maintenances created for 20 of them
//! while the sweep runs. Every node ends as its maintenances say: the 20
//! with a maintenance cordoned, tainted, labelled and leased under a
//! Succeeded maintenance; the 20 others restored. The operator's requests
//! go through a proxy that holds each for 150 ms (a loaded API server, a
//! far one), so the sweep takes long enough for the race to be met every
//! time. (Before: the sweep listed the maintenances once and restored
//! from that list, undoing maintenances created meanwhile, which stayed
//! Succeeded on uncordoned nodes for 30 minutes.)

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::real::RealEnv;
use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nmo::crd::MaintenancePhase;
use nmo_control_plane::Options;
use serde_json::json;

const ORPHANS: usize = 40;
/// How long the proxy holds each request of the operator's.
const LATENCY: Duration = Duration::from_millis(150);

/// A TCP proxy on loopback to `upstream` that holds each chunk the client
/// sends for `delay` (TLS passes through untouched); its address.
async fn slow_proxy(upstream: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                continue;
            };
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = client_read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = server_write.shutdown().await;
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
        }
    });
    at
}

fn in_maintenance(node: &Node) -> bool {
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let tainted = taint_keys(node).iter().any(|k| k == "medik8s.io/drain");
    unschedulable && tainted
}

/// As before the maintenance: schedulable, no drain taint, no label, no
/// record.
fn restored(node: &Node) -> bool {
    use kube::ResourceExt;
    node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
        && !taint_keys(node).iter().any(|k| k == "medik8s.io/drain")
        && !node
            .labels()
            .contains_key(nmo::controller::node::EXCLUDE_LABEL)
        && !node
            .annotations()
            .contains_key(nmo::controller::node::PRIOR_STATE_ANNOTATION)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orphan_sweep_never_undoes_a_maintenance_created_during_it() {
    let mut env = RealEnv::start_without_operator(Options::workers(ORPHANS)).await;
    let nodes: Api<Node> = Api::all(env.admin.clone());
    // The orphans, as the operator leaves a node in maintenance: cordoned,
    // tainted, labelled, its record of the state before.
    let record = json!({"unschedulable": false, "taints": [], "excludeLabel": false}).to_string();
    for i in 1..=ORPHANS {
        let mark = json!({
            "metadata": {
                "labels": {"remediation.medik8s.io/exclude-from-remediation": "true"},
                "annotations": {"nodemaintenance.medik8s.io/before-maintenance": record},
            },
            "spec": {"unschedulable": true, "taints": [
                {"key": "medik8s.io/drain", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            ]},
        });
        nodes
            .patch(
                &format!("worker-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&mark),
            )
            .await
            .unwrap();
    }
    // The operator starts (its sweep at once); maintenances are created
    // for every other node while it sweeps, the last nodes first.
    let upstream: std::net::SocketAddr =
        env.cp.url().trim_start_matches("https://").parse().unwrap();
    let slow = slow_proxy(upstream, LATENCY).await;
    let kubeconfig = env
        .cp
        .kubeconfig_with_token(&env.token)
        .replace(&env.cp.url(), &format!("https://{slow}"));
    let operator = nmo::client::client_from_kubeconfig(&kubeconfig)
        .await
        .unwrap();
    let (_ctx, controller) = start_controller_tuned(&operator, policy_store(None), |_| {});
    env.controller = Some(controller);
    let wanted: Vec<String> = (1..=ORPHANS)
        .rev()
        .filter(|i| i % 2 == 0)
        .map(|i| format!("worker-{i}"))
        .collect();
    for node in &wanted {
        env.create_nm(&format!("nm-{node}"), node).await;
    }
    let started = Instant::now();
    loop {
        let mut wrong = BTreeMap::new();
        for i in 1..=ORPHANS {
            let name = format!("worker-{i}");
            let node = nodes.get(&name).await.unwrap();
            if wanted.contains(&name) {
                let phase = env
                    .nms()
                    .get(&format!("nm-{name}"))
                    .await
                    .unwrap()
                    .status
                    .and_then(|s| s.phase);
                if !in_maintenance(&node) || phase != Some(MaintenancePhase::Succeeded) {
                    wrong.insert(
                        name,
                        format!(
                            "maintenance {phase:?}, node in maintenance: {}",
                            in_maintenance(&node)
                        ),
                    );
                }
            } else if !restored(&node) {
                wrong.insert(name, "not restored".to_owned());
            }
        }
        if wrong.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "nodes not as their maintenances say after 300 s: {wrong:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "{} orphans restored and {} maintenances created during the sweep kept their nodes, settled in {:.1} s",
        ORPHANS - wanted.len(),
        wanted.len(),
        started.elapsed().as_secs_f64()
    );
    env.stop();
}
