//! Budget-gated drains on the simulated cluster and on the real control
//! plane (kube-apiserver, etcd, kube-controller-manager with its
//! disruption controller, kube-scheduler, kwok): how long nmo takes to
//! drain pods behind PodDisruptionBudgets, against the floor for that
//! workload and against kubectl's fixed 5 s retry.
//!
//! Each case runs three times, each on a fresh cluster of the same shape:
//! - **floor**: a bare loop that cordons the nodes and evicts every pod,
//!   retrying a refused eviction after 10 ms (the fastest any client can
//!   go: it pays only the time the replacements need to be Ready, at the
//!   cost of hundreds of refused requests);
//! - **5 s retry**: `kubectl drain`'s and the Go operator's way: every
//!   eviction at once, a refused one retried every 5 s;
//! - **nmo**: the controller with its production timings, a
//!   NodeMaintenance per node, until every one has Succeeded.
//!
//! The cases: Deployments whose replacements are Ready 0 s, 2 s and 10 s
//! after they are placed, behind a budget allowing one down; two budgets
//! on one node; one budget over pods on two nodes drained at once. Then a
//! budget that never allows: nmo's requests per minute once it waits.
//!
//! Run with `cargo bench -p nmo --bench budgets`; goal: nmo ≤ 1.2x the
//! floor, ≤ 30 requests a minute when blocked for good.
//! `NMO_BENCH_CLUSTER=sim` or `=real` runs on one of the two only;
//! `NMO_BENCH_ONLY=blocked` only the budget that never allows;
//! `NMO_BENCH_CASE=N` only the N-th case (from 0) and not the blocked
//! budget; `NMO_BENCH_KEEP=<dir>` keeps each real run's audit log there
//! (`<case>-<floor|5s|nmo>.audit.log`) to take a run's time apart.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{create_nms, wait_empty, wait_succeeded};

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use nmo::controller::{self, Context, Settings};
use nmo::crd::NodeMaintenance;
use nmo::policy::{EngineConfig, PolicyEngine};
use nmo_control_plane::{ControlPlane, NodeSpec, Options};
use nmo_sim::{SimCluster, SimOptions};
use serde_json::json;

/// One workload: Deployments (replicas, budget) on the drained nodes.
struct Case {
    name: &'static str,
    /// (app, replicas, the budget's spec)
    apps: Vec<(&'static str, usize, serde_json::Value)>,
    /// Seconds a replacement takes to be Ready once placed.
    ready_after: u32,
    /// Nodes drained at once (the apps' pods spread over them).
    nodes: usize,
}

impl Case {
    /// Its name as a file name: `8-pods-1-budget-allowing-1-ready-after-0-s`.
    fn slug(&self) -> String {
        let words: Vec<String> = self
            .name
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_ascii_lowercase)
            .collect();
        words.join("-")
    }
}

fn cases() -> Vec<Case> {
    let one_down = || json!({"maxUnavailable": 1});
    vec![
        Case {
            name: "8 pods, 1 budget allowing 1, Ready after 0 s",
            apps: vec![("web", 8, one_down())],
            ready_after: 0,
            nodes: 1,
        },
        Case {
            name: "8 pods, 1 budget allowing 1, Ready after 2 s",
            apps: vec![("web", 8, one_down())],
            ready_after: 2,
            nodes: 1,
        },
        Case {
            name: "4 pods, 1 budget allowing 1, Ready after 10 s",
            apps: vec![("web", 4, one_down())],
            ready_after: 10,
            nodes: 1,
        },
        Case {
            name: "2 x 4 pods, 2 budgets allowing 1, Ready after 2 s",
            apps: vec![("web", 4, one_down()), ("api", 4, one_down())],
            ready_after: 2,
            nodes: 1,
        },
        Case {
            name: "8 pods on 2 nodes drained at once, 1 budget, 2 s",
            apps: vec![("web", 8, one_down())],
            ready_after: 2,
            nodes: 2,
        },
    ]
}

fn drained(case: &Case) -> Vec<String> {
    (0..case.nodes).map(|i| format!("drained-{i}")).collect()
}

fn spares() -> Vec<String> {
    (0..2).map(|i| format!("spare-{i}")).collect()
}

/// Which cluster a run is on.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sim,
    Real,
}

/// A running cluster of either kind.
enum Cluster {
    Sim(SimCluster),
    Real(Box<ControlPlane>),
}

impl Cluster {
    async fn start(kind: Kind, nodes: &[String]) -> (Cluster, Client) {
        match kind {
            Kind::Sim => {
                let c = SimCluster::start(SimOptions::default()).await.unwrap();
                c.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
                for n in nodes {
                    c.add_node(n).unwrap();
                }
                let client = nmo::client::client_from_kubeconfig(&c.kubeconfig())
                    .await
                    .unwrap();
                c.record_audit(true);
                (Cluster::Sim(c), client)
            }
            Kind::Real => {
                let cp = ControlPlane::start(Options {
                    nodes: nodes.iter().map(NodeSpec::new).collect(),
                    audit: true,
                    ..Options::default()
                })
                .await
                .expect("the real control plane starts");
                common::install_crd(&cp).await;
                // The operator's client (its User-Agent names it in the
                // audit log), with the admin's rights.
                let client = nmo::client::client_from_kubeconfig(&cp.kubeconfig())
                    .await
                    .unwrap();
                (Cluster::Real(Box::new(cp)), client)
            }
        }
    }

    async fn apply(&self, yaml: &str) {
        match self {
            Cluster::Sim(c) => {
                c.apply_yaml(yaml).unwrap();
            }
            Cluster::Real(cp) => {
                cp.apply(yaml).await.unwrap();
            }
        }
    }

    /// Requests the operator made, and how many of them were evictions.
    fn operator_requests(&self) -> (usize, usize) {
        let ours = nmo::client::USER_AGENT;
        match self {
            Cluster::Sim(c) => {
                let all: Vec<_> = c
                    .audit()
                    .into_iter()
                    .filter(|r| r.user_agent == ours)
                    .collect();
                let evictions = all.iter().filter(|r| r.subresource == "eviction").count();
                (all.len(), evictions)
            }
            Cluster::Real(cp) => {
                let all: Vec<_> = cp
                    .audit()
                    .into_iter()
                    .filter(|r| r.user_agent == ours)
                    .collect();
                let evictions = all
                    .iter()
                    .filter(|r| r.verb == "create")
                    .filter(|r| {
                        r.uri
                            .split('?')
                            .next()
                            .is_some_and(|p| p.ends_with("/eviction"))
                    })
                    .count();
                (all.len(), evictions)
            }
        }
    }

    /// The operator's requests by verb and resource.
    fn operator_calls(&self) -> std::collections::BTreeMap<String, usize> {
        let ours = nmo::client::USER_AGENT;
        let mut calls = std::collections::BTreeMap::new();
        let mut count = |key: String| *calls.entry(key).or_insert(0) += 1;
        match self {
            Cluster::Sim(c) => {
                for r in c.audit().into_iter().filter(|r| r.user_agent == ours) {
                    let sub = if r.subresource.is_empty() {
                        String::new()
                    } else {
                        format!("/{}", r.subresource)
                    };
                    count(format!("{} {}{sub}", r.verb, r.resource));
                }
            }
            Cluster::Real(cp) => {
                for r in cp.audit().into_iter().filter(|r| r.user_agent == ours) {
                    let path = r.uri.split('?').next().unwrap_or_default().to_owned();
                    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
                    let at = parts
                        .iter()
                        .position(|p| *p == "namespaces")
                        .map_or(if parts.first() == Some(&"api") { 2 } else { 3 }, |i| i + 2);
                    let what = parts.get(at..).map(|p| match p {
                        [resource] => (*resource).to_owned(),
                        [resource, _name] => (*resource).to_owned(),
                        [resource, _name, sub, ..] => format!("{resource}/{sub}"),
                        [] => String::new(),
                    });
                    count(format!("{} {}", r.verb, what.unwrap_or_default()));
                }
            }
        }
        calls
    }

    /// Keeps the real API server's audit log as `<dir>/<name>.audit.log`
    /// when `NMO_BENCH_KEEP` names a folder.
    fn keep_audit(&self, name: &str) {
        let (Cluster::Real(cp), Ok(dir)) = (self, std::env::var("NMO_BENCH_KEEP")) else {
            return;
        };
        let to = std::path::Path::new(&dir).join(format!("{name}.audit.log"));
        if let Err(e) = std::fs::copy(cp.dir().join("audit.log"), &to) {
            eprintln!("keeping the audit log as {}: {e}", to.display());
        }
    }

    async fn stop(self) {
        match self {
            Cluster::Sim(c) => c.stop().await,
            Cluster::Real(cp) => cp.stop(),
        }
    }
}

/// A cluster with the case's workload running on its drained nodes, and
/// spare nodes (labelled for it) ready for the replacements.
async fn cluster(kind: Kind, case: &Case) -> (Cluster, Client) {
    let nodes = drained(case);
    let all: Vec<String> = nodes.iter().cloned().chain(spares()).collect();
    let (c, client) = Cluster::start(kind, &all).await;
    label(&client, &nodes).await;
    for (app, replicas, budget) in &case.apps {
        let mut spec = budget.clone();
        spec["selector"] = json!({"matchLabels": {"app": app}});
        c.apply(&format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {app}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {app}}}}}
  template:
    metadata:
      labels: {{app: {app}}}
      annotations: {{sim.nmo.medik8s.io/startup-seconds: "{ready}", pod-ready.stage.kwok.x-k8s.io/delay: "{ready}s"}}
    spec:
      nodeSelector: {{pool: bench}}
      topologySpreadConstraints: [{{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {{matchLabels: {{app: {app}}}}}}}]
      containers: [{{name: c, image: i}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: {app}, namespace: default}}
spec: {spec}
"#,
            ready = case.ready_after,
        ))
        .await;
    }
    let want: usize = case.apps.iter().map(|(_, n, _)| n).sum();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().filter(|p| is_ready(p)).count())
            .unwrap_or(0);
        if ready == want {
            break;
        }
        assert!(Instant::now() < deadline, "the workload never got Ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    label(&client, &spares()).await;
    (c, client)
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn label(client: &Client, nodes: &[String]) {
    let api: Api<Node> = Api::all(client.clone());
    for n in nodes {
        api.patch(
            n,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "bench"}}})),
        )
        .await
        .unwrap();
    }
}

async fn cordon(client: &Client, nodes: &[String]) {
    let api: Api<Node> = Api::all(client.clone());
    for n in nodes {
        api.patch(
            n,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    }
}

async fn pods_on(client: &Client, node: &str) -> Vec<String> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect()
        })
        .unwrap_or_default()
}

/// Cordons the nodes and evicts every pod on them, each refused eviction
/// retried after `retry`, all pods at once; returns when the nodes are
/// empty, with the eviction requests sent.
async fn evict_loop(client: &Client, nodes: &[String], retry: Duration) -> usize {
    cordon(client, nodes).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for node in nodes {
        for pod in pods_on(client, node).await {
            let (api, sent) = (api.clone(), sent.clone());
            tasks.push(async move {
                loop {
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match api.evict(&pod, &EvictParams::default()).await {
                        Err(kube::Error::Api(e)) if e.code == 429 => {
                            tokio::time::sleep(retry).await
                        }
                        _ => return,
                    }
                }
            });
        }
    }
    join_all(tasks).await;
    for node in nodes {
        wait_empty(client, node).await;
    }
    sent.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs the controller (production timings) on `client`.
fn operator(client: &Client) -> tokio::task::JoinHandle<()> {
    let policy = PolicyEngine::new(EngineConfig::default())
        .unwrap()
        .default_policy()
        .unwrap();
    let ctx = Context::new(
        client.clone(),
        nmo::policy::PolicyStore::single(policy),
        Settings::default(),
        nmo::registry::OperatorMetrics::register()
            .unwrap()
            .controller,
    );
    tokio::spawn(async move {
        let _ = controller::run(ctx).await;
    })
}

async fn nmo(kind: Kind, case: &Case) -> (Duration, usize) {
    let (c, client) = cluster(kind, case).await;
    let run = operator(&client);
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let t = Instant::now();
    let names = create_nms(&nms, &drained(case)).await;
    wait_succeeded(&nms, &names).await;
    let took = t.elapsed();
    let (_, evictions) = c.operator_requests();
    run.abort();
    c.keep_audit(&format!("{}-nmo", case.slug()));
    c.stop().await;
    (took, evictions)
}

async fn bare(kind: Kind, case: &Case, retry: Duration) -> (Duration, usize) {
    let (c, client) = cluster(kind, case).await;
    let t = Instant::now();
    let sent = evict_loop(&client, &drained(case), retry).await;
    let took = t.elapsed();
    c.keep_audit(&format!("{}-retry-{}ms", case.slug(), retry.as_millis()));
    c.stop().await;
    (took, sent)
}

/// nmo's requests per minute once a maintenance waits on a budget that
/// never allows (after a settling time), over `window`.
async fn blocked_for_good(kind: Kind, window: Duration) -> (f64, String) {
    let case = Case {
        name: "",
        apps: vec![("stuck", 2, json!({"minAvailable": 2}))],
        ready_after: 0,
        nodes: 1,
    };
    let (c, client) = cluster(kind, &case).await;
    let run = operator(&client);
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    create_nms(&nms, &drained(&case)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (before, _) = c.operator_requests();
    let calls_before = c.operator_calls();
    tokio::time::sleep(window).await;
    let (after, _) = c.operator_requests();
    let calls: Vec<String> = c
        .operator_calls()
        .into_iter()
        .filter_map(|(k, n)| {
            let n = n - calls_before.get(&k).copied().unwrap_or(0);
            (n > 0).then(|| format!("{n} {k}"))
        })
        .collect();
    run.abort();
    c.stop().await;
    (
        (after - before) as f64 / window.as_secs_f64() * 60.0,
        calls.join(", "),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let only = std::env::var("NMO_BENCH_CLUSTER").unwrap_or_default();
    for (kind, label) in [(Kind::Sim, "sim"), (Kind::Real, "real")] {
        if !only.is_empty() && only != label {
            continue;
        }
        table(kind, label).await;
    }
}

async fn table(kind: Kind, label: &str) {
    let s = |d: Duration| format!("{:.1} s", d.as_secs_f64());
    println!(
        "{:<52} {:>8} {:>8} {:>9} {:>9} {:>9}   evictions sent (nmo / floor / 5 s)",
        format!("budget-gated drain, {label}"),
        "nmo",
        "floor",
        "5 s retry",
        "nmo/floor",
        "nmo/5s"
    );
    let blocked_only = std::env::var("NMO_BENCH_ONLY").as_deref() == Ok("blocked");
    let one: Option<usize> = std::env::var("NMO_BENCH_CASE")
        .ok()
        .and_then(|n| n.parse().ok());
    let chosen = cases()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !blocked_only && one.is_none_or(|n| n == *i));
    for (_, case) in chosen {
        let (floor, floor_sent) = bare(kind, &case, Duration::from_millis(10)).await;
        let (kubectl, kubectl_sent) = bare(kind, &case, Duration::from_secs(5)).await;
        let (ours, ours_sent) = nmo(kind, &case).await;
        println!(
            "{:<52} {:>8} {:>8} {:>9} {:>8.2}x {:>8.2}x   {ours_sent} / {floor_sent} / {kubectl_sent}",
            case.name,
            s(ours),
            s(floor),
            s(kubectl),
            ours.as_secs_f64() / floor.as_secs_f64(),
            ours.as_secs_f64() / kubectl.as_secs_f64(),
        );
    }
    if one.is_some() {
        return;
    }
    let window = Duration::from_secs(60);
    let (per_minute, calls) = blocked_for_good(kind, window).await;
    println!(
        "a budget that never allows ({label}): nmo sends {per_minute:.0} requests a minute once it waits (goal <= 30); in {} s: {calls}",
        window.as_secs()
    );
}
