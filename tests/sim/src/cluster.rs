//! The cluster behind the API: a scheduler, a kubelet, the workload
//! controllers (Deployment, ReplicaSet, StatefulSet, DaemonSet, Job), the
//! garbage collector and the PodDisruptionBudget status controller. They act
//! through the same API semantics as any client, so a drain on the
//! simulated cluster sees what it would see on a real one: evicted pods
//! terminate after their grace period and their replacements come up on
//! other nodes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::api::{DeleteOptions, now_rfc3339};
use crate::selectors::LabelSelector;
use crate::state::Sim;
use crate::store::{ChangeKind, ObjKey, Store};

/// Annotations that shape a simulated pod's life.
pub mod annotations {
    /// Seconds (simulated) the pod takes to exit after SIGTERM; default 0.5.
    pub const SHUTDOWN_SECONDS: &str = "sim.nmo.medik8s.io/shutdown-seconds";
    /// `"true"`: the pod never goes away once deleted (a stuck kubelet).
    pub const NEVER_TERMINATE: &str = "sim.nmo.medik8s.io/never-terminate";
    /// `"true"`: the pod's process ignores SIGTERM; the kubelet kills it
    /// when its grace period runs out.
    pub const IGNORE_SIGTERM: &str = "sim.nmo.medik8s.io/ignore-sigterm";
    /// Seconds (simulated) a pod runs before it completes (phase
    /// Succeeded); without it, pods run forever.
    pub const RUN_SECONDS: &str = "sim.nmo.medik8s.io/run-seconds";
    /// Seconds (simulated) a pod takes to become Ready once on a node.
    pub const STARTUP_SECONDS: &str = "sim.nmo.medik8s.io/startup-seconds";
    /// On a Node, `"true"`: no kubelet runs there. The node stays NotReady
    /// (Ready Unknown, as the node controller marks a node whose kubelet
    /// never posted status), nothing is scheduled onto it, and pods bound
    /// to it by name never start (nor finish terminating).
    pub const NO_KUBELET: &str = "sim.nmo.medik8s.io/no-kubelet";
}

/// Runs the controllers until `stop` changes.
pub async fn run(sim: Arc<Sim>, mut stop: watch::Receiver<bool>) {
    let mut state = ControllerState::default();
    loop {
        tokio::select! {
            _ = sim.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = stop.changed() => return,
        }
        // Let a burst of changes land before acting on them.
        tokio::time::sleep(Duration::from_millis(2)).await;
        reconcile_all(&sim, &mut state);
    }
}

/// How often every controller looks at everything, whatever changed (in
/// between, a pass looks at what changed since the last one, at the pods
/// whose time comes, and at the terminating ones).
pub const FULL_PASS_EVERY: Duration = Duration::from_millis(500);

/// What the controllers remember between passes.
#[derive(Default)]
pub struct ControllerState {
    /// When (simulated) each pod was first seen on a node, by uid.
    placed: HashMap<String, f64>,
    /// The resourceVersion the last pass started from.
    seen_rv: Option<u64>,
    /// When the last full pass ran.
    last_full: Option<std::time::Instant>,
    /// Pods (by uid) whose next step comes with time: starting after
    /// their startup delay, completing after their run time.
    timed: HashSet<String>,
    /// Pods (by key) the scheduler could not place last pass.
    unscheduled: HashSet<ObjKey>,
    /// Every uid an object names as its owner (rebuilt by each full
    /// garbage collection, grown by changes in between).
    owners: HashSet<String>,
}

/// What changed since the last pass.
struct Changes {
    /// Look at everything: the first pass, a periodic one, or after
    /// changes the store no longer holds.
    full: bool,
    list: Vec<Arc<crate::store::Change>>,
}

/// The workload kinds, by storage.
const WORKLOADS: &[&str] = &[
    "replicasets.apps",
    "deployments.apps",
    "statefulsets.apps",
    "daemonsets.apps",
    "jobs.batch",
];

impl Changes {
    fn since(sim: &Sim, state: &mut ControllerState) -> Changes {
        let store = sim.store();
        let due = state
            .last_full
            .is_none_or(|t| t.elapsed() >= FULL_PASS_EVERY);
        let list = match state.seen_rv {
            Some(seen) if !due => store.changes_since(seen),
            _ => None,
        };
        state.seen_rv = Some(store.rv());
        match list {
            Some(list) => Changes { full: false, list },
            None => {
                state.last_full = Some(std::time::Instant::now());
                Changes {
                    full: true,
                    list: Vec::new(),
                }
            }
        }
    }

    fn touched(&self, storage: &str) -> bool {
        self.full || self.list.iter().any(|c| c.storage == storage)
    }

    /// A change the workload controllers act on: to a workload, to a node
    /// (DaemonSets), or to a pod a controller owns.
    fn for_workloads(&self) -> bool {
        self.full
            || self.list.iter().any(|c| {
                WORKLOADS.contains(&c.storage.as_str())
                    || c.storage == "nodes"
                    || (c.storage == "pods"
                        && (controller_uid(&c.object).is_some()
                            || c.old.as_deref().and_then(controller_uid).is_some()))
            })
    }

    /// A change a PodDisruptionBudget's status follows: to a budget, to a
    /// workload (its scale), or to a pod a budget selects.
    fn for_budgets(&self, sim: &Sim) -> bool {
        let budgets = sim.store().list("poddisruptionbudgets.policy", None);
        if budgets.is_empty() {
            return false;
        }
        if self.full {
            return true;
        }
        let selectors: Vec<(&str, LabelSelector)> = budgets
            .iter()
            .map(|b| {
                (
                    b["metadata"]["namespace"].as_str().unwrap_or_default(),
                    LabelSelector::from_object(&b["spec"]["selector"]).unwrap_or_default(),
                )
            })
            .collect();
        let selected = |pod: &Value| {
            selectors.iter().any(|(ns, sel)| {
                pod["metadata"]["namespace"].as_str() == Some(*ns)
                    && !sel.is_empty()
                    && sel.matches(&pod["metadata"]["labels"])
            })
        };
        self.list.iter().any(|c| {
            c.storage == "poddisruptionbudgets.policy"
                || WORKLOADS.contains(&c.storage.as_str())
                || (c.storage == "pods"
                    && (selected(&c.object) || c.old.as_deref().is_some_and(selected)))
        })
    }

    /// A change that may leave an object without its owners: an owner
    /// deleted, or an object naming owners none of which exists.
    fn may_orphan(&self, sim: &Sim, state: &mut ControllerState) -> bool {
        if self.full {
            return true;
        }
        let store = sim.store();
        let mut orphan = false;
        for c in &self.list {
            let uid = c.object["metadata"]["uid"].as_str().unwrap_or_default();
            if c.kind == ChangeKind::Deleted {
                orphan |= state.owners.contains(uid);
                continue;
            }
            let Some(refs) = c.object["metadata"]["ownerReferences"].as_array() else {
                continue;
            };
            let uids: Vec<&str> = refs.iter().filter_map(|r| r["uid"].as_str()).collect();
            state.owners.extend(uids.iter().map(|u| (*u).to_owned()));
            orphan |= !uids.is_empty() && uids.iter().all(|u| store.by_uid(u).is_none());
        }
        orphan
    }
}

/// One pass of every controller, each over what changed for it.
pub fn reconcile_all(sim: &Sim, state: &mut ControllerState) {
    let changes = Changes::since(sim, state);
    let paused = sim.faults().kubelet_paused;
    if changes.touched("nodes") {
        node_lifecycle(sim);
    }
    if paused {
        // What changed meanwhile is looked at once the kubelet runs again.
        state.last_full = None;
    } else {
        kubelet(sim, state, &changes);
    }
    scheduler(sim, state, &changes);
    if changes.for_workloads() {
        deployments(sim);
        replicasets(sim);
        statefulsets(sim);
        daemonsets(sim);
        jobs(sim);
    }
    if changes.may_orphan(sim, state) {
        garbage_collect(sim, state);
    }
    if changes.for_budgets(sim) {
        pdb_statuses(sim);
    }
}

fn pods_type(sim: &Sim) -> crate::resources::ResourceType {
    sim.find_type("", "v1", "pods").expect("built in")
}

fn is_terminating(o: &Value) -> bool {
    !o["metadata"]["deletionTimestamp"].is_null()
}

fn is_finished(p: &Value) -> bool {
    matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

/// The pod's Ready condition is True.
pub fn is_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn annotation_f64(p: &Value, key: &str) -> Option<f64> {
    p["metadata"]["annotations"][key].as_str()?.parse().ok()
}

fn controller_uid(o: &Value) -> Option<&str> {
    o["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"].as_bool() == Some(true))?["uid"]
        .as_str()
}

fn owner_ref(owner: &Value, api_version: &str, kind: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// The pods the kubelet looks at this pass: every pod on a full pass;
/// otherwise those that changed, those on a node that changed (created,
/// deleted, its kubelet gone or back), those terminating and those whose
/// time may have come.
fn kubelet_pods(
    sim: &Sim,
    state: &ControllerState,
    changes: &Changes,
    everything: bool,
) -> Vec<Arc<Value>> {
    let store = sim.store();
    if everything {
        return store.list("pods", None);
    }
    let mut seen = HashSet::new();
    let mut pods = Vec::new();
    let changed_pods = changes
        .list
        .iter()
        .filter(|c| c.storage == "pods")
        .filter_map(|c| store.get("pods", &ObjKey::of(&c.object)));
    let changed_nodes: HashSet<&str> = changes
        .list
        .iter()
        .filter(|c| c.storage == "nodes")
        .filter_map(|c| c.object["metadata"]["name"].as_str())
        .collect();
    let on_changed_nodes = changed_nodes.into_iter().flat_map(|n| store.pods_on(n));
    for p in changed_pods.chain(on_changed_nodes) {
        if seen.insert(p["metadata"]["uid"].as_str().unwrap_or_default().to_owned()) {
            pods.push(p);
        }
    }
    // The terminating pods whose time has come.
    let now = sim.clock.now();
    let due: Vec<String> = sim
        .terminating
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, t)| now >= t.ends)
        .map(|(uid, _)| uid.clone())
        .collect();
    for uid in due.iter().chain(&state.timed) {
        if !seen.contains(uid)
            && let Some((storage, p)) = store.by_uid(uid)
            && storage == "pods"
        {
            seen.insert(uid.clone());
            pods.push(p);
        }
    }
    pods
}

/// When a terminating pod goes, by its annotations: never, after its
/// shutdown time, or when its grace period runs out.
pub fn termination_ends(pod: &Value, started: f64, deadline: f64) -> f64 {
    let annotations = &pod["metadata"]["annotations"];
    if annotations[annotations::NEVER_TERMINATE].as_str() == Some("true") {
        return f64::INFINITY;
    }
    let shutdown = if annotations[annotations::IGNORE_SIGTERM].as_str() == Some("true") {
        f64::INFINITY
    } else {
        annotation_f64(pod, annotations::SHUTDOWN_SECONDS).unwrap_or(0.5)
    };
    deadline.min(started + shutdown)
}

fn kubelet(sim: &Sim, state: &mut ControllerState, changes: &Changes) {
    let now = sim.clock.now();
    let everything = changes.full;
    let pods = kubelet_pods(sim, state, changes, everything);
    let (nodes, without_kubelet): (HashSet<String>, HashSet<String>) = {
        let nodes = sim.store().list("nodes", None);
        let name = |n: &Arc<Value>| n["metadata"]["name"].as_str().map(str::to_owned);
        (
            nodes.iter().filter_map(name).collect(),
            nodes
                .iter()
                .filter(|n| has_no_kubelet(n))
                .filter_map(name)
                .collect(),
        )
    };
    let pods_rt = pods_type(sim);
    let terminating: HashMap<String, crate::state::Termination> = {
        let all = sim.terminating.lock().unwrap_or_else(|p| p.into_inner());
        pods.iter()
            .filter_map(|p| {
                let uid = p["metadata"]["uid"].as_str()?;
                Some((uid.to_owned(), *all.get(uid)?))
            })
            .collect()
    };
    for pod in &pods {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        state.timed.remove(uid);
        let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        if !nodes.contains(node) {
            // The pod garbage collector removes pods bound to nodes that
            // no longer exist.
            let _ = sim.delete(
                &pods_rt,
                Some(ns),
                name,
                &DeleteOptions {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            );
            continue;
        }
        if without_kubelet.contains(node) {
            // Nothing runs there: the pod neither starts nor stops.
            continue;
        }
        if let Some(t) = terminating.get(uid) {
            if now >= termination_ends(pod, t.started, t.deadline) {
                sim.finish_pod_deletion(ns, name, uid);
            }
            continue;
        }
        if is_terminating(pod) || is_finished(pod) {
            continue;
        }
        let placed = match state.placed.get(uid) {
            Some(t) => *t,
            None => {
                state.placed.insert(uid.to_owned(), now);
                now
            }
        };
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        if phase == "Pending" {
            let startup = annotation_f64(pod, annotations::STARTUP_SECONDS).unwrap_or(0.0);
            if now - placed < startup {
                state.timed.insert(uid.to_owned());
            } else {
                set_pod_status(sim, pod, running_status(pod));
                for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
                    let name = c["name"].as_str().unwrap_or_default();
                    let image = c["image"].as_str().unwrap_or_default();
                    sim.logs.append(
                        uid,
                        name,
                        &format!("[nmo-sim] {name}: started, image {image}, on {node}"),
                    );
                }
            }
        } else if let Some(run) = annotation_f64(pod, annotations::RUN_SECONDS)
            && phase == "Running"
        {
            if now - placed >= run {
                let mut st = pod["status"].clone();
                st["phase"] = json!("Succeeded");
                st["conditions"] =
                    json!([{"type": "Ready", "status": "False", "reason": "PodCompleted"}]);
                set_pod_status(sim, pod, st);
            } else {
                state.timed.insert(uid.to_owned());
            }
        }
    }
    // The pods that went: what the kubelet kept of them goes too.
    if everything {
        let store = sim.store();
        state.placed.retain(|uid, _| store.has_uid(uid));
        state.timed.retain(|uid| store.has_uid(uid));
        sim.logs.retain(|uid| store.has_uid(uid));
    } else {
        let gone = changes
            .list
            .iter()
            .filter(|c| c.storage == "pods" && c.kind == ChangeKind::Deleted)
            .filter_map(|c| c.object["metadata"]["uid"].as_str());
        for uid in gone {
            state.placed.remove(uid);
            state.timed.remove(uid);
            sim.logs.forget(uid);
        }
    }
}

fn running_status(pod: &Value) -> Value {
    let now = now_rfc3339();
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({
                "name": c["name"], "image": c["image"], "ready": true, "started": true,
                "restartCount": 0, "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let ip = format!(
        "10.244.{}.{}",
        fnv(pod["spec"]["nodeName"].as_str().unwrap_or_default()) % 250,
        fnv(pod["metadata"]["uid"].as_str().unwrap_or_default()) % 250 + 2
    );
    json!({
        "phase": "Running",
        "qosClass": pod["status"]["qosClass"].as_str().unwrap_or("BestEffort"),
        "startTime": now,
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": "192.168.0.10",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": containers,
    })
}

fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x01000193)
    })
}

/// Writes a pod's status if the pod is still the same one.
fn set_pod_status(sim: &Sim, pod: &Value, status: Value) {
    let mut store = sim.store();
    let key = ObjKey::of(pod);
    if let Some(cur) = store.get("pods", &key)
        && cur["metadata"]["uid"] == pod["metadata"]["uid"]
        && !is_terminating(&cur)
    {
        let mut new = (*cur).clone();
        new["status"] = status;
        store.put("pods", new);
    }
}

/// Whether `tolerations` tolerate `taint`.
pub fn tolerates(tolerations: &Value, taint: &Value) -> bool {
    tolerations.as_array().into_iter().flatten().any(|t| {
        let key_ok = t["key"]
            .as_str()
            .is_none_or(|k| k.is_empty() || Some(k) == taint["key"].as_str());
        let exists = t["operator"].as_str() == Some("Exists");
        let value_ok = exists
            || t["value"].as_str().unwrap_or_default()
                == taint["value"].as_str().unwrap_or_default();
        let effect_ok = t["effect"]
            .as_str()
            .is_none_or(|e| e.is_empty() || Some(e) == taint["effect"].as_str());
        let any_key = t["key"].as_str().is_none_or(str::is_empty);
        key_ok && value_ok && effect_ok && (!any_key || exists)
    })
}

/// Whether a node runs no kubelet ([`annotations::NO_KUBELET`]).
fn has_no_kubelet(node: &Value) -> bool {
    node["metadata"]["annotations"][annotations::NO_KUBELET].as_str() == Some("true")
}

/// What the node's kubelet (or, without one, the node controller) says of
/// the node: a node created through the API joins the cluster (Ready, with
/// nodeInfo, capacity and allocatable) unless it has no kubelet, when it
/// stays NotReady.
fn node_lifecycle(sim: &Sim) {
    let nodes = sim.store().list("nodes", None);
    for node in nodes {
        let name = node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let ready = node["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["status"].as_str().unwrap_or_default().to_owned());
        let no_kubelet = has_no_kubelet(&node);
        let settled = if no_kubelet {
            ready.as_deref() == Some("Unknown")
        } else {
            ready.is_some()
        };
        if settled {
            continue;
        }
        let mut new = (*node).clone();
        if !new["status"].is_object() {
            // The kubelet owns the node's status: whatever a client wrote
            // there that is not an object, it writes over.
            new["status"] = json!({});
        }
        if no_kubelet {
            new["status"]["conditions"] = json!([{"type": "Ready", "status": "Unknown",
                "reason": "NodeStatusNeverUpdated", "message": "Kubelet never posted node status.",
                "lastTransitionTime": now_rfc3339()}]);
        } else {
            let joined = crate::node(&name);
            for field in ["capacity", "allocatable", "nodeInfo", "addresses"] {
                if new["status"][field].is_null() {
                    new["status"][field] = joined["status"][field].clone();
                }
            }
            new["status"]["conditions"] = json!([{"type": "Ready", "status": "True",
                "reason": "KubeletReady", "message": "kubelet is posting ready status",
                "lastTransitionTime": now_rfc3339()}]);
        }
        sim.store().put("nodes", new);
    }
}

/// Whether `node` satisfies a pod's required node affinity
/// (`nodeSelectorTerms`: any term; within one, every expression).
fn affinity_allows(node: &Value, affinity: &Value) -> bool {
    let terms = &affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let Some(terms) = terms.as_array() else {
        return true;
    };
    let labels = &node["metadata"]["labels"];
    let name = node["metadata"]["name"].clone();
    let matches = |e: &Value, value: &Value| -> bool {
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let v = value.as_str();
        let number = |s: Option<&str>| s.and_then(|s| s.parse::<i64>().ok());
        match e["operator"].as_str().unwrap_or_default() {
            "In" => v.is_some_and(|v| values.contains(&v)),
            "NotIn" => v.is_none_or(|v| !values.contains(&v)),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            "Gt" => {
                matches!((number(v), number(values.first().copied())), (Some(a), Some(b)) if a > b)
            }
            "Lt" => {
                matches!((number(v), number(values.first().copied())), (Some(a), Some(b)) if a < b)
            }
            _ => false,
        }
    };
    terms.iter().any(|term| {
        let exprs = term["matchExpressions"].as_array().into_iter().flatten();
        let fields = term["matchFields"].as_array().into_iter().flatten();
        let empty = term["matchExpressions"]
            .as_array()
            .is_none_or(Vec::is_empty)
            && term["matchFields"].as_array().is_none_or(Vec::is_empty);
        !empty
            && exprs
                .clone()
                .all(|e| matches(e, &labels[e["key"].as_str().unwrap_or_default()]))
            && fields
                .clone()
                .all(|e| e["key"] == "metadata.name" && matches(e, &name))
    })
}

fn schedulable_for(node: &Value, tolerations: &Value, node_selector: &Value) -> bool {
    let unsched_taint = json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"});
    if node["spec"]["unschedulable"].as_bool() == Some(true)
        && !tolerates(tolerations, &unsched_taint)
    {
        return false;
    }
    // Only a node whose kubelet says Ready takes pods.
    let ready = node["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    });
    if !ready {
        return false;
    }
    let taints_ok = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|t| {
            !matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute"))
                || tolerates(tolerations, t)
        });
    let selector_ok = node_selector
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| node["metadata"]["labels"][k] == *v);
    taints_ok && selector_ok
}

/// The pods waiting for a node: among every pod when a node changed,
/// otherwise among the pods that changed and those left unplaced last
/// pass.
fn unscheduled(sim: &Sim, state: &ControllerState, changes: &Changes) -> Vec<Arc<Value>> {
    let store = sim.store();
    let waiting = |p: &Arc<Value>| {
        p["spec"]["nodeName"].as_str().is_none_or(str::is_empty) && !is_terminating(p)
    };
    if changes.touched("nodes") {
        // Every pod on no node (a node came, went, or changed).
        return store.pods_on("").into_iter().filter(waiting).collect();
    }
    let keys: std::collections::BTreeSet<ObjKey> = changes
        .list
        .iter()
        .filter(|c| c.storage == "pods" && c.kind != ChangeKind::Deleted)
        .map(|c| ObjKey::of(&c.object))
        .chain(state.unscheduled.iter().cloned())
        .collect();
    keys.iter()
        .filter_map(|k| store.get("pods", k))
        .filter(waiting)
        .collect()
}

fn scheduler(sim: &Sim, state: &mut ControllerState, changes: &Changes) {
    let pending = unscheduled(sim, state, changes);
    state.unscheduled.clear();
    if pending.is_empty() {
        return;
    }
    let (pods, nodes) = {
        let store = sim.store();
        (store.list("pods", None), store.list("nodes", None))
    };
    let mut load: HashMap<String, usize> = nodes
        .iter()
        .map(|n| {
            (
                n["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                0,
            )
        })
        .collect();
    for p in &pods {
        if let Some(n) = p["spec"]["nodeName"].as_str()
            && let Some(c) = load.get_mut(n)
        {
            *c += 1;
        }
    }
    let mut failed_scheduling: Vec<(Arc<Value>, String)> = Vec::new();
    for pod in &pending {
        let candidates = nodes.iter().filter(|n| {
            schedulable_for(n, &pod["spec"]["tolerations"], &pod["spec"]["nodeSelector"])
                && affinity_allows(n, &pod["spec"]["affinity"])
        });
        let best = candidates.min_by_key(|n| {
            let name = n["metadata"]["name"].as_str().unwrap_or_default();
            (load.get(name).copied().unwrap_or(0), name.to_owned())
        });
        let mut store = sim.store();
        let key = ObjKey::of(pod);
        let Some(cur) = store.get("pods", &key) else {
            continue;
        };
        if cur["metadata"]["uid"] != pod["metadata"]["uid"]
            || cur["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
        {
            continue;
        }
        let mut new = (*cur).clone();
        match best {
            Some(node) => {
                let name = node["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                new["spec"]["nodeName"] = json!(name);
                new["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}]);
                *load.entry(name).or_default() += 1;
            }
            None => {
                state.unscheduled.insert(key.clone());
                let unmatched = nodes
                    .iter()
                    .filter(|n| {
                        !affinity_allows(n, &pod["spec"]["affinity"])
                            || !schedulable_for(
                                &json!({"metadata": n["metadata"], "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
                                &json!([{"operator": "Exists"}]),
                                &pod["spec"]["nodeSelector"],
                            )
                    })
                    .count();
                let mut reasons = Vec::new();
                if unmatched > 0 {
                    reasons.push(format!(
                        "{unmatched} node(s) didn't match Pod's node affinity/selector"
                    ));
                }
                if nodes.len() > unmatched {
                    reasons.push(format!(
                        "{} node(s) were unschedulable, not ready or had untolerated taints",
                        nodes.len() - unmatched
                    ));
                }
                let msg = format!(
                    "0/{} nodes are available: {}.",
                    nodes.len(),
                    reasons.join(", ")
                );
                if cur["status"]["conditions"][0]["message"].as_str() == Some(msg.as_str()) {
                    continue;
                }
                new["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg, "lastTransitionTime": now_rfc3339()}]);
                failed_scheduling.push((pod.clone(), msg));
            }
        }
        store.put("pods", new);
    }
    for (pod, message) in failed_scheduling {
        scheduling_event(sim, &pod, &message);
    }
}

/// The scheduler's Warning event for a pod that fits nowhere.
fn scheduling_event(sim: &Sim, pod: &Value, message: &str) {
    let Some(rt) = sim.find_type("", "v1", "events") else {
        return;
    };
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let now = now_rfc3339();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{}.", pod["metadata"]["name"].as_str().unwrap_or("pod")), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns,
            "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
        "reason": "FailedScheduling", "type": "Warning", "message": message,
        "source": {"component": "default-scheduler"},
        "reportingComponent": "default-scheduler",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    let _ = sim.create(&rt, Some(ns), event, false);
}

/// The objects of one workload kind and the pods by the uid of their
/// controller (not gathered when there is no such object).
fn workloads_and_pods(store: &Store, storage: &str) -> (Vec<Arc<Value>>, PodsByController) {
    let sets = store.list(storage, None);
    let pods = if sets.is_empty() {
        HashMap::new()
    } else {
        pods_by_controller(store)
    };
    (sets, pods)
}

type PodsByController = HashMap<String, Vec<Arc<Value>>>;

/// Pods by the uid of their controller.
fn pods_by_controller(store: &Store) -> PodsByController {
    let mut m = PodsByController::new();
    for p in store.list("pods", None) {
        if let Some(uid) = controller_uid(&p) {
            m.entry(uid.to_owned()).or_default().push(p.clone());
        }
    }
    m
}

fn pod_from_template(
    owner: &Value,
    template: &Value,
    owner_ref: Value,
    name: Option<String>,
    extra_labels: &[(&str, String)],
) -> Value {
    let mut meta = json!({
        "namespace": owner["metadata"]["namespace"],
        "labels": template["metadata"]["labels"],
        "ownerReferences": [owner_ref],
    });
    if !template["metadata"]["annotations"].is_null() {
        meta["annotations"] = template["metadata"]["annotations"].clone();
    }
    match name {
        Some(n) => meta["name"] = json!(n),
        None => {
            meta["generateName"] = json!(format!(
                "{}-",
                owner["metadata"]["name"].as_str().unwrap_or_default()
            ))
        }
    }
    for (k, v) in extra_labels {
        meta["labels"][*k] = json!(v);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]})
}

/// Writes `status` on an object (through its storage) if it changed.
fn set_status(sim: &Sim, storage: &str, obj: &Value, status: Value) {
    if obj["status"] == status {
        return;
    }
    let mut store = sim.store();
    if let Some(cur) = store.get(storage, &ObjKey::of(obj))
        && cur["metadata"]["uid"] == obj["metadata"]["uid"]
        && cur["status"] != status
    {
        let mut new = (*cur).clone();
        new["status"] = status;
        store.put(storage, new);
    }
}

fn active(pods: &[Arc<Value>]) -> Vec<&Arc<Value>> {
    pods.iter()
        .filter(|p| !is_terminating(p) && !is_finished(p))
        .collect()
}

fn replicasets(sim: &Sim) {
    let (sets, by_owner) = workloads_and_pods(&sim.store(), "replicasets.apps");
    let pods_rt = pods_type(sim);
    for rs in sets {
        if is_terminating(&rs) {
            continue;
        }
        let uid = rs["metadata"]["uid"].as_str().unwrap_or_default();
        let empty = Vec::new();
        let owned = by_owner.get(uid).unwrap_or(&empty);
        let act = active(owned);
        let want = rs["spec"]["replicas"].as_i64().unwrap_or(1).max(0) as usize;
        let ns = rs["metadata"]["namespace"].as_str().unwrap_or_default();
        if act.len() < want {
            for _ in act.len()..want {
                let pod = pod_from_template(
                    &rs,
                    &rs["spec"]["template"],
                    owner_ref(&rs, "apps/v1", "ReplicaSet"),
                    None,
                    &[],
                );
                let _ = sim.create(&pods_rt, Some(ns), pod, false);
            }
        } else if act.len() > want {
            // As the ReplicaSet controller ranks them: not Ready first,
            // then the lowest controller.kubernetes.io/pod-deletion-cost.
            let mut extra: Vec<&&Arc<Value>> = act.iter().collect();
            extra.sort_by_key(|p| {
                let cost: i64 =
                    p["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"]
                        .as_str()
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(0);
                (is_ready(p), cost)
            });
            for p in extra.into_iter().take(act.len() - want) {
                let _ = sim.delete(
                    &pods_rt,
                    Some(ns),
                    p["metadata"]["name"].as_str().unwrap_or_default(),
                    &DeleteOptions::default(),
                );
            }
        }
        let ready = act.iter().filter(|p| is_ready(p)).count();
        let status = json!({
            "replicas": act.len(), "fullyLabeledReplicas": act.len(), "readyReplicas": ready,
            "availableReplicas": ready, "observedGeneration": rs["metadata"]["generation"],
        });
        set_status(sim, "replicasets.apps", &rs, status);
    }
}

fn template_hash(template: &Value) -> String {
    let h = fnv(&template.to_string());
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = h as u64 | ((fnv(&format!("{h}")) as u64) << 32);
    (0..10)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn deployments(sim: &Sim) {
    let (deps, sets) = {
        let store = sim.store();
        (
            store.list("deployments.apps", None),
            store.list("replicasets.apps", None),
        )
    };
    let rs_rt = sim
        .find_type("apps", "v1", "replicasets")
        .expect("built in");
    for d in deps {
        if is_terminating(&d) {
            continue;
        }
        let uid = d["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        let hash = template_hash(&d["spec"]["template"]);
        let rs_name = format!("{name}-{hash}");
        let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
        let owned: Vec<&Arc<Value>> = sets
            .iter()
            .filter(|rs| controller_uid(rs) == Some(uid))
            .collect();
        let current = owned
            .iter()
            .find(|rs| rs["metadata"]["name"].as_str() == Some(rs_name.as_str()));
        match current {
            None => {
                let mut template = d["spec"]["template"].clone();
                template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                let mut selector = d["spec"]["selector"].clone();
                selector["matchLabels"]["pod-template-hash"] = json!(hash);
                let mut labels = d["spec"]["template"]["metadata"]["labels"].clone();
                labels["pod-template-hash"] = json!(hash);
                let rs = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": rs_name, "namespace": ns, "labels": labels,
                                 "ownerReferences": [owner_ref(&d, "apps/v1", "Deployment")]},
                    "spec": {"replicas": want, "selector": selector, "template": template},
                });
                let _ = sim.create(&rs_rt, Some(ns), rs, false);
            }
            Some(rs) if rs["spec"]["replicas"].as_i64() != Some(want) => {
                let _ = sim.patch(
                    &rs_rt,
                    Some(ns),
                    &rs_name,
                    crate::patch::PatchType::Merge,
                    &json!({"spec": {"replicas": want}}),
                    None,
                    false,
                );
            }
            Some(_) => {}
        }
        for old in owned
            .iter()
            .filter(|rs| rs["metadata"]["name"].as_str() != Some(rs_name.as_str()))
        {
            if old["spec"]["replicas"].as_i64() != Some(0) {
                let n = old["metadata"]["name"].as_str().unwrap_or_default();
                let _ = sim.patch(
                    &rs_rt,
                    Some(ns),
                    n,
                    crate::patch::PatchType::Merge,
                    &json!({"spec": {"replicas": 0}}),
                    None,
                    false,
                );
            }
        }
        let (mut replicas, mut ready, mut updated) = (0, 0, 0);
        for rs in &owned {
            replicas += rs["status"]["replicas"].as_i64().unwrap_or(0);
            ready += rs["status"]["readyReplicas"].as_i64().unwrap_or(0);
            if rs["metadata"]["name"].as_str() == Some(rs_name.as_str()) {
                updated = rs["status"]["replicas"].as_i64().unwrap_or(0);
            }
        }
        let available = if ready >= want { "True" } else { "False" };
        let mut status = json!({
            "observedGeneration": d["metadata"]["generation"], "replicas": replicas,
            "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready,
            "conditions": [{"type": "Available", "status": available,
                            "reason": if available == "True" { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }}],
        });
        if replicas > ready {
            status["unavailableReplicas"] = json!(replicas - ready);
        }
        set_status(sim, "deployments.apps", &d, status);
    }
}

fn statefulsets(sim: &Sim) {
    let (sets, by_owner) = workloads_and_pods(&sim.store(), "statefulsets.apps");
    let pods_rt = pods_type(sim);
    for s in sets {
        if is_terminating(&s) {
            continue;
        }
        let uid = s["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = s["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = s["metadata"]["name"].as_str().unwrap_or_default();
        let want = s["spec"]["replicas"].as_i64().unwrap_or(1).max(0) as usize;
        let parallel = s["spec"]["podManagementPolicy"].as_str() == Some("Parallel");
        let empty = Vec::new();
        let owned = by_owner.get(uid).unwrap_or(&empty);
        let by_name: BTreeMap<&str, &Arc<Value>> = owned
            .iter()
            .map(|p| (p["metadata"]["name"].as_str().unwrap_or_default(), p))
            .collect();
        let existing_names: HashSet<String> = sim
            .store()
            .list("pods", Some(ns))
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        let revision = format!("{name}-{}", &template_hash(&s["spec"]["template"])[..8]);
        for i in 0..want {
            let pod_name = format!("{name}-{i}");
            match by_name.get(pod_name.as_str()) {
                Some(p) if is_ready(p) && !is_terminating(p) => continue,
                Some(_) if parallel => continue,
                Some(_) => break, // OrderedReady: wait for this one
                None if existing_names.contains(&pod_name) => break,
                None => {
                    let pod = pod_from_template(
                        &s,
                        &s["spec"]["template"],
                        owner_ref(&s, "apps/v1", "StatefulSet"),
                        Some(pod_name.clone()),
                        &[
                            ("statefulset.kubernetes.io/pod-name", pod_name.clone()),
                            ("apps.kubernetes.io/pod-index", i.to_string()),
                            ("controller-revision-hash", revision.clone()),
                        ],
                    );
                    let _ = sim.create(&pods_rt, Some(ns), pod, false);
                    if !parallel {
                        break;
                    }
                }
            }
        }
        for p in owned {
            let idx = p["metadata"]["name"]
                .as_str()
                .and_then(|n| n.rsplit('-').next())
                .and_then(|i| i.parse::<usize>().ok());
            if idx.is_some_and(|i| i >= want) && !is_terminating(p) {
                let _ = sim.delete(
                    &pods_rt,
                    Some(ns),
                    p["metadata"]["name"].as_str().unwrap_or_default(),
                    &DeleteOptions::default(),
                );
            }
        }
        let act = active(owned);
        let ready = act.iter().filter(|p| is_ready(p)).count();
        let status = json!({
            "observedGeneration": s["metadata"]["generation"], "replicas": act.len(),
            "readyReplicas": ready, "currentReplicas": act.len(), "updatedReplicas": act.len(),
            "availableReplicas": ready, "currentRevision": revision, "updateRevision": revision,
        });
        set_status(sim, "statefulsets.apps", &s, status);
    }
}

fn daemonsets(sim: &Sim) {
    let (sets, by_owner, nodes) = {
        let store = sim.store();
        let (sets, by_owner) = workloads_and_pods(&store, "daemonsets.apps");
        (sets, by_owner, store.list("nodes", None))
    };
    let pods_rt = pods_type(sim);
    for ds in sets {
        if is_terminating(&ds) {
            continue;
        }
        let uid = ds["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = ds["metadata"]["namespace"].as_str().unwrap_or_default();
        let template = &ds["spec"]["template"];
        // The DaemonSet controller adds these tolerations to its pods.
        let mut tolerations = template["spec"]["tolerations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for key in [
            "node.kubernetes.io/unschedulable",
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
            "node.kubernetes.io/disk-pressure",
            "node.kubernetes.io/memory-pressure",
            "node.kubernetes.io/pid-pressure",
        ] {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": if key.ends_with("ready") || key.ends_with("unreachable") { "NoExecute" } else { "NoSchedule" }}));
        }
        let tolerations = Value::Array(tolerations);
        let empty = Vec::new();
        let owned = by_owner.get(uid).unwrap_or(&empty);
        let mut on_node: HashMap<&str, Vec<&Arc<Value>>> = HashMap::new();
        for p in owned.iter().filter(|p| !is_terminating(p)) {
            on_node
                .entry(p["spec"]["nodeName"].as_str().unwrap_or_default())
                .or_default()
                .push(p);
        }
        let (mut desired, mut ready) = (0, 0);
        for node in &nodes {
            let node_name = node["metadata"]["name"].as_str().unwrap_or_default();
            let here = on_node
                .get(node_name)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let evicting = node["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["effect"] == "NoExecute" && !tolerates(&tolerations, t));
            if !here.is_empty() {
                if evicting {
                    for p in here {
                        let _ = sim.delete(
                            &pods_rt,
                            Some(ns),
                            p["metadata"]["name"].as_str().unwrap_or_default(),
                            &DeleteOptions::default(),
                        );
                    }
                } else {
                    desired += 1;
                    ready += here.iter().filter(|p| is_ready(p)).count();
                }
                continue;
            }
            let mut unsched = (**node).clone();
            unsched["spec"]["unschedulable"] = json!(false);
            if schedulable_for(&unsched, &tolerations, &template["spec"]["nodeSelector"]) {
                desired += 1;
                let mut pod = pod_from_template(
                    &ds,
                    template,
                    owner_ref(&ds, "apps/v1", "DaemonSet"),
                    None,
                    &[],
                );
                pod["spec"]["nodeName"] = json!(node_name);
                pod["spec"]["tolerations"] = tolerations.clone();
                let _ = sim.create(&pods_rt, Some(ns), pod, false);
            }
        }
        let status = json!({
            "desiredNumberScheduled": desired, "currentNumberScheduled": desired,
            "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": desired,
            "numberMisscheduled": 0, "observedGeneration": ds["metadata"]["generation"],
        });
        set_status(sim, "daemonsets.apps", &ds, status);
    }
}

fn jobs(sim: &Sim) {
    let (jobs, by_owner) = workloads_and_pods(&sim.store(), "jobs.batch");
    let pods_rt = pods_type(sim);
    for job in jobs {
        if is_terminating(&job) {
            continue;
        }
        let uid = job["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = job["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = job["metadata"]["name"].as_str().unwrap_or_default();
        let empty = Vec::new();
        let owned = by_owner.get(uid).unwrap_or(&empty);
        let succeeded = owned
            .iter()
            .filter(|p| p["status"]["phase"] == "Succeeded")
            .count() as i64;
        let act = active(owned).len() as i64;
        let completions = job["spec"]["completions"].as_i64().unwrap_or(1);
        let parallelism = job["spec"]["parallelism"].as_i64().unwrap_or(1);
        let complete = succeeded >= completions;
        if !complete {
            let want = parallelism.min(completions - succeeded);
            for _ in act..want {
                let pod = pod_from_template(
                    &job,
                    &job["spec"]["template"],
                    owner_ref(&job, "batch/v1", "Job"),
                    None,
                    &[
                        ("batch.kubernetes.io/job-name", name.to_owned()),
                        ("job-name", name.to_owned()),
                        ("batch.kubernetes.io/controller-uid", uid.to_owned()),
                        ("controller-uid", uid.to_owned()),
                    ],
                );
                let _ = sim.create(&pods_rt, Some(ns), pod, false);
            }
        }
        let mut status = json!({"active": act, "succeeded": succeeded, "ready": owned.iter().filter(|p| is_ready(p)).count()});
        if complete {
            status["conditions"] = json!([{"type": "Complete", "status": "True"}]);
            status["completionTime"] = job["status"]["completionTime"]
                .as_str()
                .map_or_else(|| json!(now_rfc3339()), |t| json!(t));
        }
        status["startTime"] = job["status"]["startTime"]
            .as_str()
            .map_or_else(|| json!(now_rfc3339()), |t| json!(t));
        set_status(sim, "jobs.batch", &job, status);
    }
}

/// Deletes objects all of whose owners are gone (background propagation).
fn garbage_collect(sim: &Sim, state: &mut ControllerState) {
    let mut doomed: Vec<(String, Value)> = Vec::new();
    state.owners.clear();
    {
        let store = sim.store();
        for rt in sim.all_types() {
            if rt.group == "events.k8s.io" {
                continue;
            }
            for obj in store.list(&rt.storage, None) {
                let Some(refs) = obj["metadata"]["ownerReferences"].as_array() else {
                    continue;
                };
                state.owners.extend(
                    refs.iter()
                        .filter_map(|r| r["uid"].as_str().map(str::to_owned)),
                );
                if refs.is_empty() || is_terminating(&obj) {
                    continue;
                }
                let alive = refs
                    .iter()
                    .any(|r| r["uid"].as_str().and_then(|u| store.by_uid(u)).is_some());
                if !alive {
                    doomed.push((rt.plural.clone() + "." + &rt.group, (*obj).clone()));
                }
            }
        }
    }
    for (_, obj) in doomed {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = obj["kind"].as_str().unwrap_or_default();
        let Some(rt) = sim
            .all_types()
            .into_iter()
            .find(|t| t.group == group && t.version == version && t.kind == kind)
        else {
            continue;
        };
        let ns = obj["metadata"]["namespace"].as_str();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let _ = sim.delete(&rt, ns, name, &DeleteOptions::default());
    }
}

fn int_or_percent(v: &Value, total: i64, round_up: bool) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    let p: f64 = v.as_str()?.strip_suffix('%')?.parse().ok()?;
    let x = p / 100.0 * total as f64;
    Some(if round_up { x.ceil() } else { x.floor() } as i64)
}

/// A PodDisruptionBudget's status, computed from the pods now.
pub fn pdb_status(store: &Store, pdb: &Value) -> Value {
    let ns = pdb["metadata"]["namespace"].as_str().unwrap_or_default();
    let selector = LabelSelector::from_object(&pdb["spec"]["selector"]).unwrap_or_default();
    let pods: Vec<Arc<Value>> = store
        .list("pods", Some(ns))
        .into_iter()
        .filter(|p| !selector.is_empty() && selector.matches(&p["metadata"]["labels"]))
        .collect();
    // Expected pods: the scale of their controllers, as the disruption
    // controller counts them; a pod without one counts once.
    let mut expected = 0i64;
    let mut seen = HashSet::new();
    for p in &pods {
        match controller_uid(p) {
            Some(uid) if seen.insert(uid.to_owned()) => {
                expected += store
                    .by_uid(uid)
                    .and_then(|(_, o)| o["spec"]["replicas"].as_i64())
                    .unwrap_or(1);
            }
            Some(_) => {}
            None => expected += 1,
        }
    }
    let healthy = pods
        .iter()
        .filter(|p| is_ready(p) && !is_terminating(p))
        .count() as i64;
    let desired = if !pdb["spec"]["minAvailable"].is_null() {
        int_or_percent(&pdb["spec"]["minAvailable"], expected, true).unwrap_or(0)
    } else if !pdb["spec"]["maxUnavailable"].is_null() {
        (expected - int_or_percent(&pdb["spec"]["maxUnavailable"], expected, true).unwrap_or(0))
            .max(0)
    } else {
        0
    };
    let allowed = (healthy - desired).max(0);
    json!({
        "observedGeneration": pdb["metadata"]["generation"],
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [{
            "type": "DisruptionAllowed",
            "status": if allowed > 0 { "True" } else { "False" },
            "reason": if allowed > 0 { "SufficientPods" } else { "InsufficientPods" },
            "message": "",
            "observedGeneration": pdb["metadata"]["generation"],
            "lastTransitionTime": pdb["status"]["conditions"][0]["lastTransitionTime"].as_str().map_or_else(now_rfc3339, str::to_owned),
        }],
    })
}

fn pdb_statuses(sim: &Sim) {
    let mut store = sim.store();
    for pdb in store.list("poddisruptionbudgets.policy", None) {
        let mut status = pdb_status(&store, &pdb);
        // As the disruption controller: an evicted pod stays in
        // disruptedPods (and out of the healthy count) until it is seen
        // going; then it leaves the map.
        let ns = pdb["metadata"]["namespace"].as_str().unwrap_or_default();
        if let Some(disrupted) = pdb["status"]["disruptedPods"].as_object() {
            let kept: serde_json::Map<String, Value> = disrupted
                .iter()
                .filter(|(name, _)| {
                    store
                        .get("pods", &ObjKey::new(ns, name))
                        .is_some_and(|p| !is_terminating(&p))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !kept.is_empty() {
                let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
                status["disruptionsAllowed"] = json!((allowed - kept.len() as i64).max(0));
                status["disruptedPods"] = Value::Object(kept);
            }
        }
        let mut cmp_old = pdb["status"].clone();
        let mut cmp_new = status.clone();
        for s in [&mut cmp_old, &mut cmp_new] {
            if let Some(m) = s.as_object_mut() {
                m.remove("conditions");
            }
        }
        if cmp_old != cmp_new {
            let mut new = (*pdb).clone();
            new["status"] = status;
            store.put("poddisruptionbudgets.policy", new);
        }
    }
}
