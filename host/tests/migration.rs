//! From the Go operator to nmo and back, as docs/migration.md says, on the
//! real control plane with the real Go Node Maintenance Operator
//! (medik8s/node-maintenance-operator v0.21.0, built from its Go module with
//! the control plane, run with its own CRD as a local process).
//!
//! The Go operator leaves maintenances as it leaves them: one Succeeded
//! (its node cordoned, tainted, leased), one Running behind a
//! PodDisruptionBudget that allows nothing, one on a node that does not
//! exist (Failed, `lastError` saying so). A Failed one is written as the Go
//! operator writes it after its lease failures (`maintenance failed: lease
//! could not be extended after 4 attempts`, the node uncordoned), while it
//! is stopped. nmo's CRD and RBAC are applied and nmo starts.
//! Checked from the API server's own records (a watch of the nodes from
//! the switch on, the audit log of evictions): no node is uncordoned while
//! its maintenance lasts, no pod is evicted twice, the Succeeded and Failed
//! maintenances stay as they were, and the held one finishes under nmo once
//! its budget allows. Then the way back: nmo stops, the Go CRD is applied
//! again, the Go operator starts and ends the maintenances, restoring the
//! nodes.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::real::{self, RealEnv};
use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use nmo::crd::MaintenancePhase;
use nmo_control_plane::Options;
use serde_json::json;

/// The Go operator as a local process, with the admin's kubeconfig (its
/// RBAC is not what is tested here), its webhook server given a
/// certificate where it looks for one (the webhook is not registered), its
/// metrics and probes off.
fn go_operator(env: &RealEnv, log: &std::path::Path) -> tokio::process::Child {
    let certs = std::path::Path::new("/tmp/k8s-webhook-server/serving-certs");
    std::fs::create_dir_all(certs).unwrap();
    let (made, _) = webhook_cert();
    for f in ["tls.crt", "tls.key"] {
        std::fs::copy(made.path().join(f), certs.join(f)).unwrap();
    }
    tokio::process::Command::new(env.cp.binaries().path("node-maintenance-operator"))
        .args(["--metrics-bind-address=0", "--health-probe-bind-address=0"])
        .env("KUBECONFIG", env.cp.kubeconfig_path())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("the Go operator starts")
}

/// Stops a process as a Deployment's rollout would (SIGTERM), and waits.
async fn stop(mut child: tokio::process::Child) {
    if let Some(pid) = child.id() {
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
}

/// Every version of every node the API server sends from now on, as
/// (node, unschedulable).
fn record_nodes(client: &kube::Client) -> Arc<Mutex<Vec<(String, bool)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let nodes: Api<Node> = Api::all(client.clone());
    tokio::spawn(async move {
        let mut stream = watcher(nodes, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(n)) = stream.next().await {
            let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            s.lock()
                .unwrap()
                .push((n.metadata.name.unwrap_or_default(), unschedulable));
        }
    });
    seen
}

/// Successful evictions per pod, from the audit log.
fn evictions(env: &RealEnv) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in env.cp.audit() {
        if r.verb == "create" && r.uri.contains("/eviction") && (200..300).contains(&r.code) {
            let pod = r
                .uri
                .split("/pods/")
                .nth(1)
                .and_then(|p| p.split('/').next())
                .unwrap_or_default()
                .to_owned();
            *out.entry(pod).or_insert(0) += 1;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_go_operator_to_nmo_and_back() {
    let env = RealEnv::start_bare(Options {
        audit: true,
        ..Options::workers(3)
    })
    .await;
    let logs = tempfile::tempdir().unwrap();
    let crd = std::fs::read_to_string(env.cp.binaries().path("node-maintenance-operator-crd.yaml"))
        .unwrap();
    env.cp.apply(&crd).await.unwrap();
    let go = go_operator(&env, &logs.path().join("go-1.log"));

    // The Go operator's maintenances: Succeeded (an empty node), Running
    // (a budget that allows nothing holds a pod), Failed (no such node).
    let held = succeeded_and_held(&env, "nm-done", "nm-held").await;
    env.create_nm("nm-ghost", "ghost").await;
    env.wait_status("nm-ghost", "failed: its node does not exist", |s| {
        s.phase == Some(MaintenancePhase::Failed)
            && s.last_error.as_deref() == Some("nodes \"ghost\" not found")
    })
    .await;
    let evicted_by_go = evictions(&env);
    stop(go).await;
    // A maintenance the Go operator failed (lease errors), as it leaves it:
    // its finalizer, phase Failed, the node given back; on whichever of
    // worker-1 and worker-2 the held maintenance is not.
    let given_back = if held == "worker-1" {
        "worker-2"
    } else {
        "worker-1"
    };
    env.create_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": "nm-failed", "finalizers": ["foregroundDeleteNodeMaintenance"]},
        "spec": {"nodeName": given_back, "reason": "lease trouble"},
    }))
    .await;
    let failed_status = json!({"status": {
        "phase": "Failed",
        "errorOnLeaseCount": 4,
        "lastError": "maintenance failed: lease could not be extended after 4 attempts",
        "drainProgress": 0,
    }});
    env.nms()
        .patch_status(
            "nm-failed",
            &PatchParams::default(),
            &Patch::Merge(&failed_status),
        )
        .await
        .unwrap();

    // The switch, as the guide says: nmo's CRD over the Go one
    // (server-side, taking its fields over), nmo's RBAC, then nmo.
    let seen = record_nodes(&env.admin);
    let switch = std::time::Instant::now();
    let (operator, _token) = real::install_operator_objects(&env.cp).await;
    let nmo = start_controller_with(&operator, policy_store(None));

    // The Succeeded one stays Succeeded, its node in maintenance; the Failed
    // one stays as the Go operator left it.
    // nmo has taken worker-3 over when it has written its record of the
    // node's state before the maintenance: the Go operator's marks, none
    // of them a human's (so ending the maintenance restores them all).
    wait_until(
        "nmo has taken worker-3 over",
        Duration::from_secs(30),
        || async {
            kube::ResourceExt::annotations(&env.node("worker-3").await)
                .get("nodemaintenance.medik8s.io/before-maintenance")
                .is_some()
        },
    )
    .await;
    eprintln!(
        "the switch: nmo's objects applied and worker-3 taken over in {:.1} s",
        switch.elapsed().as_secs_f64()
    );
    let record: serde_json::Value = serde_json::from_str(
        &kube::ResourceExt::annotations(&env.node("worker-3").await)
            ["nodemaintenance.medik8s.io/before-maintenance"],
    )
    .unwrap();
    assert_eq!(
        record,
        json!({"unschedulable": false, "taints": [], "excludeLabel": false})
    );
    assert_eq!(
        env.nms()
            .get("nm-done")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase,
        Some(MaintenancePhase::Succeeded)
    );
    let failed = env.nms().get("nm-failed").await.unwrap().status.unwrap();
    assert_eq!(failed.phase, Some(MaintenancePhase::Failed));
    assert_eq!(failed.error_on_lease_count, 4);
    // The missing node's stays Failed, as the Go operator left it.
    let ghost = env.wait_phase("nm-ghost", MaintenancePhase::Failed).await;
    assert_eq!(
        ghost.status.unwrap().last_error.as_deref(),
        Some("nodes \"ghost\" not found")
    );
    // The held one: nmo goes on with it, and it ends once its budget allows.
    scale_web(&env, 3).await;
    let finished = env.wait_phase("nm-held", MaintenancePhase::Succeeded).await;
    // The policy that decided for it is recorded, though the Go operator
    // initialised its status (docs/policies.md: the choice is recorded).
    let policy = finished.status.unwrap().policy.unwrap_or_default();
    assert!(
        policy.starts_with("default@sha256:"),
        "status.policy: {policy:?}"
    );
    eprintln!(
        "the held maintenance finished under nmo {:.1} s after the switch began",
        switch.elapsed().as_secs_f64()
    );
    // No node was uncordoned meanwhile; no pod was evicted twice.
    let uncordoned: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, u)| (n == "worker-3" || *n == held) && !u)
        .map(|(n, _)| n.clone())
        .collect();
    assert!(
        uncordoned.is_empty(),
        "uncordoned during the switch: {uncordoned:?}"
    );
    let touched: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, u)| n == given_back && *u)
        .cloned()
        .collect();
    assert!(
        touched.is_empty(),
        "the Failed maintenance's node cordoned: {touched:?}"
    );
    let all = evictions(&env);
    let twice: Vec<_> = all.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "evicted twice: {twice:?}");
    assert!(
        all.len() > evicted_by_go.len(),
        "nmo evicted the pods the budget held: {all:?}"
    );

    // The way back: nmo stops, the Go CRD again, the Go operator ends the
    // maintenances and restores the nodes.
    nmo.abort();
    let _ = nmo.await;
    let back = std::time::Instant::now();
    env.cp
        .kubectl(&["replace", "-f", "-"], Some(&crd))
        .await
        .unwrap();
    // The guide's step 4: the owner references nmo gave the maintenances
    // go, with its own command.
    let owned = |nm: &nmo::crd::NodeMaintenance| {
        nm.metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| !o.is_empty())
    };
    let listed = env.nms().list(&Default::default()).await.unwrap().items;
    assert!(
        listed.iter().any(owned),
        "nmo gave its maintenances no owner"
    );
    let guide = std::fs::read_to_string(real::deploy_dir().join("../docs/migration.md")).unwrap();
    let step = blocks(&guide, "sh")
        .into_iter()
        .find(|b| b.contains("ownerReferences"))
        .expect("the guide's command that removes the owner references");
    let out = tokio::process::Command::new("sh")
        .args(["-ec", step])
        .env("KUBECONFIG", env.cp.kubeconfig_path())
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{step}: {}", printed(&out));
    let left: Vec<_> = env
        .nms()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(owned)
        .filter_map(|nm| nm.metadata.name)
        .collect();
    assert!(left.is_empty(), "still owned after {step}: {left:?}");
    let go = go_operator(&env, &logs.path().join("go-2.log"));
    let all_nms = ["nm-done", "nm-held", "nm-ghost", "nm-failed"];
    for name in all_nms {
        env.nms()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for name in all_nms {
        env.wait_gone(name).await;
    }
    for node in ["worker-3", held.as_str()] {
        let n = env.node(node).await;
        assert_ne!(
            n.spec.as_ref().and_then(|s| s.unschedulable),
            Some(true),
            "{node} restored by the Go operator"
        );
        assert!(
            taint_keys(&n).iter().all(|k| k != "medik8s.io/drain"),
            "{node}: {:?}",
            taint_keys(&n)
        );
    }
    eprintln!(
        "the way back: the Go CRD, the Go operator, every maintenance ended and its node restored in {:.1} s",
        back.elapsed().as_secs_f64()
    );
    stop(go).await;
    env.stop();
}

/// The way back, as docs/migration.md writes it: with deploy/default
/// installed and maintenances present, `kubectl delete -k
/// deploy/uninstall` removes nmo and keeps the CRD, every maintenance and
/// both namespaces (`kubectl delete -k deploy/default`, which the guide
/// once said, deleted them all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_way_back_keeps_every_maintenance() {
    let env = RealEnv::start_bare(Options::workers(2)).await;
    let guide = std::fs::read_to_string(real::deploy_dir().join("../docs/migration.md")).unwrap();
    let command = "kubectl delete -k deploy/uninstall";
    assert!(
        guide.contains(command),
        "the guide's way back is `{command}`"
    );
    // The kinds deploy/default holds beyond Kubernetes' own.
    let cert_manager =
        std::fs::read_to_string(env.cp.binaries().path("cert-manager-crds.yaml")).unwrap();
    env.cp.apply(&cert_manager).await.unwrap();
    let crd = std::fs::read_to_string(
        real::deploy_dir().join("crd/nodemaintenance.medik8s.io_nodemaintenances.yaml"),
    )
    .unwrap();
    env.cp.apply(&crd).await.unwrap();
    // Maintenances, made before the webhook is registered (no server
    // answers it here).
    for (name, node) in [
        ("nm-a", "worker-1"),
        ("nm-b", "worker-2"),
        ("nm-c", "ghost"),
    ] {
        env.create_nm(name, node).await;
    }
    let repo = real::deploy_dir().join("..");
    let kubectl = |args: &'static [&'static str]| {
        let repo = repo.clone();
        let kubeconfig = env.cp.kubeconfig_path();
        async move {
            let out = tokio::process::Command::new("kubectl")
                .args(args)
                .env("KUBECONFIG", kubeconfig)
                .current_dir(repo)
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-k",
        "deploy/default",
    ])
    .await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(env.admin.clone(), real::NAMESPACE);
    assert!(
        deployments
            .get_opt("node-maintenance-operator-controller-manager")
            .await
            .unwrap()
            .is_some()
    );
    kubectl(&["delete", "-k", "deploy/uninstall"]).await;
    assert_eq!(
        env.nms()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        3,
        "every maintenance kept"
    );
    assert!(
        deployments
            .get_opt("node-maintenance-operator-controller-manager")
            .await
            .unwrap()
            .is_none(),
        "nmo removed"
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.admin.clone());
    for ns in [real::NAMESPACE, "medik8s-leases"] {
        let kept = namespaces.get_opt(ns).await.unwrap();
        assert!(
            kept.is_some_and(|n| n.metadata.deletion_timestamp.is_none()),
            "namespace {ns} kept"
        );
    }
    let webhooks: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
        Api::all(env.admin.clone());
    assert!(
        webhooks
            .get_opt("node-maintenance-operator-validating-webhook-configuration")
            .await
            .unwrap()
            .is_none(),
        "the webhook goes with nmo (else it would refuse every maintenance)"
    );
    env.stop();
}
