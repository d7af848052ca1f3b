//! Scenarios the operator's end-to-end suites run on either cluster: the
//! simulated one (`operator.rs`) and the real control plane
//! (`real_cluster.rs`). Each takes a cluster with the operator running.
#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use nmo::crd::MaintenancePhase;
use serde_json::json;

use super::*;

pub async fn full_cycle_on_a_worker_moves_the_workload_and_restores_the_node(
    env: &impl ClusterOps,
) {
    env.apply(WORKLOAD).await;
    // A taint and a label of the node's own, which must survive.
    Api::<Node>::all(env.client().clone())
        .patch("worker-1", &PatchParams::default(), &Patch::Merge(json!({
            "metadata": {"labels": {"team": "blue"}},
            "spec": {"taints": [{"key": "example.com/gpu", "value": "true", "effect": "PreferNoSchedule"}]},
        })))
        .await
        .unwrap();
    // A static pod's mirror on the node.
    let node_uid = env.node("worker-1").await.uid().unwrap();
    env.create_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "etcd-worker-1", "namespace": "kube-system",
        "annotations": {"kubernetes.io/config.mirror": "abc"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": node_uid, "controller": true}]},
        "spec": {"nodeName": "worker-1", "containers": [{"name": "etcd", "image": "etcd"}]}})).await;
    // The workload in place: every web replica Ready, the DaemonSet's pod
    // on the node.
    web_node(env, 3).await;
    wait_until(
        "the DaemonSet's pod on worker-1",
        Duration::from_secs(30),
        || async {
            env.pods_on("worker-1")
                .await
                .iter()
                .any(|p| p.name_any().starts_with("agent-"))
        },
    )
    .await;
    let on_node = env.pods_on("worker-1").await;
    let before = on_node.len();
    let movable = on_node
        .iter()
        .filter(|p| !p.name_any().starts_with("agent-") && p.name_any() != "etcd-worker-1")
        .count();
    assert!(movable >= 2, "bare and scratch at least");

    env.create_nm("nm-1", "worker-1").await;
    let nm = env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    let status = nm.status.clone().unwrap();
    assert_eq!(status.drain_progress, 100);
    assert_eq!(status.total_pods as usize, before);
    assert_eq!(status.eviction_pods as usize, movable, "{status:?}");
    assert!(status.pending_pods.is_none());
    assert!(
        nm.finalizers()
            .contains(&"foregroundDeleteNodeMaintenance".to_string())
    );
    assert!(
        nm.owner_references()
            .iter()
            .any(|o| o.kind == "Node" && o.name == "worker-1")
    );

    let node = env.node("worker-1").await;
    assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(
        taint_keys(&node),
        [
            "example.com/gpu",
            "medik8s.io/drain",
            "node.kubernetes.io/unschedulable"
        ]
    );
    assert_eq!(
        node.labels()
            .get("remediation.medik8s.io/exclude-from-remediation")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(node.labels().get("team").map(String::as_str), Some("blue"));
    let lease = Api::<Lease>::namespaced(env.client().clone(), "medik8s-leases")
        .get("node-worker-1")
        .await
        .unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-maintenance"));
    assert_eq!(spec.lease_duration_seconds, Some(3600));
    assert_eq!(lease.owner_references()[0].name, "worker-1");

    let mut left: Vec<String> = env
        .pods_on("worker-1")
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    left.sort();
    assert_eq!(
        left.len(),
        2,
        "only the DaemonSet and mirror pods stay: {left:?}"
    );
    assert!(
        left.iter().any(|n| n.starts_with("agent-")) && left.contains(&"etcd-worker-1".to_string())
    );
    let web: Vec<Pod> = Api::<Pod>::namespaced(env.client().clone(), "default")
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    assert_eq!(
        web.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count(),
        3,
        "the Deployment is whole again"
    );

    wait_event(env, "nm-1", "SucceedMaintenance").await;
    let events = env.events_for("nm-1").await;
    let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == "BeginMaintenance").count(),
        1,
        "{events:?}"
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == "SucceedMaintenance")
            .count(),
        1,
        "{events:?}"
    );
    assert!(events.contains(&(
        "Normal".into(),
        "SucceedMaintenance".into(),
        "Node maintenance was succeeded".into()
    )));

    env.nms()
        .delete("nm-1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-1").await;
    let node = env.node("worker-1").await;
    assert_ne!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(taint_keys(&node), ["example.com/gpu"]);
    assert!(
        !node
            .labels()
            .contains_key("remediation.medik8s.io/exclude-from-remediation")
    );
    assert_eq!(node.labels().get("team").map(String::as_str), Some("blue"));
    assert!(
        Api::<Lease>::namespaced(env.client().clone(), "medik8s-leases")
            .get_opt("node-worker-1")
            .await
            .unwrap()
            .is_none()
    );
    wait_event(env, "worker-1", "UncordonNode").await;
    let node_events = env.events_for("worker-1").await;
    assert_eq!(
        node_events,
        vec![(
            "Normal".into(),
            "UncordonNode".into(),
            "Uncordon a node".into()
        )]
    );
    wait_event(env, "nm-1", "RemovedMaintenance").await;
    let events = env.events_for("nm-1").await;
    assert!(
        events
            .iter()
            .any(|(_, r, m)| r == "RemovedMaintenance" && m == "Removed a node maintenance"),
        "{events:?}"
    );
}

pub async fn a_missing_node_fails_the_maintenance(env: &impl ClusterOps) {
    env.create_nm("nm-ghost", "ghost").await;
    let nm = env.wait_phase("nm-ghost", MaintenancePhase::Failed).await;
    assert_eq!(
        nm.status.unwrap().last_error.as_deref(),
        Some("nodes \"ghost\" not found")
    );
    wait_event(env, "nm-ghost", "FailedMaintenance").await;
    let events = env.events_for("nm-ghost").await;
    assert!(
        events.contains(&(
            "Warning".into(),
            "FailedMaintenance".into(),
            "Failed a node maintenance".into()
        )),
        "{events:?}"
    );
    // No retry storm: still exactly one failure event a moment later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        env.events_for("nm-ghost")
            .await
            .iter()
            .filter(|(_, r, _)| r == "FailedMaintenance")
            .count(),
        1
    );
    env.nms()
        .delete("nm-ghost", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-ghost").await;
}

pub async fn a_pdb_blocks_the_drain_until_it_allows(env: &impl ClusterOps) {
    env.apply(&WORKLOAD.replace("replicas: 3", "replicas: 2"))
        .await;
    let node = web_node(env, 2).await;
    env.create_nm("nm-pdb", &node).await;
    let s = env
        .wait_status("nm-pdb", "blocked by the PDB", |s| {
            // Shown while the attempt runs (the API server's 429 text),
            // not only when it ends.
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("violate the pod's disruption budget"))
        })
        .await;
    assert_eq!(s.phase, Some(MaintenancePhase::Running));
    assert!(
        s.pending_pods
            .unwrap_or_default()
            .iter()
            .any(|p| p.starts_with("web-"))
    );
    // A third replica makes room.
    scale_web(env, 3).await;
    let nm = env.wait_phase("nm-pdb", MaintenancePhase::Succeeded).await;
    // What the drain waited for was shown while it waited; a drain that
    // succeeded keeps no error (the Go operator writes lastError only when
    // an attempt fails, and none did).
    assert_eq!(nm.status.unwrap().last_error, None);
}

/// Waits until the operator has written an event of `reason` about `name`
/// (events go out from their own task, after the status).
async fn wait_event(env: &impl ClusterOps, name: &str, reason: &str) {
    wait_until(
        &format!("a {reason} event for {name}"),
        Duration::from_secs(30),
        || async {
            env.events_for(name)
                .await
                .iter()
                .any(|(_, r, _)| r == reason)
        },
    )
    .await;
}

/// Four replicas on one node behind a budget allowing one down, each
/// replacement Ready a second after it is placed (on the simulated
/// cluster; kwok's pods are Ready at once): the operator (`operator`, a
/// client with its rights; production's 5 s fallback) sends an eviction
/// when the budget has room, not all four at once with the refusals
/// retried every 5 s. At most one refusal a pod (a probe while the budget
/// has no room), and the drain goes at the replacements' pace.
pub async fn evictions_behind_a_budget_wait_for_room(env: &impl ClusterOps, operator: &Client) {
    let nodes: Api<Node> = Api::all(env.client().clone());
    let pool = |node: &str| {
        let nodes = nodes.clone();
        let node = node.to_owned();
        async move {
            nodes
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"pool": "steady"}}})),
                )
                .await
                .unwrap();
        }
    };
    pool("worker-1").await;
    env.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: steady, namespace: default}
spec:
  replicas: 4
  selector: {matchLabels: {app: steady}}
  template:
    metadata:
      labels: {app: steady}
      annotations: {sim.nmo.medik8s.io/startup-seconds: "1"}
    spec:
      nodeSelector: {pool: steady}
      containers: [{name: c, image: registry.k8s.io/pause:3.10}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: steady, namespace: default}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: steady}}
"#,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), "default");
    wait_until("4 steady pods Ready", Duration::from_secs(60), || async {
        pods.list(&ListParams::default().labels("app=steady"))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|p| nmo_sim::cluster::is_ready(&serde_json::to_value(p).unwrap()))
                    .count()
            })
            .unwrap_or(0)
            == 4
    })
    .await;
    // Their budget is at its limit once one is gone: the replacements go
    // to worker-2.
    pool("worker-2").await;
    let (_, controller) = start_controller_tuned(operator, policy_store(None), |s| {
        s.drain_retries = nmo::controller::drain::Retries::default();
    });
    let mark = env.audit_mark();
    env.create_nm("nm-steady", "worker-1").await;
    env.wait_phase("nm-steady", MaintenancePhase::Succeeded)
        .await;
    controller.abort();
    let codes = env.operator_evictions_since(mark);
    let accepted = codes.iter().filter(|c| matches!(c, 200 | 201)).count();
    let refused = codes.iter().filter(|c| **c == 429).count();
    println!("the operator's evictions, answered: {codes:?}");
    assert_eq!(accepted, 4, "{codes:?}");
    assert!(
        refused <= 4,
        "{refused} refused evictions for 4 pods: sent faster than the budget allowed ({codes:?})"
    );
}
