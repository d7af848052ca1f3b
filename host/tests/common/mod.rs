//! What the operator's end-to-end tests share: a simulated cluster with the
//! CRD and nodes, a kube client, and the controller running in-process.
#![allow(dead_code)]

pub mod drain_actions;
pub mod generated;
pub mod prometheus;
pub mod promises;
pub mod real;
pub mod scenarios;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use nmo::controller::{self, Context, Settings};
use nmo::crd::{MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec};
use nmo::policy::{EngineConfig, PolicyEngine, PolicyMetrics, PolicyStore};
use nmo::registry::OperatorMetrics;
// What the tests count with (each test file uses some).
#[allow(unused_imports)]
pub use nmo::{
    controller::metrics::{ReconcileResult, State},
    policy::{Decision, metrics::ReloadResult},
};
use nmo_sim::{SimCluster, SimOptions};
use serde_json::json;

pub struct Env {
    pub cluster: SimCluster,
    pub client: Client,
    pub controller: tokio::task::JoinHandle<()>,
    /// The controller's own registry: exact counts.
    pub metrics: OperatorMetrics,
    /// The controller's context, where the test started the controller
    /// through `Env`.
    pub ctx: Option<Arc<Context>>,
}

pub fn start_controller(client: &Client, policy_file: Option<&str>) -> tokio::task::JoinHandle<()> {
    start_controller_with(client, policy_store(policy_file))
}

/// A store of one built policy (a file of `target/policies`), or of the
/// embedded default; its decisions counted (`store.metrics()`) on a
/// registry of its own.
pub fn policy_store(policy_file: Option<&str>) -> Arc<PolicyStore> {
    policy_store_counted(policy_file, metrics().policy)
}

/// A registry of the operator's metrics, as the binary makes it.
pub fn metrics() -> OperatorMetrics {
    OperatorMetrics::register().unwrap()
}

/// [`policy_store`], its decisions counted in `metrics`.
pub fn policy_store_counted(policy_file: Option<&str>, metrics: PolicyMetrics) -> Arc<PolicyStore> {
    let engine = PolicyEngine::observed(EngineConfig::default(), metrics.observer()).unwrap();
    let policy = match policy_file {
        Some(f) => engine
            .load_file(std::path::Path::new(&format!(
                "{}/{f}",
                env!("NMO_POLICY_WASM_DIR")
            )))
            .unwrap(),
        None => engine.default_policy().unwrap(),
    };
    PolicyStore::single(policy)
}

/// Runs the controller with a policy store (a policy directory, say).
pub fn start_controller_with(
    client: &Client,
    policies: Arc<PolicyStore>,
) -> tokio::task::JoinHandle<()> {
    start_controller_ctx(client, policies).1
}

/// [`start_controller_with`], keeping the controller's context (for its
/// readiness checks).
pub fn start_controller_ctx(
    client: &Client,
    policies: Arc<PolicyStore>,
) -> (Arc<Context>, tokio::task::JoinHandle<()>) {
    start_controller_tuned(client, policies, |_| {})
}

/// [`start_controller_ctx`] with the tests' settings changed by `tune`.
pub fn start_controller_tuned(
    client: &Client,
    policies: Arc<PolicyStore>,
    tune: impl FnOnce(&mut Settings),
) -> (Arc<Context>, tokio::task::JoinHandle<()>) {
    start_controller_counted(client, policies, metrics().controller, tune)
}

/// [`start_controller_tuned`], the controller counting in `metrics`.
pub fn start_controller_counted(
    client: &Client,
    policies: Arc<PolicyStore>,
    metrics: nmo::controller::ControllerMetrics,
    tune: impl FnOnce(&mut Settings),
) -> (Arc<Context>, tokio::task::JoinHandle<()>) {
    let mut settings = test_settings();
    tune(&mut settings);
    let ctx: Arc<Context> = Context::new(client.clone(), policies, settings, metrics);
    let run = ctx.clone();
    let handle = tokio::spawn(async move {
        controller::run(run).await.expect("controller runs");
    });
    (ctx, handle)
}

/// The controller's settings in the tests: the same logic on short
/// timings.
pub fn test_settings() -> Settings {
    Settings {
        max_concurrent: 25,
        lease_namespace: "medik8s-leases".into(),
        instance: "test".into(),
        rewind_check: Duration::from_millis(500),
        watch_failure_window: Duration::from_secs(2),
        // The same logic on short timings: tests wait for it, not for
        // production's seconds.
        drain_retries: nmo::controller::drain::Retries {
            pdb: Duration::from_millis(300),
            pdb_min: Duration::from_millis(50),
            api_error: Duration::from_millis(200),
        },
        policy_error_retry: Duration::from_secs(1),
        error_retry: Duration::from_millis(500),
        admission_recheck_min: Duration::from_millis(200),
        waiting_update_interval: Duration::from_secs(1),
        tool_api_recheck: Duration::from_millis(300),
        ..Settings::default()
    }
}

impl Env {
    pub async fn start(nodes: usize) -> Env {
        Self::start_with(nodes, None).await
    }

    pub async fn start_with(nodes: usize, policy_file: Option<&str>) -> Env {
        let metrics = metrics();
        let policies = policy_store_counted(policy_file, metrics.policy.clone());
        Self::start_counted(nodes, policies, metrics).await
    }

    /// A cluster of `nodes` workers and the controller running `policies`
    /// (the policy counts in `metrics` are then those of `policies`, if
    /// it counts).
    pub async fn start_store(nodes: usize, policies: Arc<PolicyStore>) -> Env {
        let mut metrics = metrics();
        if let Some(counted) = policies.metrics() {
            metrics.policy = counted.clone();
        }
        Self::start_counted(nodes, policies, metrics).await
    }

    /// [`Env::start_store`] with the controller's settings changed by
    /// `tune`.
    pub async fn start_tuned(
        nodes: usize,
        policies: Arc<PolicyStore>,
        tune: impl FnOnce(&mut Settings),
    ) -> Env {
        let mut metrics = metrics();
        if let Some(counted) = policies.metrics() {
            metrics.policy = counted.clone();
        }
        Self::start_counted_tuned(nodes, policies, metrics, tune).await
    }

    async fn start_counted(
        nodes: usize,
        policies: Arc<PolicyStore>,
        metrics: OperatorMetrics,
    ) -> Env {
        Self::start_counted_tuned(nodes, policies, metrics, |_| {}).await
    }

    async fn start_counted_tuned(
        nodes: usize,
        policies: Arc<PolicyStore>,
        metrics: OperatorMetrics,
        tune: impl FnOnce(&mut Settings),
    ) -> Env {
        let (cluster, client) = start_cluster(nodes).await;
        let (ctx, controller) =
            start_controller_counted(&client, policies, metrics.controller.clone(), tune);
        Env {
            cluster,
            client,
            controller,
            metrics,
            ctx: Some(ctx),
        }
    }

    /// Waits until the controller's node watch has `node` as the API
    /// server has it now: a change the test just made to a node is what
    /// the next admission decides on. (An admission decides on the watch;
    /// a change made a moment before a maintenance is created races it,
    /// as two tools acting at once do.)
    pub async fn wait_watch_current(&self, node: &str) {
        let ctx = self.ctx.as_ref().expect("a controller started by Env");
        let nodes: Api<Node> = Api::all(self.client.clone());
        let want = nodes.get(node).await.unwrap().metadata.resource_version;
        wait_until(
            &format!("the node watch has {node} at {want:?}"),
            Duration::from_secs(30),
            || async {
                ctx.watched_node(node)
                    .is_some_and(|n| n.metadata.resource_version == want)
            },
        )
        .await;
    }

    /// Waits until `count` pods of the default namespace are on nodes and
    /// Ready (the workload the test applied has settled), with a deadline
    /// that holds on a busy machine.
    pub async fn wait_ready_pods(&self, count: usize) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let started = Instant::now();
        loop {
            let listed = pods.list(&Default::default()).await.unwrap().items;
            let ready = listed
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && crate::common::drain_actions::is_ready(p)
                })
                .count();
            if ready == count {
                return;
            }
            let seen: Vec<_> = listed
                .iter()
                .map(|p| {
                    let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                    (
                        p.metadata.name.clone(),
                        phase,
                        crate::common::drain_actions::is_ready(p),
                    )
                })
                .collect();
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "never {count} pods Ready: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stop(self) {
        self.controller.abort();
        self.cluster.stop().await;
    }
}

/// Scales WORKLOAD's `web` Deployment to `replicas` (one more makes room
/// under its budget).
pub async fn scale_web(env: &impl ClusterOps, replicas: i32) {
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(env.client().clone(), "default")
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

/// Two maintenances as an operator leaves them: `done` Succeeded on the
/// empty worker-3, and `held` Running on a node of the two-replica web
/// Deployment, its drain held by the PodDisruptionBudget that allows
/// nothing (a web pod pending). Returns `held`'s node.
pub async fn succeeded_and_held(env: &impl ClusterOps, done: &str, held: &str) -> String {
    env.create_nm(done, "worker-3").await;
    env.wait_phase(done, MaintenancePhase::Succeeded).await;
    env.apply(&WORKLOAD.replace("replicas: 3", "replicas: 2"))
        .await;
    let node = web_node(env, 2).await;
    env.create_nm(held, &node).await;
    env.wait_status(held, "held by the PodDisruptionBudget", |s| {
        s.phase == Some(MaintenancePhase::Running)
            && s.pending_pods
                .as_ref()
                .is_some_and(|p| p.iter().any(|p| p.starts_with("web-")))
    })
    .await;
    node
}

/// Waits until `ready` web pods are Ready; returns the node of one of them.
pub async fn web_node(env: &impl ClusterOps, ready: usize) -> String {
    let started = Instant::now();
    loop {
        let pods = Api::<Pod>::namespaced(env.client().clone(), "default")
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        let n = pods
            .iter()
            .filter(|p| nmo_sim::cluster::is_ready(&serde_json::to_value(p).unwrap()))
            .count();
        if n == ready {
            return pods[0].spec.as_ref().unwrap().node_name.clone().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "web pods never ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the human did to the node before any maintenance.
pub async fn cordon_by_hand(client: &Client, node: &str) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({
                "metadata": {"labels": {nmo::controller::node::EXCLUDE_LABEL: "true"}},
                "spec": {"unschedulable": true, "taints": [
                    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                    {"key": "team/bad-hardware", "value": "dimm", "effect": "NoSchedule"}
                ]}
            })),
        )
        .await
        .unwrap();
}

/// The node is as the human left it: cordoned, their taints, the label,
/// none of ours and no record left.
pub fn as_the_human_left_it(node: &Node) -> Result<(), String> {
    let mut taints = taint_keys(node);
    taints.sort();
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable);
    let label = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(nmo::controller::node::EXCLUDE_LABEL))
        .cloned();
    let record = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(nmo::controller::node::PRIOR_STATE_ANNOTATION));
    if unschedulable == Some(true)
        && taints == ["node.kubernetes.io/unschedulable", "team/bad-hardware"]
        && label.as_deref() == Some("true")
        && !record
    {
        Ok(())
    } else {
        Err(format!(
            "unschedulable={unschedulable:?} taints={taints:?} label={label:?} record={record}"
        ))
    }
}

pub fn taint_keys(node: &Node) -> Vec<String> {
    let mut keys: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    keys.sort();
    keys
}

pub const WORKLOAD: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: nginx}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: agent, image: agent}]}
---
apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: default}
spec: {nodeName: worker-1, containers: [{name: c, image: busybox}]}
---
apiVersion: v1
kind: Pod
metadata: {name: scratch, namespace: default}
spec:
  nodeName: worker-1
  containers: [{name: c, image: busybox}]
  volumes: [{name: tmp, emptyDir: {}}]
"#;

/// The CRDs of the other tools whose objects claim nodes: Cluster API's
/// Machines and NVIDIA's maintenance-operator NodeMaintenances (their
/// schemas left open: only the fields the operator reads matter here).
pub const TOOL_CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: machines.cluster.x-k8s.io}
spec:
  group: cluster.x-k8s.io
  names: {kind: Machine, plural: machines, singular: machine, listKind: MachineList}
  scope: Namespaced
  versions: [{name: v1beta1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: nodemaintenances.maintenance.nvidia.com}
spec:
  group: maintenance.nvidia.com
  names: {kind: NodeMaintenance, plural: nodemaintenances, singular: nodemaintenance, listKind: NodeMaintenanceList}
  scope: Namespaced
  versions: [{name: v1alpha1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
"#;

/// What a test does through the API, on either cluster (the simulated one
/// of [`Env`], the real control plane of [`real::RealEnv`]).
#[allow(async_fn_in_trait)]
pub trait ClusterOps {
    /// A client as the cluster admin.
    fn client(&self) -> &Client;

    /// Applies YAML documents as the cluster admin.
    async fn apply(&self, yaml: &str);

    /// Creates one object (JSON) as the cluster admin.
    async fn create_value(&self, obj: serde_json::Value);

    /// A kubeconfig for the cluster admin.
    fn kubeconfig(&self) -> String;

    /// Starts counting API requests from here (see `admin_writes_since`).
    fn audit_mark(&self) -> usize;

    /// The admin's requests since `mark` that were not reads, as
    /// `verb what`.
    fn admin_writes_since(&self, mark: usize) -> Vec<String>;

    /// The HTTP status of each eviction the operator sent since `mark`.
    fn operator_evictions_since(&self, mark: usize) -> Vec<u16>;

    fn nms(&self) -> Api<NodeMaintenance> {
        Api::all(self.client().clone())
    }

    async fn create_nm(&self, name: &str, node: &str) -> NodeMaintenance {
        self.create_nm_with_policy(name, node, None).await
    }

    /// A NodeMaintenance naming its policy with the annotation, if given.
    async fn create_nm_with_policy(
        &self,
        name: &str,
        node: &str,
        policy: Option<&str>,
    ) -> NodeMaintenance {
        let mut nm = NodeMaintenance::new(
            name,
            NodeMaintenanceSpec {
                node_name: node.into(),
                reason: Some("test".into()),
            },
        );
        if let Some(p) = policy {
            nm.metadata.annotations = Some(std::collections::BTreeMap::from([(
                nmo::policy::POLICY_ANNOTATION.to_owned(),
                p.to_owned(),
            )]));
        }
        self.nms()
            .create(&PostParams::default(), &nm)
            .await
            .unwrap()
    }

    async fn wait_phase(&self, name: &str, phase: MaintenancePhase) -> NodeMaintenance {
        let started = Instant::now();
        loop {
            let nm = self.nms().get(name).await.unwrap();
            if nm.status.as_ref().and_then(|s| s.phase) == Some(phase) {
                return nm;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{name} never reached {phase:?}: {:?}",
                nm.status
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_gone(&self, name: &str) {
        let started = Instant::now();
        while self.nms().get_opt(name).await.unwrap().is_some() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{name} was never removed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client().clone())
            .get(name)
            .await
            .unwrap()
    }

    async fn pods_on(&self, node: &str) -> Vec<Pod> {
        Api::<Pod>::all(self.client().clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .unwrap()
            .items
    }

    /// The operator's events about `name` (source component
    /// `NodeMaintenance`, as the Go operator's); on a real cluster the node
    /// controller writes its own about nodes too.
    async fn events_for(&self, name: &str) -> Vec<(String, String, String)> {
        Api::<Event>::all(self.client().clone())
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("NodeMaintenance")
                    || e.reporting_component.as_deref() == Some("NodeMaintenance")
            })
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect()
    }

    async fn create_nm_with_reason(&self, name: &str, node: &str, reason: &str) {
        let nm = NodeMaintenance::new(
            name,
            NodeMaintenanceSpec {
                node_name: node.into(),
                reason: Some(reason.into()),
            },
        );
        self.nms()
            .create(&PostParams::default(), &nm)
            .await
            .unwrap();
    }

    async fn wait_status(
        &self,
        name: &str,
        what: &str,
        f: impl Fn(&nmo::crd::NodeMaintenanceStatus) -> bool,
    ) -> nmo::crd::NodeMaintenanceStatus {
        let started = Instant::now();
        loop {
            let s = self
                .nms()
                .get(name)
                .await
                .unwrap()
                .status
                .unwrap_or_default();
            if f(&s) {
                return s;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{name}: never {what}: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl ClusterOps for Env {
    fn client(&self) -> &Client {
        &self.client
    }

    async fn apply(&self, yaml: &str) {
        self.cluster.apply_yaml(yaml).unwrap();
    }

    async fn create_value(&self, obj: serde_json::Value) {
        self.cluster.create(obj).unwrap();
    }

    fn kubeconfig(&self) -> String {
        self.cluster.kubeconfig()
    }

    fn audit_mark(&self) -> usize {
        self.cluster.record_audit(true);
        self.cluster.audit().len()
    }

    fn admin_writes_since(&self, mark: usize) -> Vec<String> {
        self.cluster.record_audit(false);
        self.cluster
            .audit()
            .into_iter()
            .skip(mark)
            .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
            .map(|r| format!("{} {}", r.verb, r.resource))
            .collect()
    }

    fn operator_evictions_since(&self, mark: usize) -> Vec<u16> {
        self.cluster
            .audit()
            .into_iter()
            .skip(mark)
            .filter(|r| r.user_agent == nmo::client::USER_AGENT && r.subresource == "eviction")
            .map(|r| r.code)
            .collect()
    }
}

pub const HOSTILE: Option<&str> = Some("nmo_policy_hostile.wasm");

/// A bare pod on `node` whose kubelet never lets it go once deleted.
pub fn never_terminating(name: &str, node: &str) -> serde_json::Value {
    bare(
        name,
        node,
        json!({"sim.nmo.medik8s.io/never-terminate": "true"}),
        30,
    )
}

pub fn bare(
    name: &str,
    node: &str,
    annotations: serde_json::Value,
    grace: i64,
) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "annotations": annotations},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": grace, "containers": [{"name": "c", "image": "i"}]}})
}

/// A simulated cluster (time 20x) with the CRD and `nodes` workers, and a
/// client for it (no blanket retry, as the operator's).
pub async fn start_cluster(nodes: usize) -> (SimCluster, Client) {
    let cluster = SimCluster::start(SimOptions {
        time_scale: 20.0,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    cluster.apply_yaml(&nmo::crd::crd_yaml()).unwrap();
    for i in 1..=nodes {
        cluster.add_node(&format!("worker-{i}")).unwrap();
    }
    let client = nmo::client::client_from_kubeconfig(&cluster.kubeconfig())
        .await
        .unwrap();
    (cluster, client)
}

/// What a finished command printed: its stdout, then its stderr.
pub fn printed(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs a command to its end and returns what it printed on stdout; fails
/// the test, with both streams, when it does not succeed.
pub fn stdout_of(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        printed(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A policy as the host's build script built it (`nmo_policy_<stem>.wasm`).
pub fn built_policy(stem: &str) -> Vec<u8> {
    std::fs::read(
        std::path::Path::new(env!("NMO_POLICY_WASM_DIR")).join(format!("nmo_policy_{stem}.wasm")),
    )
    .unwrap()
}

/// Polls `f` until it holds; fails the test after `limit`.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !f().await {
        assert!(started.elapsed() < limit, "never {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for a maintenance to succeed, reading through API errors.
pub async fn wait_succeeded(nms: &Api<NodeMaintenance>, name: &str, limit: Duration) {
    wait_until(&format!("{name} Succeeded"), limit, || async {
        nms.get(name)
            .await
            .ok()
            .and_then(|n| n.status)
            .and_then(|s| s.phase)
            == Some(MaintenancePhase::Succeeded)
    })
    .await;
}

/// A NodeMaintenance `name` of `node`, with no reason.
pub fn nm(name: &str, node: &str) -> NodeMaintenance {
    NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.into(),
            reason: None,
        },
    )
}

/// Creates a NodeMaintenance, retrying what an injected fault refused, as
/// a user would.
pub async fn create_nm_retrying(nms: &Api<NodeMaintenance>, name: &str, node: &str) {
    let nm = nm(name, node);
    while nms.create(&PostParams::default(), &nm).await.is_err() {
        if nms.get_opt(name).await.ok().flatten().is_some() {
            break;
        }
    }
}

/// The policy calls made so far of `decision`, as counted in `metrics`.
pub fn policy_calls(metrics: &PolicyMetrics, decision: nmo::policy::Decision) -> u64 {
    metrics.decisions(decision)
}

/// A webhook certificate for 127.0.0.1 in a temp dir; returns the dir and
/// the caBundle.
pub fn webhook_cert() -> (tempfile::TempDir, String) {
    let cert =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    (
        dir,
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, cert.cert.pem()),
    )
}

/// Runs the real kubectl against the kubeconfig `kc` (its cache beside
/// it), with `stdin` as input; returns whether it succeeded and what it
/// printed.
pub async fn kubectl_in(
    kc: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String) {
    nmo_control_plane::kubectl_with(kc, args, stdin)
        .await
        .expect("kubectl runs")
}

/// A free port on 127.0.0.1 for a server the test starts (below the
/// ephemeral range, never handed out twice: see `nmo_control_plane`).
pub fn free_port() -> u16 {
    nmo_control_plane::free_port().expect("a free loopback port")
}

/// Waits until no NodeMaintenance is left.
pub async fn wait_all_gone(nms: &Api<NodeMaintenance>, limit: Duration) {
    wait_until("every maintenance gone", limit, || async {
        nms.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
}

/// Loopback ports for a Deployment's container run as a local process.
pub struct LocalPorts {
    pub probe: u16,
    pub webhook: u16,
}

/// The operator binary as the Deployment's container runs it: its args
/// (bind addresses moved to loopback, the policy and certificate folders
/// where the test put what the kubelet would mount, no metrics port, no
/// compiled-policy cache), its env (literal values, the downward API's
/// namespace), `KUBECONFIG` in place of the in-cluster config. Killed on
/// drop; stderr piped (its log).
pub fn deployment_process(
    container: &serde_json::Value,
    ports: &LocalPorts,
    policy_dir: &std::path::Path,
    cert_dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    namespace: &str,
) -> tokio::process::Command {
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            let flag = a.split('=').next().unwrap_or(a);
            match flag {
                "--policy-dir" => format!("--policy-dir={}", policy_dir.display()),
                "--policy-cache-dir" => "--policy-cache-dir=".into(),
                "--metrics-bind-address" => "--metrics-bind-address=0".into(),
                "--health-probe-bind-address" => {
                    format!("--health-probe-bind-address=127.0.0.1:{}", ports.probe)
                }
                "--webhook-bind-address" => {
                    format!("--webhook-bind-address=127.0.0.1:{}", ports.webhook)
                }
                "--webhook-cert-dir" => format!("--webhook-cert-dir={}", cert_dir.display()),
                _ => a.to_owned(),
            }
        })
        .collect();
    let mut operator = tokio::process::Command::new(env!("CARGO_BIN_EXE_nmo"));
    operator
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("HOSTNAME", "nmo-deploy-test")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap();
        if let Some(v) = e["value"].as_str() {
            operator.env(name, v);
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace" {
            operator.env(name, namespace);
        }
    }
    operator
}

/// `GET /readyz` on 127.0.0.1:`port` answers 200.
pub async fn ready_on(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.starts_with("HTTP/1.1 200")
}

/// The fenced blocks of a document (or a section of one), by language.
pub fn blocks<'a>(section: &'a str, lang: &str) -> Vec<&'a str> {
    let fence = format!("```{lang}\n");
    section
        .split(fence.as_str())
        .skip(1)
        .map(|b| &b[..b.find("```").expect("closed block")])
        .collect()
}
