//! The fleet at the size of a real cluster, on the real control plane
//! (kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok):
//! `cargo bench -p nmo --bench fleet_real`. `NMO_BENCH_NODES` kwok nodes
//! (default 1000) with `NMO_BENCH_PODS_PER_NODE` pods each (default 30:
//! 30,000 pods), the real `nmo` binary as a local process with the
//! Deployment's own arguments (plain-HTTP metrics on a loopback port, no
//! leader election: one replica), the shipped `max-unavailable` policy at
//! 10 %:
//! - one maintenance alone (the floor: under a 10 % limit all of the
//!   maintenances below are admitted at once, so none need wait longer
//!   than one takes alone), its requests;
//! - `NMO_BENCH_MAINTENANCES` created at once (default 100, at most a
//!   tenth of the nodes): time for all to succeed against that floor, the
//!   operator's requests (from the real API server's audit log, by its
//!   User-Agent) per maintenance against the one alone, requests per
//!   second, lists of the nodes, the admission decision's time (the
//!   binary's own `nmo_policy_evaluation_seconds`), resident memory and
//!   CPU;
//! - an operator that starts with a maintenance on every node: start to
//!   ready, its first minute's requests, its memory
//!   (`NMO_BENCH_RESTART=0` skips it).
//!
//! `NMO_BENCH_KEEP=<dir>` keeps the API server's audit log of the run up
//! to the restart there (`fleet_real.audit.log`).

use std::time::{Duration, Instant};

mod common;

use common::{
    cpu_ticks, free_port, http_get, metric, proc_status_kib, seen, start_binary, stop_binary,
    wait_nms,
};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};
use nmo_control_plane::{ControlPlane, Options};
use serde_json::json;

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
        .map(|r| common::verb_resource(&r.verb, &r.uri))
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
    let per_node = env_usize("NMO_BENCH_PODS_PER_NODE", 30);
    // At most the 10 % the policy lets be unavailable at once (less the
    // one alone, which is deleted first): a Succeeded maintenance holds
    // its node until it is deleted, so more would wait for good.
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
    common::install_crd(&cp).await;
    let t = Instant::now();
    seed_pods(&admin, nodes, per_node).await;
    eprintln!(
        "{} pods created and Running in {:.1} s",
        nodes * per_node,
        t.elapsed().as_secs_f64()
    );

    // What one list of every node costs (each admission's price before).
    let t = Instant::now();
    let listed = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let list_time = t.elapsed();
    let list_bytes = serde_json::to_vec(&listed).map(|b| b.len()).unwrap_or(0);

    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    std::fs::copy(
        std::path::Path::new(env!("NMO_POLICY_WASM_DIR")).join("nmo_policy_max_unavailable.wasm"),
        policies.join("max-unavailable.wasm"),
    )
    .unwrap();
    std::fs::write(
        policies.join("policies.yaml"),
        "default: max-unavailable\nsettings:\n  max-unavailable:\n    max: 10%\n",
    )
    .unwrap();
    let operator = Operator::start(&cp, dir.path()).await;

    let nms: Api<NodeMaintenance> = Api::all(admin.clone());
    // One alone: the floor, and the requests of one maintenance.
    let before = operator_requests(&cp).len();
    let t = Instant::now();
    create_maintenances(&nms, 1..=1).await;
    wait_all_succeeded(&nms, 1).await;
    let alone = t.elapsed();
    let alone_requests = operator_requests(&cp).len() - before;
    let alone_kinds = by_kind(&operator_requests(&cp)[before..]);
    nms.delete("nm-1", &DeleteParams::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while nms.get_opt("nm-1").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "nm-1 was never removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The floor of the many: a bare loop evicting as many nodes' pods
    // (other nodes, 64 evictions at a time) and waiting for them to go.
    let floor_nodes: Vec<String> = (maintenances + 2..=2 * maintenances + 1)
        .map(|i| format!("worker-{i}"))
        .collect();
    let floor = many_floor(&admin, &floor_nodes, per_node).await;

    let before = operator_requests(&cp).len();
    let (admits_before, admit_seconds_before) = operator.admissions().await;
    let ticks_before = cpu_ticks(operator.pid);
    let t = Instant::now();
    create_maintenances(&nms, 2..=maintenances + 1).await;
    let created = t.elapsed();
    wait_all_succeeded(&nms, maintenances).await;
    let all_done = t.elapsed();
    let cpu_seconds = (cpu_ticks(operator.pid) - ticks_before) as f64 / 100.0;
    let rss_peak_mib = proc_status_kib(operator.pid, "VmHWM:") as f64 / 1024.0;
    let (admits, admit_seconds) = operator.admissions().await;
    let (admits, admit_seconds) = (admits - admits_before, admit_seconds - admit_seconds_before);
    let requests: Vec<String> = operator_requests(&cp).split_off(before);
    let node_lists = requests.iter().filter(|r| *r == "list nodes").count();
    let per_maintenance = requests.len() as f64 / maintenances as f64;

    println!(
        "real control plane (Kubernetes {}, kwok), {nodes} nodes, {} pods ({per_node} a node), the nmo binary, {maintenances} NodeMaintenances at once, max-unavailable 10 %:",
        common::kubernetes_version(),
        nodes * per_node
    );
    println!("| what | figure | goal |");
    println!("|---|---:|---|");
    println!(
        "| one maintenance alone (the floor) | {:.2} s, {alone_requests} requests | |",
        alone.as_secs_f64()
    );
    println!(
        "| {maintenances} created in | {:.2} s | |",
        created.as_secs_f64()
    );
    println!(
        "| the floor: {} pods of {maintenances} other nodes evicted by a bare loop, 64 at a time, until gone | {:.2} s | |",
        maintenances * per_node,
        floor.as_secs_f64()
    );
    println!(
        "| all Succeeded after | {:.2} s ({:.2}x the floor, {:.1}x one alone) | ≤ 1.2x the floor: {} |",
        all_done.as_secs_f64(),
        all_done.as_secs_f64() / floor.as_secs_f64(),
        all_done.as_secs_f64() / alone.as_secs_f64(),
        met(all_done.as_secs_f64() <= 1.2 * floor.as_secs_f64())
    );
    let ratio = per_maintenance / alone_requests as f64;
    println!(
        "| operator API requests | {} ({per_maintenance:.1} per maintenance, {ratio:.2}x the one alone) | no more than at 1 node +10 %: {} |",
        requests.len(),
        met(ratio <= 1.10)
    );
    println!(
        "| requests per second | {:.1} | |",
        requests.len() as f64 / all_done.as_secs_f64()
    );
    println!("| of them lists of the nodes | {node_lists} | |");
    println!(
        "| admit decisions | {admits}, mean {:.2} ms | |",
        if admits == 0 {
            0.0
        } else {
            admit_seconds / admits as f64 * 1e3
        }
    );
    println!(
        "| operator resident memory, peak (VmHWM) | {rss_peak_mib:.1} MiB | ≤ 150 MiB: {} |",
        met(rss_peak_mib <= 150.0)
    );
    println!(
        "| operator CPU | {cpu_seconds:.2} s ({:.0} % of a core over the run) | |",
        cpu_seconds / all_done.as_secs_f64() * 100.0
    );
    println!(
        "| one list of the {nodes} nodes (each admission's cost before the node watch) | {:.0} ms, {:.1} MiB | |",
        list_time.as_secs_f64() * 1e3,
        list_bytes as f64 / (1 << 20) as f64
    );
    let many_kinds = by_kind(&requests);
    println!("| requests by kind | {maintenances} at once | one alone |");
    for (what, n) in &many_kinds {
        println!(
            "|   {what} | {n} | {} |",
            alone_kinds.get(what).copied().unwrap_or(0)
        );
    }
    // NMO_BENCH_KEEP: the API server's audit log up to here, to take the
    // run's time apart.
    if let Ok(keep) = std::env::var("NMO_BENCH_KEEP") {
        let to = std::path::Path::new(&keep).join("fleet_real.audit.log");
        if let Err(e) = std::fs::copy(cp.dir().join("audit.log"), &to) {
            eprintln!("keeping the audit log as {}: {e}", to.display());
        }
    }
    if std::env::var("NMO_BENCH_RESTART").as_deref() != Ok("0") {
        restart(&cp, &nms, operator, dir.path(), nodes).await;
    }
    cp.stop();
}

/// Requests counted by `verb resource`.
fn by_kind(requests: &[String]) -> std::collections::BTreeMap<String, usize> {
    let mut kinds = std::collections::BTreeMap::new();
    for r in requests {
        *kinds.entry(r.clone()).or_default() += 1;
    }
    kinds
}

/// Evicts every pod of `nodes` (`<node>-p000`…), 64 at a time, and waits
/// until none is left on them.
async fn many_floor(client: &Client, nodes: &[String], per_node: usize) -> Duration {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    stream::iter(
        nodes
            .iter()
            .flat_map(|n| (0..per_node).map(move |i| format!("{n}-p{i:03}"))),
    )
    .for_each_concurrent(64, |name| {
        let pods = pods.clone();
        async move {
            let _ = pods.evict(&name, &Default::default()).await;
        }
    })
    .await;
    for node in nodes {
        common::wait_empty(client, node).await;
    }
    t.elapsed()
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// `per_node` bare pods on each of `worker-1` … `worker-<nodes>`, bound
/// to their node (the scheduler's share is not what is measured), 64
/// requests at a time; waits until kwok runs them all.
async fn seed_pods(client: &Client, nodes: usize, per_node: usize) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    stream::iter((1..=nodes).flat_map(|n| (0..per_node).map(move |i| (n, i))))
        .for_each_concurrent(64, |(n, i)| {
            let pods = pods.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("worker-{n}-p{i:03}"), "namespace": "default"},
                    "spec": {"nodeName": format!("worker-{n}"), "containers": [{"name": "c", "image": "i"}]},
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let running = Api::<Pod>::all(client.clone())
            .list_metadata(&ListParams::default().fields("status.phase=Running"))
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        if running == nodes * per_node {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{running}/{} pods running",
            nodes * per_node
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Waits until `count` maintenances have Succeeded (10 minutes at most).
async fn wait_all_succeeded(nms: &Api<NodeMaintenance>, count: usize) {
    wait_nms(nms, count, Duration::from_secs(600), "succeeded", |nm| {
        nm.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded)
    })
    .await;
}

/// The `nmo` binary as its Deployment runs it (the policy directory, the
/// compiled-policy cache, metrics served), here on loopback ports.
struct Operator {
    child: tokio::process::Child,
    pid: u32,
    metrics_port: u16,
    ready_after: Duration,
}

impl Operator {
    async fn start(cp: &ControlPlane, dir: &std::path::Path) -> Operator {
        let metrics_port = free_port();
        let (child, ready_after) = start_binary(
            &cp.kubeconfig_path(),
            &dir.join("cache"),
            &[
                format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
                format!("--policy-dir={}", dir.join("policies").display()),
                std::env::var("NMO_BENCH_ZAP")
                    .unwrap_or_else(|_| "--zap-log-level=info".to_owned()),
            ],
        )
        .await;
        let pid = child.id().unwrap();
        Operator {
            child,
            pid,
            metrics_port,
            ready_after,
        }
    }

    /// Admission decisions so far, and the seconds they took.
    async fn admissions(&self) -> (u64, f64) {
        let page = http_get(self.metrics_port, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default();
        (
            metric(
                &page,
                r#"nmo_policy_evaluation_seconds_count{function="admit"}"#,
            ) as u64,
            metric(
                &page,
                r#"nmo_policy_evaluation_seconds_sum{function="admit"}"#,
            ),
        )
    }

    async fn stop(self) {
        stop_binary(self.child).await;
    }
}

/// An operator that starts with a NodeMaintenance on every node present
/// (a tenth of them Succeeded, the rest waiting for the policy): how long
/// until it is ready, what its first minute costs the API server, and its
/// memory.
async fn restart(
    cp: &ControlPlane,
    nms: &Api<NodeMaintenance>,
    first: Operator,
    dir: &std::path::Path,
    nodes: usize,
) {
    let present = nms.list(&ListParams::default()).await.unwrap().items.len();
    create_maintenances(nms, present + 2..=nodes).await;
    create_maintenances(nms, 1..=1).await;
    // The first operator sees them all (each waiting says so) before it goes.
    wait_nms(
        nms,
        nodes,
        Duration::from_secs(300),
        "seen by the operator",
        seen,
    )
    .await;
    // The node lifecycle controller takes the `not-ready` taint off new
    // nodes a few a second: a thousand nodes change for minutes after the
    // start, and each change is one the policy sees. The restart is
    // measured on a settled fleet; what the first operator decided while
    // it settled is printed too.
    let (settle_admits, _) = first.admissions().await;
    let t = Instant::now();
    let nodes_api: Api<Node> = Api::all(nms.clone().into_client());
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let tainted = nodes_api
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|n| {
                        n.spec
                            .as_ref()
                            .and_then(|s| s.taints.as_ref())
                            .is_some_and(|t| {
                                t.iter().any(|t| t.key == "node.kubernetes.io/not-ready")
                            })
                    })
                    .count()
            })
            .unwrap_or(usize::MAX);
        if tainted == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{tainted} nodes still not-ready");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let settled_after = t.elapsed();
    let (settled_admits, _) = first.admissions().await;
    first.stop().await;
    let before = operator_requests(cp).len();
    let t = Instant::now();
    let second = Operator::start(cp, dir).await;
    let ticks = cpu_ticks(second.pid);
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(t.elapsed())).await;
    let cpu_seconds = (cpu_ticks(second.pid) - ticks) as f64 / 100.0;
    let (admits, admit_seconds) = second.admissions().await;
    let rss_mib = proc_status_kib(second.pid, "VmRSS:") as f64 / 1024.0;
    let peak_mib = proc_status_kib(second.pid, "VmHWM:") as f64 / 1024.0;
    let minute: Vec<String> = operator_requests(cp).split_off(before);
    println!();
    println!(
        "the nmo binary starting with {nodes} NodeMaintenances present ({} Succeeded, the rest waiting):",
        nodes / 10
    );
    println!("| what | figure | goal |");
    println!("|---|---:|---|");
    println!(
        "| start to ready (`/readyz` 200: caches synced) | {:.2} s | ≤ 10 s: {} |",
        second.ready_after.as_secs_f64(),
        met(second.ready_after <= Duration::from_secs(10))
    );
    println!(
        "| before it: the first operator while the node lifecycle controller took the `not-ready` taint off the last nodes | {:.0} s, {} admit decisions | |",
        settled_after.as_secs_f64(),
        settled_admits - settle_admits
    );
    println!("| API requests in its first minute | {} | |", minute.len());
    println!(
        "| resident memory after a minute, peak | {rss_mib:.1} MiB, {peak_mib:.1} MiB | ≤ 150 MiB: {} |",
        met(peak_mib <= 150.0)
    );
    println!("| CPU in its first minute | {cpu_seconds:.2} s | |");
    println!("| admit decisions in its first minute | {admits}, {admit_seconds:.2} s in all | |");
    for (what, n) in by_kind(&minute) {
        println!("|   {what} | {n} | |");
    }
    second.stop().await;
}
