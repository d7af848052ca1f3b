//! API objects as a careless user or an attacker writes them: Leases with
//! times no clock can hold, statuses with values past every range, nodes a
//! human cordoned, nodes without `spec`. The operator never crashes, never
//! hides one maintenance behind another's bad data, and restores exactly
//! what it changed.

use crate::common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use nmo::crd::MaintenancePhase;
use serde_json::json;

fn lease(holder: &str, renew: &str, seconds: i64) -> serde_json::Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "node-worker-1", "namespace": "medik8s-leases"},
        "spec": {
            "holderIdentity": holder,
            "renewTime": renew,
            "acquireTime": renew,
            "leaseDurationSeconds": seconds
        }
    })
}

fn namespace(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// A Lease renewed "in year 9999" for two hours: adding the duration is
/// past what any clock holds. Another holder's such lease is respected (the
/// maintenance says the lease is held); the process does not crash, and the
/// NodeMaintenance can be deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewed_in_year_9999_is_held_not_a_crash() {
    let env = Env::start(2).await;
    env.cluster.create(namespace("medik8s-leases")).unwrap();
    env.cluster
        .create(lease("someone-else", "9999-12-30T21:00:00.000000Z", 7200))
        .unwrap();
    env.create_nm("nm-far", "worker-1").await;
    let s = env
        .wait_status("nm-far", "report the held lease", |s| {
            s.last_error
                .as_deref()
                .unwrap_or("")
                .contains("held by different owner: someone-else")
        })
        .await;
    assert_eq!(s.phase, Some(MaintenancePhase::Running));
    assert!(!env.controller.is_finished(), "the operator runs");
    // Meanwhile another node's maintenance goes through.
    env.create_nm("nm-other", "worker-2").await;
    env.wait_phase("nm-other", MaintenancePhase::Succeeded)
        .await;
    env.nms()
        .delete("nm-far", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-far").await;
    assert!(!env.controller.is_finished());
    env.stop().await;
}

/// A renew time that is valid RFC 3339 but past the last instant a clock
/// holds (the Lease cannot be read as a typed object at all): ours is
/// renewed over and given up on deletion; another holder's is respected.
/// Either way `kubectl delete nm` completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_lease_time_never_blocks_deletion() {
    let env = Env::start(2).await;
    env.cluster.create(namespace("medik8s-leases")).unwrap();
    for (holder, says) in [
        ("node-maintenance", None),
        (
            "someone-else",
            Some("held by different owner: someone-else"),
        ),
    ] {
        env.cluster
            .create(lease(holder, "9999-12-31T23:59:59.999999Z", 3600))
            .unwrap();
        env.create_nm("nm-odd", "worker-1").await;
        match says {
            None => {
                env.wait_phase("nm-odd", MaintenancePhase::Succeeded).await;
            }
            Some(says) => {
                env.wait_status("nm-odd", "report the held lease", |s| {
                    s.last_error.as_deref().unwrap_or("").contains(says)
                })
                .await;
            }
        }
        env.nms()
            .delete("nm-odd", &DeleteParams::default())
            .await
            .unwrap();
        env.wait_gone("nm-odd").await;
        let left = env.cluster.get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("medik8s-leases"),
            "node-worker-1",
        );
        match holder {
            "node-maintenance" => assert!(left.is_err(), "our lease was given up: {left:?}"),
            _ => {
                assert!(left.is_ok(), "another holder's lease is left alone");
                env.cluster
                    .delete(
                        "coordination.k8s.io/v1",
                        "Lease",
                        Some("medik8s-leases"),
                        "node-worker-1",
                    )
                    .unwrap();
            }
        }
    }
    assert!(!env.controller.is_finished());
    env.stop().await;
}

/// A status patched with values past every range (a time after year 9999,
/// numbers past i32, an unknown phase) does not make the list unreadable:
/// a new NodeMaintenance is still carried out, and the odd one can be
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_odd_status_does_not_hide_the_other_maintenances() {
    let env = Env::start(2).await;
    env.create_nm("odd", "worker-1").await;
    env.wait_phase("odd", MaintenancePhase::Succeeded).await;
    let raw: Api<kube::api::DynamicObject> = Api::all_with(
        env.client.clone(),
        &kube::api::ApiResource::erase::<nmo::crd::NodeMaintenance>(&()),
    );
    raw.patch_status(
        "odd",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "lastUpdate": "9999-12-31T00:00:00Z",
            "drainProgress": 99_999_999_999_i64,
            "evictionPods": 2_147_483_647,
            "errorOnLeaseCount": 2_147_483_647,
            "phase": "Bogus"
        }})),
    )
    .await
    .unwrap();
    env.create_nm("next", "worker-2").await;
    env.wait_phase("next", MaintenancePhase::Succeeded).await;
    env.nms()
        .delete("odd", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("odd").await;
    assert!(!env.controller.is_finished());
    env.stop().await;
}

fn taints(node: &Node) -> Vec<String> {
    let mut v: Vec<String> = taint_keys(node);
    v.sort();
    v
}

/// A node a human cordoned (spec.unschedulable, the unschedulable taint,
/// the exclude label) before a maintenance is left as the human left it
/// when the maintenance ends; a node that had none of it is restored fully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cordoned_by_hand_stays_as_the_human_left_it() {
    let env = Env::start(2).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .patch(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"remediation.medik8s.io/exclude-from-remediation": "true"}},
                "spec": {"unschedulable": true, "taints": [
                    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                    {"key": "team/hold", "value": "x", "effect": "NoSchedule"}
                ]}
            })),
        )
        .await
        .unwrap();
    env.create_nm("by-hand", "worker-1").await;
    env.create_nm("clean", "worker-2").await;
    env.wait_phase("by-hand", MaintenancePhase::Succeeded).await;
    env.wait_phase("clean", MaintenancePhase::Succeeded).await;
    let during = env.node("worker-1").await;
    assert_eq!(
        taints(&during),
        [
            "medik8s.io/drain",
            "node.kubernetes.io/unschedulable",
            "team/hold"
        ]
    );
    for name in ["by-hand", "clean"] {
        env.nms()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        env.wait_gone(name).await;
    }
    let after = env.node("worker-1").await;
    assert_eq!(
        after.spec.as_ref().unwrap().unschedulable,
        Some(true),
        "still cordoned"
    );
    assert_eq!(
        taints(&after),
        ["node.kubernetes.io/unschedulable", "team/hold"]
    );
    let labels = after.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("remediation.medik8s.io/exclude-from-remediation")
            .map(String::as_str),
        Some("true")
    );
    let annotations = after.metadata.annotations.clone().unwrap_or_default();
    assert!(
        !annotations.contains_key(nmo::controller::node::PRIOR_STATE_ANNOTATION),
        "the record goes with the maintenance"
    );
    let clean = env.node("worker-2").await;
    assert_ne!(clean.spec.as_ref().unwrap().unschedulable, Some(true));
    assert!(taints(&clean).is_empty(), "{:?}", taints(&clean));
    assert!(
        !clean
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .contains_key("remediation.medik8s.io/exclude-from-remediation")
    );
    env.stop().await;
}

/// A Node object without `spec` (as a hand-written object or another API
/// server may have it): the maintenance marks it all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_spec_is_put_into_maintenance() {
    let env = Env::start(1).await;
    // The simulated server stores it as given, without `spec`.
    env.cluster
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bare-node"}}))
        .unwrap();
    env.create_nm("bare", "bare-node").await;
    tokio::time::timeout(
        Duration::from_secs(30),
        env.wait_phase("bare", MaintenancePhase::Succeeded),
    )
    .await
    .expect("the maintenance completes");
    let node = env.node("bare-node").await;
    assert_eq!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    env.stop().await;
}

/// Pods that take their time to stop (seconds after SIGTERM), and a first
/// attempt that times out while they are still Terminating: the
/// maintenance is Succeeded only once every pod the plan removes has left
/// the node, terminating or not, as the Go operator waits for deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn succeeded_means_every_removed_pod_has_left_the_node() {
    let env = Env::start_with(2, HOSTILE).await;
    let slow = json!({"sim.nmo.medik8s.io/shutdown-seconds": "40"});
    for i in 0..4 {
        env.cluster
            .create(bare(&format!("slow-{i}"), "worker-1", slow.clone(), 60))
            .unwrap();
    }
    // The first attempt (500 ms) ends with the pods still Terminating; the
    // next ones re-evict pods that are already going.
    env.create_nm_with_reason("patient", "worker-1", "tune:timeout=500")
        .await;
    let started = std::time::Instant::now();
    loop {
        let nm = env.nms().get("patient").await.unwrap();
        if nm.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded) {
            let left: Vec<String> = env
                .pods_on("worker-1")
                .await
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .filter(|n| n.starts_with("slow-"))
                .collect();
            assert!(left.is_empty(), "Succeeded with {left:?} still on the node");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never Succeeded: {:?}",
            nm.status
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    env.stop().await;
}

/// One drain attempt that ends early (only a `block` pod left) is one
/// failure: `on-failure` is asked once, and its `retry-after` is obeyed, so
/// a policy that gives up at the third attempt gives up after two full
/// retry delays, not sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_attempt_is_one_failure_and_its_verdict_is_obeyed() {
    let env = Env::start_with(2, HOSTILE).await;
    env.cluster
        .create(bare("held", "worker-1", json!({}), 30))
        .unwrap();
    env.create_nm_with_reason("counted", "worker-1", "give-up-at-3")
        .await;
    let started = std::time::Instant::now();
    let s = env
        .wait_status("counted", "fail", |s| {
            s.phase == Some(MaintenancePhase::Failed)
        })
        .await;
    let took = started.elapsed();
    assert_eq!(s.last_error.as_deref(), Some("gave up at attempt 3"));
    // Attempts 1 and 2 each wait their 1 s retry before the next.
    assert!(
        took >= Duration::from_millis(1900),
        "gave up after {took:?}"
    );
    env.stop().await;
}

/// The API server comes back from a backup with lower resourceVersions: the
/// controller notices, lists everything again, and carries out a
/// NodeMaintenance created afterwards (whose resourceVersion is below what
/// the old watch waits for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_api_server_is_noticed_and_listed_again() {
    let env = Env::start(3).await;
    let snapshot = env.cluster.snapshot();
    env.create_nm("before-restore", "worker-1").await;
    env.wait_phase("before-restore", MaintenancePhase::Succeeded)
        .await;
    env.cluster.restore(snapshot);
    env.create_nm("after-restore", "worker-2").await;
    tokio::time::timeout(
        Duration::from_secs(30),
        env.wait_phase("after-restore", MaintenancePhase::Succeeded),
    )
    .await
    .expect("the maintenance created after the restore is carried out");
    env.stop().await;
}

/// The rewind check's answer is held back 300 ms (a slow network, a busy
/// operator) while maintenances are written: the watch shows newer
/// resourceVersions before the answer arrives. That is not a rewind: the
/// controller keeps its watch and its drains. (Before, the check compared
/// the answer with what the watch had shown by the time it arrived, and
/// on a busy machine restarted every drain mid-eviction.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_answer_overtaken_by_the_watch_is_not_a_rewind() {
    let env = Env::start_tuned(2, policy_store(None), |s| {
        s.rewind_check = Duration::from_millis(100);
    })
    .await;
    env.create_nm("busy", "worker-1").await;
    env.wait_phase("busy", MaintenancePhase::Succeeded).await;
    env.cluster.set_faults(|f| {
        f.slow_answers = vec![nmo_sim::SlowAnswer {
            verb: Some("list".into()),
            resource: Some("nodemaintenances".into()),
            delay: Duration::from_millis(300),
        }];
    });
    env.cluster.record_audit(true);
    // The operator's requests of `verb` on NodeMaintenances (only those
    // answered, with `answered`).
    let requests = |verb: &str, answered: bool| {
        env.cluster
            .audit()
            .iter()
            .filter(|r| {
                r.user_agent == nmo::client::USER_AGENT
                    && r.verb == verb
                    && r.resource == "nodemaintenances"
                    && (!answered || r.answered.is_some())
            })
            .count()
    };
    let watches = || requests("watch", false);
    let checks = || requests("list", true);
    // Writes for as long as five checks take, each overtaking the answer
    // in flight.
    let nms = env.nms();
    let mut written = 0u32;
    wait_until(
        "five rewind checks answered",
        Duration::from_secs(30),
        || {
            written += 1;
            let patch =
                json!({"metadata": {"annotations": {"example.com/touched": written.to_string()}}});
            let nms = nms.clone();
            async move {
                nms.patch("busy", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
                checks() >= 5
            }
        },
    )
    .await;
    assert_eq!(
        watches(),
        0,
        "the controller listed and watched again ({written} writes, {} checks)",
        checks()
    );
    env.stop().await;
}

/// Readiness follows the NodeMaintenance watch: while every list and watch
/// fails, the operator says it is not ready, and ready again once they
/// work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_watch() {
    let (cluster, client) = start_cluster(1).await;
    let ctx = nmo::controller::Context::new(
        client.clone(),
        policy_store(None),
        nmo::controller::Settings {
            rewind_check: Duration::from_millis(500),
            watch_failure_window: Duration::from_secs(2),
            ..Default::default()
        },
        metrics().controller,
    );
    let checks = nmo::probes::readiness_checks(ctx.clone(), false);
    let ready = |checks: &Vec<(&'static str, nmo::server::Check)>| {
        checks
            .iter()
            .map(|(_, c)| c())
            .find(|r| r.is_err())
            .unwrap_or(Ok(String::new()))
    };
    let running = tokio::spawn(nmo::controller::run(ctx.clone()));
    let wait = |want_ready: bool| {
        let checks = &checks;
        async move {
            let started = std::time::Instant::now();
            loop {
                let now = ready(checks);
                if now.is_ok() == want_ready {
                    return now;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "readiness stayed {now:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait(true).await.unwrap();
    cluster.set_faults(|f| {
        for verb in ["list", "watch"] {
            f.rules.push(nmo_sim::state::FaultRule {
                verb: Some(verb.into()),
                resource: Some("nodemaintenances".into()),
                rate: 1.0,
                code: 500,
            });
        }
    });
    // The server restarts (its open watches end) and then fails every
    // list and watch of NodeMaintenances.
    cluster.restore(cluster.snapshot());
    let why = wait(false).await;
    assert_eq!(why, Err("the NodeMaintenance watch is failing".into()));
    cluster.set_faults(|f| *f = Default::default());
    wait(true).await.unwrap();
    running.abort();
    cluster.stop().await;
}

/// The operator owns the status: a user who writes `Succeeded`/100 while
/// a PodDisruptionBudget still holds a pod on the node sees it corrected
/// (Running, the pod pending, progress below 100), and automation waiting
/// for Succeeded does not proceed while pods remain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_forged_mid_drain_is_corrected() {
    let env = Env::start(3).await;
    env.cluster
        .apply_yaml(&WORKLOAD.replace("replicas: 3", "replicas: 2"))
        .unwrap();
    let node = web_node(&env, 2).await;
    env.create_nm("forged", &node).await;
    env.wait_status("forged", "blocked on the budget", |s| {
        s.pending_pods
            .as_ref()
            .is_some_and(|p| p.iter().any(|p| p.starts_with("web-")))
    })
    .await;
    // Corrected by the end of the drain attempt under way at the latest
    // (the policy's timeout, 30 s by default), and from then on at the
    // start of every pass.
    for attempt in 0..2 {
        env.nms()
            .patch_status(
                "forged",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "phase": "Succeeded", "drainProgress": 100,
                    "pendingPods": null, "pendingPodsRefs": null}})),
            )
            .await
            .unwrap();
        let corrected = env
            .wait_status("forged", "the forged status corrected", |s| {
                s.phase == Some(MaintenancePhase::Running)
                    && s.drain_progress < 100
                    && s.pending_pods
                        .as_ref()
                        .is_some_and(|p| p.iter().any(|p| p.starts_with("web-")))
            })
            .await;
        assert!(
            corrected.drain_progress < 100,
            "attempt {attempt}: {corrected:?}"
        );
    }
    env.stop().await;
}
