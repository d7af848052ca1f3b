//! The referee: the Go operator v0.21.0 (built with the real control
//! plane, `node-maintenance-operator` of its cache) and nmo, release
//! against release, on the real control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler, kwok):
//! `cargo bench -p nmo --bench referee`.
//!
//! Each operator runs as a local process with its Deployment's arguments
//! (leader election off: one replica; its webhook is not registered, so
//! neither admits), started afresh for every measurement, under one
//! ServiceAccount bound to cluster-admin so that the API server's audit
//! log counts both alike. Every case is measured `NMO_BENCH_RUNS` times
//! (default 3) on fresh nodes, the two operators alternated (Go first on
//! even runs, nmo first on odd ones), beside its floor: a bare client
//! doing the same removals as fast as the API server allows.
//!
//! The cases (`NMO_BENCH_CASES`, comma-separated, picks some):
//! - `bare-1000`, `bare-100`: bare pods gone as soon as evicted;
//! - `budget`: 200 bare pods that take 2 s to stop, and a Deployment of
//!   10 behind a PodDisruptionBudget `maxUnavailable: 1` whose
//!   replacements go to a spare node (the floor: evict, and again on every
//!   429, every 20 ms);
//! - `single`: a Deployment of one replica behind `minAvailable: 1`:
//!   stuck under either default (reported as such after
//!   `NMO_BENCH_STUCK` seconds, default 30); nmo under `no-downtime`
//!   surges it (the floor: scale to 2, wait Ready, evict, scale back);
//! - `fleet`: 20 maintenances created at once on 20 nodes of 20 bare pods
//!   each (the floor: every node's removals at once, 64 in flight, then
//!   the nodes' lists one at a time until all are empty);
//! - `fleet-100`, only when named: 100 maintenances at once, 30 pods a
//!   node, in a cluster of `NMO_BENCH_FLEET_NODES` (default 1,000) nodes,
//!   the nodes no measurement drains holding 30 idle pods each.
//!
//! Prints, per case, the medians, nmo / Go, nmo / floor, the operators'
//! API requests (median) and peak resident memory (`VmHWM`, median).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::{
    floor, free_port, http_get, install_crd, proc_status_kib, seed_kwok_pods, start_binary,
    stop_binary, succeeded_within, wait_empty, wait_running,
};
use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use nmo::crd::{NodeMaintenance, NodeMaintenanceSpec};
use nmo_control_plane::{ControlPlane, NodeSpec, Options};
use serde_json::json;

/// Who removes the pods.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    Floor,
    Go,
    Nmo,
}

/// One case's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Bare(usize),
    Budget,
    Single,
    /// Maintenances created at once, pods on each of their nodes.
    Fleet(usize, usize),
}

/// Nodes of the cluster in the `fleet-100` case (`NMO_BENCH_FLEET_NODES`):
/// the nodes no measurement drains hold the same pods, idle.
const FLEET_100_NODES: usize = 1000;
const BUDGET_PODS: usize = 200;
const BUDGET_REPLICAS: usize = 10;

impl Case {
    fn name(self) -> String {
        match self {
            Case::Bare(n) => format!("bare-{n}"),
            Case::Budget => "budget".into(),
            Case::Single => "single".into(),
            Case::Fleet(20, _) => "fleet".into(),
            Case::Fleet(n, _) => format!("fleet-{n}"),
        }
    }

    fn describe(self) -> String {
        match self {
            Case::Bare(n) => format!("{n} bare pods"),
            Case::Budget => format!(
                "{BUDGET_PODS} pods (2 s to stop) + a Deployment of {BUDGET_REPLICAS} behind maxUnavailable 1"
            ),
            Case::Single => "one replica behind minAvailable 1".into(),
            Case::Fleet(n, pods) => format!("{n} maintenances at once, {pods} pods each"),
        }
    }

    /// The nodes one measurement drains (the first), and the spare its
    /// workload moves to.
    fn nodes(self, run: usize, who: Who) -> Vec<String> {
        let base = format!("{}-{who:?}-{run}", self.name()).to_lowercase();
        match self {
            Case::Bare(_) => vec![base],
            Case::Budget | Case::Single => vec![base.clone(), format!("{base}-spare")],
            Case::Fleet(n, _) => (0..n).map(|i| format!("{base}-{i:03}")).collect(),
        }
    }
}

/// One measurement: its time (`None`: stuck at the deadline), the
/// operator's requests, its peak memory (KiB).
#[derive(Debug, Clone, Copy)]
struct Sample {
    took: Option<Duration>,
    requests: usize,
    peak_kib: u64,
}

struct Bench {
    cp: ControlPlane,
    admin: Client,
    /// The operators' kubeconfig (the `referee` ServiceAccount's).
    kubeconfig: PathBuf,
    user: String,
    dir: tempfile::TempDir,
    stuck: Duration,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = env_or("NMO_BENCH_RUNS", 3);
    let stuck = Duration::from_secs(env_or("NMO_BENCH_STUCK", 30));
    let all = [
        Case::Bare(1000),
        Case::Bare(100),
        Case::Budget,
        Case::Single,
        Case::Fleet(20, 20),
        // 1,000 nodes: only when asked for (NMO_BENCH_CASES=fleet-100).
        Case::Fleet(100, 30),
    ];
    let picked = std::env::var("NMO_BENCH_CASES").unwrap_or_default();
    let cases: Vec<Case> = all
        .into_iter()
        .filter(|c| match picked.as_str() {
            "" => *c != Case::Fleet(100, 30),
            _ => picked.split(',').any(|p| p.trim() == c.name()),
        })
        .collect();
    let bench = Bench::start(&cases, runs, stuck).await;
    let mut rows = Vec::new();
    for case in &cases {
        let mut samples: Vec<(Who, Sample)> = Vec::new();
        for run in 0..runs {
            let order = if run % 2 == 0 {
                [Who::Floor, Who::Go, Who::Nmo]
            } else {
                [Who::Floor, Who::Nmo, Who::Go]
            };
            for who in order {
                let s = bench.measure(*case, run, who).await;
                eprintln!("{} run {run} {who:?}: {s:?}", case.name());
                samples.push((who, s));
            }
            if *case == Case::Single {
                let s = bench.measure_surge(run).await;
                eprintln!("single run {run} nmo no-downtime: {s:?}");
                samples.push((Who::Nmo, s));
            }
        }
        rows.push(row(*case, &samples, stuck));
    }
    println!(
        "real control plane (Kubernetes {}, kwok), release builds, Go operator v0.21.0, {runs} runs a case, alternated; medians:",
        common::kubernetes_version()
    );
    println!(
        "| case | floor | Go v0.21.0 | nmo | nmo / Go | nmo / floor | requests nmo / Go | peak RSS nmo / Go |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---|");
    for r in rows {
        println!("{r}");
    }
    bench.cp.stop();
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of `values` (`None` when there are none).
fn median<T: Copy + PartialOrd>(mut values: Vec<T>) -> Option<T> {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    values.get(values.len() / 2).copied()
}

/// One line of the table. The single-replica case has two nmo samples a
/// run: the default policy's (stuck) and `no-downtime`'s; the latter is
/// the one the ratios use.
fn row(case: Case, samples: &[(Who, Sample)], stuck: Duration) -> String {
    let of = |who: Who| -> Vec<Sample> {
        samples
            .iter()
            .filter(|(w, _)| *w == who)
            .map(|(_, s)| *s)
            .collect()
    };
    let time = |s: &[Sample]| median(s.iter().filter_map(|s| s.took).collect());
    let stuck_count = |s: &[Sample]| s.iter().filter(|s| s.took.is_none()).count();
    let shown = |s: &[Sample]| match time(s) {
        Some(t) if stuck_count(s) == 0 => format!("{:.2} s", t.as_secs_f64()),
        Some(t) => format!("{:.2} s ({} stuck)", t.as_secs_f64(), stuck_count(s)),
        None => format!("stuck ({} s)", stuck.as_secs()),
    };
    let (floor_s, go_s, nmo_s) = (of(Who::Floor), of(Who::Go), of(Who::Nmo));
    let nmo_moving: Vec<Sample> = nmo_s.iter().filter(|s| s.took.is_some()).copied().collect();
    let nmo_shown = if case == Case::Single {
        format!(
            "default: {}; no-downtime: {}",
            shown(&nmo_s.iter().step_by(2).copied().collect::<Vec<_>>()),
            shown(&nmo_moving)
        )
    } else {
        shown(&nmo_s)
    };
    let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) if b > Duration::ZERO => {
            format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
        }
        _ => "–".into(),
    };
    let go_moving = if stuck_count(&go_s) > 0 {
        None
    } else {
        time(&go_s)
    };
    let requests = |s: &[Sample]| median(s.iter().map(|s| s.requests).collect()).unwrap_or(0);
    let peak = |s: &[Sample]| median(s.iter().map(|s| s.peak_kib).collect()).unwrap_or(0) >> 10;
    format!(
        "| {} | {} | {} | {} | {} | {} | {} / {} | {} / {} MiB |",
        case.describe(),
        shown(&floor_s),
        shown(&go_s),
        nmo_shown,
        ratio(time(&nmo_moving), go_moving),
        ratio(time(&nmo_moving), time(&floor_s)),
        requests(&nmo_moving),
        requests(&go_s),
        peak(&nmo_moving),
        peak(&go_s),
    )
}

impl Bench {
    /// The control plane with every node the cases need (labelled with
    /// its pool), the CRD, the operators' namespaces and their
    /// ServiceAccount.
    async fn start(cases: &[Case], runs: usize, stuck: Duration) -> Bench {
        let mut nodes = Vec::new();
        for case in cases {
            for run in 0..runs {
                for who in [Who::Floor, Who::Go, Who::Nmo] {
                    let names = case.nodes(run, who);
                    let pool = names[0].clone();
                    nodes.extend(
                        names
                            .into_iter()
                            .map(|n| NodeSpec::new(n).label("referee/pool", &pool)),
                    );
                }
                if *case == Case::Single {
                    let names = surge_nodes(run);
                    let pool = names[0].clone();
                    nodes.extend(
                        names
                            .into_iter()
                            .map(|n| NodeSpec::new(n).label("referee/pool", &pool)),
                    );
                }
            }
        }
        // The fleet-100 case's cluster: idle nodes up to
        // NMO_BENCH_FLEET_NODES, and every node of the case, with their
        // pods from the start.
        let mut preseeded = Vec::new();
        if cases.contains(&Case::Fleet(100, 30)) {
            let total = env_or("NMO_BENCH_FLEET_NODES", FLEET_100_NODES);
            preseeded = (nodes.len()..total)
                .map(|i| format!("idle-{i:04}"))
                .collect::<Vec<_>>();
            // Every node of the case holds its pods from the start.
            for run in 0..runs {
                for who in [Who::Floor, Who::Go, Who::Nmo] {
                    preseeded.extend(Case::Fleet(100, 30).nodes(run, who));
                }
            }
            nodes.extend(
                preseeded
                    .iter()
                    .filter(|n| n.starts_with("idle-"))
                    .map(|n| NodeSpec::new(n).label("referee/pool", "idle")),
            );
        }
        eprintln!("starting the control plane with {} nodes", nodes.len());
        let cp = ControlPlane::start(Options {
            nodes,
            audit: true,
            ..Options::default()
        })
        .await
        .expect("the real control plane starts");
        install_crd(&cp).await;
        cp.apply(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: medik8s-leases}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: node-maintenance-operator-system}\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: referee, namespace: node-maintenance-operator-system}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: referee}\n\
             roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\n\
             subjects: [{kind: ServiceAccount, name: referee, namespace: node-maintenance-operator-system}]\n",
        )
        .await
        .unwrap();
        let token = cp
            .service_account_token("node-maintenance-operator-system", "referee")
            .await
            .unwrap();
        let kubeconfig = cp.write_kubeconfig("referee.kubeconfig", &token).unwrap();
        let admin = cp.client().await.unwrap();
        let bench = Bench {
            cp,
            admin,
            kubeconfig,
            user: "system:serviceaccount:node-maintenance-operator-system:referee".into(),
            dir: tempfile::tempdir().unwrap(),
            stuck,
        };
        if !preseeded.is_empty() {
            let t = Instant::now();
            bench.seed_nodes(&preseeded, 30).await;
            eprintln!(
                "seeded {} nodes with 30 pods each in {:.0} s",
                preseeded.len(),
                t.elapsed().as_secs_f64()
            );
        }
        bench
    }

    /// `pods` bare pods on each of `nodes`, running.
    async fn seed_nodes(&self, nodes: &[String], pods: usize) {
        stream::iter(nodes)
            .for_each_concurrent(8, |n| async move {
                seed_kwok_pods(&self.admin, n, pods, "0s").await;
                wait_running(&self.admin, n, pods).await;
            })
            .await;
    }

    fn requests(&self) -> usize {
        self.cp
            .audit()
            .iter()
            .filter(|r| r.user == self.user)
            .count()
    }

    /// One measurement of `case` by `who`: the pods seeded and running,
    /// then (the operator started and ready) the clock runs from the
    /// maintenances' creation to all Succeeded.
    async fn measure(&self, case: Case, run: usize, who: Who) -> Sample {
        let nodes = case.nodes(run, who);
        self.seed(case, &nodes).await;
        if who == Who::Floor {
            let t = Instant::now();
            self.floor(case, &nodes).await;
            return Sample {
                took: Some(t.elapsed()),
                requests: 0,
                peak_kib: 0,
            };
        }
        let drained = match case {
            Case::Fleet(..) => nodes.clone(),
            _ => vec![nodes[0].clone()],
        };
        // A drain that cannot end is stuck at the stuck deadline; the
        // others have ten minutes.
        let limit = if case == Case::Single {
            self.stuck
        } else {
            Duration::from_secs(600)
        };
        self.maintain(who, &drained, None, limit).await
    }

    /// The single replica under `no-downtime`, on nodes of its own.
    async fn measure_surge(&self, run: usize) -> Sample {
        let nodes = surge_nodes(run);
        self.seed(Case::Single, &nodes).await;
        self.maintain(Who::Nmo, &nodes[..1], Some("no-downtime"), self.stuck)
            .await
    }

    /// Starts `who`, creates a maintenance of each of `nodes` at once and
    /// times them to Succeeded (stuck after `limit`); then deletes them,
    /// waits for the operator to restore the nodes, and stops it.
    async fn maintain(
        &self,
        who: Who,
        nodes: &[String],
        policy: Option<&str>,
        limit: Duration,
    ) -> Sample {
        let operator = Operator::start(self, who).await;
        let nms: Api<NodeMaintenance> = Api::all(self.admin.clone());
        let names: Vec<String> = nodes.iter().map(|n| format!("nm-{n}")).collect();
        let before = self.requests();
        let t = Instant::now();
        futures::future::join_all(nodes.iter().zip(&names).map(|(node, name)| {
            let mut nm = NodeMaintenance::new(
                name,
                NodeMaintenanceSpec {
                    node_name: node.clone(),
                    reason: Some("referee".into()),
                },
            );
            if let Some(p) = policy {
                nm.metadata.annotations =
                    Some([(nmo::policy::POLICY_ANNOTATION.to_owned(), p.to_owned())].into());
            }
            let nms = nms.clone();
            async move { nms.create(&PostParams::default(), &nm).await.unwrap() }
        }))
        .await;
        let took = succeeded_within(&nms, &names, t, limit)
            .await
            .then(|| t.elapsed());
        let requests = self.requests().saturating_sub(before);
        let peak_kib = proc_status_kib(operator.pid, "VmHWM:");
        for name in &names {
            let _ = nms.delete(name, &DeleteParams::default()).await;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        for name in &names {
            while nms.get_opt(name).await.ok().flatten().is_some() {
                assert!(Instant::now() < deadline, "{who:?}: {name} never went");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        operator.stop().await;
        Sample {
            took,
            requests,
            peak_kib,
        }
    }

    /// The case's pods on its nodes, running; its workload (if any) Ready
    /// on the first node, the spare open for its replacements.
    async fn seed(&self, case: Case, nodes: &[String]) {
        match case {
            Case::Bare(n) => {
                seed_kwok_pods(&self.admin, &nodes[0], n, "0s").await;
                wait_running(&self.admin, &nodes[0], n).await;
            }
            // Seeded with the cluster (see `start`).
            Case::Fleet(100, 30) => {}
            Case::Fleet(_, pods) => self.seed_nodes(nodes, pods).await,
            Case::Budget => {
                self.workload(&nodes[0], &nodes[1], BUDGET_REPLICAS, "maxUnavailable: 1")
                    .await;
                seed_kwok_pods(&self.admin, &nodes[0], BUDGET_PODS, "2s").await;
                wait_running(&self.admin, &nodes[0], BUDGET_PODS + BUDGET_REPLICAS).await;
            }
            Case::Single => {
                self.workload(&nodes[0], &nodes[1], 1, "minAvailable: 1")
                    .await;
            }
        }
    }

    /// A Deployment of `replicas` named after `node`, all on `node` (its
    /// spare cordoned while they are placed), behind a budget `rule`;
    /// then the spare opened.
    async fn workload(&self, node: &str, spare: &str, replicas: usize, rule: &str) {
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let cordon = |on: bool| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .patch(
                        spare,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"unschedulable": on}})),
                    )
                    .await
                    .unwrap();
            }
        };
        cordon(true).await;
        let yaml = format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {node}, namespace: default}}\n\
             spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {node}}}}}\n\
             \x20 template:\n    metadata: {{labels: {{app: {node}}}}}\n    spec:\n\
             \x20     terminationGracePeriodSeconds: 0\n\
             \x20     affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: {{nodeSelectorTerms: [{{matchExpressions: [{{key: referee/pool, operator: In, values: [{node}]}}]}}]}}}}}}\n\
             \x20     containers: [{{name: c, image: i}}]\n---\n\
             apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: {node}, namespace: default}}\n\
             spec: {{{rule}, selector: {{matchLabels: {{app: {node}}}}}}}\n"
        );
        self.cp.apply(&yaml).await.unwrap();
        self.wait_ready(node, replicas).await;
        cordon(false).await;
    }

    /// Waits until `app` has `count` Ready pods and its budget has
    /// counted them.
    async fn wait_ready(&self, app: &str, count: usize) {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let ready = pods
                .list(&ListParams::default().labels(&format!("app={app}")))
                .await
                .map(|l| l.items.iter().filter(|p| is_ready(p)).count())
                .unwrap_or(0);
            let healthy = Api::<PodDisruptionBudget>::namespaced(self.admin.clone(), "default")
                .get(app)
                .await
                .ok()
                .and_then(|b| b.status)
                .map(|s| s.current_healthy);
            if ready == count && healthy == i32::try_from(count).ok() {
                return;
            }
            assert!(Instant::now() < deadline, "{app}: {ready}/{count} Ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The same removals by a bare client, as fast as the API server
    /// allows.
    async fn floor(&self, case: Case, nodes: &[String]) {
        match case {
            Case::Bare(n) => {
                floor(&self.admin, &nodes[0], n).await;
            }
            Case::Fleet(_, pods) => {
                // Every node's removals at once, then one node's list at a
                // time until all are empty (polling them all at once
                // would load the API server the floor is measuring).
                let api: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
                stream::iter(
                    nodes
                        .iter()
                        .flat_map(|n| (0..pods).map(move |i| format!("{n}-p{i:04}"))),
                )
                .for_each_concurrent(64, |pod| {
                    let api = api.clone();
                    async move {
                        let _ = api.evict(&pod, &EvictParams::default()).await;
                    }
                })
                .await;
                for n in nodes {
                    wait_empty(&self.admin, n).await;
                }
            }
            Case::Budget => {
                let (bare, workload) = futures::future::join(
                    async {
                        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
                        stream::iter(0..BUDGET_PODS)
                            .for_each_concurrent(64, |i| {
                                let pods = pods.clone();
                                let node = &nodes[0];
                                async move {
                                    let _ = pods
                                        .evict(&format!("{node}-p{i:04}"), &EvictParams::default())
                                        .await;
                                }
                            })
                            .await
                    },
                    self.evict_until_gone(&nodes[0]),
                )
                .await;
                let _ = (bare, workload);
                wait_empty(&self.admin, &nodes[0]).await;
            }
            Case::Single => {
                // Make-before-break by hand: one more replica, Ready, then
                // the eviction the budget now allows, then back to one.
                let deployments: Api<Deployment> = Api::namespaced(self.admin.clone(), "default");
                let nodes_api: Api<Node> = Api::all(self.admin.clone());
                nodes_api
                    .patch(
                        &nodes[0],
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"unschedulable": true}})),
                    )
                    .await
                    .unwrap();
                let scale = |n: i32| {
                    let deployments = deployments.clone();
                    let name = nodes[0].clone();
                    async move {
                        deployments
                            .patch(
                                &name,
                                &PatchParams::default(),
                                &Patch::Merge(json!({"spec": {"replicas": n}})),
                            )
                            .await
                            .unwrap();
                    }
                };
                scale(2).await;
                self.wait_ready(&nodes[0], 2).await;
                self.evict_until_gone(&nodes[0]).await;
                scale(1).await;
                wait_empty(&self.admin, &nodes[0]).await;
            }
        }
    }

    /// Evicts the workload's pods on `node` (the app named after it) until
    /// none is left, again after every refusal, every 20 ms.
    async fn evict_until_gone(&self, node: &str) {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let left: Vec<String> = pods
                .list(
                    &ListParams::default()
                        .labels(&format!("app={node}"))
                        .fields(&format!("spec.nodeName={node}")),
                )
                .await
                .map(|l| {
                    l.items
                        .into_iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .filter_map(|p| p.metadata.name)
                        .collect()
                })
                .unwrap_or_default();
            if left.is_empty() {
                return;
            }
            for p in &left {
                let _ = pods.evict(p, &EvictParams::default()).await;
            }
            assert!(Instant::now() < deadline, "{node}: {left:?} never evicted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The nodes of the single replica's run under `no-downtime`.
fn surge_nodes(run: usize) -> Vec<String> {
    vec![
        format!("single-surge-{run}"),
        format!("single-surge-{run}-spare"),
    ]
}

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A running operator process.
struct Operator {
    child: tokio::process::Child,
    pid: u32,
}

impl Operator {
    async fn start(bench: &Bench, who: Who) -> Operator {
        let child = match who {
            Who::Nmo => {
                let policies = bench.dir.path().join("policies");
                std::fs::create_dir_all(&policies).unwrap();
                std::fs::copy(
                    Path::new(env!("NMO_POLICY_WASM_DIR")).join("nmo_policy_no_downtime.wasm"),
                    policies.join("no-downtime.wasm"),
                )
                .unwrap();
                start_binary(
                    &bench.kubeconfig,
                    &bench.dir.path().join("cache"),
                    &[format!("--policy-dir={}", policies.display())],
                )
                .await
                .0
            }
            Who::Go => start_go(bench).await,
            Who::Floor => unreachable!("the floor runs no operator"),
        };
        let pid = child.id().unwrap();
        Operator { child, pid }
    }

    async fn stop(self) {
        stop_binary(self.child).await;
    }
}

/// The Go operator v0.21.0 as its Deployment runs it (leader election
/// off, metrics off, its probes on a loopback port, a serving certificate
/// where controller-runtime looks for one), once its controller's workers
/// have started (its caches synced: its `/readyz` is a ping only).
async fn start_go(bench: &Bench) -> tokio::process::Child {
    let certs = Path::new("/tmp/k8s-webhook-server/serving-certs");
    std::fs::create_dir_all(certs).unwrap();
    let cert =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    std::fs::write(certs.join("tls.crt"), cert.cert.pem()).unwrap();
    std::fs::write(certs.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    let probe = free_port();
    let log = bench.dir.path().join("go.log");
    let mut child =
        tokio::process::Command::new(bench.cp.binaries().path("node-maintenance-operator"))
            .args([
                "--metrics-bind-address=0".to_owned(),
                format!("--health-probe-bind-address=127.0.0.1:{probe}"),
            ])
            .env("KUBECONFIG", &bench.kubeconfig)
            .env("OPERATOR_NAMESPACE", "node-maintenance-operator-system")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("the Go operator starts");
    let t = Instant::now();
    loop {
        let started = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Starting workers");
        let ready = http_get(probe, "/readyz")
            .await
            .is_some_and(|(code, _)| code == 200);
        if started && ready {
            return child;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the Go operator exited: {status}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the Go operator never started its workers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
