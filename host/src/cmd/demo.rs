//! `nmo demo`: the operator's main job on an embedded simulated cluster.
//!
//! Starts the simulated cluster with a realistic workload, runs the
//! operator, puts a node into maintenance showing live progress and events,
//! prints the final NodeMaintenance as `kubectl describe nm` would, then
//! ends the maintenance and shows the node restored.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use nmo::controller::{self, Context, Settings};
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};
use nmo::policy::{EngineConfig, PolicyEngine};
use nmo_sim::{SimCluster, SimOptions};

/// Options of `nmo demo`.
pub struct DemoOptions {
    pub policy: Option<PathBuf>,
    pub nodes: usize,
    pub pods: usize,
    pub keep_running: bool,
}

fn workload(pods: usize) -> String {
    let web = pods.saturating_sub(8).max(2);
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: shop}}
spec:
  replicas: {web}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}, annotations: {{sim.nmo.medik8s.io/shutdown-seconds: "3"}}}}
    spec: {{containers: [{{name: web, image: "nginx:1.27"}}]}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: web, namespace: shop}}
spec:
  maxUnavailable: 1
  selector: {{matchLabels: {{app: web}}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: api, namespace: shop}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: api}}}}
  template:
    metadata: {{labels: {{app: api}}}}
    spec: {{containers: [{{name: api, image: "api:2.1"}}]}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: api, namespace: shop}}
spec:
  minAvailable: 2
  selector: {{matchLabels: {{app: api}}}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db, namespace: shop}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec: {{containers: [{{name: db, image: "postgres:17"}}]}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: node-exporter, namespace: kube-system}}
spec:
  selector: {{matchLabels: {{app: node-exporter}}}}
  template:
    metadata: {{labels: {{app: node-exporter}}}}
    spec: {{containers: [{{name: exporter, image: "node-exporter:1.8"}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: debug-shell, namespace: shop}}
spec: {{nodeName: worker-1, containers: [{{name: sh, image: busybox}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: cache-warmer, namespace: shop}}
spec:
  nodeName: worker-1
  containers: [{{name: warm, image: "warmer:1"}}]
  volumes: [{{name: scratch, emptyDir: {{}}}}]
"#
    )
}

fn row(label: &str, value: impl std::fmt::Display) {
    println!("{label:<24}{value}");
}

async fn print_pods(client: &Client, node: &str) -> anyhow::Result<()> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let mut names: Vec<String> = pods
        .items
        .iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    names.sort();
    println!("  pods on {node} ({}): {}", names.len(), names.join(", "));
    Ok(())
}

fn node_line(node: &Node) -> String {
    let spec = node.spec.clone().unwrap_or_default();
    let taints: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    format!(
        "unschedulable={} taints=[{}] exclude-from-remediation={}",
        spec.unschedulable.unwrap_or(false),
        taints.join(", "),
        node.labels()
            .get(nmo::controller::node::EXCLUDE_LABEL)
            .map_or("-", String::as_str)
    )
}

/// Prints a NodeMaintenance the way `kubectl describe nm` lays it out.
fn describe(nm: &NodeMaintenance, events: &[Event]) {
    let s = nm.status.clone().unwrap_or_default();
    println!();
    row("Name:", nm.name_any());
    row("Namespace:", "");
    row("API Version:", "nodemaintenance.medik8s.io/v1beta1");
    row("Kind:", "NodeMaintenance");
    row("Finalizers:", nm.finalizers().join(", "));
    println!("Spec:");
    row("  Node Name:", &nm.spec.node_name);
    row("  Reason:", nm.spec.reason.clone().unwrap_or_default());
    println!("Status:");
    row("  Drain Progress:", s.drain_progress);
    row("  Error On Lease Count:", s.error_on_lease_count);
    row("  Eviction Pods:", s.eviction_pods);
    if let Some(e) = &s.last_error {
        row("  Last Error:", e);
    }
    if let Some(t) = &s.last_update {
        row("  Last Update:", t.0);
    }
    row("  Phase:", s.phase.map_or("", |p| p.as_str()));
    if let Some(p) = &s.policy {
        row("  Policy:", p);
    }
    row("  Totalpods:", s.total_pods);
    println!("Events:");
    println!("  {:<8} {:<20} {:<16} Message", "Type", "Reason", "From");
    println!("  {:<8} {:<20} {:<16} -------", "----", "------", "----");
    for e in events {
        println!(
            "  {:<8} {:<20} {:<16} {}",
            e.type_.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            e.source
                .as_ref()
                .and_then(|s| s.component.clone())
                .unwrap_or_default(),
            e.message.clone().unwrap_or_default()
        );
    }
    println!();
}

async fn events_for(client: &Client, name: &str) -> Vec<Event> {
    let mut items = Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    items.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    items
}

pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    let began = Instant::now();
    let engine = PolicyEngine::new(EngineConfig::default())?;
    let policy = match &opts.policy {
        Some(path) => engine.load_file(path)?,
        None => engine.default_policy()?,
    };
    println!(
        "== nmo demo: policy {} (sha256 {})",
        policy.name(),
        &policy.digest()[..12]
    );

    let cluster = SimCluster::start(SimOptions {
        time_scale: 10.0,
        ..SimOptions::default()
    })
    .await?;
    cluster.apply_yaml(&nmo::crd::crd_yaml())?;
    cluster.create(
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    )?;
    for i in 1..=opts.nodes.max(2) {
        cluster.add_node(&format!("worker-{i}"))?;
    }
    let node1 = cluster.get("v1", "Node", None, "worker-1")?;
    cluster.create(serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "kube-proxy-worker-1", "namespace": "kube-system",
        "annotations": {"kubernetes.io/config.mirror": "demo", "kubernetes.io/config.source": "file"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": node1["metadata"]["uid"], "controller": true}]},
        "spec": {"nodeName": "worker-1", "containers": [{"name": "kube-proxy", "image": "kube-proxy:v1.32"}]}}))?;
    cluster.apply_yaml(&workload(opts.pods))?;
    println!(
        "== simulated cluster at {} with {} nodes; workload: Deployments web and api (with PDBs), StatefulSet db, DaemonSet node-exporter, a bare pod, an emptyDir pod, a static pod",
        cluster.url(),
        opts.nodes.max(2)
    );

    let client = nmo::client::client_from_kubeconfig(&cluster.kubeconfig()).await?;
    let ctx = Context::new(
        client.clone(),
        nmo::policy::PolicyStore::single(policy),
        Settings {
            instance: "nmo-demo".into(),
            ..Settings::default()
        },
    );
    let operator = tokio::spawn(controller::run(ctx));

    // Let the workload come up.
    let pods_api = Api::<Pod>::all(client.clone());
    let started = Instant::now();
    loop {
        let pods = pods_api.list(&ListParams::default()).await?;
        let running = pods
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == pods.items.len() && running >= opts.pods.min(20)
            || started.elapsed() > Duration::from_secs(20)
        {
            println!("== {running} pods running");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    print_pods(&client, "worker-1").await?;

    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let nm = NodeMaintenance::new(
        "worker-1-maintenance",
        NodeMaintenanceSpec {
            node_name: "worker-1".into(),
            reason: Some("kernel upgrade".into()),
        },
    );
    nms.create(&PostParams::default(), &nm)
        .await
        .context("creating the NodeMaintenance")?;
    println!(
        "== kubectl apply: NodeMaintenance worker-1-maintenance (node worker-1, reason \"kernel upgrade\")"
    );

    let bar = ProgressBar::new(100);
    bar.set_style(
        ProgressStyle::with_template("{spinner} drain [{bar:40}] {pos:>3}% {msg}")?
            .progress_chars("=> "),
    );
    let mut seen_events = HashSet::new();
    let mut last_pending = usize::MAX;
    let done = loop {
        let current = nms.get("worker-1-maintenance").await?;
        let s = current.status.clone().unwrap_or_default();
        bar.set_position(s.drain_progress.clamp(0, 100) as u64);
        let pending = s.pending_pods.clone().unwrap_or_default();
        if pending.len() != last_pending {
            last_pending = pending.len();
            bar.set_message(format!("{} pod(s) pending", pending.len()));
            if bar.is_hidden() && s.phase.is_some() {
                println!(
                    "  drain {:>3}%: {} pod(s) pending",
                    s.drain_progress,
                    pending.len()
                );
            }
        }
        for e in events_for(&client, "worker-1-maintenance").await {
            if seen_events.insert(e.name_any()) {
                let line = format!(
                    "  event {} {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                );
                if bar.is_hidden() {
                    println!("{line}");
                } else {
                    bar.println(line);
                }
            }
        }
        match s.phase {
            Some(MaintenancePhase::Succeeded) | Some(MaintenancePhase::Failed) => break current,
            _ => {}
        }
        if started.elapsed() > Duration::from_secs(120) {
            break current;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    bar.finish_with_message("done");
    describe(&done, &events_for(&client, "worker-1-maintenance").await);
    let node = Api::<Node>::all(client.clone()).get("worker-1").await?;
    println!("== node worker-1 in maintenance: {}", node_line(&node));
    print_pods(&client, "worker-1").await?;

    if opts.keep_running {
        let path = std::env::temp_dir().join("nmo-demo.kubeconfig");
        cluster.write_kubeconfig(&path)?;
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "nmo".into());
        println!(
            "== cluster left running (Ctrl-C to stop). Try:\n   export KUBECONFIG={}\n   kubectl get nm,nodes,pods -A\n   ln -sf {exe} /usr/local/bin/kubectl-nm   # the kubectl plugin, once\n   kubectl nm plan worker-2   # what a maintenance of worker-2 would do\n   kubectl nm status",
            path.display()
        );
        tokio::signal::ctrl_c().await?;
    }

    nms.delete("worker-1-maintenance", &DeleteParams::default())
        .await?;
    println!("== kubectl delete nm worker-1-maintenance");
    let started = Instant::now();
    while nms.get_opt("worker-1-maintenance").await?.is_some()
        && started.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let node = Api::<Node>::all(client.clone()).get("worker-1").await?;
    println!("== node worker-1 restored: {}", node_line(&node));
    for e in events_for(&client, "worker-1").await {
        println!(
            "  event on node worker-1: {} {}",
            e.reason.unwrap_or_default(),
            e.message.unwrap_or_default()
        );
    }
    println!("== demo finished in {:.1} s", began.elapsed().as_secs_f64());
    operator.abort();
    cluster.stop().await;
    let phase = done.status.and_then(|s| s.phase);
    anyhow::ensure!(
        phase == Some(MaintenancePhase::Succeeded),
        "the maintenance ended in {phase:?}"
    );
    Ok(())
}
