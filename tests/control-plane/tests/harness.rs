//! The harness itself: the real control plane starts on loopback, its
//! controllers and kwok run pods as a cluster does, and stopping it leaves
//! no process behind.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nmo_control_plane::{ControlPlane, Options};
use serde_json::json;

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_runs_on_kwok_nodes_its_pods_keep_their_stop_time_and_stop_leaves_nothing() {
    let cp = ControlPlane::start(Options::workers(2)).await.unwrap();
    eprintln!("control plane ready in {:?}", cp.time_to_ready());
    let client = cp.client().await.unwrap();

    // The Deployment controller, the ReplicaSet controller, the scheduler
    // and kwok: three Running, Ready pods on the fake nodes.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"},
                                           "annotations": {"pod-delete.stage.kwok.x-k8s.io/delay": "2s"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let begun = Instant::now();
    let running = loop {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        if list.len() == 3 && list.iter().all(ready) {
            break list;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(60),
            "pods never ready: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for p in &running {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        assert!(node.starts_with("worker-"), "{node}");
    }

    // A deleted pod stays Terminating for its 2 s, then goes.
    let name = running[0].metadata.name.clone().unwrap();
    let deleted = Instant::now();
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    let terminating = pods.get(&name).await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    while pods.get_opt(&name).await.unwrap().is_some() {
        assert!(
            deleted.elapsed() < Duration::from_secs(30),
            "{name} never went"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = deleted.elapsed();
    assert!(
        took >= Duration::from_millis(1900),
        "{name} went after {took:?}, before its 2 s"
    );

    let pids: Vec<u32> = cp.pids().into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        pids.len(),
        5,
        "etcd, apiserver, controller manager, scheduler, kwok"
    );
    assert!(pids.iter().all(|p| alive(*p)));
    cp.stop();
    for p in pids {
        assert!(!alive(p), "pid {p} still running after stop");
    }
}
