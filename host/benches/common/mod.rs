//! What the drain benchmarks share, on either cluster: the floor (a bare
//! loop evicting 64 at a time, then waiting for the node to empty).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, EvictParams, ListParams, PostParams};
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};
use serde_json::json;

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
    let t = Instant::now();
    assert!(
        succeeded_within(api, names, t, Duration::from_secs(600)).await,
        "{names:?} never all succeeded"
    );
}

/// Whether every maintenance of `names` Succeeded within `limit` from
/// `t`, reading through API errors.
pub async fn succeeded_within(
    api: &Api<NodeMaintenance>,
    names: &[String],
    t: Instant,
    limit: Duration,
) -> bool {
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
            if t.elapsed() > limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    true
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

/// Installs the NodeMaintenance CRD on the real control plane and waits
/// out the API server's welcome: it holds every create of a custom
/// resource for 2 s while its CRD has been Established for less than 2 s
/// (apiextensions-apiserver's `customresource_handler.go`, for HA API
/// servers that have not seen the CRD yet). A cluster installs the CRD
/// once, long before its first maintenance, so a benchmark's clock must
/// not start inside that window: one throwaway NodeMaintenance, created
/// (as the admin, so the operator's requests are not counted) and
/// deleted, takes it.
pub async fn install_crd(cp: &nmo_control_plane::ControlPlane) {
    cp.apply(&nmo::crd::crd_yaml()).await.unwrap();
    let api: Api<NodeMaintenance> = Api::all(cp.client().await.unwrap());
    let nm = NodeMaintenance::new(
        "bench-warm-up",
        NodeMaintenanceSpec {
            node_name: "bench-warm-up".to_owned(),
            reason: None,
        },
    );
    api.create(&PostParams::default(), &nm).await.unwrap();
    api.delete("bench-warm-up", &Default::default())
        .await
        .unwrap();
}

/// CPU time a process has used (user + system), in clock ticks (1/100 s
/// on Linux).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the whole line.
    field(11) + field(12)
}

/// `VmRSS` or `VmHWM` of a process, in KiB.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A free port on the loopback address (below the ephemeral range, never
/// handed out twice: see `nmo_control_plane`).
pub fn free_port() -> u16 {
    nmo_control_plane::free_port().expect("a free loopback port")
}

/// `GET path` on the loopback `port`: the status line's code and the body.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf);
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((code, body.to_owned()))
}

/// Starts the real `nmo` binary on `kubeconfig` (metrics, webhook off
/// unless `args` say otherwise) and waits for `/readyz`; returns it and
/// the time it took.
pub async fn start_binary(
    kubeconfig: &std::path::Path,
    cache: &std::path::Path,
    args: &[String],
) -> (tokio::process::Child, Duration) {
    let port = free_port();
    let t = Instant::now();
    // NMO_BENCH_BINARY: another build of nmo (an older release) to run
    // instead, side by side.
    let binary = std::env::var("NMO_BENCH_BINARY")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_nmo").to_owned());
    // NMO_BENCH_WRAP: a profiler to run the binary under (`heaptrack`);
    // the figures are then the profiler's process's.
    let mut command = match std::env::var("NMO_BENCH_WRAP") {
        Ok(wrap) if !wrap.is_empty() => {
            let mut c = tokio::process::Command::new(wrap);
            c.arg(&binary);
            c
        }
        _ => tokio::process::Command::new(&binary),
    };
    if !args.iter().any(|a| a.starts_with("--webhook-bind-address")) {
        command.arg("--webhook-bind-address=0");
    }
    if !args.iter().any(|a| a.starts_with("--zap-log-level")) {
        command.arg("--zap-log-level=error");
    }
    if !args.iter().any(|a| a.starts_with("--metrics-bind-address")) {
        command.arg("--metrics-bind-address=0");
    }
    if !args.iter().any(|a| a.starts_with("--policy-dir")) {
        command.arg("--policy-dir=/nonexistent");
    }
    let mut child = command
        .args(args)
        .arg(format!("--health-probe-bind-address=127.0.0.1:{port}"))
        .arg(format!("--policy-cache-dir={}", cache.display()))
        .env("KUBECONFIG", kubeconfig)
        .stdout(std::process::Stdio::null())
        // NMO_BENCH_LOG: a file for its log (JSON lines on stderr).
        .stderr(match std::env::var_os("NMO_BENCH_LOG") {
            Some(path) => std::fs::File::options()
                .create(true)
                .append(true)
                .open(path)
                .map_or_else(|_| std::process::Stdio::null(), Into::into),
            None => std::process::Stdio::null(),
        })
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    loop {
        if http_get(port, "/readyz")
            .await
            .is_some_and(|(code, _)| code == 200)
        {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("nmo exited before it was ready: {status}");
        }
        assert!(t.elapsed() < Duration::from_secs(120), "nmo never ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (child, t.elapsed())
}

/// A sample's value from a Prometheus text page (`name{labels}` exactly as
/// written), 0 when absent.
pub fn metric(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Stops a started binary as Kubernetes stops a pod: SIGTERM, then SIGKILL
/// after 10 s (a profiler wrapping it writes its data on the way out).
pub async fn stop_binary(mut child: tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_ok()
        {
            return;
        }
    }
    let _ = child.kill().await;
}

/// Creates `count` bare pods on `node` (64 requests at a time); `stop` is
/// kwok's stop time after deletion.
pub async fn seed_kwok_pods(client: &Client, node: &str, count: usize, stop: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    stream::iter(0..count)
        .for_each_concurrent(64, |i| {
            let pods = pods.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("{node}-p{i:04}"), "namespace": "default",
                                 "annotations": {"pod-delete.stage.kwok.x-k8s.io/delay": stop}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .await;
}

/// Waits until every pod of `node` runs (kwok took them over).
pub async fn wait_running(client: &Client, node: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let running = Api::<Pod>::all(client.clone())
            .list(
                &ListParams::default()
                    .fields(&format!("spec.nodeName={node},status.phase=Running")),
            )
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        if running == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{node}: {running}/{count} running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `verb resource[/subresource]` of an audited request (`get nodes`,
/// `create pods/eviction`), without names or namespaces.
pub fn verb_resource(verb: &str, uri: &str) -> String {
    let path = uri.split('?').next().unwrap_or_default();
    let parts = path
        .split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>();
    // /api/v1/nodes, /apis/g/v/namespaces/ns/res/name/sub...
    let kind = parts
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
    format!("{verb} {kind}")
}

/// Waits until at least `count` NodeMaintenances satisfy `which` (`limit`
/// at most), reading through API errors.
pub async fn wait_nms(
    nms: &Api<NodeMaintenance>,
    count: usize,
    limit: Duration,
    what: &str,
    which: impl Fn(&NodeMaintenance) -> bool,
) {
    let deadline = Instant::now() + limit;
    loop {
        let n = nms
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().filter(|nm| which(nm)).count())
            .unwrap_or(0);
        if n >= count {
            return;
        }
        assert!(Instant::now() < deadline, "{n}/{count} {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Seen by the operator: admitted, or waiting with the policy's reason.
pub fn seen(nm: &NodeMaintenance) -> bool {
    nm.status
        .as_ref()
        .is_some_and(|s| s.waiting.is_some() || s.phase.is_some())
}

/// Runs `f` for at least `budget` (and at least `least` times, at most
/// 5,000): the median and the 95th percentile.
pub fn measure(budget: Duration, least: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..3 {
        f();
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    while samples.len() < least || (started.elapsed() < budget && samples.len() < 5_000) {
        let t = Instant::now();
        f();
        samples.push(t.elapsed());
    }
    samples.sort();
    let p95 = samples[(samples.len() * 95 / 100).min(samples.len() - 1)];
    (samples[samples.len() / 2], p95)
}

/// `count` bare pods on `node` of the simulated cluster `c`
/// (`<node>-p0000`...), labelled `app: bench`.
pub fn seed_pods(c: &nmo_sim::SimCluster, node: &str, count: usize) {
    for i in 0..count {
        c.create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{node}-p{i:04}"), "namespace": "default", "labels": {"app": "bench"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
    }
}

/// The Kubernetes version the real control plane was built at.
pub fn kubernetes_version() -> &'static str {
    nmo_control_plane::versions()
        .iter()
        .find(|(k, _)| *k == "KUBERNETES_VERSION")
        .map_or("?", |(_, v)| *v)
}
