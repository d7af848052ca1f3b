//! Drains on one simulated cluster, in one run, so the machine's noise
//! cancels:
//! - 1,000 pods off one node: nmo (NodeMaintenance to Succeeded) against the
//!   real `kubectl drain --ignore-daemonsets --delete-emptydir-data --force`
//!   on an identical node, against the floor (a bare loop evicting the same
//!   pods as fast as the server allows and waiting for them to go);
//! - 50 nodes x 20 pods: 50 NodeMaintenances created at once against one;
//! - the policy's share of the 1,000-pod drain: the time spent in the
//!   default policy (sandboxed) against the same rules run natively;
//! - pods that take their time: 200 pods that need 2 s to stop after
//!   SIGTERM, nmo against the floor; 40 pods of a Deployment behind a
//!   PodDisruptionBudget (maxUnavailable 4) whose replacements start on
//!   another node;
//! - API economy, from the simulated server's audit log (the operator's
//!   requests only, by its User-Agent): per drained pod in the 1,000-pod
//!   drain, per maintenance in the 50 at once, and per minute for a
//!   maintenance a PodDisruptionBudget blocks for good;
//! - the real `nmo` binary: time from start to ready (cold and with the
//!   compiled-policy cache), resident memory and CPU idle, and resident
//!   memory at its peak during a 1,000-pod drain.
//!
//! Run with `cargo bench -p nmo --bench drain`; prints a table with ratios.
//! `NMO_BENCH_SKIP_KUBECTL=1` skips the 200 s kubectl drain;
//! `NMO_BENCH_ONLY=speed` measures only the two drain-speed figures, and
//! `NMO_BENCH_TIMELINE=1` prints the operator's requests in each of them
//! (milliseconds from the NodeMaintenances' creation, runs folded).

use std::time::{Duration, Instant};

mod common;

use common::{
    cpu_ticks, create_nms, floor, proc_status_kib, seed_pods, start_binary, wait_succeeded,
};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use nmo::controller::{self, Context, Settings};
use nmo::crd::NodeMaintenance;
use nmo::policy::{Decision, EngineConfig, PolicyEngine};
use nmo_sim::{SimCluster, SimOptions};
use serde_json::json;

const PODS: usize = 1_000;

/// Requests the operator made so far (by its User-Agent).
fn operator_requests(c: &SimCluster) -> usize {
    c.audit()
        .iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT)
        .count()
}

/// Evictions the operator requested so far.
fn operator_evictions(c: &SimCluster) -> usize {
    c.audit()
        .iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT && r.subresource == "eviction")
        .count()
}

/// The benchmark's own client: another User-Agent, so its polling is not
/// counted as the operator's.
async fn bench_client(kubeconfig: &str) -> Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static("nmo-bench"),
    ));
    Client::try_from(config).unwrap()
}

/// Pods that need `seconds` to stop after SIGTERM.
fn seed_slow_pods(c: &SimCluster, node: &str, count: usize, seconds: u32) {
    for i in 0..count {
        c.create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{node}-p{i:04}"), "namespace": "default",
                         "annotations": {"sim.nmo.medik8s.io/shutdown-seconds": seconds.to_string()}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
    }
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
    c.add_node("pdb-node").unwrap();
    c.add_node("pdb-spare").unwrap();
    for n in ["slow-node", "slow-floor-node", "stuck-node"] {
        c.add_node(n).unwrap();
    }
    seed_slow_pods(&c, "slow-node", 200, 2);
    seed_slow_pods(&c, "slow-floor-node", 200, 2);
    c.apply_yaml(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: stuck, namespace: default, labels: {app: stuck}}
spec: {nodeName: stuck-node, containers: [{name: c, image: i}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: stuck, namespace: default}
spec: {minAvailable: 1, selector: {matchLabels: {app: stuck}}}
"#,
    )
    .unwrap();
    let operator = nmo::client::client_from_kubeconfig(&c.kubeconfig())
        .await
        .unwrap();
    let client = bench_client(&c.kubeconfig()).await;
    let metrics = nmo::registry::OperatorMetrics::register().unwrap();
    let policy = PolicyEngine::observed(EngineConfig::default(), metrics.policy.observer())
        .unwrap()
        .default_policy()
        .unwrap();
    let ctx = Context::new(
        operator.clone(),
        nmo::policy::PolicyStore::single(policy),
        Settings {
            max_concurrent: 64,
            ..Settings::default()
        },
        metrics.controller.clone(),
    );
    let metrics = metrics.policy;
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    // The real binary first, alone on the cluster.
    // NMO_BENCH_ONLY=speed: only the two drain-speed figures (and the
    // operator's request timeline with NMO_BENCH_TIMELINE=1).
    let speed_only = std::env::var("NMO_BENCH_ONLY").as_deref() == Ok("speed");
    let timeline = std::env::var_os("NMO_BENCH_TIMELINE").is_some();
    let binary = if speed_only {
        None
    } else {
        Some(binary_figures(&c, &nms).await)
    };

    tokio::spawn(controller::run(ctx));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // nmo
    let on_node: Vec<Pod> = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields("spec.nodeName=nmo-node"))
        .await
        .unwrap()
        .items;
    let policy_before = metrics.timed(Decision::PlanDrain);
    c.record_audit(true);
    let requests_before = operator_requests(&c);
    let t = Instant::now();
    let names = create_nms(&nms, &["nmo-node".to_string()]).await;
    wait_succeeded(&nms, &names).await;
    let nmo_time = t.elapsed();
    let drain_requests = operator_requests(&c) - requests_before;
    if timeline {
        print_timeline(&c, t, requests_before);
    }
    c.record_audit(false);
    let (policy_calls, policy_time) = {
        let (n, secs) = metrics.timed(Decision::PlanDrain);
        (n - policy_before.0, secs - policy_before.1)
    };
    // The same decisions made natively: the plan over the node's pods, as
    // many times as the policy planned.
    let plans = policy_calls.max(1);
    let t = Instant::now();
    for _ in 0..plans {
        std::hint::black_box(nmo::policy::native::default_plan(&on_node));
    }
    let native_time = t.elapsed().as_secs_f64();

    // kubectl drain (NMO_BENCH_SKIP_KUBECTL=1 skips its 200 s)
    let skip_kubectl = std::env::var_os("NMO_BENCH_SKIP_KUBECTL").is_some();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    c.write_kubeconfig(&kc).unwrap();
    let t = Instant::now();
    let out = if skip_kubectl {
        None
    } else {
        Some(
            tokio::process::Command::new("kubectl")
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
                .expect("kubectl"),
        )
    };
    if let Some(out) = &out {
        assert!(
            out.status.success(),
            "kubectl drain: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Zero when skipped (NMO_BENCH_SKIP_KUBECTL).
    let kubectl_time = out.as_ref().map(|_| t.elapsed()).unwrap_or_default();

    // The floor: evict everything, 64 at a time, and wait for the node to be empty.
    let floor_time = floor(&client, "floor-node", PODS).await;

    // One node of 20 pods, then 50 at once.
    let t = Instant::now();
    let one = create_nms(&nms, &["many-50".to_string()]).await;
    wait_succeeded(&nms, &one).await;
    let one_time = t.elapsed();
    let fifty: Vec<String> = (0..50).map(|n| format!("many-{n:02}")).collect();
    c.record_audit(true);
    let requests_before = operator_requests(&c);
    let t = Instant::now();
    let names = create_nms(&nms, &fifty).await;
    let fifty_created = t.elapsed();
    wait_succeeded(&nms, &names).await;
    let fifty_time = t.elapsed();
    let fifty_requests = operator_requests(&c) - requests_before;
    if timeline {
        print_timeline(&c, t, requests_before);
        for f in [Decision::Admit, Decision::PlanDrain] {
            let (n, secs) = metrics.timed(f);
            println!(
                "  policy {f}: {n} calls, {:.2} ms on average",
                secs * 1000.0 / n.max(1) as f64
            );
        }
    }
    c.record_audit(false);
    if speed_only {
        println!(
            "{PODS} pods: nmo {:.3} s, floor {:.3} s = {:.2}x (goal <= 1.15x); 50 at once {:.3} s (the last created after {:.3} s) / one {:.3} s = {:.2}x (goal <= 1.5x); {:.2} requests per pod, {:.1} per maintenance",
            nmo_time.as_secs_f64(),
            floor_time.as_secs_f64(),
            nmo_time.as_secs_f64() / floor_time.as_secs_f64(),
            fifty_time.as_secs_f64(),
            fifty_created.as_secs_f64(),
            one_time.as_secs_f64(),
            fifty_time.as_secs_f64() / one_time.as_secs_f64(),
            drain_requests as f64 / PODS as f64,
            fifty_requests as f64 / 50.0,
        );
        c.stop().await;
        return;
    }
    let binary = binary.expect("measured unless speed only");

    // Pods that take 2 s to stop.
    let t = Instant::now();
    let names = create_nms(&nms, &["slow-node".to_string()]).await;
    wait_succeeded(&nms, &names).await;
    let slow_time = t.elapsed();
    let slow_floor = floor(&client, "slow-floor-node", 200).await;

    // A Deployment behind a budget, made now so its pods wait for a node
    // only here; its replacements start on the spare node, labelled once
    // all 40 run.
    c.apply_yaml(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: guarded, namespace: default}
spec:
  replicas: 40
  selector: {matchLabels: {app: guarded}}
  template:
    metadata: {labels: {app: guarded}}
    spec: {nodeSelector: {pool: guarded}, containers: [{name: c, image: i}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: guarded, namespace: default}
spec: {maxUnavailable: 4, selector: {matchLabels: {app: guarded}}}
"#,
    )
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let label = json!({"metadata": {"labels": {"pool": "guarded"}}});
    nodes
        .patch(
            "pdb-node",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&label),
        )
        .await
        .unwrap();
    loop {
        let ready = pods
            .list(&ListParams::default().labels("app=guarded"))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count()
            })
            .unwrap_or(0);
        if ready == 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nodes
        .patch(
            "pdb-spare",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&label),
        )
        .await
        .unwrap();
    c.record_audit(true);
    let evictions_before = operator_evictions(&c);
    let t = Instant::now();
    let names = create_nms(&nms, &["pdb-node".to_string()]).await;
    wait_succeeded(&nms, &names).await;
    let pdb_time = t.elapsed();
    let pdb_evictions = operator_evictions(&c) - evictions_before;

    // Blocked for good: what it costs per minute once it waits.
    let names = create_nms(&nms, &["stuck-node".to_string()]).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let requests_before = operator_requests(&c);
    let requests_before_all = c.audit().len();
    let window = Duration::from_secs(60);
    tokio::time::sleep(window).await;
    let stuck_per_minute =
        (operator_requests(&c) - requests_before) as f64 / window.as_secs_f64() * 60.0;
    let mut stuck_calls: std::collections::BTreeMap<String, usize> = Default::default();
    for r in c.audit().iter().skip(requests_before_all) {
        if r.user_agent == nmo::client::USER_AGENT {
            let sub = if r.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", r.subresource)
            };
            *stuck_calls
                .entry(format!("{} {}{sub}", r.verb, r.resource))
                .or_default() += 1;
        }
    }
    nms.delete(&names[0], &Default::default()).await.unwrap();

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
    let vs_kubectl = if kubectl_time.is_zero() {
        "kubectl skipped".to_owned()
    } else {
        format!(
            "{:.3}x (goal <= 1.0x)",
            nmo_time.as_secs_f64() / kubectl_time.as_secs_f64()
        )
    };
    println!(
        "ratios: nmo / kubectl = {vs_kubectl}, nmo / floor = {:.2}x (goal <= 1.15x)",
        nmo_time.as_secs_f64() / floor_time.as_secs_f64()
    );
    println!(
        "policy in the {PODS}-pod drain: {policy_calls} plan-drain calls, {:.1} ms sandboxed = {:.2}% of the drain; native {:.1} ms = {:.3}%",
        policy_time * 1000.0,
        policy_time / nmo_time.as_secs_f64() * 100.0,
        native_time * 1000.0,
        native_time / nmo_time.as_secs_f64() * 100.0
    );
    println!("{:<58} {:>9}", "1 node x 20 pods", s(one_time));
    println!(
        "{:<58} {:>9}",
        "50 nodes x 20 pods, 50 NodeMaintenances at once",
        s(fifty_time)
    );
    println!(
        "ratio: 50 at once / 1 = {:.2}x (goal <= 1.5x); the benchmark's client created the 50 at once, in {:.2} s",
        fifty_time.as_secs_f64() / one_time.as_secs_f64(),
        fifty_created.as_secs_f64()
    );
    println!(
        "{:<58} {:>9}   floor {} = {:.2}x",
        "200 pods that take 2 s to stop after SIGTERM",
        s(slow_time),
        s(slow_floor),
        slow_time.as_secs_f64() / slow_floor.as_secs_f64()
    );
    println!(
        "{:<58} {:>9}   {pdb_evictions} eviction requests for 40 pods",
        "40 Deployment pods behind a PDB (maxUnavailable 4)",
        s(pdb_time)
    );
    println!(
        "API requests: {drain_requests} for the {PODS}-pod drain = {:.2} per pod (goal <= 1.2); {:.1} per maintenance of 20 pods (50 at once); {:.0} per minute for a maintenance a PDB blocks (goal <= 30)",
        drain_requests as f64 / PODS as f64,
        fifty_requests as f64 / 50.0,
        stuck_per_minute
    );
    println!(
        "  the blocked maintenance's requests in {} s: {stuck_calls:?}",
        window.as_secs()
    );
    println!(
        "nmo binary: start to ready {:.0} ms cold, {:.0} ms with the policy cache (goal <= 100); RSS idle {:.1} MiB (goal <= 25), peak in a {PODS}-pod drain {:.1} MiB (goal <= 60); CPU idle {:.2}% of a core (goal <= 0.2%)",
        binary.ready_cold.as_secs_f64() * 1000.0,
        binary.ready_warm.as_secs_f64() * 1000.0,
        binary.rss_idle_kib as f64 / 1024.0,
        binary.rss_peak_kib as f64 / 1024.0,
        binary.cpu_idle_percent
    );
    c.stop().await;
}

/// The operator's requests since `from` (its `skip` first ones left out),
/// in milliseconds since `t`, runs of the same request folded into one line.
fn print_timeline(c: &SimCluster, t: Instant, skip: usize) {
    let mut last: Option<(String, f64, f64, usize)> = None;
    let flush = |l: &Option<(String, f64, f64, usize)>| {
        if let Some((what, first, until, n)) = l {
            println!("  {first:8.1} .. {until:8.1} ms  {n:5} x {what}");
        }
    };
    for r in c
        .audit()
        .iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT)
        .skip(skip)
    {
        let ms = r.at.saturating_duration_since(t).as_secs_f64() * 1000.0;
        let what = format!("{} {} {}", r.verb, r.resource, r.subresource);
        match &mut last {
            Some((w, _, until, n)) if *w == what => {
                *until = ms;
                *n += 1;
            }
            _ => {
                flush(&last);
                last = Some((what, ms, ms, 1));
            }
        }
    }
    flush(&last);
    print_steps(c, t, skip);
}

/// Whether an audit record is a step of the maintenance of a node.
type StepMatch = fn(&nmo_sim::AuditRecord, &str) -> bool;

/// For the 50 at once: when each maintenance reached each step, in
/// milliseconds from creation (min / median / max over the 50).
fn print_steps(c: &SimCluster, t: Instant, skip: usize) {
    let audit = c.audit();
    let ours: Vec<_> = audit
        .iter()
        .filter(|r| r.user_agent == nmo::client::USER_AGENT)
        .skip(skip)
        .collect();
    let steps: [(&str, StepMatch); 6] = [
        ("get node", |r, n| {
            r.verb == "get" && r.resource == "nodes" && r.name == n
        }),
        ("finalizer", |r, n| {
            r.verb == "patch" && r.resource == "nodemaintenances" && r.name == format!("nm-{n}")
        }),
        ("status", |r, n| {
            r.resource == "nodemaintenances"
                && r.subresource == "status"
                && r.name == format!("nm-{n}")
        }),
        ("lease", |r, n| {
            r.resource == "leases" && r.name.ends_with(n)
        }),
        ("cordon", |r, n| {
            r.verb == "patch" && r.resource == "nodes" && r.name == n
        }),
        ("eviction", |r, n| {
            r.subresource == "eviction" && r.name.starts_with(&format!("{n}-p"))
        }),
    ];
    for (step, matches) in steps {
        let mut at: Vec<f64> = (0..50)
            .filter_map(|i| {
                let node = format!("many-{i:02}");
                ours.iter()
                    .find(|r| matches(r, &node))
                    .map(|r| r.at.saturating_duration_since(t).as_secs_f64() * 1000.0)
            })
            .collect();
        at.sort_by(f64::total_cmp);
        if let (Some(first), Some(last)) = (at.first(), at.last()) {
            println!(
                "  first {step:10} min {first:6.1}  median {:6.1}  max {last:6.1} ms ({} maintenances)",
                at[at.len() / 2],
                at.len()
            );
        }
    }
}

struct BinaryFigures {
    ready_cold: Duration,
    ready_warm: Duration,
    rss_idle_kib: u64,
    rss_peak_kib: u64,
    cpu_idle_percent: f64,
}

async fn binary_figures(c: &SimCluster, nms: &Api<NodeMaintenance>) -> BinaryFigures {
    c.add_node("rss-node").unwrap();
    seed_pods(c, "rss-node", PODS);
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    c.write_kubeconfig(&kc).unwrap();
    let cache = dir.path().join("cache");
    let (mut cold, ready_cold) = start_binary(&kc, &cache, &[]).await;
    cold.kill().await.unwrap();
    let (mut warm, ready_warm) = start_binary(&kc, &cache, &[]).await;
    let pid = warm.id().unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_idle_kib = proc_status_kib(pid, "VmRSS:");
    let ticks_before = cpu_ticks(pid);
    let idle = Duration::from_secs(20);
    tokio::time::sleep(idle).await;
    // Clock ticks are 1/100 s on Linux.
    let cpu_idle_percent =
        (cpu_ticks(pid) - ticks_before) as f64 / 100.0 / idle.as_secs_f64() * 100.0;
    let names = create_nms(nms, &["rss-node".to_string()]).await;
    wait_succeeded(nms, &names).await;
    let rss_peak_kib = proc_status_kib(pid, "VmHWM:");
    warm.kill().await.unwrap();
    // Leave the cluster as the rest of the benchmark expects.
    nms.delete(&names[0], &Default::default()).await.unwrap();
    BinaryFigures {
        ready_cold,
        ready_warm,
        rss_idle_kib,
        rss_peak_kib,
        cpu_idle_percent,
    }
}
