//! `nmo plan` tells the truth: for the default policy and every example
//! policy, the plan names the pods, actions and wave order the operator
//! then carries out (seen in the simulated API server's audit log, by the
//! operator's User-Agent); a pod the plan flags as refused by a budget is
//! the one that holds the drain up; and `kubectl nm` works as a kubectl
//! plugin.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use kube::Api;
use nmo::crd::MaintenancePhase;
use nmo::plan::{Report, Request, Source};
use nmo::policy::PolicyEngine;

/// Beside the shared workload on worker-1 (web behind a PDB, a DaemonSet
/// pod, a bare pod, a pod with emptyDir): a StatefulSet's two members, and
/// pods that opt out of the drain.
const MORE: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {nodeSelector: {kubernetes.io/hostname: worker-1}, containers: [{name: db, image: db}]}
---
apiVersion: v1
kind: Pod
metadata: {name: cache, namespace: default, annotations: {nmo.medik8s.io/drain: skip}}
spec: {nodeName: worker-1, containers: [{name: c, image: cache}]}
"#;

/// The policy directory `deploy/policies` (the shipped ConfigMap's files).
fn shipped_policies() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/policies")
}

fn policy_file(stem: &str) -> PathBuf {
    std::path::Path::new(env!("NMO_POLICY_WASM_DIR")).join(format!("nmo_policy_{stem}.wasm"))
}

async fn plan_with(env: &Env, policy: &std::path::Path) -> Report {
    let engine = PolicyEngine::new(Default::default()).unwrap();
    nmo::plan::plan(
        &env.client,
        &engine,
        &Request {
            node: Some("worker-1".into()),
            maintenance: None,
            policy: None,
            source: Source::File(policy.to_path_buf()),
        },
    )
    .await
    .unwrap()
}

/// The operator's pod removals so far, in order: (verb, pod name).
fn removals(env: &Env) -> Vec<(String, String)> {
    env.cluster
        .audit()
        .into_iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT && r.resource == "pods")
        .filter(|r| {
            (r.verb == "create" && r.subresource == "eviction")
                || (r.verb == "delete" && r.subresource.is_empty())
        })
        .map(|r| {
            let verb = if r.verb == "create" {
                "evict"
            } else {
                "delete"
            };
            (verb.to_owned(), r.name)
        })
        .collect()
}

async fn workload_ready(env: &Env) {
    env.cluster.apply_yaml(WORKLOAD).unwrap();
    env.cluster.apply_yaml(MORE).unwrap();
    wait_until(
        "the workload on worker-1",
        Duration::from_secs(20),
        || async {
            let pods = env.pods_on("worker-1").await;
            let has = |prefix: &str| {
                pods.iter()
                    .any(|p| p.metadata.name.as_deref().unwrap_or("").starts_with(prefix))
            };
            has("db-0") && has("db-1") && has("agent-") && has("bare") && has("cache")
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_is_what_the_operator_then_does_for_every_shipped_policy() {
    for stem in [
        "default",
        "never_force",
        "stateful_last",
        "opt_out",
        "give_up",
    ] {
        let policy = policy_file(stem);
        let env = Env::start_with(3, Some(&format!("nmo_policy_{stem}.wasm"))).await;
        workload_ready(&env).await;
        let report = plan_with(&env, &policy).await;
        assert_eq!(
            report.pods.len(),
            env.pods_on("worker-1").await.len(),
            "{stem}"
        );
        let planned: BTreeMap<String, (String, u32)> = report
            .pods
            .iter()
            .map(|p| (p.name.clone(), (p.action.clone(), p.wave)))
            .collect();

        env.cluster.record_audit(true);
        env.create_nm("nm-1", "worker-1").await;
        let removed: BTreeSet<String> = planned
            .iter()
            .filter(|(_, (a, _))| a == "evict" || a == "delete")
            .map(|(n, _)| n.clone())
            .collect();
        // Every pod the plan removes leaves the node (the PDB lets the web
        // pod go once its replacement runs elsewhere).
        wait_until(
            &format!("{stem}: the planned removals done"),
            Duration::from_secs(30),
            || async {
                let left: BTreeSet<String> = env
                    .pods_on("worker-1")
                    .await
                    .into_iter()
                    .filter_map(|p| p.metadata.name)
                    .collect();
                removed.iter().all(|n| !left.contains(n))
            },
        )
        .await;
        let done = removals(&env);
        // The same pods, with the same action each...
        let acted: BTreeSet<(String, String)> =
            done.iter().map(|(v, n)| (n.clone(), v.clone())).collect();
        let expected: BTreeSet<(String, String)> = planned
            .iter()
            .filter(|(n, _)| removed.contains(*n))
            .map(|(n, (a, _))| (n.clone(), a.clone()))
            .collect();
        assert_eq!(acted, expected, "{stem}: {done:?}\n{}", report.table());
        // ...nothing the plan skips or blocks is touched...
        for (name, (action, _)) in &planned {
            if action == "skip" || action == "block" {
                assert!(
                    env.pods_on("worker-1")
                        .await
                        .iter()
                        .any(|p| p.metadata.name.as_deref() == Some(name)),
                    "{stem}: {name} ({action}) must stay"
                );
            }
        }
        // ...and the waves in order: every request for a wave comes before
        // any for a later one.
        let wave_of = |name: &str| planned[name].1;
        for (i, (_, a)) in done.iter().enumerate() {
            for (_, b) in &done[i + 1..] {
                assert!(
                    wave_of(a) <= wave_of(b),
                    "{stem}: {a} (wave {}) acted on after {b} (wave {})",
                    wave_of(a),
                    wave_of(b)
                );
            }
        }
        if report.summary.block == 0 {
            env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
        } else {
            let s = env.nms().get("nm-1").await.unwrap().status.unwrap();
            assert_ne!(s.phase, Some(MaintenancePhase::Succeeded), "{stem}");
        }
        env.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_plan_flags_as_refused_is_the_one_that_holds_the_drain() {
    // The operator and the plan read the same policy directory (the one
    // deploy/ ships), as a plan reads the operator's ConfigMap.
    let policies = shipped_policies();
    let store = nmo::policy::PolicyStore::from_dir(
        PolicyEngine::new(Default::default()).unwrap(),
        &policies,
        None,
    )
    .unwrap();
    let env = Env::start_store(3, store).await;
    // Three web replicas, a budget that wants all three.
    env.cluster
        .apply_yaml(&WORKLOAD.replace("minAvailable: 2", "minAvailable: 3"))
        .unwrap();
    let node = web_node(&env, 3).await;
    let engine = PolicyEngine::new(Default::default()).unwrap();
    let request = Request {
        node: Some(node.clone()),
        maintenance: None,
        policy: None,
        source: Source::Dir(policies.clone()),
    };
    // The budget's status is kept by the simulated controller: wait until
    // it has counted the three replicas.
    let started = std::time::Instant::now();
    let report = loop {
        let report = nmo::plan::plan(&env.client, &engine, &request)
            .await
            .unwrap();
        if report.summary.refused_now > 0 {
            break report;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the budget never counted: {}",
            report.table()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(report.policy.name, "default", "{report:?}");
    assert!(
        report.policy.source.contains("policy directory"),
        "{report:?}"
    );
    // Every web pod on the node, and only they, would be refused now.
    let mut refused: Vec<String> = report
        .pods
        .iter()
        .filter(|p| p.refused_now)
        .map(|p| p.name.clone())
        .collect();
    refused.sort();
    let mut webs: Vec<String> = env
        .pods_on(&node)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .filter(|n| n.starts_with("web-"))
        .collect();
    webs.sort();
    assert!(!webs.is_empty());
    assert_eq!(refused, webs, "{}", report.table());
    assert!(
        report
            .table()
            .contains("refused now: its budget allows no disruption")
    );
    for web in &webs {
        let pdb = &report.pods.iter().find(|p| &p.name == web).unwrap().pdbs;
        assert_eq!(pdb.len(), 1);
        assert_eq!(
            (pdb[0].name.as_str(), pdb[0].disruptions_allowed),
            ("web", 0)
        );
    }

    // The drain is held up by exactly those pods.
    env.create_nm("nm-1", &node).await;
    let s = env
        .wait_status("nm-1", "held up by the budget", |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("web-") && e.contains("disruption budget"))
                && s.pending_pods
                    .as_ref()
                    .is_some_and(|p| p.len() == webs.len())
        })
        .await;
    assert_eq!(s.phase, Some(MaintenancePhase::Running));
    let mut pending = s.pending_pods.unwrap_or_default();
    pending.sort();
    assert_eq!(pending, webs);

    // The same plan for the running maintenance: its recorded policy, the
    // pods still pending.
    let running = nmo::plan::plan(
        &env.client,
        &engine,
        &Request {
            node: None,
            maintenance: Some("nm-1".into()),
            policy: None,
            source: Source::Dir(policies.clone()),
        },
    )
    .await
    .unwrap();
    assert!(
        running.policy.chosen_by.starts_with("recorded in status"),
        "{running:?}"
    );
    let m = running.maintenance.as_ref().unwrap();
    assert_eq!(m.phase.as_deref(), Some("Running"));
    let mut pending = m.pending_pods.clone();
    pending.sort();
    assert_eq!(pending, webs);
    assert!(
        running
            .pods
            .iter()
            .filter(|p| p.name.starts_with("web-"))
            .all(|p| p.refused_now)
    );
    env.stop().await;
}

/// Runs the binary as the kubectl plugin, through the real kubectl.
async fn kubectl_nm(
    bin_dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> (bool, String) {
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::process::Command::new("kubectl")
        .arg("nm")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .expect("kubectl runs");
    (out.status.success(), common::printed(&out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_nm_plans_starts_shows_and_stops_a_maintenance() {
    let env = Env::start(2).await;
    kubectl_nm_round_trip(&env).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_nm_on_the_real_control_plane() {
    let env = common::real::RealEnv::start(nmo_control_plane::Options {
        audit: true,
        ..nmo_control_plane::Options::workers(2)
    })
    .await;
    kubectl_nm_round_trip(&env).await;
    env.stop();
}

/// `kubectl nm plan` (reads only), `start`, `status` (with kubectl's
/// --kubeconfig and --context), `stop`, through the real kubectl.
async fn kubectl_nm_round_trip(env: &impl ClusterOps) {
    env.apply(WORKLOAD).await;
    web_node(env, 3).await;
    let tmp = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nmo"), tmp.path().join("kubectl-nm")).unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, env.kubeconfig()).unwrap();
    let bin = tmp.path();

    // The plan changes nothing: it only reads.
    let mark = env.audit_mark();
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["plan", "worker-1", "-o", "json"]).await;
    assert!(ok, "{out}");
    let writes = env.admin_writes_since(mark);
    assert!(writes.is_empty(), "the plan wrote: {writes:?}");
    let plan: serde_json::Value = serde_json::from_str(&out).expect("-o json is JSON");
    assert_eq!(plan["node"], "worker-1");
    assert_eq!(plan["policy"]["name"], "builtin");
    assert!(
        plan["pods"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "bare" && p["action"] == "evict")
    );
    let (ok, out) = kubectl_nm(
        bin,
        &kubeconfig,
        &[
            "plan",
            "worker-1",
            "--policy",
            &policy_file("never_force").display().to_string(),
        ],
    )
    .await;
    assert!(ok, "{out}");
    assert!(out.contains("bare") && out.contains("block"), "{out}");
    // A node that does not exist reads as kubectl says it, once.
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["plan", "no-such-node"]).await;
    assert!(!ok, "{out}");
    assert_eq!(
        out,
        "Error from server (NotFound): nodes \"no-such-node\" not found\n"
    );

    let (ok, out) = kubectl_nm(
        bin,
        &kubeconfig,
        &["start", "worker-1", "--reason", "kernel update"],
    )
    .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("nodemaintenance.nodemaintenance.medik8s.io/worker-1 created"),
        "{out}"
    );
    env.wait_phase("worker-1", MaintenancePhase::Succeeded)
        .await;
    // kubectl's flags: --kubeconfig (here with KUBECONFIG pointing nowhere)
    // and --context.
    let context = env
        .kubeconfig()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("current-context:")
                .map(|c| c.trim().trim_matches('"').to_owned())
        })
        .expect("a current context");
    let (ok, out) = kubectl_nm(
        bin,
        std::path::Path::new("/nonexistent"),
        &[
            "status",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--context",
            &context,
        ],
    )
    .await;
    assert!(ok && out.contains("worker-1"), "{out}");
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["status"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("worker-1") && out.contains("Succeeded") && out.contains("100%"),
        "{out}"
    );
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["status", "-o", "json"]).await;
    assert!(ok, "{out}");
    // `nmo status` is the same command as `kubectl nm status`.
    let nmo = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["status", "-o", "json"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(nmo.status.success(), "{}", common::printed(&nmo));
    let same: serde_json::Value = serde_json::from_slice(&nmo.stdout).unwrap();
    assert_eq!(same[0]["name"], "worker-1", "{same}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status[0]["phase"], "Succeeded");
    assert_eq!(status[0]["drainProgress"], 100);

    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["stop", "worker-1"]).await;
    assert!(ok, "{out}");
    env.wait_gone("worker-1").await;
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["stop", "worker-1"]).await;
    assert!(!ok && out.contains("has no NodeMaintenance"), "{out}");
    let nms: Api<nmo::crd::NodeMaintenance> = Api::all(env.client().clone());
    assert!(
        nms.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// `kubectl nm start -l`: one NodeMaintenance per node the selector picks,
/// in one group whose progress `status` shows; a selector that picks every
/// node is refused unless said; a node already started is reported, the
/// others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_nm_starts_every_node_a_selector_picks_as_a_group() {
    let env = Env::start(4).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    for n in ["worker-2", "worker-3"] {
        nodes
            .patch(
                n,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    serde_json::json!({"metadata": {"labels": {"pool": "batch"}}}),
                ),
            )
            .await
            .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nmo"), tmp.path().join("kubectl-nm")).unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, env.kubeconfig()).unwrap();
    let bin = tmp.path();

    // Every node: refused, nothing created.
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["start", "-l", "", "--reason", "all"]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("picks every node (4)") && out.contains("--all-nodes"),
        "{out}"
    );
    assert!(
        env.nms()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    let (ok, out) = kubectl_nm(
        bin,
        &kubeconfig,
        &[
            "start",
            "-l",
            "pool=batch",
            "--reason",
            "kernel",
            "--group",
            "batch-1",
        ],
    )
    .await;
    assert!(ok, "{out}");
    for n in ["worker-2", "worker-3"] {
        assert!(
            out.contains(&format!(
                "nodemaintenance.nodemaintenance.medik8s.io/{n} created"
            )),
            "{out}"
        );
    }
    assert!(
        out.contains("group batch-1: 2 of 2 node(s) started"),
        "{out}"
    );
    let made = env.nms().list(&Default::default()).await.unwrap().items;
    assert_eq!(made.len(), 2);
    for nm in &made {
        assert_eq!(
            kube::ResourceExt::labels(nm)
                .get("nodemaintenance.medik8s.io/group")
                .map(String::as_str),
            Some("batch-1")
        );
        assert_eq!(nm.spec.reason.as_deref(), Some("kernel"));
    }
    env.wait_phase("worker-2", MaintenancePhase::Succeeded)
        .await;
    env.wait_phase("worker-3", MaintenancePhase::Succeeded)
        .await;
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["status", "--group", "batch-1"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("group batch-1: 2 of 2 succeeded (2 Succeeded)"),
        "{out}"
    );

    // Started again: each node reported, the exit code says so.
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["start", "-l", "pool=batch"]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("worker-2: Error from server (AlreadyExists)"),
        "{out}"
    );

    // Stopped as a group: both ended, a maintenance outside it kept.
    env.create_nm("outside", "worker-4").await;
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["stop", "--group", "batch-1"]).await;
    assert!(ok, "{out}");
    assert_eq!(out.matches(" deleted").count(), 2, "{out}");
    for n in ["worker-2", "worker-3"] {
        env.wait_gone(n).await;
    }
    assert!(env.nms().get_opt("outside").await.unwrap().is_some());
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["stop", "--group", "batch-1"]).await;
    assert!(
        !ok && out.contains("group batch-1 has no NodeMaintenance"),
        "{out}"
    );

    // Stopped by a node selector: the maintenances of the nodes it picks,
    // whoever started them; every node refused without --all-nodes.
    env.create_nm("by-hand", "worker-2").await;
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["stop", "-l", ""]).await;
    assert!(!ok && out.contains("picks every node (4)"), "{out}");
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["stop", "-l", "pool=batch"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("nodemaintenance.nodemaintenance.medik8s.io/by-hand deleted")
            && out.matches(" deleted").count() == 1,
        "{out}"
    );
    env.wait_gone("by-hand").await;
    assert!(
        env.nms().get_opt("outside").await.unwrap().is_some(),
        "worker-4 is not picked"
    );
    let (ok, out) = kubectl_nm(bin, &kubeconfig, &["stop", "-l", "pool=batch"]).await;
    assert!(
        !ok && out.contains(
            "none of the 2 node(s) the selector \"pool=batch\" picks has a NodeMaintenance"
        ),
        "{out}"
    );
    env.stop().await;
}

/// A budget's headroom is spent across the pods it covers: six pods of
/// one node behind a budget allowing one, and the plan says five of the
/// six evictions would be refused now (it said none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_allowing_one_lets_one_of_six_go_in_the_plan() {
    let env = Env::start(2).await;
    env.cluster
        .apply_yaml(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: six, namespace: default}
spec:
  replicas: 6
  selector: {matchLabels: {app: six}}
  template:
    metadata: {labels: {app: six}}
    spec: {nodeSelector: {kubernetes.io/hostname: worker-1}, containers: [{name: c, image: i}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: six, namespace: default}
spec: {maxUnavailable: 1, selector: {matchLabels: {app: six}}}
"#,
        )
        .unwrap();
    let engine = PolicyEngine::new(Default::default()).unwrap();
    let request = Request {
        node: Some("worker-1".into()),
        maintenance: None,
        policy: None,
        source: Source::Embedded,
    };
    // Once the budget has counted the six (it allows one then).
    let counted = |r: &Report| {
        r.pods
            .iter()
            .filter(|p| p.name.starts_with("six-"))
            .filter(|p| p.pdbs.first().is_some_and(|b| b.disruptions_allowed == 1))
            .count()
            == 6
    };
    let started = std::time::Instant::now();
    let report = loop {
        let r = nmo::plan::plan(&env.client, &engine, &request)
            .await
            .unwrap();
        if counted(&r) {
            break r;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the budget never counted six: {}",
            r.table()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let six: Vec<_> = report
        .pods
        .iter()
        .filter(|p| p.name.starts_with("six-"))
        .collect();
    assert_eq!(
        six.iter().filter(|p| p.refused_now).count(),
        5,
        "{}",
        report.table()
    );
    assert_eq!(report.summary.refused_now, 5);
    assert!(
        report
            .table()
            .contains("refused now: the evictions before it spend its budget"),
        "{}",
        report.table()
    );
    env.stop().await;
}

/// Contract 0.3's actions in the plan: what a surge starts, what a
/// handshake waits for, how long a Job is waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_shows_surges_handshakes_and_waits() {
    let env = Env::start(2).await;
    workload_ready(&env).await;
    env.cluster
        .create(bare(
            "game",
            "worker-1",
            serde_json::json!({"nmo.medik8s.io/handshake": "5m"}),
            30,
        ))
        .unwrap();
    // A ReplicaSet's pod and a Job's pod on worker-1 (real owners: the
    // garbage collector removes pods whose owner does not exist).
    env.cluster
        .apply_yaml(
            r#"
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: shop, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: shop}}
  template:
    metadata: {labels: {app: shop}}
    spec: {nodeSelector: {kubernetes.io/hostname: worker-1}, containers: [{name: c, image: shop}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: report, namespace: default}
spec:
  template:
    metadata: {labels: {app: report}}
    spec: {restartPolicy: Never, nodeSelector: {kubernetes.io/hostname: worker-1}, containers: [{name: c, image: report}]}
"#,
        )
        .unwrap();
    wait_until(
        "the owners' pods on worker-1",
        Duration::from_secs(20),
        || async {
            let pods = env.pods_on("worker-1").await;
            let has = |prefix: &str| {
                pods.iter()
                    .any(|p| p.metadata.name.as_deref().unwrap_or("").starts_with(prefix))
            };
            has("shop-") && has("report-")
        },
    )
    .await;
    let report = plan_with(&env, &policy_file("no_downtime")).await;
    let row = |prefix: &str| {
        report
            .pods
            .iter()
            .find(|p| p.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix} in {:?}", report.pods))
    };
    let shop = row("shop-");
    assert_eq!(shop.action, "surge");
    assert!(
        shop.detail
            .as_deref()
            .is_some_and(|d| d.contains("one more replica through ReplicaSet shop")),
        "{shop:?}"
    );
    let game = row("game");
    assert_eq!(game.action, "notify");
    assert!(
        game.detail
            .as_deref()
            .is_some_and(|d| d.contains("waits up to 5m")
                && d.contains("heartbeats extend by 30s")
                && d.ends_with("then evict")),
        "{game:?}"
    );
    let job = row("report-");
    assert_eq!(job.action, "wait");
    assert!(
        job.detail.as_deref() == Some("waits up to 1h for the pod to complete"),
        "{job:?}"
    );
    let table = report.table();
    assert!(table.contains(" surge "), "{table}");
    assert!(table.contains("1 notify, 1 wait"), "{table}");
    env.stop().await;
}

/// `nmo plan --fleet`: the maintenances in the order the operator takes
/// them, and a budget spanning two nodes spent across them: each node
/// alone would have its eviction allowed, but the second one's is refused
/// once the first has spent the headroom.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_plan_spends_a_shared_budget_across_nodes() {
    // No operator: the maintenances wait, unstarted.
    let (cluster, client) = start_cluster(3).await;
    cluster
        .apply_yaml(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: left, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: shared, side: left}}
  template:
    metadata: {labels: {app: shared, side: left}}
    spec: {nodeSelector: {kubernetes.io/hostname: worker-1}, terminationGracePeriodSeconds: 20, containers: [{name: c, image: i}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: right, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: shared, side: right}}
  template:
    metadata: {labels: {app: shared, side: right}}
    spec: {nodeSelector: {kubernetes.io/hostname: worker-2}, terminationGracePeriodSeconds: 20, containers: [{name: c, image: i}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: shared, namespace: default}
spec: {maxUnavailable: 1, selector: {matchLabels: {app: shared}}}
"#,
        )
        .unwrap();
    let nms: Api<nmo::crd::NodeMaintenance> = Api::all(client.clone());
    // nm-ghost names a node that does not exist (as the Go operator
    // leaves such maintenances): it is named, not planned, and does not
    // stop the others' plans.
    for (name, node) in [
        ("nm-1", "worker-1"),
        ("nm-2", "worker-2"),
        ("nm-ghost", "worker-9"),
    ] {
        nms.create(&Default::default(), &common::nm(name, node))
            .await
            .unwrap();
    }
    let engine = PolicyEngine::new(Default::default()).unwrap();
    let started = std::time::Instant::now();
    let fleet = loop {
        let f = nmo::plan::plan_fleet(&client, &engine, &Source::Embedded, None)
            .await
            .unwrap();
        let counted = f
            .budgets
            .iter()
            .any(|b| b.name == "shared" && b.disruptions_allowed == 1 && b.evictions == 2);
        if counted {
            break f;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the budget never counted both: {}",
            f.table()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let order: Vec<&str> = fleet
        .maintenances
        .iter()
        .map(|e| e.plan.maintenance.as_ref().unwrap().name.as_str())
        .collect();
    // First created, first served (the same second: by name).
    assert_eq!(order, ["nm-1", "nm-2"]);
    // Alone, each node's eviction is allowed; across the fleet, the
    // second is refused.
    assert!(
        fleet
            .maintenances
            .iter()
            .all(|e| e.plan.summary.refused_now == 0)
    );
    assert_eq!(fleet.maintenances[0].refused_across_fleet, 0);
    assert_eq!(fleet.maintenances[1].refused_across_fleet, 1);
    let shared = fleet.budgets.iter().find(|b| b.name == "shared").unwrap();
    assert_eq!(shared.runs_out_at.as_deref(), Some("nm-2"));
    // 20 s of grace per node, 5 s more for the refused eviction; both
    // admitted now, so side by side.
    assert_eq!(fleet.estimate.parallel, 2);
    assert_eq!(fleet.estimate.seconds, 25.0);
    let table = fleet.table();
    assert!(
        table.contains("RUNS OUT AT") && table.contains("default/shared"),
        "{table}"
    );
    assert_eq!(
        fleet.missing_nodes,
        [nmo::plan::MissingNode {
            maintenance: "nm-ghost".into(),
            node: "worker-9".into()
        }]
    );
    assert!(
        table.contains("Not planned: nm-ghost names node \"worker-9\""),
        "{table}"
    );
    cluster.stop().await;
}
