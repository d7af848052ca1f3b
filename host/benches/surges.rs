//! Make-before-break at scale (issue 45): the shipped `no-downtime` policy
//! against the default policy on the same workload, nmo-sim.
//!
//! 50 nodes, 2,000 pods: 40 Deployments of 50 replicas (maxSurge 25 %,
//! the API's default), each pod Ready 1 simulated second after it starts
//! and gone 3 after it is told to stop (as `nmo demo`'s web pods). Five nodes are maintained at
//! once, first under the default policy (evictions), then, once the
//! workload is whole again, under `no-downtime` (every pod surged: its
//! replacement Ready elsewhere before it goes). Prints both times and
//! their ratio; the goal is 2x or less. Surges of one Deployment run
//! together within its maxSurge, so the five nodes' pods of one owner
//! wait for one round of replacements, not one after another, and leave
//! in one hand-over (one claim, one lowering) rather than pod by pod.
//!
//! Run with `cargo bench -p nmo --bench surges`. `NMO_BENCH_SURGE_SCALE`
//! sets the simulated seconds per real second (default 10),
//! `NMO_BENCH_SURGE_STARTUP` the replacements' start (default 1).

use std::time::{Duration, Instant};

mod common;

use common::wait_succeeded;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nmo::controller::{self, Context, Settings};
use nmo::crd::{NodeMaintenance, NodeMaintenanceSpec};
use nmo_sim::{SimCluster, SimOptions};

const NODES: usize = 50;
const OWNERS: usize = 40;
const REPLICAS: usize = 50;
const MAINTAINED: usize = 5;
/// A pod's shutdown once told to stop (`nmo demo`'s web pods take 3 s),
/// in simulated seconds.
const SHUTDOWN_SECONDS: u32 = 3;

/// A replacement's start until Ready, in simulated seconds:
/// `NMO_BENCH_SURGE_STARTUP`, default 1.
fn startup_seconds() -> u32 {
    std::env::var("NMO_BENCH_SURGE_STARTUP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn deployment(i: usize) -> String {
    let startup = startup_seconds();
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: app-{i:02}, namespace: default}}
spec:
  replicas: {REPLICAS}
  selector: {{matchLabels: {{app: app-{i:02}}}}}
  template:
    metadata:
      labels: {{app: app-{i:02}}}
      annotations:
        sim.nmo.medik8s.io/startup-seconds: "{startup}"
        sim.nmo.medik8s.io/shutdown-seconds: "{SHUTDOWN_SECONDS}"
    spec: {{containers: [{{name: c, image: i}}]}}
"#
    )
}

/// Every Deployment has all its replicas Ready (and no surge is left).
async fn whole(deployments: &Api<Deployment>) -> bool {
    deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .all(|d| {
            let s = d.status.clone().unwrap_or_default();
            let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            wanted == REPLICAS as i32
                && s.ready_replicas == Some(wanted)
                && s.replicas == Some(wanted)
        })
}

async fn wait_whole(deployments: &Api<Deployment>) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !whole(deployments).await {
        if Instant::now() >= deadline {
            let short: Vec<String> = deployments
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .map(|d| {
                    format!(
                        "{:?} {:?}",
                        d.spec.as_ref().and_then(|s| s.replicas),
                        d.status
                    )
                })
                .take(3)
                .collect();
            panic!("the workload never whole again: {short:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Maintains five nodes from `first` under `policy`, waits for all to
/// succeed, then ends the maintenances and waits for the nodes to be
/// schedulable again. Returns the time to Succeeded.
async fn round(api: &Api<NodeMaintenance>, policy: &str, first: usize) -> Duration {
    let names: Vec<String> = (0..MAINTAINED)
        .map(|n| format!("nm-{policy}-{n}"))
        .collect();
    let t = Instant::now();
    for (n, name) in names.iter().enumerate() {
        let mut nm = NodeMaintenance::new(
            name,
            NodeMaintenanceSpec {
                node_name: format!("node-{:02}", first + n),
                reason: Some("bench".into()),
            },
        );
        // The default policy is the one a maintenance names none of.
        if policy != "default" {
            nm.metadata.annotations =
                Some([(nmo::policy::POLICY_ANNOTATION.to_owned(), policy.to_owned())].into());
        }
        api.create(&PostParams::default(), &nm).await.unwrap();
    }
    wait_succeeded(api, &names).await;
    let took = t.elapsed();
    for name in &names {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(Instant::now() < deadline, "maintenances never ended");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    took
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let scale: f64 = std::env::var("NMO_BENCH_SURGE_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10.0);
    let c = SimCluster::start(SimOptions {
        time_scale: scale,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    c.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
    for n in 0..NODES {
        c.add_node(&format!("node-{n:02}")).unwrap();
    }
    for i in 0..OWNERS {
        c.apply_yaml(&deployment(i)).unwrap();
    }
    let client = nmo::client::client_from_kubeconfig(&c.kubeconfig())
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    wait_whole(&deployments).await;
    eprintln!("workload whole in {:.1?}", t.elapsed());

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        std::path::Path::new(env!("NMO_POLICY_WASM_DIR")).join("nmo_policy_no_downtime.wasm"),
        dir.path().join("no-downtime.wasm"),
    )
    .unwrap();
    std::fs::write(dir.path().join("policies.yaml"), "default: builtin\n").unwrap();
    let metrics = nmo::registry::OperatorMetrics::register().unwrap();
    let engine = nmo::policy::PolicyEngine::observed(
        nmo::policy::EngineConfig::default(),
        metrics.policy.observer(),
    )
    .unwrap();
    let store = nmo::policy::PolicyStore::from_dir(engine, dir.path(), None).unwrap();
    let ctx = Context::new(
        client.clone(),
        store,
        Settings::default(),
        metrics.controller.clone(),
    );
    tokio::spawn(controller::run(ctx));
    let api: Api<NodeMaintenance> = Api::all(client.clone());

    let pods_on = |n: usize| {
        let c = &c;
        async move {
            c.list("v1", "Pod")
                .unwrap()
                .iter()
                .filter(|p| p["spec"]["nodeName"] == format!("node-{n:02}"))
                .count()
        }
    };
    // Each round drains nodes of its own: the first round's pods went
    // to the others.
    let mut maintained = [0, 0];
    for n in 0..MAINTAINED {
        maintained[0] += pods_on(n).await;
    }
    let default = round(&api, "default", 0).await;
    eprintln!("default policy: {default:.2?}");
    wait_whole(&deployments).await;
    for n in MAINTAINED..2 * MAINTAINED {
        maintained[1] += pods_on(n).await;
    }
    let mut most = 0;
    c.record_audit(true);
    let audit_from = c.audit().len();
    let surge = {
        let watch = async {
            loop {
                for d in deployments
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                {
                    most = most.max(d.spec.and_then(|s| s.replicas).unwrap_or(0));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            took = round(&api, "no-downtime", MAINTAINED) => took,
            _ = watch => unreachable!(),
        }
    };
    let requests = requests_by_kind(&c.audit()[audit_from..], surge);
    let one_owner = writes_of(&c.audit()[audit_from..], "app-00");
    wait_whole(&deployments).await;
    println!(
        "{NODES} nodes, {} pods ({OWNERS} Deployments of {REPLICAS}, maxSurge 25 %), \
         {MAINTAINED} nodes maintained at once, pods Ready {} s after they start \
         and gone {SHUTDOWN_SECONDS} s after they are told to stop (simulated; {scale} simulated s per s)",
        OWNERS * REPLICAS,
        startup_seconds()
    );
    println!(
        "default policy (evictions):     {default:>8.2?}  ({} pods on the nodes)",
        maintained[0]
    );
    println!(
        "no-downtime (every pod surged): {surge:>8.2?}  ({} pods on the nodes; most replicas of \
         one Deployment: {most}, maxSurge allows {})",
        maintained[1],
        REPLICAS + REPLICAS.div_ceil(4)
    );
    println!(
        "ratio no-downtime / default:    {:>8.2} (goal: 2 or less)",
        surge.as_secs_f64() / default.as_secs_f64()
    );
    println!(
        "requests during the no-downtime round (the operator's and the cluster's own):\n{requests}"
    );
    println!(
        "writes of Deployment app-00 (ms from the round's first request, HTTP code): {one_owner}"
    );
}

/// When the Deployment `name` was written, and with what answer.
fn writes_of(audit: &[nmo_sim::AuditRecord], name: &str) -> String {
    let Some(first) = audit.first().map(|r| r.at) else {
        return String::new();
    };
    audit
        .iter()
        .filter(|r| r.verb == "patch" && r.resource == "deployments" && r.name == name)
        .map(|r| format!("{}({})", r.at.duration_since(first).as_millis(), r.code))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The requests of `audit` made within `window` of the first, counted by
/// verb and resource, most first; with when the last of each kind came.
fn requests_by_kind(audit: &[nmo_sim::AuditRecord], window: Duration) -> String {
    let Some(first) = audit.first().map(|r| r.at) else {
        return "  (none)".into();
    };
    let mut by: std::collections::BTreeMap<String, (usize, Duration)> = Default::default();
    for r in audit
        .iter()
        .filter(|r| r.at.duration_since(first) <= window)
    {
        let key = format!(
            "{} {}{}",
            r.verb,
            r.resource,
            if r.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", r.subresource)
            }
        );
        let e = by.entry(key).or_default();
        e.0 += 1;
        e.1 = e.1.max(r.at.duration_since(first));
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by_key(|(_, (n, _))| std::cmp::Reverse(*n));
    rows.iter()
        .map(|(k, (n, last))| format!("  {n:>6}  {k:<40} last at {last:.2?}"))
        .collect::<Vec<_>>()
        .join("\n")
}
