//! Drains on one simulated cluster, in one run, so the machine's noise
//! cancels:
//! - 1,000 pods off one node: nmo (NodeMaintenance to Succeeded) against the
//!   real `kubectl drain --ignore-daemonsets --delete-emptydir-data --force`
//!   on an identical node, against the floor (a bare loop evicting the same
//!   pods as fast as the server allows and waiting for them to go);
//! - 50 nodes x 20 pods: 50 NodeMaintenances at once against one.
//!
//! Run with `cargo bench -p nmo --bench drain`; prints a table with ratios.

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, ListParams, PostParams};
use kube::{Client, Config};
use nmo::controller::{self, Context, Settings};
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};
use nmo::policy::{EngineConfig, PolicyEngine};
use nmo_sim::{SimCluster, SimOptions};
use serde_json::json;

const PODS: usize = 1_000;

fn seed_pods(c: &SimCluster, node: &str, count: usize) {
    for i in 0..count {
        c.create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{node}-p{i:04}"), "namespace": "default", "labels": {"app": "bench"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
    }
}

async fn pods_left(client: &Client, node: &str) -> usize {
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map(|l| l.items.len())
        .unwrap_or(usize::MAX)
}

async fn wait_empty(client: &Client, node: &str) {
    while pods_left(client, node).await > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_succeeded(api: &Api<NodeMaintenance>, names: &[String]) {
    for name in names {
        loop {
            let phase = api
                .get(name)
                .await
                .ok()
                .and_then(|n| n.status)
                .and_then(|s| s.phase);
            if phase == Some(MaintenancePhase::Succeeded) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn create_nms(api: &Api<NodeMaintenance>, nodes: &[String]) -> Vec<String> {
    let mut names = Vec::new();
    for node in nodes {
        let name = format!("nm-{node}");
        api.create(
            &PostParams::default(),
            &NodeMaintenance::new(
                &name,
                NodeMaintenanceSpec {
                    node_name: node.clone(),
                    reason: None,
                },
            ),
        )
        .await
        .unwrap();
        names.push(name);
    }
    names
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let c = SimCluster::start(SimOptions {
        time_scale: 1.0,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    c.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
    for n in [
        "nmo-node",
        "kubectl-node",
        "floor-node",
        "spare-1",
        "spare-2",
    ] {
        c.add_node(n).unwrap();
    }
    for n in 0..51 {
        c.add_node(&format!("many-{n:02}")).unwrap();
    }
    for n in ["nmo-node", "kubectl-node", "floor-node"] {
        seed_pods(&c, n, PODS);
    }
    for n in 0..51 {
        seed_pods(&c, &format!("many-{n:02}"), 20);
    }
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&c.kubeconfig()).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    let client = Client::try_from(config).unwrap();
    let policy = PolicyEngine::new(EngineConfig::default())
        .unwrap()
        .default_policy()
        .unwrap();
    let ctx = Context::new(
        client.clone(),
        nmo::policy::PolicyStore::single(policy),
        Settings {
            max_concurrent: 64,
            ..Settings::default()
        },
    );
    tokio::spawn(controller::run(ctx));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let nms: Api<NodeMaintenance> = Api::all(client.clone());

    // nmo
    let t = Instant::now();
    let names = create_nms(&nms, &["nmo-node".to_string()]).await;
    wait_succeeded(&nms, &names).await;
    let nmo_time = t.elapsed();

    // kubectl drain
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    c.write_kubeconfig(&kc).unwrap();
    let t = Instant::now();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .args([
            "drain",
            "kubectl-node",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
            "--timeout=600s",
        ])
        .output()
        .await
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl drain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kubectl_time = t.elapsed();

    // The floor: evict everything, 64 at a time, and wait for the node to be empty.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    stream::iter(0..PODS)
        .for_each_concurrent(64, |i| {
            let pods = pods.clone();
            async move {
                let _ = pods
                    .evict(&format!("floor-node-p{i:04}"), &EvictParams::default())
                    .await;
            }
        })
        .await;
    wait_empty(&client, "floor-node").await;
    let floor_time = t.elapsed();

    // One node of 20 pods, then 50 at once.
    let t = Instant::now();
    let one = create_nms(&nms, &["many-50".to_string()]).await;
    wait_succeeded(&nms, &one).await;
    let one_time = t.elapsed();
    let fifty: Vec<String> = (0..50).map(|n| format!("many-{n:02}")).collect();
    let t = Instant::now();
    let names = create_nms(&nms, &fifty).await;
    wait_succeeded(&nms, &names).await;
    let fifty_time = t.elapsed();

    let s = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    println!(
        "drain benchmark on the simulated cluster (release build, 2 cores; pods exit 0.5 s after SIGTERM)"
    );
    println!(
        "{:<58} {:>9}",
        format!("{PODS} pods, nmo (NodeMaintenance -> Succeeded)"),
        s(nmo_time)
    );
    println!(
        "{:<58} {:>9}",
        format!("{PODS} pods, kubectl drain"),
        s(kubectl_time)
    );
    println!(
        "{:<58} {:>9}",
        format!("{PODS} pods, floor (bare eviction loop)"),
        s(floor_time)
    );
    println!(
        "ratios: nmo / kubectl = {:.3}x (goal <= 1.0x), nmo / floor = {:.2}x (goal <= 1.5x)",
        nmo_time.as_secs_f64() / kubectl_time.as_secs_f64(),
        nmo_time.as_secs_f64() / floor_time.as_secs_f64()
    );
    println!("{:<58} {:>9}", "1 node x 20 pods", s(one_time));
    println!(
        "{:<58} {:>9}",
        "50 nodes x 20 pods, 50 NodeMaintenances at once",
        s(fifty_time)
    );
    println!(
        "ratio: 50 at once / 1 = {:.2}x (goal <= 2x)",
        fifty_time.as_secs_f64() / one_time.as_secs_f64()
    );
    c.stop().await;
}
