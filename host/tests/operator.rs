//! The operator end to end on the simulated cluster: the Go operator's
//! scenarios, through kube::Client over HTTP on 127.0.0.1.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nmo::crd::MaintenancePhase;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cycle_on_a_worker_moves_the_workload_and_restores_the_node() {
    let env = Env::start(3).await;
    scenarios::full_cycle_on_a_worker_moves_the_workload_and_restores_the_node(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_node_fails_the_maintenance() {
    let env = Env::start(1).await;
    scenarios::a_missing_node_fails_the_maintenance(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_by_another_holder_waits_without_counting_then_proceeds() {
    let env = Env::start(2).await;
    env.cluster.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "medik8s-leases"}})).unwrap();
    let now = k8s_openapi::jiff::Timestamp::now();
    env.cluster
        .create(
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "node-worker-1", "namespace": "medik8s-leases"},
        "spec": {"holderIdentity": "node-healthcheck", "leaseDurationSeconds": 3600,
                 "acquireTime": now.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string(),
                 "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()}}),
        )
        .unwrap();
    env.create_nm("nm-1", "worker-1").await;
    let started = Instant::now();
    loop {
        let nm = env.nms().get("nm-1").await.unwrap();
        let s = nm.status.clone().unwrap_or_default();
        if s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("node-healthcheck"))
        {
            assert_eq!(s.phase, Some(MaintenancePhase::Running));
            assert_eq!(
                s.error_on_lease_count, 0,
                "not counted before the drain started"
            );
            assert_eq!(s.drain_progress, 0);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no lease error recorded: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(
        env.node("worker-1").await.spec.unwrap().unschedulable,
        Some(true),
        "not cordoned while another holds the lease"
    );
    // The other holder lets go: the maintenance proceeds.
    Api::<Lease>::namespaced(env.client.clone(), "medik8s-leases")
        .delete("node-worker-1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    assert_eq!(
        env.node("worker-1").await.spec.unwrap().unschedulable,
        Some(true)
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_blocks_the_drain_until_it_allows() {
    let env = Env::start(3).await;
    scenarios::a_pdb_blocks_the_drain_until_it_allows(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_nodes_in_maintenance_at_once() {
    let env = Env::start(21).await;
    env.cluster
        .apply_yaml(&WORKLOAD.replace("replicas: 3", "replicas: 40"))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 1..=20 {
        env.create_nm(&format!("nm-{i}"), &format!("worker-{i}"))
            .await;
    }
    for i in 1..=20 {
        env.wait_phase(&format!("nm-{i}"), MaintenancePhase::Succeeded)
            .await;
    }
    for i in 1..=20 {
        let pods = env.pods_on(&format!("worker-{i}")).await;
        assert!(
            pods.iter().all(|p| p.name_any().starts_with("agent-")),
            "worker-{i}: {:?}",
            pods.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_without_our_finalizer_never_recordons() {
    let env = Env::start(2).await;
    env.create_nm("nm-1", "worker-1").await;
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    // Someone removes our finalizer (keeping another), then deletes the CR.
    env.nms()
        .patch(
            "nm-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
        )
        .await
        .unwrap();
    env.nms()
        .delete("nm-1", &DeleteParams::default())
        .await
        .unwrap();
    // An admin uncordons by hand; the operator must leave it so.
    Api::<Node>::all(env.client.clone())
        .patch(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": false}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        env.node("worker-1").await.spec.unwrap().unschedulable,
        Some(false)
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_and_never_force_policies_drain_the_same_node_differently() {
    for (policy, bare_evicted) in [(None, true), (Some("nmo_policy_never_force.wasm"), false)] {
        let env = Env::start_with(2, policy).await;
        env.cluster.apply_yaml(WORKLOAD).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        env.create_nm("nm-1", "worker-1").await;
        if bare_evicted {
            env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
            assert!(
                env.pods_on("worker-1")
                    .await
                    .iter()
                    .all(|p| p.name_any() != "bare"),
                "default: --force evicts the bare pod"
            );
        } else {
            let started = Instant::now();
            loop {
                let s = env
                    .nms()
                    .get("nm-1")
                    .await
                    .unwrap()
                    .status
                    .unwrap_or_default();
                if s.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("default/bare has no controller"))
                {
                    assert_eq!(s.phase, Some(MaintenancePhase::Running));
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "never blocked: {s:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let left: Vec<String> = env
                .pods_on("worker-1")
                .await
                .iter()
                .map(|p| p.name_any())
                .collect();
            assert!(
                left.contains(&"bare".to_string()),
                "never-force keeps the bare pod: {left:?}"
            );
            assert!(
                left.contains(&"scratch".to_string()),
                "scratch has no controller either: {left:?}"
            );
            assert!(
                left.iter().all(|n| !n.starts_with("web-")),
                "managed pods still leave: {left:?}"
            );
        }
        env.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_killed_mid_drain_converges_without_repeating_events() {
    let mut env = Env::start(3).await;
    env.cluster
        .apply_yaml(&WORKLOAD.replace("replicas: 3", "replicas: 2"))
        .unwrap();
    let node = web_node(&env, 2).await;
    env.create_nm("nm-1", &node).await;
    // Blocked by the PDB, mid-drain: kill the operator.
    env.wait_status("nm-1", "blocked by the PDB", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("violate the pod's disruption budget"))
    })
    .await;
    env.controller.abort();
    let _ = (&mut env.controller).await;
    scale_web(&env, 3).await;
    // A new operator picks up where the old one stopped.
    env.controller = start_controller(&env.client, None);
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    // Restarting again changes nothing and repeats nothing.
    env.controller.abort();
    let metrics = metrics();
    let store = policy_store_counted(None, metrics.policy.clone());
    env.controller =
        start_controller_counted(&env.client, store, metrics.controller.clone(), |_| {}).1;
    // Once the new operator has made its pass over nm-1 (a plan, as the
    // maintenance is not failed), counted as the Go operator's
    // controller-runtime counts the reconcile of a finished maintenance: a
    // success (its later look, to renew the lease, is no requeue of work).
    let counted = |result| metrics.controller.reconciles(result);
    wait_until(
        "the new operator's pass",
        Duration::from_secs(10),
        || async {
            policy_calls(&metrics.policy, Decision::PlanDrain) >= 1
                && counted(ReconcileResult::Success) >= 1
        },
    )
    .await;
    assert_eq!(counted(ReconcileResult::RequeueAfter), 0);
    assert_eq!(counted(ReconcileResult::Error), 0);
    let events = env.events_for("nm-1").await;
    for reason in ["BeginMaintenance", "SucceedMaintenance"] {
        assert_eq!(
            events.iter().filter(|(_, r, _)| r == reason).count(),
            1,
            "{reason}: {events:?}"
        );
    }
    env.nms()
        .delete("nm-1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-1").await;
    assert_ne!(
        env.node(&node).await.spec.unwrap().unschedulable,
        Some(true)
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenances_converge_under_api_faults() {
    let env = Env::start(4).await;
    env.cluster
        .apply_yaml(&WORKLOAD.replace("replicas: 3", "replicas: 6"))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.cluster.set_faults(|f| {
        f.rules = vec![
            nmo_sim::FaultRule {
                verb: None,
                resource: None,
                rate: 0.10,
                code: 500,
            },
            nmo_sim::FaultRule {
                verb: Some("patch".into()),
                resource: None,
                rate: 0.10,
                code: 409,
            },
            nmo_sim::FaultRule {
                verb: Some("update".into()),
                resource: None,
                rate: 0.10,
                code: 409,
            },
        ];
        f.latency = Duration::from_millis(20);
        f.drop_watches_after = Some(Duration::from_secs(2));
    });
    // Creating may itself hit an injected error: retry as a user would.
    for i in 1..=3 {
        create_nm_retrying(&env.nms(), &format!("nm-{i}"), &format!("worker-{i}")).await;
    }
    for i in 1..=3 {
        wait_succeeded(&env.nms(), &format!("nm-{i}"), Duration::from_secs(90)).await;
    }
    env.cluster.set_faults(|f| *f = Default::default());
    for i in 1..=3 {
        let pods = env.pods_on(&format!("worker-{i}")).await;
        assert!(
            pods.iter().all(|p| p.name_any().starts_with("agent-")),
            "worker-{i} drained"
        );
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_never_terminates_leaves_the_drain_incomplete_at_the_attempt_timeout() {
    let env = stuck_and_quick_on_worker_1("tune:timeout=1500").await;
    let s = env
        .wait_status("nm-1", "incomplete", |s| {
            s.last_error
                .as_deref()
                // The Go operator's text for the same situation.
                .is_some_and(|e| e == "error when waiting for pod \"stuck\" in namespace \"default\" to terminate: context deadline exceeded")
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
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_period_longer_than_the_attempt_timeout_finishes_on_a_later_attempt() {
    let env = Env::start_with(2, HOSTILE).await;
    // A process that ignores SIGTERM: the kubelet kills it when its 60 s
    // grace period runs out (3 s real); the policy gives each attempt 1 s.
    env.cluster
        .create(bare(
            "slow",
            "worker-1",
            json!({"sim.nmo.medik8s.io/ignore-sigterm": "true"}),
            60,
        ))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.create_nm_with_reason("nm-1", "worker-1", "tune:timeout=1000")
        .await;
    env.wait_status("nm-1", "incomplete first", |s| {
        // The Go operator's text for an attempt that ran out waiting.
        s.last_error.as_deref().is_some_and(|e| {
            e.contains("\"slow\" in namespace \"default\" to terminate: context deadline exceeded")
        })
    })
    .await;
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_actions_and_waves_are_honoured() {
    let env = Env::start_with(2, HOSTILE).await;
    env.cluster.apply_yaml("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db, namespace: default}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: db}}\n  template:\n    metadata: {labels: {app: db}}\n    spec: {nodeSelector: {kubernetes.io/hostname: worker-1}, containers: [{name: db, image: db}]}\n").unwrap();
    env.cluster
        .create(bare(
            "web-a",
            "worker-1",
            json!({"sim.nmo.medik8s.io/shutdown-seconds": "20"}),
            30,
        ))
        .unwrap();
    env.cluster
        .create(bare(
            "web-b",
            "worker-1",
            json!({"sim.nmo.medik8s.io/shutdown-seconds": "20"}),
            30,
        ))
        .unwrap();
    let started = Instant::now();
    while !env
        .pods_on("worker-1")
        .await
        .iter()
        .any(|p| p.name_any() == "db-0")
    {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.cluster.record_audit(true);
    env.create_nm_with_reason("nm-1", "worker-1", "tune:delete,sts-last,max=1")
        .await;
    // While a first-wave pod is still on the node, the StatefulSet pod (second wave) is untouched.
    let mut saw_first_wave = false;
    loop {
        let pods = env.pods_on("worker-1").await;
        let first_wave_left = pods.iter().any(|p| p.name_any().starts_with("web-"));
        let db = pods.iter().find(|p| p.name_any() == "db-0");
        if first_wave_left {
            saw_first_wave = true;
            assert!(
                db.is_some_and(|d| d.metadata.deletion_timestamp.is_none()),
                "db-0 removed before wave 0 finished"
            );
        } else {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(saw_first_wave);
    env.wait_status("nm-1", "db-0 gone", |s| {
        s.drain_progress == 100 || s.phase == Some(MaintenancePhase::Succeeded)
    })
    .await;
    let audit = env.cluster.audit();
    let evictions = audit.iter().filter(|a| a.subresource == "eviction").count();
    let deletes = audit
        .iter()
        .filter(|a| a.verb == "delete" && a.resource == "pods")
        .count();
    assert_eq!(evictions, 0, "the policy said delete");
    assert!(deletes >= 3, "web-a, web-b and db-0 deleted: {deletes}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_errors_during_the_drain_are_counted_and_reset_by_a_success() {
    let env = stuck_and_quick_on_worker_1("tune:timeout=1000").await;
    env.wait_status("nm-1", "half drained", |s| s.drain_progress == 50)
        .await;
    // Another holder (a remediator) takes the lease mid-drain.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "medik8s-leases");
    let mut lease = leases.get("node-worker-1").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("node-healthcheck".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases
        .replace("node-worker-1", &PostParams::default(), &lease)
        .await
        .unwrap();
    let s = env
        .wait_status("nm-1", "lease errors counted", |s| {
            s.error_on_lease_count >= 2
        })
        .await;
    assert!(
        s.last_error
            .unwrap_or_default()
            .contains("node-healthcheck")
    );
    assert_eq!(
        s.phase,
        Some(MaintenancePhase::Running),
        "this policy keeps retrying"
    );
    // The other holder lets go: the next success resets the count.
    leases
        .delete("node-worker-1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_status("nm-1", "count reset", |s| s.error_on_lease_count == 0)
        .await;
    env.stop().await;
}

/// The hostile policy (tuned by `reason`) on two nodes, worker-1 holding a
/// pod that never terminates and one that does, and a NodeMaintenance
/// `nm-1` for worker-1.
async fn stuck_and_quick_on_worker_1(reason: &str) -> Env {
    let env = Env::start_with(2, HOSTILE).await;
    env.cluster
        .create(never_terminating("stuck", "worker-1"))
        .unwrap();
    env.cluster
        .create(bare("quick", "worker-1", json!({}), 30))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.create_nm_with_reason("nm-1", "worker-1", reason).await;
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_behind_a_budget_wait_for_room() {
    let (cluster, client) = start_cluster(2).await;
    let env = Env {
        cluster,
        client: client.clone(),
        controller: tokio::spawn(async {}),
        metrics: metrics(),
        ctx: None,
    };
    scenarios::evictions_behind_a_budget_wait_for_room(&env, &client).await;
    env.stop().await;
}

/// An eviction the API server refuses with a conflict (another eviction
/// updated the budget at the same moment): tried again, and the status
/// says so in words, never the API's raw "the object has been modified";
/// once the conflicts stop, the drain finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_conflict_is_retried_and_said_in_words() {
    let env = Env::start(2).await;
    env.cluster.apply_yaml(WORKLOAD).unwrap();
    wait_until(
        "the workload runs on worker-1",
        Duration::from_secs(30),
        || async { !env.pods_on("worker-1").await.is_empty() },
    )
    .await;
    env.cluster.set_faults(|f| {
        f.rules = vec![nmo_sim::FaultRule {
            verb: Some("create".into()),
            resource: Some("pods/eviction".into()),
            rate: 1.0,
            code: 409,
        }];
    });
    env.create_nm("nm-conflict", "worker-1").await;
    let s = env
        .wait_status("nm-conflict", "the conflict said", |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("changed by another writer"))
        })
        .await;
    let shown = s.last_error.unwrap_or_default();
    assert!(!shown.contains("has been modified"), "{shown}");
    env.cluster.set_faults(|f| *f = Default::default());
    wait_succeeded(&env.nms(), "nm-conflict", Duration::from_secs(60)).await;
    env.stop().await;
}
