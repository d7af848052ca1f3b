//! Admission at the size of a real cluster, on the real control plane
//! (kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok):
//! `cargo bench -p nmo --bench fleet_real`. `NMO_BENCH_NODES` kwok nodes
//! (default 1000) and `NMO_BENCH_MAINTENANCES` NodeMaintenances (default
//! 100, at most a tenth of the nodes) created at once under the shipped
//! `max-unavailable` policy at 10 %.
//! Prints the time for all to succeed, the operator's API requests (from
//! the real API server's audit log, by its User-Agent) per maintenance and
//! how many of them were lists of the nodes, the admission decision's mean
//! time, and what one list of all the nodes costs (what every admission
//! cost before the fleet came from the controller's node watch).

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use nmo::controller::{self, Context, Settings};
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};
use nmo::policy::{Decision, EngineConfig, PolicyEngine, PolicyStore};
use nmo_control_plane::{ControlPlane, Options};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The operator's requests so far, `verb resource`.
fn operator_requests(cp: &ControlPlane) -> Vec<String> {
    cp.audit()
        .into_iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT)
        .map(|r| {
            let path = r.uri.split('?').next().unwrap_or_default().to_owned();
            let resource = path
                .split('/')
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>();
            // /api/v1/nodes, /apis/g/v/namespaces/ns/res/name/sub...
            let kind = resource
                .iter()
                .skip(if path.starts_with("/api/") { 2 } else { 3 })
                .enumerate()
                .filter(|(i, _)| i % 2 == 0)
                .map(|(_, s)| *s)
                .filter(|s| *s != "namespaces")
                .collect::<Vec<_>>()
                .join("/");
            let kind = if kind.is_empty() {
                "namespaces".to_owned()
            } else {
                kind
            };
            format!("{} {kind}", r.verb)
        })
        .collect()
}

/// `nm-<i>` on `worker-<i>` for each i, 32 requests at a time.
async fn create_maintenances(nms: &Api<NodeMaintenance>, which: std::ops::RangeInclusive<usize>) {
    stream::iter(which)
        .for_each_concurrent(32, |i| {
            let nms = nms.clone();
            async move {
                let nm = NodeMaintenance::new(
                    &format!("nm-{i}"),
                    NodeMaintenanceSpec {
                        node_name: format!("worker-{i}"),
                        reason: None,
                    },
                );
                nms.create(&PostParams::default(), &nm).await.unwrap();
            }
        })
        .await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = env_usize("NMO_BENCH_NODES", 1000);
    // At most the 10 % the policy lets be unavailable at once: a
    // Succeeded maintenance holds its node until it is deleted, so more
    // would wait for good.
    let maintenances = env_usize("NMO_BENCH_MAINTENANCES", 100).min(nodes / 10);
    let t = Instant::now();
    let cp = ControlPlane::start(Options {
        audit: true,
        ..Options::workers(nodes)
    })
    .await
    .expect("the real control plane starts");
    eprintln!(
        "{nodes} kwok nodes Ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let admin = cp.client().await.unwrap();
    cp.apply(&nmo::crd::crd_yaml()).await.unwrap();

    // What one list of every node costs (each admission's price before).
    let t = Instant::now();
    let listed = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let list_time = t.elapsed();
    let list_bytes = serde_json::to_vec(&listed).map(|b| b.len()).unwrap_or(0);

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        std::path::Path::new(env!("NMO_POLICY_WASM_DIR")).join("nmo_policy_max_unavailable.wasm"),
        dir.path().join("max-unavailable.wasm"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("policies.yaml"),
        "default: max-unavailable\nsettings:\n  max-unavailable:\n    max: 10%\n",
    )
    .unwrap();
    let metrics = nmo::registry::OperatorMetrics::register().unwrap();
    let engine =
        PolicyEngine::with_metrics(EngineConfig::default(), metrics.policy.clone()).unwrap();
    let policies = PolicyStore::from_dir(engine, dir.path(), None).unwrap();
    let load_policies = || {
        let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
        PolicyStore::from_dir(engine, dir.path(), None).unwrap()
    };
    let ctx = operator_context(&cp, policies, 64).await;
    let first = tokio::spawn(controller::run(ctx.clone()));
    // The controller's caches are up before counting.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ctx.synced() {
        assert!(Instant::now() < deadline, "the controller never synced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = operator_requests(&cp).len();

    let nms: Api<NodeMaintenance> = Api::all(admin.clone());
    let t = Instant::now();
    create_maintenances(&nms, 1..=maintenances).await;
    let created = t.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = nms
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|nm| {
                nm.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded)
            })
            .count();
        if done == maintenances {
            break;
        }
        assert!(Instant::now() < deadline, "{done}/{maintenances} succeeded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_done = t.elapsed();
    let requests: Vec<String> = operator_requests(&cp).split_off(before);
    let node_lists = requests.iter().filter(|r| *r == "list nodes").count();
    let (admits, admit_seconds) = metrics.policy.timed(Decision::Admit);
    let mut by_kind = std::collections::BTreeMap::<&str, usize>::new();
    for r in &requests {
        *by_kind.entry(r.as_str()).or_default() += 1;
    }

    println!(
        "real control plane (Kubernetes {}, kwok), {nodes} nodes, {maintenances} NodeMaintenances at once, max-unavailable 10 %:",
        nmo_control_plane::versions()
            .iter()
            .find(|(k, _)| *k == "KUBERNETES_VERSION")
            .map_or("?", |(_, v)| *v)
    );
    println!("| what | figure |");
    println!("|---|---:|");
    println!("| created in | {:.2} s |", created.as_secs_f64());
    println!("| all Succeeded after | {:.2} s |", all_done.as_secs_f64());
    println!(
        "| operator API requests | {} ({:.1} per maintenance) |",
        requests.len(),
        requests.len() as f64 / maintenances as f64
    );
    println!("| of them lists of the nodes | {node_lists} |");
    println!(
        "| admit decisions | {admits}, mean {:.2} ms |",
        if admits == 0 {
            0.0
        } else {
            admit_seconds / admits as f64 * 1e3
        }
    );
    println!(
        "| one list of the {nodes} nodes (each admission's cost before the node watch) | {:.0} ms, {:.1} MiB |",
        list_time.as_secs_f64() * 1e3,
        list_bytes as f64 / (1 << 20) as f64
    );
    for (what, n) in by_kind {
        println!("|   {what} | {n} |");
    }
    if std::env::var("NMO_BENCH_RESTART").as_deref() != Ok("0") {
        restart(&cp, &nms, first, load_policies(), nodes).await;
    }
    cp.stop();
}

/// The operator's context on the control plane, as the binary makes it:
/// its own metrics registry, `max_concurrent` reconciles at once.
async fn operator_context(
    cp: &ControlPlane,
    policies: std::sync::Arc<PolicyStore>,
    max_concurrent: u16,
) -> std::sync::Arc<Context> {
    let metrics = nmo::registry::OperatorMetrics::register().unwrap();
    let operator = nmo::client::client_from_kubeconfig(&cp.kubeconfig())
        .await
        .unwrap();
    Context::new(
        operator,
        policies,
        Settings {
            max_concurrent,
            ..Settings::default()
        },
        metrics.controller.clone(),
    )
}

/// An operator that starts with a NodeMaintenance on every node present
/// (a tenth of them Succeeded, the rest waiting for the policy): how long
/// until it is ready, and what its first minute costs the API server. (Its
/// memory is not told apart here: it shares the process with the
/// benchmark, which reads the audit log.)
async fn restart(
    cp: &ControlPlane,
    nms: &Api<NodeMaintenance>,
    first: tokio::task::JoinHandle<nmo::Result<()>>,
    policies: std::sync::Arc<PolicyStore>,
    nodes: usize,
) {
    let present = nms.list(&ListParams::default()).await.unwrap().items.len();
    create_maintenances(nms, present + 1..=nodes).await;
    // The first operator sees them all (each waiting says so) before it goes.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let listed = nms.list(&ListParams::default()).await.unwrap().items;
        let seen = listed
            .iter()
            .filter(|nm| {
                nm.status
                    .as_ref()
                    .is_some_and(|s| s.waiting.is_some() || s.phase.is_some())
            })
            .count();
        if seen == nodes {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{seen}/{nodes} seen by the operator"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    first.abort();
    let _ = first.await;
    let before = operator_requests(cp).len();
    let ctx = operator_context(cp, policies, 10).await;
    let t = Instant::now();
    let second = tokio::spawn(controller::run(ctx.clone()));
    while !ctx.synced() {
        assert!(t.elapsed() < Duration::from_secs(120), "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready = t.elapsed();
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(t.elapsed())).await;
    let minute: Vec<String> = operator_requests(cp).split_off(before);
    let mut by_kind = std::collections::BTreeMap::<&str, usize>::new();
    for r in &minute {
        *by_kind.entry(r.as_str()).or_default() += 1;
    }
    println!();
    println!(
        "an operator starting with {nodes} NodeMaintenances present ({} Succeeded, the rest waiting):",
        nodes / 10
    );
    println!("| what | figure |");
    println!("|---|---:|");
    println!(
        "| start to ready (caches synced) | {:.2} s |",
        ready.as_secs_f64()
    );
    println!("| API requests in its first minute | {} |", minute.len());
    for (what, n) in by_kind {
        println!("|   {what} | {n} |");
    }
    second.abort();
}
