//! The drain benchmark's speed cases on the real control plane
//! (kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok):
//! `cargo bench -p nmo --bench drain_real`. Prints nmo's time against the
//! floor (a bare loop evicting 64 at a time and waiting for the node to
//! empty) and the operator's API requests per pod, counted from the real
//! API server's audit log by the operator's User-Agent, beside the
//! nmo-sim figures of `--bench drain` (README, Performance).
//!
//! `NMO_BENCH_PODS` (default 1000) sets the pods per node.

use std::time::{Duration, Instant};

mod common;

use common::{floor, seed_kwok_pods as seed, wait_running, wait_succeeded};
use kube::Client;
use kube::api::{Api, PostParams};
use nmo::controller::{self, Context, Settings};
use nmo::crd::{NodeMaintenance, NodeMaintenanceSpec};
use nmo::policy::{EngineConfig, PolicyEngine};
use nmo_control_plane::{ControlPlane, NodeSpec, Options};

async fn nmo(cp: &ControlPlane, client: &Client, node: &str) -> (Duration, usize) {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let before = operator_requests(cp);
    let name = format!("nm-{node}");
    let t = Instant::now();
    nms.create(
        &PostParams::default(),
        &NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                node_name: node.to_owned(),
                reason: None,
            },
        ),
    )
    .await
    .unwrap();
    wait_succeeded(&nms, std::slice::from_ref(&name)).await;
    let took = t.elapsed();
    (took, operator_requests(cp) - before)
}

fn operator_requests(cp: &ControlPlane) -> usize {
    cp.audit()
        .iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT)
        .count()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pods: usize = std::env::var("NMO_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let nodes = [
        "nmo-node",
        "floor-node",
        "slow-node",
        "slow-floor-node",
        "spare",
    ];
    let cp = ControlPlane::start(Options {
        nodes: nodes.iter().map(|n| NodeSpec::new(*n)).collect(),
        audit: true,
        ..Options::default()
    })
    .await
    .expect("the real control plane starts");
    let admin = cp.client().await.unwrap();
    common::install_crd(&cp).await;
    let t = Instant::now();
    seed(&admin, "nmo-node", pods, "0s").await;
    seed(&admin, "floor-node", pods, "0s").await;
    seed(&admin, "slow-node", 200, "2s").await;
    seed(&admin, "slow-floor-node", 200, "2s").await;
    for (n, c) in [
        ("nmo-node", pods),
        ("floor-node", pods),
        ("slow-node", 200),
        ("slow-floor-node", 200),
    ] {
        wait_running(&admin, n, c).await;
    }
    eprintln!(
        "seeded {} pods in {:.1} s",
        2 * pods + 400,
        t.elapsed().as_secs_f64()
    );

    let operator = nmo::client::client_from_kubeconfig(&cp.kubeconfig())
        .await
        .unwrap();
    let policy = PolicyEngine::new(EngineConfig::default())
        .unwrap()
        .default_policy()
        .unwrap();
    let ctx = Context::new(
        operator,
        nmo::policy::PolicyStore::single(policy),
        Settings {
            max_concurrent: 64,
            ..Settings::default()
        },
        nmo::registry::OperatorMetrics::register()
            .unwrap()
            .controller,
    );
    tokio::spawn(controller::run(ctx));

    let floor_time = floor(&admin, "floor-node", pods).await;
    let (nmo_time, requests) = nmo(&cp, &admin, "nmo-node").await;
    let slow_floor = floor(&admin, "slow-floor-node", 200).await;
    let (slow_nmo, _) = nmo(&cp, &admin, "slow-node").await;

    println!(
        "real control plane (Kubernetes {}, kwok), release build, 2 cores:",
        common::kubernetes_version()
    );
    println!("| what | time | ratio |");
    println!("|---|---:|---|");
    println!(
        "| {pods} pods, floor | {:.2} s | |",
        floor_time.as_secs_f64()
    );
    println!(
        "| {pods} pods, nmo | {:.2} s | nmo / floor = {:.2}x |",
        nmo_time.as_secs_f64(),
        nmo_time.as_secs_f64() / floor_time.as_secs_f64()
    );
    println!(
        "| API requests, the {pods}-pod drain | {requests} | {:.2} per pod |",
        requests as f64 / pods as f64
    );
    println!(
        "| 200 pods that take 2 s to stop, floor | {:.2} s | |",
        slow_floor.as_secs_f64()
    );
    println!(
        "| 200 pods that take 2 s to stop, nmo | {:.2} s | nmo / floor = {:.2}x |",
        slow_nmo.as_secs_f64(),
        slow_nmo.as_secs_f64() / slow_floor.as_secs_f64()
    );
    cp.stop();
}
