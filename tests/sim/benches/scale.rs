//! The simulated cluster at scale: 1,000 nodes and 20,000 pods in memory.
//! Measures what the operator leans on: a field-selector list of one node's
//! pods, a watch of all pods, an eviction. Run with
//! `cargo bench -p nmo-sim --bench scale`; prints a table.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Client, Config};
use nmo_sim::{SimCluster, SimOptions};
use serde_json::json;

const NODES: usize = 1_000;
const PODS: usize = 20_000;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let c = SimCluster::start(SimOptions::default())
        .await
        .expect("start");
    let seeded = Instant::now();
    for n in 0..NODES {
        c.add_node(&format!("node-{n:04}")).unwrap();
    }
    for i in 0..PODS {
        c.create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{i:05}"), "namespace": "default",
                         "labels": {"app": format!("app-{}", i % 50), "tier": "web"}},
            "spec": {"nodeName": format!("node-{:04}", i % NODES), "containers": [{"name": "c", "image": "nginx"}]},
        }))
        .unwrap();
    }
    let seed_time = seeded.elapsed();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&c.kubeconfig()).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    let client = Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let all: Api<Pod> = Api::all(client);

    // Wait until the kubelet has started every pod.
    let started = Instant::now();
    loop {
        let running = c
            .list("v1", "Pod")
            .unwrap()
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        if running == PODS {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "pods did not start"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let startup = started.elapsed();

    let mut full = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let l = all.list(&ListParams::default()).await.unwrap();
        assert_eq!(l.items.len(), PODS);
        full.push(t.elapsed());
    }
    let mut by_node = Vec::new();
    for n in 0..50 {
        let t = Instant::now();
        let l = all
            .list(&ListParams::default().fields(&format!("spec.nodeName=node-{:04}", n * 7)))
            .await
            .unwrap();
        assert_eq!(l.items.len(), PODS / NODES);
        by_node.push(t.elapsed());
    }

    // A watch of all pods from now: how fast do 2,000 changes arrive?
    let rv = all
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = all
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let changes = 2_000;
    let t = Instant::now();
    let writer = {
        let pods = pods.clone();
        tokio::spawn(async move {
            for i in 0..changes {
                pods.patch(
                    &format!("pod-{:05}", i * 7),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
                )
                .await
                .unwrap();
            }
        })
    };
    let mut seen = 0;
    while seen < changes {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
            Ok(Some(Ok(WatchEvent::Modified(_)))) => seen += 1,
            Ok(Some(Ok(_))) => {}
            other => panic!("watch ended early: {other:?}"),
        }
    }
    writer.await.unwrap();
    let watch_time = t.elapsed();

    let mut evictions = Vec::new();
    for i in 0..200 {
        let t = Instant::now();
        pods.evict(&format!("pod-{:05}", i * 97 + 1), &EvictParams::default())
            .await
            .unwrap();
        evictions.push(t.elapsed());
    }

    println!("nmo-sim at scale: {NODES} nodes, {PODS} pods (release build, 2 cores)");
    println!(
        "{:<52} {}",
        "seed (create every node and pod in-process)",
        ms(seed_time)
    );
    println!(
        "{:<52} {}",
        "kubelet starts all pods (Pending -> Running)",
        ms(startup)
    );
    println!(
        "{:<52} {}",
        "list all pods over HTTP (median of 5)",
        ms(median(full))
    );
    println!(
        "{:<52} {}",
        "list one node's pods, fieldSelector (median of 50)",
        ms(median(by_node))
    );
    println!(
        "{:<52} {} ({:.0} events/s)",
        format!("watch all pods: {changes} patches seen"),
        ms(watch_time),
        changes as f64 / watch_time.as_secs_f64()
    );
    println!(
        "{:<52} {}",
        "eviction, no PDB (median of 200)",
        ms(median(evictions))
    );
    c.stop().await;
}
