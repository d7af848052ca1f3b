//! The Go operator v0.21.0 (the release users run, built from its module
//! with the control plane) and nmo, one after the other on the same real
//! control plane, through the same scenarios, with everything a user or a
//! tool can observe recorded: each NodeMaintenance's status fields,
//! finalizer and owner references; its Events (type, reason, message,
//! source, count); the Node (cordon, taints, the exclude-remediation label); the
//! node Lease; the probes' answers; the validating webhook's answers to
//! the AdmissionReviews the API server would send, as sent; the metric
//! family names and each family's label names; the Go operator's key log lines.
//!
//! Each operator runs as its Deployment runs it (the v0.21.0 bundle's
//! arguments, its addresses on loopback, its leader election off: out of
//! a cluster, controller-runtime cannot find a namespace for it), against
//! its own CRD, with the admin's kubeconfig (RBAC is the deploy tests').
//! The Go operator runs on worker-1..5, nmo on worker-6..10; node numbers,
//! the run's namespace prefix and the order of an aggregated error's parts
//! are normalised before comparing.
//!
//! Every difference must be listed in the table of docs/drop-in.md (its
//! key, or a key pattern ending in `*`) with its reason; the suite fails on
//! one that is not, and prints every observation side by side.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::real::RealEnv;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nmo::crd::NodeMaintenance;
use nmo_control_plane::Options;
use serde_json::{Value, json};

const LEASES: &str = "medik8s-leases";
/// The two tests take turns: the Go operator's webhook server binds :9443
/// (it has no flag to move it) with the certificate in controller-runtime's
/// folder, where nmo, run with the bundle's arguments, also looks.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// What the Go operator's key log lines say (its e2e suite and log
/// searches look for them).
const KEY_LOG_LINES: &[&str] = &[
    "Reconciling NodeMaintenance",
    "Applying maintenance mode",
    "Evict all Pods from Node",
    "Not all pods evicted",
    "Reconciling with fixed duration",
    "Maintenance was completed - all pods were evicted",
];

/// The status fields a user reads as they are (besides the texts and the
/// pod lists, which are normalised).
pub(crate) const STATUS_FIELDS: [&str; 5] = [
    "phase",
    "totalpods",
    "evictionPods",
    "drainProgress",
    "errorOnLeaseCount",
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Which {
    Go,
    Nmo,
}

impl Which {
    fn first_node(self) -> usize {
        match self {
            Which::Go => 1,
            Which::Nmo => 7,
        }
    }
    fn prefix(self) -> &'static str {
        match self {
            Which::Go => "go",
            Which::Nmo => "nmo",
        }
    }
}

/// Observations of one operator's run, by key (`scenario/what`).
#[derive(Default)]
struct Seen(BTreeMap<String, String>);

impl Seen {
    fn put(&mut self, key: &str, value: impl Into<String>) {
        self.0.insert(key.to_owned(), value.into());
    }
}

/// One run: the operator, its nodes and namespaces.
struct Run<'a> {
    env: &'a RealEnv,
    which: Which,
    /// The uids of the maintenances this run created: the other run's
    /// maintenances had the same names, and their Events outlive them.
    created: std::sync::Mutex<BTreeSet<String>>,
}

impl Run<'_> {
    fn node(&self, i: usize) -> String {
        format!("worker-{}", self.which.first_node() + i)
    }
    fn ns(&self, scenario: &str) -> String {
        format!("{}-{scenario}", self.which.prefix())
    }
    fn nms(&self) -> Api<NodeMaintenance> {
        Api::all(self.env.admin.clone())
    }

    /// What a value says, with this run's names made the same for both.
    fn norm(&self, text: &str) -> String {
        let mut out = text.replace(&format!("\"{}-", self.which.prefix()), "\"ns-");
        out = out.replace(&format!("{}-", self.which.prefix()), "ns-");
        for i in (0..6).rev() {
            out = out.replace(&self.node(i), &format!("node-{i}"));
        }
        // An aggregated error ([a, b]) lists its parts in the order the
        // goroutines ended: sorted here.
        if let Some(inner) = out.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            let mut parts: Vec<&str> = inner.split(", error").collect();
            let first = parts.remove(0).to_owned();
            let mut all = vec![first];
            all.extend(parts.iter().map(|p| format!("error{p}")));
            all.sort();
            out = format!("[{}]", all.join(", "));
        }
        out
    }

    async fn namespace(&self, scenario: &str) -> String {
        let ns = self.ns(scenario);
        self.env
            .cp
            .apply(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"
            ))
            .await
            .unwrap();
        ns
    }

    async fn pod(&self, ns: &str, name: &str, node: &str, extra: Value) {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "i"}]}});
        merge(&mut pod, extra);
        let pods: Api<Pod> = Api::namespaced(self.env.admin.clone(), ns);
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .unwrap();
    }

    async fn create_nm(&self, name: &str, node: &str) {
        let nm: NodeMaintenance = serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
            "metadata": {"name": name}, "spec": {"nodeName": node, "reason": "differential"}}))
        .unwrap();
        retry(&format!("creating {name}"), || async {
            self.nms()
                .create(&PostParams::default(), &nm)
                .await
                .map(|_| ())
        })
        .await;
        let uid = self.nms().get(name).await.unwrap().uid().unwrap();
        self.created.lock().unwrap().insert(uid);
    }

    async fn wait_nm(&self, name: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let nm = serde_json::to_value(self.nms().get(name).await.unwrap()).unwrap();
            if f(&nm["status"]) {
                return nm;
            }
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "{:?}: {name} never {what}: {}",
                self.which,
                nm["status"]
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_phase(&self, name: &str, phase: &str) -> Value {
        self.wait_nm(name, &format!("reached {phase}"), |s| s["phase"] == phase)
            .await
    }

    async fn end(&self, name: &str) {
        let _ = self.nms().delete(name, &DeleteParams::default()).await;
        let started = Instant::now();
        while self.nms().get_opt(name).await.unwrap().is_some() {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{:?}: {name} was never removed",
                self.which
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The status fields a user reads.
    fn status(&self, seen: &mut Seen, key: &str, nm: &Value) {
        let s = &nm["status"];
        for field in STATUS_FIELDS {
            seen.put(&format!("{key}/status.{field}"), scalar(&s[field]));
        }
        seen.put(
            &format!("{key}/status.lastError"),
            self.norm(&scalar(&s["lastError"])),
        );
        let mut pending: Vec<String> = s["pendingPods"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| self.norm(&scalar(p)))
            .collect();
        pending.sort();
        seen.put(&format!("{key}/status.pendingPods"), pending.join(","));
        let mut refs: Vec<String> = s["pendingPodsRefs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                self.norm(&format!(
                    "{}/{}",
                    scalar(&p["namespace"]),
                    scalar(&p["name"])
                ))
            })
            .collect();
        refs.sort();
        seen.put(&format!("{key}/status.pendingPodsRefs"), refs.join(","));
        seen.put(
            &format!("{key}/status.lastUpdate"),
            if s["lastUpdate"].is_string() {
                "set"
            } else {
                "unset"
            },
        );
        seen.put(
            &format!("{key}/finalizers"),
            scalar(&nm["metadata"]["finalizers"]),
        );
        let owners: Vec<String> = nm["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| scalar(&o["kind"]))
            .collect();
        seen.put(&format!("{key}/ownerReferences"), owners.join(","));
    }

    /// The node as the maintenance leaves it.
    async fn node_state(&self, seen: &mut Seen, key: &str, node: &str) {
        // The taint `node.kubernetes.io/unschedulable` is the node
        // lifecycle controller's: it follows spec.unschedulable a moment
        // later (nmo also removes it itself when it restores a node; the
        // Go operator leaves that to the controller). The node is read
        // once the two agree, so the comparison is of the settled node.
        let nodes = Api::<Node>::all(self.env.admin.clone());
        let settled = |n: &Node| {
            let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            let tainted = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| {
                    t.iter()
                        .any(|t| t.key == "node.kubernetes.io/unschedulable")
                });
            cordoned == tainted
        };
        let started = Instant::now();
        let n: Node = loop {
            let n = nodes.get(node).await.unwrap();
            if settled(&n) || started.elapsed() > Duration::from_secs(30) {
                break n;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        seen.put(
            &format!("{key}/node.unschedulable"),
            n.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
                .to_string(),
        );
        let mut taints: Vec<String> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect();
        taints.sort();
        seen.put(&format!("{key}/node.taints"), taints.join(","));
        seen.put(
            &format!("{key}/node.excludeLabel"),
            n.labels()
                .get("remediation.medik8s.io/exclude-from-remediation")
                .cloned()
                .unwrap_or_default(),
        );
        let lease = Api::<Lease>::namespaced(self.env.admin.clone(), LEASES)
            .get_opt(&format!("node-{node}"))
            .await
            .unwrap();
        let lease = match lease.and_then(|l| l.spec) {
            None => "none".to_owned(),
            Some(s) => format!(
                "holder={} duration={}",
                s.holder_identity.unwrap_or_default(),
                s.lease_duration_seconds
                    .map(|d| d.to_string())
                    .unwrap_or_default()
            ),
        };
        seen.put(&format!("{key}/lease"), lease);
    }

    /// The Events of the maintenance `name` and of `node`, recorded by
    /// the operator: `type reason: message (source)`, and how many times
    /// each reason was said (`event-count/<kind> <reason>`).
    async fn events(&self, seen: &mut Seen, key: &str, name: &str, node: &str) {
        let events: Vec<Event> = Api::<Event>::all(self.env.admin.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        // How many times each was said, however it was stored: the
        // recorder's count (a repeat within its window raises the count of
        // one Event), the events.k8s.io series', or Events of their own.
        let mut said: BTreeSet<String> = BTreeSet::new();
        let mut counts: BTreeMap<String, i32> = BTreeMap::new();
        for e in events {
            let o = &e.involved_object;
            let ours = (o.kind.as_deref() == Some("NodeMaintenance")
                && o.name.as_deref() == Some(name)
                && o.uid
                    .as_ref()
                    .is_some_and(|u| self.created.lock().unwrap().contains(u)))
                || (o.kind.as_deref() == Some("Node") && o.name.as_deref() == Some(node));
            let source = e
                .source
                .as_ref()
                .and_then(|s| s.component.clone())
                .unwrap_or_default();
            if !ours || source != "NodeMaintenance" {
                continue;
            }
            let count = e
                .series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1);
            let (kind, reason) = (
                o.kind.clone().unwrap_or_default(),
                e.reason.unwrap_or_default(),
            );
            *counts.entry(format!("{kind} {reason}")).or_default() += count;
            said.insert(format!(
                "{kind} {} {reason}: {} ({source})",
                e.type_.unwrap_or_default(),
                self.norm(&e.message.unwrap_or_default())
            ));
        }
        seen.put(
            &format!("{key}/events"),
            said.into_iter().collect::<Vec<_>>().join(" | "),
        );
        for (what, n) in counts {
            seen.put(&format!("{key}/event-count/{what}"), n.to_string());
        }
    }

    /// A plain cycle: three pods go, the node is in maintenance, then
    /// restored.
    /// The validating webhook's answers to what the API server would ask:
    /// a maintenance of a node, of a node that is not there, a second one
    /// of a node already in maintenance, a change of the node, a change of
    /// the reason.
    async fn webhook(&self, port: u16) -> Seen {
        let mut seen = Seen::default();
        let node = self.node(0);
        let held = format!("{}-wh-held", self.which.prefix());
        self.create_nm(&held, &node).await;
        // The operator's cache has it once it has begun it.
        self.wait_nm(&held, "begun", |s| !s["phase"].is_null())
            .await;
        let nm = |name: &str, node: &str, reason: &str| {
            json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
                   "metadata": {"name": name}, "spec": {"nodeName": node, "reason": reason}})
        };
        let request = |op: &str, object: Value, old: Value| {
            json!({"uid": format!("{}-{op}", self.which.prefix()),
                   "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1",
                            "kind": "NodeMaintenance"},
                   "resource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1",
                                "resource": "nodemaintenances"},
                   "name": object["metadata"]["name"], "operation": op,
                   "userInfo": {"username": "admin"},
                   "object": object, "oldObject": old})
        };
        let other = format!("{}-wh-other", self.which.prefix());
        let cases = [
            (
                "create",
                request("CREATE", nm(&other, &self.node(1), "r"), Value::Null),
            ),
            (
                "create-missing-node",
                request("CREATE", nm(&other, "no-such-node", "r"), Value::Null),
            ),
            (
                "create-second-of-a-node",
                request("CREATE", nm(&other, &node, "r"), Value::Null),
            ),
            (
                "update-node",
                request(
                    "UPDATE",
                    nm(&held, &self.node(1), "differential"),
                    nm(&held, &node, "differential"),
                ),
            ),
            (
                "update-reason",
                request(
                    "UPDATE",
                    nm(&held, &node, "other"),
                    nm(&held, &node, "differential"),
                ),
            ),
        ];
        for (case, req) in cases {
            let answer = review(port, &req);
            seen.put(&format!("webhook/{case}"), self.norm(&answer.to_string()));
        }
        self.end(&held).await;
        seen
    }

    async fn plain(&self) -> Seen {
        let mut seen = Seen::default();
        let (node, ns) = (self.node(0), self.namespace("plain").await);
        for i in 1..=3 {
            self.pod(&ns, &format!("p-{i}"), &node, json!({})).await;
        }
        self.create_nm("plain", &node).await;
        let nm = self.wait_phase("plain", "Succeeded").await;
        self.status(&mut seen, "plain", &nm);
        self.node_state(&mut seen, "plain", &node).await;
        self.end("plain").await;
        self.node_state(&mut seen, "plain/ended", &node).await;
        self.events(&mut seen, "plain", "plain", &node).await;
        seen
    }

    /// A maintenance of a node that does not exist.
    async fn missing_node(&self) -> Seen {
        let mut seen = Seen::default();
        self.create_nm("ghost", "ghost").await;
        let nm = self.wait_phase("ghost", "Failed").await;
        self.status(&mut seen, "missing-node", &nm);
        self.end("ghost").await;
        self.events(&mut seen, "missing-node", "ghost", "ghost")
            .await;
        seen
    }

    /// The scenario's namespace with `pods` on `node` behind a budget
    /// that allows no eviction (`minAvailable: 2`, named `web`).
    async fn held_by_a_budget(&self, scenario: &str, node: &str, pods: [&str; 2]) -> String {
        let ns = self.namespace(scenario).await;
        for name in pods {
            self.pod(&ns, name, node, json!({})).await;
        }
        self.env
            .cp
            .apply(&format!(
                "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: web, namespace: {ns}}}\n\
                 spec: {{minAvailable: 2, selector: {{matchLabels: {{app: web}}}}}}\n"
            ))
            .await
            .unwrap();
        ns
    }

    /// The budget `held_by_a_budget` made, deleted.
    async fn relax(&self, ns: &str) {
        Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
            self.env.admin.clone(),
            ns,
        )
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    }

    /// Waits until the first 30 s attempt of `name` ended (both
    /// operators then say `global timeout reached`).
    async fn attempt_timed_out(&self, name: &str) -> Value {
        self.wait_nm(name, "said the attempt timed out", |s| {
            s["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("global timeout reached"))
        })
        .await
    }

    /// A drain a PodDisruptionBudget holds, then relaxed.
    async fn budget(&self) -> Seen {
        let mut seen = Seen::default();
        let node = self.node(1);
        let ns = self
            .held_by_a_budget("budget", &node, ["web-1", "web-2"])
            .await;
        self.create_nm("budget", &node).await;
        // The first attempt's end (30 s, both): what it says then. (While
        // it runs, nmo's lastError says what the drain waits for; the Go
        // operator's says nothing until the attempt ends.)
        let held = self.attempt_timed_out("budget").await;
        self.status(&mut seen, "budget/held", &held);
        self.node_state(&mut seen, "budget/held", &node).await;
        self.relax(&ns).await;
        let nm = self.wait_phase("budget", "Succeeded").await;
        self.status(&mut seen, "budget/relaxed", &nm);
        self.end("budget").await;
        self.events(&mut seen, "budget", "budget", &node).await;
        seen
    }

    /// The node's lease held by another (Node Health Check) before the
    /// drain; given back.
    async fn lease_held(&self) -> Seen {
        let mut seen = Seen::default();
        let (node, ns) = (self.node(2), self.namespace("lease").await);
        for name in ["l-1", "l-2"] {
            self.pod(&ns, name, &node, json!({})).await;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": format!("node-{node}"), "namespace": LEASES},
            "spec": {"holderIdentity": "node-healthcheck", "leaseDurationSeconds": 3600,
                     "acquireTime": now, "renewTime": now}}))
        .unwrap();
        let leases = Api::<Lease>::namespaced(self.env.admin.clone(), LEASES);
        leases.create(&PostParams::default(), &lease).await.unwrap();
        self.create_nm("lease", &node).await;
        let held = self
            .wait_nm("lease", "said the lease is held", |s| {
                s["lastError"].as_str().is_some_and(|e| e.contains("held"))
            })
            .await;
        self.status(&mut seen, "lease/held", &held);
        self.node_state(&mut seen, "lease/held", &node).await;
        leases
            .delete(&format!("node-{node}"), &DeleteParams::default())
            .await
            .unwrap();
        let nm = self.wait_phase("lease", "Succeeded").await;
        self.status(&mut seen, "lease/given-back", &nm);
        self.end("lease").await;
        self.events(&mut seen, "lease", "lease", &node).await;
        seen
    }

    /// A pod that does not go once evicted (a finalizer holds it): the
    /// drain attempt times out, then the pod is let go.
    async fn drain_timeout(&self) -> Seen {
        let mut seen = Seen::default();
        let (node, ns) = (self.node(3), self.namespace("timeout").await);
        self.pod(
            &ns,
            "stuck",
            &node,
            json!({"metadata": {"finalizers": ["nmo.test/hold"]}}),
        )
        .await;
        self.create_nm("timeout", &node).await;
        let held = self
            .wait_nm("timeout", "said the drain timed out", |s| {
                s["lastError"]
                    .as_str()
                    .is_some_and(|e| e.contains("context deadline exceeded"))
            })
            .await;
        self.status(&mut seen, "timeout/held", &held);
        Api::<Pod>::namespaced(self.env.admin.clone(), &ns)
            .patch(
                "stuck",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
        let nm = self.wait_phase("timeout", "Succeeded").await;
        self.status(&mut seen, "timeout/done", &nm);
        self.end("timeout").await;
        self.events(&mut seen, "timeout", "timeout", &node).await;
        seen
    }

    /// Restart mid-drain: a drain a budget holds, the operator killed
    /// (SIGKILL: its node lost, an OOM) while it waits and started again
    /// (`again`, ready on `probe`); then the budget relaxed. Run alone:
    /// the operator is away meanwhile.
    async fn restart(
        &self,
        operator: &mut tokio::process::Child,
        again: impl FnOnce() -> tokio::process::Child,
        probe: u16,
    ) -> Seen {
        let mut seen = Seen::default();
        let node = self.node(5);
        let ns = self
            .held_by_a_budget("restart", &node, ["r-1", "r-2"])
            .await;
        self.create_nm("restart", &node).await;
        let draining = self
            .wait_nm("restart", "started draining", |s| s["phase"] == "Running")
            .await;
        self.status(&mut seen, "restart/draining", &draining);
        let _ = operator.start_kill();
        let _ = operator.wait().await;
        self.node_state(&mut seen, "restart/killed", &node).await;
        *operator = again();
        let started = Instant::now();
        while !common::ready_on(probe).await {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{:?} never ready again",
                self.which
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let held = self.attempt_timed_out("restart").await;
        self.status(&mut seen, "restart/held", &held);
        self.relax(&ns).await;
        let nm = self.wait_phase("restart", "Succeeded").await;
        self.status(&mut seen, "restart/relaxed", &nm);
        self.node_state(&mut seen, "restart/relaxed", &node).await;
        self.end("restart").await;
        self.node_state(&mut seen, "restart/ended", &node).await;
        self.events(&mut seen, "restart", "restart", &node).await;
        seen
    }

    /// The node deleted under a maintenance that succeeded.
    async fn node_deleted(&self) -> Seen {
        let mut seen = Seen::default();
        let node = self.node(4);
        self.create_nm("orphan", &node).await;
        let nm = self.wait_phase("orphan", "Succeeded").await;
        self.status(&mut seen, "node-deleted", &nm);
        Api::<Node>::all(self.env.admin.clone())
            .delete(&node, &DeleteParams::default())
            .await
            .unwrap();
        // The garbage collector removes a maintenance whose owner went;
        // one without an owner reference stays. 20 s is far more than the
        // collector takes here (under 2 s).
        let started = Instant::now();
        let mut gone = false;
        while started.elapsed() < Duration::from_secs(20) {
            if self.nms().get_opt("orphan").await.unwrap().is_none() {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        seen.put(
            "node-deleted/maintenance",
            if gone { "removed" } else { "kept" },
        );
        if !gone {
            self.end("orphan").await;
        }
        seen
    }
}

fn merge(into: &mut Value, extra: Value) {
    match (into, extra) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

async fn retry<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<()>>,
{
    let started = Instant::now();
    loop {
        match f().await {
            Ok(()) => return,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(30), "{what}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Where the Go operator's webhook server listens (controller-runtime's
/// default; v0.21.0 has no flag to move it).
const GO_WEBHOOK_PORT: u16 = 9443;

/// An AdmissionReview posted as the API server posts it: the response, as
/// sent (its uid: whether it is the request's).
fn review(port: u16, request: &Value) -> Value {
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": request});
    let mut child = std::process::Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "10",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
        ])
        .args(["--data-binary", "@-"])
        .arg(format!(
            "https://127.0.0.1:{port}/validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance"
        ))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(
        |_| json!({"response": {"unreadable": String::from_utf8_lossy(&out.stdout)}}),
    );
    let mut r = answer["response"].clone();
    let same_uid = r["uid"] == request["uid"];
    r["uid"] = json!(if same_uid { "the request's" } else { "another" });
    r
}

/// An HTTP(S) GET with curl: the status code and the body.
fn curl(url: &str, token: Option<&str>) -> (String, String) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", url]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd
        .output()
        .expect("curl runs (the differential suite reads metrics with it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_owned(), body.to_owned())
}

/// The v0.21.0 bundle's container arguments, as its Deployment passes them.
fn bundle_args(env: &RealEnv) -> Vec<String> {
    let text =
        std::fs::read_to_string(env.cp.binaries().path("node-maintenance-operator-csv.yaml"))
            .unwrap();
    let csv: Value = nmo::yaml::documents::<Value>(&text).unwrap().remove(0);
    csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The operator as its Deployment runs it, addresses on loopback, leader
/// election off (see the module's comment).
fn start_operator(
    env: &RealEnv,
    which: Which,
    log: &Path,
    probe: u16,
    metrics: u16,
    webhook: u16,
) -> tokio::process::Child {
    let args: Vec<String> = bundle_args(env)
        .into_iter()
        .filter(|a| a != "--leader-elect")
        .map(|a| {
            let flag = a.split('=').next().unwrap_or(&a).to_owned();
            match flag.as_str() {
                "--health-probe-bind-address" => format!("{flag}=127.0.0.1:{probe}"),
                "--metrics-bind-address" => format!("{flag}=127.0.0.1:{metrics}"),
                _ => a,
            }
        })
        .collect();
    let binary: PathBuf = match which {
        Which::Go => env.cp.binaries().path("node-maintenance-operator"),
        Which::Nmo => env!("CARGO_BIN_EXE_nmo").into(),
    };
    let mut cmd = tokio::process::Command::new(binary);
    cmd.args(&args)
        .env("KUBECONFIG", env.cp.kubeconfig_path())
        .env("OPERATOR_NAMESPACE", "node-maintenance-operator-system")
        .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true);
    // The webhook servers need a certificate (the webhook itself is not
    // registered here: the suite posts the API server's AdmissionReviews
    // to each).
    let dir = log
        .parent()
        .unwrap()
        .join(format!("{}-certs", which.prefix()));
    std::fs::create_dir_all(&dir).unwrap();
    let (made, _) = common::webhook_cert();
    for f in ["tls.crt", "tls.key"] {
        std::fs::copy(made.path().join(f), dir.join(f)).unwrap();
    }
    match which {
        // Where controller-runtime looks; it serves on :9443.
        Which::Go => {
            let certs = Path::new("/tmp/k8s-webhook-server/serving-certs");
            std::fs::create_dir_all(certs).unwrap();
            for f in ["tls.crt", "tls.key"] {
                std::fs::copy(dir.join(f), certs.join(f)).unwrap();
            }
        }
        // No compiled-policy cache.
        Which::Nmo => {
            cmd.arg(format!("--webhook-bind-address=127.0.0.1:{webhook}"))
                .arg(format!("--webhook-cert-dir={}", dir.display()))
                .arg("--policy-cache-dir=");
        }
    }
    cmd.spawn().expect("the operator starts")
}

/// One operator's whole run.
async fn observe(env: &RealEnv, which: Which, logs: &Path) -> Seen {
    let crd = match which {
        Which::Go => {
            std::fs::read_to_string(env.cp.binaries().path("node-maintenance-operator-crd.yaml"))
                .unwrap()
        }
        Which::Nmo => std::fs::read_to_string(
            common::real::deploy_dir().join("crd/nodemaintenance.medik8s.io_nodemaintenances.yaml"),
        )
        .unwrap(),
    };
    env.cp.apply_forcing(&crd).await.unwrap();
    let (probe, metrics) = (common::free_port(), common::free_port());
    let webhook = match which {
        Which::Go => GO_WEBHOOK_PORT,
        Which::Nmo => common::free_port(),
    };
    let log = logs.join(format!("{}.log", which.prefix()));
    let mut operator = start_operator(env, which, &log, probe, metrics, webhook);
    let mut seen = Seen::default();
    let started = Instant::now();
    while !common::ready_on(probe).await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{which:?} never ready: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for path in ["healthz", "readyz"] {
        seen.put(
            &format!("probes/{path}"),
            curl(&format!("http://127.0.0.1:{probe}/{path}"), None).0,
        );
    }
    let run = Run {
        env,
        which,
        created: Default::default(),
    };
    let scenarios = futures::future::join_all([
        Box::pin(run.plain()) as std::pin::Pin<Box<dyn std::future::Future<Output = Seen> + Send>>,
        Box::pin(run.missing_node()),
        Box::pin(run.budget()),
        Box::pin(run.lease_held()),
        Box::pin(run.drain_timeout()),
        Box::pin(run.node_deleted()),
    ])
    .await;
    for s in scenarios {
        seen.0.extend(s.0);
    }
    seen.0.extend(run.webhook(webhook).await.0);
    let again = logs.join(format!("{}-restarted.log", which.prefix()));
    seen.0.extend(
        run.restart(
            &mut operator,
            || start_operator(env, which, &again, probe, metrics, webhook),
            probe,
        )
        .await
        .0,
    );
    // Metrics: HTTPS on the Deployment's :8443, only for an authorized
    // client.
    let url = format!("https://127.0.0.1:{metrics}/metrics");
    seen.put("metrics/without-token", curl(&url, None).0);
    let token = admin_token(env);
    let (code, body) = curl(&url, Some(&token));
    seen.put("metrics/with-admin-token", code);
    let families: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    for f in &families {
        seen.put(&format!("metrics/family/{f}"), "served");
    }
    for (f, labels) in label_sets(&body, &families) {
        seen.put(
            &format!("metrics/labels/{f}"),
            labels.into_iter().collect::<Vec<_>>().join(","),
        );
    }
    if let Some(pid) = operator.id() {
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), operator.wait()).await;
    let text = [&log, &again]
        .iter()
        .flat_map(|l| [l.to_path_buf(), l.with_extension("out")])
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect::<String>();
    if which == Which::Nmo {
        // Values in the JSON log are as a person or a log pipeline reads
        // them, never Rust's debug form (`"phase":"Some(Running)"`).
        let debug: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Some(") || l.contains("\":\"None\""))
            .collect();
        assert!(debug.is_empty(), "Rust debug values in the log: {debug:#?}");
    }
    for line in KEY_LOG_LINES {
        seen.put(
            &format!("logs/{line}"),
            if text.contains(line) {
                "logged"
            } else {
                "never"
            },
        );
    }
    seen
}

/// Each family's label names in a Prometheus text exposition (`le` and
/// `quantile`, the histogram's and summary's own, left out): a sample
/// `name{a="x",b="y"} 1` belongs to the family whose name is the longest
/// prefix of its own (`_bucket`, `_sum`, `_count`).
fn label_sets(body: &str, families: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut sets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let Some(family) = families
            .iter()
            .filter(|f| name.starts_with(f.as_str()))
            .max_by_key(|f| f.len())
        else {
            continue;
        };
        let set = sets.entry(family.clone()).or_default();
        let Some(inner) = line[name_end..].strip_prefix('{') else {
            continue;
        };
        // label="value" pairs; a value may hold commas and escaped quotes.
        let (mut key, mut in_value, mut escaped) = (String::new(), false, false);
        for c in inner.chars() {
            match (in_value, c) {
                (true, '\\') if !escaped => escaped = true,
                (true, '"') if !escaped => in_value = false,
                (true, _) => escaped = false,
                (false, '=') => {
                    let k = key.trim().trim_start_matches(',').trim().to_owned();
                    if k != "le" && k != "quantile" {
                        set.insert(k);
                    }
                    key.clear();
                }
                (false, '"') => in_value = true,
                (false, '}') => break,
                (false, c) => key.push(c),
            }
        }
    }
    sets
}

fn admin_token(env: &RealEnv) -> String {
    env.cp
        .kubeconfig()
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_owned))
        .expect("the admin kubeconfig has a token")
}

/// The documented differences: docs/drop-in.md's table, `key` → reason.
fn documented() -> Vec<(String, String)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/drop-in.md"))
            .unwrap();
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| {
            let (key, rest) = l.split_once('`')?;
            let reason = rest
                .rsplit('|')
                .nth(1)
                .unwrap_or_default()
                .trim()
                .to_owned();
            Some((key.to_owned(), reason))
        })
        .collect()
}

/// Whether `key` matches `pattern`, where `*` stands for any text.
fn matches(pattern: &str, key: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == key;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !key.starts_with(first) || !key[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &key[first.len()..key.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

fn listed<'a>(table: &'a [(String, String)], key: &str) -> Option<&'a str> {
    table
        .iter()
        .find(|(k, _)| matches(k, key))
        .map(|(_, r)| r.as_str())
}

/// Prints `go` and `nmo`'s observations side by side and fails on a
/// difference docs/drop-in.md's table does not list, or on a row (not a
/// pattern) that lists one no longer there; `context` is said with it.
pub(crate) fn assert_documented(
    go: &BTreeMap<String, String>,
    nmo: &BTreeMap<String, String>,
    context: &str,
) {
    let table = documented();
    let keys: BTreeSet<&String> = go.keys().chain(nmo.keys()).collect();
    let mut undocumented = Vec::new();
    let mut listed_but_same = Vec::new();
    eprintln!("{:<58} {:<40} nmo", "observation", "Go v0.21.0");
    for key in keys {
        let (g, n) = (
            go.get(key).map_or("<none>", String::as_str),
            nmo.get(key).map_or("<none>", String::as_str),
        );
        let mark = if g == n { "=" } else { "≠" };
        eprintln!("{mark} {key:<56} {g:<40} {n}");
        match (g == n, listed(&table, key)) {
            (false, None) => undocumented.push(format!("{key}: Go {g:?}, nmo {n:?}")),
            (true, Some(_))
                if !table
                    .iter()
                    .any(|(k, _)| k.contains('*') && matches(k, key)) =>
            {
                listed_but_same.push(key.clone())
            }
            _ => {}
        }
    }
    assert!(
        undocumented.is_empty(),
        "differences from the Go operator v0.21.0 not in docs/drop-in.md:\n  {}\n({context})",
        undocumented.join("\n  "),
    );
    assert!(
        listed_but_same.is_empty(),
        "docs/drop-in.md lists differences that are gone: {listed_but_same:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nmo_and_the_go_operator_v0_21_0_differ_only_where_the_docs_say() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = RealEnv::start_bare(Options::workers(12)).await;
    env.cp
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {LEASES}}}\n"
        ))
        .await
        .unwrap();
    let logs = tempfile::tempdir().unwrap();
    let go = observe(&env, Which::Go, logs.path()).await;
    let nmo = observe(&env, Which::Nmo, logs.path()).await;
    let kept = logs.keep();
    assert_documented(&go.0, &nmo.0, &format!("logs in {}", kept.display()));
    let _ = std::fs::remove_dir_all(&kept);
    env.stop();
}

/// The v0.21.0 bundle's Deployment with only its image changed runs nmo:
/// its arguments exactly as the bundle writes them (`--leader-elect`,
/// `--enable-http2=false`, metrics on :8443, probes on :8081), its
/// `OPERATOR_NAMESPACE` from the downward API. nmo starts (no exit 2, no
/// crash loop), takes the leader lock in that namespace, answers its
/// probes on :8081, serves metrics over HTTPS on :8443 only to a client
/// the cluster authorizes, and runs a maintenance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_bundles_deployment_arguments_run_nmo() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = RealEnv::start_bare(Options::workers(1)).await;
    let ns = "node-maintenance-operator-system";
    env.cp
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {LEASES}}}\n"
        ))
        .await
        .unwrap();
    let crd = std::fs::read_to_string(
        common::real::deploy_dir().join("crd/nodemaintenance.medik8s.io_nodemaintenances.yaml"),
    )
    .unwrap();
    env.cp.apply(&crd).await.unwrap();
    let args = bundle_args(&env);
    assert_eq!(
        args,
        [
            "--health-probe-bind-address=:8081",
            "--metrics-bind-address=:8443",
            "--leader-elect",
            "--enable-http2=false"
        ],
        "the bundle's arguments changed: this test's ports follow them"
    );
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("nmo.log");
    let mut operator = tokio::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", env.cp.kubeconfig_path())
        .env("OPERATOR_NAMESPACE", ns)
        .env("HOSTNAME", "nmo-bundle")
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !common::ready_on(8081).await {
        if let Ok(Some(status)) = operator.try_wait() {
            panic!(
                "nmo exited ({status}) given the bundle's arguments: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never ready: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The leader lock, in OPERATOR_NAMESPACE, by the Go operator's name.
    let leases = Api::<Lease>::namespaced(env.admin.clone(), ns);
    let started = Instant::now();
    loop {
        let held = leases
            .get_opt("135b1886.medik8s.io")
            .await
            .unwrap()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        if held.as_deref().is_some_and(|h| h.starts_with("nmo-bundle")) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no leader lock: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let url = "https://127.0.0.1:8443/metrics";
    assert_eq!(curl(url, None).0, "401", "metrics without a token");
    let (code, body) = curl(url, Some(&admin_token(&env)));
    assert_eq!(code, "200");
    assert!(
        body.contains("controller_runtime_reconcile_total"),
        "{body}"
    );
    let run = Run {
        env: &env,
        which: Which::Go,
        created: Default::default(),
    };
    run.create_nm("bundle", "worker-1").await;
    run.wait_phase("bundle", "Succeeded").await;
    run.end("bundle").await;
    if let Some(pid) = operator.id() {
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), operator.wait()).await;
    env.stop();
}
