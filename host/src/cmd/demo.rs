//! `nmo demo`: the operator's main job on an embedded simulated cluster.
//!
//! Starts the simulated cluster with a realistic workload, runs the
//! operator, puts a node into maintenance showing live progress and events,
//! prints the final NodeMaintenance as `kubectl describe nm` would, then
//! ends the maintenance and shows the node restored.

use std::collections::{BTreeMap, HashSet};
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
    /// A policy directory (`.wasm` files and `policies.yaml`, with the
    /// policies' settings), as the operator's `--policy-dir`.
    pub policy_dir: Option<PathBuf>,
    pub nodes: usize,
    pub pods: usize,
    pub keep_running: bool,
    /// The user's own workload (`--workload`), instead of the demo's.
    pub workload: Option<super::workload::Workload>,
}

/// The maintenance the demo creates.
const NM: &str = "worker-1-maintenance";
/// How long the demo watches a drain that makes no progress (no pod goes)
/// before it says so and ends; a drain that progresses is watched to its
/// end, however long it takes.
const STALL_LIMIT: Duration = Duration::from_secs(120);
/// How long an interrupted demo waits for the node to be restored.
const RESTORE_LIMIT: Duration = Duration::from_millis(1500);

/// How the demo ended, as its exit code says: 0 the maintenance
/// succeeded and the node was restored; 1 it did not (failed, only pods
/// the policy blocks on left, or no progress for [`STALL_LIMIT`]); 130
/// interrupted (Ctrl-C or SIGTERM) before the maintenance ended. With
/// `--keep-running`, Ctrl-C is how the demo ends: the code is the
/// maintenance's (0 or 1).
pub enum Outcome {
    Succeeded,
    NotSucceeded,
    Interrupted,
}

impl Outcome {
    pub fn exit_code(&self) -> std::process::ExitCode {
        std::process::ExitCode::from(match self {
            Outcome::Succeeded => 0,
            Outcome::NotSucceeded => 1,
            Outcome::Interrupted => 130,
        })
    }
}

/// Resolves at Ctrl-C or SIGTERM (from then on, every later call at once).
#[derive(Clone)]
struct Interrupt(tokio::sync::watch::Receiver<bool>);

impl Interrupt {
    fn listen() -> Self {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let term = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = term => {}
            }
            let _ = tx.send(true);
        });
        Interrupt(rx)
    }

    async fn wait(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
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
kind: StatefulSet
metadata: {{name: queue, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: queue}}}}
  template:
    metadata: {{labels: {{app: queue}}}}
    # On worker-1's local disk: a stateful pod the drain always meets.
    spec: {{nodeSelector: {{kubernetes.io/hostname: worker-1}}, containers: [{{name: broker, image: "rabbitmq:4"}}]}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: node-exporter, namespace: kube-system}}
spec:
  selector: {{matchLabels: {{app: node-exporter}}}}
  template:
    metadata: {{labels: {{app: node-exporter}}}}
    spec: {{containers: [{{name: exporter, image: "node-exporter:1.8"}}]}}

"#
    )
}

/// Pods put on worker-1 by hand, after the controllers' pods are placed
/// (so that those spread over every node, worker-1 included).
const BARE_PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: debug-shell, namespace: shop}
spec: {nodeName: worker-1, containers: [{name: sh, image: busybox}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: cache-warmer
  namespace: shop
  # The opt-out policy leaves it in place (a node-local cache); the
  # default ignores the annotation and evicts it.
  annotations: {nmo.medik8s.io/drain: skip}
spec:
  nodeName: worker-1
  containers: [{name: warm, image: "warmer:1"}]
  volumes: [{name: scratch, emptyDir: {}}]
"#;

fn row(label: &str, value: impl std::fmt::Display) {
    outln!("{label:<24}{value}");
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
    outln!("  pods on {node} ({}): {}", names.len(), names.join(", "));
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
    outln!();
    row("Name:", nm.name_any());
    row("Namespace:", "");
    row("API Version:", "nodemaintenance.medik8s.io/v1beta1");
    row("Kind:", "NodeMaintenance");
    row("Finalizers:", nm.finalizers().join(", "));
    outln!("Spec:");
    row("  Node Name:", &nm.spec.node_name);
    row("  Reason:", nm.spec.reason.clone().unwrap_or_default());
    outln!("Status:");
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
    outln!("Events:");
    outln!("  {:<8} {:<20} {:<16} Message", "Type", "Reason", "From");
    outln!("  {:<8} {:<20} {:<16} -------", "----", "------", "----");
    for e in events {
        outln!(
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
    outln!();
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

pub async fn run(opts: DemoOptions) -> anyhow::Result<Outcome> {
    let began = Instant::now();
    let mut interrupt = Interrupt::listen();
    let engine = PolicyEngine::new(EngineConfig::default())?;
    // What the demo adds for a shipped policy whose difference needs it.
    let scene = match (&opts.policy_dir, &opts.policy) {
        (None, Some(path)) => super::scene::scene(&policy_name(path), std::time::SystemTime::now()),
        _ => None,
    };
    let (store, files) = match (&opts.policy_dir, &opts.policy) {
        (Some(dir), _) => {
            let store = nmo::policy::PolicyStore::from_dir(engine.clone(), dir, None)?;
            outln!(
                "== nmo demo: policy directory {}: {}",
                dir.display(),
                store.current().summary()
            );
            (store, Some(directory_files(dir)?))
        }
        (None, Some(path)) => {
            // Named as the cluster names it (`never-force`, not its file).
            let name = policy_name(path);
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let loaded = engine.load(&name, &bytes)?;
            let policy = match &scene {
                Some(s) if !s.settings.is_empty() => {
                    loaded.with_settings(nmo::policy::Settings::from_map(&s.settings))?
                }
                _ => loaded.alone()?,
            };
            outln!(
                "== nmo demo: policy {} (sha256 {})",
                policy.name(),
                &policy.digest()[..12]
            );
            let settings = scene
                .as_ref()
                .map(|s| s.settings.clone())
                .unwrap_or_default();
            let files = [
                (format!("{name}.wasm"), bytes),
                (
                    "policies.yaml".to_owned(),
                    super::scene::policies_yaml(&name, &settings).into_bytes(),
                ),
            ];
            (nmo::policy::PolicyStore::single(policy), Some(files.into()))
        }
        (None, None) => {
            let policy = engine.default_policy()?;
            outln!(
                "== nmo demo: policy {} (sha256 {})",
                policy.name(),
                &policy.digest()[..12]
            );
            (nmo::policy::PolicyStore::single(policy), None)
        }
    };
    let cluster = start_cluster(&opts, scene.as_ref()).await?;
    let client = nmo::client::client_from_kubeconfig(&cluster.kubeconfig()).await?;
    if let Some(files) = files {
        publish_policies(&client, files).await?;
    }
    let ctx = Context::new(
        client.clone(),
        store,
        Settings {
            instance: "nmo-demo".into(),
            // The demo ends its maintenance after Ctrl-C: the operator
            // must still be running then.
            stop_on_signal: false,
            ..Settings::default()
        },
        // The demo serves no metrics: a registry of its own.
        controller::ControllerMetrics::register(&prometheus::Registry::new())?,
    );
    let operator = tokio::spawn(controller::run(ctx));
    let outcome = tokio::select! {
        r = maintain(&client, &opts, &engine, scene.as_ref()) => r?,
        () = interrupt.wait() => Outcome::Interrupted,
    };
    // With --keep-running, Ctrl-C is how the demo ends, and the
    // maintenance's own outcome stands: the wait is outside the race above.
    if opts.keep_running && !matches!(outcome, Outcome::Interrupted) {
        keep_running(&cluster, interrupt.clone()).await?;
    }
    // After a signal, the node gets a short while to be restored.
    let hurry = *interrupt.0.borrow();
    let outcome = finish(&client, outcome, hurry).await?;
    outln!("== demo finished in {:.1} s", began.elapsed().as_secs_f64());
    operator.abort();
    cluster.stop().await;
    Ok(outcome)
}

/// The name of the policy in a file, as the cluster names it: the file's
/// stem, a built one without its `nmo_policy_` prefix and with `-` for
/// `_` (`nmo_policy_never_force.wasm`: `never-force`).
fn policy_name(path: &std::path::Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "demo".into());
    stem.strip_prefix("nmo_policy_")
        .map(|s| s.replace('_', "-"))
        .unwrap_or(stem)
}

/// The policies ConfigMap's files for a policy directory: its regular
/// files, as a ConfigMap made from it holds them.
fn directory_files(dir: &std::path::Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            let name = entry.file_name().to_string_lossy().into_owned();
            files.insert(name, std::fs::read(entry.path())?);
        }
    }
    Ok(files)
}

/// Puts the demo's policies where `nmo plan` and `kubectl nm plan` look
/// for the operator's: the policies ConfigMap `deploy/` installs (`.wasm`
/// files as binaryData, the rest as data). So `--keep-running` shows the
/// plan of the policies the demo's operator runs, not the embedded
/// default.
async fn publish_policies(client: &Client, files: BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    let (namespace, name) = nmo::plan::DEFAULT_CONFIGMAP;
    let (mut data, mut binary) = (BTreeMap::new(), BTreeMap::new());
    for (key, bytes) in files {
        if key.ends_with(".wasm") {
            binary.insert(key, ByteString(bytes));
        } else {
            data.insert(key, String::from_utf8_lossy(&bytes).into_owned());
        }
    }
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).context("creating the operator's namespace"),
    }
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(data),
        binary_data: Some(binary),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .context("creating the policies ConfigMap")?;
    Ok(())
}

/// The policy file `--policy` names: a path, or the name of a policy this
/// build made (`never-force`, `stateful-last`, ...: the crates under
/// `policies/`, built into the build's policy folder).
pub fn policy_path(given: &std::path::Path) -> anyhow::Result<PathBuf> {
    if given.exists() || given.extension().is_some_and(|e| e == "wasm") {
        return Ok(given.to_owned());
    }
    let built = std::path::Path::new(env!("NMO_POLICY_WASM_DIR"));
    let name = given.display().to_string();
    let file = built.join(format!("nmo_policy_{}.wasm", name.replace('-', "_")));
    if file.is_file() {
        return Ok(file);
    }
    let known: Vec<String> = std::fs::read_dir(built)
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    let stem = n.strip_prefix("nmo_policy_")?.strip_suffix(".wasm")?;
                    Some(stem.replace('_', "-"))
                })
                .collect()
        })
        .unwrap_or_default();
    anyhow::bail!(
        "no policy file {name} and no built policy of that name{}",
        if known.is_empty() {
            String::new()
        } else {
            let mut known = known;
            known.sort();
            format!(" (built: {})", known.join(", "))
        }
    )
}

/// The simulated cluster with its workload placed: controllers' pods
/// spread over every node, then the pods put on worker-1 by hand.
async fn start_cluster(
    opts: &DemoOptions,
    scene: Option<&super::scene::Scene>,
) -> anyhow::Result<SimCluster> {
    let cluster = SimCluster::start(SimOptions {
        time_scale: 10.0,
        ..SimOptions::default()
    })
    .await?;
    cluster.apply_yaml(&nmo::crd::crd_yaml())?;
    cluster.create(
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    )?;
    for i in 1..=opts.nodes {
        cluster.add_node(&format!("worker-{i}"))?;
    }
    for (node, key, value) in scene.map_or(&[][..], |s| s.labels) {
        if cluster.get("v1", "Node", None, node).is_ok() {
            cluster.patch(
                "v1",
                "Node",
                None,
                node,
                &serde_json::json!({"metadata": {"labels": {*key: value}}}),
            )?;
        }
    }
    let placed = match &opts.workload {
        Some(own) => create_own(&cluster, own)?,
        None => {
            cluster.apply_yaml(&workload(opts.pods))?;
            opts.pods.min(20) - 3
        }
    };
    if let Some(extra) = scene.map(|s| s.objects).filter(|o| !o.is_empty()) {
        cluster.apply_yaml(extra)?;
    }
    let client = nmo::client::client_from_kubeconfig(&cluster.kubeconfig()).await?;
    let pods_api = Api::<Pod>::all(client.clone());
    let started = Instant::now();
    loop {
        let pods = pods_api.list(&ListParams::default()).await?;
        let running = pods
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == pods.items.len() && running >= placed
            || started.elapsed() > Duration::from_secs(20)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if opts.workload.is_none() {
        cluster.apply_yaml(BARE_PODS)?;
    }
    let node1 = cluster.get("v1", "Node", None, "worker-1")?;
    cluster.create(serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "kube-proxy-worker-1", "namespace": "kube-system",
        "annotations": {"kubernetes.io/config.mirror": "demo", "kubernetes.io/config.source": "file"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": node1["metadata"]["uid"], "controller": true}]},
        "spec": {"nodeName": "worker-1", "containers": [{"name": "kube-proxy", "image": "kube-proxy:v1.32"}]}}))?;
    let what = match &opts.workload {
        Some(own) => format!(
            "{} object(s) of your file, and a static pod",
            own.objects.len()
        ),
        None => "Deployments web and api (with PDBs), StatefulSets db and queue (queue on worker-1), DaemonSet node-exporter, a bare pod, an emptyDir pod, a static pod".into(),
    };
    outln!(
        "== simulated cluster at {} with {} nodes; workload: {what}",
        cluster.url(),
        opts.nodes
    );
    Ok(cluster)
}

/// Creates the user's workload: its namespaces, then its objects, each
/// failure naming the object; says what of the file was left out. Returns
/// how many pods to wait for at least (0: whatever its controllers make).
fn create_own(cluster: &SimCluster, own: &super::workload::Workload) -> anyhow::Result<usize> {
    for ns in &own.namespaces {
        if cluster.get("v1", "Namespace", None, ns).is_err() {
            cluster.create(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))?;
        }
    }
    for obj in &own.objects {
        cluster.create(obj.clone()).map_err(|e| {
            anyhow::anyhow!(
                "--workload: cannot create {} {}/{}: {e}",
                obj["kind"].as_str().unwrap_or_default(),
                obj["metadata"]["namespace"].as_str().unwrap_or("default"),
                obj["metadata"]["name"].as_str().unwrap_or_default()
            )
        })?;
    }
    for left in &own.left_out {
        outln!("  --workload: left out {left}");
    }
    Ok(0)
}

/// The plan, the maintenance and its live progress.
async fn maintain(
    client: &Client,
    opts: &DemoOptions,
    engine: &PolicyEngine,
    scene: Option<&super::scene::Scene>,
) -> anyhow::Result<Outcome> {
    print_pods(client, "worker-1").await?;
    let plan = show_plan(client, opts, engine).await?;
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let mut nm = NodeMaintenance::new(
        NM,
        NodeMaintenanceSpec {
            node_name: "worker-1".into(),
            reason: Some("kernel upgrade".into()),
        },
    );
    if let Some(scene) = scene {
        outln!("== what to watch for: {}", scene.says);
        if !scene.annotations.is_empty() {
            nm.metadata.annotations = Some(scene.annotations.clone());
        }
    }
    let others = scene.map_or(&[][..], |s| s.others);
    nms.create(&PostParams::default(), &nm)
        .await
        .context("creating the NodeMaintenance")?;
    outln!("== kubectl apply: NodeMaintenance {NM} (node worker-1, reason \"kernel upgrade\")");
    let others = create_others(client, others, opts.nodes).await?;
    let done = follow(client, &nms, &plan).await?;
    describe(&done, &events_for(client, NM).await);
    show_others(&nms, &others).await?;
    let node = Api::<Node>::all(client.clone()).get("worker-1").await?;
    outln!("== node worker-1 in maintenance: {}", node_line(&node));
    print_pods(client, "worker-1").await?;
    let succeeded = done.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded);
    if !succeeded {
        let s = done.status.clone().unwrap_or_default();
        outln!(
            "== the maintenance did not succeed: it is {}{}",
            s.phase.map_or("Pending", |p| p.as_str()),
            s.last_error
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default()
        );
    }
    Ok(if succeeded {
        Outcome::Succeeded
    } else {
        Outcome::NotSucceeded
    })
}

/// Creates the maintenances of `nodes` the cluster has (of `count`) just
/// after worker-1's; their names.
async fn create_others(
    client: &Client,
    nodes: &[&str],
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let mut names = Vec::new();
    for node in nodes {
        let index = node
            .strip_prefix("worker-")
            .and_then(|i| i.parse::<usize>().ok())
            .unwrap_or(usize::MAX);
        if index > count {
            continue;
        }
        let name = format!("{node}-maintenance");
        let nm = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                node_name: (*node).to_owned(),
                reason: Some("kernel upgrade".into()),
            },
        );
        nms.create(&PostParams::default(), &nm)
            .await
            .with_context(|| format!("creating the NodeMaintenance of {node}"))?;
        outln!("== kubectl apply: NodeMaintenance {name} (node {node})");
        names.push(name);
    }
    Ok(names)
}

/// What became of the other maintenances meanwhile: each one's phase, or
/// why the policy holds it back.
async fn show_others(nms: &Api<NodeMaintenance>, names: &[String]) -> anyhow::Result<()> {
    for name in names {
        let Some(nm) = nms.get_opt(name).await? else {
            continue;
        };
        let s = nm.status.unwrap_or_default();
        let shown = match (&s.phase, &s.waiting) {
            (_, Some(w)) => format!("waiting for admission: {}", w.reason),
            (Some(p), None) => format!("{} ({}% drained)", p.as_str(), s.drain_progress),
            (None, None) => "not looked at yet".into(),
        };
        outln!("== {name}: {shown}");
    }
    Ok(())
}

/// `--keep-running`: leaves the cluster up, with its own kubeconfig, until
/// Ctrl-C (or SIGTERM); the kubeconfig goes with the demo.
async fn keep_running(cluster: &SimCluster, mut interrupt: Interrupt) -> anyhow::Result<()> {
    // One per demo: two demos never share (or remove) one file.
    let path = std::env::temp_dir().join(format!("nmo-demo-{}.kubeconfig", std::process::id()));
    cluster.write_kubeconfig(&path)?;
    let _remove = RemoveOnDrop(path.clone());
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "nmo".into());
    outln!(
        "== cluster left running (Ctrl-C to stop). Try:\n   export KUBECONFIG={}\n   kubectl get nm,nodes,pods -A\n   ln -sf {exe} /usr/local/bin/kubectl-nm   # the kubectl plugin, once\n   kubectl nm plan worker-2   # what a maintenance of worker-2 would do\n   kubectl nm status",
        path.display()
    );
    interrupt.wait().await;
    Ok(())
}

/// What the policy decides for each pod of worker-1, before the drain.
async fn show_plan(
    client: &Client,
    opts: &DemoOptions,
    engine: &PolicyEngine,
) -> anyhow::Result<nmo::plan::Report> {
    let source = match (&opts.policy_dir, &opts.policy) {
        (Some(dir), _) => nmo::plan::Source::Dir(dir.clone()),
        // The ConfigMap the demo published: the policy with the settings
        // the demo's operator runs it with.
        (None, Some(_)) => {
            let (namespace, name) = nmo::plan::DEFAULT_CONFIGMAP;
            nmo::plan::Source::ConfigMap {
                namespace: namespace.into(),
                name: name.into(),
            }
        }
        (None, None) => nmo::plan::Source::Embedded,
    };
    let report = nmo::plan::plan(
        client,
        engine,
        &nmo::plan::Request {
            node: Some("worker-1".into()),
            maintenance: None,
            policy: None,
            source: source.clone(),
        },
    )
    .await?;
    outln!("== the policy's plan for worker-1 (nmo plan worker-1):");
    for line in report.table().lines() {
        outln!("   {line}");
    }
    if !matches!(source, nmo::plan::Source::Embedded) {
        show_changes(client, engine, &report).await?;
    }
    Ok(report)
}

/// What the policy decides otherwise than the embedded default would, pod
/// by pod, on the same cluster.
async fn show_changes(
    client: &Client,
    engine: &PolicyEngine,
    report: &nmo::plan::Report,
) -> anyhow::Result<()> {
    let baseline = nmo::plan::plan(
        client,
        engine,
        &nmo::plan::Request {
            node: Some("worker-1".into()),
            maintenance: None,
            policy: None,
            source: nmo::plan::Source::Embedded,
        },
    )
    .await?;
    let changes = report.differences(&baseline);
    if changes.is_empty() {
        outln!(
            "== {} decides every pod of worker-1 as the default policy does (its difference is elsewhere: admission, failures, or pods this workload lacks)",
            report.policy.name
        );
    } else {
        outln!(
            "== what {} changes against the default policy ({} of {} pods):",
            report.policy.name,
            changes
                .iter()
                .filter(|c| !c.starts_with("attempt:"))
                .count(),
            report.pods.len()
        );
        for c in changes {
            outln!("   {c}");
        }
    }
    Ok(())
}

/// Shows the drain live until the maintenance ends, only pods the policy
/// blocks on are left (nothing moves them but a person), or no pod has
/// gone for [`STALL_LIMIT`]: progress, what it waits for, events. Returns
/// it as it ended.
async fn follow(
    client: &Client,
    nms: &Api<NodeMaintenance>,
    plan: &nmo::plan::Report,
) -> anyhow::Result<NodeMaintenance> {
    let blocks: std::collections::HashMap<&str, &str> = plan
        .pods
        .iter()
        .filter(|p| p.action == "block")
        .map(|p| (p.name.as_str(), p.reason.as_deref().unwrap_or("")))
        .collect();
    let bar = ProgressBar::new(100);
    bar.set_style(
        ProgressStyle::with_template("{spinner} drain [{bar:40}] {pos:>3}% {msg}")?
            .progress_chars("=> "),
    );
    let mut seen_events = HashSet::new();
    let mut last_line = String::new();
    let mut last_pending = usize::MAX;
    let mut progressed = Instant::now();
    let done = loop {
        let current = nms.get(NM).await?;
        let s = current.status.clone().unwrap_or_default();
        bar.set_position(s.drain_progress.clamp(0, 100) as u64);
        let pending = s.pending_pods.clone().unwrap_or_default();
        let line = match (&s.phase, &s.last_error) {
            (Some(MaintenancePhase::Running), Some(e)) if !pending.is_empty() => format!(
                "{} pod(s) pending; waiting for: {}",
                pending.len(),
                nmo::text::clean(e, 160)
            ),
            _ => format!("{} pod(s) pending", pending.len()),
        };
        if line != last_line {
            bar.set_message(line.clone());
            if bar.is_hidden() && s.phase.is_some() {
                outln!("  drain {:>3}%: {line}", s.drain_progress);
            }
            last_line = line;
        }
        for e in events_for(client, NM).await {
            if seen_events.insert(e.name_any()) {
                let line = format!(
                    "  event {} {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                );
                say(&bar, line);
            }
        }
        let only_blocked =
            !pending.is_empty() && pending.iter().all(|p| blocks.contains_key(p.as_str()));
        if only_blocked {
            say(
                &bar,
                format!(
                    "  the drain now waits only for pods the policy blocks on; nothing moves them but a person:\n{}",
                    pending
                        .iter()
                        .map(|p| format!("    {p}: {}", blocks[p.as_str()]))
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            );
            break current;
        }
        if matches!(
            s.phase,
            Some(MaintenancePhase::Succeeded | MaintenancePhase::Failed)
        ) {
            break current;
        }
        if pending.len() != last_pending {
            last_pending = pending.len();
            progressed = Instant::now();
        } else if progressed.elapsed() > STALL_LIMIT {
            say(
                &bar,
                format!(
                    "  no pod has gone for {} s: the demo stops watching (the drain itself goes on trying)",
                    STALL_LIMIT.as_secs()
                ),
            );
            break current;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    bar.finish_and_clear();
    Ok(done)
}

/// Prints a line above the progress bar (or alone, without a terminal).
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        outln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Ends the maintenance and says truthfully whether worker-1 is restored;
/// after a signal it waits at most [`RESTORE_LIMIT`] for it.
async fn finish(client: &Client, outcome: Outcome, hurry: bool) -> anyhow::Result<Outcome> {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let interrupted = matches!(outcome, Outcome::Interrupted);
    if interrupted {
        outln!("\n== interrupted: ending the maintenance");
    }
    // Worker-1's, and any other the demo made (a policy's scene).
    for nm in nms.list(&ListParams::default()).await?.items {
        let name = nm.name_any();
        nms.delete(&name, &DeleteParams::default()).await?;
        outln!("== kubectl delete nm {name}");
    }
    let limit = if hurry {
        RESTORE_LIMIT
    } else {
        Duration::from_secs(30)
    };
    let started = Instant::now();
    let nodes = Api::<Node>::all(client.clone());
    let restored = loop {
        let node = nodes.get("worker-1").await?;
        let gone = nms.get_opt(NM).await?.is_none();
        if gone && nmo::controller::node::restored(&node) {
            break Some(node);
        }
        if started.elapsed() > limit {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let node = nodes.get("worker-1").await?;
    match restored {
        Some(_) => outln!("== node worker-1 restored: {}", node_line(&node)),
        None => outln!(
            "== node worker-1 NOT restored yet (the simulated cluster stops now): {}",
            node_line(&node)
        ),
    }
    for e in events_for(client, "worker-1").await {
        outln!(
            "  event on node worker-1: {} {}",
            e.reason.unwrap_or_default(),
            e.message.unwrap_or_default()
        );
    }
    Ok(match (outcome, restored.is_some()) {
        (Outcome::Succeeded, false) => Outcome::NotSucceeded,
        (o, _) => o,
    })
}

/// Removes a file when dropped (the demo's kubeconfig, when it ends).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
