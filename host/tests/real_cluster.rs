//! The operator end to end on the real control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler, kwok; `nmo_control_plane`),
//! under the shipped ServiceAccount and RBAC: the scenarios `operator.rs`
//! runs on the simulated cluster, and what only a real API server can show.
//! The first run on a machine builds the control plane (a line says so).

use crate::common;

use std::time::Duration;

use common::real::{self, RealEnv};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use nmo::crd::MaintenancePhase;
use nmo_control_plane::Options;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cycle_on_a_worker_moves_the_workload_and_restores_the_node() {
    let env = RealEnv::start(Options::workers(3)).await;
    scenarios::full_cycle_on_a_worker_moves_the_workload_and_restores_the_node(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_node_fails_the_maintenance() {
    let env = RealEnv::start(Options::workers(1)).await;
    scenarios::a_missing_node_fails_the_maintenance(&env).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_blocks_the_drain_until_it_allows() {
    let env = RealEnv::start(Options::workers(3)).await;
    scenarios::a_pdb_blocks_the_drain_until_it_allows(&env).await;
    env.stop();
}

/// A bare pod on `node` that kwok stops `delay` after its deletion (a
/// process that takes that long to exit after SIGTERM).
fn stopping_after(name: &str, node: &str, delay: &str, grace: i64) -> serde_json::Value {
    bare(
        name,
        node,
        serde_json::json!({"pod-delete.stage.kwok.x-k8s.io/delay": delay}),
        grace,
    )
}

async fn wait_pod_running(env: &RealEnv, name: &str) {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), "default");
    wait_until(
        &format!("{name} running"),
        Duration::from_secs(30),
        || async {
            pods.get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status)
                .and_then(|s| s.phase)
                .as_deref()
                == Some("Running")
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_never_stops_leaves_the_drain_incomplete_at_the_attempt_timeout() {
    let env = RealEnv::start_store(Options::workers(2), policy_store(HOSTILE)).await;
    env.create_value(stopping_after("stuck", "worker-1", "87600h", 30))
        .await;
    env.create_value(bare("quick", "worker-1", serde_json::json!({}), 30))
        .await;
    wait_pod_running(&env, "stuck").await;
    wait_pod_running(&env, "quick").await;
    env.create_nm_with_reason("nm-1", "worker-1", "tune:timeout=1500")
        .await;
    let s = env
        .wait_status("nm-1", "incomplete", |s| {
            s.last_error.as_deref().is_some_and(|e| {
                e == "error when waiting for pod \"stuck\" in namespace \"default\" to terminate: context deadline exceeded"
            })
        })
        .await;
    assert_eq!(s.phase, Some(MaintenancePhase::Running));
    assert_eq!(s.pending_pods, Some(vec!["stuck".to_string()]));
    assert_eq!(s.drain_progress, 50);
    let left: Vec<String> = env
        .pods_on("worker-1")
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(left, ["stuck"]);
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_slower_than_the_attempt_timeout_finishes_on_a_later_attempt() {
    let env = RealEnv::start_store(Options::workers(2), policy_store(HOSTILE)).await;
    // Takes 3 s to stop (within its 60 s grace period); each attempt 1 s.
    env.create_value(stopping_after("slow", "worker-1", "3s", 60))
        .await;
    wait_pod_running(&env, "slow").await;
    env.create_nm_with_reason("nm-1", "worker-1", "tune:timeout=1000")
        .await;
    env.wait_status("nm-1", "incomplete first", |s| {
        s.last_error.as_deref().is_some_and(|e| {
            e.contains("\"slow\" in namespace \"default\" to terminate: context deadline exceeded")
        })
    })
    .await;
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    // As `kubectl describe nm` shows it, from the real server's events.
    let described = env
        .cp
        .kubectl(&["describe", "nm", "nm-1"], None)
        .await
        .unwrap();
    for expected in [
        "Phase:",
        "Succeeded",
        "BeginMaintenance",
        "SucceedMaintenance",
        "Node maintenance was succeeded",
    ] {
        assert!(
            described.contains(expected),
            "{expected:?} missing:\n{described}"
        );
    }
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_mid_drain_takes_its_maintenance_with_it() {
    let env = RealEnv::start(Options::workers(2)).await;
    env.create_value(stopping_after("slow", "worker-1", "87600h", 30))
        .await;
    wait_pod_running(&env, "slow").await;
    env.create_nm("nm-1", "worker-1").await;
    wait_until("worker-1 cordoned", Duration::from_secs(30), || async {
        env.node("worker-1")
            .await
            .spec
            .and_then(|s| s.unschedulable)
            == Some(true)
    })
    .await;
    env.wait_status("nm-1", "draining", |s| s.pending_pods.is_some())
        .await;
    Api::<Node>::all(env.admin.clone())
        .delete("worker-1", &DeleteParams::default())
        .await
        .unwrap();
    // The real garbage collector follows the owner reference the operator
    // set; the finalizer's restore finds no node and lets go.
    env.wait_gone("nm-1").await;
    assert!(
        !env.controller.as_ref().unwrap().is_finished(),
        "the operator runs"
    );
    env.stop();
}

/// `nmo` as the Deployment runs it, two replicas with --leader-elect,
/// under the shipped ServiceAccount.
fn replica(env: &RealEnv, name: &str, log: &std::path::Path) -> tokio::process::Child {
    real::operator_process(env, name, log, &["--leader-elect".to_owned()])
}

fn led(log: &std::path::Path) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|l| l["msg"] == "became leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_with_leader_election_only_one_acts_then_the_other_takes_over() {
    let env = RealEnv::start_without_operator(Options::workers(3)).await;
    let logs = env.cp.dir().to_owned();
    let (log_a, log_b) = (logs.join("replica-a.log"), logs.join("replica-b.log"));
    let mut a = replica(&env, "replica-a", &log_a);
    wait_until("replica-a leads", Duration::from_secs(30), || async {
        led(&log_a)
    })
    .await;
    let mut b = replica(&env, "replica-b", &log_b);
    env.create_nm("nm-1", "worker-1").await;
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    assert!(!led(&log_b), "replica-b must not lead while replica-a does");
    let lease = Api::<Lease>::namespaced(env.admin.clone(), real::NAMESPACE)
        .get("135b1886.medik8s.io")
        .await
        .unwrap();
    assert_eq!(
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .as_deref()
            .map(|h| h.starts_with("replica-a")),
        Some(true)
    );
    // The leader dies without releasing the lock: the other takes over once
    // it expires and finishes what was asked meanwhile.
    a.start_kill().unwrap();
    let _ = a.wait().await;
    env.create_nm("nm-2", "worker-2").await;
    wait_until("replica-b leads", Duration::from_secs(60), || async {
        led(&log_b)
    })
    .await;
    env.wait_phase("nm-2", MaintenancePhase::Succeeded).await;
    b.start_kill().unwrap();
    env.stop();
}

/// A NodeMaintenance removed without its finalizer running (the operator
/// down, the finalizer deleted by hand) leaves an orphan: the operator,
/// once back, finds the node it marked with no maintenance and restores it
/// as the human left it, lease included. A CRD deleted under a running
/// operator makes readiness say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_restored_and_a_missing_crd_is_not_ready() {
    let mut env = RealEnv::start(Options::workers(2)).await;
    cordon_by_hand(&env.admin, "worker-1").await;
    env.create_nm("orphan", "worker-1").await;
    env.wait_phase("orphan", MaintenancePhase::Succeeded).await;
    env.controller.take().unwrap().abort();
    env.nms()
        .patch(
            "orphan",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    env.nms()
        .delete("orphan", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("orphan").await;
    let leases = Api::<Lease>::namespaced(env.admin.clone(), "medik8s-leases");
    assert!(
        leases.get_opt("node-worker-1").await.unwrap().is_some(),
        "the orphan keeps its lease until the operator is back"
    );
    let (ctx, handle) = start_controller_ctx(&env.operator, policy_store(None));
    env.controller = Some(handle);
    wait_until("the orphan restored", Duration::from_secs(30), || async {
        as_the_human_left_it(&env.node("worker-1").await).is_ok()
            && leases.get_opt("node-worker-1").await.unwrap().is_none()
    })
    .await;

    let checks = nmo::probes::readiness_checks(ctx, false);
    let informer = |checks: &[(&str, nmo::server::Check)]| (checks[0].1)();
    wait_until("ready", Duration::from_secs(30), || async {
        informer(&checks).is_ok()
    })
    .await;
    env.cp
        .kubectl(&["delete", "crd", nmo::crd::CRD_NAME], None)
        .await
        .unwrap();
    wait_until("not ready: the CRD", Duration::from_secs(30), || async {
        informer(&checks).is_err_and(|e| e.contains("CRD is not installed"))
    })
    .await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_behind_a_budget_wait_for_room() {
    let env = RealEnv::start_without_operator(Options {
        audit: true,
        ..Options::workers(2)
    })
    .await;
    scenarios::evictions_behind_a_budget_wait_for_room(&env, &env.operator).await;
    env.stop();
}
