//! What the drain benchmarks share, on either cluster: the floor (a bare
//! loop evicting 64 at a time, then waiting for the node to empty).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, EvictParams, ListParams, PostParams};
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};

/// Pods left on `node` (`usize::MAX` when the list fails).
pub async fn pods_left(client: &Client, node: &str) -> usize {
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map(|l| l.items.len())
        .unwrap_or(usize::MAX)
}

/// Waits until `node` has no pod (10 minutes at most).
pub async fn wait_empty(client: &Client, node: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while pods_left(client, node).await > 0 {
        assert!(Instant::now() < deadline, "{node} never emptied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The floor for a node whose pods are `<node>-p0000`…: evict them 64 at
/// a time, wait for the node to be empty.
pub async fn floor(client: &Client, node: &str, count: usize) -> Duration {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    stream::iter(0..count)
        .for_each_concurrent(64, |i| {
            let pods = pods.clone();
            async move {
                let _ = pods
                    .evict(&format!("{node}-p{i:04}"), &EvictParams::default())
                    .await;
            }
        })
        .await;
    wait_empty(client, node).await;
    t.elapsed()
}

/// Waits until every maintenance of `names` has Succeeded (10 minutes at
/// most), reading through API errors.
pub async fn wait_succeeded(api: &Api<NodeMaintenance>, names: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(600);
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
            assert!(Instant::now() < deadline, "{name} never succeeded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Creates a NodeMaintenance for each node, all at once (as many users or
/// a tool applying them in parallel would).
pub async fn create_nms(api: &Api<NodeMaintenance>, nodes: &[String]) -> Vec<String> {
    let names: Vec<String> = nodes.iter().map(|n| format!("nm-{n}")).collect();
    futures::future::join_all(nodes.iter().zip(&names).map(|(node, name)| {
        let nm = NodeMaintenance::new(
            name,
            NodeMaintenanceSpec {
                node_name: node.clone(),
                reason: None,
            },
        );
        async move { api.create(&PostParams::default(), &nm).await.unwrap() }
    }))
    .await;
    names
}
