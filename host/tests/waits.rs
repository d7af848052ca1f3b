//! No wait holds what it does not need (trust round four): a drain that
//! waits, however long, holds no slot of `--max-concurrent-maintenances`
//! and no reconcile worker; deleting a maintenance ends its waits at once;
//! a workload that forges the handshake's annotations gains nothing; on
//! SIGTERM the operator ends its drains and gives up the leader lock
//! within the Deployment's grace period. On the simulated cluster and on
//! the real control plane.

use crate::common;

use std::time::{Duration, Instant};

use common::drain_actions as scenario;
use common::real::RealEnv;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use nmo::crd::MaintenancePhase;
use nmo_control_plane::Options;
use serde_json::json;

/// A process's user and system CPU time, in clock ticks (100 a second).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces); utime
    // and stime are the 14th and 15th of the whole line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0)
}

/// Slots for two passes at once: fewer than the drains that wait.
const SLOTS: u16 = 2;

/// Three maintenances whose drains wait an hour for an application that
/// never answers (more than the slots), then a default maintenance beside
/// them: it succeeds, and each waiting one goes within moments of its
/// deletion. (Before: the waits held both slots; the third waiting
/// maintenance and the default one were never looked at.)
async fn waits_hold_no_slot(env: &impl ClusterOps) {
    for i in 1..=3 {
        let node = format!("worker-{i}");
        env.create_value(bare(&format!("waiter-{i}"), &node, json!({}), 1))
            .await;
        scenario::hostile_nm(
            env,
            &format!("nm-wait-{i}"),
            &node,
            "tune:notify=3600000,timeout=3600000",
        )
        .await;
    }
    for i in 1..=3 {
        env.wait_status(
            &format!("nm-wait-{i}"),
            "waiting for the application",
            |s| {
                s.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("to leave or answer"))
            },
        )
        .await;
    }
    let started = Instant::now();
    env.create_nm("nm-free", "worker-4").await;
    env.wait_phase("nm-free", MaintenancePhase::Succeeded).await;
    eprintln!(
        "a default maintenance beside {} waiting drains ({SLOTS} slots): Succeeded in {:.2} s",
        3,
        started.elapsed().as_secs_f64()
    );
    for i in 1..=3 {
        let name = format!("nm-wait-{i}");
        let deleted = Instant::now();
        env.nms()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        env.wait_gone(&name).await;
        eprintln!(
            "{name}: its wait ended and it went {:.2} s after its deletion",
            deleted.elapsed().as_secs_f64()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_hold_no_slot_on_nmo_sim() {
    let (_dir, store) = scenario::store();
    let env = Env::start_tuned(4, store, |s| s.max_concurrent = SLOTS).await;
    waits_hold_no_slot(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_hold_no_slot_on_the_real_control_plane() {
    let (_dir, store) = scenario::store();
    let mut env = RealEnv::start_without_operator(Options::workers(4)).await;
    let (_ctx, controller) =
        start_controller_tuned(&env.operator, store, |s| s.max_concurrent = SLOTS);
    env.controller = Some(controller);
    waits_hold_no_slot(&env).await;
    env.stop();
}

/// A workload that writes the handshake's annotations itself, dated in
/// the year 2999, before the maintenance asks: the deadline is the
/// policy's 2 s from now, not the forged one, and the pod goes when it
/// runs out. (Before: the forged request stood; the deadline was in 2999.)
async fn a_forged_handshake_gains_nothing(env: &impl ClusterOps) {
    env.create_value(bare(
        "forger",
        "worker-1",
        json!({
            "nmo.medik8s.io/handshake": "2s",
            "nmo.medik8s.io/eviction-requester": "nmo/nm-forged",
            "nmo.medik8s.io/eviction-requested": "2999-01-01T00:00:00Z",
            "nmo.medik8s.io/eviction-deadline": "2999-01-01T00:00:02Z",
        }),
        1,
    ))
    .await;
    env.create_nm_with_policy("nm-forged", "worker-1", Some("no-downtime"))
        .await;
    env.wait_phase("nm-forged", MaintenancePhase::Succeeded)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_handshake_gains_nothing_on_nmo_sim() {
    let (_dir, store) = scenario::store();
    let env = Env::start_store(2, store).await;
    a_forged_handshake_gains_nothing(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_handshake_gains_nothing_on_the_real_control_plane() {
    let (_dir, store) = scenario::store();
    let env = RealEnv::start_store(Options::workers(2), store).await;
    a_forged_handshake_gains_nothing(&env).await;
    env.stop();
}

/// SIGTERM to the leader while its drain waits for an application that
/// never answers (an hour): it exits within the Deployment's 10 s grace
/// period, having given up the leader lock, and the maintenance is left
/// for the next leader, which finishes it. (Before: the leader waited for
/// its reconcile to end, up to the attempt's hour.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_drain_ends_within_the_grace_period() {
    let env = RealEnv::start_without_operator(Options::workers(2)).await;
    let logs = tempfile::tempdir().unwrap();
    let policy = format!(
        "--policy={}/nmo_policy_hostile.wasm",
        env!("NMO_POLICY_WASM_DIR")
    );
    let args = [
        "--leader-elect".to_owned(),
        policy.clone(),
        "--policy-cache-dir=".to_owned(),
    ];
    let mut leader = real::operator_process(&env, "nmo-a", &logs.path().join("a.log"), &args);
    env.create_value(bare("waiter", "worker-1", json!({}), 1))
        .await;
    env.create_nm_with_reason("nm-term", "worker-1", "tune:notify=3600000,timeout=3600000")
        .await;
    env.wait_status("nm-term", "waiting for the application", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("to leave or answer"))
    })
    .await;
    // While it waits, it does not spin: well under half a core over a
    // few seconds (a wait that woke itself took a whole one).
    let pid = leader.id().unwrap();
    let (ticks_before, window) = (cpu_ticks(pid), Instant::now());
    env.wait_status("nm-term", "still waiting 3 s on", |_| {
        window.elapsed() >= Duration::from_secs(3)
    })
    .await;
    let ticks = cpu_ticks(pid) - ticks_before;
    let share = ticks as f64 / 100.0 / window.elapsed().as_secs_f64();
    eprintln!(
        "CPU while the handshake waits: {:.0} % of a core",
        share * 100.0
    );
    assert!(
        share < 0.5,
        "the waiting leader used {:.0} % of a core",
        share * 100.0
    );
    let signalled = Instant::now();
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let exited = tokio::time::timeout(Duration::from_secs(30), leader.wait()).await;
    let took = signalled.elapsed();
    assert!(
        exited.is_ok(),
        "still running 30 s after SIGTERM: {}",
        std::fs::read_to_string(logs.path().join("a.log")).unwrap_or_default()
    );
    eprintln!(
        "the leader exited {:.2} s after SIGTERM, mid-drain",
        took.as_secs_f64()
    );
    assert!(
        took < Duration::from_secs(10),
        "exited {took:?} after SIGTERM: past the Deployment's 10 s grace period"
    );
    let lock = Api::<Lease>::namespaced(env.admin.clone(), real::NAMESPACE)
        .get("135b1886.medik8s.io")
        .await
        .unwrap();
    let holder = lock
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.is_empty(), "the lock is still held by {holder:?}");
    // The next leader resumes the drain: the application answers, the
    // maintenance succeeds.
    let mut next = real::operator_process(&env, "nmo-b", &logs.path().join("b.log"), &args);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.admin.clone(), "default");
    pods.patch(
        "waiter",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"metadata": {"annotations": {"nmo.medik8s.io/eviction-ready": "true"}}}),
        ),
    )
    .await
    .unwrap();
    env.wait_phase("nm-term", MaintenancePhase::Succeeded).await;
    let _ = next.kill().await;
    env.stop();
}

/// A cluster whose waiting-update interval is an hour, a pod `stuck` on
/// worker-1 that never finishes terminating, and the maintenance `name`
/// of worker-1 decided by the hostile policy with `knobs`.
async fn hostile_on_a_stuck_pod(name: &str, knobs: &str) -> (tempfile::TempDir, Env) {
    let (dir, store) = scenario::store();
    let env = Env::start_tuned(2, store, |s| {
        s.waiting_update_interval = Duration::from_secs(3600)
    })
    .await;
    env.create_value(never_terminating("stuck", "worker-1"))
        .await;
    scenario::hostile_nm(&env, name, "worker-1", knobs).await;
    (dir, env)
}

/// A policy that parks at every call with a new reason (one naming the
/// time, say) and the soonest recheck: the status's reason and the
/// `ParkedMaintenance` events follow at most once per waiting-update
/// interval, however often the policy is asked. (Before: one event per
/// call, 57 a minute.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_reason_that_changes_every_call_floods_nothing() {
    let (_dir, env) = hostile_on_a_stuck_pod("nm-churn", "tune:timeout=200,park-churn").await;
    let first = env
        .wait_status("nm-churn", "parked", |s| s.parked.is_some())
        .await
        .parked
        .unwrap()
        .reason;
    // The policy is asked again every second (the contract's soonest
    // recheck): each answer moves `recheckAt`; three more at least.
    let recheck = || async {
        env.nms()
            .get("nm-churn")
            .await
            .unwrap()
            .status
            .unwrap()
            .parked
            .unwrap()
            .recheck_at
    };
    let mut seen = vec![recheck().await];
    let started = Instant::now();
    while seen.len() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the policy was not asked again: {seen:?}"
        );
        let now = recheck().await;
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let parked = env
        .nms()
        .get("nm-churn")
        .await
        .unwrap()
        .status
        .unwrap()
        .parked
        .unwrap();
    assert_eq!(
        parked.reason, first,
        "the reason was rewritten within the interval"
    );
    let events: Vec<_> = env
        .events_for("nm-churn")
        .await
        .into_iter()
        .filter(|(_, reason, _)| reason == "ParkedMaintenance")
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    env.stop().await;
}

/// A pod that never finishes terminating, deleted by force at every
/// attempt of a policy that retries: one `ForcedPodRemoval` event per
/// waiting-update interval, however many attempts delete it again.
/// (Before: one event per attempt, every second for as long as it lasts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_removal_repeated_by_every_retry_is_said_once_an_interval() {
    let (_dir, env) = hostile_on_a_stuck_pod("nm-force", "tune:timeout=200,delete").await;
    let deleted = || {
        env.metrics
            .controller
            .pod_removals(nmo::controller::metrics::PodOutcome::Deleted)
    };
    wait_until(
        "three attempts deleting the pod",
        Duration::from_secs(60),
        || async { deleted() >= 3 },
    )
    .await;
    let forced: Vec<_> = env
        .events_for("nm-force")
        .await
        .into_iter()
        .filter(|(_, reason, _)| reason == "ForcedPodRemoval")
        .collect();
    assert_eq!(forced.len(), 1, "after {} deletions: {forced:?}", deleted());
    assert!(
        forced[0].2.contains("default/stuck"),
        "the event names the pod: {forced:?}"
    );
    env.stop().await;
}

/// Several pods of one Deployment surged from one node: as many at once
/// as its `maxSurge` allows (8 replicas, the default 25 %: 2, so 10
/// replicas at most and at some moment; before, one at a time: 9), and
/// `lastError` shows one steady text, the first waiting pod's, changing
/// only when what it waits for changes. (Before that: whichever pod spoke
/// last, flapping between them at every look, a status write each time,
/// and raw API conflicts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_waiting_together_show_one_steady_text() {
    let (_dir, store) = scenario::store();
    let env = Env::start_store(2, store).await;
    env.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: many, namespace: default}
spec:
  replicas: 8
  selector: {matchLabels: {app: many}}
  template:
    metadata:
      labels: {app: many}
      # A replacement takes a second to be Ready: the status is written
      # while the surges wait.
      annotations: {sim.nmo.medik8s.io/startup-seconds: "20"}
    spec: {terminationGracePeriodSeconds: 5, containers: [{name: c, image: i}]}
"#,
    )
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client().clone(), "default");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(env.client().clone(), "default");
    let on_worker_1 = || async {
        pods.list(&kube::api::ListParams::default().labels("app=many"))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| {
                scenario::is_ready(p)
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("worker-1")
            })
            .count()
    };
    wait_until(
        "three Ready pods on worker-1",
        Duration::from_secs(60),
        || async { on_worker_1().await >= 3 },
    )
    .await;
    env.create_nm_with_policy("nm-many", "worker-1", Some("no-downtime"))
        .await;
    let mut seen: Vec<String> = Vec::new();
    let mut most_replicas = 0;
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "not Succeeded: {seen:#?}"
        );
        let replicas = deployments
            .get("many")
            .await
            .unwrap()
            .spec
            .and_then(|s| s.replicas)
            .unwrap_or(0);
        most_replicas = most_replicas.max(replicas);
        let s = env
            .nms()
            .get("nm-many")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        if let Some(e) = s.last_error.filter(|e| !e.is_empty())
            && seen.last() != Some(&e)
        {
            seen.push(e);
        }
        if s.phase == Some(MaintenancePhase::Succeeded) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        most_replicas, 10,
        "two surges at once, never more (8 replicas, maxSurge 25 %): {seen:#?}"
    );
    assert!(
        seen.iter().any(|e| e.contains("surging pod")),
        "the status said what the drain waited for: {seen:#?}"
    );
    for (i, e) in seen.iter().enumerate() {
        assert!(
            !seen[i + 1..].contains(e),
            "{e:?} came back after another text replaced it: {seen:#?}"
        );
        assert!(
            !e.contains("Operation cannot be fulfilled"),
            "a raw API conflict: {seen:#?}"
        );
    }
    env.stop().await;
}
