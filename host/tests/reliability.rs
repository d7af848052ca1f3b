//! The reliability suite: the real operator binary killed with SIGKILL at
//! random points, API faults, hostile policies through the operator, and
//! bad NodeMaintenances. Each test prints `N tried, N held`.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};
use serde_json::json;

/// A small deterministic generator (no dependency, same points every run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The real `nmo` binary against the simulated cluster.
fn spawn_operator(kubeconfig: &Path, work: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args([
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--webhook-bind-address=0",
            "--zap-log-level=error",
        ])
        .arg(format!(
            "--policy-dir={}",
            work.join("no-policies").display()
        ))
        .arg(format!(
            "--policy-cache-dir={}",
            work.join("cache").display()
        ))
        .env("KUBECONFIG", kubeconfig)
        .env("LEASE_NAMESPACE", "medik8s-leases")
        .env("HOSTNAME", "nmo-reliability")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nmo runs")
}

fn sigkill(child: &mut Child) {
    // Child::kill is SIGKILL on Unix: no destructor, no graceful shutdown.
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The uids of the pods the default policy skips (DaemonSet and mirror).
async fn skipped_pods(env_client: &kube::Client) -> BTreeMap<String, String> {
    Api::<Pod>::all(env_client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            p.annotations().contains_key("kubernetes.io/config.mirror")
                || p.owner_references().iter().any(|o| o.kind == "DaemonSet")
        })
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect()
}

fn restored(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
        && !taint_keys(node)
            .iter()
            .any(|k| k == "medik8s.io/drain" || k == "node.kubernetes.io/unschedulable")
}

/// Kill -9 the operator at random points of a maintenance (mid-drain and
/// mid-deletion), 20 times, restarting it each time: every maintenance
/// converges, no event is repeated, no node is left cordoned once its
/// NodeMaintenance is gone, and no pod the policy skips is ever evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_points_twenty_times() {
    const ROUNDS: usize = 20;
    let (cluster, client) = start_cluster(3).await;
    cluster
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "medik8s-leases"}}))
        .unwrap();
    cluster
        .apply_yaml(&WORKLOAD.replace("replicas: 3", "replicas: 6"))
        .unwrap();
    for n in 1..=3 {
        let node = format!("worker-{n}");
        let uid = Api::<Node>::all(client.clone())
            .get(&node)
            .await
            .unwrap()
            .uid()
            .unwrap();
        cluster.create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": format!("etcd-{node}"), "namespace": "kube-system",
            "annotations": {"kubernetes.io/config.mirror": "abc"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "etcd", "image": "etcd"}]}})).unwrap();
    }
    // A human took worker-3 out for bad hardware before any maintenance:
    // every restore of it, killed anywhere, leaves it so.
    cordon_by_hand(&client, "worker-3").await;
    // The DaemonSet's pods are placed by the simulated controllers in
    // their own time: waited for, with a deadline, on a busy machine too.
    wait_until(
        "six pods the policy skips",
        Duration::from_secs(60),
        || async { skipped_pods(&client).await.len() == 6 },
    )
    .await;
    let skipped = skipped_pods(&client).await;
    assert_eq!(skipped.len(), 6, "{skipped:?}");

    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let mut rng = Lcg(0x6e6d6f);
    let mut operator = spawn_operator(&kubeconfig, work.path());
    let mut held = 0;
    for round in 0..ROUNDS {
        let name = format!("nm-{round}");
        let node = format!("worker-{}", round % 3 + 1);
        let nm = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                node_name: node.clone(),
                reason: Some("reliability".into()),
            },
        );
        nms.create(&PostParams::default(), &nm).await.unwrap();
        // Somewhere in the first 1.5 s: before the finalizer, mid-drain
        // (the PDB lets one pod go at a time), or after success.
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        sigkill(&mut operator);
        operator = spawn_operator(&kubeconfig, work.path());
        wait_succeeded(&nms, &name, Duration::from_secs(60)).await;

        nms.delete(&name, &DeleteParams::default()).await.unwrap();
        // Somewhere in the restore: before or after the node is uncordoned,
        // before or after the finalizer goes.
        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        sigkill(&mut operator);
        operator = spawn_operator(&kubeconfig, work.path());
        wait_until(&format!("{name} gone"), Duration::from_secs(30), || async {
            nms.get_opt(&name).await.unwrap().is_none()
        })
        .await;

        let n = nodes.get(&node).await.unwrap();
        if node == "worker-3" {
            if let Err(e) = as_the_human_left_it(&n) {
                panic!("round {round}: {node} not as the human left it: {e}");
            }
        } else {
            assert!(
                restored(&n),
                "round {round}: {node} left in maintenance: {:?}",
                n.spec
            );
        }
        let events = Api::<k8s_openapi::api::core::v1::Event>::all(client.clone())
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .unwrap()
            .items;
        for e in &events {
            assert_eq!(
                e.count.unwrap_or(1),
                1,
                "round {round}: event {:?} repeated",
                e.reason
            );
        }
        let mut reasons: Vec<_> = events.iter().filter_map(|e| e.reason.clone()).collect();
        let total = reasons.len();
        reasons.sort();
        reasons.dedup();
        assert_eq!(
            reasons.len(),
            total,
            "round {round}: an event repeated: {reasons:?}"
        );
        assert_eq!(
            skipped_pods(&client).await,
            skipped,
            "round {round}: a pod the policy skips was removed"
        );
        held += 1;
    }
    sigkill(&mut operator);
    println!("kill -9 at random points: {ROUNDS} tried, {held} held");
    cluster.stop().await;
}

async fn delete_retrying(nms: &Api<NodeMaintenance>, name: &str) {
    while let Err(e) = nms.delete(name, &DeleteParams::default()).await {
        if matches!(&e, kube::Error::Api(s) if s.code == 404) {
            break;
        }
    }
}

/// 10 % of requests fail with 500, 10 % of writes with 409, every request
/// takes 200 ms more, watches drop every 2 s: maintenances still converge,
/// both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenances_converge_both_ways_under_api_faults() {
    const NMS: usize = 3;
    let env = Env::start(4).await;
    env.cluster
        .apply_yaml(&WORKLOAD.replace("replicas: 3", "replicas: 6"))
        .unwrap();
    // Six replicas, an agent on each of the four nodes, the bare and the
    // scratch pods.
    env.wait_ready_pods(6 + 4 + 2).await;
    let skipped = skipped_pods(&env.client).await;
    let rule = |verb: Option<&str>, code| nmo_sim::FaultRule {
        verb: verb.map(str::to_owned),
        resource: None,
        rate: 0.10,
        code,
    };
    env.cluster.set_faults(|f| {
        f.rules = vec![
            rule(None, 500),
            rule(Some("patch"), 409),
            rule(Some("update"), 409),
        ];
        f.latency = Duration::from_millis(200);
        f.drop_watches_after = Some(Duration::from_secs(2));
    });
    let nms = env.nms();
    for i in 1..=NMS {
        create_nm_retrying(&nms, &format!("nm-{i}"), &format!("worker-{i}")).await;
    }
    let mut held = 0;
    for i in 1..=NMS {
        let name = format!("nm-{i}");
        wait_succeeded(&nms, &name, Duration::from_secs(120)).await;
        delete_retrying(&nms, &name).await;
    }
    for i in 1..=NMS {
        let name = format!("nm-{i}");
        wait_until(
            &format!("{name} gone"),
            Duration::from_secs(120),
            || async { matches!(nms.get_opt(&name).await, Ok(None)) },
        )
        .await;
        let node = loop {
            if let Ok(n) = Api::<Node>::all(env.client.clone())
                .get(&format!("worker-{i}"))
                .await
            {
                break n;
            }
        };
        assert!(restored(&node), "worker-{i} left in maintenance");
        held += 1;
    }
    env.cluster.set_faults(|f| *f = Default::default());
    assert_eq!(skipped_pods(&env.client).await, skipped);
    println!("API faults (10% 500/409, 200 ms, dropped watches): {NMS} tried, {held} held");
    env.stop().await;
}

/// A policy directory whose default is the hostile policy, a cluster of
/// `nodes` workers with the workload, and the operator running that
/// directory. The temporary directory must outlive the test.
async fn hostile_env(
    nodes: usize,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::sync::Arc<nmo::policy::PolicyStore>,
    Env,
) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("policies");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("hostile.wasm"), built_policy("hostile")).unwrap();
    std::fs::write(dir.join("policies.yaml"), "default: hostile\n").unwrap();
    let engine = nmo::policy::PolicyEngine::new(Default::default()).unwrap();
    let store = nmo::policy::PolicyStore::from_dir(engine, &dir, None).unwrap();
    let env = Env::start_store(nodes, store.clone()).await;
    env.cluster.apply_yaml(WORKLOAD).unwrap();
    (root, dir, store, env)
}

/// Ten hostile policies through the operator: it never crashes, never acts
/// on a bad answer, and says what went wrong in `lastError` and a
/// `PolicyError` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_hostile_policies_through_the_operator() {
    let (_root, dir, store, env) = hostile_env(2).await;
    env.wait_ready_pods(3 + 2 + 2).await;
    let on_node = |env: &Env| {
        let client = env.client.clone();
        async move {
            let mut v: Vec<String> = Api::<Pod>::all(client)
                .list(&ListParams::default().fields("spec.nodeName=worker-1"))
                .await
                .unwrap()
                .items
                .iter()
                .map(|p| p.uid().unwrap())
                .collect();
            v.sort();
            v
        }
    };
    let before = on_node(&env).await;
    assert!(before.len() >= 4, "worker-1 has a workload");
    let given = format!("but only {} pod(s) were given", before.len());

    // The hostile policy misbehaves as the maintenance's reason says.
    let cases: [(&str, &str); 7] = [
        ("trap", "trapped in plan-drain"),
        ("loop", "ran past its deadline"),
        ("memory-bomb", "exceeded its memory limit"),
        (
            "huge-reason",
            "larger than the 4194304 bytes the host accepts",
        ),
        // As many as the workload put on the node (the scheduler may put
        // one more there than the four its replicas spread to).
        ("unknown-pod", &*given),
        ("evict-everything", "gave an invalid answer in plan-drain"),
        ("panic-on-bare", "cannot handle pod without a controller"),
    ];
    let mut tried = 0;
    let mut held = 0;
    for (i, (reason, says)) in cases.iter().enumerate() {
        tried += 1;
        let name = format!("hostile-{i}");
        env.create_nm_with_reason(&name, "worker-1", reason).await;
        let s = env
            .wait_status(&name, "report the policy error", |s| s.last_error.is_some())
            .await;
        let err = s.last_error.unwrap();
        assert!(err.contains(says), "{reason}: {err}");
        // Events are written by their own task, after the status: wait
        // for it (a busy machine writes it later).
        wait_until(
            &format!("{reason}: a PolicyError event"),
            Duration::from_secs(30),
            || async {
                env.events_for(&name)
                    .await
                    .iter()
                    .any(|(t, r, m)| t == "Warning" && r == "PolicyError" && m.contains(says))
            },
        )
        .await;
        assert_eq!(on_node(&env).await, before, "{reason}: nothing acted on");
        assert!(!env.controller.is_finished(), "{reason}: the operator runs");
        env.nms()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        env.wait_gone(&name).await;
        assert!(restored(&env.node("worker-1").await), "{reason}");
        held += 1;
    }

    // Slow but within the deadline: an ordinary maintenance.
    tried += 1;
    env.create_nm_with_reason("slow", "worker-2", "slow").await;
    env.wait_phase("slow", MaintenancePhase::Succeeded).await;
    env.nms()
        .delete("slow", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("slow").await;
    held += 1;
    // worker-2's pods moved to worker-1: wait for it to settle.
    let mut before = on_node(&env).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = on_node(&env).await;
        if now == before {
            break;
        }
        before = now;
    }

    // Wrong world and garbage bytes arrive as a policy directory update:
    // refused, the last good set stays, and a maintenance that names them
    // is told they are not loaded.
    let core_module = wat::parse_str("(module (func (export \"plan-drain\")))").unwrap();
    for (file, bytes, says) in [
        ("wrong-world.wasm", core_module, "core WebAssembly module"),
        (
            "garbage.wasm",
            b"\x7fELF garbage".to_vec(),
            "not a WebAssembly file",
        ),
    ] {
        tried += 1;
        std::fs::write(dir.join(file), bytes).unwrap();
        let nmo::policy::Reload::Rejected(why) = store.reload() else {
            panic!("{file} accepted")
        };
        assert!(why.contains(says), "{file}: {why}");
        assert_eq!(store.current().names(), ["builtin", "hostile"]);
        let name = file.trim_end_matches(".wasm");
        env.create_nm_with_policy(name, "worker-1", Some(name))
            .await;
        let s = env
            .wait_status(name, "report the missing policy", |s| {
                s.last_error.is_some()
            })
            .await;
        assert_eq!(
            s.last_error.as_deref(),
            Some(format!("policy \"{name}\" is not loaded (loaded: builtin, hostile)").as_str())
        );
        assert_eq!(on_node(&env).await, before, "{file}: nothing acted on");
        env.nms()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        env.wait_gone(name).await;
        std::fs::remove_file(dir.join(file)).unwrap();
        held += 1;
    }
    assert_eq!(tried, 10);
    // Still serving: a well-behaved maintenance on the same node succeeds.
    env.create_nm_with_reason("after", "worker-1", "fine").await;
    env.wait_phase("after", MaintenancePhase::Succeeded).await;
    println!("hostile policies through the operator: {tried} tried, {held} held");
    env.stop().await;
}

/// Bad NodeMaintenances (with no webhook in front to refuse them): each gets
/// a clear answer, loses nothing, and never leaves a node cordoned that no
/// maintenance wants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_node_maintenances() {
    let env = Env::start(4).await;
    env.cluster.apply_yaml(WORKLOAD).unwrap();
    env.wait_ready_pods(3 + 4 + 2).await;
    let nms = env.nms();
    let mut tried = 0;
    let mut held = 0;

    // A node that does not exist: Failed, with the Go operator's message.
    tried += 1;
    env.create_nm("ghost", "no-such-node").await;
    let nm = env.wait_phase("ghost", MaintenancePhase::Failed).await;
    assert_eq!(
        nm.status.unwrap().last_error.as_deref(),
        Some("nodes \"no-such-node\" not found")
    );
    held += 1;

    // An empty or overlong node name: refused by the API (the CRD's
    // validation), with the reason.
    for (what, node) in [("empty", String::new()), ("overlong", "n".repeat(254))] {
        tried += 1;
        let nm = NodeMaintenance::new(
            &format!("bad-{what}"),
            NodeMaintenanceSpec {
                node_name: node,
                reason: None,
            },
        );
        let err = nms.create(&PostParams::default(), &nm).await.unwrap_err();
        let kube::Error::Api(s) = err else {
            panic!("{what}: {err}")
        };
        assert_eq!(s.code, 422, "{what}: {s:?}");
        assert!(s.message.contains("spec.nodeName"), "{what}: {}", s.message);
        held += 1;
    }

    // Two maintenances for one node: deleting one leaves the node in
    // maintenance for the other; deleting both restores it.
    tried += 1;
    env.create_nm("dup-a", "worker-4").await;
    env.wait_phase("dup-a", MaintenancePhase::Succeeded).await;
    env.create_nm("dup-b", "worker-4").await;
    env.wait_phase("dup-b", MaintenancePhase::Succeeded).await;
    nms.delete("dup-a", &DeleteParams::default()).await.unwrap();
    env.wait_gone("dup-a").await;
    assert!(
        !restored(&env.node("worker-4").await),
        "dup-b still wants worker-4 in maintenance"
    );
    nms.delete("dup-b", &DeleteParams::default()).await.unwrap();
    env.wait_gone("dup-b").await;
    assert!(restored(&env.node("worker-4").await));
    held += 1;

    // spec.nodeName changed under a maintenance: the old node is restored,
    // the maintenance moves to the new one.
    tried += 1;
    env.create_nm("moving", "worker-4").await;
    env.wait_phase("moving", MaintenancePhase::Succeeded).await;
    nms.patch(
        "moving",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"nodeName": "worker-3"}})),
    )
    .await
    .unwrap();
    wait_until("worker-4 restored", Duration::from_secs(30), || async {
        restored(&env.node("worker-4").await)
    })
    .await;
    env.wait_status("moving", "on worker-3", |s| {
        s.phase == Some(MaintenancePhase::Succeeded) && s.pending_pods.is_none() && s.total_pods > 0
    })
    .await;
    // (The status above may still be the one from worker-4: what moved is
    // the node.)
    wait_until(
        "worker-3 in maintenance",
        Duration::from_secs(30),
        || async { !restored(&env.node("worker-3").await) },
    )
    .await;
    let owners: Vec<String> = nms
        .get("moving")
        .await
        .unwrap()
        .owner_references()
        .iter()
        .map(|o| o.name.clone())
        .collect();
    assert_eq!(owners, ["worker-3"]);
    // And the maintenance says so in its events.
    wait_until("a MovedMaintenance event", Duration::from_secs(30), || async {
        env.events_for("moving").await.iter().any(|(t, r, m)| {
            t == "Warning"
                && r == "MovedMaintenance"
                && m == "spec.nodeName changed from worker-4 to worker-3: node worker-4 restored, the maintenance starts over on worker-3"
        })
    })
    .await;
    nms.delete("moving", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("moving").await;
    assert!(restored(&env.node("worker-3").await));
    held += 1;

    // The NodeMaintenance deleted mid-drain (a PDB blocks it): the drain
    // stops, the node is restored, the blocked pod stays.
    tried += 1;
    // Two web replicas, minAvailable 2: no eviction is allowed.
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(env.client.clone(), "default")
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let node = web_node(&env, 2).await;
    env.create_nm("interrupted", &node).await;
    env.wait_status("interrupted", "draining", |s| {
        s.pending_pods
            .as_ref()
            .is_some_and(|p| p.iter().any(|p| p.starts_with("web-")))
    })
    .await;
    wait_until("cordoned", Duration::from_secs(10), || async {
        !restored(&env.node(&node).await)
    })
    .await;
    // The eviction keeps being refused (429) for the rest of the attempt.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let web_left = |pods: Vec<Pod>| {
        pods.iter()
            .filter(|p| p.name_any().starts_with("web-"))
            .count()
    };
    let left = web_left(env.pods_on(&node).await);
    assert!(left >= 1);
    nms.delete("interrupted", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("interrupted").await;
    assert!(restored(&env.node(&node).await));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        web_left(env.pods_on(&node).await),
        left,
        "the drain stopped"
    );
    held += 1;

    // The node deleted mid-drain: the maintenance goes with it (its owner
    // reference), nothing crashes, no error loop.
    tried += 1;
    env.create_nm("orphaned", &node).await;
    wait_until("cordoned", Duration::from_secs(10), || async {
        !restored(&env.node(&node).await)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Api::<Node>::all(env.client.clone())
        .delete(&node, &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("orphaned").await;
    assert!(!env.controller.is_finished(), "the operator runs");
    held += 1;

    assert_eq!(tried, 7);
    println!("bad NodeMaintenances: {tried} tried, {held} held");
    env.stop().await;
}

/// The sandbox through the operator, as a hostile policy author would try
/// it: sleeping decisions do not freeze other maintenances or deletions,
/// policy text cannot forge lines in `kubectl describe`, and a policy that
/// asks to retry at once cannot drive the API request rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_policies_cannot_freeze_forge_or_hammer() {
    let (root, _dir, _store, env) = hostile_env(3).await;
    let mut tried = 0;
    let mut held = 0;

    // 1. Ten sleeping decisions (the default --max-concurrent-maintenances)
    // do not hold up an ordinary maintenance, and are deleted promptly.
    tried += 1;
    for i in 0..10 {
        env.create_nm_with_reason(&format!("sleepy-{i}"), "worker-1", "sleep")
            .await;
    }
    env.create_nm_with_reason("ordinary", "worker-2", "fine")
        .await;
    env.wait_phase("ordinary", MaintenancePhase::Succeeded)
        .await;
    let s = env
        .wait_status("sleepy-0", "report the deadline", |s| {
            s.last_error.is_some()
        })
        .await;
    assert!(
        s.last_error
            .as_deref()
            .unwrap_or("")
            .contains("ran past its deadline"),
        "{s:?}"
    );
    let started = Instant::now();
    for i in 0..10 {
        env.nms()
            .delete(&format!("sleepy-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    for i in 0..10 {
        env.wait_gone(&format!("sleepy-{i}")).await;
    }
    assert!(restored(&env.node("worker-1").await));
    println!(
        "ten sleeping decisions deleted and the node restored in {:?}",
        started.elapsed()
    );
    held += 1;

    // 2. Control characters in a `fail` message: status and `kubectl
    // describe` show them escaped; no forged line.
    tried += 1;
    env.create_nm_with_reason("forger", "no-such-node", "control-chars")
        .await;
    let s = env
        .wait_status("forger", "fail", |s| {
            s.phase == Some(MaintenancePhase::Failed)
        })
        .await;
    let last_error = s.last_error.unwrap();
    assert!(
        last_error.starts_with("gave up\\nPhase: Succeeded\\r\\u{1b}[32m"),
        "{last_error:?}"
    );
    let kc = root.path().join("kc");
    env.cluster.write_kubeconfig(&kc).unwrap();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .arg("--cache-dir")
        .arg(root.path().join("kcache"))
        .args(["describe", "nodemaintenance", "forger"])
        .output()
        .await
        .expect("kubectl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let phases: Vec<String> = text
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("Phase:"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(phases, ["Phase: Failed"], "{text}");
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "no raw control character reaches the terminal: {text:?}"
    );
    env.nms()
        .delete("forger", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("forger").await;
    held += 1;

    // 3. A pod blocked with a 1 ms attempt and `retry-after-ms: 0`: the
    // retries wait the 1 s floor, so the maintenance's request rate is
    // bounded whatever the policy answers.
    tried += 1;
    env.create_nm_with_reason("hammer", "worker-3", "block-now")
        .await;
    env.wait_status("hammer", "report the blocked pod", |s| {
        s.last_error.is_some()
    })
    .await;
    env.cluster.record_audit(true);
    let window = Duration::from_secs(5);
    tokio::time::sleep(window).await;
    env.cluster.record_audit(false);
    // The maintenance's own requests: not the controller's periodic list
    // of NodeMaintenances (the rewound-server check, every 500 ms in tests,
    // 10 s by default), which does not grow with maintenances.
    let requests = env
        .cluster
        .audit()
        .iter()
        .filter(|a| !(a.verb == "list" && a.resource == "nodemaintenances"))
        .count();
    let per_minute = requests as f64 * 60.0 / window.as_secs_f64();
    println!("a retry-at-once policy: {requests} requests in {window:?} ({per_minute:.0}/min)");
    assert!(
        per_minute <= 540.0,
        "{requests} requests in {window:?}: {:?}",
        env.cluster.audit()
    );
    env.nms()
        .delete("hammer", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("hammer").await;
    held += 1;

    println!("hostile policies (sandbox) through the operator: {tried} tried, {held} held");
    env.stop().await;
}
