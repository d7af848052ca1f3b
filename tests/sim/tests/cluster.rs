//! The cluster behind the API: events in both API groups, garbage
//! collection, workload controllers rescheduling evicted pods, server-side
//! apply.

use std::time::{Duration, Instant};

use nmo_sim::{SimCluster, SimOptions};
use serde_json::{Value, json};

async fn cluster(nodes: usize) -> SimCluster {
    let c = SimCluster::start(SimOptions {
        time_scale: 20.0,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    for i in 1..=nodes {
        c.add_node(&format!("worker-{i}")).unwrap();
    }
    c
}

async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pods_of(c: &SimCluster, prefix: &str) -> Vec<Value> {
    c.list("v1", "Pod")
        .unwrap()
        .into_iter()
        .filter(|p| p["metadata"]["name"].as_str().unwrap().starts_with(prefix))
        .collect()
}

fn ready(p: &Value) -> bool {
    nmo_sim::cluster::is_ready(p) && p["metadata"]["deletionTimestamp"].is_null()
}

async fn kubectl(c: &SimCluster, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    c.write_kubeconfig(&kc).unwrap();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_in_either_group_are_one_store() {
    let c = cluster(1).await;
    let pod = c
        .create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                       "spec": {"containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
    let regarding = json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "default", "uid": pod["metadata"]["uid"]});
    c.create(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "p.1", "namespace": "default"},
        "eventTime": "2026-11-29T10:00:00.000000Z", "reportingController": "NodeMaintenance",
        "reportingInstance": "nmo", "action": "Begin", "reason": "BeginMaintenance",
        "note": "Begin a node maintenance", "type": "Normal", "regarding": regarding,
    }))
    .unwrap();
    let core = c.get("v1", "Event", Some("default"), "p.1").unwrap();
    assert_eq!(core["message"], "Begin a node maintenance");
    assert_eq!(core["involvedObject"]["name"], "p");
    assert_eq!(core["source"]["component"], "NodeMaintenance");
    c.create(json!({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "p.2", "namespace": "default"},
        "involvedObject": regarding, "reason": "UncordonNode", "message": "Uncordon a node",
        "type": "Normal", "source": {"component": "NodeMaintenance"},
        "firstTimestamp": "2026-11-29T10:00:01Z", "lastTimestamp": "2026-11-29T10:00:01Z", "count": 1,
    }))
    .unwrap();
    let new = c
        .get("events.k8s.io/v1", "Event", Some("default"), "p.2")
        .unwrap();
    assert_eq!(new["note"], "Uncordon a node");
    assert_eq!(new["regarding"]["name"], "p");
    // kubectl describe finds both by field selector on involvedObject.
    let describe = kubectl(&c, &["describe", "pod", "p"]).await;
    assert!(
        describe.contains("BeginMaintenance") && describe.contains("Begin a node maintenance"),
        "{describe}"
    );
    assert!(
        describe.contains("UncordonNode") && describe.contains("NodeMaintenance"),
        "{describe}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_owner_collects_its_dependents() {
    let c = cluster(2).await;
    c.apply_yaml("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: default\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: w\n        image: w\n").unwrap();
    eventually("two pods", || {
        (pods_of(&c, "web-").iter().filter(|p| ready(p)).count() == 2).then_some(())
    })
    .await;
    assert_eq!(c.list("apps/v1", "ReplicaSet").unwrap().len(), 1);
    kubectl(&c, &["delete", "deployment", "web"]).await;
    eventually("replica set collected", || {
        c.list("apps/v1", "ReplicaSet")
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    eventually("pods collected", || {
        pods_of(&c, "web-").is_empty().then_some(())
    })
    .await;

    // An object owned by a Node goes with the node.
    let node = c.get("v1", "Node", None, "worker-2").unwrap();
    c.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned", "namespace": "default",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "worker-2", "uid": node["metadata"]["uid"]}]}}))
        .unwrap();
    kubectl(&c, &["delete", "node", "worker-2"]).await;
    eventually("configmap collected", || {
        c.get("v1", "ConfigMap", Some("default"), "owned")
            .is_err()
            .then_some(())
    })
    .await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_keeps_only_its_daemonset_pod_and_workloads_move() {
    let c = cluster(3).await;
    c.apply_yaml(concat!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: db\n  namespace: default\nspec:\n  replicas: 3\n  selector:\n    matchLabels: {app: db}\n  template:\n    metadata:\n      labels: {app: db}\n    spec:\n      containers:\n      - name: db\n        image: db\n",
        "---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: agent\n  namespace: default\nspec:\n  selector:\n    matchLabels: {app: agent}\n  template:\n    metadata:\n      labels: {app: agent}\n    spec:\n      containers:\n      - name: a\n        image: a\n",
        "---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: batch\n  namespace: default\nspec:\n  completions: 2\n  parallelism: 1\n  template:\n    metadata:\n      annotations: {sim.nmo.medik8s.io/run-seconds: \"10\"}\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: j\n        image: j\n",
    ))
    .unwrap();
    // OrderedReady: db-0, then db-1, then db-2.
    eventually("db pods", || {
        (pods_of(&c, "db-").iter().filter(|p| ready(p)).count() == 3).then_some(())
    })
    .await;
    eventually("agents", || {
        (pods_of(&c, "agent-").iter().filter(|p| ready(p)).count() == 3).then_some(())
    })
    .await;
    // The job runs two pods one after the other, then completes.
    eventually("job complete", || {
        let j = c.get("batch/v1", "Job", Some("default"), "batch").unwrap();
        (j["status"]["succeeded"] == 2).then_some(())
    })
    .await;

    kubectl(
        &c,
        &[
            "drain",
            "worker-1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
            "--timeout=60s",
        ],
    )
    .await;
    let on_node: Vec<String> = c
        .list("v1", "Pod")
        .unwrap()
        .into_iter()
        .filter(|p| p["spec"]["nodeName"] == "worker-1" && p["status"]["phase"] != "Succeeded")
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(on_node.len(), 1, "{on_node:?}");
    assert!(on_node[0].starts_with("agent-"));
    // The StatefulSet pod came back, on another node, with the same name.
    eventually("db back", || {
        let db = pods_of(&c, "db-");
        (db.iter().filter(|p| ready(p)).count() == 3
            && db.iter().all(|p| p["spec"]["nodeName"] != "worker-1"))
        .then_some(())
    })
    .await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_creates_and_updates() {
    let c = cluster(1).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cm.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: default\ndata:\n  a: \"1\"\n").unwrap();
    let out = kubectl(
        &c,
        &["apply", "--server-side", "-f", file.to_str().unwrap()],
    )
    .await;
    assert!(out.contains("serverside-applied"), "{out}");
    std::fs::write(&file, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: default\ndata:\n  a: \"2\"\n  b: \"3\"\n").unwrap();
    kubectl(
        &c,
        &["apply", "--server-side", "-f", file.to_str().unwrap()],
    )
    .await;
    let cm = c.get("v1", "ConfigMap", Some("default"), "ssa").unwrap();
    assert_eq!(cm["data"], json!({"a": "2", "b": "3"}));
    c.stop().await;
}

/// A Node created through the API joins as a kubelet would register it
/// (Ready, nodeInfo, capacity); one marked as having no kubelet stays
/// NotReady and runs nothing: `kubectl apply` of a bare Node, as a user
/// would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_made_through_the_api_join_unless_they_have_no_kubelet() {
    let c = cluster(0).await;
    c.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "joined", "labels": {"kubernetes.io/hostname": "joined"}}}))
        .unwrap();
    c.create(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "dark",
        "annotations": {"sim.nmo.medik8s.io/no-kubelet": "true"}}}),
    )
    .unwrap();
    let joined = eventually("the node Ready", || {
        let n = c.get("v1", "Node", None, "joined").ok()?;
        (n["status"]["conditions"][0]["status"] == "True").then_some(n)
    })
    .await;
    // Defaulted, and registered as a kubelet does.
    assert_eq!(joined["spec"], json!({}));
    assert_eq!(joined["status"]["nodeInfo"]["kubeletVersion"], "v1.32.0");
    assert!(joined["status"]["allocatable"]["pods"].is_string());
    let dark = eventually("the dark node NotReady", || {
        let n = c.get("v1", "Node", None, "dark").ok()?;
        (n["status"]["conditions"][0]["status"] == "Unknown").then_some(n)
    })
    .await;
    assert_eq!(
        dark["status"]["conditions"][0]["reason"],
        "NodeStatusNeverUpdated"
    );
    let out = kubectl(&c, &["get", "nodes"]).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("joined") && l.contains(" Ready")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("dark") && l.contains("NotReady")),
        "{out}"
    );

    // The scheduler places pods on the joined node only; a pod bound to the
    // dark node by name never starts.
    c.apply_yaml("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 4\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: nginx}]}\n").unwrap();
    c.create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pinned", "namespace": "default"},
        "spec": {"nodeName": "dark", "containers": [{"name": "c", "image": "busybox"}]}}))
        .unwrap();
    eventually("four web pods running", || {
        let pods = pods_of(&c, "web-");
        (pods.len() == 4 && pods.iter().all(ready)).then_some(())
    })
    .await;
    assert!(
        pods_of(&c, "web-")
            .iter()
            .all(|p| p["spec"]["nodeName"] == "joined")
    );
    let pinned = c.get("v1", "Pod", Some("default"), "pinned").unwrap();
    assert_eq!(pinned["status"]["phase"], "Pending");
    c.stop().await;
}

/// Required node affinity is honoured; a pod that fits nowhere stays
/// Pending with a FailedScheduling event, as the real scheduler leaves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_node_affinity_is_honoured_and_a_pod_that_fits_nowhere_waits() {
    let c = cluster(3).await;
    let affinity = |values: Value| {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": values}]}]}}})
    };
    c.create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "picky", "namespace": "default"},
        "spec": {"affinity": affinity(json!(["worker-3"])), "containers": [{"name": "c", "image": "busybox"}]}}))
        .unwrap();
    c.create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "homeless", "namespace": "default"},
        "spec": {"affinity": affinity(json!(["worker-9"])), "containers": [{"name": "c", "image": "busybox"}]}}))
        .unwrap();
    eventually("picky on worker-3", || {
        let p = c.get("v1", "Pod", Some("default"), "picky").ok()?;
        (p["spec"]["nodeName"] == "worker-3").then_some(())
    })
    .await;
    let event = eventually("a FailedScheduling event", || {
        c.list("v1", "Event").ok()?.into_iter().find(|e| {
            e["reason"] == "FailedScheduling" && e["involvedObject"]["name"] == "homeless"
        })
    })
    .await;
    assert_eq!(event["type"], "Warning");
    assert_eq!(
        event["message"],
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    );
    let homeless = c.get("v1", "Pod", Some("default"), "homeless").unwrap();
    assert_eq!(homeless["status"]["phase"], "Pending");
    assert!(homeless["spec"]["nodeName"].is_null());
    assert_eq!(
        homeless["status"]["conditions"][0]["reason"],
        "Unschedulable"
    );
    c.stop().await;
}

/// Termination as a kubelet does it: a pod ends when its process exits
/// after SIGTERM (its shutdown time) or when its grace period runs out
/// (a process that ignores SIGTERM is killed then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_stop_after_sigterm_or_when_their_grace_period_runs_out() {
    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    c.add_node("worker-1").unwrap();
    let pod = |name: &str, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"nodeName": "worker-1", "terminationGracePeriodSeconds": 60,
                     "containers": [{"name": "app", "image": "x"}]}})
    };
    c.create(pod("quick", json!({}))).unwrap();
    c.create(pod(
        "stubborn",
        json!({"sim.nmo.medik8s.io/ignore-sigterm": "true"}),
    ))
    .unwrap();
    c.create(pod(
        "slow",
        json!({"sim.nmo.medik8s.io/shutdown-seconds": "20"}),
    ))
    .unwrap();
    eventually("all running", || {
        (pods_of(&c, "")
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
            == 3)
            .then_some(())
    })
    .await;
    for name in ["quick", "stubborn", "slow"] {
        c.delete("v1", "Pod", Some("default"), name).unwrap();
    }
    let present = |name: &str| c.get("v1", "Pod", Some("default"), name).is_ok();
    // Quick: gone in its default half second of shutdown.
    eventually("quick gone", || (!present("quick")).then_some(())).await;
    assert!(present("stubborn") && present("slow"));
    c.advance(Duration::from_secs(25));
    eventually("slow gone after its 20 s", || {
        (!present("slow")).then_some(())
    })
    .await;
    assert!(
        present("stubborn"),
        "ignores SIGTERM: stays for its grace period"
    );
    c.advance(Duration::from_secs(20));
    assert!(present("stubborn"), "45 s of 60");
    c.advance(Duration::from_secs(20));
    eventually("stubborn killed at 60 s", || {
        (!present("stubborn")).then_some(())
    })
    .await;
    c.stop().await;
}
