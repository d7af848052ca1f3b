//! The real node: a kubelet with containerd, runc and the CNI bridge, in
//! the test's own network namespace, Ready beside a kwok node; a pod runs
//! on it for real (a process in the node's cgroup, an address on its
//! bridge), and stopping the control plane leaves no process, mount or
//! cgroup behind.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use nmo_control_plane::{ControlPlane, NodeSpec, Options, isolated};
use serde_json::json;

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[test]
fn a_pod_runs_on_the_real_node_and_stop_leaves_nothing() {
    let (pids, dir) = isolated(|| async {
        let begun = Instant::now();
        let cp = ControlPlane::start(Options {
            nodes: vec![NodeSpec::new("worker-1")],
            real_nodes: vec!["real-1".to_owned()],
            ..Options::default()
        })
        .await
        .unwrap();
        eprintln!(
            "control plane with a real node Ready in {:?} ({:?} with the build check)",
            cp.time_to_ready(),
            begun.elapsed()
        );
        let client = cp.client().await.unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "sleeper"},
            "spec": {
                "nodeName": "real-1",
                "containers": [{"name": "c", "image": "localhost/pause:nmo", "imagePullPolicy": "Never"}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let ip = loop {
            let p = pods.get("sleeper").await.unwrap();
            let status = p.status.unwrap_or_default();
            if status.phase.as_deref() == Some("Running")
                && let Some(ip) = status.pod_ip
            {
                break ip;
            }
            assert!(
                Instant::now() < deadline,
                "the pod never ran on the real node: {status:?}\n{}",
                cp.logs_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(ip.starts_with("10.244.0."), "pod address {ip}");
        eprintln!("pod Running at {ip} after {:?}", begun.elapsed());
        let pids: Vec<u32> = cp.pids().into_iter().map(|(_, p)| p).collect();
        let dir = cp.dir().to_owned();
        cp.stop();
        (pids, dir)
    })
    .unwrap();
    for pid in pids {
        assert!(!alive(pid), "pid {pid} still runs");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*dir.to_string_lossy()),
        "mounts left under {}",
        dir.display()
    );
}
