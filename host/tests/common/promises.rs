//! The promises the hostile rounds broke, each as a scenario on either
//! cluster (`promises.rs` runs them on nmo-sim and on the real control
//! plane): what a tenant writes on its own pods and workloads never holds
//! a drain nor decides for the operator, and a budget that allows nothing
//! holds a surge's hand-over as it holds an eviction.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use nmo::crd::{MaintenancePhase, NodeMaintenance};
use serde_json::json;

use super::*;

/// The surge record's annotation on an owner.
const SURGE: &str = "nmo.medik8s.io/surge";

/// A Deployment of `replicas` in `default`, its pods labelled
/// `app=<name>`, gone a second after they are told to stop.
pub fn deployment(name: &str, replicas: u32) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "i"}]}}}})
}

/// Waits until `app` has `ready` Ready pods not terminating; the nodes
/// they are on.
pub async fn ready_pods(env: &impl ClusterOps, app: &str, ready: usize) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), "default");
    let started = std::time::Instant::now();
    loop {
        let list = pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .unwrap();
        let found: Vec<(String, String)> = list
            .items
            .iter()
            .filter(|p| drain_actions::is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .map(|p| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                (p.name_any(), node.unwrap_or_default())
            })
            .collect();
        if found.len() == ready {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never {ready} Ready pods of {app}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every `status.lastError` a maintenance showed while watched.
pub struct Shown {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Shown {
    pub fn start(env: &impl ClusterOps, name: &str) -> Shown {
        let nms: Api<NodeMaintenance> = Api::all(env.client().clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(nms, config).applied_objects().boxed();
            while let Some(Ok(nm)) = events.next().await {
                if let Some(e) = nm.status.and_then(|s| s.last_error) {
                    record.lock().unwrap().push(e);
                }
            }
        });
        Shown { task, seen }
    }

    pub fn stop(self) -> Vec<String> {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}

/// Finding 1: pods whose controller reference cannot be read (an
/// apiVersion no API serves, a name with a space, a name of 70,000
/// characters: the API server takes all three) stop no drain, under a
/// policy that reads workloads (`no-downtime`): the maintenance succeeds,
/// and an event names each pod that had no workload.
pub async fn unreadable_owners_hold_no_drain(env: &impl ClusterOps) {
    env.create_value(deployment("shop", 2)).await;
    let node = ready_pods(env, "shop", 2).await[0].1.clone();
    // The uid of an object that exists: a garbage collector that goes by
    // the owner's uid (nmo-sim's) keeps the pods.
    let uid = Api::<Deployment>::namespaced(env.client().clone(), "default")
        .get("shop")
        .await
        .unwrap()
        .uid()
        .unwrap();
    let long = "x".repeat(70_000);
    for (pod, api_version, name) in [
        ("odd-version", "nope.example.com/v9", "web"),
        ("odd-space", "apps/v1", "has space"),
        ("odd-long", "apps/v1", long.as_str()),
    ] {
        env.create_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": "default",
                "ownerReferences": [{"apiVersion": api_version, "kind": "ReplicaSet",
                    "name": name, "uid": uid, "controller": true}]},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "i"}]}}))
            .await;
    }
    // The real garbage collector may remove a pod whose owner it cannot
    // find: the events are asked of those still there.
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), "default");
    let mut there = Vec::new();
    for pod in ["odd-version", "odd-space"] {
        if pods.get_opt(pod).await.unwrap().is_some() {
            there.push(pod);
        }
    }
    env.create_nm_with_policy("nm-odd", &node, Some("no-downtime"))
        .await;
    env.wait_phase("nm-odd", MaintenancePhase::Succeeded).await;
    let events = env.events_for("nm-odd").await;
    for pod in there {
        assert!(
            events
                .iter()
                .any(|(_, r, m)| r == "WorkloadUnreadable" && m.contains(pod)),
            "{pod}'s unreadable owner said: {events:?}"
        );
    }
}

/// Finding 2: a surge's hand-over waits for a budget that allows nothing
/// (`maxUnavailable: 0`), the status naming the budget while the
/// replacement stands Ready beside the pod; the pod goes only once the
/// budget allows, and the Deployment ends as it was.
pub async fn a_budget_allowing_nothing_holds_a_hand_over(env: &impl ClusterOps) {
    env.create_value(deployment("solid", 1)).await;
    env.create_value(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "solid", "namespace": "default"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "solid"}}}}),
    )
    .await;
    let (first, node) = ready_pods(env, "solid", 1).await.remove(0);
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), "default");
    env.create_nm_with_policy("nm-solid", &node, Some("no-downtime"))
        .await;
    env.wait_status("nm-solid", "waiting for the budget", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("PodDisruptionBudget default/solid"))
    })
    .await;
    // Held: the replacement is Ready, and the pod is still there, not
    // leaving (no deletion cost, no deletion).
    ready_pods(env, "solid", 2).await;
    let held = pods.get(&first).await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_none());
    assert!(
        !held
            .annotations()
            .contains_key("controller.kubernetes.io/pod-deletion-cost"),
        "the pod was handed over past the budget: {:?}",
        held.annotations()
    );
    // The budget allows one: it goes.
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        env.client().clone(),
        "default",
    )
    .patch(
        "solid",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maxUnavailable": 1}})),
    )
    .await
    .unwrap();
    env.wait_phase("nm-solid", MaintenancePhase::Succeeded)
        .await;
    let d = Api::<Deployment>::namespaced(env.client().clone(), "default")
        .get("solid")
        .await
        .unwrap();
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(1));
    assert!(
        !d.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(SURGE)
    );
}

/// A tool that owns owners' annotations but not their replicas (a GitOps
/// self-heal): every surge record it sees on the Deployment `name` (on
/// every Deployment: `None`) it `rewrites` (to one claiming other replicas
/// and no surge) or removes.
pub fn annotation_owner(
    client: &kube::Client,
    name: Option<&str>,
    rewrites: bool,
) -> tokio::task::JoinHandle<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let config = match name {
        Some(n) => watcher::Config::default().fields(&format!("metadata.name={n}")),
        None => watcher::Config::default(),
    };
    tokio::spawn(async move {
        let mut events = watcher(deployments.clone(), config)
            .applied_objects()
            .boxed();
        let forged = r#"{"replicas":7,"serving":0,"surging":[]}"#;
        while let Some(Ok(d)) = events.next().await {
            let Some(record) = d.annotations().get(SURGE) else {
                continue;
            };
            if rewrites && record == forged {
                continue;
            }
            let value = if rewrites { json!(forged) } else { json!(null) };
            let patch = json!({"metadata": {"annotations": {SURGE: value}}});
            let _ = deployments
                .patch(
                    &d.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await;
        }
    })
}

/// Finding 3: the surge record rewritten or removed while a round runs
/// (by a tool that owns annotations) leaves no replica raised: the
/// operator gives back what it remembers raising, both when the drain
/// ends and when the maintenance is deleted mid-surge.
pub async fn edits_of_the_surge_record_leave_no_replica_raised(env: &impl ClusterOps) {
    for (round, rewrites) in [(0, true), (1, false)] {
        let app = format!("edited-{round}");
        env.create_value(deployment(&app, 4)).await;
        let node = ready_pods(env, &app, 4).await[0].1.clone();
        let tool = annotation_owner(env.client(), Some(&app), rewrites);
        let nm = format!("nm-edited-{round}");
        env.create_nm_with_policy(&nm, &node, Some("no-downtime"))
            .await;
        let deployments: Api<Deployment> = Api::namespaced(env.client().clone(), "default");
        if round == 0 {
            env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
        } else {
            // Deleted mid-surge: once the replicas are raised.
            wait_until("the replicas raised", Duration::from_secs(60), || async {
                deployments
                    .get(&app)
                    .await
                    .unwrap()
                    .spec
                    .and_then(|s| s.replicas)
                    > Some(4)
            })
            .await;
            env.nms()
                .delete(&nm, &DeleteParams::default())
                .await
                .unwrap();
            env.wait_gone(&nm).await;
        }
        wait_until(
            &format!("{app}'s replicas back to 4"),
            Duration::from_secs(30),
            || async {
                deployments
                    .get(&app)
                    .await
                    .unwrap()
                    .spec
                    .and_then(|s| s.replicas)
                    == Some(4)
            },
        )
        .await;
        tool.abort();
        if round == 1 {
            wait_until("the node uncordoned", Duration::from_secs(30), || async {
                env.node(&node).await.spec.and_then(|s| s.unschedulable) != Some(true)
            })
            .await;
        }
    }
}

/// Finding 4: a surge record no surge wrote (on a Deployment of 3 that it
/// claims had 1) is not what the policy reads: `single-surge` (surging
/// workloads of one replica only) evicts its pod, and its replicas are
/// never touched.
pub async fn a_forged_surge_record_is_not_read(env: &impl ClusterOps) {
    let mut d = deployment("forged", 3);
    d["metadata"]["annotations"] = json!({SURGE: r#"{"replicas":1,"serving":0,"surging":[{"pod":"default/x","uid":"u-1","maintenance":"nm-nobody"},{"pod":"default/y","uid":"u-2","maintenance":"nm-nobody"}]}"#});
    d["metadata"]["labels"] = json!({"nmo.medik8s.io/surging": "nm-nobody"});
    env.create_value(d).await;
    let pods = ready_pods(env, "forged", 3).await;
    let (pod, node) = pods[0].clone();
    let deployments: Api<Deployment> = Api::namespaced(env.client().clone(), "default");
    let generation = deployments.get("forged").await.unwrap().metadata.generation;
    env.create_nm_with_policy("nm-forged", &node, Some("single-surge"))
        .await;
    env.wait_phase("nm-forged", MaintenancePhase::Succeeded)
        .await;
    let events = env.events_for("nm-forged").await;
    assert!(
        !events
            .iter()
            .any(|(_, r, m)| r == "PodSurged" && m.contains(&pod)),
        "a Deployment of 3 read as 1: its pod {pod} surged: {events:?}"
    );
    let after = deployments.get("forged").await.unwrap();
    assert_eq!(
        (
            after.metadata.generation,
            after.spec.and_then(|s| s.replicas)
        ),
        (generation, Some(3)),
        "the forged Deployment's replicas never touched"
    );
}

/// The operator's own token (the shipped ServiceAccount, under the
/// shipped RBAC and write limits) cannot change what a workload runs nor
/// scale one no surge holds: an image patch of a pod, a template patch
/// and replicas 0 of a Deployment are refused by the API server (tried
/// as dry runs); its own annotations still go through.
pub async fn the_operators_token_changes_only_what_it_must(
    admin: &impl ClusterOps,
    operator: &kube::Client,
) {
    admin.create_value(deployment("guarded", 1)).await;
    let (pod, _) = ready_pods(admin, "guarded", 1).await.remove(0);
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let pods: Api<Pod> = Api::namespaced(operator.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(operator.clone(), "default");
    let refused = |what: &str, r: kube::Result<()>| match r {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {}
        other => panic!("{what} with the operator's token: {other:?}"),
    };
    let image = json!({"spec": {"containers": [{"name": "c", "image": "evil"}]}});
    // The API server loads a new ValidatingAdmissionPolicy a moment after
    // it is created (its policy source refreshes about once a second):
    // the limits are in force once this first refusal comes, and the
    // checks after it are decided at once.
    wait_until(
        "a pod's image patch refused with the operator's token (the write limits in force)",
        Duration::from_secs(30),
        || async {
            match pods.patch(&pod, &dry, &Patch::Strategic(&image)).await {
                Err(kube::Error::Api(e)) => e.code == 403 || e.code == 422,
                _ => false,
            }
        },
    )
    .await;
    let template = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i",
        "securityContext": {"privileged": true}}]}}}});
    refused(
        "a Deployment's template patched",
        deployments
            .patch("guarded", &dry, &Patch::Strategic(&template))
            .await
            .map(|_| ()),
    );
    refused(
        "a Deployment no surge holds scaled to 0",
        deployments
            .patch(
                "guarded",
                &dry,
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
            .map(|_| ()),
    );
    let label = json!({"metadata": {"labels": {"app": "other"}}});
    refused(
        "a pod's label changed",
        pods.patch(&pod, &dry, &Patch::Merge(&label))
            .await
            .map(|_| ()),
    );
    // What it must write still goes: its handshake annotation, a
    // deletion cost, a surge's record, label and replicas together.
    let ours = json!({"metadata": {"annotations": {"nmo.medik8s.io/eviction-requested": "2026-12-07T00:00:00Z",
        "controller.kubernetes.io/pod-deletion-cost": "-2147483648"}}});
    pods.patch(&pod, &dry, &Patch::Merge(&ours))
        .await
        .expect("the handshake's annotations");
    let surge = json!({"metadata": {"labels": {"nmo.medik8s.io/surging": "nm"},
        "annotations": {SURGE: "{}"}}, "spec": {"replicas": 2}});
    deployments
        .patch("guarded", &dry, &Patch::Merge(&surge))
        .await
        .expect("a surge's raise");
}

/// The hunter's first find, as a fixed case, first half: a surge under
/// `single-surge` (a one-replica Deployment) has raised the replicas; the
/// test then kills and starts the operator ([`a_surge_resumes_after_a_restart`]).
pub async fn a_surge_is_running(env: &impl ClusterOps) {
    env.create_value(deployment("resumed", 1)).await;
    let (_, node) = ready_pods(env, "resumed", 1).await.remove(0);
    env.create_nm_with_policy("nm-resumed", &node, Some("single-surge"))
        .await;
    let deployments: Api<Deployment> = Api::namespaced(env.client().clone(), "default");
    wait_until("the replicas raised", Duration::from_secs(60), || async {
        deployments
            .get("resumed")
            .await
            .unwrap()
            .spec
            .and_then(|s| s.replicas)
            == Some(2)
    })
    .await;
}

/// Second half: the restarted operator reads the record the surge before
/// it left (not a forged one: its count matches, its maintenance exists)
/// as the owner's replicas, resumes the surge, and gives the replica back;
/// deleting the maintenance leaves the Deployment as it was. (Before: the
/// restarted operator read 2 replicas, evicted instead, and never gave the
/// raised replica back.)
pub async fn a_surge_resumes_after_a_restart(env: &impl ClusterOps) {
    env.wait_phase("nm-resumed", MaintenancePhase::Succeeded)
        .await;
    env.nms()
        .delete("nm-resumed", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-resumed").await;
    let d = Api::<Deployment>::namespaced(env.client().clone(), "default")
        .get("resumed")
        .await
        .unwrap();
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(1));
    assert!(
        !d.metadata
            .labels
            .unwrap_or_default()
            .contains_key("nmo.medik8s.io/surging")
    );
}
