//! Fleet admission end to end: twelve nodes in three zones, twelve
//! NodeMaintenances created at once, and a policy that says how many may
//! hold a node at a time. What was cordoned when is read from the API
//! server's own stream of node versions (a watch the test makes), not from
//! the operator.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use nmo::crd::{MaintenancePhase, NodeMaintenance};
use nmo::policy::{EngineConfig, PolicyEngine, PolicyStore, Settings};
use serde_json::json;

const ZONE: &str = "topology.kubernetes.io/zone";

fn zone_of(i: usize) -> String {
    format!("zone-{}", ["a", "b", "c"][(i - 1) % 3])
}

/// A store of one example policy with these settings.
fn policy(stem: &str, settings: &[(&str, &str)]) -> Arc<PolicyStore> {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let policy = engine
        .load(stem, &built_policy(&stem.replace('-', "_")))
        .unwrap();
    let settings: BTreeMap<String, String> = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    PolicyStore::single(policy.with_settings(Settings::from_map(&settings)).unwrap())
}

/// Twelve workers in three zones, two pods each.
async fn fleet_env(policies: Arc<PolicyStore>) -> Env {
    let env = Env::start_store(12, policies).await;
    fleet_workload(&env).await;
    for i in 1..=12 {
        env.wait_watch_current(&format!("worker-{i}")).await;
    }
    env
}

/// Labels `worker-1`..`worker-12` with their zones and puts two pods on
/// each.
async fn fleet_workload(env: &impl ClusterOps) {
    let nodes: Api<Node> = Api::all(env.client().clone());
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), "default");
    for i in 1..=12 {
        let name = format!("worker-{i}");
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {ZONE: zone_of(i)}}})),
            )
            .await
            .unwrap();
        for p in 0..2 {
            let pod = bare(&format!("app-{i}-{p}"), &name, json!({}), 1);
            pods.create(
                &PostParams::default(),
                &serde_json::from_value(pod).unwrap(),
            )
            .await
            .unwrap();
        }
    }
}

/// Every version of every node the API server sends, kept as "which
/// nodes are cordoned" after each one.
fn record_cordons(client: &kube::Client) -> Arc<Mutex<Vec<BTreeSet<String>>>> {
    let timeline = Arc::new(Mutex::new(Vec::<BTreeSet<String>>::new()));
    let nodes: Api<Node> = Api::all(client.clone());
    let t = timeline.clone();
    tokio::spawn(async move {
        let mut cordoned = BTreeSet::new();
        let mut stream = watcher(nodes, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(node)) = stream.next().await {
            let name = node.metadata.name.clone().unwrap_or_default();
            if node.spec.and_then(|s| s.unschedulable).unwrap_or(false) {
                cordoned.insert(name);
            } else {
                cordoned.remove(&name);
            }
            t.lock().unwrap().push(cordoned.clone());
        }
    });
    timeline
}

/// Creates `nm-01`..`nm-N` for `worker-1`..`worker-N`, one right after
/// the other (so creation order is name order).
async fn create_at_once(env: &impl ClusterOps, n: usize) {
    for i in 1..=n {
        env.create_nm(&format!("nm-{i:02}"), &format!("worker-{i}"))
            .await;
    }
}

/// Creates the twelve maintenances at once; deletes each as soon as it
/// succeeds (the work on the node done), until all twelve have succeeded
/// and are gone. Returns the order in which they were admitted (those
/// first seen admitted together, by name).
async fn run_all(env: &impl ClusterOps) -> Vec<String> {
    let nms = env.nms();
    create_at_once(env, 12).await;
    let mut done = Vec::new();
    let mut admitted: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while done.len() < 12 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {done:?} succeeded"
        );
        let list = nms.list(&Default::default()).await.unwrap().items;
        let mut newly: Vec<String> = list
            .iter()
            .filter(|nm| nmo::controller::is_admitted(nm))
            .filter_map(|nm| nm.metadata.name.clone())
            .filter(|n| !admitted.contains(n))
            .collect();
        newly.sort();
        admitted.extend(newly);
        for nm in list {
            let name = nm.metadata.name.clone().unwrap_or_default();
            let phase = nm.status.as_ref().and_then(|s| s.phase);
            assert_ne!(
                phase,
                Some(MaintenancePhase::Failed),
                "{name}: {:?}",
                nm.status
            );
            if phase == Some(MaintenancePhase::Succeeded) && !done.contains(&name) {
                done.push(name.clone());
                nms.delete(&name, &DeleteParams::default()).await.unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_all_gone(&nms, Duration::from_secs(60)).await;
    admitted
}

fn zone_of_node(name: &str) -> String {
    zone_of(name.trim_start_matches("worker-").parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_per_zone_never_cordons_two_nodes_of_a_zone() {
    let env = fleet_env(policy("one-per-zone", &[])).await;
    one_per_zone_holds(&env).await;
    env.stop().await;
}

/// The same on the real control plane: twelve kwok nodes, the node
/// versions read from the real API server's watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_per_zone_on_the_real_control_plane() {
    let opts = nmo_control_plane::Options {
        nodes: (1..=12)
            .map(|i| {
                nmo_control_plane::NodeSpec::new(format!("worker-{i}")).label(ZONE, &zone_of(i))
            })
            .collect(),
        ..Default::default()
    };
    let env = common::real::RealEnv::start_store(opts, policy("one-per-zone", &[])).await;
    fleet_workload(&env).await;
    one_per_zone_holds(&env).await;
    env.stop();
}

/// Twelve maintenances at once under one-per-zone: never two nodes of a
/// zone cordoned together, the zones in parallel, each zone in creation
/// order, and the waiting ones say why.
async fn one_per_zone_holds(env: &impl ClusterOps) {
    let timeline = record_cordons(env.client());
    // While the first three drain, the others wait and say why.
    let order = run_all(env).await;
    assert_eq!(order.len(), 12);
    let timeline = timeline.lock().unwrap().clone();
    let mut most_at_once = 0;
    for cordoned in &timeline {
        let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
        for n in cordoned {
            *per_zone.entry(zone_of_node(n)).or_default() += 1;
        }
        assert!(
            per_zone.values().all(|c| *c <= 1),
            "two nodes of one zone cordoned together: {cordoned:?}"
        );
        most_at_once = most_at_once.max(cordoned.len());
    }
    // Zones did not wait for each other.
    assert_eq!(most_at_once, 3, "one node per zone at a time, three zones");
    // In each zone, the maintenances went in the order they were created.
    for zone in ["zone-a", "zone-b", "zone-c"] {
        let in_zone: Vec<&String> = order
            .iter()
            .filter(|nm| zone_of(nm.trim_start_matches("nm-").parse().unwrap()) == zone)
            .collect();
        let mut sorted = in_zone.clone();
        sorted.sort();
        assert_eq!(in_zone, sorted, "{zone}");
    }
    // The last of a zone waited, and said why in an event.
    let events = env.events_for("nm-12").await;
    assert!(
        events.iter().any(
            |(_, reason, msg)| reason == "WaitingMaintenance" && msg.contains("of zone zone-c")
        ),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_unavailable_25_percent_keeps_three_of_twelve_at_most() {
    let env = fleet_env(policy("max-unavailable", &[("max", "25%")])).await;
    let timeline = record_cordons(&env.client);
    let nms = env.nms();
    let order = run_all(&env).await;
    assert_eq!(order.len(), 12);
    let most = timeline.lock().unwrap().iter().map(BTreeSet::len).max();
    assert_eq!(most, Some(3), "at most 25% of 12 at once, and that many");
    // Admitted in the order they were created, give or take those that
    // fitted in the same freed places: none is passed by more than the
    // three that may go at once.
    let mut sorted = order.clone();
    sorted.sort();
    for (position, name) in order.iter().enumerate() {
        let created = sorted.iter().position(|n| n == name).unwrap();
        assert!(position.abs_diff(created) < 3, "{order:?}");
    }
    drop(nms);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_maintenance_touches_nothing_and_shows_why() {
    let env = fleet_env(policy("max-unavailable", &[("max", "1")])).await;
    let nms = env.nms();
    env.create_nm("first", "worker-1").await;
    wait_succeeded(&nms, "first", Duration::from_secs(60)).await;
    env.create_nm("second", "worker-2").await;
    let s = env
        .wait_status("second", "wait", |s| s.waiting.is_some())
        .await;
    let waiting = s.waiting.unwrap();
    assert!(
        waiting
            .reason
            .contains("1 of 12 node(s) unavailable (1 in maintenance, 0 NotReady)"),
        "{waiting:?}"
    );
    assert!(waiting.since.is_some());
    // What a Go-operator client sees: no phase yet, nothing started.
    assert_eq!(s.phase, None);
    assert_eq!(s.drain_progress, 0);
    // The node is untouched: not cordoned, no lease, its pods still there.
    let node = env.node("worker-2").await;
    assert_ne!(node.spec.and_then(|s| s.unschedulable), Some(true));
    assert_eq!(env.pods_on("worker-2").await.len(), 2);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client.clone(), "medik8s-leases");
    assert!(leases.get_opt("worker-2").await.unwrap().is_none());
    // It has not begun: its events say it waits, not that it began.
    wait_until(
        "the WaitingMaintenance event",
        Duration::from_secs(30),
        || async {
            env.events_for("second")
                .await
                .iter()
                .any(|(_, r, _)| r == "WaitingMaintenance")
        },
    )
    .await;
    let events = env.events_for("second").await;
    assert!(
        !events.iter().any(|(_, r, _)| r == "BeginMaintenance"),
        "{events:?}"
    );
    // `kubectl get nm` shows why (the Waiting column).
    let crd = nmo::crd::crd_yaml();
    assert!(crd.contains("jsonPath: .status.waiting.reason"), "{crd}");
    // The first one ends: the second starts at once, without waiting out a
    // recheck.
    nms.delete("first", &DeleteParams::default()).await.unwrap();
    wait_succeeded(&nms, "second", Duration::from_secs(30)).await;
    let s = nms.get("second").await.unwrap().status.unwrap();
    assert_eq!(s.waiting, None);
    assert!(s.admitted_at.is_some());
    let events = env.events_for("second").await;
    let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
    assert!(
        reasons.contains(&"WaitingMaintenance") && reasons.contains(&"AdmittedMaintenance"),
        "{reasons:?}"
    );
    // It began once, when admitted.
    assert_eq!(
        reasons.iter().filter(|r| **r == "BeginMaintenance").count(),
        1,
        "{reasons:?}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_maintenances_at_once_are_never_admitted_on_a_stale_view() {
    let env = Env::start_store(20, policy("max-unavailable", &[("max", "2")])).await;
    let timeline = record_cordons(&env.client);
    let nms = env.nms();
    create_at_once(&env, 20).await;
    wait_until("two admitted", Duration::from_secs(30), || async {
        nms.list(&Default::default())
            .await
            .unwrap()
            .iter()
            .filter(|nm| nmo::controller::is_admitted(nm))
            .count()
            == 2
    })
    .await;
    // Every other one has been asked and waits; none more is admitted.
    wait_until("eighteen waiting", Duration::from_secs(30), || async {
        nms.list(&Default::default())
            .await
            .unwrap()
            .iter()
            .filter(|nm| nm.status.as_ref().is_some_and(|s| s.waiting.is_some()))
            .count()
            == 18
    })
    .await;
    let admitted: Vec<NodeMaintenance> = nms
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(nmo::controller::is_admitted)
        .collect();
    assert_eq!(admitted.len(), 2);
    let most = timeline.lock().unwrap().iter().map(BTreeSet::len).max();
    assert!(most <= Some(2), "{most:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admission_the_policy_cannot_make_or_refuses_touches_nothing() {
    let env = Env::start_with(2, HOSTILE).await;
    // A trap in admit: a policy error, reported, nothing touched.
    env.create_nm_with_reason("trapped", "worker-1", "admit-trap")
        .await;
    let s = env
        .wait_status("trapped", "report the policy error", |s| {
            s.last_error.is_some()
        })
        .await;
    assert!(
        s.last_error.as_deref().unwrap().contains("panics in admit"),
        "{s:?}"
    );
    assert_eq!(s.phase, None);
    // A deny: the maintenance fails with the policy's message.
    env.create_nm_with_reason("denied", "worker-2", "admit-deny")
        .await;
    let nm = env.wait_phase("denied", MaintenancePhase::Failed).await;
    assert_eq!(
        nm.status.unwrap().last_error.as_deref(),
        Some("denied by the hostile policy")
    );
    for node in ["worker-1", "worker-2"] {
        let n = env.node(node).await;
        assert_ne!(n.spec.and_then(|s| s.unschedulable), Some(true), "{node}");
    }
    let events = env.events_for("denied").await;
    assert!(
        events
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "FailedMaintenance"),
        "{events:?}"
    );
    env.stop().await;
}

/// Nothing is remembered of a maintenance once it is gone (its policy, its
/// failures, our own writes to it, its admission, a forced recheck): not of
/// those that ran, nor of waiting ones deleted together with the one whose
/// end freed their place (the forced recheck the freed place gave them is
/// never taken by a pass that finds them being deleted). The operator's
/// memory does not grow with the maintenances it has seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_is_remembered_of_maintenances_that_are_gone() {
    let (cluster, client) = start_cluster(4).await;
    let (ctx, controller) =
        start_controller_tuned(&client, policy("max-unavailable", &[("max", "1")]), |s| {
            s.orphan_sweep = Duration::from_secs(1)
        });
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    for round in 0..3 {
        let running = format!("run-{round}");
        create_nm_retrying(&nms, &running, "worker-1").await;
        wait_succeeded(&nms, &running, Duration::from_secs(60)).await;
        for (name, node) in [("wait-a", "worker-2"), ("wait-b", "worker-3")] {
            create_nm_retrying(&nms, name, node).await;
        }
        wait_until("both waiting", Duration::from_secs(30), || async {
            nms.list(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|nm| nm.status.as_ref().is_some_and(|s| s.waiting.is_some()))
                .count()
                == 2
        })
        .await;
        assert!(ctx.remembered() >= 3, "{}", ctx.remembered());
        // All three deleted at once: the running one's end frees a place
        // for the waiting ones, which are being deleted themselves.
        for name in [running.as_str(), "wait-a", "wait-b"] {
            nms.delete(name, &DeleteParams::default()).await.unwrap();
        }
        wait_all_gone(&nms, Duration::from_secs(60)).await;
        wait_until(
            &format!("nothing remembered after round {round}"),
            Duration::from_secs(10),
            || async { ctx.remembered() == 0 },
        )
        .await;
    }
    // A maintenance that goes while the operator is not watching (a watch
    // gap, a restart of the run with the same context; here its finalizer
    // removed by hand meanwhile) gets no pass and no Delete event: the
    // next sweep forgets it.
    create_nm_retrying(&nms, "vanish", "worker-4").await;
    wait_succeeded(&nms, "vanish", Duration::from_secs(60)).await;
    assert!(ctx.remembered() >= 1);
    controller.abort();
    let _ = controller.await;
    nms.patch(
        "vanish",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    nms.delete("vanish", &DeleteParams::default())
        .await
        .unwrap();
    wait_all_gone(&nms, Duration::from_secs(30)).await;
    let run = ctx.clone();
    let controller = tokio::spawn(async move {
        nmo::controller::run(run).await.expect("controller runs");
    });
    wait_until(
        "nothing remembered of the maintenance that went unseen",
        Duration::from_secs(10),
        || async { ctx.remembered() == 0 },
    )
    .await;
    controller.abort();
    cluster.stop().await;
}

/// What each tool writes on a node, as a merge patch, and the patch that
/// takes it away again.
fn tool_marks() -> Vec<(
    &'static str,
    serde_json::Value,
    serde_json::Value,
    &'static str,
)> {
    vec![
        (
            "karpenter",
            json!({"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}),
            json!({"spec": {"taints": null}}),
            "is taken by Karpenter (taint karpenter.sh/disrupted)",
        ),
        (
            "autoscaler",
            json!({"spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1733216400", "effect": "NoSchedule"}]}}),
            json!({"spec": {"taints": null}}),
            "is taken by the cluster autoscaler (taint ToBeDeletedByClusterAutoscaler)",
        ),
        (
            "kured",
            json!({"metadata": {"annotations": {"weave.works/kured-reboot-in-progress": "2026-12-03T09:00:00Z"}}}),
            json!({"metadata": {"annotations": {"weave.works/kured-reboot-in-progress": null}}}),
            "is taken by kured (annotation weave.works/kured-reboot-in-progress)",
        ),
        (
            "remediation",
            json!({"spec": {"taints": [{"key": "medik8s.io/remediation", "value": "self-node-remediation", "effect": "NoExecute"}]}}),
            json!({"spec": {"taints": null}}),
            "is taken by a medik8s remediation (taint medik8s.io/remediation)",
        ),
        (
            "cordon",
            json!({"spec": {"unschedulable": true}}),
            json!({"spec": {"unschedulable": null}}),
            "is unschedulable, reason unknown (cordoned)",
        ),
    ]
}

/// Another tool holding a node of the zone (what Karpenter, the cluster
/// autoscaler, kured, a medik8s remediation or a person writes on it)
/// holds one-per-zone back, with that tool named in the reason; once the
/// tool lets go, the maintenance starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_per_zone_waits_while_another_tool_holds_a_node_of_the_zone() {
    let env = fleet_env(policy("one-per-zone", &[])).await;
    let nodes: Api<Node> = Api::all(env.client().clone());
    let patch = |node: &'static str, body: serde_json::Value| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(body))
                .await
                .unwrap();
        }
    };
    // worker-1 and worker-4 are both in zone-a.
    for (tool, mark, unmark, says) in tool_marks() {
        patch("worker-4", mark).await;
        env.wait_watch_current("worker-4").await;
        let name = format!("nm-{tool}");
        env.create_nm(&name, "worker-1").await;
        let s = env
            .wait_status(&name, "waiting for the other tool", |s| s.waiting.is_some())
            .await;
        let reason = s.waiting.unwrap().reason;
        assert!(
            reason.contains(&format!("worker-4 of zone zone-a {says}")),
            "{tool}: {reason}"
        );
        assert_eq!(s.phase, None, "{tool}: nothing started");
        patch("worker-4", unmark).await;
        wait_succeeded(&env.nms(), &name, Duration::from_secs(60)).await;
        env.nms()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        wait_until("the maintenance gone", Duration::from_secs(30), || async {
            env.nms().get_opt(&name).await.unwrap().is_none()
        })
        .await;
    }
    env.stop().await;
}

/// A Node Health Check remediator (or another medik8s operator) holding a
/// node's lease in `medik8s-leases` holds one-per-zone back, named in the
/// reason; once it lets the lease go, the maintenance starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_per_zone_waits_while_a_remediator_holds_the_lease_of_a_node_of_the_zone() {
    let env = fleet_env(policy("one-per-zone", &[])).await;
    let ctx = env.ctx.clone().expect("the controller's context");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client().clone(), "medik8s-leases");
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client().clone())
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "medik8s-leases"}})).unwrap(),
        )
        .await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    leases
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node-worker-4"},
                "spec": {"holderIdentity": "node-healthcheck", "leaseDurationSeconds": 3600,
                         "acquireTime": now, "renewTime": now}}))
            .unwrap(),
        )
        .await
        .unwrap();
    wait_until(
        "the lease watch has it",
        Duration::from_secs(30),
        || async { ctx.watched_lease_holder("worker-4").as_deref() == Some("node-healthcheck") },
    )
    .await;
    env.create_nm("nm-leased", "worker-1").await;
    let s = env
        .wait_status("nm-leased", "waiting for the remediator", |s| {
            s.waiting.is_some()
        })
        .await;
    let reason = s.waiting.unwrap().reason;
    assert!(
        reason.contains(
            "worker-4 of zone zone-a is taken by node-healthcheck (its medik8s lease in medik8s-leases)"
        ),
        "{reason}"
    );
    leases
        .delete("node-worker-4", &DeleteParams::default())
        .await
        .unwrap();
    wait_succeeded(&env.nms(), "nm-leased", Duration::from_secs(60)).await;
    env.stop().await;
}

/// The fleet's history: a maintenance that ended holds the next one back
/// for the `rate` policy's soak time, and the history outlives the
/// operator (a restarted one reads it from its ConfigMap).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_soak_time_after_each_node_holds_the_next_one_across_a_restart() {
    let store = policy("rate", &[("max", "10"), ("soak", "1h")]);
    let mut env = Env::start_store(3, store.clone()).await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client().clone())
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "medik8s-leases"}})).unwrap(),
        )
        .await;
    env.create_nm("nm-first", "worker-1").await;
    wait_succeeded(&env.nms(), "nm-first", Duration::from_secs(60)).await;
    env.nms()
        .delete("nm-first", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("nm-first gone", Duration::from_secs(30), || async {
        env.nms().get_opt("nm-first").await.unwrap().is_none()
    })
    .await;
    env.create_nm("nm-second", "worker-2").await;
    soaking(&env, "nm-second").await;
    // A new operator, nothing in memory: the history is in its ConfigMap.
    env.controller.abort();
    let cm: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(env.client().clone(), "medik8s-leases");
    let saved = cm.get("nmo-maintenance-history").await.unwrap();
    let text = saved.data.unwrap()["history.json"].clone();
    assert!(
        text.contains(r#""name":"nm-first","node":"worker-1""#)
            && text.contains(r#""outcome":"Succeeded""#),
        "{text}"
    );
    let (ctx, controller) = start_controller_ctx(&env.client, store);
    env.controller = controller;
    env.ctx = Some(ctx);
    env.create_nm("nm-third", "worker-3").await;
    soaking(&env, "nm-third").await;
    env.stop().await;
}

/// `name` waits, soaking after worker-1, and nothing started.
async fn soaking(env: &Env, name: &str) {
    let s = env
        .wait_status(name, "soaking", |s| s.waiting.is_some())
        .await;
    let reason = s.waiting.unwrap().reason;
    assert!(
        reason.contains("soaking: node worker-1 came back") && reason.contains("1h of soak time"),
        "{reason}"
    );
    assert_eq!(s.phase, None, "nothing started");
}

/// Cluster API deleting a node's Machine, NVIDIA's maintenance operator
/// holding a NodeMaintenance of it, and kured's reboot lock naming it each
/// hold one-per-zone back, named in the reason (read from their own
/// objects, the CRDs appearing after the operator started); once they let
/// go, the maintenance starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_per_zone_waits_while_cluster_api_nvidia_or_kured_holds_a_node_of_the_zone() {
    let env = fleet_env(policy("one-per-zone", &[])).await;
    let ctx = env.ctx.clone().expect("the controller's context");
    env.apply(TOOL_CRDS).await;
    let tools = [
        (
            json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                "metadata": {"name": "md-0-x7k2p", "namespace": "default", "finalizers": ["machine.cluster.x-k8s.io"]},
                "spec": {"clusterName": "prod"}, "status": {"nodeRef": {"kind": "Node", "name": "worker-4"}}}),
            "cluster-api default/md-0-x7k2p",
            "is taken by Cluster API (Machine default/md-0-x7k2p being deleted)",
        ),
        (
            json!({"apiVersion": "maintenance.nvidia.com/v1alpha1", "kind": "NodeMaintenance",
                "metadata": {"name": "upgrade-worker-4", "namespace": "default"},
                "spec": {"nodeName": "worker-4", "requestorID": "gpu-operator"}}),
            "nvidia default/upgrade-worker-4",
            "is taken by NVIDIA's maintenance operator (NodeMaintenance default/upgrade-worker-4)",
        ),
        // kured's reboot lock as kured writes it on its own DaemonSet
        // (no TTL: held until kured releases it).
        (
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "kured", "namespace": "default",
                    "annotations": {"weave.works/kured-node-lock":
                        r#"{"nodeID":"worker-4","metadata":{"unschedulable":false},"created":"2026-12-05T07:00:00Z","TTL":0}"#}},
                "spec": {"selector": {"matchLabels": {"name": "kured"}},
                    "template": {"metadata": {"labels": {"name": "kured"}},
                        "spec": {"nodeSelector": {"kured": "here"},
                            "containers": [{"name": "kured", "image": "ghcr.io/kubereboot/kured"}]}}}}),
            "kured default/kured",
            "is taken by kured (its reboot lock on DaemonSet default/kured)",
        ),
    ];
    for (i, (object, claim, says)) in tools.into_iter().enumerate() {
        let api_version = object["apiVersion"].as_str().unwrap().to_owned();
        let (group, version) = api_version.split_once('/').unwrap();
        let kind = object["kind"].as_str().unwrap().to_owned();
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let resource = kube::api::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.clone(),
            kind: kind.clone(),
            plural: match kind.as_str() {
                "Machine" => "machines",
                "DaemonSet" => "daemonsets",
                _ => "nodemaintenances",
            }
            .into(),
        };
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(env.client().clone(), "default", &resource);
        // The CRD may take a moment to serve.
        let object: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
        wait_until(
            "the tool's object created",
            Duration::from_secs(30),
            || async { api.create(&Default::default(), &object).await.is_ok() },
        )
        .await;
        // A Machine claims its node once Cluster API deletes it (its
        // finalizer holds it meanwhile).
        if kind == "Machine" {
            api.delete(&name, &DeleteParams::default()).await.unwrap();
        }
        wait_until("the claim watched", Duration::from_secs(30), || async {
            ctx.watched_tool_claims("worker-4")
                .contains(&claim.to_owned())
        })
        .await;
        let nm = format!("nm-tool-{i}");
        env.create_nm(&nm, "worker-1").await;
        let s = env
            .wait_status(&nm, "waiting for the tool", |s| s.waiting.is_some())
            .await;
        let reason = s.waiting.unwrap().reason;
        assert!(
            reason.contains(&format!("worker-4 of zone zone-a {says}")),
            "{reason}"
        );
        // The tool lets go (kured: its lock's annotation removed, as
        // kured releases it).
        if kind == "Machine" {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
        } else if kind == "DaemonSet" {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"weave.works/kured-node-lock": null}}}),
                ),
            )
            .await
            .unwrap();
        } else {
            api.delete(&name, &DeleteParams::default()).await.unwrap();
        }
        wait_succeeded(&env.nms(), &nm, Duration::from_secs(60)).await;
        env.nms()
            .delete(&nm, &DeleteParams::default())
            .await
            .unwrap();
        wait_until("the maintenance gone", Duration::from_secs(30), || async {
            env.nms().get_opt(&nm).await.unwrap().is_none()
        })
        .await;
    }
    env.stop().await;
}
