//! Contract 0.3's drain actions end to end, on either cluster (the
//! simulated one and the real control plane, `drain_actions.rs`): surge,
//! the handshake, waiting for a Job, escalation, parking, the volume wait.
//! Each takes a cluster whose operator runs [`store`]'s policies.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use nmo::crd::MaintenancePhase;
use nmo::policy::PolicyStore;
use serde_json::json;

use super::*;

/// The operator's policies for these scenarios: the embedded default,
/// `no-downtime`, `escalate` (forcing in namespace `batch` past 2 s),
/// `escalate-park` (parking after 1 s), `pool` (max-unavailable: one node
/// at a time, a parked one not counted), `single-surge` (no-downtime
/// surging only single-replica workloads) and `hostile` (the test knobs),
/// chosen by the NodeMaintenance's annotation.
pub fn store() -> (tempfile::TempDir, Arc<PolicyStore>) {
    let dir = tempfile::tempdir().unwrap();
    let built = std::path::Path::new(env!("NMO_POLICY_WASM_DIR"));
    for (name, file) in [
        ("no-downtime", "nmo_policy_no_downtime.wasm"),
        ("escalate", "nmo_policy_escalate.wasm"),
        ("escalate-park", "nmo_policy_escalate.wasm"),
        ("hostile", "nmo_policy_hostile.wasm"),
        ("pool", "nmo_policy_max_unavailable.wasm"),
        ("single-surge", "nmo_policy_no_downtime.wasm"),
    ] {
        std::fs::copy(built.join(file), dir.path().join(format!("{name}.wasm"))).unwrap();
    }
    std::fs::write(
        dir.path().join("policies.yaml"),
        "default: builtin\nsettings:\n  escalate: {namespaces: batch, deadline: 2s}\n  \
         escalate-park: {deadline: 2s, parkAfter: 1s}\n  pool: {max: '1', max-parked: '1'}\n  \
         single-surge: {maxReplicas: '1'}\n",
    )
    .unwrap();
    let engine = nmo::policy::PolicyEngine::new(nmo::policy::EngineConfig::default()).unwrap();
    let store = PolicyStore::from_dir(engine, dir.path(), None).unwrap();
    (dir, store)
}

/// nmo-sim with `workers` and the operator running [`store`]'s policies
/// (the directory is kept with it).
pub async fn sim(workers: usize) -> (tempfile::TempDir, Env) {
    let (dir, store) = store();
    (dir, Env::start_store(workers, store).await)
}

/// The real control plane with `workers` and the operator running
/// [`store`]'s policies.
pub async fn real(workers: usize) -> (tempfile::TempDir, super::real::RealEnv) {
    let (dir, store) = store();
    (
        dir,
        super::real::RealEnv::start_store(nmo_control_plane::Options::workers(workers), store)
            .await,
    )
}

/// A Deployment of one replica behind a budget that allows none down.
fn single_replica(name: &str, namespace: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec: {{terminationGracePeriodSeconds: 5, containers: [{{name: c, image: i}}]}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  minAvailable: 1
  selector: {{matchLabels: {{app: {name}}}}}
"#
    )
}

/// A Deployment of `replicas` in `default`, its pods labelled
/// `app=<name>` and gone a second after they are told to stop.
fn deployment(name: &str, replicas: u32) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec: {{terminationGracePeriodSeconds: 1, containers: [{{name: c, image: i}}]}}
"#
    )
}

/// Waits (at most `limit`) until `f` finds something, and returns it.
async fn found<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(started.elapsed() < limit, "never {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node of the one Ready, running pod labelled `app=<app>`, once
/// there is one.
async fn ready_pod_node(env: &impl ClusterOps, namespace: &str, app: &str) -> (String, String) {
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), namespace);
    found(
        &format!("a Ready pod of {app}"),
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&kube::api::ListParams::default().labels(&format!("app={app}")))
                .await
                .unwrap();
            list.items
                .iter()
                .find(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
                .map(|p| {
                    (
                        p.name_any(),
                        p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap(),
                    )
                })
        },
    )
    .await
}

/// Follows the pods labelled `app=<app>` through a watch and counts the
/// Ready ones that are not terminating at every change: the fewest seen,
/// and the history.
struct ReadyWatch {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Vec<usize>>>,
}

impl ReadyWatch {
    fn start(env: &impl ClusterOps, namespace: &str, app: &str) -> ReadyWatch {
        let pods: Api<Pod> = Api::namespaced(env.client().clone(), namespace);
        let config = watcher::Config::default().labels(&format!("app={app}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut by_uid: HashMap<String, bool> = HashMap::new();
            let mut events = watcher(pods, config).boxed();
            let mut listed = false;
            while let Some(Ok(event)) = events.next().await {
                match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let serving = is_ready(&p) && p.metadata.deletion_timestamp.is_none();
                        by_uid.insert(p.uid().unwrap_or_default(), serving);
                    }
                    watcher::Event::Delete(p) => {
                        by_uid.remove(&p.uid().unwrap_or_default());
                    }
                    watcher::Event::Init => {}
                    watcher::Event::InitDone => listed = true,
                }
                // Counted from the first complete list on.
                if !listed {
                    continue;
                }
                let count = by_uid.values().filter(|s| **s).count();
                record.lock().unwrap().push(count);
            }
        });
        ReadyWatch { task, seen }
    }

    fn stop(self) -> Vec<usize> {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}

/// Make-before-break: a `replicas: 1` Deployment behind a `minAvailable:
/// 1` budget. The default policy's eviction is refused (and would be
/// forever); `no-downtime`'s surge drains the node with a Ready replica
/// at every moment, watched from the API server, and leaves the
/// Deployment as it was.
pub async fn surge_keeps_a_single_replica_serving(env: &impl ClusterOps) {
    env.apply(&single_replica("solo", "default")).await;
    let (first, node) = ready_pod_node(env, "default", "solo").await;

    // The default policy: refused by the budget, as kubectl drain is.
    env.create_nm("nm-evict", &node).await;
    env.wait_status("nm-evict", "refused by the budget", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("disruption budget"))
    })
    .await;
    env.nms()
        .delete("nm-evict", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-evict").await;
    wait_until("the node uncordoned", Duration::from_secs(30), || async {
        env.node(&node).await.spec.and_then(|s| s.unschedulable) != Some(true)
    })
    .await;

    let watch = ReadyWatch::start(env, "default", "solo");
    env.create_nm_with_policy("nm-surge", &node, Some("no-downtime"))
        .await;
    env.wait_phase("nm-surge", MaintenancePhase::Succeeded)
        .await;
    let (now, now_on) = ready_pod_node(env, "default", "solo").await;
    let counts = watch.stop();
    assert!(
        !counts.is_empty() && counts.iter().all(|c| *c >= 1),
        "a moment without a Ready replica: {counts:?}"
    );
    assert!(
        counts.contains(&2),
        "the replacement was Ready beside the old pod: {counts:?}"
    );
    assert_ne!(now, first, "the pod was replaced");
    assert_ne!(now_on, node, "the replacement runs elsewhere");
    let d = Api::<Deployment>::namespaced(env.client().clone(), "default")
        .get("solo")
        .await
        .unwrap();
    assert_eq!(
        d.spec.as_ref().unwrap().replicas,
        Some(1),
        "replicas restored"
    );
    assert!(!d.annotations().contains_key("nmo.medik8s.io/surge"));
    assert!(!d.labels().contains_key("nmo.medik8s.io/surging"));
    assert!(
        env.events_for("nm-surge")
            .await
            .iter()
            .any(|(_, r, m)| r == "PodSurged" && m.contains(&first)),
        "{:?}",
        env.events_for("nm-surge").await
    );
}

/// The handshake: `game` answers ready at once, `beating` extends its
/// deadline with a heartbeat before answering, `mute` never answers and
/// goes when its second is up.
pub async fn the_handshake_asks_the_application_first(env: &impl ClusterOps) {
    for (name, timeout) in [("game", "10m"), ("beating", "3s"), ("mute", "1s")] {
        env.create_value(bare(
            name,
            "worker-1",
            json!({"nmo.medik8s.io/handshake": timeout}),
            5,
        ))
        .await;
    }
    env.create_nm_with_policy("nm-hand", "worker-1", Some("no-downtime"))
        .await;
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), "default");
    let annotation = |p: &Pod, k: &str| p.annotations().get(k).cloned();
    let asked = |name: &'static str| {
        let pods = pods.clone();
        async move {
            found(
                &format!("{name} asked to leave"),
                Duration::from_secs(30),
                || async {
                    pods.get_opt(name).await.unwrap().filter(|p| {
                        p.annotations()
                            .contains_key("nmo.medik8s.io/eviction-requested")
                    })
                },
            )
            .await
        }
    };
    let game = asked("game").await;
    let time = |p: &Pod, k: &str| -> k8s_openapi::jiff::Timestamp {
        annotation(p, k).unwrap().parse().unwrap()
    };
    let window = time(&game, "nmo.medik8s.io/eviction-deadline").as_second()
        - time(&game, "nmo.medik8s.io/eviction-requested").as_second();
    assert_eq!(window, 600, "ten minutes to leave");
    assert_eq!(
        annotation(&game, "nmo.medik8s.io/eviction-requester").as_deref(),
        Some("nmo/nm-hand")
    );
    // A heartbeat moves the deadline (by the policy's 30 s).
    let beating = asked("beating").await;
    let before = time(&beating, "nmo.medik8s.io/eviction-deadline");
    let beat = json!({"metadata": {"annotations": {
        "nmo.medik8s.io/eviction-heartbeat": k8s_openapi::jiff::Timestamp::now().to_string()}}});
    pods.patch("beating", &PatchParams::default(), &Patch::Merge(&beat))
        .await
        .unwrap();
    wait_until("the deadline moved", Duration::from_secs(30), || async {
        pods.get_opt("beating").await.unwrap().is_some_and(|p| {
            p.annotations()
                .get("nmo.medik8s.io/eviction-deadline")
                .and_then(|d| d.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|d| d > before)
        })
    })
    .await;
    let ready = json!({"metadata": {"annotations": {"nmo.medik8s.io/eviction-ready": "true"}}});
    for name in ["game", "beating"] {
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&ready))
            .await
            .unwrap();
    }
    // Succeeded long before game's ten minutes: its answer was heard.
    env.wait_phase("nm-hand", MaintenancePhase::Succeeded).await;
    let asked_events = env
        .events_for("nm-hand")
        .await
        .into_iter()
        .filter(|(_, r, _)| r == "EvictionRequested")
        .count();
    assert_eq!(asked_events, 3);
}

/// A Job's pod is waited for, not evicted: `annotations` make the pod
/// finish a few seconds after it is placed (kwok's ready delay, the
/// simulator's run time).
pub async fn a_jobs_pod_is_waited_for(env: &impl ClusterOps, annotations: serde_json::Value) {
    env.create_value(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "report", "namespace": "default"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": "report"}, "annotations": annotations},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "report"}]}}}}))
    .await;
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), "default");
    let pod = found("the Job's pod placed", Duration::from_secs(30), || async {
        pods.list(&kube::api::ListParams::default().labels("app=report"))
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
    })
    .await;
    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone());
    assert_ne!(
        phase(&pod).as_deref(),
        Some("Succeeded"),
        "the Job's pod is still to run when the maintenance starts"
    );
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let shown = super::promises::Shown::start(env, "nm-job");
    env.create_nm_with_policy("nm-job", &node, Some("no-downtime"))
        .await;
    env.wait_phase("nm-job", MaintenancePhase::Succeeded).await;
    // The wait's reason was in the status while the drain waited.
    let shown = shown.stop();
    let waiting = format!("waiting for pod default/{} to complete (", pod.name_any());
    assert!(
        shown.iter().any(|e| e.contains(&waiting)),
        "the wait's reason never shown: {shown:?}"
    );
    // Not evicted: the same pod is there, finished.
    let after = pods.get_opt(&pod.name_any()).await.unwrap();
    assert_eq!(
        after.as_ref().and_then(|p| p.uid()),
        pod.uid(),
        "the Job's pod was removed"
    );
    assert_eq!(after.as_ref().and_then(phase).as_deref(), Some("Succeeded"));
}

/// Escalation where allowed: a pod in `batch` that its budget never lets
/// go is deleted once pending past the 2 s deadline, and the event names
/// the pod and the rule.
pub async fn escalation_deletes_where_the_policy_allows(env: &impl ClusterOps) {
    env.create_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "batch"}}),
    )
    .await;
    env.apply(&single_replica("stubborn", "batch")).await;
    let (pod, node) = ready_pod_node(env, "batch", "stubborn").await;
    env.create_nm_with_policy("nm-esc", &node, Some("escalate"))
        .await;
    env.wait_phase("nm-esc", MaintenancePhase::Succeeded).await;
    let events = env.events_for("nm-esc").await;
    assert!(
        events.iter().any(|(t, r, m)| t == "Warning"
            && r == "ForcedPodRemoval"
            && m.contains(&format!("batch/{pod}"))
            && m.contains("bypassing PodDisruptionBudgets")
            && m.contains("escalate: pending")),
        "{events:?}"
    );
}

/// An undrainable node is parked: cordoned, status, event and metric say
/// why, no failure; deleting the maintenance restores the node. `parked`
/// reads the operator's `nmo_node_maintenances{phase="Parked"}` where the
/// test can (the operator in its process), `None` elsewhere.
pub async fn an_undrainable_node_is_parked(
    env: &impl ClusterOps,
    policy_dir: &std::path::Path,
    parked_gauge: impl Fn() -> Option<f64>,
) {
    env.apply(&single_replica("held", "default")).await;
    let (_, node) = ready_pod_node(env, "default", "held").await;
    env.create_nm_with_policy("nm-park", &node, Some("escalate-park"))
        .await;
    let s = env
        .wait_status("nm-park", "parked", |s| s.parked.is_some())
        .await;
    let parked = s.parked.unwrap();
    assert!(parked.reason.contains("not drained after 1s"), "{parked:?}");
    assert!(parked.since.is_some() && parked.recheck_at.is_some());
    assert_eq!(s.phase, Some(MaintenancePhase::Running));
    // `kubectl nm status` says Parked and why, not Running.
    let tmp = tempfile::tempdir().unwrap();
    let plugin = tmp.path().join("kubectl-nm");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nmo"), &plugin).unwrap();
    std::fs::write(tmp.path().join("kubeconfig"), env.kubeconfig()).unwrap();
    let out = std::process::Command::new(&plugin)
        .arg("status")
        .env("KUBECONFIG", tmp.path().join("kubeconfig"))
        .output()
        .unwrap();
    let printed = super::printed(&out);
    let line = printed
        .lines()
        .find(|l| l.starts_with("nm-park "))
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(
        line.contains(" Parked ")
            && line.contains("parked: ")
            && line.contains("not drained after 1s"),
        "{line}"
    );
    // So does the fleet's plan.
    let out = std::process::Command::new(&plugin)
        .args(["plan", "--all", "--policy-dir"])
        .arg(policy_dir)
        .env("KUBECONFIG", tmp.path().join("kubeconfig"))
        .output()
        .unwrap();
    let printed = super::printed(&out);
    assert!(
        printed.contains("parked: ") && printed.contains("not drained after 1s"),
        "{printed}"
    );
    // Its budget allows none: the plan says so rather than a bare estimate.
    assert!(
        printed.contains("Held:        default/held (1 eviction(s)) allow(s) no eviction now"),
        "{printed}"
    );
    let n: Node = env.node(&node).await;
    assert_eq!(n.spec.and_then(|s| s.unschedulable), Some(true));
    if let Some(count) = parked_gauge() {
        assert_eq!(count, 1.0, "nmo_node_maintenances{{phase=\"Parked\"}}");
    }
    wait_until(
        "a ParkedMaintenance event",
        Duration::from_secs(30),
        || async {
            env.events_for("nm-park")
                .await
                .iter()
                .any(|(t, r, _)| t == "Warning" && r == "ParkedMaintenance")
        },
    )
    .await;
    // The fleet moves on: one node at a time, but a parked one set aside.
    let other = ["worker-1", "worker-2"]
        .into_iter()
        .find(|n| *n != node)
        .unwrap();
    env.create_nm_with_policy("nm-next", other, Some("pool"))
        .await;
    env.wait_phase("nm-next", MaintenancePhase::Succeeded).await;
    env.nms()
        .delete("nm-park", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-park").await;
    assert_ne!(
        env.node(&node).await.spec.and_then(|s| s.unschedulable),
        Some(true),
        "restored"
    );
}

/// A VolumeAttachment of `node` (no CSI driver here: it stays until
/// deleted).
async fn attach(env: &impl ClusterOps, name: &str, node: &str) {
    env.create_value(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": name},
        "spec": {"attacher": "csi.example.com", "nodeName": node,
                 "source": {"persistentVolumeName": format!("pv-{name}")}}}),
    )
    .await;
}

/// A maintenance decided by the `hostile` test policy, its knobs in
/// `reason` (`tune:volumes=60000`, ...).
pub async fn hostile_nm(env: &impl ClusterOps, name: &str, node: &str, reason: &str) {
    let mut nm = nmo::crd::NodeMaintenance::new(
        name,
        nmo::crd::NodeMaintenanceSpec {
            node_name: node.into(),
            reason: Some(reason.into()),
        },
    );
    nm.metadata.annotations = Some(
        [(
            nmo::policy::POLICY_ANNOTATION.to_owned(),
            "hostile".to_owned(),
        )]
        .into(),
    );
    env.nms()
        .create(&kube::api::PostParams::default(), &nm)
        .await
        .unwrap();
}

/// The volume wait: Succeeded only once the node's VolumeAttachment is
/// gone, the status saying what it waits for meanwhile.
pub async fn succeeded_waits_for_volumes_to_detach(env: &impl ClusterOps) {
    attach(env, "csi-data-1", "worker-1").await;
    hostile_nm(env, "nm-vol", "worker-1", "tune:volumes=60000").await;
    let s = env
        .wait_status("nm-vol", "waiting for the volume", |s| {
            s.last_error.as_deref().is_some_and(|e| {
                e.contains("VolumeAttachment(s) of node worker-1 to detach: csi-data-1")
            })
        })
        .await;
    assert_ne!(s.phase, Some(MaintenancePhase::Succeeded));
    let vas: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = Api::all(env.client().clone());
    vas.delete("csi-data-1", &DeleteParams::default())
        .await
        .unwrap();
    let nm = env.wait_phase("nm-vol", MaintenancePhase::Succeeded).await;
    assert_eq!(nm.status.unwrap().last_error, None);
}

/// A volume wait of a day for an attachment that never goes (a stuck CSI
/// detach): deleting the maintenance ends the wait at once, and the node
/// is restored.
pub async fn a_volume_wait_ends_when_the_maintenance_is_deleted(env: &impl ClusterOps) {
    attach(env, "csi-stuck-1", "worker-1").await;
    hostile_nm(env, "nm-vol-stuck", "worker-1", "tune:volumes=86400000").await;
    env.wait_status("nm-vol-stuck", "waiting for the volume", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("to detach: csi-stuck-1"))
    })
    .await;
    let deleted = std::time::Instant::now();
    env.nms()
        .delete("nm-vol-stuck", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-vol-stuck").await;
    eprintln!(
        "the volume wait ended and the maintenance went {:.2} s after its deletion",
        deleted.elapsed().as_secs_f64()
    );
    let node = env.node("worker-1").await;
    assert_ne!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "worker-1 restored"
    );
}

/// A surge against a tool that sets the replicas back as soon as they rise
/// (a GitOps self-heal, an HPA syncing before the replacement is Ready):
/// the surge falls back to eviction at once, as documented; the
/// maintenance succeeds, the Deployment ends at the replicas the tool
/// wants, with no surge record left on it. (Before: the drain waited for a
/// Ready replacement that the tool kept removing.)
pub async fn a_surge_the_replicas_are_set_back_on_falls_back(env: &impl ClusterOps) {
    env.apply(&deployment("selfheal", 1)).await;
    let (_, node) = ready_pod_node(env, "default", "selfheal").await;
    let deployments: Api<Deployment> = Api::namespaced(env.client().clone(), "default");
    // The tool: replicas back to 1 whenever they are not.
    let resets = Arc::new(Mutex::new(0usize));
    let tool = {
        let (deployments, resets) = (deployments.clone(), resets.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=selfheal");
            let mut events = watcher(deployments.clone(), config)
                .applied_objects()
                .boxed();
            while let Some(Ok(d)) = events.next().await {
                if d.spec.as_ref().and_then(|s| s.replicas) != Some(1) {
                    let back = json!({"spec": {"replicas": 1}});
                    if deployments
                        .patch("selfheal", &PatchParams::default(), &Patch::Merge(&back))
                        .await
                        .is_ok()
                    {
                        *resets.lock().unwrap() += 1;
                    }
                }
            }
        })
    };
    env.create_nm_with_policy("nm-selfheal", &node, Some("no-downtime"))
        .await;
    env.wait_phase("nm-selfheal", MaintenancePhase::Succeeded)
        .await;
    tool.abort();
    let d = deployments.get("selfheal").await.unwrap();
    assert_eq!(d.spec.as_ref().and_then(|s| s.replicas), Some(1));
    assert!(
        !d.annotations().contains_key("nmo.medik8s.io/surge"),
        "the surge record is gone: {:?}",
        d.annotations()
    );
    assert!(
        *resets.lock().unwrap() >= 1,
        "the surge raised the replicas and the tool set them back"
    );
}

/// Contract 0.4's `workload`, read by the operator: `single-surge`
/// (no-downtime with `maxReplicas: 1`) surges the pod of a one-replica
/// Deployment and evicts those of a four-replica one on the same node,
/// whose replicas are never touched.
pub async fn only_single_replica_workloads_surge(env: &impl ClusterOps) {
    env.apply(&single_replica("solo", "default")).await;
    let (first, node) = ready_pod_node(env, "default", "solo").await;
    env.apply(&deployment("wide", 4)).await;
    let pods: Api<Pod> = Api::namespaced(env.client().clone(), "default");
    let on_node = found(
        "four Ready pods of wide",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&kube::api::ListParams::default().labels("app=wide"))
                .await
                .unwrap();
            let ready: Vec<&Pod> = list.items.iter().filter(|p| is_ready(p)).collect();
            (ready.len() == 4).then(|| {
                ready
                    .iter()
                    .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node))
                    .map(|p| p.name_any())
                    .collect::<Vec<_>>()
            })
        },
    )
    .await;
    assert!(
        !on_node.is_empty(),
        "the test needs a pod of wide beside solo's on {node}"
    );
    let deployments = Api::<Deployment>::namespaced(env.client().clone(), "default");
    let generation = deployments.get("wide").await.unwrap().metadata.generation;

    env.create_nm_with_policy("nm-single", &node, Some("single-surge"))
        .await;
    env.wait_phase("nm-single", MaintenancePhase::Succeeded)
        .await;
    let events = env.events_for("nm-single").await;
    let surged = |pod: &str| {
        events
            .iter()
            .any(|(_, r, m)| r == "PodSurged" && m.contains(pod))
    };
    assert!(surged(&first), "solo's pod surged: {events:?}");
    for pod in &on_node {
        assert!(
            !surged(pod),
            "{pod} of wide evicted, not surged: {events:?}"
        );
    }
    let wide = deployments.get("wide").await.unwrap();
    assert_eq!(
        (wide.metadata.generation, wide.spec.and_then(|s| s.replicas)),
        (generation, Some(4)),
        "wide's replicas never raised"
    );
}
